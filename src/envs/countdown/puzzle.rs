//! Puzzles: the seeded generator, the train/held-out classification and the
//! exhaustive solver.

use super::expr::{Expr, Op};
use super::rat::Rat;
use super::Config;
use crate::rng::{splitmix64, splitmix64_next};
use serde::Serialize;
use std::collections::HashSet;

/// The episode's random stream: splitmix64 ([`crate::rng`]), small and `Clone`, so a
/// forked episode draws what the original would.
#[derive(Debug, Clone)]
pub struct Rng {
    state: u64,
}

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng { state: seed }
    }

    /// Uniform in `0..n` (`n > 0`; multiply-shift, bias below 2^-32 for our `n`).
    pub fn below(&mut self, n: usize) -> usize {
        ((u128::from(splitmix64_next(&mut self.state)) * n as u128) >> 64) as usize
    }
}

/// Numbers (in the order shown to the model) and the target.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Puzzle {
    pub numbers: Vec<u32>,
    pub target: u32,
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

impl Puzzle {
    /// A stable hash of the canonical form (sorted numbers, then the target, as
    /// little-endian u32s): FNV-1a, then splitmix64's finaliser. The finaliser matters:
    /// FNV's prime is odd, so FNV-1a's low bit is just the parity of the bytes' low
    /// bits, and classing by it would split puzzles by how many odd numbers they have.
    pub fn class_hash(&self) -> u64 {
        let mut sorted = self.numbers.clone();
        sorted.sort_unstable();
        sorted.push(self.target);
        let fnv = sorted
            .iter()
            .flat_map(|n| n.to_le_bytes())
            .fold(FNV_OFFSET, |h, b| {
                (h ^ u64::from(b)).wrapping_mul(FNV_PRIME)
            });
        splitmix64(fnv)
    }

    /// Held-out iff the class hash's low bit is 1: a property of the puzzle itself, so
    /// training and evaluation can never share one, whatever seeds they use.
    pub fn held_out(&self) -> bool {
        self.class_hash() & 1 == 1
    }
}

/// A random expression using every number exactly once: merge two random entries of
/// the pool with a random operation until one is left.
pub fn random_expr(rng: &mut Rng, numbers: &[u32]) -> Expr {
    let mut pool: Vec<Expr> = numbers.iter().map(|&n| Expr::Num(n)).collect();
    while pool.len() > 1 {
        let a = pool.swap_remove(rng.below(pool.len()));
        let b = pool.swap_remove(rng.below(pool.len()));
        pool.push(Expr::bin(Op::ALL[rng.below(Op::ALL.len())], a, b));
    }
    pool.pop().unwrap_or(Expr::Num(0))
}

/// One solvable puzzle of either class: draw the numbers and a random expression over
/// them; keep them if its exact value is an integer in 1..=max_target, else redraw.
pub fn draw(rng: &mut Rng, cfg: &Config) -> Puzzle {
    let max_target = i128::from(cfg.max_target);
    loop {
        let numbers: Vec<u32> = (0..cfg.numbers)
            .map(|_| 1 + rng.below(cfg.max_number as usize) as u32)
            .collect();
        let value = random_expr(rng, &numbers).eval().and_then(Rat::as_int);
        if let Some(t) = value.filter(|t| (1..=max_target).contains(t)) {
            return Puzzle {
                numbers,
                target: t as u32,
            };
        }
    }
}

/// The first puzzle drawn from `rng` whose class is `held_out`.
pub fn generate(rng: &mut Rng, cfg: &Config, held_out: bool) -> Puzzle {
    loop {
        let p = draw(rng, cfg);
        if p.held_out() == held_out {
            return p;
        }
    }
}

/// Every way to merge entries `i < j`: the commutative operations once, the others in
/// both orders (`true`: `j op i`).
const MOVES: [(Op, bool); 6] = [
    (Op::Add, false),
    (Op::Mul, false),
    (Op::Sub, false),
    (Op::Sub, true),
    (Op::Div, false),
    (Op::Div, true),
];

/// An expression using every number once whose exact value is `target`, if any.
/// Exhaustive over merging pairs (which reaches every expression tree), in exact
/// rationals with negative and fractional intermediates; value multisets already
/// explored without success are skipped.
pub fn solve(numbers: &[u32], target: u32) -> Option<Expr> {
    let pool = numbers
        .iter()
        .map(|&n| (Rat::int(i128::from(n)), Expr::Num(n)))
        .collect();
    search(pool, Rat::int(i128::from(target)), &mut HashSet::new())
}

fn search(pool: Vec<(Rat, Expr)>, target: Rat, failed: &mut HashSet<Vec<Rat>>) -> Option<Expr> {
    if let [(v, e)] = pool.as_slice() {
        return (*v == target).then(|| e.clone());
    }
    let mut key: Vec<Rat> = pool.iter().map(|(v, _)| *v).collect();
    key.sort_unstable();
    if failed.contains(&key) {
        return None;
    }
    for i in 0..pool.len() {
        for j in i + 1..pool.len() {
            for (op, swap) in MOVES {
                let (x, y) = if swap {
                    (&pool[j], &pool[i])
                } else {
                    (&pool[i], &pool[j])
                };
                let Some(v) = op.apply(x.0, y.0) else {
                    continue;
                };
                let mut next: Vec<(Rat, Expr)> = Vec::with_capacity(pool.len() - 1);
                let rest = pool.iter().enumerate().filter(|&(k, _)| k != i && k != j);
                next.extend(rest.map(|(_, p)| p.clone()));
                next.push((v, Expr::bin(op, x.1.clone(), y.1.clone())));
                if let Some(e) = search(next, target, failed) {
                    return Some(e);
                }
            }
        }
    }
    failed.insert(key);
    None
}

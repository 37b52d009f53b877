//! Does a Countdown policy read its puzzle? Scores every answer of an eval transcript
//! file against its own puzzle and against another one.
//!
//!     cargo run --release --example countdown_state_probe -- EVAL_transcripts.jsonl
//!
//! For each answer (one `concord eval --transcripts` line each) it prints the verdict on
//! its own puzzle, then checks the same answer against the puzzle `shift` lines further
//! on (shifts 1 to 5, wrapping around). An answer written for its own numbers and target
//! should almost never solve another puzzle; a policy that ignored its puzzle (a fixed
//! or a random expression) would solve others about as often as its own. The gap is
//! what reading the state is worth.
use anyhow::{Context, Result};
use concord::envs::countdown::{check_answer, Verdict};
use std::collections::BTreeMap;

struct Answer {
    text: String,
    numbers: Vec<u32>,
    target: u32,
}

/// The first value of `key` anywhere in `v` (eval nests the environment's transcript).
fn find<'a>(v: &'a serde_json::Value, key: &str) -> Option<&'a serde_json::Value> {
    match v {
        serde_json::Value::Object(m) => {
            m.get(key).or_else(|| m.values().find_map(|x| find(x, key)))
        }
        serde_json::Value::Array(a) => a.iter().find_map(|x| find(x, key)),
        _ => None,
    }
}

fn read(path: &str) -> Result<Vec<Answer>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {path}"))?;
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            let at = || format!("{path} line {}", i + 1);
            let v: serde_json::Value = serde_json::from_str(l).with_context(at)?;
            let numbers = find(&v, "numbers")
                .and_then(|n| n.as_array())
                .with_context(|| format!("{}: no `numbers`", at()))?
                .iter()
                .map(|x| {
                    x.as_u64()
                        .map(|x| x as u32)
                        .context("a number is not an integer")
                })
                .collect::<Result<Vec<u32>>>()?;
            let target = find(&v, "target")
                .and_then(|t| t.as_u64())
                .with_context(|| format!("{}: no `target`", at()))? as u32;
            let text = find(&v, "steps")
                .and_then(|s| s.get(0))
                .and_then(|s| s.get(0))
                .and_then(|s| s.as_str())
                .unwrap_or_default()
                .to_string();
            Ok(Answer {
                text,
                numbers,
                target,
            })
        })
        .collect()
}

fn main() -> Result<()> {
    let path = std::env::args()
        .nth(1)
        .context("usage: countdown_state_probe EVAL_transcripts.jsonl")?;
    let answers = read(&path)?;
    let n = answers.len();
    anyhow::ensure!(n > 1, "{path}: need at least two answers");
    let mut verdicts: BTreeMap<&str, usize> = BTreeMap::new();
    let mut own = 0;
    for a in &answers {
        let v = check_answer(&a.text, &a.numbers, a.target);
        own += usize::from(v == Verdict::Correct);
        *verdicts.entry(v.reason()).or_default() += 1;
    }
    let (mut other, mut pairs) = (0, 0);
    for shift in 1..=5.min(n - 1) {
        for (i, a) in answers.iter().enumerate() {
            let b = &answers[(i + shift) % n];
            other += usize::from(check_answer(&a.text, &b.numbers, b.target) == Verdict::Correct);
            pairs += 1;
        }
    }
    let ci = |k: usize, m: usize| concord::envs::wilson_ci(k, m);
    let [lo, hi] = ci(own, n);
    println!("answers: {n}");
    println!(
        "solve their own puzzle:      {own:>4} / {n:<5} {:.3} [{lo:.3}, {hi:.3}]",
        own as f64 / n as f64
    );
    let [lo, hi] = ci(other, pairs);
    println!(
        "solve another puzzle:        {other:>4} / {pairs:<5} {:.3} [{lo:.3}, {hi:.3}]",
        other as f64 / pairs as f64
    );
    // the `sum` policy's strategy: is the model only adding?
    let sums = answers
        .iter()
        .filter(|a| check_answer(&a.text, &a.numbers, a.numbers.iter().sum()) == Verdict::Correct)
        .count();
    let sum_solvable = answers
        .iter()
        .filter(|a| a.numbers.iter().sum::<u32>() == a.target)
        .count();
    println!("answers worth the sum of the numbers: {sums} / {n} (puzzles the sum solves: {sum_solvable})");
    println!("verdicts on their own puzzle:");
    for (reason, k) in verdicts {
        println!("  {k:>4}  {reason}");
    }
    Ok(())
}

//! Scripted drivers: the level-k opponents, the out-of-levels deceiver, and the
//! baseline policies. All are pure functions of public information plus the seat's
//! pre-drawn per-episode randomness ([`SeatDraws`]), so a policy seat's choices never
//! change what the scripted seats draw.
//!
//! - **level 0** (noisy priority convention): signals its convention slot, except with
//!   probability `noise` a uniformly random action; commits to its own signal, except
//!   with probability `noise` a uniformly random action.
//! - **level 1** (best response to level 0, exploiting gaps): signals its convention
//!   slot; at the commitment it models each neighbour as level 0 (commits its signal
//!   with probability `1 - noise + noise/3`, each other action `noise/3`) and takes the
//!   action of highest expected reward. A neighbour signalling away from my better slot
//!   leaves a gap it takes (e.g. early while holding the late priority).
//! - **level 2** (anticipates level 1): predicts each neighbour's level-1 commitment
//!   from the public signals (with a `noise` tremble) and best-responds. Its signal is
//!   chosen the same way: it signals the slot that, assuming everyone else signals the
//!   convention and the neighbours are level 1, leaves it the best commitment; against
//!   level 1 this means announcing `early` even without the early priority, which makes
//!   level-1 neighbours yield.
//! - **deceiver** (the misspecified opponent, outside the levels): signals like level 0,
//!   then with probability 1/2 commits to the *other* direct slot than it signalled
//!   (bypass signals become early).
//! - **heuristic** (a history-aware baseline): signals its convention slot; commits the
//!   best response to per-neighbour signal -> commitment frequencies observed earlier in
//!   the session, smoothed towards the level-0 model with weight 2.
//! - **always_bypass**, **always_early**, **random** (uniform, independently per phase).

use super::{Action, Rewards};
use serde::{Deserialize, Serialize};

/// Probability with which a deceiver commits away from its signal.
pub const DECEIVE_PROB: f64 = 0.5;
/// Weight of the level-0 prior in the heuristic's per-neighbour frequencies.
pub const HEURISTIC_PRIOR: f64 = 2.0;

/// A scripted opponent's type. Never shown to the policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Level0,
    Level1,
    Level2,
    Deceiver,
}

impl Kind {
    pub fn level(k: usize) -> Kind {
        match k {
            0 => Kind::Level0,
            1 => Kind::Level1,
            _ => Kind::Level2,
        }
    }
    pub fn strategy(self) -> Strategy {
        match self {
            Kind::Level0 => Strategy::Level0,
            Kind::Level1 => Strategy::Level1,
            Kind::Level2 => Strategy::Level2,
            Kind::Deceiver => Strategy::Deceiver,
        }
    }
}

/// Every scripted way of driving a seat.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    AlwaysBypass,
    AlwaysEarly,
    Random,
    Level0,
    Level1,
    Level2,
    Heuristic,
    Deceiver,
}

/// Names accepted by `policy_action` / baselines.
pub const POLICY_NAMES: &[&str] = &[
    "always_bypass",
    "always_early",
    "random",
    "level0",
    "level1",
    "level2",
    "heuristic",
];

impl Strategy {
    pub fn from_name(name: &str) -> Option<Strategy> {
        Some(match name {
            "always_bypass" => Strategy::AlwaysBypass,
            "always_early" => Strategy::AlwaysEarly,
            "random" => Strategy::Random,
            "level0" => Strategy::Level0,
            "level1" => Strategy::Level1,
            "level2" => Strategy::Level2,
            "heuristic" => Strategy::Heuristic,
            "deceiver" => Strategy::Deceiver,
            _ => return None,
        })
    }
}

/// One seat's randomness for one episode, drawn when the episode starts.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SeatDraws {
    /// Uniform in [0,1): signal noise test.
    pub sig_u: f64,
    /// The noisy signal used when `sig_u < noise`.
    pub sig_rand: Action,
    /// Uniform in [0,1): commitment noise / deception test.
    pub com_u: f64,
    /// The noisy commitment used when `com_u < noise`.
    pub com_rand: Action,
    /// The `random` policy's signal and commitment.
    pub rand_sig: Action,
    pub rand_com: Action,
}

/// Public context of one episode.
#[derive(Debug, Clone, Copy)]
pub struct Ctx<'a> {
    pub n: usize,
    pub noise: f64,
    pub rewards: &'a Rewards,
    /// Vehicles with `index % 2 == parity` hold the early priority this episode.
    pub parity: usize,
}

impl Ctx<'_> {
    /// The convention (priority) slot of `seat` this episode.
    pub fn convention(&self, seat: usize) -> Action {
        if seat % 2 == self.parity {
            Action::Early
        } else {
            Action::Late
        }
    }
    pub fn neighbours(&self, seat: usize) -> (usize, usize) {
        ((seat + self.n - 1) % self.n, (seat + 1) % self.n)
    }
    /// The level-0 model of a vehicle that signalled `s`: distribution of its commitment.
    pub fn level0_model(&self, s: Action) -> [f64; 3] {
        tremble(s, self.noise)
    }
}

/// `a` with probability `1 - noise + noise/3`, each other action `noise/3`.
pub fn tremble(a: Action, noise: f64) -> [f64; 3] {
    let mut d = [noise / 3.0; 3];
    d[a.index()] += 1.0 - noise;
    d
}

/// Expected reward of each action of `seat` against independent neighbour commitment
/// distributions `left` and `right` (the same vehicle when n = 2).
pub fn action_values(ctx: &Ctx, left: &[f64; 3], right: &[f64; 3]) -> [f64; 3] {
    let r = ctx.rewards;
    let mut v = [0.0; 3];
    for a in [Action::Early, Action::Late] {
        let i = a.index();
        let safe = if ctx.n == 2 {
            1.0 - left[i]
        } else {
            (1.0 - left[i]) * (1.0 - right[i])
        };
        let merge = if a == Action::Early {
            r.merge_early
        } else {
            r.merge_late
        };
        v[i] = merge * safe + r.collision * (1.0 - safe);
    }
    v[Action::Bypass.index()] = r.bypass;
    v
}

/// The best action of `seat` given the values, ties broken towards bypass, then the
/// convention slot.
pub fn best_of(ctx: &Ctx, seat: usize, values: &[f64; 3]) -> (Action, f64) {
    let conv = ctx.convention(seat);
    let order = [Action::Bypass, conv, conv.other_direct()];
    let mut best = (Action::Bypass, values[Action::Bypass.index()]);
    for a in order {
        if values[a.index()] > best.1 + 1e-12 {
            best = (a, values[a.index()]);
        }
    }
    best
}

/// Level 1's commitment given the signal profile.
pub fn level1_commit(ctx: &Ctx, seat: usize, signals: &[Action]) -> Action {
    let (l, r) = ctx.neighbours(seat);
    let v = action_values(
        ctx,
        &ctx.level0_model(signals[l]),
        &ctx.level0_model(signals[r]),
    );
    best_of(ctx, seat, &v).0
}

/// Level 2's best commitment and its value given the signal profile.
pub fn level2_commit_value(ctx: &Ctx, seat: usize, signals: &[Action]) -> (Action, f64) {
    let (l, r) = ctx.neighbours(seat);
    let dl = tremble(level1_commit(ctx, l, signals), ctx.noise);
    let dr = tremble(level1_commit(ctx, r, signals), ctx.noise);
    best_of(ctx, seat, &action_values(ctx, &dl, &dr))
}

/// Level 2's signal (see the module docs).
pub fn level2_signal(ctx: &Ctx, seat: usize) -> Action {
    let mut hyp: Vec<Action> = (0..ctx.n).map(|i| ctx.convention(i)).collect();
    let conv = ctx.convention(seat);
    let mut best = (conv, f64::NEG_INFINITY);
    for s in [conv, conv.other_direct(), Action::Bypass] {
        hyp[seat] = s;
        let v = level2_commit_value(ctx, seat, &hyp).1;
        if v > best.1 + 1e-12 {
            best = (s, v);
        }
    }
    best.0
}

/// Per-neighbour signal -> commitment counts from earlier episodes of the session.
pub type Counts = [[f64; 3]; 3];

/// The heuristic's commitment: best response to smoothed observed frequencies.
pub fn heuristic_commit(
    ctx: &Ctx,
    seat: usize,
    signals: &[Action],
    counts_left: &Counts,
    counts_right: &Counts,
) -> Action {
    let (l, r) = ctx.neighbours(seat);
    let model = |s: Action, counts: &Counts| {
        let prior = ctx.level0_model(s);
        let row = counts[s.index()];
        let total: f64 = row.iter().sum();
        let d: [f64; 3] = std::array::from_fn(|i| {
            (row[i] + HEURISTIC_PRIOR * prior[i]) / (total + HEURISTIC_PRIOR)
        });
        d
    };
    let v = action_values(
        ctx,
        &model(signals[l], counts_left),
        &model(signals[r], counts_right),
    );
    best_of(ctx, seat, &v).0
}

/// Signal of `strategy` at `seat` (heuristic and deceiver signals need no history).
pub fn signal(ctx: &Ctx, strategy: Strategy, seat: usize, draws: &SeatDraws) -> Action {
    match strategy {
        Strategy::AlwaysBypass => Action::Bypass,
        Strategy::AlwaysEarly => Action::Early,
        Strategy::Random => draws.rand_sig,
        Strategy::Level0 | Strategy::Deceiver => {
            if draws.sig_u < ctx.noise {
                draws.sig_rand
            } else {
                ctx.convention(seat)
            }
        }
        Strategy::Level1 | Strategy::Heuristic => ctx.convention(seat),
        Strategy::Level2 => level2_signal(ctx, seat),
    }
}

/// Commitment of `strategy` at `seat` given this episode's signal profile and the
/// session's per-seat counts (used by the heuristic only).
pub fn commit(
    ctx: &Ctx,
    strategy: Strategy,
    seat: usize,
    draws: &SeatDraws,
    signals: &[Action],
    counts: &[Counts],
) -> Action {
    match strategy {
        Strategy::AlwaysBypass => Action::Bypass,
        Strategy::AlwaysEarly => Action::Early,
        Strategy::Random => draws.rand_com,
        Strategy::Level0 => {
            if draws.com_u < ctx.noise {
                draws.com_rand
            } else {
                signals[seat]
            }
        }
        Strategy::Level1 => level1_commit(ctx, seat, signals),
        Strategy::Level2 => level2_commit_value(ctx, seat, signals).0,
        Strategy::Heuristic => {
            let (l, r) = ctx.neighbours(seat);
            heuristic_commit(ctx, seat, signals, &counts[l], &counts[r])
        }
        Strategy::Deceiver => {
            if draws.com_u < DECEIVE_PROB {
                signals[seat].other_direct()
            } else {
                signals[seat]
            }
        }
    }
}

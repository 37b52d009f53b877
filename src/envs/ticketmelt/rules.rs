//! The TICKETMELT state and its rules: the episode RNG, commitments, the seated
//! engineers, the resolution of one round and the scoring of a seat.

#![allow(clippy::needless_range_loop)]

use super::parse::{feedback, parse_action};
use super::{Action, Policy, Pool, Rules, UrgentFailure, WinRule, MAX_ROUNDS, SEATS};
use crate::envs::{Reward, StepOutcome};
use crate::rng::splitmix64_next;
use std::collections::BTreeMap;

// ---------------------------------------------------------------------------------
// RNG: xoshiro256++ seeded by splitmix64 (small, fast, Clone, platform independent).

#[derive(Clone, Debug)]
pub struct Rng {
    s: [u64; 4],
}

impl Rng {
    pub fn new(seed: u64) -> Self {
        let mut x = seed;
        Self {
            s: [
                splitmix64_next(&mut x),
                splitmix64_next(&mut x),
                splitmix64_next(&mut x),
                splitmix64_next(&mut x),
            ],
        }
    }
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.s;
        let r = (s[0].wrapping_add(s[3])).rotate_left(23).wrapping_add(s[0]);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        r
    }
    /// Uniform in `0..n` (n > 0).
    #[inline]
    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }
    /// Uniform in `lo..=hi`.
    #[inline]
    pub fn range(&mut self, lo: u8, hi: u8) -> u8 {
        lo + self.below((hi - lo) as u64 + 1) as u8
    }
    #[inline]
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

// ---------------------------------------------------------------------------------
// The episode.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SeatKind {
    Policy,
    Peer(Policy),
}

/// What happened on one server in one round.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Outcome {
    #[default]
    Idle,
    /// Lone deploy by this seat progressed.
    Success(u8),
    /// Lone deploy by this seat failed because the server was degraded.
    Degraded(u8),
    /// Two or more deployers.
    Collision,
}

/// A channel message slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) enum Msg {
    #[default]
    None,
    /// The scripted engineer's stock line (rendered from the action).
    Canned,
    /// Index into `texts`.
    Text(u16),
}

/// One TICKETMELT episode.
#[derive(Clone, Debug)]
pub struct Ticketmelt {
    pub(super) rules: Rules,
    pub(super) seed: u64,
    pub(super) prng: Rng,
    pub(super) round: u8,
    pub(super) pool: Pool,
    pub(super) mirror: bool,
    pub(super) kinds: [SeatKind; SEATS],
    pub(super) service: [u8; SEATS],
    pub(super) fix: [u8; SEATS],
    pub(super) rem: [u8; SEATS],
    pub(super) deadline: [u8; SEATS],
    /// 1-based round of restoration, 0 = not restored.
    pub(super) completed: [u8; SEATS],
    pub(super) urgent: u8,
    pub(super) deploys: [u8; SEATS],
    pub(super) collided: [u8; SEATS],
    pub(super) opps: [u8; SEATS],
    pub(super) yields: [u8; SEATS],
    pub(super) blamed: [bool; SEATS],
    pub(super) malformed: [u8; SEATS],
    pub(super) acts: [[Action; SEATS]; MAX_ROUNDS],
    pub(super) outcomes: [[Outcome; 2]; MAX_ROUNDS],
    pub(super) msgs: [[Msg; SEATS]; MAX_ROUNDS],
    pub(super) texts: Vec<String>,
    /// Raw completions of policy seats: (round, seat, text).
    pub(super) raw: Vec<(u8, u8, String)>,
}

impl Ticketmelt {
    /// A new episode. The same rules and seed always give the same episode.
    pub fn new(rules: Rules, seed: u64) -> Self {
        let mut rng = Rng::new(seed);
        let prng = Rng::new(seed ^ 0x5EED_0F70_11C1_E5A7);
        let t = rules.rounds;
        let mut service = [0u8, 1, 2, 3];
        for i in (1..SEATS).rev() {
            let j = rng.below(i as u64 + 1) as usize;
            service.swap(i, j);
        }
        let mut fix = [0u8; SEATS];
        let mut deadline = [0u8; SEATS];
        for i in 0..SEATS {
            let f = rng.range(1, rules.max_fix.min(t - 1).max(1));
            let (mut lo, mut hi) = (3u8.max(f + 1), t);
            if lo > hi {
                lo = t;
                hi = t;
            }
            fix[i] = f;
            deadline[i] = rng.range(lo, hi);
        }
        let urgent = rng.below(SEATS as u64) as u8;
        let pool = match rules.peers {
            Pool::Mixed => {
                if rng.unit() < rules.dumb_fraction {
                    Pool::Dumb
                } else {
                    Pool::Diverse
                }
            }
            p => p,
        };
        let mirror = rules.peer_mirror > 0.0 && rng.unit() < rules.peer_mirror;
        let kinds = match pool {
            Pool::Dumb => [
                SeatKind::Policy,
                SeatKind::Peer(Policy::Eager),
                SeatKind::Peer(Policy::Eager),
                SeatKind::Peer(Policy::Eager),
            ],
            Pool::SelfPlay => [SeatKind::Policy; SEATS],
            _ => [
                SeatKind::Policy,
                SeatKind::Peer(Policy::Eager),
                SeatKind::Peer(Policy::Alternator),
                SeatKind::Peer(Policy::Nervous),
            ],
        };
        Ticketmelt {
            rules,
            seed,
            prng,
            round: 0,
            pool,
            mirror,
            kinds,
            service,
            fix,
            rem: fix,
            deadline,
            completed: [0; SEATS],
            urgent,
            deploys: [0; SEATS],
            collided: [0; SEATS],
            opps: [0; SEATS],
            yields: [0; SEATS],
            blamed: [false; SEATS],
            malformed: [0; SEATS],
            acts: [[Action::Monitor; SEATS]; MAX_ROUNDS],
            outcomes: [[Outcome::Idle; 2]; MAX_ROUNDS],
            msgs: [[Msg::None; SEATS]; MAX_ROUNDS],
            texts: Vec::new(),
            raw: Vec::new(),
        }
    }

    pub fn rules(&self) -> &Rules {
        &self.rules
    }
    /// Rounds played so far.
    pub fn round(&self) -> usize {
        self.round as usize
    }
    pub fn is_done(&self) -> bool {
        self.round >= self.rules.rounds || self.completed.iter().all(|&c| c > 0)
    }
    pub fn is_policy(&self, seat: usize) -> bool {
        self.kinds[seat] == SeatKind::Policy
    }
    pub fn remaining(&self, seat: usize) -> u8 {
        self.rem[seat]
    }
    pub fn fix_rounds(&self, seat: usize) -> u8 {
        self.fix[seat]
    }
    pub fn deadline(&self, seat: usize) -> u8 {
        self.deadline[seat]
    }
    pub fn urgent_seat(&self) -> usize {
        self.urgent as usize
    }
    pub fn restored_at(&self, seat: usize) -> Option<u8> {
        (self.completed[seat] > 0).then_some(self.completed[seat])
    }
    /// Outcomes (server A, server B) of a played round.
    pub fn outcome(&self, round: usize) -> [Outcome; 2] {
        self.outcomes[round]
    }
    pub fn actions(&self, round: usize) -> [Action; SEATS] {
        self.acts[round]
    }
    /// Whether the server (0 = A, 1 = B) is degraded in the current round.
    pub fn degraded(&self, server: usize) -> bool {
        self.rules.degrade
            && self.round > 0
            && self.outcomes[self.round as usize - 1][server] == Outcome::Collision
    }
    /// The original slack: `deadline - (round+1) - remaining` (can be negative).
    pub(super) fn slack(&self, seat: usize) -> i32 {
        self.deadline[seat] as i32 - (self.round as i32 + 1) - self.rem[seat] as i32
    }
    /// Spare rounds as the prompt shows them: rounds left before the deadline
    /// (this one included) minus deploys still needed.
    pub(super) fn spare(&self, seat: usize) -> i32 {
        self.deadline[seat] as i32 - self.round as i32 - self.rem[seat] as i32
    }
    pub(super) fn urgent_visible(&self, seat: usize, observer: usize) -> bool {
        (seat == observer && seat == self.urgent as usize)
            || self.rules.urgent_hints && seat == self.urgent as usize && !self.is_policy(seat)
    }
}

impl Ticketmelt {
    /// Resolve one round from the policy seats' actions (`policy[i]` for seat `i`;
    /// entries of scripted seats are ignored) and message slots.
    pub(super) fn resolve(&mut self, mut acts: [Action; SEATS], mut msgs: [Msg; SEATS]) {
        if self.is_done() {
            return;
        }
        let r = self.round as usize;
        for seat in 0..SEATS {
            if let SeatKind::Peer(p) = self.kinds[seat] {
                acts[seat] = self.scripted(p, seat);
                msgs[seat] = Msg::Canned;
            }
        }
        // R4 opportunities, from the state before resolution.
        for s in 0..SEATS {
            let my = self.slack(s);
            let opp = (0..SEATS).any(|k| {
                k != s && acts[k] != Action::Monitor && {
                    let sk = self.slack(k);
                    sk <= 1 && my > sk
                }
            });
            if opp {
                self.opps[s] += 1;
                if acts[s] == Action::Monitor {
                    self.yields[s] += 1;
                }
            }
        }
        let degraded = [self.degraded(0), self.degraded(1)];
        let mut outcome = [Outcome::Idle; 2];
        for (server, out) in outcome.iter_mut().enumerate() {
            let mut n = 0;
            let mut who = 0usize;
            for (seat, a) in acts.iter().enumerate() {
                if a.server() == Some(server) {
                    n += 1;
                    who = seat;
                    self.deploys[seat] += 1;
                }
            }
            if n >= 2 {
                *out = Outcome::Collision;
                let u = self.urgent as usize;
                let urgent_in = acts[u].server() == Some(server);
                for (seat, a) in acts.iter().enumerate() {
                    if a.server() == Some(server) {
                        self.collided[seat] += 1;
                        if urgent_in && seat != u {
                            self.blamed[seat] = true;
                        }
                    }
                }
            } else if n == 1 {
                if degraded[server] {
                    *out = Outcome::Degraded(who as u8);
                    self.collided[who] += 1;
                } else {
                    *out = Outcome::Success(who as u8);
                    if self.rem[who] > 0 {
                        self.rem[who] -= 1;
                        if self.rem[who] == 0 {
                            self.completed[who] = r as u8 + 1;
                        }
                    }
                }
            }
        }
        self.acts[r] = acts;
        self.msgs[r] = msgs;
        self.outcomes[r] = outcome;
        self.round += 1;
    }

    /// One round from raw texts, one per policy seat in ascending seat order. The
    /// outcome has one entry per policy seat (none once the episode is over); see the
    /// `Environment` impl for what it holds.
    pub fn step_texts<S: AsRef<str>>(&mut self, texts: &[S]) -> anyhow::Result<StepOutcome> {
        let seats: Vec<usize> = (0..SEATS).filter(|&s| self.is_policy(s)).collect();
        anyhow::ensure!(
            texts.len() == seats.len(),
            "ticketmelt step: expected {} action texts (one per policy seat), got {}",
            seats.len(),
            texts.len()
        );
        if self.is_done() {
            return Ok(StepOutcome::default());
        }
        let mut outcome = StepOutcome::default();
        let mut acts = [Action::Monitor; SEATS];
        let mut msgs = [Msg::None; SEATS];
        for (&seat, text) in seats.iter().zip(texts) {
            let text = text.as_ref();
            let p = parse_action(text);
            if !p.format_ok {
                self.malformed[seat] += 1;
            }
            outcome.push(seat, 0.0, p.format_ok, feedback(&p));
            acts[seat] = p.action;
            if let Some(m) = p.message {
                if !m.is_empty() && self.texts.len() < u16::MAX as usize {
                    msgs[seat] = Msg::Text(self.texts.len() as u16);
                    self.texts.push(m);
                }
            }
            self.raw.push((self.round, seat as u8, text.to_string()));
        }
        self.resolve(acts, msgs);
        if self.is_done() {
            for (&seat, r) in outcome.seats.iter().zip(outcome.rewards.iter_mut()) {
                *r = self.reward_parts(seat).scalar;
            }
        }
        Ok(outcome)
    }

    pub(super) fn on_time(&self, seat: usize) -> bool {
        self.completed[seat] > 0 && self.completed[seat] <= self.deadline[seat]
    }

    /// Reward components of `seat` (final once done).
    pub fn reward_parts(&self, seat: usize) -> RewardParts {
        let r1 = if self.on_time(seat) {
            1.0
        } else if self.completed[seat] > 0 {
            0.3
        } else {
            0.0
        };
        let u = self.urgent as usize;
        let urgent_missed = self.is_done() && !self.on_time(u);
        let site_failure = urgent_missed
            && match self.rules.urgent_failure {
                UrgentFailure::Off => false,
                UrgentFailure::All => true,
                UrgentFailure::Blame => seat == u || self.blamed[seat],
            };
        let (mut num, mut den) = (0.0, 0.0);
        for s in 0..SEATS {
            let w = if s == u {
                self.rules.urgent_weight
            } else {
                1.0
            };
            den += w;
            if self.on_time(s) {
                num += w;
            }
        }
        let r2 = if site_failure || den <= 0.0 {
            0.0
        } else {
            num / den
        };
        let r3 = if self.deploys[seat] == 0 {
            0.0
        } else {
            1.0 - self.collided[seat] as f64 / self.deploys[seat] as f64
        };
        let r4 = if self.opps[seat] == 0 {
            0.5
        } else {
            self.yields[seat] as f64 / self.opps[seat] as f64
        };
        let w = self.rules.weights;
        let weighted = w[0] * r1 + w[1] * r2 + w[2] * r3 + w[3] * r4;
        let pass = match self.rules.win_rule {
            WinRule::Gated => r1 > 0.5 && weighted > self.rules.win_threshold,
            WinRule::Weighted => weighted > self.rules.win_threshold,
        };
        let win = pass && !site_failure;
        let format_ok = self.malformed[seat] == 0;
        let gate = if self.rules.malformed_zero && !format_ok {
            0.0
        } else {
            1.0
        };
        let scalar = gate
            * if self.rules.binary {
                win as u8 as f64
            } else {
                weighted
            };
        RewardParts {
            r1,
            r2,
            r3,
            r4,
            weighted,
            win,
            format_ok,
            site_failure,
            scalar,
        }
    }
}

/// Reward of one seat, before naming.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RewardParts {
    pub r1: f64,
    pub r2: f64,
    pub r3: f64,
    pub r4: f64,
    pub weighted: f64,
    pub win: bool,
    pub format_ok: bool,
    pub site_failure: bool,
    pub scalar: f64,
}

impl RewardParts {
    pub fn to_reward(self) -> Reward {
        let mut c = BTreeMap::new();
        c.insert("r1_own".into(), self.r1);
        c.insert("r2_team".into(), self.r2);
        c.insert("r3_safety".into(), self.r3);
        c.insert("r4_yield".into(), self.r4);
        c.insert("weighted".into(), self.weighted);
        c.insert("win".into(), self.win as u8 as f64);
        c.insert("format".into(), self.format_ok as u8 as f64);
        c.insert("site_failure".into(), self.site_failure as u8 as f64);
        Reward {
            components: c,
            scalar: self.scalar,
        }
    }
}

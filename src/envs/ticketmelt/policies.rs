//! Scripted engineers and baselines: the named strategies, the opponent pools, the
//! fast scripted path (no text) and the baseline and benchmark loops built on it.

#![allow(clippy::needless_range_loop)]

use super::rules::{Msg, Ticketmelt};
use super::Action;
use super::{Rules, TicketmeltFactory, SEATS};
use crate::envs::tools::{measure, BenchResult};

/// Scripted strategies (peers and baseline policies).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    AlwaysA,
    AlwaysB,
    AlwaysMonitor,
    Random,
    Eager,
    Alternator,
    Nervous,
    Heuristic,
}

pub const POLICIES: [(&str, Policy); 8] = [
    ("always_a", Policy::AlwaysA),
    ("always_b", Policy::AlwaysB),
    ("always_monitor", Policy::AlwaysMonitor),
    ("random", Policy::Random),
    ("eager", Policy::Eager),
    ("alternator", Policy::Alternator),
    ("nervous", Policy::Nervous),
    ("heuristic", Policy::Heuristic),
];

impl Policy {
    pub fn from_name(name: &str) -> anyhow::Result<Self> {
        crate::envs::by_name(&POLICIES, "ticketmelt policy", name)
    }
    pub fn name(self) -> &'static str {
        crate::envs::name_in(&POLICIES, &self)
    }
}

/// What the heuristic plays: one action, or either server (a coin decides).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Choice {
    Only(Action),
    Either,
}

/// The heuristic's branches: the situations of TICKETMELT's behaviour report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Situation {
    /// Own service restored: MONITOR.
    Restored,
    /// No moves seen yet, and the deadline is near (spare <= 1) or the service urgent:
    /// deploy to a server that is up.
    OpeningTight,
    /// No moves seen yet, time to spare: MONITOR.
    OpeningSlack,
    /// A server is up and nobody is predicted on it: deploy there.
    ServerFree,
    /// Every server is taken or down and the deadline (or urgency) forces a deploy:
    /// the server with fewer, and no urgent or tight, engineers predicted.
    NoneFreeMustDeploy,
    /// Every server is taken or down, time to spare: MONITOR.
    NoneFreeCanWait,
}

pub const SITUATIONS: [(&str, Situation); 6] = [
    ("restored", Situation::Restored),
    ("opening_tight", Situation::OpeningTight),
    ("opening_slack", Situation::OpeningSlack),
    ("server_free", Situation::ServerFree),
    ("none_free_must_deploy", Situation::NoneFreeMustDeploy),
    ("none_free_can_wait", Situation::NoneFreeCanWait),
];

impl Situation {
    pub fn name(self) -> &'static str {
        crate::envs::name_in(&SITUATIONS, &self)
    }
}

/// Opponent pools.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pool {
    Dumb,
    Diverse,
    Mixed,
    SelfPlay,
}

pub const POOLS: [(&str, Pool); 4] = [
    ("dumb", Pool::Dumb),
    ("diverse", Pool::Diverse),
    ("mixed", Pool::Mixed),
    ("self_play", Pool::SelfPlay),
];

impl Pool {
    pub fn from_name(name: &str) -> anyhow::Result<Self> {
        crate::envs::by_name(&POOLS, "ticketmelt pool", name)
    }
    pub fn name(self) -> &'static str {
        crate::envs::name_in(&POOLS, &self)
    }
}

impl Ticketmelt {
    /// The action scripted `policy` takes for `seat` now (advances the policy RNG only
    /// for `random` and the heuristic's tie breaks).
    pub fn scripted(&mut self, policy: Policy, seat: usize) -> Action {
        let done = self.completed[seat] > 0;
        let r = self.round;
        let a = match policy {
            Policy::AlwaysA => return Action::DeployA,
            Policy::AlwaysB => return Action::DeployB,
            Policy::AlwaysMonitor => return Action::Monitor,
            Policy::Random => {
                return [Action::Monitor, Action::DeployA, Action::DeployB]
                    [self.prng.below(3) as usize]
            }
            Policy::Heuristic => return self.heuristic(seat),
            _ if done => return Action::Monitor,
            Policy::Eager => Action::DeployA,
            Policy::Alternator => {
                if r.is_multiple_of(2) {
                    Action::DeployA
                } else {
                    Action::DeployB
                }
            }
            Policy::Nervous => {
                if self.deadline[seat] as i32 - r as i32 <= self.rem[seat] as i32 + 1 {
                    Action::DeployA
                } else {
                    Action::Monitor
                }
            }
        };
        if self.mirror && !self.is_policy(seat) {
            a.mirrored()
        } else {
            a
        }
    }

    /// Hand-written policy reading only what the seat's prompt shows: own deadline,
    /// remaining work and urgency, degraded servers, the visible history (last
    /// `history_rounds` rounds) and urgency hints. It predicts each unrestored
    /// engineer's next move from the last two rounds (a two-round A/B alternation
    /// repeats, anything else continues), deploys to a server nobody is predicted on,
    /// and otherwise waits unless its own deadline (or urgency) forces a gamble, in
    /// which case it avoids servers where an urgent or tight engineer is expected.
    fn heuristic(&mut self, seat: usize) -> Action {
        match self.heuristic_plan(seat).1 {
            // A coin decides between two equally good servers.
            Choice::Either => Action::from_server(self.prng.below(2) as usize),
            Choice::Only(a) => a,
        }
    }

    /// The heuristic's branch (its [`Situation`]) and choice for `seat` now; draws
    /// nothing.
    pub fn heuristic_plan(&self, seat: usize) -> (Situation, Choice) {
        if self.completed[seat] > 0 {
            return (Situation::Restored, Choice::Only(Action::Monitor));
        }
        let r = self.round as usize;
        let spare = self.spare(seat);
        let me_urgent = seat == self.urgent as usize;
        let hist = (self.rules.history_rounds as usize).min(r);
        let pick = |ok: [bool; 2]| match ok {
            [true, true] => Choice::Either,
            [true, false] => Choice::Only(Action::DeployA),
            [false, true] => Choice::Only(Action::DeployB),
            [false, false] => Choice::Only(Action::Monitor),
        };
        if hist == 0 {
            if spare <= 1 || me_urgent {
                let ok = [!self.degraded(0), !self.degraded(1)];
                return (Situation::OpeningTight, pick(ok));
            }
            return (Situation::OpeningSlack, Choice::Only(Action::Monitor));
        }
        let (pred, hot) = self.predicted(seat);
        let free = [
            pred[0] == 0 && !self.degraded(0),
            pred[1] == 0 && !self.degraded(1),
        ];
        if free[0] || free[1] {
            return (Situation::ServerFree, pick(free));
        }
        if spare <= 0 || (me_urgent && spare <= 1) {
            let ok = [!self.degraded(0) && !hot[0], !self.degraded(1) && !hot[1]];
            let choice = if ok[0] && ok[1] {
                Choice::Only(if pred[0] <= pred[1] {
                    Action::DeployA
                } else {
                    Action::DeployB
                })
            } else {
                pick(ok)
            };
            return (Situation::NoneFreeMustDeploy, choice);
        }
        (Situation::NoneFreeCanWait, Choice::Only(Action::Monitor))
    }

    /// How many unrestored others are predicted on each server next round (a two-round
    /// A/B alternation repeats, anything else continues), and whether an urgent or
    /// tight one is among them.
    pub fn predicted(&self, seat: usize) -> ([u8; 2], [bool; 2]) {
        let mut pred = [0u8; 2];
        let mut hot = [false; 2];
        for k in 0..SEATS {
            if k == seat {
                continue;
            }
            let Some(p) = self.expected_move(k) else {
                continue;
            };
            if let Some(s) = p.server() {
                pred[s] += 1;
                if self.urgent_visible(k, seat) || self.spare(k) <= 1 {
                    hot[s] = true;
                }
            }
        }
        (pred, hot)
    }

    /// What the heuristic expects engineer `k` to play next: a two-round A/B
    /// alternation repeats, anything else continues; `None` once `k` is restored or
    /// before any move is visible.
    pub fn expected_move(&self, k: usize) -> Option<Action> {
        let r = self.round as usize;
        let hist = (self.rules.history_rounds as usize).min(r);
        if hist == 0 || self.completed[k] > 0 {
            return None;
        }
        let a1 = self.acts[r - 1][k];
        if hist >= 2 {
            let a2 = self.acts[r - 2][k];
            if a1 != Action::Monitor && a2 != Action::Monitor && a1 != a2 {
                return Some(a2);
            }
        }
        Some(a1)
    }

    /// Fast path: one round where each policy seat plays `policy` (no text).
    pub fn step_scripted(&mut self, policy: Policy) {
        let mut acts = [Action::Monitor; SEATS];
        let mut msgs = [Msg::None; SEATS];
        for seat in 0..SEATS {
            if self.is_policy(seat) {
                acts[seat] = self.scripted(policy, seat);
                msgs[seat] = Msg::Canned;
            }
        }
        self.resolve(acts, msgs);
    }
    /// Play the rest of the episode with the continuation policy in every policy seat.
    pub fn rollout_with(&mut self, policy: Policy) {
        while !self.is_done() {
            self.step_scripted(policy);
        }
    }
}

impl TicketmeltFactory {
    /// Summaries of `episodes` episodes with `policy` in every policy seat against `pool`.
    pub fn baseline_stats(
        &self,
        policy: Policy,
        pool: Pool,
        episodes: usize,
        first_seed: u64,
    ) -> BaselineStats {
        let rules = Rules {
            peers: pool,
            ..self.rules
        };
        let mut st = BaselineStats::default();
        for i in 0..episodes {
            let mut ep = Ticketmelt::new(rules, first_seed.wrapping_add(i as u64));
            ep.rollout_with(policy);
            for s in 0..SEATS {
                if !ep.is_policy(s) {
                    continue;
                }
                let p = ep.reward_parts(s);
                st.n += 1;
                st.wins += p.win as usize;
                st.scalar += p.scalar;
                st.r[0] += p.r1;
                st.r[1] += p.r2;
                st.r[2] += p.r3;
                st.r[3] += p.r4;
                st.weighted += p.weighted;
                st.on_time += (p.r1 == 1.0) as usize;
                st.site_failures += p.site_failure as usize;
                st.deploys += ep.deploys[s] as usize;
                st.collided += ep.collided[s] as usize;
            }
            st.team_on_time += (0..SEATS).filter(|&s| ep.on_time(s)).count();
        }
        st.episodes = episodes;
        st
    }

    /// Single-threaded throughput through the fast path: the `heuristic` policy in
    /// every policy seat, scripted peers, rewards computed at the end. With prompts,
    /// every policy seat's system and user prompt is also rendered every round into a
    /// reused String.
    pub fn bench_fast(&self, min_secs: f64) -> BenchResult {
        let run = |render: bool| {
            let mut buf = String::with_capacity(8192);
            let mut seed = 0u64;
            let mut sink = 0usize;
            let m = measure(min_secs, || {
                let mut ep = Ticketmelt::new(self.rules, seed);
                seed += 1;
                while !ep.is_done() {
                    if render {
                        for s in 0..SEATS {
                            if ep.is_policy(s) {
                                buf.clear();
                                ep.system_prompt(&mut buf);
                                ep.render_user(s, &mut buf);
                                sink = sink.wrapping_add(buf.len());
                            }
                        }
                    }
                    ep.step_scripted(Policy::Heuristic);
                }
                sink = sink.wrapping_add(ep.reward_parts(0).win as usize);
                1
            });
            std::hint::black_box(sink);
            m
        };
        BenchResult::from_runs(run(false), run(true))
    }
}

/// Raw baseline sums.
#[derive(Debug, Clone, Default)]
pub struct BaselineStats {
    pub episodes: usize,
    /// Seat-episodes (episodes x policy seats).
    pub n: usize,
    pub wins: usize,
    pub scalar: f64,
    pub r: [f64; 4],
    pub weighted: f64,
    pub on_time: usize,
    pub team_on_time: usize,
    pub site_failures: usize,
    pub deploys: usize,
    pub collided: usize,
}

//! One session: the opponents' schedule, the resolution of each simultaneous move, the
//! per-seat tallies and the prompts.

use super::graph::{self, Phase, PublicState};
use super::parse::{answer_text, parse_action, ParseOutcome};
use super::policy::{self, Counts, Kind, SeatDraws, Strategy};
use super::{Action, Config, Regime};
use crate::envs::Environment;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// One finished episode of a session.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EpisodeRecord {
    /// 0-based index in the session (warm-up episodes first).
    pub episode: usize,
    pub warmup: bool,
    /// Vehicles with `index % 2 == parity` held the early priority.
    pub parity: usize,
    pub signals: Vec<Action>,
    pub commitments: Vec<Action>,
    pub collisions: Vec<bool>,
    pub rewards: Vec<f64>,
    /// Raw policy texts (signal, commit) per seat; None for scripted seats.
    pub texts: Vec<Option<[String; 2]>>,
    /// Parse outcome (signal, commit) per policy seat.
    pub parsed: Vec<Option<[ParseOutcome; 2]>>,
}

/// One session of the merge ring (an [`Environment`]).
#[derive(Debug, Clone)]
pub struct MergeRing {
    pub(super) cfg: Arc<Config>,
    pub(super) seed: u64,
    /// `schedule[episode][seat]`: the opponent type, None for policy seats.
    pub(super) schedule: Vec<Vec<Option<Kind>>>,
    pub(super) episode: usize,
    pub(super) phase: Phase,
    pub(super) parity: usize,
    pub(super) draws: Vec<SeatDraws>,
    pub(super) signals: Vec<Action>,
    pub(super) signal_texts: Vec<Option<String>>,
    pub(super) signal_parsed: Vec<Option<ParseOutcome>>,
    pub(super) history: Vec<EpisodeRecord>,
    pub(super) counts: Vec<Counts>,
    /// Policy-seat texts of every `step` (for replay; warm-up moves excluded).
    pub(super) steps: Vec<Vec<String>>,
}

const NON_MONOTONE: [[usize; 3]; 4] = [[0, 2, 1], [1, 0, 2], [1, 2, 0], [2, 0, 1]];

impl MergeRing {
    /// A new session; the same seed always gives the same session.
    pub fn new(cfg: Arc<Config>, seed: u64) -> Self {
        let n = cfg.agents;
        let total = cfg.total_episodes();
        let policy: Vec<bool> = (0..n).map(|i| cfg.self_play || i == cfg.seat).collect();
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let pick_level = |rng: &mut ChaCha8Rng| cfg.level.unwrap_or_else(|| rng.gen_range(0..3));
        let mut per_seat: Vec<Vec<Option<Kind>>> = Vec::with_capacity(n);
        let mut deceivers = 0;
        for &is_policy in &policy {
            if is_policy {
                per_seat.push(vec![None; total]);
                continue;
            }
            let seq: Vec<Option<Kind>> = match cfg.regime {
                Regime::Stationary => vec![Some(Kind::level(pick_level(&mut rng))); total],
                Regime::Switching => {
                    let options: Vec<&[usize; 3]> = NON_MONOTONE
                        .iter()
                        .filter(|p| cfg.level.is_none_or(|l| p[0] == l))
                        .collect();
                    let perm = options[rng.gen_range(0..options.len())];
                    (0..total)
                        .map(|e| Some(Kind::level(perm[(e / cfg.switch_every) % 3])))
                        .collect()
                }
                Regime::Misspecified => {
                    let kind = if rng.gen_bool(0.5) {
                        deceivers += 1;
                        Kind::Deceiver
                    } else {
                        Kind::level(pick_level(&mut rng))
                    };
                    vec![Some(kind); total]
                }
            };
            per_seat.push(seq);
        }
        if cfg.regime == Regime::Misspecified && deceivers == 0 {
            let opponents: Vec<usize> = (0..n).filter(|&i| !policy[i]).collect();
            if !opponents.is_empty() {
                let i = opponents[rng.gen_range(0..opponents.len())];
                per_seat[i] = vec![Some(Kind::Deceiver); total];
            }
        }
        let schedule = (0..total)
            .map(|e| per_seat.iter().map(|s| s[e]).collect())
            .collect();
        let mut env = MergeRing {
            cfg,
            seed,
            schedule,
            episode: 0,
            phase: Phase::Signal,
            parity: 0,
            draws: Vec::new(),
            signals: Vec::new(),
            signal_texts: vec![None; n],
            signal_parsed: vec![None; n],
            history: Vec::new(),
            counts: vec![[[0.0; 3]; 3]; n],
            steps: Vec::new(),
        };
        env.start_episode();
        while env.episode < env.cfg.warmup {
            env.play_warmup_episode();
        }
        env
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }
    /// Finished episodes of the session (warm-up included).
    pub fn history(&self) -> &[EpisodeRecord] {
        &self.history
    }
    /// The opponent types, `[episode][seat]` (None for policy seats). Never shown to
    /// the policy; for tests and analysis.
    pub fn schedule(&self) -> &[Vec<Option<Kind>>] {
        &self.schedule
    }
    /// Current episode index (warm-up included) and phase.
    pub fn position(&self) -> (usize, Phase) {
        (self.episode, self.phase)
    }
    /// The public state of the current episode (graph node).
    pub fn public_state(&self) -> PublicState {
        let n = self.cfg.agents;
        match self.phase {
            Phase::Signal => PublicState::initial(n),
            Phase::Commit => PublicState {
                phase: Phase::Commit,
                signals: Some(self.signals.clone()),
                commitments: None,
                collisions: vec![false; n],
            },
            Phase::Done => match self.history.last() {
                Some(r) => PublicState {
                    phase: Phase::Done,
                    signals: None,
                    commitments: Some(r.commitments.clone()),
                    collisions: r.collisions.clone(),
                },
                None => PublicState::initial(n),
            },
        }
    }

    pub(super) fn is_policy(&self, seat: usize) -> bool {
        self.cfg.self_play || seat == self.cfg.seat
    }

    pub(super) fn ctx(&self) -> policy::Ctx<'_> {
        policy::Ctx {
            n: self.cfg.agents,
            noise: self.cfg.noise,
            rewards: &self.cfg.rewards,
            parity: self.parity,
        }
    }

    pub(super) fn start_episode(&mut self) {
        let mut rng = ChaCha8Rng::seed_from_u64(self.seed);
        rng.set_stream(self.episode as u64 + 1);
        let rand_action = |rng: &mut ChaCha8Rng| Action::from_index(rng.gen_range(0..3));
        self.parity = rng.gen_range(0..2);
        self.draws = (0..self.cfg.agents)
            .map(|_| SeatDraws {
                sig_u: rng.gen(),
                sig_rand: rand_action(&mut rng),
                com_u: rng.gen(),
                com_rand: rand_action(&mut rng),
                rand_sig: rand_action(&mut rng),
                rand_com: rand_action(&mut rng),
            })
            .collect();
        self.phase = Phase::Signal;
        self.signals.clear();
        self.signal_texts = vec![None; self.cfg.agents];
        self.signal_parsed = vec![None; self.cfg.agents];
    }

    /// What `strategy` plays at `seat` now.
    pub(super) fn strategy_action(&self, strategy: Strategy, seat: usize) -> Action {
        let ctx = self.ctx();
        match self.phase {
            Phase::Signal => policy::signal(&ctx, strategy, seat, &self.draws[seat]),
            Phase::Commit => policy::commit(
                &ctx,
                strategy,
                seat,
                &self.draws[seat],
                &self.signals,
                &self.counts,
            ),
            Phase::Done => Action::Bypass,
        }
    }

    pub(super) fn scripted_action(&self, seat: usize) -> Action {
        let kind = self.schedule[self.episode][seat].unwrap_or(Kind::Level0);
        self.strategy_action(kind.strategy(), seat)
    }

    pub(super) fn play_warmup_episode(&mut self) {
        for _ in 0..2 {
            let texts: Vec<String> = self
                .policy_seats()
                .iter()
                .map(|&s| answer_text(self.strategy_action(Strategy::Level0, s)))
                .collect();
            self.resolve(&texts);
        }
    }

    /// Resolve one simultaneous move with parsed policy texts.
    /// Returns how each policy seat's text was read, in policy-seat order.
    pub(super) fn resolve(&mut self, texts: &[String]) -> Vec<ParseOutcome> {
        let n = self.cfg.agents;
        let seats = self.policy_seats();
        let mut actions: Vec<Action> = (0..n)
            .map(|s| {
                if self.is_policy(s) {
                    Action::Bypass
                } else {
                    self.scripted_action(s)
                }
            })
            .collect();
        let mut parsed = vec![None; n];
        let mut raw = vec![None; n];
        let mut read = Vec::with_capacity(seats.len());
        for (&seat, text) in seats.iter().zip(texts) {
            let (a, how) = parse_action(text);
            read.push(how);
            actions[seat] = a;
            parsed[seat] = Some(how);
            raw[seat] = Some(text.clone());
        }
        match self.phase {
            Phase::Signal => {
                self.signals = actions;
                self.signal_texts = raw;
                self.signal_parsed = parsed;
                self.phase = Phase::Commit;
            }
            Phase::Commit => {
                let collisions = graph::collision_bits(&actions);
                let r = &self.cfg.rewards;
                let rewards = (0..n)
                    .map(|i| match (actions[i], collisions[i]) {
                        (_, true) => r.collision,
                        (Action::Early, false) => r.merge_early,
                        (Action::Late, false) => r.merge_late,
                        (Action::Bypass, false) => r.bypass,
                    })
                    .collect();
                for ((c, s), a) in self.counts.iter_mut().zip(&self.signals).zip(&actions) {
                    c[s.index()][a.index()] += 1.0;
                }
                let texts = (0..n)
                    .map(|i| match (self.signal_texts[i].take(), raw[i].take()) {
                        (Some(a), Some(b)) => Some([a, b]),
                        _ => None,
                    })
                    .collect();
                let parsed = (0..n)
                    .map(|i| match (self.signal_parsed[i], parsed[i]) {
                        (Some(a), Some(b)) => Some([a, b]),
                        _ => None,
                    })
                    .collect();
                self.history.push(EpisodeRecord {
                    episode: self.episode,
                    warmup: self.episode < self.cfg.warmup,
                    parity: self.parity,
                    signals: std::mem::take(&mut self.signals),
                    commitments: actions,
                    collisions,
                    rewards,
                    texts,
                    parsed,
                });
                self.episode += 1;
                if self.episode >= self.cfg.total_episodes() {
                    self.phase = Phase::Done;
                } else {
                    self.start_episode();
                }
            }
            Phase::Done => {}
        }
        read
    }

    /// Per-seat tallies over played episodes.
    pub(super) fn tally(&self, seat: usize) -> Tally {
        let mut t = Tally::default();
        for rec in self.history.iter().filter(|r| !r.warmup) {
            t.episodes += 1;
            t.reward += rec.rewards[seat];
            match (rec.commitments[seat], rec.collisions[seat]) {
                (_, true) => t.collisions += 1,
                (Action::Early, false) => t.early += 1,
                (Action::Late, false) => t.late += 1,
                (Action::Bypass, false) => t.bypasses += 1,
            }
            if let Some(p) = rec.parsed[seat] {
                t.malformed += p.iter().filter(|&&o| o == ParseOutcome::Default).count();
            }
        }
        t
    }

    pub(super) fn outcome_text(&self, rec: &EpisodeRecord, seat: usize) -> String {
        let r = rec.rewards[seat];
        match (rec.commitments[seat], rec.collisions[seat]) {
            (_, true) => format!("collided ({r:+.1})"),
            (Action::Bypass, _) => format!("bypassed ({r:+.1})"),
            (a, _) => format!("merged {} ({r:+.1})", a.as_str()),
        }
    }

    pub(super) fn system_prompt(&self) -> String {
        let r = &self.cfg.rewards;
        format!(
            "You drive one vehicle on a ring road of {n} vehicles approaching a merge. Each \
             vehicle has two neighbours on the ring. A session has {e} episodes with the same \
             drivers, and every episode has two phases:\n\
             1. SIGNAL: every vehicle broadcasts a proposal (early, late or bypass). Everyone \
             sees all signals. Signals are not binding.\n\
             2. COMMIT: every vehicle simultaneously commits to one action:\n\
             - early: take the early merge slot ({me:+.1} if safe)\n\
             - late: take the late merge slot ({ml:+.1} if safe)\n\
             - bypass: take the slow bypass, always safe ({b:+.1})\n\
             If you take early or late and a neighbour commits to the same slot, you collide \
             ({c:+.1}). Bypass never collides.\n\
             Each episode the priority alternates around the ring: half the vehicles hold the \
             early slot and their neighbours the late slot, so drivers who follow the \
             priority never collide. Not every driver follows it, and drivers differ: use \
             what your neighbours signalled and then did in earlier episodes.\n\
             Your score is your average reward over the session. Answer with a single \
             line in the format shown at the end of each message.",
            n = self.cfg.agents,
            e = self.cfg.episodes_per_session,
            me = r.merge_early,
            ml = r.merge_late,
            b = r.bypass,
            c = r.collision,
        )
    }

    pub(super) fn user_prompt(&self, seat: usize) -> String {
        let ctx = self.ctx();
        let (l, r) = ctx.neighbours(seat);
        let mut out = String::new();
        if self.phase == Phase::Done {
            let t = self.tally(seat);
            return format!(
                "The session is over. You drove vehicle {seat}: {} episodes, mean reward {:.3}, \
                 {} merges, {} bypasses, {} collisions.",
                t.episodes,
                t.mean(),
                t.early + t.late,
                t.bypasses,
                t.collisions
            );
        }
        let played = self.episode.saturating_sub(self.cfg.warmup) + 1;
        out.push_str(&format!(
            "Episode {played} of {}. You drive vehicle {seat}; ",
            self.cfg.episodes_per_session
        ));
        if l == r {
            out.push_str(&format!("your neighbour is vehicle {l} (on both sides).\n"));
        } else {
            out.push_str(&format!(
                "your neighbours are vehicle {l} and vehicle {r}.\n"
            ));
        }
        let parity = if self.parity == 0 { "even" } else { "odd" };
        out.push_str(&format!(
            "Priority this episode: {parity}-numbered vehicles hold the early slot, so the \
             priority gives you the {} slot.\n\n",
            ctx.convention(seat).as_str().to_uppercase()
        ));
        out.push_str(
            "Earlier episodes of this session (what your neighbours signalled, then did):\n",
        );
        if self.history.is_empty() {
            out.push_str("(none yet)\n");
        }
        let neighbours: Vec<usize> = if l == r { vec![l] } else { vec![l, r] };
        for rec in &self.history {
            let parts: Vec<String> = neighbours
                .iter()
                .map(|&j| {
                    format!(
                        "vehicle {j} signalled {}, did {}{}",
                        rec.signals[j].as_str(),
                        rec.commitments[j].as_str(),
                        if rec.collisions[j] { " (collided)" } else { "" }
                    )
                })
                .collect();
            let label = if rec.warmup {
                "warm-up episode".to_string()
            } else {
                format!("episode {}", rec.episode + 1 - self.cfg.warmup)
            };
            out.push_str(&format!(
                "- {label}: {}; you signalled {}, did {}: {}\n",
                parts.join("; "),
                rec.signals[seat].as_str(),
                rec.commitments[seat].as_str(),
                self.outcome_text(rec, seat)
            ));
        }
        out.push('\n');
        match self.phase {
            Phase::Signal => out.push_str(
                "Phase: SIGNAL. Broadcast your proposal; your neighbours will see it before \
                 everyone commits.\n",
            ),
            _ => {
                let sig: Vec<String> = (0..self.cfg.agents)
                    .map(|i| {
                        let who = if i == seat {
                            " (you)".to_string()
                        } else {
                            String::new()
                        };
                        format!("vehicle {i}{who}: {}", self.signals[i].as_str())
                    })
                    .collect();
                out.push_str(&format!("Signals this episode: {}.\n", sig.join(", ")));
                out.push_str("Phase: COMMIT. Your commitment decides your reward.\n");
            }
        }
        out.push_str("Options:\n- early\n- late\n- bypass\nReply with one line, for example:\nACTION: bypass");
        out
    }
}

#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Tally {
    pub(super) episodes: usize,
    pub(super) reward: f64,
    pub(super) early: usize,
    pub(super) late: usize,
    pub(super) bypasses: usize,
    pub(super) collisions: usize,
    pub(super) malformed: usize,
}

impl Tally {
    pub(super) fn mean(&self) -> f64 {
        if self.episodes == 0 {
            0.0
        } else {
            self.reward / self.episodes as f64
        }
    }
}

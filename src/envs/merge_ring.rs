//! `merge_ring`: the congestion merge ring (seed `002_83e35617dca3d14c`, design doc §2).
//!
//! # Rules
//! `n` vehicles (even, `n >= 2`) sit on a ring; vehicle `i`'s neighbours are `i-1` and
//! `i+1` (mod n). An *episode* has two simultaneous moves:
//! 1. **signal**: every vehicle broadcasts a proposal in {early, late, bypass} (cheap
//!    talk, public to all);
//! 2. **commit**: every vehicle commits to one of {early, late, bypass}.
//!
//! Two adjacent vehicles that both take a direct route (early or late) collide exactly
//! when they choose the same slot; bypass is always safe but slow. The episode then
//! sits in an absorbing class: *merged* (no collision) or *collided* (unsafe). The exact
//! public-state graph is in [`graph`].
//!
//! Each episode a public *priority* is drawn: vehicles whose index has parity `p` hold
//! the early slot, the others the late slot. On an even ring this convention is
//! collision-free, which is what level-0 drivers (noisily) follow.
//!
//! A *session* (one [`Environment`]) is `warmup + episodes_per_session` episodes with the
//! same opponents. Warm-up episodes are played at reset (the policy seats driven by the
//! level-0 convention) and only appear in the history. The observation shows the public
//! history of the session: what each neighbour signalled and then did in every earlier
//! episode. Opponent types are never shown.
//!
//! # Rewards (per episode, per vehicle; defaults, all configurable)
//! | outcome | value | component |
//! |---|---|---|
//! | merged in the early slot | +1.0 | `r_merge` |
//! | merged in the late slot | +0.7 | `r_merge` |
//! | bypass | +0.4 | `r_bypass` |
//! | collision | -1.0 | `r_collision` |
//!
//! The early slot is worth more than the late one so that deviating from the
//! convention is tempting (that is the gap level-1 drivers exploit). A seat's scalar
//! reward is the mean over the session's played (non-warm-up) episodes, i.e.
//! `r_merge + r_bypass + r_collision`. Safety is reported beside it and not summed
//! into the scalar: `merge_rate`, `bypass_rate`, `collision_rate` (fractions of the
//! seat's played episodes) and `malformed_rate` (answers the parser had to default).
//!
//! # Opponents and regimes
//! Scripted drivers are described in [`policy`]. Regimes (option `regime`):
//! - `stationary`: each opponent's level is fixed for the session (option `level`:
//!   0, 1, 2, or `"mixed"` = drawn uniformly per opponent, the default);
//! - `switching`: each opponent follows a non-monotone level schedule (a permutation of
//!   0,1,2 that is neither increasing nor decreasing, e.g. 1 -> 0 -> 2), switching every
//!   `switch_every` episodes and cycling;
//! - `misspecified`: each opponent is, with probability 1/2, a *deceiver* (outside the
//!   levels: signals like level 0, then commits to the other direct slot half the
//!   time), otherwise a level as in `stationary`; at least one opponent is a deceiver.
//!
//! Level 2 behaves like `always_early` against level-1 neighbours (it announces early and
//! they yield), and a ring of level-2 drivers therefore collides: the level hierarchy is
//! not monotone in quality, so the policy has to infer who it faces.
//!
//! The continuation policy (used to finish episodes when scoring a GRPO decision) is
//! the `heuristic`.
//!
//! # LLM interface
//! Prompts are a system message (rules, rewards) and a user message (priority, public
//! history, this episode's signals in the commit phase, options as a list, and the
//! answer format `ACTION: bypass`). [`parse_action`] reads the answer and defaults to
//! bypass, the safe action; it never panics.

pub mod graph;
pub mod policy;

pub use graph::{run_graph, successor, successors, GraphArgs, Phase, PublicState};
use policy::{Counts, Kind, SeatDraws, Strategy, POLICY_NAMES};

use super::{wilson_ci, BaselineRow, EnvFactory, Environment, Message, Options, Reward};
use anyhow::{bail, Context};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Registry name.
pub const NAME: &str = "merge_ring";

/// A proposal or commitment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    Early,
    Late,
    Bypass,
}

impl Action {
    pub const ALL: [Action; 3] = [Action::Early, Action::Late, Action::Bypass];
    /// early 0, late 1, bypass 2.
    pub fn index(self) -> usize {
        match self {
            Action::Early => 0,
            Action::Late => 1,
            Action::Bypass => 2,
        }
    }
    /// Inverse of [`Action::index`] (indices above 2 give bypass).
    pub fn from_index(i: usize) -> Action {
        match i {
            0 => Action::Early,
            1 => Action::Late,
            _ => Action::Bypass,
        }
    }
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Early => "early",
            Action::Late => "late",
            Action::Bypass => "bypass",
        }
    }
    /// Early or late (a direct route through the merge).
    pub fn is_direct(self) -> bool {
        self != Action::Bypass
    }
    /// The other direct slot (bypass maps to early).
    pub fn other_direct(self) -> Action {
        match self {
            Action::Early => Action::Late,
            Action::Late | Action::Bypass => Action::Early,
        }
    }
}

// ------------------------------------------------------------------------------------
// Parser

/// How [`parse_action`] read an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ParseOutcome {
    /// `ACTION: x` (or `"action": "x"`, `answer: x`, `commit: x` ...); the last wins.
    Marked,
    /// No marker, but exactly one of the three action words appears.
    Bare,
    /// Nothing usable (empty, no action word, or several without a marker): bypass.
    Default,
}

const MARKERS: &[&str] = &[
    "action",
    "answer",
    "commit",
    "commitment",
    "signal",
    "proposal",
    "choice",
    "decision",
    "final",
];

fn keyword(word: &str) -> Option<Action> {
    match word {
        "early" => Some(Action::Early),
        "late" => Some(Action::Late),
        "bypass" => Some(Action::Bypass),
        _ => None,
    }
}

/// Parse a model answer into an action. Case-insensitive, word-based:
/// 1. the last `MARKER <sep> WORD` where MARKER is one of action / answer / commit /
///    commitment / signal / proposal / choice / decision / final, `<sep>` is
///    punctuation containing `:` or `=` (so `ACTION: late`, `**Action:** late` and
///    `{"action": "late"}` all work) and WORD is early / late / bypass;
/// 2. otherwise, when exactly one distinct action word occurs anywhere, that word;
/// 3. otherwise **bypass** (the safe action), reported as [`ParseOutcome::Default`].
///
/// A marker followed by a list of action words (`ACTION: early|late|bypass`, a copied
/// template) does not count as marked. Words are maximal ASCII alphanumeric runs, so
/// `lately` or `earlier` never count.
/// Never panics.
pub fn parse_action(text: &str) -> (Action, ParseOutcome) {
    // (word, byte start, byte end)
    let mut words: Vec<(String, usize, usize)> = Vec::new();
    let mut cur: Option<(String, usize)> = None;
    for (i, ch) in text.char_indices() {
        if ch.is_ascii_alphanumeric() {
            match cur.as_mut() {
                Some((w, _)) => w.push(ch.to_ascii_lowercase()),
                None => cur = Some((ch.to_ascii_lowercase().to_string(), i)),
            }
        } else if let Some((w, s)) = cur.take() {
            words.push((w, s, i));
        }
    }
    if let Some((w, s)) = cur.take() {
        words.push((w, s, text.len()));
    }
    let mut marked = None;
    for (i, pair) in words.windows(2).enumerate() {
        let (m, _, m_end) = &pair[0];
        let (k, k_start, k_end) = &pair[1];
        if let Some(a) = keyword(k) {
            if MARKERS.contains(&m.as_str()) {
                let sep = text.get(*m_end..*k_start).unwrap_or("");
                // A copied template such as `ACTION: early|late|bypass` is ambiguous.
                let listed = words.get(i + 2).is_some_and(|(w, s, _)| {
                    let gap = text.get(*k_end..*s).unwrap_or("");
                    keyword(w).is_some() && gap.len() <= 3 && !gap.contains('\n')
                });
                if (sep.contains(':') || sep.contains('=')) && !listed {
                    marked = Some(a);
                }
            }
        }
    }
    if let Some(a) = marked {
        return (a, ParseOutcome::Marked);
    }
    let mut seen = [false; 3];
    for (w, _, _) in &words {
        if let Some(a) = keyword(w) {
            seen[a.index()] = true;
        }
    }
    if seen.iter().filter(|&&s| s).count() == 1 {
        let i = seen.iter().position(|&s| s).unwrap_or(2);
        return (Action::from_index(i), ParseOutcome::Bare);
    }
    (Action::Bypass, ParseOutcome::Default)
}

/// The canonical answer text for an action (what scripted policies "say").
pub fn answer_text(a: Action) -> String {
    format!("ACTION: {}", a.as_str())
}

// ------------------------------------------------------------------------------------
// Configuration

/// Reward values per episode outcome.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Rewards {
    pub merge_early: f64,
    pub merge_late: f64,
    pub bypass: f64,
    pub collision: f64,
}

impl Default for Rewards {
    fn default() -> Self {
        Self {
            merge_early: 1.0,
            merge_late: 0.7,
            bypass: 0.4,
            collision: -1.0,
        }
    }
}

/// Opponent regime.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Regime {
    Stationary,
    Switching,
    Misspecified,
}

impl Regime {
    pub fn from_name(s: &str) -> Option<Regime> {
        Some(match s {
            "stationary" => Regime::Stationary,
            "switching" => Regime::Switching,
            "misspecified" => Regime::Misspecified,
            _ => return None,
        })
    }
}

/// Validated options of a merge_ring environment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Config {
    /// Vehicles on the ring (even, 2..=64). Option `agents`, default 4.
    pub agents: usize,
    /// Option `regime`: stationary (default) | switching | misspecified.
    pub regime: Regime,
    /// Option `level`: 0 | 1 | 2 | "mixed" (None; default). In `switching` it fixes the
    /// first level of every schedule.
    pub level: Option<usize>,
    /// Option `noise` in [0, 1], default 0.2: level-0 noise, also the tremble the
    /// level-1/2 models assume.
    pub noise: f64,
    /// Option `episodes_per_session` (>= 1), default 6: played episodes per session.
    pub episodes_per_session: usize,
    /// Option `warmup` (>= 0), default 1: history-only episodes played at reset.
    pub warmup: usize,
    /// Option `switch_every` (>= 1), default 2: episodes per level in `switching`.
    pub switch_every: usize,
    /// Option `self_play`, default false: every seat is the policy.
    pub self_play: bool,
    /// Option `seat`, default 0: the policy seat when not self-play.
    pub seat: usize,
    /// Options `reward_early` (1.0), `reward_late` (0.7), `reward_bypass` (0.4),
    /// `reward_collision` (-1.0).
    pub rewards: Rewards,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            agents: 4,
            regime: Regime::Stationary,
            level: None,
            noise: 0.2,
            episodes_per_session: 6,
            warmup: 1,
            switch_every: 2,
            self_play: false,
            seat: 0,
            rewards: Rewards::default(),
        }
    }
}

const OPTION_KEYS: &[&str] = &[
    "agents",
    "regime",
    "level",
    "noise",
    "episodes_per_session",
    "warmup",
    "switch_every",
    "self_play",
    "seat",
    "reward_early",
    "reward_late",
    "reward_bypass",
    "reward_collision",
];

fn opt_usize(v: &toml::Value, key: &str) -> anyhow::Result<usize> {
    match v.as_integer() {
        Some(i) if i >= 0 => Ok(i as usize),
        _ => bail!("merge_ring option `{key}` must be a non-negative integer, got {v}"),
    }
}

fn opt_f64(v: &toml::Value, key: &str) -> anyhow::Result<f64> {
    match v {
        toml::Value::Float(f) if f.is_finite() => Ok(*f),
        toml::Value::Integer(i) => Ok(*i as f64),
        _ => bail!("merge_ring option `{key}` must be a number, got {v}"),
    }
}

impl Config {
    /// Parse and validate `[env.options]`; unknown keys are an error naming the key.
    pub fn from_options(options: &Options) -> anyhow::Result<Config> {
        let mut c = Config::default();
        for (key, v) in options {
            match key.as_str() {
                "agents" => c.agents = opt_usize(v, key)?,
                "regime" => {
                    let s = v.as_str().unwrap_or_default();
                    c.regime = Regime::from_name(s).with_context(|| {
                        format!(
                            "merge_ring option `regime` must be stationary, switching or \
                             misspecified, got {v}"
                        )
                    })?;
                }
                "level" => {
                    c.level = match v {
                        toml::Value::String(s) if s == "mixed" => None,
                        toml::Value::String(s) if matches!(s.as_str(), "0" | "1" | "2") => {
                            s.parse().ok()
                        }
                        toml::Value::Integer(i) if (0..=2).contains(i) => Some(*i as usize),
                        _ => {
                            bail!("merge_ring option `level` must be 0, 1, 2 or \"mixed\", got {v}")
                        }
                    }
                }
                "noise" => c.noise = opt_f64(v, key)?,
                "episodes_per_session" => c.episodes_per_session = opt_usize(v, key)?,
                "warmup" => c.warmup = opt_usize(v, key)?,
                "switch_every" => c.switch_every = opt_usize(v, key)?,
                "self_play" => {
                    c.self_play = v.as_bool().with_context(|| {
                        format!("merge_ring option `self_play` must be a boolean, got {v}")
                    })?
                }
                "seat" => c.seat = opt_usize(v, key)?,
                "reward_early" => c.rewards.merge_early = opt_f64(v, key)?,
                "reward_late" => c.rewards.merge_late = opt_f64(v, key)?,
                "reward_bypass" => c.rewards.bypass = opt_f64(v, key)?,
                "reward_collision" => c.rewards.collision = opt_f64(v, key)?,
                other => bail!(
                    "unknown merge_ring option `{other}`; known options: {}",
                    OPTION_KEYS.join(", ")
                ),
            }
        }
        c.validate()?;
        Ok(c)
    }

    pub fn validate(&self) -> anyhow::Result<()> {
        if self.agents < 2 || !self.agents.is_multiple_of(2) || self.agents > 64 {
            bail!(
                "merge_ring option `agents` must be even and in 2..=64, got {}",
                self.agents
            );
        }
        if !(0.0..=1.0).contains(&self.noise) {
            bail!(
                "merge_ring option `noise` must be in [0, 1], got {}",
                self.noise
            );
        }
        if self.episodes_per_session == 0 || self.episodes_per_session > 1000 {
            bail!("merge_ring option `episodes_per_session` must be in 1..=1000");
        }
        if self.warmup > 1000 {
            bail!("merge_ring option `warmup` must be at most 1000");
        }
        if self.switch_every == 0 {
            bail!("merge_ring option `switch_every` must be at least 1");
        }
        if self.seat >= self.agents {
            bail!(
                "merge_ring option `seat` must be below `agents` ({}), got {}",
                self.agents,
                self.seat
            );
        }
        Ok(())
    }

    /// Warm-up plus played episodes.
    pub fn total_episodes(&self) -> usize {
        self.warmup + self.episodes_per_session
    }
}

// ------------------------------------------------------------------------------------
// Episodes

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
    cfg: Arc<Config>,
    seed: u64,
    /// `schedule[episode][seat]`: the opponent type, None for policy seats.
    schedule: Vec<Vec<Option<Kind>>>,
    episode: usize,
    phase: Phase,
    parity: usize,
    draws: Vec<SeatDraws>,
    signals: Vec<Action>,
    signal_texts: Vec<Option<String>>,
    signal_parsed: Vec<Option<ParseOutcome>>,
    history: Vec<EpisodeRecord>,
    counts: Vec<Counts>,
    /// Policy-seat texts of every `step` (for replay; warm-up moves excluded).
    steps: Vec<Vec<String>>,
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

    fn is_policy(&self, seat: usize) -> bool {
        self.cfg.self_play || seat == self.cfg.seat
    }

    fn ctx(&self) -> policy::Ctx<'_> {
        policy::Ctx {
            n: self.cfg.agents,
            noise: self.cfg.noise,
            rewards: &self.cfg.rewards,
            parity: self.parity,
        }
    }

    fn start_episode(&mut self) {
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
    fn strategy_action(&self, strategy: Strategy, seat: usize) -> Action {
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

    fn scripted_action(&self, seat: usize) -> Action {
        let kind = self.schedule[self.episode][seat].unwrap_or(Kind::Level0);
        self.strategy_action(kind.strategy(), seat)
    }

    fn play_warmup_episode(&mut self) {
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
    fn resolve(&mut self, texts: &[String]) {
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
        for (&seat, text) in seats.iter().zip(texts) {
            let (a, how) = parse_action(text);
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
    }

    /// Per-seat tallies over played episodes.
    fn tally(&self, seat: usize) -> Tally {
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

    fn outcome_text(&self, rec: &EpisodeRecord, seat: usize) -> String {
        let r = rec.rewards[seat];
        match (rec.commitments[seat], rec.collisions[seat]) {
            (_, true) => format!("collided ({r:+.1})"),
            (Action::Bypass, _) => format!("bypassed ({r:+.1})"),
            (a, _) => format!("merged {} ({r:+.1})", a.as_str()),
        }
    }

    fn system_prompt(&self) -> String {
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

    fn user_prompt(&self, seat: usize) -> String {
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
struct Tally {
    episodes: usize,
    reward: f64,
    early: usize,
    late: usize,
    bypasses: usize,
    collisions: usize,
    malformed: usize,
}

impl Tally {
    fn mean(&self) -> f64 {
        if self.episodes == 0 {
            0.0
        } else {
            self.reward / self.episodes as f64
        }
    }
}

impl Environment for MergeRing {
    fn name(&self) -> &'static str {
        NAME
    }
    fn num_seats(&self) -> usize {
        self.cfg.agents
    }
    fn policy_seats(&self) -> Vec<usize> {
        (0..self.cfg.agents)
            .filter(|&s| self.is_policy(s))
            .collect()
    }
    fn observation(&self, seat: usize) -> Vec<Message> {
        if seat >= self.cfg.agents {
            return vec![
                Message::system(self.system_prompt()),
                Message::user(format!("There is no vehicle {seat} on this ring.")),
            ];
        }
        vec![
            Message::system(self.system_prompt()),
            Message::user(self.user_prompt(seat)),
        ]
    }
    fn step(&mut self, actions: &[String]) -> anyhow::Result<()> {
        if self.phase == Phase::Done {
            bail!("the merge_ring session is over");
        }
        let seats = self.policy_seats().len();
        if actions.len() != seats {
            bail!(
                "merge_ring step got {} actions for {} policy seats",
                actions.len(),
                seats
            );
        }
        self.steps.push(actions.to_vec());
        self.resolve(actions);
        Ok(())
    }
    fn done(&self) -> bool {
        self.phase == Phase::Done
    }
    fn reward(&self, seat: usize) -> Reward {
        let t = if seat < self.cfg.agents {
            self.tally(seat)
        } else {
            Tally::default()
        };
        let r = &self.cfg.rewards;
        let e = t.episodes.max(1) as f64;
        let merge = (t.early as f64 * r.merge_early + t.late as f64 * r.merge_late) / e;
        let bypass = t.bypasses as f64 * r.bypass / e;
        let collision = t.collisions as f64 * r.collision / e;
        let mut components = BTreeMap::new();
        components.insert("r_merge".to_string(), merge);
        components.insert("r_bypass".to_string(), bypass);
        components.insert("r_collision".to_string(), collision);
        components.insert("merge_rate".to_string(), (t.early + t.late) as f64 / e);
        components.insert("bypass_rate".to_string(), t.bypasses as f64 / e);
        components.insert("collision_rate".to_string(), t.collisions as f64 / e);
        components.insert("malformed_rate".to_string(), t.malformed as f64 / (2.0 * e));
        Reward {
            components,
            scalar: merge + bypass + collision,
        }
    }
    /// As in the baseline table: no collision and better than always bypassing.
    fn won(&self, seat: usize) -> bool {
        if seat >= self.cfg.agents {
            return false;
        }
        let t = self.tally(seat);
        t.collisions == 0 && t.mean() > self.cfg.rewards.bypass + 1e-9
    }
    fn continuation_action(&mut self, seat: usize) -> String {
        answer_text(self.strategy_action(Strategy::Heuristic, seat.min(self.cfg.agents - 1)))
    }
    fn policy_action(&mut self, policy: &str, seat: usize) -> anyhow::Result<String> {
        let strategy = Strategy::from_name(policy).with_context(|| {
            format!(
                "unknown merge_ring policy `{policy}`; known: {}",
                POLICY_NAMES.join(", ")
            )
        })?;
        if seat >= self.cfg.agents {
            bail!("merge_ring has no seat {seat}");
        }
        Ok(answer_text(self.strategy_action(strategy, seat)))
    }
    fn transcript(&self) -> serde_json::Value {
        serde_json::json!({
            "env": NAME,
            "seed": self.seed,
            "config": &*self.cfg,
            "schedule": self.schedule,
            "steps": self.steps,
            "episodes": self.history,
            "current": {
                "episode": self.episode,
                "phase": self.phase,
                "parity": self.parity,
                "signals": self.signals,
                "signal_texts": self.signal_texts,
            },
        })
    }
    fn clone_box(&self) -> Box<dyn Environment> {
        Box::new(self.clone())
    }
    fn render_state(&self) -> String {
        let mut out = String::new();
        // The last finished episode, then where the session stands.
        if let Some(rec) = self.history.last() {
            let cells: Vec<String> = (0..self.cfg.agents)
                .map(|i| {
                    format!(
                        "{i}:{}->{}{}",
                        rec.signals[i].as_str(),
                        rec.commitments[i].as_str(),
                        if rec.collisions[i] { "!" } else { "" }
                    )
                })
                .collect();
            out.push_str(&format!(
                "{} {} (early priority: {} vehicles): {}\n",
                if rec.warmup { "warm-up" } else { "episode" },
                rec.episode,
                if rec.parity == 0 { "even" } else { "odd" },
                cells.join("  ")
            ));
        }
        match self.phase {
            Phase::Done => out.push_str("session over"),
            Phase::Signal => out.push_str(&format!(
                "episode {} (early priority: {} vehicles): signal phase",
                self.episode,
                if self.parity == 0 { "even" } else { "odd" }
            )),
            Phase::Commit => {
                let sig: Vec<String> = self
                    .signals
                    .iter()
                    .enumerate()
                    .map(|(i, a)| format!("{i}:{}", a.as_str()))
                    .collect();
                out.push_str(&format!(
                    "episode {} (early priority: {} vehicles): commit phase, signals {}",
                    self.episode,
                    if self.parity == 0 { "even" } else { "odd" },
                    sig.join("  ")
                ));
            }
        }
        out
    }
}

// ------------------------------------------------------------------------------------
// Factory

/// Pools baselines are reported against: the three regimes (levels mixed) and
/// stationary pools of a single level.
pub const POOLS: &[&str] = &[
    "stationary",
    "switching",
    "misspecified",
    "level0",
    "level1",
    "level2",
];

/// Creates merge_ring sessions.
#[derive(Debug, Clone)]
pub struct MergeRingFactory {
    cfg: Arc<Config>,
}

impl MergeRingFactory {
    pub fn new(cfg: Config) -> anyhow::Result<Self> {
        cfg.validate()?;
        Ok(Self { cfg: Arc::new(cfg) })
    }
    pub fn from_options(options: &Options) -> anyhow::Result<Self> {
        Self::new(Config::from_options(options)?)
    }
    pub fn config(&self) -> &Config {
        &self.cfg
    }
    /// A session as its concrete type.
    pub fn session(&self, seed: u64) -> MergeRing {
        MergeRing::new(self.cfg.clone(), seed)
    }
    /// The README's baseline table: every policy against every pool, `episodes`
    /// sessions each (seeds `first_seed..`), as markdown.
    pub fn markdown_table(&self, episodes: usize, first_seed: u64) -> anyhow::Result<String> {
        let mut out = String::from(
            "| policy | pool | sessions | win rate [95% CI] | mean reward | merge rate | bypass rate | collision rate |\n\
             |---|---|---:|---|---:|---:|---:|---:|\n",
        );
        for pool in POOLS {
            for policy in POLICY_NAMES {
                let r = self.baseline(policy, pool, episodes, first_seed)?;
                out.push_str(&format!(
                    "| {policy} | {pool} | {} | {:.3} [{:.3}, {:.3}] | {:.3} | {:.3} | {:.3} | {:.3} |\n",
                    r.episodes,
                    r.win_rate,
                    r.win_ci[0],
                    r.win_ci[1],
                    r.mean_reward,
                    r.extra["merge_rate"],
                    r.extra["bypass_rate"],
                    r.extra["collision_rate"],
                ));
            }
        }
        Ok(out)
    }

    /// This factory's configuration with a baseline pool applied.
    pub fn pool_config(&self, pool: &str) -> anyhow::Result<Config> {
        let mut c = (*self.cfg).clone();
        match pool {
            "stationary" | "switching" | "misspecified" => {
                c.regime = Regime::from_name(pool).unwrap_or(Regime::Stationary);
            }
            "level0" | "level1" | "level2" => {
                c.regime = Regime::Stationary;
                c.level = pool[5..].parse().ok();
            }
            _ => bail!(
                "unknown merge_ring pool `{pool}`; known: {}",
                POOLS.join(", ")
            ),
        }
        Ok(c)
    }
}

impl EnvFactory for MergeRingFactory {
    fn name(&self) -> &'static str {
        NAME
    }
    fn reset(&self, seed: u64) -> Box<dyn Environment> {
        Box::new(self.session(seed))
    }
    fn describe(&self) -> String {
        let c = &self.cfg;
        let r = &c.rewards;
        format!(
            "merge_ring: {n} vehicles on a ring (neighbours i-1, i+1). Each episode: a SIGNAL \
             phase (everyone broadcasts early/late/bypass) then a simultaneous COMMIT to \
             early/late/bypass. Adjacent vehicles taking the same direct slot (early or late) \
             collide; bypass is always safe. A per-episode priority gives alternate vehicles \
             the early slot (a collision-free convention).\n\
             Rewards per episode: early merge {me:+.1}, late merge {ml:+.1}, bypass {b:+.1}, \
             collision {col:+.1}; the scalar is the mean over the session's played episodes \
             (components r_merge, r_bypass, r_collision). Safety is reported separately: \
             merge_rate, bypass_rate, collision_rate, malformed_rate.\n\
             Session: {w} warm-up + {e} played episodes with the same opponents; the prompt \
             shows what each neighbour signalled and then did earlier in the session (never \
             its type).\n\
             Opponents: level0 (noisy priority convention, noise {noise}), level1 (best \
             response to level 0, takes gaps), level2 (best response to level 1, announces \
             early to make level-1 neighbours yield), deceiver (misspecified: signals like \
             level 0, commits the other slot half the time).\n\
             Regimes: stationary (fixed levels), switching (non-monotone level schedule, \
             switching every {sw} episodes), misspecified (deceivers among the opponents). \
             Current: {regime:?}, level {level}.\n\
             Answers: one line `ACTION: early|late|bypass`; unreadable or ambiguous answers \
             become bypass (the safe action).\n\
             Policies: {policies}. Pools: {pools}.\n\
             Options: agents (even, default 4), regime, level (0|1|2|\"mixed\"), noise (0.2), \
             episodes_per_session (6), warmup (1), switch_every (2), self_play (false), seat \
             (0), reward_early, reward_late, reward_bypass, reward_collision.\n\
             Exact graph: `concord envs graph merge_ring --agents N --json` (1 + 2*3^n states, \
             (1 + 2*3^n)*3^n state x joint-action groups).",
            n = c.agents,
            me = r.merge_early,
            ml = r.merge_late,
            b = r.bypass,
            col = r.collision,
            w = c.warmup,
            e = c.episodes_per_session,
            noise = c.noise,
            sw = c.switch_every,
            regime = c.regime,
            level = c.level.map_or("mixed".to_string(), |l| l.to_string()),
            policies = POLICY_NAMES.join(", "),
            pools = POOLS.join(", "),
        )
    }
    fn policies(&self) -> Vec<&'static str> {
        POLICY_NAMES.to_vec()
    }
    fn pools(&self) -> Vec<&'static str> {
        POOLS.to_vec()
    }
    fn baseline(
        &self,
        policy: &str,
        pool: &str,
        episodes: usize,
        first_seed: u64,
    ) -> anyhow::Result<BaselineRow> {
        if Strategy::from_name(policy).is_none() {
            bail!(
                "unknown merge_ring policy `{policy}`; known: {}",
                POLICY_NAMES.join(", ")
            );
        }
        let cfg = Arc::new(self.pool_config(pool)?);
        let (mut wins, mut seats_n, mut reward_sum) = (0usize, 0usize, 0.0);
        let (mut played, mut merges, mut bypasses, mut collisions) =
            (0usize, 0usize, 0usize, 0usize);
        for s in 0..episodes {
            let mut env = MergeRing::new(cfg.clone(), first_seed.wrapping_add(s as u64));
            while !env.done() {
                let texts = env
                    .policy_seats()
                    .iter()
                    .map(|&seat| env.policy_action(policy, seat))
                    .collect::<anyhow::Result<Vec<_>>>()?;
                env.step(&texts)?;
            }
            for seat in env.policy_seats() {
                let t = env.tally(seat);
                seats_n += 1;
                reward_sum += t.mean();
                if t.collisions == 0 && t.mean() > cfg.rewards.bypass + 1e-9 {
                    wins += 1;
                }
                played += t.episodes;
                merges += t.early + t.late;
                bypasses += t.bypasses;
                collisions += t.collisions;
            }
        }
        let p = played.max(1) as f64;
        let mut extra = BTreeMap::new();
        extra.insert("merge_rate".to_string(), merges as f64 / p);
        extra.insert("bypass_rate".to_string(), bypasses as f64 / p);
        extra.insert("collision_rate".to_string(), collisions as f64 / p);
        Ok(BaselineRow {
            policy: policy.to_string(),
            peers: pool.to_string(),
            episodes,
            win_rate: if seats_n == 0 {
                0.0
            } else {
                wins as f64 / seats_n as f64
            },
            win_ci: wilson_ci(wins, seats_n),
            mean_reward: if seats_n == 0 {
                0.0
            } else {
                reward_sum / seats_n as f64
            },
            extra,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parser_basics() {
        assert_eq!(
            parse_action("ACTION: late"),
            (Action::Late, ParseOutcome::Marked)
        );
        assert_eq!(
            parse_action("{\"action\": \"early\"}"),
            (Action::Early, ParseOutcome::Marked)
        );
        assert_eq!(
            parse_action("early would collide, so ACTION: bypass"),
            (Action::Bypass, ParseOutcome::Marked)
        );
        assert_eq!(
            parse_action("**Action:** Late"),
            (Action::Late, ParseOutcome::Marked)
        );
        assert_eq!(
            parse_action("I go early."),
            (Action::Early, ParseOutcome::Bare)
        );
        assert_eq!(
            parse_action("early or late?"),
            (Action::Bypass, ParseOutcome::Default)
        );
        assert_eq!(
            parse_action("lately, earlier"),
            (Action::Bypass, ParseOutcome::Default)
        );
        assert_eq!(parse_action(""), (Action::Bypass, ParseOutcome::Default));
        assert_eq!(
            parse_action("ACTION: early|late|bypass"),
            (Action::Bypass, ParseOutcome::Default)
        );
    }

    #[test]
    fn collision_rule() {
        use Action::*;
        assert_eq!(
            graph::collision_bits(&[Early, Late, Early, Late]),
            vec![false; 4]
        );
        assert_eq!(
            graph::collision_bits(&[Early, Early, Bypass, Late]),
            vec![true, true, false, false]
        );
        assert_eq!(graph::collision_bits(&[Late, Late]), vec![true, true]);
        assert_eq!(graph::collision_bits(&[Bypass, Bypass]), vec![false, false]);
    }

    #[test]
    fn unknown_option_is_named() {
        let mut o = Options::new();
        o.insert("agentz".into(), toml::Value::Integer(4));
        let err = Config::from_options(&o).unwrap_err().to_string();
        assert!(err.contains("agentz"), "{err}");
        let mut o = Options::new();
        o.insert("agents".into(), toml::Value::Integer(5));
        assert!(Config::from_options(&o).is_err());
    }

    #[test]
    fn small_graphs_explicit_and_on_demand_agree() {
        for (n, s, g) in [(2usize, 19u64, 171u64), (4, 163, 13_203)] {
            let e = graph::walk(n, true).unwrap();
            let d = graph::count_on_demand(n).unwrap();
            assert_eq!((e.states, e.groups), (s, g));
            assert_eq!((d.states, d.groups), (s, g));
            assert_eq!(
                (e.merged_states, e.collided_states),
                (d.merged_states, d.collided_states)
            );
        }
    }

    #[test]
    fn session_runs_to_done_with_garbage() {
        let f = MergeRingFactory::new(Config::default()).unwrap();
        let mut env = f.reset(3);
        let mut steps = 0;
        while !env.done() {
            env.step(&["\u{1F697} ??? :=".to_string()]).unwrap();
            steps += 1;
        }
        assert_eq!(steps, 2 * f.config().episodes_per_session);
        let r = env.reward(0);
        assert_eq!(r.components["malformed_rate"], 1.0);
        assert!((r.scalar - 0.4).abs() < 1e-12, "{r:?}");
        assert!(env.step(&["ACTION: early".into()]).is_err());
    }
}

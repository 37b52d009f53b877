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
//!
//! # Layout
//! `mod.rs`: actions, the environment and capability impls, the factory and baselines;
//! [`config`]: options; [`parse`]: the answer parser; [`session`]: state, resolution,
//! tallies and prompts; [`policy`]: scripted drivers; [`graph`]: the exact state graph.
//!
//! # Contract
//! `to_act()` is every policy seat (both phases are simultaneous) until the session is
//! over. Step rewards: 0.0 at signals, the episode's reward / `episodes_per_session` at
//! each commit (they sum to the final scalar); `valid` is false when the parser
//! defaulted to bypass.

pub mod compact;
pub mod config;
pub mod graph;
pub mod parse;
pub mod policy;
pub mod session;

pub use config::{Config, PromptStyle, Regime, Rewards};
pub use graph::{run_graph, successor, successors, GraphOptions, Phase, PublicState};
pub use parse::{answer_text, parse_action, ParseOutcome};
use policy::{Strategy, POLICY_NAMES};
use session::Tally;
pub use session::{EpisodeRecord, MergeRing};

use super::{
    wilson_ci, BaselineRow, Behaviour, DecisionView, EnvFactory, Environment, Inspect, Message,
    Options, Reward, Scripted, StepOutcome, Tools,
};
use anyhow::{bail, Context};
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

/// Step rewards: 0.0 for the signal phase; at each commit, the seat's reward for that
/// episode divided by `episodes_per_session`, so a seat's step rewards sum (up to
/// rounding) to its final scalar reward, the session mean. `valid` is false when the
/// parser had to default ([`ParseOutcome::Default`]); `feedback` then says so.
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
    /// Both phases are simultaneous: every policy seat acts until the session is over.
    fn to_act(&self) -> Vec<usize> {
        if self.phase == Phase::Done {
            Vec::new()
        } else {
            self.policy_seats()
        }
    }
    fn observation(&self, seat: usize) -> Vec<Message> {
        if seat >= self.cfg.agents {
            return vec![
                Message::system(self.system_prompt()),
                Message::user(format!("There is no vehicle {seat} on this ring.")),
            ];
        }
        match self.cfg.prompt {
            PromptStyle::Full => vec![
                Message::system(self.system_prompt()),
                Message::user(self.user_prompt(seat)),
            ],
            PromptStyle::Compact => vec![
                Message::system(self.system_prompt_compact()),
                Message::user(self.user_prompt_compact(seat)),
            ],
        }
    }
    fn step(&mut self, actions: &[String]) -> anyhow::Result<StepOutcome> {
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
        let commit = self.phase == Phase::Commit;
        let read = self.resolve(actions);
        let mut out = StepOutcome::default();
        for (seat, how) in self.policy_seats().into_iter().zip(read) {
            let reward = match self.history.last() {
                Some(rec) if commit && !rec.warmup => {
                    rec.rewards[seat] / self.cfg.episodes_per_session.max(1) as f64
                }
                _ => 0.0,
            };
            let valid = how != ParseOutcome::Default;
            let feedback = if valid {
                String::new()
            } else {
                "could not read an action (answer with one line `ACTION: early`, `ACTION: late` \
                 or `ACTION: bypass`); played bypass, the safe default"
                    .to_string()
            };
            out.push(seat, reward, valid, feedback);
        }
        Ok(out)
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
    fn as_scripted(&self) -> Option<&dyn Scripted> {
        Some(self)
    }
    fn as_scripted_mut(&mut self) -> Option<&mut dyn Scripted> {
        Some(self)
    }
    fn as_inspect(&self) -> Option<&dyn Inspect> {
        Some(self)
    }
    fn as_behaviour(&self) -> Option<&dyn Behaviour> {
        Some(self)
    }
}

/// The situations of the merge ring's behaviour report: the phase, the seat's priority
/// slot and, when committing, whether a neighbour signalled that slot ("contested") or
/// not ("clear"). The reference is the `heuristic`: it signals its priority slot and
/// commits to the best response against each neighbour's observed signal -> move
/// frequencies in the session.
pub const SITUATIONS: [&str; 6] = [
    "signal_early_priority",
    "signal_late_priority",
    "commit_clear_early_priority",
    "commit_clear_late_priority",
    "commit_contested_early_priority",
    "commit_contested_late_priority",
];

impl Behaviour for MergeRing {
    fn reference_policy(&self) -> &'static str {
        "heuristic"
    }
    fn situations(&self) -> Vec<&'static str> {
        SITUATIONS.to_vec()
    }
    fn actions(&self) -> Vec<&'static str> {
        Action::ALL.iter().map(|a| a.as_str()).collect()
    }
    fn action_label(&self, _seat: usize, text: &str) -> &'static str {
        parse_action(text).0.as_str()
    }
    fn view(&self, seat: usize) -> DecisionView {
        let seat = seat.min(self.cfg.agents - 1);
        let ctx = self.ctx();
        let (l, r) = ctx.neighbours(seat);
        let mine = ctx.convention(seat);
        let early = mine == Action::Early;
        // Signals exist only once the signal phase has been played.
        let signalled = |j: usize| self.signals.get(j).copied();
        let contested = signalled(l) == Some(mine) || signalled(r) == Some(mine);
        let situation = match (self.phase, contested, early) {
            (graph::Phase::Signal, _, true) | (graph::Phase::Done, _, true) => SITUATIONS[0],
            (graph::Phase::Signal, _, false) | (graph::Phase::Done, _, false) => SITUATIONS[1],
            (_, false, true) => SITUATIONS[2],
            (_, false, false) => SITUATIONS[3],
            (_, true, true) => SITUATIONS[4],
            (_, true, false) => SITUATIONS[5],
        };
        let reference = self.strategy_action(Strategy::Heuristic, seat).as_str();
        let commit = self.phase == graph::Phase::Commit;
        let counts = |j: usize| -> serde_json::Value { serde_json::json!(self.counts[j]) };
        DecisionView {
            situation,
            features: serde_json::json!({
                "episode": self.episode,
                "phase": if commit { "commit" } else { "signal" },
                "priority": mine.as_str(),
                "neighbours": [l, r],
                "neighbour_signals": [signalled(l).map(Action::as_str), signalled(r).map(Action::as_str)],
                // Rows: signalled early/late/bypass; columns: did early/late/bypass.
                "neighbour_counts": [counts(l), counts(r)],
            }),
            reference: vec![reference],
        }
    }
}

/// The continuation policy is the `heuristic`.
impl Scripted for MergeRing {
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
    /// Early, late and bypass, in either phase (a signal and a commitment are written
    /// alike).
    fn answer_texts(&self, seat: usize) -> Vec<String> {
        if self.phase == Phase::Done || seat >= self.cfg.agents {
            return Vec::new();
        }
        Action::ALL.iter().map(|&a| answer_text(a)).collect()
    }
}

impl Inspect for MergeRing {
    /// As in the baseline table: no collision and better than always bypassing.
    fn won(&self, seat: usize) -> bool {
        if seat >= self.cfg.agents {
            return false;
        }
        let t = self.tally(seat);
        t.collisions == 0 && t.mean() > self.cfg.rewards.bypass + 1e-9
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
    /// docs/environments.md's baseline table: every policy against every pool, `episodes`
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

/// The registry constructor.
pub fn factory(options: &Options) -> anyhow::Result<Box<dyn EnvFactory>> {
    Ok(Box::new(MergeRingFactory::from_options(options)?))
}

impl EnvFactory for MergeRingFactory {
    fn resolved_options(&self) -> Option<serde_json::Value> {
        serde_json::to_value(self.cfg.as_ref()).ok()
    }
    fn name(&self) -> &'static str {
        NAME
    }
    fn reset(&self, seed: u64) -> Box<dyn Environment> {
        Box::new(self.session(seed))
    }
    fn tools(&self) -> Option<&dyn Tools> {
        Some(self)
    }
}

/// The generic benchmark (through the traits) is used: no `bench` fast path.
impl Tools for MergeRingFactory {
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
             (0), reward_early, reward_late, reward_bypass, reward_collision, prompt \
             (full|compact: the same facts in about half the tokens).\n\
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
            level: None,
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

//! `countdown`: TinyZero's Countdown task. Reach a target from given numbers with
//! `+ - * /`, each number used exactly once.
//!
//! # Puzzles
//! `numbers` numbers (3..=6, default 4), each uniform in 1..=`max_number` (default
//! 99), and a target in 1..=`max_target` (default 100). The generator draws the
//! numbers, then a random expression tree over all of them, evaluates it in exact
//! rationals and keeps the pair only if the value is an integer in range (else it
//! redraws from the same RNG), so every puzzle has a solution. See [`puzzle`].
//!
//! # Train / held-out split
//! A puzzle is held-out iff the low bit of a stable hash of its canonical form (sorted
//! numbers, target) is 1 ([`Puzzle::held_out`]). `reset(seed)` with
//! [`crate::envs::HELD_OUT_BIT`] set draws until it gets a held-out puzzle, any other
//! seed until it gets a training one, so `training_seed` and `eval_seed` episodes never
//! share a puzzle (not only never share a seed).
//!
//! # Episode and reward
//! One seat (0, the policy), one step: the completion. [`check_answer`] reads the last
//! `<answer>` span (its doc comment has the exact rules). Components: `format` (1 if
//! the answer parsed as an expression), `correct` (1 if it uses exactly the puzzle's
//! numbers and equals the target), `win` (= correct). Scalar (TinyZero's scheme): 1.0
//! correct, 0.1 parsed but wrong, 0.0 otherwise; it is also the step reward. `valid` is
//! `format`; the feedback says why an answer did not parse.
//!
//! # Prompts
//! A system and a user message. `prompt = "think"` (default) is TinyZero's wording
//! (reasoning in `<think> </think>`, the equation in `<answer> </answer>`); `"direct"`
//! asks for the equation only, for short completions.
//!
//! # Scripted policies
//! `solver` (exhaustive search; the continuation policy), `random` (a random
//! expression over all the numbers, drawn from the episode's RNG: format 1, rarely
//! correct, a warm start for the format alone), `sum` (all the numbers added).
//!
//! # Layout
//! `mod.rs`: the factory and [`Tools`]; [`episode`]: the environment and its
//! capabilities; [`config`]: options; [`puzzle`]: generator, split and solver;
//! [`check`]: the answer checker; [`expr`]: expression trees; [`rat`]: exact rationals.

pub mod check;
pub mod config;
pub mod episode;
pub mod expr;
pub mod puzzle;
pub mod rat;
#[cfg(test)]
mod tests;

pub use check::{check_answer, Verdict};
pub use config::{Config, PromptStyle};
pub use episode::Countdown;
pub use puzzle::Puzzle;

use super::{wilson_ci, BaselineRow, EnvFactory, Environment, Inspect, Options, Scripted, Tools};
use anyhow::bail;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Registry name.
pub const NAME: &str = "countdown";

/// The scripted policies.
pub const POLICY_NAMES: [&str; 3] = ["solver", "random", "sum"];

/// There are no opponents: one pool.
pub const POOLS: [&str; 1] = ["default"];

/// Creates countdown episodes.
#[derive(Debug, Clone)]
pub struct CountdownFactory {
    cfg: Arc<Config>,
}

impl CountdownFactory {
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
    /// An episode as its concrete type.
    pub fn episode(&self, seed: u64) -> Countdown {
        Countdown::new(self.cfg.clone(), seed)
    }
}

/// The registry constructor.
pub fn factory(options: &Options) -> anyhow::Result<Box<dyn EnvFactory>> {
    Ok(Box::new(CountdownFactory::from_options(options)?))
}

impl EnvFactory for CountdownFactory {
    fn resolved_options(&self) -> Option<serde_json::Value> {
        serde_json::to_value(self.cfg.as_ref()).ok()
    }
    fn name(&self) -> &'static str {
        NAME
    }
    fn reset(&self, seed: u64) -> Box<dyn Environment> {
        Box::new(self.episode(seed))
    }
    fn tools(&self) -> Option<&dyn Tools> {
        Some(self)
    }
}

/// The generic benchmark (through the traits) is used: no `bench` fast path.
impl Tools for CountdownFactory {
    fn describe(&self) -> String {
        let c = &self.cfg;
        format!(
            "countdown: TinyZero's Countdown task. Given {n} numbers (each in 1..={mn}) and a \
             target (in 1..={mt}), write an equation with + - * / and parentheses that uses \
             every number exactly once and equals the target. Every puzzle is solvable (it is \
             generated from a random expression over its numbers). One seat, one step.\n\
             Answer: the last <answer> ... </answer> span is checked (unclosed: to the end of \
             the text); a trailing `= N` is ignored; − × · ÷ are read as - * * /; no unary \
             minus; evaluated in exact rationals.\n\
             Reward (TinyZero's scheme): 1.0 correct, 0.1 a well-formed but wrong equation, \
             0.0 no parsable answer; components format, correct, win (= correct).\n\
             Split: a puzzle is held out iff a hash of its sorted numbers and target has low \
             bit 1; held-out seeds draw only held-out puzzles, training seeds only the others.\n\
             Policies: {policies} (solver is the continuation policy). Pools: {pools}.\n\
             Options: numbers (3..=6, default 4), max_number (10..=10000, default 99), \
             max_target (10..=1000000, default 100), prompt (think|direct: TinyZero's \
             <think> prompt, or the equation only). Current prompt: {prompt:?}.",
            n = c.numbers,
            mn = c.max_number,
            mt = c.max_target,
            policies = POLICY_NAMES.join(", "),
            pools = POOLS.join(", "),
            prompt = c.prompt,
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
        if !POLICY_NAMES.contains(&policy) {
            bail!(
                "unknown countdown policy `{policy}`; known: {}",
                POLICY_NAMES.join(", ")
            );
        }
        if !POOLS.contains(&pool) {
            bail!(
                "unknown countdown pool `{pool}`; known: {}",
                POOLS.join(", ")
            );
        }
        let (mut wins, mut formats, mut reward_sum) = (0usize, 0usize, 0.0);
        for s in 0..episodes {
            let mut env = self.episode(first_seed.wrapping_add(s as u64));
            let text = env.policy_action(policy, episode::SEAT)?;
            let out = env.step(&[text])?;
            formats += usize::from(out.all_valid());
            wins += usize::from(env.won(episode::SEAT));
            reward_sum += env.reward(episode::SEAT).scalar;
        }
        let n = episodes.max(1) as f64;
        let extra = BTreeMap::from([("format_rate".to_string(), formats as f64 / n)]);
        Ok(BaselineRow {
            level: None,
            policy: policy.to_string(),
            peers: pool.to_string(),
            episodes,
            win_rate: wins as f64 / n,
            win_ci: wilson_ci(wins, episodes),
            mean_reward: reward_sum / n,
            extra,
        })
    }
}

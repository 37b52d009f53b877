//! The contract every embedded environment implements, its optional capabilities, and
//! the registry.
//!
//! An environment is a multi-agent text game. The trained policy holds one or more
//! seats; every other seat is scripted. Each policy seat sees its own observation as
//! chat messages and answers with free text, which the environment parses into an
//! action (malformed text becomes a documented default action, never a panic).
//!
//! # The core contract ([`Environment`])
//! Small enough to serve over a socket (one instance per connection):
//! - **text in, text out**: [`Environment::observation`] gives a seat's prompt as chat
//!   messages; [`Environment::step`] takes one raw text per seat in
//!   [`Environment::to_act`], in that order;
//! - **whose turn**: `to_act()` names the seats that must answer in the next `step`. In a
//!   simultaneous game it is every policy seat still acting; in a sequential game, the
//!   one seat on the move. Scripted seats act by themselves inside `step`. It is empty
//!   once [`Environment::done`];
//! - **per-step outcome**: `step` returns a [`StepOutcome`]: for every seat that acted,
//!   its step reward, whether its text parsed to a valid action, and feedback text (why
//!   an answer was invalid and what was played instead). Environments with a terminal
//!   reward only report 0.0 until the last step; each documents its step rewards;
//! - **rewards**: [`Environment::reward`] gives a seat's named components plus the GRPO
//!   scalar (final once done);
//! - **seeded**: the factory's `reset(seed)` always gives the same episode, and the
//!   environment owns its RNG (no global state);
//! - **never panics** on any text; wrong *numbers* of texts are an `Err`;
//! - **clone and replay**: [`Environment::clone_box`] forks the episode (RNG included);
//!   every [`Environment::transcript`] carries `"seed"` and `"steps"` (one array of texts
//!   per `step`) and [`replay`] rebuilds the episode from them.
//!
//! ```ignore
//! # use concord::envs::*;
//! let factory = create("ticketmelt", &Options::new())?;
//! let mut env = factory.reset(42);
//! while !env.done() {
//!     let texts: Vec<String> = env.to_act().iter().map(|&s| my_model(&env.observation(s))).collect();
//!     let out = env.step(&texts)?;          // out.rewards / out.valid / out.feedback per acting seat
//! }
//! let r = env.reward(0);                    // r.scalar for GRPO, r.components for logging
//! ```
//!
//! # Optional capabilities
//! Beyond the core, an environment may offer (discovered through `as_*` accessors that
//! default to `None`; convenience methods on `dyn Environment` / `dyn EnvFactory` use
//! them and degrade gracefully):
//! - [`Scripted`]: scripted policies for its seats (the continuation policy used to
//!   finish episodes when scoring a decision, named baseline policies, a fast rollout);
//! - [`Inspect`]: the win rule of the baseline tables and a readable state;
//! - [`Tools`] (on the factory): `describe`, the names of policies and opponent pools,
//!   baselines and a fast benchmark, for `concord envs` (see [`tools`]).
//!
//! # Single-decision training (what the trainer uses)
//! ```ignore
//! # use concord::envs::*;
//! let factory = create("ticketmelt", &Options::new()).unwrap();
//! let d = sample_decision(factory.as_ref(), 42);      // one seat at one state
//! // prompt = chat template of d.messages; sample G completions, then for each:
//! let r = score_decision(&d, r#"{"channel_msg":"B","commitment":"DEPLOY_PROD_B"}"#);
//! let _scalar = r.scalar; // GRPO reward; r.components for logging
//! ```
//! [`sample_decision`] resets the episode with `seed`, rolls a seeded-random number of
//! rounds with the continuation policy (never to the end), and picks one policy seat
//! (preferring seats that still have something to decide, see
//! [`Scripted::seat_active`]); everything is a pure function of the seed.
//! [`score_decision`] forks the decision's episode, plays the completion for that seat
//! and the continuation policy for the other policy seats, rolls to the end with the
//! continuation policy and returns that seat's reward. [`score_joint`] does the same for
//! several seats at once (self-play, where every seat's completion trains). Both need
//! the [`Scripted`] capability. [`score_decisions_with`] plays the rest of each episode
//! with a given policy instead (`[env] continue_with = "model"`: the model being
//! trained, so a decision is worth what the model itself makes of it).
//!
//! # Whole-episode (multi-turn) training
//! The core contract serves it: `reset(seed)`; then while `!done()`, for every seat in
//! `to_act()` take `observation(seat)` (the first turn uses system + user; later turns
//! append the model's previous answer as an assistant message and the new user message,
//! i.e. the last element of `observation(seat)`, see `turn_message`), generate, and
//! `step` with one text per acting seat; `StepOutcome::feedback` may be shown to the
//! model next turn; finally `reward(seat)`. Environment turns carry loss mask 0.
//! [`play_episode`] drives this loop for any action source.
//!
//! # Registry
//! [`REGISTRY`] is one table of [`EnvEntry`] rows (name, summary, constructor);
//! [`create`], [`names`] and `concord envs list` all read it.

pub mod batch;
pub mod behaviour;
pub mod contest;
pub mod countdown;
pub mod dataset;
pub mod merge_ring;
pub mod postmortem;
pub mod remote;
pub mod rollout;
pub mod ticketmelt;
pub mod tools;
pub mod whispers;

pub use behaviour::{Behaviour, BehaviourSummary, DecisionRecord, DecisionView, Recorder};
pub use contest::{Contest, ContestRule};
pub use rollout::{
    eval_seed, play_episode, replay, sample_decision, sample_decisions_with, score_decision,
    score_decisions_with, score_joint, training_seed, try_score_decision, Decision, HELD_OUT_BIT,
};
pub use tools::{measure, wilson_ci, BaselineRow, BenchResult, Measured};

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

pub use crate::chat::Message;

/// A seat's reward: named components plus the scalar GRPO optimises.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct Reward {
    /// Component name -> value (e.g. `r1_own_service`, `collision`).
    pub components: BTreeMap<String, f64>,
    /// The scalar used by GRPO.
    pub scalar: f64,
}

/// Options given to an environment (`[env.options]` in a config); each environment
/// validates them and names unknown keys in its error.
pub type Options = toml::Table;

/// What one [`Environment::step`] did, per seat that acted. All four vectors have one
/// entry per acting seat, in the order of the `actions` given (the `to_act()` before the
/// step); all are empty when nobody acted (e.g. stepping a finished episode).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct StepOutcome {
    /// The seats the entries are about.
    pub seats: Vec<usize>,
    /// Step reward of each seat (environment-specific; see its docs).
    pub rewards: Vec<f64>,
    /// Whether the seat's text parsed to a valid action (false: a default was played).
    pub valid: Vec<bool>,
    /// Feedback for the seat: why its action was invalid and what was played instead;
    /// empty when there is nothing to say.
    pub feedback: Vec<String>,
}

impl StepOutcome {
    /// Append one seat's entry.
    pub fn push(&mut self, seat: usize, reward: f64, valid: bool, feedback: String) {
        self.seats.push(seat);
        self.rewards.push(reward);
        self.valid.push(valid);
        self.feedback.push(feedback);
    }
    /// Index of `seat`'s entry, if it acted.
    pub fn position(&self, seat: usize) -> Option<usize> {
        self.seats.iter().position(|&s| s == seat)
    }
    /// Whether every acting seat's text was valid.
    pub fn all_valid(&self) -> bool {
        self.valid.iter().all(|&v| v)
    }
}

/// A running episode: the core contract (see the module docs).
pub trait Environment: Send {
    /// Registry name of the environment.
    fn name(&self) -> &'static str;
    /// Total number of seats (policy and scripted).
    fn num_seats(&self) -> usize;
    /// Seats the policy holds, ascending. Self-play holds all of them.
    fn policy_seats(&self) -> Vec<usize>;
    /// The seats that must submit a text in the next `step`, in the order `step` takes
    /// them; empty once done.
    fn to_act(&self) -> Vec<usize>;
    /// What `seat` sees now, as chat messages (system + user).
    fn observation(&self, seat: usize) -> Vec<Message>;
    /// Play one move. `actions[i]` is the raw text of seat `to_act()[i]`; scripted seats
    /// act themselves. Never panics on any text; a wrong number of texts is an error.
    fn step(&mut self, actions: &[String]) -> anyhow::Result<StepOutcome>;
    /// Whether the episode is over.
    fn done(&self) -> bool;
    /// The reward of `seat` (final once `done()`).
    fn reward(&self, seat: usize) -> Reward;
    /// A serde transcript of the whole episode so far (enough to replay it: `seed` and
    /// `steps`).
    fn transcript(&self) -> serde_json::Value;
    /// An independent copy of the episode at its current state (RNG included).
    fn clone_box(&self) -> Box<dyn Environment>;

    /// The [`Scripted`] capability, if the environment has it.
    fn as_scripted(&self) -> Option<&dyn Scripted> {
        None
    }
    /// The [`Scripted`] capability, mutably (scripted moves may draw from the RNG).
    fn as_scripted_mut(&mut self) -> Option<&mut dyn Scripted> {
        None
    }
    /// The [`Inspect`] capability, if the environment has it.
    fn as_inspect(&self) -> Option<&dyn Inspect> {
        None
    }
    /// The [`Behaviour`] capability (situations and a reference policy), if any.
    fn as_behaviour(&self) -> Option<&dyn Behaviour> {
        None
    }
    /// Where `seat`'s answer `text` would be scored by an outside program that is
    /// cheaper asked for a batch at a time ([`batch::prefetch`]); `None` (default): the
    /// step scores it.
    fn reward_request(&self, seat: usize, text: &str) -> Option<batch::RewardRequest> {
        let _ = (seat, text);
        None
    }
}

/// Capability: scripted policies for the environment's seats. Used to finish episodes
/// when scoring a single decision (with [`Environment::clone_box`] as the fork), by
/// `concord envs play --policy` and by baselines.
pub trait Scripted: Environment {
    /// The text the continuation policy would play for policy seat `seat` now.
    fn continuation_action(&mut self, seat: usize) -> String;
    /// The text scripted policy `policy` (a name from [`Tools::policies`]) plays for
    /// `seat` now.
    fn policy_action(&mut self, policy: &str, seat: usize) -> anyhow::Result<String>;
    /// Whether `seat` still has a meaningful decision to take (e.g. its own task is not
    /// finished). [`sample_decision`] prefers active seats. Default: always.
    fn seat_active(&self, seat: usize) -> bool {
        let _ = seat;
        true
    }
    /// The text of every legal action `seat` can take now, written as the scripted
    /// policies write it; what `[env] contested` plays to judge whether a decision's
    /// action matters. Default: empty (the environment cannot list its actions).
    fn answer_texts(&self, seat: usize) -> Vec<String> {
        let _ = seat;
        Vec::new()
    }
    /// The steps the continuation policy would play from here to the end, where the
    /// environment knows without playing them (a dataset row: one, and its reward
    /// program is not asked); `None` (default): [`sample_decision`] plays a copy.
    fn continuation_len(&self) -> Option<usize> {
        None
    }
    /// Play to the end with the continuation policy in every acting seat.
    fn rollout(&mut self) {
        while !self.done() {
            let actions: Vec<String> = self
                .to_act()
                .into_iter()
                .map(|s| self.continuation_action(s))
                .collect();
            if self.step(&actions).is_err() {
                break;
            }
        }
    }
}

/// Capability: reading an episode as people and baseline tables do.
pub trait Inspect: Environment {
    /// Whether `seat` won the (finished) episode; what the baseline tables and `eval`
    /// count. Default: a `win` reward component of at least 0.5.
    fn won(&self, seat: usize) -> bool {
        win_component(&self.reward(seat))
    }
    /// A human-readable view of the public state (for `concord envs play`). Default:
    /// the pretty-printed transcript.
    fn render_state(&self) -> String {
        serde_json::to_string_pretty(&self.transcript()).unwrap_or_default()
    }
}

/// Whether a step failed outside the environment's rules: a reward program that
/// failed, or a lost OpenEnv server. The trainer stops with a checkpoint on these
/// rather than score the answers.
pub fn is_lost(e: &anyhow::Error) -> bool {
    e.chain()
        .any(|c| c.is::<dataset::program::ProgramFailed>() || c.is::<remote::ConnectionLost>())
}

/// The default win rule: a `win` component of at least 0.5.
pub fn win_component(r: &Reward) -> bool {
    r.components.get("win").is_some_and(|w| *w >= 0.5)
}

/// Convenience over the optional capabilities, for any episode.
impl<'a> dyn Environment + 'a {
    /// [`Scripted::continuation_action`]; an empty text (which every environment parses
    /// to its default action) without the capability.
    pub fn continuation_action(&mut self, seat: usize) -> String {
        self.as_scripted_mut()
            .map(|s| s.continuation_action(seat))
            .unwrap_or_default()
    }
    /// [`Scripted::policy_action`]; an error without the capability.
    pub fn policy_action(&mut self, policy: &str, seat: usize) -> anyhow::Result<String> {
        let name = self.name();
        match self.as_scripted_mut() {
            Some(s) => s.policy_action(policy, seat),
            None => anyhow::bail!("environment `{name}` has no scripted policies"),
        }
    }
    /// [`Scripted::seat_active`]; always true without the capability.
    pub fn seat_active(&self, seat: usize) -> bool {
        self.as_scripted().is_none_or(|s| s.seat_active(seat))
    }
    /// [`Scripted::rollout`]; nothing without the capability.
    pub fn rollout(&mut self) {
        if let Some(s) = self.as_scripted_mut() {
            s.rollout();
        }
    }
    /// [`Inspect::won`]; [`win_component`] without the capability.
    pub fn won(&self, seat: usize) -> bool {
        match self.as_inspect() {
            Some(i) => i.won(seat),
            None => win_component(&self.reward(seat)),
        }
    }
    /// [`Inspect::render_state`]; the pretty-printed transcript without the capability.
    pub fn render_state(&self) -> String {
        match self.as_inspect() {
            Some(i) => i.render_state(),
            None => serde_json::to_string_pretty(&self.transcript()).unwrap_or_default(),
        }
    }
    /// The message to append for `seat`'s next turn in a multi-turn conversation: the
    /// last message of [`Environment::observation`].
    pub fn turn_message(&self, seat: usize) -> Message {
        self.observation(seat)
            .pop()
            .unwrap_or_else(|| Message::user(""))
    }
}

/// Creates episodes of one configured environment.
pub trait EnvFactory: Send + Sync {
    /// Registry name.
    fn name(&self) -> &'static str;
    /// A new episode; the same seed always gives the same episode.
    fn reset(&self, seed: u64) -> Box<dyn Environment>;
    /// [`EnvFactory::reset`] for factories that can fail (a remote server may be
    /// unreachable): the trainer calls this one. Default: `reset` never fails.
    fn try_reset(&self, seed: u64) -> anyhow::Result<Box<dyn Environment>> {
        Ok(self.reset(seed))
    }
    /// The [`Tools`] capability, if the environment has it.
    fn tools(&self) -> Option<&dyn Tools> {
        None
    }
    /// Whether its episodes have the [`Scripted`] capability, which draws and finishes
    /// decisions ([`sample_decision`]); without it (a remote server) the model does
    /// both ([`sample_decisions_with`], [`score_decisions_with`]).
    fn scripted(&self) -> bool {
        true
    }
    /// Every reward component its episodes report (the log's columns), where the
    /// factory knows them without playing; `None` (default): the trainer scores an
    /// empty answer to a sampled decision to find them.
    fn component_names(&self) -> Option<Vec<String>> {
        None
    }
    /// Every option with the value this factory plays with, defaults filled in: what
    /// `concord eval --against` compares, so that two reports of different games are
    /// never shown side by side. `None` (default): unknown, not compared.
    fn resolved_options(&self) -> Option<serde_json::Value> {
        None
    }
}

/// Capability of a factory: what `concord envs` offers beyond playing.
pub trait Tools {
    /// Rules, actions, rewards and options, for `concord envs describe`.
    fn describe(&self) -> String;
    /// Names of the scripted policies a policy seat can be played by.
    fn policies(&self) -> Vec<&'static str>;
    /// Names of the opponent pools (or regimes) baselines are reported against.
    fn pools(&self) -> Vec<&'static str>;
    /// Play `episodes` episodes (seeds `first_seed..`) with `policy` in every policy
    /// seat against `pool`, and summarise them.
    fn baseline(
        &self,
        policy: &str,
        pool: &str,
        episodes: usize,
        first_seed: u64,
    ) -> anyhow::Result<BaselineRow>;
    /// Single-threaded throughput through the environment's fast path, each half
    /// measured for at least `min_secs` (see [`measure`]). Default: `None`, and
    /// [`tools::factory_bench`] measures generically through the traits.
    fn bench(&self, min_secs: f64) -> Option<BenchResult> {
        let _ = min_secs;
        None
    }
}

/// Convenience over the optional [`Tools`] capability.
impl<'a> dyn EnvFactory + 'a {
    /// [`Tools::describe`]; a one-line note without the capability.
    pub fn describe(&self) -> String {
        match self.tools() {
            Some(t) => t.describe(),
            None => format!("{}: no description", self.name()),
        }
    }
    /// [`Tools::policies`]; none without the capability.
    pub fn policies(&self) -> Vec<&'static str> {
        self.tools().map(|t| t.policies()).unwrap_or_default()
    }
    /// [`Tools::pools`]; none without the capability.
    pub fn pools(&self) -> Vec<&'static str> {
        self.tools().map(|t| t.pools()).unwrap_or_default()
    }
    /// [`Tools::baseline`]; an error without the capability.
    pub fn baseline(
        &self,
        policy: &str,
        pool: &str,
        episodes: usize,
        first_seed: u64,
    ) -> anyhow::Result<BaselineRow> {
        match self.tools() {
            Some(t) => t.baseline(policy, pool, episodes, first_seed),
            None => anyhow::bail!("environment `{}` has no baselines", self.name()),
        }
    }
    /// The fast benchmark of [`Tools::bench`], else the generic one ([`tools::generic_bench`]).
    pub fn bench(&self, min_secs: f64) -> Option<BenchResult> {
        tools::factory_bench(self, min_secs)
    }
}

// -------------------------------------------------------------------------------------
// The registry.

/// Builds a configured factory from options.
pub type Constructor = fn(&Options) -> anyhow::Result<Box<dyn EnvFactory>>;

/// One registry row.
pub struct EnvEntry {
    pub name: &'static str,
    /// One line for `concord envs list`.
    pub summary: &'static str,
    /// None for environments that are registered but not built into this version.
    pub create: Option<Constructor>,
    /// Options that name files or directories (a dataset's `path`; `reward.dir`, an
    /// option inside a table): a config resolves them like its own path keys, and a
    /// run's recorded config writes them relative to the run. `key=default` gives the
    /// key a default (resolved like a written one) where its table is there without it.
    pub path_options: &'static [&'static str],
}

impl EnvEntry {
    /// Whether this version can create the environment.
    pub fn built(&self) -> bool {
        self.create.is_some()
    }
}

/// Every environment, built or planned: the one list `create`, `names` and
/// `concord envs list` derive from.
pub static REGISTRY: &[EnvEntry] = &[
    EnvEntry {
        name: ticketmelt::NAME,
        summary: "four engineers deploy fixes to two shared prod servers",
        create: Some(ticketmelt::factory),
        path_options: &[],
    },
    EnvEntry {
        name: merge_ring::NAME,
        summary: "vehicles on a ring signal, then commit to merge slots",
        create: Some(merge_ring::factory),
        path_options: &[],
    },
    EnvEntry {
        name: postmortem::NAME,
        summary: "write an incident post-mortem from logs and Slack",
        create: Some(postmortem::factory),
        path_options: &[],
    },
    EnvEntry {
        name: whispers::NAME,
        summary: "information triage among witnesses, relays and liars",
        create: Some(whispers::factory),
        path_options: &[],
    },
    EnvEntry {
        name: countdown::NAME,
        summary: "reach a target from given numbers with + - × ÷ (TinyZero's task)",
        create: Some(countdown::factory),
        path_options: &[],
    },
    EnvEntry {
        name: dataset::NAME,
        summary: "your prompts (JSONL) with verifiable answers, scored by verifiers",
        create: Some(dataset::factory),
        path_options: &["path", "reward.dir=."],
    },
];

/// Environments a program built on this library adds to [`REGISTRY`] ([`register`]).
static REGISTERED: std::sync::RwLock<Vec<&'static EnvEntry>> = std::sync::RwLock::new(Vec::new());

/// Add an environment to the registry, for a program that builds its own `concord`
/// binary around environments of its own (`concord::cli::main_with`, the example in
/// `examples/own-env/`): every command then finds it by name, as it finds the built-in
/// ones. An error when the name is taken or empty.
pub fn register(entry: EnvEntry) -> anyhow::Result<()> {
    anyhow::ensure!(
        !entry.name.is_empty() && !entry.name.contains(char::is_whitespace),
        "an environment name must be a non-empty word, got `{}`",
        entry.name
    );
    let mut added = REGISTERED.write().unwrap_or_else(|p| p.into_inner());
    anyhow::ensure!(
        REGISTRY
            .iter()
            .chain(added.iter().copied())
            .all(|e| e.name != entry.name),
        "environment `{}` is registered already",
        entry.name
    );
    // registered once per process, at start: a leak of a few words each
    added.push(Box::leak(Box::new(entry)));
    Ok(())
}

/// Every registry row: the built-in ones, then the [`register`]ed ones.
pub fn entries() -> Vec<&'static EnvEntry> {
    let added = REGISTERED.read().unwrap_or_else(|p| p.into_inner());
    REGISTRY.iter().chain(added.iter().copied()).collect()
}

/// Every registered name, in registry order.
pub fn names() -> Vec<&'static str> {
    entries().into_iter().map(|e| e.name).collect()
}

/// The registry row of `name`.
pub fn entry(name: &str) -> Option<&'static EnvEntry> {
    entries().into_iter().find(|e| e.name == name)
}

/// The options of environment `name` that name files ([`EnvEntry::path_options`]).
pub fn path_options(name: &str) -> &'static [&'static str] {
    entry(name).map_or(&[], |e| e.path_options)
}

/// Build the factory for a registry name with its options.
pub fn create(name: &str, options: &Options) -> anyhow::Result<Box<dyn EnvFactory>> {
    match entry(name) {
        Some(EnvEntry {
            create: Some(make), ..
        }) => make(options),
        Some(_) => {
            anyhow::bail!("environment `{name}` is registered but not built into this version yet")
        }
        None => anyhow::bail!(
            "unknown environment `{name}`; known: {}",
            names().join(", ")
        ),
    }
}

/// A `(name, value)` table (scripted policies, opponent pools): the value called
/// `name`, or an error naming `what` and listing the known names.
pub fn by_name<T: Copy>(table: &[(&'static str, T)], what: &str, name: &str) -> anyhow::Result<T> {
    table
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, v)| *v)
        .ok_or_else(|| {
            let known: Vec<&str> = table.iter().map(|(n, _)| *n).collect();
            anyhow::anyhow!("unknown {what} `{name}`; known: {}", known.join(", "))
        })
}

/// The name of `value` in a `(name, value)` table (`?` when absent).
pub fn name_in<T: PartialEq>(table: &[(&'static str, T)], value: &T) -> &'static str {
    table
        .iter()
        .find(|(_, v)| v == value)
        .map_or("?", |(n, _)| n)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Play `seed` with `text(step, seat)` for every acting seat; check the contract's
    /// per-step outcome and return (summed step rewards, final rewards) per policy seat.
    fn play_checked(
        f: &dyn EnvFactory,
        seed: u64,
        text: impl Fn(usize, usize) -> String,
        is_valid: impl Fn(&str) -> bool,
    ) -> Vec<(f64, f64)> {
        let mut env = f.reset(seed);
        let seats = env.policy_seats();
        let mut sums = vec![0.0; env.num_seats()];
        let mut step = 0;
        while !env.done() {
            let acting = env.to_act();
            assert_eq!(acting, seats, "simultaneous games: every policy seat acts");
            let texts: Vec<String> = acting.iter().map(|&s| text(step, s)).collect();
            let out = env.step(&texts).unwrap();
            assert_eq!(out.seats, acting);
            assert_eq!(out.rewards.len(), acting.len());
            for (i, t) in texts.iter().enumerate() {
                assert_eq!(out.valid[i], is_valid(t), "{t:?}");
                assert_eq!(
                    out.feedback[i].is_empty(),
                    out.valid[i],
                    "{:?}",
                    out.feedback[i]
                );
                sums[out.seats[i]] += out.rewards[i];
            }
            step += 1;
        }
        assert!(env.to_act().is_empty());
        seats
            .iter()
            .map(|&s| (sums[s], env.reward(s).scalar))
            .collect()
    }

    #[test]
    fn ticketmelt_step_outcomes() {
        for pool in ["mixed", "self_play"] {
            let mut o = Options::new();
            o.insert("peers".into(), pool.into());
            o.insert("reward".into(), "weighted".into());
            o.insert("malformed_zero".into(), false.into());
            let f = create("ticketmelt", &o).unwrap();
            let texts = [
                r#"{"commitment":"DEPLOY_PROD_B"}"#,
                "DEPLOY_PROD_A please",
                r#"{"commitment":"MONITOR","channel_msg":"x"}"#,
                r#"{"commitment":"DEPLOY_PROD_A|DEPLOY_PROD_B|MONITOR"}"#,
                "",
            ];
            for seed in 0..30 {
                let got = play_checked(
                    f.as_ref(),
                    seed,
                    |step, seat| texts[(step + seat + seed as usize) % texts.len()].to_string(),
                    |t| ticketmelt::parse_action(t).format_ok,
                );
                for (sum, scalar) in got {
                    assert_eq!(sum, scalar, "terminal step reward is the scalar");
                }
            }
        }
    }

    #[test]
    fn merge_ring_step_outcomes() {
        let mut o = Options::new();
        o.insert("self_play".into(), true.into());
        let f = create("merge_ring", &o).unwrap();
        let texts = [
            "ACTION: early",
            "late",
            "??",
            "early or late",
            "ACTION: bypass",
        ];
        for seed in 0..30 {
            let got = play_checked(
                f.as_ref(),
                seed,
                |step, seat| texts[(step * 3 + seat + seed as usize) % texts.len()].to_string(),
                |t| merge_ring::parse_action(t).1 != merge_ring::ParseOutcome::Default,
            );
            for (sum, scalar) in got {
                assert!((sum - scalar).abs() < 1e-9, "{sum} vs {scalar}");
            }
        }
    }

    #[test]
    fn registry_is_one_table() {
        assert_eq!(
            names(),
            [
                "ticketmelt",
                "merge_ring",
                "postmortem",
                "whispers",
                "countdown",
                "dataset"
            ]
        );
        for e in REGISTRY.iter().filter(|e| e.name != dataset::NAME) {
            match create(e.name, &Options::new()) {
                Ok(f) => {
                    assert!(e.built());
                    assert_eq!(f.name(), e.name);
                    assert_eq!(f.reset(0).name(), e.name);
                }
                Err(err) => {
                    assert!(!e.built());
                    assert!(err.to_string().contains("not built"), "{err}");
                }
            }
        }
        // a dataset has nothing to play without its file
        let err = create("dataset", &Options::new())
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("`path` is required"), "{err}");
        let err = create("nope", &Options::new()).err().unwrap().to_string();
        assert!(err.contains("known: ticketmelt, merge_ring"), "{err}");
        assert_eq!(tools::list().lines().count(), REGISTRY.len());
    }
}

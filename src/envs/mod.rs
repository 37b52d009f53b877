//! The contract every embedded environment implements, and the registry.
//!
//! An environment is a multi-agent text game. The trained policy holds one or more
//! seats; every other seat is scripted. Each policy seat sees its own observation as
//! chat messages and answers with free text, which the environment parses into an
//! action (malformed text becomes a documented default action, never a panic).
//! Simultaneous moves are resolved together in [`Environment::step`].
//!
//! GRPO trains on *decisions*: a prompt is one policy seat's observation at one state.
//! [`Environment::continuation_action`] supplies the scripted action used for the other
//! policy seats and for the rest of the episode, so one completion can be scored by
//! rolling the episode out to the end.
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
//! [`Environment::seat_active`]); everything is a pure function of the seed.
//! [`score_decision`] clones the decision's episode, plays the completion for that seat
//! and the continuation policy for the other policy seats, rolls to the end with the
//! continuation policy and returns that seat's reward. [`score_joint`] does the same for
//! several seats at once (self-play, where every seat's completion trains).
//!
//! # Whole-episode (multi-turn) training
//! The same trait serves it: `reset(seed)`; then while `!done()`, for every policy seat
//! take `observation(seat)` (the first turn uses system + user; later turns append the
//! model's previous answer as an assistant message and the new user message, i.e. the
//! last element of `observation(seat)`, see [`Environment::turn_message`]), generate,
//! and `step` with one text per policy seat; finally `reward(seat)`. Environment turns
//! carry loss mask 0. [`play_episode`] drives this loop for any action source.
//!
//! # Replay
//! Every transcript carries `"seed"` and `"steps"` (one array of policy-seat texts per
//! `step`); [`replay`] resets with the seed and feeds the steps again.

pub mod cli;
pub mod merge_ring;
pub mod ticketmelt;

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

/// A running episode.
pub trait Environment: Send {
    /// Registry name of the environment.
    fn name(&self) -> &'static str;
    /// Total number of seats (policy and scripted).
    fn num_seats(&self) -> usize;
    /// Seats the policy holds, ascending. Self-play holds all of them.
    fn policy_seats(&self) -> Vec<usize>;
    /// What `seat` sees now, as chat messages (system + user).
    fn observation(&self, seat: usize) -> Vec<Message>;
    /// Resolve one simultaneous move. `actions[i]` is the raw text of policy seat
    /// `policy_seats()[i]`; scripted seats act themselves. Never panics on any text.
    fn step(&mut self, actions: &[String]) -> anyhow::Result<()>;
    /// Whether the episode is over.
    fn done(&self) -> bool;
    /// The reward of `seat` (final once `done()`).
    fn reward(&self, seat: usize) -> Reward;
    /// The text the continuation policy would play for policy seat `seat` now.
    fn continuation_action(&mut self, seat: usize) -> String;
    /// The text scripted policy `policy` (a name from [`EnvFactory::policies`]) plays
    /// for `seat` now; used by `envs play --policy` and `envs baseline`.
    fn policy_action(&mut self, policy: &str, seat: usize) -> anyhow::Result<String>;
    /// A serde transcript of the whole episode so far (enough to replay it).
    fn transcript(&self) -> serde_json::Value;
    /// An independent copy of the episode at its current state (RNG included).
    fn clone_box(&self) -> Box<dyn Environment>;

    /// Whether `seat` still has a meaningful decision to take (e.g. its own task is not
    /// finished). [`sample_decision`] prefers active seats. Default: always.
    fn seat_active(&self, seat: usize) -> bool {
        let _ = seat;
        true
    }
    /// Whether `seat` won the (finished) episode; what the baseline tables count.
    /// Default: a `win` reward component of at least 0.5.
    fn won(&self, seat: usize) -> bool {
        self.reward(seat)
            .components
            .get("win")
            .is_some_and(|w| *w >= 0.5)
    }
    /// Play to the end with the continuation policy in every policy seat.
    fn rollout(&mut self) {
        while !self.done() {
            let actions: Vec<String> = self
                .policy_seats()
                .into_iter()
                .map(|s| self.continuation_action(s))
                .collect();
            if self.step(&actions).is_err() {
                break;
            }
        }
    }
    /// The message to append for `seat`'s next turn in a multi-turn conversation
    /// (default: the last message of [`Environment::observation`]).
    fn turn_message(&self, seat: usize) -> Message {
        self.observation(seat)
            .pop()
            .unwrap_or_else(|| Message::user(""))
    }
    /// A human-readable view of the public state (for `concord envs play`).
    fn render_state(&self) -> String {
        serde_json::to_string_pretty(&self.transcript()).unwrap_or_default()
    }
}

/// Creates episodes of one configured environment.
pub trait EnvFactory: Send + Sync {
    fn name(&self) -> &'static str;
    /// A new episode; the same seed always gives the same episode.
    fn reset(&self, seed: u64) -> Box<dyn Environment>;
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
    /// Single-threaded throughput, without and with prompt rendering, each measured for
    /// at least `min_secs` (see [`measure`]). Default: generic, through the trait
    /// (continuation policy, text actions); environments override it with their fast
    /// path.
    fn bench(&self, min_secs: f64) -> Option<BenchResult> {
        let run = |render: bool| {
            let mut seed = 0u64;
            let mut sink = 0usize;
            let r = measure(min_secs, || {
                let mut env = self.reset(seed);
                seed += 1;
                while !env.done() {
                    let seats = env.policy_seats();
                    if render {
                        for &s in &seats {
                            sink += env
                                .observation(s)
                                .iter()
                                .map(|m| m.content.len())
                                .sum::<usize>();
                        }
                    }
                    let actions: Vec<String> =
                        seats.iter().map(|&s| env.continuation_action(s)).collect();
                    if env.step(&actions).is_err() {
                        break;
                    }
                }
                1
            });
            std::hint::black_box(sink);
            r
        };
        Some(BenchResult::from_runs(run(false), run(true)))
    }
}

/// Result of `concord envs bench`.
///
/// `episodes_per_s*` count episodes per second of CPU time of the benchmarking thread
/// (Linux `/proc/thread-self/schedstat`), which equals wall-clock throughput on an idle
/// core and stays meaningful on a machine shared with other jobs; `clock` says
/// `"thread_cpu"`, or `"wall"` where no thread clock exists (then both pairs agree).
/// The `wall_*` fields are plain wall-clock throughput.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchResult {
    pub episodes_per_s: f64,
    pub episodes_per_s_with_prompts: f64,
    pub wall_episodes_per_s: f64,
    pub wall_episodes_per_s_with_prompts: f64,
    pub clock: String,
}

impl BenchResult {
    /// From two [`measure`] results (without, with rendering).
    pub fn from_runs(plain: Measured, prompts: Measured) -> Self {
        BenchResult {
            episodes_per_s: plain.per_s().round(),
            episodes_per_s_with_prompts: prompts.per_s().round(),
            wall_episodes_per_s: plain.per_wall_s().round(),
            wall_episodes_per_s_with_prompts: prompts.per_wall_s().round(),
            clock: if plain.cpu_secs.is_some() {
                "thread_cpu"
            } else {
                "wall"
            }
            .to_string(),
        }
    }
}

/// Episodes counted over a timed run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Measured {
    pub episodes: u64,
    pub wall_secs: f64,
    pub cpu_secs: Option<f64>,
}

impl Measured {
    /// Episodes per CPU second of the thread (per wall second without a thread clock).
    pub fn per_s(&self) -> f64 {
        self.episodes as f64 / self.cpu_secs.unwrap_or(self.wall_secs).max(1e-9)
    }
    pub fn per_wall_s(&self) -> f64 {
        self.episodes as f64 / self.wall_secs.max(1e-9)
    }
}

/// CPU time used by the calling thread, in seconds (Linux only; `None` elsewhere).
pub fn thread_cpu_seconds() -> Option<f64> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let ns: u64 = s.split_whitespace().next()?.parse().ok()?;
    Some(ns as f64 * 1e-9)
}

/// Call `episode` (which plays one or more episodes and returns how many) until the
/// thread has used `min_secs` of CPU time (wall time without a thread clock; at most
/// 50 x `min_secs` of wall time either way). Clocks are read every 256 calls.
pub fn measure(min_secs: f64, mut episode: impl FnMut() -> u64) -> Measured {
    let t0 = std::time::Instant::now();
    let c0 = thread_cpu_seconds();
    let mut n = 0u64;
    loop {
        for _ in 0..256 {
            n += episode();
        }
        let wall = t0.elapsed().as_secs_f64();
        let cpu = c0.and_then(|c0| thread_cpu_seconds().map(|c| c - c0));
        if cpu.unwrap_or(wall) >= min_secs || wall >= 50.0 * min_secs {
            return Measured {
                episodes: n,
                wall_secs: wall,
                cpu_secs: cpu.filter(|c| *c > 0.0),
            };
        }
    }
}

/// One row of `concord envs baseline --json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BaselineRow {
    pub policy: String,
    pub peers: String,
    pub episodes: usize,
    pub win_rate: f64,
    /// 95% Wilson score interval of the win rate.
    pub win_ci: [f64; 2],
    pub mean_reward: f64,
    /// Environment-specific rates and means (e.g. `merge_rate`, `collision_rate`).
    #[serde(flatten)]
    pub extra: BTreeMap<String, f64>,
}

/// 95% Wilson score interval for `wins` successes out of `n`.
pub fn wilson_ci(wins: usize, n: usize) -> [f64; 2] {
    if n == 0 {
        return [0.0, 1.0];
    }
    let z = 1.959_963_984_540_054_f64;
    let n_f = n as f64;
    let p = wins as f64 / n_f;
    let denom = 1.0 + z * z / n_f;
    let centre = (p + z * z / (2.0 * n_f)) / denom;
    let half = z * ((p * (1.0 - p) / n_f + z * z / (4.0 * n_f * n_f)).sqrt()) / denom;
    [(centre - half).max(0.0), (centre + half).min(1.0)]
}

/// One registry entry.
pub struct EnvInfo {
    pub name: &'static str,
    pub summary: &'static str,
}

/// Every environment built into the binary.
pub const REGISTRY: &[EnvInfo] = &[
    EnvInfo {
        name: "ticketmelt",
        summary: "four engineers deploy fixes to two shared prod servers",
    },
    EnvInfo {
        name: "merge_ring",
        summary: "vehicles on a ring signal, then commit to merge slots",
    },
    EnvInfo {
        name: "postmortem",
        summary: "write an incident post-mortem from logs and Slack",
    },
    EnvInfo {
        name: "whispers",
        summary: "information triage among witnesses, relays and liars",
    },
];

/// Build the factory for a registry name with its options.
pub fn create(name: &str, options: &Options) -> anyhow::Result<Box<dyn EnvFactory>> {
    match name {
        "ticketmelt" => Ok(Box::new(ticketmelt::TicketmeltFactory::new(options)?)),
        "merge_ring" => Ok(Box::new(merge_ring::MergeRingFactory::from_options(
            options,
        )?)),
        _ if REGISTRY.iter().any(|e| e.name == name) => {
            anyhow::bail!("environment `{name}` is registered but not built into this version yet")
        }
        _ => anyhow::bail!(
            "unknown environment `{name}`; known: {}",
            REGISTRY
                .iter()
                .map(|e| e.name)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

// -------------------------------------------------------------------------------------
// Single-decision helpers.

/// One policy seat at one state: the unit GRPO trains on.
pub struct Decision {
    /// The episode at the decision point (not yet stepped for this round).
    pub env: Box<dyn Environment>,
    /// The policy seat that decides.
    pub seat: usize,
    /// Its observation (system + user): the prompt.
    pub messages: Vec<Message>,
    /// The seed that produced this decision.
    pub seed: u64,
    /// Steps played before the decision.
    pub step: usize,
}

impl Clone for Decision {
    fn clone(&self) -> Self {
        Decision {
            env: self.env.clone_box(),
            seat: self.seat,
            messages: self.messages.clone(),
            seed: self.seed,
            step: self.step,
        }
    }
}

impl std::fmt::Debug for Decision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Decision")
            .field("env", &self.env.name())
            .field("seat", &self.seat)
            .field("seed", &self.seed)
            .field("step", &self.step)
            .finish()
    }
}

/// Play one continuation step (one text per policy seat).
fn continuation_step(env: &mut dyn Environment) -> bool {
    let actions: Vec<String> = env
        .policy_seats()
        .into_iter()
        .map(|s| env.continuation_action(s))
        .collect();
    env.step(&actions).is_ok()
}

/// A decision, a pure function of `seed`: reset with `seed`, measure the continuation
/// rollout's length L on a copy, advance `k` uniform in `0..L` steps with the
/// continuation policy, and pick uniformly among the policy seats that are still
/// active (all policy seats if none is; `k = 0` if the seat list is empty there).
pub fn sample_decision(factory: &dyn EnvFactory, seed: u64) -> Decision {
    let base = factory.reset(seed);
    let mut probe = base.clone_box();
    let mut len = 0usize;
    while !probe.done() && len < 100_000 {
        if !continuation_step(probe.as_mut()) {
            break;
        }
        len += 1;
    }
    let r1 = crate::rng::splitmix64(seed ^ 0xD1B5_4A32_D192_ED03);
    let r2 = crate::rng::splitmix64(r1);
    let k = if len == 0 {
        0
    } else {
        (r1 % len as u64) as usize
    };
    let mut env = base.clone_box();
    let mut steps = 0;
    while steps < k && !env.done() {
        if !continuation_step(env.as_mut()) {
            break;
        }
        steps += 1;
    }
    let mut seats: Vec<usize> = env
        .policy_seats()
        .into_iter()
        .filter(|&s| env.seat_active(s))
        .collect();
    if seats.is_empty() {
        seats = env.policy_seats();
    }
    if seats.is_empty() || env.done() {
        env = base;
        steps = 0;
        seats = env.policy_seats();
    }
    let seat = if seats.is_empty() {
        0
    } else {
        seats[(r2 % seats.len() as u64) as usize]
    };
    let messages = env.observation(seat);
    Decision {
        env,
        seat,
        messages,
        seed,
        step: steps,
    }
}

/// Reward of `d.seat` after playing `completion` for it now (continuation policy for
/// the other policy seats and for the rest of the episode). Deterministic.
pub fn score_decision(d: &Decision, completion: &str) -> Reward {
    score_joint(d.env.as_ref(), &[(d.seat, completion)])
        .pop()
        .unwrap_or_default()
}

/// Play the given completions for the given policy seats in the current step (the
/// continuation policy for the other policy seats), roll out, and return each given
/// seat's reward, in the order given.
pub fn score_joint(env: &dyn Environment, completions: &[(usize, &str)]) -> Vec<Reward> {
    let mut env = env.clone_box();
    if !env.done() {
        let actions: Vec<String> = env
            .policy_seats()
            .into_iter()
            .map(|s| match completions.iter().find(|(seat, _)| *seat == s) {
                Some((_, text)) => text.to_string(),
                None => env.continuation_action(s),
            })
            .collect();
        if env.step(&actions).is_err() {
            let mut r = Reward::default();
            r.components.insert("error".into(), 1.0);
            return completions.iter().map(|_| r.clone()).collect();
        }
        env.rollout();
    }
    completions.iter().map(|(s, _)| env.reward(*s)).collect()
}

/// Episode seeds with this bit set are held out for evaluation: training draws its
/// episodes from seeds without it ([`training_seed`]), `concord eval` from seeds with
/// it ([`eval_seed`]), so the two never share an episode.
pub const HELD_OUT_BIT: u64 = 1 << 63;

/// A training episode seed (never a held-out one).
pub fn training_seed(x: u64) -> u64 {
    x & !HELD_OUT_BIT
}

/// The `i`-th held-out evaluation episode seed.
pub fn eval_seed(i: u64) -> u64 {
    HELD_OUT_BIT | (i & !HELD_OUT_BIT)
}

/// Play a whole episode from `seed`, asking `act(env, seat)` for every policy seat's
/// text each step; returns the finished episode.
pub fn play_episode(
    factory: &dyn EnvFactory,
    seed: u64,
    mut act: impl FnMut(&mut dyn Environment, usize) -> anyhow::Result<String>,
) -> anyhow::Result<Box<dyn Environment>> {
    let mut env = factory.reset(seed);
    let mut guard = 0;
    while !env.done() {
        let mut actions = Vec::new();
        for s in env.policy_seats() {
            actions.push(act(env.as_mut(), s)?);
        }
        env.step(&actions)?;
        guard += 1;
        anyhow::ensure!(guard < 1_000_000, "episode did not end");
    }
    Ok(env)
}

/// Rebuild an episode from a transcript's `seed` and `steps`.
pub fn replay(
    factory: &dyn EnvFactory,
    transcript: &serde_json::Value,
) -> anyhow::Result<Box<dyn Environment>> {
    let seed = transcript
        .get("seed")
        .and_then(serde_json::Value::as_u64)
        .ok_or_else(|| anyhow::anyhow!("transcript has no integer `seed`"))?;
    let steps = transcript
        .get("steps")
        .and_then(serde_json::Value::as_array)
        .ok_or_else(|| anyhow::anyhow!("transcript has no `steps` array"))?;
    let mut env = factory.reset(seed);
    for (i, step) in steps.iter().enumerate() {
        let texts: Vec<String> = step
            .as_array()
            .ok_or_else(|| anyhow::anyhow!("step {i} is not an array"))?
            .iter()
            .map(|t| {
                t.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| anyhow::anyhow!("step {i}: non-string action"))
            })
            .collect::<anyhow::Result<_>>()?;
        env.step(&texts)?;
    }
    Ok(env)
}

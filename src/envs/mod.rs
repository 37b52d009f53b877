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

pub mod cli;

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One chat message, as the chat template consumes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    pub role: String,
    pub content: String,
}

impl Message {
    pub fn system(content: impl Into<String>) -> Self {
        Self {
            role: "system".into(),
            content: content.into(),
        }
    }
    pub fn user(content: impl Into<String>) -> Self {
        Self {
            role: "user".into(),
            content: content.into(),
        }
    }
    pub fn assistant(content: impl Into<String>) -> Self {
        Self {
            role: "assistant".into(),
            content: content.into(),
        }
    }
}

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
    let _ = options;
    match name {
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

//! Session configuration: rewards, opponent regimes and the `[env.options]` keys.

use crate::envs::Options;
use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};

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

/// How prompts are written (option `prompt`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PromptStyle {
    /// Prose rules and one sentence per earlier episode.
    #[default]
    Full,
    /// Terse rules and one short line per earlier episode (same facts, about a third of
    /// the tokens); the answer options are listed without a worked example.
    Compact,
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
    /// Option `prompt`: "full" (default) or "compact".
    #[serde(default)]
    pub prompt: PromptStyle,
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
            prompt: PromptStyle::Full,
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
    "prompt",
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
                "prompt" => {
                    c.prompt = match v.as_str() {
                        Some("full") => PromptStyle::Full,
                        Some("compact") => PromptStyle::Compact,
                        _ => bail!(
                            "merge_ring option `prompt` must be \"full\" or \"compact\", got {v}"
                        ),
                    }
                }
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

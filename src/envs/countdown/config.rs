//! The `[env.options]` keys of countdown and their validation.

use crate::envs::Options;
use anyhow::bail;
use serde::{Deserialize, Serialize};

/// How the prompt asks for the answer (option `prompt`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PromptStyle {
    /// TinyZero's wording: reasoning in `<think> </think>`, then `<answer> </answer>`.
    #[default]
    Think,
    /// Only the equation in `<answer> </answer>`, no reasoning (short completions).
    Direct,
}

/// Validated options of a countdown environment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Config {
    /// Option `numbers`: how many numbers a puzzle gives, 3..=6 (default 4).
    pub numbers: usize,
    /// Option `max_number`: each number is uniform in 1..=max_number (default 99).
    pub max_number: u32,
    /// Option `max_target`: targets lie in 1..=max_target (default 100).
    pub max_target: u32,
    /// Option `prompt`: "think" (default) or "direct".
    pub prompt: PromptStyle,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            numbers: 4,
            max_number: 99,
            max_target: 100,
            prompt: PromptStyle::Think,
        }
    }
}

/// Every option key countdown accepts.
pub const OPTION_KEYS: [&str; 4] = ["numbers", "max_number", "max_target", "prompt"];

// The lower bounds keep both the training and the held-out class non-empty (with a
// handful of possible puzzles, all could hash into one class and `reset` would draw
// forever); the upper bounds keep every exact intermediate far inside i128.
const NUMBERS: (i64, i64) = (3, 6);
const MAX_NUMBER: (i64, i64) = (10, 10_000);
const MAX_TARGET: (i64, i64) = (10, 1_000_000);

fn int_in(v: &toml::Value, key: &str, (lo, hi): (i64, i64)) -> anyhow::Result<i64> {
    match v.as_integer() {
        Some(i) if (lo..=hi).contains(&i) => Ok(i),
        _ => bail!("countdown option `{key}` must be an integer in {lo}..={hi}, got {v}"),
    }
}

impl Config {
    /// Parse and validate `[env.options]`; unknown keys and bad values are errors that
    /// name the key.
    pub fn from_options(options: &Options) -> anyhow::Result<Config> {
        let mut c = Config::default();
        for (key, v) in options {
            match key.as_str() {
                "numbers" => c.numbers = int_in(v, key, NUMBERS)? as usize,
                "max_number" => c.max_number = int_in(v, key, MAX_NUMBER)? as u32,
                "max_target" => c.max_target = int_in(v, key, MAX_TARGET)? as u32,
                "prompt" => {
                    c.prompt = match v.as_str() {
                        Some("think") => PromptStyle::Think,
                        Some("direct") => PromptStyle::Direct,
                        _ => bail!(
                            "countdown option `prompt` must be \"think\" or \"direct\", got {v}"
                        ),
                    }
                }
                other => bail!(
                    "unknown countdown option `{other}`; known options: {}",
                    OPTION_KEYS.join(", ")
                ),
            }
        }
        c.validate()?;
        Ok(c)
    }

    /// The same bounds as [`Config::from_options`], for configs built in code.
    pub fn validate(&self) -> anyhow::Result<()> {
        let checks = [
            ("numbers", self.numbers as i64, NUMBERS),
            ("max_number", i64::from(self.max_number), MAX_NUMBER),
            ("max_target", i64::from(self.max_target), MAX_TARGET),
        ];
        for (key, x, (lo, hi)) in checks {
            if !(lo..=hi).contains(&x) {
                bail!("countdown option `{key}` must be in {lo}..={hi}, got {x}");
            }
        }
        Ok(())
    }
}

//! `[sft]`: supervised fine-tuning (`concord sft`, or a warm start before GRPO with
//! `warm_start = true`). Where the demonstrations come from and how long to train; the
//! model, LoRA, optimizer and run keys are the shared `[model]`, `[lora]`, `[optim]` and
//! `[run]` sections, so one file can hold the warm start and the GRPO run after it.
//!
//! Defaults follow TRL's `SFTConfig` where it has the knob (`learning_rate` 2e-5,
//! `num_train_epochs`, `max_steps`, `per_device_train_batch_size` 8).
use super::doc::documented;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

documented! {
/// Where demonstrations come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum SftSource {
    /// A JSONL file of `{"messages": [...], "completion": "..."}` lines (`path`).
    #[default]
    Jsonl,
    /// An environment's scripted policy (`env`, `policy`): its decisions rendered as
    /// prompts, its answers as completions.
    Env,
    /// Rejection sampling: the model's own completions on an environment's decisions,
    /// kept when their reward reaches `min_reward`.
    Rejection,
}
}

documented! {
/// How an `env` source spreads its demonstrations over the decisions it draws.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum SftBalance {
    /// As the decisions come: each situation in proportion to how often it occurs.
    #[default]
    None,
    /// Stratified by the environment's behaviour-report situations: from a pool of
    /// [`BALANCE_POOL`] x `examples` drawn decisions, take one per situation in turn, so
    /// rare branches of the reference policy (TICKETMELT's opening) are as well
    /// represented as common ones until their pool runs out. Needs an environment with
    /// a behaviour report.
    Situation,
}
}

/// Decisions drawn per demonstration wanted when `balance = "situation"`.
pub const BALANCE_POOL: usize = 8;

documented! {
/// Supervised fine-tuning: where the demonstrations come from and how long to train
/// on them (`concord sft`, or `warm_start` before GRPO). The model, LoRA, optimizer
/// and run keys are `[model]`, `[lora]`, `[optim]` and `[run]`. The loss is the
/// cross-entropy of the completion tokens (plus the end-of-turn token), averaged over
/// the batch's completion tokens; prompt tokens carry none. Defaults follow TRL's
/// `SFTConfig`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SftConfig {
    /// Where the demonstrations come from.
    pub source: SftSource,
    /// The JSONL file of a `jsonl` source: one `{"messages": [{"role", "content"},
    /// ...], "completion": "..."}` per line.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<PathBuf>,
    /// Environment of `env` / `rejection` sources (default: `[env] name`, with its
    /// options unless `[sft.options]` is given).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub env: Option<String>,
    /// `[sft.options]`: options of that environment (default: `[env.options]` when it
    /// is `[env]`'s).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub options: Option<toml::Table>,
    /// The scripted policy whose answers are the demonstrations (`source = "env"`).
    pub policy: String,
    /// Demonstrations to build (`env`: one per decision; `rejection`: kept samples).
    /// Range: 1 to [`MAX_EXAMPLES`].
    pub examples: usize,
    /// `env` source: how the demonstrations spread over situations.
    pub balance: SftBalance,
    /// Rejection sampling keeps a completion that ends on a stop token with a scalar
    /// reward of at least this.
    /// Range: finite.
    pub min_reward: f64,
    /// Rejection sampling draws at most this many prompts (0: 8 x `examples`); each
    /// gets `grpo.num_generations` samples with the `[grpo]` sampling keys.
    pub max_prompts: usize,
    /// Passes over the demonstrations, unless `steps` > 0.
    /// Range: >= 1 when `steps` = 0.
    /// TRL: `num_train_epochs`.
    pub epochs: usize,
    /// Optimizer steps (0: `epochs` passes).
    /// Range: 0 to [`super::limits::MAX_STEPS`].
    /// TRL: `max_steps`.
    pub steps: usize,
    /// Demonstrations per optimizer step (`[optim] micro_batch` splits it).
    /// Range: 1 to [`super::limits::MAX_BATCH_ROWS`].
    /// TRL: `per_device_train_batch_size`.
    pub batch_size: usize,
    /// Peak learning rate of the SFT updates (`[optim]` gives every other optimizer key).
    /// Range: (0, 1].
    /// TRL: `learning_rate`.
    pub learning_rate: f64,
    /// `concord train` runs this SFT first (into `RUN_DIR/sft/`) and starts GRPO from
    /// its adapter.
    pub warm_start: bool,
    /// Stop once the mean loss of the last `stop_window` steps is at most this: a
    /// warm start that has learnt the format but not yet collapsed onto its teacher
    /// leaves GRPO groups whose completions differ. A resume refills the window from
    /// `training_log.csv`, so a stopped run stays stopped.
    /// Range: > 0.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stop_at_loss: Option<f64>,
    /// Stop once the mean token accuracy of the last `stop_window` steps reaches this.
    /// Range: (0, 1].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stop_at_token_accuracy: Option<f64>,
    /// Steps the stop rules average over.
    /// Range: 1 to [`super::limits::MAX_STEPS`].
    #[serde(skip_serializing_if = "is_default_window")]
    pub stop_window: usize,
}
}

/// Steps `stop_at_loss` and `stop_at_token_accuracy` average over by default.
pub const DEFAULT_STOP_WINDOW: usize = 8;

fn is_default_window(n: &usize) -> bool {
    *n == DEFAULT_STOP_WINDOW
}

impl Default for SftConfig {
    fn default() -> Self {
        Self {
            source: SftSource::Jsonl,
            path: None,
            env: None,
            options: None,
            policy: "random".into(),
            examples: 256,
            balance: SftBalance::None,
            min_reward: 1.0,
            max_prompts: 0,
            epochs: 3,
            steps: 0,
            batch_size: 8,
            learning_rate: 2e-5,
            warm_start: false,
            stop_at_loss: None,
            stop_at_token_accuracy: None,
            stop_window: DEFAULT_STOP_WINDOW,
        }
    }
}

/// Demonstrations an `env` / `rejection` source may ask for.
pub const MAX_EXAMPLES: usize = 1_000_000;

impl SftConfig {
    /// Range and consistency checks: `(key, message)` of the first problem.
    #[allow(clippy::neg_cmp_op_on_partial_ord)]
    pub fn check(&self, has_env: bool) -> Result<(), (&'static str, String)> {
        match self.source {
            SftSource::Jsonl if self.path.is_none() => {
                return Err((
                    "path",
                    "source = \"jsonl\" needs path = \"FILE.jsonl\"".into(),
                ))
            }
            SftSource::Env | SftSource::Rejection if self.env.is_none() && !has_env => {
                return Err((
                    "env",
                    "this source needs an environment: env = \"NAME\" (or an [env] section)".into(),
                ))
            }
            _ => {}
        }
        if self.source != SftSource::Jsonl && !(1..=MAX_EXAMPLES).contains(&self.examples) {
            return Err(("examples", format!("must be in 1..={MAX_EXAMPLES}")));
        }
        if self.balance != SftBalance::None && self.source != SftSource::Env {
            return Err((
                "balance",
                "only an `env` source can be balanced (source = \"env\")".into(),
            ));
        }
        if !self.min_reward.is_finite() {
            return Err(("min_reward", "must be a finite number".into()));
        }
        if self.steps == 0 && self.epochs == 0 {
            return Err(("epochs", "epochs or steps must be >= 1".into()));
        }
        if self.steps > super::limits::MAX_STEPS {
            return Err((
                "steps",
                format!("exceeds the limit of {}", super::limits::MAX_STEPS),
            ));
        }
        if !(1..=super::limits::MAX_BATCH_ROWS).contains(&self.batch_size) {
            return Err((
                "batch_size",
                format!("must be in 1..={}", super::limits::MAX_BATCH_ROWS),
            ));
        }
        if !(self.learning_rate > 0.0 && self.learning_rate <= 1.0) {
            return Err((
                "learning_rate",
                "must be in (0, 1] (AdamW moves a weight by about it a step)".into(),
            ));
        }
        self.check_stop()
    }

    fn check_stop(&self) -> Result<(), (&'static str, String)> {
        if let Some(l) = self.stop_at_loss {
            if !(l.is_finite() && l > 0.0) {
                return Err(("stop_at_loss", format!("{l} is not a loss > 0")));
            }
        }
        if let Some(a) = self.stop_at_token_accuracy {
            if !(a > 0.0 && a <= 1.0) {
                return Err(("stop_at_token_accuracy", format!("{a} is not in (0, 1]")));
            }
        }
        if self.stop_window == 0 || self.stop_window > super::limits::MAX_STEPS {
            return Err((
                "stop_window",
                format!("must be in 1..={}", super::limits::MAX_STEPS),
            ));
        }
        Ok(())
    }

    /// The early-stop rule, when one of its targets is set.
    pub fn stop_rule(&self) -> Option<crate::sft::stop::StopRule> {
        (self.stop_at_loss.is_some() || self.stop_at_token_accuracy.is_some()).then_some(
            crate::sft::stop::StopRule {
                loss: self.stop_at_loss,
                token_accuracy: self.stop_at_token_accuracy,
                window: self.stop_window,
            },
        )
    }

    /// Optimizer steps for `n` demonstrations: `steps`, or enough batches of
    /// `batch_size` for `epochs` passes (a batch may straddle two passes).
    pub fn total_steps(&self, n: usize) -> usize {
        if self.steps > 0 {
            self.steps
        } else {
            (self.epochs * n).div_ceil(self.batch_size.max(1))
        }
    }
}

//! `[optim]`: AdamW, the learning-rate schedule and how a batch is cut to fit memory.
use super::doc::documented;
use super::limits;
use super::locate::ValidationError;
use serde::{Deserialize, Serialize};

documented! {
/// The learning rate after the warmup.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Schedule {
    /// The peak learning rate throughout.
    Constant,
    /// Linear decay from the peak to 0 at the last step.
    #[default]
    Linear,
    /// Cosine decay from the peak to 0 at the last step.
    Cosine,
}
}

documented! {
/// AdamW, the learning-rate schedule, and how a batch is cut into micro-batches that
/// fit memory. `[sft]` takes every key but its own `learning_rate` from here.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OptimConfig {
    /// Peak learning rate (AdamW moves each weight by about this much a step).
    /// Range: (0, 1].
    /// TRL: `learning_rate`.
    pub learning_rate: f64,
    /// Global-norm gradient clipping; 0 disables it.
    /// Range: >= 0.
    /// TRL: `max_grad_norm`.
    pub max_grad_norm: f64,
    /// AdamW's decay rates of the first and second moments.
    /// Range: each in [0, 1).
    /// TRL: `adam_beta1`, `adam_beta2`.
    pub betas: [f64; 2],
    /// AdamW's epsilon.
    /// Range: > 0.
    /// TRL: `adam_epsilon`.
    pub eps: f64,
    /// AdamW's decoupled weight decay.
    /// Range: >= 0.
    /// TRL: `weight_decay`.
    pub weight_decay: f64,
    /// Steps of linear warmup from 0 to the peak learning rate.
    /// Range: at most `run.steps`.
    /// TRL: `warmup_steps`.
    pub warmup_steps: usize,
    /// The learning rate after the warmup.
    /// TRL: `lr_scheduler_type`.
    pub schedule: Schedule,
    /// At most this many sequences per forward/backward (gradient accumulation); 0: no
    /// cap (the memory budget alone cuts the batch). The update equals the full
    /// batch's for every loss type. A data-parallel run shares these micro-batches out
    /// among its processes: set it to about the step's rows over the process count.
    /// TRL: `per_device_train_batch_size` (with `gradient_accumulation_steps`).
    pub micro_batch: usize,
    /// Run each group's shared prompt through the training forward once (its keys and
    /// values, with their graph, shared by the group's completions) instead of once per
    /// completion. Micro-batches then hold whole groups when they fit; a group larger
    /// than `micro_batch` or the memory budget is cut into sub-groups that each run the
    /// prompt. Same log-probs and gradients up to float rounding without LoRA dropout;
    /// with dropout, a prompt token's mask is shared by the group. SFT micro-batches put
    /// their demonstrations' common prompt prefix through once the same way.
    pub share_prompt: bool,
    /// Memory a training micro-batch may take (activations, attention, log-prob head),
    /// in GB (10^9 bytes). Micro-batches (and, with `share_prompt`, groups) are split
    /// until each one's estimate fits; a row that alone does not fit is an error naming
    /// both numbers. Unset: a share ([`crate::model::budget::DEFAULT_BUDGET_SHARE`]) of
    /// the host's available memory on the CPU; no automatic split on other devices
    /// (their free memory is not read).
    /// Range: > 0, at most [`limits::MAX_MEMORY_BUDGET_GB`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_budget_gb: Option<f64>,
    /// Recompute each decoder layer's activations in the backward instead of keeping
    /// them (GRPO and SFT): a micro-batch then holds one layer's activations plus every
    /// layer's input, for about one more forward of compute. Same gradients up to float
    /// rounding. Default off (TRL's default is on).
    /// TRL: `gradient_checkpointing`.
    pub gradient_checkpointing: bool,
}
}

impl Default for OptimConfig {
    fn default() -> Self {
        Self {
            learning_rate: 1e-6,
            max_grad_norm: 1.0,
            betas: [0.9, 0.999],
            eps: 1e-8,
            weight_decay: 0.0,
            warmup_steps: 0,
            schedule: Schedule::Linear,
            micro_batch: 0,
            share_prompt: false,
            memory_budget_gb: None,
            gradient_checkpointing: false,
        }
    }
}

fn err(key: &str, msg: impl std::fmt::Display) -> ValidationError {
    ValidationError::at("optim", key, msg)
}

impl OptimConfig {
    /// AdamW's own ranges (written as `!(x > 0.0)` so that NaN fails too).
    #[allow(clippy::neg_cmp_op_on_partial_ord)]
    pub(super) fn check(&self) -> Result<(), ValidationError> {
        // AdamW moves every weight by about the learning rate each step: past 1 the
        // adapter is noise after one step, whatever the loss.
        if !(self.learning_rate > 0.0 && self.learning_rate <= 1.0) {
            return Err(err(
                "learning_rate",
                format!("{} must be in (0, 1]", self.learning_rate),
            ));
        }
        if !(self.max_grad_norm >= 0.0) {
            return Err(err(
                "max_grad_norm",
                format!("{} must be >= 0 (0 disables clipping)", self.max_grad_norm),
            ));
        }
        if let Some(b) = self.betas.into_iter().find(|b| !(0.0..1.0).contains(b)) {
            return Err(err("betas", format!("{b} must be in [0, 1)")));
        }
        if !(self.eps > 0.0) || !self.eps.is_finite() {
            return Err(err("eps", format!("{} must be > 0", self.eps)));
        }
        if !(self.weight_decay >= 0.0) || !self.weight_decay.is_finite() {
            return Err(err(
                "weight_decay",
                format!("{} must be >= 0", self.weight_decay),
            ));
        }
        Ok(())
    }

    /// The warmup fits in the run's `run_steps`, and the memory budget is a size.
    #[allow(clippy::neg_cmp_op_on_partial_ord)]
    pub(super) fn check_budgets(&self, run_steps: usize) -> Result<(), ValidationError> {
        if self.warmup_steps > run_steps {
            return Err(err(
                "warmup_steps",
                format!("{} exceeds run.steps = {run_steps}", self.warmup_steps),
            ));
        }
        if let Some(gb) = self.memory_budget_gb {
            if !(gb > 0.0) || gb > limits::MAX_MEMORY_BUDGET_GB {
                return Err(err(
                    "memory_budget_gb",
                    format!(
                        "{gb} must be > 0 and at most {} (GB; leave it unset for a share \
                         of the available memory)",
                        limits::MAX_MEMORY_BUDGET_GB
                    ),
                ));
            }
        }
        Ok(())
    }
}

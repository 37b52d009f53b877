//! `[grpo]`: group size, sampling, the loss and its TRL knobs, and their checks.
use super::doc::documented;
use super::is_zero;
use super::limits;
use super::locate::ValidationError;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

documented! {
/// How token losses are weighted and normalised.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum LossType {
    /// The GRPO paper's: each sequence's token losses averaged, then the sequences'.
    Grpo,
    /// Token losses averaged over the batch's completion tokens.
    Bnpo,
    /// Dr. GRPO: token losses summed and divided by rows x `max_completion_length`,
    /// with no length bias.
    DrGrpo,
    /// DAPO: token losses averaged over the batch's completion tokens (TRL's default).
    #[default]
    Dapo,
    /// Clipped importance-sampling weights times the log-prob (MiniMax-M1); logs
    /// `cispo_clip_ratio`.
    Cispo,
    /// A sigmoid gate on the ratio instead of a hard clip (SAPO).
    Sapo,
    /// GSPO with each sequence's loss scaled by its length (LUSPO).
    Luspo,
    /// Gamma-shaped sequence weights on the log-prob (VESPO); logs
    /// `vespo/phi_seq_mean`.
    Vespo,
}
}

documented! {
/// How several named reward components become one advantage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum MultiObjectiveAggregation {
    /// Weighted sum of the components, then `scale_rewards` normalisation.
    #[default]
    SumThenNormalize,
    /// GDPO: normalise each component within its group, sum with the weights, then
    /// normalise the sum over the batch (`scale_rewards` does not apply). A component
    /// a completion lacks counts as 0.
    NormalizeThenSum,
}
}

documented! {
/// How the sampler/trainer importance weights `exp(logp_train - logp_sampler)` are
/// formed and bounded (TRL's `vllm_importance_sampling_mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum ImportanceSamplingMode {
    /// Per-token weights clamped to [clip_min, clip_max].
    TokenTruncate,
    /// Per-token weights, zero outside [clip_min, clip_max].
    TokenMask,
    /// One weight per sequence (exp of the summed difference), clamped.
    SequenceTruncate,
    /// One weight per sequence, zero outside the bounds.
    #[default]
    SequenceMask,
}
}

documented! {
/// Whether the policy ratio is taken per token or per sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum ImportanceSamplingLevel {
    /// One ratio per token (GRPO).
    #[default]
    Token,
    /// One ratio per sequence, the exp of its mean token log-ratio (GSPO).
    Sequence,
}
}

documented! {
/// What a group's centred rewards are divided by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum ScaleRewards {
    /// The group's reward standard deviation.
    #[default]
    Group,
    /// The whole batch's reward standard deviation.
    Batch,
    /// Nothing: advantages are the rewards minus the group mean (Dr. GRPO).
    None,
}
}

documented! {
/// Group size, sampling, the loss and its TRL knobs. The keys are TRL's `GRPOConfig`
/// fields under the same names, with the same defaults and the same numbers
/// (`tests/grpo_math.rs` checks every loss type against TRL's own code).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GrpoConfig {
    /// G: completions sampled per prompt; advantages compare the completions of a
    /// group.
    /// Range: 2 to [`limits::MAX_NUM_GENERATIONS`].
    /// TRL: `num_generations`.
    pub num_generations: usize,
    /// Prompts (groups) per optimiser step: the batch has prompts_per_step x G rows.
    /// Range: 1 to [`limits::MAX_PROMPTS_PER_STEP`], and prompts_per_step x G at most
    /// [`limits::MAX_BATCH_ROWS`].
    /// TRL: `generation_batch_size` / `num_generations`.
    pub prompts_per_step: usize,
    /// Tokens one completion may take; in episode mode, a whole trajectory's
    /// completion tokens (model and environment together).
    /// Range: 1 to [`limits::MAX_COMPLETION_LENGTH`], within the model's
    /// `max_position_embeddings`.
    /// TRL: `max_completion_length`.
    pub max_completion_length: usize,
    /// Sampling temperature.
    /// Range: > 0.
    /// TRL: `temperature`.
    pub temperature: f64,
    /// Nucleus sampling: draw from the most likely tokens that hold this much
    /// probability (1: off).
    /// Range: (0, 1].
    /// TRL: `top_p`.
    pub top_p: f64,
    /// Draw from the k most likely tokens (0: off).
    /// TRL: `top_k`.
    pub top_k: usize,
    /// Drop tokens less likely than this times the most likely one (0: off).
    /// Range: [0, 1].
    /// TRL: `min_p`.
    pub min_p: f64,
    /// Divide the logits of tokens already in the context by this (multiply the
    /// negative ones; 1: off).
    /// Range: > 0.
    /// TRL: `repetition_penalty`.
    pub repetition_penalty: f64,
    /// KL weight; the reference is the model with the adapter disabled (0: no KL
    /// term).
    /// Range: >= 0.
    /// TRL: `beta`.
    pub beta: f64,
    /// Clip range of the policy ratio: [1 - epsilon, 1 + epsilon_high].
    /// Range: (0, 1).
    /// TRL: `epsilon`.
    pub epsilon: f64,
    /// Upper clip range (DAPO: 0.28); with `cispo`, the cap of the weight itself
    /// (ScaleRL uses 5.0). Unset: `epsilon`.
    /// Range: > 0.
    /// TRL: `epsilon_high`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub epsilon_high: Option<f64>,
    /// Caps the policy ratio from above (two-sided GRPO); off when unset.
    /// Range: > 1.
    /// TRL: `delta`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delta: Option<f64>,
    /// How token losses are weighted and normalised.
    /// TRL: `loss_type`.
    pub loss_type: LossType,
    /// Whether the policy ratio is per token or per sequence.
    /// TRL: `importance_sampling_level`.
    pub importance_sampling_level: ImportanceSamplingLevel,
    /// How a group's centred rewards are scaled into advantages.
    /// TRL: `scale_rewards`.
    pub scale_rewards: ScaleRewards,
    /// Completions cut at `max_completion_length` carry no loss.
    /// TRL: `mask_truncated_completions`.
    pub mask_truncated_completions: bool,
    /// Optimiser steps per generated batch (reuses old log-probs when > 1).
    /// Range: 1 to [`limits::MAX_NUM_ITERATIONS`].
    /// TRL: `num_iterations`.
    pub num_iterations: usize,
    /// Weights of the environment's named reward components, `{ win = 1.0, valid =
    /// 0.2 }`: the reward is their weighted sum. Empty: the environment's scalar
    /// reward.
    /// Range: finite weights.
    /// TRL: `reward_weights` (a list there, one per reward function).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub reward_weights: BTreeMap<String, f64>,
    /// DAPO's dynamic sampling: keep drawing prompts until `prompts_per_step` groups
    /// have rewards that differ (a group whose rewards are all equal carries no
    /// gradient), or `max_prompt_draws` prompts have been drawn. The log then gets a
    /// `prompt_draws` column, and `frac_reward_zero_std` counts every group drawn. Not
    /// in episode mode yet.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub dynamic_sampling: bool,
    /// Prompts drawn per step at most with `dynamic_sampling` (0: 4 x
    /// `prompts_per_step`).
    /// Range: 0, or `prompts_per_step` to [`limits::MAX_PROMPTS_PER_STEP`].
    #[serde(skip_serializing_if = "is_zero")]
    pub max_prompt_draws: usize,
    /// `sapo`: gate temperature of tokens with positive advantage.
    /// Range: > 0.
    /// TRL: `sapo_temperature_pos`.
    pub sapo_temperature_pos: f64,
    /// `sapo`: gate temperature of tokens with non-positive advantage.
    /// Range: > 0.
    /// TRL: `sapo_temperature_neg`.
    pub sapo_temperature_neg: f64,
    /// `vespo`: power k of the Gamma weight for non-negative advantages.
    /// Range: >= 0.
    /// TRL: `vespo_k_pos`.
    pub vespo_k_pos: f64,
    /// `vespo`: decay lambda of the Gamma weight for non-negative advantages.
    /// Range: > 0.
    /// TRL: `vespo_lambda_pos`.
    pub vespo_lambda_pos: f64,
    /// `vespo`: power k for negative advantages.
    /// Range: >= 0.
    /// TRL: `vespo_k_neg`.
    pub vespo_k_neg: f64,
    /// `vespo`: decay lambda for negative advantages.
    /// Range: > 0.
    /// TRL: `vespo_lambda_neg`.
    pub vespo_lambda_neg: f64,
    /// How named reward components (`reward_weights`) combine into the advantage;
    /// `normalize_then_sum` needs `reward_weights`.
    /// TRL: `multi_objective_aggregation`.
    pub multi_objective_aggregation: MultiObjectiveAggregation,
    /// Keep only the top-q highest-entropy completion tokens of each micro-batch in the
    /// policy loss (1.0: all tokens; 0.2 in the paper).
    /// Range: [0, 1].
    /// TRL: `top_entropy_quantile`.
    pub top_entropy_quantile: f64,
    /// Weight of the mean token entropy subtracted from the loss (0: off).
    /// Range: finite.
    /// TRL: `entropy_coef`.
    pub entropy_coef: f64,
    /// Multiply the per-token loss by sampler/trainer importance weights. Off by
    /// default: Concord samples with the very weights it trains (TRL turns it on with
    /// vLLM only). The drift is logged every step (`sampling/*`); turn it on if it
    /// grows, as it may in bf16 on a GPU or with a quantized base.
    /// TRL: `vllm_importance_sampling_correction`.
    pub importance_sampling_correction: bool,
    /// How those weights are formed and bounded.
    /// TRL: `vllm_importance_sampling_mode`.
    pub importance_sampling_mode: ImportanceSamplingMode,
    /// Lower bound of the importance weights (none when unset).
    /// Range: >= 0, below `importance_sampling_clip_max`.
    /// TRL: `vllm_importance_sampling_clip_min`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub importance_sampling_clip_min: Option<f64>,
    /// Upper bound of the importance weights (`inf`: none, TRL's `None`).
    /// Range: > 0.
    /// TRL: `vllm_importance_sampling_clip_max`.
    pub importance_sampling_clip_max: f64,
    /// Drop negative-advantage sequences whose mean sampler-to-policy KL exceeds this
    /// (DeepSeek-V3.2's off-policy sequence mask); off when unset.
    /// Range: >= 0 (e.g. 0.5).
    /// TRL: `off_policy_mask_threshold`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub off_policy_mask_threshold: Option<f64>,
}
}

impl Default for GrpoConfig {
    fn default() -> Self {
        Self {
            num_generations: 8,
            prompts_per_step: 4,
            max_completion_length: 256,
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            beta: 0.0,
            epsilon: 0.2,
            epsilon_high: None,
            delta: None,
            loss_type: LossType::Dapo,
            importance_sampling_level: ImportanceSamplingLevel::Token,
            scale_rewards: ScaleRewards::Group,
            mask_truncated_completions: false,
            num_iterations: 1,
            reward_weights: BTreeMap::new(),
            dynamic_sampling: false,
            max_prompt_draws: 0,
            sapo_temperature_pos: 1.0,
            sapo_temperature_neg: 1.05,
            vespo_k_pos: 2.0,
            vespo_lambda_pos: 3.0,
            vespo_k_neg: 3.0,
            vespo_lambda_neg: 2.0,
            multi_objective_aggregation: MultiObjectiveAggregation::SumThenNormalize,
            top_entropy_quantile: 1.0,
            entropy_coef: 0.0,
            importance_sampling_correction: false,
            importance_sampling_mode: ImportanceSamplingMode::SequenceMask,
            importance_sampling_clip_min: None,
            importance_sampling_clip_max: 3.0,
            off_policy_mask_threshold: None,
        }
    }
}

impl GrpoConfig {
    /// The sampler's parameters for these keys, stopping at `stop_token_ids`.
    pub fn sampling_params(
        &self,
        stop_token_ids: Vec<u32>,
        seed: u64,
    ) -> crate::sample::SamplingParams {
        crate::sample::SamplingParams {
            stop_token_ids,
            seed,
            ..crate::sample::SamplingParams::new(
                self.temperature,
                self.top_p,
                self.top_k,
                self.min_p,
                self.repetition_penalty,
                self.max_completion_length,
            )
        }
    }
    pub fn epsilon_high(&self) -> f64 {
        self.epsilon_high.unwrap_or(self.epsilon)
    }
    /// Prompts a step may draw: `prompts_per_step`, or up to `max_prompt_draws` (default
    /// 4 x `prompts_per_step`) with dynamic sampling.
    pub fn prompt_draw_budget(&self) -> usize {
        match (self.dynamic_sampling, self.max_prompt_draws) {
            (false, _) => self.prompts_per_step,
            (true, 0) => 4 * self.prompts_per_step,
            (true, n) => n,
        }
    }
    /// Rows of one generation batch.
    pub fn batch_size(&self) -> usize {
        self.num_generations * self.prompts_per_step
    }
}

fn err(key: &str, msg: impl std::fmt::Display) -> ValidationError {
    ValidationError::at("grpo", key, msg)
}

// The checks write `!(x > 0.0)`, not `x <= 0.0`, so that NaN fails too.
impl GrpoConfig {
    /// Every `[grpo]` key, in the order the first fault of a config is reported.
    pub(super) fn check(&self) -> Result<(), ValidationError> {
        self.check_batch()?;
        self.check_sampling()?;
        self.check_update()?;
        self.check_loss_knobs()?;
        self.check_correction()
    }

    /// The groups of a generation batch and how many prompts a step may draw.
    fn check_batch(&self) -> Result<(), ValidationError> {
        let over = |key: &str, n: usize, limit: usize| {
            Err(err(key, format!("{n} exceeds the limit of {limit}")))
        };
        if self.num_generations < 2 {
            return Err(err(
                "num_generations",
                format!(
                    "{} must be >= 2 (advantages compare completions within a group)",
                    self.num_generations
                ),
            ));
        }
        if self.num_generations > limits::MAX_NUM_GENERATIONS {
            return over(
                "num_generations",
                self.num_generations,
                limits::MAX_NUM_GENERATIONS,
            );
        }
        if self.prompts_per_step == 0 {
            return Err(err("prompts_per_step", "must be >= 1"));
        }
        if self.max_prompt_draws != 0 && self.max_prompt_draws < self.prompts_per_step {
            return Err(err(
                "max_prompt_draws",
                format!(
                    "{} is below prompts_per_step = {} (0: 4 x prompts_per_step)",
                    self.max_prompt_draws, self.prompts_per_step
                ),
            ));
        }
        if self.max_prompt_draws > limits::MAX_PROMPTS_PER_STEP {
            return over(
                "max_prompt_draws",
                self.max_prompt_draws,
                limits::MAX_PROMPTS_PER_STEP,
            );
        }
        if self.prompts_per_step > limits::MAX_PROMPTS_PER_STEP {
            return over(
                "prompts_per_step",
                self.prompts_per_step,
                limits::MAX_PROMPTS_PER_STEP,
            );
        }
        if self.batch_size() > limits::MAX_BATCH_ROWS {
            return Err(err(
                "prompts_per_step",
                format!(
                    "prompts_per_step x num_generations = {} rows exceeds the limit of {}",
                    self.batch_size(),
                    limits::MAX_BATCH_ROWS
                ),
            ));
        }
        Ok(())
    }

    /// The sampler's parameters, its token budget first.
    #[allow(clippy::neg_cmp_op_on_partial_ord)]
    fn check_sampling(&self) -> Result<(), ValidationError> {
        if self.max_completion_length == 0 {
            return Err(err("max_completion_length", "must be >= 1"));
        }
        if self.max_completion_length > limits::MAX_COMPLETION_LENGTH {
            return Err(err(
                "max_completion_length",
                format!(
                    "{} exceeds the limit of {} tokens (and must fit the model's \
                     max_position_embeddings)",
                    self.max_completion_length,
                    limits::MAX_COMPLETION_LENGTH
                ),
            ));
        }
        // The sampler computes in f32: a temperature past f32's range would be inf there.
        if !(self.temperature > 0.0) || !(self.temperature as f32).is_finite() {
            return Err(err(
                "temperature",
                match self.temperature > 0.0 {
                    true => format!("{} is past f32's range ({:e})", self.temperature, f32::MAX),
                    false => format!("{} must be > 0", self.temperature),
                },
            ));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(err(
                "top_p",
                format!("{} must be in (0, 1] (1 = off)", self.top_p),
            ));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return Err(err("min_p", format!("{} must be in [0, 1]", self.min_p)));
        }
        if !(self.repetition_penalty > 0.0) || !self.repetition_penalty.is_finite() {
            return Err(err(
                "repetition_penalty",
                format!("{} must be > 0", self.repetition_penalty),
            ));
        }
        Ok(())
    }

    /// The KL weight, the clip range, the update count and the reward weights.
    #[allow(clippy::neg_cmp_op_on_partial_ord)]
    fn check_update(&self) -> Result<(), ValidationError> {
        if !(self.beta >= 0.0) || !self.beta.is_finite() {
            return Err(err("beta", format!("{} must be >= 0", self.beta)));
        }
        if !(self.epsilon > 0.0) || !(self.epsilon < 1.0) {
            return Err(err(
                "epsilon",
                format!("{} must be in (0, 1)", self.epsilon),
            ));
        }
        if let Some(eh) = self.epsilon_high {
            if !(eh > 0.0) || !eh.is_finite() {
                return Err(err("epsilon_high", format!("{eh} must be > 0")));
            }
        }
        if let Some(d) = self.delta {
            if !(d > 1.0) || !d.is_finite() {
                return Err(err("delta", format!("{d} must be > 1")));
            }
        }
        if self.num_iterations == 0 {
            return Err(err("num_iterations", "must be >= 1"));
        }
        if self.num_iterations > limits::MAX_NUM_ITERATIONS {
            return Err(err(
                "num_iterations",
                format!(
                    "{} exceeds the limit of {}",
                    self.num_iterations,
                    limits::MAX_NUM_ITERATIONS
                ),
            ));
        }
        if let Some((k, _)) = self.reward_weights.iter().find(|(_, w)| !w.is_finite()) {
            return Err(err(
                "reward_weights",
                format!("weight of `{k}` must be finite"),
            ));
        }
        Ok(())
    }

    /// The SAPO and VESPO shapes and the entropy keys of TRL 1.16.
    #[allow(clippy::neg_cmp_op_on_partial_ord)]
    fn check_loss_knobs(&self) -> Result<(), ValidationError> {
        for (key, v) in [
            ("sapo_temperature_pos", self.sapo_temperature_pos),
            ("sapo_temperature_neg", self.sapo_temperature_neg),
            ("vespo_lambda_pos", self.vespo_lambda_pos),
            ("vespo_lambda_neg", self.vespo_lambda_neg),
        ] {
            if !(v > 0.0) || !v.is_finite() {
                return Err(err(key, format!("{v} must be > 0")));
            }
        }
        for (key, v) in [
            ("vespo_k_pos", self.vespo_k_pos),
            ("vespo_k_neg", self.vespo_k_neg),
        ] {
            if !(v >= 0.0) || !v.is_finite() {
                return Err(err(key, format!("{v} must be >= 0")));
            }
        }
        if !(0.0..=1.0).contains(&self.top_entropy_quantile) {
            return Err(err(
                "top_entropy_quantile",
                format!(
                    "{} must be in [0, 1] (1 = every token, 0.2 = the paper's top 20%)",
                    self.top_entropy_quantile
                ),
            ));
        }
        if !self.entropy_coef.is_finite() {
            return Err(err(
                "entropy_coef",
                format!("{} must be finite", self.entropy_coef),
            ));
        }
        Ok(())
    }

    /// The sampler-correction bounds of TRL 1.16, and the keys that only make sense
    /// together (component normalisation, VESPO's per-token weights).
    #[allow(clippy::neg_cmp_op_on_partial_ord)]
    fn check_correction(&self) -> Result<(), ValidationError> {
        let max = self.importance_sampling_clip_max;
        if !(max > 0.0) {
            return Err(err(
                "importance_sampling_clip_max",
                format!("{max} must be > 0 (inf: no upper bound)"),
            ));
        }
        if let Some(min) = self.importance_sampling_clip_min {
            if !(min >= 0.0) || !min.is_finite() {
                return Err(err(
                    "importance_sampling_clip_min",
                    format!("{min} must be a finite value >= 0"),
                ));
            }
            if !(min < max) {
                return Err(err(
                    "importance_sampling_clip_min",
                    format!("{min} must be below importance_sampling_clip_max = {max}"),
                ));
            }
        }
        if let Some(t) = self.off_policy_mask_threshold {
            if !(t >= 0.0) || !t.is_finite() {
                return Err(err(
                    "off_policy_mask_threshold",
                    format!("{t} must be a finite value >= 0 (e.g. 0.5)"),
                ));
            }
        }
        if self.multi_objective_aggregation == MultiObjectiveAggregation::NormalizeThenSum
            && self.reward_weights.is_empty()
        {
            return Err(err(
                "multi_objective_aggregation",
                "normalize_then_sum normalises each named reward component: name them \
                 (and their weights) in grpo.reward_weights",
            ));
        }
        if self.loss_type == LossType::Vespo
            && self.importance_sampling_correction
            && matches!(
                self.importance_sampling_mode,
                ImportanceSamplingMode::SequenceMask | ImportanceSamplingMode::SequenceTruncate
            )
        {
            return Err(err(
                "importance_sampling_mode",
                "vespo folds per-token importance weights into its sequence weight: use \
                 token_truncate or token_mask with importance_sampling_correction",
            ));
        }
        Ok(())
    }
}

//! The TOML run configuration: schema (unknown keys rejected with key and line),
//! validation and `--set section.key=value` overrides.
//!
//! Sections: `[run]`, `[model]`, `[lora]`, `[grpo]`, `[optim]`, `[env]` (+ the free
//! table `[env.options]`, validated by the environment itself) and `[[stage]]` curriculum
//! tables ([`stage`]), and `[sft]` for supervised fine-tuning ([`sft`]).
//!
//! Defaults follow TRL's `GRPOConfig` / transformers' `TrainingArguments` (see
//! `shared/design/grpo.md`) so that a user moving from Python finds the same numbers.
pub mod sft;
pub mod stage;
mod validate;

use anyhow::{anyhow, bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The whole run configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub run: RunConfig,
    #[serde(default)]
    pub model: ModelConfig,
    #[serde(default)]
    pub lora: LoraSection,
    #[serde(default)]
    pub grpo: GrpoConfig,
    #[serde(default)]
    pub optim: OptimConfig,
    /// The environment trained on. Optional because a curriculum (`[[stage]]`) names
    /// its environments per stage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<EnvConfig>,
    /// Curriculum stages (`[[stage]]`, see [`stage`]).
    #[serde(default, rename = "stage", skip_serializing_if = "Vec::is_empty")]
    pub stages: Vec<stage::StageSpec>,
    /// Supervised fine-tuning (`concord sft`, or `warm_start` before GRPO).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sft: Option<sft::SftConfig>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RunConfig {
    /// Output goes to `<output_dir>/<name>/`.
    pub name: String,
    pub output_dir: PathBuf,
    pub seed: u64,
    /// Optimiser steps.
    pub steps: usize,
    /// Write `checkpoint-STEP/` every this many steps (0: only at the end).
    pub save_every: usize,
    /// Completions per step written to `samples.jsonl`.
    pub log_samples: usize,
    /// Keep at most this many checkpoints (0: keep all).
    pub save_total_limit: usize,
    /// Play held-out episodes with the current adapter every this many steps, and at
    /// the end, appending a row per environment to `eval_log.csv` (0: never; TRL's
    /// `eval_strategy = "steps"` with `eval_steps`).
    pub eval_every: usize,
    /// Held-out episodes per environment in each of those evaluations (the first ones
    /// of `concord eval`'s set).
    pub eval_episodes: usize,
    /// Where the per-step metrics go besides `training_log.csv`, which is always
    /// written (TRL's `report_to`): `"tensorboard"` adds event files under
    /// `RUN_DIR/tensorboard/`.
    pub report_to: Vec<ReportTo>,
    /// What the relative paths of this file are relative to: the current directory
    /// (a config you write), or the directory holding the file (the `config.toml` a run
    /// records, so that it names no path of the machine it ran on).
    #[serde(skip_serializing_if = "PathsBase::is_cwd")]
    pub paths_relative_to: PathsBase,
}

/// A metrics sink of [`RunConfig::report_to`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReportTo {
    Csv,
    Tensorboard,
}

impl RunConfig {
    /// `report_to` names `"tensorboard"`.
    pub fn tensorboard(&self) -> bool {
        self.report_to.contains(&ReportTo::Tensorboard)
    }
}

/// See [`RunConfig::paths_relative_to`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum PathsBase {
    #[default]
    Cwd,
    /// The directory of the config file (a run's own directory).
    ConfigDir,
}

impl PathsBase {
    fn is_cwd(&self) -> bool {
        *self == PathsBase::Cwd
    }
}

impl Default for RunConfig {
    fn default() -> Self {
        Self {
            name: "concord".into(),
            output_dir: PathBuf::from("runs"),
            seed: 42,
            steps: 100,
            save_every: 25,
            log_samples: 4,
            save_total_limit: 0,
            eval_every: 0,
            eval_episodes: 20,
            report_to: vec![ReportTo::Csv],
            paths_relative_to: PathsBase::Cwd,
        }
    }
}

/// Parameter / compute dtype.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum DTypeName {
    #[default]
    F32,
    Bf16,
    F16,
}

impl DTypeName {
    pub fn to_candle(self) -> candle_core::DType {
        match self {
            DTypeName::F32 => candle_core::DType::F32,
            DTypeName::Bf16 => candle_core::DType::BF16,
            DTypeName::F16 => candle_core::DType::F16,
        }
    }
    pub fn as_str(self) -> &'static str {
        match self {
            DTypeName::F32 => "f32",
            DTypeName::Bf16 => "bf16",
            DTypeName::F16 => "f16",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ModelConfig {
    /// Hub id (`Qwen/Qwen2.5-3B-Instruct[@revision]`), local directory or `.gguf`
    /// file. With `init_tiny = true`, a missing or empty directory gets the built-in
    /// tiny random model.
    pub name: String,
    pub dtype: DTypeName,
    /// Storage dtype of the frozen base matrices (projections, embedding, LM head):
    /// `bf16`/`f16` halve the bytes a decode step streams; activations, LoRA and
    /// accumulation stay in `dtype`, and sampling and training see the same rounded
    /// weights. Absent: `dtype`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub base_dtype: Option<DTypeName>,
    /// `cpu` or `cuda:N`.
    pub device: String,
    /// Create the built-in tiny random model at `name` when that directory is absent.
    pub init_tiny: bool,
    /// Start from this PEFT adapter directory (e.g. an SFT run) instead of a fresh
    /// LoRA: its adapter_config.json replaces the `[lora]` shape keys.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub adapter: Option<PathBuf>,
}

impl Default for ModelConfig {
    fn default() -> Self {
        Self {
            name: String::new(),
            dtype: DTypeName::F32,
            base_dtype: None,
            device: "cpu".into(),
            init_tiny: false,
            adapter: None,
        }
    }
}

impl ModelConfig {
    /// The candle device named by `device`.
    pub fn candle_device(&self) -> Result<candle_core::Device> {
        parse_device(&self.device)
    }
}

/// A device name: `cpu`, `auto` (CUDA device 0 when built with CUDA and one is present,
/// else CPU), `cuda` (= `cuda:0`) or `cuda:N`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceName {
    Cpu,
    Auto,
    Cuda(usize),
}

/// Parse a device name without touching any device (config validation, CLI flags).
pub fn parse_device_name(s: &str) -> Result<DeviceName> {
    let t = s.trim().to_ascii_lowercase();
    match t.as_str() {
        "cpu" => Ok(DeviceName::Cpu),
        "auto" => Ok(DeviceName::Auto),
        "cuda" => Ok(DeviceName::Cuda(0)),
        _ => match t.strip_prefix("cuda:").map(str::parse::<usize>) {
            Some(Ok(n)) => Ok(DeviceName::Cuda(n)),
            _ => bail!("device `{s}`: expected cpu, auto, cuda or cuda:N"),
        },
    }
}

/// The candle device a device name stands for.
pub fn parse_device(s: &str) -> Result<candle_core::Device> {
    match parse_device_name(s)? {
        DeviceName::Cpu => Ok(candle_core::Device::Cpu),
        DeviceName::Auto => Ok(candle_core::Device::cuda_if_available(0)?),
        DeviceName::Cuda(n) => candle_core::Device::new_cuda(n).with_context(|| {
            format!("device `{s}` (build with `--features cuda` for GPU support)")
        }),
    }
}

use crate::model::lora::LORA_TARGETS;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LoraSection {
    pub r: usize,
    pub alpha: f64,
    pub dropout: f64,
    pub targets: Vec<String>,
    pub use_rslora: bool,
}

impl Default for LoraSection {
    fn default() -> Self {
        Self {
            r: 16,
            alpha: 32.0,
            dropout: 0.05,
            targets: LORA_TARGETS.iter().map(|s| s.to_string()).collect(),
            use_rslora: false,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum LossType {
    Grpo,
    Bnpo,
    DrGrpo,
    #[default]
    Dapo,
    /// Clipped importance-sampling weights times the log-prob (MiniMax-M1).
    Cispo,
    /// A sigmoid gate on the ratio instead of a hard clip (SAPO).
    Sapo,
    /// GSPO with each sequence's loss scaled by its length (LUSPO).
    Luspo,
    /// Gamma-shaped sequence weights on the log-prob (VESPO).
    Vespo,
}

/// How several named reward components become one advantage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum MultiObjectiveAggregation {
    /// Weighted sum of the components, then `scale_rewards` normalisation.
    #[default]
    SumThenNormalize,
    /// GDPO: normalise each component within its group, sum with the weights, then
    /// normalise the sum over the batch.
    NormalizeThenSum,
}

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

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum ImportanceSamplingLevel {
    #[default]
    Token,
    Sequence,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum ScaleRewards {
    #[default]
    Group,
    Batch,
    None,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GrpoConfig {
    /// G: completions per prompt.
    pub num_generations: usize,
    /// Prompts (groups) per optimiser step; the batch has prompts_per_step x G rows.
    pub prompts_per_step: usize,
    pub max_completion_length: usize,
    pub temperature: f64,
    pub top_p: f64,
    /// 0: off.
    pub top_k: usize,
    /// 0: off.
    pub min_p: f64,
    pub repetition_penalty: f64,
    /// KL weight; the reference is the model with the adapter disabled.
    pub beta: f64,
    pub epsilon: f64,
    /// Upper clip epsilon (DAPO: 0.28); defaults to `epsilon`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub epsilon_high: Option<f64>,
    /// Caps the importance weight from above (two-sided GRPO); off when absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delta: Option<f64>,
    pub loss_type: LossType,
    pub importance_sampling_level: ImportanceSamplingLevel,
    pub scale_rewards: ScaleRewards,
    pub mask_truncated_completions: bool,
    /// Optimiser steps per generated batch (reuses old log-probs when > 1).
    pub num_iterations: usize,
    /// Weights of named reward components; empty: use the environment's scalar reward.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub reward_weights: BTreeMap<String, f64>,
    /// DAPO's dynamic sampling: keep drawing prompts until `prompts_per_step` groups
    /// have rewards that differ (a group whose rewards are all equal carries no
    /// gradient), or `max_prompt_draws` prompts have been drawn.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub dynamic_sampling: bool,
    /// Prompts drawn per step at most with `dynamic_sampling` (0: 4 x
    /// `prompts_per_step`).
    #[serde(skip_serializing_if = "is_zero")]
    pub max_prompt_draws: usize,
    /// `sapo`: gate temperature of tokens with positive advantage.
    pub sapo_temperature_pos: f64,
    /// `sapo`: gate temperature of tokens with non-positive advantage.
    pub sapo_temperature_neg: f64,
    /// `vespo`: power k of the Gamma weight for non-negative advantages.
    pub vespo_k_pos: f64,
    /// `vespo`: decay lambda of the Gamma weight for non-negative advantages.
    pub vespo_lambda_pos: f64,
    /// `vespo`: power k for negative advantages.
    pub vespo_k_neg: f64,
    /// `vespo`: decay lambda for negative advantages.
    pub vespo_lambda_neg: f64,
    /// How named reward components (`reward_weights`) combine into the advantage.
    pub multi_objective_aggregation: MultiObjectiveAggregation,
    /// Keep only the top-q highest-entropy completion tokens of each micro-batch in the
    /// policy loss (1.0: all tokens).
    pub top_entropy_quantile: f64,
    /// Weight of the mean token entropy subtracted from the loss (0: off).
    pub entropy_coef: f64,
    /// Multiply the per-token loss by sampler/trainer importance weights. Off by
    /// default: Concord samples with the very weights it trains.
    pub importance_sampling_correction: bool,
    pub importance_sampling_mode: ImportanceSamplingMode,
    /// Lower bound of the importance weights (none when absent).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub importance_sampling_clip_min: Option<f64>,
    /// Upper bound of the importance weights (`inf`: none).
    pub importance_sampling_clip_max: f64,
    /// Drop negative-advantage sequences whose mean sampler-to-policy KL exceeds this
    /// (DeepSeek-V3.2's off-policy sequence mask); off when absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub off_policy_mask_threshold: Option<f64>,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
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

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Schedule {
    Constant,
    #[default]
    Linear,
    Cosine,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OptimConfig {
    pub learning_rate: f64,
    /// Global-norm gradient clipping; 0 disables it.
    pub max_grad_norm: f64,
    pub betas: [f64; 2],
    pub eps: f64,
    pub weight_decay: f64,
    pub warmup_steps: usize,
    pub schedule: Schedule,
    /// At most this many sequences per forward/backward (gradient accumulation); 0: no
    /// cap (the memory budget alone cuts the batch).
    pub micro_batch: usize,
    /// Run each group's shared prompt through the training forward once (its keys and
    /// values, with their graph, shared by the group's completions) instead of once per
    /// completion. Micro-batches then hold whole groups when they fit; a group larger
    /// than `micro_batch` or the memory budget is cut into sub-groups that each run the
    /// prompt. Same log-probs and gradients
    /// up to float rounding without LoRA dropout; with dropout, a prompt token's mask is
    /// shared by the group. Default off.
    pub share_prompt: bool,
    /// Memory a training micro-batch may take (activations, attention, log-prob head),
    /// in GB (10^9 bytes). Micro-batches (and, with `share_prompt`, groups) are split
    /// until each one's estimate ([`crate::model::budget::TrainMemory`]) fits; a row
    /// that alone does not fit is an error naming both numbers. Unset: a share
    /// ([`crate::model::budget::DEFAULT_BUDGET_SHARE`]) of the host's available memory
    /// on the CPU; no automatic split on other devices (their free memory is not read).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_budget_gb: Option<f64>,
    /// Recompute each decoder layer's activations in the backward instead of keeping
    /// them (TRL's `gradient_checkpointing`): a micro-batch then holds one layer's
    /// activations plus every layer's input, for about one more forward of compute.
    /// Same gradients up to float rounding. Default off.
    pub gradient_checkpointing: bool,
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

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct EnvConfig {
    /// Registry name (`ticketmelt`, `merge_ring`, ...); optional with `url`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// An OpenEnv server (`ws://host:port` or `http://host:port`) to train on instead
    /// of a built-in environment, in episode mode (see [`crate::envs::remote`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// With `url`: the action field the model's text is sent in (default `message`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action_key: Option<String>,
    /// With `url`: the observation field that is the model's text (default: the
    /// observation's `messages`, else its JSON).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observation_key: Option<String>,
    /// With `url`: end an episode after this many steps even if the server goes on
    /// (0: when the server says `done`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub max_steps: usize,
    /// With `url`: seconds to wait for the connection and for each reply before the
    /// step fails (default 30).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<f64>,
    /// `decision` (default): each completion is one decision, scored by finishing the
    /// episode with the continuation policy; `episode`: each completion is a whole
    /// trajectory (see [`crate::task::episode`]).
    #[serde(default, skip_serializing_if = "EnvMode::is_decision")]
    pub mode: EnvMode,
    /// Episode mode: the scalar reward is the sum of the seat's step rewards (logged as
    /// `rewards/step_rewards`) instead of its episode reward.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub shaped_rewards: bool,
    /// Episode mode: a model turn that reaches this many tokens ends there (its text is
    /// played as it is; 0: turns end only at a stop token or the completion budget).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub max_turn_tokens: usize,
    /// Decision mode: who plays the rest of the episode after the decision, whose
    /// reward scores it. `scripted` (default): the environment's continuation policy;
    /// `model`: the model being trained, sampled as in training (an on-policy return,
    /// played as `concord eval` plays, so a decision is worth what the model itself
    /// makes of it; it costs the sampling of every continuation). With `url`, decision
    /// mode needs `model`: a server has no scripted policy, so the model also plays to
    /// each decision ([`crate::envs::sample_decisions_with`]).
    #[serde(default, skip_serializing_if = "ContinueWith::is_scripted")]
    pub continue_with: ContinueWith,
    /// Free table, validated by the environment.
    #[serde(default)]
    pub options: toml::Table,
}

/// Who finishes a decision's episode (`[env] continue_with`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum ContinueWith {
    /// The environment's continuation policy (deterministic, cheap).
    #[default]
    Scripted,
    /// The model being trained.
    Model,
}

impl ContinueWith {
    pub fn is_scripted(&self) -> bool {
        *self == ContinueWith::Scripted
    }
}

/// What one completion is (`[env] mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum EnvMode {
    /// One policy seat's decision at one state.
    #[default]
    Decision,
    /// A whole trajectory: model turns and environment turns.
    Episode,
}

impl EnvMode {
    pub fn is_decision(&self) -> bool {
        *self == EnvMode::Decision
    }
}

impl EnvConfig {
    /// An `[env]` in decision mode with these options.
    pub fn new(name: impl Into<String>, options: toml::Table) -> Self {
        Self {
            name: name.into(),
            url: None,
            action_key: None,
            observation_key: None,
            max_steps: 0,
            timeout: None,
            mode: EnvMode::Decision,
            shaped_rewards: false,
            max_turn_tokens: 0,
            continue_with: ContinueWith::Scripted,
            options,
        }
    }
    pub fn is_episode(&self) -> bool {
        self.mode == EnvMode::Episode
    }

    /// The OpenEnv server of `url`, if one is configured.
    pub fn remote_spec(&self) -> Option<crate::envs::remote::RemoteSpec> {
        self.url.as_ref().map(|u| {
            let mut spec = crate::envs::remote::RemoteSpec::new(u.clone());
            if let Some(k) = &self.action_key {
                spec.action_key = k.clone();
            }
            spec.observation_key = self.observation_key.clone();
            spec.max_steps = self.max_steps;
            if let Some(t) = self.timeout.filter(|t| t.is_finite() && *t > 0.0) {
                spec.timeout = Duration::from_secs_f64(t.min(MAX_ENV_TIMEOUT_S));
            }
            spec
        })
    }

    /// The environment's factory: the remote server of `url`, else the registry's.
    pub fn factory(&self) -> Result<Box<dyn crate::envs::EnvFactory>> {
        match self.remote_spec() {
            Some(spec) => Ok(Box::new(crate::envs::remote::RemoteFactory::new(spec)?)),
            None => crate::envs::create(&self.name, &self.options),
        }
    }

    /// How logs and reports name the environment: its registry name, or its URL.
    pub fn label(&self) -> String {
        match &self.url {
            Some(u) => u.clone(),
            None => self.name.clone(),
        }
    }
}

/// Where a config came from, for error messages.
struct Source<'a> {
    path: &'a str,
    text: &'a str,
}

impl Config {
    /// Read `path`, apply `--set` overrides (`section.key=value`), validate. A file with
    /// `run.paths_relative_to = "config_dir"` (a run's recorded config.toml) has its own
    /// paths resolved against its directory (through symlinks, as it was written); an
    /// override's path stays relative to the current directory, like every other.
    pub fn load(path: &Path, sets: &[String]) -> Result<Config> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading config {}", path.display()))?;
        let origin = path.display().to_string();
        let cfg = Self::from_toml_str(&text, &origin, sets)?;
        if cfg.run.paths_relative_to != PathsBase::ConfigDir {
            return Ok(cfg);
        }
        let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
        let dir = real_path(dir.unwrap_or(Path::new(".")));
        let mut file = Self::from_toml_str(&text, &origin, &[])?;
        file.resolve_paths(&dir);
        file.run.paths_relative_to = PathsBase::Cwd;
        if sets.is_empty() {
            return Ok(file);
        }
        Self::from_toml_str(&file.to_toml_string()?, &origin, sets)
    }

    /// This config as a run records it in `run_dir/config.toml`: its paths rewritten
    /// relative to `run_dir` (both taken through symlinks), and marked so, so the file
    /// names no path of this machine and the run directory can be moved with what it
    /// uses. Relative paths are taken as relative to the current directory.
    pub fn to_run_toml(&self, run_dir: &Path) -> Result<String> {
        let mut c = self.clone();
        c.resolve_paths(&std::env::current_dir().context("reading the current directory")?);
        let base = real_path(run_dir);
        let rel = |p: &Path| relative_path(&real_path(p), &base).unwrap_or_else(|| p.to_path_buf());
        c.run.output_dir = rel(&c.run.output_dir);
        let name = Path::new(&c.model.name);
        if name.is_absolute() {
            c.model.name = rel(name).display().to_string();
        }
        if let Some(a) = &c.model.adapter {
            c.model.adapter = Some(rel(a));
        }
        if let Some(p) = c.sft.as_mut().and_then(|s| s.path.as_mut()) {
            *p = rel(p);
        }
        c.run.paths_relative_to = PathsBase::ConfigDir;
        c.to_toml_string()
    }

    /// Parse `text` (named `origin` in errors), apply overrides, validate.
    pub fn from_toml_str(text: &str, origin: &str, sets: &[String]) -> Result<Config> {
        let src = Source { path: origin, text };
        // Parse the file alone first: its errors carry spans, hence lines.
        let file_cfg: Config = toml::from_str(text).map_err(|e| de_error(&src, &e))?;
        let cfg = if sets.is_empty() {
            file_cfg
        } else {
            let mut table: toml::Table = toml::from_str(text).map_err(|e| de_error(&src, &e))?;
            for s in sets {
                apply_set(&mut table, s)?;
            }
            Config::deserialize(toml::Value::Table(table)).map_err(|e| {
                anyhow!(
                    "{origin}: after --set overrides ({}): {}",
                    sets.join(", "),
                    e.message().trim()
                )
            })?
        };
        cfg.validate().map_err(|e| {
            let line = e
                .key
                .as_ref()
                .and_then(|(section, key)| find_key_line(text, section, key));
            let set_by_flag = e.key.as_ref().is_some_and(|(section, key)| {
                sets.iter().any(|s| {
                    s.split('=').next().map(str::trim) == Some(&format!("{section}.{key}"))
                })
            });
            match (line, set_by_flag) {
                (_, true) => anyhow!("{origin}: {} (set by --set)", e.message),
                (Some(l), false) => anyhow!("{origin}: line {l}: {}", e.message),
                (None, false) => anyhow!("{origin}: {}", e.message),
            }
        })?;
        stage::check(&cfg).map_err(|e| {
            let line = cfg
                .stages
                .iter()
                .position(|s| format!("{e:#}").contains(&format!("`{}`", s.name)))
                .and_then(|i| stage_line(text, i));
            match line {
                Some(l) => anyhow!("{origin}: line {l}: {e:#}"),
                None => anyhow!("{origin}: {e:#}"),
            }
        })?;
        let built_in = cfg.env.as_ref().filter(|e| e.url.is_none());
        if let (Some(env), true) = (built_in, cfg.stages.is_empty()) {
            // `[env.options]` are the environment's to check: build it once so a bad
            // option fails here, with the file and the option's line. (A remote
            // server is only reached when training starts.)
            crate::envs::create(&env.name, &env.options)
                .map_err(|e| locate_env_error(text, origin, &e))?;
        }
        Ok(cfg)
    }

    /// Range checks only (for configs derived in code, e.g. a stage's overrides).
    pub fn revalidate(&self) -> Result<()> {
        self.validate().map_err(|e| anyhow!("{}", e.message))
    }

    /// The resolved configuration as TOML (written to `runs/NAME/config.toml`).
    pub fn to_toml_string(&self) -> Result<String> {
        toml::to_string(self).context("serialising config")
    }

    /// `<output_dir>/<name>`.
    /// The model to load for training or evaluation: `[model]` with `[lora]`'s adapter
    /// (or `model.adapter`).
    pub fn model_spec(&self) -> Result<crate::model::load::ModelSpec> {
        use crate::model::load::ModelSpec;
        Ok(ModelSpec {
            dtype: Some(self.model.dtype.to_candle()),
            base_dtype: self.model.base_dtype.map(|d| d.to_candle()),
            lora: Some(self.lora_config()),
            adapter: self.model.adapter.clone(),
            init_tiny: self.model.init_tiny,
            ..ModelSpec::new(&self.model.name, self.model.candle_device()?)
        })
    }

    /// The LoRA adapter this config asks for (the run seed initialises A).
    pub fn lora_config(&self) -> crate::model::LoraConfig {
        crate::model::LoraConfig {
            r: self.lora.r,
            alpha: self.lora.alpha,
            dropout: self.lora.dropout,
            target_modules: self.lora.targets.clone(),
            use_rslora: self.lora.use_rslora,
            init_seed: self.run.seed,
        }
    }

    pub fn run_dir(&self) -> PathBuf {
        self.run.output_dir.join(&self.run.name)
    }

    /// Where a `warm_start` SFT writes its run inside the GRPO run directory.
    pub fn warm_start_dir(&self) -> Option<PathBuf> {
        self.sft
            .as_ref()
            .filter(|s| s.warm_start)
            .map(|_| self.run_dir().join(WARM_START_DIR))
    }

    /// The adapter GRPO starts from: the warm start's output, else `model.adapter`
    /// (None: a fresh LoRA). What `eval --compare` measures the run against.
    pub fn start_adapter(&self) -> Option<PathBuf> {
        self.warm_start_dir().or_else(|| self.model.adapter.clone())
    }
}

/// The warm start's run directory inside a GRPO run directory.
pub const WARM_START_DIR: &str = "sft";

/// The longest `[env] timeout`: a day (a step that needs longer is not one).
pub const MAX_ENV_TIMEOUT_S: f64 = 86_400.0;

/// Upper bounds on sizes, checked before anything is allocated (a value past them is
/// a typo or a unit slip, not a run this trainer can take). The model-dependent bounds
/// (`max_position_embeddings`, memory) are checked once the model config is known
/// ([`crate::model::budget`]).
pub mod limits {
    /// `run.steps`.
    pub const MAX_STEPS: usize = 100_000_000;
    /// `lora.r`.
    pub const MAX_LORA_R: usize = 4096;
    /// `grpo.num_generations` (G).
    pub const MAX_NUM_GENERATIONS: usize = 1024;
    /// `grpo.prompts_per_step`.
    pub const MAX_PROMPTS_PER_STEP: usize = 4096;
    /// `prompts_per_step x num_generations`: rows of one generation batch.
    pub const MAX_BATCH_ROWS: usize = 16_384;
    /// `grpo.max_completion_length` (tokens; Qwen2.5's longest context is 131,072).
    pub const MAX_COMPLETION_LENGTH: usize = 131_072;
    /// `grpo.num_iterations`.
    pub const MAX_NUM_ITERATIONS: usize = 1000;
    /// `[[stage]]` tables (each builds its environments up front: 4,000 took 17 s and
    /// 3.3 GB before the first step).
    pub const MAX_STAGES: usize = 256;
    /// `optim.memory_budget_gb` (a petabyte: a typo guard, not a machine).
    pub const MAX_MEMORY_BUDGET_GB: f64 = 1e6;
}

/// Keys a resumed run may not change: they shape the adapter (`lora.*`, the base
/// model, `run.seed` which initialises it), the optimizer state (`optim.betas`,
/// `optim.eps`) or the learning-rate schedule (`optim.learning_rate`, `schedule`,
/// `warmup_steps`, `grpo.num_iterations`, and `run.steps` unless the schedule is
/// constant), or the curriculum the saved stage index points into (`stage`).
/// Everything else (sampling, logging, checkpoint cadence, loss knobs) may change.
pub const FROZEN_ON_RESUME: &[&str] = &[
    "model.name",
    "model.adapter",
    "lora.r",
    "lora.alpha",
    "lora.dropout",
    "lora.targets",
    "lora.use_rslora",
    "run.seed",
    "run.steps",
    "optim.learning_rate",
    "optim.betas",
    "optim.eps",
    "optim.schedule",
    "optim.warmup_steps",
    "grpo.num_iterations",
    "stage",
];

impl Config {
    /// The [`FROZEN_ON_RESUME`] keys whose values differ between `saved` (the run's
    /// config.toml) and `self` (the config a resume would use). Empty: resumable.
    pub fn frozen_changes(&self, saved: &Config) -> Vec<String> {
        let mut out = Vec::new();
        let mut check = |key: &str, a: String, b: String| {
            if a != b {
                out.push(format!("{key} ({b} -> {a})"));
            }
        };
        let d = |v: &dyn std::fmt::Debug| format!("{v:?}");
        let (a, b) = (self, saved);
        check("model.name", a.model.name.clone(), b.model.name.clone());
        // The adapter the run started from (a warm start's output counts as such).
        check(
            "model.adapter",
            d(&a.start_adapter()),
            d(&b.start_adapter()),
        );
        check("lora.r", d(&a.lora.r), d(&b.lora.r));
        check("lora.alpha", d(&a.lora.alpha), d(&b.lora.alpha));
        check("lora.dropout", d(&a.lora.dropout), d(&b.lora.dropout));
        let sorted = |t: &[String]| {
            let mut v = t.to_vec();
            v.sort();
            v.dedup();
            v
        };
        check(
            "lora.targets",
            d(&sorted(&a.lora.targets)),
            d(&sorted(&b.lora.targets)),
        );
        check(
            "lora.use_rslora",
            d(&a.lora.use_rslora),
            d(&b.lora.use_rslora),
        );
        check("run.seed", d(&a.run.seed), d(&b.run.seed));
        if a.optim.schedule != Schedule::Constant || b.optim.schedule != Schedule::Constant {
            check("run.steps", d(&a.run.steps), d(&b.run.steps));
        }
        check(
            "optim.learning_rate",
            d(&a.optim.learning_rate),
            d(&b.optim.learning_rate),
        );
        check("optim.betas", d(&a.optim.betas), d(&b.optim.betas));
        check("optim.eps", d(&a.optim.eps), d(&b.optim.eps));
        check("optim.schedule", d(&a.optim.schedule), d(&b.optim.schedule));
        check(
            "optim.warmup_steps",
            d(&a.optim.warmup_steps),
            d(&b.optim.warmup_steps),
        );
        check(
            "grpo.num_iterations",
            d(&a.grpo.num_iterations),
            d(&b.grpo.num_iterations),
        );
        if a.stages != b.stages {
            out.push("stage (the [[stage]] curriculum)".into());
        }
        out
    }

    /// `~/...` in the path keys as the shell would write it, from `HOME`: TOML does
    /// not expand it, and `output_dir = "~/runs"` made a directory named `~`.
    fn expand_home(&mut self) {
        let Some(home) = std::env::var_os("HOME").filter(|h| !h.is_empty()) else {
            return;
        };
        let expand = |p: &Path| -> Option<PathBuf> {
            let rest = p.strip_prefix("~").ok()?;
            Some(Path::new(&home).join(rest))
        };
        if let Some(p) = expand(&self.run.output_dir) {
            self.run.output_dir = p;
        }
        if let Some(p) = expand(Path::new(&self.model.name)) {
            self.model.name = p.display().to_string();
        }
        if let Some(p) = self.model.adapter.as_deref().and_then(expand) {
            self.model.adapter = Some(p);
        }
        if let Some(s) = self.sft.as_mut() {
            if let Some(p) = s.path.as_deref().and_then(expand) {
                s.path = Some(p);
            }
        }
    }

    /// Make the path keys absolute, resolved against the current directory (`base`):
    /// `run.output_dir` always, `model.name` when it names a local path (it exists, or
    /// `init_tiny` will create it, or it is written as a path) and not a Hub id or a
    /// `random:` shape. The run's config.toml then records where things are, so
    /// `train --resume RUN_DIR` works from any directory.
    pub fn resolve_paths(&mut self, base: &Path) {
        self.expand_home();
        let abs = |p: &Path| -> PathBuf {
            let joined = if p.is_absolute() {
                p.to_path_buf()
            } else {
                base.join(p)
            };
            lexical_normal(&std::path::absolute(&joined).unwrap_or(joined))
        };
        self.run.output_dir = abs(&self.run.output_dir);
        let name = self.model.name.trim();
        let p = Path::new(name);
        let local = !name.is_empty()
            && !name.starts_with("random:")
            && p.is_relative()
            && (base.join(p).exists()
                || self.model.init_tiny
                || matches!(
                    crate::model::load::ModelRef::parse(name),
                    Ok(crate::model::load::ModelRef::Local(_))
                ));
        if local {
            self.model.name = abs(p).display().to_string();
        }
        if let Some(a) = &self.model.adapter {
            self.model.adapter = Some(abs(a));
        }
        if let Some(p) = self.sft.as_mut().and_then(|s| s.path.as_mut()) {
            *p = abs(p);
        }
    }
}

/// `p` as the file system resolves it (absolute, symlinks followed), or lexically
/// absolute where it does not exist yet. A recorded `..` is then what the shell means by
/// it, whichever path (link or target) the run directory is reached by.
fn real_path(p: &Path) -> PathBuf {
    std::fs::canonicalize(p).unwrap_or_else(|_| {
        lexical_normal(&std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf()))
    })
}

/// `p` without `.` components and with each `..` taking off the component before it
/// (a recorded `../../.models/m.gguf` read from `runs/NAME/` names `.models/m.gguf`).
fn lexical_normal(p: &Path) -> PathBuf {
    use std::path::Component;
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir
                if matches!(out.components().next_back(), Some(Component::Normal(_))) =>
            {
                out.pop();
            }
            c => out.push(c.as_os_str()),
        }
    }
    out
}

/// `target` relative to `base` (both absolute): `None` when they share no root.
pub fn relative_path(target: &Path, base: &Path) -> Option<PathBuf> {
    use std::path::Component;
    if !target.is_absolute() || !base.is_absolute() {
        return None;
    }
    let t: Vec<Component> = target.components().collect();
    let b: Vec<Component> = base.components().collect();
    if t.first() != b.first() {
        return None;
    }
    let common = t.iter().zip(&b).take_while(|(x, y)| x == y).count();
    let mut out = PathBuf::new();
    for _ in common..b.len() {
        out.push("..");
    }
    for c in &t[common..] {
        out.push(c.as_os_str());
    }
    if out.as_os_str().is_empty() {
        out.push(".");
    }
    Some(out)
}

/// Put a file name and line on an error raised while building the environments of
/// `[env]` / `[env.options]` / `[stage.options.ENV]` from the config text `text` (read
/// from `origin`): the line assigning the option (or naming the environment) the
/// message quotes in backticks, else the line of the options table or of `[env]`.
pub fn locate_env_error(text: &str, origin: &str, e: &anyhow::Error) -> anyhow::Error {
    let msg = format!("{e:#}");
    let quoted: Vec<&str> = msg.split('`').skip(1).step_by(2).collect();
    let is_options = |h: &str| h == "env.options" || h.starts_with("stage.options");
    let mut current = String::new();
    let mut table_line = None;
    let mut key_line = None;
    for (i, line) in text.lines().enumerate() {
        if let Some(h) = header_name(line) {
            if table_line.is_none() && (is_options(&h) || h == "env") {
                table_line = Some(i + 1);
            }
            current = h;
            continue;
        }
        let Some((lhs, rhs)) = line.trim_start().split_once('=') else {
            continue;
        };
        let lhs = lhs.trim().trim_matches('"');
        let lhs = lhs.strip_prefix("options.").unwrap_or(lhs);
        let rhs = rhs.trim().trim_matches('"');
        let hit = (is_options(&current) || current == "env") && quoted.contains(&lhs)
            || (current == "env" && lhs == "name" && quoted.contains(&rhs));
        if hit && key_line.is_none() {
            key_line = Some(i + 1);
        }
    }
    match key_line.or(table_line) {
        Some(l) => anyhow!("{origin}: line {l}: {msg}"),
        None => anyhow!("{origin}: [env]: {msg}"),
    }
}

struct ValidationError {
    /// (section, key) the error is about, to find its line.
    key: Option<(String, String)>,
    message: String,
}

/// Turn a toml deserialisation error into "FILE: line N: message (in [section])".
fn de_error(src: &Source, e: &toml::de::Error) -> anyhow::Error {
    let msg = e.message().trim().to_string();
    match e.span() {
        Some(span) => {
            let (line, col) = line_col(src.text, span.start);
            let section = section_at(src.text, span.start);
            let what = src.text.get(span.clone()).unwrap_or("").trim();
            let key_note = if msg.starts_with("unknown field") || what.is_empty() {
                String::new()
            } else {
                format!(" (at `{}`)", truncate(what, 40))
            };
            let sec_note = match (&section, key_before(src.text, span.start)) {
                (Some(s), Some(k)) => format!(" in [{s}], key `{s}.{k}`"),
                (None, Some(k)) => format!(", key `{k}`"),
                (Some(s), None) => format!(" in [{s}]"),
                (None, None) => String::new(),
            };
            anyhow!(
                "{}: line {line}, column {col}{sec_note}: {msg}{key_note}",
                src.path
            )
        }
        None => anyhow!("{}: {msg}", src.path),
    }
}

/// The key assigned on the line of byte offset `pos`, when `pos` is in its value
/// (`loss_type = "bogus"` -> `loss_type`): a bad value's error then names its key.
fn key_before(text: &str, pos: usize) -> Option<String> {
    let pos = pos.min(text.len());
    let start = text[..pos].rfind('\n').map_or(0, |i| i + 1);
    let (key, _) = text[start..pos].split_once('=')?;
    let key = key.trim().trim_matches(|c| c == '"' || c == '\'');
    let plain = |c: char| c.is_ascii_alphanumeric() || "_-.".contains(c);
    (!key.is_empty() && key.chars().all(plain)).then(|| key.to_string())
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        format!("{}...", s.chars().take(n).collect::<String>())
    }
}

/// 1-based line and column of byte offset `pos`.
fn line_col(text: &str, pos: usize) -> (usize, usize) {
    let pos = pos.min(text.len());
    let before = &text.as_bytes()[..pos];
    let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
    let col = pos
        - before
            .iter()
            .rposition(|&b| b == b'\n')
            .map_or(0, |p| p + 1)
        + 1;
    (line, col)
}

/// The table header (`[x]` / `[[x]]`) in force at byte offset `pos`.
fn section_at(text: &str, pos: usize) -> Option<String> {
    let mut current = None;
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        if offset > pos {
            break;
        }
        if let Some(h) = header_name(line) {
            current = Some(h);
        }
        offset += line.len();
    }
    current
}

fn header_name(line: &str) -> Option<String> {
    let t = line.trim();
    if t.starts_with("[[") {
        let end = t.find("]]")?;
        Some(t[2..end].trim().to_string())
    } else if t.starts_with('[') {
        let end = t.find(']')?;
        Some(t[1..end].trim().to_string())
    } else {
        None
    }
}

/// 1-based line where `key` is assigned inside `[section]`, if written plainly.
/// Line (1-based) of the `i`-th `[[stage]]` header.
fn stage_line(text: &str, i: usize) -> Option<usize> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| l.trim() == "[[stage]]")
        .nth(i)
        .map(|(n, _)| n + 1)
}

fn find_key_line(text: &str, section: &str, key: &str) -> Option<usize> {
    let mut current = String::new();
    for (i, line) in text.lines().enumerate() {
        if let Some(h) = header_name(line) {
            current = h;
            continue;
        }
        let t = line.trim_start();
        let (lhs, _) = match t.split_once('=') {
            Some(x) => x,
            None => continue,
        };
        let lhs = lhs.trim().trim_matches('"');
        if (current == section && lhs == key)
            || (current.is_empty() && lhs == format!("{section}.{key}"))
        {
            return Some(i + 1);
        }
    }
    None
}

/// Apply one `section.key=value` override: the value is parsed as TOML
/// (`0.7`, `true`, `"x"`, `[1, 2]`), falling back to a plain string (`cuda:0`).
pub fn apply_set(table: &mut toml::Table, set: &str) -> Result<()> {
    let (path, raw) = set
        .split_once('=')
        .ok_or_else(|| anyhow!("--set `{set}`: expected section.key=value"))?;
    let path = path.trim();
    let raw = raw.trim();
    let parts: Vec<&str> = path.split('.').map(str::trim).collect();
    if parts.len() < 2 || parts.iter().any(|p| p.is_empty()) {
        bail!("--set `{set}`: expected section.key=value (e.g. grpo.temperature=0.7)");
    }
    let value = parse_set_value(raw);
    let digits = raw.strip_prefix(['+', '-']).unwrap_or(raw).replace('_', "");
    if value.is_str() && !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
        // TOML integers are i64; the string fallback would report "invalid type: string"
        bail!(
            "--set `{path}`: {raw} is out of range: integers are at most {}",
            i64::MAX
        );
    }
    let mut t = table;
    for (i, p) in parts[..parts.len() - 1].iter().enumerate() {
        let entry = t
            .entry(p.to_string())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        t = match entry {
            toml::Value::Table(tt) => tt,
            _ => bail!("--set `{set}`: `{}` is not a table", parts[..=i].join(".")),
        };
    }
    t.insert(parts[parts.len() - 1].to_string(), value);
    Ok(())
}

fn parse_set_value(raw: &str) -> toml::Value {
    match toml::from_str::<toml::Table>(&format!("v = {raw}")) {
        Ok(mut t) => t
            .remove("v")
            .unwrap_or_else(|| toml::Value::String(raw.to_string())),
        Err(_) => toml::Value::String(raw.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: &str = "[model]\nname = \"tiny\"\n[env]\nname = \"ticketmelt\"\n";

    #[test]
    fn recorded_paths_are_relative_to_the_run_directory_and_load_back() {
        let rel = |t: &str, b: &str| relative_path(Path::new(t), Path::new(b)).unwrap();
        assert_eq!(rel("/w/runs", "/w/runs/r"), PathBuf::from(".."));
        assert_eq!(
            rel("/w/.models/m.gguf", "/w/runs/r"),
            PathBuf::from("../../.models/m.gguf")
        );
        assert_eq!(rel("/w/runs/r/sft", "/w/runs/r"), PathBuf::from("sft"));
        assert_eq!(rel("/w/runs/r", "/w/runs/r"), PathBuf::from("."));
        assert!(relative_path(Path::new("runs"), Path::new("/w")).is_none());
        assert_eq!(
            lexical_normal(Path::new("/w/runs/r/../../.models/./m.gguf")),
            PathBuf::from("/w/.models/m.gguf")
        );
        // A run's config round-trips: written relative and marked, read back absolute.
        let d = tempfile::tempdir().unwrap();
        let base = std::path::absolute(d.path()).unwrap();
        std::fs::create_dir_all(base.join("m")).unwrap();
        let mut cfg = Config::from_toml_str(
            "[run]\nname = \"r\"\n[model]\nname = \"m\"\n[env]\nname = \"ticketmelt\"\n",
            "test",
            &[],
        )
        .unwrap();
        cfg.resolve_paths(&base);
        let run_dir = cfg.run_dir();
        std::fs::create_dir_all(&run_dir).unwrap();
        let text = cfg.to_run_toml(&run_dir).unwrap();
        assert!(!text.contains(base.to_str().unwrap()), "{text}");
        assert!(
            text.contains("paths_relative_to = \"config_dir\""),
            "{text}"
        );
        std::fs::write(run_dir.join("config.toml"), &text).unwrap();
        let back = Config::load(&run_dir.join("config.toml"), &[]).unwrap();
        assert_eq!(back.run.output_dir, base.join("runs"));
        assert_eq!(back.model.name, base.join("m").display().to_string());
        assert_eq!(back.run.paths_relative_to, PathsBase::Cwd);
        assert_eq!(real_path(&back.run_dir()), real_path(&run_dir));
        // An override's path is the current directory's, not the run directory's.
        let set = ["model.adapter=elsewhere/a".to_string()];
        let back = Config::load(&run_dir.join("config.toml"), &set).unwrap();
        assert_eq!(
            back.model.adapter.as_deref(),
            Some(Path::new("elsewhere/a"))
        );
        assert_eq!(back.model.name, base.join("m").display().to_string());
    }

    /// A run directory reached through a symlink records paths that hold from its real
    /// location too (`..` is taken as the file system takes it).
    #[cfg(unix)]
    #[test]
    fn recorded_paths_hold_through_a_symlinked_run_directory() {
        let d = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(d.path()).unwrap();
        std::fs::create_dir_all(base.join("m")).unwrap();
        std::fs::create_dir_all(base.join("disk/deep/runs")).unwrap();
        std::os::unix::fs::symlink(base.join("disk/deep/runs"), base.join("runs")).unwrap();
        let text = "[run]\nname = \"r\"\n[model]\nname = \"m\"\n[env]\nname = \"ticketmelt\"\n";
        let mut cfg = Config::from_toml_str(text, "test", &[]).unwrap();
        cfg.resolve_paths(&base);
        let run_dir = cfg.run_dir();
        std::fs::create_dir_all(&run_dir).unwrap();
        let recorded = cfg.to_run_toml(&run_dir).unwrap();
        std::fs::write(run_dir.join("config.toml"), recorded).unwrap();
        let real_dir = base.join("disk/deep/runs/r");
        for dir in [&run_dir, &real_dir] {
            let back = Config::load(&dir.join("config.toml"), &[]).unwrap();
            assert_eq!(
                back.model.name,
                base.join("m").display().to_string(),
                "{dir:?}"
            );
            assert_eq!(real_path(&back.run_dir()), real_dir, "{dir:?}");
        }
    }

    #[test]
    fn defaults_match_trl() {
        let c = Config::from_toml_str(MIN, "t.toml", &[]).unwrap();
        assert_eq!(c.grpo.num_generations, 8);
        assert_eq!(c.grpo.temperature, 1.0);
        assert_eq!(c.grpo.beta, 0.0);
        assert_eq!(c.grpo.epsilon, 0.2);
        assert_eq!(c.grpo.epsilon_high(), 0.2);
        assert_eq!(c.grpo.loss_type, LossType::Dapo);
        assert_eq!(c.grpo.scale_rewards, ScaleRewards::Group);
        assert_eq!(c.optim.learning_rate, 1e-6);
        assert_eq!(c.optim.max_grad_norm, 1.0);
        assert_eq!(c.optim.betas, [0.9, 0.999]);
    }

    #[test]
    fn base_dtype_parses_and_bad_values_name_the_key() {
        let c = Config::from_toml_str(MIN, "t.toml", &[]).unwrap();
        assert_eq!(c.model.base_dtype, None);
        let t = MIN.replace("[env]", "base_dtype = \"bf16\"\n[env]");
        let c = Config::from_toml_str(&t, "t.toml", &[]).unwrap();
        assert_eq!(c.model.base_dtype, Some(DTypeName::Bf16));
        let t = MIN.replace("[env]", "base_dtype = \"q4\"\n[env]");
        let e = format!(
            "{:#}",
            Config::from_toml_str(&t, "t.toml", &[]).unwrap_err()
        );
        assert!(e.contains("t.toml: line 3") && e.contains("q4"), "{e}");
    }

    #[test]
    fn line_col_and_sections() {
        let t = "a = 1\n[x]\nb = 2\n";
        assert_eq!(line_col(t, 0), (1, 1));
        assert_eq!(line_col(t, 10), (3, 1));
        assert_eq!(section_at(t, 10).as_deref(), Some("x"));
        assert_eq!(find_key_line(t, "x", "b"), Some(3));
        assert_eq!(key_before(t, 14).as_deref(), Some("b"));
        assert_eq!(key_before(t, 10), None);
    }

    /// Issue #31, item 24: the hint names what works (`tiny` alone is not a model).
    #[test]
    fn a_missing_model_name_suggests_what_works() {
        let e = Config::from_toml_str("[env]\nname = \"ticketmelt\"\n", "t.toml", &[]).unwrap_err();
        let e = format!("{e:#}");
        assert!(
            e.contains("model.init_tiny = true") && !e.contains("`tiny`"),
            "{e}"
        );
    }

    #[test]
    fn home_is_expanded_and_insane_learning_rates_refused() {
        let Some(home) = std::env::var_os("HOME").filter(|h| !h.is_empty()) else {
            return;
        };
        let t = MIN.replace("[model]", "[run]\noutput_dir = \"~/runs\"\n[model]");
        let mut c = Config::from_toml_str(&t, "c.toml", &[]).unwrap();
        c.resolve_paths(Path::new("/w"));
        assert_eq!(c.run.output_dir, Path::new(&home).join("runs"));
        let t = MIN.replace("[env]", "[optim]\nlearning_rate = 1e30\n[env]");
        let e = Config::from_toml_str(&t, "c.toml", &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains("learning_rate") && e.contains("(0, 1]"), "{e}");
    }

    /// A bad value names its key, not only its line and section (issue #31, item 21).
    #[test]
    fn a_bad_enum_value_names_its_key() {
        let t = MIN.replace("[env]", "[grpo]\nloss_type = \"bogus_loss\"\n[env]");
        let e = Config::from_toml_str(&t, "c.toml", &[])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("key `grpo.loss_type`") && e.contains("bogus_loss"),
            "{e}"
        );
    }

    #[test]
    fn set_values() {
        assert_eq!(parse_set_value("0.7"), toml::Value::Float(0.7));
        assert_eq!(
            parse_set_value("cuda:0"),
            toml::Value::String("cuda:0".into())
        );
        assert_eq!(
            parse_set_value("\"x y\""),
            toml::Value::String("x y".into())
        );
        assert_eq!(parse_set_value("true"), toml::Value::Boolean(true));
        let mut t = toml::Table::new();
        let e = apply_set(&mut t, "run.seed=99999999999999999999").unwrap_err();
        assert!(e.to_string().contains("run.seed") && e.to_string().contains("out of range"));
        apply_set(&mut t, "run.name=007x").unwrap();
        // The same integer in a file names its line and key, not "invalid type".
        let e = Config::from_toml_str("[run]\nsteps = 99999999999999999999\n", "big.toml", &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains("big.toml") && e.contains("line 2"), "{e}");
        assert!(e.contains("run.steps") && e.contains("too large"), "{e}");
    }
}

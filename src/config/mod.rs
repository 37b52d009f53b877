//! The TOML run configuration: schema (unknown keys rejected with key and line),
//! validation and `--set section.key=value` overrides.
//!
//! Sections: `[run]`, `[model]`, `[lora]`, `[grpo]`, `[optim]`, `[env]` (+ the free
//! table `[env.options]`, validated by the environment itself) and `[[stage]]` curriculum
//! tables ([`stage`]), and `[sft]` for supervised fine-tuning ([`sft`]).
//!
//! Each section's schema and its own checks live in one file: `run.rs` (`[run]`),
//! `model.rs` (`[model]`, `[lora]`), `grpo.rs`, `optim.rs`, `env.rs`, [`stage`] and
//! [`sft`]. This file holds the whole [`Config`] (loading, writing, what it derives);
//! `validate.rs` runs the section checks in order with the few that span sections;
//! `locate.rs` puts a file, line and key on errors and applies `--set`; `paths.rs`
//! resolves and records the path keys; `resume.rs` is what a resume may not change.
//! `doc.rs` keeps the schema's doc comments, from which `reference.rs` makes the
//! configuration reference (`concord docs config`).
//!
//! Defaults follow TRL's `GRPOConfig` / transformers' `TrainingArguments` (see
//! `shared/design/grpo.md`) so that a user moving from Python finds the same numbers.
pub mod doc;
mod env;
mod grpo;
mod locate;
mod model;
mod optim;
mod paths;
pub mod reference;
mod resume;
mod run;
pub mod sft;
pub mod stage;
mod validate;

pub use env::{ContinueWith, EnvConfig, EnvMode};
pub use grpo::{
    GrpoConfig, ImportanceSamplingLevel, ImportanceSamplingMode, LossType,
    MultiObjectiveAggregation, ScaleRewards,
};
pub use locate::{apply_set, locate_env_error};
pub use model::{
    parse_device, parse_device_name, BaseDTypeName, DTypeName, DeviceName, LoraSection, ModelConfig,
};
pub use optim::{OptimConfig, Schedule};
pub use paths::relative_path;
pub use resume::{FrozenRecord, FROZEN_ON_RESUME};
pub use run::{PathsBase, ReportTo, RunConfig};

use anyhow::{anyhow, Context, Result};
use doc::documented;
use locate::{de_error, locate_stage_error, Source};
use paths::real_path;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

documented! {
/// The whole run configuration.
///
/// A run is one TOML file of the sections below. Unknown keys are rejected with the
/// key and its line, values are range-checked, and `--set section.key=value` overrides
/// any key (the value is parsed as TOML, bare words as strings). Defaults follow TRL's
/// `GRPOConfig` and `TrainingArguments`, so a user moving from Python finds the same
/// numbers.
///
/// The resolved config is written to `RUN_DIR/config.toml` with its relative paths
/// (`run.output_dir`, `model.adapter`, `sft.path`, `model.name` when it is a local
/// path, and environment options that name files, such as a dataset's `path`) rewritten relative to the run directory and marked so (`run.paths_relative_to
/// = "config_dir"`): the file names no path of the machine it ran on, and `--resume
/// RUN_DIR` or `--config RUN_DIR/config.toml` works from any directory.
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
}

/// `skip_serializing_if` of the count keys whose 0 means "off".
fn is_zero(n: &usize) -> bool {
    *n == 0
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
        let src = Source {
            path: &origin,
            text: &text,
        };
        let raw: Config = toml::from_str(&text).map_err(|e| de_error(&src, &e))?;
        if raw.run.paths_relative_to != PathsBase::ConfigDir {
            return Self::from_toml_str(&text, &origin, sets);
        }
        // Resolved before validating: checking `[env.options]` opens the files they
        // name (a dataset), which are relative to this directory, not the current one.
        let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
        let dir = real_path(dir.unwrap_or(Path::new(".")));
        let mut file = raw;
        file.resolve_paths(&dir);
        file.run.paths_relative_to = PathsBase::Cwd;
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
        c.map_env_paths(|p| rel(p));
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
        cfg.validate().map_err(|e| e.locate(text, origin, sets))?;
        stage::check(&cfg).map_err(|e| locate_stage_error(text, origin, &cfg.stages, &e))?;
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
        self.validate().map_err(|e| anyhow!("{}", e.message()))
    }

    /// The resolved configuration as TOML (written to `runs/NAME/config.toml`).
    pub fn to_toml_string(&self) -> Result<String> {
        toml::to_string(self).context("serialising config")
    }

    /// The model to load for training or evaluation: `[model]` with `[lora]`'s adapter
    /// (or `model.adapter`).
    pub fn model_spec(&self) -> Result<crate::model::load::ModelSpec> {
        use crate::model::load::ModelSpec;
        Ok(ModelSpec {
            dtype: Some(self.model.dtype.to_candle()),
            base_dtype: self.model.base_dtype.map(|d| d.to_base()),
            lora: Some(self.lora_config()),
            adapter: self.model.adapter.clone(),
            init_tiny: self.model.init_tiny,
            chat_template_kwargs: self.model.template_kwargs()?,
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

    /// `<output_dir>/<name>`.
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
    /// `run.eval_episodes`, and the episodes of one `concord eval` or `envs baseline`:
    /// more adds no precision (a 95% interval of a rate is at most 0.006 wide there)
    /// and costs hours and gigabytes of transcripts.
    pub const MAX_EVAL_EPISODES: usize = 100_000;
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

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: &str = "[model]\nname = \"tiny\"\n[env]\nname = \"ticketmelt\"\n";

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
        assert_eq!(c.model.base_dtype, Some(BaseDTypeName::Bf16));
        for (v, want) in [
            ("q8_0", BaseDTypeName::Q8_0),
            ("q4_k", BaseDTypeName::Q4K),
            ("gguf", BaseDTypeName::Gguf),
        ] {
            let t = MIN.replace("[env]", &format!("base_dtype = \"{v}\"\n[env]"));
            let c = Config::from_toml_str(&t, "t.toml", &[]).unwrap();
            assert_eq!(c.model.base_dtype, Some(want));
        }
        let t = MIN.replace("[env]", "base_dtype = \"q4\"\n[env]");
        let e = format!(
            "{:#}",
            Config::from_toml_str(&t, "t.toml", &[]).unwrap_err()
        );
        assert!(e.contains("t.toml: line 3") && e.contains("q4"), "{e}");
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
}

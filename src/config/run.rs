//! `[run]`: the run's name, output directory, length, cadence and metric sinks.
use super::doc::documented;
use super::limits;
use super::locate::ValidationError;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

documented! {
/// The run's name and directory, its length, how often it saves and evaluates, and
/// where its metrics go.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RunConfig {
    /// The run directory's name: output goes to `<output_dir>/<name>/`. A plain
    /// directory name, not a path.
    pub name: String,
    /// The directory that holds the run directories.
    /// TRL: `output_dir`.
    pub output_dir: PathBuf,
    /// Seed of the run: the LoRA initialisation, and through `mix(seed, step)` every
    /// random stream of a step (prompts, sampling, dropout masks), so a resumed run
    /// writes the same rows as an uninterrupted one.
    /// TRL: `seed`.
    pub seed: u64,
    /// Optimiser steps.
    /// Range: 1 to [`limits::MAX_STEPS`].
    /// TRL: `max_steps`.
    pub steps: usize,
    /// Write `checkpoint-STEP/` every this many steps (0: only at the end).
    /// TRL: `save_steps`.
    pub save_every: usize,
    /// Completions per step written to `samples.jsonl`, with their stage, environment
    /// and reward components.
    /// TRL: `num_completions_to_print`.
    pub log_samples: usize,
    /// Keep at most this many checkpoints (0: keep all).
    /// TRL: `save_total_limit`.
    pub save_total_limit: usize,
    /// Play held-out episodes with the current adapter before the first GRPO step
    /// (row `step = 0`: the warm start, or the base model), every this many steps and
    /// at the last step, through `concord eval`'s driver and sampling, appending a row
    /// per environment to `eval_log.csv` (0: never).
    /// TRL: `eval_steps` (with `eval_strategy = "steps"`).
    pub eval_every: usize,
    /// Held-out episodes per environment in each of those evaluations: the first ones
    /// of `concord eval`'s set.
    /// Range: at least 1 when `eval_every` > 0, at most 100000.
    pub eval_episodes: usize,
    /// Where the per-step metrics go besides `training_log.csv`, which is always
    /// written; `["csv", "tensorboard"]` also writes TensorBoard events.
    /// TRL: `report_to`.
    pub report_to: Vec<ReportTo>,
    /// What the relative paths of this file are relative to. A run records its
    /// config.toml with `config_dir`, so that the file names no path of the machine it
    /// ran on and the run directory can be moved.
    #[serde(skip_serializing_if = "PathsBase::is_cwd")]
    pub paths_relative_to: PathsBase,
}
}

documented! {
/// A metrics sink of [`RunConfig::report_to`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReportTo {
    /// `training_log.csv`, one row per step (always written).
    Csv,
    /// TensorBoard event files under `RUN_DIR/tensorboard/` (a warm start's under
    /// `RUN_DIR/sft/tensorboard/`): every numeric column as `train/<column>`, every
    /// held-out evaluation as `eval/<env>/<column>`.
    Tensorboard,
}
}

impl RunConfig {
    /// `report_to` names `"tensorboard"`.
    pub fn tensorboard(&self) -> bool {
        self.report_to.contains(&ReportTo::Tensorboard)
    }
}

documented! {
/// See [`RunConfig::paths_relative_to`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum PathsBase {
    /// The current directory (a config you write).
    #[default]
    Cwd,
    /// The directory of the config file (a run's own directory).
    ConfigDir,
}
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

fn err(key: &str, msg: impl std::fmt::Display) -> ValidationError {
    ValidationError::at("run", key, msg)
}

impl RunConfig {
    /// The name (a directory) and the length.
    pub(super) fn check(&self) -> Result<(), ValidationError> {
        let name = self.name.trim();
        if name.is_empty() || self.name.contains(['/', '\\', '\0']) || name == "." || name == ".." {
            return Err(err(
                "name",
                format!("`{}` must be a plain non-empty directory name", self.name),
            ));
        }
        if self.steps == 0 {
            return Err(err("steps", "must be >= 1"));
        }
        if self.steps > limits::MAX_STEPS {
            return Err(err(
                "steps",
                format!("{} exceeds the limit of {}", self.steps, limits::MAX_STEPS),
            ));
        }
        Ok(())
    }

    /// Held-out evaluation has episodes to play.
    pub(super) fn check_eval(&self) -> Result<(), ValidationError> {
        if self.eval_every > 0 && self.eval_episodes == 0 {
            return Err(err(
                "eval_episodes",
                "0 with eval_every > 0: give the held-out episodes to play (>= 1)",
            ));
        }
        let max = super::limits::MAX_EVAL_EPISODES;
        if self.eval_episodes > max {
            return Err(err(
                "eval_episodes",
                format!("{} is more than {max}", self.eval_episodes),
            ));
        }
        Ok(())
    }
}

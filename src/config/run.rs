//! `[run]`: the run's name, output directory, length, cadence and metric sinks.
use super::limits;
use super::locate::ValidationError;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

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
        Ok(())
    }
}

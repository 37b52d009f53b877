//! `concord train`.
use std::path::PathBuf;

#[derive(clap::Args, Debug)]
pub struct TrainArgs {
    /// The run configuration (TOML).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Override a key: `--set grpo.temperature=0.7` (repeatable).
    #[arg(long = "set", value_name = "SECTION.KEY=VALUE")]
    pub sets: Vec<String>,
    /// Continue the run in this directory from its latest checkpoint (uses its
    /// config.toml unless --config is given). Keys that shape the adapter, the optimizer
    /// state or the schedule cannot change.
    #[arg(long, conflicts_with = "overwrite")]
    pub resume: Option<PathBuf>,
    /// Replace an earlier run in the run directory: its logs, config, adapter, plots
    /// and checkpoints are removed first. Without it, train refuses a directory that
    /// holds a run.
    #[arg(long)]
    pub overwrite: bool,
}

pub fn run(a: TrainArgs) -> anyhow::Result<()> {
    crate::train::run(crate::train::TrainOptions {
        config: a.config,
        sets: a.sets,
        resume: a.resume,
        overwrite: a.overwrite,
    })
}

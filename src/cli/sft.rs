//! `concord sft`.
use std::path::PathBuf;

#[derive(clap::Args, Debug)]
pub struct SftArgs {
    /// The run configuration (TOML) with an `[sft]` section.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Override a key: `--set sft.steps=50` (repeatable).
    #[arg(long = "set", value_name = "SECTION.KEY=VALUE")]
    pub sets: Vec<String>,
    /// Continue the SFT run in this directory from its latest checkpoint (uses its
    /// config.toml unless --config is given).
    #[arg(long, conflicts_with = "overwrite")]
    pub resume: Option<PathBuf>,
    /// Replace an earlier run in the run directory (its logs, config, adapter and
    /// checkpoints are removed first).
    #[arg(long)]
    pub overwrite: bool,
}

pub fn run(a: SftArgs) -> anyhow::Result<()> {
    crate::train::sft::run(crate::train::sft::SftOptions {
        config: a.config,
        sets: a.sets,
        resume: a.resume,
        overwrite: a.overwrite,
    })
}

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
    /// config.toml unless --config is given).
    #[arg(long)]
    pub resume: Option<PathBuf>,
}

pub fn run(a: TrainArgs) -> anyhow::Result<()> {
    crate::grpo::trainer::run_train(crate::grpo::trainer::TrainOptions {
        config: a.config,
        sets: a.sets,
        resume: a.resume,
    })
}

//! `concord model ...` and `concord score` command handlers.
use clap::{Args, Subcommand};

#[derive(Args)]
pub struct ModelArgs {
    #[command(subcommand)]
    pub command: ModelCommand,
}

#[derive(Subcommand)]
pub enum ModelCommand {
    /// Write a random-weight Qwen2 checkpoint (real architecture) with a tokenizer.
    InitTiny {
        #[arg(long)]
        out: std::path::PathBuf,
    },
}

#[derive(Args)]
pub struct ScoreArgs {
    /// Local model directory or Hub id (`Qwen/Qwen2.5-0.5B-Instruct[@revision]`).
    #[arg(long)]
    pub model: String,
}

pub fn run_model(args: ModelArgs) -> anyhow::Result<()> {
    match args.command {
        ModelCommand::InitTiny { out } => {
            anyhow::bail!("init-tiny into {} is not built yet", out.display())
        }
    }
}

pub fn run_score(args: ScoreArgs) -> anyhow::Result<()> {
    anyhow::bail!("score for {} is not built yet", args.model)
}

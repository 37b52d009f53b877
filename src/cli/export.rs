//! `concord export`.
use clap::Args;
use std::path::PathBuf;

#[derive(Args, Debug, Clone)]
pub struct ExportArgs {
    /// The run directory (holds adapter_model.safetensors and adapter_config.json).
    pub run_dir: PathBuf,
    /// Target model repo, `user/name` or `org/name`; created when missing.
    #[arg(long)]
    pub repo: String,
    /// Create the repo as private (an existing repo keeps its visibility).
    #[arg(long)]
    pub private: bool,
    /// Branch to commit to; created when it is not `main` and does not exist.
    #[arg(long, default_value = "main")]
    pub revision: String,
    /// Commit summary.
    #[arg(long, default_value = "Upload Concord GRPO adapter")]
    pub message: String,
    /// Write the model card and list what would be uploaded; no network, no token.
    #[arg(long)]
    pub dry_run: bool,
}

pub fn run(a: ExportArgs) -> anyhow::Result<()> {
    let opts = crate::hub::ExportOptions {
        run_dir: a.run_dir,
        repo: a.repo,
        private: a.private,
        revision: a.revision,
        message: a.message,
    };
    crate::hub::run_export(&opts, a.dry_run)
}

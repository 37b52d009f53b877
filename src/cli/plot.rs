//! `concord plot`.
use anyhow::Context;
use std::path::PathBuf;

#[derive(clap::Args, Debug, Clone)]
pub struct PlotArgs {
    /// Run directory (holds training_log.csv, and eval.json after `concord eval`).
    pub run_dir: PathBuf,
    /// Rolling-mean window, in steps.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    pub window: u64,
}

/// Draw what the run directory allows and print the written paths.
pub fn run(args: PlotArgs) -> anyhow::Result<()> {
    let window = usize::try_from(args.window).context("--window is too large")?;
    for p in crate::plot::plot_run(&args.run_dir, window)? {
        crate::say!("{}", p.display());
    }
    Ok(())
}

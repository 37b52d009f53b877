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
    /// Held-out episodes the reference policies (best constant, heuristic) play for
    /// `learning_curve.png`, when the run directory has no `references.json` yet
    /// (0: draw the curve without them).
    #[arg(long, default_value_t = 200)]
    pub reference_episodes: usize,
}

/// Draw what the run directory allows and print the written paths.
pub fn run(args: PlotArgs) -> anyhow::Result<()> {
    let window = usize::try_from(args.window).context("--window is too large")?;
    for p in crate::plot::plot_run(&args.run_dir, window)? {
        crate::say!("{}", p.display());
    }
    let eval_log = args.run_dir.join(crate::run::log::EVAL_LOG);
    if eval_log.exists() {
        let refs =
            crate::eval::references::learning_curve_lines(&args.run_dir, args.reference_episodes)?;
        if let Some(p) = crate::plot::plot_learning_curve(&args.run_dir, &refs)? {
            crate::say!("{}", p.display());
        }
    }
    Ok(())
}

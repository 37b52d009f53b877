//! The `concord` command line. Thin: every clap type lives here, one file per command,
//! and each command calls one library entry function. No library module knows clap.
mod bench;
pub mod generate;
pub mod model;
pub mod score;

pub use bench::{BenchArgs, BenchCommand};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "concord",
    version,
    about = "GRPO training of LLMs on multi-agent coordination games"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Inspect, play and benchmark the built-in environments.
    Envs(crate::envs::cli::EnvsArgs),
    /// Create model checkpoints (`model init-tiny`).
    Model(model::ModelArgs),
    /// Log-probabilities of a completion given a chat prompt (JSON).
    Score(score::ScoreArgs),
    /// Sample completions for chat prompts (G per prompt; `--prompts FILE.jsonl` batches).
    Generate(generate::GenerateArgs),
    /// GRPO training: `concord train --config F [--set k=v]... [--resume DIR]`.
    Train(crate::grpo::trainer::TrainArgs),
    /// Play held-out episodes: reward components, win rates, 95% CIs (`--compare`: base vs adapter).
    Eval(crate::eval::EvalArgs),
    /// Benchmarks (`bench sample`, `bench train`).
    Bench(bench::BenchArgs),
    /// Draw reward_curve.png, components.png (and before_after.png after `eval --compare`) for a run directory.
    Plot(crate::plot::PlotArgs),
    /// Upload a run's adapter, logs, plots and a model card to the Hugging Face Hub.
    Export(crate::hub::ExportArgs),
}

pub fn main() -> i32 {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("error: {e:#}");
            1
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Envs(args) => crate::envs::cli::run(args),
        Command::Model(args) => model::run(args),
        Command::Score(args) => score::run(args),
        Command::Generate(args) => generate::run(args),
        Command::Train(args) => crate::grpo::trainer::run_train(args),
        Command::Eval(args) => crate::eval::run_eval(args),
        Command::Bench(args) => bench::run(args),
        Command::Plot(args) => crate::plot::run_plot(args),
        Command::Export(args) => crate::hub::run_export(args),
    }
}

//! The `concord` command line. Thin: every clap type lives here, one file per command,
//! and each command calls one library entry function. No library module knows clap.
mod bench;
mod envs;
mod eval;
mod export;
pub mod generate;
pub mod model;
mod plot;
pub mod score;
mod train;

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
    Envs(envs::EnvsArgs),
    /// Create model checkpoints (`model init-tiny`).
    Model(model::ModelArgs),
    /// Log-probabilities of a completion given a chat prompt (JSON).
    Score(score::ScoreArgs),
    /// Sample completions for chat prompts (G per prompt; `--prompts FILE.jsonl` batches).
    Generate(generate::GenerateArgs),
    /// GRPO training: `concord train --config F [--set k=v]... [--resume DIR]`.
    Train(train::TrainArgs),
    /// Play held-out episodes: reward components, win rates, 95% CIs (`--compare`: base vs adapter).
    Eval(eval::EvalArgs),
    /// Benchmarks (`bench sample`, `bench train`).
    Bench(bench::BenchArgs),
    /// Draw reward_curve.png, components.png (and before_after.png after `eval --compare`) for a run directory.
    Plot(plot::PlotArgs),
    /// Upload a run's adapter, logs, plots and a model card to the Hugging Face Hub.
    Export(export::ExportArgs),
}

/// A count flag that must be at least 1 (`--batch 0`, `--episodes 0` are refused by
/// the parser, before anything runs).
pub(crate) fn positive(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(format!("{e}")),
    }
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
        Command::Envs(args) => envs::run(args),
        Command::Model(args) => model::run(args),
        Command::Score(args) => score::run(args),
        Command::Generate(args) => generate::run(args),
        Command::Train(args) => train::run(args),
        Command::Eval(args) => eval::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Plot(args) => plot::run(args),
        Command::Export(args) => export::run(args),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    /// Every argument of every subcommand has a description, and no rustdoc link
    /// syntax leaks into the help.
    #[test]
    fn every_argument_is_described() {
        fn walk(cmd: &clap::Command, path: &str, bad: &mut Vec<String>) {
            for a in cmd.get_arguments() {
                let id = a.get_id().as_str();
                if id == "help" || id == "version" {
                    continue;
                }
                let help = a
                    .get_long_help()
                    .or(a.get_help())
                    .map(|h| h.to_string())
                    .unwrap_or_default();
                if help.trim().is_empty() {
                    bad.push(format!("{path} {id}: no description"));
                }
                if help.contains("[`") {
                    bad.push(format!("{path} {id}: rustdoc link in `{help}`"));
                }
                for v in a.get_possible_values() {
                    let h = v.get_help().map(|h| h.to_string()).unwrap_or_default();
                    if h.contains("[`") {
                        bad.push(format!("{path} {id}={}: rustdoc link", v.get_name()));
                    }
                }
            }
            let about = cmd
                .get_long_about()
                .or(cmd.get_about())
                .map(|h| h.to_string())
                .unwrap_or_default();
            if about.contains("[`") {
                bad.push(format!("{path}: rustdoc link in `{about}`"));
            }
            for sub in cmd.get_subcommands() {
                if sub.get_name() != "help" {
                    walk(sub, &format!("{path} {}", sub.get_name()), bad);
                }
            }
        }
        let mut bad = Vec::new();
        walk(&Cli::command(), "concord", &mut bad);
        assert!(bad.is_empty(), "{}", bad.join("\n"));
    }
}

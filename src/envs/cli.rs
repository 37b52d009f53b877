//! `concord envs` subcommands.
use clap::{Args, Subcommand};

#[derive(Args)]
pub struct EnvsArgs {
    #[command(subcommand)]
    pub command: EnvsCommand,
}

#[derive(Subcommand)]
pub enum EnvsCommand {
    /// List the registered environments.
    List,
    /// Exact reachable state graph of merge_ring (`--agents N [--materialize] --json`).
    Graph(super::merge_ring::GraphArgs),
}

pub fn run(args: EnvsArgs) -> anyhow::Result<()> {
    match args.command {
        EnvsCommand::List => {
            for e in super::REGISTRY {
                println!("{:<12} {}", e.name, e.summary);
            }
            Ok(())
        }
        EnvsCommand::Graph(a) => super::merge_ring::run_graph(a),
    }
}

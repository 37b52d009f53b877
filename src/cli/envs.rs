//! `concord envs`: inspect, play and benchmark the built-in environments. Generic over
//! the registry: every environment [`crate::envs::create`] builds gets `describe`,
//! `play`, `baseline` and `bench`. Each subcommand calls one function of
//! [`crate::envs::tools`] (or the merge_ring graph).
use crate::envs::merge_ring::graph::{self, GraphOptions};
use crate::envs::tools::{self, BaselineOptions, PlayOptions};
use crate::envs::Options;
use clap::{Args, Subcommand};

#[derive(Args)]
pub struct EnvsArgs {
    #[command(subcommand)]
    pub command: EnvsCommand,
}

/// Options shared by the subcommands that build an environment.
#[derive(Args, Clone, Debug, Default)]
pub struct EnvOpts {
    /// Rules preset (sets the `preset` option, e.g. `classic` or `default`).
    #[arg(long)]
    pub preset: Option<String>,
    /// Extra option `KEY=VALUE` (VALUE in TOML syntax; bare words are strings). Repeatable.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
}

impl EnvOpts {
    pub fn options(&self) -> anyhow::Result<Options> {
        tools::options_from_flags(self.preset.as_deref(), &self.set)
    }
}

#[derive(Subcommand)]
pub enum EnvsCommand {
    /// List the registered environments.
    List,
    /// Rules, actions, rewards and options of an environment.
    Describe {
        /// Environment name (see `concord envs list`).
        name: String,
        #[command(flatten)]
        opts: EnvOpts,
    },
    /// Play one episode and print a readable transcript.
    Play {
        /// Environment name (see `concord envs list`).
        name: String,
        /// Episode seed.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Scripted policy for the policy seats, or `human` (actions from stdin).
        /// Default: the environment's continuation policy.
        #[arg(long)]
        policy: Option<String>,
        /// Also print every policy seat's full prompt each step.
        #[arg(long)]
        prompts: bool,
        /// Print the JSON transcript at the end.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        opts: EnvOpts,
    },
    /// Win rates of every scripted policy against every opponent pool.
    Baseline {
        /// Environment name (see `concord envs list`).
        name: String,
        /// Episodes per policy x pool row (>= 1).
        #[arg(long, default_value_t = 2000, value_parser = super::episodes)]
        episodes: usize,
        /// First episode seed (episodes use seeds first..first+N).
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Only these policies (repeatable); default all.
        #[arg(long)]
        policy: Vec<String>,
        /// Only these pools (repeatable); default all.
        #[arg(long)]
        pool: Vec<String>,
        /// Print the rows as JSON instead of a markdown table.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        opts: EnvOpts,
    },
    /// Single-threaded episodes/s, without and with prompt rendering (per second of the
    /// benchmark thread's CPU time; wall-clock numbers alongside).
    Bench {
        /// Environment name (see `concord envs list`).
        name: String,
        /// CPU seconds per measurement (at most a day).
        #[arg(long, default_value_t = 2.0, value_parser = super::seconds)]
        secs: f64,
        /// Print the result as one JSON object.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        opts: EnvOpts,
    },
    /// Convert an incident export to a scenario file
    /// (`concord envs import postmortem --from pagerduty FILE.json --out SCENARIO.json`).
    Import {
        /// Environment name (only `postmortem` imports).
        name: String,
        /// Export format: `pagerduty`.
        #[arg(long)]
        from: String,
        /// The export (JSON).
        file: std::path::PathBuf,
        /// Where to write the scenario JSON (use it with `--set files=[\"PATH\"]`).
        #[arg(long)]
        out: std::path::PathBuf,
    },
    /// Exact reachable state graph of merge_ring (`--agents N [--materialize] --json`).
    Graph(GraphArgs),
}

/// `concord envs graph merge_ring --agents N [--materialize] [--json]`.
#[derive(Args, Debug, Clone)]
pub struct GraphArgs {
    /// Environment name (only `merge_ring` has an exact graph).
    pub env: String,
    /// Number of vehicles (even, 2..=10; n = 10 takes about 15 s, each 2 more about 80x
    /// longer, so larger rings are refused).
    #[arg(long, default_value_t = 4)]
    pub agents: usize,
    /// Materialise the edge table even above 6 vehicles (refused above a safe size).
    #[arg(long)]
    pub materialize: bool,
    /// Print `{"agents":N,"states":S,"groups":G,"seconds":T}`.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: EnvsArgs) -> anyhow::Result<()> {
    match args.command {
        EnvsCommand::List => {
            crate::say_raw!("{}", tools::list());
            Ok(())
        }
        EnvsCommand::Describe { name, opts } => {
            crate::say!("{}", tools::describe(&name, &opts.options()?)?);
            Ok(())
        }
        EnvsCommand::Play {
            name,
            seed,
            policy,
            prompts,
            json,
            opts,
        } => tools::play(
            &name,
            &opts.options()?,
            &PlayOptions {
                seed,
                policy,
                prompts,
                json,
            },
        ),
        EnvsCommand::Baseline {
            name,
            episodes,
            seed,
            policy,
            pool,
            json,
            opts,
        } => tools::baseline(
            &name,
            &opts.options()?,
            &BaselineOptions {
                episodes,
                first_seed: seed,
                policies: policy,
                pools: pool,
                json,
            },
        ),
        EnvsCommand::Bench {
            name,
            secs,
            json,
            opts,
        } => tools::bench(&name, &opts.options()?, secs, json),
        EnvsCommand::Import {
            name,
            from,
            file,
            out,
        } => {
            anyhow::ensure!(
                name == crate::envs::postmortem::NAME,
                "`concord envs import` supports only postmortem, got `{name}`"
            );
            let sc = crate::envs::postmortem::import::import_file(&from, &file, &out)?;
            crate::say!(
                "wrote {} ({}: {} alerts, {} timeline events, root cause {}); check its `gold` before training",
                out.display(),
                sc.id,
                sc.alerts.len(),
                sc.gold.timeline.len(),
                sc.gold.root_cause.service
            );
            Ok(())
        }
        EnvsCommand::Graph(a) => graph::run_graph(
            &a.env,
            &GraphOptions {
                agents: a.agents,
                materialize: a.materialize,
                json: a.json,
            },
        ),
    }
}

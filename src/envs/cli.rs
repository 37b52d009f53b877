//! `concord envs` subcommands. Generic over the registry: every environment built into
//! [`super::create`] gets `describe`, `play`, `baseline` and `bench` for free.
use super::{create, BaselineRow, EnvFactory, Options};
use clap::{Args, Subcommand};
use std::io::BufRead;

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
        let mut o = Options::new();
        if let Some(p) = &self.preset {
            o.insert("preset".into(), toml::Value::String(p.clone()));
        }
        for kv in &self.set {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| anyhow::anyhow!("--set expects KEY=VALUE, got `{kv}`"))?;
            let k = k.trim();
            let v = v.trim();
            let value = match toml::from_str::<toml::Table>(&format!("v = {v}")) {
                Ok(mut t) => t
                    .remove("v")
                    .unwrap_or_else(|| toml::Value::String(v.to_string())),
                Err(_) => toml::Value::String(v.to_string()),
            };
            o.insert(k.to_string(), value);
        }
        Ok(o)
    }
    fn factory(&self, name: &str) -> anyhow::Result<Box<dyn EnvFactory>> {
        create(name, &self.options()?)
    }
}

#[derive(Subcommand)]
pub enum EnvsCommand {
    /// List the registered environments.
    List,
    /// Rules, actions, rewards and options of an environment.
    Describe {
        name: String,
        #[command(flatten)]
        opts: EnvOpts,
    },
    /// Play one episode and print a readable transcript.
    Play {
        name: String,
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
        name: String,
        #[arg(long, default_value_t = 2000)]
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
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        opts: EnvOpts,
    },
    /// Single-threaded episodes/s, without and with prompt rendering (per second of the
    /// benchmark thread's CPU time; wall-clock numbers alongside).
    Bench {
        name: String,
        /// CPU seconds per measurement.
        #[arg(long, default_value_t = 2.0)]
        secs: f64,
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        opts: EnvOpts,
    },
    /// Exact reachable state graph of merge_ring (`--agents N [--materialize] --json`).
    Graph(super::merge_ring::GraphArgs),
}

pub fn run(args: EnvsArgs) -> anyhow::Result<()> {
    match args.command {
        EnvsCommand::List => {
            for e in super::REGISTRY {
                let built = if create(e.name, &Options::new()).is_ok() {
                    ""
                } else {
                    " (not built yet)"
                };
                println!("{:<12} {}{}", e.name, e.summary, built);
            }
            Ok(())
        }
        EnvsCommand::Describe { name, opts } => {
            let f = opts.factory(&name)?;
            println!("{}", f.describe());
            Ok(())
        }
        EnvsCommand::Play {
            name,
            seed,
            policy,
            prompts,
            json,
            opts,
        } => play(
            opts.factory(&name)?.as_ref(),
            seed,
            policy.as_deref(),
            prompts,
            json,
        ),
        EnvsCommand::Baseline {
            name,
            episodes,
            seed,
            policy,
            pool,
            json,
            opts,
        } => {
            let f = opts.factory(&name)?;
            let rows = baseline_rows(f.as_ref(), &policy, &pool, episodes, seed)?;
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(
                        &serde_json::json!({ "env": name, "rows": rows })
                    )?
                );
            } else {
                print!("{}", markdown_table(&rows));
            }
            Ok(())
        }
        EnvsCommand::Bench {
            name,
            secs,
            json,
            opts,
        } => {
            let f = opts.factory(&name)?;
            let r = f
                .bench(secs.max(0.01))
                .ok_or_else(|| anyhow::anyhow!("environment `{name}` has no benchmark"))?;
            if json {
                println!("{}", serde_json::to_string(&r)?);
            } else {
                println!(
                    "{name}: {:.0} episodes/s without rendering, {:.0} episodes/s with prompt rendering \
(single thread, per {} second; wall clock: {:.0} / {:.0})",
                    r.episodes_per_s,
                    r.episodes_per_s_with_prompts,
                    if r.clock == "thread_cpu" { "thread CPU" } else { "wall" },
                    r.wall_episodes_per_s,
                    r.wall_episodes_per_s_with_prompts
                );
            }
            Ok(())
        }
        EnvsCommand::Graph(a) => super::merge_ring::run_graph(a),
    }
}

/// Every requested policy x pool row (all of them when the filters are empty).
pub fn baseline_rows(
    f: &dyn EnvFactory,
    policies: &[String],
    pools: &[String],
    episodes: usize,
    first_seed: u64,
) -> anyhow::Result<Vec<BaselineRow>> {
    let ps: Vec<String> = if policies.is_empty() {
        f.policies().iter().map(|s| s.to_string()).collect()
    } else {
        policies.to_vec()
    };
    let qs: Vec<String> = if pools.is_empty() {
        f.pools().iter().map(|s| s.to_string()).collect()
    } else {
        pools.to_vec()
    };
    let mut rows = Vec::new();
    for q in &qs {
        for p in &ps {
            rows.push(f.baseline(p, q, episodes, first_seed)?);
        }
    }
    Ok(rows)
}

/// The rows as a markdown table (README-ready).
pub fn markdown_table(rows: &[BaselineRow]) -> String {
    let extras: Vec<String> = rows
        .first()
        .map(|r| r.extra.keys().cloned().collect())
        .unwrap_or_default();
    let mut s = String::from("| policy | peers | episodes | win rate | 95% CI | mean reward |");
    for e in &extras {
        s.push_str(&format!(" {e} |"));
    }
    s.push_str("\n|---|---|---:|---:|---|---:|");
    for _ in &extras {
        s.push_str("---:|");
    }
    s.push('\n');
    for r in rows {
        s.push_str(&format!(
            "| {} | {} | {} | {:.3} | [{:.3}, {:.3}] | {:.3} |",
            r.policy, r.peers, r.episodes, r.win_rate, r.win_ci[0], r.win_ci[1], r.mean_reward
        ));
        for e in &extras {
            s.push_str(&format!(
                " {:.3} |",
                r.extra.get(e).copied().unwrap_or(f64::NAN)
            ));
        }
        s.push('\n');
    }
    s
}

fn play(
    f: &dyn EnvFactory,
    seed: u64,
    policy: Option<&str>,
    prompts: bool,
    json: bool,
) -> anyhow::Result<()> {
    let human = policy == Some("human");
    if let Some(p) = policy {
        anyhow::ensure!(
            human || f.policies().contains(&p),
            "unknown policy `{p}` for {}; known: human, {}",
            f.name(),
            f.policies().join(", ")
        );
    }
    let mut env = f.reset(seed);
    println!(
        "== {} seed {seed} policy {} ==",
        f.name(),
        policy.unwrap_or("continuation")
    );
    println!("{}", env.render_state());
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    let mut step = 0usize;
    while !env.done() {
        step += 1;
        let mut actions = Vec::new();
        for s in env.policy_seats() {
            if prompts || human {
                for m in env.observation(s) {
                    if human && m.role == "system" && step > 1 {
                        continue;
                    }
                    println!("--- seat {s} [{}] ---\n{}", m.role, m.content);
                }
            }
            let text = if human {
                println!("--- your answer for seat {s} (one line) ---");
                match lines.next() {
                    Some(line) => line?,
                    None => anyhow::bail!("stdin closed before the episode ended"),
                }
            } else if let Some(p) = policy {
                env.policy_action(p, s)?
            } else {
                env.continuation_action(s)
            };
            println!("step {step} seat {s}: {text}");
            actions.push(text);
        }
        env.step(&actions)?;
        println!("{}", env.render_state());
    }
    println!("== rewards ==");
    for s in env.policy_seats() {
        let r = env.reward(s);
        let comps: Vec<String> = r
            .components
            .iter()
            .map(|(k, v)| format!("{k}={v:.3}"))
            .collect();
        println!("seat {s}: scalar {:.3} ({})", r.scalar, comps.join(", "));
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&env.transcript())?);
    }
    Ok(())
}

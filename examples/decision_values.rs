//! What decision-mode GRPO optimises, per situation: for training decisions of an
//! environment, the reward of each legal action (played now, the episode finished by
//! the continuation policy), grouped by the behaviour report's situations.
//!
//!     cargo run --release --example decision_values -- merge_ring agents=4 prompt=compact
//!     cargo run --release --example decision_values -- ticketmelt prompt=compact
//!
//! For every situation it prints how often it is drawn, the share of its decisions at
//! which every action ties (a group of such a prompt ties whatever the model writes;
//! `[env] contested` skips them), each action's mean reward, and the best action; then
//! each action's mean over all decisions: the constant a policy that cannot tell the
//! situations apart drifts to.
use concord::envs::{self, contest::action_spread, score_decision, training_seed};
use std::collections::BTreeMap;

const DECISIONS: u64 = 3000;

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let name = args.next().unwrap_or_else(|| "merge_ring".into());
    let mut opts = envs::Options::new();
    for kv in args {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| anyhow::anyhow!("options are KEY=VALUE, got `{kv}`"))?;
        let value = v
            .parse::<i64>()
            .map(toml::Value::from)
            .unwrap_or_else(|_| toml::Value::from(v));
        opts.insert(k.into(), value);
    }
    let factory = envs::create(&name, &opts)?;
    // situation -> (decisions, tied, per-action reward sums)
    let mut table: BTreeMap<&'static str, (usize, usize, Vec<f64>)> = BTreeMap::new();
    let mut labels: Vec<&'static str> = Vec::new();
    let mut overall: Vec<f64> = Vec::new();
    for i in 0..DECISIONS {
        let d = envs::sample_decision(factory.as_ref(), training_seed(10_000 + i));
        let (Some(b), Some(s)) = (d.env.as_behaviour(), d.env.as_scripted()) else {
            anyhow::bail!("{name} has no behaviour report or no scripted actions");
        };
        let texts = s.answer_texts(d.seat);
        if labels.is_empty() {
            labels = texts.iter().map(|t| b.action_label(d.seat, t)).collect();
            overall = vec![0.0; texts.len()];
        }
        let situation = b.view(d.seat).situation;
        let rewards: Vec<f64> = texts.iter().map(|t| score_decision(&d, t).scalar).collect();
        let tied = action_spread(&d).is_some_and(|s| s == 0.0);
        let row = table
            .entry(situation)
            .or_insert_with(|| (0, 0, vec![0.0; texts.len()]));
        row.0 += 1;
        row.1 += tied as usize;
        for (k, r) in rewards.iter().enumerate() {
            row.2[k] += r;
            overall[k] += r;
        }
    }
    println!("{name} {opts:?}: {DECISIONS} training decisions, the continuation finishing each");
    let head: Vec<String> = labels.iter().map(|l| format!("{l:>8}")).collect();
    println!(
        "{:<36} {:>6} {:>6} {} best",
        "situation",
        "share",
        "tied",
        head.join(" ")
    );
    for (sit, (n, tied, sums)) in &table {
        let means: Vec<f64> = sums.iter().map(|s| s / *n as f64).collect();
        let best = means
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .map_or("-", |(k, _)| labels[k]);
        let cells: Vec<String> = means.iter().map(|m| format!("{m:>8.4}")).collect();
        println!(
            "{sit:<36} {:>6.3} {:>6.3} {} {best}",
            *n as f64 / DECISIONS as f64,
            *tied as f64 / *n as f64,
            cells.join(" ")
        );
    }
    let cells: Vec<String> = overall
        .iter()
        .map(|s| format!("{:>8.4}", s / DECISIONS as f64))
        .collect();
    println!(
        "{:<36} {:>6} {:>6} {}",
        "all decisions",
        "1.000",
        "",
        cells.join(" ")
    );
    Ok(())
}

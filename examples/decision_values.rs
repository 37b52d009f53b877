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
//! situations apart drifts to. Last, a clairvoyant greedy policy: the mean seat
//! reward, over held-out episodes, of the policy that plays at every decision the best
//! action of this reward (the action now, the continuation after it), beside the
//! continuation policy's own. Each action is scored on a copy of the episode whose
//! future holds the same random draws as the episode then played, so this policy sees
//! its own future: an upper bound no policy reading the state reaches. Decision-mode
//! GRPO learns each action's expected reward given what the prompt shows; the
//! shortfall lines below are measured on the same realized futures, so part of each
//! shortfall is the continuation's bad luck, not a better move.
use concord::envs::{self, contest::action_spread, score_decision, training_seed};
use concord::envs::{eval_seed, score_joint, EnvFactory};
use std::collections::BTreeMap;

const DECISIONS: u64 = 3000;

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let name = args.next().unwrap_or_else(|| "merge_ring".into());
    // KEY=VALUE options, read as `concord envs ... --set` reads them
    let sets: Vec<String> = args.collect();
    let opts = envs::tools::options_from_flags(None, &sets)?;
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
    for (margin, kept, below, gap) in continuation_below_best(factory.as_ref()) {
        println!(
            "decisions whose actions spread by more than {margin}: {kept:.3} of all; the \
             continuation policy's own action is below the best in {below:.3} of them (mean \
             shortfall there {gap:.3})"
        );
    }
    let greedy = mean_seat_reward(factory.as_ref(), true)?;
    let plain = mean_seat_reward(factory.as_ref(), false)?;
    println!(
        "clairvoyant greedy over this reward (each action scored on the episode's own \
         future draws): {greedy:.4}; the continuation policy itself: {plain:.4} (mean \
         policy-seat reward, {EPISODES} held-out episodes)"
    );
    Ok(())
}

const EPISODES: u64 = 400;

/// Per contest margin (`[env] contested_margin`): the share of training decisions whose
/// actions spread by more than it, and among those the share at which the
/// continuation policy's own action earns less than the best action, with its mean
/// shortfall there: the decisions from which GRPO can learn to do better than the
/// policy that finishes the episodes.
fn continuation_below_best(factory: &dyn EnvFactory) -> Vec<(f64, f64, f64, f64)> {
    // (spread, shortfall) per decision
    let rows: Vec<(f64, f64)> = (0..DECISIONS)
        .map(|i| {
            let d = envs::sample_decision(factory, training_seed(10_000 + i));
            let options = d
                .env
                .as_scripted()
                .map_or_else(Vec::new, |s| s.answer_texts(d.seat));
            let own = d.env.clone_box().continuation_action(d.seat);
            let r = score_decision(&d, &own).scalar;
            let best = options
                .iter()
                .map(|t| score_decision(&d, t).scalar)
                .fold(r, f64::max);
            (action_spread(&d).unwrap_or(0.0), best - r)
        })
        .collect();
    [0.0, 0.05, 0.1, 0.15, 0.2]
        .into_iter()
        .map(|m| {
            let kept: Vec<f64> = rows.iter().filter(|r| r.0 > m).map(|r| r.1).collect();
            let below: Vec<f64> = kept.iter().cloned().filter(|&g| g > 1e-9).collect();
            let n = kept.len().max(1) as f64;
            let gap = below.iter().sum::<f64>() / below.len().max(1) as f64;
            (
                m,
                kept.len() as f64 / DECISIONS as f64,
                below.len() as f64 / n,
                gap,
            )
        })
        .collect()
}

/// Mean reward of the policy seats over held-out episodes, each seat playing the best
/// action of the decision reward (`greedy`) or the continuation policy's.
fn mean_seat_reward(factory: &dyn EnvFactory, greedy: bool) -> anyhow::Result<f64> {
    let (mut sum, mut n) = (0.0, 0usize);
    for i in 0..EPISODES {
        let mut env = factory.reset(eval_seed(i));
        let seats = env.policy_seats();
        while !env.done() {
            let texts: Vec<String> = env
                .to_act()
                .into_iter()
                .map(|s| {
                    let options = env.as_scripted().map(|x| x.answer_texts(s));
                    match options.filter(|o| greedy && !o.is_empty() && seats.contains(&s)) {
                        Some(o) => best_answer(env.as_ref(), s, o),
                        None => env.continuation_action(s),
                    }
                })
                .collect();
            env.step(&texts)?;
        }
        for s in seats {
            sum += env.reward(s).scalar;
            n += 1;
        }
    }
    Ok(sum / n.max(1) as f64)
}

/// The answer whose reward (played now, the continuation after it) is highest; the
/// last of equals.
fn best_answer(env: &dyn envs::Environment, seat: usize, options: Vec<String>) -> String {
    let mut best = (f64::NEG_INFINITY, String::new());
    for o in options {
        let r = score_joint(env, &[(seat, &o)])
            .first()
            .map_or(f64::NEG_INFINITY, |r| r.scalar);
        if r >= best.0 {
            best = (r, o);
        }
    }
    best.1
}

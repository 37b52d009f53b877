//! What each first action is worth at a decision, by who plays up to it (the roll-in)
//! and who plays after it (the continuation): the heuristic, or the `random` policy (a
//! stand-in for a format-only warm start, which writes valid answers at random).
//!
//!     cargo run --release --example roll_in_values -- ticketmelt prompt=compact
//!
//! For each of the four pairings it draws decisions as training does (a step drawn
//! uniformly in the roll-in policy's own episode), plays every legal action there, and
//! finishes the episode with the continuation policy. It prints each action's mean
//! reward with a 95% interval, over all decisions and over the contested ones (those
//! whose actions differ under the scripted continuation, as `[env] contested` keeps).
//! Averaged over many decisions, each mean is the expected reward of that action at a
//! decision of that distribution: no clairvoyance is involved. A policy trained on one
//! roll-in learns that roll-in's ordering of the actions; where two roll-ins order them
//! differently, training on the one the model does not play misleads it.
use concord::envs::rollout::{sample_decisions_with, score_decisions_with, EachTurn};
use concord::envs::{self, contest::action_spread, training_seed, Decision, Environment};

const DECISIONS: u64 = 2000;

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let name = args.next().unwrap_or_else(|| "ticketmelt".into());
    // KEY=VALUE options, read as `concord envs ... --set` reads them
    let sets: Vec<String> = args.collect();
    let opts = envs::tools::options_from_flags(None, &sets)?;
    let factory = envs::create(&name, &opts)?;
    let seeds: Vec<u64> = (0..DECISIONS).map(|i| training_seed(50_000 + i)).collect();
    for roll_in in ["heuristic", "random"] {
        let decisions = sample_decisions_with(factory.as_ref(), &seeds, &mut by(roll_in))?;
        let contested: Vec<bool> = decisions
            .iter()
            .map(|d| action_spread(d).is_some_and(|s| s > 0.0))
            .collect();
        let share = contested.iter().filter(|&&c| c).count() as f64 / DECISIONS as f64;
        for continuation in ["heuristic", "random"] {
            println!(
                "roll-in {roll_in}, continuation {continuation} ({DECISIONS} decisions, \
                 {:.0}% contested)",
                100.0 * share
            );
            let texts = action_texts(&decisions[0]);
            for text in &texts {
                let items: Vec<(&Decision, &str)> =
                    decisions.iter().map(|d| (d, text.as_str())).collect();
                let rewards: Vec<f64> = score_decisions_with(&items, &mut by(continuation))?
                    .into_iter()
                    .map(|r| r.scalar)
                    .collect();
                let on_contested: Vec<f64> = rewards
                    .iter()
                    .zip(&contested)
                    .filter(|(_, &c)| c)
                    .map(|(r, _)| *r)
                    .collect();
                println!(
                    "  {:<40} all {}   contested {}",
                    text,
                    mean_ci(&rewards),
                    mean_ci(&on_contested)
                );
            }
        }
    }
    Ok(())
}

/// The environment's scripted policy `name` in every seat.
fn by(name: &'static str) -> impl envs::rollout::Policy {
    EachTurn(move |env: &mut dyn Environment, seat| env.policy_action(name, seat))
}

/// The legal actions' answer texts at `d` (the same for every TICKETMELT seat).
fn action_texts(d: &Decision) -> Vec<String> {
    d.env
        .as_scripted()
        .map(|s| s.answer_texts(d.seat))
        .unwrap_or_default()
}

/// "mean [lo, hi]" with a normal 95% interval.
fn mean_ci(xs: &[f64]) -> String {
    if xs.is_empty() {
        return "-".into();
    }
    let n = xs.len() as f64;
    let m = xs.iter().sum::<f64>() / n;
    let var = xs.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (n - 1.0).max(1.0);
    let h = 1.96 * (var / n).sqrt();
    format!("{m:.3} [{:.3}, {:.3}]", m - h, m + h)
}

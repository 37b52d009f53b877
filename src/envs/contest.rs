//! Decisions where the action matters (`[env] contested`).
//!
//! GRPO learns only from groups whose rewards differ. In decision mode a drawn
//! decision can be one at which every legal action ends with the same reward (a
//! merge-ring signal that the continuation ignores, an engineer whose service is
//! already restored): every completion of its group then ties, whatever the model
//! writes. [`sample_contested`] plays each legal action of the drawn seat
//! ([`super::Scripted::answer_texts`]), finishes the episode with the continuation
//! policy ([`score_decision`]), and keeps the decision only if the best and worst
//! rewards differ by more than a margin; otherwise it draws another decision from a
//! seed derived from the first. Everything is a pure function of the seed, so every
//! process of a data-parallel run draws the same prompts.
//!
//! The contest is judged with the scripted continuation and the scalar reward, also
//! when the run scores completions with `continue_with = "model"`.

use super::rollout::{sample_decision, score_decision, training_seed, Decision};
use super::EnvFactory;
use crate::rng::mix_seeds as mix;
use anyhow::{bail, Result};

/// How decisions are drawn under `[env] contested`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ContestRule {
    /// A decision is contested when its legal actions' rewards spread by more than this.
    pub margin: f64,
    /// Decisions drawn at most per prompt; the last is kept when none is contested.
    pub draws: usize,
}

/// How a prompt's decision was drawn: the draws it took, and the spread (best minus
/// worst reward) of the kept decision's legal actions.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Contest {
    pub draws: usize,
    pub spread: f64,
    pub contested: bool,
}

/// The best minus the worst reward over the deciding seat's legal actions, each played
/// now and finished by the continuation policy; `None` when the environment cannot
/// list them.
pub fn action_spread(d: &Decision) -> Option<f64> {
    let texts = d.env.as_scripted()?.answer_texts(d.seat);
    if texts.is_empty() {
        return None;
    }
    let rewards: Vec<f64> = texts.iter().map(|t| score_decision(d, t).scalar).collect();
    let hi = rewards.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let lo = rewards.iter().cloned().fold(f64::INFINITY, f64::min);
    Some(hi - lo)
}

/// The seed of draw `k` (0-based) for a prompt seeded `seed`: the first draw is the
/// plain decision's, so `contested` changes only the prompts that tie.
pub(super) fn draw_seed(seed: u64, k: usize) -> u64 {
    if k == 0 {
        seed
    } else {
        training_seed(mix(seed, 0xC0_27E5_7ED0 + k as u64))
    }
}

/// A decision drawn from `seed` under `rule` (see the module docs).
pub fn sample_contested(
    factory: &dyn EnvFactory,
    seed: u64,
    rule: ContestRule,
) -> Result<(Decision, Contest)> {
    first_contested(|s| Ok(sample_decision(factory, s)), seed, rule)
}

/// The first contested decision of `draw(draw_seed(seed, k))` for `k` in
/// `0..rule.draws`, or the last one drawn when none is.
pub(super) fn first_contested(
    mut draw: impl FnMut(u64) -> Result<Decision>,
    seed: u64,
    rule: ContestRule,
) -> Result<(Decision, Contest)> {
    let draws = rule.draws.max(1);
    let mut last = None;
    for k in 0..draws {
        let d = draw(draw_seed(seed, k))?;
        let Some(spread) = action_spread(&d) else {
            bail!(
                "[env] contested: `{}` cannot list a seat's legal actions at a decision \
                 (contested decisions are available for merge_ring and ticketmelt)",
                d.env.name()
            );
        };
        let contested = spread > rule.margin;
        let c = Contest {
            draws: k + 1,
            spread,
            contested,
        };
        if contested {
            return Ok((d, c));
        }
        last = Some((d, c));
    }
    match last {
        Some(kept) => Ok(kept),
        None => bail!("[env] contested_draws must be at least 1"),
    }
}

/// Whether `factory`'s decisions can be contested (its seats list their actions).
pub fn check_contestable(factory: &dyn EnvFactory) -> Result<()> {
    sample_contested(
        factory,
        0,
        ContestRule {
            margin: f64::INFINITY,
            draws: 1,
        },
    )
    .map(|_| ())
}

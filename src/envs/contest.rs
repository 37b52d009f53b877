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
//!
//! A share of the prompts (`contested_regret_share`) is judged by *regret* instead:
//! the best action's reward minus that of the action the continuation policy itself
//! plays there. A decision with regret is one where a step of policy improvement over
//! the continuation changes the move. A model that imitates that policy (a heuristic
//! warm start) writes the continuation's move nearly always; at decisions drawn by
//! spread, its own answer is already the best in most groups, and the groups that
//! would teach it something new are rare.

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
    /// The share of prompts judged by regret (see the module docs) instead of spread;
    /// a seeded coin per prompt decides which.
    pub regret_share: f64,
}

/// How a prompt's decision was drawn: the draws it took, and the spread (best minus
/// worst reward) of the kept decision's legal actions.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Contest {
    pub draws: usize,
    pub spread: f64,
    /// The best action's reward minus the continuation policy's own action's.
    pub regret: f64,
    /// Judged by regret (else by spread).
    pub by_regret: bool,
    pub contested: bool,
}

/// The best minus the worst reward over the deciding seat's legal actions, each played
/// now and finished by the continuation policy; `None` when the environment cannot
/// list them.
pub fn action_spread(d: &Decision) -> Option<f64> {
    action_values(d).map(|(spread, _)| spread)
}

/// The spread of [`action_spread`] and the regret of the continuation policy's own
/// action (see the module docs).
fn action_values(d: &Decision) -> Option<(f64, f64)> {
    let texts = d.env.as_scripted()?.answer_texts(d.seat);
    if texts.is_empty() {
        return None;
    }
    let rewards: Vec<f64> = texts.iter().map(|t| score_decision(d, t).scalar).collect();
    let hi = rewards.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let lo = rewards.iter().cloned().fold(f64::INFINITY, f64::min);
    // On a copy: a policy's tie breaks may draw from the episode's generator.
    let mut env = d.env.clone_box();
    let own = env.as_scripted_mut()?.continuation_action(d.seat);
    Some((hi - lo, hi - score_decision(d, &own).scalar))
}

/// Whether the prompt seeded `seed` is judged by regret: a coin of probability `share`.
fn judged_by_regret(seed: u64, share: f64) -> bool {
    let u = (mix(seed, 0x4E_6E57) >> 11) as f64 / (1u64 << 53) as f64;
    u < share
}

/// The seed of draw `k` (0-based) for a prompt seeded `seed`: the first draw is the
/// plain decision's, so `contested` changes only the prompts that tie.
fn draw_seed(seed: u64, k: usize) -> u64 {
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
    let draws = rule.draws.max(1);
    let by_regret = judged_by_regret(seed, rule.regret_share);
    let mut last = None;
    for k in 0..draws {
        let d = sample_decision(factory, draw_seed(seed, k));
        let Some((spread, regret)) = action_values(&d) else {
            bail!(
                "[env] contested: `{}` cannot list a seat's legal actions at a decision \
                 (contested decisions are available for merge_ring and ticketmelt)",
                factory.name()
            );
        };
        let contested = match by_regret {
            true => regret > rule.margin,
            false => spread > rule.margin,
        };
        let c = Contest {
            draws: k + 1,
            spread,
            regret,
            by_regret,
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
            regret_share: 0.0,
        },
    )
    .map(|_| ())
}

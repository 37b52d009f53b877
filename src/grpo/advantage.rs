//! GRPO advantages, as TRL computes them.
//!
//! Rewards come in groups of G (one prompt's completions, consecutive in the batch).
//! `A_i = r_i - mean(group)`; `scale_rewards = group` divides by `std(group) + 1e-4`,
//! `batch` by `std(batch) + 1e-4` (both with Bessel's correction), `none` not at all.
//!
//! Several named reward components (`grpo.reward_weights`) combine in one of two ways
//! (`multi_objective_aggregation`): `sum_then_normalize` weighs and sums them into the
//! scalar above; `normalize_then_sum` is GDPO ([`normalize_then_sum`]).
use crate::config::ScaleRewards;
use anyhow::{bail, Result};
use std::collections::BTreeMap;

/// The constant TRL adds to the standard deviation.
pub const STD_EPS: f64 = 1e-4;

/// Advantages of one generation batch and the statistics TRL logs.
#[derive(Debug, Clone, PartialEq)]
pub struct Advantages {
    /// One per completion, in batch order.
    pub values: Vec<f64>,
    /// `reward`: mean of all rewards.
    pub reward_mean: f64,
    /// `reward_std`: mean over completions of the std used for scaling (group std for
    /// `group` / `none`, batch std for `batch`), as TRL logs it.
    pub reward_std: f64,
    /// Groups whose rewards are all equal (they carry no policy gradient).
    pub zero_std_groups: usize,
    /// `frac_reward_zero_std`: zero_std_groups / groups.
    pub frac_reward_zero_std: f64,
}

/// Mean of `xs` (0 for empty input).
pub fn mean(xs: &[f64]) -> f64 {
    if xs.is_empty() {
        0.0
    } else {
        xs.iter().sum::<f64>() / xs.len() as f64
    }
}

/// Standard deviation with Bessel's correction (n - 1); NaN for n < 2 as in torch.
pub fn std_bessel(xs: &[f64]) -> f64 {
    if xs.len() < 2 {
        return f64::NAN;
    }
    let m = mean(xs);
    (xs.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / (xs.len() - 1) as f64).sqrt()
}

/// Like `torch.isclose(x, 0)` with its default tolerances.
fn is_close_zero(x: f64) -> bool {
    x.abs() <= 1e-8
}

/// Whether one group's rewards differ (the group carries a policy gradient); the
/// complement of what `frac_reward_zero_std` counts.
pub fn group_has_signal(rewards: &[f64]) -> bool {
    !is_close_zero(std_bessel(rewards))
}

/// Compute advantages for `rewards` laid out as consecutive groups of `group_size`.
pub fn compute_advantages(
    rewards: &[f64],
    group_size: usize,
    scale: ScaleRewards,
) -> Result<Advantages> {
    if group_size < 2 {
        bail!("group size must be >= 2, got {group_size}");
    }
    if rewards.is_empty() || !rewards.len().is_multiple_of(group_size) {
        bail!(
            "{} rewards do not form whole groups of {group_size}",
            rewards.len()
        );
    }
    if let Some(bad) = rewards.iter().find(|r| !r.is_finite()) {
        bail!("non-finite reward {bad}");
    }
    let groups: Vec<&[f64]> = rewards.chunks(group_size).collect();
    let group_means: Vec<f64> = groups.iter().map(|g| mean(g)).collect();
    let group_stds: Vec<f64> = groups.iter().map(|g| std_bessel(g)).collect();
    let batch_std = std_bessel(rewards);
    let mut values = Vec::with_capacity(rewards.len());
    let mut std_sum = 0.0;
    for (gi, g) in groups.iter().enumerate() {
        let std = match scale {
            ScaleRewards::Group | ScaleRewards::None => group_stds[gi],
            ScaleRewards::Batch => batch_std,
        };
        for &r in g.iter() {
            let centred = r - group_means[gi];
            values.push(match scale {
                ScaleRewards::None => centred,
                _ => centred / (std + STD_EPS),
            });
            std_sum += std;
        }
    }
    let zero_std_groups = group_stds.iter().filter(|&&s| is_close_zero(s)).count();
    Ok(Advantages {
        values,
        reward_mean: mean(rewards),
        reward_std: std_sum / rewards.len() as f64,
        zero_std_groups,
        frac_reward_zero_std: zero_std_groups as f64 / groups.len() as f64,
    })
}

/// The scalar reward GRPO optimises: with no weights, the environment's scalar;
/// otherwise `sum_k w_k * component_k` (a missing component counts as 0; a weight for
/// a component no completion has is an error, to catch typos).
pub fn weighted_reward(
    components: &BTreeMap<String, f64>,
    scalar: f64,
    weights: &BTreeMap<String, f64>,
) -> f64 {
    if weights.is_empty() {
        return scalar;
    }
    weights
        .iter()
        .map(|(k, w)| w * components.get(k).copied().unwrap_or(0.0))
        .sum()
}

/// GDPO ("Group reward-Decoupled Normalization Policy Optimization", arXiv 2601.05242;
/// TRL's `multi_objective_aggregation = "normalize_then_sum"`): each weighted component
/// is normalised within its group, `(c - mean) / (std + 1e-4)`, so that a component
/// with a wide range cannot drown the others; the normalised components are summed
/// with their weights and the sum is normalised over the whole batch. `scale_rewards`
/// does not apply. A component a completion lacks counts as 0 (as in
/// [`weighted_reward`]). The logged statistics are those of the weighted raw sum: its
/// mean (`reward`), batch std (`reward_std`) and groups where it is constant.
pub fn normalize_then_sum(
    components: &[&BTreeMap<String, f64>],
    weights: &BTreeMap<String, f64>,
    group_size: usize,
) -> Result<Advantages> {
    if group_size < 2 {
        bail!("group size must be >= 2, got {group_size}");
    }
    if components.is_empty() || !components.len().is_multiple_of(group_size) {
        bail!(
            "{} rewards do not form whole groups of {group_size}",
            components.len()
        );
    }
    if weights.is_empty() {
        bail!("normalize_then_sum needs named components in grpo.reward_weights");
    }
    let value = |c: &BTreeMap<String, f64>, k: &str| c.get(k).copied().unwrap_or(0.0);
    if let Some(bad) = components
        .iter()
        .flat_map(|c| weights.keys().map(|k| value(c, k)))
        .find(|r| !r.is_finite())
    {
        bail!("non-finite reward component {bad}");
    }
    let mut summed = vec![0.0; components.len()];
    for (k, w) in weights {
        for (start, group) in components.chunks(group_size).enumerate() {
            let xs: Vec<f64> = group.iter().map(|c| value(c, k)).collect();
            let (m, s) = (mean(&xs), std_bessel(&xs));
            for (j, x) in xs.iter().enumerate() {
                summed[start * group_size + j] += w * (x - m) / (s + STD_EPS);
            }
        }
    }
    let (m, s) = (mean(&summed), std_bessel(&summed));
    let values = summed.iter().map(|x| (x - m) / (s + STD_EPS)).collect();
    let raw: Vec<f64> = components
        .iter()
        .map(|c| weighted_reward(c, 0.0, weights))
        .collect();
    let zero_std_groups = raw
        .chunks(group_size)
        .filter(|g| !group_has_signal(g))
        .count();
    Ok(Advantages {
        values,
        reward_mean: mean(&raw),
        reward_std: std_bessel(&raw),
        zero_std_groups,
        frac_reward_zero_std: zero_std_groups as f64 / (raw.len() / group_size) as f64,
    })
}

/// Check that every weighted component exists in at least one reward.
pub fn check_weights<'a>(
    weights: &BTreeMap<String, f64>,
    mut components: impl Iterator<Item = &'a BTreeMap<String, f64>>,
) -> Result<()> {
    if weights.is_empty() {
        return Ok(());
    }
    let mut seen = std::collections::BTreeSet::new();
    for c in components.by_ref() {
        seen.extend(c.keys().cloned());
    }
    for k in weights.keys() {
        if !seen.contains(k) {
            bail!(
                "grpo.reward_weights names `{k}`, which the environment does not report; it reports: {}",
                seen.into_iter().collect::<Vec<_>>().join(", ")
            );
        }
    }
    Ok(())
}

/// Per-component mean and std (Bessel) over the batch, for `rewards/<c>/mean|std`.
pub fn component_stats(rewards: &[&BTreeMap<String, f64>]) -> BTreeMap<String, (f64, f64)> {
    let mut names = std::collections::BTreeSet::new();
    for r in rewards {
        names.extend(r.keys().cloned());
    }
    names
        .into_iter()
        .map(|n| {
            let xs: Vec<f64> = rewards
                .iter()
                .map(|r| r.get(&n).copied().unwrap_or(0.0))
                .collect();
            let s = std_bessel(&xs);
            (n, (mean(&xs), if s.is_nan() { 0.0 } else { s }))
        })
        .collect()
}

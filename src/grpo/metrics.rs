//! Log: the metrics row of one step (TRL's names) and the logged samples.
use super::advantage::{component_stats, mean};
use super::batch::Batch;
use super::rollout::Rollout;
use super::update::UpdateStats;
use crate::run::log::StepRow;
use crate::task::Task;
use std::collections::{BTreeMap, HashSet};

/// The row's batch and update columns. The caller fills in the step, stage, env and
/// the run's running totals (`num_tokens`, `seconds`) and timings.
pub fn row(batch: &Batch, upd: &UpdateStats) -> StepRow {
    let rollouts = &batch.rollouts;
    let lens: Vec<f64> = rollouts
        .iter()
        .map(|r| r.completion_ids.len() as f64)
        .collect();
    // TRL: with no completion that ended, the terminated lengths are those of [0].
    let mut terminated: Vec<f64> = rollouts
        .iter()
        .filter(|r| !r.truncated)
        .map(|r| r.completion_ids.len() as f64)
        .collect();
    if terminated.is_empty() {
        terminated.push(0.0);
    }
    let comps: Vec<&BTreeMap<String, f64>> =
        rollouts.iter().map(|r| &r.reward.components).collect();
    let s = &upd.loss;
    let diversity = group_diversity(rollouts);
    StepRow {
        reward: batch.advantages.reward_mean,
        reward_std: batch.advantages.reward_std,
        // Over every group drawn (the same as the batch's without dynamic sampling).
        frac_reward_zero_std: batch.frac_zero_std_drawn,
        frac_identical_completions: diversity.identical_frac,
        distinct_completions: diversity.distinct_mean,
        prompt_draws: batch.prompt_draws as f64,
        components: component_stats(&comps),
        mean_length: mean(&lens),
        min_length: lens.iter().cloned().fold(f64::INFINITY, f64::min),
        max_length: lens.iter().cloned().fold(0.0, f64::max),
        clipped_ratio: rollouts.iter().filter(|r| r.truncated).count() as f64
            / rollouts.len().max(1) as f64,
        mean_terminated_length: mean(&terminated),
        min_terminated_length: terminated.iter().cloned().fold(f64::INFINITY, f64::min),
        max_terminated_length: terminated.iter().cloned().fold(0.0, f64::max),
        kl: s.kl(),
        entropy: s.entropy(),
        clip_low: s.clip_low(),
        clip_high: s.clip_high(),
        clip_region: s.clip_region(),
        clip_low_min: s.clip_low_min(),
        clip_high_max: s.clip_high_max(),
        cispo_clip_ratio: s.cispo_clip_ratio(),
        vespo_phi_mean: s.vespo_phi.mean(),
        loss: s.loss,
        policy_loss: s.policy_loss,
        sampling_logp_diff_mean: s.sampling_logp_diff.mean(),
        sampling_logp_diff_max: s.sampling_logp_diff.max(),
        sampling_ratio_min: s.sampling_ratio.min(),
        sampling_ratio_mean: s.sampling_ratio.mean(),
        sampling_ratio_max: s.sampling_ratio.max(),
        grad_norm: upd.grad_norm,
        learning_rate: upd.learning_rate,
        skipped: if upd.skipped { 1.0 } else { 0.0 },
        gen_tokens_per_s: batch.sampled_tokens() as f64 / batch.gen_secs.max(1e-9),
        train_tokens_per_s: upd.trained_tokens as f64 / upd.secs.max(1e-9),
        ..enumerate_columns(batch, contest_columns(batch, episode_columns(batch)))
    }
}

/// The `explore/*` columns (zero when no group holds an enumerated completion).
fn enumerate_columns(batch: &Batch, rest: StepRow) -> StepRow {
    let forced: Vec<f64> = batch
        .rollouts
        .iter()
        .filter(|r| r.forced)
        .map(|r| r.advantage)
        .collect();
    if forced.is_empty() {
        return rest;
    }
    StepRow {
        sampled_best_frac: sampled_best_frac(&batch.rollouts),
        forced_advantage: mean(&forced),
        ..rest
    }
}

/// The share of groups in which a sampled completion reached the group's best reward:
/// where it is low, the model's own answers lag an action it did not write.
pub fn sampled_best_frac(rollouts: &[Rollout]) -> f64 {
    let mut best: BTreeMap<usize, (f64, f64)> = BTreeMap::new();
    for r in rollouts {
        let (all, sampled) = best
            .entry(r.group)
            .or_insert((f64::NEG_INFINITY, f64::NEG_INFINITY));
        *all = all.max(r.scalar);
        if !r.forced {
            *sampled = sampled.max(r.scalar);
        }
    }
    let n = best.len().max(1) as f64;
    best.values().filter(|(all, s)| s >= all).count() as f64 / n
}

/// How different the completions of the step's groups are.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GroupDiversity {
    /// Share of groups whose completions are all token-identical.
    pub identical_frac: f64,
    /// Distinct completions per group, on average.
    pub distinct_mean: f64,
}

/// Counts distinct completions per group (`Rollout::group`). A group of identical
/// completions gives no gradient whatever its rewards: GRPO's advantages sum to zero
/// over a group and all of them multiply the same log-probability, which
/// `frac_reward_zero_std` cannot show when the reward is noisy given the completion
/// (a sampled continuation, a stochastic judge).
pub fn group_diversity(rollouts: &[Rollout]) -> GroupDiversity {
    let mut groups: BTreeMap<usize, HashSet<&[u32]>> = BTreeMap::new();
    for r in rollouts {
        groups
            .entry(r.group)
            .or_default()
            .insert(r.completion_ids.as_slice());
    }
    if groups.is_empty() {
        return GroupDiversity {
            identical_frac: 0.0,
            distinct_mean: 0.0,
        };
    }
    let n = groups.len() as f64;
    GroupDiversity {
        identical_frac: groups.values().filter(|s| s.len() == 1).count() as f64 / n,
        distinct_mean: groups.values().map(|s| s.len() as f64).sum::<f64>() / n,
    }
}

/// The `decisions/*` columns over the step's prompts (zero without `contested`).
fn contest_columns(batch: &Batch, rest: StepRow) -> StepRow {
    let c: Vec<_> = batch.prompts.iter().filter_map(|p| p.contest).collect();
    if c.is_empty() {
        return rest;
    }
    let n = c.len() as f64;
    StepRow {
        decision_draws: c.iter().map(|c| c.draws as f64).sum::<f64>() / n,
        contested_frac: c.iter().filter(|c| c.contested).count() as f64 / n,
        action_spread: c.iter().map(|c| c.spread).sum::<f64>() / n,
        ..rest
    }
}

/// The `episode/*` columns (zero in decision mode).
fn episode_columns(batch: &Batch) -> StepRow {
    if batch.turns.is_empty() {
        return StepRow::default();
    }
    let rollouts = &batch.rollouts;
    let n = rollouts.len().max(1) as f64;
    let model: f64 = rollouts
        .iter()
        .map(|r| r.env_mask.iter().map(|&m| m as f64).sum::<f64>())
        .sum();
    let all: f64 = rollouts.iter().map(|r| r.completion_ids.len() as f64).sum();
    let turns: Vec<f64> = batch.turns.iter().map(|&t| t as f64).collect();
    StepRow {
        episode_mean_turns: mean(&turns),
        episode_max_turns: turns.iter().cloned().fold(0.0, f64::max),
        episode_model_tokens: model / n,
        episode_env_tokens: (all - model) / n,
        episode_truncated_frac: rollouts.iter().filter(|r| r.truncated).count() as f64 / n,
        ..StepRow::default()
    }
}

/// Up to `n` completions of the step, spread over its groups, as `samples.jsonl` lines.
pub fn samples(
    batch: &Batch,
    task: &dyn Task,
    step: usize,
    stage: &str,
    n: usize,
) -> Vec<serde_json::Value> {
    let rollouts = &batch.rollouts;
    let n = n.min(rollouts.len());
    if n == 0 {
        return Vec::new();
    }
    let stride = (rollouts.len() / n).max(1);
    rollouts
        .iter()
        .step_by(stride)
        .take(n)
        .map(|r| {
            let prompt = &batch.prompts[r.group];
            serde_json::json!({
                "step": step,
                "stage": stage,
                "env": task.env_of(prompt),
                "prompt": prompt.text,
                "completion": r.text,
                "reward": r.scalar,
                "components": r.reward.components,
                "advantage": r.advantage,
                "tokens": r.completion_ids.len(),
                "truncated": r.truncated,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envs::Reward;

    fn rollout(group: usize, ids: &[u32], scalar: f64) -> Rollout {
        Rollout {
            group,
            prompt_ids: vec![1],
            completion_ids: ids.to_vec(),
            env_mask: vec![1.0; ids.len()],
            truncated: false,
            text: String::new(),
            reward: Reward::default(),
            scalar,
            advantage: 0.0,
            sampler_logp: None,
            forced: false,
        }
    }

    #[test]
    fn identical_completions_are_counted_per_group_whatever_their_rewards() {
        // Group 0: one text three times, rewards differing (a sampled continuation).
        // Group 1: three texts, one of them a prefix of another. Group 2: two texts.
        let r = vec![
            rollout(0, &[4, 5], 0.0),
            rollout(0, &[4, 5], 1.0),
            rollout(0, &[4, 5], 0.5),
            rollout(1, &[4, 5], 1.0),
            rollout(1, &[4], 1.0),
            rollout(1, &[6, 5], 1.0),
            rollout(2, &[7], 0.0),
            rollout(2, &[7], 0.0),
            rollout(2, &[8], 1.0),
        ];
        let d = group_diversity(&r);
        assert_eq!(d.identical_frac, 1.0 / 3.0);
        assert_eq!(d.distinct_mean, (1.0 + 3.0 + 2.0) / 3.0);
        // Group 2's best (1.0) is sampled; mark it forced and group 2 lags.
        assert_eq!(sampled_best_frac(&r), 1.0);
        let mut f = r.clone();
        f[8].forced = true;
        assert_eq!(sampled_best_frac(&f), 2.0 / 3.0);
        let none = group_diversity(&[]);
        assert_eq!((none.identical_frac, none.distinct_mean), (0.0, 0.0));
    }
}

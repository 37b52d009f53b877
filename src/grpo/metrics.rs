//! Log: the metrics row of one step (TRL's names) and the logged samples.
use super::advantage::{component_stats, mean};
use super::batch::Batch;
use super::update::UpdateStats;
use crate::run::log::StepRow;
use crate::task::Task;
use std::collections::BTreeMap;

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
    StepRow {
        reward: batch.advantages.reward_mean,
        reward_std: batch.advantages.reward_std,
        // Over every group drawn (the same as the batch's without dynamic sampling).
        frac_reward_zero_std: batch.frac_zero_std_drawn,
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
        ..contest_columns(batch, episode_columns(batch))
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

//! Collect: one step's prompts -> G completions each, sampled with the very weights
//! being trained -> rewards, scored inline by the task -> group advantages.
use super::advantage::weighted_reward;
use super::advantage::{check_weights, compute_advantages, Advantages};
use super::pack::Rollout;
use crate::config::GrpoConfig;
use crate::model::qwen2::Qwen2;
use crate::rng::mix_seeds as mix;
use crate::sample::{self, FinishReason};
use crate::task::{Renderer, Task, TaskPrompt};
use anyhow::{bail, Result};
use std::time::Instant;

/// What one step collected, ready for the update.
pub struct Batch {
    pub prompts: Vec<TaskPrompt>,
    /// `prompts.len() x G` scored completions, group by group, advantages filled in.
    pub rollouts: Vec<Rollout>,
    /// Reward statistics of the batch (the advantages themselves are in `rollouts`).
    pub advantages: Advantages,
    /// Seconds spent sampling.
    pub gen_secs: f64,
}

impl Batch {
    pub fn mean_reward(&self) -> f64 {
        self.advantages.reward_mean
    }

    /// Completion tokens sampled this step.
    pub fn gen_tokens(&self) -> usize {
        self.rollouts.iter().map(|r| r.completion_ids.len()).sum()
    }

    /// Prompt tokens over all rollouts (each completion counts its prompt).
    pub fn prompt_tokens(&self) -> usize {
        self.rollouts.iter().map(|r| r.prompt_ids.len()).sum()
    }
}

/// Sample and score one step's batch. `seed` is the step's seed; `first_step` checks
/// `reward_weights` against the components the task actually produces.
pub fn collect(
    model: &Qwen2,
    renderer: &dyn Renderer,
    task: &mut dyn Task,
    g: &GrpoConfig,
    seed: u64,
    first_step: bool,
) -> Result<Batch> {
    let gsize = g.num_generations;
    let prompts = task.prompts(seed, g.prompts_per_step, renderer)?;

    let t_gen = Instant::now();
    let prompt_ids: Vec<Vec<u32>> = prompts.iter().map(|p| p.ids.clone()).collect();
    let params = g.sampling_params(renderer.stop_ids(), mix(seed, 1));
    let decode = |ids: &[u32]| renderer.decode(ids);
    let groups = sample::sample_groups(model, &decode, &prompt_ids, gsize, &params, params.seed)?;
    let gen_secs = t_gen.elapsed().as_secs_f64();

    let mut rollouts = Vec::with_capacity(gsize * prompts.len());
    for (pi, (p, comps)) in prompts.iter().zip(groups.iter()).enumerate() {
        if comps.len() != gsize {
            bail!(
                "sampler returned {} completions for prompt {pi}, expected {gsize}",
                comps.len()
            );
        }
        for c in comps {
            let reward = task.score(p, c)?;
            let scalar = weighted_reward(&reward.components, reward.scalar, &g.reward_weights);
            rollouts.push(Rollout {
                group: pi,
                prompt_ids: p.ids.clone(),
                completion_ids: c.ids.clone(),
                env_mask: vec![1.0; c.ids.len()],
                truncated: c.finish_reason == FinishReason::Length,
                text: c.text.clone(),
                reward,
                scalar,
                advantage: 0.0,
                old_logp: None,
            });
        }
    }
    if first_step {
        check_weights(
            &g.reward_weights,
            rollouts.iter().map(|r| &r.reward.components),
        )?;
    }
    let rewards: Vec<f64> = rollouts.iter().map(|r| r.scalar).collect();
    let advantages = compute_advantages(&rewards, gsize, g.scale_rewards)?;
    for (r, a) in rollouts.iter_mut().zip(&advantages.values) {
        r.advantage = *a;
    }
    Ok(Batch {
        prompts,
        rollouts,
        advantages,
        gen_secs,
    })
}

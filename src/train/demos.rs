//! The demonstrations `[sft]` asks for, gathered here because one source is the model
//! itself: a JSONL file and an environment's scripted policy come from
//! [`crate::sft::data`]; rejection sampling draws completions with GRPO's collection
//! ([`crate::grpo::batch::collect`]) and keeps the good ones. SFT trains on what this
//! returns and knows nothing of GRPO.
use crate::config::sft::SftSource;
use crate::config::{Config, GrpoConfig};
use crate::model::Transformer;
use crate::rng::mix_seeds as mix;
use crate::sft::data::Example;
use crate::task::{EnvTask, Renderer};
use anyhow::{bail, Context, Result};

/// The demonstrations `[sft]` asks for, tokenized and checked against the model's
/// context length. Rejection sampling uses `model` as it is (its adapter on).
pub fn build_examples(
    cfg: &Config,
    model: &Transformer,
    renderer: &dyn Renderer,
) -> Result<Vec<Example>> {
    let s = cfg
        .sft
        .as_ref()
        .context("the config has no [sft] section")?;
    let seed = mix(cfg.run.seed, 0x5F7);
    let examples = match s.source {
        SftSource::Jsonl => {
            let path = s.path.as_ref().context("sft.path: missing")?;
            let demos = crate::sft::data::read_jsonl(path)?;
            crate::sft::data::tokenize(&demos, renderer, &path.display().to_string())?
        }
        SftSource::Env => {
            let (name, opts) = crate::sft::data::source_env(cfg, s)?;
            let factory =
                crate::envs::create(&name, &opts).with_context(|| format!("sft.env `{name}`"))?;
            let demos = crate::sft::data::scripted_demos(
                factory.as_ref(),
                &s.policy,
                s.examples,
                seed,
                s.balance,
            )?;
            crate::sft::data::tokenize(&demos, renderer, &format!("sft.env `{name}`"))?
        }
        SftSource::Rejection => {
            let (name, opts) = crate::sft::data::source_env(cfg, s)?;
            let mut task = crate::task::EnvTask::new(&name, &opts)
                .with_context(|| format!("sft.env `{name}`"))?;
            let max_prompts = if s.max_prompts == 0 {
                8 * s.examples
            } else {
                s.max_prompts
            };
            model.set_adapter_enabled(true);
            let (kept, drawn) = rejection_examples(
                model,
                renderer,
                &mut task,
                &cfg.grpo,
                s.examples,
                s.min_reward,
                max_prompts,
                seed,
            )?;
            crate::note!(
                "rejection sampling: kept {} completions with reward >= {} from {drawn} prompts x {}",
                kept.len(),
                s.min_reward,
                cfg.grpo.num_generations
            );
            if kept.is_empty() {
                bail!(
                    "sft: rejection sampling kept no completion with reward >= {} from {drawn} \
                     prompts; lower sft.min_reward, raise sft.max_prompts, or start from a \
                     better adapter (model.adapter)",
                    s.min_reward
                );
            }
            kept
        }
    };
    let mc = model.config();
    for (i, e) in examples.iter().enumerate() {
        crate::model::budget::check_positions(
            mc,
            e.prompt_ids.len() + e.completion_ids.len(),
            &format!("sft demonstration {}", i + 1),
        )?;
    }
    Ok(examples)
}

/// Rejection sampling: draw prompts of `task` in rounds of `g.prompts_per_step`, sample
/// `g.num_generations` completions of each with the model as it is, and keep those that
/// ended on a stop token with a scalar reward of at least `min_reward`, until `n` are
/// kept or `max_prompts` prompts are drawn. Returns the kept examples (already tokens:
/// the sampled ids) and the prompts drawn.
#[allow(clippy::too_many_arguments)]
pub fn rejection_examples(
    model: &Transformer,
    renderer: &dyn Renderer,
    task: &mut EnvTask,
    g: &GrpoConfig,
    n: usize,
    min_reward: f64,
    max_prompts: usize,
    seed: u64,
) -> Result<(Vec<Example>, usize)> {
    let g = GrpoConfig {
        dynamic_sampling: false,
        ..g.clone()
    };
    let stop = renderer.stop_ids();
    let mut kept = Vec::new();
    let mut drawn = 0;
    let mut round = 0u64;
    while kept.len() < n && drawn < max_prompts {
        let want = g.prompts_per_step.min(max_prompts - drawn);
        let gr = GrpoConfig {
            prompts_per_step: want,
            ..g.clone()
        };
        let batch = crate::grpo::batch::collect(
            model,
            renderer,
            task,
            &gr,
            mix(seed, round),
            false,
            &crate::dist::Dist::single(),
        )?;
        drawn += want;
        round += 1;
        for r in batch.rollouts {
            let stopped = r.completion_ids.last().is_some_and(|t| stop.contains(t));
            if kept.len() < n && stopped && !r.truncated && r.scalar >= min_reward {
                kept.push(Example {
                    prompt_ids: r.prompt_ids,
                    completion_ids: r.completion_ids,
                });
            }
        }
    }
    Ok((kept, drawn))
}

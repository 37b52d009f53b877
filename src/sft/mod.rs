//! Supervised fine-tuning of the LoRA adapter on demonstrations (`concord sft`), and
//! what the warm start before GRPO (`[sft] warm_start = true`, run by
//! [`crate::train::run`]) trains with ([`train_into`]).
//!
//! Real pipelines start RL from a policy that already writes the answer format: a
//! cold-start SFT (DeepSeek-R1), or rejection-sampling fine-tuning on filtered rollouts.
//! A model that never produces a valid answer gives every completion of a group the
//! same reward, so GRPO sees no signal at all.
//!
//! 1. Demonstrations ([`data`]): a JSONL file, an environment's scripted policy, or the
//!    model's own samples with a reward of at least `min_reward` (rejection sampling).
//!    All are read, checked and tokenized before the run directory is touched.
//! 2. The loss ([`loss`]): TRL `SFTTrainer`'s completion-only cross-entropy, averaged
//!    over the completion tokens of the whole batch; prompt tokens carry none.
//! 3. The loop ([`trainer`]): GRPO's model, LoRA, AdamW, schedule, checkpoints, resume
//!    and run-directory guard; `training_log.csv` has TRL's SFT names (`loss`,
//!    `grad_norm`, `learning_rate`, `num_tokens`, `mean_token_accuracy`).
pub mod data;
pub mod loss;
pub mod trainer;

use crate::config::sft::SftSource;
use crate::config::Config;
use crate::model::qwen2::Qwen2;
use crate::rng::mix_seeds as mix;
use crate::task::Renderer;
use anyhow::{bail, Context, Result};
use data::Example;
use std::path::Path;
use trainer::SftTrainer;

/// What `concord sft` is given.
pub type SftOptions = crate::run::dir::RunOptions;

/// The demonstrations `[sft]` asks for, tokenized and checked against the model's
/// context length. Rejection sampling uses `model` as it is (its adapter on).
pub fn build_examples(
    cfg: &Config,
    model: &Qwen2,
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
            let demos = data::read_jsonl(path)?;
            data::tokenize(&demos, renderer, &path.display().to_string())?
        }
        SftSource::Env => {
            let (name, opts) = data::source_env(cfg, s)?;
            let factory =
                crate::envs::create(&name, &opts).with_context(|| format!("sft.env `{name}`"))?;
            let demos =
                data::scripted_demos(factory.as_ref(), &s.policy, s.examples, seed, s.balance)?;
            data::tokenize(&demos, renderer, &format!("sft.env `{name}`"))?
        }
        SftSource::Rejection => {
            let (name, opts) = data::source_env(cfg, s)?;
            let mut task = crate::task::EnvTask::new(&name, &opts)
                .with_context(|| format!("sft.env `{name}`"))?;
            let max_prompts = if s.max_prompts == 0 {
                8 * s.examples
            } else {
                s.max_prompts
            };
            model.set_adapter_enabled(true);
            let (kept, drawn) = data::rejection_examples(
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

/// Train `model`'s LoRA on the `[sft]` demonstrations into `run_dir` (already claimed by
/// the caller): build the examples, then the loop. Returns the steps taken in all.
pub(crate) fn train_into(
    cfg: &Config,
    model: &mut Qwen2,
    renderer: &dyn Renderer,
    base: &str,
    run_dir: &Path,
    resume: bool,
) -> Result<usize> {
    let examples = build_examples(cfg, model, renderer)?;
    let pad_id = renderer.stop_ids().first().copied().unwrap_or(0);
    crate::note!(
        "sft: {} demonstrations ({} completion tokens) into {}",
        examples.len(),
        examples
            .iter()
            .map(|e| e.completion_ids.len())
            .sum::<usize>(),
        run_dir.display()
    );
    let mut t = SftTrainer::new(
        cfg,
        model,
        examples,
        pad_id,
        base.to_string(),
        run_dir.to_path_buf(),
        resume,
    )?;
    t.train()?;
    Ok(t.state.step)
}

/// `concord sft`: validate the config and the model, build and check every
/// demonstration, then lock and claim the run directory (as `train` does: `--resume`,
/// `--overwrite`) and train.
pub fn run_sft(opts: SftOptions) -> Result<()> {
    let (cfg_path, cfg) = crate::run::dir::load_run_config(
        opts.config.as_deref(),
        opts.resume.as_deref(),
        opts.overwrite,
        &opts.sets,
    )?;
    if cfg.sft.is_none() {
        bail!(
            "{}: no [sft] section (source = \"jsonl\" | \"env\" | \"rejection\")",
            cfg_path.display()
        );
    }
    let run_dir = cfg.run_dir();
    let (mut model, renderer) = crate::model::load::load_with_renderer(&cfg.model_spec()?)?;
    let base = cfg.model.name.clone();
    // Bad data stops here, before the run directory is touched.
    let examples = build_examples(&cfg, &model, renderer.as_ref())?;
    let _lock = crate::run::dir::claim(&run_dir, opts.resume.is_some(), opts.overwrite, "sft")?;
    let started = std::time::Instant::now();
    let pad_id = renderer.stop_ids().first().copied().unwrap_or(0);
    let mut t = SftTrainer::new(
        &cfg,
        &mut model,
        examples,
        pad_id,
        base,
        run_dir.clone(),
        opts.resume.is_some(),
    )?;
    t.train().map_err(|e| {
        crate::run::signal::with_resume_hint(e, || crate::run::dir::resume_command("sft", &run_dir))
    })?;
    crate::note!(
        "done: {} SFT steps in {:.1}s; adapter in {}",
        t.state.step,
        started.elapsed().as_secs_f64(),
        run_dir.display()
    );
    Ok(())
}

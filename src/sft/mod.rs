//! Supervised fine-tuning of the LoRA adapter on demonstrations: what `concord sft`
//! and the warm start before GRPO (`[sft] warm_start = true`) train with
//! ([`train_into`]); both are entered from [`crate::train`], which gathers the
//! demonstrations ([`crate::train::demos`]).
//!
//! Real pipelines start RL from a policy that already writes the answer format: a
//! cold-start SFT (DeepSeek-R1), or rejection-sampling fine-tuning on filtered rollouts.
//! A model that never produces a valid answer gives every completion of a group the
//! same reward, so GRPO sees no signal at all.
//!
//! 1. Demonstrations ([`data`]): a JSONL file or an environment's scripted policy (the
//!    model's own samples with a reward of at least `min_reward`, rejection sampling,
//!    come from [`crate::train::demos`]). All are read, checked and tokenized before the
//!    run directory is touched.
//! 2. The loss ([`loss`]): TRL `SFTTrainer`'s completion-only cross-entropy, averaged
//!    over the completion tokens of the whole batch; prompt tokens carry none.
//! 3. The loop ([`trainer`]) on the shared learning core ([`crate::learn`]): AdamW,
//!    schedule, packing, planning, checkpoints and resume, as GRPO's; `training_log.csv` has TRL's SFT names (`loss`,
//!    `grad_norm`, `learning_rate`, `num_tokens`, `mean_token_accuracy`).
pub mod data;
pub mod loss;
pub mod stop;
pub mod trainer;

use crate::config::Config;
use crate::model::Transformer;
use anyhow::Result;
use data::Example;
use std::path::Path;
use trainer::SftTrainer;

/// Train `model`'s LoRA on `examples` into `run_dir` (already claimed by the caller),
/// with `[sft]`, `[optim]` and `[run]` of `cfg`. Returns the steps taken in all.
pub fn train_into(
    cfg: &Config,
    model: &mut Transformer,
    examples: Vec<Example>,
    pad_id: u32,
    base: &str,
    run_dir: &Path,
    resume: bool,
) -> Result<usize> {
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
    Ok(t.session.state.step)
}

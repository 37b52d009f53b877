//! Update: the collected batch's micro-batches -> forward with LoRA -> completion
//! log-probs (never `[B, T, vocab]`) -> loss -> backward on the LoRA variables,
//! accumulated -> NaN/inf check -> global-norm clipping -> AdamW with the scheduled
//! learning rate; `num_iterations` times over the same batch.
use super::batch::Batch;
use super::loss::{grpo_loss, LossInputs, LossParams, LossScale, LossStats};
use super::optim::{clip_grad_norm, AdamW, LrSchedule};
use super::pack::{micro_batches, pack, Packed, Rollout};
use crate::config::{GrpoConfig, OptimConfig};
use crate::model::qwen2::{Mode, Qwen2};
use crate::rng::mix_seeds as mix;
use anyhow::Result;
use candle_core::{DType, Tensor};
use std::time::Instant;

/// What an update did.
#[derive(Debug, Clone, Default)]
pub struct UpdateStats {
    /// Loss statistics of the first iteration (the loss itself of the last one).
    pub loss: LossStats,
    pub grad_norm: f64,
    /// The update was skipped (non-finite loss or gradient); the adapter is untouched.
    pub skipped: bool,
    pub learning_rate: f64,
    /// Token positions that went through a training forward.
    pub trained_tokens: usize,
    pub secs: f64,
}

/// The parts of the trainer an update changes or reads.
pub struct Learner<'a> {
    pub model: &'a Qwen2,
    pub opt: &'a mut AdamW,
    pub sched: &'a LrSchedule,
    pub pad_id: u32,
}

impl Learner<'_> {
    /// Update on `batch` (step index `step`, step seed `seed`, which seeds dropout).
    pub fn update(
        &mut self,
        batch: &mut Batch,
        g: &GrpoConfig,
        optim: &OptimConfig,
        step: usize,
        seed: u64,
    ) -> Result<UpdateStats> {
        let t_train = Instant::now();
        let loss_params = LossParams::from_config(g);
        let rollouts = &mut batch.rollouts;
        let masks: Vec<Vec<f32>> = rollouts
            .iter()
            .map(|r| r.loss_mask(g.mask_truncated_completions))
            .collect();
        let scale = LossScale::from_masks(masks.iter().map(|m| m.as_slice()));
        // Rows with zero advantage carry no gradient unless the KL term is on: skip them
        // (their share of the normalisers above stays, so the update is unchanged).
        let active: Vec<usize> = (0..rollouts.len())
            .filter(|&i| g.beta > 0.0 || rollouts[i].advantage != 0.0)
            .filter(|&i| !rollouts[i].completion_ids.is_empty())
            .collect();
        let mut out = UpdateStats::default();
        for iter in 0..g.num_iterations {
            let mut acc: Option<Vec<Tensor>> = None;
            let mut it_stats = LossStats::default();
            for (mi, range) in micro_batches(active.len(), optim.micro_batch)
                .into_iter()
                .enumerate()
            {
                if range.is_empty() {
                    continue;
                }
                let rows: Vec<&Rollout> = active[range.clone()]
                    .iter()
                    .map(|&i| &rollouts[i])
                    .collect();
                let packed = pack(&rows, self.pad_id, g.mask_truncated_completions)?;
                let dropout_seed = mix(mix(seed, 2 + iter as u64), mi as u64);
                let (lp, ent) = completion_logprobs(
                    self.model,
                    &packed,
                    Mode::Train { dropout_seed },
                    g.temperature,
                    true,
                )?;
                let dev = lp.device().clone();
                let (b, c) = (packed.rows, packed.comp_len);
                let mask = Tensor::from_vec(packed.mask.clone(), (b, c), &dev)?;
                let advt = Tensor::from_vec(packed.advantages.clone(), b, &dev)?;
                let old = if packed.has_old {
                    Some(Tensor::from_vec(packed.old_logp.clone(), (b, c), &dev)?)
                } else {
                    None
                };
                let reference = if g.beta > 0.0 {
                    // With LoRA the reference policy is the base model: the same
                    // weights with the adapter switched off, no copy.
                    self.model.set_adapter_enabled(false);
                    let r = completion_logprobs(
                        self.model,
                        &packed,
                        Mode::Detached,
                        g.temperature,
                        false,
                    );
                    self.model.set_adapter_enabled(true);
                    Some(r?.0)
                } else {
                    None
                };
                let loss_out = grpo_loss(
                    &LossInputs {
                        logp: &lp,
                        old_logp: old.as_ref(),
                        ref_logp: reference.as_ref(),
                        advantages: &advt,
                        mask: &mask,
                        entropy: ent.as_ref(),
                    },
                    &loss_params,
                    &scale,
                )?;
                it_stats.merge(&loss_out.stats);
                if g.num_iterations > 1 && iter == 0 {
                    // Record the sampling-time policy's log-probs for later iterations.
                    let rows_lp: Vec<Vec<f32>> = lp.detach().to_vec2()?;
                    for (k, &ri) in active[range].iter().enumerate() {
                        let n = rollouts[ri].completion_ids.len();
                        rollouts[ri].old_logp = Some(rows_lp[k][..n].to_vec());
                    }
                }
                let grads = loss_out.loss.backward()?;
                self.opt.accumulate(&mut acc, &grads)?;
                out.trained_tokens += b * packed.width;
            }
            let mut grads = match acc {
                Some(a) => a,
                None => self.zero_grads()?,
            };
            let loss_ok = it_stats.loss.is_finite() || active.is_empty();
            let norm = clip_grad_norm(&mut grads, optim.max_grad_norm)?;
            let update_idx = step * g.num_iterations + iter;
            out.learning_rate = optim.learning_rate * self.sched.factor(update_idx);
            if !loss_ok || !norm.is_finite() {
                out.skipped = true;
                eprintln!(
                    "step {}: non-finite {} ({}): update skipped, adapter untouched",
                    step + 1,
                    if loss_ok { "gradient" } else { "loss" },
                    if loss_ok { norm } else { it_stats.loss }
                );
            } else {
                self.opt.set_lr(out.learning_rate);
                self.opt.step(&grads)?;
            }
            out.grad_norm = norm;
            if iter == 0 {
                out.loss = it_stats;
            } else {
                out.loss.loss = it_stats.loss;
            }
        }
        out.secs = t_train.elapsed().as_secs_f64();
        Ok(out)
    }

    fn zero_grads(&self) -> Result<Vec<Tensor>> {
        self.opt
            .vars()
            .map(|(_, v)| {
                let t = v.as_tensor();
                Ok(Tensor::zeros(t.shape(), DType::F32, t.device())?)
            })
            .collect()
    }
}

/// Per-token log-probs `[B, comp_len]` (f32) of a packed micro-batch's completion
/// tokens under `softmax(logits / temperature)`, optionally with entropies. Only the
/// completion positions go through the LM head, in chunks (never `[B, T, vocab]`).
pub fn completion_logprobs(
    model: &Qwen2,
    p: &Packed,
    mode: Mode,
    temperature: f64,
    entropy: bool,
) -> Result<(Tensor, Option<Tensor>)> {
    let dev = model.device().clone();
    let ids = Tensor::from_vec(p.ids.clone(), (p.rows, p.width), &dev)?;
    let hidden = model.forward(&ids, Some(&p.attention), mode)?;
    let h = hidden.narrow(1, p.prompt_len - 1, p.comp_len)?;
    let targets = Tensor::from_vec(p.targets.clone(), (p.rows, p.comp_len), &dev)?;
    let out = model.token_logprobs(&h, &targets, temperature, entropy)?;
    Ok((out.logprobs, out.entropy))
}

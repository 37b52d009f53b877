//! Update: the collected batch's micro-batches -> forward with LoRA -> completion
//! log-probs (never `[B, T, vocab]`) -> loss -> backward on the LoRA variables,
//! accumulated -> NaN/inf check -> global-norm clipping -> AdamW with the scheduled
//! learning rate; `num_iterations` times over the same batch.
//!
//! The micro-batches come from [`super::plan`]: at most `[optim] micro_batch` rows,
//! each estimated to fit the memory budget (`[optim] memory_budget_gb`, by default a
//! share of the available memory), or an error before anything is allocated.
//!
//! With `[optim] share_prompt = true`, each group's prompt goes through the model once
//! per micro-batch ([`completion_logprobs_shared`], [`Qwen2::forward_shared_prefix`]) and
//! micro-batches hold whole groups when they fit (a group too big for the cap or the
//! budget is cut into sub-groups that each run the prompt). The loss normalisation does
//! not change (it is computed over the whole batch). Without LoRA dropout the update
//! equals the unshared one up to float rounding; with dropout, a prompt token's dropout
//! mask is shared by the group's completions.
//!
//! With `[optim] gradient_checkpointing = true` the training forward keeps only each
//! decoder layer's input and [`Checkpoints::backward`] recomputes the layers in the
//! backward: the same gradients up to float rounding, for about one more forward.
use super::batch::Batch;
use super::loss::{grpo_loss, LossInputs, LossParams, LossScale, LossStats};
use super::optim::{clip_grad_norm, summed, AdamW, LrSchedule};
use super::pack::{pack, Packed, Rollout};
use super::plan::{plan, Plan};
use crate::config::{GrpoConfig, OptimConfig};
use crate::dist::Dist;
use crate::model::budget::{MemoryBudget, TrainMemory};
use crate::model::ops;
use crate::model::qwen2::{Checkpoints, Mode, Qwen2};
use crate::rng::mix_seeds as mix;
use anyhow::{bail, Result};
use candle_core::{DType, Tensor};
use std::ops::Range;
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
    /// The micro-batches and the memory budget they were cut to.
    pub plan: Plan,
}

/// The parts of the trainer an update changes or reads.
pub struct Learner<'a> {
    pub model: &'a Qwen2,
    pub opt: &'a mut AdamW,
    pub sched: &'a LrSchedule,
    pub pad_id: u32,
    /// The host-memory budget read earlier in the run (see [`Trainer`]'s
    /// `host_budget`); `None`: resolve it now. `[optim] memory_budget_gb` wins over it.
    ///
    /// [`Trainer`]: super::trainer::Trainer
    pub budget: Option<MemoryBudget>,
    /// The processes of a data-parallel run ([`Dist::single`] otherwise): each trains
    /// its share of the batch's micro-batches ([`deal`]); the gradients and loss
    /// statistics are summed over all of them before clipping.
    pub dist: &'a Dist,
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
        // Rows with zero advantage carry no gradient unless the KL term or an entropy
        // term is on: skip them (their share of the normalisers above stays, so the
        // update is unchanged).
        let every_row = g.beta > 0.0 || g.entropy_coef != 0.0 || g.top_entropy_quantile < 1.0;
        let active: Vec<usize> = (0..rollouts.len())
            .filter(|&i| every_row || rollouts[i].advantage != 0.0)
            .filter(|&i| !rollouts[i].completion_ids.is_empty())
            .collect();
        // The micro-batches: row indices into `rollouts`, and with prompt sharing the
        // row ranges (within the micro-batch) of each group. Cut before anything is
        // allocated, so a row too big for the budget is an error, not an OOM kill.
        let mem = TrainMemory::new(self.model, optim.gradient_checkpointing);
        let budget = match (optim.memory_budget_gb, self.budget) {
            (None, Some(b)) => b,
            _ => MemoryBudget::resolve(optim.memory_budget_gb, self.model.device()),
        };
        let plan = plan(
            rollouts,
            &active,
            optim.micro_batch,
            optim.share_prompt,
            &mem,
            &budget,
        )?;
        // Every process holds the whole batch, so the work is dealt out afresh, by
        // tokens, not by who sampled the rows: whole micro-batches of the one-process
        // plan, each then the very micro-batch one process runs (same rows, shapes and
        // dropout seed). Cutting them finer would change the float rounding, which
        // AdamW's first steps amplify; so with fewer micro-batches than processes
        // (no `micro_batch` cap) some processes have nothing to train.
        let (w, rank) = (self.dist.world_size(), self.dist.rank());
        let tokens: Vec<f64> = plan
            .micro_batches
            .iter()
            .map(|mb| mb.rows.iter().map(|&i| row_tokens(&rollouts[i])).sum())
            .collect();
        let mine = deal(&tokens, w, rank);
        let rows_here: usize = plan
            .micro_batches
            .iter()
            .zip(&mine)
            .filter(|(_, &m)| m)
            .map(|(mb, _)| mb.rows.len())
            .sum();
        let mut out = UpdateStats::default();
        for iter in 0..g.num_iterations {
            let mut acc: Option<Vec<Tensor>> = None;
            let mut it_stats = LossStats::default();
            for (mi, mb) in plan.micro_batches.iter().enumerate() {
                let (idx, groups) = (&mb.rows, &mb.groups);
                if idx.is_empty() || !mine[mi] {
                    continue;
                }
                let checkpoints = optim.gradient_checkpointing.then(Checkpoints::new);
                let rows: Vec<&Rollout> = idx.iter().map(|&i| &rollouts[i]).collect();
                let packed = pack(&rows, self.pad_id, g.mask_truncated_completions)?;
                let dropout_seed = mix(mix(seed, 2 + iter as u64), mi as u64);
                let logprobs = |mode: Mode, entropy: bool, ck: Option<&Checkpoints>| {
                    let f = Forward {
                        model: self.model,
                        mode,
                        checkpoints: ck,
                    };
                    match groups {
                        Some(gr) => f.logprobs_shared(&packed, gr, g.temperature, entropy),
                        None => f.logprobs(&packed, g.temperature, entropy),
                    }
                };
                let (lp, ent) = logprobs(Mode::Train { dropout_seed }, true, checkpoints.as_ref())?;
                let dev = lp.device().clone();
                let (b, c) = (packed.rows, packed.comp_len);
                let mask = Tensor::from_vec(packed.mask.clone(), (b, c), &dev)?;
                let advt = Tensor::from_vec(packed.advantages.clone(), b, &dev)?;
                let old = if packed.has_old {
                    Some(Tensor::from_vec(packed.old_logp.clone(), (b, c), &dev)?)
                } else {
                    None
                };
                let sampler = if packed.has_sampler {
                    Some(Tensor::from_vec(packed.sampler_logp.clone(), (b, c), &dev)?)
                } else {
                    None
                };
                let reference = if g.beta > 0.0 {
                    // With LoRA the reference policy is the base model: the same
                    // weights with the adapter switched off, no copy.
                    self.model.set_adapter_enabled(false);
                    let r = logprobs(Mode::Detached, false, None);
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
                        sampler_logp: sampler.as_ref(),
                    },
                    &loss_params,
                    &scale,
                )?;
                it_stats.merge(&loss_out.stats);
                if g.num_iterations > 1 && iter == 0 {
                    // Record the sampling-time policy's log-probs for later iterations.
                    let rows_lp: Vec<Vec<f32>> = lp.detach().to_vec2()?;
                    for (k, &ri) in idx.iter().enumerate() {
                        let n = rollouts[ri].completion_ids.len();
                        rollouts[ri].old_logp = Some(rows_lp[k][..n].to_vec());
                    }
                }
                let mut grads = loss_out.loss.backward()?;
                if let Some(ck) = &checkpoints {
                    // Free the head's graph before the layers are recomputed.
                    drop((loss_out, lp, ent, reference));
                    ck.backward(self.model, &mut grads)?;
                }
                self.opt.accumulate(&mut acc, &grads)?;
                out.trained_tokens += match groups {
                    Some(gr) => shared_tokens(&packed, gr),
                    None => b * packed.width,
                };
            }
            let mut grads = match acc {
                Some(a) => a,
                None => self.zero_grads()?,
            };
            let mut any_active = rows_here > 0;
            if self.dist.is_distributed() {
                // Sum over the processes: then every one clips and steps identically.
                self.dist.all_reduce_grads(&mut grads)?;
                let mut stats = it_stats.to_vec();
                stats.push(rows_here as f64);
                let all = self.dist.all_gather_f64("loss statistics", &stats)?;
                it_stats = LossStats::default();
                for v in &all {
                    it_stats.merge(&LossStats::from_slice(&v[..LossStats::LEN])?);
                }
                any_active = all.iter().any(|v| v[LossStats::LEN] > 0.0);
            }
            let loss_ok = it_stats.loss.is_finite() || !any_active;
            let mut grads = summed(&grads)?;
            let norm = clip_grad_norm(&mut grads, optim.max_grad_norm)?;
            let update_idx = step * g.num_iterations + iter;
            out.learning_rate = optim.learning_rate * self.sched.factor(update_idx);
            if !loss_ok || !norm.is_finite() {
                out.skipped = true;
                if self.dist.is_root() {
                    crate::note!(
                        "step {}: non-finite {} ({}): update skipped, adapter untouched",
                        step + 1,
                        if loss_ok { "gradient" } else { "loss" },
                        if loss_ok { norm } else { it_stats.loss }
                    );
                }
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
        if self.dist.is_distributed() {
            // Every process's tokens, in the time of the slowest.
            let all = self
                .dist
                .all_gather_f64("update timing", &[out.trained_tokens as f64, out.secs])?;
            out.trained_tokens = all.iter().map(|v| v[0] as usize).sum();
            out.secs = all.iter().map(|v| v[1]).fold(0.0, f64::max);
        }
        out.plan = plan;
        Ok(out)
    }

    fn zero_grads(&self) -> Result<Vec<Tensor>> {
        self.opt
            .vars()
            .map(|(_, v)| {
                let t = v.as_tensor();
                Ok(Tensor::zeros(t.shape(), DType::F64, t.device())?)
            })
            .collect()
    }
}

/// Tokens a row puts through the training forward.
fn row_tokens(r: &Rollout) -> f64 {
    (r.prompt_ids.len() + r.completion_ids.len()) as f64
}

/// Which of a sequence of work items (by cost) are process `rank`'s of `world`: a
/// contiguous run, each item going to the share its middle falls in, so that shares
/// hold about equal cost. The same on every process; every item for one process.
pub fn deal(costs: &[f64], world: usize, rank: usize) -> Vec<bool> {
    if world <= 1 {
        return vec![true; costs.len()];
    }
    let total: f64 = costs.iter().sum();
    let mut before = 0.0;
    costs
        .iter()
        .map(|&c| {
            let owner = (((before + c / 2.0) / total.max(1e-12)) * world as f64) as usize;
            before += c;
            owner.min(world - 1) == rank
        })
        .collect()
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
    Forward::new(model, mode).logprobs(p, temperature, entropy)
}

/// How a training forward runs: the model, the [`Mode`], and with activation
/// checkpointing the record its backward is finished from.
#[derive(Clone, Copy)]
pub struct Forward<'a> {
    pub model: &'a Qwen2,
    pub mode: Mode,
    pub checkpoints: Option<&'a Checkpoints>,
}

impl<'a> Forward<'a> {
    /// A plain forward (no checkpointing).
    pub fn new(model: &'a Qwen2, mode: Mode) -> Self {
        Forward {
            model,
            mode,
            checkpoints: None,
        }
    }

    /// [`completion_logprobs`].
    pub fn logprobs(
        &self,
        p: &Packed,
        temperature: f64,
        entropy: bool,
    ) -> Result<(Tensor, Option<Tensor>)> {
        let model = self.model;
        let dev = model.device().clone();
        let ids = Tensor::from_vec(p.ids.clone(), (p.rows, p.width), &dev)?;
        let hidden = match self.checkpoints {
            Some(ck) => model.forward_checkpointed(&ids, Some(&p.attention), self.mode, ck)?,
            None => model.forward(&ids, Some(&p.attention), self.mode)?,
        };
        let h = hidden.narrow(1, p.prompt_len - 1, p.comp_len)?;
        let targets = Tensor::from_vec(p.targets.clone(), (p.rows, p.comp_len), &dev)?;
        let out = model.token_logprobs(&h, &targets, temperature, entropy)?;
        Ok((out.logprobs, out.entropy))
    }

    /// [`completion_logprobs_shared`].
    pub fn logprobs_shared(
        &self,
        p: &Packed,
        groups: &[Range<usize>],
        temperature: f64,
        entropy: bool,
    ) -> Result<(Tensor, Option<Tensor>)> {
        shared(self, p, groups, temperature, entropy)
    }
}

/// Token positions a shared-prompt forward of `p`'s groups runs: each group's prompt
/// once plus all but the last column of its completions.
pub fn shared_tokens(p: &Packed, groups: &[Range<usize>]) -> usize {
    groups
        .iter()
        .map(|r| {
            let (plen, clen) = group_lens(p, r);
            plen + r.len() * clen.saturating_sub(1)
        })
        .sum()
}

/// (prompt length, longest completion) of the rows `r` of a packed micro-batch.
fn group_lens(p: &Packed, r: &Range<usize>) -> (usize, usize) {
    let row = r.start * p.width;
    let plen = p.attention[row..row + p.prompt_len]
        .iter()
        .filter(|&&a| a != 0)
        .count();
    let clen = r
        .clone()
        .map(|i| {
            let a = &p.attention[i * p.width + p.prompt_len..(i + 1) * p.width];
            a.iter().rposition(|&x| x != 0).map_or(0, |k| k + 1)
        })
        .max()
        .unwrap_or(0);
    (plen, clen)
}

/// [`completion_logprobs`] for a micro-batch whose rows form groups sharing one prompt:
/// `groups` are row ranges of `p` (together all its rows, in order) and every row of a
/// range must carry the same prompt. Each group runs [`Qwen2::forward_shared_prefix`]:
/// its prompt once, its completions (all but their last token, whose hidden state
/// scores nothing) against the prompt's keys/values. Returns the same `[B, comp_len]`
/// log-probs (and entropies) as [`completion_logprobs`], zero in columns past a group's
/// longest completion (masked out by the loss). `Mode::Train`'s dropout seed is mixed
/// with the group's index.
pub fn completion_logprobs_shared(
    model: &Qwen2,
    p: &Packed,
    groups: &[Range<usize>],
    mode: Mode,
    temperature: f64,
    entropy: bool,
) -> Result<(Tensor, Option<Tensor>)> {
    Forward::new(model, mode).logprobs_shared(p, groups, temperature, entropy)
}

fn shared(
    f: &Forward,
    p: &Packed,
    groups: &[Range<usize>],
    temperature: f64,
    entropy: bool,
) -> Result<(Tensor, Option<Tensor>)> {
    let (model, mode) = (f.model, f.mode);
    let dev = model.device().clone();
    let covered: usize = groups.iter().map(|r| r.len()).sum();
    if covered != p.rows
        || groups.first().map(|r| r.start) != Some(0)
        || groups.windows(2).any(|w| w[0].end != w[1].start)
    {
        bail!(
            "completion_logprobs_shared: groups {groups:?} do not tile the {} rows",
            p.rows
        );
    }
    let mut lps = Vec::with_capacity(groups.len());
    let mut ents = Vec::with_capacity(groups.len());
    for (gi, r) in groups.iter().enumerate() {
        if r.is_empty() {
            continue;
        }
        let (plen, clen) = group_lens(p, r);
        let g = r.len();
        let row0 = r.start * p.width;
        let prompt: Vec<u32> = p.ids[row0 + p.prompt_len - plen..row0 + p.prompt_len].to_vec();
        for i in r.clone() {
            let row = i * p.width;
            let same = p.ids[row + p.prompt_len - plen..row + p.prompt_len] == prompt[..]
                && p.attention[row..row + p.prompt_len]
                    .iter()
                    .filter(|&&a| a != 0)
                    .count()
                    == plen;
            if !same {
                bail!("completion_logprobs_shared: row {i} does not share its group's prompt");
            }
        }
        if plen == 0 || clen == 0 {
            bail!("completion_logprobs_shared: empty prompt or completions in group {gi}");
        }
        let gmode = match mode {
            Mode::Train { dropout_seed } => Mode::Train {
                dropout_seed: mix(dropout_seed, gi as u64),
            },
            m => m,
        };
        let prompt_t = Tensor::from_vec(prompt, (1, plen), &dev)?;
        let h = if clen > 1 {
            // Completion tokens 0..clen-1 as input; their hidden states score 1..clen.
            let cin = clen - 1;
            let mut ids = Vec::with_capacity(g * cin);
            let mut mask = Vec::with_capacity(g * cin);
            for i in r.clone() {
                let s = i * p.width + p.prompt_len;
                ids.extend_from_slice(&p.ids[s..s + cin]);
                mask.extend_from_slice(&p.attention[s..s + cin]);
            }
            let ids = Tensor::from_vec(ids, (g, cin), &dev)?;
            let (hp, hc) = match f.checkpoints {
                Some(ck) => model.forward_shared_prefix_checkpointed(
                    &prompt_t,
                    &ids,
                    Some(&mask),
                    gmode,
                    ck,
                )?,
                None => model.forward_shared_prefix(&prompt_t, &ids, Some(&mask), gmode)?,
            };
            ops::prefix_cat(&hp.narrow(1, plen - 1, 1)?, &hc, 1)?
        } else {
            let hp = match f.checkpoints {
                Some(ck) => model.forward_checkpointed(&prompt_t, None, gmode, ck)?,
                None => model.forward(&prompt_t, None, gmode)?,
            };
            let hid = hp.dim(2)?;
            hp.narrow(1, plen - 1, 1)?.broadcast_as((g, 1, hid))?
        };
        let mut targets = Vec::with_capacity(g * clen);
        for i in r.clone() {
            targets.extend_from_slice(&p.targets[i * p.comp_len..i * p.comp_len + clen]);
        }
        let targets = Tensor::from_vec(targets, (g, clen), &dev)?;
        let out = model.token_logprobs(&h, &targets, temperature, entropy)?;
        lps.push(ops::pad_cols(&out.logprobs, p.comp_len)?);
        if let Some(e) = out.entropy {
            ents.push(ops::pad_cols(&e, p.comp_len)?);
        }
    }
    let lp = Tensor::cat(&lps, 0)?;
    let ent = if entropy {
        Some(Tensor::cat(&ents, 0)?)
    } else {
        None
    };
    Ok((lp, ent))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_is_dealt_out_in_order_by_cost() {
        let costs = [40.0, 40.0, 30.0, 30.0, 30.0, 30.0];
        assert_eq!(deal(&costs, 1, 0), vec![true; 6]);
        // 200 in all: 40 + 40 + 30 (middle at 95) is the first half.
        let a = deal(&costs, 2, 0);
        let b = deal(&costs, 2, 1);
        assert_eq!(a, vec![true, true, true, false, false, false]);
        assert_eq!(b, vec![false, false, false, true, true, true]);
        // Any number of processes: each item exactly once, in contiguous runs.
        for w in [3, 8, 20] {
            let owners: Vec<usize> = (0..costs.len())
                .map(|i| {
                    let who: Vec<usize> = (0..w).filter(|&r| deal(&costs, w, r)[i]).collect();
                    assert_eq!(who.len(), 1, "item {i} with {w} processes: {who:?}");
                    who[0]
                })
                .collect();
            assert!(owners.windows(2).all(|p| p[0] <= p[1]), "{owners:?}");
        }
        // Fewer items than processes: some get none.
        assert_eq!(deal(&[5.0], 2, 0), vec![false]);
        assert_eq!(deal(&[5.0], 2, 1), vec![true]);
    }
}

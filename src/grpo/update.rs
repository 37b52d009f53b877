//! Update: the collected batch -> [`Sequence`]s -> micro-batches -> forward with LoRA
//! -> completion log-probs (never `[B, T, vocab]`) -> GRPO loss -> backward on the LoRA
//! variables, accumulated -> summed over the processes -> NaN/inf check -> global-norm
//! clipping -> AdamW with the scheduled learning rate; `num_iterations` times over the
//! same batch. [`Learner::update`] reads in that order:
//! ```ignore
//! let plan = self.plan(&seqs, g, optim)?;          // micro-batches that fit the budget
//! for iter in 0..g.num_iterations {
//!     let part = self.micro_batches(..)?;           // forward, loss, backward, accumulate
//!     let part = self.reduce(part)?;                // sum over the processes
//!     let applied = self.opt.apply(..)?;            // clip, skip if non-finite, AdamW
//! }
//! ```
//!
//! The micro-batches come from [`crate::learn::plan()`]: at most `[optim] micro_batch`
//! rows, each estimated to fit the memory budget (`[optim] memory_budget_gb`, by default
//! a share of the available memory), or an error before anything is allocated.
//!
//! With `[optim] share_prompt = true`, each group's prompt goes through the model once
//! per micro-batch ([`Forward::logprobs_shared`]) and micro-batches hold whole groups
//! when they fit (a group too big for the cap or the budget is cut into sub-groups that
//! each run the prompt). The loss normalisation does not change (it is computed over the
//! whole batch). Without LoRA dropout the update equals the unshared one up to float
//! rounding; with dropout, a prompt token's dropout mask is shared by the group's
//! completions.
//!
//! With `[optim] gradient_checkpointing = true` the training forward keeps only each
//! decoder layer's input and [`Checkpoints::backward`] recomputes the layers in the
//! backward: the same gradients up to float rounding, for about one more forward.
use super::batch::Batch;
use super::loss::{grpo_loss, LossInputs, LossParams, LossScale, LossStats};
use crate::config::{GrpoConfig, OptimConfig};
use crate::dist::Dist;
use crate::learn::forward::shared_tokens;
use crate::learn::optim::{AdamW, LrSchedule};
use crate::learn::plan::{deal, plan, MicroBatch, Plan};
use crate::learn::{pack, Forward, Packed, Sequence};
use crate::model::budget::{MemoryBudget, TrainMemory};
use crate::model::{Checkpoints, Mode, Transformer};
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
    /// The micro-batches and the memory budget they were cut to.
    pub plan: Plan,
}

/// The parts of the trainer an update changes or reads.
pub struct Learner<'a> {
    pub model: &'a Transformer,
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

/// One iteration's work on this process (then, after [`Learner::reduce`], on all).
struct Part {
    /// Summed gradients ([`AdamW::accumulate`]); `None` when no micro-batch ran here.
    grads: Option<Vec<Tensor>>,
    stats: LossStats,
    /// Rows trained (here; after the reduction, whether any process trained one).
    rows: usize,
    tokens: usize,
}

/// What stays fixed over the iterations of an update.
struct Setup<'a> {
    g: &'a GrpoConfig,
    params: LossParams,
    scale: LossScale,
    ckpt: bool,
    seed: u64,
}

impl Learner<'_> {
    /// Update on `batch` (step index `step`, step seed `seed`, which seeds dropout).
    pub fn update(
        &mut self,
        batch: &Batch,
        g: &GrpoConfig,
        optim: &OptimConfig,
        step: usize,
        seed: u64,
    ) -> Result<UpdateStats> {
        let t_train = Instant::now();
        let mask_truncated = g.mask_truncated_completions;
        let mut seqs: Vec<Sequence> = batch
            .rollouts
            .iter()
            .map(|r| r.sequence(mask_truncated))
            .collect();
        let setup = Setup {
            g,
            params: LossParams::from_config(g),
            scale: LossScale::from_masks(seqs.iter().map(|s| s.mask.as_slice())),
            ckpt: optim.gradient_checkpointing,
            seed,
        };
        let plan = self.plan(&seqs, g, optim)?;
        let mine = self.my_share(&plan, &seqs);
        let mut out = UpdateStats::default();
        for iter in 0..g.num_iterations {
            let part = self.micro_batches(&mut seqs, &plan, &mine, &setup, iter)?;
            out.trained_tokens += part.tokens;
            let part = self.reduce(part)?;
            let loss_ok = part.stats.loss.is_finite() || part.rows == 0;
            let grads = match part.grads {
                Some(g) => g,
                None => self.zero_grads()?,
            };
            let update_idx = step * g.num_iterations + iter;
            out.learning_rate = optim.learning_rate * self.sched.factor(update_idx);
            let applied =
                self.opt
                    .apply(&grads, optim.max_grad_norm, out.learning_rate, loss_ok)?;
            if applied.skipped {
                out.skipped = true;
                if self.dist.is_root() {
                    crate::note!(
                        "step {}: non-finite {} ({}): update skipped, adapter untouched",
                        step + 1,
                        if loss_ok { "gradient" } else { "loss" },
                        if loss_ok {
                            applied.grad_norm
                        } else {
                            part.stats.loss
                        }
                    );
                }
            }
            out.grad_norm = applied.grad_norm;
            match iter {
                0 => out.loss = part.stats,
                _ => out.loss.loss = part.stats.loss,
            }
        }
        out.secs = t_train.elapsed().as_secs_f64();
        self.gather_timing(&mut out)?;
        out.plan = plan;
        Ok(out)
    }

    /// The micro-batches of the rows that carry a gradient, cut before anything is
    /// allocated, so a row too big for the budget is an error, not an OOM kill. Rows
    /// with zero advantage carry none unless the KL term or an entropy term is on: they
    /// are left out (their share of the loss normalisers stays, so the update is
    /// unchanged).
    fn plan(&self, seqs: &[Sequence], g: &GrpoConfig, optim: &OptimConfig) -> Result<Plan> {
        let every_row = g.beta > 0.0 || g.entropy_coef != 0.0 || g.top_entropy_quantile < 1.0;
        let active: Vec<usize> = (0..seqs.len())
            .filter(|&i| every_row || seqs[i].advantage != 0.0)
            .filter(|&i| !seqs[i].completion_ids.is_empty())
            .collect();
        let mem = TrainMemory::new(self.model, optim.gradient_checkpointing);
        let budget = match (optim.memory_budget_gb, self.budget) {
            (None, Some(b)) => b,
            _ => MemoryBudget::resolve(optim.memory_budget_gb, self.model.device()),
        };
        plan(
            seqs,
            &active,
            optim.micro_batch,
            optim.share_prompt,
            &mem,
            &budget,
        )
    }

    /// Which micro-batches this process trains. Every process holds the whole batch,
    /// so the work is dealt out afresh, by tokens, not by who sampled the rows: whole
    /// micro-batches of the one-process plan, each then the very micro-batch one
    /// process runs (same rows, shapes and dropout seed). Cutting them finer would
    /// change the float rounding, which AdamW's first steps amplify; so with fewer
    /// micro-batches than processes (no `micro_batch` cap) some processes have nothing
    /// to train.
    fn my_share(&self, plan: &Plan, seqs: &[Sequence]) -> Vec<bool> {
        let tokens: Vec<f64> = plan
            .micro_batches
            .iter()
            .map(|mb| mb.rows.iter().map(|&i| seqs[i].tokens() as f64).sum())
            .collect();
        deal(&tokens, self.dist.world_size(), self.dist.rank())
    }

    /// Forward, loss and backward of this process's micro-batches, the gradients
    /// summed. In the first of several iterations, the log-probs the loss saw are
    /// recorded as the rows' old log-probs.
    fn micro_batches(
        &self,
        seqs: &mut [Sequence],
        plan: &Plan,
        mine: &[bool],
        setup: &Setup,
        iter: usize,
    ) -> Result<Part> {
        let mut part = Part {
            grads: None,
            stats: LossStats::default(),
            rows: 0,
            tokens: 0,
        };
        for (mi, mb) in plan.micro_batches.iter().enumerate() {
            if mb.rows.is_empty() || !mine[mi] {
                continue;
            }
            let dropout_seed = mix(mix(setup.seed, 2 + iter as u64), mi as u64);
            let record = setup.g.num_iterations > 1 && iter == 0;
            let (stats, lp) = self.micro_batch(seqs, mb, setup, dropout_seed, record, &mut part)?;
            part.stats.merge(&stats);
            part.rows += mb.rows.len();
            if let Some(lp) = lp {
                for (row, &i) in lp.iter().zip(&mb.rows) {
                    let n = seqs[i].completion_ids.len();
                    seqs[i].old_logp = Some(row[..n].to_vec());
                }
            }
        }
        Ok(part)
    }

    /// One micro-batch: its loss statistics, and with `record` its log-probs (rows of
    /// the padded completion columns); the gradient goes into `part`.
    fn micro_batch(
        &self,
        seqs: &[Sequence],
        mb: &MicroBatch,
        setup: &Setup,
        dropout_seed: u64,
        record: bool,
        part: &mut Part,
    ) -> Result<(LossStats, Option<Vec<Vec<f32>>>)> {
        let g = setup.g;
        let checkpoints = setup.ckpt.then(Checkpoints::new);
        let rows: Vec<&Sequence> = mb.rows.iter().map(|&i| &seqs[i]).collect();
        let packed = pack(&rows, self.pad_id)?;
        let logprobs = |mode: Mode, entropy: bool, ck: Option<&Checkpoints>, base_only| {
            let f = Forward {
                model: self.model,
                mode,
                checkpoints: ck,
                base_only,
            };
            match &mb.groups {
                Some(gr) => f.logprobs_shared(&packed, gr, g.temperature, entropy),
                None => f.logprobs(&packed, g.temperature, entropy),
            }
        };
        let train = Mode::Train { dropout_seed };
        let (lp, ent) = logprobs(train, true, checkpoints.as_ref(), false)?;
        let reference = if g.beta > 0.0 {
            // With LoRA the reference policy is the base model: the same weights with
            // the adapter off for this forward, no copy.
            Some(logprobs(Mode::Detached, false, None, true)?.0)
        } else {
            None
        };
        let t = LossTensors::of(&packed, lp.device())?;
        let loss_out = grpo_loss(
            &LossInputs {
                logp: &lp,
                old_logp: t.old.as_ref(),
                ref_logp: reference.as_ref(),
                advantages: &t.advantages,
                mask: &t.mask,
                entropy: ent.as_ref(),
                sampler_logp: t.sampler.as_ref(),
            },
            &setup.params,
            &setup.scale,
        )?;
        let recorded = match record {
            true => Some(lp.detach().to_vec2()?),
            false => None,
        };
        let stats = loss_out.stats;
        let mut grads = loss_out.loss.backward()?;
        if let Some(ck) = &checkpoints {
            // Free the head's graph before the layers are recomputed.
            drop((loss_out, lp, ent, reference));
            ck.backward(self.model, &mut grads)?;
        }
        self.opt.accumulate(&mut part.grads, &grads)?;
        part.tokens += match &mb.groups {
            Some(gr) => shared_tokens(&packed, gr),
            None => packed.rows * packed.width,
        };
        Ok((stats, recorded))
    }

    /// Sum the gradients and the loss statistics over the processes, so that every
    /// one clips and steps identically. One process: unchanged.
    fn reduce(&self, mut part: Part) -> Result<Part> {
        if !self.dist.is_distributed() {
            return Ok(part);
        }
        let mut grads = match part.grads.take() {
            Some(g) => g,
            None => self.zero_grads()?,
        };
        self.dist.all_reduce_grads(&mut grads)?;
        let mut stats = part.stats.to_vec();
        stats.push(part.rows as f64);
        let all = self.dist.all_gather_f64("loss statistics", &stats)?;
        let mut sum = LossStats::default();
        for v in &all {
            sum.merge(&LossStats::from_slice(&v[..LossStats::LEN])?);
        }
        let any = all.iter().any(|v| v[LossStats::LEN] > 0.0);
        Ok(Part {
            grads: Some(grads),
            stats: sum,
            rows: usize::from(any),
            tokens: part.tokens,
        })
    }

    /// Every process's trained tokens, in the time of the slowest.
    fn gather_timing(&self, out: &mut UpdateStats) -> Result<()> {
        if self.dist.is_distributed() {
            let all = self
                .dist
                .all_gather_f64("update timing", &[out.trained_tokens as f64, out.secs])?;
            out.trained_tokens = all.iter().map(|v| v[0] as usize).sum();
            out.secs = all.iter().map(|v| v[1]).fold(0.0, f64::max);
        }
        Ok(())
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

/// A packed micro-batch's per-row inputs of the loss, as tensors.
struct LossTensors {
    mask: Tensor,
    advantages: Tensor,
    old: Option<Tensor>,
    sampler: Option<Tensor>,
}

impl LossTensors {
    fn of(p: &Packed, dev: &candle_core::Device) -> Result<Self> {
        let (b, c) = (p.rows, p.comp_len);
        let cols = |v: &Vec<f32>| Tensor::from_vec(v.clone(), (b, c), dev);
        Ok(LossTensors {
            mask: cols(&p.mask)?,
            advantages: Tensor::from_vec(p.advantages.clone(), b, dev)?,
            old: p.has_old.then(|| cols(&p.old_logp)).transpose()?,
            sampler: p.has_sampler.then(|| cols(&p.sampler_logp)).transpose()?,
        })
    }
}

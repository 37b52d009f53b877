//! The SFT loop. Each step reads top to bottom:
//! ```ignore
//! let rows = self.batch(step);            // batch_size demonstrations, shuffled per pass
//! for micro in rows { forward -> completion log-probs -> sft_loss -> backward }
//! clip -> AdamW (scheduled lr) -> training_log.csv row -> checkpoint every save_every
//! ```
//! The model, LoRA, AdamW, schedule, packing, planning and run session (checkpoints,
//! resume) are the shared learning core's ([`crate::learn`]), as GRPO's are; only the
//! objective differs. The order of demonstrations and
//! the dropout masks of step `s` are pure functions of `(run.seed, s)`, so a resumed
//! run writes the same later rows as an uninterrupted one.
use super::data::Example;
use super::loss::{sft_loss, token_hits};
use super::stop::EarlyStop;
use crate::config::{Config, OptimConfig};
use crate::learn::optim::{AdamWParams, LrSchedule};
use crate::learn::plan::{check_row, plan};
use crate::learn::session::{Session, SessionOptions};
use crate::learn::{pack, Packed, Sequence};
use crate::model::budget::{MemoryBudget, TrainMemory};
use crate::model::{Checkpoints, Mode, Transformer};
use crate::model::{Input, Pass};
use crate::rng::mix_seeds as mix;
use crate::run::log::{self, SftRow};
use anyhow::{bail, Context, Result};
use candle_core::Tensor;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use std::path::PathBuf;
use std::time::Instant;

pub struct SftTrainer<'m> {
    pub model: &'m Transformer,
    examples: Vec<Example>,
    /// The optimizer, the step counters and the run directory's checkpoints.
    pub session: Session,
    sched: LrSchedule,
    /// `[optim]` with the SFT learning rate.
    optim: OptimConfig,
    batch_size: usize,
    /// Demonstrations the run passes over (`epochs x n`), or None with `sft.steps`.
    stream_len: Option<usize>,
    pub total_steps: usize,
    seed: u64,
    save_every: usize,
    /// `[run] report_to` names `"tensorboard"`.
    tensorboard: bool,
    pad_id: u32,
    /// The current pass's order (pass index, permutation).
    order: Option<(usize, Vec<usize>)>,
    /// The memory a micro-batch may take: `[optim] memory_budget_gb`, else a share of
    /// the memory available at the first step (read once, so the split, and with it the
    /// log, does not depend on what else runs later).
    budget: Option<MemoryBudget>,
    /// `stop_at_loss` / `stop_at_token_accuracy`: the window the stop rule reads.
    stop: Option<EarlyStop>,
}

impl<'m> SftTrainer<'m> {
    /// A trainer over `model`'s LoRA variables writing to `run_dir` (created): resumes
    /// from its latest checkpoint when `resume`, else starts fresh logs. `cfg` gives
    /// `[sft]`, `[optim]` and `[run]`; its config.toml is written into `run_dir`.
    pub fn new(
        cfg: &Config,
        model: &'m mut Transformer,
        examples: Vec<Example>,
        pad_id: u32,
        base_model: String,
        run_dir: PathBuf,
        resume: bool,
    ) -> Result<Self> {
        let Some(sft) = cfg.sft.clone() else {
            bail!("the config has no [sft] section");
        };
        if examples.is_empty() {
            bail!("no demonstrations to train on");
        }
        let optim = OptimConfig {
            learning_rate: sft.learning_rate,
            ..cfg.optim.clone()
        };
        let mut session = Session::open(
            model,
            SessionOptions {
                run_toml: cfg.to_run_toml(&run_dir)?,
                run_dir,
                params: AdamWParams::from_config(&optim),
                seed: cfg.run.seed,
                resume,
                writes: true,
                base_model,
                save_total_limit: cfg.run.save_total_limit,
            },
        )?;
        session.state.csv_header = log::sft_header();
        let model: &'m Transformer = model;
        let n = examples.len();
        let total_steps = sft.total_steps(n);
        let stop = match sft.stop_rule() {
            Some(rule) if resume => Some(EarlyStop::resumed(
                rule,
                &session.run_dir,
                session.state.step,
            )?),
            Some(rule) => Some(EarlyStop::new(rule)),
            None => None,
        };
        Ok(Self {
            model,
            examples,
            sched: LrSchedule::from_config(&optim, total_steps),
            session,
            optim,
            batch_size: sft.batch_size,
            stream_len: (sft.steps == 0).then_some(sft.epochs * n),
            total_steps,
            seed: cfg.run.seed,
            save_every: cfg.run.save_every,
            tensorboard: cfg.run.tensorboard(),
            pad_id,
            order: None,
            budget: None,
            stop,
        })
    }

    /// Train to the last step, writing checkpoints every `save_every` steps and at the
    /// end, and the adapter into the run directory.
    pub fn train(&mut self) -> Result<()> {
        crate::run::signal::install();
        let every = (self.total_steps / 10).max(1);
        while self.session.state.step < self.total_steps {
            if let Some(why) = self.stop_reason() {
                // A resumed run that had stopped: its checkpoint is this step's.
                crate::note!("sft stopped after step {}: {why}", self.session.state.step);
                break;
            }
            let row = self.step()?;
            if let Some(stop) = self.stop.as_mut() {
                stop.push(row.loss, row.mean_token_accuracy);
            }
            let stopping = self.stop_reason();
            let s = self.session.state.step;
            if s == self.total_steps || s.is_multiple_of(every) {
                crate::note!(
                    "sft step {s}/{} loss {:.4} mean_token_accuracy {:.3} ({:.1}s)",
                    self.total_steps,
                    row.loss,
                    row.mean_token_accuracy,
                    row.seconds
                );
            }
            let interrupted = crate::run::signal::interrupted();
            let due = s == self.total_steps
                || stopping.is_some()
                || (self.save_every > 0 && s.is_multiple_of(self.save_every));
            if due || interrupted {
                let checkpoint = self.save_checkpoint()?;
                if interrupted {
                    let stop = crate::run::signal::Interrupted {
                        what: "SFT",
                        step: s,
                        checkpoint,
                    };
                    return Err(stop.into());
                }
            }
            if let Some(why) = stopping {
                crate::note!("sft stopped after step {s}: {why}");
                break;
            }
        }
        self.session.save_adapter(self.model)
    }

    /// Why the early-stop rule ends the warm start now, if it does.
    fn stop_reason(&self) -> Option<String> {
        self.stop.as_ref().and_then(|s| s.reached())
    }

    /// Indices (into the demonstrations) of step `step`'s batch: positions
    /// `step * batch_size ..` of the stream of passes, each pass a fresh permutation.
    pub fn batch(&mut self, step: usize) -> Vec<usize> {
        let n = self.examples.len();
        let lo = step * self.batch_size;
        let hi = ((step + 1) * self.batch_size).min(self.stream_len.unwrap_or(usize::MAX));
        (lo..hi)
            .map(|k| {
                let pass = k / n;
                if self.order.as_ref().is_none_or(|(p, _)| *p != pass) {
                    let mut perm: Vec<usize> = (0..n).collect();
                    let mut rng =
                        rand_chacha::ChaCha8Rng::seed_from_u64(mix(self.seed, pass as u64));
                    perm.shuffle(&mut rng);
                    self.order = Some((pass, perm));
                }
                self.order.as_ref().map_or(0, |(_, perm)| perm[k % n])
            })
            .collect()
    }

    /// One optimizer step on the next batch; appends its training_log.csv row.
    pub fn step(&mut self) -> Result<SftRow> {
        let t0 = Instant::now();
        let step = self.session.state.step;
        let rows: Vec<Sequence> = self
            .batch(step)
            .into_iter()
            .map(|i| self.examples[i].sequence())
            .collect();
        let num_tokens: usize = rows.iter().map(|r| r.completion_ids.len()).sum();
        let (acc, loss, hits) = self.micro_batches(&rows, step, num_tokens)?;
        let Some(acc) = acc else {
            bail!("step {}: an empty batch", step + 1);
        };
        let lr = self.optim.learning_rate * self.sched.factor(step);
        let applied =
            self.session
                .opt
                .apply(&acc, self.optim.max_grad_norm, lr, loss.is_finite())?;
        if applied.skipped {
            crate::note!(
                "sft step {}: non-finite loss or gradient: update skipped",
                step + 1
            );
        }
        let step_time = t0.elapsed().as_secs_f64();
        let state = &mut self.session.state;
        state.step += 1;
        state.num_tokens += rows.iter().map(|r| r.tokens() as f64).sum::<f64>();
        state.seconds += step_time;
        let seen = (state.step * self.batch_size).min(self.stream_len.unwrap_or(usize::MAX));
        let row = SftRow {
            step: state.step,
            epoch: seen as f64 / self.examples.len() as f64,
            loss,
            grad_norm: applied.grad_norm,
            learning_rate: lr,
            num_tokens: state.num_tokens,
            mean_token_accuracy: hits as f64 / num_tokens.max(1) as f64,
            skipped: if applied.skipped { 1.0 } else { 0.0 },
            step_time,
            seconds: state.seconds,
        };
        log::append_sft_row(&self.session.run_dir, &row, self.tensorboard)?;
        Ok(row)
    }

    /// Forward, loss and backward of the batch's micro-batches, cut to the memory
    /// budget like GRPO's (the loss is normalised by the whole batch's `num_tokens`, so
    /// the split does not change the update): the summed gradients, the loss and the
    /// completion tokens predicted.
    fn micro_batches(
        &mut self,
        rows: &[Sequence],
        step: usize,
        num_tokens: usize,
    ) -> Result<(Option<Vec<Tensor>>, f64, usize)> {
        let step_seed = mix(self.seed, step as u64);
        let first = self.budget.is_none();
        let budget = *self.budget.get_or_insert_with(|| {
            MemoryBudget::resolve(self.optim.memory_budget_gb, self.model.device())
        });
        let ckpt = self.optim.gradient_checkpointing;
        let mem = TrainMemory::new(self.model, ckpt);
        if first {
            self.check_every_demonstration(&mem, &budget)?;
        }
        let all: Vec<usize> = (0..rows.len()).collect();
        let split = plan(rows, &all, self.optim.micro_batch, false, &mem, &budget)?;
        if first {
            crate::note!("sft step {}: {}", step + 1, split.summary());
        }
        let (mut acc, mut loss, mut hits) = (None, 0.0, 0);
        for (mi, micro) in split.micro_batches.iter().enumerate() {
            let refs: Vec<&Sequence> = micro.rows.iter().map(|&i| &rows[i]).collect();
            let mode = Mode::Train {
                dropout_seed: mix(step_seed, mi as u64),
            };
            let n = num_tokens as f64;
            let ck = ckpt.then(Checkpoints::new);
            let shared = match self.optim.share_prompt {
                true => micro_step_shared(self.model, &refs, self.pad_id, n, mode, ck.as_ref())?,
                false => None,
            };
            let (l, h) = match shared {
                Some(out) => out,
                None => {
                    let packed = pack(&refs, self.pad_id)?;
                    micro_step(self.model, &packed, n, mode, ck.as_ref())?
                }
            };
            loss += l.to_scalar::<f32>()? as f64;
            hits += h;
            let mut grads = l.backward()?;
            if let Some(ck) = &ck {
                // the head's graph goes before the layers are recomputed
                drop(l);
                ck.backward(self.model, &mut grads)?;
            }
            self.session.opt.accumulate(&mut acc, &grads)?;
        }
        Ok((acc, loss, hits))
    }

    /// Every demonstration fits the memory budget alone, or the run stops now, naming
    /// it, instead of at the step whose shuffle first draws it.
    fn check_every_demonstration(&self, mem: &TrainMemory, budget: &MemoryBudget) -> Result<()> {
        for (i, e) in self.examples.iter().enumerate() {
            check_row(&e.sequence(), mem, budget, "shorten the demonstrations")
                .with_context(|| format!("demonstration {} of {}", i + 1, self.examples.len()))?;
        }
        Ok(())
    }

    /// `checkpoint-STEP/` (adapter, optimizer, state) and the top-level adapter.
    pub fn save_checkpoint(&self) -> Result<PathBuf> {
        self.session.save(self.model)
    }
}

/// Fewest common prompt tokens worth a shared-prefix forward (below it the second
/// stream costs more than it saves).
pub const MIN_SHARED_PREFIX: usize = 16;

/// [`micro_step`] with the micro-batch's common prompt prefix (the system prompt of an
/// environment's demonstrations) through the model once, its keys and values shared by
/// every row ([`Input::Shared`](crate::model::Input::Shared)): the same loss and gradient, on fewer
/// tokens. `None` when the rows share fewer than [`MIN_SHARED_PREFIX`] tokens (each row
/// keeps at least one prompt token of its own, whose logits predict its completion).
pub fn micro_step_shared(
    model: &Transformer,
    rows: &[&Sequence],
    pad_id: u32,
    num_tokens: f64,
    mode: Mode,
    ck: Option<&Checkpoints>,
) -> Result<Option<(Tensor, usize)>> {
    let Some((first, rest)) = rows.split_first() else {
        return Ok(None);
    };
    let mut shared = rows
        .iter()
        .map(|r| r.prompt_ids.len())
        .min()
        .unwrap_or(0)
        .saturating_sub(1);
    for r in rest {
        let common = first.prompt_ids.iter().zip(&r.prompt_ids);
        shared = shared.min(common.take_while(|(a, b)| a == b).count());
    }
    if rest.is_empty() || shared < MIN_SHARED_PREFIX {
        return Ok(None);
    }
    // Per row: its own prompt tokens left-padded to `own`, then its completion
    // right-padded to `comp` (the completion starts at the same column in every row).
    let own = rows
        .iter()
        .map(|r| r.prompt_ids.len() - shared)
        .max()
        .unwrap_or(1);
    let comp = rows
        .iter()
        .map(|r| r.completion_ids.len())
        .max()
        .unwrap_or(0);
    let (g, w) = (rows.len(), own + comp);
    let mut ids = vec![pad_id; g * w];
    let mut attn = vec![0u8; g * w];
    let mut targets = vec![pad_id; g * comp];
    let mut mask = vec![0f32; g * comp];
    for (i, r) in rows.iter().enumerate() {
        let mine = &r.prompt_ids[shared..];
        let at = i * w + own - mine.len();
        ids[at..at + mine.len()].copy_from_slice(mine);
        attn[at..i * w + own].iter_mut().for_each(|a| *a = 1);
        for (j, &t) in r.completion_ids.iter().enumerate() {
            ids[i * w + own + j] = t;
            attn[i * w + own + j] = 1;
            targets[i * comp + j] = t;
            mask[i * comp + j] = r.mask.get(j).copied().unwrap_or(0.0);
        }
    }
    let dev = model.device().clone();
    let prefix = Tensor::from_vec(first.prompt_ids[..shared].to_vec(), (1, shared), &dev)?;
    let ids = Tensor::from_vec(ids, (g, w), &dev)?;
    let input = Input::shared(&prefix, &ids, Some(&attn));
    let hidden = model.forward(input, Pass::checkpointed(mode, ck))?.rows;
    let h = hidden.narrow(1, own - 1, comp)?;
    let targets_t = Tensor::from_vec(targets.clone(), (g, comp), &dev)?;
    let lp = model.token_logprobs(&h, &targets_t, 1.0, false)?.logprobs;
    let mask_t = Tensor::from_vec(mask.clone(), (g, comp), &dev)?;
    let loss = sft_loss(&lp, &mask_t, num_tokens)?;
    let hits = token_hits(model, &h, &targets, &mask)?;
    Ok(Some((loss, hits)))
}

/// Forward one packed micro-batch: its loss share (`sum of completion NLL /
/// num_tokens`, with the graph) and how many completion tokens the model predicts.
/// The same chunked log-prob path as the learner's `Forward::logprobs` (only completion
/// positions reach the LM head), kept here because the accuracy needs the hidden states.
pub fn micro_step(
    model: &Transformer,
    p: &Packed,
    num_tokens: f64,
    mode: Mode,
    ck: Option<&Checkpoints>,
) -> Result<(Tensor, usize)> {
    let dev = model.device().clone();
    let ids = Tensor::from_vec(p.ids.clone(), (p.rows, p.width), &dev)?;
    let hidden = model
        .forward(
            Input::rows(&ids, Some(&p.attention)),
            Pass::checkpointed(mode, ck),
        )?
        .rows;
    let h = hidden.narrow(1, p.prompt_len - 1, p.comp_len)?;
    let targets = Tensor::from_vec(p.targets.clone(), (p.rows, p.comp_len), &dev)?;
    let lp = model.token_logprobs(&h, &targets, 1.0, false)?.logprobs;
    let mask = Tensor::from_vec(p.mask.clone(), (p.rows, p.comp_len), &dev)?;
    let loss = sft_loss(&lp, &mask, num_tokens)?;
    let hits = token_hits(model, &h, &p.targets, &p.mask)?;
    Ok((loss, hits))
}

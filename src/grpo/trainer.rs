//! The GRPO training loop: `concord train --config F [--set k=v]... [--resume DIR]`.
//!
//! Each step: draw `prompts_per_step` prompts from the task (an environment decision
//! rendered with the chat template) -> sample G completions per prompt with the very
//! weights being trained -> score each completion inline -> advantages -> per
//! micro-batch: forward with LoRA, completion log-probs (never [B, T, vocab]), loss,
//! backward on the LoRA vars only, accumulate -> NaN/inf check -> global-norm clipping
//! -> AdamW (f32 state) with the scheduled learning rate -> log row, samples,
//! checkpoint.
//!
//! Determinism: the prompts, sampling RNG streams and dropout masks of step `s` are
//! pure functions of `(run.seed, s)`, so a resumed run (adapter + optimizer state
//! restored from `checkpoint-S/`) writes the same later rows as an uninterrupted one.
use super::advantage::{check_weights, component_stats, compute_advantages, weighted_reward};
use super::loss::{grpo_loss, LossInputs, LossParams, LossScale, LossStats};
use super::optim::{clip_grad_norm, AdamW, AdamWParams, LrSchedule};
use super::rollout::{micro_batches, pack, Rollout};
use crate::atomic::atomic_write_bytes;
use crate::config::Config;
use crate::curriculum::{total_steps, Stage, StageLength};
use crate::envs::{self, EnvFactory, Reward};
use crate::model::lora::LoraConfig;
use crate::model::qwen2::{Mode, Qwen2};
use crate::rng::mix_seeds as mix;
use crate::sample::{self, Completion, FinishReason, SamplingParams};
use anyhow::{bail, Context, Result};
use candle_core::{DType, Tensor};
use std::any::Any;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

// ------------------------------------------------------------------------ tasks

/// Chat rendering, decoding and stop tokens: the model's tokenizer, or [`IdRenderer`]
/// (ids as text) in tests. One trait, shared with the sampler.
pub use crate::model::tokenizer::{IdRenderer, Renderer};

/// One prompt of a step: its token ids, readable text and whatever the task needs to
/// score completions of it.
pub struct TaskPrompt {
    pub ids: Vec<u32>,
    pub text: String,
    pub state: Box<dyn Any + Send>,
}

/// Where prompts and rewards come from (an environment, or a toy task in tests).
pub trait Task {
    /// Name written to the `env` column.
    fn name(&self) -> String;
    /// `n` prompts for a step; a pure function of `seed`.
    fn prompts(&mut self, seed: u64, n: usize, renderer: &dyn Renderer) -> Result<Vec<TaskPrompt>>;
    /// Reward of one completion of `prompt`.
    fn score(&self, prompt: &TaskPrompt, completion: &Completion) -> Result<Reward>;
    /// Every reward component name the task can produce (the log's columns); empty:
    /// take them from the first step.
    fn component_names(&self) -> Vec<String> {
        Vec::new()
    }
    /// The environment a prompt came from (for mixtures; default: [`Task::name`]).
    fn env_of(&self, prompt: &TaskPrompt) -> String {
        let _ = prompt;
        self.name()
    }
}

/// A registry environment: each prompt is one policy seat's decision.
pub struct EnvTask {
    factory: Box<dyn EnvFactory>,
}

impl EnvTask {
    pub fn new(name: &str, options: &envs::Options) -> Result<Self> {
        Ok(Self {
            factory: envs::create(name, options)?,
        })
    }
}

impl Task for EnvTask {
    fn name(&self) -> String {
        self.factory.name().to_string()
    }
    fn component_names(&self) -> Vec<String> {
        let d = envs::sample_decision(self.factory.as_ref(), 0);
        envs::score_decision(&d, "")
            .components
            .into_keys()
            .collect()
    }
    fn prompts(&mut self, seed: u64, n: usize, renderer: &dyn Renderer) -> Result<Vec<TaskPrompt>> {
        (0..n)
            .map(|i| {
                let episode_seed = envs::training_seed(mix(seed, i as u64));
                let d = envs::sample_decision(self.factory.as_ref(), episode_seed);
                let (text, ids) = renderer.render(&d.messages)?;
                Ok(TaskPrompt {
                    ids,
                    text,
                    state: Box::new(d),
                })
            })
            .collect()
    }
    fn score(&self, prompt: &TaskPrompt, completion: &Completion) -> Result<Reward> {
        let d = prompt
            .state
            .downcast_ref::<envs::Decision>()
            .context("prompt state is not an environment decision")?;
        Ok(envs::score_decision(d, &completion.text))
    }
}

// ------------------------------------------------------------------------ logging

/// One row of training_log.csv.
#[derive(Debug, Clone, Default)]
pub struct StepRow {
    pub step: usize,
    pub stage: String,
    pub env: String,
    pub values: BTreeMap<String, f64>,
    pub components: BTreeMap<String, (f64, f64)>,
}

const FIXED_COLUMNS: &[&str] = &[
    "reward",
    "reward_std",
    "frac_reward_zero_std",
    "completions/mean_length",
    "completions/min_length",
    "completions/max_length",
    "completions/clipped_ratio",
    "kl",
    "entropy",
    "clip_ratio/low_mean",
    "clip_ratio/high_mean",
    "clip_ratio/region_mean",
    "loss",
    "grad_norm",
    "learning_rate",
    "num_tokens",
    "skipped",
    "gen_tokens_per_s",
    "train_tokens_per_s",
    "peak_mem_mb",
    "step_time",
    "seconds",
];

/// Columns whose values depend on wall time (excluded when comparing runs).
pub const TIMING_COLUMNS: &[&str] = &[
    "gen_tokens_per_s",
    "train_tokens_per_s",
    "peak_mem_mb",
    "step_time",
    "seconds",
];

fn csv_header(components: &[String]) -> Vec<String> {
    let mut h = vec!["step".to_string(), "stage".into(), "env".into()];
    let (head, tail) = FIXED_COLUMNS.split_at(3);
    h.extend(head.iter().map(|s| s.to_string()));
    for c in components {
        h.push(format!("rewards/{c}/mean"));
        h.push(format!("rewards/{c}/std"));
    }
    h.extend(tail.iter().map(|s| s.to_string()));
    h
}

fn fmt_f(x: f64) -> String {
    if x.is_finite() {
        format!("{x}")
    } else {
        "nan".into()
    }
}

fn csv_line(header: &[String], row: &StepRow) -> String {
    header
        .iter()
        .map(|c| match c.as_str() {
            "step" => row.step.to_string(),
            "stage" => row.stage.clone(),
            "env" => row.env.clone(),
            _ => {
                if let Some(rest) = c.strip_prefix("rewards/") {
                    if let Some(name) = rest.strip_suffix("/mean") {
                        return row
                            .components
                            .get(name)
                            .map_or(String::new(), |v| fmt_f(v.0));
                    }
                    if let Some(name) = rest.strip_suffix("/std") {
                        return row
                            .components
                            .get(name)
                            .map_or(String::new(), |v| fmt_f(v.1));
                    }
                }
                row.values.get(c).map_or(String::new(), |v| fmt_f(*v))
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// Peak resident set size of this process in MiB (VmHWM), 0 where unknown.
pub fn peak_rss_mb() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("VmHWM:")).and_then(|l| {
                l.split_whitespace()
                    .nth(1)
                    .and_then(|v| v.parse::<f64>().ok())
            })
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

// ------------------------------------------------------------------------ trainer

/// Saved beside each checkpoint.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct TrainerState {
    /// Completed steps.
    pub step: usize,
    pub seed: u64,
    /// Cumulative prompt + completion tokens.
    pub num_tokens: f64,
    /// Cumulative training wall time.
    pub seconds: f64,
    /// The step RNG: seeds of step `s` are `mix(seed, s)`; nothing else to restore.
    pub rng: String,
    pub csv_header: Vec<String>,
    /// Index of the current curriculum stage.
    #[serde(default)]
    pub stage: usize,
    /// Mean reward of each step of the current stage so far (promotion rules).
    #[serde(default)]
    pub stage_rewards: Vec<f64>,
}

/// Test hooks.
#[derive(Default)]
pub struct Hooks {
    /// Multiply advantages by -1 (the learnability control run).
    pub flip_advantages: bool,
    /// Steps whose loss is replaced by NaN (the NaN-skip test).
    pub poison_steps: Vec<usize>,
    /// Stop after this many steps of this process (simulated interruption).
    pub stop_after: Option<usize>,
    /// Hide the progress bar.
    pub quiet: bool,
}

pub struct Trainer {
    pub cfg: Config,
    pub model: Qwen2,
    pub renderer: Box<dyn Renderer>,
    /// The curriculum (one open `main` stage without `[[stage]]` tables).
    pub stages: Vec<Stage>,
    pub opt: AdamW,
    sched: LrSchedule,
    /// Steps the run takes at most (`run.steps`, or less when every stage is bounded).
    total_steps: usize,
    pub run_dir: PathBuf,
    pub state: TrainerState,
    pub hooks: Hooks,
    stop_ids: Vec<u32>,
    pad_id: u32,
    base_model: String,
}

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

fn install_ctrlc() {
    let _ = ctrlc::set_handler(|| {
        if INTERRUPTED.swap(true, Ordering::SeqCst) {
            eprintln!("\ninterrupted twice: exiting without a checkpoint");
            std::process::exit(130);
        }
        eprintln!("\ninterrupt: finishing the step, writing a checkpoint, then exiting");
    });
}

pub fn lora_config(cfg: &Config) -> LoraConfig {
    LoraConfig {
        r: cfg.lora.r,
        alpha: cfg.lora.alpha,
        dropout: cfg.lora.dropout,
        target_modules: cfg.lora.targets.clone(),
        use_rslora: cfg.lora.use_rslora,
        init_seed: cfg.run.seed,
    }
}

/// Load (creating the built-in tiny model first when `model.init_tiny` and the
/// directory is absent) the configured model with a fresh LoRA adapter, and its
/// renderer.
pub fn load_model(cfg: &Config) -> Result<(Qwen2, Box<dyn Renderer>, String)> {
    use crate::model::load::{load_model, ModelSpec};
    let name = cfg.model.name.clone();
    let m = load_model(&ModelSpec {
        dtype: Some(cfg.model.dtype.to_candle()),
        lora: Some(lora_config(cfg)),
        init_tiny: cfg.model.init_tiny,
        ..ModelSpec::new(&name, cfg.model.candle_device()?)
    })?;
    let tokenizer = m
        .tokenizer
        .ok_or_else(|| anyhow::anyhow!("{name} has no tokenizer"))?;
    Ok((m.model, Box::new(tokenizer), name))
}

impl Trainer {
    /// A trainer over an already-built model (with LoRA) and one task for the whole
    /// run. Creates or resumes the run directory.
    pub fn new(
        cfg: Config,
        model: Qwen2,
        renderer: Box<dyn Renderer>,
        task: Box<dyn Task>,
        base_model: String,
        resume: bool,
    ) -> Result<Self> {
        let stage = Stage {
            name: "main".into(),
            length: StageLength::Open,
            cfg: cfg.clone(),
            task,
        };
        Self::with_stages(cfg, model, renderer, vec![stage], base_model, resume)
    }

    /// A trainer over a curriculum ([`crate::curriculum::build`]).
    pub fn with_stages(
        cfg: Config,
        mut model: Qwen2,
        renderer: Box<dyn Renderer>,
        stages: Vec<Stage>,
        base_model: String,
        resume: bool,
    ) -> Result<Self> {
        if stages.is_empty() {
            bail!("a run needs at least one stage");
        }
        let run_dir = cfg.run_dir();
        std::fs::create_dir_all(&run_dir)
            .with_context(|| format!("creating {}", run_dir.display()))?;
        let mut state = TrainerState {
            step: 0,
            seed: cfg.run.seed,
            num_tokens: 0.0,
            seconds: 0.0,
            rng: "splitmix64(seed, step)".into(),
            csv_header: Vec::new(),
            stage: 0,
            stage_rewards: Vec::new(),
        };
        let latest = if resume {
            latest_checkpoint(&run_dir)?
        } else {
            None
        };
        if resume && latest.is_none() {
            eprintln!(
                "no checkpoint in {}: starting from step 0",
                run_dir.display()
            );
        }
        if let Some((_, dir)) = &latest {
            model.load_adapter(dir)?;
        }
        let vars = model.lora_vars();
        if vars.is_empty() {
            bail!("the model has no LoRA parameters to train");
        }
        let mut opt = AdamW::new(vars, AdamWParams::from_config(&cfg.optim))?;
        if let Some((step, dir)) = &latest {
            opt.load(&dir.join("optimizer.safetensors"))?;
            let st: TrainerState = serde_json::from_slice(
                &std::fs::read(dir.join("trainer_state.json"))
                    .with_context(|| format!("reading {}/trainer_state.json", dir.display()))?,
            )?;
            if st.step != *step {
                bail!(
                    "{}: trainer_state step {} != directory step {step}",
                    dir.display(),
                    st.step
                );
            }
            state = st;
            truncate_logs(&run_dir, state.step)?;
            eprintln!("resuming {} from step {}", run_dir.display(), state.step);
        } else {
            // A fresh run starts fresh logs.
            for f in ["training_log.csv", "samples.jsonl"] {
                let p = run_dir.join(f);
                if p.exists() {
                    std::fs::remove_file(&p)?;
                }
            }
        }
        atomic_write_bytes(
            &run_dir.join("config.toml"),
            cfg.to_toml_string()?.as_bytes(),
        )?;
        if state.csv_header.is_empty() {
            let mut names: Vec<String> = stages
                .iter()
                .flat_map(|s| s.task.component_names())
                .collect();
            names.sort();
            names.dedup();
            if !names.is_empty() {
                state.csv_header = csv_header(&names);
            }
        }
        let total_steps = total_steps(&cfg, &stages);
        let total_updates = total_steps * cfg.grpo.num_iterations;
        let sched = LrSchedule::from_config(&cfg.optim, total_updates);
        let stop_ids = renderer.stop_ids();
        let pad_id = stop_ids.first().copied().unwrap_or(0);
        Ok(Self {
            cfg,
            model,
            renderer,
            stages,
            opt,
            sched,
            total_steps,
            run_dir,
            state,
            hooks: Hooks::default(),
            stop_ids,
            pad_id,
            base_model,
        })
    }

    /// The stage the next step belongs to.
    pub fn current_stage(&self) -> &Stage {
        &self.stages[self.state.stage.min(self.stages.len() - 1)]
    }

    fn sampling_params(&self, seed: u64) -> SamplingParams {
        let g = &self.current_stage().cfg.grpo;
        SamplingParams {
            stop_token_ids: self.stop_ids.clone(),
            seed,
            ..SamplingParams::new(
                g.temperature,
                g.top_p,
                g.top_k,
                g.min_p,
                g.repetition_penalty,
                g.max_completion_length,
            )
        }
    }

    /// Train until `run.steps` (or an interrupt / `hooks.stop_after`).
    pub fn train(&mut self) -> Result<()> {
        install_ctrlc();
        let total = self.total_steps;
        let pb = if self.hooks.quiet {
            indicatif::ProgressBar::hidden()
        } else {
            indicatif::ProgressBar::new(total as u64)
        };
        pb.set_style(
            indicatif::ProgressStyle::with_template(
                "{prefix} [{bar:30}] {pos}/{len} {elapsed_precise}<{eta_precise} {msg}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
            .progress_chars("=> "),
        );
        pb.set_prefix(self.cfg.run.name.clone());
        pb.set_position(self.state.step as u64);
        let mut done_here = 0;
        while self.state.step < total && self.state.stage < self.stages.len() {
            let row = self.step()?;
            done_here += 1;
            pb.set_position(self.state.step as u64);
            pb.set_message(format!(
                "reward {:.3} kl {:.4} gen {:.0} tok/s train {:.0} tok/s",
                row.values["reward"],
                row.values["kl"],
                row.values["gen_tokens_per_s"],
                row.values["train_tokens_per_s"],
            ));
            let s = self.state.step;
            let save_every = self.cfg.run.save_every;
            let interrupted = INTERRUPTED.load(Ordering::SeqCst);
            let finished = s == total || self.state.stage >= self.stages.len();
            if finished || (save_every > 0 && s.is_multiple_of(save_every)) || interrupted {
                self.save_checkpoint()?;
            }
            if interrupted {
                pb.abandon_with_message(format!("interrupted: checkpoint-{s} written"));
                bail!(
                    "interrupted at step {s}; resume with `concord train --resume {}`",
                    self.run_dir.display()
                );
            }
            if self.hooks.stop_after == Some(done_here) {
                break;
            }
        }
        pb.finish();
        Ok(())
    }

    /// One GRPO step: sample, score, update, log.
    pub fn step(&mut self) -> Result<StepRow> {
        let t_start = Instant::now();
        let step = self.state.step;
        let seed = mix(self.cfg.run.seed, step as u64);
        let stage_idx = self.state.stage.min(self.stages.len() - 1);
        let g = self.stages[stage_idx].cfg.grpo.clone();
        let optim = self.stages[stage_idx].cfg.optim.clone();
        let loss_params = LossParams::from_config(&g);
        self.opt.params = AdamWParams::from_config(&optim);
        let gsize = g.num_generations;

        // 1. prompts
        let prompts = self.stages[stage_idx].task.prompts(
            seed,
            g.prompts_per_step,
            self.renderer.as_ref(),
        )?;
        // 2. sample G completions per prompt with the current adapter
        self.model.set_adapter_enabled(true);
        let t_gen = Instant::now();
        let prompt_ids: Vec<Vec<u32>> = prompts.iter().map(|p| p.ids.clone()).collect();
        let params = self.sampling_params(mix(seed, 1));
        let renderer = self.renderer.as_ref();
        let decode = |ids: &[u32]| renderer.decode(ids);
        let groups = sample::sample_groups(
            &self.model,
            &decode,
            &prompt_ids,
            gsize,
            &params,
            params.seed,
        )?;
        let gen_secs = t_gen.elapsed().as_secs_f64();
        // 3. score
        let mut rollouts = Vec::with_capacity(gsize * prompts.len());
        for (pi, (p, comps)) in prompts.iter().zip(groups.iter()).enumerate() {
            if comps.len() != gsize {
                bail!(
                    "sampler returned {} completions for prompt {pi}, expected {gsize}",
                    comps.len()
                );
            }
            for c in comps {
                let reward = self.stages[stage_idx].task.score(p, c)?;
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
        if step == 0 || self.state.csv_header.is_empty() {
            check_weights(
                &g.reward_weights,
                rollouts.iter().map(|r| &r.reward.components),
            )?;
        }
        // 4. advantages
        let rewards: Vec<f64> = rollouts.iter().map(|r| r.scalar).collect();
        let adv = compute_advantages(&rewards, gsize, g.scale_rewards)?;
        let sign = if self.hooks.flip_advantages {
            -1.0
        } else {
            1.0
        };
        for (r, a) in rollouts.iter_mut().zip(&adv.values) {
            r.advantage = sign * a;
        }
        let gen_tokens: usize = rollouts.iter().map(|r| r.completion_ids.len()).sum();
        let prompt_tokens: usize = rollouts.iter().map(|r| r.prompt_ids.len()).sum();

        // 5. loss, backward, update (num_iterations updates on this batch)
        let t_train = Instant::now();
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
        let mut stats = LossStats::default();
        let mut grad_norm = 0.0;
        let mut skipped = 0.0;
        let mut lr = 0.0;
        let mut trained_tokens = 0usize;
        for iter in 0..g.num_iterations {
            let mut acc: Option<Vec<Tensor>> = None;
            let mut it_stats = LossStats::default();
            let mb = optim.micro_batch;
            for (mi, range) in micro_batches(active.len(), mb).into_iter().enumerate() {
                if range.is_empty() {
                    continue;
                }
                let rows: Vec<&Rollout> = active[range.clone()]
                    .iter()
                    .map(|&i| &rollouts[i])
                    .collect();
                let packed = pack(&rows, self.pad_id, g.mask_truncated_completions)?;
                let dropout_seed = mix(mix(seed, 2 + iter as u64), mi as u64);
                let (lp, ent) =
                    self.completion_logprobs(&packed, Mode::Train { dropout_seed }, true)?;
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
                    self.model.set_adapter_enabled(false);
                    let r = self.completion_logprobs(&packed, Mode::Detached, false);
                    self.model.set_adapter_enabled(true);
                    Some(r?.0)
                } else {
                    None
                };
                let out = grpo_loss(
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
                let mut loss = out.loss;
                if self.hooks.poison_steps.contains(&step) {
                    loss = (loss * f64::NAN)?;
                }
                it_stats.merge(&out.stats);
                if g.num_iterations > 1 && iter == 0 {
                    // Record the sampling-time policy's log-probs for later iterations.
                    let rows_lp: Vec<Vec<f32>> = lp.detach().to_vec2()?;
                    for (k, &ri) in active[range].iter().enumerate() {
                        let n = rollouts[ri].completion_ids.len();
                        rollouts[ri].old_logp = Some(rows_lp[k][..n].to_vec());
                    }
                }
                let grads = loss.backward()?;
                self.opt.accumulate(&mut acc, &grads)?;
                trained_tokens += b * packed.width;
            }
            let mut grads = match acc {
                Some(a) => a,
                None => self.zero_grads()?,
            };
            let poisoned = self.hooks.poison_steps.contains(&step);
            let loss_ok = !poisoned && (it_stats.loss.is_finite() || active.is_empty());
            let norm = clip_grad_norm(&mut grads, optim.max_grad_norm)?;
            let update_idx = step * g.num_iterations + iter;
            lr = optim.learning_rate * self.sched.factor(update_idx);
            if !loss_ok || !norm.is_finite() {
                skipped = 1.0;
                eprintln!(
                    "step {}: non-finite {} ({}): update skipped, adapter untouched",
                    step + 1,
                    if loss_ok { "gradient" } else { "loss" },
                    if loss_ok { norm } else { it_stats.loss }
                );
            } else {
                self.opt.set_lr(lr);
                self.opt.step(&grads)?;
            }
            grad_norm = norm;
            if iter == 0 {
                stats = it_stats;
            } else {
                stats.loss = it_stats.loss;
            }
        }
        let train_secs = t_train.elapsed().as_secs_f64();

        // 6. log
        let step_time = t_start.elapsed().as_secs_f64();
        self.state.step += 1;
        self.state.num_tokens += (gen_tokens + prompt_tokens) as f64;
        self.state.seconds += step_time;
        let lens: Vec<f64> = rollouts
            .iter()
            .map(|r| r.completion_ids.len() as f64)
            .collect();
        let comps: Vec<&BTreeMap<String, f64>> =
            rollouts.iter().map(|r| &r.reward.components).collect();
        let mut v = BTreeMap::new();
        v.insert("reward".to_string(), adv.reward_mean);
        v.insert("reward_std".into(), adv.reward_std);
        v.insert("frac_reward_zero_std".into(), adv.frac_reward_zero_std);
        v.insert(
            "completions/mean_length".into(),
            super::advantage::mean(&lens),
        );
        v.insert(
            "completions/min_length".into(),
            lens.iter().cloned().fold(f64::INFINITY, f64::min),
        );
        v.insert(
            "completions/max_length".into(),
            lens.iter().cloned().fold(0.0, f64::max),
        );
        v.insert(
            "completions/clipped_ratio".into(),
            rollouts.iter().filter(|r| r.truncated).count() as f64 / rollouts.len().max(1) as f64,
        );
        v.insert("kl".into(), stats.kl());
        v.insert("entropy".into(), stats.entropy());
        v.insert("clip_ratio/low_mean".into(), stats.clip_low());
        v.insert("clip_ratio/high_mean".into(), stats.clip_high());
        v.insert("clip_ratio/region_mean".into(), stats.clip_region());
        v.insert("loss".into(), stats.loss);
        v.insert("grad_norm".into(), grad_norm);
        v.insert("learning_rate".into(), lr);
        v.insert("num_tokens".into(), self.state.num_tokens);
        v.insert("skipped".into(), skipped);
        v.insert(
            "gen_tokens_per_s".into(),
            gen_tokens as f64 / gen_secs.max(1e-9),
        );
        v.insert(
            "train_tokens_per_s".into(),
            trained_tokens as f64 / train_secs.max(1e-9),
        );
        v.insert("peak_mem_mb".into(), peak_rss_mb());
        v.insert("step_time".into(), step_time);
        v.insert("seconds".into(), self.state.seconds);
        let stage = &self.stages[stage_idx];
        let row = StepRow {
            step: self.state.step,
            stage: stage.name.clone(),
            env: stage.task.name(),
            values: v,
            components: component_stats(&comps),
        };
        self.state.stage_rewards.push(adv.reward_mean);
        if let Some(why) = stage.length.finished(&self.state.stage_rewards) {
            let next = self.stages.get(stage_idx + 1).map(|s| s.name.clone());
            if let Some(next) = &next {
                eprintln!(
                    "\nstage `{}` -> `{next}` after step {} ({why})",
                    stage.name, self.state.step
                );
            }
            self.state.stage = stage_idx + 1;
            self.state.stage_rewards.clear();
        }
        self.append_csv(&row)?;
        self.append_samples(stage_idx, &prompts, &rollouts)?;
        Ok(row)
    }

    fn zero_grads(&self) -> Result<Vec<Tensor>> {
        self.opt
            .vars()
            .map(|(_, v)| {
                Ok(Tensor::zeros(
                    v.as_tensor().shape(),
                    DType::F32,
                    v.as_tensor().device(),
                )?)
            })
            .collect()
    }

    /// Per-token log-probs `[B, comp_len]` of the packed completions (+ entropies).
    pub fn completion_logprobs(
        &self,
        p: &super::rollout::Packed,
        mode: Mode,
        entropy: bool,
    ) -> Result<(Tensor, Option<Tensor>)> {
        let temperature = self.current_stage().cfg.grpo.temperature;
        completion_logprobs(&self.model, p, mode, temperature, entropy)
    }

    fn append_csv(&mut self, row: &StepRow) -> Result<()> {
        let path = self.run_dir.join("training_log.csv");
        if self.state.csv_header.is_empty() {
            let names: Vec<String> = row.components.keys().cloned().collect();
            self.state.csv_header = csv_header(&names);
        }
        let mut text = String::new();
        if !path.exists() {
            text.push_str(&self.state.csv_header.join(","));
            text.push('\n');
        }
        text.push_str(&csv_line(&self.state.csv_header, row));
        text.push('\n');
        append(&path, &text)
    }

    fn append_samples(
        &self,
        stage: usize,
        prompts: &[TaskPrompt],
        rollouts: &[Rollout],
    ) -> Result<()> {
        let n = self.cfg.run.log_samples.min(rollouts.len());
        if n == 0 {
            return Ok(());
        }
        // Spread the logged samples over the groups.
        let stride = (rollouts.len() / n).max(1);
        let mut text = String::new();
        for r in rollouts.iter().step_by(stride).take(n) {
            let v = serde_json::json!({
                "step": self.state.step,
                "stage": self.stages[stage].name,
                "env": self.stages[stage].task.env_of(&prompts[r.group]),
                "prompt": prompts[r.group].text,
                "completion": r.text,
                "reward": r.scalar,
                "components": r.reward.components,
                "advantage": r.advantage,
                "tokens": r.completion_ids.len(),
                "truncated": r.truncated,
            });
            text.push_str(&v.to_string());
            text.push('\n');
        }
        append(&self.run_dir.join("samples.jsonl"), &text)
    }

    /// Write `checkpoint-STEP/` (adapter, optimizer, trainer state) and the run's
    /// top-level adapter. The directory appears atomically (built under a temp name).
    pub fn save_checkpoint(&self) -> Result<PathBuf> {
        let s = self.state.step;
        let dir = self.run_dir.join(format!("checkpoint-{s}"));
        let tmp = self.run_dir.join(format!(".checkpoint-{s}.tmp"));
        if tmp.exists() {
            std::fs::remove_dir_all(&tmp)?;
        }
        std::fs::create_dir_all(&tmp)?;
        self.model.save_adapter(&tmp, &self.base_model)?;
        self.opt.save(&tmp.join("optimizer.safetensors"))?;
        atomic_write_bytes(
            &tmp.join("trainer_state.json"),
            &serde_json::to_vec_pretty(&self.state)?,
        )?;
        if dir.exists() {
            std::fs::remove_dir_all(&dir)?;
        }
        std::fs::rename(&tmp, &dir)
            .with_context(|| format!("renaming {} to {}", tmp.display(), dir.display()))?;
        self.model.save_adapter(&self.run_dir, &self.base_model)?;
        let limit = self.cfg.run.save_total_limit;
        if limit > 0 {
            let mut all = list_checkpoints(&self.run_dir)?;
            all.sort();
            while all.len() > limit {
                let (_, d) = all.remove(0);
                let _ = std::fs::remove_dir_all(d);
            }
        }
        Ok(dir)
    }
}

/// Per-token log-probs `[B, comp_len]` (f32) of a packed micro-batch's completion
/// tokens under `softmax(logits / temperature)`, optionally with entropies. Only the
/// completion positions go through the LM head, in chunks (never `[B, T, vocab]`).
pub fn completion_logprobs(
    model: &Qwen2,
    p: &super::rollout::Packed,
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

fn append(path: &Path, text: &str) -> Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))?;
    f.write_all(text.as_bytes())?;
    f.flush()?;
    Ok(())
}

fn list_checkpoints(run_dir: &Path) -> Result<Vec<(usize, PathBuf)>> {
    let mut out = Vec::new();
    if !run_dir.exists() {
        return Ok(out);
    }
    for e in std::fs::read_dir(run_dir)? {
        let e = e?;
        let name = e.file_name().to_string_lossy().to_string();
        if let Some(n) = name
            .strip_prefix("checkpoint-")
            .and_then(|n| n.parse::<usize>().ok())
        {
            if e.path().join("trainer_state.json").exists() {
                out.push((n, e.path()));
            }
        }
    }
    Ok(out)
}

/// The highest `checkpoint-N/` in `run_dir`.
pub fn latest_checkpoint(run_dir: &Path) -> Result<Option<(usize, PathBuf)>> {
    Ok(list_checkpoints(run_dir)?
        .into_iter()
        .max_by_key(|(n, _)| *n))
}

/// Drop rows of training_log.csv / samples.jsonl written after `step` (by the run that
/// was interrupted after its last checkpoint). Atomic rewrite.
fn truncate_logs(run_dir: &Path, step: usize) -> Result<()> {
    let csv = run_dir.join("training_log.csv");
    if csv.exists() {
        let text = std::fs::read_to_string(&csv)?;
        let mut out = String::new();
        for (i, line) in text.lines().enumerate() {
            let keep = i == 0
                || line
                    .split(',')
                    .next()
                    .and_then(|s| s.parse::<usize>().ok())
                    .is_some_and(|s| s <= step);
            if keep {
                out.push_str(line);
                out.push('\n');
            }
        }
        atomic_write_bytes(&csv, out.as_bytes())?;
    }
    let samples = run_dir.join("samples.jsonl");
    if samples.exists() {
        let text = std::fs::read_to_string(&samples)?;
        let mut out = String::new();
        for line in text.lines() {
            let s = serde_json::from_str::<serde_json::Value>(line)
                .ok()
                .and_then(|v| v.get("step").and_then(|s| s.as_u64()));
            if s.is_some_and(|s| s as usize <= step) {
                out.push_str(line);
                out.push('\n');
            }
        }
        atomic_write_bytes(&samples, out.as_bytes())?;
    }
    Ok(())
}

// ------------------------------------------------------------------------ CLI

#[derive(clap::Args, Debug)]
pub struct TrainArgs {
    /// The run configuration (TOML).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Override a key: `--set grpo.temperature=0.7` (repeatable).
    #[arg(long = "set", value_name = "SECTION.KEY=VALUE")]
    pub sets: Vec<String>,
    /// Continue the run in this directory from its latest checkpoint (uses its
    /// config.toml unless --config is given).
    #[arg(long)]
    pub resume: Option<PathBuf>,
}

pub fn run_train(args: TrainArgs) -> Result<()> {
    let cfg_path = match (&args.config, &args.resume) {
        (Some(c), _) => c.clone(),
        (None, Some(dir)) => dir.join("config.toml"),
        (None, None) => bail!("give --config FILE (or --resume RUN_DIR)"),
    };
    let cfg = Config::load(&cfg_path, &args.sets)?;
    if let Some(dir) = &args.resume {
        let want = cfg.run_dir();
        if std::fs::canonicalize(dir).ok() != std::fs::canonicalize(&want).ok() {
            bail!(
                "--resume {} but the config's run directory is {}",
                dir.display(),
                want.display()
            );
        }
    }
    let stages = crate::curriculum::build(&cfg)?;
    let (model, renderer, base) = load_model(&cfg)?;
    let mut t = Trainer::with_stages(cfg, model, renderer, stages, base, args.resume.is_some())?;
    let started = Instant::now();
    t.train()?;
    // Plots are a convenience: a failure to draw them must not fail the run.
    match crate::plot::plot_run(&t.run_dir, 10) {
        Ok(files) => {
            for f in files {
                eprintln!("wrote {}", f.display());
            }
        }
        Err(e) => eprintln!("warning: plots not written: {e:#}"),
    }
    eprintln!(
        "done: {} steps in {:.1}s; adapter in {}",
        t.state.step,
        started.elapsed().as_secs_f64(),
        t.run_dir.display()
    );
    Ok(())
}

// ------------------------------------------------------------------------ bench

#[derive(clap::Args, Debug)]
pub struct BenchTrainArgs {
    /// Model directory or Hub id; `random:0.5b` / `random:tiny` build random weights of
    /// that shape (no download).
    #[arg(long)]
    pub model: String,
    #[arg(long, default_value_t = 8)]
    pub batch: usize,
    #[arg(long, default_value_t = 160)]
    pub seq: usize,
    /// Timed iterations (after one warm-up).
    #[arg(long, default_value_t = 2)]
    pub iters: usize,
    #[arg(long, default_value = "f32")]
    pub dtype: String,
    #[arg(long, default_value = "cpu")]
    pub device: String,
    #[arg(long, default_value_t = 16)]
    pub r: usize,
    #[arg(long)]
    pub json: bool,
}

/// `concord bench train`: LoRA forward + backward of a `[batch, seq]` batch.
pub fn bench_train(a: BenchTrainArgs) -> Result<()> {
    let device = crate::config::parse_device(&a.device)?;
    let dtype = match a.dtype.as_str() {
        "f32" => DType::F32,
        "bf16" => DType::BF16,
        "f16" => DType::F16,
        d => bail!("--dtype {d}: expected f32, bf16 or f16"),
    };
    let lora = LoraConfig {
        r: a.r,
        alpha: 2.0 * a.r as f64,
        dropout: 0.0,
        target_modules: crate::config::LORA_TARGETS
            .iter()
            .map(|s| s.to_string())
            .collect(),
        use_rslora: false,
        init_seed: 0,
    };
    let model = crate::model::load::load_model(&crate::model::load::ModelSpec {
        dtype: Some(dtype),
        lora: Some(lora),
        ..crate::model::load::ModelSpec::new(&a.model, device.clone())
    })?
    .model;
    // B (nonzero) LoRA B so the adapter path is not trivially zero.
    for (_, v) in model.lora_vars() {
        let t = v.as_tensor();
        v.set(&(Tensor::ones(t.shape(), DType::F32, t.device())? * 1e-3)?)?;
    }
    let vocab = model.config().vocab_size as u32;
    let mut s = 12345u64;
    let ids: Vec<u32> = (0..a.batch * a.seq)
        .map(|_| {
            s = mix(s, 1);
            (s % vocab.min(150_000) as u64) as u32
        })
        .collect();
    let ids = Tensor::from_vec(ids, (a.batch, a.seq), &device)?;
    let vars = model.lora_vars();
    let run = || -> Result<()> {
        let lp = model.sequence_logprobs(&ids, None, Mode::Grad, 1.0, false)?;
        let loss = lp.logprobs.sum_all()?.neg()?;
        let grads = loss.backward()?;
        let mut n = 0;
        for (_, v) in &vars {
            if grads.get(v.as_tensor()).is_some() {
                n += 1;
            }
        }
        if n == 0 {
            bail!("no LoRA gradient");
        }
        Ok(())
    };
    run()?; // warm-up
    device.synchronize()?;
    let t = Instant::now();
    for _ in 0..a.iters.max(1) {
        run()?;
    }
    device.synchronize()?;
    let secs = t.elapsed().as_secs_f64() / a.iters.max(1) as f64;
    let tps = (a.batch * a.seq) as f64 / secs;
    let rss = peak_rss_mb();
    if a.json {
        println!(
            "{}",
            serde_json::json!({"tokens_per_s": tps, "seconds": secs, "peak_rss_mb": rss})
        );
    } else {
        println!(
            "bench train {} B={} T={} r={}: {:.1} tokens/s, {:.2} s per forward+backward, peak RSS {:.0} MiB",
            a.model, a.batch, a.seq, a.r, tps, secs, rss
        );
    }
    Ok(())
}

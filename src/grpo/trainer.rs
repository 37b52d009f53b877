//! The GRPO training loop.
//!
//! Each step reads top to bottom:
//! ```ignore
//! let mut batch = self.collect(stage, seed)?;   // prompts -> G completions -> rewards -> advantages
//! let stats = self.update(stage, &batch)?;      // micro-batches: forward, loss, backward, clip, AdamW
//! self.log(stage, &batch, &stats)?;             // training_log.csv row, samples.jsonl
//! self.advance_curriculum(stage, batch.mean_reward());
//! ```
//!
//! Signals: SIGINT (Ctrl-C) and SIGTERM (what Slurm and Kubernetes send before killing
//! a job) both finish the current step, write a checkpoint and exit non-zero with the
//! `--resume` hint; a second signal exits at once. When stderr is not a terminal (a
//! batch job's log), one plain progress line per step is printed (at most one per 2 s,
//! and always the last) instead of the progress bar.
//!
//! [`crate::train::run`] validates everything and locks the run directory before a
//! [`Trainer`] is built.
//!
//! Determinism: the prompts, sampling RNG streams and dropout masks of step `s` are
//! pure functions of `(run.seed, s)`, so a resumed run (adapter + optimizer state
//! restored from `checkpoint-S/`) writes the same later rows as an uninterrupted one.
use super::batch::{collect, Batch};
use super::metrics;
use super::update::{Learner, UpdateStats};
use crate::config::stage::StageLength;
use crate::config::Config;
use crate::curriculum::{total_steps, Stage};
use crate::dist::Dist;
use crate::envs::dataset::program::ProgramFailed;
use crate::envs::remote::ConnectionLost;
use crate::learn::optim::{AdamWParams, LrSchedule};
use crate::learn::session::{Session, SessionOptions};
use crate::model::budget::MemoryBudget;
use crate::model::Transformer;
use crate::rng::mix_seeds as mix;
use crate::run::checkpoint;
use crate::run::log::{self, StepRow};
use crate::task::{Renderer, Task};
use anyhow::{bail, Result};
use std::io::IsTerminal;
use std::path::PathBuf;
use std::rc::Rc;
use std::time::Instant;

pub struct Trainer {
    pub cfg: Config,
    pub model: Transformer,
    pub renderer: Box<dyn Renderer>,
    /// The curriculum (one open `main` stage without `[[stage]]` tables).
    pub stages: Vec<Stage>,
    /// The optimizer, the step counters and the run directory's checkpoints.
    pub session: Session,
    sched: LrSchedule,
    /// Steps the run takes at most (`run.steps`, or less when every stage is bounded).
    total_steps: usize,
    /// Hide the progress bar.
    pub quiet: bool,
    pad_id: u32,
    /// The most micro-batches an update of this process was cut into so far: the
    /// memory line is printed at the first update and whenever this grows.
    max_micro_batches: Option<usize>,
    /// The default memory budget, resolved at the first update (from the process's one
    /// MemAvailable reading, `model::budget::available_memory`).
    host_budget: Option<MemoryBudget>,
    /// The processes of a data-parallel run (one process: [`Dist::single`]). Only rank
    /// 0 writes the run directory and prints progress.
    pub dist: Rc<Dist>,
}

impl Trainer {
    /// A trainer over an already-built model (with LoRA) and one task for the whole
    /// run. Creates or resumes the run directory.
    pub fn new(
        cfg: Config,
        model: Transformer,
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
        model: Transformer,
        renderer: Box<dyn Renderer>,
        stages: Vec<Stage>,
        base_model: String,
        resume: bool,
    ) -> Result<Self> {
        let one = Rc::new(Dist::single());
        Self::with_stages_on(one, cfg, model, renderer, stages, base_model, resume)
    }

    /// [`Trainer::with_stages`] as one process of a data-parallel run: every process
    /// restores the same checkpoint; only rank 0 clears or truncates the logs and
    /// writes config.toml.
    pub fn with_stages_on(
        dist: Rc<Dist>,
        cfg: Config,
        mut model: Transformer,
        renderer: Box<dyn Renderer>,
        stages: Vec<Stage>,
        base_model: String,
        resume: bool,
    ) -> Result<Self> {
        let root = dist.is_root();
        if stages.is_empty() {
            bail!("a run needs at least one stage");
        }
        let run_dir = cfg.run_dir();
        let mut session = Session::open(
            &mut model,
            SessionOptions {
                run_toml: cfg.to_run_toml(&run_dir)?,
                run_dir,
                params: AdamWParams::from_config(&cfg.optim),
                seed: cfg.run.seed,
                resume,
                writes: root,
                base_model,
                save_total_limit: cfg.run.save_total_limit,
            },
        )?;
        let state = &mut session.state;
        if state.frozen.is_empty() {
            // A fresh run, or one resumed from a checkpoint that predates the record
            // (its config.toml was checked instead).
            state.frozen = cfg.frozen_record()?;
        }
        if state.csv_header.is_empty() {
            let mut names: Vec<String> = stages
                .iter()
                .flat_map(|s| s.task.component_names())
                .collect();
            names.sort();
            names.dedup();
            if !names.is_empty() {
                state.csv_header = log::csv_header(&names, optional_columns(&stages));
            }
        }
        let total_steps = total_steps(&cfg, &stages);
        let total_updates = total_steps * cfg.grpo.num_iterations;
        let sched = LrSchedule::from_config(&cfg.optim, total_updates);
        let pad_id = renderer.stop_ids().first().copied().unwrap_or(0);
        Ok(Self {
            cfg,
            model,
            renderer,
            stages,
            session,
            sched,
            total_steps,
            quiet: !root,
            pad_id,
            max_micro_batches: None,
            host_budget: None,
            dist,
        })
    }

    /// The index of the stage the next step belongs to.
    pub(super) fn stage_index(&self) -> usize {
        self.session.state.stage.min(self.stages.len() - 1)
    }

    /// The stage the next step belongs to.
    pub fn current_stage(&self) -> &Stage {
        &self.stages[self.stage_index()]
    }

    /// Train until `run.steps` (or the last stage ends, or an interrupt).
    pub fn train(&mut self) -> Result<()> {
        self.train_with(None, |_| {})
    }

    /// [`Trainer::train`], taking at most `limit` steps in this call, with `edit` applied
    /// to every collected batch before its update (see [`Trainer::step_with`]).
    pub fn train_with(
        &mut self,
        limit: Option<usize>,
        mut edit: impl FnMut(&mut Batch),
    ) -> Result<()> {
        crate::run::signal::install();
        let total = self.total_steps;
        let pb = if self.quiet {
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
        pb.set_position(self.session.state.step as u64);
        let mut lines = (!self.quiet && !std::io::stderr().is_terminal())
            .then(|| ProgressLines::new(self.session.state.step, total));
        self.evaluate_start()?;
        self.evaluate_missing().map_err(|e| self.on_eval_error(e))?;
        let mut done_here = 0;
        while self.session.state.step < total && self.session.state.stage < self.stages.len() {
            if limit == Some(done_here) {
                break;
            }
            let row = match self.step_with(&mut edit) {
                Ok(row) => row,
                Err(e) => return Err(self.on_step_error(e)),
            };
            done_here += 1;
            pb.set_position(self.session.state.step as u64);
            pb.set_message(format!(
                "reward {:.3} kl {:.4} gen {:.0} tok/s train {:.0} tok/s",
                row.reward, row.kl, row.gen_tokens_per_s, row.train_tokens_per_s,
            ));
            let s = self.session.state.step;
            let save_every = self.cfg.run.save_every;
            // A signal reaches the processes of a job at different moments: they stop
            // together, after the same step.
            let interrupted = self
                .dist
                .any("interrupt flag", crate::run::signal::interrupted())?;
            let finished = s == total || self.session.state.stage >= self.stages.len();
            if let Some(p) = lines.as_mut() {
                p.step(s, row.reward, row.step_time, finished || interrupted);
            }
            if !interrupted {
                self.evaluate_if_due(finished)
                    .map_err(|e| self.on_eval_error(e))?;
            }
            if finished || (save_every > 0 && s.is_multiple_of(save_every)) || interrupted {
                self.save_checkpoint()?;
            }
            if interrupted {
                pb.abandon_with_message(format!("interrupted: checkpoint-{s} written"));
                bail!(
                    "interrupted at step {s}; resume with `{}`",
                    crate::run::dir::resume_command("train", &self.session.run_dir)
                );
            }
        }
        pb.finish();
        Ok(())
    }

    /// A step failed. A lost remote environment ([`ConnectionLost`]) or a failed
    /// reward program ([`ProgramFailed`]) happens before the update (while collecting),
    /// so the adapter and optimizer still hold the last finished step: write its
    /// checkpoint and say how to resume, rather than score the lost episodes as zeros.
    fn on_step_error(&self, e: anyhow::Error) -> anyhow::Error {
        let e = {
            let st = &self.stages[self.session.state.stage.min(self.stages.len() - 1)];
            // A server by its (redacted) URL, a built-in environment by its name.
            let on = match st.cfg.env.as_ref().filter(|e| e.url.is_some()) {
                Some(env) => env.label(),
                None => st.task.name(),
            };
            e.context(format!("step {} on {on}", self.session.state.step + 1))
        };
        let lost = if e.chain().any(|c| c.is::<crate::sys::Abandoned>()) {
            "a signal abandoned it"
        } else if e.chain().any(|c| c.is::<ConnectionLost>()) {
            "the OpenEnv server was lost"
        } else if e.chain().any(|c| c.is::<ProgramFailed>()) {
            "the reward program failed"
        } else {
            return e;
        };
        // In a data-parallel run the failing process alone knows: it ends the job
        // (`Dist::or_abort`) and the run resumes from the last saved checkpoint.
        if self.session.state.step == 0 || self.dist.is_distributed() {
            return e;
        }
        let s = self.session.state.step;
        // a signal is the user's own stop: nothing to fix before resuming
        let when = if lost.starts_with("a signal") {
            ""
        } else {
            " once it is fixed"
        };
        match self.save_checkpoint() {
            Ok(_) => e.context(format!(
                "step {} stopped: {lost}; checkpoint-{s} written; resume with `{}`{when}",
                s + 1,
                crate::run::dir::resume_command("train", &self.session.run_dir)
            )),
            Err(ce) => e.context(format!(
                "step {} stopped: {lost}, and writing checkpoint-{s} failed too: {ce:#}",
                s + 1
            )),
        }
    }

    /// A held-out evaluation failed after step `s`'s update. Where a reward program
    /// failed or a server was lost ([`crate::envs::is_lost`]), write checkpoint-s and
    /// say how to resume: the resumed run evaluates step `s` first
    /// ([`Trainer::evaluate_missing`]).
    fn on_eval_error(&self, e: anyhow::Error) -> anyhow::Error {
        let s = self.session.state.step;
        let abandoned = e.chain().any(|c| c.is::<crate::sys::Abandoned>());
        if !(crate::envs::is_lost(&e) || abandoned) || s == 0 || self.dist.is_distributed() {
            return e;
        }
        match self.save_checkpoint() {
            Ok(_) => e.context(format!(
                "the held-out evaluation after step {s} stopped; checkpoint-{s} written; \
                 resume with `{}` once it is fixed",
                crate::run::dir::resume_command("train", &self.session.run_dir)
            )),
            Err(ce) => e.context(format!(
                "the held-out evaluation after step {s} stopped, and writing checkpoint-{s} \
                 failed too: {ce:#}"
            )),
        }
    }

    /// One GRPO step: collect, update, log, advance the curriculum.
    pub fn step(&mut self) -> Result<StepRow> {
        self.step_with(|_| {})
    }

    /// [`Trainer::step`] with `edit` applied to the collected batch before the update:
    /// a seam for research variants (reshaped advantages, ablations) and for tests
    /// (flipped or non-finite advantages).
    pub fn step_with(&mut self, edit: impl FnOnce(&mut Batch)) -> Result<StepRow> {
        let t_start = Instant::now();
        let stage = self.stage_index();
        let seed = self.step_seed();
        let mut batch = self.collect(stage, seed)?;
        edit(&mut batch);
        let stats = self.update(stage, &batch, seed)?;
        let row = self.log(stage, &batch, &stats, t_start)?;
        self.advance_curriculum(stage, batch.mean_reward());
        Ok(row)
    }

    /// The seed of the next step: a pure function of `(run.seed, step)`.
    pub(super) fn step_seed(&self) -> u64 {
        mix(self.cfg.run.seed, self.session.state.step as u64)
    }

    /// Prompts -> G completions each (sampled with the adapter on) -> rewards ->
    /// advantages.
    pub(super) fn collect(&mut self, stage: usize, seed: u64) -> Result<Batch> {
        self.model.set_adapter_enabled(true);
        let first_step = self.session.state.step == 0 || self.session.state.csv_header.is_empty();
        let st = &mut self.stages[stage];
        collect(
            &self.model,
            self.renderer.as_ref(),
            st.task.as_mut(),
            &st.cfg.grpo,
            seed,
            first_step,
            &self.dist,
        )
    }

    /// `num_iterations` AdamW updates on the batch.
    pub(super) fn update(&mut self, stage: usize, batch: &Batch, seed: u64) -> Result<UpdateStats> {
        let cfg = &self.stages[stage].cfg;
        self.session.opt.params = AdamWParams::from_config(&cfg.optim);
        if self.host_budget.is_none() && cfg.optim.memory_budget_gb.is_none() {
            let budget = MemoryBudget::resolve(None, self.model.device());
            if !self.quiet {
                // Once a run: ranks on one host divide it, and the line says so.
                crate::note!("memory budget: {}", budget.describe());
            }
            self.host_budget = Some(budget);
        }
        let stats = Learner {
            model: &self.model,
            opt: &mut self.session.opt,
            sched: &self.sched,
            pad_id: self.pad_id,
            budget: self.host_budget,
            dist: &self.dist,
        }
        .update(batch, &cfg.grpo, &cfg.optim, self.session.state.step, seed)?;
        let n = stats.plan.micro_batches.len();
        if n > 0 && self.max_micro_batches.is_none_or(|m| n > m) {
            self.max_micro_batches = Some(n);
            if !self.quiet {
                crate::note!(
                    "step {}: {}",
                    self.session.state.step + 1,
                    stats.plan.summary()
                );
            }
        }
        Ok(stats)
    }

    /// Count the step, then append its row to training_log.csv and its samples to
    /// samples.jsonl.
    fn log(
        &mut self,
        stage: usize,
        batch: &Batch,
        stats: &UpdateStats,
        t_start: Instant,
    ) -> Result<StepRow> {
        let step_time = t_start.elapsed().as_secs_f64();
        self.session.state.step += 1;
        self.session.state.num_tokens += (batch.gen_tokens() + batch.prompt_tokens()) as f64;
        self.session.state.seconds += step_time;
        let st = &self.stages[stage];
        let row = StepRow {
            step: self.session.state.step,
            stage: st.name.clone(),
            env: st.task.name(),
            num_tokens: self.session.state.num_tokens,
            peak_mem_mb: crate::sys::peak_rss_mb(),
            step_time,
            seconds: self.session.state.seconds,
            ..metrics::row(batch, stats)
        };
        if self.session.state.csv_header.is_empty() {
            let names: Vec<String> = row.components.keys().cloned().collect();
            self.session.state.csv_header = log::csv_header(&names, optional_columns(&self.stages));
        }
        if self.dist.is_root() {
            log::append_row(
                &self.session.run_dir,
                &self.session.state.csv_header,
                &row,
                self.cfg.run.tensorboard(),
            )?;
            let samples = metrics::samples(
                batch,
                st.task.as_ref(),
                self.session.state.step,
                &st.name,
                self.cfg.run.log_samples,
            );
            log::append_samples(&self.session.run_dir, &samples)?;
        }
        Ok(row)
    }

    /// Record the step's mean reward and move to the next stage when this one is over.
    fn advance_curriculum(&mut self, stage: usize, mean_reward: f64) {
        self.session.state.stage_rewards.push(mean_reward);
        let st = &self.stages[stage];
        if let Some(why) = st.length.finished(&self.session.state.stage_rewards) {
            if let Some(next) = self.stages.get(stage + 1) {
                crate::note!(
                    "\nstage `{}` -> `{}` after step {} ({why})",
                    st.name,
                    next.name,
                    self.session.state.step
                );
            }
            self.session.state.stage = stage + 1;
            self.session.state.stage_rewards.clear();
        }
    }

    /// Write `checkpoint-STEP/` (adapter, optimizer, trainer state) and the run's
    /// top-level adapter. In a data-parallel run rank 0 writes (every process holds the
    /// same adapter and optimizer state) and the others wait for it.
    pub fn save_checkpoint(&self) -> Result<PathBuf> {
        if !self.dist.is_root() {
            self.dist.barrier("checkpoint")?;
            return Ok(checkpoint::dir_of(
                &self.session.run_dir,
                self.session.state.step,
            ));
        }
        let dir = self.session.save(&self.model)?;
        self.dist.barrier("checkpoint")?;
        Ok(dir)
    }
}

/// The optional log columns of a run: dynamic sampling's, and those of the loss types
/// with metrics of their own, when any stage uses them.
fn optional_columns(stages: &[Stage]) -> log::OptionalColumns {
    let any =
        |f: &dyn Fn(&crate::config::GrpoConfig) -> bool| stages.iter().any(|s| f(&s.cfg.grpo));
    log::OptionalColumns {
        dynamic_sampling: any(&|g| g.dynamic_sampling),
        cispo: any(&|g| g.loss_type == crate::config::LossType::Cispo),
        vespo: any(&|g| g.loss_type == crate::config::LossType::Vespo),
        episode: stages
            .iter()
            .any(|s| s.cfg.env.as_ref().is_some_and(|e| e.is_episode())),
        contested: stages
            .iter()
            .any(|s| s.cfg.env.as_ref().is_some_and(|e| e.contested)),
        enumerate: stages
            .iter()
            .any(|s| s.cfg.env.as_ref().is_some_and(|e| e.enumerate_actions)),
    }
}

/// Plain progress lines for a stderr that is not a terminal (a batch job's log): one
/// per step, at most one per [`ProgressLines::EVERY`], and always the last step.
struct ProgressLines {
    total: usize,
    first_step: usize,
    started: Instant,
    last: Option<Instant>,
}

impl ProgressLines {
    const EVERY: std::time::Duration = std::time::Duration::from_secs(2);

    fn new(first_step: usize, total: usize) -> Self {
        Self {
            total,
            first_step,
            started: Instant::now(),
            last: None,
        }
    }

    fn step(&mut self, step: usize, reward: f64, step_time: f64, last: bool) {
        if !last && self.last.is_some_and(|t| t.elapsed() < Self::EVERY) {
            return;
        }
        self.last = Some(Instant::now());
        let done = (step - self.first_step).max(1) as f64;
        let per_step = self.started.elapsed().as_secs_f64() / done;
        let eta = per_step * self.total.saturating_sub(step) as f64;
        crate::note!(
            "step {step}/{} reward {reward:.4} step_time {step_time:.2}s eta {}",
            self.total,
            fmt_duration(eta)
        );
    }
}

/// `42s`, `3m07s`, `2h05m`.
fn fmt_duration(secs: f64) -> String {
    let s = secs.max(0.0).round() as u64;
    if s < 60 {
        format!("{s}s")
    } else if s < 3600 {
        format!("{}m{:02}s", s / 60, s % 60)
    } else {
        format!("{}h{:02}m", s / 3600, (s % 3600) / 60)
    }
}

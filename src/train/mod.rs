//! `concord train`: the one entry of a training run ([`run`]). It reads top to bottom:
//! validate everything and lock the run directory ([`prepare`]), the supervised warm
//! start if the config asks for one ([`crate::sft`]), GRPO ([`crate::grpo::trainer`]),
//! the plots. SFT and GRPO are siblings below it; neither calls the other. `concord sft`
//! enters at [`sft::run`]; the demonstrations both gather come from [`demos`].
//!
//! Everything (config, stages, environments, model, sizes) is validated before the run
//! directory is touched; the directory is then locked ([`crate::run::dir::RunLock`]);
//! a directory holding an earlier run is refused unless `--resume` (frozen keys
//! unchanged, see [`crate::config::FROZEN_ON_RESUME`]) or `--overwrite` is given.
pub mod demos;
pub mod sft;

use crate::config::Config;
use crate::curriculum::Stage;
use crate::dist::Dist;
use crate::grpo::trainer::Trainer;
use crate::model::budget::{MemoryBudget, TrainMemory};
use crate::model::Transformer;
use crate::task::Renderer;
use anyhow::{bail, Result};
use std::path::Path;
use std::rc::Rc;
use std::time::Instant;

/// What `concord train` is given.
pub type TrainOptions = crate::run::dir::RunOptions;

/// `concord train`, top to bottom: load and validate the config, its stages and
/// environments, the model and the sizes; lock the run directory (refusing one that
/// holds an earlier run unless resuming, or `overwrite`, which first removes that run's
/// files); with `[sft] warm_start = true`, the supervised warm start (into
/// `RUN_DIR/sft/`, on the same in-memory model; GRPO then starts from its adapter,
/// recorded as `model.adapter` in the run's config.toml); GRPO; the plots. A resumed run
/// whose GRPO part has a checkpoint skips the warm start.
pub fn run(opts: TrainOptions) -> Result<()> {
    let mut run = prepare(&opts)?;
    let dist = run.dist.clone();
    dist.or_abort(|| warm_start(&mut run))?;
    run.train()
}

/// A validated GRPO run whose directory is locked and cleared: what
/// [`PreparedRun::train`] needs, open to a step before it (a supervised warm start
/// trains `model` in place and sets `cfg.model.adapter`).
pub struct PreparedRun {
    pub cfg: Config,
    pub stages: Vec<Stage>,
    pub model: Transformer,
    pub renderer: Box<dyn Renderer>,
    /// The base model's name (recorded in adapter_config.json).
    pub base: String,
    pub resume: bool,
    /// The processes of the run: one, unless it was started by mpirun, torchrun or
    /// srun ([`Dist::from_launch`]).
    pub dist: Rc<Dist>,
    /// Held by rank 0 only.
    _lock: Option<crate::run::dir::RunLock>,
}

/// The first part of [`run`]: the process group joined (when launched as one),
/// everything validated, then the run directory locked and checked
/// ([`crate::run::dir::claim`]).
pub fn prepare(opts: &TrainOptions) -> Result<PreparedRun> {
    let (cfg_path, mut cfg) = crate::run::dir::load_run_config(
        opts.config.as_deref(),
        opts.resume.as_deref(),
        opts.overwrite,
        &opts.sets,
    )?;
    let dist = Rc::new(Dist::from_launch(&mut cfg.model.device)?);
    dist.or_abort(|| prepare_on(opts, &cfg_path, cfg, dist.clone()))
}

/// [`prepare`] after the config is read. Rank 0 goes first (it may create the
/// built-in tiny model and clears the run directory); the others follow once it has.
fn prepare_on(
    opts: &TrainOptions,
    cfg_path: &Path,
    cfg: Config,
    dist: Rc<Dist>,
) -> Result<PreparedRun> {
    const ROOT_FIRST: &str = "rank 0 prepares the run";
    if !dist.is_root() {
        dist.barrier(ROOT_FIRST)?;
    }
    let run_dir = cfg.run_dir();
    if opts.resume.is_some() {
        check_resume_keys(&cfg, &run_dir)?;
    }
    let stages = crate::curriculum::build(&cfg).map_err(|e| {
        let text = std::fs::read_to_string(cfg_path).unwrap_or_default();
        crate::config::locate_env_error(&text, &cfg_path.display().to_string(), &e)
    })?;
    let (model, renderer) = crate::model::load::load_with_renderer(&cfg.model_spec()?)?;
    let base = cfg.model.name.clone();
    check_sizes(&cfg, &stages, &model)?;
    // Everything is valid: now the run directory.
    let lock = if dist.is_root() {
        let resume = opts.resume.is_some();
        let lock = crate::run::dir::claim(&run_dir, resume, opts.overwrite, "train")?;
        dist.barrier(ROOT_FIRST)?;
        Some(lock)
    } else {
        None
    };
    Ok(PreparedRun {
        cfg,
        stages,
        model,
        renderer,
        base,
        resume: opts.resume.is_some(),
        dist,
        _lock: lock,
    })
}

impl PreparedRun {
    /// Train, then draw the plots (the run directory stays locked until the end).
    pub fn train(self) -> Result<()> {
        let dist = self.dist.clone();
        dist.or_abort(|| self.train_here())
    }

    fn train_here(self) -> Result<()> {
        let mut t = Trainer::with_stages_on(
            self.dist,
            self.cfg,
            self.model,
            self.renderer,
            self.stages,
            self.base,
            self.resume,
        )?;
        let started = Instant::now();
        t.train()?;
        let comm = if t.dist.is_distributed() {
            t.dist.comm_report()?
        } else {
            Vec::new()
        };
        if !t.dist.is_root() {
            return Ok(());
        }
        // Plots are a convenience: a failure to draw them must not fail the run.
        match crate::plot::plot_run(&t.session.run_dir, 10) {
            Ok(files) => {
                for f in files {
                    crate::note!("wrote {}", f.display());
                }
            }
            Err(e) => crate::note!("warning: plots not written: {e:#}"),
        }
        let secs = started.elapsed().as_secs_f64();
        crate::note!(
            "done: {} steps in {secs:.1}s; adapter in {}",
            t.session.state.step,
            t.session.run_dir.display()
        );
        if t.dist.is_distributed() {
            crate::note!(
                "data parallel: {} processes over {}; seconds in collectives, summed over \
                 calls (least: the rank that waited least in each call, about the \
                 transfer; most: transfer + waiting for the slowest rank), of {secs:.1}s:",
                t.dist.world_size(),
                t.dist.name(),
            );
            for c in &comm {
                crate::note!(
                    "  {:<24} {:>5} calls  least {:>8.3}s ({:.2}%)  most {:>8.3}s ({:.2}%)",
                    c.what,
                    c.calls,
                    c.least_secs,
                    100.0 * c.least_secs / secs.max(1e-9),
                    c.most_secs,
                    100.0 * c.most_secs / secs.max(1e-9)
                );
            }
        }
        Ok(())
    }
}

/// Refuse a resume whose config changes a [`crate::config::FROZEN_ON_RESUME`] key of
/// what the latest checkpoint recorded (or, for a checkpoint that records nothing, of
/// the run's saved config.toml): an edited config.toml is held to the checkpoint too.
fn check_resume_keys(cfg: &Config, run_dir: &Path) -> Result<()> {
    use crate::run::checkpoint;
    let recorded = match checkpoint::latest(run_dir)? {
        Some((step, dir)) => Some(checkpoint::load_state(&dir, step)?)
            .filter(|s| !s.frozen.is_empty())
            .map(|s| (dir, s.frozen)),
        None => None,
    };
    let saved_path = run_dir.join("config.toml");
    let (changed, against) = match recorded {
        Some((dir, frozen)) => (cfg.record_changes(&frozen)?, dir),
        None if saved_path.exists() => {
            let mut saved = Config::load(&saved_path, &[])?;
            saved.resolve_paths(&std::env::current_dir()?);
            (cfg.frozen_changes(&saved), saved_path)
        }
        None => return Ok(()),
    };
    if !changed.is_empty() {
        bail!(
            "--resume cannot change {}: they shape the adapter, the optimizer state or the \
             schedule the run was started with ({}); start a new run (another run.name) \
             instead",
            changed.join(", "),
            against.display()
        );
    }
    Ok(())
}

/// Sizes against the model: every stage's completions fit `max_position_embeddings`
/// and the generation batch's KV cache fits in memory; a warning when a full-length
/// completion could not be trained within the memory budget.
fn check_sizes(
    cfg: &Config,
    stages: &[crate::curriculum::Stage],
    model: &Transformer,
) -> Result<()> {
    let mc = model.config();
    let mut warned = Vec::new();
    for st in stages {
        let g = &st.cfg.grpo;
        let o = &st.cfg.optim;
        if let Some(w) = crate::learn::plan::long_row_warning(
            &TrainMemory::new(model, o.gradient_checkpointing),
            &MemoryBudget::resolve(o.memory_budget_gb, model.device()),
            g.max_completion_length,
        ) {
            if !warned.contains(&w) {
                crate::note!("warning: {w}");
                warned.push(w);
            }
        }
        crate::model::budget::check_sampling(
            mc,
            model.device(),
            cfg.model.dtype.to_candle(),
            g.batch_size(),
            1,
            g.max_completion_length,
            &format!(
                "grpo.max_completion_length = {} with {} x {} rows",
                g.max_completion_length, g.prompts_per_step, g.num_generations
            ),
        )?;
    }
    Ok(())
}

/// The warm start of [`run`], when the config asks for one. In a data-parallel
/// run rank 0 trains it and the other processes load its adapter.
fn warm_start(run: &mut PreparedRun) -> Result<()> {
    if let Some(dir) = run.cfg.warm_start_dir() {
        let grpo_started =
            run.resume && crate::run::checkpoint::latest(&run.cfg.run_dir())?.is_some();
        if !grpo_started && !run.dist.is_root() {
            run.dist.barrier("warm start")?;
            run.model.load_adapter(&dir)?;
        } else if !grpo_started {
            // The warm start is a standalone SFT run inside the GRPO run directory.
            let mut sft_cfg = run.cfg.clone();
            sft_cfg.run.output_dir = run.cfg.run_dir();
            sft_cfg.run.name = crate::config::WARM_START_DIR.into();
            if let Some(s) = sft_cfg.sft.as_mut() {
                s.warm_start = false;
            }
            // The run's config first, so that `train --resume RUN_DIR` works from any
            // point of the warm start (GRPO records it again, with the adapter).
            let run_dir = run.cfg.run_dir();
            crate::atomic::atomic_write_bytes(
                &run_dir.join("config.toml"),
                run.cfg.to_run_toml(&run_dir)?.as_bytes(),
            )?;
            let started = std::time::Instant::now();
            let steps = demos::build_examples(&sft_cfg, &run.model, run.renderer.as_ref())
                .and_then(|examples| {
                    let pad_id = run.renderer.stop_ids().first().copied().unwrap_or(0);
                    crate::sft::train_into(
                        &sft_cfg,
                        &mut run.model,
                        examples,
                        pad_id,
                        &run.base,
                        &dir,
                        run.resume,
                    )
                })
                .map_err(|e| {
                    crate::run::signal::with_resume_hint(e, || {
                        crate::run::dir::resume_command("train", &run_dir)
                    })
                })?;
            crate::note!(
                "warm start: {steps} SFT steps in {:.1}s; GRPO starts from {}",
                started.elapsed().as_secs_f64(),
                dir.display()
            );
            run.dist.barrier("warm start")?;
        }
        run.cfg.model.adapter = Some(dir);
    }
    Ok(())
}

//! A training run's session: the optimizer over the model's LoRA variables, the
//! counters that survive a resume ([`TrainerState`]), and the run directory's
//! checkpoints. SFT and GRPO each open one; it restores the latest checkpoint on
//! `--resume` (adapter first, then the optimizer built over its variables, then the
//! state, with the logs cut back to it) and saves checkpoints. A step's gradients go
//! to its optimizer through [`AdamW::apply`].
use super::optim::{AdamW, AdamWParams};
use crate::model::Transformer;
use crate::run::checkpoint::{self, TrainerState};
use crate::run::log;
use anyhow::{bail, Context, Result};
use std::path::PathBuf;

/// What a session is opened with.
pub struct SessionOptions {
    pub run_dir: PathBuf,
    pub params: AdamWParams,
    pub seed: u64,
    /// Restore the latest checkpoint, if any.
    pub resume: bool,
    /// This process writes the run directory (rank 0 of a data-parallel run; every
    /// process restores the same checkpoint).
    pub writes: bool,
    /// The run's config.toml, written into the run directory.
    pub run_toml: String,
    /// The base model's name (recorded in adapter_config.json).
    pub base_model: String,
    /// Checkpoints kept (0: all).
    pub save_total_limit: usize,
}

pub struct Session {
    pub run_dir: PathBuf,
    pub opt: AdamW,
    pub state: TrainerState,
    base_model: String,
    save_total_limit: usize,
    writes: bool,
}

impl Session {
    /// Create or resume the run directory for training `model`'s LoRA variables.
    pub fn open(model: &mut Transformer, o: SessionOptions) -> Result<Self> {
        std::fs::create_dir_all(&o.run_dir)
            .with_context(|| format!("creating {}", o.run_dir.display()))?;
        let latest = match o.resume {
            true => checkpoint::latest(&o.run_dir)?,
            false => None,
        };
        if o.resume && latest.is_none() {
            // Nothing to continue: never start a finished run over in place.
            crate::run::dir::check_resumable(&o.run_dir)?;
        }
        if o.resume && latest.is_none() && o.writes {
            crate::note!(
                "no checkpoint in {}: starting from step 0",
                o.run_dir.display()
            );
        }
        // The adapter is restored before the optimizer is built over its variables.
        if let Some((_, dir)) = &latest {
            model.load_adapter(dir)?;
        }
        let vars = model.lora_vars();
        if vars.is_empty() {
            bail!("the model has no LoRA parameters to train");
        }
        let mut opt = AdamW::new(vars, o.params)?;
        let mut state = TrainerState::fresh(o.seed);
        if let Some((step, dir)) = &latest {
            opt.load(&dir.join(checkpoint::OPTIMIZER))?;
            state = checkpoint::load_state(dir, *step)?;
            if o.writes {
                log::truncate_logs(&o.run_dir, state.step)?;
                crate::note!("resuming {} from step {}", o.run_dir.display(), state.step);
            }
        } else if o.writes {
            log::remove_logs(&o.run_dir)?;
        }
        if o.writes {
            crate::atomic::atomic_write_bytes(
                &o.run_dir.join("config.toml"),
                o.run_toml.as_bytes(),
            )?;
        }
        Ok(Session {
            run_dir: o.run_dir,
            opt,
            state,
            base_model: o.base_model,
            save_total_limit: o.save_total_limit,
            writes: o.writes,
        })
    }

    /// Write `checkpoint-STEP/` (adapter, optimizer, state) and the run's top-level
    /// adapter. Only the writing process may call it.
    pub fn save(&self, model: &Transformer) -> Result<PathBuf> {
        if !self.writes {
            bail!("only the process that writes the run directory saves checkpoints");
        }
        let dir = checkpoint::save(&self.run_dir, &self.state, self.save_total_limit, |tmp| {
            model.save_adapter(tmp, &self.base_model)?;
            self.opt.save(&tmp.join(checkpoint::OPTIMIZER))
        })?;
        self.save_adapter(model)?;
        Ok(dir)
    }

    /// The run's top-level adapter (the end of a run).
    pub fn save_adapter(&self, model: &Transformer) -> Result<()> {
        model.save_adapter(&self.run_dir, &self.base_model)
    }
}

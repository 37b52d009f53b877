//! Held-out evaluation during training (`[run] eval_every`, `eval_episodes`): the
//! current adapter plays the first held-out episodes of `concord eval`'s set through
//! the same driver and sampling, and each evaluation appends a row per environment to
//! `eval_log.csv`, starting with a row at step 0 for the adapter GRPO starts from
//! (the warm start, or the base model). Rank 0 plays; the other processes of a
//! data-parallel run wait.

use super::trainer::Trainer;
use crate::run::log;
use anyhow::Result;
use std::time::Instant;

/// Prompts sampled together in a held-out evaluation (as `concord eval`'s default).
const EVAL_BATCH: usize = 32;

impl Trainer {
    /// Evaluate after the step just taken when it is due: every `eval_every` steps and
    /// at the last step (`finished`).
    pub(super) fn evaluate_if_due(&mut self, finished: bool) -> Result<()> {
        let every = self.cfg.run.eval_every;
        let step = self.session.state.step;
        if every == 0 || !(finished || step.is_multiple_of(every)) {
            return Ok(());
        }
        if self.dist.is_root() {
            self.evaluate(step)?;
        }
        self.dist.barrier("held-out evaluation")
    }

    /// Evaluate the starting adapter (the warm start, or the bare base model) before
    /// the first step, so a run's held-out curve starts from where GRPO started. A
    /// resumed run keeps the step-0 row it already has.
    pub(super) fn evaluate_start(&mut self) -> Result<()> {
        let every = self.cfg.run.eval_every;
        if every == 0 || self.session.state.step != 0 {
            return Ok(());
        }
        if self.dist.is_root() && !log::has_eval_row(&self.session.run_dir, 0)? {
            self.evaluate(0)?;
        }
        self.dist.barrier("held-out evaluation at step 0")
    }

    /// A resumed run whose last step was due a held-out row it does not have (its
    /// evaluation failed, or an interrupt came first) evaluates that step first, so the
    /// curve has every row an unbroken run has.
    pub(super) fn evaluate_missing(&mut self) -> Result<()> {
        let every = self.cfg.run.eval_every;
        let step = self.session.state.step;
        if every == 0 || step == 0 || !step.is_multiple_of(every) {
            return Ok(());
        }
        if self.dist.is_root() && !log::has_eval_row(&self.session.run_dir, step)? {
            self.evaluate(step)?;
        }
        self.dist.barrier("held-out evaluation on resume")
    }

    fn evaluate(&self, step: usize) -> Result<()> {
        let episodes = self.cfg.run.eval_episodes;
        let params = crate::eval::sampling(&self.cfg, false, self.renderer.stop_ids())?;
        for (name, target) in crate::eval::eval_targets(&self.cfg)? {
            let t = Instant::now();
            if !self.quiet {
                crate::note!("held-out evaluation at step {step}: {name}, {episodes} episodes");
            }
            let e = target
                .play(
                    &self.model,
                    self.renderer.as_ref(),
                    episodes,
                    0,
                    &params,
                    EVAL_BATCH,
                )?
                .summarise();
            let secs = t.elapsed().as_secs_f64();
            log::append_eval_row(
                &self.session.run_dir,
                step,
                &name,
                &e,
                secs,
                self.cfg.run.tensorboard(),
            )?;
            if !self.quiet {
                let agree = e.behaviour.as_ref().map_or(String::new(), |b| {
                    format!(
                        ", agreement {:.3} (best constant {:.3})",
                        b.agreement, b.best_constant.agreement
                    )
                });
                crate::note!(
                    "held-out at step {step}: {name} win {:.3} [{:.3}, {:.3}], reward {:.3}{agree} ({secs:.0} s)",
                    e.win_rate, e.win_ci95[0], e.win_ci95[1], e.reward_mean
                );
            }
        }
        Ok(())
    }
}

//! `concord plot <run dir>`: PNG charts of a run.
//!
//! * `reward_curve.png`: reward per step (points), its rolling mean (line) and the
//!   curriculum's stage boundaries (dashed, labelled with the new stage).
//!   With an `eval_log.csv` (`[run] eval_every`), the held-out evaluations are drawn
//!   over it: mean reward with 95% whiskers and win rate, per environment.
//! * `components.png`: one line per reward component (`rewards/<c>/mean` columns).
//! * `sft_curve.png` instead of both for an SFT run (`concord sft`, or a warm start's
//!   `sft/` directory: a log with `loss` and no `reward`): loss and token accuracy per
//!   step, with their rolling means.
//! * `before_after.png`: base model vs adapter from `eval.json` (written by
//!   `concord eval --compare`), grouped bars with 95% confidence whiskers.
//! * `learning_curve.png` (with `eval_log.csv`, through [`plot_learning_curve`]): the
//!   held-out reward and win rate against the step, 95% whiskers, and horizontal lines
//!   for the base model, the best constant policy and the heuristic.
//! * `behaviour.png`: from the same `eval.json`, each model's action shares per
//!   situation (stacked bars side by side, one panel per environment), with its
//!   agreement with the reference policy and I(situation; action).
//!
//! Text is drawn with a font embedded in the binary (`assets/DejaVuSans.ttf`), so the
//! images render the same on machines without any system fonts. Every image is
//! rendered into memory, encoded, then written atomically.
mod before_after;
mod behaviour;
mod canvas;
mod components;
mod eval_log;
mod learning_curve;
mod reward_curve;
mod series;
mod sft_curve;
mod step_chart;

pub use before_after::before_after_height;
pub use canvas::{PLOT_HEIGHT, PLOT_WIDTH};
pub use eval_log::{read_eval_log, HeldOut};
pub use learning_curve::RefLine;
pub use series::{padded_range, rolling_mean, stage_boundaries};

use crate::run::eval_report::{EvalReport, EVAL_JSON};
use crate::run::log::{TrainingLog, TRAINING_LOG};
use anyhow::Result;
use before_after::{draw_before_after, env_names};
use behaviour::{behaviour_panels, draw_behaviour};
use canvas::write_png;
use components::draw_components;
use reward_curve::draw_reward_curve;
use sft_curve::draw_sft_curve;
use std::path::{Path, PathBuf};

/// Draw `reward_curve.png` and `components.png` from `training_log.csv` (an SFT log,
/// with `loss` and no `reward`: `sft_curve.png`) and, when
/// `eval.json` holds both a `base` and an `adapter` model, `before_after.png`.
/// Returns the written paths. A missing or malformed `eval.json` is an error; one
/// without both models is skipped.
pub fn plot_run(run_dir: &Path, window: usize) -> Result<Vec<PathBuf>> {
    let window = window.max(1);
    let log_path = run_dir.join(TRAINING_LOG);
    let log = TrainingLog::read(&log_path)?;
    let held = read_eval_log(&run_dir.join(crate::run::log::EVAL_LOG))?;
    let name = run_name(run_dir);
    let mut written = Vec::new();

    if log.column("reward").is_none() && log.column("loss").is_some() {
        let p = run_dir.join("sft_curve.png");
        write_png(&p, PLOT_WIDTH, PLOT_HEIGHT, |root| {
            draw_sft_curve(root, &log, &name, window)
        })?;
        written.push(p);
        written.extend(plot_eval(run_dir, &name)?);
        return Ok(written);
    }

    let p = run_dir.join("reward_curve.png");
    write_png(&p, PLOT_WIDTH, PLOT_HEIGHT, |root| {
        draw_reward_curve(root, &log, &held, &name, window)
    })?;
    written.push(p);

    let p = run_dir.join("components.png");
    write_png(&p, PLOT_WIDTH, PLOT_HEIGHT, |root| {
        draw_components(root, &log, &name, window)
    })?;
    written.push(p);
    written.extend(plot_eval(run_dir, &name)?);
    Ok(written)
}

/// `learning_curve.png` from the run's `eval_log.csv`, with the reference lines `refs`;
/// nothing without held-out evaluations.
pub fn plot_learning_curve(run_dir: &Path, refs: &[RefLine]) -> Result<Option<PathBuf>> {
    let held = read_eval_log(&run_dir.join(crate::run::log::EVAL_LOG))?;
    if held.is_empty() {
        return Ok(None);
    }
    let p = run_dir.join("learning_curve.png");
    write_png(&p, PLOT_WIDTH, 2 * PLOT_HEIGHT - 200, |root| {
        learning_curve::draw_learning_curve(root, &held, refs, &run_name(run_dir))
    })?;
    Ok(Some(p))
}

/// `before_after.png` and `behaviour.png` from the run's `eval.json`, when it has them.
fn plot_eval(run_dir: &Path, name: &str) -> Result<Vec<PathBuf>> {
    let mut written = Vec::new();
    let eval_path = run_dir.join(EVAL_JSON);
    if eval_path.exists() {
        let report = EvalReport::read(&eval_path)?;
        if let (Some(base), Some(adapter)) =
            (report.models.get("base"), report.models.get("adapter"))
        {
            let envs = env_names(base, adapter);
            if !envs.is_empty() {
                let p = run_dir.join("before_after.png");
                let h = before_after_height(envs.len());
                write_png(&p, PLOT_WIDTH, h, |root| {
                    draw_before_after(root, &report, base, adapter, &envs, name)
                })?;
                written.push(p);
            }
        }
        let behaviours = behaviour_panels(&report);
        if !behaviours.is_empty() {
            let p = run_dir.join("behaviour.png");
            let h = 120 + 520 * behaviours.len() as u32;
            write_png(&p, PLOT_WIDTH, h, |root| {
                draw_behaviour(root, &behaviours, name)
            })?;
            written.push(p);
        }
    }
    Ok(written)
}

/// The title's name for the run: its directory's name, resolved when the path is
/// `.` or `..`.
fn run_name(run_dir: &Path) -> String {
    let named = |p: &Path| {
        p.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .filter(|n| !n.is_empty() && n != "." && n != "..")
    };
    named(run_dir)
        .or_else(|| run_dir.canonicalize().ok().and_then(|p| named(&p)))
        .unwrap_or_else(|| run_dir.display().to_string())
}

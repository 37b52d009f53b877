//! `concord sft`: supervised fine-tuning as a run of its own.
use anyhow::{bail, Result};

/// What `concord sft` is given.
pub type SftOptions = crate::run::dir::RunOptions;

/// `concord sft`: validate the config and the model, build and check every
/// demonstration, then lock and claim the run directory (as `train` does: `--resume`,
/// `--overwrite`) and train.
pub fn run(opts: SftOptions) -> Result<()> {
    let (cfg_path, cfg) = crate::run::dir::load_run_config(
        opts.config.as_deref(),
        opts.resume.as_deref(),
        opts.overwrite,
        &opts.sets,
    )?;
    if cfg.sft.is_none() {
        bail!(
            "{}: no [sft] section (source = \"jsonl\" | \"env\" | \"rejection\")",
            cfg_path.display()
        );
    }
    let run_dir = cfg.run_dir();
    let (mut model, renderer) = crate::model::load::load_with_renderer(&cfg.model_spec()?)?;
    let base = cfg.model.name.clone();
    // Bad data stops here, before the run directory is touched.
    let examples = super::demos::build_examples(&cfg, &model, renderer.as_ref())?;
    let _lock = crate::run::dir::claim(&run_dir, opts.resume.is_some(), opts.overwrite, "sft")?;
    let started = std::time::Instant::now();
    let pad_id = renderer.stop_ids().first().copied().unwrap_or(0);
    let steps = crate::sft::train_into(
        &cfg,
        &mut model,
        examples,
        pad_id,
        &base,
        &run_dir,
        opts.resume.is_some(),
    )
    .map_err(|e| {
        crate::run::signal::with_resume_hint(e, || crate::run::dir::resume_command("sft", &run_dir))
    })?;
    crate::note!(
        "done: {} SFT steps in {:.1}s; adapter in {}",
        steps,
        started.elapsed().as_secs_f64(),
        run_dir.display()
    );
    Ok(())
}

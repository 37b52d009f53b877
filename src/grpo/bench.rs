//! `concord bench train`: LoRA forward + backward throughput of a `[batch, seq]` batch
//! (the training half of a GRPO step, without sampling).
use crate::model::lora::{LoraConfig, LORA_TARGETS};
use crate::model::{Checkpoints, Mode};
use crate::model::{Input, Pass};
use anyhow::{bail, Context, Result};
use candle_core::{DType, Device, Tensor};
use std::time::Instant;

/// What `concord bench train` measures.
#[derive(Debug, Clone)]
pub struct BenchTrainOptions {
    /// Model directory, `.gguf` file or Hub id; `random:qwen2.5-0.5b` (alias
    /// `random:0.5b`) / `random:tiny` build random weights of that shape (no download).
    pub model: String,
    pub batch: usize,
    pub seq: usize,
    /// Timed iterations (after one warm-up).
    pub iters: usize,
    pub dtype: DType,
    /// Storage of the frozen base (`[model] base_dtype`); None: `dtype`.
    pub base_dtype: Option<crate::model::quant::BaseDtype>,
    pub device: Device,
    /// LoRA rank (alpha = 2r, every target module).
    pub r: usize,
    /// Recompute layer activations in the backward (`[optim] gradient_checkpointing`).
    pub gradient_checkpointing: bool,
    pub json: bool,
}

/// The frozen base's storage, by type: `{"q4_k": {"tensors": 168, "bytes": ...}}`.
pub fn base_json(model: &crate::model::Transformer) -> serde_json::Value {
    model
        .base_storage()
        .into_iter()
        .map(|(t, n, b)| (t, serde_json::json!({ "tensors": n, "bytes": b })))
        .collect::<serde_json::Map<_, _>>()
        .into()
}

/// Time LoRA forward + backward and print tokens/s, seconds and peak RSS.
pub fn bench_train(a: &BenchTrainOptions) -> Result<()> {
    let device = &a.device;
    let lora = LoraConfig {
        r: a.r,
        alpha: 2.0 * a.r as f64,
        dropout: 0.0,
        target_modules: LORA_TARGETS.iter().map(|s| s.to_string()).collect(),
        use_rslora: false,
        init_seed: 0,
    };
    let model = crate::model::load::load_model(&crate::model::load::ModelSpec {
        dtype: Some(a.dtype),
        base_dtype: a.base_dtype,
        lora: Some(lora),
        ..crate::model::load::ModelSpec::new(&a.model, device.clone())
    })?
    .model;
    // Nonzero LoRA B so the adapter path is not trivially zero.
    for (_, v) in model.lora_vars() {
        let t = v.as_tensor();
        v.set(&(Tensor::ones(t.shape(), DType::F32, t.device())? * 1e-3)?)?;
    }
    let vocab = model.config().vocab_size as u32;
    let mut s = 12345u64;
    let ids: Vec<u32> = (0..a.batch * a.seq)
        .map(|_| {
            s = crate::rng::mix_seeds(s, 1);
            (s % vocab.min(150_000) as u64) as u32
        })
        .collect();
    let ids = Tensor::from_vec(ids, (a.batch, a.seq), device)?;
    let vars = model.lora_vars();
    let run = || -> Result<()> {
        let ck = a.gradient_checkpointing.then(Checkpoints::new);
        let pass = Pass::checkpointed(Mode::Grad, ck.as_ref());
        let hidden = model.forward(Input::rows(&ids, None), pass)?.rows;
        let t = a.seq;
        let lp = model.token_logprobs(
            &hidden.narrow(1, 0, t - 1)?,
            &ids.narrow(1, 1, t - 1)?,
            1.0,
            false,
        )?;
        let loss = lp.logprobs.sum_all()?.neg()?;
        let mut grads = loss.backward()?;
        if let Some(ck) = &ck {
            drop((hidden, lp, loss));
            ck.backward(&model, &mut grads)?;
        }
        if !vars.iter().any(|(_, v)| grads.get(v.as_tensor()).is_some()) {
            bail!("no LoRA gradient");
        }
        Ok(())
    };
    if a.seq < 2 {
        bail!("--seq must be at least 2");
    }
    // The memory estimate of one forward + backward against the growth of peak RSS
    // over the RSS with the model loaded (the trainer's budget covers that growth).
    let estimate = crate::model::budget::TrainMemory::new(&model, a.gradient_checkpointing)
        .estimate(crate::model::budget::TrainShape::Packed {
            rows: a.batch,
            width: a.seq,
            scored: a.seq - 1,
        })
        .bytes();
    let base_rss = crate::sys::rss_mb();
    crate::sys::reset_peak_rss();
    run()?; // warm-up
    device.synchronize()?;
    let t = Instant::now();
    for _ in 0..a.iters.max(1) {
        run()?;
    }
    device.synchronize()?;
    let secs = t.elapsed().as_secs_f64() / a.iters.max(1) as f64;
    let tps = (a.batch * a.seq) as f64 / secs;
    let rss = crate::sys::peak_rss_mb();
    let growth_mb = (rss - base_rss).max(0.0);
    let estimate_mb = estimate / (1024.0 * 1024.0);
    if a.json {
        crate::say!(
            "{}",
            serde_json::json!({
                "tokens_per_s": tps,
                "seconds": secs,
                "peak_rss_mb": rss,
                "base_rss_mb": base_rss,
                "train_peak_mb": growth_mb,
                "estimate_mb": estimate_mb,
                "gradient_checkpointing": a.gradient_checkpointing,
                "base": base_json(&model),
            })
        );
    } else {
        crate::say!(
            "bench train {} B={} T={} r={}{}: {:.1} tokens/s, {:.2} s per forward+backward, peak RSS {:.0} MiB ({:.0} MiB over the loaded model; estimate {:.0} MiB)",
            a.model,
            a.batch,
            a.seq,
            a.r,
            if a.gradient_checkpointing { " checkpointed" } else { "" },
            tps,
            secs,
            rss,
            growth_mb,
            estimate_mb
        );
    }
    Ok(())
}

/// What `concord bench grpo-step` measures.
#[derive(Debug, Clone)]
pub struct BenchStepOptions {
    /// The run configuration (TOML); its run directory is not touched.
    pub config: std::path::PathBuf,
    /// `section.key=value` overrides.
    pub sets: Vec<String>,
    /// Overrides `[model] name`.
    pub model: Option<String>,
    /// Timed steps (after `warmup` untimed ones).
    pub steps: usize,
    /// Untimed warm-up steps before them.
    pub warmup: usize,
    /// Write the timed steps' rendered prompts here as JSON lines
    /// (`{"step", "prompt", "prompt_tokens"}`), so that another trainer can run the very
    /// same prompts (`scripts/bench_grpo_vs_trl.py`).
    pub export_prompts: Option<std::path::PathBuf>,
}

/// The timings of full GRPO steps, averaged over the timed steps.
#[derive(Debug, Clone, serde::Serialize)]
pub struct BenchStepReport {
    pub seconds_per_step: f64,
    pub sampling_s: f64,
    pub scoring_s: f64,
    pub update_s: f64,
    /// Prompt + completion tokens per step (each completion counts its prompt).
    pub tokens: f64,
    pub completion_tokens: f64,
    /// Token positions through the training forward per step.
    pub trained_tokens: f64,
    pub steps: usize,
    pub peak_rss_mb: f64,
    /// Resident memory with the model loaded, before the first step.
    pub load_rss_mb: f64,
    /// The frozen base's storage by type ([`base_json`]).
    pub base: serde_json::Value,
    /// How the last timed update was cut to the memory budget: its micro-batches, and
    /// the trainer's memory line (estimate per row, budget, split).
    pub micro_batches: usize,
    pub memory_plan: String,
}

/// Time full GRPO steps of a config: sampling, scoring, forward + backward and the
/// optimizer. Groups whose rewards tie would skip the update; here their advantages
/// are replaced by small alternating values so that every step pays for a full
/// update, as a step with informative groups does.
pub fn bench_step(o: &BenchStepOptions) -> Result<BenchStepReport> {
    let mut sets = o.sets.clone();
    if let Some(m) = &o.model {
        sets.push(format!("model.name={}", toml_string(m)));
    }
    let scratch = std::env::temp_dir().join(format!("concord-bench-step-{}", std::process::id()));
    sets.push(format!(
        "run.output_dir={}",
        toml_string(&scratch.display().to_string())
    ));
    sets.push("run.name=bench".into());
    let cfg = crate::config::Config::load(&o.config, &sets)?;
    let stages = crate::curriculum::build(&cfg)?;
    let (model, renderer) = crate::model::load::load_with_renderer(&cfg.model_spec()?)?;
    let load_rss_mb = crate::sys::rss_mb();
    let base_types = base_json(&model);
    let base = cfg.model.name.clone();
    let mut t = super::trainer::Trainer::with_stages(cfg, model, renderer, stages, base, false)?;
    t.quiet = true;
    let mut exported = Vec::new();
    let result = (|| {
        let mut sums = [0.0f64; 7];
        let mut last_plan = crate::learn::Plan::default();
        let timed = o.steps.max(1);
        for i in 0..o.warmup + timed {
            let t0 = Instant::now();
            let stage = t.stage_index();
            let seed = t.step_seed();
            let mut batch = t.collect(stage, seed)?;
            for r in batch.rollouts.iter_mut().filter(|r| r.advantage == 0.0) {
                r.advantage = if r.completion_ids.len() % 2 == 0 {
                    1e-3
                } else {
                    -1e-3
                };
            }
            let stats = t.update(stage, &batch, seed)?;
            t.session.state.step += 1;
            if i < o.warmup {
                continue;
            }
            last_plan = stats.plan.clone();
            exported.extend(batch.prompts.iter().map(
                |p| serde_json::json!({"step": i, "prompt": p.text, "prompt_tokens": p.ids.len()}),
            ));
            let parts = [
                t0.elapsed().as_secs_f64(),
                batch.gen_secs,
                batch.score_secs,
                stats.secs,
                (batch.prompt_tokens() + batch.gen_tokens()) as f64,
                batch.gen_tokens() as f64,
                stats.trained_tokens as f64,
            ];
            for (s, p) in sums.iter_mut().zip(parts) {
                *s += p;
            }
        }
        let n = timed as f64;
        Ok(BenchStepReport {
            seconds_per_step: sums[0] / n,
            sampling_s: sums[1] / n,
            scoring_s: sums[2] / n,
            update_s: sums[3] / n,
            tokens: sums[4] / n,
            completion_tokens: sums[5] / n,
            trained_tokens: sums[6] / n,
            steps: timed,
            peak_rss_mb: crate::sys::peak_rss_mb(),
            load_rss_mb,
            base: base_types.clone(),
            micro_batches: last_plan.micro_batches.len(),
            memory_plan: last_plan.summary(),
        })
    })();
    let _ = std::fs::remove_dir_all(&scratch);
    if let (Ok(_), Some(path)) = (&result, &o.export_prompts) {
        let lines: String = exported.iter().map(|v| format!("{v}\n")).collect();
        crate::atomic::atomic_write_bytes(path, lines.as_bytes())
            .with_context(|| format!("writing {}", path.display()))?;
    }
    result
}

/// `s` as a TOML string value (for `--set`).
fn toml_string(s: &str) -> String {
    toml::Value::String(s.to_string()).to_string()
}

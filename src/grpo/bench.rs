//! `concord bench train`: LoRA forward + backward throughput of a `[batch, seq]` batch
//! (the training half of a GRPO step, without sampling).
use crate::model::lora::{LoraConfig, LORA_TARGETS};
use crate::model::qwen2::Mode;
use anyhow::{bail, Result};
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
    pub device: Device,
    /// LoRA rank (alpha = 2r, every target module).
    pub r: usize,
    pub json: bool,
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
        let lp = model.sequence_logprobs(&ids, None, Mode::Grad, 1.0, false)?;
        let loss = lp.logprobs.sum_all()?.neg()?;
        let grads = loss.backward()?;
        if !vars.iter().any(|(_, v)| grads.get(v.as_tensor()).is_some()) {
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
    let rss = crate::sys::peak_rss_mb();
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

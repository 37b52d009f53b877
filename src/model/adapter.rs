//! `concord model init-adapter`: a PEFT LoRA adapter with random A and (optionally
//! nonzero) random B, saved by Concord (scripts/make_parity_fixtures.py checks that
//! peft loads it).
use std::path::PathBuf;

use anyhow::Result;
use candle_core::{DType, Device, Tensor};
use rand::SeedableRng;

use super::load::{load_model, ModelSpec};
use super::LoraConfig;

/// The adapter to write.
#[derive(Debug, Clone)]
pub struct InitAdapterOptions {
    /// Local model directory or Hub id.
    pub model: String,
    /// Output adapter directory.
    pub out: PathBuf,
    /// Rank, alpha, targets, rsLoRA and the seed of A.
    pub lora: LoraConfig,
    /// Standard deviation of B (0 = PEFT's zero init), drawn from seed `lora.init_seed + 1`.
    pub b_std: f64,
}

/// Build the model with fresh adapters on the CPU in f32, fill B, save the adapter.
pub fn init_adapter(opts: &InitAdapterOptions) -> Result<()> {
    let device = Device::Cpu;
    let m = load_model(&ModelSpec {
        dtype: Some(DType::F32),
        lora: Some(opts.lora.clone()),
        ..ModelSpec::new(&opts.model, device.clone())
    })?;
    if opts.b_std != 0.0 {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(opts.lora.init_seed.wrapping_add(1));
        for (name, var) in m.model.lora_vars() {
            if name.contains("lora_B") {
                let n = var.elem_count();
                let vals: Vec<f32> = (0..n)
                    .map(|_| (opts.b_std * super::weights::normal(&mut rng) as f64) as f32)
                    .collect();
                let t = Tensor::from_vec(vals, var.dims(), &device)?;
                var.set(&t)?;
            }
        }
    }
    m.model.save_adapter(&opts.out, &opts.model)?;
    Ok(())
}

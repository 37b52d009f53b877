//! The dtype policy (what a device computes in) and safetensors weights: read, checked
//! against the config, converted.
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use candle_core::{DType, Device};
use serde_json::Value as Json;

use crate::model::arch::ArchConfig;
use crate::model::Weights;

/// f32 on CPU, bf16 on CUDA sm_80+ (Ampere and newer), f16 on older CUDA devices.
pub fn default_dtype(device: &Device) -> DType {
    match device {
        Device::Cpu => DType::F32,
        #[cfg(feature = "cuda")]
        Device::Cuda(dev) => {
            if cuda_compute_major(dev) >= 8 {
                DType::BF16
            } else {
                DType::F16
            }
        }
        #[allow(unreachable_patterns)]
        _ => DType::F32,
    }
}

#[cfg(feature = "cuda")]
fn cuda_compute_major(dev: &candle_core::CudaDevice) -> i32 {
    use candle_core::cuda::cudarc::driver::{result, sys};
    let cu_device = dev.cuda_stream().context().cu_device();
    // SAFETY: a plain attribute query on a valid device handle.
    unsafe {
        result::device::get_attribute(
            cu_device,
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
        )
    }
    .unwrap_or(8)
}

/// bf16 kernels need compute capability 8.0 (Ampere) or newer: refuse it on older cards
/// (a T4 is sm_75) with advice, instead of failing inside a kernel launch.
pub fn check_dtype_supported(dtype: DType, device: &Device) -> Result<()> {
    #[cfg(feature = "cuda")]
    if let (DType::BF16, Device::Cuda(dev)) = (dtype, device) {
        let major = cuda_compute_major(dev);
        if major < 8 {
            bail!(
                "bf16 needs a GPU of compute capability 8.0 or newer (A100, H100, RTX 30xx); \
                 this one is sm_{major}x: use dtype = \"f16\" (or \"f32\")"
            );
        }
    }
    let _ = (dtype, device);
    Ok(())
}

/// `f32` / `bf16` / `f16` (torch spellings accepted); `auto` → [`default_dtype`].
pub fn parse_dtype(s: &str, device: &Device) -> Result<DType> {
    match s.trim().to_ascii_lowercase().as_str() {
        "auto" | "" => Ok(default_dtype(device)),
        "f32" | "float32" | "fp32" => Ok(DType::F32),
        "bf16" | "bfloat16" => Ok(DType::BF16),
        "f16" | "float16" | "fp16" | "half" => Ok(DType::F16),
        other => bail!("unknown dtype {other:?} (expected auto, f32, bf16 or f16)"),
    }
}

/// A `--base-dtype` value: `f32`, `bf16`, `f16` (checked like `--dtype`), `q8_0`, `q4_k`
/// or `gguf`.
pub fn parse_base_dtype(s: &str, device: &Device) -> Result<crate::model::quant::BaseDtype> {
    use crate::model::quant::BaseDtype;
    match BaseDtype::parse(s) {
        Ok(BaseDtype::Quant(q)) => Ok(BaseDtype::Quant(q)),
        _ => Ok(BaseDtype::Float(parse_dtype(s, device).map_err(|_| {
            anyhow::anyhow!(
                "unknown base dtype {s:?} (expected f32, bf16, f16, q8_0, q4_k or gguf)"
            )
        })?)),
    }
}

/// (name, shape) of every tensor a checkpoint must hold (without `lm_head.weight`).
pub fn expected_shapes(cfg: &ArchConfig) -> Vec<(String, Vec<usize>)> {
    // The model's own list, without the optional untied head.
    let tied = ArchConfig {
        tie_word_embeddings: true,
        ..cfg.clone()
    };
    tied.tensor_shapes()
}

/// A layer tensor the config does not expect: a Qwen2 checkpoint (q/k/v biases) labelled
/// Llama, or a Qwen3 (q/k norms) labelled Qwen2, would otherwise load with those
/// parameters silently dropped.
fn check_no_foreign_layer_tensors(
    st: &candle_core::safetensors::MmapedSafetensors,
    wanted: &[(String, Vec<usize>)],
    cfg: &ArchConfig,
) -> Result<()> {
    let known: std::collections::HashSet<&str> = wanted.iter().map(|(n, _)| n.as_str()).collect();
    let mut foreign: Vec<String> = st
        .tensors()
        .into_iter()
        .map(|(n, _)| n)
        .filter(|n| {
            n.starts_with("model.layers.")
                && !n.ends_with("rotary_emb.inv_freq")
                && !known.contains(n.as_str())
        })
        .collect();
    foreign.sort();
    match foreign.first() {
        Some(name) => bail!(
            "checkpoint has tensor {name} (and {} more), which a {} model ({}) does not \
             have: is config.json's architecture right?",
            foreign.len() - 1,
            cfg.family,
            cfg.family.architecture()
        ),
        None => Ok(()),
    }
}

/// Load, check and convert the weights. Sets `cfg.tie_word_embeddings` when the checkpoint
/// has no `lm_head.weight`; drops a stored `lm_head.weight` when the config ties it (as
/// transformers does). Extra tensors outside the decoder layers (e.g. rotary caches) are
/// ignored; an extra parameter of a layer (a bias, a norm) means config.json names the
/// wrong family, and is an error that names it.
pub fn load_weights(
    files: &[PathBuf],
    cfg: &mut ArchConfig,
    dtype: DType,
    device: &Device,
) -> Result<Weights> {
    if files.is_empty() {
        bail!("no weight files");
    }
    // SAFETY: the files are memory-mapped read-only; like every safetensors loader we
    // assume they are not modified while mapped.
    let st = unsafe { candle_core::safetensors::MmapedSafetensors::multi(files) }
        .with_context(|| format!("opening {}", display_files(files)))?;
    let mut wanted = expected_shapes(cfg);
    let has_head = st.get("lm_head.weight").is_ok();
    if !has_head {
        cfg.tie_word_embeddings = true;
    }
    if has_head && !cfg.tie_word_embeddings {
        wanted.push((
            "lm_head.weight".to_string(),
            vec![cfg.vocab_size, cfg.hidden_size],
        ));
    }
    check_no_foreign_layer_tensors(&st, &wanted, cfg)?;
    // Check every name and shape before loading anything.
    for (name, shape) in &wanted {
        let view = st.get(name).map_err(|_| {
            anyhow!(
                "checkpoint is missing tensor {name} (in {})",
                display_files(files)
            )
        })?;
        if view.shape() != shape.as_slice() {
            bail!(
                "tensor {name} has shape {:?}, expected {:?} from config.json",
                view.shape(),
                shape
            );
        }
    }
    let mut out = Weights::with_capacity(wanted.len());
    for (name, _) in wanted {
        let t = st
            .load(&name, device)
            .with_context(|| format!("loading tensor {name}"))?;
        let t = if t.dtype() == dtype {
            t
        } else {
            t.to_dtype(dtype)?
        };
        ensure_finite(&name, &t).with_context(|| display_files(files))?;
        out.insert(name, t);
    }
    Ok(out)
}

/// A base weight holding NaN or an infinity would turn every forward into NaN and the
/// run into skipped steps; refuse it at load, by name. `t - t` is 0 where `t` is finite
/// and NaN where it is not, so one sum says which.
pub fn ensure_finite(name: &str, t: &candle_core::Tensor) -> Result<()> {
    let s = t
        .sub(t)?
        .to_dtype(DType::F32)?
        .sum_all()?
        .to_scalar::<f32>()?;
    if s.is_nan() {
        bail!(
            "tensor {name} holds NaN or infinite values: the checkpoint is damaged or was \
             saved from a diverged run"
        );
    }
    Ok(())
}

/// Whether config.json sets `tie_word_embeddings` to false explicitly (absent means
/// "tie when the weights have no head", as before).
pub(super) fn says_untied(config: &Path) -> bool {
    std::fs::read_to_string(config)
        .ok()
        .and_then(|t| serde_json::from_str::<Json>(&t).ok())
        .is_some_and(|j| j["tie_word_embeddings"] == Json::Bool(false))
}

pub(super) fn display_files(files: &[PathBuf]) -> String {
    files
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

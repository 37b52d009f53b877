//! Size checks made before allocating: sequence lengths against the model's
//! `max_position_embeddings`, and a memory estimate (KV cache, logits, log-prob rows)
//! against the memory the machine has. A request past either is a clear error that
//! names the flag or key and the numbers, never an allocation abort.
use super::qwen2::Qwen2Config;
use anyhow::{bail, Result};
use candle_core::{DType, Device};

/// Bytes per element of `dtype`.
fn bytes_of(dtype: DType) -> f64 {
    dtype.size_in_bytes() as f64
}

/// Memory the host can still give (MemAvailable), in bytes; None where unknown.
pub fn available_memory() -> Option<f64> {
    crate::sys::available_memory_bytes().map(|b| b as f64)
}

fn gib(b: f64) -> String {
    format!("{:.1} GiB", b / (1024.0 * 1024.0 * 1024.0))
}

/// Bytes of the KV cache for `rows` sequences of `len` tokens.
pub fn kv_cache_bytes(cfg: &Qwen2Config, rows: usize, len: usize, dtype: DType) -> f64 {
    rows as f64
        * len as f64
        * cfg.num_hidden_layers as f64
        * 2.0
        * cfg.num_key_value_heads as f64
        * cfg.head_dim as f64
        * bytes_of(dtype)
}

/// Fail unless `len` positions fit the model (`what` names the flag or key).
pub fn check_positions(cfg: &Qwen2Config, len: usize, what: &str) -> Result<()> {
    if len > cfg.max_position_embeddings {
        bail!(
            "{what}: {len} positions exceed the model's max_position_embeddings ({})",
            cfg.max_position_embeddings
        );
    }
    Ok(())
}

/// Fail when `bytes` (an estimate of `what`) exceeds the host's available memory. Only
/// on the CPU: device memory is not known up front.
pub fn check_memory(bytes: f64, device: &Device, what: &str) -> Result<()> {
    if !device.is_cpu() {
        return Ok(());
    }
    if let Some(avail) = available_memory() {
        if bytes > avail {
            bail!(
                "{what} needs about {} but only {} of memory is available; ask for fewer \
                 rows or tokens",
                gib(bytes),
                gib(avail)
            );
        }
    }
    Ok(())
}

/// Sampling `rows` completions of up to `new_tokens` after prompts of up to
/// `prompt_len` tokens: positions and KV cache + one step's logits per row.
pub fn check_sampling(
    cfg: &Qwen2Config,
    device: &Device,
    dtype: DType,
    rows: usize,
    prompt_len: usize,
    new_tokens: usize,
    what: &str,
) -> Result<()> {
    check_positions(cfg, prompt_len.saturating_add(new_tokens), what)?;
    let bytes = kv_cache_bytes(cfg, rows, prompt_len + new_tokens, dtype)
        + rows as f64 * cfg.vocab_size as f64 * 4.0 * 2.0;
    check_memory(bytes, device, what)
}

/// Scoring (or training on) `rows` sequences of `len` tokens in one forward pass:
/// positions, then the logits and log-softmax rows (the largest tensors by far).
pub fn check_scoring(
    cfg: &Qwen2Config,
    device: &Device,
    rows: usize,
    len: usize,
    what: &str,
) -> Result<()> {
    check_positions(cfg, len, what)?;
    let bytes = rows as f64 * len as f64 * cfg.vocab_size as f64 * 4.0 * 2.0
        + kv_cache_bytes(cfg, rows, len, DType::F32);
    check_memory(bytes, device, what)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn too_long_and_too_big_are_errors() {
        let c = Qwen2Config::tiny();
        let e = check_positions(&c, 5000, "--max-new-tokens").unwrap_err();
        assert!(
            e.to_string().contains("max_position_embeddings (4096)"),
            "{e}"
        );
        assert!(check_positions(&c, 4096, "x").is_ok());
        let e = check_memory(1e30, &Device::Cpu, "sampling").unwrap_err();
        assert!(e.to_string().contains("sampling needs about"), "{e}");
        assert!(check_sampling(&c, &Device::Cpu, DType::F32, 4, 10, 10, "x").is_ok());
    }
}

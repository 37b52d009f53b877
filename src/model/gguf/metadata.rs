//! Typed access to GGUF metadata (errors name the key), and the [`ArchConfig`] a file's
//! `{arch}.*` keys describe.
use std::collections::HashMap;

use anyhow::{anyhow, bail, Context, Result};
use candle_core::quantized::gguf_file::Value;

use crate::model::{ArchConfig, Family};

pub type Metadata = HashMap<String, Value>;

/// The `general.architecture` values Concord loads, one per [`Family`].
pub const GGUF_ARCHITECTURES: [&str; 3] = ["qwen2", "qwen3", "llama"];

pub(super) fn missing(key: &str) -> anyhow::Error {
    anyhow!("GGUF metadata key {key} is missing")
}

fn as_u64(key: &str, v: &Value) -> Result<u64> {
    let x: i128 = match v {
        Value::U8(x) => (*x).into(),
        Value::I8(x) => (*x).into(),
        Value::U16(x) => (*x).into(),
        Value::I16(x) => (*x).into(),
        Value::U32(x) => (*x).into(),
        Value::I32(x) => (*x).into(),
        Value::U64(x) => (*x).into(),
        Value::I64(x) => (*x).into(),
        other => bail!(
            "GGUF metadata key {key} must be an integer, got {:?}",
            other.value_type()
        ),
    };
    u64::try_from(x).map_err(|_| anyhow!("GGUF metadata key {key} must be non-negative, got {x}"))
}

fn as_f64(key: &str, v: &Value) -> Result<f64> {
    match v {
        Value::F32(x) => Ok(f64::from(*x)),
        Value::F64(x) => Ok(*x),
        other => as_u64(key, other).map(|x| x as f64),
    }
}

fn as_str<'a>(key: &str, v: &'a Value) -> Result<&'a str> {
    match v {
        Value::String(s) => Ok(s),
        other => bail!(
            "GGUF metadata key {key} must be a string, got {:?}",
            other.value_type()
        ),
    }
}

fn need_usize(md: &Metadata, key: &str) -> Result<usize> {
    md.get(key)
        .ok_or_else(|| missing(key))
        .and_then(|v| as_u64(key, v))
        .map(|x| x as usize)
}

fn opt_usize(md: &Metadata, key: &str) -> Result<Option<usize>> {
    md.get(key)
        .map(|v| as_u64(key, v).map(|x| x as usize))
        .transpose()
}

fn opt_f64(md: &Metadata, key: &str) -> Result<Option<f64>> {
    md.get(key).map(|v| as_f64(key, v)).transpose()
}

pub(super) fn opt_str<'a>(md: &'a Metadata, key: &str) -> Result<Option<&'a str>> {
    md.get(key).map(|v| as_str(key, v)).transpose()
}

pub(super) fn opt_bool(md: &Metadata, key: &str) -> Result<Option<bool>> {
    match md.get(key) {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(other) => bail!(
            "GGUF metadata key {key} must be a bool, got {:?}",
            other.value_type()
        ),
    }
}

pub(super) fn opt_u32(md: &Metadata, key: &str) -> Result<Option<u32>> {
    md.get(key)
        .map(|v| {
            as_u64(key, v).and_then(|x| {
                u32::try_from(x).map_err(|_| anyhow!("GGUF metadata key {key}: {x} is too large"))
            })
        })
        .transpose()
}

pub(super) fn string_array<'a>(md: &'a Metadata, key: &str) -> Result<Option<Vec<&'a str>>> {
    let Some(v) = md.get(key) else {
        return Ok(None);
    };
    let Value::Array(items) = v else {
        bail!(
            "GGUF metadata key {key} must be an array of strings, got {:?}",
            v.value_type()
        )
    };
    items
        .iter()
        .map(|x| as_str(key, x))
        .collect::<Result<Vec<_>>>()
        .map(Some)
}

pub(super) fn int_array(md: &Metadata, key: &str) -> Result<Option<Vec<i64>>> {
    let Some(v) = md.get(key) else {
        return Ok(None);
    };
    let Value::Array(items) = v else {
        bail!(
            "GGUF metadata key {key} must be an array of integers, got {:?}",
            v.value_type()
        )
    };
    items
        .iter()
        .map(|x| match x {
            Value::I32(i) => Ok(i64::from(*i)),
            Value::I64(i) => Ok(*i),
            other => as_u64(key, other).map(|u| u as i64),
        })
        .collect::<Result<Vec<_>>>()
        .map(Some)
}

/// The family of a `general.architecture` value (None: not one Concord loads).
pub fn family_of_architecture(arch: &str) -> Option<Family> {
    Family::ALL
        .into_iter()
        .find(|f| f.gguf_architecture() == arch)
}

/// `general.architecture`, checked to be one of [`GGUF_ARCHITECTURES`].
pub fn check_architecture(md: &Metadata) -> Result<Family> {
    let key = "general.architecture";
    let arch = as_str(key, md.get(key).ok_or_else(|| missing(key))?)?;
    family_of_architecture(arch).ok_or_else(|| {
        anyhow!(
            "unsupported GGUF architecture {arch:?} (general.architecture): Concord loads {} \
             GGUF files only",
            GGUF_ARCHITECTURES.join(", ")
        )
    })
}

/// [`ArchConfig`] from the `{arch}.*` keys. `vocab_size` is the embedding's row count;
/// `tie_word_embeddings` is set when there is no `output.weight`. RoPE factors and
/// attention biases come from tensors: the loader sets them.
pub fn config_from_metadata(
    md: &Metadata,
    vocab_size: usize,
    has_output: bool,
) -> Result<ArchConfig> {
    let family = check_architecture(md)?;
    let arch = family.gguf_architecture();
    let k = |s: &str| format!("{arch}.{s}");
    let hidden_size = need_usize(md, &k("embedding_length"))?;
    let num_attention_heads = need_usize(md, &k("attention.head_count"))?;
    if num_attention_heads == 0 {
        bail!(
            "GGUF metadata key {} must be positive",
            k("attention.head_count")
        );
    }
    // llama.cpp: head_count_kv defaults to head_count.
    let num_key_value_heads =
        opt_usize(md, &k("attention.head_count_kv"))?.unwrap_or(num_attention_heads);
    let head_dim = head_dim(md, arch, hidden_size / num_attention_heads)?;
    check_vocab_and_rope(md, arch, vocab_size, head_dim)?;
    // transformers' config defaults for keys llama.cpp's converter always writes.
    let max_positions = match family {
        Family::Qwen2 | Family::Qwen3 => 32_768,
        Family::Llama => 2048,
    };
    let cfg = ArchConfig {
        family,
        vocab_size,
        hidden_size,
        intermediate_size: need_usize(md, &k("feed_forward_length"))?,
        num_hidden_layers: need_usize(md, &k("block_count"))?,
        num_attention_heads,
        num_key_value_heads,
        head_dim,
        max_position_embeddings: opt_usize(md, &k("context_length"))?.unwrap_or(max_positions),
        rope_theta: opt_f64(md, &k("rope.freq_base"))?.unwrap_or(10_000.0),
        rope_scaling: None,
        rms_norm_eps: opt_f64(md, &k("attention.layer_norm_rms_epsilon"))?.unwrap_or(1e-6),
        tie_word_embeddings: !has_output,
        attention_bias: false,
    };
    // Named by their GGUF keys (validate would name config.json's).
    for (key, v) in [
        ("rope.freq_base", cfg.rope_theta),
        ("attention.layer_norm_rms_epsilon", cfg.rms_norm_eps),
    ] {
        if !(v > 0.0 && v.is_finite()) {
            bail!(
                "GGUF metadata key {} must be a positive number, got {v}",
                k(key)
            );
        }
    }
    if cfg.max_position_embeddings == 0 {
        bail!("GGUF metadata key {} must be positive", k("context_length"));
    }
    cfg.validate().context("GGUF metadata")?;
    Ok(cfg)
}

/// `attention.key_length` (llama.cpp's default: hidden / heads); the decoder has one head
/// size for queries, keys and values.
fn head_dim(md: &Metadata, arch: &str, default: usize) -> Result<usize> {
    let key = format!("{arch}.attention.key_length");
    let head_dim = opt_usize(md, &key)?.unwrap_or(default);
    let vkey = format!("{arch}.attention.value_length");
    if let Some(v) = opt_usize(md, &vkey)? {
        if v != head_dim {
            bail!("GGUF: {vkey} = {v} differs from the key length {head_dim}: not supported");
        }
    }
    Ok(head_dim)
}

/// The keys that must agree with the tensors or name something the decoder lacks.
fn check_vocab_and_rope(md: &Metadata, arch: &str, vocab: usize, head_dim: usize) -> Result<()> {
    let key = format!("{arch}.vocab_size");
    if let Some(v) = opt_usize(md, &key)? {
        if v != vocab {
            bail!("GGUF: {key} = {v} but token_embd.weight has {vocab} rows");
        }
    }
    // A smaller count would rotate only part of each head (partial rotary).
    let key = format!("{arch}.rope.dimension_count");
    if let Some(n) = opt_usize(md, &key)? {
        if n != head_dim {
            bail!(
                "GGUF: {key} = {n} differs from the head dimension {head_dim}: partial rotary \
                 embeddings are not supported"
            );
        }
    }
    // Llama 3's scaling travels as the rope_freqs.weight tensor, not as these keys.
    let key = format!("{arch}.rope.scaling.type");
    if let Some(t) = opt_str(md, &key)? {
        if t != "none" {
            bail!("GGUF: RoPE scaling {t:?} ({key}) is not supported");
        }
    }
    Ok(())
}

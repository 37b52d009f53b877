//! config.json, in both transformers dialects, into an [`ArchConfig`] of a known family.
use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use serde_json::Value as Json;

use crate::model::arch::{ArchConfig, Family, Llama3Rope, RopeScaling};
use crate::model::generation::id_list;

/// config.json beyond the architecture numbers.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckpointConfig {
    pub arch: ArchConfig,
    pub architectures: Vec<String>,
    /// `torch_dtype` (4.x) or `dtype` (5.x): the stored weights' dtype.
    pub stored_dtype: Option<String>,
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
}

fn get_usize(j: &Json, key: &str) -> Result<Option<usize>> {
    match &j[key] {
        Json::Null => Ok(None),
        v => v
            .as_u64()
            .map(|x| Some(x as usize))
            .ok_or_else(|| anyhow!("config.json: {key} must be a non-negative integer, got {v}")),
    }
}

/// A number, if `key` is there: any other type is an error naming the key (a quoted
/// `"1000000"` must not fall back silently to a default).
fn get_f64(j: &Json, key: &str) -> Result<Option<f64>> {
    match &j[key] {
        Json::Null => Ok(None),
        v => v
            .as_f64()
            .map(Some)
            .ok_or_else(|| anyhow!("config.json: {key} must be a number, got {v}")),
    }
}

/// A bool, if `key` is there; any other type is an error naming the key.
fn get_bool(j: &Json, key: &str) -> Result<Option<bool>> {
    match &j[key] {
        Json::Null => Ok(None),
        v => v
            .as_bool()
            .map(Some)
            .ok_or_else(|| anyhow!("config.json: {key} must be true or false, got {v}")),
    }
}

fn need_usize(j: &Json, key: &str) -> Result<usize> {
    get_usize(j, key)?.ok_or_else(|| anyhow!("config.json: missing {key}"))
}

/// Parse config.json (transformers 4.x or 5.x dialect) of a Qwen2, Qwen3 or Llama model.
pub fn parse_config(text: &str) -> Result<CheckpointConfig> {
    let j: Json = serde_json::from_str(text).context("config.json is not valid JSON")?;
    let (family, architectures) = family_of(&j)?;
    check_supported(&j, family)?;
    let arch = arch_of(&j, family)?;
    let stored_dtype = j["dtype"]
        .as_str()
        .or_else(|| j["torch_dtype"].as_str())
        .map(String::from);
    Ok(CheckpointConfig {
        arch,
        architectures,
        stored_dtype,
        bos_token_id: j["bos_token_id"].as_u64().map(|x| x as u32),
        eos_token_ids: id_list(&j["eos_token_id"]),
    })
}

/// The family `architectures` (or, without it, `model_type`) names.
fn family_of(j: &Json) -> Result<(Family, Vec<String>)> {
    let architectures: Vec<String> = j["architectures"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default();
    let model_type = j["model_type"].as_str().unwrap_or("");
    let family = if architectures.is_empty() {
        Family::from_model_type(model_type)
    } else {
        architectures
            .iter()
            .find_map(|a| Family::from_architecture(a))
    };
    match family {
        Some(f) => Ok((f, architectures)),
        None => {
            let got = if architectures.is_empty() {
                format!("model_type {model_type:?}")
            } else {
                format!("{architectures:?}")
            };
            let known: Vec<&str> = Family::ALL.iter().map(|f| f.architecture()).collect();
            bail!(
                "unsupported architecture {got}: Concord loads {}",
                known.join(", ")
            )
        }
    }
}

/// Options of the family's transformers class that Concord does not implement.
fn check_supported(j: &Json, family: Family) -> Result<()> {
    if let Some(act) = j["hidden_act"].as_str() {
        if act != "silu" {
            bail!("config.json: hidden_act {act:?} is not supported ({family} uses silu)");
        }
    }
    if j["mlp_bias"].as_bool() == Some(true) {
        bail!("config.json: mlp_bias = true is not supported");
    }
    let sliding = j["use_sliding_window"].as_bool().unwrap_or(false)
        || j["layer_types"]
            .as_array()
            .is_some_and(|a| a.iter().any(|t| t.as_str() == Some("sliding_attention")));
    if sliding {
        bail!("config.json: sliding-window attention is not supported");
    }
    Ok(())
}

/// The architecture numbers, checked.
fn arch_of(j: &Json, family: Family) -> Result<ArchConfig> {
    let hidden_size = need_usize(j, "hidden_size")?;
    let num_attention_heads = need_usize(j, "num_attention_heads")?;
    if num_attention_heads == 0 {
        bail!("config.json: num_attention_heads must be positive");
    }
    let num_key_value_heads = get_usize(j, "num_key_value_heads")?.unwrap_or(num_attention_heads);
    if num_key_value_heads == 0 || num_attention_heads % num_key_value_heads != 0 {
        bail!(
            "config.json: num_attention_heads ({num_attention_heads}) must be a multiple of \
             num_key_value_heads ({num_key_value_heads})"
        );
    }
    let (rope_theta, rope_scaling) = parse_rope(j, family)?;
    let arch = ArchConfig {
        family,
        vocab_size: need_usize(j, "vocab_size")?,
        hidden_size,
        intermediate_size: need_usize(j, "intermediate_size")?,
        num_hidden_layers: need_usize(j, "num_hidden_layers")?,
        num_attention_heads,
        num_key_value_heads,
        head_dim: get_usize(j, "head_dim")?.unwrap_or(hidden_size / num_attention_heads),
        max_position_embeddings: get_usize(j, "max_position_embeddings")?.unwrap_or(32_768),
        rope_theta,
        rope_scaling,
        rms_norm_eps: get_f64(j, "rms_norm_eps")?.unwrap_or(1e-6),
        tie_word_embeddings: get_bool(j, "tie_word_embeddings")?.unwrap_or(false),
        attention_bias: get_bool(j, "attention_bias")?.unwrap_or(false),
    };
    let eps = arch.rms_norm_eps;
    if !(eps > 0.0 && eps.is_finite()) {
        bail!("config.json: rms_norm_eps must be a positive number, got {eps}");
    }
    if !(arch.rope_theta > 0.0 && arch.rope_theta.is_finite()) {
        bail!(
            "config.json: rope_theta must be a positive number, got {}",
            arch.rope_theta
        );
    }
    if arch.max_position_embeddings == 0 {
        bail!("config.json: max_position_embeddings must be positive");
    }
    arch.validate().context("config.json")?;
    Ok(arch)
}

/// RoPE: 4.x top-level `rope_theta` and `rope_scaling`, 5.x `rope_parameters` holding
/// both. Default RoPE everywhere, and Llama 3's `llama3` scaling on Llama.
fn parse_rope(j: &Json, family: Family) -> Result<(f64, Option<RopeScaling>)> {
    let scaling_type = |v: &Json| {
        v["rope_type"]
            .as_str()
            .or_else(|| v["type"].as_str())
            .map(String::from)
    };
    let params = match &j["rope_parameters"] {
        Json::Null => &j["rope_scaling"],
        p => {
            // Both written: transformers 5 reads rope_parameters; a scaling that only
            // rope_scaling states would be dropped without a word.
            let (old, new) = (scaling_type(&j["rope_scaling"]), scaling_type(p));
            if let Some(old) = old.filter(|o| *o != "default" && Some(o) != new.as_ref()) {
                bail!(
                    "config.json: rope_scaling says rope type {old:?} but rope_parameters \
                     says {:?}: give one of them",
                    new.as_deref().unwrap_or("default")
                );
            }
            p
        }
    };
    let theta = match get_f64(params, "rope_theta")? {
        Some(t) => t,
        None => get_f64(j, "rope_theta")?.unwrap_or(10_000.0),
    };
    let rope_type = params["rope_type"]
        .as_str()
        .or_else(|| params["type"].as_str())
        .unwrap_or("default");
    match (rope_type, family) {
        ("default", _) => Ok((theta, None)),
        ("llama3", Family::Llama) => {
            let num = |key: &str| {
                params[key]
                    .as_f64()
                    .ok_or_else(|| anyhow!("config.json: llama3 rope scaling needs a number {key}"))
            };
            let original =
                get_usize(params, "original_max_position_embeddings")?.ok_or_else(|| {
                    anyhow!(
                        "config.json: llama3 rope scaling needs original_max_position_embeddings"
                    )
                })?;
            let s = Llama3Rope {
                factor: num("factor")?,
                low_freq_factor: num("low_freq_factor")?,
                high_freq_factor: num("high_freq_factor")?,
                original_max_position_embeddings: original,
            };
            s.validate().context("config.json")?;
            Ok((theta, Some(RopeScaling::Llama3(s))))
        }
        (other, _) => bail!(
            "config.json: rope type {other:?} is not supported on {family} (default RoPE, and \
             llama3 on Llama)"
        ),
    }
}

/// Read and parse a config.json file.
pub fn read_config(path: &Path) -> Result<CheckpointConfig> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    parse_config(&text).with_context(|| format!("in {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Llama-3.2-1B's config.json as transformers 4.x writes it (top-level `rope_theta`,
    /// `rope_scaling`) and as 5.x writes it (`rope_parameters`): the same architecture.
    #[test]
    fn llama3_config_in_both_dialects() {
        let common = r#""architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
            "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
            "vocab_size": 128256, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
            "tie_word_embeddings": true, "attention_bias": false, "mlp_bias": false,
            "hidden_act": "silu""#;
        let scaling = r#""factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192, "rope_type": "llama3""#;
        let v4 = format!(r#"{{{common}, "rope_theta": 500000.0, "rope_scaling": {{{scaling}}}}}"#);
        let v5 =
            format!(r#"{{{common}, "rope_parameters": {{"rope_theta": 500000.0, {scaling}}}}}"#);
        let a = parse_config(&v4).unwrap().arch;
        assert_eq!(a, ArchConfig::llama32_1b());
        assert_eq!(parse_config(&v5).unwrap().arch, a);
        // llama3 scaling belongs to Llama; a Qwen3 config that asks for it is refused.
        let q = v4
            .replace("LlamaForCausalLM", "Qwen3ForCausalLM")
            .replace("\"llama\"", "\"qwen3\"");
        let e = parse_config(&q).unwrap_err().to_string();
        assert!(e.contains("llama3") && e.contains("qwen3"), "{e}");
    }
}

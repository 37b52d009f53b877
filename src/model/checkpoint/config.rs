//! config.json, in both transformers dialects, into an [`ArchConfig`] of a known family.
use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use serde_json::Value as Json;

use crate::model::arch::{ArchConfig, Family, Llama3Rope, RopeScaling};
use crate::model::generation::id_list;

/// config.json beyond the architecture numbers.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckpointConfig {
    pub qwen2: ArchConfig,
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

fn need_usize(j: &Json, key: &str) -> Result<usize> {
    get_usize(j, key)?.ok_or_else(|| anyhow!("config.json: missing {key}"))
}

/// Parse config.json (transformers 4.x or 5.x dialect) of a Qwen2ForCausalLM.
pub fn parse_config(text: &str) -> Result<CheckpointConfig> {
    let j: Json = serde_json::from_str(text).context("config.json is not valid JSON")?;
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
    let Some(family) = family else {
        let got = if architectures.is_empty() {
            format!("model_type {model_type:?}")
        } else {
            format!("{architectures:?}")
        };
        let known: Vec<&str> = Family::ALL.iter().map(|f| f.architecture()).collect();
        bail!(
            "unsupported architecture {got}: Concord loads {}",
            known.join(", ")
        );
    };
    if let Some(act) = j["hidden_act"].as_str() {
        if act != "silu" {
            bail!("config.json: hidden_act {act:?} is not supported ({family} uses silu)");
        }
    }
    if j["mlp_bias"].as_bool() == Some(true) {
        bail!("config.json: mlp_bias = true is not supported");
    }
    let (rope_theta, rope_scaling) = parse_rope(&j, family)?;
    let sliding = j["use_sliding_window"].as_bool().unwrap_or(false)
        || j["layer_types"]
            .as_array()
            .is_some_and(|a| a.iter().any(|t| t.as_str() == Some("sliding_attention")));
    if sliding {
        bail!("config.json: sliding-window attention is not supported");
    }
    let hidden_size = need_usize(&j, "hidden_size")?;
    let num_attention_heads = need_usize(&j, "num_attention_heads")?;
    if num_attention_heads == 0 {
        bail!("config.json: num_attention_heads must be positive");
    }
    let num_key_value_heads = get_usize(&j, "num_key_value_heads")?.unwrap_or(num_attention_heads);
    if num_key_value_heads == 0 || num_attention_heads % num_key_value_heads != 0 {
        bail!(
            "config.json: num_attention_heads ({num_attention_heads}) must be a multiple of \
             num_key_value_heads ({num_key_value_heads})"
        );
    }
    let head_dim = get_usize(&j, "head_dim")?.unwrap_or(hidden_size / num_attention_heads);
    let qwen2 = ArchConfig {
        family,
        vocab_size: need_usize(&j, "vocab_size")?,
        hidden_size,
        intermediate_size: need_usize(&j, "intermediate_size")?,
        num_hidden_layers: need_usize(&j, "num_hidden_layers")?,
        num_attention_heads,
        num_key_value_heads,
        head_dim,
        max_position_embeddings: get_usize(&j, "max_position_embeddings")?.unwrap_or(32_768),
        rope_theta,
        rope_scaling,
        rms_norm_eps: j["rms_norm_eps"].as_f64().unwrap_or(1e-6),
        tie_word_embeddings: j["tie_word_embeddings"].as_bool().unwrap_or(false),
        attention_bias: j["attention_bias"].as_bool().unwrap_or(false),
    };
    let eps = qwen2.rms_norm_eps;
    if !(eps > 0.0 && eps.is_finite()) {
        bail!("config.json: rms_norm_eps must be a positive number, got {eps}");
    }
    if !(qwen2.rope_theta > 0.0 && qwen2.rope_theta.is_finite()) {
        bail!(
            "config.json: rope_theta must be a positive number, got {}",
            qwen2.rope_theta
        );
    }
    if qwen2.max_position_embeddings == 0 {
        bail!("config.json: max_position_embeddings must be positive");
    }
    qwen2.validate().context("config.json")?;
    let stored_dtype = j["dtype"]
        .as_str()
        .or_else(|| j["torch_dtype"].as_str())
        .map(String::from);
    Ok(CheckpointConfig {
        qwen2,
        architectures,
        stored_dtype,
        bos_token_id: j["bos_token_id"].as_u64().map(|x| x as u32),
        eos_token_ids: id_list(&j["eos_token_id"]),
    })
}

/// RoPE: 4.x top-level `rope_theta` and `rope_scaling`, 5.x `rope_parameters` holding
/// both. Default RoPE everywhere, and Llama 3's `llama3` scaling on Llama.
fn parse_rope(j: &Json, family: Family) -> Result<(f64, Option<RopeScaling>)> {
    let params = match &j["rope_parameters"] {
        Json::Null => &j["rope_scaling"],
        p => p,
    };
    let theta = params["rope_theta"]
        .as_f64()
        .or_else(|| j["rope_theta"].as_f64())
        .unwrap_or(10_000.0);
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

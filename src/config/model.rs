//! `[model]` and `[lora]`: the base model, its dtypes and device, and the adapter's
//! shape.
use super::doc::documented;
use super::limits;
use super::locate::ValidationError;
use crate::model::lora::LORA_TARGETS;
use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;

documented! {
/// Parameter / compute dtype.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum DTypeName {
    /// 32-bit floats.
    #[default]
    F32,
    /// bfloat16: half the bytes, f32's range.
    Bf16,
    /// IEEE half precision: half the bytes.
    F16,
}
}

impl DTypeName {
    pub fn to_candle(self) -> candle_core::DType {
        match self {
            DTypeName::F32 => candle_core::DType::F32,
            DTypeName::Bf16 => candle_core::DType::BF16,
            DTypeName::F16 => candle_core::DType::F16,
        }
    }
    pub fn as_str(self) -> &'static str {
        match self {
            DTypeName::F32 => "f32",
            DTypeName::Bf16 => "bf16",
            DTypeName::F16 => "f16",
        }
    }
}

documented! {
/// `[model] base_dtype`: a float storage dtype or a quantized base.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum BaseDTypeName {
    /// Every projection, the embedding and the LM head in f32.
    #[serde(rename = "f32")]
    F32,
    /// Every projection, the embedding and the LM head in bf16.
    #[serde(rename = "bf16")]
    Bf16,
    /// Every projection, the embedding and the LM head in f16.
    #[serde(rename = "f16")]
    F16,
    /// The projections and the LM head quantized at load to llama.cpp's Q8_0 (8-bit
    /// blocks of 32 weights).
    #[serde(rename = "q8_0")]
    Q8_0,
    /// The projections quantized at load to llama.cpp's Q4_K, as llama.cpp does it:
    /// Q5_0 where a matrix's input size is not a multiple of 256, the LM head in Q6_K.
    #[serde(rename = "q4_k")]
    Q4K,
    /// A `.gguf` file's own blocks, bit for bit.
    #[serde(rename = "gguf")]
    Gguf,
}
}

impl BaseDTypeName {
    pub fn to_base(self) -> crate::model::quant::BaseDtype {
        use crate::model::quant::{BaseDtype, QuantMode};
        match self {
            BaseDTypeName::F32 => BaseDtype::Float(candle_core::DType::F32),
            BaseDTypeName::Bf16 => BaseDtype::Float(candle_core::DType::BF16),
            BaseDTypeName::F16 => BaseDtype::Float(candle_core::DType::F16),
            BaseDTypeName::Q8_0 => BaseDtype::Quant(QuantMode::Q8_0),
            BaseDTypeName::Q4K => BaseDtype::Quant(QuantMode::Q4K),
            BaseDTypeName::Gguf => BaseDtype::Quant(QuantMode::Gguf),
        }
    }
}

documented! {
/// The base model, its dtypes and its device.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ModelConfig {
    /// The base model, required: a Hub id (`Qwen/Qwen2.5-3B-Instruct[@revision]`,
    /// downloaded into the Hugging Face cache), a local directory or a `.gguf` file.
    /// With `init_tiny = true`, a missing or empty directory gets the built-in tiny
    /// random model.
    pub name: String,
    /// Parameter and compute dtype: activations, norms, biases, LoRA and accumulation.
    /// TRL: `model_init_kwargs.dtype`.
    pub dtype: DTypeName,
    /// Storage of the frozen base matrices (projections, LM head; the embedding too
    /// for a float type): `bf16`/`f16` halve the bytes a decode step streams; `q8_0`
    /// and `q4_k` quantize at load (QLoRA-style), `gguf` keeps a GGUF file's own
    /// blocks. Each use widens or dequantizes the base exactly, so sampling and
    /// training see the same weights. Unset: `dtype`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub base_dtype: Option<BaseDTypeName>,
    /// `cpu`, `auto` (CUDA device 0 when built with CUDA and one is present, else the
    /// CPU), `cuda` (= `cuda:0`) or `cuda:N`.
    pub device: String,
    /// Create the built-in tiny random model at `name` when that directory is absent.
    pub init_tiny: bool,
    /// Start `train` and `eval` from this PEFT adapter directory (an SFT run, a Hub
    /// adapter's download) instead of a fresh LoRA: its adapter_config.json replaces
    /// the `[lora]` shape keys. Recorded in config.toml and the model card.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub adapter: Option<PathBuf>,
    /// Extra chat-template variables, over Concord's defaults `enable_thinking =
    /// false` (Qwen3 answers without a reasoning trace) and `date_string = "26 Jul
    /// 2024"` (Llama 3's system prompt does not change by day). The variables Concord
    /// sets at every render (`messages`, `add_generation_prompt`, `tools`, `documents`,
    /// the special tokens) cannot be set here.
    /// TRL: `chat_template_kwargs`.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub chat_template_kwargs: BTreeMap<String, toml::Value>,
}
}

impl Default for ModelConfig {
    fn default() -> Self {
        Self {
            name: String::new(),
            dtype: DTypeName::F32,
            base_dtype: None,
            device: "cpu".into(),
            init_tiny: false,
            adapter: None,
            chat_template_kwargs: BTreeMap::new(),
        }
    }
}

impl ModelConfig {
    /// `chat_template_kwargs` as the JSON values a template sees.
    pub fn template_kwargs(&self) -> Result<BTreeMap<String, serde_json::Value>> {
        self.chat_template_kwargs
            .iter()
            .map(|(k, v)| {
                let j = serde_json::to_value(v)
                    .with_context(|| format!("[model] chat_template_kwargs.{k}"))?;
                Ok((k.clone(), j))
            })
            .collect()
    }

    /// The candle device named by `device`.
    pub fn candle_device(&self) -> Result<candle_core::Device> {
        parse_device(&self.device)
    }
}

/// A device name: `cpu`, `auto` (CUDA device 0 when built with CUDA and one is present,
/// else CPU), `cuda` (= `cuda:0`) or `cuda:N`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceName {
    Cpu,
    Auto,
    Cuda(usize),
}

/// Parse a device name without touching any device (config validation, CLI flags).
pub fn parse_device_name(s: &str) -> Result<DeviceName> {
    let t = s.trim().to_ascii_lowercase();
    match t.as_str() {
        "cpu" => Ok(DeviceName::Cpu),
        "auto" => Ok(DeviceName::Auto),
        "cuda" => Ok(DeviceName::Cuda(0)),
        _ => match t.strip_prefix("cuda:").map(str::parse::<usize>) {
            Some(Ok(n)) => Ok(DeviceName::Cuda(n)),
            _ => bail!("device `{s}`: expected cpu, auto, cuda or cuda:N"),
        },
    }
}

/// The candle device a device name stands for.
pub fn parse_device(s: &str) -> Result<candle_core::Device> {
    match parse_device_name(s)? {
        DeviceName::Cpu => Ok(candle_core::Device::Cpu),
        DeviceName::Auto => Ok(candle_core::Device::cuda_if_available(0)?),
        DeviceName::Cuda(n) => candle_core::Device::new_cuda(n).with_context(|| {
            format!("device `{s}` (build with `--features cuda` for GPU support)")
        }),
    }
}

documented! {
/// The shape of the LoRA adapter that training creates (an adapter loaded through
/// `model.adapter` brings its own).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LoraSection {
    /// The adapter's rank.
    /// Range: 1 to [`limits::MAX_LORA_R`].
    /// TRL: `r` (PEFT `LoraConfig`).
    pub r: usize,
    /// Scale of the update: alpha / r (alpha / sqrt(r) with `use_rslora`).
    /// Range: > 0.
    /// TRL: `lora_alpha`.
    pub alpha: f64,
    /// Dropout on the adapter's input while training.
    /// Range: [0, 1).
    /// TRL: `lora_dropout`.
    pub dropout: f64,
    /// The projections that get an adapter: any of `q_proj`, `k_proj`, `v_proj`,
    /// `o_proj`, `gate_proj`, `up_proj`, `down_proj`.
    /// Range: at least one.
    /// TRL: `target_modules`.
    pub targets: Vec<String>,
    /// Rank-stabilised scaling, alpha / sqrt(r).
    /// TRL: `use_rslora`.
    pub use_rslora: bool,
}
}

impl Default for LoraSection {
    fn default() -> Self {
        Self {
            r: 16,
            alpha: 32.0,
            dropout: 0.05,
            targets: LORA_TARGETS.iter().map(|s| s.to_string()).collect(),
            use_rslora: false,
        }
    }
}

impl ModelConfig {
    /// A model is named and its device is one this build knows how to name.
    pub(super) fn check(&self) -> std::result::Result<(), ValidationError> {
        if self.name.trim().is_empty() {
            return Err(ValidationError::unkeyed(
                "model.name is required: a local directory or .gguf file (with \
                 model.init_tiny = true, a directory for a tiny random model)",
            ));
        }
        if let Err(e) = parse_device_name(&self.device) {
            return Err(ValidationError::at("model", "device", e));
        }
        let reserved = crate::model::tokenizer::RESERVED_TEMPLATE_VARIABLES;
        if let Some(k) = self
            .chat_template_kwargs
            .keys()
            .find(|k| reserved.contains(&k.as_str()))
        {
            return Err(ValidationError::at(
                "model",
                "chat_template_kwargs",
                format!(
                    "`{k}` is set by Concord at every render (the conversation, the \
                     generation prompt, tools, documents and the tokenizer's special \
                     tokens: {}); it cannot be overridden",
                    reserved.join(", ")
                ),
            ));
        }
        Ok(())
    }
}

impl LoraSection {
    /// Rank, scale, dropout and target modules.
    #[allow(clippy::neg_cmp_op_on_partial_ord)]
    pub(super) fn check(&self) -> std::result::Result<(), ValidationError> {
        let err = |key: &str, msg: String| ValidationError::at("lora", key, msg);
        if self.r == 0 {
            return Err(err("r", "must be >= 1".into()));
        }
        if self.r > limits::MAX_LORA_R {
            return Err(err(
                "r",
                format!("{} exceeds the limit of {}", self.r, limits::MAX_LORA_R),
            ));
        }
        if !(self.alpha > 0.0) || !self.alpha.is_finite() {
            return Err(err("alpha", format!("{} must be > 0", self.alpha)));
        }
        if !(0.0..1.0).contains(&self.dropout) {
            return Err(err(
                "dropout",
                format!("{} must be in [0, 1)", self.dropout),
            ));
        }
        if self.targets.is_empty() {
            return Err(err("targets", "must name at least one module".into()));
        }
        if let Some(t) = self
            .targets
            .iter()
            .find(|t| !LORA_TARGETS.contains(&t.as_str()))
        {
            return Err(err(
                "targets",
                format!("unknown module `{t}`; known: {}", LORA_TARGETS.join(", ")),
            ));
        }
        Ok(())
    }
}

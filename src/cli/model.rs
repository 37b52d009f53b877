//! `concord model init-tiny`, `concord model init-adapter` and `concord model estimate`.
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};

use crate::model::adapter::{init_adapter, InitAdapterOptions};
use crate::model::tiny::{init_tiny, TinyDType, TinySpec};
use crate::model::Llama3Rope;
use crate::model::LoraConfig;

#[derive(Args)]
pub struct ModelArgs {
    #[command(subcommand)]
    pub command: ModelCommand,
}

#[derive(Subcommand)]
pub enum ModelCommand {
    /// Write a random-weight checkpoint of a model family, laid out like a Hub model
    /// directory with the family's real tokenizer and chat template. Deterministic per seed.
    ///
    /// `--shards N` writes N safetensors shards with an index; `--rope-scaling` gives
    /// Llama 3's `llama3` RoPE scaling. The parity fixtures
    /// (`scripts/make_parity_fixtures.py`) are made from these checkpoints.
    InitTiny(InitTinyArgs),
    /// Write a PEFT LoRA adapter for a model with random A and (nonzero) random B, saved
    /// by Concord (used by scripts/make_parity_fixtures.py to check peft loads it).
    InitAdapter(InitAdapterArgs),
    /// Estimate the memory of one GRPO step of a built-in shape (weights in their
    /// storage types, adapter + AdamW, sampling KV cache, training): will it fit?
    ///
    /// Prints JSON, in GB: the weights in their storage types, the adapter with its
    /// gradients and AdamW moments, the sampling KV cache, training (the planner's
    /// estimate) and their total.
    Estimate(EstimateArgs),
}

#[derive(Args, Debug)]
pub struct EstimateArgs {
    /// A built-in shape: qwen2.5-0.5b, qwen2.5-1.5b, qwen2.5-3b, qwen2.5-7b, qwen3-0.6b,
    /// qwen3-4b, llama3.2-1b.
    #[arg(long, value_parser = estimate_shape)]
    pub shape: crate::model::load::BuiltinShape,
    /// Compute dtype: f32, bf16 or f16 (`[model] dtype`'s names).
    #[arg(long, default_value = "bf16", value_parser = estimate_dtype)]
    pub dtype: crate::config::DTypeName,
    /// Storage of the frozen base: f32, bf16, f16, q8_0 or q4_k (`[model] base_dtype`'s
    /// names, but gguf) [default: --dtype].
    #[arg(long, value_parser = estimate_base_dtype)]
    pub base_dtype: Option<crate::config::BaseDTypeName>,
    /// Prompt tokens of the group.
    #[arg(long, default_value_t = 512, value_parser = super::tokens)]
    pub prompt_tokens: usize,
    /// Completions per prompt (G).
    #[arg(long, default_value_t = 8, value_parser = super::rows)]
    pub num_generations: usize,
    /// Tokens per completion.
    #[arg(long, default_value_t = 64, value_parser = super::tokens)]
    pub completion_tokens: usize,
    /// LoRA rank on all seven projections.
    #[arg(long, default_value_t = 16, value_parser = super::lora_rank)]
    pub r: usize,
    /// Estimate without gradient checkpointing.
    #[arg(long)]
    pub no_checkpointing: bool,
}

fn estimate_shape(s: &str) -> std::result::Result<crate::model::load::BuiltinShape, String> {
    use crate::model::load::BuiltinShape;
    BuiltinShape::parse(s).ok_or_else(|| {
        let names: Vec<&str> = BuiltinShape::ALL.iter().map(|b| b.name()).collect();
        format!("unknown shape {s:?}: expected one of {}", names.join(", "))
    })
}

/// A name as the config spells it (the same parser: `"F32"` and `"auto"` are refused
/// here as they are in `[model]`).
fn config_name<T: serde::de::DeserializeOwned>(s: &str) -> Option<T> {
    serde_json::from_value(serde_json::Value::String(s.to_string())).ok()
}

fn estimate_dtype(s: &str) -> std::result::Result<crate::config::DTypeName, String> {
    config_name(s).ok_or_else(|| format!("unknown dtype {s:?}: expected f32, bf16 or f16"))
}

fn estimate_base_dtype(s: &str) -> std::result::Result<crate::config::BaseDTypeName, String> {
    use crate::config::BaseDTypeName;
    match config_name(s) {
        Some(BaseDTypeName::Gguf) => Err(
            "gguf: a .gguf file's own types are in the file; estimate with the one it \
             holds: expected f32, bf16, f16, q8_0 or q4_k"
                .into(),
        ),
        Some(b) => Ok(b),
        None => Err(format!(
            "unknown base dtype {s:?}: expected f32, bf16, f16, q8_0 or q4_k"
        )),
    }
}

fn estimate(a: &EstimateArgs) -> Result<()> {
    use crate::model::fit::{estimate_step, StepShape};
    use crate::model::quant::BaseDtype;
    let shape = a.shape;
    let dtype = a.dtype.to_candle();
    let base = match a.base_dtype {
        Some(b) => b.to_base(),
        None => BaseDtype::Float(dtype),
    };
    let lora = LoraConfig {
        r: a.r,
        alpha: 2.0 * a.r as f64,
        ..LoraConfig::default()
    };
    let step = StepShape {
        prompt: a.prompt_tokens,
        rows: a.num_generations,
        completion: a.completion_tokens,
        checkpointing: !a.no_checkpointing,
    };
    let e = estimate_step(&shape.config(), dtype, base, &lora, step)?;
    crate::say!(
        "{}",
        serde_json::json!({
            "shape": shape.name(), "dtype": a.dtype.as_str(), "base_dtype": base.name(),
            "weights_gb": e.weights / 1e9, "adapter_gb": e.adapter / 1e9,
            "sampling_gb": e.sampling / 1e9, "training_gb": e.training / 1e9,
            "total_gb": e.total() / 1e9,
        })
    );
    Ok(())
}

#[derive(Args, Debug)]
pub struct InitAdapterArgs {
    /// Local model directory or Hub id.
    #[arg(long)]
    pub model: String,
    /// Output adapter directory.
    #[arg(long)]
    pub out: PathBuf,
    /// LoRA rank.
    #[arg(long, default_value_t = 8, value_parser = super::lora_rank)]
    pub r: usize,
    /// LoRA alpha (the update is scaled by alpha / r, or alpha / sqrt(r) with --rslora).
    #[arg(long, default_value_t = 16.0, value_parser = super::positive_number)]
    pub alpha: f64,
    /// Comma-separated target modules (q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj).
    #[arg(
        long,
        default_value = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"
    )]
    pub targets: String,
    /// Rank-stabilised LoRA scaling (alpha / sqrt(r)).
    #[arg(long)]
    pub rslora: bool,
    /// Seed of the random A (and B with --b-std) initialisation.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Standard deviation of B (0 = PEFT's zero init).
    #[arg(long, default_value_t = 0.0, value_parser = super::non_negative_number)]
    pub b_std: f64,
}

#[derive(Args, Debug)]
pub struct InitTinyArgs {
    /// Output directory (created; existing files of the same names are replaced).
    #[arg(long)]
    pub out: PathBuf,
    /// Model family: qwen2 (Qwen2.5), qwen3 or llama (Llama 3.x). Each gets its own
    /// config.json, real tokenizer and chat template.
    #[arg(long, default_value = "qwen2")]
    pub family: String,
    /// Base shape: `tiny` (hidden 64, 2 layers, 4/2 heads, MLP 128) or `qwen2.5-0.5b`
    /// (hidden 896, 24 layers, 14/2 heads, MLP 4864). Flags below override it.
    #[arg(long, default_value = "tiny")]
    pub shape: String,
    /// Per-head width (default hidden / heads; Qwen3 sets its own).
    #[arg(long)]
    pub head_dim: Option<usize>,
    /// Llama 3 RoPE scaling: FACTOR,LOW_FREQ_FACTOR,HIGH_FREQ_FACTOR,ORIGINAL_MAX_POSITIONS
    /// (Llama 3.2 uses 32,1,4,8192).
    #[arg(long)]
    pub rope_scaling: Option<String>,
    /// Hidden size (model width).
    #[arg(long)]
    pub hidden: Option<usize>,
    /// Number of decoder layers.
    #[arg(long)]
    pub layers: Option<usize>,
    /// Query heads.
    #[arg(long)]
    pub heads: Option<usize>,
    /// Key/value heads (grouped-query attention).
    #[arg(long)]
    pub kv_heads: Option<usize>,
    /// MLP width.
    #[arg(long)]
    pub intermediate: Option<usize>,
    /// Vocabulary rows (at least the tokenizer's ids; default Qwen's 151,936 or Llama 3's
    /// 128,256).
    #[arg(long)]
    pub vocab: Option<usize>,
    /// Seed of the random weights (same seed, same checkpoint).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Storage dtype: f32, bf16 or f16.
    #[arg(long, default_value = "f32")]
    pub dtype: String,
    /// Tie the LM head to the embeddings (default, like Qwen2.5-0.5B).
    #[arg(long, overrides_with = "no_tie")]
    pub tie: bool,
    /// Write a separate lm_head.weight.
    #[arg(long, overrides_with = "tie")]
    pub no_tie: bool,
    /// Split the weights into N safetensors shards with an index.
    #[arg(long, default_value_t = 1)]
    pub shards: usize,
}

impl InitTinyArgs {
    pub fn spec(&self) -> Result<TinySpec> {
        let mut spec = match self.shape.to_ascii_lowercase().as_str() {
            "tiny" => TinySpec::default(),
            // `0.5b`: a documented alias (the `random:` model names accept it too)
            "qwen2.5-0.5b" | "0.5b" => TinySpec::qwen25_0_5b(),
            other => anyhow::bail!("unknown --shape {other:?} (tiny or qwen2.5-0.5b)"),
        };
        let set = |v: Option<usize>, t: &mut usize| {
            if let Some(v) = v {
                *t = v;
            }
        };
        set(self.hidden, &mut spec.hidden);
        set(self.layers, &mut spec.layers);
        set(self.heads, &mut spec.heads);
        set(self.kv_heads, &mut spec.kv_heads);
        set(self.intermediate, &mut spec.intermediate);
        spec.family = self.family.parse()?;
        spec.vocab = self.vocab;
        spec.head_dim = self.head_dim;
        spec.rope_scaling = self
            .rope_scaling
            .as_deref()
            .map(parse_rope_scaling)
            .transpose()?;
        spec.seed = self.seed;
        spec.dtype = self.dtype.parse::<TinyDType>()?;
        if self.no_tie {
            spec.tie = false;
        } else if self.tie {
            spec.tie = true;
        }
        spec.shards = self.shards;
        spec.validate()?;
        Ok(spec)
    }
}

/// `--rope-scaling FACTOR,LOW,HIGH,ORIGINAL`.
fn parse_rope_scaling(s: &str) -> Result<Llama3Rope> {
    let parts: Vec<&str> = s.split(',').map(str::trim).collect();
    let bad = || {
        anyhow::anyhow!("--rope-scaling {s:?}: expected FACTOR,LOW_FREQ_FACTOR,HIGH_FREQ_FACTOR,ORIGINAL_MAX_POSITIONS")
    };
    let [f, lo, hi, orig] = parts[..] else {
        return Err(bad());
    };
    let num = |x: &str| x.parse::<f64>().map_err(|_| bad());
    let r = Llama3Rope {
        factor: num(f)?,
        low_freq_factor: num(lo)?,
        high_freq_factor: num(hi)?,
        original_max_position_embeddings: orig.parse().map_err(|_| bad())?,
    };
    r.validate()?;
    Ok(r)
}

pub fn run(args: ModelArgs) -> Result<()> {
    match args.command {
        ModelCommand::Estimate(a) => estimate(&a),
        ModelCommand::InitAdapter(a) => {
            init_adapter(&InitAdapterOptions {
                model: a.model.clone(),
                out: a.out.clone(),
                lora: LoraConfig {
                    r: a.r,
                    alpha: a.alpha,
                    dropout: 0.0,
                    target_modules: a
                        .targets
                        .split(',')
                        .map(|t| t.trim().to_string())
                        .filter(|t| !t.is_empty())
                        .collect(),
                    use_rslora: a.rslora,
                    init_seed: a.seed,
                },
                b_std: a.b_std,
            })?;
            crate::note!("wrote the adapter to {}", a.out.display());
            Ok(())
        }
        ModelCommand::InitTiny(a) => {
            let spec = a.spec()?;
            let files = init_tiny(&spec, &a.out)
                .with_context(|| format!("writing the tiny model to {}", a.out.display()))?;
            let bytes: u64 = files
                .iter()
                .filter_map(|p| std::fs::metadata(p).ok())
                .map(|m| m.len())
                .sum();
            crate::note!(
                "wrote {} files ({:.1} MB) to {}: {}, hidden {}, {} layers, {}/{} heads, MLP {}, \
                 vocab {}, {:?}, tied {}, seed {}",
                files.len(),
                bytes as f64 / 1e6,
                a.out.display(),
                spec.family,
                spec.hidden,
                spec.layers,
                spec.heads,
                spec.kv_heads,
                spec.intermediate,
                spec.vocab(),
                spec.dtype,
                spec.tie,
                spec.seed
            );
            Ok(())
        }
    }
}

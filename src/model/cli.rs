//! `concord model ...` and `concord score` command handlers.
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};

use super::load::tiny::{init_tiny, TinyDType, TinySpec};
use super::load::{load_model, load_model_with_adapter, parse_dtype, LoadedModel, ModelRef};

#[derive(Args)]
pub struct ModelArgs {
    #[command(subcommand)]
    pub command: ModelCommand,
}

#[derive(Subcommand)]
pub enum ModelCommand {
    /// Write a random-weight Qwen2 checkpoint (real architecture) with Qwen's tokenizer and
    /// a ChatML chat template, laid out like a Hub model directory. Deterministic per seed.
    InitTiny(InitTinyArgs),
    /// Write a PEFT LoRA adapter for a model with random A and (nonzero) random B, saved
    /// by Concord (used by scripts/make_parity_fixtures.py to check peft loads it).
    InitAdapter(InitAdapterArgs),
}

#[derive(Args, Debug)]
pub struct InitAdapterArgs {
    /// Local model directory or Hub id.
    #[arg(long)]
    pub model: String,
    /// Output adapter directory.
    #[arg(long)]
    pub out: PathBuf,
    #[arg(long, default_value_t = 8)]
    pub r: usize,
    #[arg(long, default_value_t = 16.0)]
    pub alpha: f64,
    /// Comma-separated target modules (q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj).
    #[arg(
        long,
        default_value = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"
    )]
    pub targets: String,
    #[arg(long)]
    pub rslora: bool,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Standard deviation of B (0 = PEFT's zero init).
    #[arg(long, default_value_t = 0.0)]
    pub b_std: f64,
}

#[derive(Args, Debug)]
pub struct InitTinyArgs {
    /// Output directory (created; existing files of the same names are replaced).
    #[arg(long)]
    pub out: PathBuf,
    /// Base shape: `tiny` (hidden 64, 2 layers, 4/2 heads, MLP 128) or `qwen2.5-0.5b`
    /// (hidden 896, 24 layers, 14/2 heads, MLP 4864). Flags below override it.
    #[arg(long, default_value = "tiny")]
    pub shape: String,
    #[arg(long)]
    pub hidden: Option<usize>,
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
    /// Vocabulary rows (at least the tokenizer's 151,669 ids; default 151,936).
    #[arg(long)]
    pub vocab: Option<usize>,
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
        set(self.vocab, &mut spec.vocab);
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

#[derive(Args)]
pub struct ScoreArgs {
    /// Local model directory or Hub id (`Qwen/Qwen2.5-0.5B-Instruct[@revision]`).
    #[arg(long)]
    pub model: String,
    /// LoRA adapter directory (adapter_model.safetensors + adapter_config.json, PEFT format).
    #[arg(long)]
    pub adapter: Option<PathBuf>,
    /// JSON file: a list of {"role", "content"} messages (the prompt).
    #[arg(long)]
    pub messages: PathBuf,
    /// The completion text to score (tokenized without special tokens).
    #[arg(long)]
    pub completion: String,
    /// Compute dtype: auto (f32 on CPU, bf16 on CUDA sm_80+, f16 older), f32, bf16, f16.
    #[arg(long, default_value = "auto")]
    pub dtype: String,
    /// cpu, cuda, cuda:N, or auto (CUDA when built with it and available).
    #[arg(long, default_value = "auto")]
    pub device: String,
}

pub fn run_model(args: ModelArgs) -> Result<()> {
    match args.command {
        ModelCommand::InitAdapter(a) => init_adapter(&a),
        ModelCommand::InitTiny(a) => {
            let spec = a.spec()?;
            let files = init_tiny(&spec, &a.out)
                .with_context(|| format!("writing the tiny model to {}", a.out.display()))?;
            let bytes: u64 = files
                .iter()
                .filter_map(|p| std::fs::metadata(p).ok())
                .map(|m| m.len())
                .sum();
            eprintln!(
                "wrote {} files ({:.1} MB) to {}: hidden {}, {} layers, {}/{} heads, MLP {}, \
                 vocab {}, {:?}, tied {}, seed {}",
                files.len(),
                bytes as f64 / 1e6,
                a.out.display(),
                spec.hidden,
                spec.layers,
                spec.heads,
                spec.kv_heads,
                spec.intermediate,
                spec.vocab,
                spec.dtype,
                spec.tie,
                spec.seed
            );
            Ok(())
        }
    }
}

fn init_adapter(a: &InitAdapterArgs) -> Result<()> {
    use rand::SeedableRng;
    let device = candle_core::Device::Cpu;
    let lora = crate::model::LoraConfig {
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
    };
    let m = load_model(
        &ModelRef::parse(&a.model)?,
        Some(candle_core::DType::F32),
        &device,
        Some(&lora),
    )?;
    if a.b_std != 0.0 {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(a.seed.wrapping_add(1));
        for (name, var) in m.model.lora_vars() {
            if name.contains("lora_B") {
                let n = var.elem_count();
                let vals: Vec<f32> = (0..n)
                    .map(|_| (a.b_std * crate::model::qwen2::normal(&mut rng) as f64) as f32)
                    .collect();
                let t = candle_core::Tensor::from_vec(vals, var.dims(), &device)?;
                var.set(&t)?;
            }
        }
    }
    m.model.save_adapter(&a.out, &a.model)?;
    eprintln!("wrote the adapter to {}", a.out.display());
    Ok(())
}

/// The `score` computation: prompt ids (chat template with the generation prompt),
/// completion ids (no special tokens) and ln p(completion_ids[i] | everything before).
pub fn score(
    m: &LoadedModel,
    messages: &[crate::chat::Message],
    completion: &str,
) -> Result<(Vec<u32>, Vec<u32>, Vec<f32>)> {
    let prompt_ids = m.tokenizer.encode_chat(messages, true)?;
    let completion_ids = m.tokenizer.encode(completion)?;
    if prompt_ids.is_empty() {
        anyhow::bail!("the chat template rendered an empty prompt");
    }
    if completion_ids.is_empty() {
        return Ok((prompt_ids, completion_ids, Vec::new()));
    }
    let all: Vec<u32> = prompt_ids.iter().chain(&completion_ids).copied().collect();
    let device = m.model.device().clone();
    let t = candle_core::Tensor::new(all.as_slice(), &device)?.unsqueeze(0)?;
    let lp = m
        .model
        .sequence_logprobs(&t, None, crate::model::Mode::Detached, 1.0, false)?
        .logprobs
        .narrow(1, prompt_ids.len() - 1, completion_ids.len())?
        .squeeze(0)?
        .to_dtype(candle_core::DType::F32)?
        .to_vec1::<f32>()?;
    Ok((prompt_ids, completion_ids, lp))
}

pub fn run_score(args: ScoreArgs) -> Result<()> {
    let device = crate::config::parse_device(&args.device)?;
    let dtype = parse_dtype(&args.dtype, &device)?;
    let messages = crate::chat::read_messages(&args.messages)?;
    let m = load_model_with_adapter(
        &ModelRef::parse(&args.model)?,
        args.adapter.as_deref(),
        Some(dtype),
        &device,
    )?;
    let (prompt_ids, completion_ids, logprobs) = score(&m, &messages, &args.completion)?;
    // Keys in the documented order (prompt_ids, completion_ids, logprobs).
    println!(
        "{{\"prompt_ids\":{},\"completion_ids\":{},\"logprobs\":{}}}",
        serde_json::to_string(&prompt_ids)?,
        serde_json::to_string(&completion_ids)?,
        serde_json::to_string(&logprobs)?
    );
    Ok(())
}

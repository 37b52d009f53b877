//! `concord score`: log-probabilities of a completion given a chat prompt, as JSON.
use std::path::PathBuf;

use anyhow::Result;
use clap::Args;

use crate::model::load::parse_dtype;
use crate::model::score::{score, ScoreOptions};

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
    /// Store the frozen base in f32, bf16, f16, q8_0, q4_k or gguf (`[model] base_dtype`)
    /// [default: --dtype].
    #[arg(long)]
    pub base_dtype: Option<String>,
}

pub fn run(args: ScoreArgs) -> Result<()> {
    let device = crate::config::parse_device(&args.device)?;
    let dtype = parse_dtype(&args.dtype, &device)?;
    let base_dtype = match &args.base_dtype {
        Some(d) => Some(crate::model::load::parse_base_dtype(d, &device)?),
        None => None,
    };
    let s = score(&ScoreOptions {
        base_dtype,
        model: args.model,
        adapter: args.adapter,
        dtype,
        device,
        messages: args.messages,
        completion: args.completion,
    })?;
    // Keys in the documented order (prompt_ids, completion_ids, logprobs).
    crate::say!(
        "{{\"prompt_ids\":{},\"completion_ids\":{},\"logprobs\":{}}}",
        serde_json::to_string(&s.prompt_ids)?,
        serde_json::to_string(&s.completion_ids)?,
        serde_json::to_string(&s.logprobs)?
    );
    Ok(())
}

//! `concord generate`: sample completions for chat prompts. Also the model and sampling
//! flags `bench sample` shares.
use std::path::PathBuf;

use anyhow::Result;
use clap::Args;
use serde_json::json;

use crate::model::load::{parse_dtype, ModelSpec};
use crate::sample::{
    generate, Completion, GenerateOptions, Generated, PromptSource, SamplingOverrides,
};

/// Sampling flags shared by `generate` and `bench sample`.
#[derive(Args, Debug, Clone)]
pub struct SamplingArgs {
    /// Softmax temperature; 0 = greedy [default: the model's generation_config, else 1].
    #[arg(long)]
    pub temperature: Option<f32>,
    /// Nucleus mass [default: generation_config, else 1 = off].
    #[arg(long)]
    pub top_p: Option<f32>,
    /// Keep the K most likely tokens [default: generation_config, else 0 = off].
    #[arg(long)]
    pub top_k: Option<usize>,
    /// Minimum probability relative to the top token [default: generation_config, else 0].
    #[arg(long)]
    pub min_p: Option<f32>,
    /// Repetition penalty [default: generation_config, else 1 = off].
    #[arg(long)]
    pub repetition_penalty: Option<f32>,
    /// Random seed of the per-completion RNG streams.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

impl SamplingArgs {
    pub fn overrides(&self) -> SamplingOverrides {
        SamplingOverrides {
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            min_p: self.min_p,
            repetition_penalty: self.repetition_penalty,
            seed: self.seed,
        }
    }
}

/// Model selection flags shared by `generate` and `bench sample`.
#[derive(Args, Debug, Clone)]
pub struct ModelSelectArgs {
    /// Local model directory or Hub id (`Qwen/Qwen2.5-0.5B-Instruct[@revision]`).
    #[arg(long)]
    pub model: String,
    /// LoRA adapter directory (`adapter_model.safetensors` + `adapter_config.json`).
    #[arg(long)]
    pub adapter: Option<PathBuf>,
    /// f32, bf16 or f16 [default: f32 on CPU, bf16/f16 on CUDA].
    #[arg(long)]
    pub dtype: Option<String>,
    /// cpu or cuda[:N].
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Store the frozen base weights in f32, bf16, f16, q8_0, q4_k or gguf (a GGUF file's
    /// own blocks); activations, LoRA and accumulation stay in --dtype [default: --dtype].
    #[arg(long)]
    pub base_dtype: Option<String>,
}

impl ModelSelectArgs {
    /// `--model` (a checkpoint, or `random:tiny` / `random:qwen2.5-0.5b`: random weights
    /// in memory, without tokenizer, for benchmarks) on `--device`.
    pub fn spec(&self) -> Result<ModelSpec> {
        let device = crate::config::parse_device(&self.device)?;
        let dtype = match &self.dtype {
            Some(d) => Some(parse_dtype(d, &device)?),
            None => None,
        };
        let base_dtype = match &self.base_dtype {
            Some(d) => Some(crate::model::load::parse_base_dtype(d, &device)?),
            None => None,
        };
        Ok(ModelSpec {
            dtype,
            base_dtype,
            adapter: self.adapter.clone(),
            ..ModelSpec::new(&self.model, device)
        })
    }
}

#[derive(Args, Debug)]
pub struct GenerateArgs {
    #[command(flatten)]
    pub model: ModelSelectArgs,
    /// A JSON file holding one conversation: a list of {"role","content"}.
    #[arg(long, conflicts_with = "prompts", required_unless_present = "prompts")]
    pub messages: Option<PathBuf>,
    /// A JSONL file, one conversation (a JSON message list) per line; all are sampled in
    /// one batch.
    #[arg(long)]
    pub prompts: Option<PathBuf>,
    /// New-token budget per completion [default: generation_config, else 256].
    #[arg(long)]
    pub max_new_tokens: Option<usize>,
    /// Stop tokens are suppressed before this many new tokens.
    #[arg(long, default_value_t = 0)]
    pub min_new_tokens: usize,
    /// Completions per prompt.
    #[arg(long, default_value_t = 1)]
    pub num_samples: usize,
    /// Stop string (repeatable); the text is cut before it.
    #[arg(long = "stop")]
    pub stop: Vec<String>,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// Print JSON (`{"prompt_ids", "completions", "stats"}`) instead of text.
    #[arg(long)]
    pub json: bool,
    /// With --json, include `sample_logprobs` and `full_logprobs` per completion.
    #[arg(long)]
    pub logprobs: bool,
}

fn completion_json(c: &Completion, logprobs: bool) -> serde_json::Value {
    let mut v = json!({"ids": c.ids, "text": c.text, "finish_reason": c.finish_reason.as_str()});
    if logprobs {
        v["sample_logprobs"] = json!(c.sample_logprobs);
        v["full_logprobs"] = json!(c.full_logprobs);
    }
    v
}

pub fn run(args: GenerateArgs) -> Result<()> {
    let prompts = match (&args.messages, &args.prompts) {
        (Some(m), _) => PromptSource::Messages(m.clone()),
        (None, Some(p)) => PromptSource::Jsonl(p.clone()),
        (None, None) => anyhow::bail!("give --messages FILE.json or --prompts FILE.jsonl"),
    };
    let Generated {
        prompt_ids,
        groups,
        stats,
        seconds,
    } = generate(&GenerateOptions {
        model: args.model.spec()?,
        prompts,
        max_new_tokens: args.max_new_tokens,
        min_new_tokens: args.min_new_tokens,
        num_samples: args.num_samples,
        stop: args.stop.clone(),
        sampling: args.sampling.overrides(),
    })?;
    let stats_json = json!({"new_tokens": stats.new_tokens, "seconds": seconds});
    if args.json {
        let per_prompt = |i: usize| {
            json!({
                "prompt_ids": prompt_ids[i],
                "completions": groups[i].iter().map(|c| completion_json(c, args.logprobs)).collect::<Vec<_>>(),
            })
        };
        let out = if args.messages.is_some() {
            let mut v = per_prompt(0);
            v["stats"] = stats_json;
            v
        } else {
            json!({"prompts": (0..groups.len()).map(per_prompt).collect::<Vec<_>>(), "stats": stats_json})
        };
        crate::say!("{out}");
    } else {
        for (i, group) in groups.iter().enumerate() {
            for (j, c) in group.iter().enumerate() {
                if groups.len() > 1 || group.len() > 1 {
                    crate::say!(
                        "--- prompt {} completion {} ({}, {} tokens) ---",
                        i + 1,
                        j + 1,
                        c.finish_reason.as_str(),
                        c.ids.len()
                    );
                }
                crate::say!("{}", c.text);
            }
        }
        crate::note!(
            "{} new tokens in {:.2}s ({:.1} tok/s)",
            stats.new_tokens,
            seconds,
            stats.new_tokens as f64 / seconds.max(1e-9)
        );
    }
    Ok(())
}

//! The sampler's two commands as library entry points: [`generate`] (`concord
//! generate`: completions for chat prompts) and [`bench`] (`concord bench sample`:
//! throughput on random prompts). Both load their model through
//! [`crate::model::load::load_model`].
use std::path::PathBuf;
use std::time::Instant;

use rand::Rng;
use serde_json::json;

use super::{
    group_requests, row_rng, sample_groups_with_stats, sample_requests_on, ChooseOn, Completion,
    SampleStats, SamplingOverrides,
};
use crate::chat::{read_messages, read_prompts_jsonl};
use crate::model::load::{load_model, LoadedModel, ModelSpec};

/// Where the conversations to continue come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PromptSource {
    /// A JSON file holding one conversation (a list of `{"role", "content"}`).
    Messages(PathBuf),
    /// A JSONL file, one conversation per line.
    Jsonl(PathBuf),
}

/// What `concord generate` samples.
#[derive(Debug, Clone)]
pub struct GenerateOptions {
    pub model: ModelSpec,
    pub prompts: PromptSource,
    /// New-token budget per completion (None: generation_config, else 256).
    pub max_new_tokens: Option<usize>,
    /// Stop tokens are suppressed before this many new tokens.
    pub min_new_tokens: usize,
    /// Completions per prompt.
    pub num_samples: usize,
    /// Stop strings; the text is cut before them.
    pub stop: Vec<String>,
    pub sampling: SamplingOverrides,
}

/// The completions of every prompt, in order.
#[derive(Debug, Clone)]
pub struct Generated {
    /// Chat-template token ids of each prompt.
    pub prompt_ids: Vec<Vec<u32>>,
    /// `num_samples` completions per prompt.
    pub groups: Vec<Vec<Completion>>,
    pub stats: SampleStats,
    /// Wall time of the sampling call.
    pub seconds: f64,
}

/// Load the model, render the prompts with its chat template and sample them in one
/// batch; sampling parameters are the options over the checkpoint's generation_config.
pub fn generate(opts: &GenerateOptions) -> anyhow::Result<Generated> {
    anyhow::ensure!(opts.num_samples >= 1, "--num-samples must be at least 1");
    let convs = match &opts.prompts {
        PromptSource::Messages(m) => vec![read_messages(m)?],
        PromptSource::Jsonl(p) => read_prompts_jsonl(p)?,
    };
    let m = load_for_sampling(&opts.model)?;
    let mut params = opts.sampling.resolve(&m.generation_config);
    params.max_new_tokens = opts
        .max_new_tokens
        .or(m.generation_config.max_new_tokens)
        .unwrap_or(256);
    params.min_new_tokens = opts.min_new_tokens;
    anyhow::ensure!(
        params.min_new_tokens <= params.max_new_tokens,
        "--min-new-tokens {} is more than --max-new-tokens {}: no completion could end \
         on a stop token",
        params.min_new_tokens,
        params.max_new_tokens
    );
    params.stop_token_ids = m.stop_token_ids();
    params.stop_strings = opts.stop.clone();
    params.validate()?;
    let tokenizer = m.tokenizer()?;
    let prompt_ids: Vec<Vec<u32>> = convs
        .iter()
        .map(|c| tokenizer.encode_chat(c, true))
        .collect::<anyhow::Result<_>>()?;
    let longest = prompt_ids.iter().map(Vec::len).max().unwrap_or(0);
    crate::model::budget::check_sampling(
        &m.config,
        m.model.device(),
        m.dtype,
        prompt_ids.len().saturating_mul(opts.num_samples),
        longest,
        params.max_new_tokens,
        &format!(
            "--max-new-tokens {} x --num-samples {} ({} prompt(s), longest {longest} tokens)",
            params.max_new_tokens,
            opts.num_samples,
            prompt_ids.len()
        ),
    )?;
    let t0 = Instant::now();
    let (groups, stats) = sample_groups_with_stats(
        &m.model,
        m.renderer(),
        &prompt_ids,
        opts.num_samples,
        &params,
        params.seed,
    )?;
    Ok(Generated {
        prompt_ids,
        groups,
        stats,
        seconds: t0.elapsed().as_secs_f64(),
    })
}

/// What `concord bench sample` measures.
#[derive(Debug, Clone)]
pub struct BenchSampleOptions {
    pub model: ModelSpec,
    /// Distinct prompts (P).
    pub prompts: usize,
    /// Completions per prompt (G).
    pub num_generations: usize,
    /// New tokens per completion (exactly: stop tokens are suppressed).
    pub new_tokens: usize,
    /// Tokens per prompt (random ids, seeded).
    pub prompt_tokens: usize,
    /// Untimed warm-up runs before the measured one.
    pub warmup: usize,
    pub sampling: SamplingOverrides,
    pub choose_on: ChooseOn,
}

/// One measured sampling call.
#[derive(Debug, Clone)]
pub struct BenchSampleReport {
    pub prompts: usize,
    pub num_generations: usize,
    pub prompt_tokens: usize,
    pub stats: SampleStats,
    /// Wall time of the measured call.
    pub seconds: f64,
    pub peak_rss_mib: Option<f64>,
    pub threads: usize,
    pub choose_on: ChooseOn,
}

impl BenchSampleReport {
    pub fn rows(&self) -> usize {
        self.prompts * self.num_generations
    }
    pub fn tokens_per_s(&self) -> f64 {
        self.stats.new_tokens as f64 / self.seconds.max(1e-9)
    }
    pub fn decode_tokens_per_s(&self) -> f64 {
        self.stats.new_tokens as f64 / self.stats.decode_seconds.max(1e-9)
    }
    pub fn prefill_tokens_per_s(&self) -> f64 {
        self.stats.prefill_tokens as f64 / self.stats.prefill_seconds.max(1e-9)
    }

    /// The `--json` object (keys sorted).
    pub fn to_json(&self) -> serde_json::Value {
        json!({
            "prompts": self.prompts,
            "num_generations": self.num_generations,
            "rows": self.rows(),
            "prompt_tokens": self.prompt_tokens,
            "new_tokens": self.stats.new_tokens,
            "seconds": self.seconds,
            "prefill_seconds": self.stats.prefill_seconds,
            "decode_seconds": self.stats.decode_seconds,
            "tokens_per_s": self.tokens_per_s(),
            "decode_tokens_per_s": self.decode_tokens_per_s(),
            "prefill_tokens_per_s": self.prefill_tokens_per_s(),
            "peak_rss_mib": self.peak_rss_mib,
            "threads": self.threads,
            "choose_on": self.choose_on,
        })
    }
}

/// Sample `prompts` random prompts `num_generations` times each, after `warmup` short
/// untimed runs.
pub fn bench(opts: &BenchSampleOptions) -> anyhow::Result<BenchSampleReport> {
    anyhow::ensure!(
        opts.prompts >= 1 && opts.num_generations >= 1,
        "need at least 1 prompt and 1 generation"
    );
    anyhow::ensure!(
        opts.prompt_tokens >= 1 && opts.new_tokens >= 1,
        "need at least 1 prompt and 1 new token"
    );
    let m = load_for_sampling(&opts.model)?;
    let mut params = opts.sampling.resolve(&Default::default());
    params.max_new_tokens = opts.new_tokens;
    params.min_new_tokens = opts.new_tokens;
    params.stop_token_ids = m.stop_token_ids();
    params.validate()?;
    crate::model::budget::check_sampling(
        &m.config,
        m.model.device(),
        m.dtype,
        opts.prompts.saturating_mul(opts.num_generations),
        opts.prompt_tokens,
        opts.new_tokens,
        &format!(
            "--prompts {} x --num-generations {}, --prompt-tokens {} + --new-tokens {}",
            opts.prompts, opts.num_generations, opts.prompt_tokens, opts.new_tokens
        ),
    )?;
    let vocab = m.config.vocab_size.min(151_643) as u32;
    let mut rng = row_rng(opts.sampling.seed ^ 0xB3A5_C0DE, 0, 0);
    let prompts: Vec<Vec<u32>> = (0..opts.prompts)
        .map(|_| {
            (0..opts.prompt_tokens)
                .map(|_| rng.gen_range(0..vocab))
                .collect()
        })
        .collect();
    for _ in 0..opts.warmup {
        let mut p = params.clone();
        p.max_new_tokens = 2;
        p.min_new_tokens = 2;
        let short: Vec<Vec<u32>> = prompts
            .iter()
            .map(|p| p[..p.len().min(8)].to_vec())
            .collect();
        sample_requests_on(
            &m.model,
            m.renderer(),
            &group_requests(&short, opts.num_generations),
            &p,
            params.seed,
            opts.choose_on,
        )?;
    }
    let t0 = Instant::now();
    let (_, stats) = sample_requests_on(
        &m.model,
        m.renderer(),
        &group_requests(&prompts, opts.num_generations),
        &params,
        params.seed,
        opts.choose_on,
    )?;
    let seconds = t0.elapsed().as_secs_f64();
    Ok(BenchSampleReport {
        prompts: opts.prompts,
        num_generations: opts.num_generations,
        prompt_tokens: opts.prompt_tokens,
        stats,
        seconds,
        peak_rss_mib: peak_rss_mib(),
        threads: candle_core::utils::get_num_threads(),
        choose_on: opts.choose_on,
    })
}

/// [`load_model`] as the sampling commands use it: `random:` models are built in f32
/// whatever dtype was asked (as they always have been, so benchmark numbers stay
/// comparable).
fn load_for_sampling(spec: &ModelSpec) -> anyhow::Result<LoadedModel> {
    if spec.random_shape()?.is_some() {
        return load_model(&ModelSpec {
            dtype: None,
            ..spec.clone()
        });
    }
    load_model(spec)
}

/// Peak resident set size of this process in MiB (Linux `VmHWM`), if known.
pub fn peak_rss_mib() -> Option<f64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

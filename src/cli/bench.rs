//! `concord bench`: sampling and training throughput.
use clap::{Args, Subcommand};

use super::generate::{ModelSelectArgs, SamplingArgs};
use crate::sample::{BenchSampleOptions, ChooseOn};

#[derive(clap::Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub command: BenchCommand,
}

#[derive(Subcommand)]
pub enum BenchCommand {
    /// Sampling throughput: tokens/s, prefill tokens/s, peak memory.
    ///
    /// `--model random:SHAPE` (`random:tiny`, `random:qwen2.5-0.5b` ... `random:qwen2.5-7b`,
    /// `random:qwen3-0.6b`, `random:qwen3-4b`, `random:llama3.2-1b`) builds random weights
    /// of that shape in memory, quantized as they are drawn with a quantized base. The
    /// report includes the peak RSS and the base's storage by type.
    Sample(BenchSampleArgs),
    /// LoRA forward+backward throughput: tokens/s, seconds, peak RSS.
    ///
    /// Also prints the training memory estimate beside the growth of peak RSS over the
    /// loaded model, the calibration of `[optim] memory_budget_gb`.
    Train(BenchTrainArgs),
    /// One full GRPO step of a config (sampling, scoring, update): seconds per phase.
    ///
    /// Reports `seconds_per_step`, `sampling_s`, `scoring_s`, `update_s`, `tokens`,
    /// `peak_rss_mb` and `load_rss_mb`. The update always runs, tied groups included.
    /// Every `random:SHAPE` but `random:tiny` carries its family's tokenizer, so it
    /// trains here too.
    GrpoStep(BenchStepArgs),
    /// OpenEnv round trips per second: `concord serve` in-process, WebSocket clients
    /// playing reset + N steps, over 1 and many parallel sessions.
    Serve(BenchServeArgs),
}

#[derive(Args, Debug)]
pub struct BenchServeArgs {
    /// Environment name (see `concord envs list`).
    pub env: String,
    /// Parallel sessions of each measurement (repeatable).
    #[arg(long = "sessions", default_values_t = [1usize, 64], value_parser = super::sessions)]
    pub sessions: Vec<usize>,
    /// Steps per episode after its reset.
    #[arg(long, default_value_t = 8)]
    pub steps: usize,
    /// Seconds of wall time per measurement (at least 0.1, at most a day).
    #[arg(long, default_value_t = 5.0, value_parser = super::seconds)]
    pub secs: f64,
    /// Print JSON lines.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub opts: super::envs::EnvOpts,
}

fn run_serve(a: BenchServeArgs) -> anyhow::Result<()> {
    let options = a.opts.options()?;
    for &n in &a.sessions {
        let r = crate::serve::bench::round_trips(&a.env, &options, n, a.steps, a.secs)?;
        if a.json {
            crate::say!("{}", serde_json::to_string(&r)?);
        } else {
            crate::say!(
                "{}: {} session(s), reset + {} steps: {:.0} round trips/s, {:.0} episodes/s \
                 ({} round trips in {:.1} s)",
                r.env,
                r.sessions,
                r.steps_per_episode,
                r.round_trips_per_s,
                r.episodes_per_s,
                r.round_trips,
                r.seconds
            );
        }
    }
    Ok(())
}

pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    match args.command {
        BenchCommand::Sample(a) => run_sample(a),
        BenchCommand::Train(a) => crate::grpo::bench::bench_train(&a.options()?),
        BenchCommand::GrpoStep(a) => run_step(a),
        BenchCommand::Serve(a) => run_serve(a),
    }
}

#[derive(Args, Debug)]
pub struct BenchStepArgs {
    /// The run configuration (TOML); its run directory is not touched.
    #[arg(long)]
    pub config: std::path::PathBuf,
    /// Model directory, `.gguf` file, Hub id or `random:SHAPE` (default: the config's).
    #[arg(long)]
    pub model: Option<String>,
    /// Override a config key (repeatable), as for `train`.
    #[arg(long = "set", value_name = "SECTION.KEY=VALUE")]
    pub sets: Vec<String>,
    /// Storage of the frozen base: f32, bf16, f16, q8_0, q4_k or gguf (the config's
    /// `[model] base_dtype`).
    #[arg(long)]
    pub base_dtype: Option<String>,
    /// Timed steps, after the warm-up steps (1 to 10,000).
    #[arg(long, default_value_t = 1, value_parser = super::repetitions)]
    pub steps: usize,
    /// Untimed warm-up steps first (0 to 100).
    #[arg(long, default_value_t = 1, value_parser = super::warmups)]
    pub warmup: usize,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// Write the timed steps' rendered prompts to FILE as JSON lines (the dataset
    /// `scripts/bench_grpo_vs_trl.py` gives TRL).
    #[arg(long, value_name = "FILE")]
    pub export_prompts: Option<std::path::PathBuf>,
}

fn run_step(a: BenchStepArgs) -> anyhow::Result<()> {
    let mut sets = a.sets;
    if let Some(b) = &a.base_dtype {
        sets.push(format!("model.base_dtype=\"{b}\""));
    }
    let r = crate::grpo::bench::bench_step(&crate::grpo::bench::BenchStepOptions {
        config: a.config,
        sets,
        model: a.model,
        steps: a.steps,
        warmup: a.warmup,
        export_prompts: a.export_prompts,
    })?;
    if a.json {
        crate::say!("{}", serde_json::to_string(&r)?);
    } else {
        crate::say!(
            "bench grpo-step: {:.2} s/step (sampling {:.2} s, scoring {:.2} s, update {:.2} s), {:.0} tokens/step, peak RSS {:.0} MiB",
            r.seconds_per_step, r.sampling_s, r.scoring_s, r.update_s, r.tokens, r.peak_rss_mb
        );
        crate::say!("{}", r.memory_plan);
    }
    Ok(())
}

#[derive(clap::Args, Debug)]
pub struct BenchTrainArgs {
    /// Model directory or Hub id; `random:0.5b` / `random:tiny` build random weights of
    /// that shape (no download).
    #[arg(long)]
    pub model: String,
    /// Sequences per forward+backward (1 to 16,384).
    #[arg(long, default_value_t = 8, value_parser = super::rows)]
    pub batch: usize,
    /// Tokens per sequence (2 to 131,072).
    #[arg(long, default_value_t = 160, value_parser = super::seq_tokens)]
    pub seq: usize,
    /// Timed iterations (after one warm-up; 1 to 10,000).
    #[arg(long, default_value_t = 2, value_parser = super::repetitions)]
    pub iters: usize,
    /// Compute dtype: f32, bf16 or f16.
    #[arg(long, default_value = "f32")]
    pub dtype: String,
    /// Storage of the frozen base: f32, bf16, f16, q8_0, q4_k or gguf [default: --dtype].
    #[arg(long)]
    pub base_dtype: Option<String>,
    /// cpu, cuda or cuda:N.
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// LoRA rank of the adapter on every target module.
    #[arg(long, default_value_t = 16, value_parser = super::lora_rank)]
    pub r: usize,
    /// Recompute each layer's activations in the backward (activation checkpointing).
    #[arg(long)]
    pub gradient_checkpointing: bool,
    /// Print the result as one JSON object.
    #[arg(long)]
    pub json: bool,
}

impl BenchTrainArgs {
    fn options(self) -> anyhow::Result<crate::grpo::bench::BenchTrainOptions> {
        let dtype = match self.dtype.as_str() {
            "f32" => candle_core::DType::F32,
            "bf16" => candle_core::DType::BF16,
            "f16" => candle_core::DType::F16,
            d => anyhow::bail!("--dtype {d}: expected f32, bf16 or f16"),
        };
        let device = crate::config::parse_device(&self.device)?;
        let base_dtype = match &self.base_dtype {
            Some(b) => Some(crate::model::load::parse_base_dtype(b, &device)?),
            None => None,
        };
        Ok(crate::grpo::bench::BenchTrainOptions {
            device,
            base_dtype,
            model: self.model,
            batch: self.batch,
            seq: self.seq,
            iters: self.iters,
            dtype,
            r: self.r,
            gradient_checkpointing: self.gradient_checkpointing,
            json: self.json,
        })
    }
}

#[derive(Args, Debug)]
pub struct BenchSampleArgs {
    #[command(flatten)]
    pub model: ModelSelectArgs,
    /// Number of distinct prompts (P).
    #[arg(long, default_value_t = 1)]
    pub prompts: usize,
    /// Completions per prompt (G).
    #[arg(long, default_value_t = 8)]
    pub num_generations: usize,
    /// New tokens per completion (exactly: stop tokens are suppressed).
    #[arg(long, default_value_t = 64)]
    pub new_tokens: usize,
    /// Tokens per prompt (random ids, seeded).
    #[arg(long, default_value_t = 100)]
    pub prompt_tokens: usize,
    /// Untimed warm-up runs before the measured one (0 to 100).
    #[arg(long, default_value_t = 1, value_parser = super::warmups)]
    pub warmup: usize,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// Where tokens are chosen: auto (host for CPU models, else the device), host, device.
    #[arg(long, value_enum, default_value_t = ChooseOnArg::Auto)]
    pub choose_on: ChooseOnArg,
    /// Print the result as one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// Where next tokens are chosen ([`ChooseOn`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum ChooseOnArg {
    /// The host for a CPU model, the model's device otherwise.
    #[default]
    Auto,
    /// Logits copied to the host, rows chosen in parallel threads: fastest on a CPU.
    Host,
    /// Tensor operations on the model's device; only tokens and their log-probs come
    /// back: what a GPU wants.
    Device,
}

impl From<ChooseOnArg> for ChooseOn {
    fn from(a: ChooseOnArg) -> Self {
        match a {
            ChooseOnArg::Auto => ChooseOn::Auto,
            ChooseOnArg::Host => ChooseOn::Host,
            ChooseOnArg::Device => ChooseOn::Device,
        }
    }
}

fn run_sample(args: BenchSampleArgs) -> anyhow::Result<()> {
    let r = crate::sample::bench(&BenchSampleOptions {
        model: args.model.spec()?,
        prompts: args.prompts,
        num_generations: args.num_generations,
        new_tokens: args.new_tokens,
        prompt_tokens: args.prompt_tokens,
        warmup: args.warmup,
        sampling: args.sampling.overrides(),
        choose_on: args.choose_on.into(),
    })?;
    if args.json {
        crate::say!("{}", r.to_json());
    } else {
        crate::say!(
            "P={} G={} rows={} prompt={} new={}: {:.1} tok/s overall ({:.1} tok/s decode), prefill {:.0} tok/s, {:.2}s, peak RSS {:.0} MiB",
            r.prompts,
            r.num_generations,
            r.rows(),
            r.prompt_tokens,
            args.new_tokens,
            r.tokens_per_s(),
            r.decode_tokens_per_s(),
            r.prefill_tokens_per_s(),
            r.seconds,
            r.peak_rss_mib.unwrap_or(0.0)
        );
    }
    Ok(())
}

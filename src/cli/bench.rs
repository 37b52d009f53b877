//! `concord bench`: sampling and training throughput.
use clap::Subcommand;

#[derive(clap::Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub command: BenchCommand,
}

#[derive(Subcommand)]
pub enum BenchCommand {
    /// Sampling throughput: tokens/s, prefill tokens/s, peak memory.
    Sample(crate::sample::BenchSampleArgs),
    /// LoRA forward+backward throughput: tokens/s, seconds, peak RSS.
    Train(BenchTrainArgs),
}

pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    match args.command {
        BenchCommand::Sample(a) => crate::sample::run_bench_sample(a),
        BenchCommand::Train(a) => crate::grpo::bench::bench_train(&a.options()?),
    }
}

#[derive(clap::Args, Debug)]
pub struct BenchTrainArgs {
    /// Model directory or Hub id; `random:0.5b` / `random:tiny` build random weights of
    /// that shape (no download).
    #[arg(long)]
    pub model: String,
    #[arg(long, default_value_t = 8)]
    pub batch: usize,
    #[arg(long, default_value_t = 160)]
    pub seq: usize,
    /// Timed iterations (after one warm-up).
    #[arg(long, default_value_t = 2)]
    pub iters: usize,
    #[arg(long, default_value = "f32")]
    pub dtype: String,
    #[arg(long, default_value = "cpu")]
    pub device: String,
    #[arg(long, default_value_t = 16)]
    pub r: usize,
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
        Ok(crate::grpo::bench::BenchTrainOptions {
            device: crate::config::parse_device(&self.device)?,
            model: self.model,
            batch: self.batch,
            seq: self.seq,
            iters: self.iters,
            dtype,
            r: self.r,
            json: self.json,
        })
    }
}

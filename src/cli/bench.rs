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
    Train(crate::grpo::trainer::BenchTrainArgs),
}

pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    match args.command {
        BenchCommand::Sample(a) => crate::sample::run_bench_sample(a),
        BenchCommand::Train(a) => crate::grpo::trainer::bench_train(a),
    }
}

//! `concord eval`.
use std::path::PathBuf;

#[derive(clap::Args, Debug)]
pub struct EvalArgs {
    /// The run configuration: model, environments (those of the last stage), sampling.
    #[arg(long)]
    pub config: PathBuf,
    /// Override a config key (repeatable), as for `train`.
    #[arg(long = "set", value_name = "SECTION.KEY=VALUE")]
    pub sets: Vec<String>,
    /// PEFT adapter directory (default: the config's run directory, or its `adapter/`
    /// folder as a published page keeps it; its warm start only when that is the run's
    /// one trained adapter).
    #[arg(long, conflicts_with = "base")]
    pub adapter: Option<PathBuf>,
    /// Evaluate the base model without any adapter.
    #[arg(long)]
    pub base: bool,
    /// Evaluate the run's start and its adapter on the same seeds and print the
    /// before/after table. The start is the base model, or the adapter the run started
    /// from (`model.adapter`, or the `[sft] warm_start` output in RUN_DIR/sft).
    #[arg(long, conflicts_with = "base")]
    pub compare: bool,
    /// Episodes per environment.
    #[arg(long, default_value_t = 100, value_parser = super::episodes)]
    pub episodes: usize,
    /// Index of the first held-out episode: `--first-seed 100 --episodes 100` plays
    /// another 100 held-out episodes than the default set.
    #[arg(long, default_value_t = 0)]
    pub first_seed: u64,
    /// Greedy decoding instead of the config's sampling parameters.
    #[arg(long)]
    pub greedy: bool,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// Where to write eval.json (default: into the adapter's directory).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Prompts sampled together (>= 1).
    #[arg(long, default_value_t = 32, value_parser = super::positive)]
    pub batch: usize,
    /// An earlier eval.json of the same config, episodes and sampling: its models
    /// (e.g. `base`, from `--base`) are reported beside this run's without being
    /// played again. A report of other episodes, other sampling or other environment
    /// options (a different game) is refused, the differences named.
    #[arg(long)]
    pub against: Option<PathBuf>,
    /// Also write every episode's transcript (the model's raw answers, the parsed
    /// actions, each policy seat's reward) to EVAL_transcripts.jsonl beside eval.json.
    #[arg(long)]
    pub transcripts: bool,
}

pub fn run(a: EvalArgs) -> anyhow::Result<()> {
    crate::eval::run_eval(crate::eval::EvalOptions {
        config: a.config,
        sets: a.sets,
        adapter: a.adapter,
        base: a.base,
        compare: a.compare,
        episodes: a.episodes,
        first_seed: a.first_seed,
        greedy: a.greedy,
        json: a.json,
        out: a.out,
        batch: a.batch,
        against: a.against,
        transcripts: a.transcripts,
    })
}

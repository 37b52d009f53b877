//! The `concord` command line. Thin: every clap type lives here, one file per command,
//! and each command calls one library entry function. No library module knows clap.
mod bench;
pub mod docs;
mod envs;
mod eval;
mod export;
pub mod generate;
pub mod model;
mod plot;
pub mod score;
mod serve;
mod sft;
mod train;

pub use bench::{BenchArgs, BenchCommand};
use clap::{Parser, Subcommand};

/// GRPO training of LLMs on multi-agent coordination games.
///
/// A model reference (`--model M`, `[model] name`) is a local directory, a `.gguf` file
/// or a Hub id (`Qwen/Qwen2.5-0.5B-Instruct`, optionally `@revision`), downloaded
/// through hf-hub into the standard Hugging Face cache (`HF_HOME`, `HF_TOKEN` and
/// `HF_HUB_OFFLINE` are honoured). The benchmarks also take `random:SHAPE`: random
/// weights of a built-in shape, built in memory.
///
/// Errors go to stderr, and the exit status is 1 (2 for a command-line error).
#[derive(Parser)]
#[command(name = "concord", version)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Inspect, play and benchmark the built-in environments.
    Envs(envs::EnvsArgs),
    /// Create model checkpoints and adapters, estimate a step's memory (`model init-tiny`,
    /// `model init-adapter`, `model estimate`).
    Model(model::ModelArgs),
    /// Log-probabilities of a completion given a chat prompt (JSON).
    ///
    /// Prints `{"prompt_ids", "completion_ids", "logprobs"}`: the token ids of the
    /// prompt and of the completion, and each completion token's log-probability under
    /// the model (with the adapter, if one is given).
    Score(score::ScoreArgs),
    /// Sample completions for chat prompts (G per prompt; `--prompts FILE.jsonl` batches).
    ///
    /// `--stop` cuts the text before a stop string, `--min-new-tokens` suppresses stop
    /// tokens before that many tokens, and `--logprobs` adds each completion's sampling
    /// and full log-probs to the JSON. The request is checked against the model's
    /// `max_position_embeddings` and the memory its KV cache needs before anything is
    /// allocated.
    Generate(generate::GenerateArgs),
    /// GRPO training: `concord train --config F [--set k=v]... [--resume DIR]` (with `[sft] warm_start`, SFT first).
    ///
    /// Trains the LoRA adapter a run configuration describes (docs/configuration.md)
    /// into its run directory, `<run.output_dir>/<run.name>/`, and draws the plots
    /// there at the end. With `[sft] warm_start = true` it first runs the SFT into
    /// `RUN_DIR/sft/` and starts GRPO from its adapter; a resume whose GRPO part has a
    /// checkpoint skips it.
    ///
    /// A directory that already holds a run is refused unless `--resume` continues it
    /// or `--overwrite` replaces it. Ctrl-C or SIGTERM writes a checkpoint before
    /// exiting, and a resumed run writes the same later rows as an uninterrupted one; a
    /// NaN or infinite loss or gradient skips the step without touching the adapter.
    Train(train::TrainArgs),
    /// Supervised fine-tuning of the LoRA adapter on demonstrations (`[sft]`).
    ///
    /// Trains on the `[sft]` demonstrations into the run directory: `training_log.csv`
    /// (TRL `SFTTrainer`'s column names: loss, grad_norm, learning_rate, num_tokens,
    /// mean_token_accuracy, ...), `checkpoint-N/` and the PEFT adapter. Every
    /// demonstration is read and checked before the directory is touched; the
    /// run-directory guard and `--resume` work as for `train`.
    Sft(sft::SftArgs),
    /// Play held-out episodes: reward components, win rates, 95% CIs (`--compare`: base vs adapter).
    ///
    /// Plays N held-out episodes per environment (those of the config's last stage)
    /// with the model in the policy seats, and reports the reward components, the win
    /// rate and the reward with 95% confidence intervals. Held-out episodes come from
    /// seeds with the top bit set, training's from seeds with it clear, so evaluation
    /// never replays a training episode.
    ///
    /// Writes `eval.json` beside the adapter (or `--out FILE`) and, for environments
    /// with a behaviour report, `eval_decisions.jsonl` beside it (`FILE_decisions.jsonl`
    /// for `--out FILE.json`): every decision's situation, state features, the model's
    /// action and the reference policy's. A progress line per round goes to stderr.
    ///
    /// Each seat's next prompt is prefilled on top of the KV cache of its last one, so
    /// only the tokens after their common prefix are computed; the kept KV is bounded
    /// by a quarter of the memory available when the evaluation starts.
    Eval(eval::EvalArgs),
    /// Benchmarks (`bench sample`, `bench train`, `bench grpo-step`, `bench serve`).
    Bench(bench::BenchArgs),
    /// Draw reward_curve.png, components.png (sft_curve.png for an SFT run; before_after.png after `eval --compare`) for a run directory.
    ///
    /// `reward_curve.png` is the reward per step with its rolling mean and the stage
    /// changes, `components.png` the reward components; an SFT run (`concord sft`'s, or
    /// a warm start's `sft/`) gets `sft_curve.png`, loss and token accuracy per step.
    /// `before_after.png` is drawn when the run's `eval.json` holds both the start and
    /// the adapter.
    ///
    /// With an `eval_log.csv` (`run.eval_every`), `learning_curve.png` draws the
    /// held-out reward and win rate against the step with 95% whiskers, and horizontal
    /// lines for the start model (`eval.json` / `eval_base.json`), the best constant
    /// policy and the heuristic. Those two are played on the first
    /// `--reference-episodes` held-out episodes of the run's config.toml by `concord
    /// eval`'s driver and kept in `references.json`.
    Plot(plot::PlotArgs),
    /// Serve an environment over the OpenEnv protocol (WebSocket /ws, HTTP, MCP).
    ///
    /// Endpoints: WebSocket `/ws` (one session per connection), `POST /reset`, `POST
    /// /step`, `GET /state`, `GET /health`, `GET /metadata`, `GET /schema` and `POST
    /// /mcp`. Prints `listening on http://ADDR` on stdout (with `--port 0`, the port
    /// chosen) and structured logs on stderr (`RUST_LOG` filters them). SIGINT or
    /// SIGTERM closes every session ("going away") and exits 0.
    Serve(serve::ServeArgs),
    /// Upload a run's adapter, logs, plots and a model card to the Hugging Face Hub.
    ///
    /// Uploads the adapter, `training_log.csv`, `config.toml`, `eval.json`, the plots
    /// and a generated model card (`README.md`, also written into the run directory).
    /// The token comes from `HF_TOKEN` or the `huggingface-cli login` token file, the
    /// Hub from `HF_ENDPOINT` (default https://huggingface.co).
    ///
    /// Every request is limited to `CONCORD_HUB_TIMEOUT` seconds (default 15, plus
    /// upload time at 256 KiB/s for file bodies) and retried at most 3 times, with a
    /// line on stderr before each retry. A malformed `HF_ENDPOINT`, a host that does
    /// not resolve, a token with spaces and HTTP 401/403/404 fail at once.
    Export(export::ExportArgs),
    /// Print the command-line or configuration reference as markdown (`docs cli`, `docs config`).
    ///
    /// The pages `docs/cli.md` and `docs/configuration.md` are this command's output,
    /// and a test fails when they differ from it: after changing a flag or a config
    /// key, run `cargo run -- docs cli > docs/cli.md` and `cargo run -- docs config >
    /// docs/configuration.md`.
    Docs(docs::DocsArgs),
}

/// A count flag that must be at least 1 (`--batch 0`, `--episodes 0` are refused by
/// the parser, before anything runs).
pub(crate) fn positive(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(format!("{e}")),
    }
}

/// The longest wall time a seconds flag takes: a day. A larger value (`1e30`, `inf`)
/// would overflow a deadline or run for days with no output; NaN is never a time.
const MAX_FLAG_SECONDS: f64 = 86_400.0;

/// A seconds flag (`--secs`, `--session-timeout`): a finite number in [0, a day].
pub(crate) fn seconds(s: &str) -> Result<f64, String> {
    let v: f64 = s.trim().parse().map_err(|e| format!("{e}"))?;
    if !v.is_finite() || v < 0.0 {
        return Err("must be a number of seconds >= 0".into());
    }
    if v > MAX_FLAG_SECONDS {
        return Err(format!("must be at most {MAX_FLAG_SECONDS} (a day)"));
    }
    Ok(v)
}

/// A timeout that must run out some time: seconds in (0, a day].
pub(crate) fn timeout_seconds(s: &str) -> Result<f64, String> {
    let v = seconds(s)?;
    if v > 0.0 {
        Ok(v)
    } else {
        Err("must be a number of seconds > 0".into())
    }
}

/// An integer in `lo..=hi`: counts that size allocations or loops (a rank, rows,
/// tokens, iterations), whose extreme values overflowed or ran for days.
fn bounded(s: &str, lo: usize, hi: usize) -> Result<usize, String> {
    let n: usize = s.trim().parse().map_err(|e| format!("{e}"))?;
    if n < lo {
        return Err(format!("must be at least {lo}"));
    }
    if n > hi {
        return Err(format!("must be at most {hi}"));
    }
    Ok(n)
}

/// A LoRA rank (`--r`): 1 to `[lora] r`'s limit.
pub(crate) fn lora_rank(s: &str) -> Result<usize, String> {
    bounded(s, 1, crate::config::limits::MAX_LORA_R)
}

/// Rows of a benchmark batch (`bench train --batch`).
pub(crate) fn rows(s: &str) -> Result<usize, String> {
    bounded(s, 1, crate::config::limits::MAX_BATCH_ROWS)
}

/// Tokens of a benchmark sequence (`bench train --seq`).
pub(crate) fn seq_tokens(s: &str) -> Result<usize, String> {
    bounded(s, 2, crate::config::limits::MAX_COMPLETION_LENGTH)
}

/// A token count of an estimate (`model estimate --prompt-tokens`): 1 to the longest
/// completion a config may ask for.
pub(crate) fn tokens(s: &str) -> Result<usize, String> {
    bounded(s, 1, crate::config::limits::MAX_COMPLETION_LENGTH)
}

/// Benchmark repetitions (`--iters`, `--steps`): at least 1, at most 10,000.
pub(crate) fn repetitions(s: &str) -> Result<usize, String> {
    bounded(s, 1, 10_000)
}

/// Untimed warm-up runs (`bench sample --warmup`): 0 to 100.
pub(crate) fn warmups(s: &str) -> Result<usize, String> {
    bounded(s, 0, 100)
}

/// A finite number > 0 (`--alpha`): NaN or inf would write an adapter that ruins every
/// forward pass.
pub(crate) fn positive_number(s: &str) -> Result<f64, String> {
    let v: f64 = s.trim().parse().map_err(|e| format!("{e}"))?;
    if !(v.is_finite() && v > 0.0) {
        return Err("must be a finite number > 0".into());
    }
    Ok(v)
}

/// A finite number >= 0 (`--b-std`).
pub(crate) fn non_negative_number(s: &str) -> Result<f64, String> {
    let v: f64 = s.trim().parse().map_err(|e| format!("{e}"))?;
    if !(v.is_finite() && v >= 0.0) {
        return Err("must be a finite number >= 0".into());
    }
    Ok(v)
}

/// The most episodes one `eval` or `envs baseline` call plays: more runs for hours
/// (`envs baseline` prints nothing until it ends) and is surely a typo.
const MAX_EPISODES: usize = crate::config::limits::MAX_EVAL_EPISODES;

/// An episode count: 1 to [`MAX_EPISODES`].
pub(crate) fn episodes(s: &str) -> Result<usize, String> {
    let n = positive(s)?;
    if n > MAX_EPISODES {
        return Err(format!("must be at most {MAX_EPISODES}"));
    }
    Ok(n)
}

/// The most WebSocket sessions `serve` admits or `bench serve` opens at once. Each is
/// a thread (two in `bench serve`: client and server); far more exhaust the process's
/// memory maps, and the thread runtime aborts instead of returning an error.
pub(crate) const MAX_SESSIONS: usize = 4096;

/// A session count: 1 to [`MAX_SESSIONS`].
pub(crate) fn sessions(s: &str) -> Result<usize, String> {
    let n = positive(s)?;
    if n > MAX_SESSIONS {
        return Err(format!("must be at most {MAX_SESSIONS}"));
    }
    Ok(n)
}

/// `text` cut to its first `head` and last `tail` characters, with how much was left out,
/// when it is longer than both.
fn shorten(text: &str, head: usize, tail: usize) -> String {
    let n = text.chars().count();
    if n <= head + tail + 100 {
        return text.to_string();
    }
    let first: String = text.chars().take(head).collect();
    let last: String = text.chars().skip(n - tail).collect();
    format!(
        "{first} ... ({} characters left out) ... {last}",
        n - head - tail
    )
}

pub fn main() -> i32 {
    main_with(Vec::new())
}

/// [`main`] with environments of the caller's own added to the registry first: a
/// crate of environments builds its own `concord` binary with every command
/// (`train`, `eval`, `envs`, `serve`, ...) as `fn main() { std::process::exit(
/// concord::cli::main_with(vec![my_env::entry()])) }` (`examples/own-env/`).
pub fn main_with(envs: Vec<crate::envs::EnvEntry>) -> i32 {
    let argv0 = std::env::args_os().next().map(std::path::PathBuf::from);
    if let Some(name) = argv0.as_deref().and_then(|p| p.file_name()) {
        crate::run::dir::set_program_name(&name.to_string_lossy());
    }
    for e in envs {
        if let Err(e) = crate::envs::register(e) {
            crate::note!("error: {e:#}");
            return 1;
        }
    }
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return usage_error(e),
    };
    match run(cli) {
        Ok(()) => 0,
        Err(e) => {
            // An endpoint or env.url may carry credentials; errors quote URLs, and
            // values, which may be megabytes long.
            let text = crate::sys::redact_url_credentials(&error_text(&e));
            crate::note!("error: {}", shorten(&text, 2000, 500));
            1
        }
    }
}

/// clap's help and errors, as `Cli::parse` would print them, except that an error quoting
/// a huge value is shortened like every other error.
fn usage_error(e: clap::Error) -> i32 {
    use clap::error::ErrorKind;
    if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
        let _ = e.print();
        return e.exit_code();
    }
    let text = crate::sys::redact_url_credentials(&e.render().to_string());
    crate::note!("{}", shorten(text.trim_end(), 2000, 500));
    e.exit_code()
}

/// `{e:#}` without the repeats: layers that quote their cause (candle's and
/// safetensors' errors do) would otherwise print the same OS error twice.
fn error_text(e: &anyhow::Error) -> String {
    let mut parts: Vec<String> = Vec::new();
    for cause in e.chain() {
        let c = match cause.downcast_ref::<candle_core::Error>() {
            Some(candle) => crate::model::candle_message(candle),
            None => cause.to_string(),
        };
        if !parts.last().is_some_and(|p| p.ends_with(c.as_str())) {
            parts.push(c);
        }
    }
    parts.join(": ")
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Envs(args) => envs::run(args),
        Command::Model(args) => model::run(args),
        Command::Score(args) => score::run(args),
        Command::Generate(args) => generate::run(args),
        Command::Train(args) => train::run(args),
        Command::Sft(args) => sft::run(args),
        Command::Eval(args) => eval::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Plot(args) => plot::run(args),
        Command::Export(args) => export::run(args),
        Command::Serve(args) => serve::run(args),
        Command::Docs(args) => docs::run(args),
    }
}

#[cfg(test)]
mod tests {
    use super::{error_text, shorten};

    /// Issue #31, item 22: a disk-full error said the OS error twice and named no file.
    #[test]
    fn errors_name_each_cause_once() {
        let os = std::io::Error::from_raw_os_error(28);
        let quoted = format!("safetensors: {os}");
        let e = anyhow::Error::new(os)
            .context(quoted)
            .context("writing runs/r/adapter_model.safetensors");
        let text = error_text(&e);
        assert_eq!(text.matches("(os error 28)").count(), 1, "{text}");
        assert!(
            text.starts_with("writing runs/r/adapter_model.safetensors: "),
            "{text}"
        );
    }

    #[test]
    fn long_errors_keep_their_ends() {
        assert_eq!(shorten("short", 10, 5), "short");
        let long = format!("key `a.b`: {} end", "x".repeat(10_000));
        let s = shorten(&long, 20, 3);
        assert!(s.starts_with("key `a.b`: xxxxxxxxx"), "{s}");
        assert!(
            s.ends_with("end") && s.contains("characters left out"),
            "{s}"
        );
        assert!(s.len() < 100, "{s}");
    }
}

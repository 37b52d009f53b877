//! `training_log.csv` and `samples.jsonl`: the typed step row, its writer and the reader
//! that `plot` and `hub` use. Each column's name sits beside the field it reads
//! ([`HEAD_COLUMNS`], [`TAIL_COLUMNS`]), and the header is built from those lists, so
//! nothing has to keep string keys in sync with a column list elsewhere.
use anyhow::{bail, Context, Result};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

/// The training log a run directory always has.
pub const TRAINING_LOG: &str = "training_log.csv";
/// A few logged completions per step (`run.log_samples`).
pub const SAMPLES: &str = "samples.jsonl";
/// Held-out evaluations during training (`[run] eval_every`).
pub const EVAL_LOG: &str = "eval_log.csv";

/// One row of training_log.csv (TRL's metric names where they apply).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepRow {
    pub step: usize,
    pub stage: String,
    pub env: String,
    pub reward: f64,
    pub reward_std: f64,
    pub frac_reward_zero_std: f64,
    /// Share of the trained groups whose completions are all token-identical.
    pub frac_identical_completions: f64,
    /// Distinct completions per trained group, on average.
    pub distinct_completions: f64,
    /// Prompts drawn this step (dynamic sampling only).
    pub prompt_draws: f64,
    /// Reward component name -> (mean, std) over the step's completions.
    pub components: BTreeMap<String, (f64, f64)>,
    pub mean_length: f64,
    pub min_length: f64,
    pub max_length: f64,
    pub clipped_ratio: f64,
    /// Lengths of the completions that ended (not truncated); 0 when none did.
    pub mean_terminated_length: f64,
    pub min_terminated_length: f64,
    pub max_terminated_length: f64,
    pub kl: f64,
    pub entropy: f64,
    pub clip_low: f64,
    pub clip_high: f64,
    pub clip_region: f64,
    pub clip_low_min: f64,
    pub clip_high_max: f64,
    /// `cispo` runs only.
    pub cispo_clip_ratio: f64,
    /// `vespo` runs only.
    pub vespo_phi_mean: f64,
    pub loss: f64,
    /// The loss without the entropy bonus.
    pub policy_loss: f64,
    /// `|logp_trainer - logp_sampler|` over the trained tokens.
    pub sampling_logp_diff_mean: f64,
    pub sampling_logp_diff_max: f64,
    /// Sampler/trainer importance weights (per token or sequence, as configured).
    pub sampling_ratio_min: f64,
    pub sampling_ratio_mean: f64,
    pub sampling_ratio_max: f64,
    pub grad_norm: f64,
    pub learning_rate: f64,
    pub num_tokens: f64,
    /// 1 when the update was skipped (non-finite loss or gradient).
    pub skipped: f64,
    pub gen_tokens_per_s: f64,
    pub train_tokens_per_s: f64,
    pub peak_mem_mb: f64,
    pub step_time: f64,
    /// Cumulative training wall time.
    pub seconds: f64,
    /// Episode mode: model turns per trajectory (mean and max).
    pub episode_mean_turns: f64,
    pub episode_max_turns: f64,
    /// Episode mode: model tokens and environment tokens per trajectory (means).
    pub episode_model_tokens: f64,
    pub episode_env_tokens: f64,
    /// Episode mode: share of trajectories cut by `max_completion_length`.
    pub episode_truncated_frac: f64,
    /// `[env] contested`: decisions drawn per prompt, the share of prompts whose
    /// decision is contested, and the mean spread of their legal actions' rewards.
    pub decision_draws: f64,
    pub contested_frac: f64,
    pub action_spread: f64,
    /// `[env] enumerate_actions`: the share of groups in which a sampled completion
    /// reached the group's best reward, and the mean advantage the enumerated ones train
    /// with (never below 0).
    pub sampled_best_frac: f64,
    pub forced_advantage: f64,
}

type Column = (&'static str, fn(&StepRow) -> f64);

/// Numeric columns before the `rewards/<c>/{mean,std}` pairs.
pub const HEAD_COLUMNS: &[Column] = &[
    ("reward", |r| r.reward),
    ("reward_std", |r| r.reward_std),
    ("frac_reward_zero_std", |r| r.frac_reward_zero_std),
    ("frac_identical_completions", |r| {
        r.frac_identical_completions
    }),
    ("completions/distinct_mean", |r| r.distinct_completions),
];

/// Written after [`HEAD_COLUMNS`] by runs with `grpo.dynamic_sampling` (whose
/// `frac_reward_zero_std` then counts every group drawn, before filtering).
pub const DYNAMIC_SAMPLING_COLUMNS: &[Column] = &[("prompt_draws", |r| r.prompt_draws)];

/// Numeric columns after the reward components.
pub const TAIL_COLUMNS: &[Column] = &[
    ("completions/mean_length", |r| r.mean_length),
    ("completions/min_length", |r| r.min_length),
    ("completions/max_length", |r| r.max_length),
    ("completions/clipped_ratio", |r| r.clipped_ratio),
    ("completions/mean_terminated_length", |r| {
        r.mean_terminated_length
    }),
    ("completions/min_terminated_length", |r| {
        r.min_terminated_length
    }),
    ("completions/max_terminated_length", |r| {
        r.max_terminated_length
    }),
    ("kl", |r| r.kl),
    ("entropy", |r| r.entropy),
    ("clip_ratio/low_mean", |r| r.clip_low),
    ("clip_ratio/high_mean", |r| r.clip_high),
    ("clip_ratio/region_mean", |r| r.clip_region),
    ("clip_ratio/low_min", |r| r.clip_low_min),
    ("clip_ratio/high_max", |r| r.clip_high_max),
    ("loss", |r| r.loss),
    ("policy_loss", |r| r.policy_loss),
    ("sampling/sampling_logp_difference/mean", |r| {
        r.sampling_logp_diff_mean
    }),
    ("sampling/sampling_logp_difference/max", |r| {
        r.sampling_logp_diff_max
    }),
    ("sampling/importance_sampling_ratio/min", |r| {
        r.sampling_ratio_min
    }),
    ("sampling/importance_sampling_ratio/mean", |r| {
        r.sampling_ratio_mean
    }),
    ("sampling/importance_sampling_ratio/max", |r| {
        r.sampling_ratio_max
    }),
    ("grad_norm", |r| r.grad_norm),
    ("learning_rate", |r| r.learning_rate),
    ("num_tokens", |r| r.num_tokens),
    ("skipped", |r| r.skipped),
    ("gen_tokens_per_s", |r| r.gen_tokens_per_s),
    ("train_tokens_per_s", |r| r.train_tokens_per_s),
    ("peak_mem_mb", |r| r.peak_mem_mb),
    ("step_time", |r| r.step_time),
    ("seconds", |r| r.seconds),
];

/// Written last by runs with `grpo.loss_type = "cispo"` (in any stage).
pub const CISPO_COLUMNS: &[Column] = &[("cispo_clip_ratio", |r| r.cispo_clip_ratio)];

/// Written last by runs with `grpo.loss_type = "vespo"` (in any stage).
pub const VESPO_COLUMNS: &[Column] = &[("vespo/phi_seq_mean", |r| r.vespo_phi_mean)];

/// Written last by runs in `[env] mode = "episode"` (whole trajectories).
pub const EPISODE_COLUMNS: &[Column] = &[
    ("episode/mean_turns", |r| r.episode_mean_turns),
    ("episode/max_turns", |r| r.episode_max_turns),
    ("episode/model_tokens", |r| r.episode_model_tokens),
    ("episode/env_tokens", |r| r.episode_env_tokens),
    ("episode/truncated_frac", |r| r.episode_truncated_frac),
];

/// Written after [`HEAD_COLUMNS`] by runs with `[env] contested`, over the step's
/// prompts.
pub const CONTEST_COLUMNS: &[Column] = &[
    ("decisions/draws", |r| r.decision_draws),
    ("decisions/contested_frac", |r| r.contested_frac),
    ("decisions/action_spread", |r| r.action_spread),
];

/// Written after [`CONTEST_COLUMNS`] by runs with `[env] enumerate_actions`.
pub const ENUMERATE_COLUMNS: &[Column] = &[
    ("explore/sampled_best_frac", |r| r.sampled_best_frac),
    ("explore/forced_advantage", |r| r.forced_advantage),
];

/// The column groups only some runs write.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OptionalColumns {
    /// [`DYNAMIC_SAMPLING_COLUMNS`].
    pub dynamic_sampling: bool,
    /// [`CISPO_COLUMNS`].
    pub cispo: bool,
    /// [`VESPO_COLUMNS`].
    pub vespo: bool,
    /// [`EPISODE_COLUMNS`].
    pub episode: bool,
    /// [`CONTEST_COLUMNS`].
    pub contested: bool,
    /// [`ENUMERATE_COLUMNS`].
    pub enumerate: bool,
}

/// Columns whose values depend on wall time (excluded when comparing runs).
pub const TIMING_COLUMNS: &[&str] = &[
    "gen_tokens_per_s",
    "train_tokens_per_s",
    "peak_mem_mb",
    "step_time",
    "seconds",
];

/// The header for a run whose reward components are `components` (sorted names).
pub fn csv_header(components: &[String], optional: OptionalColumns) -> Vec<String> {
    let mut h = vec!["step".to_string(), "stage".into(), "env".into()];
    h.extend(HEAD_COLUMNS.iter().map(|(n, _)| n.to_string()));
    if optional.dynamic_sampling {
        h.extend(DYNAMIC_SAMPLING_COLUMNS.iter().map(|(n, _)| n.to_string()));
    }
    if optional.contested {
        h.extend(CONTEST_COLUMNS.iter().map(|(n, _)| n.to_string()));
    }
    if optional.enumerate {
        h.extend(ENUMERATE_COLUMNS.iter().map(|(n, _)| n.to_string()));
    }
    for c in components {
        h.push(format!("rewards/{c}/mean"));
        h.push(format!("rewards/{c}/std"));
    }
    h.extend(TAIL_COLUMNS.iter().map(|(n, _)| n.to_string()));
    for (on, cols) in [
        (optional.cispo, CISPO_COLUMNS),
        (optional.vespo, VESPO_COLUMNS),
        (optional.episode, EPISODE_COLUMNS),
    ] {
        if on {
            h.extend(cols.iter().map(|(n, _)| n.to_string()));
        }
    }
    h
}

fn fmt_f(x: f64) -> String {
    if x.is_finite() {
        format!("{x}")
    } else {
        "nan".into()
    }
}

/// `row` as one CSV line in `header`'s column order (empty cells for unknown columns
/// and components this step did not produce).
pub fn csv_line(header: &[String], row: &StepRow) -> String {
    let cell = |c: &str| -> String {
        match c {
            "step" => return row.step.to_string(),
            "stage" => return row.stage.clone(),
            "env" => return row.env.clone(),
            _ => {}
        }
        if let Some(rest) = c.strip_prefix("rewards/") {
            let (name, pick_std) = match (rest.strip_suffix("/mean"), rest.strip_suffix("/std")) {
                (Some(n), _) => (n, false),
                (_, Some(n)) => (n, true),
                _ => return String::new(),
            };
            return row
                .components
                .get(name)
                .map_or(String::new(), |v| fmt_f(if pick_std { v.1 } else { v.0 }));
        }
        HEAD_COLUMNS
            .iter()
            .chain(DYNAMIC_SAMPLING_COLUMNS)
            .chain(CONTEST_COLUMNS)
            .chain(ENUMERATE_COLUMNS)
            .chain(TAIL_COLUMNS)
            .chain(CISPO_COLUMNS)
            .chain(VESPO_COLUMNS)
            .chain(EPISODE_COLUMNS)
            .find(|(n, _)| *n == c)
            .map_or(String::new(), |(_, get)| fmt_f(get(row)))
    };
    header.iter().map(|c| cell(c)).collect::<Vec<_>>().join(",")
}

/// Append `row` to `run_dir/training_log.csv`, writing `header` first into a new file
/// (and to the TensorBoard events, as `train/<column>`, when `tensorboard`).
pub fn append_row(
    run_dir: &Path,
    header: &[String],
    row: &StepRow,
    tensorboard: bool,
) -> Result<()> {
    let path = run_dir.join(TRAINING_LOG);
    let mut text = csv_start(&path, &header.join(","))?;
    let line = csv_line(header, row);
    text.push_str(&line);
    text.push('\n');
    append(&path, &text)?;
    if tensorboard {
        super::tensorboard::append_csv_row(run_dir, "train", header, &line, row.step)?;
    }
    Ok(())
}

/// Append JSON lines to `run_dir/samples.jsonl`.
pub fn append_samples(run_dir: &Path, samples: &[serde_json::Value]) -> Result<()> {
    if samples.is_empty() {
        return Ok(());
    }
    let mut text = String::new();
    for v in samples {
        text.push_str(&v.to_string());
        text.push('\n');
    }
    append(&run_dir.join(SAMPLES), &text)
}

/// What goes before the first row appended to the CSV log `path` with `header`: the
/// header, when the file is new. A file cut inside its header line (a crash while
/// it was written) is started again; a file whose rows follow another header is
/// refused, since rows appended under it would no longer match their columns.
fn csv_start(path: &Path, header: &str) -> Result<String> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(format!("{header}\n")),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let mut lines = text.lines();
    let first = lines.next().unwrap_or("");
    if first == header && text.contains('\n') {
        return Ok(String::new());
    }
    if lines.next().is_none() && header.starts_with(first) {
        crate::atomic::atomic_write_bytes(path, format!("{header}\n").as_bytes())?;
        return Ok(String::new());
    }
    bail!(
        "{}: its header is not this run's ({} columns, this run writes {}); the file was cut \
         or edited: restore it, or start a new run",
        path.display(),
        first.split(',').count(),
        header.split(',').count()
    )
}

fn append(path: &Path, text: &str) -> Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))?;
    f.write_all(text.as_bytes())
        .and_then(|()| f.flush())
        .with_context(|| format!("appending to {}", path.display()))
}

/// Delete the logs of an earlier run in `run_dir` (a fresh run starts fresh logs).
pub fn remove_logs(run_dir: &Path) -> Result<()> {
    for f in [TRAINING_LOG, SAMPLES, EVAL_LOG] {
        let p = run_dir.join(f);
        if p.exists() {
            std::fs::remove_file(&p).with_context(|| format!("removing {}", p.display()))?;
        }
    }
    super::tensorboard::remove(run_dir)
}

/// The lines of `text` that were written whole: a last line without its newline is
/// what a crash cut, and is dropped (the first, a header, is kept for [`csv_start`]).
fn complete_lines(text: &str) -> impl Iterator<Item = &str> {
    let whole = match text.rfind('\n') {
        Some(i) if i + 1 < text.len() => &text[..=i],
        // Ends with its newline, or is a single line (a header, perhaps cut).
        _ => text,
    };
    whole.lines()
}

/// Drop rows of training_log.csv / samples.jsonl written after `step` (by the run that
/// was interrupted after its last checkpoint). Atomic rewrite.
pub fn truncate_logs(run_dir: &Path, step: usize) -> Result<()> {
    for name in [TRAINING_LOG, EVAL_LOG] {
        let csv = run_dir.join(name);
        if !csv.exists() {
            continue;
        }
        let text = std::fs::read_to_string(&csv)?;
        let mut out = String::new();
        for (i, line) in complete_lines(&text).enumerate() {
            let keep = i == 0
                || line
                    .split(',')
                    .next()
                    .and_then(|s| s.parse::<usize>().ok())
                    .is_some_and(|s| s <= step);
            if keep {
                out.push_str(line);
                out.push('\n');
            }
        }
        crate::atomic::atomic_write_bytes(&csv, out.as_bytes())?;
    }
    let samples = run_dir.join(SAMPLES);
    if samples.exists() {
        let text = std::fs::read_to_string(&samples)?;
        let mut out = String::new();
        for line in complete_lines(&text) {
            let s = serde_json::from_str::<serde_json::Value>(line)
                .ok()
                .and_then(|v| v.get("step").and_then(|s| s.as_u64()));
            if s.is_some_and(|s| s as usize <= step) {
                out.push_str(line);
                out.push('\n');
            }
        }
        crate::atomic::atomic_write_bytes(&samples, out.as_bytes())?;
    }
    super::tensorboard::truncate(run_dir, step)
}

/// The columns of `eval_log.csv`: one row per environment per held-out evaluation.
/// Intervals are 95% (Wilson for rates, normal for means); the behaviour columns are
/// empty for environments without a reference policy; `actions` lists each action's
/// share as `LABEL:share` separated by spaces.
pub const EVAL_LOG_HEADER: &str = "step,env,episodes,win_rate,win_lo,win_hi,reward,reward_lo,\
reward_hi,agreement,agreement_lo,agreement_hi,best_constant_agreement,\
mutual_information_bits,actions,eval_seconds";

/// Whether `eval_log.csv` already holds a row for `step`.
pub fn has_eval_row(run_dir: &Path, step: usize) -> Result<bool> {
    let path = run_dir.join(EVAL_LOG);
    if !path.exists() {
        return Ok(false);
    }
    let text = std::fs::read_to_string(&path)?;
    let found = complete_lines(&text)
        .skip(1)
        .any(|l| l.split(',').next().and_then(|s| s.parse::<usize>().ok()) == Some(step));
    Ok(found)
}

/// Append one held-out evaluation of `env` at `step` to `eval_log.csv` (writing the
/// header first when the file is new), and to the TensorBoard events as
/// `eval/<env>/<column>` when `tensorboard`.
pub fn append_eval_row(
    run_dir: &Path,
    step: usize,
    env: &str,
    e: &crate::run::eval_report::EnvEval,
    seconds: f64,
    tensorboard: bool,
) -> Result<()> {
    let path = run_dir.join(EVAL_LOG);
    let mut text = csv_start(&path, EVAL_LOG_HEADER)?;
    let (agree, best, mi, actions) = match &e.behaviour {
        Some(b) => (
            format!(
                "{:.6},{:.6},{:.6}",
                b.agreement, b.agreement_ci95[0], b.agreement_ci95[1]
            ),
            format!("{:.6}", b.best_constant.agreement),
            format!("{:.6}", b.mutual_information_bits),
            b.actions
                .iter()
                .map(|(a, c)| format!("{a}:{:.4}", *c as f64 / b.decisions.max(1) as f64))
                .collect::<Vec<_>>()
                .join(" "),
        ),
        None => (",,".into(), String::new(), String::new(), String::new()),
    };
    let line = format!(
        "{step},{env},{},{:.6},{:.6},{:.6},{:.6},{:.6},{:.6},{agree},{best},{mi},{actions},{seconds:.1}",
        e.episodes,
        e.win_rate,
        e.win_ci95[0],
        e.win_ci95[1],
        e.reward_mean,
        e.reward_ci95[0],
        e.reward_ci95[1],
    );
    text.push_str(&line);
    text.push('\n');
    append(&path, &text)?;
    if tensorboard {
        let header: Vec<String> = EVAL_LOG_HEADER.split(',').map(str::to_string).collect();
        let prefix = format!("eval/{env}");
        super::tensorboard::append_csv_row(run_dir, &prefix, &header, &line, step)?;
    }
    Ok(())
}

/// One row of an SFT run's training_log.csv (TRL `SFTTrainer`'s names).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SftRow {
    pub step: usize,
    /// Passes over the demonstrations so far (fractional, as TRL logs it).
    pub epoch: f64,
    /// Mean negative log-likelihood per completion token of the step's batch.
    pub loss: f64,
    pub grad_norm: f64,
    pub learning_rate: f64,
    /// Prompt + completion tokens trained on so far.
    pub num_tokens: f64,
    /// Share of completion tokens whose most likely next token is the target.
    pub mean_token_accuracy: f64,
    /// 1 when the update was skipped (non-finite loss or gradient).
    pub skipped: f64,
    pub step_time: f64,
    /// Cumulative training wall time.
    pub seconds: f64,
}

type SftColumn = (&'static str, fn(&SftRow) -> f64);

/// The numeric columns of an SFT log, after `step`.
pub const SFT_COLUMNS: &[SftColumn] = &[
    ("epoch", |r| r.epoch),
    ("loss", |r| r.loss),
    ("grad_norm", |r| r.grad_norm),
    ("learning_rate", |r| r.learning_rate),
    ("num_tokens", |r| r.num_tokens),
    ("mean_token_accuracy", |r| r.mean_token_accuracy),
    ("skipped", |r| r.skipped),
    ("step_time", |r| r.step_time),
    ("seconds", |r| r.seconds),
];

/// The header of an SFT run's training_log.csv.
pub fn sft_header() -> Vec<String> {
    std::iter::once("step")
        .chain(SFT_COLUMNS.iter().map(|(n, _)| *n))
        .map(str::to_string)
        .collect()
}

/// Append `row` to `run_dir/training_log.csv` (header first into a new file), and to
/// the TensorBoard events as `train/<column>` when `tensorboard`.
pub fn append_sft_row(run_dir: &Path, row: &SftRow, tensorboard: bool) -> Result<()> {
    let path = run_dir.join(TRAINING_LOG);
    let header = sft_header();
    let mut text = csv_start(&path, &header.join(","))?;
    let mut line = row.step.to_string();
    for (_, get) in SFT_COLUMNS {
        line.push(',');
        line.push_str(&fmt_f(get(row)));
    }
    text.push_str(&line);
    text.push('\n');
    append(&path, &text)?;
    if tensorboard {
        super::tensorboard::append_csv_row(run_dir, "train", &header, &line, row.step)?;
    }
    Ok(())
}

/// `training_log.csv`, parsed by header name. Numeric cells that are empty, `nan` or
/// otherwise not a finite number are NaN.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainingLog {
    /// Header, in file order.
    pub header: Vec<String>,
    /// The `step` column.
    pub steps: Vec<f64>,
    /// The `stage` column (empty strings when the log has none).
    pub stages: Vec<String>,
    /// The `env` column (empty strings when the log has none).
    pub envs: Vec<String>,
    numeric: BTreeMap<String, Vec<f64>>,
}

impl TrainingLog {
    pub fn read(path: &Path) -> Result<Self> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        Self::parse(&text).with_context(|| format!("parsing {}", path.display()))
    }

    /// Parse CSV text. Needs a `step` column with a number on every row.
    pub fn parse(text: &str) -> Result<Self> {
        let mut lines = text
            .lines()
            .enumerate()
            .map(|(i, l)| (i + 1, l.trim_end_matches('\r')))
            .filter(|(_, l)| !l.trim().is_empty());
        let Some((_, head)) = lines.next() else {
            bail!("empty file (no header)");
        };
        let header: Vec<String> = split_csv_line(head)
            .into_iter()
            .map(|h| h.trim().to_string())
            .collect();
        let col = |name: &str| header.iter().position(|h| h == name);
        let step_col = col("step").context("no `step` column in the header")?;
        let stage_col = col("stage");
        let env_col = col("env");
        let mut log = TrainingLog {
            header: header.clone(),
            steps: Vec::new(),
            stages: Vec::new(),
            envs: Vec::new(),
            numeric: BTreeMap::new(),
        };
        let numeric_cols: Vec<(usize, &String)> = header
            .iter()
            .enumerate()
            .filter(|(i, _)| Some(*i) != stage_col && Some(*i) != env_col && *i != step_col)
            .collect();
        for (_, name) in &numeric_cols {
            log.numeric.insert((*name).clone(), Vec::new());
        }
        for (lineno, line) in lines {
            let cells = split_csv_line(line);
            if cells.len() != header.len() {
                bail!(
                    "line {lineno}: {} fields, the header has {}",
                    cells.len(),
                    header.len()
                );
            }
            let step = cells[step_col].trim();
            let step: f64 = step
                .parse()
                .ok()
                .filter(|s: &f64| s.is_finite())
                .with_context(|| format!("line {lineno}: step {step:?} is not a number"))?;
            log.steps.push(step);
            log.stages
                .push(stage_col.map_or(String::new(), |c| cells[c].trim().to_string()));
            log.envs
                .push(env_col.map_or(String::new(), |c| cells[c].trim().to_string()));
            for (i, name) in &numeric_cols {
                if let Some(v) = log.numeric.get_mut(*name) {
                    v.push(parse_cell(&cells[*i]));
                }
            }
        }
        Ok(log)
    }

    pub fn len(&self) -> usize {
        self.steps.len()
    }

    pub fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }

    /// A numeric column by header name (NaN for missing / non-finite cells).
    pub fn column(&self, name: &str) -> Option<&[f64]> {
        self.numeric.get(name).map(|v| v.as_slice())
    }

    /// Reward component names, in header order: the `<c>` of `rewards/<c>/mean`.
    pub fn component_names(&self) -> Vec<String> {
        self.header
            .iter()
            .filter_map(|h| h.strip_prefix("rewards/")?.strip_suffix("/mean"))
            .map(str::to_string)
            .collect()
    }

    /// Rows with `skipped` = 1 (no update was made at that step).
    pub fn skipped(&self) -> Vec<bool> {
        match self.column("skipped") {
            Some(v) => v.iter().map(|x| *x != 0.0 && x.is_finite()).collect(),
            None => vec![false; self.len()],
        }
    }
}

fn parse_cell(cell: &str) -> f64 {
    cell.trim()
        .parse::<f64>()
        .ok()
        .filter(|v| v.is_finite())
        .unwrap_or(f64::NAN)
}

/// Split one CSV line; double-quoted fields may hold commas and `""` escapes.
fn split_csv_line(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '"' if quoted && chars.peek() == Some(&'"') => {
                cur.push('"');
                chars.next();
            }
            '"' => quoted = !quoted,
            ',' if !quoted => out.push(std::mem::take(&mut cur)),
            _ => cur.push(c),
        }
    }
    out.push(cur);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cut_header_is_restarted_and_a_foreign_one_refused() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("log.csv");
        assert_eq!(csv_start(&p, "step,a,b").unwrap(), "step,a,b\n");
        for cut in ["", "step,a", "step,a,b"] {
            std::fs::write(&p, cut).unwrap();
            assert_eq!(csv_start(&p, "step,a,b").unwrap(), "", "{cut:?}");
            assert_eq!(std::fs::read_to_string(&p).unwrap(), "step,a,b\n");
        }
        std::fs::write(&p, "step,a,b\n1,2,3\n").unwrap();
        assert_eq!(csv_start(&p, "step,a,b").unwrap(), "");
        let e = csv_start(&p, "step,a,b,c").unwrap_err().to_string();
        assert!(e.contains("log.csv") && e.contains("3 columns"), "{e}");
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "step,a,b\n1,2,3\n");
    }

    #[test]
    fn a_resume_drops_rows_after_the_checkpoint_and_a_cut_last_row() {
        let d = tempfile::tempdir().unwrap();
        let log = d.path().join(TRAINING_LOG);
        std::fs::write(&log, "step,x\n1,0.5\n2,0.25\n3,0.1\n4,0").unwrap();
        truncate_logs(d.path(), 3).unwrap();
        assert_eq!(
            std::fs::read_to_string(&log).unwrap(),
            "step,x\n1,0.5\n2,0.25\n3,0.1\n"
        );
        std::fs::write(&log, "step,x\n1,0.5\n2,0.2").unwrap();
        truncate_logs(d.path(), 3).unwrap();
        assert_eq!(std::fs::read_to_string(&log).unwrap(), "step,x\n1,0.5\n");
        let samples = d.path().join(SAMPLES);
        std::fs::write(&samples, "{\"step\":1}\n{\"step\":2}\n{\"step\":").unwrap();
        truncate_logs(d.path(), 1).unwrap();
        assert_eq!(std::fs::read_to_string(&samples).unwrap(), "{\"step\":1}\n");
    }

    #[test]
    fn written_rows_read_back_by_name() {
        let header = csv_header(&["win".to_string()], OptionalColumns::default());
        let row = StepRow {
            step: 3,
            stage: "main".into(),
            env: "ticketmelt".into(),
            reward: 0.5,
            components: BTreeMap::from([("win".to_string(), (0.25, 0.5))]),
            loss: f64::NAN,
            seconds: 7.0,
            ..StepRow::default()
        };
        let text = format!("{}\n{}\n", header.join(","), csv_line(&header, &row));
        let log = TrainingLog::parse(&text).unwrap();
        assert_eq!(log.steps, vec![3.0]);
        assert_eq!(log.stages, vec!["main".to_string()]);
        assert_eq!(log.column("reward"), Some(&[0.5][..]));
        assert_eq!(log.column("rewards/win/std"), Some(&[0.5][..]));
        assert_eq!(log.column("seconds"), Some(&[7.0][..]));
        assert!(log.column("loss").unwrap()[0].is_nan());
        assert_eq!(log.component_names(), vec!["win".to_string()]);
    }

    #[test]
    fn csv_by_header_name_with_nan_and_empty() {
        let text = "stage,step,env,reward,rewards/format/mean,rewards/format/std,kl,skipped\n\
                    main,1,tm,0.5,1,0,,0\r\n\
                    main,2,tm,nan,0.5,0.1,0.01,1\n\
                    \n\
                    dumb,3,tm,-1.25,,,inf,0\n";
        let log = TrainingLog::parse(text).unwrap();
        assert_eq!(log.len(), 3);
        assert_eq!(log.steps, vec![1.0, 2.0, 3.0]);
        assert_eq!(log.stages, vec!["main", "main", "dumb"]);
        assert_eq!(log.envs, vec!["tm", "tm", "tm"]);
        let r = log.column("reward").unwrap();
        assert_eq!(r[0], 0.5);
        assert!(r[1].is_nan());
        assert_eq!(r[2], -1.25);
        let kl = log.column("kl").unwrap();
        assert!(kl[0].is_nan() && kl[2].is_nan());
        assert_eq!(kl[1], 0.01);
        let f = log.column("rewards/format/mean").unwrap();
        assert_eq!(f[..2], [1.0, 0.5]);
        assert!(f[2].is_nan());
        assert_eq!(log.component_names(), vec!["format"]);
        assert_eq!(log.skipped(), vec![false, true, false]);
        assert!(log.column("stage").is_none());
        assert!(log.column("nope").is_none());
    }

    #[test]
    fn csv_errors_are_clear() {
        let e = TrainingLog::parse("").unwrap_err();
        assert!(format!("{e:#}").contains("empty"));
        let e = TrainingLog::parse("reward\n1\n").unwrap_err();
        assert!(format!("{e:#}").contains("`step`"));
        let e = TrainingLog::parse("step,reward\n1,2\nx,3\n").unwrap_err();
        assert!(format!("{e:#}").contains("line 3"), "{e:#}");
        let e = TrainingLog::parse("step,reward\n1,2,3\n").unwrap_err();
        assert!(format!("{e:#}").contains("line 2: 3 fields"), "{e:#}");
    }

    #[test]
    fn csv_quoted_fields() {
        assert_eq!(
            split_csv_line(r#"1,"a,b","say ""hi""",,x"#),
            vec!["1", "a,b", r#"say "hi""#, "", "x"]
        );
    }
}

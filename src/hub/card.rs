//! The model card (`README.md`) generated for an exported run: the base model, the
//! training recipe from config.toml, the final training-log numbers and, when present,
//! the before/after table of eval.json.
use std::fmt::Write;

use super::*;
use crate::run::eval_report::EnvEval;

/// `read(path)` when the file exists; a warning naming what the card then lacks when it
/// cannot be read.
fn read_if_present<T>(path: &Path, lacks: &str, read: impl Fn(&Path) -> Result<T>) -> Option<T> {
    if !path.is_file() {
        return None;
    }
    read(path)
        .map_err(|e| crate::note!("warning: {e:#}; the model card has no {lacks}"))
        .ok()
}

/// A finite value, or None (NaN and infinities print as "–" or not at all).
fn finite(v: f64) -> Option<f64> {
    v.is_finite().then_some(v)
}

fn fmt_num(v: f64) -> String {
    if v == 0.0 {
        "0".into()
    } else if v.fract() == 0.0 && v.abs() < 1e9 {
        format!("{v:.0}")
    } else if v.abs() >= 0.001 && v.abs() < 1e5 {
        let s = format!("{v:.4}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        format!("{v:.3e}")
    }
}

fn toml_str(v: &toml::Value) -> String {
    match v {
        toml::Value::String(s) => s.clone(),
        toml::Value::Float(f) => fmt_num(*f),
        toml::Value::Array(a) => a.iter().map(toml_str).collect::<Vec<_>>().join(", "),
        other => other.to_string(),
    }
}

fn get<'t>(t: &'t toml::Table, path: &[&str]) -> Option<&'t toml::Value> {
    let (last, head) = path.split_last()?;
    let mut cur = t;
    for k in head {
        cur = cur.get(*k)?.as_table()?;
    }
    cur.get(*last)
}

/// A Hub model id usable as `base_model` metadata: `namespace/name`, no revision.
pub(super) fn hub_model_id(name: &str) -> Option<String> {
    let id = name.split('@').next().unwrap_or(name);
    validate_repo_id(id).ok()?;
    Some(id.to_string())
}

/// Markdown table cell text (no pipes or newlines).
fn cell(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

/// A path as a public card may show it: an absolute one (a local model or config, which
/// names the machine's directories) becomes its file name; Hub ids and relative paths
/// stay as they are.
fn public_path(p: &str) -> String {
    let path = Path::new(p);
    if !(path.is_absolute() || p.starts_with('~')) {
        return p.to_string();
    }
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| p.to_string())
}

/// `k = v, k = v` for a TOML table, in the table's order.
fn key_values(t: &toml::Table) -> String {
    t.iter()
        .map(|(k, v)| format!("{k} = {}", toml_str(v)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Where the run started when not from a fresh LoRA: `model.adapter`, and the `[sft]`
/// warm start that produced it (empty otherwise).
fn start_section(c: &toml::Table) -> String {
    let Some(adapter) = get(c, &["model", "adapter"]).and_then(|v| v.as_str()) else {
        return String::new();
    };
    let adapter = public_path(adapter);
    let mut s = format!(
        "## Starting point\n\nGRPO started from the LoRA adapter `{adapter}` rather than a \
         fresh one"
    );
    let warm = get(c, &["sft", "warm_start"]).and_then(|v| v.as_bool()) == Some(true);
    if warm {
        let kv: Vec<String> = [
            "source",
            "env",
            "policy",
            "path",
            "examples",
            "min_reward",
            "steps",
        ]
        .iter()
        .filter_map(|k| get(c, &["sft", k]).map(|v| format!("{k} = {}", toml_str(v))))
        .collect();
        s.push_str(&format!(
            ": a supervised warm start (`concord sft`, completion-only loss) on \
             demonstrations ({}) run by the same `concord train`",
            kv.join(", ")
        ));
    }
    s.push_str(".\n\n");
    s
}

/// The model card (`README.md`) for a run: YAML metadata, what the adapter is, the
/// training configuration, final metrics, the eval table, the plots and how to load it.
pub fn model_card(run_dir: &Path, repo: &str) -> Result<String> {
    let adapter = read_adapter_config(run_dir)?;
    let config = read_config(run_dir)?;
    // Both files are uploaded as they are; only the card needs them understood.
    let log = read_if_present(&run_dir.join("training_log.csv"), "final metrics", |p| {
        TrainingLog::read(p)
    });
    let eval = read_if_present(&run_dir.join("eval.json"), "eval table", |p| {
        EvalReport::read(p)
    });

    let base = public_path(&base_model(&adapter, config.as_ref()));
    let base_id = hub_model_id(&base);
    let stages = curriculum_stages(config.as_ref());
    let envs = env_names(config.as_ref(), &stages, log.as_ref());
    let title = repo.rsplit('/').next().unwrap_or(repo);

    let mut md = front_matter(base_id.as_deref(), &envs);
    md.push_str(&overview(title, &base, base_id.as_deref(), &envs));
    if let Some(c) = &config {
        md.push_str(&start_section(c));
        md.push_str(&config_section(c, &stages));
    }
    if let Some(log) = log.as_ref().filter(|l| !l.is_empty()) {
        md.push_str(&metrics_section(log));
    }
    if let Some(ev) = eval.as_ref().filter(|e| !e.models.is_empty()) {
        md.push_str(&eval_section(ev));
    }
    md.push_str(&plots_section(run_dir));
    let base_q = base_id.as_deref().unwrap_or(&base);
    md.push_str(&usage_section(repo, title, base_q));
    Ok(md)
}

fn read_adapter_config(run_dir: &Path) -> Result<Value> {
    let path = run_dir.join("adapter_config.json");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
}

/// The run's config.toml; None when the run directory has none, an error when it has
/// one that cannot be read or parsed.
fn read_config(run_dir: &Path) -> Result<Option<toml::Table>> {
    let path = run_dir.join("config.toml");
    if !path.is_file() {
        return Ok(None);
    }
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let table = text
        .parse::<toml::Table>()
        .with_context(|| format!("parsing {}", path.display()))?;
    Ok(Some(table))
}

/// The base model as the adapter records it, else as the config names it.
fn base_model(adapter: &Value, config: Option<&toml::Table>) -> String {
    adapter
        .get("base_model_name_or_path")
        .and_then(Value::as_str)
        .or_else(|| {
            config
                .and_then(|c| get(c, &["model", "name"]))
                .and_then(|v| v.as_str())
        })
        .unwrap_or("unknown")
        .to_string()
}

/// The `[[stage]]` tables of a curriculum config (empty for a single-stage run).
fn curriculum_stages(config: Option<&toml::Table>) -> Vec<&toml::Table> {
    config
        .and_then(|c| c.get("stage"))
        .and_then(|s| s.as_array())
        .map(|a| a.iter().filter_map(|v| v.as_table()).collect())
        .unwrap_or_default()
}

/// The environments the run trained on, first seen first: `[env]`, the `[[stage]]`
/// mixtures, then the log's env column (which still names them when config.toml is
/// missing).
fn env_names(
    config: Option<&toml::Table>,
    stages: &[&toml::Table],
    log: Option<&TrainingLog>,
) -> Vec<String> {
    let from_env = config
        .and_then(|c| get(c, &["env", "name"]))
        .and_then(|v| v.as_str());
    let from_stages = stages
        .iter()
        .filter_map(|s| s.get("envs").and_then(|v| v.as_table()))
        .flat_map(|mixture| mixture.keys().map(String::as_str));
    let from_log = log
        .into_iter()
        .flat_map(|l| l.envs.iter().map(String::as_str));
    let mut envs: Vec<String> = Vec::new();
    for e in from_env.into_iter().chain(from_stages).chain(from_log) {
        let e = e.trim();
        if !e.is_empty() && !envs.iter().any(|x| x == e) {
            envs.push(e.to_string());
        }
    }
    envs
}

/// The YAML metadata the Hub indexes. Environment names become tags only when they are
/// plain words, so that none needs YAML quoting.
fn front_matter(base_id: Option<&str>, envs: &[String]) -> String {
    let mut md = String::from("---\n");
    if let Some(id) = base_id {
        let _ = writeln!(md, "base_model: {id}");
    }
    md.push_str("library_name: peft\ntags:\n- concord\n- grpo\n- lora\n");
    let plain = |e: &&String| {
        e.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_'))
    };
    for e in envs.iter().filter(plain) {
        let _ = writeln!(md, "- {e}");
    }
    md.push_str("---\n\n");
    md
}

/// The title, the one-paragraph summary and the base model section. The base model
/// links to its Hub page only when it is a Hub id; a local model is named as it is.
fn overview(title: &str, base: &str, base_id: Option<&str>, envs: &[String]) -> String {
    let base_link = match base_id {
        Some(id) => format!("[`{id}`](https://huggingface.co/{id})"),
        None => format!("`{base}`"),
    };
    let mut md = String::new();
    let _ = writeln!(md, "# {title}\n");
    let _ = writeln!(
        md,
        "A LoRA adapter for {base_link}, trained with GRPO (group relative policy \
         optimization) by Concord, a pure-Rust GRPO trainer, on {}.\n",
        trained_on(envs)
    );
    let _ = writeln!(md, "## Base model\n\n{base_link}\n");
    md
}

/// What the summary says the adapter was trained on: the named environments, or a
/// generic phrase when the run records none.
fn trained_on(envs: &[String]) -> String {
    if envs.is_empty() {
        return "multi-agent coordination environments".to_string();
    }
    let list = envs
        .iter()
        .map(|e| format!("`{e}`"))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "the {list} environment{}",
        if envs.len() > 1 { "s" } else { "" }
    )
}

/// The settings the configuration table shows, by config.toml key; the rest is in the
/// uploaded config.toml, which the section links to.
const CONFIG_ROWS: [(&str, &[&str]); 13] = [
    ("LoRA r", &["lora", "r"]),
    ("LoRA alpha", &["lora", "alpha"]),
    ("LoRA targets", &["lora", "targets"]),
    ("GRPO num_generations", &["grpo", "num_generations"]),
    ("GRPO prompts_per_step", &["grpo", "prompts_per_step"]),
    ("GRPO temperature", &["grpo", "temperature"]),
    ("GRPO loss_type", &["grpo", "loss_type"]),
    ("GRPO beta (KL)", &["grpo", "beta"]),
    ("max completion length", &["grpo", "max_completion_length"]),
    ("learning rate", &["optim", "learning_rate"]),
    ("schedule", &["optim", "schedule"]),
    ("steps", &["run", "steps"]),
    ("seed", &["run", "seed"]),
];

/// The training configuration table (only the settings the config sets) and, for a
/// curriculum, its stages.
fn config_section(c: &toml::Table, stages: &[&toml::Table]) -> String {
    let mut md = String::from("## Training configuration\n\n| setting | value |\n|---|---|\n");
    for (label, path) in CONFIG_ROWS {
        if let Some(v) = get(c, path) {
            let _ = writeln!(md, "| {label} | {} |", cell(&toml_str(v)));
        }
    }
    if let Some(env) = env_setting(c) {
        let _ = writeln!(md, "| environment | {} |", cell(&env));
    }
    md.push('\n');
    md.push_str(&curriculum_table(stages));
    md.push_str("The full configuration is in [`config.toml`](config.toml).\n\n");
    md
}

/// `env.name` followed by its `env.options`, if any: `ticketmelt (players = 3)`.
fn env_setting(c: &toml::Table) -> Option<String> {
    let name = get(c, &["env", "name"])?;
    let opts = get(c, &["env", "options"])
        .and_then(|o| o.as_table())
        .filter(|t| !t.is_empty())
        .map(|t| format!(" ({})", key_values(t)))
        .unwrap_or_default();
    Some(format!("{}{opts}", toml_str(name)))
}

/// One table row per `[[stage]]` (empty without a curriculum).
fn curriculum_table(stages: &[&toml::Table]) -> String {
    if stages.is_empty() {
        return String::new();
    }
    let mut md = String::from("Curriculum stages:\n\n| # | stage |\n|---|---|\n");
    for (i, s) in stages.iter().enumerate() {
        let _ = writeln!(md, "| {} | {} |", i + 1, cell(&stage_summary(s)));
    }
    md.push('\n');
    md
}

/// A stage on one line, its env mixture (an inline table) included:
/// `name = a; steps = 2; envs: ticketmelt = 1`.
fn stage_summary(s: &toml::Table) -> String {
    s.iter()
        .map(|(k, v)| match v {
            toml::Value::Table(t) => format!("{k}: {}", key_values(t)),
            _ => format!("{k} = {}", toml_str(v)),
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// The last logged value of each headline metric (and of each reward component), with
/// the reward also averaged over the last steps because one step's reward is noisy.
fn metrics_section(log: &TrainingLog) -> String {
    let last = |name: &str| {
        log.column(name)
            .and_then(|c| c.last().copied())
            .and_then(finite)
    };
    let step = log.steps.last().map_or("?".to_string(), |s| fmt_num(*s));
    let mut md = String::new();
    let _ = writeln!(
        md,
        "## Final metrics (step {step})\n\n| metric | value |\n|---|---|"
    );
    metric_row(&mut md, "reward", last("reward"));
    if let Some((n, mean)) = recent_reward_mean(log) {
        let label = format!("reward, mean of the last {n} steps");
        metric_row(&mut md, &label, Some(mean));
    }
    for k in ["kl", "entropy", "grad_norm"] {
        metric_row(&mut md, k, last(k));
    }
    for h in &log.header {
        if h.starts_with("rewards/") && h.ends_with("/mean") {
            metric_row(&mut md, h, last(h));
        }
    }
    md.push_str("\nPer-step metrics are in [`training_log.csv`](training_log.csv).\n\n");
    md
}

/// A metrics table row; none for a metric the log lacks or never got a finite value.
fn metric_row(md: &mut String, label: &str, v: Option<f64>) {
    if let Some(v) = v {
        let _ = writeln!(md, "| {} | {} |", cell(label), fmt_num(v));
    }
}

/// The mean of the finite rewards among the last 10 steps, and how many there were.
fn recent_reward_mean(log: &TrainingLog) -> Option<(usize, f64)> {
    let rewards = log.column("reward").unwrap_or_default();
    let vals: Vec<f64> = rewards[rewards.len().saturating_sub(10)..]
        .iter()
        .copied()
        .filter_map(finite)
        .collect();
    if vals.is_empty() {
        return None;
    }
    Some((vals.len(), vals.iter().sum::<f64>() / vals.len() as f64))
}

/// How `concord eval` ran, then one row per environment and model; with both a base
/// and an adapter, the adapter's rows also show its change over the base.
fn eval_section(ev: &EvalReport) -> String {
    let decoding = if ev.greedy {
        "greedy decoding"
    } else {
        "sampled decoding"
    };
    let facts = [
        format!("config `{}`", public_path(&ev.config)),
        format!("{} episodes per environment", ev.episodes),
        decoding.to_string(),
        format!("seeds from {}", ev.first_seed),
    ];
    let mut md = format!("## Evaluation\n\n`concord eval`: {}.\n\n", facts.join(", "));
    let base = ev.models.get("base");
    let both = base.is_some() && ev.models.contains_key("adapter");
    md.push_str(&eval_table_head(both));
    let models = models_in_order(ev);
    for env in eval_env_names(ev) {
        for (name, m) in &models {
            let Some(r) = m.envs.get(env) else { continue };
            md.push_str(&eval_row(env, name, r));
            if both {
                md.push_str(&delta_cells(name, r, base.and_then(|b| b.envs.get(env))));
            }
            md.push('\n');
        }
    }
    md.push('\n');
    md
}

fn eval_table_head(with_deltas: bool) -> String {
    let mut md = String::from(
        "| env | model | episodes | reward (95% CI) | win rate (95% CI) | components |",
    );
    if with_deltas {
        md.push_str(" Δ reward | Δ win rate |");
    }
    md.push_str("\n|---|---|---|---|---|---|");
    if with_deltas {
        md.push_str("---|---|");
    }
    md.push('\n');
    md
}

/// Known models first (base, adapter), then any others by name.
fn models_in_order(ev: &EvalReport) -> Vec<(&String, &ModelEval)> {
    let mut order: Vec<(&String, &ModelEval)> = ev.models.iter().collect();
    order.sort_by_key(|(k, _)| match k.as_str() {
        "base" => 0,
        "adapter" => 1,
        _ => 2,
    });
    order
}

/// Every environment any model was evaluated on, first seen first (models by name).
fn eval_env_names(ev: &EvalReport) -> Vec<&str> {
    let mut names: Vec<&str> = Vec::new();
    for e in ev.models.values().flat_map(|m| m.envs.keys()) {
        if !names.contains(&e.as_str()) {
            names.push(e);
        }
    }
    names
}

/// An eval table row up to the components column (no delta cells, no newline).
fn eval_row(env: &str, model: &str, r: &EnvEval) -> String {
    let comps = r
        .components
        .iter()
        .map(|(k, v)| match finite(*v) {
            Some(v) => format!("{k} {}", fmt_num(v)),
            None => format!("{k} –"),
        })
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "| {} | {} | {} | {} | {} | {} |",
        cell(env),
        cell(model),
        r.episodes,
        with_ci(r.reward_mean, r.reward_ci95),
        with_ci(r.win_rate, r.win_ci95),
        cell(&comps)
    )
}

/// The adapter's change over the base on the same environment; blank cells for every
/// other row, and where the base was not evaluated on that environment.
fn delta_cells(model: &str, r: &EnvEval, base: Option<&EnvEval>) -> String {
    match base {
        Some(b) if model == "adapter" => format!(
            " {} | {} |",
            delta(r.reward_mean, b.reward_mean),
            delta(r.win_rate, b.win_rate)
        ),
        _ => "  |  |".to_string(),
    }
}

/// `v [lo, hi]`; just `v` when the interval is undefined, `–` when `v` is.
fn with_ci(v: f64, [lo, hi]: [f64; 2]) -> String {
    match (finite(v), finite(lo), finite(hi)) {
        (Some(v), Some(lo), Some(hi)) => {
            format!("{} [{}, {}]", fmt_num(v), fmt_num(lo), fmt_num(hi))
        }
        (Some(v), _, _) => fmt_num(v),
        _ => "–".to_string(),
    }
}

fn delta(a: f64, b: f64) -> String {
    match (finite(a), finite(b)) {
        (Some(a), Some(b)) => format!("{:+.4}", a - b),
        _ => "–".to_string(),
    }
}

/// The plots `concord plot` left in the run directory (each is optional).
fn plots_section(run_dir: &Path) -> String {
    let plots: Vec<(&str, &str)> = [
        ("reward_curve.png", "Reward curve"),
        ("components.png", "Reward components"),
        ("before_after.png", "Before and after training"),
    ]
    .into_iter()
    .filter(|(f, _)| run_dir.join(f).is_file())
    .collect();
    if plots.is_empty() {
        return String::new();
    }
    let mut md = String::from("## Plots\n\n");
    for (f, alt) in plots {
        let _ = writeln!(md, "![{alt}]({f})\n");
    }
    md
}

/// Loading the adapter with peft and with Concord. `base` is what `from_pretrained` and
/// `--model` accept: the Hub id when there is one.
fn usage_section(repo: &str, title: &str, base: &str) -> String {
    let mut md = String::new();
    let _ = writeln!(
        md,
        "## How to use\n\n### With peft\n\n```python\nfrom peft import PeftModel\n\
         from transformers import AutoModelForCausalLM, AutoTokenizer\n\n\
         base = AutoModelForCausalLM.from_pretrained(\"{base}\")\n\
         tokenizer = AutoTokenizer.from_pretrained(\"{base}\")\n\
         model = PeftModel.from_pretrained(base, \"{repo}\")\n```\n"
    );
    let local = format!("adapters/{title}");
    let _ = writeln!(
        md,
        "### With Concord\n\n```bash\nhuggingface-cli download {repo} --local-dir {local}\n\
         concord generate --model {base} --adapter {local} --messages chat.json \
         --max-new-tokens 256\n```\n\n`chat.json` holds one conversation: a JSON list of \
         `{{\"role\", \"content\"}}` messages."
    );
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A two-stage run with a training log and a base/adapter eval report.
    fn write_example_run(d: &Path) {
        std::fs::write(
            d.join("adapter_config.json"),
            r#"{"base_model_name_or_path":"Qwen/Qwen2.5-0.5B-Instruct","r":8}"#,
        )
        .unwrap();
        std::fs::write(
            d.join("config.toml"),
            "[run]\nsteps = 3\n[lora]\nr = 8\nalpha = 16.0\ntargets = [\"q_proj\"]\n\
             [grpo]\nnum_generations = 4\nloss_type = \"dapo\"\n[optim]\nlearning_rate = 1e-5\n\
             [[stage]]\nname = \"a\"\nsteps = 2\nenvs = { ticketmelt = 1.0 }\n\
             [[stage]]\nname = \"b\"\nenvs = { merge_ring = 1.0 }\n",
        )
        .unwrap();
        std::fs::write(
            d.join("training_log.csv"),
            "step,stage,env,reward,rewards/win/mean,kl,entropy,grad_norm\n\
             1,a,ticketmelt,0.1,0.5,nan,,1\n2,b,merge_ring,0.3,0.25,0.01,1.5,2\n",
        )
        .unwrap();
        std::fs::write(
            d.join("eval.json"),
            r#"{"config":"c.toml","episodes":64,"greedy":true,"first_seed":0,"models":{
              "base":{"adapter":null,"envs":{"ticketmelt":{"episodes":64,"seats":64,"reward_mean":0.41,
                "reward_ci95":[0.37,0.45],"win_rate":0.35,"win_ci95":[0.29,0.42],"components":{"r1_own":0.8}}}},
              "adapter":{"adapter":"runs/x","envs":{"ticketmelt":{"episodes":64,"seats":64,"reward_mean":0.5,
                "reward_ci95":[0.45,0.55],"win_rate":0.5,"win_ci95":[0.4,0.6],"components":{"r1_own":0.9}}}}}}"#,
        )
        .unwrap();
    }

    #[test]
    fn hub_model_card_eval_table() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        write_example_run(d);
        let card = model_card(d, "me/my-adapter").unwrap();
        assert!(
            card.starts_with("---\nbase_model: Qwen/Qwen2.5-0.5B-Instruct\nlibrary_name: peft\n")
        );
        assert!(card.contains("- ticketmelt\n- merge_ring\n"), "{card}");
        assert!(card.contains("| reward | 0.3 |"), "{card}");
        assert!(
            card.contains("| reward, mean of the last 2 steps | 0.2 |"),
            "{card}"
        );
        assert!(card.contains("| rewards/win/mean | 0.25 |"), "{card}");
        assert!(card.contains("| ticketmelt | adapter | 64 | 0.5 [0.45, 0.55] | 0.5 [0.4, 0.6] | r1_own 0.9 | +0.0900 | +0.1500 |"), "{card}");
        assert!(card.contains("Curriculum stages"), "{card}");
        assert!(card.contains("PeftModel.from_pretrained(base, \"me/my-adapter\")"));
        assert!(card.contains("concord generate --model Qwen/Qwen2.5-0.5B-Instruct --adapter"));

        // undefined values (no scored seats: NaN, written as null) print as dashes
        std::fs::write(
            d.join("eval.json"),
            r#"{"config":"c.toml","episodes":0,"greedy":true,"first_seed":0,"models":{
              "base":{"adapter":null,"envs":{"ticketmelt":{"episodes":0,"seats":0,"reward_mean":null,
                "reward_ci95":[null,null],"win_rate":null,"win_ci95":[0.0,1.0],"components":{"win":null}}}}}}"#,
        )
        .unwrap();
        let card = model_card(d, "me/my-adapter").unwrap();
        assert!(
            card.contains("| ticketmelt | base | 0 | – | – | win – |"),
            "{card}"
        );

        // Issue #31, item 24: a local base, start adapter and config are named, not the
        // machine's directories.
        let secret = d.join("home/alice/models");
        let adapter_json = json!({ "base_model_name_or_path": secret.join("q.gguf"), "r": 8 });
        std::fs::write(d.join("adapter_config.json"), adapter_json.to_string()).unwrap();
        let config = format!(
            "[model]\nadapter = \"{}\"\n[env]\nname = \"ticketmelt\"\n",
            secret.join("start").display()
        );
        std::fs::write(d.join("config.toml"), config).unwrap();
        let report = std::fs::read_to_string(d.join("eval.json")).unwrap();
        let cfg_path = secret.join("c.toml").display().to_string();
        let report = report.replace("\"c.toml\"", &serde_json::to_string(&cfg_path).unwrap());
        std::fs::write(d.join("eval.json"), report).unwrap();
        let card = model_card(d, "me/my-adapter").unwrap();
        assert!(!card.contains("alice"), "{card}");
        assert!(
            card.contains("base_model: q.gguf") || card.contains("`q.gguf`"),
            "{card}"
        );
        assert!(
            card.contains("`start`") && card.contains("config `c.toml`"),
            "{card}"
        );
    }
}

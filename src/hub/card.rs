//! The model card (`README.md`) generated for an exported run: the base model, the
//! training recipe from config.toml, the final training-log numbers and, when present,
//! the before/after table of eval.json.
use super::*;

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

/// The model card (`README.md`) for a run: YAML metadata, what the adapter is, the
/// training configuration, final metrics, the eval table, the plots and how to load it.
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

pub fn model_card(run_dir: &Path, repo: &str) -> Result<String> {
    use std::fmt::Write;

    let adapter_path = run_dir.join("adapter_config.json");
    let adapter: Value = serde_json::from_str(
        &std::fs::read_to_string(&adapter_path)
            .with_context(|| format!("reading {}", adapter_path.display()))?,
    )
    .with_context(|| format!("parsing {}", adapter_path.display()))?;
    let config_path = run_dir.join("config.toml");
    let config: Option<toml::Table> = if config_path.is_file() {
        let text = std::fs::read_to_string(&config_path)
            .with_context(|| format!("reading {}", config_path.display()))?;
        Some(
            text.parse::<toml::Table>()
                .with_context(|| format!("parsing {}", config_path.display()))?,
        )
    } else {
        None
    };
    // Both files are uploaded as they are; only the card needs them understood.
    let log = read_if_present(&run_dir.join("training_log.csv"), "final metrics", |p| {
        TrainingLog::read(p)
    });
    let eval = read_if_present(&run_dir.join("eval.json"), "eval table", |p| {
        EvalReport::read(p)
    });

    let base = adapter
        .get("base_model_name_or_path")
        .and_then(Value::as_str)
        .map(str::to_string)
        .or_else(|| {
            config
                .as_ref()
                .and_then(|c| get(c, &["model", "name"]))
                .and_then(|v| v.as_str())
                .map(str::to_string)
        })
        .unwrap_or_else(|| "unknown".to_string());
    let base = public_path(&base);
    let base_id = hub_model_id(&base);

    // Environment names: [env], [[stage]] tables, the log's env column.
    let mut envs: Vec<String> = Vec::new();
    let mut add_env = |e: &str| {
        let e = e.trim();
        if !e.is_empty() && !envs.iter().any(|x| x == e) {
            envs.push(e.to_string());
        }
    };
    let stages: Vec<toml::Table> = config
        .as_ref()
        .and_then(|c| c.get("stage"))
        .and_then(|s| s.as_array())
        .map(|a| a.iter().filter_map(|v| v.as_table().cloned()).collect())
        .unwrap_or_default();
    if let Some(c) = &config {
        if let Some(e) = get(c, &["env", "name"]).and_then(|v| v.as_str()) {
            add_env(e);
        }
    }
    for s in &stages {
        if let Some(mixture) = s.get("envs").and_then(|v| v.as_table()) {
            mixture.keys().for_each(|e| add_env(e));
        }
    }
    if let Some(log) = &log {
        log.envs.iter().for_each(|e| add_env(e));
    }

    let mut md = String::new();
    // Front matter.
    md.push_str("---\n");
    if let Some(id) = &base_id {
        let _ = writeln!(md, "base_model: {id}");
    }
    md.push_str("library_name: peft\ntags:\n- concord\n- grpo\n- lora\n");
    for e in &envs {
        if e.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_'))
        {
            let _ = writeln!(md, "- {e}");
        }
    }
    md.push_str("---\n\n");

    let title = repo.rsplit('/').next().unwrap_or(repo);
    let _ = writeln!(md, "# {title}\n");
    let env_text = if envs.is_empty() {
        "multi-agent coordination environments".to_string()
    } else {
        let list = envs
            .iter()
            .map(|e| format!("`{e}`"))
            .collect::<Vec<_>>()
            .join(", ");
        format!(
            "the {list} environment{}",
            if envs.len() > 1 { "s" } else { "" }
        )
    };
    let base_link = match &base_id {
        Some(id) => format!("[`{id}`](https://huggingface.co/{id})"),
        None => format!("`{base}`"),
    };
    let _ = writeln!(
        md,
        "A LoRA adapter for {base_link}, trained with GRPO (group relative policy \
         optimization) by Concord, a pure-Rust GRPO trainer, on {env_text}.\n"
    );

    let _ = writeln!(md, "## Base model\n\n{base_link}\n");
    if let Some(c) = &config {
        md.push_str(&start_section(c));
    }

    // Configuration.
    if let Some(c) = &config {
        md.push_str("## Training configuration\n\n| setting | value |\n|---|---|\n");
        let row = |md: &mut String, k: &str, path: &[&str]| {
            if let Some(v) = get(c, path) {
                let _ = writeln!(md, "| {k} | {} |", cell(&toml_str(v)));
            }
        };
        row(&mut md, "LoRA r", &["lora", "r"]);
        row(&mut md, "LoRA alpha", &["lora", "alpha"]);
        row(&mut md, "LoRA targets", &["lora", "targets"]);
        row(
            &mut md,
            "GRPO num_generations",
            &["grpo", "num_generations"],
        );
        row(
            &mut md,
            "GRPO prompts_per_step",
            &["grpo", "prompts_per_step"],
        );
        row(&mut md, "GRPO temperature", &["grpo", "temperature"]);
        row(&mut md, "GRPO loss_type", &["grpo", "loss_type"]);
        row(&mut md, "GRPO beta (KL)", &["grpo", "beta"]);
        row(
            &mut md,
            "max completion length",
            &["grpo", "max_completion_length"],
        );
        row(&mut md, "learning rate", &["optim", "learning_rate"]);
        row(&mut md, "schedule", &["optim", "schedule"]);
        row(&mut md, "steps", &["run", "steps"]);
        row(&mut md, "seed", &["run", "seed"]);
        if let Some(e) = get(c, &["env", "name"]) {
            let opts = get(c, &["env", "options"])
                .and_then(|o| o.as_table())
                .filter(|t| !t.is_empty())
                .map(|t| {
                    let kv: Vec<String> = t
                        .iter()
                        .map(|(k, v)| format!("{k} = {}", toml_str(v)))
                        .collect();
                    format!(" ({})", kv.join(", "))
                })
                .unwrap_or_default();
            let _ = writeln!(
                md,
                "| environment | {} |",
                cell(&format!("{}{opts}", toml_str(e)))
            );
        }
        md.push('\n');
        if !stages.is_empty() {
            md.push_str("Curriculum stages:\n\n| # | stage |\n|---|---|\n");
            for (i, s) in stages.iter().enumerate() {
                let kv: Vec<String> = s
                    .iter()
                    .map(|(k, v)| match v {
                        toml::Value::Table(t) => {
                            let inner: Vec<String> = t
                                .iter()
                                .map(|(k2, v2)| format!("{k2} = {}", toml_str(v2)))
                                .collect();
                            format!("{k}: {}", inner.join(", "))
                        }
                        _ => format!("{k} = {}", toml_str(v)),
                    })
                    .collect();
                let _ = writeln!(md, "| {} | {} |", i + 1, cell(&kv.join("; ")));
            }
            md.push('\n');
        }
        md.push_str("The full configuration is in [`config.toml`](config.toml).\n\n");
    }

    // Final metrics.
    if let Some(log) = log.as_ref().filter(|l| !l.is_empty()) {
        let last = |name: &str| {
            log.column(name)
                .and_then(|c| c.last().copied())
                .and_then(finite)
        };
        let step = log.steps.last().map_or("?".to_string(), |s| fmt_num(*s));
        let _ = writeln!(
            md,
            "## Final metrics (step {step})\n\n| metric | value |\n|---|---|"
        );
        let metric = |md: &mut String, label: &str, v: Option<f64>| {
            if let Some(v) = v {
                let _ = writeln!(md, "| {} | {} |", cell(label), fmt_num(v));
            }
        };
        metric(&mut md, "reward", last("reward"));
        let rewards = log.column("reward").unwrap_or_default();
        let vals: Vec<f64> = rewards[rewards.len().saturating_sub(10)..]
            .iter()
            .copied()
            .filter_map(finite)
            .collect();
        if !vals.is_empty() {
            let mean = vals.iter().sum::<f64>() / vals.len() as f64;
            metric(
                &mut md,
                &format!("reward, mean of the last {} steps", vals.len()),
                Some(mean),
            );
        }
        for k in ["kl", "entropy", "grad_norm"] {
            metric(&mut md, k, last(k));
        }
        for h in &log.header {
            if h.starts_with("rewards/") && h.ends_with("/mean") {
                metric(&mut md, h, last(h));
            }
        }
        md.push_str("\nPer-step metrics are in [`training_log.csv`](training_log.csv).\n\n");
    }

    // Evaluation.
    if let Some(ev) = eval.as_ref().filter(|e| !e.models.is_empty()) {
        md.push_str("## Evaluation\n\n");
        let facts = [
            format!("config `{}`", public_path(&ev.config)),
            format!("{} episodes per environment", ev.episodes),
            if ev.greedy {
                "greedy decoding"
            } else {
                "sampled decoding"
            }
            .to_string(),
            format!("seeds from {}", ev.first_seed),
        ];
        let _ = writeln!(md, "`concord eval`: {}.\n", facts.join(", "));
        let base_m = ev.models.get("base");
        let adapter_m = ev.models.get("adapter");
        let both = base_m.is_some() && adapter_m.is_some();
        let mut env_names: Vec<&String> = Vec::new();
        for m in ev.models.values() {
            for e in m.envs.keys() {
                if !env_names.contains(&e) {
                    env_names.push(e);
                }
            }
        }
        md.push_str(
            "| env | model | episodes | reward (95% CI) | win rate (95% CI) | components |",
        );
        if both {
            md.push_str(" Δ reward | Δ win rate |");
        }
        md.push_str("\n|---|---|---|---|---|---|");
        if both {
            md.push_str("---|---|");
        }
        md.push('\n');
        let with_ci = |v: f64, [lo, hi]: [f64; 2]| match (finite(v), finite(lo), finite(hi)) {
            (Some(v), Some(lo), Some(hi)) => {
                format!("{} [{}, {}]", fmt_num(v), fmt_num(lo), fmt_num(hi))
            }
            (Some(v), _, _) => fmt_num(v),
            _ => "–".to_string(),
        };
        let delta = |a: f64, b: f64| match (finite(a), finite(b)) {
            (Some(a), Some(b)) => format!("{:+.4}", a - b),
            _ => "–".to_string(),
        };
        // Known models first (base, adapter), then any others by name.
        let mut order: Vec<(&String, &ModelEval)> = ev.models.iter().collect();
        order.sort_by_key(|(k, _)| match k.as_str() {
            "base" => 0,
            "adapter" => 1,
            _ => 2,
        });
        for env in &env_names {
            for (mname, m) in &order {
                let Some(r) = m.envs.get(*env) else { continue };
                let comps = r
                    .components
                    .iter()
                    .map(|(k, v)| match finite(*v) {
                        Some(v) => format!("{k} {}", fmt_num(v)),
                        None => format!("{k} –"),
                    })
                    .collect::<Vec<_>>()
                    .join(", ");
                let _ = write!(
                    md,
                    "| {} | {} | {} | {} | {} | {} |",
                    cell(env),
                    cell(mname),
                    r.episodes,
                    with_ci(r.reward_mean, r.reward_ci95),
                    with_ci(r.win_rate, r.win_ci95),
                    cell(&comps)
                );
                if both {
                    let b = base_m.and_then(|b| b.envs.get(*env));
                    if mname.as_str() == "adapter" && b.is_some() {
                        let b = b.map_or((f64::NAN, f64::NAN), |b| (b.reward_mean, b.win_rate));
                        let _ = write!(
                            md,
                            " {} | {} |",
                            delta(r.reward_mean, b.0),
                            delta(r.win_rate, b.1)
                        );
                    } else {
                        md.push_str("  |  |");
                    }
                }
                md.push('\n');
            }
        }
        md.push('\n');
    }

    // Plots.
    let plots: Vec<(&str, &str)> = [
        ("reward_curve.png", "Reward curve"),
        ("components.png", "Reward components"),
        ("before_after.png", "Before and after training"),
    ]
    .into_iter()
    .filter(|(f, _)| run_dir.join(f).is_file())
    .collect();
    if !plots.is_empty() {
        md.push_str("## Plots\n\n");
        for (f, alt) in plots {
            let _ = writeln!(md, "![{alt}]({f})\n");
        }
    }

    // Usage.
    let base_q = base_id.clone().unwrap_or_else(|| base.clone());
    let _ = writeln!(
        md,
        "## How to use\n\n### With peft\n\n```python\nfrom peft import PeftModel\n\
         from transformers import AutoModelForCausalLM, AutoTokenizer\n\n\
         base = AutoModelForCausalLM.from_pretrained(\"{base_q}\")\n\
         tokenizer = AutoTokenizer.from_pretrained(\"{base_q}\")\n\
         model = PeftModel.from_pretrained(base, \"{repo}\")\n```\n"
    );
    let local = format!("adapters/{title}");
    let _ = writeln!(
        md,
        "### With Concord\n\n```bash\nhuggingface-cli download {repo} --local-dir {local}\n\
         concord generate --model {base_q} --adapter {local} --messages chat.json \
         --max-new-tokens 256\n```\n\n`chat.json` holds one conversation: a JSON list of \
         `{{\"role\", \"content\"}}` messages."
    );
    Ok(md)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hub_model_card_eval_table() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
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

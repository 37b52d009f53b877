//! The evaluation report as text: the markdown tables `concord eval` prints, and the
//! files written beside `eval.json`.
use super::{EnvEval, EvalReport};
use crate::envs::BehaviourSummary;
use anyhow::Result;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Where the decisions of the evaluation written to `out` go: beside it, named after
/// it (`eval.json` -> `eval_decisions.jsonl`), one JSON object a line (`model`, `env`,
/// `decision`).
pub fn decisions_path(out: &Path) -> PathBuf {
    sibling_path(out, "decisions")
}

/// `eval.json` -> `eval_{what}.jsonl`, beside it.
pub(super) fn sibling_path(out: &Path, what: &str) -> PathBuf {
    let stem = out
        .file_stem()
        .map_or("eval".into(), |s| s.to_string_lossy());
    out.with_file_name(format!("{stem}_{what}.jsonl"))
}

pub(super) fn write_decisions(path: &Path, rows: &[serde_json::Value]) -> Result<()> {
    let mut text = String::new();
    for r in rows {
        text.push_str(&serde_json::to_string(r)?);
        text.push('\n');
    }
    crate::atomic::atomic_write_bytes(path, text.as_bytes())
}

/// The behaviour block (markdown): per environment, each model's agreement with the
/// reference, the best constant's, the mutual information, and its action shares per
/// situation.
pub fn behaviour_table(r: &EvalReport) -> String {
    let mut s = String::new();
    let mut envs: Vec<&String> = r.models.values().flat_map(|m| m.envs.keys()).collect();
    envs.sort();
    envs.dedup();
    for env in envs {
        let rows: Vec<(&String, &BehaviourSummary)> = r
            .models
            .iter()
            .filter_map(|(l, m)| m.envs.get(env.as_str())?.behaviour.as_ref().map(|b| (l, b)))
            .collect();
        let Some((_, first)) = rows.first() else {
            continue;
        };
        s.push_str(&format!(
            "\n{env}: behaviour against the `{}` policy\n\n| model | decisions | agreement | \
             best constant | I(situation; action) bits |\n|---|---|---|---|---|\n",
            first.reference_policy
        ));
        for (l, b) in &rows {
            s.push_str(&format!(
                "| {} | {} | {} | {:.3} ({}) | {:.3} (reference {:.3}) |\n",
                display_label(r, l),
                b.decisions,
                fmt_ci(b.agreement, b.agreement_ci95),
                b.best_constant.agreement,
                b.best_constant.action,
                b.mutual_information_bits,
                b.reference_mutual_information_bits
            ));
        }
        s.push_str("\n| situation | model | decisions | actions | reference | agreement |\n|---|---|---|---|---|---|\n");
        let shares = |m: &BTreeMap<String, usize>, n: usize| -> String {
            m.iter()
                .map(|(a, c)| format!("{a} {:.2}", *c as f64 / n.max(1) as f64))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let mut situations: Vec<&String> =
            rows.iter().flat_map(|(_, b)| b.situations.keys()).collect();
        situations.sort();
        situations.dedup();
        for sit in situations {
            for (l, b) in &rows {
                if let Some(x) = b.situations.get(sit.as_str()) {
                    s.push_str(&format!(
                        "| {sit} | {} | {} | {} | {} | {:.3} |\n",
                        display_label(r, l),
                        x.decisions,
                        shares(&x.actions, x.decisions),
                        shares(&x.reference, x.decisions),
                        x.agreement
                    ));
                }
            }
        }
    }
    s
}

/// One row of the table: the value (and its interval, if any) of an environment's result.
type Metric = Box<dyn Fn(&EnvEval) -> (f64, Option<[f64; 2]>)>;

/// The column name of a model: `base`, or `start (DIR)` when the `base` entry is the
/// adapter the run started from.
fn display_label(r: &EvalReport, label: &str) -> String {
    match r.models.get(label).and_then(|m| m.adapter.as_ref()) {
        Some(dir) if label == "base" => format!("start ({dir})"),
        _ => label.to_string(),
    }
}

fn fmt_ci(v: f64, ci: [f64; 2]) -> String {
    format!("{v:.3} [{:.3}, {:.3}]", ci[0], ci[1])
}

/// The before/after table (markdown): one block per environment.
pub fn table(r: &EvalReport) -> String {
    // Before, then after.
    let mut labels: Vec<&String> = r.models.keys().collect();
    labels.sort_by_key(|l| (l.as_str() != "base", l.as_str() != "adapter", l.to_string()));
    let mut envs: Vec<&String> = r.models.values().flat_map(|m| m.envs.keys()).collect();
    envs.sort();
    envs.dedup();
    let both = r.models.contains_key("base") && r.models.contains_key("adapter");
    let mut s = String::new();
    for env in envs {
        let get = |l: &str| r.models.get(l).and_then(|m| m.envs.get(env.as_str()));
        let any = labels.iter().find_map(|l| get(l));
        let Some(first) = any else { continue };
        s.push_str(&format!(
            "\n{env}: {} episodes, {} seats, {}\n\n| metric |",
            first.episodes,
            first.seats,
            if r.greedy { "greedy" } else { "sampled" }
        ));
        for l in &labels {
            s.push_str(&format!(" {} |", display_label(r, l)));
        }
        if both {
            s.push_str(" delta |");
        }
        s.push_str("\n|---|");
        for _ in 0..labels.len() + both as usize {
            s.push_str("---|");
        }
        s.push('\n');
        let mut rows: Vec<(String, Metric)> = vec![
            (
                "win rate".into(),
                Box::new(|e: &EnvEval| (e.win_rate, Some(e.win_ci95))),
            ),
            (
                "reward".into(),
                Box::new(|e: &EnvEval| (e.reward_mean, Some(e.reward_ci95))),
            ),
        ];
        for k in first.components.keys() {
            let k2 = k.clone();
            rows.push((
                k.clone(),
                Box::new(move |e: &EnvEval| {
                    (e.components.get(&k2).copied().unwrap_or(f64::NAN), None)
                }),
            ));
        }
        for (name, f) in &rows {
            s.push_str(&format!("| {name} |"));
            for l in &labels {
                match get(l).map(f) {
                    Some((v, Some(ci))) => s.push_str(&format!(" {} |", fmt_ci(v, ci))),
                    Some((v, None)) => s.push_str(&format!(" {v:.3} |")),
                    None => s.push_str(" - |"),
                }
            }
            if both {
                match (get("base"), get("adapter")) {
                    (Some(b), Some(a)) => s.push_str(&format!(" {:+.3} |", f(a).0 - f(b).0)),
                    _ => s.push_str(" - |"),
                }
            }
            s.push('\n');
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eval::tests::behaviour_of;
    use crate::eval::ModelEval;

    #[test]
    fn behaviour_table_names_agreement_and_situations() {
        let o = behaviour_of("ticketmelt", &[], "always_a");
        let mut report = EvalReport {
            config: "c.toml".into(),
            episodes: 60,
            greedy: false,
            first_seed: 0,
            sampling: None,
            env_options: Default::default(),
            models: BTreeMap::new(),
        };
        let mut envs = BTreeMap::new();
        envs.insert("ticketmelt".to_string(), o.summarise());
        report.models.insert(
            "adapter".into(),
            ModelEval {
                adapter: None,
                envs,
            },
        );
        let t = behaviour_table(&report);
        assert!(
            t.contains("behaviour against the `heuristic` policy"),
            "{t}"
        );
        assert!(t.contains("| restored | adapter |"), "{t}");
        assert!(t.contains("DEPLOY_PROD_A 1.00"), "{t}");
    }

    #[test]
    fn decisions_go_beside_their_report() {
        assert_eq!(
            decisions_path(Path::new("runs/x/eval.json")),
            Path::new("runs/x/eval_decisions.jsonl")
        );
        assert_eq!(
            decisions_path(Path::new("base.json")),
            Path::new("base_decisions.jsonl")
        );
    }
}

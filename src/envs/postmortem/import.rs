//! `concord envs import postmortem --from pagerduty FILE.json --out SCENARIO.json`.
//!
//! Reads a PagerDuty incident export: one JSON object with `incident` (the REST API's
//! incident: `incident_number`, `title`, `created_at`, `resolved_at` or
//! `last_status_change_at`, `service.summary`, `teams[].summary`), and optionally
//! `alerts` (`created_at`, `severity`, `summary`, `service.summary`, `body.details`),
//! `log_entries` (`type`, `created_at`, `summary`, `agent.summary`) and `notes`
//! (`created_at`, `user.summary`, `content`). What PagerDuty does not hold is derived:
//! - the root cause is the first service named in a note starting `Root cause:` (else
//!   the incident's service); its category terms and keywords are that note's words;
//! - the timeline is the trigger / acknowledge / escalate / resolve log entries and
//!   the notes; evidence windows are the root-cause service's alerts (10 minutes before
//!   to 5 after), their logs the alert summary and `body.details`;
//! - action themes come from notes starting `Action item:` (else monitoring and
//!   runbook themes); teams from `teams` plus `sre`; impact from the incident's
//!   duration, the alerted services and any percentages in the notes.
//!
//! Review the written scenario's `gold` before training on it.

use super::scenario::*;
use serde_json::Value;

fn s<'a>(v: &'a Value, path: &[&str]) -> &'a str {
    let mut cur = v;
    for p in path {
        cur = match cur.get(p) {
            Some(x) => x,
            None => return "",
        };
    }
    cur.as_str().unwrap_or("")
}

/// `(date, minutes)` of an ISO-8601 UTC timestamp.
fn when(ts: &str) -> Option<(String, u32)> {
    let (d, t) = ts.trim().split_once('T')?;
    parse_date(d)?;
    Some((d.to_string(), parse_hhmm(t.get(0..5)?)?))
}

fn long_words(text: &str, n: usize, skip: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for w in text.split(|c: char| !(c.is_alphanumeric() || c == '-' || c == '_' || c == '.')) {
        let w = w.trim_matches('.').to_lowercase();
        if w.len() >= 5 && !skip.contains(&w) && !out.contains(&w) && !STOP.contains(&w.as_str()) {
            out.push(w);
        }
        if out.len() >= n {
            break;
        }
    }
    out
}

const STOP: &[&str] = &[
    "which", "there", "their", "about", "after", "before", "cause", "because", "while", "would",
];

/// Convert a PagerDuty export to a validated scenario.
pub fn from_pagerduty(export: &Value) -> anyhow::Result<Scenario> {
    let inc = export
        .get("incident")
        .ok_or_else(|| anyhow::anyhow!("not a PagerDuty incident export: no `incident` object"))?;
    let created = s(inc, &["created_at"]);
    let (date, start) = when(created).ok_or_else(|| {
        anyhow::anyhow!("incident.created_at `{created}` is not an ISO-8601 UTC time")
    })?;
    let resolved = [s(inc, &["resolved_at"]), s(inc, &["last_status_change_at"])]
        .into_iter()
        .find_map(when)
        .map(|(_, t)| t)
        .unwrap_or(start + 30);
    let main_service = s(inc, &["service", "summary"]).to_string();
    anyhow::ensure!(
        !main_service.is_empty(),
        "incident.service.summary is missing"
    );
    let number = inc
        .get("incident_number")
        .map(|n| n.to_string())
        .unwrap_or_else(|| s(inc, &["id"]).to_string());
    let empty = Vec::new();
    let arr = |k: &str| export.get(k).and_then(Value::as_array).unwrap_or(&empty);

    let mut services: Vec<String> = vec![main_service.clone()];
    let mut alerts = Vec::new();
    let mut alert_list: Vec<(u32, String, String, Vec<String>)> = Vec::new();
    for a in arr("alerts") {
        let Some((_, t)) = when(s(a, &["created_at"])) else {
            continue;
        };
        let svc = match s(a, &["service", "summary"]) {
            "" => main_service.clone(),
            x => x.to_string(),
        };
        if !services.contains(&svc) {
            services.push(svc.clone());
        }
        let summary = s(a, &["summary"]).to_string();
        let details: Vec<String> = a
            .pointer("/body/details")
            .and_then(Value::as_object)
            .map(|o| {
                o.iter()
                    .map(|(k, v)| {
                        format!(
                            "{k}: {}",
                            v.as_str()
                                .map(str::to_string)
                                .unwrap_or_else(|| v.to_string())
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        alerts.push(Alert {
            time: hhmm(t),
            severity: match s(a, &["severity"]) {
                "" => "warning".into(),
                x => x.to_string(),
            },
            service: svc.clone(),
            message: summary.clone(),
        });
        alert_list.push((t, svc, summary, details));
    }
    let mut slack = Vec::new();
    let mut timeline = Vec::new();
    let mut root_note = String::new();
    let mut themes = Vec::new();
    let mut scale = Vec::new();
    for n in arr("notes") {
        let Some((_, t)) = when(s(n, &["created_at"])) else {
            continue;
        };
        let content = s(n, &["content"]).trim().to_string();
        slack.push(SlackMessage {
            time: hhmm(t),
            author: s(n, &["user", "summary"]).to_string(),
            text: content.clone(),
        });
        let lower = content.to_lowercase();
        if let Some(rest) = lower.strip_prefix("root cause:") {
            root_note = rest.trim().to_string();
        } else if let Some(rest) = lower.strip_prefix("action item:") {
            let kw = long_words(rest, 2, &[]);
            if !kw.is_empty() {
                themes.push(Theme {
                    name: rest.trim().to_string(),
                    keywords: kw,
                });
            }
        }
        for w in content.split_whitespace() {
            let w = w
                .trim_matches(|c: char| !(c.is_ascii_digit() || c == '%' || c == '.'))
                .trim_end_matches('.');
            if w.ends_with('%') && w.len() > 1 && !scale.contains(&w.to_string()) {
                scale.push(w.to_string());
            }
        }
    }
    for e in arr("log_entries") {
        let Some((_, t)) = when(s(e, &["created_at"])) else {
            continue;
        };
        let kind = s(e, &["type"]);
        let kw: &[&str] = match kind {
            "trigger_log_entry" => &["triggered", "alert"],
            "acknowledge_log_entry" => &["acknowledged"],
            "escalate_log_entry" => &["escalated"],
            "resolve_log_entry" => &["resolved"],
            "annotate_log_entry" => {
                slack.push(SlackMessage {
                    time: hhmm(t),
                    author: s(e, &["agent", "summary"]).to_string(),
                    text: s(e, &["summary"]).to_string(),
                });
                continue;
            }
            _ => continue,
        };
        let summary = s(e, &["summary"]);
        let text = if super::grader::has_word(&summary.to_lowercase(), kw[0]) {
            summary.to_string()
        } else {
            format!("{} {}", kw[0], summary).trim().to_string()
        };
        timeline.push(GoldEvent {
            time: hhmm(t),
            text,
            keywords: kw.iter().map(|k| k.to_string()).collect(),
        });
    }
    slack.sort_by_key(|m| parse_hhmm(&m.time));
    alerts.sort_by_key(|a| parse_hhmm(&a.time));
    timeline.sort_by_key(|e| parse_hhmm(&e.time));
    if timeline.is_empty() {
        timeline.push(GoldEvent {
            time: hhmm(start),
            text: format!("alert triggered: {}", s(inc, &["title"])),
            keywords: vec!["triggered".into()],
        });
    }
    let lower_note = root_note.to_lowercase();
    let rc_service = services
        .iter()
        .filter_map(|x| super::grader::find_service(&lower_note, x).map(|p| (p, x.clone())))
        .min()
        .map(|(_, x)| x)
        .unwrap_or_else(|| main_service.clone());
    let svc_lower: Vec<String> = services.iter().map(|x| x.to_lowercase()).collect();
    let words = long_words(&root_note, 7, &svc_lower);
    let (cat, kws) = if words.len() >= 2 {
        (
            words[..words.len().min(3)].to_vec(),
            words[words.len().min(3)..].to_vec(),
        )
    } else {
        (vec!["failure".to_string()], vec![])
    };
    let keywords = if kws.is_empty() { cat.clone() } else { kws };
    let mut evidence = Vec::new();
    for (t, svc, summary, details) in &alert_list {
        if *svc != rc_service {
            continue;
        }
        let mut logs = vec![LogLine {
            time: hhmm(*t),
            service: svc.clone(),
            level: "ALERT".into(),
            message: summary.clone(),
        }];
        for d in details {
            logs.push(LogLine {
                time: hhmm(*t),
                service: svc.clone(),
                level: "DETAIL".into(),
                message: d.clone(),
            });
        }
        evidence.push(EvidenceWindow {
            service: svc.clone(),
            from: hhmm(t.saturating_sub(10)),
            to: hhmm((*t + 5).min(1439)),
            overlap_required_minutes: 5,
            logs,
            key_evidence: vec![summary.clone()],
        });
        if evidence.len() >= 3 {
            break;
        }
    }
    if evidence.is_empty() {
        evidence.push(EvidenceWindow {
            service: rc_service.clone(),
            from: hhmm(start.saturating_sub(10)),
            to: hhmm((start + 5).min(1439)),
            overlap_required_minutes: 5,
            logs: vec![LogLine {
                time: hhmm(start),
                service: rc_service.clone(),
                level: "ALERT".into(),
                message: s(inc, &["title"]).to_string(),
            }],
            key_evidence: vec![s(inc, &["title"]).to_string()],
        });
    }
    if themes.is_empty() {
        themes = vec![
            Theme {
                name: "improve monitoring and alerting".into(),
                keywords: vec!["monitor".into(), "alert".into()],
            },
            Theme {
                name: "update the runbook".into(),
                keywords: vec!["runbook".into()],
            },
        ];
    }
    let mut teams: Vec<String> = inc
        .get("teams")
        .and_then(Value::as_array)
        .unwrap_or(&empty)
        .iter()
        .map(|t| s(t, &["summary"]).trim().to_lowercase().replace(' ', "-"))
        .filter(|t| !t.is_empty())
        .collect();
    if !teams.iter().any(|t| t == "sre") {
        teams.push("sre".into());
    }
    if scale.is_empty() {
        scale.push("customers".into());
    }
    let impact_services: Vec<String> = {
        let mut v: Vec<String> = alert_list.iter().map(|a| a.1.clone()).collect();
        v.push(main_service.clone());
        v.sort();
        v.dedup();
        v
    };
    let sc = Scenario {
        id: format!("pd-{}", number.trim_matches('"')),
        title: s(inc, &["title"]).to_string(),
        level: "imported".into(),
        date,
        alerts,
        slack,
        services: services
            .iter()
            .map(|n| ServiceNode {
                name: n.clone(),
                depends_on: vec![],
            })
            .collect(),
        relevant_services: vec![rc_service.clone()],
        evidence,
        noise_logs: vec![],
        gold: Gold {
            root_cause: RootCause {
                service: rc_service,
                category: cat[0].clone(),
                category_terms: cat,
                keywords,
            },
            timeline,
            hidden_timeline: vec![],
            action_themes: themes,
            teams,
            due_within_days: 30,
            impact: Impact {
                duration_minutes: resolved.saturating_sub(start).max(1),
                services: impact_services,
                scale,
            },
            false_causes: vec![],
        },
        limits: Limits {
            max_queries: 8,
            penalties: vec![0.05, 0.08, 0.12, 0.18],
        },
    };
    sc.validate()
        .map_err(|e| anyhow::anyhow!("the converted scenario is invalid: {e}"))?;
    Ok(sc)
}

/// The CLI's entry: read `file`, convert, write `out` (pretty JSON).
pub fn import_file(
    from: &str,
    file: &std::path::Path,
    out: &std::path::Path,
) -> anyhow::Result<Scenario> {
    anyhow::ensure!(
        from == "pagerduty",
        "unknown import format `{from}`; formats: pagerduty"
    );
    let text = std::fs::read_to_string(file)
        .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", file.display()))?;
    let v: Value = serde_json::from_str(&text)
        .map_err(|e| anyhow::anyhow!("{}: not JSON: {e}", file.display()))?;
    let sc = from_pagerduty(&v).map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
    std::fs::write(out, serde_json::to_string_pretty(&sc)? + "\n")
        .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", out.display()))?;
    Ok(sc)
}

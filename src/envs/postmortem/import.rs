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
    let inc = read_incident(export)?;
    let (services, alerts, facts) = read_alerts(array(export, "alerts"), &inc.service);
    let notes = read_notes(array(export, "notes"));
    let (timeline, annotations) = read_log_entries(array(export, "log_entries"), &inc);
    let mut slack = notes.slack;
    slack.extend(annotations);
    // Stable, so a note keeps its place before a log annotation of the same minute.
    slack.sort_by_key(|m| parse_hhmm(&m.time));
    let root_cause = root_cause(&notes.root_note, &services, &inc.service);
    let evidence = evidence_windows(&facts, &root_cause.service, &inc);
    let sc = Scenario {
        id: format!("pd-{}", inc.number.trim_matches('"')),
        title: inc.title.to_string(),
        level: "imported".into(),
        date: inc.date,
        alerts,
        slack,
        services: services
            .iter()
            .map(|n| ServiceNode {
                name: n.clone(),
                depends_on: vec![],
            })
            .collect(),
        relevant_services: vec![root_cause.service.clone()],
        evidence,
        noise_logs: vec![],
        gold: Gold {
            root_cause,
            timeline,
            hidden_timeline: vec![],
            action_themes: notes.themes,
            teams: inc.teams,
            due_within_days: 30,
            impact: Impact {
                duration_minutes: inc.resolved.saturating_sub(inc.start).max(1),
                services: impact_services(&facts, &inc.service),
                scale: notes.scale,
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

/// The array under `key`; an export may leave out any of its lists.
fn array<'a>(v: &'a Value, key: &str) -> &'a [Value] {
    v.get(key)
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

/// What the `incident` object itself says.
struct Incident<'a> {
    /// `incident_number` as JSON text, else the `id`.
    number: String,
    title: &'a str,
    date: String,
    /// Minutes after midnight of `created_at`.
    start: u32,
    resolved: u32,
    /// The incident's own service.
    service: String,
    teams: Vec<String>,
}

fn read_incident(export: &Value) -> anyhow::Result<Incident<'_>> {
    let inc = export
        .get("incident")
        .ok_or_else(|| anyhow::anyhow!("not a PagerDuty incident export: no `incident` object"))?;
    let created = s(inc, &["created_at"]);
    let (date, start) = when(created).ok_or_else(|| {
        anyhow::anyhow!("incident.created_at `{created}` is not an ISO-8601 UTC time")
    })?;
    // An unresolved incident has neither time; its impact then counts half an hour.
    let resolved = [s(inc, &["resolved_at"]), s(inc, &["last_status_change_at"])]
        .into_iter()
        .find_map(when)
        .map(|(_, t)| t)
        .unwrap_or(start + 30);
    let service = s(inc, &["service", "summary"]).to_string();
    anyhow::ensure!(!service.is_empty(), "incident.service.summary is missing");
    let number = inc
        .get("incident_number")
        .map(|n| n.to_string())
        .unwrap_or_else(|| s(inc, &["id"]).to_string());
    Ok(Incident {
        number,
        title: s(inc, &["title"]),
        date,
        start,
        resolved,
        service,
        teams: read_teams(inc),
    })
}

/// The owner teams: `teams[].summary` as owner names (`Payments Team` ->
/// `payments-team`), plus `sre`.
fn read_teams(inc: &Value) -> Vec<String> {
    let mut teams: Vec<String> = array(inc, "teams")
        .iter()
        .map(|t| s(t, &["summary"]).trim().to_lowercase().replace(' ', "-"))
        .filter(|t| !t.is_empty())
        .collect();
    if !teams.iter().any(|t| t == "sre") {
        teams.push("sre".into());
    }
    teams
}

/// An alert as the evidence windows and the impact need it.
struct AlertFacts {
    minute: u32,
    service: String,
    summary: String,
    /// `body.details` as `key: value` lines.
    details: Vec<String>,
}

/// The services (the incident's first, then each alert's in order of appearance), the
/// scenario's alerts (by time) and the facts of each alert (in export order).
fn read_alerts(list: &[Value], main_service: &str) -> (Vec<String>, Vec<Alert>, Vec<AlertFacts>) {
    let mut services: Vec<String> = vec![main_service.to_string()];
    let mut alerts = Vec::new();
    let mut facts = Vec::new();
    for a in list {
        let Some((_, t)) = when(s(a, &["created_at"])) else {
            continue;
        };
        let svc = match s(a, &["service", "summary"]) {
            "" => main_service.to_string(),
            x => x.to_string(),
        };
        if !services.contains(&svc) {
            services.push(svc.clone());
        }
        let summary = s(a, &["summary"]).to_string();
        alerts.push(Alert {
            time: hhmm(t),
            severity: match s(a, &["severity"]) {
                "" => "warning".into(),
                x => x.to_string(),
            },
            service: svc.clone(),
            message: summary.clone(),
        });
        facts.push(AlertFacts {
            minute: t,
            service: svc,
            summary,
            details: alert_details(a),
        });
    }
    alerts.sort_by_key(|a| parse_hhmm(&a.time));
    (services, alerts, facts)
}

fn alert_details(alert: &Value) -> Vec<String> {
    alert
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
        .unwrap_or_default()
}

/// What the responders' notes give the scenario.
struct Notes {
    /// Every note as a chat message, in export order.
    slack: Vec<SlackMessage>,
    /// The last `Root cause:` note, lowercase, without its prefix.
    root_note: String,
    themes: Vec<Theme>,
    /// Percentages quoted in the notes, as the impact's scale.
    scale: Vec<String>,
}

fn read_notes(list: &[Value]) -> Notes {
    let mut slack = Vec::new();
    let mut root_note = String::new();
    let mut themes = Vec::new();
    let mut scale = Vec::new();
    for n in list {
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
            themes.extend(action_theme(rest));
        }
        add_percentages(&content, &mut scale);
    }
    // Validation wants a theme and a scale term even when no note gives one.
    if themes.is_empty() {
        themes = default_themes();
    }
    if scale.is_empty() {
        scale.push("customers".into());
    }
    Notes {
        slack,
        root_note,
        themes,
        scale,
    }
}

/// The theme of an `Action item:` note (`rest` is its text after the prefix); none when
/// it has no long word, as validation rejects a theme without keywords.
fn action_theme(rest: &str) -> Option<Theme> {
    let keywords = long_words(rest, 2, &[]);
    (!keywords.is_empty()).then(|| Theme {
        name: rest.trim().to_string(),
        keywords,
    })
}

/// Append each new percentage (`14%`, `12.5%`) quoted in `text` to `scale`.
fn add_percentages(text: &str, scale: &mut Vec<String>) {
    for w in text.split_whitespace() {
        let w = w
            .trim_matches(|c: char| !(c.is_ascii_digit() || c == '%' || c == '.'))
            .trim_end_matches('.');
        if w.ends_with('%') && w.len() > 1 && !scale.contains(&w.to_string()) {
            scale.push(w.to_string());
        }
    }
}

fn default_themes() -> Vec<Theme> {
    vec![
        Theme {
            name: "improve monitoring and alerting".into(),
            keywords: vec!["monitor".into(), "alert".into()],
        },
        Theme {
            name: "update the runbook".into(),
            keywords: vec!["runbook".into()],
        },
    ]
}

/// The gold timeline (by time) from the trigger / acknowledge / escalate / resolve
/// entries, and the annotations as chat messages (in export order).
fn read_log_entries(list: &[Value], inc: &Incident) -> (Vec<GoldEvent>, Vec<SlackMessage>) {
    let mut timeline = Vec::new();
    let mut annotations = Vec::new();
    for e in list {
        let Some((_, t)) = when(s(e, &["created_at"])) else {
            continue;
        };
        let kw: &[&str] = match s(e, &["type"]) {
            "trigger_log_entry" => &["triggered", "alert"],
            "acknowledge_log_entry" => &["acknowledged"],
            "escalate_log_entry" => &["escalated"],
            "resolve_log_entry" => &["resolved"],
            "annotate_log_entry" => {
                annotations.push(SlackMessage {
                    time: hhmm(t),
                    author: s(e, &["agent", "summary"]).to_string(),
                    text: s(e, &["summary"]).to_string(),
                });
                continue;
            }
            _ => continue,
        };
        timeline.push(log_event(t, s(e, &["summary"]), kw));
    }
    timeline.sort_by_key(|e| parse_hhmm(&e.time));
    // Validation rejects an empty timeline; the incident's creation stands in.
    if timeline.is_empty() {
        timeline.push(GoldEvent {
            time: hhmm(inc.start),
            text: format!("alert triggered: {}", inc.title),
            keywords: vec!["triggered".into()],
        });
    }
    (timeline, annotations)
}

/// A gold event for a log entry. Validation wants the text to contain a keyword, so the
/// first is prefixed unless the summary already has it (`Triggered through the API`).
fn log_event(minute: u32, summary: &str, kw: &[&str]) -> GoldEvent {
    let text = if has_word(&summary.to_lowercase(), kw[0]) {
        summary.to_string()
    } else {
        format!("{} {}", kw[0], summary).trim().to_string()
    };
    GoldEvent {
        time: hhmm(minute),
        text,
        keywords: kw.iter().map(|k| k.to_string()).collect(),
    }
}

/// The root cause: the service `root_note` names first (else the incident's); the
/// note's first long words other than service names give up to three category terms and
/// then the keywords (with fewer than two words, the category is `failure`).
fn root_cause(root_note: &str, services: &[String], main_service: &str) -> RootCause {
    let lower_note = root_note.to_lowercase();
    let service = services
        .iter()
        .filter_map(|x| super::grader::find_service(&lower_note, x).map(|p| (p, x.clone())))
        .min()
        .map(|(_, x)| x)
        .unwrap_or_else(|| main_service.to_string());
    let svc_lower: Vec<String> = services.iter().map(|x| x.to_lowercase()).collect();
    let words = long_words(root_note, 7, &svc_lower);
    let (category_terms, kws) = if words.len() >= 2 {
        (
            words[..words.len().min(3)].to_vec(),
            words[words.len().min(3)..].to_vec(),
        )
    } else {
        (vec!["failure".to_string()], vec![])
    };
    let keywords = if kws.is_empty() {
        category_terms.clone()
    } else {
        kws
    };
    RootCause {
        service,
        category: category_terms[0].clone(),
        category_terms,
        keywords,
    }
}

/// Up to three windows around the root-cause service's alerts. Validation wants at
/// least one, so without such alerts the window is around the incident's start.
fn evidence_windows(facts: &[AlertFacts], rc_service: &str, inc: &Incident) -> Vec<EvidenceWindow> {
    let mut evidence: Vec<EvidenceWindow> = facts
        .iter()
        .filter(|f| f.service == rc_service)
        .take(3)
        .map(alert_window)
        .collect();
    if evidence.is_empty() {
        evidence.push(EvidenceWindow {
            service: rc_service.to_string(),
            from: hhmm(inc.start.saturating_sub(10)),
            to: hhmm((inc.start + 5).min(1439)),
            overlap_required_minutes: 5,
            logs: vec![LogLine {
                time: hhmm(inc.start),
                service: rc_service.to_string(),
                level: "ALERT".into(),
                message: inc.title.to_string(),
            }],
            key_evidence: vec![inc.title.to_string()],
        });
    }
    evidence
}

/// The window from 10 minutes before an alert to 5 after, its logs the alert's summary
/// and details.
fn alert_window(f: &AlertFacts) -> EvidenceWindow {
    let line = |level: &str, message: &str| LogLine {
        time: hhmm(f.minute),
        service: f.service.clone(),
        level: level.into(),
        message: message.to_string(),
    };
    let mut logs = vec![line("ALERT", &f.summary)];
    logs.extend(f.details.iter().map(|d| line("DETAIL", d)));
    EvidenceWindow {
        service: f.service.clone(),
        from: hhmm(f.minute.saturating_sub(10)),
        to: hhmm((f.minute + 5).min(1439)),
        overlap_required_minutes: 5,
        logs,
        key_evidence: vec![f.summary.clone()],
    }
}

/// Every alerted service and the incident's own, sorted.
fn impact_services(facts: &[AlertFacts], main_service: &str) -> Vec<String> {
    let mut v: Vec<String> = facts.iter().map(|f| f.service.clone()).collect();
    v.push(main_service.to_string());
    v.sort();
    v.dedup();
    v
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

//! Scripted policies for the writer seat, the scripted reviewer, baselines and bench.
//!
//! - `oracle` reads the gold standard: queries every evidence window exactly, writes
//!   each section from the gold (timeline with every event, root cause naming the true
//!   service first with its category, keywords and key evidence), assigns one item per
//!   theme to a known team due within the deadline, requests a review, submits.
//! - `evidence_bound` (the continuation policy) writes like the oracle but only from
//!   what the episode has uncovered: it never queries; hidden timeline events and key
//!   evidence appear only once a correct query found their window; without a found
//!   window of the true service, its root cause names the first planted false cause
//!   (the story Slack tells). It writes sections that are missing or invalid, and
//!   revises the root cause (when it lacks the true service) and the timeline (when
//!   it scores below what it would write) once new evidence is found.
//! - `random`: a uniformly random valid action each step (random services, windows,
//!   sections filled with random words of the incident's text, random owners and due
//!   dates); SUBMIT is one of the six action types.
//! - `query_everything`: queries every service over consecutive 30-minute slices of the
//!   incident (past the budget, where each refused query is charged as wrong), then
//!   writes like the oracle with whatever steps remain.

use super::episode::{Postmortem, MAX_ITEMS, MAX_QUERY_MINUTES, REVIEWER};
use super::grader::{self, Item};
use super::parse::{action_json, Action};
use super::scenario::{format_date, hhmm, parse_date, parse_hhmm, Scenario, SECTIONS};
use super::Prompt;
use crate::envs::tools::{measure, wilson_ci, BaselineRow, BenchResult};
use rand::seq::SliceRandom;
use rand::Rng;
use std::collections::BTreeMap;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    Oracle,
    EvidenceBound,
    Random,
    QueryEverything,
}

/// Every scripted writer policy by name.
pub const POLICIES: [(&str, Policy); 4] = [
    ("oracle", Policy::Oracle),
    ("evidence_bound", Policy::EvidenceBound),
    ("random", Policy::Random),
    ("query_everything", Policy::QueryEverything),
];

impl Policy {
    pub fn from_name(s: &str) -> anyhow::Result<Self> {
        crate::envs::by_name(&POLICIES, "postmortem policy", s)
    }
    pub fn name(self) -> &'static str {
        crate::envs::name_in(&POLICIES, &self)
    }
}

/// The scripted reviewer's answer (the skeptic): every failing check.
pub fn scripted_review_json(ep: &Postmortem) -> String {
    let ids: Vec<&str> = grader::failing_checks(&ep.scenario, &ep.sections, &ep.items)
        .into_iter()
        .map(|c| grader::CHECKS[c].0)
        .collect();
    serde_json::json!({ "critiques": ids }).to_string()
}

/// The next action of `p` for the writer.
pub fn writer_move(ep: &mut Postmortem, p: Policy) -> Action {
    match p {
        Policy::Oracle => informed_move(ep, true, false),
        Policy::EvidenceBound => informed_move(ep, false, false),
        Policy::QueryEverything => informed_move(ep, true, true),
        Policy::Random => random_move(ep),
    }
}

/// The text of `p`'s next move for `seat` (the reviewer seat gets the skeptic's review).
pub fn policy_text(ep: &mut Postmortem, p: Policy, seat: usize) -> String {
    if seat == REVIEWER {
        return scripted_review_json(ep);
    }
    let left = match ep.rules.prompt {
        Prompt::Checklist => checklist(ep),
        _ => todo(ep).into_iter().map(String::from).collect(),
    };
    let a = writer_move(ep, p);
    let left: Vec<&str> = left.iter().map(String::as_str).collect();
    answer_text(ep.rules.prompt.reasoned(), &left, &a)
}

/// The order the informed writers fill the sections in: the timeline and the root cause
/// first, because the summary and the impact restate them.
pub const WORK_ORDER: [usize; 5] = [1, 2, 3, 0, 4];

/// The sections not yet valid, in [`WORK_ORDER`]: what the reasoned status line shows
/// as not `valid`, and what a reasoned answer copies before it acts.
pub fn todo(ep: &Postmortem) -> Vec<&'static str> {
    WORK_ORDER
        .iter()
        .filter(|&&s| !ep.section_valid(s))
        .map(|&s| SECTIONS[s])
        .collect()
}

/// The todo of `prompt = "checklist"`: [`todo`], then `item K of N` while the
/// action_items section lists N items and K - 1 are assigned, then `review` until a
/// review is done (`none` after that: submit). The informed writers' next action is
/// always the first entry (a section, an item, a review), so the list is a stopping
/// rule the writer can read off its own status.
pub fn checklist(ep: &Postmortem) -> Vec<String> {
    let mut left: Vec<String> = todo(ep).into_iter().map(String::from).collect();
    let listed = ep.listed_items().len();
    if ep.items.len() < listed {
        left.push(format!("item {} of {listed}", ep.items.len() + 1));
    }
    if ep.reviews.is_empty() {
        left.push("review".into());
    }
    left
}

/// A writer's answer: the action, or with `reasoned` the `todo` it was chosen from first
/// (`"none"` when every section is valid). Small models fill sections in the order a
/// prompt lists them whatever is already written; copying the list first makes the
/// choice a lookup.
pub fn answer_text(reasoned: bool, todo: &[&str], a: &Action) -> String {
    let json = action_json(a);
    if !reasoned {
        return json;
    }
    let list = if todo.is_empty() {
        "none".to_string()
    } else {
        todo.join(", ")
    };
    format!(
        "{{\"todo\":{},{}",
        serde_json::Value::from(list),
        &json[1..]
    )
}

/// Whether a found window revealed `time` (a log line within 3 minutes).
fn revealed(ep: &Postmortem, time: &str) -> bool {
    let Some(t) = parse_hhmm(time) else {
        return false;
    };
    ep.evidence_seen
        .iter()
        .filter_map(|l| parse_hhmm(&l.time))
        .any(|x| x.abs_diff(t) <= 3)
}

/// The section texts the informed policies write; `all` = with gold knowledge.
pub fn section_text(ep: &Postmortem, section: usize, all: bool) -> String {
    let sc = &ep.scenario;
    let g = &sc.gold;
    let rc = &g.root_cause;
    let knows_cause = all
        || sc
            .evidence
            .iter()
            .zip(&ep.found)
            .any(|(w, f)| *f && w.service == rc.service);
    let (start, end) = incident_window(sc);
    let duration = g.impact.duration_minutes;
    match section {
        0 => {
            let cause = if knows_cause {
                format!("{} ({})", rc.service, rc.category_terms[0])
            } else {
                g.false_causes.first().unwrap_or(&rc.service).clone()
            };
            format!(
                "{}. Between {} and {} UTC on {} users saw errors on {}. The cause was traced to {}. \
The incident lasted {duration} minutes and was resolved by the on-call team.",
                sc.title,
                hhmm(start),
                hhmm(end),
                sc.date,
                g.impact.services.join(", "),
                cause
            )
        }
        1 => {
            let mut events: Vec<&super::scenario::GoldEvent> = g.timeline.iter().collect();
            events.extend(
                g.hidden_timeline
                    .iter()
                    .filter(|e| all || revealed(ep, &e.time)),
            );
            events.sort_by_key(|e| parse_hhmm(&e.time));
            events
                .iter()
                .map(|e| format!("{} {}", e.time, e.text))
                .collect::<Vec<_>>()
                .join("\n")
        }
        2 => {
            if knows_cause {
                let evidence: Vec<&str> = sc
                    .evidence
                    .iter()
                    .zip(&ep.found)
                    .filter(|(_, f)| all || **f)
                    .flat_map(|(w, _)| w.key_evidence.iter().map(String::as_str))
                    .collect();
                format!(
                    "The root cause was in {}: {} ({}). Contributing details: {}. Evidence from the logs: \"{}\". \
The other suspects discussed during the incident were checked against the logs and ruled out.",
                    rc.service,
                    rc.category_terms.join(", "),
                    rc.category,
                    rc.keywords.join(", "),
                    evidence.join("\"; \"")
                )
            } else {
                let blamed = g.false_causes.first().unwrap_or(&rc.service);
                format!(
                    "The root cause was {blamed}, as discussed by the responders in the incident channel; \
the service degraded and the errors propagated to its dependants until it recovered."
                )
            }
        }
        3 => format!(
            "The incident lasted {duration} minutes, from {} to {} UTC. Affected services: {}. \
Scale: {}. Customers experienced failed or slow requests during the whole window, \
and the on-call team spent the window mitigating.",
            hhmm(start),
            hhmm(end),
            g.impact.services.join(", "),
            g.impact.scale.join(", ")
        ),
        _ => g
            .action_themes
            .iter()
            .map(|t| format!("- {}: {}", t.name, t.keywords.join(", ")))
            .collect::<Vec<_>>()
            .join("\n"),
    }
}

/// First alert to `start + duration`.
fn incident_window(sc: &Scenario) -> (u32, u32) {
    let start = sc
        .alerts
        .iter()
        .filter_map(|a| parse_hhmm(&a.time))
        .min()
        .unwrap_or(0);
    (start, (start + sc.gold.impact.duration_minutes).min(1439))
}

/// A due date the deadline accepts: min(14, deadline) days after the incident.
pub fn good_due(sc: &Scenario) -> String {
    let day = parse_date(&sc.date).unwrap_or(0);
    format_date(day + sc.gold.due_within_days.min(14) as i64)
}

fn informed_move(ep: &mut Postmortem, all: bool, everything: bool) -> Action {
    let sc = ep.scenario.clone();
    if everything {
        let (lo, hi) = sc.span();
        let lo = lo.saturating_sub(MAX_QUERY_MINUTES);
        let slices = (hi - lo) / MAX_QUERY_MINUTES + 1;
        // The n-th query attempt goes to (service n / slices, slice n % slices).
        let n = ep
            .history
            .iter()
            .filter(|h| h.contains("QUERY_LOGS"))
            .count() as u32;
        if n < slices * sc.services.len() as u32 {
            let s = &sc.services[(n / slices) as usize].name;
            let from = (lo + (n % slices) * MAX_QUERY_MINUTES).min(1439 - MAX_QUERY_MINUTES);
            return Action::QueryLogs {
                service: s.clone(),
                from,
                to: from + MAX_QUERY_MINUTES,
            };
        }
    } else if all {
        if let Some(i) = ep.found.iter().position(|f| !f) {
            let w = &sc.evidence[i];
            let from = parse_hhmm(&w.from).unwrap_or(0);
            let to = parse_hhmm(&w.to).unwrap_or(0).min(from + MAX_QUERY_MINUTES);
            if ep.queries < sc.limits.max_queries {
                return Action::QueryLogs {
                    service: w.service.clone(),
                    from,
                    to,
                };
            }
        }
    }
    if !all {
        // New evidence after the sections were written: bring them up to date.
        let knows_cause = sc
            .evidence
            .iter()
            .zip(&ep.found)
            .any(|(w, f)| *f && w.service == sc.gold.root_cause.service);
        let rc = ep.sections[2].as_deref().unwrap_or("");
        if knows_cause
            && ep.sections[2].is_some()
            && grader::root_cause_layers(&sc, rc).0 != grader::RC_SERVICE
        {
            return Action::ReviseSection {
                section: 2,
                content: section_text(ep, 2, false),
            };
        }
        if let Some(tl) = ep.sections[1].as_deref() {
            let fresh = section_text(ep, 1, false);
            if grader::timeline_score(&sc, &fresh) > grader::timeline_score(&sc, tl) + 1e-9
                && sc
                    .gold
                    .hidden_timeline
                    .iter()
                    .any(|e| revealed(ep, &e.time))
            {
                return Action::ReviseSection {
                    section: 1,
                    content: fresh,
                };
            }
        }
    }
    for s in WORK_ORDER {
        if !ep.section_valid(s) {
            return Action::WriteSection {
                section: s,
                content: section_text(ep, s, all),
            };
        }
    }
    if ep.items.len() < MAX_ITEMS {
        for (i, th) in sc.gold.action_themes.iter().enumerate() {
            let done = ep.items.iter().any(|it| item_covers(&sc, it, &th.keywords));
            if !done {
                return Action::AssignActionItem {
                    description: format!("{}: {}", th.name, th.keywords.join(", ")),
                    owner: sc.gold.teams[i % sc.gold.teams.len()].clone(),
                    due: good_due(&sc),
                };
            }
        }
    }
    if ep.reviews.is_empty() {
        return Action::RequestReview;
    }
    Action::Submit
}

fn item_covers(sc: &Scenario, it: &Item, keywords: &[String]) -> bool {
    let d = it.description.to_lowercase();
    grader::owner_ok(sc, &it.owner)
        && grader::due_ok(sc, &it.due)
        && keywords.iter().any(|k| super::scenario::has_word(&d, k))
}

fn random_move(ep: &mut Postmortem) -> Action {
    let sc = ep.scenario.clone();
    let rng = &mut ep.rng;
    let words: Vec<&str> = sc
        .alerts
        .iter()
        .map(|a| a.message.as_str())
        .chain(sc.slack.iter().map(|m| m.text.as_str()))
        .flat_map(str::split_whitespace)
        .collect();
    let text = |rng: &mut rand_chacha::ChaCha8Rng, n: usize| -> String {
        (0..n)
            .map(|_| *words.choose(rng).unwrap_or(&"x"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let (lo, hi) = sc.span();
    match rng.gen_range(0..6) {
        0 => {
            let service = sc
                .services
                .choose(rng)
                .map(|s| s.name.clone())
                .unwrap_or_default();
            let from = rng.gen_range(lo.saturating_sub(60)..=hi.min(1400));
            let to = (from + rng.gen_range(5..=MAX_QUERY_MINUTES)).min(1439);
            Action::QueryLogs { service, from, to }
        }
        1 => {
            let section = rng.gen_range(0..SECTIONS.len());
            let n = rng.gen_range(3..30);
            Action::WriteSection {
                section,
                content: text(rng, n),
            }
        }
        2 => {
            let section = rng.gen_range(0..SECTIONS.len());
            let n = rng.gen_range(3..30);
            let content = text(rng, n);
            if ep.sections[section].is_some() {
                Action::ReviseSection { section, content }
            } else {
                Action::WriteSection { section, content }
            }
        }
        3 => {
            let mut owners: Vec<String> = sc.gold.teams.clone();
            owners.push("nobody".into());
            owners.push("everyone".into());
            let owner = owners.choose(rng).cloned().unwrap_or_default();
            let dues = [
                good_due(&sc),
                "next year".into(),
                "2 days".into(),
                "2020-01-01".into(),
            ];
            let due = dues.choose(rng).cloned().unwrap_or_default();
            let n = rng.gen_range(3..10);
            Action::AssignActionItem {
                description: text(rng, n),
                owner,
                due,
            }
        }
        4 => Action::RequestReview,
        _ => Action::Submit,
    }
}

/// Play one whole episode with `p` through the fast path (no text round trip for the
/// writer; the reviewer seat, if a policy seat, answers as the scripted skeptic).
pub fn play_fast(ep: &mut Postmortem, p: Policy) {
    while !ep.done {
        if ep.pending_review {
            let t = scripted_review_json(ep);
            ep.reviewer_text(&t);
            continue;
        }
        let a = writer_move(ep, p);
        ep.writer_action(&a);
    }
}

/// Sums over baseline episodes.
#[derive(Debug, Default, Clone)]
pub struct Stats {
    pub n: usize,
    pub wins: usize,
    pub scalar: f64,
    pub sums: BTreeMap<String, f64>,
}

impl Stats {
    pub fn row(&self, policy: &str, level: &str) -> BaselineRow {
        let n = self.n.max(1) as f64;
        BaselineRow {
            policy: policy.to_string(),
            peers: level.to_string(),
            level: Some(level.to_string()),
            episodes: self.n,
            win_rate: self.wins as f64 / n,
            win_ci: wilson_ci(self.wins, self.n),
            mean_reward: self.scalar / n,
            extra: self.sums.iter().map(|(k, v)| (k.clone(), v / n)).collect(),
        }
    }
}

/// Play `episodes` episodes of `make(seed)` with `p` and sum their rewards.
pub fn stats(
    make: impl Fn(u64) -> Postmortem,
    p: Policy,
    episodes: usize,
    first_seed: u64,
) -> Stats {
    let mut st = Stats::default();
    for i in 0..episodes {
        let mut ep = make(first_seed.wrapping_add(i as u64));
        play_fast(&mut ep, p);
        let r = ep.writer_reward();
        st.n += 1;
        st.scalar += r.scalar;
        st.wins += (r.components.get("win").copied().unwrap_or(0.0) >= 0.5) as usize;
        for (k, v) in r.components {
            if k != "win" {
                *st.sums.entry(k).or_default() += v;
            }
        }
        *st.sums.entry("steps".into()).or_default() += ep.step as f64;
    }
    st
}

/// Oracle episodes per second through the fast path, without and with rendering the
/// writer's prompt each step.
pub fn bench(make: impl Fn(u64) -> Postmortem, min_secs: f64) -> BenchResult {
    let run = |render: bool| {
        let mut seed = 0u64;
        let mut sink = 0usize;
        let m = measure(min_secs, || {
            let mut ep = make(seed);
            seed += 1;
            while !ep.done {
                if render {
                    sink = sink.wrapping_add(ep.user_prompt(0).len());
                }
                if ep.pending_review {
                    let t = scripted_review_json(&ep);
                    ep.reviewer_text(&t);
                    continue;
                }
                let a = writer_move(&mut ep, Policy::Oracle);
                ep.writer_action(&a);
            }
            1
        });
        std::hint::black_box(sink);
        m
    };
    BenchResult::from_runs(run(false), run(true))
}

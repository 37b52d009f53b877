//! The deterministic grader (0..1), the section validators and the reviewer's checks.
//!
//! `grade = 0.30 root_cause + 0.25 timeline + 0.20 action_items + 0.15 impact
//! + 0.10 completeness + review_bonus`, clamped to [0, 1]:
//! - **root_cause** = service (0.40 when the root_cause section names the true service;
//!   0.15 when a planted false cause is named before it; 0 when absent) + category
//!   (0.35 when any category term appears) + keywords (0.25 x share of the gold
//!   keywords present). Caps: a wrong service (service part 0) caps it at 0.65 (kept
//!   from the original; with these layer weights a wrong service scores at most 0.60,
//!   so it never binds); a timeline score under 0.4 caps it at 0.60.
//! - **timeline** = share of gold events (visible and hidden) matched by a line of the
//!   timeline section whose first `HH:MM` is within +-3 minutes and which contains one
//!   of the event's keywords; a line matches at most one event. A timeline of more
//!   than 2 x events + 4 timed lines is scaled by (2 x events + 4) / lines, so a line
//!   for every minute does not pay.
//! - **action_items** = 0.4 x share of assigned items whose owner is a known team,
//!   plus 0.3 x share with a valid due date, plus 0.3 x share of gold themes named by
//!   an item or the action_items section.
//! - **impact** = 0.25 each: at least 25 words; names an affected service; states the
//!   duration (`N min`/`N minutes`/`N hours`, within max(5 min, 10%)); names the scale
//!   (any gold scale term).
//! - **completeness** = share of the five sections that are valid.
//! - **review_bonus** = 0.10 x share of the review's critiques addressed at submit (all
//!   addressed when the review raised none); 0 without a review.
//!
//! All keyword tests are case-insensitive whole-word matches
//! ([`super::scenario::has_word`]).

use super::scenario::{has_word, parse_date, parse_hhmm, time_spans, Scenario, SECTIONS};
use std::collections::BTreeMap;

pub const W_ROOT_CAUSE: f64 = 0.30;
pub const W_TIMELINE: f64 = 0.25;
pub const W_ACTION_ITEMS: f64 = 0.20;
pub const W_IMPACT: f64 = 0.15;
pub const W_COMPLETENESS: f64 = 0.10;
pub const W_REVIEW: f64 = 0.10;
pub const RC_SERVICE: f64 = 0.40;
pub const RC_SERVICE_FALSE_FIRST: f64 = 0.15;
pub const RC_CATEGORY: f64 = 0.35;
pub const RC_KEYWORDS: f64 = 0.25;
pub const CAP_WRONG_SERVICE: f64 = 0.65;
pub const CAP_WEAK_TIMELINE: f64 = 0.60;
pub const WEAK_TIMELINE: f64 = 0.4;
pub const TIMELINE_TOLERANCE_MIN: u32 = 3;

/// The reviewer's checks: `(id, critique shown to the writer)`. A scripted review
/// raises every check that fails on the draft at that moment.
pub const CHECKS: [(&str, &str); 6] = [
    ("evidence", "root_cause quotes no log evidence: cite what the logs show"),
    (
        "false_cause",
        "root_cause does not lead with the service the evidence points at (or leads with a suspect the evidence rules out)",
    ),
    ("timeline", "timeline misses key events (times within 3 minutes, including what the logs show)"),
    ("impact_duration", "impact does not state the incident's duration"),
    ("owners", "action items need an owner from a known team and a due date within the deadline"),
    ("themes", "action items do not address every contributing factor"),
];

/// An assigned action item.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Item {
    pub description: String,
    pub owner: String,
    pub due: String,
}

/// The grade and every part of it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Grade {
    pub rc_service: f64,
    pub rc_category: f64,
    pub rc_keywords: f64,
    /// After caps.
    pub root_cause: f64,
    /// Which cap bound: `""`, `"wrong_service"` or `"weak_timeline"`.
    pub rc_cap: &'static str,
    pub timeline: f64,
    pub owners: f64,
    pub due: f64,
    pub themes: f64,
    pub action_items: f64,
    pub impact: f64,
    pub completeness: f64,
    pub review_bonus: f64,
    pub total: f64,
}

impl Grade {
    /// Named components (for `Reward::components`).
    pub fn components(&self) -> BTreeMap<String, f64> {
        let mut m = BTreeMap::new();
        for (k, v) in [
            ("root_cause", self.root_cause),
            ("rc_service", self.rc_service),
            ("rc_category", self.rc_category),
            ("rc_keywords", self.rc_keywords),
            ("timeline", self.timeline),
            ("action_items", self.action_items),
            ("impact", self.impact),
            ("completeness", self.completeness),
            ("review_bonus", self.review_bonus),
            ("grade", self.total),
        ] {
            m.insert(k.to_string(), v);
        }
        m
    }
}

/// The review state the grader needs: None without a review, else the raised checks.
pub type Review<'a> = Option<&'a [usize]>;

/// Grade a draft.
pub fn grade(
    sc: &Scenario,
    sections: &[Option<String>; 5],
    items: &[Item],
    review: Review,
) -> Grade {
    let mut g = Grade::default();
    let text = |i: usize| sections[i].as_deref().unwrap_or("");
    g.timeline = timeline_score(sc, text(1));
    let (l1, l2, l3) = root_cause_layers(sc, text(2));
    g.rc_service = l1;
    g.rc_category = l2;
    g.rc_keywords = l3;
    let (rc, cap) = apply_caps(l1, l1 + l2 + l3, g.timeline);
    g.root_cause = rc;
    g.rc_cap = cap;
    let (o, d, t) = action_item_parts(sc, items, text(4));
    g.owners = o;
    g.due = d;
    g.themes = t;
    g.action_items = 0.4 * o + 0.3 * d + 0.3 * t;
    g.impact = impact_score(sc, text(3));
    g.completeness = (0..5)
        .filter(|&i| {
            sections[i]
                .as_deref()
                .is_some_and(|s| validate_section(sc, i, s).is_ok())
        })
        .count() as f64
        / 5.0;
    g.review_bonus = match review {
        None => 0.0,
        Some([]) => W_REVIEW,
        Some(raised) => {
            let fixed = raised
                .iter()
                .filter(|&&c| check(sc, c, sections, items))
                .count();
            W_REVIEW * fixed as f64 / raised.len() as f64
        }
    };
    let total = W_ROOT_CAUSE * g.root_cause
        + W_TIMELINE * g.timeline
        + W_ACTION_ITEMS * g.action_items
        + W_IMPACT * g.impact
        + W_COMPLETENESS * g.completeness
        + g.review_bonus;
    g.total = total.clamp(0.0, 1.0);
    g
}

/// The root-cause caps on the layer sum `raw`: (capped value, the cap that bound).
pub fn apply_caps(service: f64, raw: f64, timeline: f64) -> (f64, &'static str) {
    let mut rc = raw;
    let mut cap = "";
    if service == 0.0 && rc > CAP_WRONG_SERVICE {
        rc = CAP_WRONG_SERVICE;
        cap = "wrong_service";
    }
    if timeline < WEAK_TIMELINE && rc > CAP_WEAK_TIMELINE {
        rc = CAP_WEAK_TIMELINE;
        cap = "weak_timeline";
    }
    (rc, cap)
}

/// Whether check `c` of [`CHECKS`] passes on the draft.
pub fn check(sc: &Scenario, c: usize, sections: &[Option<String>; 5], items: &[Item]) -> bool {
    let text = |i: usize| sections[i].as_deref().unwrap_or("");
    match c {
        0 => {
            let rc = text(2).to_lowercase();
            sc.evidence
                .iter()
                .flat_map(|w| &w.key_evidence)
                .any(|k| has_word(&rc, k))
        }
        1 => root_cause_layers(sc, text(2)).0 == RC_SERVICE,
        2 => timeline_score(sc, text(1)) >= 0.8,
        3 => states_duration(text(3), sc.gold.impact.duration_minutes),
        4 => {
            !items.is_empty()
                && items
                    .iter()
                    .all(|it| owner_ok(sc, &it.owner) && due_ok(sc, &it.due))
        }
        5 => action_item_parts(sc, items, text(4)).2 >= 1.0,
        _ => true,
    }
}

/// The checks failing on the draft: what the scripted skeptic raises.
pub fn failing_checks(sc: &Scenario, sections: &[Option<String>; 5], items: &[Item]) -> Vec<usize> {
    (0..CHECKS.len())
        .filter(|&c| !check(sc, c, sections, items))
        .collect()
}

fn words(s: &str) -> usize {
    s.split_whitespace().count()
}

/// Whether a section's content is acceptable; the error says why not.
pub fn validate_section(sc: &Scenario, section: usize, content: &str) -> Result<(), String> {
    let n = words(content);
    let need = |min: usize| {
        if n >= min {
            Ok(())
        } else {
            Err(format!(
                "{} needs at least {min} words (has {n})",
                SECTIONS[section]
            ))
        }
    };
    match section {
        0 => need(12),
        1 => {
            let lines = content
                .lines()
                .filter(|l| !time_spans(l).is_empty())
                .count();
            if lines >= 2 {
                Ok(())
            } else {
                Err("timeline needs at least 2 lines that start with a HH:MM time".into())
            }
        }
        2 => {
            need(12)?;
            let lower = content.to_lowercase();
            if sc
                .services
                .iter()
                .any(|s| find_service(&lower, &s.name).is_some())
            {
                Ok(())
            } else {
                Err("root_cause must name a service of the dependency graph".into())
            }
        }
        3 => {
            need(12)?;
            if content.chars().any(|c| c.is_ascii_digit()) {
                Ok(())
            } else {
                Err("impact must quantify (duration, share of users or requests)".into())
            }
        }
        4 => {
            if content.lines().any(|l| words(l) >= 3) {
                Ok(())
            } else {
                Err("action_items needs at least one line of 3 or more words".into())
            }
        }
        _ => Err("unknown section".into()),
    }
}

/// Byte position of `service` in `lower` as a whole name (neighbours neither
/// alphanumeric nor `-`).
pub fn find_service(lower: &str, service: &str) -> Option<usize> {
    let s = service.to_lowercase();
    if s.is_empty() {
        return None;
    }
    let boundary =
        |c: Option<char>| !c.is_some_and(|c| c.is_alphanumeric() || c == '-' || c == '_');
    let mut from = 0;
    while let Some(i) = lower[from..].find(&s) {
        let at = from + i;
        let before = lower[..at].chars().next_back();
        let after = lower[at + s.len()..].chars().next();
        if boundary(before) && boundary(after) {
            return Some(at);
        }
        from = at + s.len();
    }
    None
}

/// The three root-cause layers (service, category, keywords), before caps.
pub fn root_cause_layers(sc: &Scenario, text: &str) -> (f64, f64, f64) {
    let lower = text.to_lowercase();
    let rc = &sc.gold.root_cause;
    let l1 = match find_service(&lower, &rc.service) {
        None => 0.0,
        Some(at) => {
            let false_first = sc
                .gold
                .false_causes
                .iter()
                .filter_map(|f| find_service(&lower, f))
                .any(|p| p < at);
            if false_first {
                RC_SERVICE_FALSE_FIRST
            } else {
                RC_SERVICE
            }
        }
    };
    let l2 = if rc.category_terms.iter().any(|t| has_word(&lower, t)) {
        RC_CATEGORY
    } else {
        0.0
    };
    let hit = rc.keywords.iter().filter(|k| has_word(&lower, k)).count();
    let l3 = RC_KEYWORDS * hit as f64 / rc.keywords.len().max(1) as f64;
    (l1, l2, l3)
}

/// Share of gold events matched (see the module docs).
pub fn timeline_score(sc: &Scenario, text: &str) -> f64 {
    let lines: Vec<(u32, String)> = text
        .lines()
        .filter_map(|l| time_spans(l).first().map(|&(_, t)| (t, l.to_lowercase())))
        .collect();
    let mut used = vec![false; lines.len()];
    let mut hit = 0usize;
    let mut total = 0usize;
    for e in sc.all_events() {
        total += 1;
        let Some(et) = parse_hhmm(&e.time) else {
            continue;
        };
        let found = lines.iter().enumerate().position(|(i, (t, l))| {
            !used[i]
                && t.abs_diff(et) <= TIMELINE_TOLERANCE_MIN
                && e.keywords.iter().any(|k| has_word(l, k))
        });
        if let Some(i) = found {
            used[i] = true;
            hit += 1;
        }
    }
    let score = hit as f64 / total.max(1) as f64;
    // Against spraying a line per minute: beyond 2 x events + 4 timed lines the score
    // is scaled down by the excess.
    let allowed = 2 * total + 4;
    if lines.len() > allowed {
        score * allowed as f64 / lines.len() as f64
    } else {
        score
    }
}

/// Whether `owner` names a known team (case-insensitive, a leading `@` allowed).
pub fn owner_ok(sc: &Scenario, owner: &str) -> bool {
    let o = owner.trim().trim_start_matches('@').to_lowercase();
    !o.is_empty() && sc.gold.teams.iter().any(|t| t.to_lowercase() == o)
}

/// Whether `due` is a date after the incident and within the deadline (`YYYY-MM-DD`),
/// or a relative `N days` / `N weeks` (N >= 1) within it.
pub fn due_ok(sc: &Scenario, due: &str) -> bool {
    let within = sc.gold.due_within_days as i64;
    let due = due.trim().to_lowercase();
    if let (Some(d), Some(day)) = (parse_date(&due), parse_date(&sc.date)) {
        return d > day && d - day <= within;
    }
    let mut it = due.split_whitespace();
    let (Some(n), Some(unit), None) = (it.next(), it.next(), it.next()) else {
        return false;
    };
    let Ok(n) = n.parse::<i64>() else {
        return false;
    };
    let days = match unit.trim_end_matches('s') {
        "day" => n,
        "week" => n * 7,
        _ => return false,
    };
    n >= 1 && days <= within
}

/// (owner share, due share, theme share).
pub fn action_item_parts(sc: &Scenario, items: &[Item], section: &str) -> (f64, f64, f64) {
    let n = items.len().max(1) as f64;
    let owners = items.iter().filter(|it| owner_ok(sc, &it.owner)).count() as f64 / n;
    let due = items.iter().filter(|it| due_ok(sc, &it.due)).count() as f64 / n;
    let mut corpus = section.to_lowercase();
    for it in items {
        corpus.push('\n');
        corpus.push_str(&it.description.to_lowercase());
    }
    let themes = &sc.gold.action_themes;
    let covered = themes
        .iter()
        .filter(|t| t.keywords.iter().any(|k| has_word(&corpus, k)))
        .count();
    (owners, due, covered as f64 / themes.len().max(1) as f64)
}

/// Whether `text` states a duration within max(5 min, 10%) of `gold` minutes.
pub fn states_duration(text: &str, gold: u32) -> bool {
    let lower = text.to_lowercase();
    let b = lower.as_bytes();
    let tol = (gold as f64 * 0.1).max(5.0);
    let mut i = 0;
    while i < b.len() {
        if b[i].is_ascii_digit() && (i == 0 || !b[i - 1].is_ascii_digit() && b[i - 1] != b'.') {
            let mut j = i;
            while j < b.len() && (b[j].is_ascii_digit() || b[j] == b'.') {
                j += 1;
            }
            let num: Option<f64> = lower[i..j].parse().ok();
            let mut k = j;
            while k < b.len() && (b[k] == b' ' || b[k] == b'-') {
                k += 1;
            }
            let rest = &lower[k..];
            let minutes = if rest.starts_with("min") {
                num
            } else if rest.starts_with("hour") || rest.starts_with("hr") {
                num.map(|h| h * 60.0)
            } else {
                None
            };
            if minutes.is_some_and(|m| (m - gold as f64).abs() <= tol) {
                return true;
            }
            i = j;
        } else {
            i += 1;
        }
    }
    false
}

/// The impact score (see the module docs).
pub fn impact_score(sc: &Scenario, text: &str) -> f64 {
    let lower = text.to_lowercase();
    let imp = &sc.gold.impact;
    let parts = [
        words(text) >= 25,
        imp.services
            .iter()
            .any(|s| find_service(&lower, s).is_some()),
        states_duration(text, imp.duration_minutes),
        imp.scale.iter().any(|s| has_word(&lower, s)),
    ];
    parts.iter().filter(|&&p| p).count() as f64 * 0.25
}

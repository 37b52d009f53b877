//! One episode: the state, the writer's actions, the reviewer's turn and the rewards.

use super::grader::{self, Grade, Item};
use super::parse::{parse_action, parse_critiques, Action};
use super::scenario::{hhmm, parse_hhmm, LogLine, Scenario, SECTIONS};
use super::Rules;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use std::sync::Arc;

/// Writer steps before the episode is submitted automatically.
pub const MAX_STEPS: u32 = 25;
/// Longest query window, minutes.
pub const MAX_QUERY_MINUTES: u32 = 30;
/// Most action items an episode records.
pub const MAX_ITEMS: usize = 10;
/// Action items that earn the item reward.
pub const REWARDED_ITEMS: usize = 6;
/// Most reviews per episode.
pub const MAX_REVIEWS: u32 = 2;

pub const R_CORRECT_QUERY: f64 = 0.06;
pub const R_SECTION: f64 = 0.03;
pub const R_OVERWRITE: f64 = -0.02;
pub const R_ITEM: f64 = 0.08;
pub const R_MISSING_SECTION: f64 = -0.10;

/// The writer is seat 0; the reviewer seat 1.
pub const WRITER: usize = 0;
pub const REVIEWER: usize = 1;

/// A finished review: what was raised and, in multi-agent mode, what the scripted
/// skeptic would have raised (for the reviewer's reward).
#[derive(Debug, Clone, PartialEq)]
pub struct ReviewRecord {
    pub raised: Vec<usize>,
    pub scripted: Vec<usize>,
}

#[derive(Clone)]
pub struct Postmortem {
    pub rules: Rules,
    pub scenario: Arc<Scenario>,
    pub seed: u64,
    /// Randomness of the scripted policies (the `random` baseline).
    pub rng: ChaCha8Rng,
    /// Writer steps played.
    pub step: u32,
    pub queries: u32,
    pub correct_queries: u32,
    pub wrong_queries: u32,
    /// Per evidence window: found by a correct query.
    pub found: Vec<bool>,
    pub sections: [Option<String>; 5],
    /// Sections that have earned their first-valid reward.
    pub rewarded: [bool; 5],
    pub items: Vec<Item>,
    pub rewarded_items: usize,
    pub reviews: Vec<ReviewRecord>,
    /// Multi-agent: the reviewer seat must answer next.
    pub pending_review: bool,
    /// What the last writer action did (shown next turn).
    pub last_result: String,
    /// Logs returned by the last query.
    pub last_logs: Vec<LogLine>,
    /// Logs of every correct query so far.
    pub evidence_seen: Vec<LogLine>,
    pub shaping: f64,
    pub invalid: u32,
    pub done: bool,
    pub grade: Option<Grade>,
    /// Raw texts per `step` call (the transcript's `steps`).
    pub raw: Vec<Vec<String>>,
    /// One line per writer action (for rendering).
    pub history: Vec<String>,
}

impl Postmortem {
    pub fn new(rules: Rules, scenario: Arc<Scenario>, seed: u64) -> Self {
        let n = scenario.evidence.len();
        Postmortem {
            rules,
            scenario,
            seed,
            rng: ChaCha8Rng::seed_from_u64(seed ^ 0x5eed_9057),
            step: 0,
            queries: 0,
            correct_queries: 0,
            wrong_queries: 0,
            found: vec![false; n],
            sections: Default::default(),
            rewarded: [false; 5],
            items: Vec::new(),
            rewarded_items: 0,
            reviews: Vec::new(),
            pending_review: false,
            last_result: "Episode started. Investigate, write the five sections, then SUBMIT."
                .into(),
            last_logs: Vec::new(),
            evidence_seen: Vec::new(),
            shaping: 0.0,
            invalid: 0,
            done: false,
            grade: None,
            raw: Vec::new(),
            history: Vec::new(),
        }
    }

    /// Every critique raised by any review so far (None without a review).
    pub fn raised(&self) -> Option<Vec<usize>> {
        if self.reviews.is_empty() {
            return None;
        }
        let mut v: Vec<usize> = self.reviews.iter().flat_map(|r| r.raised.clone()).collect();
        v.sort_unstable();
        v.dedup();
        Some(v)
    }

    /// The action items the written action_items section lists: its non-empty lines,
    /// bullet marks (`-`, `*`) trimmed, at most [`MAX_ITEMS`] (empty while unwritten).
    pub fn listed_items(&self) -> Vec<&str> {
        self.sections[4]
            .as_deref()
            .unwrap_or("")
            .lines()
            .map(|l| l.trim().trim_start_matches(['-', '*']).trim())
            .filter(|l| !l.is_empty())
            .take(MAX_ITEMS)
            .collect()
    }

    /// Whether section `i` is written and valid.
    pub fn section_valid(&self, i: usize) -> bool {
        self.sections[i]
            .as_deref()
            .is_some_and(|s| grader::validate_section(&self.scenario, i, s).is_ok())
    }

    /// The grade of the draft as it stands.
    pub fn current_grade(&self) -> Grade {
        let raised = self.raised();
        grader::grade(
            &self.scenario,
            &self.sections,
            &self.items,
            raised.as_deref(),
        )
    }

    fn penalty(&self) -> f64 {
        let p = &self.scenario.limits.penalties;
        p[(self.wrong_queries as usize).min(p.len() - 1)]
    }

    fn shaped(&self, r: f64) -> f64 {
        if self.rules.shaping {
            r
        } else {
            0.0
        }
    }

    /// Play one writer text. Returns (step reward, valid, feedback); the step reward
    /// includes the grade when this step ends the episode.
    pub fn writer_text(&mut self, text: &str) -> (f64, bool, String) {
        match parse_action(text) {
            Ok(a) => self.writer_action(&a),
            Err(e) => {
                let fb = format!("invalid action ({e}); nothing happened (one step used)");
                self.invalid += 1;
                self.last_result = fb.clone();
                self.last_logs.clear();
                self.history.push(format!("{} invalid", self.step + 1));
                let r = self.end_step(0.0);
                (r, false, fb)
            }
        }
    }

    /// Play one parsed writer action (see [`Self::writer_text`]).
    pub fn writer_action(&mut self, a: &Action) -> (f64, bool, String) {
        if self.done || self.pending_review {
            return (0.0, false, "not the writer's turn".into());
        }
        self.last_logs.clear();
        let (r, refused) = self.apply(a);
        self.history.push(format!(
            "{} {}{}",
            self.step + 1,
            short(a),
            if refused.is_some() { " (refused)" } else { "" }
        ));
        let valid = refused.is_none();
        if !valid {
            self.invalid += 1;
        }
        let r = self.end_step(r);
        (r, valid, refused.unwrap_or_default())
    }

    /// Count the step, auto-submit at the limit; returns the step's reward.
    fn end_step(&mut self, r: f64) -> f64 {
        let mut r = self.shaped(r);
        self.step += 1;
        if !self.done && self.step >= MAX_STEPS {
            let p = self.submit_penalty();
            r += self.shaped(p);
            self.last_result.push_str(&format!(
                " | step limit {MAX_STEPS} reached: submitted automatically"
            ));
            self.finish();
        }
        self.shaping += r;
        if self.done {
            r += self.grade.as_ref().map_or(0.0, |g| g.total);
        }
        r
    }

    fn submit_penalty(&self) -> f64 {
        let missing = (0..5).filter(|&i| !self.section_valid(i)).count();
        R_MISSING_SECTION * missing as f64
    }

    fn finish(&mut self) {
        self.grade = Some(self.current_grade());
        self.done = true;
        self.pending_review = false;
    }

    /// Apply a valid action: (unshaped reward, Some(reason) when refused as a no-op).
    fn apply(&mut self, a: &Action) -> (f64, Option<String>) {
        match a {
            Action::QueryLogs { service, from, to } => self.query(service, *from, *to),
            Action::WriteSection { section, content } => self.write(*section, content, false),
            Action::ReviseSection { section, content } => {
                if self.sections[*section].is_none() {
                    return self.refuse(format!(
                        "REVISE_SECTION: `{}` is not written yet (use WRITE_SECTION)",
                        SECTIONS[*section]
                    ));
                }
                self.write(*section, content, true)
            }
            Action::AssignActionItem {
                description,
                owner,
                due,
            } => {
                if self.items.len() >= MAX_ITEMS {
                    return self.refuse(format!("at most {MAX_ITEMS} action items"));
                }
                let sc = &self.scenario;
                let mut problems = Vec::new();
                if description.split_whitespace().count() < 3 {
                    problems.push("description under 3 words".to_string());
                }
                if !grader::owner_ok(sc, owner) {
                    problems.push(format!(
                        "owner `{owner}` is not a known team ({})",
                        sc.gold.teams.join(", ")
                    ));
                }
                if !grader::due_ok(sc, due) {
                    problems.push(format!(
                        "due `{due}` is not a date within {} days of {} (YYYY-MM-DD or `N days`)",
                        sc.gold.due_within_days, sc.date
                    ));
                }
                self.items.push(Item {
                    description: description.clone(),
                    owner: owner.clone(),
                    due: due.clone(),
                });
                let mut r = 0.0;
                if problems.is_empty() {
                    if self.rewarded_items < REWARDED_ITEMS {
                        self.rewarded_items += 1;
                        r = R_ITEM;
                    }
                    self.last_result = format!("Action item {} recorded.", self.items.len());
                } else {
                    self.last_result = format!(
                        "Action item {} recorded with problems: {}.",
                        self.items.len(),
                        problems.join("; ")
                    );
                }
                (r, None)
            }
            Action::RequestReview => {
                if self.reviews.len() as u32 >= MAX_REVIEWS {
                    return self.refuse(format!("at most {MAX_REVIEWS} reviews"));
                }
                let scripted = grader::failing_checks(&self.scenario, &self.sections, &self.items);
                if self.rules.reviewer_policy {
                    self.pending_review = true;
                    self.reviews.push(ReviewRecord {
                        raised: Vec::new(),
                        scripted,
                    });
                    self.last_result =
                        "Review requested; the reviewer is reading the draft.".into();
                } else {
                    self.last_result = review_text(&scripted);
                    self.reviews.push(ReviewRecord {
                        raised: scripted.clone(),
                        scripted,
                    });
                }
                (0.0, None)
            }
            Action::Submit => {
                let p = self.submit_penalty();
                self.finish();
                self.last_result = "Submitted.".into();
                (p, None)
            }
        }
    }

    fn refuse(&mut self, why: String) -> (f64, Option<String>) {
        self.last_result = format!("refused: {why}; nothing happened (one step used)");
        (0.0, Some(self.last_result.clone()))
    }

    fn query(&mut self, service: &str, from: u32, to: u32) -> (f64, Option<String>) {
        let sc = Arc::clone(&self.scenario);
        if !sc.has_service(service) {
            let known: Vec<&str> = sc.services.iter().map(|s| s.name.as_str()).collect();
            return self.refuse(format!(
                "QUERY_LOGS: unknown service `{service}`; services: {}",
                known.join(", ")
            ));
        }
        if to - from > MAX_QUERY_MINUTES {
            return self.refuse(format!(
                "QUERY_LOGS: window {}-{} is longer than {MAX_QUERY_MINUTES} minutes",
                hhmm(from),
                hhmm(to)
            ));
        }
        if self.queries >= sc.limits.max_queries {
            let p = self.penalty();
            self.wrong_queries += 1;
            self.last_result = format!(
                "refused: query budget of {} used up; charged as a wrong query (-{p:.2})",
                sc.limits.max_queries
            );
            return (-p, Some(self.last_result.clone()));
        }
        self.queries += 1;
        let relevant = sc.relevant_services.iter().any(|s| s == service);
        let mut hit_new = false;
        let mut hit = false;
        for (i, w) in sc.evidence.iter().enumerate() {
            if w.service != service || !relevant {
                continue;
            }
            let (Some(a), Some(b)) = (parse_hhmm(&w.from), parse_hhmm(&w.to)) else {
                continue;
            };
            let overlap = to.min(b).saturating_sub(from.max(a));
            if overlap >= w.overlap_required_minutes {
                hit = true;
                self.last_logs.extend(w.logs.iter().cloned());
                if !self.found[i] {
                    self.found[i] = true;
                    hit_new = true;
                    self.evidence_seen.extend(w.logs.iter().cloned());
                }
            }
        }
        if hit {
            self.correct_queries += 1;
            self.last_result = format!(
                "QUERY_LOGS {service} {}-{}: {} log lines{}.",
                hhmm(from),
                hhmm(to),
                self.last_logs.len(),
                if hit_new { "" } else { " (already seen)" }
            );
            (if hit_new { R_CORRECT_QUERY } else { 0.0 }, None)
        } else {
            let p = self.penalty();
            self.wrong_queries += 1;
            self.last_logs = sc
                .noise_logs
                .iter()
                .filter(|l| l.service == service)
                .filter(|l| parse_hhmm(&l.time).is_some_and(|t| t >= from && t <= to))
                .cloned()
                .collect();
            self.last_result = format!(
                "QUERY_LOGS {service} {}-{}: nothing relevant ({} routine lines); wrong query -{p:.2}.",
                hhmm(from),
                hhmm(to),
                self.last_logs.len()
            );
            (-p, None)
        }
    }

    fn write(&mut self, section: usize, content: &str, revise: bool) -> (f64, Option<String>) {
        let was_valid = self.section_valid(section);
        self.sections[section] = Some(content.to_string());
        let now = grader::validate_section(&self.scenario, section, content);
        let mut r = 0.0;
        if was_valid && (!revise || self.reviews.is_empty()) {
            r += R_OVERWRITE;
        }
        match now {
            Ok(()) => {
                if !self.rewarded[section] {
                    self.rewarded[section] = true;
                    r += R_SECTION;
                }
                self.last_result = format!("Section {} saved (valid).", SECTIONS[section]);
            }
            Err(e) => {
                self.last_result = format!("Section {} saved but invalid: {e}.", SECTIONS[section]);
            }
        }
        (r, None)
    }

    /// The reviewer seat's turn (multi-agent mode): returns (valid, feedback).
    pub fn reviewer_text(&mut self, text: &str) -> (bool, String) {
        if !self.pending_review {
            return (false, "not the reviewer's turn".into());
        }
        let (ids, bad) = parse_critiques(text);
        self.pending_review = false;
        if let Some(r) = self.reviews.last_mut() {
            r.raised = ids.clone();
        }
        self.last_result = review_text(&ids);
        if bad.is_empty() {
            (true, String::new())
        } else {
            self.invalid += 1;
            (
                false,
                format!("{}; known critiques: {}", bad.join("; "), check_ids()),
            )
        }
    }

    /// The reviewer's score: mean F1 of its critiques against the scripted skeptic's.
    pub fn reviewer_f1(&self) -> f64 {
        if self.reviews.is_empty() {
            return 0.0;
        }
        let f1 = |r: &ReviewRecord| {
            if r.raised.is_empty() && r.scripted.is_empty() {
                return 1.0;
            }
            let tp = r.raised.iter().filter(|c| r.scripted.contains(c)).count() as f64;
            2.0 * tp / (r.raised.len() + r.scripted.len()) as f64
        };
        self.reviews.iter().map(f1).sum::<f64>() / self.reviews.len() as f64
    }
}

/// `evidence, false_cause, ...`
pub fn check_ids() -> String {
    grader::CHECKS
        .iter()
        .map(|c| c.0)
        .collect::<Vec<_>>()
        .join(", ")
}

/// What the writer is told after a review.
pub fn review_text(raised: &[usize]) -> String {
    if raised.is_empty() {
        return "Review: no critiques.".into();
    }
    let lines: Vec<String> = raised
        .iter()
        .map(|&c| format!("[{}] {}", grader::CHECKS[c].0, grader::CHECKS[c].1))
        .collect();
    format!(
        "Review: {} critique(s); address them with REVISE_SECTION / ASSIGN_ACTION_ITEM: {}",
        raised.len(),
        lines.join(" ")
    )
}

fn short(a: &Action) -> String {
    match a {
        Action::QueryLogs { service, from, to } => {
            format!("QUERY_LOGS {service} {}-{}", hhmm(*from), hhmm(*to))
        }
        Action::WriteSection { section, .. } => format!("WRITE_SECTION {}", SECTIONS[*section]),
        Action::ReviseSection { section, .. } => format!("REVISE_SECTION {}", SECTIONS[*section]),
        Action::AssignActionItem { owner, due, .. } => format!("ASSIGN_ACTION_ITEM {owner} {due}"),
        Action::RequestReview => "REQUEST_REVIEW".into(),
        Action::Submit => "SUBMIT".into(),
    }
}

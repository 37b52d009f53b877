//! Prompts, the readable state and `describe`.

use super::episode::{check_ids, Postmortem, MAX_QUERY_MINUTES, MAX_STEPS, REVIEWER};
use super::grader::CHECKS;
use super::scenario::SECTIONS;
use super::Prompt;
use std::fmt::Write;

pub const WRITER_SYSTEM: &str = "You are the incident commander writing the post-mortem of a production incident. \
Investigate with log queries, then write the five sections (summary, timeline, root_cause, impact, action_items), \
assign action items, optionally request a review, and submit.\n\
Answer every turn with exactly one JSON object, one of:\n\
{\"action\": \"QUERY_LOGS\", \"service\": \"orders-api\", \"from\": \"09:00\", \"to\": \"09:20\"}\n\
{\"action\": \"WRITE_SECTION\", \"section\": \"timeline\", \"content\": \"09:12 first alert ...\\n09:31 rollback ...\"}\n\
{\"action\": \"ASSIGN_ACTION_ITEM\", \"description\": \"add an alert on pool saturation\", \"owner\": \"sre\", \"due\": \"2026-03-17\"}\n\
{\"action\": \"REQUEST_REVIEW\"}\n\
{\"action\": \"REVISE_SECTION\", \"section\": \"root_cause\", \"content\": \"...\"}\n\
{\"action\": \"SUBMIT\"}\n\
Rules: a query window is at most 30 minutes; only the right service and time window returns the evidence, and wrong \
queries cost more each time. The timeline is one event per line starting with HH:MM. Owners must be known teams; due \
dates YYYY-MM-DD within the deadline. Name the true root-cause service first; people in Slack can be wrong.";

/// What `prompt = "reasoned"` adds to the writer's system prompt.
pub const REASONED_RULE: &str = "Start every answer with \"todo\": the sections the STATUS line does not \
show as valid, in its order, or \"none\". Write the first of them. With none left, assign action items \
(owners from TEAMS), request a review once, then submit.";

/// What `prompt = "checklist"` adds to the writer's system prompt.
pub const CHECKLIST_RULE: &str = "Start every answer with \"todo\": the sections the STATUS line does not \
show as valid, in its order, then \"item K of N\" while fewer action items are assigned than the action_items \
section lists (assign the STATUS line's next item, owner from TEAMS), then \"review\" until a review is done; \
or \"none\". Do the first of them. With none left, submit.";

/// The writer's system prompt. With a reasoned `prompt`, every example answer starts
/// with the `todo` it would follow (all five sections before any is written; for the
/// later actions `none`, or with `checklist` the entry the action does) and the rule
/// follows.
pub fn writer_system(prompt: Prompt) -> String {
    if !prompt.reasoned() {
        return WRITER_SYSTEM.to_string();
    }
    let checklist = prompt == Prompt::Checklist;
    let all = super::policies::WORK_ORDER.map(|s| SECTIONS[s]).join(", ");
    let mut s: Vec<String> = WRITER_SYSTEM
        .lines()
        .map(|l| match l.strip_prefix("{\"action\": ") {
            Some(rest) => {
                let todo = match rest.split('"').nth(1).unwrap_or("") {
                    "QUERY_LOGS" | "WRITE_SECTION" if checklist => format!("{all}, review"),
                    "QUERY_LOGS" | "WRITE_SECTION" => all.clone(),
                    "ASSIGN_ACTION_ITEM" if checklist => "item 1 of 3, review".into(),
                    "REQUEST_REVIEW" if checklist => "review".into(),
                    _ => "none".into(),
                };
                format!("{{\"todo\": \"{todo}\", \"action\": {rest}")
            }
            None => l.to_string(),
        })
        .collect();
    s.push(
        if checklist {
            CHECKLIST_RULE
        } else {
            REASONED_RULE
        }
        .to_string(),
    );
    s.join("\n")
}

pub const REVIEWER_SYSTEM: &str = "You are a skeptical senior reviewer of incident post-mortems. Read the draft and \
answer with one JSON object listing the critiques that apply, e.g. {\"critiques\": [\"evidence\", \"timeline\"]}.";

impl Postmortem {
    /// The writer's user message (`seat` 0) or the reviewer's (seat 1).
    pub fn user_prompt(&self, seat: usize) -> String {
        let mut s = String::with_capacity(4096);
        if seat == REVIEWER {
            self.write_reviewer(&mut s);
        } else {
            self.write_writer(&mut s);
        }
        s
    }

    fn write_bundle(&self, s: &mut String) {
        let sc = &self.scenario;
        // The id stays out of the prompt: ids of the embedded files name their cause.
        let _ = writeln!(s, "INCIDENT: {} ({})", sc.title, sc.date);
        s.push_str("\nALERTS\n");
        for a in &sc.alerts {
            let _ = writeln!(
                s,
                "{} [{}] {}: {}",
                a.time, a.severity, a.service, a.message
            );
        }
        s.push_str("\nSLACK\n");
        for m in &sc.slack {
            let _ = writeln!(s, "{} {}: {}", m.time, m.author, m.text);
        }
        s.push_str("\nSERVICES (name -> depends on)\n");
        for n in &sc.services {
            let _ = writeln!(
                s,
                "{} -> {}",
                n.name,
                if n.depends_on.is_empty() {
                    "-".into()
                } else {
                    n.depends_on.join(", ")
                }
            );
        }
    }

    fn write_writer(&self, s: &mut String) {
        let sc = &self.scenario;
        self.write_bundle(s);
        let _ = writeln!(
            s,
            "\nTEAMS: {} | due dates: within {} days of {}",
            sc.gold.teams.join(", "),
            sc.gold.due_within_days,
            sc.date
        );
        let _ = writeln!(
            s,
            "\nSTATUS step {}/{MAX_STEPS} | queries {}/{} (window <= {MAX_QUERY_MINUTES} min) | reviews {}",
            self.step,
            self.queries,
            sc.limits.max_queries,
            self.reviews.len()
        );
        let order = if self.rules.prompt.reasoned() {
            super::policies::WORK_ORDER
        } else {
            [0, 1, 2, 3, 4]
        };
        for i in order {
            let name = SECTIONS[i];
            let st = match &self.sections[i] {
                None => "unwritten",
                Some(_) if self.section_valid(i) => "valid",
                Some(_) => "invalid",
            };
            let _ = write!(s, "{name}: {st}  ");
        }
        if self.rules.prompt == Prompt::Checklist {
            let listed = self.listed_items();
            let _ = write!(
                s,
                "\naction items: {} assigned of {} listed in action_items",
                self.items.len(),
                listed.len()
            );
            match listed.get(self.items.len()) {
                Some(next) => {
                    let _ = writeln!(s, " | next item: {next}");
                }
                None => s.push('\n'),
            }
        } else {
            let _ = writeln!(s, "\naction items: {}", self.items.len());
        }
        if !self.evidence_seen.is_empty() {
            s.push_str("\nEVIDENCE FOUND\n");
            for l in &self.evidence_seen {
                let _ = writeln!(s, "{} {} {}: {}", l.time, l.service, l.level, l.message);
            }
        }
        let _ = writeln!(s, "\nLAST RESULT: {}", self.last_result);
        if !self.last_logs.is_empty() {
            for l in &self.last_logs {
                let _ = writeln!(s, "  {} {} {}: {}", l.time, l.service, l.level, l.message);
            }
        }
        s.push_str("\nYour next action (one JSON object):");
    }

    fn write_reviewer(&self, s: &mut String) {
        self.write_bundle(s);
        s.push_str("\nDRAFT\n");
        for (i, name) in SECTIONS.iter().enumerate() {
            let _ = writeln!(
                s,
                "## {name}\n{}",
                self.sections[i].as_deref().unwrap_or("(unwritten)")
            );
        }
        s.push_str("## assigned action items\n");
        for it in &self.items {
            let _ = writeln!(
                s,
                "- {} (owner {}, due {})",
                it.description, it.owner, it.due
            );
        }
        s.push_str("\nCRITIQUES you may raise:\n");
        for (id, text) in CHECKS {
            let _ = writeln!(s, "{id}: {text}");
        }
        let _ = write!(
            s,
            "\nAnswer {{\"critiques\": [...]}} with ids from: {}",
            check_ids()
        );
    }

    /// The public state for `concord envs play`.
    pub fn state_text(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "[{} {}] step {}/{MAX_STEPS} queries {}/{} (correct {}, wrong {}) sections {} items {} reviews {} shaping {:+.2}{}",
            self.scenario.level,
            self.scenario.id,
            self.step,
            self.queries,
            self.scenario.limits.max_queries,
            self.correct_queries,
            self.wrong_queries,
            (0..5).filter(|&i| self.section_valid(i)).count(),
            self.items.len(),
            self.reviews.len(),
            self.shaping,
            if self.done { " DONE" } else { "" }
        );
        let _ = write!(s, "  last: {}", self.last_result);
        s
    }
}

/// `concord envs describe postmortem`.
pub fn describe(rules: &super::Rules, scenarios: &[super::scenario::Scenario]) -> String {
    let levels: Vec<String> = scenarios
        .iter()
        .map(|s| format!("{} ({})", s.level, s.id))
        .collect();
    let lines: Vec<String> = vec![
        "postmortem: write an incident post-mortem from alerts, Slack and log queries (seed 003).".into(),
        String::new(),
        "SEATS".into(),
        "  0 = writer (the policy). 1 = reviewer: the scripted skeptic (default) or, with".into(),
        "  reviewer = \"policy\", the policy too (it acts only after REQUEST_REVIEW).".into(),
        "EPISODE".into(),
        format!("  one scenario per seed among: {}", levels.join(", ")),
        format!(
            "  source = {} (generated: the seeded generator renames services, shifts times,",
            rules.source.name()
        ),
        "  adds red-herring alerts and log noise; fixed: the files verbatim; mixed: either).".into(),
        format!("  {MAX_STEPS} writer steps; at the limit the draft is submitted automatically."),
        "ACTIONS (one JSON object per turn; invalid text = no-op, one step used, feedback)".into(),
        format!("  QUERY_LOGS {{service, from, to}}  HH:MM, window <= {MAX_QUERY_MINUTES} min. Correct when the"),
        "    service is relevant and overlaps an evidence window by its required minutes:".into(),
        "    +0.06 (first time) and the window's logs. Else wrong: escalating penalty".into(),
        "    (0.05, 0.08, 0.12, 0.18; expert 0.05, 0.10, 0.15, 0.20) and routine logs. Past".into(),
        "    the budget (8; expert 6) a query is refused and charged as wrong.".into(),
        "  WRITE_SECTION {section, content}  summary|timeline|root_cause|impact|action_items;".into(),
        "    first valid write +0.03; overwriting a valid section -0.02.".into(),
        "  ASSIGN_ACTION_ITEM {description, owner, due}  +0.08 when the owner is a known team".into(),
        "    and due a date within the deadline (first 6 items); at most 10 items.".into(),
        format!("  REQUEST_REVIEW  the reviewer raises critiques ({}); at most 2.", check_ids()),
        "  REVISE_SECTION {section, content}  rewrite a written section; no overwrite penalty".into(),
        "    after a review.".into(),
        "  SUBMIT  -0.10 per missing or invalid section, then the grade.".into(),
        "GRADE (the GRPO scalar; reward = \"return\" adds the shaping)".into(),
        "  0.30 root cause (service 0.40, or 0.15 if a planted false cause is named first;".into(),
        "  category 0.35; keywords 0.25; capped at 0.65 with a wrong service, at 0.60 when".into(),
        "  the timeline scores under 0.4) + 0.25 timeline (gold events within +-3 min)".into(),
        "  + 0.20 action items (owner 0.4, due 0.3, themes 0.3) + 0.15 impact (length,".into(),
        "  service, duration, scale) + 0.10 completeness + 0.10 x share of the review's".into(),
        format!(
            "  critiques addressed; clamped to [0, 1]. win = grade >= {}.",
            rules.win_threshold
        ),
        "  Reviewer seat (multi-agent): 0.5 x F1 of its critiques against the skeptic's".into(),
        "  + 0.5 x the grade.".into(),
        "POLICIES".into(),
        "  oracle (reads the gold standard), random (random valid actions), query_everything,".into(),
        "  evidence_bound (the continuation: writes from what was found, never queries).".into(),
        "  Baseline pools: the levels loaded.".into(),
        "OPTIONS".into(),
        "  level (all|easy|medium|hard|expert|list), source (generated|fixed|mixed), files".into(),
        "  (scenario JSON paths replacing the embedded ones), reviewer (scripted|policy),".into(),
        "  reward (grade|return), shaping (bool), continuation (policy), win_threshold,".into(),
        "  prompt (full|reasoned: answers start with \"todo\", the sections not yet valid;".into(),
        "  checklist: reasoned, and the todo goes on with the listed action items and the review).".into(),
        format!(
            "NOW reviewer = {}, reward = {}, shaping = {}, continuation = {}, prompt = {}",
            if rules.reviewer_policy { "policy" } else { "scripted" },
            if rules.reward_return { "return" } else { "grade" },
            rules.shaping,
            rules.continuation.name(),
            rules.prompt.name()
        ),
    ];
    lines.join("\n")
}

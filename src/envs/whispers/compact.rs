//! The compact prompt (option `prompt = "compact"`): the same facts as the full prompt
//! (task, step, role, neighbours, budget, fields and values, noise, private view,
//! received messages, record, legal tools) in fewer tokens. The tools are listed in
//! words, with no JSON placeholders (a small model copies `"target_id": N` literally),
//! and one concrete, well-formed answer of the seat's main tool is shown (for an editor:
//! a whole report with this event's fields), because a small model copies the shape of
//! what it is shown.

use super::parse::claim_text;
use super::rules::{claim_nonempty, mask_seats, Kind, Msg, Role, Whispers, FIELDS};
use super::PromptStyle;
use std::fmt::Write as _;

impl Whispers {
    pub(super) fn system_prompt_compact(&self, out: &mut String) {
        out.push_str(
            "Whispers: agents rebuild a hidden event from noisy and sometimes false messages. \
Witnesses see each field wrong with some probability; adversaries pose as witnesses and push a \
lie that is wrong in every field. Each step every agent makes one tool call; messages arrive next \
step.\nTools (parameters):\n\
- wait\n\
- send_message (target_id, content, confidence): a message to a neighbour\n\
- broadcast (content, confidence): a message to everyone\n\
- fact_check (content): the oracle answers TRUE or FALSE next step; uses budget\n\
- request_verify (target_id, content): a neighbour confirms or denies\n\
- accuse (target_id): name an adversary\n\
- publish (final_report): editor only, ends the episode; a value and a confidence per field\n\
content is field=value pairs separated by \";\"; a confidence is a number from 0 to 1.",
        );
        if !self.rules.prompt.reasoned() {
            out.push_str(" Answer with one JSON object: \"tool\" and the tool's parameters.");
        }
        out.push_str(
            "\nScore: accuracy and calibration of the report per field, F1 of accusations, \
finishing early; never pass on a false claim with confidence above 0.5.",
        );
        match self.rules.prompt {
            PromptStyle::Reasoned => {
                out.push('\n');
                out.push_str(REASONED_FORMAT);
            }
            PromptStyle::Checklist => {
                out.push('\n');
                out.push_str(CHECKLIST_FORMAT);
            }
            PromptStyle::Full | PromptStyle::Compact => {}
        }
    }

    /// The text of `seat`'s answer `a`: its JSON, after the working the heuristic reads
    /// the state with when the prompt is `reasoned`.
    pub(super) fn answer_text(&self, seat: usize, a: &super::rules::Action) -> String {
        let json = super::parse::action_json(a, self.template());
        if !self.rules.prompt.reasoned() {
            return json;
        }
        let b = self.beliefs(seat);
        let mut work = format!("{{\"step\":{},\"heard\":\"", self.step + 1);
        push_seats(&mut work, b.sources);
        work.push_str("\",\"liars\":\"");
        push_seats(&mut work, b.liars);
        if self.rules.prompt == PromptStyle::Checklist {
            work.push_str("\",\"accused\":\"");
            push_seats(&mut work, self.accused[seat]);
        }
        // Written by hand: the working must come before the tool (a JSON map sorts keys).
        format!("{work}\",{}", &json[1..])
    }

    /// The compact user prompt of `seat` (appends to `out`).
    pub(super) fn render_user_compact(&self, seat: usize, out: &mut String) {
        let spec = self.spec();
        let t = self.template();
        let role = self.role(seat);
        let nb = self.neighbours(seat);
        let _ = write!(
            out,
            "Task {}: {}\nStep {} of {}. You are agent {seat}, {} {}. Neighbours: ",
            spec.id,
            spec.description,
            self.step + 1,
            spec.max_steps,
            if matches!(role, Role::Adversary | Role::Editor) {
                "an"
            } else {
                "a"
            },
            role.name()
        );
        push_seats(out, nb);
        let _ = writeln!(out, ". Fact-checks left: {}.", self.budget[seat]);
        let _ = writeln!(out, "Fields ({}):", t.kind);
        for f in 0..FIELDS {
            let _ = writeln!(out, "{}: {}", t.fields[f], t.values[f].join(" | "));
        }
        let _ = writeln!(out, "Witness error per field: {:.2}.", spec.noise);
        if claim_nonempty(&self.view[seat]) {
            out.push_str(if role == Role::Adversary {
                "Your lie: "
            } else {
                "You saw: "
            });
            claim_text(&self.view[seat], t, out);
            out.push('\n');
        }
        let visible: Vec<&Msg> = self.msgs.iter().filter(|m| self.sees(seat, m)).collect();
        let limit = self.rules.history as usize;
        out.push_str("Received");
        if visible.len() > limit {
            let _ = write!(out, " (newest {limit} of {})", visible.len());
        }
        out.push_str(":\n");
        for m in visible.iter().skip(visible.len().saturating_sub(limit)) {
            self.render_msg(seat, m, out);
        }
        if visible.is_empty() {
            out.push_str("(nothing yet)\n");
        }
        out.push_str("You accused: ");
        push_seats(out, self.accused[seat]);
        out.push_str(". You asked to verify: ");
        push_seats(out, self.asked[seat]);
        let sent = self
            .msgs
            .iter()
            .filter(|m| m.from as usize == seat && matches!(m.kind, Kind::Dm | Kind::Broadcast))
            .count();
        let _ = writeln!(out, ". Messages sent: {sent}.");
        if let Some(fb) = self.last_feedback.get(seat).filter(|f| !f.is_empty()) {
            let _ = writeln!(out, "Your last answer was not used: {fb}");
        }
        let _ = writeln!(
            out,
            "Legal tools: {}. Answer with one JSON object, e.g.",
            self.legal_tools(seat).join(", ")
        );
        self.example_answer(seat, out);
    }

    /// One well-formed answer of the seat's main tool, with this event's fields and
    /// values drawn from the episode seed (not from what the seat has heard).
    fn example_answer(&self, seat: usize, out: &mut String) {
        let t = self.template();
        let v = |f: usize| t.values[f][((self.seed >> (2 * f)) % 4) as usize];
        out.push_str(match self.rules.prompt {
            PromptStyle::Reasoned => "{\"step\": 4, \"heard\": \"0, 3\", \"liars\": \"none\", ",
            PromptStyle::Checklist => {
                "{\"step\": 4, \"heard\": \"0, 3\", \"liars\": \"none\", \"accused\": \"none\", "
            }
            PromptStyle::Full | PromptStyle::Compact => "{",
        });
        if self.role(seat) == Role::Editor {
            out.push_str("\"tool\": \"publish\", \"final_report\": {");
            for f in 0..FIELDS {
                let _ = write!(
                    out,
                    "{}\"{}\": {{\"value\": \"{}\", \"confidence\": 0.{}}}",
                    if f > 0 { ", " } else { "" },
                    t.fields[f],
                    v(f),
                    [6, 7, 8, 9][(f + self.seed as usize) % 4]
                );
            }
            out.push_str("}}\n");
        } else if let Some(n) = mask_seats(self.neighbours(seat)).next() {
            let _ = writeln!(
                out,
                "\"tool\": \"send_message\", \"target_id\": {n}, \"content\": \"{}={}; {}={}\", \"confidence\": 0.7}}",
                t.fields[0],
                v(0),
                t.fields[1],
                v(1)
            );
        } else {
            out.push_str("\"tool\": \"wait\"}\n");
        }
    }
}

/// The reasoned answer format, at the end of the system prompt (shared by every
/// decision, so it costs one prefill per batch). The rule is the heuristic's: what it
/// reads is all on the page, and the working makes the model write it down before the
/// tool.
const REASONED_FORMAT: &str = "Answer with one JSON object: first \"step\", this step's number; \
\"heard\", the agents whose first-hand reports you received and trust; \"liars\", the agents \
that repeated an identical broadcast or that a fact-check contradicted (none if none); then \
\"tool\" and the tool's parameters. An editor waits until a report has arrived and it is step \
3 (step 4 in a task with adversaries), accuses each liar, fact-checks its least certain field \
while fact-checks are left, asks a trusted neighbour to verify where the task scores it, then \
publishes the values the trusted reports support, each at the confidence they give it.";

/// `checklist`'s format: the reasoned one, with the agents already accused copied
/// from the status before the tool, and the rule stated against that field.
const CHECKLIST_FORMAT: &str = "Answer with one JSON object: first \"step\", this step's number; \
\"heard\", the agents whose first-hand reports you received and trust; \"liars\", the agents \
that repeated an identical broadcast or that a fact-check contradicted (none if none); \"accused\", \
the agents you accused (copied from \"You accused\"); then \"tool\" and the tool's parameters. An \
editor waits until a report has arrived and it is step 3 (step 4 in a task with adversaries), \
accuses each liar that is not in \"accused\" (never one that is), fact-checks its least certain \
field while fact-checks are left, asks a trusted neighbour to verify where the task scores it, \
then publishes the values the trusted reports support, each at the confidence they give it.";

fn push_seats(out: &mut String, mask: u16) {
    let mut any = false;
    for (i, k) in mask_seats(mask).enumerate() {
        let _ = write!(out, "{}{k}", if i > 0 { ", " } else { "" });
        any = true;
    }
    if !any {
        out.push_str("none");
    }
}

#[cfg(test)]
mod tests {
    use super::super::{parse_action, Rules};
    use super::*;
    use crate::envs::{Environment, Options, Scripted};

    fn rules(task: &str, prompt: &str) -> Rules {
        let mut o = Options::new();
        o.insert("task".into(), task.into());
        o.insert("prompt".into(), prompt.into());
        Rules::from_options(&o).unwrap()
    }

    fn text(env: &Whispers, seat: usize) -> String {
        env.observation(seat)
            .iter()
            .map(|m| m.content.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Every step of heuristic play on every task: the compact prompt is shorter than the
    /// full one (at most two thirds of it before any message arrives: the messages are
    /// the same lines in both), and holds the same messages, fields, budget and legal
    /// tools.
    #[test]
    fn compact_prompt_keeps_the_facts_in_fewer_characters() {
        for task in ["t1", "t2", "t3", "t4", "t5", "t6"] {
            for seed in 0..3 {
                let mut full = Whispers::new(rules(task, "full"), seed);
                let mut short = Whispers::new(rules(task, "compact"), seed);
                while !full.done() {
                    let seat = full.policy_seats()[0];
                    let (f, c) = (text(&full, seat), text(&short, seat));
                    let bound = if full.step == 0 { 2.0 / 3.0 } else { 0.9 };
                    let ratio = c.len() as f64 / f.len() as f64;
                    assert!(ratio <= bound, "{task}: {} vs {}", c.len(), f.len());
                    let t = full.template();
                    let visible: Vec<_> = full.msgs.iter().filter(|m| full.sees(seat, m)).collect();
                    for m in visible {
                        let mut line = String::new();
                        full.render_msg(seat, m, &mut line);
                        assert!(c.contains(line.trim_end()), "{task}: {line} not in\n{c}");
                    }
                    for f in 0..FIELDS {
                        assert!(c.contains(&t.values[f].join(" | ")), "{c}");
                    }
                    assert!(c.contains(&format!("Fact-checks left: {}.", full.budget[seat])));
                    assert!(c.contains(&full.legal_tools(seat).join(", ")));
                    let a = full.continuation_action(seat);
                    full.step_texts(&[&a]).unwrap();
                    short.step_texts(&[&a]).unwrap();
                }
            }
        }
    }

    /// The example answer is well formed for the seat: it parses and is legal now.
    #[test]
    fn the_example_answer_is_a_legal_action() {
        let cases = [
            ("t1", "compact"),
            ("t3", "reasoned"),
            ("t4", "reasoned"),
            ("t5", "reasoned"),
            ("t5", "checklist"),
            ("t6", "compact"),
        ];
        for (task, prompt) in cases {
            for seed in 0..4 {
                let env = Whispers::new(rules(task, prompt), seed);
                let seat = env.policy_seats()[0];
                let mut ex = String::new();
                env.example_answer(seat, &mut ex);
                assert!(text(&env, seat).ends_with(&ex));
                let a = parse_action(&ex, env.template()).unwrap();
                env.validate(seat, &a).unwrap();
                if env.role(seat) == Role::Editor {
                    assert!(ex.contains("\"publish\""), "{ex}");
                }
            }
        }
    }

    /// `reasoned` answers write the step, the trusted sources and the liars the
    /// heuristic's beliefs hold, then the heuristic's own action; and the rule the system
    /// prompt states (an editor publishes only once it has heard a report and it is step
    /// 3, or 4 with adversaries, unless it is the last step) is the one it plays.
    #[test]
    fn reasoned_answers_show_the_heuristics_working_then_its_action() {
        let mut publishes = 0;
        for (task, prompt) in ["t1", "t2", "t3", "t4", "t5", "t6"]
            .into_iter()
            .flat_map(|t| [(t, "reasoned"), (t, "checklist")])
        {
            for seed in 0..6 {
                let mut env = Whispers::new(rules(task, prompt), seed);
                let mut plain = Whispers::new(rules(task, "compact"), seed);
                let seat = env.policy_seats()[0];
                assert!(text(&env, seat).contains("\"heard\", the agents"));
                assert!(!text(&plain, seat).contains("\"heard\""));
                while !env.done() {
                    let b = env.beliefs(seat);
                    let (mut heard, mut liars) = (String::new(), String::new());
                    push_seats(&mut heard, b.sources);
                    push_seats(&mut liars, b.liars);
                    let step = env.step + 1;
                    let a = env.continuation_action(seat);
                    let next = if prompt == "checklist" {
                        "accused"
                    } else {
                        "tool"
                    };
                    let want = format!(
                        "{{\"step\":{step},\"heard\":\"{heard}\",\"liars\":\"{liars}\",\"{next}\":"
                    );
                    assert!(a.starts_with(&want), "{a} vs {want}");
                    let b_plain = plain.continuation_action(seat);
                    assert_eq!(
                        parse_action(&a, env.template()),
                        parse_action(&b_plain, env.template()),
                        "{a} vs {b_plain}"
                    );
                    if env.role(seat) == Role::Editor && a.contains("\"publish\"") {
                        publishes += 1;
                        let ready = if env.spec().adversary_mask() != 0 {
                            4
                        } else {
                            3
                        };
                        let last = step as usize >= env.spec().max_steps as usize;
                        let received = !text(&env, seat).contains("(nothing yet)");
                        assert!(last || (step >= ready && received), "{task}: {a}");
                    }
                    env.step_texts(&[&a]).unwrap();
                    plain.step_texts(&[&b_plain]).unwrap();
                }
            }
        }
        assert!(publishes >= 25, "{publishes}");
    }
    /// `checklist` answers copy the status's "You accused" line before the tool, and
    /// the heuristic they demonstrate accuses exactly when a liar is missing from it:
    /// the comparison the reasoned student failed on t3 is between two fields of the
    /// answer. Checked on every adversarial task over heuristic play.
    #[test]
    fn checklist_answers_accuse_exactly_the_liars_not_yet_accused() {
        let (mut accusations, mut after_accusing) = (0, 0);
        for task in ["t3", "t5", "t6"] {
            for seed in 0..8 {
                let mut env = Whispers::new(rules(task, "checklist"), seed);
                let seat = env.policy_seats()[0];
                assert!(text(&env, seat).contains("\"accused\", the agents you accused"));
                while !env.done() {
                    let a = env.continuation_action(seat);
                    let (mut liars, mut accused) = (String::new(), String::new());
                    push_seats(&mut liars, env.beliefs(seat).liars);
                    push_seats(&mut accused, env.accused[seat]);
                    let status = format!("You accused: {accused}.");
                    assert!(text(&env, seat).contains(&status), "{task}: {status}");
                    let want = format!("\"liars\":\"{liars}\",\"accused\":\"{accused}\",\"tool\":");
                    assert!(a.contains(&want), "{a} vs {want}");
                    let missing = env.beliefs(seat).liars & !env.accused[seat] & !(1 << seat);
                    if a.contains("\"accuse\"") {
                        accusations += 1;
                        assert_ne!(missing, 0, "{task}: {a} accuses an accused liar");
                    } else if env.accused[seat] != 0 && env.step + 1 < env.spec().max_steps {
                        after_accusing += 1;
                        let ready = env.step >= 3 && env.newest_claim(seat).is_some();
                        assert!(!ready || missing == 0, "{task}: {a} leaves a liar");
                    }
                    env.step_texts(&[&a]).unwrap();
                }
            }
        }
        assert!(
            accusations >= 12 && after_accusing >= 12,
            "{accusations} {after_accusing}"
        );
    }
}

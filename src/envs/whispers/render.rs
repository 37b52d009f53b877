//! What seats and people read: the system and user prompts, the readable state, the
//! JSON transcript and `concord envs describe whispers`.

#![allow(clippy::needless_range_loop)]

use super::parse::claim_text;
use super::rules::{
    claim_nonempty, mask_seats, Kind, Mark, Msg, Role, Source, Whispers, FIELDS, NONE, TASKS,
    VALUES,
};
use super::{Rules, OPTION_KEYS, POLICIES};
use serde_json::{json, Value};
use std::fmt::Write as _;

fn push_num(out: &mut String, x: i64) {
    let _ = write!(out, "{x}");
}

fn push_conf(out: &mut String, c: f32) {
    let _ = write!(out, "{:.2}", c);
}

impl Whispers {
    /// The system prompt (the same for every seat of one task).
    pub fn system_prompt(&self, out: &mut String) {
        out.push_str(
            "You are one agent in Whispers, a newsroom network that must reconstruct a hidden \
event from noisy, conflicting and sometimes deliberately false messages. Witnesses see the event \
through a noisy channel; relays only know what their neighbours tell them; adversaries know a \
false version (the lie changes every field) and pose as witnesses; the editor publishes the final \
report with a confidence per field. Every step every agent makes exactly one tool call at the same \
time; what is sent in a step arrives at the start of the next.\n\nTools:\n\
- send_message {target_id, content, claimed_source, confidence}: a direct message to a neighbour.\n\
- broadcast {content, claimed_source, confidence}: a message every agent sees.\n\
- fact_check {content}: ask the oracle whether the claim's field=value pairs are all true \
(uses budget; the verdict arrives next step).\n\
- request_verify {target_id, content}: ask a neighbour to confirm or deny a claim (honest agents \
answer truthfully from what they know; liars lie).\n\
- accuse {target_id}: publicly name an agent as an adversary.\n\
- publish {final_report}: editor only; ends the episode.\n\
- wait: do nothing this step.\n\
Content is a claim written as field=value pairs separated by semicolons.\n\n\
Scoring: the published report is scored per field with a Brier rule (a missing field is the \
worst score) and for calibration (stated confidences should match how often you are right); \
accusations are scored by F1 against the real adversaries; verifying with an honest peer before \
publishing, finishing early, and never forwarding a false claim with confidence above 0.5 also \
count.",
        );
    }

    fn push_claim_or_text(&self, m: &Msg, out: &mut String) {
        if claim_nonempty(&m.claim) {
            claim_text(&m.claim, self.template(), out);
        } else if let Some(t) = self.texts.get(m.text as usize) {
            out.push('"');
            out.push_str(t);
            out.push('"');
        } else {
            out.push_str("(nothing)");
        }
    }

    fn push_source(&self, m: &Msg, out: &mut String) {
        match m.source {
            Source::Role => out.push_str(self.role(m.from as usize).name()),
            Source::Witness => out.push_str("witness"),
            Source::Relay => {
                out.push_str("relay, from agent ");
                push_num(out, m.origin as i64);
            }
            Source::Oracle => out.push_str("oracle"),
            Source::Text(i) => out.push_str(self.texts.get(i as usize).map_or("?", |t| t.as_str())),
        }
    }

    /// One message as `seat` reads it.
    pub(super) fn render_msg(&self, seat: usize, m: &Msg, out: &mut String) {
        out.push_str("[step ");
        push_num(out, m.turn as i64);
        out.push_str("] ");
        match m.kind {
            Kind::Dm | Kind::Broadcast => {
                out.push_str(if m.kind == Kind::Dm {
                    "message from agent "
                } else {
                    "broadcast by agent "
                });
                push_num(out, m.from as i64);
                out.push_str(" (says source: ");
                self.push_source(m, out);
                out.push_str(", confidence ");
                push_conf(out, m.conf);
                out.push_str("): ");
                self.push_claim_or_text(m, out);
            }
            Kind::VerifyRequest => {
                out.push_str("agent ");
                push_num(out, m.from as i64);
                out.push_str(" asks you to verify: ");
                claim_text(&m.claim, self.template(), out);
            }
            Kind::VerifyReply(marks) => {
                out.push_str("agent ");
                push_num(out, m.from as i64);
                out.push_str(" answers your verification request:");
                let t = self.template();
                for (f, mk) in marks.iter().enumerate() {
                    let w = match mk {
                        Mark::None => continue,
                        Mark::Confirm => "confirms",
                        Mark::Deny => "denies",
                        Mark::Unknown => "does not know",
                    };
                    out.push(' ');
                    out.push_str(t.fields[f]);
                    out.push(' ');
                    out.push_str(w);
                    out.push(';');
                }
                if claim_nonempty(&m.claim) {
                    out.push_str(" their version: ");
                    claim_text(&m.claim, t, out);
                }
            }
            Kind::FactCheck(v) => {
                out.push_str("fact-check verdict ");
                out.push_str(if v { "TRUE" } else { "FALSE" });
                out.push_str(" for: ");
                claim_text(&m.claim, self.template(), out);
            }
            Kind::Accusation => {
                out.push_str("agent ");
                push_num(out, m.from as i64);
                out.push_str(" publicly accuses ");
                if m.to as usize == seat {
                    out.push_str("YOU");
                } else {
                    out.push_str("agent ");
                    push_num(out, m.to as i64);
                }
                out.push_str(" of being an adversary");
            }
        }
        out.push('\n');
    }

    /// The user prompt of `seat` (appends to `out`).
    pub fn render_user(&self, seat: usize, out: &mut String) {
        let spec = self.spec();
        let t = self.template();
        let role = self.role(seat);
        out.push_str("Task ");
        out.push_str(spec.id);
        out.push_str(" (");
        out.push_str(spec.name);
        out.push_str("): ");
        out.push_str(spec.description);
        out.push_str("\nStep ");
        push_num(out, self.step as i64 + 1);
        out.push_str(" of ");
        push_num(out, spec.max_steps as i64);
        out.push_str(". You are agent ");
        push_num(out, seat as i64);
        out.push_str(if matches!(role, Role::Adversary | Role::Editor) {
            ", an "
        } else {
            ", a "
        });
        out.push_str(role.name());
        out.push_str(match role {
            Role::Editor => ": publish an accurate, calibrated report; accuse the liars.",
            Role::Relay => ": pass on what is true, do not spread lies; accuse the liars.",
            Role::Witness => ": share what you saw, honestly and with honest confidence.",
            Role::Adversary => {
                ": you win if the editor publishes the lie and nobody honest accuses you."
            }
        });
        out.push_str("\nAgents: 0..");
        push_num(out, spec.seats() as i64 - 1);
        out.push_str(". Your neighbours (send_message / request_verify): ");
        let nb = self.neighbours(seat);
        if nb == 0 {
            out.push_str("none");
        }
        for (i, k) in mask_seats(nb).enumerate() {
            if i > 0 {
                out.push_str(", ");
            }
            push_num(out, k as i64);
        }
        out.push_str(".\nFact-check budget left: ");
        push_num(out, self.budget[seat] as i64);
        out.push_str(".\nEvent type: ");
        out.push_str(t.kind);
        out.push_str(". Fields and their possible values:\n");
        for f in 0..FIELDS {
            out.push_str("- ");
            out.push_str(t.fields[f]);
            out.push_str(": ");
            out.push_str(&t.values[f].join(" | "));
            out.push('\n');
        }
        out.push_str("A witness sees each field wrong with probability ");
        let _ = write!(out, "{:.2}", spec.noise);
        out.push_str("; a lie is wrong in every field.\n");
        if claim_nonempty(&self.view[seat]) {
            out.push_str(if role == Role::Adversary {
                "The lie you are pushing: "
            } else {
                "What you saw (your private view): "
            });
            claim_text(&self.view[seat], t, out);
            out.push('\n');
        }
        // Messages this seat sees, newest `history`.
        let mut shown = 0usize;
        let limit = self.rules.history as usize;
        let visible: Vec<&Msg> = self.msgs.iter().filter(|m| self.sees(seat, m)).collect();
        out.push_str("\nMessages you have received");
        if visible.len() > limit {
            out.push_str(" (newest ");
            push_num(out, limit as i64);
            out.push_str(" of ");
            push_num(out, visible.len() as i64);
            out.push(')');
        }
        out.push_str(":\n");
        for m in visible.iter().skip(visible.len().saturating_sub(limit)) {
            self.render_msg(seat, m, out);
            shown += 1;
        }
        if shown == 0 {
            out.push_str("(none yet)\n");
        }
        out.push_str("\nYour record: accused ");
        list_mask(out, self.accused[seat]);
        out.push_str("; asked to verify ");
        list_mask(out, self.asked[seat]);
        out.push_str("; fact-checks used ");
        push_num(out, self.checks_used[seat] as i64);
        let sent = self
            .msgs
            .iter()
            .filter(|m| m.from as usize == seat && matches!(m.kind, Kind::Dm | Kind::Broadcast))
            .count();
        out.push_str("; messages sent ");
        push_num(out, sent as i64);
        out.push_str(".\n");
        if let Some(fb) = self.last_feedback.get(seat).filter(|f| !f.is_empty()) {
            out.push_str("Your last answer was not used: ");
            out.push_str(fb);
            out.push('\n');
        }
        out.push_str("\nLegal tools now: ");
        out.push_str(&self.legal_tools(seat).join(", "));
        out.push_str(".\nAnswer with exactly one JSON object and nothing else. Examples:\n");
        let first_nb = mask_seats(nb).next().unwrap_or(0);
        let mut ex = String::new();
        ex.push_str(t.fields[0]);
        ex.push('=');
        ex.push_str(t.values[0][(self.seed % 4) as usize]);
        ex.push_str("; ");
        ex.push_str(t.fields[1]);
        ex.push('=');
        ex.push_str(t.values[1][((self.seed / 4) % 4) as usize]);
        if role == Role::Editor {
            let _ = writeln!(
                out,
                "{{\"tool\": \"publish\", \"final_report\": {{\"{}\": {{\"value\": \"{}\", \"confidence\": 0.8}}, \"{}\": {{\"value\": \"{}\", \"confidence\": 0.6}}, \"{}\": {{\"value\": \"{}\", \"confidence\": 0.9}}, \"{}\": {{\"value\": \"{}\", \"confidence\": 0.7}}}}}}",
                t.fields[0],
                t.values[0][(self.seed % 4) as usize],
                t.fields[1],
                t.values[1][((self.seed / 4) % 4) as usize],
                t.fields[2],
                t.values[2][((self.seed / 16) % 4) as usize],
                t.fields[3],
                t.values[3][((self.seed / 64) % 4) as usize],
            );
        }
        if nb != 0 {
            let _ = writeln!(
                out,
                "{{\"tool\": \"send_message\", \"target_id\": {first_nb}, \"content\": \"{ex}\", \"confidence\": 0.7}}"
            );
        }
        if self.budget[seat] > 0 {
            let _ = writeln!(
                out,
                "{{\"tool\": \"fact_check\", \"content\": \"{}={}\"}}",
                t.fields[2],
                t.values[2][((self.seed / 16) % 4) as usize]
            );
        }
        let accuse_target = (seat + 1) % spec.seats();
        let _ = writeln!(
            out,
            "{{\"tool\": \"accuse\", \"target_id\": {accuse_target}}}"
        );
        out.push_str("{\"tool\": \"wait\"}\n");
    }

    /// The public state for people (`concord envs play`).
    pub fn write_state(&self, out: &mut String) {
        let spec = self.spec();
        let t = self.template();
        let _ = writeln!(
            out,
            "task {} ({}), step {}/{}{}; policy seats {:?}",
            spec.id,
            spec.name,
            self.step,
            spec.max_steps,
            if self.done { ", done" } else { "" },
            (0..spec.seats())
                .filter(|&s| self.is_policy(s))
                .collect::<Vec<_>>()
        );
        let mut s = String::new();
        claim_text(&self.truth, t, &mut s);
        let _ = writeln!(out, "truth ({}): {s}", t.kind);
        s.clear();
        claim_text(&self.lie, t, &mut s);
        let _ = writeln!(out, "lie: {s}");
        for (i, r) in spec.roles.iter().enumerate() {
            let _ = write!(out, "  agent {i}: {}", r.name());
            if claim_nonempty(&self.view[i]) && *r == Role::Witness {
                s.clear();
                claim_text(&self.view[i], t, &mut s);
                let _ = write!(out, " sees {s}");
            }
            out.push('\n');
        }
        for m in self.msgs.iter().filter(|m| m.turn + 1 == self.step) {
            let to = m.to;
            out.push_str("  ");
            if m.kind == Kind::Dm || matches!(m.kind, Kind::VerifyRequest | Kind::VerifyReply(_)) {
                let _ = write!(out, "-> {to} ");
            }
            let reader = if m.kind == Kind::Accusation {
                usize::MAX
            } else {
                to as usize
            };
            self.render_msg(reader, m, out);
        }
        if let Some((who, r)) = self.report {
            let _ = write!(out, "published by agent {who}:");
            for f in 0..FIELDS {
                if r.values[f] < VALUES as u8 {
                    let _ = write!(
                        out,
                        " {}={} ({:.2}){}",
                        t.fields[f],
                        t.values[f][r.values[f] as usize],
                        r.conf[f],
                        if r.values[f] == self.truth[f] {
                            ""
                        } else {
                            " WRONG"
                        }
                    );
                } else {
                    let _ = write!(out, " {}=MISSING", t.fields[f]);
                }
            }
            out.push('\n');
        }
    }

    /// The replayable transcript.
    pub fn to_transcript(&self) -> Value {
        let t = self.template();
        let claim = |c: &[u8; FIELDS]| {
            let mut m = serde_json::Map::new();
            for f in 0..FIELDS {
                if c[f] < VALUES as u8 {
                    m.insert(t.fields[f].into(), t.values[f][c[f] as usize].into());
                }
            }
            Value::Object(m)
        };
        let msgs: Vec<Value> = self
            .msgs
            .iter()
            .map(|m| {
                let mut s = String::new();
                self.render_msg(
                    if m.to == NONE {
                        usize::MAX
                    } else {
                        m.to as usize
                    },
                    m,
                    &mut s,
                );
                json!({
                    "turn": m.turn,
                    "from": m.from,
                    "to": if m.to == NONE { Value::Null } else { m.to.into() },
                    "text": s.trim_end(),
                })
            })
            .collect();
        let report = self.report.map(|(who, r)| {
            let mut m = serde_json::Map::new();
            for f in 0..FIELDS {
                if r.values[f] < VALUES as u8 {
                    m.insert(
                        t.fields[f].into(),
                        json!({"value": t.values[f][r.values[f] as usize], "confidence": r.conf[f]}),
                    );
                }
            }
            json!({"by": who, "report": m})
        });
        let rewards: Vec<Value> = (0..self.seats())
            .filter(|&s| self.is_policy(s))
            .map(|s| json!({"seat": s, "reward": self.reward_of(s)}))
            .collect();
        json!({
            "env": super::NAME,
            "seed": self.seed,
            "task": self.spec().id,
            "seat": self.rules.seat.name(),
            "policy_seats": (0..self.seats()).filter(|&s| self.is_policy(s)).collect::<Vec<_>>(),
            "roles": self.spec().roles.iter().map(|r| r.name()).collect::<Vec<_>>(),
            "event": t.kind,
            "truth": claim(&self.truth),
            "lie": claim(&self.lie),
            "step": self.step,
            "done": self.done,
            "messages": msgs,
            "published": report,
            "rewards": rewards,
            "steps": self.raw,
        })
    }
}

fn list_mask(out: &mut String, m: u16) {
    if m == 0 {
        out.push_str("nobody");
        return;
    }
    for (i, s) in mask_seats(m).enumerate() {
        if i > 0 {
            out.push(',');
        }
        push_num(out, s as i64);
    }
}

/// `concord envs describe whispers`.
pub fn describe(rules: &Rules) -> String {
    let mut s = String::new();
    s.push_str(
        "whispers: information triage among witnesses, relays, adversaries and an editor \
(port of the Whispers OpenEnv environment, seed 004).\n\n",
    );
    s.push_str("Tasks (P = the protagonist seat the policy holds by default):\n");
    for t in &TASKS {
        let _ = writeln!(
            s,
            "  {} {:<25} roles {:<26} edges {:<40} P={} noise {:.2} budget {} steps {}",
            t.id,
            t.name,
            t.roles
                .iter()
                .map(|r| r.name())
                .collect::<Vec<_>>()
                .join(","),
            t.edges
                .iter()
                .map(|(a, b)| format!("{a}-{b}"))
                .collect::<Vec<_>>()
                .join(" "),
            t.protagonist,
            t.noise,
            t.budget,
            t.max_steps
        );
    }
    s.push_str(
        "\nEvents: 4 templates x 4 fields x 4 values; witnesses see each field wrong with \
probability `noise`; all adversaries push one lie that is wrong in every field.\n\
Every step all seats act at once (one tool call each); messages arrive next step. Scripted \
witnesses DM their view at step 0 (0.85) and broadcast it at step 1 (0.80); adversaries \
broadcast the lie on even steps (0.90) and DM it on odd steps (0.92) posing as witnesses; relays \
forward the newest unforwarded claim at 0.9x confidence naming its origin; scripted honest seats \
answer request_verify from what they believe, adversaries from the lie.\n\n\
Actions: one JSON object {\"tool\": ..., params}: send_message {target_id, content, \
claimed_source, confidence}, broadcast {content, claimed_source, confidence}, fact_check \
{content} (budget; TRUE iff the claim's field=value pairs are a non-empty subset of the truth), \
request_verify {target_id, content}, accuse {target_id}, publish {final_report: {field: {value, \
confidence}}} (editor only; ends the episode), wait. Content: `field=value; field=value` or an \
object. Invalid or illegal answers play wait (valid = false, feedback says why).\n\n\
Reward (per seat; scalar = value in [0,1]): truth = mean 1 - Brier/2 over the 4 fields (value \
at its confidence, the rest spread over the other values; missing = 0); calibration = 1 - \
binned ECE (10 bins; missing = error 1); adversary_f1 = F1 of accusations; coalition = asked an \
honest seat to verify (then published, for an editor); efficiency = 1 - steps/limit; cascade = \
highest confidence > 0.5 of a sent claim with a false field. Protagonist weights per task: t1 \
.70 truth .20 cal .10 eff; t2 .55/.35/.10; t3 .45 truth .20 cal .25 f1 .10 eff -.20 cascade; \
t4 .55(1-cascade) .35 f1 .10 eff; t5 .40 truth .20 cal .15 f1 .10 coalition .10 eff -.15 \
cascade; t6 .25 truth .55 cal .10 f1 .10 eff -.20 cascade. Other honest seats: team weights \
(.40 truth .10 cal of the report, .15 f1 .10 coalition .10 eff, .15(1-cascade)); adversaries: \
.65 lie alignment of the report + .35 undetected. win = value >= win_threshold.\n\
Step rewards: shaping (+0.02 fact_check of a contested claim, +0.05 first request_verify to each \
scripted seat, -0.05 repeated identical broadcast, -0.10 publish with contradictions and an \
unused fact-check budget) plus the final value on the last step.\n\n",
    );
    let _ = writeln!(
        s,
        "Options: {} (current: task={}, seat={}, shaping={}, weights={}, win_threshold={}, \
continuation={}, history={}, prompt={}).\n  task: t1..t6, \"all\" or a list (a pool: the task is drawn \
per seed); seat: protagonist | witness | relay | adversary | editor | self_play | seat number; \
prompt: full | compact (the same facts in about half the tokens, one example answer) | \
reasoned (compact; the answer first writes the step, the reports heard and the liars) | \
checklist (reasoned, and the answer also copies the agents already accused).",
        OPTION_KEYS.join(", "),
        rules.tasks.name(),
        rules.seat.name(),
        rules.shaping.verify != 0.0,
        if rules.headline_weights {
            "headline"
        } else {
            "task"
        },
        rules.win_threshold,
        rules.continuation.name(),
        rules.history,
        rules.prompt.name()
    );
    let _ = writeln!(
        s,
        "Policies: {}. Baseline pools are the tasks t1..t6 (the row's `peers` field names the \
task).",
        POLICIES.map(|(n, _)| n).join(", ")
    );
    s
}

//! What engineers and people read: the system and user prompts, the readable state,
//! the JSON transcript and `concord envs describe ticketmelt`.

#![allow(clippy::needless_range_loop)]

use super::parse::answer_json;
use super::rules::{Msg, Outcome, SeatKind, Ticketmelt};
use super::Action;
use super::{PromptStyle, Rules, UrgentFailure, SEATS, SERVICES};
use serde_json::{json, Value};
use std::fmt::Write as _;

impl Ticketmelt {
    /// The system prompt (the same for every seat and round of one rule set).
    pub fn system_prompt(&self, out: &mut String) {
        match self.rules.prompt {
            PromptStyle::Full => self.system_prompt_full(out),
            PromptStyle::Compact | PromptStyle::Reasoned => self.system_prompt_compact(out),
        }
    }

    /// Render the user prompt of `seat` into `out` (appends).
    pub fn render_user(&self, seat: usize, out: &mut String) {
        match self.rules.prompt {
            PromptStyle::Full => self.render_user_full(seat, out),
            PromptStyle::Compact | PromptStyle::Reasoned => self.render_user_compact(seat, out),
        }
    }

    /// What a scripted answer of `seat` says: with the full prompt a JSON object with a
    /// stock channel line, with the compact one the commitment alone (what its prompt
    /// asks for).
    pub fn answer_text(&self, seat: usize, a: Action) -> String {
        match self.rules.prompt {
            PromptStyle::Full => answer_json(a, &canned_line(self.service[seat], a)),
            PromptStyle::Compact => serde_json::json!({ "commitment": a.as_str() }).to_string(),
            PromptStyle::Reasoned => self.reasoned_answer(seat, a),
        }
    }

    fn system_prompt_full(&self, out: &mut String) {
        out.push_str(
            "You are an on-call engineer during a ticket-presale meltdown. Four engineers each \
own one broken service and share two production servers, PROD_A and PROD_B. Every round all \
four commit at the same time, without seeing the others' choices: deploy your fix to PROD_A, \
deploy it to PROD_B, or MONITOR. A lone deploy on a server counts as one successful deploy; \
if two or more engineers deploy to the same server in the same round they collide and nobody \
on that server makes progress.",
        );
        if self.rules.degrade {
            out.push_str(" A server that had a collision is degraded for the next round: a deploy there fails.");
        }
        out.push_str(" Your service is restored once your successful deploys reach its fix count; restore it by its deadline.");
        if self.rules.urgent_failure != UrgentFailure::Off {
            out.push_str(
                " One service is urgent; if it misses its deadline the whole site fails, and anyone who \
collided with the urgent engineer shares the blame.",
            );
        }
        out.push_str(
            " You are rewarded for restoring your own service on time, for the whole team's uptime, \
for clean (collision-free) deploys and for yielding to engineers whose deadlines are tighter. \
Your channel message is shown to everybody next round.",
        );
    }

    fn render_user_full(&self, seat: usize, out: &mut String) {
        let r = self.round as usize;
        let t = self.rules.rounds as usize;
        out.push_str("Round ");
        push_num(out, (r + 1).min(t) as i64);
        out.push_str(" of ");
        push_num(out, t as i64);
        out.push_str(".\nYou are engineer ");
        push_num(out, seat as i64 + 1);
        out.push_str(", on call for ");
        out.push_str(SERVICES[self.service[seat] as usize]);
        out.push_str(".\n");
        if self.completed[seat] > 0 {
            out.push_str("Your service is restored (round ");
            push_num(out, self.completed[seat] as i64);
            out.push_str(if self.on_time(seat) {
                ", on time). MONITOR keeps you out of the others' way.\n"
            } else {
                ", late). MONITOR keeps you out of the others' way.\n"
            });
        } else {
            out.push_str("Your fix needs ");
            push_num(out, self.rem[seat] as i64);
            out.push_str(" more successful deploy");
            if self.rem[seat] != 1 {
                out.push('s');
            }
            out.push_str(" (of ");
            push_num(out, self.fix[seat] as i64);
            out.push_str("). Deadline: end of round ");
            push_num(out, self.deadline[seat] as i64);
            out.push_str(" (");
            let left = self.deadline[seat] as i64 - r as i64;
            push_num(out, left.max(0));
            out.push_str(" rounds left including this one; spare rounds: ");
            push_num(out, self.spare(seat) as i64);
            out.push_str(").\n");
        }
        if seat == self.urgent as usize {
            out.push_str(
                "Urgency: HIGH. Your service is this episode's urgent one (only you know).\n",
            );
        } else {
            out.push_str("Urgency: normal.\n");
        }
        out.push_str("Servers this round: PROD_A ");
        out.push_str(if self.degraded(0) {
            "DEGRADED (a deploy fails)"
        } else {
            "ok"
        });
        out.push_str(", PROD_B ");
        out.push_str(if self.degraded(1) {
            "DEGRADED (a deploy fails)"
        } else {
            "ok"
        });
        out.push_str(".\n\nTeam:\n");
        for k in 0..SEATS {
            if k == seat {
                continue;
            }
            out.push_str("- engineer ");
            push_num(out, k as i64 + 1);
            out.push_str(" (");
            out.push_str(SERVICES[self.service[k] as usize]);
            out.push_str("): ");
            if self.completed[k] > 0 {
                out.push_str("restored in round ");
                push_num(out, self.completed[k] as i64);
                out.push('\n');
            } else {
                push_num(out, self.rem[k] as i64);
                out.push_str(if self.rem[k] == 1 {
                    " deploy left, deadline round "
                } else {
                    " deploys left, deadline round "
                });
                push_num(out, self.deadline[k] as i64);
                out.push_str(", spare ");
                push_num(out, self.spare(k) as i64);
                out.push('\n');
            }
        }
        let hist = (self.rules.history_rounds as usize).min(r);
        if hist > 0 {
            out.push_str("\nRecent rounds:\n");
            for pr in r - hist..r {
                self.render_round(pr, Some(seat), out);
            }
        }
        out.push_str(
            "\nOptions (choose exactly one commitment):\n- DEPLOY_PROD_A: push your fix to PROD_A\n\
- DEPLOY_PROD_B: push your fix to PROD_B\n- MONITOR: do not deploy this round\n\n\
Answer with one JSON object and nothing else, for example:\n{\"channel_msg\": \"",
        );
        let ex = [Action::DeployB, Action::Monitor, Action::DeployA]
            [(r + seat + self.seed as usize % 3) % 3];
        out.push_str(match ex {
            Action::DeployA => "taking PROD_A this round\", \"commitment\": \"DEPLOY_PROD_A\"}",
            Action::DeployB => "taking PROD_B this round\", \"commitment\": \"DEPLOY_PROD_B\"}",
            Action::Monitor => "holding this round\", \"commitment\": \"MONITOR\"}",
        });
        out.push('\n');
    }

    /// One played round as text (`viewer` marks "you").
    fn render_round(&self, pr: usize, viewer: Option<usize>, out: &mut String) {
        out.push_str("Round ");
        push_num(out, pr as i64 + 1);
        out.push(':');
        for k in 0..SEATS {
            out.push_str(if k == 0 { " " } else { "; " });
            if viewer == Some(k) {
                out.push_str("you");
            } else {
                out.push('e');
                push_num(out, k as i64 + 1);
            }
            out.push(' ');
            out.push_str(self.acts[pr][k].as_str());
        }
        out.push_str(".\n");
        for (server, name) in ["  PROD_A: ", "  PROD_B: "].iter().enumerate() {
            out.push_str(name);
            match self.outcomes[pr][server] {
                Outcome::Idle => out.push_str("idle"),
                Outcome::Collision => out.push_str("COLLISION, nobody progressed"),
                Outcome::Success(w) => {
                    out.push_str("successful deploy by ");
                    self.push_who(w as usize, viewer, out);
                }
                Outcome::Degraded(w) => {
                    out.push_str("degraded, deploy by ");
                    self.push_who(w as usize, viewer, out);
                    out.push_str(" failed");
                }
            }
            out.push('\n');
        }
        for k in 0..SEATS {
            let m = self.msgs[pr][k];
            if m == Msg::None {
                continue;
            }
            out.push_str("  ");
            self.push_who(k, viewer, out);
            out.push_str(" said: \"");
            match m {
                Msg::None => {}
                Msg::Text(i) => out.push_str(&self.texts[i as usize]),
                Msg::Canned => self.canned(pr, k, out),
            }
            out.push_str("\"\n");
        }
    }

    fn push_who(&self, k: usize, viewer: Option<usize>, out: &mut String) {
        if viewer == Some(k) {
            out.push_str("you");
        } else {
            out.push('e');
            push_num(out, k as i64 + 1);
        }
    }

    /// A scripted engineer's stock channel line for round `pr`.
    fn canned(&self, pr: usize, k: usize, out: &mut String) {
        if self.rules.urgent_hints && k == self.urgent as usize && !self.is_policy(k) {
            out.push_str("URGENT, ");
            out.push_str(SERVICES[self.service[k] as usize]);
            out.push_str(" is critical. ");
        }
        out.push_str(SERVICES[self.service[k] as usize]);
        let done_before = self.completed[k] > 0 && (self.completed[k] as usize) <= pr;
        out.push_str(match (self.acts[pr][k], done_before) {
            (_, true) => ": restored, monitoring.",
            (Action::DeployA, _) => ": deploying to PROD_A.",
            (Action::DeployB, _) => ": deploying to PROD_B.",
            (Action::Monitor, _) => ": monitoring this round.",
        });
    }

    fn canned_string(&self, pr: usize, k: usize) -> String {
        let mut s = String::new();
        self.canned(pr, k, &mut s);
        s
    }

    /// Human-readable public state (all engineers, last round).
    pub fn write_state(&self, out: &mut String) {
        let _ = write!(out, "Round {}/{} played", self.round, self.rules.rounds);
        if self.is_done() {
            out.push_str(" (episode over)");
        }
        out.push('\n');
        for k in 0..SEATS {
            let who = match self.kinds[k] {
                SeatKind::Policy => "policy".to_string(),
                SeatKind::Peer(p) => format!(
                    "{}{}",
                    p.name(),
                    if self.mirror { " (mirrored)" } else { "" }
                ),
            };
            let _ = write!(
                out,
                "  e{} {:<9} [{}]{} fix {} left {} deadline {} ",
                k + 1,
                SERVICES[self.service[k] as usize],
                who,
                if k == self.urgent as usize {
                    " URGENT"
                } else {
                    ""
                },
                self.fix[k],
                self.rem[k],
                self.deadline[k]
            );
            if self.completed[k] > 0 {
                let _ = writeln!(
                    out,
                    "restored r{}{}",
                    self.completed[k],
                    if self.on_time(k) { "" } else { " (late)" }
                );
            } else {
                out.push_str("down\n");
            }
        }
        if self.round > 0 {
            self.render_round(self.round as usize - 1, None, out);
        }
    }

    pub(super) fn to_transcript(&self) -> Value {
        let seats: Vec<usize> = (0..SEATS).filter(|&s| self.is_policy(s)).collect();
        let mut steps = Vec::new();
        let mut rounds = Vec::new();
        for pr in 0..self.round as usize {
            let texts: Vec<String> = seats
                .iter()
                .map(|&s| {
                    self.raw
                        .iter()
                        .find(|(rr, ss, _)| *rr as usize == pr && *ss as usize == s)
                        .map(|(_, _, t)| t.clone())
                        .unwrap_or_else(|| {
                            answer_json(self.acts[pr][s], &self.canned_string(pr, s))
                        })
                })
                .collect();
            steps.push(json!(texts));
            let msgs: Vec<Value> = (0..SEATS)
                .map(|k| match self.msgs[pr][k] {
                    Msg::None => Value::Null,
                    Msg::Text(i) => json!(self.texts[i as usize]),
                    Msg::Canned => json!(self.canned_string(pr, k)),
                })
                .collect();
            let out: Vec<Value> = self.outcomes[pr]
                .iter()
                .map(|o| match o {
                    Outcome::Idle => json!("idle"),
                    Outcome::Collision => json!("collision"),
                    Outcome::Success(w) => json!({"success": w}),
                    Outcome::Degraded(w) => json!({"degraded_fail": w}),
                })
                .collect();
            rounds.push(json!({
                "round": pr + 1,
                "actions": self.acts[pr].iter().map(|a| a.as_str()).collect::<Vec<_>>(),
                "outcomes": {"PROD_A": out[0], "PROD_B": out[1]},
                "messages": msgs,
            }));
        }
        let rewards: Vec<Value> = (0..SEATS)
            .map(|s| json!(self.reward_parts(s).to_reward().components))
            .collect();
        json!({
            "env": "ticketmelt",
            "seed": self.seed,
            "rules": self.rules.to_json(),
            "setup": {
                "services": self.service.iter().map(|&s| SERVICES[s as usize]).collect::<Vec<_>>(),
                "fix_rounds": self.fix,
                "deadlines": self.deadline,
                "urgent": self.urgent,
                "pool": self.pool.name(),
                "mirror": self.mirror,
                "seats": self.kinds.iter().map(|k| match k { SeatKind::Policy => "policy", SeatKind::Peer(p) => p.name() }).collect::<Vec<_>>(),
                "policy_seats": seats,
            },
            "steps": steps,
            "rounds": rounds,
            "done": self.is_done(),
            "rewards": rewards,
        })
    }
}

/// Append a small integer without `fmt` machinery.
#[inline]
fn push_num(out: &mut String, n: i64) {
    if n < 0 {
        out.push('-');
        push_num(out, -n);
    } else if n < 10 {
        out.push((b'0' + n as u8) as char);
    } else if n < 100 {
        out.push((b'0' + (n / 10) as u8) as char);
        out.push((b'0' + (n % 10) as u8) as char);
    } else {
        let _ = write!(out, "{n}");
    }
}

pub(super) fn canned_line(service: u8, a: Action) -> String {
    let mut s = String::from(SERVICES[service as usize]);
    s.push_str(match a {
        Action::DeployA => ": deploying to PROD_A.",
        Action::DeployB => ": deploying to PROD_B.",
        Action::Monitor => ": monitoring this round.",
    });
    s
}

/// `concord envs describe ticketmelt`.
pub fn describe(r: &Rules) -> String {
    let mut s = String::new();
    s.push_str(
        r#"TICKETMELT: four on-call engineers deploy fixes to two shared production servers.

RULES
- 4 engineers; services payments, database, cdn, auth shuffled. The policy holds seat 0
  (every seat with peers = "self_play"). `rounds` rounds.
- fix = uniform int in [1, min(max_fix, T-1)] solo deploys needed; deadline = uniform int in
  [max(3, fix+1), T] (1-based round by which the service must be restored).
- One engineer is urgent (shown only in their own prompt; scripted urgent peers hint in the
  channel when urgent_hints = true).
- Each round everybody commits at once: DEPLOY_PROD_A, DEPLOY_PROD_B or MONITOR, plus a
  channel message (200 chars) visible to all next round.
- Two or more deployers on one server collide: nobody there progresses. A lone deploy
  lowers that engineer's remaining fix count by 1; at 0 the service is restored.
- degrade = true: a server with a collision is degraded for the next round; a lone deploy
  there fails (counts as a collided deploy for R3).
- Ends when all services are restored or after T rounds. Scripted peers MONITOR once
  restored.

ACTIONS (answer text)
  {"channel_msg": "taking PROD_B this round", "commitment": "DEPLOY_PROD_B"}
  Parser: whole-text JSON object -> first balanced {...} containing "commitment" that
  parses -> first keyword in the order DEPLOY_PROD_A, DEPLOY_PROD_B, MONITOR -> MONITOR.
  An invalid or missing commitment inside a JSON object plays MONITOR. Well formed
  (reward component `format` = 1) only when a JSON object with a valid commitment
  (trimmed, case-insensitive) was found; otherwise the answer is malformed and, with
  malformed_zero = true, earns scalar reward 0. Only the first 16 KiB are read.

REWARD COMPONENTS (per seat, at the end)
  r1_own     1.0 own service on time, 0.3 late, 0 not restored
  r2_team    weighted share of services on time (urgent weighs urgent_weight); 0 on a
             site failure charged to the seat
  r3_safety  1 - collided deploys / deploys (0 if never deployed)
  r4_yield   yields / opportunities (0.5 if none): another engineer deploying with
             slack <= 1 while my slack is larger, slack = deadline-(round+1)-remaining;
             yield = MONITOR
  weighted   w1*r1 + w2*r2 + w3*r3 + w4*r4
  win        gated: r1 > 0.5 and weighted > win_threshold; weighted: weighted >
             win_threshold; 0 on a site failure charged to the seat
  format     1 if all of the seat's answers were well formed
  site_failure  1 if the urgent service missed its deadline and it is charged to the seat
             (urgent_failure: off | blame = the urgent engineer and anyone who collided
             with them | all)
  scalar     binary: win; weighted: weighted (times the format gate)

SCRIPTED POLICIES
  always_a, always_b, always_monitor, random, eager (A always), alternator (A on even
  rounds, B on odd), nervous (A when deadline - round <= remaining + 1, else MONITOR),
  heuristic (reads its deadline, urgency, degraded servers and the visible history:
  deploys where nobody is predicted, waits otherwise unless its deadline forces it).
  Peers may be mirrored (A <-> B) with probability peer_mirror per episode.
POOLS
  dumb = 3 x eager; diverse = eager, alternator, nervous; mixed = dumb with probability
  dumb_fraction else diverse; self_play = every seat is the policy.

PROMPTS
  prompt = full (default): prose rules, the recent rounds with outcomes and channel
  messages, a JSON answer with a channel message (~700 tokens). prompt = compact: terse
  rules and one line per engineer with their last moves (~300 tokens); the answer is
  {"commitment": "..."} alone. prompt = reasoned: the compact prompt, and an answer that
  first shows its working: {"next": "e2 A, e3 -, e4 B", "free": "none", "commitment":
  "..."} (each other engineer's expected move, the servers up with nobody expected).

PRESETS
  classic: the original code (no degrade, no mirror, urgent weight 1, no urgent failure,
  no hints, win_rule weighted, threshold 0.45, peers diverse).
  default: degrade, peer_mirror 0.5, urgent_weight 2, urgent_failure blame, hints,
  win_rule gated, threshold 0.35, peers mixed (dumb_fraction 0.7).

OPTIONS (current values)
"#,
    );
    if let Value::Object(m) = r.to_json() {
        for (k, v) in m {
            let _ = writeln!(s, "  {k:<15} = {v}");
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::super::*;
    use crate::envs::Environment;

    #[test]
    fn render_has_parts() {
        let ep = Ticketmelt::new(Rules::default_preset(), 7);
        let obs = ep.observation(0);
        assert_eq!(obs.len(), 2);
        let u = &obs[1].content;
        assert!(u.contains("Round 1 of 8"));
        assert!(u.contains("DEPLOY_PROD_B: push"));
        assert!(!u.contains("A|DEPLOY"));
    }
}

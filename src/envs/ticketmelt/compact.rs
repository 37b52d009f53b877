//! The compact prompt (option `prompt = "compact"`): the facts the full prompt gives,
//! and that the scripted heuristic decides on, in about a quarter of the tokens. Prefill
//! dominates sampling and training on a CPU, so a shorter prompt is the cheapest speed-up.
//!
//! What it keeps: the round, the seat's own work, deadline, spare rounds and urgency;
//! which servers are down; every other engineer's work, deadline, spare rounds, a
//! visible urgency hint and their moves in the last `history_rounds` rounds. What it
//! drops: the prose, channel messages (the hints they carried are shown as a flag) and
//! the per-server outcomes (a collision shows as the server being down).

use super::rules::Ticketmelt;
use super::{Action, PromptStyle, UrgentFailure, SEATS};
use std::fmt::Write as _;

impl Ticketmelt {
    pub(super) fn system_prompt_compact(&self, out: &mut String) {
        out.push_str(
            "Four on-call engineers each own one broken service and share two servers, A and B. \
Each round all four choose at once: DEPLOY_PROD_A, DEPLOY_PROD_B or MONITOR. A lone deploy on \
a server is one step of progress; two or more deploys on one server collide and nobody there \
progresses.",
        );
        if self.rules.degrade {
            out.push_str(" A server with a collision is DOWN next round: a deploy there fails.");
        }
        out.push_str(" Restore your service (0 steps left) by its deadline round.");
        if self.rules.urgent_failure != UrgentFailure::Off {
            out.push_str(" One service is urgent: if it is late the whole site fails.");
        }
        out.push_str(
            " You score for your service on time, the team's, clean deploys, and yielding \
(MONITOR) to engineers with less spare. Spare = rounds left including this one minus steps \
left. Moves: A, B, M (MONITOR).",
        );
        if self.rules.prompt == PromptStyle::Reasoned {
            out.push_str(REASONED_FORMAT);
        }
    }

    /// The reasoned answer of `seat` committing to `a`: the working the heuristic
    /// reads the state with (each other engineer's expected move, the servers up with
    /// nobody expected), then `a`.
    pub(super) fn reasoned_answer(&self, seat: usize, a: Action) -> String {
        let next: Vec<String> = (0..SEATS)
            .filter(|&k| k != seat)
            .map(|k| {
                let m = match self.expected_move(k) {
                    _ if self.completed[k] > 0 => '-',
                    None => '?',
                    Some(Action::Monitor) => '-',
                    Some(m) => move_letter(m),
                };
                format!("e{} {m}", k + 1)
            })
            .collect();
        let (pred, _) = self.predicted(seat);
        let free: String = (0..2)
            .filter(|&s| pred[s] == 0 && !self.degraded(s))
            .map(|s| ['A', 'B'][s])
            .collect();
        let free = if free.is_empty() { "none".into() } else { free };
        // Written by hand: the working must come before the commitment (a JSON map
        // would sort the keys), and every value is plain ASCII.
        format!(
            "{{\"next\": \"{}\", \"free\": \"{free}\", \"commitment\": \"{}\"}}",
            next.join(", "),
            a.as_str()
        )
    }

    pub(super) fn render_user_compact(&self, seat: usize, out: &mut String) {
        let r = self.round as usize;
        let t = self.rules.rounds as usize;
        let _ = writeln!(out, "Round {} of {t}.", (r + 1).min(t));
        out.push_str("You: ");
        self.push_work(seat, seat, out);
        out.push('\n');
        let state = |s: usize| if self.degraded(s) { "DOWN" } else { "ok" };
        let _ = writeln!(out, "Servers: A {}, B {}.", state(0), state(1));
        let hist = (self.rules.history_rounds as usize).min(r);
        if hist == 0 {
            out.push_str("Others (no moves yet):\n");
        } else if hist == 1 {
            let _ = writeln!(out, "Others (move in round {r}):");
        } else {
            let _ = writeln!(out, "Others (moves in rounds {}-{r}):", r - hist + 1);
        }
        for k in (0..SEATS).filter(|&k| k != seat) {
            let _ = write!(out, "e{}: ", k + 1);
            self.push_work(k, seat, out);
            if self.completed[k] == 0 && hist > 0 {
                out.push(';');
                for pr in r - hist..r {
                    out.push(' ');
                    out.push(move_letter(self.acts[pr][k]));
                }
            }
            out.push('\n');
        }
        if self.rules.prompt == PromptStyle::Reasoned {
            out.push_str("Reply with the JSON object only.\n");
            return;
        }
        out.push_str(
            "Reply with JSON only, one of:\n{\"commitment\": \"DEPLOY_PROD_A\"}\n\
{\"commitment\": \"DEPLOY_PROD_B\"}\n{\"commitment\": \"MONITOR\"}\n",
        );
    }

    /// `2 left, deadline 5, spare 1, URGENT` or `restored (round 3)` for seat `k` as
    /// `viewer` sees it (urgency only where the viewer can know it).
    fn push_work(&self, k: usize, viewer: usize, out: &mut String) {
        if self.completed[k] > 0 {
            let _ = write!(out, "restored (round {})", self.completed[k]);
            return;
        }
        let _ = write!(
            out,
            "{} left, deadline {}, spare {}",
            self.rem[k],
            self.deadline[k],
            self.spare(k)
        );
        if self.urgent_visible(k, viewer) {
            out.push_str(", URGENT");
        }
    }
}

/// The reasoned answer format, at the end of the system prompt (shared by every
/// decision, so it costs one prefill per batch).
const REASONED_FORMAT: &str = " Answer with one JSON object: \"next\": each other engineer's \
expected move (after A then B expect A, after B then A expect B, else their last move; - \
for M or restored, ? before any moves), \"free\": the servers that are up with nobody \
expected (A, B, AB or none), then \"commitment\": DEPLOY_PROD_A, DEPLOY_PROD_B or MONITOR. \
Example: {\"next\": \"e2 A, e3 -, e4 B\", \"free\": \"none\", \"commitment\": \"MONITOR\"}";

fn move_letter(a: Action) -> char {
    match a {
        Action::DeployA => 'A',
        Action::DeployB => 'B',
        Action::Monitor => 'M',
    }
}

#[cfg(test)]
mod tests {
    use super::super::*;
    use crate::envs::{Environment, Scripted};

    fn compact() -> Rules {
        Rules {
            prompt: PromptStyle::Compact,
            ..Rules::default_preset()
        }
    }

    #[test]
    fn compact_prompt_shows_what_the_heuristic_reads() {
        let mut ep = Ticketmelt::new(compact(), 11);
        let first = ep.observation(0)[1].content.clone();
        assert!(first.starts_with("Round 1 of 8.\nYou: "), "{first}");
        assert!(first.contains("Others (no moves yet):"), "{first}");
        for _ in 0..3 {
            let a = ep.continuation_action(0);
            assert!(parse_action(&a).format_ok, "{a}");
            assert!(!a.contains("channel_msg"), "{a}");
            ep.step(&[a]).unwrap();
        }
        let u = ep.observation(0)[1].content.clone();
        assert!(u.starts_with("Round 4 of 8."), "{u}");
        assert!(u.contains("Others (moves in rounds 2-3):"), "{u}");
        // Every unrestored peer's last two moves, as letters, oldest first.
        for k in 1..SEATS {
            let line = u
                .lines()
                .find(|l| l.starts_with(&format!("e{}:", k + 1)))
                .unwrap();
            if ep.completed[k] == 0 {
                let moves: String = [1, 2]
                    .iter()
                    .map(|&pr| format!(" {}", super::move_letter(ep.acts[pr][k])))
                    .collect();
                assert!(line.ends_with(&moves), "{line} vs {moves:?}");
                assert!(line.contains(&format!("spare {}", ep.spare(k))), "{line}");
            } else {
                assert!(line.contains("restored"), "{line}");
            }
        }
        // Once there is history, the full prompt is several times longer.
        let mut full = Ticketmelt::new(Rules::default_preset(), 11);
        for _ in 0..3 {
            let a = full.continuation_action(0);
            full.step(&[a]).unwrap();
        }
        let len =
            |e: &Ticketmelt| -> usize { e.observation(0).iter().map(|m| m.content.len()).sum() };
        assert!(len(&full) > 2 * len(&ep), "{} vs {}", len(&full), len(&ep));
    }

    #[test]
    fn reasoned_answers_show_the_heuristics_working_then_commit() {
        let rules = Rules {
            prompt: PromptStyle::Reasoned,
            ..Rules::default_preset()
        };
        let mut ep = Ticketmelt::new(rules, 11);
        let sys = ep.observation(0)[0].content.clone();
        assert!(sys.contains("\"next\": each other engineer's"), "{sys}");
        let user = ep.observation(0)[1].content.clone();
        assert!(
            user.ends_with("Reply with the JSON object only.\n"),
            "{user}"
        );
        // Before any move nothing is expected, and every server that is up is free.
        let a = ep.policy_action("heuristic", 0).unwrap();
        assert!(
            a.starts_with("{\"next\": \"e2 ?, e3 ?, e4 ?\", \"free\": \"AB\", "),
            "{a}"
        );
        // Hand-set history: e2 alternates A then B (expect A), e3 monitored, e4 stays
        // on B; so A and B are both taken.
        ep.round = 2;
        ep.acts[0][1] = Action::DeployA;
        ep.acts[1][1] = Action::DeployB;
        ep.acts[0][2] = Action::DeployA;
        ep.acts[1][2] = Action::Monitor;
        ep.acts[0][3] = Action::DeployB;
        ep.acts[1][3] = Action::DeployB;
        ep.completed = [0; SEATS];
        assert!(
            !ep.degraded(0) && !ep.degraded(1),
            "no collision was recorded"
        );
        let text = ep.reasoned_answer(0, Action::Monitor);
        assert_eq!(
            text,
            "{\"next\": \"e2 A, e3 -, e4 B\", \"free\": \"none\", \"commitment\": \"MONITOR\"}"
        );
        let p = parse_action(&text);
        assert!(p.format_ok && p.how == parse::ParseHow::Json, "{p:?}");
        assert_eq!(p.action, Action::Monitor);
        // e2 restored: nothing expected of it, and A is free unless it is down.
        ep.completed[1] = 1;
        let text = ep.reasoned_answer(0, Action::DeployA);
        let head = "{\"next\": \"e2 -, e3 -, e4 B\", \"free\": \"A\", ";
        assert!(text.starts_with(head), "{text}");
        assert_eq!(parse_action(&text).action, Action::DeployA);
    }

    #[test]
    fn compact_option_parses_and_is_checked() {
        let mut o = crate::envs::Options::new();
        o.insert("prompt".into(), "compact".into());
        assert_eq!(
            Rules::from_options(&o).unwrap().prompt,
            PromptStyle::Compact
        );
        o.insert("prompt".into(), "tiny".into());
        let e = Rules::from_options(&o).unwrap_err().to_string();
        assert!(e.contains("`prompt`") && e.contains("tiny"), "{e}");
    }
}

//! Whispers' behaviour report: the branches of the `heuristic` as situations.
//!
//! A seat's situation is the branch the heuristic takes for it now, named by the state
//! that selects it (the editor: nothing heard yet, a liar not yet accused, a field still
//! uncertain with fact-checks left, a neighbour not yet asked, ready to publish; a relay
//! or witness: a claim to check, forward or answer, its own report unsent, nothing new).
//! So `eval` can say whether a model publishes when the reports are in and waits while
//! they are not, rather than only whether its reward rose; and `[sft] balance =
//! "situation"` can give the rare branches (publishing happens once an episode) as many
//! demonstrations as the common ones.
use super::parse::parse_action;
use super::policies::Policy;
use super::rules::{Action, Role, Whispers, TOOLS};
use crate::envs::{Behaviour, DecisionView};

/// Every situation, editor branches first (the protagonist of every task but t4).
pub const SITUATIONS: [&str; 10] = [
    "no_report_yet",
    "liar_unaccused",
    "field_uncertain",
    "neighbour_unasked",
    "ready_to_publish",
    "claim_unchecked",
    "claim_to_forward",
    "report_unsent",
    "request_pending",
    "nothing_new",
];

/// The situation that makes the heuristic play `a` in `role`'s seat.
fn situation(role: Role, a: &Action) -> &'static str {
    match (role, a) {
        (_, Action::Accuse { .. }) => "liar_unaccused",
        (Role::Editor, Action::Wait) => "no_report_yet",
        (Role::Editor, Action::FactCheck { .. }) => "field_uncertain",
        (Role::Editor, Action::RequestVerify { .. }) => "neighbour_unasked",
        (Role::Editor, Action::Publish(_)) => "ready_to_publish",
        (_, Action::FactCheck { .. }) => "claim_unchecked",
        (Role::Relay, Action::Send { .. }) => "claim_to_forward",
        (_, Action::Broadcast { .. }) => "report_unsent",
        (_, Action::Send { .. }) => "request_pending",
        _ => "nothing_new",
    }
}

impl Behaviour for Whispers {
    fn reference_policy(&self) -> &'static str {
        "heuristic"
    }
    fn situations(&self) -> Vec<&'static str> {
        SITUATIONS.to_vec()
    }
    fn actions(&self) -> Vec<&'static str> {
        TOOLS.to_vec()
    }
    /// The tool played; an answer the parser or the rules refuse plays `wait`.
    fn action_label(&self, seat: usize, text: &str) -> &'static str {
        let seat = seat.min(self.seats() - 1);
        parse_action(text, self.template())
            .and_then(|a| self.validate(seat, &a).map(|_| a))
            .map_or("wait", |a| a.tool())
    }
    fn view(&self, seat: usize) -> DecisionView {
        let seat = seat.min(self.seats() - 1);
        // The heuristic reads only the seat's own view; a copy keeps the episode as it is.
        let reference = self.clone().policy_move(Policy::Heuristic, seat);
        let b = self.beliefs(seat);
        DecisionView {
            situation: situation(self.role(seat), &reference),
            features: serde_json::json!({
                "step": self.step_index(),
                "role": self.role(seat).name(),
                "heard": self.newest_claim(seat).is_some(),
                "suspected_liars": b.liars.count_ones(),
                "fact_checks_left": self.budget[seat],
            }),
            reference: vec![reference.tool()],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envs::whispers::{action_json, Rules, WhispersFactory};
    use crate::envs::{Environment, Scripted};

    fn factory(o: &crate::envs::Options) -> WhispersFactory {
        WhispersFactory {
            rules: Rules::from_options(o).unwrap(),
        }
    }

    /// Over heuristic play of every task, the reference is what the heuristic plays, its
    /// label is what the played text parses to, and every situation is listed; the
    /// editor waits before it has heard anything and publishes last.
    #[test]
    fn situations_follow_the_heuristic() {
        let mut seen = std::collections::BTreeSet::new();
        for task in ["t1", "t2", "t3", "t4", "t5", "t6"] {
            let mut o = crate::envs::Options::new();
            o.insert("task".into(), task.into());
            o.insert("seat".into(), "protagonist".into());
            let f = factory(&o);
            for seed in 0..20 {
                let mut env = f.episode(seed);
                let mut last = None;
                while !env.is_done() {
                    let seats = Environment::policy_seats(&env);
                    let mut texts = Vec::new();
                    for &s in &seats {
                        let v = env.view(s);
                        let text = env.policy_action("heuristic", s).unwrap();
                        assert_eq!(v.reference, vec![env.action_label(s, &text)], "{task}");
                        assert!(SITUATIONS.contains(&v.situation));
                        if env.role(s) == Role::Editor && !v.features["heard"].as_bool().unwrap() {
                            assert_ne!(v.situation, "ready_to_publish", "{task} {seed}");
                        }
                        seen.insert(v.situation);
                        last = Some(v.situation);
                        texts.push(text);
                    }
                    env.step_texts(&texts).unwrap();
                }
                if task != "t4" {
                    assert_eq!(last, Some("ready_to_publish"), "{task} {seed}");
                }
            }
        }
        for s in [
            "no_report_yet",
            "ready_to_publish",
            "liar_unaccused",
            "field_uncertain",
        ] {
            assert!(seen.contains(s), "{s} never seen: {seen:?}");
        }
    }

    #[test]
    fn malformed_answers_are_labelled_as_the_wait_they_play() {
        let mut o = crate::envs::Options::new();
        o.insert("task".into(), "t1".into());
        let env = factory(&o).episode(3);
        let seat = Environment::policy_seats(&env)[0];
        assert_eq!(env.action_label(seat, "publish it all!"), "wait");
        // accusing oneself is refused by the rules: it plays wait too
        let accuse = action_json(&Action::Accuse { target: seat as u8 }, env.template());
        assert_eq!(env.action_label(seat, &accuse), "wait");
        assert_eq!(env.action_label(seat, r#"{"tool":"wait"}"#), "wait");
    }
}

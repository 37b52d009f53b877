//! The compact prompt (option `prompt = "compact"`): the same facts as the full prompt
//! (priority slot, every earlier episode's neighbour signals and moves, this episode's
//! signals) in about a third of the tokens, since prefill dominates a CPU's sampling.

use super::graph::Phase;
use super::session::MergeRing;
use std::fmt::Write as _;

impl MergeRing {
    pub(super) fn system_prompt_compact(&self) -> String {
        let r = &self.cfg.rewards;
        format!(
            "Merge game on a ring of {n} vehicles; each has two neighbours. A session is {e} \
             episodes with the same drivers. Each episode: SIGNAL (everyone announces early, \
             late or bypass; not binding), then COMMIT (everyone chooses at once). early \
             {me:+.1}, late {ml:+.1}, but {c:+.1} if a neighbour commits the same slot; bypass \
             {b:+.1}, always safe. A priority gives half the vehicles early and their \
             neighbours late; not every driver follows it. Score: mean reward.",
            n = self.cfg.agents,
            e = self.cfg.episodes_per_session,
            me = r.merge_early,
            ml = r.merge_late,
            b = r.bypass,
            c = r.collision,
        )
    }

    pub(super) fn user_prompt_compact(&self, seat: usize) -> String {
        if self.phase == Phase::Done {
            return self.user_prompt(seat);
        }
        let ctx = self.ctx();
        let (l, r) = ctx.neighbours(seat);
        let neighbours: Vec<usize> = if l == r { vec![l] } else { vec![l, r] };
        let mut out = String::new();
        let played = self.episode.saturating_sub(self.cfg.warmup) + 1;
        let _ = writeln!(
            out,
            "Episode {played} of {}. You are v{seat}, priority slot {}. Neighbours: {}.",
            self.cfg.episodes_per_session,
            ctx.convention(seat).as_str().to_uppercase(),
            names(&neighbours)
        );
        out.push_str("Earlier (signal>did):");
        if self.history.is_empty() {
            out.push_str(" none");
        }
        out.push('\n');
        for rec in &self.history {
            let label = if rec.warmup {
                "warm-up".to_string()
            } else {
                format!("ep {}", rec.episode + 1 - self.cfg.warmup)
            };
            let _ = write!(out, "{label}:");
            for &j in neighbours.iter().chain([&seat]) {
                let who = if j == seat {
                    "you".to_string()
                } else {
                    format!("v{j}")
                };
                let _ = write!(
                    out,
                    " {who} {}>{}{}",
                    rec.signals[j].as_str(),
                    rec.commitments[j].as_str(),
                    if rec.collisions[j] { " CRASH" } else { "" }
                );
                if j != seat {
                    out.push(',');
                }
            }
            out.push('\n');
        }
        if self.phase == Phase::Signal {
            out.push_str("Phase: SIGNAL.\n");
        } else {
            let sig: Vec<String> = neighbours
                .iter()
                .map(|&j| format!("v{j} {}", self.signals[j].as_str()))
                .collect();
            let _ = writeln!(
                out,
                "Signals now: {}, you {}. Phase: COMMIT.",
                sig.join(", "),
                self.signals[seat].as_str()
            );
        }
        out.push_str("Reply with one line: ACTION: early, ACTION: late or ACTION: bypass");
        out
    }
}

fn names(v: &[usize]) -> String {
    v.iter()
        .map(|j| format!("v{j}"))
        .collect::<Vec<_>>()
        .join(" and ")
}

#[cfg(test)]
mod tests {
    use super::super::*;

    fn factory(prompt: &str) -> Box<dyn crate::envs::EnvFactory> {
        let mut o = crate::envs::Options::new();
        o.insert("prompt".into(), prompt.into());
        crate::envs::create(NAME, &o).unwrap()
    }

    #[test]
    fn compact_prompt_keeps_the_history_and_signals() {
        let f = factory("compact");
        let mut env = f.reset(3);
        let first = env.observation(0)[1].content.clone();
        assert!(first.contains("Episode 1 of 6. You are v0"), "{first}");
        assert!(first.contains("warm-up: v3 "), "{first}");
        assert!(first.contains("Phase: SIGNAL."), "{first}");
        env.step(&["ACTION: early".into()]).unwrap();
        let commit = env.observation(0)[1].content.clone();
        assert!(commit.contains("you early. Phase: COMMIT."), "{commit}");
        env.step(&["ACTION: late".into()]).unwrap();
        let next = env.observation(0)[1].content.clone();
        assert!(
            next.contains("ep 1:") && next.contains("you early>late"),
            "{next}"
        );
        let full = factory("full").reset(3);
        let len = |m: &[crate::envs::Message]| m.iter().map(|m| m.content.len()).sum::<usize>();
        assert!(len(&full.observation(0)) > 2 * len(&f.reset(3).observation(0)));
    }

    #[test]
    fn prompt_option_is_checked() {
        let mut o = crate::envs::Options::new();
        o.insert("prompt".into(), "short".into());
        let e = crate::envs::create(NAME, &o).err().unwrap().to_string();
        assert!(e.contains("`prompt`"), "{e}");
    }
}

//! The answer parser: model text -> action, defaulting to bypass (the safe action).

use super::Action;
use serde::{Deserialize, Serialize};

/// How [`parse_action`] read an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ParseOutcome {
    /// `ACTION: x` (or `"action": "x"`, `answer: x`, `commit: x` ...); the last wins.
    Marked,
    /// No marker, but exactly one of the three action words appears.
    Bare,
    /// Nothing usable (empty, no action word, or several without a marker): bypass.
    Default,
}

const MARKERS: &[&str] = &[
    "action",
    "answer",
    "commit",
    "commitment",
    "signal",
    "proposal",
    "choice",
    "decision",
    "final",
];

fn keyword(word: &str) -> Option<Action> {
    match word {
        "early" => Some(Action::Early),
        "late" => Some(Action::Late),
        "bypass" => Some(Action::Bypass),
        _ => None,
    }
}

/// Parse a model answer into an action. Case-insensitive, word-based:
/// 1. the last `MARKER <sep> WORD` where MARKER is one of action / answer / commit /
///    commitment / signal / proposal / choice / decision / final, `<sep>` is
///    punctuation containing `:` or `=` (so `ACTION: late`, `**Action:** late` and
///    `{"action": "late"}` all work) and WORD is early / late / bypass;
/// 2. otherwise, when exactly one distinct action word occurs anywhere, that word;
/// 3. otherwise **bypass** (the safe action), reported as [`ParseOutcome::Default`].
///
/// A marker followed by a list of action words (`ACTION: early|late|bypass`, a copied
/// template) does not count as marked. Words are maximal ASCII alphanumeric runs, so
/// `lately` or `earlier` never count.
/// Never panics.
pub fn parse_action(text: &str) -> (Action, ParseOutcome) {
    // (word, byte start, byte end)
    let mut words: Vec<(String, usize, usize)> = Vec::new();
    let mut cur: Option<(String, usize)> = None;
    for (i, ch) in text.char_indices() {
        if ch.is_ascii_alphanumeric() {
            match cur.as_mut() {
                Some((w, _)) => w.push(ch.to_ascii_lowercase()),
                None => cur = Some((ch.to_ascii_lowercase().to_string(), i)),
            }
        } else if let Some((w, s)) = cur.take() {
            words.push((w, s, i));
        }
    }
    if let Some((w, s)) = cur.take() {
        words.push((w, s, text.len()));
    }
    let mut marked = None;
    for (i, pair) in words.windows(2).enumerate() {
        let (m, _, m_end) = &pair[0];
        let (k, k_start, k_end) = &pair[1];
        if let Some(a) = keyword(k) {
            if MARKERS.contains(&m.as_str()) {
                let sep = text.get(*m_end..*k_start).unwrap_or("");
                // A copied template such as `ACTION: early|late|bypass` is ambiguous.
                let listed = words.get(i + 2).is_some_and(|(w, s, _)| {
                    let gap = text.get(*k_end..*s).unwrap_or("");
                    keyword(w).is_some() && gap.len() <= 3 && !gap.contains('\n')
                });
                if (sep.contains(':') || sep.contains('=')) && !listed {
                    marked = Some(a);
                }
            }
        }
    }
    if let Some(a) = marked {
        return (a, ParseOutcome::Marked);
    }
    let mut seen = [false; 3];
    for (w, _, _) in &words {
        if let Some(a) = keyword(w) {
            seen[a.index()] = true;
        }
    }
    if seen.iter().filter(|&&s| s).count() == 1 {
        let i = seen.iter().position(|&s| s).unwrap_or(2);
        return (Action::from_index(i), ParseOutcome::Bare);
    }
    (Action::Bypass, ParseOutcome::Default)
}

/// The canonical answer text for an action (what scripted policies "say").
pub fn answer_text(a: Action) -> String {
    format!("ACTION: {}", a.as_str())
}

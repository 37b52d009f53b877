//! The validating action parser: completion text -> commitment and channel message.

use super::{Action, MAX_PARSE_BYTES, MSG_CHARS};
use serde_json::{json, Value};

/// How a completion was understood.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParseHow {
    /// The whole text is one JSON object.
    Json,
    /// A `{...}` object containing "commitment" inside other text.
    Embedded,
    /// No usable object; a keyword decided (or MONITOR by default).
    Keyword,
}

/// A parsed completion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parsed {
    pub action: Action,
    /// Channel message (already cut to 200 chars and cleaned), if any.
    pub message: Option<String>,
    /// Well formed: a JSON object (whole text or embedded) whose `commitment` is exactly
    /// one of the three commitments (trimmed, ASCII case-insensitive).
    pub format_ok: bool,
    pub how: ParseHow,
}

/// Cut to 200 characters, control characters (newlines included) become spaces.
pub fn clean_message(s: &str) -> String {
    s.chars()
        .take(MSG_CHARS)
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

fn from_object(v: &Value, how: ParseHow) -> Parsed {
    let commitment = v
        .get("commitment")
        .and_then(Value::as_str)
        .and_then(Action::from_commitment);
    let message = v
        .get("channel_msg")
        .and_then(Value::as_str)
        .map(clean_message);
    Parsed {
        action: commitment.unwrap_or(Action::Monitor),
        message,
        format_ok: commitment.is_some(),
        how,
    }
}

fn find_ci(hay: &[u8], needle: &[u8]) -> bool {
    hay.len() >= needle.len()
        && hay
            .windows(needle.len())
            .any(|w| w.eq_ignore_ascii_case(needle))
}

/// End (exclusive) of the balanced `{...}` starting at `start`, honouring JSON strings.
fn balanced_end(b: &[u8], start: usize) -> Option<usize> {
    let (mut depth, mut in_str, mut esc) = (0usize, false, false);
    for (i, &c) in b.iter().enumerate().skip(start) {
        if in_str {
            if esc {
                esc = false;
            } else if c == b'\\' {
                esc = true;
            } else if c == b'"' {
                in_str = false;
            }
            continue;
        }
        match c {
            b'"' => in_str = true,
            b'{' => depth += 1,
            b'}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(i + 1);
                }
            }
            _ => {}
        }
    }
    None
}

/// The robust parser. Order:
/// 1. the whole (trimmed) text is a JSON object -> its `commitment`;
/// 2. else the first balanced `{...}` (at most 64 candidates tried) that contains
///    `"commitment"` and parses as a JSON object -> its `commitment`;
/// 3. else the first keyword in the order `DEPLOY_PROD_A`, `DEPLOY_PROD_B`, `MONITOR`
///    (ASCII case-insensitive substring) -> that action;
/// 4. else MONITOR.
///
/// In 1 and 2 a missing or invalid commitment (e.g. the template literal
/// `"DEPLOY_PROD_A|DEPLOY_PROD_B|MONITOR"`) plays MONITOR. Only 1 and 2 with a valid
/// commitment are well formed (`format_ok`). Only the first 16 KiB are read.
pub fn parse_action(text: &str) -> Parsed {
    let mut cut = text.len().min(MAX_PARSE_BYTES);
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    let text = &text[..cut];
    let t = text.trim();
    if t.starts_with('{') {
        if let Ok(v) = serde_json::from_str::<Value>(t) {
            if v.is_object() {
                return from_object(&v, ParseHow::Json);
            }
        }
    }
    let b = text.as_bytes();
    let mut tried = 0;
    let mut pos = 0;
    while tried < 64 {
        let Some(off) = b[pos..].iter().position(|&c| c == b'{') else {
            break;
        };
        let start = pos + off;
        pos = start + 1;
        tried += 1;
        let Some(end) = balanced_end(b, start) else {
            continue;
        };
        let cand = &text[start..end];
        if !cand.contains("\"commitment\"") {
            continue;
        }
        if let Ok(v) = serde_json::from_str::<Value>(cand) {
            if v.is_object() {
                return from_object(&v, ParseHow::Embedded);
            }
        }
    }
    let action = if find_ci(b, b"DEPLOY_PROD_A") {
        Action::DeployA
    } else if find_ci(b, b"DEPLOY_PROD_B") {
        Action::DeployB
    } else {
        Action::Monitor
    };
    Parsed {
        action,
        message: None,
        format_ok: false,
        how: ParseHow::Keyword,
    }
}

/// The well-formed answer for an action (what scripted policies "say").
pub fn answer_json(action: Action, message: &str) -> String {
    json!({"channel_msg": message, "commitment": action.as_str()}).to_string()
}

/// Feedback text for a parsed answer: empty when it was well formed, otherwise why it
/// was not and what was played instead.
pub fn feedback(p: &Parsed) -> String {
    if p.format_ok {
        return String::new();
    }
    let played = p.action.as_str();
    match p.how {
        ParseHow::Json | ParseHow::Embedded => format!(
            "malformed answer: the JSON object has no valid \"commitment\" (expected exactly \
one of DEPLOY_PROD_A, DEPLOY_PROD_B, MONITOR); played {played}"
        ),
        ParseHow::Keyword if p.action == Action::Monitor => format!(
            "malformed answer: no JSON object with a \"commitment\" and no DEPLOY_PROD_A or \
DEPLOY_PROD_B keyword found; played {played}"
        ),
        ParseHow::Keyword => format!(
            "malformed answer: no JSON object with a \"commitment\" found; played {played}, \
the first keyword in the text"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parser_orders() {
        let p = parse_action(r#"{"commitment": "DEPLOY_PROD_B", "channel_msg": "hi"}"#);
        assert_eq!(
            (p.action, p.format_ok, p.how),
            (Action::DeployB, true, ParseHow::Json)
        );
        assert_eq!(p.message.as_deref(), Some("hi"));
        let p =
            parse_action("Sure! ```json\n{\"commitment\": \"monitor\"}\n``` done DEPLOY_PROD_A");
        assert_eq!(
            (p.action, p.format_ok, p.how),
            (Action::Monitor, true, ParseHow::Embedded)
        );
        let p = parse_action(r#"{"commitment": "DEPLOY_PROD_A|DEPLOY_PROD_B|MONITOR"}"#);
        assert_eq!((p.action, p.format_ok), (Action::Monitor, false));
        let p = parse_action("I pick DEPLOY_PROD_B, not DEPLOY_PROD_A");
        assert_eq!(
            (p.action, p.format_ok, p.how),
            (Action::DeployA, false, ParseHow::Keyword)
        );
        let p = parse_action("hmm");
        assert_eq!((p.action, p.format_ok), (Action::Monitor, false));
        let p = parse_action(
            "{\"a\": {\"b\": 1}} then {\"commitment\": \"DEPLOY_PROD_B\", \"x\": \"}\"}",
        );
        assert_eq!((p.action, p.format_ok), (Action::DeployB, true));
        let long: String = "x".repeat(500);
        let p = parse_action(&format!(
            "{{\"commitment\":\"MONITOR\",\"channel_msg\":\"{long}\\n\"}}"
        ));
        assert_eq!(p.message.map(|m| m.chars().count()), Some(200));
    }
}

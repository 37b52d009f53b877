//! The action parser: one JSON object per turn, validated field by field.
//!
//! The text may hold prose around the object; the first balanced `{...}` that parses
//! as JSON is read (so does a fenced code block). Keys are case-insensitive and the
//! seed's long names are accepted too (`query_service`, `section_name`,
//! `section_content`, `action_item_owner`, ...). Anything else is [`ParseError`]: the
//! episode plays a no-op for it (one step used, no reward) and the feedback names the
//! problem.

use super::scenario::{parse_hhmm, SECTIONS};
use serde_json::{Map, Value};

/// Most characters of a section or a description kept.
pub const MAX_CONTENT: usize = 4000;

/// A valid action.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    QueryLogs {
        service: String,
        from: u32,
        to: u32,
    },
    WriteSection {
        section: usize,
        content: String,
    },
    ReviseSection {
        section: usize,
        content: String,
    },
    AssignActionItem {
        description: String,
        owner: String,
        due: String,
    },
    RequestReview,
    Submit,
}

/// Why a text is not a valid action.
pub type ParseError = String;

/// Parse one writer turn.
pub fn parse_action(text: &str) -> Result<Action, ParseError> {
    let obj = first_object(text).ok_or_else(|| "no JSON object found".to_string())?;
    let obj: Map<String, Value> = obj
        .into_iter()
        .map(|(k, v)| (k.to_ascii_lowercase(), v))
        .collect();
    let kind = field(&obj, &["action", "action_type", "type"])
        .ok_or_else(|| "missing \"action\"".to_string())?;
    let kind = kind.trim().to_ascii_uppercase().replace([' ', '-'], "_");
    match kind.as_str() {
        "QUERY_LOGS" => {
            let service = field(&obj, &["service", "query_service"])
                .ok_or("QUERY_LOGS needs \"service\"")?
                .trim()
                .to_string();
            let from = time_field(&obj, &["from", "query_from"])?;
            let to = time_field(&obj, &["to", "query_to"])?;
            if from >= to {
                return Err("QUERY_LOGS needs \"from\" before \"to\"".into());
            }
            Ok(Action::QueryLogs { service, from, to })
        }
        "WRITE_SECTION" | "REVISE_SECTION" => {
            let name = field(&obj, &["section", "section_name", "name"])
                .ok_or_else(|| format!("{kind} needs \"section\""))?;
            let name = name.trim().to_ascii_lowercase().replace([' ', '-'], "_");
            let section = SECTIONS.iter().position(|s| *s == name).ok_or_else(|| {
                format!(
                    "unknown section `{name}`; sections: {}",
                    SECTIONS.join(", ")
                )
            })?;
            let content = field(&obj, &["content", "section_content", "text"])
                .ok_or_else(|| format!("{kind} needs \"content\""))?;
            let content = cut(content.trim());
            if content.is_empty() {
                return Err(format!("{kind}: \"content\" is empty"));
            }
            Ok(if kind == "WRITE_SECTION" {
                Action::WriteSection { section, content }
            } else {
                Action::ReviseSection { section, content }
            })
        }
        "ASSIGN_ACTION_ITEM" => {
            let description =
                field(&obj, &["description", "action_item_description"]).unwrap_or_default();
            let owner = field(&obj, &["owner", "action_item_owner"]).unwrap_or_default();
            let due = field(&obj, &["due", "due_date", "action_item_due_date"]).unwrap_or_default();
            let description = cut(description.trim());
            if description.is_empty() {
                return Err("ASSIGN_ACTION_ITEM needs \"description\"".into());
            }
            Ok(Action::AssignActionItem {
                description,
                owner: cut(owner.trim()),
                due: cut(due.trim()),
            })
        }
        "REQUEST_REVIEW" => Ok(Action::RequestReview),
        "SUBMIT" => Ok(Action::Submit),
        other => Err(format!(
            "unknown action `{}`; actions: QUERY_LOGS, WRITE_SECTION, ASSIGN_ACTION_ITEM, \
REQUEST_REVIEW, REVISE_SECTION, SUBMIT",
            cut_to(other, 40)
        )),
    }
}

/// The action as the JSON text the parser reads back (policies speak through it). Keys
/// come in the system prompt's order (`action`, then `section` before `content`, ...):
/// demonstrations are what a small model copies, so they must not contradict the prompt.
pub fn action_json(a: &Action) -> String {
    use super::scenario::hhmm;
    let s = |x: &str| Value::from(x);
    let fields: Vec<(&str, Value)> = match a {
        Action::QueryLogs { service, from, to } => vec![
            ("action", s("QUERY_LOGS")),
            ("service", s(service)),
            ("from", s(&hhmm(*from))),
            ("to", s(&hhmm(*to))),
        ],
        Action::WriteSection { section, content } => vec![
            ("action", s("WRITE_SECTION")),
            ("section", s(SECTIONS[*section])),
            ("content", s(content)),
        ],
        Action::ReviseSection { section, content } => vec![
            ("action", s("REVISE_SECTION")),
            ("section", s(SECTIONS[*section])),
            ("content", s(content)),
        ],
        Action::AssignActionItem {
            description,
            owner,
            due,
        } => vec![
            ("action", s("ASSIGN_ACTION_ITEM")),
            ("description", s(description)),
            ("owner", s(owner)),
            ("due", s(due)),
        ],
        Action::RequestReview => vec![("action", s("REQUEST_REVIEW"))],
        Action::Submit => vec![("action", s("SUBMIT"))],
    };
    let body: Vec<String> = fields
        .iter()
        .map(|(k, v)| format!("{}:{v}", Value::from(*k)))
        .collect();
    format!("{{{}}}", body.join(","))
}

/// The reviewer seat's answer: `{"critiques": ["evidence", ...]}` with ids from
/// [`super::grader::CHECKS`]; unknown ids are dropped (and named in the error half).
pub fn parse_critiques(text: &str) -> (Vec<usize>, Vec<String>) {
    use super::grader::CHECKS;
    let mut ids = Vec::new();
    let mut bad = Vec::new();
    let Some(obj) = first_object(text) else {
        return (ids, vec!["no JSON object found".into()]);
    };
    let list = obj
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("critiques"))
        .and_then(|(_, v)| v.as_array().cloned());
    let Some(list) = list else {
        return (ids, vec!["missing \"critiques\" list".into()]);
    };
    for v in list.iter().take(32) {
        let name = v.as_str().unwrap_or("").trim().to_ascii_lowercase();
        match CHECKS.iter().position(|c| c.0 == name) {
            Some(i) if !ids.contains(&i) => ids.push(i),
            Some(_) => {}
            None => bad.push(format!("unknown critique `{}`", cut_to(&name, 40))),
        }
    }
    ids.sort_unstable();
    (ids, bad)
}

fn cut(s: &str) -> String {
    cut_to(s, MAX_CONTENT).to_string()
}

fn cut_to(s: &str, n: usize) -> &str {
    match s.char_indices().nth(n) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

fn field(obj: &Map<String, Value>, keys: &[&str]) -> Option<String> {
    keys.iter().find_map(|k| match obj.get(*k)? {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Array(a) => Some(
            a.iter()
                .map(|x| match x {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                })
                .collect::<Vec<_>>()
                .join("\n"),
        ),
        _ => None,
    })
}

fn time_field(obj: &Map<String, Value>, keys: &[&str]) -> Result<u32, ParseError> {
    let raw = field(obj, keys).ok_or_else(|| format!("QUERY_LOGS needs \"{}\"", keys[0]))?;
    // Accept "HH:MM" and ISO timestamps ("2026-03-03T09:12:00Z": the HH:MM after T).
    let t = raw.trim();
    let hm = match t.find('T') {
        Some(i) if i >= 8 => t.get(i + 1..i + 6).unwrap_or(""),
        _ => t,
    };
    parse_hhmm(hm).ok_or_else(|| format!("\"{}\" = `{}` is not HH:MM", keys[0], cut_to(t, 30)))
}

/// The first balanced `{...}` of `text` that parses as a JSON object.
pub fn first_object(text: &str) -> Option<Map<String, Value>> {
    if let Ok(Value::Object(o)) = serde_json::from_str::<Value>(text.trim()) {
        return Some(o);
    }
    let b = text.as_bytes();
    let mut start = 0;
    let mut tries = 0;
    while let Some(off) = text[start..].find('{') {
        tries += 1;
        if tries > 64 {
            return None;
        }
        let s = start + off;
        let (mut depth, mut in_str, mut esc) = (0i32, false, false);
        let mut end = None;
        for (i, &c) in b[s..].iter().enumerate() {
            if in_str {
                match (esc, c) {
                    (true, _) => esc = false,
                    (false, b'\\') => esc = true,
                    (false, b'"') => in_str = false,
                    _ => {}
                }
                continue;
            }
            match c {
                b'"' => in_str = true,
                b'{' => depth += 1,
                b'}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = Some(s + i + 1);
                        break;
                    }
                }
                _ => {}
            }
        }
        match end {
            Some(e) => {
                if let Ok(Value::Object(o)) = serde_json::from_str::<Value>(&text[s..e]) {
                    return Some(o);
                }
                start = s + 1;
            }
            None => return None,
        }
    }
    None
}

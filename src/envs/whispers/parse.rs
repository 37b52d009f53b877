//! The validating parser: model text -> one tool call, and tool calls -> JSON text.
//!
//! An answer is one JSON object `{"tool": NAME, ...parameters}` (the whole text, or the
//! first `{...}` in it that parses and names a tool; parameters may also sit in an
//! `"arguments"`/`"args"`/`"parameters"` object; an object with a `final_report` object
//! and no tool is a `publish`). Tool names and field names are matched
//! case-insensitively. Anything else is invalid, and the seat plays `wait`.
//!
//! Parameters:
//! - `target_id`: an integer (or a string of digits);
//! - `content`: a claim, either a string of `field=value` pairs (`location=Reactor 7;
//!   time=03:14`; `:` works for `=`, and `;`, `,` or `|` separate pairs; the
//!   original's `[kind] a=b c=d` form works too) or an object `{"field": "value"}`.
//!   Values must be one of the field's four values (case-insensitive; a value followed
//!   by extra words, e.g. `Reactor 7 (likely)`, counts as that value). A message whose
//!   content names no valid pair is delivered as free text; fact_check and
//!   request_verify need at least one valid pair;
//! - `confidence`: a number in [0, 1] (default 0.5 for messages);
//! - `claimed_source`: a string (at most 40 characters; default: your role);
//! - `final_report`: `{"field": {"value": V, "confidence": C}, ...}` with known fields,
//!   at least one, each with a value and a confidence in [0, 1]; a value outside the
//!   field's four values is rejected.

#![allow(clippy::needless_range_loop)]

use super::rules::{Action, Claim, Report, Template, EMPTY, FIELDS, NONE, VALUES};
use serde_json::{Map, Value};

/// Parsing looks at no more than this many bytes of a completion.
pub const MAX_PARSE_BYTES: usize = 16 * 1024;
/// Free text and claimed sources are cut to these many characters.
pub const TEXT_CHARS: usize = 200;
pub const SOURCE_CHARS: usize = 40;
/// At most this many `{` positions are tried.
const MAX_STARTS: usize = 64;

/// Parse a completion into a tool call (not yet checked against the state), or say why
/// it is invalid.
pub fn parse_action(text: &str, t: &Template) -> Result<Action, String> {
    let obj = find_object(text).ok_or_else(|| {
        "no JSON object with a \"tool\" field found; answer with one JSON object such as \
{\"tool\": \"wait\"}"
            .to_string()
    })?;
    action_from_object(&obj, t)
}

/// The first JSON object in `text` that has a `tool` key (after merging nested
/// arguments).
fn find_object(text: &str) -> Option<Map<String, Value>> {
    let mut end = text.len().min(MAX_PARSE_BYTES);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let text = &text[..end];
    let trimmed = text.trim();
    if trimmed.starts_with('{') {
        if let Ok(Value::Object(o)) = serde_json::from_str::<Value>(trimmed) {
            if let Some(o) = with_tool(o) {
                return Some(o);
            }
        }
    }
    for (tries, (i, _)) in text.match_indices('{').enumerate() {
        if tries >= MAX_STARTS {
            break;
        }
        let mut it = serde_json::Deserializer::from_str(&text[i..]).into_iter::<Value>();
        if let Some(Ok(Value::Object(o))) = it.next() {
            if let Some(o) = with_tool(o) {
                return Some(o);
            }
        }
    }
    None
}

/// `o` with nested arguments merged in, if it names a tool.
fn with_tool(mut o: Map<String, Value>) -> Option<Map<String, Value>> {
    for k in ["arguments", "args", "parameters", "params"] {
        if let Some(Value::Object(inner)) = o.remove(k) {
            for (k2, v) in inner {
                o.entry(k2).or_insert(v);
            }
        }
    }
    if !o.contains_key("tool") {
        if let Some(v) = o.remove("name").or_else(|| o.remove("action")) {
            o.insert("tool".into(), v);
        } else if o.get("final_report").is_some_and(Value::is_object) {
            // A bare report is what only `publish` takes.
            o.insert("tool".into(), "publish".into());
        }
    }
    o.get("tool").is_some_and(Value::is_string).then_some(o)
}

fn get<'a>(o: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    o.get(key).filter(|v| !v.is_null())
}

fn target(o: &Map<String, Value>, tool: &str) -> Result<u8, String> {
    let v = get(o, "target_id")
        .or_else(|| get(o, "target"))
        .ok_or_else(|| format!("{tool} needs an integer \"target_id\""))?;
    let n = match v {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => s.trim().parse::<u64>().ok(),
        _ => None,
    };
    match n {
        Some(n) if n < 16 => Ok(n as u8),
        _ => Err(format!(
            "{tool}: \"target_id\" must be an agent id, got {v}"
        )),
    }
}

fn number(v: &Value) -> Option<f64> {
    match v {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.trim().parse::<f64>().ok(),
        _ => None,
    }
    .filter(|x| x.is_finite())
}

fn confidence(o: &Map<String, Value>, tool: &str) -> Result<f32, String> {
    match get(o, "confidence") {
        None => Ok(0.5),
        Some(v) => match number(v) {
            Some(c) if (0.0..=1.0).contains(&c) => Ok(c as f32),
            _ => Err(format!(
                "{tool}: \"confidence\" must be a number in [0, 1], got {v}"
            )),
        },
    }
}

/// Cut to `n` characters with control characters replaced by spaces.
pub fn clean_text(s: &str, n: usize) -> String {
    s.chars()
        .take(n)
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect::<String>()
        .trim()
        .to_string()
}

/// The content of a message: (claim, free text when it names no pair).
fn content(o: &Map<String, Value>, t: &Template) -> (Claim, Option<String>) {
    match get(o, "content").or_else(|| get(o, "claim")) {
        None => (EMPTY, None),
        Some(Value::Object(m)) => (claim_from_object(m, t), None),
        Some(Value::String(s)) => {
            let c = parse_claim(s, t);
            if c == EMPTY {
                let txt = clean_text(s, TEXT_CHARS);
                (EMPTY, (!txt.is_empty()).then_some(txt))
            } else {
                (c, None)
            }
        }
        Some(v) => {
            let txt = clean_text(&v.to_string(), TEXT_CHARS);
            (EMPTY, Some(txt))
        }
    }
}

fn source(o: &Map<String, Value>) -> Option<String> {
    match get(o, "claimed_source") {
        Some(Value::String(s)) => {
            let s = clean_text(s, SOURCE_CHARS);
            (!s.is_empty()).then_some(s)
        }
        _ => None,
    }
}

fn action_from_object(o: &Map<String, Value>, t: &Template) -> Result<Action, String> {
    let tool = o
        .get("tool")
        .and_then(Value::as_str)
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    match tool.as_str() {
        "wait" => Ok(Action::Wait),
        "send_message" => {
            let target = target(o, &tool)?;
            let (claim, text) = content(o, t);
            if claim == EMPTY && text.is_none() {
                return Err("send_message needs a \"content\"".into());
            }
            Ok(Action::Send {
                target,
                claim,
                conf: confidence(o, &tool)?,
                source: source(o),
                text,
            })
        }
        "broadcast" => {
            let (claim, text) = content(o, t);
            if claim == EMPTY && text.is_none() {
                return Err("broadcast needs a \"content\"".into());
            }
            Ok(Action::Broadcast {
                claim,
                conf: confidence(o, &tool)?,
                source: source(o),
                text,
            })
        }
        "fact_check" | "request_verify" => {
            let (claim, _) = content(o, t);
            if claim == EMPTY {
                return Err(format!(
                    "{tool} needs a \"content\" naming at least one field=value pair of this \
event, e.g. \"{}={}\"",
                    t.fields[0], t.values[0][0]
                ));
            }
            if tool == "fact_check" {
                Ok(Action::FactCheck { claim })
            } else {
                Ok(Action::RequestVerify {
                    target: target(o, &tool)?,
                    claim,
                })
            }
        }
        "accuse" => Ok(Action::Accuse {
            target: target(o, &tool)?,
        }),
        "publish" => report(o, t).map(Action::Publish),
        "" => Err("\"tool\" is empty".into()),
        other => Err(format!(
            "unknown tool \"{}\"; tools: send_message, broadcast, fact_check, request_verify, \
accuse, publish, wait",
            clean_text(other, 40)
        )),
    }
}

fn field_index(t: &Template, name: &str) -> Option<usize> {
    let n = name.trim();
    t.fields.iter().position(|f| f.eq_ignore_ascii_case(n))
}

/// The value index of `s` for field `f`: exact (case-insensitive) or the longest value
/// that `s` starts with (followed by a non-alphanumeric character).
pub fn value_index(t: &Template, f: usize, s: &str) -> Option<u8> {
    let s = s
        .trim()
        .trim_matches(|c: char| c == '"' || c == '\'')
        .trim();
    let mut best: Option<(usize, u8)> = None;
    for (i, v) in t.values[f].iter().enumerate() {
        let ok = s.len() >= v.len()
            && s.is_char_boundary(v.len())
            && s[..v.len()].eq_ignore_ascii_case(v)
            && s[v.len()..]
                .chars()
                .next()
                .is_none_or(|c| !c.is_ascii_alphanumeric() && c != '%' && c != '-' && c != ':');
        if ok && best.is_none_or(|(l, _)| v.len() > l) {
            best = Some((v.len(), i as u8));
        }
    }
    best.map(|(_, i)| i)
}

fn value_string(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

fn claim_from_object(m: &Map<String, Value>, t: &Template) -> Claim {
    let mut c = EMPTY;
    for (k, v) in m {
        if let (Some(f), Some(s)) = (field_index(t, k), value_string(v)) {
            if let Some(i) = value_index(t, f, &s) {
                c[f] = i;
            }
        }
    }
    c
}

/// Parse `field=value` pairs out of free text (see the module docs). Pairs with unknown
/// values are dropped.
pub fn parse_claim(s: &str, t: &Template) -> Claim {
    let lower = s.to_ascii_lowercase();
    let bytes = lower.as_bytes();
    // (key start, value start, field)
    let mut keys: Vec<(usize, usize, usize)> = Vec::new();
    for (f, name) in t.fields.iter().enumerate() {
        let name = name.to_ascii_lowercase();
        for (pos, _) in lower.match_indices(&name) {
            if pos > 0 {
                let b = bytes[pos - 1];
                if b.is_ascii_alphanumeric() || b == b'_' {
                    continue;
                }
            }
            let mut j = pos + name.len();
            while j < bytes.len() && (bytes[j] == b' ' || bytes[j] == b'"' || bytes[j] == b'\'') {
                j += 1;
            }
            if j < bytes.len() && (bytes[j] == b'=' || bytes[j] == b':') {
                keys.push((pos, j + 1, f));
            }
        }
    }
    keys.sort_unstable();
    let mut c = EMPTY;
    for (k, &(_, vstart, f)) in keys.iter().enumerate() {
        let vend = keys.get(k + 1).map_or(s.len(), |n| n.0);
        if vend < vstart || !s.is_char_boundary(vstart) || !s.is_char_boundary(vend) {
            continue;
        }
        let raw = s[vstart..vend]
            .trim()
            .trim_end_matches([';', ',', '|', '}', '"', '\''])
            .trim();
        if c[f] == NONE {
            if let Some(i) = value_index(t, f, raw) {
                c[f] = i;
            }
        }
    }
    c
}

fn report(o: &Map<String, Value>, t: &Template) -> Result<Report, String> {
    let Some(Value::Object(m)) = get(o, "final_report").or_else(|| get(o, "report")) else {
        return Err(
            "publish needs a \"final_report\" object: {\"field\": {\"value\": ..., \
\"confidence\": ...}}"
                .into(),
        );
    };
    let mut r = Report::default();
    for (k, v) in m {
        let f = field_index(t, k).ok_or_else(|| {
            format!(
                "publish: unknown field \"{}\"; fields: {}",
                clean_text(k, 40),
                t.fields.join(", ")
            )
        })?;
        let e = v.as_object().ok_or_else(|| {
            format!(
                "publish: \"{}\" must be {{\"value\": ..., \"confidence\": ...}}",
                t.fields[f]
            )
        })?;
        let val = get(e, "value")
            .and_then(value_string)
            .ok_or_else(|| format!("publish: \"{}\" needs a \"value\"", t.fields[f]))?;
        let i = value_index(t, f, &val).ok_or_else(|| {
            format!(
                "publish: \"{}\" is not a value of {}; values: {}",
                clean_text(&val, 40),
                t.fields[f],
                t.values[f].join(" | ")
            )
        })?;
        let c = get(e, "confidence")
            .and_then(number)
            .filter(|c| (0.0..=1.0).contains(c))
            .ok_or_else(|| {
                format!(
                    "publish: \"{}\" needs a \"confidence\" in [0, 1]",
                    t.fields[f]
                )
            })?;
        r.values[f] = i;
        r.conf[f] = c as f32;
    }
    if r.values == EMPTY {
        return Err("publish: the final_report names no field".into());
    }
    Ok(r)
}

/// A claim as text: `field=value; field=value` (fields it names only).
pub fn claim_text(c: &Claim, t: &Template, out: &mut String) {
    let mut first = true;
    for f in 0..FIELDS {
        if c[f] < VALUES as u8 {
            if !first {
                out.push_str("; ");
            }
            first = false;
            out.push_str(t.fields[f]);
            out.push('=');
            out.push_str(t.values[f][c[f] as usize]);
        }
    }
}

fn claim_string(c: &Claim, t: &Template) -> String {
    let mut s = String::new();
    claim_text(c, t, &mut s);
    s
}

/// The JSON text of an action (what scripted policies answer).
pub fn action_json(a: &Action, t: &Template) -> String {
    // The shortest decimal that reads back as the same f32.
    let conf = |c: f32| -> Value {
        format!("{c}")
            .parse::<f64>()
            .ok()
            .and_then(serde_json::Number::from_f64)
            .map_or(Value::Null, Value::Number)
    };
    let v = match a {
        Action::Wait => serde_json::json!({"tool": "wait"}),
        Action::Send {
            target,
            claim,
            conf: c,
            source,
            text,
        } => {
            let mut v = serde_json::json!({
                "tool": "send_message",
                "target_id": target,
                "content": text.clone().unwrap_or_else(|| claim_string(claim, t)),
                "confidence": conf(*c),
            });
            if let Some(s) = source {
                v["claimed_source"] = s.clone().into();
            }
            v
        }
        Action::Broadcast {
            claim,
            conf: c,
            source,
            text,
        } => {
            let mut v = serde_json::json!({
                "tool": "broadcast",
                "content": text.clone().unwrap_or_else(|| claim_string(claim, t)),
                "confidence": conf(*c),
            });
            if let Some(s) = source {
                v["claimed_source"] = s.clone().into();
            }
            v
        }
        Action::FactCheck { claim } => {
            serde_json::json!({"tool": "fact_check", "content": claim_string(claim, t)})
        }
        Action::RequestVerify { target, claim } => serde_json::json!({
            "tool": "request_verify", "target_id": target, "content": claim_string(claim, t)
        }),
        Action::Accuse { target } => serde_json::json!({"tool": "accuse", "target_id": target}),
        Action::Publish(r) => {
            let mut m = Map::new();
            for f in 0..FIELDS {
                if r.values[f] < VALUES as u8 {
                    m.insert(
                        t.fields[f].to_string(),
                        serde_json::json!({
                            "value": t.values[f][r.values[f] as usize],
                            "confidence": conf(r.conf[f]),
                        }),
                    );
                }
            }
            serde_json::json!({"tool": "publish", "final_report": m})
        }
    };
    in_prompt_order(&v, t)
}

/// An action object as text in the order the prompts write it: `tool` first, then its
/// arguments, a report's fields in the template's order, each `value` before its
/// `confidence`. serde_json sorts keys, which put `final_report`, `content` or
/// `target_id` before the tool: a demonstration then chose its tool with its first key,
/// unlike every example in the prompts, and a publication differed from a wait in one
/// token that said nothing about the tool.
fn in_prompt_order(v: &Value, t: &Template) -> String {
    const ORDER: [&str; 7] = [
        "tool",
        "target_id",
        "content",
        "value",
        "confidence",
        "claimed_source",
        "final_report",
    ];
    let Value::Object(m) = v else {
        return v.to_string();
    };
    let rank = |k: &str| {
        ORDER
            .iter()
            .chain(t.fields.iter())
            .position(|o| *o == k)
            .unwrap_or(usize::MAX)
    };
    let mut keys: Vec<&String> = m.keys().collect();
    keys.sort_by_key(|k| rank(k));
    let fields: Vec<String> = keys
        .into_iter()
        .map(|k| {
            format!(
                "{}:{}",
                Value::from(k.as_str()),
                in_prompt_order(&m[k.as_str()], t)
            )
        })
        .collect();
    format!("{{{}}}", fields.join(","))
}

#[cfg(test)]
mod tests {
    use super::super::rules::TEMPLATES;
    use super::*;

    #[test]
    fn claims_parse_in_every_form() {
        let t = &TEMPLATES[0];
        let want = [0, 0, 1, NONE];
        for s in [
            "location=Reactor 7; incident=coolant leak; time=11:42",
            "[industrial_incident] location=Reactor 7 incident=coolant leak time=11:42",
            "Location: reactor 7, Incident: Coolant Leak, time = 11:42",
            "location=Reactor 7 (likely) | incident=coolant leak | time=11:42 | casualties=9",
        ] {
            assert_eq!(parse_claim(s, t), want, "{s}");
        }
        assert_eq!(parse_claim("no pairs here", t), EMPTY);
        // "Reactor 4" is not "Reactor 7", and "Reactor 74" is neither.
        assert_eq!(parse_claim("location=Reactor 74", t), EMPTY);
        let t = &TEMPLATES[1];
        assert_eq!(parse_claim("movement=up 5%; ticker=NOVA", t)[..2], [3, 2]);
    }

    #[test]
    fn a_bare_report_is_a_publish() {
        let t = &TEMPLATES[0];
        let text = r#"{"final_report": {"location": {"value": "Reactor 7", "confidence": 0.8}}}"#;
        match parse_action(text, t) {
            Ok(Action::Publish(r)) => {
                assert_eq!(r.values[0], 0);
                assert_eq!(r.conf[0], 0.8);
            }
            other => panic!("{other:?}"),
        }
        // Without a report object it names no tool.
        assert!(parse_action(r#"{"final_report": "Reactor 7"}"#, t).is_err());
    }

    #[test]
    fn actions_round_trip_and_reject() {
        let t = &TEMPLATES[2];
        let acts = [
            Action::Wait,
            Action::Accuse { target: 2 },
            Action::FactCheck {
                claim: [1, NONE, 2, NONE],
            },
            Action::RequestVerify {
                target: 0,
                claim: [1, 1, 1, 1],
            },
            Action::Send {
                target: 3,
                claim: [0, 1, 2, 3],
                conf: 0.75,
                source: Some("witness".into()),
                text: None,
            },
            Action::Broadcast {
                claim: EMPTY,
                conf: 0.5,
                source: None,
                text: Some("hello all".into()),
            },
            Action::Publish(Report {
                values: [0, 1, NONE, 3],
                conf: [0.5, 0.25, 0.0, 1.0],
            }),
        ];
        for a in acts {
            let j = action_json(&a, t);
            assert!(j.starts_with(r#"{"tool":""#), "{j}");
            if let Action::Publish(_) = a {
                let at = |k: &str| j.find(k).unwrap_or(usize::MAX);
                let field = |f: usize| at(&format!("\"{}\"", t.fields[f]));
                assert!(field(0) < field(1) && field(1) < field(3), "{j}");
                assert!(at("\"value\"") < at("\"confidence\""), "{j}");
            }
            assert_eq!(parse_action(&j, t), Ok(a.clone()), "{j}");
            let wrapped = format!("Sure! ```json\n{j}\n``` done");
            assert_eq!(parse_action(&wrapped, t), Ok(a), "{wrapped}");
        }
        let nested = r#"{"name": "accuse", "arguments": {"target_id": "4"}}"#;
        assert_eq!(parse_action(nested, t), Ok(Action::Accuse { target: 4 }));
        for bad in [
            "",
            "wait",
            r#"{"tool": "dance"}"#,
            r#"{"tool": "accuse"}"#,
            r#"{"tool": "fact_check", "content": "nothing"}"#,
            r#"{"tool": "send_message", "target_id": 1, "content": "x", "confidence": 3}"#,
            r#"{"tool": "publish", "final_report": {}}"#,
            r#"{"tool": "publish", "final_report": {"region": "North-7"}}"#,
            r#"{"tool": "publish", "final_report": {"planet": {"value": "x", "confidence": 1}}}"#,
            r#"{"tool": "publish", "final_report": {"region": {"value": "Mars", "confidence": 1}}}"#,
            r#"{"tool": "publish", "final_report": {"region": {"value": "North-7"}}}"#,
        ] {
            assert!(parse_action(bad, t).is_err(), "{bad}");
        }
    }
}

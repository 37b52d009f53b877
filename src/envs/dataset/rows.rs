//! Reading a JSONL dataset: one prompt per line, its reference answer and any fields,
//! and the split into training and held-out rows.
use crate::chat::{check_messages, Message};
use anyhow::{bail, Context, Result};
use serde_json::Value;
use std::path::Path;

/// One line of the file.
#[derive(Debug, Clone)]
pub struct Row {
    /// 1-based line number in the file (reports and errors name it).
    pub line: usize,
    /// What the model sees.
    pub prompt: Vec<Message>,
    /// The demonstration SFT imitates: the row's `completion_key` field, else the
    /// conversation's final assistant message, else the reference answer as text.
    pub demonstration: Option<String>,
    /// Every field of the line (references, ids, schemas).
    pub fields: serde_json::Map<String, Value>,
    /// A hash of the prompt's messages (without a trailing assistant turn, before
    /// `system` is added): which side of a fractional split the row falls on.
    pub key: u64,
}

/// How a line becomes a [`Row`].
#[derive(Debug, Clone)]
pub struct Layout {
    /// The prompt field; `None`: `messages` if the line has it, else `prompt`.
    pub prompt_key: Option<String>,
    pub answer_key: String,
    pub completion_key: String,
    /// Put first when a prompt has no system message of its own.
    pub system: Option<String>,
}

/// Every non-blank line of `path`, in order; an error names the file and line.
pub fn read(path: &Path, layout: &Layout) -> Result<Vec<Row>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading dataset {}", path.display()))?;
    let mut rows = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let at = || format!("{} line {}", path.display(), i + 1);
        let fields = match serde_json::from_str::<Value>(line).with_context(at)? {
            Value::Object(m) => m,
            other => bail!("{}: expected a JSON object, got {}", at(), kind(&other)),
        };
        rows.push(row(i + 1, fields, layout).with_context(at)?);
    }
    anyhow::ensure!(!rows.is_empty(), "dataset {} has no rows", path.display());
    Ok(rows)
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Array(_) => "an array",
        Value::String(_) => "a string",
        Value::Number(_) => "a number",
        Value::Bool(_) => "a boolean",
        Value::Null => "null",
        Value::Object(_) => "an object",
    }
}

fn row(line: usize, fields: serde_json::Map<String, Value>, layout: &Layout) -> Result<Row> {
    let key = match &layout.prompt_key {
        Some(k) => k.as_str(),
        None if fields.contains_key("messages") => "messages",
        None => "prompt",
    };
    let raw = fields
        .get(key)
        .with_context(|| format!("no `{key}` field (the prompt: a string or a message list)"))?;
    let mut prompt = match raw {
        Value::String(s) => vec![Message::user(s.clone())],
        Value::Array(_) => {
            serde_json::from_value::<Vec<Message>>(raw.clone()).with_context(|| {
                format!("`{key}` must be a list of {{\"role\", \"content\"}} messages")
            })?
        }
        _ => bail!("`{key}` must be a string or a list of messages"),
    };
    // a conversation that ends with the assistant's turn carries its demonstration
    let mut last_turn: Option<String> = None;
    while prompt.last().is_some_and(|m| m.role == "assistant") {
        let turn = prompt.pop().map(|m| m.content);
        // the final message is the demonstration; earlier trailing turns are dropped
        last_turn = last_turn.or(turn);
    }
    check_messages(&prompt).with_context(|| format!("`{key}`"))?;
    // the question as asked, in either layout: demonstrations and `system` do not move
    // a row across the split
    let key_hash = fnv1a(&serde_json::to_string(&prompt)?);
    if let Some(system) = &layout.system {
        if prompt.first().is_none_or(|m| m.role != "system") {
            prompt.insert(0, Message::system(system.clone()));
        }
    }
    let demonstration = match fields.get(&layout.completion_key) {
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => bail!("`{}` must be a string", layout.completion_key),
        None => last_turn.or_else(|| answer_text(fields.get(&layout.answer_key))),
    };
    Ok(Row {
        line,
        prompt,
        demonstration,
        fields,
        key: key_hash,
    })
}

fn answer_text(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::String(s) => Some(s.clone()),
        Value::Array(a) => answer_text(a.first()),
        Value::Null => None,
        other => Some(other.to_string()),
    }
}

/// Which rows are held out.
#[derive(Debug, Clone, PartialEq)]
pub enum Split {
    /// This fraction of the rows, chosen by a hash of each row's prompt, so a row keeps
    /// its side when other rows are added or reordered.
    Fraction(f64),
    /// Rows whose `key` field equals `value` (as text).
    Field { key: String, value: String },
}

/// Row indices (training, held-out); an error when either side is empty.
pub fn split(rows: &[Row], how: &Split) -> Result<(Vec<usize>, Vec<usize>)> {
    let held = |r: &Row| match how {
        // FNV's low bits are weak (the lowest is the parity of the bytes' low bits):
        // the split reads the top 53 bits of its splitmix64 finish.
        Split::Fraction(f) => {
            let unit = (crate::rng::splitmix64(r.key) >> 11) as f64 / (1u64 << 53) as f64;
            unit < *f
        }
        Split::Field { key, value } => r.fields.get(key).is_some_and(|v| match v {
            Value::String(s) => s == value,
            // a number or boolean field matches the value read as JSON (`"1"`, `"true"`)
            other => serde_json::from_str::<Value>(value).is_ok_and(|v| v == *other),
        }),
    };
    let (held_out, train): (Vec<usize>, Vec<usize>) =
        (0..rows.len()).partition(|&i| held(&rows[i]));
    let what = match how {
        Split::Fraction(f) => format!("`held_out` = {f} of {} rows", rows.len()),
        Split::Field { key, value } => format!("`split_key` {key:?} = {value:?}"),
    };
    anyhow::ensure!(
        !held_out.is_empty(),
        "{what} holds out no row: nothing to evaluate on"
    );
    anyhow::ensure!(
        !train.is_empty(),
        "{what} holds out every row: nothing to train on"
    );
    Ok((train, held_out))
}

/// FNV-1a, 64-bit: stable across runs and platforms (std's hasher is seeded).
pub fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

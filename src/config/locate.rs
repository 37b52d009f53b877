//! Where a config error is: file, line and key for parse, validation, stage and
//! environment errors, and the `--set section.key=value` overrides they may come from.
use super::stage::StageSpec;
use anyhow::{anyhow, bail, Result};

/// Where a config came from, for error messages.
pub(super) struct Source<'a> {
    pub(super) path: &'a str,
    pub(super) text: &'a str,
}

/// A failed range or consistency check, before the file and line are known.
pub(super) struct ValidationError {
    /// (section, key) the error is about, to find its line.
    key: Option<(String, String)>,
    message: String,
}

impl ValidationError {
    /// An error about `section.key`, reported at that key's line.
    pub(super) fn at(section: &str, key: &str, msg: impl std::fmt::Display) -> Self {
        Self {
            key: Some((section.to_string(), key.to_string())),
            message: compact_numbers(&format!("{section}.{key}: {msg}")),
        }
    }

    /// An error no single key's line shows (a missing key or section, a count).
    pub(super) fn unkeyed(message: impl Into<String>) -> Self {
        Self {
            key: None,
            message: compact_numbers(&message.into()),
        }
    }

    pub(super) fn message(&self) -> &str {
        &self.message
    }

    /// "FILE: line N: message" when the key is written in `text`, "(set by --set)"
    /// when an override set it: the line would show the value the flag replaced.
    pub(super) fn locate(&self, text: &str, origin: &str, sets: &[String]) -> anyhow::Error {
        let line = self
            .key
            .as_ref()
            .and_then(|(section, key)| find_key_line(text, section, key));
        let set_by_flag = self.key.as_ref().is_some_and(|(section, key)| {
            sets.iter()
                .any(|s| s.split('=').next().map(str::trim) == Some(&format!("{section}.{key}")))
        });
        match (line, set_by_flag) {
            (_, true) => anyhow!("{origin}: {} (set by --set)", self.message),
            (Some(l), false) => anyhow!("{origin}: line {l}: {}", self.message),
            (None, false) => anyhow!("{origin}: {}", self.message),
        }
    }
}

/// `text` with every number written out in more than 24 characters (`1e308` as
/// Display writes an f64: 309 digits) in scientific notation: a screen of zeros hides
/// the rest of the message. Integers up to u64's 20 digits stay exact.
fn compact_numbers(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find(|c: char| c.is_ascii_digit()) {
        out.push_str(&rest[..i]);
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(tail.len());
        let number = tail[..end].trim_end_matches('.');
        match number.parse::<f64>() {
            Ok(v) if number.len() > 24 => out.push_str(&format!("{v:e}")),
            _ => out.push_str(number),
        }
        rest = &tail[number.len()..];
    }
    out.push_str(rest);
    out
}

/// Put the line of the `[[stage]]` table a [`super::stage::check`] error names (by its
/// quoted name) on it.
pub(super) fn locate_stage_error(
    text: &str,
    origin: &str,
    stages: &[StageSpec],
    e: &anyhow::Error,
) -> anyhow::Error {
    let line = stages
        .iter()
        .position(|s| format!("{e:#}").contains(&format!("`{}`", s.name)))
        .and_then(|i| stage_line(text, i));
    match line {
        Some(l) => anyhow!("{origin}: line {l}: {e:#}"),
        None => anyhow!("{origin}: {e:#}"),
    }
}

/// Put a file name and line on an error raised while building the environments of
/// `[env]` / `[env.options]` / `[stage.options.ENV]` from the config text `text` (read
/// from `origin`): the line assigning the option (or naming the environment) the
/// message quotes in backticks, else the line of the options table or of `[env]`.
pub fn locate_env_error(text: &str, origin: &str, e: &anyhow::Error) -> anyhow::Error {
    let msg = format!("{e:#}");
    let quoted: Vec<&str> = msg.split('`').skip(1).step_by(2).collect();
    let is_options = |h: &str| h == "env.options" || h.starts_with("stage.options");
    let mut current = String::new();
    let mut table_line = None;
    let mut key_line = None;
    for (i, line) in text.lines().enumerate() {
        if let Some(h) = header_name(line) {
            if table_line.is_none() && (is_options(&h) || h == "env") {
                table_line = Some(i + 1);
            }
            current = h;
            continue;
        }
        let Some((lhs, rhs)) = line.trim_start().split_once('=') else {
            continue;
        };
        let lhs = lhs.trim().trim_matches('"');
        let lhs = lhs.strip_prefix("options.").unwrap_or(lhs);
        let rhs = rhs.trim().trim_matches('"');
        let hit = (is_options(&current) || current == "env") && quoted.contains(&lhs)
            || (current == "env" && lhs == "name" && quoted.contains(&rhs));
        if hit && key_line.is_none() {
            key_line = Some(i + 1);
        }
    }
    match key_line.or(table_line) {
        Some(l) => anyhow!("{origin}: line {l}: {msg}"),
        None => anyhow!("{origin}: [env]: {msg}"),
    }
}

/// Turn a toml deserialisation error into "FILE: line N: message (in [section])".
pub(super) fn de_error(src: &Source, e: &toml::de::Error) -> anyhow::Error {
    let msg = e.message().trim().to_string();
    match e.span() {
        Some(span) => {
            let (line, col) = line_col(src.text, span.start);
            let section = section_at(src.text, span.start);
            let what = src.text.get(span.clone()).unwrap_or("").trim();
            let key_note = if msg.starts_with("unknown field") || what.is_empty() {
                String::new()
            } else {
                format!(" (at `{}`)", truncate(what, 40))
            };
            let sec_note = match (&section, key_before(src.text, span.start)) {
                (Some(s), Some(k)) => format!(" in [{s}], key `{s}.{k}`"),
                (None, Some(k)) => format!(", key `{k}`"),
                (Some(s), None) => format!(" in [{s}]"),
                (None, None) => String::new(),
            };
            anyhow!(
                "{}: line {line}, column {col}{sec_note}: {msg}{key_note}",
                src.path
            )
        }
        None => anyhow!("{}: {msg}", src.path),
    }
}

/// The key assigned on the line of byte offset `pos`, when `pos` is in its value
/// (`loss_type = "bogus"` -> `loss_type`): a bad value's error then names its key.
fn key_before(text: &str, pos: usize) -> Option<String> {
    let pos = pos.min(text.len());
    let start = text[..pos].rfind('\n').map_or(0, |i| i + 1);
    let (key, _) = text[start..pos].split_once('=')?;
    let key = key.trim().trim_matches(|c| c == '"' || c == '\'');
    let plain = |c: char| c.is_ascii_alphanumeric() || "_-.".contains(c);
    (!key.is_empty() && key.chars().all(plain)).then(|| key.to_string())
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        format!("{}...", s.chars().take(n).collect::<String>())
    }
}

/// 1-based line and column of byte offset `pos`.
fn line_col(text: &str, pos: usize) -> (usize, usize) {
    let pos = pos.min(text.len());
    let before = &text.as_bytes()[..pos];
    let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
    let col = pos
        - before
            .iter()
            .rposition(|&b| b == b'\n')
            .map_or(0, |p| p + 1)
        + 1;
    (line, col)
}

/// The table header (`[x]` / `[[x]]`) in force at byte offset `pos`.
fn section_at(text: &str, pos: usize) -> Option<String> {
    let mut current = None;
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        if offset > pos {
            break;
        }
        if let Some(h) = header_name(line) {
            current = Some(h);
        }
        offset += line.len();
    }
    current
}

fn header_name(line: &str) -> Option<String> {
    let t = line.trim();
    if t.starts_with("[[") {
        let end = t.find("]]")?;
        Some(t[2..end].trim().to_string())
    } else if t.starts_with('[') {
        let end = t.find(']')?;
        Some(t[1..end].trim().to_string())
    } else {
        None
    }
}

/// Line (1-based) of the `i`-th `[[stage]]` header.
fn stage_line(text: &str, i: usize) -> Option<usize> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| l.trim() == "[[stage]]")
        .nth(i)
        .map(|(n, _)| n + 1)
}

/// 1-based line where `key` is assigned inside `[section]`, if written plainly.
fn find_key_line(text: &str, section: &str, key: &str) -> Option<usize> {
    let mut current = String::new();
    for (i, line) in text.lines().enumerate() {
        if let Some(h) = header_name(line) {
            current = h;
            continue;
        }
        let t = line.trim_start();
        let (lhs, _) = match t.split_once('=') {
            Some(x) => x,
            None => continue,
        };
        let lhs = lhs.trim().trim_matches('"');
        if (current == section && lhs == key)
            || (current.is_empty() && lhs == format!("{section}.{key}"))
        {
            return Some(i + 1);
        }
    }
    None
}

/// Apply one `section.key=value` override: the value is parsed as TOML
/// (`0.7`, `true`, `"x"`, `[1, 2]`), falling back to a plain string (`cuda:0`).
pub fn apply_set(table: &mut toml::Table, set: &str) -> Result<()> {
    let (path, raw) = set
        .split_once('=')
        .ok_or_else(|| anyhow!("--set `{set}`: expected section.key=value"))?;
    let path = path.trim();
    let raw = raw.trim();
    let parts: Vec<&str> = path.split('.').map(str::trim).collect();
    if parts.len() < 2 || parts.iter().any(|p| p.is_empty()) {
        bail!("--set `{set}`: expected section.key=value (e.g. grpo.temperature=0.7)");
    }
    let value = parse_set_value(raw);
    let digits = raw.strip_prefix(['+', '-']).unwrap_or(raw).replace('_', "");
    if value.is_str() && !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
        // TOML integers are i64; the string fallback would report "invalid type: string"
        bail!(
            "--set `{path}`: {raw} is out of range: integers are at most {}",
            i64::MAX
        );
    }
    let mut t = table;
    for (i, p) in parts[..parts.len() - 1].iter().enumerate() {
        let entry = t
            .entry(p.to_string())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        t = match entry {
            toml::Value::Table(tt) => tt,
            _ => bail!("--set `{set}`: `{}` is not a table", parts[..=i].join(".")),
        };
    }
    t.insert(parts[parts.len() - 1].to_string(), value);
    Ok(())
}

fn parse_set_value(raw: &str) -> toml::Value {
    match toml::from_str::<toml::Table>(&format!("v = {raw}")) {
        Ok(mut t) => t
            .remove("v")
            .unwrap_or_else(|| toml::Value::String(raw.to_string())),
        Err(_) => toml::Value::String(raw.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    const MIN: &str = "[model]\nname = \"tiny\"\n[env]\nname = \"ticketmelt\"\n";

    #[test]
    fn a_failed_check_names_its_line_or_its_flag() {
        let t = MIN.replace("[env]", "[grpo]\ntemperature = 0.0\n[env]");
        let e = Config::from_toml_str(&t, "c.toml", &[]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "c.toml: line 4: grpo.temperature: 0 must be > 0"
        );
        let set = ["grpo.temperature=0.0".to_string()];
        let e = Config::from_toml_str(&t, "c.toml", &set).unwrap_err();
        assert_eq!(
            e.to_string(),
            "c.toml: grpo.temperature: 0 must be > 0 (set by --set)"
        );
    }

    #[test]
    fn line_col_and_sections() {
        let t = "a = 1\n[x]\nb = 2\n";
        assert_eq!(line_col(t, 0), (1, 1));
        assert_eq!(line_col(t, 10), (3, 1));
        assert_eq!(section_at(t, 10).as_deref(), Some("x"));
        assert_eq!(find_key_line(t, "x", "b"), Some(3));
        assert_eq!(key_before(t, 14).as_deref(), Some("b"));
        assert_eq!(key_before(t, 10), None);
    }

    /// A bad value names its key, not only its line and section (issue #31, item 21).
    #[test]
    fn a_bad_enum_value_names_its_key() {
        let t = MIN.replace("[env]", "[grpo]\nloss_type = \"bogus_loss\"\n[env]");
        let e = Config::from_toml_str(&t, "c.toml", &[])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("key `grpo.loss_type`") && e.contains("bogus_loss"),
            "{e}"
        );
    }

    #[test]
    fn set_values() {
        assert_eq!(parse_set_value("0.7"), toml::Value::Float(0.7));
        assert_eq!(
            parse_set_value("cuda:0"),
            toml::Value::String("cuda:0".into())
        );
        assert_eq!(
            parse_set_value("\"x y\""),
            toml::Value::String("x y".into())
        );
        assert_eq!(parse_set_value("true"), toml::Value::Boolean(true));
        let mut t = toml::Table::new();
        let e = apply_set(&mut t, "run.seed=99999999999999999999").unwrap_err();
        assert!(e.to_string().contains("run.seed") && e.to_string().contains("out of range"));
        apply_set(&mut t, "run.name=007x").unwrap();
        // The same integer in a file names its line and key, not "invalid type".
        let e = Config::from_toml_str("[run]\nsteps = 99999999999999999999\n", "big.toml", &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains("big.toml") && e.contains("line 2"), "{e}");
        assert!(e.contains("run.steps") && e.contains("too large"), "{e}");
    }

    /// Issue 54, item 14: a huge value is echoed in scientific notation, and the rest of
    /// the message survives.
    #[test]
    fn huge_values_are_echoed_short() {
        assert_eq!(compact_numbers("x: 1.5 and 12 of 3"), "x: 1.5 and 12 of 3");
        let long = format!("{}", 1e308_f64);
        assert_eq!(long.len(), 309);
        assert_eq!(
            compact_numbers(&format!("a: {long} must be")),
            "a: 1e308 must be"
        );
        assert_eq!(compact_numbers("v 0.00000000000000000000001."), "v 1e-23.");
        assert_eq!(
            compact_numbers("seed 18446744073709551615"),
            "seed 18446744073709551615"
        );
        for (key, set) in [
            ("optim.learning_rate", "optim.learning_rate=1e308"),
            ("grpo.epsilon", "grpo.epsilon=1e308"),
            ("grpo.temperature", "grpo.temperature=1e308"),
            ("grpo.top_p", "grpo.top_p=1e308"),
        ] {
            let e = Config::from_toml_str(MIN, "c.toml", &[set.to_string()])
                .unwrap_err()
                .to_string();
            assert!(
                e.contains(key) && e.contains("1e308") && e.len() < 200,
                "{e}"
            );
        }
    }
}

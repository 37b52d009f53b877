//! Verifiers: each scores a completion 0 or 1 against a row (its reference answer,
//! or a schema or pattern of its own). The exact rules are in the doc of each
//! [`Check`] variant and in `docs/your-own-task.md`.
use super::extract::{answer_number, Extract};
use super::schema::Schema;
use anyhow::{bail, Context, Result};
use serde_json::Value;

/// One verifier of a dataset: a named reward component.
#[derive(Debug, Clone)]
pub struct Verifier {
    /// Component name (`rewards/<name>/mean` in the log); default: the kind.
    pub name: String,
    pub check: Check,
    pub extract: Extract,
    /// Row field holding the reference; default: the dataset's `answer_key`.
    pub reference: String,
}

/// What a verifier checks.
#[derive(Debug, Clone)]
pub enum Check {
    /// The answer equals the reference (or one of a list of references) after
    /// normalising both: trim, every whitespace run made one space, lowercase unless
    /// `case_sensitive`, and with `strip_punctuation` the characters
    /// `. , ; : ! ? " ' `` ` `` removed from both ends.
    Exact {
        case_sensitive: bool,
        strip_punctuation: bool,
    },
    /// The answer's number (inside the last `\boxed{}`, else the first after the last
    /// `####`, else the last number in the text; see [`answer_number`]) is within
    /// `max(tolerance, relative * |reference|)` of the reference's number (read by the
    /// same rule, so a GSM8K answer `...#### 72` gives 72).
    Numeric { tolerance: f64, relative: f64 },
    /// The pattern (the `regex` crate's syntax; `(?s)` lets `.` match line breaks, as
    /// Python's `re.DOTALL`) matches somewhere in the answer; with `full`, the whole
    /// answer. Needs no reference.
    Regex { pattern: regex::Regex },
    /// The answer, with a surrounding ```` ``` ```` fence removed, parses as JSON and
    /// satisfies the schema: the verifier's own `schema`, else the row's
    /// `schema_key` field (an object, or a string holding one).
    JsonSchema {
        schema: Option<Schema>,
        schema_key: Option<String>,
    },
    /// The answer's choice letter equals the reference's (a letter, or a 0-based index).
    /// `X` is an uppercase letter of `letters`; the first rule that finds one decides:
    /// the last `answer`/`option`/`choice` (any case), optionally `is` or `:`, then
    /// `X`, which may be wrapped in `( )`, `**`, `$` or `\boxed{ }` / `\text{ }`; an
    /// answer that starts with `X)`, `X.` or `X:` (`B) 42`, `(B) Paris`); the whole
    /// answer when it is one letter with optional `()` and `.`; the last `(X)`.
    Choice {
        letters: String,
        stated: regex::Regex,
        leading: regex::Regex,
        paren: regex::Regex,
    },
    /// The reference (or the verifier's fixed `text`) occurs in the answer, both
    /// normalised as `exact` does with its defaults unless `case_sensitive`.
    Contains {
        case_sensitive: bool,
        text: Option<String>,
    },
}

impl Check {
    pub const KINDS: &'static [&'static str] = &[
        "exact",
        "numeric",
        "regex",
        "json_schema",
        "choice",
        "contains",
    ];

    /// Whether this check reads the row's reference field.
    pub fn needs_reference(&self) -> bool {
        match self {
            Check::Regex { .. } | Check::JsonSchema { .. } => false,
            Check::Contains { text, .. } => text.is_none(),
            _ => true,
        }
    }
}

impl Verifier {
    /// The score of `completion` on `row` (0 or 1).
    pub fn score(&self, completion: &str, row: &serde_json::Map<String, Value>) -> f64 {
        let Some(answer) = self.extract.apply(completion) else {
            return 0.0;
        };
        let reference = row.get(&self.reference);
        if self.check.needs_reference() && reference.is_none() {
            return 0.0;
        }
        let ok = match &self.check {
            Check::Exact {
                case_sensitive,
                strip_punctuation,
            } => references(reference).iter().any(|r| {
                normalise(answer, *case_sensitive, *strip_punctuation)
                    == normalise(r, *case_sensitive, *strip_punctuation)
            }),
            Check::Numeric {
                tolerance,
                relative,
            } => numeric(answer, reference, *tolerance, *relative),
            Check::Regex { pattern } => pattern.is_match(answer),
            Check::JsonSchema { schema, schema_key } => {
                json_schema(answer, schema.as_ref(), schema_key.as_deref(), row)
            }
            Check::Choice {
                letters,
                stated,
                leading,
                paren,
            } => choice(answer, letters, [stated, leading], paren).is_some_and(|got| {
                reference.and_then(|r| reference_letter(r, letters)) == Some(got)
            }),
            Check::Contains {
                case_sensitive,
                text,
            } => {
                let hay = normalise(answer, *case_sensitive, false);
                let needles = match text {
                    Some(t) => vec![t.clone()],
                    None => references(reference),
                };
                needles.iter().any(|n| {
                    let n = normalise(n, *case_sensitive, false);
                    !n.is_empty() && hay.contains(&n)
                })
            }
        };
        if ok {
            1.0
        } else {
            0.0
        }
    }

    /// Why this verifier cannot judge answers to `row`: its reference field is missing,
    /// empty, or not what its kind reads (no number for `numeric`, no letter or index
    /// for `choice`). Checked for every row when the dataset loads, so a misnamed
    /// `answer_key` is an error, not a reward of 0 everywhere.
    pub fn check_row(&self, row: &serde_json::Map<String, Value>) -> Result<()> {
        if !self.check.needs_reference() {
            return Ok(());
        }
        let (name, field) = (&self.name, &self.reference);
        let r = row
            .get(field)
            .with_context(|| format!("no `{field}` field (the reference of verifier `{name}`)"))?;
        let readable = match &self.check {
            Check::Numeric { .. } => !numeric_references(Some(r)).is_empty(),
            Check::Choice { letters, .. } => reference_letter(r, letters).is_some(),
            _ => references(Some(r)).iter().any(|x| !x.trim().is_empty()),
        };
        anyhow::ensure!(
            readable,
            "`{field}` = {r} is not a reference verifier `{name}` can read"
        );
        Ok(())
    }

    /// A verifier from its config table (`[[env.options.verifiers]]`), or a bare kind
    /// name (`verifier = "numeric"`). `answer_key` is the dataset's default reference.
    pub fn from_toml(v: &toml::Value, answer_key: &str) -> Result<Self> {
        match v {
            toml::Value::String(kind) => Self::from_table(
                &toml::Table::from_iter([("kind".into(), kind.clone().into())]),
                answer_key,
            ),
            toml::Value::Table(t) => Self::from_table(t, answer_key),
            _ => bail!("a verifier is a kind name or a table with `kind`, got {v}"),
        }
    }

    fn from_table(t: &toml::Table, answer_key: &str) -> Result<Self> {
        let kind = str_key(t, "kind")?.context("a verifier needs `kind`")?;
        let check = check_from(kind, t)?;
        let allowed = allowed_keys(kind);
        for k in t.keys() {
            anyhow::ensure!(
                ["kind", "name", "extract", "reference"].contains(&k.as_str())
                    || allowed.contains(&k.as_str()),
                "unknown key `{k}` in a `{kind}` verifier (known: kind, name, extract, \
                 reference{})",
                allowed.iter().map(|a| format!(", {a}")).collect::<String>()
            );
        }
        let extract = match str_key(t, "extract")? {
            None => Extract::Completion,
            Some(e) => Extract::from_name(e).with_context(|| {
                format!(
                    "`extract` must be one of {}, got `{e}`",
                    Extract::NAMES.join(", ")
                )
            })?,
        };
        Ok(Self {
            name: str_key(t, "name")?.unwrap_or(kind).to_string(),
            check,
            extract,
            reference: str_key(t, "reference")?.unwrap_or(answer_key).to_string(),
        })
    }
}

fn allowed_keys(kind: &str) -> &'static [&'static str] {
    match kind {
        "exact" => &["case_sensitive", "strip_punctuation"],
        "numeric" => &["tolerance", "relative"],
        "regex" => &["pattern", "full"],
        "json_schema" => &["schema", "schema_key"],
        "choice" => &["letters"],
        "contains" => &["case_sensitive", "text"],
        _ => &[],
    }
}

fn check_from(kind: &str, t: &toml::Table) -> Result<Check> {
    Ok(match kind {
        "exact" => Check::Exact {
            case_sensitive: bool_key(t, "case_sensitive")?.unwrap_or(false),
            strip_punctuation: bool_key(t, "strip_punctuation")?.unwrap_or(false),
        },
        "numeric" => Check::Numeric {
            tolerance: nonneg_key(t, "tolerance")?.unwrap_or(1e-6),
            relative: nonneg_key(t, "relative")?.unwrap_or(0.0),
        },
        "regex" => {
            let p = str_key(t, "pattern")?.context("a `regex` verifier needs `pattern`")?;
            regex::Regex::new(p).with_context(|| format!("`pattern` {p:?}"))?;
            let anchored = match bool_key(t, "full")?.unwrap_or(false) {
                true => format!(r"\A(?:{p})\z"),
                false => p.to_string(),
            };
            Check::Regex {
                pattern: regex::Regex::new(&anchored)?,
            }
        }
        "json_schema" => json_schema_check(t)?,
        "choice" => {
            let letters = str_key(t, "letters")?.unwrap_or("ABCD").to_string();
            anyhow::ensure!(
                !letters.is_empty() && letters.chars().all(|c| c.is_ascii_uppercase()),
                "`letters` must be uppercase ASCII letters, got {letters:?}"
            );
            let stated = format!(
                r"(?i:answer|option|choice)\s*(?:(?i:is)|:)?[\s:*$]*(?:\\(?:boxed|text|textbf|mathrm)\{{)?\(?\**([{letters}])\**\)?(?:[^A-Za-z0-9]|$)"
            );
            Check::Choice {
                stated: regex::Regex::new(&stated)?,
                leading: regex::Regex::new(&format!(r"\A\s*\(?([{letters}])[).:]"))?,
                paren: regex::Regex::new(&format!(r"\(([{letters}])\)"))?,
                letters,
            }
        }
        "contains" => Check::Contains {
            case_sensitive: bool_key(t, "case_sensitive")?.unwrap_or(false),
            text: str_key(t, "text")?.map(str::to_string),
        },
        _ => bail!(
            "unknown verifier kind `{kind}` (known: {})",
            Check::KINDS.join(", ")
        ),
    })
}

fn json_schema_check(t: &toml::Table) -> Result<Check> {
    let schema = match t.get("schema") {
        None => None,
        Some(s) => {
            let json = serde_json::to_value(s).context("`schema`")?;
            Some(Schema::new(json).context("`schema`")?)
        }
    };
    let schema_key = str_key(t, "schema_key")?.map(str::to_string);
    anyhow::ensure!(
        schema.is_some() != schema_key.is_some(),
        "a `json_schema` verifier needs exactly one of `schema` (a table) and \
         `schema_key` (the row field holding each row's schema)"
    );
    Ok(Check::JsonSchema { schema, schema_key })
}

fn str_key<'a>(t: &'a toml::Table, k: &str) -> Result<Option<&'a str>> {
    t.get(k)
        .map(|v| {
            v.as_str()
                .with_context(|| format!("`{k}` must be a string, got {v}"))
        })
        .transpose()
}

fn bool_key(t: &toml::Table, k: &str) -> Result<Option<bool>> {
    t.get(k)
        .map(|v| {
            v.as_bool()
                .with_context(|| format!("`{k}` must be true or false, got {v}"))
        })
        .transpose()
}

fn nonneg_key(t: &toml::Table, k: &str) -> Result<Option<f64>> {
    t.get(k)
        .map(|v| {
            let x = v.as_float().or_else(|| v.as_integer().map(|i| i as f64));
            x.filter(|x| x.is_finite() && *x >= 0.0)
                .with_context(|| format!("`{k}` must be a number >= 0, got {v}"))
        })
        .transpose()
}

/// The reference's acceptable texts: a string, a number, or a list of those.
fn references(r: Option<&Value>) -> Vec<String> {
    match r {
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Number(n)) => vec![n.to_string()],
        Some(Value::Bool(b)) => vec![b.to_string()],
        Some(Value::Array(a)) => a.iter().flat_map(|x| references(Some(x))).collect(),
        _ => Vec::new(),
    }
}

fn normalise(s: &str, case_sensitive: bool, strip_punctuation: bool) -> String {
    let mut out = s.split_whitespace().collect::<Vec<_>>().join(" ");
    if !case_sensitive {
        out = out.to_lowercase();
    }
    if strip_punctuation {
        out = out
            .trim_matches(|c: char| ".,;:!?\"'`".contains(c))
            .trim()
            .to_string();
    }
    out
}

fn numeric(answer: &str, reference: Option<&Value>, tolerance: f64, relative: f64) -> bool {
    let Some(got) = answer_number(answer) else {
        return false;
    };
    numeric_references(reference)
        .iter()
        .any(|w| (got - w).abs() <= tolerance.max(relative * w.abs()))
}

/// The numbers a reference accepts: a number, a string read as answers are, or a list
/// of those.
fn numeric_references(reference: Option<&Value>) -> Vec<f64> {
    match reference {
        Some(Value::Number(n)) => n.as_f64().into_iter().collect(),
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(|x| x.as_f64().or_else(|| x.as_str().and_then(answer_number)))
            .collect(),
        Some(Value::String(s)) => answer_number(s).into_iter().collect(),
        _ => Vec::new(),
    }
}

fn json_schema(
    answer: &str,
    schema: Option<&Schema>,
    schema_key: Option<&str>,
    row: &serde_json::Map<String, Value>,
) -> bool {
    let Ok(value) = serde_json::from_str::<Value>(unfence(answer)) else {
        return false;
    };
    match (schema, schema_key) {
        (Some(s), _) => s.accepts(&value),
        (None, Some(k)) => row_schema(row, k).is_some_and(|s| s.accepts(&value)),
        (None, None) => false,
    }
}

/// The row's own schema (checked when the dataset loads, so `None` only if absent).
pub fn row_schema(row: &serde_json::Map<String, Value>, key: &str) -> Option<Schema> {
    let v = row.get(key)?;
    let v = match v {
        Value::String(s) => serde_json::from_str(s).ok()?,
        other => other.clone(),
    };
    Schema::new(v).ok()
}

/// The text inside a ```` ```lang ... ``` ```` fence around the whole answer, or the
/// answer trimmed.
fn unfence(answer: &str) -> &str {
    let t = answer.trim();
    let Some(body) = t.strip_prefix("```") else {
        return t;
    };
    let body = body.strip_suffix("```").unwrap_or(body);
    // the language tag runs to the first line break
    body.split_once('\n').map_or(body, |(_, rest)| rest).trim()
}

fn choice(
    answer: &str,
    letters: &str,
    first: [&regex::Regex; 2],
    paren: &regex::Regex,
) -> Option<char> {
    let last = |re: &regex::Regex| {
        re.captures_iter(answer)
            .last()
            .and_then(|c| c.get(1))
            .and_then(|m| m.as_str().chars().next())
    };
    if let Some(c) = first.into_iter().find_map(last) {
        return Some(c);
    }
    let bare = answer.trim().trim_matches(|c| "().".contains(c)).trim();
    let mut cs = bare.chars();
    if let (Some(c), None) = (cs.next(), cs.next()) {
        if letters.contains(c) {
            return Some(c);
        }
    }
    last(paren)
}

fn reference_letter(r: &Value, letters: &str) -> Option<char> {
    match r {
        Value::String(s) => {
            let t = s.trim().trim_matches(|c| "().".contains(c));
            let mut cs = t.chars();
            match (cs.next(), cs.next()) {
                (Some(c), None) if letters.contains(c.to_ascii_uppercase()) => {
                    Some(c.to_ascii_uppercase())
                }
                _ => None,
            }
        }
        Value::Number(n) => n
            .as_u64()
            .and_then(|i| letters.chars().nth(usize::try_from(i).ok()?)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn verifier(toml_text: &str) -> Verifier {
        let t: toml::Table = toml::from_str(toml_text).unwrap();
        Verifier::from_toml(&toml::Value::Table(t), "answer").unwrap()
    }

    fn row(v: Value) -> serde_json::Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    fn scores(v: &Verifier, r: &serde_json::Map<String, Value>, texts: &[&str]) -> Vec<f64> {
        texts.iter().map(|t| v.score(t, r)).collect()
    }

    #[test]
    fn exact_normalises_whitespace_and_case() {
        let v = verifier("kind = 'exact'");
        let r = row(json!({"answer": "New  York"}));
        assert_eq!(
            scores(
                &v,
                &r,
                &["new york", "  New\nYork ", "New York.", "NewYork", ""]
            ),
            [1.0, 1.0, 0.0, 0.0, 0.0]
        );
        let v = verifier("kind = 'exact'\ncase_sensitive = true\nstrip_punctuation = true");
        assert_eq!(
            scores(&v, &r, &["New York.", "\"New York!\"", "new york"]),
            [1.0, 1.0, 0.0]
        );
        let r = row(json!({"answer": ["NYC", 7]}));
        assert_eq!(scores(&v, &r, &["NYC", "7", "New York"]), [1.0, 1.0, 0.0]);
        assert_eq!(
            v.score("NYC", &row(json!({"other": "NYC"}))),
            0.0,
            "no reference"
        );
    }

    #[test]
    fn numeric_reads_the_answer_not_the_reasoning() {
        let v = verifier("kind = 'numeric'");
        let r = row(json!({"answer": "Natalia sold 48/2 = 24 clips in May.\n#### 72"}));
        assert_eq!(
            scores(
                &v,
                &r,
                &[
                    "48 + 24 = 72",
                    "72 is wrong, I think 70",
                    "72 clips in total, then 3 more",
                    "#### 72\nsome trailing 5",
                    r"\boxed{72} (I also computed 71)",
                    "The answer is 72.0",
                    "$72",
                    "no number at all",
                ]
            ),
            [1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.0]
        );
        let neg = row(json!({"answer": -3}));
        assert_eq!(
            scores(&v, &neg, &["\u{2212}3", "x = -3", "5-3", "3"]),
            [1.0, 1.0, 0.0, 0.0]
        );
        let v = verifier("kind = 'numeric'\ntolerance = 0.01\nrelative = 0.001");
        let r = row(json!({"answer": "1,000"}));
        assert_eq!(
            scores(&v, &r, &["1000.9", "1001.1", "999.005"]),
            [1.0, 0.0, 1.0]
        );
    }

    #[test]
    fn regex_searches_or_matches_whole() {
        let v = verifier(
            r#"kind = 'regex'
pattern = '(?s)^<think>.*?</think>\s*<answer>.*?</answer>$'"#,
        );
        let r = row(json!({}));
        assert_eq!(
            scores(
                &v,
                &r,
                &[
                    "<think>a\nb</think> <answer>4</answer>",
                    "<answer>4</answer>",
                    "<think></think><answer>4</answer> extra"
                ]
            ),
            [1.0, 0.0, 0.0]
        );
        let v = verifier("kind = 'regex'\npattern = '[0-9]+'\nfull = true");
        assert_eq!(scores(&v, &r, &["123", "a123", "123 "]), [1.0, 0.0, 0.0]);
        let v = verifier("kind = 'regex'\npattern = '[0-9]+|x'\nfull = true");
        assert_eq!(
            scores(&v, &r, &["x", "1x"]),
            [1.0, 0.0],
            "alternation anchored as a whole"
        );
    }

    #[test]
    fn json_schema_parses_then_validates() {
        let v = verifier(
            r#"kind = 'json_schema'
extract = 'answer_tag'
schema = { type = 'object', required = ['city'], properties = { city = { type = 'string' } } }"#,
        );
        let r = row(json!({}));
        assert_eq!(
            scores(
                &v,
                &r,
                &[
                    r#"<answer>{"city": "Oslo"}</answer>"#,
                    "<answer>```json\n{\"city\": \"Oslo\"}\n```</answer>",
                    r#"<answer>{"city": 3}</answer>"#,
                    r#"<answer>{"city": "Oslo",}</answer>"#,
                    r#"<answer>{'city': 'Oslo'}</answer>"#,
                    r#"{"city": "Oslo"}"#,
                    r#"<answer>{"city": "Oslo"} and more</answer>"#,
                ]
            ),
            [1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0]
        );
        let v = verifier("kind = 'json_schema'\nschema_key = 'schema'");
        let r = row(json!({"schema": "{\"type\": \"array\", \"maxItems\": 1}"}));
        assert_eq!(scores(&v, &r, &["[1]", "[1, 2]", "{}"]), [1.0, 0.0, 0.0]);
    }

    #[test]
    fn choice_finds_the_stated_letter() {
        let v = verifier("kind = 'choice'");
        let r = row(json!({"answer": "B"}));
        assert_eq!(
            scores(
                &v,
                &r,
                &[
                    "B",
                    "(B).",
                    "The answer is (B).",
                    "A is tempting, but the answer is B",
                    "Answer: B\n",
                    "answer: B, not (C)",
                    "The answer is A. Wait, no: the answer is B.",
                    "A",
                    "I pick (C) over (B)... final (B)",
                    "Between A and B I cannot choose",
                    "b",
                    "E",
                ]
            ),
            [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0]
        );
        // the forms chat models write
        assert_eq!(
            scores(
                &v,
                &r,
                &[
                    "**Answer:** B",
                    "The answer is **B**",
                    "The answer is $\\boxed{B}$",
                    "B) 42",
                    "(B) Paris",
                    "B. Paris",
                    "The correct option is B",
                    "Answer: \\text{B}",
                    "A) 41 is wrong; the answer is B",
                ]
            ),
            [1.0; 9]
        );
        let by_index = row(json!({"answer": 2}));
        assert_eq!(scores(&v, &by_index, &["C", "B"]), [1.0, 0.0]);
    }

    #[test]
    fn numeric_marker_and_fraction_rules() {
        let v = verifier("kind = 'numeric'");
        let half = row(json!({"answer": "\\frac{1}{2}"}));
        assert_eq!(
            scores(
                &v,
                &half,
                &[
                    r"\boxed{\frac{1}{2}}",
                    r"\boxed{0.5}",
                    r"\boxed{\frac{3}{2}}",
                    "2"
                ]
            ),
            [1.0, 1.0, 0.0, 0.0]
        );
        let r = row(json!({"answer": 72}));
        assert_eq!(
            scores(
                &v,
                &r,
                &[
                    r"\boxed{} ... #### 72",
                    "<answer>72</answer> then I also tried 5",
                    "The answer is 72. Hope this helps with step 2.",
                ]
            ),
            // the last number decides when no marker is there: use `extract`
            [1.0, 0.0, 0.0]
        );
        let tagged = verifier("kind = 'numeric'\nextract = 'answer_tag'");
        assert_eq!(
            tagged.score("<answer>72</answer> then I also tried 5", &r),
            1.0
        );
    }

    #[test]
    fn rows_without_a_readable_reference_are_refused() {
        let refuse = |v: &Verifier, r: Value| v.check_row(&row(r)).unwrap_err().to_string();
        let numeric = verifier("kind = 'numeric'");
        assert!(refuse(&numeric, json!({"solution": "5"})).contains("no `answer` field"));
        assert!(
            refuse(&numeric, json!({"answer": "five"})).contains("cannot read")
                || refuse(&numeric, json!({"answer": "five"})).contains("can read")
        );
        assert!(numeric
            .check_row(&row(json!({"answer": ["x", "#### 3"]})))
            .is_ok());
        let choice = verifier("kind = 'choice'");
        assert!(refuse(&choice, json!({"answer": "B. Paris"})).contains("`answer` = \"B. Paris\""));
        assert!(refuse(&choice, json!({"answer": 7})).contains("choice"));
        assert!(choice.check_row(&row(json!({"answer": "b"}))).is_ok());
        let contains = verifier("kind = 'contains'");
        assert!(refuse(&contains, json!({"answer": " "})).contains("can read"));
        assert_eq!(contains.score("anything", &row(json!({"answer": ""}))), 0.0);
        let fixed = verifier("kind = 'contains'\ntext = 'x'");
        assert!(
            fixed.check_row(&row(json!({}))).is_ok(),
            "needs no reference"
        );
    }

    #[test]
    fn contains_the_reference_or_a_fixed_text() {
        let v = verifier("kind = 'contains'");
        let r = row(json!({"answer": "Paris"}));
        assert_eq!(
            scores(&v, &r, &["It is paris, France", "Par is", "Pari"]),
            [1.0, 0.0, 0.0]
        );
        let v = verifier("kind = 'contains'\ntext = 'Final answer:'\ncase_sensitive = true");
        assert_eq!(
            scores(&v, &r, &["Final answer: 3", "final answer: 3"]),
            [1.0, 0.0]
        );
    }

    #[test]
    fn extraction_gates_every_kind() {
        let v = verifier("kind = 'exact'\nextract = 'answer_tag'\nreference = 'gold'");
        let r = row(json!({"gold": "42", "answer": "nope"}));
        assert_eq!(
            scores(
                &v,
                &r,
                &[
                    "<answer>42</answer>",
                    "42",
                    "<answer>4</answer><answer>42</answer>",
                    "<answer> 42"
                ]
            ),
            [1.0, 0.0, 1.0, 1.0]
        );
    }

    #[test]
    fn bad_tables_name_the_key() {
        let err = |s: &str| {
            let t: toml::Table = toml::from_str(s).unwrap();
            Verifier::from_toml(&toml::Value::Table(t), "answer")
                .unwrap_err()
                .to_string()
        };
        assert!(err("kind = 'fuzzy'").contains("unknown verifier kind `fuzzy`"));
        assert!(err("kind = 'regex'").contains("needs `pattern`"));
        assert!(err("kind = 'regex'\npattern = '('").contains("`pattern`"));
        assert!(err("kind = 'exact'\ntolerance = 1").contains("unknown key `tolerance`"));
        assert!(err("kind = 'numeric'\ntolerance = -1").contains("`tolerance`"));
        assert!(err("kind = 'choice'\nletters = 'ab'").contains("`letters`"));
        assert!(err("kind = 'json_schema'").contains("exactly one of `schema`"));
        assert!(err("kind = 'exact'\nextract = 'last_word'").contains("`extract`"));
        assert!(Verifier::from_toml(&toml::Value::Integer(3), "answer").is_err());
        assert_eq!(
            Verifier::from_toml(&"numeric".into(), "ans")
                .unwrap()
                .reference,
            "ans"
        );
    }
}

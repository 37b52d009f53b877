//! Tokenizer and chat template.
//!
//! Matches transformers: `tokenizer.apply_chat_template(messages, tokenize=False,
//! add_generation_prompt=...)` (Jinja with `trim_blocks` and `lstrip_blocks`, Python string
//! methods, `raise_exception`, `strftime_now`, a `tojson` like Python's `json.dumps`)
//! followed by `tokenizer(text, add_special_tokens=False)`.
//!
//! [`Renderer`] is the one text interface over a model's vocabulary: the trainer renders
//! prompts through it, the sampler decodes completions through it. [`Tokenizer`]
//! implements it; so do [`IdRenderer`] (ids as text, for `random:` models and tests) and
//! any `Fn(&[u32]) -> Result<String>` (a decoder alone).
use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{Environment, Error as JinjaError, ErrorKind};

use crate::chat::Message;

/// ChatML, used when a checkpoint has no chat template.
pub const CHATML_TEMPLATE: &str = "{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";

const TEMPLATE_NAME: &str = "chat_template";

/// A Hugging Face tokenizer (tokenizer.json) with its chat template and stop tokens.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    env: Environment<'static>,
    /// The template source actually used (ChatML when the checkpoint has none).
    template: String,
    has_own_template: bool,
    /// bos_token / eos_token / pad_token / unk_token strings from tokenizer_config.json,
    /// passed to the template like transformers does.
    special: BTreeMap<String, String>,
    stop_ids: Vec<u32>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.vocab_size())
            .field("has_own_template", &self.has_own_template)
            .field("stop_ids", &self.stop_ids)
            .finish()
    }
}

impl Tokenizer {
    /// Load from a model directory: tokenizer.json (required), tokenizer_config.json,
    /// chat_template.jinja and generation_config.json (all optional).
    pub fn from_dir(dir: &Path) -> Result<Self> {
        let opt = |name: &str| {
            let p = dir.join(name);
            p.is_file().then_some(p)
        };
        let tokenizer_json = dir.join("tokenizer.json");
        if !tokenizer_json.is_file() {
            anyhow::bail!("missing file tokenizer.json in {}", dir.display());
        }
        let gen_eos = match opt("generation_config.json") {
            Some(p) => super::generation::GenerationConfig::from_file(&p)?.eos_token_ids,
            None => Vec::new(),
        };
        Self::from_files(
            &tokenizer_json,
            opt("tokenizer_config.json").as_deref(),
            opt("chat_template.jinja").as_deref(),
            &gen_eos,
        )
    }

    /// Load from explicit files. `extra_eos` are generation_config's `eos_token_id`s.
    pub fn from_files(
        tokenizer_json: &Path,
        tokenizer_config: Option<&Path>,
        chat_template_jinja: Option<&Path>,
        extra_eos: &[u32],
    ) -> Result<Self> {
        let inner = tokenizers::Tokenizer::from_file(tokenizer_json)
            .map_err(|e| anyhow!("loading {}: {e}", tokenizer_json.display()))?;
        let config: serde_json::Value = match tokenizer_config {
            Some(p) => {
                let text = std::fs::read_to_string(p)
                    .with_context(|| format!("reading {}", p.display()))?;
                serde_json::from_str(&text).with_context(|| format!("parsing {}", p.display()))?
            }
            None => serde_json::Value::Null,
        };
        let jinja = match chat_template_jinja {
            Some(p) => Some(
                std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?,
            ),
            None => None,
        };
        // transformers 5.x saves the template beside tokenizer_config.json; it wins.
        let template = jinja.or_else(|| template_from_config(&config));
        let t = Self::new(inner, &config, template, extra_eos)?;
        t.check_usable(tokenizer_json)?;
        Ok(t)
    }

    /// Refuses a tokenizer no run could use (a truncated or placeholder tokenizer.json):
    /// fewer ids than bytes, or one that cannot write back plain text and JSON.
    fn check_usable(&self, file: &Path) -> Result<()> {
        const PROBE: &str = "Deploy to PROD_B, then {\"commitment\": \"MONITOR\"} at 09:30!";
        let n = self.vocab_size();
        if n < 256 {
            bail!(
                "{}: the tokenizer has only {n} ids; a language model's has thousands (is \
                 this the model's tokenizer.json?)",
                file.display()
            );
        }
        let back = self.encode(PROBE).and_then(|ids| self.decode(&ids));
        let squeeze = |s: &str| s.split_whitespace().collect::<String>();
        match back {
            Ok(b) if squeeze(&b) == squeeze(PROBE) => Ok(()),
            Ok(b) => bail!(
                "{}: the tokenizer cannot write plain text: {PROBE:?} comes back as {b:?}",
                file.display()
            ),
            Err(e) => Err(e.context(format!(
                "{}: the tokenizer fails on plain text",
                file.display()
            ))),
        }
    }

    /// Assemble from parts: a loaded tokenizer, tokenizer_config.json's JSON (or Null), a
    /// chat template (None → ChatML), generation_config's eos ids.
    pub fn new(
        inner: tokenizers::Tokenizer,
        tokenizer_config: &serde_json::Value,
        chat_template: Option<String>,
        extra_eos: &[u32],
    ) -> Result<Self> {
        let mut special = BTreeMap::new();
        for key in ["bos_token", "eos_token", "pad_token", "unk_token"] {
            if let Some(s) = token_string(&tokenizer_config[key]) {
                special.insert(key.to_string(), s);
            }
        }
        let has_own_template = chat_template.is_some();
        let template = chat_template.unwrap_or_else(|| CHATML_TEMPLATE.to_string());
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_keep_trailing_newline(false);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_filter("tojson", tojson);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_template_owned(TEMPLATE_NAME, template.clone())
            .map_err(|e| anyhow!("invalid chat template: {e:#}"))?;

        let mut stop_ids = Vec::new();
        let mut push = |id: u32| {
            if !stop_ids.contains(&id) {
                stop_ids.push(id);
            }
        };
        for t in ["<|im_end|>", "<|endoftext|>"] {
            if let Some(id) = inner.token_to_id(t) {
                push(id);
            }
        }
        if let Some(id) = special.get("eos_token").and_then(|t| inner.token_to_id(t)) {
            push(id);
        }
        for id in extra_eos {
            push(*id);
        }
        Ok(Self {
            inner,
            env,
            template,
            has_own_template,
            special,
            stop_ids,
        })
    }

    /// Render the chat template (like transformers' `apply_chat_template(tokenize=False)`).
    pub fn apply_chat_template(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
    ) -> Result<String> {
        let tmpl = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| anyhow!("chat template: {e:#}"))?;
        let mut ctx = BTreeMap::new();
        ctx.insert("messages".to_string(), Value::from_serialize(messages));
        ctx.insert(
            "add_generation_prompt".to_string(),
            Value::from(add_generation_prompt),
        );
        ctx.insert("tools".to_string(), Value::from(()));
        ctx.insert("documents".to_string(), Value::from(()));
        for (k, v) in &self.special {
            ctx.insert(k.clone(), Value::from(v.as_str()));
        }
        tmpl.render(ctx)
            .map_err(|e| anyhow!("rendering the chat template: {e:#}"))
    }

    /// The text of an environment turn (see [`Renderer::render_env_turn`]), read off the
    /// template itself: a conversation ending in an assistant answer is rendered without
    /// and with one more user message (and the generation prompt); the turn is what the
    /// second adds, preceded by what the template writes after the answer's content.
    pub fn env_turn_text(&self, content: &str, ended_with: Option<u32>) -> Result<String> {
        const ANSWER: &str = "\u{1}concord-answer\u{1}";
        let base = [
            Message::system("s"),
            Message::user("u"),
            Message::assistant(ANSWER),
        ];
        let before = self.apply_chat_template(&base, false)?;
        let mut longer = base.to_vec();
        longer.push(Message::user(content));
        let after = self.apply_chat_template(&longer, true)?;
        let turn = after.strip_prefix(before.as_str()).with_context(|| {
            "the chat template renders earlier turns differently once a user turn follows: \
             environment turns cannot be appended"
        })?;
        let at = before
            .rfind(ANSWER)
            .context("the chat template drops the assistant's answer")?;
        let mut tail = &before[at + ANSWER.len()..];
        if let Some(stop) = ended_with.and_then(|id| self.id_to_token(id)) {
            tail = tail.strip_prefix(stop.as_str()).unwrap_or(tail);
        }
        Ok(format!("{tail}{turn}"))
    }

    /// Chat template + tokenization without special tokens: the prompt ids.
    pub fn encode_chat(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
    ) -> Result<Vec<u32>> {
        self.encode(&self.apply_chat_template(messages, add_generation_prompt)?)
    }

    /// Token ids of `text` without adding special tokens (special tokens written in the
    /// text, like `<|im_end|>`, are still recognised, as in transformers).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let enc = self
            .inner
            .encode(text, false)
            .map_err(|e| anyhow!("tokenizing: {e}"))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Text of `ids`, special tokens included (exact inverse of `encode`).
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.inner
            .decode(ids, false)
            .map_err(|e| anyhow!("decoding: {e}"))
    }

    /// Text of `ids` without special tokens.
    pub fn decode_skip_special(&self, ids: &[u32]) -> Result<String> {
        self.inner
            .decode(ids, true)
            .map_err(|e| anyhow!("decoding: {e}"))
    }

    /// Ids that end a completion: `<|im_end|>`, `<|endoftext|>`, tokenizer_config's
    /// eos_token and generation_config's eos_token_id (deduplicated, in that order).
    pub fn stop_token_ids(&self) -> &[u32] {
        &self.stop_ids
    }

    pub fn is_stop(&self, id: u32) -> bool {
        self.stop_ids.contains(&id)
    }

    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// Number of ids the tokenizer can produce (added tokens included).
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// The template in use (ChatML when the checkpoint has none).
    pub fn chat_template(&self) -> &str {
        &self.template
    }

    pub fn has_chat_template(&self) -> bool {
        self.has_own_template
    }

    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }
}

/// Chat messages to prompt tokens, completion tokens to text, and the stop tokens.
pub trait Renderer {
    /// Chat template with the generation prompt, and its token ids.
    fn render(&self, messages: &[Message]) -> Result<(String, Vec<u32>)>;
    /// Text of `ids`, special tokens included.
    fn decode(&self, ids: &[u32]) -> Result<String>;
    /// Tokens that end a completion.
    fn stop_ids(&self) -> Vec<u32>;
    /// Token ids of plain text (no special tokens, no template): a completion as the
    /// model would write it. Only a real tokenizer can.
    fn encode_text(&self, text: &str) -> Result<Vec<u32>> {
        anyhow::bail!("this renderer cannot encode text ({} bytes)", text.len())
    }
    /// The token ids of one environment turn of a multi-turn conversation, rendered on
    /// its own so that they can be appended to the ids so far (never re-rendered from
    /// text): the rest of the chat template's assistant turn after the model's answer
    /// (without the stop token `ended_with` the model already wrote), a user turn holding
    /// `content`, and the generation prompt. Only a chat template can.
    fn render_env_turn(&self, content: &str, ended_with: Option<u32>) -> Result<Vec<u32>> {
        let _ = ended_with;
        anyhow::bail!(
            "this renderer has no chat template for environment turns ({} bytes)",
            content.len()
        )
    }
}

impl Renderer for Tokenizer {
    fn render(&self, messages: &[Message]) -> Result<(String, Vec<u32>)> {
        let text = self.apply_chat_template(messages, true)?;
        let ids = self.encode(&text)?;
        Ok((text, ids))
    }
    fn decode(&self, ids: &[u32]) -> Result<String> {
        Tokenizer::decode(self, ids)
    }
    fn stop_ids(&self) -> Vec<u32> {
        self.stop_token_ids().to_vec()
    }
    fn encode_text(&self, text: &str) -> Result<Vec<u32>> {
        self.encode(text)
    }
    fn render_env_turn(&self, content: &str, ended_with: Option<u32>) -> Result<Vec<u32>> {
        self.encode(&self.env_turn_text(content, ended_with)?)
    }
}

/// A renderer without a tokenizer: text is the ids, no stop tokens (tests, toy tasks,
/// `random:` models).
pub struct IdRenderer;

impl Renderer for IdRenderer {
    fn render(&self, messages: &[Message]) -> Result<(String, Vec<u32>)> {
        anyhow::bail!("IdRenderer cannot render {} chat messages", messages.len())
    }
    fn decode(&self, ids: &[u32]) -> Result<String> {
        Ok(ids
            .iter()
            .map(|i| i.to_string())
            .collect::<Vec<_>>()
            .join(" "))
    }
    fn stop_ids(&self) -> Vec<u32> {
        Vec::new()
    }
}

/// A bare decoder (a closure) is a renderer that cannot render chats and has no stop
/// tokens.
impl<F: Fn(&[u32]) -> Result<String>> Renderer for F {
    fn render(&self, messages: &[Message]) -> Result<(String, Vec<u32>)> {
        anyhow::bail!(
            "a bare decoder cannot render {} chat messages",
            messages.len()
        )
    }
    fn decode(&self, ids: &[u32]) -> Result<String> {
        self(ids)
    }
    fn stop_ids(&self) -> Vec<u32> {
        Vec::new()
    }
}

/// tokenizer_config.json's `chat_template`: a string, or a list of `{name, template}`
/// (the one named "default" is used).
fn template_from_config(config: &serde_json::Value) -> Option<String> {
    match &config["chat_template"] {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Array(list) => list
            .iter()
            .find(|t| t["name"] == "default")
            .or_else(|| list.first())
            .and_then(|t| t["template"].as_str().map(str::to_string)),
        _ => None,
    }
}

/// A special token in tokenizer_config.json: a string or an AddedToken `{content: ...}`.
fn token_string(v: &serde_json::Value) -> Option<String> {
    match v {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Object(o) => o.get("content").and_then(|c| c.as_str()).map(String::from),
        _ => None,
    }
}

fn raise_exception(msg: String) -> Result<Value, JinjaError> {
    Err(JinjaError::new(ErrorKind::InvalidOperation, msg))
}

/// `tojson` as transformers defines it: `json.dumps(x, ensure_ascii=False, indent=indent,
/// separators=separators, sort_keys=sort_keys)`.
fn tojson(value: Value, kwargs: Kwargs) -> Result<Value, JinjaError> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let separators: Option<Value> = kwargs.get("separators")?;
    kwargs.assert_all_used()?;
    let (item_sep, key_sep) = match separators {
        Some(s) if !s.is_none() => (
            s.get_item_by_index(0)?.as_str().unwrap_or(", ").to_string(),
            s.get_item_by_index(1)?.as_str().unwrap_or(": ").to_string(),
        ),
        _ => (
            if indent.is_some() { "," } else { ", " }.to_string(),
            ": ".to_string(),
        ),
    };
    let opts = JsonOpts {
        indent,
        sort_keys: sort_keys.unwrap_or(false),
        item_sep,
        key_sep,
    };
    let mut out = String::new();
    write_json(&value, &opts, 0, &mut out)?;
    Ok(Value::from_safe_string(out))
}

struct JsonOpts {
    indent: Option<usize>,
    sort_keys: bool,
    item_sep: String,
    key_sep: String,
}

fn newline(opts: &JsonOpts, depth: usize, out: &mut String) {
    if let Some(n) = opts.indent {
        out.push('\n');
        out.push_str(&" ".repeat(n * depth));
    }
}

fn write_json(
    v: &Value,
    opts: &JsonOpts,
    depth: usize,
    out: &mut String,
) -> Result<(), JinjaError> {
    let item_sep = if opts.indent.is_some() {
        opts.item_sep.trim_end()
    } else {
        opts.item_sep.as_str()
    };
    match v.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number => {
            if let Some(i) = v.as_i64() {
                out.push_str(&i.to_string());
            } else {
                let f = f64::try_from(v.clone()).unwrap_or(f64::NAN);
                out.push_str(&python_float(f));
            }
        }
        ValueKind::String => out.push_str(
            &serde_json::to_string(v.as_str().unwrap_or_default())
                .map_err(|e| JinjaError::new(ErrorKind::InvalidOperation, e.to_string()))?,
        ),
        ValueKind::Map => {
            let mut keys: Vec<Value> = v.try_iter()?.collect();
            if opts.sort_keys {
                keys.sort_by_key(|a| a.to_string());
            }
            if keys.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            out.push('{');
            for (i, k) in keys.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(opts, depth + 1, out);
                let key = k
                    .as_str()
                    .map(str::to_string)
                    .unwrap_or_else(|| k.to_string());
                out.push_str(&serde_json::to_string(&key).unwrap_or_default());
                out.push_str(&opts.key_sep);
                write_json(&v.get_item(k)?, opts, depth + 1, out)?;
            }
            newline(opts, depth, out);
            out.push('}');
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(opts, depth + 1, out);
                write_json(item, opts, depth + 1, out)?;
            }
            newline(opts, depth, out);
            out.push(']');
        }
        _ => out.push_str(&serde_json::to_string(&v.to_string()).unwrap_or_default()),
    }
    Ok(())
}

/// Python's float repr for the common cases (`1.0`, `0.5`, `1e-06`).
fn python_float(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    let s = format!("{f:?}");
    if let Some((m, e)) = s.split_once('e') {
        let exp: i32 = e.parse().unwrap_or(0);
        let sign = if exp < 0 { '-' } else { '+' };
        return format!("{m}e{sign}{:02}", exp.abs());
    }
    s
}

/// `strftime_now(format)`: the current UTC time (transformers uses local time; Concord
/// runs in UTC). Supports %Y %y %m %d %e %H %M %S %B %b %A %a %j %%.
fn strftime_now(format: String) -> Result<Value, JinjaError> {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    Ok(Value::from(strftime(&format, secs)))
}

/// Format a Unix time (UTC) with a subset of strftime.
pub fn strftime(format: &str, unix_secs: i64) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAYS: [&str; 7] = [
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
        "Monday",
        "Tuesday",
        "Wednesday",
    ];
    let days = unix_secs.div_euclid(86_400);
    let rem = unix_secs.rem_euclid(86_400);
    let (h, mi, s) = (rem / 3600, (rem % 3600) / 60, rem % 60);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy_mar = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy_mar + 2) / 153;
    let d = doy_mar - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    let cum = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let jday = cum[(m - 1) as usize] + d + i64::from(leap && m > 2);
    let weekday = DAYS[days.rem_euclid(7) as usize];
    let month = MONTHS[(m - 1) as usize];
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(&y.to_string()),
            Some('y') => out.push_str(&format!("{:02}", y.rem_euclid(100))),
            Some('m') => out.push_str(&format!("{m:02}")),
            Some('d') => out.push_str(&format!("{d:02}")),
            Some('e') => out.push_str(&format!("{d:>2}")),
            Some('H') => out.push_str(&format!("{h:02}")),
            Some('M') => out.push_str(&format!("{mi:02}")),
            Some('S') => out.push_str(&format!("{s:02}")),
            Some('B') => out.push_str(month),
            Some('b') => out.push_str(&month[..3]),
            Some('A') => out.push_str(weekday),
            Some('a') => out.push_str(&weekday[..3]),
            Some('j') => out.push_str(&format!("{jday:03}")),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strftime_known_dates() {
        // 2024-02-29 13:05:09 UTC, a Thursday.
        assert_eq!(
            strftime("%Y-%m-%d %H:%M:%S %a %b %j %%", 1_709_211_909),
            "2024-02-29 13:05:09 Thu Feb 060 %"
        );
        assert_eq!(strftime("%d %B %Y", 0), "01 January 1970");
    }

    #[test]
    fn python_floats() {
        assert_eq!(python_float(1.0), "1.0");
        assert_eq!(python_float(0.5), "0.5");
        assert_eq!(python_float(1e-6), "1e-06");
    }
}

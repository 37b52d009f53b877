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
use minijinja::value::Value;
use minijinja::Environment;

use crate::chat::Message;

mod jinja;
mod renderer;
pub use jinja::strftime;
use jinja::{raise_exception, strftime_now, tojson};
pub use renderer::{IdRenderer, Renderer};

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
    /// Extra template variables (transformers' `apply_chat_template(**kwargs)`, TRL's
    /// `chat_template_kwargs`), starting from [`default_template_kwargs`].
    kwargs: BTreeMap<String, serde_json::Value>,
    stop_ids: Vec<u32>,
}

/// The template variables Concord itself sets at every render: the conversation, the
/// generation prompt, the tool and document lists and the tokenizer's special tokens.
/// `[model] chat_template_kwargs` may not name them.
pub const RESERVED_TEMPLATE_VARIABLES: &[&str] = &[
    "messages",
    "add_generation_prompt",
    "tools",
    "documents",
    "bos_token",
    "eos_token",
    "pad_token",
    "unk_token",
];

/// The template variables Concord passes unless `[model] chat_template_kwargs` says
/// otherwise:
/// - `enable_thinking = false`: Qwen3's template then closes an empty `<think>` block in
///   the generation prompt, so training prompts ask for answers, not reasoning traces;
/// - `date_string = "26 Jul 2024"`: Llama 3's template prints today's date in every
///   system prompt when this is unset, which would make the same run render different
///   prompts on different days; this is the template's own fallback date.
///
/// Templates that do not read a variable ignore it.
pub fn default_template_kwargs() -> BTreeMap<String, serde_json::Value> {
    BTreeMap::from([
        (
            "enable_thinking".to_string(),
            serde_json::Value::Bool(false),
        ),
        (
            "date_string".to_string(),
            serde_json::Value::from("26 Jul 2024"),
        ),
    ])
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

    /// The family's released tokenizer as embedded in the binary (what `init-tiny`
    /// writes), with its Instruct chat template and generation_config's stop ids.
    pub fn for_family(family: crate::model::Family) -> Result<Self> {
        use crate::model::tiny::family::{
            generation_config_json, tokenizer_config_json, tokenizer_json,
        };
        let json = tokenizer_json(family)?;
        let inner = tokenizers::Tokenizer::from_bytes(&json)
            .map_err(|e| anyhow!("loading the embedded {family} tokenizer: {e}"))?;
        let config = tokenizer_config_json(family, &json)?;
        let gen = super::generation::GenerationConfig::parse(
            &generation_config_json(family).to_string(),
        )?;
        Self::new(
            inner,
            &config,
            template_from_config(&config),
            &gen.eos_token_ids,
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
            kwargs: default_template_kwargs(),
            stop_ids,
        })
    }

    /// Replace the extra template variables (see [`default_template_kwargs`]).
    pub fn set_template_kwargs(&mut self, kwargs: BTreeMap<String, serde_json::Value>) {
        self.kwargs = kwargs;
    }

    pub fn template_kwargs(&self) -> &BTreeMap<String, serde_json::Value> {
        &self.kwargs
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
        for (k, v) in &self.kwargs {
            ctx.insert(k.clone(), Value::from_serialize(v));
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

//! The tokenizer of a GGUF file, built from its metadata when it holds a byte-level BPE
//! (`tokenizer.ggml.model = gpt2`, `tokens` + `merges` + `token_type`) with a
//! pre-tokenizer Concord knows (`tokenizer.ggml.pre`: `qwen2`, or Llama 3's `llama-bpe`
//! / `llama3` / `llama-v3`; absent: the architecture's own). CONTROL (3) and
//! USER_DEFINED (4) tokens become added tokens (CONTROL ones special). When the metadata
//! cannot be built (no merges, another pre-tokenizer), the family's bundled tokenizer is
//! used only if the vocabulary matches (see [`bundled_vocab_matches`]); a SentencePiece
//! vocabulary (`tokenizer.ggml.model = llama`: Llama 1/2, Mistral) is refused by name.
use anyhow::{anyhow, bail, Context, Result};
use serde_json::json;

use super::metadata::{
    family_of_architecture, int_array, missing, opt_bool, opt_str, opt_u32, string_array, Metadata,
};
use crate::model::tiny::family::tokenizer_json;
use crate::model::tokenizer::Tokenizer;
use crate::model::Family;

/// llama.cpp token types (`tokenizer.ggml.token_type`).
pub const TOKEN_NORMAL: i32 = 1;
pub const TOKEN_UNKNOWN: i32 = 2;
pub const TOKEN_CONTROL: i32 = 3;
pub const TOKEN_USER_DEFINED: i32 = 4;
pub const TOKEN_UNUSED: i32 = 5;
pub const TOKEN_BYTE: i32 = 6;

/// Qwen2's pre-tokenizer split (llama.cpp `LLAMA_VOCAB_PRE_TYPE_QWEN2`, transformers'
/// Qwen2 tokenizer.json).
pub const QWEN2_PRETOKENIZER_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Llama 3's split (llama.cpp `LLAMA_VOCAB_PRE_TYPE_LLAMA3`): Qwen2's but digits in
/// runs of up to three.
pub const LLAMA3_PRETOKENIZER_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The byte-level BPE dialects Concord builds from GGUF metadata.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PreTokenizer {
    Qwen2,
    Llama3,
}

impl PreTokenizer {
    /// `tokenizer.ggml.pre` (None: not one Concord builds).
    pub fn from_gguf(pre: &str) -> Option<Self> {
        match pre {
            "qwen2" => Some(Self::Qwen2),
            "llama-bpe" | "llama3" | "llama-v3" => Some(Self::Llama3),
            _ => None,
        }
    }

    fn of_family(family: Family) -> Self {
        match family {
            Family::Qwen2 | Family::Qwen3 => Self::Qwen2,
            Family::Llama => Self::Llama3,
        }
    }

    /// llama.cpp's `add_bos` when `tokenizer.ggml.add_bos_token` is absent.
    pub fn adds_bos(self) -> bool {
        self == Self::Llama3
    }
}

/// Where the tokenizer of a GGUF model came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenizerSource {
    /// Built from `tokenizer.ggml.tokens` / `merges` / `token_type`.
    Metadata,
    /// The family's bundled tokenizer (assets/), used because the metadata could not be
    /// built and its vocabulary matches.
    Bundled,
}

/// Special token ids from `tokenizer.ggml.*`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SpecialIds {
    pub bos: Option<u32>,
    /// `eos_token_id`, `eot_token_id`, `eom_token_id`, then (llama) Llama 3's stops.
    pub eos: Vec<u32>,
    pub pad: Option<u32>,
}

/// `tokenizer.ggml.tokens` / `token_type` / `merges`.
struct Vocab<'a> {
    tokens: Vec<&'a str>,
    types: Option<Vec<i64>>,
    merges: Option<Vec<&'a str>>,
}

impl<'a> Vocab<'a> {
    fn read(md: &'a Metadata) -> Result<Self> {
        let tokens = string_array(md, "tokenizer.ggml.tokens")?
            .ok_or_else(|| missing("tokenizer.ggml.tokens"))?;
        let types = int_array(md, "tokenizer.ggml.token_type")?;
        if let Some(t) = &types {
            if t.len() != tokens.len() {
                bail!(
                    "GGUF: tokenizer.ggml.token_type has {} entries, tokenizer.ggml.tokens {}",
                    t.len(),
                    tokens.len()
                );
            }
        }
        let merges = string_array(md, "tokenizer.ggml.merges")?;
        Ok(Vocab {
            tokens,
            types,
            merges,
        })
    }

    fn type_of(&self, id: usize) -> Option<i64> {
        self.types.as_ref().and_then(|t| t.get(id)).copied()
    }

    fn id_of_control(&self, token: &str) -> Option<u32> {
        let id = self.tokens.iter().position(|t| *t == token)?;
        (self.type_of(id) == Some(i64::from(TOKEN_CONTROL))).then_some(id as u32)
    }

    fn name(&self, id: Option<u32>) -> Option<String> {
        id.and_then(|i| self.tokens.get(i as usize))
            .map(|s| s.to_string())
    }
}

fn special_ids(md: &Metadata, family: Family, vocab: &Vocab) -> Result<SpecialIds> {
    let mut eos = Vec::new();
    for key in [
        "tokenizer.ggml.eos_token_id",
        "tokenizer.ggml.eot_token_id",
        "tokenizer.ggml.eom_token_id",
    ] {
        eos.extend(opt_u32(md, key)?);
    }
    // Llama 3 files name one end token, but Instruct models end a turn with <|eot_id|>,
    // a tool call with <|eom_id|> and base models with <|end_of_text|>: the stops of
    // the generation_config.json the Hub ships.
    if family == Family::Llama {
        for t in ["<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"] {
            eos.extend(vocab.id_of_control(t));
        }
    }
    let mut unique = Vec::with_capacity(eos.len());
    for id in eos {
        if !unique.contains(&id) {
            unique.push(id);
        }
    }
    Ok(SpecialIds {
        bos: opt_u32(md, "tokenizer.ggml.bos_token_id")?,
        eos: unique,
        pad: opt_u32(md, "tokenizer.ggml.padding_token_id")?,
    })
}

/// The bundled-tokenizer rule: the GGUF vocabulary matches the bundled tokenizer when
/// every id whose GGUF token type is not UNUSED (5, llama.cpp's `[PADn]` fillers) exists in
/// the bundled tokenizer with the same token string, and, when the file has merges, they
/// equal the bundled merges. Ids the bundled tokenizer has beyond the file's used ones
/// (e.g. Qwen3's `<think>`) are allowed.
pub fn bundled_vocab_matches(
    bundled: &tokenizers::Tokenizer,
    bundled_merges: &[String],
    tokens: &[&str],
    types: Option<&[i64]>,
    merges: Option<&[&str]>,
) -> std::result::Result<(), String> {
    for (id, tok) in tokens.iter().enumerate() {
        let ty = types.and_then(|t| t.get(id)).copied();
        if ty == Some(i64::from(TOKEN_UNUSED)) {
            continue;
        }
        match bundled.id_to_token(id as u32) {
            Some(b) if b == *tok => {}
            Some(b) => return Err(format!("id {id} is {tok:?} in the file, {b:?} bundled")),
            None => {
                return Err(format!(
                    "id {id} ({tok:?}) is beyond the bundled vocabulary"
                ))
            }
        }
    }
    if let Some(m) = merges {
        if m.len() != bundled_merges.len() || m.iter().zip(bundled_merges).any(|(a, b)| a != b) {
            return Err("the merges differ".into());
        }
    }
    Ok(())
}

fn bundled_name(family: Family) -> &'static str {
    match family {
        Family::Qwen2 | Family::Qwen3 => "Qwen",
        Family::Llama => "Llama 3",
    }
}

/// The family's embedded tokenizer and its merges as `"a b"` strings.
fn bundled_tokenizer(family: Family) -> Result<(tokenizers::Tokenizer, Vec<String>)> {
    let what = bundled_name(family);
    let bytes = tokenizer_json(family)?;
    let json: serde_json::Value = serde_json::from_slice(&bytes)
        .with_context(|| format!("parsing the bundled {what} tokenizer"))?;
    let merge = |m: &serde_json::Value| match m {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Array(p) => p
            .iter()
            .filter_map(|x| x.as_str())
            .collect::<Vec<_>>()
            .join(" "),
        _ => String::new(),
    };
    let merges = json["model"]["merges"]
        .as_array()
        .map(|a| a.iter().map(merge).collect())
        .unwrap_or_default();
    let tok = tokenizers::Tokenizer::from_bytes(&bytes)
        .map_err(|e| anyhow!("loading the bundled {what} tokenizer: {e}"))?;
    Ok((tok, merges))
}

/// tokenizer.json (Qwen2's byte-level BPE) from GGUF tokens, types and merges.
pub fn tokenizer_json_from_vocab(
    tokens: &[&str],
    types: Option<&[i64]>,
    merges: &[&str],
) -> Result<serde_json::Value> {
    bpe_tokenizer_json(PreTokenizer::Qwen2, tokens, types, merges, None)
}

/// tokenizer.json in the shape transformers' own files have for `pre` (Qwen2: NFC
/// normalizer; Llama 3: none, `ignore_merges`, and `bos` added by the post-processor
/// when encoding with special tokens) from GGUF tokens, types and merges.
pub fn bpe_tokenizer_json(
    pre: PreTokenizer,
    tokens: &[&str],
    types: Option<&[i64]>,
    merges: &[&str],
    bos: Option<(u32, &str)>,
) -> Result<serde_json::Value> {
    let (vocab, added) = vocab_json(tokens, types);
    let merges = merges
        .iter()
        .enumerate()
        .map(|(i, m)| {
            m.split_once(' ')
                .map(|(a, b)| json!([a, b]))
                .ok_or_else(|| anyhow!("tokenizer.ggml.merges[{i}] = {m:?} is not \"a b\""))
        })
        .collect::<Result<Vec<_>>>()?;
    let mut j = match pre {
        PreTokenizer::Qwen2 => qwen2_shape(),
        PreTokenizer::Llama3 => llama3_shape(bos),
    };
    j["added_tokens"] = json!(added);
    j["model"]["vocab"] = serde_json::Value::Object(vocab);
    j["model"]["merges"] = json!(merges);
    Ok(j)
}

/// The BPE vocabulary (every id) and the added tokens (CONTROL and USER_DEFINED ones).
fn vocab_json(
    tokens: &[&str],
    types: Option<&[i64]>,
) -> (
    serde_json::Map<String, serde_json::Value>,
    Vec<serde_json::Value>,
) {
    let mut vocab = serde_json::Map::with_capacity(tokens.len());
    let mut added = Vec::new();
    for (id, tok) in tokens.iter().enumerate() {
        let ty = types.and_then(|t| t.get(id)).copied().unwrap_or(1);
        // Every id is in the BPE vocabulary, added tokens too: `tokenizers` gives an added
        // token the model's id for its string, and otherwise appends it after the model's
        // vocabulary whatever id the JSON says (that would shift ids past [PAD] fillers).
        if !vocab.contains_key(*tok) {
            vocab.insert((*tok).to_string(), json!(id));
        }
        if ty == i64::from(TOKEN_CONTROL) || ty == i64::from(TOKEN_USER_DEFINED) {
            added.push(json!({
                "id": id,
                "content": tok,
                "single_word": false,
                "lstrip": false,
                "rstrip": false,
                "normalized": false,
                "special": ty == i64::from(TOKEN_CONTROL),
            }));
        }
    }
    (vocab, added)
}

fn split(regex: &str) -> serde_json::Value {
    json!({"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": false})
}

fn byte_level(add_prefix_space: bool, trim_offsets: bool, use_regex: bool) -> serde_json::Value {
    json!({
        "type": "ByteLevel", "add_prefix_space": add_prefix_space,
        "trim_offsets": trim_offsets, "use_regex": use_regex,
    })
}

fn bpe_model(ignore_merges: bool, affix: serde_json::Value) -> serde_json::Value {
    json!({
        "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": affix,
        "end_of_word_suffix": affix, "fuse_unk": false, "byte_fallback": false,
        "ignore_merges": ignore_merges,
    })
}

/// Qwen2's tokenizer.json around the vocabulary.
fn qwen2_shape() -> serde_json::Value {
    let bl = byte_level(false, false, false);
    json!({
        "version": "1.0", "truncation": null, "padding": null,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            split(QWEN2_PRETOKENIZER_REGEX), bl,
        ]},
        "post_processor": bl,
        "decoder": bl,
        "model": bpe_model(false, json!("")),
    })
}

/// Llama 3's tokenizer.json around the vocabulary.
fn llama3_shape(bos: Option<(u32, &str)>) -> serde_json::Value {
    let bl = byte_level(true, false, true);
    let post = match bos {
        Some((id, t)) => json!({"type": "Sequence", "processors": [bl, {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": t, "type_id": 0}},
                       {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": t, "type_id": 0}},
                     {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": t, "type_id": 1}},
                     {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {t: {"id": t, "ids": [id], "tokens": [t]}},
        }]}),
        None => bl,
    };
    json!({
        "version": "1.0", "truncation": null, "padding": null,
        "normalizer": null,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            split(LLAMA3_PRETOKENIZER_REGEX), byte_level(false, true, false),
        ]},
        "post_processor": post,
        "decoder": byte_level(true, true, true),
        "model": bpe_model(true, serde_json::Value::Null),
    })
}

/// The pre-tokenizer to build with, or why the metadata cannot be built.
fn buildable(
    md: &Metadata,
    family: Family,
    vocab: &Vocab,
) -> Result<std::result::Result<PreTokenizer, String>> {
    let model = opt_str(md, "tokenizer.ggml.model")?;
    if model == Some("llama") {
        bail!(
            "GGUF tokenizer.ggml.model is \"llama\" (a SentencePiece vocabulary: Llama 1/2, \
             Mistral): not supported; Concord reads byte-level BPE (gpt2) tokenizers"
        );
    }
    let pre = match opt_str(md, "tokenizer.ggml.pre")? {
        None => Ok(PreTokenizer::of_family(family)),
        Some(p) => PreTokenizer::from_gguf(p).ok_or(p),
    };
    Ok(match (model, pre, &vocab.merges) {
        (Some(m), _, _) if m != "gpt2" => Err(format!("tokenizer.ggml.model is {m:?}, not gpt2")),
        (_, Err(p), _) => Err(format!(
            "tokenizer.ggml.pre is {p:?}, not qwen2 or llama-bpe"
        )),
        (_, _, None) => Err("GGUF metadata key tokenizer.ggml.merges is missing".into()),
        (_, Ok(pre), Some(_)) => Ok(pre),
    })
}

/// The tokenizer `pre` describes, checked to keep every added token's GGUF id.
fn build(pre: PreTokenizer, vocab: &Vocab, bos: Option<u32>) -> Result<tokenizers::Tokenizer> {
    let merges = vocab.merges.as_deref().unwrap_or_default();
    let bos = bos.and_then(|id| Some((id, *vocab.tokens.get(id as usize)?)));
    let json = bpe_tokenizer_json(pre, &vocab.tokens, vocab.types.as_deref(), merges, bos)?;
    let bytes = serde_json::to_vec(&json)?;
    let tok = tokenizers::Tokenizer::from_bytes(&bytes)
        .map_err(|e| anyhow!("building the tokenizer from the GGUF metadata: {e}"))?;
    for (id, t) in vocab.tokens.iter().enumerate() {
        let ty = vocab.type_of(id);
        let added =
            ty == Some(i64::from(TOKEN_CONTROL)) || ty == Some(i64::from(TOKEN_USER_DEFINED));
        if added && tok.token_to_id(t) != Some(id as u32) {
            bail!(
                "GGUF token {t:?} (id {id}) maps to {:?} in the built tokenizer \
                 (duplicate token strings?)",
                tok.token_to_id(t)
            );
        }
    }
    Ok(tok)
}

/// The family's bundled tokenizer when the file's vocabulary is its vocabulary.
fn bundled_fallback(family: Family, vocab: &Vocab, why: &str) -> Result<tokenizers::Tokenizer> {
    let (bundled, bundled_merges) = bundled_tokenizer(family)?;
    bundled_vocab_matches(
        &bundled,
        &bundled_merges,
        &vocab.tokens,
        vocab.types.as_deref(),
        vocab.merges.as_deref(),
    )
    .map_err(|m| {
        anyhow!(
            "cannot build the GGUF tokenizer ({why}) and its vocabulary does not match the \
             bundled {} tokenizer ({m})",
            bundled_name(family)
        )
    })?;
    Ok(bundled)
}

/// The tokenizer (with chat template and stop ids) of a GGUF file's metadata, where it came
/// from, and the special ids. The family (which bundled tokenizer, Llama 3's stops) is
/// `general.architecture`'s, Qwen2 when the key is absent.
pub fn tokenizer_from_metadata(md: &Metadata) -> Result<(Tokenizer, TokenizerSource, SpecialIds)> {
    let family = opt_str(md, "general.architecture")?
        .and_then(family_of_architecture)
        .unwrap_or(Family::Qwen2);
    let vocab = Vocab::read(md)?;
    let ids = special_ids(md, family, &vocab)?;
    let pre = buildable(md, family, &vocab)?;
    let dialect = match &pre {
        Ok(p) => *p,
        Err(_) => PreTokenizer::of_family(family),
    };
    let adds_bos = opt_bool(md, "tokenizer.ggml.add_bos_token")?.unwrap_or(dialect.adds_bos());
    let bos = ids.bos.filter(|_| adds_bos);
    let (inner, source) = match pre {
        Ok(pre) => (build(pre, &vocab, bos)?, TokenizerSource::Metadata),
        Err(why) => (
            bundled_fallback(family, &vocab, &why)?,
            TokenizerSource::Bundled,
        ),
    };
    // What tokenizer_config.json would say: the chat templates read these.
    let mut tcfg = serde_json::Map::new();
    for (key, id) in [
        ("eos_token", ids.eos.first().copied()),
        ("pad_token", ids.pad),
        ("bos_token", bos),
    ] {
        if let Some(s) = vocab.name(id) {
            tcfg.insert(key.into(), json!(s));
        }
    }
    let template = opt_str(md, "tokenizer.chat_template")?.map(String::from);
    let tok = Tokenizer::new(inner, &serde_json::Value::Object(tcfg), template, &ids.eos)?;
    Ok((tok, source, ids))
}

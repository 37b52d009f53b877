//! GGUF checkpoints (llama.cpp, Ollama): `--model FILE.gguf` / `[model] name = "FILE.gguf"`.
//!
//! Only `general.architecture = qwen2` is loaded. The file is read with candle's
//! `quantized::gguf_file`; every tensor is dequantized (any type candle reads: F32, F16,
//! BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K … Q6_K) to the requested dtype and renamed to
//! the Hugging Face names of [`Weights`], so the result is the same thing a safetensors
//! checkpoint gives (see [`load_checkpoint`]). Training then runs on the dequantized
//! weights (LoRA on top), like transformers' own GGUF loader.
//!
//! # Layout
//! llama.cpp's `convert_hf_to_gguf.py` writes qwen2 tensors with their Hugging Face values
//! (its `Qwen2Model` does not apply the q/k RoPE permutation that `LlamaModel` applies, and
//! transformers' GGUF loader has no qwen2 tensor processor), so tensors map one to one:
//!
//! | GGUF                       | Hugging Face                                    |
//! |----------------------------|-------------------------------------------------|
//! | `token_embd.weight`        | `model.embed_tokens.weight`                     |
//! | `blk.N.attn_norm.weight`   | `model.layers.N.input_layernorm.weight`         |
//! | `blk.N.attn_{q,k,v}.*`     | `model.layers.N.self_attn.{q,k,v}_proj.*`       |
//! | `blk.N.attn_output.weight` | `model.layers.N.self_attn.o_proj.weight`        |
//! | `blk.N.ffn_norm.weight`    | `model.layers.N.post_attention_layernorm.weight`|
//! | `blk.N.ffn_{gate,up,down}` | `model.layers.N.mlp.{gate,up,down}_proj.weight` |
//! | `output_norm.weight`       | `model.norm.weight`                             |
//! | `output.weight`            | `lm_head.weight` (absent: tied to embeddings)   |
//!
//! GGUF dims are stored innermost first; candle reverses them, so shapes are `[out, in]`.
//!
//! # Tokenizer
//! Built from the file's metadata when it holds a byte-level BPE (`tokenizer.ggml.model =
//! gpt2`, `tokenizer.ggml.pre = qwen2` or absent, `tokens` + `merges` + `token_type`):
//! Qwen2's normalizer (NFC), pre-tokenizer regex and byte-level decoder, CONTROL (3) and
//! USER_DEFINED (4) tokens as added tokens (CONTROL ones special). When the metadata cannot
//! be built (no merges, another pre-tokenizer), the bundled Qwen tokenizer is used only if
//! the vocabulary matches (see [`bundled_vocab_matches`]); otherwise loading fails with the
//! reason. The chat template is `tokenizer.chat_template` (ChatML when absent).
use std::collections::{BTreeMap, HashMap};
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use candle_core::quantized::gguf_file::{Content, Value};
use candle_core::quantized::GgmlDType;
use candle_core::{DType, Device};
use serde_json::json;

use super::checkpoint::{
    check_dtype_supported, default_dtype, expected_shapes, Checkpoint, CheckpointConfig,
    ModelFiles, ARCHITECTURE,
};
use super::generation::GenerationConfig;
use super::qwen2::{Qwen2Config, Weights};
use super::tokenizer::Tokenizer;

/// The one GGUF architecture Concord loads.
pub const GGUF_ARCHITECTURE: &str = "qwen2";

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

/// Where the tokenizer of a GGUF model came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenizerSource {
    /// Built from `tokenizer.ggml.tokens` / `merges` / `token_type`.
    Metadata,
    /// The bundled Qwen tokenizer (assets/), used because the metadata could not be built
    /// and its vocabulary matches.
    Bundled,
}

/// A GGUF model, dequantized and renamed: everything [`Checkpoint`] needs.
pub struct GgufModel {
    pub path: PathBuf,
    pub config: Qwen2Config,
    /// Hugging Face names, in `dtype`, on the requested device.
    pub weights: Weights,
    pub dtype: DType,
    pub tokenizer: Tokenizer,
    pub tokenizer_source: TokenizerSource,
    /// `tokenizer.chat_template` (None: the file has none; the tokenizer then uses ChatML).
    pub chat_template: Option<String>,
    pub bos_token_id: Option<u32>,
    /// `tokenizer.ggml.eos_token_id` (then `eot_token_id`, `eom_token_id` when present).
    pub eos_token_ids: Vec<u32>,
    pub pad_token_id: Option<u32>,
    /// `general.name`, when present.
    pub name: Option<String>,
    /// How many tensors of each ggml type the file held (e.g. `Q4K: 133`).
    pub tensor_types: BTreeMap<String, usize>,
}

pub use super::checkpoint::is_gguf_path;

/// The llama.cpp name of a Hugging Face Qwen2 tensor name (None: not a Qwen2 tensor).
pub fn gguf_tensor_name(hf: &str) -> Option<String> {
    match hf {
        "model.embed_tokens.weight" => return Some("token_embd.weight".into()),
        "model.norm.weight" => return Some("output_norm.weight".into()),
        "lm_head.weight" => return Some("output.weight".into()),
        _ => {}
    }
    let rest = hf.strip_prefix("model.layers.")?;
    let (layer, rest) = rest.split_once('.')?;
    layer.parse::<usize>().ok()?;
    let (module, suffix) = rest.rsplit_once('.')?;
    let short = match module {
        "input_layernorm" => "attn_norm",
        "post_attention_layernorm" => "ffn_norm",
        "self_attn.q_proj" => "attn_q",
        "self_attn.k_proj" => "attn_k",
        "self_attn.v_proj" => "attn_v",
        "self_attn.o_proj" => "attn_output",
        "mlp.gate_proj" => "ffn_gate",
        "mlp.up_proj" => "ffn_up",
        "mlp.down_proj" => "ffn_down",
        _ => return None,
    };
    Some(format!("blk.{layer}.{short}.{suffix}"))
}

// ---------------------------------------------------------------------------------------
// Metadata access with named errors
// ---------------------------------------------------------------------------------------

type Metadata = HashMap<String, Value>;

fn missing(key: &str) -> anyhow::Error {
    anyhow!("GGUF metadata key {key} is missing")
}

fn as_u64(key: &str, v: &Value) -> Result<u64> {
    let x: i128 = match v {
        Value::U8(x) => (*x).into(),
        Value::I8(x) => (*x).into(),
        Value::U16(x) => (*x).into(),
        Value::I16(x) => (*x).into(),
        Value::U32(x) => (*x).into(),
        Value::I32(x) => (*x).into(),
        Value::U64(x) => (*x).into(),
        Value::I64(x) => (*x).into(),
        other => bail!(
            "GGUF metadata key {key} must be an integer, got {:?}",
            other.value_type()
        ),
    };
    u64::try_from(x).map_err(|_| anyhow!("GGUF metadata key {key} must be non-negative, got {x}"))
}

fn as_f64(key: &str, v: &Value) -> Result<f64> {
    match v {
        Value::F32(x) => Ok(f64::from(*x)),
        Value::F64(x) => Ok(*x),
        other => as_u64(key, other).map(|x| x as f64),
    }
}

fn as_str<'a>(key: &str, v: &'a Value) -> Result<&'a str> {
    match v {
        Value::String(s) => Ok(s),
        other => bail!(
            "GGUF metadata key {key} must be a string, got {:?}",
            other.value_type()
        ),
    }
}

fn need_usize(md: &Metadata, key: &str) -> Result<usize> {
    md.get(key)
        .ok_or_else(|| missing(key))
        .and_then(|v| as_u64(key, v))
        .map(|x| x as usize)
}

fn opt_usize(md: &Metadata, key: &str) -> Result<Option<usize>> {
    md.get(key)
        .map(|v| as_u64(key, v).map(|x| x as usize))
        .transpose()
}

fn opt_f64(md: &Metadata, key: &str) -> Result<Option<f64>> {
    md.get(key).map(|v| as_f64(key, v)).transpose()
}

fn opt_str<'a>(md: &'a Metadata, key: &str) -> Result<Option<&'a str>> {
    md.get(key).map(|v| as_str(key, v)).transpose()
}

fn opt_u32(md: &Metadata, key: &str) -> Result<Option<u32>> {
    md.get(key)
        .map(|v| {
            as_u64(key, v).and_then(|x| {
                u32::try_from(x).map_err(|_| anyhow!("GGUF metadata key {key}: {x} is too large"))
            })
        })
        .transpose()
}

fn string_array<'a>(md: &'a Metadata, key: &str) -> Result<Option<Vec<&'a str>>> {
    let Some(v) = md.get(key) else {
        return Ok(None);
    };
    let Value::Array(items) = v else {
        bail!(
            "GGUF metadata key {key} must be an array of strings, got {:?}",
            v.value_type()
        )
    };
    items
        .iter()
        .map(|x| as_str(key, x))
        .collect::<Result<Vec<_>>>()
        .map(Some)
}

fn int_array(md: &Metadata, key: &str) -> Result<Option<Vec<i64>>> {
    let Some(v) = md.get(key) else {
        return Ok(None);
    };
    let Value::Array(items) = v else {
        bail!(
            "GGUF metadata key {key} must be an array of integers, got {:?}",
            v.value_type()
        )
    };
    items
        .iter()
        .map(|x| match x {
            Value::I32(i) => Ok(i64::from(*i)),
            Value::I64(i) => Ok(*i),
            other => as_u64(key, other).map(|u| u as i64),
        })
        .collect::<Result<Vec<_>>>()
        .map(Some)
}

/// `general.architecture`, checked to be qwen2.
pub fn check_architecture(md: &Metadata) -> Result<()> {
    let key = "general.architecture";
    let arch = as_str(key, md.get(key).ok_or_else(|| missing(key))?)?;
    if arch != GGUF_ARCHITECTURE {
        bail!(
            "unsupported GGUF architecture {arch:?} (general.architecture): Concord loads \
             {GGUF_ARCHITECTURE} GGUF files only"
        );
    }
    Ok(())
}

/// [`Qwen2Config`] from the `qwen2.*` keys. `vocab_size` is the embedding's row count;
/// `tie_word_embeddings` is set when there is no `output.weight`.
pub fn config_from_metadata(
    md: &Metadata,
    vocab_size: usize,
    has_output: bool,
) -> Result<Qwen2Config> {
    check_architecture(md)?;
    let k = |s: &str| format!("{GGUF_ARCHITECTURE}.{s}");
    let hidden_size = need_usize(md, &k("embedding_length"))?;
    let num_attention_heads = need_usize(md, &k("attention.head_count"))?;
    if num_attention_heads == 0 {
        bail!(
            "GGUF metadata key {} must be positive",
            k("attention.head_count")
        );
    }
    // llama.cpp: head_count_kv defaults to head_count; key_length to n_embd / n_head.
    let num_key_value_heads =
        opt_usize(md, &k("attention.head_count_kv"))?.unwrap_or(num_attention_heads);
    let head_dim =
        opt_usize(md, &k("attention.key_length"))?.unwrap_or(hidden_size / num_attention_heads);
    if let Some(v) = opt_usize(md, &k("attention.value_length"))? {
        if v != head_dim {
            bail!("GGUF: attention.value_length {v} != key_length {head_dim} is not supported");
        }
    }
    if let Some(t) = opt_str(md, &k("rope.scaling.type"))? {
        if t != "none" {
            bail!(
                "GGUF: RoPE scaling {t:?} ({}) is not supported",
                k("rope.scaling.type")
            );
        }
    }
    let cfg = Qwen2Config {
        vocab_size,
        hidden_size,
        intermediate_size: need_usize(md, &k("feed_forward_length"))?,
        num_hidden_layers: need_usize(md, &k("block_count"))?,
        num_attention_heads,
        num_key_value_heads,
        head_dim,
        max_position_embeddings: opt_usize(md, &k("context_length"))?.unwrap_or(32_768),
        // transformers' Qwen2Config defaults (the file normally has both).
        rope_theta: opt_f64(md, &k("rope.freq_base"))?.unwrap_or(10_000.0),
        rms_norm_eps: opt_f64(md, &k("attention.layer_norm_rms_epsilon"))?.unwrap_or(1e-6),
        tie_word_embeddings: !has_output,
    };
    cfg.validate().context("GGUF metadata")?;
    Ok(cfg)
}

// ---------------------------------------------------------------------------------------
// Header diagnostics: candle's reader stops at the first problem without naming the
// tensor; this walks the header again to say what is wrong.
// ---------------------------------------------------------------------------------------

/// ggml type ids candle reads (`GgmlDType`).
const CANDLE_TYPE_IDS: [u32; 15] = [0, 1, 2, 3, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 30];

/// ggml's name of a type id (ggml.h `enum ggml_type`).
pub fn ggml_type_name(id: u32) -> String {
    let name = match id {
        0 => "F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        4 => "Q4_2 (removed)",
        5 => "Q4_3 (removed)",
        6 => "Q5_0",
        7 => "Q5_1",
        8 => "Q8_0",
        9 => "Q8_1",
        10 => "Q2_K",
        11 => "Q3_K",
        12 => "Q4_K",
        13 => "Q5_K",
        14 => "Q6_K",
        15 => "Q8_K",
        16 => "IQ2_XXS",
        17 => "IQ2_XS",
        18 => "IQ3_XXS",
        19 => "IQ1_S",
        20 => "IQ4_NL",
        21 => "IQ3_S",
        22 => "IQ2_S",
        23 => "IQ4_XS",
        24 => "I8",
        25 => "I16",
        26 => "I32",
        27 => "I64",
        28 => "F64",
        29 => "IQ1_M",
        30 => "BF16",
        34 => "TQ1_0",
        35 => "TQ2_0",
        39 => "MXFP4",
        _ => return format!("unknown type {id}"),
    };
    name.to_string()
}

#[derive(Debug)]
enum HeaderProblem {
    Truncated(String),
    UnsupportedType { tensor: String, type_id: u32 },
    Other(String),
}

fn diagnose_header<R: Read + Seek>(r: &mut R) -> HeaderProblem {
    fn eof(what: &str) -> impl Fn(std::io::Error) -> HeaderProblem + '_ {
        move |e| {
            if e.kind() == std::io::ErrorKind::UnexpectedEof {
                HeaderProblem::Truncated(format!("the file ends inside the {what}"))
            } else {
                HeaderProblem::Other(format!("reading the {what}: {e}"))
            }
        }
    }
    fn u32_(r: &mut impl Read, what: &str) -> Result<u32, HeaderProblem> {
        let mut b = [0u8; 4];
        r.read_exact(&mut b).map_err(eof(what))?;
        Ok(u32::from_le_bytes(b))
    }
    fn u64_(r: &mut impl Read, what: &str) -> Result<u64, HeaderProblem> {
        let mut b = [0u8; 8];
        r.read_exact(&mut b).map_err(eof(what))?;
        Ok(u64::from_le_bytes(b))
    }
    fn skip<R: Read + Seek>(r: &mut R, n: u64, what: &str, len: u64) -> Result<(), HeaderProblem> {
        let pos = r.stream_position().map_err(eof(what))?;
        if pos.saturating_add(n) > len {
            return Err(HeaderProblem::Truncated(format!(
                "the file ends inside the {what}"
            )));
        }
        r.seek(SeekFrom::Current(n as i64)).map_err(eof(what))?;
        Ok(())
    }
    fn walk<R: Read + Seek>(r: &mut R) -> Result<HeaderProblem, HeaderProblem> {
        let len = r.seek(SeekFrom::End(0)).map_err(eof("file"))?;
        r.seek(SeekFrom::Start(0)).map_err(eof("file"))?;
        let magic = u32_(r, "magic")?;
        if magic != 0x4655_4747 {
            return Ok(HeaderProblem::Other(format!(
                "not a GGUF file (magic 0x{magic:08x})"
            )));
        }
        let version = u32_(r, "version")?;
        let v1 = version == 1;
        let length = |r: &mut R, what: &str| -> Result<u64, HeaderProblem> {
            if v1 {
                u32_(r, what).map(u64::from)
            } else {
                u64_(r, what)
            }
        };
        let n_tensors = length(r, "tensor count")?;
        let n_kv = length(r, "metadata count")?;
        fn value<R: Read + Seek>(
            r: &mut R,
            t: u32,
            v1: bool,
            len: u64,
            depth: usize,
        ) -> Result<(), HeaderProblem> {
            let what = "metadata";
            let fixed = |t: u32| match t {
                0 | 1 | 7 => Some(1u64),
                2 | 3 => Some(2),
                4..=6 => Some(4),
                10..=12 => Some(8),
                _ => None,
            };
            let read_len = |r: &mut R| -> Result<u64, HeaderProblem> {
                if v1 {
                    u32_(r, what).map(u64::from)
                } else {
                    u64_(r, what)
                }
            };
            if let Some(n) = fixed(t) {
                return skip(r, n, what, len);
            }
            match t {
                8 => {
                    let n = read_len(r)?;
                    skip(r, n, what, len)
                }
                9 if depth < 64 => {
                    let et = u32_(r, what)?;
                    let n = read_len(r)?;
                    if let Some(sz) = fixed(et) {
                        skip(r, n.saturating_mul(sz), what, len)
                    } else {
                        for _ in 0..n {
                            value(r, et, v1, len, depth + 1)?;
                        }
                        Ok(())
                    }
                }
                _ => Err(HeaderProblem::Other(format!(
                    "unknown metadata value type {t}"
                ))),
            }
        }
        for _ in 0..n_kv {
            let n = length(r, "metadata")?;
            skip(r, n, "metadata", len)?;
            let t = u32_(r, "metadata")?;
            value(r, t, v1, len, 0)?;
        }
        for _ in 0..n_tensors {
            let n = length(r, "tensor table")?;
            let pos = r.stream_position().map_err(eof("tensor table"))?;
            if pos.saturating_add(n) > len {
                return Err(HeaderProblem::Truncated(
                    "the file ends inside the tensor table".into(),
                ));
            }
            let mut name = vec![0u8; n as usize];
            r.read_exact(&mut name).map_err(eof("tensor table"))?;
            let name = String::from_utf8_lossy(&name).into_owned();
            let dims = u32_(r, "tensor table")?;
            let dim_bytes = if v1 { 4 } else { 8 };
            skip(r, u64::from(dims) * dim_bytes, "tensor table", len)?;
            let type_id = u32_(r, "tensor table")?;
            if !CANDLE_TYPE_IDS.contains(&type_id) {
                return Ok(HeaderProblem::UnsupportedType {
                    tensor: name,
                    type_id,
                });
            }
            u64_(r, "tensor table")?;
        }
        Ok(HeaderProblem::Other(String::new()))
    }
    match walk(r) {
        Ok(p) | Err(p) => p,
    }
}

fn supported_types() -> &'static str {
    "F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K"
}

/// Read the header (metadata and tensor table) of a GGUF file, with named errors for a
/// truncated file and an unsupported tensor type.
pub fn read_content(path: &Path) -> Result<Content> {
    let file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut r = BufReader::new(file);
    match Content::read(&mut r) {
        Ok(c) => Ok(c),
        Err(e) => {
            let problem = diagnose_header(&mut r);
            match problem {
                HeaderProblem::Truncated(why) => {
                    bail!("truncated GGUF file {}: {why} ({e})", path.display())
                }
                HeaderProblem::UnsupportedType { tensor, type_id } => bail!(
                    "unsupported tensor type {} (ggml type {type_id}) of tensor {tensor} in {}: \
                     candle reads {}",
                    ggml_type_name(type_id),
                    path.display(),
                    supported_types()
                ),
                HeaderProblem::Other(why) if !why.is_empty() => {
                    bail!("reading the GGUF header of {}: {why} ({e})", path.display())
                }
                HeaderProblem::Other(_) => {
                    bail!("reading the GGUF header of {}: {e}", path.display())
                }
            }
        }
    }
}

fn type_name(t: GgmlDType) -> String {
    format!("{t:?}")
}

/// Bytes a tensor of `elems` elements of type `t` occupies.
fn tensor_bytes(t: GgmlDType, elems: usize) -> usize {
    elems / t.block_size() * t.type_size()
}

// ---------------------------------------------------------------------------------------
// Loading
// ---------------------------------------------------------------------------------------

/// Read a qwen2 GGUF file: config, dequantized weights (Hugging Face names, `dtype`, on
/// `device`), tokenizer and chat template.
pub fn load_gguf(path: &Path, dtype: DType, device: &Device) -> Result<GgufModel> {
    let content = read_content(path)?;
    let ctx = || format!("in {}", path.display());
    let md = &content.metadata;
    check_architecture(md).with_context(ctx)?;
    let infos = &content.tensor_infos;
    let embd = infos
        .get("token_embd.weight")
        .ok_or_else(|| anyhow!("GGUF tensor token_embd.weight is missing"))
        .with_context(ctx)?;
    let dims = embd.shape.dims();
    if dims.len() != 2 {
        bail!(
            "GGUF tensor token_embd.weight has shape {dims:?}, expected [vocab, hidden] ({})",
            path.display()
        );
    }
    let has_output = infos.contains_key("output.weight");
    let config = config_from_metadata(md, dims[0], has_output).with_context(ctx)?;

    // Names, shapes and sizes of every tensor before reading any data.
    let mut wanted = expected_shapes(&config);
    if has_output {
        wanted.push((
            "lm_head.weight".into(),
            vec![config.vocab_size, config.hidden_size],
        ));
    }
    let file_len = std::fs::metadata(path)
        .with_context(|| format!("reading {}", path.display()))?
        .len();
    let mut plan = Vec::with_capacity(wanted.len());
    for (hf, shape) in wanted {
        let g = gguf_tensor_name(&hf).expect("every Qwen2 tensor has a GGUF name");
        let info = infos
            .get(&g)
            .ok_or_else(|| anyhow!("GGUF tensor {g} (for {hf}) is missing"))
            .with_context(ctx)?;
        if info.shape.dims() != shape.as_slice() {
            bail!(
                "GGUF tensor {g} has shape {:?}, expected {shape:?} from the qwen2.* metadata ({})",
                info.shape.dims(),
                path.display()
            );
        }
        let end = content
            .tensor_data_offset
            .saturating_add(info.offset)
            .saturating_add(tensor_bytes(info.ggml_dtype, info.shape.elem_count()) as u64);
        if end > file_len {
            bail!(
                "truncated GGUF file {}: tensor {g} ends at byte {end} but the file has {file_len} \
                 bytes",
                path.display()
            );
        }
        plan.push((hf, g));
    }

    let mut tensor_types: BTreeMap<String, usize> = BTreeMap::new();
    for info in infos.values() {
        *tensor_types.entry(type_name(info.ggml_dtype)).or_default() += 1;
    }

    let file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut r = BufReader::new(file);
    let mut weights = Weights::with_capacity(plan.len());
    for (hf, g) in plan {
        let q = content
            .tensor(&mut r, &g, &Device::Cpu)
            .with_context(|| format!("reading GGUF tensor {g} from {}", path.display()))?;
        let t = q.dequantize(&Device::Cpu).with_context(|| {
            format!(
                "dequantizing GGUF tensor {g} ({}) from {}",
                type_name(q.dtype()),
                path.display()
            )
        })?;
        let t = if t.dtype() == dtype {
            t
        } else {
            t.to_dtype(dtype)?
        };
        crate::model::checkpoint::ensure_finite(&hf, &t)
            .with_context(|| format!("GGUF tensor {g} in {}", path.display()))?;
        weights.insert(hf, t.to_device(device)?);
    }

    let (tokenizer, tokenizer_source, ids) = tokenizer_from_metadata(md).with_context(ctx)?;
    if tokenizer.vocab_size() > config.vocab_size {
        bail!(
            "the GGUF tokenizer has {} ids but token_embd.weight has {} rows ({})",
            tokenizer.vocab_size(),
            config.vocab_size,
            path.display()
        );
    }
    Ok(GgufModel {
        path: path.to_path_buf(),
        config,
        weights,
        dtype,
        chat_template: opt_str(md, "tokenizer.chat_template")?.map(String::from),
        tokenizer,
        tokenizer_source,
        bos_token_id: ids.bos,
        eos_token_ids: ids.eos,
        pad_token_id: ids.pad,
        name: opt_str(md, "general.name")?.map(String::from),
        tensor_types,
    })
}

/// The hook [`super::load::load_checkpoint`] calls for a `.gguf` path: a [`Checkpoint`]
/// like a safetensors directory gives (`files` all point at the GGUF file).
pub fn load_checkpoint(path: &Path, dtype: Option<DType>, device: &Device) -> Result<Checkpoint> {
    if !path.is_file() {
        bail!("GGUF file {} does not exist", path.display());
    }
    let dtype = dtype.unwrap_or_else(|| default_dtype(device));
    check_dtype_supported(dtype, device)?;
    let g = load_gguf(path, dtype, device)?;
    let generation_config = GenerationConfig {
        bos_token_id: g.bos_token_id,
        eos_token_ids: g.eos_token_ids.clone(),
        pad_token_id: g.pad_token_id,
        ..GenerationConfig::default()
    };
    let info = CheckpointConfig {
        qwen2: g.config.clone(),
        architectures: vec![ARCHITECTURE.to_string()],
        stored_dtype: Some(g.tensor_types.keys().cloned().collect::<Vec<_>>().join("+")),
        bos_token_id: g.bos_token_id,
        eos_token_ids: g.eos_token_ids.clone(),
    };
    let files = ModelFiles {
        dir: path
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from(".")),
        config: path.to_path_buf(),
        weights: vec![path.to_path_buf()],
        tokenizer: path.to_path_buf(),
        tokenizer_config: None,
        chat_template: None,
        generation_config: None,
    };
    Ok(Checkpoint {
        config: g.config,
        info,
        weights: g.weights,
        tokenizer: g.tokenizer,
        generation_config,
        files,
        dtype,
    })
}

// ---------------------------------------------------------------------------------------
// Tokenizer
// ---------------------------------------------------------------------------------------

/// Special token ids from `tokenizer.ggml.*`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SpecialIds {
    pub bos: Option<u32>,
    pub eos: Vec<u32>,
    pub pad: Option<u32>,
}

fn special_ids(md: &Metadata) -> Result<SpecialIds> {
    let mut eos = Vec::new();
    for key in [
        "tokenizer.ggml.eos_token_id",
        "tokenizer.ggml.eot_token_id",
        "tokenizer.ggml.eom_token_id",
    ] {
        if let Some(id) = opt_u32(md, key)? {
            if !eos.contains(&id) {
                eos.push(id);
            }
        }
    }
    Ok(SpecialIds {
        bos: opt_u32(md, "tokenizer.ggml.bos_token_id")?,
        eos,
        pad: opt_u32(md, "tokenizer.ggml.padding_token_id")?,
    })
}

/// The bundled-tokenizer rule: the GGUF vocabulary matches the bundled Qwen tokenizer when
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

fn bundled_tokenizer() -> Result<(tokenizers::Tokenizer, Vec<String>)> {
    let bytes = super::tiny::qwen_tokenizer_json()?;
    let json: serde_json::Value =
        serde_json::from_slice(&bytes).context("parsing the bundled tokenizer")?;
    let merges = json["model"]["merges"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|m| match m {
                    serde_json::Value::String(s) => s.clone(),
                    serde_json::Value::Array(p) => p
                        .iter()
                        .filter_map(|x| x.as_str())
                        .collect::<Vec<_>>()
                        .join(" "),
                    _ => String::new(),
                })
                .collect()
        })
        .unwrap_or_default();
    let tok = tokenizers::Tokenizer::from_bytes(&bytes)
        .map_err(|e| anyhow!("loading the bundled tokenizer: {e}"))?;
    Ok((tok, merges))
}

/// tokenizer.json (Qwen2 byte-level BPE) from GGUF tokens, types and merges.
pub fn tokenizer_json_from_vocab(
    tokens: &[&str],
    types: Option<&[i64]>,
    merges: &[&str],
) -> Result<serde_json::Value> {
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
    let merges = merges
        .iter()
        .enumerate()
        .map(|(i, m)| {
            m.split_once(' ')
                .map(|(a, b)| json!([a, b]))
                .ok_or_else(|| anyhow!("tokenizer.ggml.merges[{i}] = {m:?} is not \"a b\""))
        })
        .collect::<Result<Vec<_>>>()?;
    let byte_level = json!({
        "type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false
    });
    Ok(json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": QWEN2_PRETOKENIZER_REGEX},
             "behavior": "Isolated", "invert": false},
            byte_level,
        ]},
        "post_processor": byte_level,
        "decoder": byte_level,
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": "",
            "end_of_word_suffix": "", "fuse_unk": false, "byte_fallback": false,
            "ignore_merges": false, "vocab": vocab, "merges": merges,
        },
    }))
}

/// The tokenizer (with chat template and stop ids) of a GGUF file's metadata, where it came
/// from, and the special ids.
pub fn tokenizer_from_metadata(md: &Metadata) -> Result<(Tokenizer, TokenizerSource, SpecialIds)> {
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
    let model = opt_str(md, "tokenizer.ggml.model")?;
    let pre = opt_str(md, "tokenizer.ggml.pre")?;
    let ids = special_ids(md)?;

    // Can the metadata be built into Qwen2's tokenizer?
    let buildable: std::result::Result<&[&str], String> = match (model, pre, &merges) {
        (Some(m), _, _) if m != "gpt2" => Err(format!("tokenizer.ggml.model is {m:?}, not gpt2")),
        (_, Some(p), _) if p != "qwen2" => Err(format!("tokenizer.ggml.pre is {p:?}, not qwen2")),
        (_, _, None) => Err("GGUF metadata key tokenizer.ggml.merges is missing".into()),
        (_, _, Some(m)) => Ok(m.as_slice()),
    };
    let (inner, source) = match buildable {
        Ok(m) => {
            let json = tokenizer_json_from_vocab(&tokens, types.as_deref(), m)?;
            let bytes = serde_json::to_vec(&json)?;
            let tok = tokenizers::Tokenizer::from_bytes(&bytes)
                .map_err(|e| anyhow!("building the tokenizer from the GGUF metadata: {e}"))?;
            // Every control / user-defined token must keep its GGUF id.
            for (id, t) in tokens.iter().enumerate() {
                let ty = types.as_ref().and_then(|v| v.get(id)).copied();
                let added = ty == Some(i64::from(TOKEN_CONTROL))
                    || ty == Some(i64::from(TOKEN_USER_DEFINED));
                if added && tok.token_to_id(t) != Some(id as u32) {
                    bail!(
                        "GGUF token {t:?} (id {id}) maps to {:?} in the built tokenizer \
                         (duplicate token strings?)",
                        tok.token_to_id(t)
                    );
                }
            }
            (tok, TokenizerSource::Metadata)
        }
        Err(why) => {
            let (bundled, bundled_merges) = bundled_tokenizer()?;
            bundled_vocab_matches(
                &bundled,
                &bundled_merges,
                &tokens,
                types.as_deref(),
                merges.as_deref(),
            )
            .map_err(|m| {
                anyhow!(
                    "cannot build the GGUF tokenizer ({why}) and its vocabulary does not match \
                     the bundled Qwen tokenizer ({m})"
                )
            })?;
            (bundled, TokenizerSource::Bundled)
        }
    };
    let name = |id: Option<u32>| {
        id.and_then(|i| tokens.get(i as usize))
            .map(|s| s.to_string())
    };
    let mut tcfg = serde_json::Map::new();
    if let Some(s) = name(ids.eos.first().copied()) {
        tcfg.insert("eos_token".into(), json!(s));
    }
    if let Some(s) = name(ids.pad) {
        tcfg.insert("pad_token".into(), json!(s));
    }
    let add_bos = md
        .get("tokenizer.ggml.add_bos_token")
        .is_some_and(|v| matches!(v, Value::Bool(true)));
    if add_bos {
        if let Some(s) = name(ids.bos) {
            tcfg.insert("bos_token".into(), json!(s));
        }
    }
    let template = opt_str(md, "tokenizer.chat_template")?.map(String::from);
    let tok = Tokenizer::new(inner, &serde_json::Value::Object(tcfg), template, &ids.eos)?;
    Ok((tok, source, ids))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gguf_names_cover_every_qwen2_tensor() {
        let mut cfg = Qwen2Config::tiny();
        cfg.tie_word_embeddings = false;
        let mut seen = std::collections::HashSet::new();
        for (hf, _) in cfg.tensor_shapes() {
            let g = gguf_tensor_name(&hf).unwrap_or_else(|| panic!("no GGUF name for {hf}"));
            assert!(seen.insert(g.clone()), "duplicate GGUF name {g}");
        }
        assert_eq!(
            gguf_tensor_name("model.layers.3.self_attn.o_proj.weight").as_deref(),
            Some("blk.3.attn_output.weight")
        );
        assert_eq!(
            gguf_tensor_name("model.layers.0.self_attn.k_proj.bias").as_deref(),
            Some("blk.0.attn_k.bias")
        );
        assert_eq!(
            gguf_tensor_name("model.layers.1.post_attention_layernorm.weight").as_deref(),
            Some("blk.1.ffn_norm.weight")
        );
        assert_eq!(gguf_tensor_name("model.layers.x.mlp.up_proj.weight"), None);
    }

    #[test]
    fn gguf_paths_and_type_names() {
        assert!(is_gguf_path(Path::new("a/b/Model-Q4_K_M.GGUF")));
        assert!(!is_gguf_path(Path::new("a/b/model.safetensors")));
        assert_eq!(ggml_type_name(12), "Q4_K");
        assert_eq!(ggml_type_name(20), "IQ4_NL");
    }
}

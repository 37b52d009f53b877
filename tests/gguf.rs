//! GGUF loading: tiny qwen2, qwen3 and llama GGUFs written here the way llama.cpp's
//! converter writes them (mixed quantisations, llama's q/k rows permuted, Llama 3 RoPE
//! factors as `rope_freqs.weight`, a tiny byte-level BPE vocabulary in the metadata) must
//! read back as the Hugging Face tensors and give the same log-probs as the same
//! dequantized weights loaded from a safetensors directory; the metadata tokenizers must
//! equal the bundled Qwen and Llama 3 ones on their full vocabularies; named errors for a
//! truncated file, an unsupported architecture, an unsupported tensor type, a missing key
//! or tensor, and the llama-specific checks.
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Device, Tensor};
use concord::chat::Message;
use concord::model::gguf::{
    bpe_tokenizer_json, gguf_tensor_name, load_gguf, tokenizer_from_metadata,
    tokenizer_json_from_vocab, PreTokenizer, TokenizerSource, TOKEN_CONTROL, TOKEN_NORMAL,
    TOKEN_UNUSED, TOKEN_USER_DEFINED,
};
use concord::model::load::{load_checkpoint, load_model, LoadedModel, ModelRef, ModelSpec};
use concord::model::quant::{BaseDtype, QuantMode};
use concord::model::score::score_completion;
use concord::model::tiny::family::{
    tokenizer_config_json, tokenizer_json, LLAMA3_CHAT_TEMPLATE, QWEN3_CHAT_TEMPLATE,
};
use concord::model::tiny::{qwen_tokenizer_json, tensor_values, TinySpec, QWEN25_CHAT_TEMPLATE};
use concord::model::tokenizer::Tokenizer;
use concord::model::{ArchConfig, Family, Llama3Rope, RopeScaling};

use crate::util::max_abs_diff;

const VOCAB: usize = 512;
/// Ids below this are the bundled tokenizer's first byte-level tokens (256 bytes + the
/// first merges, whose results take ids 256, 257, ... in merge order).
const NORMAL: usize = 506;
const ENDOFTEXT: u32 = 509;
const IM_START: u32 = 510;
const IM_END: u32 = 511;

/// hidden 256 / MLP 512 so every K-quant (256-element blocks) applies to every matrix,
/// and each block is one row (so permuting rows commutes with quantizing).
fn spec(tie: bool) -> TinySpec {
    TinySpec {
        hidden: 256,
        layers: 2,
        heads: 4,
        kv_heads: 2,
        intermediate: 512,
        vocab: Some(VOCAB),
        seed: 7,
        tie,
        ..TinySpec::default()
    }
}

/// The tiny vocabulary: (tokens, types, merges).
fn tiny_vocab() -> (Vec<String>, Vec<i32>, Vec<String>) {
    let json: serde_json::Value = serde_json::from_slice(&qwen_tokenizer_json().unwrap()).unwrap();
    let vocab = json["model"]["vocab"].as_object().unwrap();
    let mut by_id = vec![String::new(); NORMAL];
    for (tok, id) in vocab {
        let id = id.as_u64().unwrap() as usize;
        if id < NORMAL {
            by_id[id] = tok.clone();
        }
    }
    let merges: Vec<String> = json["model"]["merges"].as_array().unwrap()[..NORMAL - 256]
        .iter()
        .map(merge_string)
        .collect();
    let mut tokens = by_id;
    let mut types = vec![TOKEN_NORMAL; NORMAL];
    for id in NORMAL..ENDOFTEXT as usize {
        tokens.push(format!("[PAD{id}]"));
        types.push(TOKEN_UNUSED);
    }
    for t in ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] {
        tokens.push(t.to_string());
        types.push(TOKEN_CONTROL);
    }
    assert_eq!(tokens.len(), VOCAB);
    (tokens, types, merges)
}

/// A tokenizer.json merge (`["a", "b"]`) as GGUF stores it (`"a b"`).
fn merge_string(m: &serde_json::Value) -> String {
    let p = m.as_array().unwrap();
    format!("{} {}", p[0].as_str().unwrap(), p[1].as_str().unwrap())
}

fn strings(v: &[String]) -> Value {
    Value::Array(v.iter().map(|s| Value::String(s.clone())).collect())
}

fn kv(key: &str, v: Value) -> (String, Value) {
    (key.to_string(), v)
}

/// `general.*` and `{arch}.*` keys of `c`, as llama.cpp's converter writes them.
fn arch_metadata(c: &ArchConfig) -> Vec<(String, Value)> {
    let arch = c.family.gguf_architecture();
    let k = |s: &str| format!("{arch}.{s}");
    let u = |x: usize| Value::U32(x as u32);
    let mut md = vec![
        kv("general.architecture", Value::String(arch.into())),
        kv("general.name", Value::String("tiny".into())),
        kv(&k("block_count"), u(c.num_hidden_layers)),
        kv(&k("context_length"), u(c.max_position_embeddings)),
        kv(&k("embedding_length"), u(c.hidden_size)),
        kv(&k("feed_forward_length"), u(c.intermediate_size)),
        kv(&k("attention.head_count"), u(c.num_attention_heads)),
        kv(&k("attention.head_count_kv"), u(c.num_key_value_heads)),
        kv(&k("rope.freq_base"), Value::F32(c.rope_theta as f32)),
        kv(
            &k("attention.layer_norm_rms_epsilon"),
            Value::F32(c.rms_norm_eps as f32),
        ),
    ];
    if c.family != Family::Qwen2 {
        md.push(kv(&k("attention.key_length"), u(c.head_dim)));
        md.push(kv(&k("attention.value_length"), u(c.head_dim)));
        md.push(kv(&k("rope.dimension_count"), u(c.head_dim)));
    }
    if c.family == Family::Llama {
        md.push(kv(&k("vocab_size"), u(c.vocab_size)));
    }
    md
}

fn qwen_template(family: Family) -> &'static str {
    if family == Family::Qwen3 {
        QWEN3_CHAT_TEMPLATE
    } else {
        QWEN25_CHAT_TEMPLATE
    }
}

/// Metadata of a tiny Qwen model (qwen2 or qwen3) with the tiny Qwen vocabulary.
fn metadata(spec: &TinySpec) -> Vec<(String, Value)> {
    let (tokens, types, merges) = tiny_vocab();
    let mut md = arch_metadata(&spec.arch_config());
    md.extend([
        kv("tokenizer.ggml.model", Value::String("gpt2".into())),
        kv("tokenizer.ggml.pre", Value::String("qwen2".into())),
        kv("tokenizer.ggml.tokens", strings(&tokens)),
        kv(
            "tokenizer.ggml.token_type",
            Value::Array(types.into_iter().map(Value::I32).collect()),
        ),
        kv("tokenizer.ggml.merges", strings(&merges)),
        kv("tokenizer.ggml.eos_token_id", Value::U32(IM_END)),
        kv("tokenizer.ggml.padding_token_id", Value::U32(ENDOFTEXT)),
        kv("tokenizer.ggml.bos_token_id", Value::U32(ENDOFTEXT)),
        kv("tokenizer.ggml.add_bos_token", Value::Bool(false)),
        kv(
            "tokenizer.chat_template",
            Value::String(qwen_template(spec.family).into()),
        ),
    ]);
    md
}

/// The quantisation of each tensor: every type the loader must read, spread over layers.
fn qtype(hf: &str) -> GgmlDType {
    use GgmlDType::*;
    if !hf.ends_with(".weight") || hf.contains("norm") {
        return F32;
    }
    let table0 = [
        ("q_proj", Q4K),
        ("k_proj", Q5K),
        ("v_proj", Q6K),
        ("o_proj", Q4_0),
        ("gate_proj", Q5_0),
        ("up_proj", Q8_0),
        ("down_proj", F16),
    ];
    let table1 = [
        ("q_proj", Q4_1),
        ("k_proj", Q5_1),
        ("v_proj", Q2K),
        ("o_proj", Q3K),
        ("gate_proj", BF16),
        ("up_proj", F32),
        ("down_proj", Q6K),
    ];
    if hf == "model.embed_tokens.weight" {
        return Q8_0;
    }
    if hf == "lm_head.weight" {
        return Q6K;
    }
    let table = if hf.starts_with("model.layers.0.") {
        table0
    } else {
        table1
    };
    table
        .iter()
        .find(|(m, _)| hf.contains(m))
        .map(|(_, t)| *t)
        .unwrap()
}

/// The head count convert_hf_to_gguf's `LlamaModel.permute` reorders a tensor's rows by.
fn converter_heads(spec: &TinySpec, hf: &str) -> Option<usize> {
    if spec.family != Family::Llama {
        return None;
    }
    if hf.contains("self_attn.q_proj.") {
        Some(spec.heads)
    } else if hf.contains("self_attn.k_proj.") {
        Some(spec.kv_heads)
    } else {
        None
    }
}

/// `LlamaModel.permute` as the converter writes it:
/// `w.reshape(H, 2, hd/2, in).swapaxes(1, 2).reshape(out, in)`.
fn converter_permute(t: &Tensor, heads: usize) -> Tensor {
    let (out, inp) = t.dims2().unwrap();
    t.reshape((heads, 2, out / heads / 2, inp))
        .unwrap()
        .transpose(1, 2)
        .unwrap()
        .contiguous()
        .unwrap()
        .reshape((out, inp))
        .unwrap()
}

/// Quantized tensors by GGUF name (llama's q/k permuted like the converter when
/// `permute`), and the Hugging Face tensors quantized and dequantized, by HF name.
fn quantized_as(
    spec: &TinySpec,
    permute: bool,
) -> (Vec<(String, QTensor)>, HashMap<String, Tensor>) {
    let mut q = Vec::new();
    let mut deq = HashMap::new();
    for (hf, shape) in spec.tensor_shapes() {
        let vals = tensor_values(spec, &hf, &shape);
        let t = Tensor::from_vec(vals, shape.as_slice(), &Device::Cpu).unwrap();
        let hf_q = QTensor::quantize(&t, qtype(&hf)).unwrap();
        deq.insert(hf.clone(), hf_q.dequantize(&Device::Cpu).unwrap());
        let stored = match converter_heads(spec, &hf) {
            Some(h) if permute => QTensor::quantize(&converter_permute(&t, h), qtype(&hf)).unwrap(),
            _ => hf_q,
        };
        q.push((gguf_tensor_name(&hf).unwrap(), stored));
    }
    (q, deq)
}

fn quantized(spec: &TinySpec) -> (Vec<(String, QTensor)>, HashMap<String, Tensor>) {
    quantized_as(spec, true)
}

fn write_gguf(path: &Path, md: &[(String, Value)], tensors: &[(String, QTensor)]) {
    let mut f = std::fs::File::create(path).unwrap();
    let md: Vec<(&str, &Value)> = md.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let ts: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    gguf_file::write(&mut f, &md, &ts).unwrap();
}

/// A safetensors directory of `deq` with config.json from the spec (`ids` override its
/// special ids; the norm epsilon is the f32 the GGUF holds), and the given tokenizer files.
fn write_safetensors(
    st: &Path,
    spec: &TinySpec,
    deq: &HashMap<String, Tensor>,
    ids: serde_json::Value,
    tokenizer: &serde_json::Value,
    tokenizer_config: serde_json::Value,
) {
    std::fs::create_dir_all(st).unwrap();
    let mut cfg = spec.config_json();
    let eps = spec.arch_config().rms_norm_eps as f32;
    cfg["rms_norm_eps"] = serde_json::json!(f64::from(eps));
    for (k, v) in ids.as_object().unwrap() {
        cfg[k] = v.clone();
    }
    std::fs::write(st.join("config.json"), cfg.to_string()).unwrap();
    candle_core::safetensors::save(deq, st.join("model.safetensors")).unwrap();
    std::fs::write(st.join("tokenizer.json"), tokenizer.to_string()).unwrap();
    std::fs::write(
        st.join("tokenizer_config.json"),
        tokenizer_config.to_string(),
    )
    .unwrap();
}

/// The tiny Qwen vocabulary as tokenizer.json.
fn tiny_qwen_tokenizer_json() -> serde_json::Value {
    let (tokens, types, merges) = tiny_vocab();
    let tokens: Vec<&str> = tokens.iter().map(String::as_str).collect();
    let types: Vec<i64> = types.iter().map(|t| i64::from(*t)).collect();
    let merges: Vec<&str> = merges.iter().map(String::as_str).collect();
    tokenizer_json_from_vocab(&tokens, Some(&types), &merges).unwrap()
}

/// A tiny Qwen GGUF of `spec` (and, when `st_dir` is given, the same dequantized model as
/// a safetensors directory with the same tokenizer).
fn qwen_gguf(dir: &Path, spec: &TinySpec, st_dir: Option<&Path>) -> PathBuf {
    let (q, deq) = quantized(spec);
    let path = dir.join(format!("tiny-{}-q.gguf", spec.family));
    write_gguf(&path, &metadata(spec), &q);
    if let Some(st) = st_dir {
        let tc = serde_json::json!({
            "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
            "chat_template": qwen_template(spec.family),
        });
        let ids = serde_json::json!({"eos_token_id": IM_END, "bos_token_id": ENDOFTEXT});
        write_safetensors(st, spec, &deq, ids, &tiny_qwen_tokenizer_json(), tc);
    }
    path
}

/// The tiny qwen2 GGUF (see [`qwen_gguf`]).
fn tiny_gguf(dir: &Path, tie: bool, st_dir: Option<&Path>) -> PathBuf {
    qwen_gguf(dir, &spec(tie), st_dir)
}

fn err_of<T>(r: anyhow::Result<T>) -> String {
    match r {
        Ok(_) => panic!("expected an error"),
        Err(e) => format!("{e:#}"),
    }
}

fn messages() -> Vec<Message> {
    vec![
        Message {
            role: "system".into(),
            content: "You are a terse assistant.".into(),
        },
        Message {
            role: "user".into(),
            content: "Say hi in JSON, then explain why the sky is blue.".into(),
        },
    ]
}

const COMPLETION: &str = "{\"hi\": true} The sky is blue because of Rayleigh scattering.";

fn f32_model(path: &Path) -> LoadedModel {
    let spec = ModelSpec {
        dtype: Some(DType::F32),
        ..ModelSpec::new(path.to_str().unwrap(), Device::Cpu)
    };
    load_model(&spec).unwrap()
}

/// Prompt ids, completion ids and log-probs of [`COMPLETION`] after [`messages`].
fn score(m: &LoadedModel) -> (Vec<u32>, Vec<u32>, Vec<f32>) {
    let s = score_completion(m, &messages(), COMPLETION).unwrap();
    (s.prompt_ids, s.completion_ids, s.logprobs)
}

/// Both models tokenize alike; the largest |Δ log-prob|.
fn logprob_gap(a: &LoadedModel, b: &LoadedModel) -> f32 {
    let (pa, ca, la) = score(a);
    let (pb, cb, lb) = score(b);
    assert_eq!(pa, pb, "prompt ids");
    assert_eq!(ca, cb, "completion ids");
    assert!(!la.is_empty());
    assert_eq!(la.len(), lb.len());
    la.iter()
        .zip(&lb)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max)
}

/// Every loaded tensor is exactly the expected one (and there are no others).
fn assert_weights_equal(weights: &HashMap<String, Tensor>, want: &HashMap<String, Tensor>) {
    assert_eq!(weights.len(), want.len());
    for (name, t) in want {
        assert_eq!(crate::util::max_abs_diff(&weights[name], t), 0.0, "{name}");
    }
}

#[test]
fn gguf_logprobs_equal_the_dequantized_safetensors_model() {
    let tmp = tempfile::tempdir().unwrap();
    for tie in [false, true] {
        let st = tmp.path().join(format!("st-{tie}"));
        let gguf = tiny_gguf(tmp.path(), tie, Some(&st));
        let a = f32_model(&gguf);
        let b = f32_model(&st);
        assert_eq!(a.config, b.config, "tie={tie}");
        assert_eq!(a.config.tie_word_embeddings, tie);
        assert_eq!(a.config.vocab_size, VOCAB);
        assert_eq!(a.config.rope_theta, 1e6);
        let (pa, _, _) = score(&a);
        assert!(pa.contains(&IM_START) && pa.contains(&IM_END));
        let max = logprob_gap(&a, &b);
        assert!(max <= 1e-6, "tie={tie}: max |Δ logprob| = {max}");
        let tok = a.tokenizer().unwrap();
        assert!(tok.is_stop(IM_END) && tok.is_stop(ENDOFTEXT));
        assert_eq!(a.generation_config.eos_token_ids, vec![IM_END]);
    }
}

#[test]
fn gguf_weights_are_the_dequantized_tensors_in_the_requested_dtype() {
    let tmp = tempfile::tempdir().unwrap();
    let gguf = tiny_gguf(tmp.path(), false, None);
    let (_, deq) = quantized(&spec(false));
    let m = load_gguf(&gguf, DType::F32, &Device::Cpu, None).unwrap();
    assert_eq!(m.tokenizer_source, TokenizerSource::Metadata);
    assert_eq!(m.name.as_deref(), Some("tiny"));
    assert_eq!(m.eos_token_ids, vec![IM_END]);
    assert_eq!(m.chat_template.as_deref(), Some(QWEN25_CHAT_TEMPLATE));
    assert_weights_equal(&m.weights, &deq);
    for t in [
        "Q4K", "Q5K", "Q6K", "Q2K", "Q3K", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "F16", "BF16",
        "F32",
    ] {
        assert!(
            m.tensor_types.contains_key(t),
            "{t} in {:?}",
            m.tensor_types
        );
    }
    let h = load_gguf(&gguf, DType::BF16, &Device::Cpu, None).unwrap();
    assert!(h.weights.values().all(|t| t.dtype() == DType::BF16));
}

#[test]
fn gguf_tokenizer_from_metadata_equals_the_bundled_one() {
    let bytes = qwen_tokenizer_json().unwrap();
    let json: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    let bundled = Tokenizer::new(
        tokenizers::Tokenizer::from_bytes(&bytes).unwrap(),
        &serde_json::json!({"eos_token": "<|im_end|>"}),
        Some(QWEN25_CHAT_TEMPLATE.into()),
        &[],
    )
    .unwrap();
    let n = bundled.vocab_size();
    let special: HashMap<u64, bool> = json["added_tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| (t["id"].as_u64().unwrap(), t["special"].as_bool().unwrap()))
        .collect();
    let mut tokens = Vec::with_capacity(n + 3);
    let mut types = Vec::with_capacity(n + 3);
    for id in 0..n as u32 {
        tokens.push(bundled.id_to_token(id).unwrap());
        types.push(match special.get(&u64::from(id)) {
            None => TOKEN_NORMAL,
            Some(true) => TOKEN_CONTROL,
            Some(false) => TOKEN_USER_DEFINED,
        });
    }
    for id in n..n + 3 {
        tokens.push(format!("[PAD{id}]"));
        types.push(TOKEN_UNUSED);
    }
    let merges: Vec<String> = json["model"]["merges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            let p = m.as_array().unwrap();
            format!("{} {}", p[0].as_str().unwrap(), p[1].as_str().unwrap())
        })
        .collect();
    let md = |with_merges: bool, tokens: &[String]| {
        let mut md: HashMap<String, Value> = HashMap::new();
        md.insert("tokenizer.ggml.model".into(), Value::String("gpt2".into()));
        md.insert("tokenizer.ggml.pre".into(), Value::String("qwen2".into()));
        md.insert("tokenizer.ggml.tokens".into(), strings(tokens));
        md.insert(
            "tokenizer.ggml.token_type".into(),
            Value::Array(types.iter().map(|t| Value::I32(*t)).collect()),
        );
        if with_merges {
            md.insert("tokenizer.ggml.merges".into(), strings(&merges));
        }
        md.insert("tokenizer.ggml.eos_token_id".into(), Value::U32(151_645));
        md.insert(
            "tokenizer.chat_template".into(),
            Value::String(QWEN25_CHAT_TEMPLATE.into()),
        );
        md
    };
    let texts = [
        "Hello, world! 12345 the quick brown fox",
        "  leading spaces\n\n\ttabs and\r\nnewlines  ",
        "<|im_start|>user\nWhat's up?<|im_end|>\n<|im_start|>assistant\n",
        "Ünïcödé: naïve café — 日本語のテキスト 🎉🚀 e\u{301}",
        "fn main() { println!(\"{}\", x.len()); } // <tool_call> {\"a\": [1,2]}",
    ];
    let (from_md, source, ids) = tokenizer_from_metadata(&md(true, &tokens)).unwrap();
    assert_eq!(source, TokenizerSource::Metadata);
    assert_eq!(ids.eos, vec![151_645]);
    for t in texts {
        assert_eq!(
            from_md.encode(t).unwrap(),
            bundled.encode(t).unwrap(),
            "{t:?}"
        );
        let ids = from_md.encode(t).unwrap();
        assert_eq!(from_md.decode(&ids).unwrap(), bundled.decode(&ids).unwrap());
    }
    assert_eq!(
        from_md.encode_chat(&messages(), true).unwrap(),
        bundled.encode_chat(&messages(), true).unwrap()
    );
    assert_eq!(from_md.stop_token_ids(), bundled.stop_token_ids());

    // No merges: the bundled tokenizer, because the vocabulary matches.
    let (fallback, source, _) = tokenizer_from_metadata(&md(false, &tokens)).unwrap();
    assert_eq!(source, TokenizerSource::Bundled);
    assert_eq!(
        fallback.encode(texts[3]).unwrap(),
        bundled.encode(texts[3]).unwrap()
    );

    // No merges and a different vocabulary: a named error.
    let mut other = tokens.clone();
    other[1000] = "zzz-not-qwen".into();
    let e = err_of(tokenizer_from_metadata(&md(false, &other)));
    assert!(e.contains("tokenizer.ggml.merges is missing"), "{e}");
    assert!(
        e.contains("does not match the bundled Qwen tokenizer"),
        "{e}"
    );
    assert!(e.contains("id 1000"), "{e}");
}

#[test]
fn gguf_path_is_a_local_model_ref() {
    assert!(matches!(
        ModelRef::parse("models/qwen2.5-q4_k_m.gguf").unwrap(),
        ModelRef::Local(_)
    ));
    let e = err_of(load_checkpoint(
        &ModelRef::parse("no/such/model.gguf").unwrap(),
        None,
        &Device::Cpu,
        None,
    ));
    assert!(e.contains("does not exist"), "{e}");
}

fn load_err(path: &Path) -> String {
    err_of(load_gguf(path, DType::F32, &Device::Cpu, None))
}

#[test]
fn gguf_truncated_file_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let gguf = tiny_gguf(tmp.path(), false, None);
    let bytes = std::fs::read(&gguf).unwrap();
    // Inside the tensor data.
    let cut = tmp.path().join("cut-data.gguf");
    std::fs::write(&cut, &bytes[..bytes.len() - 1000]).unwrap();
    let e = load_err(&cut);
    assert!(e.contains("truncated GGUF file"), "{e}");
    assert!(e.contains("ends at byte"), "{e}");
    // Inside the header (the tokenizer strings).
    let cut = tmp.path().join("cut-header.gguf");
    std::fs::write(&cut, &bytes[..4000]).unwrap();
    let e = load_err(&cut);
    assert!(e.contains("truncated GGUF file"), "{e}");
    // Through the normal loading path too.
    let e = err_of(load_checkpoint(
        &ModelRef::Local(cut.clone()),
        None,
        &Device::Cpu,
        None,
    ));
    assert!(e.contains("truncated GGUF file"), "{e}");
}

/// Issue 54, item 14: a header claiming more tensors than the file can hold is named
/// as that, not as a truncated file; and under `RUST_BACKTRACE=1` the error is still
/// one message, without candle's backtrace.
#[test]
fn gguf_impossible_counts_are_named_without_a_backtrace() {
    let tmp = tempfile::tempdir().unwrap();
    let gguf = tiny_gguf(tmp.path(), false, None);
    let mut bytes = std::fs::read(&gguf).unwrap();
    // magic, version (u32 each), then the tensor count (u64)
    bytes[8..16].copy_from_slice(&(u64::MAX / 2).to_le_bytes());
    let huge = tmp.path().join("huge-count.gguf");
    std::fs::write(&huge, &bytes).unwrap();
    let e = load_err(&huge);
    assert!(e.contains("claims") && e.contains("tensors"), "{e}");
    assert!(!e.contains("truncated"), "{e}");
    let msgs = tmp.path().join("m.json");
    std::fs::write(&msgs, r#"[{"role": "user", "content": "hi"}]"#).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_concord"))
        .args(["generate", "--max-new-tokens=1", "--model"])
        .arg(&huge)
        .arg("--messages")
        .arg(&msgs)
        .env("RUST_BACKTRACE", "1")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("claims"), "{err}");
    assert!(
        !err.contains("stack backtrace") && !err.contains(" at ") && err.lines().count() <= 2,
        "{err}"
    );
}

/// Issue 54, item 7: a RoPE base that is NaN, 0 or -inf (every logit NaN) and a
/// context length of 0 are refused by their GGUF keys.
#[test]
fn gguf_bad_rope_base_and_context_length_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let spec = spec(false);
    let (q, _) = quantized(&spec);
    let cases = [
        ("qwen2.rope.freq_base", Value::F32(f32::NAN)),
        ("qwen2.rope.freq_base", Value::F32(0.0)),
        ("qwen2.rope.freq_base", Value::F32(f32::NEG_INFINITY)),
        ("qwen2.context_length", Value::U32(0)),
    ];
    for (i, (key, v)) in cases.into_iter().enumerate() {
        let mut md = metadata(&spec);
        let at = md.iter().position(|(k, _)| k == key).unwrap();
        md[at].1 = v;
        let path = tmp.path().join(format!("bad{i}.gguf"));
        write_gguf(&path, &md, &q);
        let e = load_err(&path);
        assert!(e.contains(key), "{key}: {e}");
    }
}

#[test]
fn gguf_unsupported_architecture_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let spec = spec(false);
    let (q, _) = quantized(&spec);
    let mut md = metadata(&spec);
    md[0].1 = Value::String("phi3".into());
    let path = tmp.path().join("phi3.gguf");
    write_gguf(&path, &md, &q);
    let e = load_err(&path);
    assert!(e.contains("unsupported GGUF architecture \"phi3\""), "{e}");
    assert!(e.contains("qwen2, qwen3, llama"), "{e}");
}

#[test]
fn gguf_missing_metadata_key_and_tensor_are_named() {
    let tmp = tempfile::tempdir().unwrap();
    let spec = spec(false);
    let (q, _) = quantized(&spec);

    let md: Vec<_> = metadata(&spec)
        .into_iter()
        .filter(|(k, _)| k != "qwen2.block_count")
        .collect();
    let path = tmp.path().join("no-blocks.gguf");
    write_gguf(&path, &md, &q);
    let e = load_err(&path);
    assert!(
        e.contains("GGUF metadata key qwen2.block_count is missing"),
        "{e}"
    );

    let md: Vec<_> = metadata(&spec)
        .into_iter()
        .filter(|(k, _)| k != "general.architecture")
        .collect();
    let path = tmp.path().join("no-arch.gguf");
    write_gguf(&path, &md, &q);
    let e = load_err(&path);
    assert!(e.contains("general.architecture is missing"), "{e}");

    let md: Vec<_> = metadata(&spec)
        .into_iter()
        .filter(|(k, _)| k != "tokenizer.ggml.tokens")
        .collect();
    let path = tmp.path().join("no-tokens.gguf");
    write_gguf(&path, &md, &q);
    let e = load_err(&path);
    assert!(e.contains("tokenizer.ggml.tokens is missing"), "{e}");

    let q2: Vec<_> = q
        .into_iter()
        .filter(|(k, _)| k != "blk.1.ffn_up.weight")
        .collect();
    let path = tmp.path().join("no-up.gguf");
    write_gguf(&path, &metadata(&spec), &q2);
    let e = load_err(&path);
    assert!(e.contains("GGUF tensor blk.1.ffn_up.weight"), "{e}");
    assert!(e.contains("is missing"), "{e}");
}

/// A GGUF v3 header by hand: one tensor of ggml type 20 (IQ4_NL), which candle cannot read.
#[test]
fn gguf_unsupported_tensor_type_is_named() {
    fn s(out: &mut Vec<u8>, x: &str) {
        out.extend((x.len() as u64).to_le_bytes());
        out.extend(x.as_bytes());
    }
    let mut b = Vec::new();
    b.extend(0x4655_4747u32.to_le_bytes());
    b.extend(3u32.to_le_bytes());
    b.extend(2u64.to_le_bytes()); // tensors
    b.extend(1u64.to_le_bytes()); // metadata
    s(&mut b, "general.architecture");
    b.extend(8u32.to_le_bytes());
    s(&mut b, "qwen2");
    for (name, ty) in [("token_embd.weight", 0u32), ("blk.0.ffn_down.weight", 20)] {
        s(&mut b, name);
        b.extend(2u32.to_le_bytes());
        b.extend(32u64.to_le_bytes());
        b.extend(4u64.to_le_bytes());
        b.extend(ty.to_le_bytes());
        b.extend(0u64.to_le_bytes());
    }
    b.resize(b.len().div_ceil(32) * 32 + 4096, 0);
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("iq4.gguf");
    std::fs::write(&path, &b).unwrap();
    let e = load_err(&path);
    assert!(e.contains("unsupported tensor type IQ4_NL"), "{e}");
    assert!(e.contains("blk.0.ffn_down.weight"), "{e}");
}

/// The real model (scripts/fetch_real_model.sh): `cargo test --test tests gguf:: -- --ignored`.
#[test]
#[ignore = "needs .models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf (scripts/fetch_real_model.sh)"]
fn gguf_real_model_loads() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(".models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf");
    let m = load_gguf(&path, DType::F32, &Device::Cpu, None).unwrap();
    let c = &m.config;
    assert_eq!(
        (
            c.vocab_size,
            c.hidden_size,
            c.num_hidden_layers,
            c.intermediate_size
        ),
        (151_936, 896, 24, 4864)
    );
    assert_eq!(
        (c.num_attention_heads, c.num_key_value_heads, c.head_dim),
        (14, 2, 64)
    );
    assert!(!c.tie_word_embeddings, "the real file has output.weight");
    assert_eq!(m.tokenizer_source, TokenizerSource::Metadata);
    assert_eq!(m.eos_token_ids, vec![151_645]);
    let bundled = Tokenizer::new(
        tokenizers::Tokenizer::from_bytes(qwen_tokenizer_json().unwrap()).unwrap(),
        &serde_json::json!({"eos_token": "<|im_end|>"}),
        Some(QWEN25_CHAT_TEMPLATE.into()),
        &[],
    )
    .unwrap();
    assert_eq!(
        m.tokenizer.encode_chat(&messages(), true).unwrap(),
        bundled.encode_chat(&messages(), true).unwrap()
    );
    assert_eq!(
        m.tokenizer.encode(COMPLETION).unwrap(),
        bundled.encode(COMPLETION).unwrap()
    );
}

// ---------------------------------------------------------------------------------------
// qwen3: head_dim != hidden / heads, q/k norms, no biases, no permutation
// ---------------------------------------------------------------------------------------

fn qwen3_spec() -> TinySpec {
    TinySpec {
        family: Family::Qwen3,
        head_dim: Some(128),
        seed: 9,
        ..spec(false)
    }
}

/// The qwen3 file holds Hugging Face's q/k rows as they are: the loader must not
/// un-permute them (the control for llama's un-permutation).
#[test]
fn gguf_qwen3_reads_back_the_hugging_face_tensors_and_logprobs() {
    let tmp = tempfile::tempdir().unwrap();
    let spec = qwen3_spec();
    let st = tmp.path().join("st-qwen3");
    let gguf = qwen_gguf(tmp.path(), &spec, Some(&st));
    let (_, deq) = quantized(&spec);
    assert!(deq.contains_key("model.layers.1.self_attn.k_norm.weight"));
    let m = load_gguf(&gguf, DType::F32, &Device::Cpu, None).unwrap();
    assert_eq!(m.config.family, Family::Qwen3);
    assert_eq!(m.config.head_dim, 128);
    assert_ne!(
        m.config.head_dim,
        m.config.hidden_size / m.config.num_attention_heads
    );
    assert!(!m.config.attention_bias && m.config.rope_scaling.is_none());
    assert_eq!(m.chat_template.as_deref(), Some(QWEN3_CHAT_TEMPLATE));
    assert_weights_equal(&m.weights, &deq);

    let a = f32_model(&gguf);
    let b = f32_model(&st);
    assert_eq!(a.config, b.config);
    assert_eq!(a.config, as_read(&spec));
    let max = logprob_gap(&a, &b);
    assert!(max <= 1e-6, "max |Δ logprob| = {max}");
    let info = load_checkpoint(&ModelRef::Local(gguf), None, &Device::Cpu, None).unwrap();
    assert_eq!(info.info.architectures, vec!["Qwen3ForCausalLM"]);
}

/// What a file written from `spec` reads back as: its architecture with the norm epsilon
/// the GGUF stores (f32).
fn as_read(spec: &TinySpec) -> ArchConfig {
    let c = spec.arch_config();
    ArchConfig {
        rms_norm_eps: f64::from(c.rms_norm_eps as f32),
        ..c
    }
}

// ---------------------------------------------------------------------------------------
// llama (Llama 3.x): q/k permuted by the converter, rope_freqs.weight, Llama 3 tokenizer
// ---------------------------------------------------------------------------------------

/// The tiny Llama vocabulary: Llama 3's first ids, then its first 24 special tokens
/// (`<|begin_of_text|>` … `<|eot_id|>` …) moved down from 128,000 to 1,000.
const L_NORMAL: usize = 1000;
const L_VOCAB: usize = 1024;
const L_SHIFT: u32 = 128_000 - L_NORMAL as u32;
const L_BOS: u32 = 128_000 - L_SHIFT;
const L_END_OF_TEXT: u32 = 128_001 - L_SHIFT;
const L_EOM: u32 = 128_008 - L_SHIFT;
const L_EOT: u32 = 128_009 - L_SHIFT;

fn llama_json() -> &'static serde_json::Value {
    static JSON: OnceLock<serde_json::Value> = OnceLock::new();
    JSON.get_or_init(|| serde_json::from_slice(&tokenizer_json(Family::Llama).unwrap()).unwrap())
}

/// (tokens, types, merges) of Llama 3's tokens below `normal` and its special tokens
/// below `128_000 + specials` (moved to follow them); merges only between kept tokens.
fn llama_vocab(normal: usize, specials: usize) -> (Vec<String>, Vec<i32>, Vec<String>) {
    let json = llama_json();
    let mut tokens = vec![String::new(); normal];
    for (tok, id) in json["model"]["vocab"].as_object().unwrap() {
        let id = id.as_u64().unwrap() as usize;
        if id < normal {
            tokens[id] = tok.clone();
        }
    }
    let kept: std::collections::HashSet<&str> = tokens.iter().map(String::as_str).collect();
    let merges: Vec<String> = json["model"]["merges"]
        .as_array()
        .unwrap()
        .iter()
        .map(merge_string)
        .filter(|m| {
            let (a, b) = m.split_once(' ').unwrap();
            kept.contains(a) && kept.contains(b) && kept.contains(format!("{a}{b}").as_str())
        })
        .collect();
    let mut types = vec![TOKEN_NORMAL; normal];
    for t in json["added_tokens"].as_array().unwrap() {
        if t["id"].as_u64().unwrap() < 128_000 + specials as u64 {
            tokens.push(t["content"].as_str().unwrap().to_string());
            types.push(TOKEN_CONTROL);
        }
    }
    assert_eq!(tokens.len(), normal + specials);
    (tokens, types, merges)
}

fn llama3_rope() -> Llama3Rope {
    Llama3Rope {
        factor: 8.0,
        low_freq_factor: 1.0,
        high_freq_factor: 4.0,
        original_max_position_embeddings: 8192,
    }
}

/// Llama 3 at hidden 256, 4 query / 2 key-value heads of 64, RoPE base 5e5 (from
/// Llama 3.2) scaled by 8 / 1 / 4 / 8192: its 32 frequencies fall in all three bands.
/// Untied: the tiny tied embedding gives log-probs near -50, where f32 steps are 4e-6,
/// too coarse for the 1e-5 agreement the RoPE test asks.
fn llama_spec() -> TinySpec {
    TinySpec {
        family: Family::Llama,
        vocab: Some(L_VOCAB),
        rope_scaling: Some(llama3_rope()),
        seed: 11,
        ..spec(false)
    }
}

/// `rope_freqs.weight` as convert_hf_to_gguf's `LlamaModel` computes it: f32 frequencies
/// (torch), the rest in Python floats.
fn converter_rope_factors(c: &ArchConfig, s: &Llama3Rope) -> Vec<f32> {
    let d = c.head_dim;
    let base = c.rope_theta as f32;
    let orig = s.original_max_position_embeddings as f64;
    let (low, high) = (s.low_freq_factor, s.high_freq_factor);
    (0..d / 2)
        .map(|i| {
            let freq = 1.0f32 / base.powf((2 * i) as f32 / d as f32);
            let wavelen = 2.0 * std::f64::consts::PI / f64::from(freq);
            let f = if wavelen < orig / high {
                1.0
            } else if wavelen > orig / low {
                s.factor
            } else {
                let smooth = (orig / wavelen - low) / (high - low);
                1.0 / ((1.0 - smooth) / s.factor + smooth)
            };
            f as f32
        })
        .collect()
}

/// The tiny Llama GGUF's metadata (no `add_bos_token`: llama-bpe adds BOS by default).
fn llama_metadata(spec: &TinySpec) -> Vec<(String, Value)> {
    let (tokens, types, merges) = llama_vocab(L_NORMAL, L_VOCAB - L_NORMAL);
    let mut md = arch_metadata(&spec.arch_config());
    md.extend([
        kv("tokenizer.ggml.model", Value::String("gpt2".into())),
        kv("tokenizer.ggml.pre", Value::String("llama-bpe".into())),
        kv("tokenizer.ggml.tokens", strings(&tokens)),
        kv(
            "tokenizer.ggml.token_type",
            Value::Array(types.into_iter().map(Value::I32).collect()),
        ),
        kv("tokenizer.ggml.merges", strings(&merges)),
        kv("tokenizer.ggml.bos_token_id", Value::U32(L_BOS)),
        kv("tokenizer.ggml.eos_token_id", Value::U32(L_EOT)),
        kv(
            "tokenizer.chat_template",
            Value::String(LLAMA3_CHAT_TEMPLATE.into()),
        ),
    ]);
    md
}

/// A tiny Llama GGUF (q/k permuted unless `permute` is false; `edit` may change the
/// metadata and tensors first): its path, the Hugging Face tensors dequantized, and the
/// RoPE factors it holds.
fn llama_gguf(
    dir: &Path,
    name: &str,
    permute: bool,
    edit: impl FnOnce(&mut Vec<(String, Value)>, &mut Vec<(String, QTensor)>),
) -> (PathBuf, HashMap<String, Tensor>, Vec<f32>) {
    let spec = llama_spec();
    let (mut q, deq) = quantized_as(&spec, permute);
    let factors = converter_rope_factors(&spec.arch_config(), &llama3_rope());
    let t = Tensor::new(factors.as_slice(), &Device::Cpu).unwrap();
    q.push((
        "rope_freqs.weight".into(),
        QTensor::quantize(&t, GgmlDType::F32).unwrap(),
    ));
    let mut md = llama_metadata(&spec);
    edit(&mut md, &mut q);
    let path = dir.join(name);
    write_gguf(&path, &md, &q);
    (path, deq, factors)
}

#[test]
fn gguf_llama_reads_back_the_hugging_face_tensors_and_config() {
    let tmp = tempfile::tempdir().unwrap();
    let (gguf, deq, factors) = llama_gguf(tmp.path(), "llama.gguf", true, |_, _| {});
    // All three bands of the converter's rule occur.
    assert!(factors.contains(&1.0) && factors.contains(&8.0));
    assert!(factors.iter().any(|f| *f > 1.0 && *f < 8.0), "{factors:?}");

    let m = load_gguf(&gguf, DType::F32, &Device::Cpu, None).unwrap();
    assert_weights_equal(&m.weights, &deq);
    let want = ArchConfig {
        rope_scaling: Some(RopeScaling::Factors(factors)),
        ..as_read(&llama_spec())
    };
    assert_eq!(m.config, want);
    assert_eq!(
        (m.config.num_attention_heads, m.config.num_key_value_heads),
        (4, 2)
    );
    assert_eq!((m.config.rope_theta, m.config.head_dim), (5e5, 64));
    assert_eq!(m.tokenizer_source, TokenizerSource::Metadata);
    assert_eq!(m.bos_token_id, Some(L_BOS));
    assert_eq!(m.eos_token_ids, vec![L_EOT, L_END_OF_TEXT, L_EOM]);

    // Read as stored (no permutation written), q and k come back in the wrong row order.
    let (plain, _, _) = llama_gguf(tmp.path(), "unpermuted.gguf", false, |_, _| {});
    let p = load_gguf(&plain, DType::F32, &Device::Cpu, None).unwrap();
    for (name, t) in &deq {
        let same = max_abs_diff(&p.weights[name], t) == 0.0;
        let permuted = name.contains(".q_proj.") || name.contains(".k_proj.");
        assert_eq!(same, !permuted, "{name}");
    }
}

/// The same weights as a safetensors directory with config.json's `rope_scaling`
/// (`llama3`, 8 / 1 / 4 / 8192) and the tiny vocabulary's tokenizer files.
fn llama_safetensors(st: &Path, spec: &TinySpec, deq: &HashMap<String, Tensor>) {
    let (tokens, types, merges) = llama_vocab(L_NORMAL, L_VOCAB - L_NORMAL);
    let tokens: Vec<&str> = tokens.iter().map(String::as_str).collect();
    let types: Vec<i64> = types.iter().map(|t| i64::from(*t)).collect();
    let merges: Vec<&str> = merges.iter().map(String::as_str).collect();
    let bos = Some((L_BOS, "<|begin_of_text|>"));
    let tj = bpe_tokenizer_json(PreTokenizer::Llama3, &tokens, Some(&types), &merges, bos);
    let tc = serde_json::json!({
        "bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>",
        "chat_template": LLAMA3_CHAT_TEMPLATE,
    });
    let ids = serde_json::json!({
        "bos_token_id": L_BOS, "eos_token_id": [L_END_OF_TEXT, L_EOM, L_EOT],
    });
    write_safetensors(st, spec, deq, ids, &tj.unwrap(), tc);
}

#[test]
fn gguf_llama_rope_factors_give_the_logprobs_of_the_llama3_config() {
    let tmp = tempfile::tempdir().unwrap();
    let (gguf, deq, _) = llama_gguf(tmp.path(), "llama.gguf", true, |_, _| {});
    let st = tmp.path().join("st-llama");
    llama_safetensors(&st, &llama_spec(), &deq);
    let a = f32_model(&gguf);
    let b = f32_model(&st);
    assert!(matches!(
        a.config.rope_scaling,
        Some(RopeScaling::Factors(_))
    ));
    assert_eq!(
        b.config.rope_scaling,
        Some(RopeScaling::Llama3(llama3_rope()))
    );
    let strip = |c: &ArchConfig| ArchConfig {
        rope_scaling: None,
        ..c.clone()
    };
    assert_eq!(strip(&a.config), strip(&b.config));
    let (pa, _, _) = score(&a);
    assert_eq!(pa[0], L_BOS, "the template's bos_token");
    assert_eq!(pa.iter().filter(|t| **t == L_BOS).count(), 1);
    assert!(pa.contains(&L_EOT));
    let max = logprob_gap(&a, &b);
    assert!(max <= 1e-5, "max |Δ logprob| = {max}");
    // Without the scaling the same prompt scores measurably differently.
    let unscaled = TinySpec {
        rope_scaling: None,
        ..llama_spec()
    };
    let plain = tmp.path().join("st-llama-unscaled");
    llama_safetensors(&plain, &unscaled, &deq);
    let off = logprob_gap(&a, &f32_model(&plain));
    assert!(off > 1e-3, "unscaled RoPE differs by only {off}");
    let tok = a.tokenizer().unwrap();
    for id in [L_END_OF_TEXT, L_EOM, L_EOT] {
        assert!(tok.is_stop(id), "{id}");
    }
    let info = load_checkpoint(&ModelRef::Local(gguf), None, &Device::Cpu, None).unwrap();
    assert_eq!(info.info.architectures, vec!["LlamaForCausalLM"]);
    assert_eq!(
        info.generation_config.eos_token_ids,
        vec![L_EOT, L_END_OF_TEXT, L_EOM]
    );
}

#[test]
fn gguf_llama_metadata_and_rope_freqs_errors_are_named() {
    let tmp = tempfile::tempdir().unwrap();
    type Edit = Box<dyn FnOnce(&mut Vec<(String, Value)>, &mut Vec<(String, QTensor)>)>;
    let set = |key: &'static str, v: Value| -> Edit {
        Box::new(move |md, _| {
            md.retain(|(k, _)| k != key);
            md.push(kv(key, v));
        })
    };
    let freqs = |vals: Vec<f32>| -> Edit {
        Box::new(move |_, q| {
            let t = Tensor::new(vals.as_slice(), &Device::Cpu).unwrap();
            q.retain(|(k, _)| k != "rope_freqs.weight");
            q.push((
                "rope_freqs.weight".into(),
                QTensor::quantize(&t, GgmlDType::F32).unwrap(),
            ));
        })
    };
    let mut zero = vec![1.0f32; 32];
    zero[3] = 0.0;
    let cases: Vec<(&str, Edit, &str)> = vec![
        (
            "short-freqs",
            freqs(vec![1.0; 16]),
            "rope_freqs.weight has shape [16]",
        ),
        ("zero-freqs", freqs(zero), "must be positive"),
        (
            "vocab",
            set("llama.vocab_size", Value::U32(1000)),
            "llama.vocab_size = 1000",
        ),
        (
            "partial",
            set("llama.rope.dimension_count", Value::U32(32)),
            "partial rotary",
        ),
        (
            "yarn",
            set("llama.rope.scaling.type", Value::String("yarn".into())),
            "RoPE scaling \"yarn\"",
        ),
        (
            "spm",
            set("tokenizer.ggml.model", Value::String("llama".into())),
            "SentencePiece",
        ),
    ];
    for (name, edit, want) in cases {
        let (path, _, _) = llama_gguf(tmp.path(), &format!("{name}.gguf"), true, edit);
        let e = load_err(&path);
        assert!(e.contains(want), "{name}: {e}");
    }
}

#[test]
fn gguf_qwen3_value_length_must_equal_key_length() {
    let tmp = tempfile::tempdir().unwrap();
    let spec = qwen3_spec();
    let (q, _) = quantized(&spec);
    let mut md = metadata(&spec);
    md.retain(|(k, _)| k != "qwen3.attention.value_length");
    md.push(kv("qwen3.attention.value_length", Value::U32(64)));
    let path = tmp.path().join("vlen.gguf");
    write_gguf(&path, &md, &q);
    let e = load_err(&path);
    assert!(e.contains("qwen3.attention.value_length = 64"), "{e}");
}

/// GGUF tokenizer metadata of the whole Llama 3 vocabulary (as llama.cpp's converter
/// writes it), built back, against the bundled Llama 3 tokenizer.json.
#[test]
fn gguf_llama3_tokenizer_from_metadata_equals_the_bundled_one() {
    let (tokens, types, merges) = llama_vocab(128_000, 256);
    let real = llama_json();
    let bytes = tokenizer_json(Family::Llama).unwrap();
    let bundled = Tokenizer::new(
        tokenizers::Tokenizer::from_bytes(&bytes).unwrap(),
        &tokenizer_config_json(Family::Llama, &bytes).unwrap(),
        Some(LLAMA3_CHAT_TEMPLATE.into()),
        &[128_001, 128_008, 128_009],
    )
    .unwrap();

    // The built tokenizer.json has the real one's shape around the vocabulary.
    let t: Vec<&str> = tokens.iter().map(String::as_str).collect();
    let ty: Vec<i64> = types.iter().map(|x| i64::from(*x)).collect();
    let m: Vec<&str> = merges.iter().map(String::as_str).collect();
    let bos = Some((128_000, "<|begin_of_text|>"));
    let built = bpe_tokenizer_json(PreTokenizer::Llama3, &t, Some(&ty), &m, bos).unwrap();
    for key in ["normalizer", "pre_tokenizer", "post_processor", "decoder"] {
        assert_eq!(built[key], real[key], "{key}");
    }
    assert_eq!(
        built["model"]["ignore_merges"],
        real["model"]["ignore_merges"]
    );
    assert_eq!(built["model"]["merges"].as_array().unwrap().len(), 280_147);

    let md = |with_merges: bool, pre: Option<&str>| {
        let mut md: HashMap<String, Value> = HashMap::new();
        md.insert("general.architecture".into(), Value::String("llama".into()));
        md.insert("tokenizer.ggml.model".into(), Value::String("gpt2".into()));
        if let Some(p) = pre {
            md.insert("tokenizer.ggml.pre".into(), Value::String(p.into()));
        }
        md.insert("tokenizer.ggml.tokens".into(), strings(&tokens));
        md.insert(
            "tokenizer.ggml.token_type".into(),
            Value::Array(types.iter().map(|t| Value::I32(*t)).collect()),
        );
        if with_merges {
            md.insert("tokenizer.ggml.merges".into(), strings(&merges));
        }
        md.insert("tokenizer.ggml.bos_token_id".into(), Value::U32(128_000));
        md.insert("tokenizer.ggml.eos_token_id".into(), Value::U32(128_009));
        md.insert(
            "tokenizer.chat_template".into(),
            Value::String(LLAMA3_CHAT_TEMPLATE.into()),
        );
        md
    };
    let texts = [
        "12345 and 1234567 cost $3.50, 2024-07-26",
        "DON'T stop, I'M sure we'LL win; it's they've",
        "  leading spaces\n\n\ttabs and\r\nnewlines  \n",
        "emoji 🎉🚀👍🏽 and Ünïcödé: naïve café — 日本語のテキスト e\u{301}",
        "<|start_header_id|>user<|end_header_id|>\n\nWhat's up?<|eot_id|>",
        "fn main() { println!(\"{}\", x.len()); } // {\"a\": [1,2]}",
    ];
    for pre in [Some("llama-bpe"), Some("llama3"), None] {
        let (from_md, source, ids) = tokenizer_from_metadata(&md(true, pre)).unwrap();
        assert_eq!(source, TokenizerSource::Metadata, "{pre:?}");
        assert_eq!(ids.eos, vec![128_009, 128_001, 128_008]);
        for t in texts {
            let got = from_md.encode(t).unwrap();
            assert_eq!(got, bundled.encode(t).unwrap(), "{pre:?}: {t:?}");
            assert_eq!(from_md.decode(&got).unwrap(), bundled.decode(&got).unwrap());
        }
        let chat = from_md.encode_chat(&messages(), true).unwrap();
        assert_eq!(chat, bundled.encode_chat(&messages(), true).unwrap());
        assert_eq!(chat[0], 128_000);
        assert_eq!(from_md.stop_token_ids(), bundled.stop_token_ids());
    }

    // No merges: the bundled Llama 3 tokenizer, because the vocabulary matches.
    let (fallback, source, _) = tokenizer_from_metadata(&md(false, Some("llama-bpe"))).unwrap();
    assert_eq!(source, TokenizerSource::Bundled);
    assert_eq!(
        fallback.encode(texts[1]).unwrap(),
        bundled.encode(texts[1]).unwrap()
    );
}

// ---------------------------------------------------------------------------------------
// A quantized base (`base_dtype = "gguf"`): the file's blocks, kept

/// The bytes of each Hugging Face tensor quantized in its [`qtype`] (Hugging Face row
/// order). Every block is one row (hidden 256; MLP 512 is two blocks of one row), so
/// these are also the converter's blocks with Llama's q/k rows un-permuted.
fn hf_blocks(spec: &TinySpec) -> HashMap<String, (GgmlDType, Vec<u8>)> {
    spec.tensor_shapes()
        .into_iter()
        .map(|(hf, shape)| {
            let vals = tensor_values(spec, &hf, &shape);
            let t = Tensor::from_vec(vals, shape.as_slice(), &Device::Cpu).unwrap();
            let q = QTensor::quantize(&t, qtype(&hf)).unwrap();
            (hf, (q.dtype(), q.data().unwrap().to_vec()))
        })
        .collect()
}

#[test]
fn gguf_base_keeps_the_files_blocks_bit_for_bit() {
    let tmp = tempfile::tempdir().unwrap();
    let (llama, _, _) = llama_gguf(tmp.path(), "llama.gguf", true, |_, _| {});
    let (untied, tied) = (tmp.path().join("untied"), tmp.path().join("tied"));
    std::fs::create_dir_all(&untied).unwrap();
    std::fs::create_dir_all(&tied).unwrap();
    for (path, spec) in [
        (tiny_gguf(&untied, false, None), spec(false)),
        (tiny_gguf(&tied, true, None), spec(true)),
        (llama, llama_spec()),
    ] {
        let want = hf_blocks(&spec);
        let m = load_gguf(&path, DType::F32, &Device::Cpu, Some(QuantMode::Gguf)).unwrap();
        // 2 layers x 7 projections + the head; a tied head is token_embd's blocks.
        assert_eq!(m.quant.len(), 15, "{}", spec.family);
        for (hf, q) in &m.quant {
            let src = if hf == "lm_head.weight" && spec.tie {
                "model.embed_tokens.weight"
            } else {
                hf.as_str()
            };
            let (ty, bytes) = &want[src];
            assert_eq!(q.dtype(), *ty, "{hf}");
            assert!(
                q.bytes().unwrap().as_ref() == bytes.as_slice(),
                "{hf}: blocks changed"
            );
            assert!(!m.weights.contains_key(hf), "{hf} also dense");
        }
        // The embedding, norms (and nothing else) stay dense.
        assert!(m.weights.contains_key("model.embed_tokens.weight"));
        assert!(m.weights.keys().all(|k| !k.ends_with("_proj.weight")));
    }
}

#[test]
fn gguf_base_scores_like_the_dequantized_model() {
    let tmp = tempfile::tempdir().unwrap();
    let gguf = tiny_gguf(tmp.path(), false, None);
    let dense = f32_model(&gguf);
    let quant = load_model(&ModelSpec {
        dtype: Some(DType::F32),
        base_dtype: Some(BaseDtype::Quant(QuantMode::Gguf)),
        ..ModelSpec::new(gguf.to_str().unwrap(), Device::Cpu)
    })
    .unwrap();
    assert!(quant.model.has_quantized_base());
    let gap = logprob_gap(&dense, &quant);
    assert!(gap < 1e-4, "max |Δ logprob| = {gap}");
    // q4_k requantizes what is not Q4_K (Q6_K for the head): a different model, close.
    let q4 = load_model(&ModelSpec {
        dtype: Some(DType::F32),
        base_dtype: Some(BaseDtype::Quant(QuantMode::Q4K)),
        ..ModelSpec::new(gguf.to_str().unwrap(), Device::Cpu)
    })
    .unwrap();
    let types: Vec<String> = q4
        .model
        .base_storage()
        .into_iter()
        .map(|(t, _, _)| t)
        .collect();
    assert_eq!(types, ["q4_k", "q6_k"]);
    let gap = logprob_gap(&dense, &q4);
    assert!(gap > 1e-4 && gap < 0.5, "q4_k: max |Δ logprob| = {gap}");
}

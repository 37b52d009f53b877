//! GGUF loading: a tiny qwen2 GGUF written here (mixed quantisations, a tiny byte-level BPE
//! vocabulary in the metadata) must give the same log-probs as the same dequantized
//! weights loaded from a safetensors directory; the metadata tokenizer must equal the
//! bundled Qwen tokenizer on the full vocabulary; named errors for a truncated file, a
//! non-qwen2 architecture, an unsupported tensor type, a missing key and a missing tensor.
use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Device, Tensor};
use concord::chat::Message;
use concord::model::gguf::{
    gguf_tensor_name, load_gguf, tokenizer_from_metadata, tokenizer_json_from_vocab,
    TokenizerSource, TOKEN_CONTROL, TOKEN_NORMAL, TOKEN_UNUSED, TOKEN_USER_DEFINED,
};
use concord::model::load::{load_checkpoint, load_model, ModelRef, ModelSpec};
use concord::model::score::score_completion;
use concord::model::tiny::{qwen_tokenizer_json, tensor_values, TinySpec, QWEN25_CHAT_TEMPLATE};
use concord::model::tokenizer::Tokenizer;

const VOCAB: usize = 512;
/// Ids below this are the bundled tokenizer's first byte-level tokens (256 bytes + the
/// first merges, whose results take ids 256, 257, ... in merge order).
const NORMAL: usize = 506;
const ENDOFTEXT: u32 = 509;
const IM_START: u32 = 510;
const IM_END: u32 = 511;

/// hidden 256 / MLP 512 so every K-quant (256-element blocks) applies to every matrix.
fn spec(tie: bool) -> TinySpec {
    TinySpec {
        hidden: 256,
        layers: 2,
        heads: 4,
        kv_heads: 2,
        intermediate: 512,
        vocab: VOCAB,
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
        .map(|m| {
            let p = m.as_array().unwrap();
            format!("{} {}", p[0].as_str().unwrap(), p[1].as_str().unwrap())
        })
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

fn strings(v: &[String]) -> Value {
    Value::Array(v.iter().map(|s| Value::String(s.clone())).collect())
}

/// Metadata of the tiny model; `edit` may change or drop entries.
fn metadata(spec: &TinySpec) -> Vec<(String, Value)> {
    let (tokens, types, merges) = tiny_vocab();
    vec![
        ("general.architecture".into(), Value::String("qwen2".into())),
        ("general.name".into(), Value::String("tiny".into())),
        ("qwen2.block_count".into(), Value::U32(spec.layers as u32)),
        ("qwen2.context_length".into(), Value::U32(32768)),
        (
            "qwen2.embedding_length".into(),
            Value::U32(spec.hidden as u32),
        ),
        (
            "qwen2.feed_forward_length".into(),
            Value::U32(spec.intermediate as u32),
        ),
        (
            "qwen2.attention.head_count".into(),
            Value::U32(spec.heads as u32),
        ),
        (
            "qwen2.attention.head_count_kv".into(),
            Value::U32(spec.kv_heads as u32),
        ),
        ("qwen2.rope.freq_base".into(), Value::F32(1e6)),
        (
            "qwen2.attention.layer_norm_rms_epsilon".into(),
            Value::F32(1e-6),
        ),
        ("tokenizer.ggml.model".into(), Value::String("gpt2".into())),
        ("tokenizer.ggml.pre".into(), Value::String("qwen2".into())),
        ("tokenizer.ggml.tokens".into(), strings(&tokens)),
        (
            "tokenizer.ggml.token_type".into(),
            Value::Array(types.into_iter().map(Value::I32).collect()),
        ),
        ("tokenizer.ggml.merges".into(), strings(&merges)),
        ("tokenizer.ggml.eos_token_id".into(), Value::U32(IM_END)),
        (
            "tokenizer.ggml.padding_token_id".into(),
            Value::U32(ENDOFTEXT),
        ),
        ("tokenizer.ggml.bos_token_id".into(), Value::U32(ENDOFTEXT)),
        ("tokenizer.ggml.add_bos_token".into(), Value::Bool(false)),
        (
            "tokenizer.chat_template".into(),
            Value::String(QWEN25_CHAT_TEMPLATE.into()),
        ),
    ]
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

/// Quantized tensors by GGUF name, and the same values dequantized by HF name.
fn quantized(spec: &TinySpec) -> (Vec<(String, QTensor)>, HashMap<String, Tensor>) {
    let mut q = Vec::new();
    let mut deq = HashMap::new();
    for (hf, shape) in spec.tensor_shapes() {
        let vals = tensor_values(spec, &hf, &shape);
        let t = Tensor::from_vec(vals, shape.as_slice(), &Device::Cpu).unwrap();
        let qt = QTensor::quantize(&t, qtype(&hf)).unwrap();
        deq.insert(hf.clone(), qt.dequantize(&Device::Cpu).unwrap());
        q.push((gguf_tensor_name(&hf).unwrap(), qt));
    }
    (q, deq)
}

fn write_gguf(path: &Path, md: &[(String, Value)], tensors: &[(String, QTensor)]) {
    let mut f = std::fs::File::create(path).unwrap();
    let md: Vec<(&str, &Value)> = md.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let ts: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    gguf_file::write(&mut f, &md, &ts).unwrap();
}

/// The tiny GGUF (and, when `st_dir` is given, the same dequantized model as a safetensors
/// directory with the same tokenizer).
fn tiny_gguf(dir: &Path, tie: bool, st_dir: Option<&Path>) -> PathBuf {
    let spec = spec(tie);
    let (q, deq) = quantized(&spec);
    let path = dir.join("tiny-q.gguf");
    write_gguf(&path, &metadata(&spec), &q);
    if let Some(st) = st_dir {
        std::fs::create_dir_all(st).unwrap();
        let mut cfg = spec.config_json();
        // The values the GGUF holds (f32).
        cfg["rms_norm_eps"] = serde_json::json!(f64::from(1e-6f32));
        cfg["eos_token_id"] = serde_json::json!(IM_END);
        cfg["bos_token_id"] = serde_json::json!(ENDOFTEXT);
        std::fs::write(st.join("config.json"), cfg.to_string()).unwrap();
        candle_core::safetensors::save(&deq, st.join("model.safetensors")).unwrap();
        let (tokens, types, merges) = tiny_vocab();
        let tokens: Vec<&str> = tokens.iter().map(String::as_str).collect();
        let types: Vec<i64> = types.iter().map(|t| i64::from(*t)).collect();
        let merges: Vec<&str> = merges.iter().map(String::as_str).collect();
        let tj = tokenizer_json_from_vocab(&tokens, Some(&types), &merges).unwrap();
        std::fs::write(st.join("tokenizer.json"), tj.to_string()).unwrap();
        let tc = serde_json::json!({
            "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
            "chat_template": QWEN25_CHAT_TEMPLATE,
        });
        std::fs::write(st.join("tokenizer_config.json"), tc.to_string()).unwrap();
    }
    path
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

#[test]
fn gguf_logprobs_equal_the_dequantized_safetensors_model() {
    let tmp = tempfile::tempdir().unwrap();
    for tie in [false, true] {
        let st = tmp.path().join(format!("st-{tie}"));
        let gguf = tiny_gguf(tmp.path(), tie, Some(&st));
        let spec = |name: &str| ModelSpec {
            dtype: Some(DType::F32),
            ..ModelSpec::new(name, Device::Cpu)
        };
        let a = load_model(&spec(gguf.to_str().unwrap())).unwrap();
        let b = load_model(&spec(st.to_str().unwrap())).unwrap();
        assert_eq!(a.config, b.config, "tie={tie}");
        assert_eq!(a.config.tie_word_embeddings, tie);
        assert_eq!(a.config.vocab_size, VOCAB);
        assert_eq!(a.config.rope_theta, 1e6);
        let score = |m| {
            let s = score_completion(m, &messages(), COMPLETION).unwrap();
            (s.prompt_ids, s.completion_ids, s.logprobs)
        };
        let (pa, ca, la) = score(&a);
        let (pb, cb, lb) = score(&b);
        assert_eq!(pa, pb, "prompt ids");
        assert_eq!(ca, cb, "completion ids");
        assert!(pa.contains(&IM_START) && pa.contains(&IM_END));
        assert!(!la.is_empty());
        let max = la
            .iter()
            .zip(&lb)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max);
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
    let m = load_gguf(&gguf, DType::F32, &Device::Cpu).unwrap();
    assert_eq!(m.tokenizer_source, TokenizerSource::Metadata);
    assert_eq!(m.name.as_deref(), Some("tiny"));
    assert_eq!(m.eos_token_ids, vec![IM_END]);
    assert_eq!(m.chat_template.as_deref(), Some(QWEN25_CHAT_TEMPLATE));
    assert_eq!(m.weights.len(), deq.len());
    for (name, t) in &deq {
        let w = &m.weights[name];
        let d = (w - t)
            .unwrap()
            .abs()
            .unwrap()
            .flatten_all()
            .unwrap()
            .max(0)
            .unwrap();
        assert_eq!(d.to_scalar::<f32>().unwrap(), 0.0, "{name}");
    }
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
    let h = load_gguf(&gguf, DType::BF16, &Device::Cpu).unwrap();
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
    ));
    assert!(e.contains("does not exist"), "{e}");
}

fn load_err(path: &Path) -> String {
    err_of(load_gguf(path, DType::F32, &Device::Cpu))
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
    ));
    assert!(e.contains("truncated GGUF file"), "{e}");
}

#[test]
fn gguf_non_qwen2_architecture_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let spec = spec(false);
    let (q, _) = quantized(&spec);
    let mut md = metadata(&spec);
    md[0].1 = Value::String("llama".into());
    let path = tmp.path().join("llama.gguf");
    write_gguf(&path, &md, &q);
    let e = load_err(&path);
    assert!(e.contains("unsupported GGUF architecture \"llama\""), "{e}");
    assert!(e.contains("qwen2"), "{e}");
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
    let m = load_gguf(&path, DType::F32, &Device::Cpu).unwrap();
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

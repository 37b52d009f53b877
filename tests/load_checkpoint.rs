//! Checkpoint loading: the tiny model writer, both config.json dialects, sharded weights,
//! tied heads, dtypes, the Hub cache (offline), and every documented error.
use std::path::Path;

use crate::util::max_abs_diff;
use candle_core::{DType, Device};
use concord::chat::Message;
use concord::model::load::{self, load_checkpoint, ModelRef};
use concord::model::tiny::{init_tiny, TinyDType, TinySpec};
use concord::model::tokenizer::Tokenizer;

fn tiny(dir: &Path, spec: &TinySpec) {
    init_tiny(spec, dir).expect("init_tiny");
}

fn local(dir: &Path) -> ModelRef {
    ModelRef::Local(dir.to_path_buf())
}

fn err_of<T>(r: anyhow::Result<T>) -> String {
    match r {
        Ok(_) => panic!("expected an error"),
        Err(e) => format!("{e:#}"),
    }
}

fn edit_json(path: &Path, f: impl FnOnce(&mut serde_json::Value)) {
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    f(&mut v);
    std::fs::write(path, serde_json::to_string_pretty(&v).unwrap()).unwrap();
}

#[test]
fn tiny_model_loads_with_expected_tensors() {
    let dir = tempfile::tempdir().unwrap();
    let spec = TinySpec::default();
    tiny(dir.path(), &spec);
    for f in [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
    ] {
        assert!(dir.path().join(f).is_file(), "{f} written");
    }
    let ck = load_checkpoint(&local(dir.path()), None, &Device::Cpu, None).unwrap();
    assert_eq!(ck.dtype, DType::F32);
    let c = &ck.config;
    assert_eq!(
        (
            c.hidden_size,
            c.num_hidden_layers,
            c.num_attention_heads,
            c.num_key_value_heads
        ),
        (64, 2, 4, 2)
    );
    assert_eq!(
        (c.intermediate_size, c.vocab_size, c.head_dim),
        (128, 151_936, 16)
    );
    assert_eq!(c.rope_theta, 1e6);
    assert_eq!(c.rms_norm_eps, 1e-6);
    assert!(c.tie_word_embeddings);
    assert_eq!(ck.weights.len(), 2 + 12 * 2);
    assert!(!ck.weights.contains_key("lm_head.weight"));
    assert_eq!(
        ck.weights["model.layers.1.self_attn.k_proj.weight"].dims(),
        &[32, 64]
    );
    assert_eq!(ck.generation_config.eos_token_ids, vec![151_645, 151_643]);
    assert_eq!(ck.tokenizer.stop_token_ids(), &[151_645, 151_643]);
    assert_eq!(ck.info.stored_dtype.as_deref(), Some("float32"));
}

#[test]
fn init_tiny_is_deterministic_and_sharding_preserves_values() {
    let a = tempfile::tempdir().unwrap();
    let b = tempfile::tempdir().unwrap();
    let c = tempfile::tempdir().unwrap();
    let s = tempfile::tempdir().unwrap();
    let spec = TinySpec {
        tie: false,
        seed: 5,
        ..TinySpec::default()
    };
    tiny(a.path(), &spec);
    tiny(b.path(), &spec);
    tiny(
        c.path(),
        &TinySpec {
            seed: 6,
            ..spec.clone()
        },
    );
    let read = |d: &Path| std::fs::read(d.join("model.safetensors")).unwrap();
    assert_eq!(read(a.path()), read(b.path()), "same seed, same bytes");
    assert_ne!(read(a.path()), read(c.path()), "another seed differs");

    tiny(
        s.path(),
        &TinySpec {
            shards: 3,
            ..spec.clone()
        },
    );
    let files = load::resolve_dir(s.path()).unwrap();
    assert_eq!(files.weights.len(), 3);
    assert!(files.weights[0].ends_with("model-00001-of-00003.safetensors"));
    let one = load_checkpoint(&local(a.path()), None, &Device::Cpu, None).unwrap();
    let three = load_checkpoint(&local(s.path()), None, &Device::Cpu, None).unwrap();
    assert!(!three.config.tie_word_embeddings);
    assert_eq!(one.weights.len(), three.weights.len());
    assert!(three.weights.contains_key("lm_head.weight"));
    for (name, t) in &one.weights {
        assert_eq!(max_abs_diff(t, &three.weights[name]), 0.0, "{name}");
    }
}

#[test]
fn missing_files_are_named() {
    let dir = tempfile::tempdir().unwrap();
    tiny(dir.path(), &TinySpec::default());
    for f in ["tokenizer.json", "config.json", "model.safetensors"] {
        let d = tempfile::tempdir().unwrap();
        for e in std::fs::read_dir(dir.path()).unwrap() {
            let e = e.unwrap();
            std::fs::copy(e.path(), d.path().join(e.file_name())).unwrap();
        }
        std::fs::remove_file(d.path().join(f)).unwrap();
        let msg = err_of(load_checkpoint(&local(d.path()), None, &Device::Cpu, None));
        assert!(
            msg.contains("missing file") && msg.contains(f),
            "{f}: {msg}"
        );
    }
    // A shard named by the index but absent.
    let s = tempfile::tempdir().unwrap();
    tiny(
        s.path(),
        &TinySpec {
            shards: 2,
            ..TinySpec::default()
        },
    );
    std::fs::remove_file(s.path().join("model-00002-of-00002.safetensors")).unwrap();
    let msg = err_of(load_checkpoint(&local(s.path()), None, &Device::Cpu, None));
    assert!(msg.contains("model-00002-of-00002.safetensors"), "{msg}");
    // A directory that does not exist.
    let msg = err_of(load_checkpoint(
        &local(&dir.path().join("nope")),
        None,
        &Device::Cpu,
        None,
    ));
    assert!(msg.contains("does not exist"), "{msg}");
}

#[test]
fn wrong_architecture_is_rejected() {
    let dir = tempfile::tempdir().unwrap();
    tiny(dir.path(), &TinySpec::default());
    edit_json(&dir.path().join("config.json"), |v| {
        v["architectures"] = serde_json::json!(["LlamaForCausalLM"]);
        v["model_type"] = serde_json::json!("llama");
    });
    // A Qwen2 checkpoint labelled Llama: its q/k/v biases are not Llama's.
    let msg = err_of(load_checkpoint(
        &local(dir.path()),
        None,
        &Device::Cpu,
        None,
    ));
    assert!(
        msg.contains("model.layers.0.self_attn.k_proj.bias (and 5 more)")
            && msg.contains("LlamaForCausalLM"),
        "{msg}"
    );
    edit_json(&dir.path().join("config.json"), |v| {
        v["architectures"] = serde_json::json!(["MistralForCausalLM"]);
        v["model_type"] = serde_json::json!("mistral");
    });
    let msg = err_of(load_checkpoint(
        &local(dir.path()),
        None,
        &Device::Cpu,
        None,
    ));
    for name in [
        "MistralForCausalLM",
        "Qwen2ForCausalLM",
        "Qwen3ForCausalLM",
        "LlamaForCausalLM",
    ] {
        assert!(msg.contains(name), "{msg}");
    }
}

#[test]
fn wrong_and_missing_tensors_are_named() {
    let dir = tempfile::tempdir().unwrap();
    tiny(dir.path(), &TinySpec::default());
    edit_json(&dir.path().join("config.json"), |v| {
        v["intermediate_size"] = serde_json::json!(100);
    });
    let msg = err_of(load_checkpoint(
        &local(dir.path()),
        None,
        &Device::Cpu,
        None,
    ));
    assert!(
        msg.contains("model.layers.0.mlp.gate_proj.weight")
            && msg.contains("[128, 64]")
            && msg.contains("[100, 64]"),
        "{msg}"
    );

    // Drop one tensor from the file.
    let d2 = tempfile::tempdir().unwrap();
    tiny(d2.path(), &TinySpec::default());
    let path = d2.path().join("model.safetensors");
    let mut all = candle_core::safetensors::load(&path, &Device::Cpu).unwrap();
    all.remove("model.layers.1.post_attention_layernorm.weight");
    candle_core::safetensors::save(&all, &path).unwrap();
    let msg = err_of(load_checkpoint(&local(d2.path()), None, &Device::Cpu, None));
    assert!(
        msg.contains("missing tensor model.layers.1.post_attention_layernorm.weight"),
        "{msg}"
    );
}

#[test]
fn tied_heads_follow_config_and_file() {
    // Untied config, no lm_head in the file -> tied.
    let dir = tempfile::tempdir().unwrap();
    tiny(dir.path(), &TinySpec::default());
    edit_json(&dir.path().join("config.json"), |v| {
        v["tie_word_embeddings"] = serde_json::json!(false);
    });
    let ck = load_checkpoint(&local(dir.path()), None, &Device::Cpu, None).unwrap();
    assert!(ck.config.tie_word_embeddings);
    assert!(!ck.weights.contains_key("lm_head.weight"));

    // Tied config with a stored lm_head -> the head is dropped (transformers ties it).
    let d2 = tempfile::tempdir().unwrap();
    tiny(
        d2.path(),
        &TinySpec {
            tie: false,
            ..TinySpec::default()
        },
    );
    edit_json(&d2.path().join("config.json"), |v| {
        v["tie_word_embeddings"] = serde_json::json!(true);
    });
    let ck = load_checkpoint(&local(d2.path()), None, &Device::Cpu, None).unwrap();
    assert!(ck.config.tie_word_embeddings);
    assert!(!ck.weights.contains_key("lm_head.weight"));
}

#[test]
fn transformers5_dialect_and_jinja_template() {
    let dir = tempfile::tempdir().unwrap();
    tiny(dir.path(), &TinySpec::default());
    let before = load_checkpoint(&local(dir.path()), None, &Device::Cpu, None).unwrap();
    let msgs = vec![Message::system("Be brief."), Message::user("Hi ü")];
    let text4 = before.tokenizer.apply_chat_template(&msgs, true).unwrap();

    let mut template = String::new();
    edit_json(&dir.path().join("tokenizer_config.json"), |v| {
        template = v["chat_template"].as_str().unwrap().to_string();
        v.as_object_mut().unwrap().remove("chat_template");
    });
    std::fs::write(dir.path().join("chat_template.jinja"), &template).unwrap();
    edit_json(&dir.path().join("config.json"), |v| {
        let o = v.as_object_mut().unwrap();
        o.remove("rope_theta");
        o.remove("torch_dtype");
        o.remove("use_sliding_window");
        o.insert(
            "rope_parameters".into(),
            serde_json::json!({"rope_theta": 500000.0, "rope_type": "default"}),
        );
        o.insert("dtype".into(), serde_json::json!("bfloat16"));
        o.insert(
            "layer_types".into(),
            serde_json::json!(["full_attention", "full_attention"]),
        );
        o.insert("transformers_version".into(), serde_json::json!("5.0.0"));
    });
    let after = load_checkpoint(&local(dir.path()), None, &Device::Cpu, None).unwrap();
    assert_eq!(after.config.rope_theta, 500000.0);
    assert_eq!(after.info.stored_dtype.as_deref(), Some("bfloat16"));
    assert_eq!(
        after.tokenizer.apply_chat_template(&msgs, true).unwrap(),
        text4
    );
    assert!(after.tokenizer.has_chat_template());

    // Unsupported RoPE scaling and sliding windows are refused clearly.
    edit_json(&dir.path().join("config.json"), |v| {
        v["rope_parameters"]["rope_type"] = serde_json::json!("yarn");
    });
    let msg = err_of(load_checkpoint(
        &local(dir.path()),
        None,
        &Device::Cpu,
        None,
    ));
    assert!(msg.contains("yarn"), "{msg}");
    edit_json(&dir.path().join("config.json"), |v| {
        v["rope_parameters"]["rope_type"] = serde_json::json!("default");
        v["layer_types"] = serde_json::json!(["sliding_attention", "full_attention"]);
    });
    let msg = err_of(load_checkpoint(
        &local(dir.path()),
        None,
        &Device::Cpu,
        None,
    ));
    assert!(msg.contains("sliding"), "{msg}");
}

#[test]
fn dtypes_convert_on_load() {
    let dir = tempfile::tempdir().unwrap();
    tiny(
        dir.path(),
        &TinySpec {
            dtype: TinyDType::Bf16,
            ..TinySpec::default()
        },
    );
    let bf = load_checkpoint(&local(dir.path()), Some(DType::BF16), &Device::Cpu, None).unwrap();
    let f32 = load_checkpoint(&local(dir.path()), None, &Device::Cpu, None).unwrap();
    let f16 = load_checkpoint(&local(dir.path()), Some(DType::F16), &Device::Cpu, None).unwrap();
    let name = "model.layers.0.self_attn.q_proj.weight";
    assert_eq!(bf.weights[name].dtype(), DType::BF16);
    assert_eq!(f32.weights[name].dtype(), DType::F32);
    assert_eq!(f16.weights[name].dtype(), DType::F16);
    assert_eq!(max_abs_diff(&bf.weights[name], &f32.weights[name]), 0.0);
    assert!(max_abs_diff(&f16.weights[name], &f32.weights[name]) < 1e-3);
}

#[test]
fn hub_cache_offline() {
    // The only test touching HF_* variables (they are process-wide).
    let home = tempfile::tempdir().unwrap();
    std::env::remove_var("HF_HUB_CACHE");
    std::env::set_var("HF_HOME", home.path());
    std::env::set_var("HF_HUB_OFFLINE", "1");
    let hub = ModelRef::parse("concord-test/tiny-qwen2").unwrap();
    let msg = err_of(load_checkpoint(&hub, None, &Device::Cpu, None));
    assert!(
        msg.contains("HF_HUB_OFFLINE") && msg.contains("not in the Hugging Face cache"),
        "{msg}"
    );

    // Lay a snapshot out exactly as huggingface_hub does (refs/main -> snapshots/<sha>).
    let repo = home
        .path()
        .join("hub")
        .join("models--concord-test--tiny-qwen2");
    let sha = "0123456789abcdef0123456789abcdef01234567";
    let snap = repo.join("snapshots").join(sha);
    tiny(&snap, &TinySpec::default());
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::write(repo.join("refs").join("main"), sha).unwrap();
    let ck = load_checkpoint(&hub, None, &Device::Cpu, None).unwrap();
    assert_eq!(ck.files.dir, snap);
    // A commit revision resolves without a ref file.
    let pinned = ModelRef::parse(&format!("concord-test/tiny-qwen2@{sha}")).unwrap();
    assert!(load_checkpoint(&pinned, None, &Device::Cpu, None).is_ok());
    // Unknown revision: clear error, still offline.
    let other = ModelRef::parse("concord-test/tiny-qwen2@v9").unwrap();
    let msg = err_of(load_checkpoint(&other, None, &Device::Cpu, None));
    assert!(msg.contains("@v9"), "{msg}");
    // An incomplete snapshot names the missing file.
    std::fs::remove_file(snap.join("tokenizer.json")).unwrap();
    let msg = err_of(load_checkpoint(&hub, None, &Device::Cpu, None));
    assert!(msg.contains("tokenizer.json"), "{msg}");
    std::env::remove_var("HF_HUB_OFFLINE");
    std::env::remove_var("HF_HOME");
}

#[test]
fn tokenizer_templates_and_stop_tokens() {
    let dir = tempfile::tempdir().unwrap();
    tiny(dir.path(), &TinySpec::default());
    let tok = Tokenizer::from_dir(dir.path()).unwrap();
    let msgs = vec![Message::user("Hello!")];
    assert_eq!(
        tok.apply_chat_template(&msgs, true).unwrap(),
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful \
         assistant.<|im_end|>\n<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n"
    );
    let ids = tok.encode("<|im_start|>user\nHi<|im_end|>").unwrap();
    assert_eq!(ids.first(), Some(&151_644));
    assert_eq!(ids.last(), Some(&151_645));
    assert_eq!(tok.decode(&ids).unwrap(), "<|im_start|>user\nHi<|im_end|>");
    assert_eq!(tok.decode_skip_special(&ids).unwrap(), "user\nHi");

    // No template -> ChatML.
    std::fs::remove_file(dir.path().join("tokenizer_config.json")).unwrap();
    let plain = Tokenizer::from_dir(dir.path()).unwrap();
    assert!(!plain.has_chat_template());
    assert_eq!(
        plain.apply_chat_template(&msgs, true).unwrap(),
        "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n"
    );
    assert_eq!(
        plain.apply_chat_template(&msgs, false).unwrap(),
        "<|im_start|>user\nHello!<|im_end|>\n"
    );

    // raise_exception, tojson (Python json.dumps style), pycompat methods, namespace.
    let inner = tok.inner().clone();
    let t = Tokenizer::new(
        inner.clone(),
        &serde_json::json!({"eos_token": {"content": "<|endoftext|>"}}),
        Some(
            "{%- set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}\
             {% if m.role == 'bad' %}{{ raise_exception('bad role: ' + m.role) }}{% endif %}\
             {{ m.content.upper() }}|{{ m.content.startswith('hi') }}|{{ {'a': [1, 'é<'], 'b': none} | tojson }}\
             {% endfor %}{{ ns.n }}{{ eos_token }}"
                .to_string(),
        ),
        &[7],
    )
    .unwrap();
    assert_eq!(
        t.apply_chat_template(&[Message::user("hi x")], false)
            .unwrap(),
        "HI X|True|{\"a\": [1, \"é<\"], \"b\": null}1<|endoftext|>"
    );
    let msg = err_of(t.apply_chat_template(
        &[Message {
            role: "bad".into(),
            content: String::new(),
        }],
        false,
    ));
    assert!(msg.contains("bad role: bad"), "{msg}");
    assert_eq!(t.stop_token_ids(), &[151_645, 151_643, 7]);
}

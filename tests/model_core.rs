//! Core model tests on tiny random Qwen2 models: gradients, padding, KV cache, chunked
//! log-probs, PEFT round trip, adapter switch, half-precision bases.
use crate::util::max_abs_diff;
use candle_core::{DType, Device, IndexOp, Tensor, Var, D};
use concord::model::lora::LoraConfig;
use concord::model::ops;
use concord::model::{random_weights, ArchConfig, Mode, Transformer, Weights};
use concord::model::{Input, Pass};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn cfg() -> ArchConfig {
    ArchConfig::tiny()
}

fn lora_cfg(dropout: f64) -> LoraConfig {
    LoraConfig {
        r: 4,
        alpha: 8.0,
        dropout,
        target_modules: crate::util::all_lora_targets(),
        use_rslora: false,
        init_seed: 7,
    }
}

fn weights(dtype: DType) -> Weights {
    random_weights(&cfg(), 42, dtype, &Device::Cpu).unwrap()
}

/// Give every LoRA B a random nonzero value (PEFT init leaves B = 0).
fn randomize_b(model: &Transformer, seed: u64, scale: f32) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    for (name, var) in model.lora_vars() {
        if name.contains("lora_B") {
            let n = var.elem_count();
            let vals: Vec<f32> = (0..n)
                .map(|_| scale * (rng.gen::<f32>() * 2.0 - 1.0))
                .collect();
            let t = Tensor::from_vec(vals, var.shape(), &Device::Cpu).unwrap();
            var.set(&t).unwrap();
        }
    }
}

fn ids_tensor(rows: &[Vec<u32>]) -> Tensor {
    let b = rows.len();
    let t = rows[0].len();
    let flat: Vec<u32> = rows.iter().flatten().copied().collect();
    Tensor::from_vec(flat, (b, t), &Device::Cpu).unwrap()
}

fn random_ids(rng: &mut ChaCha8Rng, n: usize) -> Vec<u32> {
    (0..n).map(|_| rng.gen_range(0..512u32)).collect()
}

/// A weighted log-prob loss over a left-padded batch.
fn loss_of(model: &Transformer, mode: Mode) -> Tensor {
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let rows = [random_ids(&mut rng, 9), random_ids(&mut rng, 6)];
    let t = 9;
    let mut ids = vec![];
    let mut mask = vec![];
    for r in &rows {
        let pad = t - r.len();
        ids.push([vec![0u32; pad], r.clone()].concat());
        mask.extend(std::iter::repeat_n(0u8, pad).chain(std::iter::repeat_n(1u8, r.len())));
    }
    let ids = ids_tensor(&ids);
    let lp = model
        .sequence_logprobs(&ids, Some(&mask), mode, 0.9, false)
        .unwrap()
        .logprobs;
    // Only positions whose target is a real token carry weight.
    let w: Vec<f32> = (0..2 * (t - 1))
        .map(|i| {
            let (b, j) = (i / (t - 1), i % (t - 1));
            if mask[b * t + j + 1] == 1 {
                0.3 + 0.1 * (i % 5) as f32
            } else {
                0.0
            }
        })
        .collect();
    let w = Tensor::from_vec(w, (2, t - 1), &Device::Cpu).unwrap();
    // ops::mul: a plain `lp * w` would also store a gradient for the constant `w`.
    ops::mul(&lp, &w).unwrap().sum_all().unwrap()
}

#[test]
fn every_lora_tensor_gets_a_gradient_and_only_lora_tensors_do() {
    let model = Transformer::new(&cfg(), &weights(DType::F32), Some(&lora_cfg(0.1))).unwrap();
    randomize_b(&model, 1, 0.05);
    let loss = loss_of(&model, Mode::Train { dropout_seed: 5 });
    let grads = loss.backward().unwrap();
    let vars = model.lora_vars();
    assert_eq!(vars.len(), 2 * 7 * cfg().num_hidden_layers);
    for (name, var) in &vars {
        let g = grads
            .get(var.as_tensor())
            .unwrap_or_else(|| panic!("no grad for {name}"));
        assert_eq!(g.dtype(), DType::F32);
        let v: Vec<f32> = g.flatten_all().unwrap().to_vec1().unwrap();
        assert!(v.iter().all(|x| x.is_finite()), "{name} grad not finite");
        assert!(v.iter().any(|x| *x != 0.0), "{name} grad is zero");
    }
    let ids: std::collections::HashSet<_> = vars.iter().map(|(_, v)| v.as_tensor().id()).collect();
    let stored: Vec<_> = grads.get_ids().collect();
    assert_eq!(
        stored.len(),
        vars.len(),
        "grad store holds non-LoRA tensors"
    );
    assert!(stored.iter().all(|id| ids.contains(id)));
}

#[test]
fn only_some_targets_still_store_only_lora_grads() {
    let mut l = lora_cfg(0.0);
    l.target_modules = vec!["v_proj".into(), "up_proj".into()];
    let model = Transformer::new(&cfg(), &weights(DType::F32), Some(&l)).unwrap();
    randomize_b(&model, 2, 0.05);
    let grads = loss_of(&model, Mode::Grad).backward().unwrap();
    let vars = model.lora_vars();
    assert_eq!(vars.len(), 2 * 2 * cfg().num_hidden_layers);
    assert_eq!(grads.get_ids().count(), vars.len());
    for (name, var) in &vars {
        assert!(grads.get(var.as_tensor()).is_some(), "no grad for {name}");
    }
}

#[test]
fn finite_differences_agree_with_lora_gradient() {
    let model = Transformer::new(&cfg(), &weights(DType::F32), Some(&lora_cfg(0.0))).unwrap();
    randomize_b(&model, 3, 0.1);
    let grads = loss_of(&model, Mode::Grad).backward().unwrap();
    let vars = model.lora_vars();
    // Directional derivative along a random direction, per tensor group (A's / B's).
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    for which in ["lora_A", "lora_B"] {
        let chosen: Vec<&(String, Var)> = vars.iter().filter(|(n, _)| n.contains(which)).collect();
        // Direction: the gradient scaled to max |d| = 1, times a random factor in [0.5, 1].
        let dirs: Vec<Tensor> = chosen
            .iter()
            .map(|(_, v)| {
                let g = grads.get(v.as_tensor()).unwrap();
                let m = crate::util::max_abs(g);
                let r: Vec<f32> = (0..v.elem_count())
                    .map(|_| 0.5 + 0.5 * rng.gen::<f32>())
                    .collect();
                let r = Tensor::from_vec(r, v.shape(), &Device::Cpu).unwrap();
                ((g / m.max(1e-12) as f64).unwrap() * r).unwrap()
            })
            .collect();
        let analytic: f64 = chosen
            .iter()
            .zip(&dirs)
            .map(|((_, v), d)| {
                let g = grads.get(v.as_tensor()).unwrap();
                (g * d)
                    .unwrap()
                    .sum_all()
                    .unwrap()
                    .to_scalar::<f32>()
                    .unwrap() as f64
            })
            .sum();
        let orig: Vec<Tensor> = chosen
            .iter()
            .map(|(_, v)| v.as_detached_tensor().copy().unwrap())
            .collect();
        let eps: f64 = std::env::var("FD_EPS")
            .map(|s| s.parse().unwrap())
            .unwrap_or(1e-3);
        let eval = |sign: f64| -> f64 {
            for (((_, v), d), o) in chosen.iter().zip(&dirs).zip(&orig) {
                v.set(&(o + (d * (sign * eps)).unwrap()).unwrap()).unwrap();
            }
            loss_of(&model, Mode::Detached).to_scalar::<f32>().unwrap() as f64
        };
        let fd = (eval(1.0) - eval(-1.0)) / (2.0 * eps);
        for ((_, v), o) in chosen.iter().zip(&orig) {
            v.set(o).unwrap();
        }
        let rel = (fd - analytic).abs() / analytic.abs().max(1e-3);
        eprintln!("{which}: finite diff {fd} analytic {analytic} rel {rel:.2e}");
        assert!(
            rel < 1e-2,
            "{which}: finite diff {fd} vs analytic {analytic} (rel {rel})"
        );
    }
}

#[test]
fn padded_batch_equals_unpadded_rows() {
    let model = Transformer::new(&cfg(), &weights(DType::F32), Some(&lora_cfg(0.0))).unwrap();
    randomize_b(&model, 4, 0.05);
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let rows = [
        random_ids(&mut rng, 7),
        random_ids(&mut rng, 4),
        random_ids(&mut rng, 1),
    ];
    let t = 7;
    let singles: Vec<Tensor> = rows
        .iter()
        .map(|r| {
            let h = model
                .forward(
                    Input::rows(&ids_tensor(std::slice::from_ref(r)), None),
                    Mode::Detached,
                )
                .unwrap()
                .rows;
            model.logits(&h).unwrap().i(0).unwrap()
        })
        .collect();
    for left in [true, false] {
        let mut ids = vec![];
        let mut mask = vec![];
        for r in &rows {
            let pad = t - r.len();
            let (p, m) = (vec![3u32; pad], vec![0u8; pad]);
            if left {
                ids.push([p, r.clone()].concat());
                mask.extend([m, vec![1u8; r.len()]].concat());
            } else {
                ids.push([r.clone(), p].concat());
                mask.extend([vec![1u8; r.len()], m].concat());
            }
        }
        let h = model
            .forward(Input::rows(&ids_tensor(&ids), Some(&mask)), Mode::Grad)
            .unwrap()
            .rows;
        let logits = model.logits(&h).unwrap();
        for (bi, r) in rows.iter().enumerate() {
            let off = if left { t - r.len() } else { 0 };
            let got = logits.i(bi).unwrap().narrow(0, off, r.len()).unwrap();
            let d = max_abs_diff(&got, &singles[bi]);
            assert!(d < 1e-4, "row {bi} (left={left}) differs by {d}");
        }
        let all: Vec<f32> = logits.flatten_all().unwrap().to_vec1().unwrap();
        assert!(
            all.iter().all(|x| x.is_finite()),
            "padded positions must stay finite"
        );
    }
}

#[test]
fn kv_cache_decoding_equals_full_forward() {
    let model = Transformer::new(&cfg(), &weights(DType::F32), Some(&lora_cfg(0.0))).unwrap();
    randomize_b(&model, 6, 0.05);
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let prompts = [random_ids(&mut rng, 5), random_ids(&mut rng, 3)];
    let g = 2;
    let steps = 4;
    // Prefill the left-padded prompts once.
    let t = 5;
    let mut ids = vec![];
    let mut mask = vec![];
    for p in &prompts {
        let pad = t - p.len();
        ids.push([vec![0u32; pad], p.clone()].concat());
        mask.extend([vec![0u8; pad], vec![1u8; p.len()]].concat());
    }
    let mut cache = model.new_cache(prompts.len(), t + steps + 1).unwrap();
    let h = model
        .forward(
            Input::cached(&ids_tensor(&ids), Some(&mask), &mut cache),
            Mode::Detached,
        )
        .unwrap()
        .rows;
    let first = model.last_logits(&h).unwrap();
    for (bi, p) in prompts.iter().enumerate() {
        let hf = model
            .forward(
                Input::rows(&ids_tensor(std::slice::from_ref(p)), None),
                Mode::Detached,
            )
            .unwrap()
            .rows;
        let d = max_abs_diff(
            &first.i(bi).unwrap(),
            &model.last_logits(&hf).unwrap().i(0).unwrap(),
        );
        assert!(d < 1e-4, "prefill row {bi} differs by {d}");
    }
    // Expand to G completions per prompt and decode different tokens per row.
    let mut cache = cache.repeat_rows(g).unwrap();
    assert_eq!(cache.batch(), 4);
    assert_eq!(cache.next_positions(), &[5, 5, 3, 3]);
    let mut seqs: Vec<Vec<u32>> = prompts.iter().flat_map(|p| vec![p.clone(); g]).collect();
    for step in 0..steps {
        let next: Vec<u32> = (0..seqs.len())
            .map(|r| ((r * 37 + step * 11) % 512) as u32)
            .collect();
        // Row 1 finishes after 2 steps: it feeds padding (mask 0) afterwards.
        let m: Vec<u8> = (0..seqs.len())
            .map(|r| u8::from(!(r == 1 && step >= 2)))
            .collect();
        let h = model
            .forward(
                Input::cached(
                    &Tensor::from_vec(next.clone(), (seqs.len(), 1), &Device::Cpu).unwrap(),
                    Some(&m),
                    &mut cache,
                ),
                Mode::Detached,
            )
            .unwrap()
            .rows;
        let logits = model.last_logits(&h).unwrap();
        for (r, s) in seqs.iter_mut().enumerate() {
            if m[r] == 0 {
                continue;
            }
            s.push(next[r]);
            let hf = model
                .forward(
                    Input::rows(&ids_tensor(std::slice::from_ref(s)), None),
                    Mode::Detached,
                )
                .unwrap()
                .rows;
            let want = model.last_logits(&hf).unwrap().i(0).unwrap();
            let d = max_abs_diff(&logits.i(r).unwrap(), &want);
            assert!(d < 1e-4, "step {step} row {r} differs by {d}");
        }
    }
    assert_eq!(cache.len(), t + steps);
    // Too many columns is an error, not a panic.
    let one = Tensor::from_vec(vec![1u32; 8], (4, 2), &Device::Cpu).unwrap();
    assert!(model
        .forward(Input::cached(&one, None, &mut cache), Mode::Detached)
        .is_err());
}

#[test]
fn chunked_logprobs_equal_log_softmax_values_and_gradients() {
    let mut model = Transformer::new(&cfg(), &weights(DType::F32), Some(&lora_cfg(0.0))).unwrap();
    randomize_b(&model, 8, 0.05);
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    let ids = ids_tensor(&[random_ids(&mut rng, 8), random_ids(&mut rng, 8)]);
    let temp = 0.7;
    model.logprob_chunk = 3; // several chunks, the last one partial
    let lp = model
        .sequence_logprobs(&ids, None, Mode::Grad, temp, true)
        .unwrap();
    // Reference: full logits, log_softmax, gather.
    let h = model
        .forward(Input::rows(&ids, None), Mode::Grad)
        .unwrap()
        .rows;
    let logits = (model.logits(&h.narrow(1, 0, 7).unwrap()).unwrap() / temp).unwrap();
    let logsm = candle_nn::ops::log_softmax(&logits, D::Minus1).unwrap();
    let tg = ids
        .narrow(1, 1, 7)
        .unwrap()
        .contiguous()
        .unwrap()
        .unsqueeze(2)
        .unwrap();
    let want = logsm.gather(&tg, 2).unwrap().squeeze(2).unwrap();
    assert!(max_abs_diff(&lp.logprobs, &want) < 1e-5);
    let p = logsm.exp().unwrap();
    let want_ent = (p * &logsm).unwrap().sum(D::Minus1).unwrap().neg().unwrap();
    assert!(max_abs_diff(lp.entropy.as_ref().unwrap(), &want_ent) < 1e-4);
    // Gradients of the same weighted loss agree.
    let w = Tensor::from_vec(
        (0..14).map(|i| (i as f32 - 6.0) / 7.0).collect::<Vec<_>>(),
        (2, 7),
        &Device::Cpu,
    )
    .unwrap();
    let g1 = (lp.logprobs * &w)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    let g2 = (want * &w).unwrap().sum_all().unwrap().backward().unwrap();
    for (name, var) in model.lora_vars() {
        let a = g1.get(var.as_tensor()).unwrap();
        let b = g2.get(var.as_tensor()).unwrap();
        let scale = b
            .abs()
            .unwrap()
            .flatten_all()
            .unwrap()
            .max(0)
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        let d = max_abs_diff(a, b);
        assert!(
            d <= 1e-4 * scale.max(1e-3),
            "{name}: grad differs by {d} (scale {scale})"
        );
    }
}

#[test]
fn peft_save_load_round_trip_and_disabled_adapter_is_base() {
    let w = weights(DType::F32);
    let model = Transformer::new(&cfg(), &w, Some(&lora_cfg(0.05))).unwrap();
    randomize_b(&model, 10, 0.05);
    let mut rng = ChaCha8Rng::seed_from_u64(12);
    let ids = ids_tensor(&[random_ids(&mut rng, 6)]);
    let lp = |m: &Transformer| {
        m.sequence_logprobs(&ids, None, Mode::Detached, 1.0, false)
            .unwrap()
            .logprobs
    };
    let with = lp(&model);
    let dir = tempfile::tempdir().unwrap();
    model.save_adapter(dir.path(), "tiny-base").unwrap();
    // File format: PEFT keys, f32, metadata {"format":"pt"}, config fields.
    let bytes = std::fs::read(dir.path().join("adapter_model.safetensors")).unwrap();
    let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    assert_eq!(
        meta.metadata().as_ref().unwrap().get("format").unwrap(),
        "pt"
    );
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let a0 = st
        .tensor("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight")
        .unwrap();
    assert_eq!(a0.shape(), &[4, 64]);
    assert_eq!(a0.dtype(), safetensors::Dtype::F32);
    let b1 = st
        .tensor("base_model.model.model.layers.1.mlp.down_proj.lora_B.weight")
        .unwrap();
    assert_eq!(b1.shape(), &[64, 4]);
    assert_eq!(st.names().len(), 28);
    let cfg_json: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("adapter_config.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(cfg_json["peft_type"], "LORA");
    assert_eq!(cfg_json["task_type"], "CAUSAL_LM");
    assert_eq!(cfg_json["r"], 4);
    assert_eq!(cfg_json["lora_alpha"], 8.0);
    assert_eq!(cfg_json["base_model_name_or_path"], "tiny-base");
    assert_eq!(cfg_json["use_dora"], false);
    assert_eq!(cfg_json["bias"], "none");

    let mut loaded = Transformer::new(&cfg(), &w, None).unwrap();
    loaded.load_adapter(dir.path()).unwrap();
    assert_eq!(loaded.lora_config().unwrap().r, 4);
    assert!(max_abs_diff(&lp(&loaded), &with) < 1e-6);

    // Disabled adapter == base model; enabled differs.
    let base = Transformer::new(&cfg(), &w, None).unwrap();
    let base_lp = lp(&base);
    assert!(max_abs_diff(&with, &base_lp) > 1e-4);
    model.set_adapter_enabled(false);
    assert!(max_abs_diff(&lp(&model), &base_lp) < 1e-6);
    model.set_adapter_enabled(true);
    assert!(max_abs_diff(&lp(&model), &with) < 1e-6);
    // A base-only pass is the base model for that forward alone, the adapter left on.
    let base_pass = Pass {
        base_only: true,
        ..Pass::default()
    };
    let h = model
        .forward(Input::rows(&ids, None), base_pass)
        .unwrap()
        .rows;
    let t = ids.dim(1).unwrap();
    let h = h.narrow(1, 0, t - 1).unwrap();
    let base_only_lp = model
        .token_logprobs(&h, &ids.narrow(1, 1, t - 1).unwrap(), 1.0, false)
        .unwrap()
        .logprobs;
    assert!(max_abs_diff(&base_only_lp, &base_lp) < 1e-6);
    assert!(model.adapter_enabled());

    // Loading validates shapes and names the tensor.
    let mut bad = serde_json::from_str::<serde_json::Value>(
        &std::fs::read_to_string(dir.path().join("adapter_config.json")).unwrap(),
    )
    .unwrap();
    bad["r"] = serde_json::json!(8);
    std::fs::write(dir.path().join("adapter_config.json"), bad.to_string()).unwrap();
    let err = format!("{:#}", loaded.load_adapter(dir.path()).unwrap_err());
    assert!(
        err.contains("layers.0.self_attn.q_proj.lora_A.weight"),
        "{err}"
    );
}

#[test]
fn fresh_peft_init_is_identity_and_deterministic() {
    let w = weights(DType::F32);
    let a = Transformer::new(&cfg(), &w, Some(&lora_cfg(0.0))).unwrap();
    let b = Transformer::new(&cfg(), &w, Some(&lora_cfg(0.0))).unwrap();
    for ((_, va), (_, vb)) in a.lora_vars().iter().zip(b.lora_vars()) {
        assert!(max_abs_diff(va.as_tensor(), vb.as_tensor()) == 0.0);
    }
    let (_, a0) = &a.lora_vars()[0];
    let bound = 1.0 / 64f32.sqrt();
    let v: Vec<f32> = a0.flatten_all().unwrap().to_vec1().unwrap();
    assert!(v.iter().all(|x| x.abs() <= bound) && v.iter().any(|x| *x != 0.0));
    let base = Transformer::new(&cfg(), &w, None).unwrap();
    let ids = ids_tensor(&[vec![1, 2, 3, 4]]);
    let l1 = a
        .sequence_logprobs(&ids, None, Mode::Detached, 1.0, false)
        .unwrap()
        .logprobs;
    let l2 = base
        .sequence_logprobs(&ids, None, Mode::Detached, 1.0, false)
        .unwrap()
        .logprobs;
    assert!(max_abs_diff(&l1, &l2) < 1e-6);
}

#[test]
fn half_precision_base_with_f32_lora_trains() {
    let mut rng = ChaCha8Rng::seed_from_u64(13);
    let ids = ids_tensor(&[random_ids(&mut rng, 6), random_ids(&mut rng, 6)]);
    let f32_model = Transformer::new(&cfg(), &weights(DType::F32), Some(&lora_cfg(0.0))).unwrap();
    randomize_b(&f32_model, 14, 0.05);
    let want = f32_model
        .sequence_logprobs(&ids, None, Mode::Detached, 1.0, false)
        .unwrap()
        .logprobs;
    for dtype in [DType::BF16, DType::F16] {
        let model = Transformer::new(&cfg(), &weights(dtype), Some(&lora_cfg(0.1))).unwrap();
        randomize_b(&model, 14, 0.05);
        let lp = model
            .sequence_logprobs(&ids, None, Mode::Train { dropout_seed: 1 }, 1.0, true)
            .unwrap();
        assert_eq!(lp.logprobs.dtype(), DType::F32);
        let grads = lp.logprobs.sum_all().unwrap().backward().unwrap();
        for (name, var) in model.lora_vars() {
            assert_eq!(var.dtype(), DType::F32);
            let g = grads.get(var.as_tensor()).unwrap();
            let v: Vec<f32> = g.flatten_all().unwrap().to_vec1().unwrap();
            assert!(
                v.iter().all(|x| x.is_finite()) && v.iter().any(|x| *x != 0.0),
                "{dtype:?} {name}"
            );
        }
        let ev = model
            .sequence_logprobs(&ids, None, Mode::Detached, 1.0, false)
            .unwrap()
            .logprobs;
        let d = max_abs_diff(&ev, &want);
        assert!(d < 0.1, "{dtype:?} log-probs differ from f32 by {d}");
    }
}

/// f32 weights with scaled embeddings: peaky next-token distributions, so rounding the
/// base moves the log-probs visibly (near-uniform ones barely move).
fn peaky_weights() -> Weights {
    let mut w = weights(DType::F32);
    let e = (w["model.embed_tokens.weight"].clone() * 8.0).unwrap();
    w.insert("model.embed_tokens.weight".into(), e);
    w
}

/// The peaky f32 weights with every base matrix (embedding, LM head, projections) rounded
/// through `dtype` and widened back: exactly what a `dtype` base computes with.
fn rounded_weights(dtype: DType) -> Weights {
    let mut w = peaky_weights();
    for (name, t) in w.iter_mut() {
        if name.ends_with("_proj.weight") || name.ends_with("embed_tokens.weight") {
            *t = t.to_dtype(dtype).unwrap().to_dtype(DType::F32).unwrap();
        }
    }
    w
}

#[test]
fn reduced_precision_base_equals_f32_on_the_rounded_weights() {
    let plain = Transformer::new(&cfg(), &peaky_weights(), Some(&lora_cfg(0.0))).unwrap();
    randomize_b(&plain, 21, 0.05);
    let plain_loss = loss_of(&plain, Mode::Grad).to_scalar::<f32>().unwrap();
    for dtype in [DType::BF16, DType::F16] {
        // Independent truth: an all-f32 model whose matrices were rounded beforehand.
        let truth =
            Transformer::new(&cfg(), &rounded_weights(dtype), Some(&lora_cfg(0.0))).unwrap();
        let mut model = Transformer::new(&cfg(), &peaky_weights(), Some(&lora_cfg(0.0))).unwrap();
        model.set_base_dtype(dtype).unwrap();
        assert_eq!(model.base_dtype(), dtype);
        assert_eq!(model.dtype(), DType::F32);
        for m in [&truth, &model] {
            randomize_b(m, 21, 0.05);
        }
        let (lt, lm) = (loss_of(&truth, Mode::Grad), loss_of(&model, Mode::Grad));
        let (vt, vm) = (
            lt.to_scalar::<f32>().unwrap(),
            lm.to_scalar::<f32>().unwrap(),
        );
        assert!(
            (vt - vm).abs() < 1e-5 * (1.0 + vt.abs()),
            "{dtype:?}: {vm} vs {vt}"
        );
        // The rounding is real: the loss moved away from the unrounded model's (by about
        // 2e-3 for f16 here, more for bf16), far more than the two paths above differ.
        assert!(
            (vm - plain_loss).abs() > 1e-3 && (vm - plain_loss).abs() > 20.0 * (vt - vm).abs(),
            "{dtype:?}: no rounding visible ({vm} vs {plain_loss})"
        );
        let (gt, gm) = (lt.backward().unwrap(), lm.backward().unwrap());
        for ((name, a), (_, b)) in truth.lora_vars().iter().zip(model.lora_vars().iter()) {
            let a = gt.get(a.as_tensor()).unwrap();
            let b = gm.get(b.as_tensor()).unwrap();
            let scale = crate::util::max_abs(a);
            let d = max_abs_diff(a, b);
            assert!(
                d <= 1e-4 * scale.max(1e-6),
                "{dtype:?} {name}: {d} (scale {scale})"
            );
        }
        // Detached decoding through the KV cache (the skinny kernel's half path) gives
        // the same last-position logits as the training forward.
        let mut rng = ChaCha8Rng::seed_from_u64(22);
        let ids = ids_tensor(&[random_ids(&mut rng, 7)]);
        let full = model
            .forward(Input::rows(&ids, None), Mode::Detached)
            .unwrap()
            .rows;
        let want = model.last_logits(&full).unwrap();
        let mut cache = model.new_cache(1, 16).unwrap();
        let mut last = None;
        for t in 0..7 {
            let step = ids.i((.., t..t + 1)).unwrap();
            let h = model
                .forward(Input::cached(&step, None, &mut cache), Mode::Detached)
                .unwrap()
                .rows;
            last = Some(model.last_logits(&h).unwrap());
        }
        let d = max_abs_diff(&last.unwrap(), &want);
        assert!(d < 1e-4, "{dtype:?}: cached decode logits differ by {d}");
    }
}

#[test]
fn dropout_is_seeded() {
    let model = Transformer::new(&cfg(), &weights(DType::F32), Some(&lora_cfg(0.3))).unwrap();
    randomize_b(&model, 15, 0.2);
    let a = loss_of(&model, Mode::Train { dropout_seed: 1 })
        .to_scalar::<f32>()
        .unwrap();
    let b = loss_of(&model, Mode::Train { dropout_seed: 1 })
        .to_scalar::<f32>()
        .unwrap();
    let c = loss_of(&model, Mode::Train { dropout_seed: 2 })
        .to_scalar::<f32>()
        .unwrap();
    let e = loss_of(&model, Mode::Grad).to_scalar::<f32>().unwrap();
    assert_eq!(a, b);
    assert_ne!(a, c);
    assert_ne!(a, e);
}

#[test]
fn weight_validation_names_the_tensor() {
    let mut w = weights(DType::F32);
    w.remove("model.layers.1.self_attn.k_proj.bias");
    let err = Transformer::new(&cfg(), &w, None)
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("model.layers.1.self_attn.k_proj.bias"),
        "{err}"
    );
    let mut w = weights(DType::F32);
    w.insert(
        "model.layers.0.mlp.up_proj.weight".into(),
        Tensor::zeros((3, 64), DType::F32, &Device::Cpu).unwrap(),
    );
    let err = Transformer::new(&cfg(), &w, None)
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("model.layers.0.mlp.up_proj.weight") && err.contains("[3, 64]"),
        "{err}"
    );
    // Untied embeddings use lm_head.weight when present.
    let mut c = cfg();
    c.tie_word_embeddings = false;
    let w = random_weights(&c, 1, DType::F32, &Device::Cpu).unwrap();
    assert!(w.contains_key("lm_head.weight"));
    let m = Transformer::new(&c, &w, None).unwrap();
    let h = m
        .forward(
            Input::rows(&ids_tensor(&[vec![1, 2]]), None),
            Mode::Detached,
        )
        .unwrap()
        .rows;
    let want = h
        .broadcast_matmul(&w["lm_head.weight"].t().unwrap())
        .unwrap();
    assert!(max_abs_diff(&m.logits(&h).unwrap(), &want) < 1e-6);
}

/// Timing of one LoRA r16 forward+backward at 8 x 160 tokens on the Qwen2.5-0.5B shape
/// (random weights). `cargo test --release --test tests model_core::bench_05b -- --ignored --nocapture`
#[test]
#[ignore]
fn bench_05b_fwd_bwd() {
    let mut c = ArchConfig::qwen25_05b();
    if let Ok(l) = std::env::var("BENCH_LAYERS") {
        c.num_hidden_layers = l.parse().unwrap();
    }
    let t0 = std::time::Instant::now();
    let w = random_weights(&c, 1, DType::F32, &Device::Cpu).unwrap();
    let l = LoraConfig {
        r: 16,
        alpha: 32.0,
        ..LoraConfig::default()
    };
    let model = Transformer::new(&c, &w, Some(&l)).unwrap();
    randomize_b(&model, 1, 0.01);
    eprintln!("init {:.1}s", t0.elapsed().as_secs_f64());
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let rows: Vec<Vec<u32>> = (0..8)
        .map(|_| (0..160).map(|_| rng.gen_range(0..151_000u32)).collect())
        .collect();
    let ids = ids_tensor(&rows);
    for _ in 0..1 {
        let t0 = std::time::Instant::now();
        let h = model
            .forward(Input::rows(&ids, None), Mode::Grad)
            .unwrap()
            .rows;
        let t1 = t0.elapsed().as_secs_f64();
        let lp = model
            .token_logprobs(
                &h.narrow(1, 0, 159).unwrap(),
                &ids.narrow(1, 1, 159).unwrap(),
                1.0,
                true,
            )
            .unwrap();
        let t2 = t0.elapsed().as_secs_f64();
        let g = lp.logprobs.sum_all().unwrap().backward().unwrap();
        let t3 = t0.elapsed().as_secs_f64();
        eprintln!(
            "forward {t1:.2}s  +logprobs {:.2}s  +backward {:.2}s  total {t3:.2}s ({} grads)",
            t2 - t1,
            t3 - t2,
            g.get_ids().count()
        );
        let t0 = std::time::Instant::now();
        let _ = model
            .sequence_logprobs(&ids, None, Mode::Detached, 1.0, false)
            .unwrap();
        eprintln!(
            "detached forward+logprobs {:.2}s",
            t0.elapsed().as_secs_f64()
        );
    }
}

/// Parity with transformers + peft on a tiny model made by a developer script (not a CI
/// dependency): `PARITY_DIR` holds `base/model.safetensors`, `adapter/` (saved by peft)
/// and `expected.json` (`ids`, `base` and `lora` log-probs, `temperature`).
#[test]
#[ignore]
fn parity_with_transformers_dir() {
    let Ok(dir) = std::env::var("PARITY_DIR") else {
        return;
    };
    let dir = std::path::PathBuf::from(dir);
    let w: Weights =
        candle_core::safetensors::load(dir.join("base/model.safetensors"), &Device::Cpu).unwrap();
    let exp: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap()).unwrap();
    let ids: Vec<u32> = exp["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect();
    let temp = exp["temperature"].as_f64().unwrap();
    let ids = ids_tensor(&[ids]);
    let mut model = Transformer::new(&cfg(), &w, None).unwrap();
    let check = |m: &Transformer, key: &str| {
        let lp: Vec<f32> = m
            .sequence_logprobs(&ids, None, Mode::Detached, temp, false)
            .unwrap()
            .logprobs
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        let want: Vec<f64> = exp[key]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect();
        let d = lp
            .iter()
            .zip(&want)
            .map(|(a, b)| (*a as f64 - b).abs())
            .fold(0.0, f64::max);
        eprintln!("{key}: max |dlogprob| = {d:.2e}");
        assert!(d <= 1e-3, "{key}: {d}");
    };
    check(&model, "base");
    model.load_adapter(&dir.join("adapter")).unwrap();
    check(&model, "lora");
    // Re-save with Concord, for the script to load with peft.
    model
        .save_adapter(&dir.join("concord_adapter"), "tiny")
        .unwrap();
    model.set_adapter_enabled(false);
    check(&model, "base");
}

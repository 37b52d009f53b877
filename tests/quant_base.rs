//! A quantized frozen base (`[model] base_dtype = "q8_0" | "q4_k"`): training through it
//! equals training an all-f32 model whose matrices are its dequantized values, in every
//! layer, with and without activation checkpointing.
use candle_core::{DType, Device, Tensor};
use concord::model::load::{load_model, ModelSpec};
use concord::model::quant::{quantize_weights, BaseDtype, QuantMode, QuantWeights};
use concord::model::{
    random_weights, ArchConfig, Checkpoints, Input, LoraConfig, Mode, Pass, Transformer, Weights,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::util::{all_lora_targets, max_abs, max_abs_diff};

fn cfg() -> ArchConfig {
    crate::util::hidden256()
}

fn lora() -> LoraConfig {
    LoraConfig {
        r: 4,
        alpha: 8.0,
        dropout: 0.0,
        target_modules: all_lora_targets(),
        use_rslora: false,
        init_seed: 7,
    }
}

/// Random weights with a peaky embedding (log-probs far from uniform).
fn dense() -> Weights {
    let mut w = random_weights(&cfg(), 42, DType::F32, &Device::Cpu).unwrap();
    let e = (w["model.embed_tokens.weight"].clone() * 8.0).unwrap();
    w.insert("model.embed_tokens.weight".into(), e);
    w
}

/// The quantized model and the independent truth: an untied all-f32 model whose
/// projections and LM head are the quantized tensors' dequantized values.
fn pair(mode: QuantMode) -> (Transformer, Transformer, QuantWeights) {
    let mut w = dense();
    let q = quantize_weights(&cfg(), &mut w, mode).unwrap();
    let model = Transformer::with_quant(&cfg(), &w, &q, Some(&lora())).unwrap();
    let mut t = w.clone();
    for (name, qw) in &q {
        t.insert(name.clone(), qw.dequantize(DType::F32).unwrap());
    }
    let untied = ArchConfig {
        tie_word_embeddings: false,
        ..cfg()
    };
    let truth = Transformer::new(&untied, &t, Some(&lora())).unwrap();
    for m in [&model, &truth] {
        let mut rng = ChaCha8Rng::seed_from_u64(21);
        for (name, var) in m.lora_vars() {
            if name.contains("lora_B") {
                let vals: Vec<f32> = (0..var.elem_count())
                    .map(|_| 0.05 * (rng.gen::<f32>() * 2.0 - 1.0))
                    .collect();
                var.set(&Tensor::from_vec(vals, var.shape(), &Device::Cpu).unwrap())
                    .unwrap();
            }
        }
    }
    (model, truth, q)
}

fn ids() -> Tensor {
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let v: Vec<u32> = (0..2 * 60).map(|_| rng.gen_range(0..512)).collect();
    Tensor::from_vec(v, (2, 60), &Device::Cpu).unwrap()
}

/// Loss and the gradient of every LoRA tensor, optionally through checkpointing.
fn grads(m: &Transformer, checkpointed: bool) -> (f32, Vec<(String, Tensor)>) {
    let ids = ids();
    let ck = checkpointed.then(Checkpoints::new);
    let h = m
        .forward(
            Input::rows(&ids, None),
            Pass::checkpointed(Mode::Grad, ck.as_ref()),
        )
        .unwrap()
        .rows;
    let lp = m
        .token_logprobs(
            &h.narrow(1, 0, 59).unwrap(),
            &ids.narrow(1, 1, 59).unwrap(),
            1.0,
            false,
        )
        .unwrap();
    let loss = lp.logprobs.mean_all().unwrap().neg().unwrap();
    let value = loss.to_scalar::<f32>().unwrap();
    let mut g = loss.backward().unwrap();
    if let Some(ck) = ck {
        drop((h, lp, loss));
        ck.backward(m, &mut g).unwrap();
    }
    let out = m
        .lora_vars()
        .into_iter()
        .map(|(n, v)| (n, g.get(v.as_tensor()).expect("a LoRA gradient").clone()))
        .collect();
    (value, out)
}

#[test]
fn every_lora_gets_the_gradient_of_the_dequantized_f32_model() {
    use concord::model::quant::type_name;
    for (mode, types) in [
        (QuantMode::Q8_0, ["q8_0", "q8_0"]),
        (QuantMode::Q4K, ["q4_k", "q6_k"]),
    ] {
        let (model, truth, q) = pair(mode);
        for (name, w) in &q {
            let want = if name == "lm_head.weight" {
                types[1]
            } else {
                types[0]
            };
            assert_eq!(type_name(w.dtype()), want, "{name}");
        }
        let (lt, gt) = grads(&truth, false);
        for checkpointed in [false, true] {
            let (lm, gm) = grads(&model, checkpointed);
            assert!(
                (lt - lm).abs() < 1e-5 * (1.0 + lt.abs()),
                "{mode:?}: loss {lm} vs {lt}"
            );
            assert_eq!(gm.len(), 2 * 7 * 2);
            for ((name, a), (_, b)) in gt.iter().zip(&gm) {
                let scale = max_abs(a);
                // Upstream layers included: a gradient that stopped at a quantized
                // matmul would leave layer 0's A and B at zero.
                assert!(
                    scale > 0.0 && max_abs(b) > 0.0,
                    "{mode:?} {name}: no gradient"
                );
                let d = max_abs_diff(a, b);
                assert!(
                    d <= 1e-4 * scale,
                    "{mode:?} ck={checkpointed} {name}: {d} (scale {scale})"
                );
            }
        }
    }
}

/// The quantization is real: the loss moves away from the unquantized model's by far
/// more than the quantized and dequantized paths differ.
#[test]
fn quantization_moves_the_loss() {
    let (model, truth, _) = pair(QuantMode::Q4K);
    let (lq, lt) = (grads(&model, false).0, grads(&truth, false).0);
    // The same adapter on the unquantized weights (head = the embedding, untied).
    let mut w = dense();
    w.insert(
        "lm_head.weight".into(),
        w["model.embed_tokens.weight"].clone(),
    );
    let untied = ArchConfig {
        tie_word_embeddings: false,
        ..cfg()
    };
    let plain = Transformer::new(&untied, &w, Some(&lora())).unwrap();
    for ((_, a), (_, b)) in plain.lora_vars().iter().zip(model.lora_vars().iter()) {
        a.set(b.as_tensor()).unwrap();
    }
    let lp = grads(&plain, false).0;
    assert!(
        (lq - lp).abs() > 1e-3 && (lq - lp).abs() > 100.0 * (lq - lt).abs(),
        "q4_k {lq}, its dequantized f32 model {lt}, unquantized {lp}"
    );
}

#[test]
fn random_shapes_build_a_quantized_base_directly() {
    let load = |b: &str| {
        load_model(&ModelSpec {
            base_dtype: Some(BaseDtype::parse(b).unwrap()),
            ..ModelSpec::new("random:tiny", Device::Cpu)
        })
    };
    // Hidden 64 is not whole 256-blocks: q4_k falls back to Q5_0 there (MLP down, 128
    // inputs, too), the head to Q8_0, as llama.cpp's quantizer does.
    let m = load("q4_k").unwrap().model;
    let types: Vec<(String, usize)> = m
        .base_storage()
        .into_iter()
        .map(|(t, n, _)| (t, n))
        .collect();
    assert_eq!(types, [("q5_0".to_string(), 14), ("q8_0".to_string(), 1)]);
    let m = load("q8_0").unwrap().model;
    let s = m.base_storage();
    assert_eq!(s.len(), 1);
    assert_eq!((s[0].0.as_str(), s[0].1), ("q8_0", 15));
    // 34 bytes per 32 weights.
    let weights: usize = cfg_tiny_projection_weights();
    assert_eq!(s[0].2, weights / 32 * 34);
    let e = format!("{:#}", load("gguf").err().unwrap());
    assert!(e.contains("gguf") && e.contains("not a .gguf file"), "{e}");
}

/// Weights in the tiny shape's projections and (tied) head.
fn cfg_tiny_projection_weights() -> usize {
    let c = ArchConfig::tiny();
    c.tensor_shapes()
        .iter()
        .filter(|(n, _)| n.ends_with("_proj.weight"))
        .map(|(_, s)| s.iter().product::<usize>())
        .sum::<usize>()
        + c.vocab_size * c.hidden_size
}

/// The training-memory estimate counts the copies a quantized base makes: the LM head
/// dequantized for the log-probs (alive until their backward) and the largest
/// projection dequantized for one GEMM call.
#[test]
fn the_memory_estimate_counts_the_dequantized_copies() {
    use concord::model::budget::{TrainMemory, TrainShape};
    let shape = TrainShape::Packed {
        rows: 2,
        width: 60,
        scored: 59,
    };
    let dense = Transformer::new(&cfg(), &dense(), Some(&lora())).unwrap();
    let (quant, _, _) = pair(QuantMode::Q4K);
    let (d, q) = (
        TrainMemory::new(&dense, true).estimate(shape),
        TrainMemory::new(&quant, true).estimate(shape),
    );
    let c = cfg();
    let head = (c.vocab_size * c.hidden_size * 4) as f64;
    let mlp = (c.intermediate_size * c.hidden_size * 4) as f64;
    assert_eq!(q.held - d.held, head);
    assert_eq!(q.transient - d.transient, mlp);
    assert_eq!(
        quant.base_copies(),
        (
            c.vocab_size * c.hidden_size,
            c.intermediate_size * c.hidden_size
        )
    );
    assert_eq!(dense.base_copies(), (0, 0));
}

/// A measurement, not a check (run with `--ignored --nocapture`): a prefill-sized matmul
/// (100 and 683 rows) on a quantized weight, dequantized for the call + GEMM (what
/// Concord does) against candle's quantized matmul (`QMatMul`, 8-bit activations).
#[test]
#[ignore]
fn prefill_dequantize_and_gemm_against_candles_quantized_matmul() {
    use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
    use candle_core::Module;
    use concord::model::ops::{base_linear, BaseWeight};
    use concord::model::quant::QuantWeight;
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    for (ty, n, k) in [(GgmlDType::Q8_0, 4864, 896), (GgmlDType::Q4K, 896, 4864)] {
        let v: Vec<f32> = (0..n * k).map(|_| rng.gen::<f32>() - 0.5).collect();
        let w = Tensor::from_vec(v, (n, k), &Device::Cpu).unwrap();
        let q = QuantWeight::quantize(&w, ty).unwrap();
        let bw = BaseWeight::Quant(q.clone());
        let qm = QMatMul::from_qtensor(QTensor::quantize(&w, ty).unwrap()).unwrap();
        for rows in [100, 683] {
            let x: Vec<f32> = (0..rows * k).map(|_| rng.gen::<f32>() - 0.5).collect();
            let x = Tensor::from_vec(x, (1, rows, k), &Device::Cpu).unwrap();
            let time = |f: &dyn Fn() -> Tensor| {
                let _ = f();
                let t = std::time::Instant::now();
                for _ in 0..5 {
                    let _ = f();
                }
                t.elapsed().as_secs_f64() / 5.0 * 1e3
            };
            let ours = time(&|| base_linear(&x, &bw, None).unwrap());
            let theirs = time(&|| qm.forward(&x).unwrap());
            let d = max_abs_diff(
                &base_linear(&x, &bw, None).unwrap(),
                &qm.forward(&x).unwrap(),
            );
            println!(
                "{ty:?} [{n}, {k}] x {rows} rows: dequantize + GEMM {ours:.2} ms, QMatMul {theirs:.2} ms, max |Δ| {d:.2e}"
            );
        }
    }
}

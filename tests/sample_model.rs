//! Batched group sampling over a tiny random Qwen2 (no files, no tokenizer download).
use candle_core::{DType, Device, Tensor};
use concord::model::Input;
use concord::model::{random_weights, ArchConfig, Mode, Transformer};
use concord::sample::{
    group_requests, sample_requests_on, sample_requests_reusing, sample_turns, ChooseOn,
    Completion, FinishReason, GroupRequest, PromptKv, Reply, SamplingParams, TurnEvent, TurnRow,
    TurnSource,
};

/// A tiny model with peaky next-token distributions (scaled embeddings), so greedy
/// choices are well separated and stop tokens actually get sampled.
fn tiny_model(seed: u64) -> Transformer {
    let cfg = ArchConfig::tiny();
    let mut w = random_weights(&cfg, seed, DType::F32, &Device::Cpu).unwrap();
    let e = w["model.embed_tokens.weight"].clone();
    w.insert("model.embed_tokens.weight".into(), (e * 8.0).unwrap());
    Transformer::new(&cfg, &w, None).unwrap()
}

fn decoder() -> impl Fn(&[u32]) -> anyhow::Result<String> {
    |ids: &[u32]| Ok(ids.iter().map(|i| format!("<{i}>")).collect())
}

fn prompts() -> Vec<Vec<u32>> {
    vec![
        vec![1, 5, 9, 200, 17, 3],
        vec![42, 7],
        vec![300, 301, 302, 11, 12, 13, 14, 15, 99, 100],
        vec![8, 8, 8, 400],
    ]
}

/// Greedy continuation by full recomputation (no cache), one sequence at a time.
fn naive_greedy(model: &Transformer, prompt: &[u32], n: usize) -> Vec<u32> {
    let mut seq = prompt.to_vec();
    for _ in 0..n {
        let ids = Tensor::from_vec(seq.clone(), (1, seq.len()), &Device::Cpu).unwrap();
        let h = model
            .forward(Input::rows(&ids, None), Mode::Detached)
            .unwrap()
            .rows;
        let l = model
            .last_logits(&h)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        let best = (0..l.len()).fold(0, |b, i| if l[i] > l[b] { i } else { b });
        seq.push(best as u32);
    }
    seq[prompt.len()..].to_vec()
}

/// The training forward's log-probs of `completion` after `prompt` at `temperature`.
fn training_logprobs(
    model: &Transformer,
    prompt: &[u32],
    completion: &[u32],
    temperature: f64,
) -> Vec<f32> {
    let seq: Vec<u32> = prompt.iter().chain(completion).copied().collect();
    let ids = Tensor::from_vec(seq.clone(), (1, seq.len()), &Device::Cpu).unwrap();
    let lp = model
        .sequence_logprobs(&ids, None, Mode::Detached, temperature, false)
        .unwrap();
    let lp = lp.logprobs.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    lp[prompt.len() - 1..].to_vec()
}

fn alone(
    model: &Transformer,
    prompt: &[u32],
    p: usize,
    j: usize,
    params: &SamplingParams,
    seed: u64,
    on: ChooseOn,
) -> Completion {
    let dec = decoder();
    let req = [GroupRequest {
        prompt,
        num: 1,
        stream_prompt: p,
        first_sample: j,
    }];
    let (mut out, _) = sample_requests_on(model, &dec, &req, params, seed, on).unwrap();
    out.remove(0).remove(0)
}

/// `g` completions of each prompt, tokens chosen where `on` says.
fn groups(
    model: &Transformer,
    ps: &[Vec<u32>],
    g: usize,
    params: &SamplingParams,
    seed: u64,
    on: ChooseOn,
) -> Vec<Vec<Completion>> {
    let dec = decoder();
    sample_requests_on(model, &dec, &group_requests(ps, g), params, seed, on)
        .unwrap()
        .0
}

fn greedy_batched_equals_single_sequence_path(on: ChooseOn) {
    let model = tiny_model(1);
    let params = SamplingParams::greedy(12);
    let ps = prompts();
    let out = groups(&model, &ps, 2, &params, 0, on);
    for (i, p) in ps.iter().enumerate() {
        let want = naive_greedy(&model, p, 12);
        assert_eq!(out[i].len(), 2);
        for c in &out[i] {
            assert_eq!(c.ids, want, "prompt {i}");
            assert_eq!(c.finish_reason, FinishReason::Length);
            assert!(c.sample_logprobs.iter().all(|&x| x == 0.0));
        }
    }
}

fn every_row_matches_sampling_it_alone(on: ChooseOn) {
    let model = tiny_model(2);
    // stop tokens make rows finish at different steps, exercising batch compaction
    let params = SamplingParams {
        temperature: 1.5,
        top_k: 40,
        top_p: 0.95,
        repetition_penalty: 1.3,
        max_new_tokens: 10,
        stop_token_ids: (0..512).step_by(9).collect(),
        ..Default::default()
    };
    let ps = prompts();
    let out = groups(&model, &ps, 8, &params, 1234, on);
    let mut lengths = std::collections::BTreeSet::new();
    for (i, p) in ps.iter().enumerate() {
        assert_eq!(out[i].len(), 8);
        for (j, c) in out[i].iter().enumerate() {
            let a = alone(&model, p, i, j, &params, 1234, on);
            assert_eq!(c.ids, a.ids, "prompt {i} sample {j}");
            assert_eq!(c.finish_reason, a.finish_reason);
            lengths.insert(c.ids.len());
            for (x, y) in c.sample_logprobs.iter().zip(&a.sample_logprobs) {
                assert!((x - y).abs() < 1e-4);
            }
        }
        // the G completions of a prompt differ (independent streams)
        let distinct: std::collections::BTreeSet<_> =
            out[i].iter().map(|c| c.ids.clone()).collect();
        assert!(distinct.len() > 1, "{:?}", out[i]);
    }
    assert!(
        lengths.len() > 2,
        "rows should finish at different steps: {lengths:?}"
    );
    // same seed, same result; other seed, other result
    let again = groups(&model, &ps, 8, &params, 1234, on);
    assert_eq!(again, out);
    let other = groups(&model, &ps, 8, &params, 99, on);
    assert_ne!(other, out);
}

/// Three completions of every prompt at T = 1: each recorded log-prob (full and
/// sampled: no filter) equals the training forward's within 1e-4.
fn assert_recorded_logprobs_are_the_trainers(model: &Transformer, on: ChooseOn, what: &str) {
    let params = SamplingParams {
        temperature: 1.0,
        max_new_tokens: 8,
        ..Default::default()
    };
    let ps = prompts();
    let out = groups(model, &ps, 3, &params, 5, on);
    for (i, p) in ps.iter().enumerate() {
        for c in &out[i] {
            let want = training_logprobs(model, p, &c.ids, 1.0);
            assert_eq!(want.len(), c.ids.len());
            for (k, w) in want.iter().enumerate() {
                let (full, sampled) = (c.full_logprobs[k], c.sample_logprobs[k]);
                assert!((full - w).abs() < 1e-4, "{what}: {full} vs {w}");
                assert!((sampled - w).abs() < 1e-4, "{what}: {sampled} vs {w}");
            }
        }
    }
}

fn recorded_logprobs_match_training_forward(on: ChooseOn) {
    let model = tiny_model(3);
    assert_recorded_logprobs_are_the_trainers(&model, on, "f32");
    let ps = prompts();
    // with temperature and filters, full log-probs are the trainer's at that temperature
    let params = SamplingParams {
        temperature: 0.7,
        top_k: 5,
        max_new_tokens: 6,
        ..Default::default()
    };
    let out = groups(&model, &ps[..1], 2, &params, 5, on);
    let c = &out[0][0];
    let lp = training_logprobs(&model, &ps[0], &c.ids, 0.7);
    assert_eq!(lp.len(), c.ids.len());
    for ((full, sampled), want) in c.full_logprobs.iter().zip(&c.sample_logprobs).zip(&lp) {
        assert!((full - want).abs() < 1e-4);
        assert!(*sampled >= full - 1e-5);
    }
}

/// A bf16 / f16 base ([`Transformer::set_base_dtype`]): the sampler's recorded log-probs
/// still equal the training forward's, and greedy still equals full recomputation.
fn reduced_precision_base_logprobs_match_training_forward(on: ChooseOn) {
    for dtype in [DType::BF16, DType::F16] {
        let mut model = tiny_model(3);
        model.set_base_dtype(dtype).unwrap();
        assert_recorded_logprobs_are_the_trainers(&model, on, &format!("{dtype:?} base"));
        let ps = prompts();
        let greedy = SamplingParams {
            temperature: 0.0,
            max_new_tokens: 10,
            ..Default::default()
        };
        let out = groups(&model, &ps, 1, &greedy, 1, on);
        for (i, p) in ps.iter().enumerate() {
            assert_eq!(
                out[i][0].ids,
                naive_greedy(&model, p, 10),
                "{dtype:?} prompt {i}"
            );
        }
    }
}

/// A quantized base (hidden 256: every projection Q4_K or Q8_0, the head Q6_K or Q8_0):
/// the sampler's recorded log-probs are the training forward's, and greedy decoding
/// through the cache is full recomputation's.
fn quantized_base_logprobs_match_training_forward(on: ChooseOn) {
    use concord::model::quant::{quantize_weights, QuantMode};
    let cfg = crate::util::hidden256();
    for mode in [QuantMode::Q8_0, QuantMode::Q4K] {
        let mut w = random_weights(&cfg, 3, DType::F32, &Device::Cpu).unwrap();
        let e = w["model.embed_tokens.weight"].clone();
        w.insert("model.embed_tokens.weight".into(), (e * 8.0).unwrap());
        let q = quantize_weights(&cfg, &mut w, mode).unwrap();
        let model = Transformer::with_quant(&cfg, &w, &q, None).unwrap();
        assert!(model.has_quantized_base());
        assert_recorded_logprobs_are_the_trainers(&model, on, &format!("{mode:?} base"));
        let ps = prompts();
        let out = groups(&model, &ps, 1, &SamplingParams::greedy(10), 1, on);
        for (i, p) in ps.iter().enumerate() {
            assert_eq!(
                out[i][0].ids,
                naive_greedy(&model, p, 10),
                "{mode:?} prompt {i}"
            );
        }
    }
}

fn eos_min_new_tokens_and_stop_strings(on: ChooseOn) {
    let model = tiny_model(4);
    let dec = decoder();
    let p = prompts();
    let greedy = naive_greedy(&model, &p[0], 6);
    // the 3rd greedy token as a stop token: finish "eos" after 3 tokens, id kept
    let params = SamplingParams {
        stop_token_ids: vec![greedy[2]],
        ..SamplingParams::greedy(6)
    };
    let out = groups(&model, &p[..1], 1, &params, 0, on);
    let c = &out[0][0];
    let first = greedy.iter().position(|&t| t == greedy[2]).unwrap();
    assert_eq!(c.ids, greedy[..=first].to_vec());
    assert_eq!(c.finish_reason, FinishReason::Eos);
    assert_eq!(c.text, dec(&greedy[..first]).unwrap());
    // min_new_tokens suppresses it: never chosen before, so the length is reached
    let params = SamplingParams {
        stop_token_ids: vec![greedy[0]],
        min_new_tokens: 6,
        ..SamplingParams::greedy(6)
    };
    let out = groups(&model, &p[..1], 1, &params, 0, on);
    assert!(!out[0][0].ids.contains(&greedy[0]));
    assert_eq!(out[0][0].ids.len(), 6);
    // a stop string spanning two tokens ("3><" between tokens 2 and 3 when ids end in 3)
    let text = dec(&greedy).unwrap();
    let t1 = dec(&greedy[..1]).unwrap();
    let stop = text[t1.len() - 2..t1.len() + 2].to_string();
    let params = SamplingParams {
        stop_strings: vec![stop.clone()],
        ..SamplingParams::greedy(6)
    };
    let out = groups(&model, &p[..1], 1, &params, 0, on);
    let c = &out[0][0];
    assert_eq!(c.finish_reason, FinishReason::Stop);
    assert_eq!(c.ids, greedy[..2].to_vec());
    assert_eq!(c.text, text[..text.find(&stop).unwrap()].to_string());
}

/// Greedy and unfiltered sampling walk the vocabulary in the same order on both
/// choosers with the same uniforms, so they pick the same tokens.
#[test]
fn device_and_host_choosers_pick_the_same_tokens() {
    let model = tiny_model(5);
    let ps = prompts();
    for params in [
        SamplingParams::greedy(10),
        SamplingParams {
            temperature: 1.0,
            max_new_tokens: 10,
            ..Default::default()
        },
        SamplingParams {
            temperature: 0.8,
            repetition_penalty: 1.2,
            max_new_tokens: 10,
            ..Default::default()
        },
    ] {
        let host = groups(&model, &ps, 4, &params, 77, ChooseOn::Host);
        let device = groups(&model, &ps, 4, &params, 77, ChooseOn::Device);
        for (h, d) in host.iter().flatten().zip(device.iter().flatten()) {
            assert_eq!(h.ids, d.ids, "{params:?}");
            for (a, b) in h.full_logprobs.iter().zip(&d.full_logprobs) {
                assert!((a - b).abs() < 1e-4, "{a} vs {b}");
            }
            for (a, b) in h.sample_logprobs.iter().zip(&d.sample_logprobs) {
                assert!((a - b).abs() < 1e-4, "{a} vs {b}");
            }
        }
    }
}

/// Prompts that share a 24-token prefix (a system prompt), then differ in length and
/// content; one is the prefix plus a single token.
fn prompts_with_shared_prefix() -> Vec<Vec<u32>> {
    let prefix: Vec<u32> = (0..24).map(|i| 30 + 7 * i).collect();
    let tails: [&[u32]; 4] = [
        &[5],
        &[9, 200, 17, 3],
        &[9, 201],
        &[300, 301, 302, 11, 12, 13],
    ];
    tails
        .iter()
        .map(|t| prefix.iter().chain(t.iter()).copied().collect())
        .collect()
}

/// The shared prefix is prefilled once and copied to every prompt: each completion
/// equals sampling its prompt alone (no sharing), tokens and log-probs, and the
/// recorded log-probs equal the training forward's.
fn shared_prefix_prefill_equals_unshared(on: ChooseOn) {
    let model = tiny_model(4);
    let params = SamplingParams {
        temperature: 1.0,
        max_new_tokens: 8,
        stop_token_ids: (0..512).step_by(11).collect(),
        ..Default::default()
    };
    let ps = prompts_with_shared_prefix();
    let dec = decoder();
    let (out, stats) =
        sample_requests_on(&model, &dec, &group_requests(&ps, 4), &params, 77, on).unwrap();
    // 24 shared tokens computed once instead of 4 times
    assert_eq!(stats.shared_prefix_tokens, 24 * 3);
    assert_eq!(stats.prefill_tokens, ps.iter().map(Vec::len).sum::<usize>());
    for (i, p) in ps.iter().enumerate() {
        for (j, c) in out[i].iter().enumerate() {
            let a = alone(&model, p, i, j, &params, 77, on);
            assert_eq!(c.ids, a.ids, "prompt {i} sample {j}");
            assert_eq!(c.finish_reason, a.finish_reason);
            for (x, y) in c.full_logprobs.iter().zip(&a.full_logprobs) {
                assert!((x - y).abs() < 1e-4, "{x} vs {y}");
            }
            for (k, w) in training_logprobs(&model, p, &c.ids, 1.0).iter().enumerate() {
                assert!(
                    (c.full_logprobs[k] - w).abs() < 1e-4,
                    "{} vs {w}",
                    c.full_logprobs[k]
                );
            }
        }
    }
    // greedy, too: the same tokens as full recomputation
    let greedy = SamplingParams::greedy(10);
    let (out, _) =
        sample_requests_on(&model, &dec, &group_requests(&ps, 1), &greedy, 0, on).unwrap();
    for (i, p) in ps.iter().enumerate() {
        assert_eq!(out[i][0].ids, naive_greedy(&model, p, 10), "prompt {i}");
    }
}

/// A session's next prompts, prefilled on top of the KV of its last ones: each
/// completion equals sampling its prompt alone with a full prefill (tokens, and
/// log-probs to float rounding), and only the tokens after the common prefix count as
/// computed. Row 0 grows its history in the middle (the tail changes), row 1 repeats
/// its prompt, row 2 diverges right after the system prompt, row 3 is a new session,
/// row 4 gets shorter.
#[test]
fn reused_session_prefix_equals_full_prefill() {
    let model = tiny_model(5);
    let params = SamplingParams {
        temperature: 1.0,
        max_new_tokens: 6,
        stop_token_ids: (0..512).step_by(13).collect(),
        ..Default::default()
    };
    let sys: Vec<u32> = (0..20).map(|i| 40 + 3 * i).collect();
    let with = |tail: &[u32]| -> Vec<u32> { sys.iter().chain(tail).copied().collect() };
    let first = [
        with(&[5, 6, 7, 90, 91]),
        with(&[8, 9]),
        with(&[10, 11, 12]),
        with(&[13, 14, 15, 16, 17, 18]),
    ];
    let second = [
        with(&[5, 6, 7, 70, 71, 72, 90, 92]),
        with(&[8, 9]),
        with(&[99, 11, 12, 13]),
        with(&[1, 2, 3]),
        with(&[13, 14]),
    ];
    let dec = decoder();
    let call = |ps: &[Vec<u32>], priors: &[Option<&PromptKv>], seed: u64| {
        let rq = group_requests(ps, 1);
        sample_requests_reusing(&model, &dec, &rq, priors, &params, seed).unwrap()
    };
    let (_, s1, kept) = call(&first, &[None, None, None, None], 3);
    assert_eq!(s1.reused_tokens, 0);
    let kept: Vec<PromptKv> = kept.into_iter().map(Option::unwrap).collect();
    for (k, p) in kept.iter().zip(&first) {
        assert_eq!((&k.tokens, k.kv.len()), (p, p.len()));
    }
    // row 3 is a new session; row 4 continues row 3 of the first call
    let priors = [
        Some(&kept[0]),
        Some(&kept[1]),
        Some(&kept[2]),
        None,
        Some(&kept[3]),
    ];
    let (out, s2, kept2) = call(&second, &priors, 9);
    // reused: 23; 21 and 21 (all but the last token); 20; 0
    assert_eq!(s2.reused_tokens, 23 + 21 + 20 + 21);
    assert_eq!(
        s2.prefill_tokens,
        second.iter().map(Vec::len).sum::<usize>()
    );
    for (i, p) in second.iter().enumerate() {
        let a = alone(&model, p, i, 0, &params, 9, ChooseOn::Host);
        let c = &out[i][0];
        assert_eq!(c.ids, a.ids, "prompt {i}");
        for (x, y) in c.full_logprobs.iter().zip(&a.full_logprobs) {
            assert!((x - y).abs() < 1e-4, "prompt {i}: {x} vs {y}");
        }
        let k = kept2[i].as_ref().unwrap();
        assert_eq!((&k.tokens, k.kv.len()), (p, p.len()));
    }
    // greedy from the reused KV: the same tokens as full recomputation
    let greedy = SamplingParams::greedy(8);
    let rq = group_requests(&second, 1);
    let (out, _, _) = sample_requests_reusing(&model, &dec, &rq, &priors, &greedy, 0).unwrap();
    for (i, p) in second.iter().enumerate() {
        assert_eq!(out[i][0].ids, naive_greedy(&model, p, 8), "prompt {i}");
    }
}

/// An outside side that ends every conversation at its first model turn.
struct EndAll;

impl TurnSource for EndAll {
    fn on_turns(&mut self, events: &[TurnEvent]) -> anyhow::Result<Vec<(usize, Reply)>> {
        Ok(events.iter().map(|e| (e.row, Reply::Done)).collect())
    }
}

/// Single decisions and conversations run on one engine: conversations that end at
/// their first turn are the completions of the same rows, token for token (their
/// cache is sized and compacted differently, and their rows leave the batch at once).
fn a_conversation_ended_at_its_first_turn_is_a_completion(on: ChooseOn) {
    let model = tiny_model(2);
    let params = SamplingParams {
        temperature: 1.5,
        top_k: 40,
        max_new_tokens: 10,
        stop_token_ids: (0..512).step_by(9).collect(),
        seed: 5,
        ..Default::default()
    };
    let ps = prompts();
    let completions = groups(&model, &ps, 3, &params, params.seed, on);
    let rows: Vec<TurnRow> = (0..ps.len())
        .flat_map(|p| {
            (0..3).map(move |j| TurnRow {
                prompt: p,
                stream: (p, j),
            })
        })
        .collect();
    let dec = decoder();
    let (turns, _) = sample_turns(&model, &dec, &ps, &rows, &params, 0, &mut EndAll, on).unwrap();
    let mut finishes = std::collections::BTreeSet::new();
    for (r, t) in rows.iter().zip(&turns) {
        let c = &completions[r.prompt][r.stream.1];
        assert_eq!(t.ids, c.ids, "row {r:?}");
        assert_eq!(t.full_logprobs, c.full_logprobs, "row {r:?}");
        assert_eq!(
            t.truncated,
            c.finish_reason == FinishReason::Length,
            "row {r:?}"
        );
        assert_eq!(t.model_turns, 1);
        finishes.insert(format!("{:?}", c.finish_reason));
    }
    assert_eq!(
        finishes.len(),
        2,
        "rows end by a stop token and by the budget: {finishes:?}"
    );
}

/// Each check runs with tokens chosen on the host and with the device chooser (tensor
/// ops, here on the CPU): `name::host` and `name::device`.
macro_rules! on_both_choosers {
    ($($check:ident),* $(,)?) => {$(
        mod $check {
            #[test]
            fn host() {
                super::$check(super::ChooseOn::Host);
            }

            #[test]
            fn device() {
                super::$check(super::ChooseOn::Device);
            }
        }
    )*};
}

on_both_choosers!(
    greedy_batched_equals_single_sequence_path,
    every_row_matches_sampling_it_alone,
    recorded_logprobs_match_training_forward,
    reduced_precision_base_logprobs_match_training_forward,
    quantized_base_logprobs_match_training_forward,
    eos_min_new_tokens_and_stop_strings,
    shared_prefix_prefill_equals_unshared,
    a_conversation_ended_at_its_first_turn_is_a_completion,
);

#[test]
fn generate_cli_json_shapes() {
    let exe = env!("CARGO_BIN_EXE_concord");
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("m");
    let st = std::process::Command::new(exe)
        .args(["model", "init-tiny", "--out"])
        .arg(&model)
        .output()
        .unwrap();
    assert!(
        st.status.success(),
        "{}",
        String::from_utf8_lossy(&st.stderr)
    );
    let msgs = dir.path().join("m.json");
    std::fs::write(&msgs, r#"[{"role":"user","content":"hi"}]"#).unwrap();
    let jl = dir.path().join("p.jsonl");
    std::fs::write(
        &jl,
        "[{\"role\":\"user\",\"content\":\"a\"}]\n[{\"role\":\"user\",\"content\":\"bcd\"}]\n",
    )
    .unwrap();
    let run = |extra: &[&str]| -> serde_json::Value {
        let out = std::process::Command::new(exe)
            .args(["generate", "--model"])
            .arg(&model)
            .args([
                "--max-new-tokens",
                "3",
                "--num-samples",
                "2",
                "--seed",
                "1",
                "--json",
            ])
            .args(extra)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let v = run(&["--messages", msgs.to_str().unwrap()]);
    assert!(v["prompt_ids"].as_array().unwrap().len() > 3);
    let cs = v["completions"].as_array().unwrap();
    assert_eq!(cs.len(), 2);
    for c in cs {
        assert!(c["ids"].is_array() && c["text"].is_string());
        let fr = c["finish_reason"].as_str().unwrap();
        assert!(fr == "eos" || fr == "length" || fr == "stop");
    }
    assert!(v["stats"]["new_tokens"].as_u64().is_some());
    assert!(v["stats"]["seconds"].as_f64().is_some());
    let v = run(&["--prompts", jl.to_str().unwrap()]);
    let ps = v["prompts"].as_array().unwrap();
    assert_eq!(ps.len(), 2);
    for p in ps {
        assert!(p["prompt_ids"].is_array());
        assert_eq!(p["completions"].as_array().unwrap().len(), 2);
    }
    assert!(v["stats"]["new_tokens"].as_u64().is_some());
}

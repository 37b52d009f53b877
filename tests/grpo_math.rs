//! Pure GRPO pieces against hand-computed numbers. The loss references were computed
//! with TRL's `_compute_loss` code transcribed to torch (float64) on the same inputs;
//! the TRL 1.16 knobs (cispo, sapo, luspo, vespo, top-entropy masking, the entropy
//! bonus, the sampler correction, GDPO) against tests/fixtures/trl_grpo.json, written
//! by scripts/trl_loss_fixtures.py with TRL's own code.
use candle_core::{DType, Device, Tensor, Var};
use concord::config::{
    Config, ImportanceSamplingLevel, ImportanceSamplingMode, LossType, OptimConfig, ScaleRewards,
    Schedule,
};
use concord::grpo::advantage::{
    compute_advantages, normalize_then_sum, std_bessel, weighted_reward,
};
use concord::grpo::correction::{off_policy_keep, SamplerCorrection, Weights};
use concord::grpo::loss::{
    grpo_loss, high_entropy_mask, k3_kl, quantile, LossInputs, LossParams, LossScale, LossStats,
    SapoTemperatures,
};
use concord::learn::optim::{clip_grad_norm, global_norm, AdamW, AdamWParams, LrSchedule};
use std::collections::BTreeMap;

fn close(a: f64, b: f64, tol: f64) -> bool {
    (a - b).abs() <= tol * (1.0 + b.abs())
}

fn assert_vec_close(a: &[f64], b: &[f64], tol: f64) {
    assert_eq!(a.len(), b.len(), "{a:?} vs {b:?}");
    for (x, y) in a.iter().zip(b) {
        assert!(close(*x, *y, tol), "{a:?} vs {b:?}");
    }
}

// ---------------------------------------------------------------- advantages

#[test]
fn advantages_group_batch_none() {
    let r = [1.0, 2.0, 3.0, 4.0];
    let g = compute_advantages(&r, 2, ScaleRewards::Group).unwrap();
    let a = 0.707_006_795_326_683_4;
    assert_vec_close(&g.values, &[-a, a, -a, a], 1e-12);
    assert!(close(g.reward_mean, 2.5, 1e-12));
    assert!(close(g.reward_std, std::f64::consts::FRAC_1_SQRT_2, 1e-12));
    assert_eq!(g.zero_std_groups, 0);

    let b = compute_advantages(&r, 2, ScaleRewards::Batch).unwrap();
    let a = 0.387_268_336_944_351_7;
    assert_vec_close(&b.values, &[-a, a, -a, a], 1e-12);
    assert!(close(b.reward_std, 1.290_994_448_735_805_6, 1e-12));

    let n = compute_advantages(&r, 2, ScaleRewards::None).unwrap();
    assert_vec_close(&n.values, &[-0.5, 0.5, -0.5, 0.5], 1e-12);

    let g3 = compute_advantages(&[1.0, 1.0, 0.0, 1.0, 0.5, 0.2], 3, ScaleRewards::Group).unwrap();
    assert_vec_close(
        &g3.values,
        &[
            0.577_250_286_507_134_4,
            0.577_250_286_507_134_4,
            -1.154_500_573_014_268_6,
            1.071_956_688_002_571_7,
            -0.164_916_413_538_857_14,
            -0.907_040_274_463_714_4,
        ],
        1e-12,
    );
    assert!(close(g3.reward_std, 0.490_747_728_811_181_9, 1e-12));
}

#[test]
fn zero_std_groups_are_counted_and_zero() {
    let r = [0.3, 0.3, 0.3, 1.0, 0.0, 1.0, 2.0, 2.0, 2.0];
    for s in [ScaleRewards::Group, ScaleRewards::Batch, ScaleRewards::None] {
        let a = compute_advantages(&r, 3, s).unwrap();
        assert_eq!(a.zero_std_groups, 2);
        assert!(close(a.frac_reward_zero_std, 2.0 / 3.0, 1e-12));
        for i in [0, 1, 2, 6, 7, 8] {
            assert_eq!(a.values[i], 0.0);
        }
        assert!(a.values[3] > 0.0 && a.values[4] < 0.0);
    }
    assert!(compute_advantages(&[1.0, 2.0, 3.0], 2, ScaleRewards::Group).is_err());
    assert!(compute_advantages(&[1.0, f64::NAN], 2, ScaleRewards::Group).is_err());
    assert!(close(
        std_bessel(&[1.0, 2.0, 3.0, 4.0]),
        1.290_994_448_735_805_6,
        1e-12
    ));
}

#[test]
fn weighted_sum_of_components() {
    let c: BTreeMap<String, f64> = [("a".to_string(), 2.0), ("b".to_string(), -1.0)].into();
    assert_eq!(weighted_reward(&c, 7.0, &BTreeMap::new()), 7.0);
    let w: BTreeMap<String, f64> = [("a".to_string(), 0.5), ("b".to_string(), 2.0)].into();
    assert!(close(weighted_reward(&c, 7.0, &w), -1.0, 1e-12));
}

// ---------------------------------------------------------------- loss

struct Case {
    logp: Tensor,
    old: Tensor,
    reference: Tensor,
    mask: Tensor,
    adv: Tensor,
}

fn case(old_row0: [f64; 3], full_mask: bool) -> Case {
    let d = Device::Cpu;
    let t = |v: &[f64]| {
        Tensor::from_slice(v, (2, 3), &d)
            .unwrap()
            .to_dtype(DType::F32)
            .unwrap()
    };
    let logp = t(&[-1.0, -2.0, -0.5, -0.3, -1.2, -2.0]);
    let mut o = old_row0.to_vec();
    o.extend([-0.3, -1.5, -1.0]);
    let old = t(&o);
    let reference = t(&[-0.9, -2.1, -0.7, -0.4, -1.0, -1.5]);
    let mask = if full_mask {
        t(&[1.0; 6])
    } else {
        t(&[1.0, 1.0, 1.0, 1.0, 1.0, 0.0])
    };
    let adv = Tensor::new(&[1.0f32, -2.0], &d).unwrap();
    Case {
        logp,
        old,
        reference,
        mask,
        adv,
    }
}

fn params(loss_type: LossType, level: ImportanceSamplingLevel) -> LossParams {
    LossParams {
        loss_type,
        level,
        epsilon_low: 0.2,
        epsilon_high: 0.2,
        delta: None,
        beta: 0.0,
        max_completion_length: 4,
        ..LossParams::default()
    }
}

/// Loss value, d loss / d logp, and stats.
fn run(c: &Case, p: &LossParams) -> (f64, Vec<f64>, LossStats) {
    let var = Var::from_tensor(&c.logp).unwrap();
    let mask_rows: Vec<Vec<f32>> = c.mask.to_vec2().unwrap();
    let scale = LossScale::from_masks(mask_rows.iter().map(|r| r.as_slice()));
    let out = grpo_loss(
        &LossInputs {
            logp: var.as_tensor(),
            old_logp: Some(&c.old),
            ref_logp: Some(&c.reference),
            advantages: &c.adv,
            mask: &c.mask,
            entropy: None,
            sampler_logp: None,
        },
        p,
        &scale,
    )
    .unwrap();
    let grads = out.loss.backward().unwrap();
    let g = grads.get(var.as_tensor()).unwrap();
    let g: Vec<f64> = g
        .flatten_all()
        .unwrap()
        .to_dtype(DType::F64)
        .unwrap()
        .to_vec1()
        .unwrap();
    (out.stats.loss, g, out.stats)
}

const OLD0: [f64; 3] = [-1.1, -1.8, -0.5];

#[test]
fn every_loss_type_matches_trl() {
    let c = case(OLD0, false);
    let tok = ImportanceSamplingLevel::Token;
    let expected: [(LossType, f64, [f64; 6]); 4] = [
        (
            LossType::Grpo,
            0.687_612_458_595_73,
            [
                -0.184_195_153_012_607_94,
                -0.136_455_125_512_997,
                -0.166_666_666_666_666_66,
                0.5,
                0.674_929_403_788_001_6,
                0.0,
            ],
        ),
        (
            LossType::Bnpo,
            0.355_163_188_799_675_34,
            [
                -0.221_034_183_615_129_55,
                -0.163_746_150_615_596_4,
                -0.2,
                0.4,
                0.539_943_523_030_401_3,
                0.0,
            ],
        ),
        (
            LossType::DrGrpo,
            0.221_976_992_999_797_1,
            [
                -0.138_146_364_759_455_96,
                -0.102_341_344_134_747_74,
                -0.125,
                0.25,
                0.337_464_701_894_000_8,
                0.0,
            ],
        ),
        (
            LossType::Dapo,
            0.355_163_188_799_675_34,
            [
                -0.221_034_183_615_129_55,
                -0.163_746_150_615_596_4,
                -0.2,
                0.4,
                0.539_943_523_030_401_3,
                0.0,
            ],
        ),
    ];
    for (lt, loss, grad) in expected {
        let (l, g, s) = run(&c, &params(lt, tok));
        assert!(close(l, loss, 1e-5), "{lt:?}: {l} vs {loss}");
        assert_vec_close(&g, &grad, 1e-5);
        assert_eq!(s.clip_region(), 0.0);
        assert_eq!(s.tokens, 5.0);
    }
}

#[test]
fn sequence_level_importance_sampling() {
    let c = case(OLD0, false);
    let seq = ImportanceSamplingLevel::Sequence;
    let (l, g, _) = run(&c, &params(LossType::Dapo, seq));
    assert!(close(l, 0.349_137_733_893_422_9, 1e-5), "{l}");
    let a = -0.193_443_220_096_401_22;
    let b = 0.464_733_697_091_313_24;
    assert_vec_close(&g, &[a, a, a, b, b, 0.0], 1e-5);
    let (l, g, _) = run(&c, &params(LossType::Grpo, seq));
    assert!(close(l, 0.678_226_192_487_280_1, 1e-5), "{l}");
    let a = -0.161_202_683_413_667_64;
    let b = 0.580_917_121_364_141_5;
    assert_vec_close(&g, &[a, a, a, b, b, 0.0], 1e-5);
    // Token-level differs from sequence-level on the same inputs.
    let (lt, _, _) = run(&c, &params(LossType::Dapo, ImportanceSamplingLevel::Token));
    assert!((lt - 0.349_137_733_893_422_9).abs() > 1e-3);
}

#[test]
fn clip_counts_low_high_region() {
    // Token level: row 0 token 0 has w = e^0.3 > 1.2 with A > 0 (high clip, no
    // gradient); row 1 token 2 has w = e^-1 < 0.8 with A < 0 (low clip).
    let c = case([-1.3, -1.8, -0.5], true);
    let (l, g, s) = run(&c, &params(LossType::Dapo, ImportanceSamplingLevel::Token));
    assert!(close(l, 0.546_831_143_679_004_2, 1e-5), "{l}");
    assert_vec_close(
        &g,
        &[
            0.0,
            -0.136_455_125_512_997,
            -0.166_666_666_666_666_66,
            1.0 / 3.0,
            0.449_952_935_858_667_7,
            0.0,
        ],
        1e-5,
    );
    assert!(close(s.clip_low(), 1.0 / 6.0, 1e-9));
    assert!(close(s.clip_high(), 1.0 / 6.0, 1e-9));
    assert!(close(s.clip_region(), 1.0 / 3.0, 1e-9));
    assert_eq!(s.low_clipped, 1.0);
    assert_eq!(s.high_clipped, 1.0);
    // Sequence level with epsilon 0.1: row 1's sequence weight e^(-0.7/3) < 0.9.
    let mut p = params(LossType::Dapo, ImportanceSamplingLevel::Sequence);
    p.epsilon_low = 0.1;
    p.epsilon_high = 0.1;
    let (l, g, s) = run(&c, &p);
    assert!(close(l, 0.383_052_443_243_212_97, 1e-5), "{l}");
    let a = -0.172_315_852_252_262_34;
    assert_vec_close(&g, &[a, a, a, 0.0, 0.0, 0.0], 1e-5);
    assert!(close(s.clip_low(), 0.5, 1e-9));
    assert!(close(s.clip_region(), 0.5, 1e-9));
}

#[test]
fn epsilon_high_and_delta() {
    let c = case(OLD0, false);
    let mut p = params(LossType::Dapo, ImportanceSamplingLevel::Token);
    p.epsilon_high = 0.28;
    p.delta = Some(1.3);
    let (l, g, _) = run(&c, &p);
    assert!(close(l, 0.335_219_665_769_274_1, 1e-5), "{l}");
    assert_vec_close(
        &g,
        &[
            -0.221_034_183_615_129_55,
            -0.163_746_150_615_596_4,
            -0.2,
            0.4,
            0.0,
            0.0,
        ],
        1e-5,
    );
}

#[test]
fn k3_kl_with_beta() {
    let c = case(OLD0, false);
    let mut p = params(LossType::Dapo, ImportanceSamplingLevel::Token);
    p.beta = 0.1;
    let (l, g, s) = run(&c, &p);
    assert!(close(l, 0.356_262_774_107_389_7, 1e-5), "{l}");
    assert_vec_close(
        &g,
        &[
            -0.223_137_601_976_642_5,
            -0.161_842_898_976_315_57,
            -0.196_374_615_061_559_65,
            0.401_903_251_639_280_8,
            0.535_515_467_867_197_8,
            0.0,
        ],
        1e-5,
    );
    assert!(close(s.kl(), 0.010_995_853_077_143_725, 1e-5), "{}", s.kl());
    // k3 is 0 at equality and positive elsewhere.
    let d = Device::Cpu;
    let a = Tensor::new(&[-1.0f32, -2.0, -0.5], &d).unwrap();
    let b = Tensor::new(&[-1.0f32, -1.0, -3.0], &d).unwrap();
    let k: Vec<f32> = k3_kl(&a, &b).unwrap().to_vec1().unwrap();
    assert_eq!(k[0], 0.0);
    assert!(close(k[1] as f64, (1f64).exp() - 2.0, 1e-6));
    assert!(close(k[2] as f64, (-2.5f64).exp() + 1.5, 1e-6));
    // beta > 0 without reference log-probs is an error.
    let out = grpo_loss(
        &LossInputs {
            logp: &c.logp,
            old_logp: None,
            ref_logp: None,
            advantages: &c.adv,
            mask: &c.mask,
            entropy: None,
            sampler_logp: None,
        },
        &p,
        &LossScale {
            num_sequences: 2,
            active_tokens: 5.0,
        },
    );
    assert!(out.is_err());
}

#[test]
fn num_iterations_one_gradient_is_advantage_weighted_logp() {
    // old = logp.detach(): w = 1, gradient of dapo = -A * m / N.
    let c = case(OLD0, false);
    let var = Var::from_tensor(&c.logp).unwrap();
    let out = grpo_loss(
        &LossInputs {
            logp: var.as_tensor(),
            old_logp: None,
            ref_logp: None,
            advantages: &c.adv,
            mask: &c.mask,
            entropy: Some(&c.mask),
            sampler_logp: None,
        },
        &params(LossType::Dapo, ImportanceSamplingLevel::Token),
        &LossScale {
            num_sequences: 2,
            active_tokens: 5.0,
        },
    )
    .unwrap();
    let g: Vec<f32> = out
        .loss
        .backward()
        .unwrap()
        .get(var.as_tensor())
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap();
    assert_vec_close(
        &g.iter().map(|&x| x as f64).collect::<Vec<_>>(),
        &[-0.2, -0.2, -0.2, 0.4, 0.4, 0.0],
        1e-6,
    );
    // -(1*3 - 2*2)/5 = 0.2
    assert!(close(out.stats.loss, 0.2, 1e-6));
    assert!(close(out.stats.entropy(), 1.0, 1e-9));
}

#[test]
fn gradient_accumulation_equals_full_batch_for_every_loss_type() {
    // 4 sequences of uneven lengths, split 1 + 3 and 2 + 2.
    let d = Device::Cpu;
    let logp_v: Vec<f32> = (0..20).map(|i| -0.1 - 0.137 * (i as f32 % 7.0)).collect();
    let old_v: Vec<f32> = logp_v
        .iter()
        .enumerate()
        .map(|(i, x)| x + 0.05 * ((i % 5) as f32 - 2.0))
        .collect();
    let mask_v: Vec<f32> = [5, 2, 4, 1]
        .iter()
        .flat_map(|&n| (0..5).map(move |t| if t < n { 1.0 } else { 0.0 }))
        .collect();
    let adv_v = [0.9f32, -1.3, 0.4, -0.2];
    let logp = Var::from_tensor(&Tensor::from_slice(&logp_v, (4, 5), &d).unwrap()).unwrap();
    let old = Tensor::from_slice(&old_v, (4, 5), &d).unwrap();
    let reference = (&old - 0.03).unwrap();
    let mask = Tensor::from_slice(&mask_v, (4, 5), &d).unwrap();
    let adv = Tensor::from_slice(&adv_v, 4, &d).unwrap();
    let scale = LossScale::from_masks(mask_v.chunks(5));
    assert_eq!(scale.active_tokens, 12.0);
    for lt in [
        LossType::Grpo,
        LossType::Bnpo,
        LossType::DrGrpo,
        LossType::Dapo,
    ] {
        for level in [
            ImportanceSamplingLevel::Token,
            ImportanceSamplingLevel::Sequence,
        ] {
            let mut p = params(lt, level);
            p.beta = 0.05;
            p.max_completion_length = 5;
            let loss_of = |lo: usize, hi: usize| {
                let n = hi - lo;
                let out = grpo_loss(
                    &LossInputs {
                        logp: &logp.as_tensor().narrow(0, lo, n).unwrap(),
                        old_logp: Some(&old.narrow(0, lo, n).unwrap()),
                        ref_logp: Some(&reference.narrow(0, lo, n).unwrap()),
                        advantages: &adv.narrow(0, lo, n).unwrap(),
                        mask: &mask.narrow(0, lo, n).unwrap(),
                        entropy: None,
                        sampler_logp: None,
                    },
                    &p,
                    &scale,
                )
                .unwrap();
                let g = out.loss.backward().unwrap();
                (out.stats, g.get(logp.as_tensor()).unwrap().clone())
            };
            let (full_s, full_g) = loss_of(0, 4);
            for split in [1, 2, 3] {
                let (mut s1, g1) = loss_of(0, split);
                let (s2, g2) = loss_of(split, 4);
                s1.merge(&s2);
                let g = (g1 + g2).unwrap();
                let diff = (g - &full_g)
                    .unwrap()
                    .abs()
                    .unwrap()
                    .max_all()
                    .unwrap()
                    .to_scalar::<f32>()
                    .unwrap();
                assert!(
                    diff < 1e-6,
                    "{lt:?} {level:?} split {split}: grad diff {diff}"
                );
                assert!(close(s1.loss, full_s.loss, 1e-5), "{lt:?} {level:?}");
                assert!(close(s1.kl(), full_s.kl(), 1e-6));
                assert_eq!(s1.tokens, full_s.tokens);
            }
        }
    }
}

// ---------------------------------------------------------------- TRL 1.16 knobs

/// The fixture written by scripts/trl_loss_fixtures.py with TRL 1.16's own loss code.
fn trl_fixture() -> serde_json::Value {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/trl_grpo.json");
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

fn rows_f32(v: &serde_json::Value) -> Vec<Vec<f32>> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|r| {
            r.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap() as f32)
                .collect()
        })
        .collect()
}

fn tensor2(rows: &[Vec<f32>]) -> Tensor {
    let (b, t) = (rows.len(), rows[0].len());
    let flat: Vec<f32> = rows.iter().flatten().copied().collect();
    Tensor::from_vec(flat, (b, t), &Device::Cpu).unwrap()
}

fn flat64(t: &Tensor) -> Vec<f64> {
    t.flatten_all()
        .unwrap()
        .to_dtype(DType::F64)
        .unwrap()
        .to_vec1()
        .unwrap()
}

fn loss_type_named(s: &str) -> LossType {
    serde_json::from_value(serde_json::Value::String(s.into())).unwrap()
}

/// A fixture case's knobs as Concord's loss parameters.
fn fixture_params(c: &serde_json::Value, max_len: usize) -> LossParams {
    let f = |k: &str| c[k].as_f64().unwrap();
    let mut p = LossParams {
        loss_type: loss_type_named(c["loss_type"].as_str().unwrap()),
        level: serde_json::from_value(c["level"].clone()).unwrap(),
        epsilon_low: f("epsilon"),
        epsilon_high: f("epsilon_high"),
        beta: f("beta"),
        max_completion_length: max_len,
        top_entropy_quantile: f("top_entropy_quantile"),
        entropy_coef: f("entropy_coef"),
        ..LossParams::default()
    };
    p.sapo = SapoTemperatures {
        pos: f("sapo_temperature_pos"),
        neg: f("sapo_temperature_neg"),
    };
    p.correction.off_policy_mask_threshold = c["off_policy_mask_threshold"].as_f64();
    if let Some(corr) = c["correction"].as_object() {
        p.correction.apply = true;
        p.correction.mode = serde_json::from_value(corr["mode"].clone()).unwrap();
        p.correction.clip_min = corr["clip_min"].as_f64();
        p.correction.clip_max = corr["clip_max"].as_f64().unwrap_or(f64::INFINITY);
    }
    p
}

#[test]
fn new_losses_match_trl_fixtures() {
    let fx = trl_fixture();
    let inp = &fx["inputs"];
    let logp = tensor2(&rows_f32(&inp["logp"]));
    let old = tensor2(&rows_f32(&inp["old"]));
    let sampler = tensor2(&rows_f32(&inp["sampler"]));
    let reference = tensor2(&rows_f32(&inp["ref"]));
    let mask_rows = rows_f32(&inp["mask"]);
    let mask = tensor2(&mask_rows);
    let entropy = tensor2(&rows_f32(&inp["entropy"]));
    let adv: Vec<f32> = inp["advantages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect();
    let adv = Tensor::from_vec(adv, 3, &Device::Cpu).unwrap();
    let scale = LossScale::from_masks(mask_rows.iter().map(|r| r.as_slice()));
    let max_len = inp["max_completion_length"].as_u64().unwrap() as usize;
    let cases = fx["loss_cases"].as_array().unwrap();
    assert!(cases.len() >= 15);
    for c in cases {
        let name = c["name"].as_str().unwrap();
        let p = fixture_params(c, max_len);
        let lv = Var::from_tensor(&logp).unwrap();
        let ev = Var::from_tensor(&entropy).unwrap();
        let out = grpo_loss(
            &LossInputs {
                logp: lv.as_tensor(),
                old_logp: Some(&old),
                ref_logp: Some(&reference),
                advantages: &adv,
                mask: &mask,
                entropy: Some(ev.as_tensor()),
                sampler_logp: Some(&sampler),
            },
            &p,
            &scale,
        )
        .unwrap();
        let want = c["loss"].as_f64().unwrap();
        assert!(
            close(out.stats.loss, want, 1e-5),
            "{name}: loss {} vs {want}",
            out.stats.loss
        );
        let grads = out.loss.backward().unwrap();
        let g = flat64(grads.get(lv.as_tensor()).unwrap());
        let want_g: Vec<f64> = rows_f32(&c["grad_logp"])
            .iter()
            .flatten()
            .map(|&x| x as f64)
            .collect();
        for (a, b) in g.iter().zip(&want_g) {
            assert!((a - b).abs() < 1e-5, "{name}: d/dlogp {g:?} vs {want_g:?}");
        }
        match c["grad_entropy"].is_null() {
            true => assert!(grads.get(ev.as_tensor()).is_none(), "{name}"),
            false => {
                let g = flat64(grads.get(ev.as_tensor()).unwrap());
                let want: Vec<f64> = rows_f32(&c["grad_entropy"])
                    .iter()
                    .flatten()
                    .map(|&x| x as f64)
                    .collect();
                for (a, b) in g.iter().zip(&want) {
                    assert!((a - b).abs() < 1e-6, "{name}: d/dentropy {g:?} vs {want:?}");
                }
            }
        }
        let s = &out.stats;
        for (metric, v) in c["metrics"].as_object().unwrap() {
            let ours = match metric.as_str() {
                "entropy" => s.entropy(),
                "kl" => s.kl(),
                "policy_loss" => s.policy_loss,
                "entropy_coef" => p.entropy_coef,
                "cispo_clip_ratio" => s.cispo_clip_ratio(),
                "vespo/phi_seq_mean" => s.vespo_phi.mean(),
                "clip_ratio/low_mean" => s.clip_low(),
                "clip_ratio/high_mean" => s.clip_high(),
                "clip_ratio/region_mean" => s.clip_region(),
                "clip_ratio/low_min" => s.clip_low_min(),
                "clip_ratio/high_max" => s.clip_high_max(),
                "sampling/sampling_logp_difference/mean" => s.sampling_logp_diff.mean(),
                "sampling/sampling_logp_difference/max" => s.sampling_logp_diff.max(),
                "sampling/importance_sampling_ratio/min" => s.sampling_ratio.min(),
                "sampling/importance_sampling_ratio/mean" => s.sampling_ratio.mean(),
                "sampling/importance_sampling_ratio/max" => s.sampling_ratio.max(),
                other => panic!("{name}: fixture metric {other} has no Concord counterpart"),
            };
            let v = v.as_f64().unwrap();
            assert!(close(ours, v, 1e-5), "{name}: {metric} {ours} vs {v}");
        }
    }
}

#[test]
fn gdpo_normalize_then_sum_matches_trl() {
    let fx = trl_fixture();
    for c in fx["gdpo_cases"].as_array().unwrap() {
        let names: Vec<String> = c["components"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n.as_str().unwrap().to_string())
            .collect();
        let comps: Vec<BTreeMap<String, f64>> = c["rewards"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                names
                    .iter()
                    .cloned()
                    .zip(r.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()))
                    .collect()
            })
            .collect();
        let weights: BTreeMap<String, f64> = names
            .iter()
            .cloned()
            .zip(
                c["weights"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_f64().unwrap()),
            )
            .collect();
        let g = c["num_generations"].as_u64().unwrap() as usize;
        let refs: Vec<&BTreeMap<String, f64>> = comps.iter().collect();
        let a = normalize_then_sum(&refs, &weights, g).unwrap();
        let want: Vec<f64> = c["advantages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect();
        assert_vec_close(&a.values, &want, 1e-9);
        // The logged reward is the weighted raw sum.
        let raw: Vec<f64> = comps
            .iter()
            .map(|c| weighted_reward(c, 0.0, &weights))
            .collect();
        assert!(close(
            a.reward_mean,
            raw.iter().sum::<f64>() / raw.len() as f64,
            1e-12
        ));
    }
    // Without named components there is nothing to normalise.
    let c = |a: f64, b: f64| BTreeMap::from([("a".to_string(), a), ("b".to_string(), b)]);
    let comps = [c(1.0, 0.0), c(0.0, 10.0)];
    let refs: Vec<&BTreeMap<String, f64>> = comps.iter().collect();
    assert!(normalize_then_sum(&refs, &BTreeMap::new(), 2).is_err());
}

/// Inputs for the accumulation tests: 4 sequences of uneven lengths.
struct Accum {
    logp: Var,
    old: Tensor,
    sampler: Tensor,
    reference: Tensor,
    mask: Tensor,
    adv: Tensor,
    scale: LossScale,
}

fn accum_inputs() -> Accum {
    let d = Device::Cpu;
    let logp_v: Vec<f32> = (0..20).map(|i| -0.1 - 0.137 * (i as f32 % 7.0)).collect();
    let old_v: Vec<f32> = logp_v
        .iter()
        .enumerate()
        .map(|(i, x)| x + 0.05 * ((i % 5) as f32 - 2.0))
        .collect();
    let sampler_v: Vec<f32> = old_v
        .iter()
        .enumerate()
        .map(|(i, x)| x + 0.2 * ((i % 3) as f32 - 1.0))
        .collect();
    let mask_v: Vec<f32> = [5, 2, 4, 1]
        .iter()
        .flat_map(|&n| (0..5).map(move |t| if t < n { 1.0 } else { 0.0 }))
        .collect();
    let old = Tensor::from_slice(&old_v, (4, 5), &d).unwrap();
    Accum {
        logp: Var::from_tensor(&Tensor::from_slice(&logp_v, (4, 5), &d).unwrap()).unwrap(),
        reference: (&old - 0.03).unwrap(),
        old,
        sampler: Tensor::from_slice(&sampler_v, (4, 5), &d).unwrap(),
        mask: Tensor::from_slice(&mask_v, (4, 5), &d).unwrap(),
        adv: Tensor::from_slice(&[0.9f32, -1.3, 0.4, -0.2], 4, &d).unwrap(),
        scale: LossScale::from_masks(mask_v.chunks(5)),
    }
}

impl Accum {
    fn loss(&self, p: &LossParams, lo: usize, hi: usize) -> (LossStats, Tensor) {
        let n = hi - lo;
        let out = grpo_loss(
            &LossInputs {
                logp: &self.logp.as_tensor().narrow(0, lo, n).unwrap(),
                old_logp: Some(&self.old.narrow(0, lo, n).unwrap()),
                ref_logp: Some(&self.reference.narrow(0, lo, n).unwrap()),
                advantages: &self.adv.narrow(0, lo, n).unwrap(),
                mask: &self.mask.narrow(0, lo, n).unwrap(),
                entropy: None,
                sampler_logp: Some(&self.sampler.narrow(0, lo, n).unwrap()),
            },
            p,
            &self.scale,
        )
        .unwrap();
        let g = out.loss.backward().unwrap();
        (out.stats, g.get(self.logp.as_tensor()).unwrap().clone())
    }
}

#[test]
fn gradient_accumulation_equals_full_batch_for_new_losses() {
    let a = accum_inputs();
    for lt in [
        LossType::Cispo,
        LossType::Sapo,
        LossType::Luspo,
        LossType::Vespo,
    ] {
        for level in [
            ImportanceSamplingLevel::Token,
            ImportanceSamplingLevel::Sequence,
        ] {
            for corrected in [false, true] {
                let mut p = params(lt, level);
                p.beta = 0.05;
                p.epsilon_high = 1.1;
                p.max_completion_length = 5;
                p.correction.off_policy_mask_threshold = Some(0.01);
                if corrected {
                    p.correction.apply = true;
                    p.correction.mode = ImportanceSamplingMode::TokenTruncate;
                    p.correction.clip_max = 1.1;
                }
                let (full_s, full_g) = a.loss(&p, 0, 4);
                for split in [1, 2, 3] {
                    let (mut s1, g1) = a.loss(&p, 0, split);
                    let (s2, g2) = a.loss(&p, split, 4);
                    s1.merge(&s2);
                    let diff = flat64(&(g1 + g2 - &full_g).unwrap())
                        .into_iter()
                        .fold(0.0f64, |m, x| m.max(x.abs()));
                    let what = format!("{lt:?} {level:?} corrected {corrected} split {split}");
                    assert!(diff < 1e-6, "{what}: grad diff {diff}");
                    assert!(close(s1.loss, full_s.loss, 1e-5), "{what}");
                    assert!(close(
                        s1.sampling_ratio.mean(),
                        full_s.sampling_ratio.mean(),
                        1e-9
                    ));
                    assert_eq!(s1.sampling_logp_diff.max(), full_s.sampling_logp_diff.max());
                    assert!(close(s1.vespo_phi.mean(), full_s.vespo_phi.mean(), 1e-12));
                    assert_eq!(s1.vespo_phi.count(), full_s.vespo_phi.count());
                    assert_eq!(s1.cispo_clipped, full_s.cispo_clipped, "{what}");
                }
            }
        }
    }
}

#[test]
fn top_entropy_mask_keeps_the_quantile_and_silences_the_rest() {
    // 4 x 5 tokens, all masked, distinct entropies; keep the top 25% = 5 tokens.
    let d = Device::Cpu;
    let ent_v: Vec<f32> = (0..20)
        .map(|i| ((i * 7) % 20) as f32 * 0.1 + 0.05)
        .collect();
    let entropy = Tensor::from_slice(&ent_v, (4, 5), &d).unwrap();
    let logp = Var::from_tensor(&Tensor::full(-1.0f32, (4, 5), &d).unwrap()).unwrap();
    let mask = Tensor::ones((4, 5), DType::F32, &d).unwrap();
    let adv = Tensor::from_slice(&[1.0f32, -1.0, 0.5, 2.0], 4, &d).unwrap();
    let mut p = params(LossType::Dapo, ImportanceSamplingLevel::Token);
    p.top_entropy_quantile = 0.25;
    let out = grpo_loss(
        &LossInputs {
            logp: logp.as_tensor(),
            old_logp: None,
            ref_logp: None,
            advantages: &adv,
            mask: &mask,
            entropy: Some(&entropy),
            sampler_logp: None,
        },
        &p,
        &LossScale {
            num_sequences: 4,
            active_tokens: 20.0,
        },
    )
    .unwrap();
    assert_eq!(out.stats.entropy_kept, 5.0);
    assert!(close(out.stats.entropy_kept_fraction(), 0.25, 1e-12));
    let g = flat64(out.loss.backward().unwrap().get(logp.as_tensor()).unwrap());
    let thr = quantile(&ent_v, 0.75).unwrap();
    for (i, (&e, &gi)) in ent_v.iter().zip(&g).enumerate() {
        if (e as f64) < thr {
            assert_eq!(gi, 0.0, "token {i} below the threshold has a gradient");
        } else {
            assert!(gi != 0.0, "token {i} above the threshold has none");
        }
    }
    // The helper on its own: q = 1 keeps every masked token, padding never.
    let m = high_entropy_mask(&[vec![0.1, 0.5, 0.9]], &[vec![1.0, 1.0, 0.0]], 1.0);
    assert_eq!(m, vec![vec![1.0, 1.0, 0.0]]);
    let m = high_entropy_mask(&[vec![0.1, 0.5, 0.9]], &[vec![1.0, 1.0, 0.0]], 0.0);
    assert_eq!(m, vec![vec![0.0, 1.0, 0.0]]);
}

#[test]
fn mismatch_weights_equal_hand_computed_values() {
    // Old (trainer) log-probs and a sampler that drifted by known amounts.
    let old = vec![vec![-1.0f32, -0.5, -2.0], vec![-0.3, -1.2, -0.7]];
    let drift = [[0.1f32, -0.3, 0.5], [0.02, 0.0, -1.5]];
    let sampler: Vec<Vec<f32>> = old
        .iter()
        .zip(&drift)
        .map(|(o, d)| o.iter().zip(d).map(|(o, d)| o - d).collect())
        .collect();
    let mask = vec![vec![1.0f32, 1.0, 1.0], vec![1.0, 1.0, 0.0]];
    let corr = |mode, clip_min, clip_max| SamplerCorrection {
        apply: true,
        mode,
        clip_min,
        clip_max,
        off_policy_mask_threshold: None,
    };
    let d = |i: usize, j: usize| (old[i][j] as f64 - sampler[i][j] as f64) * mask[i][j] as f64;
    let check = |w: &Weights, want: [[f64; 3]; 2]| {
        for i in 0..2 {
            for j in 0..3 {
                assert!(
                    close(w.rows[i][j] as f64, want[i][j], 1e-6),
                    "{:?} vs {want:?}",
                    w.rows
                );
            }
        }
    };
    // token_truncate at [0.9, 1.2]: exp(0.1), exp(-0.3) -> 0.9, exp(0.5) -> 1.2, ...
    let w =
        corr(ImportanceSamplingMode::TokenTruncate, Some(0.9), 1.2).weights(&old, &sampler, &mask);
    let tt = |i, j| d(i, j).exp().clamp(0.9, 1.2);
    check(&w, [[tt(0, 0), 0.9, 1.2], [tt(1, 0), 1.0, 1.0]]);
    assert!(close(w.rows[0][0] as f64, 0.1f64.exp(), 1e-6));
    // The masked token (row 1, column 2) drifted by 1.5 but counts as no drift.
    assert!(close(w.logp_diff.max(), 0.5, 1e-6));
    assert!(close(
        w.logp_diff.mean(),
        (0.1 + 0.3 + 0.5 + 0.02 + 0.0) / 5.0,
        1e-6
    ));
    assert_eq!(w.ratio.count(), 5.0);
    // token_mask: outside [0.9, 1.2] -> 0.
    let w = corr(ImportanceSamplingMode::TokenMask, Some(0.9), 1.2).weights(&old, &sampler, &mask);
    check(&w, [[0.1f64.exp(), 0.0, 0.0], [0.02f64.exp(), 1.0, 1.0]]);
    assert_eq!(w.ratio.min(), 0.0);
    // sequence_truncate: one weight per row, exp of the summed difference, clamped.
    let w =
        corr(ImportanceSamplingMode::SequenceTruncate, None, 1.2).weights(&old, &sampler, &mask);
    let s0 = (0.1f64 - 0.3 + 0.5).exp().min(1.2);
    let s1 = 0.02f64.exp();
    check(&w, [[s0, s0, s0], [s1, s1, s1]]);
    assert_eq!(w.ratio.count(), 2.0);
    // sequence_mask with TRL's default bound 3: row 0 (e^0.3) kept; at 1.1 dropped.
    let w = corr(ImportanceSamplingMode::SequenceMask, None, 3.0).weights(&old, &sampler, &mask);
    let e3 = 0.3f64.exp();
    check(&w, [[e3, e3, e3], [s1, s1, s1]]);
    let w = corr(ImportanceSamplingMode::SequenceMask, None, 1.1).weights(&old, &sampler, &mask);
    check(&w, [[0.0; 3], [s1, s1, s1]]);
    assert!(close(w.ratio.mean(), s1 / 2.0, 1e-6));
    // The off-policy mask keeps a row unless A < 0 and mean(sampler - policy) over its
    // tokens exceeds the threshold. With the policy at `sampler` and the sampler at
    // `old`, the rows' mean drifts are 0.1 and 0.01.
    let keep = off_policy_keep(&[-0.5, -1.0], &sampler, &old, &mask, 0.05);
    assert_eq!(keep, vec![false, true]);
    let keep = off_policy_keep(&[-0.5, -1.0], &sampler, &old, &mask, 0.005);
    assert_eq!(keep, vec![false, false]);
    let keep = off_policy_keep(&[0.5, 0.0], &sampler, &old, &mask, 0.005);
    assert_eq!(keep, vec![true, true]);
}

// ---------------------------------------------------------------- optimiser

#[test]
fn lr_schedules() {
    let o = OptimConfig {
        learning_rate: 1.0,
        warmup_steps: 2,
        schedule: Schedule::Linear,
        ..OptimConfig::default()
    };
    let s = LrSchedule::from_config(&o, 10);
    let lrs: Vec<f64> = (0..10).map(|i| s.lr(i)).collect();
    assert_vec_close(
        &lrs,
        &[0.0, 0.5, 1.0, 0.875, 0.75, 0.625, 0.5, 0.375, 0.25, 0.125],
        1e-12,
    );
    let s = LrSchedule {
        kind: Schedule::Cosine,
        ..s
    };
    let lrs: Vec<f64> = (0..10).map(|i| s.lr(i)).collect();
    let cos = |p: f64| 0.5 * (1.0 + (std::f64::consts::PI * p).cos());
    let want: Vec<f64> = [0.0, 0.5]
        .into_iter()
        .chain((2..10).map(|i| cos((i - 2) as f64 / 8.0)))
        .collect();
    assert_vec_close(&lrs, &want, 1e-12);
    assert!(close(lrs[6], 0.5, 1e-12));
    let s = LrSchedule {
        kind: Schedule::Constant,
        warmup_steps: 0,
        ..s
    };
    assert!((0..10).all(|i| s.lr(i) == 1.0));
}

#[test]
fn gradient_clipping() {
    let d = Device::Cpu;
    let mut g = vec![
        Tensor::new(&[3.0f32, 0.0], &d).unwrap(),
        Tensor::new(&[[0.0f32], [4.0]], &d).unwrap(),
    ];
    assert!(close(global_norm(&g).unwrap(), 5.0, 1e-12));
    let pre = clip_grad_norm(&mut g, 1.0).unwrap();
    assert!(close(pre, 5.0, 1e-12));
    assert!(close(global_norm(&g).unwrap(), 5.0 / (5.0 + 1e-6), 1e-6));
    let v: Vec<f32> = g[0].to_vec1().unwrap();
    assert!(close(v[0] as f64, 3.0 / (5.0 + 1e-6), 1e-6));
    // Below the threshold nothing changes; 0 disables clipping.
    let pre = clip_grad_norm(&mut g, 10.0).unwrap();
    assert!(close(pre, 1.0, 1e-5));
    let mut h = vec![Tensor::new(&[30.0f32, 40.0], &d).unwrap()];
    assert!(close(clip_grad_norm(&mut h, 0.0).unwrap(), 50.0, 1e-12));
    assert!(close(global_norm(&h).unwrap(), 50.0, 1e-12));
}

#[test]
fn adamw_matches_torch_and_round_trips() {
    // torch.optim.AdamW(lr=0.1, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01) on
    // p = [1, -2], grads [0.5, 0.1] then [-0.3, 0.2]:
    //   step 1: p = p*(1-0.001) - 0.1*sign(g) (bias-corrected ratio ~ 1)
    let d = Device::Cpu;
    let var = Var::from_tensor(&Tensor::new(&[1.0f32, -2.0], &d).unwrap()).unwrap();
    let params = AdamWParams {
        lr: 0.1,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.01,
    };
    let mut opt = AdamW::new(vec![("p".into(), var.clone())], params).unwrap();
    opt.step(&[Tensor::new(&[0.5f32, 0.1], &d).unwrap()])
        .unwrap();
    let p1: Vec<f32> = var.as_tensor().to_vec1().unwrap();
    assert!(close(p1[0] as f64, 0.999 - 0.1, 1e-6), "{p1:?}");
    assert!(close(p1[1] as f64, -1.998 - 0.1, 1e-6), "{p1:?}");
    opt.step(&[Tensor::new(&[-0.3f32, 0.2], &d).unwrap()])
        .unwrap();
    let p2: Vec<f32> = var.as_tensor().to_vec1().unwrap();
    // Hand computation of step 2 (t = 2).
    let step2 = |p: f64, g1: f64, g2: f64| {
        let m = 0.9 * (0.1 * g1) + 0.1 * g2;
        let v = 0.999 * (0.001 * g1 * g1) + 0.001 * g2 * g2;
        let mh = m / (1.0 - 0.81);
        let vh = v / (1.0 - 0.999f64.powi(2));
        p * (1.0 - 0.001) - 0.1 * mh / (vh.sqrt() + 1e-8)
    };
    assert!(
        close(p2[0] as f64, step2(p1[0] as f64, 0.5, -0.3), 1e-5),
        "{p2:?}"
    );
    assert!(
        close(p2[1] as f64, step2(p1[1] as f64, 0.1, 0.2), 1e-5),
        "{p2:?}"
    );

    // Save, continue; load into a fresh optimiser, continue: identical.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("optimizer.safetensors");
    opt.save(&path).unwrap();
    let g3 = Tensor::new(&[0.7f32, -0.4], &d).unwrap();
    opt.step(std::slice::from_ref(&g3)).unwrap();
    let a: Vec<f32> = var.as_tensor().to_vec1().unwrap();
    let var2 = Var::from_tensor(&Tensor::new(p2.as_slice(), &d).unwrap()).unwrap();
    let mut opt2 = AdamW::new(vec![("p".into(), var2.clone())], params).unwrap();
    opt2.load(&path).unwrap();
    assert_eq!(opt2.step_count(), 2);
    opt2.step(&[g3]).unwrap();
    let b: Vec<f32> = var2.as_tensor().to_vec1().unwrap();
    assert_eq!(a, b);
}

#[test]
fn adamw_bf16_params_keep_f32_master() {
    let d = Device::Cpu;
    let var = Var::from_tensor(
        &Tensor::new(&[1.0f32], &d)
            .unwrap()
            .to_dtype(DType::BF16)
            .unwrap(),
    )
    .unwrap();
    let params = AdamWParams {
        lr: 1e-4,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.0,
    };
    let mut opt = AdamW::new(vec![("p".into(), var.clone())], params).unwrap();
    // 1e-4 steps are below bf16 resolution at 1.0 (2^-7); the master accumulates them.
    for _ in 0..100 {
        opt.step(&[Tensor::new(&[1.0f32], &d).unwrap()]).unwrap();
    }
    let v: Vec<f32> = var
        .as_tensor()
        .to_dtype(DType::F32)
        .unwrap()
        .to_vec1()
        .unwrap();
    assert!(close(v[0] as f64, 0.99, 2e-3), "{v:?}");
}

// ---------------------------------------------------------------- config

const GOOD: &str = r#"
[run]
name = "t"
steps = 10

[model]
name = "tiny"

[grpo]
num_generations = 4
temperature = 0.9

[optim]
learning_rate = 5e-6

[env]
name = "ticketmelt"
[env.options]
peers = "mixed"
"#;

#[test]
fn config_parses_and_round_trips() {
    let c = Config::from_toml_str(GOOD, "good.toml", &[]).unwrap();
    assert_eq!(c.grpo.num_generations, 4);
    assert_eq!(c.grpo.temperature, 0.9);
    assert_eq!(c.optim.learning_rate, 5e-6);
    assert_eq!(
        c.env.as_ref().unwrap().options["peers"].as_str(),
        Some("mixed")
    );
    let text = c.to_toml_string().unwrap();
    let back = Config::from_toml_str(&text, "resolved.toml", &[]).unwrap();
    assert_eq!(back, c);
}

#[test]
fn unknown_key_names_key_and_line() {
    let bad = GOOD.replace(
        "learning_rate = 5e-6",
        "learning_rate = 5e-6\nlerning_rate = 1",
    );
    let e = Config::from_toml_str(&bad, "bad.toml", &[])
        .unwrap_err()
        .to_string();
    assert!(e.contains("lerning_rate"), "{e}");
    assert!(e.contains("line 15"), "{e}");
    assert!(e.contains("bad.toml"), "{e}");
    let bad = GOOD.replace("[run]", "[rnu]");
    let e = Config::from_toml_str(&bad, "bad.toml", &[])
        .unwrap_err()
        .to_string();
    assert!(e.contains("rnu") && e.contains("line 2"), "{e}");
    let bad = GOOD.replace("temperature = 0.9", "temperature = \"hot\"");
    let e = Config::from_toml_str(&bad, "bad.toml", &[])
        .unwrap_err()
        .to_string();
    assert!(e.contains("line 11"), "{e}");
}

#[test]
fn range_errors_name_key_and_line() {
    for (from, to, key, line) in [
        (
            "num_generations = 4",
            "num_generations = 1",
            "grpo.num_generations",
            10,
        ),
        (
            "temperature = 0.9",
            "temperature = 0.0",
            "grpo.temperature",
            11,
        ),
        (
            "learning_rate = 5e-6",
            "learning_rate = -1.0",
            "optim.learning_rate",
            14,
        ),
        ("steps = 10", "steps = 0", "run.steps", 4),
    ] {
        let bad = GOOD.replace(from, to);
        let e = Config::from_toml_str(&bad, "r.toml", &[])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(key) && e.contains(&format!("line {line}")),
            "{e}"
        );
    }
    let bad = GOOD.replace(
        "temperature = 0.9",
        "temperature = 0.9\ntop_p = 1.5\nloss_type = \"ppo\"",
    );
    assert!(Config::from_toml_str(&bad, "r.toml", &[]).is_err());
    let bad = GOOD.replace("temperature = 0.9", "top_p = 1.5");
    let e = Config::from_toml_str(&bad, "r.toml", &[])
        .unwrap_err()
        .to_string();
    assert!(e.contains("grpo.top_p"), "{e}");
    let bad = GOOD.replace("temperature = 0.9", "loss_type = \"ppo\"");
    let e = Config::from_toml_str(&bad, "r.toml", &[])
        .unwrap_err()
        .to_string();
    assert!(e.contains("ppo") && e.contains("line 11"), "{e}");
    let bad = GOOD.replace(
        "[env]\nname = \"ticketmelt\"",
        "[env]\nname = \"ticketmelt\"\nfoo = 1",
    );
    let e = Config::from_toml_str(&bad, "r.toml", &[])
        .unwrap_err()
        .to_string();
    assert!(e.contains("foo"), "{e}");
}

#[test]
fn trl_knob_errors_name_key_and_line() {
    // Each bad value on line 12 of GOOD (after `temperature = 0.9`).
    for (line, key) in [
        ("loss_type = \"ppo2\"", "ppo2"),
        ("sapo_temperature_neg = 0.0", "grpo.sapo_temperature_neg"),
        ("vespo_k_pos = -1.0", "grpo.vespo_k_pos"),
        ("vespo_lambda_neg = 0.0", "grpo.vespo_lambda_neg"),
        ("top_entropy_quantile = 1.5", "grpo.top_entropy_quantile"),
        ("entropy_coef = nan", "grpo.entropy_coef"),
        (
            "importance_sampling_clip_max = 0.0",
            "grpo.importance_sampling_clip_max",
        ),
        (
            "importance_sampling_clip_min = -0.5",
            "grpo.importance_sampling_clip_min",
        ),
        (
            "importance_sampling_clip_min = 5.0",
            "grpo.importance_sampling_clip_min",
        ),
        ("importance_sampling_mode = \"seq\"", "seq"),
        ("multi_objective_aggregation = \"mean\"", "mean"),
        (
            "multi_objective_aggregation = \"normalize_then_sum\"",
            "grpo.reward_weights",
        ),
        (
            "off_policy_mask_threshold = -1.0",
            "grpo.off_policy_mask_threshold",
        ),
    ] {
        let bad = GOOD.replace("temperature = 0.9", &format!("temperature = 0.9\n{line}"));
        let e = format!(
            "{:#}",
            Config::from_toml_str(&bad, "k.toml", &[]).unwrap_err()
        );
        assert!(e.contains(key) && e.contains("line 12"), "{line}: {e}");
    }
    // vespo with a sequence-level correction.
    let bad = GOOD.replace(
        "temperature = 0.9",
        "temperature = 0.9\nloss_type = \"vespo\"\nimportance_sampling_correction = true",
    );
    let e = format!(
        "{:#}",
        Config::from_toml_str(&bad, "k.toml", &[]).unwrap_err()
    );
    assert!(
        e.contains("grpo.importance_sampling_mode") && e.contains("token_truncate"),
        "{e}"
    );
    // Good values parse, with TRL's defaults where absent.
    let good = GOOD.replace(
        "temperature = 0.9",
        "temperature = 0.9\nloss_type = \"cispo\"\nepsilon_high = 5.0\ntop_entropy_quantile = 0.2\n\
         entropy_coef = 0.01\nimportance_sampling_correction = true\n\
         importance_sampling_mode = \"token_truncate\"\nimportance_sampling_clip_max = inf\n\
         off_policy_mask_threshold = 0.5\nmulti_objective_aggregation = \"normalize_then_sum\"\n\
         reward_weights = { win = 1.0 }",
    );
    let c = Config::from_toml_str(&good, "g.toml", &[]).unwrap();
    assert_eq!(c.grpo.loss_type, LossType::Cispo);
    assert_eq!(
        c.grpo.importance_sampling_mode,
        ImportanceSamplingMode::TokenTruncate
    );
    assert_eq!(c.grpo.importance_sampling_clip_max, f64::INFINITY);
    assert_eq!(c.grpo.sapo_temperature_neg, 1.05);
    assert_eq!(c.grpo.vespo_lambda_pos, 3.0);
    let back = Config::from_toml_str(&c.to_toml_string().unwrap(), "r.toml", &[]).unwrap();
    assert_eq!(back, c);
    let d = Config::from_toml_str(GOOD, "d.toml", &[]).unwrap();
    assert!(!d.grpo.importance_sampling_correction);
    assert_eq!(
        d.grpo.importance_sampling_mode,
        ImportanceSamplingMode::SequenceMask
    );
    assert_eq!(d.grpo.importance_sampling_clip_max, 3.0);
    assert_eq!(d.grpo.top_entropy_quantile, 1.0);
}

#[test]
fn set_overrides() {
    let sets = [
        "grpo.temperature=0.7".to_string(),
        "model.device=cuda:1".to_string(),
        "env.options.peers=diverse".to_string(),
        "grpo.loss_type=grpo".to_string(),
        "optim.betas=[0.9, 0.99]".to_string(),
    ];
    let c = Config::from_toml_str(GOOD, "good.toml", &sets).unwrap();
    assert_eq!(c.grpo.temperature, 0.7);
    assert_eq!(c.model.device, "cuda:1");
    assert_eq!(c.grpo.loss_type, LossType::Grpo);
    assert_eq!(c.optim.betas, [0.9, 0.99]);
    assert_eq!(c.env.unwrap().options["peers"].as_str(), Some("diverse"));
    let e = Config::from_toml_str(GOOD, "g.toml", &["grpo.temprature=0.7".into()])
        .unwrap_err()
        .to_string();
    assert!(e.contains("temprature"), "{e}");
    let e = Config::from_toml_str(GOOD, "g.toml", &["grpo.temperature=-1".into()])
        .unwrap_err()
        .to_string();
    assert!(e.contains("grpo.temperature") && e.contains("--set"), "{e}");
    assert!(Config::from_toml_str(GOOD, "g.toml", &["temperature".into()]).is_err());
}

#[test]
fn stages_stand_in_for_env() {
    let text = "[model]\nname = \"tiny\"\n[[stage]]\nname = \"a\"\nsteps = 3\nenvs = { ticketmelt = 1.0 }\n[[stage]]\nname = \"b\"\nsteps = 2\nenvs = { merge_ring = 1.0 }\n";
    let c = Config::from_toml_str(text, "s.toml", &[]).unwrap();
    assert_eq!(c.stages.len(), 2);
    assert!(c.env.is_none());
    // Without [env] a stage must name its environments; the error gives the line.
    let text = "[model]\nname = \"tiny\"\n[[stage]]\nname = \"a\"\nsteps = 3\n";
    let e = format!(
        "{:#}",
        Config::from_toml_str(text, "s.toml", &[]).unwrap_err()
    );
    assert!(
        e.contains("line 3") && e.contains("`a`") && e.contains("[env]"),
        "{e}"
    );
    let text = "[model]\nname = \"tiny\"\n";
    let e = Config::from_toml_str(text, "s.toml", &[])
        .unwrap_err()
        .to_string();
    assert!(e.contains("[env]"), "{e}");
}

#[test]
fn shipped_configs_parse() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("configs");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let p = entry.unwrap().path();
        if p.extension().is_some_and(|e| e == "toml") {
            let c = Config::load(&p, &[]).unwrap_or_else(|e| panic!("{}: {e:#}", p.display()));
            assert!(c.run.steps > 0);
            concord::curriculum::build(&c).unwrap_or_else(|e| panic!("{}: {e:#}", p.display()));
            n += 1;
        }
    }
    assert!(n >= 4, "{n} configs");
    let cur = Config::load(&dir.join("ticketmelt-curriculum.toml"), &[]).unwrap();
    let names: Vec<&str> = cur.stages.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["dumb", "mixed", "diverse"]);
    let p =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("configs/ticketmelt-qwen2.5-3b.toml");
    let c = Config::load(&p, &[]).unwrap();
    assert_eq!(c.model.name, "Qwen/Qwen2.5-3B-Instruct");
    assert_eq!(c.lora.r, 16);
    assert_eq!(c.lora.alpha, 32.0);
    assert_eq!(c.lora.targets.len(), 7);
    assert_eq!(c.optim.learning_rate, 5e-6);
    assert_eq!(c.grpo.num_generations, 8);
    assert_eq!(c.grpo.temperature, 0.9);
    assert_eq!(c.optim.max_grad_norm, 0.1);
}

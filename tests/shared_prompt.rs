//! The shared-prompt training forward (`[optim] share_prompt`): a group's prompt runs
//! once, its keys/values (with their graph) shared by the G completions. On a tiny random
//! f32 model it must equal the packed, unshared forward: completion log-probs within
//! 1e-5 and every LoRA gradient within 1e-4 relative, ragged completions included.
use crate::util::{max_abs, max_abs_diff};
use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Tensor};
use concord::config::{GrpoConfig, OptimConfig};
use concord::envs::Reward;
use concord::grpo::advantage::Advantages;
use concord::grpo::batch::Batch;
use concord::grpo::rollout::Rollout;
use concord::grpo::update::Learner;
use concord::learn::forward::{completion_logprobs, completion_logprobs_shared};
use concord::learn::optim::{AdamW, AdamWParams, LrSchedule};
use concord::learn::plan::plan;
use concord::learn::{pack, Packed, Sequence};
use concord::model::budget::{MemoryBudget, TrainMemory};
use concord::model::lora::LoraConfig;
use concord::model::{random_weights, ArchConfig, Mode, Transformer};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::ops::Range;

/// One group of `n` rows: `[0..n]` (clippy reads a one-range literal as a mistake).
fn whole(n: usize) -> Vec<Range<usize>> {
    std::iter::once(0..n).collect()
}

const VOCAB: usize = 64;

/// GQA with 4 query heads per kv head (like 14/2 on Qwen2.5-0.5B, at 8/2).
pub(crate) fn model() -> Transformer {
    model_with_dropout(0.0)
}

/// [`model`] with LoRA dropout `dropout`.
pub(crate) fn model_with_dropout(dropout: f64) -> Transformer {
    let cfg = ArchConfig {
        vocab_size: VOCAB,
        num_attention_heads: 8,
        num_key_value_heads: 2,
        head_dim: 8,
        tie_word_embeddings: false,
        ..ArchConfig::tiny()
    };
    let mut w = random_weights(&cfg, 11, DType::F32, &Device::Cpu).unwrap();
    let e = w["lm_head.weight"].clone();
    w.insert("lm_head.weight".into(), (e * 5.0).unwrap());
    let lora = LoraConfig {
        r: 4,
        alpha: 8.0,
        dropout,
        target_modules: crate::util::all_lora_targets(),
        use_rslora: false,
        init_seed: 5,
    };
    let m = Transformer::new(&cfg, &w, Some(&lora)).unwrap();
    // Nonzero B (PEFT leaves it 0) so that every A gets a gradient too.
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    for (name, var) in m.lora_vars() {
        if name.contains("lora_B") {
            let vals: Vec<f32> = (0..var.elem_count())
                .map(|_| 0.2 * (rng.gen::<f32>() * 2.0 - 1.0))
                .collect();
            var.set(&Tensor::from_vec(vals, var.shape(), &Device::Cpu).unwrap())
                .unwrap();
        }
    }
    m
}

fn rollout(group: usize, prompt: &[u32], comp_len: usize, rng: &mut ChaCha8Rng) -> Rollout {
    let c: Vec<u32> = (0..comp_len)
        .map(|_| rng.gen_range(1..VOCAB as u32))
        .collect();
    Rollout {
        group,
        prompt_ids: prompt.to_vec(),
        env_mask: (0..comp_len)
            .map(|k| if k == 1 { 0.0 } else { 1.0 })
            .collect(),
        completion_ids: c,
        truncated: false,
        text: String::new(),
        reward: Reward::default(),
        scalar: 0.0,
        advantage: rng.gen::<f64>() * 2.0 - 1.0,
        sampler_logp: None,
        forced: false,
    }
}

/// Groups of rollouts: per group (prompt length, completion lengths).
pub(crate) fn groups(spec: &[(usize, &[usize])], seed: u64) -> Vec<Rollout> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut out = Vec::new();
    for (gi, (plen, lens)) in spec.iter().enumerate() {
        let prompt: Vec<u32> = (0..*plen).map(|_| rng.gen_range(1..VOCAB as u32)).collect();
        for &c in lens.iter() {
            out.push(rollout(gi, &prompt, c, &mut rng));
        }
    }
    out
}

/// The rows the learner trains on.
fn sequences(rows: &[Rollout]) -> Vec<Sequence> {
    rows.iter().map(|r| r.sequence(false)).collect()
}

/// sum(logp * mask * advantage) and its gradients.
fn loss_and_grads(p: &Packed, lp: &Tensor) -> GradStore {
    let dev = Device::Cpu;
    let mask = Tensor::from_vec(p.mask.clone(), (p.rows, p.comp_len), &dev).unwrap();
    let adv = Tensor::from_vec(p.advantages.clone(), (p.rows, 1), &dev).unwrap();
    let loss = lp
        .mul(&mask)
        .unwrap()
        .broadcast_mul(&adv)
        .unwrap()
        .sum_all()
        .unwrap();
    loss.backward().unwrap()
}

/// Compare the shared and the packed paths on `rows` split into `ranges`; returns
/// (max |Δ logp| on loss positions, max over vars of max|Δg| / max|g|).
fn compare(rows: &[Rollout], ranges: &[Range<usize>], mode: Mode) -> (f32, f32) {
    let m = model();
    let seqs = sequences(rows);
    let refs: Vec<&Sequence> = seqs.iter().collect();
    let p = pack(&refs, 0).unwrap();
    let (lp_u, _) = completion_logprobs(&m, &p, mode, 0.9, false).unwrap();
    let (lp_s, ent) = completion_logprobs_shared(&m, &p, ranges, mode, 0.9, true).unwrap();
    assert_eq!(lp_s.dims(), lp_u.dims());
    assert_eq!(ent.unwrap().dims(), lp_u.dims());
    // Log-probs on every real completion token.
    let real: Vec<f32> = (0..p.rows)
        .flat_map(|r| {
            let n = rows[r].completion_ids.len();
            (0..p.comp_len).map(move |j| if j < n { 1.0 } else { 0.0 })
        })
        .collect();
    let real = Tensor::from_vec(real, (p.rows, p.comp_len), &Device::Cpu).unwrap();
    let lp_diff = max_abs_diff(
        &lp_u.mul(&real).unwrap().detach(),
        &lp_s.mul(&real).unwrap().detach(),
    );
    assert!(lp_diff <= 1e-5, "log-prob difference {lp_diff}");
    let gu = loss_and_grads(&p, &lp_u);
    let gs = loss_and_grads(&p, &lp_s);
    let mut worst = 0f32;
    for (name, var) in m.lora_vars() {
        let a = gu.get(var.as_tensor()).expect("packed gradient");
        let b = gs
            .get(var.as_tensor())
            .unwrap_or_else(|| panic!("{name}: no gradient through the shared path"));
        let scale = max_abs(a);
        assert!(
            max_abs(b) > 0.0 && scale > 0.0,
            "{name}: zero gradient (shared {}, packed {scale})",
            max_abs(b)
        );
        let rel = max_abs_diff(a, b) / scale;
        assert!(rel <= 1e-4, "{name}: gradient relative difference {rel}");
        worst = worst.max(rel);
    }
    (lp_diff, worst)
}

#[test]
fn shared_prompt_matches_packed_one_group() {
    // One group of G = 5 with ragged completions (a 1-token one among them).
    let rows = groups(&[(9, &[6, 2, 9, 1, 4])], 1);
    let (lp, g) = compare(&rows, &whole(5), Mode::Grad);
    eprintln!("one group: max |dlogp| {lp:e}, max rel grad diff {g:e}");
}

#[test]
fn shared_prompt_matches_packed_several_groups() {
    // Two groups with prompts of different length (left padding in the packed batch)
    // in one micro-batch, a third with every completion of length 1; Train mode with
    // dropout 0 (the dropout seeds do not matter then).
    let rows = groups(&[(5, &[3, 7, 2]), (11, &[4, 4, 1, 8]), (3, &[1, 1])], 2);
    let (lp, g) = compare(&rows, &[0..3, 3..7, 7..9], Mode::Train { dropout_seed: 9 });
    eprintln!("three groups: max |dlogp| {lp:e}, max rel grad diff {g:e}");
}

/// Micro-batches of an unlimited budget: row indices and group ranges.
fn cuts(rows: &[Rollout], active: &[usize], micro: usize) -> Vec<(Vec<usize>, Vec<Range<usize>>)> {
    let m = model();
    plan(
        &sequences(rows),
        active,
        micro,
        true,
        &TrainMemory::new(&m, false),
        &MemoryBudget::default(),
    )
    .unwrap()
    .micro_batches
    .into_iter()
    .map(|mb| (mb.rows, mb.groups.unwrap()))
    .collect()
}

#[test]
fn shared_micro_batches_cut_at_group_boundaries() {
    let rows = groups(&[(4, &[2, 2, 2]), (5, &[2, 2, 2]), (6, &[2, 2, 2])], 3);
    let active: Vec<usize> = (0..9).filter(|&i| i != 4).collect();
    assert_eq!(
        cuts(&rows, &active, 5),
        vec![
            (vec![0, 1, 2, 3, 5], vec![0..3, 3..5]),
            (vec![6, 7, 8], whole(3)),
        ]
    );
    // `micro_batch` caps every micro-batch: a larger group is cut into sub-groups (each
    // runs the prompt again); 0 = everything at once.
    assert_eq!(
        cuts(&rows, &active, 2),
        vec![
            (vec![0, 1], whole(2)),
            (vec![2], whole(1)),
            (vec![3, 5], whole(2)),
            (vec![6, 7], whole(2)),
            (vec![8], whole(1)),
        ]
    );
    assert_eq!(cuts(&rows, &active, 0).len(), 1);
}

/// A collected step made of `rows` (their advantages as given, two groups drawn).
pub fn batch_of(rows: Vec<Rollout>) -> Batch {
    Batch {
        prompts: Vec::new(),
        advantages: Advantages {
            values: rows.iter().map(|r| r.advantage).collect(),
            reward_mean: 0.0,
            reward_std: 0.0,
            zero_std_groups: 0,
            frac_reward_zero_std: 0.0,
        },
        rollouts: rows,
        gen_secs: 0.0,
        score_secs: 0.0,
        prompt_draws: 2,
        frac_zero_std_drawn: 0.0,
        turns: Vec::new(),
    }
}

/// One `Learner::update` (two iterations, so old log-probs are recorded and reused) with
/// `share_prompt` on and off: the same loss, gradient norm and adapter.
#[test]
fn update_with_share_prompt_matches() {
    let run = |share: bool| {
        let m = model();
        let rows = groups(&[(7, &[5, 3, 6, 2]), (4, &[2, 6, 4, 5])], 4);
        let batch = batch_of(rows);
        let g = GrpoConfig {
            num_iterations: 2,
            beta: 0.05,
            ..GrpoConfig::default()
        };
        let o = OptimConfig {
            learning_rate: 1e-3,
            micro_batch: 3,
            share_prompt: share,
            ..OptimConfig::default()
        };
        let mut opt = AdamW::new(m.lora_vars(), AdamWParams::from_config(&o)).unwrap();
        let sched = LrSchedule::from_config(&o, 10);
        let t = std::time::Instant::now();
        let stats = Learner {
            model: &m,
            opt: &mut opt,
            sched: &sched,
            pad_id: 0,
            budget: None,
            dist: &concord::dist::Dist::single(),
        }
        .update(&batch, &g, &o, 0, 17)
        .unwrap();
        let secs = t.elapsed().as_secs_f64();
        let vars: Vec<Tensor> = m
            .lora_vars()
            .iter()
            .map(|(_, v)| v.as_tensor().copy().unwrap())
            .collect();
        (stats, vars, secs)
    };
    let (a, va, ta) = run(false);
    let (b, vb, tb) = run(true);
    eprintln!(
        "update: unshared {} tokens {ta:.3}s, shared {} tokens {tb:.3}s; loss {} vs {}, grad norm {} vs {}",
        a.trained_tokens, b.trained_tokens, a.loss.loss, b.loss.loss, a.grad_norm, b.grad_norm
    );
    assert!(!a.skipped && !b.skipped);
    assert!(b.trained_tokens < a.trained_tokens);
    assert!((a.loss.loss - b.loss.loss).abs() <= 1e-5 * a.loss.loss.abs().max(1e-3));
    assert!((a.grad_norm - b.grad_norm).abs() <= 1e-4 * a.grad_norm);
    let worst = va
        .iter()
        .zip(&vb)
        .map(|(x, y)| max_abs_diff(x, y))
        .fold(0f32, f32::max);
    // Two AdamW steps of 1e-3: the adapters agree far below the step size.
    assert!(worst <= 1e-5, "adapter difference {worst}");
}

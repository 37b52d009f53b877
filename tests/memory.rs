//! Training memory: micro-batches cut to `[optim] memory_budget_gb` give the same update
//! as one micro-batch, a row too big for the budget is an error naming the numbers, and
//! activation checkpointing (`[optim] gradient_checkpointing`) gives the plain path's
//! LoRA gradients. On the tiny random f32 model of `shared_prompt`.
use crate::shared_prompt::{batch_of, groups, model, model_with_dropout};
use crate::util::{max_abs, max_abs_diff};
use candle_core::backprop::GradStore;
use candle_core::{Device, Tensor};
use concord::config::{Config, GrpoConfig, OptimConfig};
use concord::grpo::rollout::Rollout;
use concord::grpo::update::{Learner, UpdateStats};
use concord::learn::optim::{AdamW, AdamWParams, LrSchedule};
use concord::learn::{pack, Forward, Packed, Sequence};
use concord::model::budget::{TrainMemory, TrainShape, GB};
use concord::model::{Checkpoints, Mode, Transformer};
use std::ops::Range;

/// Two groups of four ragged completions (prompts of 7 and 4 tokens).
fn rows() -> Vec<Rollout> {
    groups(&[(7, &[5, 3, 6, 2]), (4, &[2, 6, 4, 5])], 4)
}

/// One `Learner::update` (two iterations, KL on) of [`rows`] on a fresh [`model`].
fn update(o: &OptimConfig) -> anyhow::Result<(UpdateStats, Vec<Tensor>)> {
    let m = model();
    let rows = rows();
    let batch = batch_of(rows);
    let g = GrpoConfig {
        num_iterations: 2,
        beta: 0.05,
        ..GrpoConfig::default()
    };
    let mut opt = AdamW::new(m.lora_vars(), AdamWParams::from_config(o))?;
    let sched = LrSchedule::from_config(o, 10);
    let stats = Learner {
        model: &m,
        opt: &mut opt,
        sched: &sched,
        pad_id: 0,
        budget: None,
        dist: &concord::dist::Dist::single(),
    }
    .update(&batch, &g, o, 0, 17)?;
    let vars = m
        .lora_vars()
        .iter()
        .map(|(_, v)| v.as_tensor().copy())
        .collect::<candle_core::Result<_>>()?;
    Ok((stats, vars))
}

fn optim(share_prompt: bool, budget_gb: Option<f64>, checkpointing: bool) -> OptimConfig {
    OptimConfig {
        learning_rate: 1e-3,
        share_prompt,
        memory_budget_gb: budget_gb,
        gradient_checkpointing: checkpointing,
        ..OptimConfig::default()
    }
}

/// Same loss, gradient norm and adapter.
fn assert_same(a: &(UpdateStats, Vec<Tensor>), b: &(UpdateStats, Vec<Tensor>), what: &str) {
    let (sa, va) = a;
    let (sb, vb) = b;
    assert!(!sa.skipped && !sb.skipped, "{what}: skipped");
    assert!(
        (sa.loss.loss - sb.loss.loss).abs() <= 1e-5 * sa.loss.loss.abs().max(1e-3),
        "{what}: loss {} vs {}",
        sa.loss.loss,
        sb.loss.loss
    );
    assert!(
        (sa.grad_norm - sb.grad_norm).abs() <= 1e-4 * sa.grad_norm,
        "{what}: grad norm {} vs {}",
        sa.grad_norm,
        sb.grad_norm
    );
    let worst = va
        .iter()
        .zip(vb)
        .map(|(x, y)| max_abs_diff(x, y))
        .fold(0f32, f32::max);
    // Two AdamW steps of 1e-3: the adapters agree far below the step size.
    assert!(worst <= 1e-5, "{what}: adapter difference {worst}");
}

#[test]
fn budget_split_gives_the_same_update() {
    let m = model();
    let mem = TrainMemory::new(&m, false);
    for share in [false, true] {
        // Room for about two rows: several micro-batches, and with shared prompts both
        // groups of four cut into sub-groups that each run their prompt again.
        let two_rows = match share {
            false => TrainShape::Packed {
                rows: 2,
                width: 13,
                scored: 6,
            },
            true => TrainShape::Shared {
                prompt: 7,
                rows: 2,
                completion: 6,
            },
        };
        let budget = mem.estimate(two_rows).bytes() / GB;
        let whole = update(&optim(share, Some(1000.0), false)).unwrap();
        let split = update(&optim(share, Some(budget), false)).unwrap();
        assert_eq!(whole.0.plan.micro_batches.len(), 1, "share {share}");
        let mbs = &split.0.plan.micro_batches;
        assert!(mbs.len() >= 3, "share {share}: {} micro-batches", mbs.len());
        assert!(mbs.iter().all(|mb| mb.bytes <= budget * GB));
        if share {
            let sub_groups: usize = mbs.iter().map(|mb| mb.groups.as_ref().unwrap().len()).sum();
            assert!(sub_groups >= 4, "{sub_groups} sub-groups");
        }
        eprintln!("share {share}: {}", split.0.plan.summary());
        assert!(split.0.plan.summary().contains("budget"));
        assert_same(&whole, &split, &format!("share {share}"));
        // `micro_batch` stays an upper bound under a large budget.
        let capped = update(&OptimConfig {
            micro_batch: 3,
            ..optim(share, Some(1000.0), false)
        })
        .unwrap();
        assert!(capped.0.plan.max_rows() <= 3);
        assert_same(&whole, &capped, &format!("share {share}, micro_batch 3"));
    }
}

#[test]
fn a_row_over_the_budget_is_an_error_with_the_numbers() {
    for share in [false, true] {
        let e = update(&optim(share, Some(0.1), false)).unwrap_err();
        let msg = format!("{e:#}");
        assert!(
            msg.contains("needs about")
                && msg.contains("over the budget of 100 MB ([optim] memory_budget_gb)")
                && msg.contains("gradient_checkpointing = true (about"),
            "{msg}"
        );
        // With checkpointing already on, it is not suggested again.
        let e = update(&optim(share, Some(0.1), true)).unwrap_err();
        let msg = format!("{e:#}");
        assert!(
            msg.contains("needs about") && !msg.contains("gradient_checkpointing"),
            "{msg}"
        );
    }
}

/// The 0.5B's estimator (the budget's numbers below are the real runs').
fn qwen05(checkpointing: bool) -> TrainMemory {
    let c = concord::model::ArchConfig::qwen25_05b();
    TrainMemory::from_config(
        &c,
        candle_core::DType::F32,
        Some(&concord::model::lora::LoraConfig::default()),
        concord::model::default_logprob_chunk(c.vocab_size),
        checkpointing,
    )
}

#[test]
fn a_full_length_completion_over_the_budget_is_said_before_training() {
    use concord::learn::plan::long_row_warning;
    use concord::model::budget::MemoryBudget;
    // The Whispers episode run on the real 0.5B (15.15 GB budget): a 1,951-token
    // trajectory was refused at about 24 GB, but only after five minutes of sampling;
    // its decision-mode runs (160 tokens, 1.6-2.9 GB a row) trained.
    let budget = MemoryBudget::resolve(Some(15.15), &Device::Cpu);
    let w = long_row_warning(&qwen05(false), &budget, 4096).expect("4096 tokens warned");
    assert!(w.contains("max_completion_length = 4096"), "{w}");
    assert!(w.contains("gradient_checkpointing = true"), "{w}");
    assert!(w.contains("15.15 GB ([optim] memory_budget_gb)"), "{w}");
    assert_eq!(long_row_warning(&qwen05(false), &budget, 160), None);
    assert_eq!(long_row_warning(&qwen05(true), &budget, 4096), None);
    // Checkpointing already on: the advice is the other two levers only.
    let small = MemoryBudget::resolve(Some(0.5), &Device::Cpu);
    let w = long_row_warning(&qwen05(true), &small, 4096).expect("over 0.5 GB");
    assert!(!w.contains("gradient_checkpointing"), "{w}");
    assert!(w.contains("memory_budget_gb"), "{w}");
}

/// sum(logp * mask * advantage) of packed rows and its gradients, with the
/// checkpointed backward finished when `ck` is given.
fn grads(m: &Transformer, p: &Packed, groups: Option<&[Range<usize>]>, ck: bool) -> GradStore {
    let checkpoints = Checkpoints::new();
    let f = Forward {
        model: m,
        mode: Mode::Train { dropout_seed: 5 },
        checkpoints: ck.then_some(&checkpoints),
        base_only: false,
    };
    let (lp, _) = match groups {
        Some(g) => f.logprobs_shared(p, g, 0.9, true).unwrap(),
        None => f.logprobs(p, 0.9, true).unwrap(),
    };
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
    let mut g = loss.backward().unwrap();
    assert_eq!(
        checkpoints.len(),
        usize::from(ck) * groups.map_or(1, |g| g.len())
    );
    checkpoints.backward(m, &mut g).unwrap();
    assert!(checkpoints.is_empty());
    g
}

#[test]
fn gradient_checkpointing_matches_the_plain_backward() {
    // LoRA dropout on: the recomputation must draw the same masks.
    let m = model_with_dropout(0.1);
    let rows: Vec<Sequence> = rows().iter().map(|r| r.sequence(false)).collect();
    let refs: Vec<&Sequence> = rows.iter().collect();
    let p = pack(&refs, 0).unwrap();
    let ranges = [0..4, 4..8];
    for groups in [None, Some(&ranges[..])] {
        let plain = grads(&m, &p, groups, false);
        let ck = grads(&m, &p, groups, true);
        let mut worst = 0f32;
        for (name, var) in m.lora_vars() {
            let a = plain.get(var.as_tensor()).expect("plain gradient");
            let b = ck
                .get(var.as_tensor())
                .unwrap_or_else(|| panic!("{name}: no checkpointed gradient"));
            let scale = max_abs(a);
            assert!(scale > 0.0, "{name}: zero gradient");
            let rel = max_abs_diff(a, b) / scale;
            assert!(rel <= 1e-5, "{name}: relative difference {rel}");
            worst = worst.max(rel);
        }
        eprintln!(
            "checkpointing, shared {}: max relative gradient difference {worst:e}",
            groups.is_some()
        );
    }
}

#[test]
fn update_with_gradient_checkpointing_matches() {
    for share in [false, true] {
        let plain = update(&optim(share, Some(1000.0), false)).unwrap();
        let ck = update(&optim(share, Some(1000.0), true)).unwrap();
        assert_same(&plain, &ck, &format!("checkpointing, share {share}"));
    }
}

/// The error for `[optim]` lines `optim` in an otherwise valid config.
fn optim_err(optim: &str) -> String {
    let text = format!(
        "[run]\nname = \"r\"\n[model]\nname = \"tiny\"\n[optim]\n{optim}\n[env]\nname = \"ticketmelt\"\n"
    );
    format!(
        "{:#}",
        Config::from_toml_str(&text, "c.toml", &[]).unwrap_err()
    )
}

#[test]
fn memory_keys_are_validated_with_key_and_line() {
    for bad in [
        "memory_budget_gb = 0",
        "memory_budget_gb = -2.5",
        "memory_budget_gb = nan",
    ] {
        let e = optim_err(bad);
        assert!(
            e.starts_with("c.toml: line 6:") && e.contains("optim.memory_budget_gb"),
            "{bad}: {e}"
        );
    }
    // Wrong types: the line and section (as for every key), and the value.
    let e = optim_err("memory_budget_gb = \"lots\"");
    assert!(
        e.contains("line 6") && e.contains("[optim]") && e.contains("lots"),
        "{e}"
    );
    let e = optim_err("gradient_checkpointing = \"yes\"");
    assert!(
        e.contains("line 6") && e.contains("[optim]") && e.contains("yes"),
        "{e}"
    );
    let e = optim_err("gradient_checkpoint = true");
    assert!(
        e.contains("line 6") && e.contains("gradient_checkpoint"),
        "{e}"
    );
    // Valid values parse, and an unset budget stays unset in the written config.
    let text = "[run]\nname = \"r\"\n[model]\nname = \"tiny\"\n[optim]\nmemory_budget_gb = 12.5\ngradient_checkpointing = true\n[env]\nname = \"ticketmelt\"\n";
    let c = Config::from_toml_str(text, "c.toml", &[]).unwrap();
    assert_eq!(c.optim.memory_budget_gb, Some(12.5));
    assert!(c.optim.gradient_checkpointing);
    let c = Config::from_toml_str(text, "c.toml", &["optim.memory_budget_gb=3".into()]).unwrap();
    assert_eq!(c.optim.memory_budget_gb, Some(3.0));
    let d = Config::from_toml_str(
        "[run]\nname = \"r\"\n[model]\nname = \"tiny\"\n[env]\nname = \"ticketmelt\"\n",
        "c.toml",
        &[],
    )
    .unwrap();
    assert!(!d.to_toml_string().unwrap().contains("memory_budget_gb"));
}

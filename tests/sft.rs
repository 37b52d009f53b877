//! Supervised fine-tuning: the loss against a hand computation, the completion-only
//! mask, bad data refused before anything is written, and the warm start into GRPO
//! through `[model] adapter`.
use candle_core::{DType, Device, Tensor};
use concord::learn::{pack, Sequence};
use concord::model::lora::LoraConfig;
use concord::model::Input;
use concord::model::{random_weights, ArchConfig, Checkpoints, Mode, Transformer};
use concord::sft::data::parse_jsonl;
use concord::sft::loss::sft_loss;
use concord::sft::trainer::{micro_step, micro_step_shared};
use std::path::Path;

fn model() -> Transformer {
    let cfg = ArchConfig {
        vocab_size: 32,
        ..ArchConfig::tiny()
    };
    let w = random_weights(&cfg, 11, DType::F32, &Device::Cpu).unwrap();
    let lora = LoraConfig {
        r: 4,
        alpha: 8.0,
        target_modules: crate::util::all_lora_targets(),
        ..LoraConfig::default()
    };
    Transformer::new(&cfg, &w, Some(&lora)).unwrap()
}

fn row(prompt: &[u32], completion: &[u32]) -> Sequence {
    Sequence::demonstration(prompt, completion)
}

/// ln softmax(logits)[target] of every next token of `ids`, from the full `[T, V]`
/// logits in f64: the hand computation, by another path than the chunked log-probs.
fn full_logprobs(m: &Transformer, ids: &[u32]) -> Vec<f64> {
    let t = Tensor::new(ids, &Device::Cpu)
        .unwrap()
        .unsqueeze(0)
        .unwrap();
    let h = m
        .forward(Input::rows(&t, None), Mode::Detached)
        .unwrap()
        .rows;
    let logits: Vec<Vec<f32>> = m.logits(&h).unwrap().squeeze(0).unwrap().to_vec2().unwrap();
    (0..ids.len() - 1)
        .map(|i| {
            let z: Vec<f64> = logits[i].iter().map(|&x| x as f64).collect();
            let max = z.iter().cloned().fold(f64::MIN, f64::max);
            let lse = max + z.iter().map(|x| (x - max).exp()).sum::<f64>().ln();
            z[ids[i + 1] as usize] - lse
        })
        .collect()
}

#[test]
fn sft_loss_of_fixed_log_probs_is_the_masked_mean() {
    let lp = Tensor::new(&[[-1.0f32, -2.0, -7.0], [-3.0, -0.5, -9.0]], &Device::Cpu).unwrap();
    let mask = Tensor::new(&[[1.0f32, 1.0, 0.0], [1.0, 1.0, 0.0]], &Device::Cpu).unwrap();
    // (1 + 2 + 3 + 0.5) / 4 tokens; the masked -7 and -9 count for nothing.
    let l: f32 = sft_loss(&lp, &mask, 4.0).unwrap().to_scalar().unwrap();
    assert!((l - 1.625).abs() < 1e-6, "{l}");
    // A micro-batch's share: the divisor is the whole batch's token count.
    let l: f32 = sft_loss(&lp, &mask, 8.0).unwrap().to_scalar().unwrap();
    assert!((l - 0.8125).abs() < 1e-6, "{l}");
}

/// Two demonstrations of different lengths in one padded micro-batch: the loss is the
/// hand-computed mean NLL of the 2 + 3 completion tokens, and neither prompt tokens nor
/// padding add to it.
#[test]
fn sft_loss_matches_hand_computation_and_only_completion_tokens_count() {
    let m = model();
    let (a_p, a_c) = (vec![1u32, 2, 3, 4], vec![5u32, 6]);
    let (b_p, b_c) = (vec![7u32, 8], vec![9u32, 10, 11]);
    let ra = row(&a_p, &a_c);
    let rb = row(&b_p, &b_c);
    let packed = pack(&[&ra, &rb], 0).unwrap();
    // Exactly the completion tokens are masked in.
    assert_eq!(packed.mask.iter().sum::<f32>(), 5.0);
    let (loss, hits) = micro_step(&m, &packed, 5.0, Mode::Grad, None).unwrap();
    let loss = loss.to_scalar::<f32>().unwrap() as f64;

    let la = full_logprobs(&m, &[a_p.clone(), a_c.clone()].concat());
    let lb = full_logprobs(&m, &[b_p.clone(), b_c.clone()].concat());
    // Next-token log-probs of the completion tokens only: positions len(prompt)-1.. .
    let comp: f64 =
        la[a_p.len() - 1..].iter().sum::<f64>() + lb[b_p.len() - 1..].iter().sum::<f64>();
    let hand = -comp / 5.0;
    assert!((loss - hand).abs() < 1e-4, "loss {loss} vs hand {hand}");
    // Counting the prompt tokens too would give another number.
    let all: f64 = la.iter().sum::<f64>() + lb.iter().sum::<f64>();
    let with_prompt = -all / (la.len() + lb.len()) as f64;
    assert!((loss - with_prompt).abs() > 1e-2, "{loss} vs {with_prompt}");
    assert!(hits <= 5);

    // Changing a prompt changes the loss only through the context; changing a padded
    // position's id (not a completion token) changes nothing.
    let mut p2 = packed.clone();
    let pad_col = p2.width - 1; // row 0's last column is padding (2 < 3 completion tokens)
    assert_eq!(p2.attention[pad_col], 0);
    p2.ids[pad_col] = 13;
    p2.targets[2] = 13;
    let (l2, _) = micro_step(&m, &p2, 5.0, Mode::Grad, None).unwrap();
    assert!((l2.to_scalar::<f32>().unwrap() as f64 - loss).abs() < 1e-6);

    // The gradient reaches the LoRA B matrices (they start at zero).
    let grads = micro_step(&m, &packed, 5.0, Mode::Grad, None)
        .unwrap()
        .0
        .backward()
        .unwrap();
    let b = m
        .lora_vars()
        .into_iter()
        .find(|(k, _)| k.contains("lora_B"))
        .unwrap()
        .1;
    let g = grads.get(b.as_tensor()).unwrap();
    assert!(crate::util::max_abs(g) > 0.0);
}

/// The tiny model with nonzero LoRA weights (B starts at zero, which would hide errors
/// in the adapter's gradients).
fn model_with_lora() -> Transformer {
    let m = model();
    for (i, (_, v)) in m.lora_vars().iter().enumerate() {
        let t = v.as_tensor();
        let vals: Vec<f32> = (0..t.elem_count())
            .map(|k| 0.05 * (((k * 7 + i * 13) % 11) as f32 - 5.0) / 5.0)
            .collect();
        v.set(&Tensor::from_vec(vals, t.shape(), t.device()).unwrap())
            .unwrap();
    }
    m
}

/// Three demonstrations with an 18-token common prompt prefix and tails of their own.
fn shared_prompt_rows() -> [Sequence; 3] {
    let sys: Vec<u32> = (0..18).map(|i| (i * 5 + 3) % 31 + 1).collect();
    let with = |tail: &[u32]| -> Vec<u32> { sys.iter().chain(tail).copied().collect() };
    [
        row(&with(&[4, 9, 2]), &[5, 6]),
        row(&with(&[7]), &[9, 10, 11]),
        row(&with(&[12, 13, 14, 15, 16]), &[17]),
    ]
}

/// Demonstrations that share a system prompt: putting the prefix through the model
/// once gives the loss, the token hits and every LoRA gradient of the packed forward.
#[test]
fn shared_prefix_micro_step_equals_the_packed_one() {
    let m = model_with_lora();
    let rows = shared_prompt_rows();
    let refs: Vec<&Sequence> = rows.iter().collect();
    let (lp, hp) = micro_step(&m, &pack(&refs, 0).unwrap(), 6.0, Mode::Grad, None).unwrap();
    let (ls, hs) = micro_step_shared(&m, &refs, 0, 6.0, Mode::Grad, None)
        .unwrap()
        .expect("18 shared tokens");
    let (a, b) = (
        lp.to_scalar::<f32>().unwrap(),
        ls.to_scalar::<f32>().unwrap(),
    );
    assert!((a - b).abs() < 1e-5, "loss {a} vs {b}");
    assert_eq!(hp, hs);
    let (gp, gs) = (lp.backward().unwrap(), ls.backward().unwrap());
    for (name, v) in m.lora_vars() {
        let x = gp.get(v.as_tensor()).unwrap();
        let y = gs.get(v.as_tensor()).unwrap();
        let diff = crate::util::max_abs(&(x - y).unwrap());
        assert!(
            diff < 1e-5 * crate::util::max_abs(x).max(1.0),
            "{name}: {diff}"
        );
    }
    // Too short a common prefix (or one row) falls back to the packed forward.
    let short = [row(&[1, 2, 3], &[4]), row(&[1, 2, 5], &[6])];
    let short: Vec<&Sequence> = short.iter().collect();
    assert!(micro_step_shared(&m, &short, 0, 2.0, Mode::Grad, None)
        .unwrap()
        .is_none());
    assert!(micro_step_shared(&m, &refs[..1], 0, 2.0, Mode::Grad, None)
        .unwrap()
        .is_none());
}

/// Activation checkpointing recomputes the layers in the backward: the packed and the
/// shared-prefix micro-steps give the same loss and every LoRA gradient as without it.
#[test]
fn checkpointed_micro_steps_equal_the_plain_ones() {
    let m = model_with_lora();
    let rows = shared_prompt_rows();
    let refs: Vec<&Sequence> = rows.iter().collect();
    let packed = pack(&refs, 0).unwrap();
    let grads_of = |shared: bool, ck: bool| {
        let c = ck.then(Checkpoints::new);
        let (l, _) = match shared {
            true => micro_step_shared(&m, &refs, 0, 6.0, Mode::Grad, c.as_ref())
                .unwrap()
                .unwrap(),
            false => micro_step(&m, &packed, 6.0, Mode::Grad, c.as_ref()).unwrap(),
        };
        let loss = l.to_scalar::<f32>().unwrap();
        let mut g = l.backward().unwrap();
        if let Some(c) = &c {
            // the layers were checkpointed: their LoRA gradients come from the recompute
            let missing = m
                .lora_vars()
                .iter()
                .filter(|(_, v)| g.get(v.as_tensor()).is_none())
                .count();
            assert!(missing > 0, "shared {shared}: nothing was checkpointed");
            c.backward(&m, &mut g).unwrap();
        }
        (loss, g)
    };
    for shared in [false, true] {
        let (a, ga) = grads_of(shared, false);
        let (b, gb) = grads_of(shared, true);
        assert!((a - b).abs() < 1e-6, "shared {shared}: loss {a} vs {b}");
        for (name, v) in m.lora_vars() {
            let x = ga.get(v.as_tensor()).unwrap();
            let y = gb
                .get(v.as_tensor())
                .unwrap_or_else(|| panic!("shared {shared}: no gradient for {name}"));
            let diff = crate::util::max_abs(&(x - y).unwrap());
            assert!(
                diff < 1e-5 * crate::util::max_abs(x).max(1.0),
                "shared {shared}, {name}: {diff}"
            );
        }
    }
}

#[test]
fn bad_jsonl_lines_name_the_file_line_and_field() {
    let good = r#"{"messages":[{"role":"user","content":"hi"}],"completion":"ok"}"#;
    let cases = [
        ("not json", "line 2: not valid JSON"),
        ("[1, 2]", "line 2: expected an object"),
        (r#"{"completion":"x"}"#, "line 2: `messages`: missing"),
        (
            r#"{"messages":"hi","completion":"x"}"#,
            "line 2: `messages`: expected a list",
        ),
        (
            r#"{"messages":[],"completion":"x"}"#,
            "line 2: `messages`: the message list is empty",
        ),
        (
            r#"{"messages":[{"role":"robot","content":"x"}],"completion":"x"}"#,
            "line 2: `messages`: message 1: unknown role `robot`",
        ),
        (
            r#"{"messages":[{"role":"user","content":"x"}]}"#,
            "line 2: `completion`: missing",
        ),
        (
            r#"{"messages":[{"role":"user","content":"x"}],"completion":3}"#,
            "line 2: `completion`: expected a string",
        ),
        (
            r#"{"messages":[{"role":"user","content":"x"}],"completion":""}"#,
            "line 2: `completion`: is empty",
        ),
    ];
    for (bad, want) in cases {
        let text = format!("{good}\n{bad}\n{good}\n");
        let e = parse_jsonl(&text, "data.jsonl").unwrap_err().to_string();
        assert!(e.starts_with("data.jsonl: "), "{e}");
        assert!(e.contains(want), "{bad}: {e}");
    }
    let ok = parse_jsonl(&format!("{good}\n\n{good}\n"), "d.jsonl").unwrap();
    assert_eq!(ok.len(), 2);
    assert_eq!(ok[0].completion, "ok");
    let e = parse_jsonl("\n\n", "d.jsonl").unwrap_err().to_string();
    assert!(e.contains("no demonstrations"), "{e}");
}

fn sft_config(dir: &Path, data: &Path, extra: &str) -> std::path::PathBuf {
    let toml = format!(
        r#"
[run]
name = "sft"
output_dir = "{out}"
steps = 2
save_every = 2
[model]
name = "{model}"
init_tiny = true
[lora]
r = 4
alpha = 8
dropout = 0.0
[sft]
source = "jsonl"
path = "{data}"
steps = 4
batch_size = 2
learning_rate = 1e-2
[grpo]
num_generations = 2
prompts_per_step = 1
max_completion_length = 4
[optim]
learning_rate = 1e-3
micro_batch = 1
[env]
name = "ticketmelt"
{extra}
"#,
        out = dir.display(),
        model = dir.join("tiny").display(),
        data = data.display()
    );
    let p = dir.join("sft.toml");
    std::fs::write(&p, toml).unwrap();
    p
}

/// `concord sft` on bad data fails naming file, line and field, and writes nothing;
/// on good data it writes TRL's SFT columns, lowers the loss and saves an adapter that
/// `[model] adapter` starts a GRPO run from (recorded in its config.toml).
#[test]
fn sft_cli_refuses_bad_data_and_trains_an_adapter_grpo_starts_from() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("demos.jsonl");
    let demo = |c: &str| {
        format!(
            r#"{{"messages":[{{"role":"system","content":"Answer in JSON."}},{{"role":"user","content":"Which server?"}}],"completion":"{c}"}}"#
        )
    };
    std::fs::write(
        &data,
        format!(
            "{}\n{{\"messages\":[{{\"role\":\"user\",\"content\":\"x\"}}],\"completion\":7}}\n",
            demo("A")
        ),
    )
    .unwrap();
    let cfg = sft_config(dir.path(), &data, "");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_concord"))
        .args(["sft", "--config", cfg.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "{}: line 2: `completion`: expected a string",
            data.display()
        )),
        "{err}"
    );
    assert!(
        !dir.path().join("sft").exists(),
        "a run directory was written"
    );

    let lines: Vec<String> = (0..4)
        .map(|i| {
            demo(&format!(
                r#"{{\"commitment\":\"DEPLOY_PROD_{}\"}}"#,
                ["A", "B"][i % 2]
            ))
        })
        .collect();
    std::fs::write(&data, lines.join("\n")).unwrap();
    crate::util::concord_ok(&["sft", "--config", cfg.to_str().unwrap()]);
    let run = dir.path().join("sft");
    let log = concord::run::log::TrainingLog::read(&run.join("training_log.csv")).unwrap();
    for c in [
        "loss",
        "grad_norm",
        "learning_rate",
        "num_tokens",
        "mean_token_accuracy",
    ] {
        assert!(log.column(c).is_some(), "no {c} column: {:?}", log.header);
    }
    let loss = log.column("loss").unwrap();
    assert_eq!(loss.len(), 4);
    assert!(loss[3] < loss[0], "{loss:?}");
    assert!(run.join("adapter_model.safetensors").exists());
    assert!(run.join("checkpoint-4").exists());

    // GRPO from that adapter: config.toml records it, and the run's adapter starts from
    // the SFT values (nonzero B) rather than a fresh LoRA.
    let grpo = dir.path().join("grpo.toml");
    let text = std::fs::read_to_string(&cfg)
        .unwrap()
        .replace("name = \"sft\"", "name = \"grpo\"")
        .replace(
            "[model]\n",
            &format!("[model]\nadapter = \"{}\"\n", run.display()),
        );
    std::fs::write(&grpo, text).unwrap();
    crate::util::concord_ok(&["train", "--config", grpo.to_str().unwrap()]);
    // The recorded config names the adapter relative to its own run directory, so
    // the pair can move together, and loading it resolves to the SFT run.
    let saved_path = dir.path().join("grpo/config.toml");
    let saved = std::fs::read_to_string(&saved_path).unwrap();
    assert!(saved.contains("adapter = \"../sft\""), "{saved}");
    let reloaded = concord::config::Config::load(&saved_path, &[]).unwrap();
    let adapter = reloaded.model.adapter.clone().unwrap();
    assert_eq!(
        std::fs::canonicalize(adapter).unwrap(),
        std::fs::canonicalize(&run).unwrap()
    );
    let b = concord::model::lora::read_peft_tensors(&dir.path().join("grpo")).unwrap();
    let nonzero_b = b
        .iter()
        .filter(|(k, _)| k.contains("lora_B"))
        .any(|(_, (_, v))| v.iter().any(|x| *x != 0.0));
    assert!(nonzero_b);
}

/// `demos.jsonl` in `dir`: four one-line demonstrations.
pub(crate) fn four_demonstrations(dir: &Path) -> std::path::PathBuf {
    let data = dir.join("demos.jsonl");
    let lines: Vec<String> = (0..4)
        .map(|i| {
            format!(
                r#"{{"messages":[{{"role":"user","content":"Which server, {i}?"}}],"completion":"DEPLOY_PROD_{}"}}"#,
                ["A", "B"][i % 2]
            )
        })
        .collect();
    std::fs::write(&data, lines.join("\n")).unwrap();
    data
}

/// SFT cuts its micro-batches to the memory budget like GRPO (no `micro_batch` set):
/// a budget that holds one demonstration but not two splits every batch of 2, and the
/// log is the same as with one micro-batch (the loss is normalised by the batch's
/// tokens, so accumulation is exact).
#[test]
fn sft_splits_micro_batches_to_the_memory_budget_with_the_same_log() {
    let dir = tempfile::tempdir().unwrap();
    let data = four_demonstrations(dir.path());
    let run = |name: &str, budget_gb: f64| {
        let cfg = sft_config(dir.path(), &data, "");
        let text = std::fs::read_to_string(&cfg)
            .unwrap()
            .replace("name = \"sft\"", &format!("name = \"{name}\""))
            .replace(
                "micro_batch = 1",
                &format!("memory_budget_gb = {budget_gb:e}"),
            );
        std::fs::write(&cfg, text).unwrap();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_concord"))
            .args(["sft", "--config", cfg.to_str().unwrap()])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(out.status.success(), "{err}");
        let log =
            concord::run::log::TrainingLog::read(&dir.path().join(name).join("training_log.csv"))
                .unwrap();
        (err, log)
    };
    let (err, whole) = run("whole", 100.0);
    assert!(err.contains("-> 1 micro-batch of up to 2 rows"), "{err}");
    // "... (largest N MB)": the two-row micro-batch; one row needs less (by one row's
    // activations, several MB for these demonstrations), so 2 MB under it holds one.
    let two_rows_mb: f64 = err
        .split("(largest ")
        .nth(1)
        .and_then(|s| s.split(" MB)").next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no micro-batch estimate in: {err}"));
    let (err, split) = run("split", (two_rows_mb - 2.0) * 1e-3);
    assert!(err.contains("-> 2 micro-batches of up to 1 rows"), "{err}");
    for c in ["loss", "grad_norm", "mean_token_accuracy"] {
        let (a, b) = (whole.column(c).unwrap(), split.column(c).unwrap());
        assert_eq!(a.len(), 4);
        for (x, y) in a.iter().zip(b.iter()) {
            assert!((x - y).abs() <= 1e-5 * (1.0 + x.abs()), "{c}: {x} vs {y}");
        }
    }
}

/// `[optim] gradient_checkpointing` serves SFT too: the same log as without it. A
/// demonstration that does not fit the memory budget alone stops the run before its
/// first step, naming the demonstration and what to change, with no step logged.
#[test]
fn sft_checkpoints_layers_and_checks_every_demonstration_before_step_one() {
    let dir = tempfile::tempdir().unwrap();
    let data = four_demonstrations(dir.path());
    let run = |name: &str, extra: &str| {
        let cfg = sft_config(dir.path(), &data, "");
        let text = std::fs::read_to_string(&cfg)
            .unwrap()
            .replace("name = \"sft\"", &format!("name = \"{name}\""))
            .replace("micro_batch = 1", &format!("micro_batch = 1\n{extra}"));
        std::fs::write(&cfg, text).unwrap();
        std::process::Command::new(env!("CARGO_BIN_EXE_concord"))
            .args(["sft", "--config", cfg.to_str().unwrap()])
            .output()
            .unwrap()
    };
    let log = |name: &str| {
        concord::run::log::TrainingLog::read(&dir.path().join(name).join("training_log.csv"))
            .unwrap()
    };
    let plain = run("plain", "");
    assert!(
        plain.status.success(),
        "{}",
        String::from_utf8_lossy(&plain.stderr)
    );
    let ck = run("ck", "gradient_checkpointing = true");
    assert!(
        ck.status.success(),
        "{}",
        String::from_utf8_lossy(&ck.stderr)
    );
    // "sft step 1: memory: estimate N MB per row": less with the layers recomputed
    let estimate = |out: &std::process::Output| -> f64 {
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        let tail = err
            .split("memory: estimate ")
            .nth(1)
            .unwrap_or_else(|| panic!("{err}"));
        let mut words = tail.split_whitespace();
        let x: f64 = words.next().unwrap().parse().unwrap();
        x * match words.next().unwrap() {
            "GB" => 1e3,
            "MB" => 1.0,
            "kB" => 1e-3,
            u => panic!("unit {u}"),
        }
    };
    assert!(
        estimate(&ck) < estimate(&plain),
        "{} vs {}",
        estimate(&ck),
        estimate(&plain)
    );
    let (a, b) = (log("plain"), log("ck"));
    for c in ["loss", "grad_norm", "mean_token_accuracy"] {
        let (x, y) = (a.column(c).unwrap(), b.column(c).unwrap());
        assert_eq!(x.len(), 4);
        for (x, y) in x.iter().zip(y.iter()) {
            assert!((x - y).abs() <= 1e-5 * (1.0 + x.abs()), "{c}: {x} vs {y}");
        }
    }
    let tight = run("tight", "memory_budget_gb = 1e-6");
    let err = String::from_utf8_lossy(&tight.stderr).to_string();
    assert!(!tight.status.success());
    assert!(
        err.contains("demonstration 1 of 4")
            && err.contains("memory: one sequence")
            && err.contains("gradient_checkpointing = true")
            && err.contains("shorten the demonstrations"),
        "{err}"
    );
    let rows = dir.path().join("tight/training_log.csv");
    assert!(
        !rows.exists() || std::fs::read_to_string(&rows).unwrap().lines().count() <= 1,
        "a step was logged"
    );
}

//! The GRPO loop on a tiny random Qwen2 (no tokenizer, no download): LoRA gradient vs
//! finite differences, learnability on a toy reward (and its sign-flipped control),
//! NaN-skip and resume equivalence.
use crate::util::{column, read_csv};
use candle_core::{DType, Device, Tensor};
use concord::config::{Config, EnvConfig, LossType, Schedule};
use concord::envs::Reward;
use concord::grpo::loss::{grpo_loss, LossInputs, LossParams, LossScale};
use concord::grpo::trainer::Trainer;
use concord::learn::forward::completion_logprobs;
use concord::learn::{pack, Sequence};
use concord::model::lora::LoraConfig;
use concord::model::{random_weights, ArchConfig, Mode, Transformer};
use concord::run::log::TIMING_COLUMNS;
use concord::sample::Completion;
use concord::task::{IdRenderer, Renderer, Task, TaskPrompt};
use std::collections::BTreeMap;
use std::path::Path;

const VOCAB: usize = 32;
const TARGET: u32 = 5;

fn tiny_model(dropout: f64) -> Transformer {
    let cfg = ArchConfig {
        vocab_size: VOCAB,
        tie_word_embeddings: false,
        ..ArchConfig::tiny()
    };
    let mut w = random_weights(&cfg, 7, DType::F32, &Device::Cpu).unwrap();
    // A larger (untied) LM head so logits have a usable range: a random tied head makes
    // the model repeat its last input token almost surely.
    let e = w["lm_head.weight"].clone();
    w.insert("lm_head.weight".into(), (e * 5.0).unwrap());
    let lora = LoraConfig {
        r: 8,
        alpha: 16.0,
        dropout,
        target_modules: crate::util::all_lora_targets(),
        use_rslora: false,
        init_seed: 3,
    };
    Transformer::new(&cfg, &w, Some(&lora)).unwrap()
}

/// Reward = share of completion tokens equal to TARGET.
struct TokenShare;

impl Task for TokenShare {
    fn name(&self) -> String {
        "token_share".into()
    }
    fn prompts(
        &mut self,
        seed: u64,
        n: usize,
        _r: &dyn Renderer,
    ) -> anyhow::Result<Vec<TaskPrompt>> {
        Ok((0..n)
            .map(|i| {
                let ids: Vec<u32> = (0..4)
                    .map(|k| ((seed as usize + 3 * i + k) % VOCAB) as u32)
                    .collect();
                TaskPrompt {
                    text: format!("{ids:?}"),
                    ids,
                    state: Box::new(()),
                    contest: None,
                }
            })
            .collect())
    }
    fn score(&self, _p: &TaskPrompt, c: &Completion) -> anyhow::Result<Reward> {
        let share =
            c.ids.iter().filter(|&&t| t == TARGET).count() as f64 / c.ids.len().max(1) as f64;
        Ok(Reward {
            components: BTreeMap::from([("share".to_string(), share)]),
            scalar: share,
        })
    }
}

fn config(dir: &Path, name: &str, steps: usize) -> Config {
    let mut c = Config::default();
    c.run.name = name.into();
    c.run.output_dir = dir.to_path_buf();
    c.run.steps = steps;
    c.run.save_every = 0;
    c.run.log_samples = 2;
    c.model.name = "tiny-random".into();
    c.grpo.num_generations = 8;
    c.grpo.prompts_per_step = 4;
    c.grpo.max_completion_length = 8;
    c.grpo.temperature = 1.0;
    c.optim.learning_rate = 2e-2;
    c.optim.max_grad_norm = 1.0;
    c.optim.schedule = Schedule::Constant;
    c.env = Some(EnvConfig::new("token_share", Default::default()));
    c
}

fn trainer(cfg: Config, dropout: f64, resume: bool) -> Trainer {
    let mut t = Trainer::new(
        cfg,
        tiny_model(dropout),
        Box::new(IdRenderer),
        Box::new(TokenShare),
        "tiny-random".into(),
        resume,
    )
    .unwrap();
    t.quiet = true;
    t
}

fn lora_snapshot(m: &Transformer) -> Vec<Vec<f32>> {
    m.lora_vars()
        .iter()
        .map(|(_, v)| {
            v.as_tensor()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap()
        })
        .collect()
}

#[test]
fn lora_gradient_matches_finite_differences() {
    let model = tiny_model(0.0);
    // Non-zero B so every LoRA parameter has a gradient.
    for (i, (_, v)) in model.lora_vars().iter().enumerate() {
        let t = v.as_tensor();
        let n = t.elem_count();
        let vals: Vec<f32> = (0..n)
            .map(|k| 0.05 * (((k * 7 + i * 13) % 11) as f32 - 5.0) / 5.0)
            .collect();
        v.set(&Tensor::from_vec(vals, t.shape(), t.device()).unwrap())
            .unwrap();
    }
    let mk = |p: Vec<u32>, c: Vec<u32>, a: f64, old: Vec<f32>| Sequence {
        advantage: a,
        old_logp: Some(old),
        ..Sequence::demonstration(&p, &c)
    };
    let rows = [
        mk(
            vec![1, 2, 3],
            vec![5, 6, 7, 8],
            1.0,
            vec![-3.3, -3.5, -3.4, -3.6],
        ),
        mk(vec![4, 9], vec![10, 5], -0.7, vec![-3.2, -3.6]),
    ];
    let refs: Vec<&Sequence> = rows.iter().collect();
    let packed = pack(&refs, 0).unwrap();
    let params = LossParams {
        loss_type: LossType::Dapo,
        level: concord::config::ImportanceSamplingLevel::Token,
        epsilon_low: 0.99,
        epsilon_high: 10.0,
        delta: None,
        beta: 0.1,
        max_completion_length: 4,
        ..LossParams::default()
    };
    let scale = LossScale {
        num_sequences: 2,
        active_tokens: 6.0,
    };
    let dev = Device::Cpu;
    let mask = Tensor::from_vec(packed.mask.clone(), (2, packed.comp_len), &dev).unwrap();
    let adv = Tensor::from_vec(packed.advantages.clone(), 2, &dev).unwrap();
    let old = Tensor::from_vec(packed.old_logp.clone(), (2, packed.comp_len), &dev).unwrap();
    model.set_adapter_enabled(false);
    let (reference, _) = completion_logprobs(&model, &packed, Mode::Detached, 0.9, false).unwrap();
    model.set_adapter_enabled(true);
    let loss_at = |mode: Mode| -> (f64, Option<candle_core::backprop::GradStore>) {
        let (lp, _) = completion_logprobs(&model, &packed, mode, 0.9, false).unwrap();
        let out = grpo_loss(
            &LossInputs {
                logp: &lp,
                old_logp: Some(&old),
                ref_logp: Some(&reference),
                advantages: &adv,
                mask: &mask,
                entropy: None,
                sampler_logp: None,
            },
            &params,
            &scale,
        )
        .unwrap();
        let g = if mode == Mode::Grad {
            Some(out.loss.backward().unwrap())
        } else {
            None
        };
        (out.stats.loss, g)
    };
    let (_, grads) = loss_at(Mode::Grad);
    let grads = grads.unwrap();
    let vars = model.lora_vars();
    let mut checked = 0;
    for (name, var) in vars
        .iter()
        .filter(|(n, _)| n.contains("layers.0.") || n.contains("layers.1.mlp.down"))
    {
        let g: Vec<f32> = grads
            .get(var.as_tensor())
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        // The two largest-magnitude entries of this parameter.
        let mut idx: Vec<usize> = (0..g.len()).collect();
        idx.sort_by(|&a, &b| g[b].abs().partial_cmp(&g[a].abs()).unwrap());
        for &k in idx.iter().take(2) {
            let base: Vec<f32> = var.as_tensor().flatten_all().unwrap().to_vec1().unwrap();
            let h = 1e-2f32;
            let mut plus = base.clone();
            plus[k] += h;
            var.set(&Tensor::from_vec(plus, var.as_tensor().shape(), &dev).unwrap())
                .unwrap();
            let (lp, _) = loss_at(Mode::Detached);
            let mut minus = base.clone();
            minus[k] -= h;
            var.set(&Tensor::from_vec(minus, var.as_tensor().shape(), &dev).unwrap())
                .unwrap();
            let (lm, _) = loss_at(Mode::Detached);
            var.set(&Tensor::from_vec(base, var.as_tensor().shape(), &dev).unwrap())
                .unwrap();
            let fd = (lp - lm) / (2.0 * h as f64);
            let an = g[k] as f64;
            assert!(
                (fd - an).abs() <= 3e-2 * an.abs().max(fd.abs()) + 2e-4,
                "{name}[{k}]: analytic {an} vs finite difference {fd}"
            );
            checked += 1;
        }
    }
    assert!(checked >= 10, "checked {checked}");
}

fn run_learn(dir: &Path, name: &str, flip: bool, steps: usize) -> Vec<f64> {
    let mut t = trainer(config(dir, name, steps), 0.0, false);
    // The control run: every advantage negated before the update.
    let sign = if flip { -1.0 } else { 1.0 };
    t.train_with(None, |b| {
        for r in &mut b.rollouts {
            r.advantage *= sign;
        }
    })
    .unwrap();
    let (h, rows) = read_csv(&dir.join(name).join("training_log.csv"));
    assert_eq!(rows.len(), steps);
    column(&h, &rows, "reward")
}

#[test]
fn learnability_and_flipped_control() {
    let dir = tempfile::tempdir().unwrap();
    let steps = 30;
    let t0 = std::time::Instant::now();
    let up = run_learn(dir.path(), "learn", false, steps);
    let down = run_learn(dir.path(), "flipped", true, steps);
    let mean = |xs: &[f64]| xs.iter().sum::<f64>() / xs.len() as f64;
    let start = mean(&up[..3]);
    let end_up = mean(&up[steps - 5..]);
    let end_down = mean(&down[steps - 5..]);
    eprintln!(
        "learnability: start {start:.3}, trained {end_up:.3}, flipped {end_down:.3} ({:.1}s)\nup: {up:?}\ndown: {down:?}",
        t0.elapsed().as_secs_f64()
    );
    assert!(end_up > start + 0.2, "reward did not rise: {up:?}");
    assert!(end_down <= start + 0.02, "flipped run improved: {down:?}");
    // The run directory has the documented outputs.
    let run = dir.path().join("learn");
    for f in [
        "adapter_model.safetensors",
        "adapter_config.json",
        "config.toml",
        "samples.jsonl",
        "training_log.csv",
    ] {
        assert!(run.join(f).exists(), "missing {f}");
    }
    assert!(run
        .join(format!("checkpoint-{steps}/optimizer.safetensors"))
        .exists());
}

#[test]
fn nan_loss_skips_the_update() {
    let dir = tempfile::tempdir().unwrap();
    let mut t = trainer(config(dir.path(), "nan", 3), 0.0, false);
    t.step().unwrap();
    let after1 = lora_snapshot(&t.model);
    // A non-finite advantage makes the loss non-finite: the update must be skipped.
    t.step_with(|b| b.rollouts[0].advantage = f64::NAN).unwrap();
    assert_eq!(
        lora_snapshot(&t.model),
        after1,
        "a NaN step changed the adapter"
    );
    assert_eq!(t.session.opt.step_count(), 1);
    t.step().unwrap();
    assert_ne!(lora_snapshot(&t.model), after1);
    assert_eq!(t.session.opt.step_count(), 2);
    let (h, rows) = read_csv(&dir.path().join("nan/training_log.csv"));
    assert_eq!(column(&h, &rows, "skipped"), vec![0.0, 1.0, 0.0]);
}

#[test]
fn sampler_mismatch_is_logged_and_corrected() {
    use concord::config::ImportanceSamplingMode;
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path(), "mismatch", 2);
    // beta > 0 trains (and so measures) every row, whatever its advantage.
    c.grpo.beta = 0.01;
    c.grpo.importance_sampling_correction = true;
    c.grpo.importance_sampling_mode = ImportanceSamplingMode::TokenMask;
    c.grpo.importance_sampling_clip_max = 1.5;
    let mut t = trainer(c, 0.0, false);
    // Step 1 as sampled: the sampler is the trained model, so the log-probs agree.
    t.step().unwrap();
    // Step 2: every completion's first sampler log-prob lowered by 0.7, as a drifted
    // engine would report it: its weight e^0.7 > 1.5 is masked to 0.
    t.step_with(|b| {
        for r in &mut b.rollouts {
            if let Some(s) = r.sampler_logp.as_mut() {
                s[0] -= 0.7;
            }
        }
    })
    .unwrap();
    let (h, rows) = read_csv(&dir.path().join("mismatch/training_log.csv"));
    for name in [
        "completions/mean_terminated_length",
        "completions/min_terminated_length",
        "completions/max_terminated_length",
        "clip_ratio/low_min",
        "clip_ratio/high_max",
        "policy_loss",
        "sampling/importance_sampling_ratio/mean",
    ] {
        assert!(h.iter().any(|c| c == name), "no column {name} in {h:?}");
    }
    let diff_max = column(&h, &rows, "sampling/sampling_logp_difference/max");
    let diff_mean = column(&h, &rows, "sampling/sampling_logp_difference/mean");
    let r_min = column(&h, &rows, "sampling/importance_sampling_ratio/min");
    let r_mean = column(&h, &rows, "sampling/importance_sampling_ratio/mean");
    let r_max = column(&h, &rows, "sampling/importance_sampling_ratio/max");
    assert!(
        diff_max[0] < 1e-3,
        "f32 CPU sampler vs trainer: {diff_max:?}"
    );
    assert!(
        (r_mean[0] - 1.0).abs() < 1e-3 && r_min[0] > 0.99,
        "{r_mean:?} {r_min:?}"
    );
    assert!((diff_max[1] - 0.7).abs() < 1e-3, "{diff_max:?}");
    assert!(diff_mean[1] > diff_mean[0], "{diff_mean:?}");
    assert_eq!(r_min[1], 0.0, "the drifted tokens are masked");
    assert!(r_max[1] <= 1.5 && r_mean[1] < 1.0, "{r_max:?} {r_mean:?}");
    assert_eq!(column(&h, &rows, "policy_loss"), column(&h, &rows, "loss"));
}

#[test]
fn resume_writes_the_same_rows() {
    let dir = tempfile::tempdir().unwrap();
    let mut full = config(dir.path(), "full", 6);
    full.run.save_every = 3;
    full.lora.dropout = 0.1;
    let mut a = trainer(full.clone(), 0.1, false);
    a.train().unwrap();

    let mut part = full.clone();
    part.run.name = "part".into();
    let mut b = trainer(part.clone(), 0.1, false);
    b.train_with(Some(4), |_| {}).unwrap(); // checkpoint at 3, then one more step (lost)
    drop(b);
    let mut c = trainer(part, 0.1, true);
    assert_eq!(c.session.state.step, 3);
    c.train().unwrap();

    let (ha, ra) = read_csv(&dir.path().join("full/training_log.csv"));
    let (hb, rb) = read_csv(&dir.path().join("part/training_log.csv"));
    assert_eq!(ha, hb);
    assert_eq!(ra.len(), 6);
    assert_eq!(rb.len(), 6);
    for (x, y) in ra.iter().zip(&rb) {
        for (i, name) in ha.iter().enumerate() {
            if !TIMING_COLUMNS.contains(&name.as_str()) {
                assert_eq!(x[i], y[i], "column {name} differs at step {}", x[0]);
            }
        }
    }
    let a_ad = std::fs::read(dir.path().join("full/adapter_model.safetensors")).unwrap();
    let b_ad = std::fs::read(dir.path().join("part/adapter_model.safetensors")).unwrap();
    assert_eq!(a_ad, b_ad);
}

/// `cargo test --test tests grpo_train::bench_train -- --ignored --nocapture`: the numbers of
/// `concord bench train --model random:0.5b --batch 8 --seq 160 --json`.
#[test]
#[ignore = "benchmark (minutes on CPU)"]
fn bench_train_random_05b() {
    let model = std::env::var("CONCORD_BENCH_MODEL").unwrap_or_else(|_| "random:0.5b".into());
    concord::grpo::bench::bench_train(&concord::grpo::bench::BenchTrainOptions {
        model,
        batch: 8,
        seq: 160,
        iters: 1,
        base_dtype: None,
        dtype: DType::F32,
        device: Device::Cpu,
        r: 16,
        gradient_checkpointing: false,
        json: true,
    })
    .unwrap();
}

/// The quickstart config end to end (built-in tiny model created on first use, real
/// TICKETMELT prompts through the chat template): `cargo test --test tests
/// grpo_train::quickstart -- --ignored`.
#[test]
#[ignore = "end to end, about a minute on CPU"]
fn quickstart_config_trains() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = Path::new(env!("CARGO_MANIFEST_DIR")).join("configs/quickstart.toml");
    let t0 = std::time::Instant::now();
    concord::train::run(concord::train::TrainOptions {
        config: Some(cfg),
        sets: vec![
            format!("run.output_dir={}", dir.path().display()),
            format!("model.name={}", dir.path().join("tiny").display()),
            "run.steps=3".into(),
            "run.save_every=2".into(),
            "sft.steps=3".into(),
        ],
        resume: None,
        overwrite: false,
    })
    .unwrap();
    eprintln!("quickstart: 3 steps in {:.1}s", t0.elapsed().as_secs_f64());
    let run = dir.path().join("quickstart");
    let (h, rows) = read_csv(&run.join("training_log.csv"));
    assert_eq!(rows.len(), 3);
    assert!(h.iter().any(|c| c.starts_with("rewards/")), "{h:?}");
    assert!(run.join("checkpoint-2/optimizer.safetensors").exists());
    assert!(run.join("adapter_model.safetensors").exists());
    eprintln!(
        "{}",
        std::fs::read_to_string(run.join("training_log.csv")).unwrap()
    );
}

fn staged_trainer(cfg: Config, resume: bool) -> Trainer {
    use concord::config::stage::{Promotion, StageLength};
    use concord::curriculum::Stage;
    let mut short = cfg.clone();
    short.grpo.max_completion_length = 3;
    let stages = vec![
        // Unreachable target (rewards are shares <= 1): ends at max_steps.
        Stage {
            name: "warm".into(),
            length: StageLength::Promote {
                rule: Promotion {
                    mean_reward: 2.0,
                    window: 2,
                },
                max_steps: Some(3),
            },
            cfg: cfg.clone(),
            task: Box::new(TokenShare),
        },
        // Always-met target: promoted as soon as its window is full.
        Stage {
            name: "short".into(),
            length: StageLength::Promote {
                rule: Promotion {
                    mean_reward: -1.0,
                    window: 2,
                },
                max_steps: None,
            },
            cfg: short,
            task: Box::new(TokenShare),
        },
        Stage {
            name: "rest".into(),
            length: StageLength::Open,
            cfg: cfg.clone(),
            task: Box::new(TokenShare),
        },
    ];
    let mut t = Trainer::with_stages(
        cfg,
        tiny_model(0.0),
        Box::new(IdRenderer),
        stages,
        "tiny-random".into(),
        resume,
    )
    .unwrap();
    t.quiet = true;
    t
}

fn text_column(header: &[String], rows: &[Vec<String>], name: &str) -> Vec<String> {
    let i = header.iter().position(|h| h == name).unwrap();
    rows.iter().map(|r| r[i].clone()).collect()
}

#[test]
fn curriculum_stages_switch_where_the_rules_say() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path(), "staged", 7);
    cfg.run.save_every = 4;
    let mut t = staged_trainer(cfg.clone(), false);
    t.train().unwrap();
    let (h, rows) = read_csv(&dir.path().join("staged/training_log.csv"));
    let stages = text_column(&h, &rows, "stage");
    assert_eq!(
        stages,
        ["warm", "warm", "warm", "short", "short", "rest", "rest"]
    );
    // The stage's own [grpo] overrides apply to its steps only.
    let max_len = column(&h, &rows, "completions/max_length");
    assert!(max_len[3..5].iter().all(|&l| l <= 3.0), "{max_len:?}");
    assert!(max_len[..3].iter().any(|&l| l > 3.0), "{max_len:?}");

    // Interrupted inside the second stage (checkpoint at 4: one step into `short`),
    // resumed: the same rows, the same stage switches.
    let mut part = cfg;
    part.run.name = "staged-part".into();
    let mut b = staged_trainer(part.clone(), false);
    b.train_with(Some(5), |_| {}).unwrap();
    drop(b);
    let mut c = staged_trainer(part, true);
    assert_eq!((c.session.state.step, c.session.state.stage), (4, 1));
    c.train().unwrap();
    let (hb, rb) = read_csv(&dir.path().join("staged-part/training_log.csv"));
    assert_eq!(h, hb);
    for (x, y) in rows.iter().zip(&rb) {
        for (i, name) in h.iter().enumerate() {
            if !TIMING_COLUMNS.contains(&name.as_str()) {
                assert_eq!(x[i], y[i], "column {name} differs at step {}", x[0]);
            }
        }
    }
}

/// A TOML curriculum through `concord train` on the built-in tiny model with real
/// environments: two stages mixing TICKETMELT and merge_ring.
#[test]
fn toml_curriculum_trains_on_real_environments() {
    let dir = tempfile::tempdir().unwrap();
    let toml = format!(
        r#"
[run]
name = "cur"
output_dir = "{out}"
steps = 3
save_every = 0
[model]
name = "{model}"
init_tiny = true
[lora]
r = 4
alpha = 8
[grpo]
num_generations = 2
prompts_per_step = 2
max_completion_length = 4
[optim]
learning_rate = 1e-3
[[stage]]
name = "dumb"
steps = 1
envs = {{ ticketmelt = 1.0 }}
[stage.options.ticketmelt]
peers = "dumb"
[[stage]]
name = "mix"
envs = {{ ticketmelt = 0.5, merge_ring = 0.5 }}
[stage.grpo]
temperature = 0.7
"#,
        out = dir.path().display(),
        model = dir.path().join("tiny").display()
    );
    let cfg_path = dir.path().join("cur.toml");
    std::fs::write(&cfg_path, toml).unwrap();
    concord::train::run(concord::train::TrainOptions {
        config: Some(cfg_path),
        sets: vec![],
        resume: None,
        overwrite: false,
    })
    .unwrap();
    let run = dir.path().join("cur");
    let (h, rows) = read_csv(&run.join("training_log.csv"));
    assert_eq!(text_column(&h, &rows, "stage"), ["dumb", "mix", "mix"]);
    assert_eq!(text_column(&h, &rows, "env")[1], "merge_ring+ticketmelt");
    // Both environments' components are columns from the first row on.
    assert!(h.iter().any(|c| c == "rewards/r1_own/mean"), "{h:?}");
    assert!(h.iter().any(|c| c == "rewards/r_merge/mean"), "{h:?}");
    let resolved = std::fs::read_to_string(run.join("config.toml")).unwrap();
    assert!(resolved.contains("[[stage]]"), "{resolved}");
}

/// TokenShare on prompts whose first id is odd; a constant 0 on the others (a group
/// that carries no gradient whatever the model writes).
struct HalfDead;

impl Task for HalfDead {
    fn name(&self) -> String {
        "half_dead".into()
    }
    fn prompts(
        &mut self,
        seed: u64,
        n: usize,
        r: &dyn Renderer,
    ) -> anyhow::Result<Vec<TaskPrompt>> {
        TokenShare.prompts(seed, n, r)
    }
    fn score(&self, p: &TaskPrompt, c: &Completion) -> anyhow::Result<Reward> {
        let mut r = TokenShare.score(p, c)?;
        if p.ids[0].is_multiple_of(2) {
            r.scalar = 0.0;
            r.components.insert("share".into(), 0.0);
        }
        Ok(r)
    }
}

fn half_dead_trainer(cfg: Config) -> Trainer {
    let mut t = Trainer::new(
        cfg,
        tiny_model(0.0),
        Box::new(IdRenderer),
        Box::new(HalfDead),
        "tiny-random".into(),
        false,
    )
    .unwrap();
    t.quiet = true;
    t
}

#[test]
fn dynamic_sampling_keeps_groups_that_differ() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path(), "dyn", 4);
    cfg.grpo.dynamic_sampling = true;
    cfg.grpo.max_prompt_draws = 16;
    let mut t = half_dead_trainer(cfg.clone());
    let want = cfg.grpo.prompts_per_step;
    let mut extra_draws = 0;
    for _ in 0..4 {
        let mut informative = 0;
        let row = t
            .step_with(|b| {
                assert_eq!(b.prompts.len(), want);
                assert_eq!(b.rollouts.len(), want * cfg.grpo.num_generations);
                informative = b
                    .rollouts
                    .chunks(cfg.grpo.num_generations)
                    .filter(|g| g.iter().any(|r| r.scalar != g[0].scalar))
                    .count();
                // Groups are renumbered 0..want in batch order.
                for (i, r) in b.rollouts.iter().enumerate() {
                    assert_eq!(r.group, i / cfg.grpo.num_generations);
                }
            })
            .unwrap();
        let draws = row.prompt_draws as usize;
        assert!((want..=16).contains(&draws), "{draws}");
        // Either every kept group differs, or the budget ran out.
        assert!(
            informative == want || draws == 16,
            "{informative} of {want}, {draws} draws"
        );
        if draws > want {
            extra_draws += 1;
            // Counted before filtering: some drawn groups were all equal.
            assert!(row.frac_reward_zero_std > 0.0);
        }
    }
    assert!(
        extra_draws > 0,
        "half the prompts are dead: some step must draw more"
    );
    let (h, rows) = read_csv(&dir.path().join("dyn/training_log.csv"));
    assert_eq!(rows.len(), 4);
    assert!(column(&h, &rows, "prompt_draws")
        .iter()
        .all(|&d| d >= want as f64));
}

#[test]
fn dynamic_sampling_without_budget_is_plain_sampling() {
    let dir = tempfile::tempdir().unwrap();
    let plain = config(dir.path(), "plain", 3);
    let mut dynamic = config(dir.path(), "dyn-nobudget", 3);
    dynamic.grpo.dynamic_sampling = true;
    dynamic.grpo.max_prompt_draws = dynamic.grpo.prompts_per_step;
    half_dead_trainer(plain).train().unwrap();
    half_dead_trainer(dynamic).train().unwrap();
    let (ha, ra) = read_csv(&dir.path().join("plain/training_log.csv"));
    let (hb, rb) = read_csv(&dir.path().join("dyn-nobudget/training_log.csv"));
    assert!(!ha.contains(&"prompt_draws".to_string()));
    for (x, y) in ra.iter().zip(&rb) {
        for (i, name) in ha.iter().enumerate() {
            let j = hb.iter().position(|n| n == name).unwrap();
            if !TIMING_COLUMNS.contains(&name.as_str()) {
                assert_eq!(x[i], y[j], "column {name} differs at step {}", x[0]);
            }
        }
    }
}

/// `concord bench grpo-step` on the quickstart config: every phase timed, and the
/// update runs even though the random tiny model's groups all tie.
#[test]
fn bench_grpo_step_always_updates() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = Path::new(env!("CARGO_MANIFEST_DIR")).join("configs/quickstart.toml");
    let r = concord::grpo::bench::bench_step(&concord::grpo::bench::BenchStepOptions {
        config: cfg,
        sets: vec![
            "grpo.max_completion_length=4".into(),
            "grpo.prompts_per_step=2".into(),
            "grpo.num_generations=4".into(),
        ],
        model: Some(dir.path().join("tiny").display().to_string()),
        warmup: 1,
        steps: 1,
        export_prompts: Some(dir.path().join("prompts.jsonl")),
    })
    .unwrap();
    assert_eq!(r.steps, 1);
    // The exported dataset: the timed step's prompts, one JSON line each.
    let lines = std::fs::read_to_string(dir.path().join("prompts.jsonl")).unwrap();
    let rows: Vec<serde_json::Value> = lines
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 2, "{lines}");
    assert!(rows.iter().all(|r| r["step"] == 1
        && r["prompt"].as_str().is_some_and(|p| !p.is_empty())
        && r["prompt_tokens"].as_u64().is_some_and(|n| n > 0)));
    assert!(r.trained_tokens > 0.0, "{r:?}");
    assert!(r.update_s > 0.0 && r.sampling_s > 0.0, "{r:?}");
    assert!(r.seconds_per_step >= r.sampling_s + r.update_s, "{r:?}");
    assert_eq!(r.completion_tokens, (2 * 4 * 4) as f64, "{r:?}");
    // the update's memory plan is reported (the quickstart fits in one micro-batch)
    assert_eq!(r.micro_batches, 1, "{r:?}");
    assert!(r.memory_plan.starts_with("memory: estimate "), "{r:?}");
}

#[test]
fn identical_completions_are_logged_per_group() {
    // Near-greedy sampling writes one completion per prompt; T = 1 on the tiny model
    // writes several. The column counts texts, not rewards.
    let dir = tempfile::tempdir().unwrap();
    let mut greedy = config(dir.path(), "greedy", 2);
    greedy.grpo.temperature = 1e-4;
    trainer(greedy, 0.0, false).train().unwrap();
    trainer(config(dir.path(), "sampled", 2), 0.0, false)
        .train()
        .unwrap();
    let (h, rows) = read_csv(&dir.path().join("greedy/training_log.csv"));
    assert_eq!(
        column(&h, &rows, "frac_identical_completions"),
        vec![1.0; 2]
    );
    assert_eq!(column(&h, &rows, "completions/distinct_mean"), vec![1.0; 2]);
    let (h, rows) = read_csv(&dir.path().join("sampled/training_log.csv"));
    for (same, distinct) in column(&h, &rows, "frac_identical_completions")
        .iter()
        .zip(column(&h, &rows, "completions/distinct_mean"))
    {
        assert!(*same < 1.0 && distinct > 2.0, "{same} {distinct}");
    }
}

/// Reward 1 for one exact completion the tiny model never writes, 0 for anything
/// else; with `enumerate`, that completion and a losing one join every group.
struct OnlyOneAnswer {
    enumerate: bool,
}

const THE_ANSWER: &str = "5 5 5 5";

impl Task for OnlyOneAnswer {
    fn name(&self) -> String {
        "only_one_answer".into()
    }
    fn prompts(
        &mut self,
        seed: u64,
        n: usize,
        r: &dyn Renderer,
    ) -> anyhow::Result<Vec<TaskPrompt>> {
        TokenShare.prompts(seed, n, r)
    }
    fn score(&self, _p: &TaskPrompt, c: &Completion) -> anyhow::Result<Reward> {
        let won = (c.text == THE_ANSWER) as u8 as f64;
        Ok(Reward {
            components: BTreeMap::from([("won".to_string(), won)]),
            scalar: won,
        })
    }
    fn forced_answers(&self, _p: &TaskPrompt) -> Vec<String> {
        match self.enumerate {
            true => vec![THE_ANSWER.into(), "6 6".into()],
            false => Vec::new(),
        }
    }
}

/// Mean log-probability of THE_ANSWER after the step's prompts.
fn answer_logp(model: &Transformer, prompts: &[Vec<u32>]) -> f64 {
    let answer: Vec<u32> = vec![5; 4];
    let rows: Vec<Sequence> = prompts
        .iter()
        .map(|p| Sequence::demonstration(p, &answer))
        .collect();
    let refs: Vec<&Sequence> = rows.iter().collect();
    let packed = pack(&refs, 0).unwrap();
    let (logp, _) = completion_logprobs(model, &packed, Mode::Detached, 1.0, false).unwrap();
    let v = logp.to_vec2::<f32>().unwrap();
    v.iter().flatten().map(|&x| x as f64).sum::<f64>() / prompts.len() as f64
}

#[test]
fn enumerated_actions_teach_an_answer_the_model_never_samples() {
    let dir = tempfile::tempdir().unwrap();
    let mut logp = Vec::new();
    for enumerate in [false, true] {
        let name = format!("enumerate-{enumerate}");
        let mut cfg = config(dir.path(), &name, 1);
        cfg.env.as_mut().unwrap().enumerate_actions = enumerate;
        let mut t = Trainer::new(
            cfg.clone(),
            tiny_model(0.0),
            Box::new(IdRenderer),
            Box::new(OnlyOneAnswer { enumerate }),
            "tiny-random".into(),
            false,
        )
        .unwrap();
        t.quiet = true;
        let mut prompts = Vec::new();
        let mut before = 0.0;
        let row = t
            .step_with(|b| {
                prompts = b.prompts.iter().map(|p| p.ids.clone()).collect();
                assert_eq!(b.rollouts.len(), 4 * 8);
                for g in b.rollouts.chunks(8) {
                    let forced: Vec<&str> = g
                        .iter()
                        .filter(|r| r.forced)
                        .map(|r| r.text.as_str())
                        .collect();
                    let want: &[&str] = if enumerate { &[THE_ANSWER, "6 6"] } else { &[] };
                    assert_eq!(forced, want);
                    // sampled first, then the enumerated answers, tokenized
                    assert!(g[..8 - want.len()].iter().all(|r| !r.forced));
                    for r in g.iter().filter(|r| r.forced) {
                        assert!(r.sampler_logp.is_none());
                        // the losing enumerated answer only counts in the mean
                        assert!(r.advantage >= 0.0, "{}: {}", r.text, r.advantage);
                        assert_eq!(r.advantage > 0.0, r.text == THE_ANSWER);
                        assert_eq!(IdRenderer.decode(&r.completion_ids).unwrap(), r.text);
                    }
                }
            })
            .unwrap();
        // the trainer's weights before the step are the tiny model's
        before += answer_logp(&tiny_model(0.0), &prompts);
        let after = answer_logp(&t.model, &prompts);
        logp.push((before, after));
        let (h, rows) = read_csv(&dir.path().join(format!("{name}/training_log.csv")));
        if enumerate {
            // the sampled answers never win: the enumerated best sits above the mean
            assert_eq!(column(&h, &rows, "explore/sampled_best_frac"), vec![0.0]);
            assert!(column(&h, &rows, "explore/forced_advantage")[0] > 0.0);
            assert_eq!(row.frac_reward_zero_std, 0.0);
        } else {
            assert!(!h.iter().any(|c| c.starts_with("explore/")), "{h:?}");
            assert_eq!(row.frac_reward_zero_std, 1.0);
            assert_eq!(row.grad_norm, 0.0);
        }
    }
    let (plain, enumerated) = (logp[0], logp[1]);
    assert!((plain.1 - plain.0).abs() < 1e-9, "{plain:?}");
    assert!(enumerated.1 > enumerated.0 + 0.5, "{enumerated:?}");
}

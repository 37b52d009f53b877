//! Groups that carry a signal: `[env] contested` draws decisions whose action matters,
//! and a run's held-out curve starts at step 0.
use crate::util::{column, read_csv};
use concord::config::Config;
use concord::envs::contest::{action_spread, sample_contested};
use concord::envs::{create, sample_decision, score_decision, training_seed, ContestRule};
use std::path::Path;

fn factory(name: &str, options: &str) -> Box<dyn concord::envs::EnvFactory> {
    let opts: toml::Table = toml::from_str(options).unwrap();
    create(name, &opts).unwrap()
}

/// The spread of a decision recomputed from answers written by hand, not from the
/// environment's own list of actions.
fn spread_by_hand(d: &concord::envs::Decision, answers: &[&str]) -> f64 {
    let r: Vec<f64> = answers
        .iter()
        .map(|a| score_decision(d, a).scalar)
        .collect();
    r.iter().cloned().fold(f64::MIN, f64::max) - r.iter().cloned().fold(f64::MAX, f64::min)
}

fn check_contested(name: &str, options: &str, answers: &[&str]) {
    let f = factory(name, options);
    let rule = ContestRule {
        margin: 0.0,
        draws: 8,
    };
    let (mut redrawn, mut first) = (0, 0);
    for i in 0..120u64 {
        let seed = training_seed(1000 + i);
        let plain = sample_decision(f.as_ref(), seed);
        let (d, c) = sample_contested(f.as_ref(), seed, rule).unwrap();
        let by_hand = spread_by_hand(&d, answers);
        assert!(
            (c.spread - by_hand).abs() < 1e-12,
            "{name} seed {seed}: {c:?} vs {by_hand}"
        );
        assert_eq!(c.contested, by_hand > 0.0, "{name} seed {seed}");
        assert!(
            c.contested || c.draws == rule.draws,
            "{name} seed {seed}: {c:?}"
        );
        let plain_spread = spread_by_hand(&plain, answers);
        if plain_spread > 0.0 {
            // A contested first draw is kept as it is.
            assert_eq!(c.draws, 1, "{name} seed {seed}");
            assert_eq!(d.messages, plain.messages);
            first += 1;
        } else {
            // A tied decision is replaced.
            assert!(c.draws > 1, "{name} seed {seed}");
            redrawn += 1;
        }
    }
    assert!(
        first > 0 && redrawn > 0,
        "{name}: {first} kept, {redrawn} redrawn"
    );
}

#[test]
fn contested_merge_ring_decisions_matter() {
    check_contested(
        "merge_ring",
        "agents = 4\nregime = \"stationary\"\nprompt = \"compact\"",
        &["ACTION: early", "ACTION: late", "ACTION: bypass"],
    );
}

#[test]
fn contested_ticketmelt_decisions_matter() {
    check_contested(
        "ticketmelt",
        "prompt = \"compact\"",
        &[
            r#"{"commitment": "DEPLOY_PROD_A"}"#,
            r#"{"commitment": "DEPLOY_PROD_B"}"#,
            r#"{"commitment": "MONITOR"}"#,
        ],
    );
}

#[test]
fn contested_draws_run_out() {
    let f = factory("merge_ring", "agents = 4");
    let rule = ContestRule {
        margin: 100.0,
        draws: 3,
    };
    for i in 0..10 {
        let (d, c) = sample_contested(f.as_ref(), training_seed(i), rule).unwrap();
        assert_eq!(c.draws, 3);
        assert!(!c.contested);
        assert_eq!(Some(c.spread), action_spread(&d));
    }
}

#[test]
fn contested_config_errors_name_the_key() {
    let parse = |env: &str| {
        let text = format!("[run]\nsteps = 1\n[model]\nname = \"tiny\"\n[env]\n{env}");
        Config::from_toml_str(&text, "t.toml", &[])
    };
    let ok = parse("name = \"merge_ring\"\ncontested = true\n").unwrap();
    assert!(toml::to_string(&ok).unwrap().contains("contested = true"));
    assert!(concord::curriculum::build(&ok).is_ok());
    let e = parse("name = \"merge_ring\"\ncontested = true\nmode = \"episode\"\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("env.contested") && e.contains("decision"), "{e}");
    let e = parse("name = \"merge_ring\"\ncontested = true\ncontested_draws = 0\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("env.contested_draws"), "{e}");
    let e = parse("name = \"merge_ring\"\ncontested = true\ncontested_margin = -1\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("env.contested_margin"), "{e}");
    // An environment that cannot list its actions says so when the run is built.
    let w = parse("name = \"whispers\"\ncontested = true\n").unwrap();
    let e = concord::curriculum::build(&w).err().unwrap().to_string();
    assert!(e.contains("contested") && e.contains("whispers"), "{e}");
}

/// The quickstart with `contested`: its three columns are logged, and the held-out
/// curve has a row at step 0 (the warm start) that a resume keeps, once.
#[test]
fn contested_run_logs_its_columns_and_a_step_zero_evaluation() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = Path::new(env!("CARGO_MANIFEST_DIR")).join("configs/quickstart.toml");
    let train = |steps: usize, resume: bool| {
        let run = dir.path().join("quickstart");
        concord::train::run(concord::train::TrainOptions {
            config: Some(cfg.clone()),
            sets: vec![
                format!("run.output_dir={}", dir.path().display()),
                format!("model.name={}", dir.path().join("tiny").display()),
                format!("run.steps={steps}"),
                "run.save_every=1".into(),
                "run.eval_every=2".into(),
                "run.eval_episodes=2".into(),
                "sft.steps=2".into(),
                "sft.examples=8".into(),
                "grpo.max_completion_length=24".into(),
                "env.contested=true".into(),
            ],
            resume: resume.then_some(run),
            overwrite: false,
        })
        .unwrap();
    };
    train(1, false);
    train(2, true);
    let run = dir.path().join("quickstart");
    let (h, rows) = read_csv(&run.join("training_log.csv"));
    assert_eq!(rows.len(), 2);
    for d in column(&h, &rows, "decisions/draws") {
        assert!((1.0..=8.0).contains(&d), "{d}");
    }
    for f in column(&h, &rows, "decisions/contested_frac") {
        assert!((0.0..=1.0).contains(&f), "{f}");
    }
    assert!(column(&h, &rows, "decisions/action_spread")
        .iter()
        .all(|&s| s >= 0.0));
    let (eh, erows) = read_csv(&run.join("eval_log.csv"));
    assert_eq!(column(&eh, &erows, "step"), vec![0.0, 1.0, 2.0]);
}

/// Four JSONL demonstrations and an SFT config on the built-in tiny model.
fn sft_config(dir: &Path, name: &str, extra: &str) -> std::path::PathBuf {
    let data = crate::sft::four_demonstrations(dir);
    let toml = format!(
        "[run]\nname = \"{name}\"\noutput_dir = \"{out}\"\nsave_every = 0\n\
         [model]\nname = \"{model}\"\ninit_tiny = true\n\
         [lora]\nr = 4\nalpha = 8\ndropout = 0.0\n\
         [sft]\nsource = \"jsonl\"\npath = \"{data}\"\nsteps = 12\nbatch_size = 2\n\
         learning_rate = 1e-2\n{extra}\n",
        out = dir.display(),
        model = dir.join("tiny").display(),
        data = data.display()
    );
    let p = dir.join(format!("{name}.toml"));
    std::fs::write(&p, toml).unwrap();
    p
}

/// The warm start stops at the first step whose window mean loss reaches the target,
/// found independently in an unstopped run's log (same seed, same rows), and a resume
/// does not train further.
#[test]
fn sft_stops_at_its_target_and_stays_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let plain = sft_config(dir.path(), "plain", "");
    crate::util::concord_ok(&["sft", "--config", plain.to_str().unwrap()]);
    let (h, rows) = read_csv(&dir.path().join("plain/training_log.csv"));
    let loss = column(&h, &rows, "loss");
    assert_eq!(loss.len(), 12);
    let w = 3;
    let mean = |k: usize| loss[k + 1 - w..=k].iter().sum::<f64>() / w as f64;
    // The target: the window mean after step 6, so the stop comes at step 6 or before.
    let target = mean(5);
    let expect = (w - 1..12).find(|&k| mean(k) <= target).unwrap() + 1;
    assert!(expect <= 6);
    let stopped = sft_config(
        dir.path(),
        "stopped",
        &format!("stop_at_loss = {target:?}\nstop_window = {w}"),
    );
    crate::util::concord_ok(&["sft", "--config", stopped.to_str().unwrap()]);
    let run = dir.path().join("stopped");
    let (h2, rows2) = read_csv(&run.join("training_log.csv"));
    assert_eq!(
        rows2.len(),
        expect,
        "plain losses {loss:?}, target {target}"
    );
    assert_eq!(column(&h2, &rows2, "loss"), loss[..expect].to_vec());
    assert!(run.join("adapter_model.safetensors").exists());
    assert!(run.join(format!("checkpoint-{expect}")).exists());
    crate::util::concord_ok(&[
        "sft",
        "--config",
        stopped.to_str().unwrap(),
        "--resume",
        run.to_str().unwrap(),
    ]);
    let (_, rows3) = read_csv(&run.join("training_log.csv"));
    assert_eq!(rows3.len(), expect);
    // A bad target names its key.
    let bad = sft_config(dir.path(), "bad", "stop_at_token_accuracy = 1.5");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_concord"))
        .args(["sft", "--config", bad.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("sft.stop_at_token_accuracy"), "{err}");
}

#[test]
fn enumerate_actions_config_errors_name_the_key() {
    let parse = |env: &str, grpo: &str| {
        let text =
            format!("[run]\nsteps = 1\n[model]\nname = \"tiny\"\n[grpo]\n{grpo}[env]\n{env}");
        Config::from_toml_str(&text, "t.toml", &[])
    };
    let ok = parse("name = \"ticketmelt\"\nenumerate_actions = true\n", "").unwrap();
    assert!(toml::to_string(&ok)
        .unwrap()
        .contains("enumerate_actions = true"));
    assert!(concord::curriculum::build(&ok).is_ok());
    let e = parse(
        "name = \"ticketmelt\"\nenumerate_actions = true\nmode = \"episode\"\n",
        "",
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("env.enumerate_actions") && e.contains("decision"),
        "{e}"
    );
    let e = parse(
        "url = \"ws://localhost:1\"\ncontinue_with = \"model\"\nenumerate_actions = true\n",
        "",
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("env.enumerate_actions") && e.contains("server"),
        "{e}"
    );
    let e = parse(
        "name = \"ticketmelt\"\nenumerate_actions = true\n",
        "importance_sampling_correction = true\n",
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("env.enumerate_actions") && e.contains("importance_sampling_correction"),
        "{e}"
    );
    let w = parse("name = \"whispers\"\nenumerate_actions = true\n", "").unwrap();
    let e = concord::curriculum::build(&w).err().unwrap().to_string();
    assert!(
        e.contains("enumerate_actions") && e.contains("whispers"),
        "{e}"
    );
}

/// Each group's enumerated answers are the deciding seat's legal actions, one each,
/// scored like the model's own: their rewards spread as the contest measures.
#[test]
fn enumerated_answers_are_the_seats_legal_actions() {
    use concord::task::{EnvTask, Task};
    for (name, actions) in [
        (
            "ticketmelt",
            &["DEPLOY_PROD_A", "DEPLOY_PROD_B", "MONITOR"][..],
        ),
        ("merge_ring", &["early", "late", "bypass"][..]),
    ] {
        let opts = toml::Table::new();
        let plain = EnvTask::new(name, &opts).unwrap();
        let mut task = EnvTask::new(name, &opts)
            .unwrap()
            .enumerating(true)
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let spec = concord::model::tiny::TinySpec::default();
        concord::model::tiny::init_tiny(&spec, dir.path()).unwrap();
        let renderer = concord::model::tokenizer::Tokenizer::from_dir(dir.path()).unwrap();
        let prompts = task.prompts(5, 6, &renderer).unwrap();
        for p in &prompts {
            assert!(plain.forced_answers(p).is_empty());
            let answers = task.forced_answers(p);
            assert_eq!(answers.len(), actions.len(), "{name}: {answers:?}");
            for (a, want) in answers.iter().zip(actions) {
                assert!(a.contains(want), "{name}: {a} is not {want}");
            }
            let d = p.state.downcast_ref::<concord::envs::Decision>().unwrap();
            assert_eq!(
                spread_by_hand(d, &answers.iter().map(String::as_str).collect::<Vec<_>>()),
                action_spread(d).unwrap()
            );
        }
    }
}

/// The quickstart with `enumerate_actions`: its columns are logged and in range.
#[test]
fn enumerate_actions_run_logs_its_columns() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = Path::new(env!("CARGO_MANIFEST_DIR")).join("configs/quickstart.toml");
    concord::train::run(concord::train::TrainOptions {
        config: Some(cfg),
        sets: vec![
            format!("run.output_dir={}", dir.path().display()),
            format!("model.name={}", dir.path().join("tiny").display()),
            "run.steps=2".into(),
            "run.save_every=0".into(),
            "sft.steps=2".into(),
            "sft.examples=8".into(),
            "grpo.max_completion_length=24".into(),
            "env.enumerate_actions=true".into(),
        ],
        resume: None,
        overwrite: false,
    })
    .unwrap();
    let (h, rows) = read_csv(&dir.path().join("quickstart/training_log.csv"));
    assert_eq!(rows.len(), 2);
    for f in column(&h, &rows, "explore/sampled_best_frac") {
        assert!((0.0..=1.0).contains(&f), "{f}");
    }
    assert!(column(&h, &rows, "explore/forced_advantage")
        .iter()
        .all(|a| a.is_finite()));
    for d in column(&h, &rows, "completions/distinct_mean") {
        assert!((1.0..=8.0).contains(&d), "{d}");
    }
}

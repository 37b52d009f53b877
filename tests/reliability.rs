//! Reliability (issue #21): a run directory is never lost or shared, every size is
//! bounded, signals leave a checkpoint, bad input is a named error. The run-directory
//! tests (reuse, lock, kill, SIGTERM, resume) spawn the real binary on the built-in tiny
//! model; the rest call the library. A seeded fuzzer feeds generated configs through
//! `Config::from_toml_str` / `Config::load`.
use concord::config::Config;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------

/// The built-in tiny model, created once per test binary.
fn tiny() -> &'static Path {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| {
        let d = tempfile::tempdir().unwrap();
        concord::model::tiny::init_tiny(
            &concord::model::tiny::TinySpec::default(),
            &d.path().join("tiny"),
        )
        .unwrap();
        d
    })
    .path()
    .join("tiny")
    .leak()
}

fn concord() -> Command {
    Command::new(env!("CARGO_BIN_EXE_concord"))
}

fn run(cmd: &mut Command) -> (Option<i32>, String) {
    let out: Output = cmd.output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

/// A small TICKETMELT run on the tiny model: 1 prompt x 2 completions of 4 tokens,
/// LoRA r = 2 on q_proj, constant learning rate.
fn config_text(out_dir: &str, model: &str, steps: usize, save_every: usize) -> String {
    format!(
        r#"[run]
name = "r"
output_dir = "{out_dir}"
steps = {steps}
save_every = {save_every}
log_samples = 0
[model]
name = "{model}"
[lora]
r = 2
alpha = 4
dropout = 0.0
targets = ["q_proj"]
[grpo]
num_generations = 2
prompts_per_step = 1
max_completion_length = 4
[optim]
learning_rate = 1e-3
schedule = "constant"
[env]
name = "ticketmelt"
"#
    )
}

/// A config file in `dir` for a run under `dir/runs/r`.
fn write_config(dir: &Path, steps: usize, save_every: usize) -> PathBuf {
    let p = dir.join("c.toml");
    let text = config_text(
        &dir.join("runs").display().to_string(),
        &tiny().display().to_string(),
        steps,
        save_every,
    );
    std::fs::write(&p, text).unwrap();
    p
}

fn train(args: &[&str]) -> (Option<i32>, String) {
    run(concord().arg("train").args(args))
}

fn log_rows(run_dir: &Path) -> usize {
    std::fs::read_to_string(run_dir.join("training_log.csv"))
        .map(|t| t.lines().count().saturating_sub(1))
        .unwrap_or(0)
}

fn checkpoints(run_dir: &Path) -> Vec<usize> {
    let mut v: Vec<usize> = concord::run::checkpoint::list(run_dir)
        .unwrap()
        .into_iter()
        .map(|c| c.0)
        .collect();
    v.sort();
    v
}

/// Wait until the run has logged `rows` steps (or panic after a minute).
fn wait_for_rows(child: &mut Child, run_dir: &Path, rows: usize) {
    let t0 = Instant::now();
    while log_rows(run_dir) < rows {
        if let Some(st) = child.try_wait().unwrap() {
            panic!("the run exited early: {st}");
        }
        assert!(t0.elapsed() < Duration::from_secs(120), "no progress");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn spawn_long_run(cfg: &Path, extra: &[&str]) -> Child {
    concord()
        .args(["train", "--config", cfg.to_str().unwrap()])
        .args(["--set", "run.steps=100000"])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// SIGTERM `child` once the run in `run_dir` has logged `rows` steps; its exit code and
/// stderr.
fn sigterm_after_rows(mut child: Child, run_dir: &Path, rows: usize) -> (Option<i32>, String) {
    wait_for_rows(&mut child, run_dir, rows);
    let st = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    stderr_of(child)
}

fn stderr_of(child: Child) -> (Option<i32>, String) {
    let out = child.wait_with_output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

// ---------------------------------------------------------------------------------------
// 1. Reusing a run name; 8. progress lines
// ---------------------------------------------------------------------------------------

#[test]
fn reusing_a_run_name_is_refused_and_overwrite_replaces_the_run() {
    let d = tempfile::tempdir().unwrap();
    let cfg = write_config(d.path(), 3, 1);
    let c = cfg.to_str().unwrap();
    let run_dir = d.path().join("runs/r");
    let (rc, err) = train(&["--config", c]);
    assert_eq!(rc, Some(0), "{err}");
    // 8: stderr is a pipe here, so plain progress lines, the last one always.
    assert!(err.contains("step 1/3 reward"), "{err}");
    assert!(
        err.contains("step 3/3 reward") && err.contains("eta"),
        "{err}"
    );
    let log = std::fs::read(run_dir.join("training_log.csv")).unwrap();
    let config = std::fs::read(run_dir.join("config.toml")).unwrap();

    // The same name again: refused, naming both ways out; nothing touched.
    let (rc, err) = train(&["--config", c, "--set", "run.steps=2"]);
    assert_eq!(rc, Some(1), "{err}");
    assert!(err.contains("already holds a run"), "{err}");
    assert!(
        err.contains("--resume") && err.contains("--overwrite"),
        "{err}"
    );
    // A config that fails validation never reaches the directory either.
    let (rc, err) = train(&["--config", c, "--set", "grpo.top_p=0", "--overwrite"]);
    assert_eq!(rc, Some(1));
    assert!(err.contains("grpo.top_p"), "{err}");
    assert_eq!(
        std::fs::read(run_dir.join("training_log.csv")).unwrap(),
        log
    );
    assert_eq!(std::fs::read(run_dir.join("config.toml")).unwrap(), config);
    assert_eq!(checkpoints(&run_dir), [1, 2, 3]);
    // Nor does one that fails after the directory was claimed: an --overwrite start that
    // stops before its first step gives the earlier run back (issue #31, item 7).
    let failing: [(&[&str], &str); 3] = [
        (&["grpo.reward_weights={nope=1.0}"], "nope"),
        (
            &["env.url=\"ws://127.0.0.1:1\"", "env.mode=\"episode\""],
            "127.0.0.1:1",
        ),
        (
            &[
                "sft.warm_start=true",
                "sft.source=\"env\"",
                "sft.policy=\"bogus\"",
            ],
            "bogus",
        ),
    ];
    for (sets, says) in failing {
        let mut args = vec!["--config", c, "--overwrite"];
        for s in sets {
            args.extend(["--set", s]);
        }
        let (rc, err) = train(&args);
        assert_eq!(rc, Some(1), "{sets:?}: {err}");
        assert!(err.contains(says), "{sets:?}: {err}");
        let log_now = std::fs::read(run_dir.join("training_log.csv")).unwrap();
        assert_eq!(log_now, log, "{sets:?}");
        assert_eq!(std::fs::read(run_dir.join("config.toml")).unwrap(), config);
        assert_eq!(checkpoints(&run_dir), [1, 2, 3], "{sets:?}");
    }
    // Only what Concord wrote is replaced (item 8).
    std::fs::create_dir(run_dir.join("checkpoint-notes")).unwrap();
    std::fs::write(run_dir.join("checkpoint-notes/mine.txt"), "mine").unwrap();

    // --overwrite: the old run's files go first, so no stale checkpoint survives.
    let (rc, err) = train(&[
        "--config",
        c,
        "--overwrite",
        "--set",
        "run.steps=1",
        "--set",
        r#"lora.targets=["v_proj"]"#,
    ]);
    assert_eq!(rc, Some(0), "{err}");
    assert_eq!(log_rows(&run_dir), 1);
    assert_eq!(checkpoints(&run_dir), [1]);
    let adapter = std::fs::read_to_string(run_dir.join("adapter_config.json")).unwrap();
    assert!(
        adapter.contains("v_proj") && !adapter.contains("q_proj"),
        "{adapter}"
    );
    assert!(run_dir.join("checkpoint-notes/mine.txt").exists());
    assert!(!run_dir.join(concord::run::dir::OVERWRITTEN).exists());
    // ... and a later resume finds only the new run's checkpoint, and removes what a
    // writer killed inside an atomic write left (item 10).
    let stale = run_dir.join(".adapter_model.safetensors.4242.tmp");
    std::fs::write(&stale, "half").unwrap();
    let (rc, err) = train(&[
        "--resume",
        run_dir.to_str().unwrap(),
        "--set",
        "run.steps=2",
    ]);
    assert_eq!(rc, Some(0), "{err}");
    let text = std::fs::read_to_string(run_dir.join("training_log.csv")).unwrap();
    let steps: Vec<&str> = text
        .lines()
        .skip(1)
        .map(|l| l.split(',').next().unwrap())
        .collect();
    assert_eq!(steps, ["1", "2"]);
    assert!(!stale.exists());
}

/// Item 9: a start that fails at its first step gives its run name back, whatever it
/// wrote before failing (`config.toml` is written before the first step).
#[test]
fn a_start_that_fails_at_its_first_step_leaves_the_name_free() {
    let d = tempfile::tempdir().unwrap();
    let cfg = write_config(d.path(), 1, 1);
    let c = cfg.to_str().unwrap();
    let run_dir = d.path().join("runs/r");
    let unreachable = [
        "--config",
        c,
        "--set",
        "env.url=\"ws://127.0.0.1:1\"",
        "--set",
        "env.mode=\"episode\"",
    ];
    for attempt in 1..=2 {
        let (rc, err) = train(&unreachable);
        assert_eq!(rc, Some(1), "attempt {attempt}: {err}");
        assert!(err.contains("127.0.0.1:1"), "attempt {attempt}: {err}");
        assert!(
            !err.contains("already holds a run"),
            "attempt {attempt}: {err}"
        );
    }
    let (rc, err) = train(&["--config", c]);
    assert_eq!(rc, Some(0), "{err}");
    assert_eq!(log_rows(&run_dir), 1);
}

// ---------------------------------------------------------------------------------------
// 2. Lock; kill -9 releases it
// ---------------------------------------------------------------------------------------

#[test]
fn a_second_writer_is_refused_with_the_holders_pid_and_kill_releases_the_lock() {
    let d = tempfile::tempdir().unwrap();
    let cfg = write_config(d.path(), 5, 1);
    let run_dir = d.path().join("runs/r");
    let mut first = spawn_long_run(&cfg, &[]);
    wait_for_rows(&mut first, &run_dir, 2);
    let pid = first.id().to_string();
    // A second writer, by --resume or by --overwrite, is refused with the holder's pid.
    for args in [
        vec!["--resume", run_dir.to_str().unwrap()],
        vec!["--config", cfg.to_str().unwrap(), "--overwrite"],
    ] {
        let (rc, err) = train(&args);
        assert_eq!(rc, Some(1), "{err}");
        assert!(
            err.contains("in use by process") && err.contains(&pid),
            "{err}"
        );
    }
    assert!(
        first.try_wait().unwrap().is_none(),
        "the first run must go on"
    );
    // kill -9: the kernel drops the lock with the process.
    first.kill().unwrap();
    first.wait().unwrap();
    let last = *checkpoints(&run_dir).last().expect("a checkpoint");
    let steps = format!("run.steps={}", last + 1);
    let (rc, err) = train(&["--resume", run_dir.to_str().unwrap(), "--set", &steps]);
    assert_eq!(rc, Some(0), "{err}");
    assert!(err.contains(&format!("resuming {} from step {last}", run_dir.display())));
    assert_eq!(log_rows(&run_dir), last + 1);
}

// ---------------------------------------------------------------------------------------
// 7. SIGTERM; 9. relative paths and resuming from another directory
// ---------------------------------------------------------------------------------------

#[test]
fn sigterm_writes_a_checkpoint_and_the_run_resumes_from_any_directory() {
    let d = tempfile::tempdir().unwrap();
    let base = d.path().join("project");
    std::fs::create_dir_all(&base).unwrap();
    // Relative paths, as a user writes them: the model is created by init_tiny.
    let text = config_text("runs", "models/tiny", 5, 0)
        .replace("[model]\n", "[model]\ninit_tiny = true\n");
    std::fs::write(base.join("c.toml"), text).unwrap();
    let child = concord()
        .args(["train", "--config", "c.toml", "--set", "run.steps=100000"])
        .current_dir(&base)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let run_dir = base.join("runs/r");
    let (rc, err) = sigterm_after_rows(child, &run_dir, 2);
    // Not killed by the signal (rc 143 / None): the step finished, a checkpoint was
    // written and the exit is a plain failure with the resume hint.
    assert_eq!(rc, Some(1), "{err}");
    assert!(err.contains("resume with `concord train --resume"), "{err}");
    let cks = checkpoints(&run_dir);
    assert_eq!(
        cks.len(),
        1,
        "save_every = 0: only the interrupt's checkpoint"
    );
    let last = cks[0];
    assert_eq!(log_rows(&run_dir), last);

    // The run's config.toml names no path of this machine: its paths are relative to
    // the run directory, and load as the absolute ones they stand for...
    let text = std::fs::read_to_string(run_dir.join("config.toml")).unwrap();
    assert!(!text.contains(d.path().to_str().unwrap()), "{text}");
    assert!(text.contains("output_dir = \"..\""), "{text}");
    assert!(text.contains("name = \"../../models/tiny\""), "{text}");
    let saved = Config::load(&run_dir.join("config.toml"), &[]).unwrap();
    assert_eq!(saved.run.output_dir, base.join("runs"));
    assert_eq!(
        saved.model.name,
        base.join("models/tiny").display().to_string()
    );
    // ... so a resume from elsewhere finds the model and the run, and builds nothing
    // in the current directory.
    let elsewhere = d.path().join("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    let steps = format!("run.steps={}", last + 2);
    let (rc, err) = run(concord()
        .args([
            "train",
            "--resume",
            run_dir.to_str().unwrap(),
            "--set",
            &steps,
        ])
        .current_dir(&elsewhere));
    assert_eq!(rc, Some(0), "{err}");
    assert_eq!(log_rows(&run_dir), last + 2);
    assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0);
}

// ---------------------------------------------------------------------------------------
// 5. Resume may not change the adapter, optimizer or schedule
// ---------------------------------------------------------------------------------------

/// A finished 2-step run in `dir`, a checkpoint at each step: its config and directory.
fn two_step_run(dir: &Path) -> (PathBuf, PathBuf) {
    let cfg = write_config(dir, 2, 1);
    let (rc, err) = train(&["--config", cfg.to_str().unwrap()]);
    assert_eq!(rc, Some(0), "{err}");
    (cfg, dir.join("runs/r"))
}

#[test]
fn resume_refuses_changes_to_the_adapter_optimizer_and_schedule() {
    let d = tempfile::tempdir().unwrap();
    let (cfg, run_dir) = two_step_run(d.path());
    let r = run_dir.to_str().unwrap();
    let log = std::fs::read(run_dir.join("training_log.csv")).unwrap();
    for (set, key) in [
        ("lora.r=4", "lora.r"),
        (r#"lora.targets=["q_proj","v_proj"]"#, "lora.targets"),
        ("lora.alpha=8", "lora.alpha"),
        ("optim.schedule=cosine", "optim.schedule"),
        ("optim.learning_rate=0.1", "optim.learning_rate"),
        ("grpo.num_iterations=2", "grpo.num_iterations"),
        ("run.seed=7", "run.seed"),
    ] {
        let (rc, err) = train(&["--resume", r, "--set", set, "--set", "run.steps=3"]);
        assert_eq!(rc, Some(1), "{set}: {err}");
        assert!(
            err.contains("--resume cannot change") && err.contains(key),
            "{err}"
        );
    }
    // A changed --config file is compared the same way.
    let changed = d.path().join("changed.toml");
    let text = std::fs::read_to_string(&cfg)
        .unwrap()
        .replace("r = 2", "r = 8");
    std::fs::write(&changed, text).unwrap();
    let (rc, err) = train(&["--resume", r, "--config", changed.to_str().unwrap()]);
    assert_eq!(rc, Some(1));
    assert!(err.contains("lora.r (2 -> 8)"), "{err}");
    assert_eq!(
        std::fs::read(run_dir.join("training_log.csv")).unwrap(),
        log
    );
    // Sampling and the step count (constant schedule) may change.
    let (rc, err) = train(&[
        "--resume",
        r,
        "--set",
        "grpo.temperature=0.7",
        "--set",
        "run.steps=3",
    ]);
    assert_eq!(rc, Some(0), "{err}");
    assert_eq!(log_rows(&run_dir), 3);
}

/// Issue 54, item 3: an edit of the run's own config.toml is held to what the latest
/// checkpoint recorded, as a `--set` is: the rank, the seed, the learning rate, and a
/// base of the same shape with other weights.
#[test]
fn resume_holds_an_edited_run_config_to_the_checkpoint() {
    let d = tempfile::tempdir().unwrap();
    let (_, run_dir) = two_step_run(d.path());
    let r = run_dir.to_str().unwrap();
    let saved = run_dir.join("config.toml");
    let original = std::fs::read_to_string(&saved).unwrap();
    let log = std::fs::read(run_dir.join("training_log.csv")).unwrap();
    // Same shape, other weights: the tiny model with another seed.
    let other = d.path().join("other-tiny");
    let spec = concord::model::tiny::TinySpec {
        seed: 99,
        ..Default::default()
    };
    concord::model::tiny::init_tiny(&spec, &other).unwrap();
    let other_line = format!("name = {:?}", other.display().to_string());
    for (line, to, key) in [
        ("r = 2", "r = 8", "lora.r (2 -> 8)"),
        ("seed = 42", "seed = 5", "run.seed (42 -> 5)"),
        (
            "learning_rate = 0.001",
            "learning_rate = 0.5",
            "optim.learning_rate",
        ),
        ("tiny\"", other_line.as_str(), "model.name"),
    ] {
        // The one line that starts with (or, for the model, ends with) `line`.
        let edited: Vec<&str> = original
            .lines()
            .map(
                |l| match l.starts_with(line) || l.starts_with("name") && l.ends_with(line) {
                    true => to,
                    false => l,
                },
            )
            .collect();
        let edited = edited.join("\n") + "\n";
        assert_eq!(
            original
                .lines()
                .zip(edited.lines())
                .filter(|(a, b)| a != b)
                .count(),
            1,
            "{line} in {original}"
        );
        std::fs::write(&saved, edited).unwrap();
        let (rc, err) = train(&["--resume", r, "--set", "run.steps=4"]);
        assert_eq!(rc, Some(1), "{to}: {err}");
        assert!(
            err.contains("--resume cannot change") && err.contains(key),
            "{to}: {err}"
        );
        assert!(err.contains("checkpoint-2"), "{err}");
        assert_eq!(
            std::fs::read(run_dir.join("training_log.csv")).unwrap(),
            log
        );
    }
    // The unedited run resumes.
    std::fs::write(&saved, &original).unwrap();
    let (rc, err) = train(&["--resume", r, "--set", "run.steps=3"]);
    assert_eq!(rc, Some(0), "{err}");
    assert_eq!(log_rows(&run_dir), 3);
}

// ---------------------------------------------------------------------------------------
// 3. Size bounds
// ---------------------------------------------------------------------------------------

#[test]
fn oversized_configs_are_refused_with_the_key() {
    let base = config_text("runs", "m", 3, 0);
    for (set, key) in [
        ("grpo.num_generations=100000000000", "grpo.num_generations"),
        (
            "grpo.max_completion_length=10000000",
            "grpo.max_completion_length",
        ),
        ("grpo.prompts_per_step=1000000", "grpo.prompts_per_step"),
        ("run.steps=1000000000000", "run.steps"),
        ("grpo.num_iterations=1000000", "grpo.num_iterations"),
        ("lora.r=100000000", "lora.r"),
    ] {
        let e = Config::from_toml_str(&base, "c.toml", &[set.to_string()])
            .unwrap_err()
            .to_string();
        assert!(e.contains(key) && e.contains("limit"), "{set}: {e}");
    }
    // A curriculum of thousands of stages is refused before any is built (item 16).
    let stages: String = (0..300)
        .map(|i| format!("[[stage]]\nname = \"s{i}\"\nsteps = 1\nenvs = {{ ticketmelt = 1.0 }}\n"))
        .collect();
    let many = format!(
        "{}{stages}",
        base.replace("[env]\nname = \"ticketmelt\"\n", "")
    );
    let t0 = Instant::now();
    let e = match Config::from_toml_str(&many, "c.toml", &[]) {
        Ok(_) => panic!("300 stages were accepted"),
        Err(e) => e.to_string(),
    };
    assert!(e.contains("[[stage]]") && e.contains("limit of 256"), "{e}");
    assert!(t0.elapsed() < Duration::from_secs(10));
}

#[test]
fn oversized_requests_are_clear_errors_not_allocation_aborts() {
    let d = tempfile::tempdir().unwrap();
    let model = tiny().to_str().unwrap();
    let msgs = d.path().join("m.json");
    std::fs::write(&msgs, r#"[{"role":"user","content":"hi"}]"#).unwrap();
    let m = msgs.to_str().unwrap();
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec![
                "generate",
                "--model",
                model,
                "--messages",
                m,
                "--max-new-tokens",
                "100000000",
            ]
            .into_iter()
            .map(String::from)
            .collect(),
            "max_position_embeddings",
        ),
        (
            vec![
                "generate",
                "--model",
                model,
                "--messages",
                m,
                "--num-samples",
                "100000000",
            ]
            .into_iter()
            .map(String::from)
            .collect(),
            "memory is available",
        ),
        (
            // Values no sane request uses (issue #31, item 23).
            vec![
                "generate",
                "--model",
                model,
                "--messages",
                m,
                "--min-new-tokens",
                "10",
                "--max-new-tokens",
                "2",
            ]
            .into_iter()
            .map(String::from)
            .collect(),
            "--min-new-tokens 10 is more than --max-new-tokens 2",
        ),
        (
            vec![
                "score".to_string(),
                "--model".into(),
                model.into(),
                "--messages".into(),
                m.into(),
                "--completion".into(),
                " a".repeat(40_000),
            ],
            "max_position_embeddings",
        ),
        (
            vec![
                "bench",
                "sample",
                "--model",
                "random:tiny",
                "--prompts",
                "100000",
                "--num-generations",
                "100000",
            ]
            .into_iter()
            .map(String::from)
            .collect(),
            "memory is available",
        ),
    ];
    for (args, want) in cases {
        let (rc, err) = run(concord().args(&args));
        assert_eq!(rc, Some(1), "{:?}: {err}", &args[..2]);
        assert!(err.contains(want), "{:?}: {err}", &args[..2]);
        assert!(!err.contains("memory allocation"), "{err}");
    }
    // Training: max_completion_length past the model's positions is refused before the
    // run directory exists.
    let cfg = write_config(d.path(), 2, 0);
    let (rc, err) = train(&[
        "--config",
        cfg.to_str().unwrap(),
        "--set",
        "grpo.max_completion_length=40000",
    ]);
    assert_eq!(rc, Some(1));
    assert!(err.contains("max_position_embeddings (32768)"), "{err}");
    assert!(!d.path().join("runs/r").exists());
}

// ---------------------------------------------------------------------------------------
// 6. init_tiny never overwrites
// ---------------------------------------------------------------------------------------

#[test]
fn init_tiny_refuses_a_directory_with_other_files() {
    use concord::model::load::{load_model, ModelSpec};
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("m");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("model.safetensors"), b"my placeholder").unwrap();
    let spec = ModelSpec {
        init_tiny: true,
        ..ModelSpec::new(dir.to_str().unwrap(), candle_core::Device::Cpu)
    };
    let e = format!("{:#}", load_model(&spec).err().unwrap());
    assert!(
        e.contains("not empty") && e.contains("model.safetensors"),
        "{e}"
    );
    assert_eq!(
        std::fs::read(dir.join("model.safetensors")).unwrap(),
        b"my placeholder"
    );
    assert!(!dir.join("config.json").exists());
    // An empty directory is fine.
    let empty = d.path().join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let spec = ModelSpec {
        init_tiny: true,
        ..ModelSpec::new(empty.to_str().unwrap(), candle_core::Device::Cpu)
    };
    assert!(load_model(&spec).is_ok());
}

/// Issue 54, item 8: `model init-tiny` never writes a checkpoint that does not load or
/// that loads old weights: a head dim qwen2 cannot record is refused, and a directory
/// holding an earlier tiny model (one file) re-initialised with two shards scores as a
/// fresh model of the new seed does, not as the old single file would.
#[test]
fn init_tiny_writes_only_checkpoints_that_load_what_it_says() {
    let d = tempfile::tempdir().unwrap();
    let dir = |n: &str| d.path().join(n).display().to_string();
    let init = |args: &[&str]| run(concord().args(["model", "init-tiny"]).args(args));
    let (rc, err) = init(&["--out", &dir("h"), "--family", "qwen2", "--head-dim", "32"]);
    assert_eq!(rc, Some(1), "{err}");
    assert!(err.contains("qwen2's config.json has none"), "{err}");
    assert!(!d.path().join("h/model.safetensors").exists());
    let (rc, err) = init(&["--out", &dir("h"), "--family", "qwen3", "--head-dim", "32"]);
    assert_eq!(rc, Some(0), "{err}");
    let msgs = d.path().join("m.json");
    std::fs::write(&msgs, r#"[{"role": "user", "content": "hi"}]"#).unwrap();
    let score = |model: &str| {
        let out = concord()
            .args(["score", "--model", model, "--completion", " hello there"])
            .arg("--messages")
            .arg(&msgs)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert_eq!(init(&["--out", &dir("re"), "--seed", "1"]).0, Some(0));
    let first = score(&dir("re"));
    assert_eq!(
        init(&["--out", &dir("re"), "--seed", "2", "--shards", "2"]).0,
        Some(0)
    );
    assert_eq!(
        init(&["--out", &dir("fresh"), "--seed", "2", "--shards", "2"]).0,
        Some(0)
    );
    let again = score(&dir("re"));
    assert_ne!(again, first, "the old seed's weights were loaded");
    assert_eq!(again, score(&dir("fresh")));
    assert!(!d.path().join("re/model.safetensors").exists());
    // A directory with anything else in it is someone's data.
    std::fs::write(d.path().join("re/README.md"), "mine").unwrap();
    let (rc, err) = init(&["--out", &dir("re"), "--seed", "3"]);
    assert_eq!(rc, Some(1), "{err}");
    assert!(err.contains("README.md"), "{err}");
    assert!(d.path().join("re/model.safetensors.index.json").exists());
}

// ---------------------------------------------------------------------------------------
// 10. Validation gaps
// ---------------------------------------------------------------------------------------

/// The error `c.toml` with this text gives (with its context chain).
fn config_err(text: &str) -> String {
    format!(
        "{:#}",
        Config::from_toml_str(text, "c.toml", &[]).unwrap_err()
    )
}

#[test]
fn config_gaps_are_closed() {
    let base = config_text("runs", "m", 3, 0);
    let bad = |sets: &[&str]| -> String {
        let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
        format!(
            "{:#}",
            Config::from_toml_str(&base, "c.toml", &sets).unwrap_err()
        )
    };
    assert!(bad(&["grpo.top_p=0"]).contains("grpo.top_p"));
    assert!(bad(&["run.name=\".\""]).contains("run.name"));
    assert!(bad(&["run.name=\"..\""]).contains("run.name"));
    // [env.options] errors carry the file and the option's line.
    let text = format!("{base}[env.options]\npeers = \"mixed\"\nweights = [-1, 0, 0, 0]\n");
    let e = config_err(&text);
    assert!(
        e.starts_with("c.toml: line 25:") && e.contains("weights"),
        "{e}"
    );
    let text = format!("{base}[env.options]\nwin_threshold = nan\n");
    let e = config_err(&text);
    assert!(
        e.starts_with("c.toml: line 24:") && e.contains("win_threshold"),
        "{e}"
    );
    let text = format!("{base}[env.options]\nbogus = 1\n");
    let e = config_err(&text);
    assert!(
        e.starts_with("c.toml: line 24:") && e.contains("bogus"),
        "{e}"
    );
    let text = base.replace("name = \"ticketmelt\"", "name = \"nosuchenv\"");
    let e = config_err(&text);
    assert!(
        e.starts_with("c.toml: line 22:") && e.contains("nosuchenv"),
        "{e}"
    );
    // The variables Concord sets at every render cannot be overridden (issue 54, item 6).
    for k in ["add_generation_prompt", "bos_token", "messages"] {
        let e = bad(&[&format!("model.chat_template_kwargs.{k}=false")]);
        assert!(
            e.contains("model.chat_template_kwargs") && e.contains(&format!("`{k}`")),
            "{e}"
        );
    }
    let ok = Config::from_toml_str(
        &base,
        "c.toml",
        &["model.chat_template_kwargs.enable_thinking=true".to_string()],
    );
    assert!(ok.is_ok(), "{:?}", ok.err());
}

/// A copy of the tiny model with `edit` applied to its config.json.
fn edited_tiny(dir: &Path, edit: impl Fn(&mut serde_json::Value)) -> PathBuf {
    let out = dir.join("edited");
    std::fs::create_dir_all(&out).unwrap();
    for e in std::fs::read_dir(tiny()).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), out.join(e.file_name())).unwrap();
    }
    let p = out.join("config.json");
    let mut j: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    edit(&mut j);
    std::fs::write(&p, j.to_string()).unwrap();
    out
}

fn load_err(dir: &Path) -> String {
    use concord::model::load::{load_model, ModelSpec};
    let spec = ModelSpec::new(dir.to_str().unwrap(), candle_core::Device::Cpu);
    format!("{:#}", load_model(&spec).err().expect("must fail"))
}

/// Rewrite `model/model.safetensors` with the f32 bytes of tensor `name` edited.
fn edit_tensor(model: &Path, name: &str, edit: impl FnOnce(&mut [u8])) {
    let p = model.join("model.safetensors");
    let bytes = std::fs::read(&p).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut tensors: Vec<(String, Vec<u8>, Vec<usize>, safetensors::Dtype)> = st
        .tensors()
        .into_iter()
        .map(|(n, v)| (n, v.data().to_vec(), v.shape().to_vec(), v.dtype()))
        .collect();
    let t = tensors.iter_mut().find(|t| t.0 == name).unwrap();
    assert_eq!(t.3, safetensors::Dtype::F32);
    edit(&mut t.1);
    let views: Vec<(String, safetensors::tensor::TensorView)> = tensors
        .iter()
        .map(|(n, b, s, dt)| {
            let v = safetensors::tensor::TensorView::new(*dt, s.clone(), b).unwrap();
            (n.clone(), v)
        })
        .collect();
    std::fs::write(&p, safetensors::serialize(views, &None).unwrap()).unwrap();
}

/// Issue 54, item 7: config.json values of the wrong type are refused by key, not
/// read as defaults; a scaling that rope_parameters would drop is refused; and a model
/// that loads but computes NaN (a final norm of f32::MAX overflows to inf) is an error
/// in `score` and `generate`, never output.
#[test]
fn silent_wrong_models_are_refused() {
    let d = tempfile::tempdir().unwrap();
    type Edit<'a> = &'a dyn Fn(&mut serde_json::Value);
    let cases: [(&str, Edit, &str); 5] = [
        (
            "theta-str",
            &|j| j["rope_theta"] = "1000000".into(),
            "rope_theta must be a number",
        ),
        (
            "theta-bool",
            &|j| j["rope_theta"] = true.into(),
            "rope_theta must be a number",
        ),
        (
            "eps-str",
            &|j| j["rms_norm_eps"] = "1e-6".into(),
            "rms_norm_eps must be a number",
        ),
        (
            "tie-str",
            &|j| j["tie_word_embeddings"] = "yes".into(),
            "tie_word_embeddings must be true or false",
        ),
        (
            "yarn",
            &|j| {
                j["rope_scaling"] = serde_json::json!({"rope_type": "yarn", "factor": 4.0});
                j["rope_parameters"] =
                    serde_json::json!({"rope_type": "default", "rope_theta": 1e6});
            },
            "rope_scaling says rope type \"yarn\"",
        ),
    ];
    for (name, edit, want) in cases {
        let m = edited_tiny(&d.path().join(name), edit);
        let e = load_err(&m);
        assert!(e.contains(want), "{name}: {e}");
    }
    // Loads (no weight is NaN or infinite), but every logit is.
    let m = edited_tiny(&d.path().join("overflow"), |_| {});
    edit_tensor(&m, "model.norm.weight", |b| {
        for w in b.chunks_mut(4) {
            w.copy_from_slice(&f32::MAX.to_le_bytes());
        }
    });
    let msgs = d.path().join("m.json");
    std::fs::write(&msgs, r#"[{"role": "user", "content": "hi"}]"#).unwrap();
    let model = m.display().to_string();
    let m_arg = msgs.display().to_string();
    for args in [
        vec![
            "score",
            "--model",
            &model,
            "--messages",
            &m_arg,
            "--completion",
            " hi",
        ],
        vec![
            "generate",
            "--model",
            &model,
            "--messages",
            &m_arg,
            "--max-new-tokens",
            "3",
        ],
    ] {
        let out = concord().args(&args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{}: {err}", args[0]);
        assert!(err.contains("NaN"), "{}: {err}", args[0]);
        assert!(out.stdout.is_empty(), "{}: {:?}", args[0], out.stdout);
    }
}

/// Issue #31, item 23: a base checkpoint whose weights hold NaN or an infinity is
/// refused at load, naming the tensor (it would make every step a skipped NaN).
#[test]
fn a_base_checkpoint_holding_nan_is_refused_by_tensor_name() {
    let d = tempfile::tempdir().unwrap();
    for (i, bad) in [f32::NAN, f32::NEG_INFINITY].into_iter().enumerate() {
        let m = edited_tiny(&d.path().join(format!("m{i}")), |_| {});
        let name = "model.layers.0.mlp.up_proj.weight";
        edit_tensor(&m, name, |b| b[4..8].copy_from_slice(&bad.to_le_bytes()));
        let e = load_err(&m);
        assert!(e.contains(name) && e.contains("NaN or infinite"), "{e}");
    }
}

#[test]
fn bad_checkpoints_are_named_errors() {
    let d = tempfile::tempdir().unwrap();
    let m = edited_tiny(&d.path().join("a"), |j| j["rms_norm_eps"] = (-1.0).into());
    assert!(load_err(&m).contains("rms_norm_eps"));
    // A shape past any real model is refused by name before its tensors are listed
    // (10 million layers once aborted in an allocation; issue #31, item 3).
    let t0 = Instant::now();
    let m = edited_tiny(&d.path().join("huge"), |j| {
        j["num_hidden_layers"] = 10_000_000.into()
    });
    let e = load_err(&m);
    assert!(
        e.contains("config.json") && e.contains("num_hidden_layers"),
        "{e}"
    );
    for (flag, v) in [
        ("--hidden", "1000000"),
        ("--layers", "1000000000"),
        ("--vocab", "100000000"),
    ] {
        let out = d.path().join(format!("tiny{flag}"));
        let (rc, err) = run(concord().args([
            "model",
            "init-tiny",
            "--out",
            out.to_str().unwrap(),
            flag,
            v,
        ]));
        assert_eq!(rc, Some(1), "{flag} {v}: {err}");
        assert!(
            err.contains("at most") || err.contains("memory"),
            "{flag} {v}: {err}"
        );
        assert!(!out.join("model.safetensors").exists());
    }
    assert!(t0.elapsed() < Duration::from_secs(30));
    // An explicitly untied config without lm_head.weight is tied, as before (pinned by
    // tests/load_checkpoint.rs), but never silently: a warning names the file.
    let m = edited_tiny(&d.path().join("b"), |j| {
        j["tie_word_embeddings"] = false.into()
    });
    let msgs = d.path().join("m.json");
    std::fs::write(&msgs, r#"[{"role":"user","content":"hi"}]"#).unwrap();
    let (rc, err) = run(concord().args([
        "score",
        "--model",
        m.to_str().unwrap(),
        "--messages",
        msgs.to_str().unwrap(),
        "--completion",
        "x",
    ]));
    assert_eq!(rc, Some(0), "{err}");
    assert!(
        err.contains("warning:")
            && err.contains("config.json says tie_word_embeddings = false")
            && err.contains("no lm_head.weight"),
        "{err}"
    );
    // Corrupt safetensors: truncated, and a header length past the file.
    let m = edited_tiny(&d.path().join("c"), |_| {});
    let w = m.join("model.safetensors");
    let bytes = std::fs::read(&w).unwrap();
    std::fs::write(&w, &bytes[..bytes.len() / 2]).unwrap();
    let e = load_err(&m);
    assert!(e.contains("model.safetensors"), "{e}");
    std::fs::write(&w, [0xff, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, b'{']).unwrap();
    let e = load_err(&m);
    assert!(e.contains("model.safetensors"), "{e}");
    // A 3-token tokenizer would train on [UNK]s: refused by name (issue #31, item 23).
    let m = edited_tiny(&d.path().join("t"), |_| {});
    let three = r#"{"version":"1.0","truncation":null,"padding":null,"added_tokens":[],
        "normalizer":null,"pre_tokenizer":{"type":"Whitespace"},"post_processor":null,
        "decoder":null,"model":{"type":"WordLevel","vocab":{"a":0,"b":1,"[UNK]":2},
        "unk_token":"[UNK]"}}"#;
    std::fs::write(m.join("tokenizer.json"), three).unwrap();
    let e = load_err(&m);
    assert!(
        e.contains("tokenizer.json") && e.contains("only 3 ids"),
        "{e}"
    );
}

#[test]
fn corrupt_run_files_are_named() {
    let d = tempfile::tempdir().unwrap();
    let cfg = write_config(d.path(), 2, 1);
    let run_dir = d.path().join("runs/r");
    let (rc, err) = train(&["--config", cfg.to_str().unwrap()]);
    assert_eq!(rc, Some(0), "{err}");
    let state = run_dir.join("checkpoint-2/trainer_state.json");
    std::fs::write(&state, "{\"step\": 2,").unwrap();
    let (rc, err) = train(&[
        "--resume",
        run_dir.to_str().unwrap(),
        "--set",
        "run.steps=3",
    ]);
    assert_eq!(rc, Some(1));
    assert!(err.contains(&state.display().to_string()), "{err}");
    let opt = run_dir.join("checkpoint-1/optimizer.safetensors");
    std::fs::write(&opt, b"\x05\0\0\0\0\0\0\0{").unwrap();
    std::fs::remove_dir_all(run_dir.join("checkpoint-2")).unwrap();
    let (rc, err) = train(&[
        "--resume",
        run_dir.to_str().unwrap(),
        "--set",
        "run.steps=3",
    ]);
    assert_eq!(rc, Some(1));
    assert!(err.contains(&opt.display().to_string()), "{err}");
}

#[test]
fn zero_counts_and_huge_rings_are_refused_by_the_command_line() {
    for args in [
        &["bench", "train", "--model", "random:tiny", "--batch", "0"][..],
        &[
            "eval",
            "--config",
            "configs/quickstart.toml",
            "--batch",
            "0",
        ],
        &[
            "eval",
            "--config",
            "configs/quickstart.toml",
            "--episodes",
            "0",
        ],
        &["envs", "baseline", "ticketmelt", "--episodes", "0"],
    ] {
        let (rc, err) = run(concord().args(args).current_dir(env!("CARGO_MANIFEST_DIR")));
        assert_eq!(rc, Some(2), "{args:?}: {err}");
        assert!(err.contains("must be at least 1"), "{args:?}: {err}");
        assert!(!err.contains("candle"), "{err}");
    }
    let t0 = Instant::now();
    let (rc, err) = run(concord().args(["envs", "graph", "merge_ring", "--agents", "16"]));
    assert_eq!(rc, Some(1));
    assert!(err.contains("at most 10"), "{err}");
    assert!(t0.elapsed() < Duration::from_secs(30));
}

/// Seconds, episode and session flags take a bounded range: `inf`, `nan`, `1e30`, a
/// trillion episodes or 100,000 threads are refused by the parser, naming the flag,
/// instead of panicking, aborting or running for days (issue #31, items 1, 2, 16).
#[test]
fn extreme_seconds_episodes_and_sessions_are_refused_naming_the_flag() {
    let cases: &[(&[&str], &str, &[&str])] = &[
        (
            &["serve", "ticketmelt", "--port", "0", "--session-timeout"],
            "--session-timeout",
            &["1e30", "inf", "nan", "-1", "86401"],
        ),
        (
            &["serve", "ticketmelt", "--port", "0", "--max-sessions"],
            "--max-sessions",
            &["0", "100000", "-1"],
        ),
        (
            &["bench", "serve", "ticketmelt", "--secs"],
            "--secs",
            &["1e30", "inf", "nan", "-1"],
        ),
        (
            &["bench", "serve", "ticketmelt", "--secs", "1", "--sessions"],
            "--sessions",
            &["100000", "0"],
        ),
        (
            &["envs", "bench", "ticketmelt", "--secs"],
            "--secs",
            &["1e30", "inf", "nan", "-0.5"],
        ),
        (
            &["envs", "baseline", "ticketmelt", "--episodes"],
            "--episodes",
            &["1000000000000", "1e12", "-1", "0"],
        ),
        (
            &["eval", "--config", "configs/quickstart.toml", "--episodes"],
            "--episodes",
            &["1000000001", "nan"],
        ),
    ];
    for (args, flag, values) in cases {
        for v in *values {
            let t0 = Instant::now();
            // `--flag=VALUE`, so that `-1` reaches the flag's parser as its value.
            let (head, last) = args.split_at(args.len() - 1);
            let (rc, err) = run(concord()
                .args(head)
                .arg(format!("{}={v}", last[0]))
                .current_dir(env!("CARGO_MANIFEST_DIR")));
            assert_eq!(rc, Some(2), "{args:?} {v}: {err}");
            assert!(err.contains(flag), "{args:?} {v}: {err}");
            assert!(!err.contains("panicked"), "{args:?} {v}: {err}");
            assert!(t0.elapsed() < Duration::from_secs(30), "{args:?} {v}");
        }
    }
    // A bad --host is blamed on the host, not on the port (item 22).
    let (rc, err) = run(concord().args([
        "serve",
        "ticketmelt",
        "--port",
        "0",
        "--host",
        "not a host!",
    ]));
    assert_eq!(rc, Some(1), "{err}");
    assert!(
        err.contains("--host") && !err.contains("port is in use"),
        "{err}"
    );
    // In range, a zero timeout still means "never" and a short bench runs.
    let (rc, err) = run(concord().args(["envs", "bench", "ticketmelt", "--secs", "0"]));
    assert_eq!(rc, Some(0), "{err}");
}

/// A log cut inside its header by a crash is started again on resume, so every row
/// matches its columns (issue #31, item 11).
#[test]
fn a_resume_repairs_a_log_cut_inside_its_header() {
    let d = tempfile::tempdir().unwrap();
    let cfg = write_config(d.path(), 2, 1);
    let (rc, err) = train(&["--config", cfg.to_str().unwrap()]);
    assert_eq!(rc, Some(0), "{err}");
    let run_dir = d.path().join("runs/r");
    let log = run_dir.join("training_log.csv");
    let header = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .next()
        .unwrap()
        .to_string();
    std::fs::write(&log, &header[..header.len() / 3]).unwrap();
    let dir = run_dir.to_str().unwrap();
    let (rc, err) = train(&["--resume", dir, "--set", "run.steps=3"]);
    assert_eq!(rc, Some(0), "{err}");
    let text = std::fs::read_to_string(&log).unwrap();
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some(header.as_str()));
    let rows: Vec<&str> = lines.collect();
    assert_eq!(rows.len(), 1, "{text}");
    let width = header.split(',').count();
    assert!(rows.iter().all(|r| r.split(',').count() == width), "{text}");
}

/// A signal during the warm start's SFT checkpoints it like one during GRPO, and
/// `train --resume RUN_DIR` alone continues it (issue #31, items 5 and 6).
#[test]
fn sigterm_in_the_warm_start_checkpoints_and_resume_continues_it() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().display().to_string();
    let sets = |sft_steps: &str| {
        vec![
            format!("run.output_dir={out}"),
            format!("model.name={out}/tiny"),
            "run.steps=1".to_string(),
            "grpo.max_completion_length=6".to_string(),
            "grpo.prompts_per_step=1".to_string(),
            "grpo.num_generations=2".to_string(),
            format!("sft.steps={sft_steps}"),
            "sft.examples=8".to_string(),
            "sft.batch_size=2".to_string(),
        ]
    };
    let mut cmd = concord();
    cmd.args(["train", "--config", "configs/quickstart.toml"]);
    for s in sets("100000") {
        cmd.args(["--set", &s]);
    }
    let child = cmd
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let run_dir = d.path().join("quickstart");
    let sft = run_dir.join("sft");
    let (rc, err) = sigterm_after_rows(child, &sft, 2);
    assert_eq!(rc, Some(1), "{err}");
    let hint = format!("resume with `concord train --resume {}`", run_dir.display());
    assert!(err.contains(&hint), "{err}");
    let last = *checkpoints(&sft)
        .last()
        .expect("the interrupt's checkpoint");
    assert_eq!(log_rows(&sft), last);
    assert!(run_dir.join("config.toml").exists());

    let mut cmd = concord();
    cmd.args(["train", "--resume", run_dir.to_str().unwrap()]);
    let steps = (last + 1).to_string();
    for s in &sets(&steps)[2..] {
        cmd.args(["--set", s]);
    }
    let (rc, err) = run(&mut cmd);
    assert_eq!(rc, Some(0), "{err}");
    assert_eq!(log_rows(&sft), last + 1);
    assert_eq!(log_rows(&run_dir), 1);
}

/// A run directory copied (or renamed) elsewhere resumes where it is, and the original
/// is left alone (issue #31, item 12).
#[test]
fn a_copied_run_directory_resumes_in_place() {
    let d = tempfile::tempdir().unwrap();
    let cfg = write_config(d.path(), 2, 1);
    let (rc, err) = train(&["--config", cfg.to_str().unwrap()]);
    assert_eq!(rc, Some(0), "{err}");
    let (orig, copy) = (d.path().join("runs/r"), d.path().join("elsewhere/copy"));
    std::fs::create_dir_all(d.path().join("elsewhere")).unwrap();
    let st = Command::new("cp")
        .arg("-r")
        .args([&orig, &copy])
        .status()
        .unwrap();
    assert!(st.success());
    let (rc, err) = train(&["--resume", copy.to_str().unwrap(), "--set", "run.steps=3"]);
    assert_eq!(rc, Some(0), "{err}");
    assert_eq!(log_rows(&copy), 3);
    assert_eq!(checkpoints(&copy), [1, 2, 3]);
    assert_eq!(log_rows(&orig), 2);
}

/// Spawn `concord args` with stdout and stderr piped and both read ends closed at once,
/// as when the `tee` or `head` a job was piped into exits.
fn with_closed_outputs(args: &[&str]) -> std::process::ExitStatus {
    let mut child = concord()
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    drop(child.stderr.take());
    child.wait().unwrap()
}

/// A reader that goes away loses nothing: training runs to the end and writes its
/// checkpoints and adapter, and a listing ends quietly (issue #31, item 4).
#[test]
fn a_closed_stdout_or_stderr_never_loses_a_run() {
    let d = tempfile::tempdir().unwrap();
    let cfg = write_config(d.path(), 3, 2);
    let st = with_closed_outputs(&["train", "--config", cfg.to_str().unwrap()]);
    assert!(st.success(), "{st}");
    let run_dir = d.path().join("runs/r");
    assert_eq!(log_rows(&run_dir), 3);
    assert!(checkpoints(&run_dir).contains(&2));
    assert!(run_dir.join("adapter_model.safetensors").exists());
    for args in [
        &["envs", "play", "ticketmelt", "--seed", "1"][..],
        &["envs", "describe", "ticketmelt"],
        &["envs", "baseline", "ticketmelt", "--episodes", "20"],
    ] {
        let st = with_closed_outputs(args);
        assert!(st.success(), "{args:?}: {st}");
    }
}

#[test]
fn empty_conversations_and_unknown_roles_are_refused() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("m.json");
    std::fs::write(&p, "[]").unwrap();
    let e = format!("{:#}", concord::chat::read_messages(&p).unwrap_err());
    assert!(e.contains("m.json") && e.contains("empty"), "{e}");
    std::fs::write(&p, r#"[{"role":"boss","content":"hi"}]"#).unwrap();
    let e = format!("{:#}", concord::chat::read_messages(&p).unwrap_err());
    assert!(e.contains("unknown role `boss`"), "{e}");
    let j = d.path().join("p.jsonl");
    std::fs::write(&j, "[{\"role\":\"user\",\"content\":\"a\"}]\n[]\n").unwrap();
    let e = format!("{:#}", concord::chat::read_prompts_jsonl(&j).unwrap_err());
    assert!(e.contains("line 2") && e.contains("empty"), "{e}");
}

// ---------------------------------------------------------------------------------------
// 11. Help text
// ---------------------------------------------------------------------------------------

/// Every argument of every subcommand has a description, and no rustdoc link syntax
/// leaks into the help.
#[test]
fn every_argument_is_described() {
    use clap::CommandFactory;
    fn walk(cmd: &clap::Command, path: &str, bad: &mut Vec<String>) {
        for a in cmd.get_arguments() {
            let id = a.get_id().as_str();
            if id == "help" || id == "version" {
                continue;
            }
            let help = a
                .get_long_help()
                .or(a.get_help())
                .map(|h| h.to_string())
                .unwrap_or_default();
            if help.trim().is_empty() {
                bad.push(format!("{path} {id}: no description"));
            }
            if help.contains("[`") {
                bad.push(format!("{path} {id}: rustdoc link in `{help}`"));
            }
            for v in a.get_possible_values() {
                let h = v.get_help().map(|h| h.to_string()).unwrap_or_default();
                if h.contains("[`") {
                    bad.push(format!("{path} {id}={}: rustdoc link", v.get_name()));
                }
            }
        }
        let about = cmd
            .get_long_about()
            .or(cmd.get_about())
            .map(|h| h.to_string())
            .unwrap_or_default();
        if about.trim().is_empty() || about.contains("[`") {
            bad.push(format!("{path}: missing or rustdoc about `{about}`"));
        }
        // An about that lists subcommands (`bench sample`, ...) lists all of them; the
        // lists had gone stale (issue #31, item 24).
        let subs: Vec<&str> = cmd
            .get_subcommands()
            .map(|s| s.get_name())
            .filter(|n| *n != "help")
            .collect();
        let named = |n: &str| about.contains(&format!("`{} {n}", cmd.get_name()));
        if subs.iter().any(|n| named(n)) {
            for n in subs.iter().filter(|n| !named(n)) {
                bad.push(format!("{path}: the about lists subcommands but not `{n}`"));
            }
        }
        for sub in cmd.get_subcommands() {
            if sub.get_name() != "help" {
                walk(sub, &format!("{path} {}", sub.get_name()), bad);
            }
        }
    }
    let mut bad = Vec::new();
    walk(&concord::cli::Cli::command(), "concord", &mut bad);
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

#[test]
fn the_readme_lists_every_documented_flag() {
    let read = |page: &str| {
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(page)).unwrap()
    };
    // The command-line reference moved from the README to docs/cli.md.
    let cli = read("docs/cli.md");
    for needle in [
        "model init-adapter",
        "--stop",
        "--min-new-tokens",
        "--logprobs",
        "--batch",
        "--set",
        "--shape",
        "--dtype",
        "--shards",
        "--overwrite",
    ] {
        assert!(cli.contains(needle), "docs/cli.md lacks {needle}");
    }
    // The README's Reliability section moved to docs/reliability.md.
    assert!(read("docs/reliability.md").contains("# Reliability"));
}

// ---------------------------------------------------------------------------------------
// Fuzz: generated configs never panic, every error names a key or the file
// ---------------------------------------------------------------------------------------

/// splitmix64: a seeded generator, so a failure reproduces.
struct Gen(u64);

impl Gen {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn pick<'a, T>(&mut self, xs: &'a [T]) -> &'a T {
        &xs[self.below(xs.len())]
    }
    fn chance(&mut self, p: f64) -> bool {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }
}

const SECTIONS: &[(&str, &[&str])] = &[
    (
        "run",
        &[
            "name",
            "output_dir",
            "seed",
            "steps",
            "save_every",
            "log_samples",
            "save_total_limit",
        ],
    ),
    ("model", &["name", "dtype", "device", "init_tiny"]),
    ("lora", &["r", "alpha", "dropout", "targets", "use_rslora"]),
    (
        "grpo",
        &[
            "num_generations",
            "prompts_per_step",
            "max_completion_length",
            "temperature",
            "top_p",
            "top_k",
            "min_p",
            "repetition_penalty",
            "beta",
            "epsilon",
            "epsilon_high",
            "delta",
            "loss_type",
            "importance_sampling_level",
            "scale_rewards",
            "mask_truncated_completions",
            "num_iterations",
            "reward_weights",
        ],
    ),
    (
        "optim",
        &[
            "learning_rate",
            "max_grad_norm",
            "betas",
            "eps",
            "weight_decay",
            "warmup_steps",
            "schedule",
            "micro_batch",
            "share_prompt",
            "memory_budget_gb",
            "gradient_checkpointing",
        ],
    ),
    ("env", &["name", "options"]),
];

const OPTION_KEYS: &[&str] = &[
    "preset",
    "peers",
    "dumb_fraction",
    "rounds",
    "max_fix",
    "peer_mirror",
    "weights",
    "win_threshold",
    "urgent_weight",
    "reward",
    "win_rule",
    "agents",
    "regime",
    "episodes",
    "bogus",
];

fn random_value(g: &mut Gen, depth: usize) -> toml::Value {
    use toml::Value as V;
    match g.below(if depth > 1 { 4 } else { 6 }) {
        0 => {
            let r = (g.next() >> 1) as i64;
            V::Integer(*g.pick(&[
                0,
                1,
                -1,
                2,
                3,
                8,
                1000,
                100_000_000_000,
                i64::MAX,
                i64::MIN,
                r,
            ]))
        }
        1 => V::Float(*g.pick(&[
            0.0,
            -0.0,
            1.0,
            -1.0,
            0.5,
            1e-300,
            1e308,
            1e11,
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::MIN_POSITIVE,
        ])),
        2 => V::String(
            g.pick(&[
                "",
                ".",
                "..",
                "a/b",
                "ticketmelt",
                "merge_ring",
                "random:tiny",
                "cuda:99",
                "cpu",
                "bf16",
                "q_proj",
                "cosine",
                "dapo",
                "é\u{0}x",
                "x\ny",
            ])
            .to_string(),
        ),
        3 => V::Boolean(g.chance(0.5)),
        4 => V::Array(
            (0..g.below(5))
                .map(|_| random_value(g, depth + 1))
                .collect(),
        ),
        _ => {
            let mut t = toml::Table::new();
            for _ in 0..g.below(4) {
                let k = g.pick(OPTION_KEYS).to_string();
                t.insert(k, random_value(g, depth + 1));
            }
            V::Table(t)
        }
    }
}

/// A valid base config with random keys of random types and extreme values, as text;
/// one in ten is also cut or garbled.
fn random_config(g: &mut Gen) -> String {
    let base = config_text("runs", "m", 4, 1);
    let mut t: toml::Table = toml::from_str(&base).unwrap();
    for _ in 0..1 + g.below(3) {
        if g.chance(0.1) {
            // An unknown section or key.
            let (sec, _) = *g.pick(SECTIONS);
            let sec = if g.chance(0.5) { "bogus" } else { sec };
            let entry = t
                .entry(sec.to_string())
                .or_insert_with(|| toml::Value::Table(Default::default()));
            if let Some(tt) = entry.as_table_mut() {
                tt.insert("no_such_key".into(), random_value(g, 0));
            }
            continue;
        }
        if g.chance(0.1) {
            // A [[stage]] table with random fields.
            let mut st = toml::Table::new();
            st.insert(
                "name".into(),
                toml::Value::String(format!("s{}", g.below(3))),
            );
            for k in [
                "steps",
                "max_steps",
                "promote_when",
                "envs",
                "grpo",
                "optim",
                "options",
            ] {
                if g.chance(0.3) {
                    st.insert(k.into(), random_value(g, 0));
                }
            }
            let arr = t
                .entry("stage".to_string())
                .or_insert_with(|| toml::Value::Array(Vec::new()));
            if let Some(a) = arr.as_array_mut() {
                a.push(toml::Value::Table(st));
            }
            continue;
        }
        let (sec, keys) = *g.pick(SECTIONS);
        let key = *g.pick(keys);
        let value = if g.chance(0.5) {
            // A plausible value, so that many configs get past the first check.
            if g.chance(0.5) {
                toml::Value::Integer(1 + g.below(8) as i64)
            } else {
                toml::Value::Float(0.1 * (1 + g.below(9)) as f64)
            }
        } else if sec == "env" && key == "options" {
            let mut o = toml::Table::new();
            for _ in 0..g.below(3) {
                o.insert(g.pick(OPTION_KEYS).to_string(), random_value(g, 1));
            }
            toml::Value::Table(o)
        } else {
            random_value(g, 0)
        };
        if let Some(tt) = t.get_mut(sec).and_then(|v| v.as_table_mut()) {
            tt.insert(key.to_string(), value);
        }
    }
    let mut text = toml::to_string(&t).unwrap_or_else(|_| base.clone());
    if g.chance(0.1) {
        let mut cut = g.below(text.len().max(1));
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
        if g.chance(0.5) {
            let tails: [&str; 5] = ["[", "= 3", "\"", "[[stage]]\n", "x = [1, \"a\"]"];
            let tail = *g.pick(&tails);
            text.push_str(tail);
        }
    }
    text
}

#[test]
fn fuzzed_configs_never_panic_and_errors_name_the_file() {
    let mut g = Gen(0x00C0_FFEE);
    let (mut ok, mut refused) = (0, 0);
    for i in 0..1500 {
        let text = random_config(&mut g);
        let result = std::panic::catch_unwind(|| {
            let cfg = match Config::from_toml_str(&text, "fuzz.toml", &[]) {
                Ok(c) => c,
                Err(e) => return Err(format!("{e:#}")),
            };
            // What a run derives from a valid config must not panic or fail either.
            let stages = concord::curriculum::build(&cfg)
                .unwrap_or_else(|e| panic!("validated, yet building failed: {e:#}"));
            let total = concord::curriculum::total_steps(&cfg, &stages);
            let _ = total
                .checked_mul(cfg.grpo.num_iterations)
                .expect("no overflow");
            let _ = cfg.grpo.batch_size();
            assert!(cfg.frozen_changes(&cfg).is_empty());
            let mut c2 = cfg.clone();
            c2.resolve_paths(Path::new("/tmp"));
            Ok(())
        });
        match result {
            Err(_) => panic!("config #{i} panicked:\n{text}"),
            Ok(Ok(())) => ok += 1,
            Ok(Err(msg)) => {
                refused += 1;
                assert!(
                    msg.starts_with("fuzz.toml: "),
                    "config #{i}: the error does not name the file: {msg}\n{text}"
                );
                assert!(
                    msg.len() > "fuzz.toml: ".len() + 8,
                    "config #{i}: empty error: {msg}"
                );
            }
        }
    }
    eprintln!("fuzz: {ok} valid, {refused} refused");
    assert!(ok > 100 && refused > 500, "ok {ok}, refused {refused}");
    // And through Config::load from a file: errors name the file.
    let d = tempfile::tempdir().unwrap();
    for i in 0..50 {
        let text = random_config(&mut g);
        let p = d.path().join(format!("f{i}.toml"));
        std::fs::write(&p, &text).unwrap();
        if let Err(e) = Config::load(&p, &[]) {
            let msg = format!("{e:#}");
            assert!(msg.starts_with(&p.display().to_string()), "{msg}");
        }
    }
}

// ---------------------------------------------------------------------------------------
// Numeric flags with extreme values (issue #31, acceptance)
// ---------------------------------------------------------------------------------------

/// The `--long` flags whose values parse to a number or a duration, per subcommand path.
fn numeric_flags() -> Vec<(String, String)> {
    use clap::CommandFactory;
    use std::any::TypeId;
    let numeric = [
        TypeId::of::<u8>(),
        TypeId::of::<u16>(),
        TypeId::of::<u32>(),
        TypeId::of::<u64>(),
        TypeId::of::<usize>(),
        TypeId::of::<i32>(),
        TypeId::of::<i64>(),
        TypeId::of::<f32>(),
        TypeId::of::<f64>(),
        TypeId::of::<Duration>(),
    ];
    fn walk(cmd: &clap::Command, path: &str, numeric: &[TypeId], out: &mut Vec<(String, String)>) {
        for a in cmd.get_arguments() {
            let ty = a.get_value_parser().type_id();
            if let Some(long) = a.get_long().filter(|_| numeric.iter().any(|t| ty == *t)) {
                out.push((path.trim().to_string(), long.to_string()));
            }
        }
        for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
            walk(sub, &format!("{path} {}", sub.get_name()), numeric, out);
        }
    }
    let mut out = Vec::new();
    walk(&concord::cli::Cli::command(), "", &numeric, &mut out);
    out
}

/// A command that needs no network and finishes in seconds with sane values, per
/// subcommand; `{new}` is a fresh path for each run. A flag under test replaces its
/// `--flag=value` here.
fn quick_invocation(path: &str, d: &Path, run_dir: &Path) -> Option<Vec<String>> {
    let tiny = tiny().display().to_string();
    let cfg = d.join("c.toml").display().to_string();
    let msgs = d.join("m.json").display().to_string();
    let model = format!("--model={tiny}");
    let args: Vec<String> = match path {
        "envs play" => vec!["envs".into(), "play".into(), "ticketmelt".into()],
        "envs baseline" => vec![
            "envs".into(),
            "baseline".into(),
            "ticketmelt".into(),
            "--episodes=2".into(),
        ],
        "envs bench" => vec![
            "envs".into(),
            "bench".into(),
            "ticketmelt".into(),
            "--secs=0.05".into(),
        ],
        "envs graph" => vec![
            "envs".into(),
            "graph".into(),
            "merge_ring".into(),
            "--agents=2".into(),
        ],
        "model init-tiny" => vec!["model".into(), "init-tiny".into(), "--out={new}".into()],
        "model estimate" => vec![
            "model".into(),
            "estimate".into(),
            "--shape=qwen2.5-0.5b".into(),
        ],
        "model init-adapter" => {
            vec![
                "model".into(),
                "init-adapter".into(),
                model,
                "--out={new}".into(),
            ]
        }
        "generate" => vec![
            "generate".into(),
            model,
            format!("--messages={msgs}"),
            "--max-new-tokens=4".into(),
        ],
        "eval" => vec![
            "eval".into(),
            format!("--config={cfg}"),
            "--base".into(),
            "--episodes=2".into(),
            "--out={new}".into(),
        ],
        "bench sample" => vec![
            "bench".into(),
            "sample".into(),
            model,
            "--prompts=1".into(),
            "--num-generations=1".into(),
            "--new-tokens=2".into(),
            "--prompt-tokens=4".into(),
            "--warmup=0".into(),
        ],
        "bench train" => vec![
            "bench".into(),
            "train".into(),
            model,
            "--batch=1".into(),
            "--seq=8".into(),
            "--iters=1".into(),
            "--r=2".into(),
        ],
        "bench grpo-step" => vec![
            "bench".into(),
            "grpo-step".into(),
            format!("--config={cfg}"),
        ],
        "bench serve" => vec![
            "bench".into(),
            "serve".into(),
            "ticketmelt".into(),
            "--secs=0.2".into(),
            "--sessions=1".into(),
            "--steps=2".into(),
        ],
        "plot" => vec![
            "plot".into(),
            run_dir.display().to_string(),
            "--window=2".into(),
        ],
        "serve" => vec!["serve".into(), "ticketmelt".into(), "--port=0".into()],
        _ => return None,
    };
    Some(args)
}

/// Issue #31's acceptance: every flag that takes a number or a duration, given 0, -1,
/// the largest u64, 1e30, 1e308 (issue 54), inf or nan, ends in a clean error (exit 1
/// or 2, no panic, no signal) or a clean run, within a minute. A server that starts listening counts as a
/// clean run and is stopped.
#[test]
fn numeric_flags_with_extreme_values_end_cleanly() {
    const VALUES: [&str; 7] = [
        "0",
        "-1",
        "18446744073709551615",
        "1e30",
        "1e308",
        "inf",
        "nan",
    ];
    let d = tempfile::tempdir().unwrap();
    let cfg = write_config(d.path(), 1, 0);
    let run_dir = d.path().join("runs/r");
    let (rc, err) = train(&["--config", cfg.to_str().unwrap()]);
    assert_eq!(rc, Some(0), "{err}");
    std::fs::write(
        d.path().join("m.json"),
        r#"[{"role":"user","content":"hi"}]"#,
    )
    .unwrap();
    let mut uncovered = Vec::new();
    let mut failures = Vec::new();
    let mut n = 0;
    for (path, flag) in numeric_flags() {
        let Some(base) = quick_invocation(&path, d.path(), &run_dir) else {
            uncovered.push(format!("{path} --{flag}"));
            continue;
        };
        for v in VALUES {
            n += 1;
            let new = d.path().join(format!("new{n}"));
            let prefix = format!("--{flag}=");
            let mut args: Vec<String> = base
                .iter()
                .filter(|a| !a.starts_with(&prefix))
                .map(|a| a.replace("{new}", &new.display().to_string()))
                .collect();
            args.push(format!("{prefix}{v}"));
            if let Some(why) = ends_cleanly(&args, d.path(), &path) {
                failures.push(format!("concord {}: {why}", args.join(" ")));
            }
        }
    }
    assert!(
        uncovered.is_empty(),
        "no quick invocation for: {uncovered:?}"
    );
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// None if `concord ARGS` ended cleanly; else what went wrong.
fn ends_cleanly(args: &[String], dir: &Path, path: &str) -> Option<String> {
    let out = dir.join("fuzz.out");
    let err = dir.join("fuzz.err");
    let mut child = concord()
        .args(args)
        .current_dir(dir)
        .env_remove("RUST_BACKTRACE")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        let listening = path == "serve"
            && std::fs::read_to_string(&out).is_ok_and(|o| o.contains("listening on"));
        if listening || t0.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let stderr = std::fs::read_to_string(&err).unwrap_or_default();
    let tail: String = stderr
        .chars()
        .rev()
        .take(600)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    match status {
        None if path == "serve" && t0.elapsed() <= Duration::from_secs(60) => None,
        None => Some(format!("still running after 60 s: {tail}")),
        Some(s) if stderr.contains("panicked") => Some(format!("panicked ({s}): {tail}")),
        Some(s) => match s.code() {
            Some(0..=2) => None,
            _ => Some(format!("ended by {s}: {tail}")),
        },
    }
}

/// Issue #31, item 18: the processes of one job on one host share the memory budget
/// (two ranks of the 0.5B, each budgeting 70% of the host, were OOM-killed). The tiny
/// model's run with a launcher's local size of 2 budgets for two and still trains.
#[test]
fn ranks_on_one_host_share_the_memory_budget() {
    let d = tempfile::tempdir().unwrap();
    let cfg = write_config(d.path(), 1, 0);
    let out = concord()
        .args(["train", "--config", cfg.to_str().unwrap()])
        .env("LOCAL_WORLD_SIZE", "2")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("shared by 2 processes on this host"),
        "{text}"
    );
    assert_eq!(log_rows(&d.path().join("runs/r")), 1);
}

/// Issue #31, item 22: a huge value is not echoed back whole by the flag's error (clap's
/// own errors went around the shortening every other error gets).
#[test]
fn a_huge_flag_value_is_not_echoed_whole() {
    let huge = "9".repeat(100_000);
    let (rc, err) = run(concord().args(["envs", "bench", "ticketmelt", &format!("--secs={huge}")]));
    assert_eq!(rc, Some(2), "{}", &err[..err.len().min(300)]);
    assert!(
        err.contains("--secs") && err.contains("characters left out"),
        "{}",
        err.len()
    );
    assert!(err.len() < 5_000, "{} bytes", err.len());
}

/// Issue #31, items 13, 22 and 24: `eval` past the held-out seeds fails and leaves the
/// earlier eval.json as it was; `--against` with a file that is no eval.json says what it
/// expected; a `random:` model in `train` points at `init_tiny`.
#[test]
fn eval_and_train_refuse_what_cannot_work_and_keep_the_earlier_report() {
    let d = tempfile::tempdir().unwrap();
    let cfg = write_config(d.path(), 1, 0);
    let cfg = cfg.to_str().unwrap();
    let out = d.path().join("eval.json");
    std::fs::write(&out, "earlier report").unwrap();
    let out_s = out.to_str().unwrap();
    let (rc, err) = run(concord()
        .args(["eval", "--config", cfg, "--base", "--out", out_s])
        .args(["--first-seed", "18446744073709551615", "--episodes", "2"]));
    assert_eq!(rc, Some(1), "{err}");
    assert!(err.contains("held-out seeds"), "{err}");
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "earlier report");

    let (rc, err) = run(concord()
        .args([
            "eval",
            "--config",
            cfg,
            "--base",
            "--episodes",
            "2",
            "--against",
            out_s,
            "--out",
        ])
        .arg(d.path().join("e2.json")));
    assert_eq!(rc, Some(1), "{err}");
    assert!(err.contains("expected an eval.json"), "{err}");

    let (rc, err) = train(&["--config", cfg, "--set", "model.name=random:tiny"]);
    assert_eq!(rc, Some(1), "{err}");
    assert!(err.contains("init_tiny"), "{err}");
}

/// Issue #31, item 5: SIGTERM during a standalone `concord sft` writes a checkpoint and
/// says how to resume, and the resume continues it (the handler used to be installed
/// only when GRPO started).
#[test]
fn sigterm_in_a_standalone_sft_checkpoints_and_resume_continues_it() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().display().to_string();
    let sets = |steps: &str| {
        vec![
            format!("run.output_dir={out}"),
            format!("model.name={out}/tiny"),
            format!("sft.steps={steps}"),
            "sft.examples=8".to_string(),
            "sft.batch_size=2".to_string(),
        ]
    };
    let mut cmd = concord();
    cmd.args(["sft", "--config", "configs/quickstart.toml"]);
    for s in sets("100000") {
        cmd.args(["--set", &s]);
    }
    let child = cmd
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let run_dir = d.path().join("quickstart");
    let (rc, err) = sigterm_after_rows(child, &run_dir, 2);
    assert_eq!(rc, Some(1), "{err}");
    assert!(err.contains("--resume") && err.contains(&out), "{err}");
    let last = *checkpoints(&run_dir)
        .last()
        .expect("the interrupt's checkpoint");
    assert_eq!(log_rows(&run_dir), last);

    let mut cmd = concord();
    cmd.args(["sft", "--resume", run_dir.to_str().unwrap()]);
    let steps = (last + 1).to_string();
    for s in &sets(&steps)[2..] {
        cmd.args(["--set", s]);
    }
    let (rc, err) = run(&mut cmd);
    assert_eq!(rc, Some(0), "{err}");
    assert_eq!(log_rows(&run_dir), last + 1);
}

/// Issue #31, item 19: credentials in an `[env] url` never reach the output of a
/// run that cannot connect (the error names the server, redacted).
#[test]
fn credentials_in_an_env_url_stay_out_of_the_output() {
    let d = tempfile::tempdir().unwrap();
    let cfg = write_config(d.path(), 1, 0);
    let (rc, err) = train(&[
        "--config",
        cfg.to_str().unwrap(),
        "--set",
        "env.url=ws://user:hunter2secret@127.0.0.1:1",
        "--set",
        "env.mode=episode",
        "--set",
        "env.timeout=2.0",
    ]);
    assert_ne!(rc, Some(0), "{err}");
    assert!(err.contains("127.0.0.1:1"), "names the server: {err}");
    assert!(!err.contains("hunter2secret"), "{err}");
}

/// Issue 54, item 11: every file `eval` would write is checked before any episode is
/// played (1,000 episodes would take minutes), and a refused output leaves nothing.
#[test]
fn eval_outputs_are_checked_before_playing() {
    let d = tempfile::tempdir().unwrap();
    let cfg = write_config(d.path(), 1, 0);
    let eval = |out: &Path, extra: &[&str]| {
        let t0 = Instant::now();
        let mut c = concord();
        c.args(["eval", "--config", cfg.to_str().unwrap(), "--base"])
            .args(["--episodes", "1000", "--out", out.to_str().unwrap()])
            .args(extra);
        let (rc, text) = run(&mut c);
        assert_ne!(rc, Some(0), "{text}");
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "played first: {text}"
        );
        text
    };
    // a folder that does not exist is not created
    let missing = d.path().join("no/such/dir/e.json");
    let e = eval(&missing, &[]);
    assert!(
        e.contains("no/such/dir") && e.contains("does not exist"),
        "{e}"
    );
    assert!(!d.path().join("no").exists());
    // a directory where the decisions file goes
    let out = d.path().join("e.json");
    std::fs::create_dir(d.path().join("e_decisions.jsonl")).unwrap();
    let e = eval(&out, &[]);
    assert!(
        e.contains("e_decisions.jsonl") && e.contains("directory"),
        "{e}"
    );
    // a folder that takes no file (skipped as root, who may write anywhere)
    let ro = d.path().join("ro");
    std::fs::create_dir(&ro).unwrap();
    let mut perm = std::fs::metadata(&ro).unwrap().permissions();
    perm.set_readonly(true);
    std::fs::set_permissions(&ro, perm).unwrap();
    if std::fs::write(ro.join("x"), b"").is_err() {
        let e = eval(&ro.join("e.json"), &["--transcripts"]);
        assert!(e.contains("cannot write"), "{e}");
    }
    // nothing was left behind
    let mut left: Vec<String> = Vec::new();
    for dir in [d.path().to_path_buf(), ro.clone()] {
        for f in std::fs::read_dir(&dir).unwrap() {
            left.push(f.unwrap().file_name().to_string_lossy().into_owned());
        }
    }
    left.sort();
    assert!(
        left.iter()
            .all(|f| !f.ends_with(".tmp") && !f.ends_with(".probe") && f != "e.json"),
        "{left:?}"
    );
}

/// Issue 54, item 14: `model estimate` takes exactly the names `[model]` takes, and each
/// refusal lists what it would take.
#[test]
fn estimate_takes_the_configs_names_and_lists_the_valid_ones() {
    let estimate = |extra: &[&str]| {
        let mut c = concord();
        c.args(["model", "estimate"]).args(extra);
        run(&mut c)
    };
    let shape = "--shape=qwen2.5-0.5b";
    let (rc, err) = estimate(&["--shape=nope"]);
    assert_eq!(rc, Some(2), "{err}");
    assert!(
        err.contains("qwen2.5-0.5b") && err.contains("llama3.2-1b"),
        "{err}"
    );
    for bad in ["auto", "Q4_K", "F32", "q4_k"] {
        let (rc, err) = estimate(&[shape, &format!("--dtype={bad}")]);
        assert_eq!(rc, Some(2), "--dtype {bad}: {err}");
        assert!(err.contains("expected f32, bf16 or f16"), "{err}");
    }
    let (rc, err) = estimate(&[shape, "--base-dtype=gguf"]);
    assert_eq!(rc, Some(2), "{err}");
    assert!(err.contains("q8_0 or q4_k"), "{err}");
    for bad in ["Q4_K", "q4_0", "auto"] {
        let (rc, err) = estimate(&[shape, &format!("--base-dtype={bad}")]);
        assert_eq!(rc, Some(2), "--base-dtype {bad}: {err}");
        let listed = err.split("expected").nth(1).unwrap_or_default();
        assert!(listed.contains("q4_k") && !listed.contains("gguf"), "{err}");
    }
    let mut c = concord();
    c.args([
        "model",
        "estimate",
        shape,
        "--dtype=f32",
        "--base-dtype=q4_k",
    ]);
    let out = c.output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (v["dtype"].as_str(), v["base_dtype"].as_str()),
        (Some("f32"), Some("q4_k"))
    );
}

/// Issue 54, item 4: a model whose weights cannot fit under the process's memory limit
/// (here RLIMIT_AS, as `ulimit -v` sets it; a cgroup's memory.max is read the same way)
/// is refused before loading, with the limit named and what would fit; and held-out
/// evaluation is bounded.
#[test]
fn memory_limits_are_read_and_a_model_that_cannot_fit_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let msgs = d.path().join("m.json");
    std::fs::write(&msgs, r#"[{"role": "user", "content": "hi"}]"#).unwrap();
    let t0 = std::time::Instant::now();
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "ulimit -v 4000000 && exec '{}' generate --model random:qwen2.5-7b --messages '{}' \
             --max-new-tokens 1",
            env!("CARGO_BIN_EXE_concord"),
            msgs.display()
        ))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("RLIMIT_AS") && err.contains("base_dtype"),
        "{err}"
    );
    assert!(t0.elapsed() < std::time::Duration::from_secs(30));
    let cfg = write_config(d.path(), 1, 0);
    let (rc, err) = train(&[
        "--config",
        cfg.to_str().unwrap(),
        "--set",
        "run.eval_every=1",
        "--set",
        "run.eval_episodes=99999999999999",
    ]);
    assert_eq!(rc, Some(1), "{err}");
    assert!(
        err.contains("run.eval_episodes") && err.contains("100000"),
        "{err}"
    );
}

/// Issue 54's acceptance: every numeric key of the config reference (`concord docs
/// config`), given 0, -1, NaN, ±inf, 1e308, i64::MAX and i64::MAX + 1, is either
/// accepted or refused by an error naming the key; none panics. The values the checks
/// accept then run one step of the tiny model: each ends with rc 0 or a clean error,
/// never a panic, an abort or a kill, within a bound.
#[test]
fn every_numeric_config_key_with_extreme_values_is_accepted_or_named() {
    use concord::config::reference::sections;
    const VALUES: [&str; 9] = [
        "0",
        "-1",
        "nan",
        "inf",
        "-inf",
        "1e308",
        "-1e308",
        "9223372036854775807",
        "9223372036854775808",
    ];
    let d = tempfile::tempdir().unwrap();
    let cfg = write_config(d.path(), 1, 0);
    // An [sft] section of its own, so that its keys are judged on their own.
    let base = std::fs::read_to_string(&cfg).unwrap()
        + "[sft]\nsource = \"env\"\npolicy = \"random\"\nexamples = 4\nsteps = 1\nbatch_size = 2\n";
    std::fs::write(&cfg, &base).unwrap();
    let (mut tried, mut accepted) = (0, Vec::new());
    for s in sections().unwrap() {
        let section = s.header.trim_matches(['[', ']']);
        if !["run", "model", "lora", "grpo", "optim", "env", "sft"].contains(&section) {
            continue;
        }
        for k in s
            .keys
            .iter()
            .filter(|k| ["integer", "float"].contains(&k.toml_type.as_str()))
        {
            for v in VALUES {
                let set = format!("{section}.{}={v}", k.name);
                tried += 1;
                let r = std::panic::catch_unwind(|| {
                    Config::from_toml_str(&base, "c.toml", std::slice::from_ref(&set))
                        .map_err(|e| format!("{e:#}"))
                });
                match r {
                    Err(_) => panic!("{set}: the config checks panicked"),
                    Ok(Ok(_)) => accepted.push(set),
                    Ok(Err(e)) => {
                        let key = format!("{section}.{}", k.name);
                        assert!(
                            e.contains(&key),
                            "{set}: the error does not name {key}: {e}"
                        );
                        assert!(e.len() < 600, "{set}: {e}");
                    }
                }
            }
        }
    }
    assert!(tried > 400, "{tried} cases");
    // What the checks accept trains (or fails cleanly) on the tiny model.
    let log = d.path().join("stderr.txt");
    for set in &accepted {
        let mut child = concord()
            .args(["train", "--overwrite", "--config"])
            .arg(&cfg)
            .args(["--set", set])
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let t0 = std::time::Instant::now();
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            if t0.elapsed() > std::time::Duration::from_secs(120) {
                let _ = child.kill();
                panic!("{set}: still running after 120 s");
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        };
        let err = std::fs::read_to_string(&log).unwrap_or_default();
        assert!(
            matches!(status.code(), Some(0) | Some(1)),
            "{set}: {status:?} {err}"
        );
        assert!(!err.contains("panicked"), "{set}: {err}");
    }
    eprintln!("{tried} cases, {} accepted and run", accepted.len());
}

//! A reward program in a training run: one exchange per step, a crash mid-run stops
//! with a checkpoint and the program's stderr, and `--resume` writes the rows an
//! uninterrupted run writes; eval asks the same program.
use crate::util::{column, read_csv, REWARD_PROGRAM as PROGRAM};
use std::path::Path;
use std::process::Command;

/// A project in `dir`: the program, a config `c.toml` (`run` adds to its `[run]`), and
/// the file `crash` names, which makes the program crash.
fn project_with(dir: &Path, crash: Option<&str>, run: &str) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("reward.sh"), PROGRAM).unwrap();
    if let Some(file) = crash {
        std::fs::write(dir.join(file), "").unwrap();
    }
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/data/arithmetic.jsonl");
    let config = format!(
        r#"[run]
name = "r"
output_dir = "runs"
steps = 4
save_every = 0
log_samples = 0
{run}
[model]
name = "models/tiny"
init_tiny = true
[lora]
r = 2
alpha = 4
dropout = 0.0
targets = ["q_proj"]
[grpo]
num_generations = 4
prompts_per_step = 2
max_completion_length = 6
[optim]
learning_rate = 1e-3
schedule = "constant"
[env]
name = "dataset"
[env.options]
path = {data:?}
verifier = "numeric"
[env.options.reward]
command = ["sh", "reward.sh"]
dir = "."
name = "length"
weight = 0.1
"#
    );
    std::fs::write(dir.join("c.toml"), config).unwrap();
}

fn project(dir: &Path, crash: bool) {
    project_with(dir, crash.then_some("crash"), "");
}

fn concord(dir: &Path, args: &[&str]) -> (Option<i32>, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_concord"))
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    (
        o.status.code(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

fn requests(dir: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(dir.join("requests.log"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn a_reward_program_crash_checkpoints_and_resume_matches_an_unbroken_run() {
    let d = tempfile::tempdir().unwrap();
    let (whole, broken) = (d.path().join("whole"), d.path().join("broken"));
    project(&whole, false);
    project(&broken, true);

    let (rc, err) = concord(&whole, &["train", "--config", "c.toml"]);
    assert_eq!(rc, Some(0), "{err}");
    // one exchange per step, each with every completion of the step
    let asked = requests(&whole);
    assert_eq!(asked.len(), 4);
    for r in &asked {
        assert_eq!(r["batch"].as_array().unwrap().len(), 8, "{r}");
    }

    let (rc, err) = concord(&broken, &["train", "--config", "c.toml"]);
    assert_eq!(rc, Some(1), "{err}");
    for says in [
        "step 3 stopped: the reward program failed; checkpoint-2 written",
        "resume with `concord train --resume",
        "reward program `sh reward.sh`",
        "exit status: 7",
        "reward.sh: simulated crash at request 3",
    ] {
        assert!(err.contains(says), "`{says}` not in: {err}");
    }
    let run = broken.join("runs/r");
    assert!(run.join("checkpoint-2").is_dir());
    // resumed from elsewhere: the recorded `dir` still finds the program
    let (rc, err) = concord(d.path(), &["train", "--resume", run.to_str().unwrap()]);
    assert_eq!(rc, Some(0), "{err}");

    let (h1, a) = read_csv(&whole.join("runs/r/training_log.csv"));
    let (h2, b) = read_csv(&run.join("training_log.csv"));
    assert_eq!(h1, h2);
    assert_eq!(a.len(), 4);
    assert!(h1.iter().any(|c| c == "rewards/length/mean"), "{h1:?}");
    for c in [
        "reward",
        "rewards/length/mean",
        "rewards/numeric/mean",
        "grad_norm",
        "loss",
    ] {
        assert_eq!(column(&h1, &a, c), column(&h2, &b, c), "{c}");
    }
    // the reward is the verifier plus a tenth of the program's
    let (r, len, num) = (
        column(&h1, &a, "reward"),
        column(&h1, &a, "rewards/length/mean"),
        column(&h1, &a, "rewards/numeric/mean"),
    );
    for i in 0..4 {
        assert!((r[i] - (num[i] + 0.1 * len[i])).abs() < 1e-9, "row {i}");
    }

    // eval asks the program too, a round of episodes per exchange
    let before = requests(&whole).len();
    let (rc, err) = concord(
        &whole,
        &[
            "eval",
            "--config",
            "c.toml",
            "--episodes",
            "3",
            "--out",
            "e.json",
        ],
    );
    assert_eq!(rc, Some(0), "{err}");
    let asked = requests(&whole);
    let items: usize = asked[before..]
        .iter()
        .map(|r| r["batch"].as_array().unwrap().len())
        .sum();
    assert_eq!(items, 3);
    assert!(asked[before..]
        .iter()
        .flat_map(|r| r["batch"].as_array().unwrap())
        .all(|i| i["held_out"] == true));
    let report = std::fs::read_to_string(whole.join("e.json")).unwrap();
    assert!(report.contains("length"), "{report}");
}

#[test]
fn a_reward_program_crash_in_held_out_evaluation_checkpoints_and_resume_evaluates_again() {
    let d = tempfile::tempdir().unwrap();
    let (whole, broken) = (d.path().join("whole"), d.path().join("broken"));
    let run = "eval_every = 2\neval_episodes = 3";
    project_with(&whole, None, run);
    project_with(&broken, Some("crash_eval"), run);
    let (rc, err) = concord(&whole, &["train", "--config", "c.toml"]);
    assert_eq!(rc, Some(0), "{err}");
    let (rc, err) = concord(&broken, &["train", "--config", "c.toml"]);
    assert_eq!(rc, Some(1), "{err}");
    for says in [
        "the held-out evaluation after step 2 stopped; checkpoint-2 written",
        "reward.sh: simulated crash in evaluation",
    ] {
        assert!(err.contains(says), "`{says}` not in: {err}");
    }
    let (rc, err) = concord(&broken, &["train", "--resume", "runs/r"]);
    assert_eq!(rc, Some(0), "{err}");
    for file in ["eval_log.csv", "training_log.csv"] {
        let (h, a) = read_csv(&whole.join("runs/r").join(file));
        let (_, b) = read_csv(&broken.join("runs/r").join(file));
        assert_eq!(a.len(), b.len(), "{file}");
        for c in ["reward", "rewards/length/mean"] {
            let name = if file == "eval_log.csv" { "reward" } else { c };
            assert_eq!(column(&h, &a, name), column(&h, &b, name), "{file} {name}");
        }
    }
    let (h, rows) = read_csv(&broken.join("runs/r/eval_log.csv"));
    assert_eq!(column(&h, &rows, "step"), [0.0, 2.0, 4.0]);
}

/// TRL-style reward functions, unchanged, through `examples/trl_reward_shim.py`: each
/// function is a logged component and the reward is their sum. Python is a developer
/// tool here, never a CI dependency: `cargo test -- --ignored trl_reward_shim`.
#[test]
#[ignore = "needs python3"]
fn trl_reward_functions_serve_through_the_shim() {
    let d = tempfile::tempdir().unwrap();
    project(d.path(), false);
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let shim = root.join("examples/trl_reward_shim.py");
    let funcs = root.join("examples/rewards/arithmetic.py");
    let f = |name: &str| format!("{}:{name}", funcs.display());
    let command = format!(
        "command = [\"python3\", {:?}, {:?}, {:?}]\ncomponents = [\"correct\", \"brief\"]\n",
        shim.display().to_string(),
        f("correct"),
        f("brief")
    );
    let config = std::fs::read_to_string(d.path().join("c.toml")).unwrap();
    let config = config
        .replace("command = [\"sh\", \"reward.sh\"]\n", &command)
        .replace("name = \"length\"\nweight = 0.1\n", "name = \"trl\"\n");
    std::fs::write(d.path().join("c.toml"), config).unwrap();
    let (rc, err) = concord(d.path(), &["train", "--config", "c.toml"]);
    assert_eq!(rc, Some(0), "{err}");
    let (h, rows) = read_csv(&d.path().join("runs/r/training_log.csv"));
    let (trl, correct, brief) = (
        column(&h, &rows, "rewards/trl/mean"),
        column(&h, &rows, "rewards/correct/mean"),
        column(&h, &rows, "rewards/brief/mean"),
    );
    for i in 0..rows.len() {
        assert!((trl[i] - (correct[i] + brief[i])).abs() < 1e-9, "row {i}");
    }
}

/// A curriculum on the dataset: episode mode first, then decision mode. Every answer is
/// asked for exactly once, and a resumed run writes the rows an unbroken one does.
#[test]
fn a_dataset_curriculum_through_both_modes_asks_once_per_answer_and_resumes() {
    let d = tempfile::tempdir().unwrap();
    let stages = "[[stage]]\nname = \"episodes\"\nmode = \"episode\"\nsteps = 2\n\
                  [[stage]]\nname = \"decisions\"\n";
    let (whole, cut) = (d.path().join("whole"), d.path().join("cut"));
    for dir in [&whole, &cut] {
        project(dir, false);
        let c = std::fs::read_to_string(dir.join("c.toml")).unwrap();
        std::fs::write(dir.join("c.toml"), format!("{c}{stages}")).unwrap();
    }
    let (rc, err) = concord(&whole, &["train", "--config", "c.toml"]);
    assert_eq!(rc, Some(0), "{err}");
    let items: Vec<usize> = requests(&whole)
        .iter()
        .map(|r| r["batch"].as_array().unwrap().len())
        .collect();
    assert_eq!(items.iter().sum::<usize>(), 4 * 8, "{items:?}");
    let (rc, err) = concord(
        &cut,
        &["train", "--config", "c.toml", "--set", "run.steps=3"],
    );
    assert_eq!(rc, Some(0), "{err}");
    let (rc, err) = concord(
        &cut,
        &["train", "--resume", "runs/r", "--set", "run.steps=4"],
    );
    assert_eq!(rc, Some(0), "{err}");
    let (h, a) = read_csv(&whole.join("runs/r/training_log.csv"));
    let (_, b) = read_csv(&cut.join("runs/r/training_log.csv"));
    let stage = h.iter().position(|c| c == "stage").unwrap();
    let names: Vec<&str> = a.iter().map(|r| r[stage].as_str()).collect();
    assert_eq!(names, ["episodes", "episodes", "decisions", "decisions"]);
    for c in ["reward", "rewards/length/mean", "grad_norm"] {
        assert_eq!(column(&h, &a, c), column(&h, &b, c), "{c}");
    }
}

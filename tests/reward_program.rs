//! A reward program in a training run: one exchange per step, a crash mid-run stops
//! with a checkpoint and the program's stderr, and `--resume` writes the rows an
//! uninterrupted run writes; eval asks the same program.
use crate::util::{column, read_csv};
use std::path::Path;
use std::process::Command;

/// Rewards each answer by the length of its text (up to a first quote), logs every
/// request, and crashes at its third request when a file `crash` is there (removing
/// it, so that the resumed run's program goes on).
const PROGRAM: &str = r#"n=0
while IFS= read -r line; do
  n=$((n+1))
  if [ -f crash ] && [ "$n" -ge 3 ]; then
    rm crash
    echo "reward.sh: simulated crash at request $n" >&2
    exit 7
  fi
  printf '%s\n' "$line" >> requests.log
  printf '%s\n' "$line" | awk '{
    n = split($0, parts, /(\[|\},)\{"completion":"/); out = "";
    for (i = 2; i <= n; i++) { s = parts[i]; sub(/".*/, "", s); out = out (i > 2 ? "," : "") length(s) }
    print "{\"rewards\":[" out "]}"
  }'
done
"#;

fn project(dir: &Path, crash: bool) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("reward.sh"), PROGRAM).unwrap();
    if crash {
        std::fs::write(dir.join("crash"), "").unwrap();
    }
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/data/arithmetic.jsonl");
    let config = format!(
        r#"[run]
name = "r"
output_dir = "runs"
steps = 4
save_every = 0
log_samples = 0
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

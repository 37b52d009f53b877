//! Your own task: the dataset quickstart (a JSONL file with reference answers, two
//! verifiers) end to end on the tiny model: SFT from the rows' completions, GRPO, eval,
//! plot, and a run directory whose recorded config finds the file from where it stands.
use crate::util::{concord_ok, read_csv};

#[test]
fn dataset_quickstart_trains_evaluates_and_plots() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().display().to_string();
    let sets = [
        format!("run.output_dir={out}"),
        format!("model.name={out}/tiny"),
        "run.steps=4".to_string(),
        "run.eval_every=2".to_string(),
        "run.eval_episodes=6".to_string(),
        "sft.steps=8".to_string(),
    ];
    let mut args = vec!["train", "--config", "configs/dataset-quickstart.toml"];
    for s in &sets {
        args.extend(["--set", s]);
    }
    concord_ok(&args);
    let run = dir.path().join("dataset-quickstart");
    // the warm start imitated the rows' own completions
    let (h, rows) = read_csv(&run.join("sft/training_log.csv"));
    assert_eq!(rows.len(), 8, "{h:?}");
    // GRPO logged each verifier under TRL's names
    let (h, rows) = read_csv(&run.join("training_log.csv"));
    assert_eq!(rows.len(), 4);
    for c in [
        "rewards/correct/mean",
        "rewards/format/mean",
        "rewards/format/std",
    ] {
        assert!(h.iter().any(|x| x == c), "{c} not in {h:?}");
    }
    let col = |name: &str| h.iter().position(|x| x == name).unwrap();
    for r in &rows {
        let (reward, correct, format): (f64, f64, f64) = (
            r[col("reward")].parse().unwrap(),
            r[col("rewards/correct/mean")].parse().unwrap(),
            r[col("rewards/format/mean")].parse().unwrap(),
        );
        assert!((reward - (correct + 0.2 * format)).abs() < 1e-9, "{r:?}");
    }
    // held-out rows at steps 0, 2 and 4
    let (_, evals) = read_csv(&run.join("eval_log.csv"));
    let steps: Vec<&str> = evals.iter().map(|r| r[0].as_str()).collect();
    assert_eq!(steps, ["0", "2", "4"]);
    // eval from the recorded config, run from another directory: the dataset path
    // was written relative to the run directory
    let recorded = std::fs::read_to_string(run.join("config.toml")).unwrap();
    let absolute = format!("\"{}", env!("CARGO_MANIFEST_DIR"));
    assert!(!recorded.contains(&absolute), "{recorded}");
    let eval = dir.path().join("eval.json");
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_concord"))
        .args(["eval", "--config"])
        .arg(run.join("config.toml"))
        .args(["--episodes", "5", "--transcripts", "--json", "--out"])
        .arg(&eval)
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(&eval).unwrap()).unwrap();
    let text = report.to_string();
    assert!(
        text.contains("win_rate") && text.contains("correct"),
        "{text}"
    );
    // one transcript per held-out row, in file order, each with its scores
    let t = std::fs::read_to_string(dir.path().join("eval_transcripts.jsonl")).unwrap();
    let lines: Vec<serde_json::Value> = t
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 5);
    let mut last = 0;
    for l in &lines {
        let line = find(l, "line").and_then(|v| v.as_u64()).unwrap();
        assert!(line > last, "file order");
        last = line;
        assert!(
            find(l, "scores").and_then(|s| s.get("correct")).is_some(),
            "{l}"
        );
        assert_eq!(find(l, "held_out"), Some(&serde_json::Value::Bool(true)));
    }
    concord_ok(&["plot", run.to_str().unwrap()]);
    for png in ["reward_curve.png", "components.png", "learning_curve.png"] {
        assert!(run.join(png).is_file(), "{png}");
    }
}

/// The first value of `key` anywhere in `v` (transcripts nest the environment's own).
fn find<'a>(v: &'a serde_json::Value, key: &str) -> Option<&'a serde_json::Value> {
    match v {
        serde_json::Value::Object(m) => {
            m.get(key).or_else(|| m.values().find_map(|x| find(x, key)))
        }
        serde_json::Value::Array(a) => a.iter().find_map(|x| find(x, key)),
        _ => None,
    }
}

/// The reference policy scores every held-out row: the verifiers accept the file's own
/// answers (a check a user runs before training).
#[test]
fn the_quickstart_verifiers_accept_the_files_own_answers() {
    let out = concord_ok(&[
        "envs",
        "baseline",
        "dataset",
        "--set",
        "path=examples/data/arithmetic.jsonl",
        "--set",
        "held_out=0.2",
        "--set",
        "verifier=numeric",
        "--json",
    ]);
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    let rows = report["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2, "{out}");
    for r in rows {
        assert_eq!(r["win_rate"], 1.0, "{r}");
    }
}

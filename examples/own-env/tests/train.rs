//! The binary this crate builds: the environment is listed, described and baselined
//! by `concord envs`, and a run trains and evaluates on it (the built-in tiny model).
use std::path::Path;
use std::process::Command;

fn concord(dir: &Path, args: &[&str]) -> String {
    let o = Command::new(env!("CARGO_BIN_EXE_concord-own-env"))
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{args:?}: {err}");
    String::from_utf8_lossy(&o.stdout).into_owned()
}

const CONFIG: &str = r#"[run]
name = "r"
output_dir = "runs"
steps = 2
eval_every = 2
eval_episodes = 8
log_samples = 0
[model]
name = "models/tiny"
init_tiny = true
[lora]
r = 2
alpha = 4
targets = ["q_proj"]
[grpo]
num_generations = 4
prompts_per_step = 2
max_completion_length = 4
[optim]
learning_rate = 1e-3
[env]
name = "rendezvous"
[env.options]
places = 3
"#;

#[test]
fn the_environment_is_a_command_line_citizen() {
    let d = tempfile::tempdir().unwrap();
    let list = concord(d.path(), &["envs", "list"]);
    assert!(
        list.contains("rendezvous") && list.contains("ticketmelt"),
        "{list}"
    );
    let about = concord(d.path(), &["envs", "describe", "rendezvous"]);
    assert!(about.contains("policies: follow"), "{about}");
    let json = concord(
        d.path(),
        &[
            "envs",
            "baseline",
            "rendezvous",
            "--episodes",
            "50",
            "--json",
        ],
    );
    let report: serde_json::Value = serde_json::from_str(&json).unwrap();
    let follow = report["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["policy"] == "follow")
        .unwrap();
    assert_eq!(follow["win_rate"], 1.0, "{json}");
}

#[test]
fn a_run_trains_and_evaluates_on_it() {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(d.path().join("c.toml"), CONFIG).unwrap();
    concord(d.path(), &["train", "--config", "c.toml"]);
    let log = std::fs::read_to_string(d.path().join("runs/r/training_log.csv")).unwrap();
    assert_eq!(log.lines().count(), 3, "{log}");
    assert!(
        log.lines().next().unwrap().contains("rewards/win/mean"),
        "{log}"
    );
    let evals = std::fs::read_to_string(d.path().join("runs/r/eval_log.csv")).unwrap();
    assert!(evals.contains("rendezvous"), "{evals}");
    assert!(d.path().join("runs/r/adapter_model.safetensors").is_file());
}

//! Every model family through the whole pipeline: a tiny Qwen3 (head_dim != hidden /
//! heads, q/k norms) and a tiny Llama 3 (untied, llama3 RoPE scaling) are written by
//! `concord model init-tiny --family`, warm-started with SFT, trained with GRPO (shared
//! prompts and gradient checkpointing on) and evaluated, exactly as the quickstart does
//! for Qwen2. Numerical parity with transformers is `parity.rs`'s job; this checks that
//! nothing on the way assumes Qwen2.
use crate::util::concord_ok;
use concord::eval::EvalReport;
use concord::model::load::{load_model, ModelSpec};
use concord::model::Family;

fn family_runs(family: &str, init: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display().to_string();
    let model = format!("{d}/{family}");
    let mut args = vec!["model", "init-tiny", "--out", &model, "--family", family];
    args.extend(init);
    concord_ok(&args);
    let loaded = load_model(&ModelSpec::new(&model, candle_core::Device::Cpu)).unwrap();
    assert_eq!(loaded.config.family, family.parse::<Family>().unwrap());

    let sets = [
        format!("run.output_dir={d}"),
        format!("model.name={model}"),
        "run.steps=2".to_string(),
        "run.save_every=1".to_string(),
        "grpo.max_completion_length=6".to_string(),
        "grpo.prompts_per_step=2".to_string(),
        "grpo.num_generations=2".to_string(),
        "optim.gradient_checkpointing=true".to_string(),
        "optim.share_prompt=true".to_string(),
        "sft.steps=2".to_string(),
        "sft.examples=4".to_string(),
        "sft.batch_size=2".to_string(),
    ];
    let with_sets = |cmd: &[&'static str]| -> Vec<String> {
        let mut v: Vec<String> = cmd.iter().map(|s| s.to_string()).collect();
        for s in &sets {
            v.extend(["--set".to_string(), s.clone()]);
        }
        v
    };
    let train = with_sets(&["train", "--config", "configs/quickstart.toml"]);
    concord_ok(&train.iter().map(String::as_str).collect::<Vec<_>>());
    let run = dir.path().join("quickstart");
    let log = std::fs::read_to_string(run.join("training_log.csv")).unwrap();
    assert_eq!(log.lines().count(), 3, "{family}: header + 2 steps\n{log}");
    let cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("adapter_config.json")).unwrap())
            .unwrap();
    assert_eq!(cfg["peft_type"], "LORA", "{family}");

    let eval = with_sets(&[
        "eval",
        "--config",
        "configs/quickstart.toml",
        "--compare",
        "--episodes",
        "3",
        "--json",
    ]);
    let out = concord_ok(&eval.iter().map(String::as_str).collect::<Vec<_>>());
    let report: EvalReport = serde_json::from_str(&out).unwrap();
    assert_eq!(report.episodes, 3, "{family}");
    assert_eq!(report.models.len(), 2, "{family}");
}

#[test]
fn qwen3_trains_and_evaluates() {
    family_runs("qwen3", &["--head-dim", "32"]);
}

#[test]
fn llama3_trains_and_evaluates() {
    family_runs("llama", &["--no-tie", "--rope-scaling", "8,1,4,32"]);
}

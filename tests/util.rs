//! Helpers shared by the integration tests.
use candle_core::{DType, Tensor};
use std::path::Path;
use std::process::Command;

/// Largest absolute element (in f32).
pub fn max_abs(t: &Tensor) -> f32 {
    t.to_dtype(DType::F32)
        .unwrap()
        .abs()
        .unwrap()
        .flatten_all()
        .unwrap()
        .max(0)
        .unwrap()
        .to_scalar::<f32>()
        .unwrap()
}

/// Largest absolute elementwise difference (compared in f32).
pub fn max_abs_diff(a: &Tensor, b: &Tensor) -> f32 {
    let a = a.to_dtype(DType::F32).unwrap();
    let b = b.to_dtype(DType::F32).unwrap();
    max_abs(&(a - b).unwrap())
}

/// Every module LoRA can target, as a config list.
pub fn all_lora_targets() -> Vec<String> {
    concord::model::LORA_TARGETS
        .iter()
        .map(|s| s.to_string())
        .collect()
}

/// Run the `concord` binary from the repository root; panics with its stderr unless it
/// succeeds; returns its stdout.
pub fn concord_ok(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_concord"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "concord {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// A tiny Qwen2 of hidden 256 and MLP 512: every projection is whole Q4_K super-blocks.
pub fn hidden256() -> concord::model::ArchConfig {
    concord::model::ArchConfig {
        hidden_size: 256,
        intermediate_size: 512,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        head_dim: 64,
        ..concord::model::ArchConfig::tiny()
    }
}

/// A CSV log (no quoted fields): its header and rows.
pub fn read_csv(path: &Path) -> (Vec<String>, Vec<Vec<String>>) {
    let text = std::fs::read_to_string(path).unwrap();
    let mut lines = text.lines();
    let header: Vec<String> = lines.next().unwrap().split(',').map(String::from).collect();
    let rows = lines
        .map(|l| l.split(',').map(String::from).collect())
        .collect();
    (header, rows)
}

/// Column `name` of a CSV log as numbers.
pub fn column(header: &[String], rows: &[Vec<String>], name: &str) -> Vec<f64> {
    let i = header
        .iter()
        .position(|h| h == name)
        .unwrap_or_else(|| panic!("no column {name}"));
    rows.iter().map(|r| r[i].parse::<f64>().unwrap()).collect()
}

/// A reward program (`sh`): rewards each answer by the length of its text (up to a first quote), logs every
/// request, and crashes at its third request when a file `crash` is there, or at the
/// second held-out request of the directory when `crash_eval` is (removing the file, so
/// that the resumed run's program goes on).
pub const REWARD_PROGRAM: &str = include_str!("fixtures/reward_length.sh");

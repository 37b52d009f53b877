//! Helpers shared by the integration tests.
use candle_core::{DType, Tensor};
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

//! Reading `eval_log.csv`: the held-out evaluations a run made while it trained.
use anyhow::{Context, Result};
use std::path::Path;

/// One held-out evaluation of one environment (a row of `eval_log.csv`).
#[derive(Debug, Clone, PartialEq)]
pub struct HeldOut {
    pub step: f64,
    pub env: String,
    pub reward: f64,
    pub reward_ci: [f64; 2],
    pub win: f64,
    pub win_ci: [f64; 2],
}

/// The rows of `eval_log.csv`; none when the file does not exist.
pub fn read_eval_log(path: &Path) -> Result<Vec<HeldOut>> {
    if !path.exists() {
        return Ok(Vec::new());
    }
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut rows = Vec::new();
    for (i, line) in text.lines().enumerate().skip(1) {
        let f: Vec<&str> = line.split(',').collect();
        let num = |k: usize| -> Result<f64> {
            let v = f.get(k).copied().unwrap_or("");
            // An undefined value (no scored seat) was written as NaN.
            v.parse::<f64>().with_context(|| {
                format!(
                    "{} line {}: column {} is `{v}`",
                    path.display(),
                    i + 1,
                    k + 1
                )
            })
        };
        rows.push(HeldOut {
            step: num(0)?,
            env: f.get(1).copied().unwrap_or("").to_string(),
            win: num(3)?,
            win_ci: [num(4)?, num(5)?],
            reward: num(6)?,
            reward_ci: [num(7)?, num(8)?],
        });
    }
    Ok(rows)
}

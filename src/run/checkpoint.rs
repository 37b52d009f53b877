//! `checkpoint-STEP/` directories: the adapter, the optimizer state and
//! `trainer_state.json`. A checkpoint appears atomically (it is built under a temporary
//! name and renamed), so a crash leaves the previous checkpoint, never half of one.
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};

/// The optimizer's moments inside a checkpoint.
pub const OPTIMIZER: &str = "optimizer.safetensors";
/// [`TrainerState`] inside a checkpoint.
pub const TRAINER_STATE: &str = "trainer_state.json";

/// Saved beside each checkpoint.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct TrainerState {
    /// Completed steps.
    pub step: usize,
    pub seed: u64,
    /// Cumulative prompt + completion tokens.
    pub num_tokens: f64,
    /// Cumulative training wall time.
    pub seconds: f64,
    /// The step RNG: seeds of step `s` are `mix(seed, s)`; nothing else to restore.
    pub rng: String,
    pub csv_header: Vec<String>,
    /// Index of the current curriculum stage.
    #[serde(default)]
    pub stage: usize,
    /// Mean reward of each step of the current stage so far (promotion rules).
    #[serde(default)]
    pub stage_rewards: Vec<f64>,
    /// What the run started with, for `--resume` to hold it to
    /// ([`crate::config::Config::frozen_record`]); empty in checkpoints written before
    /// it was recorded, and in a warm start's.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub frozen: crate::config::FrozenRecord,
}

impl TrainerState {
    /// The state of a run that has not taken a step.
    pub fn fresh(seed: u64) -> Self {
        Self {
            step: 0,
            seed,
            num_tokens: 0.0,
            seconds: 0.0,
            rng: "splitmix64(seed, step)".into(),
            csv_header: Vec::new(),
            stage: 0,
            stage_rewards: Vec::new(),
            frozen: Default::default(),
        }
    }
}

/// `run_dir/checkpoint-{step}/`.
pub fn dir_of(run_dir: &Path, step: usize) -> PathBuf {
    run_dir.join(format!("checkpoint-{step}"))
}

/// Write `run_dir/checkpoint-{state.step}/`: `fill` writes the adapter and optimizer
/// files into the (temporary) directory it is given, then `trainer_state.json` is added
/// and the directory renamed into place. With `keep > 0`, only the newest `keep`
/// checkpoints remain.
pub fn save(
    run_dir: &Path,
    state: &TrainerState,
    keep: usize,
    fill: impl FnOnce(&Path) -> Result<()>,
) -> Result<PathBuf> {
    let s = state.step;
    let dir = dir_of(run_dir, s);
    let tmp = run_dir.join(format!(".checkpoint-{s}.tmp"));
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp)?;
    }
    std::fs::create_dir_all(&tmp)?;
    fill(&tmp)?;
    crate::atomic::atomic_write_bytes(
        &tmp.join(TRAINER_STATE),
        &serde_json::to_vec_pretty(state)?,
    )?;
    if dir.exists() {
        std::fs::remove_dir_all(&dir)?;
    }
    std::fs::rename(&tmp, &dir)
        .with_context(|| format!("renaming {} to {}", tmp.display(), dir.display()))?;
    if keep > 0 {
        let mut all = list(run_dir)?;
        all.sort();
        while all.len() > keep {
            let (_, d) = all.remove(0);
            let _ = std::fs::remove_dir_all(d);
        }
    }
    Ok(dir)
}

/// Read `dir/trainer_state.json`, checking it belongs to checkpoint `step`.
pub fn load_state(dir: &Path, step: usize) -> Result<TrainerState> {
    let path = dir.join(TRAINER_STATE);
    let bytes = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
    let st: TrainerState =
        serde_json::from_slice(&bytes).with_context(|| format!("parsing {}", path.display()))?;
    if st.step != step {
        bail!(
            "{}: trainer_state step {} != directory step {step}",
            dir.display(),
            st.step
        );
    }
    Ok(st)
}

/// Every complete `checkpoint-N/` in `run_dir` (with its trainer state), unordered.
pub fn list(run_dir: &Path) -> Result<Vec<(usize, PathBuf)>> {
    let mut out = Vec::new();
    if !run_dir.exists() {
        return Ok(out);
    }
    for e in std::fs::read_dir(run_dir)? {
        let e = e?;
        let name = e.file_name().to_string_lossy().to_string();
        if let Some(n) = name
            .strip_prefix("checkpoint-")
            .and_then(|n| n.parse::<usize>().ok())
        {
            if e.path().join(TRAINER_STATE).exists() {
                out.push((n, e.path()));
            }
        }
    }
    Ok(out)
}

/// The highest `checkpoint-N/` in `run_dir`.
pub fn latest(run_dir: &Path) -> Result<Option<(usize, PathBuf)>> {
    Ok(list(run_dir)?.into_iter().max_by_key(|(n, _)| *n))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn save_keeps_the_newest_and_latest_finds_it() {
        let dir = tempfile::tempdir().unwrap();
        let mut st = TrainerState::fresh(1);
        for step in 1..=3 {
            st.step = step;
            save(dir.path(), &st, 2, |d| {
                std::fs::write(d.join("x"), b"1")?;
                Ok(())
            })
            .unwrap();
        }
        let mut steps: Vec<usize> = list(dir.path()).unwrap().into_iter().map(|c| c.0).collect();
        steps.sort();
        assert_eq!(steps, vec![2, 3]);
        let (n, d) = latest(dir.path()).unwrap().unwrap();
        assert_eq!(n, 3);
        assert_eq!(load_state(&d, 3).unwrap(), st);
        assert!(load_state(&d, 2).is_err());
        // A failed fill leaves no checkpoint directory behind.
        st.step = 4;
        assert!(save(dir.path(), &st, 0, |_| anyhow::bail!("disk full")).is_err());
        assert_eq!(latest(dir.path()).unwrap().unwrap().0, 3);
    }
}

//! Guarding a run directory: one writer at a time ([`RunLock`], an exclusive advisory
//! lock on `RUN_DIR/.lock` holding the writer's pid, released by the kernel when the
//! process exits, crash or `kill -9` included), and no silent reuse of a directory that
//! holds an earlier run ([`previous_run`], [`clear_previous_run`]).
use anyhow::{bail, Context, Result};
use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

/// The lock file inside a run directory.
pub const LOCK_FILE: &str = ".lock";

/// An exclusive lock on a run directory, held for as long as the value lives (and by
/// the kernel until the process exits: a crashed writer never leaves a stale lock).
#[derive(Debug)]
pub struct RunLock {
    _file: File,
    path: PathBuf,
}

impl RunLock {
    /// Lock `run_dir` (created if absent) or fail naming the pid that holds it.
    pub fn acquire(run_dir: &Path) -> Result<RunLock> {
        std::fs::create_dir_all(run_dir)
            .with_context(|| format!("creating {}", run_dir.display()))?;
        let path = run_dir.join(LOCK_FILE);
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                let mut holder = String::new();
                let _ = file.read_to_string(&mut holder);
                let holder = holder.trim();
                let who = if holder.is_empty() {
                    "another process".to_string()
                } else {
                    format!("process {holder}")
                };
                bail!(
                    "run directory {} is in use by {who} (lock {}); wait for it to finish \
                     or choose another run.name",
                    run_dir.display(),
                    path.display()
                );
            }
            Err(TryLockError::Error(e)) => {
                return Err(e).with_context(|| format!("locking {}", path.display()))
            }
        }
        file.set_len(0)?;
        file.seek(SeekFrom::Start(0))?;
        writeln!(file, "{}", std::process::id())?;
        file.flush()?;
        Ok(RunLock { _file: file, path })
    }

    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// What in `run_dir` shows an earlier run: its config.toml, training_log.csv,
/// samples.jsonl, adapter, `checkpoint-N/` or warm-start `sft/` directories (sorted
/// names; empty when none).
pub fn previous_run(run_dir: &Path) -> Result<Vec<String>> {
    let mut found = Vec::new();
    if !run_dir.exists() {
        return Ok(found);
    }
    for e in std::fs::read_dir(run_dir).with_context(|| format!("reading {}", run_dir.display()))? {
        let name = e?.file_name().to_string_lossy().to_string();
        if RUN_FILES.contains(&name.as_str())
            || name.starts_with("checkpoint-")
            || name.starts_with(".checkpoint-")
        {
            found.push(name);
        }
    }
    found.sort();
    Ok(found)
}

/// Lock `run_dir` for `command` (`train`, `sft`) and make sure it is free: a directory
/// holding an earlier run is refused unless `resume` (continue it) or `overwrite`
/// (its files are removed first).
/// The configuration of a `train` / `sft` invocation: `config`, or with only `--resume
/// DIR` the run's own `DIR/config.toml`, with `sets` applied and relative paths resolved
/// against the current directory (recorded absolute in the run's config.toml). Refuses
/// `--overwrite` with `--resume`, and a `--resume` directory that is not the config's
/// run directory. Returns the config file's path and the config.
pub fn load_run_config(
    config: Option<&Path>,
    resume: Option<&Path>,
    overwrite: bool,
    sets: &[String],
) -> Result<(PathBuf, crate::config::Config)> {
    if overwrite && resume.is_some() {
        bail!("--overwrite and --resume exclude each other");
    }
    let cfg_path = match (config, resume) {
        (Some(c), _) => c.to_path_buf(),
        (None, Some(dir)) => dir.join("config.toml"),
        (None, None) => bail!("give --config FILE (or --resume RUN_DIR)"),
    };
    let mut cfg = crate::config::Config::load(&cfg_path, sets)?;
    let cwd = std::env::current_dir().context("reading the current directory")?;
    cfg.resolve_paths(&cwd);
    if let Some(dir) = resume {
        let run_dir = cfg.run_dir();
        if std::fs::canonicalize(dir).ok() != std::fs::canonicalize(&run_dir).ok() {
            bail!(
                "--resume {} but the config's run directory is {}",
                dir.display(),
                run_dir.display()
            );
        }
    }
    Ok((cfg_path, cfg))
}

pub fn claim(run_dir: &Path, resume: bool, overwrite: bool, command: &str) -> Result<RunLock> {
    let lock = RunLock::acquire(run_dir)?;
    let previous = previous_run(run_dir)?;
    if !resume && !previous.is_empty() {
        if overwrite {
            eprintln!(
                "--overwrite: removing the earlier run in {} ({})",
                run_dir.display(),
                previous.join(", ")
            );
            clear_previous_run(run_dir)?;
        } else {
            bail!(
                "{} already holds a run ({}); continue it with `concord {command} --resume {}`, \
                 replace it with `--overwrite`, or choose another run.name",
                run_dir.display(),
                previous.join(", "),
                run_dir.display()
            );
        }
    }
    Ok(lock)
}

/// Files of a run (besides `checkpoint-N/`) that `--overwrite` removes.
const RUN_FILES: &[&str] = &[
    "config.toml",
    "training_log.csv",
    "samples.jsonl",
    "adapter_model.safetensors",
    "adapter_config.json",
    "reward_curve.png",
    "components.png",
    "before_after.png",
    "eval.json",
    "README.md",
    // A `[sft] warm_start` run inside the GRPO run (config::WARM_START_DIR).
    "sft",
];

/// Remove an earlier run's files from `run_dir` (`train --overwrite`): logs, config,
/// adapter, plots, eval report, model card and every checkpoint. Other files and the
/// lock are left alone.
pub fn clear_previous_run(run_dir: &Path) -> Result<()> {
    for name in previous_run(run_dir)? {
        let p = run_dir.join(&name);
        let r = if p.is_dir() {
            std::fs::remove_dir_all(&p)
        } else {
            std::fs::remove_file(&p)
        };
        r.with_context(|| format!("removing {}", p.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_names_the_holder() {
        let d = tempfile::tempdir().unwrap();
        let held = RunLock::acquire(d.path()).unwrap();
        let e = RunLock::acquire(d.path()).unwrap_err().to_string();
        assert!(e.contains(&std::process::id().to_string()), "{e}");
        drop(held);
        RunLock::acquire(d.path()).unwrap();
    }

    #[test]
    fn previous_runs_are_found_and_cleared() {
        let d = tempfile::tempdir().unwrap();
        assert!(previous_run(d.path()).unwrap().is_empty());
        std::fs::write(d.path().join("notes.txt"), "mine").unwrap();
        assert!(previous_run(d.path()).unwrap().is_empty());
        std::fs::write(d.path().join("training_log.csv"), "step\n1\n").unwrap();
        std::fs::create_dir(d.path().join("checkpoint-9")).unwrap();
        assert_eq!(
            previous_run(d.path()).unwrap(),
            ["checkpoint-9", "training_log.csv"]
        );
        clear_previous_run(d.path()).unwrap();
        assert!(previous_run(d.path()).unwrap().is_empty());
        assert!(d.path().join("notes.txt").exists());
    }
}

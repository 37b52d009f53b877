//! Guarding a run directory: one writer at a time ([`RunLock`], an exclusive advisory
//! lock on `RUN_DIR/.lock` holding the writer's pid, released by the kernel when the
//! process exits, crash or `kill -9` included), and no silent reuse of a directory that
//! holds an earlier run ([`previous_run`], [`clear_previous_run`]). `--overwrite` moves
//! the earlier run aside ([`OVERWRITTEN`]) and deletes it only once the new run has made
//! progress, so a start that fails gives the directory back.
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
    run_dir: PathBuf,
}

impl Drop for RunLock {
    // Still under the lock (the file closes after this body): settle an `--overwrite`,
    // whether this run ended, failed or unwound.
    fn drop(&mut self) {
        if let Err(e) = settle_overwritten(&self.run_dir) {
            crate::note!("warning: {e:#}");
        }
    }
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
        Ok(RunLock {
            _file: file,
            path,
            run_dir: run_dir.to_path_buf(),
        })
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
        if RUN_FILES.contains(&name.as_str()) || is_checkpoint_name(&name) {
            found.push(name);
        }
    }
    found.sort();
    Ok(found)
}

/// The configuration of a `train` / `sft` invocation: `config`, or with only `--resume
/// DIR` the run's own `DIR/config.toml` (its run directory DIR, wherever it was made),
/// with `sets` applied and relative paths resolved
/// against the current directory (recorded absolute in the run's config.toml). Refuses
/// `--overwrite` with `--resume`, and a `--resume` directory that is not the config's
/// run directory. Returns the config file's path and the config.
/// What `concord train` and `concord sft` are given: a config, overrides, and whether
/// to resume or replace the run in its directory.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// The run configuration (TOML).
    pub config: Option<PathBuf>,
    /// `section.key=value` overrides.
    pub sets: Vec<String>,
    /// Continue the run in this directory from its latest checkpoint.
    pub resume: Option<PathBuf>,
    /// Replace an earlier run in the run directory (its logs, checkpoints, adapter).
    pub overwrite: bool,
}

pub fn load_run_config(
    config: Option<&Path>,
    resume: Option<&Path>,
    overwrite: bool,
    sets: &[String],
) -> Result<(PathBuf, crate::config::Config)> {
    if overwrite && resume.is_some() {
        bail!("--overwrite and --resume exclude each other");
    }
    if let Some(dir) = resume {
        check_resumable(dir)?;
    }
    let cfg_path = match (config, resume) {
        (Some(c), _) => c.to_path_buf(),
        (None, Some(dir)) => dir.join("config.toml"),
        (None, None) => bail!("give --config FILE (or --resume RUN_DIR)"),
    };
    let mut cfg = crate::config::Config::load(&cfg_path, sets)?;
    let cwd = std::env::current_dir().context("reading the current directory")?;
    cfg.resolve_paths(&cwd);
    if let (None, Some(dir)) = (config, resume) {
        // The run is where its directory is now: one copied or renamed still records
        // the name and output directory it was made with.
        let dir = std::path::absolute(dir).context("reading the current directory")?;
        if let (Some(parent), Some(name)) = (dir.parent(), dir.file_name()) {
            cfg.run.output_dir = parent.to_path_buf();
            cfg.run.name = name.to_string_lossy().into_owned();
        }
    }
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

/// Refuse to resume `run_dir` when it holds a finished adapter ([`finished_adapters`])
/// but no `checkpoint-N/` to continue from: a published page, or a run copied without
/// its checkpoints. Resuming it would start over from step 0 in place, removing its logs
/// and writing over its adapter and config.toml.
pub fn check_resumable(run_dir: &Path) -> Result<()> {
    if !super::checkpoint::list(run_dir)?.is_empty() {
        return Ok(());
    }
    let Some(found) = finished_adapters(run_dir)?.into_iter().next() else {
        return Ok(());
    };
    bail!(
        "cannot resume {}: it holds a finished adapter ({}) but no checkpoint-N/ to continue \
         from (a published run, or one copied without its checkpoints), and resuming would \
         start it over in place, replacing its logs. Evaluate it with `concord eval --config \
         {}`, or train from it in a new run (`[model] adapter = \"{}\"`, another run.name)",
        run_dir.display(),
        found.join(crate::model::lora::ADAPTER_WEIGHTS).display(),
        run_dir.join("config.toml").display(),
        found.display()
    )
}

/// The trained adapters `run_dir` holds outside Concord's own folders: its
/// adapter_model.safetensors (the end of a run), and those in any folder of it but
/// `checkpoint-N/`, the warm start's `sft/` (it has checkpoints of its own) and hidden
/// ones (an `--overwrite` stash): `adapter/`, `sft_adapter/`, `adapter_step2/`, as
/// published pages keep them. Sorted, the run directory's own first.
pub fn finished_adapters(run_dir: &Path) -> Result<Vec<PathBuf>> {
    let weights = crate::model::lora::ADAPTER_WEIGHTS;
    let mut found = Vec::new();
    if run_dir.join(weights).is_file() {
        found.push(run_dir.to_path_buf());
    }
    let Ok(entries) = std::fs::read_dir(run_dir) else {
        return Ok(found);
    };
    let mut inside = Vec::new();
    for e in entries {
        let e = e.with_context(|| format!("reading {}", run_dir.display()))?;
        let name = e.file_name().to_string_lossy().to_string();
        let concords = name.starts_with('.')
            || is_checkpoint_name(&name)
            || name == crate::config::WARM_START_DIR;
        if !concords && e.path().join(weights).is_file() {
            inside.push(e.path());
        }
    }
    inside.sort();
    found.extend(inside);
    Ok(found)
}

/// Lock `run_dir` for `command` (`train`, `sft`) and make sure it is free. First what
/// killed writers left is cleaned up: an unsettled `--overwrite`, atomic-write
/// temporaries. Files of an earlier start that failed before its first step are removed;
/// an earlier run with progress is refused unless `resume` (continue it) or `overwrite`
/// (moved aside until this run has made progress).
pub fn claim(run_dir: &Path, resume: bool, overwrite: bool, command: &str) -> Result<RunLock> {
    let lock = RunLock::acquire(run_dir)?;
    settle_overwritten(run_dir)?;
    remove_stale_writes(run_dir)?;
    let previous = previous_run(run_dir)?;
    if resume || previous.is_empty() {
        return Ok(lock);
    }
    // A published page keeps its adapters in folders of its own (`adapter/`,
    // `sft_adapter/`) and may have no log under Concord's names: it is a run all the same.
    if !made_progress(run_dir)? && finished_adapters(run_dir)?.is_empty() {
        crate::note!(
            "removing the files of an earlier start in {} that failed before its first step \
             ({})",
            run_dir.display(),
            previous.join(", ")
        );
        clear_previous_run(run_dir)?;
    } else if overwrite {
        crate::note!(
            "--overwrite: moving the earlier run in {} aside ({}); it is deleted once this \
             run has made progress, and restored if this one fails first",
            run_dir.display(),
            previous.join(", ")
        );
        move_aside(run_dir, &previous)?;
    } else {
        bail!(
            "{} already holds a run ({}); continue it with `{}`, replace it with \
             `--overwrite`, or choose another run.name",
            run_dir.display(),
            previous.join(", "),
            resume_command(command, run_dir)
        );
    }
    Ok(lock)
}

/// The name the binary was started by, when it is not `concord` (a binary of one's own
/// environments, `concord::cli::main_with`): resume hints name it.
static PROGRAM: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Name the binary in resume hints (first call wins).
pub fn set_program_name(name: &str) {
    let _ = PROGRAM.set(name.to_string());
}

/// The command line that continues the run in `run_dir` with `concord command`, the
/// path quoted for a POSIX shell where it needs to be.
pub fn resume_command(command: &str, run_dir: &Path) -> String {
    format!(
        "{} {command} --resume {}",
        PROGRAM.get().map_or("concord", String::as_str),
        shell_quote(&run_dir.display().to_string())
    )
}

/// `s` as one POSIX shell word: as it is when every character is plain, else in single
/// quotes (a quote inside written `'\''`).
fn shell_quote(s: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "_-./=:,+@%".contains(c);
    if !s.is_empty() && s.chars().all(plain) {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

/// Where `--overwrite` keeps the earlier run, inside the run directory, until the new
/// run has made progress (then it is deleted) or has failed without any (then it is
/// moved back).
pub const OVERWRITTEN: &str = ".overwritten";

fn move_aside(run_dir: &Path, names: &[String]) -> Result<()> {
    let stash = run_dir.join(OVERWRITTEN);
    std::fs::create_dir(&stash).with_context(|| format!("creating {}", stash.display()))?;
    for name in names {
        let (from, to) = (run_dir.join(name), stash.join(name));
        std::fs::rename(&from, &to)
            .with_context(|| format!("moving {} to {}", from.display(), to.display()))?;
    }
    Ok(())
}

/// Finish an `--overwrite` (see [`OVERWRITTEN`]); nothing to do without one.
fn settle_overwritten(run_dir: &Path) -> Result<()> {
    let stash = run_dir.join(OVERWRITTEN);
    if !stash.is_dir() {
        return Ok(());
    }
    if made_progress(run_dir)? {
        return std::fs::remove_dir_all(&stash)
            .with_context(|| format!("removing the overwritten run {}", stash.display()));
    }
    clear_previous_run(run_dir)?;
    for e in std::fs::read_dir(&stash).with_context(|| format!("reading {}", stash.display()))? {
        let name = e?.file_name();
        let (from, to) = (stash.join(&name), run_dir.join(&name));
        std::fs::rename(&from, &to)
            .with_context(|| format!("restoring {} to {}", from.display(), to.display()))?;
    }
    crate::note!(
        "restored the earlier run in {}: this one stopped before its first step",
        run_dir.display()
    );
    std::fs::remove_dir(&stash).with_context(|| format!("removing {}", stash.display()))
}

/// Whether `run_dir` holds any training, its own or its warm start's: a checkpoint, an
/// adapter or a logged step.
pub fn made_progress(run_dir: &Path) -> Result<bool> {
    for dir in [
        run_dir.to_path_buf(),
        run_dir.join(crate::config::WARM_START_DIR),
    ] {
        let logged = std::fs::read_to_string(dir.join(super::log::TRAINING_LOG))
            .is_ok_and(|t| t.lines().nth(1).is_some_and(|l| !l.trim().is_empty()));
        if logged
            || dir.join(crate::model::lora::ADAPTER_WEIGHTS).exists()
            || !super::checkpoint::list(&dir)?.is_empty()
        {
            return Ok(true);
        }
    }
    Ok(false)
}

/// A directory Concord names for a checkpoint: `checkpoint-N`, or `.checkpoint-N.tmp`
/// while it is built (a user's `checkpoint-notes/` is not one).
fn is_checkpoint_name(name: &str) -> bool {
    let number = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    name.strip_prefix("checkpoint-").is_some_and(number)
        || name
            .strip_prefix(".checkpoint-")
            .and_then(|s| s.strip_suffix(".tmp"))
            .is_some_and(number)
}

/// The temporary file of an atomic write, `.NAME.PID.tmp` ([`crate::atomic`]).
fn is_atomic_temporary(name: &str) -> bool {
    name.starts_with('.')
        && name
            .strip_suffix(".tmp")
            .and_then(|s| s.rsplit_once('.'))
            .is_some_and(|(_, pid)| !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit()))
}

/// Remove the atomic-write temporaries a killed writer left in `run_dir` and its warm
/// start. Only the lock holder calls this, so no writer is using them.
fn remove_stale_writes(run_dir: &Path) -> Result<()> {
    for dir in [
        run_dir.to_path_buf(),
        run_dir.join(crate::config::WARM_START_DIR),
    ] {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries {
            let e = e?;
            if e.file_type()?.is_file() && is_atomic_temporary(&e.file_name().to_string_lossy()) {
                std::fs::remove_file(e.path())
                    .with_context(|| format!("removing {}", e.path().display()))?;
            }
        }
    }
    Ok(())
}

/// Files of a run (besides `checkpoint-N/`) that `--overwrite` removes.
const RUN_FILES: &[&str] = &[
    "config.toml",
    "training_log.csv",
    "eval_log.csv",
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

/// Remove an earlier run's files from `run_dir`: logs, config, adapter, plots, eval
/// report, model card and every checkpoint. Other files, the lock and an overwritten run
/// are left alone.
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

    #[test]
    fn resume_commands_are_shell_words() {
        assert_eq!(
            resume_command("train", Path::new("/w/runs/r-1")),
            "concord train --resume /w/runs/r-1"
        );
        assert_eq!(
            resume_command("sft", Path::new("/w/my runs/it's")),
            "concord sft --resume '/w/my runs/it'\\''s'"
        );
    }

    #[test]
    fn only_concords_own_names_count() {
        for n in ["checkpoint-0", "checkpoint-12", ".checkpoint-3.tmp"] {
            assert!(is_checkpoint_name(n), "{n}");
        }
        for n in [
            "checkpoint-",
            "checkpoint-notes",
            "checkpoint-1a",
            ".checkpoint-x.tmp",
        ] {
            assert!(!is_checkpoint_name(n), "{n}");
        }
        assert!(is_atomic_temporary(".adapter_model.safetensors.4242.tmp"));
        for n in ["adapter.4242.tmp", ".notes.tmp", ".x.12a.tmp", ".x.42.tmpx"] {
            assert!(!is_atomic_temporary(n), "{n}");
        }
    }

    /// An overwritten run comes back when the new start made no progress, and goes
    /// once it has.
    #[test]
    fn an_overwritten_run_is_restored_or_deleted() {
        let d = tempfile::tempdir().unwrap();
        let earlier = "step\n1\n";
        std::fs::write(d.path().join("training_log.csv"), earlier).unwrap();
        std::fs::create_dir(d.path().join("checkpoint-notes")).unwrap();
        let lock = claim(d.path(), false, true, "train").unwrap();
        assert!(!d.path().join("training_log.csv").exists());
        std::fs::write(d.path().join("config.toml"), "new").unwrap();
        drop(lock);
        let log = std::fs::read_to_string(d.path().join("training_log.csv")).unwrap();
        assert_eq!(log, earlier);
        assert!(!d.path().join("config.toml").exists());
        assert!(d.path().join("checkpoint-notes").exists());
        assert!(!d.path().join(OVERWRITTEN).exists());

        let lock = claim(d.path(), false, true, "train").unwrap();
        std::fs::write(d.path().join("training_log.csv"), "step\n1\n2\n").unwrap();
        drop(lock);
        assert!(!d.path().join(OVERWRITTEN).exists());
        let log = std::fs::read_to_string(d.path().join("training_log.csv")).unwrap();
        assert_eq!(log, "step\n1\n2\n");
    }

    #[test]
    fn a_start_without_progress_does_not_block_its_name() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("config.toml"), "x").unwrap();
        std::fs::write(d.path().join("training_log.csv"), "step,loss\n").unwrap();
        std::fs::write(d.path().join(".config.toml.99.tmp"), "x").unwrap();
        drop(claim(d.path(), false, false, "train").unwrap());
        assert!(previous_run(d.path()).unwrap().is_empty());
        assert!(!d.path().join(".config.toml.99.tmp").exists());
    }
}

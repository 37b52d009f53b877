//! Atomic file writes: a crash leaves either the old file or the new one, never half of
//! one. Every file Concord writes into a run or model directory goes through here.
use anyhow::{Context, Result};
use std::path::{Path, PathBuf};

/// Write `path` atomically: `write` fills a temporary file beside it (same directory,
/// so the rename cannot cross file systems), which is then renamed over `path`.
pub fn atomic_write(path: &Path, write: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty());
    if let Some(d) = dir {
        std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
    }
    let name = path
        .file_name()
        .with_context(|| format!("{} has no file name", path.display()))?;
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(format!(".{}.tmp", std::process::id()));
    let tmp: PathBuf = match dir {
        Some(d) => d.join(tmp_name),
        None => PathBuf::from(tmp_name),
    };
    if let Err(e) = write(&tmp) {
        let _ = std::fs::remove_file(&tmp);
        // A full disk surfaces as a bare OS error deep inside a writer: name the file.
        return Err(e.context(format!("writing {}", path.display())));
    }
    std::fs::rename(&tmp, path)
        .with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))
}

/// Fail now, before hours of work, if [`atomic_write`] of `path` would fail later: a
/// directory in its place, a folder that does not exist (it is not created), or a
/// folder that takes no new file (a probe file is created there and removed).
pub fn check_writable(path: &Path) -> Result<()> {
    if path.is_dir() {
        anyhow::bail!("{}: is a directory, not a file to write", path.display());
    }
    let name = path
        .file_name()
        .with_context(|| format!("{} has no file name", path.display()))?;
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    if !dir.is_dir() {
        anyhow::bail!(
            "{}: its folder {} does not exist",
            path.display(),
            dir.display()
        );
    }
    let mut probe = std::ffi::OsString::from(".");
    probe.push(name);
    probe.push(format!(".{}.probe", std::process::id()));
    let probe = dir.join(probe);
    std::fs::write(&probe, b"")
        .with_context(|| format!("{}: cannot write in {}", path.display(), dir.display()))?;
    let _ = std::fs::remove_file(&probe);
    Ok(())
}

/// [`atomic_write`] of a byte buffer.
pub fn atomic_write_bytes(path: &Path, bytes: &[u8]) -> Result<()> {
    atomic_write(path, |tmp| {
        std::fs::write(tmp, bytes).with_context(|| format!("writing {}", tmp.display()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_write_keeps_old_file_and_leaves_no_temp() {
        let dir = std::env::temp_dir().join(format!("concord-atomic-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let path = dir.join("a.txt");
        atomic_write_bytes(&path, b"old").unwrap();
        let err = atomic_write(&path, |tmp| {
            std::fs::write(tmp, b"half")?;
            anyhow::bail!("disk on fire")
        });
        let msg = format!("{:#}", err.unwrap_err());
        assert!(
            msg.contains("a.txt") && msg.contains("disk on fire"),
            "{msg}"
        );
        assert_eq!(std::fs::read(&path).unwrap(), b"old");
        let names: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("a.txt")]);
        atomic_write_bytes(&path, b"new").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"new");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

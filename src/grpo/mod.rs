//! Group Relative Policy Optimisation: advantages, the clipped surrogate loss, the
//! optimiser and the training loop.
pub mod advantage;
pub mod loss;
pub mod optim;
pub mod rollout;
pub mod trainer;

use anyhow::{Context, Result};
use std::path::{Path, PathBuf};

/// Write `path` atomically: `write` fills a temporary file beside it, which is then
/// renamed over `path` (a crash leaves either the old or the new file, never half).
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
    let res = write(&tmp);
    if let Err(e) = res {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    std::fs::rename(&tmp, path)
        .with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))?;
    Ok(())
}

/// [`atomic_write`] of a byte buffer.
pub fn atomic_write_bytes(path: &Path, bytes: &[u8]) -> Result<()> {
    atomic_write(path, |tmp| {
        std::fs::write(tmp, bytes).with_context(|| format!("writing {}", tmp.display()))
    })
}

//! SIGINT (Ctrl-C), SIGTERM and SIGHUP during training: the trainer finishes its step,
//! writes a checkpoint and stops with the command that resumes it; a second signal
//! exits at once. GRPO and SFT (standalone or a warm start) share the one handler.
use crate::sys::INTERRUPTED;
use std::path::PathBuf;
use std::sync::atomic::Ordering;

/// Install the handler (once per process; later calls keep the first).
pub fn install() {
    // With ctrlc's `termination` feature this handler also receives SIGTERM and SIGHUP.
    let _ = ctrlc::set_handler(|| {
        if INTERRUPTED.swap(true, Ordering::SeqCst) {
            crate::note!("\ninterrupted twice: exiting without a checkpoint");
            std::process::exit(130);
        }
        crate::note!(
            "\ninterrupted (signal): finishing the step (or abandoning a long one), writing \
             a checkpoint, then exiting"
        );
    });
}

/// Whether a signal asked the run to stop.
pub fn interrupted() -> bool {
    crate::sys::interrupted()
}

/// The error of a trainer that stopped on a signal after writing `checkpoint`; the
/// command that started it adds how to resume.
#[derive(Debug)]
pub struct Interrupted {
    pub what: &'static str,
    pub step: usize,
    pub checkpoint: PathBuf,
}

impl std::fmt::Display for Interrupted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} stopped after step {} ({} written)",
            self.what,
            self.step,
            self.checkpoint.display()
        )
    }
}

impl std::error::Error for Interrupted {}

/// `e` with `resume` (the command to continue) in front when it is an [`Interrupted`].
pub fn with_resume_hint(e: anyhow::Error, resume: impl FnOnce() -> String) -> anyhow::Error {
    if e.is::<Interrupted>() {
        let hint = format!("interrupted; resume with `{}`", resume());
        e.context(hint)
    } else {
        e
    }
}

//! What the operating system says about this process (Linux `/proc`; neutral values
//! elsewhere). A leaf module.

/// Set by the signal handler ([`crate::run::signal`]): a signal asked the process to
/// stop. Kept here, a leaf, so that long loops on any floor can give up their work.
pub static INTERRUPTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether a signal asked the process to stop.
pub fn interrupted() -> bool {
    INTERRUPTED.load(std::sync::atomic::Ordering::SeqCst)
}

/// The error of work abandoned because a signal asked the process to stop (a long
/// collection gives up its step, rather than finish it first).
#[derive(Debug)]
pub struct Abandoned;

impl std::fmt::Display for Abandoned {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "abandoned on a signal")
    }
}

impl std::error::Error for Abandoned {}

/// Peak resident set size of this process in MiB (VmHWM), 0 where unknown.
pub fn peak_rss_mb() -> f64 {
    status_kb("VmHWM:").map_or(0.0, |kb| kb / 1024.0)
}

/// Resident set size of this process now in MiB (VmRSS), 0 where unknown.
pub fn rss_mb() -> f64 {
    status_kb("VmRSS:").map_or(0.0, |kb| kb / 1024.0)
}

/// Reset the peak RSS ([`peak_rss_mb`]) to the current RSS (Linux `clear_refs` 5), so
/// that the next reading is the peak of what follows. False where not supported.
pub fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

fn status_kb(key: &str) -> Option<f64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with(key))?;
    line.split_whitespace().nth(1)?.parse::<f64>().ok()
}

/// CPU time used by the calling thread, in seconds (Linux only; `None` elsewhere).
pub fn thread_cpu_seconds() -> Option<f64> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let ns: u64 = s.split_whitespace().next()?.parse().ok()?;
    Some(ns as f64 * 1e-9)
}

/// Memory this process can still get, in bytes: the least of the host's MemAvailable,
/// the room left under its cgroup's memory limit (v2 `memory.max`, v1
/// `memory.limit_in_bytes`, at its own cgroup and every ancestor) and the room left
/// under `RLIMIT_AS`; `None` where none of them is known. A container's limit is what
/// the kernel enforces (an OOM kill), not the host's free memory.
pub fn available_memory_bytes() -> Option<u64> {
    memory_limit().map(|m| m.bytes)
}

/// The binding memory limit: its room in bytes and what it is.
#[derive(Debug, Clone, PartialEq)]
pub struct MemoryLimit {
    pub bytes: u64,
    /// "MemAvailable", "cgroup memory.max", "cgroup memory.limit_in_bytes" or
    /// "RLIMIT_AS".
    pub source: &'static str,
}

/// [`available_memory_bytes`] with its source.
pub fn memory_limit() -> Option<MemoryLimit> {
    limit_under(Path::new("/"))
}

use std::path::Path;

/// [`memory_limit`] read under `root` (tests give a fake `/proc` and `/sys`).
fn limit_under(root: &Path) -> Option<MemoryLimit> {
    let read = |p: &str| std::fs::read_to_string(root.join(p.trim_start_matches('/'))).ok();
    let mut found: Vec<MemoryLimit> = Vec::new();
    if let Some(kb) = read("proc/meminfo").and_then(|s| field_kb(&s, "MemAvailable:")) {
        found.push(MemoryLimit {
            bytes: kb * 1024,
            source: "MemAvailable",
        });
    }
    let cgroup = read("proc/self/cgroup").unwrap_or_default();
    found.extend(cgroup_room(root, &cgroup));
    let limits = read("proc/self/limits").unwrap_or_default();
    let rlimit = limits
        .lines()
        .find(|l| l.starts_with("Max address space"))
        .and_then(|l| l.split_whitespace().nth(3)?.parse::<u64>().ok());
    if let Some(limit) = rlimit {
        let used = read("proc/self/status")
            .and_then(|s| field_kb(&s, "VmSize:"))
            .unwrap_or(0)
            * 1024;
        found.push(MemoryLimit {
            bytes: limit.saturating_sub(used),
            source: "RLIMIT_AS",
        });
    }
    found.into_iter().min_by_key(|m| m.bytes)
}

fn field_kb(text: &str, key: &str) -> Option<u64> {
    text.lines()
        .find(|l| l.starts_with(key))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// The room under every memory limit of the cgroup(s) in `/proc/self/cgroup`'s text,
/// from the cgroup up to the root of its hierarchy.
fn cgroup_room(root: &Path, proc_cgroup: &str) -> Vec<MemoryLimit> {
    let number = |p: &Path| -> Option<u64> {
        let t = std::fs::read_to_string(p).ok()?;
        t.trim().parse().ok() // "max" (v2, no limit) does not parse
    };
    let mut out = Vec::new();
    for line in proc_cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(ctrl), Some(path)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        let (mount, limit, usage, source) = match ctrl {
            "" => (
                "sys/fs/cgroup",
                "memory.max",
                "memory.current",
                "cgroup memory.max",
            ),
            c if c.split(',').any(|c| c == "memory") => (
                "sys/fs/cgroup/memory",
                "memory.limit_in_bytes",
                "memory.usage_in_bytes",
                "cgroup memory.limit_in_bytes",
            ),
            _ => continue,
        };
        // The cgroup and its ancestors; a container sees its own cgroup at the mount.
        let mut dir = Some(Path::new(path.trim()));
        while let Some(d) = dir {
            let at = root.join(mount).join(d.strip_prefix("/").unwrap_or(d));
            // v1 writes "no limit" as a number near 2^63
            if let Some(l) = number(&at.join(limit)).filter(|&l| l < 1 << 60) {
                let used = number(&at.join(usage)).unwrap_or(0);
                out.push(MemoryLimit {
                    bytes: l.saturating_sub(used),
                    source,
                });
            }
            dir = d.parent();
        }
    }
    out
}

#[cfg(test)]
mod memory_tests {
    use super::*;

    fn write(root: &Path, p: &str, text: &str) {
        let p = root.join(p);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    const GB: u64 = 1 << 30;

    /// Issue 54, item 4: the least room wins, and says which limit it is.
    #[test]
    fn the_tightest_memory_limit_binds() {
        let d = tempfile::tempdir().unwrap();
        let r = d.path();
        write(
            r,
            "proc/meminfo",
            "MemTotal: 25000000 kB\nMemAvailable: 20971520 kB\n",
        );
        let host = limit_under(r).unwrap();
        assert_eq!((host.bytes, host.source), (20 * GB, "MemAvailable"));
        // cgroup v2: a 1.5 GB limit on the parent of the process's cgroup, 0.5 GB used
        write(r, "proc/self/cgroup", "0::/box/job\n");
        write(r, "sys/fs/cgroup/box/job/memory.max", "max\n");
        write(
            r,
            "sys/fs/cgroup/box/memory.max",
            &format!("{}\n", 3 * GB / 2),
        );
        write(
            r,
            "sys/fs/cgroup/box/memory.current",
            &format!("{}\n", GB / 2),
        );
        let m = limit_under(r).unwrap();
        assert_eq!((m.bytes, m.source), (GB, "cgroup memory.max"));
        // cgroup v1, with its "no limit" number on the hierarchy's root
        write(
            r,
            "proc/self/cgroup",
            "4:cpu,cpuacct:/x\n3:memory:/docker/abc\n",
        );
        write(
            r,
            "sys/fs/cgroup/memory/memory.limit_in_bytes",
            "9223372036854771712\n",
        );
        write(
            r,
            "sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes",
            &format!("{}", 2 * GB),
        );
        write(
            r,
            "sys/fs/cgroup/memory/docker/abc/memory.usage_in_bytes",
            "0",
        );
        let m = limit_under(r).unwrap();
        assert_eq!(
            (m.bytes, m.source),
            (2 * GB, "cgroup memory.limit_in_bytes")
        );
        // RLIMIT_AS less what the process already maps
        write(
            r,
            "proc/self/limits",
            &format!(
                "Max cpu time  unlimited  unlimited  seconds\nMax address space  {}  {}  bytes\n",
                GB, GB
            ),
        );
        write(r, "proc/self/status", "VmSize:\t  262144 kB\n");
        let m = limit_under(r).unwrap();
        assert_eq!((m.bytes, m.source), (GB - GB / 4, "RLIMIT_AS"));
        // and none known: None
        let empty = tempfile::tempdir().unwrap();
        assert_eq!(limit_under(empty.path()), None);
    }
}

/// `text` with the user information of every URL in it (`https://user:secret@host`)
/// replaced by `***`: an endpoint or `env.url` with credentials must never be printed.
pub fn redact_url_credentials(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find("://") {
        let (head, tail) = rest.split_at(i + 3);
        out.push_str(head);
        let end = tail
            .find(|c: char| {
                c == '/' || c == '?' || c == '#' || c.is_whitespace() || "\"'`<>".contains(c)
            })
            .unwrap_or(tail.len());
        let authority = &tail[..end];
        match authority.rfind('@') {
            Some(at) => {
                out.push_str("***");
                out.push_str(&authority[at..]);
            }
            None => out.push_str(authority),
        }
        rest = &tail[end..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod redact_tests {
    use super::redact_url_credentials as r;

    #[test]
    fn url_credentials_are_redacted() {
        assert_eq!(
            r("POST http://hf_secret123@127.0.0.1:8080/api/repos failed"),
            "POST http://***@127.0.0.1:8080/api/repos failed"
        );
        assert_eq!(
            r("ws://u:p@h/ws and https://h/x"),
            "ws://***@h/ws and https://h/x"
        );
        assert_eq!(r("see `https://a:b@c`"), "see `https://***@c`");
        assert_eq!(r("no urls, user@host"), "no urls, user@host");
        assert_eq!(r("https://h/p?mail=a@b"), "https://h/p?mail=a@b");
    }
}

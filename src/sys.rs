//! What the operating system says about this process (Linux `/proc`; neutral values
//! elsewhere). A leaf module.

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

/// Memory the kernel can still give without swapping (MemAvailable), in bytes; `None`
/// where unknown.
pub fn available_memory_bytes() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kb: u64 = s
        .lines()
        .find(|l| l.starts_with("MemAvailable:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    Some(kb * 1024)
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

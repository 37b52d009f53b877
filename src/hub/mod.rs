//! `concord export`: upload a run's adapter, logs, plots and a generated model card to
//! the Hugging Face Hub.
//!
//! hf-hub 0.4 only downloads, so this module speaks the Hub's upload protocol itself
//! over ureq (the same ureq 2 + rustls that hf-hub uses):
//!
//! 1. `POST /api/repos/create` (409: the repo already exists, which is fine);
//! 2. `POST /api/models/{repo}/branch/{rev}` when the revision is not `main` (409 fine);
//! 3. `POST /api/models/{repo}/preupload/{rev}`: the Hub says which files go through
//!    LFS and which are sent inline;
//! 4. for LFS files, the git-lfs batch API (`/{repo}.git/info/lfs/objects/batch`),
//!    then a PUT of the bytes (single or multi-part) and the optional verify call;
//! 5. `POST /api/models/{repo}/commit/{rev}` with an NDJSON body: a header line, one
//!    line per inline file (base64) and one per LFS file (its sha256).
//!
//! The token is held in [`HfToken`], whose `Debug`/`Display` print `hf_***`; server
//! messages quoted in errors are scrubbed of it, and it is never sent to storage URLs
//! handed out by the LFS batch API.
use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use base64::Engine;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::run::eval_report::{EvalReport, ModelEval};
use crate::run::log::TrainingLog;
use sha2::{Digest, Sha256};

mod card;
mod http;

#[cfg(test)]
use card::hub_model_id;
pub use card::model_card;
use http::*;

/// The Hub used when `HF_ENDPOINT` is not set.
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

/// Run-directory files uploaded when present (the model card is generated).
pub const RUN_FILES: [&str; 8] = [
    "adapter_model.safetensors",
    "adapter_config.json",
    "training_log.csv",
    "config.toml",
    "eval.json",
    "reward_curve.png",
    "components.png",
    "before_after.png",
];

/// Files that must exist for an export to make sense.
const REQUIRED_FILES: [&str; 2] = ["adapter_model.safetensors", "adapter_config.json"];

/// Attempts per request for connection failures, timeouts and 5xx answers.
const MAX_ATTEMPTS: usize = 3;
/// Waits between attempts.
const BACKOFF: [Duration; 2] = [Duration::from_millis(500), Duration::from_millis(1000)];
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Default limit on one API request (connect, send, wait, read), before retries: three
/// silent attempts fail within a minute (huggingface_hub waits 10 s).
const API_TIMEOUT: Duration = Duration::from_secs(15);
/// Overrides [`API_TIMEOUT`] (whole seconds); storage uploads get this plus the time
/// their bytes need at [`MIN_UPLOAD_BYTES_PER_S`].
pub const TIMEOUT_ENV: &str = "CONCORD_HUB_TIMEOUT";
/// The slowest upload a transfer is allowed before it counts as stalled.
const MIN_UPLOAD_BYTES_PER_S: u64 = 256 * 1024;
const LFS_CONTENT_TYPE: &str = "application/vnd.git-lfs+json";

// ---------------------------------------------------------------------------------
// Token
// ---------------------------------------------------------------------------------

/// A Hugging Face access token. `Debug` and `Display` print `hf_***`, never the value.
#[derive(Clone)]
pub struct HfToken(String);

impl HfToken {
    /// Wraps a token (surrounding whitespace is trimmed). Errors when empty.
    pub fn new(token: impl Into<String>) -> Result<HfToken> {
        let t = token.into().trim().to_string();
        if t.is_empty() {
            bail!("the Hugging Face token is empty");
        }
        // An HTTP header cannot carry it; the Hub would never see it (nor should the
        // network be blamed).
        if t.chars()
            .any(|c| c.is_whitespace() || c.is_control() || !c.is_ascii())
        {
            bail!(
                "the Hugging Face token contains spaces, line breaks or non-ASCII characters: \
                 copy it again from https://huggingface.co/settings/tokens"
            );
        }
        Ok(HfToken(t))
    }

    /// The token itself, for the `Authorization` header. Never print it.
    pub fn expose_secret(&self) -> &str {
        &self.0
    }

    /// `text` with every occurrence of the token replaced by `hf_***`.
    pub fn scrub(&self, text: &str) -> String {
        if self.0.is_empty() {
            text.to_string()
        } else {
            text.replace(&self.0, "hf_***")
        }
    }

    /// The token from `HF_TOKEN`, else the token file (`HF_TOKEN_PATH`, else
    /// `$HF_HOME/token`, else `~/.cache/huggingface/token`).
    pub fn from_env() -> Result<HfToken> {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        Self::resolve(
            var("HF_TOKEN"),
            var("HF_TOKEN_PATH").map(PathBuf::from),
            var("HF_HOME").map(PathBuf::from),
            var("HOME").map(PathBuf::from),
        )
    }

    /// [`HfToken::from_env`] with the environment passed in.
    pub fn resolve(
        hf_token: Option<String>,
        token_path: Option<PathBuf>,
        hf_home: Option<PathBuf>,
        home: Option<PathBuf>,
    ) -> Result<HfToken> {
        if let Some(t) = hf_token.filter(|t| !t.trim().is_empty()) {
            return HfToken::new(t);
        }
        let path = token_path
            .or_else(|| hf_home.map(|h| h.join("token")))
            .or_else(|| home.map(|h| h.join(".cache").join("huggingface").join("token")));
        if let Some(path) = &path {
            if let Ok(text) = std::fs::read_to_string(path) {
                if !text.trim().is_empty() {
                    return HfToken::new(text);
                }
            }
        }
        let looked = path
            .map(|p| format!(" (looked in {})", p.display()))
            .unwrap_or_default();
        bail!(
            "no Hugging Face token found{looked}: set HF_TOKEN to a token with write access \
             (https://huggingface.co/settings/tokens) or run `huggingface-cli login`"
        )
    }
}

impl fmt::Debug for HfToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("HfToken(hf_***)")
    }
}

impl fmt::Display for HfToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("hf_***")
    }
}

/// The Hub endpoint from `HF_ENDPOINT` (default `https://huggingface.co`), without a
/// trailing slash.
pub fn endpoint_from_env() -> String {
    normalize_endpoint(
        std::env::var("HF_ENDPOINT")
            .ok()
            .as_deref()
            .filter(|s| !s.trim().is_empty())
            .unwrap_or(DEFAULT_ENDPOINT),
    )
}

/// Refuses an endpoint no request could reach (a typo is not a network failure).
fn check_endpoint(endpoint: &str) -> Result<()> {
    let shown = crate::sys::redact_url_credentials(endpoint);
    let rest = endpoint
        .strip_prefix("https://")
        .or_else(|| endpoint.strip_prefix("http://"))
        .with_context(|| {
            format!("HF_ENDPOINT `{shown}` is not a Hub URL: expected http:// or https://")
        })?;
    let authority = rest.split('/').next().unwrap_or_default();
    let host = authority.rsplit('@').next().unwrap_or_default();
    let bad = |c: char| c.is_whitespace() || c.is_control();
    if host.is_empty() || host.starts_with(':') || endpoint.chars().any(bad) {
        bail!("HF_ENDPOINT `{shown}` is not a Hub URL: it names no host, or has spaces");
    }
    Ok(())
}

fn normalize_endpoint(e: &str) -> String {
    e.trim().trim_end_matches('/').to_string()
}

// ---------------------------------------------------------------------------------
// CLI
// ---------------------------------------------------------------------------------

/// What [`export`] uploads and where.
#[derive(Debug, Clone)]
pub struct ExportOptions {
    pub run_dir: PathBuf,
    /// `namespace/name`.
    pub repo: String,
    pub private: bool,
    pub revision: String,
    /// Commit summary.
    pub message: String,
}

/// How a file travels to the Hub.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UploadMode {
    /// base64 inside the commit request.
    Regular,
    /// git-lfs: the bytes go to storage, the commit carries the sha256.
    Lfs,
}

#[derive(Debug, Clone)]
pub struct UploadedFile {
    pub path: String,
    pub size: u64,
    pub sha256: String,
    pub mode: UploadMode,
}

/// The outcome of an [`export`].
#[derive(Debug, Clone)]
pub struct ExportReport {
    /// `{endpoint}/{repo}`.
    pub repo_url: String,
    /// False when the repo already existed.
    pub created_repo: bool,
    pub files: Vec<UploadedFile>,
    pub commit_url: Option<String>,
    pub commit_oid: Option<String>,
}

/// `concord export`: resolves the endpoint and token from the environment and runs
/// [`export`] (or, with `--dry-run`, only writes the model card).
pub fn run_export(opts: &ExportOptions, dry_run: bool) -> Result<()> {
    validate_options(opts)?;
    if dry_run {
        let files = collect_files(opts)?;
        crate::say!(
            "dry run: would upload to {}/{} (revision {}){}:",
            crate::sys::redact_url_credentials(&endpoint_from_env()),
            opts.repo,
            opts.revision,
            if opts.private { ", private" } else { "" }
        );
        for (path, bytes) in &files {
            crate::say!("  {path} ({})", human_size(bytes.len() as u64));
        }
        crate::say!(
            "model card written to {}",
            opts.run_dir.join("README.md").display()
        );
        return Ok(());
    }
    let endpoint = endpoint_from_env();
    let token = HfToken::from_env()?;
    export(opts, &endpoint, &token)?;
    Ok(())
}

fn validate_options(opts: &ExportOptions) -> Result<()> {
    validate_repo_id(&opts.repo)?;
    validate_revision(&opts.revision)?;
    if opts.message.trim().is_empty() {
        bail!("--message must not be empty");
    }
    if !opts.run_dir.is_dir() {
        bail!("run directory {} does not exist", opts.run_dir.display());
    }
    for f in REQUIRED_FILES {
        if !opts.run_dir.join(f).is_file() {
            bail!(
                "{} has no {f}: export needs a finished run (adapter_model.safetensors and \
                 adapter_config.json)",
                opts.run_dir.display()
            );
        }
    }
    Ok(())
}

/// Checks a branch name with git's rules for ref names (`git check-ref-format`), which
/// the Hub applies: a `../../main` would otherwise reach the server as a path.
fn validate_revision(rev: &str) -> Result<()> {
    let bad_char = |c: char| c.is_control() || " ~^:?*[\\".contains(c);
    let bad = rev.trim().is_empty()
        || rev == "@"
        || rev.contains("..")
        || rev.contains("@{")
        || rev.contains("//")
        || rev.starts_with('/')
        || rev.ends_with(['/', '.'])
        || rev.chars().any(bad_char)
        || rev
            .split('/')
            .any(|p| p.starts_with('.') || p.ends_with(".lock"));
    if bad {
        bail!(
            "--revision {rev:?} is not a valid branch name (git's ref-name rules: no `..`, \
             no component starting with `.`, no spaces or `~^:?*[\\`)"
        );
    }
    Ok(())
}

/// Checks `namespace/name` with the Hub's allowed characters.
fn validate_repo_id(repo: &str) -> Result<()> {
    let parts: Vec<&str> = repo.split('/').collect();
    let ok_part = |p: &str| {
        !p.is_empty()
            && p.len() <= 96
            && !p.starts_with(['.', '-'])
            && !p.ends_with('.')
            && !p.contains("..")
            && p.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    };
    if parts.len() != 2 || !parts.iter().all(|p| ok_part(p)) {
        bail!(
            "--repo {repo:?} is not a model repo id: expected `user/name` or `org/name` \
             (letters, digits, '-', '_', '.')"
        );
    }
    Ok(())
}

/// Reads the files to upload (writing the model card into the run dir first).
/// Returns (path in repo, bytes), the model card last.
fn collect_files(opts: &ExportOptions) -> Result<Vec<(String, Vec<u8>)>> {
    let card = crate::sys::redact_url_credentials(&model_card(&opts.run_dir, &opts.repo)?);
    crate::atomic::atomic_write_bytes(&opts.run_dir.join("README.md"), card.as_bytes())?;
    let mut files = Vec::new();
    for name in RUN_FILES {
        let path = opts.run_dir.join(name);
        if path.is_file() {
            let bytes =
                std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
            files.push((name.to_string(), public_text(name, bytes)));
        }
    }
    files.push(("README.md".to_string(), card.into_bytes()));
    Ok(files)
}

/// A text file as it may be published: the run's own copy keeps an `env.url`'s
/// credentials (a resume needs them), the Hub gets `***` in their place.
fn public_text(name: &str, bytes: Vec<u8>) -> Vec<u8> {
    let text_file = [".toml", ".json", ".csv"].iter().any(|e| name.ends_with(e));
    match std::str::from_utf8(&bytes) {
        Ok(t) if text_file => crate::sys::redact_url_credentials(t).into_bytes(),
        _ => bytes,
    }
}

fn human_size(n: u64) -> String {
    const K: f64 = 1024.0;
    let f = n as f64;
    if f < K {
        format!("{n} B")
    } else if f < K * K {
        format!("{:.1} KiB", f / K)
    } else if f < K * K * K {
        format!("{:.1} MiB", f / K / K)
    } else {
        format!("{:.2} GiB", f / K / K / K)
    }
}

fn sha256_hex(bytes: &[u8]) -> String {
    let d = Sha256::digest(bytes);
    d.iter().map(|b| format!("{b:02x}")).collect()
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// Percent-encodes everything but RFC 3986 unreserved characters (for one path segment).
fn encode_segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

// ---------------------------------------------------------------------------------
// Export
// ---------------------------------------------------------------------------------

/// Uploads a run to `{endpoint}/{opts.repo}`: creates the repo (and the branch), sends
/// LFS files to storage, then makes one commit with every file and the model card.
/// Prints one progress line per step.
pub fn export(opts: &ExportOptions, endpoint: &str, token: &HfToken) -> Result<ExportReport> {
    validate_options(opts)?;
    let endpoint = normalize_endpoint(endpoint);
    check_endpoint(&endpoint)?;
    let files = collect_files(opts)?;
    let hub = Hub::new(&endpoint, token)?;
    let repo = opts.repo.as_str();
    let rev = encode_segment(&opts.revision);

    // 1. The repo.
    let (namespace, name) = repo.split_once('/').context("repo id without '/'")?;
    let body = json!({
        "type": "model",
        "name": name,
        "organization": namespace,
        "private": opts.private,
    });
    let reply = hub.call(
        "creating the repo",
        "POST",
        &format!("{endpoint}/api/repos/create"),
        Payload::Json(&body),
        &[409],
    )?;
    let created_repo = reply.status != 409;
    if created_repo {
        crate::say!(
            "created {}repo {endpoint}/{repo}",
            if opts.private { "private " } else { "" }
        );
    } else {
        crate::say!(
            "repo {}/{repo} exists (visibility unchanged)",
            crate::sys::redact_url_credentials(&endpoint)
        );
    }

    // 2. The branch.
    if opts.revision != "main" {
        let reply = hub.call(
            "creating the branch",
            "POST",
            &format!("{endpoint}/api/models/{repo}/branch/{rev}"),
            Payload::Json(&json!({})),
            &[409],
        )?;
        if reply.status == 409 {
            crate::say!("branch {} exists", opts.revision);
        } else {
            crate::say!("created branch {}", opts.revision);
        }
    }

    // 3. Pre-upload: which files go through LFS.
    let body = json!({
        "files": files.iter().map(|(path, bytes)| json!({
            "path": path,
            "size": bytes.len(),
            "sample": b64(&bytes[..bytes.len().min(512)]),
        })).collect::<Vec<_>>()
    });
    let reply = hub.call(
        "the pre-upload check",
        "POST",
        &format!("{endpoint}/api/models/{repo}/preupload/{rev}"),
        Payload::Json(&body),
        &[],
    )?;
    let pre: PreuploadResponse = reply.json("the pre-upload check")?;
    let lfs_paths: BTreeSet<String> = pre
        .files
        .into_iter()
        .filter(|f| f.upload_mode == "lfs")
        .map(|f| f.path)
        .collect();

    let uploaded: Vec<UploadedFile> = files
        .iter()
        .map(|(path, bytes)| UploadedFile {
            path: path.clone(),
            size: bytes.len() as u64,
            sha256: sha256_hex(bytes),
            mode: if lfs_paths.contains(path) {
                UploadMode::Lfs
            } else {
                UploadMode::Regular
            },
        })
        .collect();

    // 4. LFS uploads.
    let lfs: Vec<(&UploadedFile, &[u8])> = uploaded
        .iter()
        .zip(&files)
        .filter(|(u, _)| u.mode == UploadMode::Lfs)
        .map(|(u, (_, b))| (u, b.as_slice()))
        .collect();
    if !lfs.is_empty() {
        upload_lfs(&hub, repo, &opts.revision, &lfs)?;
    }

    // 5. The commit.
    let mut ndjson = String::new();
    let header = json!({"key": "header", "value": {
        "summary": opts.message,
        "description": format!("Uploaded with `concord export` (concord {}).", env!("CARGO_PKG_VERSION")),
    }});
    ndjson.push_str(&header.to_string());
    ndjson.push('\n');
    for (u, (_, bytes)) in uploaded.iter().zip(&files) {
        let line = match u.mode {
            UploadMode::Regular => {
                crate::say!("  {} ({}, inline)", u.path, human_size(u.size));
                json!({"key": "file", "value": {
                    "content": b64(bytes), "path": u.path, "encoding": "base64"}})
            }
            UploadMode::Lfs => {
                json!({"key": "lfsFile", "value": {
                    "path": u.path, "algo": "sha256", "oid": u.sha256}})
            }
        };
        ndjson.push_str(&line.to_string());
        ndjson.push('\n');
    }
    let reply = hub.call(
        "the commit",
        "POST",
        &format!("{endpoint}/api/models/{repo}/commit/{rev}"),
        Payload::Raw(Some("application/x-ndjson"), ndjson.as_bytes()),
        &[],
    )?;
    let commit: CommitResponse = reply.json("the commit").unwrap_or_default();
    match (&commit.commit_url, &commit.commit_oid) {
        (Some(url), Some(oid)) => crate::say!("committed {oid}: {url}"),
        (Some(url), None) => crate::say!("committed {url}"),
        (None, Some(oid)) => crate::say!("committed {oid}"),
        _ => crate::say!("committed to {}", opts.revision),
    }
    let repo_url = crate::sys::redact_url_credentials(&format!("{endpoint}/{repo}"));
    crate::say!("uploaded {} files to {repo_url}", uploaded.len());
    Ok(ExportReport {
        repo_url,
        created_repo,
        files: uploaded,
        commit_url: commit.commit_url,
        commit_oid: commit.commit_oid,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn revisions_follow_gits_ref_name_rules() {
        for ok in ["main", "v1.0", "exp/run-7", "feature_x"] {
            assert!(validate_revision(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            " ",
            "../../main",
            "a..b",
            ".hidden",
            "a/.b",
            "x.lock",
            "a b",
            "a:b",
            "/a",
            "a/",
            "a//b",
            "a.",
            "@",
            "a@{1}",
            "a\\b",
            "a\tb",
        ] {
            let e = validate_revision(bad).unwrap_err().to_string();
            assert!(e.contains("--revision"), "{bad:?}: {e}");
        }
    }

    #[test]
    fn hub_token_never_prints() {
        let t = HfToken::new("hf_SECRETtoken123").unwrap();
        assert_eq!(format!("{t}"), "hf_***");
        assert!(!format!("{t:?}").contains("SECRET"));
        assert_eq!(
            t.scrub("Bearer hf_SECRETtoken123 rejected"),
            "Bearer hf_*** rejected"
        );
    }

    /// Issue #31, item 19: `env.url = "ws://user:secret@host"` stays in the run's
    /// config (a resume needs it) but not in what is published.
    #[test]
    fn published_text_files_carry_no_url_credentials() {
        let config = b"[env]\nurl = \"ws://user:secret@10.0.0.1:8000\"\n".to_vec();
        let out = String::from_utf8(public_text("config.toml", config)).unwrap();
        assert_eq!(out, "[env]\nurl = \"ws://***@10.0.0.1:8000\"\n");
        let binary = b"\xffws://user:secret@h".to_vec();
        assert_eq!(
            public_text("adapter_model.safetensors", binary.clone()),
            binary
        );
    }

    #[test]
    fn a_token_no_header_can_carry_is_refused() {
        for bad in ["hf_a b", "hf_a\nb", "hf_\u{e9}t\u{e9}"] {
            let e = HfToken::new(bad)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(e.contains("token contains"), "{bad:?}: {e}");
        }
    }

    /// Issue #31, item 14: a Hub that accepts connections and never answers fails
    /// within a minute by default (it took 365 s with 120 s per attempt).
    #[test]
    fn a_silent_hub_fails_within_a_minute_by_default() {
        let backoff: Duration = BACKOFF.iter().sum();
        let worst = API_TIMEOUT * MAX_ATTEMPTS as u32 + backoff;
        assert!(worst < Duration::from_secs(60), "{worst:?}");
        assert!(
            API_TIMEOUT >= Duration::from_secs(10),
            "no shorter than huggingface_hub's"
        );
    }

    #[test]
    fn hub_token_resolution_order() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("token");
        std::fs::write(&file, "hf_fromfile\n").unwrap();
        let t = HfToken::resolve(Some("hf_env".into()), Some(file.clone()), None, None).unwrap();
        assert_eq!(t.expose_secret(), "hf_env");
        let t = HfToken::resolve(None, Some(file.clone()), None, None).unwrap();
        assert_eq!(t.expose_secret(), "hf_fromfile");
        let t = HfToken::resolve(None, None, Some(dir.path().into()), None).unwrap();
        assert_eq!(t.expose_secret(), "hf_fromfile");
        let e = HfToken::resolve(None, None, None, Some(dir.path().join("nohome")))
            .unwrap_err()
            .to_string();
        assert!(e.contains("HF_TOKEN"), "{e}");
    }

    #[test]
    fn hub_repo_ids_and_encoding() {
        assert!(validate_repo_id("user/name-1.0_x").is_ok());
        for bad in ["name", "a/b/c", "/x", "u/", "u/../x", "u/a b", "u/.x"] {
            assert!(validate_repo_id(bad).is_err(), "{bad}");
        }
        assert_eq!(encode_segment("main"), "main");
        assert_eq!(encode_segment("feat/x y"), "feat%2Fx%20y");
        assert_eq!(
            hub_model_id("Qwen/Qwen2.5-0.5B@abc").as_deref(),
            Some("Qwen/Qwen2.5-0.5B")
        );
        assert_eq!(hub_model_id("runs/.models/tiny"), None);
        assert_eq!(normalize_endpoint("http://x:1/ "), "http://x:1");
        assert!(check_endpoint("http://x:1").is_ok());
        assert!(check_endpoint("https://u:p@hub.example/api").is_ok());
        for bad in [
            "huggingface.co",
            "ftp://x",
            "http://",
            "http://:80",
            "http://a b",
        ] {
            let err = format!("{:#}", check_endpoint(bad).unwrap_err());
            assert!(err.contains("HF_ENDPOINT"), "{bad}: {err}");
        }
    }
}

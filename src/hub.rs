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
const IO_TIMEOUT: Duration = Duration::from_secs(300);
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
        println!(
            "dry run: would upload to {}/{} (revision {}){}:",
            endpoint_from_env(),
            opts.repo,
            opts.revision,
            if opts.private { ", private" } else { "" }
        );
        for (path, bytes) in &files {
            println!("  {path} ({})", human_size(bytes.len() as u64));
        }
        println!(
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
    if opts.revision.trim().is_empty() {
        bail!("--revision must not be empty");
    }
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
    let card = model_card(&opts.run_dir, &opts.repo)?;
    crate::atomic::atomic_write_bytes(&opts.run_dir.join("README.md"), card.as_bytes())?;
    let mut files = Vec::new();
    for name in RUN_FILES {
        let path = opts.run_dir.join(name);
        if path.is_file() {
            let bytes =
                std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
            files.push((name.to_string(), bytes));
        }
    }
    files.push(("README.md".to_string(), card.into_bytes()));
    Ok(files)
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
    let files = collect_files(opts)?;
    let hub = Hub::new(&endpoint, token);
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
        println!(
            "created {}repo {endpoint}/{repo}",
            if opts.private { "private " } else { "" }
        );
    } else {
        println!("repo {endpoint}/{repo} exists (visibility unchanged)");
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
            println!("branch {} exists", opts.revision);
        } else {
            println!("created branch {}", opts.revision);
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
                println!("  {} ({}, inline)", u.path, human_size(u.size));
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
        (Some(url), Some(oid)) => println!("committed {oid}: {url}"),
        (Some(url), None) => println!("committed {url}"),
        (None, Some(oid)) => println!("committed {oid}"),
        _ => println!("committed to {}", opts.revision),
    }
    let repo_url = format!("{endpoint}/{repo}");
    println!("uploaded {} files to {repo_url}", uploaded.len());
    Ok(ExportReport {
        repo_url,
        created_repo,
        files: uploaded,
        commit_url: commit.commit_url,
        commit_oid: commit.commit_oid,
    })
}

#[derive(Deserialize)]
struct PreuploadResponse {
    files: Vec<PreuploadFile>,
}

#[derive(Deserialize)]
struct PreuploadFile {
    path: String,
    #[serde(rename = "uploadMode")]
    upload_mode: String,
}

#[derive(Deserialize, Default)]
struct CommitResponse {
    #[serde(rename = "commitUrl")]
    commit_url: Option<String>,
    #[serde(rename = "commitOid")]
    commit_oid: Option<String>,
}

#[derive(Deserialize)]
struct LfsBatchResponse {
    objects: Vec<LfsObject>,
}

#[derive(Deserialize)]
struct LfsObject {
    oid: String,
    #[serde(default)]
    actions: Option<LfsActions>,
    #[serde(default)]
    error: Option<LfsObjectError>,
}

#[derive(Deserialize)]
struct LfsObjectError {
    #[serde(default)]
    code: i64,
    #[serde(default)]
    message: String,
}

#[derive(Deserialize, Default)]
struct LfsActions {
    upload: Option<LfsAction>,
    verify: Option<LfsAction>,
}

#[derive(Deserialize)]
struct LfsAction {
    href: String,
    #[serde(default)]
    header: BTreeMap<String, Value>,
}

fn upload_lfs(
    hub: &Hub,
    repo: &str,
    revision: &str,
    files: &[(&UploadedFile, &[u8])],
) -> Result<()> {
    let endpoint = hub.endpoint;
    let body = json!({
        "operation": "upload",
        "transfers": ["basic", "multipart"],
        "objects": files.iter().map(|(u, _)| json!({"oid": u.sha256, "size": u.size})).collect::<Vec<_>>(),
        "hash_algo": "sha256",
        "ref": {"name": revision},
    });
    let reply = hub.call(
        "the LFS batch request",
        "POST",
        &format!("{endpoint}/{repo}.git/info/lfs/objects/batch"),
        Payload::Lfs(&body),
        &[],
    )?;
    let batch: LfsBatchResponse = reply.json("the LFS batch request")?;
    for (u, bytes) in files {
        let obj = batch
            .objects
            .iter()
            .find(|o| o.oid == u.sha256)
            .with_context(|| format!("the LFS batch answer does not mention {}", u.path))?;
        if let Some(e) = &obj.error {
            bail!(
                "the Hub refused the LFS upload of {} ({}): {}",
                u.path,
                e.code,
                hub.token.scrub(&e.message)
            );
        }
        let actions = obj.actions.as_ref();
        let Some(upload) = actions.and_then(|a| a.upload.as_ref()) else {
            println!("  {} ({}, already on the Hub)", u.path, human_size(u.size));
            continue;
        };
        println!("  {} ({}, LFS)", u.path, human_size(u.size));
        let what = format!("the upload of {}", u.path);
        let chunk_size = upload.header.get("chunk_size").and_then(|v| match v {
            Value::Number(n) => n.as_u64(),
            Value::String(s) => s.parse().ok(),
            _ => None,
        });
        match chunk_size {
            None => {
                let headers = string_headers(&upload.header);
                hub.call_ext(
                    &what,
                    "PUT",
                    &upload.href,
                    Payload::Raw(None, bytes),
                    &headers,
                    false,
                    &[],
                )?;
            }
            Some(chunk) => upload_multipart(hub, &what, u, bytes, upload, chunk)?,
        }
        if let Some(verify) = actions.and_then(|a| a.verify.as_ref()) {
            let headers = string_headers(&verify.header);
            let same_host = verify.href.starts_with(&format!("{endpoint}/"));
            hub.call_ext(
                &format!("the LFS verification of {}", u.path),
                "POST",
                &verify.href,
                Payload::Lfs(&json!({"oid": u.sha256, "size": u.size})),
                &headers,
                same_host,
                &[],
            )?;
        }
    }
    Ok(())
}

/// The multi-part transfer: `header` maps part numbers ("1", "2", ...) to presigned
/// PUT URLs for consecutive `chunk`-byte slices; the ETags come back to `upload.href`.
fn upload_multipart(
    hub: &Hub,
    what: &str,
    u: &UploadedFile,
    bytes: &[u8],
    upload: &LfsAction,
    chunk: u64,
) -> Result<()> {
    if chunk == 0 {
        bail!(
            "the Hub asked for a multi-part upload of {} with chunk size 0",
            u.path
        );
    }
    let mut parts: Vec<(u64, &str)> = upload
        .header
        .iter()
        .filter_map(|(k, v)| Some((k.parse::<u64>().ok()?, v.as_str()?)))
        .collect();
    parts.sort_by_key(|p| p.0);
    let expected = bytes.len().div_ceil(chunk as usize);
    if parts.len() != expected {
        bail!(
            "the Hub's multi-part upload of {} has {} parts, expected {expected}",
            u.path,
            parts.len()
        );
    }
    let mut etags = Vec::new();
    for (i, (n, url)) in parts.iter().enumerate() {
        let start = i * chunk as usize;
        let end = (start + chunk as usize).min(bytes.len());
        let reply = hub.call_ext(
            &format!("{what} (part {n})"),
            "PUT",
            url,
            Payload::Raw(None, &bytes[start..end]),
            &[],
            false,
            &[],
        )?;
        let etag = reply
            .etag
            .with_context(|| format!("{what}: part {n} came back without an ETag"))?;
        etags.push(json!({"partNumber": n, "etag": etag}));
    }
    let same_host = upload.href.starts_with(&format!("{}/", hub.endpoint));
    hub.call_ext(
        &format!("{what} (completion)"),
        "POST",
        &upload.href,
        Payload::Lfs(&json!({"oid": u.sha256, "parts": etags})),
        &[],
        same_host,
        &[],
    )?;
    Ok(())
}

fn string_headers(h: &BTreeMap<String, Value>) -> Vec<(String, String)> {
    h.iter()
        .filter(|(k, _)| k.as_str() != "chunk_size" && !k.chars().all(|c| c.is_ascii_digit()))
        .filter_map(|(k, v)| match v {
            Value::String(s) => Some((k.clone(), s.clone())),
            Value::Number(n) => Some((k.clone(), n.to_string())),
            _ => None,
        })
        .collect()
}

// ---------------------------------------------------------------------------------
// HTTP
// ---------------------------------------------------------------------------------

enum Payload<'a> {
    Json(&'a Value),
    Lfs(&'a Value),
    /// Bytes with an optional content type (none for presigned storage URLs, which
    /// may be signed without one).
    Raw(Option<&'a str>, &'a [u8]),
}

struct Reply {
    status: u16,
    body: String,
    etag: Option<String>,
}

impl Reply {
    fn json<T: serde::de::DeserializeOwned>(&self, what: &str) -> Result<T> {
        serde_json::from_str(&self.body)
            .with_context(|| format!("the Hub's answer to {what} is not the expected JSON"))
    }
}

struct Hub<'a> {
    agent: ureq::Agent,
    endpoint: &'a str,
    token: &'a HfToken,
}

impl<'a> Hub<'a> {
    fn new(endpoint: &'a str, token: &'a HfToken) -> Hub<'a> {
        let agent = ureq::AgentBuilder::new()
            .timeout_connect(CONNECT_TIMEOUT)
            .timeout_read(IO_TIMEOUT)
            .timeout_write(IO_TIMEOUT)
            .user_agent(&format!("concord/{}", env!("CARGO_PKG_VERSION")))
            .build();
        Hub {
            agent,
            endpoint,
            token,
        }
    }

    /// An authenticated Hub API call.
    fn call(
        &self,
        what: &str,
        method: &str,
        url: &str,
        payload: Payload<'_>,
        allow: &[u16],
    ) -> Result<Reply> {
        self.call_ext(what, method, url, payload, &[], true, allow)
    }

    /// One request with bounded retries: connection failures, timeouts and 5xx are
    /// retried up to [`MAX_ATTEMPTS`] times; other 4xx than `allow` fail at once.
    #[allow(clippy::too_many_arguments)]
    fn call_ext(
        &self,
        what: &str,
        method: &str,
        url: &str,
        payload: Payload<'_>,
        headers: &[(String, String)],
        auth: bool,
        allow: &[u16],
    ) -> Result<Reply> {
        type Parts<'b> = (Option<&'b str>, Option<&'b str>, Cow<'b, [u8]>);
        let (content_type, accept, body): Parts<'_> = match payload {
            Payload::Json(v) => (
                Some("application/json"),
                None,
                Cow::Owned(v.to_string().into_bytes()),
            ),
            Payload::Lfs(v) => (
                Some(LFS_CONTENT_TYPE),
                Some(LFS_CONTENT_TYPE),
                Cow::Owned(v.to_string().into_bytes()),
            ),
            Payload::Raw(ct, b) => (ct, None, Cow::Borrowed(b)),
        };
        let mut last_error = String::new();
        for attempt in 1..=MAX_ATTEMPTS {
            if attempt > 1 {
                std::thread::sleep(BACKOFF[(attempt - 2).min(BACKOFF.len() - 1)]);
            }
            let mut req = self.agent.request(method, url);
            let has_content_type = headers
                .iter()
                .any(|(k, _)| k.eq_ignore_ascii_case("content-type"));
            if let Some(ct) = content_type.filter(|_| !has_content_type) {
                req = req.set("Content-Type", ct);
            }
            if let Some(a) = accept {
                req = req.set("Accept", a);
            }
            for (k, v) in headers {
                req = req.set(k, v);
            }
            if auth {
                req = req.set(
                    "Authorization",
                    &format!("Bearer {}", self.token.expose_secret()),
                );
            }
            match req.send_bytes(&body) {
                Ok(resp) => return Ok(self.reply(resp)),
                Err(ureq::Error::Status(code, resp)) => {
                    let reply = self.reply(resp);
                    if allow.contains(&code) {
                        return Ok(reply);
                    }
                    let msg = self.server_message(&reply);
                    if code >= 500 {
                        last_error = format!("HTTP {code}{msg}");
                        continue;
                    }
                    return Err(self.client_error(what, code, &msg));
                }
                Err(ureq::Error::Transport(t)) => {
                    // Kind, message and causes; not the URL (storage URLs are signed).
                    let mut detail = t.kind().to_string();
                    if let Some(m) = t.message() {
                        detail.push_str(&format!(": {m}"));
                    }
                    let mut source = std::error::Error::source(&t);
                    while let Some(e) = source {
                        detail.push_str(&format!(": {e}"));
                        source = e.source();
                    }
                    last_error = self.token.scrub(&detail);
                }
            }
        }
        if last_error.starts_with("HTTP ") {
            bail!(
                "the Hugging Face Hub at {} failed {what} ({last_error}) after {MAX_ATTEMPTS} \
                 attempts; try again later",
                self.endpoint
            )
        }
        bail!(
            "cannot reach the Hugging Face Hub at {} ({what}: {last_error}; {MAX_ATTEMPTS} \
             attempts): check your network or HF_ENDPOINT",
            self.endpoint
        )
    }

    fn reply(&self, resp: ureq::Response) -> Reply {
        let status = resp.status();
        let etag = resp.header("ETag").map(|s| s.to_string());
        let error_header = resp.header("X-Error-Message").map(|s| s.to_string());
        let mut body = resp.into_string().unwrap_or_default();
        if body.trim().is_empty() {
            if let Some(h) = error_header {
                body = h;
            }
        }
        Reply { status, body, etag }
    }

    /// `": <message>"` from an error answer (`{"error": ...}` or the text), scrubbed of
    /// the token and shortened; empty when there is none.
    fn server_message(&self, reply: &Reply) -> String {
        let text = serde_json::from_str::<Value>(&reply.body)
            .ok()
            .and_then(|v| v.get("error").and_then(|e| e.as_str()).map(str::to_string))
            .unwrap_or_else(|| reply.body.trim().to_string());
        let mut text = self.token.scrub(&text);
        if text.chars().count() > 300 {
            text = text.chars().take(300).collect::<String>() + "...";
        }
        if text.is_empty() {
            text
        } else {
            format!(": {text}")
        }
    }

    fn client_error(&self, what: &str, code: u16, msg: &str) -> anyhow::Error {
        let hint = match code {
            401 | 403 => {
                " (the token is invalid or lacks write access to this repo: create a \
                          token with write access at https://huggingface.co/settings/tokens)"
            }
            404 => " (repo or revision not found)",
            _ => "",
        };
        anyhow::anyhow!(
            "the Hugging Face Hub at {} refused {what}: HTTP {code}{hint}{msg}",
            self.endpoint
        )
    }
}

// ---------------------------------------------------------------------------------
// Model card
// ---------------------------------------------------------------------------------

/// `read(path)` when the file exists; a warning naming what the card then lacks when it
/// cannot be read.
fn read_if_present<T>(path: &Path, lacks: &str, read: impl Fn(&Path) -> Result<T>) -> Option<T> {
    if !path.is_file() {
        return None;
    }
    read(path)
        .map_err(|e| eprintln!("warning: {e:#}; the model card has no {lacks}"))
        .ok()
}

/// A finite value, or None (NaN and infinities print as "–" or not at all).
fn finite(v: f64) -> Option<f64> {
    v.is_finite().then_some(v)
}

fn fmt_num(v: f64) -> String {
    if v == 0.0 {
        "0".into()
    } else if v.fract() == 0.0 && v.abs() < 1e9 {
        format!("{v:.0}")
    } else if v.abs() >= 0.001 && v.abs() < 1e5 {
        let s = format!("{v:.4}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        format!("{v:.3e}")
    }
}

fn toml_str(v: &toml::Value) -> String {
    match v {
        toml::Value::String(s) => s.clone(),
        toml::Value::Float(f) => fmt_num(*f),
        toml::Value::Array(a) => a.iter().map(toml_str).collect::<Vec<_>>().join(", "),
        other => other.to_string(),
    }
}

fn get<'t>(t: &'t toml::Table, path: &[&str]) -> Option<&'t toml::Value> {
    let (last, head) = path.split_last()?;
    let mut cur = t;
    for k in head {
        cur = cur.get(*k)?.as_table()?;
    }
    cur.get(*last)
}

/// A Hub model id usable as `base_model` metadata: `namespace/name`, no revision.
fn hub_model_id(name: &str) -> Option<String> {
    let id = name.split('@').next().unwrap_or(name);
    validate_repo_id(id).ok()?;
    Some(id.to_string())
}

/// Markdown table cell text (no pipes or newlines).
fn cell(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

/// The model card (`README.md`) for a run: YAML metadata, what the adapter is, the
/// training configuration, final metrics, the eval table, the plots and how to load it.
pub fn model_card(run_dir: &Path, repo: &str) -> Result<String> {
    use std::fmt::Write;

    let adapter_path = run_dir.join("adapter_config.json");
    let adapter: Value = serde_json::from_str(
        &std::fs::read_to_string(&adapter_path)
            .with_context(|| format!("reading {}", adapter_path.display()))?,
    )
    .with_context(|| format!("parsing {}", adapter_path.display()))?;
    let config_path = run_dir.join("config.toml");
    let config: Option<toml::Table> = if config_path.is_file() {
        let text = std::fs::read_to_string(&config_path)
            .with_context(|| format!("reading {}", config_path.display()))?;
        Some(
            text.parse::<toml::Table>()
                .with_context(|| format!("parsing {}", config_path.display()))?,
        )
    } else {
        None
    };
    // Both files are uploaded as they are; only the card needs them understood.
    let log = read_if_present(&run_dir.join("training_log.csv"), "final metrics", |p| {
        TrainingLog::read(p)
    });
    let eval = read_if_present(&run_dir.join("eval.json"), "eval table", |p| {
        EvalReport::read(p)
    });

    let base = adapter
        .get("base_model_name_or_path")
        .and_then(Value::as_str)
        .map(str::to_string)
        .or_else(|| {
            config
                .as_ref()
                .and_then(|c| get(c, &["model", "name"]))
                .and_then(|v| v.as_str())
                .map(str::to_string)
        })
        .unwrap_or_else(|| "unknown".to_string());
    let base_id = hub_model_id(&base);

    // Environment names: [env], [[stage]] tables, the log's env column.
    let mut envs: Vec<String> = Vec::new();
    let mut add_env = |e: &str| {
        let e = e.trim();
        if !e.is_empty() && !envs.iter().any(|x| x == e) {
            envs.push(e.to_string());
        }
    };
    let stages: Vec<toml::Table> = config
        .as_ref()
        .and_then(|c| c.get("stage"))
        .and_then(|s| s.as_array())
        .map(|a| a.iter().filter_map(|v| v.as_table().cloned()).collect())
        .unwrap_or_default();
    if let Some(c) = &config {
        if let Some(e) = get(c, &["env", "name"]).and_then(|v| v.as_str()) {
            add_env(e);
        }
    }
    for s in &stages {
        if let Some(mixture) = s.get("envs").and_then(|v| v.as_table()) {
            mixture.keys().for_each(|e| add_env(e));
        }
    }
    if let Some(log) = &log {
        log.envs.iter().for_each(|e| add_env(e));
    }

    let mut md = String::new();
    // Front matter.
    md.push_str("---\n");
    if let Some(id) = &base_id {
        let _ = writeln!(md, "base_model: {id}");
    }
    md.push_str("library_name: peft\ntags:\n- concord\n- grpo\n- lora\n");
    for e in &envs {
        if e.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_'))
        {
            let _ = writeln!(md, "- {e}");
        }
    }
    md.push_str("---\n\n");

    let title = repo.rsplit('/').next().unwrap_or(repo);
    let _ = writeln!(md, "# {title}\n");
    let env_text = if envs.is_empty() {
        "multi-agent coordination environments".to_string()
    } else {
        let list = envs
            .iter()
            .map(|e| format!("`{e}`"))
            .collect::<Vec<_>>()
            .join(", ");
        format!(
            "the {list} environment{}",
            if envs.len() > 1 { "s" } else { "" }
        )
    };
    let base_link = match &base_id {
        Some(id) => format!("[`{id}`](https://huggingface.co/{id})"),
        None => format!("`{base}`"),
    };
    let _ = writeln!(
        md,
        "A LoRA adapter for {base_link}, trained with GRPO (group relative policy \
         optimization) by Concord, a pure-Rust GRPO trainer, on {env_text}.\n"
    );

    let _ = writeln!(md, "## Base model\n\n{base_link}\n");

    // Configuration.
    if let Some(c) = &config {
        md.push_str("## Training configuration\n\n| setting | value |\n|---|---|\n");
        let row = |md: &mut String, k: &str, path: &[&str]| {
            if let Some(v) = get(c, path) {
                let _ = writeln!(md, "| {k} | {} |", cell(&toml_str(v)));
            }
        };
        row(&mut md, "LoRA r", &["lora", "r"]);
        row(&mut md, "LoRA alpha", &["lora", "alpha"]);
        row(&mut md, "LoRA targets", &["lora", "targets"]);
        row(
            &mut md,
            "GRPO num_generations",
            &["grpo", "num_generations"],
        );
        row(
            &mut md,
            "GRPO prompts_per_step",
            &["grpo", "prompts_per_step"],
        );
        row(&mut md, "GRPO temperature", &["grpo", "temperature"]);
        row(&mut md, "GRPO loss_type", &["grpo", "loss_type"]);
        row(&mut md, "GRPO beta (KL)", &["grpo", "beta"]);
        row(
            &mut md,
            "max completion length",
            &["grpo", "max_completion_length"],
        );
        row(&mut md, "learning rate", &["optim", "learning_rate"]);
        row(&mut md, "schedule", &["optim", "schedule"]);
        row(&mut md, "steps", &["run", "steps"]);
        row(&mut md, "seed", &["run", "seed"]);
        if let Some(e) = get(c, &["env", "name"]) {
            let opts = get(c, &["env", "options"])
                .and_then(|o| o.as_table())
                .filter(|t| !t.is_empty())
                .map(|t| {
                    let kv: Vec<String> = t
                        .iter()
                        .map(|(k, v)| format!("{k} = {}", toml_str(v)))
                        .collect();
                    format!(" ({})", kv.join(", "))
                })
                .unwrap_or_default();
            let _ = writeln!(
                md,
                "| environment | {} |",
                cell(&format!("{}{opts}", toml_str(e)))
            );
        }
        md.push('\n');
        if !stages.is_empty() {
            md.push_str("Curriculum stages:\n\n| # | stage |\n|---|---|\n");
            for (i, s) in stages.iter().enumerate() {
                let kv: Vec<String> = s
                    .iter()
                    .map(|(k, v)| match v {
                        toml::Value::Table(t) => {
                            let inner: Vec<String> = t
                                .iter()
                                .map(|(k2, v2)| format!("{k2} = {}", toml_str(v2)))
                                .collect();
                            format!("{k}: {}", inner.join(", "))
                        }
                        _ => format!("{k} = {}", toml_str(v)),
                    })
                    .collect();
                let _ = writeln!(md, "| {} | {} |", i + 1, cell(&kv.join("; ")));
            }
            md.push('\n');
        }
        md.push_str("The full configuration is in [`config.toml`](config.toml).\n\n");
    }

    // Final metrics.
    if let Some(log) = log.as_ref().filter(|l| !l.is_empty()) {
        let last = |name: &str| {
            log.column(name)
                .and_then(|c| c.last().copied())
                .and_then(finite)
        };
        let step = log.steps.last().map_or("?".to_string(), |s| fmt_num(*s));
        let _ = writeln!(
            md,
            "## Final metrics (step {step})\n\n| metric | value |\n|---|---|"
        );
        let metric = |md: &mut String, label: &str, v: Option<f64>| {
            if let Some(v) = v {
                let _ = writeln!(md, "| {} | {} |", cell(label), fmt_num(v));
            }
        };
        metric(&mut md, "reward", last("reward"));
        let rewards = log.column("reward").unwrap_or_default();
        let vals: Vec<f64> = rewards[rewards.len().saturating_sub(10)..]
            .iter()
            .copied()
            .filter_map(finite)
            .collect();
        if !vals.is_empty() {
            let mean = vals.iter().sum::<f64>() / vals.len() as f64;
            metric(
                &mut md,
                &format!("reward, mean of the last {} steps", vals.len()),
                Some(mean),
            );
        }
        for k in ["kl", "entropy", "grad_norm"] {
            metric(&mut md, k, last(k));
        }
        for h in &log.header {
            if h.starts_with("rewards/") && h.ends_with("/mean") {
                metric(&mut md, h, last(h));
            }
        }
        md.push_str("\nPer-step metrics are in [`training_log.csv`](training_log.csv).\n\n");
    }

    // Evaluation.
    if let Some(ev) = eval.as_ref().filter(|e| !e.models.is_empty()) {
        md.push_str("## Evaluation\n\n");
        let facts = [
            format!("config `{}`", ev.config),
            format!("{} episodes per environment", ev.episodes),
            if ev.greedy {
                "greedy decoding"
            } else {
                "sampled decoding"
            }
            .to_string(),
            format!("seeds from {}", ev.first_seed),
        ];
        let _ = writeln!(md, "`concord eval`: {}.\n", facts.join(", "));
        let base_m = ev.models.get("base");
        let adapter_m = ev.models.get("adapter");
        let both = base_m.is_some() && adapter_m.is_some();
        let mut env_names: Vec<&String> = Vec::new();
        for m in ev.models.values() {
            for e in m.envs.keys() {
                if !env_names.contains(&e) {
                    env_names.push(e);
                }
            }
        }
        md.push_str(
            "| env | model | episodes | reward (95% CI) | win rate (95% CI) | components |",
        );
        if both {
            md.push_str(" Δ reward | Δ win rate |");
        }
        md.push_str("\n|---|---|---|---|---|---|");
        if both {
            md.push_str("---|---|");
        }
        md.push('\n');
        let with_ci = |v: f64, [lo, hi]: [f64; 2]| match (finite(v), finite(lo), finite(hi)) {
            (Some(v), Some(lo), Some(hi)) => {
                format!("{} [{}, {}]", fmt_num(v), fmt_num(lo), fmt_num(hi))
            }
            (Some(v), _, _) => fmt_num(v),
            _ => "–".to_string(),
        };
        let delta = |a: f64, b: f64| match (finite(a), finite(b)) {
            (Some(a), Some(b)) => format!("{:+.4}", a - b),
            _ => "–".to_string(),
        };
        // Known models first (base, adapter), then any others by name.
        let mut order: Vec<(&String, &ModelEval)> = ev.models.iter().collect();
        order.sort_by_key(|(k, _)| match k.as_str() {
            "base" => 0,
            "adapter" => 1,
            _ => 2,
        });
        for env in &env_names {
            for (mname, m) in &order {
                let Some(r) = m.envs.get(*env) else { continue };
                let comps = r
                    .components
                    .iter()
                    .map(|(k, v)| match finite(*v) {
                        Some(v) => format!("{k} {}", fmt_num(v)),
                        None => format!("{k} –"),
                    })
                    .collect::<Vec<_>>()
                    .join(", ");
                let _ = write!(
                    md,
                    "| {} | {} | {} | {} | {} | {} |",
                    cell(env),
                    cell(mname),
                    r.episodes,
                    with_ci(r.reward_mean, r.reward_ci95),
                    with_ci(r.win_rate, r.win_ci95),
                    cell(&comps)
                );
                if both {
                    let b = base_m.and_then(|b| b.envs.get(*env));
                    if mname.as_str() == "adapter" && b.is_some() {
                        let b = b.map_or((f64::NAN, f64::NAN), |b| (b.reward_mean, b.win_rate));
                        let _ = write!(
                            md,
                            " {} | {} |",
                            delta(r.reward_mean, b.0),
                            delta(r.win_rate, b.1)
                        );
                    } else {
                        md.push_str("  |  |");
                    }
                }
                md.push('\n');
            }
        }
        md.push('\n');
    }

    // Plots.
    let plots: Vec<(&str, &str)> = [
        ("reward_curve.png", "Reward curve"),
        ("components.png", "Reward components"),
        ("before_after.png", "Before and after training"),
    ]
    .into_iter()
    .filter(|(f, _)| run_dir.join(f).is_file())
    .collect();
    if !plots.is_empty() {
        md.push_str("## Plots\n\n");
        for (f, alt) in plots {
            let _ = writeln!(md, "![{alt}]({f})\n");
        }
    }

    // Usage.
    let base_q = base_id.clone().unwrap_or_else(|| base.clone());
    let _ = writeln!(
        md,
        "## How to use\n\n### With peft\n\n```python\nfrom peft import PeftModel\n\
         from transformers import AutoModelForCausalLM, AutoTokenizer\n\n\
         base = AutoModelForCausalLM.from_pretrained(\"{base_q}\")\n\
         tokenizer = AutoTokenizer.from_pretrained(\"{base_q}\")\n\
         model = PeftModel.from_pretrained(base, \"{repo}\")\n```\n"
    );
    let local = format!("adapters/{title}");
    let _ = writeln!(
        md,
        "### With Concord\n\n```bash\nhuggingface-cli download {repo} --local-dir {local}\n\
         concord generate --model {base_q} --adapter {local} --messages chat.json \
         --max-new-tokens 256\n```\n\n`chat.json` holds one conversation: a JSON list of \
         `{{\"role\", \"content\"}}` messages."
    );
    Ok(md)
}

#[cfg(test)]
mod tests {
    use super::*;

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
    }

    #[test]
    fn hub_model_card_eval_table() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::write(
            d.join("adapter_config.json"),
            r#"{"base_model_name_or_path":"Qwen/Qwen2.5-0.5B-Instruct","r":8}"#,
        )
        .unwrap();
        std::fs::write(
            d.join("config.toml"),
            "[run]\nsteps = 3\n[lora]\nr = 8\nalpha = 16.0\ntargets = [\"q_proj\"]\n\
             [grpo]\nnum_generations = 4\nloss_type = \"dapo\"\n[optim]\nlearning_rate = 1e-5\n\
             [[stage]]\nname = \"a\"\nsteps = 2\nenvs = { ticketmelt = 1.0 }\n\
             [[stage]]\nname = \"b\"\nenvs = { merge_ring = 1.0 }\n",
        )
        .unwrap();
        std::fs::write(
            d.join("training_log.csv"),
            "step,stage,env,reward,rewards/win/mean,kl,entropy,grad_norm\n\
             1,a,ticketmelt,0.1,0.5,nan,,1\n2,b,merge_ring,0.3,0.25,0.01,1.5,2\n",
        )
        .unwrap();
        std::fs::write(
            d.join("eval.json"),
            r#"{"config":"c.toml","episodes":64,"greedy":true,"first_seed":0,"models":{
              "base":{"adapter":null,"envs":{"ticketmelt":{"episodes":64,"seats":64,"reward_mean":0.41,
                "reward_ci95":[0.37,0.45],"win_rate":0.35,"win_ci95":[0.29,0.42],"components":{"r1_own":0.8}}}},
              "adapter":{"adapter":"runs/x","envs":{"ticketmelt":{"episodes":64,"seats":64,"reward_mean":0.5,
                "reward_ci95":[0.45,0.55],"win_rate":0.5,"win_ci95":[0.4,0.6],"components":{"r1_own":0.9}}}}}}"#,
        )
        .unwrap();
        let card = model_card(d, "me/my-adapter").unwrap();
        assert!(
            card.starts_with("---\nbase_model: Qwen/Qwen2.5-0.5B-Instruct\nlibrary_name: peft\n")
        );
        assert!(card.contains("- ticketmelt\n- merge_ring\n"), "{card}");
        assert!(card.contains("| reward | 0.3 |"), "{card}");
        assert!(
            card.contains("| reward, mean of the last 2 steps | 0.2 |"),
            "{card}"
        );
        assert!(card.contains("| rewards/win/mean | 0.25 |"), "{card}");
        assert!(card.contains("| ticketmelt | adapter | 64 | 0.5 [0.45, 0.55] | 0.5 [0.4, 0.6] | r1_own 0.9 | +0.0900 | +0.1500 |"), "{card}");
        assert!(card.contains("Curriculum stages"), "{card}");
        assert!(card.contains("PeftModel.from_pretrained(base, \"me/my-adapter\")"));
        assert!(card.contains("concord generate --model Qwen/Qwen2.5-0.5B-Instruct --adapter"));

        // undefined values (no scored seats: NaN, written as null) print as dashes
        std::fs::write(
            d.join("eval.json"),
            r#"{"config":"c.toml","episodes":0,"greedy":true,"first_seed":0,"models":{
              "base":{"adapter":null,"envs":{"ticketmelt":{"episodes":0,"seats":0,"reward_mean":null,
                "reward_ci95":[null,null],"win_rate":null,"win_ci95":[0.0,1.0],"components":{"win":null}}}}}}"#,
        )
        .unwrap();
        let card = model_card(d, "me/my-adapter").unwrap();
        assert!(
            card.contains("| ticketmelt | base | 0 | – | – | win – |"),
            "{card}"
        );
    }
}

//! The Hub's HTTP side: one client ([`Hub`]) with retries, timeouts and token
//! scrubbing, the wire types of the pre-upload, commit and git-lfs batch APIs, and the
//! LFS uploads (single PUT or multi-part).
use super::*;

#[derive(Deserialize)]
pub(super) struct PreuploadResponse {
    pub(super) files: Vec<PreuploadFile>,
}

#[derive(Deserialize)]
pub(super) struct PreuploadFile {
    pub(super) path: String,
    #[serde(rename = "uploadMode")]
    pub(super) upload_mode: String,
}

#[derive(Deserialize, Default)]
pub(super) struct CommitResponse {
    #[serde(rename = "commitUrl")]
    pub(super) commit_url: Option<String>,
    #[serde(rename = "commitOid")]
    pub(super) commit_oid: Option<String>,
}

#[derive(Deserialize)]
pub(super) struct LfsBatchResponse {
    pub(super) objects: Vec<LfsObject>,
}

#[derive(Deserialize)]
pub(super) struct LfsObject {
    pub(super) oid: String,
    #[serde(default)]
    pub(super) actions: Option<LfsActions>,
    #[serde(default)]
    pub(super) error: Option<LfsObjectError>,
}

#[derive(Deserialize)]
pub(super) struct LfsObjectError {
    #[serde(default)]
    pub(super) code: i64,
    #[serde(default)]
    pub(super) message: String,
}

#[derive(Deserialize, Default)]
pub(super) struct LfsActions {
    pub(super) upload: Option<LfsAction>,
    pub(super) verify: Option<LfsAction>,
}

#[derive(Deserialize)]
pub(super) struct LfsAction {
    pub(super) href: String,
    #[serde(default)]
    pub(super) header: BTreeMap<String, Value>,
}

pub(super) fn upload_lfs(
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
            crate::say!("  {} ({}, already on the Hub)", u.path, human_size(u.size));
            continue;
        };
        crate::say!("  {} ({}, LFS)", u.path, human_size(u.size));
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
pub(super) fn upload_multipart(
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

pub(super) fn string_headers(h: &BTreeMap<String, Value>) -> Vec<(String, String)> {
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

pub(super) enum Payload<'a> {
    Json(&'a Value),
    Lfs(&'a Value),
    /// Bytes with an optional content type (none for presigned storage URLs, which
    /// may be signed without one).
    Raw(Option<&'a str>, &'a [u8]),
}

pub(super) struct Reply {
    pub(super) status: u16,
    pub(super) body: String,
    pub(super) etag: Option<String>,
}

impl Reply {
    pub(super) fn json<T: serde::de::DeserializeOwned>(&self, what: &str) -> Result<T> {
        serde_json::from_str(&self.body)
            .with_context(|| format!("the Hub's answer to {what} is not the expected JSON"))
    }
}

/// Transport failures that another attempt cannot fix, with what to check instead.
fn not_the_network(kind: ureq::ErrorKind) -> Option<&'static str> {
    use ureq::ErrorKind as K;
    match kind {
        K::InvalidUrl | K::UnknownScheme => Some("the URL is malformed"),
        K::Dns => Some("its host name does not resolve: check HF_ENDPOINT for a typo, or your DNS"),
        K::BadHeader => Some(
            "a request header is malformed: check that HF_TOKEN is one line of printable \
             characters",
        ),
        K::InsecureRequestHttpsOnly | K::InvalidProxyUrl | K::ProxyUnauthorized => {
            Some("the proxy or TLS settings refuse the request")
        }
        _ => None,
    }
}

/// Every request is bounded: a server that accepts the connection but never answers
/// costs at most `api` per attempt (plus the upload time of the body).
#[derive(Debug, Clone, Copy)]
pub(super) struct Timeouts {
    pub(super) api: Duration,
}

impl Timeouts {
    /// [`API_TIMEOUT`], or `CONCORD_HUB_TIMEOUT` seconds when set.
    pub(super) fn from_env() -> Result<Self> {
        let api = match std::env::var(TIMEOUT_ENV) {
            Ok(v) => {
                let secs: u64 = v.trim().parse().ok().filter(|s| *s > 0).with_context(|| {
                    format!("{TIMEOUT_ENV}={v:?}: expected a whole number of seconds >= 1")
                })?;
                Duration::from_secs(secs)
            }
            Err(_) => API_TIMEOUT,
        };
        Ok(Self { api })
    }

    /// The whole-request limit for a request carrying `body_len` bytes.
    pub(super) fn for_body(&self, body_len: usize) -> Duration {
        self.api + Duration::from_secs(body_len as u64 / MIN_UPLOAD_BYTES_PER_S)
    }
}

pub(super) struct Hub<'a> {
    pub(super) agent: ureq::Agent,
    pub(super) timeouts: Timeouts,
    pub(super) endpoint: &'a str,
    pub(super) token: &'a HfToken,
}

impl<'a> Hub<'a> {
    pub(super) fn new(endpoint: &'a str, token: &'a HfToken) -> Result<Hub<'a>> {
        let timeouts = Timeouts::from_env()?;
        let agent = ureq::AgentBuilder::new()
            .timeout_connect(CONNECT_TIMEOUT.min(timeouts.api))
            .user_agent(&format!("concord/{}", env!("CARGO_PKG_VERSION")))
            .build();
        Ok(Hub {
            agent,
            timeouts,
            endpoint,
            token,
        })
    }

    /// An authenticated Hub API call.
    pub(super) fn call(
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
    /// retried up to [`MAX_ATTEMPTS`] times, with a line on stderr before each retry;
    /// 4xx other than `allow`, malformed URLs, unknown hosts and bad headers fail at once.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn call_ext(
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
                let wait = BACKOFF[(attempt - 2).min(BACKOFF.len() - 1)];
                // A line while waiting: a silent Hub costs up to a minute.
                crate::note!(
                    "the Hugging Face Hub at {} failed {what} ({last_error}); attempt {attempt} \
                     of {MAX_ATTEMPTS} in {:.1}s",
                    crate::sys::redact_url_credentials(self.endpoint),
                    wait.as_secs_f64()
                );
                std::thread::sleep(wait);
            }
            let mut req = self
                .agent
                .request(method, url)
                .timeout(self.timeouts.for_body(body.len()));
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
                    if let Some(why) = not_the_network(t.kind()) {
                        bail!(
                            "{what}: {why} (HF_ENDPOINT is {})",
                            crate::sys::redact_url_credentials(self.endpoint)
                        );
                    }
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
             attempts, each limited to {}s, {TIMEOUT_ENV} to change): check your network or \
             HF_ENDPOINT",
            self.endpoint,
            self.timeouts.for_body(body.len()).as_secs()
        )
    }

    pub(super) fn reply(&self, resp: ureq::Response) -> Reply {
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
    pub(super) fn server_message(&self, reply: &Reply) -> String {
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

    pub(super) fn client_error(&self, what: &str, code: u16, msg: &str) -> anyhow::Error {
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

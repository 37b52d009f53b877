//! `concord export` against an in-process fake of the Hugging Face Hub's upload
//! endpoints (repo creation, branches, pre-upload, git-lfs batch with basic and
//! multi-part transfers, verify, NDJSON commit), plus the token-leak, unreachable-Hub
//! and missing-token failures.
use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine;
use concord::hub::{export, ExportOptions, HfToken, UploadMode};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

const BASE_MODEL: &str = "Qwen/Qwen2.5-0.5B-Instruct";
/// LFS objects above this size are handed out as multi-part uploads.
const MULTIPART_OVER: usize = 2048;
const CHUNK: usize = 1024;

fn sha256_hex(b: &[u8]) -> String {
    Sha256::digest(b)
        .iter()
        .map(|x| format!("{x:02x}"))
        .collect()
}

fn b64d(s: &str) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD
        .decode(s)
        .expect("valid base64")
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            let hex = std::str::from_utf8(&b[i + 1..i + 3]).unwrap();
            out.push(u8::from_str_radix(hex, 16).unwrap());
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).unwrap()
}

// ---------------------------------------------------------------------------------
// The fake Hub
// ---------------------------------------------------------------------------------

#[derive(Default)]
struct State {
    /// repo id -> private flag as created.
    repos: BTreeMap<String, bool>,
    create_calls: usize,
    branches: BTreeSet<String>,
    /// LFS storage: oid -> bytes (sha256-checked on arrival).
    lfs: BTreeMap<String, Vec<u8>>,
    parts: BTreeMap<(String, usize), Vec<u8>>,
    /// Committed files: (revision, path) -> bytes.
    files: BTreeMap<(String, String), Vec<u8>>,
    commit_summaries: Vec<String>,
    /// Authorization header of every Hub API request.
    api_auth: Vec<Option<String>>,
    /// Authorization header of every storage request (must stay None).
    storage_auth: Vec<Option<String>>,
    user_agents: BTreeSet<String>,
    requests: Vec<String>,
    /// Protocol violations noticed by the server.
    violations: Vec<String>,
    /// Answer every API request with a 403 that echoes the Authorization header.
    deny: bool,
    /// Answer every API request with this client error (401, 404, ...) when nonzero.
    refuse: u16,
    /// Answer this many API requests with a 503 first.
    unavailable: usize,
}

struct FakeHub {
    base: String,
    state: Arc<Mutex<State>>,
}

struct Request {
    method: String,
    path: String,
    headers: BTreeMap<String, String>,
    body: Vec<u8>,
}

impl Request {
    fn header(&self, k: &str) -> Option<&str> {
        self.headers
            .get(&k.to_ascii_lowercase())
            .map(String::as_str)
    }
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }
}

impl FakeHub {
    fn start(deny: bool) -> FakeHub {
        Self::with_state(State {
            deny,
            ..State::default()
        })
    }

    fn with_state(state: State) -> FakeHub {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let state = Arc::new(Mutex::new(state));
        let (st, b) = (state.clone(), base.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let (st, b) = (st.clone(), b.clone());
                std::thread::spawn(move || serve(stream, &st, &b));
            }
        });
        FakeHub { base, state }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap()
    }
}

fn read_request(stream: &TcpStream) -> Option<Request> {
    let mut r = BufReader::new(stream);
    let mut line = String::new();
    r.read_line(&mut line).ok()?;
    let mut it = line.split_whitespace();
    let method = it.next()?.to_string();
    let path = it.next()?.to_string();
    let mut headers = BTreeMap::new();
    loop {
        let mut h = String::new();
        r.read_line(&mut h).ok()?;
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        let (k, v) = h.split_once(':')?;
        headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
    }
    let n: usize = headers
        .get("content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0; n];
    r.read_exact(&mut body).ok()?;
    Some(Request {
        method,
        path,
        headers,
        body,
    })
}

fn respond(mut stream: TcpStream, status: u16, headers: &[(&str, String)], body: &str) {
    let reason = match status {
        200 => "OK",
        400 => "Bad Request",
        403 => "Forbidden",
        404 => "Not Found",
        409 => "Conflict",
        422 => "Unprocessable Entity",
        _ => "Other",
    };
    let mut head = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    let _ = stream.write_all(head.as_bytes());
    let _ = stream.write_all(body.as_bytes());
    let _ = stream.flush();
}

fn serve(stream: TcpStream, state: &Mutex<State>, base: &str) {
    let Some(req) = read_request(&stream) else {
        return;
    };
    let (status, headers, body) = route(&req, &mut state.lock().unwrap(), base);
    respond(stream, status, &headers, &body);
}

type Answer = (u16, Vec<(&'static str, String)>, String);

fn ok(v: Value) -> Answer {
    (200, vec![], v.to_string())
}

fn fail(st: &mut State, status: u16, why: String) -> Answer {
    st.violations.push(why.clone());
    (status, vec![], json!({ "error": why }).to_string())
}

fn route(req: &Request, st: &mut State, base: &str) -> Answer {
    st.requests.push(format!("{} {}", req.method, req.path));
    let segs: Vec<&str> = req.path.trim_start_matches('/').split('/').collect();
    let storage = matches!(segs.first(), Some(&"storage"));
    if storage {
        st.storage_auth
            .push(req.header("authorization").map(str::to_string));
    } else {
        st.api_auth
            .push(req.header("authorization").map(str::to_string));
        if let Some(ua) = req.header("user-agent") {
            st.user_agents.insert(ua.to_string());
        }
        if st.unavailable > 0 {
            st.unavailable -= 1;
            return (503, vec![], json!({"error": "try later"}).to_string());
        }
        if st.refuse != 0 {
            let status = st.refuse;
            return (status, vec![], json!({"error": "refused"}).to_string());
        }
        if st.deny {
            let auth = req.header("authorization").unwrap_or("").to_string();
            return (
                403,
                vec![("X-Error-Message", format!("bad token {auth}"))],
                json!({ "error": format!("Invalid credentials in Authorization header: {auth}") })
                    .to_string(),
            );
        }
    }
    match (req.method.as_str(), segs.as_slice()) {
        ("POST", ["api", "repos", "create"]) => {
            st.create_calls += 1;
            let v = req.json();
            if v["type"] != "model" {
                return fail(st, 400, format!("bad repo type {}", v["type"]));
            }
            let id = format!(
                "{}/{}",
                v["organization"].as_str().unwrap_or(""),
                v["name"].as_str().unwrap_or("")
            );
            if st.repos.contains_key(&id) {
                return (
                    409,
                    vec![],
                    json!({"error": "You already created this model repo"}).to_string(),
                );
            }
            let private = v["private"].as_bool().unwrap_or(false);
            st.repos.insert(id.clone(), private);
            ok(json!({ "url": format!("{base}/{id}") }))
        }
        ("POST", ["api", "models", ns, name, "branch", rev]) => {
            let key = format!("{ns}/{name}@{}", percent_decode(rev));
            if st.branches.contains(&key) {
                return (409, vec![], json!({"error": "branch exists"}).to_string());
            }
            st.branches.insert(key);
            ok(json!({}))
        }
        ("POST", ["api", "models", ns, name, "preupload", _rev]) => {
            if !st.repos.contains_key(&format!("{ns}/{name}")) {
                return fail(st, 404, "preupload before create".into());
            }
            let v = req.json();
            let mut out = Vec::new();
            for f in v["files"].as_array().cloned().unwrap_or_default() {
                let path = f["path"].as_str().unwrap_or("").to_string();
                let sample = b64d(f["sample"].as_str().unwrap_or(""));
                if sample.len() > 512 || f["size"].as_u64().is_none() {
                    return fail(st, 400, format!("bad preupload entry for {path}"));
                }
                let lfs = path.ends_with(".safetensors") || path.ends_with(".png");
                out.push(json!({"path": path, "uploadMode": if lfs {"lfs"} else {"regular"}}));
            }
            ok(json!({ "files": out }))
        }
        ("POST", [ns, repo_git, "info", "lfs", "objects", "batch"]) => {
            let ct = req.header("content-type").unwrap_or("");
            let accept = req.header("accept").unwrap_or("");
            if ct != "application/vnd.git-lfs+json" || accept != "application/vnd.git-lfs+json" {
                return fail(st, 400, format!("bad LFS headers {ct} / {accept}"));
            }
            let Some(name) = repo_git.strip_suffix(".git") else {
                return fail(st, 404, "no .git suffix".into());
            };
            if !st.repos.contains_key(&format!("{ns}/{name}")) {
                return fail(st, 404, "LFS batch for unknown repo".into());
            }
            let v = req.json();
            if v["operation"] != "upload" || v["hash_algo"] != "sha256" {
                return fail(st, 400, "bad LFS batch request".into());
            }
            let mut out = Vec::new();
            for o in v["objects"].as_array().cloned().unwrap_or_default() {
                let oid = o["oid"].as_str().unwrap_or("").to_string();
                let size = o["size"].as_u64().unwrap_or(0) as usize;
                if st.lfs.contains_key(&oid) {
                    out.push(json!({"oid": oid, "size": size}));
                    continue;
                }
                let verify = json!({"href": format!("{base}/api/lfs/verify/{oid}")});
                let upload = if size > MULTIPART_OVER {
                    let mut header = serde_json::Map::new();
                    header.insert("chunk_size".into(), json!(CHUNK.to_string()));
                    for n in 1..=size.div_ceil(CHUNK) {
                        header.insert(
                            n.to_string(),
                            json!(format!("{base}/storage/part/{oid}/{n}?sig=abc")),
                        );
                    }
                    json!({"href": format!("{base}/api/lfs/complete/{oid}"), "header": header})
                } else {
                    json!({"href": format!("{base}/storage/put/{oid}?sig=abc"),
                           "header": {"X-Storage-Check": "yes"}})
                };
                out.push(json!({"oid": oid, "size": size,
                    "actions": {"upload": upload, "verify": verify}}));
            }
            ok(json!({"transfer": "basic", "objects": out}))
        }
        ("PUT", ["storage", "put", oid_q]) => {
            let oid = oid_q.split('?').next().unwrap_or("").to_string();
            if req.header("x-storage-check") != Some("yes") {
                return fail(st, 400, "upload action header missing".into());
            }
            if req.header("content-type").is_some() {
                return fail(st, 400, "content type on a presigned PUT".into());
            }
            if sha256_hex(&req.body) != oid {
                return fail(st, 400, format!("sha256 mismatch for {oid}"));
            }
            st.lfs.insert(oid, req.body.clone());
            ok(json!({}))
        }
        ("PUT", ["storage", "part", oid, n_q]) => {
            let n: usize = n_q.split('?').next().unwrap_or("0").parse().unwrap_or(0);
            st.parts.insert((oid.to_string(), n), req.body.clone());
            (200, vec![("ETag", format!("\"etag-{n}\""))], String::new())
        }
        ("POST", ["api", "lfs", "complete", oid]) => {
            let v = req.json();
            let mut bytes = Vec::new();
            let parts = v["parts"].as_array().cloned().unwrap_or_default();
            for (i, p) in parts.iter().enumerate() {
                let n = p["partNumber"].as_u64().unwrap_or(0) as usize;
                if n != i + 1 || p["etag"].as_str() != Some(format!("\"etag-{n}\"").as_str()) {
                    return fail(st, 400, format!("bad part list {v}"));
                }
                match st.parts.get(&(oid.to_string(), n)) {
                    Some(b) => bytes.extend_from_slice(b),
                    None => return fail(st, 400, format!("part {n} never arrived")),
                }
            }
            if v["oid"] != *oid || sha256_hex(&bytes) != *oid {
                return fail(st, 400, format!("multi-part sha256 mismatch for {oid}"));
            }
            st.lfs.insert(oid.to_string(), bytes);
            ok(json!({}))
        }
        ("POST", ["api", "lfs", "verify", oid]) => {
            let v = req.json();
            match st.lfs.get(*oid) {
                Some(b) if v["size"].as_u64() == Some(b.len() as u64) => ok(json!({})),
                _ => fail(st, 404, format!("verify of unknown object {oid}")),
            }
        }
        ("POST", ["api", "models", ns, name, "commit", rev]) => {
            if req.header("content-type") != Some("application/x-ndjson") {
                return fail(st, 400, "commit is not NDJSON".into());
            }
            if !st.repos.contains_key(&format!("{ns}/{name}")) {
                return fail(st, 404, "commit to unknown repo".into());
            }
            let rev = percent_decode(rev);
            if rev != "main" && !st.branches.contains(&format!("{ns}/{name}@{rev}")) {
                return fail(st, 404, format!("commit to unknown branch {rev}"));
            }
            let text = String::from_utf8_lossy(&req.body).to_string();
            let mut staged = Vec::new();
            for (i, line) in text.lines().enumerate() {
                let v: Value = match serde_json::from_str(line) {
                    Ok(v) => v,
                    Err(e) => return fail(st, 400, format!("bad NDJSON line {i}: {e}")),
                };
                let val = &v["value"];
                match (i, v["key"].as_str()) {
                    (0, Some("header")) => {
                        let s = val["summary"].as_str().unwrap_or("").to_string();
                        st.commit_summaries.push(s);
                    }
                    (0, _) => return fail(st, 400, "commit without header line".into()),
                    (_, Some("file")) => {
                        if val["encoding"] != "base64" {
                            return fail(st, 400, "file without base64 encoding".into());
                        }
                        let path = val["path"].as_str().unwrap_or("").to_string();
                        staged.push((path, b64d(val["content"].as_str().unwrap_or(""))));
                    }
                    (_, Some("lfsFile")) => {
                        let path = val["path"].as_str().unwrap_or("").to_string();
                        let oid = val["oid"].as_str().unwrap_or("");
                        if val["algo"] != "sha256" {
                            return fail(st, 400, "lfsFile without sha256".into());
                        }
                        match st.lfs.get(oid) {
                            Some(b) => staged.push((path, b.clone())),
                            None => {
                                return fail(st, 422, format!("lfsFile {path} was never uploaded"))
                            }
                        }
                    }
                    (_, k) => return fail(st, 400, format!("unknown NDJSON key {k:?}")),
                }
            }
            for (path, bytes) in staged {
                st.files.insert((rev.clone(), path), bytes);
            }
            let oid = format!("{:040x}", st.commit_summaries.len());
            ok(json!({"success": true, "commitOid": oid,
                      "commitUrl": format!("{base}/{ns}/{name}/commit/{oid}")}))
        }
        _ => fail(st, 404, format!("no route for {} {}", req.method, req.path)),
    }
}

// ---------------------------------------------------------------------------------
// Fixtures and helpers
// ---------------------------------------------------------------------------------

fn pseudo_random(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
    (0..n)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (x >> 33) as u8
        })
        .collect()
}

/// A finished-looking run: adapter (3000 bytes: a multi-part LFS upload), adapter
/// config, 3-row training log, config, and a fake PNG (a basic LFS upload).
fn fake_run(dir: &Path) -> PathBuf {
    let run = dir.join("run");
    std::fs::create_dir_all(run.join("checkpoint-2")).unwrap();
    std::fs::write(
        run.join("adapter_model.safetensors"),
        pseudo_random(3000, 7),
    )
    .unwrap();
    std::fs::write(
        run.join("adapter_config.json"),
        json!({"base_model_name_or_path": BASE_MODEL, "peft_type": "LORA", "r": 8,
               "lora_alpha": 16.0, "target_modules": ["q_proj", "v_proj"]})
        .to_string(),
    )
    .unwrap();
    std::fs::write(
        run.join("training_log.csv"),
        "step,stage,env,reward,reward_std,rewards/format/mean,rewards/format/std,rewards/win/mean,rewards/win/std,kl,entropy,loss,grad_norm,learning_rate,seconds\n\
         1,main,ticketmelt,0.25,0.1,1,0,0.5,0.1,nan,1.9,0.01,0.8,0.00001,1.5\n\
         2,main,ticketmelt,0.5,0.1,1,0,0.5,0.1,0.001,1.8,0.02,0.7,0.00001,3.0\n\
         3,main,ticketmelt,0.6875,0.1,1,0,0.75,0.1,0.002,1.7,0.03,0.6,0.00001,4.5\n",
    )
    .unwrap();
    std::fs::write(
        run.join("config.toml"),
        "[run]\nname = \"t\"\nsteps = 3\n[model]\nname = \"Qwen/Qwen2.5-0.5B-Instruct\"\n\
         [lora]\nr = 8\nalpha = 16.0\ntargets = [\"q_proj\", \"v_proj\"]\n\
         [grpo]\nnum_generations = 4\ntemperature = 1.0\nloss_type = \"dapo\"\nbeta = 0.0\n\
         [optim]\nlearning_rate = 0.00001\n[env]\nname = \"ticketmelt\"\n",
    )
    .unwrap();
    let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
    png.extend(pseudo_random(700, 9));
    std::fs::write(run.join("reward_curve.png"), png).unwrap();
    // Never uploaded.
    std::fs::write(run.join("samples.jsonl"), "{}\n").unwrap();
    std::fs::write(run.join("checkpoint-2/adapter_model.safetensors"), b"x").unwrap();
    run
}

const UPLOADED: [&str; 5] = [
    "adapter_model.safetensors",
    "adapter_config.json",
    "training_log.csv",
    "config.toml",
    "reward_curve.png",
];

/// Every uploaded file on the server equals the local bytes; nothing else arrived
/// but the model card.
fn assert_files_arrived(hub: &FakeHub, run: &Path, rev: &str) {
    let st = hub.state();
    assert!(st.violations.is_empty(), "{:?}", st.violations);
    for f in UPLOADED {
        let local = std::fs::read(run.join(f)).unwrap();
        let remote = st
            .files
            .get(&(rev.to_string(), f.to_string()))
            .unwrap_or_else(|| panic!("{f} not committed; requests {:?}", st.requests));
        assert_eq!(sha256_hex(remote), sha256_hex(&local), "{f}");
    }
    let card = st
        .files
        .get(&(rev.to_string(), "README.md".to_string()))
        .expect("model card committed");
    let card = String::from_utf8(card.clone()).unwrap();
    assert!(
        card.contains(&format!("base_model: {BASE_MODEL}")),
        "{card}"
    );
    assert!(card.contains("| reward | 0.6875 |"), "{card}");
    assert!(card.contains("![Reward curve](reward_curve.png)"), "{card}");
    assert_eq!(
        std::fs::read_to_string(run.join("README.md")).unwrap(),
        card,
        "card written into the run dir"
    );
    let names: BTreeSet<&str> = st
        .files
        .keys()
        .filter(|(r, _)| r == rev)
        .map(|(_, p)| p.as_str())
        .collect();
    let expected: BTreeSet<&str> = UPLOADED.iter().copied().chain(["README.md"]).collect();
    assert_eq!(names, expected);
    assert!(
        st.storage_auth.iter().all(Option::is_none),
        "token sent to storage"
    );
    assert!(st.user_agents.iter().all(|ua| ua.starts_with("concord/")));
}

fn concord(args: &[&str], endpoint: &str, token: Option<&str>, home: &Path) -> (Output, Duration) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_concord"));
    cmd.args(args)
        .env("HF_ENDPOINT", endpoint)
        .env("HOME", home)
        .env("HF_HOME", home.join("hf"))
        .env_remove("HF_TOKEN_PATH")
        .env_remove("HF_TOKEN");
    if let Some(t) = token {
        cmd.env("HF_TOKEN", t);
    }
    let t0 = Instant::now();
    let out = cmd.output().expect("run concord");
    (out, t0.elapsed())
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

// ---------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------

#[test]
fn export_library_call_uploads_every_file_intact() {
    let dir = tempfile::tempdir().unwrap();
    let run = fake_run(dir.path());
    let hub = FakeHub::start(false);
    let token = HfToken::new("hf_testtoken").unwrap();
    let opts = ExportOptions {
        run_dir: run.clone(),
        repo: "alice/concord-test".into(),
        private: true,
        revision: "main".into(),
        message: "Upload Concord GRPO adapter".into(),
    };
    let report = export(&opts, &format!("{}/", hub.base), &token).unwrap();
    assert!(report.created_repo);
    assert_eq!(report.repo_url, format!("{}/alice/concord-test", hub.base));
    assert!(report
        .commit_url
        .as_deref()
        .unwrap()
        .contains("/alice/concord-test/commit/"));
    assert!(report.commit_oid.is_some());
    let modes: BTreeMap<&str, UploadMode> = report
        .files
        .iter()
        .map(|f| (f.path.as_str(), f.mode))
        .collect();
    assert_eq!(modes["adapter_model.safetensors"], UploadMode::Lfs);
    assert_eq!(modes["reward_curve.png"], UploadMode::Lfs);
    assert_eq!(modes["training_log.csv"], UploadMode::Regular);
    assert_files_arrived(&hub, &run, "main");
    {
        let st = hub.state();
        assert_eq!(
            st.repos.get("alice/concord-test"),
            Some(&true),
            "private flag"
        );
        assert!(!st.api_auth.is_empty());
        assert!(st
            .api_auth
            .iter()
            .all(|a| a.as_deref() == Some("Bearer hf_testtoken")));
        assert_eq!(st.commit_summaries, ["Upload Concord GRPO adapter"]);
    }

    // Again: the repo exists (409) and the LFS objects are already stored.
    let report = export(&opts, &hub.base, &token).unwrap();
    assert!(!report.created_repo);
    let st = hub.state();
    assert_eq!(st.create_calls, 2);
    assert_eq!(st.commit_summaries.len(), 2);
    assert!(st.violations.is_empty(), "{:?}", st.violations);
}

#[test]
fn export_binary_to_a_new_branch() {
    let dir = tempfile::tempdir().unwrap();
    let run = fake_run(dir.path());
    let hub = FakeHub::start(false);
    let run_s = run.to_str().unwrap();
    let args = [
        "export",
        run_s,
        "--repo",
        "bob/adapter",
        "--revision",
        "exp/v1",
        "--message",
        "first try",
    ];
    let (out, _) = concord(&args, &hub.base, Some("hf_bintoken"), dir.path());
    let all = text(&out);
    eprintln!("{all}");
    assert!(out.status.success(), "{all}");
    assert!(all.contains(&format!("{}/bob/adapter", hub.base)), "{all}");
    assert!(all.contains("/bob/adapter/commit/"), "{all}");
    assert!(all.contains("adapter_model.safetensors"), "{all}");
    assert!(!all.contains("hf_bintoken"), "{all}");
    assert_files_arrived(&hub, &run, "exp/v1");
    {
        let st = hub.state();
        assert!(st.branches.contains("bob/adapter@exp/v1"));
        assert_eq!(st.repos.get("bob/adapter"), Some(&false));
        assert_eq!(st.commit_summaries, ["first try"]);
        assert!(st
            .api_auth
            .iter()
            .all(|a| a.as_deref() == Some("Bearer hf_bintoken")));
    }
    // A second run to the same branch: repo and branch both answer 409.
    let (out, _) = concord(&args, &hub.base, Some("hf_bintoken"), dir.path());
    assert!(out.status.success(), "{}", text(&out));
    assert!(hub.state().violations.is_empty());
}

#[test]
fn token_never_appears_in_output() {
    const SECRET: &str = "hf_SECRETtoken123";
    let dir = tempfile::tempdir().unwrap();
    let run = fake_run(dir.path());
    let run_s = run.to_str().unwrap();
    let args = ["export", run_s, "--repo", "carol/leak-test"];

    // Success.
    let hub = FakeHub::start(false);
    let (out, _) = concord(&args, &hub.base, Some(SECRET), dir.path());
    let all = text(&out);
    assert!(out.status.success(), "{all}");
    assert!(!all.contains(SECRET), "token leaked: {all}");
    assert!(!all.contains("SECRETtoken"), "token leaked: {all}");

    // The Hub rejects the token and echoes it back in the error body and header.
    let hub = FakeHub::start(true);
    let (out, _) = concord(&args, &hub.base, Some(SECRET), dir.path());
    let all = text(&out);
    assert!(!out.status.success(), "{all}");
    assert!(all.contains("403"), "{all}");
    assert!(all.contains("write access"), "{all}");
    assert!(!all.contains("SECRETtoken"), "token leaked: {all}");
    // The server did get it (so an unscrubbed echo would have leaked).
    assert!(hub
        .state()
        .api_auth
        .iter()
        .any(|a| a.as_deref() == Some(&format!("Bearer {SECRET}"))));
    // 4xx is not retried.
    assert_eq!(hub.state().requests.len(), 1);

    // Token from the token file, rejected: still not printed.
    let hub = FakeHub::start(true);
    let home = dir.path().join("home2");
    std::fs::create_dir_all(home.join("hf")).unwrap();
    std::fs::write(home.join("hf/token"), format!("{SECRET}\n")).unwrap();
    let (out, _) = concord(&args, &hub.base, None, &home);
    let all = text(&out);
    assert!(!out.status.success(), "{all}");
    assert!(!all.contains("SECRETtoken"), "token leaked: {all}");
    assert!(hub
        .state()
        .api_auth
        .iter()
        .any(|a| a.as_deref() == Some(&format!("Bearer {SECRET}"))));
}

#[test]
fn unreachable_hub_fails_fast() {
    let dir = tempfile::tempdir().unwrap();
    let run = fake_run(dir.path());
    let port = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let endpoint = format!("http://127.0.0.1:{port}");
    let (out, elapsed) = concord(
        &["export", run.to_str().unwrap(), "--repo", "dave/x"],
        &endpoint,
        Some("hf_unreachable"),
        dir.path(),
    );
    let all = text(&out);
    assert!(!out.status.success(), "{all}");
    assert!(elapsed < Duration::from_secs(15), "took {elapsed:?}");
    assert!(all.contains("cannot reach the Hugging Face Hub"), "{all}");
    assert!(all.contains(&endpoint), "{all}");
    assert!(all.contains("3 attempts"), "{all}");
    assert!(all.contains("HF_ENDPOINT"), "{all}");
    assert!(!all.contains("hf_unreachable"), "{all}");

    // Credentials inside the endpoint URL are never printed either (issue #31, item 19).
    let with_secret = format!("http://hf_secret123:pw@127.0.0.1:{port}");
    let (out, _) = concord(
        &["export", run.to_str().unwrap(), "--repo", "dave/x"],
        &with_secret,
        Some("hf_unreachable"),
        dir.path(),
    );
    let all = text(&out);
    assert!(!out.status.success(), "{all}");
    assert!(
        !all.contains("hf_secret123") && !all.contains(":pw@"),
        "{all}"
    );
    assert!(all.contains("http://***@127.0.0.1"), "{all}");
}

/// A server that accepts connections and never answers: the export gives up within
/// its time limits instead of hanging (before: past 200 s).
#[test]
fn silent_hub_times_out() {
    let dir = tempfile::tempdir().unwrap();
    let run = fake_run(dir.path());
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let held = std::thread::spawn(move || {
        // Accept (and hold open) every connection of the three attempts, answer none.
        let mut open = Vec::new();
        for _ in 0..3 {
            match listener.accept() {
                Ok((s, _)) => open.push(s),
                Err(_) => break,
            }
        }
        std::thread::sleep(Duration::from_secs(20));
        drop(open);
    });
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_concord"));
    cmd.args(["export", run.to_str().unwrap(), "--repo", "dave/x"])
        .env("HF_ENDPOINT", &endpoint)
        .env("HOME", dir.path())
        .env("HF_HOME", dir.path().join("hf"))
        .env("HF_TOKEN", "hf_silent")
        .env("CONCORD_HUB_TIMEOUT", "2");
    let t0 = Instant::now();
    let out = cmd.output().expect("run concord");
    let elapsed = t0.elapsed();
    let all = text(&out);
    assert!(!out.status.success(), "{all}");
    assert!(elapsed < Duration::from_secs(15), "took {elapsed:?}: {all}");
    assert!(all.contains("3 attempts"), "{all}");
    assert!(all.contains("CONCORD_HUB_TIMEOUT"), "{all}");
    assert!(!all.contains("hf_silent"), "{all}");
    // A line on stderr while it waits, before each retry.
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("attempt 2 of 3") && err.contains("attempt 3 of 3"),
        "{err}"
    );
    drop(held);
}

/// Issue #31, item 15: a malformed endpoint or token is not a network failure: it
/// fails at once, says what to fix, and is not retried.
#[test]
fn a_malformed_endpoint_or_token_fails_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let run = fake_run(dir.path());
    let args = ["export", run.to_str().unwrap(), "--repo", "dave/x"];
    for endpoint in ["huggingface.co", "http://exa mple.com", "http://[::1"] {
        let (out, elapsed) = concord(&args, endpoint, Some("hf_ok"), dir.path());
        let all = text(&out);
        assert!(!out.status.success(), "{endpoint}: {all}");
        assert!(all.contains("HF_ENDPOINT"), "{endpoint}: {all}");
        assert!(!all.contains("attempt"), "{endpoint}: retried: {all}");
        assert!(!all.contains("check your network"), "{endpoint}: {all}");
        assert!(
            elapsed < Duration::from_secs(5),
            "{endpoint}: took {elapsed:?}"
        );
    }
    let hub = FakeHub::start(false);
    let (out, _) = concord(&args, &hub.base, Some("hf_two words"), dir.path());
    let all = text(&out);
    assert!(!out.status.success(), "{all}");
    assert!(all.contains("token contains spaces"), "{all}");
    assert!(!all.contains("two words"), "{all}");
    assert!(hub.state().requests.is_empty(), "nothing sent");
}

#[test]
fn missing_token_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let run = fake_run(dir.path());
    let hub = FakeHub::start(false);
    let (out, _) = concord(
        &["export", run.to_str().unwrap(), "--repo", "erin/x"],
        &hub.base,
        None,
        dir.path(),
    );
    let all = text(&out);
    assert!(!out.status.success(), "{all}");
    assert!(all.contains("no Hugging Face token"), "{all}");
    assert!(all.contains("HF_TOKEN"), "{all}");
    assert!(
        hub.state().requests.is_empty(),
        "no request without a token"
    );
}

#[test]
fn dry_run_writes_the_card_without_network() {
    let dir = tempfile::tempdir().unwrap();
    let run = fake_run(dir.path());
    let (out, _) = concord(
        &[
            "export",
            run.to_str().unwrap(),
            "--repo",
            "frank/x",
            "--dry-run",
        ],
        "http://127.0.0.1:9",
        None,
        dir.path(),
    );
    let all = text(&out);
    assert!(out.status.success(), "{all}");
    for f in UPLOADED {
        assert!(all.contains(f), "{f} not listed: {all}");
    }
    assert!(
        !all.contains("samples.jsonl") && !all.contains("checkpoint-2"),
        "{all}"
    );
    let card = std::fs::read_to_string(run.join("README.md")).unwrap();
    assert!(card.contains("PeftModel.from_pretrained("), "{card}");
    assert!(card.contains("\"frank/x\""), "{card}");
}

#[test]
fn missing_adapter_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let run = fake_run(dir.path());
    std::fs::remove_file(run.join("adapter_model.safetensors")).unwrap();
    let hub = FakeHub::start(false);
    let (out, _) = concord(
        &["export", run.to_str().unwrap(), "--repo", "gina/x"],
        &hub.base,
        Some("hf_x"),
        dir.path(),
    );
    let all = text(&out);
    assert!(!out.status.success(), "{all}");
    assert!(all.contains("adapter_model.safetensors"), "{all}");
    assert!(hub.state().requests.is_empty());
}

/// A 401, 403 or 404 is the request's fault, not the network's: one attempt, the status
/// and what to do about it, and no "check your network" (issue #31, item 15).
#[test]
fn client_errors_are_not_retried_or_blamed_on_the_network() {
    let dir = tempfile::tempdir().unwrap();
    let run = fake_run(dir.path());
    let args = ["export", run.to_str().unwrap(), "--repo", "ivy/x"];
    for (code, hint) in [
        (401, "write access"),
        (403, "write access"),
        (404, "not found"),
    ] {
        let hub = FakeHub::with_state(State {
            refuse: code,
            ..State::default()
        });
        let (out, elapsed) = concord(&args, &hub.base, Some("hf_client"), dir.path());
        let all = text(&out);
        assert!(!out.status.success(), "{all}");
        assert!(all.contains(&format!("HTTP {code}")), "{code}: {all}");
        assert!(all.contains(hint), "{code}: {all}");
        assert!(!all.contains("network"), "{code}: {all}");
        assert_eq!(hub.state().requests.len(), 1, "{code}: retried");
        assert!(elapsed < Duration::from_secs(15), "took {elapsed:?}");
    }
}

#[test]
fn server_errors_are_retried_a_bounded_number_of_times() {
    let dir = tempfile::tempdir().unwrap();
    let run = fake_run(dir.path());
    let args = ["export", run.to_str().unwrap(), "--repo", "hank/x"];

    // Two 503s, then the Hub recovers: the third attempt succeeds.
    let hub = FakeHub::with_state(State {
        unavailable: 2,
        ..State::default()
    });
    let (out, _) = concord(&args, &hub.base, Some("hf_retry"), dir.path());
    assert!(out.status.success(), "{}", text(&out));
    assert_files_arrived(&hub, &run, "main");

    // Always 503: three attempts, then a non-zero exit naming the endpoint.
    let hub = FakeHub::with_state(State {
        unavailable: usize::MAX,
        ..State::default()
    });
    let (out, elapsed) = concord(&args, &hub.base, Some("hf_retry"), dir.path());
    let all = text(&out);
    assert!(!out.status.success(), "{all}");
    assert!(all.contains("HTTP 503") && all.contains(&hub.base), "{all}");
    assert_eq!(hub.state().requests.len(), 3);
    assert!(elapsed < Duration::from_secs(15), "took {elapsed:?}");
}

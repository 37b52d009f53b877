//! A reward program: one long-lived process, in any language, that scores answers.
//!
//! Protocol (JSON lines over the program's stdin and stdout; one request, then its
//! reply, then the next request):
//! - **request**: `{"batch": [ITEM, ...]}`, one item per answer, each
//!   `{"prompt": [{"role", "content"}, ...], "completion": "...", "row": {the row's
//!   fields}, "line": N, "held_out": bool}`;
//! - **reply**: `{"rewards": [R, ...]}`, one per item in order, each a number, `null`
//!   (0, as TRL counts a reward function's `None`), or `{"reward": x, "components":
//!   {"name": y, ...}}` with the names declared in `components`;
//!   or `{"error": "..."}` to stop the run with that message.
//!
//! The program is started on the first request, in `dir`, and stopped (its stdin
//! closed, then killed after a second) when the run ends. Anything else is a failure:
//! it could not start, exited, took longer than `timeout` seconds to reply, or replied
//! a line that is not such a reply. A failure is an error naming the program, what went
//! wrong, its exit status and the end of its stderr; the trainer writes a checkpoint
//! and `--resume` continues. After a failure the program is not restarted: every later
//! request fails with the same error.
use crate::envs::batch::BatchScorer;
use anyhow::{bail, Context, Result};
use serde_json::Value;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Seconds to wait for a reply unless `timeout` says otherwise.
pub const DEFAULT_TIMEOUT_S: f64 = 60.0;
/// Lines of the program's stderr an error quotes.
const STDERR_LINES: usize = 20;
/// Characters of a bad reply an error quotes.
const QUOTE_CHARS: usize = 200;

/// `[env.options.reward]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Spec {
    /// The program and its arguments.
    pub command: Vec<String>,
    /// Its working directory (`None`: where concord runs).
    pub dir: Option<PathBuf>,
    pub timeout: Duration,
    /// The reward component its reward is logged as.
    pub name: String,
    /// Its reward's weight in the scalar.
    pub weight: f64,
    /// Further components its replies carry (the log's columns).
    pub components: Vec<String>,
}

const KEYS: &[&str] = &["command", "dir", "timeout", "name", "weight", "components"];

impl Spec {
    pub fn from_toml(v: &toml::Value) -> Result<Self> {
        let t = v
            .as_table()
            .context("must be a table: [env.options.reward] with `command`")?;
        if let Some(k) = t.keys().find(|k| !KEYS.contains(&k.as_str())) {
            bail!("unknown key `{k}` (known: {})", KEYS.join(", "));
        }
        let strings = |k: &str| -> Result<Vec<String>> {
            match t.get(k) {
                None => Ok(Vec::new()),
                Some(v) => v
                    .as_array()
                    .and_then(|a| a.iter().map(|x| x.as_str().map(str::to_string)).collect())
                    .with_context(|| format!("`{k}` must be an array of strings, got {v}")),
            }
        };
        let command = strings("command")?;
        anyhow::ensure!(
            command.first().is_some_and(|c| !c.is_empty()),
            "`command` is required: the program and its arguments, e.g. [\"python3\", \"reward.py\"]"
        );
        let num = |k: &str| -> Result<Option<f64>> {
            t.get(k)
                .map(|v| {
                    v.as_float()
                        .or_else(|| v.as_integer().map(|i| i as f64))
                        .filter(|x| x.is_finite())
                        .with_context(|| format!("`{k}` must be a number, got {v}"))
                })
                .transpose()
        };
        let timeout = num("timeout")?.unwrap_or(DEFAULT_TIMEOUT_S);
        anyhow::ensure!(
            timeout > 0.0 && timeout <= 86_400.0,
            "`timeout` must be in (0, 86400] seconds, got {timeout}"
        );
        let text = |k: &str| -> Result<Option<String>> {
            t.get(k)
                .map(|v| {
                    v.as_str()
                        .map(str::to_string)
                        .with_context(|| format!("`{k}` must be a string, got {v}"))
                })
                .transpose()
        };
        let name = text("name")?.unwrap_or_else(|| "program".to_string());
        anyhow::ensure!(!name.is_empty(), "`name` must not be empty");
        let components = strings("components")?;
        if let Some(c) = components.iter().find(|c| **c == name || c.is_empty()) {
            bail!("`components` cannot name `{c}`: it is the program's own reward or empty");
        }
        Ok(Spec {
            command,
            dir: text("dir")?.map(PathBuf::from),
            timeout: Duration::from_secs_f64(timeout),
            name,
            weight: num("weight")?.unwrap_or(1.0),
            components,
        })
    }

    /// The command as a shell would show it.
    fn shown(&self) -> String {
        let cmd = self.command.join(" ");
        match &self.dir {
            Some(d) => format!("`{cmd}` (in {})", d.display()),
            None => format!("`{cmd}`"),
        }
    }
}

/// One answer's reply.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Reply {
    pub reward: f64,
    pub components: BTreeMap<String, f64>,
}

/// The reward program failed; the trainer stops with a checkpoint.
#[derive(Debug, Clone)]
pub struct ProgramFailed(pub String);

impl std::fmt::Display for ProgramFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ProgramFailed {}

/// The program, started on first use, and the replies of the last batch.
pub struct Program {
    spec: Spec,
    process: Mutex<State>,
    replies: Mutex<HashMap<u64, Reply>>,
}

impl std::fmt::Debug for Program {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Program").field("spec", &self.spec).finish()
    }
}

enum State {
    Idle,
    Running(Running),
    Failed(String),
}

impl Program {
    pub fn new(spec: Spec) -> Self {
        Program {
            spec,
            process: Mutex::new(State::Idle),
            replies: Mutex::new(HashMap::new()),
        }
    }

    pub fn spec(&self) -> &Spec {
        &self.spec
    }

    /// The reply for `key`: the last batch's, else asked for alone.
    pub fn score(&self, key: u64, item: Value) -> Result<Reply> {
        if let Some(r) = lock(&self.replies).get(&key) {
            return Ok(r.clone());
        }
        let mut replies = self.exchange(&[item])?;
        Ok(replies.pop().unwrap_or_default())
    }

    /// Send one batch and read its reply.
    pub fn exchange(&self, items: &[Value]) -> Result<Vec<Reply>> {
        let mut state = lock(&self.process);
        if let State::Failed(e) = &*state {
            return Err(ProgramFailed(e.clone()).into());
        }
        if matches!(*state, State::Idle) {
            match Running::start(&self.spec) {
                Ok(r) => *state = State::Running(r),
                Err(e) => {
                    let msg = format!("reward program {}: {e:#}", self.spec.shown());
                    *state = State::Failed(msg.clone());
                    return Err(ProgramFailed(msg).into());
                }
            }
        }
        let outcome = match &mut *state {
            State::Running(run) => run
                .ask(items, self.spec.timeout)
                .and_then(|line| parse_reply(&line, items.len(), &self.spec)),
            _ => Err("it is not running".to_string()),
        };
        let what = match outcome {
            Ok(r) => return Ok(r),
            Err(what) => what,
        };
        let how = match std::mem::replace(&mut *state, State::Idle) {
            State::Running(run) => run.stop_for_report(),
            _ => String::new(),
        };
        let msg = format!("reward program {}: {what}{how}", self.spec.shown());
        *state = State::Failed(msg.clone());
        Err(ProgramFailed(msg).into())
    }
}

impl BatchScorer for Program {
    fn prefetch(&self, items: Vec<(u64, Value)>) -> Result<()> {
        let (keys, items): (Vec<u64>, Vec<Value>) = items.into_iter().unzip();
        let replies = self.exchange(&items)?;
        *lock(&self.replies) = keys.into_iter().zip(replies).collect();
        Ok(())
    }
}

/// A poisoned lock only means another thread panicked mid-exchange: the state it left
/// is still a state (a failed exchange marks itself).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// What the stdout reader (or the stdin writer) saw.
enum Out {
    Line(String),
    /// End of output, with what came after the last newline.
    End(String),
    /// Reading or writing failed: what happened.
    Error(String),
}

struct Running {
    child: Child,
    /// Requests go to a thread that writes them, so that a program that stops reading
    /// (a request larger than the pipe holds) cannot block past `timeout`.
    requests: Option<mpsc::Sender<Vec<u8>>>,
    lines: Receiver<Out>,
    stderr: Arc<Mutex<VecDeque<String>>>,
    stderr_reader: std::thread::JoinHandle<()>,
}

impl Running {
    fn start(spec: &Spec) -> Result<Self> {
        let mut cmd = Command::new(&spec.command[0]);
        cmd.args(&spec.command[1..])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(d) = &spec.dir {
            cmd.current_dir(d);
        }
        let mut child = cmd.spawn().context("could not start it")?;
        let stdin = child.stdin.take().context("no stdin pipe")?;
        let stdout = child.stdout.take().context("no stdout pipe")?;
        let err = child.stderr.take().context("no stderr pipe")?;
        let (tx, lines) = mpsc::channel();
        let (requests, to_write) = mpsc::channel::<Vec<u8>>();
        let failed = tx.clone();
        std::thread::spawn(move || {
            let mut stdin = stdin;
            for line in to_write {
                if let Err(e) = stdin.write_all(&line).and_then(|()| stdin.flush()) {
                    let _ = failed.send(Out::Error(format!(
                        "could not send it a request ({e}): it has stopped reading"
                    )));
                    return;
                }
            }
        });
        std::thread::spawn(move || read_lines(stdout, tx));
        let stderr = Arc::new(Mutex::new(VecDeque::new()));
        let tail = stderr.clone();
        let stderr_reader = std::thread::spawn(move || keep_tail(err, &tail));
        Ok(Running {
            child,
            requests: Some(requests),
            lines,
            stderr,
            stderr_reader,
        })
    }

    /// Write one request and wait for one line.
    fn ask(&mut self, items: &[Value], timeout: Duration) -> Result<String, String> {
        // a line before the request would be taken for its reply, one step late
        match self.lines.try_recv() {
            Ok(Out::Line(l)) => {
                return Err(format!(
                    "it wrote a line nobody asked for (each request gets one reply line): `{}`",
                    quote(&l)
                ))
            }
            Ok(Out::End(_)) => return Err("it exited between requests".into()),
            Ok(Out::Error(e)) => return Err(e),
            Err(_) => {}
        }
        let mut line = serde_json::to_vec(&serde_json::json!({ "batch": items }))
            .map_err(|e| format!("could not write the request: {e}"))?;
        line.push(b'\n');
        self.requests
            .as_ref()
            .and_then(|r| r.send(line).ok())
            .ok_or("its input is closed")?;
        match self.lines.recv_timeout(timeout) {
            Ok(Out::Line(l)) => Ok(l),
            Ok(Out::End(rest)) if rest.is_empty() => Err("it exited before replying".into()),
            Ok(Out::End(rest)) => Err(format!(
                "it exited in the middle of a reply line: `{}`",
                quote(&rest)
            )),
            Ok(Out::Error(e)) => Err(e),
            Err(RecvTimeoutError::Timeout) => Err(format!(
                "no reply within {} s (`timeout`)",
                timeout.as_secs_f64()
            )),
            Err(RecvTimeoutError::Disconnected) => Err("its output closed".into()),
        }
    }

    /// Stop the process and say how it ended: its exit status and stderr tail.
    fn stop_for_report(mut self) -> String {
        drop(self.requests.take());
        let status = wait_for(&mut self.child, Duration::from_millis(500)).or_else(|| {
            let _ = self.child.kill();
            self.child.wait().ok()
        });
        // the reader ends at end of stderr, which may come a moment after the exit
        let t = Instant::now();
        while !self.stderr_reader.is_finished() && t.elapsed() < Duration::from_secs(1) {
            std::thread::sleep(Duration::from_millis(10));
        }
        let mut out = String::new();
        if let Some(s) = status {
            out.push_str(&format!("; exit status: {s}"));
        }
        let tail = lock(&self.stderr);
        if tail.is_empty() {
            out.push_str("; its stderr was empty");
        } else {
            out.push_str("; its stderr ended with:");
            for l in tail.iter() {
                out.push_str("\n  ");
                out.push_str(l);
            }
        }
        out
    }
}

impl Drop for Running {
    /// End of run: close its input, give it a second to exit, then kill it.
    fn drop(&mut self) {
        drop(self.requests.take());
        if wait_for(&mut self.child, Duration::from_secs(1)).is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn wait_for(child: &mut Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let t = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(s)) => return Some(s),
            Ok(None) if t.elapsed() < limit => std::thread::sleep(Duration::from_millis(10)),
            _ => return None,
        }
    }
}

/// Split stdout into lines for [`Running::ask`].
fn read_lines(mut r: impl Read, tx: mpsc::Sender<Out>) {
    let mut buf: Vec<u8> = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        match r.read(&mut chunk) {
            Ok(0) => {
                let _ = tx.send(Out::End(String::from_utf8_lossy(&buf).into_owned()));
                return;
            }
            Ok(n) => {
                buf.extend_from_slice(&chunk[..n]);
                while let Some(at) = buf.iter().position(|&b| b == b'\n') {
                    let line: Vec<u8> = buf.drain(..=at).collect();
                    let text = String::from_utf8_lossy(&line[..at]).into_owned();
                    if tx.send(Out::Line(text)).is_err() {
                        return;
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => {
                let _ = tx.send(Out::Error(format!("reading its output failed: {e}")));
                return;
            }
        }
    }
}

/// Keep the last lines of stderr.
fn keep_tail(r: impl Read, tail: &Mutex<VecDeque<String>>) {
    use std::io::BufRead;
    let mut r = std::io::BufReader::new(r);
    let mut line = Vec::new();
    while let Ok(n) = r.read_until(b'\n', &mut line) {
        if n == 0 {
            return;
        }
        let text = String::from_utf8_lossy(&line).trim_end().to_string();
        let mut t = lock(tail);
        if t.len() == STDERR_LINES {
            t.pop_front();
        }
        t.push_back(quote(&text));
        line.clear();
    }
}

fn quote(s: &str) -> String {
    match s.char_indices().nth(QUOTE_CHARS) {
        Some((at, _)) => format!("{}...", &s[..at]),
        None => s.to_string(),
    }
}

/// One reply line: `n` rewards, or the program's own error.
fn parse_reply(line: &str, n: usize, spec: &Spec) -> Result<Vec<Reply>, String> {
    let bad = |why: &str| format!("{why}: `{}`", quote(line));
    let v: Value =
        serde_json::from_str(line).map_err(|e| bad(&format!("its reply is not JSON ({e})")))?;
    if let Some(e) = v.get("error") {
        let msg = e.as_str().map_or_else(|| e.to_string(), str::to_string);
        return Err(format!("it reported an error: {}", quote(&msg)));
    }
    let rewards = v
        .get("rewards")
        .and_then(Value::as_array)
        .ok_or_else(|| bad("its reply has no `rewards` array"))?;
    if rewards.len() != n {
        return Err(bad(&format!(
            "it replied {} rewards for {n} answers",
            rewards.len()
        )));
    }
    rewards
        .iter()
        .enumerate()
        .map(|(i, r)| one_reward(r, spec).map_err(|why| bad(&format!("reward {}: {why}", i + 1))))
        .collect()
}

fn one_reward(r: &Value, spec: &Spec) -> Result<Reply, String> {
    let number = |v: &Value| -> Result<f64, String> {
        match v {
            Value::Null => Ok(0.0),
            Value::Number(x) => x
                .as_f64()
                .filter(|x| x.is_finite())
                .ok_or_else(|| format!("{x} is not a finite number")),
            other => Err(format!("expected a number, got {other}")),
        }
    };
    let Value::Object(o) = r else {
        return Ok(Reply {
            reward: number(r)?,
            components: BTreeMap::new(),
        });
    };
    if let Some(k) = o.keys().find(|k| *k != "reward" && *k != "components") {
        return Err(format!("unknown key `{k}` (known: reward, components)"));
    }
    let reward = number(o.get("reward").ok_or("no `reward`")?)?;
    let mut components = BTreeMap::new();
    if let Some(c) = o.get("components") {
        let c = c.as_object().ok_or("`components` is not an object")?;
        for (k, v) in c {
            if !spec.components.contains(k) {
                return Err(format!(
                    "component `{k}` is not declared in `components` ({})",
                    spec.components.join(", ")
                ));
            }
            components.insert(k.clone(), number(v)?);
        }
    }
    Ok(Reply { reward, components })
}

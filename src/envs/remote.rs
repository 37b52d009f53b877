//! An OpenEnv server as an [`Environment`] (`[env] url = "ws://host:port"`): another
//! `concord serve`, a seed project's Python server, or any OpenEnv Space run locally.
//!
//! Each [`RemoteFactory::try_reset`] opens one WebSocket session (openenv-core's
//! `/ws` protocol) and sends `reset` with the seed; G episodes of a prompt are G
//! sessions reset with the same seed. The client is blocking (tungstenite) because the
//! [`Environment`] methods are: a step waits for its reply.
//!
//! - **Observation -> chat**: a Concord server's observation carries `messages` (used
//!   as they are); any other observation becomes one user message: the string field
//!   named by `[env] observation_key`, or else the observation's JSON. The chat
//!   template renders it like any built-in environment's.
//! - **Action**: the model's text is sent as `{action_key: text}` (`[env] action_key`,
//!   default `message`: Concord's and openenv-core's echo environment's field).
//! - **Rewards**: each step's reward comes back with its observation (`null` counts 0);
//!   the episode's scalar is their sum, logged as the `remote_reward` component.
//! - **One seat**: an OpenEnv session is single-agent; the remote environment plays
//!   any other seats itself.
//! - **Failures are loud**: a refused frame, a lost connection or a timeout is an
//!   `Err` from `step` ([`ConnectionLost`] for the transport), never a zero reward;
//!   the trainer then writes a checkpoint and stops with a resume hint.
//! - **Fork by replay**: the protocol cannot copy a session, so a copy of an episode
//!   ([`Environment::clone_box`]) opens its own session when it first steps, resets
//!   with the seed and replays the recorded actions, and checks that the server gives
//!   back the same rewards and observation. Decision mode forks a decision this way
//!   for each of its G answers; a server whose episodes are not a function of the
//!   seed and the actions is refused with an error that says so.
//! - **No scripted policy**: nothing but the model can act on a server, so decision
//!   mode has the model reach each decision and finish each answer's episode
//!   ([`super::sample_decisions_with`], `[env] continue_with = "model"`).
use super::{EnvFactory, Environment, Message, Reward, StepOutcome};
use anyhow::{anyhow, bail, Context, Result};
use serde_json::{json, Value};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tungstenite::handshake::HandshakeError;
use tungstenite::stream::MaybeTlsStream;
use tungstenite::{Message as Frame, WebSocket};

/// Why a server that does not replay is refused in decision mode.
const NOT_REPLAYABLE: &str = "decision mode copies a remote episode by replaying its \
    actions in a new session, so the server's episodes must be a function of the seed \
    and the actions (train this server with mode = \"episode\")";

/// With `[env] max_steps = 0` (the server says when an episode ends), the steps after
/// which an episode that never ends is an error rather than a run that never finishes.
pub const MAX_STEPS_UNTIL_DONE: usize = 1000;

/// The registry-like name of every remote environment.
pub const NAME: &str = "remote";
/// The reward component holding the sum of the remote step rewards.
pub const REMOTE_REWARD: &str = "remote_reward";

/// How long the connection and each reply may take by default: a silent server fails
/// the step within a minute.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// A wait longer than this (or half the timeout) gets a line on stderr, at most one
/// per tick per process.
const WAIT_TICK: Duration = Duration::from_secs(10);

/// One bounded wait for the server. Reads time out every [`WAIT_TICK`], so a long
/// wait is reported while it lasts and ends at the spec's timeout.
struct Wait {
    start: Instant,
    limit: Duration,
}

impl Wait {
    fn new(limit: Duration) -> Self {
        Self {
            start: Instant::now(),
            limit,
        }
    }

    /// After a read timed out: `Ok` to read again, `Err(why)` once the limit passed.
    fn tick(&self, url: &str, what: &str) -> std::result::Result<(), String> {
        let waited = self.start.elapsed();
        let limit = self.limit.as_secs_f64();
        if waited >= self.limit {
            return Err(format!(
                "no answer to `{what}` within {limit:.0} s ([env] timeout)"
            ));
        }
        static LAST_LINE: Mutex<Option<Instant>> = Mutex::new(None);
        let mut last = LAST_LINE.lock().unwrap_or_else(|p| p.into_inner());
        if last.is_none_or(|t| t.elapsed() >= WAIT_TICK) {
            *last = Some(Instant::now());
            crate::note!(
                "waiting for the OpenEnv server at {} (`{what}`: {:.0} s of {limit:.0} s)",
                crate::sys::redact_url_credentials(url),
                waited.as_secs_f64()
            );
        }
        Ok(())
    }
}

fn timed_out(e: &tungstenite::Error) -> bool {
    use std::io::ErrorKind::{TimedOut, WouldBlock};
    matches!(e, tungstenite::Error::Io(io) if matches!(io.kind(), WouldBlock | TimedOut))
}

/// Where and how to talk to an OpenEnv server (`[env] url`, `action_key`, ...).
#[derive(Debug, Clone, PartialEq)]
pub struct RemoteSpec {
    /// `ws://host:port` or `http://host:port` (the WebSocket is at `/ws`).
    pub url: String,
    /// The action field the model's text goes in.
    pub action_key: String,
    /// The observation field that is the model's text (None: `messages`, else JSON).
    pub observation_key: Option<String>,
    /// End the episode client-side after this many steps (0: when the server says).
    pub max_steps: usize,
    /// Connecting, and waiting for each reply (`[env] timeout`).
    pub timeout: Duration,
}

impl RemoteSpec {
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            action_key: "message".into(),
            observation_key: None,
            max_steps: 0,
            timeout: DEFAULT_TIMEOUT,
        }
    }

    /// The `/ws` URL of a base URL (`http` becomes `ws`, as openenv-core's
    /// `convert_to_ws_url` does).
    pub fn ws_url(&self) -> Result<String> {
        let u = self.url.trim().trim_end_matches('/');
        let rest = if let Some(r) = u.strip_prefix("ws://") {
            r
        } else if let Some(r) = u.strip_prefix("http://") {
            r
        } else if u.starts_with("wss://") || u.starts_with("https://") {
            bail!("`{u}`: TLS (wss://, https://) is not supported; reach the server over plain ws:// (e.g. an SSH tunnel)")
        } else {
            bail!("`{u}` is not an OpenEnv server URL: use ws://host:port or http://host:port")
        };
        let rest = rest.strip_suffix("/ws").unwrap_or(rest);
        if rest.contains(['?', '#']) {
            bail!(
                "`{u}`: a query or fragment has no place in an OpenEnv server URL (ws://host:port)"
            );
        }
        let authority = rest.split('/').next().unwrap_or_default();
        let hostport = authority.rsplit('@').next().unwrap_or_default();
        let port = match hostport.rsplit_once(':') {
            Some((host, port)) if !host.is_empty() && !port.contains(']') => port,
            _ => bail!("`{u}` names no port: give ws://host:port"),
        };
        if !port.parse::<u16>().is_ok_and(|p| p > 0) {
            bail!("`{u}`: port {port} is not a TCP port (1-65535)");
        }
        Ok(format!("ws://{rest}/ws"))
    }
}

/// The transport failed mid-episode (connection lost, timeout): the trainer stops
/// with a checkpoint instead of scoring the episode.
#[derive(Debug, Clone)]
pub struct ConnectionLost {
    pub url: String,
    pub detail: String,
}

impl std::fmt::Display for ConnectionLost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never connected is not "lost": say which.
        let what = match self.detail.starts_with(CONNECTING) {
            true => "could not reach",
            false => "lost the connection to",
        };
        write!(
            f,
            "{what} the OpenEnv server at {}: {}",
            self.url, self.detail
        )
    }
}

/// How [`ConnectionLost::detail`] starts when the connection was never made.
const CONNECTING: &str = "connecting: ";

impl std::error::Error for ConnectionLost {}

/// Opens a session per episode.
pub struct RemoteFactory {
    spec: Arc<RemoteSpec>,
}

impl RemoteFactory {
    /// Checks the URL's form; connecting waits for the first reset.
    pub fn new(spec: RemoteSpec) -> Result<Self> {
        spec.ws_url()?;
        Ok(Self {
            spec: Arc::new(spec),
        })
    }
}

impl EnvFactory for RemoteFactory {
    fn name(&self) -> &'static str {
        NAME
    }
    /// Infallible by contract: a failed connection gives an episode whose first `step`
    /// reports the failure. Callers that can fail use [`EnvFactory::try_reset`].
    fn reset(&self, seed: u64) -> Box<dyn Environment> {
        match RemoteEnv::open(self.spec.clone(), seed) {
            Ok(e) => Box::new(e),
            Err(e) => Box::new(RemoteEnv::failed(self.spec.clone(), seed, format!("{e:#}"))),
        }
    }
    fn try_reset(&self, seed: u64) -> Result<Box<dyn Environment>> {
        Ok(Box::new(RemoteEnv::open(self.spec.clone(), seed)?))
    }
    fn scripted(&self) -> bool {
        false
    }
    /// Known without playing: asking by playing an episode would open a session, and
    /// wait a whole `[env] timeout` on a silent server before the step's own session
    /// waits again.
    fn component_names(&self) -> Option<Vec<String>> {
        Some(vec![REMOTE_REWARD.to_string()])
    }
}

type Socket = WebSocket<MaybeTlsStream<TcpStream>>;

/// One remote episode: a WebSocket session.
pub struct RemoteEnv {
    spec: Arc<RemoteSpec>,
    url: String,
    socket: Option<Socket>,
    seed: u64,
    observation: Vec<Message>,
    done: bool,
    steps: Vec<Vec<String>>,
    rewards: Vec<f64>,
    /// Why this episode cannot step (the connection failed).
    failed: Option<String>,
    /// A copy that has not yet replayed its steps in a session of its own.
    fork: bool,
}

impl RemoteEnv {
    /// Connect and reset with `seed`.
    pub fn open(spec: Arc<RemoteSpec>, seed: u64) -> Result<Self> {
        let url = spec.ws_url()?;
        let socket = connect(&url, spec.timeout).map_err(|e| ConnectionLost {
            url: url.clone(),
            detail: format!("{CONNECTING}{e:#} (is the server running?)"),
        })?;
        let mut env = Self {
            spec,
            url,
            socket: Some(socket),
            seed,
            observation: Vec::new(),
            done: false,
            steps: Vec::new(),
            rewards: Vec::new(),
            failed: None,
            fork: false,
        };
        let data = env.request(json!({"type": "reset", "data": {"seed": seed}}), "reset")?;
        env.take_observation(&data)?;
        Ok(env)
    }

    fn failed(spec: Arc<RemoteSpec>, seed: u64, why: String) -> Self {
        Self {
            url: spec.url.clone(),
            spec,
            socket: None,
            seed,
            observation: vec![Message::user("")],
            done: false,
            steps: Vec::new(),
            rewards: Vec::new(),
            failed: Some(why),
            fork: false,
        }
    }

    /// A copy's first step: a session of its own, reset with the seed, the recorded
    /// actions replayed, and the same rewards and observation checked.
    fn replay(&mut self) -> Result<()> {
        let mut fresh = Self::open(self.spec.clone(), self.seed)?;
        for (i, actions) in self.steps.iter().enumerate() {
            let got = fresh.step(actions)?.rewards.first().copied().unwrap_or(0.0);
            if got.to_bits() != self.rewards[i].to_bits() {
                bail!(
                    "{}: replaying seed {} gave reward {got} at step {i}, where the \
                     original episode got {}; {NOT_REPLAYABLE}",
                    self.url,
                    self.seed,
                    self.rewards[i]
                );
            }
        }
        if fresh.observation != self.observation || fresh.done != self.done {
            bail!(
                "{}: replaying seed {} and its {} actions gave a different observation; \
                 {NOT_REPLAYABLE}",
                self.url,
                self.seed,
                self.steps.len()
            );
        }
        self.socket = fresh.socket.take();
        self.fork = false;
        Ok(())
    }

    /// Send one frame and return the reply's `data`; error frames and transport
    /// failures are errors that say which.
    fn request(&mut self, frame: Value, what: &str) -> Result<Value> {
        let lost = |detail: String| ConnectionLost {
            url: self.url.clone(),
            detail,
        };
        let socket = self
            .socket
            .as_mut()
            .ok_or_else(|| lost("the session is closed".into()))?;
        socket
            .send(Frame::text(frame.to_string()))
            .map_err(|e| lost(format!("sending `{what}`: {e}")))?;
        let wait = Wait::new(self.spec.timeout);
        let reply = loop {
            match socket.read() {
                Ok(Frame::Text(t)) => break t,
                Ok(Frame::Binary(b)) => break String::from_utf8_lossy(&b).into_owned().into(),
                Ok(Frame::Close(c)) => {
                    let why = c
                        .map(|c| format!(" ({} {})", c.code, c.reason))
                        .unwrap_or_default();
                    return Err(lost(format!(
                        "the server closed the session during `{what}`{why}"
                    ))
                    .into());
                }
                Ok(_) => continue,
                Err(e) if timed_out(&e) => {
                    if let Err(why) = wait.tick(&self.url, what) {
                        return Err(lost(why).into());
                    }
                }
                Err(e) => {
                    return Err(lost(format!("waiting for the reply to `{what}`: {e}")).into())
                }
            }
        };
        let v: Value = serde_json::from_str(reply.as_str())
            .with_context(|| format!("{}: the reply to `{what}` is not JSON", self.url))?;
        match v.get("type").and_then(Value::as_str) {
            Some("error") => {
                let code = v["data"]["code"].as_str().unwrap_or("UNKNOWN");
                let msg = v["data"]["message"].as_str().unwrap_or("");
                let hint = match code {
                    "CAPACITY_REACHED" => {
                        "; a GRPO step opens one session per episode (G x prompts per step) \
                         at once: raise the server's limit (concord serve --max-sessions, \
                         openenv-core max_concurrent_envs)"
                    }
                    "VALIDATION_ERROR" if what == "step" => {
                        "; check [env] action_key against the server's GET /schema"
                    }
                    _ => "",
                };
                // A server's text is shown as text: no terminal escapes, no control bytes.
                let msg: String = msg
                    .chars()
                    .map(|c| if c.is_control() { '?' } else { c })
                    .collect();
                bail!("{}: `{what}` refused: {code}: {msg}{hint}", self.url)
            }
            Some(_) => Ok(v.get("data").cloned().unwrap_or(Value::Null)),
            None => bail!("{}: the reply to `{what}` has no `type`: {}", self.url, v),
        }
    }

    /// Read `{observation, reward, done}`; returns the reward.
    fn take_observation(&mut self, data: &Value) -> Result<f64> {
        let obs = data
            .get("observation")
            .ok_or_else(|| anyhow!("{}: a reply without `observation`: {data}", self.url))?;
        self.observation = to_messages(obs, self.spec.observation_key.as_deref())?;
        self.done = data.get("done").and_then(Value::as_bool).unwrap_or(false);
        // OpenEnv's reward is a number or null (none this step); anything else is the
        // server's bug, not a reward of 0.
        match data.get("reward") {
            None | Some(Value::Null) => Ok(0.0),
            Some(v) => match v.as_f64() {
                Some(r) if r.is_finite() && (self.sum() + r).is_finite() => Ok(r),
                Some(r) => bail!(
                    "{}: reward {r} (the episode's sum so far {}) is not a finite number",
                    self.url,
                    self.sum()
                ),
                None => bail!("{}: the reward {v} is not a number", self.url),
            },
        }
    }

    fn sum(&self) -> f64 {
        self.rewards.iter().sum()
    }
}

/// Connect with a timeout on the TCP connect, the handshake and every write; reads
/// wake every [`WAIT_TICK`] so that [`Wait`] can report and bound them.
fn connect(url: &str, timeout: Duration) -> Result<Socket> {
    let authority = url
        .trim_start_matches("ws://")
        .split('/')
        .next()
        .unwrap_or_default();
    // `user:password@` is for the handshake, not the address (and never printed).
    let hostport = authority.rsplit('@').next().unwrap_or_default();
    let addr = hostport
        .to_socket_addrs()
        .with_context(|| format!("resolving {hostport}"))?
        .next()
        .ok_or_else(|| anyhow!("{hostport} resolves to no address"))?;
    let tcp = TcpStream::connect_timeout(&addr, timeout)?;
    // Half the limit at most, so even a short limit reports once before it fails.
    let tick = (timeout / 2).clamp(Duration::from_millis(10), WAIT_TICK);
    tcp.set_read_timeout(Some(tick))?;
    tcp.set_write_timeout(Some(timeout))?;
    tcp.set_nodelay(true)?;
    let wait = Wait::new(timeout);
    let mut shake = tungstenite::client::client(url, MaybeTlsStream::Plain(tcp));
    loop {
        match shake {
            Ok((socket, _)) => return Ok(socket),
            Err(HandshakeError::Interrupted(mid)) => {
                wait.tick(url, "the WebSocket handshake")
                    .map_err(|why| anyhow!(why))?;
                shake = mid.handshake();
            }
            Err(HandshakeError::Failure(e)) => bail!("WebSocket handshake: {e}"),
        }
    }
}

/// An OpenEnv observation as chat messages (see the module docs).
pub fn to_messages(obs: &Value, key: Option<&str>) -> Result<Vec<Message>> {
    if let Some(k) = key {
        return match obs.get(k) {
            Some(Value::String(s)) => Ok(vec![Message::user(s.clone())]),
            Some(v @ Value::Array(_)) => serde_json::from_value(v.clone())
                .with_context(|| format!("observation `{k}` is not a list of chat messages")),
            Some(v) => Ok(vec![Message::user(v.to_string())]),
            None => bail!(
                "the observation has no `{k}` ([env] observation_key); its fields: {}",
                obs.as_object()
                    .map(|o| o.keys().cloned().collect::<Vec<_>>().join(", "))
                    .unwrap_or_default()
            ),
        };
    }
    if let Some(m) = obs.get("messages") {
        if let Ok(msgs) = serde_json::from_value::<Vec<Message>>(m.clone()) {
            if !msgs.is_empty() {
                return Ok(msgs);
            }
        }
    }
    Ok(vec![Message::user(obs.to_string())])
}

impl Environment for RemoteEnv {
    fn name(&self) -> &'static str {
        NAME
    }
    fn num_seats(&self) -> usize {
        1
    }
    fn policy_seats(&self) -> Vec<usize> {
        vec![0]
    }
    fn to_act(&self) -> Vec<usize> {
        if self.done {
            vec![]
        } else {
            vec![0]
        }
    }
    fn observation(&self, _seat: usize) -> Vec<Message> {
        self.observation.clone()
    }
    fn step(&mut self, actions: &[String]) -> Result<StepOutcome> {
        if let Some(why) = &self.failed {
            bail!("{why}");
        }
        if self.done {
            return Ok(StepOutcome::default());
        }
        if self.fork {
            self.replay()?;
        }
        anyhow::ensure!(
            actions.len() == 1,
            "a remote environment takes one text per step, got {}",
            actions.len()
        );
        if self.spec.max_steps == 0 && self.steps.len() >= MAX_STEPS_UNTIL_DONE {
            bail!(
                "{}: the episode of seed {} has not ended after {MAX_STEPS_UNTIL_DONE} steps; \
                 set [env] max_steps to end episodes client-side",
                self.url,
                self.seed
            );
        }
        let data = self.request(
            json!({"type": "step", "data": {self.spec.action_key.clone(): actions[0]}}),
            "step",
        )?;
        let reward = self.take_observation(&data)?;
        self.steps.push(actions.to_vec());
        self.rewards.push(reward);
        if self.spec.max_steps > 0 && self.steps.len() >= self.spec.max_steps {
            self.done = true;
        }
        // A Concord server says whether the text parsed and why not.
        let obs = &data["observation"];
        let valid = obs.get("valid").and_then(Value::as_bool).unwrap_or(true);
        let feedback = obs
            .get("feedback")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let mut out = StepOutcome::default();
        out.push(0, reward, valid, feedback);
        Ok(out)
    }
    fn done(&self) -> bool {
        self.done
    }
    fn reward(&self, _seat: usize) -> Reward {
        let sum = self.sum();
        Reward {
            components: [(REMOTE_REWARD.to_string(), sum)].into_iter().collect(),
            scalar: sum,
        }
    }
    fn transcript(&self) -> Value {
        // Transcripts are written to files and shared: no credentials in them.
        let url = crate::sys::redact_url_credentials(&self.url);
        json!({"seed": self.seed, "steps": self.steps, "url": url, "rewards": self.rewards})
    }
    /// A copy that replays this episode's actions in a session of its own when it
    /// first steps (a finished copy never connects).
    fn clone_box(&self) -> Box<dyn Environment> {
        Box::new(Self {
            spec: self.spec.clone(),
            url: self.url.clone(),
            socket: None,
            seed: self.seed,
            observation: self.observation.clone(),
            done: self.done,
            steps: self.steps.clone(),
            rewards: self.rewards.clone(),
            failed: self.failed.clone(),
            fork: self.failed.is_none(),
        })
    }
}

impl Drop for RemoteEnv {
    /// Say `close` so the server frees the session at once, then let the server end
    /// the connection (openenv-core's server closes it itself and logs an error when
    /// the client has already gone). Best effort, at most a second.
    fn drop(&mut self) {
        if let Some(mut s) = self.socket.take() {
            if let MaybeTlsStream::Plain(tcp) = s.get_mut() {
                let _ = tcp.set_read_timeout(Some(Duration::from_secs(1)));
            }
            if s.send(Frame::text(r#"{"type":"close"}"#)).is_ok() {
                while let Ok(f) = s.read() {
                    if f.is_close() {
                        break;
                    }
                }
            }
            let _ = s.close(None);
            let _ = s.flush();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_become_ws_endpoints() {
        for (u, w) in [
            ("ws://h:1", "ws://h:1/ws"),
            ("http://h:1/", "ws://h:1/ws"),
            ("ws://h:1/ws", "ws://h:1/ws"),
        ] {
            assert_eq!(RemoteSpec::new(u).ws_url().unwrap(), w);
        }
        assert!(RemoteSpec::new("wss://h").ws_url().is_err());
        assert!(RemoteSpec::new("h:1").ws_url().is_err());
    }

    #[test]
    fn observations_become_chat() {
        let concord = json!({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}], "prompt": "u"});
        assert_eq!(to_messages(&concord, None).unwrap().len(), 2);
        let echo = json!({"echoed_message": "hi", "message_length": 2});
        assert_eq!(
            to_messages(&echo, None).unwrap(),
            [Message::user(
                r#"{"echoed_message":"hi","message_length":2}"#
            )]
        );
        assert_eq!(
            to_messages(&echo, Some("echoed_message")).unwrap(),
            [Message::user("hi")]
        );
        assert!(to_messages(&echo, Some("nope")).is_err());
    }

    #[test]
    fn a_dead_server_is_an_error_not_a_zero() {
        // a port nothing listens on: bind one, then free it
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let f = RemoteFactory::new(RemoteSpec::new(format!("ws://127.0.0.1:{port}"))).unwrap();
        let err = f.try_reset(1).err().unwrap();
        assert!(err.downcast_ref::<ConnectionLost>().is_some(), "{err:#}");
        // Never connected: "could not reach", not "lost" (issue 54, item 13).
        let text = format!("{err:#}");
        assert!(
            text.contains("could not reach") && !text.contains("lost"),
            "{text}"
        );
        let mut env = f.reset(1);
        assert!(env.step(&["x".into()]).is_err());
    }
}

//! `concord serve` (the OpenEnv server) and `[env] url` (the OpenEnv client), against
//! a server started on a free loopback port. Run with `cargo test --test tests serve::`.
use concord::envs::remote::{ConnectionLost, RemoteFactory, RemoteSpec};
use concord::envs::{self, EnvFactory, Options};
use concord::serve::{spawn, Handle, ServeOptions};
use proptest::prelude::*;
use serde_json::{json, Value};
use std::net::TcpStream;
use std::time::Duration;
use tungstenite::stream::MaybeTlsStream;
use tungstenite::{Message, WebSocket};

type Ws = WebSocket<MaybeTlsStream<TcpStream>>;

/// A server the helpers reach: one in this process, or a `concord serve` process.
trait At {
    fn at(&self) -> std::net::SocketAddr;
}

impl At for Handle {
    fn at(&self) -> std::net::SocketAddr {
        self.addr
    }
}

/// `concord serve ticketmelt --port 0 ARGS` as a process, killed when dropped.
struct Served {
    child: Option<std::process::Child>,
    addr: std::net::SocketAddr,
}

impl At for Served {
    fn at(&self) -> std::net::SocketAddr {
        self.addr
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Some(c) = self.child.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Served {
    /// The process, which the caller now stops.
    fn take(mut self) -> std::process::Child {
        self.child.take().unwrap()
    }
}

/// `concord serve ticketmelt --port 0 ARGS`, once it listens; its stderr goes to
/// `stderr` (a pipe nobody reads fills and stalls the server: pipe only what is read).
fn serve_process(args: &[&str], stderr: std::process::Stdio) -> Served {
    use std::io::BufRead;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_concord"))
        .args(["serve", "ticketmelt", "--port", "0"])
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(stderr)
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .split("http://")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("{line}"));
    Served {
        child: Some(child),
        addr,
    }
}

fn server(max_sessions: usize, timeout: Option<Duration>) -> Handle {
    let mut o = ServeOptions::new("ticketmelt");
    o.port = 0;
    o.max_sessions = max_sessions;
    o.session_timeout = timeout;
    o.max_frame_bytes = 64 * 1024;
    spawn(&o).unwrap()
}

fn connect(h: &impl At) -> Ws {
    let (ws, _) = tungstenite::connect(format!("ws://{}/ws", h.at())).unwrap();
    ws
}

fn send(ws: &mut Ws, frame: &str) -> Value {
    ws.send(Message::text(frame)).unwrap();
    read(ws)
}

fn read(ws: &mut Ws) -> Value {
    loop {
        match ws.read().unwrap() {
            Message::Text(t) => return serde_json::from_str(t.as_str()).unwrap(),
            Message::Close(c) => panic!("closed: {c:?}"),
            _ => continue,
        }
    }
}

fn error_code(v: &Value) -> &str {
    assert_eq!(v["type"], "error", "{v}");
    v["data"]["code"].as_str().unwrap()
}

/// The `i`-th action text of a deterministic mix of valid and malformed answers.
fn text(seed: u64, i: usize) -> String {
    const T: [&str; 5] = [
        r#"{"channel_msg":"b","commitment":"DEPLOY_PROD_B"}"#,
        r#"{"commitment":"MONITOR"}"#,
        "DEPLOY_PROD_A please",
        "",
        r#"{"commitment":"DEPLOY_PROD_A"}"#,
    ];
    T[(seed as usize * 7 + i * 3) % T.len()].to_string()
}

/// Play `seed` over the socket: (step rewards, final transcript).
fn play_ws(ws: &mut Ws, seed: u64) -> (Vec<f64>, Value) {
    let r = send(
        ws,
        &json!({"type": "reset", "data": {"seed": seed}}).to_string(),
    );
    assert_eq!(r["type"], "observation");
    assert!(r["data"]["reward"].is_null());
    let mut rewards = Vec::new();
    let mut done = r["data"]["done"].as_bool().unwrap();
    let mut i = 0;
    while !done {
        let r = send(
            ws,
            &json!({"type": "step", "data": {"message": text(seed, i)}}).to_string(),
        );
        assert_eq!(r["type"], "observation", "{r}");
        rewards.push(r["data"]["reward"].as_f64().unwrap());
        done = r["data"]["done"].as_bool().unwrap();
        i += 1;
    }
    let s = send(ws, r#"{"type":"state"}"#);
    assert_eq!(s["type"], "state");
    assert_eq!(s["data"]["step_count"], i);
    (rewards, s["data"]["transcript"].clone())
}

/// `v` as a client parses it off the wire (serde_json's float parsing may differ
/// from the printed shortest form by one ulp; Python's does not).
fn wire<T: serde::Serialize + serde::de::DeserializeOwned>(v: T) -> T {
    serde_json::from_str(&serde_json::to_string(&v).unwrap()).unwrap()
}

/// The same episode played in-process, as it reads off the wire.
fn play_local(seed: u64) -> (Vec<f64>, Value, f64) {
    let f = envs::create("ticketmelt", &Options::new()).unwrap();
    let mut env = f.reset(seed);
    let mut rewards = Vec::new();
    let mut i = 0;
    while !env.done() {
        let out = env.step(&[text(seed, i)]).unwrap();
        rewards.push(out.rewards[0]);
        i += 1;
    }
    (
        wire(rewards),
        wire(env.transcript()),
        wire(env.reward(0).scalar),
    )
}

#[test]
fn an_episode_over_the_socket_equals_the_same_seed_in_process() {
    let h = server(4, None);
    let mut ws = connect(&h);
    for seed in [0, 3, 42] {
        let (rewards, transcript) = play_ws(&mut ws, seed);
        let (local, local_transcript, scalar) = play_local(seed);
        assert_eq!(rewards, local, "seed {seed}");
        assert_eq!(transcript, local_transcript, "seed {seed}");
        assert!((rewards.iter().sum::<f64>() - scalar).abs() < 1e-12);
    }
    // the WebSocket's reset honours episode_id; its close message ends the session
    let r = send(
        &mut ws,
        r#"{"type":"reset","data":{"seed":1,"episode_id":"mine"}}"#,
    );
    assert_eq!(r["data"]["observation"]["step"], 0);
    assert_eq!(
        send(&mut ws, r#"{"type":"state"}"#)["data"]["episode_id"],
        "mine"
    );
    ws.send(Message::text(r#"{"type":"close"}"#)).unwrap();
    match ws.read() {
        Ok(Message::Close(_)) | Err(_) => {}
        Ok(m) => panic!("after close: {m:?}"),
    }
}

#[test]
fn every_websocket_error_code() {
    let h = server(1, Some(Duration::from_millis(300)));
    let mut ws = connect(&h);
    assert_eq!(error_code(&send(&mut ws, "{not json")), "INVALID_JSON");
    ws.send(Message::binary(vec![0u8, 159, 146])).unwrap();
    assert_eq!(error_code(&read(&mut ws)), "INVALID_JSON");
    assert_eq!(
        error_code(&send(&mut ws, r#"{"type":"fly"}"#)),
        "UNKNOWN_TYPE"
    );
    assert_eq!(error_code(&send(&mut ws, r#"{"data":{}}"#)), "UNKNOWN_TYPE");
    for bad in [
        r#"{"type":"step","data":{"message":7}}"#,
        r#"{"type":"step","data":{}}"#,
        r#"{"type":"step","data":{"message":"x","extra":1}}"#,
        r#"{"type":"reset","data":{"seed":-3}}"#,
        r#"{"type":"state","extra":true}"#,
        "[]",
    ] {
        assert_eq!(error_code(&send(&mut ws, bad)), "VALIDATION_ERROR", "{bad}");
    }
    let before_reset = send(&mut ws, r#"{"type":"step","data":{"message":"x"}}"#);
    assert_eq!(error_code(&before_reset), "EXECUTION_ERROR");
    // the session is still usable after every refusal
    let (rewards, _) = play_ws(&mut ws, 5);
    assert_eq!(rewards, play_local(5).0);
    let after_done = send(&mut ws, r#"{"type":"step","data":{"message":"x"}}"#);
    assert_eq!(error_code(&after_done), "EXECUTION_ERROR");
    // one session is the limit
    let mut second = connect(&h);
    let refused = read(&mut second);
    assert_eq!(error_code(&refused), "CAPACITY_REACHED");
    assert_eq!(refused["data"]["max_sessions"], 1);
    assert_eq!(close_code(&mut second), Some(1013), "try again later");
    // idle past the timeout: SESSION_ERROR, then the server closes the session, saying
    // why (issue #31, item 17: it used to close without a code, 1005 at the client)
    assert_eq!(error_code(&read(&mut ws)), "SESSION_ERROR");
    assert_eq!(close_code(&mut ws), Some(1000));
}

/// The code of the next close frame; None if the connection ends without one.
fn close_code(ws: &mut Ws) -> Option<u16> {
    loop {
        match ws.read() {
            Ok(Message::Close(c)) => return Some(c.map_or(1005, |c| u16::from(c.code))),
            Ok(_) => continue,
            Err(_) => return None,
        }
    }
}

#[test]
fn an_oversized_frame_ends_only_its_session() {
    let h = server(4, None);
    let mut other = connect(&h);
    send(&mut other, r#"{"type":"reset","data":{"seed":9}}"#);
    let mut ws = connect(&h);
    let big = format!(
        r#"{{"type":"step","data":{{"message":"{}"}}}}"#,
        "x".repeat(100_000)
    );
    ws.send(Message::text(big)).unwrap();
    // SESSION_ERROR, then a close frame saying "too big" (the server keeps the socket
    // open a moment after it, so that the unread rest of the frame cannot reset the
    // connection before they are read)
    let e = read(&mut ws);
    assert_eq!(error_code(&e), "SESSION_ERROR");
    let text = e["data"]["message"].as_str().unwrap_or_default();
    assert!(text.contains("--max-frame-bytes (65536 bytes)"), "{e}");
    assert_eq!(close_code(&mut ws), Some(1009));
    let r = send(
        &mut other,
        r#"{"type":"step","data":{"message":"MONITOR"}}"#,
    );
    assert_eq!(r["data"]["observation"]["step"], 1);
    assert_eq!(health(&h), json!({"status": "healthy"}));
}

/// Issue 54, item 14: a limit above tungstenite's own 16 MiB frame limit is the limit.
#[test]
fn a_frame_limit_above_16_mib_is_the_one_applied() {
    let mut o = ServeOptions::new("ticketmelt");
    o.port = 0;
    o.max_frame_bytes = 32 << 20;
    let h = spawn(&o).unwrap();
    let mut ws = connect(&h);
    // reset ignores keys it does not take: the reply stays small
    let big = format!(
        r#"{{"type":"reset","data":{{"seed":9,"pad":"{}"}}}}"#,
        "x".repeat(17 << 20)
    );
    let r = send(&mut ws, &big);
    let head: String = r.to_string().chars().take(300).collect();
    assert_eq!(
        r["type"], "observation",
        "a 17 MiB frame under a 32 MiB limit: {head}"
    );
    let state = send(&mut ws, r#"{"type":"state"}"#);
    assert_ne!(state["type"], "error", "{state}");
}

#[test]
fn capacity_is_refused_then_freed() {
    let h = server(2, None);
    let mut a = connect(&h);
    let mut b = connect(&h);
    send(&mut a, r#"{"type":"reset","data":{"seed":1}}"#);
    send(&mut b, r#"{"type":"reset","data":{"seed":2}}"#);
    let mut c = connect(&h);
    assert_eq!(error_code(&read(&mut c)), "CAPACITY_REACHED");
    a.send(Message::text(r#"{"type":"close"}"#)).unwrap();
    while a.read().is_ok() {}
    // the slot comes back once the server has seen the close
    let freed = (0..200).any(|_| {
        let mut d = connect(&h);
        let r = send(&mut d, r#"{"type":"reset","data":{"seed":3}}"#);
        if r["type"] == "observation" {
            return true;
        }
        assert_eq!(error_code(&r), "CAPACITY_REACHED");
        std::thread::sleep(Duration::from_millis(10));
        false
    });
    assert!(freed, "a closed session's slot was never freed");
    // b was not disturbed
    let r = send(&mut b, r#"{"type":"step","data":{"message":"MONITOR"}}"#);
    assert_eq!(r["data"]["observation"]["step"], 1);
}

#[test]
fn sixty_four_concurrent_sessions_are_independent_and_seeded() {
    let h = server(64, None);
    let addr = h.addr;
    let threads: Vec<_> = (0..64u64)
        .map(|i| {
            std::thread::spawn(move || {
                let (mut ws, _) = tungstenite::connect(format!("ws://{addr}/ws")).unwrap();
                // pairs of sessions share a seed: same seed, same episode
                let seed = i / 2;
                let first = play_ws(&mut ws, seed);
                let again = play_ws(&mut ws, seed);
                assert_eq!(first, again);
                (seed, first)
            })
        })
        .collect();
    for t in threads {
        let (seed, (rewards, transcript)) = t.join().unwrap();
        let (local, local_transcript, _) = play_local(seed);
        assert_eq!(rewards, local, "seed {seed}");
        assert_eq!(transcript, local_transcript, "seed {seed}");
    }
}

fn url(h: &impl At, path: &str) -> String {
    format!("http://{}{path}", h.at())
}

fn health(h: &impl At) -> Value {
    ureq::get(&url(h, "/health"))
        .call()
        .unwrap()
        .into_json()
        .unwrap()
}

/// (status, body) of a POST.
fn post(h: &impl At, path: &str, body: &str) -> (u16, Value) {
    let r = ureq::post(&url(h, path))
        .set("content-type", "application/json")
        .send_string(body);
    match r {
        Ok(r) => (r.status(), r.into_json().unwrap()),
        Err(ureq::Error::Status(code, r)) => (code, r.into_json().unwrap()),
        Err(e) => panic!("{e}"),
    }
}

#[test]
fn every_http_endpoint() {
    let h = server(2, None);
    assert_eq!(health(&h), json!({"status": "healthy"}));
    let meta: Value = ureq::get(&url(&h, "/metadata"))
        .call()
        .unwrap()
        .into_json()
        .unwrap();
    assert_eq!(meta["name"], "ticketmelt");
    assert!(meta["readme_content"].as_str().unwrap().len() > 100);
    let schema: Value = ureq::get(&url(&h, "/schema"))
        .call()
        .unwrap()
        .into_json()
        .unwrap();
    assert_eq!(schema["action"]["required"], json!(["message"]));
    for k in ["action", "observation", "state"] {
        assert_eq!(schema[k]["type"], "object", "{k}");
    }
    // step before reset: 409; an invalid action: 422 with FastAPI's detail list
    let (code, _) = post(&h, "/step", r#"{"action":{"message":"MONITOR"}}"#);
    assert_eq!(code, 409);
    for bad in [
        r#"{"action":{"message":1}}"#,
        r#"{"action":{}}"#,
        r#"{}"#,
        r#"{"action":{"message":"x"},"timeout_s":-1}"#,
        "{nope",
    ] {
        let (code, body) = post(&h, "/step", bad);
        assert_eq!(code, 422, "{bad}");
        assert!(body["detail"].is_array(), "{body}");
    }
    assert_eq!(post(&h, "/reset", r#"{"seed":-1}"#).0, 422);
    // an episode over HTTP equals the in-process one
    let (code, r) = post(&h, "/reset", r#"{"seed":11,"episode_id":"http"}"#);
    assert_eq!(code, 200);
    assert!(r["reward"].is_null());
    let mut rewards = Vec::new();
    let mut i = 0;
    let mut done = false;
    while !done {
        let body = json!({"action": {"message": text(11, i)}, "request_id": "r"}).to_string();
        let (code, r) = post(&h, "/step", &body);
        assert_eq!(code, 200, "{r}");
        rewards.push(r["reward"].as_f64().unwrap());
        done = r["done"].as_bool().unwrap();
        i += 1;
    }
    let (local, transcript, _) = play_local(11);
    assert_eq!(rewards, local);
    let state: Value = ureq::get(&url(&h, "/state"))
        .call()
        .unwrap()
        .into_json()
        .unwrap();
    assert_eq!(state["episode_id"], "http");
    assert_eq!(state["step_count"], i);
    assert_eq!(state["transcript"], transcript);
    assert_eq!(post(&h, "/step", r#"{"action":{"message":"x"}}"#).0, 409);
    // an empty body resets with a random seed
    assert_eq!(post(&h, "/reset", "").0, 200);
}

#[test]
fn mcp_tools_over_http_and_websocket() {
    let h = server(2, None);
    let (code, r) = post(
        &h,
        "/mcp",
        r#"{"jsonrpc":"2.0","method":"tools/list","id":1}"#,
    );
    assert_eq!(code, 200);
    let names: Vec<&str> = r["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["act", "observe", "rules"]);
    for reserved in ["reset", "step", "state", "close"] {
        let body = json!({"jsonrpc": "2.0", "method": "tools/call", "id": 2,
                          "params": {"name": reserved, "arguments": {}}});
        let (_, r) = post(&h, "/mcp", &body.to_string());
        assert_eq!(r["error"]["code"], -32602, "{reserved}: {r}");
    }
    assert_eq!(post(&h, "/mcp", "{oops").1["error"]["code"], -32700);
    assert_eq!(
        post(&h, "/mcp", r#"{"jsonrpc":"2.0","method":"x/y","id":3}"#).1["error"]["code"],
        -32601
    );
    // `act` plays in the HTTP session
    post(&h, "/reset", r#"{"seed":4}"#);
    let act = json!({"jsonrpc": "2.0", "method": "tools/call", "id": "a",
                     "params": {"name": "act", "arguments": {"message": "MONITOR"}}});
    let (_, r) = post(&h, "/mcp", &act.to_string());
    assert_eq!(r["result"]["isError"], false, "{r}");
    let state: Value = ureq::get(&url(&h, "/state"))
        .call()
        .unwrap()
        .into_json()
        .unwrap();
    assert_eq!(state["step_count"], 1);
    // and in a WebSocket session
    let mut ws = connect(&h);
    send(&mut ws, r#"{"type":"reset","data":{"seed":4}}"#);
    let r = send(&mut ws, &json!({"type": "mcp", "data": act}).to_string());
    assert_eq!(r["type"], "mcp");
    assert_eq!(
        r["data"]["result"]["structuredContent"]["observation"]["step"],
        1
    );
}

/// One JSON-RPC call to `POST /mcp`: its `result`, or its `error`.
fn rpc(h: &impl At, id: u64, method: &str, params: Value) -> Result<Value, Value> {
    let body = json!({"jsonrpc": "2.0", "method": method, "params": params, "id": id});
    let (code, r) = post(h, "/mcp", &body.to_string());
    assert_eq!(
        (code, &r["jsonrpc"], &r["id"]),
        (200, &json!("2.0"), &json!(id)),
        "{r}"
    );
    match r.get("error") {
        Some(e) => Err(e.clone()),
        None => Ok(r["result"].clone()),
    }
}

fn connect_to(h: &impl At, session_id: &str) -> Ws {
    let u = format!("ws://{}/ws?session_id={session_id}", h.at());
    tungstenite::connect(u).unwrap().0
}

/// `GET /openapi.json`: what openenv 0.10's validator reads. The OpenEnv HTTP
/// standard's version, and simulation mode: `/reset`, `/step` and `/state` among the
/// paths (the validator's `mode_endpoint_consistency`), every other HTTP route too,
/// and no WebSocket route; every `$ref` resolves.
#[test]
fn the_openapi_document_declares_simulation_mode() {
    let h = server(1, None);
    let doc: Value = ureq::get(&url(&h, "/openapi.json"))
        .call()
        .unwrap()
        .into_json()
        .unwrap();
    assert_eq!(doc["info"]["version"], "1.0.0");
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    let paths: Vec<&str> = doc["paths"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    for p in [
        "/reset",
        "/step",
        "/state",
        "/health",
        "/metadata",
        "/schema",
        "/mcp",
    ] {
        assert!(paths.contains(&p), "{p} not in {paths:?}");
    }
    assert!(!paths.contains(&"/ws"));
    let text = doc.to_string();
    for r in text.split("\"$ref\":\"#/components/schemas/").skip(1) {
        let name = &r[..r.find('"').unwrap()];
        assert!(doc["components"]["schemas"][name].is_object(), "{name}");
    }
    assert!(text.contains("ConcordObservation"));
}

/// openenv 0.10's `MCPToolClient`, frame by frame: `openenv/session/create`, the
/// WebSocket attached with `?session_id=` resets, `tools/call` over HTTP steps that
/// same episode to its end (reward and done in `data`), a close while attached is
/// deferred to the detach; capacity, unknown ids and a second attach are refused.
#[test]
fn mcp_sessions_play_an_episode_over_http_and_websocket() {
    let h = server(2, None);
    let sid = rpc(&h, 1, "openenv/session/create", json!({})).unwrap()["session_id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(sid.len(), 36, "a uuid: {sid}");
    let act = |id: u64, msg: &str| {
        rpc(
            &h,
            id,
            "tools/call",
            json!({"name": "act", "arguments": {"message": msg},
                                          "session_id": sid}),
        )
    };
    let e = act(2, "MONITOR").unwrap_err();
    assert_eq!(e["code"], -32603, "acting before a reset: {e}");
    let mut ws = connect_to(&h, &sid);
    let r = send(&mut ws, r#"{"type":"reset","data":{"seed":3}}"#);
    assert_eq!(r["type"], "observation", "{r}");
    let tools = rpc(&h, 3, "tools/list", json!({"session_id": sid})).unwrap();
    assert_eq!(tools["tools"].as_array().unwrap().len(), 3);
    let (mut steps, mut done, mut last) = (0, false, Value::Null);
    while !done {
        let r = act(10 + steps, "MONITOR").unwrap();
        assert_eq!(r["isError"], false);
        assert_eq!(r["data"], r["structuredContent"]);
        assert!(r["data"]["reward"].is_number(), "{r}");
        done = r["data"]["done"].as_bool().unwrap();
        steps += 1;
        last = r;
    }
    assert!(last["data"]["observation"]["rewards"].is_array());
    let state = send(&mut ws, r#"{"type":"state"}"#);
    assert_eq!(
        state["data"]["step_count"], steps,
        "one episode behind both"
    );
    assert_eq!(
        act(99, "MONITOR").unwrap_err()["code"],
        -32603,
        "after the end"
    );

    // the HTTP session is another one
    let e = rpc(
        &h,
        4,
        "tools/call",
        json!({"name": "observe", "arguments": {}}),
    )
    .unwrap_err();
    assert_eq!(e["code"], -32603, "{e}");
    // a second WebSocket on the same session, and unknown ids
    let mut twice = connect_to(&h, &sid);
    assert!(read(&mut twice)["data"]["message"]
        .as_str()
        .unwrap()
        .contains("already has an attached WebSocket"));
    let mut unknown = connect_to(&h, "nope");
    assert_eq!(error_code(&read(&mut unknown)), "SESSION_ERROR");
    let e = rpc(&h, 5, "tools/list", json!({"session_id": "nope"})).unwrap_err();
    assert_eq!(
        (e["code"].as_i64(), e["message"].as_str()),
        (Some(-32602), Some("Unknown session_id: nope"))
    );
    // capacity: this session and one more
    let other = rpc(&h, 6, "openenv/session/create", json!({})).unwrap();
    let full = rpc(&h, 7, "openenv/session/create", json!({})).unwrap_err();
    assert_eq!(full["code"], -32000);
    assert_eq!(full["data"]["max_sessions"], 2);
    let other = other["session_id"].as_str().unwrap();
    assert_eq!(
        rpc(&h, 8, "openenv/session/close", json!({"session_id": other})).unwrap()["closed"],
        true
    );
    // a close while attached waits for the detach
    let c = rpc(&h, 9, "openenv/session/close", json!({"session_id": sid})).unwrap();
    assert_eq!(
        (c["closed"].as_bool(), c["closing"].as_bool()),
        (Some(false), Some(true))
    );
    ws.send(Message::text(r#"{"type":"close"}"#)).unwrap();
    while !matches!(ws.read(), Ok(Message::Close(_)) | Err(_)) {}
    let e = rpc(&h, 10, "tools/list", json!({"session_id": sid})).unwrap_err();
    assert_eq!(e["code"], -32602, "closed on detach: {e}");
    let e = rpc(&h, 11, "openenv/session/close", json!({})).unwrap_err();
    assert_eq!(e["code"], -32602);
    // both slots are free again
    rpc(&h, 12, "openenv/session/create", json!({})).unwrap();
    rpc(&h, 13, "openenv/session/create", json!({})).unwrap();
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Garbage of every kind gets an error reply and leaves the session, the other
    /// sessions and the server as they were.
    #[test]
    fn malformed_frames_never_hurt_the_server(
        frames in proptest::collection::vec(
            prop_oneof![
                any::<String>(),
                "\\{\"type\":\"(reset|step|state|mcp)\",\"data\":[^}]{0,40}\\}",
                proptest::collection::vec(any::<u8>(), 0..64).prop_map(|b| String::from_utf8_lossy(&b).into_owned()),
                Just("{\"type\":\"step\",\"data\":{\"message\":null}}".to_string()),
                Just("null".to_string()),
                Just("{\"type\":\"reset\",\"data\":{\"seed\":1e400}}".to_string()),
            ],
            1..12,
        ),
        binary in proptest::collection::vec(any::<u8>(), 0..64),
    ) {
        let h = FUZZ_SERVER.with(|s| s.addr);
        let (mut ws, _) = tungstenite::connect(format!("ws://{h}/ws")).unwrap();
        let (mut bystander, _) = tungstenite::connect(format!("ws://{h}/ws")).unwrap();
        send(&mut bystander, r#"{"type":"reset","data":{"seed":8}}"#);
        for f in &frames {
            ws.send(Message::text(f.clone())).unwrap();
            let r = read(&mut ws);
            prop_assert!(["error", "observation", "state", "mcp"].contains(&r["type"].as_str().unwrap_or("")), "{}", r);
        }
        ws.send(Message::binary(binary)).unwrap();
        let r = read(&mut ws);
        prop_assert_eq!(error_code(&r), "INVALID_JSON");
        // the fuzzed session still plays a whole, correct episode
        let (rewards, _) = play_ws(&mut ws, 8);
        prop_assert_eq!(&rewards, &play_local(8).0);
        // and the bystander's episode went on untouched
        let r = send(&mut bystander, r#"{"type":"state"}"#);
        prop_assert_eq!(&r["data"]["step_count"], &json!(0));
        prop_assert_eq!(&r["data"]["seed"], &json!(8));
        let health: Value = ureq::get(&format!("http://{h}/health")).call().unwrap().into_json().unwrap();
        prop_assert_eq!(health, json!({"status": "healthy"}));
    }
}

thread_local! {
    /// One server for every fuzz case of the thread.
    static FUZZ_SERVER: Handle = server(64, None);
}

#[test]
fn the_remote_client_plays_a_concord_server_like_in_process() {
    let h = server(8, None);
    let f = RemoteFactory::new(RemoteSpec::new(format!("http://{}", h.addr))).unwrap();
    for seed in [2, 17] {
        let mut env = f.try_reset(seed).unwrap();
        let local = envs::create("ticketmelt", &Options::new()).unwrap();
        let mut l = local.reset(seed);
        assert_eq!(env.observation(0), l.observation(0));
        let mut i = 0;
        while !env.done() {
            let out = env.step(&[text(seed, i)]).unwrap();
            let lout = l.step(&[text(seed, i)]).unwrap();
            assert_eq!(out.rewards, wire(lout.rewards));
            assert_eq!(out.valid, lout.valid);
            assert_eq!(out.feedback, lout.feedback);
            if !l.done() {
                assert_eq!(env.turn_message(0), l.turn_message(0));
            }
            i += 1;
        }
        assert!(l.done());
        assert_eq!(env.reward(0).scalar, wire(l.reward(0).scalar));
    }
}

#[test]
fn a_lost_server_is_an_error_never_a_zero_reward() {
    let h = server(8, None);
    let f = RemoteFactory::new(RemoteSpec::new(format!("ws://{}", h.addr))).unwrap();
    let mut env = f.try_reset(3).unwrap();
    env.step(&[text(3, 0)]).unwrap();
    h.stop().unwrap();
    let err = env.step(&[text(3, 1)]).unwrap_err();
    assert!(err.downcast_ref::<ConnectionLost>().is_some(), "{err:#}");
    assert!(
        format!("{err:#}").contains("lost the connection"),
        "{err:#}"
    );
    let err = f.try_reset(4).err().unwrap();
    assert!(err.downcast_ref::<ConnectionLost>().is_some(), "{err:#}");
}

#[test]
fn a_full_server_says_how_to_fix_it() {
    let h = server(1, None);
    let f = RemoteFactory::new(RemoteSpec::new(format!("ws://{}", h.addr))).unwrap();
    let _held = f.try_reset(1).unwrap();
    let err = format!("{:#}", f.try_reset(1).err().unwrap());
    assert!(
        err.contains("CAPACITY_REACHED") && err.contains("--max-sessions"),
        "{err}"
    );
}

/// A config that trains the tiny model on the server at `url`, in `dir`.
fn remote_config(dir: &std::path::Path, url: &str, steps: usize) -> std::path::PathBuf {
    let text = format!(
        r#"
[run]
name = "remote"
output_dir = "{out}"
seed = 3
steps = {steps}
save_every = 0

[model]
name = "{model}"
init_tiny = true
dtype = "f32"
device = "cpu"

[lora]
r = 4
alpha = 8
targets = ["q_proj", "v_proj"]

[grpo]
num_generations = 2
prompts_per_step = 2
max_completion_length = 2048
temperature = 1.0

[env]
url = "{url}"
mode = "episode"
max_turn_tokens = 16
"#,
        out = dir.display(),
        model = dir.join("tiny").display(),
    );
    let p = dir.join("remote.toml");
    std::fs::write(&p, text).unwrap();
    p
}

#[test]
fn train_on_a_served_environment_then_lose_it_with_a_checkpoint() {
    use concord::grpo::trainer::Trainer;
    use concord::train::{prepare, TrainOptions};
    let h = server(8, None);
    let dir = tempfile::tempdir().unwrap();
    let cfg = remote_config(dir.path(), &format!("ws://{}", h.addr), 3);
    let p = prepare(&TrainOptions {
        config: Some(cfg),
        sets: vec![],
        resume: None,
        overwrite: false,
    })
    .unwrap();
    let mut t =
        Trainer::with_stages(p.cfg, p.model, p.renderer, p.stages, p.base, p.resume).unwrap();
    t.train_with(Some(2), |_| {}).unwrap();
    let log = std::fs::read_to_string(t.session.run_dir.join("training_log.csv")).unwrap();
    assert_eq!(log.lines().count(), 3, "{log}");
    assert!(
        log.lines()
            .next()
            .unwrap()
            .contains("rewards/remote_reward"),
        "{log}"
    );
    h.stop().unwrap();
    let err = format!("{:#}", t.train_with(None, |_| {}).unwrap_err());
    assert!(
        err.contains("checkpoint-2 written") && err.contains("--resume"),
        "{err}"
    );
    // The next step's sessions cannot connect: "could not reach", and still the
    // server-lost path (a checkpoint, the resume command).
    assert!(err.contains("could not reach the OpenEnv server"), "{err}");
    assert!(t.session.run_dir.join("checkpoint-2").is_dir());
}

/// Well-formed ticketmelt answers (a malformed one zeroes the episode's reward).
const COMMIT: [&str; 3] = [
    r#"{"commitment":"DEPLOY_PROD_A"}"#,
    r#"{"commitment":"DEPLOY_PROD_B"}"#,
    r#"{"commitment":"MONITOR"}"#,
];

/// A policy for both sides of a remote-vs-local comparison: the answer is a function
/// of the episode's seed and its steps so far, read from its transcript.
fn by_transcript() -> impl envs::rollout::Policy {
    envs::rollout::EachTurn(|env: &mut dyn envs::Environment, _seat| {
        let t = env.transcript();
        let (seed, steps) = (
            t["seed"].as_u64().unwrap(),
            t["steps"].as_array().unwrap().len(),
        );
        Ok(COMMIT[(seed as usize + steps * steps) % 3].to_string())
    })
}

#[test]
fn a_copied_remote_episode_replays_its_actions_in_a_session_of_its_own() {
    let h = server(8, None);
    let f = RemoteFactory::new(RemoteSpec::new(format!("ws://{}", h.addr))).unwrap();
    let local = envs::create("ticketmelt", &Options::new()).unwrap();
    let mut env = f.try_reset(5).unwrap();
    let mut l = local.reset(5);
    for i in 0..3 {
        env.step(&[text(5, i)]).unwrap();
        l.step(&[text(5, i)]).unwrap();
    }
    // two copies, and a copy of a copy, each go their own way from step 3
    let mut a = env.clone_box();
    let mut b = env.clone_box();
    let mut c = a.clone_box();
    let mut la = l.clone_box();
    let mut lb = l.clone_box();
    for i in 3..5 {
        let x = a.step(&[text(5, i)]).unwrap();
        assert_eq!(x.rewards, wire(la.step(&[text(5, i)]).unwrap().rewards));
        let y = b.step(&[text(9, i)]).unwrap();
        assert_eq!(y.rewards, wire(lb.step(&[text(9, i)]).unwrap().rewards));
        c.step(&[text(5, i)]).unwrap();
    }
    assert_eq!(a.observation(0), la.observation(0));
    assert_eq!(b.observation(0), lb.observation(0));
    assert_eq!(c.observation(0), a.observation(0));
    assert_ne!(
        a.observation(0),
        b.observation(0),
        "the copies are independent"
    );
    // the original session is where it was
    assert_eq!(env.observation(0), l.observation(0));
    env.step(&[text(7, 3)]).unwrap();
    l.step(&[text(7, 3)]).unwrap();
    assert_eq!(env.observation(0), l.observation(0));
}

/// An OpenEnv server whose episodes are not a function of the seed: every reset
/// and step answers with a counter shared by all sessions.
fn counting_server() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("ws://{}", listener.local_addr().unwrap());
    let count = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    std::thread::spawn(move || {
        while let Ok((s, _)) = listener.accept() {
            let count = count.clone();
            std::thread::spawn(move || {
                let Ok(mut ws) = tungstenite::accept(s) else {
                    return;
                };
                while let Ok(Message::Text(_)) = ws.read() {
                    let n = count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    let reply = json!({"type": "observation", "data": {
                        "observation": {"n": n}, "reward": 0.0, "done": false}});
                    if ws.send(Message::text(reply.to_string())).is_err() {
                        return;
                    }
                }
            });
        }
    });
    url
}

/// An OpenEnv server that answers every reset with `reset` and every other frame with
/// `step` (each the `data` of an observation frame, or a whole frame with `"type"`).
fn fixed_server(reset: Value, step: Value) -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("ws://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        while let Ok((s, _)) = listener.accept() {
            let (reset, step) = (reset.clone(), step.clone());
            std::thread::spawn(move || {
                let Ok(mut ws) = tungstenite::accept(s) else {
                    return;
                };
                while let Ok(Message::Text(t)) = ws.read() {
                    let data = if t.contains("\"reset\"") {
                        &reset
                    } else {
                        &step
                    };
                    let frame = match data.get("type") {
                        Some(_) => data.clone(),
                        None => json!({"type": "observation", "data": data}),
                    };
                    if ws.send(Message::text(frame.to_string())).is_err() {
                        return;
                    }
                }
            });
        }
    });
    url
}

/// Issue 54, item 13: what a server sends that is not what OpenEnv allows is an error
/// naming the server and the step, never a reward of 0, a sum of inf, escapes on the
/// terminal or an unreadable seat list.
#[test]
fn malformed_server_replies_are_named_errors() {
    let obs = |reward: Value, done: bool| json!({"observation": {"text": "go"}, "reward": reward, "done": done});
    let ansi = json!({"type": "error", "data": {
        "message": "\u{1b}[31mboom\u{1b}[0m\u{7}", "code": "EXECUTION_ERROR"}});
    let cases = [
        (
            obs(Value::Null, false),
            obs("0.5".into(), true),
            "the reward \"0.5\" is not a number",
        ),
        (
            obs(Value::Null, false),
            obs(1e308.into(), false),
            "is not a finite number",
        ),
        (obs(Value::Null, false), ansi, "boom"),
        (
            obs(Value::Null, true),
            obs(Value::Null, true),
            "over at its reset",
        ),
    ];
    for (reset, step, want) in cases {
        let url = fixed_server(reset, step);
        let dir = tempfile::tempdir().unwrap();
        let cfg = remote_config(dir.path(), &url, 1);
        let text = std::fs::read_to_string(&cfg).unwrap() + "max_steps = 4\n";
        std::fs::write(&cfg, text).unwrap();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_concord"))
            .args(["train", "--config", cfg.to_str().unwrap()])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{want}: {err}");
        assert!(err.contains(want), "{want}: {err}");
        assert!(err.contains(&format!("step 1 on {url}")), "{want}: {err}");
        assert!(!err.contains('\u{1b}') && !err.contains('\u{7}'), "{err:?}");
    }
}

/// Issue 54, item 2: a server whose episodes never end. With `max_steps = 0` an
/// episode is an error after `MAX_STEPS_UNTIL_DONE` steps, not a run that never ends;
/// and a signal abandons a step that is still collecting instead of waiting for it (a
/// later step would keep the last step's checkpoint, as a lost server does).
#[test]
fn an_episode_that_never_ends_is_bounded_and_a_signal_abandons_it() {
    use concord::envs::remote::MAX_STEPS_UNTIL_DONE;
    let go = json!({"observation": {"text": "go"}, "reward": 0.0, "done": false});
    let endless = fixed_server(go.clone(), go);
    let f = RemoteFactory::new(RemoteSpec::new(endless.clone())).unwrap();
    let mut env = f.try_reset(1).unwrap();
    for _ in 0..MAX_STEPS_UNTIL_DONE {
        env.step(&["a".into()]).unwrap();
    }
    let e = format!("{:#}", env.step(&["a".into()]).unwrap_err());
    assert!(
        e.contains("has not ended") && e.contains("max_steps"),
        "{e}"
    );

    // A signal while the model plays the endless episodes out: the step is given up.
    let dir = tempfile::tempdir().unwrap();
    let cfg = remote_decision_config(dir.path(), &endless, 1);
    let log = dir.path().join("stderr.txt");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_concord"))
        .args(["train", "--config", cfg.to_str().unwrap()])
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let t0 = std::time::Instant::now();
    while !std::fs::read_to_string(&log)
        .unwrap_or_default()
        .contains("round 3:")
    {
        assert!(child.try_wait().unwrap().is_none(), "exited early");
        assert!(t0.elapsed() < Duration::from_secs(120), "no rounds");
        std::thread::sleep(Duration::from_millis(50));
    }
    let st = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    let t1 = std::time::Instant::now();
    let status = child.wait().unwrap();
    assert!(t1.elapsed() < Duration::from_secs(30), "{:?}", t1.elapsed());
    let err = std::fs::read_to_string(&log).unwrap();
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(err.contains("abandoned on a signal"), "{err}");
    assert!(!err.contains("interrupted twice"), "{err}");
}

/// Issue 54, item 1: an observation past the model's positions (40,000 words here) or
/// past any memory (400,000 words, 2 MB, asked for 640 GB and aborted) is an error
/// naming the step, the server and the length, not an abort and not silence.
#[test]
fn a_prompt_too_long_for_the_model_is_a_named_error() {
    for words in [40_000, 400_000] {
        let url = fixed_server(
            json!({"observation": {"text": "word ".repeat(words)}, "reward": 0.0, "done": false}),
            json!({"observation": {"text": "end"}, "reward": 0.0, "done": true}),
        );
        let dir = tempfile::tempdir().unwrap();
        let cfg = remote_config(dir.path(), &url, 1);
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_concord"))
            .args(["train", "--config", cfg.to_str().unwrap()])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{words} words: {err}");
        assert!(err.contains(&format!("step 1 on {url}")), "{err}");
        assert!(
            err.contains("after a prompt of") && err.contains("max_position_embeddings"),
            "{err}"
        );
    }
}

#[test]
fn a_server_that_does_not_replay_cannot_be_copied() {
    let f = RemoteFactory::new(RemoteSpec::new(counting_server())).unwrap();
    let mut env = f.try_reset(1).unwrap();
    env.step(&["a".into()]).unwrap();
    let mut copy = env.clone_box();
    let err = format!("{:#}", copy.step(&["b".into()]).unwrap_err());
    assert!(
        err.contains("replaying seed 1") && err.contains("function of the seed"),
        "{err}"
    );
    assert!(err.contains("mode = \"episode\""), "{err}");
}

#[test]
fn remote_decisions_equal_the_same_decisions_in_process() {
    let h = server(64, None);
    let f = RemoteFactory::new(RemoteSpec::new(format!("ws://{}", h.addr))).unwrap();
    let local = envs::create("ticketmelt", &Options::new()).unwrap();
    let seeds: Vec<u64> = (0..8).map(|i| 1000 + 37 * i).collect();
    let remote = envs::sample_decisions_with(&f, &seeds, &mut by_transcript()).unwrap();
    let inproc = envs::sample_decisions_with(local.as_ref(), &seeds, &mut by_transcript()).unwrap();
    let mut later = 0;
    for (r, l) in remote.iter().zip(&inproc) {
        assert_eq!((r.seed, r.seat, r.step), (l.seed, l.seat, l.step));
        assert_eq!(r.messages, l.messages);
        later += (r.step > 0) as usize;
    }
    assert!(
        later >= 4,
        "decisions fall inside the episode, not at its start"
    );
    // every decision's G answers, each finished by the same policy
    let answers = COMMIT.map(str::to_string);
    let items = |ds: &[envs::Decision]| -> Vec<(usize, String)> {
        (0..ds.len())
            .flat_map(|i| answers.iter().map(move |a| (i, a.clone())))
            .collect()
    };
    let score = |ds: &[envs::Decision]| -> Vec<f64> {
        let its = items(ds);
        let refs: Vec<(&envs::Decision, &str)> =
            its.iter().map(|(i, a)| (&ds[*i], a.as_str())).collect();
        envs::score_decisions_with(&refs, &mut by_transcript())
            .unwrap()
            .into_iter()
            .map(|r| r.scalar)
            .collect()
    };
    let (rs, ls) = (score(&remote), score(&inproc));
    assert_eq!(rs, wire(ls.clone()));
    // the answer changes the outcome somewhere (else the check above says little)
    assert!(
        rs.chunks(answers.len())
            .any(|g| g.iter().any(|x| *x != g[0])),
        "{rs:?}"
    );
}

/// [`remote_config`] in decision mode: the model draws and finishes each decision.
fn remote_decision_config(dir: &std::path::Path, url: &str, steps: usize) -> std::path::PathBuf {
    let p = remote_config(dir, url, steps);
    let text = std::fs::read_to_string(&p)
        .unwrap()
        .replace("max_completion_length = 2048", "max_completion_length = 24")
        .replace(
            "mode = \"episode\"\nmax_turn_tokens = 16\n",
            "mode = \"decision\"\ncontinue_with = \"model\"\n",
        );
    std::fs::write(&p, text).unwrap();
    p
}

fn train_log(cfg: &std::path::Path) -> String {
    use concord::train::{run, TrainOptions};
    run(TrainOptions {
        config: Some(cfg.to_path_buf()),
        sets: vec![],
        resume: None,
        overwrite: true,
    })
    .unwrap();
    let dir = cfg.parent().unwrap().join("remote");
    std::fs::read_to_string(dir.join("training_log.csv")).unwrap()
}

/// The columns of a training log that do not measure time.
fn untimed(log: &str) -> Vec<Vec<String>> {
    let rows: Vec<Vec<&str>> = log.lines().map(|l| l.split(',').collect()).collect();
    let keep: Vec<usize> = (0..rows[0].len())
        .filter(|&i| {
            let h = rows[0][i];
            !(h.contains("per_s") || h.contains("time") || h == "seconds" || h.contains("mem"))
        })
        .collect();
    rows.iter()
        .map(|r| keep.iter().map(|&i| r[i].to_string()).collect())
        .collect()
}

fn column(log: &str, name: &str) -> Vec<String> {
    let rows = untimed(log);
    let i = rows[0]
        .iter()
        .position(|h| h == name)
        .unwrap_or_else(|| panic!("{name}"));
    rows[1..].iter().map(|r| r[i].clone()).collect()
}

#[test]
fn train_in_decision_mode_on_a_served_environment_deterministically() {
    let h = server(64, None);
    let url = format!("ws://{}", h.addr);
    let (d1, d2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let first = train_log(&remote_decision_config(d1.path(), &url, 2));
    assert_eq!(first.lines().count(), 3, "{first}");
    assert!(column(&first, "rewards/remote_reward/mean")
        .iter()
        .all(|r| r.parse::<f64>().is_ok()));
    let samples = std::fs::read_to_string(d1.path().join("remote").join("samples.jsonl")).unwrap();
    assert!(samples.contains("remote_reward"), "{samples}");
    let second = train_log(&remote_decision_config(d2.path(), &url, 2));
    assert_eq!(untimed(&first), untimed(&second));
}

#[test]
fn a_curriculum_trains_a_server_in_both_modes_and_a_built_in_between() {
    let h = server(64, None);
    let url = format!("ws://{}", h.addr);
    let dir = tempfile::tempdir().unwrap();
    let p = remote_decision_config(dir.path(), &url, 3);
    let text = std::fs::read_to_string(&p).unwrap()
        + r#"
[[stage]]
name = "decide"
steps = 1

[[stage]]
name = "local"
steps = 1
envs = { ticketmelt = 1.0 }
mode = "decision"

[[stage]]
name = "episodes"
mode = "episode"
[stage.grpo]
max_completion_length = 64
"#;
    std::fs::write(&p, text).unwrap();
    let cfg = concord::config::Config::load(&p, &[]).unwrap();
    let evaluated = concord::eval::eval_envs(&cfg).unwrap();
    assert_eq!(evaluated.len(), 1);
    assert_eq!(evaluated[0].0, url, "the last stage's server is evaluated");
    let log = train_log(&p);
    assert_eq!(
        column(&log, "stage"),
        ["decide", "local", "episodes"],
        "{log}"
    );
    assert_eq!(
        column(&log, "env"),
        ["remote", "ticketmelt", "remote"],
        "{log}"
    );
    let remote = column(&log, "rewards/remote_reward/mean");
    assert!(
        remote[0].parse::<f64>().is_ok() && remote[2].parse::<f64>().is_ok(),
        "{log}"
    );
    let turns = column(&log, "episode/mean_turns");
    assert!(turns[2].parse::<f64>().unwrap() >= 1.0, "{log}");
}

#[test]
fn remote_config_keys_are_checked() {
    use concord::config::Config;
    let base = "[run]\nsteps = 1\n[model]\nname = \"tiny\"\n";
    let ok = format!("{base}[env]\nurl = \"ws://127.0.0.1:1\"\nmode = \"episode\"\n");
    Config::from_toml_str(&ok, "t.toml", &[]).unwrap();
    for (bad, says) in [
        ("[env]\nurl = \"ws://h:1\"\n", "continue_with = \"model\""),
        (
            "[env]\nurl = \"ws://h:1\"\nmode = \"episode\"\n[[stage]]\nname = \"a\"\n\
             [stage.options.x]\npeers = \"dumb\"\n",
            "the [env] url server takes its options",
        ),
        ("[env]\nurl = \"wss://h:1\"\nmode = \"episode\"\n", "TLS"),
        // Issue 54, item 13: no port, a port past 65535, a query.
        (
            "[env]\nurl = \"ws://127.0.0.1\"\nmode = \"episode\"\n",
            "names no port",
        ),
        (
            "[env]\nurl = \"ws://h:99999\"\nmode = \"episode\"\n",
            "not a TCP port",
        ),
        (
            "[env]\nurl = \"ws://h:1?x=1\"\nmode = \"episode\"\n",
            "a query",
        ),
        (
            "[env]\nurl = \"ws://h:1\"\nmode = \"episode\"\n[sft]\nwarm_start = true\n\
             source = \"env\"\n",
            "sft.source",
        ),
        (
            "[env]\nurl = \"ws://h:1\"\nmode = \"episode\"\n[env.options]\npeers = \"dumb\"\n",
            "concord serve",
        ),
        ("[env]\nname = \"ticketmelt\"\nmax_steps = 3\n", "url"),
        ("[env]\nname = \"ticketmelt\"\ntimeout = 5.0\n", "url"),
        (
            "[env]\nurl = \"ws://h:1\"\nmode = \"episode\"\ntimeout = 0.0\n",
            "env.timeout",
        ),
        (
            "[env]\nurl = \"ws://h:1\"\nmode = \"episode\"\ntimeout = nan\n",
            "env.timeout",
        ),
        ("[env]\nmode = \"episode\"\n", "url = "),
        (
            "[env]\nurl = \"ws://h:1\"\nmode = \"episode\"\nactoin_key = \"m\"\n",
            "actoin_key",
        ),
    ] {
        let err = format!(
            "{:#}",
            Config::from_toml_str(&format!("{base}{bad}"), "t.toml", &[]).unwrap_err()
        );
        assert!(err.contains(says), "{bad}: {err}");
        if !bad.starts_with("[env]\nmode") {
            assert!(err.contains("line "), "{bad}: {err}");
        }
    }
}

/// Issue #31, item 14: a server that accepts the connection and never answers (before
/// the handshake, or after it) fails the step within `[env] timeout`, with a line on
/// stderr while it waits; by default within a minute (it took 242 s).
#[test]
fn a_silent_server_fails_within_its_timeout_and_says_so_while_waiting() {
    use std::net::TcpListener;
    assert!(RemoteSpec::new("ws://h:1").timeout <= Duration::from_secs(30));
    for handshake in [false, true] {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("ws://{}", listener.local_addr().unwrap());
        let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = accepted.clone();
        let holder = std::thread::spawn(move || {
            let mut held = Vec::new();
            while let Ok((s, _)) = listener.accept() {
                count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                if handshake {
                    held.push(Some(tungstenite::accept(s).unwrap()));
                    continue;
                }
                std::mem::forget(s);
                held.push(None);
            }
        });
        let dir = tempfile::tempdir().unwrap();
        let cfg = remote_config(dir.path(), &url, 1);
        let text = std::fs::read_to_string(&cfg).unwrap() + "timeout = 2.0\n";
        std::fs::write(&cfg, text).unwrap();
        let t0 = std::time::Instant::now();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_concord"))
            .args(["train", "--config", cfg.to_str().unwrap()])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{err}");
        let what = if handshake { "`reset`" } else { "handshake" };
        assert!(
            err.contains("within 2 s ([env] timeout)") && err.contains(what),
            "{err}"
        );
        assert!(err.contains("waiting for the OpenEnv server"), "{err}");
        assert!(t0.elapsed() < Duration::from_secs(60), "{:?}", t0.elapsed());
        // Issue 54, item 9: one session, so one wait. The component names were asked
        // for by playing an episode first, which waited a whole timeout in a session of
        // its own: 7.2 s here instead of 5.2, and 12-13 s at `timeout = 5`.
        let sessions = accepted.load(std::sync::atomic::Ordering::SeqCst);
        assert_eq!(sessions, 1, "handshake {handshake}: {sessions} connections");
        drop(holder);
    }
}

/// Issue #31, item 17: an HTTP body over the limit gets a JSON 413 like every other
/// error, and an upload that stalls gets 408 instead of holding its connection forever.
#[test]
fn http_bodies_are_bounded_in_size_and_time() {
    use std::io::{Read, Write};
    let mut o = ServeOptions::new("ticketmelt");
    o.port = 0;
    o.max_frame_bytes = 1024;
    o.request_timeout = Duration::from_secs(1);
    let h = spawn(&o).unwrap();
    let big = format!(r#"{{"message":"{}"}}"#, "x".repeat(4096));
    let (code, v) = post(&h, "/step", &big);
    assert_eq!(code, 413, "{v}");
    assert!(
        v["detail"].as_str().unwrap().contains("--max-frame-bytes"),
        "{v}"
    );

    let mut tcp = TcpStream::connect(h.addr).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let head = "POST /reset HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
                Content-Length: 100\r\n\r\n{\"seed\":";
    tcp.write_all(head.as_bytes()).unwrap();
    let t0 = std::time::Instant::now();
    // the whole answer, whether or not the server then closes the connection
    let mut reply = String::new();
    let mut buf = [0u8; 4096];
    while !(reply.contains("\r\n\r\n") && reply.ends_with('}')) {
        match tcp.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => reply.push_str(&String::from_utf8_lossy(&buf[..n])),
        }
    }
    assert!(reply.starts_with("HTTP/1.1 408"), "{reply}");
    assert!(reply.contains("\"detail\""), "{reply}");
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    assert_eq!(health(&h), json!({"status": "healthy"}));
}

/// Issue #54, item 10: connections that send half a request header (slowloris) are
/// closed once the request timeout passes, while a WebSocket session opened before
/// them and quiet for as long plays on, and the server still answers.
#[test]
fn half_sent_headers_are_closed_after_the_request_timeout() {
    use std::io::{Read, Write};
    let h = serve_process(&["--request-timeout", "1"], std::process::Stdio::null());
    let mut ws = connect(&h);
    assert_eq!(
        send(&mut ws, r#"{"type":"reset","data":{"seed":3}}"#)["type"],
        "observation"
    );
    let mut slow: Vec<TcpStream> = (0..20)
        .map(|_| {
            let mut tcp = TcpStream::connect(h.at()).unwrap();
            tcp.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
            tcp.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ")
                .unwrap();
            tcp
        })
        .collect();
    let idle = TcpStream::connect(h.at()).unwrap(); // sends nothing at all
    idle.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    slow.push(idle);
    let t0 = std::time::Instant::now();
    for tcp in &mut slow {
        let mut buf = [0u8; 256];
        // closed: end of stream (or a reset), and no answer to the half request
        match tcp.read(&mut buf) {
            Ok(n) => assert_eq!(n, 0, "{}", String::from_utf8_lossy(&buf[..n])),
            Err(e) => assert_ne!(e.kind(), std::io::ErrorKind::WouldBlock, "still open"),
        }
    }
    let waited = t0.elapsed();
    assert!(waited < Duration::from_secs(10), "{waited:?}");
    let v = send(
        &mut ws,
        &format!(
            r#"{{"type":"step","data":{{"message":{}}}}}"#,
            json!(text(3, 0))
        ),
    );
    assert_eq!(v["type"], "observation", "{v}");
    assert_eq!(health(&h), json!({"status": "healthy"}));
}

/// Issue #54, item 10: a client that only creates MCP sessions cannot hold every slot
/// for the whole session timeout: a session never used goes 30 s after its create,
/// while one a tool call has used stays.
#[test]
fn mcp_sessions_never_used_free_their_slots() {
    let h = serve_process(&["--max-sessions", "3"], std::process::Stdio::null());
    let ids: Vec<String> = (0..3)
        .map(|i| {
            let r = rpc(&h, i, "openenv/session/create", json!({})).unwrap();
            r["session_id"].as_str().unwrap().to_string()
        })
        .collect();
    let full = rpc(&h, 3, "openenv/session/create", json!({})).unwrap_err();
    assert!(
        full["message"].as_str().unwrap().contains("capacity"),
        "{full}"
    );
    let used = json!({"session_id": ids[0]});
    rpc(&h, 4, "tools/list", used.clone()).unwrap();
    std::thread::sleep(Duration::from_secs(20));
    rpc(&h, 5, "tools/list", used.clone()).unwrap();
    std::thread::sleep(Duration::from_secs(11));
    // 31 s after their create, the two unused sessions are gone
    for i in 6..8 {
        rpc(&h, i, "openenv/session/create", json!({})).unwrap();
    }
    rpc(&h, 8, "tools/list", used).unwrap();
    let gone = rpc(&h, 9, "tools/list", json!({"session_id": ids[1]})).unwrap_err();
    assert!(
        gone["message"]
            .as_str()
            .unwrap()
            .contains("Unknown session_id"),
        "{gone}"
    );
}

#[test]
fn sigterm_closes_sessions_and_exits_cleanly() {
    let served = serve_process(&[], std::process::Stdio::piped());
    let addr = served.addr;
    let child = served.take();
    let (mut ws, _) = tungstenite::connect(format!("ws://{addr}/ws")).unwrap();
    send(&mut ws, r#"{"type":"reset","data":{"seed":1}}"#);
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    // the open session is told the server is going away
    let close = loop {
        match ws.read() {
            Ok(Message::Close(c)) => break c,
            Ok(_) => continue,
            Err(e) => panic!("no close frame: {e}"),
        }
    };
    assert_eq!(close.map(|c| u16::from(c.code)), Some(1001));
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let logs = String::from_utf8_lossy(&out.stderr);
    assert!(
        logs.contains("session opened") && logs.contains("stopped"),
        "{logs}"
    );
}

/// Every file under `dir`, with its path.
fn files_under(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = vec![];
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(files_under(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// Issue #54, item 5: the password in `env.url` reaches no output that a run or an
/// eval writes: not stdout or stderr, not the logs, the reports, the samples or the
/// transcripts. The one exception is the run's own `config.toml`, which `--resume`
/// reads to reach the server again (and `concord export` redacts).
#[test]
fn credentials_in_env_url_reach_no_output() {
    let h = server(64, None);
    let url = format!("ws://user:s3cret@{}", h.addr);
    let dir = tempfile::tempdir().unwrap();
    let p = remote_decision_config(dir.path(), &url, 2);
    let text = std::fs::read_to_string(&p).unwrap().replace(
        "save_every = 0\n",
        "save_every = 1\neval_every = 1\neval_episodes = 2\nlog_samples = 2\n",
    );
    std::fs::write(&p, text).unwrap();
    let bin = env!("CARGO_BIN_EXE_concord");
    let run = std::process::Command::new(bin)
        .args(["train", "--config"])
        .arg(&p)
        .output()
        .unwrap();
    assert!(run.status.success(), "{run:?}");
    let run_dir = dir.path().join("remote");
    let out = dir.path().join("eval");
    std::fs::create_dir(&out).unwrap();
    let eval = std::process::Command::new(bin)
        .args(["eval", "--episodes", "2", "--transcripts", "--config"])
        .arg(run_dir.join("config.toml"))
        .arg("--adapter")
        .arg(&run_dir)
        .arg("--out")
        .arg(out.join("eval.json"))
        .output()
        .unwrap();
    assert!(eval.status.success(), "{eval:?}");
    let mut seen = 0;
    for (name, bytes) in [
        ("train stdout", run.stdout),
        ("train stderr", run.stderr),
        ("eval stdout", eval.stdout),
        ("eval stderr", eval.stderr),
    ] {
        let s = String::from_utf8_lossy(&bytes);
        assert!(!s.contains("s3cret"), "{name}: {s}");
        seen += s.contains("ws://***@") as usize;
    }
    let mut files = files_under(&run_dir);
    files.extend(files_under(&out));
    let mut names = vec![];
    for f in &files {
        let bytes = std::fs::read(f).unwrap();
        let text = if f.extension().is_some_and(|e| e == "gz") {
            use std::io::Read;
            let mut s = String::new();
            flate2::read::GzDecoder::new(&bytes[..])
                .read_to_string(&mut s)
                .unwrap();
            s
        } else {
            String::from_utf8_lossy(&bytes).into_owned()
        };
        let rel = f.strip_prefix(dir.path()).unwrap().display().to_string();
        if rel.ends_with("config.toml") {
            assert!(text.contains("s3cret"), "{rel} keeps the URL for --resume");
            continue;
        }
        assert!(!text.contains("s3cret"), "{rel}: {text}");
        seen += text.contains("ws://***@") as usize;
        names.push(rel);
    }
    // The redacted URL is what names the server where a name is written.
    assert!(seen >= 3, "{seen} outputs name the server: {names:?}");
    for want in ["eval_log.csv", "eval.json", "transcripts.jsonl"] {
        assert!(
            names.iter().any(|n| n.ends_with(want)),
            "{want} in {names:?}"
        );
    }
}

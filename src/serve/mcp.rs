//! MCP tools over JSON-RPC 2.0 (`POST /mcp`, and `{"type":"mcp"}` WebSocket frames),
//! as openenv-core 0.3 serves them: `tools/list` and `tools/call`; and over `POST /mcp`
//! openenv 0.10's sessions: `openenv/session/create` and `openenv/session/close`, and
//! `params.session_id` on a tool call to reach one (see [`super::registry`]).
//!
//! A tool call's result carries the step's whole reply (observation, reward, done) as
//! `data`, where openenv's `MCPToolClient.call_tool` returns it from, and as MCP's
//! `structuredContent`. A refused call (acting before a reset or after the end) is a
//! JSON-RPC error -32603, as openenv 0.10's servers answer a tool that raises, so that
//! the Python client raises instead of returning quietly.
//!
//! The tools are the environment's actions for an agent in production, next to the
//! simulation API: `act` (answer for the seat on the move), `observe` (the current
//! observation) and `rules` (the environment's description). The simulation verbs
//! (`reset`, `step`, `state`, `close`) are reserved by OpenEnv (RFC 003) so that an
//! agent cannot reset its own episode: calling them as tools is refused.
use super::protocol::Action;
use super::registry::{self, Closed};
use super::session::{Session, StepReply};
use super::App;
use serde_json::{json, Value};

/// Tool names OpenEnv reserves for the simulation API.
pub const RESERVED: [&str; 4] = ["reset", "step", "state", "close"];

// JSON-RPC 2.0 error codes.
pub const PARSE_ERROR: i64 = -32700;
pub const INVALID_REQUEST: i64 = -32600;
pub const METHOD_NOT_FOUND: i64 = -32601;
pub const INVALID_PARAMS: i64 = -32602;
pub const INTERNAL_ERROR: i64 = -32603;
/// Implementation-defined server error: openenv's "Server at capacity".
pub const SERVER_ERROR: i64 = -32000;

/// Answer the raw body of `POST /mcp`: session lifecycle here, tools on the session
/// `params.session_id` names, else on the server's one HTTP session.
pub fn handle_http(app: &App, body: &[u8]) -> Value {
    let req = match serde_json::from_slice::<Value>(body) {
        Ok(v) => v,
        Err(e) => return error(Value::Null, PARSE_ERROR, &format!("Parse error: {e}")),
    };
    app.registry.reap(app.idle);
    let Ok((id, method, params)) = request(&req) else {
        return handle(&mut super::http::http_session(app), &req);
    };
    let sid = params
        .get("session_id")
        .map(|v| v.as_str().unwrap_or_default());
    match (method, sid) {
        ("openenv/session/create", _) => create(app, id),
        ("openenv/session/close", None) => error(
            id,
            INVALID_PARAMS,
            "Invalid params - 'session_id' is required",
        ),
        ("openenv/session/close", Some(s)) => match app.registry.close(s) {
            Some(Closed::Now) => ok(id, json!({"session_id": s, "closed": true})),
            Some(Closed::OnDetach) => ok(
                id,
                json!({"session_id": s, "closed": false, "closing": true}),
            ),
            None => error(id, INVALID_PARAMS, &format!("Unknown session_id: {s}")),
        },
        (_, Some(s)) => match app.registry.get(s) {
            Some(session) => handle(&mut registry::lock(&session), &req),
            None => error(id, INVALID_PARAMS, &format!("Unknown session_id: {s}")),
        },
        (_, None) => handle(&mut super::http::http_session(app), &req),
    }
}

fn create(app: &App, id: Value) -> Value {
    let session = Session::new(app.factory.clone());
    match app.registry.create(session, &app.slots) {
        Some(sid) => ok(id, json!({"session_id": sid})),
        None => {
            let n = app.max_sessions;
            let mut e = error(
                id,
                SERVER_ERROR,
                &format!(
                    "Server at capacity: {n}/{n} sessions active. Cannot accept new \
                     connections (concord serve --max-sessions)."
                ),
            );
            e["error"]["data"] = json!({"active_sessions": n, "max_sessions": n});
            e
        }
    }
}

/// Answer one JSON-RPC request.
pub fn handle(session: &mut Session, req: &Value) -> Value {
    let (id, method, params) = match request(req) {
        Ok(r) => r,
        Err(msg) => {
            let id = req
                .get("id")
                .filter(|i| is_id(i))
                .cloned()
                .unwrap_or(Value::Null);
            return error(id, INVALID_REQUEST, &format!("Invalid request: {msg}"));
        }
    };
    match method {
        "tools/list" => ok(id, json!({"tools": tools(session)})),
        "tools/call" => call(session, id, &params),
        other => error(id, METHOD_NOT_FOUND, &format!("Method not found: {other}")),
    }
}

/// `(id, method, params)` of a well-formed request (`JsonRpcRequest`, extra keys
/// forbidden).
fn request(req: &Value) -> Result<(Value, &str, Value), String> {
    let obj = req.as_object().ok_or("a request is a JSON object")?;
    if let Some(k) = obj
        .keys()
        .find(|k| !["jsonrpc", "method", "params", "id"].contains(&k.as_str()))
    {
        return Err(format!("unknown field `{k}`"));
    }
    if obj.get("jsonrpc") != Some(&json!("2.0")) {
        return Err("`jsonrpc` must be \"2.0\"".into());
    }
    let method = obj
        .get("method")
        .and_then(Value::as_str)
        .ok_or("`method` must be a string")?;
    let id = obj.get("id").cloned().unwrap_or(Value::Null);
    if !is_id(&id) {
        return Err("`id` must be a string, an integer or null".into());
    }
    let params = match obj.get("params") {
        None => json!({}),
        Some(p @ Value::Object(_)) => p.clone(),
        Some(_) => return Err("`params` must be an object".into()),
    };
    Ok((id, method, params))
}

fn is_id(v: &Value) -> bool {
    v.is_null() || v.is_string() || v.is_i64() || v.is_u64()
}

fn tools(session: &Session) -> Value {
    let env = session.factory().name();
    json!([
        {
            "name": "act",
            "description": format!("Answer for the seat on the move in `{env}` (the text a \
                model would write; see the `rules` tool). Returns the next observation."),
            "inputSchema": {
                "type": "object",
                "properties": {"message": {"type": "string"}},
                "required": ["message"],
                "additionalProperties": false
            }
        },
        {
            "name": "observe",
            "description": "The current observation of the seat on the move.",
            "inputSchema": {"type": "object", "properties": {}, "additionalProperties": false}
        },
        {
            "name": "rules",
            "description": format!("The rules, actions and rewards of `{env}`."),
            "inputSchema": {"type": "object", "properties": {}, "additionalProperties": false}
        }
    ])
}

fn call(session: &mut Session, id: Value, params: &Value) -> Value {
    let Some(name) = params.get("name").and_then(Value::as_str) else {
        return error(id, INVALID_PARAMS, "Missing 'name' in params");
    };
    if RESERVED.contains(&name) {
        return error(
            id,
            INVALID_PARAMS,
            &format!(
                "`{name}` is a reserved name (reset, step, state, close belong to the \
                 simulation API: POST /{name} or the /ws WebSocket), not a tool"
            ),
        );
    }
    let args = params
        .get("arguments")
        .cloned()
        .unwrap_or_else(|| json!({}));
    let result = match name {
        "act" => Action::from_value(&args).and_then(|a| session.step(a.message)),
        "observe" => session.observation(),
        "rules" => {
            let text = session.factory().describe();
            return ok(id, tool_text(text.clone(), json!(text)));
        }
        other => {
            return error(id, INVALID_PARAMS, &format!("Tool not found: {other}"));
        }
    };
    match result {
        Ok(reply) => ok(id, tool_result(reply)),
        Err(e) => error(
            id,
            INTERNAL_ERROR,
            &format!("Error calling tool '{name}': {}", e.message),
        ),
    }
}

/// An MCP `CallToolResult`: the observation's new text as content, the whole reply as
/// structured content and as openenv's `data`.
fn tool_result(reply: StepReply) -> Value {
    let text = reply.observation["prompt"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let whole = reply.to_json();
    let mut v = tool_text(text, whole.clone());
    v["structuredContent"] = whole;
    v
}

fn tool_text(text: String, data: Value) -> Value {
    json!({"content": [{"type": "text", "text": text}], "isError": false, "data": data})
}

fn ok(id: Value, result: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "result": result})
}

fn error(id: Value, code: i64, message: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message, "data": null}})
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envs::{create, Options};
    use crate::serve::protocol::ResetParams;
    use std::sync::Arc;

    #[test]
    fn tools_list_call_and_refusals() {
        let mut s = Session::new(Arc::from(create("ticketmelt", &Options::new()).unwrap()));
        let list = handle(
            &mut s,
            &json!({"jsonrpc": "2.0", "method": "tools/list", "id": 1}),
        );
        let names: Vec<&str> = list["result"]["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["act", "observe", "rules"]);
        assert!(names.iter().all(|n| !RESERVED.contains(n)));
        let act = json!({"jsonrpc": "2.0", "method": "tools/call", "id": "a",
                         "params": {"name": "act", "arguments": {"message": "MONITOR"}}});
        let before = handle(&mut s, &act);
        assert_eq!(
            before["error"]["code"], INTERNAL_ERROR,
            "before reset: {before}"
        );
        assert!(before["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("Error calling tool 'act': "));
        s.reset(ResetParams::default());
        let r = handle(&mut s, &act);
        assert_eq!(r["id"], "a");
        assert_eq!(r["result"]["isError"], false);
        assert_eq!(r["result"]["structuredContent"]["observation"]["step"], 1);
        assert_eq!(r["result"]["data"], r["result"]["structuredContent"]);
        assert!(r["result"]["data"]["done"].is_boolean());
        for name in RESERVED {
            let r = handle(
                &mut s,
                &json!({"jsonrpc": "2.0", "method": "tools/call", "id": 2, "params": {"name": name}}),
            );
            assert_eq!(r["error"]["code"], INVALID_PARAMS, "{name}");
        }
        let r = handle(
            &mut s,
            &json!({"jsonrpc": "2.0", "method": "nope", "id": 3}),
        );
        assert_eq!(r["error"]["code"], METHOD_NOT_FOUND);
        let r = handle(&mut s, &json!({"jsonrpc": "1.0", "method": "tools/list"}));
        assert_eq!(r["error"]["code"], INVALID_REQUEST);
    }
}

//! MCP tools over JSON-RPC 2.0 (`POST /mcp`, and `{"type":"mcp"}` WebSocket frames),
//! as openenv-core 0.3 serves them: `tools/list` and `tools/call`.
//!
//! The tools are the environment's actions for an agent in production, next to the
//! simulation API: `act` (answer for the seat on the move), `observe` (the current
//! observation) and `rules` (the environment's description). The simulation verbs
//! (`reset`, `step`, `state`, `close`) are reserved by OpenEnv (RFC 003) so that an
//! agent cannot reset its own episode: calling them as tools is refused.
use super::protocol::{Action, WireError};
use super::session::{Session, StepReply};
use serde_json::{json, Value};

/// Tool names OpenEnv reserves for the simulation API.
pub const RESERVED: [&str; 4] = ["reset", "step", "state", "close"];

// JSON-RPC 2.0 error codes.
pub const PARSE_ERROR: i64 = -32700;
pub const INVALID_REQUEST: i64 = -32600;
pub const METHOD_NOT_FOUND: i64 = -32601;
pub const INVALID_PARAMS: i64 = -32602;

/// Answer the raw body of `POST /mcp`.
pub fn handle_text(session: &mut Session, body: &[u8]) -> Value {
    match serde_json::from_slice::<Value>(body) {
        Ok(v) => handle(session, &v),
        Err(e) => error(Value::Null, PARSE_ERROR, &format!("Parse error: {e}")),
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
            return ok(id, tool_text(session.factory().describe(), None, false));
        }
        other => {
            return error(id, INVALID_PARAMS, &format!("Tool not found: {other}"));
        }
    };
    ok(id, tool_result(result))
}

/// An MCP `CallToolResult`: the observation's new text as content, the whole reply as
/// structured content; a refusal is a tool error (`isError`), not a protocol error.
fn tool_result(r: Result<StepReply, WireError>) -> Value {
    match r {
        Ok(reply) => {
            let text = reply.observation["prompt"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            tool_text(text, Some(reply.to_json()), false)
        }
        Err(e) => tool_text(e.message, None, true),
    }
}

fn tool_text(text: String, structured: Option<Value>, is_error: bool) -> Value {
    let mut v = json!({"content": [{"type": "text", "text": text}], "isError": is_error});
    if let Some(s) = structured {
        v["structuredContent"] = s;
    }
    v
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
        assert_eq!(
            handle(&mut s, &act)["result"]["isError"],
            true,
            "before reset"
        );
        s.reset(ResetParams::default());
        let r = handle(&mut s, &act);
        assert_eq!(r["id"], "a");
        assert_eq!(r["result"]["isError"], false);
        assert_eq!(r["result"]["structuredContent"]["observation"]["step"], 1);
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
        assert_eq!(handle_text(&mut s, b"{nope")["error"]["code"], PARSE_ERROR);
    }
}

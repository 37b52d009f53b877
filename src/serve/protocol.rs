//! The OpenEnv wire format, as openenv-core 0.3 defines it (`env_server/types.py`,
//! `http_server.py`, `mcp_types.py`): what a client may send, what the server answers,
//! and the JSON Schemas `GET /schema` publishes.
//!
//! Incoming frames are parsed from a `serde_json::Value` by hand rather than derived,
//! because each way a frame can be wrong has its own OpenEnv error code, and pydantic's
//! rules (`extra="forbid"` on messages and actions, `ge=0` on seeds, `max_length=255`
//! on ids) must be mirrored exactly for Python clients to see the same refusals.
use serde_json::{json, Map, Value};

/// The `code` of a WebSocket `error` reply (`WSErrorCode` in openenv-core).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    /// The frame is not JSON.
    InvalidJson,
    /// The frame has no `type`, or one the server does not know.
    UnknownType,
    /// The frame's shape is wrong: extra keys, a missing or mistyped field.
    ValidationError,
    /// The message was well formed but could not be carried out (e.g. `step` before
    /// `reset`, or after the episode ended).
    ExecutionError,
    /// `--max-sessions` sessions are open already.
    CapacityReached,
    /// The session itself failed: idle timeout, an oversized or broken frame.
    SessionError,
}

impl ErrorCode {
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::InvalidJson => "INVALID_JSON",
            ErrorCode::UnknownType => "UNKNOWN_TYPE",
            ErrorCode::ValidationError => "VALIDATION_ERROR",
            ErrorCode::ExecutionError => "EXECUTION_ERROR",
            ErrorCode::CapacityReached => "CAPACITY_REACHED",
            ErrorCode::SessionError => "SESSION_ERROR",
        }
    }
}

/// A refusal: its code and a message for the client.
#[derive(Debug, Clone, PartialEq)]
pub struct WireError {
    pub code: ErrorCode,
    pub message: String,
}

impl WireError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
    fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::ValidationError, message)
    }
    /// The WebSocket `error` reply.
    pub fn to_frame(&self) -> Value {
        json!({"type": "error", "data": {"message": self.message, "code": self.code.as_str()}})
    }
    /// FastAPI's 422 body: `{"detail": [{"loc", "msg", "type"}]}`.
    pub fn to_detail(&self, loc: &[&str]) -> Value {
        json!({"detail": [{"loc": loc, "msg": self.message, "type": "value_error"}]})
    }
}

/// `reset` parameters (`ResetRequest`): both optional; other keys are ignored, as
/// openenv-core drops keys its environment's `reset` does not take.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ResetParams {
    pub seed: Option<u64>,
    pub episode_id: Option<String>,
}

/// An action (`Action` with one field): the text the acting seat answers.
#[derive(Debug, Clone, PartialEq)]
pub struct Action {
    pub message: String,
}

/// A parsed WebSocket frame (`WSIncomingMessage` plus `mcp`).
#[derive(Debug, Clone, PartialEq)]
pub enum Incoming {
    Reset(ResetParams),
    Step(Action),
    State,
    Close,
    /// A JSON-RPC 2.0 request for the session's MCP tools.
    Mcp(Value),
}

/// The longest `episode_id` / `request_id` openenv-core accepts.
pub const MAX_ID_LEN: usize = 255;

impl Incoming {
    /// Parse one text frame; each failure carries the code a Python server would send.
    pub fn parse(text: &str) -> Result<Self, WireError> {
        let v: Value = serde_json::from_str(text)
            .map_err(|e| WireError::new(ErrorCode::InvalidJson, format!("Invalid JSON: {e}")))?;
        let Value::Object(obj) = v else {
            return Err(WireError::invalid("a message is a JSON object"));
        };
        let kind = match obj.get("type") {
            Some(Value::String(s)) => s.as_str(),
            Some(_) => {
                return Err(WireError::new(
                    ErrorCode::UnknownType,
                    "`type` must be a string",
                ))
            }
            None => {
                return Err(WireError::new(
                    ErrorCode::UnknownType,
                    "Unknown message type: missing `type`",
                ))
            }
        };
        match kind {
            "reset" => {
                only_keys(&obj, &["type", "data"], "")?;
                match obj.get("data") {
                    None | Some(Value::Null) => Ok(Incoming::Reset(ResetParams::default())),
                    Some(Value::Object(d)) => Ok(Incoming::Reset(ResetParams::from_map(d)?)),
                    Some(_) => Err(WireError::invalid("`data` must be an object")),
                }
            }
            "step" => {
                only_keys(&obj, &["type", "data"], "")?;
                match obj.get("data") {
                    Some(d) => Ok(Incoming::Step(Action::from_value(d)?)),
                    None => Err(WireError::invalid("`data` (the action) is required")),
                }
            }
            "state" => {
                only_keys(&obj, &["type"], "")?;
                Ok(Incoming::State)
            }
            "close" => {
                only_keys(&obj, &["type"], "")?;
                Ok(Incoming::Close)
            }
            "mcp" => {
                only_keys(&obj, &["type", "data"], "")?;
                match obj.get("data") {
                    Some(d @ Value::Object(_)) => Ok(Incoming::Mcp(d.clone())),
                    _ => Err(WireError::invalid(
                        "`data` must be a JSON-RPC request object",
                    )),
                }
            }
            other => Err(WireError::new(
                ErrorCode::UnknownType,
                format!("Unknown message type: {}", truncate(other, 64)),
            )),
        }
    }
}

impl ResetParams {
    /// From a `reset` body or `data` object.
    pub fn from_map(d: &Map<String, Value>) -> Result<Self, WireError> {
        let seed = match d.get("seed") {
            None | Some(Value::Null) => None,
            Some(v) => Some(v.as_u64().ok_or_else(|| {
                WireError::invalid(format!(
                    "`seed` must be an integer >= 0 (at most 2^64-1), got {v}"
                ))
            })?),
        };
        let episode_id = optional_id(d, "episode_id")?;
        Ok(Self { seed, episode_id })
    }
}

impl Action {
    /// From a step's action object: `message` (a string) and, as in openenv-core's
    /// `Action`, an optional `metadata` object; any other key is refused.
    pub fn from_value(v: &Value) -> Result<Self, WireError> {
        let Value::Object(a) = v else {
            return Err(WireError::invalid(
                "the action must be an object: {\"message\": \"...\"}",
            ));
        };
        only_keys(a, &["message", "metadata"], "action ")?;
        if let Some(m) = a.get("metadata") {
            if !m.is_object() {
                return Err(WireError::invalid("action `metadata` must be an object"));
            }
        }
        match a.get("message") {
            Some(Value::String(s)) => Ok(Action { message: s.clone() }),
            Some(other) => Err(WireError::invalid(format!(
                "action `message` must be a string, got {}",
                kind_of(other)
            ))),
            None => Err(WireError::invalid("action `message` is required")),
        }
    }
}

/// `POST /step`'s body (`StepRequest`): `action` plus optional `timeout_s` and
/// `request_id`; other keys are allowed and ignored.
pub fn parse_step_request(body: &Value) -> Result<Action, (WireError, &'static [&'static str])> {
    let Value::Object(b) = body else {
        return Err((
            WireError::invalid("the body must be a JSON object"),
            &["body"],
        ));
    };
    if let Some(t) = b.get("timeout_s") {
        if !t.is_null() && !t.as_f64().is_some_and(|x| x > 0.0) {
            return Err((
                WireError::invalid("`timeout_s` must be a number > 0"),
                &["body", "timeout_s"],
            ));
        }
    }
    optional_id(b, "request_id").map_err(|e| (e, &["body", "request_id"][..]))?;
    match b.get("action") {
        Some(a) => Action::from_value(a).map_err(|e| (e, &["body", "action"][..])),
        None => Err((WireError::invalid("Field required"), &["body", "action"])),
    }
}

fn optional_id(d: &Map<String, Value>, key: &str) -> Result<Option<String>, WireError> {
    match d.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.chars().count() <= MAX_ID_LEN => Ok(Some(s.clone())),
        Some(Value::String(_)) => Err(WireError::invalid(format!(
            "`{key}` is longer than {MAX_ID_LEN} characters"
        ))),
        Some(v) => Err(WireError::invalid(format!(
            "`{key}` must be a string, got {}",
            kind_of(v)
        ))),
    }
}

fn only_keys(obj: &Map<String, Value>, allowed: &[&str], what: &str) -> Result<(), WireError> {
    match obj.keys().find(|k| !allowed.contains(&k.as_str())) {
        Some(k) => Err(WireError::invalid(format!(
            "unknown {what}field `{}` (allowed: {})",
            truncate(k, 64),
            allowed.join(", ")
        ))),
        None => Ok(()),
    }
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// At most `n` characters of a client-supplied string, for echoing it in an error.
fn truncate(s: &str, n: usize) -> String {
    match s.char_indices().nth(n) {
        Some((i, _)) => format!("{}...", &s[..i]),
        None => s.to_string(),
    }
}

/// The JSON Schemas of `GET /schema`: action, observation and state.
pub fn schemas(env: &str) -> Value {
    json!({
        "action": {
            "title": "ConcordAction",
            "description": format!("The text the seat on the move answers in `{env}` \
                (parsed by the environment; malformed text plays its documented default)"),
            "type": "object",
            "properties": {
                "message": {"type": "string", "description": "the seat's answer, as a model writes it"},
                "metadata": {"type": "object", "description": "ignored"}
            },
            "required": ["message"],
            "additionalProperties": false
        },
        "observation": {
            "title": "ConcordObservation",
            "type": "object",
            "properties": {
                "seat": {"type": "integer", "description": "the seat the next action is for (the last to act once done)"},
                "messages": {"type": "array", "items": {
                    "type": "object",
                    "properties": {"role": {"type": "string"}, "content": {"type": "string"}},
                    "required": ["role", "content"]
                }, "description": "the seat's observation as chat messages (system + user)"},
                "prompt": {"type": "string", "description": "the last message's text: the new part of this turn"},
                "step": {"type": "integer", "description": "actions taken this episode"},
                "valid": {"type": ["boolean", "null"], "description": "whether the last action parsed (null: not played yet)"},
                "feedback": {"type": "string", "description": "why the last action was invalid and what was played instead"},
                "rewards": {"type": "array", "description": "once done: every policy seat's final reward",
                    "items": {"type": "object", "properties": {
                        "seat": {"type": "integer"}, "scalar": {"type": "number"},
                        "components": {"type": "object", "additionalProperties": {"type": "number"}}
                    }}},
                "done": {"type": "boolean"},
                "reward": {"type": ["number", "null"], "description": "the acting seat's step reward"}
            },
            "required": ["seat", "messages", "prompt", "step"]
        },
        "state": {
            "title": "ConcordState",
            "type": "object",
            "properties": {
                "episode_id": {"type": ["string", "null"]},
                "step_count": {"type": "integer", "minimum": 0},
                "env": {"type": "string"},
                "seed": {"type": ["integer", "null"]},
                "done": {"type": "boolean"},
                "to_act": {"type": "array", "items": {"type": "integer"}},
                "transcript": {"description": "enough to replay the episode in-process: seed and steps"}
            },
            "required": ["step_count"]
        }
    })
}

/// The OpenAPI document of the HTTP routes (`GET /openapi.json`, as FastAPI serves
/// openenv's): openenv 0.10's validator reads `info.version` and tells simulation mode
/// from `/reset`, `/step` and `/state` among the paths. `info.version` is the OpenEnv
/// HTTP standard's ("1.0.0", what openenv's own servers publish), not Concord's.
/// WebSocket routes (`/ws`) have no place in OpenAPI and are not listed.
pub fn openapi(env: &str) -> Value {
    let s = schemas(env);
    let body = |schema: &str| json!({"required": true, "content": {"application/json": {"schema": {"$ref": format!("#/components/schemas/{schema}")}}}});
    let op = |summary: &str, ok: Value| {
        json!({"summary": summary, "responses": {
            "200": {"description": "Successful Response", "content": {"application/json": {"schema": ok}}},
            "422": {"description": "Validation Error"}
        }})
    };
    let reply = json!({"type": "object", "properties": {
        "observation": {"$ref": "#/components/schemas/ConcordObservation"},
        "reward": {"type": ["number", "null"]},
        "done": {"type": "boolean"}
    }});
    let any = json!({"type": "object"});
    let mut reset = op("Reset the HTTP session's episode", reply.clone());
    reset["requestBody"] = json!({"required": false, "content": {"application/json": {"schema": {
        "type": "object", "properties": {"seed": {"type": "integer", "minimum": 0}, "episode_id": {"type": "string"}}
    }}}});
    let mut step = op("Step the HTTP session's episode", reply);
    step["requestBody"] = body("StepRequest");
    let mut mcp = op("JSON-RPC 2.0: MCP tools and openenv sessions", any.clone());
    mcp["requestBody"] =
        json!({"required": true, "content": {"application/json": {"schema": {"type": "object"}}}});
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": format!("Concord OpenEnv server ({env})"),
            "version": "1.0.0",
            "description": format!("`concord serve {env}` (Concord {}): OpenEnv's HTTP, WebSocket (/ws) and MCP (/mcp) protocol", env!("CARGO_PKG_VERSION"))
        },
        "paths": {
            "/reset": {"post": reset},
            "/step": {"post": step},
            "/state": {"get": op("The HTTP session's state", json!({"$ref": "#/components/schemas/ConcordState"}))},
            "/health": {"get": op("Health", json!({"type": "object", "properties": {"status": {"type": "string"}}}))},
            "/metadata": {"get": op("Environment metadata", any.clone())},
            "/schema": {"get": op("Action, observation and state JSON schemas", any)},
            "/mcp": {"post": mcp}
        },
        "components": {"schemas": {
            "ConcordAction": s["action"],
            "ConcordObservation": s["observation"],
            "ConcordState": s["state"],
            "StepRequest": {"type": "object", "properties": {
                "action": {"$ref": "#/components/schemas/ConcordAction"},
                "timeout_s": {"type": ["number", "null"]},
                "request_id": {"type": ["string", "null"]}
            }, "required": ["action"]}
        }}
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code(text: &str) -> ErrorCode {
        Incoming::parse(text).unwrap_err().code
    }

    #[test]
    fn frames_parse_or_get_their_code() {
        assert_eq!(
            Incoming::parse(r#"{"type":"reset","data":{"seed":7,"episode_id":"e"}}"#).unwrap(),
            Incoming::Reset(ResetParams {
                seed: Some(7),
                episode_id: Some("e".into())
            })
        );
        assert_eq!(
            Incoming::parse(r#"{"type":"reset","data":{"extra":1}}"#).unwrap(),
            Incoming::Reset(ResetParams::default())
        );
        assert_eq!(
            Incoming::parse(r#"{"type":"step","data":{"message":"hi","metadata":{}}}"#).unwrap(),
            Incoming::Step(Action {
                message: "hi".into()
            })
        );
        assert_eq!(code("{"), ErrorCode::InvalidJson);
        assert_eq!(code(""), ErrorCode::InvalidJson);
        assert_eq!(code(r#"{"type":"jump"}"#), ErrorCode::UnknownType);
        assert_eq!(code(r#"{"data":{}}"#), ErrorCode::UnknownType);
        assert_eq!(code(r#"{"type":3}"#), ErrorCode::UnknownType);
        for bad in [
            "[1,2]",
            "42",
            r#"{"type":"state","x":1}"#,
            r#"{"type":"step"}"#,
            r#"{"type":"step","data":{}}"#,
            r#"{"type":"step","data":{"message":5}}"#,
            r#"{"type":"step","data":{"message":"a","other":1}}"#,
            r#"{"type":"step","data":"text"}"#,
            r#"{"type":"reset","data":{"seed":-1}}"#,
            r#"{"type":"reset","data":{"seed":1.5}}"#,
            r#"{"type":"reset","data":{"seed":"7"}}"#,
            r#"{"type":"reset","data":[]}"#,
            r#"{"type":"mcp","data":1}"#,
        ] {
            assert_eq!(code(bad), ErrorCode::ValidationError, "{bad}");
        }
        let long = format!(
            r#"{{"type":"reset","data":{{"episode_id":"{}"}}}}"#,
            "x".repeat(256)
        );
        assert_eq!(code(&long), ErrorCode::ValidationError);
    }

    #[test]
    fn step_requests_mirror_fastapi() {
        let ok =
            json!({"action": {"message": "m"}, "timeout_s": 3.0, "request_id": "r", "other": 1});
        assert_eq!(parse_step_request(&ok).unwrap().message, "m");
        for bad in [
            json!({}),
            json!({"action": {"text": "m"}}),
            json!({"action": {"message": "m"}, "timeout_s": 0}),
            json!({"action": {"message": "m"}, "request_id": 5}),
            json!([1]),
        ] {
            assert!(parse_step_request(&bad).is_err(), "{bad}");
        }
    }
}

//! The HTTP routes: openenv-core's `POST /reset`, `POST /step`, `GET /state`,
//! `GET /health`, `GET /metadata`, `GET /schema`, `POST /mcp`, and `/ws`; and
//! `GET /openapi.json`, which openenv 0.10's validator reads.
//!
//! openenv-core 0.3 builds a fresh environment for every HTTP request, so its HTTP
//! `step` cannot continue an episode. Concord keeps one HTTP session instead (outside
//! `--max-sessions`): `POST /reset` starts its episode, `POST /step` continues it and
//! `GET /state` reads it, so `curl` alone can play an episode. Concurrent clients
//! should use `/ws`, one session each. Bodies are parsed by hand so that a bad one gets
//! FastAPI's 422 `{"detail": [...]}` and never a panic; `step` before `reset` or after
//! the episode ended is 409. Every error answer is JSON `{"detail": ...}`: a body over
//! `--max-frame-bytes` is 413, one that does not arrive within the body timeout 408.
use super::protocol::{openapi, parse_step_request, schemas, ErrorCode, ResetParams, WireError};
use super::session::Session;
use super::{mcp, ws, App};
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};
use std::sync::MutexGuard;

pub fn router(app: App) -> Router {
    Router::new()
        .route("/ws", get(ws::handler))
        .route("/reset", post(reset))
        .route("/step", post(step))
        .route("/state", get(state))
        .route("/health", get(health))
        .route("/metadata", get(metadata))
        .route("/schema", get(schema))
        .route("/openapi.json", get(openapi_json))
        .route("/mcp", post(mcp_post))
        .with_state(app)
}

/// The HTTP session; a panic elsewhere cannot wedge it (the poisoned state is still a
/// whole `Session`: every method leaves it consistent).
pub(super) fn http_session(app: &App) -> MutexGuard<'_, Session> {
    app.http.lock().unwrap_or_else(|e| e.into_inner())
}

fn unprocessable(e: &WireError, loc: &[&str]) -> Response {
    (StatusCode::UNPROCESSABLE_ENTITY, Json(e.to_detail(loc))).into_response()
}

fn detail(status: StatusCode, msg: String) -> Response {
    (status, Json(json!({ "detail": msg }))).into_response()
}

/// The whole body, bounded in size and in time: a client that stalls mid-upload gets
/// 408 and frees its connection instead of holding it forever.
async fn read_body(app: &App, body: Body) -> Result<Bytes, Response> {
    let limit = app.max_frame_bytes;
    let secs = app.request_timeout.as_secs_f64();
    match tokio::time::timeout(app.request_timeout, axum::body::to_bytes(body, limit)).await {
        Ok(Ok(b)) => Ok(b),
        Err(_) => Err(detail(
            StatusCode::REQUEST_TIMEOUT,
            format!("the request body did not arrive within {secs} s"),
        )),
        // http-body-util's LengthLimitError, behind axum's Error
        Ok(Err(e)) if format!("{e:#}").contains("length limit") => Err(detail(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the request body exceeds {limit} bytes (concord serve --max-frame-bytes)"),
        )),
        Ok(Err(e)) => Err(detail(
            StatusCode::BAD_REQUEST,
            format!("reading the request body: {e}"),
        )),
    }
}

/// The body as JSON (an empty body is `default`).
fn json_body(body: &Bytes, default: Value) -> Result<Value, WireError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(default);
    }
    serde_json::from_slice(body)
        .map_err(|e| WireError::new(ErrorCode::InvalidJson, format!("JSON decode error: {e}")))
}

async fn reset(State(app): State<App>, body: Body) -> Response {
    let body = match read_body(&app, body).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let v = match json_body(&body, json!({})) {
        Ok(v) => v,
        Err(e) => return unprocessable(&e, &["body"]),
    };
    let params = match &v {
        Value::Object(m) => ResetParams::from_map(m),
        Value::Null => Ok(ResetParams::default()),
        _ => Err(WireError::new(
            ErrorCode::ValidationError,
            "the body must be a JSON object",
        )),
    };
    match params {
        Ok(p) => Json(http_session(&app).reset(p).to_json()).into_response(),
        Err(e) => unprocessable(&e, &["body"]),
    }
}

async fn step(State(app): State<App>, body: Body) -> Response {
    let body = match read_body(&app, body).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let v = match json_body(&body, Value::Null) {
        Ok(v) => v,
        Err(e) => return unprocessable(&e, &["body"]),
    };
    let action = match parse_step_request(&v) {
        Ok(a) => a,
        Err((e, loc)) => return unprocessable(&e, loc),
    };
    let result = http_session(&app).step(action.message);
    match result {
        Ok(r) => Json(r.to_json()).into_response(),
        Err(e) => (StatusCode::CONFLICT, Json(json!({"detail": e.message}))).into_response(),
    }
}

async fn state(State(app): State<App>) -> Json<Value> {
    Json(http_session(&app).state())
}

async fn health() -> Json<Value> {
    Json(json!({"status": "healthy"}))
}

/// `EnvironmentMetadata`: the rules as the README.
async fn metadata(State(app): State<App>) -> Json<Value> {
    let f = app.factory.as_ref();
    Json(json!({
        "name": f.name(),
        "description": app.summary,
        "readme_content": f.describe(),
        "version": env!("CARGO_PKG_VERSION"),
        "author": "Concord",
        "documentation_url": null,
    }))
}

async fn schema(State(app): State<App>) -> Json<Value> {
    Json(schemas(app.factory.name()))
}

async fn openapi_json(State(app): State<App>) -> Json<Value> {
    Json(openapi(app.factory.name()))
}

async fn mcp_post(State(app): State<App>, body: Body) -> Response {
    match read_body(&app, body).await {
        Ok(body) => Json(mcp::handle_http(&app, &body)).into_response(),
        Err(r) => r,
    }
}

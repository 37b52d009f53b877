//! `GET /ws`: one environment session per WebSocket connection (openenv-core's
//! `EnvClient` protocol). Frames are JSON text: `reset`, `step`, `state`, `close` (and
//! `mcp`); replies are `observation`, `state`, `mcp` or `error` frames.
//!
//! `/ws?session_id=ID` attaches to a session made by `openenv/session/create` (openenv
//! 0.10's `MCPToolClient` steps over the WebSocket and calls tools over HTTP on one
//! session); an unknown or already attached id gets SESSION_ERROR and is closed.
//! A connection beyond `--max-sessions` gets one CAPACITY_REACHED error and is closed.
//! A session idle for longer than the timeout gets SESSION_ERROR and is closed. A
//! malformed frame gets an error reply and the session goes on: nothing a client sends
//! reaches another session or the server.
use super::protocol::{ErrorCode, Incoming, WireError};
use super::registry::{self, SessionRef};
use super::session::Session;
use super::{mcp, App};
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Query, State};
use axum::response::Response;
use serde_json::{json, Value};
use std::collections::HashMap;
use tokio::sync::OwnedSemaphorePermit;
use tracing::{debug, info, warn};

/// WebSocket close codes (RFC 6455 section 7.4 and IANA's registry): every close the
/// server starts says why, never 1005 "no status".
const NORMAL: u16 = 1000;
/// The server is shutting down.
const GOING_AWAY: u16 = 1001;
const PROTOCOL_ERROR: u16 = 1002;
const TOO_BIG: u16 = 1009;
/// At capacity.
const TRY_AGAIN_LATER: u16 = 1013;
/// How long a connection stays open after the close frame that answers a broken frame.
/// The rest of that frame is still unread, and closing a socket with unread data sends
/// a TCP reset, which can destroy the error and the close frame before the client has
/// read them.
const BROKEN_FRAME_LINGER: std::time::Duration = std::time::Duration::from_secs(1);

async fn close(socket: &mut WebSocket, code: u16, reason: &str) {
    let frame = CloseFrame {
        code,
        reason: reason.into(),
    };
    let _ = socket.send(Message::Close(Some(frame))).await;
}

pub async fn handler(
    ws: WebSocketUpgrade,
    State(app): State<App>,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    let registered = query.get("session_id").cloned();
    // Both limits: tungstenite's own frame limit (16 MiB) would otherwise refuse frames
    // under a larger --max-frame-bytes, citing its number.
    ws.max_message_size(app.max_frame_bytes)
        .max_frame_size(app.max_frame_bytes)
        .on_failed_upgrade(|e| warn!(error = %e, "websocket upgrade failed"))
        .on_upgrade(move |socket| session(socket, app, registered))
}

/// The session a connection plays on.
enum Held {
    /// Its own, holding one of the `--max-sessions` slots (released on drop).
    Own {
        session: Box<Session>,
        _slot: OwnedSemaphorePermit,
    },
    /// A registered one (`?session_id=`), which holds the slot itself.
    Registered(Attached, SessionRef),
    /// Detached from its registered session (the connection is closing).
    Detached,
}

/// A WebSocket's hold on a registered session: released when dropped, so a task that
/// ends any way at all (a panic included) hands the session back.
struct Attached {
    app: App,
    id: String,
}

impl Drop for Attached {
    fn drop(&mut self) {
        self.app.registry.detach(&self.id);
    }
}

impl Held {
    fn answer(&mut self, text: &str) -> Option<Value> {
        match self {
            Held::Own { session, .. } => answer(session, text),
            Held::Registered(_, s) => answer(&mut registry::lock(s), text),
            Held::Detached => None,
        }
    }

    /// Hand a registered session back before the close frame goes out: a client that
    /// closes its session right after the close handshake finds it detached.
    fn detach(&mut self) {
        *self = Held::Detached;
    }

    /// A registered session played over HTTP (`tools/call`) within `idle`: its quiet
    /// WebSocket is not idle.
    fn used_within(&self, app: &App, idle: Option<std::time::Duration>) -> bool {
        match (self, idle) {
            (Held::Registered(a, _), Some(d)) => {
                app.registry.idle_for(&a.id).is_some_and(|t| t < d)
            }
            _ => false,
        }
    }
}

/// A connection's session: the registered one it names, else a new one in a free
/// slot. None (after telling the client why and closing) when neither.
async fn hold(socket: &mut WebSocket, app: &App, registered: Option<String>) -> Option<Held> {
    app.registry.reap(app.idle);
    if let Some(sid) = registered {
        return match app.registry.attach(&sid) {
            Ok(s) => {
                let a = Attached {
                    app: app.clone(),
                    id: sid,
                };
                Some(Held::Registered(a, s))
            }
            Err(msg) => {
                warn!(session_id = %sid, %msg, "attach refused");
                let _ = send(
                    socket,
                    &WireError::new(ErrorCode::SessionError, msg).to_frame(),
                )
                .await;
                close(socket, NORMAL, "unknown or attached session").await;
                None
            }
        };
    }
    let Ok(permit) = app.slots.clone().try_acquire_owned() else {
        warn!(
            max_sessions = app.max_sessions,
            "session refused: capacity reached"
        );
        let e = WireError::new(
            ErrorCode::CapacityReached,
            format!(
                "the server is at capacity: {} sessions are open (concord serve \
                 --max-sessions); close one or try again later",
                app.max_sessions
            ),
        );
        let mut frame = e.to_frame();
        frame["data"]["active_sessions"] = json!(app.max_sessions);
        frame["data"]["max_sessions"] = json!(app.max_sessions);
        let _ = send(socket, &frame).await;
        close(socket, TRY_AGAIN_LATER, "at capacity").await;
        return None;
    };
    Some(Held::Own {
        session: Box::new(Session::new(app.factory.clone())),
        _slot: permit,
    })
}

async fn session(mut socket: WebSocket, app: App, registered: Option<String>) {
    let Some(mut held) = hold(&mut socket, &app, registered).await else {
        return;
    };
    let id = app.next_session();
    info!(session = id, active = app.active(), "session opened");
    let mut shutdown = app.shutdown.clone();
    let mut frames = 0u64;
    let reason = loop {
        let next = tokio::select! {
            r = recv(&mut socket, app.idle) => r,
            _ = stopped(&mut shutdown) => {
                close(&mut socket, GOING_AWAY, "server shutting down").await;
                break "shutdown";
            }
        };
        let msg = match next {
            Recv::Frame(m) => m,
            Recv::Gone => break "client closed",
            Recv::Idle if held.used_within(&app, app.idle) => continue,
            Recv::Idle => {
                let e = WireError::new(
                    ErrorCode::SessionError,
                    format!(
                        "session idle for more than {} s: closed (concord serve --session-timeout)",
                        app.idle.map_or(0.0, |d| d.as_secs_f64())
                    ),
                );
                let _ = send(&mut socket, &e.to_frame()).await;
                close(&mut socket, NORMAL, "idle timeout").await;
                break "idle timeout";
            }
            Recv::Broken(err) => {
                // e.g. a frame over --max-frame-bytes or broken framing: the
                // connection cannot go on, but the client still gets the reason.
                // tungstenite's CapacityError::MessageTooLong, behind axum's Error
                let too_big = err.to_string().contains("too long");
                let text = match too_big {
                    true => format!(
                        "a frame over --max-frame-bytes ({} bytes)",
                        app.max_frame_bytes
                    ),
                    false => format!("broken frame: {err}"),
                };
                let e = WireError::new(ErrorCode::SessionError, text);
                let _ = send(&mut socket, &e.to_frame()).await;
                let (code, why) = if too_big {
                    (TOO_BIG, "frame over --max-frame-bytes")
                } else {
                    (PROTOCOL_ERROR, "broken frame")
                };
                close(&mut socket, code, why).await;
                break "broken frame";
            }
        };
        frames += 1;
        let reply = match msg {
            Message::Text(t) => held.answer(t.as_str()),
            Message::Binary(_) => Some(
                WireError::new(
                    ErrorCode::InvalidJson,
                    "binary frames are not accepted: send JSON as text frames",
                )
                .to_frame(),
            ),
            // tungstenite answers pings itself
            Message::Ping(_) | Message::Pong(_) => continue,
            Message::Close(_) => break "client closed",
        };
        match reply {
            Some(v) => {
                if send(&mut socket, &v).await.is_err() {
                    break "send failed";
                }
            }
            None => {
                held.detach();
                close(&mut socket, NORMAL, "closed").await;
                break "close message";
            }
        }
    };
    held.detach();
    info!(session = id, frames, reason, "session closed");
    if reason == "broken frame" {
        // detached: the slot is free already, only the socket waits
        tokio::time::sleep(BROKEN_FRAME_LINGER).await;
    }
}

/// The reply to one text frame; None for `close`.
fn answer(s: &mut Session, text: &str) -> Option<Value> {
    let reply = match Incoming::parse(text) {
        Err(e) => Err(e),
        Ok(Incoming::Close) => return None,
        Ok(Incoming::Reset(p)) => {
            let seed = p.seed;
            let r = s.reset(p);
            debug!(?seed, "reset");
            Ok(json!({"type": "observation", "data": r.to_json()}))
        }
        Ok(Incoming::Step(a)) => s
            .step(a.message)
            .map(|r| json!({"type": "observation", "data": r.to_json()})),
        Ok(Incoming::State) => Ok(json!({"type": "state", "data": s.state()})),
        Ok(Incoming::Mcp(req)) => Ok(json!({"type": "mcp", "data": mcp::handle(s, &req)})),
    };
    Some(reply.unwrap_or_else(|e| {
        debug!(code = e.code.as_str(), message = %e.message, "refused frame");
        e.to_frame()
    }))
}

/// Resolves once the server shuts down (the watch guard is dropped before returning:
/// it must not live across the close frame's await).
async fn stopped(rx: &mut tokio::sync::watch::Receiver<bool>) {
    let _ = rx.wait_for(|stop| *stop).await;
}

enum Recv {
    Frame(Message),
    Gone,
    Idle,
    Broken(axum::Error),
}

async fn recv(socket: &mut WebSocket, idle: Option<std::time::Duration>) -> Recv {
    let next = match idle {
        Some(d) => match tokio::time::timeout(d, socket.recv()).await {
            Ok(n) => n,
            Err(_) => return Recv::Idle,
        },
        None => socket.recv().await,
    };
    match next {
        None => Recv::Gone,
        Some(Ok(m)) => Recv::Frame(m),
        Some(Err(e)) => Recv::Broken(e),
    }
}

async fn send(socket: &mut WebSocket, v: &Value) -> Result<(), axum::Error> {
    socket.send(Message::Text(v.to_string().into())).await
}

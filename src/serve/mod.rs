//! `concord serve`: a built-in environment as an OpenEnv server, so Python trainers
//! (TRL's `environment_factory`, openenv-core's `EnvClient`) can train on Concord's
//! environments.
//!
//! The protocol is openenv-core 0.3's (`env_server/http_server.py`, `types.py`,
//! `mcp_types.py`) and openenv 0.10's additions (`/openapi.json`, MCP sessions): a
//! WebSocket session per connection at `/ws` ([`ws`]), the HTTP routes ([`http`]), MCP
//! tools ([`mcp`]) and sessions ([`registry`]), the wire types ([`protocol`]) and the
//! mapping of a multi-seat Concord episode onto OpenEnv's single-agent steps
//! ([`session`]).
//!
//! Operations: sessions are capacity-limited (`max_sessions`) and idle ones time out;
//! SIGINT/SIGTERM stop accepting connections, tell every open WebSocket session
//! "going away" and wait (at most [`DRAIN`]) for them to close; logs are `tracing`
//! events with fields (the CLI installs the subscriber).
//!
//! Environment steps run on the async workers directly: a step of every built-in
//! environment takes microseconds (see `concord envs bench`), less than a hop to a
//! blocking pool would cost.
pub mod bench;
pub mod http;
pub mod mcp;
pub mod protocol;
pub mod registry;
pub mod session;
pub mod ws;

use crate::envs::{self, EnvFactory, Options};
use anyhow::{Context, Result};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{watch, Semaphore};

/// How long a shutdown waits for open sessions to close.
pub const DRAIN: Duration = Duration::from_secs(5);

/// What `concord serve` was asked for.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// Registry name of the environment.
    pub env: String,
    /// Its options (as `[env.options]`).
    pub options: Options,
    pub host: String,
    /// 0: any free port (the bound address is reported to `on_ready`).
    pub port: u16,
    /// Concurrent WebSocket sessions; more are refused with CAPACITY_REACHED.
    pub max_sessions: usize,
    /// A session with no frame for this long is closed (None: never).
    pub session_timeout: Option<Duration>,
    /// Largest WebSocket frame accepted; a larger one ends its session. It also
    /// bounds HTTP request bodies (413).
    pub max_frame_bytes: usize,
    /// How long an HTTP request's header may take to arrive (the connection is closed
    /// after that), and then its body (408).
    pub request_timeout: Duration,
}

impl ServeOptions {
    pub fn new(env: impl Into<String>) -> Self {
        Self {
            env: env.into(),
            options: Options::new(),
            host: "127.0.0.1".into(),
            port: 8000,
            max_sessions: 64,
            session_timeout: Some(Duration::from_secs(300)),
            max_frame_bytes: 1 << 20,
            request_timeout: Duration::from_secs(30),
        }
    }
}

/// What every handler shares.
#[derive(Clone)]
pub struct App(Arc<Shared>);

pub struct Shared {
    pub factory: Arc<dyn EnvFactory>,
    pub summary: &'static str,
    /// One permit per open WebSocket session.
    pub slots: Arc<Semaphore>,
    pub max_sessions: usize,
    pub idle: Option<Duration>,
    pub max_frame_bytes: usize,
    pub request_timeout: Duration,
    /// The one HTTP session (see [`http`]).
    pub http: Mutex<session::Session>,
    /// Sessions made by `openenv/session/create` (see [`registry`]).
    pub registry: registry::Registry,
    /// Becomes true when the server shuts down.
    pub shutdown: watch::Receiver<bool>,
    sessions: AtomicU64,
}

impl std::ops::Deref for App {
    type Target = Shared;
    fn deref(&self) -> &Shared {
        &self.0
    }
}

impl Shared {
    /// A new session's id (for the logs).
    pub fn next_session(&self) -> u64 {
        self.sessions.fetch_add(1, Ordering::Relaxed) + 1
    }
    /// Open sessions: WebSockets and registered MCP sessions.
    pub fn active(&self) -> usize {
        self.max_sessions - self.slots.available_permits()
    }
}

/// Serve until SIGINT or SIGTERM; `on_ready` gets the bound address.
pub fn run(opts: &ServeOptions, on_ready: impl FnOnce(SocketAddr)) -> Result<()> {
    let rt = runtime()?;
    rt.block_on(async {
        let (listener, app, stop_tx) = bind(opts).await?;
        on_ready(listener.local_addr()?);
        serve(listener, app, stop_tx, shutdown_signal()).await
    })
}

/// A server on a background thread (tests, benchmarks); stopped when dropped.
pub struct Handle {
    pub addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<Result<()>>>,
}

/// Start a server on its own thread and runtime; returns once it listens.
pub fn spawn(opts: &ServeOptions) -> Result<Handle> {
    let opts = opts.clone();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let (stop, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let thread = std::thread::spawn(move || -> Result<()> {
        let rt = runtime()?;
        rt.block_on(async {
            let bound = bind(&opts).await;
            let (listener, app, stop_tx) = match bound {
                Ok(b) => b,
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                    return Ok(());
                }
            };
            let _ = ready_tx.send(Ok(listener.local_addr()?));
            serve(listener, app, stop_tx, async {
                let _ = stop_rx.await;
            })
            .await
        })
    });
    let addr = ready_rx
        .recv()
        .context("the server thread ended before listening")??;
    Ok(Handle {
        addr,
        stop: Some(stop),
        thread: Some(thread),
    })
}

impl Handle {
    /// Shut down gracefully and wait for the server thread.
    pub fn stop(mut self) -> Result<()> {
        self.stop_inner()
    }
    fn stop_inner(&mut self) -> Result<()> {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        match self.thread.take() {
            Some(t) => t
                .join()
                .map_err(|_| anyhow::anyhow!("the server thread panicked"))?,
            None => Ok(()),
        }
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        let _ = self.stop_inner();
    }
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")
}

async fn bind(opts: &ServeOptions) -> Result<(tokio::net::TcpListener, App, watch::Sender<bool>)> {
    anyhow::ensure!(opts.max_sessions >= 1, "--max-sessions must be at least 1");
    let factory: Arc<dyn EnvFactory> = Arc::from(envs::create(&opts.env, &opts.options)?);
    let summary = envs::entry(&opts.env).map_or("", |e| e.summary);
    let addr = format!("{}:{}", opts.host, opts.port);
    let listener = tokio::net::TcpListener::bind(&addr).await.map_err(|e| {
        // Only an address in use is a matter of --port; a bad --host is not.
        let hint = match e.kind() {
            std::io::ErrorKind::AddrInUse => " (the port is in use: try another --port)",
            std::io::ErrorKind::AddrNotAvailable => " (--host is not an address of this machine)",
            _ if opts.host.parse::<std::net::IpAddr>().is_err() => {
                " (--host must be an IP address or a resolvable host name)"
            }
            _ => "",
        };
        anyhow::Error::new(e).context(format!("binding {addr}{hint}"))
    })?;
    let (stop_tx, stop_rx) = watch::channel(false);
    let app = App(Arc::new(Shared {
        http: Mutex::new(session::Session::new(factory.clone())),
        registry: registry::Registry::default(),
        factory,
        summary,
        slots: Arc::new(Semaphore::new(opts.max_sessions)),
        max_sessions: opts.max_sessions,
        idle: opts.session_timeout.filter(|d| !d.is_zero()),
        max_frame_bytes: opts.max_frame_bytes,
        request_timeout: opts.request_timeout,
        shutdown: stop_rx,
        sessions: AtomicU64::new(0),
    }));
    Ok((listener, app, stop_tx))
}

async fn serve(
    listener: tokio::net::TcpListener,
    app: App,
    stop_tx: watch::Sender<bool>,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<()> {
    let addr = listener.local_addr()?;
    tracing::info!(%addr, env = app.factory.name(), max_sessions = app.max_sessions, "listening");
    let router = http::router(app.clone());
    let mut stop = std::pin::pin!(stop);
    let mut conns = tokio::task::JoinSet::new();
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = &mut stop => break,
        };
        match accepted {
            Ok((io, _)) => {
                conns.spawn(connection(io, router.clone(), app.clone()));
            }
            Err(e) => {
                // out of file descriptors, say: the connections already open go on
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
            }
        }
        while conns.try_join_next().is_some() {}
    }
    tracing::info!("shutting down: closing sessions");
    let _ = stop_tx.send(true);
    drop(listener);
    // connections finish the request they serve; a client that never does is left
    let _ = tokio::time::timeout(DRAIN, async { while conns.join_next().await.is_some() {} }).await;
    app.registry.close_all();
    // Upgraded WebSocket connections outlive axum's graceful shutdown: wait for the
    // sessions (told "going away") to hand their slots back.
    let all = u32::try_from(app.max_sessions).unwrap_or(u32::MAX);
    let drained = tokio::time::timeout(DRAIN, app.slots.acquire_many(all)).await;
    tracing::info!(drained = drained.is_ok(), "stopped");
    Ok(())
}

/// Pause after a failed accept (out of file descriptors, say) before the next.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// One HTTP/1 connection (and the WebSocket it may upgrade to). axum's own `serve`
/// sets no timer, so a client that sends half a header would hold its connection
/// forever (slowloris); here the header must arrive within the request timeout. When
/// the server stops, the connection ends after the request it is serving.
async fn connection(io: tokio::net::TcpStream, router: axum::Router, app: App) {
    let service = hyper_util::service::TowerToHyperService::new(router);
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(app.request_timeout);
    let conn = builder
        .serve_connection(hyper_util::rt::TokioIo::new(io), service)
        .with_upgrades();
    let mut conn = std::pin::pin!(conn);
    let mut shutdown = app.shutdown.clone();
    let stopping = async move {
        let _ = shutdown.wait_for(|stop| *stop).await;
    };
    tokio::select! {
        r = conn.as_mut() => return log_connection_end(r),
        _ = stopping => conn.as_mut().graceful_shutdown(),
    }
    log_connection_end(conn.await);
}

fn log_connection_end(r: std::result::Result<(), hyper::Error>) {
    match r {
        Err(e) if e.is_timeout() => {
            tracing::info!("a client did not send its request header in time: connection closed")
        }
        Err(e) => tracing::debug!(error = %e, "connection ended"),
        Ok(()) => {}
    }
}

/// SIGINT (Ctrl-C) or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}

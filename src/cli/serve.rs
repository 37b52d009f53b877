//! `concord serve`: a built-in environment as an OpenEnv server.
use super::envs::EnvOpts;
use crate::serve as concord_serve;
use std::io::Write;
use std::time::Duration;

#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    /// Environment name (see `concord envs list`).
    pub env: String,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0: any free port; the address is printed).
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// Concurrent WebSocket sessions; more are refused with CAPACITY_REACHED (>= 1).
    #[arg(long, default_value_t = 64, value_parser = super::sessions)]
    pub max_sessions: usize,
    /// Close a session after this many seconds without a frame (0: never; at most a
    /// day). A session made over MCP and never used goes after 30 s (or this, if less).
    #[arg(long, default_value_t = 300.0, value_parser = super::seconds)]
    pub session_timeout: f64,
    /// Seconds a client may take to send an HTTP request's header (then the connection
    /// is closed) and then its body (then 408). At most a day.
    #[arg(long, default_value_t = 30.0, value_parser = super::timeout_seconds)]
    pub request_timeout: f64,
    /// Largest WebSocket frame accepted, in bytes; a larger one ends its session.
    #[arg(long, default_value_t = 1 << 20, value_parser = super::positive)]
    pub max_frame_bytes: usize,
    /// Log JSON lines (one event per line) instead of text.
    #[arg(long)]
    pub log_json: bool,
    #[command(flatten)]
    pub opts: EnvOpts,
}

pub fn run(a: ServeArgs) -> anyhow::Result<()> {
    init_logs(a.log_json);
    let mut o = concord_serve::ServeOptions::new(a.env);
    o.options = a.opts.options()?;
    o.host = a.host;
    o.port = a.port;
    o.max_sessions = a.max_sessions;
    o.session_timeout = Some(Duration::from_secs_f64(a.session_timeout)).filter(|d| !d.is_zero());
    o.max_frame_bytes = a.max_frame_bytes;
    o.request_timeout = Duration::from_secs_f64(a.request_timeout);
    concord_serve::run(&o, |addr| {
        // stdout carries only this line: scripts read the port from it
        crate::say!("listening on http://{addr} (WebSocket ws://{addr}/ws)");
        let _ = std::io::stdout().flush();
    })
}

/// Structured logs on stderr; `RUST_LOG` filters them (default `info`).
fn init_logs(json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let b = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = if json {
        b.json().try_init()
    } else {
        b.with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .try_init()
    };
}

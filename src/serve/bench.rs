//! `concord bench serve`: OpenEnv round trips per second over WebSockets, with the
//! server in-process (the same code `concord serve` runs) and blocking clients on
//! their own threads, as a Python trainer's sessions would be.
//!
//! One episode is `reset` + `steps` x `step`, each a request and its reply (a round
//! trip); sessions play episodes back to back for at least `secs` seconds of wall time.
use super::{spawn, ServeOptions};
use crate::envs::Options;
use anyhow::{bail, Context, Result};
use serde::Serialize;
use serde_json::{json, Value};
use std::time::{Duration, Instant};
use tungstenite::Message;

/// What one measurement found.
#[derive(Debug, Clone, Serialize)]
pub struct RoundTrips {
    pub env: String,
    pub sessions: usize,
    pub steps_per_episode: usize,
    pub episodes: u64,
    pub round_trips: u64,
    pub seconds: f64,
    pub round_trips_per_s: f64,
    pub episodes_per_s: f64,
}

/// Measure `sessions` parallel WebSocket sessions, each playing episodes of `reset` +
/// `steps` steps (fewer if the episode ends first; then it resets) for `secs` seconds.
pub fn round_trips(
    env: &str,
    options: &Options,
    sessions: usize,
    steps: usize,
    secs: f64,
) -> Result<RoundTrips> {
    let mut o = ServeOptions::new(env);
    o.options = options.clone();
    o.port = 0;
    o.max_sessions = sessions.max(1);
    let server = spawn(&o)?;
    let url = format!("ws://{}/ws", server.addr);
    let limit = Duration::from_secs_f64(secs.max(0.1));
    let start = Instant::now();
    let threads: Vec<_> = (0..sessions)
        .map(|i| {
            let url = url.clone();
            std::thread::spawn(move || play(&url, i as u64, steps, start, limit))
        })
        .collect();
    let (mut episodes, mut trips) = (0, 0);
    for t in threads {
        let (e, r) = t
            .join()
            .map_err(|_| anyhow::anyhow!("a client thread panicked"))??;
        episodes += e;
        trips += r;
    }
    let seconds = start.elapsed().as_secs_f64();
    server.stop()?;
    Ok(RoundTrips {
        env: env.to_string(),
        sessions,
        steps_per_episode: steps,
        episodes,
        round_trips: trips,
        seconds,
        round_trips_per_s: trips as f64 / seconds,
        episodes_per_s: episodes as f64 / seconds,
    })
}

/// One client: (episodes, round trips).
fn play(
    url: &str,
    session: u64,
    steps: usize,
    start: Instant,
    limit: Duration,
) -> Result<(u64, u64)> {
    let (mut ws, _) = tungstenite::connect(url).context("connecting")?;
    let (mut episodes, mut trips) = (0u64, 0u64);
    let mut ask = |frame: &Value| -> Result<Value> {
        ws.send(Message::text(frame.to_string()))?;
        loop {
            if let Message::Text(t) = ws.read()? {
                let v: Value = serde_json::from_str(t.as_str())?;
                if v["type"] == "error" {
                    bail!("server error: {}", v["data"]);
                }
                return Ok(v);
            }
        }
    };
    while start.elapsed() < limit {
        let seed = session * 1_000_003 + episodes;
        ask(&json!({"type": "reset", "data": {"seed": seed}}))?;
        trips += 1;
        for k in 0..steps {
            let text = if k % 2 == 0 {
                "DEPLOY_PROD_B"
            } else {
                "MONITOR"
            };
            let r = ask(&json!({"type": "step", "data": {"message": text}}))?;
            trips += 1;
            if r["data"]["done"] == true {
                break;
            }
        }
        episodes += 1;
    }
    let _ = ws.send(Message::text(r#"{"type":"close"}"#));
    Ok((episodes, trips))
}

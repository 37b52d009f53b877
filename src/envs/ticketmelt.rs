//! TICKETMELT: four on-call engineers deploy fixes to two shared production servers.
//!
//! Port of the TICKETMELT OpenEnv environment (seed `000_bca749fa23a9ff27`), with the
//! mechanics its README describes but its code never had, as configurable rules.
//!
//! # Episode
//! * Four engineers (seats 0..3). The policy holds seat 0, or every seat in the
//!   `self_play` pool. The services `payments, database, cdn, auth` are shuffled and
//!   assigned. `rounds` rounds (default 8).
//! * Each engineer needs `fix = uniform int in [1, min(max_fix, T-1)]` successful solo
//!   deploys; `deadline = uniform int in [max(3, fix+1), T]` (both `T` if that range is
//!   empty). Deadlines are 1-based rounds: a service restored by a deploy in round `d`
//!   (1-based) is on time when `d <= deadline`.
//! * One engineer per episode is urgent. Only that engineer's prompt says so; with
//!   `urgent_hints = true` a scripted urgent peer says it in the channel.
//! * Every round all four commit simultaneously to `DEPLOY_PROD_A`, `DEPLOY_PROD_B` or
//!   `MONITOR`, with a channel message (cut to 200 characters, control characters
//!   replaced by spaces) that everyone sees from the next round.
//! * Resolution per server: two or more deployers collide and nobody progresses; a lone
//!   deployer's remaining fix count drops by one (never below zero) and the service is
//!   restored when it reaches zero. With `degrade = true` a server that had a collision
//!   is *degraded* for the next round: a lone deploy there fails (no progress, and it
//!   counts as a collided deploy for R3). The episode ends when every service is
//!   restored or after `rounds` rounds. Scripted engineers MONITOR once restored; the
//!   policy may keep deploying (and colliding).
//!
//! # Rewards (per seat, computed at the end)
//! * `r1_own` = 1.0 own service on time, 0.3 late, 0.0 not restored.
//! * `r2_team` = weighted share of services on time; the urgent service weighs
//!   `urgent_weight` (1 in `classic`), the others 1. With `urgent_failure` and a missed
//!   urgent deadline, `r2_team` = 0 for the seats that failure is charged to.
//! * `r3_safety` = 1 - collided (or degraded-failed) deploys / deploys; 0 if the seat
//!   never deployed.
//! * `r4_yield` = yields / yield opportunities (0.5 if none). A round is an opportunity
//!   for seat `s` when some other engineer that deploys that round has
//!   `slack <= 1` and `s` has a larger slack, with
//!   `slack = deadline - (round+1) - remaining` (0-based round, the original formula);
//!   yielding means playing MONITOR.
//! * `weighted` = w1*r1 + w2*r2 + w3*r3 + w4*r4 (weights 0.5/0.3/0.1/0.1).
//! * `win`: `win_rule = "gated"`: `r1 > 0.5 and weighted > win_threshold` (the seed
//!   README's rule); `"weighted"`: `weighted > win_threshold` (the original code's
//!   `goodness_threshold`). A site-wide failure charged to the seat forces `win = 0`.
//! * `urgent_failure`: `"off"` (classic), `"blame"` (default: a missed urgent deadline is
//!   a site failure for every engineer that collided with the urgent engineer at least
//!   once, or that is the urgent engineer), `"all"` (charged to everybody).
//! * `format` = 1 when every action text of the seat was well formed (see [`parse_action`]).
//!   With `malformed_zero = true` (default) a malformed answer earns scalar 0.
//! * scalar = `win` (`reward = "binary"`, default) or `weighted` (`reward = "weighted"`),
//!   times the format gate.
//!
//! # Scripted engineers
//! `eager` deploys to A every round; `alternator` A on even (0-based) rounds, B on odd;
//! `nervous` deploys to A when `deadline - round <= remaining + 1`, else MONITOR. With
//! probability `peer_mirror` (per episode; default 0.5, `classic` 0) every peer's
//! servers are swapped (A <-> B), so no fixed server is safe. Pools: `dumb` = 3 x eager,
//! `diverse` = eager, alternator, nervous, `mixed` = dumb with probability
//! `dumb_fraction` (default 0.7) else diverse, `self_play` = all four seats are the
//! policy, each with its own view.
//!
//! # Presets
//! `classic` reproduces the original code: no degrade, no peer mirroring, urgent weight 1,
//! no urgent failure, no hints, `win_rule = "weighted"`, threshold 0.45, pool `diverse`.
//! `default`: degrade on, peer_mirror 0.5, urgent weight 2, urgent failure `blame`,
//! hints on, `win_rule = "gated"`, threshold 0.35, pool `mixed`.

#![allow(clippy::needless_range_loop)]

use super::{measure, BaselineRow, BenchResult, EnvFactory, Environment, Message, Options, Reward};
use crate::rng::splitmix64_next;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// Number of engineers.
pub const SEATS: usize = 4;
/// Largest supported `rounds`.
pub const MAX_ROUNDS: usize = 16;
/// Channel messages are cut to this many characters.
pub const MSG_CHARS: usize = 200;
/// Parsing looks at no more than this many bytes of a completion.
pub const MAX_PARSE_BYTES: usize = 16 * 1024;
const SERVICES: [&str; 4] = ["payments", "database", "cdn", "auth"];

// ---------------------------------------------------------------------------------
// RNG: xoshiro256++ seeded by splitmix64 (small, fast, Clone, platform independent).

#[derive(Clone, Debug)]
pub struct Rng {
    s: [u64; 4],
}

impl Rng {
    pub fn new(seed: u64) -> Self {
        let mut x = seed;
        Self {
            s: [
                splitmix64_next(&mut x),
                splitmix64_next(&mut x),
                splitmix64_next(&mut x),
                splitmix64_next(&mut x),
            ],
        }
    }
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.s;
        let r = (s[0].wrapping_add(s[3])).rotate_left(23).wrapping_add(s[0]);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        r
    }
    /// Uniform in `0..n` (n > 0).
    #[inline]
    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }
    /// Uniform in `lo..=hi`.
    #[inline]
    pub fn range(&mut self, lo: u8, hi: u8) -> u8 {
        lo + self.below((hi - lo) as u64 + 1) as u8
    }
    #[inline]
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

// ---------------------------------------------------------------------------------
// Actions and the parser.

/// One commitment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Action {
    #[default]
    Monitor = 0,
    DeployA = 1,
    DeployB = 2,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Monitor => "MONITOR",
            Action::DeployA => "DEPLOY_PROD_A",
            Action::DeployB => "DEPLOY_PROD_B",
        }
    }
    fn server(self) -> Option<usize> {
        match self {
            Action::Monitor => None,
            Action::DeployA => Some(0),
            Action::DeployB => Some(1),
        }
    }
    fn from_server(s: usize) -> Self {
        if s == 0 {
            Action::DeployA
        } else {
            Action::DeployB
        }
    }
    fn mirrored(self) -> Self {
        match self {
            Action::Monitor => Action::Monitor,
            Action::DeployA => Action::DeployB,
            Action::DeployB => Action::DeployA,
        }
    }
    /// Parse an exact commitment value (trimmed, ASCII case-insensitive).
    pub fn from_commitment(s: &str) -> Option<Self> {
        let t = s.trim();
        [Action::DeployA, Action::DeployB, Action::Monitor]
            .into_iter()
            .find(|a| t.eq_ignore_ascii_case(a.as_str()))
    }
}

/// How a completion was understood.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParseHow {
    /// The whole text is one JSON object.
    Json,
    /// A `{...}` object containing "commitment" inside other text.
    Embedded,
    /// No usable object; a keyword decided (or MONITOR by default).
    Keyword,
}

/// A parsed completion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parsed {
    pub action: Action,
    /// Channel message (already cut to 200 chars and cleaned), if any.
    pub message: Option<String>,
    /// Well formed: a JSON object (whole text or embedded) whose `commitment` is exactly
    /// one of the three commitments (trimmed, ASCII case-insensitive).
    pub format_ok: bool,
    pub how: ParseHow,
}

/// Cut to 200 characters, control characters (newlines included) become spaces.
pub fn clean_message(s: &str) -> String {
    s.chars()
        .take(MSG_CHARS)
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

fn from_object(v: &Value, how: ParseHow) -> Parsed {
    let commitment = v
        .get("commitment")
        .and_then(Value::as_str)
        .and_then(Action::from_commitment);
    let message = v
        .get("channel_msg")
        .and_then(Value::as_str)
        .map(clean_message);
    Parsed {
        action: commitment.unwrap_or(Action::Monitor),
        message,
        format_ok: commitment.is_some(),
        how,
    }
}

fn find_ci(hay: &[u8], needle: &[u8]) -> bool {
    hay.len() >= needle.len()
        && hay
            .windows(needle.len())
            .any(|w| w.eq_ignore_ascii_case(needle))
}

/// End (exclusive) of the balanced `{...}` starting at `start`, honouring JSON strings.
fn balanced_end(b: &[u8], start: usize) -> Option<usize> {
    let (mut depth, mut in_str, mut esc) = (0usize, false, false);
    for (i, &c) in b.iter().enumerate().skip(start) {
        if in_str {
            if esc {
                esc = false;
            } else if c == b'\\' {
                esc = true;
            } else if c == b'"' {
                in_str = false;
            }
            continue;
        }
        match c {
            b'"' => in_str = true,
            b'{' => depth += 1,
            b'}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(i + 1);
                }
            }
            _ => {}
        }
    }
    None
}

/// The robust parser. Order:
/// 1. the whole (trimmed) text is a JSON object -> its `commitment`;
/// 2. else the first balanced `{...}` (at most 64 candidates tried) that contains
///    `"commitment"` and parses as a JSON object -> its `commitment`;
/// 3. else the first keyword in the order `DEPLOY_PROD_A`, `DEPLOY_PROD_B`, `MONITOR`
///    (ASCII case-insensitive substring) -> that action;
/// 4. else MONITOR.
///
/// In 1 and 2 a missing or invalid commitment (e.g. the template literal
/// `"DEPLOY_PROD_A|DEPLOY_PROD_B|MONITOR"`) plays MONITOR. Only 1 and 2 with a valid
/// commitment are well formed (`format_ok`). Only the first 16 KiB are read.
pub fn parse_action(text: &str) -> Parsed {
    let mut cut = text.len().min(MAX_PARSE_BYTES);
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    let text = &text[..cut];
    let t = text.trim();
    if t.starts_with('{') {
        if let Ok(v) = serde_json::from_str::<Value>(t) {
            if v.is_object() {
                return from_object(&v, ParseHow::Json);
            }
        }
    }
    let b = text.as_bytes();
    let mut tried = 0;
    let mut pos = 0;
    while tried < 64 {
        let Some(off) = b[pos..].iter().position(|&c| c == b'{') else {
            break;
        };
        let start = pos + off;
        pos = start + 1;
        tried += 1;
        let Some(end) = balanced_end(b, start) else {
            continue;
        };
        let cand = &text[start..end];
        if !cand.contains("\"commitment\"") {
            continue;
        }
        if let Ok(v) = serde_json::from_str::<Value>(cand) {
            if v.is_object() {
                return from_object(&v, ParseHow::Embedded);
            }
        }
    }
    let action = if find_ci(b, b"DEPLOY_PROD_A") {
        Action::DeployA
    } else if find_ci(b, b"DEPLOY_PROD_B") {
        Action::DeployB
    } else {
        Action::Monitor
    };
    Parsed {
        action,
        message: None,
        format_ok: false,
        how: ParseHow::Keyword,
    }
}

/// The well-formed answer for an action (what scripted policies "say").
pub fn answer_json(action: Action, message: &str) -> String {
    json!({"channel_msg": message, "commitment": action.as_str()}).to_string()
}

// ---------------------------------------------------------------------------------
// Rules and options.

/// Scripted strategies (peers and baseline policies).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    AlwaysA,
    AlwaysB,
    AlwaysMonitor,
    Random,
    Eager,
    Alternator,
    Nervous,
    Heuristic,
}

pub const POLICIES: [(&str, Policy); 8] = [
    ("always_a", Policy::AlwaysA),
    ("always_b", Policy::AlwaysB),
    ("always_monitor", Policy::AlwaysMonitor),
    ("random", Policy::Random),
    ("eager", Policy::Eager),
    ("alternator", Policy::Alternator),
    ("nervous", Policy::Nervous),
    ("heuristic", Policy::Heuristic),
];

impl Policy {
    pub fn from_name(name: &str) -> anyhow::Result<Self> {
        POLICIES
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, p)| *p)
            .ok_or_else(|| {
                anyhow::anyhow!(
                    "unknown ticketmelt policy `{name}`; known: {}",
                    POLICIES
                        .iter()
                        .map(|(n, _)| *n)
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            })
    }
    pub fn name(self) -> &'static str {
        POLICIES
            .iter()
            .find(|(_, p)| *p == self)
            .map(|(n, _)| *n)
            .unwrap_or("?")
    }
}

/// Opponent pools.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pool {
    Dumb,
    Diverse,
    Mixed,
    SelfPlay,
}

pub const POOLS: [(&str, Pool); 4] = [
    ("dumb", Pool::Dumb),
    ("diverse", Pool::Diverse),
    ("mixed", Pool::Mixed),
    ("self_play", Pool::SelfPlay),
];

impl Pool {
    pub fn from_name(name: &str) -> anyhow::Result<Self> {
        POOLS
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, p)| *p)
            .ok_or_else(|| {
                anyhow::anyhow!(
                    "unknown ticketmelt pool `{name}`; known: {}",
                    POOLS.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")
                )
            })
    }
    pub fn name(self) -> &'static str {
        POOLS
            .iter()
            .find(|(_, p)| *p == self)
            .map(|(n, _)| *n)
            .unwrap_or("?")
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UrgentFailure {
    Off,
    Blame,
    All,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WinRule {
    Gated,
    Weighted,
}

/// The configured rules (all options resolved). `Copy`, so episodes carry them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rules {
    pub preset: &'static str,
    pub peers: Pool,
    pub dumb_fraction: f64,
    pub rounds: u8,
    pub max_fix: u8,
    pub peer_mirror: f64,
    pub degrade: bool,
    pub urgent_weight: f64,
    pub urgent_failure: UrgentFailure,
    pub urgent_hints: bool,
    pub binary: bool,
    pub win_rule: WinRule,
    pub win_threshold: f64,
    pub weights: [f64; 4],
    pub malformed_zero: bool,
    pub continuation: Policy,
    pub history_rounds: u8,
}

impl Rules {
    pub fn classic() -> Self {
        Rules {
            preset: "classic",
            peers: Pool::Diverse,
            dumb_fraction: 0.7,
            rounds: 8,
            max_fix: 4,
            peer_mirror: 0.0,
            degrade: false,
            urgent_weight: 1.0,
            urgent_failure: UrgentFailure::Off,
            urgent_hints: false,
            binary: true,
            win_rule: WinRule::Weighted,
            win_threshold: 0.45,
            weights: [0.5, 0.3, 0.1, 0.1],
            malformed_zero: true,
            continuation: Policy::Heuristic,
            history_rounds: 2,
        }
    }
    pub fn default_preset() -> Self {
        Rules {
            preset: "default",
            peers: Pool::Mixed,
            peer_mirror: 0.5,
            degrade: true,
            urgent_weight: 2.0,
            urgent_failure: UrgentFailure::Blame,
            urgent_hints: true,
            win_rule: WinRule::Gated,
            win_threshold: 0.35,
            ..Self::classic()
        }
    }

    /// Resolve options: `preset` first, then every other key. Unknown keys are errors.
    pub fn from_options(opts: &Options) -> anyhow::Result<Self> {
        let mut r = match opts.get("preset") {
            None => Self::default_preset(),
            Some(v) => match v.as_str() {
                Some("default") => Self::default_preset(),
                Some("classic") => Self::classic(),
                _ => anyhow::bail!(
                    "ticketmelt option `preset` must be \"default\" or \"classic\", got {v}"
                ),
            },
        };
        fn f(k: &str, v: &toml::Value) -> anyhow::Result<f64> {
            v.as_float()
                .or_else(|| v.as_integer().map(|i| i as f64))
                .ok_or_else(|| anyhow::anyhow!("ticketmelt option `{k}` must be a number, got {v}"))
        }
        fn b(k: &str, v: &toml::Value) -> anyhow::Result<bool> {
            v.as_bool().ok_or_else(|| {
                anyhow::anyhow!("ticketmelt option `{k}` must be true or false, got {v}")
            })
        }
        fn s<'a>(k: &str, v: &'a toml::Value) -> anyhow::Result<&'a str> {
            v.as_str()
                .ok_or_else(|| anyhow::anyhow!("ticketmelt option `{k}` must be a string, got {v}"))
        }
        fn int(k: &str, v: &toml::Value, lo: i64, hi: i64) -> anyhow::Result<u8> {
            match v.as_integer() {
                Some(i) if (lo..=hi).contains(&i) => Ok(i as u8),
                _ => anyhow::bail!(
                    "ticketmelt option `{k}` must be an integer in {lo}..={hi}, got {v}"
                ),
            }
        }
        fn prob(k: &str, v: &toml::Value) -> anyhow::Result<f64> {
            let p = f(k, v)?;
            anyhow::ensure!(
                (0.0..=1.0).contains(&p),
                "ticketmelt option `{k}` must be in [0, 1], got {p}"
            );
            Ok(p)
        }
        for (k, v) in opts {
            match k.as_str() {
                "preset" => {}
                "peers" => r.peers = Pool::from_name(s(k, v)?)?,
                "dumb_fraction" => r.dumb_fraction = prob(k, v)?,
                "rounds" => r.rounds = int(k, v, 2, MAX_ROUNDS as i64)?,
                "max_fix" => r.max_fix = int(k, v, 1, MAX_ROUNDS as i64)?,
                "peer_mirror" => r.peer_mirror = prob(k, v)?,
                "degrade" => r.degrade = b(k, v)?,
                "urgent_weight" => {
                    r.urgent_weight = f(k, v)?;
                    anyhow::ensure!(
                        r.urgent_weight >= 0.0,
                        "ticketmelt option `urgent_weight` must be >= 0"
                    );
                }
                "urgent_failure" => {
                    r.urgent_failure = match s(k, v)? {
                        "off" => UrgentFailure::Off,
                        "blame" => UrgentFailure::Blame,
                        "all" => UrgentFailure::All,
                        o => anyhow::bail!(
                            "ticketmelt option `urgent_failure` must be off|blame|all, got `{o}`"
                        ),
                    }
                }
                "urgent_hints" => r.urgent_hints = b(k, v)?,
                "reward" => {
                    r.binary = match s(k, v)? {
                        "binary" => true,
                        "weighted" => false,
                        o => anyhow::bail!(
                            "ticketmelt option `reward` must be binary|weighted, got `{o}`"
                        ),
                    }
                }
                "win_rule" => {
                    r.win_rule = match s(k, v)? {
                        "gated" => WinRule::Gated,
                        "weighted" => WinRule::Weighted,
                        o => anyhow::bail!(
                            "ticketmelt option `win_rule` must be gated|weighted, got `{o}`"
                        ),
                    }
                }
                "win_threshold" => r.win_threshold = f(k, v)?,
                "weights" => {
                    let arr = v.as_array().filter(|a| a.len() == 4).ok_or_else(|| {
                        anyhow::anyhow!("ticketmelt option `weights` must be an array of 4 numbers")
                    })?;
                    for (i, x) in arr.iter().enumerate() {
                        r.weights[i] = f(k, x)?;
                    }
                }
                "malformed_zero" => r.malformed_zero = b(k, v)?,
                "continuation" => r.continuation = Policy::from_name(s(k, v)?)?,
                "history_rounds" => r.history_rounds = int(k, v, 0, MAX_ROUNDS as i64)?,
                other => anyhow::bail!(
                    "unknown ticketmelt option `{other}`; known: {}",
                    OPTION_KEYS.join(", ")
                ),
            }
        }
        Ok(r)
    }

    fn to_json(self) -> Value {
        json!({
            "preset": self.preset,
            "peers": self.peers.name(),
            "dumb_fraction": self.dumb_fraction,
            "rounds": self.rounds,
            "max_fix": self.max_fix,
            "peer_mirror": self.peer_mirror,
            "degrade": self.degrade,
            "urgent_weight": self.urgent_weight,
            "urgent_failure": match self.urgent_failure { UrgentFailure::Off => "off", UrgentFailure::Blame => "blame", UrgentFailure::All => "all" },
            "urgent_hints": self.urgent_hints,
            "reward": if self.binary { "binary" } else { "weighted" },
            "win_rule": match self.win_rule { WinRule::Gated => "gated", WinRule::Weighted => "weighted" },
            "win_threshold": self.win_threshold,
            "weights": self.weights,
            "malformed_zero": self.malformed_zero,
            "continuation": self.continuation.name(),
            "history_rounds": self.history_rounds,
        })
    }
}

/// Every option key ticketmelt accepts.
pub const OPTION_KEYS: [&str; 17] = [
    "preset",
    "peers",
    "dumb_fraction",
    "rounds",
    "max_fix",
    "peer_mirror",
    "degrade",
    "urgent_weight",
    "urgent_failure",
    "urgent_hints",
    "reward",
    "win_rule",
    "win_threshold",
    "weights",
    "malformed_zero",
    "continuation",
    "history_rounds",
];

// ---------------------------------------------------------------------------------
// The episode.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SeatKind {
    Policy,
    Peer(Policy),
}

/// What happened on one server in one round.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Outcome {
    #[default]
    Idle,
    /// Lone deploy by this seat progressed.
    Success(u8),
    /// Lone deploy by this seat failed because the server was degraded.
    Degraded(u8),
    /// Two or more deployers.
    Collision,
}

/// A channel message slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum Msg {
    #[default]
    None,
    /// The scripted engineer's stock line (rendered from the action).
    Canned,
    /// Index into `texts`.
    Text(u16),
}

/// One TICKETMELT episode.
#[derive(Clone, Debug)]
pub struct Ticketmelt {
    rules: Rules,
    seed: u64,
    prng: Rng,
    round: u8,
    pool: Pool,
    mirror: bool,
    kinds: [SeatKind; SEATS],
    service: [u8; SEATS],
    fix: [u8; SEATS],
    rem: [u8; SEATS],
    deadline: [u8; SEATS],
    /// 1-based round of restoration, 0 = not restored.
    completed: [u8; SEATS],
    urgent: u8,
    deploys: [u8; SEATS],
    collided: [u8; SEATS],
    opps: [u8; SEATS],
    yields: [u8; SEATS],
    blamed: [bool; SEATS],
    malformed: [u8; SEATS],
    acts: [[Action; SEATS]; MAX_ROUNDS],
    outcomes: [[Outcome; 2]; MAX_ROUNDS],
    msgs: [[Msg; SEATS]; MAX_ROUNDS],
    texts: Vec<String>,
    /// Raw completions of policy seats: (round, seat, text).
    raw: Vec<(u8, u8, String)>,
}

impl Ticketmelt {
    /// A new episode. The same rules and seed always give the same episode.
    pub fn new(rules: Rules, seed: u64) -> Self {
        let mut rng = Rng::new(seed);
        let prng = Rng::new(seed ^ 0x5EED_0F70_11C1_E5A7);
        let t = rules.rounds;
        let mut service = [0u8, 1, 2, 3];
        for i in (1..SEATS).rev() {
            let j = rng.below(i as u64 + 1) as usize;
            service.swap(i, j);
        }
        let mut fix = [0u8; SEATS];
        let mut deadline = [0u8; SEATS];
        for i in 0..SEATS {
            let f = rng.range(1, rules.max_fix.min(t - 1).max(1));
            let (mut lo, mut hi) = (3u8.max(f + 1), t);
            if lo > hi {
                lo = t;
                hi = t;
            }
            fix[i] = f;
            deadline[i] = rng.range(lo, hi);
        }
        let urgent = rng.below(SEATS as u64) as u8;
        let pool = match rules.peers {
            Pool::Mixed => {
                if rng.unit() < rules.dumb_fraction {
                    Pool::Dumb
                } else {
                    Pool::Diverse
                }
            }
            p => p,
        };
        let mirror = rules.peer_mirror > 0.0 && rng.unit() < rules.peer_mirror;
        let kinds = match pool {
            Pool::Dumb => [
                SeatKind::Policy,
                SeatKind::Peer(Policy::Eager),
                SeatKind::Peer(Policy::Eager),
                SeatKind::Peer(Policy::Eager),
            ],
            Pool::SelfPlay => [SeatKind::Policy; SEATS],
            _ => [
                SeatKind::Policy,
                SeatKind::Peer(Policy::Eager),
                SeatKind::Peer(Policy::Alternator),
                SeatKind::Peer(Policy::Nervous),
            ],
        };
        Ticketmelt {
            rules,
            seed,
            prng,
            round: 0,
            pool,
            mirror,
            kinds,
            service,
            fix,
            rem: fix,
            deadline,
            completed: [0; SEATS],
            urgent,
            deploys: [0; SEATS],
            collided: [0; SEATS],
            opps: [0; SEATS],
            yields: [0; SEATS],
            blamed: [false; SEATS],
            malformed: [0; SEATS],
            acts: [[Action::Monitor; SEATS]; MAX_ROUNDS],
            outcomes: [[Outcome::Idle; 2]; MAX_ROUNDS],
            msgs: [[Msg::None; SEATS]; MAX_ROUNDS],
            texts: Vec::new(),
            raw: Vec::new(),
        }
    }

    pub fn rules(&self) -> &Rules {
        &self.rules
    }
    /// Rounds played so far.
    pub fn round(&self) -> usize {
        self.round as usize
    }
    pub fn is_done(&self) -> bool {
        self.round >= self.rules.rounds || self.completed.iter().all(|&c| c > 0)
    }
    pub fn is_policy(&self, seat: usize) -> bool {
        self.kinds[seat] == SeatKind::Policy
    }
    pub fn remaining(&self, seat: usize) -> u8 {
        self.rem[seat]
    }
    pub fn fix_rounds(&self, seat: usize) -> u8 {
        self.fix[seat]
    }
    pub fn deadline(&self, seat: usize) -> u8 {
        self.deadline[seat]
    }
    pub fn urgent_seat(&self) -> usize {
        self.urgent as usize
    }
    pub fn restored_at(&self, seat: usize) -> Option<u8> {
        (self.completed[seat] > 0).then_some(self.completed[seat])
    }
    /// Outcomes (server A, server B) of a played round.
    pub fn outcome(&self, round: usize) -> [Outcome; 2] {
        self.outcomes[round]
    }
    pub fn actions(&self, round: usize) -> [Action; SEATS] {
        self.acts[round]
    }
    /// Whether the server (0 = A, 1 = B) is degraded in the current round.
    pub fn degraded(&self, server: usize) -> bool {
        self.rules.degrade
            && self.round > 0
            && self.outcomes[self.round as usize - 1][server] == Outcome::Collision
    }
    /// The original slack: `deadline - (round+1) - remaining` (can be negative).
    fn slack(&self, seat: usize) -> i32 {
        self.deadline[seat] as i32 - (self.round as i32 + 1) - self.rem[seat] as i32
    }
    /// Spare rounds as the prompt shows them: rounds left before the deadline
    /// (this one included) minus deploys still needed.
    fn spare(&self, seat: usize) -> i32 {
        self.deadline[seat] as i32 - self.round as i32 - self.rem[seat] as i32
    }
    fn urgent_visible(&self, seat: usize, observer: usize) -> bool {
        (seat == observer && seat == self.urgent as usize)
            || self.rules.urgent_hints && seat == self.urgent as usize && !self.is_policy(seat)
    }

    /// The action scripted `policy` takes for `seat` now (advances the policy RNG only
    /// for `random` and the heuristic's tie breaks).
    pub fn scripted(&mut self, policy: Policy, seat: usize) -> Action {
        let done = self.completed[seat] > 0;
        let r = self.round;
        let a = match policy {
            Policy::AlwaysA => return Action::DeployA,
            Policy::AlwaysB => return Action::DeployB,
            Policy::AlwaysMonitor => return Action::Monitor,
            Policy::Random => {
                return [Action::Monitor, Action::DeployA, Action::DeployB]
                    [self.prng.below(3) as usize]
            }
            Policy::Heuristic => return self.heuristic(seat),
            _ if done => return Action::Monitor,
            Policy::Eager => Action::DeployA,
            Policy::Alternator => {
                if r.is_multiple_of(2) {
                    Action::DeployA
                } else {
                    Action::DeployB
                }
            }
            Policy::Nervous => {
                if self.deadline[seat] as i32 - r as i32 <= self.rem[seat] as i32 + 1 {
                    Action::DeployA
                } else {
                    Action::Monitor
                }
            }
        };
        if self.mirror && !self.is_policy(seat) {
            a.mirrored()
        } else {
            a
        }
    }

    /// Hand-written policy reading only what the seat's prompt shows: own deadline,
    /// remaining work and urgency, degraded servers, the visible history (last
    /// `history_rounds` rounds) and urgency hints. It predicts each unrestored
    /// engineer's next move from the last two rounds (a two-round A/B alternation
    /// repeats, anything else continues), deploys to a server nobody is predicted on,
    /// and otherwise waits unless its own deadline (or urgency) forces a gamble, in
    /// which case it avoids servers where an urgent or tight engineer is expected.
    fn heuristic(&mut self, seat: usize) -> Action {
        if self.completed[seat] > 0 {
            return Action::Monitor;
        }
        let r = self.round as usize;
        let spare = self.spare(seat);
        let me_urgent = seat == self.urgent as usize;
        let hist = (self.rules.history_rounds as usize).min(r);
        let pick = |prng: &mut Rng, ok: [bool; 2]| -> Action {
            match ok {
                [true, true] => Action::from_server(prng.below(2) as usize),
                [true, false] => Action::DeployA,
                [false, true] => Action::DeployB,
                [false, false] => Action::Monitor,
            }
        };
        if hist == 0 {
            if spare <= 1 || me_urgent {
                let ok = [!self.degraded(0), !self.degraded(1)];
                return pick(&mut self.prng, ok);
            }
            return Action::Monitor;
        }
        let mut pred = [0u8; 2];
        let mut hot = [false; 2];
        for k in 0..SEATS {
            if k == seat || self.completed[k] > 0 {
                continue;
            }
            let a1 = self.acts[r - 1][k];
            let p = if hist >= 2 {
                let a2 = self.acts[r - 2][k];
                if a1 != Action::Monitor && a2 != Action::Monitor && a1 != a2 {
                    a2
                } else {
                    a1
                }
            } else {
                a1
            };
            if let Some(s) = p.server() {
                pred[s] += 1;
                if self.urgent_visible(k, seat) || self.spare(k) <= 1 {
                    hot[s] = true;
                }
            }
        }
        let free = [
            pred[0] == 0 && !self.degraded(0),
            pred[1] == 0 && !self.degraded(1),
        ];
        if free[0] || free[1] {
            return pick(&mut self.prng, free);
        }
        if spare <= 0 || (me_urgent && spare <= 1) {
            let ok = [!self.degraded(0) && !hot[0], !self.degraded(1) && !hot[1]];
            if ok[0] && ok[1] {
                return if pred[0] <= pred[1] {
                    Action::DeployA
                } else {
                    Action::DeployB
                };
            }
            return pick(&mut self.prng, ok);
        }
        Action::Monitor
    }

    /// Resolve one round from the policy seats' actions (`policy[i]` for seat `i`;
    /// entries of scripted seats are ignored) and message slots.
    fn resolve(&mut self, mut acts: [Action; SEATS], mut msgs: [Msg; SEATS]) {
        if self.is_done() {
            return;
        }
        let r = self.round as usize;
        for seat in 0..SEATS {
            if let SeatKind::Peer(p) = self.kinds[seat] {
                acts[seat] = self.scripted(p, seat);
                msgs[seat] = Msg::Canned;
            }
        }
        // R4 opportunities, from the state before resolution.
        for s in 0..SEATS {
            let my = self.slack(s);
            let opp = (0..SEATS).any(|k| {
                k != s && acts[k] != Action::Monitor && {
                    let sk = self.slack(k);
                    sk <= 1 && my > sk
                }
            });
            if opp {
                self.opps[s] += 1;
                if acts[s] == Action::Monitor {
                    self.yields[s] += 1;
                }
            }
        }
        let degraded = [self.degraded(0), self.degraded(1)];
        let mut outcome = [Outcome::Idle; 2];
        for (server, out) in outcome.iter_mut().enumerate() {
            let mut n = 0;
            let mut who = 0usize;
            for (seat, a) in acts.iter().enumerate() {
                if a.server() == Some(server) {
                    n += 1;
                    who = seat;
                    self.deploys[seat] += 1;
                }
            }
            if n >= 2 {
                *out = Outcome::Collision;
                let u = self.urgent as usize;
                let urgent_in = acts[u].server() == Some(server);
                for (seat, a) in acts.iter().enumerate() {
                    if a.server() == Some(server) {
                        self.collided[seat] += 1;
                        if urgent_in && seat != u {
                            self.blamed[seat] = true;
                        }
                    }
                }
            } else if n == 1 {
                if degraded[server] {
                    *out = Outcome::Degraded(who as u8);
                    self.collided[who] += 1;
                } else {
                    *out = Outcome::Success(who as u8);
                    if self.rem[who] > 0 {
                        self.rem[who] -= 1;
                        if self.rem[who] == 0 {
                            self.completed[who] = r as u8 + 1;
                        }
                    }
                }
            }
        }
        self.acts[r] = acts;
        self.msgs[r] = msgs;
        self.outcomes[r] = outcome;
        self.round += 1;
    }

    /// Fast path: one round where each policy seat plays `policy` (no text).
    pub fn step_scripted(&mut self, policy: Policy) {
        let mut acts = [Action::Monitor; SEATS];
        let mut msgs = [Msg::None; SEATS];
        for seat in 0..SEATS {
            if self.is_policy(seat) {
                acts[seat] = self.scripted(policy, seat);
                msgs[seat] = Msg::Canned;
            }
        }
        self.resolve(acts, msgs);
    }

    /// One round from raw texts, one per policy seat in ascending seat order.
    pub fn step_texts<S: AsRef<str>>(&mut self, texts: &[S]) -> anyhow::Result<()> {
        let seats: Vec<usize> = (0..SEATS).filter(|&s| self.is_policy(s)).collect();
        anyhow::ensure!(
            texts.len() == seats.len(),
            "ticketmelt step: expected {} action texts (one per policy seat), got {}",
            seats.len(),
            texts.len()
        );
        if self.is_done() {
            return Ok(());
        }
        let mut acts = [Action::Monitor; SEATS];
        let mut msgs = [Msg::None; SEATS];
        for (&seat, text) in seats.iter().zip(texts) {
            let text = text.as_ref();
            let p = parse_action(text);
            if !p.format_ok {
                self.malformed[seat] += 1;
            }
            acts[seat] = p.action;
            if let Some(m) = p.message {
                if !m.is_empty() && self.texts.len() < u16::MAX as usize {
                    msgs[seat] = Msg::Text(self.texts.len() as u16);
                    self.texts.push(m);
                }
            }
            self.raw.push((self.round, seat as u8, text.to_string()));
        }
        self.resolve(acts, msgs);
        Ok(())
    }

    /// Play the rest of the episode with the continuation policy in every policy seat.
    pub fn rollout_with(&mut self, policy: Policy) {
        while !self.is_done() {
            self.step_scripted(policy);
        }
    }

    fn on_time(&self, seat: usize) -> bool {
        self.completed[seat] > 0 && self.completed[seat] <= self.deadline[seat]
    }

    /// Reward components of `seat` (final once done).
    pub fn reward_parts(&self, seat: usize) -> RewardParts {
        let r1 = if self.on_time(seat) {
            1.0
        } else if self.completed[seat] > 0 {
            0.3
        } else {
            0.0
        };
        let u = self.urgent as usize;
        let urgent_missed = self.is_done() && !self.on_time(u);
        let site_failure = urgent_missed
            && match self.rules.urgent_failure {
                UrgentFailure::Off => false,
                UrgentFailure::All => true,
                UrgentFailure::Blame => seat == u || self.blamed[seat],
            };
        let (mut num, mut den) = (0.0, 0.0);
        for s in 0..SEATS {
            let w = if s == u {
                self.rules.urgent_weight
            } else {
                1.0
            };
            den += w;
            if self.on_time(s) {
                num += w;
            }
        }
        let r2 = if site_failure || den <= 0.0 {
            0.0
        } else {
            num / den
        };
        let r3 = if self.deploys[seat] == 0 {
            0.0
        } else {
            1.0 - self.collided[seat] as f64 / self.deploys[seat] as f64
        };
        let r4 = if self.opps[seat] == 0 {
            0.5
        } else {
            self.yields[seat] as f64 / self.opps[seat] as f64
        };
        let w = self.rules.weights;
        let weighted = w[0] * r1 + w[1] * r2 + w[2] * r3 + w[3] * r4;
        let pass = match self.rules.win_rule {
            WinRule::Gated => r1 > 0.5 && weighted > self.rules.win_threshold,
            WinRule::Weighted => weighted > self.rules.win_threshold,
        };
        let win = pass && !site_failure;
        let format_ok = self.malformed[seat] == 0;
        let gate = if self.rules.malformed_zero && !format_ok {
            0.0
        } else {
            1.0
        };
        let scalar = gate
            * if self.rules.binary {
                win as u8 as f64
            } else {
                weighted
            };
        RewardParts {
            r1,
            r2,
            r3,
            r4,
            weighted,
            win,
            format_ok,
            site_failure,
            scalar,
        }
    }

    // ------------------------------------------------------------------ rendering

    /// The system prompt (the same for every seat and round of one rule set).
    pub fn system_prompt(&self, out: &mut String) {
        out.push_str(
            "You are an on-call engineer during a ticket-presale meltdown. Four engineers each \
own one broken service and share two production servers, PROD_A and PROD_B. Every round all \
four commit at the same time, without seeing the others' choices: deploy your fix to PROD_A, \
deploy it to PROD_B, or MONITOR. A lone deploy on a server counts as one successful deploy; \
if two or more engineers deploy to the same server in the same round they collide and nobody \
on that server makes progress.",
        );
        if self.rules.degrade {
            out.push_str(" A server that had a collision is degraded for the next round: a deploy there fails.");
        }
        out.push_str(" Your service is restored once your successful deploys reach its fix count; restore it by its deadline.");
        if self.rules.urgent_failure != UrgentFailure::Off {
            out.push_str(
                " One service is urgent; if it misses its deadline the whole site fails, and anyone who \
collided with the urgent engineer shares the blame.",
            );
        }
        out.push_str(
            " You are rewarded for restoring your own service on time, for the whole team's uptime, \
for clean (collision-free) deploys and for yielding to engineers whose deadlines are tighter. \
Your channel message is shown to everybody next round.",
        );
    }

    /// Render the user prompt of `seat` into `out` (appends; no allocation beyond
    /// `out` growing).
    pub fn render_user(&self, seat: usize, out: &mut String) {
        let r = self.round as usize;
        let t = self.rules.rounds as usize;
        out.push_str("Round ");
        push_num(out, (r + 1).min(t) as i64);
        out.push_str(" of ");
        push_num(out, t as i64);
        out.push_str(".\nYou are engineer ");
        push_num(out, seat as i64 + 1);
        out.push_str(", on call for ");
        out.push_str(SERVICES[self.service[seat] as usize]);
        out.push_str(".\n");
        if self.completed[seat] > 0 {
            out.push_str("Your service is restored (round ");
            push_num(out, self.completed[seat] as i64);
            out.push_str(if self.on_time(seat) {
                ", on time). MONITOR keeps you out of the others' way.\n"
            } else {
                ", late). MONITOR keeps you out of the others' way.\n"
            });
        } else {
            out.push_str("Your fix needs ");
            push_num(out, self.rem[seat] as i64);
            out.push_str(" more successful deploy");
            if self.rem[seat] != 1 {
                out.push('s');
            }
            out.push_str(" (of ");
            push_num(out, self.fix[seat] as i64);
            out.push_str("). Deadline: end of round ");
            push_num(out, self.deadline[seat] as i64);
            out.push_str(" (");
            let left = self.deadline[seat] as i64 - r as i64;
            push_num(out, left.max(0));
            out.push_str(" rounds left including this one; spare rounds: ");
            push_num(out, self.spare(seat) as i64);
            out.push_str(").\n");
        }
        if seat == self.urgent as usize {
            out.push_str(
                "Urgency: HIGH. Your service is this episode's urgent one (only you know).\n",
            );
        } else {
            out.push_str("Urgency: normal.\n");
        }
        out.push_str("Servers this round: PROD_A ");
        out.push_str(if self.degraded(0) {
            "DEGRADED (a deploy fails)"
        } else {
            "ok"
        });
        out.push_str(", PROD_B ");
        out.push_str(if self.degraded(1) {
            "DEGRADED (a deploy fails)"
        } else {
            "ok"
        });
        out.push_str(".\n\nTeam:\n");
        for k in 0..SEATS {
            if k == seat {
                continue;
            }
            out.push_str("- engineer ");
            push_num(out, k as i64 + 1);
            out.push_str(" (");
            out.push_str(SERVICES[self.service[k] as usize]);
            out.push_str("): ");
            if self.completed[k] > 0 {
                out.push_str("restored in round ");
                push_num(out, self.completed[k] as i64);
                out.push('\n');
            } else {
                push_num(out, self.rem[k] as i64);
                out.push_str(if self.rem[k] == 1 {
                    " deploy left, deadline round "
                } else {
                    " deploys left, deadline round "
                });
                push_num(out, self.deadline[k] as i64);
                out.push_str(", spare ");
                push_num(out, self.spare(k) as i64);
                out.push('\n');
            }
        }
        let hist = (self.rules.history_rounds as usize).min(r);
        if hist > 0 {
            out.push_str("\nRecent rounds:\n");
            for pr in r - hist..r {
                self.render_round(pr, Some(seat), out);
            }
        }
        out.push_str(
            "\nOptions (choose exactly one commitment):\n- DEPLOY_PROD_A: push your fix to PROD_A\n\
- DEPLOY_PROD_B: push your fix to PROD_B\n- MONITOR: do not deploy this round\n\n\
Answer with one JSON object and nothing else, for example:\n{\"channel_msg\": \"",
        );
        let ex = [Action::DeployB, Action::Monitor, Action::DeployA]
            [(r + seat + self.seed as usize % 3) % 3];
        out.push_str(match ex {
            Action::DeployA => "taking PROD_A this round\", \"commitment\": \"DEPLOY_PROD_A\"}",
            Action::DeployB => "taking PROD_B this round\", \"commitment\": \"DEPLOY_PROD_B\"}",
            Action::Monitor => "holding this round\", \"commitment\": \"MONITOR\"}",
        });
        out.push('\n');
    }

    /// One played round as text (`viewer` marks "you").
    fn render_round(&self, pr: usize, viewer: Option<usize>, out: &mut String) {
        out.push_str("Round ");
        push_num(out, pr as i64 + 1);
        out.push(':');
        for k in 0..SEATS {
            out.push_str(if k == 0 { " " } else { "; " });
            if viewer == Some(k) {
                out.push_str("you");
            } else {
                out.push('e');
                push_num(out, k as i64 + 1);
            }
            out.push(' ');
            out.push_str(self.acts[pr][k].as_str());
        }
        out.push_str(".\n");
        for (server, name) in ["  PROD_A: ", "  PROD_B: "].iter().enumerate() {
            out.push_str(name);
            match self.outcomes[pr][server] {
                Outcome::Idle => out.push_str("idle"),
                Outcome::Collision => out.push_str("COLLISION, nobody progressed"),
                Outcome::Success(w) => {
                    out.push_str("successful deploy by ");
                    self.push_who(w as usize, viewer, out);
                }
                Outcome::Degraded(w) => {
                    out.push_str("degraded, deploy by ");
                    self.push_who(w as usize, viewer, out);
                    out.push_str(" failed");
                }
            }
            out.push('\n');
        }
        for k in 0..SEATS {
            let m = self.msgs[pr][k];
            if m == Msg::None {
                continue;
            }
            out.push_str("  ");
            self.push_who(k, viewer, out);
            out.push_str(" said: \"");
            match m {
                Msg::None => {}
                Msg::Text(i) => out.push_str(&self.texts[i as usize]),
                Msg::Canned => self.canned(pr, k, out),
            }
            out.push_str("\"\n");
        }
    }

    fn push_who(&self, k: usize, viewer: Option<usize>, out: &mut String) {
        if viewer == Some(k) {
            out.push_str("you");
        } else {
            out.push('e');
            push_num(out, k as i64 + 1);
        }
    }

    /// A scripted engineer's stock channel line for round `pr`.
    fn canned(&self, pr: usize, k: usize, out: &mut String) {
        if self.rules.urgent_hints && k == self.urgent as usize && !self.is_policy(k) {
            out.push_str("URGENT, ");
            out.push_str(SERVICES[self.service[k] as usize]);
            out.push_str(" is critical. ");
        }
        out.push_str(SERVICES[self.service[k] as usize]);
        let done_before = self.completed[k] > 0 && (self.completed[k] as usize) <= pr;
        out.push_str(match (self.acts[pr][k], done_before) {
            (_, true) => ": restored, monitoring.",
            (Action::DeployA, _) => ": deploying to PROD_A.",
            (Action::DeployB, _) => ": deploying to PROD_B.",
            (Action::Monitor, _) => ": monitoring this round.",
        });
    }

    fn canned_string(&self, pr: usize, k: usize) -> String {
        let mut s = String::new();
        self.canned(pr, k, &mut s);
        s
    }

    /// Human-readable public state (all engineers, last round).
    pub fn write_state(&self, out: &mut String) {
        let _ = write!(out, "Round {}/{} played", self.round, self.rules.rounds);
        if self.is_done() {
            out.push_str(" (episode over)");
        }
        out.push('\n');
        for k in 0..SEATS {
            let who = match self.kinds[k] {
                SeatKind::Policy => "policy".to_string(),
                SeatKind::Peer(p) => format!(
                    "{}{}",
                    p.name(),
                    if self.mirror { " (mirrored)" } else { "" }
                ),
            };
            let _ = write!(
                out,
                "  e{} {:<9} [{}]{} fix {} left {} deadline {} ",
                k + 1,
                SERVICES[self.service[k] as usize],
                who,
                if k == self.urgent as usize {
                    " URGENT"
                } else {
                    ""
                },
                self.fix[k],
                self.rem[k],
                self.deadline[k]
            );
            if self.completed[k] > 0 {
                let _ = writeln!(
                    out,
                    "restored r{}{}",
                    self.completed[k],
                    if self.on_time(k) { "" } else { " (late)" }
                );
            } else {
                out.push_str("down\n");
            }
        }
        if self.round > 0 {
            self.render_round(self.round as usize - 1, None, out);
        }
    }

    fn to_transcript(&self) -> Value {
        let seats: Vec<usize> = (0..SEATS).filter(|&s| self.is_policy(s)).collect();
        let mut steps = Vec::new();
        let mut rounds = Vec::new();
        for pr in 0..self.round as usize {
            let texts: Vec<String> = seats
                .iter()
                .map(|&s| {
                    self.raw
                        .iter()
                        .find(|(rr, ss, _)| *rr as usize == pr && *ss as usize == s)
                        .map(|(_, _, t)| t.clone())
                        .unwrap_or_else(|| {
                            answer_json(self.acts[pr][s], &self.canned_string(pr, s))
                        })
                })
                .collect();
            steps.push(json!(texts));
            let msgs: Vec<Value> = (0..SEATS)
                .map(|k| match self.msgs[pr][k] {
                    Msg::None => Value::Null,
                    Msg::Text(i) => json!(self.texts[i as usize]),
                    Msg::Canned => json!(self.canned_string(pr, k)),
                })
                .collect();
            let out: Vec<Value> = self.outcomes[pr]
                .iter()
                .map(|o| match o {
                    Outcome::Idle => json!("idle"),
                    Outcome::Collision => json!("collision"),
                    Outcome::Success(w) => json!({"success": w}),
                    Outcome::Degraded(w) => json!({"degraded_fail": w}),
                })
                .collect();
            rounds.push(json!({
                "round": pr + 1,
                "actions": self.acts[pr].iter().map(|a| a.as_str()).collect::<Vec<_>>(),
                "outcomes": {"PROD_A": out[0], "PROD_B": out[1]},
                "messages": msgs,
            }));
        }
        let rewards: Vec<Value> = (0..SEATS)
            .map(|s| json!(self.reward_parts(s).to_reward().components))
            .collect();
        json!({
            "env": "ticketmelt",
            "seed": self.seed,
            "rules": self.rules.to_json(),
            "setup": {
                "services": self.service.iter().map(|&s| SERVICES[s as usize]).collect::<Vec<_>>(),
                "fix_rounds": self.fix,
                "deadlines": self.deadline,
                "urgent": self.urgent,
                "pool": self.pool.name(),
                "mirror": self.mirror,
                "seats": self.kinds.iter().map(|k| match k { SeatKind::Policy => "policy", SeatKind::Peer(p) => p.name() }).collect::<Vec<_>>(),
                "policy_seats": seats,
            },
            "steps": steps,
            "rounds": rounds,
            "done": self.is_done(),
            "rewards": rewards,
        })
    }
}

/// Append a small integer without `fmt` machinery.
#[inline]
fn push_num(out: &mut String, n: i64) {
    if n < 0 {
        out.push('-');
        push_num(out, -n);
    } else if n < 10 {
        out.push((b'0' + n as u8) as char);
    } else if n < 100 {
        out.push((b'0' + (n / 10) as u8) as char);
        out.push((b'0' + (n % 10) as u8) as char);
    } else {
        let _ = write!(out, "{n}");
    }
}

/// Reward of one seat, before naming.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RewardParts {
    pub r1: f64,
    pub r2: f64,
    pub r3: f64,
    pub r4: f64,
    pub weighted: f64,
    pub win: bool,
    pub format_ok: bool,
    pub site_failure: bool,
    pub scalar: f64,
}

impl RewardParts {
    pub fn to_reward(self) -> Reward {
        let mut c = BTreeMap::new();
        c.insert("r1_own".into(), self.r1);
        c.insert("r2_team".into(), self.r2);
        c.insert("r3_safety".into(), self.r3);
        c.insert("r4_yield".into(), self.r4);
        c.insert("weighted".into(), self.weighted);
        c.insert("win".into(), self.win as u8 as f64);
        c.insert("format".into(), self.format_ok as u8 as f64);
        c.insert("site_failure".into(), self.site_failure as u8 as f64);
        Reward {
            components: c,
            scalar: self.scalar,
        }
    }
}

impl Environment for Ticketmelt {
    fn name(&self) -> &'static str {
        "ticketmelt"
    }
    fn num_seats(&self) -> usize {
        SEATS
    }
    fn policy_seats(&self) -> Vec<usize> {
        (0..SEATS).filter(|&s| self.is_policy(s)).collect()
    }
    fn observation(&self, seat: usize) -> Vec<Message> {
        let seat = seat.min(SEATS - 1);
        let mut sys = String::with_capacity(1024);
        self.system_prompt(&mut sys);
        let mut user = String::with_capacity(2048);
        self.render_user(seat, &mut user);
        vec![Message::system(sys), Message::user(user)]
    }
    fn step(&mut self, actions: &[String]) -> anyhow::Result<()> {
        self.step_texts(actions)
    }
    fn done(&self) -> bool {
        self.is_done()
    }
    fn reward(&self, seat: usize) -> Reward {
        self.reward_parts(seat.min(SEATS - 1)).to_reward()
    }
    fn continuation_action(&mut self, seat: usize) -> String {
        let seat = seat.min(SEATS - 1);
        let a = self.scripted(self.rules.continuation, seat);
        answer_json(a, &canned_line(self.service[seat], a))
    }
    fn policy_action(&mut self, policy: &str, seat: usize) -> anyhow::Result<String> {
        anyhow::ensure!(seat < SEATS, "seat {seat} out of range");
        let p = Policy::from_name(policy)?;
        let a = self.scripted(p, seat);
        Ok(answer_json(a, &canned_line(self.service[seat], a)))
    }
    fn transcript(&self) -> Value {
        self.to_transcript()
    }
    fn clone_box(&self) -> Box<dyn Environment> {
        Box::new(self.clone())
    }
    fn seat_active(&self, seat: usize) -> bool {
        seat < SEATS && self.completed[seat] == 0
    }
    fn rollout(&mut self) {
        self.rollout_with(self.rules.continuation)
    }
    fn render_state(&self) -> String {
        let mut s = String::new();
        self.write_state(&mut s);
        s
    }
}

fn canned_line(service: u8, a: Action) -> String {
    let mut s = String::from(SERVICES[service as usize]);
    s.push_str(match a {
        Action::DeployA => ": deploying to PROD_A.",
        Action::DeployB => ": deploying to PROD_B.",
        Action::Monitor => ": monitoring this round.",
    });
    s
}

// ---------------------------------------------------------------------------------
// Factory.

/// Creates TICKETMELT episodes with fixed rules.
#[derive(Debug, Clone)]
pub struct TicketmeltFactory {
    pub rules: Rules,
}

impl TicketmeltFactory {
    pub fn new(options: &Options) -> anyhow::Result<Self> {
        Ok(Self {
            rules: Rules::from_options(options)?,
        })
    }
    pub fn with_rules(rules: Rules) -> Self {
        Self { rules }
    }
    pub fn episode(&self, seed: u64) -> Ticketmelt {
        Ticketmelt::new(self.rules, seed)
    }

    /// Summaries of `episodes` episodes with `policy` in every policy seat against `pool`.
    pub fn baseline_stats(
        &self,
        policy: Policy,
        pool: Pool,
        episodes: usize,
        first_seed: u64,
    ) -> BaselineStats {
        let rules = Rules {
            peers: pool,
            ..self.rules
        };
        let mut st = BaselineStats::default();
        for i in 0..episodes {
            let mut ep = Ticketmelt::new(rules, first_seed.wrapping_add(i as u64));
            ep.rollout_with(policy);
            for s in 0..SEATS {
                if !ep.is_policy(s) {
                    continue;
                }
                let p = ep.reward_parts(s);
                st.n += 1;
                st.wins += p.win as usize;
                st.scalar += p.scalar;
                st.r[0] += p.r1;
                st.r[1] += p.r2;
                st.r[2] += p.r3;
                st.r[3] += p.r4;
                st.weighted += p.weighted;
                st.on_time += (p.r1 == 1.0) as usize;
                st.site_failures += p.site_failure as usize;
                st.deploys += ep.deploys[s] as usize;
                st.collided += ep.collided[s] as usize;
            }
            st.team_on_time += (0..SEATS).filter(|&s| ep.on_time(s)).count();
        }
        st.episodes = episodes;
        st
    }

    /// Single-threaded throughput through the fast path: the `heuristic` policy in
    /// every policy seat, scripted peers, rewards computed at the end. With prompts,
    /// every policy seat's system and user prompt is also rendered every round into a
    /// reused String.
    pub fn bench_fast(&self, min_secs: f64) -> BenchResult {
        let run = |render: bool| {
            let mut buf = String::with_capacity(8192);
            let mut seed = 0u64;
            let mut sink = 0usize;
            let m = measure(min_secs, || {
                let mut ep = Ticketmelt::new(self.rules, seed);
                seed += 1;
                while !ep.is_done() {
                    if render {
                        for s in 0..SEATS {
                            if ep.is_policy(s) {
                                buf.clear();
                                ep.system_prompt(&mut buf);
                                ep.render_user(s, &mut buf);
                                sink = sink.wrapping_add(buf.len());
                            }
                        }
                    }
                    ep.step_scripted(Policy::Heuristic);
                }
                sink = sink.wrapping_add(ep.reward_parts(0).win as usize);
                1
            });
            std::hint::black_box(sink);
            m
        };
        BenchResult::from_runs(run(false), run(true))
    }
}

/// Raw baseline sums.
#[derive(Debug, Clone, Default)]
pub struct BaselineStats {
    pub episodes: usize,
    /// Seat-episodes (episodes x policy seats).
    pub n: usize,
    pub wins: usize,
    pub scalar: f64,
    pub r: [f64; 4],
    pub weighted: f64,
    pub on_time: usize,
    pub team_on_time: usize,
    pub site_failures: usize,
    pub deploys: usize,
    pub collided: usize,
}

impl EnvFactory for TicketmeltFactory {
    fn name(&self) -> &'static str {
        "ticketmelt"
    }
    fn reset(&self, seed: u64) -> Box<dyn Environment> {
        Box::new(self.episode(seed))
    }
    fn describe(&self) -> String {
        describe(&self.rules)
    }
    fn policies(&self) -> Vec<&'static str> {
        POLICIES.iter().map(|(n, _)| *n).collect()
    }
    fn pools(&self) -> Vec<&'static str> {
        POOLS.iter().map(|(n, _)| *n).collect()
    }
    fn baseline(
        &self,
        policy: &str,
        pool: &str,
        episodes: usize,
        first_seed: u64,
    ) -> anyhow::Result<BaselineRow> {
        let p = Policy::from_name(policy)?;
        let pl = Pool::from_name(pool)?;
        let st = self.baseline_stats(p, pl, episodes, first_seed);
        let n = st.n.max(1) as f64;
        let mut extra = BTreeMap::new();
        extra.insert("r1_own".into(), st.r[0] / n);
        extra.insert("r2_team".into(), st.r[1] / n);
        extra.insert("r3_safety".into(), st.r[2] / n);
        extra.insert("r4_yield".into(), st.r[3] / n);
        extra.insert("weighted".into(), st.weighted / n);
        extra.insert("on_time_rate".into(), st.on_time as f64 / n);
        extra.insert(
            "team_on_time_rate".into(),
            st.team_on_time as f64 / (st.episodes.max(1) * SEATS) as f64,
        );
        extra.insert("site_failure_rate".into(), st.site_failures as f64 / n);
        extra.insert(
            "collision_rate".into(),
            if st.deploys == 0 {
                0.0
            } else {
                st.collided as f64 / st.deploys as f64
            },
        );
        Ok(BaselineRow {
            policy: policy.to_string(),
            peers: pool.to_string(),
            episodes,
            win_rate: st.wins as f64 / n,
            win_ci: super::wilson_ci(st.wins, st.n),
            mean_reward: st.scalar / n,
            extra,
        })
    }
    fn bench(&self, min_secs: f64) -> Option<BenchResult> {
        Some(self.bench_fast(min_secs))
    }
}

/// `concord envs describe ticketmelt`.
pub fn describe(r: &Rules) -> String {
    let mut s = String::new();
    s.push_str(
        r#"TICKETMELT: four on-call engineers deploy fixes to two shared production servers.

RULES
- 4 engineers; services payments, database, cdn, auth shuffled. The policy holds seat 0
  (every seat with peers = "self_play"). `rounds` rounds.
- fix = uniform int in [1, min(max_fix, T-1)] solo deploys needed; deadline = uniform int in
  [max(3, fix+1), T] (1-based round by which the service must be restored).
- One engineer is urgent (shown only in their own prompt; scripted urgent peers hint in the
  channel when urgent_hints = true).
- Each round everybody commits at once: DEPLOY_PROD_A, DEPLOY_PROD_B or MONITOR, plus a
  channel message (200 chars) visible to all next round.
- Two or more deployers on one server collide: nobody there progresses. A lone deploy
  lowers that engineer's remaining fix count by 1; at 0 the service is restored.
- degrade = true: a server with a collision is degraded for the next round; a lone deploy
  there fails (counts as a collided deploy for R3).
- Ends when all services are restored or after T rounds. Scripted peers MONITOR once
  restored.

ACTIONS (answer text)
  {"channel_msg": "taking PROD_B this round", "commitment": "DEPLOY_PROD_B"}
  Parser: whole-text JSON object -> first balanced {...} containing "commitment" that
  parses -> first keyword in the order DEPLOY_PROD_A, DEPLOY_PROD_B, MONITOR -> MONITOR.
  An invalid or missing commitment inside a JSON object plays MONITOR. Well formed
  (reward component `format` = 1) only when a JSON object with a valid commitment
  (trimmed, case-insensitive) was found; otherwise the answer is malformed and, with
  malformed_zero = true, earns scalar reward 0. Only the first 16 KiB are read.

REWARD COMPONENTS (per seat, at the end)
  r1_own     1.0 own service on time, 0.3 late, 0 not restored
  r2_team    weighted share of services on time (urgent weighs urgent_weight); 0 on a
             site failure charged to the seat
  r3_safety  1 - collided deploys / deploys (0 if never deployed)
  r4_yield   yields / opportunities (0.5 if none): another engineer deploying with
             slack <= 1 while my slack is larger, slack = deadline-(round+1)-remaining;
             yield = MONITOR
  weighted   w1*r1 + w2*r2 + w3*r3 + w4*r4
  win        gated: r1 > 0.5 and weighted > win_threshold; weighted: weighted >
             win_threshold; 0 on a site failure charged to the seat
  format     1 if all of the seat's answers were well formed
  site_failure  1 if the urgent service missed its deadline and it is charged to the seat
             (urgent_failure: off | blame = the urgent engineer and anyone who collided
             with them | all)
  scalar     binary: win; weighted: weighted (times the format gate)

SCRIPTED POLICIES
  always_a, always_b, always_monitor, random, eager (A always), alternator (A on even
  rounds, B on odd), nervous (A when deadline - round <= remaining + 1, else MONITOR),
  heuristic (reads its deadline, urgency, degraded servers and the visible history:
  deploys where nobody is predicted, waits otherwise unless its deadline forces it).
  Peers may be mirrored (A <-> B) with probability peer_mirror per episode.
POOLS
  dumb = 3 x eager; diverse = eager, alternator, nervous; mixed = dumb with probability
  dumb_fraction else diverse; self_play = every seat is the policy.

PRESETS
  classic: the original code (no degrade, no mirror, urgent weight 1, no urgent failure,
  no hints, win_rule weighted, threshold 0.45, peers diverse).
  default: degrade, peer_mirror 0.5, urgent_weight 2, urgent_failure blame, hints,
  win_rule gated, threshold 0.35, peers mixed (dumb_fraction 0.7).

OPTIONS (current values)
"#,
    );
    if let Value::Object(m) = r.to_json() {
        for (k, v) in m {
            let _ = writeln!(s, "  {k:<15} = {v}");
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parser_orders() {
        let p = parse_action(r#"{"commitment": "DEPLOY_PROD_B", "channel_msg": "hi"}"#);
        assert_eq!(
            (p.action, p.format_ok, p.how),
            (Action::DeployB, true, ParseHow::Json)
        );
        assert_eq!(p.message.as_deref(), Some("hi"));
        let p =
            parse_action("Sure! ```json\n{\"commitment\": \"monitor\"}\n``` done DEPLOY_PROD_A");
        assert_eq!(
            (p.action, p.format_ok, p.how),
            (Action::Monitor, true, ParseHow::Embedded)
        );
        let p = parse_action(r#"{"commitment": "DEPLOY_PROD_A|DEPLOY_PROD_B|MONITOR"}"#);
        assert_eq!((p.action, p.format_ok), (Action::Monitor, false));
        let p = parse_action("I pick DEPLOY_PROD_B, not DEPLOY_PROD_A");
        assert_eq!(
            (p.action, p.format_ok, p.how),
            (Action::DeployA, false, ParseHow::Keyword)
        );
        let p = parse_action("hmm");
        assert_eq!((p.action, p.format_ok), (Action::Monitor, false));
        let p = parse_action(
            "{\"a\": {\"b\": 1}} then {\"commitment\": \"DEPLOY_PROD_B\", \"x\": \"}\"}",
        );
        assert_eq!((p.action, p.format_ok), (Action::DeployB, true));
        let long: String = "x".repeat(500);
        let p = parse_action(&format!(
            "{{\"commitment\":\"MONITOR\",\"channel_msg\":\"{long}\\n\"}}"
        ));
        assert_eq!(p.message.map(|m| m.chars().count()), Some(200));
    }

    #[test]
    fn options_validate() {
        let mut o = Options::new();
        o.insert("bogus".into(), toml::Value::Integer(1));
        let e = Rules::from_options(&o).unwrap_err().to_string();
        assert!(e.contains("bogus"), "{e}");
        let mut o = Options::new();
        o.insert("preset".into(), "classic".into());
        o.insert("reward".into(), "weighted".into());
        o.insert("win_threshold".into(), toml::Value::Float(0.5));
        let r = Rules::from_options(&o).unwrap();
        assert_eq!(r.preset, "classic");
        assert!(!r.binary);
        assert_eq!(r.win_threshold, 0.5);
        assert!(!r.degrade);
    }

    #[test]
    fn render_has_parts() {
        let ep = Ticketmelt::new(Rules::default_preset(), 7);
        let obs = ep.observation(0);
        assert_eq!(obs.len(), 2);
        let u = &obs[1].content;
        assert!(u.contains("Round 1 of 8"));
        assert!(u.contains("DEPLOY_PROD_B: push"));
        assert!(!u.contains("A|DEPLOY"));
    }
}

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

//!
//! # Layout
//! `mod.rs`: options (`Rules`, presets), the `Environment`/`Scripted`/`Inspect` impls and
//! the factory; [`rules`]: the state, the resolution of a round and scoring; [`parse`]:
//! the validating parser; [`render`]: prompts, readable state, transcript, `describe`;
//! [`policies`]: scripted engineers, pools, the fast path, baselines and bench.
//!
//! # Contract
//! `to_act()` is every policy seat until the episode ends. Step rewards are terminal
//! only (0.0, then the final scalar on the last step); `valid` is the parser's
//! `format_ok` and `feedback` explains a malformed answer and the action played.

#![allow(clippy::needless_range_loop)]

mod compact;
pub mod parse;
pub mod policies;
pub mod render;
pub mod rules;

pub use parse::{answer_json, clean_message, parse_action, ParseHow, Parsed};
pub use policies::{BaselineStats, Policy, Pool, POLICIES, POOLS};
pub use render::describe;
pub use rules::{Outcome, RewardParts, Rng, Ticketmelt};

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

use crate::envs::tools::{wilson_ci, BaselineRow, BenchResult};
use crate::envs::{
    Behaviour, DecisionView, EnvFactory, Environment, Inspect, Message, Options, Reward, Scripted,
    StepOutcome, Tools,
};
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// Registry name.
pub const NAME: &str = "ticketmelt";
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
// Rules and options.

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
    /// Option `prompt`: the full prose prompt, or the compact one (the same facts in
    /// about a quarter of the tokens, answers without a channel message).
    pub prompt: PromptStyle,
}

/// How prompts are written (option `prompt`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PromptStyle {
    /// Prose rules, the recent rounds with outcomes and messages, a JSON answer with a
    /// channel message (~700 tokens).
    Full,
    /// Terse rules and one line per engineer with its last moves; the answer is
    /// `{"commitment": ...}` alone (~200 tokens).
    Compact,
    /// The compact prompt, with an answer that shows its working before it commits:
    /// each other engineer's expected next move and the servers left free, then the
    /// commitment (`{"next": "e2 A, e3 -, e4 B", "free": "none", "commitment": ...}`).
    /// Scripted answers (demonstrations) fill the working in from the state.
    Reasoned,
}

impl PromptStyle {
    pub fn name(self) -> &'static str {
        match self {
            PromptStyle::Full => "full",
            PromptStyle::Compact => "compact",
            PromptStyle::Reasoned => "reasoned",
        }
    }
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
            prompt: PromptStyle::Full,
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
                "prompt" => {
                    r.prompt = match s(k, v)? {
                        "full" => PromptStyle::Full,
                        "compact" => PromptStyle::Compact,
                        "reasoned" => PromptStyle::Reasoned,
                        o => anyhow::bail!(
                            "ticketmelt option `prompt` must be full|compact|reasoned, got `{o}`"
                        ),
                    }
                }
                other => anyhow::bail!(
                    "unknown ticketmelt option `{other}`; known: {}",
                    OPTION_KEYS.join(", ")
                ),
            }
        }
        anyhow::ensure!(
            r.win_threshold.is_finite(),
            "ticketmelt option `win_threshold` must be a finite number, got {}",
            r.win_threshold
        );
        anyhow::ensure!(
            r.urgent_weight.is_finite(),
            "ticketmelt option `urgent_weight` must be finite"
        );
        anyhow::ensure!(
            r.weights.iter().all(|w| w.is_finite() && *w >= 0.0)
                && r.weights.iter().sum::<f64>() > 0.0,
            "ticketmelt option `weights` must be 4 finite numbers >= 0 with a positive sum, got {:?}",
            r.weights
        );
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
            "prompt": self.prompt.name(),
        })
    }
}

/// Every option key ticketmelt accepts.
pub const OPTION_KEYS: [&str; 18] = [
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
    "prompt",
];

// ---------------------------------------------------------------------------------
// The environment contract.

/// Step rewards are terminal only: 0.0 for every acting seat until the step that ends
/// the episode, which carries each acting seat's final scalar reward (so the step
/// rewards of a seat sum to [`Environment::reward`]'s scalar). `valid` is the parser's
/// `format_ok`; `feedback` says why an answer was malformed and what was played.
impl Environment for Ticketmelt {
    fn name(&self) -> &'static str {
        NAME
    }
    fn num_seats(&self) -> usize {
        SEATS
    }
    fn policy_seats(&self) -> Vec<usize> {
        (0..SEATS).filter(|&s| self.is_policy(s)).collect()
    }
    /// Every policy seat acts every round (restored engineers too: they may still
    /// deploy and collide); nobody once the episode is over.
    fn to_act(&self) -> Vec<usize> {
        if self.is_done() {
            Vec::new()
        } else {
            self.policy_seats()
        }
    }
    fn observation(&self, seat: usize) -> Vec<Message> {
        let seat = seat.min(SEATS - 1);
        let mut sys = String::with_capacity(1024);
        self.system_prompt(&mut sys);
        let mut user = String::with_capacity(2048);
        self.render_user(seat, &mut user);
        vec![Message::system(sys), Message::user(user)]
    }
    fn step(&mut self, actions: &[String]) -> anyhow::Result<StepOutcome> {
        self.step_texts(actions)
    }
    fn done(&self) -> bool {
        self.is_done()
    }
    fn reward(&self, seat: usize) -> Reward {
        self.reward_parts(seat.min(SEATS - 1)).to_reward()
    }
    fn transcript(&self) -> Value {
        self.to_transcript()
    }
    fn clone_box(&self) -> Box<dyn Environment> {
        Box::new(self.clone())
    }
    fn as_scripted(&self) -> Option<&dyn Scripted> {
        Some(self)
    }
    fn as_scripted_mut(&mut self) -> Option<&mut dyn Scripted> {
        Some(self)
    }
    fn as_inspect(&self) -> Option<&dyn Inspect> {
        Some(self)
    }
    fn as_behaviour(&self) -> Option<&dyn Behaviour> {
        Some(self)
    }
}

/// Behaviour reports compare with the `heuristic` (the policy the compact prompt is
/// built for; it wins 0.74 on the default preset); the situations are its branches
/// ([`policies::SITUATIONS`]). When both servers are free it deploys to either, and
/// either counts as agreeing.
impl Behaviour for Ticketmelt {
    fn reference_policy(&self) -> &'static str {
        "heuristic"
    }
    fn situations(&self) -> Vec<&'static str> {
        policies::SITUATIONS.iter().map(|(n, _)| *n).collect()
    }
    fn actions(&self) -> Vec<&'static str> {
        ACTION_LABELS.to_vec()
    }
    fn action_label(&self, _seat: usize, text: &str) -> &'static str {
        parse_action(text).action.as_str()
    }
    fn view(&self, seat: usize) -> DecisionView {
        let seat = seat.min(SEATS - 1);
        let (situation, choice) = self.heuristic_plan(seat);
        // The coin the heuristic would toss now, on a copy (the episode is untouched).
        let first = self.clone().scripted(Policy::Heuristic, seat);
        let reference = match choice {
            policies::Choice::Only(a) => vec![a.as_str()],
            policies::Choice::Either => {
                vec![first.as_str(), first.mirrored().as_str()]
            }
        };
        DecisionView {
            situation: situation.name(),
            features: self.features(seat),
            reference,
        }
    }
}

/// Every commitment, in report order.
pub const ACTION_LABELS: [&str; 3] = ["DEPLOY_PROD_A", "DEPLOY_PROD_B", "MONITOR"];

impl Ticketmelt {
    /// What the heuristic reads for `seat`, as JSON (behaviour reports).
    fn features(&self, seat: usize) -> Value {
        let r = self.round as usize;
        let hist = (self.rules.history_rounds as usize).min(r);
        let (pred, hot) = self.predicted(seat);
        let peers: Vec<Value> = (0..SEATS)
            .filter(|&k| k != seat)
            .map(|k| {
                json!({
                    "seat": k,
                    "restored": self.completed[k] > 0,
                    "left": self.rem[k],
                    "spare": self.spare(k),
                    "urgent_visible": self.urgent_visible(k, seat),
                    "moves": (r - hist..r).map(|pr| self.acts[pr][k].as_str()).collect::<Vec<_>>(),
                })
            })
            .collect();
        json!({
            "round": r + 1,
            "restored": self.completed[seat] > 0,
            "left": self.rem[seat],
            "deadline": self.deadline[seat],
            "spare": self.spare(seat),
            "urgent": seat == self.urgent as usize,
            "down": [self.degraded(0), self.degraded(1)],
            "peers": peers,
            "predicted_on": pred,
            "tight_predicted_on": hot,
        })
    }
}

impl Scripted for Ticketmelt {
    fn continuation_action(&mut self, seat: usize) -> String {
        let seat = seat.min(SEATS - 1);
        let a = self.scripted(self.rules.continuation, seat);
        self.answer_text(seat, a)
    }
    fn policy_action(&mut self, policy: &str, seat: usize) -> anyhow::Result<String> {
        anyhow::ensure!(seat < SEATS, "seat {seat} out of range");
        let p = Policy::from_name(policy)?;
        let a = self.scripted(p, seat);
        Ok(self.answer_text(seat, a))
    }
    /// The three commitments, each with the message the scripted policies send with it
    /// in this prompt style.
    fn answer_texts(&self, seat: usize) -> Vec<String> {
        if seat >= SEATS || self.done() {
            return Vec::new();
        }
        [Action::DeployA, Action::DeployB, Action::Monitor]
            .iter()
            .map(|&a| self.answer_text(seat, a))
            .collect()
    }
    /// An engineer whose service is not restored yet.
    fn seat_active(&self, seat: usize) -> bool {
        seat < SEATS && self.completed[seat] == 0
    }
    /// The fast path: no text round trip (same episode as stepping the continuation
    /// texts, but scripted moves are recorded as scripted).
    fn rollout(&mut self) {
        self.rollout_with(self.rules.continuation)
    }
}

impl Inspect for Ticketmelt {
    fn render_state(&self) -> String {
        let mut s = String::new();
        self.write_state(&mut s);
        s
    }
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
}

/// The registry constructor.
pub fn factory(options: &Options) -> anyhow::Result<Box<dyn EnvFactory>> {
    Ok(Box::new(TicketmeltFactory::new(options)?))
}

impl EnvFactory for TicketmeltFactory {
    fn resolved_options(&self) -> Option<Value> {
        Some(self.rules.to_json())
    }
    fn name(&self) -> &'static str {
        NAME
    }
    fn reset(&self, seed: u64) -> Box<dyn Environment> {
        Box::new(self.episode(seed))
    }
    fn tools(&self) -> Option<&dyn Tools> {
        Some(self)
    }
}

impl Tools for TicketmeltFactory {
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
            level: None,
            policy: policy.to_string(),
            peers: pool.to_string(),
            episodes,
            win_rate: st.wins as f64 / n,
            win_ci: wilson_ci(st.wins, st.n),
            mean_reward: st.scalar / n,
            extra,
        })
    }
    fn bench(&self, min_secs: f64) -> Option<BenchResult> {
        Some(self.bench_fast(min_secs))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}

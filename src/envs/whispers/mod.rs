//! Whispers: multi-agent information triage among witnesses, relays, liars and an
//! editor.
//!
//! Port of the Whispers OpenEnv environment (seed `004_89fc05492801ad8f`), with the
//! original's bugs fixed (see below and `../shared/design/environments.md` §4).
//!
//! # Episode
//! * A hidden event: one of 4 templates (industrial incident, market report, weather
//!   alert, logistics update), each with 4 fields of 4 possible values. The *lie* changes
//!   every field to another value; all adversaries share it.
//! * Seats by task (edges undirected; P = the protagonist, the seat the policy holds by
//!   default):
//!
//!   | task | name | roles | edges | P | noise | budget | steps |
//!   |---|---|---|---|---|---|---|---|
//!   | t1 | Single Relay | W R E | 0-1 1-2 | 2 | .10 | 0 | 8 |
//!   | t2 | Triangulate | W W R E | 0-2 1-2 2-3 0-3 1-3 | 3 | .30 | 0 | 12 |
//!   | t3 | Spot the Liar | W A R E | as t2 | 3 | .20 | 0 | 14 |
//!   | t4 | Cascade Chain | A R R R E | 0-1 1-2 2-3 3-4 | 2 | .10 | 1 | 18 |
//!   | t5 | Coalition Under Pressure | W A A R R E | 0-3 1-3 2-4 3-5 4-5 0-5 1-5 2-5 | 5 | .20 | 2 | 24 |
//!   | t6 | Calibrated Brief | W W A R R E | 0-3 1-4 2-4 3-5 4-5 0-5 1-5 2-5 | 5 | .35 | 2 | 24 |
//!
//!   A witness sees each field wrong with probability `noise` (a uniformly drawn other
//!   value); an adversary knows the lie. Only the protagonist has a fact-check budget.
//! * Every step every seat takes one tool call, simultaneously: what is sent in step
//!   `t` is seen from step `t+1` on. `to_act()` is every policy seat until the episode
//!   ends; scripted seats act inside `step`. The episode ends when an editor publishes
//!   (at the end of that step) or after the step limit.
//! * Tools: `send_message(target_id, content, claimed_source, confidence)` to a
//!   neighbour; `broadcast(content, claimed_source, confidence)` to everyone;
//!   `fact_check(content)` (budget; the oracle answers TRUE iff the claim's pairs are a
//!   non-empty subset of the truth; the verdict arrives next step);
//!   `request_verify(target_id, content)` to a neighbour (scripted honest seats answer
//!   truthfully from what they believe, i.e. a witness from its view, a relay from the
//!   plurality of what it heard; adversaries answer from the lie; the answer arrives
//!   next step); `accuse(target_id)` (public); `publish(final_report)` (editor only;
//!   ends the episode); `wait`. The observation lists the legal tools (publish only for
//!   the editor, fact_check only with budget left). An invalid or illegal answer plays
//!   `wait`, `valid = false`, and the feedback says why (also shown next turn).
//!
//! # Scripted seats (the original's rules)
//! Witnesses DM their view to a random neighbour at step 0 (confidence 0.85) and
//! broadcast it at step 1 (0.80). Adversaries broadcast the lie on even steps (0.90)
//! and DM it to a random neighbour on odd steps (0.92), claiming to be witnesses.
//! Relays forward the newest claim they have not forwarded yet to their first
//! neighbour that did not send it, at 0.9 x its confidence, naming its origin. A
//! scripted editor publishes the most confident claim it received on the last step.
//!
//! # Rubric (per seat; `reward(seat).scalar` = `value`)
//! * `truth` = mean over the 4 fields of 1 - Brier/2, the Brier score of "the published
//!   value with the published confidence, the other three values sharing the rest"
//!   (a proper score over the field's values; the binary Brier of the original would
//!   pay 1.0 for naming a value believed false at confidence 0). A missing field
//!   scores 0 (the worst); no report scores 0.
//! * `calibration` = 1 - ECE over the published fields, 10 equal-width confidence bins;
//!   a missing field counts as error 1.
//! * `adversary_f1` = F1 of the seat's accusations against the adversaries (1 with no
//!   adversaries and no accusation, 0 for any accusation when there are none).
//! * `coalition` = 1 if the seat sent request_verify to at least one honest seat (and,
//!   for an editor, then published itself).
//! * `efficiency` = 1 - steps played / step limit.
//! * `cascade` = the highest confidence above 0.5 with which the seat sent (DM or
//!   broadcast) a claim with a false field; 0 if none.
//! * `value` = clamp(bias + w . components - w_cascade x cascade, 0, 1) with per-task
//!   weights for the protagonist (the original's graders): t1 .70 truth .20 calibration
//!   .10 efficiency; t2 .55/.35/.10; t3 .45 truth .20 calibration .25 F1 .10 efficiency
//!   -.20 cascade; t4 .55 (1 - cascade) + .35 F1 + .10 efficiency; t5 the headline .40
//!   truth .20 calibration .15 F1 .10 coalition .10 efficiency -.15 cascade; t6 .25
//!   truth .55 calibration .10 F1 .10 efficiency -.20 cascade. Other honest seats get
//!   the team weights ([`rubric::TEAM`]); adversaries get .65 x the report's alignment
//!   with the lie + .35 x not accused by an honest seat. `weights = "headline"` uses
//!   the headline rubric for every honest seat.
//! * `win` = done and value >= `win_threshold` (default 0.7); [`Inspect::won`] reads it.
//! * Step rewards (`StepOutcome.rewards`, policy seats) are shaping, each only when its
//!   condition holds: +0.02 fact_check of a claim that received claims contest (they
//!   disagree on a field it names); +0.05 the first request_verify to each scripted
//!   seat (scripted seats always answer); -0.05 a broadcast identical to one the seat
//!   already broadcast; -0.10 publishing while the received claims contradict each
//!   other and none of an available fact-check budget was used. The step that ends the
//!   episode adds the seat's final `value`, so a seat's step rewards sum to
//!   `value + shaping`. `shaping = false` turns shaping off.
//!
//! # Seats
//! `seat = "protagonist"` (default), a role name (`witness`, `relay`, `adversary`,
//! `editor`: every seat of that role), a seat number, or `"self_play"` (every honest
//! seat). Every task of the pool must have it.
//!
//! # Fixed here (the original's bugs, not copied)
//! A missing field scored as perfect truth; calibration was one global gap; the repeated
//! broadcast penalty fired on every broadcast; the premature-publish check never fired;
//! nobody answered request_verify.
//!
//! # Layout
//! `mod.rs` options, contract impls, factory; [`tasks`] claim constants, templates and
//! tasks; [`rules`] world and step; [`scripted`] scripted seats and verification answers;
//! [`rubric`] scoring; [`parse`] parser; [`render`] prompts, transcript, describe;
//! [`policies`] baseline policies (heuristic editor), baselines and bench.

pub mod behaviour;
pub mod compact;
pub mod parse;
pub mod policies;
pub mod render;
pub mod rubric;
pub mod rules;
pub mod scripted;
pub mod tasks;

pub use parse::{action_json, parse_action, parse_claim};
pub use policies::{Policy, POLICIES};
pub use rubric::{Parts, Weights};
pub use rules::{Action, Claim, Report, Role, TaskSpec, Whispers, TASKS, TEMPLATES};

use crate::envs::tools::{wilson_ci, BaselineRow, BenchResult};
use crate::envs::{
    EnvFactory, Environment, Inspect, Message, Options, Reward, Scripted, StepOutcome, Tools,
};
use std::collections::BTreeMap;

/// Registry name.
pub const NAME: &str = "whispers";

/// A set of tasks (indices into [`TASKS`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskList {
    ids: [u8; 6],
    n: u8,
}

impl TaskList {
    pub fn all() -> Self {
        TaskList {
            ids: [0, 1, 2, 3, 4, 5],
            n: 6,
        }
    }
    pub fn one(i: usize) -> Self {
        TaskList {
            ids: [i as u8; 6],
            n: 1,
        }
    }
    pub fn len(&self) -> usize {
        self.n as usize
    }
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }
    pub fn get(&self, i: usize) -> usize {
        self.ids[i.min(self.len().saturating_sub(1))] as usize
    }
    pub fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        self.ids[..self.len()].iter().map(|&i| i as usize)
    }
    /// `"t3"`, `"all"` or `"t1,t3"`.
    pub fn name(&self) -> String {
        if *self == Self::all() {
            "all".into()
        } else {
            self.iter()
                .map(|i| TASKS[i].id)
                .collect::<Vec<_>>()
                .join(",")
        }
    }
}

/// Which seats the policy holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeatChoice {
    Protagonist,
    Role(Role),
    Seat(u8),
    SelfPlay,
}

impl SeatChoice {
    pub fn mask(self, spec: &TaskSpec) -> u16 {
        match self {
            SeatChoice::Protagonist => 1 << spec.protagonist,
            SeatChoice::Role(r) => spec
                .roles
                .iter()
                .enumerate()
                .filter(|(_, x)| **x == r)
                .fold(0, |m, (i, _)| m | 1 << i),
            SeatChoice::Seat(s) => 1 << s,
            SeatChoice::SelfPlay => !spec.adversary_mask() & ((1u16 << spec.seats()) - 1),
        }
    }
    pub fn name(self) -> String {
        match self {
            SeatChoice::Protagonist => "protagonist".into(),
            SeatChoice::Role(r) => r.name().into(),
            SeatChoice::Seat(s) => s.to_string(),
            SeatChoice::SelfPlay => "self_play".into(),
        }
    }
}

/// Shaping rewards (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Shaping {
    pub fact_check: f64,
    pub verify: f64,
    pub repeat_broadcast: f64,
    pub premature_publish: f64,
}

impl Shaping {
    pub const ON: Shaping = Shaping {
        fact_check: 0.02,
        verify: 0.05,
        repeat_broadcast: -0.05,
        premature_publish: -0.10,
    };
    pub const OFF: Shaping = Shaping {
        fact_check: 0.0,
        verify: 0.0,
        repeat_broadcast: 0.0,
        premature_publish: 0.0,
    };
}

/// The configured rules (all options resolved).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rules {
    pub tasks: TaskList,
    pub seat: SeatChoice,
    pub shaping: Shaping,
    pub headline_weights: bool,
    pub win_threshold: f64,
    pub continuation: Policy,
    /// Most received messages shown in a prompt (the newest).
    pub history: u8,
    /// Option `prompt`.
    pub prompt: PromptStyle,
}

/// Option `prompt`: how the state is written and what an answer writes before its tool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PromptStyle {
    /// The environment's own prompt (the default).
    Full,
    /// The same facts in about half the tokens, one example answer.
    Compact,
    /// Compact, with answers that first write what the heuristic reads (step, reports
    /// heard, liars), then the tool.
    Reasoned,
    /// Reasoned, and the answer also copies the agents already accused, so that "accuse
    /// each liar not yet accused" compares two fields the answer has just written
    /// (a reasoned student re-accuses an accused liar until the step limit).
    Checklist,
}

impl PromptStyle {
    pub fn name(self) -> &'static str {
        match self {
            PromptStyle::Full => "full",
            PromptStyle::Compact => "compact",
            PromptStyle::Reasoned => "reasoned",
            PromptStyle::Checklist => "checklist",
        }
    }
    pub fn compact(self) -> bool {
        self != PromptStyle::Full
    }
    /// The answer writes the heuristic's working before the tool.
    pub fn reasoned(self) -> bool {
        matches!(self, PromptStyle::Reasoned | PromptStyle::Checklist)
    }
}

impl Default for Rules {
    fn default() -> Self {
        Rules {
            tasks: TaskList::all(),
            seat: SeatChoice::Protagonist,
            shaping: Shaping::ON,
            headline_weights: false,
            win_threshold: 0.7,
            continuation: Policy::Heuristic,
            history: 24,
            prompt: PromptStyle::Full,
        }
    }
}

/// Every option key whispers accepts.
pub const OPTION_KEYS: [&str; 8] = [
    "task",
    "seat",
    "shaping",
    "weights",
    "win_threshold",
    "continuation",
    "history",
    "prompt",
];

impl Rules {
    /// Resolve options; unknown keys and bad values are errors that say what is allowed.
    pub fn from_options(opts: &Options) -> anyhow::Result<Self> {
        let mut r = Rules::default();
        for (k, v) in opts {
            match k.as_str() {
                "task" | "tasks" => r.tasks = parse_tasks(v)?,
                "seat" => {
                    r.seat = match v {
                        toml::Value::Integer(i) if (0..6).contains(i) => SeatChoice::Seat(*i as u8),
                        toml::Value::String(s) => match s.as_str() {
                            "protagonist" => SeatChoice::Protagonist,
                            "self_play" => SeatChoice::SelfPlay,
                            other => match Role::from_name(other) {
                                Some(role) => SeatChoice::Role(role),
                                None => match other.parse::<u8>() {
                                    Ok(i) if i < 6 => SeatChoice::Seat(i),
                                    _ => anyhow::bail!(
                                        "whispers option `seat` must be protagonist, self_play, \
witness, relay, adversary, editor or a seat number 0..5, got `{other}`"
                                    ),
                                },
                            },
                        },
                        _ => anyhow::bail!(
                            "whispers option `seat` must be a string or a seat number 0..5, got {v}"
                        ),
                    }
                }
                "shaping" => {
                    r.shaping = match v.as_bool() {
                        Some(true) => Shaping::ON,
                        Some(false) => Shaping::OFF,
                        None => anyhow::bail!(
                            "whispers option `shaping` must be true or false, got {v}"
                        ),
                    }
                }
                "weights" => {
                    r.headline_weights = match v.as_str() {
                        Some("task") => false,
                        Some("headline") => true,
                        _ => anyhow::bail!(
                            "whispers option `weights` must be \"task\" or \"headline\", got {v}"
                        ),
                    }
                }
                "win_threshold" => {
                    let x = v
                        .as_float()
                        .or_else(|| v.as_integer().map(|i| i as f64))
                        .filter(|x| (0.0..=1.0).contains(x))
                        .ok_or_else(|| {
                            anyhow::anyhow!("whispers option `win_threshold` must be a number in [0, 1], got {v}")
                        })?;
                    r.win_threshold = x;
                }
                "continuation" => {
                    let s = v.as_str().ok_or_else(|| {
                        anyhow::anyhow!(
                            "whispers option `continuation` must be a policy name, got {v}"
                        )
                    })?;
                    r.continuation = Policy::from_name(s)?;
                }
                "prompt" => {
                    r.prompt = match v.as_str() {
                        Some("full") => PromptStyle::Full,
                        Some("compact") => PromptStyle::Compact,
                        Some("reasoned") => PromptStyle::Reasoned,
                        Some("checklist") => PromptStyle::Checklist,
                        _ => anyhow::bail!(
                            "whispers option `prompt` must be \"full\", \"compact\", \
                             \"reasoned\" or \"checklist\", got {v}"
                        ),
                    }
                }
                "history" => match v.as_integer() {
                    Some(i) if (1..=200).contains(&i) => r.history = i as u8,
                    _ => anyhow::bail!(
                        "whispers option `history` must be an integer in 1..=200, got {v}"
                    ),
                },
                other => anyhow::bail!(
                    "unknown whispers option `{other}`; known: {}",
                    OPTION_KEYS.join(", ")
                ),
            }
        }
        for t in r.tasks.iter() {
            let spec = &TASKS[t];
            let ok = match r.seat {
                SeatChoice::Role(role) => spec.has_role(role),
                SeatChoice::Seat(s) => (s as usize) < spec.seats(),
                _ => true,
            };
            anyhow::ensure!(
                ok,
                "whispers option `seat = {}`: task {} has no such seat (its roles: {})",
                r.seat.name(),
                spec.id,
                spec.roles
                    .iter()
                    .map(|r| r.name())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        Ok(r)
    }
}

fn parse_tasks(v: &toml::Value) -> anyhow::Result<TaskList> {
    let names: Vec<String> = match v {
        toml::Value::String(s) => s.split(',').map(|x| x.trim().to_string()).collect(),
        toml::Value::Array(a) => a
            .iter()
            .map(|x| {
                x.as_str().map(str::to_string).ok_or_else(|| {
                    anyhow::anyhow!("whispers option `task`: {x} is not a task name")
                })
            })
            .collect::<anyhow::Result<_>>()?,
        _ => anyhow::bail!("whispers option `task` must be t1..t6, \"all\" or a list, got {v}"),
    };
    if names.len() == 1 && (names[0] == "all" || names[0] == "pool") {
        return Ok(TaskList::all());
    }
    let mut l = TaskList { ids: [0; 6], n: 0 };
    for n in &names {
        let i = rules::task_index(n).ok_or_else(|| {
            anyhow::anyhow!("whispers option `task`: unknown task `{n}`; tasks: t1..t6 or all")
        })?;
        anyhow::ensure!(
            !l.iter().any(|x| x == i),
            "whispers option `task`: `{n}` is listed twice"
        );
        anyhow::ensure!(l.len() < 6, "whispers option `task`: too many tasks");
        l.ids[l.n as usize] = i as u8;
        l.n += 1;
    }
    anyhow::ensure!(!l.is_empty(), "whispers option `task` names no task");
    Ok(l)
}

// ---------------------------------------------------------------------------------
// The environment contract.

impl Environment for Whispers {
    fn name(&self) -> &'static str {
        NAME
    }
    fn num_seats(&self) -> usize {
        self.seats()
    }
    fn policy_seats(&self) -> Vec<usize> {
        (0..self.seats()).filter(|&s| self.is_policy(s)).collect()
    }
    fn to_act(&self) -> Vec<usize> {
        if self.done {
            Vec::new()
        } else {
            self.policy_seats()
        }
    }
    fn observation(&self, seat: usize) -> Vec<Message> {
        let seat = seat.min(self.seats() - 1);
        let mut sys = String::with_capacity(2048);
        let mut user = String::with_capacity(2048);
        if self.rules.prompt.compact() {
            self.system_prompt_compact(&mut sys);
            self.render_user_compact(seat, &mut user);
        } else {
            self.system_prompt(&mut sys);
            self.render_user(seat, &mut user);
        }
        vec![Message::system(sys), Message::user(user)]
    }
    fn step(&mut self, actions: &[String]) -> anyhow::Result<StepOutcome> {
        self.step_texts(actions)
    }
    fn done(&self) -> bool {
        self.done
    }
    fn reward(&self, seat: usize) -> Reward {
        self.reward_of(seat.min(self.seats() - 1))
    }
    fn transcript(&self) -> serde_json::Value {
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
    fn as_behaviour(&self) -> Option<&dyn crate::envs::Behaviour> {
        Some(self)
    }
}

impl Whispers {
    /// One step from raw texts, one per policy seat in ascending order (see the module
    /// docs for the outcome).
    pub fn step_texts<S: AsRef<str>>(&mut self, texts: &[S]) -> anyhow::Result<StepOutcome> {
        let seats = Environment::policy_seats(self);
        if self.done && texts.is_empty() {
            return Ok(StepOutcome::default());
        }
        anyhow::ensure!(
            texts.len() == seats.len(),
            "whispers step: expected {} action texts (one per policy seat), got {}",
            seats.len(),
            texts.len()
        );
        if self.done {
            return Ok(StepOutcome::default());
        }
        let mut acts: [Action; rules::MAX_SEATS] = Default::default();
        let mut out = StepOutcome::default();
        let t = self.template();
        for (&seat, text) in seats.iter().zip(texts) {
            let text = text.as_ref();
            let parsed = parse_action(text, t).and_then(|a| self.validate(seat, &a).map(|_| a));
            let (valid, fb) = match parsed {
                Ok(a) => {
                    acts[seat] = a;
                    (true, String::new())
                }
                Err(e) => {
                    self.invalid[seat] += 1;
                    (false, format!("invalid action ({e}); played wait instead"))
                }
            };
            self.last_feedback[seat] = fb.clone();
            out.push(seat, 0.0, valid, fb);
        }
        self.raw
            .push(texts.iter().map(|t| t.as_ref().to_string()).collect());
        let shaping = self.resolve(&mut acts);
        let done = self.done;
        for (i, &seat) in out.seats.iter().enumerate() {
            out.rewards[i] = shaping[seat];
            if done {
                out.rewards[i] += self.parts(seat).value;
            }
        }
        Ok(out)
    }
}

impl Scripted for Whispers {
    fn continuation_action(&mut self, seat: usize) -> String {
        let seat = seat.min(self.seats() - 1);
        let a = self.policy_move(self.rules.continuation, seat);
        self.answer_text(seat, &a)
    }
    fn policy_action(&mut self, policy: &str, seat: usize) -> anyhow::Result<String> {
        anyhow::ensure!(seat < self.seats(), "seat {seat} out of range");
        let p = Policy::from_name(policy)?;
        let a = self.policy_move(p, seat);
        Ok(self.answer_text(seat, &a))
    }
    fn seat_active(&self, seat: usize) -> bool {
        !self.done && seat < self.seats()
    }
    /// The fast path: the continuation policy's actions without the text round trip.
    fn rollout(&mut self) {
        let p = self.rules.continuation;
        while !self.done {
            self.step_policy(p, true);
        }
    }
}

impl Inspect for Whispers {
    /// A win: the episode is over and the seat's `value` is at least `win_threshold`.
    fn won(&self, seat: usize) -> bool {
        seat < self.seats() && self.parts(seat).win
    }
    fn render_state(&self) -> String {
        let mut s = String::new();
        self.write_state(&mut s);
        s
    }
}

// ---------------------------------------------------------------------------------
// Factory.

/// Creates Whispers episodes with fixed rules.
#[derive(Debug, Clone)]
pub struct WhispersFactory {
    pub rules: Rules,
}

impl WhispersFactory {
    pub fn new(options: &Options) -> anyhow::Result<Self> {
        Ok(Self {
            rules: Rules::from_options(options)?,
        })
    }
    pub fn episode(&self, seed: u64) -> Whispers {
        Whispers::new(self.rules, seed)
    }
}

/// The registry constructor.
pub fn factory(options: &Options) -> anyhow::Result<Box<dyn EnvFactory>> {
    Ok(Box::new(WhispersFactory::new(options)?))
}

impl EnvFactory for WhispersFactory {
    fn resolved_options(&self) -> Option<serde_json::Value> {
        let r = &self.rules;
        let d = |v: &dyn std::fmt::Debug| format!("{v:?}");
        Some(serde_json::json!({
            "tasks": d(&r.tasks), "seat": d(&r.seat), "shaping": d(&r.shaping),
            "headline_weights": r.headline_weights, "win_threshold": r.win_threshold,
            "continuation": d(&r.continuation), "history": r.history,
            "prompt": r.prompt.name(),
        }))
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

impl Tools for WhispersFactory {
    fn describe(&self) -> String {
        render::describe(&self.rules)
    }
    fn policies(&self) -> Vec<&'static str> {
        POLICIES.iter().map(|(n, _)| *n).collect()
    }
    /// The tasks: a baseline row is one policy on one task (the row's `peers` field
    /// names the task).
    fn pools(&self) -> Vec<&'static str> {
        TASKS.iter().map(|t| t.id).collect()
    }
    fn baseline(
        &self,
        policy: &str,
        pool: &str,
        episodes: usize,
        first_seed: u64,
    ) -> anyhow::Result<BaselineRow> {
        let p = Policy::from_name(policy)?;
        let task = rules::task_index(pool)
            .ok_or_else(|| anyhow::anyhow!("unknown whispers task `{pool}`; tasks: t1..t6"))?;
        let rules = Rules {
            tasks: TaskList::one(task),
            ..self.rules
        };
        Rules::from_options(&{
            let mut o = Options::new();
            o.insert("task".into(), pool.into());
            o.insert("seat".into(), self.rules.seat.name().into());
            o
        })?;
        let st = policies::baseline_stats(rules, p, episodes, first_seed);
        let n = st.n.max(1) as f64;
        let mut extra = BTreeMap::new();
        for (k, v) in &st.sums {
            extra.insert(k.clone(), v / n);
        }
        extra.insert(
            "publish_rate".into(),
            st.published as f64 / st.episodes.max(1) as f64,
        );
        extra.insert(
            "mean_steps".into(),
            st.steps as f64 / st.episodes.max(1) as f64,
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
        Some(policies::bench_fast(self.rules, min_secs))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_validate() {
        let mut o = Options::new();
        o.insert("bogus".into(), 1.into());
        assert!(Rules::from_options(&o)
            .unwrap_err()
            .to_string()
            .contains("bogus"));
        let mut o = Options::new();
        o.insert("task".into(), "t9".into());
        assert!(Rules::from_options(&o)
            .unwrap_err()
            .to_string()
            .contains("t9"));
        let mut o = Options::new();
        o.insert("task".into(), "t1".into());
        o.insert("seat".into(), "adversary".into());
        let e = Rules::from_options(&o).unwrap_err().to_string();
        assert!(
            e.contains("t1") && e.contains("witness, relay, editor"),
            "{e}"
        );
        let mut o = Options::new();
        o.insert(
            "task".into(),
            toml::Value::Array(vec!["t3".into(), "t5".into()]),
        );
        o.insert("seat".into(), "adversary".into());
        let r = Rules::from_options(&o).unwrap();
        assert_eq!(r.tasks.name(), "t3,t5");
        assert_eq!(r.seat, SeatChoice::Role(Role::Adversary));
        let mut o = Options::new();
        o.insert("seat".into(), 7.into());
        assert!(Rules::from_options(&o).is_err());
        assert_eq!(
            Rules::from_options(&Options::new()).unwrap(),
            Rules::default()
        );
    }
}

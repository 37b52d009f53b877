//! Incident post-mortem writer (seed `003_490d677b4185a4a6`; facts and decisions in
//! `../shared/design/environments.md` §3).
//!
//! The writer (seat 0, the policy) receives an incident bundle (alerts, a Slack thread,
//! a service dependency graph) and has 25 steps to investigate with `QUERY_LOGS`, write
//! the five sections, assign action items, optionally get a review and `SUBMIT`. The
//! real evidence sits behind one service and time window per evidence window; Slack and
//! alerts plant false causes (a confidently wrong senior engineer on hard and expert).
//!
//! # Scenarios
//! Four levels written for this project are embedded ([`scenario::EMBEDDED`]): easy (a
//! connection leak after a deploy), medium (a cache TTL change buried in Slack causing a
//! cascade), hard (a batch job holding row locks while a principal engineer blames the
//! CDN, then the database disks), expert (a compromised partner API key from a Tor exit
//! node, hidden behind a scheduled load test on the same key, a senior security engineer
//! wrong twice, a 3-minute evidence window, 6 queries with steeper penalties and GDPR
//! action items). `source = "generated"` (default) gives each seed a variant from
//! [`scenario::generate`]; `"fixed"` plays the files verbatim; `"mixed"` flips a seeded
//! coin. `files = [...]` replaces the embedded scenarios with JSON files on disk (see
//! `concord envs import postmortem --from pagerduty`).
//!
//! # Turns and rewards
//! `to_act()` is `[0]`, or `[1]` while a policy reviewer must answer a review request
//! (`reviewer = "policy"`). Step rewards are the shaping of [`episode`] (query, section,
//! item, overwrite and missing-section terms); the step that ends the episode adds the
//! grade ([`grader`]), so a writer's step rewards sum to `grade + shaping`.
//! `reward(0).scalar` is the grade (`reward = "return"`: grade + shaping); the
//! components are the grader's parts plus `shaping`, `return`, query counts and `win`.
//!
//! # Never panics
//! Any text parses ([`parse`]) to an action or to a no-op with feedback; refused
//! actions (unknown service, window too long, budget, limits) are no-ops too.
//!
//! # Layout
//! [`scenario`] schema, embedded files, generator; [`parse`] actions; [`grader`];
//! [`episode`] state and step; [`policies`] scripted policies, baselines, bench;
//! [`render`] prompts and describe; [`import`] PagerDuty exports.

pub mod episode;
pub mod grader;
pub mod import;
pub mod parse;
pub mod policies;
pub mod render;
pub mod scenario;

pub use episode::Postmortem;
pub use parse::{action_json, parse_action, Action};
pub use policies::{Policy, POLICIES};
pub use scenario::{Scenario, LEVELS};

use crate::envs::tools::{BaselineRow, BenchResult};
use crate::envs::{
    EnvFactory, Environment, Inspect, Message, Options, Reward, Scripted, StepOutcome, Tools,
};
use rand::{Rng, SeedableRng};
use std::sync::Arc;

/// Registry name.
pub const NAME: &str = "postmortem";

/// Where an episode's scenario comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Fixed,
    Generated,
    Mixed,
}

impl Source {
    pub fn name(self) -> &'static str {
        match self {
            Source::Fixed => "fixed",
            Source::Generated => "generated",
            Source::Mixed => "mixed",
        }
    }
}

/// The configured rules (all options resolved).
#[derive(Debug, Clone, PartialEq)]
pub struct Rules {
    /// Levels drawn from (empty = all the scenarios loaded).
    pub levels: Vec<String>,
    pub source: Source,
    pub files: Vec<String>,
    pub reviewer_policy: bool,
    /// Scalar = grade + shaping instead of the grade.
    pub reward_return: bool,
    pub shaping: bool,
    pub continuation: Policy,
    pub win_threshold: f64,
    /// The writer's prompt and answer form (`prompt` option).
    pub prompt: Prompt,
}

/// The writer's prompt (`prompt` option).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prompt {
    /// The answer is the action alone.
    Full,
    /// The status lists the sections in the order the scripted writers work, and every
    /// answer starts with `"todo"`, the sections not yet valid, copied from it (see
    /// [`policies::answer_text`]).
    Reasoned,
    /// Reasoned, and the todo goes on past the sections: `item K of N` while the
    /// action_items section lists more items than are assigned, then `review` until a
    /// review is done; the status shows those counts and the next listed item. A
    /// reasoned writer cannot see how many items its teacher assigns, so it never
    /// stops assigning them (docs/runs/postmortem-0.5b).
    Checklist,
}

/// `prompt` values.
pub const PROMPTS: [(&str, Prompt); 3] = [
    ("full", Prompt::Full),
    ("reasoned", Prompt::Reasoned),
    ("checklist", Prompt::Checklist),
];

impl Prompt {
    /// Whether answers start with a `"todo"`.
    pub fn reasoned(self) -> bool {
        self != Prompt::Full
    }
    pub fn name(self) -> &'static str {
        crate::envs::name_in(&PROMPTS, &self)
    }
}

impl Default for Rules {
    fn default() -> Self {
        Rules {
            levels: Vec::new(),
            source: Source::Generated,
            files: Vec::new(),
            reviewer_policy: false,
            reward_return: false,
            shaping: true,
            continuation: Policy::EvidenceBound,
            win_threshold: 0.7,
            prompt: Prompt::Full,
        }
    }
}

/// Every option key postmortem accepts.
pub const OPTION_KEYS: [&str; 9] = [
    "level",
    "source",
    "files",
    "reviewer",
    "reward",
    "shaping",
    "continuation",
    "win_threshold",
    "prompt",
];

fn strings(k: &str, v: &toml::Value) -> anyhow::Result<Vec<String>> {
    match v {
        toml::Value::String(s) => Ok(s
            .split(',')
            .map(|x| x.trim().to_string())
            .filter(|x| !x.is_empty())
            .collect()),
        toml::Value::Array(a) => a
            .iter()
            .map(|x| {
                x.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| anyhow::anyhow!("postmortem option `{k}`: {x} is not a string"))
            })
            .collect(),
        _ => {
            anyhow::bail!("postmortem option `{k}` must be a string or a list of strings, got {v}")
        }
    }
}

impl Rules {
    /// Resolve options; unknown keys and bad values are errors that say what is allowed.
    pub fn from_options(opts: &Options) -> anyhow::Result<Self> {
        let mut r = Rules::default();
        for (k, v) in opts {
            match k.as_str() {
                "level" | "levels" => {
                    let l = strings(k, v)?;
                    r.levels = if l.len() == 1 && l[0] == "all" { Vec::new() } else { l };
                }
                "source" => {
                    r.source = match v.as_str() {
                        Some("fixed") => Source::Fixed,
                        Some("generated") => Source::Generated,
                        Some("mixed") => Source::Mixed,
                        _ => anyhow::bail!(
                            "postmortem option `source` must be \"generated\", \"fixed\" or \"mixed\", got {v}"
                        ),
                    }
                }
                "files" => r.files = strings(k, v)?,
                "reviewer" => {
                    r.reviewer_policy = match v.as_str() {
                        Some("scripted") => false,
                        Some("policy") => true,
                        _ => anyhow::bail!(
                            "postmortem option `reviewer` must be \"scripted\" or \"policy\", got {v}"
                        ),
                    }
                }
                "reward" => {
                    r.reward_return = match v.as_str() {
                        Some("grade") => false,
                        Some("return") => true,
                        _ => anyhow::bail!(
                            "postmortem option `reward` must be \"grade\" or \"return\", got {v}"
                        ),
                    }
                }
                "shaping" => {
                    r.shaping = v.as_bool().ok_or_else(|| {
                        anyhow::anyhow!("postmortem option `shaping` must be true or false, got {v}")
                    })?
                }
                "continuation" => {
                    r.continuation = Policy::from_name(v.as_str().ok_or_else(|| {
                        anyhow::anyhow!("postmortem option `continuation` must be a policy name, got {v}")
                    })?)?
                }
                "win_threshold" => {
                    r.win_threshold = v
                        .as_float()
                        .or_else(|| v.as_integer().map(|i| i as f64))
                        .filter(|x| (0.0..=1.0).contains(x))
                        .ok_or_else(|| {
                            anyhow::anyhow!("postmortem option `win_threshold` must be a number in [0, 1], got {v}")
                        })?
                }
                "prompt" => {
                    let name = v.as_str().ok_or_else(|| {
                        anyhow::anyhow!("postmortem option `prompt` must be a string, got {v}")
                    })?;
                    r.prompt = crate::envs::by_name(&PROMPTS, "postmortem option `prompt`", name)?;
                }
                other => anyhow::bail!(
                    "unknown postmortem option `{other}`; known: {}",
                    OPTION_KEYS.join(", ")
                ),
            }
        }
        if r.files.is_empty() {
            for l in &r.levels {
                anyhow::ensure!(
                    LEVELS.contains(&l.as_str()),
                    "postmortem option `level`: unknown level `{l}`; levels: all, {}",
                    LEVELS.join(", ")
                );
            }
        }
        Ok(r)
    }

    /// The base scenarios these rules draw from.
    pub fn load(&self) -> anyhow::Result<Vec<Scenario>> {
        let all: Vec<Scenario> = if self.files.is_empty() {
            LEVELS
                .iter()
                .map(|l| Scenario::embedded(l))
                .collect::<anyhow::Result<_>>()?
        } else {
            self.files
                .iter()
                .map(|f| {
                    let text = std::fs::read_to_string(f).map_err(|e| {
                        anyhow::anyhow!("postmortem option `files`: cannot read {f}: {e}")
                    })?;
                    Scenario::from_json(&text, f)
                })
                .collect::<anyhow::Result<_>>()?
        };
        let picked: Vec<Scenario> = all
            .into_iter()
            .filter(|s| self.levels.is_empty() || self.levels.contains(&s.level))
            .collect();
        anyhow::ensure!(
            !picked.is_empty(),
            "postmortem: no scenario of level {} in the scenarios loaded",
            self.levels.join(", ")
        );
        Ok(picked)
    }
}

// ---------------------------------------------------------------------------------
// The environment contract.

impl Postmortem {
    /// The writer's reward: the grade's parts, shaping, return, counts and `win`.
    pub fn writer_reward(&self) -> Reward {
        let g = self.grade.clone().unwrap_or_else(|| self.current_grade());
        let mut components = g.components();
        let ret = g.total + self.shaping;
        components.insert("shaping".into(), self.shaping);
        components.insert("return".into(), ret);
        components.insert("correct_queries".into(), self.correct_queries as f64);
        components.insert("wrong_queries".into(), self.wrong_queries as f64);
        components.insert("invalid".into(), self.invalid as f64);
        let win = self.done && g.total >= self.rules.win_threshold;
        components.insert("win".into(), if win { 1.0 } else { 0.0 });
        let scalar = match (self.done, self.rules.reward_return) {
            (false, _) => 0.0,
            (true, false) => g.total,
            (true, true) => ret,
        };
        Reward { components, scalar }
    }

    fn reviewer_reward(&self) -> Reward {
        let f1 = self.reviewer_f1();
        let grade = self.grade.as_ref().map_or(0.0, |g| g.total);
        let mut components = std::collections::BTreeMap::new();
        components.insert("review_f1".into(), f1);
        components.insert("grade".into(), grade);
        let scalar = if self.done {
            0.5 * f1 + 0.5 * grade
        } else {
            0.0
        };
        components.insert(
            "win".into(),
            if self.done && scalar >= self.rules.win_threshold {
                1.0
            } else {
                0.0
            },
        );
        Reward { components, scalar }
    }
}

impl Environment for Postmortem {
    fn name(&self) -> &'static str {
        NAME
    }
    fn num_seats(&self) -> usize {
        2
    }
    fn policy_seats(&self) -> Vec<usize> {
        if self.rules.reviewer_policy {
            vec![0, 1]
        } else {
            vec![0]
        }
    }
    fn to_act(&self) -> Vec<usize> {
        if self.done {
            Vec::new()
        } else if self.pending_review {
            vec![episode::REVIEWER]
        } else {
            vec![episode::WRITER]
        }
    }
    fn observation(&self, seat: usize) -> Vec<Message> {
        let sys = if seat == episode::REVIEWER {
            render::REVIEWER_SYSTEM.to_string()
        } else {
            render::writer_system(self.rules.prompt)
        };
        vec![Message::system(sys), Message::user(self.user_prompt(seat))]
    }
    fn step(&mut self, actions: &[String]) -> anyhow::Result<StepOutcome> {
        let acting = self.to_act();
        if acting.is_empty() && actions.is_empty() {
            return Ok(StepOutcome::default());
        }
        anyhow::ensure!(
            actions.len() == acting.len(),
            "postmortem step: expected {} action text(s) (seats {:?}), got {}",
            acting.len(),
            acting,
            actions.len()
        );
        let mut out = StepOutcome::default();
        self.raw.push(actions.to_vec());
        let seat = acting[0];
        if seat == episode::REVIEWER {
            let (valid, fb) = self.reviewer_text(&actions[0]);
            out.push(seat, 0.0, valid, fb);
        } else {
            let (r, valid, fb) = self.writer_text(&actions[0]);
            out.push(seat, r, valid, fb);
        }
        Ok(out)
    }
    fn done(&self) -> bool {
        self.done
    }
    fn reward(&self, seat: usize) -> Reward {
        if seat == episode::REVIEWER {
            self.reviewer_reward()
        } else {
            self.writer_reward()
        }
    }
    fn transcript(&self) -> serde_json::Value {
        serde_json::json!({
            "env": NAME,
            "seed": self.seed,
            "scenario": self.scenario.id,
            "level": self.scenario.level,
            "steps": self.raw,
            "actions": self.history,
            "sections": scenario::SECTIONS.iter().zip(&self.sections)
                .map(|(n, s)| (n.to_string(), serde_json::json!(s)))
                .collect::<serde_json::Map<_, _>>(),
            "items": self.items,
            "grade": self.grade.as_ref().map(|g| g.total),
        })
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
}

impl Scripted for Postmortem {
    fn continuation_action(&mut self, seat: usize) -> String {
        let p = self.rules.continuation;
        policies::policy_text(self, p, seat)
    }
    fn policy_action(&mut self, policy: &str, seat: usize) -> anyhow::Result<String> {
        anyhow::ensure!(seat < 2, "seat {seat} out of range");
        let p = Policy::from_name(policy)?;
        Ok(policies::policy_text(self, p, seat))
    }
    fn seat_active(&self, seat: usize) -> bool {
        !self.done && self.to_act().contains(&seat)
    }
}

impl Inspect for Postmortem {
    fn render_state(&self) -> String {
        self.state_text()
    }
}

// ---------------------------------------------------------------------------------
// Factory.

/// Creates post-mortem episodes with fixed rules and scenarios.
#[derive(Clone)]
pub struct PostmortemFactory {
    pub rules: Rules,
    pub scenarios: Arc<Vec<Arc<Scenario>>>,
}

impl PostmortemFactory {
    pub fn new(options: &Options) -> anyhow::Result<Self> {
        let rules = Rules::from_options(options)?;
        Self::with_rules(rules)
    }

    pub fn with_rules(rules: Rules) -> anyhow::Result<Self> {
        let scenarios = rules.load()?.into_iter().map(Arc::new).collect();
        Ok(Self {
            rules,
            scenarios: Arc::new(scenarios),
        })
    }

    /// The scenario of `seed`: a seeded pick among the loaded ones, then (by `source`)
    /// verbatim or a generated variant.
    pub fn scenario(&self, seed: u64) -> Arc<Scenario> {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed ^ 0x00c0_ffee);
        let base = &self.scenarios[rng.gen_range(0..self.scenarios.len())];
        let generate = match self.rules.source {
            Source::Fixed => false,
            Source::Generated => true,
            Source::Mixed => rng.gen_bool(0.5),
        };
        if generate {
            Arc::new(scenario::generate(base, seed))
        } else {
            Arc::clone(base)
        }
    }

    pub fn episode(&self, seed: u64) -> Postmortem {
        Postmortem::new(self.rules.clone(), self.scenario(seed), seed)
    }

    fn for_level(&self, level: &str) -> anyhow::Result<Self> {
        let scenarios: Vec<Arc<Scenario>> = self
            .scenarios
            .iter()
            .filter(|s| s.level == level)
            .cloned()
            .collect();
        anyhow::ensure!(
            !scenarios.is_empty(),
            "postmortem: no scenario of level `{level}` loaded; levels: {}",
            self.pools().join(", ")
        );
        Ok(Self {
            rules: self.rules.clone(),
            scenarios: Arc::new(scenarios),
        })
    }
}

/// The registry constructor.
pub fn factory(options: &Options) -> anyhow::Result<Box<dyn EnvFactory>> {
    Ok(Box::new(PostmortemFactory::new(options)?))
}

impl EnvFactory for PostmortemFactory {
    fn resolved_options(&self) -> Option<serde_json::Value> {
        let r = &self.rules;
        let d = |v: &dyn std::fmt::Debug| format!("{v:?}");
        Some(serde_json::json!({
            "levels": r.levels, "source": d(&r.source), "files": r.files,
            "reviewer_policy": r.reviewer_policy, "reward_return": r.reward_return,
            "shaping": r.shaping, "continuation": d(&r.continuation),
            "win_threshold": r.win_threshold, "prompt": d(&r.prompt),
            "scenarios": self.scenarios.len(),
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

impl Tools for PostmortemFactory {
    fn describe(&self) -> String {
        let list: Vec<Scenario> = self.scenarios.iter().map(|s| (**s).clone()).collect();
        render::describe(&self.rules, &list)
    }
    fn policies(&self) -> Vec<&'static str> {
        vec!["oracle", "random", "query_everything", "evidence_bound"]
    }
    /// The levels loaded: a baseline row is one policy on one level.
    fn pools(&self) -> Vec<&'static str> {
        scenario::ALL_LEVELS
            .iter()
            .copied()
            .filter(|l| self.scenarios.iter().any(|s| s.level == *l))
            .collect()
    }
    fn baseline(
        &self,
        policy: &str,
        pool: &str,
        episodes: usize,
        first_seed: u64,
    ) -> anyhow::Result<BaselineRow> {
        let p = Policy::from_name(policy)?;
        let f = self.for_level(pool)?;
        let st = policies::stats(|s| f.episode(s), p, episodes, first_seed);
        Ok(st.row(policy, pool))
    }
    fn bench(&self, min_secs: f64) -> Option<BenchResult> {
        Some(policies::bench(|s| self.episode(s), min_secs))
    }
}

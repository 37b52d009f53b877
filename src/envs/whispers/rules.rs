//! The Whispers world: messages and actions, the episode state, legality, the
//! resolution of one step and the shaping rewards (the fixed templates and tasks are in
//! [`super::tasks`], the scripted seats in [`super::scripted`]).

#![allow(clippy::needless_range_loop)]

// Re-exported so that the `rules::` paths used across the crate and its tests keep
// naming the world's constants and tasks.
pub use super::tasks::{
    claim_nonempty, mask_seats, task_index, Claim, Role, TaskSpec, Template, EMPTY, FIELDS,
    MAX_SEATS, NONE, OTHER, TASKS, TEMPLATES, VALUES,
};
use super::Rules;
use crate::envs::ticketmelt::Rng;

/// A verdict mark in a verification reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mark {
    #[default]
    None,
    Confirm,
    Deny,
    Unknown,
}

/// What a message is.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Kind {
    /// Direct message.
    Dm,
    /// Visible to every other seat.
    Broadcast,
    /// "Is this claim true?" to a neighbour.
    VerifyRequest,
    /// The answer to a verification request: a mark per requested field; the
    /// message's claim is the answering seat's own view.
    VerifyReply([Mark; FIELDS]),
    /// The oracle's verdict on the claim (to the checker only).
    FactCheck(bool),
    /// A public accusation of seat `to` by `from`.
    Accusation,
}

/// Who a message says it comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The seat's own role name.
    Role,
    /// "witness" (what adversaries claim too).
    Witness,
    /// A scripted relay forwarding what `origin` said.
    Relay,
    Oracle,
    /// A policy's own words (index into the episode's texts).
    Text(u16),
}

/// One message.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Msg {
    pub from: u8,
    /// Recipient; [`NONE`] for broadcasts.
    pub to: u8,
    pub kind: Kind,
    pub claim: Claim,
    pub conf: f32,
    /// Step it was sent in (others see it from the next step on).
    pub turn: u8,
    /// Who first said the claim ([`NONE`] if unknown).
    pub origin: u8,
    pub source: Source,
    /// Free text of a policy message whose content named no field (index into texts).
    pub text: u16,
}

/// No text.
pub const NO_TEXT: u16 = u16::MAX;

/// A published report: a value and a confidence per field ([`NONE`]: missing).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Report {
    pub values: [u8; FIELDS],
    pub conf: [f32; FIELDS],
}

impl Default for Report {
    fn default() -> Self {
        Report {
            values: EMPTY,
            conf: [0.0; FIELDS],
        }
    }
}

/// A validated action of one seat.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum Action {
    #[default]
    Wait,
    Send {
        target: u8,
        claim: Claim,
        conf: f32,
        source: Option<String>,
        text: Option<String>,
    },
    Broadcast {
        claim: Claim,
        conf: f32,
        source: Option<String>,
        text: Option<String>,
    },
    FactCheck {
        claim: Claim,
    },
    RequestVerify {
        target: u8,
        claim: Claim,
    },
    Accuse {
        target: u8,
    },
    Publish(Report),
}

impl Action {
    pub fn tool(&self) -> &'static str {
        match self {
            Action::Wait => "wait",
            Action::Send { .. } => "send_message",
            Action::Broadcast { .. } => "broadcast",
            Action::FactCheck { .. } => "fact_check",
            Action::RequestVerify { .. } => "request_verify",
            Action::Accuse { .. } => "accuse",
            Action::Publish(_) => "publish",
        }
    }
}

/// Every tool, in the order the observation lists them.
pub const TOOLS: [&str; 7] = [
    "send_message",
    "broadcast",
    "fact_check",
    "request_verify",
    "accuse",
    "publish",
    "wait",
];

/// One Whispers episode.
#[derive(Clone, Debug)]
pub struct Whispers {
    pub(super) rules: Rules,
    pub(super) seed: u64,
    pub(super) task: usize,
    pub(super) rng: Rng,
    /// RNG of the scripted *policies* (random baseline), separate so that what a policy
    /// draws never changes the episode.
    pub(super) prng: Rng,
    pub(super) step: u8,
    pub(super) done: bool,
    pub(super) template: u8,
    pub(super) truth: Claim,
    pub(super) lie: Claim,
    /// Private facts: a witness's noisy view, an adversary's lie; EMPTY otherwise.
    pub(super) view: [Claim; MAX_SEATS],
    pub(super) policy: u16,
    pub(super) budget: [u8; MAX_SEATS],
    pub(super) checks_used: [u8; MAX_SEATS],
    pub(super) accused: [u16; MAX_SEATS],
    pub(super) asked: [u16; MAX_SEATS],
    pub(super) msgs: Vec<Msg>,
    pub(super) texts: Vec<String>,
    /// The published report and who published it.
    pub(super) report: Option<(u8, Report)>,
    pub(super) shaping: [f64; MAX_SEATS],
    pub(super) invalid: [u16; MAX_SEATS],
    pub(super) actions: [u16; MAX_SEATS],
    /// Feedback of each policy seat's last action ("" when valid).
    pub(super) last_feedback: Vec<String>,
    /// Raw texts of every step (one per acting seat): the replayable transcript.
    pub(super) raw: Vec<Vec<String>>,
}

impl Whispers {
    /// A new episode. The same rules and seed always give the same episode.
    pub fn new(rules: Rules, seed: u64) -> Self {
        let mut rng = Rng::new(seed);
        let prng = Rng::new(seed ^ 0x3C6E_F372_FE94_F82B);
        let task = if rules.tasks.len() == 1 {
            rules.tasks.get(0)
        } else {
            rules
                .tasks
                .get(rng.below(rules.tasks.len() as u64) as usize)
        };
        Self::with_task(rules, seed, task, rng, prng)
    }

    /// A new episode of task index `task` (0 = t1), whatever the rules' pool.
    pub fn new_task(rules: Rules, seed: u64, task: usize) -> Self {
        let rng = Rng::new(seed);
        let prng = Rng::new(seed ^ 0x3C6E_F372_FE94_F82B);
        Self::with_task(rules, seed, task.min(TASKS.len() - 1), rng, prng)
    }

    fn with_task(rules: Rules, seed: u64, task: usize, mut rng: Rng, prng: Rng) -> Self {
        let spec = &TASKS[task];
        let template = rng.below(TEMPLATES.len() as u64) as u8;
        let mut truth = EMPTY;
        let mut lie = EMPTY;
        for f in 0..FIELDS {
            truth[f] = rng.below(VALUES as u64) as u8;
        }
        for f in 0..FIELDS {
            lie[f] = other_value(&mut rng, truth[f]);
        }
        let mut view = [EMPTY; MAX_SEATS];
        for (s, role) in spec.roles.iter().enumerate() {
            match role {
                Role::Witness => {
                    for f in 0..FIELDS {
                        view[s][f] = if rng.unit() < spec.noise {
                            other_value(&mut rng, truth[f])
                        } else {
                            truth[f]
                        };
                    }
                }
                Role::Adversary => view[s] = lie,
                _ => {}
            }
        }
        let policy = rules.seat.mask(spec);
        let mut budget = [0u8; MAX_SEATS];
        budget[spec.protagonist as usize] = spec.budget;
        Whispers {
            rules,
            seed,
            task,
            rng,
            prng,
            step: 0,
            done: false,
            template,
            truth,
            lie,
            view,
            policy,
            budget,
            checks_used: [0; MAX_SEATS],
            accused: [0; MAX_SEATS],
            asked: [0; MAX_SEATS],
            msgs: Vec::with_capacity(64),
            texts: Vec::new(),
            report: None,
            shaping: [0.0; MAX_SEATS],
            invalid: [0; MAX_SEATS],
            actions: [0; MAX_SEATS],
            last_feedback: vec![String::new(); spec.seats()],
            raw: Vec::new(),
        }
    }

    pub fn spec(&self) -> &'static TaskSpec {
        &TASKS[self.task]
    }
    pub fn template(&self) -> &'static Template {
        &TEMPLATES[self.template as usize]
    }
    pub fn task_id(&self) -> &'static str {
        self.spec().id
    }
    pub fn seats(&self) -> usize {
        self.spec().seats()
    }
    pub fn role(&self, seat: usize) -> Role {
        self.spec().roles[seat]
    }
    pub fn is_policy(&self, seat: usize) -> bool {
        self.policy & (1 << seat) != 0
    }
    pub fn step_index(&self) -> usize {
        self.step as usize
    }
    pub fn is_done(&self) -> bool {
        self.done
    }
    pub fn truth(&self) -> Claim {
        self.truth
    }
    pub fn lie(&self) -> Claim {
        self.lie
    }
    pub fn private_view(&self, seat: usize) -> Claim {
        self.view[seat]
    }
    pub fn messages(&self) -> &[Msg] {
        &self.msgs
    }
    pub fn published(&self) -> Option<(usize, Report)> {
        self.report.map(|(s, r)| (s as usize, r))
    }
    pub fn budget_left(&self, seat: usize) -> u8 {
        self.budget[seat]
    }
    pub fn accusations(&self, seat: usize) -> u16 {
        self.accused[seat]
    }
    pub fn verify_asked(&self, seat: usize) -> u16 {
        self.asked[seat]
    }
    pub fn neighbours(&self, seat: usize) -> u16 {
        self.spec().neighbour_mask(seat)
    }
    /// Whether `seat` sees message `m` (sent in an earlier step, to it or to everyone).
    #[inline]
    pub fn sees(&self, seat: usize, m: &Msg) -> bool {
        m.turn < self.step && (m.to as usize == seat || (m.to == NONE && m.from as usize != seat))
            || (m.kind == Kind::Accusation && m.turn < self.step && m.from as usize != seat)
    }

    /// The tools `seat` may use now.
    pub fn legal_tools(&self, seat: usize) -> Vec<&'static str> {
        TOOLS
            .iter()
            .copied()
            .filter(|t| self.tool_legal(seat, t).is_ok())
            .collect()
    }

    /// Why `tool` is illegal for `seat` now, if it is.
    pub fn tool_legal(&self, seat: usize, tool: &str) -> Result<(), String> {
        match tool {
            "send_message" | "request_verify" if self.neighbours(seat) == 0 => {
                Err(format!("{tool}: you have no neighbours"))
            }
            "fact_check" if self.budget[seat] == 0 => {
                Err("fact_check: your fact-check budget is 0".to_string())
            }
            "publish" if self.role(seat) != Role::Editor => Err(format!(
                "publish: only the editor may publish (you are a {})",
                self.role(seat).name()
            )),
            _ => Ok(()),
        }
    }

    /// Check a parsed action against the state (role, budget, neighbours, targets).
    pub fn validate(&self, seat: usize, a: &Action) -> Result<(), String> {
        self.tool_legal(seat, a.tool())?;
        let n = self.seats();
        let nb = self.neighbours(seat);
        match a {
            Action::Send { target, .. } | Action::RequestVerify { target, .. }
                if (*target as usize) >= n || nb & (1 << *target) == 0 =>
            {
                Err(format!(
                    "{}: target_id {} is not one of your neighbours {:?}",
                    a.tool(),
                    target,
                    mask_seats(nb).collect::<Vec<_>>()
                ))
            }
            Action::Accuse { target } if (*target as usize) >= n || *target as usize == seat => {
                Err(format!(
                    "accuse: target_id must be another agent in 0..{}, got {target}",
                    n - 1
                ))
            }
            _ => Ok(()),
        }
    }

    /// Play one step: `acts[seat]` for the policy seats (validated actions; entries of
    /// scripted seats are ignored). Returns the shaping reward of every seat.
    pub(super) fn resolve(&mut self, acts: &mut [Action; MAX_SEATS]) -> [f64; MAX_SEATS] {
        let mut shaping = [0.0; MAX_SEATS];
        if self.done {
            return shaping;
        }
        let n = self.seats();
        for seat in 0..n {
            if !self.is_policy(seat) {
                acts[seat] = self.scripted(seat);
            }
        }
        let before = self.msgs.len();
        for seat in 0..n {
            let a = std::mem::replace(&mut acts[seat], Action::Wait);
            if self.is_policy(seat) {
                shaping[seat] = self.shaping_for(seat, &a);
                if a != Action::Wait {
                    self.actions[seat] += 1;
                }
            }
            self.apply(seat, a);
        }
        // Scripted seats answer this step's verification requests.
        for i in before..self.msgs.len() {
            let m = self.msgs[i];
            if m.kind == Kind::VerifyRequest && !self.is_policy(m.to as usize) {
                let reply = self.answer(m.to as usize, m.from as usize, &m.claim);
                self.msgs.push(reply);
            }
        }
        for seat in 0..n {
            self.shaping[seat] += shaping[seat];
        }
        self.step += 1;
        if self.report.is_some() || self.step >= self.spec().max_steps {
            self.done = true;
        }
        shaping
    }

    fn push_text(&mut self, s: String) -> u16 {
        if self.texts.len() >= (NO_TEXT - 1) as usize {
            return NO_TEXT;
        }
        self.texts.push(s);
        (self.texts.len() - 1) as u16
    }

    fn apply(&mut self, seat: usize, a: Action) {
        let turn = self.step;
        let me = seat as u8;
        // Scripted adversaries pose as witnesses; everyone else names its own role.
        let default_source = if self.role(seat) == Role::Adversary && !self.is_policy(seat) {
            Source::Witness
        } else {
            Source::Role
        };
        let msg = |to: u8, kind: Kind, claim: Claim, conf: f32, source: Source, text: u16| Msg {
            from: me,
            to,
            kind,
            claim,
            conf,
            turn,
            origin: me,
            source,
            text,
        };
        match a {
            Action::Wait => {}
            Action::Send {
                target,
                claim,
                conf,
                source,
                text,
            } => {
                let src = source.map_or(default_source, |s| Source::Text(self.push_text(s)));
                let t = text.map_or(NO_TEXT, |s| self.push_text(s));
                self.msgs.push(msg(target, Kind::Dm, claim, conf, src, t));
            }
            Action::Broadcast {
                claim,
                conf,
                source,
                text,
            } => {
                let src = source.map_or(default_source, |s| Source::Text(self.push_text(s)));
                let t = text.map_or(NO_TEXT, |s| self.push_text(s));
                self.msgs
                    .push(msg(NONE, Kind::Broadcast, claim, conf, src, t));
            }
            Action::FactCheck { claim } => {
                self.budget[seat] = self.budget[seat].saturating_sub(1);
                self.checks_used[seat] += 1;
                let verdict = self.oracle(&claim);
                let mut m = msg(
                    me,
                    Kind::FactCheck(verdict),
                    claim,
                    1.0,
                    Source::Oracle,
                    NO_TEXT,
                );
                m.origin = NONE;
                self.msgs.push(m);
            }
            Action::RequestVerify { target, claim } => {
                self.asked[seat] |= 1 << target;
                self.msgs.push(msg(
                    target,
                    Kind::VerifyRequest,
                    claim,
                    0.0,
                    Source::Role,
                    NO_TEXT,
                ));
            }
            Action::Accuse { target } => {
                self.accused[seat] |= 1 << target;
                self.msgs.push(msg(
                    target,
                    Kind::Accusation,
                    EMPTY,
                    1.0,
                    Source::Role,
                    NO_TEXT,
                ));
            }
            Action::Publish(r) => {
                if self.report.is_none() {
                    self.report = Some((me, r));
                }
            }
        }
    }

    /// The oracle: true iff the claim's pairs are a non-empty subset of the truth.
    pub fn oracle(&self, claim: &Claim) -> bool {
        claim_nonempty(claim) && (0..FIELDS).all(|f| claim[f] == NONE || claim[f] == self.truth[f])
    }

    /// Whether the claims `seat` has received disagree on some field (optionally only
    /// on fields named in `within`).
    pub fn contested(&self, seat: usize, within: Option<&Claim>) -> bool {
        let mut seen = [NONE; FIELDS];
        for m in &self.msgs {
            if !matches!(m.kind, Kind::Dm | Kind::Broadcast) || !self.sees(seat, m) {
                continue;
            }
            for f in 0..FIELDS {
                let v = m.claim[f];
                if v >= VALUES as u8 || within.is_some_and(|w| w[f] == NONE) {
                    continue;
                }
                if seen[f] == NONE {
                    seen[f] = v;
                } else if seen[f] != v {
                    return true;
                }
            }
        }
        false
    }

    /// The shaping reward of `seat` for playing `a` now (see the module docs).
    fn shaping_for(&self, seat: usize, a: &Action) -> f64 {
        let s = &self.rules.shaping;
        match a {
            Action::FactCheck { claim } if self.contested(seat, Some(claim)) => s.fact_check,
            Action::RequestVerify { target, .. }
                if !self.is_policy(*target as usize) && self.asked[seat] & (1 << target) == 0 =>
            {
                s.verify
            }
            Action::Broadcast { claim, text, .. } => {
                let repeated = self.msgs.iter().any(|m| {
                    m.from as usize == seat
                        && m.kind == Kind::Broadcast
                        && m.claim == *claim
                        && match (m.text, text) {
                            (NO_TEXT, None) => true,
                            (i, Some(t)) => self.texts.get(i as usize) == Some(t),
                            _ => false,
                        }
                });
                if repeated {
                    s.repeat_broadcast
                } else {
                    0.0
                }
            }
            Action::Publish(_)
                if self.spec().budget > 0
                    && self.budget[seat] > 0
                    && self.checks_used[seat] == 0
                    && self.contested(seat, None) =>
            {
                s.premature_publish
            }
            _ => 0.0,
        }
    }
}

/// A value of the field other than `v`, uniformly among the three.
pub(super) fn other_value(rng: &mut Rng, v: u8) -> u8 {
    let k = rng.below(VALUES as u64 - 1) as u8;
    if k >= v {
        k + 1
    } else {
        k
    }
}

//! Scripted policies for policy seats (baselines and the continuation policy), the
//! heuristic editor's inference, baselines and the fast benchmark.
//!
//! * `random`: a uniformly random legal tool with random parameters (random
//!   neighbour, a received or random claim, uniform confidence, a random report).
//! * `wait`: always `wait`.
//! * `naive_editor` (the seed's): an editor waits, then on its second-to-last step
//!   (where the original's code publishes) publishes the most confident claim it
//!   received, every field at that message's confidence; other roles wait.
//! * `naive_relay` (the seed's "always forward inbox at conf = 0.85"): forwards the
//!   newest received claim to a random neighbour at 0.85 (broadcasts it without
//!   neighbours); as an editor it publishes the newest claim at 0.85 on its
//!   second-to-last step.
//! * `heuristic`: Bayesian source tracking. Sources that broadcast the same claim
//!   twice (the adversaries' pattern) or whose claims a fact-check or a confirmed field
//!   contradicts on two or more fields are liars; a lie is false in every field, so
//!   liars' values are ruled out. The posterior of each field combines the remaining
//!   independent first-hand reports (one per origin) with the known witness noise.
//!   An editor waits for the reports (step 2, step 3 where the task has adversaries),
//!   accuses liars, fact-checks its least certain field while budget lasts, asks an
//!   honest-looking neighbour to verify its draft when the grader pays for coalitions,
//!   and publishes the posterior mode of every field at its posterior probability.
//!   Witnesses broadcast their view at confidence 1 - noise; relays fact-check what
//!   they hear when they can, accuse liars and forward only what is not refuted at
//!   confidence 0.5; adversaries play the scripted adversary.

#![allow(clippy::needless_range_loop)]

use super::rubric::Weights;
use super::rules::{
    claim_nonempty, mask_seats, Action, Claim, Kind, Msg, Report, Role, Whispers, EMPTY, FIELDS,
    MAX_SEATS, NONE, TASKS, VALUES,
};
use super::{Rules, TaskList};
use crate::envs::tools::{measure, BenchResult};
use std::collections::BTreeMap;

/// A scripted policy for a policy seat.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    Random,
    Wait,
    NaiveEditor,
    NaiveRelay,
    Heuristic,
}

/// Every policy by name.
pub const POLICIES: [(&str, Policy); 5] = [
    ("random", Policy::Random),
    ("wait", Policy::Wait),
    ("naive_editor", Policy::NaiveEditor),
    ("naive_relay", Policy::NaiveRelay),
    ("heuristic", Policy::Heuristic),
];

impl Policy {
    pub fn from_name(s: &str) -> anyhow::Result<Self> {
        crate::envs::by_name(&POLICIES, "whispers policy", s)
    }
    pub fn name(self) -> &'static str {
        crate::envs::name_in(&POLICIES, &self)
    }
}

/// What a seat has inferred from what it has seen.
#[derive(Debug, Clone)]
pub struct Beliefs {
    /// Suspected adversaries.
    pub liars: u16,
    /// Per field, per value: posterior probability.
    pub posterior: [[f64; VALUES]; FIELDS],
    /// Honest-looking first-hand sources heard from.
    pub sources: u16,
}

impl Beliefs {
    /// The posterior mode of every field and its probability.
    pub fn best(&self) -> (Claim, [f64; FIELDS]) {
        let mut c = EMPTY;
        let mut p = [0.0; FIELDS];
        for f in 0..FIELDS {
            let (mut bv, mut bp) = (0u8, -1.0);
            for v in 0..VALUES {
                if self.posterior[f][v] > bp {
                    bp = self.posterior[f][v];
                    bv = v as u8;
                }
            }
            c[f] = bv;
            p[f] = bp;
        }
        (c, p)
    }
}

impl Whispers {
    /// The heuristic's inference for `seat` from the messages it has seen.
    pub fn beliefs(&self, seat: usize) -> Beliefs {
        let noise = self.spec().noise;
        let n = self.seats();
        // Known facts from own fact-checks.
        let mut confirmed = [NONE; FIELDS];
        let mut ruled_out = [[false; VALUES]; FIELDS];
        let mut latest: [Option<Claim>; MAX_SEATS] = [None; MAX_SEATS];
        let mut bcasts: [[Claim; 2]; MAX_SEATS] = [[EMPTY; 2]; MAX_SEATS];
        let mut liars = 0u16;
        for m in &self.msgs {
            if !self.sees(seat, m) {
                continue;
            }
            match m.kind {
                Kind::FactCheck(v) => {
                    let named = m.claim.iter().filter(|&&x| x != NONE).count();
                    for f in 0..FIELDS {
                        let x = m.claim[f];
                        if x == NONE {
                            continue;
                        }
                        if v {
                            confirmed[f] = x;
                        } else if named == 1 {
                            ruled_out[f][x as usize] = true;
                        }
                    }
                }
                Kind::Dm | Kind::Broadcast if claim_nonempty(&m.claim) => {
                    let o = if m.origin == NONE { m.from } else { m.origin } as usize;
                    if o < n && o != seat {
                        latest[o] = Some(m.claim);
                    }
                    if m.kind == Kind::Broadcast && (m.from as usize) < n {
                        let b = &mut bcasts[m.from as usize];
                        if b[0] == m.claim || b[1] == m.claim {
                            liars |= 1 << m.from;
                        } else if b[0] == EMPTY {
                            b[0] = m.claim;
                        } else {
                            b[1] = m.claim;
                        }
                    }
                }
                _ => {}
            }
        }
        // Contradictions with known facts on two or more fields mark a liar (one
        // could be a witness's noise).
        for o in 0..n {
            if let Some(c) = latest[o] {
                let bad = (0..FIELDS)
                    .filter(|&f| {
                        c[f] != NONE
                            && ((confirmed[f] != NONE && confirmed[f] != c[f])
                                || ruled_out[f][c[f] as usize])
                    })
                    .count();
                if bad >= 2 {
                    liars |= 1 << o;
                }
            }
        }
        // Sources repeating a known liar's claim word for word are colluding.
        for o in 0..n {
            if let Some(c) = latest[o] {
                if mask_seats(liars).any(|l| l != o && latest[l] == Some(c)) {
                    liars |= 1 << o;
                }
            }
        }
        let mut posterior = [[1.0; VALUES]; FIELDS];
        let mut sources = 0u16;
        for o in 0..n {
            let Some(c) = latest[o] else { continue };
            if liars & (1 << o) != 0 {
                for f in 0..FIELDS {
                    if c[f] != NONE {
                        ruled_out[f][c[f] as usize] = true;
                    }
                }
                continue;
            }
            sources |= 1 << o;
            for f in 0..FIELDS {
                if c[f] == NONE {
                    continue;
                }
                for v in 0..VALUES {
                    posterior[f][v] *= if c[f] as usize == v {
                        1.0 - noise
                    } else {
                        noise / 3.0
                    };
                }
            }
        }
        if claim_nonempty(&self.view[seat]) && self.role(seat) == Role::Witness {
            for f in 0..FIELDS {
                for v in 0..VALUES {
                    posterior[f][v] *= if self.view[seat][f] as usize == v {
                        1.0 - noise
                    } else {
                        noise / 3.0
                    };
                }
            }
        }
        for f in 0..FIELDS {
            if confirmed[f] != NONE {
                posterior[f] = [0.0; VALUES];
                posterior[f][confirmed[f] as usize] = 1.0;
                continue;
            }
            let mut any = false;
            for v in 0..VALUES {
                if ruled_out[f][v] {
                    posterior[f][v] = 0.0;
                } else {
                    any = true;
                }
            }
            if !any {
                posterior[f] = [1.0; VALUES];
            }
            let z: f64 = posterior[f].iter().sum();
            for v in 0..VALUES {
                posterior[f][v] /= z;
            }
        }
        Beliefs {
            liars,
            posterior,
            sources,
        }
    }

    /// The action policy `p` takes for `seat` now (draws only from the policy RNG).
    pub fn policy_move(&mut self, p: Policy, seat: usize) -> Action {
        if self.done || seat >= self.seats() {
            return Action::Wait;
        }
        let a = match p {
            Policy::Wait => Action::Wait,
            Policy::Random => self.random_move(seat),
            Policy::NaiveEditor => {
                if self.role(seat) == Role::Editor && self.last_turns(seat) {
                    if let Some(m) = self.most_confident(seat) {
                        return publish_claim(&m.claim, m.conf);
                    }
                }
                Action::Wait
            }
            Policy::NaiveRelay => self.naive_relay(seat),
            Policy::Heuristic => self.heuristic(seat),
        };
        quantize(a)
    }

    /// Whether it is the seat's second-to-last step or later.
    fn last_turns(&self, _seat: usize) -> bool {
        self.step as usize + 2 >= self.spec().max_steps as usize
    }

    fn random_neighbour_p(&mut self, seat: usize) -> Option<u8> {
        let nb = self.neighbours(seat);
        let k = nb.count_ones();
        (k > 0).then(|| {
            let i = self.prng.below(k as u64) as usize;
            mask_seats(nb).nth(i).unwrap_or(0) as u8
        })
    }

    fn random_claim(&mut self, seat: usize) -> Claim {
        if self.prng.unit() < 0.5 {
            if let Some(m) = self.newest_claim(seat) {
                return m.claim;
            }
        }
        let mut c = EMPTY;
        for f in 0..FIELDS {
            c[f] = self.prng.below(VALUES as u64) as u8;
        }
        c
    }

    fn random_move(&mut self, seat: usize) -> Action {
        let legal = self.legal_tools(seat);
        let tool = legal[self.prng.below(legal.len() as u64) as usize];
        let conf = self.prng.unit() as f32;
        match tool {
            "send_message" => {
                let target = self.random_neighbour_p(seat).unwrap_or(0);
                let claim = self.random_claim(seat);
                Action::Send {
                    target,
                    claim,
                    conf,
                    source: None,
                    text: None,
                }
            }
            "broadcast" => Action::Broadcast {
                claim: self.random_claim(seat),
                conf,
                source: None,
                text: None,
            },
            "fact_check" => {
                let c = self.random_claim(seat);
                Action::FactCheck { claim: c }
            }
            "request_verify" => {
                let target = self.random_neighbour_p(seat).unwrap_or(0);
                let claim = self.random_claim(seat);
                Action::RequestVerify { target, claim }
            }
            "accuse" => {
                let n = self.seats() as u64;
                let mut t = self.prng.below(n - 1) as usize;
                if t >= seat {
                    t += 1;
                }
                Action::Accuse { target: t as u8 }
            }
            "publish" => {
                let mut r = Report::default();
                for f in 0..FIELDS {
                    r.values[f] = self.prng.below(VALUES as u64) as u8;
                    r.conf[f] = self.prng.unit() as f32;
                }
                Action::Publish(r)
            }
            _ => Action::Wait,
        }
    }

    fn naive_relay(&mut self, seat: usize) -> Action {
        let newest = self.newest_claim(seat);
        if self.role(seat) == Role::Editor && self.last_turns(seat) {
            if let Some(m) = newest {
                return publish_claim(&m.claim, 0.85);
            }
            return Action::Wait;
        }
        let Some(m) = newest else {
            return Action::Wait;
        };
        match self.random_neighbour_p(seat) {
            Some(target) => Action::Send {
                target,
                claim: m.claim,
                conf: 0.85,
                source: None,
                text: None,
            },
            None => Action::Broadcast {
                claim: m.claim,
                conf: 0.85,
                source: None,
                text: None,
            },
        }
    }

    fn heuristic(&mut self, seat: usize) -> Action {
        match self.role(seat) {
            Role::Editor => self.heuristic_editor(seat),
            Role::Adversary => self.scripted(seat),
            Role::Witness => self.heuristic_witness(seat),
            Role::Relay => self.heuristic_relay(seat),
        }
    }

    /// The first liar `seat` has not accused yet.
    fn unaccused(&self, seat: usize, b: &Beliefs) -> Option<u8> {
        mask_seats(b.liars & !self.accused[seat] & !(1 << seat))
            .next()
            .map(|s| s as u8)
    }

    fn heuristic_editor(&mut self, seat: usize) -> Action {
        let spec = self.spec();
        let t = self.step as usize;
        let last = t + 1 >= spec.max_steps as usize;
        let ready = if spec.adversary_mask() != 0 { 3 } else { 2 };
        let heard = self.newest_claim(seat).is_some();
        if !last && (t < ready || !heard) {
            return Action::Wait;
        }
        let b = self.beliefs(seat);
        if !last {
            if let Some(l) = self.unaccused(seat, &b) {
                return Action::Accuse { target: l };
            }
        }
        let (best, p) = b.best();
        if !last && self.budget[seat] > 0 {
            // Fact-check the least certain field's best value.
            let f = (0..FIELDS)
                .min_by(|&a, &c| p[a].total_cmp(&p[c]))
                .unwrap_or(0);
            if p[f] < 0.99 {
                let mut claim = EMPTY;
                claim[f] = best[f];
                return Action::FactCheck { claim };
            }
        }
        let w: Weights = self.weights(seat);
        if !last && w.coalition > 0.0 && self.asked[seat] & !b.liars == 0 {
            // Prefer a first-hand honest-looking neighbour, else any unsuspected one.
            let nb = self.neighbours(seat) & !b.liars;
            let target = mask_seats(nb & b.sources)
                .next()
                .or_else(|| mask_seats(nb).next());
            if let Some(target) = target {
                return Action::RequestVerify {
                    target: target as u8,
                    claim: best,
                };
            }
        }
        let mut r = Report::default();
        for f in 0..FIELDS {
            r.values[f] = best[f];
            r.conf[f] = p[f].clamp(0.02, 0.99) as f32;
        }
        Action::Publish(r)
    }

    fn heuristic_witness(&mut self, seat: usize) -> Action {
        let v = self.view[seat];
        let sent = self
            .msgs
            .iter()
            .any(|m| m.from as usize == seat && m.kind == Kind::Broadcast);
        if !sent && claim_nonempty(&v) {
            return Action::Broadcast {
                claim: v,
                conf: (1.0 - self.spec().noise) as f32,
                source: None,
                text: None,
            };
        }
        let b = self.beliefs(seat);
        if let Some(l) = self.unaccused(seat, &b) {
            return Action::Accuse { target: l };
        }
        // Answer a verification request that has not been answered yet.
        if let Some(m) = self.pending_request(seat) {
            return Action::Send {
                target: m.from,
                claim: v,
                conf: (1.0 - self.spec().noise) as f32,
                source: None,
                text: None,
            };
        }
        Action::Wait
    }

    fn pending_request(&self, seat: usize) -> Option<Msg> {
        self.msgs
            .iter()
            .filter(|m| m.kind == Kind::VerifyRequest && self.sees(seat, m))
            .find(|m| {
                !self.msgs.iter().any(|r| {
                    r.from as usize == seat
                        && r.to == m.from
                        && r.turn > m.turn
                        && r.kind == Kind::Dm
                })
            })
            .copied()
    }

    fn heuristic_relay(&mut self, seat: usize) -> Action {
        let b = self.beliefs(seat);
        // Fact-check one field of the newest unrefuted claim while budget lasts.
        if self.budget[seat] > 0 {
            if let Some(m) = self.newest_claim(seat) {
                let o = if m.origin == NONE { m.from } else { m.origin };
                if b.liars & (1 << o) == 0 {
                    if let Some(f) = (0..FIELDS).find(|&f| m.claim[f] != NONE) {
                        let mut claim = EMPTY;
                        claim[f] = m.claim[f];
                        return Action::FactCheck { claim };
                    }
                }
            }
        }
        if let Some(l) = self.unaccused(seat, &b) {
            return Action::Accuse { target: l };
        }
        // Forward the newest claim from an unsuspected origin not forwarded yet,
        // hedged at 0.5.
        let nb = self.neighbours(seat);
        let pick = self.msgs.iter().rev().find(|m| {
            matches!(m.kind, Kind::Dm | Kind::Broadcast)
                && self.sees(seat, m)
                && claim_nonempty(&m.claim)
                && b.liars & (1 << (if m.origin == NONE { m.from } else { m.origin }).min(15)) == 0
                && !self
                    .msgs
                    .iter()
                    .any(|s| s.from as usize == seat && s.claim == m.claim)
        });
        if let Some(m) = pick.copied() {
            if let Some(target) = mask_seats(nb).find(|&k| k != m.from as usize) {
                return Action::Send {
                    target: target as u8,
                    claim: m.claim,
                    conf: 0.5,
                    source: None,
                    text: None,
                };
            }
        }
        Action::Wait
    }

    /// One step where every policy seat plays `p` without parsing text (the fast path).
    /// With `record`, the actions' JSON texts go into the transcript (so it replays);
    /// without, the transcript's steps stay empty (baselines and bench).
    pub fn step_policy(&mut self, p: Policy, record: bool) {
        let mut acts: [Action; MAX_SEATS] = Default::default();
        for seat in 0..self.seats() {
            if self.is_policy(seat) {
                let a = self.policy_move(p, seat);
                acts[seat] = if self.validate(seat, &a).is_ok() {
                    a
                } else {
                    Action::Wait
                };
            }
        }
        if record {
            let t = self.template();
            let texts = (0..self.seats())
                .filter(|&s| self.is_policy(s))
                .map(|s| super::parse::action_json(&acts[s], t))
                .collect();
            self.raw.push(texts);
            for s in 0..self.seats() {
                if self.is_policy(s) {
                    self.last_feedback[s].clear();
                }
            }
        }
        self.resolve(&mut acts);
    }
}

/// Confidences rounded to 0.001, so an action and its JSON text are the same action.
fn quantize(mut a: Action) -> Action {
    let q = |c: &mut f32| *c = ((*c as f64 * 1000.0).round() / 1000.0) as f32;
    match &mut a {
        Action::Send { conf, .. } | Action::Broadcast { conf, .. } => q(conf),
        Action::Publish(r) => r.conf.iter_mut().for_each(q),
        _ => {}
    }
    a
}

fn publish_claim(c: &Claim, conf: f32) -> Action {
    let mut r = Report::default();
    for f in 0..FIELDS {
        if c[f] < VALUES as u8 {
            r.values[f] = c[f];
            r.conf[f] = conf;
        }
    }
    Action::Publish(r)
}

/// Sums over baseline episodes.
#[derive(Debug, Clone, Default)]
pub struct BaselineStats {
    pub episodes: usize,
    /// Seat-episodes.
    pub n: usize,
    pub wins: usize,
    pub scalar: f64,
    pub published: usize,
    pub steps: usize,
    /// Component name -> sum.
    pub sums: BTreeMap<String, f64>,
}

/// Play `episodes` episodes (seeds `first_seed..`) with `p` in every policy seat.
pub fn baseline_stats(rules: Rules, p: Policy, episodes: usize, first_seed: u64) -> BaselineStats {
    let mut st = BaselineStats {
        episodes,
        ..Default::default()
    };
    for i in 0..episodes {
        let mut ep = Whispers::new(rules, first_seed.wrapping_add(i as u64));
        while !ep.done {
            ep.step_policy(p, false);
        }
        st.published += ep.report.is_some() as usize;
        st.steps += ep.step as usize;
        for s in 0..ep.seats() {
            if !ep.is_policy(s) {
                continue;
            }
            let r = ep.reward_of(s);
            st.n += 1;
            st.wins += r.components.get("win").is_some_and(|w| *w >= 0.5) as usize;
            st.scalar += r.scalar;
            for (k, v) in r.components {
                if k != "win" && k != "value" {
                    *st.sums.entry(k).or_default() += v;
                }
            }
        }
    }
    st
}

/// Single-threaded throughput: the `wait` policy in the protagonist seat, scripted
/// seats, all six tasks pooled (the task drawn per seed), rewards computed at the end;
/// with prompts, every policy seat's system and user prompt is also rendered every step
/// into a reused String.
pub fn bench_fast(rules: Rules, min_secs: f64) -> BenchResult {
    let rules = Rules {
        tasks: TaskList::all(),
        ..rules
    };
    let run = |render: bool| {
        let mut buf = String::with_capacity(8192);
        let mut seed = 0u64;
        let mut sink = 0usize;
        let m = measure(min_secs, || {
            let mut ep = Whispers::new(rules, seed);
            seed += 1;
            while !ep.done {
                if render {
                    for s in 0..ep.seats() {
                        if ep.is_policy(s) {
                            buf.clear();
                            ep.system_prompt(&mut buf);
                            ep.render_user(s, &mut buf);
                            sink = sink.wrapping_add(buf.len());
                        }
                    }
                }
                ep.step_policy(Policy::Wait, false);
            }
            sink = sink
                .wrapping_add((ep.parts(TASKS[ep.task].protagonist as usize).value * 1e6) as usize);
            1
        });
        std::hint::black_box(sink);
        m
    };
    BenchResult::from_runs(run(false), run(true))
}

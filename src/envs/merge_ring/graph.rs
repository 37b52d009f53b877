//! The exact public-state graph of one merge_ring episode, for planners and shields.
//!
//! # State
//! A [`PublicState`] holds the phase, the signal profile, the commitment profile and the
//! collision bits, and nothing else:
//! - the initial state: phase [`Phase::Signal`], no signals, no commitments;
//! - after the signal joint action `s`: phase [`Phase::Commit`], signals `s`;
//! - after the commitment joint action `c`: phase [`Phase::Done`], commitments `c` and the
//!   collision bits of `c`. Proposals are spent once everyone has committed: the
//!   absorbing class is determined by the commitments alone, so the signal profile is
//!   cleared (keeping it would multiply the absorbing states by `3^n` without changing
//!   any future).
//!
//! A `Done` state is absorbing: every joint action leads back to it. It belongs to the
//! *collided* class when any collision bit is set (persistently unsafe), otherwise to
//! the *merged* (compatible, high-throughput) class.
//!
//! Every state admits all `3^n` joint actions, so the reachable graph has
//! `1 + 3^n + 3^n = 1 + 2*3^n` states and `(1 + 2*3^n) * 3^n` state x joint-action
//! groups: 19/171 (n=2), 163/13,203 (n=4), 1,459/1,063,611 (n=6),
//! 13,123/86,100,003 (n=8).
//!
//! # Two ways to walk it
//! - [`build_explicit`] materialises the graph by breadth-first search over
//!   [`PublicState`]s (refused above [`MAX_MATERIALIZE_GROUPS`] edges) and
//!   [`check_explicit`] re-derives and checks every successor.
//! - [`count_on_demand`] walks the same reachable set over compact integer codes
//!   ([`Codec`]), enumerating every successor of every state on demand and never
//!   storing an edge: at n=8 it visits all 86,100,003 groups in well under a second
//!   (release) with a few kilobytes of state.

use super::Action;
use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, VecDeque};
use std::time::Instant;

/// The largest ring the graph tools accept (`3^16` joint actions per state).
pub const MAX_GRAPH_AGENTS: usize = 16;

/// The largest number of state x joint-action groups [`build_explicit`] materialises
/// (at 4 bytes an edge: 40 MB). n=6 (1,063,611) fits; n=8 (86,100,003) is refused.
pub const MAX_MATERIALIZE_GROUPS: u64 = 10_000_000;

/// Phase of an episode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    /// Everyone broadcasts a proposal.
    Signal,
    /// Everyone commits simultaneously.
    Commit,
    /// Absorbing: merged or collided.
    Done,
}

/// The absorbing class of a finished episode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Class {
    /// All commitments compatible (no collision bit set).
    Merged,
    /// At least one collision (persistently unsafe).
    Collided,
}

/// The public state of one episode (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PublicState {
    pub phase: Phase,
    /// The signal profile, set during the commit phase only.
    pub signals: Option<Vec<Action>>,
    /// The commitment profile, set once done.
    pub commitments: Option<Vec<Action>>,
    /// Collision bit of each vehicle (all false before the commitment).
    pub collisions: Vec<bool>,
}

impl PublicState {
    /// The initial state of a ring of `n` vehicles.
    pub fn initial(n: usize) -> Self {
        Self {
            phase: Phase::Signal,
            signals: None,
            commitments: None,
            collisions: vec![false; n],
        }
    }

    /// Number of vehicles.
    pub fn agents(&self) -> usize {
        self.collisions.len()
    }

    /// The absorbing class, once done.
    pub fn class(&self) -> Option<Class> {
        match self.phase {
            Phase::Done if self.collisions.iter().any(|&c| c) => Some(Class::Collided),
            Phase::Done => Some(Class::Merged),
            _ => None,
        }
    }
}

/// The collision rule: vehicle `i` collides exactly when it takes a direct slot (early
/// or late) and a ring neighbour (`i-1` or `i+1` mod n) commits to the same slot.
/// Bypass never collides. With n=2 both neighbours are the other vehicle.
pub fn collision_bits(commitments: &[Action]) -> Vec<bool> {
    let n = commitments.len();
    (0..n)
        .map(|i| {
            let c = commitments[i];
            n >= 2
                && c.is_direct()
                && (commitments[(i + n - 1) % n] == c || commitments[(i + 1) % n] == c)
        })
        .collect()
}

/// The successor of `state` under `joint_action` (one action per vehicle). The
/// dynamics are deterministic; this is the single element of [`successors`].
pub fn successor(state: &PublicState, joint_action: &[Action]) -> anyhow::Result<PublicState> {
    let n = state.agents();
    if joint_action.len() != n {
        bail!(
            "joint action has {} actions for {} vehicles",
            joint_action.len(),
            n
        );
    }
    Ok(match state.phase {
        Phase::Signal => PublicState {
            phase: Phase::Commit,
            signals: Some(joint_action.to_vec()),
            commitments: None,
            collisions: vec![false; n],
        },
        Phase::Commit => PublicState {
            phase: Phase::Done,
            signals: None,
            commitments: Some(joint_action.to_vec()),
            collisions: collision_bits(joint_action),
        },
        Phase::Done => state.clone(),
    })
}

/// All successors of `state` under `joint_action`, for planners and shields. The merge
/// ring is deterministic, so the list has exactly one element.
pub fn successors(
    state: &PublicState,
    joint_action: &[Action],
) -> anyhow::Result<Vec<PublicState>> {
    Ok(vec![successor(state, joint_action)?])
}

/// Compact integer codes of states and joint actions of a ring of `n` vehicles.
///
/// A profile (signals, commitments or a joint action) is the base-3 number whose digit
/// `i` is vehicle `i`'s action (early 0, late 1, bypass 2). State codes: `0` the
/// initial state, `1 + s` the commit-phase state with signal profile `s`,
/// `1 + 3^n + c` the done state with commitment profile `c`.
#[derive(Debug, Clone, Copy)]
pub struct Codec {
    n: usize,
    pow: u64,
}

impl Codec {
    pub fn new(n: usize) -> anyhow::Result<Self> {
        if !(2..=MAX_GRAPH_AGENTS).contains(&n) {
            bail!("the merge_ring graph supports 2..={MAX_GRAPH_AGENTS} vehicles, got {n}");
        }
        Ok(Self {
            n,
            pow: 3u64.pow(n as u32),
        })
    }
    pub fn agents(&self) -> usize {
        self.n
    }
    /// Joint actions per state, `3^n`.
    pub fn joint_actions(&self) -> u64 {
        self.pow
    }
    /// Reachable states, `1 + 2*3^n`.
    pub fn num_states(&self) -> u64 {
        1 + 2 * self.pow
    }
    /// State x joint-action groups, `(1 + 2*3^n) * 3^n`.
    pub fn num_groups(&self) -> u64 {
        self.num_states() * self.pow
    }
    /// The base-3 code of a profile.
    pub fn profile_code(&self, profile: &[Action]) -> u64 {
        profile
            .iter()
            .rev()
            .fold(0u64, |acc, a| acc * 3 + a.index() as u64)
    }
    /// The profile of a base-3 code.
    pub fn profile(&self, mut code: u64) -> Vec<Action> {
        (0..self.n)
            .map(|_| {
                let a = Action::from_index((code % 3) as usize);
                code /= 3;
                a
            })
            .collect()
    }
    /// Phase of a state code (None when out of range).
    pub fn phase(&self, code: u64) -> Option<Phase> {
        match code {
            0 => Some(Phase::Signal),
            c if c <= self.pow => Some(Phase::Commit),
            c if c <= 2 * self.pow => Some(Phase::Done),
            _ => None,
        }
    }
    pub fn encode(&self, state: &PublicState) -> anyhow::Result<u64> {
        if state.agents() != self.n {
            bail!("state has {} vehicles, codec {}", state.agents(), self.n);
        }
        Ok(match state.phase {
            Phase::Signal => 0,
            Phase::Commit => {
                1 + self.profile_code(
                    state
                        .signals
                        .as_deref()
                        .context("commit state without signals")?,
                )
            }
            Phase::Done => {
                1 + self.pow
                    + self.profile_code(
                        state
                            .commitments
                            .as_deref()
                            .context("done state without commitments")?,
                    )
            }
        })
    }
    pub fn decode(&self, code: u64) -> Option<PublicState> {
        Some(match self.phase(code)? {
            Phase::Signal => PublicState::initial(self.n),
            Phase::Commit => PublicState {
                phase: Phase::Commit,
                signals: Some(self.profile(code - 1)),
                commitments: None,
                collisions: vec![false; self.n],
            },
            Phase::Done => {
                let c = self.profile(code - 1 - self.pow);
                PublicState {
                    phase: Phase::Done,
                    signals: None,
                    collisions: collision_bits(&c),
                    commitments: Some(c),
                }
            }
        })
    }
    /// The successor code of state `code` under joint action `action` (no allocation).
    pub fn successor_code(&self, code: u64, action: u64) -> u64 {
        if code == 0 {
            1 + action
        } else if code <= self.pow {
            1 + self.pow + action
        } else {
            code
        }
    }
    /// Collision bits of a commitment-profile code, as a bit mask (division based).
    pub fn collision_mask(&self, profile: u64) -> u32 {
        let mut digits = [0u8; MAX_GRAPH_AGENTS];
        let mut c = profile;
        for d in digits.iter_mut().take(self.n) {
            *d = (c % 3) as u8;
            c /= 3;
        }
        mask_of_digits(&digits[..self.n])
    }
}

/// Collision mask of a profile given as digits (early 0, late 1, bypass 2).
fn mask_of_digits(d: &[u8]) -> u32 {
    let n = d.len();
    let mut mask = 0u32;
    for i in 0..n {
        let c = d[i];
        if c != 2 && (d[(i + n - 1) % n] == c || d[(i + 1) % n] == c) {
            mask |= 1 << i;
        }
    }
    mask
}

/// What a graph walk found.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GraphReport {
    pub agents: usize,
    /// Reachable public states.
    pub states: u64,
    /// State x joint-action groups (edges).
    pub groups: u64,
    /// `explicit` or `on_demand`.
    pub mode: &'static str,
    /// Absorbing states of the merged class.
    pub merged_states: u64,
    /// Absorbing states of the collided class.
    pub collided_states: u64,
    /// Successors recomputed and checked.
    pub checked: u64,
    /// Wall-clock seconds of the walk.
    pub seconds: f64,
}

/// The materialised graph: reachable states in BFS order and, row-major, the successor
/// index of every (state, joint action) pair.
#[derive(Debug, Clone)]
pub struct ExplicitGraph {
    pub codec: Codec,
    pub states: Vec<PublicState>,
    /// `successors[s * 3^n + a]` = index of the successor of state `s` under joint
    /// action code `a`.
    pub successors: Vec<u32>,
}

/// Build the reachable graph by BFS from the initial state. Refuses (with an error that
/// says why and what to do instead) above [`MAX_MATERIALIZE_GROUPS`] groups.
pub fn build_explicit(n: usize) -> anyhow::Result<ExplicitGraph> {
    let codec = Codec::new(n)?;
    let groups = codec.num_groups();
    if groups > MAX_MATERIALIZE_GROUPS {
        bail!(
            "refusing to materialise the merge_ring graph for {n} vehicles: {groups} state x \
             joint-action groups exceed the safe limit of {MAX_MATERIALIZE_GROUPS} (the edge \
             table alone would take about {} MB); run without --materialize to count and \
             enumerate successors on demand",
            groups * 4 / 1_000_000
        );
    }
    let joints: Vec<Vec<Action>> = (0..codec.pow).map(|a| codec.profile(a)).collect();
    let mut index: HashMap<PublicState, u32> = HashMap::new();
    let mut states = Vec::new();
    let mut successors = Vec::with_capacity(groups as usize);
    let init = PublicState::initial(n);
    index.insert(init.clone(), 0);
    states.push(init);
    let mut next = 0usize;
    while next < states.len() {
        let state = states[next].clone();
        for joint in &joints {
            let succ = successor(&state, joint)?;
            let id = match index.get(&succ) {
                Some(&id) => id,
                None => {
                    let id = states.len() as u32;
                    index.insert(succ.clone(), id);
                    states.push(succ);
                    id
                }
            };
            successors.push(id);
        }
        next += 1;
    }
    Ok(ExplicitGraph {
        codec,
        states,
        successors,
    })
}

/// Check every successor of a materialised graph: recomputed by [`successor`], equal to
/// the [`Codec`] successor, phases advance Signal -> Commit -> Done, Done is absorbing,
/// collision bits follow [`collision_bits`], and the counts match the closed form.
pub fn check_explicit(graph: &ExplicitGraph) -> anyhow::Result<GraphReport> {
    let codec = graph.codec;
    let pow = codec.pow as usize;
    if graph.successors.len() != graph.states.len() * pow {
        bail!(
            "edge table has {} entries for {} states",
            graph.successors.len(),
            graph.states.len()
        );
    }
    let mut checked = 0u64;
    let (mut merged, mut collided) = (0u64, 0u64);
    for (s, state) in graph.states.iter().enumerate() {
        let code = codec.encode(state)?;
        if codec.decode(code).as_ref() != Some(state) {
            bail!("state {s} does not round-trip through its code");
        }
        match state.class() {
            Some(Class::Merged) => merged += 1,
            Some(Class::Collided) => collided += 1,
            None => {}
        }
        for a in 0..pow {
            let t = graph.successors[s * pow + a] as usize;
            let succ = graph
                .states
                .get(t)
                .context("successor index out of range")?;
            let joint = codec.profile(a as u64);
            if successor(state, &joint)? != *succ {
                bail!("successor of state {s} under joint action {a} differs on recomputation");
            }
            if codec.encode(succ)? != codec.successor_code(code, a as u64) {
                bail!("successor of state {s} under joint action {a} disagrees with its code");
            }
            let ok = match (state.phase, succ.phase) {
                (Phase::Signal, Phase::Commit) => succ.signals.as_deref() == Some(&joint[..]),
                (Phase::Commit, Phase::Done) => {
                    succ.commitments.as_deref() == Some(&joint[..])
                        && succ.collisions == collision_bits(&joint)
                        && succ.signals.is_none()
                }
                (Phase::Done, Phase::Done) => succ == state,
                _ => false,
            };
            if !ok {
                bail!("invalid transition from state {s} under joint action {a}");
            }
            checked += 1;
        }
    }
    let report = GraphReport {
        agents: codec.n,
        states: graph.states.len() as u64,
        groups: graph.successors.len() as u64,
        mode: "explicit",
        merged_states: merged,
        collided_states: collided,
        checked,
        seconds: 0.0,
    };
    if report.states != codec.num_states() || report.groups != codec.num_groups() {
        bail!(
            "reachable graph has {} states / {} groups, expected {} / {}",
            report.states,
            report.groups,
            codec.num_states(),
            codec.num_groups()
        );
    }
    Ok(report)
}

/// Walk the reachable graph over integer codes, enumerating every successor of every
/// reachable state on demand without storing edges. Memory: one visited bit per state
/// and one collision mask per joint action (`3^n` words, 26 KB at n=8), computed once
/// by an odometer over the digits and checked against the division-based decode.
/// Every successor is checked to be in range and to advance the phase correctly
/// (Signal -> Commit with the joint action as signals, Commit -> Done with it as
/// commitments, Done -> itself).
pub fn count_on_demand(n: usize) -> anyhow::Result<GraphReport> {
    let codec = Codec::new(n)?;
    let total = codec.num_states();
    let pow = codec.pow;
    // Collision masks of every commitment profile, by odometer (no divisions), checked
    // against the decoded ones.
    let mut masks = Vec::with_capacity(pow as usize);
    let mut digits = [0u8; MAX_GRAPH_AGENTS];
    for a in 0..pow {
        let m = mask_of_digits(&digits[..n]);
        if m != codec.collision_mask(a) {
            bail!("collision mask of joint action {a} disagrees with its decode");
        }
        masks.push(m);
        for d in digits.iter_mut().take(n) {
            *d += 1;
            if *d < 3 {
                break;
            }
            *d = 0;
        }
    }
    let mut visited = vec![0u64; total.div_ceil(64) as usize];
    let mut queue = VecDeque::new();
    visited[0] |= 1;
    queue.push_back(0u64);
    let (mut states, mut groups) = (0u64, 0u64);
    let (mut merged, mut collided) = (0u64, 0u64);
    while let Some(code) = queue.pop_front() {
        states += 1;
        let phase = codec.phase(code).context("state code out of range")?;
        if phase == Phase::Done {
            if masks[(code - 1 - pow) as usize] != 0 {
                collided += 1;
            } else {
                merged += 1;
            }
        }
        // The expected successor of joint action `a` is `base + a * step`.
        let (base, step) = match phase {
            Phase::Signal => (1, 1),
            Phase::Commit => (1 + pow, 1),
            Phase::Done => (code, 0),
        };
        let mut bad = 0u64;
        for a in 0..pow {
            let t = codec.successor_code(code, a);
            bad |= t ^ (base + a * step);
            let (w, b) = ((t / 64) as usize, t % 64);
            if w >= visited.len() {
                bail!("successor {t} of state {code} out of range");
            }
            if visited[w] & (1 << b) == 0 {
                visited[w] |= 1 << b;
                queue.push_back(t);
            }
        }
        if bad != 0 {
            bail!("state {code} has a successor that does not follow the rules");
        }
        groups += pow;
    }
    if states != codec.num_states() || groups != codec.num_groups() {
        bail!(
            "reachable graph has {states} states / {groups} groups, expected {} / {}",
            codec.num_states(),
            codec.num_groups()
        );
    }
    Ok(GraphReport {
        agents: n,
        states,
        groups,
        mode: "on_demand",
        merged_states: merged,
        collided_states: collided,
        checked: groups,
        seconds: 0.0,
    })
}

/// Explicit build + check for n <= 6 (or when `materialize`), on-demand counting
/// beyond; the report carries the wall-clock seconds.
pub fn walk(n: usize, materialize: bool) -> anyhow::Result<GraphReport> {
    let start = Instant::now();
    let mut report = if materialize || n <= 6 {
        check_explicit(&build_explicit(n)?)?
    } else {
        count_on_demand(n)?
    };
    report.seconds = start.elapsed().as_secs_f64();
    Ok(report)
}

/// Peak resident memory of this process in bytes (Linux `VmHWM`), when available.
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// The largest ring `concord envs graph` walks: the on-demand count visits
/// (1 + 2·3^n)·3^n groups, about 15 s at n = 10 on one core and about 80x longer for
/// every 2 more vehicles (n = 12: about 20 minutes), so larger rings are refused.
pub const MAX_CLI_AGENTS: usize = 10;

/// What `concord envs graph` prints.
#[derive(Debug, Clone)]
pub struct GraphOptions {
    /// Number of vehicles (even, 2..=[`MAX_CLI_AGENTS`]).
    pub agents: usize,
    /// Materialise the edge table even above 6 vehicles (refused above a safe size).
    pub materialize: bool,
    /// Print `{"agents":N,"states":S,"groups":G,"seconds":T}`.
    pub json: bool,
}

/// `concord envs graph ENV`: walk the exact graph of `env` (only merge_ring has one)
/// and print its counts.
pub fn run_graph(env: &str, args: &GraphOptions) -> anyhow::Result<()> {
    if env != "merge_ring" {
        bail!("`envs graph` supports only merge_ring, got `{env}`");
    }
    if args.agents < 2 || !args.agents.is_multiple_of(2) {
        bail!("--agents must be an even number >= 2, got {}", args.agents);
    }
    if args.agents > MAX_CLI_AGENTS {
        bail!(
            "--agents {}: at most {MAX_CLI_AGENTS} (the exact walk visits (1 + 2*3^n)*3^n \
             groups: about 15 s at n = 10, about 80x longer per 2 more vehicles)",
            args.agents
        );
    }
    let r = walk(args.agents, args.materialize)?;
    if args.json {
        crate::say!(
            "{}",
            serde_json::json!({
                "agents": r.agents,
                "states": r.states,
                "groups": r.groups,
                "seconds": r.seconds,
            })
        );
    } else {
        crate::say!(
            "merge_ring graph, {} vehicles ({}): {} reachable states, {} state x joint-action \
             groups; {} merged and {} collided absorbing states; {} successors checked in \
             {:.3} s; peak memory {}",
            r.agents,
            r.mode,
            r.states,
            r.groups,
            r.merged_states,
            r.collided_states,
            r.checked,
            r.seconds,
            peak_rss_bytes().map_or("unknown".to_string(), |b| format!(
                "{:.1} MB",
                b as f64 / 1e6
            )),
        );
    }
    Ok(())
}

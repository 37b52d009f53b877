//! The one episode driver, and what is built on it.
//!
//! [`play`] plays any number of episodes side by side with any action source (a
//! [`Policy`]): each round it asks the policy for every seat in every unfinished
//! episode's [`Environment::to_act`] at once (so a model can sample the whole round in
//! one batch), then steps each episode with its seats' texts. Sequential and
//! simultaneous games both fit, because the environment says whose turn it is.
//!
//! Built on it: single decisions for GRPO ([`sample_decision`], [`score_decision`],
//! [`score_joint`]), whole episodes with a per-seat callback ([`play_episode`]),
//! `concord eval` (the model as the policy) and `concord envs play`; plus [`replay`]
//! and the train/eval seed split.

use super::{EnvFactory, Environment, Message, Reward};
use anyhow::{ensure, Result};

/// One seat that must act now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Turn {
    /// Index of the episode in the slice being played.
    pub episode: usize,
    /// Rounds played before this one (0 for the first).
    pub round: u64,
    pub seat: usize,
}

/// Where actions come from.
pub trait Policy {
    /// One text per turn, in the order of `turns`; turn `t` belongs to
    /// `episodes[t.episode]`.
    fn act(&mut self, episodes: &mut [&mut dyn Environment], turns: &[Turn])
        -> Result<Vec<String>>;
}

/// A borrowed policy plays as itself (the caller reads its state afterwards).
impl<P: Policy + ?Sized> Policy for &mut P {
    fn act(
        &mut self,
        episodes: &mut [&mut dyn Environment],
        turns: &[Turn],
    ) -> Result<Vec<String>> {
        (**self).act(episodes, turns)
    }
}

/// The environment's own continuation policy in every seat (the [`super::Scripted`]
/// capability).
pub struct Continuation;

impl Policy for Continuation {
    fn act(
        &mut self,
        episodes: &mut [&mut dyn Environment],
        turns: &[Turn],
    ) -> Result<Vec<String>> {
        Ok(turns
            .iter()
            .map(|t| episodes[t.episode].continuation_action(t.seat))
            .collect())
    }
}

/// A policy that answers one turn at a time: `f(episode, seat)`.
pub struct EachTurn<F>(pub F);

impl<F: FnMut(&mut dyn Environment, usize) -> Result<String>> Policy for EachTurn<F> {
    fn act(
        &mut self,
        episodes: &mut [&mut dyn Environment],
        turns: &[Turn],
    ) -> Result<Vec<String>> {
        turns
            .iter()
            .map(|t| (self.0)(&mut *episodes[t.episode], t.seat))
            .collect()
    }
}

/// Play `episodes` until each is done or `max_rounds` rounds have been played; returns
/// the rounds played. A step error (which the environment only raises for a malformed
/// call, never for bad text) ends the play with that error.
pub fn play(
    episodes: &mut [&mut dyn Environment],
    policy: &mut dyn Policy,
    max_rounds: u64,
) -> Result<u64> {
    let mut round = 0;
    while round < max_rounds {
        let pending: Vec<usize> = (0..episodes.len())
            .filter(|&i| !episodes[i].done())
            .collect();
        if pending.is_empty() {
            break;
        }
        let turns: Vec<Turn> = pending
            .iter()
            .flat_map(|&i| {
                episodes[i].to_act().into_iter().map(move |seat| Turn {
                    episode: i,
                    round,
                    seat,
                })
            })
            .collect();
        let texts = policy.act(episodes, &turns)?.into_iter();
        ensure!(
            texts.len() == turns.len(),
            "the policy gave {} actions for {} turns",
            texts.len(),
            turns.len()
        );
        let texts: Vec<String> = texts.collect();
        // rewards an outside program computes: one exchange for the round
        super::batch::prefetch(
            turns
                .iter()
                .zip(&texts)
                .map(|(t, text)| (&*episodes[t.episode], t.seat, text.as_str())),
        )?;
        let mut texts = texts.into_iter();
        let mut at = 0;
        for &i in &pending {
            let n = turns[at..].iter().take_while(|t| t.episode == i).count();
            let actions: Vec<String> = texts.by_ref().take(n).collect();
            at += n;
            episodes[i].step(&actions)?;
        }
        round += 1;
    }
    Ok(round)
}

/// [`play`] of one episode.
pub fn play_one(
    env: &mut dyn Environment,
    policy: &mut dyn Policy,
    max_rounds: u64,
) -> Result<u64> {
    play(&mut [env], policy, max_rounds)
}

/// One policy seat at one state: the unit GRPO trains on.
pub struct Decision {
    /// The episode at the decision point (not yet stepped for this round).
    pub env: Box<dyn Environment>,
    /// The policy seat that decides.
    pub seat: usize,
    /// Its observation (system + user): the prompt.
    pub messages: Vec<Message>,
    /// The seed that produced this decision.
    pub seed: u64,
    /// Steps played before the decision.
    pub step: usize,
}

impl Clone for Decision {
    fn clone(&self) -> Self {
        Decision {
            env: self.env.clone_box(),
            seat: self.seat,
            messages: self.messages.clone(),
            seed: self.seed,
            step: self.step,
        }
    }
}

impl std::fmt::Debug for Decision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Decision")
            .field("env", &self.env.name())
            .field("seat", &self.seat)
            .field("seed", &self.seed)
            .field("step", &self.step)
            .finish()
    }
}

/// A decision, a pure function of `seed`: reset with `seed`, measure the continuation
/// rollout's length L on a copy, advance `k` uniform in `0..L` steps with the
/// continuation policy, and pick uniformly among the policy seats that are still
/// active (all policy seats if none is; `k = 0` if the seat list is empty there).
pub fn sample_decision(factory: &dyn EnvFactory, seed: u64) -> Decision {
    let base = factory.reset(seed);
    let len = match base.as_scripted().and_then(|s| s.continuation_len()) {
        Some(len) => len,
        None => {
            let mut probe = base.clone_box();
            // The continuation policy's texts are valid actions: its steps do not fail.
            play_one(probe.as_mut(), &mut Continuation, 100_000).unwrap_or(0) as usize
        }
    };
    let (k, pick) = decision_point(seed, len);
    let mut env = base.clone_box();
    let steps = play_one(env.as_mut(), &mut Continuation, k as u64).unwrap_or(0) as usize;
    let start = || Ok::<_, std::convert::Infallible>(base);
    decide_or_start(env, start, seed, steps, pick).unwrap_or_else(|e| match e {})
}

/// Decisions for an environment with no scripted policy (a remote server), or rolled
/// in by the model (`[env] roll_in`), as [`sample_decision`] draws them with `policy` in
/// the continuation policy's place: `policy` plays each seed's episode to its end (all
/// side by side, in one [`play`]), which gives its length L; the decision is the state
/// after the first `k` of those steps, `k` uniform in `0..L`, rebuilt by replaying them
/// on a fresh reset.
pub fn sample_decisions_with(
    factory: &dyn EnvFactory,
    seeds: &[u64],
    policy: &mut dyn Policy,
) -> Result<Vec<Decision>> {
    let drawn = sample_decisions_contested_with(factory, seeds, policy, None)?;
    Ok(drawn.into_iter().map(|(d, _)| d).collect())
}

/// [`sample_decisions_with`], and under a contest rule the first contested decision of
/// up to `rule.draws` steps of `policy`'s own episode: the drawn step first, then steps
/// drawn from derived seeds ([`super::contest::draw_seed`]), each judged as
/// [`super::contest::sample_contested`] judges a scripted draw. No more episodes are
/// played: every candidate is a state the policy reached.
pub fn sample_decisions_contested_with(
    factory: &dyn EnvFactory,
    seeds: &[u64],
    policy: &mut dyn Policy,
    rule: Option<super::ContestRule>,
) -> Result<Vec<(Decision, Option<super::Contest>)>> {
    let mut probes = seeds
        .iter()
        .map(|&s| factory.try_reset(s))
        .collect::<Result<Vec<_>>>()?;
    play_to_end(&mut probes, policy)?;
    let mut out = Vec::with_capacity(seeds.len());
    for (probe, &seed) in probes.into_iter().zip(seeds) {
        let steps = transcript_steps(&probe.transcript())?;
        drop(probe); // a remote probe's session closes before the decision's opens
        let at = |draw_seed: u64| decision_at(factory, seed, &steps, draw_seed);
        out.push(match rule {
            None => (at(seed)?, None),
            Some(rule) => {
                let (d, c) = super::contest::first_contested(at, seed, rule)?;
                (d, Some(c))
            }
        });
    }
    Ok(out)
}

/// The decision of episode `seed` that `draw_seed` picks among its played `steps`:
/// the state after the first `k`, replayed on a fresh reset.
fn decision_at(
    factory: &dyn EnvFactory,
    seed: u64,
    steps: &[Vec<String>],
    draw_seed: u64,
) -> Result<Decision> {
    let (k, pick) = decision_point(draw_seed, steps.len());
    let mut env = factory.try_reset(seed)?;
    for actions in &steps[..k] {
        env.step(actions)?;
    }
    decide_or_start(env, || factory.try_reset(seed), seed, k, pick)
}

/// [`play`] owned episodes side by side until each is done.
fn play_to_end(episodes: &mut [Box<dyn Environment>], policy: &mut dyn Policy) -> Result<()> {
    let mut live: Vec<&mut dyn Environment> = episodes
        .iter_mut()
        .map(|e| -> &mut dyn Environment { e.as_mut() })
        .collect();
    play(&mut live, policy, MAX_ROUNDS).map(|_| ())
}

/// Where a decision of `seed` falls in an episode of `len` steps: the steps to play
/// first, and a number that picks the deciding seat.
fn decision_point(seed: u64, len: usize) -> (usize, u64) {
    let r1 = crate::rng::splitmix64(seed ^ 0xD1B5_4A32_D192_ED03);
    let r2 = crate::rng::splitmix64(r1);
    let k = if len == 0 {
        0
    } else {
        (r1 % len as u64) as usize
    };
    (k, r2)
}

/// The policy seats still active in `env` (all policy seats if none is).
fn deciding_seats(env: &dyn Environment) -> Vec<usize> {
    let seats: Vec<usize> = env
        .policy_seats()
        .into_iter()
        .filter(|&s| env.seat_active(s))
        .collect();
    if seats.is_empty() {
        env.policy_seats()
    } else {
        seats
    }
}

/// The decision at `env` after `steps` steps, its seat picked from
/// [`deciding_seats`] by `pick`; at the episode's `start` (any policy seat) if `env`
/// is done or has no policy seat.
fn decide_or_start<E>(
    env: Box<dyn Environment>,
    start: impl FnOnce() -> std::result::Result<Box<dyn Environment>, E>,
    seed: u64,
    steps: usize,
    pick: u64,
) -> std::result::Result<Decision, E> {
    let mut seats = deciding_seats(env.as_ref());
    let (env, steps) = if seats.is_empty() || env.done() {
        let start = start()?;
        seats = start.policy_seats();
        (start, 0)
    } else {
        (env, steps)
    };
    let seat = if seats.is_empty() {
        0
    } else {
        seats[(pick % seats.len() as u64) as usize]
    };
    let messages = env.observation(seat);
    Ok(Decision {
        env,
        seat,
        messages,
        seed,
        step: steps,
    })
}

/// A transcript's `steps`: each step's texts, one per acting seat.
fn transcript_steps(transcript: &serde_json::Value) -> Result<Vec<Vec<String>>> {
    let steps = transcript
        .get("steps")
        .and_then(serde_json::Value::as_array)
        .ok_or_else(|| anyhow::anyhow!("transcript has no `steps` array"))?;
    steps
        .iter()
        .enumerate()
        .map(|(i, step)| {
            step.as_array()
                .ok_or_else(|| anyhow::anyhow!("step {i} is not an array"))?
                .iter()
                .map(|t| {
                    t.as_str()
                        .map(str::to_string)
                        .ok_or_else(|| anyhow::anyhow!("step {i}: non-string action"))
                })
                .collect()
        })
        .collect()
}

/// Reward of `d.seat` after playing `completion` for it now (continuation policy for
/// the other policy seats and for the rest of the episode). Deterministic.
pub fn score_decision(d: &Decision, completion: &str) -> Reward {
    score_joint(d.env.as_ref(), &[(d.seat, completion)])
        .pop()
        .unwrap_or_default()
}

/// [`score_decision`], except that a step that failed outside the environment's own
/// rules (a reward program that failed, a lost server: [`super::is_lost`]) is an error
/// instead of the reward of a malformed call.
pub fn try_score_decision(d: &Decision, completion: &str) -> Result<Reward> {
    let mut env = d.env.clone_box();
    if !env.done() {
        if let Err(e) = step_given(env.as_mut(), &[(d.seat, completion)]) {
            if super::is_lost(&e) {
                return Err(e);
            }
            return Ok(step_error());
        }
        env.rollout();
    }
    Ok(env.reward(d.seat))
}

/// Play the given completions for the given seats in the current step (the
/// continuation policy for the other acting seats), roll out, and return each given
/// seat's reward, in the order given. Needs the [`super::Scripted`] capability to
/// finish the episode.
pub fn score_joint(env: &dyn Environment, completions: &[(usize, &str)]) -> Vec<Reward> {
    let mut env = env.clone_box();
    if !env.done() {
        if !step_now(env.as_mut(), completions) {
            return completions.iter().map(|_| step_error()).collect();
        }
        env.rollout();
    }
    completions.iter().map(|(s, _)| env.reward(*s)).collect()
}

/// Step `env` once with the given completions for their seats and the continuation
/// policy for the other acting seats; false if the step failed.
fn step_now(env: &mut dyn Environment, completions: &[(usize, &str)]) -> bool {
    step_given(env, completions).is_ok()
}

/// [`step_now`], with the step's error.
fn step_given(env: &mut dyn Environment, completions: &[(usize, &str)]) -> Result<()> {
    let actions: Vec<String> = env
        .to_act()
        .into_iter()
        .map(|s| match completions.iter().find(|(seat, _)| *seat == s) {
            Some((_, text)) => text.to_string(),
            None => env.continuation_action(s),
        })
        .collect();
    env.step(&actions).map(|_| ())
}

/// The reward of a decision whose step failed (a malformed call).
fn step_error() -> Reward {
    let mut r = Reward::default();
    r.components.insert("error".into(), 1.0);
    r
}

/// [`score_decision`] of many decisions, with `policy` instead of the continuation
/// policy for the rest of each episode: each completion is played for its decision's
/// seat now (the continuation policy for the other seats acting this round), then
/// `policy` plays every policy seat of every episode, all episodes side by side through
/// [`play`], until each is done. With the model being trained as `policy`, a decision
/// is scored by what the model itself does afterwards (an on-policy return), not by
/// what a scripted player would make of it.
pub fn score_decisions_with(
    items: &[(&Decision, &str)],
    policy: &mut dyn Policy,
) -> Result<Vec<Reward>> {
    // A step error is a malformed call or, on a server, a lost connection: never a
    // reward (as in [`play`]).
    super::batch::prefetch(
        items
            .iter()
            .map(|(d, text)| (d.env.as_ref(), d.seat, *text)),
    )?;
    let mut envs = items
        .iter()
        .map(|(d, text)| {
            let mut env = d.env.clone_box();
            if !env.done() {
                step_given(env.as_mut(), &[(d.seat, text)])?;
            }
            Ok(env)
        })
        .collect::<Result<Vec<_>>>()?;
    play_to_end(&mut envs, policy)?;
    Ok(envs
        .iter()
        .zip(items)
        .map(|(env, (d, _))| env.reward(d.seat))
        .collect())
}

/// Episode seeds with this bit set are held out for evaluation: training draws its
/// episodes from seeds without it ([`training_seed`]), `concord eval` from seeds with
/// it ([`eval_seed`]), so the two never share an episode.
pub const HELD_OUT_BIT: u64 = 1 << 63;

/// A training episode seed (never a held-out one).
pub fn training_seed(x: u64) -> u64 {
    x & !HELD_OUT_BIT
}

/// The `i`-th held-out evaluation episode seed.
pub fn eval_seed(i: u64) -> u64 {
    HELD_OUT_BIT | (i & !HELD_OUT_BIT)
}

/// Play a whole episode from `seed`, asking `act(env, seat)` for the text of every
/// seat in [`Environment::to_act`] each step; returns the finished episode.
pub fn play_episode(
    factory: &dyn EnvFactory,
    seed: u64,
    act: impl FnMut(&mut dyn Environment, usize) -> anyhow::Result<String>,
) -> anyhow::Result<Box<dyn Environment>> {
    let mut env = factory.reset(seed);
    play_one(env.as_mut(), &mut EachTurn(act), MAX_ROUNDS)?;
    ensure!(env.done(), "episode did not end after {MAX_ROUNDS} rounds");
    Ok(env)
}

/// Rounds after which an episode is taken to be stuck.
pub const MAX_ROUNDS: u64 = 1_000_000;

/// Rebuild an episode from a transcript's `seed` and `steps`.
pub fn replay(
    factory: &dyn EnvFactory,
    transcript: &serde_json::Value,
) -> anyhow::Result<Box<dyn Environment>> {
    let seed = transcript
        .get("seed")
        .and_then(serde_json::Value::as_u64)
        .ok_or_else(|| anyhow::anyhow!("transcript has no integer `seed`"))?;
    let mut env = factory.reset(seed);
    for texts in transcript_steps(transcript)? {
        env.step(&texts)?;
    }
    Ok(env)
}

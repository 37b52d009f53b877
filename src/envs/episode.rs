//! Driving episodes: single decisions (sample and score, for GRPO on one decision),
//! whole episodes with any action source, replay, and the train/eval seed split.

use super::{EnvFactory, Environment, Message, Reward};

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

/// Play one continuation step (one text per acting seat).
fn continuation_step(env: &mut dyn Environment) -> bool {
    let actions: Vec<String> = env
        .to_act()
        .into_iter()
        .map(|s| env.continuation_action(s))
        .collect();
    env.step(&actions).is_ok()
}

/// A decision, a pure function of `seed`: reset with `seed`, measure the continuation
/// rollout's length L on a copy, advance `k` uniform in `0..L` steps with the
/// continuation policy, and pick uniformly among the policy seats that are still
/// active (all policy seats if none is; `k = 0` if the seat list is empty there).
pub fn sample_decision(factory: &dyn EnvFactory, seed: u64) -> Decision {
    let base = factory.reset(seed);
    let mut probe = base.clone_box();
    let mut len = 0usize;
    while !probe.done() && len < 100_000 {
        if !continuation_step(probe.as_mut()) {
            break;
        }
        len += 1;
    }
    let r1 = crate::rng::splitmix64(seed ^ 0xD1B5_4A32_D192_ED03);
    let r2 = crate::rng::splitmix64(r1);
    let k = if len == 0 {
        0
    } else {
        (r1 % len as u64) as usize
    };
    let mut env = base.clone_box();
    let mut steps = 0;
    while steps < k && !env.done() {
        if !continuation_step(env.as_mut()) {
            break;
        }
        steps += 1;
    }
    let mut seats: Vec<usize> = env
        .policy_seats()
        .into_iter()
        .filter(|&s| env.seat_active(s))
        .collect();
    if seats.is_empty() {
        seats = env.policy_seats();
    }
    if seats.is_empty() || env.done() {
        env = base;
        steps = 0;
        seats = env.policy_seats();
    }
    let seat = if seats.is_empty() {
        0
    } else {
        seats[(r2 % seats.len() as u64) as usize]
    };
    let messages = env.observation(seat);
    Decision {
        env,
        seat,
        messages,
        seed,
        step: steps,
    }
}

/// Reward of `d.seat` after playing `completion` for it now (continuation policy for
/// the other policy seats and for the rest of the episode). Deterministic.
pub fn score_decision(d: &Decision, completion: &str) -> Reward {
    score_joint(d.env.as_ref(), &[(d.seat, completion)])
        .pop()
        .unwrap_or_default()
}

/// Play the given completions for the given seats in the current step (the
/// continuation policy for the other acting seats), roll out, and return each given
/// seat's reward, in the order given. Needs the [`super::Scripted`] capability to
/// finish the episode.
pub fn score_joint(env: &dyn Environment, completions: &[(usize, &str)]) -> Vec<Reward> {
    let mut env = env.clone_box();
    if !env.done() {
        let actions: Vec<String> = env
            .to_act()
            .into_iter()
            .map(|s| match completions.iter().find(|(seat, _)| *seat == s) {
                Some((_, text)) => text.to_string(),
                None => env.continuation_action(s),
            })
            .collect();
        if env.step(&actions).is_err() {
            let mut r = Reward::default();
            r.components.insert("error".into(), 1.0);
            return completions.iter().map(|_| r.clone()).collect();
        }
        env.rollout();
    }
    completions.iter().map(|(s, _)| env.reward(*s)).collect()
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
    mut act: impl FnMut(&mut dyn Environment, usize) -> anyhow::Result<String>,
) -> anyhow::Result<Box<dyn Environment>> {
    let mut env = factory.reset(seed);
    let mut guard = 0;
    while !env.done() {
        let mut actions = Vec::new();
        for s in env.to_act() {
            actions.push(act(env.as_mut(), s)?);
        }
        env.step(&actions)?;
        guard += 1;
        anyhow::ensure!(guard < 1_000_000, "episode did not end");
    }
    Ok(env)
}

/// Rebuild an episode from a transcript's `seed` and `steps`.
pub fn replay(
    factory: &dyn EnvFactory,
    transcript: &serde_json::Value,
) -> anyhow::Result<Box<dyn Environment>> {
    let seed = transcript
        .get("seed")
        .and_then(serde_json::Value::as_u64)
        .ok_or_else(|| anyhow::anyhow!("transcript has no integer `seed`"))?;
    let steps = transcript
        .get("steps")
        .and_then(serde_json::Value::as_array)
        .ok_or_else(|| anyhow::anyhow!("transcript has no `steps` array"))?;
    let mut env = factory.reset(seed);
    for (i, step) in steps.iter().enumerate() {
        let texts: Vec<String> = step
            .as_array()
            .ok_or_else(|| anyhow::anyhow!("step {i} is not an array"))?
            .iter()
            .map(|t| {
                t.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| anyhow::anyhow!("step {i}: non-string action"))
            })
            .collect::<anyhow::Result<_>>()?;
        env.step(&texts)?;
    }
    Ok(env)
}

//! One OpenEnv session: an environment episode seen through OpenEnv's single-agent
//! `reset` / `step` / `state` (no I/O here; `ws.rs` and `http.rs` carry it).
//!
//! # Seats
//! OpenEnv is single-agent: one action per `step`. A Concord environment may give the
//! policy several seats (self-play). The session's client acts for the environment's
//! policy seats in turn order: `step` takes the text of the seat named by the
//! observation's `seat` (the next one in `to_act()`), and once every acting seat has
//! answered, the environment steps with all the texts at once. Scripted seats act
//! inside the environment as always. With one policy seat (every built-in
//! environment's default options), each OpenEnv step is one environment step.
//!
//! # Rewards
//! A step's `reward` is the step reward ([`crate::envs::StepOutcome`]) of the seat
//! that acted; 0.0 while its round waits for other seats. Environments with a terminal
//! reward report 0.0 until the last step, whose reward is the seat's episode scalar
//! (TICKETMELT: the sum of a seat's step rewards is its scalar). Once done, the
//! observation's `rewards` carries every policy seat's final reward and components.
//!
//! # Invalid actions
//! Text the environment cannot parse is the environment's business: it plays its
//! documented default, and the observation says so (`valid: false`, `feedback`).
//! Only frames whose action is missing or not a string are refused (VALIDATION_ERROR,
//! HTTP 422), in `protocol.rs`.
use super::protocol::{ErrorCode, ResetParams, WireError};
use crate::envs::{EnvFactory, Environment};
use serde_json::{json, Value};
use std::sync::Arc;

/// An episode in progress.
struct Episode {
    env: Box<dyn Environment>,
    id: String,
    seed: u64,
    /// OpenEnv steps (actions) taken.
    steps: usize,
    /// Texts of this round's acting seats answered so far (in `to_act()` order).
    pending: Vec<String>,
    /// The seat the last action was for, its validity (None: its round is not played
    /// yet) and feedback.
    last: Option<(usize, Option<bool>, String)>,
}

/// What a `reset` or `step` returns: OpenEnv's `{observation, reward, done}`.
#[derive(Debug, Clone, PartialEq)]
pub struct StepReply {
    pub observation: Value,
    pub reward: Option<f64>,
    pub done: bool,
}

impl StepReply {
    /// `ResetResponse` / `StepResponse`, and the `data` of a WebSocket `observation`.
    pub fn to_json(&self) -> Value {
        json!({"observation": self.observation, "reward": self.reward, "done": self.done})
    }
}

/// One client's environment: no episode until the first `reset`.
pub struct Session {
    factory: Arc<dyn EnvFactory>,
    episode: Option<Episode>,
}

impl Session {
    pub fn new(factory: Arc<dyn EnvFactory>) -> Self {
        Self {
            factory,
            episode: None,
        }
    }

    /// Start a new episode. Without a seed, one is drawn at random (OpenEnv's meaning
    /// of "no seed"); the same seed always gives the same episode.
    pub fn reset(&mut self, p: ResetParams) -> StepReply {
        let seed = p.seed.unwrap_or_else(rand::random);
        let id = p.episode_id.unwrap_or_else(new_episode_id);
        let ep = Episode {
            env: self.factory.reset(seed),
            id,
            seed,
            steps: 0,
            pending: Vec::new(),
            last: None,
        };
        let reply = StepReply {
            observation: ep.observation(),
            reward: None,
            done: ep.env.done(),
        };
        self.episode = Some(ep);
        reply
    }

    /// Play `text` for the seat on the move.
    pub fn step(&mut self, text: String) -> Result<StepReply, WireError> {
        let ep = self.episode.as_mut().ok_or_else(|| {
            WireError::new(ErrorCode::ExecutionError, "no episode: send `reset` first")
        })?;
        let acting = ep.env.to_act();
        let Some(&seat) = acting.get(ep.pending.len()) else {
            return Err(WireError::new(
                ErrorCode::ExecutionError,
                "the episode is over: send `reset` to start another",
            ));
        };
        ep.pending.push(text);
        ep.steps += 1;
        let mut reward = 0.0;
        ep.last = Some((seat, None, String::new()));
        if ep.pending.len() == acting.len() {
            let texts = std::mem::take(&mut ep.pending);
            let out = ep
                .env
                .step(&texts)
                .map_err(|e| WireError::new(ErrorCode::ExecutionError, format!("{e:#}")))?;
            if let Some(k) = out.position(seat) {
                reward = out.rewards.get(k).copied().unwrap_or(0.0);
                let valid = out.valid.get(k).copied();
                let feedback = out.feedback.get(k).cloned().unwrap_or_default();
                ep.last = Some((seat, valid, feedback));
            }
        }
        Ok(StepReply {
            observation: ep.observation(),
            reward: Some(reward),
            done: ep.env.done(),
        })
    }

    /// OpenEnv's `State`: `episode_id` and `step_count`, plus what a client needs to
    /// replay the episode in-process (`env`, `seed`, `transcript`).
    pub fn state(&self) -> Value {
        match &self.episode {
            None => json!({"episode_id": null, "step_count": 0, "env": self.factory.name(),
                           "seed": null, "done": false, "to_act": []}),
            Some(ep) => json!({
                "episode_id": ep.id,
                "step_count": ep.steps,
                "env": self.factory.name(),
                "seed": ep.seed,
                "done": ep.env.done(),
                "to_act": ep.env.to_act(),
                "transcript": ep.env.transcript(),
            }),
        }
    }

    /// Whether an episode has been started.
    pub fn started(&self) -> bool {
        self.episode.is_some()
    }

    /// The current observation (MCP `observe`), or an error before the first reset.
    pub fn observation(&self) -> Result<StepReply, WireError> {
        let ep = self
            .episode
            .as_ref()
            .ok_or_else(|| WireError::new(ErrorCode::ExecutionError, "no episode: reset first"))?;
        Ok(StepReply {
            observation: ep.observation(),
            reward: None,
            done: ep.env.done(),
        })
    }

    pub fn factory(&self) -> &dyn EnvFactory {
        self.factory.as_ref()
    }
}

impl Episode {
    /// The seat the next action is for; once done, the last seat that acted (else the
    /// first policy seat).
    fn seat(&self) -> usize {
        self.env
            .to_act()
            .get(self.pending.len())
            .copied()
            .or(self.last.as_ref().map(|l| l.0))
            .or_else(|| self.env.policy_seats().first().copied())
            .unwrap_or(0)
    }

    fn observation(&self) -> Value {
        let seat = self.seat();
        let messages = self.env.observation(seat);
        let prompt = messages
            .last()
            .map(|m| m.content.clone())
            .unwrap_or_default();
        let (valid, feedback) = match &self.last {
            Some((_, v, f)) => (json!(v), f.clone()),
            None => (Value::Null, String::new()),
        };
        let mut obs = json!({
            "seat": seat,
            "messages": messages,
            "prompt": prompt,
            "step": self.steps,
            "valid": valid,
            "feedback": feedback,
        });
        if self.env.done() {
            let rewards: Vec<Value> = self
                .env
                .policy_seats()
                .into_iter()
                .map(|s| {
                    let r = self.env.reward(s);
                    json!({"seat": s, "scalar": r.scalar, "components": r.components})
                })
                .collect();
            obs["rewards"] = json!(rewards);
        }
        obs
    }
}

/// A random UUID-4-shaped id (what openenv-core's environments use).
pub(super) fn new_episode_id() -> String {
    let x: u128 =
        (rand::random::<u128>() & !(0xf << 76) & !(0x3 << 62)) | (0x4 << 76) | (0x2 << 62);
    let h = format!("{x:032x}");
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envs::{create, Options};

    fn session(options: &[(&str, &str)]) -> Session {
        let mut o = Options::new();
        for (k, v) in options {
            o.insert((*k).into(), (*v).into());
        }
        Session::new(Arc::from(create("ticketmelt", &o).unwrap()))
    }

    #[test]
    fn step_before_reset_and_after_done_are_execution_errors() {
        let mut s = session(&[]);
        assert_eq!(
            s.step("x".into()).unwrap_err().code,
            ErrorCode::ExecutionError
        );
        let r = s.reset(ResetParams {
            seed: Some(3),
            episode_id: Some("ep".into()),
        });
        assert_eq!(r.reward, None);
        assert!(!r.done);
        let mut last = r;
        while !last.done {
            last = s.step("{\"commitment\":\"MONITOR\"}".into()).unwrap();
        }
        assert!(last.observation["rewards"].is_array());
        assert_eq!(
            s.step("x".into()).unwrap_err().code,
            ErrorCode::ExecutionError
        );
        assert_eq!(s.state()["episode_id"], "ep");
        assert_eq!(s.state()["seed"], 3);
    }

    #[test]
    fn self_play_seats_act_in_turn_order() {
        let mut s = session(&[("peers", "self_play")]);
        let r = s.reset(ResetParams {
            seed: Some(1),
            episode_id: None,
        });
        assert_eq!(r.observation["seat"], 0);
        let r = s.step("DEPLOY_PROD_B".into()).unwrap();
        // the round waits for the other seats: no environment step yet
        assert_eq!(r.observation["seat"], 1);
        assert_eq!(r.observation["valid"], Value::Null);
        assert_eq!(r.reward, Some(0.0));
        assert_eq!(
            s.state()["transcript"]["steps"].as_array().unwrap().len(),
            0
        );
        for _ in 1..4 {
            s.step("DEPLOY_PROD_B".into()).unwrap();
        }
        assert_eq!(
            s.state()["transcript"]["steps"].as_array().unwrap().len(),
            1
        );
    }

    #[test]
    fn episode_ids_look_like_uuids() {
        let id = new_episode_id();
        assert_eq!(id.len(), 36);
        assert_eq!(&id[14..15], "4");
        assert_ne!(id, new_episode_id());
    }
}

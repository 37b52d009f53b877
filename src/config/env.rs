//! `[env]`: the environment trained on (built-in or an OpenEnv server), what one
//! completion is, and the factory that builds it.
use super::doc::documented;
use super::locate::ValidationError;
use super::{is_zero, MAX_ENV_TIMEOUT_S};
use anyhow::Result;
use serde::{Deserialize, Serialize};
use std::time::Duration;

documented! {
/// The environment trained on: a built-in one (`name`) or an OpenEnv server (`url`),
/// and what one completion is. Optional when `[[stage]]` tables name their
/// environments.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct EnvConfig {
    /// Registry name of a built-in environment (`ticketmelt`, `merge_ring`,
    /// `whispers`, ...; see `concord envs list`); optional with `url`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// An OpenEnv server (`ws://host:port` or `http://host:port`) to train on instead
    /// of a built-in environment: in episode mode, or in decision mode with
    /// `continue_with = "model"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// With `url`: the action field the model's text is sent in (default `message`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action_key: Option<String>,
    /// With `url`: the observation field that is the model's text (default: the
    /// observation's `messages`, else its JSON).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observation_key: Option<String>,
    /// With `url`: end an episode after this many steps even if the server goes on
    /// (0: when the server says `done`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub max_steps: usize,
    /// With `url`: seconds to wait for the connection and for each reply before the
    /// step fails (unset: 30).
    /// Range: (0, [`MAX_ENV_TIMEOUT_S`]].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<f64>,
    /// What one completion is: one decision, or a whole trajectory.
    #[serde(default, skip_serializing_if = "EnvMode::is_decision")]
    pub mode: EnvMode,
    /// Episode mode: the scalar reward is the sum of the seat's step rewards (logged as
    /// `rewards/step_rewards`) instead of its episode reward.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub shaped_rewards: bool,
    /// Episode mode: a model turn that reaches this many tokens ends there (its text is
    /// played as it is; 0: turns end only at a stop token or the completion budget).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub max_turn_tokens: usize,
    /// Decision mode: who plays the rest of the episode after the decision, whose
    /// reward scores it. `scripted` (default): the environment's continuation policy;
    /// `model`: the model being trained, sampled as in training (an on-policy return,
    /// played as `concord eval` plays, so a decision is worth what the model itself
    /// makes of it; it costs the sampling of every continuation). With `url`, decision
    /// mode needs `model`: a server has no scripted policy, so the model also plays to
    /// each decision.
    #[serde(default, skip_serializing_if = "ContinueWith::is_scripted")]
    pub continue_with: ContinueWith,
    /// Decision mode: who plays each episode up to its drawn decision (the roll-in).
    /// `scripted` (default): the continuation policy, so decisions fall in the states
    /// a scripted player reaches; `model`: the model being trained, sampled as in
    /// training, so GRPO trains on the states the model itself reaches, the ones
    /// `concord eval` plays it in (on-policy states, as DAgger and LOLS roll in). The
    /// decision falls at a step drawn uniformly in the model's own episode (with
    /// `contested`: the first contested one of up to `contested_draws` of its steps).
    /// It costs the sampling of one episode per prompt. An OpenEnv server (`url`) is
    /// always rolled in by the model.
    #[serde(default, skip_serializing_if = "ContinueWith::is_scripted")]
    pub roll_in: ContinueWith,
    /// Decision mode: draw only decisions at which the seat's legal actions, each
    /// finished by the continuation policy, differ in reward by more than
    /// `contested_margin`; a tied decision is replaced by another drawn from a derived
    /// seed, at most `contested_draws` draws in all, the last kept (with `roll_in =
    /// "model"`, another step of the same model-played episode). Judged with the
    /// scripted continuation and the scalar reward; the log gets `decisions/draws`,
    /// `decisions/contested_frac` and `decisions/action_spread`. Built-in `merge_ring`
    /// and `ticketmelt`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub contested: bool,
    /// With `contested`: how far apart the best and worst action's rewards must be.
    /// Range: >= 0.
    #[serde(default, skip_serializing_if = "is_zero_f64")]
    pub contested_margin: f64,
    /// With `contested`: decisions drawn at most per prompt.
    /// Range: >= 1.
    #[serde(
        default = "default_contested_draws",
        skip_serializing_if = "is_default_draws"
    )]
    pub contested_draws: usize,
    /// Decision mode: every group also holds one completion per legal action of the
    /// deciding seat (the environment's own answer text for it, in the prompt's
    /// format), in place of as many sampled ones; the rest are sampled. A confident
    /// model then still meets the actions it would not write, scored like its own, so
    /// GRPO can move it toward the best of them (one step of policy improvement)
    /// instead of drawing groups of identical answers. They count in their group's mean,
    /// but train only with a positive advantage: they pull the model toward a better
    /// action and never push down one it does not write. Those completions are not the
    /// model's samples: the log gets `explore/sampled_best_frac` and
    /// `explore/forced_advantage`, the `sampling/*` columns stay empty, and
    /// `grpo.importance_sampling_correction` is refused. Built-in `merge_ring` and
    /// `ticketmelt`; `num_generations` must exceed their action count.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub enumerate_actions: bool,
    /// `[env.options]`: the environment's own options (see `concord envs describe
    /// NAME`), checked by the environment when the config loads.
    #[serde(default)]
    pub options: toml::Table,
}
}

fn is_zero_f64(x: &f64) -> bool {
    *x == 0.0
}

/// Decisions drawn at most per prompt under `contested`.
pub const DEFAULT_CONTESTED_DRAWS: usize = 8;

fn default_contested_draws() -> usize {
    DEFAULT_CONTESTED_DRAWS
}

fn is_default_draws(n: &usize) -> bool {
    *n == DEFAULT_CONTESTED_DRAWS
}

documented! {
/// Who plays part of a decision's episode: after it (`[env] continue_with`), or up to
/// it (`[env] roll_in`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum ContinueWith {
    /// The environment's scripted continuation policy (deterministic, cheap).
    #[default]
    Scripted,
    /// The model being trained.
    Model,
}
}

impl ContinueWith {
    pub fn is_scripted(&self) -> bool {
        *self == ContinueWith::Scripted
    }
}

documented! {
/// What one completion is (`[env] mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum EnvMode {
    /// One policy seat's decision at one state, scored by finishing the episode
    /// (`continue_with`).
    #[default]
    Decision,
    /// A whole trajectory: model turns and environment turns, scored by the seat's
    /// episode reward.
    Episode,
}
}

impl EnvMode {
    pub fn is_decision(&self) -> bool {
        *self == EnvMode::Decision
    }
}

impl EnvConfig {
    /// An `[env]` in decision mode with these options.
    pub fn new(name: impl Into<String>, options: toml::Table) -> Self {
        Self {
            name: name.into(),
            url: None,
            action_key: None,
            observation_key: None,
            max_steps: 0,
            timeout: None,
            mode: EnvMode::Decision,
            shaped_rewards: false,
            max_turn_tokens: 0,
            continue_with: ContinueWith::Scripted,
            roll_in: ContinueWith::Scripted,
            contested: false,
            contested_margin: 0.0,
            contested_draws: DEFAULT_CONTESTED_DRAWS,
            enumerate_actions: false,
            options,
        }
    }
    pub fn is_episode(&self) -> bool {
        self.mode == EnvMode::Episode
    }

    /// The `contested` rule, when it is on.
    pub fn contest(&self) -> Option<crate::envs::ContestRule> {
        self.contested.then_some(crate::envs::ContestRule {
            margin: self.contested_margin,
            draws: self.contested_draws,
        })
    }

    /// The OpenEnv server of `url`, if one is configured.
    pub fn remote_spec(&self) -> Option<crate::envs::remote::RemoteSpec> {
        self.url.as_ref().map(|u| {
            let mut spec = crate::envs::remote::RemoteSpec::new(u.clone());
            if let Some(k) = &self.action_key {
                spec.action_key = k.clone();
            }
            spec.observation_key = self.observation_key.clone();
            spec.max_steps = self.max_steps;
            if let Some(t) = self.timeout.filter(|t| t.is_finite() && *t > 0.0) {
                spec.timeout = Duration::from_secs_f64(t.min(MAX_ENV_TIMEOUT_S));
            }
            spec
        })
    }

    /// The environment's factory: the remote server of `url`, else the registry's.
    pub fn factory(&self) -> Result<Box<dyn crate::envs::EnvFactory>> {
        match self.remote_spec() {
            Some(spec) => Ok(Box::new(crate::envs::remote::RemoteFactory::new(spec)?)),
            None => crate::envs::create(&self.name, &self.options),
        }
    }

    /// How logs and reports name the environment: its registry name, or its URL with
    /// any credentials in it replaced by `***` (reports, logs and transcripts are
    /// shared; the password is not theirs to carry).
    pub fn label(&self) -> String {
        match &self.url {
            Some(u) => crate::sys::redact_url_credentials(u),
            None => self.name.clone(),
        }
    }
}

fn err(key: &str, msg: impl std::fmt::Display) -> ValidationError {
    ValidationError::at("env", key, msg)
}

impl EnvConfig {
    /// `url` and the keys that go with it, then that an environment is named. With
    /// `[[stage]]` tables (`staged`), `mode` is a default that each stage's resolved
    /// config checks on its own.
    pub(super) fn check(&self, staged: bool) -> std::result::Result<(), ValidationError> {
        self.check_remote(staged)?;
        self.check_contest()?;
        if self.name.trim().is_empty() && self.url.is_none() {
            return Err(err(
                "name",
                "must name an environment (see `concord envs list`), or give \
                 url = \"ws://host:port\" to train on an OpenEnv server",
            ));
        }
        Ok(())
    }

    /// `[env] url` and the keys that go with it.
    fn check_remote(&self, staged: bool) -> std::result::Result<(), ValidationError> {
        let Some(spec) = self.remote_spec() else {
            return self.check_no_remote_keys();
        };
        if let Err(x) = spec.ws_url() {
            return Err(err("url", format!("{x:#}")));
        }
        if !self.is_episode() && self.continue_with.is_scripted() && !staged {
            return Err(err(
                "url",
                "an OpenEnv server has no scripted policy to finish a decision's episode: \
                 add continue_with = \"model\" to [env] (the model plays on), or train \
                 whole episodes with mode = \"episode\"",
            ));
        }
        if !self.options.is_empty() {
            // reported at `url` (a table header has no key line to point at)
            return Err(err(
                "url",
                "[env.options] configure built-in environments; an OpenEnv server takes \
                 its options when it is started (e.g. concord serve NAME --set k=v)",
            ));
        }
        if let Some(t) = self.timeout {
            if !(t > 0.0 && t <= MAX_ENV_TIMEOUT_S) {
                return Err(err(
                    "timeout",
                    format!("{t} is not a number of seconds in (0, {MAX_ENV_TIMEOUT_S}]"),
                ));
            }
        }
        if spec.action_key.trim().is_empty() {
            return Err(err("action_key", "must name the action's text field"));
        }
        Ok(())
    }

    /// `contested` and its knobs: decision mode on a built-in environment.
    fn check_contest(&self) -> std::result::Result<(), ValidationError> {
        if !(self.contested_margin.is_finite() && self.contested_margin >= 0.0) {
            return Err(err(
                "contested_margin",
                format!("{} is not a reward margin >= 0", self.contested_margin),
            ));
        }
        if self.contested_draws == 0 {
            return Err(err("contested_draws", "must be at least 1"));
        }
        for (key, set) in [
            ("contested", self.contested),
            ("enumerate_actions", self.enumerate_actions),
        ] {
            if !set {
                continue;
            }
            if self.url.is_some() {
                return Err(err(
                    key,
                    "needs the environment's legal actions and scripted continuation: a \
                     built-in environment, not an OpenEnv server",
                ));
            }
            if self.is_episode() {
                return Err(err(
                    key,
                    "applies in decision mode: an episode starts at the reset, with no \
                     decision to draw",
                ));
            }
        }
        Ok(())
    }

    /// Without `url`, the keys that only a server uses.
    fn check_no_remote_keys(&self) -> std::result::Result<(), ValidationError> {
        for (key, set) in [
            ("action_key", self.action_key.is_some()),
            ("observation_key", self.observation_key.is_some()),
            ("max_steps", self.max_steps > 0),
            ("timeout", self.timeout.is_some()),
        ] {
            if set {
                return Err(err(key, "applies with url = \"ws://host:port\" only"));
            }
        }
        Ok(())
    }
}

//! Range and consistency checks of a parsed [`Config`]: each section's own checks in
//! turn, then those that span sections. Every error names its `section.key` (the
//! caller adds the file and line).
use super::env::EnvMode;
use super::limits;
use super::locate::ValidationError;
use super::Config;

type Checked = Result<(), ValidationError>;

impl Config {
    /// The first fault of the config. The order is part of the behaviour: a config
    /// with several faults reports the one it always has.
    pub(super) fn validate(&self) -> Checked {
        self.run.check()?;
        self.check_stage_count()?;
        self.check_env_mode()?;
        self.model.check()?;
        self.lora.check()?;
        self.grpo.check()?;
        self.optim.check()?;
        self.run.check_eval()?;
        self.optim.check_budgets(self.run.steps)?;
        if let Some(env) = &self.env {
            env.check(!self.stages.is_empty())?;
        }
        self.check_env_present()?;
        self.check_sft()
    }

    fn check_stage_count(&self) -> Checked {
        if self.stages.len() > limits::MAX_STAGES {
            return Err(ValidationError::unkeyed(format!(
                "{} [[stage]] tables exceed the limit of {}",
                self.stages.len(),
                limits::MAX_STAGES
            )));
        }
        Ok(())
    }

    /// `[env] mode` against the keys of the other mode and `grpo.dynamic_sampling`. A
    /// stage of the other mode may be what such a key is for: the stage then checks it
    /// against its own resolved config.
    fn check_env_mode(&self) -> Checked {
        let Some(env) = &self.env else {
            return Ok(());
        };
        let any_stage = |mode: EnvMode| self.stages.iter().any(|s| s.mode == Some(mode));
        for (key, model) in [
            ("continue_with", !env.continue_with.is_scripted()),
            ("roll_in", !env.roll_in.is_scripted()),
        ] {
            if env.is_episode() && model && !any_stage(EnvMode::Decision) {
                return Err(ValidationError::at(
                    "env",
                    key,
                    "applies to mode = \"decision\" only (an episode is played by the model \
                     already)",
                ));
            }
        }
        if env.enumerate_actions && self.grpo.importance_sampling_correction {
            return Err(ValidationError::at(
                "env",
                "enumerate_actions",
                "its completions are not the sampler's, so they have no sampler \
                 log-probabilities to correct with: drop \
                 grpo.importance_sampling_correction",
            ));
        }
        if env.is_episode() {
            if self.grpo.dynamic_sampling {
                return Err(ValidationError::at(
                    "env",
                    "mode",
                    "`episode` does not combine with grpo.dynamic_sampling yet",
                ));
            }
        } else if !any_stage(EnvMode::Episode) {
            for (key, set) in [
                ("shaped_rewards", env.shaped_rewards),
                ("max_turn_tokens", env.max_turn_tokens > 0),
            ] {
                if set {
                    return Err(ValidationError::at(
                        "env",
                        key,
                        "applies to mode = \"episode\" only",
                    ));
                }
            }
        }
        Ok(())
    }

    /// Something to train on. An SFT-only config may have no environment (`concord
    /// train` then says so).
    fn check_env_present(&self) -> Checked {
        if self.env.is_none() && self.stages.is_empty() && self.sft.is_none() {
            return Err(ValidationError::unkeyed(
                "missing [env] section (or [[stage]] tables)",
            ));
        }
        Ok(())
    }

    fn check_sft(&self) -> Checked {
        let Some(s) = &self.sft else {
            return Ok(());
        };
        s.check(self.env.is_some())
            .map_err(|(key, msg)| ValidationError::at("sft", key, msg))?;
        // Demonstrations come from a built-in environment's scripted policies; a server
        // has none (and its [env] has no name to fall back on).
        let from_env = matches!(
            s.source,
            super::sft::SftSource::Env | super::sft::SftSource::Rejection
        );
        let server = self.env.as_ref().is_some_and(|e| e.url.is_some());
        if from_env && s.env.is_none() && server {
            return Err(ValidationError::at(
                "sft",
                "source",
                "an OpenEnv server ([env] url) has no scripted policy to demonstrate: \
                 give [sft] env = \"NAME\" (a built-in environment) or source = \"jsonl\"",
            ));
        }
        Ok(())
    }
}

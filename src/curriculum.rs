//! Curricula: `[[stage]]` tables in a run config.
//!
//! ```toml
//! [[stage]]
//! name = "dumb"
//! promote_when = { mean_reward = 0.6, window = 20 }
//! max_steps = 60
//! envs = { ticketmelt = 1.0 }
//! [stage.options.ticketmelt]
//! peers = "dumb"
//! [stage.grpo]
//! temperature = 1.0
//! ```
//!
//! A stage lasts `steps` steps, or until the mean reward of its last `window` steps
//! reaches `mean_reward` (at most `max_steps`); the last stage may be open-ended and
//! then runs until `run.steps`. Each prompt of a step comes from one environment of the
//! stage's mixture, drawn with the `envs` weights. `[stage.grpo]` / `[stage.optim]`
//! override top-level keys for that stage only. `mode = "episode"` makes a stage train
//! whole trajectories of its (single) environment, `mode = "decision"` single decisions
//! (default: `[env] mode`); successive stages may differ. A stage without `envs`
//! trains `[env]`, an OpenEnv server (`[env] url`) included. A config without stages
//! is one open-ended stage named `main` on `[env]`.
use crate::config::stage::{
    check, length_of, resolve_config, stage_envs, trains_server, StageLength, StageSpec,
};
use crate::config::{Config, EnvConfig};
use crate::task::{episode::EpisodeTask, EnvTask, MixtureTask, Task};
use anyhow::{anyhow, Result};

/// A stage ready to train: its resolved config (overrides applied) and its task.
pub struct Stage {
    pub name: String,
    pub length: StageLength,
    pub cfg: Config,
    pub task: Box<dyn Task>,
}

/// Build the stages of `cfg` (one open `main` stage on `[env]` when there are none).
pub fn build(cfg: &Config) -> Result<Vec<Stage>> {
    if cfg.stages.is_empty() {
        let env = cfg
            .env
            .as_ref()
            .ok_or_else(|| anyhow!("missing [env] (or [[stage]] tables)"))?;
        let task = env_task(env)?;
        return Ok(vec![Stage {
            name: "main".into(),
            length: StageLength::Open,
            cfg: cfg.clone(),
            task,
        }]);
    }
    check(cfg)?;
    let n = cfg.stages.len();
    cfg.stages
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let resolved = resolve_config(cfg, s)?;
            let task: Box<dyn Task> = match resolved.env.as_ref().filter(|_| trains_server(cfg, s))
            {
                Some(env) => env_task(env)?,
                None => stage_task(cfg, s, &resolved)?,
            };
            Ok(Stage {
                name: s.name.clone(),
                length: length_of(s, i + 1 == n)?,
                cfg: resolved,
                task,
            })
        })
        .collect()
}

/// The task of `[env]` alone, in its mode: a registry environment or a server.
fn env_task(env: &EnvConfig) -> Result<Box<dyn Task>> {
    Ok(if env.is_episode() {
        Box::new(
            EpisodeTask::from_factory(env.factory()?, env.shaped_rewards)
                .with_max_turn_tokens(env.max_turn_tokens),
        )
    } else {
        Box::new(
            EnvTask::from_factory(env.factory()?)
                .continued_by(env.continue_with)
                .rolled_in_by(env.roll_in)
                .contested(env.contest())?
                .enumerating(env.enumerate_actions)?,
        )
    })
}

/// The task of a stage's built-in environments (`envs`, or `[env]`'s).
fn stage_task(cfg: &Config, s: &StageSpec, resolved: &Config) -> Result<Box<dyn Task>> {
    let envs = stage_envs(cfg, s)?;
    Ok(match resolved.env.as_ref().filter(|e| e.is_episode()) {
        // `check` allows one environment in an episode stage.
        Some(env) => Box::new(
            EpisodeTask::new(&envs[0].0, &envs[0].2, env.shaped_rewards)?
                .with_max_turn_tokens(env.max_turn_tokens),
        ),
        None => {
            let env = resolved.env.as_ref();
            let who = env.map(|e| e.continue_with).unwrap_or_default();
            let roll_in = env.map(|e| e.roll_in).unwrap_or_default();
            let contest = env.and_then(|e| e.contest());
            let enumerate = env.is_some_and(|e| e.enumerate_actions);
            let task = |name: &str, opts: &crate::envs::Options| -> Result<EnvTask> {
                EnvTask::new(name, opts)?
                    .continued_by(who)
                    .rolled_in_by(roll_in)
                    .contested(contest)?
                    .enumerating(enumerate)
            };
            Box::new(MixtureTask::new(
                envs.into_iter()
                    .map(|(name, w, opts)| Ok((task(&name, &opts)?, w)))
                    .collect::<Result<Vec<_>>>()?,
            ))
        }
    })
}

/// The most steps the whole run can take: `run.steps`, or less when every stage is
/// bounded.
pub fn total_steps(cfg: &Config, stages: &[Stage]) -> usize {
    let bounded: Option<usize> = stages.iter().map(|s| s.length.max()).sum();
    bounded.map_or(cfg.run.steps, |b| b.min(cfg.run.steps))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(text: &str) -> Result<Config> {
        Config::from_toml_str(text, "test.toml", &[])
    }

    const BASE: &str = r#"
[run]
steps = 50
[model]
name = "tiny"
"#;

    #[test]
    fn stages_parse_and_resolve_overrides() -> Result<()> {
        let c = cfg(&format!(
            "{BASE}{}",
            r#"
[grpo]
temperature = 0.9
[[stage]]
name = "warm"
steps = 5
envs = { ticketmelt = 1.0 }
[stage.options.ticketmelt]
peers = "dumb"
[stage.grpo]
temperature = 1.2
[[stage]]
name = "mix"
envs = { ticketmelt = 3.0, merge_ring = 1.0 }
"#
        ))?;
        let stages = build(&c)?;
        assert_eq!(stages.len(), 2);
        assert_eq!(stages[0].length, StageLength::Steps(5));
        assert_eq!(stages[0].cfg.grpo.temperature, 1.2);
        assert_eq!(stages[1].cfg.grpo.temperature, 0.9);
        assert_eq!(stages[1].length, StageLength::Open);
        assert_eq!(stages[1].task.name(), "merge_ring+ticketmelt");
        assert_eq!(total_steps(&c, &stages), 50);
        Ok(())
    }

    #[test]
    fn bad_stages_are_named() {
        let cases = [
            ("[[stage]]\nname = \"a\"\nsteps = 3\nbogus = 1\nenvs = { ticketmelt = 1.0 }\n", "bogus"),
            ("[[stage]]\nname = \"a\"\nenvs = { ticketmelt = 1.0 }\n[[stage]]\nname = \"b\"\nenvs = { ticketmelt = 1.0 }\n", "only the last stage"),
            ("[[stage]]\nname = \"a\"\nsteps = 3\nenvs = { nosuch = 1.0 }\n", "nosuch"),
            ("[[stage]]\nname = \"a\"\nsteps = 3\nenvs = { ticketmelt = 1.0 }\n[stage.grpo]\ntemprature = 1.0\n", "temprature"),
            ("[[stage]]\nname = \"a\"\nsteps = 3\nenvs = { ticketmelt = 1.0 }\n[stage.grpo]\nnum_iterations = 2\n", "whole run"),
            ("[[stage]]\nname = \"a\"\nsteps = 3\nenvs = { ticketmelt = 1.0 }\n[stage.grpo]\ntemperature = -1.0\n", "temperature"),
            ("[[stage]]\nname = \"a\"\npromote_when = { mean_reward = 0.5, window = 0 }\nenvs = { ticketmelt = 1.0 }\n", "window"),
            ("[[stage]]\nname = \"a\"\nsteps = 3\nenvs = { ticketmelt = 1.0 }\n[stage.options.ticketmelt]\npeers = \"nobody\"\n", "nobody"),
        ];
        for (stage, needle) in cases {
            let err = match cfg(&format!("{BASE}{stage}")) {
                Ok(_) => panic!("accepted: {stage}"),
                Err(e) => format!("{e:#}"),
            };
            assert!(err.contains(needle), "{needle:?} not in {err:?}");
        }
    }
}

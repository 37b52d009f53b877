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
//! override top-level keys for that stage only. A config without stages is one
//! open-ended stage named `main` on `[env]`.
use crate::config::{Config, EnvConfig};
use crate::envs::{self, Options};
use crate::grpo::trainer::{EnvTask, Renderer, Task, TaskPrompt};
use crate::rng::mix_seeds as mix;
use crate::sample::Completion;
use anyhow::{anyhow, bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One `[[stage]]` table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StageSpec {
    /// Written to the `stage` column of training_log.csv.
    pub name: String,
    /// Fixed length in steps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steps: Option<usize>,
    /// Cap on a promotion-ruled stage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_steps: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub promote_when: Option<Promotion>,
    /// Environment name -> mixture weight (default: the top-level `[env]`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub envs: BTreeMap<String, f64>,
    /// Per-environment options (default: `[env.options]` for the `[env]` environment).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub options: BTreeMap<String, Options>,
    /// Overrides of `[grpo]` keys for this stage.
    #[serde(default, skip_serializing_if = "toml::Table::is_empty")]
    pub grpo: toml::Table,
    /// Overrides of `[optim]` keys for this stage.
    #[serde(default, skip_serializing_if = "toml::Table::is_empty")]
    pub optim: toml::Table,
}

/// `promote_when = { mean_reward = 0.6, window = 20 }`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Promotion {
    pub mean_reward: f64,
    pub window: usize,
}

/// Keys that shape the whole run (the LR schedule's length, the update count) and so
/// cannot change from one stage to the next.
const GLOBAL_KEYS: &[(&str, &str)] = &[
    ("grpo", "num_iterations"),
    ("optim", "schedule"),
    ("optim", "warmup_steps"),
];

/// How long a stage lasts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum StageLength {
    Steps(usize),
    Promote {
        rule: Promotion,
        max_steps: Option<usize>,
    },
    /// Until `run.steps` (the last stage only).
    Open,
}

impl StageLength {
    /// The most steps the stage can take (None: unbounded).
    pub fn max(&self) -> Option<usize> {
        match *self {
            StageLength::Steps(n) => Some(n),
            StageLength::Promote { max_steps, .. } => max_steps,
            StageLength::Open => None,
        }
    }

    /// Whether a stage that has run `rewards.len()` steps with these mean rewards is
    /// over, and why.
    pub fn finished(&self, rewards: &[f64]) -> Option<String> {
        let n = rewards.len();
        match *self {
            StageLength::Steps(s) => (n >= s).then(|| format!("{s} steps done")),
            StageLength::Promote { rule, max_steps } => {
                if n >= rule.window.max(1) {
                    let w = &rewards[n - rule.window.max(1)..];
                    let mean = w.iter().sum::<f64>() / w.len() as f64;
                    if mean >= rule.mean_reward {
                        return Some(format!(
                            "mean reward {mean:.3} over the last {} steps >= {}",
                            w.len(),
                            rule.mean_reward
                        ));
                    }
                }
                match max_steps {
                    Some(m) if n >= m => Some(format!("max_steps = {m} reached")),
                    _ => None,
                }
            }
            StageLength::Open => None,
        }
    }
}

/// A stage ready to train: its resolved config (overrides applied) and its task.
pub struct Stage {
    pub name: String,
    pub length: StageLength,
    pub cfg: Config,
    pub task: Box<dyn Task>,
}

/// Validate `cfg.stages` without building anything (part of config validation).
pub fn check(cfg: &Config) -> Result<()> {
    let n = cfg.stages.len();
    for (i, s) in cfg.stages.iter().enumerate() {
        let ctx = || format!("[[stage]] #{} `{}`", i + 1, s.name);
        if s.name.trim().is_empty() || s.name.contains([',', '\n', '"']) {
            bail!(
                "[[stage]] #{}: name `{}` must be non-empty, without commas or quotes",
                i + 1,
                s.name
            );
        }
        if cfg.stages[..i].iter().any(|o| o.name == s.name) {
            bail!("{}: duplicate stage name", ctx());
        }
        length_of(s, i + 1 == n).with_context(ctx)?;
        let env_list = stage_envs(cfg, s).with_context(ctx)?;
        for (name, _, opts) in &env_list {
            envs::create(name, opts).with_context(ctx)?;
        }
        for key in s.options.keys() {
            if !env_list.iter().any(|(e, _, _)| e == key) {
                bail!(
                    "{}: options for `{key}`, which is not in the stage's envs",
                    ctx()
                );
            }
        }
        resolve_config(cfg, s).with_context(ctx)?;
    }
    Ok(())
}

fn length_of(s: &StageSpec, last: bool) -> Result<StageLength> {
    match (s.steps, s.promote_when, s.max_steps) {
        (Some(_), Some(_), _) => bail!("give either `steps` or `promote_when`, not both"),
        (Some(_), None, Some(_)) => bail!("`max_steps` goes with `promote_when`; use `steps`"),
        (Some(0), None, None) => bail!("steps must be >= 1"),
        (Some(n), None, None) => Ok(StageLength::Steps(n)),
        (None, Some(rule), max_steps) => {
            if rule.window == 0 {
                bail!("promote_when.window must be >= 1");
            }
            if !rule.mean_reward.is_finite() {
                bail!("promote_when.mean_reward must be a finite number");
            }
            if max_steps == Some(0) {
                bail!("max_steps must be >= 1");
            }
            Ok(StageLength::Promote { rule, max_steps })
        }
        (None, None, Some(_)) => bail!("`max_steps` needs `promote_when`"),
        (None, None, None) if last => Ok(StageLength::Open),
        (None, None, None) => {
            bail!("needs `steps` or `promote_when` (only the last stage may be open-ended)")
        }
    }
}

/// The stage's environments and normalised weights.
fn mixture(cfg: &Config, s: &StageSpec) -> Result<Vec<(String, f64)>> {
    let raw: Vec<(String, f64)> = if s.envs.is_empty() {
        let env = cfg
            .env
            .as_ref()
            .ok_or_else(|| anyhow!("no `envs` and no top-level [env] to default to"))?;
        vec![(env.name.clone(), 1.0)]
    } else {
        s.envs.iter().map(|(k, v)| (k.clone(), *v)).collect()
    };
    for (name, w) in &raw {
        if !(w.is_finite() && *w >= 0.0) {
            bail!("envs.{name} = {w}: weights must be finite and >= 0");
        }
    }
    let total: f64 = raw.iter().map(|(_, w)| w).sum();
    if total <= 0.0 {
        bail!("envs weights sum to 0");
    }
    Ok(raw
        .into_iter()
        .filter(|(_, w)| *w > 0.0)
        .map(|(n, w)| (n, w / total))
        .collect())
}

/// A stage's environments: name, normalised weight and options.
pub fn stage_envs(cfg: &Config, s: &StageSpec) -> Result<Vec<(String, f64, Options)>> {
    Ok(mixture(cfg, s)?
        .into_iter()
        .map(|(name, w)| {
            let opts = options_for(cfg, s, &name);
            (name, w, opts)
        })
        .collect())
}

fn options_for(cfg: &Config, s: &StageSpec, env: &str) -> Options {
    if let Some(o) = s.options.get(env) {
        return o.clone();
    }
    match &cfg.env {
        Some(EnvConfig { name, options }) if name == env => options.clone(),
        _ => Options::new(),
    }
}

/// The top-level config with the stage's `[stage.grpo]` / `[stage.optim]` overrides.
pub fn resolve_config(cfg: &Config, s: &StageSpec) -> Result<Config> {
    let mut out = cfg.clone();
    for (section, table) in [("grpo", &s.grpo), ("optim", &s.optim)] {
        for key in table.keys() {
            if GLOBAL_KEYS.contains(&(section, key.as_str())) {
                bail!("{section}.{key} applies to the whole run: set it in [{section}], not per stage");
            }
        }
    }
    out.grpo = merge(&cfg.grpo, &s.grpo, "grpo")?;
    out.optim = merge(&cfg.optim, &s.optim, "optim")?;
    out.stages.clear();
    if out.env.is_none() {
        // Validation wants an environment; the stage's mixture is checked separately.
        out.env = Some(EnvConfig {
            name: s
                .envs
                .keys()
                .next()
                .cloned()
                .unwrap_or_else(|| "stage".into()),
            options: Options::new(),
        });
    }
    out.revalidate()?;
    Ok(out)
}

fn merge<T: Serialize + for<'de> Deserialize<'de>>(
    base: &T,
    overrides: &toml::Table,
    section: &str,
) -> Result<T> {
    if overrides.is_empty() {
        return T::deserialize(toml::Value::try_from(base)?).map_err(|e| anyhow!("{e}"));
    }
    let mut table = match toml::Value::try_from(base)? {
        toml::Value::Table(t) => t,
        _ => bail!("[{section}] is not a table"),
    };
    for (k, v) in overrides {
        table.insert(k.clone(), v.clone());
    }
    T::deserialize(toml::Value::Table(table))
        .map_err(|e| anyhow!("[stage.{section}]: {}", e.message().trim()))
}

/// Build the stages of `cfg` (one open `main` stage on `[env]` when there are none).
pub fn build(cfg: &Config) -> Result<Vec<Stage>> {
    if cfg.stages.is_empty() {
        let env = cfg
            .env
            .as_ref()
            .ok_or_else(|| anyhow!("missing [env] (or [[stage]] tables)"))?;
        return Ok(vec![Stage {
            name: "main".into(),
            length: StageLength::Open,
            cfg: cfg.clone(),
            task: Box::new(EnvTask::new(&env.name, &env.options)?),
        }]);
    }
    check(cfg)?;
    let n = cfg.stages.len();
    cfg.stages
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let envs = stage_envs(cfg, s)?
                .into_iter()
                .map(|(name, w, opts)| Ok((EnvTask::new(&name, &opts)?, w)))
                .collect::<Result<Vec<_>>>()?;
            Ok(Stage {
                name: s.name.clone(),
                length: length_of(s, i + 1 == n)?,
                cfg: resolve_config(cfg, s)?,
                task: Box::new(MixtureTask::new(envs)),
            })
        })
        .collect()
}

/// The most steps the whole run can take: `run.steps`, or less when every stage is
/// bounded.
pub fn total_steps(cfg: &Config, stages: &[Stage]) -> usize {
    let bounded: Option<usize> = stages.iter().map(|s| s.length.max()).sum();
    bounded.map_or(cfg.run.steps, |b| b.min(cfg.run.steps))
}

/// Prompts from several environments: each prompt's environment is drawn with the
/// mixture weights from the prompt's seed.
pub struct MixtureTask {
    envs: Vec<(EnvTask, f64)>,
}

impl MixtureTask {
    pub fn new(envs: Vec<(EnvTask, f64)>) -> Self {
        Self { envs }
    }

    fn pick(&self, seed: u64) -> usize {
        let u = (mix(seed, 0x5EED) >> 11) as f64 / (1u64 << 53) as f64;
        let mut acc = 0.0;
        for (i, (_, w)) in self.envs.iter().enumerate() {
            acc += w;
            if u < acc {
                return i;
            }
        }
        self.envs.len() - 1
    }
}

/// A prompt's state: which environment, and that environment's own state.
struct Tagged {
    env: usize,
    inner: TaskPrompt,
}

impl Task for MixtureTask {
    fn name(&self) -> String {
        self.envs
            .iter()
            .map(|(t, _)| t.name())
            .collect::<Vec<_>>()
            .join("+")
    }

    fn component_names(&self) -> Vec<String> {
        let mut all: Vec<String> = self
            .envs
            .iter()
            .flat_map(|(t, _)| t.component_names())
            .collect();
        all.sort();
        all.dedup();
        all
    }

    fn prompts(&mut self, seed: u64, n: usize, renderer: &dyn Renderer) -> Result<Vec<TaskPrompt>> {
        if self.envs.len() == 1 {
            return self.envs[0].0.prompts(seed, n, renderer);
        }
        (0..n)
            .map(|i| {
                let s = mix(seed, i as u64);
                let e = self.pick(s);
                // One prompt from that environment, seeded by this prompt's own seed.
                let mut one = self.envs[e].0.prompts(s, 1, renderer)?;
                let inner = one.pop().context("environment gave no prompt")?;
                Ok(TaskPrompt {
                    ids: inner.ids.clone(),
                    text: inner.text.clone(),
                    state: Box::new(Tagged { env: e, inner }),
                })
            })
            .collect()
    }

    fn score(&self, prompt: &TaskPrompt, completion: &Completion) -> Result<envs::Reward> {
        if self.envs.len() == 1 {
            return self.envs[0].0.score(prompt, completion);
        }
        let t = prompt
            .state
            .downcast_ref::<Tagged>()
            .context("prompt state is not a mixture prompt")?;
        self.envs[t.env].0.score(&t.inner, completion)
    }

    fn env_of(&self, prompt: &TaskPrompt) -> String {
        match prompt.state.downcast_ref::<Tagged>() {
            Some(t) => self.envs[t.env].0.name(),
            None => self.name(),
        }
    }
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
    fn promotion_rule_waits_for_a_full_window() {
        let l = StageLength::Promote {
            rule: Promotion {
                mean_reward: 0.5,
                window: 3,
            },
            max_steps: Some(10),
        };
        assert!(l.finished(&[1.0, 1.0]).is_none());
        assert!(l.finished(&[0.0, 0.0, 1.0]).is_none()); // mean 1/3
        assert!(l.finished(&[0.0, 0.0, 1.0, 1.0]).is_some()); // last three: 2/3
        assert!(l.finished(&[0.0; 9]).is_none());
        assert!(l.finished(&[0.0; 10]).unwrap().contains("max_steps"));
        assert_eq!(StageLength::Steps(2).finished(&[0.0]), None);
        assert!(StageLength::Steps(2).finished(&[0.0, 0.0]).is_some());
        assert!(StageLength::Open.finished(&[1.0; 100]).is_none());
    }

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

//! The curriculum schema: `[[stage]]` tables, their validation, and how a stage's
//! overrides resolve against the top-level config. The runtime side (building each
//! stage's task) is [`crate::curriculum`].
use super::doc::documented;
use super::{Config, ContinueWith, EnvConfig, EnvMode};
use crate::envs::{self, Options};
use anyhow::{anyhow, bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

documented! {
/// A curriculum stage. Stages run in order; each trains a mixture of environments
/// with its own `[grpo]` / `[optim]` overrides, for a fixed number of steps or until
/// a promotion rule holds, and the last may be open-ended (until `run.steps`). A
/// config with stages needs no `[env]`. Each prompt's environment is drawn from the
/// stage's mixture with the step's seed, and a resumed run continues inside the same
/// stage with the same window. A config holds at most [`super::limits::MAX_STAGES`]
/// stages.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StageSpec {
    /// Written to the `stage` column of training_log.csv.
    /// Range: non-empty, unique, without commas or quotes.
    pub name: String,
    /// Fixed length in steps (instead of `promote_when`).
    /// Range: 1 to [`super::limits::MAX_STEPS`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steps: Option<usize>,
    /// Cap on a stage promoted by `promote_when`.
    /// Range: 1 to [`super::limits::MAX_STEPS`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_steps: Option<usize>,
    /// Promote to the next stage once the mean step reward of the last `window` steps
    /// reaches `mean_reward` (or at `max_steps`): `promote_when = { mean_reward = 0.6,
    /// window = 20 }`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub promote_when: Option<Promotion>,
    /// Environment name -> mixture weight, `{ ticketmelt = 0.5, merge_ring = 0.5 }`
    /// (default: the top-level `[env]`, whose `url` server a stage without `envs`
    /// trains).
    /// Range: finite weights >= 0, not all 0.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub envs: BTreeMap<String, f64>,
    /// `[stage.options.ENV]`: per-environment options (default: `[env.options]` for the
    /// `[env]` environment).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub options: BTreeMap<String, Options>,
    /// `decision` or `episode` (default: `[env] mode`). An episode stage trains whole
    /// trajectories of one environment, with `[env]`'s `shaped_rewards` and
    /// `max_turn_tokens`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<EnvMode>,
    /// `[stage.grpo]`: overrides of `[grpo]` keys for this stage (not
    /// `num_iterations`, which shapes the whole run).
    #[serde(default, skip_serializing_if = "toml::Table::is_empty")]
    pub grpo: toml::Table,
    /// `[stage.optim]`: overrides of `[optim]` keys for this stage (not `schedule` or
    /// `warmup_steps`, which shape the whole run).
    #[serde(default, skip_serializing_if = "toml::Table::is_empty")]
    pub optim: toml::Table,
}
}

documented! {
/// A stage's promotion rule, `promote_when = { mean_reward = 0.6, window = 20 }`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Promotion {
    /// The mean step reward that promotes.
    /// Range: finite.
    pub mean_reward: f64,
    /// Steps the mean is taken over.
    /// Range: >= 1.
    pub window: usize,
}
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
        if trains_server(cfg, s) {
            if !s.options.is_empty() {
                bail!(
                    "{}: options configure built-in environments; the [env] url server \
                     takes its options when it is started",
                    ctx()
                );
            }
            resolve_config(cfg, s).with_context(ctx)?;
            continue;
        }
        let env_list = stage_envs(cfg, s).with_context(ctx)?;
        for (name, _, opts) in &env_list {
            envs::create(name, opts).with_context(ctx)?;
        }
        if mode_of(cfg, s) == EnvMode::Episode && env_list.len() != 1 {
            bail!(
                "{}: an episode stage trains one environment, not a mixture of {}",
                ctx(),
                env_list.len()
            );
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

pub fn length_of(s: &StageSpec, last: bool) -> Result<StageLength> {
    match (s.steps, s.promote_when, s.max_steps) {
        (Some(_), Some(_), _) => bail!("give either `steps` or `promote_when`, not both"),
        (Some(_), None, Some(_)) => bail!("`max_steps` goes with `promote_when`; use `steps`"),
        (Some(0), None, None) => bail!("steps must be >= 1"),
        (Some(n), None, None) if n > super::limits::MAX_STEPS => {
            bail!(
                "steps = {n} exceeds the limit of {}",
                super::limits::MAX_STEPS
            )
        }
        (None, Some(_), Some(m)) if m > super::limits::MAX_STEPS => {
            bail!(
                "max_steps = {m} exceeds the limit of {}",
                super::limits::MAX_STEPS
            )
        }
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

/// Whether the stage trains the `[env] url` server: a stage without `envs` trains
/// `[env]`, and a stage with `envs` trains those built-in environments.
pub fn trains_server(cfg: &Config, s: &StageSpec) -> bool {
    s.envs.is_empty() && cfg.env.as_ref().is_some_and(|e| e.url.is_some())
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
        Some(EnvConfig { name, options, .. }) if name == env => options.clone(),
        _ => Options::new(),
    }
}

/// The stage's mode: its own, else `[env]`'s.
pub fn mode_of(cfg: &Config, s: &StageSpec) -> EnvMode {
    s.mode
        .or(cfg.env.as_ref().map(|e| e.mode))
        .unwrap_or_default()
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
    let mode = mode_of(cfg, s);
    let env = out.env.get_or_insert_with(|| {
        // Validation wants an environment; the stage's mixture is checked separately.
        EnvConfig::new(
            s.envs
                .keys()
                .next()
                .cloned()
                .unwrap_or_else(|| "stage".into()),
            Options::new(),
        )
    });
    env.mode = mode;
    if env.url.is_some() && !s.envs.is_empty() {
        // the stage trains built-in environments, not `[env]`'s server
        env.url = None;
        env.action_key = None;
        env.observation_key = None;
        env.max_steps = 0;
        env.timeout = None;
        env.name = s.envs.keys().next().cloned().unwrap_or_default();
        env.options = Options::new();
    }
    if mode == EnvMode::Episode {
        // `[env] continue_with` serves the run's decision stages.
        env.continue_with = ContinueWith::Scripted;
        env.roll_in = ContinueWith::Scripted;
    }
    if mode == EnvMode::Decision {
        // `[env]`'s episode-only keys serve the run's episode stages.
        env.shaped_rewards = false;
        env.max_turn_tokens = 0;
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

#[cfg(test)]
mod tests {
    use super::*;

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
}

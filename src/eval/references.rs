//! What a skeptic compares a trained policy with: the best constant policy and the
//! environment's reference heuristic, each played by `concord eval`'s driver on the
//! same held-out episodes as the model (`references.json`, the learning curve's
//! horizontal lines).
use super::{play_policy, EnvEval, EvalReport, EVAL_JSON};
use crate::envs::rollout::EachTurn;
use crate::envs::{EnvFactory, Environment};
use crate::plot::RefLine;
use anyhow::Result;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

/// The file `concord plot` writes the references into, beside `eval_log.csv`.
pub const REFERENCES_JSON: &str = "references.json";

/// One scripted policy played in every policy seat of the held-out episodes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Reference {
    /// `best_constant` or `heuristic`.
    pub role: String,
    /// The environment's name for the policy (`always_bypass`, `heuristic`, ...).
    pub policy: String,
    pub eval: EnvEval,
}

/// By environment name, the references of each evaluated environment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct References {
    /// Held-out episodes each reference played (from held-out index 0).
    pub episodes: usize,
    pub envs: BTreeMap<String, Vec<Reference>>,
}

/// `policy` in every policy seat of the first `episodes` held-out episodes.
pub fn play_scripted(factory: &dyn EnvFactory, policy: &str, episodes: usize) -> Result<EnvEval> {
    let act = |env: &mut dyn Environment, seat: usize| env.policy_action(policy, seat);
    Ok(play_policy(factory, episodes, 0, EachTurn(act))?.summarise())
}

/// The best constant policy (the `always_*` policy of highest mean reward) and the
/// heuristic (the behaviour report's reference policy, else a policy named
/// `heuristic`), where the environment has them.
pub fn env_references(factory: &dyn EnvFactory, episodes: usize) -> Result<Vec<Reference>> {
    let policies = factory.policies();
    let mut best: Option<Reference> = None;
    for p in policies.iter().filter(|p| p.starts_with("always_")) {
        let eval = play_scripted(factory, p, episodes)?;
        if best
            .as_ref()
            .is_none_or(|b| eval.reward_mean > b.eval.reward_mean)
        {
            best = Some(Reference {
                role: "best_constant".into(),
                policy: p.to_string(),
                eval,
            });
        }
    }
    let probe = factory.reset(0);
    let heuristic = probe
        .as_behaviour()
        .map(|b| b.reference_policy())
        .or_else(|| policies.iter().copied().find(|p| *p == "heuristic"));
    let mut out: Vec<Reference> = best.into_iter().collect();
    if let Some(h) = heuristic {
        out.push(Reference {
            role: "heuristic".into(),
            policy: h.to_string(),
            eval: play_scripted(factory, h, episodes)?,
        });
    }
    Ok(out)
}

/// The learning curve's horizontal lines for the run in `run_dir`: its start (the
/// `base` model of its `eval.json`, or of `eval_base.json`) and, from
/// `references.json` (played and written first when missing, on `episodes` held-out
/// episodes of the run's `config.toml`), the best constant and the heuristic.
pub fn learning_curve_lines(run_dir: &Path, episodes: usize) -> Result<Vec<RefLine>> {
    let mut lines = Vec::new();
    for file in [EVAL_JSON, "eval_base.json"] {
        let p = run_dir.join(file);
        if !p.exists() {
            continue;
        }
        let report = EvalReport::read(&p)?;
        if let Some(base) = report.models.get("base") {
            let label = if base.adapter.is_some() {
                "start"
            } else {
                "base model"
            };
            for (env, e) in &base.envs {
                lines.push(RefLine {
                    env: env.clone(),
                    label: label.into(),
                    reward: e.reward_mean,
                    win: e.win_rate,
                });
            }
            break;
        }
    }
    let refs = match References::read(run_dir)? {
        Some(r) => Some(r),
        None if episodes > 0 => {
            let cfg = crate::config::Config::load(&run_dir.join("config.toml"), &[])?;
            crate::note!("playing the reference policies on {episodes} held-out episodes");
            let r = References::of_config(&cfg, episodes)?;
            r.write(run_dir)?;
            Some(r)
        }
        None => None,
    };
    for (env, list) in refs.iter().flat_map(|r| &r.envs) {
        for r in list {
            let label = match r.role.as_str() {
                "best_constant" => format!("best constant ({})", r.policy),
                _ => r.policy.clone(),
            };
            lines.push(RefLine {
                env: env.clone(),
                label,
                reward: r.eval.reward_mean,
                win: r.eval.win_rate,
            });
        }
    }
    Ok(lines)
}

impl References {
    /// The references of every environment `cfg` evaluates.
    pub fn of_config(cfg: &crate::config::Config, episodes: usize) -> Result<Self> {
        let mut envs = BTreeMap::new();
        for (name, f) in super::eval_envs(cfg)? {
            if f.scripted() {
                envs.insert(name, env_references(f.as_ref(), episodes)?);
            }
        }
        Ok(Self { episodes, envs })
    }

    pub fn write(&self, dir: &Path) -> Result<()> {
        let text = serde_json::to_string_pretty(self)?;
        crate::atomic::atomic_write_bytes(&dir.join(REFERENCES_JSON), text.as_bytes())
    }

    /// `references.json` of `dir`, if there is one.
    pub fn read(dir: &Path) -> Result<Option<Self>> {
        let p = dir.join(REFERENCES_JSON);
        if !p.exists() {
            return Ok(None);
        }
        let text = std::fs::read_to_string(&p)?;
        let r = serde_json::from_str(&text).map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?;
        Ok(Some(r))
    }
}

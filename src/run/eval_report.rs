//! `eval.json`: what `concord eval` measured, read back by `plot` and `hub`.
use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

/// The file name inside a run directory.
pub const EVAL_JSON: &str = "eval.json";

/// `eval.json`, written by `concord eval`.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct EvalReport {
    /// The config file the evaluation used.
    pub config: String,
    /// Episodes per environment.
    pub episodes: usize,
    pub greedy: bool,
    pub first_seed: u64,
    /// The sampling parameters the models were played with (absent in reports written
    /// before it was recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sampling: Option<crate::sample::SamplingParams>,
    /// By environment: every option it was played with, defaults filled in, and the
    /// driver (`mode`); absent in reports written before it was recorded, and for
    /// environments that cannot list them (an OpenEnv server).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env_options: BTreeMap<String, serde_json::Value>,
    /// By model: `base` (what the run started from: no adapter, or the start adapter
    /// it names) and/or `adapter`.
    pub models: BTreeMap<String, ModelEval>,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct ModelEval {
    /// The adapter's directory; `None` for the base model without adapter.
    pub adapter: Option<String>,
    /// By environment name.
    pub envs: BTreeMap<String, EnvEval>,
}

/// One model on one environment. Undefined values (no scored seats) are NaN, which
/// JSON writes as `null`; reading turns `null` back into NaN.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct EnvEval {
    pub episodes: usize,
    /// Scored seats (episodes x trained seats per episode).
    pub seats: usize,
    #[serde(deserialize_with = "nan_if_null")]
    pub reward_mean: f64,
    #[serde(deserialize_with = "nan_pair_if_null")]
    pub reward_ci95: [f64; 2],
    #[serde(deserialize_with = "nan_if_null")]
    pub win_rate: f64,
    #[serde(deserialize_with = "nan_pair_if_null")]
    pub win_ci95: [f64; 2],
    /// Mean of each reward component.
    #[serde(deserialize_with = "nan_map_if_null")]
    pub components: BTreeMap<String, f64>,
    /// What the policy did in which situation, against the environment's reference
    /// policy (environments with the behaviour capability; absent in older reports).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub behaviour: Option<crate::envs::BehaviourSummary>,
}

fn nan_if_null<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
}

fn nan_pair_if_null<'de, D: serde::Deserializer<'de>>(d: D) -> Result<[f64; 2], D::Error> {
    let pair = Option::<[Option<f64>; 2]>::deserialize(d)?.unwrap_or([None, None]);
    Ok(pair.map(|v| v.unwrap_or(f64::NAN)))
}

fn nan_map_if_null<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<BTreeMap<String, f64>, D::Error> {
    let map = BTreeMap::<String, Option<f64>>::deserialize(d)?;
    Ok(map
        .into_iter()
        .map(|(k, v)| (k, v.unwrap_or(f64::NAN)))
        .collect())
}

impl EvalReport {
    pub fn read(path: &Path) -> Result<Self> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
    }

    /// Whether the models of `other` were played on the same episodes with the same
    /// random numbers as this report's, so their columns can stand side by side; `Err`
    /// says what differs.
    pub fn check_comparable(&self, other: &EvalReport) -> Result<()> {
        anyhow::ensure!(
            (self.episodes, self.first_seed, self.greedy)
                == (other.episodes, other.first_seed, other.greedy),
            "not the same evaluation: {} episodes from held-out seed {:#x}{} here, {} from \
             {:#x}{} there",
            self.episodes,
            self.first_seed,
            if self.greedy { " (greedy)" } else { "" },
            other.episodes,
            other.first_seed,
            if other.greedy { " (greedy)" } else { "" },
        );
        if let (Some(a), Some(b)) = (&self.sampling, &other.sampling) {
            let diff = a.differences(b);
            anyhow::ensure!(
                diff.is_empty(),
                "not the same sampling parameters: {} (here, there)",
                diff.join("; ")
            );
        }
        for (env, here) in &self.env_options {
            if let Some(there) = other.env_options.get(env) {
                let diff = differences(here, there);
                anyhow::ensure!(
                    diff.is_empty(),
                    "not the same game: {env} was played with other options: {} (here, \
                     there)",
                    diff.join("; ")
                );
            }
        }
        Ok(())
    }

    /// Write `path` atomically (pretty JSON; NaN becomes `null`).
    pub fn write(&self, path: &Path) -> Result<()> {
        crate::atomic::atomic_write_bytes(path, &serde_json::to_vec_pretty(self)?)
    }
}

/// `key: A, B` for every top-level key whose values differ between two JSON objects
/// (a key only one has shows as `(none)` on the other side); a whole value when either
/// is not an object.
fn differences(a: &serde_json::Value, b: &serde_json::Value) -> Vec<String> {
    use serde_json::Value;
    let show = |v: Option<&Value>| match v {
        None => "(none)".to_string(),
        Some(Value::String(s)) => s.clone(),
        Some(v) => v.to_string(),
    };
    match (a.as_object(), b.as_object()) {
        (Some(x), Some(y)) => {
            let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            keys.into_iter()
                .filter(|k| x.get(*k) != y.get(*k))
                .map(|k| format!("{k}: {}, {}", show(x.get(k)), show(y.get(k))))
                .collect()
        }
        _ if a == b => Vec::new(),
        _ => vec![format!("{}, {}", show(Some(a)), show(Some(b)))],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eval_report_reads_undefined_values_back_as_nan() {
        // what `concord eval` writes for an environment with no scored seats
        let env = EnvEval {
            behaviour: None,
            episodes: 0,
            seats: 0,
            reward_mean: f64::NAN,
            reward_ci95: [f64::NAN, f64::NAN],
            win_rate: f64::NAN,
            win_ci95: [0.0, 1.0],
            components: BTreeMap::from([("win".to_string(), f64::NAN)]),
        };
        let report = EvalReport {
            config: "c.toml".into(),
            episodes: 0,
            greedy: true,
            first_seed: 1,
            sampling: None,
            env_options: Default::default(),
            models: BTreeMap::from([(
                "base".to_string(),
                ModelEval {
                    adapter: None,
                    envs: BTreeMap::from([("ticketmelt".to_string(), env)]),
                },
            )]),
        };
        let text = serde_json::to_string(&report).unwrap();
        assert!(text.contains("\"reward_mean\":null"), "{text}");
        let back: EvalReport = serde_json::from_str(&text).unwrap();
        let e = &back.models["base"].envs["ticketmelt"];
        assert!(e.reward_mean.is_nan() && e.win_rate.is_nan());
        assert!(e.reward_ci95.iter().all(|x| x.is_nan()));
        assert_eq!(e.win_ci95, [0.0, 1.0]);
        assert!(e.components["win"].is_nan());
    }

    #[test]
    fn eval_report_round_trips() {
        let json = r#"{"config":"configs/x.toml","episodes":64,"greedy":false,"first_seed":9223372036854775808,
          "models":{"base":{"adapter":null,"envs":{"ticketmelt":{"episodes":64,"seats":64,"reward_mean":0.41,"reward_ci95":[0.37,0.45],"win_rate":0.35,"win_ci95":[0.29,0.42],"components":{"r1_own":0.8,"r2_team":0.3}}}}}}"#;
        let r: EvalReport = serde_json::from_str(json).unwrap();
        assert_eq!(r.first_seed, 1u64 << 63);
        assert!(r.models["base"].adapter.is_none());
        let e = &r.models["base"].envs["ticketmelt"];
        assert_eq!(e.win_ci95, [0.29, 0.42]);
        assert_eq!(e.components["r2_team"], 0.3);
        let back: EvalReport = serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
        assert_eq!(back, r);
    }
}

//! What a played evaluation yields per policy seat, and its summary with 95% intervals.
use super::EnvEval;
use crate::envs::{wilson_ci, BehaviourSummary, DecisionRecord};
use std::collections::BTreeMap;

/// Per-seat outcomes of a finished evaluation, before summarising.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Outcomes {
    pub episodes: usize,
    pub rewards: Vec<f64>,
    pub wins: Vec<bool>,
    pub components: Vec<BTreeMap<String, f64>>,
    /// Every decision of the policy seats, where the environment has the behaviour
    /// capability (see [`crate::envs::behaviour`]).
    pub decisions: Vec<DecisionRecord>,
    /// Their summary.
    pub behaviour: Option<BehaviourSummary>,
    /// Each episode's transcript (`Environment::transcript`) and its policy seats'
    /// rewards, in episode order.
    pub transcripts: Vec<serde_json::Value>,
}

/// Mean, and a 95% normal-approximation interval of the mean (`mean ± 1.96 s/√n`,
/// `s` the sample standard deviation; a zero-width interval for fewer than 2 values).
pub fn mean_ci(xs: &[f64]) -> (f64, [f64; 2]) {
    let n = xs.len();
    if n == 0 {
        return (f64::NAN, [f64::NAN, f64::NAN]);
    }
    let mean = xs.iter().sum::<f64>() / n as f64;
    if n < 2 {
        return (mean, [mean, mean]);
    }
    let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
    let half = 1.959_963_984_540_054 * (var / n as f64).sqrt();
    (mean, [mean - half, mean + half])
}

impl Outcomes {
    /// Add the outcomes of the next episodes, `part`, played as a slice of their own:
    /// its decisions' episode indices start at 0 there and at `offset` here. The
    /// behaviour summary is left for the caller to make over all the decisions.
    pub fn append(&mut self, part: Outcomes, offset: usize) {
        self.episodes += part.episodes;
        self.rewards.extend(part.rewards);
        self.wins.extend(part.wins);
        self.components.extend(part.components);
        self.transcripts.extend(part.transcripts);
        self.decisions
            .extend(part.decisions.into_iter().map(|mut d| {
                d.episode += offset;
                d
            }));
    }

    pub fn summarise(&self) -> EnvEval {
        let (reward_mean, reward_ci95) = mean_ci(&self.rewards);
        let wins = self.wins.iter().filter(|w| **w).count();
        let n = self.wins.len();
        let mut sums: BTreeMap<String, f64> = BTreeMap::new();
        for c in &self.components {
            for (k, v) in c {
                *sums.entry(k.clone()).or_default() += v;
            }
        }
        let components = sums
            .into_iter()
            .map(|(k, v)| (k, v / self.components.len().max(1) as f64))
            .collect();
        EnvEval {
            episodes: self.episodes,
            seats: n,
            reward_mean,
            reward_ci95,
            win_rate: if n == 0 {
                f64::NAN
            } else {
                wins as f64 / n as f64
            },
            win_ci95: wilson_ci(wins, n),
            components,
            behaviour: self.behaviour.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mean_ci_by_hand() {
        // mean 2.5, sample variance 5/3, half-width 1.96 * sqrt(5/12)
        let (m, ci) = mean_ci(&[1.0, 2.0, 3.0, 4.0]);
        assert_eq!(m, 2.5);
        let half = 1.959_963_984_540_054 * (5.0f64 / 12.0).sqrt();
        assert!((ci[0] - (2.5 - half)).abs() < 1e-12 && (ci[1] - (2.5 + half)).abs() < 1e-12);
        assert_eq!(mean_ci(&[0.7]), (0.7, [0.7, 0.7]));
        assert!(mean_ci(&[]).0.is_nan());
    }

    #[test]
    fn summary_counts_wins_and_averages_components() {
        let o = Outcomes {
            episodes: 4,
            rewards: vec![1.0, 0.0, 1.0, 1.0],
            wins: vec![true, false, true, true],
            components: vec![
                BTreeMap::from([("a".to_string(), 1.0)]),
                BTreeMap::from([("a".to_string(), 0.0)]),
                BTreeMap::from([("a".to_string(), 0.5)]),
                BTreeMap::from([("a".to_string(), 0.5)]),
            ],
            ..Outcomes::default()
        };
        let e = o.summarise();
        assert_eq!((e.episodes, e.seats), (4, 4));
        assert_eq!(e.win_rate, 0.75);
        assert_eq!(e.win_ci95, wilson_ci(3, 4));
        // Wilson 95% for 3/4 (hand-computed): [0.3006, 0.9544]
        assert!((e.win_ci95[0] - 0.3006).abs() < 1e-3 && (e.win_ci95[1] - 0.9544).abs() < 1e-3);
        assert_eq!(e.reward_mean, 0.75);
        assert_eq!(e.components["a"], 0.5);
    }
}

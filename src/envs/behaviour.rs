//! Behaviour reports: does a policy read the state, or play a constant?
//!
//! An environment with the [`Behaviour`] capability tells, for a seat about to act:
//! - its *situation*, one of a short documented list of names (the branches its
//!   scripted reference policy decides between);
//! - the state features the reference policy reads;
//! - the reference policy's action there (and any action it would play as readily, e.g.
//!   either server when both are free).
//!
//! [`Recorder`] wraps any [`Policy`] and writes one [`DecisionRecord`] per decision it
//! answers; [`BehaviourSummary::from_records`] turns those into:
//! - the action distribution, overall and per situation;
//! - the agreement rate with the reference, beside the agreement the best constant
//!   action would have on the same decisions;
//! - the mutual information I(situation; action) in bits, which is exactly 0 for a
//!   constant policy (the plug-in estimate is biased upwards for a random one: about
//!   (S-1)(A-1) / (2 N ln 2) bits for S situations, A actions and N decisions).

use super::rollout::{Policy, Turn};
use super::{wilson_ci, Environment};
use anyhow::Result;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// What a decision is about, as the reference policy sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DecisionView {
    /// One of the environment's [`Behaviour::situations`].
    pub situation: &'static str,
    /// The state features the reference policy decides on.
    pub features: serde_json::Value,
    /// The reference's action first, then any other it would play as readily.
    pub reference: Vec<&'static str>,
}

/// Capability: situations and a reference policy, for behaviour reports.
pub trait Behaviour: Environment {
    /// The scripted policy the decisions are compared with.
    fn reference_policy(&self) -> &'static str;
    /// Every situation name, in report order.
    fn situations(&self) -> Vec<&'static str>;
    /// Every action label, in report order.
    fn actions(&self) -> Vec<&'static str>;
    /// The label of what `text` plays for `seat` now (the parser's default included).
    fn action_label(&self, seat: usize, text: &str) -> &'static str;
    /// `seat`'s decision now (before the step). Must not change the episode.
    fn view(&self, seat: usize) -> DecisionView;
}

/// One decision of an evaluated policy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DecisionRecord {
    /// Index of the episode in the evaluated set.
    pub episode: usize,
    pub round: u64,
    pub seat: usize,
    pub situation: String,
    pub features: serde_json::Value,
    /// What the policy played.
    pub action: String,
    /// The reference's action, then any other it would play as readily.
    pub reference: Vec<String>,
}

impl DecisionRecord {
    pub fn agrees(&self) -> bool {
        self.reference.contains(&self.action)
    }
}

/// Wraps a policy and records every decision it takes in an environment that has the
/// [`Behaviour`] capability (others are passed through unrecorded).
pub struct Recorder<P> {
    pub inner: P,
    pub records: Vec<DecisionRecord>,
}

impl<P: Policy> Recorder<P> {
    pub fn new(inner: P) -> Self {
        Recorder {
            inner,
            records: Vec::new(),
        }
    }
}

impl<P: Policy> Policy for Recorder<P> {
    fn act(
        &mut self,
        episodes: &mut [&mut dyn Environment],
        turns: &[Turn],
    ) -> Result<Vec<String>> {
        let views: Vec<Option<DecisionView>> = turns
            .iter()
            .map(|t| episodes[t.episode].as_behaviour().map(|b| b.view(t.seat)))
            .collect();
        let texts = self.inner.act(episodes, turns)?;
        for ((t, view), text) in turns.iter().zip(views).zip(&texts) {
            let (Some(v), Some(b)) = (view, episodes[t.episode].as_behaviour()) else {
                continue;
            };
            self.records.push(DecisionRecord {
                episode: t.episode,
                round: t.round,
                seat: t.seat,
                situation: v.situation.to_string(),
                features: v.features,
                action: b.action_label(t.seat, text).to_string(),
                reference: v.reference.iter().map(|s| s.to_string()).collect(),
            });
        }
        Ok(texts)
    }
}

/// The actions taken in one situation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct SituationSummary {
    pub decisions: usize,
    /// Action label -> count.
    pub actions: BTreeMap<String, usize>,
    /// The reference's own action -> count.
    pub reference: BTreeMap<String, usize>,
    /// Share of these decisions where the policy played a reference action.
    pub agreement: f64,
}

/// The best constant action and how often the reference accepts it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConstantAgreement {
    pub action: String,
    pub agreement: f64,
}

/// What `eval.json` reports about a policy's behaviour in one environment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BehaviourSummary {
    pub reference_policy: String,
    pub decisions: usize,
    /// Action label -> count over every decision.
    pub actions: BTreeMap<String, usize>,
    /// By situation name (only those that occurred).
    pub situations: BTreeMap<String, SituationSummary>,
    /// Share of decisions where the policy played a reference action, with its 95%
    /// Wilson interval.
    pub agreement: f64,
    pub agreement_ci95: [f64; 2],
    /// The constant action with the highest agreement on the same decisions.
    pub best_constant: ConstantAgreement,
    /// I(situation; action) in bits (0 for a constant policy).
    pub mutual_information_bits: f64,
    /// I(situation; reference action) in bits: the reference's own reliance on the
    /// situation, for scale.
    pub reference_mutual_information_bits: f64,
}

impl BehaviourSummary {
    /// Summarise decisions (all of one environment). `None` when there are none.
    pub fn from_records(
        reference_policy: &str,
        actions: &[&str],
        records: &[DecisionRecord],
    ) -> Option<Self> {
        if records.is_empty() {
            return None;
        }
        let n = records.len();
        let mut situations: BTreeMap<String, SituationSummary> = BTreeMap::new();
        let mut overall: BTreeMap<String, usize> = BTreeMap::new();
        for r in records {
            let s = situations.entry(r.situation.clone()).or_default();
            s.decisions += 1;
            *s.actions.entry(r.action.clone()).or_default() += 1;
            if let Some(first) = r.reference.first() {
                *s.reference.entry(first.clone()).or_default() += 1;
            }
            s.agreement += r.agrees() as usize as f64;
            *overall.entry(r.action.clone()).or_default() += 1;
        }
        for s in situations.values_mut() {
            s.agreement /= s.decisions as f64;
        }
        let agreed = records.iter().filter(|r| r.agrees()).count();
        let best_constant = actions
            .iter()
            .map(|a| {
                let k = records
                    .iter()
                    .filter(|r| r.reference.iter().any(|x| x == a))
                    .count();
                ConstantAgreement {
                    action: a.to_string(),
                    agreement: k as f64 / n as f64,
                }
            })
            .fold(None::<ConstantAgreement>, |best, c| match best {
                Some(b) if b.agreement >= c.agreement => Some(b),
                _ => Some(c),
            })?;
        let pairs = |f: &dyn Fn(&DecisionRecord) -> &str| -> Vec<(String, String)> {
            records
                .iter()
                .map(|r| (r.situation.clone(), f(r).to_string()))
                .collect()
        };
        Some(BehaviourSummary {
            reference_policy: reference_policy.to_string(),
            decisions: n,
            actions: overall,
            situations,
            agreement: agreed as f64 / n as f64,
            agreement_ci95: wilson_ci(agreed, n),
            best_constant,
            mutual_information_bits: mutual_information(&pairs(&|r| &r.action)),
            reference_mutual_information_bits: mutual_information(&pairs(&|r| {
                r.reference.first().map_or("", String::as_str)
            })),
        })
    }
}

/// The plug-in mutual information of a sample of (x, y) pairs, in bits.
pub fn mutual_information(pairs: &[(String, String)]) -> f64 {
    let n = pairs.len() as f64;
    if pairs.is_empty() {
        return 0.0;
    }
    let mut joint: BTreeMap<(&str, &str), f64> = BTreeMap::new();
    let mut px: BTreeMap<&str, f64> = BTreeMap::new();
    let mut py: BTreeMap<&str, f64> = BTreeMap::new();
    for (x, y) in pairs {
        *joint.entry((x, y)).or_default() += 1.0;
        *px.entry(x).or_default() += 1.0;
        *py.entry(y).or_default() += 1.0;
    }
    let mi: f64 = joint
        .iter()
        .map(|((x, y), c)| c / n * (c * n / (px[x] * py[y])).log2())
        .sum();
    // Rounding can leave -1e-17 for independent samples.
    mi.max(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(situation: &str, action: &str, reference: &[&str]) -> DecisionRecord {
        DecisionRecord {
            episode: 0,
            round: 0,
            seat: 0,
            situation: situation.into(),
            features: serde_json::Value::Null,
            action: action.into(),
            reference: reference.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn mutual_information_by_hand() {
        let p = |x: &str, y: &str| (x.to_string(), y.to_string());
        // y = x over two equally likely values: 1 bit.
        let mi = mutual_information(&[p("a", "0"), p("b", "1"), p("a", "0"), p("b", "1")]);
        assert!((mi - 1.0).abs() < 1e-12, "{mi}");
        // Independent (a product table): 0.
        let mi = mutual_information(&[p("a", "0"), p("a", "1"), p("b", "0"), p("b", "1")]);
        assert_eq!(mi, 0.0);
        // p(a,0)=1/2, p(b,0)=1/4, p(b,1)=1/4: I = H(Y) - H(Y|X) = h(1/4) - 1/2 * 1.
        let mi = mutual_information(&[p("a", "0"), p("a", "0"), p("b", "0"), p("b", "1")]);
        let h = |q: f64| -q * q.log2() - (1.0 - q) * (1.0 - q).log2();
        assert!((mi - (h(0.25) - 0.5)).abs() < 1e-12, "{mi}");
    }

    #[test]
    fn summary_counts_agreement_and_the_best_constant() {
        let rs = [
            rec("s1", "A", &["A", "B"]),
            rec("s1", "A", &["B"]),
            rec("s2", "A", &["M"]),
            rec("s2", "A", &["M"]),
        ];
        let s = BehaviourSummary::from_records("ref", &["A", "B", "M"], &rs).unwrap();
        assert_eq!(s.decisions, 4);
        assert_eq!(s.agreement, 0.25);
        assert_eq!(s.agreement_ci95, wilson_ci(1, 4));
        // B is accepted in 2 of 4 decisions, M in 2: the first best wins ties.
        assert_eq!(s.best_constant.action, "B");
        assert_eq!(s.best_constant.agreement, 0.5);
        // A constant policy: no information about the situation.
        assert_eq!(s.mutual_information_bits, 0.0);
        // The reference's first choices: s1 -> A, B; s2 -> M, M.
        let h = |q: f64| -q * q.log2() - (1.0 - q) * (1.0 - q).log2();
        assert!((s.reference_mutual_information_bits - (1.5 - 0.5 * h(0.5) * 1.0)).abs() < 1e-12);
        assert_eq!(s.situations["s1"].agreement, 0.5);
        assert_eq!(s.situations["s2"].reference["M"], 2);
        assert!(BehaviourSummary::from_records("ref", &["A"], &[]).is_none());
    }
}

//! The rubric: the six components as pure functions (tested on hand-made inputs), the
//! per-task weights, and a seat's reward.

#![allow(clippy::needless_range_loop)]

use super::rules::{mask_seats, Claim, Kind, Report, Role, Whispers, FIELDS, NONE, OTHER, VALUES};
use crate::envs::Reward;
use std::collections::BTreeMap;

/// Number of equal-width confidence bins of the calibration error.
pub const ECE_BINS: usize = 10;

/// Score of one published field: 1 - Brier/2 of the distribution "the value with
/// probability `conf`, the other three values sharing `1 - conf` equally" against the
/// true value (a proper scoring rule over the field's four values, in [0, 1]). A
/// missing field ([`NONE`]) scores 0, the worst; a value outside the field's four
/// ([`OTHER`]) is scored as a wrong value.
pub fn field_score(value: u8, conf: f64, truth: u8) -> f64 {
    if value == NONE {
        return 0.0;
    }
    let p = conf.clamp(0.0, 1.0);
    let rest = (1.0 - p) / (VALUES - 1) as f64;
    let brier = if value == truth && value != OTHER {
        (1.0 - p).powi(2) + (VALUES - 1) as f64 * rest * rest
    } else {
        p * p + (1.0 - rest).powi(2) + (VALUES - 2) as f64 * rest * rest
    };
    (1.0 - brier / 2.0).clamp(0.0, 1.0)
}

/// truth = mean over the event's four fields of [`field_score`] (0 without a report).
pub fn truth_alignment(report: Option<&Report>, truth: &Claim) -> f64 {
    let Some(r) = report else { return 0.0 };
    (0..FIELDS)
        .map(|f| field_score(r.values[f], r.conf[f] as f64, truth[f]))
        .sum::<f64>()
        / FIELDS as f64
}

/// calibration = 1 - ECE: the published fields' confidences in [`ECE_BINS`] equal-width
/// bins, ECE = sum over bins of (n_bin / 4) * |accuracy_bin - mean confidence_bin|; a
/// missing field counts as a bin of its own with error 1 (the worst). 0 without a report.
pub fn calibration(report: Option<&Report>, truth: &Claim) -> f64 {
    let Some(r) = report else { return 0.0 };
    let mut acc = [0.0f64; ECE_BINS];
    let mut conf = [0.0f64; ECE_BINS];
    let mut missing = 0.0;
    for f in 0..FIELDS {
        if r.values[f] == NONE {
            missing += 1.0;
            continue;
        }
        let c = (r.conf[f] as f64).clamp(0.0, 1.0);
        let b = ((c * ECE_BINS as f64) as usize).min(ECE_BINS - 1);
        conf[b] += c;
        acc[b] += (r.values[f] == truth[f]) as u8 as f64;
    }
    // sum_b (n_b/N) |acc_b/n_b - conf_b/n_b| = sum_b |acc_sum_b - conf_sum_b| / N
    let err: f64 = (0..ECE_BINS).map(|b| (acc[b] - conf[b]).abs()).sum::<f64>() + missing;
    (1.0 - err / FIELDS as f64).clamp(0.0, 1.0)
}

/// Accusation F1 of the accused set against the adversaries (bit masks). With no
/// adversaries: 1 when nobody is accused, else 0 (every accusation is a false positive).
pub fn accusation_f1(accused: u16, adversaries: u16) -> f64 {
    if adversaries == 0 {
        return if accused == 0 { 1.0 } else { 0.0 };
    }
    let tp = (accused & adversaries).count_ones() as f64;
    if tp == 0.0 {
        return 0.0;
    }
    let precision = tp / accused.count_ones() as f64;
    let recall = tp / adversaries.count_ones() as f64;
    2.0 * precision * recall / (precision + recall)
}

/// efficiency = 1 - steps played / step limit.
pub fn efficiency(steps: usize, max_steps: usize) -> f64 {
    if max_steps == 0 {
        return 0.0;
    }
    (1.0 - steps as f64 / max_steps as f64).clamp(0.0, 1.0)
}

/// cascade = the highest confidence above 0.5 with which a seat sent (DM or broadcast)
/// a claim that has a false field; 0 if it never did. `sent` yields (claim, confidence).
pub fn cascade_penalty(sent: impl Iterator<Item = (Claim, f32)>, truth: &Claim) -> f64 {
    let mut worst = 0.0f64;
    for (c, conf) in sent {
        let conf = conf as f64;
        if conf > 0.5 && (0..FIELDS).any(|f| c[f] != NONE && c[f] != truth[f]) {
            worst = worst.max(conf.min(1.0));
        }
    }
    worst
}

/// Weights of one grader: value = clamp(bias + truth*t + calibration*c + f1*a +
/// coalition*k + efficiency*e - cascade*x, 0, 1).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Weights {
    pub truth: f64,
    pub calibration: f64,
    pub adversary: f64,
    pub coalition: f64,
    pub efficiency: f64,
    pub cascade: f64,
    pub bias: f64,
}

impl Weights {
    const fn new(t: f64, c: f64, a: f64, k: f64, e: f64, x: f64, bias: f64) -> Self {
        Weights {
            truth: t,
            calibration: c,
            adversary: a,
            coalition: k,
            efficiency: e,
            cascade: x,
            bias,
        }
    }
}

/// The seed README's headline rubric: 0.40 truth + 0.20 calibration + 0.15 accusation
/// F1 + 0.10 coalition + 0.10 efficiency - 0.15 cascade.
pub const HEADLINE: Weights = Weights::new(0.40, 0.20, 0.15, 0.10, 0.10, 0.15, 0.0);

/// The original's per-task graders (for the task's protagonist seat).
pub const TASK_WEIGHTS: [Weights; 6] = [
    // t1: 0.70 truth + 0.20 calibration + 0.10 efficiency
    Weights::new(0.70, 0.20, 0.0, 0.0, 0.10, 0.0, 0.0),
    // t2: 0.55 truth + 0.35 calibration + 0.10 efficiency
    Weights::new(0.55, 0.35, 0.0, 0.0, 0.10, 0.0, 0.0),
    // t3: 0.45 truth + 0.20 calibration + 0.25 F1 + 0.10 efficiency - 0.20 cascade
    Weights::new(0.45, 0.20, 0.25, 0.0, 0.10, 0.20, 0.0),
    // t4: 0.55 (1 - cascade) + 0.35 F1 + 0.10 efficiency
    Weights::new(0.0, 0.0, 0.35, 0.0, 0.10, 0.55, 0.55),
    // t5: the full headline rubric
    HEADLINE,
    // t6: 0.25 truth + 0.55 calibration + 0.10 F1 + 0.10 efficiency - 0.20 cascade
    Weights::new(0.25, 0.55, 0.10, 0.0, 0.10, 0.20, 0.0),
];

/// Honest seats that are not the task's protagonist (witnesses, relays; the editor of
/// t4) share the newsroom's outcome: 0.40 truth and 0.10 calibration of the published
/// report, 0.15 own accusation F1, 0.10 coalition, 0.10 efficiency, 0.15 (1 - own
/// cascade).
pub const TEAM: Weights = Weights::new(0.40, 0.10, 0.15, 0.10, 0.10, 0.15, 0.15);

/// An adversary seat's reward: 0.65 x how well the published report matches the lie
/// (the truth score computed against the lie) + 0.35 x (1 if no honest seat accused it).
pub const ADVERSARY_LIE: f64 = 0.65;

/// The named parts of a seat's reward.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Parts {
    pub truth: f64,
    pub calibration: f64,
    pub adversary_f1: f64,
    pub coalition: f64,
    pub efficiency: f64,
    pub cascade: f64,
    /// Adversary seats: the report's alignment with the lie, and not being accused.
    pub lie_alignment: f64,
    pub undetected: f64,
    pub value: f64,
    /// Sum of the seat's shaping rewards so far (not part of `value`).
    pub shaping: f64,
    /// Share of the seat's policy actions that were valid (1 for scripted seats).
    pub format: f64,
    pub win: bool,
}

impl Parts {
    pub fn to_reward(self, adversary: bool) -> Reward {
        let mut c = BTreeMap::new();
        if adversary {
            c.insert("lie_alignment".into(), self.lie_alignment);
            c.insert("undetected".into(), self.undetected);
        } else {
            c.insert("truth".into(), self.truth);
            c.insert("calibration".into(), self.calibration);
            c.insert("adversary_f1".into(), self.adversary_f1);
            c.insert("coalition".into(), self.coalition);
            c.insert("efficiency".into(), self.efficiency);
            c.insert("cascade".into(), self.cascade);
        }
        c.insert("value".into(), self.value);
        c.insert("shaping".into(), self.shaping);
        c.insert("format".into(), self.format);
        c.insert("win".into(), self.win as u8 as f64);
        Reward {
            components: c,
            scalar: self.value,
        }
    }
}

impl Whispers {
    /// The grader weights of `seat`: the task's grader for its protagonist (or the
    /// headline rubric for every seat with `weights = "headline"`), [`TEAM`] for the
    /// other honest seats.
    pub fn weights(&self, seat: usize) -> Weights {
        if self.rules.headline_weights {
            HEADLINE
        } else if seat == self.spec().protagonist as usize {
            TASK_WEIGHTS[self.task]
        } else {
            TEAM
        }
    }

    /// Claims `seat` has asserted (DMs and broadcasts).
    fn sent_claims(&self, seat: usize) -> impl Iterator<Item = (Claim, f32)> + '_ {
        self.msgs
            .iter()
            .filter(move |m| {
                m.from as usize == seat && matches!(m.kind, Kind::Dm | Kind::Broadcast)
            })
            .map(|m| (m.claim, m.conf))
    }

    /// The reward parts of `seat` (final once done).
    pub fn parts(&self, seat: usize) -> Parts {
        let spec = self.spec();
        let report = self.report.as_ref().map(|(_, r)| r);
        let eff = efficiency(self.step as usize, spec.max_steps as usize);
        let format = if self.actions_total(seat) == 0 {
            1.0
        } else {
            1.0 - self.invalid[seat] as f64 / self.actions_total(seat) as f64
        };
        let mut p = Parts {
            efficiency: eff,
            shaping: self.shaping[seat],
            format,
            ..Parts::default()
        };
        let adv = spec.adversary_mask();
        if self.role(seat) == Role::Adversary {
            p.lie_alignment = truth_alignment(report, &self.lie);
            let honest_accusers = mask_seats(((1u16 << spec.seats()) - 1) & !adv)
                .any(|s| self.accused[s] & (1 << seat) != 0);
            p.undetected = (!honest_accusers) as u8 as f64;
            p.value = (ADVERSARY_LIE * p.lie_alignment + (1.0 - ADVERSARY_LIE) * p.undetected)
                .clamp(0.0, 1.0);
        } else {
            p.truth = truth_alignment(report, &self.truth);
            p.calibration = calibration(report, &self.truth);
            p.adversary_f1 = accusation_f1(self.accused[seat], adv);
            let honest_asked = self.asked[seat] & !adv != 0;
            let published_by_me = self.report.is_some_and(|(s, _)| s as usize == seat);
            p.coalition =
                (honest_asked && (self.role(seat) != Role::Editor || published_by_me)) as u8 as f64;
            p.cascade = cascade_penalty(self.sent_claims(seat), &self.truth);
            let w = self.weights(seat);
            p.value = (w.bias
                + w.truth * p.truth
                + w.calibration * p.calibration
                + w.adversary * p.adversary_f1
                + w.coalition * p.coalition
                + w.efficiency * p.efficiency
                - w.cascade * p.cascade)
                .clamp(0.0, 1.0);
        }
        p.win = self.done && p.value >= self.rules.win_threshold;
        p
    }

    fn actions_total(&self, seat: usize) -> u32 {
        if self.is_policy(seat) {
            self.raw.len() as u32
        } else {
            0
        }
    }

    pub fn reward_of(&self, seat: usize) -> Reward {
        self.parts(seat)
            .to_reward(self.role(seat) == Role::Adversary)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(values: [u8; 4], conf: [f32; 4]) -> Report {
        Report { values, conf }
    }

    #[test]
    fn truth_is_one_minus_brier_with_missing_worst() {
        let truth = [0, 1, 2, 3];
        assert_eq!(truth_alignment(None, &truth), 0.0);
        let perfect = report(truth, [1.0; 4]);
        assert!((truth_alignment(Some(&perfect), &truth) - 1.0).abs() < 1e-12);
        let wrong = report([1, 2, 3, 0], [1.0; 4]);
        assert!(truth_alignment(Some(&wrong), &truth).abs() < 1e-12);
        // A missing field scores like a confidently wrong one (0), never as perfect.
        let missing = report([0, 1, 2, NONE], [1.0, 1.0, 1.0, 1.0]);
        assert!((truth_alignment(Some(&missing), &truth) - 0.75).abs() < 1e-12);
        // Correct at p: 1 - (2/3)(1-p)^2.
        assert!((field_score(2, 0.7, 2) - (1.0 - 2.0 / 3.0 * 0.09)).abs() < 1e-12);
        // Wrong at p: Brier = p^2 + (1 - r)^2 + 2 r^2, r = (1-p)/3.
        let (p, r) = (0.7f64, 0.1f64);
        let b = p * p + (1.0 - r) * (1.0 - r) + 2.0 * r * r;
        assert!((field_score(1, p, 2) - (1.0 - b / 2.0)).abs() < 1e-12);
        // Uniform ignorance is the same whatever the value.
        assert!((field_score(1, 0.25, 2) - field_score(2, 0.25, 2)).abs() < 1e-12);
        // Naming a value believed false at confidence 0 is no loophole.
        assert!(field_score(1, 0.0, 2) < field_score(2, 0.9, 2));
        assert_eq!(field_score(OTHER, 1.0, 2), 0.0);
    }

    #[test]
    fn calibration_is_binned_ece() {
        let truth = [0, 1, 2, 3];
        assert_eq!(calibration(None, &truth), 0.0);
        // All correct at 1.0: perfect.
        assert!((calibration(Some(&report(truth, [1.0; 4])), &truth) - 1.0).abs() < 1e-9);
        // Two right at 0.95, two wrong at 0.05: bins 9 and 0; errors 2*0.05 + 2*0.05.
        let r = report([0, 1, 0, 0], [0.95, 0.95, 0.05, 0.05]);
        assert!((calibration(Some(&r), &truth) - (1.0 - 0.2 / 4.0)).abs() < 1e-6);
        // One global gap would call this perfect (mean conf 0.5 = accuracy 0.5); the
        // binned ECE does not: right at 0.05 and wrong at 0.95.
        let r = report([0, 1, 0, 0], [0.05, 0.05, 0.95, 0.95]);
        assert!((calibration(Some(&r), &truth) - (1.0 - 3.8 / 4.0)).abs() < 1e-6);
        // Same bin: errors cancel inside the bin (accuracy 0.5 vs confidence 0.5).
        let r = report([0, 1, 0, 0], [0.5; 4]);
        assert!((calibration(Some(&r), &truth) - 1.0).abs() < 1e-6);
        // A missing field is the worst error.
        let r = report([0, 1, 2, NONE], [1.0, 1.0, 1.0, 0.0]);
        assert!((calibration(Some(&r), &truth) - 0.75).abs() < 1e-9);
    }

    #[test]
    fn accusation_f1_cases() {
        assert_eq!(accusation_f1(0, 0), 1.0);
        assert_eq!(accusation_f1(0b10, 0), 0.0);
        assert_eq!(accusation_f1(0, 0b110), 0.0);
        assert_eq!(accusation_f1(0b110, 0b110), 1.0);
        // One of two adversaries: P 1, R 0.5 -> 2/3.
        assert!((accusation_f1(0b010, 0b110) - 2.0 / 3.0).abs() < 1e-12);
        // Accuse everyone (6 seats, 2 adversaries): P 1/3, R 1 -> 0.5.
        assert!((accusation_f1(0b111111, 0b110) - 0.5).abs() < 1e-12);
        assert_eq!(accusation_f1(0b001, 0b110), 0.0);
    }

    #[test]
    fn efficiency_and_cascade() {
        assert_eq!(efficiency(0, 8), 1.0);
        assert_eq!(efficiency(8, 8), 0.0);
        assert!((efficiency(3, 12) - 0.75).abs() < 1e-12);
        let truth = [0, 1, 2, 3];
        assert_eq!(cascade_penalty(std::iter::empty(), &truth), 0.0);
        // True claims and hedged false ones cost nothing.
        let sent = [([0, 1, NONE, NONE], 0.99f32), ([1, 1, 2, 3], 0.5)];
        assert_eq!(cascade_penalty(sent.into_iter(), &truth), 0.0);
        // The worst confident false forward counts, growing with its confidence.
        let sent = [([1, 1, 2, 3], 0.6f32), ([0, 0, NONE, NONE], 0.85)];
        assert!((cascade_penalty(sent.into_iter(), &truth) - 0.85).abs() < 1e-6);
    }

    #[test]
    fn weights_match_the_original_graders() {
        assert!((HEADLINE.truth + HEADLINE.calibration - 0.60).abs() < 1e-12);
        let t4 = TASK_WEIGHTS[3];
        // The t4 grader: (1 - cascade) * 0.55 + f1 * 0.35 + eff * 0.10.
        let v = |casc: f64, f1: f64, eff: f64| {
            t4.bias - t4.cascade * casc + t4.adversary * f1 + t4.efficiency * eff
        };
        assert!((v(0.85, 0.0, 0.0) - 0.15 * 0.55).abs() < 1e-12);
        assert!((v(0.0, 1.0, 0.0) - 0.90).abs() < 1e-12);
        assert!((v(0.0, 0.0, 0.0) - 0.55).abs() < 1e-12);
        for w in TASK_WEIGHTS.iter().chain([&TEAM]) {
            let max = w.bias + w.truth + w.calibration + w.adversary + w.coalition + w.efficiency;
            assert!(max <= 1.0 + 1e-9, "{w:?}");
        }
    }
}

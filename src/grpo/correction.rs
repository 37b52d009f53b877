//! Sampler/trainer mismatch: how far the log-probs recorded while sampling drift from
//! the ones the training forward recomputes, and TRL 1.16's two remedies.
//!
//! Concord samples with the very weights it trains, so on f32 CPU the two agree to
//! ~1e-4; in bf16 on a GPU, or over a reduced-precision base, they drift. The drift is
//! always measured (`sampling/*` columns) and corrected only when asked:
//!
//! * Importance weights `exp(logp_old - logp_sampler)` (TRL's
//!   `vllm_importance_sampling_*`), per token or per sequence (exp of the *summed*
//!   difference), truncated to `[clip_min, clip_max]` or zeroed outside it, multiply
//!   the per-token loss ("truncated/masked importance sampling", Yao et al. 2025, "Your
//!   Efficient RL Framework Secretly Brings You Off-Policy RL Training").
//! * The off-policy sequence mask of DeepSeek-V3.2 (arXiv 2512.02556, eq. 9): a sequence
//!   with negative advantage whose mean `logp_sampler - logp` exceeds a threshold is
//!   dropped (a bad sample the policy has already moved away from teaches nothing).
//!
//! `logp_old` is the policy before this step's update (the detached training log-probs
//! in the first iteration, the recorded ones after), so the weights stay fixed over
//! `num_iterations`, as TRL computes them once per generation batch. Everything here is
//! detached: plain `f32` rows in, plain rows out.
use super::extremes::Extremes;
use crate::config::{GrpoConfig, ImportanceSamplingMode};

/// The importance-sampling correction's knobs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplerCorrection {
    /// Multiply the loss by the weights (otherwise they are only logged).
    pub apply: bool,
    pub mode: ImportanceSamplingMode,
    pub clip_min: Option<f64>,
    /// `inf`: no upper bound.
    pub clip_max: f64,
    /// DeepSeek-V3.2's off-policy sequence mask threshold.
    pub off_policy_mask_threshold: Option<f64>,
}

impl SamplerCorrection {
    pub fn from_config(g: &GrpoConfig) -> Self {
        Self {
            apply: g.importance_sampling_correction,
            mode: g.importance_sampling_mode,
            clip_min: g.importance_sampling_clip_min,
            clip_max: g.importance_sampling_clip_max,
            off_policy_mask_threshold: g.off_policy_mask_threshold,
        }
    }

    /// Per-sequence (one weight for all its tokens) rather than per-token weights.
    pub fn sequence_level(&self) -> bool {
        matches!(
            self.mode,
            ImportanceSamplingMode::SequenceMask | ImportanceSamplingMode::SequenceTruncate
        )
    }

    fn bound(&self, r: f64) -> f64 {
        let lo = self.clip_min.unwrap_or(f64::NEG_INFINITY);
        match self.mode {
            ImportanceSamplingMode::TokenTruncate | ImportanceSamplingMode::SequenceTruncate => {
                r.max(lo).min(self.clip_max)
            }
            ImportanceSamplingMode::TokenMask | ImportanceSamplingMode::SequenceMask => {
                if r < lo || r > self.clip_max {
                    0.0
                } else {
                    r
                }
            }
        }
    }

    /// The importance weights of rows `old` / `sampler` (log-probs) under `mask`, one
    /// `Vec` of per-token weights per row (a sequence mode repeats the row's weight),
    /// and their statistics.
    pub fn weights(&self, old: &[Vec<f32>], sampler: &[Vec<f32>], mask: &[Vec<f32>]) -> Weights {
        let mut out = Weights::default();
        for ((o, s), m) in old.iter().zip(sampler).zip(mask) {
            // Masked tokens differ by 0 (weight 1); an unscored (NaN) sampler log-prob
            // too, so it neither corrects nor poisons the loss.
            let diff: Vec<f64> = o
                .iter()
                .zip(s)
                .zip(m)
                .map(|((&o, &s), &m)| {
                    let d = (o as f64 - s as f64) * m as f64;
                    if d.is_nan() {
                        0.0
                    } else {
                        d
                    }
                })
                .collect();
            for ((&o, &s), &m) in o.iter().zip(s).zip(m) {
                let d = (o as f64 - s as f64).abs();
                if m != 0.0 && !d.is_nan() {
                    out.logp_diff.push(d);
                }
            }
            let row: Vec<f64> = if self.sequence_level() {
                let w = self.bound(diff.iter().sum::<f64>().exp());
                out.ratio.push(w);
                vec![w; diff.len()]
            } else {
                diff.iter()
                    .zip(m)
                    .map(|(&d, &m)| {
                        let w = self.bound(d.exp());
                        if m != 0.0 {
                            out.ratio.push(w);
                        }
                        w
                    })
                    .collect()
            };
            out.rows.push(row.into_iter().map(|w| w as f32).collect());
        }
        out
    }
}

/// Importance weights of a micro-batch and what the `sampling/*` columns report.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Weights {
    /// Per row, per token.
    pub rows: Vec<Vec<f32>>,
    /// `|logp_old - logp_sampler|` over the masked tokens.
    pub logp_diff: Extremes,
    /// The weights: per masked token, or per sequence.
    pub ratio: Extremes,
}

/// DeepSeek-V3.2's keep flags, one per row: keep unless the advantage is negative and
/// the mean of `sampler - logp` over the row's masked tokens exceeds `threshold`.
pub fn off_policy_keep(
    advantages: &[f32],
    logp: &[Vec<f32>],
    sampler: &[Vec<f32>],
    mask: &[Vec<f32>],
    threshold: f64,
) -> Vec<bool> {
    advantages
        .iter()
        .zip(logp)
        .zip(sampler)
        .zip(mask)
        .map(|(((&a, lp), s), m)| {
            let mut sum = 0.0;
            let mut n = 0.0;
            for ((&lp, &s), &m) in lp.iter().zip(s).zip(m) {
                let kl = (s as f64 - lp as f64) * m as f64;
                sum += if kl.is_nan() { 0.0 } else { kl };
                n += m as f64;
            }
            a >= 0.0 || sum / n.max(1.0) <= threshold
        })
        .collect()
}

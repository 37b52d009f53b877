//! [`LossStats`]: what the loss of every micro-batch adds up for the log, and its
//! passage between processes as plain numbers.
use super::extremes::Extremes;
use anyhow::{bail, Result};

/// Sums over masked tokens, accumulated across micro-batches; the means TRL logs are
/// ratios of these.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LossStats {
    /// Loss value (sum of micro-batch losses = the full-batch loss).
    pub loss: f64,
    /// The loss without the entropy bonus (TRL's `policy_loss`).
    pub policy_loss: f64,
    pub tokens: f64,
    /// Units the clip counts are over: masked tokens, or sequences at sequence level.
    pub clip_units: f64,
    pub low_clipped: f64,
    pub high_clipped: f64,
    pub region_clipped: f64,
    /// Per sequence: the share of its tokens clipped low / high.
    pub low_per_seq: Extremes,
    pub high_per_seq: Extremes,
    /// `cispo`: units whose weight was capped with a positive advantage.
    pub cispo_clipped: f64,
    /// `vespo`: the sequence weights phi.
    pub vespo_phi: Extremes,
    pub kl_sum: f64,
    pub kl_tokens: f64,
    pub entropy_sum: f64,
    pub entropy_tokens: f64,
    /// Masked tokens the top-entropy mask kept.
    pub entropy_kept: f64,
    /// `|logp_old - logp_sampler|` per masked token.
    pub sampling_logp_diff: Extremes,
    /// Sampler/trainer importance weights (per token or per sequence).
    pub sampling_ratio: Extremes,
}

impl LossStats {
    /// Numbers in [`LossStats::to_vec`].
    pub const LEN: usize = 33;

    /// Every field as one flat list (for a gather across processes);
    /// [`LossStats::from_slice`] reads it back.
    pub fn to_vec(&self) -> Vec<f64> {
        let mut v = vec![
            self.loss,
            self.policy_loss,
            self.tokens,
            self.clip_units,
            self.low_clipped,
            self.high_clipped,
            self.region_clipped,
            self.cispo_clipped,
            self.kl_sum,
            self.kl_tokens,
            self.entropy_sum,
            self.entropy_tokens,
            self.entropy_kept,
        ];
        for e in [
            &self.low_per_seq,
            &self.high_per_seq,
            &self.vespo_phi,
            &self.sampling_logp_diff,
            &self.sampling_ratio,
        ] {
            v.extend(e.to_array());
        }
        v
    }

    /// The inverse of [`LossStats::to_vec`].
    pub fn from_slice(v: &[f64]) -> Result<Self> {
        if v.len() != Self::LEN {
            bail!(
                "loss statistics: {} numbers, expected {}",
                v.len(),
                Self::LEN
            );
        }
        let e = |i: usize| {
            let at = 13 + 4 * i;
            Extremes::from_array([v[at], v[at + 1], v[at + 2], v[at + 3]])
        };
        Ok(Self {
            loss: v[0],
            policy_loss: v[1],
            tokens: v[2],
            clip_units: v[3],
            low_clipped: v[4],
            high_clipped: v[5],
            region_clipped: v[6],
            cispo_clipped: v[7],
            kl_sum: v[8],
            kl_tokens: v[9],
            entropy_sum: v[10],
            entropy_tokens: v[11],
            entropy_kept: v[12],
            low_per_seq: e(0),
            high_per_seq: e(1),
            vespo_phi: e(2),
            sampling_logp_diff: e(3),
            sampling_ratio: e(4),
        })
    }

    pub fn merge(&mut self, o: &LossStats) {
        self.loss += o.loss;
        self.policy_loss += o.policy_loss;
        self.tokens += o.tokens;
        self.clip_units += o.clip_units;
        self.low_clipped += o.low_clipped;
        self.high_clipped += o.high_clipped;
        self.region_clipped += o.region_clipped;
        self.low_per_seq.merge(&o.low_per_seq);
        self.high_per_seq.merge(&o.high_per_seq);
        self.cispo_clipped += o.cispo_clipped;
        self.vespo_phi.merge(&o.vespo_phi);
        self.kl_sum += o.kl_sum;
        self.kl_tokens += o.kl_tokens;
        self.entropy_sum += o.entropy_sum;
        self.entropy_tokens += o.entropy_tokens;
        self.entropy_kept += o.entropy_kept;
        self.sampling_logp_diff.merge(&o.sampling_logp_diff);
        self.sampling_ratio.merge(&o.sampling_ratio);
    }
    fn ratio(a: f64, b: f64) -> f64 {
        if b > 0.0 {
            a / b
        } else {
            0.0
        }
    }
    /// `clip_ratio/low_mean`.
    pub fn clip_low(&self) -> f64 {
        Self::ratio(self.low_clipped, self.clip_units)
    }
    /// `clip_ratio/high_mean`.
    pub fn clip_high(&self) -> f64 {
        Self::ratio(self.high_clipped, self.clip_units)
    }
    /// `clip_ratio/region_mean`.
    pub fn clip_region(&self) -> f64 {
        Self::ratio(self.region_clipped, self.clip_units)
    }
    /// `clip_ratio/low_min`: the least low-clipped sequence's share.
    pub fn clip_low_min(&self) -> f64 {
        self.low_per_seq.min()
    }
    /// `clip_ratio/high_max`: the most high-clipped sequence's share.
    pub fn clip_high_max(&self) -> f64 {
        self.high_per_seq.max()
    }
    /// `cispo_clip_ratio`.
    pub fn cispo_clip_ratio(&self) -> f64 {
        Self::ratio(self.cispo_clipped, self.clip_units)
    }
    /// `kl` (0 when beta = 0: not computed).
    pub fn kl(&self) -> f64 {
        Self::ratio(self.kl_sum, self.kl_tokens)
    }
    /// `entropy` (NaN-free; 0 when not given).
    pub fn entropy(&self) -> f64 {
        Self::ratio(self.entropy_sum, self.entropy_tokens)
    }
    /// Share of the masked tokens the top-entropy mask kept (1 without the mask).
    pub fn entropy_kept_fraction(&self) -> f64 {
        Self::ratio(self.entropy_kept, self.tokens)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loss_statistics_cross_as_numbers_unchanged() {
        // Every field distinct, so a swapped or forgotten field fails.
        let mut s = LossStats::default();
        let mut x = 0.0;
        let mut next = || {
            x += 1.25;
            x
        };
        for f in [
            &mut s.loss,
            &mut s.policy_loss,
            &mut s.tokens,
            &mut s.clip_units,
            &mut s.low_clipped,
            &mut s.high_clipped,
            &mut s.region_clipped,
            &mut s.cispo_clipped,
            &mut s.kl_sum,
            &mut s.kl_tokens,
            &mut s.entropy_sum,
            &mut s.entropy_tokens,
            &mut s.entropy_kept,
        ] {
            *f = next();
        }
        for e in [
            &mut s.low_per_seq,
            &mut s.high_per_seq,
            &mut s.vespo_phi,
            &mut s.sampling_logp_diff,
            &mut s.sampling_ratio,
        ] {
            e.push(next());
            e.push(-next());
        }
        let v = s.to_vec();
        assert_eq!(v.len(), LossStats::LEN);
        assert_eq!(LossStats::from_slice(&v).unwrap(), s);
        // The empty statistics (infinite extremes) cross too.
        let empty = LossStats::default();
        assert_eq!(LossStats::from_slice(&empty.to_vec()).unwrap(), empty);
        assert!(LossStats::from_slice(&v[1..]).is_err());
    }
}

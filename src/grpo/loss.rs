//! The GRPO per-token loss (TRL `GRPOTrainer._compute_loss` semantics) on candle
//! tensors.
//!
//! Inputs are per-token log-probs `[B, T]` of the completion tokens (never logits), so
//! the loss never touches a `[B, T, vocab]` tensor. The mask `m` is the completion
//! mask times the environment-token mask (times the truncation mask).
//!
//! Gradient accumulation: the caller computes a [`LossScale`] once for the whole
//! generation batch and passes it to every micro-batch; each micro-batch's loss is
//! then its exact share of the full-batch loss, so summing micro-batch gradients gives
//! exactly the full-batch gradient for every `loss_type`. (For `bnpo` this means the
//! normaliser is the full batch's token count, which is what a single-micro-batch
//! step computes.)
use crate::config::{GrpoConfig, ImportanceSamplingLevel, LossType};
use anyhow::{bail, Result};
use candle_core::{DType, Tensor, D};

/// The knobs of the loss.
#[derive(Debug, Clone, PartialEq)]
pub struct LossParams {
    pub loss_type: LossType,
    pub level: ImportanceSamplingLevel,
    pub epsilon_low: f64,
    pub epsilon_high: f64,
    /// Upper cap of the importance weight in the unclipped term (two-sided GRPO).
    pub delta: Option<f64>,
    pub beta: f64,
    pub max_completion_length: usize,
}

impl LossParams {
    pub fn from_config(g: &GrpoConfig) -> Self {
        Self {
            loss_type: g.loss_type,
            level: g.importance_sampling_level,
            epsilon_low: g.epsilon,
            epsilon_high: g.epsilon_high(),
            delta: g.delta,
            beta: g.beta,
            max_completion_length: g.max_completion_length,
        }
    }
}

/// Normalisers of the whole generation batch (shared by all its micro-batches).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LossScale {
    /// Sequences in the generation batch.
    pub num_sequences: usize,
    /// Sum of the mask over the generation batch.
    pub active_tokens: f64,
}

impl LossScale {
    /// From the full batch's mask rows.
    pub fn from_masks<'a>(masks: impl IntoIterator<Item = &'a [f32]>) -> Self {
        let mut n = 0;
        let mut t = 0.0;
        for m in masks {
            n += 1;
            t += m.iter().map(|&x| x as f64).sum::<f64>();
        }
        Self {
            num_sequences: n,
            active_tokens: t,
        }
    }
}

/// One micro-batch's tensors. All `[B, T]` except `advantages` (`[B]`).
pub struct LossInputs<'a> {
    /// Current policy log-probs (differentiable).
    pub logp: &'a Tensor,
    /// Log-probs recorded at sampling time (num_iterations > 1); `None`: `logp.detach()`.
    pub old_logp: Option<&'a Tensor>,
    /// Reference (adapter-disabled) log-probs; required when beta > 0.
    pub ref_logp: Option<&'a Tensor>,
    pub advantages: &'a Tensor,
    pub mask: &'a Tensor,
    /// Per-token entropies, for the `entropy` metric only.
    pub entropy: Option<&'a Tensor>,
}

/// Sums over masked tokens, accumulated across micro-batches; the means TRL logs are
/// ratios of these.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LossStats {
    /// Loss value (sum of micro-batch losses = the full-batch loss).
    pub loss: f64,
    pub tokens: f64,
    pub low_clipped: f64,
    pub high_clipped: f64,
    pub region_clipped: f64,
    pub kl_sum: f64,
    pub kl_tokens: f64,
    pub entropy_sum: f64,
    pub entropy_tokens: f64,
}

impl LossStats {
    pub fn merge(&mut self, o: &LossStats) {
        self.loss += o.loss;
        self.tokens += o.tokens;
        self.low_clipped += o.low_clipped;
        self.high_clipped += o.high_clipped;
        self.region_clipped += o.region_clipped;
        self.kl_sum += o.kl_sum;
        self.kl_tokens += o.kl_tokens;
        self.entropy_sum += o.entropy_sum;
        self.entropy_tokens += o.entropy_tokens;
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
        Self::ratio(self.low_clipped, self.tokens)
    }
    /// `clip_ratio/high_mean`.
    pub fn clip_high(&self) -> f64 {
        Self::ratio(self.high_clipped, self.tokens)
    }
    /// `clip_ratio/region_mean`.
    pub fn clip_region(&self) -> f64 {
        Self::ratio(self.region_clipped, self.tokens)
    }
    /// `kl` (0 when beta = 0: not computed).
    pub fn kl(&self) -> f64 {
        Self::ratio(self.kl_sum, self.kl_tokens)
    }
    /// `entropy` (NaN-free; 0 when not given).
    pub fn entropy(&self) -> f64 {
        Self::ratio(self.entropy_sum, self.entropy_tokens)
    }
}

/// Loss tensor (scalar, differentiable) and statistics of one micro-batch.
pub struct LossOutput {
    pub loss: Tensor,
    pub stats: LossStats,
}

fn sum_all_f64(t: &Tensor) -> Result<f64> {
    Ok(t.to_dtype(DType::F64)?.sum_all()?.to_scalar::<f64>()?)
}

/// Per-token `beta`-free k3 estimator `exp(ref - logp) - (ref - logp) - 1`.
pub fn k3_kl(logp: &Tensor, ref_logp: &Tensor) -> Result<Tensor> {
    let d = (ref_logp - logp)?;
    Ok(((d.exp()? - &d)? - 1.0)?)
}

/// The GRPO loss of one micro-batch, scaled as its share of the full batch.
pub fn grpo_loss(inp: &LossInputs, p: &LossParams, scale: &LossScale) -> Result<LossOutput> {
    let logp = inp.logp.to_dtype(DType::F32)?;
    let (b, t) = logp.dims2()?;
    let mask = inp.mask.to_dtype(DType::F32)?.detach();
    if mask.dims2()? != (b, t) {
        bail!(
            "mask shape {:?} != logp shape {:?}",
            mask.dims(),
            logp.dims()
        );
    }
    let adv = inp.advantages.to_dtype(DType::F32)?.detach();
    if adv.dims1()? != b {
        bail!("advantages have {} rows, logp {b}", adv.dims1()?);
    }
    let old = match inp.old_logp {
        Some(o) => o.to_dtype(DType::F32)?.detach(),
        None => logp.detach(),
    };
    let log_ratio = (&logp - &old)?;
    let log_w = match p.level {
        ImportanceSamplingLevel::Token => log_ratio,
        ImportanceSamplingLevel::Sequence => {
            let num = (&log_ratio * &mask)?.sum_keepdim(D::Minus1)?;
            let den = mask.sum_keepdim(D::Minus1)?.maximum(1.0)?;
            (num / den)?.broadcast_as((b, t))?
        }
    };
    let w = log_w.exp()?;
    let wd = w.detach();
    let adv_bt = adv.unsqueeze(1)?.broadcast_as((b, t))?;

    // clamp(w, 1 - eps_low, 1 + eps_high), torch gradient semantics (1 inside, bounds
    // inclusive), via detached masks.
    let lo = 1.0 - p.epsilon_low;
    let hi = 1.0 + p.epsilon_high;
    let below = wd.lt(lo)?.to_dtype(DType::F32)?;
    let above = wd.gt(hi)?.to_dtype(DType::F32)?;
    let inside = ((1.0 - &below)? - &above)?;
    let w_clamped = (((&w * &inside)? + (&below * lo)?)? + (&above * hi)?)?;
    // Optional delta cap on the unclipped term.
    let w1 = match p.delta {
        Some(d) => {
            let over = wd.gt(d)?.to_dtype(DType::F32)?;
            ((&w * (1.0 - &over)?)? + (&over * d)?)?
        }
        None => w.clone(),
    };
    let t1 = (&w1 * &adv_bt)?;
    let t2 = (&w_clamped * &adv_bt)?;
    // min(t1, t2); on ties the gradient is d t1 (equal to torch's split when t1 == t2
    // share the same derivative, the only way ties occur inside the clip range).
    let pick1 = t1.detach().le(&t2.detach())?.to_dtype(DType::F32)?;
    let chosen = (&t2 + ((&t1 - &t2)? * &pick1)?)?;
    let mut per_tok = chosen.neg()?;

    let mut stats = LossStats::default();
    if p.beta > 0.0 {
        let r = match inp.ref_logp {
            Some(r) => r.to_dtype(DType::F32)?.detach(),
            None => bail!("beta > 0 needs reference log-probs"),
        };
        let kl = k3_kl(&logp, &r)?;
        stats.kl_sum = sum_all_f64(&(kl.detach() * &mask)?)?;
        stats.kl_tokens = sum_all_f64(&mask)?;
        per_tok = (per_tok + (kl * p.beta)?)?;
    }

    let masked = (&per_tok * &mask)?;
    let loss = match p.loss_type {
        LossType::Grpo => {
            let per_seq = masked.sum(D::Minus1)?;
            let len = mask.sum(D::Minus1)?.maximum(1.0)?;
            ((per_seq / len)?.sum_all()? / scale.num_sequences.max(1) as f64)?
        }
        LossType::Bnpo | LossType::Dapo => (masked.sum_all()? / scale.active_tokens.max(1.0))?,
        LossType::DrGrpo => {
            (masked.sum_all()?
                / (scale.num_sequences.max(1) * p.max_completion_length.max(1)) as f64)?
        }
    };

    // Clip statistics (TRL: after the delta cap).
    let w1d = w1.detach();
    let adv_neg = adv_bt.lt(0.0)?.to_dtype(DType::F32)?;
    let adv_pos = adv_bt.gt(0.0)?.to_dtype(DType::F32)?;
    let low = (w1d.lt(lo)?.to_dtype(DType::F32)? * adv_neg)?;
    let high = (w1d.gt(hi)?.to_dtype(DType::F32)? * adv_pos)?;
    let region = (&low + &high)?.minimum(1.0)?;
    stats.tokens = sum_all_f64(&mask)?;
    stats.low_clipped = sum_all_f64(&(low * &mask)?)?;
    stats.high_clipped = sum_all_f64(&(high * &mask)?)?;
    stats.region_clipped = sum_all_f64(&(region * &mask)?)?;
    if let Some(e) = inp.entropy {
        let e = e.to_dtype(DType::F32)?.detach();
        stats.entropy_sum = sum_all_f64(&(e * &mask)?)?;
        stats.entropy_tokens = stats.tokens;
    }
    stats.loss = loss.to_dtype(DType::F64)?.to_scalar::<f64>()?;
    Ok(LossOutput { loss, stats })
}

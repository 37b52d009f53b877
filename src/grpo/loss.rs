//! The GRPO per-token loss (TRL 1.16 `GRPOTrainer._compute_loss` semantics) on candle
//! tensors.
//!
//! Inputs are per-token log-probs `[B, T]` of the completion tokens (never logits), so
//! the loss never touches a `[B, T, vocab]` tensor. The mask `m` is the completion
//! mask times the environment-token mask (times the truncation mask).
//!
//! One micro-batch's loss is built in the order TRL builds it:
//! 1. the importance weight `w = exp(logp - old)`, per token or per sequence (GSPO);
//! 2. the per-token policy term of the `loss_type` ([`LossType`]):
//!    * `grpo`, `bnpo`, `dr_grpo`, `dapo`, `luspo`: the PPO clipped surrogate
//!      `-min(w A, clamp(w, 1 - eps_low, 1 + eps_high) A)` (optional `delta` cap);
//!    * `cispo` (MiniMax-M1, arXiv 2506.13585): `-sg(min(w, eps_high)) A logp`: the
//!      weight is clipped and detached, so clipped tokens still carry a gradient;
//!    * `sapo` (Soft Adaptive Policy Optimization, arXiv 2511.20347):
//!      `-sigmoid(tau (w - 1)) 4 / tau A`, a smooth gate instead of a hard clip, with
//!      `tau` by the advantage's sign;
//!    * `vespo` (arXiv 2602.10693): `-sg(phi(W)) A logp` with the Gamma-shaped weight
//!      `phi(W) = exp(lambda + k ln W - lambda W)` of the sequence ratio `W = exp(sum of
//!      token log-ratios)`, `(k, lambda)` by the advantage's sign ([`VespoShape`]);
//! 3. times the off-policy sequence mask and the sampler/trainer importance weights
//!    ([`super::correction`]), and the top-entropy mask ("Beyond the 80/20 Rule", arXiv
//!    2506.01939: only the top-q highest-entropy tokens of the micro-batch);
//! 4. plus `beta` times the k3 KL to the reference;
//! 5. aggregated by `loss_type`; `luspo` (arXiv 2602.05261) sums each sequence's
//!    tokens (so a sequence counts by its length) and averages over sequences;
//! 6. minus `entropy_coef` times the mean token entropy (over the kept tokens).
//!
//! Gradient accumulation: the caller computes a [`LossScale`] once for the whole
//! generation batch and passes it to every micro-batch; each micro-batch's loss is
//! then its exact share of the full-batch loss, so summing micro-batch gradients gives
//! exactly the full-batch gradient for every `loss_type`. (For `bnpo` this means the
//! normaliser is the full batch's token count, which is what a single-micro-batch
//! step computes.) Two terms are per micro-batch by definition, as in TRL: the
//! top-entropy quantile and the entropy bonus's mean (weighted by the micro-batch's
//! share of the sequences); with one micro-batch (the default) both are the batch's.
use super::correction::{off_policy_keep, SamplerCorrection, Weights};
use super::extremes::Extremes;
pub use super::loss_stats::LossStats;
use crate::config::{GrpoConfig, ImportanceSamplingLevel, LossType};
use anyhow::{bail, Result};
use candle_core::{DType, Tensor, D};

/// `sapo`'s gate temperatures, by the sign of the advantage.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SapoTemperatures {
    /// Tokens with advantage > 0.
    pub pos: f64,
    /// Tokens with advantage <= 0.
    pub neg: f64,
}

/// `vespo`'s Gamma weight `phi(W) = e^lambda W^k e^(-lambda W)` (so `phi(1) = 1`), one
/// `(k, lambda)` pair for advantages >= 0 and one for negative ones.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct VespoShape {
    pub k_pos: f64,
    pub lambda_pos: f64,
    pub k_neg: f64,
    pub lambda_neg: f64,
}

impl VespoShape {
    /// `phi` of a sequence with summed log-ratio `log_w` (clamped to [ln 1e-8, 20] as
    /// in the reference implementation) and advantage `a`; 0 where it overflows.
    pub fn phi(&self, log_w: f64, a: f64) -> f64 {
        let log_w = log_w.clamp(1e-8f64.ln(), 20.0);
        let (k, lambda) = if a >= 0.0 {
            (self.k_pos, self.lambda_pos)
        } else {
            (self.k_neg, self.lambda_neg)
        };
        let lambda = lambda.max(1e-4);
        let phi = (lambda + k * log_w - lambda * log_w.exp()).exp();
        if phi.is_finite() {
            phi
        } else {
            0.0
        }
    }
}

/// The knobs of the loss.
#[derive(Debug, Clone, PartialEq)]
pub struct LossParams {
    pub loss_type: LossType,
    pub level: ImportanceSamplingLevel,
    pub epsilon_low: f64,
    /// Upper clip (for `cispo`: the cap of the weight itself, ScaleRL recommends 5.0).
    pub epsilon_high: f64,
    /// Upper cap of the importance weight in the unclipped term (two-sided GRPO).
    pub delta: Option<f64>,
    pub beta: f64,
    pub max_completion_length: usize,
    pub sapo: SapoTemperatures,
    pub vespo: VespoShape,
    /// Keep the top-q highest-entropy tokens (1.0: all).
    pub top_entropy_quantile: f64,
    pub entropy_coef: f64,
    pub correction: SamplerCorrection,
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
            sapo: SapoTemperatures {
                pos: g.sapo_temperature_pos,
                neg: g.sapo_temperature_neg,
            },
            vespo: VespoShape {
                k_pos: g.vespo_k_pos,
                lambda_pos: g.vespo_lambda_pos,
                k_neg: g.vespo_k_neg,
                lambda_neg: g.vespo_lambda_neg,
            },
            top_entropy_quantile: g.top_entropy_quantile,
            entropy_coef: g.entropy_coef,
            correction: SamplerCorrection::from_config(g),
        }
    }

    /// Whether the sampler/trainer importance weights multiply the policy term.
    fn weights_policy_term(&self) -> bool {
        self.correction.apply && self.loss_type != LossType::Vespo
    }
}

impl Default for LossParams {
    /// The defaults of a `[grpo]` section.
    fn default() -> Self {
        Self::from_config(&GrpoConfig::default())
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
    /// Per-token entropies: the `entropy` metric, the top-entropy mask and (when
    /// differentiable) the entropy bonus.
    pub entropy: Option<&'a Tensor>,
    /// The sampler's log-probs of the same tokens (under `softmax(logits / T)`), for the
    /// mismatch metrics and corrections.
    pub sampler_logp: Option<&'a Tensor>,
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

/// `torch.quantile(xs, q)` (linear interpolation between the two nearest ranks).
pub fn quantile(xs: &[f32], q: f64) -> Option<f64> {
    if xs.is_empty() {
        return None;
    }
    let mut v: Vec<f64> = xs.iter().map(|&x| x as f64).collect();
    v.sort_by(|a, b| a.total_cmp(b));
    let pos = q.clamp(0.0, 1.0) * (v.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    Some(v[lo] + (v[hi] - v[lo]) * (pos - lo as f64))
}

/// The top-entropy mask: 1 for masked tokens whose entropy is at least the
/// `1 - keep` quantile of the masked tokens' entropies, 0 elsewhere.
pub fn high_entropy_mask(entropy: &[Vec<f32>], mask: &[Vec<f32>], keep: f64) -> Vec<Vec<f32>> {
    let masked: Vec<f32> = entropy
        .iter()
        .zip(mask)
        .flat_map(|(e, m)| e.iter().zip(m).filter(|(_, &m)| m != 0.0).map(|(&e, _)| e))
        .collect();
    let thr = quantile(&masked, 1.0 - keep);
    entropy
        .iter()
        .zip(mask)
        .map(|(e, m)| {
            e.iter()
                .zip(m)
                .map(|(&e, &m)| match thr {
                    Some(t) if m != 0.0 && e as f64 >= t => 1.0,
                    _ => 0.0,
                })
                .collect()
        })
        .collect()
}

fn rows_tensor(rows: &[Vec<f32>], like: &Tensor) -> Result<Tensor> {
    let (b, t) = like.dims2()?;
    let flat: Vec<f32> = rows.iter().flatten().copied().collect();
    Ok(Tensor::from_vec(flat, (b, t), like.device())?)
}

/// Broadcast one value per row to `[B, T]`.
fn per_row(vals: &[f32], like: &Tensor) -> Result<Tensor> {
    let (b, t) = like.dims2()?;
    Ok(Tensor::from_vec(vals.to_vec(), (b, 1), like.device())?.broadcast_as((b, t))?)
}

/// `1 / (1 + exp(-x))` from differentiable primitives.
fn sigmoid(x: &Tensor) -> Result<Tensor> {
    Ok((x.neg()?.exp()? + 1.0)?.recip()?)
}

/// The PPO clipped surrogate `-min(w1 A, clamp(w, 1 - eps_low, 1 + eps_high) A)`
/// (`w1`: `w` under the optional `delta` cap), and `w1` for the clip statistics.
fn clipped_surrogate(w: &Tensor, adv: &Tensor, p: &LossParams) -> Result<(Tensor, Tensor)> {
    let wd = w.detach();
    // clamp(w, 1 - eps_low, 1 + eps_high), torch gradient semantics (1 inside, bounds
    // inclusive), via detached masks.
    let lo = 1.0 - p.epsilon_low;
    let hi = 1.0 + p.epsilon_high;
    let below = wd.lt(lo)?.to_dtype(DType::F32)?;
    let above = wd.gt(hi)?.to_dtype(DType::F32)?;
    let inside = ((1.0 - &below)? - &above)?;
    let w_clamped = (((w * &inside)? + (&below * lo)?)? + (&above * hi)?)?;
    // Optional delta cap on the unclipped term.
    let w1 = match p.delta {
        Some(d) => {
            let over = wd.gt(d)?.to_dtype(DType::F32)?;
            ((w * (1.0 - &over)?)? + (&over * d)?)?
        }
        None => w.clone(),
    };
    let t1 = (&w1 * adv)?;
    let t2 = (&w_clamped * adv)?;
    // min(t1, t2); on ties the gradient is d t1 (equal to torch's split when t1 == t2
    // share the same derivative, the only way ties occur inside the clip range).
    let pick1 = t1.detach().le(&t2.detach())?.to_dtype(DType::F32)?;
    let chosen = (&t2 + ((&t1 - &t2)? * &pick1)?)?;
    Ok((chosen.neg()?, w1.detach()))
}

/// Host copies of a micro-batch's detached rows.
struct Rows {
    mask: Vec<Vec<f32>>,
    adv: Vec<f32>,
}

impl Rows {
    /// Per-unit indicator statistics (token level: masked tokens, one share per
    /// sequence with tokens; sequence level: one value per sequence, every sequence),
    /// as TRL's `global_masked_mean` and `masked_seq_mean` count them.
    fn units(
        &self,
        level: ImportanceSamplingLevel,
        ind: impl Fn(usize, usize) -> bool,
    ) -> (f64, f64, Extremes) {
        let mut hits = 0.0;
        let mut units = 0.0;
        let mut per_seq = Extremes::default();
        for (i, m) in self.mask.iter().enumerate() {
            match level {
                ImportanceSamplingLevel::Token => {
                    let (mut h, mut n) = (0.0, 0.0);
                    for (j, &mj) in m.iter().enumerate() {
                        if ind(i, j) {
                            h += mj as f64;
                        }
                        n += mj as f64;
                    }
                    hits += h;
                    units += n;
                    if n > 0.0 {
                        per_seq.push(h / n);
                    }
                }
                ImportanceSamplingLevel::Sequence => {
                    let h = if ind(i, 0) { 1.0 } else { 0.0 };
                    hits += h;
                    units += 1.0;
                    per_seq.push(h);
                }
            }
        }
        (hits, units, per_seq)
    }
}

/// The GRPO loss of one micro-batch, scaled as its share of the full batch:
/// importance weights, the loss type's per-token term, the token masks, the KL term,
/// the loss type's normalisation, the entropy bonus.
pub fn grpo_loss(inp: &LossInputs, p: &LossParams, scale: &LossScale) -> Result<LossOutput> {
    let m = Micro::new(inp)?;
    let mut stats = LossStats::default();
    let is_weights = m.sampler_weights(p, &mut stats);
    let apply = match (&is_weights, p.correction.apply) {
        (Some(w), true) => Some(w.rows.as_slice()),
        (None, true) => bail!("importance_sampling_correction needs the sampler's log-probs"),
        _ => None,
    };
    let per_tok = m.policy_term(p, apply, &mut stats)?;
    let (per_tok, entropy_mask) = m.token_masks(per_tok, p, apply, &mut stats)?;
    let per_tok = m.with_kl(per_tok, p, &mut stats)?;
    let policy = m.normalised(&per_tok, p, scale)?;
    stats.policy_loss = policy.to_dtype(DType::F64)?.to_scalar::<f64>()?;
    let loss = m.with_entropy_bonus(policy, p, scale, entropy_mask.as_ref())?;
    stats.tokens = sum_all_f64(&m.mask)?;
    if let Some(e) = inp.entropy {
        let e = e.to_dtype(DType::F32)?.detach();
        stats.entropy_sum = sum_all_f64(&(e * &m.mask)?)?;
        stats.entropy_tokens = stats.tokens;
    }
    stats.loss = loss.to_dtype(DType::F64)?.to_scalar::<f64>()?;
    Ok(LossOutput { loss, stats })
}

/// One micro-batch's loss inputs, checked, in f32, and detached where no gradient
/// flows, with the host copies the statistics read.
struct Micro<'a> {
    inp: &'a LossInputs<'a>,
    logp: Tensor,
    mask: Tensor,
    /// `[B, T]`: each row's advantage in every column.
    adv_bt: Tensor,
    /// `logp - old`.
    log_ratio: Tensor,
    old_rows: Vec<Vec<f32>>,
    sampler: Option<Vec<Vec<f32>>>,
    rows: Rows,
}

impl<'a> Micro<'a> {
    fn new(inp: &'a LossInputs<'a>) -> Result<Self> {
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
        let sampler = match inp.sampler_logp {
            Some(s) if s.dims2()? != (b, t) => bail!(
                "sampler log-probs shape {:?} != logp shape {:?}",
                s.dims(),
                logp.dims()
            ),
            Some(s) => Some(s.to_dtype(DType::F32)?.detach().to_vec2::<f32>()?),
            None => None,
        };
        Ok(Micro {
            inp,
            rows: Rows {
                mask: mask.to_vec2()?,
                adv: adv.to_vec1()?,
            },
            adv_bt: adv.unsqueeze(1)?.broadcast_as((b, t))?,
            log_ratio: (&logp - &old)?,
            old_rows: old.to_vec2()?,
            logp,
            mask,
            sampler,
        })
    }

    /// Sampler/trainer importance weights: always measured (when the sampler's
    /// log-probs are there), applied only when asked.
    fn sampler_weights(&self, p: &LossParams, stats: &mut LossStats) -> Option<Weights> {
        let w = self
            .sampler
            .as_ref()
            .map(|s| p.correction.weights(&self.old_rows, s, &self.rows.mask))?;
        stats.sampling_logp_diff = w.logp_diff;
        stats.sampling_ratio = w.ratio;
        Some(w)
    }

    /// The loss type's per-token policy term (`apply`: the sampler correction's
    /// weights, which VESPO folds into its sequence weight).
    fn policy_term(
        &self,
        p: &LossParams,
        apply: Option<&[Vec<f32>]>,
        stats: &mut LossStats,
    ) -> Result<Tensor> {
        let (b, t) = self.logp.dims2()?;
        let log_w = match p.level {
            ImportanceSamplingLevel::Token => self.log_ratio.clone(),
            ImportanceSamplingLevel::Sequence => {
                let num = (&self.log_ratio * &self.mask)?.sum_keepdim(D::Minus1)?;
                let den = self.mask.sum_keepdim(D::Minus1)?.maximum(1.0)?;
                (num / den)?.broadcast_as((b, t))?
            }
        };
        let w = log_w.exp()?;
        match p.loss_type {
            LossType::Grpo
            | LossType::Bnpo
            | LossType::DrGrpo
            | LossType::Dapo
            | LossType::Luspo => self.clipped_term(&w, p, stats),
            LossType::Cispo => self.cispo_term(&w, p, stats),
            LossType::Sapo => self.sapo_term(&w, p),
            LossType::Vespo => self.vespo_term(p, apply, stats),
        }
    }

    /// PPO's clipped surrogate, with TRL's clip-fraction statistics.
    fn clipped_term(&self, w: &Tensor, p: &LossParams, stats: &mut LossStats) -> Result<Tensor> {
        let rows = &self.rows;
        let (l, w1) = clipped_surrogate(w, &self.adv_bt, p)?;
        let w1: Vec<Vec<f32>> = w1.to_vec2()?;
        let (lo, hi) = ((1.0 - p.epsilon_low) as f32, (1.0 + p.epsilon_high) as f32);
        let low = |i: usize, j: usize| w1[i][j] < lo && rows.adv[i] < 0.0;
        let high = |i: usize, j: usize| w1[i][j] > hi && rows.adv[i] > 0.0;
        let (nl, units, low_seq) = rows.units(p.level, low);
        let (nh, _, high_seq) = rows.units(p.level, high);
        let (nr, _, _) = rows.units(p.level, |i, j| low(i, j) || high(i, j));
        stats.clip_units = units;
        stats.low_clipped = nl;
        stats.high_clipped = nh;
        stats.region_clipped = nr;
        stats.low_per_seq = low_seq;
        stats.high_per_seq = high_seq;
        Ok(l)
    }

    /// CISPO: the REINFORCE term with the importance weight capped and detached.
    fn cispo_term(&self, w: &Tensor, p: &LossParams, stats: &mut LossStats) -> Result<Tensor> {
        let rows = &self.rows;
        let wd: Vec<Vec<f32>> = w.to_vec2()?;
        let cap = p.epsilon_high as f32;
        let (n, units, _) = rows.units(p.level, |i, j| wd[i][j] > cap && rows.adv[i] > 0.0);
        stats.cispo_clipped = n;
        stats.clip_units = units;
        let capped = w.detach().minimum(p.epsilon_high)?;
        Ok(((capped * &self.adv_bt)? * &self.logp)?.neg()?)
    }

    /// SAPO: a sigmoid gate on the ratio, its temperature by the advantage's sign.
    fn sapo_term(&self, w: &Tensor, p: &LossParams) -> Result<Tensor> {
        let tau: Vec<f32> = self
            .rows
            .adv
            .iter()
            .map(|&a| (if a > 0.0 { p.sapo.pos } else { p.sapo.neg }) as f32)
            .collect();
        let tau = per_row(&tau, &self.logp)?;
        let gate = sigmoid(&((w - 1.0)? * &tau)?)?;
        Ok((((gate * 4.0)? / &tau)? * &self.adv_bt)?.neg()?)
    }

    /// VESPO: a per-sequence weight from the sequence's summed (not mean) token
    /// log-ratio, plus the sampler correction's log-weights when applied (clamped as
    /// the reference does).
    fn vespo_term(
        &self,
        p: &LossParams,
        apply: Option<&[Vec<f32>]>,
        stats: &mut LossStats,
    ) -> Result<Tensor> {
        let lr: Vec<Vec<f32>> = self.log_ratio.to_vec2()?;
        let lo = 1e-8f64.ln();
        let phi: Vec<f32> = (0..lr.len())
            .map(|i| {
                let mut s: f64 = lr[i]
                    .iter()
                    .zip(&self.rows.mask[i])
                    .map(|(&x, &m)| (x as f64).clamp(-20.0, 20.0) * m as f64)
                    .sum();
                if let Some(wr) = apply {
                    s += wr[i]
                        .iter()
                        .map(|&x| (x as f64).ln().clamp(lo, 20.0))
                        .sum::<f64>();
                }
                let phi = p.vespo.phi(s, self.rows.adv[i] as f64);
                stats.vespo_phi.push(phi);
                phi as f32
            })
            .collect();
        let phi = per_row(&phi, &self.logp)?;
        Ok(((phi * &self.adv_bt)? * &self.logp)?.neg()?)
    }

    /// The token masks on the policy term: DeepSeek-V3.2's off-policy sequence mask,
    /// the top-entropy mask (returned: the entropy bonus uses it too), and the sampler
    /// correction's weights where the loss type applies them per token.
    fn token_masks(
        &self,
        mut per_tok: Tensor,
        p: &LossParams,
        apply: Option<&[Vec<f32>]>,
        stats: &mut LossStats,
    ) -> Result<(Tensor, Option<Tensor>)> {
        let rows = &self.rows;
        if let Some(threshold) = p.correction.off_policy_mask_threshold {
            let lp: Vec<Vec<f32>> = self.logp.detach().to_vec2()?;
            let reference = self.sampler.as_ref().unwrap_or(&self.old_rows);
            let keep = off_policy_keep(&rows.adv, &lp, reference, &rows.mask, threshold);
            let keep: Vec<f32> = keep.iter().map(|&k| if k { 1.0 } else { 0.0 }).collect();
            per_tok = (per_tok * per_row(&keep, &self.logp)?)?;
        }
        let entropy_mask = if p.top_entropy_quantile < 1.0 {
            let Some(e) = self.inp.entropy else {
                bail!("top_entropy_quantile < 1 needs the per-token entropies");
            };
            let e: Vec<Vec<f32>> = e.to_dtype(DType::F32)?.detach().to_vec2()?;
            let em = high_entropy_mask(&e, &rows.mask, p.top_entropy_quantile);
            stats.entropy_kept = em.iter().flatten().map(|&x| x as f64).sum();
            let em = rows_tensor(&em, &self.logp)?;
            per_tok = (per_tok * &em)?;
            Some(em)
        } else {
            stats.entropy_kept = rows.mask.iter().flatten().map(|&x| x as f64).sum();
            None
        };
        if let (Some(wr), true) = (apply, p.weights_policy_term()) {
            per_tok = (per_tok * rows_tensor(wr, &self.logp)?)?;
        }
        Ok((per_tok, entropy_mask))
    }

    /// `per_tok` plus `beta` times the k3 KL to the reference policy.
    fn with_kl(&self, per_tok: Tensor, p: &LossParams, stats: &mut LossStats) -> Result<Tensor> {
        if p.beta <= 0.0 {
            return Ok(per_tok);
        }
        let r = match self.inp.ref_logp {
            Some(r) => r.to_dtype(DType::F32)?.detach(),
            None => bail!("beta > 0 needs reference log-probs"),
        };
        let kl = k3_kl(&self.logp, &r)?;
        stats.kl_sum = sum_all_f64(&(kl.detach() * &self.mask)?)?;
        stats.kl_tokens = sum_all_f64(&self.mask)?;
        Ok((per_tok + (kl * p.beta)?)?)
    }

    /// The masked per-token loss reduced as the loss type normalises it, over the
    /// whole batch's sequences or tokens (`scale`).
    fn normalised(&self, per_tok: &Tensor, p: &LossParams, scale: &LossScale) -> Result<Tensor> {
        let masked = (per_tok * &self.mask)?;
        let n_seq = scale.num_sequences.max(1) as f64;
        Ok(match p.loss_type {
            LossType::Grpo | LossType::Sapo => {
                let per_seq = masked.sum(D::Minus1)?;
                let len = self.mask.sum(D::Minus1)?.maximum(1.0)?;
                ((per_seq / len)?.sum_all()? / n_seq)?
            }
            LossType::Bnpo | LossType::Dapo | LossType::Cispo | LossType::Vespo => {
                (masked.sum_all()? / scale.active_tokens.max(1.0))?
            }
            LossType::DrGrpo => {
                (masked.sum_all()? / (n_seq * p.max_completion_length.max(1) as f64))?
            }
            LossType::Luspo => (masked.sum_all()? / n_seq)?,
        })
    }

    /// The entropy bonus: the mean entropy of the kept tokens, as this micro-batch's
    /// share (by sequences) of the batch's.
    fn with_entropy_bonus(
        &self,
        policy: Tensor,
        p: &LossParams,
        scale: &LossScale,
        entropy_mask: Option<&Tensor>,
    ) -> Result<Tensor> {
        if p.entropy_coef == 0.0 {
            return Ok(policy);
        }
        let Some(e) = self.inp.entropy else {
            bail!("entropy_coef needs the per-token entropies");
        };
        let eff = match entropy_mask {
            Some(em) => (&self.mask * em)?,
            None => self.mask.clone(),
        };
        let n_eff = sum_all_f64(&eff)?.max(1.0);
        let share = self.rows.mask.len() as f64 / scale.num_sequences.max(1) as f64;
        let bonus = ((e.to_dtype(DType::F32)? * &eff)?.sum_all()? * (share / n_eff))?;
        Ok((&policy - (bonus * p.entropy_coef)?)?)
    }
}

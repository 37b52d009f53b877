//! Token choice on the logits' device: the same processing as [`super::RowSampler`]
//! (repetition penalty, min-new-tokens suppression, temperature, top-k, top-p, min-p,
//! the two recorded log-probs) written as tensor operations, so that on a GPU a decode
//! step moves only `n x 3` numbers (token, sample log-prob, full log-prob) to the host
//! instead of `n x V` logits.
//!
//! Why thresholds and bisection instead of a sort: every filter keeps the tokens whose
//! scaled logit is at or above a per-row threshold (top-k: the k-th largest value;
//! top-p: the lowest logit of the nucleus; min-p: max + ln(min_p)). A threshold is found
//! by bisection over masked counts or masked sums, which needs only elementwise ops and
//! row reductions, the same on every backend, and no sort of 151,936 entries per row.
//! The draw itself is inverse-CDF over the kept weights in vocabulary order, in two
//! levels (the block of 128 tokens from the block sums, then the token inside it), each
//! a bisection on the position: the masked prefix mass is monotone in the position
//! because float addition is monotone and a row reduction adds its entries in an order
//! fixed by position, so the token found always has positive weight.
//!
//! The uniform numbers still come from each row's own RNG stream on the host (one per
//! non-greedy choice, like the host sampler), so a completion draws the same numbers
//! whatever else is in the batch; they travel to the device with the step's input ids.
//!
//! Ties at a top-k or top-p boundary are all kept (the host sampler breaks nucleus ties
//! by token index), and the draw walks the vocabulary in index order rather than by
//! descending probability: both sample the same distribution, not the same tokens.

use super::{Choice, SamplingParams};
use anyhow::{ensure, Result};
use candle_core::{DType, Device, Tensor, D};

/// Weights below `max - WEIGHT_RANGE` underflow to zero in f32 (exp(-110) < 2^-149):
/// the lower end of every threshold bisection.
const WEIGHT_RANGE: f64 = 110.0;
/// Bisection steps on a logit threshold: the [max - 110, max + 1] interval shrinks below
/// the f32 spacing of the logits that matter.
const THRESHOLD_STEPS: usize = 36;

/// Chooses the next token of every row of a logits batch on the batch's device.
pub struct DeviceSampler {
    params: SamplingParams,
    vocab: usize,
    device: Device,
    /// `0, 1, ..., V-1` as f32, `[1, V]`.
    positions: Tensor,
    /// Block indices and positions inside a block of the two-level draw, `[1, B]` and
    /// `[1, BLOCK]` (made once: building them uploads from the host).
    block_positions: Tensor,
    inner_positions: Tensor,
    /// `[n, V]` u8: 1 where the token occurs in the row's prompt or completion (only when
    /// the repetition penalty is on).
    presence: Option<Tensor>,
    /// `[1, V]` f32: -inf at the stop tokens, 0 elsewhere (only with `min_new_tokens`).
    stop_mask: Option<Tensor>,
}

impl DeviceSampler {
    pub fn new(params: &SamplingParams, vocab: usize, device: &Device) -> Result<Self> {
        params.validate()?;
        // token ids travel as f32 next to the log-probs: exact below 2^24
        ensure!(
            vocab > 0 && vocab < (1 << 24),
            "device sampling needs 0 < vocab < 2^24, got {vocab}"
        );
        let token_positions = positions(vocab, device)?;
        let stop_mask = if params.min_new_tokens > 0 && !params.stop_token_ids.is_empty() {
            let mut m = vec![0f32; vocab];
            for &t in &params.stop_token_ids {
                if let Some(x) = m.get_mut(t as usize) {
                    *x = f32::NEG_INFINITY;
                }
            }
            Some(Tensor::from_vec(m, (1, vocab), device)?)
        } else {
            None
        };
        Ok(Self {
            params: params.clone(),
            vocab,
            device: device.clone(),
            positions: token_positions,
            block_positions: positions(vocab.div_ceil(BLOCK), device)?,
            inner_positions: positions(BLOCK, device)?,
            presence: None,
            stop_mask,
        })
    }

    fn penalty_on(&self) -> bool {
        self.params.repetition_penalty != 1.0
    }

    /// Sets the rows' repetition-penalty contexts (one upload of `n x V` bytes at the
    /// start of decoding; later tokens are added on the device).
    pub fn set_contexts(&mut self, contexts: &[&[u32]]) -> Result<()> {
        if !self.penalty_on() {
            return Ok(());
        }
        let v = self.vocab;
        let mut m = vec![0u8; contexts.len() * v];
        for (r, ctx) in contexts.iter().enumerate() {
            for &t in ctx.iter() {
                if (t as usize) < v {
                    m[r * v + t as usize] = 1;
                }
            }
        }
        self.presence = Some(Tensor::from_vec(m, (contexts.len(), v), &self.device)?);
        Ok(())
    }

    /// Keeps the per-row state of rows `keep` (in that order), as the KV cache does.
    pub fn select_rows(&mut self, keep: &[usize]) -> Result<()> {
        if let Some(p) = &self.presence {
            let idx: Vec<u32> = keep.iter().map(|&k| k as u32).collect();
            let idx = Tensor::from_vec(idx, keep.len(), &self.device)?;
            self.presence = Some(p.index_select(&idx, 0)?);
        }
        Ok(())
    }

    /// Chooses a token for each of the `n` rows of `logits` (`[n, V]`, any float dtype).
    /// `uniforms[r]` in [0, 1) drives row r's draw (ignored when greedy); `generated` is
    /// the number of tokens every row has generated so far.
    pub fn choose(
        &mut self,
        logits: &Tensor,
        uniforms: &[f64],
        generated: usize,
    ) -> Result<Vec<Choice>> {
        let (n, v) = logits.dims2()?;
        ensure!(
            v == self.vocab,
            "logits have {v} columns, expected {}",
            self.vocab
        );
        ensure!(
            uniforms.len() == n,
            "{} uniforms for {n} rows",
            uniforms.len()
        );
        let p = &self.params;
        let raw = logits.to_dtype(DType::F32)?;
        let greedy = p.is_greedy();
        let inv_t = if greedy {
            1.0
        } else {
            1.0 / p.temperature as f64
        };

        // Full temperature-scaled distribution (what the trainer recomputes).
        let raw_scaled = scale(&raw, inv_t)?;
        let raw_lse = log_sum_exp(&raw_scaled)?;

        // Processed logits.
        let mut l = raw;
        if self.penalty_on() {
            let Some(presence) = self.presence.as_ref() else {
                anyhow::bail!("repetition penalty on: set_contexts must come before choose");
            };
            ensure!(
                presence.dim(0)? == n,
                "repetition-penalty state has {} rows, logits {n}",
                presence.dim(0)?
            );
            let pen = p.repetition_penalty as f64;
            let penalized = l
                .lt(0f32)?
                .where_cond(&l.affine(pen, 0.)?, &l.affine(1. / pen, 0.)?)?;
            l = presence.where_cond(&penalized, &l)?;
        }
        if let Some(stop) = self
            .stop_mask
            .as_ref()
            .filter(|_| generated < p.min_new_tokens)
        {
            l = l.broadcast_add(stop)?;
        }

        let (token, sample_lp) = if greedy {
            let tok = l.argmax_keepdim(D::Minus1)?;
            (tok, Tensor::zeros((n, 1), DType::F32, &self.device)?)
        } else {
            let s = scale(&l, inv_t)?;
            let m = s.max_keepdim(D::Minus1)?;
            let floor = self.keep_threshold(&s, &m)?;
            let e = weights(&s, &m, floor.as_ref())?;
            let z = e.sum_keepdim(D::Minus1)?;
            let u: Vec<f32> = uniforms.iter().map(|&u| unit_f32(u)).collect();
            let target = Tensor::from_vec(u, (n, 1), &self.device)?.mul(&z)?;
            let tok = self.inverse_cdf(&e, &target)?;
            let s_tok = s.gather(&tok, D::Minus1)?;
            // ln(e_tok / z) with e_tok = exp(s_tok - m), without the exp
            let lp = s_tok.sub(&m)?.sub(&z.log()?)?;
            (tok, lp)
        };
        let full_lp = raw_scaled.gather(&token, D::Minus1)?.sub(&raw_lse)?;
        let token_f = token.to_dtype(DType::F32)?;

        if let Some(presence) = self.presence.as_mut() {
            let seen = self.positions.broadcast_eq(&token_f)?;
            let ones = Tensor::ones((n, v), DType::U8, &self.device)?;
            *presence = seen.where_cond(&ones, presence)?;
        }

        // The step's only device-to-host transfer.
        let out = Tensor::cat(&[&token_f, &sample_lp, &full_lp], 1)?.to_vec2::<f32>()?;
        Ok(out
            .into_iter()
            .map(|r| Choice {
                token: (r[0].max(0.0) as u32).min(self.vocab as u32 - 1),
                sample_logprob: r[1],
                full_logprob: r[2],
            })
            .collect())
    }

    /// Per-row threshold on the scaled logits `s` (`[n, V]`, row max `m`) at and above
    /// which tokens survive top-k, top-p and min-p, in that order (None: no filter on).
    fn keep_threshold(&self, s: &Tensor, m: &Tensor) -> Result<Option<Tensor>> {
        let p = &self.params;
        let n = s.dim(0)?;
        let mut floor: Option<Tensor> = None;
        let lowest = m.affine(1.0, -WEIGHT_RANGE)?;
        let above_max = m.affine(1.0, 1.0)?;
        if p.top_k > 0 && p.top_k < self.vocab {
            // largest threshold keeping at least k tokens = the k-th largest value
            let k = Tensor::full(p.top_k as f32, (n, 1), &self.device)?;
            floor = Some(bisect(&lowest, &above_max, |mid| {
                let count = s
                    .broadcast_ge(mid)?
                    .to_dtype(DType::F32)?
                    .sum_keepdim(D::Minus1)?;
                Ok(count.ge(&k)?)
            })?);
        }
        if p.top_p < 1.0 {
            // largest threshold whose kept mass reaches top_p of what top-k left
            let e = weights(s, m, floor.as_ref())?;
            let need = e.sum_keepdim(D::Minus1)?.affine(p.top_p as f64, 0.)?;
            let zeros = e.zeros_like()?;
            let start = match &floor {
                Some(f) => f.maximum(&lowest)?,
                None => lowest.clone(),
            };
            floor = Some(bisect(&start, &above_max, |mid| {
                let mass = s
                    .broadcast_ge(mid)?
                    .where_cond(&e, &zeros)?
                    .sum_keepdim(D::Minus1)?;
                Ok(mass.ge(&need)?)
            })?);
        }
        if p.min_p > 0.0 {
            let min_p = m.affine(1.0, (p.min_p as f64).ln())?;
            floor = Some(match floor {
                Some(f) => f.maximum(&min_p)?,
                None => min_p,
            });
        }
        Ok(floor)
    }

    /// Per row, the smallest token index whose prefix mass of `e` exceeds `target`
    /// (`[n, 1]` u32): first the block of [`BLOCK`] tokens, from the block sums, then the
    /// token inside it, so only one pass reads the whole vocabulary.
    fn inverse_cdf(&self, e: &Tensor, target: &Tensor) -> Result<Tensor> {
        let (n, v) = e.dims2()?;
        let blocks = v.div_ceil(BLOCK);
        let e = if blocks * BLOCK > v {
            let pad = Tensor::zeros((n, blocks * BLOCK - v), DType::F32, &self.device)?;
            Tensor::cat(&[e, &pad], 1)?
        } else {
            e.clone()
        };
        let e = e.reshape((n, blocks, BLOCK))?;
        let sums = e.sum(2)?;
        let block_pos = &self.block_positions;
        let block = first_exceeding(&sums, block_pos, target)?;
        // A block chosen has positive mass (an empty block adds nothing to the prefix),
        // and what is left of the target is >= 0, so the token found has positive weight.
        let zeros = sums.zeros_like()?;
        let before = block_pos
            .broadcast_lt(&block)?
            .where_cond(&sums, &zeros)?
            .sum_keepdim(D::Minus1)?;
        let rest = target.sub(&before)?;
        let index = block
            .to_dtype(DType::U32)?
            .unsqueeze(2)?
            .broadcast_as((n, 1, BLOCK))?
            .contiguous()?;
        let inside = e.gather(&index, 1)?.squeeze(1)?;
        let offset = first_exceeding(&inside, &self.inner_positions, &rest)?;
        Ok(block
            .affine(BLOCK as f64, 0.)?
            .add(&offset)?
            .to_dtype(DType::U32)?)
    }
}

/// Tokens per block of the two-level inverse CDF.
const BLOCK: usize = 128;

/// `0, 1, ..., len-1` as f32, `[1, len]`.
fn positions(len: usize, device: &Device) -> Result<Tensor> {
    Ok(Tensor::arange(0u32, len as u32, device)?
        .to_dtype(DType::F32)?
        .unsqueeze(0)?)
}

/// Per row of `w` (`[n, L]`, weights >= 0), the smallest position (f32, `[n, 1]`) whose
/// prefix mass exceeds `target`, by bisection over masked row sums; the last
/// positive-weight position when rounding leaves the target unreached.
///
/// The prefix mass is monotone in the position, and equal across zero weights, because
/// float addition is monotone and a row sum adds its entries in an order fixed by
/// position: so the position found always has positive weight.
fn first_exceeding(w: &Tensor, positions: &Tensor, target: &Tensor) -> Result<Tensor> {
    let (n, len) = w.dims2()?;
    let none = Tensor::full(-1f32, (n, len), w.device())?;
    let last = w
        .gt(0f32)?
        .where_cond(&positions.broadcast_as((n, len))?, &none)?
        .max_keepdim(D::Minus1)?;
    let mut hi = last.maximum(0f32)?;
    let mut lo = Tensor::full(-1f32, (n, 1), w.device())?;
    let zeros = w.zeros_like()?;
    for _ in 0..usize::BITS - len.leading_zeros() {
        // invariant: mass(<= lo) <= target < mass(<= hi), or hi is the last positive
        let mid = lo.add(&hi)?.affine(0.5, 0.)?.floor()?;
        let mass = positions
            .broadcast_le(&mid)?
            .where_cond(w, &zeros)?
            .sum_keepdim(D::Minus1)?;
        let over = mass.gt(target)?;
        hi = over.where_cond(&mid, &hi)?;
        lo = over.where_cond(&lo, &mid)?;
    }
    Ok(hi)
}

/// `x * inv_t` (no copy when `inv_t == 1`).
fn scale(x: &Tensor, inv_t: f64) -> Result<Tensor> {
    Ok(if inv_t == 1.0 {
        x.clone()
    } else {
        x.affine(inv_t, 0.)?
    })
}

/// Row-wise `ln sum exp(x)`, `[n, 1]`.
fn log_sum_exp(x: &Tensor) -> Result<Tensor> {
    let m = x.max_keepdim(D::Minus1)?;
    let s = x.broadcast_sub(&m)?.exp()?.sum_keepdim(D::Minus1)?;
    Ok(s.log()?.add(&m)?)
}

/// `exp(s - m)` where `s >= floor`, else 0 (everything kept without a floor).
fn weights(s: &Tensor, m: &Tensor, floor: Option<&Tensor>) -> Result<Tensor> {
    let e = s.broadcast_sub(m)?.exp()?;
    let Some(floor) = floor else {
        return Ok(e);
    };
    let zeros = e.zeros_like()?;
    Ok(s.broadcast_ge(floor)?.where_cond(&e, &zeros)?)
}

/// Per-row bisection for the largest value in `[lo, hi)` where `ok` holds, given that
/// `ok(lo)` holds and `ok` is monotone (true below some point, false above).
fn bisect(lo: &Tensor, hi: &Tensor, ok: impl Fn(&Tensor) -> Result<Tensor>) -> Result<Tensor> {
    let (mut lo, mut hi) = (lo.clone(), hi.clone());
    for _ in 0..THRESHOLD_STEPS {
        let mid = lo.add(&hi)?.affine(0.5, 0.)?;
        let yes = ok(&mid)?;
        lo = yes.where_cond(&mid, &lo)?;
        hi = yes.where_cond(&hi, &mid)?;
    }
    Ok(lo)
}

/// A uniform in [0, 1) as the largest f32 not above it, kept below 1.
fn unit_f32(u: f64) -> f32 {
    const BELOW_ONE: f32 = 1.0 - f32::EPSILON / 2.0;
    (u as f32).clamp(0.0, BELOW_ONE)
}

#[cfg(test)]
mod tests {
    use super::super::RowSampler;
    use super::*;
    use rand::{Rng, RngCore, SeedableRng};

    /// An RNG whose every `gen::<f64>()` is `u` (rand's f64 takes the top 53 bits).
    struct Fixed(u64);
    impl Fixed {
        fn new(u: f64) -> Self {
            Fixed(((u * (1u64 << 53) as f64) as u64) << 11)
        }
    }
    impl RngCore for Fixed {
        fn next_u32(&mut self) -> u32 {
            (self.0 >> 32) as u32
        }
        fn next_u64(&mut self) -> u64 {
            self.0
        }
        fn fill_bytes(&mut self, dest: &mut [u8]) {
            dest.fill(0)
        }
        fn try_fill_bytes(&mut self, dest: &mut [u8]) -> std::result::Result<(), rand::Error> {
            dest.fill(0);
            Ok(())
        }
    }

    const N: usize = 2000;

    fn grid(i: usize) -> f64 {
        (i as f64 + 0.5) / N as f64
    }

    /// Token counts and per-token log-probs over the uniform grid, host sampler.
    fn host(
        logits: &[f32],
        p: &SamplingParams,
        ctx: &[u32],
        generated: usize,
    ) -> (Vec<usize>, Vec<Option<(f32, f32)>>) {
        let mut s = RowSampler::new();
        let mut counts = vec![0; logits.len()];
        let mut lps = vec![None; logits.len()];
        for i in 0..N {
            let c = s.choose(logits, p, ctx, generated, &mut Fixed::new(grid(i)));
            counts[c.token as usize] += 1;
            lps[c.token as usize] = Some((c.sample_logprob, c.full_logprob));
        }
        (counts, lps)
    }

    /// The same grid as N rows of one device batch.
    fn device(
        logits: &[f32],
        p: &SamplingParams,
        ctx: &[u32],
        generated: usize,
    ) -> (Vec<usize>, Vec<Option<(f32, f32)>>) {
        let v = logits.len();
        let dev = Device::Cpu;
        let batch = Tensor::from_vec(logits.repeat(N), (N, v), &dev).unwrap();
        let mut s = DeviceSampler::new(p, v, &dev).unwrap();
        s.set_contexts(&vec![ctx; N]).unwrap();
        let u: Vec<f64> = (0..N).map(grid).collect();
        let mut counts = vec![0; v];
        let mut lps = vec![None; v];
        for c in s.choose(&batch, &u, generated).unwrap() {
            counts[c.token as usize] += 1;
            lps[c.token as usize] = Some((c.sample_logprob, c.full_logprob));
        }
        (counts, lps)
    }

    /// Both samplers draw the same distribution (counts over the grid within 2) and
    /// report the same log-probs for every token drawn.
    fn agree(logits: &[f32], p: &SamplingParams, ctx: &[u32], generated: usize) {
        let (hc, hl) = host(logits, p, ctx, generated);
        let (dc, dl) = device(logits, p, ctx, generated);
        for t in 0..logits.len() {
            assert!(
                hc[t].abs_diff(dc[t]) <= 2,
                "{p:?}\ntoken {t}: host {} device {}\nhost {hc:?}\ndevice {dc:?}",
                hc[t],
                dc[t]
            );
            if let (Some(h), Some(d)) = (hl[t], dl[t]) {
                assert!(
                    (h.0 - d.0).abs() < 1e-4,
                    "{p:?} token {t} sample lp {h:?} {d:?}"
                );
                assert!(
                    (h.1 - d.1).abs() < 1e-4,
                    "{p:?} token {t} full lp {h:?} {d:?}"
                );
            }
        }
    }

    fn random_logits(v: usize, seed: u64) -> Vec<f32> {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        (0..v).map(|_| rng.gen_range(-4.0f32..4.0)).collect()
    }

    fn with(f: impl FnOnce(&mut SamplingParams)) -> SamplingParams {
        let mut p = SamplingParams::default();
        f(&mut p);
        p
    }

    #[test]
    fn every_filter_draws_what_the_host_sampler_draws() {
        let l = random_logits(97, 3);
        let cases = [
            SamplingParams::default(),
            with(|p| p.temperature = 0.6),
            with(|p| p.temperature = 1.7),
            with(|p| p.top_k = 7),
            with(|p| p.top_k = 1),
            with(|p| p.top_p = 0.5),
            with(|p| p.top_p = 0.93),
            with(|p| {
                p.top_k = 20;
                p.top_p = 0.7;
                p.temperature = 0.8
            }),
            with(|p| p.min_p = 0.2),
            with(|p| {
                p.top_p = 0.9;
                p.min_p = 0.05
            }),
        ];
        for p in &cases {
            agree(&l, p, &[], 0);
        }
        // several blocks of the two-level draw, the last one padded
        let wide = random_logits(1000, 5);
        for p in &cases[..6] {
            agree(&wide, p, &[], 0);
        }
    }

    #[test]
    fn penalty_suppression_and_greedy_match_the_host_sampler() {
        let l = random_logits(50, 11);
        // the context holds the top tokens, positive and negative logits alike
        let mut order: Vec<u32> = (0..50).collect();
        order.sort_by(|&a, &b| l[b as usize].total_cmp(&l[a as usize]));
        let ctx: Vec<u32> = order[..5].iter().chain(&order[45..]).copied().collect();
        let pen = with(|p| p.repetition_penalty = 1.8);
        agree(&l, &pen, &ctx, 0);
        let pen_top_k = with(|p| {
            p.repetition_penalty = 0.7;
            p.top_k = 4
        });
        agree(&l, &pen_top_k, &ctx, 0);
        let stops = with(|p| {
            p.min_new_tokens = 3;
            p.stop_token_ids = order[..2].to_vec();
        });
        agree(&l, &stops, &[], 2); // suppressed
        agree(&l, &stops, &[], 3); // allowed again
        let greedy = with(|p| {
            p.temperature = 0.0;
            p.repetition_penalty = 1.5
        });
        agree(&l, &greedy, &ctx, 0);
        let (counts, lps) = device(&l, &greedy, &ctx, 0);
        let best = counts.iter().position(|&c| c == N).expect("one token");
        assert_eq!(lps[best].map(|x| x.0), Some(0.0));
    }

    #[test]
    fn ties_at_the_top_k_boundary_are_kept() {
        let l = [3.0f32, 1.0, 1.0, 1.0, 0.0];
        let (counts, _) = device(&l, &with(|p| p.top_k = 2), &[], 0);
        assert!(
            counts[1] > 0 && counts[2] > 0 && counts[3] > 0,
            "{counts:?}"
        );
        assert_eq!(counts[4], 0);
    }

    #[test]
    fn the_draw_never_lands_on_a_dropped_token() {
        // extreme uniforms and a vocabulary that is mostly -inf
        let mut l = vec![f32::NEG_INFINITY; 300];
        l[5] = 2.0;
        l[17] = 1.0;
        l[250] = -3.0;
        let dev = Device::Cpu;
        let p = with(|p| p.top_p = 0.99);
        let mut s = DeviceSampler::new(&p, 300, &dev).unwrap();
        let u = [0.0, 1e-12, 0.5, 1.0 - 1e-12, 1.0 - f64::EPSILON];
        let batch = Tensor::from_vec(l.repeat(u.len()), (u.len(), 300), &dev).unwrap();
        for c in s.choose(&batch, &u, 0).unwrap() {
            assert!([5, 17, 250].contains(&c.token), "{c:?}");
            assert!(
                c.sample_logprob.is_finite() && c.sample_logprob <= 0.0,
                "{c:?}"
            );
        }
    }

    #[test]
    fn penalty_state_follows_the_rows() {
        // two rows; row 1's context penalises token 0 into second place
        let dev = Device::Cpu;
        let l = Tensor::new(&[[2.0f32, 1.5, -1.0], [2.0, 1.5, -1.0]], &dev).unwrap();
        let p = with(|p| {
            p.temperature = 0.0;
            p.repetition_penalty = 2.0
        });
        let mut s = DeviceSampler::new(&p, 3, &dev).unwrap();
        s.set_contexts(&[&[], &[0]]).unwrap();
        let tokens = |c: Vec<Choice>| c.iter().map(|c| c.token).collect::<Vec<_>>();
        assert_eq!(tokens(s.choose(&l, &[0.5; 2], 0).unwrap()), [0, 1]);
        // row 0 now has token 0 in its context too; row 1 has 0 and 1
        assert_eq!(tokens(s.choose(&l, &[0.5; 2], 1).unwrap()), [1, 0]);
        s.select_rows(&[1]).unwrap();
        let one = l.narrow(0, 0, 1).unwrap();
        assert_eq!(tokens(s.choose(&one, &[0.5], 2).unwrap()), [0]);
        // without contexts the penalty cannot be applied: an error, not a silent skip
        let mut fresh = DeviceSampler::new(&p, 3, &dev).unwrap();
        assert!(fresh.choose(&l, &[0.5; 2], 0).is_err());
    }
}

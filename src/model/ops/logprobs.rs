//! Token log-probs (and entropies) through the LM head, a chunk of rows at a time so the
//! full `[N, V]` logits never exist at once.
use super::{attach, widen};
use candle_core::{DType, Result, Tensor, D};

// ---------------------------------------------------------------------------------------
// Chunked token log-probs through the LM head.

/// One chunk of rows: (logp of targets, entropy if asked), both `[c]` f32.
fn chunk_stats(
    h: &Tensor,
    w: &Tensor,
    ids: &Tensor,
    inv_t: f64,
    entropy: bool,
    keep_probs: bool,
) -> Result<(Tensor, Option<Tensor>, Option<Tensor>)> {
    let logits = (h.matmul(&w.t()?)?.to_dtype(DType::F32)? * inv_t)?;
    let m = logits.max_keepdim(D::Minus1)?;
    let z = logits.broadcast_sub(&m)?;
    let e = z.exp()?;
    let se = e.sum_keepdim(D::Minus1)?;
    let lse = se.log()?; // logsumexp(z)
    let tgt = z.gather(&ids.unsqueeze(1)?, 1)?;
    let logp = (tgt - &lse)?.squeeze(1)?;
    let ent = if entropy {
        // H = lse - sum(p z)
        let pz = (&e * &z)?.sum_keepdim(D::Minus1)?.div(&se)?;
        Some((lse - pz)?.squeeze(1)?)
    } else {
        None
    };
    let probs = if keep_probs {
        Some(e.broadcast_div(&se)?)
    } else {
        None
    };
    Ok((logp, ent, probs))
}

/// Softmax probabilities up to this size (all chunks together, f32) are kept from the
/// forward pass for the backward instead of recomputed: recomputing streams the whole
/// LM head through one more matmul (at 8 x 160 tokens on the 0.5B shape, 0.35 TFLOP,
/// about an eighth of the training step) to save 778 MB.
pub const PROB_CACHE_BYTES: usize = 1 << 30;

/// Log-probabilities of `targets` `[N]` (u32) under `softmax(h W^T / temperature)` for
/// hidden states `h` `[N, H]`, computed `chunk` rows at a time so that at most
/// `[chunk, V]` logits exist at once (forward and backward). Returns
/// `(logp [N] f32, entropy [N] f32 if asked)`; the entropy is differentiable too (see
/// [`attach_entropy`]: it costs nothing unless a loss uses it).
/// The backward uses the forward's softmax when all of it fits in [`PROB_CACHE_BYTES`],
/// else recomputes each chunk: `dh = g/T * (W[target] - softmax @ W)`.
pub fn chunked_token_logprobs(
    h: &Tensor,
    w: &Tensor,
    targets: &Tensor,
    temperature: f64,
    chunk: usize,
    with_entropy: bool,
) -> Result<(Tensor, Option<Tensor>)> {
    chunked_token_logprobs_cached(
        h,
        w,
        targets,
        temperature,
        chunk,
        with_entropy,
        PROB_CACHE_BYTES,
    )
}

/// [`chunked_token_logprobs`] keeping the softmax for the backward when it takes at
/// most `cache_bytes` (0: always recompute).
pub fn chunked_token_logprobs_cached(
    h: &Tensor,
    w: &Tensor,
    targets: &Tensor,
    temperature: f64,
    chunk: usize,
    with_entropy: bool,
    cache_bytes: usize,
) -> Result<(Tensor, Option<Tensor>)> {
    let n = h.dim(0)?;
    if targets.dims1()? != n {
        candle_core::bail!(
            "token_logprobs: {n} hidden rows vs {:?} targets",
            targets.shape()
        );
    }
    if temperature.is_nan() || temperature <= 0.0 {
        candle_core::bail!("token_logprobs: temperature must be > 0 (got {temperature})");
    }
    let chunk = chunk.max(1);
    let inv_t = 1.0 / temperature;
    let hd = h.detach().contiguous()?;
    // A narrower stored LM head is widened once per call, not once per chunk.
    let w = &widen(w, hd.dtype())?;
    let targets = targets.to_dtype(DType::U32)?.contiguous()?;
    let mut lps = Vec::new();
    let mut ents = Vec::new();
    let keep_probs = h.track_op() && n * w.dim(0)? * 4 <= cache_bytes;
    let mut probs = Vec::new();
    let mut start = 0;
    while start < n {
        let c = chunk.min(n - start);
        let (lp, ent, p) = chunk_stats(
            &hd.narrow(0, start, c)?,
            w,
            &targets.narrow(0, start, c)?,
            inv_t,
            with_entropy,
            keep_probs,
        )?;
        probs.extend(p);
        lps.push(lp);
        if let Some(e) = ent {
            ents.push(e);
        }
        start += c;
    }
    let logp = if lps.is_empty() {
        Tensor::zeros(0, DType::F32, h.device())?
    } else {
        Tensor::cat(&lps, 0)?
    };
    let entropy = if with_entropy {
        Some(if ents.is_empty() {
            Tensor::zeros(0, DType::F32, h.device())?
        } else {
            Tensor::cat(&ents, 0)?
        })
    } else {
        None
    };
    let entropy = match entropy {
        Some(e) => Some(attach_entropy(h, w, e, inv_t, chunk, probs.clone())?),
        None => None,
    };
    let w = w.clone();
    let logp = attach([h], logp, "chunked-logprobs", move |[h], _y, g| {
        let dtype = h.dtype();
        let h = h.contiguous()?;
        let g = g.to_dtype(DType::F32)?;
        let mut parts = Vec::new();
        let mut start = 0;
        while start < n {
            let c = chunk.min(n - start);
            let ids = targets.narrow(0, start, c)?;
            let p = match probs.get(parts.len()) {
                Some(p) => p.clone(),
                None => {
                    let hc = h.narrow(0, start, c)?;
                    let logits = (hc.matmul(&w.t()?)?.to_dtype(DType::F32)? * inv_t)?;
                    candle_nn::ops::softmax_last_dim(&logits)?
                }
            };
            let pw = p.to_dtype(w.dtype())?.matmul(&w)?.to_dtype(DType::F32)?;
            let wt = w.index_select(&ids, 0)?.to_dtype(DType::F32)?;
            let gc = (g.narrow(0, start, c)? * inv_t)?.unsqueeze(1)?;
            parts.push((wt - pw)?.broadcast_mul(&gc)?.to_dtype(dtype)?);
            start += c;
        }
        Ok([Some(Tensor::cat(&parts, 0)?)])
    })?;
    Ok((logp, entropy))
}

/// Make the per-token entropies `ent` `[N]` of `softmax(h W^T * inv_t)` a function of
/// `h` (for an entropy bonus; nothing is computed unless a loss uses them). With
/// `H = -sum_j p_j ln p_j`, `dH/dz_j = -p_j (ln p_j + H)` (the logsumexp cancels), so
/// the backward needs only the softmax: the forward's `probs` when kept, else each
/// chunk's recomputed; `dh = inv_t * (g * dH/dz) W`.
fn attach_entropy(
    h: &Tensor,
    w: &Tensor,
    ent: Tensor,
    inv_t: f64,
    chunk: usize,
    probs: Vec<Tensor>,
) -> Result<Tensor> {
    let n = h.dim(0)?;
    let w = w.clone();
    attach([h], ent, "chunked-entropy", move |[h], y, g| {
        let dtype = h.dtype();
        let h = h.contiguous()?;
        let g = g.to_dtype(DType::F32)?;
        let mut parts = Vec::new();
        let mut start = 0;
        while start < n {
            let c = chunk.min(n - start);
            let p = match probs.get(parts.len()) {
                Some(p) => p.clone(),
                None => {
                    let hc = h.narrow(0, start, c)?;
                    let logits = (hc.matmul(&w.t()?)?.to_dtype(DType::F32)? * inv_t)?;
                    candle_nn::ops::softmax_last_dim(&logits)?
                }
            };
            // ln p with underflowed probabilities kept finite (their p factor is 0).
            let lnp = p.maximum(f32::MIN_POSITIVE as f64)?.log()?;
            let hy = y.narrow(0, start, c)?.unsqueeze(1)?;
            let gc = g.narrow(0, start, c)?.unsqueeze(1)?;
            let dz = ((p * lnp.broadcast_add(&hy)?)?.neg()?.broadcast_mul(&gc)? * inv_t)?;
            parts.push(dz.to_dtype(w.dtype())?.matmul(&w)?.to_dtype(dtype)?);
            start += c;
        }
        Ok([Some(Tensor::cat(&parts, 0)?)])
    })
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{check, rand};
    use super::*;
    use candle_core::Device;

    #[test]
    fn chunked_logprobs_match_log_softmax() {
        let w = rand(&[11, 6], 10);
        let ids = Tensor::new(&[0u32, 3, 10, 5, 5, 1, 2], &Device::Cpu).unwrap();
        for (chunk, cache) in [(1, 0), (3, 0), (100, 0), (3, PROB_CACHE_BYTES)] {
            check(
                &[7, 6],
                |h| {
                    let out = chunked_token_logprobs_cached(h, &w, &ids, 0.8, chunk, false, cache);
                    Ok(out?.0)
                },
                |h| {
                    let l = (h.matmul(&w.t()?)? / 0.8)?;
                    let l = candle_nn::ops::log_softmax(&l, D::Minus1)?;
                    l.gather(&ids.unsqueeze(1)?, 1)?.squeeze(1)
                },
            );
        }
    }

    #[test]
    fn chunked_entropy_gradient_matches_composition() {
        // A scaled head so some probabilities are tiny (the ln p guard).
        let w = (rand(&[11, 6], 12) * 8.0).unwrap();
        let ids = Tensor::new(&[0u32, 3, 10, 5, 5, 1, 2], &Device::Cpu).unwrap();
        for (chunk, cache) in [(1, 0), (3, 0), (3, PROB_CACHE_BYTES)] {
            check(
                &[7, 6],
                |h| {
                    let out = chunked_token_logprobs_cached(h, &w, &ids, 0.8, chunk, true, cache)?;
                    Ok(out.1.expect("entropy asked"))
                },
                |h| {
                    let l = (h.matmul(&w.t()?)? / 0.8)?;
                    let lp = candle_nn::ops::log_softmax(&l, D::Minus1)?;
                    (lp.exp()? * &lp)?.sum(D::Minus1)?.neg()
                },
            );
        }
    }
}

//! The SFT objective and its token accuracy, on per-token log-probs (never `[B, T,
//! vocab]` logits).
//!
//! TRL `SFTTrainer` with a completion-only loss: the cross-entropy of the completion
//! tokens, averaged over every completion token of the step's batch. With gradient
//! accumulation the divisor is the whole batch's count (transformers'
//! `num_items_in_batch`), so the micro-batch gradients add up to the full-batch one.
use crate::model::Transformer;
use anyhow::Result;
use candle_core::{DType, Tensor, D};

/// `-sum(mask * logp) / num_tokens`: `logp` and `mask` are `[B, T]` (f32; mask 1 on
/// completion tokens, 0 on padding), `num_tokens` the completion tokens of the whole
/// step's batch.
pub fn sft_loss(logp: &Tensor, mask: &Tensor, num_tokens: f64) -> Result<Tensor> {
    let nll = (logp * mask)?.sum_all()?.neg()?;
    Ok((nll / num_tokens.max(1.0))?)
}

/// Rows of logits at a time in [`token_hits`] (bounded memory on a large vocabulary).
const ARGMAX_CHUNK: usize = 64;

/// How many masked positions predict their target: `hidden` `[B, T, H]` (detached use
/// only), `targets` `[B, T]` u32, `mask` `[B*T]`. The argmax is taken over chunks of
/// [`ARGMAX_CHUNK`] positions' logits, so at most `[64, vocab]` exist at once.
pub fn token_hits(
    model: &Transformer,
    hidden: &Tensor,
    targets: &[u32],
    mask: &[f32],
) -> Result<usize> {
    let (b, t, h) = hidden.dims3()?;
    let flat = hidden.detach().contiguous()?.reshape((b * t, h))?;
    let rows: Vec<usize> = (0..b * t).filter(|&i| mask[i] > 0.0).collect();
    let mut hits = 0;
    for chunk in rows.chunks(ARGMAX_CHUNK) {
        let idx: Vec<u32> = chunk.iter().map(|&i| i as u32).collect();
        let idx = Tensor::from_vec(idx, chunk.len(), flat.device())?;
        let logits = model.logits(&flat.index_select(&idx, 0)?)?;
        let best: Vec<u32> = logits.argmax(D::Minus1)?.to_dtype(DType::U32)?.to_vec1()?;
        hits += chunk
            .iter()
            .zip(&best)
            .filter(|(&i, &p)| targets[i] == p)
            .count();
    }
    Ok(hits)
}

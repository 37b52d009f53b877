//! KV reuse across the decisions of a session.
//!
//! In decision mode every turn is a fresh prompt: the system prompt, then the state with
//! the session's history so far. Consecutive prompts of one seat share a long prefix
//! (everything up to where the newest history line goes), so the next prompt only needs
//! the tokens after the longest common prefix prefilled, on top of the keys and values
//! kept from the last one. Keys keep their RoPE positions (the prefix is the same tokens
//! at the same positions), so this is the computation of a full prefill, reordered.

use super::SampleStats;
use crate::model::{Input, Mode};
use crate::model::{KvCache, RowKv, Transformer};
use candle_core::Tensor;

/// A prompt's tokens and the keys and values of all of them, kept for the next prompt
/// of the same session and seat.
#[derive(Debug, Clone)]
pub struct PromptKv {
    pub tokens: Vec<u32>,
    pub kv: RowKv,
}

/// Prompt tokens of `prompt` whose keys and values `prior` already holds: their common
/// prefix, leaving at least the last token to prefill (its logits start the completion).
pub fn reusable(prior: Option<&PromptKv>, prompt: &[u32]) -> usize {
    let Some(p) = prior else { return 0 };
    let common = p
        .tokens
        .iter()
        .zip(prompt)
        .take_while(|(a, b)| a == b)
        .count();
    common.min(p.kv.len()).min(prompt.len().saturating_sub(1))
}

/// Prefill `prompts[i]` on top of the prefix of `priors[i]` it shares, in one
/// left-padded batch; returns the cache (room for `extra` more columns after the
/// prompts) and the last-position logits of every prompt.
pub fn prefill_continuing(
    model: &Transformer,
    prompts: &[&[u32]],
    priors: &[Option<&PromptKv>],
    extra: usize,
    stats: &mut SampleStats,
) -> anyhow::Result<(KvCache, Tensor)> {
    let keep: Vec<usize> = prompts
        .iter()
        .zip(priors)
        .map(|(p, prior)| reusable(*prior, p))
        .collect();
    let suffixes: Vec<&[u32]> = prompts.iter().zip(&keep).map(|(p, &k)| &p[k..]).collect();
    let (ids, mask, smax) = super::left_padded(&suffixes);
    stats.prefill_tokens += prompts.iter().map(|p| p.len()).sum::<usize>();
    stats.reused_tokens += keep.iter().sum::<usize>();
    let rows: Vec<(Option<&RowKv>, usize)> = priors
        .iter()
        .zip(&keep)
        .map(|(prior, &k)| (prior.map(|p| &p.kv), k))
        .collect();
    let mut cache = model.cache_from_prefixes(&rows, smax + extra)?;
    let b = prompts.len();
    let ids_t = Tensor::from_vec(ids, (b, smax), model.device())?;
    let all_real = mask.iter().all(|&m| m != 0);
    let hidden = model
        .forward(
            Input::cached(&ids_t, (!all_real).then_some(&mask[..]), &mut cache),
            Mode::Detached,
        )?
        .rows;
    let logits = model.last_logits(&hidden)?;
    Ok((cache, logits))
}

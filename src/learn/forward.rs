//! The training forward over a packed micro-batch: completion log-probs (and
//! entropies) under `softmax(logits / T)`, through the LM head at completion positions
//! only, in chunks (never `[B, T, vocab]`). With prompt sharing each group's prompt runs
//! once ([`Input::Shared`](crate::model::Input::Shared)); with activation checkpointing the forward
//! keeps only each layer's input ([`Checkpoints`]).
use super::pack::Packed;
use crate::model::ops;
use crate::model::{Checkpoints, Mode, Transformer};
use crate::model::{Input, Pass};
use crate::rng::mix_seeds as mix;
use anyhow::{bail, Result};
use candle_core::Tensor;
use std::ops::Range;

/// Per-token log-probs `[B, comp_len]` (f32) of a packed micro-batch's completion
/// tokens under `softmax(logits / temperature)`, optionally with entropies. Only the
/// completion positions go through the LM head, in chunks (never `[B, T, vocab]`).
pub fn completion_logprobs(
    model: &Transformer,
    p: &Packed,
    mode: Mode,
    temperature: f64,
    entropy: bool,
) -> Result<(Tensor, Option<Tensor>)> {
    Forward::new(model, mode).logprobs(p, temperature, entropy)
}

/// How a training forward runs: the model, the [`Mode`], with activation checkpointing
/// the record its backward is finished from, and whether it is the base model (the
/// reference policy: the adapter off for this forward only).
#[derive(Clone, Copy)]
pub struct Forward<'a> {
    pub model: &'a Transformer,
    pub mode: Mode,
    pub checkpoints: Option<&'a Checkpoints>,
    pub base_only: bool,
}

impl<'a> Forward<'a> {
    /// A plain forward (no checkpointing).
    pub fn new(model: &'a Transformer, mode: Mode) -> Self {
        Forward {
            model,
            mode,
            checkpoints: None,
            base_only: false,
        }
    }

    /// [`completion_logprobs`].
    pub fn logprobs(
        &self,
        p: &Packed,
        temperature: f64,
        entropy: bool,
    ) -> Result<(Tensor, Option<Tensor>)> {
        let model = self.model;
        let dev = model.device().clone();
        let ids = Tensor::from_vec(p.ids.clone(), (p.rows, p.width), &dev)?;
        let hidden = model
            .forward(Input::rows(&ids, Some(&p.attention)), self.pass(self.mode))?
            .rows;
        let h = hidden.narrow(1, p.prompt_len - 1, p.comp_len)?;
        let targets = Tensor::from_vec(p.targets.clone(), (p.rows, p.comp_len), &dev)?;
        let out = model.token_logprobs(&h, &targets, temperature, entropy)?;
        Ok((out.logprobs, out.entropy))
    }

    /// [`completion_logprobs_shared`].
    fn pass(&self, mode: Mode) -> Pass<'a> {
        Pass {
            mode,
            base_only: self.base_only,
            checkpoints: self.checkpoints,
        }
    }

    pub fn logprobs_shared(
        &self,
        p: &Packed,
        groups: &[Range<usize>],
        temperature: f64,
        entropy: bool,
    ) -> Result<(Tensor, Option<Tensor>)> {
        shared(self, p, groups, temperature, entropy)
    }
}

/// Token positions a shared-prompt forward of `p`'s groups runs: each group's prompt
/// once plus all but the last column of its completions.
pub fn shared_tokens(p: &Packed, groups: &[Range<usize>]) -> usize {
    groups
        .iter()
        .map(|r| {
            let (plen, clen) = group_lens(p, r);
            plen + r.len() * clen.saturating_sub(1)
        })
        .sum()
}

/// (prompt length, longest completion) of the rows `r` of a packed micro-batch.
fn group_lens(p: &Packed, r: &Range<usize>) -> (usize, usize) {
    let row = r.start * p.width;
    let plen = p.attention[row..row + p.prompt_len]
        .iter()
        .filter(|&&a| a != 0)
        .count();
    let clen = r
        .clone()
        .map(|i| {
            let a = &p.attention[i * p.width + p.prompt_len..(i + 1) * p.width];
            a.iter().rposition(|&x| x != 0).map_or(0, |k| k + 1)
        })
        .max()
        .unwrap_or(0);
    (plen, clen)
}

/// [`completion_logprobs`] for a micro-batch whose rows form groups sharing one prompt:
/// `groups` are row ranges of `p` (together all its rows, in order) and every row of a
/// range must carry the same prompt. Each group runs [`Input::Shared`](crate::model::Input::Shared):
/// its prompt once, its completions (all but their last token, whose hidden state
/// scores nothing) against the prompt's keys/values. Returns the same `[B, comp_len]`
/// log-probs (and entropies) as [`completion_logprobs`], zero in columns past a group's
/// longest completion (masked out by the loss). `Mode::Train`'s dropout seed is mixed
/// with the group's index.
pub fn completion_logprobs_shared(
    model: &Transformer,
    p: &Packed,
    groups: &[Range<usize>],
    mode: Mode,
    temperature: f64,
    entropy: bool,
) -> Result<(Tensor, Option<Tensor>)> {
    Forward::new(model, mode).logprobs_shared(p, groups, temperature, entropy)
}

fn shared(
    f: &Forward,
    p: &Packed,
    groups: &[Range<usize>],
    temperature: f64,
    entropy: bool,
) -> Result<(Tensor, Option<Tensor>)> {
    let (model, mode) = (f.model, f.mode);
    let dev = model.device().clone();
    let covered: usize = groups.iter().map(|r| r.len()).sum();
    if covered != p.rows
        || groups.first().map(|r| r.start) != Some(0)
        || groups.windows(2).any(|w| w[0].end != w[1].start)
    {
        bail!(
            "completion_logprobs_shared: groups {groups:?} do not tile the {} rows",
            p.rows
        );
    }
    let mut lps = Vec::with_capacity(groups.len());
    let mut ents = Vec::with_capacity(groups.len());
    for (gi, r) in groups.iter().enumerate() {
        if r.is_empty() {
            continue;
        }
        let (plen, clen) = group_lens(p, r);
        let g = r.len();
        let row0 = r.start * p.width;
        let prompt: Vec<u32> = p.ids[row0 + p.prompt_len - plen..row0 + p.prompt_len].to_vec();
        for i in r.clone() {
            let row = i * p.width;
            let same = p.ids[row + p.prompt_len - plen..row + p.prompt_len] == prompt[..]
                && p.attention[row..row + p.prompt_len]
                    .iter()
                    .filter(|&&a| a != 0)
                    .count()
                    == plen;
            if !same {
                bail!("completion_logprobs_shared: row {i} does not share its group's prompt");
            }
        }
        if plen == 0 || clen == 0 {
            bail!("completion_logprobs_shared: empty prompt or completions in group {gi}");
        }
        let gmode = match mode {
            Mode::Train { dropout_seed } => Mode::Train {
                dropout_seed: mix(dropout_seed, gi as u64),
            },
            m => m,
        };
        let prompt_t = Tensor::from_vec(prompt, (1, plen), &dev)?;
        let h = if clen > 1 {
            // Completion tokens 0..clen-1 as input; their hidden states score 1..clen.
            let cin = clen - 1;
            let mut ids = Vec::with_capacity(g * cin);
            let mut mask = Vec::with_capacity(g * cin);
            for i in r.clone() {
                let s = i * p.width + p.prompt_len;
                ids.extend_from_slice(&p.ids[s..s + cin]);
                mask.extend_from_slice(&p.attention[s..s + cin]);
            }
            let ids = Tensor::from_vec(ids, (g, cin), &dev)?;
            let input = Input::shared(&prompt_t, &ids, Some(&mask));
            let h = model.forward(input, f.pass(gmode))?;
            let hp = h
                .prompt
                .ok_or_else(|| anyhow::anyhow!("a shared forward returns its prompt"))?;
            ops::prefix_cat(&hp.narrow(1, plen - 1, 1)?, &h.rows, 1)?
        } else {
            let hp = model
                .forward(Input::rows(&prompt_t, None), f.pass(gmode))?
                .rows;
            let hid = hp.dim(2)?;
            hp.narrow(1, plen - 1, 1)?.broadcast_as((g, 1, hid))?
        };
        let mut targets = Vec::with_capacity(g * clen);
        for i in r.clone() {
            targets.extend_from_slice(&p.targets[i * p.comp_len..i * p.comp_len + clen]);
        }
        let targets = Tensor::from_vec(targets, (g, clen), &dev)?;
        let out = model.token_logprobs(&h, &targets, temperature, entropy)?;
        lps.push(ops::pad_cols(&out.logprobs, p.comp_len)?);
        if let Some(e) = out.entropy {
            ents.push(ops::pad_cols(&e, p.comp_len)?);
        }
    }
    let lp = Tensor::cat(&lps, 0)?;
    let ent = if entropy {
        Some(Tensor::cat(&ents, 0)?)
    } else {
        None
    };
    Ok((lp, ent))
}

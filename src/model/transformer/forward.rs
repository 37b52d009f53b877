//! The one forward. What varies between callers is its input: packed rows, a prompt
//! shared by its completions, or new columns of a KV cache; and the pass: the graph
//! mode, the adapter on or off, activation checkpointing. Each input becomes one or two
//! streams (embeddings plus a [`Layout`] with RoPE tables) that every [`Block`] runs.
use super::block::{Adapters, Block};
use super::cache::KvCache;
use super::mask::{self, Layout};
use super::mode::Mode;
use super::recompute::{Checkpoints, Layers, Segment};
use super::Transformer;
use crate::model::ops;
use anyhow::{anyhow, bail, Context, Result};
use candle_core::{DType, Tensor, Var};

/// What one forward runs on. Ids are `[B, T]` u32 or i64; masks are row-major, 1 =
/// real token, `None` = all real.
pub enum Input<'a> {
    /// Rows, each attending causally to its own real tokens (left or right padding, or
    /// holes). Positions per row are `cumsum(mask) - 1`.
    Rows {
        ids: &'a Tensor,
        mask: Option<&'a [u8]>,
    },
    /// One GRPO group: its prompt `[1, P]` (all real) once, and `G` completions
    /// `[G, C]` that attend to the whole prompt and causally to their own real tokens,
    /// at positions `P + ...`. The backward sums the rows' gradients into the prompt's
    /// activations, so LoRA on prompt tokens is trained by every completion. With LoRA
    /// dropout the prompt's masks are drawn once for the group: the same distribution
    /// per token as packed rows, but not independent across the `G` rows.
    Shared {
        prompt: &'a Tensor,
        completions: &'a Tensor,
        mask: Option<&'a [u8]>,
    },
    /// New columns appended to a KV cache (sampling; detached only). Use left padding
    /// for prompts and mask 0 for rows that are done; each real token sees the earlier
    /// real columns of its row, at the row's next position.
    Cached {
        ids: &'a Tensor,
        mask: Option<&'a [u8]>,
        cache: &'a mut KvCache,
    },
}

impl<'a> Input<'a> {
    pub fn rows(ids: &'a Tensor, mask: Option<&'a [u8]>) -> Self {
        Input::Rows { ids, mask }
    }

    pub fn shared(prompt: &'a Tensor, completions: &'a Tensor, mask: Option<&'a [u8]>) -> Self {
        Input::Shared {
            prompt,
            completions,
            mask,
        }
    }

    pub fn cached(ids: &'a Tensor, mask: Option<&'a [u8]>, cache: &'a mut KvCache) -> Self {
        Input::Cached { ids, mask, cache }
    }
}

/// How one forward runs besides its input.
#[derive(Clone, Copy, Default)]
pub struct Pass<'a> {
    pub mode: Mode,
    /// Run the base model even where the model's adapter is enabled (GRPO's reference
    /// policy).
    pub base_only: bool,
    /// Activation checkpointing: keep only each layer's input and record the forward
    /// for [`Checkpoints::backward`]. Not with [`Input::Cached`].
    pub checkpoints: Option<&'a Checkpoints>,
}

impl<'a> Pass<'a> {
    pub fn checkpointed(mode: Mode, checkpoints: Option<&'a Checkpoints>) -> Self {
        Pass {
            mode,
            checkpoints,
            ..Pass::default()
        }
    }
}

impl From<Mode> for Pass<'_> {
    fn from(mode: Mode) -> Self {
        Pass {
            mode,
            ..Pass::default()
        }
    }
}

/// Final-norm hidden states `[B, T, H]` in the model dtype; feed them to the heads
/// ([`Transformer::logits`], [`Transformer::token_logprobs`]).
pub struct Hidden {
    /// One per input row (the completions of [`Input::Shared`]).
    pub rows: Tensor,
    /// The shared prompt's `[1, P, H]` ([`Input::Shared`] only).
    pub prompt: Option<Tensor>,
}

/// One stream through the layers: its mask and RoPE tables.
struct Stream {
    cos: Tensor,
    sin: Tensor,
    mask: Tensor,
}

/// The streams one training forward runs through the decoder layers.
enum Stack {
    Rows(Stream),
    /// A shared prompt and its completions, which attend to the prompt's keys/values.
    Shared {
        prompt: Stream,
        completions: Stream,
    },
}

/// A checkpointed forward as [`Checkpoints`] records it.
struct Recorded {
    stack: Stack,
    adapters: Adapters,
}

impl Transformer {
    /// Run `input` through the model. Returns the final-norm hidden states; with
    /// checkpointing they hang off fresh variables whose gradients
    /// [`Checkpoints::backward`] carries back through the layers (same values).
    pub fn forward<'p>(&self, input: Input<'_>, pass: impl Into<Pass<'p>>) -> Result<Hidden> {
        let pass = pass.into();
        let adapters = Adapters {
            on: !pass.base_only && self.lora.is_some() && self.adapter_enabled(),
            mode: pass.mode,
            layer: 0,
        };
        match input {
            Input::Rows { ids, mask } => {
                let (b, t) = ids.dims2()?;
                let real = mask::real_mask(mask, b, t)?;
                let stack = Stack::Rows(self.stream(mask::packed(&real, b, t, &self.device)?)?);
                let [rows] =
                    self.run_stack(stack, [self.embed(ids)?], adapters, pass.checkpoints)?;
                Ok(Hidden { rows, prompt: None })
            }
            Input::Shared {
                prompt,
                completions,
                mask,
            } => self.forward_shared(prompt, completions, mask, adapters, pass.checkpoints),
            Input::Cached { ids, mask, cache } => {
                if pass.mode != Mode::Detached || pass.checkpoints.is_some() {
                    bail!("forward: a cached forward is detached and not checkpointed");
                }
                let rows = self.forward_cached(ids, mask, cache, adapters)?;
                Ok(Hidden { rows, prompt: None })
            }
        }
    }

    fn stream(&self, l: Layout) -> Result<Stream> {
        let (cos, sin) =
            self.rope
                .tables((l.rows, l.cols), &l.positions, self.dtype, &self.device)?;
        Ok(Stream {
            cos,
            sin,
            mask: l.mask,
        })
    }

    fn embed(&self, ids: &Tensor) -> Result<Tensor> {
        let (b, t) = ids.dims2()?;
        let flat = ids.to_dtype(DType::U32)?.flatten_all()?;
        Ok(self
            .embed
            .index_select(&flat, 0)?
            .to_dtype(self.dtype)?
            .reshape((b, t, self.cfg.hidden_size))?)
    }

    fn forward_shared(
        &self,
        prompt: &Tensor,
        completions: &Tensor,
        mask: Option<&[u8]>,
        adapters: Adapters,
        checkpoints: Option<&Checkpoints>,
    ) -> Result<Hidden> {
        let (one, p) = prompt.dims2()?;
        let (g, c) = completions.dims2()?;
        if one != 1 || p == 0 || g == 0 || c == 0 {
            bail!(
                "forward: a shared prompt {:?} must be [1, P>0], its completions {:?} [G>0, C>0]",
                prompt.shape(),
                completions.shape()
            );
        }
        let real = mask::real_mask(mask, g, c)?;
        let stack = Stack::Shared {
            prompt: self.stream(mask::packed(&vec![1; p], 1, p, &self.device)?)?,
            completions: self.stream(mask::completions(&real, p, g, c, &self.device)?)?,
        };
        let xs = [self.embed(prompt)?, self.embed(completions)?];
        let [hp, hc] = self.run_stack(stack, xs, adapters, checkpoints)?;
        Ok(Hidden {
            rows: hc,
            prompt: Some(hp),
        })
    }

    /// Decoder layer `li` of `stack` on its streams' inputs `xs` (one per stream).
    fn stack_layer<const N: usize>(
        &self,
        li: usize,
        stack: &Stack,
        xs: &[Tensor; N],
        adapters: Adapters,
    ) -> Result<[Tensor; N]> {
        let block: &Block = &self.layers[li];
        let a = Adapters {
            layer: li,
            ..adapters
        };
        let out = match stack {
            Stack::Rows(s) => {
                let [q, k, v] = block.qkv(&xs[0], &s.cos, &s.sin, a)?;
                vec![block.finish(&xs[0], [&q, &k, &v], &s.mask, a)?]
            }
            Stack::Shared {
                prompt: ps,
                completions: cs,
            } => {
                let (xp, xc) = (&xs[0], &xs[N - 1]);
                // The completion stream draws its own dropout masks.
                let ca = match a.mode {
                    Mode::Train { dropout_seed } => Adapters {
                        mode: Mode::Train {
                            dropout_seed: dropout_seed ^ 0xC0DE_5EED_0000_0001,
                        },
                        ..a
                    },
                    _ => a,
                };
                let [qp, kp, vp] = block.qkv(xp, &ps.cos, &ps.sin, a)?;
                let [qc, kc, vc] = block.qkv(xc, &cs.cos, &cs.sin, ca)?;
                let kall = ops::prefix_cat(&kp, &kc, 2)?;
                let vall = ops::prefix_cat(&vp, &vc, 2)?;
                let xc = block.finish(xc, [&qc, &kall, &vall], &cs.mask, ca)?;
                let xp = block.finish(xp, [&qp, &kp, &vp], &ps.mask, a)?;
                vec![xp, xc]
            }
        };
        out.try_into()
            .map_err(|v: Vec<Tensor>| anyhow!("{} streams, expected {N}", v.len()))
    }

    /// Every decoder layer of `stack` on the embeddings `xs`, then the final norm. With
    /// `checkpoints`, each layer runs on a detached copy of its input (its graph freed
    /// as soon as it returns), the inputs are kept, and the last layer's outputs become
    /// variables the head's backward reaches; the forward is recorded for
    /// [`Checkpoints::backward`].
    fn run_stack<const N: usize>(
        &self,
        stack: Stack,
        mut xs: [Tensor; N],
        adapters: Adapters,
        checkpoints: Option<&Checkpoints>,
    ) -> Result<[Tensor; N]> {
        let norm = |x: &Tensor| ops::rms_norm(x, &self.norm, self.cfg.rms_norm_eps);
        let streams = |v: Vec<Tensor>| -> Result<[Tensor; N]> {
            v.try_into()
                .map_err(|v: Vec<Tensor>| anyhow!("{} streams, expected {N}", v.len()))
        };
        let Some(ck) = checkpoints else {
            for li in 0..self.layers.len() {
                xs = self.stack_layer(li, &stack, &xs, adapters)?;
            }
            return streams(xs.iter().map(norm).collect::<candle_core::Result<_>>()?);
        };
        let mut inputs = Vec::with_capacity(self.layers.len());
        for li in 0..self.layers.len() {
            let ys = self.stack_layer(li, &stack, &xs, adapters)?;
            inputs.push(std::mem::replace(&mut xs, ys.map(|y| y.detach())).to_vec());
        }
        let outputs = xs
            .iter()
            .map(Var::from_tensor)
            .collect::<candle_core::Result<Vec<_>>>()?;
        let out = outputs
            .iter()
            .map(|v| norm(v.as_tensor()))
            .collect::<candle_core::Result<_>>()?;
        let recorded = Box::new(Recorded { stack, adapters });
        ck.push(Segment::new(recorded, inputs, outputs));
        streams(out)
    }

    /// [`Input::Cached`]: append `ids` `[B, T]` as the cache's next columns.
    fn forward_cached(
        &self,
        ids: &Tensor,
        mask: Option<&[u8]>,
        cache: &mut KvCache,
        adapters: Adapters,
    ) -> Result<Tensor> {
        let (b, t) = ids.dims2()?;
        if b != cache.batch() {
            bail!("forward: {b} rows but the cache has {}", cache.batch());
        }
        let real = mask::real_mask(mask, b, t)?;
        let s = self.stream(cache.open(&real, t, &self.device)?)?;
        let mut x = self.embed(ids)?;
        for (li, block) in self.layers.iter().enumerate() {
            let a = Adapters {
                layer: li,
                ..adapters
            };
            let [q, k, v] = block.qkv(&x, &s.cos, &s.sin, a)?;
            let (k, v) = cache.append(li, &k, &v)?;
            x = block.finish(&x, [&q, &k, &v], &s.mask, a)?;
        }
        cache.commit(t);
        Ok(ops::rms_norm(&x, &self.norm, self.cfg.rms_norm_eps)?)
    }
}

impl Layers for Transformer {
    fn num_layers(&self) -> usize {
        self.layers.len()
    }

    fn rerun(&self, li: usize, forward: &dyn std::any::Any, xs: &[Tensor]) -> Result<Vec<Tensor>> {
        let r = forward
            .downcast_ref::<Recorded>()
            .context("checkpoint: a forward recorded by another model")?;
        Ok(match xs {
            [x] => self
                .stack_layer(li, &r.stack, std::array::from_ref(x), r.adapters)?
                .to_vec(),
            [a, b] => self
                .stack_layer(li, &r.stack, &[a.clone(), b.clone()], r.adapters)?
                .to_vec(),
            _ => bail!("checkpoint: {} streams", xs.len()),
        })
    }

    fn layer_lora_vars(&self, li: usize) -> Vec<&Var> {
        self.layers[li]
            .linears()
            .into_iter()
            .filter_map(|l| l.lora.as_ref())
            .flat_map(|l| [&l.a, &l.b])
            .collect()
    }
}

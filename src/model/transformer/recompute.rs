//! Activation checkpointing for the training forward (`[optim] gradient_checkpointing`,
//! TRL's name). candle has none built in; this is the standard construction:
//!
//! 1. forward: each decoder layer runs on a detached copy of its input, so its graph is
//!    freed as soon as it returns; only the layer inputs are kept, and the last layer's
//!    outputs become fresh variables that the head (final norm, log-probs, loss) is
//!    built on;
//! 2. `loss.backward()` stops at those variables;
//! 3. [`Checkpoints::backward`] walks the layers from the last: it recomputes the layer
//!    from its saved input (as a variable) with the graph, back-propagates
//!    `sum(output * grad_output.detach())` — whose gradient with respect to the output
//!    is `grad_output` — collects the layer's LoRA gradients, and passes the input's
//!    gradient down.
//!
//! Memory: every layer's input plus one layer's activations, instead of every layer's
//! activations; compute: about one more forward. Dropout masks are drawn from the same
//! seeds when a layer is recomputed, so the gradients equal the plain backward's up to
//! float rounding (`tests/memory.rs`).
use crate::model::ops;
use anyhow::{anyhow, Result};
use candle_core::backprop::GradStore;
use candle_core::{Tensor, Var};
use std::any::Any;

/// What recomputing needs from a model: its decoder layers, run again on saved
/// inputs. The model implements it; this file knows no model type, so the model's file
/// and this one do not import each other.
pub trait Layers {
    fn num_layers(&self) -> usize;
    /// Decoder layer `li` of the recorded forward `forward` on its streams' inputs `xs`.
    fn rerun(&self, li: usize, forward: &dyn Any, xs: &[Tensor]) -> Result<Vec<Tensor>>;
    /// The LoRA variables of layer `li`.
    fn layer_lora_vars(&self, li: usize) -> Vec<&Var>;
}

/// One checkpointed forward: what the model needs to run its layers again (its
/// streams and mode), its layers' saved inputs (detached) and the variables its last
/// layer's outputs became.
pub(super) struct Segment {
    forward: Box<dyn Any + Send>,
    inputs: Vec<Vec<Tensor>>,
    outputs: Vec<Var>,
}

impl Segment {
    pub(super) fn new(
        forward: Box<dyn Any + Send>,
        inputs: Vec<Vec<Tensor>>,
        outputs: Vec<Var>,
    ) -> Self {
        Segment {
            forward,
            inputs,
            outputs,
        }
    }

    /// Back-propagate one checkpointed forward: take its outputs' gradients out of
    /// `grads`, then from the last layer down recompute the layer from its saved input
    /// (made a variable unless it is the embedding, which needs no gradient) with the
    /// graph, back-propagate `sum(output * grad_output)` (whose gradient with respect to
    /// the output is `grad_output`), add the layer's LoRA gradients to `grads` and hand
    /// the input's gradient to the layer below.
    fn backward(self, model: &dyn Layers, grads: &mut GradStore) -> Result<()> {
        let Segment {
            forward,
            mut inputs,
            outputs,
        } = self;
        let mut gys: Vec<Option<Tensor>> = outputs
            .iter()
            .map(|v| grads.remove(v.as_tensor()))
            .collect();
        drop(outputs);
        for li in (0..model.num_layers()).rev() {
            let saved = inputs
                .pop()
                .ok_or_else(|| anyhow!("checkpoint: no saved input for layer {li}"))?;
            if gys.iter().all(Option::is_none) {
                break;
            }
            let vars: Vec<Var> = if li > 0 {
                saved
                    .iter()
                    .map(Var::from_tensor)
                    .collect::<candle_core::Result<_>>()?
            } else {
                Vec::new()
            };
            let xin: Vec<Tensor> = if li > 0 {
                vars.iter().map(|v| v.as_tensor().clone()).collect()
            } else {
                saved
            };
            let ys = model.rerun(li, forward.as_ref(), &xin)?;
            let mut surrogate: Option<Tensor> = None;
            for (y, g) in ys.iter().zip(&gys) {
                if let Some(g) = g {
                    let t = ops::mul(y, &g.detach())?.sum_all()?;
                    surrogate = Some(match surrogate {
                        Some(s) => (s + t)?,
                        None => t,
                    });
                }
            }
            let Some(surrogate) = surrogate else { break };
            let store = surrogate.backward()?;
            for var in model.layer_lora_vars(li) {
                if let Some(g) = store.get(var.as_tensor()) {
                    let sum = match grads.get(var.as_tensor()) {
                        Some(prev) => (prev + g)?,
                        None => g.clone(),
                    };
                    grads.insert(var.as_tensor(), sum);
                }
            }
            gys = vars
                .iter()
                .map(|v| store.get(v.as_tensor()).cloned())
                .collect();
        }
        Ok(())
    }
}

/// Activation checkpointing (`[optim] gradient_checkpointing`, candle has none built
/// in). Forwards run with [`super::Transformer::forward_checkpointed`] or
/// [`super::Transformer::forward_shared_prefix_checkpointed`] keep only each decoder layer's input
/// (`L` hidden-state tensors instead of every layer's activations) and are recorded
/// here. After `loss.backward()`, which stops at the last layer's output,
/// [`Checkpoints::backward`] recomputes the layers one at a time, last first, and
/// carries the gradient down through each: the same LoRA gradients as the plain
/// backward up to float rounding, for about one more forward of compute. Dropout masks
/// are drawn from the same seeds in the recomputation, so they match.
#[derive(Default)]
pub struct Checkpoints {
    segments: std::sync::Mutex<Vec<Segment>>,
}

impl Checkpoints {
    pub fn new() -> Self {
        Self::default()
    }

    pub(super) fn push(&self, seg: Segment) {
        // A poisoned lock only means another thread panicked mid-push: keep going.
        match self.segments.lock() {
            Ok(mut s) => s.push(seg),
            Err(p) => p.into_inner().push(seg),
        }
    }

    /// Forwards recorded and not yet back-propagated.
    pub fn len(&self) -> usize {
        self.segments.lock().map_or(0, |s| s.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Finish the backward of every recorded forward of `model`: `grads` is what
    /// `loss.backward()` returned; the gradients of the checkpointed outputs are taken
    /// out of it and every LoRA gradient is added to it. Consumes the records.
    pub fn backward(&self, model: &dyn Layers, grads: &mut GradStore) -> Result<()> {
        let segments = std::mem::take(
            &mut *self
                .segments
                .lock()
                .map_err(|_| anyhow!("checkpoints: poisoned lock"))?,
        );
        for seg in segments.into_iter().rev() {
            seg.backward(model, grads)?;
        }
        Ok(())
    }
}

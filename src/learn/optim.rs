//! AdamW with f32 state over candle `Var`s, global-norm gradient clipping and the
//! learning-rate schedules of transformers (`constant`, `linear`, `cosine`, each with
//! linear warmup), with safetensors save/load for checkpoints.
//!
//! Update (torch.optim.AdamW): `p -= lr * wd * p; m = b1 m + (1-b1) g;
//! v = b2 v + (1-b2) g^2; p -= lr * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps)`.
//! Parameters stored in bf16/f16 get an f32 master copy the update is applied to.
use crate::config::{OptimConfig, Schedule};
use anyhow::{bail, Context, Result};
use candle_core::{backprop::GradStore, DType, Device, Tensor, Var};
use std::collections::HashMap;
use std::path::Path;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamWParams {
    pub lr: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
}

impl AdamWParams {
    pub fn from_config(o: &OptimConfig) -> Self {
        Self {
            lr: o.learning_rate,
            beta1: o.betas[0],
            beta2: o.betas[1],
            eps: o.eps,
            weight_decay: o.weight_decay,
        }
    }
}

struct Slot {
    name: String,
    var: Var,
    /// f32 master copy when `var` is not f32.
    master: Option<Tensor>,
    m: Tensor,
    v: Tensor,
}

/// What [`AdamW::apply`] did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Applied {
    /// The global gradient norm before clipping.
    pub grad_norm: f64,
    /// The loss or the gradient was not finite: the parameters are untouched.
    pub skipped: bool,
}

/// AdamW over named variables.
pub struct AdamW {
    slots: Vec<Slot>,
    pub params: AdamWParams,
    /// Updates done so far (t in the bias corrections is step + 1).
    step: u64,
}

impl AdamW {
    pub fn new(vars: Vec<(String, Var)>, params: AdamWParams) -> Result<Self> {
        let mut slots = Vec::with_capacity(vars.len());
        for (name, var) in vars {
            let t = var.as_tensor();
            let zeros = Tensor::zeros(t.shape(), DType::F32, t.device())?;
            let master = if t.dtype() == DType::F32 {
                None
            } else {
                Some(t.to_dtype(DType::F32)?.detach())
            };
            slots.push(Slot {
                name,
                var,
                master,
                m: zeros.clone(),
                v: zeros,
            });
        }
        Ok(Self {
            slots,
            params,
            step: 0,
        })
    }

    pub fn set_lr(&mut self, lr: f64) {
        self.params.lr = lr;
    }

    /// Updates applied so far.
    pub fn step_count(&self) -> u64 {
        self.step
    }

    pub fn vars(&self) -> impl Iterator<Item = (&str, &Var)> {
        self.slots.iter().map(|s| (s.name.as_str(), &s.var))
    }

    /// Gradients of the variables from a backward pass, as f32 (zeros where a variable
    /// got no gradient), in the optimiser's order.
    pub fn grads_from(&self, store: &GradStore) -> Result<Vec<Tensor>> {
        self.slots
            .iter()
            .map(|s| match store.get(s.var.as_tensor()) {
                Some(g) => Ok(g.to_dtype(DType::F32)?),
                None => Ok(Tensor::zeros(
                    s.var.as_tensor().shape(),
                    DType::F32,
                    s.var.as_tensor().device(),
                )?),
            })
            .collect()
    }

    /// Add a backward pass's gradients into `acc` (gradient accumulation), kept in f64
    /// ([`summed`] turns the sums back into the f32 gradients [`Self::step`] takes). A
    /// sum of a few f32 values in f64 is exact, so the total does not depend on the
    /// order of the terms: in a data-parallel run each process sums its own micro-batches
    /// and the all-reduce adds the partial sums in another association than one process
    /// would, and in f32 that rounding, divided by a near-zero gradient's magnitude in
    /// AdamW's first steps, moved weights by up to 1e-4 of the largest one.
    pub fn accumulate(&self, acc: &mut Option<Vec<Tensor>>, store: &GradStore) -> Result<()> {
        let g = self
            .grads_from(store)?
            .iter()
            .map(|g| g.to_dtype(DType::F64))
            .collect::<candle_core::Result<Vec<_>>>()?;
        *acc = Some(match acc.take() {
            None => g,
            Some(a) => a
                .iter()
                .zip(g.iter())
                .map(|(x, y)| x + y)
                .collect::<candle_core::Result<Vec<_>>>()?,
        });
        Ok(())
    }

    /// One AdamW update with the given (already clipped) f32 gradients.
    pub fn step(&mut self, grads: &[Tensor]) -> Result<()> {
        if grads.len() != self.slots.len() {
            bail!(
                "{} gradients for {} parameters",
                grads.len(),
                self.slots.len()
            );
        }
        self.step += 1;
        let t = self.step as i32;
        let p = self.params;
        let bc1 = 1.0 - p.beta1.powi(t);
        let bc2 = 1.0 - p.beta2.powi(t);
        for (s, g) in self.slots.iter_mut().zip(grads) {
            let g = g.to_dtype(DType::F32)?;
            let theta = match &s.master {
                Some(m) => m.clone(),
                None => s.var.as_tensor().detach(),
            };
            let theta = if p.weight_decay > 0.0 {
                (&theta * (1.0 - p.lr * p.weight_decay))?
            } else {
                theta
            };
            s.m = ((&s.m * p.beta1)? + (&g * (1.0 - p.beta1))?)?;
            s.v = ((&s.v * p.beta2)? + (g.sqr()? * (1.0 - p.beta2))?)?;
            let m_hat = (&s.m / bc1)?;
            let v_hat = (&s.v / bc2)?;
            let upd = (m_hat / (v_hat.sqrt()? + p.eps)?)?;
            let new = (theta - (upd * p.lr)?)?;
            match &mut s.master {
                Some(m) => {
                    s.var.set(&new.to_dtype(s.var.as_tensor().dtype())?)?;
                    *m = new;
                }
                None => s.var.set(&new)?,
            }
        }
        Ok(())
    }

    /// Apply one update's accumulated gradients (`acc`, as [`AdamW::accumulate`] sums
    /// them): clip to `max_grad_norm`, then a step at `lr`, unless `loss_ok` is false
    /// or the norm is not finite (then the parameters are untouched).
    pub fn apply(
        &mut self,
        acc: &[Tensor],
        max_grad_norm: f64,
        lr: f64,
        loss_ok: bool,
    ) -> Result<Applied> {
        let mut grads = summed(acc)?;
        let grad_norm = clip_grad_norm(&mut grads, max_grad_norm)?;
        let skipped = !loss_ok || !grad_norm.is_finite();
        if !skipped {
            self.set_lr(lr);
            self.step(&grads)?;
        }
        Ok(Applied { grad_norm, skipped })
    }

    /// Optimiser state as named tensors (`NAME.exp_avg`, `NAME.exp_avg_sq`,
    /// `NAME.master`, `__step`).
    pub fn state_tensors(&self) -> Result<HashMap<String, Tensor>> {
        let mut out = HashMap::new();
        for s in &self.slots {
            out.insert(format!("{}.exp_avg", s.name), s.m.clone());
            out.insert(format!("{}.exp_avg_sq", s.name), s.v.clone());
            if let Some(m) = &s.master {
                out.insert(format!("{}.master", s.name), m.clone());
            }
        }
        out.insert(
            "__step".into(),
            Tensor::new(&[self.step as i64], &Device::Cpu)?,
        );
        Ok(out)
    }

    /// Save the state to a safetensors file (atomically).
    pub fn save(&self, path: &Path) -> Result<()> {
        let state = self.state_tensors()?;
        let state: HashMap<String, Tensor> = state
            .into_iter()
            .map(|(k, v)| Ok((k, v.to_device(&Device::Cpu)?)))
            .collect::<Result<_>>()?;
        crate::atomic::atomic_write(path, |tmp| {
            candle_core::safetensors::save(&state, tmp)?;
            Ok(())
        })
    }

    /// Restore the state saved by [`AdamW::save`] (the variables themselves are
    /// restored from the adapter; master copies from this file).
    pub fn load(&mut self, path: &Path) -> Result<()> {
        let dev = self
            .slots
            .first()
            .map(|s| s.var.as_tensor().device().clone())
            .unwrap_or(Device::Cpu);
        let st = candle_core::safetensors::load(path, &Device::Cpu)
            .with_context(|| format!("loading optimizer state {}", path.display()))?;
        let get = |k: &str| -> Result<Tensor> {
            st.get(k)
                .cloned()
                .with_context(|| format!("optimizer state {} lacks `{k}`", path.display()))
        };
        let step = get("__step")?.to_vec1::<i64>()?;
        let step = *step.first().context("empty __step")?;
        for s in &mut self.slots {
            let m = get(&format!("{}.exp_avg", s.name))?;
            if m.shape() != s.var.as_tensor().shape() {
                bail!(
                    "optimizer state for {} has shape {:?}, parameter {:?}",
                    s.name,
                    m.dims(),
                    s.var.as_tensor().dims()
                );
            }
            s.m = m.to_dtype(DType::F32)?.to_device(&dev)?;
            s.v = get(&format!("{}.exp_avg_sq", s.name))?
                .to_dtype(DType::F32)?
                .to_device(&dev)?;
            if s.master.is_some() {
                let m = get(&format!("{}.master", s.name))?
                    .to_dtype(DType::F32)?
                    .to_device(&dev)?;
                s.var.set(&m.to_dtype(s.var.as_tensor().dtype())?)?;
                s.master = Some(m);
            }
        }
        self.step = step.max(0) as u64;
        Ok(())
    }
}

/// The global L2 norm of all gradients (f64).
pub fn global_norm(grads: &[Tensor]) -> Result<f64> {
    let mut sq = 0.0f64;
    for g in grads {
        sq += g
            .to_dtype(DType::F32)?
            .sqr()?
            .sum_all()?
            .to_dtype(DType::F64)?
            .to_scalar::<f64>()?;
    }
    Ok(sq.sqrt())
}

/// Accumulated gradient sums (see [`AdamW::accumulate`]) as the f32 gradients that
/// [`clip_grad_norm`] and [`AdamW::step`] take.
pub fn summed(acc: &[Tensor]) -> Result<Vec<Tensor>> {
    Ok(acc
        .iter()
        .map(|t| t.to_dtype(DType::F32))
        .collect::<candle_core::Result<Vec<_>>>()?)
}

/// torch's `clip_grad_norm_`: scale by `max_norm / (norm + 1e-6)` when that is < 1.
/// Returns the norm before clipping. `max_norm <= 0` disables clipping.
pub fn clip_grad_norm(grads: &mut [Tensor], max_norm: f64) -> Result<f64> {
    let norm = global_norm(grads)?;
    if max_norm > 0.0 && norm.is_finite() {
        let coef = max_norm / (norm + 1e-6);
        if coef < 1.0 {
            for g in grads.iter_mut() {
                *g = (&*g * coef)?;
            }
        }
    }
    Ok(norm)
}

/// Whether every element of every gradient is finite.
pub fn all_finite(grads: &[Tensor]) -> Result<bool> {
    Ok(global_norm(grads)?.is_finite())
}

/// Learning rate as a function of the (0-based) step, as transformers' schedulers
/// give it for the update of that step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LrSchedule {
    pub base: f64,
    pub warmup_steps: usize,
    pub total_steps: usize,
    pub kind: Schedule,
}

impl LrSchedule {
    pub fn from_config(o: &OptimConfig, total_steps: usize) -> Self {
        Self {
            base: o.learning_rate,
            warmup_steps: o.warmup_steps,
            total_steps,
            kind: o.schedule,
        }
    }

    /// The multiplier of `base` at 0-based `step`.
    pub fn factor(&self, step: usize) -> f64 {
        let w = self.warmup_steps;
        if step < w {
            return step as f64 / w.max(1) as f64;
        }
        match self.kind {
            Schedule::Constant => 1.0,
            Schedule::Linear => {
                let rest = self.total_steps.saturating_sub(w).max(1) as f64;
                ((self.total_steps as f64 - step as f64) / rest).max(0.0)
            }
            Schedule::Cosine => {
                let rest = self.total_steps.saturating_sub(w).max(1) as f64;
                let progress = (step - w) as f64 / rest;
                (0.5 * (1.0 + (std::f64::consts::PI * progress).cos())).max(0.0)
            }
        }
    }

    pub fn lr(&self, step: usize) -> f64 {
        self.base * self.factor(step)
    }
}

//! One decoder layer, in boxes named like the checkpoint's tensors: [`Block`] holds an
//! [`Attention`] and an [`Mlp`], each built from [`Linear`]s (frozen weight, optional
//! bias, optional LoRA). Attention is split in two halves, [`Block::qkv`] and
//! [`Block::finish`], because the forward puts keys and values in a cache or joins a
//! shared prompt's between them.
use super::super::arch::ArchConfig;
use super::super::lora::{LoraLinear, LoraRun, LORA_TARGETS};
use super::super::ops::{self, BaseWeight};
use super::super::quant::QuantWeights;
use super::super::weights::{check_tensor, Weights};
use super::mode::Mode;
use anyhow::Result;
use candle_core::{DType, Tensor};

/// Where a model's frozen tensors come from: the dense map, and the quantized
/// projections of a quantized base (empty for a dense one).
#[derive(Clone, Copy)]
pub(crate) struct Base<'a> {
    pub(crate) dense: &'a Weights,
    pub(crate) quant: &'a QuantWeights,
}

/// The projection `name`: quantized when the base holds it so, else the dense tensor,
/// checked to have `shape` (and `dtype` when dense).
pub(super) fn base_weight(
    w: &Base,
    name: &str,
    shape: [usize; 2],
    dtype: DType,
) -> Result<BaseWeight> {
    match w.quant.get(name) {
        Some(q) if q.dims() != (shape[0], shape[1]) => {
            anyhow::bail!("tensor {name} has shape {:?}, expected {shape:?}", q.dims())
        }
        Some(q) => Ok(BaseWeight::Quant(q.clone())),
        None => Ok(BaseWeight::Dense(check_tensor(
            w.dense, name, &shape, dtype,
        )?)),
    }
}

/// A frozen projection `x W^T (+ b)`, with a LoRA adapter when one is attached.
#[derive(Debug, Clone)]
pub(super) struct Linear {
    pub(super) w: BaseWeight,
    pub(super) b: Option<Tensor>,
    pub(super) lora: Option<LoraLinear>,
}

impl Linear {
    fn load(w: &Base, name: &str, shape: [usize; 2], bias: bool, dtype: DType) -> Result<Self> {
        let wname = format!("{name}.weight");
        Ok(Linear {
            w: base_weight(w, &wname, shape, dtype)?,
            b: if bias {
                Some(check_tensor(
                    w.dense,
                    &format!("{name}.bias"),
                    &shape[..1],
                    dtype,
                )?)
            } else {
                None
            },
            lora: None,
        })
    }

    fn forward(&self, x: &Tensor, run: Option<LoraRun>) -> candle_core::Result<Tensor> {
        match (&self.lora, run) {
            (Some(l), Some(run)) => l.forward(x, &self.w, self.b.as_ref(), run),
            _ => ops::base_linear(x, &self.w, self.b.as_ref()),
        }
    }
}

/// How the adapters of one layer run in one forward: off (`None` for every module) or
/// with the mode's graph and dropout. Each module gets its own dropout stream.
#[derive(Debug, Clone, Copy)]
pub(super) struct Adapters {
    pub(super) on: bool,
    pub(super) mode: Mode,
    pub(super) layer: usize,
}

impl Adapters {
    /// The run of module `m` (its index in [`LORA_TARGETS`]).
    fn run(&self, m: usize) -> Option<LoraRun> {
        if !self.on {
            return None;
        }
        Some(match self.mode {
            Mode::Detached => LoraRun {
                detached: true,
                dropout_seed: None,
            },
            Mode::Grad => LoraRun {
                detached: false,
                dropout_seed: None,
            },
            Mode::Train { dropout_seed } => LoraRun {
                detached: false,
                dropout_seed: Some(
                    dropout_seed
                        ^ ((self.layer * LORA_TARGETS.len() + m + 1) as u64)
                            .wrapping_mul(0x9E37_79B9_7F4A_7C15),
                ),
            },
        })
    }
}

/// Self-attention: q/k/v/o projections, Qwen3's per-head q/k norms, GQA.
#[derive(Debug, Clone)]
pub(super) struct Attention {
    pub(super) q_proj: Linear,
    pub(super) k_proj: Linear,
    pub(super) v_proj: Linear,
    pub(super) o_proj: Linear,
    q_norm: Option<Tensor>,
    k_norm: Option<Tensor>,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    eps: f64,
}

impl Attention {
    fn load(cfg: &ArchConfig, w: &Base, p: &str, dtype: DType) -> Result<Self> {
        let (h, d) = (cfg.hidden_size, cfg.head_dim);
        let (q, kv) = (cfg.num_attention_heads * d, cfg.num_key_value_heads * d);
        let lin = |m: &str, shape, bias| Linear::load(w, &format!("{p}.{m}"), shape, bias, dtype);
        let norm = |m: &str| check_tensor(w.dense, &format!("{p}.{m}.weight"), &[d], dtype);
        let qk_norm = cfg.family.qk_norm();
        Ok(Attention {
            q_proj: lin("q_proj", [q, h], cfg.qkv_bias())?,
            k_proj: lin("k_proj", [kv, h], cfg.qkv_bias())?,
            v_proj: lin("v_proj", [kv, h], cfg.qkv_bias())?,
            o_proj: lin("o_proj", [h, q], cfg.o_bias())?,
            q_norm: qk_norm.then(|| norm("q_norm")).transpose()?,
            k_norm: qk_norm.then(|| norm("k_norm")).transpose()?,
            heads: cfg.num_attention_heads,
            kv_heads: cfg.num_key_value_heads,
            head_dim: d,
            eps: cfg.rms_norm_eps,
        })
    }

    /// `[B, T, heads * D]` -> `[B, heads, T, D]`, head-normed first when the family
    /// normalises (Qwen3 normalises before RoPE, over each head's D).
    fn heads_of(&self, x: &Tensor, heads: usize, norm: Option<&Tensor>) -> Result<Tensor> {
        let (b, t, _) = x.dims3()?;
        let x = x.reshape((b, t, heads, self.head_dim))?;
        let x = match norm {
            Some(w) => ops::rms_norm(&x, w, self.eps)?,
            None => x,
        };
        Ok(x.transpose(1, 2)?.contiguous()?)
    }

    /// Normed input `h` `[B, T, H]` -> RoPE'd `q` `[B, NH, T, D]`, RoPE'd `k` and `v`
    /// `[B, KVH, T, D]`.
    fn qkv(&self, h: &Tensor, cos: &Tensor, sin: &Tensor, a: Adapters) -> Result<[Tensor; 3]> {
        let q = self.q_proj.forward(h, a.run(0))?;
        let k = self.k_proj.forward(h, a.run(1))?;
        let v = self.v_proj.forward(h, a.run(2))?;
        let q = self.heads_of(&q, self.heads, self.q_norm.as_ref())?;
        let k = self.heads_of(&k, self.kv_heads, self.k_norm.as_ref())?;
        let v = self.heads_of(&v, self.kv_heads, None)?;
        Ok([ops::rope(&q, cos, sin)?, ops::rope(&k, cos, sin)?, v])
    }

    /// Attention of `q` `[B, NH, T, D]` over `k`, `v` `[B, KVH, Tk, D]` under the
    /// additive `mask` `[B, 1, 1, T, Tk]` (the query heads of one KV head share a
    /// matmul), then o_proj.
    fn attend(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        mask: &Tensor,
        a: Adapters,
    ) -> Result<Tensor> {
        let (b, nh, t, hd) = q.dims4()?;
        let g = nh / self.kv_heads;
        let scale = 1.0 / (hd as f64).sqrt();
        let q = q.reshape((b, self.kv_heads, g * t, hd))?;
        let scores = ops::matmul(&q, &k.t()?)?;
        let p = ops::masked_softmax(&scores, mask, scale)?;
        let o = ops::matmul(&p, v)?
            .reshape((b, nh, t, hd))?
            .transpose(1, 2)?
            .contiguous()?
            .reshape((b, t, nh * hd))?;
        Ok(self.o_proj.forward(&o, a.run(3))?)
    }
}

/// SwiGLU: `down(silu(gate(x)) * up(x))`.
#[derive(Debug, Clone)]
pub(super) struct Mlp {
    pub(super) gate_proj: Linear,
    pub(super) up_proj: Linear,
    pub(super) down_proj: Linear,
}

impl Mlp {
    fn load(cfg: &ArchConfig, w: &Base, p: &str, dtype: DType) -> Result<Self> {
        let (h, i) = (cfg.hidden_size, cfg.intermediate_size);
        let lin = |m: &str, shape| Linear::load(w, &format!("{p}.{m}"), shape, false, dtype);
        Ok(Mlp {
            gate_proj: lin("gate_proj", [i, h])?,
            up_proj: lin("up_proj", [i, h])?,
            down_proj: lin("down_proj", [h, i])?,
        })
    }

    fn forward(&self, x: &Tensor, a: Adapters) -> Result<Tensor> {
        let gate = self.gate_proj.forward(x, a.run(4))?;
        let up = self.up_proj.forward(x, a.run(5))?;
        Ok(self
            .down_proj
            .forward(&ops::silu_mul(&gate, &up)?, a.run(6))?)
    }
}

/// A pre-norm decoder layer: `x + attn(norm(x))`, then `x + mlp(norm(x))`.
#[derive(Debug, Clone)]
pub(super) struct Block {
    input_layernorm: Tensor,
    pub(super) self_attn: Attention,
    post_attention_layernorm: Tensor,
    pub(super) mlp: Mlp,
    eps: f64,
}

impl Block {
    pub(super) fn load(cfg: &ArchConfig, w: &Base, layer: usize, dtype: DType) -> Result<Self> {
        let p = format!("model.layers.{layer}");
        let h = [cfg.hidden_size];
        Ok(Block {
            input_layernorm: check_tensor(
                w.dense,
                &format!("{p}.input_layernorm.weight"),
                &h,
                dtype,
            )?,
            self_attn: Attention::load(cfg, w, &format!("{p}.self_attn"), dtype)?,
            post_attention_layernorm: check_tensor(
                w.dense,
                &format!("{p}.post_attention_layernorm.weight"),
                &h,
                dtype,
            )?,
            mlp: Mlp::load(cfg, w, &format!("{p}.mlp"), dtype)?,
            eps: cfg.rms_norm_eps,
        })
    }

    /// The seven projections in [`LORA_TARGETS`] order.
    pub(super) fn linears(&self) -> [&Linear; 7] {
        let (a, m) = (&self.self_attn, &self.mlp);
        [
            &a.q_proj,
            &a.k_proj,
            &a.v_proj,
            &a.o_proj,
            &m.gate_proj,
            &m.up_proj,
            &m.down_proj,
        ]
    }

    pub(super) fn linears_mut(&mut self) -> [&mut Linear; 7] {
        let (a, m) = (&mut self.self_attn, &mut self.mlp);
        [
            &mut a.q_proj,
            &mut a.k_proj,
            &mut a.v_proj,
            &mut a.o_proj,
            &mut m.gate_proj,
            &mut m.up_proj,
            &mut m.down_proj,
        ]
    }

    /// The layer's attention inputs from its input `x` `[B, T, H]`.
    pub(super) fn qkv(
        &self,
        x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        a: Adapters,
    ) -> Result<[Tensor; 3]> {
        let h = ops::rms_norm(x, &self.input_layernorm, self.eps)?;
        self.self_attn.qkv(&h, cos, sin, a)
    }

    /// The rest of the layer once its keys and values are known: attention, residual,
    /// MLP, residual.
    pub(super) fn finish(
        &self,
        x: &Tensor,
        [q, k, v]: [&Tensor; 3],
        mask: &Tensor,
        a: Adapters,
    ) -> Result<Tensor> {
        let x = ops::add(x, &self.self_attn.attend(q, k, v, mask, a)?)?;
        let h = ops::rms_norm(&x, &self.post_attention_layernorm, self.eps)?;
        Ok(ops::add(&x, &self.mlp.forward(&h, a)?)?)
    }
}

//! Our own Qwen2 (Qwen2ForCausalLM), built from differentiable ops so LoRA trains.
//!
//! Numerics follow Hugging Face transformers: RMSNorm in f32 (weight applied after the
//! cast back), RoPE tables computed in f32 (`rotate_half` convention), attention softmax
//! in f32, logits in the model dtype then cast to f32.
//!
//! # Usage
//! ```ignore
//! let model = Qwen2::new(&cfg, &weights, Some(&LoraConfig::default()))?;
//! // Training: hidden states with a graph to the LoRA vars, then chunked log-probs.
//! let hidden = model.forward(&ids, Some(&mask), Mode::Train { dropout_seed: step })?;
//! let lp = model.token_logprobs(&hidden.narrow(1, p - 1, c)?, &targets, 1.0, true)?;
//! let grads = loss(lp.logprobs).backward()?; // holds only LoRA vars
//! // One GRPO group: its prompt [1, P] once, the G completions [G, C] against its K/V.
//! let (h_prompt, h_comp) = model.forward_shared_prefix(&prompt, &comps, Some(&cmask), mode)?;
//! // Activation checkpointing: keep only layer inputs, recompute them in the backward.
//! let ck = Checkpoints::new();
//! let hidden = model.forward_checkpointed(&ids, Some(&mask), mode, &ck)?;
//! let mut grads = loss(model.token_logprobs(&hidden, &targets, 1.0, false)?).backward()?;
//! ck.backward(&model, &mut grads)?; // adds every LoRA gradient to `grads`
//! // Reference policy: the same model with the adapter off, no graph.
//! model.set_adapter_enabled(false);
//! let ref_hidden = model.forward(&ids, Some(&mask), Mode::Detached)?;
//! model.set_adapter_enabled(true);
//! // Sampling: prefill P prompts once, repeat each prompt's rows G times, decode.
//! let mut cache = model.new_cache(p, max_len)?;
//! let h = model.forward_cached(&prompt_ids, Some(&prompt_mask), &mut cache)?; // left-padded
//! let mut cache = cache.repeat_rows(g)?; // rows: p0 x G, p1 x G, ...
//! let logits = model.last_logits(&h)?; // [P, V] (repeat with Tensor::index_select too)
//! let h = model.forward_cached(&next_ids /* [P*G, 1] */, None, &mut cache)?;
//! ```
use super::lora::{self, LoraConfig, LoraLinear, LoraRun, LORA_TARGETS};
use super::ops;
pub use super::recompute::Checkpoints;
use super::recompute::{Layers, Segment};
use anyhow::{anyhow, bail, Context, Result};
use candle_core::{DType, Device, Tensor, Var};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

/// Architecture hyper-parameters, normalised from either config.json dialect
/// (transformers 4.x top-level `rope_theta`, or 5.x `rope_parameters`) by `load.rs`.
#[derive(Debug, Clone, PartialEq)]
pub struct Qwen2Config {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    /// hidden_size / num_attention_heads unless config.json says otherwise.
    pub head_dim: usize,
    pub max_position_embeddings: usize,
    pub rope_theta: f64,
    pub rms_norm_eps: f64,
    pub tie_word_embeddings: bool,
}

/// Bounds on a model's shape, far beyond any released Qwen2 (72B: 80 layers, hidden
/// 8,192, intermediate 29,568, vocab 152,064): a config past them is corrupt or hostile,
/// and listing or allocating its tensors would exhaust memory before any check on them.
const MAX_LAYERS: usize = 1024;
const MAX_WIDTH: usize = 1 << 18;
const MAX_VOCAB: usize = 1 << 22;
const MAX_HEADS: usize = 1024;

impl Qwen2Config {
    /// Weights of the model: embedding, layers, final norm, and `lm_head` when untied.
    /// (Within [`Self::validate`]'s bounds this cannot overflow.)
    pub fn parameters(&self) -> u64 {
        let [h, i, v] =
            [self.hidden_size, self.intermediate_size, self.vocab_size].map(|x| x as u64);
        let q = (self.num_attention_heads * self.head_dim) as u64;
        let kv = (self.num_key_value_heads * self.head_dim) as u64;
        let attention = (q * h + q) + 2 * (kv * h + kv) + h * q;
        let layer = attention + 3 * h * i + 2 * h;
        let heads = if self.tie_word_embeddings { 1 } else { 2 };
        heads * v * h + self.num_hidden_layers as u64 * layer + h
    }

    /// A tiny config for tests (hidden 64, 2 layers, 4/2 heads, vocab 512).
    pub fn tiny() -> Self {
        Qwen2Config {
            vocab_size: 512,
            hidden_size: 64,
            intermediate_size: 128,
            num_hidden_layers: 2,
            num_attention_heads: 4,
            num_key_value_heads: 2,
            head_dim: 16,
            max_position_embeddings: 4096,
            rope_theta: 1_000_000.0,
            rms_norm_eps: 1e-6,
            tie_word_embeddings: true,
        }
    }

    /// Qwen2.5-0.5B's shape (benchmarks).
    pub fn qwen25_05b() -> Self {
        Qwen2Config {
            vocab_size: 151_936,
            hidden_size: 896,
            intermediate_size: 4864,
            num_hidden_layers: 24,
            num_attention_heads: 14,
            num_key_value_heads: 2,
            head_dim: 64,
            max_position_embeddings: 32768,
            rope_theta: 1_000_000.0,
            rms_norm_eps: 1e-6,
            tie_word_embeddings: true,
        }
    }

    pub fn validate(&self) -> Result<()> {
        let c = self;
        if c.vocab_size == 0 || c.hidden_size == 0 || c.num_hidden_layers == 0 {
            bail!("config: vocab_size, hidden_size and num_hidden_layers must be > 0");
        }
        for (key, v, max) in [
            ("num_hidden_layers", c.num_hidden_layers, MAX_LAYERS),
            ("hidden_size", c.hidden_size, MAX_WIDTH),
            ("intermediate_size", c.intermediate_size, MAX_WIDTH),
            ("vocab_size", c.vocab_size, MAX_VOCAB),
            ("num_attention_heads", c.num_attention_heads, MAX_HEADS),
            ("head_dim", c.head_dim, MAX_HEADS),
        ] {
            if v > max {
                bail!("config: {key} = {v} is past any real model (at most {max})");
            }
        }
        if c.num_attention_heads == 0
            || c.num_key_value_heads == 0
            || !c.num_attention_heads.is_multiple_of(c.num_key_value_heads)
        {
            bail!(
                "config: num_attention_heads ({}) must be a positive multiple of num_key_value_heads ({})",
                c.num_attention_heads,
                c.num_key_value_heads
            );
        }
        if c.head_dim == 0 || !c.head_dim.is_multiple_of(2) {
            bail!("config: head_dim must be even and > 0 (got {})", c.head_dim);
        }
        Ok(())
    }

    /// Every expected tensor name with its shape (`lm_head.weight` only when untied).
    pub fn tensor_shapes(&self) -> Vec<(String, Vec<usize>)> {
        let (h, i, v) = (self.hidden_size, self.intermediate_size, self.vocab_size);
        let q = self.num_attention_heads * self.head_dim;
        let kv = self.num_key_value_heads * self.head_dim;
        let mut out = vec![("model.embed_tokens.weight".to_string(), vec![v, h])];
        for l in 0..self.num_hidden_layers {
            let p = format!("model.layers.{l}");
            out.push((format!("{p}.input_layernorm.weight"), vec![h]));
            out.push((format!("{p}.post_attention_layernorm.weight"), vec![h]));
            out.push((format!("{p}.self_attn.q_proj.weight"), vec![q, h]));
            out.push((format!("{p}.self_attn.q_proj.bias"), vec![q]));
            out.push((format!("{p}.self_attn.k_proj.weight"), vec![kv, h]));
            out.push((format!("{p}.self_attn.k_proj.bias"), vec![kv]));
            out.push((format!("{p}.self_attn.v_proj.weight"), vec![kv, h]));
            out.push((format!("{p}.self_attn.v_proj.bias"), vec![kv]));
            out.push((format!("{p}.self_attn.o_proj.weight"), vec![h, q]));
            out.push((format!("{p}.mlp.gate_proj.weight"), vec![i, h]));
            out.push((format!("{p}.mlp.up_proj.weight"), vec![i, h]));
            out.push((format!("{p}.mlp.down_proj.weight"), vec![h, i]));
        }
        out.push(("model.norm.weight".to_string(), vec![h]));
        if !self.tie_word_embeddings {
            out.push(("lm_head.weight".to_string(), vec![v, h]));
        }
        out
    }
}

/// Model tensors by Hugging Face name, already in the target dtype and device.
pub type Weights = HashMap<String, Tensor>;

/// Hugging-Face-like random init: normal(0, 0.02) for matrices and biases, ones for
/// norms. Deterministic in `seed` (our ChaCha RNG, not candle's).
pub fn random_weights(
    cfg: &Qwen2Config,
    seed: u64,
    dtype: DType,
    device: &Device,
) -> Result<Weights> {
    cfg.validate()?;
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut w = Weights::new();
    for (name, shape) in cfg.tensor_shapes() {
        let n: usize = shape.iter().product();
        let vals: Vec<f32> = if name.ends_with("layernorm.weight") || name == "model.norm.weight" {
            vec![1.0; n]
        } else {
            (0..n).map(|_| 0.02 * normal(&mut rng)).collect()
        };
        let t = Tensor::from_vec(vals, shape, device)?.to_dtype(dtype)?;
        w.insert(name, t);
    }
    Ok(w)
}

/// A standard normal sample (Box-Muller) from our seeded RNG.
pub fn normal(rng: &mut ChaCha8Rng) -> f32 {
    let u1: f64 = rng.gen::<f64>().max(1e-300);
    let u2: f64 = rng.gen();
    ((-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()) as f32
}

/// How a forward pass runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// No graph at all (sampling, reference log-probs, old log-probs): every tensor is
    /// detached, nothing is recorded, no dropout.
    Detached,
    /// Record the graph to the LoRA vars, no dropout (evaluation with gradients).
    Grad,
    /// Record the graph and apply LoRA dropout with masks drawn from `dropout_seed`.
    Train { dropout_seed: u64 },
}

#[derive(Debug, Clone)]
struct Linear {
    w: Tensor,
    b: Option<Tensor>,
    lora: Option<LoraLinear>,
}

impl Linear {
    fn forward(&self, x: &Tensor, run: Option<LoraRun>) -> candle_core::Result<Tensor> {
        match (&self.lora, run) {
            (Some(l), Some(run)) => l.forward(x, &self.w, self.b.as_ref(), run),
            _ => ops::frozen_linear(x, &self.w, self.b.as_ref()),
        }
    }
}

#[derive(Debug, Clone)]
struct Layer {
    ln1: Tensor,
    ln2: Tensor,
    /// q, k, v, o, gate, up, down (the order of [`LORA_TARGETS`]).
    lin: [Linear; 7],
}

/// Log-probs of target tokens (and optionally the entropy of the distribution).
#[derive(Debug, Clone)]
pub struct TokenLogProbs {
    /// `[B, T]` f32, differentiable w.r.t. the LoRA vars when the hidden states are.
    pub logprobs: Tensor,
    /// `[B, T]` f32 entropy of `softmax(logits / temperature)`, detached.
    pub entropy: Option<Tensor>,
}

/// Default number of positions per chunk in [`Qwen2::token_logprobs`]: about 64M logits
/// (256 MB in f32). Each chunk streams the whole LM head through the matmul (and GEMM
/// packs it: 545 MB for Qwen2.5-0.5B), three times per training step, so fewer, larger
/// chunks are much faster: 16M-logit chunks cost about 3 s more per 8 x 160 step.
pub fn default_logprob_chunk(vocab: usize) -> usize {
    ((1usize << 26) / vocab.max(1)).clamp(1, 4096)
}

/// Qwen2ForCausalLM with optional LoRA adapters.
pub struct Qwen2 {
    cfg: Qwen2Config,
    embed: Tensor,
    lm_head: Tensor,
    norm: Tensor,
    layers: Vec<Layer>,
    lora: Option<LoraConfig>,
    adapter_enabled: AtomicBool,
    inv_freq: Vec<f32>,
    device: Device,
    dtype: DType,
    /// Positions per chunk in the log-prob head (memory: chunk x vocab f32).
    pub logprob_chunk: usize,
}

/// What every decoder layer of one stream needs besides its input: RoPE tables
/// `[B, T, head_dim/2]` and the additive mask `[B, 1, 1, T, Tk]`.
pub(super) struct StreamCtx {
    cos: Tensor,
    sin: Tensor,
    mask: Tensor,
}

/// The streams one training forward runs through the decoder layers.
pub(super) enum Stack {
    /// Packed rows ([`Qwen2::forward`]).
    Packed(StreamCtx),
    /// A shared prompt and its completions, which attend to the prompt's keys/values
    /// ([`Qwen2::forward_shared_prefix`]).
    Shared {
        prompt: StreamCtx,
        completions: StreamCtx,
    },
}

/// A checkpointed forward as [`Checkpoints`] records it: its streams and mode.
struct Recorded {
    stack: Stack,
    mode: Mode,
}

impl Layers for Qwen2 {
    fn num_layers(&self) -> usize {
        self.layers.len()
    }

    fn rerun(&self, li: usize, forward: &dyn std::any::Any, xs: &[Tensor]) -> Result<Vec<Tensor>> {
        let r = forward
            .downcast_ref::<Recorded>()
            .context("checkpoint: a forward recorded by another model")?;
        Ok(match xs {
            [x] => self
                .stack_layer(li, &r.stack, std::array::from_ref(x), r.mode)?
                .to_vec(),
            [a, b] => self
                .stack_layer(li, &r.stack, &[a.clone(), b.clone()], r.mode)?
                .to_vec(),
            _ => bail!("checkpoint: {} streams", xs.len()),
        })
    }

    fn layer_lora_vars(&self, li: usize) -> Vec<&Var> {
        self.layers[li]
            .lin
            .iter()
            .filter_map(|l| l.lora.as_ref())
            .flat_map(|l| [&l.a, &l.b])
            .collect()
    }
}

/// Additive mask value for disallowed keys (like transformers' `finfo.min`).
const MASKED: f32 = f32::MIN;

/// A preallocated KV cache (per layer `[B, KVH, max_len, head_dim]`), appended in place.
///
/// Columns are shared by all rows: a call to [`Qwen2::forward_cached`] with `[B, T]`
/// ids writes columns `len..len+T`; a padded entry (mask 0) occupies its column but is
/// never attended to. Per row, the cache tracks the next RoPE position (the number of
/// real tokens so far), so left-padded prompts and rows that feed padding after they
/// finished keep correct positions.
#[derive(Debug, Clone)]
pub struct KvCache {
    k: Vec<Tensor>,
    v: Vec<Tensor>,
    batch: usize,
    max_len: usize,
    len: usize,
    /// `[batch * max_len]`: 1 where the column holds a real token.
    key_valid: Vec<u8>,
    /// `[batch]`: position of the next real token of each row.
    next_pos: Vec<u32>,
}

impl KvCache {
    pub fn batch(&self) -> usize {
        self.batch
    }
    pub fn max_len(&self) -> usize {
        self.max_len
    }
    /// Columns written so far.
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Per row: the RoPE position the next real token will get.
    pub fn next_positions(&self) -> &[u32] {
        &self.next_pos
    }

    /// A new cache made of the given rows of this one, in that order; rows may repeat
    /// (expand a prompt's prefill to G completions) or be dropped (finished rows).
    pub fn select_rows(&self, rows: &[usize]) -> Result<KvCache> {
        if let Some(&r) = rows.iter().find(|&&r| r >= self.batch) {
            bail!(
                "KvCache::select_rows: row {r} out of range (batch {})",
                self.batch
            );
        }
        let dev = self
            .k
            .first()
            .map(|t| t.device().clone())
            .unwrap_or(Device::Cpu);
        let idx: Vec<u32> = rows.iter().map(|&r| r as u32).collect();
        let idx = Tensor::from_vec(idx, rows.len(), &dev)?;
        let sel = |ts: &[Tensor]| -> Result<Vec<Tensor>> {
            ts.iter()
                .map(|t| Ok(t.index_select(&idx, 0)?))
                .collect::<Result<Vec<_>>>()
        };
        let mut key_valid = Vec::with_capacity(rows.len() * self.max_len);
        for &r in rows {
            key_valid.extend_from_slice(&self.key_valid[r * self.max_len..(r + 1) * self.max_len]);
        }
        Ok(KvCache {
            k: sel(&self.k)?,
            v: sel(&self.v)?,
            batch: rows.len(),
            max_len: self.max_len,
            len: self.len,
            key_valid,
            next_pos: rows.iter().map(|&r| self.next_pos[r]).collect(),
        })
    }

    /// The same cache with room for `extra` more columns (the written columns copied):
    /// multi-turn sampling grows it when an environment turn does not fit.
    pub fn grow(&self, extra: usize) -> Result<KvCache> {
        let ml = self.max_len + extra;
        let pad = |t: &Tensor| -> Result<Tensor> {
            let (b, h, _, d) = t.dims4()?;
            let z = Tensor::zeros((b, h, extra, d), t.dtype(), t.device())?;
            Ok(Tensor::cat(&[t, &z], 2)?)
        };
        let mut key_valid = vec![0u8; self.batch * ml];
        for r in 0..self.batch {
            key_valid[r * ml..r * ml + self.max_len]
                .copy_from_slice(&self.key_valid[r * self.max_len..(r + 1) * self.max_len]);
        }
        Ok(KvCache {
            k: self.k.iter().map(pad).collect::<Result<_>>()?,
            v: self.v.iter().map(pad).collect::<Result<_>>()?,
            batch: self.batch,
            max_len: ml,
            len: self.len,
            key_valid,
            next_pos: self.next_pos.clone(),
        })
    }

    /// Real (unmasked) columns of the fullest row.
    pub fn max_real_columns(&self) -> usize {
        (0..self.batch)
            .map(|r| {
                self.key_valid[r * self.max_len..r * self.max_len + self.len]
                    .iter()
                    .filter(|&&v| v != 0)
                    .count()
            })
            .max()
            .unwrap_or(0)
    }

    /// The same cache with every row's real columns moved to the left, in order, and
    /// the masked ones dropped (`len` becomes the fullest row's count): rows that
    /// appended different numbers of tokens at different steps waste columns, and this
    /// gives them back. Attention is unchanged (keys keep their RoPE positions and
    /// order; masked keys were never attended to).
    pub fn compact(&self) -> Result<KvCache> {
        let ml = self.max_len;
        let len = self.max_real_columns();
        let dev = self
            .k
            .first()
            .map(|t| t.device().clone())
            .unwrap_or(Device::Cpu);
        let mut idx = Vec::with_capacity(self.batch * len);
        let mut key_valid = vec![0u8; self.batch * ml];
        for r in 0..self.batch {
            let real: Vec<usize> = (0..self.len)
                .filter(|&j| self.key_valid[r * ml + j] != 0)
                .collect();
            for c in 0..len {
                // padding columns repeat column 0 (masked anyway)
                let j = real.get(c).copied().unwrap_or(0);
                idx.push((r * ml + j) as u32);
                key_valid[r * ml + c] = u8::from(c < real.len());
            }
        }
        let idx = Tensor::from_vec(idx, self.batch * len, &dev)?;
        let pack = |t: &Tensor| -> Result<Tensor> {
            let (b, h, _, d) = t.dims4()?;
            let rows = t.transpose(1, 2)?.contiguous()?.reshape((b * ml, h * d))?;
            let kept = rows.index_select(&idx, 0)?.reshape((b, len, h, d))?;
            let z = Tensor::zeros((b, ml - len, h, d), t.dtype(), t.device())?;
            Ok(Tensor::cat(&[&kept, &z], 1)?
                .transpose(1, 2)?
                .contiguous()?)
        };
        Ok(KvCache {
            k: self.k.iter().map(pack).collect::<Result<_>>()?,
            v: self.v.iter().map(pack).collect::<Result<_>>()?,
            batch: self.batch,
            max_len: ml,
            len,
            key_valid,
            next_pos: self.next_pos.clone(),
        })
    }

    /// Row `r`'s real columns, in order: its keys and values to seed a later cache
    /// ([`Qwen2::cache_from_prefixes`]) that continues the same token sequence.
    pub fn row_real(&self, r: usize) -> Result<RowKv> {
        if r >= self.batch {
            bail!(
                "KvCache::row_real: row {r} out of range (batch {})",
                self.batch
            );
        }
        let ml = self.max_len;
        let cols: Vec<u32> = (0..self.len)
            .filter(|&j| self.key_valid[r * ml + j] != 0)
            .map(|j| j as u32)
            .collect();
        let n = cols.len();
        let dev = self
            .k
            .first()
            .map(|t| t.device().clone())
            .unwrap_or(Device::Cpu);
        let idx = Tensor::from_vec(cols, n, &dev)?;
        let take = |ts: &[Tensor]| -> Result<Vec<Tensor>> {
            ts.iter()
                .map(|t| Ok(t.narrow(0, r, 1)?.index_select(&idx, 2)?))
                .collect()
        };
        Ok(RowKv {
            k: take(&self.k)?,
            v: take(&self.v)?,
            len: n,
        })
    }

    /// Each row repeated `g` times consecutively: rows `[0,0,..,1,1,..]`.
    pub fn repeat_rows(&self, g: usize) -> Result<KvCache> {
        let rows: Vec<usize> = (0..self.batch)
            .flat_map(|r| std::iter::repeat_n(r, g))
            .collect();
        self.select_rows(&rows)
    }
}

/// One row's cached keys and values (per layer `[1, KVH, len, head_dim]`, positions
/// `0..len`), taken with [`KvCache::row_real`].
#[derive(Debug, Clone)]
pub struct RowKv {
    k: Vec<Tensor>,
    v: Vec<Tensor>,
    len: usize,
}

impl RowKv {
    /// Tokens (columns) held.
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Bytes its keys and values take.
    pub fn bytes(&self) -> usize {
        self.k
            .iter()
            .chain(&self.v)
            .map(|t| t.elem_count() * t.dtype().size_in_bytes())
            .sum()
    }
}

fn check_tensor(w: &Weights, name: &str, shape: &[usize], dtype: DType) -> Result<Tensor> {
    let t = w
        .get(name)
        .ok_or_else(|| anyhow!("missing tensor {name} (expected shape {shape:?})"))?;
    if t.dims() != shape {
        bail!("tensor {name} has shape {:?}, expected {shape:?}", t.dims());
    }
    if t.dtype() != dtype {
        bail!(
            "tensor {name} has dtype {:?}, expected {dtype:?} (like model.embed_tokens.weight)",
            t.dtype()
        );
    }
    Ok(t.clone())
}

impl Qwen2 {
    /// Build the model from Hugging Face-named weights (all in one dtype/device), with
    /// fresh LoRA adapters when `lora` is given. Every tensor's presence, shape and
    /// dtype is checked; errors name the tensor. `lm_head.weight` is used only when the
    /// embeddings are untied and it is present (otherwise the LM head is the embedding).
    pub fn new(cfg: &Qwen2Config, weights: &Weights, lora: Option<&LoraConfig>) -> Result<Self> {
        cfg.validate()?;
        let emb_name = "model.embed_tokens.weight";
        let embed0 = weights
            .get(emb_name)
            .ok_or_else(|| anyhow!("missing tensor {emb_name}"))?;
        let dtype = embed0.dtype();
        if !matches!(dtype, DType::F32 | DType::BF16 | DType::F16) {
            bail!("tensor {emb_name} has unsupported dtype {dtype:?}");
        }
        let device = embed0.device().clone();
        let mut shapes: HashMap<String, Vec<usize>> = cfg.tensor_shapes().into_iter().collect();
        let untied = !cfg.tie_word_embeddings && weights.contains_key("lm_head.weight");
        if untied {
            shapes.insert(
                "lm_head.weight".into(),
                vec![cfg.vocab_size, cfg.hidden_size],
            );
        } else {
            shapes.remove("lm_head.weight");
        }
        let get = |name: &str| -> Result<Tensor> {
            let shape = shapes
                .get(name)
                .ok_or_else(|| anyhow!("internal: no shape for {name}"))?;
            check_tensor(weights, name, shape, dtype)
        };
        let embed = get(emb_name)?;
        let lm_head = if untied {
            get("lm_head.weight")?
        } else {
            embed.clone()
        };
        let norm = get("model.norm.weight")?;
        let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
        for l in 0..cfg.num_hidden_layers {
            let p = format!("model.layers.{l}");
            let lin = |m: &str, bias: bool| -> Result<Linear> {
                let parent = lora::parent_of(m);
                Ok(Linear {
                    w: get(&format!("{p}.{parent}.{m}.weight"))?,
                    b: if bias {
                        Some(get(&format!("{p}.{parent}.{m}.bias"))?)
                    } else {
                        None
                    },
                    lora: None,
                })
            };
            layers.push(Layer {
                ln1: get(&format!("{p}.input_layernorm.weight"))?,
                ln2: get(&format!("{p}.post_attention_layernorm.weight"))?,
                lin: [
                    lin("q_proj", true)?,
                    lin("k_proj", true)?,
                    lin("v_proj", true)?,
                    lin("o_proj", false)?,
                    lin("gate_proj", false)?,
                    lin("up_proj", false)?,
                    lin("down_proj", false)?,
                ],
            });
        }
        let half = cfg.head_dim / 2;
        let base = cfg.rope_theta as f32;
        let inv_freq = (0..half)
            .map(|i| 1.0f32 / base.powf((2 * i) as f32 / cfg.head_dim as f32))
            .collect();
        let mut model = Qwen2 {
            cfg: cfg.clone(),
            embed,
            lm_head,
            norm,
            layers,
            lora: None,
            adapter_enabled: AtomicBool::new(true),
            inv_freq,
            device,
            dtype,
            logprob_chunk: default_logprob_chunk(cfg.vocab_size),
        };
        if let Some(l) = lora {
            model.add_lora(l)?;
        }
        Ok(model)
    }

    pub fn config(&self) -> &Qwen2Config {
        &self.cfg
    }
    pub fn device(&self) -> &Device {
        &self.device
    }
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Store the frozen base matrices (the seven projections of every layer, the
    /// embedding and the LM head) in `dtype` while activations, norms, biases and LoRA
    /// stay in [`Self::dtype`]. A narrower base halves the bytes every decode step
    /// streams; each use widens it exactly (see [`ops::widen`]), so sampling and
    /// training compute with the same rounded weights. The rounding happens once, here.
    pub fn set_base_dtype(&mut self, dtype: DType) -> Result<()> {
        if !matches!(dtype, DType::F32 | DType::BF16 | DType::F16) {
            bail!("base dtype {dtype:?} is not f32, bf16 or f16");
        }
        let tied = self.lm_head.id() == self.embed.id();
        self.embed = self.embed.to_dtype(dtype)?;
        self.lm_head = if tied {
            self.embed.clone()
        } else {
            self.lm_head.to_dtype(dtype)?
        };
        for layer in &mut self.layers {
            for lin in layer.lin.iter_mut() {
                lin.w = lin.w.to_dtype(dtype)?;
            }
        }
        Ok(())
    }

    /// The dtype the frozen base matrices are stored in ([`Self::set_base_dtype`]).
    pub fn base_dtype(&self) -> DType {
        self.lm_head.dtype()
    }

    // ----------------------------------------------------------------------------- LoRA

    /// (Re)create fresh LoRA adapters (A from `cfg.init_seed`, B = 0) on the targeted
    /// modules of every layer, replacing any existing ones.
    pub fn add_lora(&mut self, cfg: &LoraConfig) -> Result<()> {
        cfg.validate()?;
        let mut rng = ChaCha8Rng::seed_from_u64(cfg.init_seed);
        for layer in &mut self.layers {
            for (m, lin) in LORA_TARGETS.iter().zip(layer.lin.iter_mut()) {
                lin.lora = if cfg.targets(m) {
                    let (out_f, in_f) = lin.w.dims2()?;
                    Some(LoraLinear::new(in_f, out_f, cfg, &mut rng, &self.device)?)
                } else {
                    None
                };
            }
        }
        self.lora = Some(cfg.clone());
        Ok(())
    }

    /// Remove the adapters (back to the base model).
    pub fn remove_lora(&mut self) {
        for layer in &mut self.layers {
            for lin in layer.lin.iter_mut() {
                lin.lora = None;
            }
        }
        self.lora = None;
    }

    pub fn lora_config(&self) -> Option<&LoraConfig> {
        self.lora.as_ref()
    }

    /// `(PEFT key, Var)` for every LoRA tensor: layer by layer, modules in
    /// [`LORA_TARGETS`] order, A before B. Vars are f32 and share storage with the model
    /// (an optimiser updating them updates the model).
    pub fn lora_vars(&self) -> Vec<(String, Var)> {
        let mut out = Vec::new();
        for (l, layer) in self.layers.iter().enumerate() {
            for (m, lin) in LORA_TARGETS.iter().zip(layer.lin.iter()) {
                if let Some(lo) = &lin.lora {
                    out.push((lora::peft_key(l, m, 'A'), lo.a.clone()));
                    out.push((lora::peft_key(l, m, 'B'), lo.b.clone()));
                }
            }
        }
        out
    }

    /// Just the vars (for an optimiser).
    pub fn trainable_vars(&self) -> Vec<Var> {
        self.lora_vars().into_iter().map(|(_, v)| v).collect()
    }

    /// Switch the adapter on/off for subsequent forwards (off = the base model, GRPO's
    /// reference policy). Takes `&self`: an atomic flag.
    pub fn set_adapter_enabled(&self, enabled: bool) {
        self.adapter_enabled.store(enabled, Ordering::SeqCst);
    }

    pub fn adapter_enabled(&self) -> bool {
        self.adapter_enabled.load(Ordering::SeqCst)
    }

    /// Save the adapter as a PEFT directory (`adapter_model.safetensors` +
    /// `adapter_config.json`), each file written atomically.
    pub fn save_adapter(&self, dir: &Path, base_model_name_or_path: &str) -> Result<()> {
        let cfg = self
            .lora
            .as_ref()
            .ok_or_else(|| anyhow!("save_adapter: the model has no LoRA adapter"))?;
        let tensors: Vec<(String, Tensor)> = self
            .lora_vars()
            .into_iter()
            .map(|(k, v)| (k, v.as_detached_tensor()))
            .collect();
        lora::save_peft(dir, cfg, base_model_name_or_path, &tensors)
    }

    /// Load a PEFT adapter directory: creates adapters per its `adapter_config.json`
    /// (replacing existing ones) and sets their values. Every expected key must be
    /// present with the right shape, and no unexpected key may appear (errors name the
    /// tensor). Enables the adapter.
    pub fn load_adapter(&mut self, dir: &Path) -> Result<()> {
        let cfg = LoraConfig::from_peft_dir(dir)?;
        let tensors = lora::read_peft_tensors(dir)?;
        self.add_lora(&cfg)?;
        let p = dir.join(lora::ADAPTER_WEIGHTS);
        let vars = self.lora_vars();
        let expected: std::collections::HashSet<&str> =
            vars.iter().map(|(k, _)| k.as_str()).collect();
        if let Some(k) = tensors.keys().find(|k| !expected.contains(k.as_str())) {
            bail!(
                "{}: unexpected tensor {k} (adapter config targets {:?}, {} layers)",
                p.display(),
                cfg.target_modules,
                self.cfg.num_hidden_layers
            );
        }
        for (k, var) in &vars {
            let (shape, vals) = tensors
                .get(k)
                .ok_or_else(|| anyhow!("{}: missing tensor {k}", p.display()))?;
            if shape.as_slice() != var.dims() {
                bail!(
                    "{}: tensor {k} has shape {shape:?}, expected {:?}",
                    p.display(),
                    var.dims()
                );
            }
            let t = Tensor::from_vec(vals.clone(), shape.as_slice(), &self.device)?;
            var.set(&t).with_context(|| format!("setting {k}"))?;
        }
        self.set_adapter_enabled(true);
        Ok(())
    }

    fn lora_run(&self, mode: Mode, layer: usize, module: usize) -> Option<LoraRun> {
        if self.lora.is_none() || !self.adapter_enabled() {
            return None;
        }
        Some(match mode {
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
                        ^ ((layer * LORA_TARGETS.len() + module + 1) as u64)
                            .wrapping_mul(0x9E37_79B9_7F4A_7C15),
                ),
            },
        })
    }

    // -------------------------------------------------------------------------- forward

    /// cos/sin tables `[B, T, head_dim/2]` (model dtype) for per-row positions
    /// (`positions.len() == B*T`), computed in f32 like transformers.
    fn rope_tables(&self, b: usize, t: usize, positions: &[u32]) -> Result<(Tensor, Tensor)> {
        let half = self.inv_freq.len();
        let mut cos = Vec::with_capacity(b * t * half);
        let mut sin = Vec::with_capacity(b * t * half);
        for &p in positions {
            for &f in &self.inv_freq {
                let a = p as f32 * f;
                cos.push(a.cos());
                sin.push(a.sin());
            }
        }
        let cos = Tensor::from_vec(cos, (b, t, half), &self.device)?.to_dtype(self.dtype)?;
        let sin = Tensor::from_vec(sin, (b, t, half), &self.device)?.to_dtype(self.dtype)?;
        Ok((cos, sin))
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

    /// One layer's attention inputs: `x` `[B, T, H]` -> RoPE'd `q` `[B, NH, T, D]`,
    /// RoPE'd `k` and `v` `[B, KVH, T, D]`.
    fn layer_qkv(
        &self,
        li: usize,
        x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        mode: Mode,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        let cfg = &self.cfg;
        let layer = &self.layers[li];
        let (b, t, _) = x.dims3()?;
        let (nh, kvh, hd) = (
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim,
        );
        let run = |m: usize| self.lora_run(mode, li, m);
        let h = ops::rms_norm(x, &layer.ln1, cfg.rms_norm_eps)?;
        let q = layer.lin[0].forward(&h, run(0))?;
        let k = layer.lin[1].forward(&h, run(1))?;
        let v = layer.lin[2].forward(&h, run(2))?;
        let q = q.reshape((b, t, nh, hd))?.transpose(1, 2)?.contiguous()?;
        let k = k.reshape((b, t, kvh, hd))?.transpose(1, 2)?.contiguous()?;
        let v = v.reshape((b, t, kvh, hd))?.transpose(1, 2)?.contiguous()?;
        let q = ops::rope(&q, cos, sin)?;
        let k = ops::rope(&k, cos, sin)?;
        Ok((q, k, v))
    }

    /// The rest of a layer: attention of `q` `[B, NH, T, D]` over keys/values
    /// `[B, KVH, Tk, D]` under the additive `mask` `[B,1,1,T,Tk]`, o_proj, residual, MLP.
    #[allow(clippy::too_many_arguments)]
    fn layer_rest(
        &self,
        li: usize,
        x: &Tensor,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        mask: &Tensor,
        mode: Mode,
    ) -> Result<Tensor> {
        let cfg = &self.cfg;
        let layer = &self.layers[li];
        let (b, t, _) = x.dims3()?;
        let (nh, kvh, hd) = (
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim,
        );
        let g = nh / kvh;
        let scale = 1.0 / (hd as f64).sqrt();
        let run = |m: usize| self.lora_run(mode, li, m);
        let q = q.reshape((b, kvh, g * t, hd))?;
        let scores = ops::matmul(&q, &k.t()?)?;
        let p = ops::masked_softmax(&scores, mask, scale)?;
        let o = ops::matmul(&p, v)?;
        let o = o
            .reshape((b, nh, t, hd))?
            .transpose(1, 2)?
            .contiguous()?
            .reshape((b, t, nh * hd))?;
        let o = layer.lin[3].forward(&o, run(3))?;
        let x = ops::add(x, &o)?;
        // --- MLP
        let h = ops::rms_norm(&x, &layer.ln2, cfg.rms_norm_eps)?;
        let gate = layer.lin[4].forward(&h, run(4))?;
        let up = layer.lin[5].forward(&h, run(5))?;
        let a = ops::silu_mul(&gate, &up)?;
        let d = layer.lin[6].forward(&a, run(6))?;
        Ok(ops::add(&x, &d)?)
    }

    /// Shared body. `mask`: additive `[B,1,1,T,Tk]`; `cache`: (cache, start column).
    fn run_layers(
        &self,
        mut x: Tensor,
        cos: &Tensor,
        sin: &Tensor,
        mask: &Tensor,
        mut cache: Option<&mut KvCache>,
        mode: Mode,
    ) -> Result<Tensor> {
        let t = x.dim(1)?;
        for li in 0..self.layers.len() {
            let (q, k, v) = self.layer_qkv(li, &x, cos, sin, mode)?;
            let (k, v) = match cache.as_deref_mut() {
                Some(c) => {
                    let start = c.len;
                    c.k[li].slice_set(&k, 2, start)?;
                    c.v[li].slice_set(&v, 2, start)?;
                    (
                        c.k[li].narrow(2, 0, start + t)?,
                        c.v[li].narrow(2, 0, start + t)?,
                    )
                }
                None => (k, v),
            };
            x = self.layer_rest(li, &x, &q, &k, &v, mask, mode)?;
        }
        Ok(ops::rms_norm(&x, &self.norm, self.cfg.rms_norm_eps)?)
    }

    /// Full-sequence forward (no cache). `input_ids` `[B, T]` (u32/i64);
    /// `attention_mask` row-major `B*T` entries, 1 = real token, 0 = padding (left or
    /// right padding, or holes); `None` = all real. Positions per row are
    /// `cumsum(mask) - 1` (so a left-padded row gets the same positions as unpadded).
    /// Returns the final-norm hidden states `[B, T, hidden]` in the model dtype; feed
    /// them to [`Self::logits`] / [`Self::last_logits`] / [`Self::token_logprobs`].
    /// Hidden states at padded positions are finite but meaningless.
    pub fn forward(
        &self,
        input_ids: &Tensor,
        attention_mask: Option<&[u8]>,
        mode: Mode,
    ) -> Result<Tensor> {
        self.forward_with(input_ids, attention_mask, mode, None)
    }

    /// [`Self::forward`] with activation checkpointing: only each decoder layer's input
    /// is kept, and the returned hidden states hang off a fresh variable whose gradient
    /// [`Checkpoints::backward`] (which this forward is recorded in) carries back
    /// through the layers. Same values as [`Self::forward`].
    pub fn forward_checkpointed(
        &self,
        input_ids: &Tensor,
        attention_mask: Option<&[u8]>,
        mode: Mode,
        checkpoints: &Checkpoints,
    ) -> Result<Tensor> {
        self.forward_with(input_ids, attention_mask, mode, Some(checkpoints))
    }

    fn forward_with(
        &self,
        input_ids: &Tensor,
        attention_mask: Option<&[u8]>,
        mode: Mode,
        checkpoints: Option<&Checkpoints>,
    ) -> Result<Tensor> {
        let (b, t) = input_ids.dims2()?;
        let ones;
        let mask = match attention_mask {
            Some(m) => {
                if m.len() != b * t {
                    bail!("attention_mask has {} entries, expected {b}x{t}", m.len());
                }
                m
            }
            None => {
                ones = vec![1u8; b * t];
                &ones
            }
        };
        let mut positions = Vec::with_capacity(b * t);
        for row in mask.chunks(t.max(1)) {
            let mut n = 0u32;
            for &m in row {
                if m != 0 {
                    positions.push(n);
                    n += 1;
                } else {
                    positions.push(1); // like transformers' masked_fill(mask == 0, 1)
                }
            }
        }
        let mut add = vec![MASKED; b * t * t];
        for bi in 0..b {
            for i in 0..t {
                let row = &mut add[(bi * t + i) * t..(bi * t + i + 1) * t];
                for (j, r) in row.iter_mut().enumerate().take(i + 1) {
                    if mask[bi * t + j] != 0 {
                        *r = 0.0;
                    }
                }
            }
        }
        let mask = Tensor::from_vec(add, (b, 1, 1, t, t), &self.device)?;
        let (cos, sin) = self.rope_tables(b, t, &positions)?;
        let stack = Stack::Packed(StreamCtx { cos, sin, mask });
        let x = self.embed(input_ids)?;
        let [h] = self.run_stack(stack, [x], mode, checkpoints)?;
        Ok(h)
    }

    /// Training forward for one GRPO group: `G` completions of one shared prompt.
    ///
    /// `prompt_ids` `[1, P]` (all real tokens) runs once; its per-layer keys and values,
    /// with their graph, are broadcast to the `G` rows of `completion_ids` `[G, C]`
    /// (`completion_mask`: `G*C` entries, 1 = real, typically right padding; `None` =
    /// all real). Each completion token attends to the whole prompt and to the real
    /// completion tokens of its row up to itself; its RoPE position is `P` + the number
    /// of earlier real completion tokens (padding gets position 1, like [`Self::forward`]).
    /// The backward sums the `G` rows' gradients into the prompt's activations, so LoRA
    /// on every module of prompt tokens is trained by all completions.
    ///
    /// Returns the final-norm hidden states `(prompt [1, P, H], completion [G, C, H])`:
    /// the same values as [`Self::forward`] on the packed rows `[prompt | completion]`
    /// (up to float rounding) when there is no LoRA dropout. With `Mode::Train` and LoRA
    /// dropout > 0 the prompt tokens' dropout masks are drawn once and shared by the
    /// group (and the masks differ from the packed forward's draw): the same
    /// distribution per token, but not independent across the G rows.
    pub fn forward_shared_prefix(
        &self,
        prompt_ids: &Tensor,
        completion_ids: &Tensor,
        completion_mask: Option<&[u8]>,
        mode: Mode,
    ) -> Result<(Tensor, Tensor)> {
        self.forward_shared_prefix_with(prompt_ids, completion_ids, completion_mask, mode, None)
    }

    /// [`Self::forward_shared_prefix`] with activation checkpointing, as
    /// [`Self::forward_checkpointed`].
    pub fn forward_shared_prefix_checkpointed(
        &self,
        prompt_ids: &Tensor,
        completion_ids: &Tensor,
        completion_mask: Option<&[u8]>,
        mode: Mode,
        checkpoints: &Checkpoints,
    ) -> Result<(Tensor, Tensor)> {
        self.forward_shared_prefix_with(
            prompt_ids,
            completion_ids,
            completion_mask,
            mode,
            Some(checkpoints),
        )
    }

    fn forward_shared_prefix_with(
        &self,
        prompt_ids: &Tensor,
        completion_ids: &Tensor,
        completion_mask: Option<&[u8]>,
        mode: Mode,
        checkpoints: Option<&Checkpoints>,
    ) -> Result<(Tensor, Tensor)> {
        let (one, p) = prompt_ids.dims2()?;
        let (g, c) = completion_ids.dims2()?;
        if one != 1 || p == 0 || g == 0 || c == 0 {
            bail!(
                "forward_shared_prefix: prompt {:?} must be [1, P>0], completions {:?} [G>0, C>0]",
                prompt_ids.shape(),
                completion_ids.shape()
            );
        }
        if let Some(m) = completion_mask {
            if m.len() != g * c {
                bail!("completion_mask has {} entries, expected {g}x{c}", m.len());
            }
        }
        let real = |gi: usize, j: usize| completion_mask.is_none_or(|m| m[gi * c + j] != 0);
        // Prompt: one causal row.
        let mut padd = vec![MASKED; p * p];
        for i in 0..p {
            for r in &mut padd[i * p..i * p + i + 1] {
                *r = 0.0;
            }
        }
        let pmask = Tensor::from_vec(padd, (1, 1, 1, p, p), &self.device)?;
        let ppos: Vec<u32> = (0..p as u32).collect();
        let (pcos, psin) = self.rope_tables(1, p, &ppos)?;
        // Completions: the whole prompt, then their own causal real tokens.
        let tk = p + c;
        let mut cpos = Vec::with_capacity(g * c);
        let mut cadd = vec![MASKED; g * c * tk];
        for gi in 0..g {
            let mut n = p as u32;
            for i in 0..c {
                if real(gi, i) {
                    cpos.push(n);
                    n += 1;
                } else {
                    cpos.push(1);
                }
                let row = &mut cadd[(gi * c + i) * tk..(gi * c + i + 1) * tk];
                for r in &mut row[..p] {
                    *r = 0.0;
                }
                for j in 0..=i {
                    if real(gi, j) {
                        row[p + j] = 0.0;
                    }
                }
            }
        }
        let cmask = Tensor::from_vec(cadd, (g, 1, 1, c, tk), &self.device)?;
        let (ccos, csin) = self.rope_tables(g, c, &cpos)?;
        let stack = Stack::Shared {
            prompt: StreamCtx {
                cos: pcos,
                sin: psin,
                mask: pmask,
            },
            completions: StreamCtx {
                cos: ccos,
                sin: csin,
                mask: cmask,
            },
        };
        let xs = [self.embed(prompt_ids)?, self.embed(completion_ids)?];
        let [hp, hc] = self.run_stack(stack, xs, mode, checkpoints)?;
        Ok((hp, hc))
    }

    /// Decoder layer `li` of `stack` on its streams' inputs `xs` (one per stream).
    pub(super) fn stack_layer<const N: usize>(
        &self,
        li: usize,
        stack: &Stack,
        xs: &[Tensor; N],
        mode: Mode,
    ) -> Result<[Tensor; N]> {
        let out = match stack {
            Stack::Packed(c) => {
                let x = &xs[0];
                let (q, k, v) = self.layer_qkv(li, x, &c.cos, &c.sin, mode)?;
                vec![self.layer_rest(li, x, &q, &k, &v, &c.mask, mode)?]
            }
            Stack::Shared {
                prompt: pc,
                completions: cc,
            } => {
                let (xp, xc) = (&xs[0], &xs[N - 1]);
                // The completion stream draws its own dropout masks.
                let cmode = match mode {
                    Mode::Train { dropout_seed } => Mode::Train {
                        dropout_seed: dropout_seed ^ 0xC0DE_5EED_0000_0001,
                    },
                    m => m,
                };
                let (qp, kp, vp) = self.layer_qkv(li, xp, &pc.cos, &pc.sin, mode)?;
                let (qc, kc, vc) = self.layer_qkv(li, xc, &cc.cos, &cc.sin, cmode)?;
                let kall = ops::prefix_cat(&kp, &kc, 2)?;
                let vall = ops::prefix_cat(&vp, &vc, 2)?;
                let xc = self.layer_rest(li, xc, &qc, &kall, &vall, &cc.mask, cmode)?;
                let xp = self.layer_rest(li, xp, &qp, &kp, &vp, &pc.mask, mode)?;
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
        mode: Mode,
        checkpoints: Option<&Checkpoints>,
    ) -> Result<[Tensor; N]> {
        let eps = self.cfg.rms_norm_eps;
        let Some(ck) = checkpoints else {
            for li in 0..self.layers.len() {
                xs = self.stack_layer(li, &stack, &xs, mode)?;
            }
            let out: Vec<Tensor> = xs
                .iter()
                .map(|x| ops::rms_norm(x, &self.norm, eps))
                .collect::<candle_core::Result<_>>()?;
            return out
                .try_into()
                .map_err(|v: Vec<Tensor>| anyhow!("{} streams, expected {N}", v.len()));
        };
        let mut inputs = Vec::with_capacity(self.layers.len());
        for li in 0..self.layers.len() {
            let ys = self.stack_layer(li, &stack, &xs, mode)?;
            inputs.push(std::mem::replace(&mut xs, ys.map(|y| y.detach())).to_vec());
        }
        let outputs = xs
            .iter()
            .map(Var::from_tensor)
            .collect::<candle_core::Result<Vec<_>>>()?;
        let out: Vec<Tensor> = outputs
            .iter()
            .map(|v| ops::rms_norm(v.as_tensor(), &self.norm, eps))
            .collect::<candle_core::Result<_>>()?;
        ck.push(Segment::new(
            Box::new(Recorded { stack, mode }),
            inputs,
            outputs,
        ));
        out.try_into()
            .map_err(|v: Vec<Tensor>| anyhow!("{} streams, expected {N}", v.len()))
    }

    /// A cache whose row `i` holds the first `rows[i].1` columns of `rows[i].0` (a row
    /// without one starts empty), with room for `extra` more columns: the next prompt
    /// of a session is then prefilled from where it leaves the last one. Rows shorter
    /// than the longest are padded with masked columns.
    pub fn cache_from_prefixes(
        &self,
        rows: &[(Option<&RowKv>, usize)],
        extra: usize,
    ) -> Result<KvCache> {
        let cfg = &self.cfg;
        let keep: Vec<usize> = rows
            .iter()
            .map(|&(kv, n)| n.min(kv.map_or(0, |kv| kv.len)))
            .collect();
        let len = keep.iter().copied().max().unwrap_or(0);
        let ml = len + extra;
        let (h, d) = (cfg.num_key_value_heads, cfg.head_dim);
        let layer = |li: usize, pick: fn(&RowKv) -> &Vec<Tensor>| -> Result<Tensor> {
            let parts = rows
                .iter()
                .zip(&keep)
                .map(|(&(kv, _), &n)| {
                    let pad = Tensor::zeros((1, h, ml - n, d), self.dtype, &self.device)?;
                    match kv {
                        Some(kv) if n > 0 => {
                            Ok(Tensor::cat(&[&pick(kv)[li].narrow(2, 0, n)?, &pad], 2)?)
                        }
                        _ => Ok(pad),
                    }
                })
                .collect::<Result<Vec<_>>>()?;
            Ok(Tensor::cat(&parts, 0)?.contiguous()?)
        };
        let mut k = Vec::with_capacity(cfg.num_hidden_layers);
        let mut v = Vec::with_capacity(cfg.num_hidden_layers);
        for li in 0..cfg.num_hidden_layers {
            k.push(layer(li, |kv| &kv.k)?);
            v.push(layer(li, |kv| &kv.v)?);
        }
        let mut key_valid = vec![0u8; rows.len() * ml];
        for (r, &n) in keep.iter().enumerate() {
            key_valid[r * ml..r * ml + n]
                .iter_mut()
                .for_each(|x| *x = 1);
        }
        Ok(KvCache {
            k,
            v,
            batch: rows.len(),
            max_len: ml,
            len,
            key_valid,
            next_pos: keep.iter().map(|&n| n as u32).collect(),
        })
    }

    /// A fresh cache for `batch` rows and up to `max_len` columns (prompt + new tokens).
    pub fn new_cache(&self, batch: usize, max_len: usize) -> Result<KvCache> {
        let cfg = &self.cfg;
        let shape = (batch, cfg.num_key_value_heads, max_len, cfg.head_dim);
        let mut k = Vec::with_capacity(cfg.num_hidden_layers);
        let mut v = Vec::with_capacity(cfg.num_hidden_layers);
        for _ in 0..cfg.num_hidden_layers {
            k.push(Tensor::zeros(shape, self.dtype, &self.device)?);
            v.push(Tensor::zeros(shape, self.dtype, &self.device)?);
        }
        Ok(KvCache {
            k,
            v,
            batch,
            max_len,
            len: 0,
            key_valid: vec![0; batch * max_len],
            next_pos: vec![0; batch],
        })
    }

    /// Incremental forward, always detached (no graph; for sampling): appends
    /// `input_ids` `[B, T]` as cache columns `len..len+T` and returns their hidden
    /// states `[B, T, hidden]`. `attention_mask` (`B*T`, 1 = real) marks padding — use
    /// left padding for prompts and mask 0 for rows that are done; `None` = all real.
    /// Each real token attends to all earlier real tokens of its row; its RoPE position
    /// is the row's count of earlier real tokens.
    pub fn forward_cached(
        &self,
        input_ids: &Tensor,
        attention_mask: Option<&[u8]>,
        cache: &mut KvCache,
    ) -> Result<Tensor> {
        let (b, t) = input_ids.dims2()?;
        if b != cache.batch {
            bail!("forward_cached: {b} rows but the cache has {}", cache.batch);
        }
        if cache.len + t > cache.max_len {
            bail!(
                "forward_cached: cache full ({} + {t} columns > max_len {})",
                cache.len,
                cache.max_len
            );
        }
        if let Some(m) = attention_mask {
            if m.len() != b * t {
                bail!("attention_mask has {} entries, expected {b}x{t}", m.len());
            }
        }
        let start = cache.len;
        let tk = start + t;
        let ml = cache.max_len;
        let mut positions = Vec::with_capacity(b * t);
        for bi in 0..b {
            for i in 0..t {
                let real = attention_mask.is_none_or(|m| m[bi * t + i] != 0);
                positions.push(cache.next_pos[bi]);
                if real {
                    cache.key_valid[bi * ml + start + i] = 1;
                    cache.next_pos[bi] += 1;
                } else {
                    cache.key_valid[bi * ml + start + i] = 0;
                }
            }
        }
        let mut add = vec![MASKED; b * t * tk];
        for bi in 0..b {
            for i in 0..t {
                let row = &mut add[(bi * t + i) * tk..(bi * t + i + 1) * tk];
                for (j, r) in row.iter_mut().enumerate().take(start + i + 1) {
                    if cache.key_valid[bi * ml + j] != 0 {
                        *r = 0.0;
                    }
                }
            }
        }
        let mask_t = Tensor::from_vec(add, (b, 1, 1, t, tk), &self.device)?;
        let (cos, sin) = self.rope_tables(b, t, &positions)?;
        let x = self.embed(input_ids)?;
        let out = self.run_layers(x, &cos, &sin, &mask_t, Some(cache), Mode::Detached);
        if out.is_ok() {
            cache.len = tk;
        }
        out
    }

    // ---------------------------------------------------------------------------- heads

    /// Full logits `[..., V]` in f32 (computed in the model dtype, then cast) —
    /// materialises every position: use for short inputs/tests; prefer
    /// [`Self::last_logits`] or [`Self::token_logprobs`].
    pub fn logits(&self, hidden: &Tensor) -> Result<Tensor> {
        Ok(ops::frozen_linear(hidden, &self.lm_head, None)?.to_dtype(DType::F32)?)
    }

    /// Logits of the last position of each row: `hidden` `[B, T, H]` -> `[B, V]` f32.
    pub fn last_logits(&self, hidden: &Tensor) -> Result<Tensor> {
        let (_, t, _) = hidden.dims3()?;
        let last = hidden.narrow(1, t - 1, 1)?.squeeze(1)?;
        self.logits(&last)
    }

    /// `log softmax(logits / temperature)[targets]` for hidden `[B, T, H]` and targets
    /// `[B, T]` (u32/i64; position t's hidden state scores targets[t], so pass
    /// `hidden[:, :-1]` with `ids[:, 1:]` for next-token log-probs). Never materialises
    /// `[B, T, V]`: at most `logprob_chunk` positions of logits exist at once, forward and
    /// backward. Optional per-token entropy (detached).
    pub fn token_logprobs(
        &self,
        hidden: &Tensor,
        targets: &Tensor,
        temperature: f64,
        with_entropy: bool,
    ) -> Result<TokenLogProbs> {
        let (b, t, h) = hidden.dims3()?;
        if targets.dims2()? != (b, t) {
            bail!(
                "token_logprobs: targets {:?} vs hidden {:?}",
                targets.shape(),
                hidden.shape()
            );
        }
        let hs = hidden.contiguous()?.reshape((b * t, h))?;
        let ids = targets.flatten_all()?;
        let (lp, ent) = ops::chunked_token_logprobs(
            &hs,
            &self.lm_head,
            &ids,
            temperature,
            self.logprob_chunk,
            with_entropy,
        )?;
        Ok(TokenLogProbs {
            logprobs: lp.reshape((b, t))?,
            entropy: ent.map(|e| e.reshape((b, t))).transpose()?,
        })
    }

    /// Next-token log-probs of a whole batch: runs [`Self::forward`] and scores
    /// `ids[:, 1:]` from positions `0..T-1`; returns `[B, T-1]`.
    pub fn sequence_logprobs(
        &self,
        input_ids: &Tensor,
        attention_mask: Option<&[u8]>,
        mode: Mode,
        temperature: f64,
        with_entropy: bool,
    ) -> Result<TokenLogProbs> {
        let (_, t) = input_ids.dims2()?;
        if t < 2 {
            bail!("sequence_logprobs: need at least 2 tokens per row");
        }
        let hidden = self.forward(input_ids, attention_mask, mode)?;
        self.token_logprobs(
            &hidden.narrow(1, 0, t - 1)?,
            &input_ids.narrow(1, 1, t - 1)?,
            temperature,
            with_entropy,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_of_qwen25_05b_by_hand() {
        // 24 x (attention 1,836,160 + MLP 13,074,432 + norms 1,792) + tied embedding
        // 151,936 x 896 + final norm 896: the 494,032,768 of the released checkpoint.
        assert_eq!(Qwen2Config::qwen25_05b().parameters(), 494_032_768);
        let untied = Qwen2Config {
            tie_word_embeddings: false,
            ..Qwen2Config::qwen25_05b()
        };
        assert_eq!(untied.parameters(), 494_032_768 + 151_936 * 896);
    }
}

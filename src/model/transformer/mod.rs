//! Our own decoder-only transformer (Qwen2ForCausalLM, Qwen3ForCausalLM,
//! LlamaForCausalLM), built from differentiable ops so LoRA trains.
//!
//! Numerics follow Hugging Face transformers: RMSNorm in f32 (weight applied after the
//! cast back), RoPE tables computed in f32 (`rotate_half` convention), attention softmax
//! in f32, logits in the model dtype then cast to f32.
//!
//! - [`block`]: [`Block`] = [`Attention`](block::Attention) + [`Mlp`](block::Mlp), with
//!   named projections; where the families differ (biases, Qwen3's q/k norms);
//! - [`forward`]: the one forward over an [`Input`] and a [`Pass`];
//! - [`mask`], [`rope`]: which keys a query sees, at which positions; Llama 3 RoPE scaling;
//! - [`cache`]: the KV cache of sampling; [`recompute`]: activation checkpointing;
//! - [`adapter`]: LoRA on the model, PEFT in and out.
//!
//! # Usage
//! ```ignore
//! let model = Transformer::new(&cfg, &weights, Some(&LoraConfig::default()))?;
//! // Training: hidden states with a graph to the LoRA vars, then chunked log-probs.
//! let h = model.forward(Input::rows(&ids, Some(&mask)), Mode::Train { dropout_seed: step })?.rows;
//! let lp = model.token_logprobs(&h.narrow(1, p - 1, c)?, &targets, 1.0, true)?;
//! let grads = loss(lp.logprobs).backward()?; // holds only LoRA vars
//! // One GRPO group: its prompt [1, P] once, the G completions [G, C] against its K/V.
//! let h = model.forward(Input::shared(&prompt, &comps, Some(&cmask)), mode)?;
//! // Activation checkpointing: keep only layer inputs, recompute them in the backward.
//! let ck = Checkpoints::new();
//! let h = model.forward(Input::rows(&ids, Some(&mask)), Pass::checkpointed(mode, Some(&ck)))?.rows;
//! let mut grads = loss(model.token_logprobs(&h, &targets, 1.0, false)?).backward()?;
//! ck.backward(&model, &mut grads)?; // adds every LoRA gradient to `grads`
//! // Reference policy: the same model with the adapter off, no graph.
//! let ref_h = model.forward(Input::rows(&ids, Some(&mask)), Pass { base_only: true, ..Pass::default() })?;
//! // Sampling: prefill P prompts once, repeat each prompt's rows G times, decode.
//! let mut cache = model.new_cache(p, max_len)?;
//! let h = model.forward(Input::cached(&prompt_ids, Some(&prompt_mask), &mut cache), Mode::Detached)?.rows;
//! let mut cache = cache.repeat_rows(g)?; // rows: p0 x G, p1 x G, ...
//! let logits = model.last_logits(&h)?; // [P, V]
//! ```
pub mod adapter;
pub mod block;
pub mod cache;
pub mod forward;
pub mod mask;
pub mod mode;
pub mod recompute;
pub mod rope;

use super::arch::ArchConfig;
use super::lora::LoraConfig;
use super::ops::{self, BaseWeight};
use super::quant::QuantWeights;
use super::weights::{check_tensor, Weights};
use anyhow::{anyhow, bail, Result};
use block::Block;
use candle_core::{DType, Device, Tensor};
use rope::Rope;
use std::sync::atomic::AtomicBool;

pub use cache::{KvCache, RowKv};
pub use forward::{Hidden, Input, Pass};
pub use mode::Mode;
pub use recompute::Checkpoints;

/// Log-probs of target tokens (and optionally the entropy of the distribution).
#[derive(Debug, Clone)]
pub struct TokenLogProbs {
    /// `[B, T]` f32, differentiable w.r.t. the LoRA vars when the hidden states are.
    pub logprobs: Tensor,
    /// `[B, T]` f32 entropy of `softmax(logits / temperature)`, detached.
    pub entropy: Option<Tensor>,
}

/// Default number of positions per chunk in [`Transformer::token_logprobs`]: about 64M logits
/// (256 MB in f32). Each chunk streams the whole LM head through the matmul (and GEMM
/// packs it: 545 MB for Qwen2.5-0.5B), three times per training step, so fewer, larger
/// chunks are much faster: 16M-logit chunks cost about 3 s more per 8 x 160 step.
pub fn default_logprob_chunk(vocab: usize) -> usize {
    ((1usize << 26) / vocab.max(1)).clamp(1, 4096)
}

/// A decoder-only transformer of any [`super::arch::Family`], with optional LoRA adapters.
pub struct Transformer {
    cfg: ArchConfig,
    embed: Tensor,
    lm_head: BaseWeight,
    norm: Tensor,
    layers: Vec<Block>,
    lora: Option<LoraConfig>,
    adapter_enabled: AtomicBool,
    rope: Rope,
    device: Device,
    dtype: DType,
    /// Positions per chunk in the log-prob head (memory: chunk x vocab f32).
    pub logprob_chunk: usize,
}

impl Transformer {
    /// Build the model from Hugging Face-named weights (all in one dtype/device), with
    /// fresh LoRA adapters when `lora` is given. Every tensor's presence, shape and
    /// dtype is checked; errors name the tensor. `lm_head.weight` is used only when the
    /// embeddings are untied and it is present (otherwise the LM head is the embedding).
    pub fn new(cfg: &ArchConfig, weights: &Weights, lora: Option<&LoraConfig>) -> Result<Self> {
        Self::with_quant(cfg, weights, &QuantWeights::new(), lora)
    }

    /// [`Self::new`] with a quantized base: the projections and LM head found in
    /// `quant` (see [`super::quant`]) are used from there, everything else from
    /// `weights`. A quantized `lm_head.weight` is used even when the embeddings are tied
    /// (it is then the embedding's quantized copy).
    pub fn with_quant(
        cfg: &ArchConfig,
        weights: &Weights,
        quant: &QuantWeights,
        lora: Option<&LoraConfig>,
    ) -> Result<Self> {
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
        let (v, h) = (cfg.vocab_size, cfg.hidden_size);
        let embed = check_tensor(weights, emb_name, &[v, h], dtype)?;
        let base = block::Base {
            dense: weights,
            quant,
        };
        let untied = !cfg.tie_word_embeddings && weights.contains_key("lm_head.weight");
        let lm_head = if untied || quant.contains_key("lm_head.weight") {
            block::base_weight(&base, "lm_head.weight", [v, h], dtype)?
        } else {
            BaseWeight::Dense(embed.clone())
        };
        let norm = check_tensor(weights, "model.norm.weight", &[h], dtype)?;
        let layers = (0..cfg.num_hidden_layers)
            .map(|l| Block::load(cfg, &base, l, dtype))
            .collect::<Result<Vec<_>>>()?;
        let mut model = Transformer {
            cfg: cfg.clone(),
            embed,
            lm_head,
            norm,
            layers,
            lora: None,
            adapter_enabled: AtomicBool::new(true),
            rope: Rope::new(cfg),
            device,
            dtype,
            logprob_chunk: default_logprob_chunk(cfg.vocab_size),
        };
        if let Some(l) = lora {
            model.add_lora(l)?;
        }
        Ok(model)
    }

    pub fn config(&self) -> &ArchConfig {
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
        let narrow = |w: &mut BaseWeight| -> Result<()> {
            if let BaseWeight::Dense(t) = w {
                *t = t.to_dtype(dtype)?;
            }
            Ok(())
        };
        let tied = matches!(&self.lm_head, BaseWeight::Dense(t) if t.id() == self.embed.id());
        self.embed = self.embed.to_dtype(dtype)?;
        if tied {
            self.lm_head = BaseWeight::Dense(self.embed.clone());
        } else {
            narrow(&mut self.lm_head)?;
        }
        for layer in &mut self.layers {
            for lin in layer.linears_mut() {
                narrow(&mut lin.w)?;
            }
        }
        Ok(())
    }

    /// The dtype the dense frozen base matrices are stored in ([`Self::set_base_dtype`]);
    /// the embedding's (and the LM head's when it is dense).
    pub fn base_dtype(&self) -> DType {
        self.embed.dtype()
    }

    /// The frozen base matrices (projections and LM head, not the embedding) by storage
    /// type: `(type name, tensors, bytes)`, e.g. `("q4_k", 168, 3.9e9)`.
    pub fn base_storage(&self) -> Vec<(String, usize, usize)> {
        let mut by: std::collections::BTreeMap<String, (usize, usize)> = Default::default();
        let all = self
            .layers
            .iter()
            .flat_map(|l| l.linears().map(|lin| &lin.w))
            .chain(std::iter::once(&self.lm_head));
        for w in all {
            let e = by.entry(w.type_name()).or_default();
            e.0 += 1;
            e.1 += w.storage_bytes();
        }
        by.into_iter().map(|(t, (n, b))| (t, n, b)).collect()
    }

    /// Elements of the copies training makes of the frozen base, in the model dtype:
    /// `(LM head, largest projection)`. The head is copied when it is stored narrower or
    /// quantized (each log-prob call widens or dequantizes it); the largest quantized
    /// projection is dequantized by each GEMM call. Zeros for an all-f32 base.
    pub fn base_copies(&self) -> (usize, usize) {
        let elems = |w: &BaseWeight| w.dims().map(|(n, k)| n * k).unwrap_or(0);
        let head = match &self.lm_head {
            BaseWeight::Dense(t) if t.dtype() == self.dtype => 0,
            w => elems(w),
        };
        let projection = self
            .layers
            .iter()
            .flat_map(|l| l.linears())
            .filter(|lin| matches!(lin.w, BaseWeight::Quant(_)))
            .map(|lin| elems(&lin.w))
            .max()
            .unwrap_or(0);
        (head, projection)
    }

    /// Whether any frozen matrix is quantized.
    pub fn has_quantized_base(&self) -> bool {
        matches!(self.lm_head, BaseWeight::Quant(_))
            || self.layers.iter().any(|l| {
                l.linears()
                    .iter()
                    .any(|lin| matches!(lin.w, BaseWeight::Quant(_)))
            })
    }

    /// Full logits `[..., V]` in f32 (computed in the model dtype, then cast) —
    /// materialises every position: use for short inputs/tests; prefer
    /// [`Self::last_logits`] or [`Self::token_logprobs`].
    pub fn logits(&self, hidden: &Tensor) -> Result<Tensor> {
        Ok(ops::base_linear(hidden, &self.lm_head, None)?.to_dtype(DType::F32)?)
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
        // A narrower or quantized head is widened once per call, not once per chunk.
        let head = self.lm_head.dense(self.dtype)?;
        let (lp, ent) = ops::chunked_token_logprobs(
            &hs,
            &head,
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
        let hidden = self
            .forward(Input::rows(input_ids, attention_mask), mode)?
            .rows;
        self.token_logprobs(
            &hidden.narrow(1, 0, t - 1)?,
            &input_ids.narrow(1, 1, t - 1)?,
            temperature,
            with_entropy,
        )
    }
}

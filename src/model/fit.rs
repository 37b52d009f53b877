//! Will a GRPO step fit? The memory of one step estimated from a model's shape alone,
//! before any weight exists (`concord model estimate`): the frozen base in its storage
//! types, the adapter with its gradient and AdamW moments, the KV cache of sampling,
//! and the training forward + backward of one shared-prompt group
//! ([`super::budget::TrainMemory`]).
use super::budget::{kv_cache_bytes, TrainMemory, TrainShape};
use super::lora::{LoraConfig, LORA_TARGETS};
use super::quant::{is_projection, BaseDtype, QuantMode};
use super::ArchConfig;
use anyhow::{bail, Result};
use candle_core::DType;

/// One GRPO step of one group: a prompt of `prompt` tokens, `rows` completions of up to
/// `completion` tokens.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepShape {
    pub prompt: usize,
    pub rows: usize,
    pub completion: usize,
    pub checkpointing: bool,
}

/// Bytes of each part of a step (see [`estimate_step`]).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct StepEstimate {
    /// The frozen base: projections and LM head in their storage types, the embedding,
    /// norms and biases.
    pub weights: f64,
    /// LoRA parameters, their gradients and AdamW's two moments (all f32).
    pub adapter: f64,
    /// Sampling: the KV cache of every row at full length, and a step's logits.
    pub sampling: f64,
    /// One training forward + backward ([`TrainMemory::estimate`], calibrated).
    pub training: f64,
}

impl StepEstimate {
    /// Peak: the weights and adapter, then the larger of sampling and training (they
    /// do not overlap).
    pub fn total(&self) -> f64 {
        self.weights + self.adapter + self.sampling.max(self.training)
    }
}

/// Bytes of one `[n, k]` frozen matrix stored as `base` says (`head`: the LM head), in a
/// model computing in `dtype`.
fn matrix_bytes(n: usize, k: usize, head: bool, base: BaseDtype, dtype: DType) -> Result<f64> {
    let elems = (n * k) as f64;
    Ok(match base {
        BaseDtype::Float(d) => elems * d.size_in_bytes() as f64,
        BaseDtype::Quant(QuantMode::Gguf) => {
            bail!("a GGUF file's own types are in the file: estimate with q8_0 or q4_k")
        }
        BaseDtype::Quant(mode) => match mode.target(k, head) {
            Some(t) => elems / t.block_size() as f64 * t.type_size() as f64,
            None => elems * dtype.size_in_bytes() as f64,
        },
    })
}

/// The memory of one GRPO step of `shape` on a model of `cfg` computing in `dtype` with
/// its frozen base stored as `base` and adapter `lora`.
pub fn estimate_step(
    cfg: &ArchConfig,
    dtype: DType,
    base: BaseDtype,
    lora: &LoraConfig,
    shape: StepShape,
) -> Result<StepEstimate> {
    cfg.validate()?;
    let elem = dtype.size_in_bytes() as f64;
    let quant = matches!(base, BaseDtype::Quant(_));
    let mut weights = 0.0;
    let mut largest_projection = 0usize;
    for (name, dims) in cfg.tensor_shapes() {
        let elems: usize = dims.iter().product();
        weights += if is_projection(&name) {
            if quant && name != "lm_head.weight" {
                largest_projection = largest_projection.max(elems);
            }
            matrix_bytes(dims[0], dims[1], name == "lm_head.weight", base, dtype)?
        } else if name == "model.embed_tokens.weight" && !quant {
            let BaseDtype::Float(d) = base else {
                unreachable!("not quantized")
            };
            elems as f64 * d.size_in_bytes() as f64
        } else {
            elems as f64 * elem
        };
    }
    let (v, h) = (cfg.vocab_size, cfg.hidden_size);
    if cfg.tie_word_embeddings && quant {
        // A quantized base keeps a quantized copy of a tied embedding as its LM head.
        weights += matrix_bytes(v, h, true, base, dtype)?;
    }
    let head_copy = match base {
        BaseDtype::Float(d) if d == dtype => 0.0,
        _ => (v * h) as f64 * elem,
    };
    let (q, kv) = (
        cfg.num_attention_heads * cfg.head_dim,
        cfg.num_key_value_heads * cfg.head_dim,
    );
    let (i, l) = (cfg.intermediate_size, cfg.num_hidden_layers);
    let lora_params: usize = LORA_TARGETS
        .iter()
        .filter(|m| lora.targets(m))
        .map(|m| {
            let (inp, out) = match *m {
                "q_proj" => (h, q),
                "k_proj" | "v_proj" => (h, kv),
                "o_proj" => (q, h),
                "gate_proj" | "up_proj" => (h, i),
                _ => (i, h),
            };
            lora.r * (inp + out)
        })
        .sum::<usize>()
        * l;
    let len = shape.prompt + shape.completion;
    let sampling =
        kv_cache_bytes(cfg, shape.rows, len, dtype) + (shape.rows * v) as f64 * 4.0 * 2.0;
    let train = TrainMemory::from_config(
        cfg,
        dtype,
        Some(lora),
        super::default_logprob_chunk(v),
        shape.checkpointing,
    )
    .with_base_copies(head_copy, largest_projection as f64 * elem)
    .estimate(TrainShape::Shared {
        prompt: shape.prompt,
        rows: shape.rows,
        completion: shape.completion,
    });
    Ok(StepEstimate {
        weights,
        adapter: lora_params as f64 * 4.0 * 4.0,
        sampling,
        training: train.bytes(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lora() -> LoraConfig {
        LoraConfig::default()
    }

    /// Weights by hand for Qwen2.5-7B: 28 layers x (q, o 3584^2 + k, v 512 x 3584 + MLP
    /// 3 x 3584 x 18944) = 6,525,288,448 projection weights; Q4_K takes 144 bytes per 256
    /// (MLP down's 18,944 inputs are whole super-blocks too), the untied head Q6_K 210
    /// per 256, the embedding f32.
    #[test]
    fn qwen25_7b_q4_k_weights_by_hand() {
        let c = ArchConfig::qwen25_7b();
        let shape = StepShape {
            prompt: 512,
            rows: 8,
            completion: 64,
            checkpointing: true,
        };
        let e = estimate_step(
            &c,
            DType::F32,
            BaseDtype::Quant(QuantMode::Q4K),
            &lora(),
            shape,
        )
        .unwrap();
        let projections = 6_525_288_448f64 / 256.0 * 144.0;
        let head = 152_064.0 * 3584.0 / 256.0 * 210.0;
        let embed = 152_064.0 * 3584.0 * 4.0;
        let small = (28.0 * (3.0 * 3584.0 + 2.0 * 512.0) + 3584.0) * 4.0;
        assert_eq!(e.weights, projections + head + embed + small);
        // r 16 on all seven: 28 x 16 x (q 7168 + k, v 2 x 4096 + o 7168 + MLP 3 x 22528).
        let lora_params = 28.0 * 16.0 * (7168.0 + 2.0 * 4096.0 + 7168.0 + 3.0 * 22528.0);
        assert_eq!(e.adapter, lora_params * 16.0);
        // A bf16 base is the same shape at 2 bytes a weight, the embedding included.
        let b = estimate_step(
            &c,
            DType::F32,
            BaseDtype::Float(DType::BF16),
            &lora(),
            shape,
        )
        .unwrap();
        assert_eq!(
            b.weights,
            (6_525_288_448f64 + 2.0 * 152_064.0 * 3584.0) * 2.0 + small
        );
        assert!(
            e.training > b.training - 1.0,
            "dequantized copies are counted"
        );
        let err = estimate_step(
            &c,
            DType::F32,
            BaseDtype::Quant(QuantMode::Gguf),
            &lora(),
            shape,
        );
        assert!(err.is_err());
    }
}

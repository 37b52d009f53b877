//! The architecture: which family a checkpoint is, and its hyper-parameters.
//!
//! Qwen2, Qwen3 and Llama 3 share one decoder (pre-norm RMSNorm, GQA attention with
//! `rotate_half` RoPE, SwiGLU MLP). A family is the few places where they differ:
//!
//! | family | q/k/v bias | o bias | q/k norm | RoPE |
//! | --- | --- | --- | --- | --- |
//! | Qwen2 | yes | no | no | default |
//! | Qwen3 | `attention_bias` | `attention_bias` | per-head RMSNorm before RoPE | default |
//! | Llama | `attention_bias` | `attention_bias` | no | default or `llama3` scaling |
use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};

/// Model family: the Hugging Face class a checkpoint names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, Hash)]
#[serde(rename_all = "lowercase")]
pub enum Family {
    #[default]
    Qwen2,
    Qwen3,
    Llama,
}

impl Family {
    pub const ALL: [Family; 3] = [Family::Qwen2, Family::Qwen3, Family::Llama];

    /// config.json's `model_type` (and the name `init-tiny --family` takes).
    pub fn model_type(self) -> &'static str {
        match self {
            Family::Qwen2 => "qwen2",
            Family::Qwen3 => "qwen3",
            Family::Llama => "llama",
        }
    }

    /// config.json's `architectures` entry.
    pub fn architecture(self) -> &'static str {
        match self {
            Family::Qwen2 => "Qwen2ForCausalLM",
            Family::Qwen3 => "Qwen3ForCausalLM",
            Family::Llama => "LlamaForCausalLM",
        }
    }

    /// llama.cpp's `general.architecture` for GGUF files.
    pub fn gguf_architecture(self) -> &'static str {
        self.model_type()
    }

    pub fn from_model_type(s: &str) -> Option<Family> {
        Family::ALL.into_iter().find(|f| f.model_type() == s)
    }

    pub fn from_architecture(s: &str) -> Option<Family> {
        Family::ALL.into_iter().find(|f| f.architecture() == s)
    }

    /// Whether attention normalises each query and key head before RoPE (Qwen3).
    pub fn qk_norm(self) -> bool {
        self == Family::Qwen3
    }
}

impl std::fmt::Display for Family {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.model_type())
    }
}

impl std::str::FromStr for Family {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        Family::from_model_type(s.trim()).ok_or_else(|| {
            anyhow::anyhow!("unknown model family {s:?} (expected qwen2, qwen3 or llama)")
        })
    }
}

/// How RoPE frequencies are scaled (Llama 3 only).
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    /// config.json's `rope_type = "llama3"`.
    Llama3(Llama3Rope),
    /// Per-frequency divisors, `head_dim / 2` of them: what a GGUF stores instead
    /// (`rope_freqs.weight`, llama.cpp's converter computes them from the same rule).
    Factors(Vec<f32>),
}

impl RopeScaling {
    fn validate(&self, head_dim: usize) -> Result<()> {
        match self {
            RopeScaling::Llama3(s) => s.validate(),
            RopeScaling::Factors(f) => {
                if f.len() != head_dim / 2 {
                    bail!(
                        "rope_freqs has {} factors, expected head_dim / 2 = {}",
                        f.len(),
                        head_dim / 2
                    );
                }
                if let Some(x) = f.iter().find(|x| !(x.is_finite() && **x > 0.0)) {
                    bail!("rope_freqs holds {x}: factors must be positive numbers");
                }
                Ok(())
            }
        }
    }
}

/// Llama 3's RoPE frequency scaling (`rope_type = "llama3"`): wavelengths longer than
/// `original_max_position_embeddings / low_freq_factor` are slowed by `factor`, shorter
/// than `... / high_freq_factor` kept, and the band between interpolated.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Llama3Rope {
    pub factor: f64,
    pub low_freq_factor: f64,
    pub high_freq_factor: f64,
    pub original_max_position_embeddings: usize,
}

impl Llama3Rope {
    /// Llama 3.2's values (1B and 3B).
    pub fn llama32() -> Self {
        Llama3Rope {
            factor: 32.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192,
        }
    }

    pub fn validate(&self) -> Result<()> {
        let ok = |x: f64| x.is_finite() && x > 0.0;
        for (key, x) in [
            ("factor", self.factor),
            ("low_freq_factor", self.low_freq_factor),
            ("high_freq_factor", self.high_freq_factor),
        ] {
            if !ok(x) {
                bail!("config: rope scaling {key} must be a positive number, got {x}");
            }
        }
        if self.high_freq_factor <= self.low_freq_factor {
            bail!(
                "config: rope scaling high_freq_factor ({}) must exceed low_freq_factor ({})",
                self.high_freq_factor,
                self.low_freq_factor
            );
        }
        if self.original_max_position_embeddings == 0 {
            bail!("config: rope scaling original_max_position_embeddings must be positive");
        }
        Ok(())
    }
}

/// Architecture hyper-parameters, normalised from either config.json dialect
/// (transformers 4.x top-level `rope_theta`, or 5.x `rope_parameters`) or a GGUF header.
#[derive(Debug, Clone, PartialEq)]
pub struct ArchConfig {
    pub family: Family,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    /// hidden_size / num_attention_heads unless config.json says otherwise (Qwen3 does).
    pub head_dim: usize,
    pub max_position_embeddings: usize,
    pub rope_theta: f64,
    pub rope_scaling: Option<RopeScaling>,
    pub rms_norm_eps: f64,
    pub tie_word_embeddings: bool,
    /// Qwen3 and Llama's `attention_bias`: biases on q, k, v and o. Qwen2 ignores it (it
    /// always has q/k/v biases and no o bias).
    pub attention_bias: bool,
}

/// Bounds on a model's shape, far beyond any released model (Qwen2 72B: 80 layers,
/// hidden 8,192, intermediate 29,568, vocab 152,064): a config past them is corrupt or
/// hostile, and listing or allocating its tensors would exhaust memory before any check.
const MAX_LAYERS: usize = 1024;
const MAX_WIDTH: usize = 1 << 18;
const MAX_VOCAB: usize = 1 << 22;
const MAX_HEADS: usize = 1024;

impl ArchConfig {
    /// Whether q, k and v have biases.
    pub fn qkv_bias(&self) -> bool {
        self.family == Family::Qwen2 || self.attention_bias
    }

    /// Whether o_proj has a bias.
    pub fn o_bias(&self) -> bool {
        self.family != Family::Qwen2 && self.attention_bias
    }

    /// Weights of the model: embedding, layers, final norm, and `lm_head` when untied.
    /// (Within [`Self::validate`]'s bounds this cannot overflow.)
    pub fn parameters(&self) -> u64 {
        self.tensor_shapes()
            .iter()
            .map(|(_, s)| s.iter().product::<usize>() as u64)
            .sum()
    }

    /// A tiny Qwen2 for tests (hidden 64, 2 layers, 4/2 heads, vocab 512).
    pub fn tiny() -> Self {
        ArchConfig {
            family: Family::Qwen2,
            vocab_size: 512,
            hidden_size: 64,
            intermediate_size: 128,
            num_hidden_layers: 2,
            num_attention_heads: 4,
            num_key_value_heads: 2,
            head_dim: 16,
            max_position_embeddings: 4096,
            rope_theta: 1_000_000.0,
            rope_scaling: None,
            rms_norm_eps: 1e-6,
            tie_word_embeddings: true,
            attention_bias: false,
        }
    }

    /// Qwen2.5-0.5B's shape.
    pub fn qwen25_05b() -> Self {
        ArchConfig {
            vocab_size: 151_936,
            hidden_size: 896,
            intermediate_size: 4864,
            num_hidden_layers: 24,
            num_attention_heads: 14,
            num_key_value_heads: 2,
            head_dim: 64,
            max_position_embeddings: 32768,
            ..ArchConfig::tiny()
        }
    }

    /// Qwen2.5-1.5B's shape.
    pub fn qwen25_15b() -> Self {
        ArchConfig {
            hidden_size: 1536,
            intermediate_size: 8960,
            num_hidden_layers: 28,
            num_attention_heads: 12,
            head_dim: 128,
            ..ArchConfig::qwen25_05b()
        }
    }

    /// Qwen2.5-3B's shape.
    pub fn qwen25_3b() -> Self {
        ArchConfig {
            hidden_size: 2048,
            intermediate_size: 11008,
            num_hidden_layers: 36,
            num_attention_heads: 16,
            head_dim: 128,
            ..ArchConfig::qwen25_05b()
        }
    }

    /// Qwen2.5-7B's shape (untied, vocabulary 152,064).
    pub fn qwen25_7b() -> Self {
        ArchConfig {
            vocab_size: 152_064,
            hidden_size: 3584,
            intermediate_size: 18944,
            num_hidden_layers: 28,
            num_attention_heads: 28,
            num_key_value_heads: 4,
            head_dim: 128,
            tie_word_embeddings: false,
            ..ArchConfig::qwen25_05b()
        }
    }

    /// Qwen3-0.6B's shape.
    pub fn qwen3_06b() -> Self {
        ArchConfig {
            family: Family::Qwen3,
            vocab_size: 151_936,
            hidden_size: 1024,
            intermediate_size: 3072,
            num_hidden_layers: 28,
            num_attention_heads: 16,
            num_key_value_heads: 8,
            head_dim: 128,
            max_position_embeddings: 40960,
            ..ArchConfig::tiny()
        }
    }

    /// Qwen3-4B's shape.
    pub fn qwen3_4b() -> Self {
        ArchConfig {
            hidden_size: 2560,
            intermediate_size: 9728,
            num_hidden_layers: 36,
            num_attention_heads: 32,
            ..ArchConfig::qwen3_06b()
        }
    }

    /// Llama-3.2-1B's shape.
    pub fn llama32_1b() -> Self {
        ArchConfig {
            family: Family::Llama,
            vocab_size: 128_256,
            hidden_size: 2048,
            intermediate_size: 8192,
            num_hidden_layers: 16,
            num_attention_heads: 32,
            num_key_value_heads: 8,
            head_dim: 64,
            max_position_embeddings: 131_072,
            rope_theta: 500_000.0,
            rope_scaling: Some(RopeScaling::Llama3(Llama3Rope::llama32())),
            rms_norm_eps: 1e-5,
            tie_word_embeddings: true,
            attention_bias: false,
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
        // A zero, negative or non-finite base makes every logit NaN; a zero length
        // admits no position.
        for (key, v) in [
            ("rope_theta", c.rope_theta),
            ("rms_norm_eps", c.rms_norm_eps),
        ] {
            if !(v > 0.0 && v.is_finite()) {
                bail!("config: {key} must be a positive number, got {v}");
            }
        }
        if c.max_position_embeddings == 0 {
            bail!("config: max_position_embeddings must be positive");
        }
        if let Some(s) = &c.rope_scaling {
            if c.family != Family::Llama {
                bail!("config: llama3 rope scaling on a {} model", c.family);
            }
            s.validate(c.head_dim)?;
        }
        Ok(())
    }

    /// Every expected tensor name with its shape (`lm_head.weight` only when untied).
    pub fn tensor_shapes(&self) -> Vec<(String, Vec<usize>)> {
        let (h, i, v, d) = (
            self.hidden_size,
            self.intermediate_size,
            self.vocab_size,
            self.head_dim,
        );
        let q = self.num_attention_heads * d;
        let kv = self.num_key_value_heads * d;
        let mut out = vec![("model.embed_tokens.weight".to_string(), vec![v, h])];
        for l in 0..self.num_hidden_layers {
            let p = format!("model.layers.{l}");
            let mut push = |name: &str, shape: Vec<usize>| out.push((format!("{p}.{name}"), shape));
            push("input_layernorm.weight", vec![h]);
            push("post_attention_layernorm.weight", vec![h]);
            for (m, rows, cols) in [("q", q, h), ("k", kv, h), ("v", kv, h), ("o", h, q)] {
                push(&format!("self_attn.{m}_proj.weight"), vec![rows, cols]);
                let bias = if m == "o" {
                    self.o_bias()
                } else {
                    self.qkv_bias()
                };
                if bias {
                    push(&format!("self_attn.{m}_proj.bias"), vec![rows]);
                }
            }
            if self.family.qk_norm() {
                push("self_attn.q_norm.weight", vec![d]);
                push("self_attn.k_norm.weight", vec![d]);
            }
            push("mlp.gate_proj.weight", vec![i, h]);
            push("mlp.up_proj.weight", vec![i, h]);
            push("mlp.down_proj.weight", vec![h, i]);
        }
        out.push(("model.norm.weight".to_string(), vec![h]));
        if !self.tie_word_embeddings {
            out.push(("lm_head.weight".to_string(), vec![v, h]));
        }
        out
    }
}

/// Whether a tensor named like [`ArchConfig::tensor_shapes`] is an RMSNorm weight
/// (initialised to ones).
pub fn is_norm(name: &str) -> bool {
    name.ends_with("layernorm.weight")
        || name.ends_with("_norm.weight")
        || name == "model.norm.weight"
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 54, item 14: a bad factor is named by its key, not printed as a struct.
    #[test]
    fn rope_scaling_errors_name_the_factor() {
        for (edit, key) in [
            (
                Llama3Rope {
                    factor: 0.0,
                    ..Llama3Rope::llama32()
                },
                "factor",
            ),
            (
                Llama3Rope {
                    low_freq_factor: f64::NAN,
                    ..Llama3Rope::llama32()
                },
                "low_freq_factor",
            ),
            (
                Llama3Rope {
                    high_freq_factor: -1.0,
                    ..Llama3Rope::llama32()
                },
                "high_freq_factor",
            ),
        ] {
            let e = edit.validate().unwrap_err().to_string();
            assert!(e.contains(&format!("rope scaling {key} must be")), "{e}");
            assert!(!e.contains("Llama3Rope") && !e.contains('{'), "{e}");
        }
        assert!(Llama3Rope::llama32().validate().is_ok());
    }

    #[test]
    fn parameters_of_released_checkpoints_by_hand() {
        // 24 x (attention 1,836,160 + MLP 13,074,432 + norms 1,792) + tied embedding
        // 151,936 x 896 + final norm 896: the 494,032,768 of the released checkpoint.
        assert_eq!(ArchConfig::qwen25_05b().parameters(), 494_032_768);
        let untied = ArchConfig {
            tie_word_embeddings: false,
            ..ArchConfig::qwen25_05b()
        };
        assert_eq!(untied.parameters(), 494_032_768 + 151_936 * 896);
        // Qwen3-0.6B: 28 x (q 2048x1024 + k, v 1024x1024 + o 1024x2048 + q/k norms 2 x 128
        // + MLP 3 x 1024 x 3072 + norms 2 x 1024) + embedding 151,936 x 1024 + 1024.
        let layer = 2_097_152 + 2 * 1_048_576 + 2_097_152 + 256 + 9_437_184 + 2048;
        assert_eq!(
            ArchConfig::qwen3_06b().parameters(),
            28 * layer + 151_936 * 1024 + 1024
        );
        assert_eq!(ArchConfig::qwen3_06b().parameters(), 596_049_920);
        // Llama-3.2-1B: 16 x (q, o 2048x2048 + k, v 512x2048 + MLP 3 x 2048 x 8192 + norms)
        // + embedding 128,256 x 2048 + 2048: the released 1,235,814,400.
        assert_eq!(ArchConfig::llama32_1b().parameters(), 1_235_814_400);
        // Qwen2.5-1.5B: 28 x (q, o 1536^2 + k, v 256x1536 + q/k/v biases 1536 + 2 x 256
        // + MLP 3 x 1536 x 8960 + norms 2 x 1536) + tied embedding 151,936 x 1536 + 1536.
        let layer = 2 * 2_359_296 + 2 * 393_216 + 2048 + 41_287_680 + 3072;
        assert_eq!(
            ArchConfig::qwen25_15b().parameters(),
            28 * layer + 151_936 * 1536 + 1536
        );
        // The released 1.5B, 3B and 7B.
        assert_eq!(ArchConfig::qwen25_15b().parameters(), 1_543_714_304);
        assert_eq!(ArchConfig::qwen25_3b().parameters(), 3_085_938_688);
        assert_eq!(ArchConfig::qwen25_7b().parameters(), 7_615_616_512);
    }

    #[test]
    fn family_names_round_trip_and_bias_rules() {
        for f in Family::ALL {
            assert_eq!(Family::from_model_type(f.model_type()), Some(f));
            assert_eq!(Family::from_architecture(f.architecture()), Some(f));
            assert_eq!(f.to_string().parse::<Family>().unwrap(), f);
        }
        assert!("mistral".parse::<Family>().is_err());
        let q2 = ArchConfig::tiny();
        assert!(q2.qkv_bias() && !q2.o_bias());
        let l = ArchConfig {
            family: Family::Llama,
            ..ArchConfig::tiny()
        };
        assert!(!l.qkv_bias() && !l.o_bias());
        let lb = ArchConfig {
            attention_bias: true,
            ..l.clone()
        };
        assert!(lb.qkv_bias() && lb.o_bias());
        let scaled_qwen = ArchConfig {
            rope_scaling: Some(RopeScaling::Llama3(Llama3Rope::llama32())),
            ..ArchConfig::tiny()
        };
        assert!(scaled_qwen.validate().is_err());
    }
}

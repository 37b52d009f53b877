//! `concord model init-tiny`: a random-weight Qwen2, Qwen3 or Llama 3 checkpoint laid out
//! like a Hub model directory (config.json, model.safetensors or shards + index, the
//! family's real tokenizer and chat template, generation_config.json; see [`family`]).
//! Deterministic per seed: the same spec writes the same bytes, so tests rebuild the
//! parity-fixture models instead of committing weights.
pub mod family;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::model::arch::{is_norm, ArchConfig, Family, Llama3Rope, RopeScaling};
pub use family::{
    qwen_tokenizer_json, ENDOFTEXT_ID, IM_END_ID, IM_START_ID, QWEN25_CHAT_TEMPLATE, TOKENIZER_IDS,
};

use anyhow::{bail, Context, Result};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use serde_json::json;

/// Storage dtype of a tiny checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TinyDType {
    F32,
    Bf16,
    F16,
}

impl std::str::FromStr for TinyDType {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "f32" | "float32" => Ok(Self::F32),
            "bf16" | "bfloat16" => Ok(Self::Bf16),
            "f16" | "float16" => Ok(Self::F16),
            other => bail!("unknown dtype {other:?} (expected f32, bf16 or f16)"),
        }
    }
}

impl TinyDType {
    fn torch_name(self) -> &'static str {
        match self {
            Self::F32 => "float32",
            Self::Bf16 => "bfloat16",
            Self::F16 => "float16",
        }
    }
    fn bytes(self) -> u64 {
        match self {
            Self::F32 => 4,
            Self::Bf16 | Self::F16 => 2,
        }
    }
    fn st_dtype(self) -> safetensors::Dtype {
        match self {
            Self::F32 => safetensors::Dtype::F32,
            Self::Bf16 => safetensors::Dtype::BF16,
            Self::F16 => safetensors::Dtype::F16,
        }
    }
}

/// Shape and seed of a tiny checkpoint. `Default` is the small test shape; `qwen25_0_5b`
/// the benchmark shape.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct TinySpec {
    pub family: Family,
    pub hidden: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub intermediate: usize,
    /// None: the family tokenizer's (Qwen's padded 151,936; Llama 3's 128,256).
    pub vocab: Option<usize>,
    /// None: hidden / heads.
    pub head_dim: Option<usize>,
    /// Llama 3 RoPE scaling (Llama only).
    pub rope_scaling: Option<Llama3Rope>,
    pub seed: u64,
    pub dtype: TinyDType,
    pub tie: bool,
    pub shards: usize,
}

impl Default for TinySpec {
    fn default() -> Self {
        Self {
            family: Family::Qwen2,
            hidden: 64,
            layers: 2,
            heads: 4,
            kv_heads: 2,
            intermediate: 128,
            vocab: None,
            head_dim: None,
            rope_scaling: None,
            seed: 0,
            dtype: TinyDType::F32,
            tie: true,
            shards: 1,
        }
    }
}

impl TinySpec {
    /// Qwen2.5-0.5B's shape (hidden 896, 24 layers, 14/2 heads, MLP 4864, vocab 151,936).
    pub fn qwen25_0_5b() -> Self {
        Self {
            hidden: 896,
            layers: 24,
            heads: 14,
            kv_heads: 2,
            intermediate: 4864,
            ..Self::default()
        }
    }

    pub fn head_dim(&self) -> usize {
        self.head_dim.unwrap_or(self.hidden / self.heads.max(1))
    }

    pub fn vocab(&self) -> usize {
        self.vocab.unwrap_or(family::vocab(self.family).0)
    }

    pub fn validate(&self) -> Result<()> {
        if self.hidden == 0 || self.layers == 0 || self.heads == 0 || self.kv_heads == 0 {
            bail!("hidden, layers, heads and kv-heads must be positive");
        }
        if self.intermediate == 0 {
            bail!("intermediate must be positive");
        }
        if self.head_dim.is_none() && !self.hidden.is_multiple_of(self.heads) {
            bail!(
                "hidden ({}) must be a multiple of heads ({})",
                self.hidden,
                self.heads
            );
        }
        if !self.heads.is_multiple_of(self.kv_heads) {
            bail!(
                "heads ({}) must be a multiple of kv-heads ({})",
                self.heads,
                self.kv_heads
            );
        }
        if !self.head_dim().is_multiple_of(2) {
            bail!("head dim {} must be even for RoPE", self.head_dim());
        }
        let ids = family::vocab(self.family).1;
        if self.vocab() < ids {
            bail!(
                "vocab {} is smaller than the {} tokenizer's {ids} ids",
                self.vocab(),
                self.family
            );
        }
        if self.rope_scaling.is_some() && self.family != Family::Llama {
            bail!("rope scaling is Llama 3's: use --family llama");
        }
        // Qwen2's config.json has no head_dim: transformers (and this loader) take
        // hidden_size / num_attention_heads, so another value could not load.
        if self.family == Family::Qwen2
            && self.head_dim.is_some_and(|d| d * self.heads != self.hidden)
        {
            bail!(
                "head dim: qwen2's config.json has none (it is hidden / heads = {}); \
                 use --family qwen3 or llama for another",
                self.hidden / self.heads
            );
        }
        if self.shards == 0 {
            bail!("shards must be at least 1");
        }
        let cfg = self.arch_config();
        cfg.validate()?;
        // The weights are drawn in memory before they are written.
        let bytes = cfg.parameters() * self.dtype.bytes();
        if let Some(avail) = crate::sys::available_memory_bytes() {
            if bytes > avail / 2 {
                bail!(
                    "this shape has {} parameters ({:.1} GB), more than half the {:.1} GB of \
                     memory available",
                    cfg.parameters(),
                    bytes as f64 / 1e9,
                    avail as f64 / 1e9
                );
            }
        }
        Ok(())
    }

    /// The architecture this spec writes into config.json: the family's released
    /// hyper-parameters (RoPE base, norm epsilon, context) at this shape.
    pub fn arch_config(&self) -> ArchConfig {
        let base = match self.family {
            Family::Qwen2 => ArchConfig::qwen25_05b(),
            Family::Qwen3 => ArchConfig::qwen3_06b(),
            Family::Llama => ArchConfig::llama32_1b(),
        };
        ArchConfig {
            vocab_size: self.vocab(),
            hidden_size: self.hidden,
            intermediate_size: self.intermediate,
            num_hidden_layers: self.layers,
            num_attention_heads: self.heads,
            num_key_value_heads: self.kv_heads,
            head_dim: self.head_dim(),
            rope_scaling: self.rope_scaling.map(RopeScaling::Llama3),
            tie_word_embeddings: self.tie,
            ..base
        }
    }

    /// config.json as the family's Hub repos write it.
    pub fn config_json(&self) -> serde_json::Value {
        family::config_json(&self.arch_config(), self.dtype.torch_name())
    }

    /// (name, shape) of every tensor the checkpoint holds, in a fixed order.
    pub fn tensor_shapes(&self) -> Vec<(String, Vec<usize>)> {
        self.arch_config().tensor_shapes()
    }
}

/// Deterministic random values for one tensor: its own ChaCha stream, seeded from the spec
/// seed and the tensor name, uniform in a range chosen so every part of the network matters
/// (the parity tests must see a wrong attention or norm): linear weights and biases
/// U(±1/sqrt(fan_in)) like torch's nn.Linear, norm weights U(0.5, 1.5), embeddings with
/// std 4/sqrt(hidden) (tied logits have std ≈ 4), an untied head with std 2/sqrt(hidden).
pub fn tensor_values(spec: &TinySpec, name: &str, shape: &[usize]) -> Vec<f32> {
    let n: usize = shape.iter().product();
    let mut rng = ChaCha8Rng::seed_from_u64(spec.seed ^ fnv1a(name.as_bytes()));
    let sqrt3 = 3f32.sqrt();
    let hidden = spec.hidden as f32;
    let (lo, hi) = if is_norm(name) {
        (0.5, 1.5)
    } else if name == "model.embed_tokens.weight" {
        let a = sqrt3 * 4.0 / hidden.sqrt();
        (-a, a)
    } else if name == "lm_head.weight" {
        let a = sqrt3 * 2.0 / hidden.sqrt();
        (-a, a)
    } else {
        // Linear weight [out, in], or the bias of a q/k/v projection (input = hidden).
        let fan_in = if shape.len() == 2 {
            shape[1]
        } else {
            spec.hidden
        };
        let a = 1.0 / (fan_in as f32).sqrt();
        (-a, a)
    };
    (0..n).map(|_| lo + (hi - lo) * rng.gen::<f32>()).collect()
}

fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

fn to_bytes(values: &[f32], dtype: TinyDType) -> Vec<u8> {
    match dtype {
        TinyDType::F32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        TinyDType::Bf16 => values
            .iter()
            .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes())
            .collect(),
        TinyDType::F16 => values
            .iter()
            .flat_map(|v| half::f16::from_f32(*v).to_le_bytes())
            .collect(),
    }
}

/// Write `bytes` to `dir/name` atomically; returns the path written.
fn write_atomic(dir: &Path, name: &str, bytes: &[u8]) -> Result<PathBuf> {
    let path = dir.join(name);
    crate::atomic::atomic_write_bytes(&path, bytes)?;
    Ok(path)
}

fn json_bytes(v: &serde_json::Value) -> Result<Vec<u8>> {
    let mut s = serde_json::to_string_pretty(v)?;
    s.push('\n');
    Ok(s.into_bytes())
}

/// Write the checkpoint into `out` (created if needed). Returns the files written.
/// Make `out` ready for a new model: a directory that holds only what this function
/// writes (an earlier tiny model) loses its weight files (model.safetensors, shards,
/// index) first; a stale single file would be what the loader reads, with the old
/// seed's weights, and removing first means an interrupted write leaves a model that
/// fails to load rather than one that loads old weights. A directory with any other
/// file is someone's data: refused.
fn clear_earlier_model(out: &Path) -> Result<()> {
    const WRITTEN: [&str; 4] = [
        "config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
    ];
    let is_weights = |n: &str| {
        n == "model.safetensors"
            || n == "model.safetensors.index.json"
            || (n.starts_with("model-") && n.ends_with(".safetensors"))
    };
    let mut weights = Vec::new();
    for e in std::fs::read_dir(out).with_context(|| format!("reading {}", out.display()))? {
        let p = e?.path();
        let name = p
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if is_weights(&name) && p.is_file() {
            weights.push(p);
        } else if !(WRITTEN.contains(&name.as_str()) && p.is_file()) {
            bail!(
                "{} holds {name}, which init-tiny does not write: give an empty or absent \
                 directory (or one holding an earlier tiny model only)",
                out.display()
            );
        }
    }
    for p in weights {
        std::fs::remove_file(&p).with_context(|| format!("removing {}", p.display()))?;
    }
    Ok(())
}

pub fn init_tiny(spec: &TinySpec, out: &Path) -> Result<Vec<PathBuf>> {
    spec.validate()?;
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    clear_earlier_model(out)?;
    let mut written = Vec::new();

    written.push(write_atomic(
        out,
        "config.json",
        &json_bytes(&spec.config_json())?,
    )?);
    let tok = family::tokenizer_json(spec.family)?;
    written.push(write_atomic(out, "tokenizer.json", &tok)?);
    written.push(write_atomic(
        out,
        "tokenizer_config.json",
        &json_bytes(&family::tokenizer_config_json(spec.family, &tok)?)?,
    )?);
    written.push(write_atomic(
        out,
        "generation_config.json",
        &json_bytes(&family::generation_config_json(spec.family))?,
    )?);

    // Weights: tensors split into `shards` contiguous groups of (about) equal count.
    let shapes = spec.tensor_shapes();
    let n_shards = spec.shards.min(shapes.len());
    let n_tensors = shapes.len();
    let mut groups: Vec<Vec<(String, Vec<usize>)>> = vec![Vec::new(); n_shards];
    for (k, t) in shapes.into_iter().enumerate() {
        groups[k * n_shards / n_tensors].push(t);
    }
    let n_files = groups.len();
    let mut weight_map = BTreeMap::new();
    let mut total_size = 0usize;
    for (k, group) in groups.iter().enumerate() {
        let file = if n_files == 1 {
            "model.safetensors".to_string()
        } else {
            format!("model-{:05}-of-{:05}.safetensors", k + 1, n_files)
        };
        let data: Vec<(String, Vec<usize>, Vec<u8>)> = group
            .iter()
            .map(|(name, shape)| {
                let v = tensor_values(spec, name, shape);
                (name.clone(), shape.clone(), to_bytes(&v, spec.dtype))
            })
            .collect();
        let mut views = Vec::with_capacity(data.len());
        for (name, shape, bytes) in &data {
            total_size += bytes.len();
            weight_map.insert(name.clone(), file.clone());
            let view =
                safetensors::tensor::TensorView::new(spec.dtype.st_dtype(), shape.clone(), bytes)
                    .map_err(|e| anyhow::anyhow!("tensor {name}: {e:?}"))?;
            views.push((name.clone(), view));
        }
        let meta = std::collections::HashMap::from([("format".to_string(), "pt".to_string())]);
        let bytes = safetensors::tensor::serialize(views, &Some(meta))
            .map_err(|e| anyhow::anyhow!("serialising {file}: {e:?}"))?;
        written.push(write_atomic(out, &file, &bytes)?);
    }
    if n_files > 1 {
        let index = json!({
            "metadata": {"total_size": total_size},
            "weight_map": weight_map,
        });
        written.push(write_atomic(
            out,
            "model.safetensors.index.json",
            &json_bytes(&index)?,
        )?);
    }
    Ok(written)
}

//! GGUF checkpoints (llama.cpp, Ollama): `--model FILE.gguf` / `[model] name = "FILE.gguf"`.
//!
//! `general.architecture` `qwen2`, `qwen3` and `llama` (Llama 3.x) are loaded. The file is
//! read with candle's `quantized::gguf_file`; every tensor is dequantized (any type candle
//! reads: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K … Q6_K), given back the
//! Hugging Face layout (llama's q/k rows, see [`names`]), converted to the requested
//! dtype and renamed to the Hugging Face names of [`Weights`], so the result is what a
//! safetensors checkpoint gives (see [`load_checkpoint`]). Training then runs on the
//! dequantized weights (LoRA on top), like transformers' own GGUF loader.
//!
//! - [`metadata`]: the `{arch}.*` keys → [`ArchConfig`];
//! - [`names`]: tensor names and the llama q/k un-permutation;
//! - [`tokenizer`]: the tokenizer built from `tokenizer.ggml.*`;
//! - [`header`]: reading the header, with named errors for truncated files and tensor
//!   types candle cannot read.
//!
//! # Llama 3 RoPE scaling
//! llama.cpp's converter writes no `rope.scaling.*` keys for Llama 3.1/3.2: it stores the
//! per-frequency divisors as the F32 tensor `rope_freqs.weight` (`head_dim / 2` values),
//! which becomes [`RopeScaling::Factors`]. llama.cpp reads that tensor only for llama, so
//! a qwen3 file's is ignored too.
pub mod header;
pub mod metadata;
pub mod names;
pub mod tokenizer;

use std::collections::BTreeMap;
use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use candle_core::quantized::gguf_file::Content;
use candle_core::{DType, Device};

pub use super::checkpoint::is_gguf_path;
use super::checkpoint::{
    check_dtype_supported, default_dtype, ensure_finite, Checkpoint, CheckpointConfig, ModelFiles,
};
use super::generation::GenerationConfig;
use super::quant::{is_projection, quantize_one, QuantMode, QuantWeight, QuantWeights};
use super::tokenizer::Tokenizer;
use super::{ArchConfig, Family, RopeScaling, Weights};
pub use header::{ggml_type_name, read_content};
use header::{tensor_bytes, type_name};
pub use metadata::{
    check_architecture, config_from_metadata, family_of_architecture, Metadata, GGUF_ARCHITECTURES,
};
pub use names::{gguf_tensor_name, permuted_heads, unpermute_qk, unpermute_rows};
pub use tokenizer::{
    bpe_tokenizer_json, bundled_vocab_matches, tokenizer_from_metadata, tokenizer_json_from_vocab,
    PreTokenizer, SpecialIds, TokenizerSource, LLAMA3_PRETOKENIZER_REGEX, QWEN2_PRETOKENIZER_REGEX,
    TOKEN_BYTE, TOKEN_CONTROL, TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_UNUSED, TOKEN_USER_DEFINED,
};

/// The tensor holding Llama 3's RoPE frequency divisors.
pub const ROPE_FREQS: &str = "rope_freqs.weight";

/// A GGUF model, dequantized and renamed: everything [`Checkpoint`] needs.
pub struct GgufModel {
    pub path: PathBuf,
    pub config: ArchConfig,
    /// Hugging Face names and layout, in `dtype`, on the requested device.
    pub weights: Weights,
    /// With a quantized base: the projections and LM head, kept quantized.
    pub quant: QuantWeights,
    pub dtype: DType,
    pub tokenizer: Tokenizer,
    pub tokenizer_source: TokenizerSource,
    /// `tokenizer.chat_template` (None: the file has none; the tokenizer then uses ChatML).
    pub chat_template: Option<String>,
    pub bos_token_id: Option<u32>,
    /// `tokenizer.ggml.eos_token_id` (then `eot_token_id`, `eom_token_id` when present,
    /// and for llama Llama 3's `<|end_of_text|>`, `<|eom_id|>`, `<|eot_id|>`).
    pub eos_token_ids: Vec<u32>,
    pub pad_token_id: Option<u32>,
    /// `general.name`, when present.
    pub name: Option<String>,
    /// How many tensors of each ggml type the file held (e.g. `Q4K: 133`).
    pub tensor_types: BTreeMap<String, usize>,
}

/// An open GGUF file: its header, a reader for tensor data, its path and length.
struct GgufFile {
    content: Content,
    reader: BufReader<File>,
    path: PathBuf,
    len: u64,
}

impl GgufFile {
    fn open(path: &Path) -> Result<Self> {
        let content = read_content(path)?;
        let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
        let len = file
            .metadata()
            .with_context(|| format!("reading {}", path.display()))?
            .len();
        Ok(GgufFile {
            content,
            reader: BufReader::new(file),
            path: path.to_path_buf(),
            len,
        })
    }

    /// Check tensor `g`'s shape and that its data lies inside the file.
    fn check_tensor(&self, g: &str, shape: &[usize], from: &str) -> Result<()> {
        let info = self
            .content
            .tensor_infos
            .get(g)
            .ok_or_else(|| anyhow!("GGUF tensor {g} ({from}) is missing"))?;
        if info.shape.dims() != shape {
            bail!(
                "GGUF tensor {g} has shape {:?}, expected {shape:?} from the metadata",
                info.shape.dims()
            );
        }
        let end = self
            .content
            .tensor_data_offset
            .saturating_add(info.offset)
            .saturating_add(tensor_bytes(info.ggml_dtype, info.shape.elem_count()) as u64);
        if end > self.len {
            bail!(
                "truncated GGUF file {}: tensor {g} ends at byte {end} but the file has {} bytes",
                self.path.display(),
                self.len
            );
        }
        Ok(())
    }

    /// Tensor `g` dequantized to f32 on the CPU.
    fn dequantized(&mut self, g: &str) -> Result<candle_core::Tensor> {
        let q = self
            .content
            .tensor(&mut self.reader, g, &Device::Cpu)
            .with_context(|| format!("reading GGUF tensor {g}"))?;
        q.dequantize(&Device::Cpu)
            .with_context(|| format!("dequantizing GGUF tensor {g} ({})", type_name(q.dtype())))
    }
}

impl GgufFile {
    /// The projection `hf` (GGUF tensor `g`) as a quantized base keeps it: the file's
    /// blocks bit for bit when `mode` keeps this type (Llama's q/k rows reordered whole),
    /// else dequantized and quantized to `mode`'s type. Checked finite.
    fn quantized(
        &mut self,
        hf: &str,
        g: &str,
        config: &ArchConfig,
        mode: QuantMode,
        device: &Device,
    ) -> Result<QuantWeight> {
        let q = self
            .content
            .tensor(&mut self.reader, g, &Device::Cpu)
            .with_context(|| format!("reading GGUF tensor {g}"))?;
        let ty = q.dtype();
        let (n, k) = q.shape().dims2()?;
        let heads = permuted_heads(config, hf);
        let keep = mode
            .target(k, hf == "lm_head.weight")
            .is_none_or(|t| t == ty);
        let w = if keep {
            let w = QuantWeight::new(q)?;
            let w = match heads {
                Some(h) => w.permute_rows(&unpermute_rows(n, h)?)?,
                None => w,
            };
            w.to_device(device)?
        } else {
            let mut t = q.dequantize(&Device::Cpu)?;
            if let Some(h) = heads {
                t = unpermute_qk(&t, h)?;
            }
            quantize_one(hf, &t.to_device(device)?, mode)?
        };
        ensure_finite(hf, &w.dequantize(DType::F32)?)
            .with_context(|| format!("GGUF tensor {g} ({})", type_name(ty)))?;
        Ok(w)
    }
}

/// The architecture: the metadata's, with what only tensors tell (vocabulary, tied head,
/// attention biases, Llama 3 RoPE factors).
fn file_config(f: &mut GgufFile) -> Result<ArchConfig> {
    let md = &f.content.metadata;
    let family = check_architecture(md)?;
    let infos = &f.content.tensor_infos;
    let embd = infos
        .get("token_embd.weight")
        .ok_or_else(|| anyhow!("GGUF tensor token_embd.weight is missing"))?;
    let dims = embd.shape.dims();
    if dims.len() != 2 {
        bail!("GGUF tensor token_embd.weight has shape {dims:?}, expected [vocab, hidden]");
    }
    let mut config = config_from_metadata(md, dims[0], infos.contains_key("output.weight"))?;
    // Qwen2 always has q/k/v biases; Qwen3 and Llama have q/k/v/o biases or none.
    config.attention_bias = family != Family::Qwen2 && infos.contains_key("blk.0.attn_q.bias");
    if family == Family::Llama && infos.contains_key(ROPE_FREQS) {
        let factors = rope_factors(f, config.head_dim)?;
        config.rope_scaling = Some(RopeScaling::Factors(factors));
    }
    config.validate().context("GGUF metadata")?;
    Ok(config)
}

/// `rope_freqs.weight`: `head_dim / 2` positive divisors of the RoPE frequencies.
fn rope_factors(f: &mut GgufFile, head_dim: usize) -> Result<Vec<f32>> {
    f.check_tensor(ROPE_FREQS, &[head_dim / 2], "Llama 3 RoPE factors")?;
    let factors: Vec<f32> = f.dequantized(ROPE_FREQS)?.to_vec1()?;
    if let Some(x) = factors.iter().find(|x| !(x.is_finite() && **x > 0.0)) {
        bail!("GGUF tensor {ROPE_FREQS} holds {x}: RoPE factors must be positive numbers");
    }
    Ok(factors)
}

/// (Hugging Face name, GGUF name) of every tensor the model needs, each checked to exist
/// with its shape inside the file before any data is read.
fn plan(f: &GgufFile, config: &ArchConfig) -> Result<Vec<(String, String)>> {
    let mut plan = Vec::new();
    for (hf, shape) in config.tensor_shapes() {
        let g = gguf_tensor_name(&hf)
            .ok_or_else(|| anyhow!("no GGUF name for the {} tensor {hf}", config.family))?;
        f.check_tensor(&g, &shape, &format!("for {hf}"))?;
        plan.push((hf, g));
    }
    Ok(plan)
}

fn read_weights(
    f: &mut GgufFile,
    config: &ArchConfig,
    dtype: DType,
    device: &Device,
    quant: Option<QuantMode>,
) -> Result<(Weights, QuantWeights)> {
    let plan = plan(f, config)?;
    let mut weights = Weights::with_capacity(plan.len());
    let mut qw = QuantWeights::new();
    for (hf, g) in plan {
        if let Some(mode) = quant.filter(|_| is_projection(&hf)) {
            let w = f.quantized(&hf, &g, config, mode, device)?;
            qw.insert(hf, w);
            continue;
        }
        let mut t = f.dequantized(&g)?;
        if let Some(heads) = permuted_heads(config, &hf) {
            t = unpermute_qk(&t, heads).with_context(|| format!("GGUF tensor {g}"))?;
        }
        if t.dtype() != dtype {
            t = t.to_dtype(dtype)?;
        }
        ensure_finite(&hf, &t).with_context(|| format!("GGUF tensor {g}"))?;
        weights.insert(hf, t.to_device(device)?);
    }
    if let Some(mode) = quant {
        if !qw.contains_key("lm_head.weight") {
            // Tied: llama.cpp multiplies by token_embd itself, in its own type.
            let head = f.quantized("lm_head.weight", "token_embd.weight", config, mode, device)?;
            qw.insert("lm_head.weight".into(), head);
        }
    }
    Ok((weights, qw))
}

/// Read a GGUF file: config, dequantized weights (Hugging Face names and layout, `dtype`,
/// on `device`), tokenizer and chat template. With `quant`, the projections and the LM
/// head stay quantized ([`QuantMode::Gguf`]: the file's own blocks).
pub fn load_gguf(
    path: &Path,
    dtype: DType,
    device: &Device,
    quant: Option<QuantMode>,
) -> Result<GgufModel> {
    let ctx = || format!("in {}", path.display());
    let mut f = GgufFile::open(path)?;
    let config = file_config(&mut f).with_context(ctx)?;
    // Dequantized to `dtype`, or about the file's own size kept quantized.
    let bytes = match quant {
        None => config.parameters() as f64 * dtype.size_in_bytes() as f64,
        Some(_) => std::fs::metadata(path).map_or(0.0, |m| m.len() as f64),
    };
    crate::model::budget::check_weights(bytes, device, &path.display().to_string())?;
    let (weights, quant) = read_weights(&mut f, &config, dtype, device, quant).with_context(ctx)?;
    let mut tensor_types: BTreeMap<String, usize> = BTreeMap::new();
    for info in f.content.tensor_infos.values() {
        *tensor_types.entry(type_name(info.ggml_dtype)).or_default() += 1;
    }
    let md = &f.content.metadata;
    let (tokenizer, tokenizer_source, ids) = tokenizer_from_metadata(md).with_context(ctx)?;
    if tokenizer.vocab_size() > config.vocab_size {
        bail!(
            "the GGUF tokenizer has {} ids but token_embd.weight has {} rows ({})",
            tokenizer.vocab_size(),
            config.vocab_size,
            path.display()
        );
    }
    let text =
        |key: &str| -> Result<Option<String>> { Ok(metadata::opt_str(md, key)?.map(String::from)) };
    Ok(GgufModel {
        path: path.to_path_buf(),
        config,
        weights,
        quant,
        dtype,
        chat_template: text("tokenizer.chat_template")?,
        tokenizer,
        tokenizer_source,
        bos_token_id: ids.bos,
        eos_token_ids: ids.eos,
        pad_token_id: ids.pad,
        name: text("general.name")?,
        tensor_types,
    })
}

/// The hook [`super::load::load_checkpoint`] calls for a `.gguf` path: a [`Checkpoint`]
/// like a safetensors directory gives (`files` all point at the GGUF file).
pub fn load_checkpoint(
    path: &Path,
    dtype: Option<DType>,
    device: &Device,
    quant: Option<QuantMode>,
) -> Result<Checkpoint> {
    if !path.is_file() {
        bail!("GGUF file {} does not exist", path.display());
    }
    let dtype = dtype.unwrap_or_else(|| default_dtype(device));
    check_dtype_supported(dtype, device)?;
    let g = load_gguf(path, dtype, device, quant)?;
    let generation_config = GenerationConfig {
        bos_token_id: g.bos_token_id,
        eos_token_ids: g.eos_token_ids.clone(),
        pad_token_id: g.pad_token_id,
        ..GenerationConfig::default()
    };
    let info = CheckpointConfig {
        arch: g.config.clone(),
        architectures: vec![g.config.family.architecture().to_string()],
        stored_dtype: Some(g.tensor_types.keys().cloned().collect::<Vec<_>>().join("+")),
        bos_token_id: g.bos_token_id,
        eos_token_ids: g.eos_token_ids.clone(),
    };
    let files = ModelFiles {
        dir: path
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from(".")),
        config: path.to_path_buf(),
        weights: vec![path.to_path_buf()],
        tokenizer: path.to_path_buf(),
        tokenizer_config: None,
        chat_template: None,
        generation_config: None,
    };
    Ok(Checkpoint {
        config: g.config,
        info,
        weights: g.weights,
        quant: g.quant,
        tokenizer: g.tokenizer,
        generation_config,
        files,
        dtype,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gguf_paths_and_type_names() {
        assert!(is_gguf_path(Path::new("a/b/Model-Q4_K_M.GGUF")));
        assert!(!is_gguf_path(Path::new("a/b/model.safetensors")));
        assert_eq!(ggml_type_name(12), "Q4_K");
        assert_eq!(ggml_type_name(20), "IQ4_NL");
    }
}

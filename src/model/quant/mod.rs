//! A quantized frozen base (QLoRA-style): the seven projections of every layer and the
//! LM head kept in ggml's block formats (Q8_0, Q4_K, or whatever a GGUF file holds),
//! while the embedding, norms, biases, LoRA, activations and accumulation keep the
//! model's dtype.
//!
//! Every use of a quantized weight computes with exactly its dequantized values (candle's
//! `to_float`, the same numbers llama.cpp's `dequantize_row_*` gives) and f32
//! activations: the decode kernel ([`decode`]) dequantizes a tile of rows into L1/L2 and
//! runs the dense decode kernel over it; prefill, the training forward and the backward
//! (`grad_x = grad_y · dequant(W)`, no gradient for W) dequantize the projection for the
//! call and use GEMM. So sampling and training see the same weights, and log-probs
//! agree as closely as with a dense base. ggml's own dot products quantize the
//! activations to 8 bits as well; these kernels do not.
//!
//! - [`BaseDtype`]: what `[model] base_dtype` asks for;
//! - [`QuantWeight`]: one quantized `[out, in]` matrix (a candle `QTensor`);
//! - [`QuantWeights`]: the quantized tensors of a model by Hugging Face name, and
//!   [`quantize_weights`], which moves a dense map's projections into it.
pub mod decode;
pub mod dequant;

use anyhow::{anyhow, bail, Result};
use candle_core::quantized::k_quants::{
    BlockQ2K, BlockQ3K, BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ5K, BlockQ5_0, BlockQ5_1, BlockQ6K,
    BlockQ8K, BlockQ8_0, BlockQ8_1, GgmlType,
};
use candle_core::quantized::{GgmlDType, QStorage, QTensor};
use candle_core::{DType, Device, Tensor};
use half::{bf16, f16};
use rayon::prelude::*;
use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

use super::arch::ArchConfig;
use super::skinny::Kernels;
use super::weights::Weights;

/// How a quantized base is built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuantMode {
    /// Q8_0 (8-bit, one f16 scale per 32 weights: 8.5 bits per weight).
    Q8_0,
    /// Q4_K (4-bit, 256-weight super-blocks: 4.5 bits per weight); a projection whose
    /// input size is not a multiple of 256 falls back to Q5_0, as llama.cpp's quantizer
    /// does, and the LM head is Q6_K (Q8_0 when not a multiple of 256), as in its Q4_K_M.
    Q4K,
    /// A GGUF file's own tensor types, blocks kept bit for bit.
    Gguf,
}

impl QuantMode {
    pub fn name(self) -> &'static str {
        match self {
            QuantMode::Q8_0 => "q8_0",
            QuantMode::Q4K => "q4_k",
            QuantMode::Gguf => "gguf",
        }
    }

    /// The ggml type a projection with `k` inputs gets (`head`: the LM head); None for
    /// [`QuantMode::Gguf`], which keeps the file's.
    pub fn target(self, k: usize, head: bool) -> Option<GgmlDType> {
        let fits = |t: GgmlDType| k.is_multiple_of(t.block_size());
        match self {
            QuantMode::Gguf => None,
            QuantMode::Q8_0 => Some(GgmlDType::Q8_0),
            QuantMode::Q4K if head && fits(GgmlDType::Q6K) => Some(GgmlDType::Q6K),
            QuantMode::Q4K if head => Some(GgmlDType::Q8_0),
            QuantMode::Q4K if fits(GgmlDType::Q4K) => Some(GgmlDType::Q4K),
            QuantMode::Q4K => Some(GgmlDType::Q5_0),
        }
    }
}

/// `[model] base_dtype`: a float storage dtype or a quantized base.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BaseDtype {
    Float(DType),
    Quant(QuantMode),
}

impl BaseDtype {
    /// `f32`, `bf16`, `f16`, `q8_0`, `q4_k` or `gguf`.
    pub fn parse(s: &str) -> Result<BaseDtype> {
        Ok(match s.trim().to_ascii_lowercase().as_str() {
            "f32" | "float32" => BaseDtype::Float(DType::F32),
            "bf16" | "bfloat16" => BaseDtype::Float(DType::BF16),
            "f16" | "float16" => BaseDtype::Float(DType::F16),
            "q8_0" => BaseDtype::Quant(QuantMode::Q8_0),
            "q4_k" => BaseDtype::Quant(QuantMode::Q4K),
            "gguf" => BaseDtype::Quant(QuantMode::Gguf),
            other => bail!("base dtype {other:?}: expected f32, bf16, f16, q8_0, q4_k or gguf"),
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            BaseDtype::Float(DType::BF16) => "bf16",
            BaseDtype::Float(DType::F16) => "f16",
            BaseDtype::Float(_) => "f32",
            BaseDtype::Quant(q) => q.name(),
        }
    }
}

/// Lower-case ggml type name (`q4_k`, `q8_0`, `f16`).
pub fn type_name(t: GgmlDType) -> String {
    match t {
        GgmlDType::Q2K => "q2_k".into(),
        GgmlDType::Q3K => "q3_k".into(),
        GgmlDType::Q4K => "q4_k".into(),
        GgmlDType::Q5K => "q5_k".into(),
        GgmlDType::Q6K => "q6_k".into(),
        GgmlDType::Q8K => "q8_k".into(),
        other => format!("{other:?}").to_ascii_lowercase(),
    }
}

/// One frozen `[n, k]` matrix in a ggml block format. Rows are whole blocks (`k` is a
/// multiple of the block size), so any range of rows is a range of bytes.
#[derive(Clone)]
pub struct QuantWeight {
    q: Arc<QTensor>,
    n: usize,
    k: usize,
}

impl std::fmt::Debug for QuantWeight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "QuantWeight({} [{}, {}])",
            type_name(self.dtype()),
            self.n,
            self.k
        )
    }
}

impl QuantWeight {
    /// Wrap a 2-D `QTensor` (as a GGUF file or [`Self::quantize`] gives it).
    pub fn new(q: QTensor) -> Result<Self> {
        let (n, k) = q.shape().dims2()?;
        if !k.is_multiple_of(q.dtype().block_size()) {
            bail!("{k} columns are not whole {:?} blocks", q.dtype());
        }
        Ok(QuantWeight {
            q: Arc::new(q),
            n,
            k,
        })
    }

    /// Quantize a dense `[n, k]` matrix to `ty` (rows in parallel), on `w`'s device. An
    /// f32 CPU matrix is read in place, and on the CPU the blocks become the storage
    /// without a copy: a 7B embedding quantized as a tied head costs its blocks only.
    pub fn quantize(w: &Tensor, ty: GgmlDType) -> Result<Self> {
        let (n, k) = w.dims2()?;
        if !k.is_multiple_of(ty.block_size()) {
            bail!("{k} columns are not whole {ty:?} blocks");
        }
        let w = w.contiguous()?;
        let dense;
        let (storage, layout) = w.storage_and_layout();
        let x: &[f32] = match &*storage {
            candle_core::Storage::Cpu(candle_core::CpuStorage::F32(v)) => {
                &v[layout.start_offset()..layout.start_offset() + n * k]
            }
            _ => {
                dense = w
                    .to_device(&Device::Cpu)?
                    .to_dtype(DType::F32)?
                    .flatten_all()?
                    .to_vec1::<f32>()?;
                &dense
            }
        };
        let dev = w.device();
        let storage = match ty {
            GgmlDType::Q8_0 => storage_of(quantize_rows::<BlockQ8_0>(x, k), dev, ty)?,
            GgmlDType::Q4K => storage_of(quantize_rows::<BlockQ4K>(x, k), dev, ty)?,
            GgmlDType::Q5_0 => storage_of(quantize_rows::<BlockQ5_0>(x, k), dev, ty)?,
            GgmlDType::Q6K => storage_of(quantize_rows::<BlockQ6K>(x, k), dev, ty)?,
            other => bail!("quantizing to {other:?} is not supported"),
        };
        QuantWeight::new(QTensor::new(storage, (n, k))?)
    }

    /// The same blocks with rows reordered: row `i` of the result is row `perm[i]`.
    /// (llama.cpp's converter permutes Llama's q/k rows; rows are whole blocks, so
    /// undoing it keeps every block bit for bit.)
    pub fn permute_rows(&self, perm: &[usize]) -> Result<Self> {
        if perm.len() != self.n || perm.iter().any(|&p| p >= self.n) {
            bail!(
                "row permutation of length {} for {} rows",
                perm.len(),
                self.n
            );
        }
        let bytes = self.bytes()?;
        let rb = self.row_bytes();
        let mut out = Vec::with_capacity(bytes.len());
        for &p in perm {
            out.extend_from_slice(&bytes[p * rb..(p + 1) * rb]);
        }
        let storage = from_bytes(&out, &self.device(), self.dtype())?;
        QuantWeight::new(QTensor::new(storage, (self.n, self.k))?)
    }

    /// The same blocks on `device`.
    pub fn to_device(&self, device: &Device) -> Result<Self> {
        if device.same_device(&self.device()) {
            return Ok(self.clone());
        }
        let storage = from_bytes(&self.bytes()?, device, self.dtype())?;
        QuantWeight::new(QTensor::new(storage, (self.n, self.k))?)
    }

    pub fn dtype(&self) -> GgmlDType {
        self.q.dtype()
    }
    /// `(out, in)`.
    pub fn dims(&self) -> (usize, usize) {
        (self.n, self.k)
    }
    pub fn device(&self) -> Device {
        self.q.device()
    }
    pub fn qtensor(&self) -> &QTensor {
        &self.q
    }
    /// Bytes of the blocks (what a decode step streams).
    pub fn storage_bytes(&self) -> usize {
        self.n * self.row_bytes()
    }
    /// Bytes of one row of blocks.
    pub fn row_bytes(&self) -> usize {
        self.k / self.dtype().block_size() * self.dtype().type_size()
    }
    /// The blocks as bytes (borrowed on the CPU, copied from a GPU).
    pub fn bytes(&self) -> Result<Cow<'_, [u8]>> {
        Ok(self.q.data()?)
    }

    /// The whole matrix dequantized, in `dtype`, on its device. On the CPU rows are
    /// dequantized in parallel with the same code as the decode kernel.
    pub fn dequantize(&self, dtype: DType) -> candle_core::Result<Tensor> {
        let dev = self.device();
        let t = if dev.is_cpu() {
            let bytes = self.q.data()?;
            let (k, rb) = (self.k, self.row_bytes());
            let mut out = vec![0f32; self.n * k];
            const ROWS: usize = 16;
            out.par_chunks_mut(ROWS * k)
                .zip(bytes.par_chunks(ROWS * rb))
                .try_for_each(|(o, b)| rows_to_f32(self.dtype(), b, o))
                .map_err(|e| candle_core::Error::Msg(format!("{e:#}")))?;
            Tensor::from_vec(out, (self.n, k), &dev)?
        } else {
            self.q.dequantize(&dev)?
        };
        if t.dtype() == dtype {
            Ok(t)
        } else {
            t.to_dtype(dtype)
        }
    }
}

/// Dequantize whole rows of blocks `bytes` of type `ty` into `out` (`out.len()` values):
/// bit for bit what candle's `QTensor::dequantize` gives, on the [`Kernels::active`]
/// path.
pub fn rows_to_f32(ty: GgmlDType, bytes: &[u8], out: &mut [f32]) -> Result<()> {
    rows_to_f32_on(Kernels::active(), ty, bytes, out)
}

/// [`rows_to_f32`] on `path`: the vectorized [`dequant`] code for Q8_0, Q4_K, Q5_0 and
/// Q6_K, candle's `to_float` for every other type.
pub fn rows_to_f32_on(path: Kernels, ty: GgmlDType, bytes: &[u8], out: &mut [f32]) -> Result<()> {
    if dequant::rows(path, ty, bytes, out) {
        return Ok(());
    }
    fn go<T: GgmlType>(bytes: &[u8], out: &mut [f32]) -> Result<()> {
        let size = std::mem::size_of::<T>();
        if !bytes.len().is_multiple_of(size) || bytes.len() / size * T::BLCK_SIZE != out.len() {
            bail!(
                "{} bytes are not {} values of {:?}",
                bytes.len(),
                out.len(),
                T::DTYPE
            );
        }
        if !(bytes.as_ptr() as usize).is_multiple_of(std::mem::align_of::<T>()) {
            bail!("{:?} blocks are not aligned", T::DTYPE);
        }
        // SAFETY: the blocks are plain data (`repr(C)` integers and halves), the length
        // and alignment are checked above, and the bytes outlive the slice.
        let blocks =
            unsafe { std::slice::from_raw_parts(bytes.as_ptr() as *const T, bytes.len() / size) };
        T::to_float(blocks, out);
        Ok(())
    }
    match ty {
        GgmlDType::F32 => go::<f32>(bytes, out),
        GgmlDType::F16 => go::<f16>(bytes, out),
        GgmlDType::BF16 => go::<bf16>(bytes, out),
        GgmlDType::Q4_0 => go::<BlockQ4_0>(bytes, out),
        GgmlDType::Q4_1 => go::<BlockQ4_1>(bytes, out),
        GgmlDType::Q5_0 => go::<BlockQ5_0>(bytes, out),
        GgmlDType::Q5_1 => go::<BlockQ5_1>(bytes, out),
        GgmlDType::Q8_0 => go::<BlockQ8_0>(bytes, out),
        GgmlDType::Q8_1 => go::<BlockQ8_1>(bytes, out),
        GgmlDType::Q2K => go::<BlockQ2K>(bytes, out),
        GgmlDType::Q3K => go::<BlockQ3K>(bytes, out),
        GgmlDType::Q4K => go::<BlockQ4K>(bytes, out),
        GgmlDType::Q5K => go::<BlockQ5K>(bytes, out),
        GgmlDType::Q6K => go::<BlockQ6K>(bytes, out),
        GgmlDType::Q8K => go::<BlockQ8K>(bytes, out),
    }
}

/// Quantize rows of `k` values in parallel (each row is whole blocks).
fn quantize_rows<T: GgmlType>(x: &[f32], k: usize) -> Vec<T> {
    const ROWS: usize = 16;
    let per_row = k / T::BLCK_SIZE;
    let mut ys = vec![T::zeros(); x.len() / T::BLCK_SIZE];
    ys.par_chunks_mut(ROWS * per_row)
        .zip(x.par_chunks(ROWS * k))
        .for_each(|(y, x)| T::from_float(x, y));
    ys
}

fn storage_of<T: GgmlType + 'static>(
    blocks: Vec<T>,
    device: &Device,
    ty: GgmlDType,
) -> Result<QStorage> {
    if device.is_cpu() {
        return Ok(QStorage::Cpu(Box::new(blocks)));
    }
    // SAFETY: blocks are plain data; the byte view covers exactly the vector.
    let bytes = unsafe {
        std::slice::from_raw_parts(
            blocks.as_ptr() as *const u8,
            std::mem::size_of_val(&blocks[..]),
        )
    };
    Ok(QStorage::from_data(Cow::Borrowed(bytes), device, ty)?)
}

/// Blocks from bytes of any alignment (candle's loader asserts the alignment of its
/// input, so unaligned bytes are copied into blocks first).
fn from_bytes(bytes: &[u8], device: &Device, ty: GgmlDType) -> Result<QStorage> {
    let align = match ty {
        GgmlDType::F32 | GgmlDType::Q8K => 4,
        _ => 2,
    };
    if (bytes.as_ptr() as usize).is_multiple_of(align) {
        return Ok(QStorage::from_data(Cow::Borrowed(bytes), device, ty)?);
    }
    let mut words = vec![0u32; bytes.len().div_ceil(4)];
    // SAFETY: `words` has at least `bytes.len()` bytes.
    let dst = unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr() as *mut u8, bytes.len()) };
    dst.copy_from_slice(bytes);
    Ok(QStorage::from_data(Cow::Borrowed(dst), device, ty)?)
}

/// Quantized tensors by Hugging Face name (the projections and `lm_head.weight`).
pub type QuantWeights = HashMap<String, QuantWeight>;

/// Whether `name` is a frozen projection that a quantized base quantizes: the seven
/// linear layers of every decoder layer and the LM head.
pub fn is_projection(name: &str) -> bool {
    name == "lm_head.weight"
        || (name.starts_with("model.layers.")
            && name.ends_with("_proj.weight")
            && (name.contains(".self_attn.") || name.contains(".mlp.")))
}

/// Move the projections of a dense map into quantized tensors: each is removed from
/// `weights` as it is quantized, so the dense copy of one tensor at a time exists. A
/// tied LM head is quantized from the embedding, which stays dense. `mode` must not be
/// [`QuantMode::Gguf`], which needs a GGUF file's own blocks.
pub fn quantize_weights(
    cfg: &ArchConfig,
    weights: &mut Weights,
    mode: QuantMode,
) -> Result<QuantWeights> {
    let mut out = QuantWeights::new();
    let names: Vec<String> = cfg
        .tensor_shapes()
        .into_iter()
        .map(|(n, _)| n)
        .filter(|n| is_projection(n))
        .collect();
    for name in names {
        let w = weights
            .remove(&name)
            .ok_or_else(|| anyhow!("missing tensor {name}"))?;
        out.insert(name.clone(), quantize_one(&name, &w, mode)?);
    }
    quantize_tied_head(weights, &mut out, mode)?;
    Ok(out)
}

/// A tied model's LM head: a quantized copy of the embedding, which stays dense (nothing
/// to do when `quant` holds an untied head already).
pub fn quantize_tied_head(
    dense: &Weights,
    quant: &mut QuantWeights,
    mode: QuantMode,
) -> Result<()> {
    if quant.contains_key("lm_head.weight") {
        return Ok(());
    }
    let e = dense
        .get("model.embed_tokens.weight")
        .ok_or_else(|| anyhow!("missing tensor model.embed_tokens.weight"))?;
    quant.insert(
        "lm_head.weight".into(),
        quantize_one("lm_head.weight", e, mode)?,
    );
    Ok(())
}

/// Quantize one dense projection as `mode` asks.
pub fn quantize_one(name: &str, w: &Tensor, mode: QuantMode) -> Result<QuantWeight> {
    let k = w.dim(1)?;
    let ty = mode.target(k, name == "lm_head.weight").ok_or_else(|| {
        anyhow!(
            "base_dtype = \"gguf\" keeps a GGUF file's own blocks: the model is not a .gguf file"
        )
    })?;
    QuantWeight::quantize(w, ty)
        .map_err(|e| anyhow!("quantizing {name} to {}: {e:#}", type_name(ty)))
}

/// Candle's own dequantization of `q` (the reference the tests here hold to).
#[cfg(test)]
pub(crate) fn candle_values(q: &QuantWeight) -> Vec<f32> {
    q.qtensor()
        .dequantize(&Device::Cpu)
        .and_then(|t| t.flatten_all())
        .and_then(|t| t.to_vec1())
        .expect("candle dequantizes")
}

//! The frozen linear layer `y = x W^T (+ b)`: the decode-step fast path, the GEMM path
//! and a backward that returns the input gradient only, over a dense or a quantized
//! weight ([`BaseWeight`]).
use super::cpu_of;
use crate::model::quant::{decode, QuantWeight};
use crate::model::skinny;
use candle_core::backend::BackendStorage;
use candle_core::op::Add;
use candle_core::{CpuStorage, CustomOp1, DType, Layout, Result, Shape, Storage, Tensor};

#[cfg(feature = "cuda")]
use super::cuda_of;
#[cfg(feature = "cuda")]
use candle_core::CudaStorage;

// ---------------------------------------------------------------------------------------
// Helpers over backend storages (generic so the CPU and CUDA paths share the code).

fn linear_impl<S: BackendStorage>(
    x: &S,
    xl: &Layout,
    w: &S,
    wl: &Layout,
    b: Option<(&S, &Layout)>,
) -> Result<(S, Shape)> {
    if !xl.is_contiguous() {
        candle_core::bail!("frozen_linear: input must be contiguous");
    }
    let dims = xl.dims();
    let k = *dims.last().unwrap_or(&0);
    let m: usize = dims[..dims.len().saturating_sub(1)].iter().product();
    let (n, k2) = (wl.dims()[0], wl.dims()[1]);
    if k != k2 {
        candle_core::bail!("frozen_linear: input {dims:?} vs weight {:?}", wl.dims());
    }
    let x2 = Layout::contiguous_with_offset((m, k), xl.start_offset());
    let wt = wl.transpose(0, 1)?;
    let mut y = x.matmul(w, (1, m, n, k), &x2, &wt)?;
    let yl = Layout::contiguous((m, n));
    if let Some((bs, bl)) = b {
        let bb = bl.broadcast_as((m, n))?;
        y = y.binary_impl::<Add>(bs, &yl, &bb)?;
    }
    let mut out = dims[..dims.len() - 1].to_vec();
    out.push(n);
    Ok((y, Shape::from(out)))
}

// ---------------------------------------------------------------------------------------
// Frozen linear: y = x W^T (+ b); backward returns only dL/dx.

struct FrozenLinear {
    w: Tensor,
    b: Option<Tensor>,
}

impl CustomOp1 for FrozenLinear {
    fn name(&self) -> &'static str {
        "frozen-linear"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        {
            let (ws, wl) = self.w.storage_and_layout();
            let ws = cpu_of(&ws, "frozen_linear weight")?;
            if let Some(out) = skinny_linear(s, l, ws, wl, self.b.as_ref())? {
                return Ok(out);
            }
        }
        // A base stored narrower than the activations ([`widen`]) is widened for this
        // call only.
        let w = widen(&self.w, s.dtype())?;
        let (ws, wl) = w.storage_and_layout();
        let ws = cpu_of(&ws, "frozen_linear weight")?;
        match &self.b {
            None => linear_impl(s, l, ws, wl, None),
            Some(b) => {
                let (bs, bl) = b.storage_and_layout();
                let bs = cpu_of(&bs, "frozen_linear bias")?;
                linear_impl(s, l, ws, wl, Some((bs, bl)))
            }
        }
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(&self, s: &CudaStorage, l: &Layout) -> Result<(CudaStorage, Shape)> {
        let w = widen(&self.w, s.dtype())?;
        let (ws, wl) = w.storage_and_layout();
        let ws = cuda_of(&ws, "frozen_linear weight")?;
        match &self.b {
            None => linear_impl(s, l, ws, wl, None),
            Some(b) => {
                let (bs, bl) = b.storage_and_layout();
                let bs = cuda_of(&bs, "frozen_linear bias")?;
                linear_impl(s, l, ws, wl, Some((bs, bl)))
            }
        }
    }

    fn bwd(&self, arg: &Tensor, _res: &Tensor, g: &Tensor) -> Result<Option<Tensor>> {
        let n = self.w.dim(0)?;
        let g2 = g.reshape(((), n))?;
        let gx = g2.matmul(&widen(&self.w, g2.dtype())?)?;
        Ok(Some(gx.reshape(arg.shape())?))
    }
}

/// The frozen weight `w` in the activations' dtype: itself when it is stored so, else a
/// converted copy. A base stored in bf16 or f16 under f32 activations
/// (`[model] base_dtype`) is widened exactly, so every path (the decode kernel, GEMM,
/// the backward) computes with the same values.
pub fn widen(w: &Tensor, dtype: DType) -> Result<Tensor> {
    if w.dtype() == dtype {
        Ok(w.clone())
    } else {
        w.to_dtype(dtype)
    }
}

/// The decode-step fast path: f32 activations, f32, bf16 or f16 weights (widened in the
/// kernel), contiguous, at most [`skinny::MAX_ROWS`] rows.
fn skinny_linear(
    s: &CpuStorage,
    l: &Layout,
    ws: &CpuStorage,
    wl: &Layout,
    b: Option<&Tensor>,
) -> Result<Option<(CpuStorage, Shape)>> {
    let CpuStorage::F32(x) = s else {
        return Ok(None);
    };
    let dims = l.dims();
    let k = *dims.last().unwrap_or(&0);
    let m: usize = dims[..dims.len().saturating_sub(1)].iter().product();
    let (n, k2) = (wl.dims()[0], wl.dims()[1]);
    if m > skinny::MAX_ROWS || k != k2 || !l.is_contiguous() || !wl.is_contiguous() {
        return Ok(None);
    }
    let x = &x[l.start_offset()..l.start_offset() + m * k];
    let span = wl.start_offset()..wl.start_offset() + n * k;
    let y = match ws {
        CpuStorage::F32(w) => skinny::matmul_wt(x, &w[span], m, k, n),
        CpuStorage::BF16(w) => skinny::matmul_wt(x, &w[span], m, k, n),
        CpuStorage::F16(w) => skinny::matmul_wt(x, &w[span], m, k, n),
        _ => return Ok(None),
    };
    Ok(Some(with_bias(y, dims, n, b)?))
}

/// The decode kernel's output `[m, n]` plus the bias, shaped like the input.
fn with_bias(
    mut y: Vec<f32>,
    dims: &[usize],
    n: usize,
    b: Option<&Tensor>,
) -> Result<(CpuStorage, Shape)> {
    if let Some(b) = b {
        let bias = b.to_dtype(DType::F32)?.to_vec1::<f32>()?;
        for row in y.chunks_exact_mut(n) {
            for (v, bv) in row.iter_mut().zip(&bias) {
                *v += bv;
            }
        }
    }
    let mut out = dims[..dims.len() - 1].to_vec();
    out.push(n);
    Ok((CpuStorage::F32(y), Shape::from(out)))
}

// ---------------------------------------------------------------------------------------
// Quantized frozen linear: y = x dequant(W)^T (+ b); backward returns only dL/dx.

struct QuantLinear {
    w: QuantWeight,
    b: Option<Tensor>,
}

impl QuantLinear {
    /// GEMM on the dequantized weight (prefill, training): dequantized for this call.
    fn dense<S: BackendStorage>(
        &self,
        s: &S,
        l: &Layout,
        dtype: DType,
        of: impl for<'a> Fn(&'a Storage) -> Result<&'a S>,
    ) -> Result<(S, Shape)> {
        let w = self.w.dequantize(dtype)?;
        let (ws, wl) = w.storage_and_layout();
        let ws = of(&ws)?;
        match &self.b {
            None => linear_impl(s, l, ws, wl, None),
            Some(b) => {
                let (bs, bl) = b.storage_and_layout();
                let bs = of(&bs)?;
                linear_impl(s, l, ws, wl, Some((bs, bl)))
            }
        }
    }
}

impl CustomOp1 for QuantLinear {
    fn name(&self) -> &'static str {
        "quant-linear"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let dims = l.dims();
        let k = *dims.last().unwrap_or(&0);
        let m: usize = dims[..dims.len().saturating_sub(1)].iter().product();
        let (n, k2) = self.w.dims();
        if k != k2 {
            candle_core::bail!("quant_linear: input {dims:?} vs weight [{n}, {k2}]");
        }
        if let CpuStorage::F32(x) = s {
            if m <= skinny::MAX_ROWS && l.is_contiguous() {
                let x = &x[l.start_offset()..l.start_offset() + m * k];
                let y = decode::matmul_wt(x, &self.w, m)
                    .map_err(|e| candle_core::Error::Msg(format!("quant_linear: {e:#}")))?;
                return with_bias(y, dims, n, self.b.as_ref());
            }
        }
        self.dense(s, l, s.dtype(), |st| cpu_of(st, "quant_linear weight"))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(&self, s: &CudaStorage, l: &Layout) -> Result<(CudaStorage, Shape)> {
        self.dense(s, l, s.dtype(), |st| cuda_of(st, "quant_linear weight"))
    }

    fn bwd(&self, arg: &Tensor, _res: &Tensor, g: &Tensor) -> Result<Option<Tensor>> {
        let (n, _) = self.w.dims();
        let g2 = g.reshape(((), n))?;
        let gx = g2.matmul(&self.w.dequantize(g2.dtype())?)?;
        Ok(Some(gx.reshape(arg.shape())?))
    }
}

/// A frozen base matrix `[out, in]`: dense (f32, bf16, f16) or quantized.
#[derive(Debug, Clone)]
pub enum BaseWeight {
    Dense(Tensor),
    Quant(QuantWeight),
}

impl BaseWeight {
    /// `(out, in)`.
    pub fn dims(&self) -> Result<(usize, usize)> {
        match self {
            BaseWeight::Dense(t) => t.dims2(),
            BaseWeight::Quant(q) => Ok(q.dims()),
        }
    }

    /// The values in `dtype` (a dense one widened, a quantized one dequantized), for
    /// the code that needs the matrix itself (the LM head's log-probs, a backward).
    pub fn dense(&self, dtype: DType) -> Result<Tensor> {
        match self {
            BaseWeight::Dense(t) => widen(t, dtype),
            BaseWeight::Quant(q) => q.dequantize(dtype),
        }
    }

    /// Bytes the matrix occupies.
    pub fn storage_bytes(&self) -> usize {
        match self {
            BaseWeight::Dense(t) => t.elem_count() * t.dtype().size_in_bytes(),
            BaseWeight::Quant(q) => q.storage_bytes(),
        }
    }

    /// The storage type's name: `f32`, `bf16`, `q4_k`, ...
    pub fn type_name(&self) -> String {
        match self {
            BaseWeight::Dense(t) => format!("{:?}", t.dtype()).to_ascii_lowercase(),
            BaseWeight::Quant(q) => crate::model::quant::type_name(q.dtype()),
        }
    }
}

/// [`frozen_linear`] over a dense or quantized base matrix.
pub fn base_linear(x: &Tensor, w: &BaseWeight, b: Option<&Tensor>) -> Result<Tensor> {
    match w {
        BaseWeight::Dense(w) => frozen_linear(x, w, b),
        BaseWeight::Quant(w) => x.contiguous()?.apply_op1(QuantLinear {
            w: w.clone(),
            b: b.cloned(),
        }),
    }
}

/// `y = x W^T + b` with a frozen `W` `[out, in]` (and optional bias `[out]`): the
/// backward returns the input gradient only; no gradient is computed or stored for
/// `W`/`b`. `x` is `[..., in]` in the weight's dtype.
pub fn frozen_linear(x: &Tensor, w: &Tensor, b: Option<&Tensor>) -> Result<Tensor> {
    let x = x.contiguous()?;
    x.apply_op1(FrozenLinear {
        w: w.clone(),
        b: b.cloned(),
    })
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{check, rand};
    use super::*;

    #[test]
    fn frozen_linear_matches_matmul() {
        let w = rand(&[5, 6], 3);
        let b = rand(&[5], 4);
        check(
            &[2, 3, 6],
            |x| frozen_linear(x, &w, Some(&b)),
            |x| x.broadcast_matmul(&w.t()?)?.broadcast_add(&b),
        );
        check(
            &[4, 6],
            |x| frozen_linear(x, &w, None),
            |x| x.matmul(&w.t()?),
        );
    }

    /// Values (decode rows and GEMM rows) and the input gradient of a quantized frozen
    /// linear equal those of a dense one on the dequantized weight; no gradient for it.
    #[test]
    fn quant_linear_is_the_dense_linear_of_its_dequantized_weight() {
        use candle_core::quantized::GgmlDType;
        let w = rand(&[24, 256], 5);
        let b = rand(&[24], 6);
        for ty in [GgmlDType::Q8_0, GgmlDType::Q4K] {
            let q = BaseWeight::Quant(QuantWeight::quantize(&w, ty).unwrap());
            let wd = q.dense(DType::F32).unwrap();
            // 2 x 3 rows take the decode kernel, 2 x 40 the GEMM path.
            for shape in [[2, 3, 256], [2, 40, 256]] {
                check(
                    &shape,
                    |x| base_linear(x, &q, Some(&b)),
                    |x| x.broadcast_matmul(&wd.t()?)?.broadcast_add(&b),
                );
            }
        }
    }
}

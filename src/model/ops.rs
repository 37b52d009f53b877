//! Differentiable and fused ops with real backward passes.
//!
//! Candle's backprop computes (and keeps) a gradient for *every* operand of a recorded
//! op, even operands that do not depend on any variable: a frozen weight in a plain
//! `matmul` gets a weight-sized gradient, a constant mask in a `broadcast_add` gets a
//! mask-sized one. The ops here record a backward that only returns gradients for
//! operands that are actually tracked (a variable or derived from one), so after
//! `loss.backward()` the gradient store holds the LoRA parameters and nothing else.
//!
//! Two patterns are used:
//! - direct custom ops whose forward runs candle's backend kernels on the storages
//!   (frozen linear, matmul, add, mul) — no extra copy;
//! - [`attach`]: compute the result from detached tensors with ordinary candle ops, then
//!   attach it to the graph through a custom op whose forward copies the result and whose
//!   backward is supplied by the caller (RMSNorm, RoPE, masked softmax, chunked log-probs).
//!
//! When no operand is tracked (sampling, reference policy), no op is recorded and no copy
//! is made.
use candle_core::backend::BackendStorage;
use candle_core::op::{Add, Mul};
use candle_core::{
    CpuStorage, CustomOp1, CustomOp2, CustomOp3, DType, Layout, Result, Shape, Storage, Tensor, D,
};
use std::sync::Mutex;

#[cfg(feature = "cuda")]
use candle_core::CudaStorage;

// ---------------------------------------------------------------------------------------
// Helpers over backend storages (generic so the CPU and CUDA paths share the code).

fn matmul_dims(l1: &Layout, l2: &Layout) -> Result<((usize, usize, usize, usize), Shape)> {
    let a = l1.dims();
    let b = l2.dims();
    let r = a.len();
    if r < 2 || b.len() != r {
        candle_core::bail!("matmul: rank mismatch {a:?} x {b:?}");
    }
    let (m, k) = (a[r - 2], a[r - 1]);
    let (k2, n) = (b[r - 2], b[r - 1]);
    let batch: usize = a[..r - 2].iter().product();
    let batch2: usize = b[..r - 2].iter().product();
    if k != k2 || batch != batch2 {
        candle_core::bail!("matmul: shape mismatch {a:?} x {b:?}");
    }
    let mut out = a[..r - 2].to_vec();
    out.extend([m, n]);
    Ok(((batch, m, n, k), Shape::from(out)))
}

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

fn cpu_of<'a>(s: &'a Storage, what: &str) -> Result<&'a CpuStorage> {
    match s {
        Storage::Cpu(c) => Ok(c),
        _ => candle_core::bail!("{what}: expected a cpu tensor"),
    }
}

#[cfg(feature = "cuda")]
fn cuda_of<'a>(s: &'a Storage, what: &str) -> Result<&'a CudaStorage> {
    match s {
        Storage::Cuda(c) => Ok(c),
        _ => candle_core::bail!("{what}: expected a cuda tensor"),
    }
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
    if m > super::skinny::MAX_ROWS || k != k2 || !l.is_contiguous() || !wl.is_contiguous() {
        return Ok(None);
    }
    let x = &x[l.start_offset()..l.start_offset() + m * k];
    let span = wl.start_offset()..wl.start_offset() + n * k;
    let mut y = match ws {
        CpuStorage::F32(w) => super::skinny::matmul_wt(x, &w[span], m, k, n),
        CpuStorage::BF16(w) => super::skinny::matmul_wt(x, &w[span], m, k, n),
        CpuStorage::F16(w) => super::skinny::matmul_wt(x, &w[span], m, k, n),
        _ => return Ok(None),
    };
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
    Ok(Some((CpuStorage::F32(y), Shape::from(out))))
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

// ---------------------------------------------------------------------------------------
// Binary ops whose backward only feeds tracked operands.

#[derive(Clone, Copy)]
enum Bin {
    MatMul,
    Add,
    Mul,
}

struct Tracked {
    op: Bin,
    ta: bool,
    tb: bool,
}

fn bin_impl<S: BackendStorage>(
    op: Bin,
    a: &S,
    la: &Layout,
    b: &S,
    lb: &Layout,
) -> Result<(S, Shape)> {
    match op {
        Bin::MatMul => {
            let (bmnk, shape) = matmul_dims(la, lb)?;
            Ok((a.matmul(b, bmnk, la, lb)?, shape))
        }
        Bin::Add => Ok((a.binary_impl::<Add>(b, la, lb)?, la.shape().clone())),
        Bin::Mul => Ok((a.binary_impl::<Mul>(b, la, lb)?, la.shape().clone())),
    }
}

impl CustomOp2 for Tracked {
    fn name(&self) -> &'static str {
        match self.op {
            Bin::MatMul => "tracked-matmul",
            Bin::Add => "tracked-add",
            Bin::Mul => "tracked-mul",
        }
    }

    fn cpu_fwd(
        &self,
        a: &CpuStorage,
        la: &Layout,
        b: &CpuStorage,
        lb: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        bin_impl(self.op, a, la, b, lb)
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        a: &CudaStorage,
        la: &Layout,
        b: &CudaStorage,
        lb: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        bin_impl(self.op, a, la, b, lb)
    }

    fn bwd(
        &self,
        a: &Tensor,
        b: &Tensor,
        _res: &Tensor,
        g: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let (a, b) = (a.detach(), b.detach());
        let r = a.rank();
        let ga = if self.ta {
            Some(match self.op {
                Bin::MatMul => g.matmul(&b.transpose(r - 2, r - 1)?)?,
                Bin::Add => g.clone(),
                Bin::Mul => g.mul(&b)?,
            })
        } else {
            None
        };
        let gb = if self.tb {
            Some(match self.op {
                Bin::MatMul => a.transpose(r - 2, r - 1)?.matmul(g)?,
                Bin::Add => g.clone(),
                Bin::Mul => g.mul(&a)?,
            })
        } else {
            None
        };
        Ok((ga, gb))
    }
}

fn tracked(op: Bin, a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let (ta, tb) = (a.track_op(), b.track_op());
    if !ta && !tb {
        return match op {
            Bin::MatMul => a.matmul(b),
            Bin::Add => a.add(b),
            Bin::Mul => a.mul(b),
        };
    }
    if !matches!(op, Bin::MatMul) && a.shape() != b.shape() {
        candle_core::bail!(
            "tracked add/mul: shapes differ {:?} {:?}",
            a.shape(),
            b.shape()
        );
    }
    a.apply_op2(b, Tracked { op, ta, tb })
}

/// Batched matmul `[.., m, k] x [.., k, n]` (same leading dims; strided layouts as
/// candle's matmul accepts). Gradients only for tracked operands.
pub fn matmul(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    tracked(Bin::MatMul, a, b)
}

/// Element-wise `a + b` (same shape); gradients only for tracked operands.
pub fn add(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    tracked(Bin::Add, a, b)
}

/// Element-wise `a * b` (same shape); gradients only for tracked operands.
pub fn mul(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    tracked(Bin::Mul, a, b)
}

// ---------------------------------------------------------------------------------------
// Attach: a result computed from detached tensors, with a caller-supplied backward.

/// The precomputed result a custom op's forward hands to the graph (once).
struct Held {
    name: &'static str,
    y: Mutex<Option<Tensor>>,
}

impl Held {
    fn new(name: &'static str, y: Tensor) -> Result<Self> {
        // `copy` would keep a strided layout, and the forward hands the storage over as
        // contiguous: make it contiguous from offset 0.
        let y = if y.is_contiguous() && y.layout().start_offset() == 0 {
            y
        } else {
            y.force_contiguous()?
        };
        Ok(Self {
            name,
            y: Mutex::new(Some(y)),
        })
    }

    fn take(&self) -> Result<Tensor> {
        match self.y.lock() {
            Ok(mut g) => match g.take() {
                Some(y) => Ok(y),
                None => candle_core::bail!("{}: forward called twice", self.name),
            },
            Err(_) => candle_core::bail!("{}: poisoned lock", self.name),
        }
    }

    fn cpu_fwd(&self) -> Result<(CpuStorage, Shape)> {
        let y = self.take()?;
        let (ys, yl) = y.storage_and_layout();
        let c = cpu_of(&ys, self.name)?;
        Ok((c.try_clone(yl)?, yl.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(&self) -> Result<(CudaStorage, Shape)> {
        let y = self.take()?;
        let (ys, yl) = y.storage_and_layout();
        let c = cuda_of(&ys, self.name)?;
        Ok((c.try_clone(yl)?, yl.shape().clone()))
    }
}

type Grad = Option<Tensor>;
type AttachBwd = Box<dyn Fn(&[Tensor], &Tensor, &Tensor) -> Result<Vec<Grad>> + Send + Sync>;

/// A custom op over 1, 2 or 3 operands: its forward hands over the precomputed result,
/// its backward is the caller's (on detached operands and result). One struct for every
/// arity; the three candle traits below only unpack their arguments.
struct Attach {
    held: Held,
    bwd: AttachBwd,
}

impl Attach {
    fn backward<const N: usize>(
        &self,
        args: [&Tensor; N],
        res: &Tensor,
        g: &Tensor,
    ) -> Result<[Grad; N]> {
        let args: Vec<Tensor> = args.iter().map(|a| a.detach()).collect();
        let grads = (self.bwd)(&args, &res.detach(), g)?;
        let got = grads.len();
        grads.try_into().map_err(|_| {
            candle_core::Error::Msg(format!(
                "{}: {got} gradients for {N} operands",
                self.held.name
            ))
        })
    }
}

impl CustomOp1 for Attach {
    fn name(&self) -> &'static str {
        self.held.name
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> Result<(CpuStorage, Shape)> {
        self.held.cpu_fwd()
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(&self, _: &CudaStorage, _: &Layout) -> Result<(CudaStorage, Shape)> {
        self.held.cuda_fwd()
    }

    fn bwd(&self, a: &Tensor, res: &Tensor, g: &Tensor) -> Result<Grad> {
        let [ga] = self.backward([a], res, g)?;
        Ok(ga)
    }
}

impl CustomOp2 for Attach {
    fn name(&self) -> &'static str {
        self.held.name
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        self.held.cpu_fwd()
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        _: &CudaStorage,
        _: &Layout,
        _: &CudaStorage,
        _: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        self.held.cuda_fwd()
    }

    fn bwd(&self, a: &Tensor, b: &Tensor, res: &Tensor, g: &Tensor) -> Result<(Grad, Grad)> {
        let [ga, gb] = self.backward([a, b], res, g)?;
        Ok((ga, gb))
    }
}

impl CustomOp3 for Attach {
    fn name(&self) -> &'static str {
        self.held.name
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        self.held.cpu_fwd()
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        _: &CudaStorage,
        _: &Layout,
        _: &CudaStorage,
        _: &Layout,
        _: &CudaStorage,
        _: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        self.held.cuda_fwd()
    }

    fn bwd(
        &self,
        a: &Tensor,
        b: &Tensor,
        c: &Tensor,
        res: &Tensor,
        g: &Tensor,
    ) -> Result<(Grad, Grad, Grad)> {
        let [ga, gb, gc] = self.backward([a, b, c], res, g)?;
        Ok((ga, gb, gc))
    }
}

/// Attach `y` (computed from the operands `xs` through detached ops) to the graph as a
/// function of them; `bwd(xs, y, grad_y)` returns one gradient per operand (None where
/// an operand needs none). 1 to 3 operands. When no operand is tracked, returns `y`.
pub fn attach<const N: usize>(
    xs: [&Tensor; N],
    y: Tensor,
    name: &'static str,
    bwd: impl Fn(&[Tensor; N], &Tensor, &Tensor) -> Result<[Grad; N]> + Send + Sync + 'static,
) -> Result<Tensor> {
    if !xs.iter().any(|x| x.track_op()) {
        return Ok(y);
    }
    let op = Attach {
        held: Held::new(name, y)?,
        bwd: Box::new(move |args, y, g| {
            let args: &[Tensor; N] = args.try_into().map_err(|_| {
                candle_core::Error::Msg(format!("{name}: {} operands, expected {N}", args.len()))
            })?;
            Ok(bwd(args, y, g)?.into())
        }),
    };
    match xs.as_slice() {
        [a] => a.apply_op1(op),
        [a, b] => a.apply_op2(b, op),
        [a, b, c] => a.apply_op3(b, c, op),
        _ => candle_core::bail!("attach {name}: {N} operands (1 to 3 supported)"),
    }
}

// ---------------------------------------------------------------------------------------
// Shared-prefix concatenation and zero padding.

/// `cat([prefix broadcast to G rows, rest], dim)`: `prefix` `[1, ...]` (one shared
/// prompt's keys/values or hidden states), `rest` `[G, ...]`; every other dim but `dim`
/// must agree. The backward sums the prefix's gradient over the G rows (so every row's
/// loss reaches the shared prefix) and only feeds tracked operands.
pub fn prefix_cat(prefix: &Tensor, rest: &Tensor, dim: usize) -> Result<Tensor> {
    if prefix.dim(0)? != 1 || dim == 0 {
        candle_core::bail!(
            "prefix_cat: prefix {:?} must have one row, rest {:?}, dim {dim} > 0",
            prefix.shape(),
            rest.shape()
        );
    }
    let mut pdims = rest.dims().to_vec();
    let p = prefix.dim(dim)?;
    pdims[dim] = p;
    let pb = prefix.detach().broadcast_as(pdims)?;
    let y = Tensor::cat(&[&pb, &rest.detach()], dim)?.contiguous()?;
    let (tp, tr) = (prefix.track_op(), rest.track_op());
    let c = rest.dim(dim)?;
    attach([prefix, rest], y, "prefix-cat", move |_xs, _y, gy| {
        let gp = if tp {
            Some(gy.narrow(dim, 0, p)?.sum_keepdim(0)?)
        } else {
            None
        };
        let gr = if tr {
            Some(gy.narrow(dim, p, c)?.contiguous()?)
        } else {
            None
        };
        Ok([gp, gr])
    })
}

/// `x` `[B, C]` padded with zero columns to `[B, width]`; the backward drops them.
pub fn pad_cols(x: &Tensor, width: usize) -> Result<Tensor> {
    let (b, c) = x.dims2()?;
    if width < c {
        candle_core::bail!("pad_cols: {c} columns > width {width}");
    }
    if width == c {
        return Ok(x.clone());
    }
    let z = Tensor::zeros((b, width - c), x.dtype(), x.device())?;
    let y = Tensor::cat(&[&x.detach(), &z], 1)?.contiguous()?;
    attach([x], y, "pad-cols", move |_xs, _y, gy| {
        Ok([Some(gy.narrow(1, 0, c)?.contiguous()?)])
    })
}

// ---------------------------------------------------------------------------------------
// SwiGLU: silu(gate) * up in one pass, with its own backward.

/// Elements per parallel task of the element-wise loops.
const PAR_CHUNK: usize = 1 << 16;

/// Contiguous f32 CPU data of `t`, if it is that.
fn cpu_f32(t: &Tensor) -> Option<Vec<f32>> {
    if t.dtype() != DType::F32 || !t.device().is_cpu() {
        return None;
    }
    t.flatten_all().ok()?.to_vec1::<f32>().ok()
}

/// `silu(gate) * up` (the Qwen2 MLP's SwiGLU). Composed from candle ops the graph keeps
/// `silu(gate)` and the product, and the backward makes several passes over `[n, 4864]`
/// tensors per layer; here forward and backward are one pass each on CPU f32 (other
/// dtypes and devices compose candle ops, still without recording them).
pub fn silu_mul(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    if gate.shape() != up.shape() {
        candle_core::bail!("silu_mul: gate {:?} vs up {:?}", gate.shape(), up.shape());
    }
    let (gd, ud) = (gate.detach(), up.detach());
    let y = match (cpu_f32(&gd), cpu_f32(&ud)) {
        (Some(g), Some(u)) => {
            use rayon::prelude::*;
            let mut y = vec![0f32; g.len()];
            y.par_chunks_mut(PAR_CHUNK)
                .zip(g.par_chunks(PAR_CHUNK).zip(u.par_chunks(PAR_CHUNK)))
                .for_each(|(y, (g, u))| {
                    for ((y, &g), &u) in y.iter_mut().zip(g).zip(u) {
                        *y = g / (1.0 + (-g).exp()) * u;
                    }
                });
            Tensor::from_vec(y, gd.shape(), gd.device())?
        }
        _ => (gd.silu()? * &ud)?,
    };
    let need = (gate.track_op(), up.track_op());
    let bwd =
        move |[g, u]: &[Tensor; 2], _y: &Tensor, gy: &Tensor| -> Result<[Option<Tensor>; 2]> {
            let (dg, du) = match (cpu_f32(g), cpu_f32(u), cpu_f32(gy)) {
                (Some(gv), Some(uv), Some(gyv)) => {
                    use rayon::prelude::*;
                    let n = gv.len();
                    let (mut dg, mut du) = (vec![0f32; n], vec![0f32; n]);
                    dg.par_chunks_mut(PAR_CHUNK)
                        .zip(du.par_chunks_mut(PAR_CHUNK))
                        .enumerate()
                        .for_each(|(c, (dg, du))| {
                            let o = c * PAR_CHUNK;
                            for i in 0..dg.len() {
                                let (g, u, gy) = (gv[o + i], uv[o + i], gyv[o + i]);
                                let s = 1.0 / (1.0 + (-g).exp());
                                du[i] = gy * g * s;
                                dg[i] = gy * u * s * (1.0 + g * (1.0 - s));
                            }
                        });
                    (
                        Tensor::from_vec(dg, g.shape(), g.device())?,
                        Tensor::from_vec(du, g.shape(), g.device())?,
                    )
                }
                _ => {
                    let gf = g.to_dtype(DType::F32)?;
                    let s = candle_nn::ops::sigmoid(&gf)?;
                    let gyf = gy.to_dtype(DType::F32)?;
                    let du = (&gyf * (&gf * &s)?)?;
                    let one_minus = (1.0 - &s)?;
                    let dg =
                        ((&gyf * u.to_dtype(DType::F32)?)? * (&s * ((&gf * one_minus)? + 1.0)?)?)?;
                    (dg.to_dtype(g.dtype())?, du.to_dtype(g.dtype())?)
                }
            };
            Ok([need.0.then_some(dg), need.1.then_some(du)])
        };
    attach([gate, up], y, "silu-mul", bwd)
}

// ---------------------------------------------------------------------------------------
// RMSNorm (Hugging Face semantics).

/// `weight * (x_f32 * rsqrt(mean(x_f32^2) + eps)).to(x.dtype)` over the last dim.
/// Backward: input gradient only (the weight is frozen).
pub fn rms_norm(x: &Tensor, weight: &Tensor, eps: f64) -> Result<Tensor> {
    let dtype = x.dtype();
    let xf = x.detach().to_dtype(DType::F32)?;
    let rstd = (xf.sqr()?.mean_keepdim(D::Minus1)? + eps)?
        .sqrt()?
        .recip()?;
    let normed = xf.broadcast_mul(&rstd)?.to_dtype(dtype)?;
    let y = normed.broadcast_mul(weight)?;
    let w = weight.clone();
    attach([x], y, "rms-norm", move |[x], _y, g| {
        let xf = x.to_dtype(DType::F32)?;
        let n = xf.broadcast_mul(&rstd)?;
        let gn = g
            .to_dtype(DType::F32)?
            .broadcast_mul(&w.to_dtype(DType::F32)?)?;
        let dot = (&gn * &n)?.mean_keepdim(D::Minus1)?;
        let gx = gn.sub(&n.broadcast_mul(&dot)?)?.broadcast_mul(&rstd)?;
        Ok([Some(gx.to_dtype(x.dtype())?)])
    })
}

// ---------------------------------------------------------------------------------------
// RoPE (rotate_half convention).

/// RoPE on `x` `[B, H, T, D]` with per-row tables `cos`, `sin` `[B, T, D/2]` (x's dtype):
/// `y1 = x1 cos - x2 sin`, `y2 = x2 cos + x1 sin` (Hugging Face `rotate_half`).
pub fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    let xd = x.detach().contiguous()?;
    let y = candle_nn::rotary_emb::rope(&xd, cos, sin)?;
    let (cos, sin) = (cos.clone(), sin.clone());
    attach([x], y, "rope", move |_x, _y, g| {
        // The transpose of a rotation by theta is a rotation by -theta.
        let g = g.contiguous()?;
        Ok([Some(candle_nn::rotary_emb::rope(&g, &cos, &sin.neg()?)?)])
    })
}

// ---------------------------------------------------------------------------------------
// Masked softmax for attention.

/// `softmax(scores * scale + mask)` over the last dim, computed in f32 and returned in
/// the scores' dtype. `scores` is `[B, KVH, G*Tq, Tk]` (query heads grouped by their
/// kv head), `mask` is additive f32 `[B, 1, 1, Tq, Tk]` (0 or a large negative number).
pub fn masked_softmax(scores: &Tensor, mask: &Tensor, scale: f64) -> Result<Tensor> {
    let dtype = scores.dtype();
    let (b, kvh, gt, tk) = scores.dims4()?;
    let tq = mask.dim(3)?;
    if tq == 0 || !gt.is_multiple_of(tq) {
        candle_core::bail!(
            "masked_softmax: scores {:?} vs mask {:?}",
            scores.shape(),
            mask.shape()
        );
    }
    let g = gt / tq;
    let s = (scores.detach().to_dtype(DType::F32)? * scale)?
        .reshape((b, kvh, g, tq, tk))?
        .broadcast_add(mask)?;
    let p = candle_nn::ops::softmax_last_dim(&s)?
        .reshape((b, kvh, gt, tk))?
        .to_dtype(dtype)?;
    attach([scores], p, "masked-softmax", move |_s, p, g| {
        let pf = p.to_dtype(DType::F32)?;
        let gf = g.to_dtype(DType::F32)?;
        let dot = (&gf * &pf)?.sum_keepdim(D::Minus1)?;
        let gs = ((gf.broadcast_sub(&dot)? * pf)? * scale)?;
        Ok([Some(gs.to_dtype(dtype)?)])
    })
}

// ---------------------------------------------------------------------------------------
// Chunked token log-probs through the LM head.

/// One chunk of rows: (logp of targets, entropy if asked), both `[c]` f32.
fn chunk_stats(
    h: &Tensor,
    w: &Tensor,
    ids: &Tensor,
    inv_t: f64,
    entropy: bool,
    keep_probs: bool,
) -> Result<(Tensor, Option<Tensor>, Option<Tensor>)> {
    let logits = (h.matmul(&w.t()?)?.to_dtype(DType::F32)? * inv_t)?;
    let m = logits.max_keepdim(D::Minus1)?;
    let z = logits.broadcast_sub(&m)?;
    let e = z.exp()?;
    let se = e.sum_keepdim(D::Minus1)?;
    let lse = se.log()?; // logsumexp(z)
    let tgt = z.gather(&ids.unsqueeze(1)?, 1)?;
    let logp = (tgt - &lse)?.squeeze(1)?;
    let ent = if entropy {
        // H = lse - sum(p z)
        let pz = (&e * &z)?.sum_keepdim(D::Minus1)?.div(&se)?;
        Some((lse - pz)?.squeeze(1)?)
    } else {
        None
    };
    let probs = if keep_probs {
        Some(e.broadcast_div(&se)?)
    } else {
        None
    };
    Ok((logp, ent, probs))
}

/// Softmax probabilities up to this size (all chunks together, f32) are kept from the
/// forward pass for the backward instead of recomputed: recomputing streams the whole
/// LM head through one more matmul (at 8 x 160 tokens on the 0.5B shape, 0.35 TFLOP,
/// about an eighth of the training step) to save 778 MB.
pub const PROB_CACHE_BYTES: usize = 1 << 30;

/// Log-probabilities of `targets` `[N]` (u32) under `softmax(h W^T / temperature)` for
/// hidden states `h` `[N, H]`, computed `chunk` rows at a time so that at most
/// `[chunk, V]` logits exist at once (forward and backward). Returns
/// `(logp [N] f32, entropy [N] f32 if asked)`; the entropy is differentiable too (see
/// [`attach_entropy`]: it costs nothing unless a loss uses it).
/// The backward uses the forward's softmax when all of it fits in [`PROB_CACHE_BYTES`],
/// else recomputes each chunk: `dh = g/T * (W[target] - softmax @ W)`.
pub fn chunked_token_logprobs(
    h: &Tensor,
    w: &Tensor,
    targets: &Tensor,
    temperature: f64,
    chunk: usize,
    with_entropy: bool,
) -> Result<(Tensor, Option<Tensor>)> {
    chunked_token_logprobs_cached(
        h,
        w,
        targets,
        temperature,
        chunk,
        with_entropy,
        PROB_CACHE_BYTES,
    )
}

/// [`chunked_token_logprobs`] keeping the softmax for the backward when it takes at
/// most `cache_bytes` (0: always recompute).
pub fn chunked_token_logprobs_cached(
    h: &Tensor,
    w: &Tensor,
    targets: &Tensor,
    temperature: f64,
    chunk: usize,
    with_entropy: bool,
    cache_bytes: usize,
) -> Result<(Tensor, Option<Tensor>)> {
    let n = h.dim(0)?;
    if targets.dims1()? != n {
        candle_core::bail!(
            "token_logprobs: {n} hidden rows vs {:?} targets",
            targets.shape()
        );
    }
    if temperature.is_nan() || temperature <= 0.0 {
        candle_core::bail!("token_logprobs: temperature must be > 0 (got {temperature})");
    }
    let chunk = chunk.max(1);
    let inv_t = 1.0 / temperature;
    let hd = h.detach().contiguous()?;
    // A narrower stored LM head is widened once per call, not once per chunk.
    let w = &widen(w, hd.dtype())?;
    let targets = targets.to_dtype(DType::U32)?.contiguous()?;
    let mut lps = Vec::new();
    let mut ents = Vec::new();
    let keep_probs = h.track_op() && n * w.dim(0)? * 4 <= cache_bytes;
    let mut probs = Vec::new();
    let mut start = 0;
    while start < n {
        let c = chunk.min(n - start);
        let (lp, ent, p) = chunk_stats(
            &hd.narrow(0, start, c)?,
            w,
            &targets.narrow(0, start, c)?,
            inv_t,
            with_entropy,
            keep_probs,
        )?;
        probs.extend(p);
        lps.push(lp);
        if let Some(e) = ent {
            ents.push(e);
        }
        start += c;
    }
    let logp = if lps.is_empty() {
        Tensor::zeros(0, DType::F32, h.device())?
    } else {
        Tensor::cat(&lps, 0)?
    };
    let entropy = if with_entropy {
        Some(if ents.is_empty() {
            Tensor::zeros(0, DType::F32, h.device())?
        } else {
            Tensor::cat(&ents, 0)?
        })
    } else {
        None
    };
    let entropy = match entropy {
        Some(e) => Some(attach_entropy(h, w, e, inv_t, chunk, probs.clone())?),
        None => None,
    };
    let w = w.clone();
    let logp = attach([h], logp, "chunked-logprobs", move |[h], _y, g| {
        let dtype = h.dtype();
        let h = h.contiguous()?;
        let g = g.to_dtype(DType::F32)?;
        let mut parts = Vec::new();
        let mut start = 0;
        while start < n {
            let c = chunk.min(n - start);
            let ids = targets.narrow(0, start, c)?;
            let p = match probs.get(parts.len()) {
                Some(p) => p.clone(),
                None => {
                    let hc = h.narrow(0, start, c)?;
                    let logits = (hc.matmul(&w.t()?)?.to_dtype(DType::F32)? * inv_t)?;
                    candle_nn::ops::softmax_last_dim(&logits)?
                }
            };
            let pw = p.to_dtype(w.dtype())?.matmul(&w)?.to_dtype(DType::F32)?;
            let wt = w.index_select(&ids, 0)?.to_dtype(DType::F32)?;
            let gc = (g.narrow(0, start, c)? * inv_t)?.unsqueeze(1)?;
            parts.push((wt - pw)?.broadcast_mul(&gc)?.to_dtype(dtype)?);
            start += c;
        }
        Ok([Some(Tensor::cat(&parts, 0)?)])
    })?;
    Ok((logp, entropy))
}

/// Make the per-token entropies `ent` `[N]` of `softmax(h W^T * inv_t)` a function of
/// `h` (for an entropy bonus; nothing is computed unless a loss uses them). With
/// `H = -sum_j p_j ln p_j`, `dH/dz_j = -p_j (ln p_j + H)` (the logsumexp cancels), so
/// the backward needs only the softmax: the forward's `probs` when kept, else each
/// chunk's recomputed; `dh = inv_t * (g * dH/dz) W`.
fn attach_entropy(
    h: &Tensor,
    w: &Tensor,
    ent: Tensor,
    inv_t: f64,
    chunk: usize,
    probs: Vec<Tensor>,
) -> Result<Tensor> {
    let n = h.dim(0)?;
    let w = w.clone();
    attach([h], ent, "chunked-entropy", move |[h], y, g| {
        let dtype = h.dtype();
        let h = h.contiguous()?;
        let g = g.to_dtype(DType::F32)?;
        let mut parts = Vec::new();
        let mut start = 0;
        while start < n {
            let c = chunk.min(n - start);
            let p = match probs.get(parts.len()) {
                Some(p) => p.clone(),
                None => {
                    let hc = h.narrow(0, start, c)?;
                    let logits = (hc.matmul(&w.t()?)?.to_dtype(DType::F32)? * inv_t)?;
                    candle_nn::ops::softmax_last_dim(&logits)?
                }
            };
            // ln p with underflowed probabilities kept finite (their p factor is 0).
            let lnp = p.maximum(f32::MIN_POSITIVE as f64)?.log()?;
            let hy = y.narrow(0, start, c)?.unsqueeze(1)?;
            let gc = g.narrow(0, start, c)?.unsqueeze(1)?;
            let dz = ((p * lnp.broadcast_add(&hy)?)?.neg()?.broadcast_mul(&gc)? * inv_t)?;
            parts.push(dz.to_dtype(w.dtype())?.matmul(&w)?.to_dtype(dtype)?);
            start += c;
        }
        Ok([Some(Tensor::cat(&parts, 0)?)])
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    fn rand(shape: &[usize], seed: u64) -> Tensor {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let n: usize = shape.iter().product();
        let v: Vec<f32> = (0..n).map(|_| rng.gen::<f32>() * 2.0 - 1.0).collect();
        Tensor::from_vec(v, shape, &Device::Cpu).unwrap()
    }

    fn diff(a: &Tensor, b: &Tensor) -> f32 {
        (a - b)
            .unwrap()
            .abs()
            .unwrap()
            .flatten_all()
            .unwrap()
            .max(0)
            .unwrap()
            .to_scalar()
            .unwrap()
    }

    /// Value and input gradient of `f(x) . w` for our op and a reference composition.
    fn check(
        shape: &[usize],
        ours: impl Fn(&Tensor) -> Result<Tensor>,
        reference: impl Fn(&Tensor) -> Result<Tensor>,
    ) {
        let x = Var::from_tensor(&rand(shape, 1)).unwrap();
        let y1 = ours(x.as_tensor()).unwrap();
        let y2 = reference(x.as_tensor()).unwrap();
        assert!(diff(&y1, &y2) < 1e-5, "values differ: {}", diff(&y1, &y2));
        let w = rand(y1.dims(), 2);
        let g1 = mul(&y1, &w).unwrap().sum_all().unwrap().backward().unwrap();
        let g2 = (&y2 * &w).unwrap().sum_all().unwrap().backward().unwrap();
        let (a, b) = (
            g1.get(x.as_tensor()).unwrap(),
            g2.get(x.as_tensor()).unwrap(),
        );
        assert!(diff(a, b) < 1e-5, "grads differ: {}", diff(a, b));
        // Only the variable holds a gradient in our store.
        assert_eq!(g1.get_ids().count(), 1);
    }

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

    #[test]
    fn silu_mul_matches_composition() {
        check(
            &[3, 7],
            |x| silu_mul(&x.sin()?, &x.cos()?),
            |x| x.sin()?.silu()? * x.cos()?,
        );
    }

    #[test]
    fn rms_norm_matches_composition() {
        let w = rand(&[8], 5);
        check(
            &[2, 3, 8],
            |x| rms_norm(x, &w, 1e-6),
            |x| {
                let r = (x.sqr()?.mean_keepdim(D::Minus1)? + 1e-6)?.sqrt()?;
                x.broadcast_div(&r)?.broadcast_mul(&w)
            },
        );
    }

    #[test]
    fn rope_matches_rotate_half() {
        let cos = rand(&[2, 3, 4], 6);
        let sin = rand(&[2, 3, 4], 7);
        check(
            &[2, 2, 3, 8],
            |x| rope(x, &cos, &sin),
            |x| {
                let c = Tensor::cat(&[&cos, &cos], D::Minus1)?.unsqueeze(1)?;
                let s = Tensor::cat(&[&sin, &sin], D::Minus1)?.unsqueeze(1)?;
                let x1 = x.narrow(D::Minus1, 0, 4)?;
                let x2 = x.narrow(D::Minus1, 4, 4)?;
                let rot = Tensor::cat(&[&x2.neg()?, &x1], D::Minus1)?;
                x.broadcast_mul(&c)? + rot.broadcast_mul(&s)?
            },
        );
    }

    #[test]
    fn masked_softmax_matches_composition() {
        // B=2, KVH=2, G=2, Tq=3, Tk=4
        let mut m = vec![0f32; 2 * 3 * 4];
        for (i, v) in m.iter_mut().enumerate() {
            if (i * 7) % 5 == 0 {
                *v = f32::MIN;
            }
        }
        let mask = Tensor::from_vec(m, (2, 1, 1, 3, 4), &Device::Cpu).unwrap();
        check(
            &[2, 2, 6, 4],
            |s| masked_softmax(s, &mask, 0.5),
            |s| {
                let s = (s * 0.5)?.reshape((2, 2, 2, 3, 4))?.broadcast_add(&mask)?;
                candle_nn::ops::softmax(&s, D::Minus1)?.reshape((2, 2, 6, 4))
            },
        );
    }

    #[test]
    fn tracked_binary_ops_match() {
        let c = rand(&[2, 6, 3], 8);
        check(&[2, 4, 6], |x| matmul(x, &c), |x| x.matmul(&c));
        let c = rand(&[2, 4, 6], 9);
        check(&[2, 4, 6], |x| mul(x, &c), |x| x.mul(&c));
        check(&[2, 4, 6], |x| add(&c, x), |x| c.add(x));
    }

    #[test]
    fn chunked_logprobs_match_log_softmax() {
        let w = rand(&[11, 6], 10);
        let ids = Tensor::new(&[0u32, 3, 10, 5, 5, 1, 2], &Device::Cpu).unwrap();
        for (chunk, cache) in [(1, 0), (3, 0), (100, 0), (3, PROB_CACHE_BYTES)] {
            check(
                &[7, 6],
                |h| {
                    let out = chunked_token_logprobs_cached(h, &w, &ids, 0.8, chunk, false, cache);
                    Ok(out?.0)
                },
                |h| {
                    let l = (h.matmul(&w.t()?)? / 0.8)?;
                    let l = candle_nn::ops::log_softmax(&l, D::Minus1)?;
                    l.gather(&ids.unsqueeze(1)?, 1)?.squeeze(1)
                },
            );
        }
    }

    #[test]
    fn chunked_entropy_gradient_matches_composition() {
        // A scaled head so some probabilities are tiny (the ln p guard).
        let w = (rand(&[11, 6], 12) * 8.0).unwrap();
        let ids = Tensor::new(&[0u32, 3, 10, 5, 5, 1, 2], &Device::Cpu).unwrap();
        for (chunk, cache) in [(1, 0), (3, 0), (3, PROB_CACHE_BYTES)] {
            check(
                &[7, 6],
                |h| {
                    let out = chunked_token_logprobs_cached(h, &w, &ids, 0.8, chunk, true, cache)?;
                    Ok(out.1.expect("entropy asked"))
                },
                |h| {
                    let l = (h.matmul(&w.t()?)? / 0.8)?;
                    let lp = candle_nn::ops::log_softmax(&l, D::Minus1)?;
                    (lp.exp()? * &lp)?.sum(D::Minus1)?.neg()
                },
            );
        }
    }
}

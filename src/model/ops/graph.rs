//! The graph plumbing: binary ops (matmul, add, mul) that only feed tracked operands,
//! [`attach`] for ops computed from detached tensors, and the shape ops built on it.
use super::cpu_of;
use candle_core::backend::BackendStorage;
use candle_core::op::{Add, Mul};
use candle_core::{CpuStorage, CustomOp1, CustomOp2, CustomOp3, Layout, Result, Shape, Tensor};
use std::sync::Mutex;

#[cfg(feature = "cuda")]
use super::cuda_of;
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

#[cfg(test)]
mod tests {
    use super::super::test_util::{check, rand};
    use super::*;

    #[test]
    fn tracked_binary_ops_match() {
        let c = rand(&[2, 6, 3], 8);
        check(&[2, 4, 6], |x| matmul(x, &c), |x| x.matmul(&c));
        let c = rand(&[2, 4, 6], 9);
        check(&[2, 4, 6], |x| mul(x, &c), |x| x.mul(&c));
        check(&[2, 4, 6], |x| add(&c, x), |x| c.add(x));
    }
}

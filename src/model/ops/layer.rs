//! The transformer layer's ops (SwiGLU, RMSNorm, RoPE, attention softmax), each
//! computed from detached tensors and [`attach`]ed with its own backward.
use super::attach;
use candle_core::{DType, Result, Tensor, D};

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

#[cfg(test)]
mod tests {
    use super::super::test_util::{check, rand};
    use super::*;
    use candle_core::Device;

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
}

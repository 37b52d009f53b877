//! The decode step's matmul on a quantized weight: `y = x · dequant(W)^T` for a few rows.
//!
//! Each parallel chunk of output rows is walked a tile at a time: the tile's rows are
//! dequantized into a per-thread buffer small enough for L2 (with the same `to_float`
//! as everywhere else), then the dense decode kernel ([`skinny`]) dots them with every
//! input row. The weights stream from memory once, as blocks, and the result equals
//! [`skinny::matmul_wt_on`] on the dequantized matrix bit for bit: each output's dot
//! product is computed by the same code in the same order.
use super::{rows_to_f32_on, QuantWeight};
use crate::model::skinny::{self, Kernels};
use anyhow::Result;
use rayon::prelude::*;
use std::cell::RefCell;

/// Output rows per chunk and tile come in multiples of this: whole register blocks of
/// every path (4, 3 or 2 outputs).
const BLOCK: usize = 12;
/// Bytes of dequantized values a tile aims at (it stays in L2 while every input row is
/// dotted with it).
const TILE_BYTES: usize = 256 * 1024;

thread_local! {
    static SCRATCH: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Output rows per tile for `k` inputs.
fn tile_rows(k: usize) -> usize {
    (TILE_BYTES / 4 / k.max(1) / BLOCK * BLOCK).clamp(BLOCK, 8 * BLOCK)
}

/// `y[m, n] = x[m, k] · dequant(w)[n, k]^T` on the [`Kernels::active`] path.
pub fn matmul_wt(x: &[f32], w: &QuantWeight, m: usize) -> Result<Vec<f32>> {
    matmul_wt_on(Kernels::active(), x, w, m)
}

/// [`matmul_wt`] on the given path. `w` must live on the CPU.
pub fn matmul_wt_on(path: Kernels, x: &[f32], w: &QuantWeight, m: usize) -> Result<Vec<f32>> {
    let (n, k) = w.dims();
    anyhow::ensure!(x.len() == m * k, "decode: {} inputs for {m} x {k}", x.len());
    if m == 0 || n == 0 {
        return Ok(vec![0f32; m * n]);
    }
    let bytes = w.bytes()?;
    let (ty, rb) = (w.dtype(), w.row_bytes());
    let tile = tile_rows(k);
    let threads = rayon::current_num_threads().max(1);
    let per = n.div_ceil(threads * 8).max(tile).next_multiple_of(tile);
    let mut yt = vec![0f32; n * m];
    yt.par_chunks_mut(per * m)
        .enumerate()
        .try_for_each(|(c, out)| -> Result<()> {
            SCRATCH.with(|s| {
                let mut s = s.borrow_mut();
                if s.len() < tile * k {
                    s.resize(tile * k, 0.0);
                }
                let o0 = c * per;
                let no = out.len() / m;
                let mut t = 0;
                while t < no {
                    let rows = tile.min(no - t);
                    let (r0, wt) = (o0 + t, &mut s[..rows * k]);
                    rows_to_f32_on(path, ty, &bytes[r0 * rb..(r0 + rows) * rb], wt)?;
                    skinny::kernel(path, x, wt, m, k, rows, &mut out[t * m..(t + rows) * m]);
                    t += rows;
                }
                Ok(())
            })
        })?;
    let mut y = vec![0f32; m * n];
    for (o, col) in yt.chunks_exact(m).enumerate() {
        for (r, v) in col.iter().enumerate() {
            y[r * n + o] = *v;
        }
    }
    Ok(y)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::quantized::GgmlDType;
    use candle_core::{Device, Tensor};

    fn rand(n: usize, seed: u64) -> Vec<f32> {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        (0..n).map(|_| rng.gen::<f32>() * 2.0 - 1.0).collect()
    }

    /// Every path, ragged rows and outputs, every type the loaders make: the result is
    /// the dense kernel's on the dequantized matrix, exactly, and within f32 rounding of
    /// an f64 reference.
    #[test]
    fn decode_equals_the_dense_kernel_on_the_dequantized_weight() {
        for ty in [
            GgmlDType::Q8_0,
            GgmlDType::Q4K,
            GgmlDType::Q5_0,
            GgmlDType::Q6K,
        ] {
            let (n, k) = (101, 512);
            let w = Tensor::from_vec(rand(n * k, 1), (n, k), &Device::Cpu).unwrap();
            let q = QuantWeight::quantize(&w, ty).unwrap();
            let wd: Vec<f32> = q
                .dequantize(candle_core::DType::F32)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap();
            let wc = crate::model::quant::candle_values(&q);
            assert_eq!(wd, wc, "{ty:?}: our dequantization is candle's");
            for m in [1, 3, 8, 13] {
                let x = rand(m * k, 2 + m as u64);
                for path in [Kernels::Avx512, Kernels::Avx2, Kernels::Portable] {
                    if !path.supported() {
                        continue;
                    }
                    let ours = matmul_wt_on(path, &x, &q, m).unwrap();
                    let dense = skinny::matmul_wt_on(path, &x, &wd, m, k, n);
                    assert_eq!(ours, dense, "{ty:?} m={m} {path:?}");
                    for (i, v) in ours.iter().enumerate() {
                        let (r, o) = (i / n, i % n);
                        let want: f64 = (0..k)
                            .map(|j| x[r * k + j] as f64 * wd[o * k + j] as f64)
                            .sum();
                        assert!((*v as f64 - want).abs() < 1e-4, "{ty:?} {v} vs {want}");
                    }
                }
            }
        }
    }
}

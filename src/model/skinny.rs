//! `y = x W^T` for a handful of rows: the decode step's matmuls.
//!
//! While sampling, every linear layer multiplies a few rows (one per sequence) by a
//! weight matrix that is read from memory once per step. That is a bandwidth problem,
//! not a compute one, and general GEMM kernels (which pack both operands into blocks)
//! lose a good part of the bandwidth to packing and to their small-`m` edge cases. Here
//! each output row of `W` (contiguous: `W` is `[out, in]`) is streamed once and dotted
//! with all the input rows while it sits in L1, four outputs and four input rows at a
//! time so that each load feeds several fused multiply-adds.
use rayon::prelude::*;

/// Rows up to which [`matmul_wt`] is used instead of the general GEMM (measured on
/// the 0.5B shapes, one thread: 0.8x the GEMM time at 8 rows, 1.4x at 16).
pub const MAX_ROWS: usize = 8;

/// Lanes per accumulator: one AVX-512 register, two AVX2 ones.
const L: usize = 16;
/// Input rows per register block.
const R: usize = 4;
/// Weight rows (outputs) per register block.
const O: usize = 4;

/// `y[m, n] = x[m, k] · w[n, k]^T`, all row-major and contiguous.
pub fn matmul_wt(x: &[f32], w: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
    debug_assert_eq!(x.len(), m * k);
    debug_assert_eq!(w.len(), n * k);
    // Work in the transposed layout yt[n, m] so each parallel chunk owns whole output
    // columns, then transpose (m*n floats: small next to streaming n*k weights).
    let mut yt = vec![0f32; n * m];
    if m == 0 || n == 0 {
        return vec![0f32; m * n];
    }
    let threads = rayon::current_num_threads().max(1);
    // Several chunks per thread for balance; whole register blocks per chunk.
    let per = n.div_ceil(threads * 8).max(O).next_multiple_of(O);
    yt.par_chunks_mut(per * m).enumerate().for_each(|(c, out)| {
        let o0 = c * per;
        let no = out.len() / m;
        let wc = &w[o0 * k..(o0 + no) * k];
        kernel(x, wc, m, k, no, out);
    });
    let mut y = vec![0f32; m * n];
    for (o, col) in yt.chunks_exact(m).enumerate() {
        for (r, v) in col.iter().enumerate() {
            y[r * n + o] = *v;
        }
    }
    y
}

fn kernel(x: &[f32], w: &[f32], m: usize, k: usize, n: usize, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU supports the enabled features (checked just above).
            unsafe { kernel_avx512(x, w, m, k, n, out) };
            return;
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: as above.
            unsafe { kernel_avx2(x, w, m, k, n, out) };
            return;
        }
    }
    kernel_body::<false>(x, w, m, k, n, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn kernel_avx512(x: &[f32], w: &[f32], m: usize, k: usize, n: usize, out: &mut [f32]) {
    kernel_body::<true>(x, w, m, k, n, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn kernel_avx2(x: &[f32], w: &[f32], m: usize, k: usize, n: usize, out: &mut [f32]) {
    kernel_body::<true>(x, w, m, k, n, out)
}

/// `out[o * m + r] = dot(x[r], w[o])` for `o < n`, `r < m`. `FMA` selects fused
/// multiply-add (only where the target has it: elsewhere `mul_add` is a libm call).
#[inline(always)]
fn kernel_body<const FMA: bool>(
    x: &[f32],
    w: &[f32],
    m: usize,
    k: usize,
    n: usize,
    out: &mut [f32],
) {
    let mut o = 0;
    while o < n {
        let outs = (n - o).min(O);
        let mut ws: [&[f32]; O] = [&w[o * k..(o + 1) * k]; O];
        for (j, slot) in ws.iter_mut().enumerate().take(outs) {
            *slot = &w[(o + j) * k..(o + j + 1) * k];
        }
        let mut r = 0;
        while r < m {
            let rows = (m - r).min(R);
            let mut xs: [&[f32]; R] = [&x[r * k..(r + 1) * k]; R];
            for (i, slot) in xs.iter_mut().enumerate().take(rows) {
                *slot = &x[(r + i) * k..(r + i + 1) * k];
            }
            let d = dots::<FMA>(&xs, &ws, k);
            for (j, dj) in d.iter().enumerate().take(outs) {
                out[(o + j) * m + r..(o + j) * m + r + rows].copy_from_slice(&dj[..rows]);
            }
            r += rows;
        }
        o += outs;
    }
}

/// Dot products of `R` input rows with `O` weight rows: `O * R` accumulators of `L`
/// lanes (16 AVX-512 registers), `O + R` loads per `O * R` multiply-adds.
#[inline(always)]
fn dots<const FMA: bool>(xs: &[&[f32]; R], ws: &[&[f32]; O], k: usize) -> [[f32; R]; O] {
    let mut acc = [[[0f32; L]; R]; O];
    let full = k / L * L;
    let mut c = 0;
    while c < full {
        let mut wv = [[0f32; L]; O];
        for (j, v) in wv.iter_mut().enumerate() {
            v.copy_from_slice(&ws[j][c..c + L]);
        }
        for r in 0..R {
            let mut xv = [0f32; L];
            xv.copy_from_slice(&xs[r][c..c + L]);
            for j in 0..O {
                for l in 0..L {
                    acc[j][r][l] = if FMA {
                        xv[l].mul_add(wv[j][l], acc[j][r][l])
                    } else {
                        acc[j][r][l] + xv[l] * wv[j][l]
                    };
                }
            }
        }
        c += L;
    }
    let mut d = [[0f32; R]; O];
    for j in 0..O {
        for r in 0..R {
            let mut v: f32 = acc[j][r].iter().sum();
            for i in full..k {
                v += xs[r][i] * ws[j][i];
            }
            d[j][r] = v;
        }
    }
    d
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(x: &[f32], w: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
        let mut y = vec![0f64; m * n];
        for r in 0..m {
            for o in 0..n {
                y[r * n + o] = (0..k)
                    .map(|i| x[r * k + i] as f64 * w[o * k + i] as f64)
                    .sum();
            }
        }
        y.into_iter().map(|v| v as f32).collect()
    }

    #[test]
    fn matches_naive_on_ragged_shapes() {
        let mut s = 1u32;
        let mut next = || {
            s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (s >> 8) as f32 / (1u32 << 24) as f32 - 0.5
        };
        for &(m, k, n) in &[
            (1, 1, 1),
            (3, 17, 5),
            (4, 16, 2),
            (7, 100, 33),
            (32, 896, 130),
            (9, 40, 1),
        ] {
            let x: Vec<f32> = (0..m * k).map(|_| next()).collect();
            let w: Vec<f32> = (0..n * k).map(|_| next()).collect();
            let got = matmul_wt(&x, &w, m, k, n);
            let want = naive(&x, &w, m, k, n);
            for (g, e) in got.iter().zip(&want) {
                assert!(
                    (g - e).abs() <= 1e-4 * (1.0 + e.abs()),
                    "{m}x{k}x{n}: {g} vs {e}"
                );
            }
        }
    }
}

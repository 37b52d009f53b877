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

/// Rows up to which [`matmul_wt`] is used instead of the general GEMM. Measured on the
/// 0.5B shapes, one thread, summed over the q/o, MLP and LM-head matrices: 76 vs 111 ms
/// at 8 rows, 142 vs 171 ms at 32, 248 vs 224 ms at 64.
pub const MAX_ROWS: usize = 48;

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
    kernel_rows(x, w, m, k, n, out, |xs, ws, k| {
        // SAFETY: this function only runs where AVX-512F is available.
        unsafe { dots_avx512(xs, ws, k) }
    })
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
    kernel_rows(x, w, m, k, n, out, dots::<FMA>)
}

/// The loop over register blocks, with `dots` computing one block.
#[inline(always)]
fn kernel_rows(
    x: &[f32],
    w: &[f32],
    m: usize,
    k: usize,
    n: usize,
    out: &mut [f32],
    dots: impl Fn(&[&[f32]; R], &[&[f32]; O], usize) -> [[f32; R]; O],
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
            let d = dots(&xs, &ws, k);
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
    for row in xs.iter().chain(ws.iter()) {
        assert!(row.len() >= k, "dots: row shorter than k");
    }
    let xp: [*const f32; R] = std::array::from_fn(|r| xs[r].as_ptr());
    let wp: [*const f32; O] = std::array::from_fn(|j| ws[j].as_ptr());
    let mut acc = [[[0f32; L]; R]; O];
    let full = k / L * L;
    let mut c = 0;
    // Raw reads: a bounds check in this loop makes LLVM spill every accumulator to
    // the stack after each multiply-add (to keep the panic path exact), which halves
    // the throughput. All reads are below `full <= k <= len` (asserted above).
    while c < full {
        // SAFETY: c + L <= full <= k and every row has at least k elements.
        let wv: [[f32; L]; O] = std::array::from_fn(|j| unsafe {
            std::ptr::read_unaligned(wp[j].add(c) as *const [f32; L])
        });
        for r in 0..R {
            // SAFETY: as above.
            let xv: [f32; L] = unsafe { std::ptr::read_unaligned(xp[r].add(c) as *const [f32; L]) };
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

/// [`dots`] with explicit AVX-512 intrinsics: the 16 accumulators are named locals so
/// they stay in registers (the array version makes LLVM store every accumulator back
/// to the stack after each multiply-add, which halves the throughput).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn dots_avx512(xs: &[&[f32]; R], ws: &[&[f32]; O], k: usize) -> [[f32; R]; O] {
    use std::arch::x86_64::*;
    for row in xs.iter().chain(ws.iter()) {
        assert!(row.len() >= k, "dots: row shorter than k");
    }
    let [x0, x1, x2, x3] = [
        xs[0].as_ptr(),
        xs[1].as_ptr(),
        xs[2].as_ptr(),
        xs[3].as_ptr(),
    ];
    let [w0, w1, w2, w3] = [
        ws[0].as_ptr(),
        ws[1].as_ptr(),
        ws[2].as_ptr(),
        ws[3].as_ptr(),
    ];
    let z = _mm512_setzero_ps();
    let (mut a00, mut a01, mut a02, mut a03) = (z, z, z, z);
    let (mut a10, mut a11, mut a12, mut a13) = (z, z, z, z);
    let (mut a20, mut a21, mut a22, mut a23) = (z, z, z, z);
    let (mut a30, mut a31, mut a32, mut a33) = (z, z, z, z);
    let full = k / L * L;
    let mut c = 0;
    while c < full {
        // SAFETY: c + 16 <= full <= k <= every row's length (asserted above).
        unsafe {
            let v0 = _mm512_loadu_ps(w0.add(c));
            let v1 = _mm512_loadu_ps(w1.add(c));
            let v2 = _mm512_loadu_ps(w2.add(c));
            let v3 = _mm512_loadu_ps(w3.add(c));
            let x = _mm512_loadu_ps(x0.add(c));
            a00 = _mm512_fmadd_ps(x, v0, a00);
            a10 = _mm512_fmadd_ps(x, v1, a10);
            a20 = _mm512_fmadd_ps(x, v2, a20);
            a30 = _mm512_fmadd_ps(x, v3, a30);
            let x = _mm512_loadu_ps(x1.add(c));
            a01 = _mm512_fmadd_ps(x, v0, a01);
            a11 = _mm512_fmadd_ps(x, v1, a11);
            a21 = _mm512_fmadd_ps(x, v2, a21);
            a31 = _mm512_fmadd_ps(x, v3, a31);
            let x = _mm512_loadu_ps(x2.add(c));
            a02 = _mm512_fmadd_ps(x, v0, a02);
            a12 = _mm512_fmadd_ps(x, v1, a12);
            a22 = _mm512_fmadd_ps(x, v2, a22);
            a32 = _mm512_fmadd_ps(x, v3, a32);
            let x = _mm512_loadu_ps(x3.add(c));
            a03 = _mm512_fmadd_ps(x, v0, a03);
            a13 = _mm512_fmadd_ps(x, v1, a13);
            a23 = _mm512_fmadd_ps(x, v2, a23);
            a33 = _mm512_fmadd_ps(x, v3, a33);
        }
        c += L;
    }
    let acc = [
        [a00, a01, a02, a03],
        [a10, a11, a12, a13],
        [a20, a21, a22, a23],
        [a30, a31, a32, a33],
    ];
    let mut d = [[0f32; R]; O];
    for j in 0..O {
        for r in 0..R {
            let mut v = _mm512_reduce_add_ps(acc[j][r]);
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
            let want = naive(&x, &w, m, k, n);
            let close = |got: &[f32], path: &str| {
                for (g, e) in got.iter().zip(&want) {
                    assert!(
                        (g - e).abs() <= 1e-4 * (1.0 + e.abs()),
                        "{path} {m}x{k}x{n}: {g} vs {e}"
                    );
                }
            };
            close(&matmul_wt(&x, &w, m, k, n), "dispatched");
            // Every path, whatever this CPU would dispatch to (output is transposed).
            let transpose =
                |yt: &[f32]| -> Vec<f32> { (0..m * n).map(|i| yt[(i % n) * m + i / n]).collect() };
            let mut yt = vec![0f32; m * n];
            kernel_body::<false>(&x, &w, m, k, n, &mut yt);
            close(&transpose(&yt), "portable");
            #[cfg(target_arch = "x86_64")]
            {
                if std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("fma")
                {
                    // SAFETY: features checked just above.
                    unsafe { kernel_avx2(&x, &w, m, k, n, &mut yt) };
                    close(&transpose(&yt), "avx2");
                }
                if std::arch::is_x86_feature_detected!("avx512f") {
                    // SAFETY: as above.
                    unsafe { kernel_avx512(&x, &w, m, k, n, &mut yt) };
                    close(&transpose(&yt), "avx512");
                }
            }
        }
    }
}

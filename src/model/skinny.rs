//! `y = x W^T` for a handful of rows: the decode step's matmuls.
//!
//! While sampling, every linear layer multiplies a few rows (one per sequence) by a
//! weight matrix that is read from memory once per step. That is a bandwidth problem,
//! not a compute one, and general GEMM kernels (which pack both operands into blocks)
//! lose a good part of the bandwidth to packing and to their small-`m` edge cases. Here
//! each output row of `W` (contiguous: `W` is `[out, in]`) is streamed once and dotted
//! with all the input rows while it sits in L1, four outputs and four input rows at a
//! time so that each load feeds several fused multiply-adds.
use half::{bf16, f16};
use rayon::prelude::*;

/// An element type a weight matrix may be stored in. Products and sums are always f32:
/// a reduced-precision weight is widened exactly (bf16 and f16 are subsets of f32) as it
/// is loaded, so the kernel computes with exactly the values the training forward sees
/// after its own `to_dtype(F32)`.
pub trait Weight: Copy + Send + Sync + 'static {
    fn to_f32(self) -> f32;
    /// Sixteen lanes at `p`, widened to f32.
    ///
    /// # Safety
    /// `p..p+16` must be readable and the CPU must support AVX-512F.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load16(p: *const Self) -> std::arch::x86_64::__m512;
    /// Eight lanes at `p`, widened to f32.
    ///
    /// # Safety
    /// `p..p+8` must be readable and the CPU must support AVX2 and F16C.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load8(p: *const Self) -> std::arch::x86_64::__m256;
}

// The loads are `inline(always)` so they are compiled inside the kernels' own
// `target_feature` functions (a call to them would not be).
impl Weight for f32 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16(p: *const Self) -> std::arch::x86_64::__m512 {
        unsafe { std::arch::x86_64::_mm512_loadu_ps(p) }
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const Self) -> std::arch::x86_64::__m256 {
        unsafe { std::arch::x86_64::_mm256_loadu_ps(p) }
    }
}

impl Weight for bf16 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f32::from_bits((self.to_bits() as u32) << 16)
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16(p: *const Self) -> std::arch::x86_64::__m512 {
        use std::arch::x86_64::*;
        // bf16 is the high half of an f32: zero-extend each lane and shift it up.
        unsafe {
            let h = _mm256_loadu_si256(p as *const __m256i);
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)))
        }
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const Self) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        unsafe {
            let h = _mm_loadu_si128(p as *const __m128i);
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)))
        }
    }
}

impl Weight for f16 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f32::from(self)
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16(p: *const Self) -> std::arch::x86_64::__m512 {
        use std::arch::x86_64::*;
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i)) }
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const Self) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)) }
    }
}

/// Rows up to which [`matmul_wt`] is used instead of the general GEMM. Measured on the
/// 0.5B shapes, one thread, summed over the q/o, MLP and LM-head matrices: 76 vs 111 ms
/// at 8 rows, 142 vs 171 ms at 32, 248 vs 224 ms at 64.
pub const MAX_ROWS: usize = 48;

/// Lanes per accumulator of the AVX-512 block: one zmm register.
const L: usize = 16;
/// Register blocks (input rows x weight rows, i.e. outputs), sized per ISA so that the
/// accumulators plus the loads of one step fit the register file without spilling:
/// - AVX-512 (32 zmm): 4 x 4 blocks, 16 accumulators + 4 weight loads + 1 input load;
/// - AVX2 + FMA (16 ymm): 4 x 3 blocks of 8 lanes, 12 accumulators + 3 + 1 = 16;
/// - portable (SSE2's 16 xmm, NEON's 32 q): 2 x 2 blocks of 8 lanes (two 4-lane
///   registers each), 8 registers of accumulators.
const R: usize = 4;
const O: usize = 4;
const R_AVX2: usize = 4;
const O_AVX2: usize = 3;
const L_AVX2: usize = 8;
const R_PORTABLE: usize = 2;
const O_PORTABLE: usize = 2;
const L_PORTABLE: usize = 8;

/// Which kernel [`matmul_wt`] runs. The best the CPU supports unless
/// `CONCORD_CPU_KERNELS=avx512|avx2|portable` forces one (to measure or test another
/// ISA's path on one machine); a forced path the CPU lacks falls back to the best
/// supported one, with a warning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernels {
    Avx512,
    Avx2,
    Portable,
}

impl Kernels {
    pub fn name(self) -> &'static str {
        match self {
            Kernels::Avx512 => "avx512",
            Kernels::Avx2 => "avx2",
            Kernels::Portable => "portable",
        }
    }

    /// Whether this CPU can run the path.
    pub fn supported(self) -> bool {
        match self {
            Kernels::Portable => true,
            #[cfg(target_arch = "x86_64")]
            Kernels::Avx2 => {
                std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("fma")
                    && std::arch::is_x86_feature_detected!("f16c")
            }
            #[cfg(target_arch = "x86_64")]
            Kernels::Avx512 => std::arch::is_x86_feature_detected!("avx512f"),
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// The fastest path this CPU supports.
    pub fn best() -> Kernels {
        [Kernels::Avx512, Kernels::Avx2]
            .into_iter()
            .find(|k| k.supported())
            .unwrap_or(Kernels::Portable)
    }

    /// The path in use: `CONCORD_CPU_KERNELS` if set and supported, else the best one
    /// (decided once per process).
    pub fn active() -> Kernels {
        static ACTIVE: std::sync::OnceLock<Kernels> = std::sync::OnceLock::new();
        *ACTIVE.get_or_init(|| {
            let Ok(want) = std::env::var("CONCORD_CPU_KERNELS") else {
                return Kernels::best();
            };
            let forced = match want.trim() {
                "avx512" => Some(Kernels::Avx512),
                "avx2" => Some(Kernels::Avx2),
                "portable" => Some(Kernels::Portable),
                _ => None,
            };
            match forced {
                Some(k) if k.supported() => k,
                Some(k) => {
                    crate::note!(
                        "warning: CONCORD_CPU_KERNELS={}: this CPU lacks it; using {}",
                        k.name(),
                        Kernels::best().name()
                    );
                    Kernels::best()
                }
                None => {
                    crate::note!(
                        "warning: CONCORD_CPU_KERNELS={want:?} is not avx512, avx2 or \
                         portable; using {}",
                        Kernels::best().name()
                    );
                    Kernels::best()
                }
            }
        })
    }
}

/// `y[m, n] = x[m, k] · w[n, k]^T`, all row-major and contiguous, on the
/// [`Kernels::active`] path.
pub fn matmul_wt<W: Weight>(x: &[f32], w: &[W], m: usize, k: usize, n: usize) -> Vec<f32> {
    matmul_wt_on(Kernels::active(), x, w, m, k, n)
}

/// [`matmul_wt`] on the given path (which must be [`Kernels::supported`]; an unsupported
/// one runs the portable path).
pub fn matmul_wt_on<W: Weight>(
    path: Kernels,
    x: &[f32],
    w: &[W],
    m: usize,
    k: usize,
    n: usize,
) -> Vec<f32> {
    debug_assert_eq!(x.len(), m * k);
    debug_assert_eq!(w.len(), n * k);
    // Work in the transposed layout yt[n, m] so each parallel chunk owns whole output
    // columns, then transpose (m*n floats: small next to streaming n*k weights).
    let mut yt = vec![0f32; n * m];
    if m == 0 || n == 0 {
        return vec![0f32; m * n];
    }
    let threads = rayon::current_num_threads().max(1);
    // Several chunks per thread for balance; whole register blocks of every path
    // (4, 3 or 2 outputs) per chunk.
    let per = n.div_ceil(threads * 8).max(12).next_multiple_of(12);
    yt.par_chunks_mut(per * m).enumerate().for_each(|(c, out)| {
        let o0 = c * per;
        let no = out.len() / m;
        let wc = &w[o0 * k..(o0 + no) * k];
        kernel(path, x, wc, m, k, no, out);
    });
    let mut y = vec![0f32; m * n];
    for (o, col) in yt.chunks_exact(m).enumerate() {
        for (r, v) in col.iter().enumerate() {
            y[r * n + o] = *v;
        }
    }
    y
}

/// One chunk of outputs `out` `[n, m]` (transposed) on `path`.
pub(crate) fn kernel<W: Weight>(
    path: Kernels,
    x: &[f32],
    w: &[W],
    m: usize,
    k: usize,
    n: usize,
    out: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    {
        if path == Kernels::Avx512 && path.supported() {
            // SAFETY: the CPU supports the enabled features (checked just above).
            unsafe { kernel_avx512(x, w, m, k, n, out) };
            return;
        }
        if path == Kernels::Avx2 && path.supported() {
            // SAFETY: as above.
            unsafe { kernel_avx2(x, w, m, k, n, out) };
            return;
        }
    }
    kernel_portable(x, w, m, k, n, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn kernel_avx512<W: Weight>(
    x: &[f32],
    w: &[W],
    m: usize,
    k: usize,
    n: usize,
    out: &mut [f32],
) {
    kernel_rows::<W, R, O>(x, w, m, k, n, out, |xs, ws, k| {
        // SAFETY: this function only runs where AVX-512F is available.
        unsafe { dots_avx512(xs, ws, k) }
    })
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn kernel_avx2<W: Weight>(
    x: &[f32],
    w: &[W],
    m: usize,
    k: usize,
    n: usize,
    out: &mut [f32],
) {
    kernel_rows::<W, R_AVX2, O_AVX2>(x, w, m, k, n, out, |xs, ws, k| {
        // SAFETY: this function only runs where AVX2 and FMA are available.
        unsafe { dots_avx2(xs, ws, k) }
    })
}

/// Plain Rust, vectorised by the compiler for the target's baseline (SSE2, NEON).
fn kernel_portable<W: Weight>(x: &[f32], w: &[W], m: usize, k: usize, n: usize, out: &mut [f32]) {
    kernel_rows::<W, R_PORTABLE, O_PORTABLE>(x, w, m, k, n, out, dots_portable)
}

/// The loop over register blocks, with `dots` computing one block.
#[inline(always)]
fn kernel_rows<W: Weight, const R: usize, const O: usize>(
    x: &[f32],
    w: &[W],
    m: usize,
    k: usize,
    n: usize,
    out: &mut [f32],
    dots: impl Fn(&[&[f32]; R], &[&[W]; O], usize) -> [[f32; R]; O],
) {
    let mut o = 0;
    while o < n {
        let outs = (n - o).min(O);
        let mut ws: [&[W]; O] = [&w[o * k..(o + 1) * k]; O];
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

/// Dot products of [`R_PORTABLE`] input rows with [`O_PORTABLE`] weight rows in plain
/// Rust: 4 accumulators of [`L_PORTABLE`] lanes, `mul_add` only where the target has
/// FMA (elsewhere it is a libm call).
#[inline(always)]
fn dots_portable<W: Weight>(
    xs: &[&[f32]; R_PORTABLE],
    ws: &[&[W]; O_PORTABLE],
    k: usize,
) -> [[f32; R_PORTABLE]; O_PORTABLE] {
    const L: usize = L_PORTABLE;
    assert!(
        xs.iter().all(|r| r.len() >= k) && ws.iter().all(|r| r.len() >= k),
        "dots: row shorter than k"
    );
    let [x0, x1] = [xs[0].as_ptr(), xs[1].as_ptr()];
    let [w0, w1] = [ws[0].as_ptr(), ws[1].as_ptr()];
    // Named accumulators: an array of them makes LLVM store every accumulator back to
    // the stack after each multiply-add.
    let (mut a00, mut a01, mut a10, mut a11) = ([0f32; L], [0f32; L], [0f32; L], [0f32; L]);
    let full = k / L * L;
    let mut c = 0;
    while c < full {
        // SAFETY: c + L <= full <= k <= every row's length (asserted above). Raw reads:
        // a bounds check here also forces the accumulators to the stack.
        let (v0, v1, u0, u1) = unsafe {
            (
                std::ptr::read_unaligned(w0.add(c) as *const [W; L]).map(W::to_f32),
                std::ptr::read_unaligned(w1.add(c) as *const [W; L]).map(W::to_f32),
                std::ptr::read_unaligned(x0.add(c) as *const [f32; L]),
                std::ptr::read_unaligned(x1.add(c) as *const [f32; L]),
            )
        };
        for l in 0..L {
            a00[l] += u0[l] * v0[l];
            a01[l] += u1[l] * v0[l];
            a10[l] += u0[l] * v1[l];
            a11[l] += u1[l] * v1[l];
        }
        c += L;
    }
    let acc = [[a00, a01], [a10, a11]];
    let mut d = [[0f32; R_PORTABLE]; O_PORTABLE];
    for j in 0..O_PORTABLE {
        for r in 0..R_PORTABLE {
            let mut v: f32 = acc[j][r].iter().sum();
            for i in full..k {
                v += xs[r][i] * ws[j][i].to_f32();
            }
            d[j][r] = v;
        }
    }
    d
}

/// Dot products of [`R_AVX2`] input rows with [`O_AVX2`] weight rows with AVX2 + FMA
/// intrinsics: 12 named ymm accumulators, 3 weight loads and 1 input load per step,
/// which is the whole 16-register file (the AVX-512 blocking, 32 ymm accumulators
/// here, spilled).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dots_avx2<W: Weight>(
    xs: &[&[f32]; R_AVX2],
    ws: &[&[W]; O_AVX2],
    k: usize,
) -> [[f32; R_AVX2]; O_AVX2] {
    use std::arch::x86_64::*;
    assert!(
        xs.iter().all(|r| r.len() >= k) && ws.iter().all(|r| r.len() >= k),
        "dots: row shorter than k"
    );
    let [x0, x1, x2, x3] = [
        xs[0].as_ptr(),
        xs[1].as_ptr(),
        xs[2].as_ptr(),
        xs[3].as_ptr(),
    ];
    let [w0, w1, w2] = [ws[0].as_ptr(), ws[1].as_ptr(), ws[2].as_ptr()];
    let z = _mm256_setzero_ps();
    let (mut a00, mut a01, mut a02, mut a03) = (z, z, z, z);
    let (mut a10, mut a11, mut a12, mut a13) = (z, z, z, z);
    let (mut a20, mut a21, mut a22, mut a23) = (z, z, z, z);
    let full = k / L_AVX2 * L_AVX2;
    let mut c = 0;
    while c < full {
        // SAFETY: c + 8 <= full <= k <= every row's length (asserted above).
        unsafe {
            let v0 = W::load8(w0.add(c));
            let v1 = W::load8(w1.add(c));
            let v2 = W::load8(w2.add(c));
            let x = _mm256_loadu_ps(x0.add(c));
            a00 = _mm256_fmadd_ps(x, v0, a00);
            a10 = _mm256_fmadd_ps(x, v1, a10);
            a20 = _mm256_fmadd_ps(x, v2, a20);
            let x = _mm256_loadu_ps(x1.add(c));
            a01 = _mm256_fmadd_ps(x, v0, a01);
            a11 = _mm256_fmadd_ps(x, v1, a11);
            a21 = _mm256_fmadd_ps(x, v2, a21);
            let x = _mm256_loadu_ps(x2.add(c));
            a02 = _mm256_fmadd_ps(x, v0, a02);
            a12 = _mm256_fmadd_ps(x, v1, a12);
            a22 = _mm256_fmadd_ps(x, v2, a22);
            let x = _mm256_loadu_ps(x3.add(c));
            a03 = _mm256_fmadd_ps(x, v0, a03);
            a13 = _mm256_fmadd_ps(x, v1, a13);
            a23 = _mm256_fmadd_ps(x, v2, a23);
        }
        c += L_AVX2;
    }
    let acc = [
        [a00, a01, a02, a03],
        [a10, a11, a12, a13],
        [a20, a21, a22, a23],
    ];
    let mut d = [[0f32; R_AVX2]; O_AVX2];
    for j in 0..O_AVX2 {
        for r in 0..R_AVX2 {
            // horizontal sum of 8 lanes
            let v = acc[j][r];
            let s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
            let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
            let s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));
            let mut v = _mm_cvtss_f32(s1);
            for i in full..k {
                v += xs[r][i] * ws[j][i].to_f32();
            }
            d[j][r] = v;
        }
    }
    d
}

/// Dot products of [`R`] input rows with [`O`] weight rows with explicit AVX-512
/// intrinsics: the 16 accumulators are named locals so they stay in registers (an
/// array of them makes LLVM store every accumulator back to the stack after each
/// multiply-add, which halves the throughput).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn dots_avx512<W: Weight>(xs: &[&[f32]; R], ws: &[&[W]; O], k: usize) -> [[f32; R]; O] {
    use std::arch::x86_64::*;
    assert!(
        xs.iter().all(|r| r.len() >= k) && ws.iter().all(|r| r.len() >= k),
        "dots: row shorter than k"
    );
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
            let v0 = W::load16(w0.add(c));
            let v1 = W::load16(w1.add(c));
            let v2 = W::load16(w2.add(c));
            let v3 = W::load16(w3.add(c));
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
                v += xs[r][i] * ws[j][i].to_f32();
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
            (5, 24, 13),
            (48, 64, 7),
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
            // Every path this CPU supports, whatever it would dispatch to.
            for path in [Kernels::Portable, Kernels::Avx2, Kernels::Avx512] {
                if path.supported() {
                    close(&matmul_wt_on(path, &x, &w, m, k, n), path.name());
                }
            }
            // Reduced-precision weights: each path must equal the f64 product with the
            // rounded weights widened back to f32 (the values the training forward sees).
            let wb: Vec<bf16> = w.iter().map(|&v| bf16::from_f32(v)).collect();
            let wh: Vec<f16> = w.iter().map(|&v| f16::from_f32(v)).collect();
            let wide_b: Vec<f32> = wb.iter().map(|v| v.to_f32()).collect();
            let wide_h: Vec<f32> = wh.iter().map(|v| v.to_f32()).collect();
            // The rounding really happened (so the comparison below is not vacuous).
            assert!(wide_b.iter().zip(&w).any(|(a, b)| a != b));
            let (want_b, want_h) = (naive(&x, &wide_b, m, k, n), naive(&x, &wide_h, m, k, n));
            for path in [Kernels::Portable, Kernels::Avx2, Kernels::Avx512] {
                if !path.supported() {
                    continue;
                }
                for (got, want, dt) in [
                    (matmul_wt_on(path, &x, &wb, m, k, n), &want_b, "bf16"),
                    (matmul_wt_on(path, &x, &wh, m, k, n), &want_h, "f16"),
                ] {
                    for (g, e) in got.iter().zip(want) {
                        assert!(
                            (g - e).abs() <= 1e-4 * (1.0 + e.abs()),
                            "{} {dt} {m}x{k}x{n}: {g} vs {e}",
                            path.name()
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn widening_is_exact() {
        for v in [0.0f32, -1.5, 3.140625, 1e-3, -65504.0, 6.1e-5] {
            let b = bf16::from_f32(v);
            assert_eq!(b.to_f32(), Weight::to_f32(b));
            let h = f16::from_f32(v);
            assert_eq!(h.to_f32(), Weight::to_f32(h));
        }
    }
}

//! Dequantizing whole rows of the block types quantized bases use most (Q8_0, Q4_K,
//! Q5_0, Q6_K), compiled for each [`Kernels`] path so the compiler vectorizes them at
//! that width. The formulas and their order of operations are candle's `to_float` (and
//! llama.cpp's `dequantize_row_*`): no fused multiply-add, so every value is bit for bit
//! the same as theirs. Other types return `false` and the caller uses candle's.
//!
//! Block layouts (`repr(C)`, little-endian; candle's `k_quants` structs):
//! - Q8_0, 34 bytes: `d: f16`, `qs: [i8; 32]`;
//! - Q4_K, 144 bytes: `d: f16`, `dmin: f16`, `scales: [u8; 12]`, `qs: [u8; 128]`;
//! - Q5_0, 22 bytes: `d: f16`, `qh: [u8; 4]`, `qs: [u8; 16]`;
//! - Q6_K, 210 bytes: `ql: [u8; 128]`, `qh: [u8; 64]`, `scales: [i8; 16]`, `d: f16`.
use crate::model::skinny::Kernels;
use candle_core::quantized::GgmlDType;
use half::f16;

/// Dequantize `bytes` (whole blocks of `ty`) into `out` on `path`; false when `ty` is not
/// one of the four types here (nothing is written then).
pub fn rows(path: Kernels, ty: GgmlDType, bytes: &[u8], out: &mut [f32]) -> bool {
    let Some((block, values)) = layout(ty) else {
        return false;
    };
    assert!(
        bytes.len().is_multiple_of(block) && bytes.len() / block * values == out.len(),
        "dequant: {} bytes for {} values of {ty:?}",
        bytes.len(),
        out.len()
    );
    #[cfg(target_arch = "x86_64")]
    {
        if path == Kernels::Avx512 && path.supported() {
            // SAFETY: the CPU supports the enabled features (checked just above).
            unsafe { rows_avx512(ty, bytes, out) };
            return true;
        }
        if path == Kernels::Avx2 && path.supported() {
            // SAFETY: as above.
            unsafe { rows_avx2(ty, bytes, out) };
            return true;
        }
    }
    let _ = path;
    rows_any(ty, bytes, out);
    true
}

/// (bytes per block, values per block) of the types handled here.
fn layout(ty: GgmlDType) -> Option<(usize, usize)> {
    match ty {
        GgmlDType::Q8_0 => Some((34, 32)),
        GgmlDType::Q4K => Some((144, 256)),
        GgmlDType::Q5_0 => Some((22, 32)),
        GgmlDType::Q6K => Some((210, 256)),
        _ => None,
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn rows_avx512(ty: GgmlDType, bytes: &[u8], out: &mut [f32]) {
    rows_any(ty, bytes, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn rows_avx2(ty: GgmlDType, bytes: &[u8], out: &mut [f32]) {
    rows_any(ty, bytes, out)
}

#[inline(always)]
fn rows_any(ty: GgmlDType, bytes: &[u8], out: &mut [f32]) {
    match ty {
        GgmlDType::Q8_0 => q8_0(bytes, out),
        GgmlDType::Q4K => q4k(bytes, out),
        GgmlDType::Q5_0 => q5_0(bytes, out),
        GgmlDType::Q6K => q6k(bytes, out),
        _ => unreachable!("checked by layout"),
    }
}

#[inline(always)]
fn half_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

#[inline(always)]
fn q8_0(bytes: &[u8], out: &mut [f32]) {
    for (b, y) in bytes.chunks_exact(34).zip(out.chunks_exact_mut(32)) {
        let d = half_at(b, 0);
        let qs: &[u8; 32] = b[2..34].try_into().expect("32 bytes");
        let y: &mut [f32; 32] = y.try_into().expect("32 values");
        for j in 0..32 {
            y[j] = qs[j] as i8 as f32 * d;
        }
    }
}

/// Scale and min `j` (0..8) of a Q4_K block's 12 packed 6-bit pairs.
#[inline(always)]
fn scale_min_k4(j: usize, q: &[u8; 12]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

#[inline(always)]
fn q4k(bytes: &[u8], out: &mut [f32]) {
    for (b, y) in bytes.chunks_exact(144).zip(out.chunks_exact_mut(256)) {
        let (d, min) = (half_at(b, 0), half_at(b, 2));
        let sc: &[u8; 12] = b[4..16].try_into().expect("12 bytes");
        for j in 0..4 {
            let q: &[u8; 32] = b[16 + 32 * j..48 + 32 * j].try_into().expect("32 bytes");
            let (s1, m1) = scale_min_k4(2 * j, sc);
            let (s2, m2) = scale_min_k4(2 * j + 1, sc);
            let (d1, m1) = (d * s1 as f32, min * m1 as f32);
            let (d2, m2) = (d * s2 as f32, min * m2 as f32);
            let y: &mut [f32; 64] = (&mut y[64 * j..64 * j + 64]).try_into().expect("64");
            for l in 0..32 {
                y[l] = d1 * (q[l] & 0xF) as f32 - m1;
            }
            for l in 0..32 {
                y[32 + l] = d2 * (q[l] >> 4) as f32 - m2;
            }
        }
    }
}

#[inline(always)]
fn q5_0(bytes: &[u8], out: &mut [f32]) {
    for (b, y) in bytes.chunks_exact(22).zip(out.chunks_exact_mut(32)) {
        let d = half_at(b, 0);
        let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
        let qs: &[u8; 16] = b[6..22].try_into().expect("16 bytes");
        let y: &mut [f32; 32] = y.try_into().expect("32 values");
        for j in 0..16 {
            let h0 = (((qh >> j) << 4) & 0x10) as u8;
            let h1 = ((qh >> (j + 12)) & 0x10) as u8;
            y[j] = (((qs[j] & 0x0F) | h0) as i32 - 16) as f32 * d;
            y[j + 16] = (((qs[j] >> 4) | h1) as i32 - 16) as f32 * d;
        }
    }
}

#[inline(always)]
fn q6k(bytes: &[u8], out: &mut [f32]) {
    for (b, y) in bytes.chunks_exact(210).zip(out.chunks_exact_mut(256)) {
        let d = half_at(b, 208);
        for n in 0..2 {
            let ql: &[u8; 64] = b[64 * n..64 * n + 64].try_into().expect("64 bytes");
            let qh: &[u8; 32] = b[128 + 32 * n..160 + 32 * n].try_into().expect("32");
            let sc = &b[192 + 8 * n..200 + 8 * n];
            let y: &mut [f32; 128] = (&mut y[128 * n..128 * n + 128]).try_into().expect("128");
            for l in 0..32 {
                let is = l / 16;
                let q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i8 - 32;
                let q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i8 - 32;
                let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i8 - 32;
                let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i8 - 32;
                y[l] = d * (sc[is] as i8) as f32 * q1 as f32;
                y[l + 32] = d * (sc[is + 2] as i8) as f32 * q2 as f32;
                y[l + 64] = d * (sc[is + 4] as i8) as f32 * q3 as f32;
                y[l + 96] = d * (sc[is + 6] as i8) as f32 * q4 as f32;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::quant::QuantWeight;
    use candle_core::{Device, Tensor};

    /// Bit for bit candle's `to_float` on every path, for random blocks (extreme scales
    /// included: the values are drawn over several magnitudes).
    #[test]
    fn rows_are_candles_to_float_bit_for_bit() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(9);
        let (n, k) = (7, 512);
        let v: Vec<f32> = (0..n * k)
            .map(|i| (rng.gen::<f32>() * 2.0 - 1.0) * 10f32.powi((i % 5) as i32 - 2))
            .collect();
        let w = Tensor::from_vec(v, (n, k), &Device::Cpu).unwrap();
        for ty in [
            GgmlDType::Q8_0,
            GgmlDType::Q4K,
            GgmlDType::Q5_0,
            GgmlDType::Q6K,
        ] {
            let q = QuantWeight::quantize(&w, ty).unwrap();
            let want = crate::model::quant::candle_values(&q);
            for path in [Kernels::Avx512, Kernels::Avx2, Kernels::Portable] {
                if !path.supported() {
                    continue;
                }
                let mut got = vec![0f32; n * k];
                assert!(rows(path, ty, &q.bytes().unwrap(), &mut got));
                let same = got
                    .iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{ty:?} on {path:?}");
            }
        }
        let mut out = [0f32; 32];
        assert!(!rows(
            Kernels::Portable,
            GgmlDType::Q4_0,
            &[0u8; 18],
            &mut out
        ));
    }
}

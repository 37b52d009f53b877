//! Rotary position embedding frequencies, with Llama 3's scaling, and the per-row
//! cos/sin tables one forward uses. Computed in f32 like transformers, then cast.
use super::super::arch::{ArchConfig, Llama3Rope, RopeScaling};
use anyhow::Result;
use candle_core::{DType, Device, Tensor};

/// The inverse frequencies `theta^(-2i/D)`, `i < D/2`.
#[derive(Debug, Clone)]
pub(super) struct Rope {
    inv_freq: Vec<f32>,
}

impl Rope {
    pub(super) fn new(cfg: &ArchConfig) -> Self {
        let d = cfg.head_dim;
        let base = cfg.rope_theta as f32;
        let inv_freq = (0..d / 2)
            .map(|i| 1.0f32 / base.powf((2 * i) as f32 / d as f32))
            .collect();
        let inv_freq = match &cfg.rope_scaling {
            Some(RopeScaling::Llama3(s)) => llama3_scaled(inv_freq, s),
            Some(RopeScaling::Factors(ff)) => inv_freq.iter().zip(ff).map(|(f, d)| f / d).collect(),
            None => inv_freq,
        };
        Rope { inv_freq }
    }

    /// cos/sin tables `[B, T, D/2]` in `dtype` for per-row positions
    /// (`positions.len() == B*T`).
    pub(super) fn tables(
        &self,
        (b, t): (usize, usize),
        positions: &[u32],
        dtype: DType,
        device: &Device,
    ) -> Result<(Tensor, Tensor)> {
        let half = self.inv_freq.len();
        let mut cos = Vec::with_capacity(b * t * half);
        let mut sin = Vec::with_capacity(b * t * half);
        for &p in positions {
            for &f in &self.inv_freq {
                let a = p as f32 * f;
                cos.push(a.cos());
                sin.push(a.sin());
            }
        }
        let cos = Tensor::from_vec(cos, (b, t, half), device)?.to_dtype(dtype)?;
        let sin = Tensor::from_vec(sin, (b, t, half), device)?.to_dtype(dtype)?;
        Ok((cos, sin))
    }
}

/// transformers' `_compute_llama3_parameters`, in its order of f32 operations:
/// wavelengths above `original / low_freq_factor` are divided by `factor`, those below
/// `original / high_freq_factor` kept, and the band between blended linearly in
/// `original / wavelength`.
fn llama3_scaled(inv_freq: Vec<f32>, s: &Llama3Rope) -> Vec<f32> {
    let factor = s.factor as f32;
    let (low, high) = (s.low_freq_factor as f32, s.high_freq_factor as f32);
    let original = s.original_max_position_embeddings as f32;
    let low_freq_wavelen = original / low;
    let high_freq_wavelen = original / high;
    inv_freq
        .into_iter()
        .map(|f| {
            let wavelen = 2.0 * std::f32::consts::PI / f;
            let scaled = if wavelen > low_freq_wavelen {
                f / factor
            } else {
                f
            };
            if wavelen < high_freq_wavelen || wavelen > low_freq_wavelen {
                return scaled;
            }
            let smooth = (original / wavelen - low) / (high - low);
            (1.0 - smooth) * scaled / factor + smooth * scaled
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama3_scaling_by_hand() {
        // original 8192, low 1, high 4: wavelengths above 8192 are slowed by the factor,
        // below 2048 kept; in between, smooth = (8192 / wavelength - 1) / 3 blends
        // f / factor with f.
        let s = Llama3Rope {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192,
        };
        let two_pi = 2.0 * std::f32::consts::PI;
        let fast = two_pi / 100.0; // wavelength 100: kept
        let slow = two_pi / 10_000.0; // wavelength 10,000: slowed 8x
        let mid = two_pi / 4096.0; // wavelength 4096: smooth = (2 - 1) / 3
        let got = llama3_scaled(vec![fast, slow, mid], &s);
        assert_eq!(got[0], fast);
        assert!((got[1] - slow / 8.0).abs() < 1e-12);
        let want = (2.0 / 3.0) * mid / 8.0 + (1.0 / 3.0) * mid;
        assert!((got[2] - want).abs() / want < 1e-6, "{} vs {want}", got[2]);
    }
}

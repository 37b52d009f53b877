//! Weights by Hugging Face name: the map every loader fills, deterministic random
//! weights for `random:SHAPE` and tests, and the checked lookup the model is built with.
use super::arch::{is_norm, ArchConfig};
use anyhow::{anyhow, bail, Result};
use candle_core::{DType, Device, Tensor};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::HashMap;

/// Model tensors by Hugging Face name, already in the target dtype and device.
pub type Weights = HashMap<String, Tensor>;

/// Hugging-Face-like random init: normal(0, 0.02) for matrices and biases, ones for
/// norms. Deterministic in `seed` (our ChaCha RNG, not candle's).
pub fn random_weights(
    cfg: &ArchConfig,
    seed: u64,
    dtype: DType,
    device: &Device,
) -> Result<Weights> {
    let mut w = Weights::new();
    random_weights_each(cfg, seed, dtype, device, |name, t| {
        w.insert(name, t);
        Ok(())
    })?;
    Ok(w)
}

/// [`random_weights`] handed to `keep` one tensor at a time (the same values), so a
/// caller can quantize each projection before the next exists.
pub fn random_weights_each(
    cfg: &ArchConfig,
    seed: u64,
    dtype: DType,
    device: &Device,
    mut keep: impl FnMut(String, Tensor) -> Result<()>,
) -> Result<()> {
    cfg.validate()?;
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    for (name, shape) in cfg.tensor_shapes() {
        let n: usize = shape.iter().product();
        let vals: Vec<f32> = if is_norm(&name) {
            vec![1.0; n]
        } else {
            normals(&mut rng, n)
        };
        let t = Tensor::from_vec(vals, shape, device)?.to_dtype(dtype)?;
        keep(name, t)?;
    }
    Ok(())
}

/// `n` values `0.02 * normal(rng)`, the same as drawing them one after another, drawn in
/// parallel: each [`normal`] consumes exactly four 32-bit words of the ChaCha stream
/// (two `f64`s), so a chunk starting at sample `i` seeks to word `start + 4 i`. (A 7B
/// shape draws 7.6 billion of them.)
fn normals(rng: &mut ChaCha8Rng, n: usize) -> Vec<f32> {
    use rayon::prelude::*;
    const CHUNK: usize = 1 << 16;
    let start = rng.get_word_pos();
    let mut vals = vec![0f32; n];
    vals.par_chunks_mut(CHUNK).enumerate().for_each(|(c, out)| {
        let mut r = rng.clone();
        r.set_word_pos(start + 4 * (c * CHUNK) as u128);
        for v in out {
            *v = 0.02 * normal(&mut r);
        }
    });
    rng.set_word_pos(start + 4 * n as u128);
    vals
}

/// A standard normal sample (Box-Muller) from our seeded RNG.
pub fn normal(rng: &mut ChaCha8Rng) -> f32 {
    let u1: f64 = rng.gen::<f64>().max(1e-300);
    let u2: f64 = rng.gen();
    ((-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()) as f32
}

/// The tensor `name`, checked to have `shape` and `dtype` (errors name the tensor).
pub(crate) fn check_tensor(
    w: &Weights,
    name: &str,
    shape: &[usize],
    dtype: DType,
) -> Result<Tensor> {
    let t = w
        .get(name)
        .ok_or_else(|| anyhow!("missing tensor {name} (expected shape {shape:?})"))?;
    if t.dims() != shape {
        bail!("tensor {name} has shape {:?}, expected {shape:?}", t.dims());
    }
    if t.dtype() != dtype {
        bail!(
            "tensor {name} has dtype {:?}, expected {dtype:?} (like model.embed_tokens.weight)",
            t.dtype()
        );
    }
    Ok(t.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The parallel draw is the sequential stream, value for value, and leaves the RNG
    /// where the sequential draw would (so every later tensor is unchanged too).
    #[test]
    fn parallel_normals_are_the_sequential_stream() {
        let n = (1 << 16) * 3 + 77;
        let mut a = ChaCha8Rng::seed_from_u64(5);
        let _ = normal(&mut a); // an odd start position within a block
        let mut b = a.clone();
        let seq: Vec<f32> = (0..n).map(|_| 0.02 * normal(&mut a)).collect();
        assert_eq!(normals(&mut b, n), seq);
        assert_eq!(normal(&mut a), normal(&mut b));
    }
}

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
//!
//! The files: `linear` the frozen linear layer, `graph` the tracked binary ops and
//! [`attach`] (the plumbing every other op is built on), `layer` the transformer
//! layer's ops, `logprobs` the chunked token log-probs through the LM head.
use candle_core::{CpuStorage, Result, Storage};

#[cfg(feature = "cuda")]
use candle_core::CudaStorage;

mod graph;
mod layer;
mod linear;
mod logprobs;

pub use graph::{add, attach, matmul, mul, pad_cols, prefix_cat};
pub use layer::{masked_softmax, rms_norm, rope, silu_mul};
pub use linear::{base_linear, frozen_linear, widen, BaseWeight};
pub use logprobs::{chunked_token_logprobs, chunked_token_logprobs_cached, PROB_CACHE_BYTES};

// ---------------------------------------------------------------------------------------
// Storage accessors shared by the files here.

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

/// Helpers shared by the tests of every file here.
#[cfg(test)]
mod test_util {
    use super::mul;
    use candle_core::{Device, Result, Tensor, Var};

    pub(super) fn rand(shape: &[usize], seed: u64) -> Tensor {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let n: usize = shape.iter().product();
        let v: Vec<f32> = (0..n).map(|_| rng.gen::<f32>() * 2.0 - 1.0).collect();
        Tensor::from_vec(v, shape, &Device::Cpu).unwrap()
    }

    pub(super) fn diff(a: &Tensor, b: &Tensor) -> f32 {
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
    pub(super) fn check(
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
}

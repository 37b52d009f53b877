//! Differentiable and fused ops with real backward passes.

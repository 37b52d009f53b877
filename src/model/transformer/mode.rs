//! How a forward pass runs: with or without a graph, with or without LoRA dropout.

/// How a forward pass runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// No graph at all (sampling, reference log-probs, old log-probs): every tensor is
    /// detached, nothing is recorded, no dropout.
    #[default]
    Detached,
    /// Record the graph to the LoRA vars, no dropout (evaluation with gradients).
    Grad,
    /// Record the graph and apply LoRA dropout with masks drawn from `dropout_seed`.
    Train { dropout_seed: u64 },
}

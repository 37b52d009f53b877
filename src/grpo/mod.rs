//! Group Relative Policy Optimisation: advantages, the clipped surrogate loss, the
//! optimiser and the training loop.
pub mod advantage;
pub mod loss;
pub mod optim;
pub mod rollout;
pub mod trainer;

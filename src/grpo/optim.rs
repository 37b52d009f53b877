//! GRPO optim.

//! GRPO loss.

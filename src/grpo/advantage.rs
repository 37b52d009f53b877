//! GRPO advantage.

//! GRPO trainer.

//! GRPO rollout.

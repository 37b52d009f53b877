//! Concord: a pure-Rust GRPO trainer that teaches LLMs to coordinate.
//!
//! Layout: [`model`] (Qwen2 + LoRA, loading, tokenizer), [`sample`] (group sampling
//! with a shared KV cache), [`grpo`] (advantages, loss, optimiser, trainer), [`envs`]
//! (the multi-agent environments) and [`config`] (the TOML schema).
pub mod atomic;
pub mod chat;
pub mod cli;
pub mod config;
pub mod curriculum;
pub mod envs;
pub mod eval;
pub mod grpo;
pub mod hub;
pub mod model;
pub mod plot;
pub mod rng;
pub mod run;
pub mod sample;
pub mod sys;
pub mod task;

//! Concord: a pure-Rust GRPO trainer that teaches LLMs to coordinate.
//!
//! Data flows one way, and so do the imports: [`config`] (the TOML schema) →
//! [`model`] (Qwen2 + LoRA, loading, tokenizer) and [`envs`] (the multi-agent
//! environments and the episode driver) → [`task`] (prompts and rewards) → [`sample`]
//! (group sampling with a shared KV cache) → [`grpo`] (advantages, loss, optimiser, the
//! training loop) → [`run`] (the run directory). [`sft`] (supervised fine-tuning and the
//! warm start before GRPO), [`curriculum`], [`eval`], [`plot`] and [`hub`] build on those; [`cli`] holds every command-line type. [`chat`], [`rng`],
//! [`atomic`] and [`sys`] are leaves. [`dist`] (data parallel across processes: MPI, NCCL)
//! sits under [`grpo`].
pub mod atomic;
pub mod chat;
pub mod cli;
pub mod config;
pub mod curriculum;
pub mod dist;
pub mod envs;
pub mod eval;
pub mod grpo;
pub mod hub;
pub mod model;
pub mod plot;
pub mod rng;
pub mod run;
pub mod sample;
pub mod serve;
pub mod sft;
pub mod sys;
pub mod task;

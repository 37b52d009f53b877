//! Qwen2 with LoRA adapters: our own differentiable implementation, checkpoint
//! loading, tokenizer and chat template. The bottom of the house: nothing here knows an
//! environment, a trainer, the sampler or the run configuration.
//!
//! - [`qwen2`], [`lora`], [`ops`], [`skinny`]: the network and its custom ops;
//!   [`recompute`]: activation checkpointing for its training forward;
//! - [`load`]: the one way to get a model ([`load::load_model`] over a [`load::ModelSpec`]);
//!   [`checkpoint`] reads safetensors checkpoints (local or Hub) and [`gguf`] llama.cpp /
//!   Ollama `.gguf` files for it;
//! - [`tokenizer`]: tokenizer, chat template and the [`tokenizer::Renderer`] trait;
//! - [`generation`]: the generation_config.json schema;
//! - [`tiny`], [`adapter`]: deterministic random checkpoints and adapters (tests, parity);
//! - [`score`]: log-probabilities of a completion (`concord score`);
//! - [`budget`]: positions and memory checked before a sampling, scoring or training call
//!   allocates (the training-memory estimate behind `[optim] memory_budget_gb`).
pub mod adapter;
pub mod budget;
pub mod checkpoint;
pub mod generation;
pub mod gguf;
pub mod load;
pub mod lora;
pub mod ops;
pub mod qwen2;
pub mod recompute;
pub mod score;
pub mod skinny;
pub mod tiny;
pub mod tokenizer;

pub use lora::{LoraConfig, LORA_TARGETS};
pub use qwen2::{random_weights, KvCache, Mode, Qwen2, Qwen2Config, TokenLogProbs, Weights};
pub use score::score;

//! Qwen2 with LoRA adapters: our own differentiable implementation, checkpoint
//! loading, tokenizer and chat template.
pub mod cli;
pub mod gguf;
pub mod load;
pub mod lora;
pub mod ops;
pub mod qwen2;
pub mod skinny;
pub mod tokenizer;

pub use lora::{LoraConfig, LORA_TARGETS};
pub use qwen2::{random_weights, KvCache, Mode, Qwen2, Qwen2Config, TokenLogProbs, Weights};

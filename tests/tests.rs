//! Concord's integration tests, one binary (as ripgrep does): one module per area,
//! shared helpers in [`util`]. `merge_ring.rs` is a binary of its own (it measures the
//! process's peak memory). Run one area with `cargo test --test tests grpo_train::`.
mod util;

mod continuation;
mod dataset;
mod distributed;
mod docs;
mod docs_commands;
mod episode;
mod eval;
mod explore;
mod export;
mod families;
mod gguf;
mod grpo_math;
mod grpo_train;
mod load_checkpoint;
mod memory;
mod model_core;
mod one_driver;
mod parity;
mod plot;
mod postmortem;
mod published_runs;
mod quant_base;
mod reliability;
mod reward_program;
mod sample_model;
mod serve;
mod sft;
mod shared_prompt;
mod ticketmelt;
mod whispers;

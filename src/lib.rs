//! Concord: a pure-Rust GRPO trainer that teaches LLMs to coordinate.
//!
//! Data flows one way, and so do the imports: [`config`] (the TOML schema) →
//! [`model`] (Transformer + LoRA, loading, tokenizer) and [`envs`] (the multi-agent
//! environments and the episode driver) → [`task`] (prompts and rewards) → [`sample`]
//! (group sampling with a shared KV cache) → [`grpo`] (advantages, loss, optimiser, the
//! training loop) → [`run`] (the run directory). [`sft`] (supervised fine-tuning and the
//! warm start before GRPO), [`curriculum`], [`eval`], [`plot`] and [`hub`] build on those; [`cli`] holds every command-line type. [`chat`], [`rng`],
//! [`atomic`] and [`sys`] are leaves. [`dist`] (data parallel across processes: MPI, NCCL)
//! sits under [`grpo`].
// Console output that survives a closed stream. `std`'s print macros panic when the
// reader has gone (`concord train | tee log` whose tee died, `... | head`); a training
// run must then keep going and checkpoint, and a listing just stops mattering. Every
// line Concord writes goes through these.

/// `eprintln!` that ignores a closed or failing stderr.
#[macro_export]
macro_rules! note {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

/// `println!` that ignores a closed or failing stdout.
#[macro_export]
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

/// `print!` that ignores a closed or failing stdout.
#[macro_export]
macro_rules! say_raw {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = write!(std::io::stdout(), $($arg)*);
    }};
}

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
pub mod learn;
pub mod model;
pub mod plot;
pub mod rng;
pub mod run;
pub mod sample;
pub mod serve;
pub mod sft;
pub mod sys;
pub mod task;
pub mod train;

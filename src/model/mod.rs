//! The model: our own differentiable decoder (Transformer, Qwen3, Llama 3) with LoRA
//! adapters, checkpoint loading, tokenizer and chat template. The bottom of the house:
//! nothing here knows an environment, a trainer, the sampler or the run configuration.
//!
//! - [`arch`]: which family a checkpoint is and its hyper-parameters ([`ArchConfig`]);
//! - [`transformer`]: the network ([`Transformer`]) and its one forward; [`lora`],
//!   [`ops`], [`skinny`]: the adapters and the custom ops it is built from;
//! - [`quant`]: a quantized frozen base (Q8_0, Q4_K, a GGUF file's blocks);
//! - [`weights`]: tensors by Hugging Face name, random or loaded;
//! - [`load`]: the one way to get a model ([`load::load_model`] over a [`load::ModelSpec`]);
//!   [`checkpoint`] reads safetensors checkpoints (local or Hub) and [`gguf`] llama.cpp /
//!   Ollama `.gguf` files for it;
//! - [`tokenizer`]: tokenizer, chat template and the [`tokenizer::Renderer`] trait;
//! - [`generation`]: the generation_config.json schema;
//! - [`tiny`], [`adapter`]: deterministic random checkpoints and adapters (tests, parity);
//! - [`score`]: log-probabilities of a completion (`concord score`);
//! - [`budget`]: positions and memory checked before a sampling, scoring or training call
//!   allocates (the training-memory estimate behind `[optim] memory_budget_gb`); [`fit`]:
//!   a whole GRPO step's memory from a shape alone (`concord model estimate`).
pub mod adapter;
pub mod arch;
pub mod budget;
pub mod checkpoint;
pub mod fit;
pub mod generation;
pub mod gguf;
pub mod load;
pub mod lora;
pub mod ops;
pub mod quant;
pub mod score;
pub mod skinny;
pub mod tiny;
pub mod tokenizer;
pub mod transformer;
pub mod weights;

pub use arch::{ArchConfig, Family, Llama3Rope, RopeScaling};
pub use lora::{LoraConfig, LORA_TARGETS};
pub use score::score;
pub use transformer::{
    default_logprob_chunk, Checkpoints, Hidden, Input, KvCache, Mode, Pass, RowKv, TokenLogProbs,
    Transformer,
};
pub use weights::{random_weights, Weights};

/// A candle error's message without the backtrace candle attaches to it when
/// `RUST_BACKTRACE` is set: users get the message, developers the `Debug` form.
pub fn candle_message(e: &candle_core::Error) -> String {
    use candle_core::Error as E;
    match e {
        E::WithBacktrace { inner, .. } => candle_message(inner),
        E::Context { inner, context } => format!("{context}: {}", candle_message(inner)),
        E::WithPath { inner, path } => format!("{}: {}", path.display(), candle_message(inner)),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod candle_message_tests {
    #[test]
    fn backtraces_are_left_out() {
        let bt = candle_core::Error::WithBacktrace {
            inner: Box::new(candle_core::Error::Msg("bad header".into())),
            backtrace: Box::new(std::backtrace::Backtrace::force_capture()),
        };
        assert!(
            bt.to_string().lines().count() > 1,
            "candle prints the backtrace"
        );
        assert_eq!(super::candle_message(&bt), "bad header");
        let ctx = bt.context("reading x.gguf");
        assert_eq!(super::candle_message(&ctx), "reading x.gguf: bad header");
    }
}

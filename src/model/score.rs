//! `concord score`: log-probabilities of a completion given a chat prompt.
use std::path::PathBuf;

use anyhow::Result;
use candle_core::{DType, Device, Tensor};

use super::load::{load_model, LoadedModel, ModelSpec};
use super::Mode;
use crate::chat::Message;

/// What `concord score` scores.
#[derive(Debug, Clone)]
pub struct ScoreOptions {
    /// Local model directory or Hub id.
    pub model: String,
    /// PEFT adapter directory.
    pub adapter: Option<PathBuf>,
    pub dtype: DType,
    /// Storage dtype of the frozen base ([`ModelSpec::base_dtype`]).
    pub base_dtype: Option<crate::model::quant::BaseDtype>,
    pub device: Device,
    /// JSON file: the prompt's message list.
    pub messages: PathBuf,
    /// Completion text (tokenized without special tokens).
    pub completion: String,
}

/// Prompt ids (chat template with the generation prompt), completion ids (no special
/// tokens) and `logprobs[i] = ln p(completion_ids[i] | everything before)`.
#[derive(Debug, Clone, PartialEq)]
pub struct Scored {
    pub prompt_ids: Vec<u32>,
    pub completion_ids: Vec<u32>,
    pub logprobs: Vec<f32>,
}

/// Load the model (and adapter) and score the completion.
pub fn score(opts: &ScoreOptions) -> Result<Scored> {
    let messages = crate::chat::read_messages(&opts.messages)?;
    let m = load_model(&ModelSpec {
        dtype: Some(opts.dtype),
        base_dtype: opts.base_dtype,
        adapter: opts.adapter.clone(),
        ..ModelSpec::new(&opts.model, opts.device.clone())
    })?;
    score_completion(&m, &messages, &opts.completion)
}

/// The `score` computation on a loaded model.
pub fn score_completion(m: &LoadedModel, messages: &[Message], completion: &str) -> Result<Scored> {
    let tokenizer = m.tokenizer()?;
    let prompt_ids = tokenizer.encode_chat(messages, true)?;
    let completion_ids = tokenizer.encode(completion)?;
    if prompt_ids.is_empty() {
        anyhow::bail!("the chat template rendered an empty prompt");
    }
    if completion_ids.is_empty() {
        return Ok(Scored {
            prompt_ids,
            completion_ids,
            logprobs: Vec::new(),
        });
    }
    let all: Vec<u32> = prompt_ids.iter().chain(&completion_ids).copied().collect();
    super::budget::check_scoring(
        &m.config,
        m.model.device(),
        1,
        all.len(),
        &format!(
            "scoring {} prompt + {} completion tokens",
            prompt_ids.len(),
            completion_ids.len()
        ),
    )?;
    let t = Tensor::new(all.as_slice(), m.model.device())?.unsqueeze(0)?;
    let logprobs = m
        .model
        .sequence_logprobs(&t, None, Mode::Detached, 1.0, false)?
        .logprobs
        .narrow(1, prompt_ids.len() - 1, completion_ids.len())?
        .squeeze(0)?
        .to_dtype(DType::F32)?
        .to_vec1::<f32>()?;
    if logprobs.iter().any(|l| l.is_nan()) {
        anyhow::bail!(
            "the model's log-probabilities are NaN: its weights or its config are broken"
        );
    }
    Ok(Scored {
        prompt_ids,
        completion_ids,
        logprobs,
    })
}

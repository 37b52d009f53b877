//! What one sampling call does: [`SamplingParams`] (with [`SamplingOverrides`], the
//! user's choices over a checkpoint's generation_config), and what it returns:
//! [`Completion`] and its [`FinishReason`].
use serde::{Deserialize, Serialize};

use crate::model::generation::GenerationConfig;

/// Parameters of one sampling call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SamplingParams {
    /// Softmax temperature; `0` means greedy (argmax).
    pub temperature: f32,
    /// Nucleus sampling mass; `1.0` disables it.
    pub top_p: f32,
    /// Keep the `top_k` most likely tokens; `0` disables it.
    pub top_k: usize,
    /// Drop tokens whose probability is below `min_p` times the top token's; `0` = off.
    pub min_p: f32,
    /// CTRL-style repetition penalty on every token of prompt and completion so far
    /// (positive logits divided, negative multiplied); `1.0` = off.
    pub repetition_penalty: f32,
    /// Generation stops after this many new tokens (finish reason `length`).
    pub max_new_tokens: usize,
    /// The stop tokens are suppressed until this many tokens were generated.
    pub min_new_tokens: usize,
    /// Tokens that end a completion (finish reason `eos`); kept as the last id.
    pub stop_token_ids: Vec<u32>,
    /// Strings that end a completion (finish reason `stop`); the text is cut before it.
    pub stop_strings: Vec<String>,
    /// Base seed of the per-row RNG streams.
    pub seed: u64,
}

impl SamplingParams {
    /// `field: this, that` for each field that differs from `other`'s.
    pub fn differences(&self, other: &Self) -> Vec<String> {
        let show = |a: String, b: String| (a != b).then_some((a, b));
        [
            (
                "temperature",
                show(self.temperature.to_string(), other.temperature.to_string()),
            ),
            (
                "top_p",
                show(self.top_p.to_string(), other.top_p.to_string()),
            ),
            (
                "top_k",
                show(self.top_k.to_string(), other.top_k.to_string()),
            ),
            (
                "min_p",
                show(self.min_p.to_string(), other.min_p.to_string()),
            ),
            (
                "repetition_penalty",
                show(
                    self.repetition_penalty.to_string(),
                    other.repetition_penalty.to_string(),
                ),
            ),
            (
                "max_new_tokens",
                show(
                    self.max_new_tokens.to_string(),
                    other.max_new_tokens.to_string(),
                ),
            ),
            (
                "min_new_tokens",
                show(
                    self.min_new_tokens.to_string(),
                    other.min_new_tokens.to_string(),
                ),
            ),
            (
                "stop_token_ids",
                show(
                    format!("{:?}", self.stop_token_ids),
                    format!("{:?}", other.stop_token_ids),
                ),
            ),
            (
                "stop_strings",
                show(
                    format!("{:?}", self.stop_strings),
                    format!("{:?}", other.stop_strings),
                ),
            ),
            ("seed", show(self.seed.to_string(), other.seed.to_string())),
        ]
        .into_iter()
        .filter_map(|(k, d)| d.map(|(a, b)| format!("{k}: {a}, {b}")))
        .collect()
    }
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            max_new_tokens: 256,
            min_new_tokens: 0,
            stop_token_ids: Vec::new(),
            stop_strings: Vec::new(),
            seed: 0,
        }
    }
}

impl SamplingParams {
    /// Greedy decoding with the given budget.
    pub fn greedy(max_new_tokens: usize) -> Self {
        Self {
            temperature: 0.0,
            max_new_tokens,
            ..Self::default()
        }
    }

    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0
    }

    /// Rejects values that make no sense (NaN, negative, out of range).
    pub fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.temperature.is_finite() && self.temperature >= 0.0,
            "temperature must be >= 0, got {}",
            self.temperature
        );
        anyhow::ensure!(
            self.top_p > 0.0 && self.top_p <= 1.0,
            "top_p must be in (0, 1], got {}",
            self.top_p
        );
        anyhow::ensure!(
            (0.0..=1.0).contains(&self.min_p),
            "min_p must be in [0, 1], got {}",
            self.min_p
        );
        anyhow::ensure!(
            self.repetition_penalty.is_finite() && self.repetition_penalty > 0.0,
            "repetition_penalty must be > 0, got {}",
            self.repetition_penalty
        );
        anyhow::ensure!(
            self.stop_strings.iter().all(|s| !s.is_empty()),
            "stop strings must not be empty"
        );
        Ok(())
    }
}

/// Why a completion ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FinishReason {
    /// A stop token was sampled.
    Eos,
    /// `max_new_tokens` reached.
    Length,
    /// A stop string appeared in the decoded text.
    Stop,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Eos => "eos",
            FinishReason::Length => "length",
            FinishReason::Stop => "stop",
        }
    }
}

/// One sampled completion.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Completion {
    /// Generated token ids (a sampled stop token is kept as the last id).
    pub ids: Vec<u32>,
    /// Decoded text without the stop token, cut before a stop string.
    pub text: String,
    pub finish_reason: FinishReason,
    /// Log-prob of each chosen token under the distribution actually sampled from
    /// (after penalties, temperature and filters); 0 for greedy choices.
    pub sample_logprobs: Vec<f32>,
    /// Log-prob of each chosen token under softmax(logits / temperature) over the full
    /// vocabulary (temperature 1 when greedy): what the trainer recomputes.
    pub full_logprobs: Vec<f32>,
}

impl SamplingParams {
    /// Sampling with these filters and budget (no stop tokens or strings, seed 0): the
    /// trainer and eval build theirs from the run configuration's numbers.
    pub fn new(
        temperature: f64,
        top_p: f64,
        top_k: usize,
        min_p: f64,
        repetition_penalty: f64,
        max_new_tokens: usize,
    ) -> Self {
        Self {
            temperature: temperature as f32,
            top_p: top_p as f32,
            top_k,
            min_p: min_p as f32,
            repetition_penalty: repetition_penalty as f32,
            max_new_tokens,
            ..Self::default()
        }
    }
}

/// Sampling knobs a user may set; `None` falls back to the checkpoint's
/// generation_config, then to [`SamplingParams::default`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SamplingOverrides {
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<usize>,
    pub min_p: Option<f32>,
    pub repetition_penalty: Option<f32>,
    /// Base seed of the per-row RNG streams.
    pub seed: u64,
}

impl SamplingOverrides {
    /// These values over `gc` over [`SamplingParams::default`] (budget and stops from
    /// the defaults).
    pub fn resolve(&self, gc: &GenerationConfig) -> SamplingParams {
        let d = SamplingParams::default();
        SamplingParams {
            temperature: self
                .temperature
                .or(gc.temperature.map(|x| x as f32))
                .unwrap_or(d.temperature),
            top_p: self.top_p.or(gc.top_p.map(|x| x as f32)).unwrap_or(d.top_p),
            top_k: self.top_k.or(gc.top_k).unwrap_or(d.top_k),
            min_p: self.min_p.or(gc.min_p.map(|x| x as f32)).unwrap_or(d.min_p),
            repetition_penalty: self
                .repetition_penalty
                .or(gc.repetition_penalty.map(|x| x as f32))
                .unwrap_or(d.repetition_penalty),
            seed: self.seed,
            ..d
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validate_rejects_bad_params() {
        assert!(SamplingParams::default().validate().is_ok());
        assert!(SamplingParams {
            top_p: 0.0,
            ..Default::default()
        }
        .validate()
        .is_err());
        assert!(SamplingParams {
            temperature: -1.0,
            ..Default::default()
        }
        .validate()
        .is_err());
        assert!(SamplingParams {
            temperature: f32::NAN,
            ..Default::default()
        }
        .validate()
        .is_err());
        assert!(SamplingParams {
            min_p: 2.0,
            ..Default::default()
        }
        .validate()
        .is_err());
    }
}

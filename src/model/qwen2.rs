//! Our own Qwen2 (Qwen2ForCausalLM), built from differentiable ops so LoRA trains.

/// Architecture hyper-parameters, normalised from either config.json dialect
/// (transformers 4.x top-level `rope_theta`, or 5.x `rope_parameters`) by `load.rs`.
#[derive(Debug, Clone, PartialEq)]
pub struct Qwen2Config {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    /// hidden_size / num_attention_heads unless config.json says otherwise.
    pub head_dim: usize,
    pub max_position_embeddings: usize,
    pub rope_theta: f64,
    pub rms_norm_eps: f64,
    pub tie_word_embeddings: bool,
}

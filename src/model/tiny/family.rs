//! What a tiny checkpoint of each family ships besides its weights: config.json in the
//! dialect its Hub repos use, the family's real tokenizer and chat template (embedded,
//! so `init-tiny` works offline), and generation_config.json.
use crate::model::arch::{ArchConfig, Family, RopeScaling};
use anyhow::{Context, Result};
use serde_json::json;
use std::io::Read;

/// Qwen's byte-level BPE tokenizer (Qwen2.5 vocabulary + 4 later special tokens), gzip'd.
/// Recreate with scripts/fetch_qwen_tokenizer.sh.
static QWEN_TOKENIZER_GZ: &[u8] = include_bytes!("../../../assets/qwen_tokenizer.json.gz");

/// Token ids the embedded tokenizer uses (the highest is `</think>` = 151668).
pub const TOKENIZER_IDS: usize = 151_669;
pub const ENDOFTEXT_ID: u32 = 151_643;
pub const IM_START_ID: u32 = 151_644;
pub const IM_END_ID: u32 = 151_645;

/// Qwen2.5-Instruct's chat template (ChatML with a default system prompt and tool calls).
pub const QWEN25_CHAT_TEMPLATE: &str = r#"{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"#;

/// Qwen3's chat template (thinking switch, tool calls), as its tokenizer_config.json ships it.
pub const QWEN3_CHAT_TEMPLATE: &str = include_str!("../../../assets/qwen3_chat_template.jinja");

/// Llama 3.1/3.2 Instruct's chat template, as its tokenizer_config.json ships it.
pub const LLAMA3_CHAT_TEMPLATE: &str = include_str!("../../../assets/llama3_chat_template.jinja");

/// Llama 3.1/3.2's tokenizer (128,000 BPE tokens + 256 special), gzip'd. Recreate with
/// scripts/fetch_llama_tokenizer.sh.
static LLAMA_TOKENIZER_GZ: &[u8] = include_bytes!("../../../assets/llama3_tokenizer.json.gz");

/// Llama 3's vocabulary, and the ids its configs name.
pub const LLAMA_VOCAB: usize = 128_256;
pub const LLAMA_BOS_ID: u32 = 128_000;
pub const LLAMA_END_OF_TEXT_ID: u32 = 128_001;
pub const LLAMA_EOM_ID: u32 = 128_008;
pub const LLAMA_EOT_ID: u32 = 128_009;

/// Qwen's padded vocabulary (the released checkpoints' embedding rows).
pub const QWEN_VOCAB: usize = 151_936;

/// The vocabulary a family's checkpoints have, and the ids its tokenizer uses.
pub fn vocab(family: Family) -> (usize, usize) {
    match family {
        Family::Qwen2 | Family::Qwen3 => (QWEN_VOCAB, TOKENIZER_IDS),
        Family::Llama => (LLAMA_VOCAB, LLAMA_VOCAB),
    }
}

/// `tokenizer.json`, decompressed.
pub fn tokenizer_json(family: Family) -> Result<Vec<u8>> {
    let (gz, what) = match family {
        Family::Qwen2 | Family::Qwen3 => (QWEN_TOKENIZER_GZ, "Qwen"),
        Family::Llama => (LLAMA_TOKENIZER_GZ, "Llama 3"),
    };
    let mut out = Vec::with_capacity(20 << 20);
    flate2::read::GzDecoder::new(gz)
        .read_to_end(&mut out)
        .with_context(|| format!("decompressing the embedded {what} tokenizer"))?;
    Ok(out)
}

/// The embedded Qwen tokenizer.json, decompressed.
pub fn qwen_tokenizer_json() -> Result<Vec<u8>> {
    tokenizer_json(Family::Qwen2)
}

fn added_tokens(tokenizer_json: &[u8]) -> Result<Vec<serde_json::Value>> {
    let tok: serde_json::Value =
        serde_json::from_slice(tokenizer_json).context("parsing the embedded tokenizer.json")?;
    Ok(tok["added_tokens"].as_array().cloned().unwrap_or_default())
}

/// tokenizer_config.json as the family's Instruct checkpoints ship it.
pub fn tokenizer_config_json(family: Family, tokenizer_json: &[u8]) -> Result<serde_json::Value> {
    match family {
        Family::Qwen2 => qwen_tokenizer_config(tokenizer_json, QWEN25_CHAT_TEMPLATE),
        Family::Qwen3 => qwen_tokenizer_config(tokenizer_json, QWEN3_CHAT_TEMPLATE),
        Family::Llama => llama_tokenizer_config(tokenizer_json),
    }
}

/// Llama-3.2-Instruct's tokenizer_config.json: BOS comes from the template (the
/// tokenizer's post-processor would add a second one to text encoded with special
/// tokens), the end of a turn is `<|eot_id|>`.
fn llama_tokenizer_config(tokenizer_json: &[u8]) -> Result<serde_json::Value> {
    Ok(json!({
        "added_tokens_decoder": added_tokens_decoder(tokenizer_json)?,
        "bos_token": "<|begin_of_text|>",
        "chat_template": LLAMA3_CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": true,
        "eos_token": "<|eot_id|>",
        "model_input_names": ["input_ids", "attention_mask"],
        "model_max_length": 131072,
        "tokenizer_class": "PreTrainedTokenizerFast"
    }))
}

/// tokenizer_config.json's `added_tokens_decoder`: tokenizer.json's added tokens by id.
fn added_tokens_decoder(
    tokenizer_json: &[u8],
) -> Result<serde_json::Map<String, serde_json::Value>> {
    let mut decoder = serde_json::Map::new();
    for t in added_tokens(tokenizer_json)? {
        let id = t["id"].as_u64().unwrap_or_default();
        decoder.insert(
            id.to_string(),
            json!({
                "content": t["content"],
                "lstrip": t["lstrip"],
                "normalized": t["normalized"],
                "rstrip": t["rstrip"],
                "single_word": t["single_word"],
                "special": t["special"],
            }),
        );
    }
    Ok(decoder)
}

/// generation_config.json as the family's Instruct checkpoints ship it (stop ids).
pub fn generation_config_json(family: Family) -> serde_json::Value {
    match family {
        Family::Qwen2 | Family::Qwen3 => json!({
            "bos_token_id": ENDOFTEXT_ID,
            "eos_token_id": [IM_END_ID, ENDOFTEXT_ID],
            "pad_token_id": ENDOFTEXT_ID,
            "transformers_version": "4.43.1"
        }),
        Family::Llama => json!({
            "bos_token_id": LLAMA_BOS_ID,
            "eos_token_id": [LLAMA_END_OF_TEXT_ID, LLAMA_EOM_ID, LLAMA_EOT_ID],
            "transformers_version": "4.45.0"
        }),
    }
}

/// config.json in the dialect the family's Hub repos use (transformers 4.x: top-level
/// `rope_theta`, `rope_scaling`, `torch_dtype`).
pub fn config_json(c: &ArchConfig, torch_dtype: &str) -> serde_json::Value {
    let mut j = json!({
        "architectures": [c.family.architecture()],
        "attention_dropout": 0.0,
        "hidden_act": "silu",
        "hidden_size": c.hidden_size,
        "initializer_range": 0.02,
        "intermediate_size": c.intermediate_size,
        "max_position_embeddings": c.max_position_embeddings,
        "model_type": c.family.model_type(),
        "num_attention_heads": c.num_attention_heads,
        "num_hidden_layers": c.num_hidden_layers,
        "num_key_value_heads": c.num_key_value_heads,
        "rms_norm_eps": c.rms_norm_eps,
        "rope_theta": c.rope_theta,
        "tie_word_embeddings": c.tie_word_embeddings,
        "torch_dtype": torch_dtype,
        "use_cache": true,
        "vocab_size": c.vocab_size,
    });
    let extra = match c.family {
        Family::Qwen2 => json!({
            "bos_token_id": ENDOFTEXT_ID,
            "eos_token_id": IM_END_ID,
            "max_window_layers": c.num_hidden_layers,
            "sliding_window": 32768,
            "transformers_version": "4.43.1",
            "use_sliding_window": false,
        }),
        Family::Qwen3 => json!({
            "attention_bias": false,
            "bos_token_id": ENDOFTEXT_ID,
            "eos_token_id": IM_END_ID,
            "head_dim": c.head_dim,
            "max_window_layers": c.num_hidden_layers,
            "rope_scaling": null,
            "sliding_window": null,
            "transformers_version": "4.51.0",
            "use_sliding_window": false,
        }),
        Family::Llama => json!({
            "attention_bias": false,
            "bos_token_id": LLAMA_BOS_ID,
            "eos_token_id": [LLAMA_END_OF_TEXT_ID, LLAMA_EOM_ID, LLAMA_EOT_ID],
            "head_dim": c.head_dim,
            "mlp_bias": false,
            "pretraining_tp": 1,
            "rope_scaling": match &c.rope_scaling {
                Some(RopeScaling::Llama3(s)) => json!({
                    "factor": s.factor,
                    "high_freq_factor": s.high_freq_factor,
                    "low_freq_factor": s.low_freq_factor,
                    "original_max_position_embeddings": s.original_max_position_embeddings,
                    "rope_type": "llama3",
                }),
                _ => serde_json::Value::Null,
            },
            "transformers_version": "4.45.0",
        }),
    };
    if let (Some(j), Some(extra)) = (j.as_object_mut(), extra.as_object()) {
        j.extend(extra.clone());
    }
    j
}

/// tokenizer_config.json as Qwen2.5-Instruct and Qwen3 ship it (added tokens taken from
/// tokenizer.json), with the family's chat template.
fn qwen_tokenizer_config(tokenizer_json: &[u8], template: &str) -> Result<serde_json::Value> {
    let decoder = added_tokens_decoder(tokenizer_json)?;
    Ok(json!({
        "add_bos_token": false,
        "add_prefix_space": false,
        "added_tokens_decoder": decoder,
        "additional_special_tokens": [
            "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
            "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>",
            "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>",
            "<|video_pad|>"
        ],
        "bos_token": null,
        "chat_template": template,
        "clean_up_tokenization_spaces": false,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 131072,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": false,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": null
    }))
}

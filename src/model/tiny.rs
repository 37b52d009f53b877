//! `concord model init-tiny`: a random-weight Qwen2 checkpoint laid out like a Hub model
//! directory (config.json in the transformers 4.x dialect, model.safetensors or shards +
//! index, Qwen's real BPE tokenizer, a Qwen2.5-style ChatML chat template,
//! generation_config.json). Deterministic per seed: the same spec writes the same bytes, so
//! tests rebuild the parity-fixture models instead of committing weights.
use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use serde_json::json;

/// Qwen's byte-level BPE tokenizer (Qwen2.5 vocabulary + 4 later special tokens), gzip'd.
/// Recreate with scripts/fetch_qwen_tokenizer.sh.
static QWEN_TOKENIZER_GZ: &[u8] = include_bytes!("../../assets/qwen_tokenizer.json.gz");

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

/// Storage dtype of a tiny checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TinyDType {
    F32,
    Bf16,
    F16,
}

impl std::str::FromStr for TinyDType {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "f32" | "float32" => Ok(Self::F32),
            "bf16" | "bfloat16" => Ok(Self::Bf16),
            "f16" | "float16" => Ok(Self::F16),
            other => bail!("unknown dtype {other:?} (expected f32, bf16 or f16)"),
        }
    }
}

impl TinyDType {
    fn torch_name(self) -> &'static str {
        match self {
            Self::F32 => "float32",
            Self::Bf16 => "bfloat16",
            Self::F16 => "float16",
        }
    }
    fn bytes(self) -> u64 {
        match self {
            Self::F32 => 4,
            Self::Bf16 | Self::F16 => 2,
        }
    }
    fn st_dtype(self) -> safetensors::Dtype {
        match self {
            Self::F32 => safetensors::Dtype::F32,
            Self::Bf16 => safetensors::Dtype::BF16,
            Self::F16 => safetensors::Dtype::F16,
        }
    }
}

/// Shape and seed of a tiny checkpoint. `Default` is the small test shape; `qwen25_0_5b`
/// the benchmark shape.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct TinySpec {
    pub hidden: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub intermediate: usize,
    pub vocab: usize,
    pub seed: u64,
    pub dtype: TinyDType,
    pub tie: bool,
    pub shards: usize,
}

impl Default for TinySpec {
    fn default() -> Self {
        Self {
            hidden: 64,
            layers: 2,
            heads: 4,
            kv_heads: 2,
            intermediate: 128,
            vocab: 151_936,
            seed: 0,
            dtype: TinyDType::F32,
            tie: true,
            shards: 1,
        }
    }
}

impl TinySpec {
    /// Qwen2.5-0.5B's shape (hidden 896, 24 layers, 14/2 heads, MLP 4864, vocab 151,936).
    pub fn qwen25_0_5b() -> Self {
        Self {
            hidden: 896,
            layers: 24,
            heads: 14,
            kv_heads: 2,
            intermediate: 4864,
            ..Self::default()
        }
    }

    pub fn head_dim(&self) -> usize {
        self.hidden / self.heads.max(1)
    }

    pub fn validate(&self) -> Result<()> {
        if self.hidden == 0 || self.layers == 0 || self.heads == 0 || self.kv_heads == 0 {
            bail!("hidden, layers, heads and kv-heads must be positive");
        }
        if self.intermediate == 0 {
            bail!("intermediate must be positive");
        }
        if !self.hidden.is_multiple_of(self.heads) {
            bail!(
                "hidden ({}) must be a multiple of heads ({})",
                self.hidden,
                self.heads
            );
        }
        if !self.heads.is_multiple_of(self.kv_heads) {
            bail!(
                "heads ({}) must be a multiple of kv-heads ({})",
                self.heads,
                self.kv_heads
            );
        }
        if !self.head_dim().is_multiple_of(2) {
            bail!("head dim {} must be even for RoPE", self.head_dim());
        }
        if self.vocab < TOKENIZER_IDS {
            bail!(
                "vocab {} is smaller than the tokenizer's {} ids",
                self.vocab,
                TOKENIZER_IDS
            );
        }
        if self.shards == 0 {
            bail!("shards must be at least 1");
        }
        let cfg = self.qwen2_config();
        cfg.validate()?;
        // The weights are drawn in memory before they are written.
        let bytes = cfg.parameters() * self.dtype.bytes();
        if let Some(avail) = crate::sys::available_memory_bytes() {
            if bytes > avail / 2 {
                bail!(
                    "this shape has {} parameters ({:.1} GB), more than half the {:.1} GB of \
                     memory available",
                    cfg.parameters(),
                    bytes as f64 / 1e9,
                    avail as f64 / 1e9
                );
            }
        }
        Ok(())
    }

    /// The architecture this spec writes into config.json.
    pub fn qwen2_config(&self) -> crate::model::qwen2::Qwen2Config {
        crate::model::qwen2::Qwen2Config {
            vocab_size: self.vocab,
            hidden_size: self.hidden,
            intermediate_size: self.intermediate,
            num_hidden_layers: self.layers,
            num_attention_heads: self.heads,
            num_key_value_heads: self.kv_heads,
            head_dim: self.head_dim(),
            max_position_embeddings: 32768,
            rope_theta: 1_000_000.0,
            rms_norm_eps: 1e-6,
            tie_word_embeddings: self.tie,
        }
    }

    /// config.json in the transformers 4.x dialect (as Qwen's Hub repos write it).
    pub fn config_json(&self) -> serde_json::Value {
        json!({
            "architectures": ["Qwen2ForCausalLM"],
            "attention_dropout": 0.0,
            "bos_token_id": ENDOFTEXT_ID,
            "eos_token_id": IM_END_ID,
            "hidden_act": "silu",
            "hidden_size": self.hidden,
            "initializer_range": 0.02,
            "intermediate_size": self.intermediate,
            "max_position_embeddings": 32768,
            "max_window_layers": self.layers,
            "model_type": "qwen2",
            "num_attention_heads": self.heads,
            "num_hidden_layers": self.layers,
            "num_key_value_heads": self.kv_heads,
            "rms_norm_eps": 1e-6,
            "rope_theta": 1000000.0,
            "sliding_window": 32768,
            "tie_word_embeddings": self.tie,
            "torch_dtype": self.dtype.torch_name(),
            "transformers_version": "4.43.1",
            "use_cache": true,
            "use_sliding_window": false,
            "vocab_size": self.vocab,
        })
    }

    /// (name, shape) of every tensor the checkpoint holds, in a fixed order.
    pub fn tensor_shapes(&self) -> Vec<(String, Vec<usize>)> {
        let (h, hd, i) = (self.hidden, self.head_dim(), self.intermediate);
        let (q, kv) = (self.heads * hd, self.kv_heads * hd);
        let mut out = vec![("model.embed_tokens.weight".to_string(), vec![self.vocab, h])];
        for l in 0..self.layers {
            let p = format!("model.layers.{l}");
            out.extend([
                (format!("{p}.input_layernorm.weight"), vec![h]),
                (format!("{p}.self_attn.q_proj.weight"), vec![q, h]),
                (format!("{p}.self_attn.q_proj.bias"), vec![q]),
                (format!("{p}.self_attn.k_proj.weight"), vec![kv, h]),
                (format!("{p}.self_attn.k_proj.bias"), vec![kv]),
                (format!("{p}.self_attn.v_proj.weight"), vec![kv, h]),
                (format!("{p}.self_attn.v_proj.bias"), vec![kv]),
                (format!("{p}.self_attn.o_proj.weight"), vec![h, q]),
                (format!("{p}.post_attention_layernorm.weight"), vec![h]),
                (format!("{p}.mlp.gate_proj.weight"), vec![i, h]),
                (format!("{p}.mlp.up_proj.weight"), vec![i, h]),
                (format!("{p}.mlp.down_proj.weight"), vec![h, i]),
            ]);
        }
        out.push(("model.norm.weight".to_string(), vec![h]));
        if !self.tie {
            out.push(("lm_head.weight".to_string(), vec![self.vocab, h]));
        }
        out
    }
}

/// Deterministic random values for one tensor: its own ChaCha stream, seeded from the spec
/// seed and the tensor name, uniform in a range chosen so every part of the network matters
/// (the parity tests must see a wrong attention or norm): linear weights and biases
/// U(±1/sqrt(fan_in)) like torch's nn.Linear, norm weights U(0.5, 1.5), embeddings with
/// std 4/sqrt(hidden) (tied logits have std ≈ 4), an untied head with std 2/sqrt(hidden).
pub fn tensor_values(spec: &TinySpec, name: &str, shape: &[usize]) -> Vec<f32> {
    let n: usize = shape.iter().product();
    let mut rng = ChaCha8Rng::seed_from_u64(spec.seed ^ fnv1a(name.as_bytes()));
    let sqrt3 = 3f32.sqrt();
    let hidden = spec.hidden as f32;
    let (lo, hi) = if name.ends_with("layernorm.weight") || name == "model.norm.weight" {
        (0.5, 1.5)
    } else if name == "model.embed_tokens.weight" {
        let a = sqrt3 * 4.0 / hidden.sqrt();
        (-a, a)
    } else if name == "lm_head.weight" {
        let a = sqrt3 * 2.0 / hidden.sqrt();
        (-a, a)
    } else {
        // Linear weight [out, in], or the bias of a q/k/v projection (input = hidden).
        let fan_in = if shape.len() == 2 {
            shape[1]
        } else {
            spec.hidden
        };
        let a = 1.0 / (fan_in as f32).sqrt();
        (-a, a)
    };
    (0..n).map(|_| lo + (hi - lo) * rng.gen::<f32>()).collect()
}

fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

fn to_bytes(values: &[f32], dtype: TinyDType) -> Vec<u8> {
    match dtype {
        TinyDType::F32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        TinyDType::Bf16 => values
            .iter()
            .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes())
            .collect(),
        TinyDType::F16 => values
            .iter()
            .flat_map(|v| half::f16::from_f32(*v).to_le_bytes())
            .collect(),
    }
}

/// The embedded tokenizer.json, decompressed.
pub fn qwen_tokenizer_json() -> Result<Vec<u8>> {
    let mut out = Vec::with_capacity(12 << 20);
    flate2::read::GzDecoder::new(QWEN_TOKENIZER_GZ)
        .read_to_end(&mut out)
        .context("decompressing the embedded Qwen tokenizer")?;
    Ok(out)
}

/// tokenizer_config.json as Qwen2.5-Instruct ships it (added tokens taken from tokenizer.json).
pub fn tokenizer_config_json(tokenizer_json: &[u8]) -> Result<serde_json::Value> {
    let tok: serde_json::Value =
        serde_json::from_slice(tokenizer_json).context("parsing the embedded tokenizer.json")?;
    let mut decoder = serde_json::Map::new();
    for t in tok["added_tokens"].as_array().into_iter().flatten() {
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
        "chat_template": QWEN25_CHAT_TEMPLATE,
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

pub fn generation_config_json() -> serde_json::Value {
    json!({
        "bos_token_id": ENDOFTEXT_ID,
        "eos_token_id": [IM_END_ID, ENDOFTEXT_ID],
        "pad_token_id": ENDOFTEXT_ID,
        "transformers_version": "4.43.1"
    })
}

/// Write `bytes` to `dir/name` atomically; returns the path written.
fn write_atomic(dir: &Path, name: &str, bytes: &[u8]) -> Result<PathBuf> {
    let path = dir.join(name);
    crate::atomic::atomic_write_bytes(&path, bytes)?;
    Ok(path)
}

fn json_bytes(v: &serde_json::Value) -> Result<Vec<u8>> {
    let mut s = serde_json::to_string_pretty(v)?;
    s.push('\n');
    Ok(s.into_bytes())
}

/// Write the checkpoint into `out` (created if needed). Returns the files written.
pub fn init_tiny(spec: &TinySpec, out: &Path) -> Result<Vec<PathBuf>> {
    spec.validate()?;
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let mut written = Vec::new();

    written.push(write_atomic(
        out,
        "config.json",
        &json_bytes(&spec.config_json())?,
    )?);
    let tok = qwen_tokenizer_json()?;
    written.push(write_atomic(out, "tokenizer.json", &tok)?);
    written.push(write_atomic(
        out,
        "tokenizer_config.json",
        &json_bytes(&tokenizer_config_json(&tok)?)?,
    )?);
    written.push(write_atomic(
        out,
        "generation_config.json",
        &json_bytes(&generation_config_json())?,
    )?);

    // Weights: tensors split into `shards` contiguous groups of (about) equal count.
    let shapes = spec.tensor_shapes();
    let n_shards = spec.shards.min(shapes.len());
    let n_tensors = shapes.len();
    let mut groups: Vec<Vec<(String, Vec<usize>)>> = vec![Vec::new(); n_shards];
    for (k, t) in shapes.into_iter().enumerate() {
        groups[k * n_shards / n_tensors].push(t);
    }
    let n_files = groups.len();
    let mut weight_map = BTreeMap::new();
    let mut total_size = 0usize;
    for (k, group) in groups.iter().enumerate() {
        let file = if n_files == 1 {
            "model.safetensors".to_string()
        } else {
            format!("model-{:05}-of-{:05}.safetensors", k + 1, n_files)
        };
        let data: Vec<(String, Vec<usize>, Vec<u8>)> = group
            .iter()
            .map(|(name, shape)| {
                let v = tensor_values(spec, name, shape);
                (name.clone(), shape.clone(), to_bytes(&v, spec.dtype))
            })
            .collect();
        let mut views = Vec::with_capacity(data.len());
        for (name, shape, bytes) in &data {
            total_size += bytes.len();
            weight_map.insert(name.clone(), file.clone());
            let view =
                safetensors::tensor::TensorView::new(spec.dtype.st_dtype(), shape.clone(), bytes)
                    .map_err(|e| anyhow::anyhow!("tensor {name}: {e:?}"))?;
            views.push((name.clone(), view));
        }
        let meta = std::collections::HashMap::from([("format".to_string(), "pt".to_string())]);
        let bytes = safetensors::tensor::serialize(views, &Some(meta))
            .map_err(|e| anyhow::anyhow!("serialising {file}: {e:?}"))?;
        written.push(write_atomic(out, &file, &bytes)?);
    }
    if n_files > 1 {
        let index = json!({
            "metadata": {"total_size": total_size},
            "weight_map": weight_map,
        });
        written.push(write_atomic(
            out,
            "model.safetensors.index.json",
            &json_bytes(&index)?,
        )?);
    }
    Ok(written)
}

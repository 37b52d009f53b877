//! Safetensors checkpoints: local directories and Hub ids (GGUF files are
//! [`super::gguf`]; [`super::load`] chooses between them).
//!
//! A [`ModelRef`] is a local directory or a Hub id (`Qwen/Qwen2.5-0.5B-Instruct`, optional
//! `@revision`). Hub files go through hf-hub into the standard Hugging Face cache
//! (`HF_HOME`, `HF_HUB_CACHE`, `HF_TOKEN`, `HF_HUB_OFFLINE` honoured; offline never touches
//! the network). config.json is read in both dialects (transformers 4.x and 5.x) into
//! [`Qwen2Config`]; weights come from model.safetensors or a sharded index, are checked
//! against the config (missing and mis-shaped tensors are named) and converted to the
//! target dtype on the target device.
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use candle_core::{DType, Device};
use serde_json::Value as Json;

use super::generation::{id_list, GenerationConfig};
use super::qwen2::Qwen2Config;
use super::tokenizer::Tokenizer;

pub use super::qwen2::Weights;

pub const ARCHITECTURE: &str = "Qwen2ForCausalLM";

// ---------------------------------------------------------------------------------------
// Model references
// ---------------------------------------------------------------------------------------

/// Where a checkpoint lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelRef {
    /// A local directory laid out like a Hub repo.
    Local(PathBuf),
    /// A Hub repo id with an optional revision (branch, tag or commit).
    Hub {
        repo_id: String,
        revision: Option<String>,
    },
}

impl ModelRef {
    /// An existing directory or a `.gguf` file is local; `owner/name[@rev]` is a Hub id;
    /// anything that looks like a path (`/`, `.`, `~` prefix, or more than one `/`) is a
    /// local directory.
    pub fn parse(s: &str) -> Result<Self> {
        let s = s.trim();
        if s.is_empty() {
            bail!("empty model reference");
        }
        let p = Path::new(s);
        if p.is_dir() || is_gguf_path(p) {
            return Ok(Self::Local(p.to_path_buf()));
        }
        let looks_like_path = s.starts_with('/')
            || s.starts_with('.')
            || s.starts_with('~')
            || s.contains('\\')
            || s.matches('/').count() > 1;
        if looks_like_path {
            return Ok(Self::Local(p.to_path_buf()));
        }
        let (repo_id, revision) = match s.split_once('@') {
            Some((id, rev)) if !rev.is_empty() => (id, Some(rev.to_string())),
            Some(_) => bail!("model reference {s:?}: empty revision after '@'"),
            None => (s, None),
        };
        let valid = |part: &str| {
            !part.is_empty()
                && part
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        };
        match repo_id.split_once('/') {
            Some((owner, name)) if valid(owner) && valid(name) => Ok(Self::Hub {
                repo_id: repo_id.to_string(),
                revision,
            }),
            _ => bail!(
                "model reference {s:?} is neither an existing directory nor a Hub id \
                 like Qwen/Qwen2.5-0.5B-Instruct[@revision]"
            ),
        }
    }
}

impl std::str::FromStr for ModelRef {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        Self::parse(s)
    }
}

impl std::fmt::Display for ModelRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Local(p) => write!(f, "{}", p.display()),
            Self::Hub {
                repo_id,
                revision: Some(r),
            } => write!(f, "{repo_id}@{r}"),
            Self::Hub { repo_id, .. } => write!(f, "{repo_id}"),
        }
    }
}

/// The files of one checkpoint, on local disk.
#[derive(Debug, Clone)]
pub struct ModelFiles {
    pub dir: PathBuf,
    pub config: PathBuf,
    /// model.safetensors, or the shards named by model.safetensors.index.json (in order).
    pub weights: Vec<PathBuf>,
    pub tokenizer: PathBuf,
    pub tokenizer_config: Option<PathBuf>,
    pub chat_template: Option<PathBuf>,
    pub generation_config: Option<PathBuf>,
}

const SINGLE: &str = "model.safetensors";
const INDEX: &str = "model.safetensors.index.json";
const OPTIONAL: [&str; 3] = [
    "tokenizer_config.json",
    "chat_template.jinja",
    "generation_config.json",
];

/// Find (and for Hub ids, download or look up in the cache) every file of a checkpoint.
pub fn resolve(model: &ModelRef) -> Result<ModelFiles> {
    match model {
        ModelRef::Local(dir) => resolve_dir(dir),
        ModelRef::Hub { repo_id, revision } => resolve_hub(repo_id, revision.as_deref()),
    }
}

/// The files of a checkpoint directory; a missing required file is named in the error.
pub fn resolve_dir(dir: &Path) -> Result<ModelFiles> {
    if !dir.is_dir() {
        bail!("model directory {} does not exist", dir.display());
    }
    let need = |name: &str| -> Result<PathBuf> {
        let p = dir.join(name);
        if p.is_file() {
            Ok(p)
        } else {
            bail!("missing file {name} in model directory {}", dir.display())
        }
    };
    let opt = |name: &str| {
        let p = dir.join(name);
        p.is_file().then_some(p)
    };
    let config = need("config.json")?;
    let weights = if dir.join(SINGLE).is_file() {
        vec![dir.join(SINGLE)]
    } else if dir.join(INDEX).is_file() {
        shard_names(&dir.join(INDEX))?
            .into_iter()
            .map(|s| need(&s))
            .collect::<Result<Vec<_>>>()?
    } else {
        bail!(
            "missing file {SINGLE} (or the sharded {INDEX}) in model directory {}",
            dir.display()
        )
    };
    Ok(ModelFiles {
        dir: dir.to_path_buf(),
        config,
        weights,
        tokenizer: need("tokenizer.json")?,
        tokenizer_config: opt(OPTIONAL[0]),
        chat_template: opt(OPTIONAL[1]),
        generation_config: opt(OPTIONAL[2]),
    })
}

/// Shard file names of a model.safetensors.index.json, unique, in first-seen order.
pub fn shard_names(index: &Path) -> Result<Vec<String>> {
    let text =
        std::fs::read_to_string(index).with_context(|| format!("reading {}", index.display()))?;
    let json: Json =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", index.display()))?;
    let map = json["weight_map"]
        .as_object()
        .ok_or_else(|| anyhow!("{}: no weight_map object", index.display()))?;
    let mut names: Vec<String> = Vec::new();
    for v in map.values() {
        let s = v
            .as_str()
            .ok_or_else(|| anyhow!("{}: weight_map values must be strings", index.display()))?;
        if s.contains('/') || s.contains('\\') || s.starts_with('.') {
            bail!("{}: unexpected shard name {s:?}", index.display());
        }
        if !names.iter().any(|n| n == s) {
            names.push(s.to_string());
        }
    }
    names.sort();
    Ok(names)
}

/// True when HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) is 1/true/yes/on.
pub fn hub_offline() -> bool {
    ["HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"].iter().any(|k| {
        std::env::var(k)
            .map(|v| {
                matches!(
                    v.trim().to_ascii_lowercase().as_str(),
                    "1" | "true" | "yes" | "on"
                )
            })
            .unwrap_or(false)
    })
}

/// The hub cache: HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub.
pub fn hub_cache() -> hf_hub::Cache {
    match std::env::var("HF_HUB_CACHE") {
        Ok(p) if !p.is_empty() => hf_hub::Cache::new(PathBuf::from(p)),
        _ => hf_hub::Cache::from_env(),
    }
}

/// Snapshot directory of a cached repo at `revision`, without any network access.
pub fn cached_snapshot(cache: &hf_hub::Cache, repo_id: &str, revision: &str) -> Option<PathBuf> {
    let repo_dir = cache
        .path()
        .join(format!("models--{}", repo_id.replace('/', "--")));
    let commit = std::fs::read_to_string(repo_dir.join("refs").join(revision))
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| revision.to_string());
    let snap = repo_dir.join("snapshots").join(commit);
    snap.is_dir().then_some(snap)
}

fn resolve_hub(repo_id: &str, revision: Option<&str>) -> Result<ModelFiles> {
    let rev = revision.unwrap_or("main");
    let cache = hub_cache();
    let offline_dir = |why: &str| -> Result<ModelFiles> {
        let Some(snap) = cached_snapshot(&cache, repo_id, rev) else {
            bail!(
                "{why}: {repo_id}@{rev} is not in the Hugging Face cache {} \
                 (download it once with network access, or pass a local directory)",
                cache.path().display()
            )
        };
        resolve_dir(&snap).map_err(|e| {
            anyhow!("{why}: the cached snapshot of {repo_id}@{rev} is incomplete: {e:#}")
        })
    };
    if hub_offline() {
        return offline_dir("HF_HUB_OFFLINE is set");
    }
    let token = std::env::var("HF_TOKEN")
        .ok()
        .filter(|t| !t.trim().is_empty())
        .or_else(|| cache.token());
    let api = hf_hub::api::sync::ApiBuilder::from_cache(cache.clone())
        .with_token(token)
        .with_progress(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_endpoint(
            std::env::var("HF_ENDPOINT").unwrap_or_else(|_| "https://huggingface.co".into()),
        )
        .build()
        .context("building the Hugging Face Hub client")?;
    let repo = api.repo(hf_hub::Repo::with_revision(
        repo_id.to_string(),
        hf_hub::RepoType::Model,
        rev.to_string(),
    ));
    let info = match repo.info() {
        Ok(info) => info,
        Err(e) => {
            // Like transformers: fall back to the cache when the Hub is unreachable.
            return offline_dir(&format!("cannot reach the Hub for {repo_id}@{rev} ({e})"));
        }
    };
    let listed: Vec<&str> = info.siblings.iter().map(|s| s.rfilename.as_str()).collect();
    let get = |name: &str| -> Result<PathBuf> {
        repo.get(name)
            .with_context(|| format!("downloading {name} from {repo_id}@{rev}"))
    };
    let mut wanted: Vec<String> = vec!["config.json".into(), "tokenizer.json".into()];
    if listed.contains(&SINGLE) {
        wanted.push(SINGLE.into());
    } else if listed.contains(&INDEX) {
        let index = get(INDEX)?;
        wanted.extend(shard_names(&index)?);
    } else {
        bail!("missing file {SINGLE} (or the sharded {INDEX}) in Hub repo {repo_id}@{rev}");
    }
    for name in ["config.json", "tokenizer.json"] {
        if !listed.contains(&name) {
            bail!("missing file {name} in Hub repo {repo_id}@{rev}");
        }
    }
    wanted.extend(
        OPTIONAL
            .iter()
            .filter(|n| listed.contains(n))
            .map(|n| n.to_string()),
    );
    let mut dir = None;
    for name in &wanted {
        let p = get(name)?;
        dir.get_or_insert_with(|| p.parent().map(Path::to_path_buf).unwrap_or_default());
    }
    let dir = dir.ok_or_else(|| anyhow!("nothing downloaded for {repo_id}@{rev}"))?;
    resolve_dir(&dir)
}

// ---------------------------------------------------------------------------------------
// config.json
// ---------------------------------------------------------------------------------------

/// config.json beyond the architecture numbers.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckpointConfig {
    pub qwen2: Qwen2Config,
    pub architectures: Vec<String>,
    /// `torch_dtype` (4.x) or `dtype` (5.x): the stored weights' dtype.
    pub stored_dtype: Option<String>,
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
}

fn get_usize(j: &Json, key: &str) -> Result<Option<usize>> {
    match &j[key] {
        Json::Null => Ok(None),
        v => v
            .as_u64()
            .map(|x| Some(x as usize))
            .ok_or_else(|| anyhow!("config.json: {key} must be a non-negative integer, got {v}")),
    }
}

fn need_usize(j: &Json, key: &str) -> Result<usize> {
    get_usize(j, key)?.ok_or_else(|| anyhow!("config.json: missing {key}"))
}

/// Parse config.json (transformers 4.x or 5.x dialect) of a Qwen2ForCausalLM.
pub fn parse_config(text: &str) -> Result<CheckpointConfig> {
    let j: Json = serde_json::from_str(text).context("config.json is not valid JSON")?;
    let architectures: Vec<String> = j["architectures"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default();
    let model_type = j["model_type"].as_str().unwrap_or("");
    let ok = if architectures.is_empty() {
        model_type == "qwen2"
    } else {
        architectures.iter().any(|a| a == ARCHITECTURE)
    };
    if !ok {
        let got = if architectures.is_empty() {
            format!("model_type {model_type:?}")
        } else {
            format!("{architectures:?}")
        };
        bail!("unsupported architecture {got}: Concord loads {ARCHITECTURE} checkpoints only");
    }
    if let Some(act) = j["hidden_act"].as_str() {
        if act != "silu" {
            bail!("config.json: hidden_act {act:?} is not supported (Qwen2 uses silu)");
        }
    }
    // RoPE: 4.x top-level rope_theta (+ rope_scaling), 5.x rope_parameters.
    let rope = &j["rope_parameters"];
    let rope_theta = rope["rope_theta"]
        .as_f64()
        .or_else(|| j["rope_theta"].as_f64())
        .unwrap_or(10_000.0);
    let rope_type = rope["rope_type"]
        .as_str()
        .or_else(|| j["rope_scaling"]["rope_type"].as_str())
        .or_else(|| j["rope_scaling"]["type"].as_str())
        .unwrap_or("default");
    if rope_type != "default" {
        bail!("config.json: rope type {rope_type:?} is not supported (only default RoPE)");
    }
    let sliding = j["use_sliding_window"].as_bool().unwrap_or(false)
        || j["layer_types"]
            .as_array()
            .is_some_and(|a| a.iter().any(|t| t.as_str() == Some("sliding_attention")));
    if sliding {
        bail!("config.json: sliding-window attention is not supported");
    }
    let hidden_size = need_usize(&j, "hidden_size")?;
    let num_attention_heads = need_usize(&j, "num_attention_heads")?;
    if num_attention_heads == 0 {
        bail!("config.json: num_attention_heads must be positive");
    }
    let num_key_value_heads = get_usize(&j, "num_key_value_heads")?.unwrap_or(num_attention_heads);
    if num_key_value_heads == 0 || num_attention_heads % num_key_value_heads != 0 {
        bail!(
            "config.json: num_attention_heads ({num_attention_heads}) must be a multiple of \
             num_key_value_heads ({num_key_value_heads})"
        );
    }
    let head_dim = get_usize(&j, "head_dim")?.unwrap_or(hidden_size / num_attention_heads);
    let qwen2 = Qwen2Config {
        vocab_size: need_usize(&j, "vocab_size")?,
        hidden_size,
        intermediate_size: need_usize(&j, "intermediate_size")?,
        num_hidden_layers: need_usize(&j, "num_hidden_layers")?,
        num_attention_heads,
        num_key_value_heads,
        head_dim,
        max_position_embeddings: get_usize(&j, "max_position_embeddings")?.unwrap_or(32_768),
        rope_theta,
        rms_norm_eps: j["rms_norm_eps"].as_f64().unwrap_or(1e-6),
        tie_word_embeddings: j["tie_word_embeddings"].as_bool().unwrap_or(false),
    };
    let eps = qwen2.rms_norm_eps;
    if !(eps > 0.0 && eps.is_finite()) {
        bail!("config.json: rms_norm_eps must be a positive number, got {eps}");
    }
    if !(qwen2.rope_theta > 0.0 && qwen2.rope_theta.is_finite()) {
        bail!(
            "config.json: rope_theta must be a positive number, got {}",
            qwen2.rope_theta
        );
    }
    if qwen2.max_position_embeddings == 0 {
        bail!("config.json: max_position_embeddings must be positive");
    }
    qwen2.validate().context("config.json")?;
    let stored_dtype = j["dtype"]
        .as_str()
        .or_else(|| j["torch_dtype"].as_str())
        .map(String::from);
    Ok(CheckpointConfig {
        qwen2,
        architectures,
        stored_dtype,
        bos_token_id: j["bos_token_id"].as_u64().map(|x| x as u32),
        eos_token_ids: id_list(&j["eos_token_id"]),
    })
}

/// Read and parse a config.json file.
pub fn read_config(path: &Path) -> Result<CheckpointConfig> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    parse_config(&text).with_context(|| format!("in {}", path.display()))
}

// ---------------------------------------------------------------------------------------
// dtype policy and weights
// ---------------------------------------------------------------------------------------

/// f32 on CPU, bf16 on CUDA sm_80+ (Ampere and newer), f16 on older CUDA devices.
pub fn default_dtype(device: &Device) -> DType {
    match device {
        Device::Cpu => DType::F32,
        #[cfg(feature = "cuda")]
        Device::Cuda(dev) => {
            if cuda_compute_major(dev) >= 8 {
                DType::BF16
            } else {
                DType::F16
            }
        }
        #[allow(unreachable_patterns)]
        _ => DType::F32,
    }
}

#[cfg(feature = "cuda")]
fn cuda_compute_major(dev: &candle_core::CudaDevice) -> i32 {
    use candle_core::cuda::cudarc::driver::{result, sys};
    let cu_device = dev.cuda_stream().context().cu_device();
    // SAFETY: a plain attribute query on a valid device handle.
    unsafe {
        result::device::get_attribute(
            cu_device,
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
        )
    }
    .unwrap_or(8)
}

/// bf16 kernels need compute capability 8.0 (Ampere) or newer: refuse it on older cards
/// (a T4 is sm_75) with advice, instead of failing inside a kernel launch.
pub fn check_dtype_supported(dtype: DType, device: &Device) -> Result<()> {
    #[cfg(feature = "cuda")]
    if let (DType::BF16, Device::Cuda(dev)) = (dtype, device) {
        let major = cuda_compute_major(dev);
        if major < 8 {
            bail!(
                "bf16 needs a GPU of compute capability 8.0 or newer (A100, H100, RTX 30xx); \
                 this one is sm_{major}x: use dtype = \"f16\" (or \"f32\")"
            );
        }
    }
    let _ = (dtype, device);
    Ok(())
}

/// `f32` / `bf16` / `f16` (torch spellings accepted); `auto` → [`default_dtype`].
pub fn parse_dtype(s: &str, device: &Device) -> Result<DType> {
    match s.trim().to_ascii_lowercase().as_str() {
        "auto" | "" => Ok(default_dtype(device)),
        "f32" | "float32" | "fp32" => Ok(DType::F32),
        "bf16" | "bfloat16" => Ok(DType::BF16),
        "f16" | "float16" | "fp16" | "half" => Ok(DType::F16),
        other => bail!("unknown dtype {other:?} (expected auto, f32, bf16 or f16)"),
    }
}

/// (name, shape) of every tensor a Qwen2 checkpoint must hold (without `lm_head.weight`).
pub fn expected_shapes(cfg: &Qwen2Config) -> Vec<(String, Vec<usize>)> {
    // The model's own list, without the optional untied head.
    let tied = Qwen2Config {
        tie_word_embeddings: true,
        ..cfg.clone()
    };
    tied.tensor_shapes()
}

/// Load, check and convert the weights. Sets `cfg.tie_word_embeddings` when the checkpoint
/// has no `lm_head.weight`; drops a stored `lm_head.weight` when the config ties it (as
/// transformers does). Extra tensors (e.g. rotary caches) are ignored.
pub fn load_weights(
    files: &[PathBuf],
    cfg: &mut Qwen2Config,
    dtype: DType,
    device: &Device,
) -> Result<Weights> {
    if files.is_empty() {
        bail!("no weight files");
    }
    // SAFETY: the files are memory-mapped read-only; like every safetensors loader we
    // assume they are not modified while mapped.
    let st = unsafe { candle_core::safetensors::MmapedSafetensors::multi(files) }
        .with_context(|| format!("opening {}", display_files(files)))?;
    let mut wanted = expected_shapes(cfg);
    let has_head = st.get("lm_head.weight").is_ok();
    if !has_head {
        cfg.tie_word_embeddings = true;
    }
    if has_head && !cfg.tie_word_embeddings {
        wanted.push((
            "lm_head.weight".to_string(),
            vec![cfg.vocab_size, cfg.hidden_size],
        ));
    }
    // Check every name and shape before loading anything.
    for (name, shape) in &wanted {
        let view = st.get(name).map_err(|_| {
            anyhow!(
                "checkpoint is missing tensor {name} (in {})",
                display_files(files)
            )
        })?;
        if view.shape() != shape.as_slice() {
            bail!(
                "tensor {name} has shape {:?}, expected {:?} from config.json",
                view.shape(),
                shape
            );
        }
    }
    let mut out = Weights::with_capacity(wanted.len());
    for (name, _) in wanted {
        let t = st
            .load(&name, device)
            .with_context(|| format!("loading tensor {name}"))?;
        let t = if t.dtype() == dtype {
            t
        } else {
            t.to_dtype(dtype)?
        };
        ensure_finite(&name, &t).with_context(|| display_files(files))?;
        out.insert(name, t);
    }
    Ok(out)
}

/// A base weight holding NaN or an infinity would turn every forward into NaN and the
/// run into skipped steps; refuse it at load, by name. `t - t` is 0 where `t` is finite
/// and NaN where it is not, so one sum says which.
pub fn ensure_finite(name: &str, t: &candle_core::Tensor) -> Result<()> {
    let s = t
        .sub(t)?
        .to_dtype(DType::F32)?
        .sum_all()?
        .to_scalar::<f32>()?;
    if s.is_nan() {
        bail!(
            "tensor {name} holds NaN or infinite values: the checkpoint is damaged or was \
             saved from a diverged run"
        );
    }
    Ok(())
}

/// Whether config.json sets `tie_word_embeddings` to false explicitly (absent means
/// "tie when the weights have no head", as before).
fn says_untied(config: &Path) -> bool {
    std::fs::read_to_string(config)
        .ok()
        .and_then(|t| serde_json::from_str::<Json>(&t).ok())
        .is_some_and(|j| j["tie_word_embeddings"] == Json::Bool(false))
}

fn display_files(files: &[PathBuf]) -> String {
    files
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

// ---------------------------------------------------------------------------------------
// Whole checkpoints
// ---------------------------------------------------------------------------------------

/// Everything a checkpoint holds, before the model is built.
pub struct Checkpoint {
    pub config: Qwen2Config,
    pub info: CheckpointConfig,
    pub weights: Weights,
    pub tokenizer: Tokenizer,
    pub generation_config: GenerationConfig,
    pub files: ModelFiles,
    pub dtype: DType,
}

/// Resolve, read and check a safetensors checkpoint. `dtype` None → [`default_dtype`]
/// of `device`.
pub fn load_safetensors(
    model: &ModelRef,
    dtype: Option<DType>,
    device: &Device,
) -> Result<Checkpoint> {
    let files = resolve(model)?;
    let info = read_config(&files.config)?;
    let generation_config = match &files.generation_config {
        Some(p) => GenerationConfig::from_file(p)?,
        None => GenerationConfig::default(),
    };
    let mut eos = generation_config.eos_token_ids.clone();
    if eos.is_empty() {
        eos = info.eos_token_ids.clone();
    }
    let tokenizer = Tokenizer::from_files(
        &files.tokenizer,
        files.tokenizer_config.as_deref(),
        files.chat_template.as_deref(),
        &eos,
    )?;
    let mut config = info.qwen2.clone();
    if tokenizer.vocab_size() > config.vocab_size {
        bail!(
            "the tokenizer has {} ids but the model's vocab_size is {}",
            tokenizer.vocab_size(),
            config.vocab_size
        );
    }
    let dtype = dtype.unwrap_or_else(|| default_dtype(device));
    check_dtype_supported(dtype, device)?;
    let weights = load_weights(&files.weights, &mut config, dtype, device)?;
    if config.tie_word_embeddings && !info.qwen2.tie_word_embeddings && says_untied(&files.config) {
        // Tying is what this loader has always done here (tests/load_checkpoint.rs pins
        // it); transformers would leave a random head. Never silently.
        crate::note!(
            "warning: {} says tie_word_embeddings = false but the weights ({}) have no \
             lm_head.weight: the LM head is tied to the input embeddings",
            files.config.display(),
            display_files(&files.weights)
        );
    }
    Ok(Checkpoint {
        config,
        info,
        weights,
        tokenizer,
        generation_config,
        files,
        dtype,
    })
}

/// A path naming a `.gguf` file (by its extension).
pub fn is_gguf_path(path: &Path) -> bool {
    path.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
}

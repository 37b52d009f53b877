//! Safetensors checkpoints: local directories and Hub ids (GGUF files are
//! [`super::gguf`]; [`super::load`] chooses between them).
//!
//! A [`ModelRef`] is a local directory or a Hub id (`Qwen/Qwen2.5-0.5B-Instruct`, optional
//! `@revision`). Hub files go through hf-hub into the standard Hugging Face cache
//! (`HF_HOME`, `HF_HUB_CACHE`, `HF_TOKEN`, `HF_HUB_OFFLINE` honoured; offline never touches
//! the network). config.json is read in both dialects (transformers 4.x and 5.x) into
//! [`ArchConfig`]; weights come from model.safetensors or a sharded index, are checked
//! against the config (missing and mis-shaped tensors are named) and converted to the
//! target dtype on the target device.
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use candle_core::{DType, Device};
use serde_json::Value as Json;

use super::arch::ArchConfig;
use super::generation::GenerationConfig;
use super::tokenizer::Tokenizer;

pub use super::Weights;

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

mod config;
mod weights;
pub use config::*;
pub use weights::*;
use weights::{display_files, says_untied};

// ---------------------------------------------------------------------------------------
// Whole checkpoints
// ---------------------------------------------------------------------------------------

/// Everything a checkpoint holds, before the model is built.
pub struct Checkpoint {
    pub config: ArchConfig,
    pub info: CheckpointConfig,
    pub weights: Weights,
    /// A quantized base's projections and LM head (empty for a dense one).
    pub quant: crate::model::quant::QuantWeights,
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
    let mut config = info.arch.clone();
    if tokenizer.vocab_size() > config.vocab_size {
        bail!(
            "the tokenizer has {} ids but the model's vocab_size is {}",
            tokenizer.vocab_size(),
            config.vocab_size
        );
    }
    let dtype = dtype.unwrap_or_else(|| default_dtype(device));
    check_dtype_supported(dtype, device)?;
    // Loaded in `dtype` first, whatever the base is quantized to afterwards.
    let bytes = config.parameters() as f64 * dtype.size_in_bytes() as f64;
    crate::model::budget::check_weights(bytes, device, &files.dir.display().to_string())?;
    let weights = load_weights(&files.weights, &mut config, dtype, device)?;
    if config.tie_word_embeddings && !info.arch.tie_word_embeddings && says_untied(&files.config) {
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
        quant: Default::default(),
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

/// A fingerprint of a local model's weights (and its config.json): SHA-256 over each
/// file's name and size and 64 blocks of 4 KiB spread over it. Any other weights of
/// the same shape (another seed, a fine-tune) differ in nearly every block, and reading
/// 256 KiB a file costs nothing next to loading it. `None`: not a local model (a Hub
/// id names its own weights).
pub fn weights_fingerprint(name: &str) -> Result<Option<String>> {
    use sha2::{Digest, Sha256};
    use std::io::{Read, Seek, SeekFrom};
    let path = Path::new(name);
    let files = if path.is_file() {
        vec![path.to_path_buf()]
    } else if path.is_dir() {
        let f = resolve_dir(path)?;
        std::iter::once(f.config).chain(f.weights).collect()
    } else {
        return Ok(None);
    };
    const BLOCKS: u64 = 64;
    const BLOCK: u64 = 4096;
    let mut h = Sha256::new();
    for p in &files {
        let mut f = std::fs::File::open(p).with_context(|| format!("reading {}", p.display()))?;
        let len = f.metadata()?.len();
        h.update(
            p.file_name()
                .map(|n| n.as_encoded_bytes())
                .unwrap_or_default(),
        );
        h.update(len.to_le_bytes());
        let mut buf = vec![0u8; BLOCK as usize];
        for i in 0..BLOCKS {
            let at = (len.saturating_sub(BLOCK)) * i / (BLOCKS - 1);
            f.seek(SeekFrom::Start(at))?;
            let n = f.read(&mut buf)?;
            h.update(&buf[..n]);
        }
    }
    let digest = h.finalize();
    Ok(Some(
        digest.iter().take(12).map(|b| format!("{b:02x}")).collect(),
    ))
}

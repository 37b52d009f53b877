//! The one way the commands, the trainer and eval get a model: [`load_model`] over a
//! [`ModelSpec`] (a safetensors checkpoint directory or Hub id, a `.gguf` file, a
//! `random:` shape, the built-in tiny model; plus LoRA and an adapter).
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use candle_core::{DType, Device};

use super::generation::GenerationConfig;
use super::lora::LoraConfig;
use super::quant::{
    is_projection, quantize_one, quantize_tied_head, quantize_weights, BaseDtype, QuantMode,
    QuantWeights,
};
use super::tiny::{init_tiny, TinySpec};
use super::tokenizer::{default_template_kwargs, IdRenderer, Renderer, Tokenizer};
use super::weights::random_weights_each;
use super::{ArchConfig, Transformer};
use std::collections::BTreeMap;

pub use super::checkpoint::*;

/// Resolve, read and check a checkpoint: a `.gguf` file, or a safetensors directory /
/// Hub id. `dtype` None → [`default_dtype`] of `device`.
/// With `quant`, the projections and LM head end up in [`Checkpoint::quant`]: a GGUF
/// file's blocks are kept as they are (or requantized when `quant` asks for another
/// type); a safetensors checkpoint is quantized one tensor at a time after loading.
pub fn load_checkpoint(
    model: &ModelRef,
    dtype: Option<DType>,
    device: &Device,
    quant: Option<QuantMode>,
) -> Result<Checkpoint> {
    if let ModelRef::Local(p) = model {
        if is_gguf_path(p) {
            return super::gguf::load_checkpoint(p, dtype, device, quant);
        }
    }
    let mut ck = load_safetensors(model, dtype, device)?;
    if let Some(mode) = quant {
        ck.quant = quantize_weights(&ck.config, &mut ck.weights, mode)?;
    }
    Ok(ck)
}

/// A released shape (`random:qwen2.5-7b`, ...) is trained (`bench grpo-step`) with its
/// family's tokenizer; `random:tiny`'s 512 ids fit none. Only trainers load it: sampling
/// and training benchmarks work on ids and keep its memory out of their peak RSS.
fn random_tokenizer(config: &ArchConfig) -> Result<Option<Tokenizer>> {
    let (_, ids) = super::tiny::family::vocab(config.family);
    if config.vocab_size < ids {
        return Ok(None);
    }
    Ok(Some(Tokenizer::for_family(config.family)?))
}

/// Random weights (seed 0) of `config`: dense, or with the projections and LM head
/// quantized as they are drawn (a 7B shape never holds its f32 projections at once).
fn random_model(
    config: &ArchConfig,
    dtype: DType,
    device: &Device,
    quant: Option<QuantMode>,
) -> Result<(Weights, QuantWeights)> {
    let Some(mode) = quant else {
        return Ok((
            super::random_weights(config, 0, dtype, device)?,
            QuantWeights::new(),
        ));
    };
    let (mut dense, mut q) = (Weights::new(), QuantWeights::new());
    random_weights_each(config, 0, dtype, device, |name, t| {
        if is_projection(&name) {
            q.insert(name.clone(), quantize_one(&name, &t, mode)?);
        } else {
            dense.insert(name, t);
        }
        Ok(())
    })?;
    quantize_tied_head(&dense, &mut q, mode)?;
    Ok((dense, q))
}

// ---------------------------------------------------------------------------------------
// The one way to get a model
// ---------------------------------------------------------------------------------------

/// The built-in architecture shapes of `random:SHAPE` models (random weights in memory,
/// no files, no tokenizer: benchmarks; trainers give every shape but `tiny` its family's
/// tokenizer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BuiltinShape {
    /// [`ArchConfig::tiny`]: a Qwen2 of hidden 64, 2 layers, vocabulary 512.
    Tiny,
    /// [`ArchConfig::qwen25_05b`]: Qwen2.5-0.5B's shape.
    Qwen25_05B,
    /// [`ArchConfig::qwen25_15b`]: Qwen2.5-1.5B's shape.
    Qwen25_15B,
    /// [`ArchConfig::qwen25_3b`]: Qwen2.5-3B's shape.
    Qwen25_3B,
    /// [`ArchConfig::qwen25_7b`]: Qwen2.5-7B's shape.
    Qwen25_7B,
    /// [`ArchConfig::qwen3_06b`]: Qwen3-0.6B's shape.
    Qwen3_06B,
    /// [`ArchConfig::qwen3_4b`]: Qwen3-4B's shape.
    Qwen3_4B,
    /// [`ArchConfig::llama32_1b`]: Llama-3.2-1B's shape.
    Llama32_1B,
}

impl BuiltinShape {
    pub const ALL: [BuiltinShape; 8] = [
        Self::Tiny,
        Self::Qwen25_05B,
        Self::Qwen25_15B,
        Self::Qwen25_3B,
        Self::Qwen25_7B,
        Self::Qwen3_06B,
        Self::Qwen3_4B,
        Self::Llama32_1B,
    ];

    /// The canonical names; `0.5b` is accepted as an alias of `qwen2.5-0.5b`.
    pub fn parse(s: &str) -> Option<Self> {
        let s = s.trim().to_ascii_lowercase();
        if s == "0.5b" {
            return Some(Self::Qwen25_05B);
        }
        Self::ALL.into_iter().find(|b| b.name() == s)
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Tiny => "tiny",
            Self::Qwen25_05B => "qwen2.5-0.5b",
            Self::Qwen25_15B => "qwen2.5-1.5b",
            Self::Qwen25_3B => "qwen2.5-3b",
            Self::Qwen25_7B => "qwen2.5-7b",
            Self::Qwen3_06B => "qwen3-0.6b",
            Self::Qwen3_4B => "qwen3-4b",
            Self::Llama32_1B => "llama3.2-1b",
        }
    }

    pub fn config(self) -> ArchConfig {
        match self {
            Self::Tiny => ArchConfig::tiny(),
            Self::Qwen25_05B => ArchConfig::qwen25_05b(),
            Self::Qwen25_15B => ArchConfig::qwen25_15b(),
            Self::Qwen25_3B => ArchConfig::qwen25_3b(),
            Self::Qwen25_7B => ArchConfig::qwen25_7b(),
            Self::Qwen3_06B => ArchConfig::qwen3_06b(),
            Self::Qwen3_4B => ArchConfig::qwen3_4b(),
            Self::Llama32_1B => ArchConfig::llama32_1b(),
        }
    }
}

/// Prefix of model names that build random weights of a [`BuiltinShape`].
pub const RANDOM_PREFIX: &str = "random:";

/// What to load: every command, the trainer and eval describe their model this way and
/// call [`load_model`].
#[derive(Debug, Clone)]
pub struct ModelSpec {
    /// A local checkpoint directory, a Hub id (`Qwen/Qwen2.5-0.5B-Instruct[@revision]`),
    /// or `random:SHAPE` (`random:tiny`, `random:qwen2.5-0.5b` (alias `random:0.5b`),
    /// `random:qwen2.5-1.5b`, `-3b`, `-7b`, `random:qwen3-0.6b`, `random:qwen3-4b`,
    /// `random:llama3.2-1b`): random weights (seed 0) of a built-in shape, without
    /// tokenizer (trainers give every shape but `tiny` its family's).
    pub name: String,
    /// Compute dtype; None: f32 for `random:` models, else [`default_dtype`] of `device`.
    pub dtype: Option<DType>,
    /// Storage of the frozen base matrices: a float dtype
    /// ([`Transformer::set_base_dtype`]) or a quantized base ([`super::quant`]); None: the
    /// compute dtype.
    pub base_dtype: Option<BaseDtype>,
    pub device: Device,
    /// Fresh LoRA adapters (A seeded, B = 0).
    pub lora: Option<LoraConfig>,
    /// A PEFT adapter directory to load (adapter_model.safetensors +
    /// adapter_config.json); its config replaces `lora`.
    pub adapter: Option<PathBuf>,
    /// Write the built-in tiny checkpoint ([`TinySpec::default`]) at `name` first when
    /// that directory has no config.json.
    pub init_tiny: bool,
    /// Chat-template variables over [`default_template_kwargs`] (`enable_thinking`, ...).
    pub chat_template_kwargs: BTreeMap<String, serde_json::Value>,
}

impl ModelSpec {
    /// `name` on `device` in its default dtype, without adapters.
    pub fn new(name: impl Into<String>, device: Device) -> Self {
        Self {
            name: name.into(),
            dtype: None,
            base_dtype: None,
            device,
            lora: None,
            adapter: None,
            init_tiny: false,
            chat_template_kwargs: BTreeMap::new(),
        }
    }

    /// The quantized base asked for, if any.
    pub fn quant_mode(&self) -> Option<QuantMode> {
        match self.base_dtype {
            Some(BaseDtype::Quant(q)) => Some(q),
            _ => None,
        }
    }

    /// The shape of a `random:` name (None for checkpoints); an unknown shape is an error.
    pub fn random_shape(&self) -> Result<Option<BuiltinShape>> {
        match self.name.strip_prefix(RANDOM_PREFIX) {
            None => Ok(None),
            Some(shape) => BuiltinShape::parse(shape).map(Some).ok_or_else(|| {
                let names: Vec<&str> = BuiltinShape::ALL.iter().map(|b| b.name()).collect();
                anyhow!(
                    "unknown random model {shape:?} (one of {})",
                    names.join(", ")
                )
            }),
        }
    }
}

/// A loaded model: our transformer (with LoRA when asked), its tokenizer and generation config.
pub struct LoadedModel {
    /// [`ModelSpec::name`].
    pub name: String,
    pub config: ArchConfig,
    pub model: Transformer,
    /// None for `random:` models ([`load_with_renderer`] gives them their family's).
    pub tokenizer: Option<Tokenizer>,
    /// Empty (all defaults) for `random:` models.
    pub generation_config: GenerationConfig,
    /// config.json beyond the architecture (None for `random:` models).
    pub info: Option<CheckpointConfig>,
    /// The checkpoint's files (None for `random:` models).
    pub files: Option<ModelFiles>,
    pub dtype: DType,
}

impl LoadedModel {
    /// The tokenizer, or an error naming the model when it has none.
    pub fn tokenizer(&self) -> Result<&Tokenizer> {
        self.tokenizer
            .as_ref()
            .ok_or_else(|| anyhow!("{} has no tokenizer", self.name))
    }

    /// Text and chat rendering: the tokenizer, or ids as text for `random:` models.
    pub fn renderer(&self) -> &dyn Renderer {
        match &self.tokenizer {
            Some(t) => t,
            None => &IdRenderer,
        }
    }

    /// Tokens that end a completion (none for `random:` models).
    pub fn stop_token_ids(&self) -> Vec<u32> {
        self.renderer().stop_ids()
    }
}

/// `init_tiny` creates a model only into an absent or empty directory: a directory
/// with other files and no config.json is someone's data, never overwritten.
fn check_empty_for_init_tiny(dir: &Path) -> Result<()> {
    if !dir.exists() {
        return Ok(());
    }
    if !dir.is_dir() {
        bail!(
            "init_tiny: {} exists and is not a directory; refusing to create the tiny model there",
            dir.display()
        );
    }
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().to_string())
        .collect();
    if !names.is_empty() {
        names.sort();
        names.truncate(5);
        bail!(
            "init_tiny: {} is not empty ({}) and has no config.json; refusing to overwrite it \
             (point model.name at an empty or absent directory)",
            dir.display(),
            names.join(", ")
        );
    }
    Ok(())
}

/// [`load_model`] for training, sampling or evaluation, which need the tokenizer as the
/// renderer: a model without one is an error that says what to give instead. Notes on
/// stderr when `spec.adapter`'s shape replaces `spec.lora`'s (PEFT's rule: the
/// adapter's adapter_config.json shapes it).
pub fn load_with_renderer(spec: &ModelSpec) -> Result<(Transformer, Box<dyn Renderer>)> {
    let m = load_model(spec)?;
    if let (Some(dir), Some(got), Some(want)) = (&spec.adapter, m.model.lora_config(), &spec.lora) {
        let shape = |c: &LoraConfig| {
            let mut t = c.target_modules.clone();
            t.sort();
            (c.r, c.alpha, c.use_rslora, t)
        };
        if shape(got) != shape(want) {
            crate::note!(
                "note: model.adapter {} has r = {}, alpha = {}, targets {:?}: it replaces \
                 the [lora] section's shape",
                dir.display(),
                got.r,
                got.alpha,
                got.target_modules
            );
        }
    }
    let name = &spec.name;
    let tokenizer = match (m.tokenizer, spec.random_shape()?) {
        (None, Some(_)) => random_tokenizer(&m.config)?.map(|mut t| {
            let mut kwargs = default_template_kwargs();
            kwargs.extend(spec.chat_template_kwargs.clone());
            t.set_template_kwargs(kwargs);
            t
        }),
        (t, _) => t,
    };
    let tokenizer = tokenizer.with_context(|| {
        let hint = if name.starts_with("random:") {
            " (`random:tiny` is for benchmarks; to train on a built-in model, give \
             `model.name = \"PATH\"` with `model.init_tiny = true`, as \
             configs/quickstart.toml does)"
        } else {
            ""
        };
        format!("{name} has no tokenizer{hint}")
    })?;
    Ok((m.model, Box::new(tokenizer)))
}

/// Load the model `spec` names: create the tiny checkpoint when asked, resolve and read
/// the checkpoint (or build random weights), build the model with `spec.lora`, then load
/// `spec.adapter`.
pub fn load_model(spec: &ModelSpec) -> Result<LoadedModel> {
    let name = &spec.name;
    let mut m = match spec.random_shape()? {
        Some(shape) => {
            if spec.init_tiny {
                bail!("init_tiny needs a directory, not {name}");
            }
            if spec.adapter.is_some() {
                bail!("an adapter needs a checkpoint, not {name}");
            }
            let config = shape.config();
            let dtype = spec.dtype.unwrap_or(DType::F32);
            check_dtype_supported(dtype, &spec.device)?;
            if spec.quant_mode().is_none() {
                let bytes = config.parameters() as f64 * dtype.size_in_bytes() as f64;
                crate::model::budget::check_weights(bytes, &spec.device, name)?;
            }
            let (w, q) = random_model(&config, dtype, &spec.device, spec.quant_mode())?;
            let model = Transformer::with_quant(&config, &w, &q, spec.lora.as_ref())
                .with_context(|| format!("building the model {name}"))?;
            LoadedModel {
                name: name.clone(),
                config,
                model,
                tokenizer: None,
                generation_config: GenerationConfig::default(),
                info: None,
                files: None,
                dtype,
            }
        }
        None => {
            if spec.init_tiny && !Path::new(name).join("config.json").exists() {
                check_empty_for_init_tiny(Path::new(name))?;
                crate::note!("creating the built-in tiny model in {name}");
                init_tiny(&TinySpec::default(), Path::new(name))?;
            }
            let mref = ModelRef::parse(name)?;
            let ck = load_checkpoint(&mref, spec.dtype, &spec.device, spec.quant_mode())
                .with_context(|| format!("loading model {name}"))?;
            let model =
                Transformer::with_quant(&ck.config, &ck.weights, &ck.quant, spec.lora.as_ref())
                    .with_context(|| format!("building the model from {mref}"))?;
            LoadedModel {
                name: name.clone(),
                config: ck.config,
                model,
                tokenizer: Some(ck.tokenizer),
                generation_config: ck.generation_config,
                info: Some(ck.info),
                files: Some(ck.files),
                dtype: ck.dtype,
            }
        }
    };
    if let Some(BaseDtype::Float(bd)) = spec.base_dtype {
        if bd != m.dtype {
            check_dtype_supported(bd, &spec.device)?;
            m.model
                .set_base_dtype(bd)
                .with_context(|| format!("storing the base of {name} in {bd:?}"))?;
        }
    }
    if let Some(tok) = m.tokenizer.as_mut() {
        let mut kwargs = default_template_kwargs();
        kwargs.extend(spec.chat_template_kwargs.clone());
        tok.set_template_kwargs(kwargs);
    }
    if let Some(dir) = &spec.adapter {
        m.model
            .load_adapter(dir)
            .with_context(|| format!("loading the adapter {}", dir.display()))?;
    }
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_model_without_a_tokenizer_cannot_be_trained_and_says_what_to_give() {
        let spec = ModelSpec::new("random:tiny", Device::Cpu);
        let err = format!("{:#}", load_with_renderer(&spec).err().unwrap());
        assert!(err.contains("random:tiny has no tokenizer"), "{err}");
        assert!(err.contains("model.init_tiny = true"), "{err}");
        assert!(load_model(&spec).is_ok());
    }

    #[test]
    fn parses_refs() {
        assert_eq!(
            ModelRef::parse("Qwen/Qwen2.5-0.5B-Instruct").unwrap(),
            ModelRef::Hub {
                repo_id: "Qwen/Qwen2.5-0.5B-Instruct".into(),
                revision: None
            }
        );
        assert_eq!(
            ModelRef::parse("Qwen/Qwen2.5-0.5B-Instruct@v1.0").unwrap(),
            ModelRef::Hub {
                repo_id: "Qwen/Qwen2.5-0.5B-Instruct".into(),
                revision: Some("v1.0".into())
            }
        );
        assert!(matches!(
            ModelRef::parse("./some/dir").unwrap(),
            ModelRef::Local(_)
        ));
        assert!(matches!(
            ModelRef::parse("/abs/path/x").unwrap(),
            ModelRef::Local(_)
        ));
        assert!(ModelRef::parse("no-slash").is_err());
        assert!(ModelRef::parse("a/b@").is_err());
    }

    #[test]
    fn dtype_policy() {
        assert_eq!(default_dtype(&Device::Cpu), DType::F32);
        assert_eq!(parse_dtype("bfloat16", &Device::Cpu).unwrap(), DType::BF16);
        assert_eq!(parse_dtype("auto", &Device::Cpu).unwrap(), DType::F32);
        assert!(parse_dtype("int8", &Device::Cpu).is_err());
    }
}

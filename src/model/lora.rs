//! LoRA adapters in PEFT's format.
//!
//! `y = W x + b + scaling * B (A (dropout(x)))`, `scaling = alpha / r` (rsLoRA:
//! `alpha / sqrt(r)`), A `[r, in]` ~ U(±1/sqrt(in)) from a seeded ChaCha RNG, B `[out, r]`
//! = 0. Parameters are f32 [`Var`]s whatever the base dtype; like PEFT, the input is
//! cast to f32, the LoRA branch is added to the base output in f32 and the sum is cast
//! back to the base dtype.
//!
//! Files (what `peft.PeftModel.from_pretrained` loads): `adapter_model.safetensors`
//! (metadata `{"format":"pt"}`, keys
//! `base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight`, ...) and
//! `adapter_config.json`. Both are written atomically (temp file + rename).
use super::ops;
use anyhow::{anyhow, bail, Context, Result};
use candle_core::{DType, Device, Tensor, Var};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::HashMap;
use std::path::Path;

/// Every module LoRA can target, in PEFT's usual order.
pub const LORA_TARGETS: [&str; 7] = [
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
];

/// File names of a PEFT adapter directory.
pub const ADAPTER_WEIGHTS: &str = "adapter_model.safetensors";
pub const ADAPTER_CONFIG: &str = "adapter_config.json";

/// LoRA hyper-parameters (PEFT's `LoraConfig` subset Concord supports).
#[derive(Debug, Clone, PartialEq)]
pub struct LoraConfig {
    pub r: usize,
    pub alpha: f64,
    pub dropout: f64,
    /// Any subset of [`LORA_TARGETS`].
    pub target_modules: Vec<String>,
    pub use_rslora: bool,
    /// Seed of the A initialisation (B starts at zero).
    pub init_seed: u64,
}

impl Default for LoraConfig {
    fn default() -> Self {
        LoraConfig {
            r: 16,
            alpha: 32.0,
            dropout: 0.0,
            target_modules: LORA_TARGETS.iter().map(|s| s.to_string()).collect(),
            use_rslora: false,
            init_seed: 0,
        }
    }
}

/// "self_attn" or "mlp": the parent module of a target in Qwen2.
pub fn parent_of(module: &str) -> &'static str {
    match module {
        "gate_proj" | "up_proj" | "down_proj" => "mlp",
        _ => "self_attn",
    }
}

/// PEFT key of a LoRA tensor: `base_model.model.model.layers.{i}.{parent}.{module}.lora_{A|B}.weight`.
pub fn peft_key(layer: usize, module: &str, which: char) -> String {
    format!(
        "base_model.model.model.layers.{layer}.{}.{module}.lora_{which}.weight",
        parent_of(module)
    )
}

impl LoraConfig {
    /// `alpha / r`, or `alpha / sqrt(r)` with rsLoRA.
    pub fn scaling(&self) -> f64 {
        if self.use_rslora {
            self.alpha / (self.r as f64).sqrt()
        } else {
            self.alpha / self.r as f64
        }
    }

    pub fn targets(&self, module: &str) -> bool {
        self.target_modules.iter().any(|m| m == module)
    }

    pub fn validate(&self) -> Result<()> {
        if self.r == 0 {
            bail!("LoRA r must be > 0");
        }
        if !(0.0..1.0).contains(&self.dropout) {
            bail!("LoRA dropout must be in [0, 1) (got {})", self.dropout);
        }
        if self.target_modules.is_empty() {
            bail!("LoRA target_modules is empty");
        }
        for m in &self.target_modules {
            if !LORA_TARGETS.contains(&m.as_str()) {
                bail!(
                    "LoRA target module {m:?} is not supported (choose from {})",
                    LORA_TARGETS.join(", ")
                );
            }
        }
        Ok(())
    }

    /// `adapter_config.json` contents (PEFT fields).
    pub fn to_peft_json(&self, base_model_name_or_path: &str) -> serde_json::Value {
        let targets: Vec<&str> = LORA_TARGETS
            .iter()
            .copied()
            .filter(|m| self.targets(m))
            .collect();
        serde_json::json!({
            "peft_type": "LORA",
            "task_type": "CAUSAL_LM",
            "base_model_name_or_path": base_model_name_or_path,
            "r": self.r,
            "lora_alpha": self.alpha,
            "lora_dropout": self.dropout,
            "target_modules": targets,
            "bias": "none",
            "use_rslora": self.use_rslora,
            "use_dora": false,
            "fan_in_fan_out": false,
            "init_lora_weights": true,
            "modules_to_save": null,
            "inference_mode": true,
            "layers_to_transform": null,
            "layers_pattern": null,
            "rank_pattern": {},
            "alpha_pattern": {},
            "revision": null,
        })
    }

    /// Parse PEFT's `adapter_config.json`.
    pub fn from_peft_json(v: &serde_json::Value) -> Result<LoraConfig> {
        let get = |k: &str| v.get(k).filter(|x| !x.is_null());
        if let Some(t) = get("peft_type").and_then(|x| x.as_str()) {
            if t != "LORA" {
                bail!("adapter_config.json: peft_type {t:?} is not LORA");
            }
        }
        let r = get("r")
            .and_then(|x| x.as_u64())
            .ok_or_else(|| anyhow!("adapter_config.json: missing integer `r`"))?
            as usize;
        let alpha = get("lora_alpha")
            .and_then(|x| x.as_f64())
            .ok_or_else(|| anyhow!("adapter_config.json: missing `lora_alpha`"))?;
        let dropout = get("lora_dropout").and_then(|x| x.as_f64()).unwrap_or(0.0);
        let use_rslora = get("use_rslora").and_then(|x| x.as_bool()).unwrap_or(false);
        if get("use_dora").and_then(|x| x.as_bool()).unwrap_or(false) {
            bail!("adapter_config.json: DoRA adapters are not supported");
        }
        if get("fan_in_fan_out")
            .and_then(|x| x.as_bool())
            .unwrap_or(false)
        {
            bail!("adapter_config.json: fan_in_fan_out adapters are not supported");
        }
        for k in ["rank_pattern", "alpha_pattern"] {
            if let Some(o) = get(k).and_then(|x| x.as_object()) {
                if !o.is_empty() {
                    bail!("adapter_config.json: `{k}` is not supported");
                }
            }
        }
        if let Some(b) = get("bias").and_then(|x| x.as_str()) {
            if b != "none" {
                bail!("adapter_config.json: bias {b:?} is not supported (only \"none\")");
            }
        }
        let target_modules: Vec<String> = match get("target_modules") {
            Some(serde_json::Value::Array(a)) => a
                .iter()
                .map(|x| {
                    x.as_str()
                        .map(str::to_string)
                        .ok_or_else(|| anyhow!("adapter_config.json: bad target_modules entry"))
                })
                .collect::<Result<_>>()?,
            Some(serde_json::Value::String(s)) if s == "all-linear" => {
                LORA_TARGETS.iter().map(|s| s.to_string()).collect()
            }
            Some(serde_json::Value::String(s)) if LORA_TARGETS.contains(&s.as_str()) => {
                vec![s.clone()]
            }
            Some(other) => bail!("adapter_config.json: unsupported target_modules {other}"),
            None => bail!("adapter_config.json: missing `target_modules`"),
        };
        let cfg = LoraConfig {
            r,
            alpha,
            dropout,
            target_modules,
            use_rslora,
            init_seed: 0,
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// Read `dir/adapter_config.json`.
    pub fn from_peft_dir(dir: &Path) -> Result<LoraConfig> {
        let p = dir.join(ADAPTER_CONFIG);
        let text =
            std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?;
        let v: serde_json::Value =
            serde_json::from_str(&text).with_context(|| format!("parsing {}", p.display()))?;
        Self::from_peft_json(&v).with_context(|| format!("in {}", p.display()))
    }
}

/// Run-time switches of a LoRA forward.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LoraRun {
    /// Use detached parameter tensors (no graph).
    pub detached: bool,
    /// Dropout mask seed; `None` = no dropout (evaluation).
    pub dropout_seed: Option<u64>,
}

/// One LoRA adapter on a linear layer.
#[derive(Debug, Clone)]
pub struct LoraLinear {
    /// `[r, in]`, f32.
    pub a: Var,
    /// `[out, r]`, f32.
    pub b: Var,
    pub scaling: f64,
    pub dropout: f64,
}

impl LoraLinear {
    /// PEFT init: A ~ U(-1/sqrt(in), 1/sqrt(in)) drawn from `rng`, B = 0.
    pub fn new(
        in_features: usize,
        out_features: usize,
        cfg: &LoraConfig,
        rng: &mut ChaCha8Rng,
        device: &Device,
    ) -> Result<Self> {
        let bound = 1.0 / (in_features as f64).sqrt();
        let a: Vec<f32> = (0..cfg.r * in_features)
            .map(|_| rng.gen_range(-bound..bound) as f32)
            .collect();
        let a = Var::from_vec(a, (cfg.r, in_features), device)?;
        let b = Var::zeros((out_features, cfg.r), DType::F32, device)?;
        Ok(LoraLinear {
            a,
            b,
            scaling: cfg.scaling(),
            dropout: cfg.dropout,
        })
    }

    /// `x W^T (+ bias) + scaling * B A dropout(x)`: for a detached run a plain value; for
    /// training one graph node whose backward returns dL/dx, dL/dA and dL/dB. Composed from tracked ops the same
    /// layer keeps four `[n, out]` tensors alive until backward (base output, the
    /// low-rank product, its scaled copy and the sum); this keeps the result only and
    /// recomputes the `[n, r]` product in backward.
    pub fn forward(
        &self,
        x: &Tensor,
        w: &ops::BaseWeight,
        bias: Option<&Tensor>,
        run: LoraRun,
    ) -> candle_core::Result<Tensor> {
        let (a, b) = (self.a.as_tensor(), self.b.as_tensor());
        let in_f = a.dim(1)?;
        let out_f = b.dim(0)?;
        let s = self.scaling;
        let xd = x.detach();
        let mask = match run.dropout_seed {
            Some(seed) if self.dropout > 0.0 => {
                Some(self.dropout_mask(seed, xd.elem_count(), in_f, xd.device())?)
            }
            _ => None,
        };
        let keep = |xf: Tensor, mask: &Option<Tensor>| -> candle_core::Result<Tensor> {
            match mask {
                Some(m) => xf * m,
                None => Ok(xf),
            }
        };
        let xm = keep(xd.to_dtype(DType::F32)?.reshape(((), in_f))?, &mask)?;
        let h = xm.matmul(&a.detach().t()?)?;
        let d = (h.matmul(&b.detach().t()?)? * s)?;
        let base = ops::base_linear(&xd, w, bias)?;
        let y = (base.to_dtype(DType::F32)?.reshape(((), out_f))? + d)?
            .to_dtype(base.dtype())?
            .reshape(base.shape())?;
        if run.detached {
            return Ok(y);
        }
        let w = w.clone();
        // The first layer's input derives from no variable: give it no gradient (it
        // would be computed for nothing and stored in the gradient store).
        let x_tracked = x.track_op();
        ops::attach([x, a, b], y, "lora-linear", move |[x, a, b], _y, g| {
            let g2 = g.reshape(((), out_f))?;
            let gf = g2.to_dtype(DType::F32)?;
            let xm = keep(x.to_dtype(DType::F32)?.reshape(((), in_f))?, &mask)?;
            let h = xm.matmul(&a.t()?)?;
            let gb = (gf.t()?.matmul(&h)? * s)?;
            let gh = (gf.matmul(b)? * s)?;
            let ga = gh.t()?.matmul(&xm)?;
            if !x_tracked {
                return Ok([None, Some(ga), Some(gb)]);
            }
            let gx_lora = keep(gh.matmul(a)?, &mask)?;
            let gx = (g2.matmul(&w.dense(g2.dtype())?)?.to_dtype(DType::F32)? + gx_lora)?
                .to_dtype(x.dtype())?
                .reshape(x.shape())?;
            Ok([Some(gx), Some(ga), Some(gb)])
        })
    }

    /// Inverted-dropout mask `[n, in]` (0 or 1/keep) drawn from `seed`.
    fn dropout_mask(
        &self,
        seed: u64,
        elems: usize,
        in_f: usize,
        device: &Device,
    ) -> candle_core::Result<Tensor> {
        let keep = 1.0 - self.dropout;
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mask: Vec<f32> = (0..elems)
            .map(|_| {
                if rng.gen::<f64>() < keep {
                    (1.0 / keep) as f32
                } else {
                    0.0
                }
            })
            .collect();
        Tensor::from_vec(mask, (elems / in_f.max(1), in_f), device)
    }
}

/// Save `(PEFT key, f32 tensor)` pairs and the config as a PEFT adapter directory.
pub fn save_peft(
    dir: &Path,
    cfg: &LoraConfig,
    base_model_name_or_path: &str,
    tensors: &[(String, Tensor)],
) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut bufs: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::with_capacity(tensors.len());
    for (k, t) in tensors {
        let v: Vec<f32> = t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
        let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        bufs.push((k.clone(), t.dims().to_vec(), bytes));
    }
    let views = bufs
        .iter()
        .map(|(k, shape, bytes)| {
            safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape.clone(), bytes)
                .map(|v| (k.clone(), v))
        })
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| anyhow!("safetensors: {e:?}"))?;
    let meta: HashMap<String, String> = [("format".to_string(), "pt".to_string())].into();
    let bytes =
        safetensors::serialize(views, &Some(meta)).map_err(|e| anyhow!("safetensors: {e:?}"))?;
    crate::atomic::atomic_write_bytes(&dir.join(ADAPTER_WEIGHTS), &bytes)?;
    let json = serde_json::to_string_pretty(&cfg.to_peft_json(base_model_name_or_path))?;
    crate::atomic::atomic_write_bytes(&dir.join(ADAPTER_CONFIG), json.as_bytes())?;
    Ok(())
}

/// `(shape, f32 values)` of a tensor read from an adapter file.
pub type PeftTensor = (Vec<usize>, Vec<f32>);

/// Read every tensor of `dir/adapter_model.safetensors` as f32 `(shape, values)`.
/// PEFT keys with a `.default` adapter segment are not supported.
pub fn read_peft_tensors(dir: &Path) -> Result<HashMap<String, PeftTensor>> {
    let p = dir.join(ADAPTER_WEIGHTS);
    let bytes = std::fs::read(&p).with_context(|| format!("reading {}", p.display()))?;
    let st = safetensors::SafeTensors::deserialize(&bytes)
        .map_err(|e| anyhow!("{}: {e:?}", p.display()))?;
    let mut out = HashMap::new();
    for (name, view) in st.tensors() {
        let data = view.data();
        let vals: Vec<f32> = match view.dtype() {
            safetensors::Dtype::F32 => data
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            safetensors::Dtype::BF16 => data
                .chunks_exact(2)
                .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            safetensors::Dtype::F16 => data
                .chunks_exact(2)
                .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            d => bail!("{}: tensor {name} has unsupported dtype {d:?}", p.display()),
        };
        // A diverged run's NaN or inf would make every later forward NaN, silently.
        if let Some(x) = vals.iter().find(|x| !x.is_finite()) {
            bail!(
                "{}: tensor {name} holds {x}: the adapter was saved from a diverged run",
                p.display()
            );
        }
        out.insert(name, (view.shape().to_vec(), vals));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_adapter_holding_nan_is_refused_by_name() {
        let d = tempfile::tempdir().unwrap();
        let write = |v: f32| {
            let bytes: Vec<u8> = [0.5f32, v].iter().flat_map(|x| x.to_le_bytes()).collect();
            let view =
                safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![1, 2], &bytes)
                    .unwrap();
            let out = safetensors::serialize([("w.lora_A.weight", view)], &None).unwrap();
            std::fs::write(d.path().join(ADAPTER_WEIGHTS), out).unwrap();
        };
        write(1.0);
        assert_eq!(read_peft_tensors(d.path()).unwrap().len(), 1);
        for bad in [f32::NAN, f32::INFINITY] {
            write(bad);
            let e = read_peft_tensors(d.path()).unwrap_err().to_string();
            assert!(
                e.contains("w.lora_A.weight") && e.contains("diverged"),
                "{e}"
            );
        }
    }
}

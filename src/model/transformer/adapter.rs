//! The LoRA adapter on a [`Transformer`]: attach fresh adapters, list their variables
//! under PEFT's keys, switch them off for the reference policy, and save or load a PEFT
//! directory.
use super::super::lora::{self, LoraConfig, LoraLinear, LORA_TARGETS};
use super::Transformer;
use anyhow::{anyhow, bail, Context, Result};
use candle_core::{Tensor, Var};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use std::path::Path;
use std::sync::atomic::Ordering;

impl Transformer {
    /// (Re)create fresh LoRA adapters (A from `cfg.init_seed`, B = 0) on the targeted
    /// modules of every layer, replacing any existing ones.
    pub fn add_lora(&mut self, cfg: &LoraConfig) -> Result<()> {
        cfg.validate()?;
        let mut rng = ChaCha8Rng::seed_from_u64(cfg.init_seed);
        for layer in &mut self.layers {
            for (m, lin) in LORA_TARGETS.iter().zip(layer.linears_mut()) {
                lin.lora = if cfg.targets(m) {
                    let (out_f, in_f) = lin.w.dims()?;
                    Some(LoraLinear::new(in_f, out_f, cfg, &mut rng, &self.device)?)
                } else {
                    None
                };
            }
        }
        self.lora = Some(cfg.clone());
        Ok(())
    }

    /// Remove the adapters (back to the base model).
    pub fn remove_lora(&mut self) {
        for layer in &mut self.layers {
            for lin in layer.linears_mut() {
                lin.lora = None;
            }
        }
        self.lora = None;
    }

    pub fn lora_config(&self) -> Option<&LoraConfig> {
        self.lora.as_ref()
    }

    /// `(PEFT key, Var)` for every LoRA tensor: layer by layer, modules in
    /// [`LORA_TARGETS`] order, A before B. Vars are f32 and share storage with the model
    /// (an optimiser updating them updates the model).
    pub fn lora_vars(&self) -> Vec<(String, Var)> {
        let mut out = Vec::new();
        for (l, layer) in self.layers.iter().enumerate() {
            for (m, lin) in LORA_TARGETS.iter().zip(layer.linears()) {
                if let Some(lo) = &lin.lora {
                    out.push((lora::peft_key(l, m, 'A'), lo.a.clone()));
                    out.push((lora::peft_key(l, m, 'B'), lo.b.clone()));
                }
            }
        }
        out
    }

    /// Just the vars (for an optimiser).
    pub fn trainable_vars(&self) -> Vec<Var> {
        self.lora_vars().into_iter().map(|(_, v)| v).collect()
    }

    /// Switch the adapter on/off for subsequent forwards (off = the base model, GRPO's
    /// reference policy). Takes `&self`: an atomic flag.
    pub fn set_adapter_enabled(&self, enabled: bool) {
        self.adapter_enabled.store(enabled, Ordering::SeqCst);
    }

    pub fn adapter_enabled(&self) -> bool {
        self.adapter_enabled.load(Ordering::SeqCst)
    }

    /// Save the adapter as a PEFT directory (`adapter_model.safetensors` +
    /// `adapter_config.json`), each file written atomically.
    pub fn save_adapter(&self, dir: &Path, base_model_name_or_path: &str) -> Result<()> {
        let cfg = self
            .lora
            .as_ref()
            .ok_or_else(|| anyhow!("save_adapter: the model has no LoRA adapter"))?;
        let tensors: Vec<(String, Tensor)> = self
            .lora_vars()
            .into_iter()
            .map(|(k, v)| (k, v.as_detached_tensor()))
            .collect();
        lora::save_peft(dir, cfg, base_model_name_or_path, &tensors)
    }

    /// Load a PEFT adapter directory: creates adapters per its `adapter_config.json`
    /// (replacing existing ones) and sets their values. Every expected key must be
    /// present with the right shape, and no unexpected key may appear (errors name the
    /// tensor). Enables the adapter.
    pub fn load_adapter(&mut self, dir: &Path) -> Result<()> {
        let cfg = LoraConfig::from_peft_dir(dir)?;
        let tensors = lora::read_peft_tensors(dir)?;
        self.add_lora(&cfg)?;
        let p = dir.join(lora::ADAPTER_WEIGHTS);
        let vars = self.lora_vars();
        let expected: std::collections::HashSet<&str> =
            vars.iter().map(|(k, _)| k.as_str()).collect();
        if let Some(k) = tensors.keys().find(|k| !expected.contains(k.as_str())) {
            bail!(
                "{}: unexpected tensor {k} (adapter config targets {:?}, {} layers)",
                p.display(),
                cfg.target_modules,
                self.cfg.num_hidden_layers
            );
        }
        for (k, var) in &vars {
            let (shape, vals) = tensors
                .get(k)
                .ok_or_else(|| anyhow!("{}: missing tensor {k}", p.display()))?;
            if shape.as_slice() != var.dims() {
                bail!(
                    "{}: tensor {k} has shape {shape:?}, expected {:?}",
                    p.display(),
                    var.dims()
                );
            }
            let t = Tensor::from_vec(vals.clone(), shape.as_slice(), &self.device)?;
            var.set(&t).with_context(|| format!("setting {k}"))?;
        }
        self.set_adapter_enabled(true);
        Ok(())
    }
}

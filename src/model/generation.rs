//! generation_config.json: a checkpoint's sampling defaults and extra stop ids.
//!
//! A leaf of `model/`: the loader reads it into [`crate::model::load::LoadedModel`], the
//! tokenizer takes its `eos_token_id`s as stop tokens, and the sampler's defaults come
//! from it; none of them needs another for it.
use std::path::Path;

use anyhow::{Context, Result};
use serde_json::Value as Json;

/// generation_config.json (all fields optional).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GenerationConfig {
    pub bos_token_id: Option<u32>,
    /// `eos_token_id`: an int or a list in the file.
    pub eos_token_ids: Vec<u32>,
    pub pad_token_id: Option<u32>,
    pub do_sample: Option<bool>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<usize>,
    pub min_p: Option<f64>,
    pub repetition_penalty: Option<f64>,
    pub max_new_tokens: Option<usize>,
}

impl GenerationConfig {
    pub fn parse(text: &str) -> Result<Self> {
        let j: Json =
            serde_json::from_str(text).context("generation_config.json is not valid JSON")?;
        Ok(Self {
            bos_token_id: j["bos_token_id"].as_u64().map(|x| x as u32),
            eos_token_ids: id_list(&j["eos_token_id"]),
            pad_token_id: j["pad_token_id"].as_u64().map(|x| x as u32),
            do_sample: j["do_sample"].as_bool(),
            temperature: j["temperature"].as_f64(),
            top_p: j["top_p"].as_f64(),
            top_k: j["top_k"].as_u64().map(|x| x as usize),
            min_p: j["min_p"].as_f64(),
            repetition_penalty: j["repetition_penalty"].as_f64(),
            max_new_tokens: j["max_new_tokens"].as_u64().map(|x| x as usize),
        })
    }

    pub fn from_file(path: &Path) -> Result<Self> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        Self::parse(&text).with_context(|| format!("in {}", path.display()))
    }
}

/// An int or a list of ints (generation_config's eos_token_id).
pub(crate) fn id_list(v: &Json) -> Vec<u32> {
    match v {
        Json::Number(n) => n.as_u64().map(|x| vec![x as u32]).unwrap_or_default(),
        Json::Array(a) => a
            .iter()
            .filter_map(|x| x.as_u64().map(|x| x as u32))
            .collect(),
        _ => Vec::new(),
    }
}

//! Batched KV-cache sampling of G completions per prompt.
//!
//! - [`params`]: what a call does ([`SamplingParams`]) and returns ([`Completion`]);
//! - [`row`]: the host token chooser ([`RowSampler`]) and the per-completion RNG
//!   streams ([`row_rng`]), so results do not depend on batch composition;
//! - [`stop`]: how a completion ends (stop tokens, stop strings across token boundaries,
//!   the budget);
//! - [`device`]: the same token choice as tensor ops on the model's device;
//! - `engine`: the one prefill + decode engine every call runs on;
//! - this module: G completions per prompt ([`sample_groups`], [`sample_requests`]):
//!   rows that end at their first turn, one prefill per prompt and a shared KV cache;
//! - [`turns`]: multi-turn sampling, model turns alternating with outside (environment)
//!   turns on one KV cache ([`sample_turns`]);
//! - [`generate`]: the `concord generate` and `concord bench sample` entry points.
//!
//! Processing order follows transformers' `generate`: repetition penalty, then
//! min-new-tokens suppression of the stop tokens, then temperature, top-k, top-p and
//! min-p, each filter acting on what the previous one left.

use candle_core::Tensor;
use serde::Serialize;

use crate::model::tokenizer::Renderer;
use crate::model::Transformer;
use crate::model::{Input, Mode};

mod device;
mod engine;
pub mod generate;
pub mod params;
pub mod reuse;
pub mod row;
pub mod stop;
pub mod turns;

pub use device::DeviceSampler;
pub use engine::{Reply, Trajectory, TurnEnd, TurnEvent, TurnSource};
pub use generate::{
    bench, generate, peak_rss_mib, BenchSampleOptions, BenchSampleReport, GenerateOptions,
    Generated, PromptSource,
};
pub use params::{Completion, FinishReason, SamplingOverrides, SamplingParams};
pub use reuse::PromptKv;
pub use row::{row_rng, Choice, RowSampler};
pub use stop::{check_finish, completion_text, StopMatcher};
pub use turns::{sample_turns, TurnRow};

/// One prompt of a batch and which RNG streams its completions use: completion `j`
/// (of `num`) draws from `row_rng(seed, stream_prompt, first_sample + j)`.
#[derive(Debug, Clone)]
pub struct GroupRequest<'a> {
    pub prompt: &'a [u32],
    pub num: usize,
    pub stream_prompt: usize,
    pub first_sample: usize,
}

/// Timing and work counters of one sampling call.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct SampleStats {
    /// Real (unpadded) prompt tokens prefilled.
    pub prefill_tokens: usize,
    /// Of `prefill_tokens`, those not recomputed: the prompts of a call share a prefix
    /// (the system prompt), which is prefilled once and copied to every prompt's row.
    pub shared_prefix_tokens: usize,
    /// Of `prefill_tokens`, those whose keys and values came from the same session's
    /// previous prompt ([`sample_requests_reusing`]).
    pub reused_tokens: usize,
    pub prefill_seconds: f64,
    /// Tokens generated over all completions.
    pub new_tokens: usize,
    /// Decode time (everything after the prefill).
    pub decode_seconds: f64,
    /// Batched decode forwards run.
    pub decode_steps: usize,
    /// Row-steps computed (sum over decode steps of the batch size), padding included.
    pub row_steps: usize,
}

impl SampleStats {
    pub fn seconds(&self) -> f64 {
        self.prefill_seconds + self.decode_seconds
    }
}

/// G completions for each prompt: prompt `i`'s completion `j` uses RNG stream
/// `(seed, i, j)`. Returns one `Vec<Completion>` (length `g`) per prompt.
pub fn sample_groups(
    model: &Transformer,
    tokenizer: &dyn Renderer,
    prompts: &[Vec<u32>],
    g: usize,
    params: &SamplingParams,
    seed: u64,
) -> anyhow::Result<Vec<Vec<Completion>>> {
    Ok(sample_groups_with_stats(model, tokenizer, prompts, g, params, seed)?.0)
}

/// [`sample_groups`] plus timing counters.
pub fn sample_groups_with_stats(
    model: &Transformer,
    tokenizer: &dyn Renderer,
    prompts: &[Vec<u32>],
    g: usize,
    params: &SamplingParams,
    seed: u64,
) -> anyhow::Result<(Vec<Vec<Completion>>, SampleStats)> {
    sample_requests(model, tokenizer, &group_requests(prompts, g), params, seed)
}

/// `g` completions of each prompt, prompt `i` on RNG streams `(i, 0..g)`.
pub fn group_requests(prompts: &[Vec<u32>], g: usize) -> Vec<GroupRequest<'_>> {
    prompts
        .iter()
        .enumerate()
        .map(|(i, p)| GroupRequest {
            prompt: p,
            num: g,
            stream_prompt: i,
            first_sample: 0,
        })
        .collect()
}

/// Where next tokens are chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ChooseOn {
    /// The host for a CPU model, the model's device otherwise.
    #[default]
    Auto,
    /// Logits copied to the host, rows chosen in parallel threads: fastest on a CPU.
    Host,
    /// Tensor operations on the model's device ([`DeviceSampler`]); only tokens and
    /// their log-probs come back: what a GPU wants.
    Device,
}

impl ChooseOn {
    pub(crate) fn resolve(self, device: &candle_core::Device) -> ChooseOn {
        match self {
            ChooseOn::Auto if device.is_cpu() => ChooseOn::Host,
            ChooseOn::Auto => ChooseOn::Device,
            other => other,
        }
    }
}

/// The general batched sampler: every request's prompt is prefilled once (all prompts
/// in one left-padded batch), its KV cache rows are expanded to its completions, and
/// all completions decode together, one token per step, with finished rows dropped
/// from the batch. Detached throughout (no autograd graph).
pub fn sample_requests(
    model: &Transformer,
    tokenizer: &dyn Renderer,
    requests: &[GroupRequest],
    params: &SamplingParams,
    seed: u64,
) -> anyhow::Result<(Vec<Vec<Completion>>, SampleStats)> {
    sample_requests_on(model, tokenizer, requests, params, seed, ChooseOn::Auto)
}

/// [`sample_requests`] with the token choice made where `choose_on` says.
pub fn sample_requests_on(
    model: &Transformer,
    tokenizer: &dyn Renderer,
    requests: &[GroupRequest],
    params: &SamplingParams,
    seed: u64,
    choose_on: ChooseOn,
) -> anyhow::Result<(Vec<Vec<Completion>>, SampleStats)> {
    let (out, stats, _) = sample_core(model, tokenizer, requests, None, params, seed, choose_on)?;
    Ok((out, stats))
}

/// What [`sample_requests_reusing`] returns: the completions, the counters, and per
/// request the KV of its prompt (None for a request with nothing to sample).
pub type Reused = (Vec<Vec<Completion>>, SampleStats, Vec<Option<PromptKv>>);

/// [`sample_requests`] for prompts that continue earlier ones: request `i` is
/// prefilled on top of the prefix it shares with `priors[i]` (the KV of the last
/// prompt of its session, returned by the previous call). Completions are those of a
/// full prefill, up to float rounding.
pub fn sample_requests_reusing(
    model: &Transformer,
    tokenizer: &dyn Renderer,
    requests: &[GroupRequest],
    priors: &[Option<&PromptKv>],
    params: &SamplingParams,
    seed: u64,
) -> anyhow::Result<Reused> {
    anyhow::ensure!(
        priors.len() == requests.len(),
        "{} priors for {} requests",
        priors.len(),
        requests.len()
    );
    let priors = Some(priors);
    sample_core(
        model,
        tokenizer,
        requests,
        priors,
        params,
        seed,
        ChooseOn::Auto,
    )
}

/// Single-turn sampling on the one engine ([`engine`]): each request's completions
/// are rows of its prompt that end at their first turn.
fn sample_core(
    model: &Transformer,
    tokenizer: &dyn Renderer,
    requests: &[GroupRequest],
    priors: Option<&[Option<&PromptKv>]>,
    params: &SamplingParams,
    seed: u64,
    choose_on: ChooseOn,
) -> anyhow::Result<Reused> {
    let mut rows = Vec::new();
    for (r, q) in requests.iter().enumerate() {
        anyhow::ensure!(!q.prompt.is_empty(), "prompt {r} is empty");
        for j in 0..q.num {
            rows.push((r, row_rng(seed, q.stream_prompt, q.first_sample + j)));
        }
    }
    let owner: Vec<usize> = rows.iter().map(|r| r.0).collect();
    let prompts: Vec<&[u32]> = requests.iter().map(|q| q.prompt).collect();
    let setup = engine::Setup {
        prompts: &prompts,
        rows,
        priors,
        keep_prompt_kv: priors.is_some(),
        multi_turn: false,
        max_turn_tokens: 0,
        choose_on,
    };
    let mut source = engine::OneTurn {
        ends: vec![None; owner.len()],
    };
    let out = engine::run(model, tokenizer, params, setup, &mut source)?;
    let mut completions: Vec<Vec<Completion>> =
        requests.iter().map(|q| Vec::with_capacity(q.num)).collect();
    for ((t, end), r) in out.trajectories.into_iter().zip(source.ends).zip(owner) {
        completions[r].push(completion(t, end, tokenizer)?);
    }
    Ok((completions, out.stats, out.prompt_kv))
}

/// A single turn as a completion: a stop token ends it as `Eos`, a stop string as
/// `Stop` (the text cut before it), the budget as `Length`.
fn completion(
    t: Trajectory,
    end: Option<TurnEnd>,
    tokenizer: &dyn Renderer,
) -> anyhow::Result<Completion> {
    let (finish_reason, text) = match end {
        Some(TurnEnd::Turn {
            text,
            stop: Some(_),
        }) => (FinishReason::Eos, text),
        Some(TurnEnd::Turn { text, stop: None }) => (FinishReason::Stop, text),
        Some(TurnEnd::Truncated) | None => (FinishReason::Length, tokenizer.decode(&t.ids)?),
    };
    Ok(Completion {
        ids: t.ids,
        text,
        finish_reason,
        sample_logprobs: t.sample_logprobs,
        full_logprobs: t.full_logprobs,
    })
}

/// Prefill: the prefix every prompt shares once, then one left-padded batch of the
/// distinct suffixes after it (masked padding between prefix and suffix is never
/// attended to, and RoPE positions count real tokens only). Returns the cache (room
/// for `extra` more columns) and every prompt's last-position logits.
pub(crate) fn prefill_shared(
    model: &Transformer,
    prompts: &[&[u32]],
    extra: usize,
    stats: &mut SampleStats,
) -> anyhow::Result<(crate::model::KvCache, Tensor)> {
    let device = model.device().clone();
    let lmax = prompts.iter().map(|pr| pr.len()).max().unwrap_or(1);
    let shared = shared_prefix_len(prompts);
    let p = prompts.len();
    let suffixes: Vec<&[u32]> = prompts.iter().map(|pr| &pr[shared..]).collect();
    let (ids, mask, smax) = left_padded(&suffixes);
    stats.prefill_tokens += prompts.iter().map(|pr| pr.len()).sum::<usize>();
    let mut cache = if shared > 0 {
        stats.shared_prefix_tokens = shared * (p - 1);
        let mut one = model.new_cache(1, lmax + extra)?;
        let prefix = Tensor::from_vec(prompts[0][..shared].to_vec(), (1, shared), &device)?;
        drop(
            model
                .forward(Input::cached(&prefix, None, &mut one), Mode::Detached)?
                .rows,
        );
        one.select_rows(&vec![0; p])?
    } else {
        model.new_cache(p, lmax + extra)?
    };
    let ids_t = Tensor::from_vec(ids, (p, smax), &device)?;
    let all_real = mask.iter().all(|&m| m != 0);
    let hidden = model
        .forward(
            Input::cached(
                &ids_t,
                if all_real { None } else { Some(&mask) },
                &mut cache,
            ),
            Mode::Detached,
        )?
        .rows;
    let logits = model.last_logits(&hidden)?;
    Ok((cache, logits))
}

/// `rows` left-padded to the longest: `(ids, mask, width)`, row-major, mask 1 on real
/// tokens (padding ids are 0).
pub(crate) fn left_padded(rows: &[&[u32]]) -> (Vec<u32>, Vec<u8>, usize) {
    let w = rows.iter().map(|r| r.len()).max().unwrap_or(0);
    let mut ids = vec![0u32; rows.len() * w];
    let mut mask = vec![0u8; rows.len() * w];
    for (i, r) in rows.iter().enumerate() {
        let off = i * w + w - r.len();
        ids[off..off + r.len()].copy_from_slice(r);
        mask[off..off + r.len()].iter_mut().for_each(|m| *m = 1);
    }
    (ids, mask, w)
}

/// Shortest shared prefix worth prefilling once (below it, one more forward call costs
/// more than it saves).
const MIN_SHARED_PREFIX: usize = 16;

/// Length of the token prefix all `prompts` share, leaving every prompt at least one
/// token of its own (the prefill must produce each prompt's last-position logits);
/// 0 when there is one prompt or the prefix is shorter than [`MIN_SHARED_PREFIX`].
fn shared_prefix_len(prompts: &[&[u32]]) -> usize {
    let Some((first, rest)) = prompts.split_first() else {
        return 0;
    };
    if rest.is_empty() {
        return 0;
    }
    let mut n = prompts
        .iter()
        .map(|p| p.len())
        .min()
        .unwrap_or(0)
        .saturating_sub(1);
    for p in rest {
        n = n.min(
            first
                .iter()
                .zip(p.iter())
                .take_while(|(a, b)| a == b)
                .count(),
        );
    }
    if n >= MIN_SHARED_PREFIX {
        n
    } else {
        0
    }
}

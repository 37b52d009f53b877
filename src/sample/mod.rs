//! Batched KV-cache sampling of G completions per prompt.
//!
//! - [`params`]: what a call does ([`SamplingParams`]) and returns ([`Completion`]);
//! - [`row`]: the host token chooser ([`RowSampler`]) and the per-completion RNG
//!   streams ([`row_rng`]), so results do not depend on batch composition;
//! - [`stop`]: how a completion ends (stop tokens, stop strings across token boundaries,
//!   the budget);
//! - [`device`]: the same token choice as tensor ops on the model's device;
//! - this module: the batched sampler over the model ([`sample_groups`],
//!   [`sample_requests`]) with one prefill per prompt and a shared KV cache;
//! - [`turns`]: multi-turn sampling, model turns alternating with outside (environment)
//!   turns on one KV cache ([`sample_turns`]);
//! - [`generate`]: the `concord generate` and `concord bench sample` entry points.
//!
//! Processing order follows transformers' `generate`: repetition penalty, then
//! min-new-tokens suppression of the stop tokens, then temperature, top-k, top-p and
//! min-p, each filter acting on what the previous one left.
use std::time::Instant;

use candle_core::{DType, Tensor};
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use crate::model::qwen2::Qwen2;
use crate::model::tokenizer::Renderer;

mod device;
pub mod generate;
pub mod params;
pub mod reuse;
pub mod row;
pub mod stop;
pub mod turns;

pub use device::DeviceSampler;
pub use generate::{
    bench, generate, peak_rss_mib, BenchSampleOptions, BenchSampleReport, GenerateOptions,
    Generated, PromptSource,
};
pub use params::{Completion, FinishReason, SamplingOverrides, SamplingParams};
pub use reuse::PromptKv;
pub use row::{row_rng, Choice, RowSampler};
pub use stop::{check_finish, completion_text, StopMatcher};
pub use turns::{sample_turns, Reply, Trajectory, TurnEnd, TurnEvent, TurnRow, TurnSource};

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
    model: &Qwen2,
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
    model: &Qwen2,
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

/// Per-completion state during decoding.
struct Row {
    /// Index of the request (prompt) in the batch.
    req: usize,
    rng: ChaCha8Rng,
    ids: Vec<u32>,
    sample_lps: Vec<f32>,
    full_lps: Vec<f32>,
    /// Prompt + completion, only when the repetition penalty is on.
    context: Vec<u32>,
    stop: StopMatcher,
    finish: Option<FinishReason>,
    text: Option<String>,
    pending: Option<Choice>,
}

/// Chooses the next token of every row in `rows` from `logits` (`rows.len()` rows of
/// `vocab`), spread over `samplers.len()` threads.
fn choose_all(
    rows: &mut [&mut Row],
    logits: &[f32],
    vocab: usize,
    params: &SamplingParams,
    samplers: &mut [RowSampler],
) {
    let n = rows.len();
    let threads = samplers.len().clamp(1, n.max(1));
    let per = n.div_ceil(threads).max(1);
    let work = |rows: &mut [&mut Row], logits: &[f32], s: &mut RowSampler| {
        for (k, row) in rows.iter_mut().enumerate() {
            let l = &logits[k * vocab..(k + 1) * vocab];
            let ctx: &[u32] = &row.context;
            let generated = row.ids.len();
            let c = s.choose(l, params, ctx, generated, &mut row.rng);
            row.pending = Some(c);
        }
    };
    if threads <= 1 {
        work(rows, logits, &mut samplers[0]);
        return;
    }
    std::thread::scope(|scope| {
        let mut rest_rows = rows;
        let mut rest_logits = logits;
        for s in samplers.iter_mut().take(threads) {
            let k = per.min(rest_rows.len());
            if k == 0 {
                break;
            }
            let (r, rr) = rest_rows.split_at_mut(k);
            let (l, rl) = rest_logits.split_at(k * vocab);
            rest_rows = rr;
            rest_logits = rl;
            scope.spawn(move || work(r, l, s));
        }
    });
}

/// Applies the pending choice of a row; returns true when the row just finished.
fn commit(row: &mut Row, params: &SamplingParams, tok: &dyn Renderer) -> anyhow::Result<bool> {
    let Some(c) = row.pending.take() else {
        return Ok(false);
    };
    row.ids.push(c.token);
    row.sample_lps.push(c.sample_logprob);
    row.full_lps.push(c.full_logprob);
    if params.repetition_penalty != 1.0 {
        row.context.push(c.token);
    }
    match check_finish(&row.ids, params, &mut row.stop, tok)? {
        Some((finish, text)) => {
            row.finish = Some(finish);
            row.text = text;
            Ok(true)
        }
        None => Ok(false),
    }
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
    fn resolve(self, device: &candle_core::Device) -> ChooseOn {
        match self {
            ChooseOn::Auto if device.is_cpu() => ChooseOn::Host,
            ChooseOn::Auto => ChooseOn::Device,
            other => other,
        }
    }
}

/// The token chooser of one sampling call.
enum Chooser {
    Host(Vec<RowSampler>),
    Device(DeviceSampler),
}

impl Chooser {
    /// Sets `rows[j].pending` from row `live[j]` of `logits` (`[n, V]`, on the model's
    /// device); the other rows of `logits` belong to finished completions.
    fn choose(
        &mut self,
        logits: &Tensor,
        live: &[usize],
        rows: &mut [&mut Row],
        params: &SamplingParams,
    ) -> anyhow::Result<()> {
        let (n, vocab) = logits.dims2()?;
        match self {
            Chooser::Host(samplers) => {
                let logits = logits
                    .to_dtype(DType::F32)?
                    .flatten_all()?
                    .to_vec1::<f32>()?;
                if live.len() == n {
                    choose_all(rows, &logits, vocab, params, samplers);
                } else {
                    let mut g = Vec::with_capacity(live.len() * vocab);
                    for &k in live {
                        g.extend_from_slice(&logits[k * vocab..(k + 1) * vocab]);
                    }
                    choose_all(rows, &g, vocab, params, samplers);
                }
            }
            Chooser::Device(sampler) => {
                let mut uniforms = vec![0.5f64; n];
                if !params.is_greedy() {
                    for (row, &k) in rows.iter_mut().zip(live) {
                        uniforms[k] = row.rng.gen::<f64>();
                    }
                }
                // every running completion started together: one count for all
                let generated = rows.first().map_or(0, |r| r.ids.len());
                let choices = sampler.choose(logits, &uniforms, generated)?;
                for (row, &k) in rows.iter_mut().zip(live) {
                    row.pending = Some(choices[k]);
                }
            }
        }
        Ok(())
    }

    /// Keeps per-row state for rows `keep` of the current batch, in that order.
    fn select_rows(&mut self, keep: &[usize]) -> anyhow::Result<()> {
        match self {
            Chooser::Host(_) => Ok(()),
            Chooser::Device(sampler) => sampler.select_rows(keep),
        }
    }
}

/// The general batched sampler: every request's prompt is prefilled once (all prompts
/// in one left-padded batch), its KV cache rows are expanded to its completions, and
/// all completions decode together, one token per step, with finished rows dropped
/// from the batch. Detached throughout (no autograd graph).
pub fn sample_requests(
    model: &Qwen2,
    tokenizer: &dyn Renderer,
    requests: &[GroupRequest],
    params: &SamplingParams,
    seed: u64,
) -> anyhow::Result<(Vec<Vec<Completion>>, SampleStats)> {
    sample_requests_on(model, tokenizer, requests, params, seed, ChooseOn::Auto)
}

/// [`sample_requests`] with the token choice made where `choose_on` says.
pub fn sample_requests_on(
    model: &Qwen2,
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
    model: &Qwen2,
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

fn sample_core(
    model: &Qwen2,
    tokenizer: &dyn Renderer,
    requests: &[GroupRequest],
    priors: Option<&[Option<&PromptKv>]>,
    params: &SamplingParams,
    seed: u64,
    choose_on: ChooseOn,
) -> anyhow::Result<Reused> {
    params.validate()?;
    let mut kept: Vec<Option<PromptKv>> = vec![None; requests.len()];
    let mut stats = SampleStats::default();
    let mut rows: Vec<Row> = Vec::new();
    for (r, q) in requests.iter().enumerate() {
        anyhow::ensure!(!q.prompt.is_empty(), "prompt {r} is empty");
        for j in 0..q.num {
            rows.push(Row {
                req: r,
                rng: row_rng(seed, q.stream_prompt, q.first_sample + j),
                ids: Vec::new(),
                sample_lps: Vec::new(),
                full_lps: Vec::new(),
                context: if params.repetition_penalty != 1.0 {
                    q.prompt.to_vec()
                } else {
                    Vec::new()
                },
                stop: StopMatcher::new(&params.stop_strings),
                finish: None,
                text: None,
                pending: None,
            });
        }
    }
    if params.max_new_tokens == 0 {
        for row in &mut rows {
            row.finish = Some(FinishReason::Length);
        }
    }
    // Requests that have at least one completion to sample.
    let live_reqs: Vec<usize> = (0..requests.len())
        .filter(|&r| requests[r].num > 0 && params.max_new_tokens > 0)
        .collect();
    if !live_reqs.is_empty() {
        let device = model.device().clone();
        let t0 = Instant::now();
        let live_prompts: Vec<&[u32]> = live_reqs.iter().map(|&r| requests[r].prompt).collect();
        let live_priors: Vec<Option<&PromptKv>> = live_reqs
            .iter()
            .map(|&r| priors.and_then(|p| p[r]))
            .collect();
        let (cache, prompt_logits) = if live_priors.iter().any(Option::is_some) {
            let extra = params.max_new_tokens;
            reuse::prefill_continuing(model, &live_prompts, &live_priors, extra, &mut stats)?
        } else {
            prefill_shared(model, &live_prompts, params.max_new_tokens, &mut stats)?
        };
        if priors.is_some() {
            for (i, &r) in live_reqs.iter().enumerate() {
                let tokens = live_prompts[i].to_vec();
                kept[r] = Some(PromptKv {
                    tokens,
                    kv: cache.row_real(i)?,
                });
            }
        }
        stats.prefill_seconds = t0.elapsed().as_secs_f64();
        let t1 = Instant::now();

        // ---- first token of every completion from its prompt's prefill logits
        let slot_of_req: std::collections::HashMap<usize, usize> =
            live_reqs.iter().enumerate().map(|(i, &r)| (r, i)).collect();
        // batch order: rows in order, each pointing at its prompt's cache row
        let mut active: Vec<usize> = (0..rows.len())
            .filter(|&i| rows[i].finish.is_none())
            .collect();
        let mut chooser = match choose_on.resolve(&device) {
            ChooseOn::Device => {
                let vocab = prompt_logits.dim(1)?;
                let mut s = DeviceSampler::new(params, vocab, &device)?;
                let contexts: Vec<&[u32]> = active
                    .iter()
                    .map(|&i| requests[rows[i].req].prompt)
                    .collect();
                s.set_contexts(&contexts)?;
                Chooser::Device(s)
            }
            _ => {
                let threads = candle_core::utils::get_num_threads().max(1);
                Chooser::Host(vec![RowSampler::new(); threads])
            }
        };
        {
            // each active row reads its prompt's logits
            let slots: Vec<u32> = active
                .iter()
                .map(|&i| slot_of_req[&rows[i].req] as u32)
                .collect();
            let slots = Tensor::from_vec(slots, active.len(), &device)?;
            let logits = prompt_logits.index_select(&slots, 0)?;
            let live: Vec<usize> = (0..active.len()).collect();
            let mut refs = rows_in_order(&mut rows, &active);
            chooser.choose(&logits, &live, &mut refs, params)?;
        }
        drop(prompt_logits);
        for &i in &active {
            commit(&mut rows[i], params, tokenizer)?;
        }
        // expand the prompt cache rows to the completions still running
        let running: Vec<usize> = (0..active.len())
            .filter(|&k| rows[active[k]].finish.is_none())
            .collect();
        let cache_rows: Vec<usize> = running
            .iter()
            .map(|&k| slot_of_req[&rows[active[k]].req])
            .collect();
        chooser.select_rows(&running)?;
        active.retain(|&i| rows[i].finish.is_none());
        if !active.is_empty() {
            let mut cache = cache.select_rows(&cache_rows)?;
            // `batch[k]` = row index held by cache row k; None = finished, masked out.
            let mut batch: Vec<Option<usize>> = active.iter().map(|&i| Some(i)).collect();
            loop {
                let n = batch.len();
                let mut step_ids = Vec::with_capacity(n);
                let mut step_mask = Vec::with_capacity(n);
                for slot in &batch {
                    match slot {
                        Some(i) => {
                            step_ids.push(*rows[*i].ids.last().unwrap_or(&0));
                            step_mask.push(1u8);
                        }
                        None => {
                            step_ids.push(0);
                            step_mask.push(0u8);
                        }
                    }
                }
                let all_real = step_mask.iter().all(|&m| m != 0);
                let ids_t = Tensor::from_vec(step_ids, (n, 1), &device)?;
                let hidden = model.forward_cached(
                    &ids_t,
                    if all_real { None } else { Some(&step_mask) },
                    &mut cache,
                )?;
                let logits = model.last_logits(&hidden)?;
                stats.decode_steps += 1;
                stats.row_steps += n;
                // choose for live rows (keeping cache order)
                let live: Vec<usize> = (0..n).filter(|&k| batch[k].is_some()).collect();
                {
                    let want: Vec<usize> = live.iter().filter_map(|&k| batch[k]).collect();
                    let mut refs = rows_in_order(&mut rows, &want);
                    chooser.choose(&logits, &live, &mut refs, params)?;
                }
                let mut dead = 0;
                for slot in batch.iter_mut() {
                    if let Some(i) = *slot {
                        if commit(&mut rows[i], params, tokenizer)? {
                            *slot = None;
                        }
                    }
                    if slot.is_none() {
                        dead += 1;
                    }
                }
                if dead == n {
                    break;
                }
                // Compact once enough rows are done (a masked row still costs compute).
                if dead > 0 && dead * 8 >= n {
                    let keep: Vec<usize> = (0..n).filter(|&k| batch[k].is_some()).collect();
                    cache = cache.select_rows(&keep)?;
                    chooser.select_rows(&keep)?;
                    batch = keep.iter().map(|&k| batch[k]).collect();
                }
            }
        }
        stats.decode_seconds = t1.elapsed().as_secs_f64();
    }

    // ---- assemble
    let mut out: Vec<Vec<Completion>> =
        requests.iter().map(|q| Vec::with_capacity(q.num)).collect();
    for row in rows {
        let finish = row.finish.unwrap_or(FinishReason::Length);
        stats.new_tokens += row.ids.len();
        let text = completion_text(&row.ids, finish, row.text, tokenizer)?;
        out[row.req].push(Completion {
            ids: row.ids,
            text,
            finish_reason: finish,
            sample_logprobs: row.sample_lps,
            full_logprobs: row.full_lps,
        });
    }
    Ok((out, stats, kept))
}

/// Prefill: the prefix every prompt shares once, then one left-padded batch of the
/// distinct suffixes after it (masked padding between prefix and suffix is never
/// attended to, and RoPE positions count real tokens only). Returns the cache (room
/// for `extra` more columns) and every prompt's last-position logits.
fn prefill_shared(
    model: &Qwen2,
    prompts: &[&[u32]],
    extra: usize,
    stats: &mut SampleStats,
) -> anyhow::Result<(crate::model::qwen2::KvCache, Tensor)> {
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
        drop(model.forward_cached(&prefix, None, &mut one)?);
        one.select_rows(&vec![0; p])?
    } else {
        model.new_cache(p, lmax + extra)?
    };
    let ids_t = Tensor::from_vec(ids, (p, smax), &device)?;
    let all_real = mask.iter().all(|&m| m != 0);
    let hidden = model.forward_cached(
        &ids_t,
        if all_real { None } else { Some(&mask) },
        &mut cache,
    )?;
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

/// Mutable references to `rows[want[0]], rows[want[1]], ...` (distinct indices), in
/// that order.
fn rows_in_order<'a>(rows: &'a mut [Row], want: &[usize]) -> Vec<&'a mut Row> {
    let mut slots: Vec<Option<&'a mut Row>> = rows.iter_mut().map(Some).collect();
    want.iter()
        .filter_map(|&i| slots.get_mut(i).and_then(|s| s.take()))
        .collect()
}

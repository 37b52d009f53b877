//! Multi-turn sampling: every row is one conversation in which model turns alternate
//! with turns supplied from outside (an environment), all on one KV cache.
//!
//! - Each row starts from a prompt (identical prompts are prefilled once and their
//!   cache rows expanded, as in [`super::sample_requests`]) and samples a model turn
//!   until a stop token or stop string.
//! - The finished turn goes to the [`TurnSource`], which answers with the next
//!   outside turn's token ids ([`Reply::Continue`]), with [`Reply::Done`], or not yet
//!   (the row waits, masked, e.g. for the other seats of a simultaneous game).
//! - The reply's ids are appended to the row's ids and fed to the cache together with
//!   the turn's last sampled token (left-padded with the other rows' inputs, so the
//!   last column is always a real token): nothing is prefilled again and no text is
//!   re-tokenised. Rows that are done are dropped from the cache. When the cache is
//!   full it is compacted (every row's real columns moved left, when padding holds at
//!   least half of them) before it grows.
//! - `max_turn_tokens` (0: off) ends a model turn after that many tokens, as a stop
//!   string would (the text is what was sampled).
//! - `max_new_tokens` caps a row's whole completion (model and outside tokens): a
//!   model turn that reaches it, or a reply that would not leave room for one more
//!   model token, ends the row as truncated ([`TurnEnd::Truncated`] is reported).
//!
//! Every row draws from its own RNG stream ([`super::row_rng`]), so a row's
//! trajectory does not depend on what else is in the batch. The chooser is the one of
//! [`super::sample_requests_on`]; the repetition penalty and `min_new_tokens` (counted
//! per model turn) force the host chooser, whose contexts include outside tokens.
use std::collections::HashMap;
use std::time::Instant;

use anyhow::{ensure, Result};
use candle_core::{DType, Tensor};
use rand::Rng;
use rand_chacha::ChaCha8Rng;

use super::{row_rng, ChooseOn, DeviceSampler, RowSampler, SampleStats, SamplingParams};
use super::{stop::StopMatcher, Choice};
use crate::model::qwen2::Qwen2;
use crate::model::tokenizer::Renderer;

/// One conversation to sample: its prompt (an index into the prompt list) and its RNG
/// stream `row_rng(seed, stream.0, stream.1)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TurnRow {
    pub prompt: usize,
    pub stream: (usize, usize),
}

/// How a row's model turn ended.
#[derive(Debug, Clone, PartialEq)]
pub enum TurnEnd {
    /// A stop token (`stop`, kept as the turn's last id) or a stop string (`stop` None,
    /// the text cut before it) ended the turn; `text` is what the model said.
    Turn { text: String, stop: Option<u32> },
    /// The completion budget ran out: the row is finished and truncated.
    Truncated,
}

/// A row's model turn ended.
#[derive(Debug, Clone, PartialEq)]
pub struct TurnEvent {
    pub row: usize,
    pub end: TurnEnd,
}

/// The outside side's answer for one row.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    /// Append these ids (an outside turn ending in the generation prompt) and sample
    /// the next model turn.
    Continue(Vec<u32>),
    /// The conversation is over.
    Done,
}

/// The outside side of the conversations (an environment and a chat template).
pub trait TurnSource {
    /// Rows whose model turns ended (in row order); returns replies for any rows (rows
    /// without a reply wait). Truncated rows are finished whatever the reply.
    fn on_turns(&mut self, events: &[TurnEvent]) -> Result<Vec<(usize, Reply)>>;
}

/// One sampled conversation after its prompt.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Trajectory {
    /// Completion ids: model turns and outside turns, in order.
    pub ids: Vec<u32>,
    /// Per id: 1 for model tokens, 0 for outside tokens.
    pub env_mask: Vec<f32>,
    /// Per id: the sampler's log-prob under softmax(logits / T) (0 for outside tokens).
    pub full_logprobs: Vec<f32>,
    /// Per id: the log-prob under the processed distribution (0 for outside tokens).
    pub sample_logprobs: Vec<f32>,
    /// Ended by the budget rather than by the source.
    pub truncated: bool,
    /// Model turns sampled (a turn cut by the budget counts).
    pub model_turns: usize,
    /// Every id fed to the model after the prompt, in order (what the cache holds).
    pub fed: Vec<u32>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Generating,
    Waiting,
    Done,
}

struct Row {
    rng: ChaCha8Rng,
    t: Trajectory,
    /// Where the current model turn starts in `t.ids`.
    turn_start: usize,
    /// Ids to feed at the next forward (not yet in the cache).
    feed: Vec<u32>,
    /// Prompt and completion so far (host repetition penalty only).
    context: Vec<u32>,
    stop: StopMatcher,
    state: State,
}

/// Samples every row's conversation (row streams keyed by `params.seed`); returns the
/// trajectories in row order.
#[allow(clippy::too_many_arguments)]
pub fn sample_turns(
    model: &Qwen2,
    renderer: &dyn Renderer,
    prompts: &[Vec<u32>],
    rows: &[TurnRow],
    params: &SamplingParams,
    max_turn_tokens: usize,
    source: &mut dyn TurnSource,
    choose_on: ChooseOn,
) -> Result<(Vec<Trajectory>, SampleStats)> {
    params.validate()?;
    let seed = params.seed;
    let mut stats = SampleStats::default();
    let budget = params.max_new_tokens;
    let penalty = params.repetition_penalty != 1.0;
    let mut st: Vec<Row> = Vec::with_capacity(rows.len());
    for (i, r) in rows.iter().enumerate() {
        let p = prompts
            .get(r.prompt)
            .ok_or_else(|| anyhow::anyhow!("row {i}: no prompt {}", r.prompt))?;
        ensure!(!p.is_empty(), "prompt {} is empty", r.prompt);
        st.push(Row {
            rng: row_rng(seed, r.stream.0, r.stream.1),
            t: Trajectory::default(),
            turn_start: 0,
            feed: Vec::new(),
            context: if penalty { p.clone() } else { Vec::new() },
            stop: StopMatcher::new(&params.stop_strings),
            state: if budget == 0 {
                State::Done
            } else {
                State::Generating
            },
        });
    }
    if budget == 0 {
        for s in &mut st {
            s.t.truncated = true;
        }
        return Ok((st.into_iter().map(|s| s.t).collect(), stats));
    }
    if rows.is_empty() {
        return Ok((Vec::new(), stats));
    }
    let device = model.device().clone();
    let on = if penalty || params.min_new_tokens > 0 {
        ChooseOn::Host
    } else {
        choose_on.resolve(&device)
    };
    let mut host = vec![RowSampler::new(); candle_core::utils::get_num_threads().max(1)];
    let mut dev: Option<DeviceSampler> = None;

    // ---- prefill the distinct prompts used
    let t0 = Instant::now();
    let mut used: Vec<usize> = rows.iter().map(|r| r.prompt).collect();
    used.sort_unstable();
    used.dedup();
    let slot: HashMap<usize, usize> = used.iter().enumerate().map(|(i, &p)| (p, i)).collect();
    let lmax = used.iter().map(|&p| prompts[p].len()).max().unwrap_or(1);
    let mut ids = vec![0u32; used.len() * lmax];
    let mut mask = vec![0u8; used.len() * lmax];
    for (i, &p) in used.iter().enumerate() {
        let pr = &prompts[p];
        let off = i * lmax + (lmax - pr.len());
        ids[off..off + pr.len()].copy_from_slice(pr);
        mask[off..off + pr.len()].iter_mut().for_each(|m| *m = 1);
        stats.prefill_tokens += pr.len();
    }
    let mut cache = model.new_cache(used.len(), lmax + budget.min(4096))?;
    let ids_t = Tensor::from_vec(ids, (used.len(), lmax), &device)?;
    let all_real = mask.iter().all(|&m| m != 0);
    let hidden = model.forward_cached(&ids_t, (!all_real).then_some(&mask[..]), &mut cache)?;
    let prompt_logits = model.last_logits(&hidden)?;
    drop(hidden);
    stats.prefill_seconds = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();

    // ---- expand to one cache row per conversation
    let cache_rows: Vec<usize> = rows.iter().map(|r| slot[&r.prompt]).collect();
    let sel = Tensor::from_vec(
        cache_rows.iter().map(|&s| s as u32).collect::<Vec<_>>(),
        rows.len(),
        &device,
    )?;
    let mut logits = prompt_logits.index_select(&sel, 0)?;
    drop(prompt_logits);
    let mut cache = cache.select_rows(&cache_rows)?;
    if on == ChooseOn::Device {
        let vocab = logits.dim(1)?;
        dev = Some(DeviceSampler::new(params, vocab, &device)?);
    }
    // `batch[k]`: the row held by cache row k.
    let mut batch: Vec<usize> = (0..rows.len()).collect();
    loop {
        // choose for the generating rows
        let live: Vec<usize> = (0..batch.len())
            .filter(|&k| st[batch[k]].state == State::Generating)
            .collect();
        let choices = choose(
            &logits,
            &live,
            &batch,
            &mut st,
            params,
            &mut host,
            dev.as_mut(),
        )?;
        stats.new_tokens += choices.len();
        let mut events = Vec::new();
        for (&k, c) in live.iter().zip(choices) {
            let i = batch[k];
            if let Some(e) = commit(i, &mut st[i], c, params, budget, max_turn_tokens, renderer)? {
                events.push(e);
            }
        }
        // hand ended turns to the source until nothing more changes
        while !events.is_empty() {
            events.sort_by_key(|e| e.row);
            let replies = source.on_turns(&events)?;
            events.clear();
            for (i, reply) in replies {
                let Some(r) = st.get_mut(i) else {
                    anyhow::bail!("the turn source replied for row {i} of {}", rows.len());
                };
                if r.state != State::Waiting {
                    continue;
                }
                match reply {
                    Reply::Done => r.state = State::Done,
                    Reply::Continue(env) => {
                        if r.t.ids.len() + env.len() >= budget {
                            r.state = State::Done;
                            r.t.truncated = true;
                            events.push(TurnEvent {
                                row: i,
                                end: TurnEnd::Truncated,
                            });
                            continue;
                        }
                        r.t.ids.extend_from_slice(&env);
                        r.t.env_mask.extend(std::iter::repeat_n(0.0, env.len()));
                        r.t.full_logprobs
                            .extend(std::iter::repeat_n(0.0, env.len()));
                        r.t.sample_logprobs
                            .extend(std::iter::repeat_n(0.0, env.len()));
                        if penalty {
                            r.context.extend_from_slice(&env);
                        }
                        r.feed.extend_from_slice(&env);
                        r.turn_start = r.t.ids.len();
                        r.stop = StopMatcher::new(&params.stop_strings);
                        r.state = State::Generating;
                    }
                }
            }
        }
        // drop finished rows from the cache (a masked row still costs compute)
        let keep: Vec<usize> = (0..batch.len())
            .filter(|&k| st[batch[k]].state != State::Done)
            .collect();
        if keep.is_empty() {
            break;
        }
        if keep.len() < batch.len() {
            cache = cache.select_rows(&keep)?;
            if let Some(d) = dev.as_mut() {
                d.select_rows(&keep)?;
            }
            batch = keep.iter().map(|&k| batch[k]).collect();
        }
        ensure!(
            batch.iter().any(|&i| st[i].state == State::Generating),
            "every unfinished conversation waits for the turn source: it never replied"
        );
        // feed: the generating rows' new ids, left-padded to a common width
        let width = batch
            .iter()
            .filter(|&&i| st[i].state == State::Generating)
            .map(|&i| st[i].feed.len())
            .max()
            .unwrap_or(1);
        if cache.len() + width > cache.max_len() {
            // reclaim the columns padding left behind before growing
            let real = cache.max_real_columns();
            if 2 * real <= cache.len() {
                cache = cache.compact()?;
            }
            if cache.len() + width > cache.max_len() {
                cache = cache.grow(width.max(cache.max_len() / 2))?;
            }
        }
        let n = batch.len();
        let mut ids = vec![0u32; n * width];
        let mut mask = vec![0u8; n * width];
        for (k, &i) in batch.iter().enumerate() {
            let r = &mut st[i];
            if r.state != State::Generating {
                continue;
            }
            let off = k * width + width - r.feed.len();
            ids[off..off + r.feed.len()].copy_from_slice(&r.feed);
            mask[off..off + r.feed.len()]
                .iter_mut()
                .for_each(|m| *m = 1);
            r.t.fed.append(&mut r.feed);
        }
        let all_real = mask.iter().all(|&m| m != 0);
        let ids_t = Tensor::from_vec(ids, (n, width), &device)?;
        let hidden = model.forward_cached(&ids_t, (!all_real).then_some(&mask[..]), &mut cache)?;
        logits = model.last_logits(&hidden)?;
        stats.decode_steps += 1;
        stats.row_steps += n * width;
    }
    stats.decode_seconds = t1.elapsed().as_secs_f64();
    Ok((st.into_iter().map(|s| s.t).collect(), stats))
}

/// The choices of cache rows `live` (rows `batch[k]`) from `logits` `[batch, V]`.
fn choose(
    logits: &Tensor,
    live: &[usize],
    batch: &[usize],
    st: &mut [Row],
    params: &SamplingParams,
    host: &mut [RowSampler],
    dev: Option<&mut DeviceSampler>,
) -> Result<Vec<Choice>> {
    if live.is_empty() {
        return Ok(Vec::new());
    }
    let (n, vocab) = logits.dims2()?;
    match dev {
        Some(d) => {
            let mut uniforms = vec![0.5f64; n];
            if !params.is_greedy() {
                for &k in live {
                    uniforms[k] = st[batch[k]].rng.gen::<f64>();
                }
            }
            let all = d.choose(logits, &uniforms, 0)?;
            Ok(live.iter().map(|&k| all[k]).collect())
        }
        None => {
            let sel = Tensor::from_vec(
                live.iter().map(|&k| k as u32).collect::<Vec<_>>(),
                live.len(),
                logits.device(),
            )?;
            let l = logits
                .index_select(&sel, 0)?
                .to_dtype(DType::F32)?
                .flatten_all()?
                .to_vec1::<f32>()?;
            // the live rows, in `live` order, spread over the samplers' threads
            let mut slots: Vec<Option<&mut Row>> = st.iter_mut().map(Some).collect();
            let mut refs: Vec<&mut Row> = live
                .iter()
                .filter_map(|&k| slots.get_mut(batch[k]).and_then(Option::take))
                .collect();
            ensure!(
                refs.len() == live.len(),
                "a live row appears twice in the batch"
            );
            let per = live.len().div_ceil(host.len().max(1));
            let mut out: Vec<Option<Choice>> = vec![None; live.len()];
            let work = |rows: &mut [&mut Row],
                        l: &[f32],
                        out: &mut [Option<Choice>],
                        s: &mut RowSampler| {
                for ((r, o), lrow) in rows.iter_mut().zip(out).zip(l.chunks(vocab)) {
                    let generated = r.t.ids.len() - r.turn_start;
                    *o = Some(s.choose(lrow, params, &r.context, generated, &mut r.rng));
                }
            };
            std::thread::scope(|scope| {
                for (((rows, l), o), s) in refs
                    .chunks_mut(per)
                    .zip(l.chunks(per * vocab))
                    .zip(out.chunks_mut(per))
                    .zip(host.iter_mut())
                {
                    scope.spawn(move || work(rows, l, o, s));
                }
            });
            Ok(out
                .into_iter()
                .map(|c| c.expect("every live row chosen"))
                .collect())
        }
    }
}

/// Appends row `i`'s choice; returns the event when its model turn ended.
fn commit(
    i: usize,
    r: &mut Row,
    c: Choice,
    params: &SamplingParams,
    budget: usize,
    max_turn: usize,
    renderer: &dyn Renderer,
) -> Result<Option<TurnEvent>> {
    if r.t.ids.len() == r.turn_start {
        r.t.model_turns += 1;
    }
    r.t.ids.push(c.token);
    r.t.env_mask.push(1.0);
    r.t.full_logprobs.push(c.full_logprob);
    r.t.sample_logprobs.push(c.sample_logprob);
    if params.repetition_penalty != 1.0 {
        r.context.push(c.token);
    }
    r.feed = vec![c.token];
    let turn = &r.t.ids[r.turn_start..];
    let end = if params.stop_token_ids.contains(&c.token) && turn.len() > params.min_new_tokens {
        let text = renderer.decode(&turn[..turn.len() - 1])?;
        Some(TurnEnd::Turn {
            text,
            stop: Some(c.token),
        })
    } else {
        let cut = if r.stop.is_active() {
            let text = renderer.decode(turn)?;
            r.stop.check(&text).map(|p| text[..p].to_string())
        } else {
            None
        };
        match cut {
            Some(text) => Some(TurnEnd::Turn { text, stop: None }),
            None if max_turn > 0 && turn.len() >= max_turn => Some(TurnEnd::Turn {
                text: renderer.decode(turn)?,
                stop: None,
            }),
            None => None,
        }
    };
    // A turn that ends at the budget still goes to the source: the episode may end
    // there; a reply that does not fit truncates it then.
    let end = match end {
        Some(e) => {
            r.state = State::Waiting;
            Some(e)
        }
        None if r.t.ids.len() >= budget => {
            r.t.truncated = true;
            r.state = State::Done;
            Some(TurnEnd::Truncated)
        }
        None => None,
    };
    Ok(end.map(|end| TurnEvent { row: i, end }))
}

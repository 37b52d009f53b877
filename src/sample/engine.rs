//! The one prefill + decode engine of the sampler. A call is a set of rows, each a
//! conversation from a prompt: the distinct prompts are prefilled once (one
//! left-padded batch; the prefix they all share once, or on top of an earlier prompt's
//! KV, [`super::reuse`]), each row's cache is expanded from its prompt's, and all rows
//! decode together, one token per step, each choosing on its own RNG stream.
//!
//! What differs between a single decision ([`super::sample_requests`]) and a
//! multi-turn episode ([`super::sample_turns`]) is what happens when a model turn
//! ends: a [`TurnSource`] answers with the next outside turn or ends the row
//! ([`OneTurn`] ends every row at its first turn). A few choices follow from that and
//! are made here, once:
//! - the cache of a single turn is sized for the whole budget; a conversation's starts
//!   at up to 4,096 columns and grows, compacting the padding first;
//! - finished single-turn rows stay in the batch, masked, until an eighth of it is
//!   done (a compaction copies the whole cache); a finished conversation leaves at
//!   once (the others may run for many more turns);
//! - the repetition penalty and `min_new_tokens` count per turn, and outside tokens
//!   enter the penalty's context, which the device chooser does not track: multi-turn
//!   calls that use them choose on the host.
use std::time::Instant;

use anyhow::{bail, ensure, Result};
use candle_core::{DType, Tensor};
use rand::Rng;
use rand_chacha::ChaCha8Rng;

use super::{reuse, ChooseOn, DeviceSampler, PromptKv, RowSampler, SampleStats, SamplingParams};
use super::{stop::StopMatcher, Choice};
use crate::model::tokenizer::Renderer;
use crate::model::{Input, Mode};
use crate::model::{KvCache, Transformer};

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

/// What one engine call samples.
pub(crate) struct Setup<'a> {
    /// The distinct prompts, each prefilled once.
    pub prompts: &'a [&'a [u32]],
    /// Per row: its prompt (an index into `prompts`) and its RNG stream.
    pub rows: Vec<(usize, ChaCha8Rng)>,
    /// Per prompt: an earlier prompt's KV to prefill on top of.
    pub priors: Option<&'a [Option<&'a PromptKv>]>,
    /// Return every prompt's KV (for the next call of its session).
    pub keep_prompt_kv: bool,
    /// Rows are conversations (the source may continue them); else one turn each.
    pub multi_turn: bool,
    /// Ends a model turn after this many tokens (0: off).
    pub max_turn_tokens: usize,
    pub choose_on: ChooseOn,
}

/// What an engine call returns.
pub(crate) struct Output {
    pub trajectories: Vec<Trajectory>,
    pub stats: SampleStats,
    /// Per prompt with `keep_prompt_kv`: its KV (None for a prompt no row samples).
    pub prompt_kv: Vec<Option<PromptKv>>,
}

/// The source of single-turn calls: records how each row's turn ended and ends it.
pub(crate) struct OneTurn {
    pub ends: Vec<Option<TurnEnd>>,
}

impl TurnSource for OneTurn {
    fn on_turns(&mut self, events: &[TurnEvent]) -> Result<Vec<(usize, Reply)>> {
        for e in events {
            self.ends[e.row] = Some(e.end.clone());
        }
        Ok(events.iter().map(|e| (e.row, Reply::Done)).collect())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Generating,
    Waiting,
    Done,
}

/// A row's state during sampling.
struct Row {
    rng: ChaCha8Rng,
    t: Trajectory,
    /// Where the current model turn starts in `t.ids`.
    turn_start: usize,
    /// Ids to feed at the next forward (not yet in the cache).
    feed: Vec<u32>,
    /// Prompt and completion so far (repetition penalty only).
    context: Vec<u32>,
    stop: StopMatcher,
    state: State,
}

/// Sample every row of `setup` to its end, asking `source` whenever model turns end.
pub(crate) fn run(
    model: &Transformer,
    renderer: &dyn Renderer,
    params: &SamplingParams,
    setup: Setup,
    source: &mut dyn TurnSource,
) -> Result<Output> {
    params.validate()?;
    // A prompt past the model's positions, or one whose attention cannot fit, would
    // fail deep in the forward or abort the process allocating it (a remote server's
    // observation can be megabytes): refuse it by its length first.
    let longest = setup.prompts.iter().map(|p| p.len()).max().unwrap_or(0);
    crate::model::budget::check_sampling(
        model.config(),
        model.device(),
        model.dtype(),
        setup.rows.len(),
        longest,
        params.max_new_tokens,
        &format!(
            "sampling {} completion(s) of up to {} tokens after a prompt of {longest} tokens",
            setup.rows.len(),
            params.max_new_tokens
        ),
    )?;
    let mut e = Engine::new(model, renderer, params, &setup)?;
    let mut prompt_kv = vec![None; setup.prompts.len()];
    if e.rows.is_empty() || params.max_new_tokens == 0 {
        return Ok(e.finish(prompt_kv));
    }
    let logits = e.prefill(&setup, &mut prompt_kv)?;
    e.decode(logits, &setup, source)?;
    Ok(e.finish(prompt_kv))
}

struct Engine<'a> {
    model: &'a Transformer,
    renderer: &'a dyn Renderer,
    params: &'a SamplingParams,
    rows: Vec<Row>,
    /// `batch[k]`: the row held by cache row k.
    batch: Vec<usize>,
    cache: Option<KvCache>,
    chooser: Chooser,
    stats: SampleStats,
    multi_turn: bool,
    max_turn: usize,
}

impl<'a> Engine<'a> {
    fn new(
        model: &'a Transformer,
        renderer: &'a dyn Renderer,
        params: &'a SamplingParams,
        setup: &Setup,
    ) -> Result<Self> {
        let penalty = params.repetition_penalty != 1.0;
        let mut rows = Vec::with_capacity(setup.rows.len());
        for (i, (p, rng)) in setup.rows.iter().enumerate() {
            let prompt = setup
                .prompts
                .get(*p)
                .ok_or_else(|| anyhow::anyhow!("row {i}: no prompt {p}"))?;
            ensure!(!prompt.is_empty(), "prompt {p} is empty");
            let done = params.max_new_tokens == 0;
            rows.push(Row {
                rng: rng.clone(),
                t: Trajectory {
                    truncated: done,
                    ..Trajectory::default()
                },
                turn_start: 0,
                feed: Vec::new(),
                context: if penalty { prompt.to_vec() } else { Vec::new() },
                stop: StopMatcher::new(&params.stop_strings),
                state: if done { State::Done } else { State::Generating },
            });
        }
        let on = match setup.multi_turn && (penalty || params.min_new_tokens > 0) {
            true => ChooseOn::Host,
            false => setup.choose_on.resolve(model.device()),
        };
        let chooser = match on {
            ChooseOn::Device => Chooser::Device(None),
            _ => Chooser::host(),
        };
        Ok(Engine {
            model,
            renderer,
            params,
            batch: (0..rows.len()).collect(),
            rows,
            cache: None,
            chooser,
            stats: SampleStats::default(),
            multi_turn: setup.multi_turn,
            max_turn: setup.max_turn_tokens,
        })
    }

    /// Prefill the prompts the rows use and expand the cache to one row each; returns
    /// every row's first logits.
    fn prefill(&mut self, setup: &Setup, prompt_kv: &mut [Option<PromptKv>]) -> Result<Tensor> {
        let t0 = Instant::now();
        let mut used: Vec<usize> = setup.rows.iter().map(|r| r.0).collect();
        used.sort_unstable();
        used.dedup();
        let prompts: Vec<&[u32]> = used.iter().map(|&p| setup.prompts[p]).collect();
        let priors: Vec<Option<&PromptKv>> = used
            .iter()
            .map(|&p| setup.priors.and_then(|pr| pr[p]))
            .collect();
        let budget = self.params.max_new_tokens;
        let extra = if self.multi_turn {
            budget.min(4096)
        } else {
            budget
        };
        let stats = &mut self.stats;
        let (cache, logits) = if priors.iter().any(Option::is_some) {
            reuse::prefill_continuing(self.model, &prompts, &priors, extra, stats)?
        } else {
            super::prefill_shared(self.model, &prompts, extra, stats)?
        };
        if setup.keep_prompt_kv {
            for (i, &p) in used.iter().enumerate() {
                let kv = cache.row_real(i)?;
                prompt_kv[p] = Some(PromptKv {
                    tokens: prompts[i].to_vec(),
                    kv,
                });
            }
        }
        self.stats.prefill_seconds = t0.elapsed().as_secs_f64();
        let slot = |p: usize| used.binary_search(&p).unwrap_or(0);
        let cache_rows: Vec<usize> = setup.rows.iter().map(|r| slot(r.0)).collect();
        let sel: Vec<u32> = cache_rows.iter().map(|&s| s as u32).collect();
        let sel = Tensor::from_vec(sel, cache_rows.len(), self.model.device())?;
        let first = logits.index_select(&sel, 0)?;
        self.cache = Some(cache.select_rows(&cache_rows)?);
        if let Chooser::Device(d) = &mut self.chooser {
            let mut s = DeviceSampler::new(self.params, first.dim(1)?, self.model.device())?;
            if !self.multi_turn {
                let contexts: Vec<&[u32]> = setup.rows.iter().map(|r| setup.prompts[r.0]).collect();
                s.set_contexts(&contexts)?;
            }
            *d = Some(s);
        }
        Ok(first)
    }

    /// Choose, commit, hand ended turns to the source, feed: until every row is done.
    fn decode(
        &mut self,
        mut logits: Tensor,
        setup: &Setup,
        source: &mut dyn TurnSource,
    ) -> Result<()> {
        let t1 = Instant::now();
        loop {
            let events = self.step(&logits)?;
            self.answer(events, source, setup.rows.len())?;
            if !self.drop_finished()? {
                break;
            }
            logits = self.forward()?;
        }
        self.stats.decode_seconds = t1.elapsed().as_secs_f64();
        Ok(())
    }

    /// Choose the generating rows' next tokens from `logits` and append them; returns
    /// the turns that ended.
    fn step(&mut self, logits: &Tensor) -> Result<Vec<TurnEvent>> {
        let live: Vec<usize> = (0..self.batch.len())
            .filter(|&k| self.rows[self.batch[k]].state == State::Generating)
            .collect();
        let want: Vec<usize> = live.iter().map(|&k| self.batch[k]).collect();
        let choices = {
            let mut refs = rows_in_order(&mut self.rows, &want);
            ensure!(
                refs.len() == live.len(),
                "a live row appears twice in the batch"
            );
            self.chooser.choose(logits, &live, &mut refs, self.params)?
        };
        self.stats.new_tokens += choices.len();
        let mut events = Vec::new();
        for (&i, c) in want.iter().zip(choices) {
            let end = commit(
                &mut self.rows[i],
                c,
                self.params,
                self.max_turn,
                self.renderer,
            )?;
            if let Some(end) = end {
                events.push(TurnEvent { row: i, end });
            }
        }
        Ok(events)
    }

    /// Hand ended turns to the source until nothing more changes.
    fn answer(
        &mut self,
        mut events: Vec<TurnEvent>,
        source: &mut dyn TurnSource,
        n_rows: usize,
    ) -> Result<()> {
        while !events.is_empty() {
            events.sort_by_key(|e| e.row);
            let replies = source.on_turns(&events)?;
            events.clear();
            for (i, reply) in replies {
                let Some(r) = self.rows.get_mut(i) else {
                    anyhow::bail!("the turn source replied for row {i} of {n_rows}");
                };
                if r.state != State::Waiting {
                    continue;
                }
                match reply {
                    Reply::Done => r.state = State::Done,
                    Reply::Continue(env) => {
                        if let Some(end) = continue_row(r, &env, self.params) {
                            events.push(TurnEvent { row: i, end });
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Take finished rows out of the cache when it pays; false when every row is done.
    fn drop_finished(&mut self) -> Result<bool> {
        let n = self.batch.len();
        let keep: Vec<usize> = (0..n)
            .filter(|&k| self.rows[self.batch[k]].state != State::Done)
            .collect();
        if keep.is_empty() {
            return Ok(false);
        }
        let dead = n - keep.len();
        if dead > 0 && (self.multi_turn || dead * 8 >= n) {
            let cache = self
                .cache
                .take()
                .ok_or_else(|| anyhow::anyhow!("no cache"))?;
            self.cache = Some(cache.select_rows(&keep)?);
            self.chooser.select_rows(&keep)?;
            self.batch = keep.iter().map(|&k| self.batch[k]).collect();
        }
        ensure!(
            self.batch
                .iter()
                .any(|&i| self.rows[i].state == State::Generating),
            "every unfinished conversation waits for the turn source: it never replied"
        );
        Ok(true)
    }

    /// Feed the generating rows' new ids (left-padded to a common width; other rows
    /// masked) and return the logits of their last columns.
    fn forward(&mut self) -> Result<Tensor> {
        let width = self
            .batch
            .iter()
            .filter(|&&i| self.rows[i].state == State::Generating)
            .map(|&i| self.rows[i].feed.len())
            .max()
            .unwrap_or(1);
        let mut cache = self
            .cache
            .take()
            .ok_or_else(|| anyhow::anyhow!("no cache"))?;
        if cache.len() + width > cache.max_len() {
            // reclaim the columns padding left behind before growing
            if 2 * cache.max_real_columns() <= cache.len() {
                cache = cache.compact()?;
            }
            if cache.len() + width > cache.max_len() {
                cache = cache.grow(width.max(cache.max_len() / 2))?;
            }
        }
        let n = self.batch.len();
        let mut ids = vec![0u32; n * width];
        let mut mask = vec![0u8; n * width];
        for (k, &i) in self.batch.iter().enumerate() {
            let r = &mut self.rows[i];
            if r.state != State::Generating {
                continue;
            }
            let off = k * width + width - r.feed.len();
            ids[off..off + r.feed.len()].copy_from_slice(&r.feed);
            mask[off..off + r.feed.len()].fill(1);
            if self.multi_turn {
                r.t.fed.extend_from_slice(&r.feed);
            }
            r.feed.clear();
        }
        let all_real = mask.iter().all(|&m| m != 0);
        let ids_t = Tensor::from_vec(ids, (n, width), self.model.device())?;
        let hidden = self
            .model
            .forward(
                Input::cached(&ids_t, (!all_real).then_some(&mask[..]), &mut cache),
                Mode::Detached,
            )?
            .rows;
        self.cache = Some(cache);
        self.stats.decode_steps += 1;
        self.stats.row_steps += n * width;
        self.model.last_logits(&hidden)
    }

    fn finish(self, prompt_kv: Vec<Option<PromptKv>>) -> Output {
        Output {
            trajectories: self.rows.into_iter().map(|r| r.t).collect(),
            stats: self.stats,
            prompt_kv,
        }
    }
}

/// Append row `r`'s choice; returns how its model turn ended, if it did.
fn commit(
    r: &mut Row,
    c: Choice,
    params: &SamplingParams,
    max_turn: usize,
    renderer: &dyn Renderer,
) -> Result<Option<TurnEnd>> {
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
    r.feed.push(c.token);
    let end = turn_end(r, c.token, params, max_turn, renderer)?;
    // A turn that ends at the budget still goes to the source: the episode may end
    // there; a reply that does not fit truncates it then.
    Ok(match end {
        Some(e) => {
            r.state = State::Waiting;
            Some(e)
        }
        None if r.t.ids.len() >= params.max_new_tokens => {
            r.t.truncated = true;
            r.state = State::Done;
            Some(TurnEnd::Truncated)
        }
        None => None,
    })
}

/// Whether the model turn ending in `token` is over: a stop token past
/// `min_new_tokens`, a stop string (the text cut before it), or `max_turn` tokens.
fn turn_end(
    r: &mut Row,
    token: u32,
    params: &SamplingParams,
    max_turn: usize,
    renderer: &dyn Renderer,
) -> Result<Option<TurnEnd>> {
    let turn = &r.t.ids[r.turn_start..];
    if params.stop_token_ids.contains(&token) && turn.len() > params.min_new_tokens {
        let text = renderer.decode(&turn[..turn.len() - 1])?;
        return Ok(Some(TurnEnd::Turn {
            text,
            stop: Some(token),
        }));
    }
    if r.stop.is_active() {
        let text = renderer.decode(turn)?;
        if let Some(p) = r.stop.check(&text) {
            let text = text[..p].to_string();
            return Ok(Some(TurnEnd::Turn { text, stop: None }));
        }
    }
    if max_turn > 0 && turn.len() >= max_turn {
        let text = renderer.decode(turn)?;
        return Ok(Some(TurnEnd::Turn { text, stop: None }));
    }
    Ok(None)
}

/// Append an outside turn's ids to a waiting row and start its next model turn; the
/// row ends truncated when they leave no room for a model token.
fn continue_row(r: &mut Row, env: &[u32], params: &SamplingParams) -> Option<TurnEnd> {
    if r.t.ids.len() + env.len() >= params.max_new_tokens {
        r.state = State::Done;
        r.t.truncated = true;
        return Some(TurnEnd::Truncated);
    }
    r.t.ids.extend_from_slice(env);
    r.t.env_mask.extend(std::iter::repeat_n(0.0, env.len()));
    r.t.full_logprobs
        .extend(std::iter::repeat_n(0.0, env.len()));
    r.t.sample_logprobs
        .extend(std::iter::repeat_n(0.0, env.len()));
    if params.repetition_penalty != 1.0 {
        r.context.extend_from_slice(env);
    }
    r.feed.extend_from_slice(env);
    r.turn_start = r.t.ids.len();
    r.stop = StopMatcher::new(&params.stop_strings);
    r.state = State::Generating;
    None
}

/// The token chooser of one call.
enum Chooser {
    /// Logits copied to the host, rows chosen in parallel threads.
    Host(Vec<RowSampler>),
    /// Tensor operations on the model's device (built once the vocabulary is known).
    Device(Option<DeviceSampler>),
}

impl Chooser {
    fn host() -> Self {
        let threads = candle_core::utils::get_num_threads().max(1);
        Chooser::Host(vec![RowSampler::new(); threads])
    }

    /// The choices of cache rows `live` of `logits` (`[batch, V]`), for `rows` (the
    /// rows they hold, in that order); the other rows of `logits` are not choosing.
    fn choose(
        &mut self,
        logits: &Tensor,
        live: &[usize],
        rows: &mut [&mut Row],
        params: &SamplingParams,
    ) -> Result<Vec<Choice>> {
        if live.is_empty() {
            return Ok(Vec::new());
        }
        let (n, vocab) = logits.dims2()?;
        let chosen = self.choose_rows(logits, live, rows, params, n, vocab)?;
        // A NaN logit makes the whole distribution NaN: its tokens are noise, never
        // output (broken weights or config, e.g. a zero RoPE base).
        if chosen.iter().any(|c| c.full_logprob.is_nan()) {
            bail!(
                "the model's logits are NaN: its weights or its config are broken (nothing \
                 sampled from them is returned)"
            );
        }
        Ok(chosen)
    }

    fn choose_rows(
        &mut self,
        logits: &Tensor,
        live: &[usize],
        rows: &mut [&mut Row],
        params: &SamplingParams,
        n: usize,
        vocab: usize,
    ) -> Result<Vec<Choice>> {
        match self {
            Chooser::Host(samplers) => {
                let all = logits
                    .to_dtype(DType::F32)?
                    .flatten_all()?
                    .to_vec1::<f32>()?;
                let mine = if live.len() == n {
                    all
                } else {
                    let mut g = Vec::with_capacity(live.len() * vocab);
                    for &k in live {
                        g.extend_from_slice(&all[k * vocab..(k + 1) * vocab]);
                    }
                    g
                };
                Ok(choose_on_host(rows, &mine, vocab, params, samplers))
            }
            Chooser::Device(d) => {
                let d = d
                    .as_mut()
                    .ok_or_else(|| anyhow::anyhow!("no device sampler"))?;
                let mut uniforms = vec![0.5f64; n];
                if !params.is_greedy() {
                    for (row, &k) in rows.iter_mut().zip(live) {
                        uniforms[k] = row.rng.gen::<f64>();
                    }
                }
                // rows of a call start their turns together: one count for all
                let generated = rows.first().map_or(0, |r| r.t.ids.len() - r.turn_start);
                let all = d.choose(logits, &uniforms, generated)?;
                Ok(live.iter().map(|&k| all[k]).collect())
            }
        }
    }

    /// Keeps per-row state for rows `keep` of the current batch, in that order.
    fn select_rows(&mut self, keep: &[usize]) -> Result<()> {
        match self {
            Chooser::Device(Some(d)) => d.select_rows(keep),
            _ => Ok(()),
        }
    }
}

/// Each row's choice from its `vocab` logits in `logits` (row-major, in `rows`'
/// order), spread over the samplers' threads (no thread for one).
fn choose_on_host(
    rows: &mut [&mut Row],
    logits: &[f32],
    vocab: usize,
    params: &SamplingParams,
    samplers: &mut [RowSampler],
) -> Vec<Choice> {
    let n = rows.len();
    let threads = samplers.len().clamp(1, n.max(1));
    let per = n.div_ceil(threads).max(1);
    let mut out: Vec<Option<Choice>> = vec![None; n];
    let work =
        |rows: &mut [&mut Row], l: &[f32], out: &mut [Option<Choice>], s: &mut RowSampler| {
            for ((r, o), lrow) in rows.iter_mut().zip(out).zip(l.chunks(vocab)) {
                let generated = r.t.ids.len() - r.turn_start;
                *o = Some(s.choose(lrow, params, &r.context, generated, &mut r.rng));
            }
        };
    if threads <= 1 {
        work(rows, logits, &mut out, &mut samplers[0]);
    } else {
        std::thread::scope(|scope| {
            for (((r, l), o), s) in rows
                .chunks_mut(per)
                .zip(logits.chunks(per * vocab))
                .zip(out.chunks_mut(per))
                .zip(samplers.iter_mut())
            {
                scope.spawn(move || work(r, l, o, s));
            }
        });
    }
    out.into_iter().flatten().collect()
}

/// Mutable references to `rows[want[0]], rows[want[1]], ...` (distinct indices), in
/// that order.
fn rows_in_order<'r>(rows: &'r mut [Row], want: &[usize]) -> Vec<&'r mut Row> {
    let mut slots: Vec<Option<&'r mut Row>> = rows.iter_mut().map(Some).collect();
    want.iter()
        .filter_map(|&i| slots.get_mut(i).and_then(|s| s.take()))
        .collect()
}

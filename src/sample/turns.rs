//! Multi-turn sampling: every row is one conversation in which model turns alternate
//! with turns supplied from outside (an environment), all on one KV cache.
//!
//! - Each row starts from a prompt (identical prompts are prefilled once, the prefix
//!   all prompts share once, and their cache rows expanded, as in
//!   [`super::sample_requests`]) and samples a model turn until a stop token or stop
//!   string.
//! - The finished turn goes to the [`TurnSource`], which answers with the next
//!   outside turn's token ids ([`super::Reply::Continue`]), with [`super::Reply::Done`], or not yet
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
//!   model token, ends the row as truncated ([`super::TurnEnd::Truncated`] is reported).
//!
//! Every row draws from its own RNG stream ([`super::row_rng`]), so a row's
//! trajectory does not depend on what else is in the batch. The engine is the one of
//! [`super::sample_requests_on`] (`super::engine`); the repetition penalty and
//! `min_new_tokens` (counted per model turn) force the host chooser, whose contexts
//! include outside tokens.
use anyhow::Result;

use super::engine::{Setup, Trajectory, TurnSource};
use super::{row_rng, ChooseOn, SampleStats, SamplingParams};
use crate::model::tokenizer::Renderer;
use crate::model::Transformer;

/// One conversation to sample: its prompt (an index into the prompt list) and its RNG
/// stream `row_rng(seed, stream.0, stream.1)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TurnRow {
    pub prompt: usize,
    pub stream: (usize, usize),
}

/// Samples every row's conversation (row streams keyed by `params.seed`) on the one
/// engine (`super::engine`); returns the trajectories in row order.
#[allow(clippy::too_many_arguments)]
pub fn sample_turns(
    model: &Transformer,
    renderer: &dyn Renderer,
    prompts: &[Vec<u32>],
    rows: &[TurnRow],
    params: &SamplingParams,
    max_turn_tokens: usize,
    source: &mut dyn TurnSource,
    choose_on: ChooseOn,
) -> Result<(Vec<Trajectory>, SampleStats)> {
    let refs: Vec<&[u32]> = prompts.iter().map(Vec::as_slice).collect();
    let setup = Setup {
        prompts: &refs,
        rows: rows
            .iter()
            .map(|r| (r.prompt, row_rng(params.seed, r.stream.0, r.stream.1)))
            .collect(),
        priors: None,
        keep_prompt_kv: false,
        multi_turn: true,
        max_turn_tokens,
        choose_on,
    };
    let out = super::engine::run(model, renderer, params, setup, source)?;
    Ok((out.trajectories, out.stats))
}

//! The model as an [`crate::envs::rollout::Policy`]: what plays an episode's policy seats
//! turn by turn, in evaluation (`concord eval`) and in training's decision mode (the
//! model-played draws and continuations of [`crate::grpo::batch`]), so a policy is
//! evaluated on the driver it is trained with.
use crate::envs::rollout::{Policy, Turn};
use crate::envs::Environment;
use crate::model::Transformer;
use crate::rng::mix_seeds as mix;
use crate::sample::{self, GroupRequest, PromptKv, SamplingParams};
use crate::task::Renderer;
use anyhow::Result;
use std::collections::HashMap;

/// The model in every policy seat: each round's turns are sampled together,
/// `batch` prompts per sampling call. Every turn has its own RNG stream keyed by
/// (episode, round, seat), so results do not depend on the batching. Each seat's next
/// prompt is prefilled on top of its last one's KV ([`sample::reuse`]): a decision
/// prompt re-reads the session so far, and only its new tail costs a forward.
pub struct ModelPolicy<'a> {
    pub model: &'a Transformer,
    pub renderer: &'a dyn Renderer,
    pub params: &'a SamplingParams,
    pub batch: usize,
    /// The KV of each (episode, seat)'s last prompt.
    last: HashMap<(usize, usize), PromptKv>,
    /// Most bytes `last` may hold (see [`kv_budget`]); a prompt whose KV would not fit
    /// is not kept, and its seat's next prompt is prefilled in full.
    kv_budget: usize,
    /// Prompt tokens of all calls, and how many of them were not recomputed.
    pub prompt_tokens: usize,
    pub reused_tokens: usize,
    /// Added to the episode index of every RNG stream: a caller that plays one block of
    /// a larger set keys its streams by their place in the set.
    pub first_episode: u64,
}

impl<'a> ModelPolicy<'a> {
    pub fn new(
        model: &'a Transformer,
        renderer: &'a dyn Renderer,
        params: &'a SamplingParams,
        batch: usize,
    ) -> Self {
        ModelPolicy {
            model,
            renderer,
            params,
            batch,
            last: HashMap::new(),
            kv_budget: kv_budget(),
            prompt_tokens: 0,
            reused_tokens: 0,
            first_episode: 0,
        }
    }
}

/// The bytes of kept prompt KV an evaluation may hold: a quarter of the memory
/// available when it starts (1 GiB where that is unknown). Every episode is played at
/// once, so without a bound the kept KV grows with episodes x seats x prompt length
/// (the 0.5B in f32 keeps 24.6 kB a token: 800 seats of 700-token prompts would hold
/// 14 GB), beside a training run's own memory when evaluating during training.
fn kv_budget() -> usize {
    crate::sys::available_memory_bytes().map_or(1 << 30, |b| (b / 4) as usize)
}

impl Policy for ModelPolicy<'_> {
    fn act(
        &mut self,
        episodes: &mut [&mut dyn Environment],
        turns: &[Turn],
    ) -> Result<Vec<String>> {
        // An ended episode asks nothing more: its KV is memory only.
        self.last
            .retain(|&(e, _), _| episodes.get(e).is_some_and(|e| !e.done()));
        let decode = |ids: &[u32]| self.renderer.decode(ids);
        let mut texts = Vec::with_capacity(turns.len());
        for chunk in turns.chunks(self.batch.max(1)) {
            let prompts: Vec<Vec<u32>> = chunk
                .iter()
                .map(|t| {
                    Ok(self
                        .renderer
                        .render(&episodes[t.episode].observation(t.seat))?
                        .1)
                })
                .collect::<Result<_>>()?;
            let reqs: Vec<GroupRequest> = chunk
                .iter()
                .zip(&prompts)
                .map(|(t, p)| GroupRequest {
                    prompt: p,
                    num: 1,
                    stream_prompt: mix(
                        mix(self.first_episode + t.episode as u64, t.round),
                        t.seat as u64,
                    ) as usize,
                    first_sample: 0,
                })
                .collect();
            let priors: Vec<Option<&PromptKv>> = chunk
                .iter()
                .map(|t| self.last.get(&(t.episode, t.seat)))
                .collect();
            let (out, stats, kept) = sample::sample_requests_reusing(
                self.model,
                &decode,
                &reqs,
                &priors,
                self.params,
                self.params.seed,
            )?;
            self.prompt_tokens += stats.prefill_tokens;
            self.reused_tokens += stats.reused_tokens + stats.shared_prefix_tokens;
            for (t, kv) in chunk.iter().zip(kept) {
                let key = (t.episode, t.seat);
                self.last.remove(&key);
                let held: usize = self.last.values().map(|p| p.kv.bytes()).sum();
                if let Some(kv) = kv.filter(|kv| held + kv.kv.bytes() <= self.kv_budget) {
                    self.last.insert(key, kv);
                }
            }
            texts.extend(
                out.into_iter()
                    .map(|comps| comps.into_iter().next().map(|c| c.text).unwrap_or_default()),
            );
        }
        Ok(texts)
    }
}

/// Prints a line per round on stderr (so a long evaluation, or a training step's
/// continuations, under `nohup` shows where it is), then asks the policy.
pub struct Progress<P> {
    inner: P,
    episodes: usize,
    start: std::time::Instant,
    /// Written before each line (`continuations `: a training step's).
    label: &'static str,
}

impl<P> Progress<P> {
    pub fn new(inner: P, episodes: usize) -> Self {
        Progress {
            inner,
            episodes,
            start: std::time::Instant::now(),
            label: "",
        }
    }

    pub fn labelled(mut self, label: &'static str) -> Self {
        self.label = label;
        self
    }
}

impl<P: Policy> Policy for Progress<P> {
    fn act(
        &mut self,
        episodes: &mut [&mut dyn Environment],
        turns: &[Turn],
    ) -> Result<Vec<String>> {
        // Rounds can go on for minutes (a server whose episodes run long): a signal
        // abandons them, and the trainer keeps its last finished step.
        if crate::sys::interrupted() {
            return Err(crate::sys::Abandoned.into());
        }
        let open = episodes.iter().filter(|e| !e.done()).count();
        if let Some(t) = turns.first() {
            crate::note!(
                "  {}round {}: {} turns, {open} of {} episodes open, {:.0} s",
                self.label,
                t.round + 1,
                turns.len(),
                self.episodes,
                self.start.elapsed().as_secs_f64()
            );
        }
        self.inner.act(episodes, turns)
    }
}

//! Episode mode (`[env] mode = "episode"`): a completion is a whole trajectory.
//!
//! A prompt is one policy seat's first observation of an episode. Its G completions are
//! G independent episodes from the same start state (the same seed), each sampled as
//! one conversation: model turn, environment turn, model turn ... until the episode is
//! done or `max_completion_length` completion tokens (model and environment together)
//! are spent. The completion is scored by the episode reward of the seat
//! ([`crate::envs::Environment::reward`]), or, with `shaped_rewards = true`, by the sum
//! of the seat's step rewards ([`crate::envs::StepOutcome::rewards`]); that sum is
//! always logged as the `step_rewards` component.
//!
//! - **Turns** end at a stop token or stop string, or after `max_turn_tokens` tokens
//!   (`[env] max_turn_tokens`, 0 = off): the text is played as it is.
//! - **Masking**: only model tokens carry loss; environment tokens get `env_mask` 0 and
//!   stay in the context (see `shared/design/grpo.md`).
//! - **Token ids are appended, never re-rendered**: an environment turn (the step's
//!   feedback for the seat, if any, then its next observation's last message,
//!   `turn_message` on `dyn Environment`) is rendered on its own by the chat
//!   template ([`Renderer::render_env_turn`]) and its ids are appended to the
//!   trajectory and fed to the KV cache ([`crate::sample::sample_turns`]): the ids the
//!   model saw are the ids the loss sees.
//! - **Seats**: every policy seat of an episode is a row of its own (self-play: each
//!   seat's turns train, as its own masked sequence, in its own group); scripted seats
//!   act inside `step`. A simultaneous game steps once every seat in `to_act()` has
//!   answered. A seat whose trajectory ran out of budget is played by the continuation
//!   policy ([`crate::envs::Scripted`]) for the rest of the episode, so the others go
//!   on; its trajectory is marked truncated and still scored by the episode's end.
//! - **Streams**: seat row `s` of episode `j` of prompt group `p` samples from RNG
//!   stream `(p, j)` (each seat is its own prompt, hence its own `p`): a trajectory
//!   does not depend on what else is in the batch.
pub use super::Played;
use super::{Episodes, Renderer, Task, TaskPrompt};
use crate::envs::{self, EnvFactory, Environment, Reward, StepOutcome};
use crate::model::Transformer;
use crate::rng::mix_seeds as mix;
use crate::sample::{
    sample_turns, ChooseOn, Reply, SampleStats, SamplingParams, TurnEnd, TurnEvent, TurnRow,
    TurnSource,
};
use anyhow::{bail, ensure, Context, Result};
use std::collections::{BTreeMap, BTreeSet};

/// The reward component holding the sum of a seat's step rewards (`shaped_rewards`).
pub const STEP_REWARDS: &str = "step_rewards";

/// What a prompt of an [`EpisodeTask`] is: one policy seat at the start of an episode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EpisodeStart {
    /// The episode seed (the factory's `reset(seed)`).
    pub seed: u64,
    pub seat: usize,
}

/// A registry environment in episode mode: each prompt is one policy seat's first
/// observation; completions are whole trajectories ([`play_episodes`]).
pub struct EpisodeTask {
    factory: Box<dyn EnvFactory>,
    shaped: bool,
    max_turn_tokens: usize,
}

impl EpisodeTask {
    pub fn new(name: &str, options: &envs::Options, shaped_rewards: bool) -> Result<Self> {
        Ok(Self::from_factory(
            envs::create(name, options)?,
            shaped_rewards,
        ))
    }

    /// Episodes of any factory (a remote OpenEnv server included).
    pub fn from_factory(factory: Box<dyn EnvFactory>, shaped_rewards: bool) -> Self {
        Self {
            factory,
            shaped: shaped_rewards,
            max_turn_tokens: 0,
        }
    }

    /// Model turns end after `n` tokens (0: only at a stop token or the budget).
    pub fn with_max_turn_tokens(mut self, n: usize) -> Self {
        self.max_turn_tokens = n;
        self
    }

    pub fn factory(&self) -> &dyn EnvFactory {
        self.factory.as_ref()
    }

    /// Whether the scalar is the sum of the step rewards.
    pub fn shaped(&self) -> bool {
        self.shaped
    }

    /// The prompts of the episode starting from `seed`: one per policy seat.
    pub fn starts(&self, seed: u64, renderer: &dyn Renderer) -> Result<Vec<TaskPrompt>> {
        let env = self.factory.try_reset(seed)?;
        ensure!(
            !env.done(),
            "`{}`: the episode of seed {seed} is over at its reset (done), so it has \
             nothing to play",
            self.factory.name()
        );
        let seats = env.policy_seats();
        let acting: BTreeSet<usize> = env.to_act().into_iter().collect();
        ensure!(
            seats.iter().all(|s| acting.contains(s)),
            "episode mode needs every policy seat of `{}` to act in the first round \
             (policy seats {seats:?}, acting {acting:?})",
            self.factory.name()
        );
        seats
            .into_iter()
            .map(|seat| {
                let (text, ids) = renderer.render(&env.observation(seat))?;
                Ok(TaskPrompt {
                    ids,
                    text,
                    state: Box::new(EpisodeStart { seed, seat }),
                    contest: None,
                })
            })
            .collect()
    }
}

impl Task for EpisodeTask {
    fn name(&self) -> String {
        self.factory.name().to_string()
    }
    fn component_names(&self) -> Vec<String> {
        let mut names = self.factory.component_names().unwrap_or_else(|| {
            let mut env = self.factory.reset(0);
            env.rollout();
            let seat = env.policy_seats().first().copied().unwrap_or(0);
            env.reward(seat).components.into_keys().collect()
        });
        names.push(STEP_REWARDS.into());
        names.sort();
        names
    }
    /// `n` episode starts (seeds as in decision mode), each giving one prompt per policy
    /// seat: `n x seats` prompts.
    fn prompts(&mut self, seed: u64, n: usize, renderer: &dyn Renderer) -> Result<Vec<TaskPrompt>> {
        let mut out = Vec::new();
        for i in 0..n {
            out.extend(self.starts(envs::training_seed(mix(seed, i as u64)), renderer)?);
        }
        Ok(out)
    }
    fn score(&self, _prompt: &TaskPrompt, _c: &crate::sample::Completion) -> Result<Reward> {
        bail!("episode-mode prompts are scored by playing whole episodes (episode::play_episodes)")
    }
    fn as_episodes(&self) -> Option<&dyn Episodes> {
        Some(self)
    }
}

impl Episodes for EpisodeTask {
    fn play(
        &self,
        model: &Transformer,
        renderer: &dyn Renderer,
        prompts: &[TaskPrompt],
        g: usize,
        params: &SamplingParams,
        stream_base: usize,
        choose_on: ChooseOn,
    ) -> Result<(Vec<Vec<Played>>, SampleStats)> {
        play_episodes(
            model,
            renderer,
            self,
            prompts,
            g,
            params,
            stream_base,
            choose_on,
        )
    }
}

/// Play `g` episodes of every prompt group: `prompts` are [`EpisodeTask`] prompts
/// (prompts of the same seed are the seats of one episode and must be adjacent);
/// returns, per prompt, its `g` trajectories. Prompt `p`'s episode `j` samples from
/// stream `(stream_base + p, j)`.
#[allow(clippy::too_many_arguments)]
pub fn play_episodes(
    model: &Transformer,
    renderer: &dyn Renderer,
    task: &EpisodeTask,
    prompts: &[TaskPrompt],
    g: usize,
    params: &SamplingParams,
    stream_base: usize,
    choose_on: ChooseOn,
) -> Result<(Vec<Vec<Played>>, SampleStats)> {
    let starts: Vec<&EpisodeStart> = prompts
        .iter()
        .map(|p| {
            p.state
                .downcast_ref::<EpisodeStart>()
                .context("prompt state is not an episode start")
        })
        .collect::<Result<_>>()?;
    // episodes: (first prompt, prompts) of each seed, times g
    let mut spans: Vec<std::ops::Range<usize>> = Vec::new();
    for (p, s) in starts.iter().enumerate() {
        match spans.last_mut() {
            Some(r) if starts[r.start].seed == s.seed => r.end = p + 1,
            _ => spans.push(p..p + 1),
        }
    }
    let mut src = EnvTurns {
        renderer,
        envs: Vec::new(),
        row_of: Vec::new(),
        rows_of: Vec::new(),
        pending: Vec::new(),
        retired: Vec::new(),
        generating: BTreeSet::new(),
        done: BTreeSet::new(),
        stop: Vec::new(),
        feedback: Vec::new(),
        step_rewards: Vec::new(),
        texts: Vec::new(),
    };
    let prompt_ids: Vec<Vec<u32>> = prompts.iter().map(|p| p.ids.clone()).collect();
    let mut rows = Vec::new();
    // (prompt, j) of each row
    let mut owner = Vec::new();
    for span in &spans {
        for j in 0..g {
            let ep = src.envs.len();
            // G sessions of the same seed: a remote server may refuse or be gone.
            src.envs
                .push(task.factory.try_reset(starts[span.start].seed)?);
            src.pending.push(BTreeMap::new());
            src.retired.push(BTreeSet::new());
            let mut seat_rows = BTreeMap::new();
            for p in span.clone() {
                let row = rows.len();
                rows.push(TurnRow {
                    prompt: p,
                    stream: (stream_base + p, j),
                });
                owner.push((p, j));
                src.row_of.push((ep, starts[p].seat));
                seat_rows.insert(starts[p].seat, row);
                src.generating.insert(row);
                src.stop.push(None);
                src.feedback.push(String::new());
                src.step_rewards.push(0.0);
                src.texts.push(Vec::new());
            }
            src.rows_of.push(seat_rows);
        }
    }
    let (trajs, stats) = sample_turns(
        model,
        renderer,
        &prompt_ids,
        &rows,
        params,
        task.max_turn_tokens,
        &mut src,
        choose_on,
    )?;
    // finish episodes whose seats ran out of budget
    for env in &mut src.envs {
        if !env.done() {
            env.rollout();
        }
    }
    let mut out: Vec<Vec<Option<Played>>> = prompts.iter().map(|_| vec![None; g]).collect();
    for (row, traj) in trajs.into_iter().enumerate() {
        let (ep, seat) = src.row_of[row];
        let mut reward = src.envs[ep].reward(seat);
        let step_rewards = src.step_rewards[row];
        reward.components.insert(STEP_REWARDS.into(), step_rewards);
        if task.shaped {
            reward.scalar = step_rewards;
        }
        let (p, j) = owner[row];
        out[p][j] = Some(Played {
            trajectory: traj,
            reward,
            step_rewards,
            texts: std::mem::take(&mut src.texts[row]),
            won: src.envs[ep].won(seat),
        });
    }
    let out = out
        .into_iter()
        .map(|v| {
            v.into_iter()
                .map(|x| x.expect("every row played"))
                .collect()
        })
        .collect();
    Ok((out, stats))
}

/// The environment side of [`sample_turns`]: one episode per `g` x start, one row per
/// policy seat.
struct EnvTurns<'a> {
    renderer: &'a dyn Renderer,
    envs: Vec<Box<dyn Environment>>,
    /// Row -> (episode, seat).
    row_of: Vec<(usize, usize)>,
    /// Episode -> seat -> row.
    rows_of: Vec<BTreeMap<usize, usize>>,
    /// Episode -> seat -> the text of its finished turn, not yet played.
    pending: Vec<BTreeMap<usize, String>>,
    /// Episode -> seats out of budget (the continuation policy plays them).
    retired: Vec<BTreeSet<usize>>,
    /// Rows sampling a model turn.
    generating: BTreeSet<usize>,
    /// Rows told [`Reply::Done`] or truncated.
    done: BTreeSet<usize>,
    /// Row -> the stop token of its last turn.
    stop: Vec<Option<u32>>,
    /// Row -> the feedback of the last step.
    feedback: Vec<String>,
    step_rewards: Vec<f64>,
    texts: Vec<Vec<String>>,
}

impl EnvTurns<'_> {
    /// Whether every seat acting in episode `ep` has its text (or plays scripted).
    fn ready(&self, ep: usize, acting: &[usize]) -> bool {
        acting.iter().all(|s| {
            self.pending[ep].contains_key(s)
                || self.retired[ep].contains(s)
                || !self.rows_of[ep].contains_key(s)
        })
    }

    /// Step episode `ep` as long as every acting seat has answered; reply to its rows.
    fn advance(&mut self, ep: usize, replies: &mut Vec<(usize, Reply)>) -> Result<()> {
        loop {
            if self.envs[ep].done() {
                for &row in self.rows_of[ep].values() {
                    if self.done.insert(row) {
                        self.generating.remove(&row);
                        replies.push((row, Reply::Done));
                    }
                }
                return Ok(());
            }
            let acting = self.envs[ep].to_act();
            // Without scripted policies (a remote server) nobody can play a seat out
            // of budget: its episode ends where it stands, scored by what it earned.
            if self.envs[ep].as_scripted().is_none()
                && acting.iter().all(|s| self.retired[ep].contains(s))
            {
                return Ok(());
            }
            if !self.ready(ep, &acting) {
                return Ok(());
            }
            let env = &mut self.envs[ep];
            let actions: Vec<String> = acting
                .iter()
                .map(|&s| match self.pending[ep].remove(&s) {
                    Some(t) => t,
                    None => env.continuation_action(s),
                })
                .collect();
            let out: StepOutcome = env.step(&actions)?;
            for (k, &seat) in out.seats.iter().enumerate() {
                if let Some(&row) = self.rows_of[ep].get(&seat) {
                    self.step_rewards[row] += out.rewards.get(k).copied().unwrap_or(0.0);
                    self.feedback[row] = out.feedback.get(k).cloned().unwrap_or_default();
                }
            }
            if self.envs[ep].done() {
                continue;
            }
            for seat in self.envs[ep].to_act() {
                let Some(&row) = self.rows_of[ep].get(&seat) else {
                    continue;
                };
                if self.retired[ep].contains(&seat)
                    || self.done.contains(&row)
                    || self.generating.contains(&row)
                {
                    continue;
                }
                let obs = self.envs[ep].turn_message(seat).content;
                let fb = std::mem::take(&mut self.feedback[row]);
                let content = if fb.trim().is_empty() {
                    obs
                } else {
                    format!("{fb}\n\n{obs}")
                };
                let ids = self.renderer.render_env_turn(&content, self.stop[row])?;
                self.generating.insert(row);
                replies.push((row, Reply::Continue(ids)));
            }
        }
    }
}

impl TurnSource for EnvTurns<'_> {
    fn on_turns(&mut self, events: &[TurnEvent]) -> Result<Vec<(usize, Reply)>> {
        let mut touched = BTreeSet::new();
        for e in events {
            let (ep, seat) = self.row_of[e.row];
            self.generating.remove(&e.row);
            match &e.end {
                TurnEnd::Turn { text, stop } => {
                    self.stop[e.row] = *stop;
                    self.texts[e.row].push(text.clone());
                    self.pending[ep].insert(seat, text.clone());
                }
                TurnEnd::Truncated => {
                    self.retired[ep].insert(seat);
                    self.done.insert(e.row);
                }
            }
            touched.insert(ep);
        }
        // rewards an outside program computes: one exchange for the episodes that step now
        let mut answers = Vec::new();
        for &ep in &touched {
            let env = &self.envs[ep];
            if !env.done() && self.ready(ep, &env.to_act()) {
                answers.extend(
                    self.pending[ep]
                        .iter()
                        .map(|(&s, t)| (env.as_ref(), s, t.as_str())),
                );
            }
        }
        envs::batch::prefetch(answers)?;
        let mut replies = Vec::new();
        for ep in touched {
            self.advance(ep, &mut replies)?;
        }
        Ok(replies)
    }
}

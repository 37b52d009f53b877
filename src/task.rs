//! Where prompts and rewards come from. A [`Task`] hands the trainer `n` prompts for a
//! step (a pure function of the step's seed) and scores completions of them; a
//! [`Renderer`] turns chat messages into token ids and ids back into text.
//!
//! - [`EnvTask`]: one registry environment; each prompt is one policy seat's decision.
//! - [`MixtureTask`]: several environments, each prompt's environment drawn by weight.
//! - [`episode::EpisodeTask`]: one registry environment in episode mode; each prompt is
//!   one policy seat at the start of an episode, each completion a whole trajectory.
//! - tests implement [`Task`] directly for toy rewards.
use crate::config::ContinueWith;
use crate::envs::rollout::Policy;
use crate::envs::{self, EnvFactory, Reward};
use crate::model::Transformer;
use crate::rng::mix_seeds as mix;
use crate::sample::{ChooseOn, Completion, SampleStats, SamplingParams, Trajectory};
use anyhow::{Context, Result};
use std::any::Any;

pub mod episode;
pub mod policy;

/// Chat rendering, decoding and stop tokens: the model's tokenizer, or [`IdRenderer`]
/// (ids as text) in tests. One trait, shared with the sampler.
pub use crate::model::tokenizer::{IdRenderer, Renderer};

/// One prompt of a step: its token ids, readable text and whatever the task needs to
/// score completions of it.
pub struct TaskPrompt {
    pub ids: Vec<u32>,
    pub text: String,
    pub state: Box<dyn Any + Send>,
    /// How the decision was drawn under `[env] contested` (`None` otherwise).
    pub contest: Option<envs::Contest>,
}

impl TaskPrompt {
    /// A prompt whose decision the model has yet to play to
    /// ([`Task::play_to_decisions`]): no ids until then.
    fn undrawn(seed: u64) -> Self {
        TaskPrompt {
            ids: Vec::new(),
            text: String::new(),
            state: Box::new(Undrawn { seed }),
            contest: None,
        }
    }

    /// Whether the prompt is ready to sample from (every prompt but an undrawn one).
    pub fn is_drawn(&self) -> bool {
        !self.state.is::<Undrawn>()
    }
}

/// Where prompts and rewards come from (an environment, or a toy task in tests).
pub trait Task {
    /// Name written to the `env` column.
    fn name(&self) -> String;
    /// `n` prompts for a step; a pure function of `seed`.
    fn prompts(&mut self, seed: u64, n: usize, renderer: &dyn Renderer) -> Result<Vec<TaskPrompt>>;
    /// Reward of one completion of `prompt`.
    fn score(&self, prompt: &TaskPrompt, completion: &Completion) -> Result<Reward>;
    /// Called with every completion of a step before [`Task::score`] takes them one
    /// by one: rewards an outside program computes are asked for in one exchange
    /// ([`envs::batch`]). Default: nothing to do.
    fn prefetch(&self, prompts: &[TaskPrompt], samples: &[Vec<Completion>]) -> Result<()> {
        let _ = (prompts, samples);
        Ok(())
    }
    /// Every reward component name the task can produce (the log's columns); empty:
    /// take them from the first step.
    fn component_names(&self) -> Vec<String> {
        Vec::new()
    }
    /// The environment a prompt came from (for mixtures; default: [`Task::name`]).
    fn env_of(&self, prompt: &TaskPrompt) -> String {
        let _ = prompt;
        self.name()
    }
    /// Episode mode: the task plays whole trajectories instead of scoring single
    /// completions (default: `None`).
    fn as_episodes(&self) -> Option<&dyn Episodes> {
        None
    }
    /// Decision mode with `[env] continue_with = "model"`: the decision `prompt` is, whose
    /// completions the model scores by playing on ([`envs::score_decisions_with`]);
    /// `None` (default): [`Task::score`] scores them.
    fn model_continued<'a>(&self, prompt: &'a TaskPrompt) -> Option<&'a envs::Decision> {
        let _ = prompt;
        None
    }
    /// Answers every group of `prompt` holds besides its samples (`[env]
    /// enumerate_actions`: one per legal action of the deciding seat). Default: none.
    fn forced_answers(&self, prompt: &TaskPrompt) -> Vec<String> {
        let _ = prompt;
        Vec::new()
    }
    /// Decision mode on an environment with no scripted policy (a remote server), or
    /// with `[env] roll_in = "model"`: [`Task::prompts`] gives undrawn prompts (a seed each), and this draws their
    /// decisions by letting `policy` (the model) play ([`envs::sample_decisions_with`]),
    /// filling in each prompt. Default: the prompts are drawn already.
    fn play_to_decisions(
        &self,
        prompts: &mut [TaskPrompt],
        policy: &mut dyn Policy,
        renderer: &dyn Renderer,
    ) -> Result<()> {
        let _ = (prompts, policy, renderer);
        Ok(())
    }
}

/// A task whose completions are whole trajectories ([`episode::EpisodeTask`]).
pub trait Episodes {
    /// Play `g` episodes of every prompt, sampling the model's turns with `params`;
    /// returns, per prompt, its `g` trajectories. Prompt `p`'s episode `j` samples from
    /// RNG stream `(stream_base + p, j)`.
    #[allow(clippy::too_many_arguments)]
    fn play(
        &self,
        model: &Transformer,
        renderer: &dyn Renderer,
        prompts: &[TaskPrompt],
        g: usize,
        params: &SamplingParams,
        stream_base: usize,
        choose_on: ChooseOn,
    ) -> Result<(Vec<Vec<Played>>, SampleStats)>;
}

/// One seat's played trajectory.
#[derive(Debug, Clone, PartialEq)]
pub struct Played {
    pub trajectory: Trajectory,
    /// The seat's reward at the end of the episode, plus the `step_rewards` component.
    pub reward: Reward,
    /// The sum of the seat's step rewards.
    pub step_rewards: f64,
    /// The seat's own text of every model turn that was played.
    pub texts: Vec<String>,
    /// Whether the seat won the episode (`Environment::won`).
    pub won: bool,
}

/// One environment in decision mode: each prompt is one policy seat's decision.
pub struct EnvTask {
    factory: Box<dyn EnvFactory>,
    continue_with: ContinueWith,
    /// `[env] roll_in`: who plays each episode to its decision.
    roll_in: ContinueWith,
    /// `[env] contested`: draw only decisions whose action matters.
    contest: Option<envs::ContestRule>,
    /// `[env] enumerate_actions`: every legal action's answer joins each group.
    enumerate: bool,
}

/// A prompt of an environment with no scripted policy (or rolled in by the model),
/// before the model has played to its decision ([`Task::play_to_decisions`]).
struct Undrawn {
    seed: u64,
}

impl EnvTask {
    /// A registry environment.
    pub fn new(name: &str, options: &envs::Options) -> Result<Self> {
        Ok(Self::from_factory(envs::create(name, options)?))
    }

    /// Any environment, a remote server's included.
    pub fn from_factory(factory: Box<dyn EnvFactory>) -> Self {
        Self {
            factory,
            continue_with: ContinueWith::Scripted,
            roll_in: ContinueWith::Scripted,
            contest: None,
            enumerate: false,
        }
    }

    /// Draw contested decisions only ([`envs::contest`]); an error when the
    /// environment cannot list its seats' actions.
    pub fn contested(mut self, rule: Option<envs::ContestRule>) -> Result<Self> {
        if let Some(r) = rule {
            envs::contest::check_contestable(self.factory.as_ref())?;
            self.contest = Some(r);
        }
        Ok(self)
    }

    /// Put every legal action's answer in each group (`[env] enumerate_actions`); an
    /// error when the environment cannot list its seats' actions.
    pub fn enumerating(mut self, on: bool) -> Result<Self> {
        if on {
            let listed = self.factory.scripted() && {
                let d = envs::sample_decision(self.factory.as_ref(), 0);
                d.env
                    .as_scripted()
                    .is_some_and(|s| !s.answer_texts(d.seat).is_empty())
            };
            anyhow::ensure!(
                listed,
                "[env] enumerate_actions: `{}` cannot list a seat's legal actions at a \
                 decision (available for merge_ring and ticketmelt)",
                self.factory.name()
            );
            self.enumerate = true;
        }
        Ok(self)
    }

    /// Who plays each decision's episode to its end (`[env] continue_with`).
    pub fn continued_by(mut self, who: ContinueWith) -> Self {
        self.continue_with = who;
        self
    }

    /// Who plays each episode to its decision (`[env] roll_in`); a server's always is
    /// the model, which has no other policy.
    pub fn rolled_in_by(mut self, who: ContinueWith) -> Self {
        self.roll_in = who;
        self
    }
}

impl Task for EnvTask {
    fn name(&self) -> String {
        self.factory.name().to_string()
    }
    fn component_names(&self) -> Vec<String> {
        if let Some(names) = self.factory.component_names() {
            return names;
        }
        if !self.factory.scripted() {
            // a server's reward has its components from the start
            let env = self.factory.reset(0);
            return env.reward(0).components.into_keys().collect();
        }
        let d = envs::sample_decision(self.factory.as_ref(), 0);
        envs::score_decision(&d, "")
            .components
            .into_keys()
            .collect()
    }
    fn prompts(&mut self, seed: u64, n: usize, renderer: &dyn Renderer) -> Result<Vec<TaskPrompt>> {
        (0..n)
            .map(|i| {
                let episode_seed = envs::training_seed(mix(seed, i as u64));
                if !self.factory.scripted() || !self.roll_in.is_scripted() {
                    return Ok(TaskPrompt::undrawn(episode_seed));
                }
                if let Some(rule) = self.contest {
                    let (d, c) =
                        envs::contest::sample_contested(self.factory.as_ref(), episode_seed, rule)?;
                    let mut p = render_decision(d, renderer)?;
                    p.contest = Some(c);
                    return Ok(p);
                }
                let d = envs::sample_decision(self.factory.as_ref(), episode_seed);
                render_decision(d, renderer)
            })
            .collect()
    }
    fn score(&self, prompt: &TaskPrompt, completion: &Completion) -> Result<Reward> {
        let d = prompt
            .state
            .downcast_ref::<envs::Decision>()
            .context("prompt state is not an environment decision")?;
        // a failed reward program or a lost server stops the step, never scores 0
        envs::try_score_decision(d, &completion.text)
    }
    fn prefetch(&self, prompts: &[TaskPrompt], samples: &[Vec<Completion>]) -> Result<()> {
        // continued decisions are scored where the model plays them on
        match self.continue_with {
            ContinueWith::Model => Ok(()),
            ContinueWith::Scripted => prefetch_decisions(prompts.iter().zip(samples)),
        }
    }
    fn forced_answers(&self, prompt: &TaskPrompt) -> Vec<String> {
        let decision = prompt.state.downcast_ref::<envs::Decision>();
        match (self.enumerate, decision) {
            (true, Some(d)) => d
                .env
                .as_scripted()
                .map_or_else(Vec::new, |s| s.answer_texts(d.seat)),
            _ => Vec::new(),
        }
    }
    fn model_continued<'a>(&self, prompt: &'a TaskPrompt) -> Option<&'a envs::Decision> {
        match self.continue_with {
            ContinueWith::Model => prompt.state.downcast_ref::<envs::Decision>(),
            ContinueWith::Scripted => None,
        }
    }
    fn play_to_decisions(
        &self,
        prompts: &mut [TaskPrompt],
        policy: &mut dyn Policy,
        renderer: &dyn Renderer,
    ) -> Result<()> {
        let undrawn: Vec<usize> = (0..prompts.len())
            .filter(|&i| !prompts[i].is_drawn())
            .collect();
        let seeds: Vec<u64> = undrawn
            .iter()
            .filter_map(|&i| prompts[i].state.downcast_ref::<Undrawn>().map(|u| u.seed))
            .collect();
        if seeds.is_empty() {
            return Ok(());
        }
        let decisions = envs::rollout::sample_decisions_contested_with(
            self.factory.as_ref(),
            &seeds,
            policy,
            self.contest,
        )?;
        for (i, (d, contest)) in undrawn.into_iter().zip(decisions) {
            prompts[i] = render_decision(d, renderer)?;
            prompts[i].contest = contest;
        }
        Ok(())
    }
}

/// [`Task::prefetch`] of decision prompts (a mixture's prompts are looked into).
fn prefetch_decisions<'a>(
    groups: impl Iterator<Item = (&'a TaskPrompt, &'a Vec<Completion>)>,
) -> Result<()> {
    let mut answers = Vec::new();
    for (p, comps) in groups {
        let inner = p.state.downcast_ref::<Tagged>().map_or(p, |t| &t.inner);
        if let Some(d) = inner.state.downcast_ref::<envs::Decision>() {
            answers.extend(
                comps
                    .iter()
                    .map(|c| (d.env.as_ref(), d.seat, c.text.as_str())),
            );
        }
    }
    envs::batch::prefetch(answers)
}

/// A decision as a prompt: its observation rendered.
fn render_decision(d: envs::Decision, renderer: &dyn Renderer) -> Result<TaskPrompt> {
    let (text, ids) = renderer.render(&d.messages)?;
    Ok(TaskPrompt {
        ids,
        text,
        state: Box::new(d),
        contest: None,
    })
}

/// Prompts from several environments: each prompt's environment is drawn with the
/// mixture weights from the prompt's seed.
pub struct MixtureTask {
    envs: Vec<(EnvTask, f64)>,
}

impl MixtureTask {
    pub fn new(envs: Vec<(EnvTask, f64)>) -> Self {
        Self { envs }
    }

    fn pick(&self, seed: u64) -> usize {
        let u = (mix(seed, 0x5EED) >> 11) as f64 / (1u64 << 53) as f64;
        let mut acc = 0.0;
        for (i, (_, w)) in self.envs.iter().enumerate() {
            acc += w;
            if u < acc {
                return i;
            }
        }
        self.envs.len() - 1
    }
}

/// A prompt's state: which environment, and that environment's own state.
struct Tagged {
    env: usize,
    inner: TaskPrompt,
}

impl Task for MixtureTask {
    fn name(&self) -> String {
        self.envs
            .iter()
            .map(|(t, _)| t.name())
            .collect::<Vec<_>>()
            .join("+")
    }

    fn component_names(&self) -> Vec<String> {
        let mut all: Vec<String> = self
            .envs
            .iter()
            .flat_map(|(t, _)| t.component_names())
            .collect();
        all.sort();
        all.dedup();
        all
    }

    fn prompts(&mut self, seed: u64, n: usize, renderer: &dyn Renderer) -> Result<Vec<TaskPrompt>> {
        if self.envs.len() == 1 {
            return self.envs[0].0.prompts(seed, n, renderer);
        }
        (0..n)
            .map(|i| {
                let s = mix(seed, i as u64);
                let e = self.pick(s);
                // One prompt from that environment, seeded by this prompt's own seed.
                let mut one = self.envs[e].0.prompts(s, 1, renderer)?;
                let inner = one.pop().context("environment gave no prompt")?;
                Ok(TaskPrompt {
                    ids: inner.ids.clone(),
                    text: inner.text.clone(),
                    contest: inner.contest,
                    state: Box::new(Tagged { env: e, inner }),
                })
            })
            .collect()
    }

    fn score(&self, prompt: &TaskPrompt, completion: &Completion) -> Result<envs::Reward> {
        if self.envs.len() == 1 {
            return self.envs[0].0.score(prompt, completion);
        }
        let t = prompt
            .state
            .downcast_ref::<Tagged>()
            .context("prompt state is not a mixture prompt")?;
        self.envs[t.env].0.score(&t.inner, completion)
    }

    fn prefetch(&self, prompts: &[TaskPrompt], samples: &[Vec<Completion>]) -> Result<()> {
        let scripted = prompts.iter().zip(samples).filter(|(p, _)| {
            let env = p.state.downcast_ref::<Tagged>().map_or(0, |t| t.env);
            self.envs[env].0.continue_with == ContinueWith::Scripted
        });
        prefetch_decisions(scripted)
    }

    fn env_of(&self, prompt: &TaskPrompt) -> String {
        match prompt.state.downcast_ref::<Tagged>() {
            Some(t) => self.envs[t.env].0.name(),
            None => self.name(),
        }
    }

    fn forced_answers(&self, prompt: &TaskPrompt) -> Vec<String> {
        if self.envs.len() == 1 {
            return self.envs[0].0.forced_answers(prompt);
        }
        match prompt.state.downcast_ref::<Tagged>() {
            Some(t) => self.envs[t.env].0.forced_answers(&t.inner),
            None => Vec::new(),
        }
    }

    fn model_continued<'a>(&self, prompt: &'a TaskPrompt) -> Option<&'a envs::Decision> {
        if self.envs.len() == 1 {
            return self.envs[0].0.model_continued(prompt);
        }
        let t = prompt.state.downcast_ref::<Tagged>()?;
        self.envs[t.env].0.model_continued(&t.inner)
    }

    fn play_to_decisions(
        &self,
        prompts: &mut [TaskPrompt],
        policy: &mut dyn Policy,
        renderer: &dyn Renderer,
    ) -> Result<()> {
        if self.envs.len() == 1 {
            return self.envs[0].0.play_to_decisions(prompts, policy, renderer);
        }
        for p in prompts.iter_mut() {
            if let Some(t) = p.state.downcast_mut::<Tagged>() {
                let env = &self.envs[t.env].0;
                env.play_to_decisions(std::slice::from_mut(&mut t.inner), policy, renderer)?;
                p.ids = t.inner.ids.clone();
                p.text = t.inner.text.clone();
            }
        }
        Ok(())
    }
}

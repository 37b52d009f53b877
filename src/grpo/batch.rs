//! Collect: one step's prompts -> G completions each, sampled with the very weights
//! being trained -> rewards, scored inline by the task -> group advantages. In episode
//! mode ([`crate::task::episode`]) a completion is a whole trajectory, played and scored
//! by the environment while it is sampled.
//!
//! With `dynamic_sampling` (DAPO, Yu et al. 2025, "DAPO: An Open-Source LLM
//! Reinforcement Learning System at Scale", §3.2) groups whose rewards are all equal
//! carry no gradient, so more prompts are drawn, round after round, until
//! `prompts_per_step` groups differ or the draw budget is spent; the batch is then
//! those groups, topped up with equal-reward groups in draw order when too few differ
//! (so its size never changes).
use super::advantage::{
    check_weights, compute_advantages, group_has_signal, normalize_then_sum, weighted_reward,
    Advantages,
};
use super::rollout::Rollout;
use crate::config::{GrpoConfig, MultiObjectiveAggregation};
use crate::dist::Dist;
use crate::envs::{score_decisions_with, Decision, Reward};
use crate::model::Transformer;
use crate::rng::mix_seeds as mix;
use crate::sample::{self, ChooseOn, Completion, FinishReason, GroupRequest, SamplingParams};
use crate::task::policy::{ModelPolicy, Progress};
use crate::task::{Episodes, Renderer, Task, TaskPrompt};
use anyhow::{bail, Context, Result};
use std::time::Instant;

/// What one step collected, ready for the update.
pub struct Batch {
    pub prompts: Vec<TaskPrompt>,
    /// `prompts.len() x G` scored completions, group by group, advantages filled in.
    pub rollouts: Vec<Rollout>,
    /// Reward statistics of the batch (the advantages themselves are in `rollouts`).
    pub advantages: Advantages,
    /// Seconds spent sampling.
    pub gen_secs: f64,
    /// Seconds spent scoring completions (the environments).
    pub score_secs: f64,
    /// Prompts drawn (more than `prompts.len()` with dynamic sampling).
    pub prompt_draws: usize,
    /// `frac_reward_zero_std` of every group drawn, before dynamic sampling kept some.
    pub frac_zero_std_drawn: f64,
    /// Episode mode: model turns of each rollout (empty in decision mode).
    pub turns: Vec<usize>,
}

impl Batch {
    pub fn mean_reward(&self) -> f64 {
        self.advantages.reward_mean
    }

    /// Completion tokens sampled this step.
    pub fn gen_tokens(&self) -> usize {
        self.rollouts.iter().map(|r| r.completion_ids.len()).sum()
    }

    /// Completion tokens the model sampled (environment tokens of episode mode and
    /// `enumerate_actions`' answers left out).
    pub fn sampled_tokens(&self) -> usize {
        self.rollouts
            .iter()
            .filter(|r| !r.forced)
            .map(|r| r.env_mask.iter().filter(|&&m| m > 0.0).count())
            .sum()
    }

    /// Prompt tokens over all rollouts (each completion counts its prompt).
    pub fn prompt_tokens(&self) -> usize {
        self.rollouts.iter().map(|r| r.prompt_ids.len()).sum()
    }
}

/// One prompt and its scored completions.
struct Group {
    prompt: TaskPrompt,
    rollouts: Vec<Rollout>,
    /// Episode mode: model turns of each rollout.
    turns: Vec<usize>,
}

/// What crosses between processes of a group sampled elsewhere (every process draws
/// the prompts itself): everything, so that any process can train any row.
#[derive(Clone, serde::Serialize, serde::Deserialize)]
struct ScoredGroup {
    rollouts: Vec<Rollout>,
    turns: Vec<usize>,
    /// The prompt as that process drew it (a remote server's decisions are drawn by
    /// the process that samples them).
    prompt_text: String,
    prompt_ids: Vec<u32>,
}

impl Group {
    fn has_signal(&self) -> bool {
        let r: Vec<f64> = self.rollouts.iter().map(|r| r.scalar).collect();
        group_has_signal(&r)
    }
}

/// Seconds spent sampling and scoring.
#[derive(Default)]
struct Timing {
    sample: f64,
    score: f64,
}

/// Draw `n` prompts with `seed` and sample and score G completions of each: this
/// process its block of the prompts, the others theirs, gathered.
#[allow(clippy::too_many_arguments)]
fn draw(
    model: &Transformer,
    renderer: &dyn Renderer,
    task: &mut dyn Task,
    g: &GrpoConfig,
    seed: u64,
    n: usize,
    dist: &Dist,
    timing: &mut Timing,
) -> Result<Vec<Group>> {
    // Every process draws all `n` prompts (a pure function of the seed) and samples its
    // own block of them, on RNG streams keyed by the prompt's index in the draw.
    let mut prompts = task.prompts(seed, n, renderer)?;
    let mine = dist.block(prompts.len());
    let rest = prompts.split_off(mine.end);
    let before: Vec<TaskPrompt> = prompts.drain(..mine.start).collect();
    let local = if let Some(ep) = task.as_episodes() {
        draw_episodes(model, renderer, ep, g, seed, prompts, mine.start, timing)?
    } else {
        let t = Instant::now();
        play_to_decisions(model, renderer, task, g, seed, &mut prompts, mine.start)?;
        timing.sample += t.elapsed().as_secs_f64();
        draw_decisions(model, renderer, task, g, seed, prompts, mine.start, timing)?
    };
    gather(dist, before, local, rest)
}

/// Where the task has no scripted policy (a remote server) or rolls in with the model
/// (`[env] roll_in`), the model plays each prompt's episode to draw its decision ([`Task::play_to_decisions`]); prompt `p` of
/// the draw (`first` is `prompts[0]`'s index) samples from episode `p`'s streams of
/// a seed of its own.
fn play_to_decisions(
    model: &Transformer,
    renderer: &dyn Renderer,
    task: &dyn Task,
    g: &GrpoConfig,
    seed: u64,
    prompts: &mut [TaskPrompt],
    first: usize,
) -> Result<()> {
    if prompts.iter().all(TaskPrompt::is_drawn) {
        return Ok(());
    }
    let params = g.sampling_params(renderer.stop_ids(), mix(seed, 3));
    let mut policy = ModelPolicy::new(model, renderer, &params, CONTINUATION_BATCH);
    policy.first_episode = first as u64;
    let mut policy = Progress::new(policy, prompts.len()).labelled("decisions ");
    task.play_to_decisions(prompts, &mut policy, renderer)
}

/// Every process's groups of one draw, in prompt order: this one's `local` groups
/// between the prompts `before` and `after` them, whose groups the other processes
/// sampled.
fn gather(
    dist: &Dist,
    before: Vec<TaskPrompt>,
    local: Vec<Group>,
    after: Vec<TaskPrompt>,
) -> Result<Vec<Group>> {
    if !dist.is_distributed() {
        return Ok(local);
    }
    let wire: Vec<ScoredGroup> = local
        .iter()
        .map(|gr| ScoredGroup {
            rollouts: gr.rollouts.clone(),
            turns: gr.turns.clone(),
            prompt_text: gr.prompt.text.clone(),
            prompt_ids: gr.prompt.ids.clone(),
        })
        .collect();
    let all = dist.all_gather_json("scored groups", &wire)?;
    let mut elsewhere = all
        .into_iter()
        .enumerate()
        .filter(|(r, _)| *r != dist.rank())
        .flat_map(|(_, gs)| gs);
    let mut remote = |mut prompt: TaskPrompt| -> Result<Group> {
        let sg = elsewhere
            .next()
            .context("gather: fewer scored groups than prompts")?;
        prompt.text = sg.prompt_text;
        prompt.ids = sg.prompt_ids;
        Ok(Group {
            prompt,
            rollouts: sg.rollouts,
            turns: sg.turns,
        })
    };
    let mut groups = Vec::new();
    for p in before {
        groups.push(remote(p)?);
    }
    groups.extend(local);
    for p in after {
        groups.push(remote(p)?);
    }
    Ok(groups)
}

/// Decision mode: G completions of each prompt, scored by the task. `first` is the
/// index of `prompts[0]` in the draw.
#[allow(clippy::too_many_arguments)]
fn draw_decisions(
    model: &Transformer,
    renderer: &dyn Renderer,
    task: &mut dyn Task,
    g: &GrpoConfig,
    seed: u64,
    prompts: Vec<TaskPrompt>,
    first: usize,
    timing: &mut Timing,
) -> Result<Vec<Group>> {
    let gsize = g.num_generations;
    if prompts.is_empty() {
        return Ok(Vec::new());
    }
    let forced: Vec<Vec<Completion>> = prompts
        .iter()
        .map(|p| forced_completions(task, renderer, g, p))
        .collect::<Result<_>>()?;
    let requests: Vec<GroupRequest> = prompts
        .iter()
        .zip(&forced)
        .enumerate()
        .map(|(i, (p, f))| GroupRequest {
            prompt: &p.ids,
            num: gsize - f.len(),
            stream_prompt: first + i,
            first_sample: 0,
        })
        .collect();
    let params = g.sampling_params(renderer.stop_ids(), mix(seed, 1));
    let decode = |ids: &[u32]| renderer.decode(ids);
    let t = Instant::now();
    let (mut samples, _) =
        sample::sample_requests(model, &decode, &requests, &params, params.seed)?;
    drop(requests);
    timing.sample += t.elapsed().as_secs_f64();
    let t = Instant::now();
    let sampled: Vec<usize> = samples.iter().map(Vec::len).collect();
    for (pi, (s, f)) in samples.iter_mut().zip(forced).enumerate() {
        if s.len() + f.len() != gsize {
            bail!(
                "sampler returned {} completions for prompt {pi}, expected {}",
                s.len(),
                gsize - f.len()
            );
        }
        s.extend(f);
    }
    // continuations sample on streams of their own
    let cont = g.sampling_params(renderer.stop_ids(), mix(seed, 2));
    let first_episode = (first * gsize) as u64;
    let rewards = score(
        model,
        renderer,
        task,
        &prompts,
        &samples,
        &cont,
        first_episode,
    )?;
    let mut groups = Vec::with_capacity(prompts.len());
    for (pi, ((prompt, comps), rewards)) in
        prompts.into_iter().zip(samples).zip(rewards).enumerate()
    {
        let mut rollouts = Vec::with_capacity(gsize);
        for (j, (c, reward)) in comps.into_iter().zip(rewards).enumerate() {
            let scalar = weighted_reward(&reward.components, reward.scalar, &g.reward_weights);
            let forced = j >= sampled[pi];
            rollouts.push(Rollout {
                group: first + pi,
                prompt_ids: prompt.ids.clone(),
                env_mask: vec![1.0; c.ids.len()],
                sampler_logp: (!forced).then_some(c.full_logprobs),
                completion_ids: c.ids,
                truncated: c.finish_reason == FinishReason::Length,
                text: c.text,
                reward,
                scalar,
                advantage: 0.0,
                forced,
            });
        }
        groups.push(Group {
            prompt,
            rollouts,
            turns: Vec::new(),
        });
    }
    timing.score += t.elapsed().as_secs_f64();
    Ok(groups)
}

/// The completions `[env] enumerate_actions` puts in `prompt`'s group: each legal
/// action's answer, tokenized as the model would write it and ended with its stop
/// token.
fn forced_completions(
    task: &dyn Task,
    renderer: &dyn Renderer,
    g: &GrpoConfig,
    prompt: &TaskPrompt,
) -> Result<Vec<Completion>> {
    let answers = task.forced_answers(prompt);
    if answers.len() >= g.num_generations {
        bail!(
            "[env] enumerate_actions: {} legal actions leave no sampled completion in a \
             group of grpo.num_generations = {}",
            answers.len(),
            g.num_generations
        );
    }
    let stop = renderer.stop_ids().first().copied();
    answers
        .into_iter()
        .map(|text| {
            let mut ids = renderer.encode_text(&text)?;
            ids.extend(stop);
            if ids.len() > g.max_completion_length {
                bail!(
                    "[env] enumerate_actions: the answer `{text}` takes {} tokens, more \
                     than grpo.max_completion_length = {}",
                    ids.len(),
                    g.max_completion_length
                );
            }
            Ok(Completion {
                finish_reason: if stop.is_some() {
                    FinishReason::Eos
                } else {
                    FinishReason::Stop
                },
                sample_logprobs: vec![0.0; ids.len()],
                full_logprobs: vec![0.0; ids.len()],
                ids,
                text,
            })
        })
        .collect()
}

/// The reward of every completion of every prompt: [`Task::score`], or, where the task
/// has the model continue its decisions (`[env] continue_with = "model"`), the model
/// playing each completion's episode to its end as `concord eval` plays it, every
/// continuation of the draw side by side. Continuation `k` of the draw samples from
/// the streams of episode `first_episode + k`, with `params`' seed.
fn score(
    model: &Transformer,
    renderer: &dyn Renderer,
    task: &dyn Task,
    prompts: &[TaskPrompt],
    samples: &[Vec<Completion>],
    params: &SamplingParams,
    first_episode: u64,
) -> Result<Vec<Vec<Reward>>> {
    task.prefetch(prompts, samples)?;
    let mut out: Vec<Vec<Reward>> = Vec::with_capacity(prompts.len());
    let mut continued: Vec<(&Decision, &str)> = Vec::new();
    let mut at: Vec<(usize, usize)> = Vec::new();
    for (pi, (prompt, comps)) in prompts.iter().zip(samples).enumerate() {
        match task.model_continued(prompt) {
            Some(d) => {
                out.push(vec![Reward::default(); comps.len()]);
                for (j, c) in comps.iter().enumerate() {
                    continued.push((d, c.text.as_str()));
                    at.push((pi, j));
                }
            }
            None => out.push(
                comps
                    .iter()
                    .map(|c| task.score(prompt, c))
                    .collect::<Result<_>>()?,
            ),
        }
    }
    if !continued.is_empty() {
        let mut policy = ModelPolicy::new(model, renderer, params, CONTINUATION_BATCH);
        policy.first_episode = first_episode;
        // a step's continuations can take many minutes: say where they are
        let mut policy = Progress::new(policy, continued.len()).labelled("continuations ");
        let rewards = score_decisions_with(&continued, &mut policy)?;
        for ((pi, j), r) in at.into_iter().zip(rewards) {
            out[pi][j] = r;
        }
    }
    Ok(out)
}

/// Continuation prompts sampled together (as `concord eval --batch`'s default).
const CONTINUATION_BATCH: usize = 32;

/// Episode mode: play G whole episodes from each prompt's start state (see
/// [`crate::task::episode`]); each seat's trajectory is one rollout of its prompt.
/// `first` is the index of `prompts[0]` in the draw.
#[allow(clippy::too_many_arguments)]
fn draw_episodes(
    model: &Transformer,
    renderer: &dyn Renderer,
    task: &dyn Episodes,
    g: &GrpoConfig,
    seed: u64,
    prompts: Vec<TaskPrompt>,
    first: usize,
    timing: &mut Timing,
) -> Result<Vec<Group>> {
    if prompts.is_empty() {
        return Ok(Vec::new());
    }
    let params = g.sampling_params(renderer.stop_ids(), mix(seed, 1));
    let t = Instant::now();
    let (played, _) = task.play(
        model,
        renderer,
        &prompts,
        g.num_generations,
        &params,
        first,
        ChooseOn::Auto,
    )?;
    // the environments step inside the sampler: their time counts as sampling
    timing.sample += t.elapsed().as_secs_f64();
    let mut groups = Vec::with_capacity(prompts.len());
    for (pi, (prompt, plays)) in prompts.into_iter().zip(played).enumerate() {
        let mut rollouts = Vec::with_capacity(plays.len());
        let mut turns = Vec::with_capacity(plays.len());
        for p in plays {
            let tr = p.trajectory;
            let scalar = weighted_reward(&p.reward.components, p.reward.scalar, &g.reward_weights);
            turns.push(tr.model_turns);
            rollouts.push(Rollout {
                group: first + pi,
                prompt_ids: prompt.ids.clone(),
                text: renderer.decode(&tr.ids)?,
                env_mask: tr.env_mask,
                sampler_logp: Some(tr.full_logprobs),
                completion_ids: tr.ids,
                truncated: tr.truncated,
                reward: p.reward,
                scalar,
                advantage: 0.0,
                forced: false,
            });
        }
        groups.push(Group {
            prompt,
            rollouts,
            turns,
        });
    }
    Ok(groups)
}

/// Sample and score one step's batch. `seed` is the step's seed; `first_step` checks
/// `reward_weights` against the components the task actually produces. In a
/// data-parallel run this process samples and scores its share of the prompts, and the
/// returned batch holds every process's groups, so whatever is computed from the batch
/// is the same on every process and as in one process (`&Dist::single()` otherwise).
pub fn collect(
    model: &Transformer,
    renderer: &dyn Renderer,
    task: &mut dyn Task,
    g: &GrpoConfig,
    seed: u64,
    first_step: bool,
    dist: &Dist,
) -> Result<Batch> {
    let want = g.prompts_per_step;
    let budget = g.prompt_draw_budget();
    let mut timing = Timing::default();
    // Round 0 draws exactly what a step without dynamic sampling draws.
    let mut drawn = draw(model, renderer, task, g, seed, want, dist, &mut timing)?;
    // episode mode: a start state gives one group per policy seat (self-play: several)
    let want = if task.as_episodes().is_some() {
        drawn.len()
    } else {
        want
    };
    let mut round = 0u64;
    while g.dynamic_sampling
        && drawn.len() < budget
        && drawn.iter().filter(|d| d.has_signal()).count() < want
    {
        round += 1;
        let missing = want - drawn.iter().filter(|d| d.has_signal()).count();
        let n = missing.min(budget - drawn.len());
        let more = draw(
            model,
            renderer,
            task,
            g,
            mix(seed, 1000 + round),
            n,
            dist,
            &mut timing,
        )?;
        drawn.extend(more);
    }

    if dist.is_distributed() {
        // The step took as long as its slowest process.
        let times = dist.all_gather_f64("timings", &[timing.sample, timing.score])?;
        timing.sample = times.iter().map(|t| t[0]).fold(0.0, f64::max);
        timing.score = times.iter().map(|t| t[1]).fold(0.0, f64::max);
    }
    let prompt_draws = drawn.len();
    let frac_zero_std_drawn =
        drawn.iter().filter(|d| !d.has_signal()).count() as f64 / prompt_draws as f64;
    let chosen: Vec<Group> = if drawn.len() > want {
        let (mut keep, rest): (Vec<Group>, Vec<Group>) =
            drawn.into_iter().partition(|d| d.has_signal());
        keep.truncate(want);
        let top_up = want - keep.len();
        keep.extend(rest.into_iter().take(top_up));
        keep
    } else {
        drawn
    };

    let mut prompts = Vec::with_capacity(chosen.len());
    let mut rollouts = Vec::with_capacity(chosen.len() * g.num_generations);
    let mut turns = Vec::new();
    for (gi, group) in chosen.into_iter().enumerate() {
        prompts.push(group.prompt);
        turns.extend(group.turns);
        rollouts.extend(
            group
                .rollouts
                .into_iter()
                .map(|r| Rollout { group: gi, ..r }),
        );
    }
    if first_step {
        check_weights(
            &g.reward_weights,
            rollouts.iter().map(|r| &r.reward.components),
        )?;
    }
    let advantages = match g.multi_objective_aggregation {
        MultiObjectiveAggregation::SumThenNormalize => {
            let rewards: Vec<f64> = rollouts.iter().map(|r| r.scalar).collect();
            compute_advantages(&rewards, g.num_generations, g.scale_rewards)?
        }
        MultiObjectiveAggregation::NormalizeThenSum => {
            let comps: Vec<_> = rollouts.iter().map(|r| &r.reward.components).collect();
            normalize_then_sum(&comps, &g.reward_weights, g.num_generations)?
        }
    };
    for (r, a) in rollouts.iter_mut().zip(&advantages.values) {
        // An enumerated answer only pulls (`[env] enumerate_actions`): pushing down an
        // answer the model does not write moves its probability to arbitrary tokens
        // (the merge-ring run's answer format broke within 30 steps when it could).
        r.advantage = if r.forced { a.max(0.0) } else { *a };
    }
    Ok(Batch {
        prompts,
        rollouts,
        advantages,
        gen_secs: timing.sample,
        score_secs: timing.score,
        prompt_draws,
        frac_zero_std_drawn,
        turns,
    })
}

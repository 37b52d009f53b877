//! One episode driver: a seed played by `concord eval`'s driver gives the very
//! trajectory a GRPO step's collection sampled for it, in both modes, greedy and at a
//! fixed sampling seed. Training and evaluation reach the same code (the episode
//! driver `play_episodes` in episode mode, the `ModelPolicy` turn by turn in decision
//! mode); these tests hold them to it through their public entries,
//! `grpo::batch::collect` and `eval::{play_trajectories, play}`.
use crate::episode::tiny;
use concord::config::{ContinueWith, GrpoConfig};
use concord::dist::Dist;
use concord::envs::{self, EnvFactory, Environment, Options};
use concord::eval::{play, play_trajectories, EpisodeSeed};
use concord::grpo::batch::collect;
use concord::rng::mix_seeds as mix;
use concord::task::episode::EpisodeTask;
use concord::task::{EnvTask, Renderer, Task};

/// Ticketmelt with `rounds` rounds.
fn rounds(n: i64) -> Options {
    let mut o = Options::new();
    o.insert("rounds".into(), toml::Value::Integer(n));
    o
}

fn grpo(temperature: f64, max_completion_length: usize) -> GrpoConfig {
    GrpoConfig {
        num_generations: 2,
        prompts_per_step: 2,
        max_completion_length,
        temperature,
        ..Default::default()
    }
}

/// The episode seeds a GRPO step with seed `step_seed` draws for its `n` prompts.
fn step_seeds(step_seed: u64, n: usize) -> Vec<EpisodeSeed> {
    (0..n as u64)
        .map(|i| EpisodeSeed {
            label: i,
            seed: envs::training_seed(mix(step_seed, i)),
        })
        .collect()
}

/// Episode mode: each of a step's episode seeds, played by eval's driver with the
/// step's sampling seed, is the trajectory the step sampled first for it (ids, loss
/// mask, sampler log-probs, reward), seat by seat. Greedy, and sampled at T = 5: the
/// tiny random model puts nearly all its mass on one token at T = 1, so only a hot
/// temperature makes the two episodes of a group, and the RNG streams, differ.
#[test]
fn an_episode_seed_plays_the_same_trajectory_in_training_and_in_eval() {
    let dir = tempfile::tempdir().unwrap();
    let (model, tok) = tiny(dir.path());
    let opts = rounds(3);
    for temperature in [0.0, 5.0] {
        let g = grpo(temperature, 800);
        let mut task = EpisodeTask::new("ticketmelt", &opts, false)
            .unwrap()
            .with_max_turn_tokens(8);
        let step_seed = 11;
        let batch = collect(
            &model,
            &tok,
            &mut task,
            &g,
            step_seed,
            true,
            &Dist::single(),
        )
        .unwrap();
        let seeds = step_seeds(step_seed, g.prompts_per_step);
        let params = g.sampling_params(tok.stop_ids(), mix(step_seed, 1));
        let played = play_trajectories(&model, &tok, &task, &seeds, &params, 1).unwrap();
        let eval: Vec<_> = played.iter().flat_map(|e| &e.seats).collect();
        assert_eq!(eval.len(), batch.prompts.len(), "one prompt per seat");
        for (p, (_, e)) in eval.iter().enumerate() {
            let trained = &batch.rollouts[p * g.num_generations];
            let what = format!("T = {temperature}, prompt {p}");
            assert_eq!(e.trajectory.ids, trained.completion_ids, "{what}");
            assert_eq!(e.trajectory.env_mask, trained.env_mask, "{what}");
            assert_eq!(e.reward, trained.reward, "{what}");
            let lp = trained.sampler_logp.as_ref().unwrap();
            let worst = e
                .trajectory
                .full_logprobs
                .iter()
                .zip(lp)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(worst < 1e-5, "{what}: log-probs differ by {worst}");
            assert!(
                e.trajectory.model_turns >= 2,
                "{what}: a multi-turn episode"
            );
        }
        if temperature > 0.0 {
            // The group's second episode of a seed is another sample of it.
            let differs = (0..batch.prompts.len()).any(|p| {
                batch.rollouts[p * 2].completion_ids != batch.rollouts[p * 2 + 1].completion_ids
            });
            assert!(differs, "sampled episodes of a group differ");
        }
    }
}

/// A built-in environment as a server is seen: no scripted policy, so the model plays
/// each episode to draw its decisions, as `concord train` does against OpenEnv.
struct ModelPlayed(Box<dyn EnvFactory>);

impl EnvFactory for ModelPlayed {
    fn name(&self) -> &'static str {
        self.0.name()
    }
    fn reset(&self, seed: u64) -> Box<dyn Environment> {
        self.0.reset(seed)
    }
    fn scripted(&self) -> bool {
        false
    }
}

/// Decision mode: the model plays each of a step's seeds to the end to draw its
/// decision; eval's decision driver, on the same seeds with the same sampling seed,
/// plays the same episodes, so every drawn decision is the state eval's episode
/// reaches after the decision's step count (the same actions, step by step). Greedy,
/// and sampled at T = 5 (see the episode-mode test).
#[test]
fn a_decision_seed_plays_the_same_trajectory_in_training_and_in_eval() {
    let dir = tempfile::tempdir().unwrap();
    let (model, tok) = tiny(dir.path());
    let opts = rounds(4);
    let built_in = || Box::new(ModelPlayed(envs::create("ticketmelt", &opts).unwrap()));
    let mut later = 0;
    let mut transcripts = Vec::new();
    for temperature in [0.0, 5.0] {
        let g = grpo(temperature, 24);
        let mut task = EnvTask::from_factory(built_in()).continued_by(ContinueWith::Model);
        let step_seed = 5;
        let batch = collect(
            &model,
            &tok,
            &mut task,
            &g,
            step_seed,
            true,
            &Dist::single(),
        )
        .unwrap();
        let seeds = step_seeds(step_seed, g.prompts_per_step);
        let params = g.sampling_params(tok.stop_ids(), mix(step_seed, 3));
        let out = play(&model, &tok, built_in().as_ref(), &seeds, &params, 32).unwrap();
        for (p, prompt) in batch.prompts.iter().enumerate() {
            let d = task.model_continued(prompt).expect("a drawn decision");
            assert_eq!(d.seed, seeds[p].seed);
            let drawn = d.env.transcript()["steps"].as_array().unwrap().clone();
            let played = out.transcripts[p]["transcript"]["steps"]
                .as_array()
                .unwrap();
            assert_eq!(drawn.len(), d.step);
            assert!(
                d.step < played.len(),
                "the decision falls inside eval's episode"
            );
            assert_eq!(drawn[..], played[..d.step], "T = {temperature}, prompt {p}");
            assert_eq!(
                prompt.text,
                tok.render(&d.messages).unwrap().0,
                "the prompt is the decision's observation"
            );
            later += usize::from(d.step > 0);
        }
        transcripts.push(out.transcripts);
    }
    assert!(later > 0, "some decision falls after the first step");
    assert_ne!(
        transcripts[0], transcripts[1],
        "sampled episodes differ from greedy ones"
    );
}

//! Episode mode (`[env] mode = "episode"`): whole trajectories as completions, on the
//! built-in tiny model with Qwen's real tokenizer and chat template. Masking (the loss
//! never depends on environment-token log-probs), truncation, the ids fed to the model
//! against the ids trained on (turn for turn), batch independence, self-play seats, and
//! GRPO end to end through the smoke configs.
use candle_core::{DType, Device, Tensor, Var};
use concord::config::{Config, EnvConfig, EnvMode, ImportanceSamplingLevel, LossType};
use concord::dist::Dist;
use concord::envs::{self, EnvFactory, Options};
use concord::grpo::batch::collect;
use concord::grpo::loss::{grpo_loss, LossInputs, LossParams, LossScale};
use concord::learn::forward::completion_logprobs;
use concord::learn::pack;
use concord::model::load::{load_model, ModelSpec};
use concord::model::lora::LoraConfig;
use concord::model::tiny::IM_END_ID;
use concord::model::tokenizer::Tokenizer;
use concord::model::Input;
use concord::model::{Mode, Transformer};
use concord::sample::{ChooseOn, SamplingParams};
use concord::task::episode::{play_episodes, EpisodeTask, Played};
use concord::task::{Renderer, Task};
use std::path::Path;

/// The built-in tiny model (Qwen's real tokenizer and chat template) with LoRA on q and v.
pub(crate) fn tiny(dir: &Path) -> (Transformer, Tokenizer) {
    let m = load_model(&ModelSpec {
        dtype: Some(DType::F32),
        lora: Some(LoraConfig {
            r: 4,
            alpha: 8.0,
            dropout: 0.0,
            target_modules: vec!["q_proj".into(), "v_proj".into()],
            use_rslora: false,
            init_seed: 1,
        }),
        init_tiny: true,
        ..ModelSpec::new(dir.join("tiny").display().to_string(), Device::Cpu)
    })
    .unwrap();
    (m.model, m.tokenizer.unwrap())
}

/// Sampling where turns end at the real stop tokens or every 7th id (a random model
/// rarely writes `<|im_end|>`).
fn params(tok: &Tokenizer, budget: usize, seed: u64) -> SamplingParams {
    let mut stop = tok.stop_ids();
    stop.extend((0..151_643u32).step_by(7));
    SamplingParams {
        temperature: 1.0,
        max_new_tokens: budget,
        stop_token_ids: stop,
        seed,
        ..Default::default()
    }
}

fn task(env: &str, opts: &[(&str, &str)], max_turn: usize) -> EpisodeTask {
    let mut o = Options::new();
    for (k, v) in opts {
        o.insert(k.to_string(), toml::Value::String(v.to_string()));
    }
    EpisodeTask::new(env, &o, false)
        .unwrap()
        .with_max_turn_tokens(max_turn)
}

/// Runs of equal mask value: (is_model, range).
fn segments(mask: &[f32]) -> Vec<(bool, std::ops::Range<usize>)> {
    let mut out: Vec<(bool, std::ops::Range<usize>)> = Vec::new();
    for (i, &m) in mask.iter().enumerate() {
        let model = m > 0.0;
        match out.last_mut() {
            Some((k, r)) if *k == model => r.end = i + 1,
            _ => out.push((model, i..i + 1)),
        }
    }
    out
}

/// Replays a single-seat trajectory through a fresh episode: every model turn's text
/// is the played one and every environment turn's ids are exactly the chat template's
/// rendering of what the environment said then, rendered on its own.
fn replay_turn_for_turn(
    factory: &dyn EnvFactory,
    seed: u64,
    seat: usize,
    p: &Played,
    tok: &Tokenizer,
    stops: &[u32],
) {
    let ids = &p.trajectory.ids;
    let segs = segments(&p.trajectory.env_mask);
    let mut env = factory.reset(seed);
    let mut turn = 0;
    let mut stop = None;
    for (model, r) in segs {
        let seg = &ids[r.clone()];
        if model {
            let last = *seg.last().unwrap();
            let (text, s) = if stops.contains(&last) {
                (tok.decode(&seg[..seg.len() - 1]).unwrap(), Some(last))
            } else {
                (tok.decode(seg).unwrap(), None)
            };
            if turn < p.texts.len() {
                assert_eq!(text, p.texts[turn], "model turn {turn}");
            }
            stop = s;
            turn += 1;
        } else {
            // the environment turn follows the model turn just played
            let text = &p.texts[turn - 1];
            let out = env.step(std::slice::from_ref(text)).unwrap();
            assert!(!env.done());
            let fb = out
                .position(seat)
                .map(|k| out.feedback[k].clone())
                .unwrap_or_default();
            let obs = env.turn_message(seat).content;
            let content = if fb.trim().is_empty() {
                obs
            } else {
                format!("{fb}\n\n{obs}")
            };
            let want = tok.render_env_turn(&content, stop).unwrap();
            assert_eq!(seg, &want[..], "environment turn after model turn {turn}");
        }
    }
    assert_eq!(turn, p.trajectory.model_turns);
}

#[test]
fn environment_turns_render_like_the_whole_conversation() {
    let dir = tempfile::tempdir().unwrap();
    let (_, tok) = tiny(dir.path());
    let turn = tok.env_turn_text("obs 2", Some(IM_END_ID)).unwrap();
    assert_eq!(
        turn,
        "\n<|im_start|>user\nobs 2<|im_end|>\n<|im_start|>assistant\n"
    );
    // not ended by <|im_end|> (a turn cap, a stop string): the template's close comes too
    let turn = tok.env_turn_text("obs 2", None).unwrap();
    assert!(turn.starts_with("<|im_end|>\n<|im_start|>user\n"), "{turn}");
    // prompt + answer + stop + environment turn = the template of the whole conversation
    use concord::envs::Message;
    let msgs = vec![Message::system("sys"), Message::user("obs 1")];
    let (prompt, _) = tok.render(&msgs).unwrap();
    let mut all = msgs.clone();
    all.push(Message::assistant("answer"));
    all.push(Message::user("obs 2"));
    let whole = tok.apply_chat_template(&all, true).unwrap();
    let appended = format!(
        "{prompt}answer<|im_end|>{}",
        tok.env_turn_text("obs 2", Some(IM_END_ID)).unwrap()
    );
    assert_eq!(appended, whole);
}

#[test]
fn ids_fed_equal_ids_trained_turn_for_turn() {
    ids_fed_equal_ids_trained(ChooseOn::Host);
}

/// The same with the token choice as tensor ops (what a GPU uses), run on the CPU.
#[test]
fn ids_fed_equal_ids_trained_device_chooser() {
    ids_fed_equal_ids_trained(ChooseOn::Device);
}

fn ids_fed_equal_ids_trained(on: ChooseOn) {
    let dir = tempfile::tempdir().unwrap();
    let (model, tok) = tiny(dir.path());
    let t = task("ticketmelt", &[], 12);
    let prompts = t.starts(envs::training_seed(11), &tok).unwrap();
    assert_eq!(prompts.len(), 1, "one policy seat");
    let p = params(&tok, 6000, 5);
    let (played, _) = play_episodes(&model, &tok, &t, &prompts, 2, &p, 0, on).unwrap();
    let mut multi = false;
    for pl in &played[0] {
        let tr = &pl.trajectory;
        assert_eq!(tr.ids.len(), tr.env_mask.len());
        assert_eq!(tr.ids.len(), tr.full_logprobs.len());
        // every id but the last sampled one went into the KV cache, in order
        assert_eq!(tr.fed, tr.ids[..tr.ids.len() - 1], "fed ids");
        assert!(tr.env_mask.contains(&0.0), "no environment turn");
        multi |= tr.model_turns > 2;
        replay_turn_for_turn(
            t.factory(),
            envs::training_seed(11),
            0,
            pl,
            &tok,
            &p.stop_token_ids,
        );
        assert!(
            !tr.truncated,
            "a 6000-token budget holds a TICKETMELT episode"
        );
    }
    assert!(multi);
}

#[test]
fn collected_rollouts_pack_to_the_sampled_ids_and_logprobs() {
    let dir = tempfile::tempdir().unwrap();
    let (model, tok) = tiny(dir.path());
    let mut t = task("ticketmelt", &[], 10);
    let mut g = concord::config::GrpoConfig {
        num_generations: 2,
        prompts_per_step: 1,
        max_completion_length: 1500,
        ..Default::default()
    };
    g.temperature = 1.0;
    let batch = collect(&model, &tok, &mut t, &g, 3, true, &Dist::single()).unwrap();
    assert_eq!(batch.rollouts.len(), 2);
    assert_eq!(batch.turns.len(), 2);
    for r in &batch.rollouts {
        let packed = pack(&[&r.sequence(false)], 0).unwrap();
        let mut want = r.prompt_ids.clone();
        want.extend(&r.completion_ids);
        assert_eq!(packed.ids, want, "the packed row is prompt + trajectory");
        assert_eq!(packed.mask, r.env_mask, "loss mask = model tokens");
        // the sampler's log-probs (KV cache, environment turns appended) match a
        // training forward over the concatenated ids, on every model token
        let (lp, _) = completion_logprobs(&model, &packed, Mode::Detached, 1.0, false).unwrap();
        let lp: Vec<f32> = lp.flatten_all().unwrap().to_vec1().unwrap();
        let s = r.sampler_logp.as_ref().unwrap();
        for (i, m) in r.env_mask.iter().enumerate() {
            if *m > 0.0 {
                assert!(
                    (lp[i] - s[i]).abs() < 2e-3,
                    "token {i}: {} vs {}",
                    lp[i],
                    s[i]
                );
            } else {
                assert_eq!(s[i], 0.0);
            }
        }
    }
}

#[test]
fn loss_gradient_ignores_environment_token_logprobs() {
    // a trajectory's mask: model turn, environment turn, model turn, environment turn
    let mask: Vec<f32> = [1.0; 3]
        .iter()
        .chain(&[0.0; 4])
        .chain(&[1.0; 2])
        .chain(&[0.0; 3])
        .copied()
        .collect();
    let t = mask.len();
    let d = Device::Cpu;
    let rows = 2;
    let mut m2 = mask.clone();
    m2.extend(&mask);
    let mask_t = Tensor::from_vec(m2.clone(), (rows, t), &d).unwrap();
    let base: Vec<f32> = (0..rows * t).map(|i| -0.3 - 0.07 * i as f32).collect();
    let old: Vec<f32> = base.iter().map(|x| x + 0.05).collect();
    let old_t = Tensor::from_vec(old, (rows, t), &d).unwrap();
    let adv = Tensor::new(&[0.7f32, -0.4], &d).unwrap();
    let scale = LossScale::from_masks(m2.chunks(t));
    let run = |lp: &[f32], lt: LossType, level: ImportanceSamplingLevel| -> (f64, Vec<f32>) {
        let var = Var::from_tensor(&Tensor::from_vec(lp.to_vec(), (rows, t), &d).unwrap()).unwrap();
        let p = LossParams {
            loss_type: lt,
            level,
            beta: 0.05,
            max_completion_length: 16,
            ..LossParams::default()
        };
        let reference = old_t.affine(1.0, -0.02).unwrap();
        let out = grpo_loss(
            &LossInputs {
                logp: var.as_tensor(),
                old_logp: Some(&old_t),
                ref_logp: Some(&reference),
                advantages: &adv,
                mask: &mask_t,
                entropy: None,
                sampler_logp: None,
            },
            &p,
            &scale,
        )
        .unwrap();
        let grads = out.loss.backward().unwrap();
        let g: Vec<f32> = grads
            .get(var.as_tensor())
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        (out.stats.loss, g)
    };
    // environment-token log-probs replaced by anything else
    let other: Vec<f32> = base
        .iter()
        .zip(&m2)
        .map(|(&x, &m)| if m > 0.0 { x } else { x - 3.0 })
        .collect();
    for lt in [
        LossType::Grpo,
        LossType::Bnpo,
        LossType::DrGrpo,
        LossType::Dapo,
        LossType::Cispo,
        LossType::Sapo,
        LossType::Luspo,
        LossType::Vespo,
    ] {
        for level in [
            ImportanceSamplingLevel::Token,
            ImportanceSamplingLevel::Sequence,
        ] {
            let (l1, g1) = run(&base, lt, level);
            let (l2, g2) = run(&other, lt, level);
            assert!(
                (l1 - l2).abs() < 1e-9,
                "{lt:?}/{level:?}: loss {l1} vs {l2}"
            );
            for i in 0..rows * t {
                if m2[i] == 0.0 {
                    assert_eq!(g1[i], 0.0, "{lt:?}/{level:?}: env token {i}");
                    assert_eq!(g2[i], 0.0);
                } else {
                    assert!((g1[i] - g2[i]).abs() < 1e-7, "{lt:?}/{level:?}: token {i}");
                }
            }
            assert!(
                g1.iter().any(|&x| x != 0.0),
                "{lt:?}/{level:?}: no gradient"
            );
        }
    }
}

#[test]
fn long_trajectories_are_truncated_and_marked() {
    let dir = tempfile::tempdir().unwrap();
    let (model, tok) = tiny(dir.path());
    let seed = envs::training_seed(4);
    // (a) the first environment turn does not fit: the row ends after one model turn
    let t = task("ticketmelt", &[], 12);
    let prompts = t.starts(seed, &tok).unwrap();
    let p = params(&tok, 60, 1);
    let (played, _) = play_episodes(&model, &tok, &t, &prompts, 2, &p, 0, ChooseOn::Auto).unwrap();
    for pl in &played[0] {
        let tr = &pl.trajectory;
        assert!(tr.truncated);
        assert_eq!(tr.model_turns, 1);
        assert!(tr.ids.len() <= 12 && tr.env_mask.iter().all(|&m| m == 1.0));
        // the continuation policy finished the episode: a final reward exists
        assert!(pl.reward.scalar.is_finite());
    }
    // (b) cut inside a model turn, after some environment turns
    let t = task("ticketmelt", &[], 12);
    let p = params(&tok, 900, 2);
    let (played, _) = play_episodes(&model, &tok, &t, &prompts, 2, &p, 0, ChooseOn::Auto).unwrap();
    for pl in &played[0] {
        let tr = &pl.trajectory;
        assert!(tr.truncated);
        assert!(tr.ids.len() <= 900);
        assert!(tr.model_turns >= 2, "{}", tr.model_turns);
        assert!(tr.env_mask.contains(&0.0));
    }
    // (c) the budget holds the episode: not truncated
    let p = params(&tok, 8000, 2);
    let (played, _) = play_episodes(&model, &tok, &t, &prompts, 1, &p, 0, ChooseOn::Auto).unwrap();
    assert!(!played[0][0].trajectory.truncated);
}

#[test]
fn a_batched_trajectory_equals_the_same_trajectory_sampled_alone() {
    batched_equals_alone(ChooseOn::Host, 2000);
}

#[test]
fn a_batched_trajectory_equals_the_same_trajectory_sampled_alone_device_chooser() {
    batched_equals_alone(ChooseOn::Device, 1200);
}

fn batched_equals_alone(on: ChooseOn, budget: usize) {
    let dir = tempfile::tempdir().unwrap();
    let (model, tok) = tiny(dir.path());
    let t = task("ticketmelt", &[], 9);
    let mut prompts = t.starts(envs::training_seed(21), &tok).unwrap();
    prompts.extend(t.starts(envs::training_seed(22), &tok).unwrap());
    // hot enough that the tiny random model's episodes differ
    let p = SamplingParams {
        temperature: 4.0,
        ..params(&tok, budget, 77)
    };
    let g = 2;
    let (batched, _) = play_episodes(&model, &tok, &t, &prompts, g, &p, 0, on).unwrap();
    for (pi, group) in batched.iter().enumerate() {
        let one = t.starts(envs::training_seed(21 + pi as u64), &tok).unwrap();
        let (alone, _) = play_episodes(&model, &tok, &t, &one, g, &p, pi, on).unwrap();
        for j in 0..g {
            let (a, b) = (&group[j].trajectory, &alone[0][j].trajectory);
            assert_eq!(a.ids, b.ids, "prompt {pi} episode {j}");
            assert_eq!(a.env_mask, b.env_mask);
            assert_eq!(a.truncated, b.truncated);
            assert_eq!(group[j].reward, alone[0][j].reward);
            for (x, y) in a.full_logprobs.iter().zip(&b.full_logprobs) {
                assert!((x - y).abs() < 1e-4);
            }
        }
        let distinct: std::collections::BTreeSet<_> =
            group.iter().map(|p| p.trajectory.ids.clone()).collect();
        assert!(distinct.len() > 1, "independent episodes differ");
    }
}

#[test]
#[allow(clippy::needless_range_loop)]
fn self_play_seats_each_train_their_own_sequence() {
    let dir = tempfile::tempdir().unwrap();
    let (model, tok) = tiny(dir.path());
    let t = task("ticketmelt", &[("peers", "self_play")], 8);
    let seed = envs::training_seed(31);
    let prompts = t.starts(seed, &tok).unwrap();
    assert_eq!(prompts.len(), 4);
    let p = params(&tok, 6000, 9);
    let (played, _) = play_episodes(&model, &tok, &t, &prompts, 2, &p, 0, ChooseOn::Auto).unwrap();
    assert_eq!(played.len(), 4);
    for j in 0..2 {
        // the four seats played one episode: replaying their texts together gives it
        let mut env = t.factory().reset(seed);
        let turns = played[0][j].texts.len();
        for s in 0..4 {
            assert_eq!(played[s][j].texts.len(), turns, "seats move together");
            assert!(!played[s][j].trajectory.truncated);
        }
        for k in 0..turns {
            let acts: Vec<String> = (0..4).map(|s| played[s][j].texts[k].clone()).collect();
            env.step(&acts).unwrap();
        }
        assert!(env.done());
        for s in 0..4 {
            let mut r = played[s][j].reward.clone();
            r.components.remove(concord::task::episode::STEP_REWARDS);
            assert_eq!(env.reward(s), r, "seat {s}");
            // each seat's own observation opens its own sequence
            assert_eq!(
                prompts[s].ids,
                tok.render(&t.factory().reset(seed).observation(s))
                    .unwrap()
                    .1
            );
        }
    }
}

#[test]
fn whispers_episodes_run_many_turns() {
    let dir = tempfile::tempdir().unwrap();
    let (model, tok) = tiny(dir.path());
    let mut t = task("whispers", &[], 8);
    let prompts = t.prompts(5, 1, &tok).unwrap();
    let p = params(&tok, 3000, 3);
    let (played, _) = play_episodes(&model, &tok, &t, &prompts, 2, &p, 0, ChooseOn::Auto).unwrap();
    for pl in &played[0] {
        assert!(
            pl.trajectory.model_turns >= 2,
            "{}",
            pl.trajectory.model_turns
        );
        assert_eq!(pl.trajectory.fed.len() + 1, pl.trajectory.ids.len());
    }
}

/// Compacting a KV cache whose rows appended padded chunks leaves attention as it was.
#[test]
fn compacted_cache_attends_like_the_padded_one() {
    let dir = tempfile::tempdir().unwrap();
    let (model, _) = tiny(dir.path());
    let d = Device::Cpu;
    let mut a = model.new_cache(2, 32).unwrap();
    let feeds: [(&[u32], &[u8]); 3] = [
        (
            &[11, 12, 13, 14, 15, 16, 0, 0, 0, 21],
            &[1, 1, 1, 1, 1, 0, 0, 0, 0, 1],
        ),
        (
            &[0, 0, 31, 32, 33, 41, 42, 43, 44, 45],
            &[0, 0, 1, 1, 1, 1, 1, 1, 1, 1],
        ),
        (&[7, 8], &[1, 1]),
    ];
    let w = |f: &[u32]| f.len() / 2;
    for (ids, mask) in &feeds[..2] {
        let t = Tensor::from_vec(ids.to_vec(), (2, w(ids)), &d).unwrap();
        model
            .forward(Input::cached(&t, Some(mask), &mut a), Mode::Detached)
            .unwrap();
    }
    let mut b = a.compact().unwrap();
    assert_eq!(b.len(), 8);
    assert_eq!(a.len(), 10);
    let (ids, mask) = feeds[2];
    let t = Tensor::from_vec(ids.to_vec(), (2, 1), &d).unwrap();
    let la = model
        .last_logits(
            &model
                .forward(Input::cached(&t, Some(mask), &mut a), Mode::Detached)
                .unwrap()
                .rows,
        )
        .unwrap();
    let lb = model
        .last_logits(
            &model
                .forward(Input::cached(&t, Some(mask), &mut b), Mode::Detached)
                .unwrap()
                .rows,
        )
        .unwrap();
    let diff = (la - lb).unwrap().abs().unwrap().max_all().unwrap();
    assert!(diff.to_scalar::<f32>().unwrap() < 1e-4);
}

#[test]
fn merge_ring_trains_in_episode_mode_too() {
    let dir = tempfile::tempdir().unwrap();
    let (model, tok) = tiny(dir.path());
    let mut t = task("merge_ring", &[], 8);
    let g = concord::config::GrpoConfig {
        num_generations: 2,
        prompts_per_step: 1,
        max_completion_length: 1200,
        ..Default::default()
    };
    let batch = collect(&model, &tok, &mut t, &g, 8, true, &Dist::single()).unwrap();
    assert!(batch.rollouts.len() >= 2);
    assert!(batch.turns.iter().all(|&n| n >= 1));
    for r in &batch.rollouts {
        assert_eq!(r.env_mask.len(), r.completion_ids.len());
        assert!(r.completion_ids.len() <= 1200);
    }
}

fn smoke(config: &str, name: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let cfg = Path::new(env!("CARGO_MANIFEST_DIR")).join(config);
    concord::train::run(concord::train::TrainOptions {
        config: Some(cfg),
        sets: vec![
            format!("run.output_dir={}", dir.path().display()),
            format!("model.name={}", dir.path().join("tiny").display()),
        ],
        resume: None,
        overwrite: false,
    })
    .unwrap();
    std::fs::read_to_string(dir.path().join(name).join("training_log.csv")).unwrap()
}

fn column(log: &str, name: &str) -> Vec<f64> {
    let mut lines = log.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    let i = header
        .iter()
        .position(|h| *h == name)
        .unwrap_or_else(|| panic!("{name}"));
    lines
        .map(|l| l.split(',').nth(i).unwrap().parse().unwrap())
        .collect()
}

#[test]
fn ticketmelt_episode_smoke_config_trains() {
    let log = smoke(
        "configs/ticketmelt-episode-smoke.toml",
        "ticketmelt-episode-smoke",
    );
    assert_eq!(log.lines().count(), 3, "{log}");
    let turns = column(&log, "episode/mean_turns");
    assert!(turns.iter().all(|&t| t >= 2.0), "{turns:?}");
    assert!(column(&log, "episode/env_tokens").iter().all(|&t| t > 0.0));
    assert!(column(&log, "episode/model_tokens")
        .iter()
        .all(|&t| t > 0.0));
    column(&log, "episode/truncated_frac");
}

#[test]
fn whispers_episode_smoke_config_trains() {
    let log = smoke(
        "configs/whispers-episode-smoke.toml",
        "whispers-episode-smoke",
    );
    assert_eq!(log.lines().count(), 3, "{log}");
    assert!(column(&log, "episode/mean_turns").iter().all(|&t| t >= 2.0));
}

#[test]
fn postmortem_episode_smoke_config_trains() {
    let log = smoke(
        "configs/postmortem-episode-smoke.toml",
        "postmortem-episode-smoke",
    );
    assert_eq!(log.lines().count(), 3, "{log}");
    assert!(column(&log, "episode/mean_turns").iter().all(|&t| t >= 2.0));
    assert!(column(&log, "episode/env_tokens").iter().all(|&t| t > 0.0));
}

#[test]
fn config_keys_are_checked() {
    let base = "[run]\nsteps = 1\n[model]\nname = \"tiny\"\n";
    let ok = Config::from_toml_str(
        &format!("{base}[env]\nname = \"ticketmelt\"\nmode = \"episode\"\nshaped_rewards = true\nmax_turn_tokens = 64\n"),
        "t.toml",
        &[],
    )
    .unwrap();
    let env = ok.env.unwrap();
    assert_eq!(env.mode, EnvMode::Episode);
    assert!(env.shaped_rewards);
    // decision is the default and serialises as before
    let d = Config::from_toml_str(
        &format!("{base}[env]\nname = \"ticketmelt\"\n"),
        "t.toml",
        &[],
    )
    .unwrap();
    assert_eq!(
        d.env.as_ref().unwrap(),
        &EnvConfig::new("ticketmelt", Options::new())
    );
    assert!(!toml::to_string(&d).unwrap().contains("\nmode = "));
    for bad in [
        "[env]\nname = \"ticketmelt\"\nshaped_rewards = true\n",
        "[env]\nname = \"ticketmelt\"\nmode = \"episode\"\n[grpo]\ndynamic_sampling = true\n",
        "[env]\nname = \"ticketmelt\"\nmode = \"turns\"\n",
    ] {
        assert!(
            Config::from_toml_str(&format!("{base}{bad}"), "t.toml", &[]).is_err(),
            "{bad}"
        );
    }
}

#[test]
fn shaped_rewards_sum_the_step_rewards() {
    let dir = tempfile::tempdir().unwrap();
    let (model, tok) = tiny(dir.path());
    let t = EpisodeTask::new("ticketmelt", &Options::new(), true)
        .unwrap()
        .with_max_turn_tokens(8);
    assert!(t
        .component_names()
        .contains(&concord::task::episode::STEP_REWARDS.to_string()));
    let prompts = t.starts(envs::training_seed(2), &tok).unwrap();
    let p = params(&tok, 6000, 4);
    let (played, _) = play_episodes(&model, &tok, &t, &prompts, 2, &p, 0, ChooseOn::Auto).unwrap();
    for pl in &played[0] {
        assert_eq!(pl.reward.scalar, pl.step_rewards);
        assert_eq!(pl.reward.components["step_rewards"], pl.step_rewards);
    }
}

/// A curriculum whose first stage trains whole TICKETMELT episodes and whose second
/// trains single decisions (the `[env]` default), through `concord train`; then the same
/// run stopped after step 1 and resumed: the same rows, the same switch.
#[test]
fn an_episode_curriculum_switches_mode_and_resumes_identically() {
    let dir = tempfile::tempdir().unwrap();
    let toml = r#"
[run]
name = "cur"
steps = 3
save_every = 1
[model]
init_tiny = true
[lora]
r = 4
alpha = 8
targets = ["q_proj", "v_proj"]
[grpo]
num_generations = 2
prompts_per_step = 1
max_completion_length = 600
[optim]
learning_rate = 1e-3
schedule = "constant"
[env]
name = "ticketmelt"
max_turn_tokens = 16
[env.options]
peers = "dumb"
[[stage]]
name = "episodes"
mode = "episode"
steps = 2
[[stage]]
name = "decisions"
[stage.grpo]
max_completion_length = 8
"#;
    let cfg_path = dir.path().join("cur.toml");
    std::fs::write(&cfg_path, toml).unwrap();
    let train = |name: &str, steps: usize, resume: bool| {
        let run = dir.path().join(name);
        concord::train::run(concord::train::TrainOptions {
            config: Some(cfg_path.clone()),
            sets: vec![
                format!("run.output_dir={}", dir.path().display()),
                format!("run.name={name}"),
                format!("run.steps={steps}"),
                format!("model.name={}", dir.path().join("tiny").display()),
            ],
            resume: resume.then_some(run.clone()),
            overwrite: false,
        })
        .unwrap();
        std::fs::read_to_string(run.join("training_log.csv")).unwrap()
    };
    let full = train("full", 3, false);
    let rows: Vec<Vec<&str>> = full.lines().map(|l| l.split(',').collect()).collect();
    let col = |name: &str| rows[0].iter().position(|h| *h == name).unwrap();
    let stages: Vec<&str> = rows[1..].iter().map(|r| r[col("stage")]).collect();
    assert_eq!(stages, ["episodes", "episodes", "decisions"]);
    // Episode steps play several turns with environment tokens between them; the
    // decision step plays one turn.
    let turns = column(&full, "episode/mean_turns");
    assert!(turns[..2].iter().all(|&t| t >= 2.0), "{turns:?}");
    assert!(column(&full, "episode/env_tokens")[..2]
        .iter()
        .all(|&t| t > 0.0));
    assert!(column(&full, "completions/max_length")[2] <= 8.0);

    train("part", 1, false);
    let resumed = train("part", 3, true);
    let other: Vec<Vec<&str>> = resumed.lines().map(|l| l.split(',').collect()).collect();
    assert_eq!(rows.len(), other.len(), "{resumed}");
    assert_eq!(rows[0], other[0]);
    for (a, b) in rows[1..].iter().zip(&other[1..]) {
        for (i, name) in rows[0].iter().enumerate() {
            if !concord::run::log::TIMING_COLUMNS.contains(name) {
                assert_eq!(a[i], b[i], "column {name} differs at step {}", a[0]);
            }
        }
    }
}

#[test]
fn episode_stages_are_checked() {
    let base = "[run]\nsteps = 3\n[model]\nname = \"tiny\"\n[env]\nname = \"ticketmelt\"\n";
    let stage =
        |s: &str| format!("{base}[[stage]]\nname = \"a\"\nsteps = 1\n{s}[[stage]]\nname = \"b\"\n");
    let c = Config::from_toml_str(&stage("mode = \"episode\"\n"), "t.toml", &[]).unwrap();
    assert_eq!(c.stages[0].mode, Some(EnvMode::Episode));
    assert_eq!(c.stages[1].mode, None);
    for (bad, needle) in [
        (
            stage("mode = \"episode\"\nenvs = { ticketmelt = 1.0, merge_ring = 1.0 }\n"),
            "one environment",
        ),
        (
            stage("mode = \"episode\"\n[stage.grpo]\ndynamic_sampling = true\n"),
            "dynamic_sampling",
        ),
        (stage("mode = \"turns\"\n"), "turns"),
    ] {
        let e = format!(
            "{:#}",
            Config::from_toml_str(&bad, "t.toml", &[]).unwrap_err()
        );
        assert!(e.contains(needle), "{needle:?} not in {e}");
    }
    // [env]'s episode keys are allowed when a stage plays episodes, and a decision
    // stage of the same run does not see them.
    let ok = format!("{base}max_turn_tokens = 16\n[[stage]]\nname = \"a\"\nsteps = 1\nmode = \"episode\"\n[[stage]]\nname = \"b\"\n");
    let c = Config::from_toml_str(&ok, "t.toml", &[]).unwrap();
    let stages = concord::curriculum::build(&c).unwrap();
    assert!(stages[0].task.as_episodes().is_some());
    assert!(stages[1].task.as_episodes().is_none());
    assert_eq!(stages[1].cfg.env.as_ref().unwrap().max_turn_tokens, 0);
}

/// `concord eval` of an episode-mode config plays held-out episodes on the training
/// driver (`play_episodes`): the same rewards as playing the held-out starts directly,
/// whatever the batch; a decision-mode config (or a last stage in decision mode) keeps
/// the decision driver.
#[test]
fn episode_configs_are_evaluated_on_the_training_driver() {
    use concord::eval::{eval_targets, Target};
    let dir = tempfile::tempdir().unwrap();
    let (model, tok) = tiny(dir.path());
    let base = "[run]\nsteps = 3\n[model]\nname = \"tiny\"\n[env]\nname = \"ticketmelt\"\n";
    let episode = format!("{base}mode = \"episode\"\nmax_turn_tokens = 8\n");
    let cfg = |s: &str| Config::from_toml_str(s, "t.toml", &[]).unwrap();
    let targets = eval_targets(&cfg(&episode)).unwrap();
    let Target::Episodes(t) = &targets[0].1 else {
        panic!("an episode config is evaluated on the episode driver")
    };
    assert!(matches!(
        eval_targets(&cfg(base)).unwrap()[0].1,
        Target::Decisions(_)
    ));
    let staged = |last: &str| {
        format!("{base}[[stage]]\nname = \"a\"\nsteps = 1\n[[stage]]\nname = \"b\"\nmode = \"{last}\"\n")
    };
    assert!(matches!(
        eval_targets(&cfg(&staged("episode"))).unwrap()[0].1,
        Target::Episodes(_)
    ));
    assert!(matches!(
        eval_targets(&cfg(&staged("decision"))).unwrap()[0].1,
        Target::Decisions(_)
    ));

    let p = params(&tok, 600, 3);
    let all = targets[0].1.play(&model, &tok, 3, 0, &p, 3).unwrap();
    let one_by_one = targets[0].1.play(&model, &tok, 3, 0, &p, 1).unwrap();
    assert_eq!(all.rewards.len(), 3);
    assert_eq!(all.rewards, one_by_one.rewards);
    assert_eq!(all.transcripts, one_by_one.transcripts);
    for tr in &all.transcripts {
        let texts = tr["seats"][0]["texts"].as_array().unwrap();
        assert!(texts.len() >= 2, "{tr}");
    }
    let first = t.starts(envs::eval_seed(0), &tok).unwrap();
    let (played, _) = play_episodes(&model, &tok, t, &first, 1, &p, 0, ChooseOn::Auto).unwrap();
    assert_eq!(played[0][0].reward.scalar, all.rewards[0]);
    assert_eq!(played[0][0].won, all.wins[0]);
}

//! `[env] continue_with = "model"`: decision mode where the rest of each decision's
//! episode is played by the model being trained instead of the scripted continuation.
//! The driver is checked against the scripted score it must reduce to, and against
//! rewards known by hand (an editor that never publishes earns nothing); the trainer's
//! wiring on the tiny model (determinism, a reward the scripted path cannot give).
//! `[env] roll_in = "model"`: the model also plays each episode up to its decision.
use concord::config::Config;
use concord::envs::contest::action_spread;
use concord::envs::rollout::{Continuation, EachTurn};
use concord::envs::{
    create, sample_decision, score_decision, score_decisions_with, Decision, EnvFactory, Options,
};
use concord::envs::{Contest, ContestRule, Environment};
use concord::task::{EnvTask, Task};
use std::path::Path;

fn factory(name: &str, opts: &[(&str, &str)]) -> Box<dyn EnvFactory> {
    let mut o = Options::new();
    for (k, v) in opts {
        o.insert(k.to_string(), toml::Value::String(v.to_string()));
    }
    create(name, &o).expect("factory")
}

fn decisions(f: &dyn EnvFactory, n: u64) -> Vec<Decision> {
    (0..n).map(|s| sample_decision(f, 1000 + s)).collect()
}

/// With the scripted continuation as the policy, the batched driver gives exactly the
/// scripted score, for good, bad and empty answers, on every environment.
#[test]
fn continued_by_the_scripted_policy_it_is_the_scripted_score() {
    let envs = [
        factory("ticketmelt", &[]),
        factory("merge_ring", &[]),
        factory("whispers", &[("task", "t1")]),
        factory("whispers", &[("task", "t3")]),
        factory("postmortem", &[]),
    ];
    for f in &envs {
        let ds = decisions(f.as_ref(), 12);
        let good: Vec<String> = ds
            .iter()
            .map(|d| d.env.clone_box().continuation_action(d.seat))
            .collect();
        let mut items = Vec::new();
        for (d, g) in ds.iter().zip(&good) {
            for text in [g.as_str(), "gibberish", ""] {
                items.push((d, text));
            }
        }
        let got = score_decisions_with(&items, &mut Continuation).unwrap();
        for ((d, text), r) in items.iter().zip(&got) {
            assert_eq!(
                *r,
                score_decision(d, text),
                "{} seed {} answer {text:?}",
                f.name(),
                d.seed
            );
        }
    }
}

/// An editor that waits and then keeps waiting publishes nothing: reward 0, where the
/// heuristic continuation would have published for it. A publication ends the episode,
/// so its reward does not depend on who would have continued.
#[test]
fn the_continuation_decides_what_a_wait_is_worth_and_not_what_a_publication_is() {
    let f = factory("whispers", &[("task", "t1"), ("prompt", "compact")]);
    let mut ds = decisions(f.as_ref(), 16);
    ds.retain(|d| d.step <= 2);
    assert!(ds.len() >= 4, "{} early decisions", ds.len());
    let wait = r#"{"tool": "wait"}"#;
    let mut waiter =
        EachTurn(|env: &mut dyn concord::envs::Environment, seat| env.policy_action("wait", seat));
    let items: Vec<(&Decision, &str)> = ds.iter().map(|d| (d, wait)).collect();
    for (d, r) in ds
        .iter()
        .zip(score_decisions_with(&items, &mut waiter).unwrap())
    {
        assert_eq!(r.scalar, 0.0, "seed {}: {r:?}", d.seed);
        assert!(score_decision(d, wait).scalar > 0.3, "seed {}", d.seed);
    }
    // publish the truth now: the same reward whoever would have continued
    for d in &ds {
        let mut probe = d.env.clone_box();
        let publish = loop {
            let a = probe.policy_action("heuristic", d.seat).unwrap();
            if a.contains("publish") || probe.done() {
                break a;
            }
            let acts: Vec<String> = probe
                .to_act()
                .into_iter()
                .map(|s| probe.policy_action("heuristic", s).unwrap())
                .collect();
            probe.step(&acts).unwrap();
        };
        let by_waiter = score_decisions_with(&[(d, publish.as_str())], &mut waiter).unwrap();
        assert_eq!(by_waiter[0], score_decision(d, &publish), "seed {}", d.seed);
        assert!(by_waiter[0].scalar > 0.0);
    }
}

fn train(dir: &Path, name: &str, extra: &[&str]) -> String {
    let cfg = Path::new(env!("CARGO_MANIFEST_DIR")).join("configs/whispers-smoke.toml");
    let mut sets = vec![
        format!("run.output_dir={}", dir.display()),
        format!("run.name={name}"),
        format!("model.name={}", dir.join("tiny").display()),
        "env.options.task=\"t1\"".to_string(),
    ];
    sets.extend(extra.iter().map(|s| s.to_string()));
    concord::train::run(concord::train::TrainOptions {
        config: Some(cfg),
        sets,
        resume: None,
        overwrite: false,
    })
    .unwrap();
    std::fs::read_to_string(dir.join(name).join("training_log.csv")).unwrap()
}

fn column(log: &str, name: &str) -> Vec<String> {
    let mut lines = log.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    let i = header.iter().position(|h| *h == name).unwrap();
    lines
        .map(|l| l.split(',').nth(i).unwrap().to_string())
        .collect()
}

/// The tiny random model never writes a publication, so when it plays on, no report is
/// ever published and every reward is 0; the scripted continuation publishes for it.
/// Two runs with one seed write the same log.
#[test]
fn the_model_plays_on_deterministically() {
    let dir = tempfile::tempdir().unwrap();
    let model = ["env.continue_with=\"model\""];
    let a = train(dir.path(), "a", &model);
    let b = train(dir.path(), "b", &model);
    let scripted = train(dir.path(), "s", &[]);
    let rewards = |log: &str| -> Vec<f64> {
        column(log, "reward")
            .iter()
            .map(|x| x.parse().unwrap())
            .collect()
    };
    assert_eq!(rewards(&a), vec![0.0, 0.0], "{a}");
    assert!(rewards(&scripted).iter().all(|&r| r > 0.3), "{scripted}");
    assert_eq!(strip_timings(&a), strip_timings(&b));
}

#[test]
fn continue_with_is_checked() {
    let base = "[run]\nsteps = 1\n[model]\nname = \"tiny\"\n[env]\nname = \"whispers\"\n";
    let parse = |extra: &str| Config::from_toml_str(&format!("{base}{extra}"), "t.toml", &[]);
    let c = parse("continue_with = \"model\"\n").unwrap();
    assert!(toml::to_string(&c)
        .unwrap()
        .contains("continue_with = \"model\""));
    let d = parse("").unwrap();
    assert!(!toml::to_string(&d).unwrap().contains("continue_with"));
    let e = parse("continue_with = \"modle\"\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("continue_with") || e.contains("modle"), "{e}");
    let e = parse("mode = \"episode\"\ncontinue_with = \"model\"\n")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("env.continue_with") && e.contains("decision"),
        "{e}"
    );
    // an episode [env] with a decision stage: the decision stage continues with the model
    let staged = parse(
        "mode = \"episode\"\ncontinue_with = \"model\"\n[[stage]]\nname = \"a\"\nsteps = 1\n\
         [[stage]]\nname = \"b\"\nmode = \"decision\"\n",
    )
    .unwrap();
    let stages = concord::curriculum::build(&staged).unwrap();
    let d = sample_decision(
        factory("whispers", &[]).as_ref(),
        concord::envs::training_seed(1),
    );
    let prompt = concord::task::TaskPrompt {
        ids: vec![],
        text: String::new(),
        state: Box::new(d),
        contest: None,
    };
    assert!(stages[1].task.model_continued(&prompt).is_some());
    assert_eq!(
        stages[1].cfg.env.as_ref().unwrap().continue_with,
        concord::config::ContinueWith::Model
    );
    assert!(stages[0].task.as_episodes().is_some());
}

/// The fix rounds a TICKETMELT seat still needs, from its compact observation
/// ("You: 3 left, deadline 8, spare 4"; "You: restored (round 2)" is 0).
fn left(d: &Decision) -> u32 {
    let text = &d.messages.last().expect("observation").content;
    let at = text.find("You: ").expect("a You: line") + 5;
    if text[at..].starts_with("restored") {
        return 0;
    }
    let n: String = text[at..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    n.parse().unwrap_or_else(|_| panic!("no count in {text}"))
}

/// `d`'s seat at the start of its episode.
fn decision_at_start(start: Box<dyn Environment>, d: &Decision) -> Decision {
    Decision {
        messages: start.observation(d.seat),
        env: start,
        seat: d.seat,
        seed: d.seed,
        step: 0,
    }
}

/// `[env] roll_in = "model"`: the policy plays each episode to its decision. A policy
/// that always monitors never deploys, so every decision it rolls in to finds the seat
/// with all its fix rounds left; the scripted roll-in deploys, and its later decisions
/// find fewer. The same prompts are drawn again with the same seed. With `contested`, a
/// tied decision is replaced by a contested step of the same episode.
#[test]
fn rolled_in_by_the_model_decisions_fall_where_the_model_plays() {
    let mut opts = Options::new();
    opts.insert("prompt".into(), "compact".into());
    let f = create("ticketmelt", &opts).unwrap();
    let dir = tempfile::tempdir().unwrap();
    concord::model::tiny::init_tiny(&concord::model::tiny::TinySpec::default(), dir.path())
        .unwrap();
    let renderer = concord::model::tokenizer::Tokenizer::from_dir(dir.path()).unwrap();
    let model = concord::config::ContinueWith::Model;
    let draw_contests = |task: &mut EnvTask| -> Vec<(Decision, Option<Contest>)> {
        let mut prompts = task.prompts(3, 16, &renderer).unwrap();
        let mut monitor =
            EachTurn(|_: &mut dyn Environment, _| Ok(r#"{"commitment": "MONITOR"}"#.to_string()));
        task.play_to_decisions(&mut prompts, &mut monitor, &renderer)
            .unwrap();
        prompts
            .into_iter()
            .map(|p| {
                assert!(p.is_drawn() && !p.ids.is_empty());
                let d = p.state.downcast_ref::<Decision>().unwrap();
                assert!(p.text.contains(&d.messages.last().unwrap().content));
                (d.clone(), p.contest)
            })
            .collect()
    };
    let draw = |task: &mut EnvTask| -> Vec<Decision> {
        draw_contests(task).into_iter().map(|(d, _)| d).collect()
    };
    let mut rolled = EnvTask::new("ticketmelt", &opts)
        .unwrap()
        .rolled_in_by(model);
    assert!(rolled
        .prompts(3, 4, &renderer)
        .unwrap()
        .iter()
        .all(|p| !p.is_drawn()));
    let by_model = draw(&mut rolled);
    let later = by_model.iter().filter(|d| d.step > 0).count();
    assert!(later >= 8, "{later} of 16 decisions after the first round");
    for d in &by_model {
        let at_start = decision_at_start(f.reset(d.seed), d);
        assert_eq!(left(d), left(&at_start), "seed {} step {}", d.seed, d.step);
    }
    let again = draw(
        &mut EnvTask::new("ticketmelt", &opts)
            .unwrap()
            .rolled_in_by(model),
    );
    for (a, b) in by_model.iter().zip(&again) {
        assert_eq!((a.seed, a.step, &a.messages), (b.seed, b.step, &b.messages));
    }
    // contested: a step of the same episode where the commitment matters, if one of 8
    let rule = ContestRule {
        margin: 0.0,
        draws: 8,
    };
    let mut contested = EnvTask::new("ticketmelt", &opts)
        .unwrap()
        .rolled_in_by(model)
        .contested(Some(rule))
        .unwrap();
    let mut redrawn = 0;
    for ((d, c), plain) in draw_contests(&mut contested).iter().zip(&by_model) {
        let c = c.expect("a contest record");
        assert_eq!(d.seed, plain.seed);
        assert_eq!(c.spread, action_spread(d).unwrap());
        assert_eq!(c.contested, c.spread > 0.0, "{c:?}");
        assert!(c.contested || c.draws == 8, "{c:?}");
        let reset = f.reset(d.seed);
        assert_eq!(
            left(d),
            left(&decision_at_start(reset, d)),
            "seed {}",
            d.seed
        );
        if c.draws == 1 {
            assert_eq!((d.step, &d.messages), (plain.step, &plain.messages));
        } else {
            assert_eq!(action_spread(plain), Some(0.0), "seed {}", d.seed);
            redrawn += 1;
        }
    }
    assert!(redrawn >= 2, "{redrawn} tied decisions redrawn");
    // the scripted roll-in (the default) draws from the same seeds, and has deployed
    let scripted = draw(&mut EnvTask::new("ticketmelt", &opts).unwrap());
    let progressed = scripted
        .iter()
        .zip(&by_model)
        .filter(|(s, m)| {
            assert_eq!(s.seed, m.seed);
            s.step > 0 && left(s) < left(m)
        })
        .count();
    assert!(
        progressed >= 3,
        "{progressed} scripted decisions after a deploy"
    );
}

#[test]
fn roll_in_is_checked() {
    let base = "[run]\nsteps = 1\n[model]\nname = \"tiny\"\n[env]\nname = \"ticketmelt\"\n";
    let parse = |extra: &str| Config::from_toml_str(&format!("{base}{extra}"), "t.toml", &[]);
    let c = parse("roll_in = \"model\"\n").unwrap();
    assert!(toml::to_string(&c).unwrap().contains("roll_in = \"model\""));
    assert!(!toml::to_string(&parse("").unwrap())
        .unwrap()
        .contains("roll_in"));
    let e = parse("mode = \"episode\"\nroll_in = \"model\"\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("env.roll_in") && e.contains("decision"), "{e}");
    assert!(parse("contested = true\nroll_in = \"model\"\n").is_ok());
}

/// A GRPO run rolled in and continued by the tiny model: the same seed writes the same
/// log, and its prompts are not the scripted roll-in's.
#[test]
fn a_run_rolled_in_by_the_model_is_deterministic() {
    let dir = tempfile::tempdir().unwrap();
    let sets = [
        "env.continue_with=\"model\"",
        "env.roll_in=\"model\"",
        "run.log_samples=8",
    ];
    let a = train(dir.path(), "a", &sets);
    let b = train(dir.path(), "b", &sets);
    train(dir.path(), "s", &sets[..1]);
    assert_eq!(strip_timings(&a), strip_timings(&b));
    let prompts = |name: &str| -> Vec<String> {
        std::fs::read_to_string(dir.path().join(name).join("samples.jsonl"))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["prompt"].to_string())
            .collect()
    };
    assert_eq!(prompts("a"), prompts("b"));
    assert!(!prompts("a").is_empty());
    assert_ne!(prompts("a"), prompts("s"));
}

/// A log's rows without its timing columns.
fn strip_timings(log: &str) -> Vec<String> {
    let header: Vec<&str> = log.lines().next().unwrap().split(',').collect();
    log.lines()
        .map(|l| {
            l.split(',')
                .zip(&header)
                .filter(|(_, h)| {
                    !["time", "seconds", "per_s", "mem"]
                        .iter()
                        .any(|t| h.contains(t))
                })
                .map(|(v, _)| v)
                .collect::<Vec<_>>()
                .join(",")
        })
        .collect()
}

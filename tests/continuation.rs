//! `[env] continue_with = "model"`: decision mode where the rest of each decision's
//! episode is played by the model being trained instead of the scripted continuation.
//! The driver is checked against the scripted score it must reduce to, and against
//! rewards known by hand (an editor that never publishes earns nothing); the trainer's
//! wiring on the tiny model (determinism, a reward the scripted path cannot give).
use concord::config::Config;
use concord::envs::rollout::{Continuation, EachTurn};
use concord::envs::{
    create, sample_decision, score_decision, score_decisions_with, Decision, EnvFactory, Options,
};
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
    let strip = |log: &str| -> Vec<String> {
        // everything but the timings
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
    };
    assert_eq!(strip(&a), strip(&b));
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

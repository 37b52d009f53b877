//! Whispers acceptance tests: determinism and replay, the rubric on hand-made episodes,
//! shaping conditions, verification answers, the baselines over 500 seeds per task,
//! parser robustness, decision mode, the CLI and a training smoke run.
#![allow(clippy::needless_range_loop)]
use crate::util::concord_ok;
use concord::envs::whispers::rules::{Kind, Mark, Role, Whispers, NONE};
use concord::envs::whispers::{parse_action, Rules, TASKS, TEMPLATES};
use concord::envs::{
    create, replay, sample_decision, score_decision, EnvFactory, Environment, Options,
};
use proptest::prelude::*;

fn factory(opts: &[(&str, toml::Value)]) -> Box<dyn EnvFactory> {
    let mut o = Options::new();
    for (k, v) in opts {
        o.insert(k.to_string(), v.clone());
    }
    create("whispers", &o).expect("factory")
}

fn task(t: &str) -> Box<dyn EnvFactory> {
    factory(&[("task", t.into())])
}

fn play_policy(f: &dyn EnvFactory, seed: u64, policy: &str) -> Box<dyn Environment> {
    concord::envs::play_episode(f, seed, |env, s| env.policy_action(policy, s)).expect("episode")
}

/// The claim text of the truth, for hand-made actions.
fn truth_report(env: &Whispers, conf: f64, skip_last: bool) -> String {
    let t = &TEMPLATES[template_of(env)];
    let truth = env.truth();
    let mut parts = Vec::new();
    for f in 0..4 {
        if skip_last && f == 3 {
            continue;
        }
        parts.push(format!(
            "\"{}\": {{\"value\": \"{}\", \"confidence\": {conf}}}",
            t.fields[f], t.values[f][truth[f] as usize]
        ));
    }
    format!(
        "{{\"tool\": \"publish\", \"final_report\": {{{}}}}}",
        parts.join(", ")
    )
}

fn template_of(env: &Whispers) -> usize {
    TEMPLATES
        .iter()
        .position(|t| std::ptr::eq(t, env.template()))
        .unwrap()
}

fn claim_string(env: &Whispers, c: [u8; 4]) -> String {
    let t = env.template();
    (0..4)
        .filter(|&f| c[f] != NONE)
        .map(|f| format!("{}={}", t.fields[f], t.values[f][c[f] as usize]))
        .collect::<Vec<_>>()
        .join("; ")
}

fn episode(t: &str, seed: u64) -> Whispers {
    let mut o = Options::new();
    o.insert("task".into(), t.into());
    Whispers::new(Rules::from_options(&o).unwrap(), seed)
}

fn step1(env: &mut Whispers, text: &str) -> concord::envs::StepOutcome {
    env.step_texts(&[text]).unwrap()
}

const WAIT: &str = r#"{"tool": "wait"}"#;

#[test]
fn registered_and_described() {
    let f = create("whispers", &Options::new()).unwrap();
    assert_eq!(f.name(), "whispers");
    let d = f.describe();
    for k in [
        "t1",
        "t6",
        "naive_relay",
        "heuristic",
        "calibration",
        "cascade",
    ] {
        assert!(d.contains(k), "{k} missing from describe");
    }
    assert_eq!(f.pools(), ["t1", "t2", "t3", "t4", "t5", "t6"]);
    assert_eq!(
        f.policies(),
        ["random", "wait", "naive_editor", "naive_relay", "heuristic"]
    );
    let mut o = Options::new();
    o.insert("task".into(), "t7".into());
    let e = create("whispers", &o).err().unwrap().to_string();
    assert!(e.contains("t7") && e.contains("t1..t6"), "{e}");
}

#[test]
fn tasks_are_the_originals() {
    let want = [
        ("t1", 3, 2, 0.10, 0, 8, 0u16),
        ("t2", 4, 3, 0.30, 0, 12, 0),
        ("t3", 4, 3, 0.20, 0, 14, 0b10),
        ("t4", 5, 2, 0.10, 1, 18, 0b1),
        ("t5", 6, 5, 0.20, 2, 24, 0b110),
        ("t6", 6, 5, 0.35, 2, 24, 0b100),
    ];
    for (spec, w) in TASKS.iter().zip(want) {
        assert_eq!(spec.id, w.0);
        assert_eq!(spec.seats(), w.1);
        assert_eq!(spec.protagonist, w.2);
        assert_eq!(spec.noise, w.3);
        assert_eq!(spec.budget, w.4);
        assert_eq!(spec.max_steps, w.5);
        assert_eq!(spec.adversary_mask(), w.6);
    }
    assert_eq!(TASKS[4].edges.len(), 8);
    assert_eq!(TASKS[5].neighbour_mask(4), 0b100110);
}

#[test]
fn deterministic_per_seed_and_events_follow_the_noise_model() {
    let f = factory(&[("task", "all".into())]);
    for seed in 0..60 {
        let a = play_policy(f.as_ref(), seed, "random").transcript();
        let b = play_policy(f.as_ref(), seed, "random").transcript();
        assert_eq!(a, b, "seed {seed}");
    }
    assert_ne!(
        play_policy(f.as_ref(), 1, "random").transcript(),
        play_policy(f.as_ref(), 2, "random").transcript()
    );
    // Lies differ from the truth in every field; witness noise matches the task's rate.
    for (ti, spec) in TASKS.iter().enumerate() {
        let (mut wrong, mut total) = (0usize, 0usize);
        for seed in 0..2000 {
            let mut o = Options::new();
            o.insert("task".into(), spec.id.into());
            let ep = Whispers::new(Rules::from_options(&o).unwrap(), seed);
            assert_eq!(ep.task_id(), spec.id);
            let (t, l) = (ep.truth(), ep.lie());
            assert!((0..4).all(|f| t[f] != l[f] && t[f] < 4 && l[f] < 4));
            for s in 0..spec.seats() {
                match ep.role(s) {
                    Role::Witness => {
                        let v = ep.private_view(s);
                        wrong += (0..4).filter(|&f| v[f] != t[f]).count();
                        total += 4;
                    }
                    Role::Adversary => assert_eq!(ep.private_view(s), l),
                    _ => assert_eq!(ep.private_view(s), [NONE; 4]),
                }
            }
        }
        if total > 0 {
            let rate = wrong as f64 / total as f64;
            assert!((rate - spec.noise).abs() < 0.02, "t{} noise {rate}", ti + 1);
        }
    }
}

#[test]
fn transcripts_replay_exactly() {
    let odd = [
        "I will wait",
        r#"{"tool": "publish", "final_report": {"x": 1}}"#,
        r#"{"tool": "accuse", "target_id": 1}"#,
        r#"{"tool": "broadcast", "content": "hello there", "confidence": 0.9}"#,
    ];
    for (seat, t) in [
        ("protagonist", "all"),
        ("self_play", "all"),
        ("adversary", "t5"),
        ("relay", "t4"),
    ] {
        let f = factory(&[("task", t.into()), ("seat", seat.into())]);
        for seed in 0..30 {
            let mut i = 0;
            let env = concord::envs::play_episode(f.as_ref(), seed, |env, s| {
                i += 1;
                Ok(match i % 5 {
                    0 => odd[(i / 5) % odd.len()].to_string(),
                    1 => env.policy_action("random", s)?,
                    2 => format!("sure: {}", env.policy_action("heuristic", s)?),
                    _ => env.policy_action("naive_relay", s)?,
                })
            })
            .unwrap();
            let tr = env.transcript();
            let again = replay(f.as_ref(), &tr).unwrap();
            assert_eq!(again.transcript(), tr, "{seat} {t} seed {seed}");
            for s in env.policy_seats() {
                assert_eq!(again.reward(s), env.reward(s));
            }
        }
        // The fast continuation rollout records replayable texts too.
        for seed in 0..30 {
            let mut env = f.reset(seed);
            env.rollout();
            assert!(env.done());
            let tr = env.transcript();
            let again = replay(f.as_ref(), &tr).unwrap();
            assert_eq!(again.transcript(), tr, "rollout {seat} {t} seed {seed}");
        }
    }
}

#[test]
fn seats_roles_and_self_play() {
    let f = factory(&[("task", "t5".into()), ("seat", "self_play".into())]);
    let env = f.reset(0);
    assert_eq!(env.policy_seats(), [0, 3, 4, 5]);
    let f = factory(&[("task", "t5".into()), ("seat", "adversary".into())]);
    assert_eq!(f.reset(0).policy_seats(), [1, 2]);
    let f = factory(&[("task", "t1".into()), ("seat", 0.into())]);
    assert_eq!(f.reset(0).policy_seats(), [0]);
    for (t, p) in [
        ("t1", 2),
        ("t2", 3),
        ("t3", 3),
        ("t4", 2),
        ("t5", 5),
        ("t6", 5),
    ] {
        assert_eq!(task(t).reset(9).policy_seats(), [p]);
    }
    // Every role can be played; the observation lists the legal tools.
    let f = factory(&[("task", "t5".into()), ("seat", "self_play".into())]);
    let env = f.reset(3);
    for s in env.to_act() {
        let obs = env.observation(s);
        assert_eq!(obs.len(), 2);
        let u = &obs[1].content;
        assert!(u.contains("Legal tools now: "), "{u}");
        assert_eq!(u.contains("publish,"), s == 5, "seat {s}: {u}");
        assert_eq!(u.contains("fact_check,"), s == 5, "seat {s}");
    }
    // Self-play episodes finish with rewards for every honest seat.
    let mut env = f.reset(4);
    env.rollout();
    for s in env.policy_seats() {
        let r = env.reward(s);
        assert!((0.0..=1.0).contains(&r.scalar), "{r:?}");
    }
}

#[test]
fn step_outcomes_and_invalid_actions() {
    let mut env = episode("t1", 5);
    assert!(env.step_texts::<&str>(&[]).is_err());
    assert!(env.step_texts(&[WAIT, WAIT]).is_err());
    let out = step1(&mut env, "no json here");
    assert_eq!(out.seats, [2]);
    assert!(!out.valid[0]);
    assert!(
        out.feedback[0].contains("played wait"),
        "{}",
        out.feedback[0]
    );
    assert_eq!(out.rewards[0], 0.0);
    // The feedback is shown next turn.
    assert!(env.observation(2)[1]
        .content
        .contains("Your last answer was not used"));
    // Illegal: fact_check without budget, send to a non-neighbour, accuse self.
    for bad in [
        r#"{"tool": "fact_check", "content": "location=Reactor 7"}"#,
        r#"{"tool": "send_message", "target_id": 0, "content": "hi"}"#,
        r#"{"tool": "accuse", "target_id": 2}"#,
    ] {
        let out = step1(&mut env, bad);
        assert!(!out.valid[0], "{bad}");
    }
    let out = step1(&mut env, r#"{"tool": "accuse", "target_id": 0}"#);
    assert!(out.valid[0] && out.feedback[0].is_empty());
    // A relay may not publish.
    let mut o = Options::new();
    o.insert("task".into(), "t4".into());
    let mut r = Whispers::new(Rules::from_options(&o).unwrap(), 0);
    let out = step1(&mut r, &truth_report(&episode("t4", 0), 0.9, false));
    assert!(!out.valid[0] && out.feedback[0].contains("only the editor"));
    // Step rewards sum to value + shaping; nothing to act once done.
    for seed in 0..50 {
        let f = task("all");
        let mut env = f.reset(seed);
        let mut sum = 0.0;
        while !env.done() {
            let texts: Vec<String> = env
                .to_act()
                .iter()
                .map(|&s| env.policy_action("random", s).unwrap())
                .collect();
            let out = env.step(&texts).unwrap();
            assert!(out.all_valid());
            sum += out.rewards.iter().sum::<f64>();
        }
        assert!(env.to_act().is_empty());
        assert_eq!(env.step(&[]).unwrap(), Default::default());
        let r = env.reward(env.policy_seats()[0]);
        assert!((sum - r.scalar - r.components["shaping"]).abs() < 1e-9);
    }
}

#[test]
fn rubric_on_hand_made_episodes() {
    // t3: accuse the adversary, then publish the truth at full confidence at step 2.
    let mut env = episode("t3", 11);
    step1(&mut env, WAIT);
    step1(&mut env, r#"{"tool": "accuse", "target_id": 1}"#);
    let out = {
        let r = truth_report(&env, 1.0, false);
        step1(&mut env, &r)
    };
    assert!(env.is_done() && out.valid[0]);
    let p = env.parts(3);
    assert_eq!(
        (p.truth, p.calibration, p.adversary_f1, p.cascade),
        (1.0, 1.0, 1.0, 0.0)
    );
    let eff = 1.0 - 3.0 / 14.0;
    assert!((p.efficiency - eff).abs() < 1e-12);
    assert!((p.value - (0.45 + 0.20 + 0.25 + 0.10 * eff)).abs() < 1e-9);
    assert!(p.win);
    assert_eq!(out.rewards[0], p.value + p.shaping);

    // A missing field is the worst truth (0) and the worst calibration error (1).
    let mut env = episode("t1", 3);
    {
        let r = truth_report(&env, 1.0, true);
        step1(&mut env, &r)
    };
    let p = env.parts(2);
    assert!((p.truth - 0.75).abs() < 1e-9 && (p.calibration - 0.75).abs() < 1e-9);
    // Nothing published: no truth, no calibration.
    let mut env = episode("t2", 3);
    while !env.is_done() {
        step1(&mut env, WAIT);
    }
    let p = env.parts(3);
    assert_eq!(
        (p.truth, p.calibration, p.efficiency, p.value),
        (0.0, 0.0, 0.0, 0.0)
    );

    // Accusing all five others (2 adversaries): P 2/5, R 1 -> F1 4/7; a wrong one 0.
    let mut env = episode("t5", 1);
    for t in [0, 1, 2, 3, 4] {
        step1(
            &mut env,
            &format!(r#"{{"tool": "accuse", "target_id": {t}}}"#),
        );
    }
    assert!((env.parts(5).adversary_f1 - 4.0 / 7.0).abs() < 1e-12);
    let mut env = episode("t5", 1);
    step1(&mut env, r#"{"tool": "accuse", "target_id": 0}"#);
    assert_eq!(env.parts(5).adversary_f1, 0.0);

    // Coalition: verify with an honest peer, then publish; an adversary does not count.
    for (target, want) in [(0, 1.0), (1, 0.0)] {
        let mut env = episode("t5", 2);
        let c = claim_string(&env, env.truth());
        let out = step1(
            &mut env,
            &format!(r#"{{"tool": "request_verify", "target_id": {target}, "content": "{c}"}}"#),
        );
        assert!(
            (out.rewards[0] - 0.05).abs() < 1e-12,
            "answered verify shaping"
        );
        assert_eq!(env.parts(5).coalition, 0.0, "not before publishing");
        {
            let r = truth_report(&env, 0.9, false);
            step1(&mut env, &r)
        };
        assert_eq!(env.parts(5).coalition, want);
    }

    // Cascade on t4: forwarding the lie at 0.85 costs 0.55 x 0.85; hedged at 0.5 nothing.
    for (conf, casc) in [(0.85, 0.85), (0.5, 0.0)] {
        let mut env = episode("t4", 4);
        let lie = claim_string(&env, env.lie());
        step1(
            &mut env,
            &format!(
                r#"{{"tool": "send_message", "target_id": 3, "content": "{lie}", "confidence": {conf}}}"#
            ),
        );
        while !env.is_done() {
            step1(&mut env, WAIT);
        }
        let p = env.parts(2);
        assert!((p.cascade - casc).abs() < 1e-6, "{p:?}");
        assert!((p.value - 0.55 * (1.0 - casc)).abs() < 1e-6, "{p:?}");
    }
    // t4 ideal: fact-check, then accuse the source: 0.55 + 0.35.
    let mut env = episode("t4", 4);
    step1(&mut env, WAIT);
    let lie = claim_string(&env, env.lie());
    let first = lie.split(';').next().unwrap().to_string();
    step1(
        &mut env,
        &format!(r#"{{"tool": "fact_check", "content": "{first}"}}"#),
    );
    let obs = env.observation(2)[1].content.clone();
    assert!(obs.contains("fact-check verdict FALSE"), "{obs}");
    step1(&mut env, r#"{"tool": "accuse", "target_id": 0}"#);
    while !env.is_done() {
        step1(&mut env, WAIT);
    }
    assert!((env.parts(2).value - 0.90).abs() < 1e-9);
}

#[test]
fn shaping_fires_only_when_its_condition_holds() {
    // Repeated identical broadcast: -0.05 the second time only.
    let mut env = episode("t1", 0);
    let b = r#"{"tool": "broadcast", "content": "location=Reactor 7", "confidence": 0.4}"#;
    assert_eq!(step1(&mut env, b).rewards[0], 0.0);
    assert_eq!(step1(&mut env, b).rewards[0], -0.05);
    let b2 = r#"{"tool": "broadcast", "content": "location=Reactor 4", "confidence": 0.4}"#;
    assert_eq!(step1(&mut env, b2).rewards[0], 0.0);

    // Fact-check: +0.02 only on a contested claim (t5: witness vs the lie).
    let mut env = episode("t5", 8);
    step1(&mut env, WAIT);
    step1(&mut env, WAIT);
    let t = env.template();
    let lie = env.lie();
    let c = format!("{}={}", t.fields[0], t.values[0][lie[0] as usize]);
    let contested = env.private_view(0)[0] != lie[0];
    let out = step1(
        &mut env,
        &format!(r#"{{"tool": "fact_check", "content": "{c}"}}"#),
    );
    assert_eq!(out.rewards[0], if contested { 0.02 } else { 0.0 });
    // Premature publish with budget left but used: no penalty.
    let out = {
        let r = truth_report(&env, 0.9, false);
        step1(&mut env, &r)
    };
    assert!(out.rewards[0] >= 0.0 && env.is_done());

    // Premature publish: contradictions, budget available, none used -> -0.10.
    let mut env = episode("t5", 8);
    step1(&mut env, WAIT);
    step1(&mut env, WAIT);
    let out = {
        let r = truth_report(&env, 0.9, false);
        step1(&mut env, &r)
    };
    let p = env.parts(5);
    assert!((out.rewards[0] - (p.value - 0.10)).abs() < 1e-9);
    // ... but not where no fact-check exists (t2 has budget 0).
    let mut env = episode("t2", 8);
    step1(&mut env, WAIT);
    step1(&mut env, WAIT);
    let out = {
        let r = truth_report(&env, 0.9, false);
        step1(&mut env, &r)
    };
    assert!((out.rewards[0] - env.parts(3).value).abs() < 1e-12);
    // Verify shaping once per target; never for waiting.
    let mut env = episode("t5", 2);
    let c = claim_string(&env, env.truth());
    let rv = format!(r#"{{"tool": "request_verify", "target_id": 3, "content": "{c}"}}"#);
    assert_eq!(step1(&mut env, &rv).rewards[0], 0.05);
    assert_eq!(step1(&mut env, &rv).rewards[0], 0.0);
    assert_eq!(step1(&mut env, WAIT).rewards[0], 0.0);
}

#[test]
fn honest_peers_answer_truthfully_and_adversaries_lie() {
    for seed in 0..40 {
        for (target, honest) in [(0u8, true), (1, false), (2, false)] {
            let mut env = episode("t5", seed);
            let truth = env.truth();
            let c = claim_string(&env, truth);
            step1(
                &mut env,
                &format!(
                    r#"{{"tool": "request_verify", "target_id": {target}, "content": "{c}"}}"#
                ),
            );
            let reply = env
                .messages()
                .iter()
                .find(|m| matches!(m.kind, Kind::VerifyReply(_)) && m.from == target)
                .copied()
                .expect("scripted peers answer");
            let Kind::VerifyReply(marks) = reply.kind else {
                unreachable!()
            };
            let view = env.private_view(target as usize);
            for f in 0..4 {
                let want = if view[f] == truth[f] {
                    Mark::Confirm
                } else {
                    Mark::Deny
                };
                assert_eq!(marks[f], want, "seed {seed} target {target}");
                if !honest {
                    assert_eq!(marks[f], Mark::Deny, "the lie denies every true field");
                }
            }
            // The answer is visible next step.
            let obs = env.observation(5)[1].content.clone();
            assert!(obs.contains("answers your verification request"), "{obs}");
        }
    }
}

#[test]
fn baselines_meet_the_acceptance_numbers() {
    let f = task("t1");
    let tools = f.tools().unwrap();
    let n = 500;
    let row = |p: &str, t: &str| tools.baseline(p, t, n, 0).unwrap();
    for t in ["t1", "t2", "t3", "t5", "t6"] {
        let r = row("wait", t);
        assert!(r.mean_reward < 0.01, "wait {t} {}", r.mean_reward);
        assert_eq!(r.peers, t);
        assert_eq!(r.episodes, n);
    }
    assert!((row("wait", "t4").mean_reward - 0.55).abs() < 1e-9);
    let nr = row("naive_relay", "t4").mean_reward;
    assert!(nr < 0.2, "naive_relay t4 {nr}");
    let ne = row("naive_editor", "t1").mean_reward;
    assert!(ne >= 0.8, "naive_editor t1 {ne}");
    for t in ["t3", "t5", "t6"] {
        let h = row("heuristic", t).mean_reward;
        let e = row("naive_editor", t).mean_reward;
        assert!(h > e + 0.3, "{t}: heuristic {h} vs naive_editor {e}");
    }
    for t in ["t1", "t2", "t3", "t4", "t5", "t6"] {
        let h = row("heuristic", t);
        assert!(h.mean_reward > 0.75, "heuristic {t} {}", h.mean_reward);
        assert!(h.win_rate >= 0.8, "heuristic {t} win rate {}", h.win_rate);
    }
}

#[test]
fn baseline_rows_match_the_text_path() {
    // The fast baseline path and text episodes agree.
    for t in ["t1", "t3", "t5"] {
        let f = task(t);
        for p in ["heuristic", "naive_editor", "naive_relay", "random"] {
            let row = f.tools().unwrap().baseline(p, t, 40, 100).unwrap();
            let mut sum = 0.0;
            for seed in 100..140 {
                let env = play_policy(f.as_ref(), seed, p);
                sum += env.reward(env.policy_seats()[0]).scalar;
            }
            assert!((sum / 40.0 - row.mean_reward).abs() < 1e-9, "{t} {p}");
        }
    }
}

#[test]
fn decision_mode_scores_completions() {
    let f = task("all");
    let mut better = 0;
    for seed in 0..40 {
        let d = sample_decision(f.as_ref(), seed);
        assert!(!d.env.done());
        let good = d.env.clone_box().continuation_action(d.seat);
        let r_good = score_decision(&d, &good);
        let r_junk = score_decision(&d, "gibberish");
        assert!(r_junk.components["format"] < 1.0);
        assert!((0.0..=1.0).contains(&r_good.scalar));
        if r_good.scalar >= r_junk.scalar {
            better += 1;
        }
        // Deterministic.
        assert_eq!(score_decision(&d, &good), r_good);
    }
    assert!(better >= 30, "{better}");
}

fn weird_text() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        "\\PC{0,300}",
        (any::<String>(), 0usize..7).prop_map(|(s, i)| {
            let tools = [
                "send_message",
                "broadcast",
                "fact_check",
                "request_verify",
                "accuse",
                "publish",
                "wait",
            ];
            format!(
                r#"{{"tool": "{}", "target_id": {}, "content": "{}", "confidence": {}}}"#,
                tools[i],
                s.len() % 9,
                s.escape_default(),
                (s.len() as f64) / 7.0
            )
        }),
        any::<String>().prop_map(|s| format!(
            r#"{{"tool":"publish","final_report":{{"{s}":{{"value":"{s}","confidence":0.5}}}}}}"#
        )),
        any::<String>().prop_map(|s| format!("location={s}; incident: {s} time={s}")),
        (any::<String>(), 0usize..20000).prop_map(|(s, n)| format!(
            "{}{s}{}{{\"tool\":\"wait\"}}",
            "{".repeat(n % 97),
            "x".repeat(n)
        )),
        Just(r#"{"tool": ["wait"]}"#.to_string()),
        Just(r#"{"tool": "accuse", "target_id": -1}"#.to_string()),
        Just(r#"{"tool": "accuse", "target_id": 1e99}"#.to_string()),
        Just(r#"{"tool": "send_message", "target_id": 1, "content": {"location": 7}}"#.to_string()),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, .. ProptestConfig::default() })]

    #[test]
    fn parser_never_panics(text in weird_text(), t in 0usize..4) {
        if let Ok(a) = parse_action(&text, &TEMPLATES[t]) {
            // What parses prints back to the same action.
            let j = concord::envs::whispers::action_json(&a, &TEMPLATES[t]);
            prop_assert_eq!(parse_action(&j, &TEMPLATES[t]), Ok(a));
        }
    }

    #[test]
    fn stepping_any_text_never_panics(seed in any::<u64>(), seat in 0usize..4,
                                      texts in proptest::collection::vec(weird_text(), 24)) {
        let seat = ["protagonist", "self_play", "relay", "editor"][seat];
        let f = factory(&[("task", "all".into()), ("seat", seat.into())]);
        let mut env = f.reset(seed);
        let mut k = 0;
        while !env.done() {
            let acting = env.to_act();
            let batch: Vec<String> = acting.iter().map(|_| { k += 1; texts[k % texts.len()].clone() }).collect();
            let out = env.step(&batch).unwrap();
            prop_assert_eq!(&out.seats, &acting);
            for i in 0..acting.len() {
                prop_assert_eq!(out.valid[i], out.feedback[i].is_empty());
            }
            for &s in &acting {
                let _ = env.observation(s);
            }
        }
        for s in env.policy_seats() {
            let r = env.reward(s);
            prop_assert!((0.0..=1.0).contains(&r.scalar));
        }
    }
}

#[test]
fn cli_baseline_bench_describe_play() {
    let out = concord_ok(&["envs", "baseline", "whispers", "--json", "--episodes", "20"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 30);
    for r in rows {
        assert!(r["policy"].is_string() && r["peers"].is_string(), "{r}");
        assert_eq!(r["episodes"], 20);
        assert!(r["mean_reward"].is_f64(), "{r}");
    }
    // Speed is measured by the benchmark itself, not asserted here: only that it ran.
    let out = concord_ok(&["envs", "bench", "whispers", "--json", "--secs", "0.05"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(v["episodes_per_s"].as_f64().unwrap() > 0.0, "{v}");
    let out = concord_ok(&["envs", "describe", "whispers", "--set", "task=t3"]);
    assert!(out.contains("Spot the Liar"));
    for policy in ["heuristic", "random", "naive_editor"] {
        let out = concord_ok(&[
            "envs", "play", "whispers", "--seed", "3", "--policy", policy, "--set", "task=t5",
        ]);
        assert!(out.contains("== rewards =="));
    }
}

/// `concord train --config configs/whispers-smoke.toml` end to end (decision mode, tiny
/// model), with the output in a temp dir.
#[test]
fn smoke_config_trains() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("configs/whispers-smoke.toml");
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
    let log = std::fs::read_to_string(dir.path().join("whispers-smoke/training_log.csv")).unwrap();
    let mut lines = log.lines();
    let header = lines.next().unwrap();
    assert!(header.contains("rewards/truth"), "{header}");
    assert_eq!(lines.count(), 2);
}

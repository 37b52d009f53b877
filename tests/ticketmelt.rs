//! TICKETMELT acceptance tests: determinism, replay, the classic numbers, the default
//! preset's difficulty, parser robustness and per-step invariants.
use concord::envs::ticketmelt::{
    parse_action, Action, Outcome, Policy, Pool, Rules, Ticketmelt, TicketmeltFactory, SEATS,
};
use concord::envs::{
    create, replay, sample_decision, score_decision, score_joint, EnvFactory, Environment, Options,
    Tools,
};
use proptest::prelude::*;

fn factory(preset: &str, extra: &[(&str, toml::Value)]) -> Box<dyn EnvFactory> {
    let mut o = Options::new();
    o.insert("preset".into(), preset.into());
    for (k, v) in extra {
        o.insert(k.to_string(), v.clone());
    }
    create("ticketmelt", &o).expect("factory")
}

fn play_random(f: &dyn EnvFactory, seed: u64) -> Box<dyn Environment> {
    concord::envs::play_episode(f, seed, |env, s| env.policy_action("random", s)).expect("episode")
}

#[test]
fn deterministic_per_seed() {
    for preset in ["classic", "default"] {
        for pool in ["mixed", "self_play", "diverse"] {
            let f = factory(preset, &[("peers", pool.into())]);
            for seed in 0..50 {
                let a = play_random(f.as_ref(), seed).transcript();
                let b = play_random(f.as_ref(), seed).transcript();
                assert_eq!(a, b, "{preset} {pool} seed {seed}");
            }
            let a = play_random(f.as_ref(), 1).transcript();
            let b = play_random(f.as_ref(), 2).transcript();
            assert_ne!(a, b);
        }
    }
}

#[test]
fn transcript_replays() {
    for pool in ["mixed", "self_play"] {
        let f = factory("default", &[("peers", pool.into())]);
        for seed in 0..40 {
            // Mix scripted answers with odd texts so the raw-text path is exercised.
            let mut i = 0;
            let env = concord::envs::play_episode(f.as_ref(), seed, |env, s| {
                i += 1;
                Ok(match i % 4 {
                    0 => "I'll go DEPLOY_PROD_B I think".to_string(),
                    1 => format!("ok ```{}```", env.policy_action("heuristic", s)?),
                    _ => env.policy_action("random", s)?,
                })
            })
            .expect("episode");
            let t = env.transcript();
            let again = replay(f.as_ref(), &t).expect("replay");
            assert_eq!(again.transcript(), t, "seed {seed}");
            for s in env.policy_seats() {
                assert_eq!(again.reward(s), env.reward(s));
            }
        }
    }
}

#[test]
fn classic_reproduces_original_numbers() {
    let f = factory("classic", &[]);
    let n = 2000;
    let b_dumb = f.baseline("always_b", "dumb", n, 0).unwrap();
    assert_eq!(b_dumb.win_rate, 1.0);
    let b_div = f.baseline("always_b", "diverse", n, 0).unwrap();
    assert!(
        (b_div.win_rate - 0.833).abs() <= 0.03,
        "always_b vs diverse {}",
        b_div.win_rate
    );
    for p in ["always_a", "always_monitor"] {
        for q in ["dumb", "diverse"] {
            let r = f.baseline(p, q, n, 0).unwrap();
            assert_eq!(r.win_rate, 0.0, "{p} vs {q}");
        }
    }
    // The README's gated rule gives about the same (83.05% in the original).
    let g = factory(
        "classic",
        &[
            ("win_rule", "gated".into()),
            ("win_threshold", toml::Value::Float(0.35)),
        ],
    );
    let r = g.baseline("always_b", "diverse", n, 0).unwrap();
    assert!((r.win_rate - 0.8305).abs() <= 0.03, "gated {}", r.win_rate);
}

#[test]
fn default_preset_is_not_trivial() {
    let f = factory("default", &[]);
    let n = 2000;
    let mut best_const: f64 = 0.0;
    for p in ["always_a", "always_b", "always_monitor"] {
        let r = f.baseline(p, "mixed", n, 0).unwrap();
        assert!(r.win_rate <= 0.5, "{p} wins {}", r.win_rate);
        best_const = best_const.max(r.win_rate);
    }
    let h = f.baseline("heuristic", "mixed", n, 0).unwrap();
    assert!(
        h.win_rate > best_const + 0.1,
        "heuristic {} vs constants {best_const}",
        h.win_rate
    );
}

#[test]
fn decisions_are_deterministic() {
    for pool in ["mixed", "self_play"] {
        let f = factory("default", &[("peers", pool.into())]);
        for seed in 0..100 {
            let d1 = sample_decision(f.as_ref(), seed);
            let d2 = sample_decision(f.as_ref(), seed);
            assert_eq!(d1.seat, d2.seat);
            assert_eq!(d1.step, d2.step);
            assert_eq!(d1.messages, d2.messages);
            assert!(!d1.env.done());
            for c in [
                r#"{"channel_msg":"b","commitment":"DEPLOY_PROD_B"}"#,
                r#"{"commitment":"DEPLOY_PROD_A"}"#,
                "MONITOR",
            ] {
                assert_eq!(score_decision(&d1, c), score_decision(&d2, c));
            }
            // Malformed answers earn zero and report format = 0.
            let r = score_decision(&d1, "DEPLOY_PROD_B please");
            assert_eq!(r.scalar, 0.0);
            assert_eq!(r.components["format"], 0.0);
            let r = score_decision(
                &d1,
                r#"{"commitment":"DEPLOY_PROD_A|DEPLOY_PROD_B|MONITOR"}"#,
            );
            assert_eq!(r.scalar, 0.0);
        }
        let d = sample_decision(f.as_ref(), 3);
        let seats = d.env.policy_seats();
        let texts: Vec<(usize, &str)> = seats
            .iter()
            .map(|&s| (s, r#"{"commitment":"MONITOR"}"#))
            .collect();
        assert_eq!(score_joint(d.env.as_ref(), &texts).len(), seats.len());
    }
    // Decisions vary across seeds.
    let f = factory("default", &[]);
    let steps: std::collections::BTreeSet<usize> = (0..200)
        .map(|s| sample_decision(f.as_ref(), s).step)
        .collect();
    assert!(steps.len() > 3, "{steps:?}");
}

#[test]
fn unknown_option_is_named() {
    let mut o = Options::new();
    o.insert("dumb_fractoin".into(), toml::Value::Float(0.5));
    let e = create("ticketmelt", &o).err().expect("error").to_string();
    assert!(e.contains("dumb_fractoin"), "{e}");
}

fn weird_text() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        "\\PC{0,300}",
        "[{}\\[\\]\":,a-z\\\\ ]{0,400}",
        (0usize..3000).prop_map(|n| "{".repeat(n)),
        (0usize..2000).prop_map(|n| format!(
            "{}\"commitment\"{}",
            "{\"a\":[".repeat(n),
            "]}".repeat(n)
        )),
        "[\\x00-\\x1f]{0,50}"
            .prop_map(|c| format!("{{\"commitment\": \"MONITOR{c}\", \"channel_msg\": \"{c}\"}}")),
        (any::<String>(), 0usize..20000).prop_map(|(s, n)| format!(
            "{}{}{{\"commitment\":\"DEPLOY_PROD_B\"}}",
            "x".repeat(n),
            s
        )),
        Just(r#"{"commitment": "DEPLOY_PROD_A", "channel_msg": 12}"#.to_string()),
        Just(r#"{"commitment": ["DEPLOY_PROD_A"]}"#.to_string()),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, .. ProptestConfig::default() })]

    #[test]
    fn parser_never_panics(text in weird_text()) {
        let p = parse_action(&text);
        if let Some(m) = &p.message {
            prop_assert!(m.chars().count() <= 200);
            prop_assert!(!m.chars().any(char::is_control));
        }
        if p.format_ok {
            prop_assert!(matches!(p.action, Action::DeployA | Action::DeployB | Action::Monitor));
        }
    }

    #[test]
    fn step_invariants(seed in any::<u64>(), classic in any::<bool>(), pool in 0usize..4,
                       picks in proptest::collection::vec((0usize..6, any::<String>()), 64)) {
        let mut rules = if classic { Rules::classic() } else { Rules::default_preset() };
        rules.peers = [Pool::Dumb, Pool::Diverse, Pool::Mixed, Pool::SelfPlay][pool];
        let mut ep = Ticketmelt::new(rules, seed);
        let mut k = 0;
        while !ep.is_done() {
            let before: Vec<u8> = (0..SEATS).map(|s| ep.remaining(s)).collect();
            let seats = Environment::policy_seats(&ep);
            let texts: Vec<String> = seats.iter().map(|_| {
                let (c, s) = &picks[k % picks.len()];
                k += 1;
                match c {
                    0 => r#"{"commitment":"DEPLOY_PROD_A"}"#.to_string(),
                    1 => r#"{"commitment":"DEPLOY_PROD_B","channel_msg":"b"}"#.to_string(),
                    2 => "MONITOR".to_string(),
                    3 => s.clone(),
                    _ => format!("{{\"commitment\": \"DEPLOY_PROD_{}\"}}", if s.len() % 2 == 0 { "A" } else { "B" }),
                }
            }).collect();
            let r = ep.round();
            Environment::step(&mut ep, &texts).unwrap();
            let acts = ep.actions(r);
            let out = ep.outcome(r);
            let mut progressed = 0;
            for (s, &b) in before.iter().enumerate() {
                prop_assert!(ep.remaining(s) <= b);
                prop_assert!(ep.remaining(s) <= ep.fix_rounds(s));
                prop_assert!(b - ep.remaining(s) <= 1);
                if ep.remaining(s) < b {
                    progressed += 1;
                }
                prop_assert_eq!(ep.restored_at(s).is_some(), ep.remaining(s) == 0);
            }
            let mut successes = 0;
            for (server, o) in out.iter().enumerate() {
                let deployers: Vec<usize> = (0..SEATS)
                    .filter(|&s| acts[s] == [Action::DeployA, Action::DeployB][server]).collect();
                match o {
                    Outcome::Success(w) => {
                        successes += 1;
                        prop_assert_eq!(deployers, vec![*w as usize]);
                    }
                    Outcome::Collision => prop_assert!(deployers.len() >= 2),
                    Outcome::Degraded(w) => prop_assert_eq!(deployers, vec![*w as usize]),
                    Outcome::Idle => prop_assert!(deployers.is_empty()),
                }
            }
            prop_assert!(progressed <= successes && successes <= 2);
        }
        for s in 0..SEATS {
            let r = Environment::reward(&ep, s);
            for v in r.components.values() {
                prop_assert!(v.is_finite() && (0.0..=1.0).contains(v));
            }
        }
    }
}

#[test]
fn scripted_policies_are_named() {
    let f = TicketmeltFactory::with_rules(Rules::default_preset());
    for p in f.policies() {
        assert_eq!(Policy::from_name(p).unwrap().name(), p);
    }
    assert!(Policy::from_name("nope").is_err());
}

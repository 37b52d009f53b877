//! merge_ring: exact graph counts, level-k ordering, regimes, parser, determinism.
use concord::envs::merge_ring::graph::{self, Codec, Phase, PublicState};
use concord::envs::merge_ring::policy::Kind;
use concord::envs::merge_ring::{
    parse_action, Action, Config, MergeRingFactory, ParseOutcome, Regime,
};
use concord::envs::{create, EnvFactory, Environment, Options, Tools};
use proptest::prelude::*;

fn factory(cfg: Config) -> MergeRingFactory {
    MergeRingFactory::new(cfg).unwrap()
}

#[test]
fn explicit_graph_counts_and_every_successor_checked() {
    for (n, states, groups) in [
        (2usize, 19u64, 171u64),
        (4, 163, 13_203),
        (6, 1_459, 1_063_611),
    ] {
        let r = graph::walk(n, false).unwrap();
        assert_eq!(r.mode, "explicit");
        assert_eq!((r.states, r.groups), (states, groups), "n={n}");
        assert_eq!(r.checked, groups);
        assert_eq!(r.merged_states + r.collided_states, 3u64.pow(n as u32));
    }
}

#[test]
fn on_demand_graph_n8_counts_fast_and_small() {
    let r = graph::walk(8, false).unwrap();
    assert_eq!(r.mode, "on_demand");
    assert_eq!((r.states, r.groups), (13_123, 86_100_003));
    assert_eq!(r.checked, 86_100_003);
    // 10 s is the release budget; the dev profile builds this crate at opt-level 1.
    let budget = if cfg!(debug_assertions) { 120.0 } else { 10.0 };
    assert!(r.seconds < budget, "n=8 on demand took {:.2} s", r.seconds);
    if let Some(peak) = graph::peak_rss_bytes() {
        assert!(peak < 100_000_000, "peak memory {peak} bytes");
    }
    // Same closed form for the merged/collided split as the explicit walk at n <= 6.
    for n in [2, 4, 6] {
        let e = graph::walk(n, true).unwrap();
        let d = graph::count_on_demand(n).unwrap();
        assert_eq!(
            (e.merged_states, e.collided_states),
            (d.merged_states, d.collided_states)
        );
    }
}

#[test]
fn materialize_refuses_n8_with_a_clear_error() {
    let err = graph::build_explicit(8).unwrap_err().to_string();
    assert!(
        err.contains("refusing") && err.contains("86100003"),
        "{err}"
    );
    assert!(graph::walk(8, true).is_err());
}

#[test]
fn successors_follow_the_rules() {
    use Action::*;
    let s0 = PublicState::initial(4);
    let s1 = graph::successors(&s0, &[Early, Early, Late, Bypass]).unwrap();
    assert_eq!(s1.len(), 1);
    assert_eq!(s1[0].phase, Phase::Commit);
    let s2 = graph::successor(&s1[0], &[Early, Early, Late, Late]).unwrap();
    assert_eq!(s2.phase, Phase::Done);
    assert_eq!(s2.collisions, vec![true, true, true, true]);
    assert_eq!(s2.class(), Some(graph::Class::Collided));
    let s3 = graph::successor(&s2, &[Bypass; 4]).unwrap();
    assert_eq!(s3, s2, "done is absorbing");
    let ok = graph::successor(&s1[0], &[Early, Late, Early, Late]).unwrap();
    assert_eq!(ok.class(), Some(graph::Class::Merged));
    assert!(graph::successor(&s0, &[Early]).is_err());
    let codec = Codec::new(4).unwrap();
    assert_eq!(codec.decode(codec.encode(&ok).unwrap()), Some(ok));
}

fn mean(f: &MergeRingFactory, policy: &str, pool: &str) -> f64 {
    f.baseline(policy, pool, 300, 1_000).unwrap().mean_reward
}

#[test]
fn level_k_ordering() {
    let f = factory(Config::default());
    let (l0, l1) = (mean(&f, "level0", "level0"), mean(&f, "level1", "level0"));
    assert!(
        l1 > l0 + 0.05,
        "vs level 0: level1 {l1:.3} vs level0 {l0:.3}"
    );
    let (l1b, l2) = (mean(&f, "level1", "level1"), mean(&f, "level2", "level1"));
    assert!(
        l2 > l1b + 0.05,
        "vs level 1: level2 {l2:.3} vs level1 {l1b:.3}"
    );
    // The safe fallback is dominated by a convention-aware driver against level 0.
    assert!(l1 > mean(&f, "always_bypass", "level0"));
    // Rows carry the safety rates.
    let row = f.baseline("always_early", "stationary", 50, 0).unwrap();
    for k in ["merge_rate", "bypass_rate", "collision_rate"] {
        assert!(row.extra.contains_key(k), "{k}");
    }
    assert!(row.extra["collision_rate"] > 0.2);
    let safe = f.baseline("always_bypass", "misspecified", 20, 0).unwrap();
    assert_eq!(safe.extra["collision_rate"], 0.0);
    assert_eq!(safe.extra["bypass_rate"], 1.0);
}

#[test]
fn switching_regime_really_switches() {
    let f = factory(Config {
        regime: Regime::Switching,
        ..Config::default()
    });
    for seed in 0..20 {
        let env = f.session(seed);
        let schedule = env.schedule();
        for seat in 1..f.config().agents {
            let levels: Vec<usize> = schedule
                .iter()
                .map(|e| match e[seat] {
                    Some(Kind::Level0) => 0,
                    Some(Kind::Level1) => 1,
                    Some(Kind::Level2) => 2,
                    other => panic!("unexpected opponent {other:?}"),
                })
                .collect();
            let ups = levels.windows(2).filter(|w| w[1] > w[0]).count();
            let downs = levels.windows(2).filter(|w| w[1] < w[0]).count();
            assert!(
                ups > 0 && downs > 0,
                "seed {seed} seat {seat}: {levels:?} is monotone"
            );
        }
    }
    // Stationary never switches; misspecified always has an opponent outside the levels.
    let st = factory(Config::default());
    let m = factory(Config {
        regime: Regime::Misspecified,
        ..Config::default()
    });
    for seed in 0..20 {
        let s = st.session(seed);
        assert!(s.schedule().windows(2).all(|w| w[0] == w[1]));
        let ms = m.session(seed);
        assert!(ms.schedule()[0].contains(&Some(Kind::Deceiver)));
    }
    // The switch is visible in behaviour: level-0 drivers sometimes deviate, level-1
    // drivers never signal away from their priority slot.
    let f1 = factory(Config {
        regime: Regime::Switching,
        level: Some(1),
        episodes_per_session: 40,
        warmup: 0,
        switch_every: 10,
        noise: 0.5,
        ..Config::default()
    });
    let mut env = f1.session(7);
    while !env.done() {
        env.step(&["ACTION: bypass".to_string()]).unwrap();
    }
    let deviate = |range: std::ops::Range<usize>| {
        env.history()[range]
            .iter()
            .flat_map(|r| {
                (1..4).map(move |i| {
                    let conv = if i % 2 == r.parity {
                        Action::Early
                    } else {
                        Action::Late
                    };
                    (r.signals[i] != conv) as usize
                })
            })
            .sum::<usize>()
    };
    assert_eq!(deviate(0..10), 0, "level 1 signals its priority slot");
    assert!(
        deviate(10..20) > 0,
        "after the switch (level 0 noisy or level 2 bullying) signals deviate"
    );
}

#[test]
fn determinism_per_seed() {
    for regime in [Regime::Stationary, Regime::Switching, Regime::Misspecified] {
        let f = factory(Config {
            regime,
            ..Config::default()
        });
        let play = |seed: u64| {
            let mut env = f.reset(seed);
            while !env.done() {
                let a: Vec<String> = env
                    .policy_seats()
                    .iter()
                    .map(|&s| env.policy_action("random", s).unwrap())
                    .collect();
                env.step(&a).unwrap();
            }
            env.transcript()
        };
        assert_eq!(play(5), play(5));
        assert_ne!(play(5), play(6));
        let replayed = concord::envs::replay(&f, &play(9)).unwrap();
        assert_eq!(replayed.transcript(), play(9));
    }
}

#[test]
fn clone_and_continuation_are_consistent() {
    let f = factory(Config::default());
    let mut env = f.reset(11);
    env.step(&["ACTION: early".into()]).unwrap();
    let mut a = env.clone_box();
    let mut b = env.clone_box();
    while !a.done() {
        let ta = a.continuation_action(0);
        let tb = b.continuation_action(0);
        assert_eq!(ta, tb);
        a.step(&[ta]).unwrap();
        b.step(&[tb]).unwrap();
    }
    assert_eq!(a.reward(0), b.reward(0));
    assert_eq!(a.transcript(), b.transcript());
}

#[test]
fn self_play_and_prompts() {
    let f = factory(Config {
        self_play: true,
        agents: 6,
        ..Config::default()
    });
    let mut env = f.reset(2);
    assert_eq!(env.policy_seats(), (0..6).collect::<Vec<_>>());
    let obs = env.observation(3);
    assert_eq!(obs.len(), 2);
    assert_eq!(obs[0].role, "system");
    assert!(obs[1].content.contains("Phase: SIGNAL"));
    assert!(obs[1].content.contains("ACTION: bypass"));
    assert!(
        env.step(&["ACTION: early".into()]).is_err(),
        "wrong number of actions"
    );
    let texts: Vec<String> = (0..6)
        .map(|s| env.policy_action("level1", s).unwrap())
        .collect();
    env.step(&texts).unwrap();
    let obs = env.observation(3)[1].content.clone();
    assert!(
        obs.contains("Phase: COMMIT") && obs.contains("Signals this episode"),
        "{obs}"
    );
    let texts: Vec<String> = (0..6)
        .map(|s| env.policy_action("level1", s).unwrap())
        .collect();
    env.step(&texts).unwrap();
    let obs = env.observation(3)[1].content.clone();
    assert!(obs.contains("signalled") && obs.contains("did"), "{obs}");
    // Opponent types are never shown.
    let g = factory(Config {
        regime: Regime::Misspecified,
        ..Config::default()
    });
    let mut env = g.reset(4);
    while !env.done() {
        for m in env.observation(0) {
            let c = m.content.to_lowercase();
            assert!(!c.contains("level") && !c.contains("deceiv"), "{c}");
        }
        env.step(&["ACTION: late".into()]).unwrap();
    }
    let r = env.reward(0);
    for k in [
        "r_merge",
        "r_bypass",
        "r_collision",
        "merge_rate",
        "bypass_rate",
        "collision_rate",
    ] {
        assert!(r.components.contains_key(k), "{k}");
    }
    let sum = r.components["r_merge"] + r.components["r_bypass"] + r.components["r_collision"];
    assert!((sum - r.scalar).abs() < 1e-12);
}

#[test]
fn registry_and_options() {
    let mut o = Options::new();
    o.insert("agents".into(), toml::Value::Integer(6));
    o.insert("regime".into(), toml::Value::String("switching".into()));
    let f = create("merge_ring", &o).unwrap();
    assert_eq!(f.reset(0).num_seats(), 6);
    assert_eq!(f.pools()[..3], ["stationary", "switching", "misspecified"]);
    o.insert("colour".into(), toml::Value::String("red".into()));
    let err = create("merge_ring", &o).err().unwrap().to_string();
    assert!(err.contains("colour"), "{err}");
    assert!(f.baseline("nobody", "stationary", 1, 0).is_err());
    assert!(f.baseline("level0", "nowhere", 1, 0).is_err());
}

proptest! {
    #[test]
    fn parser_never_panics(text in ".{0,200}") {
        let (a, how) = parse_action(&text);
        prop_assert!(Action::ALL.contains(&a));
        if how == ParseOutcome::Default {
            prop_assert_eq!(a, Action::Bypass);
        }
    }

    #[test]
    fn parser_defaults_to_bypass_without_action_words(text in "[^elyb]{0,200}") {
        // Without the letters e, l, y, b no action word can appear.
        prop_assert_eq!(parse_action(&text), (Action::Bypass, ParseOutcome::Default));
    }

    #[test]
    fn parser_reads_marked_answers(
        prefix in "[^elyb]{0,80}",
        idx in 0usize..3,
        upper in any::<bool>(),
        suffix in "[ .!\n]{0,5}",
    ) {
        let a = Action::ALL[idx];
        let word = if upper { a.as_str().to_uppercase() } else { a.as_str().to_string() };
        let text = format!("{prefix}\nACTION: {word}{suffix}");
        prop_assert_eq!(parse_action(&text), (a, ParseOutcome::Marked));
    }

    #[test]
    fn env_step_never_panics(texts in proptest::collection::vec(".{0,60}", 12)) {
        let f = MergeRingFactory::new(Config::default()).unwrap();
        let mut env = f.reset(1);
        for t in texts {
            if env.done() { break; }
            env.step(&[t]).unwrap();
        }
        prop_assert!(env.done());
        let r = env.reward(0).scalar;
        prop_assert!((-1.0..=1.0).contains(&r));
    }
}

/// `cargo test --release --test tests merge_ring::baseline_table -- --ignored --nocapture`
#[test]
#[ignore]
fn baseline_table() {
    let f = factory(Config::default());
    println!("{}", f.markdown_table(1000, 0).unwrap());
}

use super::puzzle::{draw, generate, solve, Rng};
use super::*;
use crate::envs::{eval_seed, training_seed, Scripted};
use std::collections::BTreeSet;

fn default_factory() -> CountdownFactory {
    CountdownFactory::new(Config::default()).unwrap()
}

fn with(key: &str, value: toml::Value) -> Options {
    let mut o = Options::new();
    o.insert(key.into(), value);
    o
}

#[test]
fn generation_is_deterministic() {
    let f = default_factory();
    for seed in [0, 1, 42, eval_seed(7), u64::MAX] {
        assert_eq!(f.episode(seed).puzzle(), f.episode(seed).puzzle());
        let t = f.reset(seed).transcript();
        assert_eq!(t, f.reset(seed).transcript());
    }
    let a: Vec<Puzzle> = (0..20).map(|s| f.episode(s).puzzle().clone()).collect();
    let distinct: BTreeSet<String> = a.iter().map(|p| format!("{p:?}")).collect();
    assert!(distinct.len() > 15, "{distinct:?}");
}

#[test]
fn puzzles_respect_the_options() {
    for n in 3..=6usize {
        let cfg = Config {
            numbers: n,
            max_number: 20,
            max_target: 50,
            ..Config::default()
        };
        let mut rng = Rng::new(n as u64);
        for _ in 0..50 {
            let p = draw(&mut rng, &cfg);
            assert_eq!(p.numbers.len(), n);
            assert!(p.numbers.iter().all(|&x| (1..=20).contains(&x)), "{p:?}");
            assert!((1..=50).contains(&p.target), "{p:?}");
        }
    }
}

/// Every generated puzzle is solved, and the solver's text scores correct through the
/// full environment (reset, step, reward), for both prompt styles.
#[test]
fn solver_solves_every_generated_puzzle() {
    for (n, prompt, seeds) in [
        (4, PromptStyle::Think, 300u64),
        (3, PromptStyle::Direct, 100),
        (6, PromptStyle::Direct, 15),
    ] {
        let cfg = Config {
            numbers: n,
            prompt,
            ..Config::default()
        };
        let f = CountdownFactory::new(cfg).unwrap();
        for s in 0..seeds {
            let seed = if s % 2 == 0 { s } else { eval_seed(s) };
            let mut env = f.reset(seed);
            let p = f.episode(seed).puzzle().clone();
            assert!(solve(&p.numbers, p.target).is_some(), "{p:?}");
            let text = env.continuation_action(0);
            assert_eq!(text.contains("<think>"), prompt == PromptStyle::Think);
            assert_eq!(env.to_act(), [0]);
            let out = env.step(std::slice::from_ref(&text)).unwrap();
            assert_eq!((out.rewards[0], out.valid[0]), (1.0, true), "{text}");
            assert!(out.feedback[0].is_empty());
            assert!(env.done() && env.to_act().is_empty());
            let r = env.reward(0);
            assert_eq!(r.scalar, 1.0);
            assert_eq!(r.components["correct"], 1.0);
            assert_eq!(r.components["format"], 1.0);
            assert_eq!(r.components["win"], 1.0);
            assert!(env.won(0));
        }
    }
}

/// Training and held-out seeds draw disjoint puzzle sets, each of the class it claims.
#[test]
fn train_and_held_out_puzzles_are_disjoint() {
    let f = default_factory();
    let key = |p: &Puzzle| {
        let mut n = p.numbers.clone();
        n.sort_unstable();
        (n, p.target)
    };
    let (mut train, mut held) = (BTreeSet::new(), BTreeSet::new());
    for i in 0..3000u64 {
        let t = f
            .episode(training_seed(i.wrapping_mul(0x9E37_79B9)))
            .puzzle()
            .clone();
        let h = f.episode(eval_seed(i)).puzzle().clone();
        assert!(!t.held_out(), "{t:?}");
        assert!(h.held_out(), "{h:?}");
        train.insert(key(&t));
        held.insert(key(&h));
    }
    assert!(train.is_disjoint(&held));
    assert!(train.len() > 2500 && held.len() > 2500);
}

#[test]
fn classes_are_balanced_and_order_free() {
    let mut rng = Rng::new(5);
    let cfg = Config::default();
    let held = (0..2000)
        .filter(|_| draw(&mut rng, &cfg).held_out())
        .count();
    assert!((800..1200).contains(&held), "{held}");
    let p = Puzzle {
        numbers: vec![3, 1, 2],
        target: 6,
    };
    let q = Puzzle {
        numbers: vec![2, 3, 1],
        target: 6,
    };
    assert_eq!(p.class_hash(), q.class_hash());
    let mut rng = Rng::new(9);
    assert!(generate(&mut rng, &cfg, true).held_out());
}

#[test]
fn random_policy_always_parses_and_is_seeded() {
    let f = default_factory();
    let (mut correct, mut texts) = (0, Vec::new());
    for seed in 0..300 {
        let mut env = f.reset(seed);
        let text = env.policy_action("random", 0).unwrap();
        let out = env.step(std::slice::from_ref(&text)).unwrap();
        assert!(out.valid[0], "{text}");
        let r = env.reward(0);
        assert_eq!(r.components["format"], 1.0, "{text}");
        correct += r.components["correct"] as usize;
        texts.push(text);
    }
    assert!(correct < 150, "random should rarely be right: {correct}");
    let again: Vec<String> = (0..300)
        .map(|s| f.reset(s).policy_action("random", 0).unwrap())
        .collect();
    assert_eq!(texts, again);
}

#[test]
fn sum_policy_and_unknown_policy() {
    let f = default_factory();
    let mut env = f.episode(3);
    let text = env.policy_action("sum", 0).unwrap();
    let p = env.puzzle().clone();
    let sum: u32 = p.numbers.iter().sum();
    let v = check_answer(&text, &p.numbers, p.target);
    assert!(v.format());
    assert_eq!(v.correct(), sum == p.target, "{text}");
    let err = env.policy_action("oracle", 0).unwrap_err().to_string();
    assert!(err.contains("oracle") && err.contains("solver"), "{err}");
    assert!(env.policy_action("sum", 1).is_err());
}

#[test]
fn env_contract() {
    let f = default_factory();
    let mut env = f.reset(11);
    assert_eq!((env.num_seats(), env.policy_seats()), (1, vec![0]));
    let r = env.reward(0);
    assert_eq!(r.scalar, 0.0);
    assert_eq!(r.components["format"], 0.0);
    let obs = env.observation(0);
    assert_eq!(obs.len(), 2);
    assert_eq!(
        (obs[0].role.as_str(), obs[1].role.as_str()),
        ("system", "user")
    );
    assert!(obs[1].content.starts_with("Using the numbers ["));
    assert!(obs[1].content.contains("<think> </think>"));
    assert!(env.step(&[]).is_err());
    let fork = env.clone_box();
    let out = env.step(&["I give up".into()]).unwrap();
    assert_eq!((out.rewards[0], out.valid[0]), (0.0, false));
    assert!(
        out.feedback[0].contains("no <answer> tag"),
        "{:?}",
        out.feedback
    );
    assert!(env.step(&["<answer> 1 </answer>".into()]).is_err());
    assert!(!fork.done());
    let t = env.transcript();
    for k in ["seed", "steps", "numbers", "target"] {
        assert!(t.get(k).is_some(), "{k}");
    }
    let replayed = crate::envs::replay(&f, &t).unwrap();
    assert_eq!(replayed.transcript(), t);
    assert!(env.render_state().contains("target:"));
}

#[test]
fn direct_prompt_asks_for_the_equation_only() {
    let f = CountdownFactory::from_options(&with("prompt", "direct".into())).unwrap();
    let obs = f.reset(1).observation(0);
    assert!(!obs[1].content.contains("<think>"));
    assert!(obs[1].content.contains("<answer> </answer>"));
}

#[test]
fn option_errors_name_the_key() {
    for (key, value) in [
        ("numbers", toml::Value::Integer(7)),
        ("numbers", toml::Value::String("4".into())),
        ("max_number", toml::Value::Integer(0)),
        ("max_target", toml::Value::Integer(-5)),
        ("prompt", toml::Value::String("chatty".into())),
        ("colour", toml::Value::Integer(1)),
    ] {
        let err = Config::from_options(&with(key, value))
            .unwrap_err()
            .to_string();
        assert!(err.contains(&format!("`{key}`")), "{err}");
    }
    let ok = Config::from_options(&with("numbers", toml::Value::Integer(6))).unwrap();
    assert_eq!(ok.numbers, 6);
    assert!(crate::envs::create(NAME, &Options::new()).is_ok());
}

#[test]
fn baseline_rows() {
    let f = default_factory();
    let solver = f.baseline("solver", "default", 40, 0).unwrap();
    assert_eq!((solver.win_rate, solver.mean_reward), (1.0, 1.0));
    assert_eq!(solver.extra["format_rate"], 1.0);
    let random = f.baseline("random", "default", 40, 0).unwrap();
    assert_eq!(random.extra["format_rate"], 1.0);
    assert!(random.win_rate < 0.5 && random.mean_reward >= 0.1);
    assert!(f.baseline("solver", "hard", 1, 0).is_err());
    assert!(f.baseline("oracle", "default", 1, 0).is_err());
    assert!(f.describe().contains("max_target"));
}

mod checker {
    use super::super::check::{answer_span, check_answer, Verdict};
    use Verdict::*;

    const NUMS: [u32; 4] = [3, 5, 7, 2];
    const TARGET: u32 = 24;

    fn check(text: &str) -> Verdict {
        check_answer(text, &NUMS, TARGET)
    }

    #[test]
    fn correct_answers() {
        // 7*3 + 5 - 2 = 24
        assert_eq!(check("<answer> 7 * 3 + 5 - 2 </answer>"), Correct);
        assert_eq!(check("<answer>7*3+5-2</answer>"), Correct);
        assert_eq!(check("<answer>\n 7 × 3 + 5 − 2 = 24 \n</answer>"), Correct);
        assert_eq!(check("<answer> 7·3 + 5 - 2 =24</answer>"), Correct);
        assert_eq!(check("<answer> ((7 * 3) + (5 - 2)) </answer>"), Correct);
        assert_eq!(check("<answer> 07 * 3 + 5 - 2 </answer>"), Correct);
        assert_eq!(Correct.scalar(), 1.0);
    }

    #[test]
    fn only_the_last_answer_counts() {
        let think = "<think> 3 + 5 + 7 + 2 = 17, try 7 * 3 + 5 - 2 </think>";
        assert_eq!(
            check(&format!("{think} <answer> 7*3+5-2 </answer>")),
            Correct
        );
        let two = "<answer> 7*3+5-2 </answer> wait, no: <answer> 3+5+7+2 </answer>";
        assert_eq!(check(two), WrongValue);
        let two = "<answer> 3+5+7+2 </answer> better: <answer> 7*3+5-2 </answer>";
        assert_eq!(check(two), Correct);
        let trailing = "<answer> 7*3+5-2 </answer> Hope this helps! 1 2 3 = 99";
        assert_eq!(check(trailing), Correct);
        let unclosed = "<answer> 7*3+5-2 </answer> and <answer> 7*3+5-2";
        assert_eq!(check(unclosed), Correct);
        assert_eq!(
            check("<answer> 7*3+5-2 </answer> <answer>"),
            Unparseable("the expression is empty or ends early")
        );
        assert_eq!(answer_span("x <answer> 1 + 2"), Some(" 1 + 2"));
        assert_eq!(answer_span("<ANSWER> 1 </ANSWER>"), None);
    }

    #[test]
    fn numbers_must_be_exactly_the_puzzles() {
        assert_eq!(
            check("<answer> 7*3+5-2-3+3 </answer>"),
            WrongNumbers,
            "reused"
        );
        assert_eq!(check("<answer> 7*3+5 </answer>"), WrongNumbers, "missing");
        assert_eq!(check("<answer> 7*3+5-2+0 </answer>"), WrongNumbers, "extra");
        assert_eq!(
            check("<answer> 8*3 = 24 </answer>"),
            WrongNumbers,
            "= ignored"
        );
        assert_eq!(check("<answer> 3 + 5 + 7 + 2 </answer>"), WrongValue);
        assert_eq!(WrongValue.scalar(), 0.1);
        assert!(WrongNumbers.format() && !WrongNumbers.correct());
    }

    #[test]
    fn exact_rationals() {
        // 1/3 is not an integer, yet (1/3 + 7) * 3 = 22 exactly.
        let v = check_answer("<answer> (1 / 3 + 7) * 3 </answer>", &[1, 3, 7, 3], 22);
        assert_eq!(v, Correct);
        // 8 / (3 - 8/3) = 24, the classic fraction puzzle.
        let v = check_answer("<answer> 8 / (3 - 8 / 3) </answer>", &[8, 3, 8, 3], 24);
        assert_eq!(v, Correct);
        // Integer division would give 7 / 2 * 2 = 6; exactly it is 7.
        let v = check_answer("<answer> 7 / 2 * 2 </answer>", &[7, 2, 2], 6);
        assert_eq!(v, WrongValue);
    }

    #[test]
    fn undefined_values_are_never_correct() {
        assert_eq!(check("<answer> 7 * 3 / (5 - 5) </answer>"), WrongNumbers);
        let v = check_answer("<answer> 7 / (5 - 5) + 2 </answer>", &[7, 5, 5, 2], 2);
        assert_eq!(v, Undefined);
        assert_eq!(v.scalar(), 0.1);
        let big = "99999999999999999999";
        let text = format!("<answer> {big} * {big} * {big} - {big} </answer>");
        let nums = [99_999_999u32; 4];
        assert_eq!(check_answer(&text, &nums, 1), WrongNumbers);
        let huge = "9".repeat(60);
        assert_eq!(
            check(&format!("<answer> {huge} + 1 </answer>")),
            WrongNumbers
        );
        assert_eq!(
            check(&format!("<answer> 7*3+5-2 = {huge} </answer>")),
            Correct
        );
    }

    #[test]
    fn overflow_with_the_right_numbers() {
        // The right numbers (they fit in u32), but their product overflows i128.
        let nums = [
            4_000_000_000u32,
            1,
            4_000_000_000,
            4_000_000_000,
            4_000_000_000,
            4_000_000_000,
        ];
        let text =
            "<answer> 4000000000 * 4000000000 * 4000000000 * 4000000000 * 4000000000 / 1 </answer>";
        assert_eq!(check_answer(text, &nums, 1), Undefined);
    }

    #[test]
    fn malformed_answers_have_format_zero() {
        let bad = [
            "",
            "24",
            "7*3+5-2",
            "<answer></answer>",
            "<answer> seven times three </answer>",
            "<answer> -2 + 7*3 + 5 </answer>",
            "<answer> 7*3+5+(-2) </answer>",
            "<answer> 7*3+5-2. </answer>",
            "<answer> 7*3+5-2 = </answer>",
            "<answer> 7*3+5-2 = 24 = 24 </answer>",
            "<answer> (7*3+5-2 </answer>",
            "<answer> 7*3+5-2) </answer>",
            "<answer> 7**3+5-2 </answer>",
            "<answer> 7 3 + 5 - 2 </answer>",
            "<answer> 7.0*3+5-2 </answer>",
            "<answer> x = 7*3+5-2 </answer>",
            "<answer>\u{0}\u{202e}💥</answer>",
        ];
        for t in bad {
            let v = check(t);
            assert!(!v.format(), "{t:?} -> {v:?}");
            assert_eq!(v.scalar(), 0.0);
        }
        assert_eq!(check(""), NoAnswer);
        assert_eq!(
            check("<answer> -2 + 7*3 + 5 </answer>"),
            Unparseable("a sign before a number is not allowed")
        );
    }

    #[test]
    fn deep_or_long_input_does_not_panic() {
        let deep = format!(
            "<answer> {}1{} </answer>",
            "(".repeat(100_000),
            ")".repeat(100_000)
        );
        assert_eq!(check(&deep), Unparseable("parentheses nested too deeply"));
        let ok = format!(
            "<answer> {}7*3+5-2{} </answer>",
            "(".repeat(60),
            ")".repeat(60)
        );
        assert_eq!(check(&ok), Correct);
        let long = format!("<answer> {} </answer>", vec!["1"; 200_000].join(" + "));
        assert_eq!(check(&long), WrongNumbers);
        let long = format!("<answer> {} </answer>", vec!["9"; 200_000].join(" * "));
        assert_eq!(check(&long), WrongNumbers);
    }
}

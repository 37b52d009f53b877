use super::*;
use crate::envs::{replay, rollout::eval_seed};

const ROWS: &str = r#"{"id": "a", "prompt": "What is 2 + 3?", "answer": "5"}
{"id": "b", "prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "7 - 9?"}], "answer": -2}

{"id": "c", "messages": [{"role": "user", "content": "Capital of France?"}, {"role": "assistant", "content": "<answer>Paris</answer>"}], "answer": "Paris"}
{"id": "d", "prompt": "Say 4.", "answer": "4", "completion": "<answer>4</answer>", "split": "test"}
"#;

fn write(text: &str) -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("d.jsonl");
    std::fs::write(&p, text).unwrap();
    (dir, p.display().to_string())
}

fn options(path: &str, extra: &str) -> Options {
    toml::from_str(&format!("path = {path:?}\n{extra}")).unwrap()
}

fn factory_of(path: &str, extra: &str) -> DatasetFactory {
    DatasetFactory::from_options(&options(path, extra)).unwrap()
}

fn error_of(path: &str, extra: &str) -> String {
    format!(
        "{:#}",
        DatasetFactory::from_options(&options(path, extra)).unwrap_err()
    )
}

#[test]
fn rows_read_both_prompt_layouts_and_their_demonstrations() {
    let (_d, p) = write(ROWS);
    let f = factory_of(
        &p,
        "verifier = 'exact'\nsplit_key = 'split'\nsystem = 'You add.'",
    );
    let s = &f.0;
    assert_eq!(s.rows.len(), 4);
    assert_eq!(
        s.rows.iter().map(|r| r.line).collect::<Vec<_>>(),
        [1, 2, 4, 5]
    );
    let roles = |i: usize| {
        s.rows[i]
            .prompt
            .iter()
            .map(|m| m.role.as_str())
            .collect::<Vec<_>>()
    };
    // `system` goes first where a prompt has none of its own
    assert_eq!(roles(0), ["system", "user"]);
    assert_eq!(s.rows[0].prompt[0].content, "You add.");
    assert_eq!(s.rows[1].prompt[0].content, "Be brief.");
    // a conversation's final assistant turn is the demonstration, not the prompt
    assert_eq!(roles(2), ["system", "user"]);
    assert_eq!(
        s.rows[2].demonstration.as_deref(),
        Some("<answer>Paris</answer>")
    );
    assert_eq!(
        s.rows[3].demonstration.as_deref(),
        Some("<answer>4</answer>")
    );
    assert_eq!(
        s.rows[0].demonstration.as_deref(),
        Some("5"),
        "the answer as text"
    );
    assert_eq!(s.rows[1].demonstration.as_deref(), Some("-2"));
    assert_eq!(
        (s.train.clone(), s.held_out.clone()),
        (vec![0, 1, 2], vec![3])
    );
}

#[test]
fn bad_files_name_the_line() {
    let cases = [
        (
            "{\"prompt\": \"a\", \"answer\": 1}\n{\"prompt\": \"b\",\n",
            "line 2",
        ),
        ("[1, 2]\n", "line 1: expected a JSON object, got an array"),
        ("{\"answer\": 1}\n", "no `prompt` field"),
        (
            "{\"prompt\": [{\"role\": \"robot\", \"content\": \"x\"}]}\n",
            "unknown role `robot`",
        ),
        (
            "{\"prompt\": 3}\n",
            "`prompt` must be a string or a list of messages",
        ),
        (
            "{\"prompt\": \"a\", \"completion\": 5}\n",
            "`completion` must be a string",
        ),
        ("\n\n", "has no rows"),
    ];
    for (text, want) in cases {
        let (_d, p) = write(text);
        let e = error_of(&p, "verifier = 'exact'");
        assert!(e.contains(want), "{text:?}: {e}");
    }
    let e = error_of("/nonexistent/d.jsonl", "verifier = 'exact'");
    assert!(e.contains("reading dataset /nonexistent/d.jsonl"), "{e}");
}

#[test]
fn options_are_checked_by_name() {
    let (_d, p) = write(ROWS);
    let cases = [
        (
            "verifier = 'exact'\nshuffle = true",
            "unknown dataset option `shuffle`",
        ),
        ("", "a dataset needs `verifier"),
        (
            "verifier = 'exact'\nverifiers = [{kind = 'exact'}]",
            "not both",
        ),
        (
            "verifiers = [{kind = 'exact'}, {kind = 'exact'}]",
            "two verifiers are named `exact`",
        ),
        ("verifiers = [{kind = 'exact'}, {kind = 'nope'}]", "entry 2"),
        (
            "verifier = 'exact'\nreward_weights = [1, 2]",
            "must be 1 numbers",
        ),
        (
            "verifier = 'exact'\naccuracy = 'correct'",
            "names no verifier or program component: `correct`",
        ),
        ("verifier = 'exact'\nheld_out = 1.5", "fraction in (0, 1)"),
        (
            "verifier = 'exact'\nheld_out = 0.5\nsplit_key = 's'",
            "not both",
        ),
        (
            "verifier = 'exact'\nheld_out_split = 'x'",
            "goes with `split_key`",
        ),
        (
            "verifier = 'exact'\nsplit_key = 'split'\nheld_out_split = 'none'",
            "holds out no row",
        ),
        (
            "verifier = 'exact'\nsplit_key = 'id'\nheld_out_split = 'a'",
            "",
        ),
        (
            "verifier = 'exact'\nanswer_key = 3",
            "`answer_key` must be a string",
        ),
    ];
    for (extra, want) in cases {
        match DatasetFactory::from_options(&options(&p, extra)) {
            Ok(_) => assert!(want.is_empty(), "{extra:?} loaded"),
            Err(e) => {
                let e = format!("{e:#}");
                assert!(!want.is_empty() && e.contains(want), "{extra:?}: {e}");
            }
        }
    }
    let (_d, p) = write(
        "{\"prompt\": \"a\", \"s\": \"{\\\"$ref\\\": 1}\"}\n{\"prompt\": \"b\", \"s\": {}}\n",
    );
    let e = error_of(&p, "verifier = {kind = 'json_schema', schema_key = 's'}");
    assert!(e.contains("line 1: `s`") && e.contains("`$ref`"), "{e}");
}

/// 200 rows; the split by fraction is a property of each prompt, not of file order.
fn numbered(order: impl Iterator<Item = usize>) -> String {
    order
        .map(|i| format!("{{\"id\": {i}, \"prompt\": \"q{i}\", \"answer\": \"{i}\"}}\n"))
        .collect()
}

fn held_ids(f: &DatasetFactory) -> Vec<i64> {
    let mut ids: Vec<i64> =
        f.0.held_out
            .iter()
            .map(|&i| f.0.rows[i].fields["id"].as_i64().unwrap())
            .collect();
    ids.sort();
    ids
}

#[test]
fn a_fractional_split_keeps_each_row_on_its_side() {
    let (_a, p) = write(&numbered(0..200));
    let (_b, q) = write(&numbered((0..200).rev()));
    let (_c, r) = write(&numbered((0..200).chain(200..260)));
    let f = factory_of(&p, "verifier = 'exact'\nheld_out = 0.25");
    let held = held_ids(&f);
    assert!((35..=65).contains(&held.len()), "{}", held.len());
    assert_eq!(
        held,
        held_ids(&factory_of(&q, "verifier = 'exact'\nheld_out = 0.25"))
    );
    let more = held_ids(&factory_of(&r, "verifier = 'exact'\nheld_out = 0.25"));
    assert_eq!(
        more.iter()
            .filter(|&&i| i < 200)
            .copied()
            .collect::<Vec<_>>(),
        held
    );
    // a `system` option changes the prompts, not the split
    let sys = factory_of(&p, "verifier = 'exact'\nheld_out = 0.25\nsystem = 'x'");
    assert_eq!(held_ids(&sys), held);
}

#[test]
fn a_question_keeps_its_side_whatever_its_demonstration_or_layout() {
    let mut text = String::new();
    for i in 0..100 {
        let q = format!("question {i}");
        text += &format!("{{\"prompt\": {q:?}, \"answer\": \"1\"}}\n");
        text += &format!(
            "{{\"messages\": [{{\"role\": \"user\", \"content\": {q:?}}}, \
             {{\"role\": \"assistant\", \"content\": \"demo {i}\"}}], \"answer\": \"1\"}}\n"
        );
    }
    let (_d, p) = write(&text);
    let f = factory_of(&p, "verifier = 'exact'\nheld_out = 0.3");
    let side = |i: usize| f.0.held_out.contains(&i);
    for i in 0..100 {
        assert_eq!(side(2 * i), side(2 * i + 1), "question {i}");
    }
    assert!(f.0.held_out.len() > 20 && f.0.train.len() > 100);
}

#[test]
fn seeds_pick_rows_from_their_side() {
    let (_d, p) = write(&numbered(0..50));
    let f = factory_of(&p, "verifier = 'exact'\nheld_out = 0.3");
    let (train, held) = (f.0.train.clone(), f.0.held_out.clone());
    for s in 0..500u64 {
        let seed = crate::rng::splitmix64(s) & !HELD_OUT_BIT;
        assert!(train.contains(&f.row_of(seed)));
    }
    // `concord eval --episodes N` plays the held-out rows in file order
    let order: Vec<usize> = (0..held.len() as u64)
        .map(|i| f.row_of(eval_seed(i)))
        .collect();
    assert_eq!(order, held);
    assert_eq!(
        f.row_of(eval_seed(held.len() as u64)),
        held[0],
        "then again"
    );
}

#[test]
fn the_episode_scores_every_verifier_and_weights_them() {
    // the rows with numbers for answers (a numeric verifier refuses "Paris" at load)
    let numeric: String = ROWS
        .lines()
        .filter(|l| !l.contains("Paris"))
        .map(|l| format!("{l}\n"))
        .collect();
    let e = error_of(&write(ROWS).1, "split_key = 'split'\nverifier = 'numeric'");
    assert!(e.contains("line 4") && e.contains("\"Paris\""), "{e}");
    let (_d, p) = write(&numeric);
    let f = factory_of(
        &p,
        "split_key = 'split'\nreward_weights = [1.0, 0.25]\naccuracy = 'correct'\n\
         verifiers = [{name = 'format', kind = 'regex', pattern = '^<answer>.*</answer>$'}, \
         {name = 'correct', kind = 'numeric', extract = 'answer_tag'}]",
    );
    let mut env = f.reset(eval_seed(0));
    assert_eq!(env.observation(0).last().unwrap().content, "Say 4.");
    assert_eq!(env.to_act(), [0]);
    assert_eq!(env.reward(0).scalar, 0.0);
    let out = env.step(&["<answer>4.0</answer>".to_string()]).unwrap();
    assert_eq!(
        (out.valid.clone(), out.rewards.clone()),
        (vec![true], vec![1.25])
    );
    assert!(env.done() && env.to_act().is_empty() && env.won(0));
    let r = env.reward(0);
    assert_eq!(r.components["format"], 1.0);
    assert_eq!(r.components["correct"], 1.0);
    let t = env.transcript();
    assert_eq!((t["line"].as_u64(), t["id"].as_str()), (Some(4), Some("d")));
    assert_eq!(t["held_out"], true);
    assert_eq!(t["scores"]["correct"], 1.0);
    let again = replay(&f, &t).unwrap();
    assert_eq!(again.reward(0), r);
    // no answer tag: the accuracy verifier finds nothing, format fails too
    let mut env = f.reset(eval_seed(0));
    let out = env.step(&["4".to_string()]).unwrap();
    assert_eq!(out.valid, [false]);
    assert!(
        out.feedback[0].contains("no answer found for `correct`"),
        "{:?}",
        out.feedback
    );
    assert!(!env.won(0));
    assert!(
        env.step(&[String::new(), String::new()])
            .unwrap()
            .seats
            .is_empty(),
        "done"
    );
    let mut fresh = f.reset(eval_seed(0));
    assert!(fresh.step(&[String::new(), String::new()]).is_err());
}

#[test]
fn the_reference_policy_is_the_rows_own_demonstration() {
    let (_d, p) = write(&numbered(0..40));
    let f = factory_of(&p, "verifier = {kind = 'numeric'}\nheld_out = 0.5");
    let row = f.baseline("reference", "held_out", 1000, 0).unwrap();
    assert_eq!((row.episodes, row.win_rate), (f.0.held_out.len(), 1.0));
    assert_eq!(f.baseline("reference", "train", 3, 0).unwrap().episodes, 3);
    assert!(f.baseline("oracle", "train", 3, 0).is_err());
    assert!(f.baseline("reference", "all", 3, 0).is_err());
    let d = sample_decision_of(&f, 7);
    assert_eq!(d, f.0.rows[f.row_of(7)].demonstration.clone().unwrap());
}

fn sample_decision_of(f: &DatasetFactory, seed: u64) -> String {
    let d = crate::envs::sample_decision(f, seed);
    assert_eq!(d.step, 0, "one step: the decision is the first");
    let mut env = d.env.clone_box();
    env.continuation_action(d.seat)
}

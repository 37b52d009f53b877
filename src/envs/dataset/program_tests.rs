//! Reward programs: real processes (small `sh` scripts) speaking the protocol, and
//! each way one can fail.
use super::program::{Program, ProgramFailed, Spec};
use super::*;
use crate::envs::batch::{prefetch, BatchScorer};
use serde_json::json;
use std::path::Path;
use std::time::{Duration, Instant};

/// Replies, for each item, the length of its completion (test completions hold no
/// quote), and appends every request to `requests.log` in its directory (the program
/// the integration tests use too).
const LENGTHS: &str = include_str!("../../../tests/fixtures/reward_length.sh");

/// A script in a fresh directory, and a spec that runs it there.
fn script(body: &str, extra: &str) -> (tempfile::TempDir, Spec) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("reward.sh"), body).unwrap();
    let spec = Spec::from_toml(&toml::Value::Table(
        toml::from_str(&format!(
            "command = ['sh', 'reward.sh']\ndir = {:?}\n{extra}",
            dir.path().display().to_string()
        ))
        .unwrap(),
    ))
    .unwrap();
    (dir, spec)
}

fn items(texts: &[&str]) -> Vec<serde_json::Value> {
    texts
        .iter()
        .map(|t| json!({"completion": t, "row": {"completion": "not this one"}}))
        .collect()
}

fn rewards(p: &Program, texts: &[&str]) -> Vec<f64> {
    p.exchange(&items(texts))
        .unwrap()
        .iter()
        .map(|r| r.reward)
        .collect()
}

fn failure(p: &Program, texts: &[&str]) -> String {
    let e = p.exchange(&items(texts)).unwrap_err();
    assert!(e.downcast_ref::<ProgramFailed>().is_some(), "{e:#}");
    format!("{e:#}")
}

fn requests(dir: &Path) -> usize {
    std::fs::read_to_string(dir.join("requests.log"))
        .map(|t| t.lines().count())
        .unwrap_or(0)
}

#[test]
fn one_process_answers_batch_after_batch_in_order() {
    let (dir, spec) = script(LENGTHS, "");
    let p = Program::new(spec);
    // not started before the first request
    assert_eq!(requests(dir.path()), 0);
    assert_eq!(rewards(&p, &["a", "abc", "", "ab"]), [1.0, 3.0, 0.0, 2.0]);
    assert_eq!(rewards(&p, &["abcde"]), [5.0]);
    assert_eq!(requests(dir.path()), 2);
    // each request line is the documented object
    let log = std::fs::read_to_string(dir.path().join("requests.log")).unwrap();
    let first: serde_json::Value = serde_json::from_str(log.lines().next().unwrap()).unwrap();
    assert_eq!(first["batch"].as_array().unwrap().len(), 4);
    assert_eq!(first["batch"][1]["completion"], "abc");
}

#[test]
fn a_prefetched_batch_answers_later_steps_without_asking_again() {
    let (dir, spec) = script(LENGTHS, "");
    let p = Arc::new(Program::new(spec));
    let batch = vec![
        (11, items(&["xy"])[0].clone()),
        (12, items(&["xyz"])[0].clone()),
    ];
    p.prefetch(batch).unwrap();
    assert_eq!(p.score(12, json!({})).unwrap().reward, 3.0);
    assert_eq!(p.score(11, json!({})).unwrap().reward, 2.0);
    assert_eq!(requests(dir.path()), 1);
    // a key the batch did not hold is asked for alone
    assert_eq!(p.score(13, items(&["q"])[0].clone()).unwrap().reward, 1.0);
    assert_eq!(requests(dir.path()), 2);
}

#[test]
fn replies_may_carry_declared_components_and_nulls() {
    let (_d, spec) = script(
        r#"read -r line
echo '{"rewards": [null, 0.5, {"reward": 1, "components": {"format": 1}}]}'
read -r line
"#,
        "components = ['format']",
    );
    let p = Program::new(spec);
    let r = p.exchange(&items(&["a", "b", "c"])).unwrap();
    assert_eq!(r[0].reward, 0.0);
    assert_eq!(r[1].reward, 0.5);
    assert_eq!(r[2].reward, 1.0);
    assert_eq!(r[2].components.get("format"), Some(&1.0));
}

#[test]
fn a_crash_names_the_program_its_exit_status_and_stderr_tail() {
    let (dir, spec) = script(
        "read -r line\necho 'Traceback (most recent call last):' >&2\n\
         echo \"KeyError: 'answer'\" >&2\nexit 3\n",
        "",
    );
    let p = Program::new(spec);
    let e = failure(&p, &["a"]);
    assert!(e.contains("`sh reward.sh`"), "{e}");
    assert!(e.contains(&dir.path().display().to_string()), "{e}");
    assert!(e.contains("exited before replying"), "{e}");
    assert!(e.contains("exit status: 3"), "{e}");
    assert!(e.contains("KeyError: 'answer'"), "{e}");
    // not restarted: the same error again
    assert_eq!(failure(&p, &["b"]), e);
}

#[test]
fn a_hang_times_out_and_the_program_is_killed() {
    let (_d, spec) = script("read -r line\nexec sleep 30\n", "timeout = 0.3");
    let p = Program::new(spec);
    let t = Instant::now();
    let e = failure(&p, &["a"]);
    assert!(e.contains("no reply within 0.3 s"), "{e}");
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
}

#[test]
fn garbage_and_malformed_replies_are_errors_that_quote_the_line() {
    for (reply, says) in [
        ("hello", "its reply is not JSON"),
        ("[1, 2]", "no `rewards` array"),
        (
            r#"{"rewards": [1, 2, 3]}"#,
            "replied 3 rewards for 2 answers",
        ),
        (r#"{"rewards": ["1", 2]}"#, "reward 1: expected a number"),
        (
            r#"{"rewards": [1, {"score": 2}]}"#,
            "reward 2: unknown key `score`",
        ),
        (
            r#"{"rewards": [1, {"reward": 2, "components": {"len": 1}}]}"#,
            "component `len` is not declared",
        ),
        (
            r#"{"error": "no column `answer`"}"#,
            "it reported an error: no column `answer`",
        ),
    ] {
        let (_d, spec) = script(&format!("read -r line\necho '{reply}'\nread -r line\n"), "");
        let e = failure(&Program::new(spec), &["a", "b"]);
        assert!(e.contains(says), "{reply}: {e}");
    }
}

#[test]
fn a_partial_line_is_an_error_whether_the_program_exits_or_hangs() {
    let (_d, spec) = script("read -r line\nprintf '{\"rewards\": [0.'\n", "");
    let e = failure(&Program::new(spec), &["a"]);
    assert!(e.contains("exited in the middle of a reply line"), "{e}");
    assert!(e.contains(r#"`{"rewards": [0.`"#), "{e}");
    let (_d, spec) = script(
        "read -r line\nprintf '{\"rewards\": [0.'\nexec sleep 30\n",
        "timeout = 0.3",
    );
    let e = failure(&Program::new(spec), &["a"]);
    assert!(e.contains("no reply within"), "{e}");
}

#[test]
fn an_extra_line_is_an_error_not_the_next_reply() {
    // two lines a request, written at once: the second would be the next one's reply
    let (_d, spec) = script(
        "while IFS= read -r line; do printf '{\"rewards\": [1]}\\n{\"rewards\": [2]}\\n'; done\n",
        "",
    );
    let p = Program::new(spec);
    assert_eq!(rewards(&p, &["a"]), [1.0]);
    std::thread::sleep(Duration::from_millis(200));
    let e = failure(&p, &["b"]);
    assert!(e.contains("a line nobody asked for"), "{e}");
    assert!(e.contains(r#"{"rewards": [2]}"#), "{e}");
}

#[test]
fn a_program_that_never_reads_a_large_request_times_out() {
    // 4 MiB: far more than a pipe holds, so the write itself would block
    let (_d, spec) = script("exec sleep 30\n", "timeout = 0.5");
    let p = Program::new(spec);
    let big = "x".repeat(4 << 20);
    let t = Instant::now();
    let e = failure(&p, &[big.as_str()]);
    assert!(e.contains("no reply within 0.5 s"), "{e}");
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
}

#[test]
fn a_program_that_cannot_start_or_stops_reading_is_an_error() {
    let (_d, mut spec) = script("", "");
    spec.command = vec!["/nonexistent/reward-program".into()];
    let e = failure(&Program::new(spec), &["a"]);
    assert!(e.contains("could not start it"), "{e}");
    let (_d, spec) = script("exit 0\n", "");
    let e = failure(&Program::new(spec), &["a"]);
    assert!(e.contains("exit status: 0"), "{e}");
}

#[test]
fn the_reward_table_is_checked_by_key() {
    let bad = |t: &str| {
        let v = toml::Value::Table(toml::from_str(t).unwrap());
        format!("{:#}", Spec::from_toml(&v).unwrap_err())
    };
    assert!(bad("dir = '.'").contains("`command` is required"));
    assert!(bad("command = []").contains("`command` is required"));
    assert!(bad("command = ['x']\ntimeout = 0").contains("`timeout`"));
    assert!(bad("command = ['x']\ncommand_line = 'x'").contains("unknown key `command_line`"));
    assert!(bad("command = ['x']\ncomponents = ['program']").contains("`components` cannot"));
}

// ----- the dataset environment with a program -------------------------------------

const ROWS: &str = r#"{"prompt": "Say hi.", "answer": "hi"}
{"prompt": "Say hello.", "answer": "hello"}
{"prompt": "Say yo.", "answer": "yo"}
"#;

fn dataset(dir: &Path, extra: &str) -> DatasetFactory {
    let data = dir.join("d.jsonl");
    std::fs::write(&data, ROWS).unwrap();
    let o: Options = toml::from_str(&format!(
        "path = {:?}\nheld_out = 0.5\n{extra}\n[reward]\ncommand = ['sh', 'reward.sh']\ndir = {:?}\n",
        data.display().to_string(),
        dir.display().to_string()
    ))
    .unwrap();
    DatasetFactory::from_options(&o).unwrap()
}

#[test]
fn the_program_joins_the_verifiers_in_the_reward_and_decides_wins_if_named() {
    let (dir, _) = script(LENGTHS, "");
    let f = dataset(dir.path(), "verifier = 'exact'\naccuracy = 'program'");
    let names = EnvFactory::component_names(&f).unwrap();
    assert_eq!(names, ["exact", "program"]);
    // finding the components asked nothing
    assert_eq!(requests(dir.path()), 0);
    let mut env = f.reset(0);
    let answer = env.observation(0)[0]
        .content
        .replace("Say ", "")
        .replace('.', "");
    env.step(std::slice::from_ref(&answer)).unwrap();
    let r = env.reward(0);
    assert_eq!(r.components["exact"], 1.0);
    assert_eq!(r.components["program"], answer.len() as f64);
    assert_eq!(r.scalar, 1.0 + answer.len() as f64);
    assert!(env.won(0));
    // the transcript keeps the reply
    assert_eq!(env.transcript()["program"]["reward"], answer.len() as f64);
}

#[test]
fn a_program_alone_is_a_task_and_its_failure_is_a_step_error() {
    let (dir, _) = script("read -r line\necho 'no' >&2\nexit 1\n", "");
    let f = dataset(dir.path(), "");
    let mut env = f.reset(1);
    let e = env.step(&["x".into()]).unwrap_err();
    assert!(e.downcast_ref::<ProgramFailed>().is_some(), "{e:#}");
    // the episode did not take the answer
    assert!(!env.done());
}

#[test]
fn decisions_prefetch_one_exchange_for_all_their_answers() {
    let (dir, _) = script(LENGTHS, "");
    let f = dataset(dir.path(), "");
    let decisions: Vec<_> = (0..3)
        .map(|s| crate::envs::sample_decision(&f, s))
        .collect();
    // drawing decisions asked nothing (the continuation is not played)
    assert_eq!(requests(dir.path()), 0);
    let texts = ["a", "bb", "ccc"];
    prefetch(
        decisions
            .iter()
            .zip(texts)
            .map(|(d, t)| (d.env.as_ref(), d.seat, t)),
    )
    .unwrap();
    let scored: Vec<f64> = decisions
        .iter()
        .zip(texts)
        .map(|(d, t)| crate::envs::score_decision(d, t).scalar)
        .collect();
    assert_eq!(scored, [1.0, 2.0, 3.0]);
    assert_eq!(requests(dir.path()), 1);
    // the item carries the prompt, the row's fields and where the row is
    let log = std::fs::read_to_string(dir.path().join("requests.log")).unwrap();
    let req: serde_json::Value = serde_json::from_str(log.trim()).unwrap();
    let item = &req["batch"][0];
    assert_eq!(item["prompt"][0]["role"], "user");
    assert!(item["row"]["answer"].is_string(), "{item}");
    assert!(
        item["line"].as_u64().is_some_and(|l| (1..=3).contains(&l)),
        "{item}"
    );
    assert_eq!(item["held_out"], false);
}

#[test]
fn the_reward_option_names_its_mistakes() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("d.jsonl");
    std::fs::write(&data, ROWS).unwrap();
    let err = |extra: &str| {
        let o: Options =
            toml::from_str(&format!("path = {:?}\n{extra}", data.display().to_string())).unwrap();
        format!("{:#}", DatasetFactory::from_options(&o).unwrap_err())
    };
    let e = err("[reward]\ncommand = 'python3 reward.py'");
    assert!(
        e.contains("dataset option `reward`") && e.contains("`command`"),
        "{e}"
    );
    let e = err("verifier = 'exact'\n[reward]\ncommand = ['x']\nname = 'exact'");
    assert!(e.contains("a verifier is named `exact` too"), "{e}");
    let e = err("accuracy = 'len'\n[reward]\ncommand = ['x']");
    assert!(e.contains("known: program"), "{e}");
}

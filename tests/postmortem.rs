//! Post-mortem environment acceptance tests: scenarios and generator, every grader
//! component and cap, shaped step rewards, the parser (property tests), determinism,
//! the multi-agent reviewer, decision mode, the PagerDuty import and the CLI.
use crate::util::concord_ok;
use concord::envs::postmortem::episode::{Postmortem, MAX_STEPS};
use concord::envs::postmortem::grader::{self, Item};
use concord::envs::postmortem::scenario::{self, Scenario, LEVELS};
use concord::envs::postmortem::{import, parse_action, policies, Action, PostmortemFactory, Rules};
use concord::envs::{
    create, replay, sample_decision, score_decision, EnvFactory, Environment, Options,
};
use proptest::prelude::*;
use std::sync::Arc;

fn opts(kv: &[(&str, toml::Value)]) -> Options {
    let mut o = Options::new();
    for (k, v) in kv {
        o.insert(k.to_string(), v.clone());
    }
    o
}

fn factory(kv: &[(&str, toml::Value)]) -> PostmortemFactory {
    PostmortemFactory::new(&opts(kv)).expect("factory")
}

fn fixed(level: &str) -> Postmortem {
    factory(&[("level", level.into()), ("source", "fixed".into())]).episode(0)
}

fn sc(level: &str) -> Scenario {
    Scenario::embedded(level).unwrap()
}

fn sections(v: [&str; 5]) -> [Option<String>; 5] {
    v.map(|s| {
        if s.is_empty() {
            None
        } else {
            Some(s.to_string())
        }
    })
}

fn act(ep: &mut Postmortem, a: Action) -> (f64, bool, String) {
    ep.writer_action(&a)
}

fn q(service: &str, from: &str, to: &str) -> Action {
    Action::QueryLogs {
        service: service.into(),
        from: scenario::parse_hhmm(from).unwrap(),
        to: scenario::parse_hhmm(to).unwrap(),
    }
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

// ---------------------------------------------------------------------------------
// Scenarios and the generator.

#[test]
fn embedded_levels_validate_and_carry_their_traps() {
    for l in LEVELS {
        let s = sc(l);
        assert_eq!(s.level, l);
        s.validate().unwrap();
    }
    assert!(sc("easy").gold.false_causes.is_empty());
    assert_eq!(sc("hard").gold.false_causes.len(), 2);
    let e = sc("expert");
    assert_eq!(e.gold.false_causes.len(), 3);
    assert_eq!(e.limits.max_queries, 6);
    assert_eq!(e.limits.penalties, vec![0.05, 0.10, 0.15, 0.20]);
    assert_eq!(e.evidence[0].from, "02:14");
    assert_eq!(e.evidence[0].to, "02:17");
    assert_eq!(e.gold.hidden_timeline.len(), 4);
    assert!(e
        .gold
        .action_themes
        .iter()
        .any(|t| t.keywords.contains(&"gdpr".to_string())));
    // The senior engineer is wrong twice.
    assert_eq!(
        e.slack
            .iter()
            .filter(|m| m.author.starts_with("karen"))
            .count(),
        2
    );
}

#[test]
fn generator_varies_and_stays_valid_and_deterministic() {
    let base = sc("hard");
    let mut ids = std::collections::BTreeSet::new();
    let mut first_alerts = std::collections::BTreeSet::new();
    for seed in 0..40 {
        let g = scenario::generate(&base, seed);
        g.validate().unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        assert_eq!(g, scenario::generate(&base, seed));
        ids.insert(g.gold.root_cause.service.clone());
        first_alerts.insert(g.alerts[0].time.clone());
        assert!(g.alerts.len() > base.alerts.len(), "red herrings added");
        assert!(g.noise_logs.len() >= base.noise_logs.len() + 2);
        // The oracle still gets full marks on the variant.
        let f = factory(&[("level", "hard".into())]);
        let mut ep = Postmortem::new(f.rules.clone(), Arc::new(g), seed);
        policies::play_fast(&mut ep, policies::Policy::Oracle);
        assert!(ep.grade.as_ref().unwrap().total >= 0.999, "seed {seed}");
    }
    assert!(ids.len() >= 2, "services renamed: {ids:?}");
    assert!(first_alerts.len() >= 10, "times shifted: {first_alerts:?}");
}

// ---------------------------------------------------------------------------------
// Grader components and caps.

#[test]
fn root_cause_layers_and_false_cause_first() {
    let s = sc("hard");
    let (l1, l2, l3) = grader::root_cause_layers(&s, "inventory-worker did it");
    assert_eq!((l1, l2, l3), (0.40, 0.0, 0.0));
    let (_, l2, _) = grader::root_cause_layers(&s, "heavy lock contention somewhere");
    assert_eq!(l2, 0.35);
    let (_, _, l3) = grader::root_cause_layers(&s, "the reconciliation batch");
    assert!(close(l3, 0.25 * 2.0 / 4.0));
    let (l1, _, _) = grader::root_cause_layers(
        &s,
        "cdn-edge looked guilty, but inventory-worker held locks",
    );
    assert_eq!(l1, grader::RC_SERVICE_FALSE_FIRST);
    let (l1, _, _) = grader::root_cause_layers(
        &s,
        "inventory-worker held locks; cdn-edge was a red herring",
    );
    assert_eq!(l1, 0.40);
    // Whole names only: `inventory-worker2` is not the service.
    assert_eq!(grader::root_cause_layers(&s, "inventory-worker2").0, 0.0);
}

#[test]
fn root_cause_caps() {
    // Wrong service caps at 0.65.
    assert_eq!(grader::apply_caps(0.0, 0.9, 1.0), (0.65, "wrong_service"));
    assert_eq!(grader::apply_caps(0.0, 0.6, 1.0), (0.6, ""));
    // A timeline under 0.4 caps at 0.60.
    assert_eq!(grader::apply_caps(0.4, 1.0, 0.39), (0.60, "weak_timeline"));
    assert_eq!(grader::apply_caps(0.4, 1.0, 0.4), (1.0, ""));
    // Both: the lower cap wins.
    assert_eq!(grader::apply_caps(0.0, 0.9, 0.0), (0.60, "weak_timeline"));
    // Through grade(): a perfect root cause with no timeline is capped.
    let s = sc("easy");
    let rc = "orders-api connection leak: the refund path of v2.14.0 left a transaction open so the connection pool ran dry";
    let g = grader::grade(&s, &sections(["", "", rc, "", ""]), &[], None);
    assert_eq!(g.rc_service + g.rc_category + g.rc_keywords, 1.0);
    assert_eq!(g.root_cause, 0.60);
    assert_eq!(g.rc_cap, "weak_timeline");
}

#[test]
fn timeline_tolerance_keywords_and_hidden_events() {
    let s = sc("easy"); // 5 visible + 1 hidden events
    let t = |text: &str| grader::timeline_score(&s, text);
    assert!(
        close(t("08:43 deploy of v2.14.0"), 1.0 / 6.0),
        "3 minutes off counts"
    );
    assert_eq!(t("08:44 deploy of v2.14.0"), 0.0, "4 minutes off does not");
    assert_eq!(t("08:40 something happened"), 0.0, "a keyword is needed");
    assert!(
        close(t("08:55 connections not returned (leak)"), 1.0 / 6.0),
        "hidden events count"
    );
    // One line matches one event.
    assert!(close(
        t("09:13 alert 498 connections, latency timeout"),
        1.0 / 6.0
    ));
    let full: String = s
        .all_events()
        .map(|e| format!("{} {}\n", e.time, e.text))
        .collect();
    assert_eq!(t(&full), 1.0);
    // A line for every minute of the day with every keyword does not pay.
    let words: Vec<String> = s.all_events().flat_map(|e| e.keywords.clone()).collect();
    let spray: String = (0..1440)
        .map(|m| format!("{} {}\n", scenario::hhmm(m), words.join(" ")))
        .collect();
    assert!(t(&spray) < 0.02, "{}", t(&spray));
    // Up to 2 x events + 4 lines are free.
    let padded = format!("{full}00:01 a\n00:02 b\n00:03 c\n00:04 d\n00:05 e\n00:06 f\n00:07 g\n00:08 h\n00:09 i\n00:10 j");
    assert_eq!(t(&padded), 1.0);
}

#[test]
fn action_item_owner_due_and_themes() {
    let s = sc("easy"); // date 2026-03-03, within 30 days
    assert!(grader::owner_ok(&s, "SRE") && grader::owner_ok(&s, "@orders-team"));
    assert!(!grader::owner_ok(&s, "bob") && !grader::owner_ok(&s, ""));
    assert!(grader::due_ok(&s, "2026-03-04") && grader::due_ok(&s, "2026-04-02"));
    assert!(!grader::due_ok(&s, "2026-04-03"), "31 days");
    assert!(!grader::due_ok(&s, "2026-03-03") && !grader::due_ok(&s, "2026-02-30"));
    assert!(grader::due_ok(&s, "2 weeks") && grader::due_ok(&s, "30 days"));
    assert!(
        !grader::due_ok(&s, "5 weeks")
            && !grader::due_ok(&s, "0 days")
            && !grader::due_ok(&s, "soon")
    );
    let it = |d: &str, o: &str, due: &str| Item {
        description: d.into(),
        owner: o.into(),
        due: due.into(),
    };
    let items = [
        it("fix the refund leak", "orders-team", "2026-03-10"),
        it("add monitor on pool", "nobody", "2026-03-10"),
        it("something", "sre", "next year"),
        it("whatever", "sre", "2 weeks"),
    ];
    let (o, d, th) = grader::action_item_parts(&s, &items, "");
    assert!(
        close(o, 0.75) && close(d, 0.75) && close(th, 2.0 / 3.0),
        "{o} {d} {th}"
    );
    let (_, _, th) = grader::action_item_parts(&s, &[], "- run a canary");
    assert!(close(th, 1.0 / 3.0), "the section names themes too");
    let g = grader::grade(&s, &sections(["", "", "", "", ""]), &items, None);
    assert!(close(
        g.action_items,
        0.4 * 0.75 + 0.3 * 0.75 + 0.3 * 2.0 / 3.0
    ));
    assert_eq!(grader::action_item_parts(&s, &[], "").0, 0.0);
}

#[test]
fn impact_quarters() {
    let s = sc("easy"); // 29 minutes, services orders-api/web-frontend, scale 27%/checkout
    let i = |t: &str| grader::impact_score(&s, t);
    assert_eq!(i("nothing"), 0.0);
    assert_eq!(i("orders-api"), 0.25);
    assert_eq!(i("it lasted 30 minutes"), 0.25);
    assert_eq!(i("it lasted half an hour 0.5 hours"), 0.25);
    assert_eq!(i("it lasted 45 minutes"), 0.0, "outside max(5 min, 10%)");
    assert_eq!(i("27% of checkouts failed"), 0.25);
    let long = "word ".repeat(25);
    assert_eq!(i(&long), 0.25);
    assert_eq!(i(&format!("{long} orders-api 29 min 27%")), 1.0);
}

#[test]
fn completeness_and_section_validators() {
    let s = sc("easy");
    let v = |i: usize, t: &str| grader::validate_section(&s, i, t).is_ok();
    let twelve = "one two three four five six seven eight nine ten eleven twelve";
    assert!(v(0, twelve) && !v(0, "too short"));
    assert!(v(1, "09:12 a\n09:14 b") && !v(1, "09:12 only one line"));
    assert!(
        v(2, &format!("{twelve} orders-db")) && !v(2, twelve),
        "root_cause names a service"
    );
    assert!(
        v(3, &format!("{twelve} 5")) && !v(3, twelve),
        "impact quantifies"
    );
    assert!(v(4, "- add an alert") && !v(4, "- fix"));
    let g = grader::grade(
        &s,
        &sections([twelve, "09:12 a\n09:14 b", "", "", "short"]),
        &[],
        None,
    );
    assert!(close(g.completeness, 0.4));
}

#[test]
fn review_bonus_counts_addressed_critiques() {
    let s = sc("easy");
    let none = sections(["", "", "", "", ""]);
    assert_eq!(grader::grade(&s, &none, &[], None).review_bonus, 0.0);
    assert_eq!(
        grader::grade(&s, &none, &[], Some(&[])).review_bonus,
        grader::W_REVIEW
    );
    let raised = grader::failing_checks(&s, &none, &[]);
    assert_eq!(
        raised.len(),
        grader::CHECKS.len(),
        "an empty draft fails every check"
    );
    assert_eq!(
        grader::grade(&s, &none, &[], Some(&raised)).review_bonus,
        0.0
    );
    // Address only the impact duration.
    let fixed = sections(["", "", "", "lasted 29 minutes", ""]);
    let b = grader::grade(&s, &fixed, &[], Some(&raised)).review_bonus;
    assert!(close(b, 0.10 / 6.0), "{b}");
}

#[test]
fn weights_add_up() {
    let s = sc("easy");
    let mut ep = fixed("easy");
    policies::play_fast(&mut ep, policies::Policy::Oracle);
    let g = ep.grade.clone().unwrap();
    assert_eq!(g.total, 1.0);
    // Without the review the parts add to exactly 1.0 too.
    let g2 = grader::grade(&s, &ep.sections, &ep.items, None);
    assert!(close(g2.total, 0.30 + 0.25 + 0.20 + 0.15 + 0.10));
    // Only a perfect timeline: 0.25.
    let tl = ep.sections[1].clone();
    let mut only = sections(["", "", "", "", ""]);
    only[1] = tl;
    let g3 = grader::grade(&s, &only, &[], None);
    assert!(close(g3.total, 0.25 + 0.10 / 5.0), "{}", g3.total);
}

// ---------------------------------------------------------------------------------
// Step rewards.

#[test]
fn query_rewards_and_escalating_penalties() {
    let mut ep = fixed("easy");
    let (r, ok, _) = act(&mut ep, q("orders-api", "08:45", "09:05"));
    assert!(ok && close(r, 0.06));
    assert!(ep
        .last_logs
        .iter()
        .any(|l| l.message.contains("connection not returned to pool")));
    let (r, _, _) = act(&mut ep, q("orders-api", "08:40", "09:00"));
    assert_eq!(r, 0.0, "a found window pays once");
    // Overlap of 4 < 5 minutes is wrong.
    let mut pens = Vec::new();
    for (s, f, t) in [
        ("orders-api", "08:56", "09:20"),
        ("payments-api", "08:40", "09:00"),
        ("web-frontend", "09:00", "09:10"),
        ("orders-db", "10:00", "10:10"),
        ("orders-db", "10:20", "10:30"),
        ("orders-db", "10:40", "10:50"),
    ] {
        let (r, ok, fb) = act(&mut ep, q(s, f, t));
        assert!(ok && fb.is_empty());
        pens.push(-r);
    }
    assert_eq!(pens, vec![0.05, 0.08, 0.12, 0.18, 0.18, 0.18]);
    assert_eq!(ep.queries, 8);
    // Past the budget: refused, charged as wrong.
    let (r, ok, fb) = act(&mut ep, q("orders-api", "08:40", "09:00"));
    assert!(!ok && fb.contains("budget") && close(r, -0.18));
    // Refusals that cost nothing: unknown service, window over 30 minutes.
    let (r, ok, _) = act(&mut ep, q("nope", "08:40", "09:00"));
    assert!(!ok && r == 0.0);
    let (r, ok, _) = act(&mut ep, q("orders-api", "08:00", "08:31"));
    assert!(!ok && r == 0.0);

    let mut ex = fixed("expert");
    let mut pens = Vec::new();
    for i in 0..6 {
        let f = format!("0{}:00", i + 4);
        let t = format!("0{}:10", i + 4);
        pens.push(-act(&mut ex, q("waf", &f, &t)).0);
    }
    assert_eq!(pens, vec![0.05, 0.10, 0.15, 0.20, 0.20, 0.20]);
    // The 3-minute window needs all 3 minutes.
    let mut ex = fixed("expert");
    assert!(act(&mut ex, q("api-gateway", "02:15", "02:30")).0 < 0.0);
    assert!(close(
        act(&mut ex, q("api-gateway", "02:10", "02:20")).0,
        0.06
    ));
}

#[test]
fn section_item_review_and_submit_rewards() {
    let mut ep = fixed("easy");
    let twelve = "one two three four five six seven eight nine ten eleven twelve";
    let w = |s: usize, c: &str| Action::WriteSection {
        section: s,
        content: c.into(),
    };
    assert!(close(act(&mut ep, w(0, twelve)).0, 0.03));
    assert!(
        close(act(&mut ep, w(0, twelve)).0, -0.02),
        "overwriting a valid section"
    );
    assert_eq!(
        act(&mut ep, w(3, "short")).0,
        0.0,
        "invalid content earns nothing"
    );
    let (r, ok, _) = act(
        &mut ep,
        Action::ReviseSection {
            section: 4,
            content: "x y z".into(),
        },
    );
    assert!(!ok && r == 0.0, "revising an unwritten section is refused");
    let item = |o: &str| Action::AssignActionItem {
        description: "fix the refund leak".into(),
        owner: o.into(),
        due: "2026-03-10".into(),
    };
    assert!(close(act(&mut ep, item("sre")).0, 0.08));
    assert_eq!(act(&mut ep, item("bob")).0, 0.0);
    assert_eq!(act(&mut ep, Action::RequestReview).0, 0.0);
    assert!(ep.last_result.starts_with("Review:"));
    assert_eq!(
        act(
            &mut ep,
            Action::ReviseSection {
                section: 0,
                content: twelve.into()
            }
        )
        .0,
        0.0,
        "no overwrite penalty after a review"
    );
    let before = ep.shaping;
    let (r, _, _) = act(&mut ep, Action::Submit);
    assert!(ep.done);
    let g = ep.grade.clone().unwrap().total;
    assert!(close(r, -0.40 + g), "4 invalid sections at submit: {r}");
    assert!(close(ep.shaping, before - 0.40));
    let rw = ep.reward(0);
    assert_eq!(rw.scalar, g);
    assert!(close(rw.components["return"], g + ep.shaping));
}

#[test]
fn step_rewards_sum_to_grade_plus_shaping_and_the_limit_submits() {
    let f = factory(&[]);
    for seed in 0..30 {
        let mut env = f.reset(seed);
        let mut sum = 0.0;
        let mut steps = 0;
        while !env.done() {
            let t = env.policy_action("random", 0).unwrap();
            sum += env.step(&[t]).unwrap().rewards[0];
            steps += 1;
        }
        let r = env.reward(0);
        assert!(
            close(sum, r.components["grade"] + r.components["shaping"]),
            "seed {seed}"
        );
        assert!(steps <= MAX_STEPS as usize);
    }
    // Never submitting: the 25th step submits with the missing-section penalty.
    let mut ep = fixed("easy");
    for _ in 0..MAX_STEPS {
        assert!(!ep.done);
        ep.writer_text("not json");
    }
    assert!(ep.done && ep.step == MAX_STEPS);
    assert!(close(ep.shaping, -0.50));
    // shaping = false: step rewards are the grade only.
    let mut ep = factory(&[("shaping", false.into()), ("source", "fixed".into())]).episode(1);
    let (r, _, _) = act(&mut ep, q("nope-ish", "00:00", "00:10"));
    assert_eq!(r, 0.0);
    // reward = "return": the scalar adds the shaping.
    let f = factory(&[("reward", "return".into())]);
    let mut env = f.reset(2);
    while !env.done() {
        let t = env.policy_action("query_everything", 0).unwrap();
        env.step(&[t]).unwrap();
    }
    let r = env.reward(0);
    assert!(close(
        r.scalar,
        r.components["grade"] + r.components["shaping"]
    ));
}

// ---------------------------------------------------------------------------------
// Baselines.

fn row(f: &dyn EnvFactory, policy: &str, level: &str, n: usize) -> concord::envs::BaselineRow {
    f.baseline(policy, level, n, 0).unwrap()
}

#[test]
fn oracle_random_and_query_everything_baselines() {
    for source in ["fixed", "generated"] {
        let f = create("postmortem", &opts(&[("source", source.into())])).unwrap();
        for l in LEVELS {
            let o = row(f.as_ref(), "oracle", l, 40);
            assert!(
                o.mean_reward >= 0.95,
                "oracle {source} {l}: {}",
                o.mean_reward
            );
            assert_eq!(o.level.as_deref(), Some(l));
            let r = row(f.as_ref(), "random", l, 200);
            assert!(
                r.mean_reward < 0.3,
                "random {source} {l}: {}",
                r.mean_reward
            );
            let q = row(f.as_ref(), "query_everything", l, 40);
            assert!(q.extra["shaping"] < -1.0, "{source} {l}: {:?}", q.extra);
            assert!(q.extra["wrong_queries"] > q.extra["correct_queries"]);
            assert!(q.extra["return"] < o.extra["return"] - 1.0);
        }
    }
    // Scored on the return, query_everything loses to the oracle everywhere.
    let f = create("postmortem", &opts(&[("reward", "return".into())])).unwrap();
    for l in LEVELS {
        assert!(
            row(f.as_ref(), "query_everything", l, 20).mean_reward
                < row(f.as_ref(), "oracle", l, 20).mean_reward - 1.0
        );
    }
}

// ---------------------------------------------------------------------------------
// Parser.

#[test]
fn parser_accepts_the_documented_forms() {
    let a = parse_action(
        r#"{"action":"QUERY_LOGS","service":"orders-api","from":"08:40","to":"09:00"}"#,
    )
    .unwrap();
    assert_eq!(a, q("orders-api", "08:40", "09:00"));
    let long = r#"Sure! ```json
{"action_type": "query_logs", "query_service": "orders-api", "query_from": "2026-03-03T08:40:00Z", "query_to": "09:00"}
```"#;
    assert_eq!(
        parse_action(long).unwrap(),
        q("orders-api", "08:40", "09:00")
    );
    let w = parse_action(
        r#"{"ACTION":"write_section","section_name":"Root Cause","section_content":"x"}"#,
    )
    .unwrap();
    assert_eq!(
        w,
        Action::WriteSection {
            section: 2,
            content: "x".into()
        }
    );
    assert_eq!(
        parse_action(r#"{"action":"SUBMIT"}"#).unwrap(),
        Action::Submit
    );
    for bad in [
        "",
        "SUBMIT",
        r#"{"action":"DANCE"}"#,
        r#"{"action":"QUERY_LOGS","service":"a","from":"09:00","to":"08:00"}"#,
        r#"{"action":"QUERY_LOGS","service":"a","from":"25:00","to":"26:00"}"#,
        r#"{"action":"WRITE_SECTION","section":"epilogue","content":"x"}"#,
        r#"{"action":"WRITE_SECTION","section":"summary","content":"   "}"#,
        r#"{"action":"ASSIGN_ACTION_ITEM","owner":"sre"}"#,
    ] {
        assert!(parse_action(bad).is_err(), "{bad}");
    }
    // Invalid text is a no-op that uses a step and says why.
    let mut ep = fixed("easy");
    let (r, ok, fb) = ep.writer_text("please submit");
    assert!(!ok && r == 0.0 && fb.contains("no JSON object") && ep.step == 1 && !ep.done);
}

/// The keys of a JSON object's text, in the order written (serde_json's `Value` sorts them).
fn keys_in_order(text: &str) -> Vec<String> {
    let (mut keys, mut cur, mut in_str, mut esc) = (Vec::new(), String::new(), false, false);
    let mut last: Option<String> = None;
    for c in text.chars() {
        if in_str {
            match (esc, c) {
                (false, '\\') => esc = true,
                (false, '"') => {
                    in_str = false;
                    last = Some(std::mem::take(&mut cur));
                }
                _ => {
                    esc = false;
                    cur.push(c);
                }
            }
        } else if c == '"' {
            in_str = true;
        } else if c == ':' {
            keys.extend(last.take());
        } else if !c.is_whitespace() {
            last = None;
        }
    }
    keys
}

#[test]
fn scripted_actions_are_written_as_the_system_prompt_shows_them() {
    use concord::envs::postmortem::{action_json, render::WRITER_SYSTEM};
    let examples: Vec<&str> = WRITER_SYSTEM
        .lines()
        .filter(|l| l.starts_with("{\"action\""))
        .collect();
    assert_eq!(examples.len(), 6, "{WRITER_SYSTEM}");
    for ex in examples {
        let a = parse_action(ex).unwrap();
        let ours = action_json(&a);
        assert_eq!(keys_in_order(&ours), keys_in_order(ex), "{ours} vs {ex}");
        assert_eq!(parse_action(&ours), Ok(a));
    }
    assert_eq!(
        action_json(&Action::WriteSection {
            section: 1,
            content: "09:12 \"a\": b".into()
        }),
        r#"{"action":"WRITE_SECTION","section":"timeline","content":"09:12 \"a\": b"}"#
    );
}

/// The writer's STATUS sections as (name, state), in the order the prompt lists them.
fn status_sections(prompt: &str) -> Vec<(String, String)> {
    let line = prompt
        .lines()
        .skip_while(|l| !l.starts_with("STATUS "))
        .nth(1)
        .expect("a STATUS line and the sections under it");
    line.split("  ")
        .filter(|p| !p.trim().is_empty())
        .map(|p| {
            let (n, st) = p.split_once(": ").expect("name: state");
            (n.trim().to_string(), st.trim().to_string())
        })
        .collect()
}

#[test]
fn reasoned_answers_copy_the_sections_left_then_act_as_before() {
    use concord::envs::postmortem::render::{writer_system, WRITER_SYSTEM};
    use concord::envs::postmortem::scenario::SECTIONS;
    use concord::envs::postmortem::{Policy, Prompt};
    assert_eq!(writer_system(Prompt::Full), WRITER_SYSTEM);
    let sys = writer_system(Prompt::Reasoned);
    let plain: Vec<&str> = WRITER_SYSTEM
        .lines()
        .filter(|l| l.starts_with("{\"action\""))
        .collect();
    let reasoned: Vec<&str> = sys.lines().filter(|l| l.starts_with("{\"todo\"")).collect();
    assert_eq!(plain.len(), reasoned.len(), "{sys}");
    for (p, r) in plain.iter().zip(&reasoned) {
        assert_eq!(parse_action(p), parse_action(r), "{r}");
    }
    let mut writes = 0;
    for level in LEVELS {
        let fa = factory(&[("level", (*level).into())]);
        let fb = factory(&[("level", (*level).into()), ("prompt", "reasoned".into())]);
        for seed in 0..3u64 {
            let (mut a, mut b) = (fa.episode(seed), fb.episode(seed));
            let plain_status = status_sections(&a.user_prompt(0));
            assert_eq!(
                plain_status[0].0, "summary",
                "the plain prompt is unchanged"
            );
            while !a.done {
                let status = status_sections(&b.user_prompt(0));
                let left: Vec<&str> = status
                    .iter()
                    .filter(|(_, st)| st != "valid")
                    .map(|(n, _)| n.as_str())
                    .collect();
                let ta = policies::policy_text(&mut a, Policy::EvidenceBound, 0);
                let tb = policies::policy_text(&mut b, Policy::EvidenceBound, 0);
                let want = if left.is_empty() {
                    "none".to_string()
                } else {
                    left.join(", ")
                };
                assert!(tb.starts_with(&format!("{{\"todo\":\"{want}\",")), "{tb}");
                let act = parse_action(&tb);
                assert_eq!(parse_action(&ta), act);
                if let Ok(Action::WriteSection { section, .. }) = act {
                    assert_eq!(SECTIONS[section], left[0], "{tb}");
                    writes += 1;
                }
                a.writer_text(&ta);
                b.writer_text(&tb);
            }
            assert!(b.done && close(a.current_grade().total, b.current_grade().total));
        }
    }
    assert!(writes >= 5 * LEVELS.len() * 3, "{writes}");
}

/// The STATUS line's review count.
fn status_reviews(prompt: &str) -> usize {
    let line = prompt
        .lines()
        .find(|l| l.starts_with("STATUS "))
        .expect("STATUS");
    let (_, n) = line.rsplit_once("| reviews ").expect("reviews");
    n.trim().parse().expect("a count")
}

/// The checklist status's action-item line: (assigned, listed, next item).
fn status_items(prompt: &str) -> (usize, usize, Option<String>) {
    let line = prompt
        .lines()
        .find(|l| l.starts_with("action items: "))
        .expect("an action items line");
    let (counts, next) = match line.split_once(" | next item: ") {
        Some((c, n)) => (c, Some(n.to_string())),
        None => (line, None),
    };
    let words: Vec<&str> = counts.split_whitespace().collect();
    // "action items: K assigned of N listed in action_items"
    (words[2].parse().unwrap(), words[5].parse().unwrap(), next)
}

#[test]
fn checklist_answers_go_on_past_the_sections_and_stop_where_the_teacher_does() {
    use concord::envs::postmortem::render::writer_system;
    use concord::envs::postmortem::scenario::SECTIONS;
    use concord::envs::postmortem::{Policy, Prompt};
    let sys = writer_system(Prompt::Checklist);
    let examples: Vec<&str> = sys.lines().filter(|l| l.starts_with("{\"todo\"")).collect();
    assert_eq!(examples.len(), 6, "{sys}");
    for e in &examples {
        assert!(parse_action(e).is_ok(), "{e}");
    }
    assert!(sys.contains("\"item 1 of 3, review\", \"action\": \"ASSIGN_ACTION_ITEM\""));
    let (mut items, mut reviews, mut submits) = (0, 0, 0);
    for level in LEVELS {
        let fa = factory(&[("level", (*level).into())]);
        let fb = factory(&[("level", (*level).into()), ("prompt", "checklist".into())]);
        for seed in 0..3u64 {
            let (mut a, mut b) = (fa.episode(seed), fb.episode(seed));
            while !a.done {
                let prompt = b.user_prompt(0);
                let sections: Vec<String> = status_sections(&prompt)
                    .into_iter()
                    .filter(|(_, st)| st != "valid")
                    .map(|(n, _)| n)
                    .collect();
                let (assigned, listed, next) = status_items(&prompt);
                let ta = policies::policy_text(&mut a, Policy::EvidenceBound, 0);
                let tb = policies::policy_text(&mut b, Policy::EvidenceBound, 0);
                // The todo is read off the status alone.
                let mut want = sections.clone();
                if assigned < listed {
                    want.push(format!("item {} of {listed}", assigned + 1));
                    assert!(next.is_some(), "{prompt}");
                }
                if status_reviews(&prompt) == 0 {
                    want.push("review".into());
                }
                let want = if want.is_empty() {
                    "none".to_string()
                } else {
                    want.join(", ")
                };
                assert!(
                    tb.starts_with(&format!("{{\"todo\":\"{want}\",")),
                    "{tb}\n{prompt}"
                );
                let act = parse_action(&tb);
                assert_eq!(
                    parse_action(&ta),
                    act,
                    "the teacher acts as without the todo"
                );
                // ... and its action is the first entry.
                match act {
                    Ok(Action::WriteSection { ref section, .. }) => {
                        assert_eq!(SECTIONS[*section], want.split(", ").next().unwrap())
                    }
                    Ok(Action::AssignActionItem {
                        ref description, ..
                    }) => {
                        assert!(want.starts_with("item "), "{want}");
                        assert_eq!(next.as_deref(), Some(description.as_str()));
                        items += 1;
                    }
                    Ok(Action::RequestReview) => {
                        assert_eq!(want, "review");
                        reviews += 1;
                    }
                    Ok(Action::Submit) => {
                        assert_eq!(want, "none");
                        submits += 1;
                    }
                    _ => {}
                }
                a.writer_text(&ta);
                b.writer_text(&tb);
            }
            assert!(b.done && close(a.current_grade().total, b.current_grade().total));
        }
    }
    let episodes = LEVELS.len() * 3;
    assert!(items >= 2 * episodes, "{items}");
    assert_eq!((reviews, submits), (episodes, episodes));
}

fn weird_text() -> impl Strategy<Value = String> {
    let actions = [
        "QUERY_LOGS",
        "WRITE_SECTION",
        "REVISE_SECTION",
        "ASSIGN_ACTION_ITEM",
        "REQUEST_REVIEW",
        "SUBMIT",
        "query logs",
    ];
    prop_oneof![
        any::<String>(),
        ".{0,200}",
        (0usize..7, any::<String>(), any::<String>()).prop_map(move |(i, a, b)| format!(
            r#"{{"action":"{}","service":"{a}","from":"{b}","to":"23:59","section":"{a}","content":"{b}","owner":"{a}","due":"{b}"}}"#,
            actions[i]
        )),
        (0usize..7, 0u32..1500, 0u32..1500).prop_map(move |(i, f, t)| format!(
            r#"{{"action":"{}","service":"orders-api","from":"{:02}:{:02}","to":"{:02}:{:02}","section":"timeline","content":"{:02}:{:02} x\n09:00 y"}}"#,
            actions[i], f / 60, f % 60, t / 60, t % 60, f / 60 % 24, f % 60
        )),
        (any::<String>(), 0usize..5000).prop_map(|(s, n)| format!("{}{s}{}", "{".repeat(n % 70), "}".repeat(n % 13))),
        Just(r#"{"action": ["SUBMIT"]}"#.to_string()),
        Just(r#"{"action": "QUERY_LOGS", "service": 7, "from": 1e99, "to": null}"#.to_string()),
        Just(r#"{"critiques": ["evidence", 5, "nope"]}"#.to_string()),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, .. ProptestConfig::default() })]

    #[test]
    fn parser_never_panics_and_round_trips(text in weird_text()) {
        if let Ok(a) = parse_action(&text) {
            prop_assert_eq!(parse_action(&concord::envs::postmortem::action_json(&a)), Ok(a));
        }
        let _ = concord::envs::postmortem::parse::parse_critiques(&text);
    }

    #[test]
    fn stepping_any_text_never_panics(seed in any::<u64>(), multi in any::<bool>(),
                                      texts in proptest::collection::vec(weird_text(), 30)) {
        let reviewer = if multi { "policy" } else { "scripted" };
        let f = create("postmortem", &opts(&[("reviewer", reviewer.into())])).unwrap();
        let mut env = f.reset(seed);
        let mut k = 0;
        while !env.done() {
            let acting = env.to_act();
            prop_assert_eq!(acting.len(), 1);
            let batch = vec![texts[k % texts.len()].clone()];
            k += 1;
            let out = env.step(&batch).unwrap();
            prop_assert_eq!(&out.seats, &acting);
            prop_assert_eq!(out.valid[0], out.feedback[0].is_empty());
            let _ = env.observation(acting[0]);
            prop_assert!(k <= 2 * MAX_STEPS as usize + 2);
        }
        let r = env.reward(0);
        prop_assert!((0.0..=1.0).contains(&r.scalar));
        prop_assert!(env.step(&[]).unwrap().seats.is_empty());
    }
}

// ---------------------------------------------------------------------------------
// Determinism, replay, multi-agent, decision mode.

#[test]
fn same_seed_same_episode_and_replay() {
    let f = create("postmortem", &opts(&[("source", "mixed".into())])).unwrap();
    for seed in 0..20 {
        let play = || {
            let mut env = f.reset(seed);
            while !env.done() {
                let t = env.policy_action("random", 0).unwrap();
                env.step(&[t]).unwrap();
            }
            env
        };
        let (a, b) = (play(), play());
        assert_eq!(a.transcript(), b.transcript());
        assert_eq!(a.reward(0), b.reward(0));
        assert_eq!(a.observation(0), b.observation(0));
        let r = replay(f.as_ref(), &a.transcript()).unwrap();
        assert_eq!(r.reward(0), a.reward(0));
    }
    // Different seeds give different scenarios.
    let ids: std::collections::BTreeSet<String> = (0..20)
        .map(|s| {
            f.reset(s).transcript()["scenario"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert!(ids.len() > 4);
}

#[test]
fn policy_reviewer_takes_a_turn_and_is_scored_by_f1() {
    let f = create(
        "postmortem",
        &opts(&[
            ("reviewer", "policy".into()),
            ("source", "fixed".into()),
            ("level", "easy".into()),
        ]),
    )
    .unwrap();
    let mut env = f.reset(0);
    assert_eq!(env.policy_seats(), vec![0, 1]);
    env.step(&[r#"{"action":"REQUEST_REVIEW"}"#.to_string()])
        .unwrap();
    assert_eq!(env.to_act(), vec![1]);
    assert!(env.observation(1)[1].content.contains("CRITIQUES"));
    // Raise half of the six failing checks.
    let out = env
        .step(&[r#"{"critiques":["evidence","timeline","themes","bogus"]}"#.to_string()])
        .unwrap();
    assert_eq!(out.seats, vec![1]);
    assert!(!out.valid[0] && out.feedback[0].contains("bogus"));
    assert_eq!(env.to_act(), vec![0]);
    assert!(env.observation(0)[1].content.contains("[evidence]"));
    env.step(&[r#"{"action":"SUBMIT"}"#.to_string()]).unwrap();
    let r = env.reward(1);
    assert!(close(r.components["review_f1"], 2.0 * 3.0 / 9.0), "{r:?}");
    assert!(close(
        r.scalar,
        0.5 * r.components["review_f1"] + 0.5 * env.reward(0).scalar
    ));
}

#[test]
fn decisions_score_through_the_continuation() {
    let f = create("postmortem", &opts(&[("level", "hard".into())])).unwrap();
    for seed in 0..10 {
        let d = sample_decision(f.as_ref(), seed);
        assert_eq!(d.seat, 0);
        let bad = score_decision(&d, r#"{"action":"SUBMIT"}"#);
        let cont = {
            let mut e = d.env.clone_box();
            e.continuation_action(0)
        };
        let base = score_decision(&d, &cont);
        assert!(bad.scalar <= base.scalar + 1e-9, "seed {seed}");
        assert!((0.0..=1.0).contains(&base.scalar));
    }
    // Finding the evidence lets the continuation name the true cause.
    let ep = factory(&[("level", "hard".into()), ("source", "fixed".into())]).episode(0);
    let env: Box<dyn Environment> = Box::new(ep);
    let d = concord::envs::Decision {
        messages: env.observation(0),
        env,
        seat: 0,
        seed: 0,
        step: 0,
    };
    let found = score_decision(
        &d,
        r#"{"action":"QUERY_LOGS","service":"inventory-worker","from":"21:58","to":"22:08"}"#,
    );
    let wrong = score_decision(
        &d,
        r#"{"action":"QUERY_LOGS","service":"cdn-edge","from":"22:05","to":"22:20"}"#,
    );
    assert!(
        found.scalar > wrong.scalar + 0.2,
        "{} vs {}",
        found.scalar,
        wrong.scalar
    );
    // Later too: after the continuation wrote the sections without evidence, finding
    // it still pays (the continuation revises the root cause and the timeline).
    let mut ep = factory(&[("level", "hard".into()), ("source", "fixed".into())]).episode(0);
    for _ in 0..6 {
        let a = policies::writer_move(&mut ep, policies::Policy::EvidenceBound);
        ep.writer_action(&a);
    }
    assert!(ep.section_valid(2));
    let env: Box<dyn Environment> = Box::new(ep);
    let d = concord::envs::Decision {
        messages: env.observation(0),
        env,
        seat: 0,
        seed: 0,
        step: 6,
    };
    let found = score_decision(
        &d,
        r#"{"action":"QUERY_LOGS","service":"inventory-worker","from":"21:58","to":"22:08"}"#,
    );
    let idle = score_decision(&d, r#"{"action":"REQUEST_REVIEW"}"#);
    assert!(
        found.scalar > idle.scalar + 0.2,
        "{} vs {}",
        found.scalar,
        idle.scalar
    );
}

#[test]
fn options_validate() {
    for (k, v) in [
        ("bogus", toml::Value::from(1)),
        ("level", "legendary".into()),
        ("source", "random".into()),
        ("reviewer", "me".into()),
        ("reward", "money".into()),
        ("continuation", "psychic".into()),
        ("win_threshold", 2.into()),
        ("prompt", "poetic".into()),
    ] {
        let e = Rules::from_options(&opts(&[(k, v)]))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(k) || e.contains("legendary") || e.contains("psychic"),
            "{e}"
        );
    }
    let e = PostmortemFactory::new(&opts(&[(
        "files",
        toml::Value::Array(vec!["/nonexistent.json".into()]),
    )]))
    .err()
    .unwrap()
    .to_string();
    assert!(e.contains("/nonexistent.json"), "{e}");
}

// ---------------------------------------------------------------------------------
// Import and the CLI.

fn fixture() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/pagerduty_incident.json")
}

#[test]
fn pagerduty_import_of_the_fixture() {
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture()).unwrap()).unwrap();
    let s = import::from_pagerduty(&v).unwrap();
    assert_eq!(s.id, "pd-48213");
    assert_eq!(s.level, "imported");
    assert_eq!(s.date, "2026-02-11");
    assert_eq!(s.gold.root_cause.service, "card-vault");
    assert_eq!(s.gold.impact.duration_minutes, 47);
    assert_eq!(s.alerts.len(), 3);
    assert_eq!(s.gold.timeline.len(), 4);
    assert_eq!(s.gold.action_themes.len(), 2);
    assert!(s.gold.teams.contains(&"payments-team".to_string()));
    assert!(s.slack.iter().any(|m| m.text.starts_with("Root cause:")));
    assert!(import::from_pagerduty(&serde_json::json!({"nope": 1})).is_err());

    // Through the CLI, then played from disk with the `files` option.
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("pd.json");
    let msg = concord_ok(&[
        "envs",
        "import",
        "postmortem",
        "--from",
        "pagerduty",
        fixture().to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(msg.contains("pd-48213"), "{msg}");
    let f = create(
        "postmortem",
        &opts(&[(
            "files",
            toml::Value::Array(vec![out.to_str().unwrap().into()]),
        )]),
    )
    .unwrap();
    assert_eq!(f.pools(), vec!["imported"]);
    let o = f.baseline("oracle", "imported", 10, 0).unwrap();
    assert!(o.mean_reward >= 0.95, "{}", o.mean_reward);
    assert!(f.baseline("random", "imported", 50, 0).unwrap().mean_reward < 0.3);
}

#[test]
fn cli_describe_play_baseline_bench() {
    let out = concord_ok(&["envs", "describe", "postmortem"]);
    assert!(
        out.contains("QUERY_LOGS")
            && out.contains("REVISE_SECTION")
            && out.contains("0.30 root cause")
    );
    assert!(concord_ok(&["envs", "list"])
        .lines()
        .any(|l| l.starts_with("postmortem") && !l.contains("not built")));
    for policy in ["oracle", "random", "query_everything"] {
        let out = concord_ok(&[
            "envs",
            "play",
            "postmortem",
            "--seed",
            "5",
            "--policy",
            policy,
        ]);
        assert!(out.contains("== rewards =="), "{out}");
    }
    let out = concord_ok(&["envs", "play", "postmortem", "--seed", "5"]);
    assert!(out.contains("seat 0: scalar"));
    let out = concord_ok(&[
        "envs",
        "baseline",
        "postmortem",
        "--json",
        "--episodes",
        "5",
    ]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 16);
    for r in rows {
        assert!(
            r["policy"].is_string() && r["level"].is_string() && r["mean_reward"].is_f64(),
            "{r}"
        );
        assert_eq!(r["episodes"], 5);
    }
    let out = concord_ok(&["envs", "bench", "postmortem", "--json", "--secs", "0.05"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(v["episodes_per_s"].as_f64().unwrap() > 0.0, "{v}");
}

/// `concord train --config configs/postmortem-smoke.toml` end to end (decision mode,
/// tiny model), with the output in a temp dir.
#[test]
fn smoke_config_trains() {
    let dir = tempfile::tempdir().unwrap();
    let cfg =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("configs/postmortem-smoke.toml");
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
    let log =
        std::fs::read_to_string(dir.path().join("postmortem-smoke/training_log.csv")).unwrap();
    let mut lines = log.lines();
    let header = lines.next().unwrap();
    assert!(
        header.contains("rewards/grade") && header.contains("rewards/timeline"),
        "{header}"
    );
    assert_eq!(lines.count(), 2);
}

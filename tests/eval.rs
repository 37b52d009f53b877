//! `concord eval` end to end on the built-in tiny model: a short warm-started training
//! run (the quickstart's SFT, then GRPO), then its start vs its adapter on held-out
//! seeds (`--compare --json`), the report's schema and invariants, determinism, and the
//! before/after plot drawn from its eval.json.
use crate::util::concord_ok;
use concord::eval::EvalReport;
use std::path::Path;

#[test]
fn eval_compare_reports_held_out_episodes() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display().to_string();
    let sets = [
        format!("run.output_dir={d}"),
        format!("model.name={d}/tiny"),
        "run.steps=2".to_string(),
        "run.save_every=0".to_string(),
        "grpo.max_completion_length=6".to_string(),
        "grpo.prompts_per_step=2".to_string(),
        "grpo.num_generations=2".to_string(),
        "sft.steps=2".to_string(),
        "sft.examples=4".to_string(),
        "sft.batch_size=2".to_string(),
    ];
    let mut train = vec!["train", "--config", "configs/quickstart.toml"];
    for s in &sets {
        train.extend(["--set", s.as_str()]);
    }
    concord_ok(&train);
    let run = dir.path().join("quickstart");
    assert!(run.join("reward_curve.png").exists());

    let mut eval = vec![
        "eval",
        "--config",
        "configs/quickstart.toml",
        "--compare",
        "--episodes",
        "5",
        "--json",
        "--batch",
        "3",
    ];
    for s in &sets {
        eval.extend(["--set", s.as_str()]);
    }
    let out = concord_ok(&eval);
    let report: EvalReport = serde_json::from_str(&out).unwrap();
    // Also written beside the adapter, where `plot` and `export` look for it.
    let written = EvalReport::read(&run.join("eval.json")).unwrap();
    assert_eq!(report, written);
    assert_eq!(report.episodes, 5);
    assert_eq!(report.first_seed, concord::envs::eval_seed(0));
    assert_ne!(report.first_seed & concord::envs::HELD_OUT_BIT, 0);
    let keys: Vec<&str> = report.models.keys().map(String::as_str).collect();
    assert_eq!(keys, ["adapter", "base"]);
    // The run started from its warm start: that is what it is compared with.
    assert_eq!(
        Path::new(report.models["base"].adapter.as_deref().unwrap()),
        run.join("sft")
    );
    let saved = std::fs::read_to_string(run.join("config.toml")).unwrap();
    assert!(saved.contains("adapter = "), "{saved}");
    assert_eq!(
        Path::new(report.models["adapter"].adapter.as_deref().unwrap()),
        run
    );
    for m in report.models.values() {
        let e = &m.envs["ticketmelt"];
        assert_eq!((e.episodes, e.seats), (5, 5));
        assert!((0.0..=1.0).contains(&e.win_rate));
        assert!(e.win_ci95[0] <= e.win_rate && e.win_rate <= e.win_ci95[1]);
        assert!(e.reward_ci95[0] <= e.reward_mean && e.reward_mean <= e.reward_ci95[1]);
        for k in ["r1_own", "r2_team", "r3_safety", "r4_yield", "win"] {
            assert!(
                e.components.contains_key(k),
                "{k} missing: {:?}",
                e.components
            );
        }
        assert_eq!(e.components["win"], e.win_rate);
    }

    // Deterministic, and independent of batching: the start adapter alone with another
    // batch size gives the compare run's start numbers exactly.
    let start = run.join("sft").display().to_string();
    let mut base = vec![
        "eval",
        "--config",
        "configs/quickstart.toml",
        "--adapter",
        start.as_str(),
        "--episodes",
        "5",
        "--json",
        "--batch",
        "5",
    ];
    for s in &sets {
        base.extend(["--set", s.as_str()]);
    }
    let alone: EvalReport = serde_json::from_str(&concord_ok(&base)).unwrap();
    assert_eq!(alone.models["adapter"], report.models["base"]);

    // `--against`: the earlier report's models are reported beside the new one without
    // being played again (a doctored number in the file comes back as it is), and a
    // report of other episodes is refused.
    let mut earlier = alone.clone();
    let renamed = earlier.models.remove("adapter").unwrap();
    earlier.models.insert("base".into(), renamed);
    earlier
        .models
        .get_mut("base")
        .unwrap()
        .envs
        .values_mut()
        .for_each(|e| e.win_rate = 0.123_456);
    let earlier_path = dir.path().join("earlier.json");
    earlier.write(&earlier_path).unwrap();
    let mut against = base.clone();
    against.extend(["--against", earlier_path.to_str().unwrap()]);
    let both: EvalReport = serde_json::from_str(&concord_ok(&against)).unwrap();
    assert_eq!(both.models["base"], earlier.models["base"]);
    assert_eq!(both.models["adapter"], alone.models["adapter"]);
    // An earlier `adapter` of another directory is another model: this one is played
    // anyway, and the earlier one is kept beside it under its directory.
    let mut elsewhere = earlier.clone();
    let mut moved = alone.models["adapter"].clone();
    moved.adapter = Some("some/other/run".into());
    moved.envs.values_mut().for_each(|e| e.win_rate = 0.654_321);
    elsewhere.models.insert("adapter".into(), moved.clone());
    let elsewhere_path = dir.path().join("elsewhere.json");
    elsewhere.write(&elsewhere_path).unwrap();
    let mut again = base.clone();
    again.extend(["--against", elsewhere_path.to_str().unwrap()]);
    let three: EvalReport = serde_json::from_str(&concord_ok(&again)).unwrap();
    assert_eq!(three.models["adapter"], alone.models["adapter"]);
    assert_eq!(three.models["adapter (some/other/run)"], moved);
    assert_eq!(three.models["base"], earlier.models["base"]);
    assert_eq!(three.models.len(), 3);

    // The stderr of a refused `eval`.
    let refused = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_concord"))
            .args(args)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let mut other = against.clone();
    let at = other.iter().position(|a| *a == "5").unwrap();
    other[at] = "4";
    let err = refused(&other);
    assert!(err.contains("not the same evaluation"), "{err}");
    // Issue 54, item 12: a report of another game (other environment options) or of
    // other sampling is refused, and the difference is printed key by key.
    let classic = concord::envs::ticketmelt::Rules::classic();
    assert_eq!(
        alone.env_options["ticketmelt"]["rounds"],
        serde_json::json!(classic.rounds),
        "the options are recorded with their defaults"
    );
    for (set, want) in [
        (
            format!("env.options.rounds={}", classic.rounds + 1),
            "not the same game: ticketmelt".to_string(),
        ),
        (
            "env.options.peers=\"mixed\"".into(),
            "peers: mixed, dumb".into(),
        ),
        (
            "grpo.temperature=0.5".into(),
            "temperature: 0.5, 0.7".into(),
        ),
    ] {
        let mut other = against.clone();
        other.extend(["--set", set.as_str()]);
        let err = refused(&other);
        assert!(err.contains(&want), "{set}: {err}");
        assert!(
            !err.contains("SamplingParams") && !err.contains('{'),
            "{err}"
        );
    }

    // The human table prints the start before the adapter, with a delta column.
    let table = concord::eval::table(&report);
    let header = table.lines().find(|l| l.starts_with("| metric")).unwrap();
    assert_eq!(
        header,
        format!("| metric | start ({start}) | adapter | delta |")
    );

    concord_ok(&["plot", &run.display().to_string()]);
    let png = std::fs::read(run.join("before_after.png")).unwrap();
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n") && png.len() > 1000);

    // A published adapter without its run (the warm start gone): `--compare` compares
    // it with the base model, and says so, rather than failing on the missing start.
    let published = dir.path().join("published");
    std::fs::create_dir(&published).unwrap();
    for f in ["adapter_model.safetensors", "adapter_config.json"] {
        std::fs::copy(run.join(f), published.join(f)).unwrap();
    }
    std::fs::remove_dir_all(run.join("sft")).unwrap();
    let published_s = published.display().to_string();
    let mut reader = eval.clone();
    reader.extend(["--adapter", published_s.as_str(), "--out"]);
    let out_path = dir.path().join("reader.json").display().to_string();
    reader.push(out_path.as_str());
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_concord"))
        .args(&reader)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("comparing with the base model"), "{err}");
    let r: EvalReport = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r.models["base"].adapter, None);
}

/// `concord train` on the quickstart, tiny model in `model_dir`, output under `out`:
/// a 2-step warm start, 3 GRPO steps, checkpoints at 2 and 3, held-out rows every 2
/// steps and at the end; `--resume run_dir` when given.
fn held_out_run(model_dir: &Path, out: &Path, extra: &[&str], resume: Option<&Path>) {
    let mut sets = vec![
        format!("run.output_dir={}", out.display()),
        format!("model.name={}/tiny", model_dir.display()),
        "run.steps=3".into(),
        "run.save_every=2".into(),
        "run.eval_every=2".into(),
        "run.eval_episodes=3".into(),
        "grpo.max_completion_length=6".into(),
        "grpo.prompts_per_step=2".into(),
        "grpo.num_generations=2".into(),
        "sft.steps=2".into(),
        "sft.examples=4".into(),
        "sft.batch_size=2".into(),
    ];
    sets.extend(extra.iter().map(|s| s.to_string()));
    let mut args = vec!["train", "--config", "configs/quickstart.toml"];
    if let Some(r) = resume {
        args.extend(["--resume", r.to_str().unwrap()]);
    }
    for s in &sets {
        args.extend(["--set", s.as_str()]);
    }
    concord_ok(&args);
}

/// `[run] eval_every`: held-out rows at the due steps and at the end, through the same
/// driver as `concord eval`; a run cut back to an earlier checkpoint and resumed writes
/// the same rows (no duplicates), and `plot` draws them.
#[test]
fn held_out_evaluation_during_training_survives_a_resume() {
    let dir = tempfile::tempdir().unwrap();
    let read = |p: &Path| -> Vec<Vec<String>> {
        std::fs::read_to_string(p.join("eval_log.csv"))
            .unwrap()
            .lines()
            .map(|l| {
                let mut f: Vec<String> = l.split(',').map(String::from).collect();
                f.pop(); // eval_seconds: a timing
                f
            })
            .collect()
    };
    let a = dir.path().join("a");
    held_out_run(dir.path(), &a, &[], None);
    let rows = read(&a.join("quickstart"));
    assert_eq!(
        rows[0].join(","),
        "step,env,episodes,win_rate,win_lo,win_hi,reward,reward_lo,reward_hi,agreement,\
agreement_lo,agreement_hi,best_constant_agreement,mutual_information_bits,actions"
    );
    let steps: Vec<&str> = rows[1..].iter().map(|r| r[0].as_str()).collect();
    assert_eq!(
        steps,
        ["0", "2", "3"],
        "the start, every 2 steps and at the end"
    );
    for r in &rows[1..] {
        assert_eq!((r[1].as_str(), r[2].as_str()), ("ticketmelt", "3"));
        let agreement: f64 = r[9].parse().unwrap();
        assert!((0.0..=1.0).contains(&agreement), "{r:?}");
        assert!(
            r[14].contains("MONITOR:") || r[14].contains("DEPLOY_PROD"),
            "{r:?}"
        );
    }

    // The same run, cut back to checkpoint-2 after it finished (as a kill after step 3's
    // evaluation but before its checkpoint would leave it), then resumed.
    let b = dir.path().join("b");
    held_out_run(dir.path(), &b, &[], None);
    let qb = b.join("quickstart");
    std::fs::remove_dir_all(qb.join("checkpoint-3")).unwrap();
    held_out_run(dir.path(), &b, &[], Some(&qb));
    assert_eq!(
        read(&qb),
        rows,
        "resumed rows equal the uninterrupted run's"
    );
    let png = std::fs::read(a.join("quickstart/reward_curve.png")).unwrap();
    assert!(png.starts_with(b"\x89PNG"));
}

/// Columns that time the machine, not the run: they differ between equal runs.
const TIMINGS: [&str; 6] = [
    "step_time",
    "seconds",
    "gen_tokens_per_s",
    "train_tokens_per_s",
    "peak_mem_mb",
    "eval_seconds",
];

/// The events' (step, tag, value) triples, timings left out.
fn events(run: &Path) -> Vec<(i64, String, f32)> {
    let mut out = Vec::new();
    for e in concord::run::tensorboard::read_all(run).unwrap() {
        for (tag, x) in e.scalars {
            if !TIMINGS.iter().any(|t| tag.ends_with(&format!("/{t}"))) {
                out.push((e.step, tag, x));
            }
        }
    }
    out
}

/// `[run] report_to = ["csv", "tensorboard"]`: every numeric cell of training_log.csv
/// (the warm start's and GRPO's) and eval_log.csv is a scalar at its row's step, read
/// back through both CRCs; a run cut back to checkpoint 2 and resumed ends with the
/// same events, no step twice.
#[test]
fn tensorboard_events_mirror_the_logs_and_survive_a_resume() {
    let dir = tempfile::tempdir().unwrap();
    let tb = ["run.report_to=[\"csv\", \"tensorboard\"]"];
    let a = dir.path().join("a");
    held_out_run(dir.path(), &a, &tb, None);
    let qa = a.join("quickstart");
    for (run, csv, prefix) in [
        (qa.clone(), "training_log.csv", "train"),
        (qa.join("sft"), "training_log.csv", "train"),
        (qa.clone(), "eval_log.csv", "eval/ticketmelt"),
    ] {
        let text = std::fs::read_to_string(run.join(csv)).unwrap();
        let mut lines = text.lines();
        let header: Vec<&str> = lines.next().unwrap().split(',').collect();
        let mut want = Vec::new();
        for line in lines {
            let cells: Vec<&str> = line.split(',').collect();
            let step: i64 = cells[0].parse().unwrap();
            for (h, c) in header.iter().zip(&cells) {
                let skip = ["step", "stage", "env"].contains(h) || TIMINGS.contains(h);
                match c.parse::<f32>() {
                    Ok(x) if !skip => want.push((step, format!("{prefix}/{h}"), x)),
                    _ => {}
                }
            }
        }
        let got: Vec<_> = events(&run)
            .into_iter()
            .filter(|(_, t, _)| t.starts_with(&format!("{prefix}/")))
            .collect();
        assert!(want.len() >= 10, "{csv}: {} cells", want.len());
        let same = |x: f32, y: f32| x == y || (x.is_nan() && y.is_nan());
        assert_eq!(got.len(), want.len(), "{}", run.display());
        for (g, w) in got.iter().zip(&want) {
            assert!(g.0 == w.0 && g.1 == w.1 && same(g.2, w.2), "{g:?} vs {w:?}");
        }
    }
    let steps: Vec<i64> = events(&qa).iter().map(|e| e.0).collect();
    assert!(steps.windows(2).all(|w| w[0] <= w[1]) && steps.contains(&3));

    let b = dir.path().join("b");
    held_out_run(dir.path(), &b, &tb, None);
    let qb = b.join("quickstart");
    std::fs::remove_dir_all(qb.join("checkpoint-3")).unwrap();
    held_out_run(dir.path(), &b, &tb, Some(&qb));
    assert_eq!(
        events(&qb),
        events(&qa),
        "resumed events equal the uninterrupted run's"
    );
}

#[test]
fn eval_every_without_episodes_is_refused() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_concord"))
        .args([
            "train",
            "--config",
            "configs/quickstart.toml",
            "--set",
            "run.eval_every=5",
            "--set",
            "run.eval_episodes=0",
            "--set",
            "run.output_dir=/nonexistent/never-written",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("eval_episodes"), "{err}");
}

#[test]
fn an_unknown_report_to_sink_is_refused_by_key() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("c.toml");
    std::fs::write(&cfg, "[run]\nreport_to = [\"csv\", \"wandb\"]\n").unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_concord"))
        .args(["train", "--config", cfg.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("run.report_to") && err.contains("line 2") && err.contains("tensorboard"),
        "{err}"
    );
}

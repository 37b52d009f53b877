//! Published configs work as published (issue 52, item 5): every
//! `docs/runs/**/config.toml` resolves its paths from where it stands (the model from the
//! repository's `.models/`, a start adapter from a published directory), its run
//! directory is its own directory, so `concord eval --config docs/runs/X/config.toml`
//! evaluates the adapter the page keeps; a published page cannot be resumed over; and
//! evaluating an adapter never needs the start adapter the run was trained from. None of
//! it needs the real model (`.models/` is not there in CI) or the network.
use concord::config::{Config, PathsBase};
use concord::eval::{compare_start, default_adapter, EvalReport, PUBLISHED_ADAPTER_DIR};
use concord::model::lora::ADAPTER_WEIGHTS;
use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    std::fs::canonicalize(env!("CARGO_MANIFEST_DIR")).unwrap()
}

fn canon(p: &Path) -> PathBuf {
    std::fs::canonicalize(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Every `docs/runs/**/config.toml`, sorted.
fn published_configs() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.file_name().is_some_and(|n| n == "config.toml") {
                out.push(p);
            }
        }
    }
    let mut out = Vec::new();
    walk(&repo().join("docs/runs"), &mut out);
    out.sort();
    assert!(out.len() >= 20, "published configs: {out:?}");
    out
}

fn load(path: &Path) -> Config {
    Config::load(path, &[]).unwrap_or_else(|e| panic!("{}: {e:#}", path.display()))
}

/// The page's directory, relative to the repository (for messages and the table below).
fn page_name(config: &Path) -> String {
    let page = config.parent().unwrap();
    page.strip_prefix(repo()).unwrap().display().to_string()
}

/// Run the `concord` binary from the repository root: exit status, stdout, stderr.
fn concord(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_concord"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn every_published_config_resolves_its_paths_from_where_it_stands() {
    let models = repo().join(".models");
    for path in published_configs() {
        let at = page_name(&path);
        let page = canon(path.parent().unwrap());
        let text = std::fs::read_to_string(&path).unwrap();
        let raw = Config::from_toml_str(&text, &at, &[]).unwrap();
        assert_eq!(
            raw.run.paths_relative_to,
            PathsBase::ConfigDir,
            "{at}: give `[run] paths_relative_to = \"config_dir\"`"
        );
        let cfg = load(&path);
        // The model is the repository's `.models/FILE` (scripts/fetch_real_model.sh).
        let model = Path::new(&cfg.model.name);
        assert_eq!(
            model.parent(),
            Some(models.as_path()),
            "{at}: model.name resolves to {}",
            model.display()
        );
        // Its run directory is the page itself.
        assert_eq!(canon(&cfg.run_dir()), page, "{at}: run directory");
        assert!(cfg.run.output_dir.is_dir(), "{at}: output_dir");
        // A start adapter is a published one.
        if let Some(a) = &cfg.model.adapter {
            assert!(
                a.join(ADAPTER_WEIGHTS).is_file(),
                "{at}: model.adapter {} holds no published adapter",
                a.display()
            );
        }
        if let Some(p) = cfg.sft.as_ref().and_then(|s| s.path.as_ref()) {
            assert!(p.exists(), "{at}: sft.path {} is not there", p.display());
        }
    }
}

#[test]
fn eval_finds_the_adapter_each_page_keeps() {
    let mut kept = 0;
    for path in published_configs() {
        let at = page_name(&path);
        let page = canon(path.parent().unwrap());
        let cfg = load(&path);
        let got = default_adapter(&cfg);
        let keeps = [page.clone(), page.join(PUBLISHED_ADAPTER_DIR)]
            .into_iter()
            .find(|d| d.join(ADAPTER_WEIGHTS).is_file());
        match (keeps, got) {
            (Some(dir), Ok(a)) => {
                assert_eq!(canon(&a), dir, "{at}");
                kept += 1;
            }
            (Some(dir), Err(e)) => panic!("{at}: keeps {} but eval says {e:#}", dir.display()),
            // Without the run's adapter: its warm start, when that is all the page
            // trained, else an error naming where it looked.
            (None, Ok(a)) => {
                let a = canon(&a);
                assert_eq!(a.parent(), Some(page.as_path()), "{at}: {}", a.display());
                assert!(
                    a.ends_with("sft_adapter") || a.ends_with("sft"),
                    "{at}: {a:?}"
                );
                kept += 1;
            }
            (None, Err(e)) => {
                let e = format!("{e:#}");
                assert!(e.contains(&page.display().to_string()), "{at}: {e}");
            }
        }
    }
    assert!(kept >= 5, "pages keeping an adapter: {kept}");

    // The pages as they are today, by name: one adapter per result docs/results.md cites;
    // superseded runs keep their logs and write-up, not their weights.
    let expect = [
        ("docs/runs/merge-ring-0.5b", Some("")),
        ("docs/runs/merge-ring-rl-0.5b", Some("")),
        ("docs/runs/ticketmelt-0.5b/run8-reasoned", Some("")),
        ("docs/runs/whispers-0.5b/run6", Some("sft_adapter")),
        ("docs/runs/postmortem-0.5b/run2", Some("sft_adapter")),
        ("docs/runs/ticketmelt-0.5b", None),
        ("docs/runs/ticketmelt-0.5b/compact", None),
        ("docs/runs/ticketmelt-0.5b/run1-heuristic", None),
        ("docs/runs/whispers-0.5b/run2", None),
        ("docs/runs/whispers-0.5b/run7", None),
    ];
    for (page, want) in expect {
        let dir = repo().join(page);
        let got = default_adapter(&load(&dir.join("config.toml")));
        match want {
            Some(sub) => assert_eq!(
                canon(&got.unwrap_or_else(|e| panic!("{page}: {e:#}"))),
                canon(&dir.join(sub)),
                "{page}"
            ),
            None => {
                let e = format!("{:#}", got.unwrap_err());
                assert!(
                    e.contains("--adapter DIR") && e.contains(ADAPTER_WEIGHTS),
                    "{e}"
                );
            }
        }
    }
}

/// `--compare` on a published page: its start where it was published, else the base
/// model (also when the start is the adapter evaluated).
#[test]
fn compare_starts_from_the_published_start_or_the_base_model() {
    let page = |p: &str| repo().join("docs/runs").join(p);
    let start = |config: &str, adapter: &str| {
        let cfg = load(&page(config).join("config.toml"));
        compare_start(&cfg, Some(page(adapter).as_path())).map(|p| canon(&p))
    };
    // Run 7's GRPO started from run 6's warm start, published as run6/sft_adapter/.
    assert_eq!(
        start("whispers-0.5b/run7", "whispers-0.5b/run7"),
        Some(canon(&page("whispers-0.5b/run6/sft_adapter")))
    );
    // ... which is the base model's place when run 6's adapter is the one evaluated.
    assert_eq!(
        start("whispers-0.5b/run7", "whispers-0.5b/run6/sft_adapter"),
        None
    );
    // Run 6 (an SFT) started from run 5's, whose weights left the tree.
    assert_eq!(
        start("whispers-0.5b/run6", "whispers-0.5b/run6/sft_adapter"),
        None
    );
    // Post-mortem run 2's adapter is its warm start: compared with the base model.
    assert_eq!(
        start("postmortem-0.5b/run2", "postmortem-0.5b/run2/sft_adapter"),
        None
    );
    // TICKETMELT run 8's warm start was not published.
    assert_eq!(
        start(
            "ticketmelt-0.5b/run8-reasoned",
            "ticketmelt-0.5b/run8-reasoned"
        ),
        None
    );
}

fn fake_adapter(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join(ADAPTER_WEIGHTS), b"not really weights").unwrap();
    std::fs::write(dir.join("adapter_config.json"), "{}").unwrap();
}

/// A page's files, to check that a refused command left them as they were.
fn snapshot(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.file_name()
                .is_some_and(|n| n == concord::run::dir::LOCK_FILE)
            {
                continue;
            }
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push((p.clone(), std::fs::read(&p).unwrap()));
            }
        }
    }
    out.sort();
    out
}

/// `train --resume` (or `sft --resume`) on a directory with a finished adapter and no
/// checkpoint-N/ is refused and leaves it as it was; so is a plain `train` into it.
#[test]
fn a_published_page_is_not_resumed_over() {
    let d = tempfile::tempdir().unwrap();
    for layout in ["", "adapter", "sft_adapter"] {
        let page = d.path().join(format!("page-{layout}"));
        std::fs::create_dir_all(&page).unwrap();
        std::fs::write(
            page.join("config.toml"),
            "[run]\nname = \"x\"\noutput_dir = \"..\"\npaths_relative_to = \"config_dir\"\n\
             [model]\nname = \"../.models/m.gguf\"\n[env]\nname = \"ticketmelt\"\n",
        )
        .unwrap();
        std::fs::write(page.join("training_log.csv"), "step,loss\n1,0.5\n2,0.4\n").unwrap();
        fake_adapter(&page.join(layout));
        let before = snapshot(&page);
        let p = page.display().to_string();
        for command in ["train", "sft"] {
            let (ok, _, err) = concord(&[command, "--resume", p.as_str()]);
            assert!(!ok, "{command} --resume {p} ran");
            assert!(
                err.contains("cannot resume") && err.contains("no checkpoint-N/"),
                "{command} {layout:?}: {err}"
            );
            assert_eq!(snapshot(&page), before, "{command} {layout:?}");
        }
        let e = concord::run::dir::check_resumable(&page).unwrap_err();
        assert!(format!("{e:#}").contains(ADAPTER_WEIGHTS), "{e:#}");
        // Without --resume (and without a training log, as whispers-0.5b/run2 keeps
        // none under Concord's name) the directory holds a run: refused, not cleared as
        // a start that failed before its first step.
        std::fs::remove_file(page.join("training_log.csv")).unwrap();
        let before = snapshot(&page);
        let e = concord::run::dir::claim(&page, false, false, "train").unwrap_err();
        assert!(format!("{e:#}").contains("already holds a run"), "{e:#}");
        assert_eq!(snapshot(&page), before, "claim {layout:?}");
        // A run with a checkpoint resumes as before.
        let ck = page.join("checkpoint-2");
        std::fs::create_dir_all(&ck).unwrap();
        std::fs::write(ck.join("trainer_state.json"), "{}").unwrap();
        concord::run::dir::check_resumable(&page).unwrap();
    }
    // A warm start's own adapter (sft/) and an absent directory are no reason to refuse.
    let run = d.path().join("run");
    fake_adapter(&run.join("sft"));
    concord::run::dir::check_resumable(&run).unwrap();
    concord::run::dir::check_resumable(&d.path().join("absent")).unwrap();
}

/// `concord eval --adapter X` on the built-in tiny model with a config whose
/// `model.adapter` (the run's start) is not there: it evaluates X, and `--compare` falls
/// back to the base model and says so; so it does when the start is X itself.
#[test]
fn evaluating_an_adapter_needs_no_start_adapter() {
    let d = tempfile::tempdir().unwrap();
    let dir = std::path::absolute(d.path()).unwrap();
    let tiny = dir.join("tiny").display().to_string();
    let adapter = dir.join("adapter").display().to_string();
    let missing = dir.join("start-not-published").display().to_string();
    let (ok, _, err) = concord(&["model", "init-tiny", "--out", &tiny]);
    assert!(ok, "{err}");
    let (ok, _, err) = concord(&[
        "model",
        "init-adapter",
        "--model",
        &tiny,
        "--out",
        &adapter,
        "--r",
        "4",
        "--alpha",
        "8",
        "--b-std",
        "0.02",
    ]);
    assert!(ok, "{err}");
    let config = dir.join("c.toml");
    std::fs::write(
        &config,
        format!(
            "[run]\nname = \"r\"\noutput_dir = \"{}\"\n[model]\nname = \"{tiny}\"\n\
             adapter = \"{missing}\"\n[lora]\nr = 4\nalpha = 8\n[grpo]\n\
             max_completion_length = 6\n[env]\nname = \"ticketmelt\"\n\
             [env.options]\npreset = \"classic\"\npeers = \"dumb\"\n",
            dir.display()
        ),
    )
    .unwrap();
    let config = config.display().to_string();
    let out = dir.join("eval.json").display().to_string();
    let eval = |extra: &[&str]| {
        let mut args = vec![
            "eval",
            "--config",
            config.as_str(),
            "--adapter",
            adapter.as_str(),
            "--episodes",
            "2",
            "--batch",
            "2",
            "--json",
            "--out",
            out.as_str(),
        ];
        args.extend_from_slice(extra);
        let (ok, stdout, err) = concord(&args);
        assert!(ok, "eval {extra:?}: {err}");
        let report: EvalReport = serde_json::from_str(&stdout).unwrap();
        (report, err)
    };
    let (alone, _) = eval(&[]);
    let keys: Vec<&str> = alone.models.keys().map(String::as_str).collect();
    assert_eq!(keys, ["adapter"]);
    assert_eq!(
        alone.models["adapter"].adapter.as_deref(),
        Some(adapter.as_str())
    );

    let (compared, err) = eval(&["--compare"]);
    let keys: Vec<&str> = compared.models.keys().map(String::as_str).collect();
    assert_eq!(keys, ["adapter", "base"]);
    assert_eq!(compared.models["base"].adapter, None);
    assert!(
        err.contains(&missing) && err.contains("comparing with the base model"),
        "{err}"
    );
    assert_eq!(compared.models["adapter"], alone.models["adapter"]);

    let start_is_it = format!("model.adapter={adapter}");
    let (same, err) = eval(&["--compare", "--set", start_is_it.as_str()]);
    assert_eq!(same.models["base"].adapter, None);
    assert!(err.contains("is the adapter evaluated"), "{err}");
    assert_eq!(same.models["base"], compared.models["base"]);
}

//! `concord plot`: PNGs from a synthetic run directory (no model needed).
use concord::plot::{before_after_height, plot_run, PLOT_HEIGHT, PLOT_WIDTH};
use concord::run::eval_report::{EnvEval, EvalReport, ModelEval};
use concord::run::log::TrainingLog;
use std::collections::BTreeMap;
use std::path::Path;

const HEADER: &str = "step,stage,env,reward,reward_std,frac_reward_zero_std,\
rewards/format/mean,rewards/format/std,rewards/r1_own/mean,rewards/r1_own/std,\
rewards/r2_team/mean,rewards/r2_team/std,rewards/win/mean,rewards/win/std,\
completions/mean_length,kl,entropy,loss,grad_norm,learning_rate,num_tokens,skipped,\
gen_tokens_per_s,train_tokens_per_s,peak_mem_mb,step_time,seconds";

/// 40 rows, stage `dumb` for steps 1..=15 then `mixed`; a few NaN / empty cells, an
/// all-NaN `kl` column, a constant `win` component and one skipped step.
fn write_log(dir: &Path, rows: usize) {
    let mut s = String::from(HEADER);
    s.push('\n');
    for i in 0..rows {
        let step = i + 1;
        let stage = if step <= 15 { "dumb" } else { "mixed" };
        let t = i as f64;
        let reward = 0.2 + 0.015 * t + 0.1 * ((t * 1.7).sin());
        let reward = if step == 7 {
            "nan".to_string()
        } else {
            format!("{reward}")
        };
        let format = (0.5 + 0.012 * t).min(1.0);
        let r1 = 0.1 + 0.01 * t + 0.05 * (t * 0.9).cos();
        let r2 = if step == 20 {
            String::new()
        } else {
            format!("{}", -0.2 + 0.008 * t)
        };
        let skipped = u8::from(step == 12);
        s.push_str(&format!(
            "{step},{stage},ticketmelt,{reward},0.3,0.1,{format},0.1,{r1},0.1,{r2},0.1,1,0,\
             24.5,nan,1.2,0.01,0.5,0.001,{},{skipped},100,50,900,1.5,{}\n",
            step * 1000,
            step as f64 * 1.5
        ));
    }
    std::fs::write(dir.join("training_log.csv"), s).unwrap();
}

fn env_eval(reward: f64, win: f64, comps: &[(&str, f64)]) -> EnvEval {
    EnvEval {
        behaviour: None,
        episodes: 64,
        seats: 64,
        reward_mean: reward,
        reward_ci95: [reward - 0.04, reward + 0.04],
        win_rate: win,
        win_ci95: [win - 0.06, win + 0.07],
        components: comps.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
    }
}

fn eval_report(with_base: bool) -> EvalReport {
    let mut models = BTreeMap::new();
    if with_base {
        let mut envs = BTreeMap::new();
        envs.insert(
            "ticketmelt".to_string(),
            env_eval(0.21, 0.15, &[("r1_own", 0.5), ("r2_team", -0.1)]),
        );
        models.insert(
            "base".to_string(),
            ModelEval {
                adapter: None,
                envs,
            },
        );
    }
    let mut envs = BTreeMap::new();
    envs.insert(
        "ticketmelt".to_string(),
        env_eval(0.41, 0.35, &[("r1_own", 0.8), ("r2_team", 0.3)]),
    );
    models.insert(
        "adapter".to_string(),
        ModelEval {
            adapter: Some("runs/x".into()),
            envs,
        },
    );
    EvalReport {
        config: "configs/x.toml".into(),
        episodes: 64,
        greedy: false,
        first_seed: 1 << 63,
        sampling: None,
        env_options: Default::default(),
        models,
    }
}

/// Width and height from the IHDR chunk, after checking the PNG signature.
fn png_size(path: &Path) -> (u32, u32) {
    let bytes = std::fs::read(path).unwrap();
    assert!(bytes.len() > 1000, "{} is too small", path.display());
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "{}", path.display());
    assert_eq!(&bytes[12..16], b"IHDR");
    let w = u32::from_be_bytes(bytes[16..20].try_into().unwrap());
    let h = u32::from_be_bytes(bytes[20..24].try_into().unwrap());
    (w, h)
}

#[test]
fn plots_a_curriculum_run_with_eval() {
    let dir = tempfile::tempdir().unwrap();
    write_log(dir.path(), 40);
    std::fs::write(
        dir.path().join("eval.json"),
        serde_json::to_string_pretty(&eval_report(true)).unwrap(),
    )
    .unwrap();
    let written = plot_run(dir.path(), 10).unwrap();
    let names: Vec<String> = written
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        names,
        vec!["reward_curve.png", "components.png", "before_after.png"]
    );
    for p in &written {
        assert!(p.starts_with(dir.path()));
    }
    assert_eq!(
        png_size(&dir.path().join("reward_curve.png")),
        (PLOT_WIDTH, PLOT_HEIGHT)
    );
    assert_eq!(
        png_size(&dir.path().join("components.png")),
        (PLOT_WIDTH, PLOT_HEIGHT)
    );
    assert_eq!(
        png_size(&dir.path().join("before_after.png")),
        (PLOT_WIDTH, before_after_height(1))
    );
    assert_eq!(before_after_height(1), PLOT_HEIGHT);
    // No temporary files left behind.
    for e in std::fs::read_dir(dir.path()).unwrap() {
        let name = e.unwrap().file_name().to_string_lossy().into_owned();
        assert!(!name.contains(".tmp"), "left over: {name}");
    }
    // Plotting again overwrites in place.
    assert_eq!(plot_run(dir.path(), 3).unwrap().len(), 3);
}

#[test]
fn before_after_needs_base_and_adapter() {
    let dir = tempfile::tempdir().unwrap();
    write_log(dir.path(), 40);
    std::fs::write(
        dir.path().join("eval.json"),
        serde_json::to_string(&eval_report(false)).unwrap(),
    )
    .unwrap();
    let written = plot_run(dir.path(), 10).unwrap();
    assert_eq!(written.len(), 2);
    assert!(dir.path().join("reward_curve.png").exists());
    assert!(dir.path().join("components.png").exists());
    assert!(!dir.path().join("before_after.png").exists());
}

#[test]
fn single_row_and_degenerate_logs() {
    let dir = tempfile::tempdir().unwrap();
    write_log(dir.path(), 1);
    assert_eq!(plot_run(dir.path(), 10).unwrap().len(), 2);
    assert_eq!(
        png_size(&dir.path().join("reward_curve.png")),
        (PLOT_WIDTH, PLOT_HEIGHT)
    );

    // All-NaN reward, constant component, no stage/env columns.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("training_log.csv"),
        "step,reward,rewards/a/mean\n1,nan,2\n2,,2\n3,nan,2\n",
    )
    .unwrap();
    assert_eq!(plot_run(dir.path(), 2).unwrap().len(), 2);
    png_size(&dir.path().join("components.png"));

    // Header only.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("training_log.csv"), format!("{HEADER}\n")).unwrap();
    assert_eq!(plot_run(dir.path(), 10).unwrap().len(), 2);
}

#[test]
fn errors_name_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let e = plot_run(dir.path(), 10).unwrap_err();
    assert!(format!("{e:#}").contains("training_log.csv"), "{e:#}");

    write_log(dir.path(), 5);
    std::fs::write(dir.path().join("eval.json"), "{not json").unwrap();
    let e = plot_run(dir.path(), 10).unwrap_err();
    assert!(format!("{e:#}").contains("eval.json"), "{e:#}");

    std::fs::write(
        dir.path().join("training_log.csv"),
        "step,reward\n1,0.5\nx,1\n",
    )
    .unwrap();
    let e = plot_run(dir.path(), 10).unwrap_err();
    let msg = format!("{e:#}");
    assert!(
        msg.contains("training_log.csv") && msg.contains("line 3"),
        "{msg}"
    );
}

#[test]
fn parses_a_log_by_header_name() {
    let dir = tempfile::tempdir().unwrap();
    write_log(dir.path(), 40);
    let log = TrainingLog::read(&dir.path().join("training_log.csv")).unwrap();
    assert_eq!(log.len(), 40);
    assert_eq!(
        log.component_names(),
        vec!["format", "r1_own", "r2_team", "win"]
    );
    assert!(log.column("reward").unwrap()[6].is_nan());
    assert!(log.column("rewards/r2_team/mean").unwrap()[19].is_nan());
    assert!(log.column("kl").unwrap().iter().all(|v| v.is_nan()));
    assert_eq!(
        concord::plot::stage_boundaries(&log.stages),
        vec![(15, "mixed".to_string())]
    );
    assert_eq!(log.skipped().iter().filter(|s| **s).count(), 1);
}

/// Pixels of exactly `rgb` in a PNG written by `concord plot`.
fn pixels_of(path: &Path, rgb: [u8; 3]) -> usize {
    let decoder = png::Decoder::new(std::fs::File::open(path).unwrap());
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).unwrap();
    let px = info.color_type.samples();
    buf[..info.buffer_size()]
        .chunks(px)
        .filter(|p| p[..3] == rgb)
        .count()
}

const LOSS_COLOR: [u8; 3] = [20, 60, 140];
const ACCURACY_COLOR: [u8; 3] = [200, 110, 20];

#[test]
fn an_sft_run_plots_its_loss_and_token_accuracy() {
    // The header `concord sft` writes; loss falls, accuracy rises.
    let dir = tempfile::tempdir().unwrap();
    let mut s = String::from(
        "step,epoch,loss,grad_norm,learning_rate,num_tokens,mean_token_accuracy,skipped,step_time,seconds\n",
    );
    for i in 1..=32 {
        let t = f64::from(i);
        s.push_str(&format!(
            "{i},{},{},1.0,0.0002,{},{},0,45,{}\n",
            t / 32.0,
            2.5 * (-t / 10.0).exp() + 0.3,
            i * 3700,
            0.95 - 0.4 * (-t / 8.0).exp(),
            t * 45.0
        ));
    }
    std::fs::write(dir.path().join("training_log.csv"), s).unwrap();
    std::fs::write(
        dir.path().join("eval.json"),
        serde_json::to_string(&eval_report(true)).unwrap(),
    )
    .unwrap();
    let written = plot_run(dir.path(), 4).unwrap();
    let names: Vec<String> = written
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, vec!["sft_curve.png", "before_after.png"]);
    let png = dir.path().join("sft_curve.png");
    assert_eq!(png_size(&png), (PLOT_WIDTH, PLOT_HEIGHT));
    // Both curves are drawn across the chart, not only as legend marks.
    assert!(
        pixels_of(&png, LOSS_COLOR) > 1500,
        "{}",
        pixels_of(&png, LOSS_COLOR)
    );
    assert!(pixels_of(&png, ACCURACY_COLOR) > 1500);

    // An SFT log with no finite value still plots, with a note and no curves.
    std::fs::write(
        dir.path().join("training_log.csv"),
        "step,loss,mean_token_accuracy\n1,nan,nan\n2,,\n",
    )
    .unwrap();
    std::fs::remove_file(dir.path().join("eval.json")).unwrap();
    assert_eq!(plot_run(dir.path(), 4).unwrap().len(), 1);
    assert!(pixels_of(&png, LOSS_COLOR) < 500);

    // A log with neither a reward nor a loss names what it lacks.
    std::fs::write(dir.path().join("training_log.csv"), "step,x\n1,2\n").unwrap();
    let e = plot_run(dir.path(), 4).unwrap_err();
    assert!(format!("{e:#}").contains("reward"), "{e:#}");
}

/// `learning_curve.png` over a hand-written `eval_log.csv`: the base model from
/// `eval.json`, and the references played on the merge ring's held-out sessions, where
/// always_bypass earns exactly the rules' safe reward (0.4) every session and the
/// heuristic more; `references.json` is reused once written.
#[test]
fn learning_curve_with_the_references_a_skeptic_asks_for() {
    use concord::eval::references::{learning_curve_lines, References};
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(
        d.join("config.toml"),
        "[run]\nsteps = 20\n[model]\nname = \"tiny\"\n[env]\nname = \"merge_ring\"\n\
         [env.options]\nagents = 4\nregime = \"stationary\"\nprompt = \"compact\"\n",
    )
    .unwrap();
    let mut log = concord::run::log::EVAL_LOG_HEADER.to_string();
    for (s, r) in [(0, -0.13), (10, 0.2), (20, 0.45)] {
        log.push_str(&format!(
            "\n{s},merge_ring,20,0.3,0.1,0.5,{r},{},{},,,,,,,1.0",
            r - 0.1,
            r + 0.1
        ));
    }
    std::fs::write(d.join("eval_log.csv"), log + "\n").unwrap();
    let mut report = eval_report(true);
    let base = report.models.get_mut("base").unwrap();
    base.envs.clear();
    base.envs
        .insert("merge_ring".into(), env_eval(-0.197, 0.07, &[]));
    std::fs::write(d.join("eval.json"), serde_json::to_string(&report).unwrap()).unwrap();

    let lines = learning_curve_lines(d, 30).unwrap();
    let find = |l: &str| {
        lines
            .iter()
            .find(|x| x.label == l)
            .unwrap_or_else(|| panic!("{l}: {lines:?}"))
    };
    assert_eq!(find("base model").reward, -0.197);
    let constant = find("best constant (always_bypass)");
    assert!((constant.reward - 0.4).abs() < 1e-12, "{constant:?}");
    assert!(find("heuristic").reward > 0.45, "{lines:?}");
    let refs = References::read(d).unwrap().unwrap();
    assert_eq!(refs.episodes, 30);
    // Written once: the config is no longer needed to draw the lines again.
    std::fs::remove_file(d.join("config.toml")).unwrap();
    assert_eq!(learning_curve_lines(d, 30).unwrap(), lines);

    let png = concord::plot::plot_learning_curve(d, &lines)
        .unwrap()
        .unwrap();
    assert_eq!(png_size(&png), (PLOT_WIDTH, 2 * PLOT_HEIGHT - 200));
    // The trained policy's curve is drawn, in the first palette colour.
    assert!(pixels_of(&png, [31, 119, 180]) > 200);
    // No held-out rows: no curve.
    let empty = tempfile::tempdir().unwrap();
    assert!(concord::plot::plot_learning_curve(empty.path(), &lines)
        .unwrap()
        .is_none());
}

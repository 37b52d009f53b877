//! Data parallel over MPI (`mpirun -np N concord train`): a run of several processes
//! writes the same log, samples and adapter as one process, for every loss type, with
//! micro-batch accumulation; resumes identically; and a dead or stuck process ends the
//! job instead of hanging it.
//!
//! These tests need `mpirun` and an MPI library to build `concord --features mpi`
//! against (.ci/run installs Open MPI); where `mpirun` is absent each test says so and
//! passes without running. The MPI build goes to `target/mpi/`: `cargo test` holds the
//! main target directory, and its `concord` binary is in use by other tests.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// `concord` built with `--features mpi`, or why these tests cannot run here.
fn mpi_concord() -> Option<&'static Path> {
    static BIN: OnceLock<Option<PathBuf>> = OnceLock::new();
    BIN.get_or_init(|| {
        if Command::new("mpirun").arg("--version").output().is_err() {
            eprintln!(
                "SKIPPED: mpirun is not installed (apt-get install openmpi-bin libopenmpi-dev)"
            );
            return None;
        }
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let target = std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| root.join("target"))
            .join("mpi");
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let out = Command::new(cargo)
            .args(["build", "--features", "mpi", "--bin", "concord"])
            .env("CARGO_TARGET_DIR", &target)
            .current_dir(root)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "mpirun is installed, but `cargo build --features mpi` failed (an MPI \
             development package and libclang are needed):\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        Some(target.join("debug").join("concord"))
    })
    .as_deref()
}

/// `mpirun -np N BIN ARGS` (as root too, as CI runs; no core binding, so each process
/// may use every core as a lone one would).
fn mpirun(bin: &Path, np: usize, args: &[&str]) -> Command {
    let mut c = Command::new("mpirun");
    c.args([
        "-np",
        &np.to_string(),
        "--oversubscribe",
        "--bind-to",
        "none",
    ])
    .arg(bin)
    .args(args)
    .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
    .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    .env("OMPI_MCA_rmaps_base_oversubscribe", "1")
    .current_dir(env!("CARGO_MANIFEST_DIR"));
    c
}

fn plain(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_concord"));
    c.args(args).current_dir(env!("CARGO_MANIFEST_DIR"));
    c
}

fn ok(mut c: Command, what: &str) -> Output {
    let out = c.output().unwrap();
    assert!(
        out.status.success(),
        "{what} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A GRPO config on the built-in tiny model (created under `dir`), starting from the
/// shared SFT adapter so that rewards differ within groups and gradients flow. Three
/// prompts a step: the two processes sample two and one.
fn config(dir: &Path, name: &str, grpo: &str, optim: &str, steps: usize) -> PathBuf {
    let path = dir.join(format!("{name}.toml"));
    let text = format!(
        r#"[run]
name = "{name}"
output_dir = "{out}"
seed = 7
steps = {steps}
save_every = 2
log_samples = 12

[model]
name = "{tiny}"
init_tiny = true
dtype = "f32"
device = "cpu"
adapter = "{adapter}"

[grpo]
num_generations = 4
prompts_per_step = 3
max_completion_length = 24
temperature = 0.7
{grpo}

[optim]
learning_rate = 2e-3
max_grad_norm = 1.0
schedule = "constant"
{optim}

[env]
name = "ticketmelt"
[env.options]
preset = "classic"
peers = "dumb"
"#,
        out = dir.display(),
        tiny = sft_adapter().0.display(),
        adapter = sft_adapter().1.display(),
    );
    std::fs::write(&path, text).unwrap();
    path
}

/// The tiny model and an adapter that writes the answer format (an SFT run, made once
/// by the plain binary): (model dir, adapter dir).
fn sft_adapter() -> &'static (PathBuf, PathBuf) {
    static SFT: OnceLock<(PathBuf, PathBuf)> = OnceLock::new();
    SFT.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap().keep();
        let tiny = dir.join("tiny");
        let cfg = dir.join("sft.toml");
        std::fs::write(
            &cfg,
            format!(
                r#"[run]
name = "sft"
output_dir = "{out}"
seed = 3

[model]
name = "{tiny}"
init_tiny = true
dtype = "f32"
device = "cpu"

[lora]
r = 8
alpha = 16
dropout = 0.0

[sft]
source = "env"
policy = "random"
examples = 64
steps = 40
batch_size = 8
learning_rate = 1e-2

[env]
name = "ticketmelt"
[env.options]
preset = "classic"
peers = "dumb"
"#,
                out = dir.display(),
                tiny = tiny.display()
            ),
        )
        .unwrap();
        ok(
            plain(&["sft", "--config", cfg.to_str().unwrap()]),
            "concord sft",
        );
        (tiny, dir.join("sft"))
    })
}

/// Log columns that measure time or memory, not what was learned.
const TIMING: &[&str] = &[
    "gen_tokens_per_s",
    "train_tokens_per_s",
    "peak_mem_mb",
    "step_time",
    "seconds",
    "eval_seconds",
];

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-5 * a.abs().max(b.abs()) + 1e-7
}

/// The sampler/trainer mismatch columns (`|logp_trainer - logp_sampler|` and its
/// exponential) measure float rounding itself, about 1e-6 to 1e-5 here and different for
/// every batch shape: they are held to 1e-4 absolute (a row scored against another
/// row's tokens would be off by whole nats).
const ROUNDING: &str = "sampling/";

fn csv(path: &Path) -> (Vec<String>, Vec<Vec<String>>) {
    let text = std::fs::read_to_string(path).unwrap();
    let mut lines = text
        .lines()
        .map(|l| l.split(',').map(String::from).collect());
    (lines.next().unwrap(), lines.collect())
}

/// The CSV `file` of run `b` holds what run `a`'s does: the same columns and rows, every
/// value but the timings within 1e-5 relative.
fn assert_same_csv(a: &Path, b: &Path, file: &str, what: &str) {
    let (ha, ra) = csv(&a.join(file));
    let (hb, rb) = csv(&b.join(file));
    assert_eq!(ha, hb, "{what}: {file} columns");
    assert_eq!(ra.len(), rb.len(), "{what}: {file} rows");
    assert!(!ra.is_empty(), "{what}: no rows in {file}");
    for (x, y) in ra.iter().zip(&rb) {
        for ((col, u), v) in ha.iter().zip(x).zip(y) {
            if TIMING.contains(&col.as_str()) {
                continue;
            }
            match (u.parse::<f64>(), v.parse::<f64>()) {
                (Ok(p), Ok(q)) => {
                    let same = if col.starts_with(ROUNDING) {
                        (p - q).abs() <= 1e-4
                    } else {
                        close(p, q)
                    };
                    assert!(same, "{what}: {file} row {} {col}: {u} vs {v}", x[0])
                }
                _ => assert_eq!(u, v, "{what}: {file} row {} {col}", x[0]),
            }
        }
    }
}

/// Held-out evaluation during training (`eval_every`): rank 0 plays, and the rows it
/// writes must not depend on how many processes trained.
const EVAL: &str = "eval_every = 2\neval_episodes = 3\n";
const EVAL_LOG: &str = "eval_log.csv";

fn with_eval(text: String) -> String {
    assert!(text.contains("save_every = 2\n"));
    text.replacen("save_every = 2\n", &format!("save_every = 2\n{EVAL}"), 1)
}

/// Run `b` wrote what run `a` wrote: every log value within 1e-5 relative, the same
/// prompts and completions, the final adapter within 1e-5 of its largest value.
fn assert_same_run(a: &Path, b: &Path, what: &str) {
    assert_same_csv(a, b, "training_log.csv", what);
    if a.join(EVAL_LOG).exists() || b.join(EVAL_LOG).exists() {
        assert_same_csv(a, b, EVAL_LOG, what);
    }
    let samples = |d: &Path| -> Vec<serde_json::Value> {
        std::fs::read_to_string(d.join("samples.jsonl"))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
    let (sa, sb) = (samples(a), samples(b));
    assert_eq!(sa.len(), sb.len(), "{what}: samples");
    for (x, y) in sa.iter().zip(&sb) {
        for k in ["step", "prompt", "completion", "tokens"] {
            assert_eq!(x[k], y[k], "{what}: sample {k}");
        }
        for k in ["reward", "advantage"] {
            let (p, q) = (x[k].as_f64().unwrap(), y[k].as_f64().unwrap());
            assert!(close(p, q), "{what}: sample {k} {p} vs {q}");
        }
    }
    let adapter = |d: &Path| -> BTreeMap<String, Vec<f32>> {
        candle_core::safetensors::load(
            d.join("adapter_model.safetensors"),
            &candle_core::Device::Cpu,
        )
        .unwrap()
        .into_iter()
        .map(|(k, t)| (k, t.flatten_all().unwrap().to_vec1::<f32>().unwrap()))
        .collect()
    };
    let (wa, wb) = (adapter(a), adapter(b));
    assert_eq!(wa.keys().collect::<Vec<_>>(), wb.keys().collect::<Vec<_>>());
    for (k, x) in &wa {
        let y = &wb[k];
        let scale = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        let diff = x.iter().zip(y).fold(0f32, |m, (p, q)| m.max((p - q).abs()));
        assert!(
            diff <= 1e-5 * scale.max(1e-6),
            "{what}: adapter {k} differs by {diff} (largest value {scale})"
        );
    }
}

/// Train `name` with one plain process and with `mpirun -np N`, and compare.
fn same_as_one_process(np: usize, grpo: &str, optim: &str, name: &str) {
    same_as_one_process_with(np, grpo, optim, "", name)
}

/// [`same_as_one_process`] with `env` added to the `[env]` section.
fn same_as_one_process_with(np: usize, grpo: &str, optim: &str, env: &str, name: &str) {
    let add_env = |text: String| {
        text.replace(
            "name = \"ticketmelt\"\n",
            &format!("name = \"ticketmelt\"\n{env}\n"),
        )
    };
    same_as_one_process_edited(np, grpo, optim, add_env, name);
}

/// [`same_as_one_process`] with the config text passed through `edit`; returns the
/// directory holding both runs (`{name}-one`, `{name}-np{np}`), or None where skipped.
fn same_as_one_process_edited(
    np: usize,
    grpo: &str,
    optim: &str,
    edit: impl Fn(String) -> String,
    name: &str,
) -> Option<tempfile::TempDir> {
    let bin = mpi_concord()?;
    let dir = tempfile::tempdir().unwrap();
    let make = |run: &str| {
        let path = config(dir.path(), run, grpo, optim, 3);
        let text = edit(std::fs::read_to_string(&path).unwrap());
        std::fs::write(&path, text).unwrap();
        path
    };
    let one = make(&format!("{name}-one"));
    let many = make(&format!("{name}-np{np}"));
    ok(
        plain(&["train", "--config", one.to_str().unwrap()]),
        "one process",
    );
    let out = ok(
        mpirun(bin, np, &["train", "--config", many.to_str().unwrap()]),
        "mpirun",
    );
    let err = String::from_utf8_lossy(&out.stderr);
    if np > 1 {
        assert!(
            err.contains(&format!("data parallel: {np} processes over mpi")),
            "{err}"
        );
    }
    assert_same_run(
        &dir.path().join(format!("{name}-one")),
        &dir.path().join(format!("{name}-np{np}")),
        &format!("{name}, {np} processes"),
    );
    Some(dir)
}

// Every loss type, each with micro-batches of 4 rows (the processes' 8 and 4 rows are
// accumulated over several) and another feature whose normaliser or state spans the
// batch.

#[test]
fn grpo_with_batch_scaled_rewards_and_kl() {
    let grpo = "loss_type = \"grpo\"\nscale_rewards = \"batch\"\nbeta = 0.04";
    same_as_one_process(2, grpo, "micro_batch = 4", "grpo");
}

#[test]
fn bnpo_with_two_iterations_per_batch() {
    let grpo = "loss_type = \"bnpo\"\nnum_iterations = 2";
    same_as_one_process(2, grpo, "micro_batch = 4", "bnpo");
}

#[test]
fn dr_grpo() {
    same_as_one_process(2, "loss_type = \"dr_grpo\"", "micro_batch = 4", "dr_grpo");
}

#[test]
fn dapo_with_dynamic_sampling_and_held_out_evaluation() {
    let grpo = "loss_type = \"dapo\"\ndynamic_sampling = true";
    let Some(runs) = same_as_one_process_edited(2, grpo, "micro_batch = 4", with_eval, "dapo")
    else {
        return;
    };
    // Step 0 (the start), 2 and 3 (the last) were evaluated, and assert_same_run compared the rows.
    let (header, rows) = csv(&runs.path().join("dapo-np2").join(EVAL_LOG));
    let step = header
        .iter()
        .position(|h| h == "step")
        .expect("a step column");
    let steps: Vec<&str> = rows.iter().map(|r| r[step].as_str()).collect();
    assert_eq!(steps, ["0", "2", "3"], "{rows:?}");
}

#[test]
fn luspo() {
    same_as_one_process(2, "loss_type = \"luspo\"", "micro_batch = 4", "luspo");
}

#[test]
fn cispo_with_shared_prompts() {
    let optim = "micro_batch = 4\nshare_prompt = true";
    same_as_one_process(2, "loss_type = \"cispo\"", optim, "cispo");
}

#[test]
fn sapo() {
    same_as_one_process(2, "loss_type = \"sapo\"", "micro_batch = 4", "sapo");
}

#[test]
fn vespo() {
    same_as_one_process(2, "loss_type = \"vespo\"", "micro_batch = 4", "vespo");
}

#[test]
fn episode_mode() {
    // Whole trajectories: each process plays its prompts' episodes on streams keyed by
    // the prompt's index in the step.
    let env = "mode = \"episode\"\nmax_turn_tokens = 12";
    same_as_one_process_with(2, "loss_type = \"dapo\"", "", env, "episode");
}

#[test]
fn a_dataset_scored_by_a_reward_program() {
    // each process asks its own program for its own prompts' answers, one exchange a step
    let program = tempfile::tempdir().unwrap();
    std::fs::write(
        program.path().join("reward.sh"),
        crate::util::REWARD_PROGRAM,
    )
    .unwrap();
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/data/arithmetic.jsonl");
    let dataset = |text: String| {
        let at = text.find("[env]").unwrap();
        format!(
            "{}[env]\nname = \"dataset\"\n[env.options]\npath = {:?}\nverifier = \"numeric\"\n\
             [env.options.reward]\ncommand = [\"sh\", \"reward.sh\"]\ndir = {:?}\nweight = 0.1\n",
            &text[..at],
            data.display().to_string(),
            program.path().display().to_string()
        )
    };
    same_as_one_process_edited(2, "loss_type = \"dapo\"", "", dataset, "dataset");
}

#[test]
fn lora_dropout_entropy_mask_and_entropy_bonus() {
    // All three are drawn or normalised per micro-batch: dropout masks from the
    // micro-batch's seed, the top-entropy quantile over its tokens, the bonus over its
    // mean. The ranks run the one-process micro-batches with their indices, so the run
    // must still match. The SFT adapter was trained without dropout; a copy whose
    // adapter_config.json says 0.1 carries dropout into this run.
    let (_, sft) = sft_adapter();
    let dir = tempfile::tempdir().unwrap();
    let adapter = dir.path().join("sft-dropout");
    std::fs::create_dir(&adapter).unwrap();
    for f in ["adapter_model.safetensors", "adapter_config.json"] {
        std::fs::copy(sft.join(f), adapter.join(f)).unwrap();
    }
    let cfg_path = adapter.join("adapter_config.json");
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cfg_path).unwrap()).unwrap();
    assert_eq!(cfg["lora_dropout"], 0.0, "the SFT adapter's own dropout");
    cfg["lora_dropout"] = 0.1.into();
    std::fs::write(&cfg_path, cfg.to_string()).unwrap();
    let from = format!("adapter = \"{}\"", sft.display());
    let to = format!("adapter = \"{}\"", adapter.display());
    let grpo = "loss_type = \"dapo\"\ntop_entropy_quantile = 0.5\nentropy_coef = 0.01";
    let Some(runs) = same_as_one_process_edited(
        2,
        grpo,
        "micro_batch = 4",
        |text| {
            assert!(text.contains(&from));
            text.replace(&from, &to)
        },
        "dropout",
    ) else {
        return;
    };
    // The trained adapter records the dropout it was trained with.
    let written = std::fs::read_to_string(runs.path().join("dropout-np2/adapter_config.json"));
    let written: serde_json::Value = serde_json::from_str(&written.unwrap()).unwrap();
    assert_eq!(written["lora_dropout"], 0.1);
}

#[test]
fn three_processes_and_one_under_mpirun() {
    // Three processes take one prompt each; one process under mpirun is the plain run.
    same_as_one_process(3, "loss_type = \"dapo\"", "micro_batch = 2", "np3");
    same_as_one_process(1, "loss_type = \"dapo\"", "", "np1");
}

#[test]
fn a_resumed_two_process_run_continues_identically() {
    let Some(bin) = mpi_concord() else { return };
    let dir = tempfile::tempdir().unwrap();
    let grpo = "loss_type = \"dapo\"\nnum_iterations = 2";
    let straight = config(dir.path(), "straight", grpo, "micro_batch = 4", 4);
    let cut = config(dir.path(), "cut", grpo, "micro_batch = 4", 4);
    for c in [&straight, &cut] {
        let text = with_eval(std::fs::read_to_string(c).unwrap());
        std::fs::write(c, text).unwrap();
    }
    for (c, what) in [(&straight, "straight run"), (&cut, "run to cut")] {
        ok(
            mpirun(bin, 2, &["train", "--config", c.to_str().unwrap()]),
            what,
        );
    }
    // As if the job had died after step 2: only checkpoint-2 remains.
    let cut_dir = dir.path().join("cut");
    std::fs::remove_dir_all(cut_dir.join("checkpoint-4")).unwrap();
    let resumed = ok(
        mpirun(bin, 2, &["train", "--resume", cut_dir.to_str().unwrap()]),
        "resumed run",
    );
    let err = String::from_utf8_lossy(&resumed.stderr);
    assert!(err.contains("from step 2"), "{err}");
    assert_same_run(&dir.path().join("straight"), &cut_dir, "resumed at step 2");
}

/// The pids of `mpirun`'s children running `concord`, by MPI rank.
fn ranks_of(mpirun_pid: u32) -> BTreeMap<usize, u32> {
    let mut out = BTreeMap::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // pid (comm) state ppid ...
        let after = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
        let ppid: u32 = after
            .split_whitespace()
            .nth(1)
            .and_then(|p| p.parse().ok())
            .unwrap_or(0);
        if ppid != mpirun_pid {
            continue;
        }
        let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        for var in env.split(|&b| b == 0) {
            let var = String::from_utf8_lossy(var);
            if let Some(r) = var.strip_prefix("OMPI_COMM_WORLD_RANK=") {
                out.insert(r.parse().unwrap(), pid);
            }
        }
    }
    out
}

/// Start a long two-process run; once its first step is logged, do `to_rank_1` to rank
/// 1; the job must end, with an error, within `limit`. Returns its stderr.
fn job_ends_after(signal: &str, timeout_var: Option<&str>, limit: Duration) -> Option<String> {
    let bin = mpi_concord()?;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), "long", "loss_type = \"dapo\"", "", 500);
    let mut c = mpirun(bin, 2, &["train", "--config", cfg.to_str().unwrap()]);
    if let Some(t) = timeout_var {
        c.env("CONCORD_DIST_TIMEOUT", t);
    }
    let mut child = c
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let log = dir.path().join("long").join("training_log.csv");
    let t0 = Instant::now();
    while std::fs::read_to_string(&log).map_or(0, |t| t.lines().count()) < 2 {
        assert!(t0.elapsed() < Duration::from_secs(600), "no step logged");
        if child.try_wait().unwrap().is_some() {
            let mut err = String::new();
            std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
            panic!("the job ended before its first step was logged:\n{err}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let ranks = ranks_of(child.id());
    let victim = ranks.get(&1).copied().expect("rank 1's pid");
    let killed = Command::new("kill")
        .args([signal, &victim.to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let t1 = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if t1.elapsed() > limit {
            let _ = Command::new("kill")
                .args(["-9", &victim.to_string()])
                .status();
            let _ = child.kill();
            panic!("the job still runs {limit:?} after rank 1 got {signal}");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(!status.success(), "the job reported success");
    let mut err = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
    Some(err)
}

#[test]
fn a_killed_process_ends_the_job() {
    let Some(err) = job_ends_after("-KILL", None, Duration::from_secs(60)) else {
        return;
    };
    assert!(err.contains("signal 9") || err.contains("Killed"), "{err}");
}

#[test]
fn a_stuck_process_ends_the_job_after_the_timeout() {
    // A stopped rank 1 neither dies nor answers: rank 0's watchdog ends the job. The
    // limit leaves room for the waits of a healthy run on a loaded machine.
    let Some(err) = job_ends_after("-STOP", Some("30"), Duration::from_secs(150)) else {
        return;
    };
    assert!(
        err.contains("waited") && err.contains("CONCORD_DIST_TIMEOUT=30"),
        "{err}"
    );
}

#[test]
fn a_build_without_mpi_refuses_an_mpirun_launch() {
    if Command::new("mpirun").arg("--version").output().is_err() {
        eprintln!("SKIPPED: mpirun is not installed");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), "refused", "", "", 1);
    let out = mpirun(
        Path::new(env!("CARGO_BIN_EXE_concord")),
        2,
        &["train", "--config", cfg.to_str().unwrap()],
    )
    .output()
    .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("built without MPI") && err.contains("--features mpi"),
        "{err}"
    );
}

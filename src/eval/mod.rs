//! `concord eval`: play held-out episodes with the model in the policy seats and
//! report reward components, win rates and 95% confidence intervals, for the base
//! model, an adapter, or both on the same seeds (`--compare`).
//!
//! Episodes come from seeds with [`envs::HELD_OUT_BIT`] set, which training never
//! draws. Every sampled action has its own RNG stream keyed by (episode, round, seat),
//! so results do not depend on how episodes are batched, and base and adapter face
//! the same episodes with the same random numbers.
use crate::config::Config;
use crate::envs::rollout::{self, Policy};
use crate::envs::{self, BehaviourSummary, EnvFactory, Environment, Recorder};
use crate::model::Transformer;
use crate::rng::mix_seeds as mix;
use crate::sample::ChooseOn;
use crate::sample::SamplingParams;
use crate::task::episode::{play_episodes, EpisodeStart, EpisodeTask, Played};
use crate::task::policy::{ModelPolicy, Progress};
use crate::task::Renderer;
use anyhow::{bail, Context, Result};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub use crate::run::eval_report::{EnvEval, EvalReport, ModelEval, EVAL_JSON};
pub use outcomes::{mean_ci, Outcomes};
pub use tables::{behaviour_table, decisions_path, table};
use tables::{sibling_path, write_decisions};

mod outcomes;
pub mod references;
mod tables;

/// What `concord eval` evaluates, and how.
#[derive(Debug, Clone)]
pub struct EvalOptions {
    /// The run configuration: model, environments (those of the last stage), sampling.
    pub config: PathBuf,
    /// `section.key=value` overrides, as for `train`.
    pub sets: Vec<String>,
    /// PEFT adapter directory (default: [`default_adapter`], in the config's run
    /// directory).
    pub adapter: Option<PathBuf>,
    /// Evaluate the base model without any adapter.
    pub base: bool,
    /// Evaluate the run's start (the base model, or the adapter it started from:
    /// `model.adapter` or its `[sft] warm_start`) and its adapter on the same seeds.
    pub compare: bool,
    /// Episodes per environment.
    pub episodes: usize,
    /// Index of the first held-out episode (0: the default set; another value gives
    /// other held-out episodes).
    pub first_seed: u64,
    /// Greedy decoding instead of the config's sampling parameters.
    pub greedy: bool,
    /// Print the report as JSON.
    pub json: bool,
    /// Where to write eval.json (default: into the adapter's directory).
    pub out: Option<PathBuf>,
    /// Prompts sampled together.
    pub batch: usize,
    /// An earlier eval.json of the same episodes and sampling: its models are not
    /// played again but reported beside the ones played now (e.g. `--base` once, then
    /// every adapter against it).
    pub against: Option<PathBuf>,
    /// Also write every episode's transcript (the model's raw texts included) beside
    /// the report.
    pub transcripts: bool,
}

/// The environments evaluated: those of the last stage (or `[env]`), with its options.
pub fn eval_envs(cfg: &Config) -> Result<Vec<(String, Box<dyn EnvFactory>)>> {
    let names_opts: Vec<(String, envs::Options)> = match cfg.stages.last() {
        None => {
            let env = cfg
                .env
                .as_ref()
                .context("missing [env] (or [[stage]] tables)")?;
            return Ok(vec![(env.label(), env.factory()?)]);
        }
        Some(s) if crate::config::stage::trains_server(cfg, s) => {
            let env = crate::config::stage::resolve_config(cfg, s)?
                .env
                .context("a stage without [env]")?;
            return Ok(vec![(env.label(), env.factory()?)]);
        }
        Some(s) => crate::config::stage::stage_envs(cfg, s)?
            .into_iter()
            .map(|(name, _weight, opts)| (name, opts))
            .collect(),
    };
    names_opts
        .into_iter()
        .map(|(n, opts)| {
            let f = envs::create(&n, &opts)?;
            Ok((n, f))
        })
        .collect()
}

/// One evaluated environment, played with the driver its run trains with: a
/// decision-mode run's model answers a freshly rendered observation each turn
/// ([`play`]); an episode-mode run's model plays each held-out episode as one growing
/// conversation, environment turns appended, exactly as in training
/// ([`crate::task::episode::play_episodes`], [`play_trajectories`]).
pub enum Target {
    Decisions(Box<dyn EnvFactory>),
    Episodes(EpisodeTask),
}

impl Target {
    /// [`EnvFactory::resolved_options`] of the environment played, and the driver.
    pub fn resolved_options(&self) -> Option<serde_json::Value> {
        let (f, mode) = match self {
            Target::Decisions(f) => (f.as_ref(), "decision"),
            Target::Episodes(t) => (t.factory(), "episode"),
        };
        let mut v = f.resolved_options()?;
        v.as_object_mut()?.insert("mode".into(), mode.into());
        Some(v)
    }
    /// Play `episodes` held-out episodes from held-out index `first_seed`.
    pub fn play(
        &self,
        model: &Transformer,
        renderer: &dyn Renderer,
        episodes: usize,
        first_seed: u64,
        params: &SamplingParams,
        batch: usize,
    ) -> Result<Outcomes> {
        let seeds = held_out(episodes, first_seed)?;
        self.play_seeds(model, renderer, &seeds, params, batch)
    }

    /// Play the episodes of `seeds`, whatever they are: held-out ones for a report, or
    /// a training seed to replay what a step drew.
    pub fn play_seeds(
        &self,
        model: &Transformer,
        renderer: &dyn Renderer,
        seeds: &[EpisodeSeed],
        params: &SamplingParams,
        batch: usize,
    ) -> Result<Outcomes> {
        match self {
            Target::Decisions(f) => play(model, renderer, f.as_ref(), seeds, params, batch),
            Target::Episodes(t) => {
                let played = play_trajectories(model, renderer, t, seeds, params, batch)?;
                Ok(summarise_trajectories(played))
            }
        }
    }
}

/// One episode to play: its label in the report (the held-out index) and its seed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EpisodeSeed {
    pub label: u64,
    pub seed: u64,
}

/// The held-out episodes `first_seed .. first_seed + episodes`.
pub fn held_out(episodes: usize, first_seed: u64) -> Result<Vec<EpisodeSeed>> {
    let end = first_seed
        .checked_add(episodes as u64)
        .filter(|&e| e <= envs::HELD_OUT_BIT)
        .context("--first-seed + --episodes runs past the held-out seeds (2^63)")?;
    Ok((first_seed..end)
        .map(|label| EpisodeSeed {
            label,
            seed: envs::eval_seed(label),
        })
        .collect())
}

/// [`eval_envs`], each with the driver of the last stage's mode (or `[env] mode`).
pub fn eval_targets(cfg: &Config) -> Result<Vec<(String, Target)>> {
    let env = match cfg.stages.last() {
        Some(s) => crate::config::stage::resolve_config(cfg, s)?.env,
        None => cfg.env.clone(),
    };
    let episode = env.filter(|e| e.is_episode());
    Ok(eval_envs(cfg)?
        .into_iter()
        .map(|(name, f)| {
            let target = match &episode {
                Some(e) => Target::Episodes(
                    EpisodeTask::from_factory(f, e.shaped_rewards)
                        .with_max_turn_tokens(e.max_turn_tokens),
                ),
                None => Target::Decisions(f),
            };
            (name, target)
        })
        .collect())
}

/// An episode played by the episode driver: each policy seat's start and trajectory.
pub struct PlayedEpisode {
    pub label: u64,
    pub seats: Vec<(Option<usize>, Played)>,
}

/// Episodes played as an episode-mode run trains: each policy seat's trajectory one
/// conversation within the `max_completion_length` budget, one sample per episode,
/// `batch` episodes at a time. Episode `i`'s seats sample from streams numbered by their
/// position in `seeds`, so the batch size changes nothing, and a training seed played
/// first gives the trajectory the step sampled first ([`crate::grpo::batch::collect`]
/// with the same sampling seed).
pub fn play_trajectories(
    model: &Transformer,
    renderer: &dyn Renderer,
    task: &EpisodeTask,
    seeds: &[EpisodeSeed],
    params: &SamplingParams,
    batch: usize,
) -> Result<Vec<PlayedEpisode>> {
    let mut out = Vec::with_capacity(seeds.len());
    let mut stream = 0usize;
    let start = std::time::Instant::now();
    for chunk in seeds.chunks(batch.max(1)) {
        let mut prompts = Vec::new();
        let mut spans = Vec::new();
        for s in chunk {
            let first = prompts.len();
            prompts.extend(task.starts(s.seed, renderer)?);
            spans.push((s.label, first..prompts.len()));
        }
        let (played, _) = play_episodes(
            model,
            renderer,
            task,
            &prompts,
            1,
            params,
            stream,
            ChooseOn::Auto,
        )?;
        let mut played = played.into_iter().map(|mut g| g.swap_remove(0));
        for (label, span) in spans {
            let seats = prompts[span]
                .iter()
                .map(|p| p.state.downcast_ref::<EpisodeStart>().map(|s| s.seat))
                .zip(played.by_ref())
                .collect();
            out.push(PlayedEpisode { label, seats });
        }
        stream += prompts.len();
        crate::note!(
            "  {} of {} episodes played, {:.0} s",
            out.len(),
            seeds.len(),
            start.elapsed().as_secs_f64()
        );
    }
    Ok(out)
}

/// The outcomes of played trajectories, with each episode's transcript.
fn summarise_trajectories(played: Vec<PlayedEpisode>) -> Outcomes {
    let mut out = Outcomes {
        episodes: played.len(),
        ..Outcomes::default()
    };
    let (mut truncated, mut turns) = (0usize, 0usize);
    for ep in played {
        let mut seats = Vec::new();
        for (seat, pl) in ep.seats {
            truncated += pl.trajectory.truncated as usize;
            turns += pl.trajectory.model_turns;
            out.rewards.push(pl.reward.scalar);
            out.wins.push(pl.won);
            out.components.push(pl.reward.components.clone());
            seats.push(serde_json::json!({
                "seat": seat,
                "reward": pl.reward.scalar,
                "components": pl.reward.components,
                "texts": pl.texts,
                "truncated": pl.trajectory.truncated,
            }));
        }
        out.transcripts
            .push(serde_json::json!({"episode": ep.label, "seats": seats}));
    }
    crate::note!(
        "  episode driver: {turns} model turns, {truncated} of {} trajectories truncated",
        out.rewards.len()
    );
    out
}

/// Episodes open at once in [`play`] and [`play_policy_on`]: a large evaluation holds
/// this many live episodes (their states, prompts and KV caches), not all of them.
pub const EVAL_CHUNK: usize = 1024;

/// Play the episodes of `seeds` of `factory` with `model` (as it is: adapter on or
/// off) in every policy seat, `batch` prompts per sampling call: the decision-mode
/// driver, the one training's model-played draws and continuations use. Episode `i`
/// samples from streams numbered `i`, so playing them [`EVAL_CHUNK`] at a time gives
/// what playing them all at once would.
pub fn play(
    model: &Transformer,
    renderer: &dyn Renderer,
    factory: &dyn EnvFactory,
    seeds: &[EpisodeSeed],
    params: &SamplingParams,
    batch: usize,
) -> Result<Outcomes> {
    let mut out = Outcomes::default();
    let (mut prompt_tokens, mut reused_tokens) = (0, 0);
    for (k, chunk) in seeds.chunks(EVAL_CHUNK).enumerate() {
        let mut policy = ModelPolicy::new(model, renderer, params, batch);
        policy.first_episode = (k * EVAL_CHUNK) as u64;
        out.append(play_slice(factory, chunk, &mut policy)?, k * EVAL_CHUNK);
        prompt_tokens += policy.prompt_tokens;
        reused_tokens += policy.reused_tokens;
    }
    out.behaviour = behaviour_of(factory, seeds, &out.decisions);
    crate::note!(
        "  prompts: {} tokens, {} of them ({:.0}%) kept from a shared prefix or the session's last prompt",
        prompt_tokens,
        reused_tokens,
        100.0 * reused_tokens as f64 / prompt_tokens.max(1) as f64
    );
    Ok(out)
}

/// [`play`] with any action source on `episodes` held-out episodes from held-out index
/// `first_seed`.
pub fn play_policy(
    factory: &dyn EnvFactory,
    episodes: usize,
    first_seed: u64,
    policy: impl Policy,
) -> Result<Outcomes> {
    play_policy_on(factory, &held_out(episodes, first_seed)?, policy)
}

/// [`play`] with any action source: the episodes, the decisions recorded for the
/// behaviour report, and each policy seat's outcome, [`EVAL_CHUNK`] episodes at a time.
pub fn play_policy_on(
    factory: &dyn EnvFactory,
    seeds: &[EpisodeSeed],
    mut policy: impl Policy,
) -> Result<Outcomes> {
    let mut out = Outcomes::default();
    for (k, chunk) in seeds.chunks(EVAL_CHUNK).enumerate() {
        out.append(play_slice(factory, chunk, &mut policy)?, k * EVAL_CHUNK);
    }
    out.behaviour = behaviour_of(factory, seeds, &out.decisions);
    Ok(out)
}

/// The episodes of `seeds`, all open at once, played to their ends by `policy`.
fn play_slice(
    factory: &dyn EnvFactory,
    seeds: &[EpisodeSeed],
    policy: impl Policy,
) -> Result<Outcomes> {
    let mut eps: Vec<Box<dyn Environment>> = seeds.iter().map(|s| factory.reset(s.seed)).collect();
    let mut recorder = Recorder::new(Progress::new(policy, seeds.len()));
    let mut refs: Vec<&mut dyn Environment> = eps
        .iter_mut()
        .map(|e| -> &mut dyn Environment { e.as_mut() })
        .collect();
    rollout::play(&mut refs, &mut recorder, MAX_EVAL_ROUNDS)?;
    drop(refs);
    if let Some(e) = eps.iter().find(|e| !e.done()) {
        bail!(
            "{}: episodes did not end after {MAX_EVAL_ROUNDS} rounds",
            e.name()
        );
    }
    let mut out = Outcomes {
        episodes: seeds.len(),
        ..Outcomes::default()
    };
    for (s, e) in seeds.iter().zip(&eps) {
        let mut seats = Vec::new();
        for s in e.policy_seats() {
            let r = e.reward(s);
            seats.push(
                serde_json::json!({"seat": s, "reward": r.scalar, "components": r.components}),
            );
            out.rewards.push(r.scalar);
            out.wins.push(e.won(s));
            out.components.push(r.components);
        }
        out.transcripts.push(serde_json::json!({
            "episode": s.label,
            "seats": seats,
            "transcript": e.transcript(),
        }));
    }
    out.decisions = recorder.records;
    Ok(out)
}

/// The behaviour summary of `decisions`, where `factory`'s episodes have the capability.
fn behaviour_of(
    factory: &dyn EnvFactory,
    seeds: &[EpisodeSeed],
    decisions: &[crate::envs::behaviour::DecisionRecord],
) -> Option<crate::envs::BehaviourSummary> {
    let fresh = factory.reset(seeds.first()?.seed);
    let b = fresh.as_behaviour()?;
    BehaviourSummary::from_records(b.reference_policy(), &b.actions(), decisions)
}

/// Rounds after which an evaluated episode is taken to be stuck.
const MAX_EVAL_ROUNDS: u64 = 100_000;

/// The sampling parameters of an evaluation: the last stage's (its overrides applied),
/// or greedy decoding.
pub fn sampling(cfg: &Config, greedy: bool, stop_ids: Vec<u32>) -> Result<SamplingParams> {
    // The last stage's sampling keys (its overrides applied).
    let g = match cfg.stages.last() {
        Some(s) => crate::config::stage::resolve_config(cfg, s)?.grpo,
        None => cfg.grpo.clone(),
    };
    let mut p = g.sampling_params(stop_ids, mix(cfg.run.seed, 0xE7A1));
    if greedy {
        p.temperature = 0.0;
    }
    Ok(p)
}

/// Where a published page keeps its run's adapter, inside the run directory.
pub const PUBLISHED_ADAPTER_DIR: &str = "adapter";

/// Where a run's supervised warm start is, inside its run directory: `sft/` as the run
/// wrote it ([`crate::config::WARM_START_DIR`]), `sft_adapter/` as a page publishes it.
const WARM_START_DIRS: [&str; 2] = [crate::config::WARM_START_DIR, "sft_adapter"];

/// Files of a run directory that show GRPO training beside a warm start (a page
/// publishes the log as `grpo_training_log.csv`).
const GRPO_TRACES: [&str; 3] = ["training_log.csv", "grpo_training_log.csv", "samples.jsonl"];

/// The adapter `concord eval` evaluates without `--adapter` (or `--base`), in the
/// config's run directory (`output_dir/name`; a published config.toml names its own
/// directory): the directory itself when it holds adapter_model.safetensors, else its
/// `adapter/` folder (where a published page keeps it). A run directory with neither,
/// whose one trained adapter is its supervised warm start (`sft/`, or `sft_adapter/` on
/// a page) and which shows no GRPO training (no training log, samples or checkpoint),
/// gives that warm start, with a note; anything else is an error naming the paths
/// looked at.
pub fn default_adapter(cfg: &Config) -> Result<PathBuf> {
    use crate::model::lora::ADAPTER_WEIGHTS;
    let dir = cfg.run_dir();
    let has_adapter = |d: &Path| d.join(ADAPTER_WEIGHTS).is_file();
    let published = dir.join(PUBLISHED_ADAPTER_DIR);
    for d in [&dir, &published] {
        if has_adapter(d) {
            return Ok(d.clone());
        }
    }
    let warm: Vec<PathBuf> = WARM_START_DIRS
        .iter()
        .map(|n| dir.join(n))
        .filter(|d| has_adapter(d))
        .collect();
    let mut trained: Vec<String> = GRPO_TRACES
        .iter()
        .filter(|n| dir.join(n).exists())
        .map(|n| n.to_string())
        .collect();
    let mut checkpoints = crate::run::checkpoint::list(&dir)?;
    checkpoints.sort();
    trained.extend(checkpoints.iter().map(|(n, _)| format!("checkpoint-{n}")));
    if let ([only], true) = (warm.as_slice(), trained.is_empty()) {
        crate::note!(
            "no adapter in {} (the config's run directory) and no GRPO training there: \
             evaluating its supervised warm start {}",
            dir.display(),
            only.display()
        );
        return Ok(only.clone());
    }
    let why = match warm.as_slice() {
        [] => String::new(),
        [w] => format!(
            "; its warm start {} is not the run's adapter (the run went on to GRPO: {})",
            w.display(),
            trained.join(", ")
        ),
        _ => format!(
            "; it holds more than one warm start ({})",
            warm.iter()
                .map(|w| w.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    bail!(
        "no adapter to evaluate in {} (the config's run directory): looked for {} and \
         {}{why}; give --adapter DIR, or --base",
        dir.display(),
        dir.join(ADAPTER_WEIGHTS).display(),
        published.join(ADAPTER_WEIGHTS).display()
    )
}

/// `p` as the file system resolves it, or as it is where it does not exist.
fn canonical(p: &Path) -> PathBuf {
    std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf())
}

/// What `--compare` measures `adapter` against (None: the base model). The run's start
/// ([`Config::start_adapter`]: its warm start `RUN_DIR/sft`, else `model.adapter`), or,
/// when that holds no adapter, `model.adapter` (where a published config names the
/// published copy of its warm start). The base model, with a note saying why, when
/// neither holds an adapter, or when the start found is the evaluated adapter itself.
pub fn compare_start(cfg: &Config, adapter: Option<&Path>) -> Option<PathBuf> {
    use crate::model::lora::ADAPTER_WEIGHTS;
    let named = cfg.start_adapter()?;
    let found = std::iter::once(named.clone())
        .chain(cfg.model.adapter.clone())
        .find(|d| d.join(ADAPTER_WEIGHTS).is_file());
    let Some(start) = found else {
        // Evaluating a published adapter without its run: the start it was trained from
        // is not here, so the comparison is with the base model, and says so.
        crate::note!(
            "--compare: the run's start adapter {} is not here; comparing with the base model",
            named.display()
        );
        return None;
    };
    if adapter.is_some_and(|a| canonical(a) == canonical(&start)) {
        crate::note!(
            "--compare: the run's start adapter {} is the adapter evaluated; comparing with \
             the base model",
            start.display()
        );
        return None;
    }
    if start != named {
        crate::note!(
            "--compare: the run's warm start {} is not here; comparing with model.adapter {}",
            named.display(),
            start.display()
        );
    }
    Some(start)
}

pub fn run_eval(args: EvalOptions) -> Result<()> {
    let cfg = Config::load(&args.config, &args.sets)?;
    if args.episodes == 0 {
        bail!("--episodes must be >= 1");
    }
    let adapter = if args.base {
        None
    } else {
        Some(match &args.adapter {
            Some(a) => a.clone(),
            None => default_adapter(&cfg)?,
        })
    };
    if args.transcripts && args.base && args.out.is_none() {
        bail!("--transcripts are written beside the report: give --out FILE with --base");
    }
    let out = args
        .out
        .clone()
        .or_else(|| adapter.as_ref().map(|a| a.join(EVAL_JSON)));
    if let Some(p) = &out {
        // every file the evaluation ends by writing, checked before it plays
        let mut files = vec![p.clone(), decisions_path(p)];
        if args.transcripts {
            files.push(sibling_path(p, "transcripts"));
        }
        for f in &files {
            crate::atomic::check_writable(f).context("eval output")?;
        }
    }
    let envs = eval_targets(&cfg)?;
    // Each model evaluated is loaded in turn below: the run's start (`model.adapter`)
    // is not loaded first, so evaluating an adapter never needs the start it was
    // trained from (a published page keeps its adapter, not always its start).
    let mut spec = cfg.model_spec()?;
    spec.adapter = None;
    let (mut model, renderer) = crate::model::load::load_with_renderer(&spec)?;
    let params = sampling(&cfg, args.greedy, renderer.stop_ids())?;
    // A run that started from an adapter (`model.adapter`, or an `[sft] warm_start`)
    // is compared with that start: the `base` entry is then the start adapter, so the
    // delta is what the run itself added.
    let start = match args.compare {
        true => compare_start(&cfg, adapter.as_deref()),
        false => None,
    };
    let mut labels: Vec<(&str, Option<&Path>)> = Vec::new();
    if args.base {
        labels.push(("base", None));
    } else if args.compare {
        labels.push(("base", start.as_deref()));
    }
    if let Some(a) = &adapter {
        labels.push(("adapter", Some(a.as_path())));
    }
    let mut report = EvalReport {
        config: args.config.display().to_string(),
        episodes: args.episodes,
        greedy: args.greedy,
        first_seed: envs::eval_seed(args.first_seed),
        sampling: Some(params.clone()),
        env_options: envs
            .iter()
            .filter_map(|(name, t)| Some((name.clone(), t.resolved_options()?)))
            .collect(),
        models: BTreeMap::new(),
    };
    if let Some(path) = &args.against {
        let earlier = EvalReport::read(path).with_context(|| {
            format!(
                "--against {}: expected an eval.json written by `concord eval`",
                path.display()
            )
        })?;
        report
            .check_comparable(&earlier)
            .with_context(|| format!("--against {}", path.display()))?;
        // An earlier model is reused only when it is the same model: the same label and
        // the same adapter directory. Another run's `adapter` is a different model: it is
        // played, and the earlier one is kept beside it as `adapter (ITS DIR)`.
        let same_dir = |a: Option<&str>, b: Option<&Path>| match (a, b) {
            (None, None) => true,
            (Some(a), Some(b)) => canonical(Path::new(a)) == canonical(b),
            _ => false,
        };
        labels.retain(|(label, dir)| {
            !earlier
                .models
                .get(*label)
                .is_some_and(|m| same_dir(m.adapter.as_deref(), *dir))
        });
        for (label, m) in earlier.models {
            let key = if labels.iter().any(|(l, _)| *l == label) {
                format!("{label} ({})", m.adapter.as_deref().unwrap_or("no adapter"))
            } else {
                label
            };
            report.models.insert(key, m);
        }
    }
    let mut decisions: Vec<serde_json::Value> = Vec::new();
    let mut transcripts: Vec<serde_json::Value> = Vec::new();
    for (label, dir) in labels {
        match dir {
            Some(d) => model
                .load_adapter(d)
                .with_context(|| format!("loading adapter {}", d.display()))?,
            None => model.set_adapter_enabled(false),
        }
        let mut per_env = BTreeMap::new();
        for (name, target) in &envs {
            if !args.json {
                crate::note!("{label}: {name}, {} episodes", args.episodes);
            }
            let o = target.play(
                &model,
                renderer.as_ref(),
                args.episodes,
                args.first_seed,
                &params,
                args.batch,
            )?;
            per_env.insert(name.clone(), o.summarise());
            for d in &o.decisions {
                decisions.push(serde_json::json!({"model": label, "env": name, "decision": d}));
            }
            if args.transcripts {
                for t in &o.transcripts {
                    transcripts
                        .push(serde_json::json!({"model": label, "env": name, "episode": t}));
                }
            }
        }
        report.models.insert(
            label.to_string(),
            ModelEval {
                adapter: dir.map(|d| d.display().to_string()),
                envs: per_env,
            },
        );
    }
    if let Some(p) = &out {
        report.write(p)?;
        if !decisions.is_empty() {
            write_decisions(&decisions_path(p), &decisions)?;
        }
        if args.transcripts {
            write_decisions(&sibling_path(p, "transcripts"), &transcripts)?;
        }
    }
    if args.json {
        crate::say!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        crate::say_raw!("{}", table(&report));
        crate::say_raw!("{}", behaviour_table(&report));
        if let Some(p) = &out {
            crate::say!("wrote {}", p.display());
        }
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A scripted policy of the environment in every policy seat.
    fn scripted(name: &'static str) -> impl Policy {
        rollout::EachTurn(move |env: &mut dyn Environment, seat| env.policy_action(name, seat))
    }

    pub(crate) fn behaviour_of(env: &str, opts: &[(&str, &str)], policy: &'static str) -> Outcomes {
        let mut o = envs::Options::new();
        for (k, v) in opts {
            o.insert(k.to_string(), (*v).into());
        }
        let f = envs::create(env, &o).unwrap();
        play_policy(f.as_ref(), 60, 0, scripted(policy)).unwrap()
    }

    #[test]
    fn behaviour_report_of_the_reference_and_of_constants() {
        let cases = [
            ("ticketmelt", vec![], ["always_a", "always_monitor"]),
            (
                "ticketmelt",
                vec![("prompt", "compact")],
                ["always_b", "always_a"],
            ),
            ("merge_ring", vec![], ["always_bypass", "always_early"]),
            (
                "merge_ring",
                vec![("regime", "switching")],
                ["always_early", "always_bypass"],
            ),
        ];
        for (env, opts, constants) in cases {
            let reference = behaviour_of(env, &opts, "heuristic");
            let b = reference.behaviour.clone().unwrap();
            assert_eq!(b.agreement, 1.0, "{env}: the reference agrees with itself");
            assert!(b.mutual_information_bits > 0.3, "{env}: {b:?}");
            assert!(b.best_constant.agreement < 0.9, "{env}: {b:?}");
            assert!(b.situations.len() >= 4, "{env}: {:?}", b.situations.keys());
            for c in constants {
                let o = behaviour_of(env, &opts, c);
                let b = o.behaviour.unwrap();
                assert_eq!(b.mutual_information_bits, 0.0, "{env} {c}");
                assert_eq!(b.actions.len(), 1, "{env} {c}: {:?}", b.actions);
                // Agreement is the share of decisions whose reference accepts the action.
                let action = b.actions.keys().next().unwrap().clone();
                let share = o
                    .decisions
                    .iter()
                    .filter(|d| d.reference.contains(&action))
                    .count() as f64
                    / o.decisions.len() as f64;
                assert_eq!(b.agreement, share, "{env} {c}");
                assert!(b.agreement <= b.best_constant.agreement, "{env} {c}");
            }
            // Deterministic per seed.
            assert_eq!(behaviour_of(env, &opts, "heuristic"), reference, "{env}");
        }
    }

    #[test]
    fn first_seed_past_the_held_out_range_is_refused() {
        let f = envs::create("ticketmelt", &envs::Options::new()).unwrap();
        let e = play_policy(f.as_ref(), 2, u64::MAX - 1, scripted("heuristic"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("--first-seed"), "{e}");
    }
}

//! `concord eval`: play held-out episodes with the model in the policy seats and
//! report reward components, win rates and 95% confidence intervals, for the base
//! model, an adapter, or both on the same seeds (`--compare`).
//!
//! Episodes come from seeds with [`envs::HELD_OUT_BIT`] set, which training never
//! draws. Every sampled action has its own RNG stream keyed by (episode, round, seat),
//! so results do not depend on how episodes are batched, and base and adapter face
//! the same episodes with the same random numbers.
use crate::config::Config;
use crate::envs::rollout::{self, Policy, Turn};
use crate::envs::{
    self, wilson_ci, BehaviourSummary, DecisionRecord, EnvFactory, Environment, Recorder,
};
use crate::model::qwen2::Qwen2;
use crate::rng::mix_seeds as mix;
use crate::sample::ChooseOn;
use crate::sample::{self, GroupRequest, PromptKv, SamplingParams};
use crate::task::episode::{play_episodes, EpisodeStart, EpisodeTask};
use crate::task::Renderer;
use anyhow::{bail, Context, Result};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

pub use crate::run::eval_report::{EnvEval, EvalReport, ModelEval, EVAL_JSON};

/// What `concord eval` evaluates, and how.
#[derive(Debug, Clone)]
pub struct EvalOptions {
    /// The run configuration: model, environments (those of the last stage), sampling.
    pub config: PathBuf,
    /// `section.key=value` overrides, as for `train`.
    pub sets: Vec<String>,
    /// PEFT adapter directory (default: the config's run directory).
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
    /// Play `episodes` held-out episodes from held-out index `first_seed`.
    #[allow(clippy::too_many_arguments)]
    pub fn play(
        &self,
        model: &Qwen2,
        renderer: &dyn Renderer,
        episodes: usize,
        first_seed: u64,
        params: &SamplingParams,
        batch: usize,
    ) -> Result<Outcomes> {
        match self {
            Target::Decisions(f) => play(
                model,
                renderer,
                f.as_ref(),
                episodes,
                first_seed,
                params,
                batch,
            ),
            Target::Episodes(t) => {
                play_trajectories(model, renderer, t, episodes, first_seed, params, batch)
            }
        }
    }
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

/// Held-out episodes played as an episode-mode run trains: each policy seat's
/// trajectory one conversation within the `max_completion_length` budget, one sample
/// per episode, `batch` episodes at a time. Episode `i`'s seats sample from streams
/// numbered by their position in the whole set, so the batch size changes nothing.
pub fn play_trajectories(
    model: &Qwen2,
    renderer: &dyn Renderer,
    task: &EpisodeTask,
    episodes: usize,
    first_seed: u64,
    params: &SamplingParams,
    batch: usize,
) -> Result<Outcomes> {
    let end = first_seed
        .checked_add(episodes as u64)
        .filter(|&e| e <= envs::HELD_OUT_BIT)
        .context("--first-seed + --episodes runs past the held-out seeds (2^63)")?;
    let seeds: Vec<u64> = (first_seed..end).collect();
    let mut out = Outcomes {
        episodes,
        ..Outcomes::default()
    };
    let (mut stream, mut truncated, mut turns) = (0usize, 0usize, 0usize);
    let start = std::time::Instant::now();
    for chunk in seeds.chunks(batch.max(1)) {
        let mut prompts = Vec::new();
        let mut first_of = Vec::new();
        for &i in chunk {
            first_of.push((i, prompts.len()));
            prompts.extend(task.starts(envs::eval_seed(i), renderer)?);
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
        for (k, &(i, p0)) in first_of.iter().enumerate() {
            let p1 = first_of.get(k + 1).map_or(prompts.len(), |x| x.1);
            let mut seats = Vec::new();
            for (p, pl) in played[p0..p1].iter().enumerate() {
                let pl = &pl[0];
                truncated += pl.trajectory.truncated as usize;
                turns += pl.trajectory.model_turns;
                out.rewards.push(pl.reward.scalar);
                out.wins.push(pl.won);
                out.components.push(pl.reward.components.clone());
                seats.push(serde_json::json!({
                    "seat": prompts[p0 + p].state.downcast_ref::<EpisodeStart>().map(|s| s.seat),
                    "reward": pl.reward.scalar,
                    "components": pl.reward.components,
                    "texts": pl.texts,
                    "truncated": pl.trajectory.truncated,
                }));
            }
            out.transcripts
                .push(serde_json::json!({"episode": i, "seats": seats}));
        }
        stream += prompts.len();
        crate::note!(
            "  {} of {episodes} episodes played, {:.0} s",
            out.transcripts.len(),
            start.elapsed().as_secs_f64()
        );
    }
    crate::note!(
        "  episode driver: {turns} model turns, {truncated} of {} trajectories truncated",
        out.rewards.len()
    );
    Ok(out)
}

/// Per-seat outcomes of a finished evaluation, before summarising.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Outcomes {
    pub episodes: usize,
    pub rewards: Vec<f64>,
    pub wins: Vec<bool>,
    pub components: Vec<BTreeMap<String, f64>>,
    /// Every decision of the policy seats, where the environment has the behaviour
    /// capability (see [`envs::behaviour`]).
    pub decisions: Vec<DecisionRecord>,
    /// Their summary.
    pub behaviour: Option<BehaviourSummary>,
    /// Each episode's transcript (`Environment::transcript`) and its policy seats'
    /// rewards, in episode order.
    pub transcripts: Vec<serde_json::Value>,
}

/// Mean, and a 95% normal-approximation interval of the mean (`mean ± 1.96 s/√n`,
/// `s` the sample standard deviation; a zero-width interval for fewer than 2 values).
pub fn mean_ci(xs: &[f64]) -> (f64, [f64; 2]) {
    let n = xs.len();
    if n == 0 {
        return (f64::NAN, [f64::NAN, f64::NAN]);
    }
    let mean = xs.iter().sum::<f64>() / n as f64;
    if n < 2 {
        return (mean, [mean, mean]);
    }
    let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
    let half = 1.959_963_984_540_054 * (var / n as f64).sqrt();
    (mean, [mean - half, mean + half])
}

impl Outcomes {
    pub fn summarise(&self) -> EnvEval {
        let (reward_mean, reward_ci95) = mean_ci(&self.rewards);
        let wins = self.wins.iter().filter(|w| **w).count();
        let n = self.wins.len();
        let mut sums: BTreeMap<String, f64> = BTreeMap::new();
        for c in &self.components {
            for (k, v) in c {
                *sums.entry(k.clone()).or_default() += v;
            }
        }
        let components = sums
            .into_iter()
            .map(|(k, v)| (k, v / self.components.len().max(1) as f64))
            .collect();
        EnvEval {
            episodes: self.episodes,
            seats: n,
            reward_mean,
            reward_ci95,
            win_rate: if n == 0 {
                f64::NAN
            } else {
                wins as f64 / n as f64
            },
            win_ci95: wilson_ci(wins, n),
            components,
            behaviour: self.behaviour.clone(),
        }
    }
}

/// The model in every policy seat: each round's turns are sampled together,
/// `batch` prompts per sampling call. Every turn has its own RNG stream keyed by
/// (episode, round, seat), so results do not depend on the batching. Each seat's next
/// prompt is prefilled on top of its last one's KV ([`sample::reuse`]): a decision
/// prompt re-reads the session so far, and only its new tail costs a forward.
pub struct ModelPolicy<'a> {
    pub model: &'a Qwen2,
    pub renderer: &'a dyn Renderer,
    pub params: &'a SamplingParams,
    pub batch: usize,
    /// The KV of each (episode, seat)'s last prompt.
    last: HashMap<(usize, usize), PromptKv>,
    /// Most bytes `last` may hold (see [`kv_budget`]); a prompt whose KV would not fit
    /// is not kept, and its seat's next prompt is prefilled in full.
    kv_budget: usize,
    /// Prompt tokens of all calls, and how many of them were not recomputed.
    pub prompt_tokens: usize,
    pub reused_tokens: usize,
    /// Added to the episode index of every RNG stream: a caller that plays one block of
    /// a larger set keys its streams by their place in the set.
    pub first_episode: u64,
}

impl<'a> ModelPolicy<'a> {
    pub fn new(
        model: &'a Qwen2,
        renderer: &'a dyn Renderer,
        params: &'a SamplingParams,
        batch: usize,
    ) -> Self {
        ModelPolicy {
            model,
            renderer,
            params,
            batch,
            last: HashMap::new(),
            kv_budget: kv_budget(),
            prompt_tokens: 0,
            reused_tokens: 0,
            first_episode: 0,
        }
    }
}

/// The bytes of kept prompt KV an evaluation may hold: a quarter of the memory
/// available when it starts (1 GiB where that is unknown). Every episode is played at
/// once, so without a bound the kept KV grows with episodes x seats x prompt length
/// (the 0.5B in f32 keeps 24.6 kB a token: 800 seats of 700-token prompts would hold
/// 14 GB), beside a training run's own memory when evaluating during training.
fn kv_budget() -> usize {
    crate::sys::available_memory_bytes().map_or(1 << 30, |b| (b / 4) as usize)
}

impl Policy for ModelPolicy<'_> {
    fn act(
        &mut self,
        episodes: &mut [&mut dyn Environment],
        turns: &[Turn],
    ) -> Result<Vec<String>> {
        // An ended episode asks nothing more: its KV is memory only.
        self.last
            .retain(|&(e, _), _| episodes.get(e).is_some_and(|e| !e.done()));
        let decode = |ids: &[u32]| self.renderer.decode(ids);
        let mut texts = Vec::with_capacity(turns.len());
        for chunk in turns.chunks(self.batch.max(1)) {
            let prompts: Vec<Vec<u32>> = chunk
                .iter()
                .map(|t| {
                    Ok(self
                        .renderer
                        .render(&episodes[t.episode].observation(t.seat))?
                        .1)
                })
                .collect::<Result<_>>()?;
            let reqs: Vec<GroupRequest> = chunk
                .iter()
                .zip(&prompts)
                .map(|(t, p)| GroupRequest {
                    prompt: p,
                    num: 1,
                    stream_prompt: mix(
                        mix(self.first_episode + t.episode as u64, t.round),
                        t.seat as u64,
                    ) as usize,
                    first_sample: 0,
                })
                .collect();
            let priors: Vec<Option<&PromptKv>> = chunk
                .iter()
                .map(|t| self.last.get(&(t.episode, t.seat)))
                .collect();
            let (out, stats, kept) = sample::sample_requests_reusing(
                self.model,
                &decode,
                &reqs,
                &priors,
                self.params,
                self.params.seed,
            )?;
            self.prompt_tokens += stats.prefill_tokens;
            self.reused_tokens += stats.reused_tokens + stats.shared_prefix_tokens;
            for (t, kv) in chunk.iter().zip(kept) {
                let key = (t.episode, t.seat);
                self.last.remove(&key);
                let held: usize = self.last.values().map(|p| p.kv.bytes()).sum();
                if let Some(kv) = kv.filter(|kv| held + kv.kv.bytes() <= self.kv_budget) {
                    self.last.insert(key, kv);
                }
            }
            texts.extend(
                out.into_iter()
                    .map(|comps| comps.into_iter().next().map(|c| c.text).unwrap_or_default()),
            );
        }
        Ok(texts)
    }
}

/// Play `episodes` held-out episodes of `factory` (from held-out index `first_seed`)
/// with `model` (as it is: adapter on or off) in every policy seat, `batch` prompts
/// per sampling call.
pub fn play(
    model: &Qwen2,
    renderer: &dyn Renderer,
    factory: &dyn EnvFactory,
    episodes: usize,
    first_seed: u64,
    params: &SamplingParams,
    batch: usize,
) -> Result<Outcomes> {
    let mut policy = ModelPolicy::new(model, renderer, params, batch);
    let out = play_policy(factory, episodes, first_seed, &mut policy)?;
    crate::note!(
        "  prompts: {} tokens, {} of them ({:.0}%) kept from a shared prefix or the session's last prompt",
        policy.prompt_tokens,
        policy.reused_tokens,
        100.0 * policy.reused_tokens as f64 / policy.prompt_tokens.max(1) as f64
    );
    Ok(out)
}

/// [`play`] with any action source: the held-out episodes, the decisions recorded for
/// the behaviour report, and each policy seat's outcome.
pub fn play_policy(
    factory: &dyn EnvFactory,
    episodes: usize,
    first_seed: u64,
    policy: impl Policy,
) -> Result<Outcomes> {
    let end = first_seed
        .checked_add(episodes as u64)
        .filter(|&e| e <= envs::HELD_OUT_BIT)
        .context("--first-seed + --episodes runs past the held-out seeds (2^63)")?;
    let mut eps: Vec<Box<dyn Environment>> = (first_seed..end)
        .map(|i| factory.reset(envs::eval_seed(i)))
        .collect();
    let mut recorder = Recorder::new(Progress::new(policy, episodes));
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
        episodes,
        ..Outcomes::default()
    };
    for (i, e) in eps.iter().enumerate() {
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
            "episode": first_seed + i as u64,
            "seats": seats,
            "transcript": e.transcript(),
        }));
    }
    let fresh = factory.reset(envs::eval_seed(first_seed));
    if let Some(b) = fresh.as_behaviour() {
        out.behaviour =
            BehaviourSummary::from_records(b.reference_policy(), &b.actions(), &recorder.records);
    }
    out.decisions = recorder.records;
    Ok(out)
}

/// Prints a line per round on stderr (so a long evaluation, or a training step's
/// continuations, under `nohup` shows where it is), then asks the policy.
pub(crate) struct Progress<P> {
    inner: P,
    episodes: usize,
    start: std::time::Instant,
    /// Written before each line (`continuations `: a training step's).
    label: &'static str,
}

impl<P> Progress<P> {
    pub(crate) fn new(inner: P, episodes: usize) -> Self {
        Progress {
            inner,
            episodes,
            start: std::time::Instant::now(),
            label: "",
        }
    }

    pub(crate) fn labelled(mut self, label: &'static str) -> Self {
        self.label = label;
        self
    }
}

impl<P: Policy> Policy for Progress<P> {
    fn act(
        &mut self,
        episodes: &mut [&mut dyn Environment],
        turns: &[Turn],
    ) -> Result<Vec<String>> {
        let open = episodes.iter().filter(|e| !e.done()).count();
        if let Some(t) = turns.first() {
            crate::note!(
                "  {}round {}: {} turns, {open} of {} episodes open, {:.0} s",
                self.label,
                t.round + 1,
                turns.len(),
                self.episodes,
                self.start.elapsed().as_secs_f64()
            );
        }
        self.inner.act(episodes, turns)
    }
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

fn default_adapter(cfg: &Config) -> Result<PathBuf> {
    let dir = cfg.run_dir();
    if dir.join(crate::model::lora::ADAPTER_WEIGHTS).exists() {
        Ok(dir)
    } else {
        bail!(
            "no adapter in {} (the config's run directory): give --adapter DIR, or --base",
            dir.display()
        )
    }
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
    let envs = eval_targets(&cfg)?;
    let (mut model, renderer) = crate::model::load::load_with_renderer(&cfg.model_spec()?)?;
    let params = sampling(&cfg, args.greedy, renderer.stop_ids())?;
    // A run that started from an adapter (`model.adapter`, or an `[sft] warm_start`)
    // is compared with that start: the `base` entry is then the start adapter, so the
    // delta is what the run itself added.
    let mut start = cfg.start_adapter();
    if let Some(s) = start.as_deref().filter(|s| args.compare && !s.exists()) {
        // Evaluating a published adapter without its run: the start it was trained
        // from is not here, so the comparison is with the base model, and says so.
        crate::note!(
            "--compare: the run's start adapter {} is not here; comparing with the base model",
            s.display()
        );
        start = None;
    }
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
            (Some(a), Some(b)) => {
                let canon = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
                canon(Path::new(a)) == canon(b)
            }
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
    let out = args
        .out
        .clone()
        .or_else(|| adapter.as_ref().map(|a| a.join(EVAL_JSON)));
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

/// Where the decisions of the evaluation written to `out` go: beside it, named after
/// it (`eval.json` -> `eval_decisions.jsonl`), one JSON object a line (`model`, `env`,
/// `decision`).
pub fn decisions_path(out: &Path) -> PathBuf {
    sibling_path(out, "decisions")
}

/// `eval.json` -> `eval_{what}.jsonl`, beside it.
fn sibling_path(out: &Path, what: &str) -> PathBuf {
    let stem = out
        .file_stem()
        .map_or("eval".into(), |s| s.to_string_lossy());
    out.with_file_name(format!("{stem}_{what}.jsonl"))
}

fn write_decisions(path: &Path, rows: &[serde_json::Value]) -> Result<()> {
    let mut text = String::new();
    for r in rows {
        text.push_str(&serde_json::to_string(r)?);
        text.push('\n');
    }
    crate::atomic::atomic_write_bytes(path, text.as_bytes())
}

/// The behaviour block (markdown): per environment, each model's agreement with the
/// reference, the best constant's, the mutual information, and its action shares per
/// situation.
pub fn behaviour_table(r: &EvalReport) -> String {
    let mut s = String::new();
    let mut envs: Vec<&String> = r.models.values().flat_map(|m| m.envs.keys()).collect();
    envs.sort();
    envs.dedup();
    for env in envs {
        let rows: Vec<(&String, &BehaviourSummary)> = r
            .models
            .iter()
            .filter_map(|(l, m)| m.envs.get(env.as_str())?.behaviour.as_ref().map(|b| (l, b)))
            .collect();
        let Some((_, first)) = rows.first() else {
            continue;
        };
        s.push_str(&format!(
            "\n{env}: behaviour against the `{}` policy\n\n| model | decisions | agreement | \
             best constant | I(situation; action) bits |\n|---|---|---|---|---|\n",
            first.reference_policy
        ));
        for (l, b) in &rows {
            s.push_str(&format!(
                "| {} | {} | {} | {:.3} ({}) | {:.3} (reference {:.3}) |\n",
                display_label(r, l),
                b.decisions,
                fmt_ci(b.agreement, b.agreement_ci95),
                b.best_constant.agreement,
                b.best_constant.action,
                b.mutual_information_bits,
                b.reference_mutual_information_bits
            ));
        }
        s.push_str("\n| situation | model | decisions | actions | reference | agreement |\n|---|---|---|---|---|---|\n");
        let shares = |m: &BTreeMap<String, usize>, n: usize| -> String {
            m.iter()
                .map(|(a, c)| format!("{a} {:.2}", *c as f64 / n.max(1) as f64))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let mut situations: Vec<&String> =
            rows.iter().flat_map(|(_, b)| b.situations.keys()).collect();
        situations.sort();
        situations.dedup();
        for sit in situations {
            for (l, b) in &rows {
                if let Some(x) = b.situations.get(sit.as_str()) {
                    s.push_str(&format!(
                        "| {sit} | {} | {} | {} | {} | {:.3} |\n",
                        display_label(r, l),
                        x.decisions,
                        shares(&x.actions, x.decisions),
                        shares(&x.reference, x.decisions),
                        x.agreement
                    ));
                }
            }
        }
    }
    s
}

/// One row of the table: the value (and its interval, if any) of an environment's result.
type Metric = Box<dyn Fn(&EnvEval) -> (f64, Option<[f64; 2]>)>;

/// The column name of a model: `base`, or `start (DIR)` when the `base` entry is the
/// adapter the run started from.
fn display_label(r: &EvalReport, label: &str) -> String {
    match r.models.get(label).and_then(|m| m.adapter.as_ref()) {
        Some(dir) if label == "base" => format!("start ({dir})"),
        _ => label.to_string(),
    }
}

fn fmt_ci(v: f64, ci: [f64; 2]) -> String {
    format!("{v:.3} [{:.3}, {:.3}]", ci[0], ci[1])
}

/// The before/after table (markdown): one block per environment.
pub fn table(r: &EvalReport) -> String {
    // Before, then after.
    let mut labels: Vec<&String> = r.models.keys().collect();
    labels.sort_by_key(|l| (l.as_str() != "base", l.as_str() != "adapter", l.to_string()));
    let mut envs: Vec<&String> = r.models.values().flat_map(|m| m.envs.keys()).collect();
    envs.sort();
    envs.dedup();
    let both = r.models.contains_key("base") && r.models.contains_key("adapter");
    let mut s = String::new();
    for env in envs {
        let get = |l: &str| r.models.get(l).and_then(|m| m.envs.get(env.as_str()));
        let any = labels.iter().find_map(|l| get(l));
        let Some(first) = any else { continue };
        s.push_str(&format!(
            "\n{env}: {} episodes, {} seats, {}\n\n| metric |",
            first.episodes,
            first.seats,
            if r.greedy { "greedy" } else { "sampled" }
        ));
        for l in &labels {
            s.push_str(&format!(" {} |", display_label(r, l)));
        }
        if both {
            s.push_str(" delta |");
        }
        s.push_str("\n|---|");
        for _ in 0..labels.len() + both as usize {
            s.push_str("---|");
        }
        s.push('\n');
        let mut rows: Vec<(String, Metric)> = vec![
            (
                "win rate".into(),
                Box::new(|e: &EnvEval| (e.win_rate, Some(e.win_ci95))),
            ),
            (
                "reward".into(),
                Box::new(|e: &EnvEval| (e.reward_mean, Some(e.reward_ci95))),
            ),
        ];
        for k in first.components.keys() {
            let k2 = k.clone();
            rows.push((
                k.clone(),
                Box::new(move |e: &EnvEval| {
                    (e.components.get(&k2).copied().unwrap_or(f64::NAN), None)
                }),
            ));
        }
        for (name, f) in &rows {
            s.push_str(&format!("| {name} |"));
            for l in &labels {
                match get(l).map(f) {
                    Some((v, Some(ci))) => s.push_str(&format!(" {} |", fmt_ci(v, ci))),
                    Some((v, None)) => s.push_str(&format!(" {v:.3} |")),
                    None => s.push_str(" - |"),
                }
            }
            if both {
                match (get("base"), get("adapter")) {
                    (Some(b), Some(a)) => s.push_str(&format!(" {:+.3} |", f(a).0 - f(b).0)),
                    _ => s.push_str(" - |"),
                }
            }
            s.push('\n');
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scripted policy of the environment in every policy seat.
    fn scripted(name: &'static str) -> impl Policy {
        rollout::EachTurn(move |env: &mut dyn Environment, seat| env.policy_action(name, seat))
    }

    fn behaviour_of(env: &str, opts: &[(&str, &str)], policy: &'static str) -> Outcomes {
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
    fn behaviour_table_names_agreement_and_situations() {
        let o = behaviour_of("ticketmelt", &[], "always_a");
        let mut report = EvalReport {
            config: "c.toml".into(),
            episodes: 60,
            greedy: false,
            first_seed: 0,
            sampling: None,
            models: BTreeMap::new(),
        };
        let mut envs = BTreeMap::new();
        envs.insert("ticketmelt".to_string(), o.summarise());
        report.models.insert(
            "adapter".into(),
            ModelEval {
                adapter: None,
                envs,
            },
        );
        let t = behaviour_table(&report);
        assert!(
            t.contains("behaviour against the `heuristic` policy"),
            "{t}"
        );
        assert!(t.contains("| restored | adapter |"), "{t}");
        assert!(t.contains("DEPLOY_PROD_A 1.00"), "{t}");
    }

    #[test]
    fn first_seed_past_the_held_out_range_is_refused() {
        let f = envs::create("ticketmelt", &envs::Options::new()).unwrap();
        let e = play_policy(f.as_ref(), 2, u64::MAX - 1, scripted("heuristic"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("--first-seed"), "{e}");
    }

    #[test]
    fn decisions_go_beside_their_report() {
        assert_eq!(
            decisions_path(Path::new("runs/x/eval.json")),
            Path::new("runs/x/eval_decisions.jsonl")
        );
        assert_eq!(
            decisions_path(Path::new("base.json")),
            Path::new("base_decisions.jsonl")
        );
    }

    #[test]
    fn mean_ci_by_hand() {
        // mean 2.5, sample variance 5/3, half-width 1.96 * sqrt(5/12)
        let (m, ci) = mean_ci(&[1.0, 2.0, 3.0, 4.0]);
        assert_eq!(m, 2.5);
        let half = 1.959_963_984_540_054 * (5.0f64 / 12.0).sqrt();
        assert!((ci[0] - (2.5 - half)).abs() < 1e-12 && (ci[1] - (2.5 + half)).abs() < 1e-12);
        assert_eq!(mean_ci(&[0.7]), (0.7, [0.7, 0.7]));
        assert!(mean_ci(&[]).0.is_nan());
    }

    #[test]
    fn summary_counts_wins_and_averages_components() {
        let o = Outcomes {
            episodes: 4,
            rewards: vec![1.0, 0.0, 1.0, 1.0],
            wins: vec![true, false, true, true],
            components: vec![
                BTreeMap::from([("a".to_string(), 1.0)]),
                BTreeMap::from([("a".to_string(), 0.0)]),
                BTreeMap::from([("a".to_string(), 0.5)]),
                BTreeMap::from([("a".to_string(), 0.5)]),
            ],
            ..Outcomes::default()
        };
        let e = o.summarise();
        assert_eq!((e.episodes, e.seats), (4, 4));
        assert_eq!(e.win_rate, 0.75);
        assert_eq!(e.win_ci95, wilson_ci(3, 4));
        // Wilson 95% for 3/4 (hand-computed): [0.3006, 0.9544]
        assert!((e.win_ci95[0] - 0.3006).abs() < 1e-3 && (e.win_ci95[1] - 0.9544).abs() < 1e-3);
        assert_eq!(e.reward_mean, 0.75);
        assert_eq!(e.components["a"], 0.5);
    }
}

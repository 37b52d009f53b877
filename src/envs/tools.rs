//! What `concord envs` runs, as plain library functions (the clap types live in
//! `src/cli/envs.rs`): list, describe, play, baseline and bench, generic over the
//! registry, plus the measuring and statistics helpers they share.

use super::{create, EnvFactory, Options};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::BufRead;

/// Options from the `--preset` and `--set KEY=VALUE` flags: `preset` sets the `preset`
/// option; VALUE is TOML (bare words that do not parse are strings).
pub fn options_from_flags(preset: Option<&str>, set: &[String]) -> anyhow::Result<Options> {
    let mut o = Options::new();
    if let Some(p) = preset {
        o.insert("preset".into(), toml::Value::String(p.to_string()));
    }
    for kv in set {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| anyhow::anyhow!("--set expects KEY=VALUE, got `{kv}`"))?;
        let k = k.trim();
        let v = v.trim();
        let value = match toml::from_str::<toml::Table>(&format!("v = {v}")) {
            Ok(mut t) => t
                .remove("v")
                .unwrap_or_else(|| toml::Value::String(v.to_string())),
            Err(_) => toml::Value::String(v.to_string()),
        };
        o.insert(k.to_string(), value);
    }
    Ok(o)
}

/// `concord envs list`: one line per registered environment.
pub fn list() -> String {
    let mut s = String::new();
    for e in super::entries() {
        let built = if e.built() { "" } else { " (not built yet)" };
        s.push_str(&format!("{:<12} {}{}\n", e.name, e.summary, built));
    }
    s
}

/// `concord envs describe NAME`.
pub fn describe(name: &str, options: &Options) -> anyhow::Result<String> {
    Ok(wrap(&create(name, options)?.describe(), DESCRIBE_WIDTH))
}

/// Columns of `concord envs describe` (some descriptions are written as long lines).
const DESCRIBE_WIDTH: usize = 100;

/// `text` with every line longer than `width` broken at spaces; a continuation keeps the
/// line's indentation (and a bullet's). Table rows (`|`) are left whole.
fn wrap(text: &str, width: usize) -> String {
    let mut out = String::with_capacity(text.len() + text.len() / width);
    for line in text.lines() {
        if line.chars().count() <= width || line.trim_start().starts_with('|') {
            out.push_str(line);
            out.push('\n');
            continue;
        }
        let body = line.trim_start();
        let mut indent = " ".repeat(line.len() - body.len());
        let mut current = indent.clone();
        if body.starts_with("- ") {
            indent.push_str("  ");
        }
        for word in body.split(' ') {
            let fresh = current.trim().is_empty();
            if !fresh && current.chars().count() + 1 + word.chars().count() > width {
                out.push_str(current.trim_end());
                out.push('\n');
                current = indent.clone();
            } else if !fresh {
                current.push(' ');
            }
            current.push_str(word);
        }
        out.push_str(current.trim_end());
        out.push('\n');
    }
    if !text.ends_with('\n') {
        out.pop();
    }
    out
}

/// What `concord envs play` does besides building the environment.
#[derive(Debug, Clone, Default)]
pub struct PlayOptions {
    pub seed: u64,
    /// A scripted policy for the policy seats, `human` (lines from stdin), or None for
    /// the continuation policy.
    pub policy: Option<String>,
    /// Print every acting seat's full prompt each step.
    pub prompts: bool,
    /// Print the JSON transcript at the end.
    pub json: bool,
}

/// `concord envs play NAME`: play one episode and print a readable transcript.
pub fn play(name: &str, options: &Options, o: &PlayOptions) -> anyhow::Result<()> {
    let f = create(name, options)?;
    play_episode_printed(f.as_ref(), o.seed, o.policy.as_deref(), o.prompts, o.json)
}

/// What `concord envs baseline` reports.
#[derive(Debug, Clone, Default)]
pub struct BaselineOptions {
    pub episodes: usize,
    /// First episode seed (episodes use seeds first..first+N).
    pub first_seed: u64,
    /// Only these policies; all when empty.
    pub policies: Vec<String>,
    /// Only these pools; all when empty.
    pub pools: Vec<String>,
    /// Print JSON instead of a markdown table.
    pub json: bool,
}

/// `concord envs baseline NAME`: win rates of scripted policies against pools.
pub fn baseline(name: &str, options: &Options, o: &BaselineOptions) -> anyhow::Result<()> {
    let f = create(name, options)?;
    let rows = baseline_rows(f.as_ref(), &o.policies, &o.pools, o.episodes, o.first_seed)?;
    if o.json {
        crate::say!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({ "env": name, "rows": rows }))?
        );
    } else {
        crate::say_raw!("{}", markdown_table(&rows));
    }
    Ok(())
}

/// `concord envs bench NAME`: single-threaded episodes/s, `secs` CPU seconds per
/// measurement (at least 0.01).
pub fn bench(name: &str, options: &Options, secs: f64, json: bool) -> anyhow::Result<()> {
    let f = create(name, options)?;
    let r = f
        .bench(secs.max(0.01))
        .ok_or_else(|| anyhow::anyhow!("environment `{name}` has no benchmark"))?;
    if json {
        crate::say!("{}", serde_json::to_string(&r)?);
    } else {
        crate::say!(
            "{name}: {:.0} episodes/s without rendering, {:.0} episodes/s with prompt rendering \
(single thread, per {} second; wall clock: {:.0} / {:.0})",
            r.episodes_per_s,
            r.episodes_per_s_with_prompts,
            if r.clock == "thread_cpu" {
                "thread CPU"
            } else {
                "wall"
            },
            r.wall_episodes_per_s,
            r.wall_episodes_per_s_with_prompts
        );
    }
    Ok(())
}

/// Throughput of `f`: its fast path ([`super::Tools::bench`]) when it has one, else
/// [`generic_bench`].
pub fn factory_bench(f: &dyn EnvFactory, min_secs: f64) -> Option<BenchResult> {
    f.tools()
        .and_then(|t| t.bench(min_secs))
        .or_else(|| Some(generic_bench(f, min_secs)))
}

/// Throughput through the traits (continuation policy, text actions), without and with
/// prompt rendering, each measured for at least `min_secs` (see [`measure`]).
pub fn generic_bench(f: &dyn EnvFactory, min_secs: f64) -> BenchResult {
    let run = |render: bool| {
        let mut seed = 0u64;
        let mut sink = 0usize;
        let r = measure(min_secs, || {
            let mut env = f.reset(seed);
            seed += 1;
            while !env.done() {
                let seats = env.to_act();
                if render {
                    for &s in &seats {
                        sink += env
                            .observation(s)
                            .iter()
                            .map(|m| m.content.len())
                            .sum::<usize>();
                    }
                }
                let actions: Vec<String> =
                    seats.iter().map(|&s| env.continuation_action(s)).collect();
                if env.step(&actions).is_err() {
                    break;
                }
            }
            1
        });
        std::hint::black_box(sink);
        r
    };
    BenchResult::from_runs(run(false), run(true))
}

/// Result of `concord envs bench`.
///
/// `episodes_per_s*` count episodes per second of CPU time of the benchmarking thread
/// (Linux `/proc/thread-self/schedstat`), which equals wall-clock throughput on an idle
/// core and stays meaningful on a machine shared with other jobs; `clock` says
/// `"thread_cpu"`, or `"wall"` where no thread clock exists (then both pairs agree).
/// The `wall_*` fields are plain wall-clock throughput.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchResult {
    pub episodes_per_s: f64,
    pub episodes_per_s_with_prompts: f64,
    pub wall_episodes_per_s: f64,
    pub wall_episodes_per_s_with_prompts: f64,
    pub clock: String,
}

impl BenchResult {
    /// From two [`measure`] results (without, with rendering).
    pub fn from_runs(plain: Measured, prompts: Measured) -> Self {
        BenchResult {
            episodes_per_s: plain.per_s().round(),
            episodes_per_s_with_prompts: prompts.per_s().round(),
            wall_episodes_per_s: plain.per_wall_s().round(),
            wall_episodes_per_s_with_prompts: prompts.per_wall_s().round(),
            clock: if plain.cpu_secs.is_some() {
                "thread_cpu"
            } else {
                "wall"
            }
            .to_string(),
        }
    }
}

/// Episodes counted over a timed run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Measured {
    pub episodes: u64,
    pub wall_secs: f64,
    pub cpu_secs: Option<f64>,
}

impl Measured {
    /// Episodes per CPU second of the thread (per wall second without a thread clock).
    pub fn per_s(&self) -> f64 {
        self.episodes as f64 / self.cpu_secs.unwrap_or(self.wall_secs).max(1e-9)
    }
    pub fn per_wall_s(&self) -> f64 {
        self.episodes as f64 / self.wall_secs.max(1e-9)
    }
}

/// Call `episode` (which plays one or more episodes and returns how many) until the
/// thread has used `min_secs` of CPU time (wall time without a thread clock; at most
/// 50 x `min_secs` of wall time either way). Clocks are read every 256 calls.
pub fn measure(min_secs: f64, mut episode: impl FnMut() -> u64) -> Measured {
    let t0 = std::time::Instant::now();
    let c0 = crate::sys::thread_cpu_seconds();
    let mut n = 0u64;
    loop {
        for _ in 0..256 {
            n += episode();
        }
        let wall = t0.elapsed().as_secs_f64();
        let cpu = c0.and_then(|c0| crate::sys::thread_cpu_seconds().map(|c| c - c0));
        if cpu.unwrap_or(wall) >= min_secs || wall >= 50.0 * min_secs {
            return Measured {
                episodes: n,
                wall_secs: wall,
                cpu_secs: cpu.filter(|c| *c > 0.0),
            };
        }
    }
}

/// One row of `concord envs baseline --json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BaselineRow {
    pub policy: String,
    pub peers: String,
    /// The scenario level (postmortem); absent for environments without levels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub level: Option<String>,
    pub episodes: usize,
    pub win_rate: f64,
    /// 95% Wilson score interval of the win rate.
    pub win_ci: [f64; 2],
    pub mean_reward: f64,
    /// Environment-specific rates and means (e.g. `merge_rate`, `collision_rate`).
    #[serde(flatten)]
    pub extra: BTreeMap<String, f64>,
}

/// 95% Wilson score interval for `wins` successes out of `n`.
pub fn wilson_ci(wins: usize, n: usize) -> [f64; 2] {
    if n == 0 {
        return [0.0, 1.0];
    }
    let z = 1.959_963_984_540_054_f64;
    let n_f = n as f64;
    let p = wins as f64 / n_f;
    let denom = 1.0 + z * z / n_f;
    let centre = (p + z * z / (2.0 * n_f)) / denom;
    let half = z * ((p * (1.0 - p) / n_f + z * z / (4.0 * n_f * n_f)).sqrt()) / denom;
    [(centre - half).max(0.0), (centre + half).min(1.0)]
}

/// Every requested policy x pool row (all of them when the filters are empty).
pub fn baseline_rows(
    f: &dyn EnvFactory,
    policies: &[String],
    pools: &[String],
    episodes: usize,
    first_seed: u64,
) -> anyhow::Result<Vec<BaselineRow>> {
    let ps: Vec<String> = if policies.is_empty() {
        f.policies().iter().map(|s| s.to_string()).collect()
    } else {
        policies.to_vec()
    };
    let qs: Vec<String> = if pools.is_empty() {
        f.pools().iter().map(|s| s.to_string()).collect()
    } else {
        pools.to_vec()
    };
    let mut rows = Vec::new();
    for q in &qs {
        for p in &ps {
            rows.push(f.baseline(p, q, episodes, first_seed)?);
        }
    }
    Ok(rows)
}

/// The rows as a markdown table (README-ready).
pub fn markdown_table(rows: &[BaselineRow]) -> String {
    let extras: Vec<String> = rows
        .first()
        .map(|r| r.extra.keys().cloned().collect())
        .unwrap_or_default();
    let mut s = String::from("| policy | peers | episodes | win rate | 95% CI | mean reward |");
    for e in &extras {
        s.push_str(&format!(" {e} |"));
    }
    s.push_str("\n|---|---|---:|---:|---|---:|");
    for _ in &extras {
        s.push_str("---:|");
    }
    s.push('\n');
    for r in rows {
        s.push_str(&format!(
            "| {} | {} | {} | {:.3} | [{:.3}, {:.3}] | {:.3} |",
            r.policy, r.peers, r.episodes, r.win_rate, r.win_ci[0], r.win_ci[1], r.mean_reward
        ));
        for e in &extras {
            s.push_str(&format!(
                " {:.3} |",
                r.extra.get(e).copied().unwrap_or(f64::NAN)
            ));
        }
        s.push('\n');
    }
    s
}

/// `concord envs play`'s action source: a scripted policy, the continuation policy or a
/// person on stdin, printing each round's state, prompts and answers.
struct PrintingPolicy<'a, L> {
    policy: Option<&'a str>,
    human: bool,
    prompts: bool,
    lines: L,
}

impl<L: Iterator<Item = std::io::Result<String>>> super::rollout::Policy for PrintingPolicy<'_, L> {
    fn act(
        &mut self,
        episodes: &mut [&mut dyn super::Environment],
        turns: &[super::rollout::Turn],
    ) -> anyhow::Result<Vec<String>> {
        let mut texts = Vec::with_capacity(turns.len());
        for t in turns {
            let env: &mut dyn super::Environment = &mut *episodes[t.episode];
            let (step, s) = (t.round + 1, t.seat);
            if t.round > 0 && texts.is_empty() {
                // The state after the previous round's step.
                crate::say!("{}", env.render_state());
            }
            if self.prompts || self.human {
                for m in env.observation(s) {
                    if self.human && m.role == "system" && step > 1 {
                        continue;
                    }
                    crate::say!("--- seat {s} [{}] ---\n{}", m.role, m.content);
                }
            }
            let text = if self.human {
                crate::say!("--- your answer for seat {s} (one line) ---");
                match self.lines.next() {
                    Some(line) => line?,
                    None => anyhow::bail!("stdin closed before the episode ended"),
                }
            } else if let Some(p) = self.policy {
                env.policy_action(p, s)?
            } else {
                env.continuation_action(s)
            };
            crate::say!("step {step} seat {s}: {text}");
            texts.push(text);
        }
        Ok(texts)
    }
}

/// Play one episode of `f`, printing the state after every step and the rewards.
fn play_episode_printed(
    f: &dyn EnvFactory,
    seed: u64,
    policy: Option<&str>,
    prompts: bool,
    json: bool,
) -> anyhow::Result<()> {
    let human = policy == Some("human");
    if let Some(p) = policy {
        anyhow::ensure!(
            human || f.policies().contains(&p),
            "unknown policy `{p}` for {}; known: human, {}",
            f.name(),
            f.policies().join(", ")
        );
    }
    let mut env = f.reset(seed);
    crate::say!(
        "== {} seed {seed} policy {} ==",
        f.name(),
        policy.unwrap_or("continuation")
    );
    crate::say!("{}", env.render_state());
    let mut printer = PrintingPolicy {
        policy,
        human,
        prompts,
        lines: std::io::stdin().lock().lines(),
    };
    super::rollout::play_one(env.as_mut(), &mut printer, super::rollout::MAX_ROUNDS)?;
    crate::say!("{}", env.render_state());
    crate::say!("== rewards ==");
    for s in env.policy_seats() {
        let r = env.reward(s);
        let comps: Vec<String> = r
            .components
            .iter()
            .map(|(k, v)| format!("{k}={v:.3}"))
            .collect();
        crate::say!("seat {s}: scalar {:.3} ({})", r.scalar, comps.join(", "));
    }
    if json {
        crate::say!("{}", serde_json::to_string_pretty(&env.transcript())?);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_lines_wrap_at_spaces_keeping_indentation() {
        let t = format!(
            "  - {}\n| {} |\nshort",
            "word ".repeat(40).trim_end(),
            "x ".repeat(80)
        );
        let w = wrap(&t, 30);
        let lines: Vec<&str> = w.lines().collect();
        assert!(
            lines[0].starts_with("  - word") && lines[1].starts_with("    word"),
            "{w}"
        );
        let prose = lines.iter().filter(|l| !l.starts_with('|'));
        assert!(prose.clone().all(|l| l.len() <= 30), "{w}");
        assert!(
            lines.iter().any(|l| l.starts_with('|') && l.len() > 30),
            "{w}"
        );
        assert_eq!(*lines.last().unwrap(), "short");
        assert_eq!(w.split_whitespace().count(), t.split_whitespace().count());
    }

    #[test]
    fn every_description_fits_its_width() {
        for name in crate::envs::names() {
            // Registered but not buildable here (no factory) has nothing to describe.
            let Ok(d) = describe(name, &Options::new()) else {
                continue;
            };
            let long: Vec<&str> = d
                .lines()
                .filter(|l| l.chars().count() > DESCRIBE_WIDTH && !l.trim_start().starts_with('|'))
                .filter(|l| l.trim().contains(' '))
                .collect();
            assert!(long.is_empty(), "{name}: {long:?}");
        }
    }
}

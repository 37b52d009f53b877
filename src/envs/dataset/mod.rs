//! `dataset`: a file of prompts with verifiable answers, TRL's
//! `GRPOTrainer(train_dataset=..., reward_funcs=...)` task, as an environment.
//!
//! Each episode is one row and one answer: `reset(seed)` picks a row (held-out seeds,
//! those with [`HELD_OUT_BIT`], from the held-out rows in file order, so `concord eval
//! --episodes N` scores the first N of them; training seeds from the training rows),
//! the model answers once, and every configured verifier scores the answer 0 or 1.
//! The verifiers are the reward components (`rewards/<name>/mean`), the scalar is
//! their sum weighted by `reward_weights`, and the `accuracy` verifier decides a win.
//! Being an environment, it trains in decision and episode mode, in curricula, with
//! SFT from the rows' demonstrations (`policy = "reference"`), data parallel and
//! `--resume`, as the built-in games do.
mod extract;
pub mod program;
mod rows;
mod schema;
mod verify;

pub use extract::{answer_number, Extract};
pub use rows::{fnv1a, Row, Split};
pub use verify::{Check, Verifier};

use program::{Program, Reply};

use super::{
    batch::RewardRequest, rollout::HELD_OUT_BIT, BaselineRow, EnvFactory, Environment, Inspect,
    Message, Options, Reward, Scripted, StepOutcome, Tools,
};
use anyhow::{bail, Context, Result};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

pub const NAME: &str = "dataset";

/// Every option key, for the unknown-key error.
const KEYS: &[&str] = &[
    "path",
    "prompt_key",
    "answer_key",
    "completion_key",
    "system",
    "held_out",
    "split_key",
    "held_out_split",
    "verifier",
    "verifiers",
    "reward_weights",
    "accuracy",
    "reward",
];

/// What every episode of one configured dataset shares.
#[derive(Debug)]
struct Shared {
    path: PathBuf,
    rows: Vec<Row>,
    train: Vec<usize>,
    held_out: Vec<usize>,
    verifiers: Vec<Verifier>,
    weights: Vec<f64>,
    /// `[env.options.reward]`: a program that scores answers too.
    program: Option<Arc<Program>>,
    /// The component that decides a win (accuracy): a verifier's or the program's.
    accuracy: String,
}

/// The factory of a configured dataset.
#[derive(Debug, Clone)]
pub struct DatasetFactory(Arc<Shared>);

pub fn factory(options: &Options) -> Result<Box<dyn EnvFactory>> {
    Ok(Box::new(DatasetFactory::from_options(options)?))
}

fn opt_str<'a>(o: &'a Options, k: &str) -> Result<Option<&'a str>> {
    o.get(k)
        .map(|v| {
            v.as_str()
                .with_context(|| format!("dataset option `{k}` must be a string, got {v}"))
        })
        .transpose()
}

impl DatasetFactory {
    pub fn from_options(o: &Options) -> Result<Self> {
        if let Some(k) = o.keys().find(|k| !KEYS.contains(&k.as_str())) {
            bail!("unknown dataset option `{k}` (known: {})", KEYS.join(", "));
        }
        let path = PathBuf::from(opt_str(o, "path")?.context(
            "dataset option `path` is required: the JSONL file of prompts (one JSON object \
             a line, with `prompt` or `messages` and the reference answer)",
        )?);
        let answer_key = opt_str(o, "answer_key")?.unwrap_or("answer").to_string();
        let layout = rows::Layout {
            prompt_key: opt_str(o, "prompt_key")?.map(str::to_string),
            answer_key: answer_key.clone(),
            completion_key: opt_str(o, "completion_key")?
                .unwrap_or("completion")
                .to_string(),
            system: opt_str(o, "system")?.map(str::to_string),
        };
        let program = o
            .get("reward")
            .map(|v| program::Spec::from_toml(v).context("dataset option `reward`"))
            .transpose()?;
        let verifiers = verifiers(o, &answer_key, program.is_some())?;
        let weights = weights(o, verifiers.len())?;
        if let Some(p) = &program {
            let clash = verifiers
                .iter()
                .find(|v| v.name == p.name || p.components.contains(&v.name));
            if let Some(v) = clash {
                bail!(
                    "dataset option `reward`: a verifier is named `{}` too; give the program \
                     (`name`) or the verifier another name",
                    v.name
                );
            }
        }
        let accuracy = accuracy(o, &verifiers, program.as_ref())?;
        let rows = rows::read(&path, &layout)?;
        check_rows(&path, &rows, &verifiers)?;
        let (train, held_out) = rows::split(&rows, &split(o)?)?;
        Ok(Self(Arc::new(Shared {
            path,
            rows,
            train,
            held_out,
            verifiers,
            weights,
            program: program.map(|s| Arc::new(Program::new(s))),
            accuracy,
        })))
    }

    /// (training rows, held-out rows).
    pub fn sizes(&self) -> (usize, usize) {
        (self.0.train.len(), self.0.held_out.len())
    }

    /// The row an episode seed plays.
    pub fn row_of(&self, seed: u64) -> usize {
        let s = &self.0;
        let side = if seed & HELD_OUT_BIT != 0 {
            &s.held_out
        } else {
            &s.train
        };
        side[((seed & !HELD_OUT_BIT) % side.len() as u64) as usize]
    }
}

/// The configured verifiers; none only when a reward program scores the answers.
fn verifiers(o: &Options, answer_key: &str, program: bool) -> Result<Vec<Verifier>> {
    let list: Vec<toml::Value> = match (o.get("verifier"), o.get("verifiers")) {
        (Some(_), Some(_)) => bail!("give dataset option `verifier` or `verifiers`, not both"),
        (Some(v), None) => vec![v.clone()],
        (None, Some(toml::Value::Array(a))) => a.clone(),
        (None, Some(v)) => bail!("dataset option `verifiers` must be an array of tables, got {v}"),
        (None, None) if program => Vec::new(),
        (None, None) => bail!(
            "a dataset needs `verifier = \"exact\"` (or numeric, regex, json_schema, choice, \
             contains), [[env.options.verifiers]] tables or a reward program \
             ([env.options.reward])"
        ),
    };
    anyhow::ensure!(
        program || !list.is_empty(),
        "dataset option `verifiers` is empty"
    );
    let mut out: Vec<Verifier> = Vec::new();
    for (i, v) in list.iter().enumerate() {
        let ver = Verifier::from_toml(v, answer_key)
            .with_context(|| format!("dataset option `verifiers`, entry {}", i + 1))?;
        anyhow::ensure!(
            out.iter().all(|o| o.name != ver.name),
            "dataset option `verifiers`: two verifiers are named `{}`; give one a `name`",
            ver.name
        );
        out.push(ver);
    }
    Ok(out)
}

/// The component that decides a win: `accuracy`, else the first verifier, else the
/// program.
fn accuracy(
    o: &Options,
    verifiers: &[Verifier],
    program: Option<&program::Spec>,
) -> Result<String> {
    let known = || {
        let mut names: Vec<&str> = verifiers.iter().map(|v| v.name.as_str()).collect();
        if let Some(p) = program {
            names.push(&p.name);
            names.extend(p.components.iter().map(String::as_str));
        }
        names
    };
    match opt_str(o, "accuracy")? {
        Some(name) if known().contains(&name) => Ok(name.to_string()),
        Some(name) => bail!(
            "dataset option `accuracy` names no verifier or program component: `{name}` \
             (known: {})",
            known().join(", ")
        ),
        None => Ok(known().first().map(|s| s.to_string()).unwrap_or_default()),
    }
}

fn weights(o: &Options, n: usize) -> Result<Vec<f64>> {
    let Some(v) = o.get("reward_weights") else {
        return Ok(vec![1.0; n]);
    };
    let bad = || {
        format!("dataset option `reward_weights` must be {n} numbers (one per verifier), got {v}")
    };
    let a = v.as_array().with_context(bad)?;
    anyhow::ensure!(a.len() == n, bad());
    a.iter()
        .map(|x| {
            x.as_float()
                .or_else(|| x.as_integer().map(|i| i as f64))
                .filter(|w| w.is_finite())
                .with_context(bad)
        })
        .collect()
}

fn split(o: &Options) -> Result<Split> {
    let fraction = o.get("held_out");
    match opt_str(o, "split_key")? {
        Some(key) => {
            anyhow::ensure!(
                fraction.is_none(),
                "give dataset option `held_out` (a fraction) or `split_key`, not both"
            );
            Ok(Split::Field {
                key: key.to_string(),
                value: opt_str(o, "held_out_split")?.unwrap_or("test").to_string(),
            })
        }
        None => {
            anyhow::ensure!(
                !o.contains_key("held_out_split"),
                "dataset option `held_out_split` goes with `split_key`"
            );
            let f = match fraction {
                None => 0.1,
                Some(v) => v
                    .as_float()
                    .filter(|f| *f > 0.0 && *f < 1.0)
                    .with_context(|| {
                        format!("dataset option `held_out` must be a fraction in (0, 1), got {v}")
                    })?,
            };
            Ok(Split::Fraction(f))
        }
    }
}

/// Every row can be judged by every verifier: its reference is there and readable
/// ([`Verifier::check_row`]), and a `json_schema` verifier's per-row schema is there and
/// supported; else the file is refused at the row's line.
fn check_rows(path: &std::path::Path, rows: &[Row], verifiers: &[Verifier]) -> Result<()> {
    for v in verifiers {
        for r in rows {
            v.check_row(&r.fields)
                .with_context(|| format!("{} line {}", path.display(), r.line))?;
        }
        let Check::JsonSchema {
            schema_key: Some(key),
            ..
        } = &v.check
        else {
            continue;
        };
        for r in rows {
            let at = || format!("{} line {}: `{key}`", path.display(), r.line);
            let raw = r
                .fields
                .get(key)
                .with_context(|| format!("{}: missing", at()))?;
            let json = match raw {
                serde_json::Value::String(s) => serde_json::from_str(s).with_context(at)?,
                other => other.clone(),
            };
            schema::Schema::new(json).with_context(at)?;
        }
    }
    Ok(())
}

impl EnvFactory for DatasetFactory {
    fn resolved_options(&self) -> Option<serde_json::Value> {
        let s = &self.0;
        Some(serde_json::json!({
            "file": s.path.file_name().map(|n| n.to_string_lossy().into_owned()), "rows": s.rows.len(),
            "held_out": s.held_out.len(), "verifiers": format!("{:?}", s.verifiers),
            "weights": s.weights, "program": s.program.is_some(), "accuracy": s.accuracy,
        }))
    }
    fn name(&self) -> &'static str {
        NAME
    }
    fn reset(&self, seed: u64) -> Box<dyn Environment> {
        Box::new(Episode {
            shared: self.0.clone(),
            seed,
            row: self.row_of(seed),
            answer: None,
            reply: None,
        })
    }
    fn tools(&self) -> Option<&dyn Tools> {
        Some(self)
    }
    /// Known without asking the program: the verifiers, the program and the components
    /// it declares.
    fn component_names(&self) -> Option<Vec<String>> {
        Some(self.reset(0).reward(0).components.into_keys().collect())
    }
}

/// One row, answered once.
#[derive(Debug, Clone)]
pub struct Episode {
    shared: Arc<Shared>,
    seed: u64,
    row: usize,
    answer: Option<String>,
    /// The reward program's reply to the answer.
    reply: Option<Reply>,
}

impl Episode {
    fn row(&self) -> &Row {
        &self.shared.rows[self.row]
    }

    /// Each verifier's score of the answer (zeros before it).
    pub fn scores(&self) -> Vec<f64> {
        let row = self.row();
        self.shared
            .verifiers
            .iter()
            .map(|v| {
                self.answer
                    .as_deref()
                    .map_or(0.0, |a| v.score(a, &row.fields))
            })
            .collect()
    }

    /// What the reward program is sent for `text`, and its key among a batch's replies.
    fn request(&self, text: &str) -> (u64, serde_json::Value) {
        let row = self.row();
        let key = fnv1a(&format!("{}\u{0}{text}", self.row));
        // keys in sorted order, whether or not serde_json keeps insertion order
        let item = serde_json::json!({
            "completion": text,
            "held_out": self.seed & HELD_OUT_BIT != 0,
            "line": row.line,
            "prompt": row.prompt,
            "row": row.fields,
        });
        (key, item)
    }
}

impl Environment for Episode {
    fn name(&self) -> &'static str {
        NAME
    }
    fn num_seats(&self) -> usize {
        1
    }
    fn policy_seats(&self) -> Vec<usize> {
        vec![0]
    }
    fn to_act(&self) -> Vec<usize> {
        if self.answer.is_none() {
            vec![0]
        } else {
            Vec::new()
        }
    }
    fn observation(&self, _seat: usize) -> Vec<Message> {
        self.row().prompt.clone()
    }
    fn step(&mut self, actions: &[String]) -> Result<StepOutcome> {
        let mut out = StepOutcome::default();
        if self.answer.is_some() {
            return Ok(out);
        }
        anyhow::ensure!(
            actions.len() == 1,
            "dataset: one answer per step, got {}",
            actions.len()
        );
        if let Some(p) = &self.shared.program {
            let (key, item) = self.request(&actions[0]);
            self.reply = Some(p.score(key, item)?);
        }
        self.answer = Some(actions[0].clone());
        let acc = self
            .shared
            .verifiers
            .iter()
            .find(|v| v.name == self.shared.accuracy);
        let found = acc.is_none_or(|v| v.extract.apply(&actions[0]).is_some());
        let feedback = match acc {
            Some(v) if !found => format!(
                "no answer found for `{}` (extract = {})",
                v.name,
                v.extract.name()
            ),
            _ => String::new(),
        };
        out.push(0, self.reward(0).scalar, found, feedback);
        Ok(out)
    }
    fn done(&self) -> bool {
        self.answer.is_some()
    }
    /// The verifiers' scores and the program's reply (its reward and every component
    /// it declares, 0 where a reply leaves one out), weighted into the scalar.
    fn reward(&self, _seat: usize) -> Reward {
        let scores = self.scores();
        let s = &self.shared;
        let mut components: BTreeMap<String, f64> = s
            .verifiers
            .iter()
            .zip(&scores)
            .map(|(v, x)| (v.name.clone(), *x))
            .collect();
        let mut scalar: f64 = scores.iter().zip(&s.weights).map(|(x, w)| x * w).sum();
        if let Some(p) = &s.program {
            let spec = p.spec();
            let reply = self.reply.clone().unwrap_or_default();
            scalar += spec.weight * reply.reward;
            components.insert(spec.name.clone(), reply.reward);
            for c in &spec.components {
                components.insert(c.clone(), reply.components.get(c).copied().unwrap_or(0.0));
            }
        }
        Reward { components, scalar }
    }
    fn transcript(&self) -> serde_json::Value {
        let row = self.row();
        let steps: Vec<Vec<String>> = self.answer.iter().map(|a| vec![a.clone()]).collect();
        let scores: serde_json::Map<String, serde_json::Value> = self
            .shared
            .verifiers
            .iter()
            .zip(self.scores())
            .map(|(v, x)| (v.name.clone(), x.into()))
            .collect();
        serde_json::json!({
            "seed": self.seed,
            "steps": steps,
            "line": row.line,
            "id": row.fields.get("id"),
            "held_out": self.seed & HELD_OUT_BIT != 0,
            "scores": scores,
            "program": self.reply.as_ref().map(|r| serde_json::json!({
                "reward": r.reward,
                "components": r.components,
            })),
        })
    }
    fn clone_box(&self) -> Box<dyn Environment> {
        Box::new(self.clone())
    }
    fn as_scripted(&self) -> Option<&dyn Scripted> {
        Some(self)
    }
    fn as_scripted_mut(&mut self) -> Option<&mut dyn Scripted> {
        Some(self)
    }
    fn as_inspect(&self) -> Option<&dyn Inspect> {
        Some(self)
    }
    fn reward_request(&self, _seat: usize, text: &str) -> Option<RewardRequest> {
        let p = self
            .shared
            .program
            .as_ref()
            .filter(|_| self.answer.is_none())?;
        let (key, item) = self.request(text);
        Some(RewardRequest {
            scorer: p.clone(),
            key,
            item,
        })
    }
}

impl Scripted for Episode {
    /// The row's demonstration (empty when it has none).
    fn continuation_action(&mut self, _seat: usize) -> String {
        self.row().demonstration.clone().unwrap_or_default()
    }
    fn continuation_len(&self) -> Option<usize> {
        Some(usize::from(self.answer.is_none()))
    }
    fn policy_action(&mut self, policy: &str, seat: usize) -> Result<String> {
        match policy {
            "reference" => Ok(self.continuation_action(seat)),
            _ => bail!("unknown dataset policy `{policy}`; known: reference"),
        }
    }
}

impl Inspect for Episode {
    /// The accuracy component (a verifier's score or the program's) is at least 0.5.
    fn won(&self, _seat: usize) -> bool {
        self.reward(0)
            .components
            .get(&self.shared.accuracy)
            .is_some_and(|x| *x >= 0.5)
    }
    fn render_state(&self) -> String {
        let row = self.row();
        let prompt: Vec<String> = row
            .prompt
            .iter()
            .map(|m| format!("[{}] {}", m.role, m.content))
            .collect();
        format!(
            "{} line {}\n{}",
            self.shared.path.display(),
            row.line,
            prompt.join("\n")
        )
    }
}

impl Tools for DatasetFactory {
    fn describe(&self) -> String {
        let s = &self.0;
        let mut out = format!(
            "dataset: {} ({} rows: {} training, {} held out)\n\
             One answer per row; the reward is the weighted sum of the verifiers' 0/1 \
             scores, and `{}` decides a win (accuracy).\n\nverifiers:\n",
            s.path.display(),
            s.rows.len(),
            s.train.len(),
            s.held_out.len(),
            s.accuracy
        );
        for (v, w) in s.verifiers.iter().zip(&s.weights) {
            out.push_str(&format!(
                "  {} (weight {w}): {:?}, extract {:?}, reference field `{}`\n",
                v.name, v.check, v.extract, v.reference
            ));
        }
        if let Some(p) = &s.program {
            let p = p.spec();
            out.push_str(&format!(
                "  {} (weight {}): reward program {:?}{}, timeout {} s\n",
                p.name,
                p.weight,
                p.command,
                p.dir
                    .as_ref()
                    .map(|d| format!(" in {}", d.display()))
                    .unwrap_or_default(),
                p.timeout.as_secs_f64()
            ));
            if !p.components.is_empty() {
                out.push_str(&format!("    components: {}\n", p.components.join(", ")));
            }
        }
        out.push_str("\npolicies: reference (each row's demonstration)\npools: train, held_out\n");
        out
    }
    fn policies(&self) -> Vec<&'static str> {
        vec!["reference"]
    }
    fn pools(&self) -> Vec<&'static str> {
        vec!["train", "held_out"]
    }
    /// Every row of the pool's side once (up to `episodes`), played by `policy`.
    fn baseline(
        &self,
        policy: &str,
        pool: &str,
        episodes: usize,
        first_seed: u64,
    ) -> Result<BaselineRow> {
        let side = match pool {
            "train" => 0,
            "held_out" => HELD_OUT_BIT,
            _ => bail!("unknown dataset pool `{pool}`; known: train, held_out"),
        };
        // rows are played from the first of the side, whatever `first_seed`
        let _ = first_seed;
        let n = episodes.min(match side {
            0 => self.0.train.len(),
            _ => self.0.held_out.len(),
        });
        let (mut wins, mut sum) = (0usize, 0.0);
        let mut per: BTreeMap<String, f64> = BTreeMap::new();
        for i in 0..n as u64 {
            let mut env = self.reset(side | i);
            let text = env.policy_action(policy, 0)?;
            env.step(&[text])?;
            wins += usize::from(env.won(0));
            let r = env.reward(0);
            sum += r.scalar;
            for (k, v) in r.components {
                *per.entry(format!("{k}_rate")).or_default() += v / n.max(1) as f64;
            }
        }
        Ok(BaselineRow {
            policy: policy.to_string(),
            peers: pool.to_string(),
            level: None,
            episodes: n,
            win_rate: wins as f64 / n.max(1) as f64,
            win_ci: super::wilson_ci(wins, n),
            mean_reward: sum / n.max(1) as f64,
            extra: per,
        })
    }
}

#[cfg(test)]
mod program_tests;
#[cfg(test)]
mod tests;

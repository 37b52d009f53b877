//! What a resumed run may not change: [`FROZEN_ON_RESUME`] and the diff against the
//! run's saved config.
use super::optim::Schedule;
use super::Config;

/// Keys a resumed run may not change: they shape the adapter (`lora.*`, the base
/// model, `run.seed` which initialises it), the optimizer state (`optim.betas`,
/// `optim.eps`) or the learning-rate schedule (`optim.learning_rate`, `schedule`,
/// `warmup_steps`, `grpo.num_iterations`, and `run.steps` unless the schedule is
/// constant), or the curriculum the saved stage index points into (`stage`).
/// Everything else (sampling, logging, checkpoint cadence, loss knobs) may change.
pub const FROZEN_ON_RESUME: &[&str] = &[
    "model.name",
    "model.adapter",
    "lora.r",
    "lora.alpha",
    "lora.dropout",
    "lora.targets",
    "lora.use_rslora",
    "run.seed",
    "run.steps",
    "optim.learning_rate",
    "optim.betas",
    "optim.eps",
    "optim.schedule",
    "optim.warmup_steps",
    "grpo.num_iterations",
    "stage",
];

/// A frozen key with its value in the config a resume would use and in the saved one.
type Frozen = (&'static str, String, String);

fn d(v: &dyn std::fmt::Debug) -> String {
    format!("{v:?}")
}

impl Config {
    /// The [`FROZEN_ON_RESUME`] keys whose values differ between `saved` (the run's
    /// config.toml) and `self` (the config a resume would use). Empty: resumable.
    pub fn frozen_changes(&self, saved: &Config) -> Vec<String> {
        let mut out: Vec<String> = adapter_keys(self, saved)
            .into_iter()
            .chain(schedule_keys(self, saved))
            .filter(|(_, a, b)| a != b)
            .map(|(key, a, b)| format!("{key} ({b} -> {a})"))
            .collect();
        if self.stages != saved.stages {
            out.push("stage (the [[stage]] curriculum)".into());
        }
        out
    }
}

/// The frozen keys' values as a checkpoint records them (`trainer_state.json`):
/// what `--resume` compares against, whatever the run's config.toml says by then.
pub type FrozenRecord = std::collections::BTreeMap<String, String>;

/// Stands for the base weights in a [`FrozenRecord`]: their fingerprint.
const WEIGHTS: &str = "model.weights";

impl Config {
    /// This config's [`FrozenRecord`]. Paths are recorded by content, so a run that is
    /// moved or resumed from another directory still matches: the base model by
    /// [`weights_fingerprint`](crate::model::checkpoint::weights_fingerprint) (a Hub id
    /// by name), the start adapter by the fingerprint of its weights.
    pub fn frozen_record(&self) -> anyhow::Result<FrozenRecord> {
        use crate::model::checkpoint::weights_fingerprint;
        let mut out = FrozenRecord::new();
        for (key, value, _) in adapter_keys(self, self)
            .into_iter()
            .chain(schedule_keys(self, self))
        {
            let value = match key {
                "model.name" => match weights_fingerprint(&self.model.name)? {
                    Some(f) => {
                        out.insert(WEIGHTS.into(), f);
                        continue;
                    }
                    None => value,
                },
                "model.adapter" => match self.start_adapter() {
                    Some(dir) => {
                        let file = dir.join("adapter_model.safetensors");
                        weights_fingerprint(&file.to_string_lossy())?
                            .unwrap_or_else(|| dir.display().to_string())
                    }
                    None => value,
                },
                _ => value,
            };
            out.insert(key.into(), value);
        }
        out.insert("stage".into(), d(&self.stages));
        Ok(out)
    }

    /// The keys of `saved` (a checkpoint's record) whose values differ in `self`'s.
    pub fn record_changes(&self, saved: &FrozenRecord) -> anyhow::Result<Vec<String>> {
        let now = self.frozen_record()?;
        Ok(saved
            .iter()
            .filter_map(|(key, was)| {
                // A base that was local and is now a Hub id (or the other way) has no
                // value to compare: it changed.
                let base = key == WEIGHTS || key == "model.name";
                let is = match now.get(key) {
                    Some(is) => is,
                    None if base => return Some(format!("model.name (was {was})")),
                    None => return None,
                };
                (is != was).then(|| match key.as_str() {
                    WEIGHTS => "model.name (other base weights than the run's)".to_string(),
                    "model.adapter" => "model.adapter (another start adapter)".to_string(),
                    "stage" => "stage (the [[stage]] curriculum)".to_string(),
                    _ => format!("{key} ({was} -> {is})"),
                })
            })
            .collect())
    }
}

/// The keys that shape the adapter.
fn adapter_keys(a: &Config, b: &Config) -> Vec<Frozen> {
    // The same modules in another order or twice are the same adapter.
    let sorted = |t: &[String]| {
        let mut v = t.to_vec();
        v.sort();
        v.dedup();
        v
    };
    vec![
        ("model.name", a.model.name.clone(), b.model.name.clone()),
        // The adapter the run started from (a warm start's output counts as such).
        (
            "model.adapter",
            d(&a.start_adapter()),
            d(&b.start_adapter()),
        ),
        ("lora.r", d(&a.lora.r), d(&b.lora.r)),
        ("lora.alpha", d(&a.lora.alpha), d(&b.lora.alpha)),
        ("lora.dropout", d(&a.lora.dropout), d(&b.lora.dropout)),
        (
            "lora.targets",
            d(&sorted(&a.lora.targets)),
            d(&sorted(&b.lora.targets)),
        ),
        (
            "lora.use_rslora",
            d(&a.lora.use_rslora),
            d(&b.lora.use_rslora),
        ),
        ("run.seed", d(&a.run.seed), d(&b.run.seed)),
    ]
}

/// The keys that shape the optimizer state and the learning-rate schedule.
fn schedule_keys(a: &Config, b: &Config) -> Vec<Frozen> {
    let (o, p) = (&a.optim, &b.optim);
    let mut v = Vec::new();
    // A constant schedule does not depend on the run's length.
    if o.schedule != Schedule::Constant || p.schedule != Schedule::Constant {
        v.push(("run.steps", d(&a.run.steps), d(&b.run.steps)));
    }
    v.extend([
        (
            "optim.learning_rate",
            d(&o.learning_rate),
            d(&p.learning_rate),
        ),
        ("optim.betas", d(&o.betas), d(&p.betas)),
        ("optim.eps", d(&o.eps), d(&p.eps)),
        ("optim.schedule", d(&o.schedule), d(&p.schedule)),
        ("optim.warmup_steps", d(&o.warmup_steps), d(&p.warmup_steps)),
        (
            "grpo.num_iterations",
            d(&a.grpo.num_iterations),
            d(&b.grpo.num_iterations),
        ),
    ]);
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frozen_changes_lists_each_changed_key_in_order() {
        let saved = Config::default();
        let mut c = saved.clone();
        assert!(c.frozen_changes(&saved).is_empty());
        c.run.steps = 200;
        c.lora.r = 8;
        c.lora.targets.reverse();
        c.grpo.temperature = 0.5;
        assert_eq!(
            c.frozen_changes(&saved),
            ["lora.r (16 -> 8)", "run.steps (100 -> 200)"]
        );
        c.optim.schedule = Schedule::Constant;
        c.run.steps = saved.run.steps + 1;
        let mut s = saved.clone();
        s.optim.schedule = Schedule::Constant;
        assert_eq!(c.frozen_changes(&s), ["lora.r (16 -> 8)"]);
        c.stages.push(crate::config::stage::StageSpec {
            name: "a".into(),
            steps: Some(1),
            max_steps: None,
            promote_when: None,
            envs: Default::default(),
            options: Default::default(),
            mode: None,
            grpo: Default::default(),
            optim: Default::default(),
        });
        assert_eq!(
            c.frozen_changes(&s).last().unwrap(),
            "stage (the [[stage]] curriculum)"
        );
    }
}

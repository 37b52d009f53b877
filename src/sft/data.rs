//! Demonstrations: (prompt messages, completion) pairs from a JSONL file, an
//! environment's scripted policy, or the model's own samples that cleared a reward bar
//! (rejection sampling), tokenized for training.
//!
//! Everything is read, checked and tokenized before a run directory is touched, so bad
//! data stops the run with nothing written. A JSONL error names the file, the line and
//! the field.
use crate::chat::{check_messages, Message};
use crate::config::sft::SftConfig;
use crate::config::{Config, GrpoConfig};
use crate::envs::{self, EnvFactory};
use crate::model::qwen2::Qwen2;
use crate::rng::mix_seeds as mix;
use crate::task::{EnvTask, Renderer};
use anyhow::{anyhow, bail, Context, Result};
use serde_json::Value;
use std::path::Path;

/// One demonstration as text.
#[derive(Debug, Clone, PartialEq)]
pub struct Demo {
    pub messages: Vec<Message>,
    pub completion: String,
}

/// One demonstration as token ids: the chat template of the prompt with the generation
/// prompt, then the completion followed by the end-of-turn token (so the model learns
/// to stop). Only `completion_ids` carry loss.
#[derive(Debug, Clone, PartialEq)]
pub struct Example {
    pub prompt_ids: Vec<u32>,
    pub completion_ids: Vec<u32>,
}

/// Parse JSONL text (named `origin` in errors): one `{"messages": [{"role",
/// "content"}, ...], "completion": "..."}` object per line; blank lines are skipped and
/// other fields ignored. Errors name the file, the 1-based line and the field.
pub fn parse_jsonl(text: &str, origin: &str) -> Result<Vec<Demo>> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let at = |field: &str, msg: String| anyhow!("{origin}: line {}: {field}: {msg}", i + 1);
        let v: Value = serde_json::from_str(line)
            .map_err(|e| anyhow!("{origin}: line {}: not valid JSON ({e})", i + 1))?;
        let obj = v.as_object().ok_or_else(|| {
            anyhow!(
                "{origin}: line {}: expected an object {{\"messages\": [...], \"completion\": \"...\"}}",
                i + 1
            )
        })?;
        let msgs = obj
            .get("messages")
            .ok_or_else(|| at("`messages`", "missing".into()))?;
        let messages: Vec<Message> = serde_json::from_value(msgs.clone()).map_err(|_| {
            at(
                "`messages`",
                "expected a list of {\"role\": ..., \"content\": \"...\"} objects".into(),
            )
        })?;
        check_messages(&messages).map_err(|e| at("`messages`", e.to_string()))?;
        let completion = match obj.get("completion") {
            None => return Err(at("`completion`", "missing".into())),
            Some(Value::String(s)) if !s.is_empty() => s.clone(),
            Some(Value::String(_)) => return Err(at("`completion`", "is empty".into())),
            Some(_) => return Err(at("`completion`", "expected a string".into())),
        };
        out.push(Demo {
            messages,
            completion,
        });
    }
    if out.is_empty() {
        bail!("{origin}: no demonstrations (expected one JSON object per line)");
    }
    Ok(out)
}

/// [`parse_jsonl`] of a file.
pub fn read_jsonl(path: &Path) -> Result<Vec<Demo>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    parse_jsonl(&text, &path.display().to_string())
}

/// The environment an `env` / `rejection` source plays: `[sft] env` (with
/// `[sft.options]`), else `[env]` with its options.
pub fn source_env(cfg: &Config, s: &SftConfig) -> Result<(String, envs::Options)> {
    let env = cfg.env.as_ref();
    let name = match (&s.env, env) {
        (Some(n), _) => n.clone(),
        (None, Some(e)) => e.name.clone(),
        (None, None) => bail!("sft.env: this source needs an environment"),
    };
    let options = match (&s.options, env) {
        (Some(o), _) => o.clone(),
        (None, Some(e)) if e.name == name => e.options.clone(),
        _ => envs::Options::new(),
    };
    Ok((name, options))
}

/// `n` demonstrations of scripted `policy`: decision `i` is
/// [`envs::sample_decision`] of a training seed drawn from `(seed, i)`, and its
/// completion the text the policy plays for that seat there.
pub fn scripted_demos(
    factory: &dyn EnvFactory,
    policy: &str,
    n: usize,
    seed: u64,
) -> Result<Vec<Demo>> {
    if !factory.policies().is_empty() && !factory.policies().contains(&policy) {
        bail!(
            "sft.policy: `{policy}` is not a {} policy; known: {}",
            factory.name(),
            factory.policies().join(", ")
        );
    }
    (0..n as u64)
        .map(|i| {
            let mut d = envs::sample_decision(factory, envs::training_seed(mix(seed, i)));
            let completion = d
                .env
                .policy_action(policy, d.seat)
                .with_context(|| format!("sft.policy `{policy}`"))?;
            Ok(Demo {
                messages: d.messages,
                completion,
            })
        })
        .collect()
}

/// Rejection sampling: draw prompts of `task` in rounds of `g.prompts_per_step`, sample
/// `g.num_generations` completions of each with the model as it is, and keep those that
/// ended on a stop token with a scalar reward of at least `min_reward`, until `n` are
/// kept or `max_prompts` prompts are drawn. Returns the kept examples (already tokens:
/// the sampled ids) and the prompts drawn.
#[allow(clippy::too_many_arguments)]
pub fn rejection_examples(
    model: &Qwen2,
    renderer: &dyn Renderer,
    task: &mut EnvTask,
    g: &GrpoConfig,
    n: usize,
    min_reward: f64,
    max_prompts: usize,
    seed: u64,
) -> Result<(Vec<Example>, usize)> {
    let g = GrpoConfig {
        dynamic_sampling: false,
        ..g.clone()
    };
    let stop = renderer.stop_ids();
    let mut kept = Vec::new();
    let mut drawn = 0;
    let mut round = 0u64;
    while kept.len() < n && drawn < max_prompts {
        let want = g.prompts_per_step.min(max_prompts - drawn);
        let gr = GrpoConfig {
            prompts_per_step: want,
            ..g.clone()
        };
        let batch = crate::grpo::batch::collect(
            model,
            renderer,
            task,
            &gr,
            mix(seed, round),
            false,
            &crate::dist::Dist::single(),
        )?;
        drawn += want;
        round += 1;
        for r in batch.rollouts {
            let stopped = r.completion_ids.last().is_some_and(|t| stop.contains(t));
            if kept.len() < n && stopped && !r.truncated && r.scalar >= min_reward {
                kept.push(Example {
                    prompt_ids: r.prompt_ids,
                    completion_ids: r.completion_ids,
                });
            }
        }
    }
    Ok((kept, drawn))
}

/// Token ids of demonstrations: the prompt's chat template (with the generation
/// prompt) and the completion's tokens plus the first stop token. `where_` names the
/// source in errors.
pub fn tokenize(demos: &[Demo], renderer: &dyn Renderer, where_: &str) -> Result<Vec<Example>> {
    let stop = renderer
        .stop_ids()
        .first()
        .copied()
        .ok_or_else(|| anyhow!("{where_}: the tokenizer has no end-of-turn token"))?;
    demos
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let (_, prompt_ids) = renderer
                .render(&d.messages)
                .with_context(|| format!("{where_}: demonstration {}: messages", i + 1))?;
            // The completion alone: its tokens follow the generation prompt exactly
            // as a sampled completion's would.
            let mut completion_ids = renderer
                .encode_text(&d.completion)
                .with_context(|| format!("{where_}: demonstration {}: completion", i + 1))?;
            completion_ids.push(stop);
            Ok(Example {
                prompt_ids,
                completion_ids,
            })
        })
        .collect()
}

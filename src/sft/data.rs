//! Demonstrations: (prompt messages, completion) pairs from a JSONL file or an
//! environment's scripted policy, tokenized for training. (The third source, the
//! model's own samples that cleared a reward bar, is drawn by
//! [`crate::train::demos`], which sees the sampler and the tasks.)
//!
//! Everything is read, checked and tokenized before a run directory is touched, so bad
//! data stops the run with nothing written. A JSONL error names the file, the line and
//! the field.
use crate::chat::{check_messages, Message};
use crate::config::sft::{SftBalance, SftConfig, BALANCE_POOL};
use crate::config::Config;
use crate::envs::{self, EnvFactory};
use crate::learn::Sequence;
use crate::rng::mix_seeds as mix;
use crate::task::Renderer;
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

impl Example {
    /// The row the learner trains on: every completion token carries loss.
    pub fn sequence(&self) -> Sequence {
        Sequence::demonstration(&self.prompt_ids, &self.completion_ids)
    }
}

/// The longest demonstration line read: Qwen2.5's longest context, 131,072 tokens, is
/// about 0.5 MB of text. A longer line was refused only after it was tokenized (a 50 MB
/// line: 50 s and 5.3 GB).
pub const MAX_DEMO_LINE_BYTES: usize = 4 << 20;

/// Parse JSONL text (named `origin` in errors): one `{"messages": [{"role",
/// "content"}, ...], "completion": "..."}` object per line; blank lines are skipped and
/// other fields ignored. Errors name the file, the 1-based line and the field.
pub fn parse_jsonl(text: &str, origin: &str) -> Result<Vec<Demo>> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        if line.len() > MAX_DEMO_LINE_BYTES {
            bail!(
                "{origin}: line {}: {} bytes, more than any model's context holds (at most \
                 {MAX_DEMO_LINE_BYTES})",
                i + 1,
                line.len()
            );
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
/// completion the text the policy plays for that seat there. With
/// `SftBalance::Situation` the decisions are stratified by situation (see the key).
pub fn scripted_demos(
    factory: &dyn EnvFactory,
    policy: &str,
    n: usize,
    seed: u64,
    balance: SftBalance,
) -> Result<Vec<Demo>> {
    if !factory.policies().is_empty() && !factory.policies().contains(&policy) {
        bail!(
            "sft.policy: `{policy}` is not a {} policy; known: {}",
            factory.name(),
            factory.policies().join(", ")
        );
    }
    let draw = |i: usize| envs::sample_decision(factory, envs::training_seed(mix(seed, i as u64)));
    let decisions: Vec<envs::Decision> = match balance {
        SftBalance::None => (0..n).map(draw).collect(),
        SftBalance::Situation => balanced_decisions(factory, n, draw)?,
    };
    decisions
        .into_iter()
        .map(|mut d| {
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

/// `n` decisions from a pool of `BALANCE_POOL * n` draws: one per situation in turn
/// (situations in report order, each in draw order), skipping situations whose share
/// of the pool is used up. Only the draw indices are pooled, at most `n` a situation
/// (no more can be taken), and the chosen ones drawn again: `draw` is a function of
/// its index, and a pool of live environments would grow with `BALANCE_POOL * n`.
fn balanced_decisions(
    factory: &dyn EnvFactory,
    n: usize,
    draw: impl Fn(usize) -> envs::Decision,
) -> Result<Vec<envs::Decision>> {
    let probe = factory.reset(0);
    let Some(b) = probe.as_behaviour() else {
        bail!(
            "sft.balance: `situation` needs an environment with a behaviour report; {} has none",
            factory.name()
        );
    };
    let names = b.situations();
    let mut pools: Vec<std::collections::VecDeque<usize>> =
        names.iter().map(|_| Default::default()).collect();
    for i in 0..BALANCE_POOL * n {
        let d = draw(i);
        let situation = d
            .env
            .as_behaviour()
            .map(|b| b.view(d.seat).situation)
            .context("sft.balance: the environment lost its behaviour report")?;
        let k = names
            .iter()
            .position(|&s| s == situation)
            .with_context(|| {
                format!("sft.balance: situation `{situation}` is not in the environment's list")
            })?;
        if pools[k].len() < n {
            pools[k].push_back(i);
        }
    }
    let mut chosen = Vec::with_capacity(n);
    // The pool holds at least `n` draws, so every pass takes one until it has `n`.
    while chosen.len() < n && pools.iter().any(|p| !p.is_empty()) {
        for pool in pools.iter_mut() {
            if chosen.len() < n {
                chosen.extend(pool.pop_front());
            }
        }
    }
    Ok(chosen.into_iter().map(draw).collect())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_oversized_line_is_refused_before_it_is_parsed() {
        let ok = r#"{"messages": [{"role": "user", "content": "hi"}], "completion": "x"}"#;
        let long = ok.replace("\"x\"", &format!("\"{}\"", "y".repeat(MAX_DEMO_LINE_BYTES)));
        let e = parse_jsonl(&format!("{ok}\n{long}\n"), "d.jsonl")
            .unwrap_err()
            .to_string();
        assert!(e.contains("d.jsonl: line 2") && e.contains("bytes"), "{e}");
        assert_eq!(parse_jsonl(ok, "d.jsonl").unwrap().len(), 1);
    }

    fn situations(factory: &dyn EnvFactory, ds: &[envs::Decision]) -> Vec<&'static str> {
        let names = factory.reset(0).as_behaviour().unwrap().situations();
        let mut count = vec![0usize; names.len()];
        for d in ds {
            let s = d.env.as_behaviour().unwrap().view(d.seat).situation;
            count[names.iter().position(|&n| n == s).unwrap()] += 1;
        }
        // situation names repeated by count, for readable assertions
        names
            .iter()
            .zip(count)
            .flat_map(|(&n, c)| std::iter::repeat_n(n, c))
            .collect()
    }

    #[test]
    fn balancing_by_situation_lifts_rare_branches() {
        let f = envs::create("ticketmelt", &envs::Options::new()).unwrap();
        let draw =
            |i: usize| envs::sample_decision(f.as_ref(), envs::training_seed(mix(3, i as u64)));
        let n = 120;
        let natural: Vec<_> = (0..n).map(draw).collect();
        let balanced = balanced_decisions(f.as_ref(), n, draw).unwrap();
        assert_eq!(balanced.len(), n);
        let count = |v: &[&str], s: &str| v.iter().filter(|&&x| x == s).count();
        let (nat, bal) = (
            situations(f.as_ref(), &natural),
            situations(f.as_ref(), &balanced),
        );
        // Each of the six situations gets n / 6 = 20 when its pool of 960 draws has them.
        for s in f.reset(0).as_behaviour().unwrap().situations() {
            assert!(count(&bal, s) <= 20 || count(&nat, s) > 20, "{s}: {bal:?}");
        }
        assert_eq!(count(&bal, "opening_slack"), 20, "{bal:?}");
        assert!(count(&nat, "opening_slack") < 10, "{nat:?}");
        assert!(count(&nat, "restored") > 30 && count(&bal, "restored") == 20);
        // Deterministic per seed.
        let again = balanced_decisions(f.as_ref(), n, draw).unwrap();
        let seeds = |v: &[envs::Decision]| v.iter().map(|d| (d.seed, d.seat)).collect::<Vec<_>>();
        assert_eq!(seeds(&balanced), seeds(&again));
    }

    #[test]
    fn balancing_needs_a_behaviour_report() {
        // postmortem has no behaviour report (whispers has one since the warm-start
        // diagnosis needed it)
        let f = envs::create("postmortem", &envs::Options::new()).unwrap();
        let e = scripted_demos(f.as_ref(), "random", 4, 1, SftBalance::Situation)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("sft.balance") && e.contains("postmortem"), "{e}");
        assert_eq!(
            scripted_demos(f.as_ref(), "random", 4, 1, SftBalance::None)
                .unwrap()
                .len(),
            4
        );
    }
}

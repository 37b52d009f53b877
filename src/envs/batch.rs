//! Rewards that are cheaper asked for a batch at a time (a reward program, an outside
//! process): before episodes are stepped one by one, whoever holds a batch of answers
//! hands them over in one exchange ([`prefetch`]), and each episode's step then finds
//! its reward ready.
//!
//! An episode offers this through [`super::Environment::reward_request`]; the trainer
//! (`Task::prefetch`), [`super::rollout::play`] (evaluation, episode mode, model
//! continuations) call [`prefetch`]. Without it a step asks for its own answer alone,
//! which gives the same reward, only with more exchanges.
use super::Environment;
use anyhow::Result;
use serde_json::Value;
use std::sync::Arc;

/// Whoever scores a batch of answers and keeps the replies for the steps that follow.
pub trait BatchScorer: Send + Sync {
    /// Score every `(key, item)` in one exchange and keep the replies by key, in place of
    /// those kept before; an error when the scorer failed.
    fn prefetch(&self, items: Vec<(u64, Value)>) -> Result<()>;
}

/// Keyed items for one scorer.
type Batch = Vec<(u64, Value)>;

/// What an episode would send to score one answer.
pub struct RewardRequest {
    pub scorer: Arc<dyn BatchScorer>,
    /// Identifies the answer (its row and text) among the batch's replies.
    pub key: u64,
    pub item: Value,
}

/// Hand every `(episode, seat, text)` whose episode scores through a [`BatchScorer`] to
/// its scorer, one exchange per scorer.
pub fn prefetch<'a>(
    answers: impl IntoIterator<Item = (&'a dyn Environment, usize, &'a str)>,
) -> Result<()> {
    let mut groups: Vec<(Arc<dyn BatchScorer>, Batch)> = Vec::new();
    for (env, seat, text) in answers {
        let Some(r) = env.reward_request(seat, text) else {
            continue;
        };
        let same =
            |s: &Arc<dyn BatchScorer>| std::ptr::addr_eq(Arc::as_ptr(s), Arc::as_ptr(&r.scorer));
        match groups.iter_mut().find(|(s, _)| same(s)) {
            Some((_, items)) => items.push((r.key, r.item)),
            None => groups.push((r.scorer, vec![(r.key, r.item)])),
        }
    }
    for (scorer, items) in groups {
        scorer.prefetch(items)?;
    }
    Ok(())
}

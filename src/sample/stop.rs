//! How a completion ends: a stop token (`eos`), a stop string in the decoded text
//! (`stop`, matched across token boundaries by [`StopMatcher`]) or the budget
//! (`length`), and the text it keeps.
use crate::model::tokenizer::Renderer;

use super::params::{FinishReason, SamplingParams};

/// Detects stop strings in a row's decoded text, across token boundaries.
#[derive(Debug, Clone)]
pub struct StopMatcher {
    stops: Vec<String>,
    max_len: usize,
    /// Byte length of the text already searched (a match must end after it).
    searched: usize,
}

impl StopMatcher {
    pub fn new(stops: &[String]) -> Self {
        let max_len = stops.iter().map(|s| s.len()).max().unwrap_or(0);
        Self {
            stops: stops.to_vec(),
            max_len,
            searched: 0,
        }
    }

    pub fn is_active(&self) -> bool {
        !self.stops.is_empty()
    }

    /// Given the full decoded text so far, returns the byte offset where the earliest
    /// stop string starts (the text is to be cut there), or None.
    pub fn check(&mut self, text: &str) -> Option<usize> {
        if self.stops.is_empty() {
            return None;
        }
        // Search only where a new match can be: from max_len bytes before the old end.
        let mut from = self
            .searched
            .saturating_sub(self.max_len.saturating_sub(1))
            .min(text.len());
        while !text.is_char_boundary(from) {
            from -= 1;
        }
        let hay = &text[from..];
        let found = self
            .stops
            .iter()
            .filter_map(|s| hay.find(s.as_str()))
            .min()
            .map(|p| p + from);
        self.searched = text.len();
        found
    }
}

/// Whether a completion whose last token was just appended to `ids` is finished: a stop
/// token (once past `min_new_tokens`), then a stop string (with the text cut before it),
/// then the budget.
pub fn check_finish(
    ids: &[u32],
    params: &SamplingParams,
    stop: &mut StopMatcher,
    decoder: &dyn Renderer,
) -> anyhow::Result<Option<(FinishReason, Option<String>)>> {
    let Some(&last) = ids.last() else {
        return Ok(None);
    };
    if params.stop_token_ids.contains(&last) && ids.len() > params.min_new_tokens {
        return Ok(Some((FinishReason::Eos, None)));
    }
    if stop.is_active() {
        let text = decoder.decode(ids)?;
        if let Some(pos) = stop.check(&text) {
            return Ok(Some((FinishReason::Stop, Some(text[..pos].to_string()))));
        }
    }
    if ids.len() >= params.max_new_tokens {
        return Ok(Some((FinishReason::Length, None)));
    }
    Ok(None)
}

/// The text of a finished completion: the stop-string cut when there is one, else the
/// decoded ids without a final stop token.
pub fn completion_text(
    ids: &[u32],
    finish: FinishReason,
    cut: Option<String>,
    decoder: &dyn Renderer,
) -> anyhow::Result<String> {
    match (finish, cut) {
        (_, Some(t)) => Ok(t),
        (FinishReason::Eos, None) => decoder.decode(&ids[..ids.len().saturating_sub(1)]),
        (_, None) => decoder.decode(ids),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_string_across_token_boundaries() {
        let vocab = ["Hel", "lo", " wor", "ld", "<", "/a", "ns", ">", "!"];
        let dec = |ids: &[u32]| -> anyhow::Result<String> {
            Ok(ids.iter().map(|&i| vocab[i as usize]).collect())
        };
        let mut m = StopMatcher::new(&["</ans>".to_string(), "world!".to_string()]);
        let seq = [0u32, 1, 4, 5, 6, 7, 8];
        let mut hit = None;
        for n in 1..=seq.len() {
            let text = dec(&seq[..n]).unwrap();
            if let Some(p) = m.check(&text) {
                hit = Some((n, text[..p].to_string()));
                break;
            }
        }
        assert_eq!(hit, Some((6, "Hello".to_string())));
        // second stop string, split over three tokens
        let mut m = StopMatcher::new(&["</ans>".to_string(), "world!".to_string()]);
        let seq = [0u32, 2, 3, 8, 0];
        let mut hit = None;
        for n in 1..=seq.len() {
            let text = dec(&seq[..n]).unwrap();
            if let Some(p) = m.check(&text) {
                hit = Some((n, text[..p].to_string()));
                break;
            }
        }
        assert_eq!(hit, Some((4, "Hel ".to_string())));
    }

    #[test]
    fn stop_matcher_reports_earliest_and_handles_unicode() {
        let mut m = StopMatcher::new(&["é!".to_string()]);
        assert_eq!(m.check("aé"), None);
        assert_eq!(m.check("aéé"), None);
        assert_eq!(m.check("aéé!x"), Some(3));
    }
}

//! Stopping a warm start before it imitates perfectly (`[sft] stop_at_loss`,
//! `stop_at_token_accuracy`, `stop_window`). A warm start trained to zero loss makes
//! every completion of a GRPO group the same, and GRPO then has nothing to learn from;
//! one stopped at a target loss or token accuracy has the format and leaves room to
//! explore. The rule reads the means over the last `window` steps, which are the log's
//! own `loss` and `mean_token_accuracy` columns, so a resumed run refills its window
//! from `training_log.csv` and a stopped run stays stopped.
use crate::run::log::TrainingLog;
use anyhow::Result;
use std::collections::VecDeque;
use std::path::Path;

/// When a warm start stops.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StopRule {
    /// Stop at a window mean loss at or below this.
    pub loss: Option<f64>,
    /// Stop at a window mean token accuracy at or above this.
    pub token_accuracy: Option<f64>,
    /// Steps averaged.
    pub window: usize,
}

/// The last steps' losses and token accuracies, against a [`StopRule`].
#[derive(Debug, Clone)]
pub struct EarlyStop {
    rule: StopRule,
    recent: VecDeque<(f64, f64)>,
}

impl EarlyStop {
    pub fn new(rule: StopRule) -> Self {
        Self {
            rule,
            recent: VecDeque::with_capacity(rule.window),
        }
    }

    /// The window as it stood after step `step`, from the rows of `training_log.csv`
    /// in `run_dir` (empty when there is no log).
    pub fn resumed(rule: StopRule, run_dir: &Path, step: usize) -> Result<Self> {
        let mut s = Self::new(rule);
        let path = run_dir.join(crate::run::log::TRAINING_LOG);
        if !path.exists() {
            return Ok(s);
        }
        let log = TrainingLog::read(&path)?;
        if let (Some(loss), Some(acc)) = (log.column("loss"), log.column("mean_token_accuracy")) {
            for ((st, l), a) in log.steps.iter().zip(loss).zip(acc) {
                if *st <= step as f64 {
                    s.push(*l, *a);
                }
            }
        }
        Ok(s)
    }

    pub fn push(&mut self, loss: f64, token_accuracy: f64) {
        if self.recent.len() == self.rule.window {
            self.recent.pop_front();
        }
        self.recent.push_back((loss, token_accuracy));
    }

    /// The mean loss and token accuracy over a full window; `None` before it fills.
    pub fn means(&self) -> Option<(f64, f64)> {
        if self.recent.len() < self.rule.window {
            return None;
        }
        let n = self.recent.len() as f64;
        let (l, a) = self
            .recent
            .iter()
            .fold((0.0, 0.0), |(l, a), (x, y)| (l + x, a + y));
        Some((l / n, a / n))
    }

    /// Why the warm start stops now, or `None` to go on.
    pub fn reached(&self) -> Option<String> {
        let (loss, acc) = self.means()?;
        let w = self.rule.window;
        if let Some(t) = self.rule.loss.filter(|t| loss <= *t) {
            return Some(format!(
                "mean loss {loss:.4} over the last {w} steps <= stop_at_loss {t}"
            ));
        }
        if let Some(t) = self.rule.token_accuracy.filter(|t| acc >= *t) {
            return Some(format!(
                "mean token accuracy {acc:.4} over the last {w} steps >= stop_at_token_accuracy {t}"
            ));
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stops_on_a_full_window_only() {
        let rule = StopRule {
            loss: Some(0.5),
            token_accuracy: None,
            window: 3,
        };
        let mut s = EarlyStop::new(rule);
        s.push(0.25, 1.0);
        s.push(0.25, 1.0);
        assert!(s.reached().is_none(), "two of three steps");
        s.push(1.0, 0.5);
        // (0.25 + 0.25 + 1.0) / 3 = 0.5: at the target
        assert!(s.reached().is_some());
        s.push(0.5, 1.0);
        // (0.25 + 1.0 + 0.5) / 3 = 0.583
        assert!(s.reached().is_none());
    }

    #[test]
    fn accuracy_target() {
        let rule = StopRule {
            loss: None,
            token_accuracy: Some(0.875),
            window: 2,
        };
        let mut s = EarlyStop::new(rule);
        s.push(2.0, 0.75);
        s.push(2.0, 1.0);
        assert!(s.reached().is_some(), "mean 0.875");
        s.push(2.0, 0.5);
        assert!(s.reached().is_none(), "mean 0.75");
    }
}

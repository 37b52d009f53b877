//! A rollout: one sampled completion of one prompt, with its reward and advantage, and
//! the [`Sequence`] the learner trains on.
use crate::envs::Reward;
use crate::learn::Sequence;

/// One completion of one prompt, scored.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Rollout {
    /// Index of the prompt (group) in the step.
    pub group: usize,
    pub prompt_ids: Vec<u32>,
    pub completion_ids: Vec<u32>,
    /// Per completion token: 1 for model tokens, 0 for environment tokens (multi-turn
    /// trajectories keep environment turns in context but without loss).
    pub env_mask: Vec<f32>,
    /// Hit the length cap without a stop token / string.
    pub truncated: bool,
    pub text: String,
    pub reward: Reward,
    /// The scalar GRPO optimises (after `reward_weights`).
    pub scalar: f64,
    pub advantage: f64,
    /// The sampler's log-probs of the completion tokens under `softmax(logits / T)`
    /// (what the trainer recomputes), for the mismatch metrics and corrections.
    pub sampler_logp: Option<Vec<f32>>,
    /// Put in the group, not sampled (`[env] enumerate_actions`).
    #[serde(default)]
    pub forced: bool,
}

impl Rollout {
    /// The loss mask of the completion tokens: env mask, zeroed entirely for a
    /// truncated completion when `mask_truncated`.
    pub fn loss_mask(&self, mask_truncated: bool) -> Vec<f32> {
        if mask_truncated && self.truncated {
            vec![0.0; self.completion_ids.len()]
        } else {
            self.env_mask.clone()
        }
    }

    /// The row the learner trains on (`mask_truncated`: `grpo.mask_truncated_completions`).
    pub fn sequence(&self, mask_truncated: bool) -> Sequence {
        Sequence {
            group: self.group,
            prompt_ids: self.prompt_ids.clone(),
            completion_ids: self.completion_ids.clone(),
            mask: self.loss_mask(mask_truncated),
            advantage: self.advantage,
            old_logp: None,
            sampler_logp: self.sampler_logp.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_truncated_completion_carries_no_loss_when_masked() {
        let r = Rollout {
            group: 2,
            prompt_ids: vec![5],
            completion_ids: vec![6, 7, 8],
            env_mask: vec![1.0, 0.0, 1.0],
            truncated: true,
            text: String::new(),
            reward: Reward::default(),
            scalar: 0.0,
            advantage: -0.25,
            sampler_logp: Some(vec![-1.0; 3]),
            forced: false,
        };
        let s = r.sequence(false);
        assert_eq!(s.mask, vec![1.0, 0.0, 1.0]);
        assert_eq!((s.group, s.advantage), (2, -0.25));
        assert_eq!(s.sampler_logp, r.sampler_logp);
        assert_eq!(r.sequence(true).mask, vec![0.0; 3]);
        let untruncated = Rollout {
            truncated: false,
            ..r.clone()
        };
        assert_eq!(untruncated.sequence(true).mask, vec![1.0, 0.0, 1.0]);
    }
}

//! Rollouts (one sampled completion with its reward) and their packing into the
//! padded tensors of a training forward pass.
//!
//! Layout of a packed micro-batch: every row is `[left padding | prompt | completion |
//! right padding]` with the prompt ending at column `prompt_len` for every row, so the
//! completion tokens of all rows occupy the same columns `prompt_len..prompt_len +
//! comp_len`, and their next-token log-probs come from hidden states
//! `prompt_len - 1 .. prompt_len + comp_len - 1` only: the LM head never sees prompt
//! positions.
use crate::envs::Reward;
use anyhow::{bail, Result};

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
    /// Log-probs recorded for `num_iterations > 1` (per completion token).
    pub old_logp: Option<Vec<f32>>,
    /// The sampler's log-probs of the completion tokens under `softmax(logits / T)`
    /// (what the trainer recomputes), for the mismatch metrics and corrections.
    pub sampler_logp: Option<Vec<f32>>,
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
}

/// A padded micro-batch.
#[derive(Debug, Clone, PartialEq)]
pub struct Packed {
    pub rows: usize,
    /// Columns: `prompt_len + comp_len`.
    pub width: usize,
    pub prompt_len: usize,
    pub comp_len: usize,
    /// `rows * width` token ids (padding = `pad_id`).
    pub ids: Vec<u32>,
    /// `rows * width`: 1 for real tokens.
    pub attention: Vec<u8>,
    /// `rows * comp_len` completion targets (padding = `pad_id`).
    pub targets: Vec<u32>,
    /// `rows * comp_len` loss mask.
    pub mask: Vec<f32>,
    /// `rows * comp_len` old log-probs (0 where absent).
    pub old_logp: Vec<f32>,
    /// Whether every row had old log-probs.
    pub has_old: bool,
    /// `rows * comp_len` sampler log-probs (0 where absent).
    pub sampler_logp: Vec<f32>,
    /// Whether every row had sampler log-probs.
    pub has_sampler: bool,
    pub advantages: Vec<f32>,
}

/// Pack rollouts into one padded micro-batch.
pub fn pack(rows: &[&Rollout], pad_id: u32, mask_truncated: bool) -> Result<Packed> {
    if rows.is_empty() {
        bail!("pack: no rows");
    }
    let prompt_len = rows.iter().map(|r| r.prompt_ids.len()).max().unwrap_or(0);
    let comp_len = rows
        .iter()
        .map(|r| r.completion_ids.len())
        .max()
        .unwrap_or(0);
    if prompt_len == 0 {
        bail!("pack: empty prompt");
    }
    if comp_len == 0 {
        bail!("pack: every completion is empty");
    }
    let width = prompt_len + comp_len;
    let n = rows.len();
    let mut p = Packed {
        rows: n,
        width,
        prompt_len,
        comp_len,
        ids: vec![pad_id; n * width],
        attention: vec![0; n * width],
        targets: vec![pad_id; n * comp_len],
        mask: vec![0.0; n * comp_len],
        old_logp: vec![0.0; n * comp_len],
        has_old: rows.iter().all(|r| r.old_logp.is_some()),
        sampler_logp: vec![0.0; n * comp_len],
        has_sampler: rows.iter().all(|r| r.sampler_logp.is_some()),
        advantages: rows.iter().map(|r| r.advantage as f32).collect(),
    };
    for (i, r) in rows.iter().enumerate() {
        if r.env_mask.len() != r.completion_ids.len() {
            bail!(
                "rollout has {} completion tokens but {} env-mask entries",
                r.completion_ids.len(),
                r.env_mask.len()
            );
        }
        let row = i * width;
        let start = prompt_len - r.prompt_ids.len();
        for (j, &t) in r.prompt_ids.iter().enumerate() {
            p.ids[row + start + j] = t;
            p.attention[row + start + j] = 1;
        }
        let lm = r.loss_mask(mask_truncated);
        for (j, &t) in r.completion_ids.iter().enumerate() {
            p.ids[row + prompt_len + j] = t;
            p.attention[row + prompt_len + j] = 1;
            p.targets[i * comp_len + j] = t;
            p.mask[i * comp_len + j] = lm[j];
        }
        if let Some(o) = &r.old_logp {
            if o.len() != r.completion_ids.len() {
                bail!(
                    "old log-probs have {} entries for {} tokens",
                    o.len(),
                    r.completion_ids.len()
                );
            }
            p.old_logp[i * comp_len..i * comp_len + o.len()].copy_from_slice(o);
        }
        if let Some(s) = &r.sampler_logp {
            if s.len() != r.completion_ids.len() {
                bail!(
                    "sampler log-probs have {} entries for {} tokens",
                    s.len(),
                    r.completion_ids.len()
                );
            }
            p.sampler_logp[i * comp_len..i * comp_len + s.len()].copy_from_slice(s);
        }
    }
    Ok(p)
}

/// Split `n` rows into micro-batches of at most `micro` rows (0: one batch).
pub fn micro_batches(n: usize, micro: usize) -> Vec<std::ops::Range<usize>> {
    let m = if micro == 0 { n.max(1) } else { micro };
    (0..n).step_by(m).map(|s| s..(s + m).min(n)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(p: &[u32], c: &[u32], truncated: bool) -> Rollout {
        Rollout {
            group: 0,
            prompt_ids: p.to_vec(),
            completion_ids: c.to_vec(),
            env_mask: vec![1.0; c.len()],
            truncated,
            text: String::new(),
            reward: Reward::default(),
            scalar: 0.0,
            advantage: 0.5,
            old_logp: None,
            sampler_logp: None,
        }
    }

    #[test]
    fn packs_left_and_right_padding() {
        let a = r(&[1, 2, 3], &[4], false);
        let mut b = r(&[5], &[6, 7, 8], true);
        b.env_mask = vec![1.0, 0.0, 1.0];
        let p = pack(&[&a, &b], 0, false).unwrap();
        assert_eq!((p.prompt_len, p.comp_len, p.width), (3, 3, 6));
        assert_eq!(p.ids, vec![1, 2, 3, 4, 0, 0, 0, 0, 5, 6, 7, 8]);
        assert_eq!(p.attention, vec![1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1]);
        assert_eq!(p.targets, vec![4, 0, 0, 6, 7, 8]);
        assert_eq!(p.mask, vec![1.0, 0.0, 0.0, 1.0, 0.0, 1.0]);
        let p = pack(&[&a, &b], 0, true).unwrap();
        assert_eq!(p.mask, vec![1.0, 0.0, 0.0, 0.0, 0.0, 0.0]);
        assert!(!p.has_old);
    }

    #[test]
    fn micro_batch_ranges() {
        assert_eq!(micro_batches(5, 2), vec![0..2, 2..4, 4..5]);
        assert_eq!(micro_batches(5, 0), vec![0..5]);
        assert_eq!(micro_batches(4, 8), vec![0..4]);
    }
}

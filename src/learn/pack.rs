//! The sequence a learner trains on, and the packing of sequences into the padded
//! tensors of one training forward. GRPO fills [`Sequence`]s from its scored rollouts
//! ([`crate::grpo::rollout::Rollout::sequence`]), SFT from its demonstrations; the
//! planner, the packer and the forward know nothing else.
//!
//! Layout of a packed micro-batch: every row is `[left padding | prompt | completion |
//! right padding]` with the prompt ending at column `prompt_len` for every row, so the
//! completion tokens of all rows occupy the same columns `prompt_len..prompt_len +
//! comp_len`, and their next-token log-probs come from hidden states
//! `prompt_len - 1 .. prompt_len + comp_len - 1` only: the LM head never sees prompt
//! positions.
use anyhow::{bail, Result};

/// One training row: a prompt, the completion the loss is taken over, and what the
/// objective weighs it with.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Sequence {
    /// Rows with the same group and prompt ids may share one prompt forward
    /// (`[optim] share_prompt`).
    pub group: usize,
    pub prompt_ids: Vec<u32>,
    pub completion_ids: Vec<u32>,
    /// Per completion token: its weight in the loss (0 for environment tokens of a
    /// multi-turn trajectory, every token of a masked truncated completion).
    pub mask: Vec<f32>,
    /// The row's advantage (GRPO); 0 for SFT, whose loss does not read it.
    pub advantage: f64,
    /// The policy's log-probs of the completion when it was sampled, recorded for
    /// `num_iterations > 1`.
    pub old_logp: Option<Vec<f32>>,
    /// The sampler's log-probs of the completion tokens (what the trainer
    /// recomputes), for the mismatch metrics and corrections.
    pub sampler_logp: Option<Vec<f32>>,
}

impl Sequence {
    /// A demonstration: every completion token carries loss.
    pub fn demonstration(prompt_ids: &[u32], completion_ids: &[u32]) -> Self {
        Sequence {
            prompt_ids: prompt_ids.to_vec(),
            completion_ids: completion_ids.to_vec(),
            mask: vec![1.0; completion_ids.len()],
            ..Default::default()
        }
    }

    /// Prompt plus completion tokens: what the row puts through a training forward.
    pub fn tokens(&self) -> usize {
        self.prompt_ids.len() + self.completion_ids.len()
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

/// Pack sequences into one padded micro-batch.
pub fn pack(rows: &[&Sequence], pad_id: u32) -> Result<Packed> {
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
        place(&mut p, i, r)?;
    }
    Ok(p)
}

/// Write row `i` of `p` from `r`.
fn place(p: &mut Packed, i: usize, r: &Sequence) -> Result<()> {
    let n = r.completion_ids.len();
    if r.mask.len() != n {
        bail!(
            "a sequence has {n} completion tokens but {} mask entries",
            r.mask.len()
        );
    }
    let (row, comp) = (i * p.width, i * p.comp_len);
    let start = p.prompt_len - r.prompt_ids.len();
    p.ids[row + start..row + p.prompt_len].copy_from_slice(&r.prompt_ids);
    p.attention[row + start..row + p.prompt_len].fill(1);
    let c = row + p.prompt_len;
    p.ids[c..c + n].copy_from_slice(&r.completion_ids);
    p.attention[c..c + n].fill(1);
    p.targets[comp..comp + n].copy_from_slice(&r.completion_ids);
    p.mask[comp..comp + n].copy_from_slice(&r.mask);
    for (what, src, dst) in [
        ("old", &r.old_logp, &mut p.old_logp),
        ("sampler", &r.sampler_logp, &mut p.sampler_logp),
    ] {
        if let Some(v) = src {
            if v.len() != n {
                bail!("{what} log-probs have {} entries for {n} tokens", v.len());
            }
            dst[comp..comp + n].copy_from_slice(v);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(p: &[u32], c: &[u32]) -> Sequence {
        Sequence {
            advantage: 0.5,
            ..Sequence::demonstration(p, c)
        }
    }

    #[test]
    fn packs_left_and_right_padding() {
        let a = s(&[1, 2, 3], &[4]);
        let mut b = s(&[5], &[6, 7, 8]);
        b.mask = vec![1.0, 0.0, 1.0];
        b.sampler_logp = Some(vec![-1.0, -2.0, -3.0]);
        let p = pack(&[&a, &b], 0).unwrap();
        assert_eq!((p.prompt_len, p.comp_len, p.width), (3, 3, 6));
        assert_eq!(p.ids, vec![1, 2, 3, 4, 0, 0, 0, 0, 5, 6, 7, 8]);
        assert_eq!(p.attention, vec![1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1]);
        assert_eq!(p.targets, vec![4, 0, 0, 6, 7, 8]);
        assert_eq!(p.mask, vec![1.0, 0.0, 0.0, 1.0, 0.0, 1.0]);
        assert_eq!(p.sampler_logp, vec![0.0, 0.0, 0.0, -1.0, -2.0, -3.0]);
        assert_eq!(p.advantages, vec![0.5, 0.5]);
        assert!(!p.has_old && !p.has_sampler);
    }

    #[test]
    fn a_mask_or_log_probs_of_the_wrong_length_are_refused() {
        let mut a = s(&[1], &[2, 3]);
        a.mask.pop();
        assert!(pack(&[&a], 0).unwrap_err().to_string().contains("mask"));
        let mut b = s(&[1], &[2, 3]);
        b.old_logp = Some(vec![0.0]);
        assert!(pack(&[&b], 0)
            .unwrap_err()
            .to_string()
            .contains("old log-probs"));
    }
}

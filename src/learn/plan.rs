//! Micro-batch planning: which rows of a batch go through one forward + backward.
//!
//! Rows are cut into micro-batches of at most `[optim] micro_batch` rows (0: no cap)
//! whose estimated training memory ([`TrainMemory`]) fits the budget
//! ([`MemoryBudget`], `[optim] memory_budget_gb`). With `share_prompt`, micro-batches
//! hold whole prompt groups when they fit; a group too big for the cap or the budget is
//! cut into sub-groups, each of which runs the prompt again. The loss is normalised over
//! the whole batch (GRPO's `LossScale`, SFT's token count), so any plan gives the same
//! update up to float rounding (LoRA dropout masks aside: they are drawn per micro-batch and group).
//! A row that does not fit alone is an error that names the numbers, raised before
//! anything is allocated.
use super::pack::Sequence;
use crate::model::budget::{gb, MemoryBudget, MemoryEstimate, TrainMemory, TrainShape};
use anyhow::Result;
use std::collections::HashMap;
use std::ops::Range;

/// One micro-batch: rollout indices, and with prompt sharing each group's row range in
/// it (every range's rows share one prompt).
#[derive(Debug, Clone, PartialEq)]
pub struct MicroBatch {
    pub rows: Vec<usize>,
    pub groups: Option<Vec<Range<usize>>>,
    /// Estimated peak bytes of its forward + backward.
    pub bytes: f64,
}

/// The micro-batches of one update, with what the log line reports.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Plan {
    pub micro_batches: Vec<MicroBatch>,
    /// The budget the plan was cut to (bytes; infinite when unknown).
    pub budget: MemoryBudget,
}

impl Plan {
    /// Rows in the largest micro-batch.
    pub fn max_rows(&self) -> usize {
        self.micro_batches
            .iter()
            .map(|m| m.rows.len())
            .max()
            .unwrap_or(0)
    }

    /// The largest micro-batch's estimate, in bytes.
    pub fn max_bytes(&self) -> f64 {
        self.micro_batches
            .iter()
            .map(|m| m.bytes)
            .fold(0.0, f64::max)
    }

    /// Estimated bytes per row: the largest micro-batch's estimate over its rows.
    pub fn bytes_per_row(&self) -> f64 {
        self.micro_batches
            .iter()
            .filter(|m| !m.rows.is_empty())
            .map(|m| m.bytes / m.rows.len() as f64)
            .fold(0.0, f64::max)
    }

    /// "memory: estimate X GB per row, budget Y GB (...) -> N micro-batches of up to
    /// M rows (largest Z GB)".
    pub fn summary(&self) -> String {
        format!(
            "memory: estimate {} per row, budget {} -> {} micro-batch{} of up to {} rows \
             (largest {})",
            gb(self.bytes_per_row()),
            self.budget.describe(),
            self.micro_batches.len(),
            if self.micro_batches.len() == 1 {
                ""
            } else {
                "es"
            },
            self.max_rows(),
            gb(self.max_bytes()),
        )
    }
}

/// The packed shape of `rows` (prompts left-padded, completions right-padded).
fn packed_shape(seqs: &[Sequence], rows: &[usize]) -> TrainShape {
    let p = rows
        .iter()
        .map(|&i| seqs[i].prompt_ids.len())
        .max()
        .unwrap_or(0);
    let c = rows
        .iter()
        .map(|&i| seqs[i].completion_ids.len())
        .max()
        .unwrap_or(0);
    TrainShape::Packed {
        rows: rows.len(),
        width: p + c,
        scored: c,
    }
}

/// The shared-prompt shape of `rows` (one group: all share one prompt).
fn shared_shape(seqs: &[Sequence], rows: &[usize]) -> TrainShape {
    TrainShape::Shared {
        prompt: rows.first().map_or(0, |&i| seqs[i].prompt_ids.len()),
        rows: rows.len(),
        completion: rows
            .iter()
            .map(|&i| seqs[i].completion_ids.len())
            .max()
            .unwrap_or(0),
    }
}

/// What makes a GRPO row shorter.
const SHORTER_COMPLETIONS: &str = "lower grpo.max_completion_length";

/// The error for a row that does not fit the budget alone.
fn too_big(
    row: &Sequence,
    shape: TrainShape,
    mem: &TrainMemory,
    budget: &MemoryBudget,
    shorter: &str,
) -> anyhow::Error {
    let need = mem.estimate(shape).bytes();
    anyhow::anyhow!(
        "memory: one sequence ({} prompt + {} completion tokens) needs about {} to train, \
         over the budget of {}; {}",
        row.prompt_ids.len(),
        row.completion_ids.len(),
        gb(need),
        budget.describe(),
        levers(mem, shape, shorter)
    )
}

/// An error when `row` alone does not fit `budget` (`shorter` names what shortens a
/// row). SFT checks every demonstration before its first step with it: a long one would
/// otherwise stop the run where the shuffle first draws it.
pub fn check_row(
    row: &Sequence,
    mem: &TrainMemory,
    budget: &MemoryBudget,
    shorter: &str,
) -> Result<()> {
    let shape = packed_shape(std::slice::from_ref(row), &[0]);
    match budget.fits(mem.estimate(shape).bytes()) {
        true => Ok(()),
        false => Err(too_big(row, shape, mem, budget, shorter)),
    }
}

/// What lowers the memory of a row of `shape`: checkpointing (when off, with its
/// estimate), the budget, a shorter row.
fn levers(mem: &TrainMemory, shape: TrainShape, shorter: &str) -> String {
    let checkpointing = if mem.checkpointing() {
        String::new()
    } else {
        format!(
            "set [optim] gradient_checkpointing = true (about {} per sequence), ",
            gb(mem.with_checkpointing(true).estimate(shape).bytes())
        )
    };
    format!(
        "{checkpointing}raise [optim] memory_budget_gb if the machine has the memory, or \
         {shorter}"
    )
}

/// Why a stage may stop at its first long completion: one row of `max_completion`
/// completion tokens (and no prompt, so a lower bound) needs more than `budget` to
/// train. The planner finds out only after a step's sampling, which on a CPU can take
/// minutes, so the trainer says it before the first step (`None`: it fits).
pub fn long_row_warning(
    mem: &TrainMemory,
    budget: &MemoryBudget,
    max_completion: usize,
) -> Option<String> {
    let shape = TrainShape::Packed {
        rows: 1,
        width: max_completion,
        scored: max_completion,
    };
    let need = mem.estimate(shape).bytes();
    if budget.fits(need) {
        return None;
    }
    Some(format!(
        "memory: a completion of grpo.max_completion_length = {max_completion} tokens \
         would need about {} to train, over the budget of {}; a step that samples one \
         stops with an error after its sampling. To avoid it, {}",
        gb(need),
        budget.describe(),
        levers(mem, shape, SHORTER_COMPLETIONS)
    ))
}

/// Cut the `active` rows of `seqs` into micro-batches: at most `micro` rows each
/// (0: no cap), each estimated to fit `budget`; with `share_prompt`, by prompt group.
pub fn plan(
    seqs: &[Sequence],
    active: &[usize],
    micro: usize,
    share_prompt: bool,
    mem: &TrainMemory,
    budget: &MemoryBudget,
) -> Result<Plan> {
    let cap = if micro == 0 { usize::MAX } else { micro };
    let fits = |e: MemoryEstimate| budget.fits(e.bytes());
    let mut out: Vec<MicroBatch> = Vec::new();
    if !share_prompt {
        let mut cur: Vec<usize> = Vec::new();
        for &i in active {
            let mut next = cur.clone();
            next.push(i);
            if !cur.is_empty()
                && (cur.len() == cap || !fits(mem.estimate(packed_shape(seqs, &next))))
            {
                let bytes = mem.estimate(packed_shape(seqs, &cur)).bytes();
                out.push(MicroBatch {
                    rows: std::mem::take(&mut cur),
                    groups: None,
                    bytes,
                });
            }
            let one = packed_shape(seqs, &[i]);
            if cur.is_empty() && !fits(mem.estimate(one)) {
                return Err(too_big(&seqs[i], one, mem, budget, SHORTER_COMPLETIONS));
            }
            cur.push(i);
        }
        if !cur.is_empty() {
            let bytes = mem.estimate(packed_shape(seqs, &cur)).bytes();
            out.push(MicroBatch {
                rows: cur,
                groups: None,
                bytes,
            });
        }
        return Ok(Plan {
            micro_batches: out,
            budget: *budget,
        });
    }
    // Sub-groups (rows sharing one prompt) small enough for the cap and the budget.
    let mut chunks: Vec<Vec<usize>> = Vec::new();
    for grp in prompt_groups(seqs, active) {
        let mut cur: Vec<usize> = Vec::new();
        for i in grp {
            let mut next = cur.clone();
            next.push(i);
            if !cur.is_empty()
                && (cur.len() == cap || !fits(mem.estimate(shared_shape(seqs, &next))))
            {
                chunks.push(std::mem::take(&mut cur));
            }
            let one = shared_shape(seqs, &[i]);
            if cur.is_empty() && !fits(mem.estimate(one)) {
                return Err(too_big(&seqs[i], one, mem, budget, SHORTER_COMPLETIONS));
            }
            cur.push(i);
        }
        if !cur.is_empty() {
            chunks.push(cur);
        }
    }
    // Whole sub-groups per micro-batch while the cap and the budget allow.
    let mut est = MemoryEstimate::default();
    for chunk in chunks {
        let e = mem.estimate(shared_shape(seqs, &chunk));
        let joins = out
            .last()
            .is_some_and(|m| m.rows.len() + chunk.len() <= cap && fits(est.and(e)));
        if !joins {
            est = MemoryEstimate::default();
            out.push(MicroBatch {
                rows: Vec::new(),
                groups: Some(Vec::new()),
                bytes: 0.0,
            });
        }
        est = est.and(e);
        let m = out.last_mut().expect("pushed above");
        let start = m.rows.len();
        m.groups
            .get_or_insert_with(Vec::new)
            .push(start..start + chunk.len());
        m.rows.extend(chunk);
        m.bytes = est.bytes();
    }
    Ok(Plan {
        micro_batches: out,
        budget: *budget,
    })
}

/// The `active` rows grouped by (group, prompt), groups in order of first appearance.
pub fn prompt_groups(seqs: &[Sequence], active: &[usize]) -> Vec<Vec<usize>> {
    let mut order: Vec<Vec<usize>> = Vec::new();
    let mut key: HashMap<(usize, &[u32]), usize> = HashMap::new();
    for &i in active {
        let r = &seqs[i];
        let k = *key
            .entry((r.group, r.prompt_ids.as_slice()))
            .or_insert_with(|| {
                order.push(Vec::new());
                order.len() - 1
            });
        order[k].push(i);
    }
    order
}

/// Which of a sequence of work items (by cost) are process `rank`'s of `world`: a
/// contiguous run, each item going to the share its middle falls in, so that shares
/// hold about equal cost. The same on every process; every item for one process.
pub fn deal(costs: &[f64], world: usize, rank: usize) -> Vec<bool> {
    if world <= 1 {
        return vec![true; costs.len()];
    }
    let total: f64 = costs.iter().sum();
    let mut before = 0.0;
    costs
        .iter()
        .map(|&c| {
            let owner = (((before + c / 2.0) / total.max(1e-12)) * world as f64) as usize;
            before += c;
            owner.min(world - 1) == rank
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_is_dealt_out_in_order_by_cost() {
        let costs = [40.0, 40.0, 30.0, 30.0, 30.0, 30.0];
        assert_eq!(deal(&costs, 1, 0), vec![true; 6]);
        // 200 in all: 40 + 40 + 30 (middle at 95) is the first half.
        let a = deal(&costs, 2, 0);
        let b = deal(&costs, 2, 1);
        assert_eq!(a, vec![true, true, true, false, false, false]);
        assert_eq!(b, vec![false, false, false, true, true, true]);
        // Any number of processes: each item exactly once, in contiguous runs.
        for w in [3, 8, 20] {
            let owners: Vec<usize> = (0..costs.len())
                .map(|i| {
                    let who: Vec<usize> = (0..w).filter(|&r| deal(&costs, w, r)[i]).collect();
                    assert_eq!(who.len(), 1, "item {i} with {w} processes: {who:?}");
                    who[0]
                })
                .collect();
            assert!(owners.windows(2).all(|p| p[0] <= p[1]), "{owners:?}");
        }
        // Fewer items than processes: some get none.
        assert_eq!(deal(&[5.0], 2, 0), vec![false]);
        assert_eq!(deal(&[5.0], 2, 1), vec![true]);
    }
}

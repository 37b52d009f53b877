//! The run directory, in one place: `training_log.csv` and `samples.jsonl` ([`log`]),
//! TensorBoard events ([`tensorboard`]), `checkpoint-N/` ([`checkpoint`]), `eval.json` ([`eval_report`]) and the guards of
//! the directory itself ([`dir`]: the `.lock` of its one writer, refusing to reuse a
//! directory that holds an earlier run). The trainer writes through it; `plot`, `hub`
//! and `eval` read through it.
pub mod checkpoint;
pub mod dir;
pub mod eval_report;
pub mod log;
pub mod signal;
pub mod tensorboard;

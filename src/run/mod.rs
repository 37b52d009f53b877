//! The run directory, in one place: `training_log.csv` and `samples.jsonl` ([`log`]),
//! `checkpoint-N/` ([`checkpoint`]) and `eval.json` ([`eval_report`]). The trainer
//! writes through it; `plot`, `hub` and `eval` read through it.
pub mod checkpoint;
pub mod eval_report;
pub mod log;

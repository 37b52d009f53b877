//! Group Relative Policy Optimisation on the shared learning core ([`crate::learn`]).
//! The pure numerics ([`advantage`], [`loss`], [`correction`]) and the loop built from
//! them: [`batch`] collects a step's scored [`rollout`]s, [`update`] turns them into one
//! AdamW step, [`metrics`] makes the log row, and [`trainer`] runs steps, checkpoints
//! and the curriculum.
pub mod advantage;
pub mod batch;
pub mod bench;
pub mod correction;
pub mod extremes;
mod held_out;
pub mod loss;
pub mod loss_stats;
pub mod metrics;
pub mod rollout;
pub mod trainer;
pub mod update;

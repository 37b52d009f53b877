//! Group Relative Policy Optimisation. The pure numerics ([`advantage`], [`loss`],
//! [`correction`], [`optim`], [`pack`]) and the loop built from them: [`batch`] collects a step's
//! scored completions, [`update`] turns them into one AdamW step, [`metrics`] makes the
//! log row, and [`trainer`] runs steps, checkpoints and the curriculum.
pub mod advantage;
pub mod batch;
pub mod bench;
pub mod correction;
mod held_out;
pub mod loss;
pub mod metrics;
pub mod optim;
pub mod pack;
pub mod plan;
pub mod trainer;
pub mod update;

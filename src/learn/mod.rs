//! The learning core SFT and GRPO share: the [`Sequence`] both fill, its packing
//! ([`pack()`]), micro-batch planning ([`plan()`]), the training forward ([`forward`]),
//! AdamW and the schedules ([`optim`]), and the run [`session`] that owns resume,
//! checkpoints and applying a step. Neither objective's module reaches into the
//! other's: what they share lives here.
pub mod forward;
pub mod optim;
pub mod pack;
pub mod plan;
pub mod session;

pub use forward::Forward;
pub use pack::{pack, Packed, Sequence};
pub use plan::{plan, Plan};
pub use session::Session;

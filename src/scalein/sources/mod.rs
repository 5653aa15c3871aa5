//! Sources: each turns an outside signal into a [`super::DrainRequest`] for the engine.
//!
//! - [`ca`]: CA's DeleteNodes ([`ca::DrainScaleIn`], the provider's `ScaleIn` port);
//! - [`hook_scan`]: instances AWS holds in `Terminating:Wait`, and drains a restart
//!   left half done ([`hook_scan::spawn_loop`]);
//! - [`warm_pool`]: a node handed back when its instance leaves for or returns from a
//!   warm pool;
//! - [`queue`]: EC2 interruption notices and the ASG's lifecycle actions from an SQS
//!   queue (queue mode).

pub mod ca;
pub mod hook_scan;
pub mod queue;
pub mod warm_pool;

//! Sources: each turns an outside signal into a [`super::DrainRequest`] for the engine.
//!
//! - [`ca`]: CA's DeleteNodes ([`ca::DrainScaleIn`], the provider's `ScaleIn` port);
//! - [`hook_scan`]: instances AWS holds in `Terminating:Wait`, and drains a restart
//!   left half done ([`hook_scan::spawn_loop`]);
//! - [`warm_pool`]: a node handed back when its instance leaves for or returns from a
//!   warm pool.
//!
//! The interruption queue's consumer (`crate::interruption`) is the fourth source; it
//! lives above scalein and reaches it through this face.

pub mod ca;
pub mod hook_scan;
pub mod warm_pool;

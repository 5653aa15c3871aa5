//! Scale-in: the drain that ends a node safely, one room per stage, like Karpenter's
//! termination controller.
//!
//! What the folder offers:
//! - [`Engine`] runs drains (one per instance, a new reason joining the one that
//!   runs), holds lifecycle actions and follows the Lease; [`DrainScaleIn`] is CA's
//!   DeleteNodes through it; [`sources::hook_scan::spawn_loop`] finds what AWS holds and
//!   what a restart left half done;
//! - [`DrainRequest`], [`Mode`], [`Source`], [`Outcome`], [`Start`]: what a drain is
//!   asked for and how it ends; [`ScaleInSettings`] and its policies configure it.
//!
//! The rooms, each with the rule of what it may touch (checked by `tests/layers.rs`):
//! - [`decide`]: pure decisions (which pod in which tier, what a Node's record means);
//!   no await, no client;
//! - [`kube`]: Kubernetes access (Nodes, pods, budgets, Events, the client's wrappers);
//!   knows no engine and no stage order;
//! - [`stages`]: one node's drain in order (cordon, evict, volumes, terminate);
//! - [`holds`]: the lifecycle actions our hook holds: heartbeats, asking AWS whether
//!   our hook holds an instance, what is remembered of actions already finished;
//! - [`engine`]: who runs what and when (slots, the book of drains and holds,
//!   leadership);
//! - [`sources`]: turn an outside signal into a drain request (CA's DeleteNodes, the
//!   lifecycle scan, the warm pool, the interruption queue);
//! - [`request`], [`settings`], [`stats`]: the vocabulary every room shares.

pub mod decide;
pub mod engine;
pub mod holds;
pub mod kube;
pub mod progress;
pub mod remove_hooks;
pub mod request;
pub mod settings;
pub mod sources;
pub mod stages;
pub mod stats;

pub use engine::{DrainStats, Engine};
pub use kube::client::kube_client;
pub use request::{ca_reason, reason_of_mode, DrainRequest, Mode, Outcome, Source, Start};
pub use settings::LoadBalancerWait;
pub use settings::{DaemonSetPolicy, DeadlinePolicy, ModeChoice, ScaleInSettings};
pub use sources::ca::DrainScaleIn;

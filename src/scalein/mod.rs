//! Scale-in: the drain that ends a node safely, one room per stage, like Karpenter's
//! termination controller.
//!
//! What the folder offers:
//! - [`Engine`] runs drains (one per instance, a new reason joining the one that
//!   runs), holds lifecycle actions and follows the Lease; [`DrainScaleIn`] is CA's
//!   DeleteNodes through it; [`lifecycle::spawn_loop`] finds what AWS holds and what
//!   a restart left half done;
//! - [`DrainRequest`], [`Mode`], [`Source`], [`Outcome`], [`Start`]: what a drain is
//!   asked for and how it ends; [`ScaleInSettings`] and its policies configure it.
//!
//! The rooms:
//! - [`engine`]: the engine and the drain task; [`inflight`]: what it keeps track of;
//! - [`request`]: the request, its outcome, how two requests join; [`settings`];
//! - [`drain`]: the stages of one node's drain, in order:
//!   - [`cordon`]: mark the node (unschedulable, our taint, LB exclusion, reasons);
//!   - [`evict`]: Eviction API with PDB-aware retry; [`budgets`], [`pass`]: what
//!     drains running together read once;
//!   - [`wait`]: tells when pods are gone; [`volumes`]: VolumeAttachments detach;
//!   - [`terminate`]: CompleteLifecycleAction or TerminateInstanceInAutoScalingGroup;
//! - [`plan`], [`record`]: the pure decisions (which pod in which tier; what the
//!   reasons on a Node mean together);
//! - [`lifecycle`]: find instances in `Terminating:Wait`, heartbeat, resume;
//!   [`warm_pool`]: hand a node back when its instance leaves the warm pool;
//!   [`leader`]: the Lease; [`scale_in`]: DeleteNodes; [`marks_sync`]: CA's target
//!   counts draining nodes;
//! - [`events`], [`ratelimit`], [`user_agent`], [`nodes`], [`hooks`],
//!   [`permissions`], [`dry_run`], [`intercept`]: what the stages share.

pub mod budgets;
pub mod cordon;
pub mod drain;
pub mod dry_run;
pub mod engine;
pub mod events;
pub mod evict;
pub mod hooks;
pub mod inflight;
pub mod intercept;
pub mod leader;
pub mod lifecycle;
pub mod marks_sync;
pub mod nodes;
pub mod pass;
pub mod permissions;
pub mod plan;
pub mod ratelimit;
pub mod record;
pub mod request;
pub mod scale_in;
pub mod settings;
pub mod terminate;
pub mod user_agent;
pub mod volumes;
pub mod wait;
pub mod warm_pool;
pub mod watch_backoff;

pub use engine::{kube_client, DrainStats, Engine};
pub use request::{ca_reason, reason_of_mode, DrainRequest, Mode, Outcome, Source, Start};
pub use scale_in::DrainScaleIn;
pub use settings::{DaemonSetPolicy, DeadlinePolicy, ModeChoice, ScaleInSettings};

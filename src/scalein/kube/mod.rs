//! Kubernetes access: reading and writing what the drain needs in the API server
//! (Nodes, pods, budgets, Events), and the client's wrappers. A room here knows no
//! engine and no stage order; it may use [`super::decide`] and nothing else of scalein.
//!
//! - [`nodes`]: the Node index (what a Node's record says, how its cordon arrived);
//!   [`node_record`]: every write to a Node, fenced by the version it was decided on;
//! - [`conditions`]: the drain's state on the Node as conditions (`nodes/status`);
//! - [`wait`]: pod watches that tell when pods are gone; [`budgets`], [`pass`]: what
//!   drains running together read once (PDBs, their pods, the claims on them);
//! - [`events`]: Events on Nodes and pods, rate limited;
//! - [`ca_hold`]: the annotation that keeps a node out of CA's scale-down, ours only;
//! - [`intercept`], [`ratelimit`], [`user_agent`], [`fence`]: the client's wrappers (an
//!   answer within a bound, the drains' rate limit, who is asking, no write from a
//!   replica that does not lead);
//! - [`client`]: the environment's client, its own retries off;
//! - [`permissions`]: what RBAC the drain needs, checked at start;
//! - [`watch_backoff`]: how a watch retries.

pub mod budgets;
pub mod ca_hold;
pub mod client;
pub mod conditions;
pub mod events;
pub mod fence;
pub mod intercept;
pub mod node_record;
pub mod nodes;
pub mod pass;
pub mod permissions;
pub mod ratelimit;
pub mod user_agent;
pub mod wait;
pub mod watch_backoff;

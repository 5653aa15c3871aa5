//! Decisions: pure functions of what they are given (no await, no client, no clock of
//! their own: `now` comes in as an argument). Tested exhaustively.
//!
//! - [`conditions`]: the drain's state on the Node as KEP-5683's conditions (the patch);
//! - [`deadlock`]: the PodDisruptionBudgets that can never allow a drain's evictions;
//! - [`budget`]: whether a drain may start now under the disruption budgets, else which
//!   budget holds it and until when;
//! - [`ca_hold`]: which nodes CA's scale-down may not pick now (a budget would hold
//!   their drain), and what to write on a Node so CA knows;
//! - [`plan`]: which pod leaves in which tier, and what a pod's disposition is;
//! - [`record`]: the drain record on a Node (the reasons, their phases, how two join);
//! - [`undo`]: whether a person may give a node back (no drain runs for it);
//! - [`hooks`]: what a group's lifecycle hooks mean for a drain (ours, foreign, direct mode);
//! - [`last_mile`]: whether an instance about to end is out of every load balancer's
//!   target group, or the wait for it is over;
//! - [`notice`]: what to do about a queue message (a spot warning, a lifecycle action, ...);
//! - [`story`]: whose a hold is (ours, not ours, ask again), from what is remembered of
//!   the instance and what AWS answers: the one rule every source uses.

pub mod budget;
pub mod ca_hold;
pub mod conditions;
pub mod deadlock;
pub mod hooks;
pub mod last_mile;
pub mod notice;
pub mod plan;
pub mod record;
pub mod story;
pub mod undo;

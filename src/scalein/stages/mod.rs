//! The stages of one node's drain, in order: [`drain`] runs them as a list
//! ([`drain::drain_node`]).
//!
//! - [`cordon`]: mark the node (unschedulable, our taint, LB exclusion, the record);
//! - [`evict`]: the Eviction API with PDB-aware retry, tier by tier;
//! - [`volumes`]: wait for VolumeAttachments to detach;
//! - [`terminate`]: CompleteLifecycleAction or TerminateInstanceInAutoScalingGroup;
//! - [`preview`]: what a drain would do (dry run), changing nothing.

pub mod cordon;
pub mod drain;
pub mod evict;
pub mod preview;
pub mod terminate;
pub mod volumes;

//! The stages of one node's drain, in order: [`drain`] runs them as a list
//! ([`drain::drain_node`]).
//!
//! - [`cordon`]: mark the node (unschedulable, our taint, LB exclusion, the record);
//! - [`workloads`]: the workload pods leave, tier by tier, or the deadline's policy
//!   decides ([`evict`]: the Eviction API with PDB-aware retry);
//! - [`daemonsets`]: the DaemonSet pods last, the node-critical ones after the volumes;
//! - [`volumes`]: wait for VolumeAttachments to detach;
//! - [`last_mile`]: out of every load balancer's target group first (bounded),
//!   [`deregister`]ed first from its own group's target groups when asked;
//! - [`terminate`]: CompleteLifecycleAction or TerminateInstanceInAutoScalingGroup;
//! - [`port`]: what the phases share and the runner's way into the engine;
//! - [`preview`]: what a drain would do (dry run), changing nothing.
//!
//! A stage works on one node through a [`Stage`]: the client, the settings, the Node
//! index, what drains running together share, the Events and the counters, never the
//! engine itself, its book of drains or its slots. The last stage adds AWS and the
//! provider's accounting ([`terminate::Ending`]); the list's runner adds the slots and
//! our hook's hold ([`port::Runner`]). Of the engine each sees one small trait
//! ([`terminate::EndPort`], [`port::DrainPort`]).

pub mod cordon;
pub mod daemonsets;
pub mod deregister;
pub mod drain;
pub mod evict;
pub mod last_mile;
pub mod port;
pub mod preview;
pub mod terminate;
pub mod volumes;
pub mod workloads;

use crate::scalein::kube::budgets::BudgetWatches;
use crate::scalein::kube::events::Events;
use crate::scalein::kube::nodes::NodeIndex;
use crate::scalein::kube::pass::Passes;
use crate::scalein::stats::DrainStats;
use crate::scalein::ScaleInSettings;

/// What a stage may reach.
pub struct Stage<'a> {
    pub client: &'a kube::Client,
    pub settings: &'a ScaleInSettings,
    pub nodes: &'a NodeIndex,
    /// What drains running together read once for all of them.
    pub passes: &'a Passes,
    /// Evictions this process asked for, so a restarted drain does not ask again.
    pub evictions: &'a std::sync::Arc<evict::Ledger>,
    /// Watches of the pods of budgets that refused an eviction.
    pub budgets: &'a BudgetWatches,
    pub events: &'a Events,
    pub stats: &'a DrainStats,
}

impl Stage<'_> {
    /// The Node of an instance: the name given (checked with the API server), else
    /// the Node index's answer, else the API server's by providerID.
    pub async fn find_node(
        &self,
        instance_id: &str,
        name: Option<&str>,
    ) -> Result<Option<String>, kube::Error> {
        if name.is_none() {
            if let Some(n) = self.nodes.node_for_instance(instance_id) {
                return Ok(Some(n));
            }
        }
        crate::scalein::kube::nodes::find_node(self.client, instance_id, name).await
    }

    /// Says the drain's state on the Node as conditions (`DrainInProgress`,
    /// `Drained`); nothing when they already say it, a warning when refused.
    pub async fn say_state(
        &self,
        node: &str,
        state: &crate::scalein::decide::conditions::DrainState,
    ) {
        let cached = self.nodes.cached(node);
        crate::scalein::kube::conditions::say(self.client, cached.as_deref(), node, state).await
    }
}

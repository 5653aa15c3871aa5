//! CA's DeleteNodes through the drain: the removal is recorded where a restart, a
//! lost Lease or another replica finds it, then the drain runs behind the answer.

use std::sync::Arc;

use async_trait::async_trait;

use crate::cloud::{AsgInstance, LifecycleHook};
use crate::provider::{Group, ProviderError, Removal, ScaleIn};
use crate::scalein::decide::record;
use crate::scalein::kube::nodes;
use crate::scalein::request::ca_reason;
use crate::scalein::stages::{cordon, preview, terminate};
use crate::scalein::{DrainRequest, Engine, Mode, Source};
use crate::telemetry::metrics::metrics;

/// DeleteNodes through the drain: returns within CA's call timeout, the drain runs
/// in the background. Before it returns, the drain is recorded where a restart, a
/// lost lease or another replica finds it: in AWS (lifecycle mode: the instance is
/// held in Terminating:Wait) or on the Node (direct mode: cordon, taint, marks).
pub struct DrainScaleIn(pub Arc<Engine>);

#[async_trait]
impl ScaleIn for DrainScaleIn {
    /// A group the registry knows hooked has its hooks read from AWS now, not from a
    /// list up to `hookRefreshInterval` old: terminating through the hook when it was
    /// deleted (or the ASG recreated under the same name without it) would end the
    /// instance undrained. A changed heartbeat timeout takes effect at once. When AWS
    /// cannot be asked, the batch fails for CA to retry.
    async fn confirm_hooks(
        &self,
        group: &Group,
    ) -> Result<Option<Vec<LifecycleHook>>, ProviderError> {
        let engine = &self.0;
        if !matches!(engine.mode_for(group, ""), Mode::Lifecycle { .. }) {
            return Ok(None);
        }
        Ok(Some(engine.with_current_hooks(group).await?.hooks))
    }

    fn capacity_added(&self, group: &Group) {
        crate::scalein::sources::warm_pool::capacity_added(&self.0, group);
    }

    async fn remove(
        &self,
        group: &Group,
        instance: &AsgInstance,
        node_name: Option<&str>,
    ) -> Result<Removal, ProviderError> {
        let engine = &self.0;
        // The hooks were confirmed for this batch (confirm_hooks).
        let mode = engine.mode_for(group, &instance.id);
        let leader = engine.is_leader();
        let (removal, node) = match &mode {
            Mode::Lifecycle { .. } => {
                // The ASG holds the instance in Terminating:Wait while we drain; a
                // follower leaves the drain to the leader's scan.
                tracing::info!(group = %group.asg.name, instance = %instance.id, leader, "terminating with decrement; the lifecycle hook holds it for the drain");
                terminate::hand_to_hook(engine.cloud.as_ref(), &instance.id).await?;
                (Removal::Decremented, node_name.map(str::to_string))
            }
            _ => match mark_for_drain(engine, group, instance, node_name).await? {
                Some(node) => (Removal::Deferred, Some(node)),
                None => {
                    // The API server says no Node is this instance's: nothing runs
                    // on it, so it ends at once.
                    tracing::info!(group = %group.asg.name, instance = %instance.id, "no Node exists for this instance; terminating with decrement");
                    terminate::end_without_node(engine.cloud.as_ref(), &instance.id).await?;
                    metrics().drains_without_node.inc();
                    return Ok(Removal::Decremented);
                }
            },
        };
        if let Some(node) = node.as_deref() {
            option_tags_ignored(engine, group, node).await;
        }
        if leader {
            let reasons = vec![ca_reason(&mode).asked_by_ca()];
            engine.start(DrainRequest {
                instance_id: instance.id.clone(),
                group: group.asg.name.clone(),
                node_name: node,
                mode,
                source: Source::ClusterAutoscaler,
                reasons,
                noticed: None,
            });
        } else {
            tracing::info!(group = %group.asg.name, instance = %instance.id, "not the leader: the drain is recorded; the leader runs it");
        }
        Ok(removal)
    }

    async fn preview(
        &self,
        group: &Group,
        instance: &AsgInstance,
        node_name: Option<&str>,
    ) -> String {
        let engine = &self.0;
        preview::describe(
            &engine.stage(),
            &DrainRequest {
                instance_id: instance.id.clone(),
                group: group.asg.name.clone(),
                node_name: node_name.map(str::to_string),
                mode: engine.mode_for(group, &instance.id),
                source: Source::ClusterAutoscaler,
                reasons: Vec::new(),
                noticed: None,
            },
        )
        .await
    }
}

/// Direct mode: cordon and mark the Node before DeleteNodes answers. `Ok(None)`:
/// the API server says there is no Node for the instance. Any doubt is an error
/// for CA to retry, never a termination.
async fn mark_for_drain(
    engine: &Arc<Engine>,
    group: &Group,
    instance: &AsgInstance,
    node_name: Option<&str>,
) -> Result<Option<String>, ProviderError> {
    let unavailable = |e: kube::Error| {
        ProviderError::Unavailable(format!(
            "cannot record the drain of instance {} on its Node: {e}",
            instance.id
        ))
    };
    // CA names the Node: marking it is two requests. Only when that name is gone (or
    // is CA's providerID-shaped name of a node that never registered) is the Node
    // looked for by providerID.
    let mut name = node_name.filter(|n| nodes::is_node_name(n));
    for _ in 0..3 {
        let node = match name.take() {
            Some(n) => n.to_string(),
            None => match engine
                .find_node(&instance.id, None)
                .await
                .map_err(unavailable)?
            {
                Some(n) => n,
                None => return Ok(None),
            },
        };
        let reason = record::DrainReason::new(record::Why::ScaleIn, crate::clock::utc_now());
        match cordon::cordon_via(
            &engine.stage(),
            &engine.tools.answer_client,
            &node,
            std::slice::from_ref(&reason),
            &group.asg.name,
            Some(engine.limits_for(&group.asg.name, None)),
        )
        .await
        {
            Ok(cordon::Cordoned::Marked { .. }) => return Ok(Some(node)),
            // Deleted between the lookup and the patch: look again.
            Ok(cordon::Cordoned::NodeGone) => continue,
            Err(e) => return Err(unavailable(e)),
        }
    }
    Err(ProviderError::Unavailable(format!(
        "the Node of instance {} kept disappearing while being marked for drain",
        instance.id
    )))
}

/// Says on the Node CA scales in which of its group's autoscaling-options tags CA
/// could not be given (the decision was made with CA's defaults for them).
async fn option_tags_ignored(engine: &Engine, group: &Group, node: &str) {
    let unusable = crate::provider::options::unusable_tags(&group.asg.tags);
    if unusable.is_empty() {
        return;
    }
    engine
        .tools
        .events
        .node(
            node,
            crate::scalein::kube::events::Reason::OptionTagsIgnored,
            format!(
                "node group {}: cluster-autoscaler decided with its own defaults for {} autoscaling-options tag(s) it could not be given: {}",
                group.asg.name,
                unusable.len(),
                unusable.join("; ")
            ),
        )
        .await;
}

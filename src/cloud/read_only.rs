//! The cloud of `serve --dry-run`: every read reaches AWS, every write is refused
//! here, logged with what it would have done and counted. The dry run's decisions are
//! made above (the provider and the drain describe them instead of acting); this
//! guard makes sure a path that forgot to ask still changes nothing in AWS.

use std::sync::Arc;

use async_trait::async_trait;

use super::*;
use crate::telemetry::metrics::metrics;

pub struct ReadOnly(pub Arc<dyn Cloud>);

/// The answer to a write: refused, not retryable, naming the call.
fn refused<T>(operation: &str, what: String) -> CloudResult<T> {
    tracing::info!(operation, "dry run: not calling AWS {operation} ({what})");
    metrics().dry_run(operation);
    Err(CloudError::Rejected {
        operation: operation.into(),
        code: "DryRun".into(),
        message: format!("dry run: {operation} ({what}) was not called"),
    })
}

#[async_trait]
impl Cloud for ReadOnly {
    async fn describe_groups(&self, s: &GroupSelector) -> CloudResult<Vec<AsgSnapshot>> {
        self.0.describe_groups(s).await
    }
    async fn launch_history(&self, g: &str) -> CloudResult<LaunchHistory> {
        self.0.launch_history(g).await
    }
    async fn locate_instances(&self, ids: &[String]) -> CloudResult<Vec<InstanceLocation>> {
        self.0.locate_instances(ids).await
    }
    async fn ended_instances(&self, ids: &[String]) -> CloudResult<Vec<String>> {
        self.0.ended_instances(ids).await
    }
    async fn warm_pool_instances(&self, g: &str) -> CloudResult<Vec<AsgInstance>> {
        self.0.warm_pool_instances(g).await
    }
    async fn set_desired_capacity(&self, g: &str, d: i32) -> CloudResult<()> {
        refused("SetDesiredCapacity", format!("group {g}, desired {d}"))
    }
    async fn terminate_instance(&self, id: &str, dec: bool) -> CloudResult<()> {
        refused(
            "TerminateInstanceInAutoScalingGroup",
            format!("instance {id}, decrement {dec}"),
        )
    }
    async fn instance_types(&self, n: &[String]) -> CloudResult<Vec<InstanceTypeInfo>> {
        self.0.instance_types(n).await
    }
    async fn launch_template(&self, t: &LaunchTemplateRef) -> CloudResult<LaunchData> {
        self.0.launch_template(t).await
    }
    async fn launch_configuration(&self, n: &str) -> CloudResult<LaunchData> {
        self.0.launch_configuration(n).await
    }
    async fn terminating_hooks(&self, g: &str) -> CloudResult<Vec<LifecycleHook>> {
        self.0.terminating_hooks(g).await
    }
    async fn put_terminating_hook(&self, g: &str, h: &LifecycleHook) -> CloudResult<()> {
        refused("PutLifecycleHook", format!("group {g}, hook {}", h.name))
    }
    async fn delete_terminating_hook(&self, g: &str, h: &str) -> CloudResult<()> {
        refused("DeleteLifecycleHook", format!("group {g}, hook {h}"))
    }
    async fn tag_group(&self, g: &str, k: &str, v: &str) -> CloudResult<()> {
        refused("CreateOrUpdateTags", format!("group {g}, tag {k}={v}"))
    }
    async fn untag_group(&self, g: &str, k: &str) -> CloudResult<()> {
        refused("DeleteTags", format!("group {g}, tag {k}"))
    }
    async fn lifecycle_heartbeat(&self, a: &LifecycleAction) -> CloudResult<()> {
        refused(
            "RecordLifecycleActionHeartbeat",
            format!("instance {}, hook {}", a.instance_id, a.hook),
        )
    }
    async fn complete_lifecycle_action(
        &self,
        a: &LifecycleAction,
        r: LifecycleResult,
    ) -> CloudResult<()> {
        refused(
            "CompleteLifecycleAction",
            format!("instance {}, hook {}, {r:?}", a.instance_id, a.hook),
        )
    }
    async fn eks_nodegroup(&self, c: &str, n: &str) -> CloudResult<EksNodegroup> {
        self.0.eks_nodegroup(c, n).await
    }
    async fn instance_types_for_requirements(
        &self,
        r: &InstanceRequirements,
        image: Option<&str>,
    ) -> CloudResult<Vec<String>> {
        self.0.instance_types_for_requirements(r, image).await
    }
    async fn termination_cause(&self, g: &str, id: &str) -> CloudResult<Option<String>> {
        self.0.termination_cause(g, id).await
    }
    async fn instance_addresses(&self, id: &str) -> CloudResult<InstanceAddresses> {
        self.0.instance_addresses(id).await
    }
    async fn target_groups(&self) -> CloudResult<Vec<TargetGroup>> {
        self.0.target_groups().await
    }
    async fn target_health(&self, arn: &str) -> CloudResult<Vec<TargetHealth>> {
        self.0.target_health(arn).await
    }
    async fn deregistration_delay(&self, arn: &str) -> CloudResult<Option<String>> {
        self.0.deregistration_delay(arn).await
    }
    async fn group_target_groups(&self, group: &str) -> CloudResult<Vec<String>> {
        self.0.group_target_groups(group).await
    }
    async fn deregister_targets(&self, arn: &str, targets: &[TargetHealth]) -> CloudResult<()> {
        let ids: Vec<&str> = targets.iter().map(|t| t.id.as_str()).collect();
        refused(
            "DeregisterTargets",
            format!("{} out of {arn}", ids.join(", ")),
        )
    }
}

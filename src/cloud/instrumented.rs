//! A Cloud decorator that counts every call by operation and outcome for metrics.

use std::sync::Arc;

use async_trait::async_trait;

use super::*;
use crate::telemetry::metrics::metrics;

pub struct Instrumented(pub Arc<dyn Cloud>);

/// Counts one AWS call by its outcome.
pub(crate) fn record<T>(op: &str, r: &CloudResult<T>) {
    metrics().aws(op, outcome(r));
}

/// The outcome label of one AWS call: ok, throttled, not_found, credentials (none
/// could be loaded: a setup problem, not AWS's), error.
fn outcome<T>(r: &CloudResult<T>) -> &'static str {
    match r {
        Ok(_) => "ok",
        Err(CloudError::Throttled { .. }) => "throttled",
        Err(CloudError::NotFound { .. }) => "not_found",
        Err(CloudError::Credentials { .. }) => "credentials",
        Err(_) => "error",
    }
}

macro_rules! counted {
    ($op:literal, $call:expr) => {{
        let started = crate::clock::Instant::now();
        let r = $call.await;
        metrics().aws_duration($op, started.elapsed());
        record($op, &r);
        r
    }};
}

#[async_trait]
impl Cloud for Instrumented {
    async fn describe_groups(&self, s: &GroupSelector) -> CloudResult<Vec<AsgSnapshot>> {
        counted!("DescribeAutoScalingGroups", self.0.describe_groups(s))
    }
    async fn launch_history(&self, g: &str) -> CloudResult<LaunchHistory> {
        counted!("DescribeScalingActivities", self.0.launch_history(g))
    }
    async fn locate_instances(&self, ids: &[String]) -> CloudResult<Vec<InstanceLocation>> {
        counted!("DescribeAutoScalingInstances", self.0.locate_instances(ids))
    }
    async fn ended_instances(&self, ids: &[String]) -> CloudResult<Vec<String>> {
        counted!("DescribeInstances", self.0.ended_instances(ids))
    }
    async fn warm_pool_instances(&self, g: &str) -> CloudResult<Vec<AsgInstance>> {
        counted!("DescribeWarmPool", self.0.warm_pool_instances(g))
    }
    async fn set_desired_capacity(&self, g: &str, d: i32) -> CloudResult<()> {
        counted!("SetDesiredCapacity", self.0.set_desired_capacity(g, d))
    }
    async fn terminate_instance(&self, id: &str, dec: bool) -> CloudResult<()> {
        counted!(
            "TerminateInstanceInAutoScalingGroup",
            self.0.terminate_instance(id, dec)
        )
    }
    async fn instance_types(&self, n: &[String]) -> CloudResult<Vec<InstanceTypeInfo>> {
        counted!("DescribeInstanceTypes", self.0.instance_types(n))
    }
    async fn launch_template(&self, t: &LaunchTemplateRef) -> CloudResult<LaunchData> {
        counted!("DescribeLaunchTemplateVersions", self.0.launch_template(t))
    }
    async fn launch_configuration(&self, n: &str) -> CloudResult<LaunchData> {
        counted!(
            "DescribeLaunchConfigurations",
            self.0.launch_configuration(n)
        )
    }
    async fn terminating_hooks(&self, g: &str) -> CloudResult<Vec<LifecycleHook>> {
        counted!("DescribeLifecycleHooks", self.0.terminating_hooks(g))
    }
    async fn put_terminating_hook(&self, g: &str, h: &LifecycleHook) -> CloudResult<()> {
        counted!("PutLifecycleHook", self.0.put_terminating_hook(g, h))
    }
    async fn delete_terminating_hook(&self, g: &str, h: &str) -> CloudResult<()> {
        counted!("DeleteLifecycleHook", self.0.delete_terminating_hook(g, h))
    }
    async fn tag_group(&self, g: &str, k: &str, v: &str) -> CloudResult<()> {
        counted!("CreateOrUpdateTags", self.0.tag_group(g, k, v))
    }
    async fn untag_group(&self, g: &str, k: &str) -> CloudResult<()> {
        counted!("DeleteTags", self.0.untag_group(g, k))
    }
    async fn lifecycle_heartbeat(&self, a: &LifecycleAction) -> CloudResult<()> {
        counted!(
            "RecordLifecycleActionHeartbeat",
            self.0.lifecycle_heartbeat(a)
        )
    }
    async fn complete_lifecycle_action(
        &self,
        a: &LifecycleAction,
        r: LifecycleResult,
    ) -> CloudResult<()> {
        counted!(
            "CompleteLifecycleAction",
            self.0.complete_lifecycle_action(a, r)
        )
    }
    async fn eks_nodegroup(&self, c: &str, n: &str) -> CloudResult<EksNodegroup> {
        counted!("DescribeNodegroup", self.0.eks_nodegroup(c, n))
    }
    async fn instance_types_for_requirements(
        &self,
        r: &InstanceRequirements,
        image: Option<&str>,
    ) -> CloudResult<Vec<String>> {
        counted!(
            "GetInstanceTypesFromInstanceRequirements",
            self.0.instance_types_for_requirements(r, image)
        )
    }
    async fn termination_cause(&self, g: &str, id: &str) -> CloudResult<Option<String>> {
        counted!("DescribeScalingActivities", self.0.termination_cause(g, id))
    }
    async fn instance_addresses(&self, id: &str) -> CloudResult<InstanceAddresses> {
        counted!("DescribeInstances", self.0.instance_addresses(id))
    }
    async fn target_groups(&self) -> CloudResult<Vec<TargetGroup>> {
        counted!("DescribeTargetGroups", self.0.target_groups())
    }
    async fn target_health(&self, arn: &str) -> CloudResult<Vec<TargetHealth>> {
        counted!("DescribeTargetHealth", self.0.target_health(arn))
    }
    async fn deregistration_delay(&self, arn: &str) -> CloudResult<Option<String>> {
        counted!(
            "DescribeTargetGroupAttributes",
            self.0.deregistration_delay(arn)
        )
    }
    async fn group_target_groups(&self, group: &str) -> CloudResult<Vec<String>> {
        counted!(
            "DescribeLoadBalancerTargetGroups",
            self.0.group_target_groups(group)
        )
    }
    async fn deregister_targets(&self, arn: &str, targets: &[TargetHealth]) -> CloudResult<()> {
        counted!("DeregisterTargets", self.0.deregister_targets(arn, targets))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_failure_kind_has_its_own_outcome() {
        let s = String::new;
        assert_eq!(outcome(&Ok::<(), CloudError>(())), "ok");
        let throttled = CloudError::Throttled {
            operation: s(),
            message: s(),
        };
        assert_eq!(outcome::<()>(&Err(throttled)), "throttled");
        let no_credentials = CloudError::Credentials {
            operation: s(),
            message: s(),
            hint: s(),
        };
        assert_eq!(outcome::<()>(&Err(no_credentials)), "credentials");
        let transient = CloudError::Transient {
            operation: s(),
            message: s(),
        };
        assert_eq!(outcome::<()>(&Err(transient)), "error");
    }
}

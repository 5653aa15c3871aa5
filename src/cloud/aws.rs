//! The real AWS backend: aws-sdk-autoscaling, aws-sdk-ec2 and aws-sdk-eks.
//! (Placeholder until the SDK backend lands: every call answers Transient.)

use async_trait::async_trait;

use super::*;

pub struct AwsSettings {
    pub region: Option<String>,
    pub endpoint_url: Option<String>,
    pub max_attempts: u32,
}

pub struct AwsCloud;

impl AwsCloud {
    pub async fn new(_s: &AwsSettings) -> Self {
        Self
    }
}

fn todo<T>() -> CloudResult<T> {
    Err(CloudError::Transient {
        operation: "any".into(),
        message: "AWS backend not built yet".into(),
    })
}

#[async_trait]
impl Cloud for AwsCloud {
    async fn describe_groups(&self, _: &GroupSelector) -> CloudResult<Vec<AsgSnapshot>> {
        todo()
    }
    async fn launch_failures(&self, _: &str) -> CloudResult<Vec<LaunchFailure>> {
        todo()
    }
    async fn locate_instances(&self, _: &[String]) -> CloudResult<Vec<InstanceLocation>> {
        todo()
    }
    async fn set_desired_capacity(&self, _: &str, _: i32) -> CloudResult<()> {
        todo()
    }
    async fn terminate_instance(&self, _: &str, _: bool) -> CloudResult<()> {
        todo()
    }
    async fn instance_types(&self, _: &[String]) -> CloudResult<Vec<InstanceTypeInfo>> {
        todo()
    }
    async fn launch_template(&self, _: &LaunchTemplateRef) -> CloudResult<LaunchData> {
        todo()
    }
    async fn launch_configuration(&self, _: &str) -> CloudResult<LaunchData> {
        todo()
    }
    async fn terminating_hooks(&self, _: &str) -> CloudResult<Vec<LifecycleHook>> {
        todo()
    }
    async fn put_terminating_hook(&self, _: &str, _: &LifecycleHook) -> CloudResult<()> {
        todo()
    }
    async fn lifecycle_heartbeat(&self, _: &LifecycleAction) -> CloudResult<()> {
        todo()
    }
    async fn complete_lifecycle_action(
        &self,
        _: &LifecycleAction,
        _: LifecycleResult,
    ) -> CloudResult<()> {
        todo()
    }
    async fn eks_nodegroup(&self, _: &str, _: &str) -> CloudResult<EksNodegroup> {
        todo()
    }
}

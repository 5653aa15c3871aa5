//! The real AWS backend: aws-sdk-autoscaling, aws-sdk-ec2 and aws-sdk-eks. Reads are
//! batched to each API's limit and paginated; errors are classified once
//! ([`classify`]) into throttles, transient failures, missing credentials, not-found
//! and rejections.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use async_trait::async_trait;
use aws_sdk_autoscaling as asg;
use aws_sdk_ec2 as ec2;
use aws_sdk_eks as eks;
use aws_sdk_elasticloadbalancingv2 as elb;
use aws_smithy_types::error::metadata::ProvideErrorMetadata;
use parking_lot::Mutex;

use super::*;

mod convert;
pub mod region;
pub mod sqs;
use convert::*;
pub use convert::{classify, credentials_failure, credentials_hint, failure_code, HttpStatus};

/// How to reach AWS.
#[derive(Debug, Clone, Default)]
pub struct AwsSettings {
    pub region: Option<String>,
    /// Endpoint override (moto, LocalStack, VPC endpoints).
    pub endpoint_url: Option<String>,
    /// SDK attempts per call including the first (1 = no retries).
    pub max_attempts: u32,
}

/// The SDK configuration for these settings (credentials from the usual chain).
pub async fn sdk_config(s: &AwsSettings) -> aws_config::SdkConfig {
    let mut loader = aws_config::defaults(aws_config::BehaviorVersion::latest()).retry_config(
        aws_config::retry::RetryConfig::standard().with_max_attempts(s.max_attempts.max(1)),
    );
    if let Some(r) = &s.region {
        loader = loader.region(aws_config::Region::new(r.clone()));
    }
    if let Some(e) = &s.endpoint_url {
        loader = loader.endpoint_url(e.clone());
    }
    loader.load().await
}

/// The region to reach AWS in: the configured one, else what the SDK's chain finds
/// (AWS_REGION, the profile, the instance metadata service). `Err` says where to set
/// it; a command refuses to start rather than guess.
pub async fn resolve_region(s: &AwsSettings) -> Result<String, String> {
    if let Some(r) = s.region.as_ref().filter(|r| !r.trim().is_empty()) {
        return Ok(r.clone());
    }
    sdk_config(s)
        .await
        .region()
        .map(|r| r.to_string())
        .filter(|r| !r.is_empty())
        .ok_or_else(|| {
            "no AWS region: set aws.region in the config (or --region, or the AWS_REGION environment variable); neither was given, no AWS profile names one and the instance metadata service did not answer".to_string()
        })
}

/// The region as [`resolve_region`] finds it, checked against AWS's partitions before
/// any call ([`region::partition_of`]): a region AWS cannot have is a host name that
/// does not resolve, and the first call's error would name only DNS.
pub async fn resolve_known_region(s: &AwsSettings) -> Result<String, String> {
    let r = resolve_region(s).await?;
    region::partition_of(&r)?;
    Ok(r)
}

/// The AWS backend with every call counted in the metrics (what the commands use).
pub async fn connect(settings: &AwsSettings) -> Arc<dyn Cloud> {
    let aws: Arc<dyn Cloud> = Arc::new(AwsCloud::new(settings).await);
    Arc::new(super::instrumented::Instrumented(aws))
}

/// Calls per (operation, outcome), for tests and budgets.
#[derive(Debug, Default)]
pub struct CallCounter(Mutex<BTreeMap<(String, String), u64>>);

impl CallCounter {
    fn add(&self, op: &str, outcome: &str) {
        *self
            .0
            .lock()
            .entry((op.to_string(), outcome.to_string()))
            .or_default() += 1;
    }

    pub fn snapshot(&self) -> BTreeMap<(String, String), u64> {
        self.0.lock().clone()
    }

    /// Calls of one operation, any outcome.
    pub fn count(&self, op: &str) -> u64 {
        self.0
            .lock()
            .iter()
            .filter(|((o, _), _)| o == op)
            .map(|(_, n)| n)
            .sum()
    }
}

pub struct AwsCloud {
    asg: asg::Client,
    ec2: ec2::Client,
    eks: eks::Client,
    /// ELBv2 (the last mile).
    elb: elb::Client,
    /// Whether `elb` reaches AWS: a backend built from clients without one
    /// ([`Self::from_clients`]) sees no load balancers.
    has_elb: bool,
    region: Option<String>,
    calls: Arc<CallCounter>,
}

/// Most names DescribeAutoScalingGroups and DescribeInstanceTypes take per call.
const NAME_BATCH: usize = 100;
/// DescribeAutoScalingInstances takes at most 50 ids.
const INSTANCE_BATCH: usize = 50;
/// The most pages of one warm pool read: 10,000 instances, past any pool a group
/// can have (its max size bounds it); a token that never ends stops here.
const WARM_POOL_PAGES: usize = 200;
/// DescribeTargetGroups' largest page, and how many pages are read at most (an
/// account allows 3000 target groups a region by default).
const TARGET_GROUP_PAGE: i32 = 400;
const TARGET_GROUP_PAGES: usize = 25;
const TERMINATING: &str = "autoscaling:EC2_INSTANCE_TERMINATING";

impl AwsCloud {
    /// Loads credentials and region the SDK's usual way (env, profile, IRSA web
    /// identity, instance metadata).
    pub async fn new(s: &AwsSettings) -> Self {
        Self::from_sdk_config(&sdk_config(s).await)
    }

    pub fn from_sdk_config(cfg: &aws_config::SdkConfig) -> Self {
        Self {
            asg: asg::Client::new(cfg),
            ec2: ec2::Client::new(cfg),
            eks: eks::Client::new(cfg),
            elb: elb::Client::new(cfg),
            has_elb: true,
            region: cfg.region().map(|r| r.to_string()),
            calls: Arc::default(),
        }
    }

    /// From ready clients (the SDK's mock layer in tests).
    pub fn from_clients(asg: asg::Client, ec2: ec2::Client, eks: eks::Client) -> Self {
        Self {
            asg,
            ec2,
            eks,
            elb: elb::Client::from_conf(
                elb::Config::builder()
                    .behavior_version(elb::config::BehaviorVersion::latest())
                    .build(),
            ),
            has_elb: false,
            region: None,
            calls: Arc::default(),
        }
    }

    /// The same, with an ELBv2 client (the SDK's mock layer in tests).
    pub fn with_elb(mut self, client: elb::Client) -> Self {
        self.elb = client;
        self.has_elb = true;
        self
    }

    pub fn region(&self) -> Option<String> {
        self.region.clone()
    }

    pub fn calls(&self) -> Arc<CallCounter> {
        self.calls.clone()
    }

    fn done<T, E, R>(
        &self,
        op: &str,
        r: Result<T, aws_smithy_runtime_api::client::result::SdkError<E, R>>,
    ) -> CloudResult<T>
    where
        E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
        R: std::fmt::Debug + HttpStatus,
    {
        match r {
            Ok(v) => {
                self.calls.add(op, "ok");
                tracing::debug!(operation = op, "AWS call ok");
                Ok(v)
            }
            Err(e) => {
                let err = classify(op, &e);
                let outcome = match &err {
                    CloudError::Throttled { .. } => "throttled",
                    CloudError::NotFound { .. } => "not_found",
                    CloudError::Transient { .. } => "transient",
                    CloudError::Rejected { .. } => "rejected",
                    CloudError::Credentials { .. } => "credentials",
                };
                self.calls.add(op, outcome);
                tracing::debug!(operation = op, error = %err, "AWS call failed");
                Err(err)
            }
        }
    }
}

impl AwsCloud {
    async fn describe_pages(
        &self,
        names: Option<Vec<String>>,
        filters: Option<Vec<asg::types::Filter>>,
        out: &mut Vec<AsgSnapshot>,
    ) -> CloudResult<()> {
        let mut token: Option<String> = None;
        loop {
            let r = self
                .asg
                .describe_auto_scaling_groups()
                .set_auto_scaling_group_names(names.clone())
                .set_filters(filters.clone())
                .max_records(NAME_BATCH as i32)
                .set_next_token(token.clone())
                .send()
                .await;
            let page = self.done("DescribeAutoScalingGroups", r)?;
            out.extend(page.auto_scaling_groups().iter().filter_map(snapshot_of));
            match page.next_token() {
                Some(t) if !t.is_empty() => token = Some(t.to_string()),
                _ => return Ok(()),
            }
        }
    }

    async fn describe_types(&self, names: &[String]) -> CloudResult<Vec<InstanceTypeInfo>> {
        let mut out = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let r = self
                .ec2
                .describe_instance_types()
                .set_instance_types(Some(
                    names
                        .iter()
                        .map(|n| ec2::types::InstanceType::from(n.as_str()))
                        .collect(),
                ))
                .set_next_token(token.clone())
                .send()
                .await;
            let page = self.done("DescribeInstanceTypes", r)?;
            out.extend(page.instance_types().iter().filter_map(type_info));
            match page.next_token() {
                Some(t) if !t.is_empty() => token = Some(t.to_string()),
                _ => return Ok(out),
            }
        }
    }
}

#[async_trait]
impl Cloud for AwsCloud {
    async fn describe_groups(&self, selector: &GroupSelector) -> CloudResult<Vec<AsgSnapshot>> {
        let mut out = Vec::new();
        for batch in selector.names.chunks(NAME_BATCH) {
            self.describe_pages(Some(batch.to_vec()), None, &mut out)
                .await?;
        }
        for set in &selector.tag_sets {
            let filters: Vec<asg::types::Filter> = set
                .iter()
                .map(|t| match &t.value {
                    Some(v) => asg::types::Filter::builder()
                        .name(format!("tag:{}", t.key))
                        .values(v.clone())
                        .build(),
                    None => asg::types::Filter::builder()
                        .name("tag-key")
                        .values(t.key.clone())
                        .build(),
                })
                .collect();
            let mut found = Vec::new();
            self.describe_pages(None, Some(filters), &mut found).await?;
            // AWS ANDs filters of different names but ORs the values of one name; keep
            // only groups carrying every term, as CA does.
            found.retain(|g| {
                set.iter().all(|t| match (&t.value, g.tags.get(&t.key)) {
                    (_, None) => false,
                    (None, Some(_)) => true,
                    (Some(want), Some(have)) => want == have,
                })
            });
            out.extend(found);
        }
        let mut seen = HashSet::new();
        out.retain(|g| seen.insert(g.name.clone()));
        Ok(out)
    }

    async fn launch_history(&self, group: &str) -> CloudResult<LaunchHistory> {
        let r = self
            .asg
            .describe_scaling_activities()
            .auto_scaling_group_name(group)
            .max_records(20)
            .send()
            .await;
        let page = self.done("DescribeScalingActivities", r)?;
        // Launch activities, successful, in progress or failed, are described as
        // "Launching a new EC2 instance: i-..." / "Launching a new EC2 instance.
        // Status Reason: ..." (terminations as "Terminating EC2 instance: ...").
        let last_launch_unix = page
            .activities()
            .iter()
            .filter(|a| {
                a.description()
                    .is_some_and(|d| d.starts_with("Launching a new EC2 instance"))
            })
            .filter_map(|a| a.start_time().map(|t| t.secs()))
            .max();
        let mut out: Vec<LaunchFailure> = page
            .activities()
            .iter()
            .filter(|a| {
                let code = a.status_code().map(|c| c.as_str()).unwrap_or("");
                code == "Failed"
                    || (code == "Cancelled"
                        && a.status_message().is_some_and(|m| m.contains("apacity")))
            })
            .map(|a| {
                let message = a
                    .status_message()
                    .or(a.description())
                    .unwrap_or("")
                    .to_string();
                LaunchFailure {
                    group: group.to_string(),
                    code: failure_code(&message),
                    message,
                    started_at_unix: a.start_time().map(|t| t.secs()).unwrap_or(0),
                }
            })
            .collect();
        out.sort_by_key(|f| std::cmp::Reverse(f.started_at_unix));
        Ok(LaunchHistory {
            failures: out,
            last_launch_unix,
        })
    }

    async fn termination_cause(
        &self,
        group: &str,
        instance_id: &str,
    ) -> CloudResult<Option<String>> {
        let mut token: Option<String> = None;
        for _ in 0..super::ACTIVITY_PAGES {
            let r = self
                .asg
                .describe_scaling_activities()
                .auto_scaling_group_name(group)
                .max_records(100)
                .set_next_token(token.clone())
                .send()
                .await;
            let page = self.done("DescribeScalingActivities", r)?;
            let found = page.activities().iter().find(|a| {
                a.description()
                    .and_then(super::terminated_by)
                    .is_some_and(|id| id == instance_id)
            });
            if let Some(a) = found {
                return Ok(a.cause().map(super::bounded_cause));
            }
            token = page.next_token().map(str::to_string);
            if token.is_none() {
                break;
            }
        }
        Ok(None)
    }

    async fn locate_instances(&self, ids: &[String]) -> CloudResult<Vec<InstanceLocation>> {
        let mut out = Vec::new();
        for batch in ids.chunks(INSTANCE_BATCH) {
            let mut token: Option<String> = None;
            loop {
                let r = self
                    .asg
                    .describe_auto_scaling_instances()
                    .set_instance_ids(Some(batch.to_vec()))
                    .max_records(INSTANCE_BATCH as i32)
                    .set_next_token(token.clone())
                    .send()
                    .await;
                let page = self.done("DescribeAutoScalingInstances", r)?;
                out.extend(page.auto_scaling_instances().iter().filter_map(|i| {
                    Some(InstanceLocation {
                        instance_id: i.instance_id()?.to_string(),
                        group: i.auto_scaling_group_name()?.to_string(),
                        zone: i.availability_zone().unwrap_or("").to_string(),
                        state: LifecycleState::parse(i.lifecycle_state().unwrap_or("")),
                    })
                }));
                match page.next_token() {
                    Some(t) if !t.is_empty() => token = Some(t.to_string()),
                    _ => break,
                }
            }
        }
        Ok(out)
    }

    async fn ended_instances(&self, ids: &[String]) -> CloudResult<Vec<String>> {
        // Filtered by id rather than named: an id EC2 no longer knows is left out of
        // the answer instead of failing the whole call (InvalidInstanceID.NotFound).
        let mut running = std::collections::BTreeSet::new();
        for batch in ids.chunks(INSTANCE_BATCH) {
            let mut token: Option<String> = None;
            loop {
                let r = self
                    .ec2
                    .describe_instances()
                    .filters(
                        ec2::types::Filter::builder()
                            .name("instance-id")
                            .set_values(Some(batch.to_vec()))
                            .build(),
                    )
                    .set_next_token(token.clone())
                    .send()
                    .await;
                let page = self.done("DescribeInstances", r)?;
                for i in page.reservations().iter().flat_map(|r| r.instances()) {
                    let ending = matches!(
                        i.state().and_then(|s| s.name()),
                        Some(
                            ec2::types::InstanceStateName::ShuttingDown
                                | ec2::types::InstanceStateName::Terminated
                        )
                    );
                    if let (Some(id), false) = (i.instance_id(), ending) {
                        running.insert(id.to_string());
                    }
                }
                match page.next_token() {
                    Some(t) if !t.is_empty() => token = Some(t.to_string()),
                    _ => break,
                }
            }
        }
        Ok(ids
            .iter()
            .filter(|id| !running.contains(id.as_str()))
            .cloned()
            .collect())
    }

    async fn instance_addresses(&self, instance_id: &str) -> CloudResult<InstanceAddresses> {
        let r = self
            .ec2
            .describe_instances()
            .filters(
                ec2::types::Filter::builder()
                    .name("instance-id")
                    .values(instance_id)
                    .build(),
            )
            .send()
            .await;
        let page = self.done("DescribeInstances", r)?;
        let mut out = InstanceAddresses::default();
        for i in page.reservations().iter().flat_map(|r| r.instances()) {
            if i.instance_id() != Some(instance_id) {
                continue;
            }
            out.addresses
                .extend(i.private_ip_address().map(str::to_string));
            for n in i.network_interfaces() {
                out.addresses.extend(
                    n.private_ip_addresses()
                        .iter()
                        .filter_map(|a| a.private_ip_address().map(str::to_string)),
                );
                out.addresses.extend(
                    n.ipv6_addresses()
                        .iter()
                        .filter_map(|a| a.ipv6_address().map(str::to_string)),
                );
                out.prefixes.extend(
                    n.ipv4_prefixes()
                        .iter()
                        .filter_map(|p| p.ipv4_prefix().map(str::to_string)),
                );
                out.prefixes.extend(
                    n.ipv6_prefixes()
                        .iter()
                        .filter_map(|p| p.ipv6_prefix().map(str::to_string)),
                );
            }
        }
        out.addresses.sort();
        out.addresses.dedup();
        Ok(out)
    }

    async fn target_groups(&self) -> CloudResult<Vec<TargetGroup>> {
        if !self.has_elb {
            return Ok(Vec::new());
        }
        let mut out = Vec::new();
        let mut marker: Option<String> = None;
        for _ in 0..TARGET_GROUP_PAGES {
            let r = self
                .elb
                .describe_target_groups()
                .page_size(TARGET_GROUP_PAGE)
                .set_marker(marker.clone())
                .send()
                .await;
            let page = self.done("DescribeTargetGroups", r)?;
            out.extend(page.target_groups().iter().filter_map(|g| {
                Some(TargetGroup {
                    arn: g.target_group_arn()?.to_string(),
                    name: g.target_group_name().unwrap_or_default().to_string(),
                    // AWS's default for a group created without one.
                    target_type: g
                        .target_type()
                        .map(|t| t.as_str().to_string())
                        .unwrap_or_else(|| "instance".into()),
                })
            }));
            match page.next_marker() {
                Some(m) if !m.is_empty() => marker = Some(m.to_string()),
                _ => return Ok(out),
            }
        }
        tracing::warn!(
            pages = TARGET_GROUP_PAGES,
            "DescribeTargetGroups had more pages than read; the rest are not waited for"
        );
        Ok(out)
    }

    async fn target_health(&self, arn: &str) -> CloudResult<Vec<TargetHealth>> {
        if !self.has_elb {
            return Ok(Vec::new());
        }
        let r = self
            .elb
            .describe_target_health()
            .target_group_arn(arn)
            .send()
            .await;
        let out = self.done("DescribeTargetHealth", r)?;
        Ok(out
            .target_health_descriptions()
            .iter()
            .filter_map(|d| {
                let t = d.target()?;
                Some(TargetHealth {
                    id: t.id()?.to_string(),
                    port: t.port(),
                    // No state read: counted as one that may carry traffic.
                    state: d
                        .target_health()
                        .and_then(|h| h.state())
                        .map(|s| s.as_str().to_string())
                        .unwrap_or_else(|| "unknown".into()),
                })
            })
            .collect())
    }

    async fn deregistration_delay(&self, arn: &str) -> CloudResult<Option<String>> {
        if !self.has_elb {
            return Ok(None);
        }
        let r = self
            .elb
            .describe_target_group_attributes()
            .target_group_arn(arn)
            .send()
            .await;
        let out = self.done("DescribeTargetGroupAttributes", r)?;
        Ok(out
            .attributes()
            .iter()
            .find(|a| a.key() == Some("deregistration_delay.timeout_seconds"))
            .and_then(|a| a.value().map(str::to_string)))
    }

    async fn group_target_groups(&self, group: &str) -> CloudResult<Vec<String>> {
        let mut out = Vec::new();
        let mut token: Option<String> = None;
        for _ in 0..TARGET_GROUP_PAGES {
            let r = self
                .asg
                .describe_load_balancer_target_groups()
                .auto_scaling_group_name(group)
                .max_records(100)
                .set_next_token(token.clone())
                .send()
                .await;
            let page = self.done("DescribeLoadBalancerTargetGroups", r)?;
            out.extend(
                page.load_balancer_target_groups()
                    .iter()
                    .filter_map(|g| g.load_balancer_target_group_arn().map(str::to_string)),
            );
            match page.next_token() {
                Some(t) if !t.is_empty() => token = Some(t.to_string()),
                _ => return Ok(out),
            }
        }
        Ok(out)
    }

    async fn deregister_targets(&self, arn: &str, targets: &[TargetHealth]) -> CloudResult<()> {
        if !self.has_elb || targets.is_empty() {
            return Ok(());
        }
        let r = self
            .elb
            .deregister_targets()
            .target_group_arn(arn)
            .set_targets(Some(
                targets
                    .iter()
                    .map(|t| {
                        elb::types::TargetDescription::builder()
                            .id(&t.id)
                            .set_port(t.port)
                            .build()
                    })
                    .collect(),
            ))
            .send()
            .await;
        self.done("DeregisterTargets", r)?;
        Ok(())
    }

    async fn warm_pool_instances(&self, group: &str) -> CloudResult<Vec<AsgInstance>> {
        let mut out = Vec::new();
        let mut token: Option<String> = None;
        for _ in 0..WARM_POOL_PAGES {
            let r = self
                .asg
                .describe_warm_pool()
                .auto_scaling_group_name(group)
                .max_records(INSTANCE_BATCH as i32)
                .set_next_token(token.clone())
                .send()
                .await;
            let page = self.done("DescribeWarmPool", r)?;
            out.extend(page.instances().iter().filter_map(|i| {
                Some(AsgInstance {
                    id: i.instance_id()?.to_string(),
                    zone: i.availability_zone().unwrap_or("").to_string(),
                    state: LifecycleState::parse(i.lifecycle_state()?.as_str()),
                    instance_type: i.instance_type().map(str::to_string),
                })
            }));
            match page.next_token() {
                Some(t) if !t.is_empty() => token = Some(t.to_string()),
                _ => return Ok(out),
            }
        }
        Err(CloudError::Transient {
            operation: "DescribeWarmPool".into(),
            message: format!(
                "the warm pool of group {group} has more than {} pages of {INSTANCE_BATCH} instances; read stops there",
                WARM_POOL_PAGES
            ),
        })
    }

    async fn set_desired_capacity(&self, group: &str, desired: i32) -> CloudResult<()> {
        tracing::info!(group, desired, "SetDesiredCapacity");
        let r = self
            .asg
            .set_desired_capacity()
            .auto_scaling_group_name(group)
            .desired_capacity(desired)
            .honor_cooldown(false)
            .send()
            .await;
        self.done("SetDesiredCapacity", r).map(|_| ())
    }

    async fn terminate_instance(&self, instance_id: &str, decrement: bool) -> CloudResult<()> {
        tracing::info!(
            instance = instance_id,
            decrement,
            "TerminateInstanceInAutoScalingGroup"
        );
        let r = self
            .asg
            .terminate_instance_in_auto_scaling_group()
            .instance_id(instance_id)
            .should_decrement_desired_capacity(decrement)
            .send()
            .await;
        self.done("TerminateInstanceInAutoScalingGroup", r)
            .map(|_| ())
    }

    async fn instance_types(&self, names: &[String]) -> CloudResult<Vec<InstanceTypeInfo>> {
        let mut out = Vec::new();
        for batch in names.chunks(NAME_BATCH) {
            match self.describe_types(batch).await {
                Ok(v) => out.extend(v),
                // One unknown name fails the whole batch: ask for the rest one by one
                // so it does not hide the others.
                Err(CloudError::Rejected { .. } | CloudError::NotFound { .. })
                    if batch.len() > 1 =>
                {
                    for n in batch {
                        match self.describe_types(std::slice::from_ref(n)).await {
                            Ok(v) => out.extend(v),
                            Err(CloudError::Rejected { .. } | CloudError::NotFound { .. }) => {
                                tracing::warn!(instance_type = %n, "unknown instance type");
                            }
                            Err(e) => return Err(e),
                        }
                    }
                }
                Err(CloudError::Rejected { .. } | CloudError::NotFound { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }

    async fn launch_template(&self, template: &LaunchTemplateRef) -> CloudResult<LaunchData> {
        let version = template
            .version
            .clone()
            .unwrap_or_else(|| "$Default".into());
        let r = self
            .ec2
            .describe_launch_template_versions()
            .set_launch_template_id(template.id.clone())
            .set_launch_template_name(if template.id.is_some() {
                None
            } else {
                template.name.clone()
            })
            .versions(version)
            .send()
            .await;
        let page = self.done("DescribeLaunchTemplateVersions", r)?;
        let data = page
            .launch_template_versions()
            .first()
            .and_then(|v| v.launch_template_data())
            .ok_or_else(|| CloudError::NotFound {
                what: "launch template version",
                name: template.to_string(),
            })?;
        Ok(LaunchData {
            instance_type: data.instance_type().map(|t| t.as_str().to_string()),
            user_data: decode_user_data(data.user_data(), "launch template"),
            instance_tags: data
                .tag_specifications()
                .iter()
                .filter(|s| s.resource_type().map(|r| r.as_str()) == Some("instance"))
                .flat_map(|s| s.tags())
                .filter_map(|t| Some((t.key()?.to_string(), t.value().unwrap_or("").to_string())))
                .collect(),
            volumes: volumes(data.block_device_mappings().iter().map(|b| {
                (
                    b.device_name(),
                    b.ebs().and_then(|e| e.volume_size()),
                    b.ebs().is_some(),
                )
            })),
            image_id: data.image_id().map(str::to_string),
            requirements: data.instance_requirements().map(requirements_from_ec2),
        })
    }

    async fn launch_configuration(&self, name: &str) -> CloudResult<LaunchData> {
        let r = self
            .asg
            .describe_launch_configurations()
            .launch_configuration_names(name)
            .send()
            .await;
        let page = self.done("DescribeLaunchConfigurations", r)?;
        let lc = page
            .launch_configurations()
            .first()
            .ok_or_else(|| CloudError::NotFound {
                what: "launch configuration",
                name: name.to_string(),
            })?;
        Ok(LaunchData {
            instance_type: lc.instance_type().map(str::to_string),
            user_data: decode_user_data(lc.user_data(), "launch configuration"),
            instance_tags: BTreeMap::new(),
            volumes: volumes(lc.block_device_mappings().iter().map(|b| {
                (
                    b.device_name(),
                    b.ebs().and_then(|e| e.volume_size()),
                    b.ebs().is_some(),
                )
            })),
            image_id: lc.image_id().map(str::to_string),
            requirements: None,
        })
    }

    async fn terminating_hooks(&self, group: &str) -> CloudResult<Vec<LifecycleHook>> {
        let r = self
            .asg
            .describe_lifecycle_hooks()
            .auto_scaling_group_name(group)
            .send()
            .await;
        let page = self.done("DescribeLifecycleHooks", r)?;
        Ok(page
            .lifecycle_hooks()
            .iter()
            .filter(|h| h.lifecycle_transition() == Some(TERMINATING))
            .filter_map(|h| {
                Some(LifecycleHook {
                    name: h.lifecycle_hook_name()?.to_string(),
                    heartbeat_timeout_secs: h.heartbeat_timeout().unwrap_or(3600),
                    default_result: h.default_result().unwrap_or("ABANDON").to_string(),
                })
            })
            .collect())
    }

    async fn put_terminating_hook(&self, group: &str, hook: &LifecycleHook) -> CloudResult<()> {
        tracing::info!(group, hook = %hook.name, "PutLifecycleHook");
        let r = self
            .asg
            .put_lifecycle_hook()
            .auto_scaling_group_name(group)
            .lifecycle_hook_name(&hook.name)
            .lifecycle_transition(TERMINATING)
            .heartbeat_timeout(hook.heartbeat_timeout_secs)
            .default_result(&hook.default_result)
            .send()
            .await;
        self.done("PutLifecycleHook", r).map(|_| ())
    }

    async fn delete_terminating_hook(&self, group: &str, hook: &str) -> CloudResult<()> {
        tracing::info!(group, hook, "DeleteLifecycleHook");
        let r = self
            .asg
            .delete_lifecycle_hook()
            .auto_scaling_group_name(group)
            .lifecycle_hook_name(hook)
            .send()
            .await;
        self.done("DeleteLifecycleHook", r).map(|_| ())
    }

    async fn tag_group(&self, group: &str, key: &str, value: &str) -> CloudResult<()> {
        tracing::info!(group, key, value, "CreateOrUpdateTags");
        let tag = asg::types::Tag::builder()
            .resource_id(group)
            .resource_type("auto-scaling-group")
            .key(key)
            .value(value)
            .propagate_at_launch(false)
            .build();
        let r = self.asg.create_or_update_tags().tags(tag).send().await;
        self.done("CreateOrUpdateTags", r).map(|_| ())
    }

    async fn untag_group(&self, group: &str, key: &str) -> CloudResult<()> {
        tracing::info!(group, key, "DeleteTags");
        let tag = asg::types::Tag::builder()
            .resource_id(group)
            .resource_type("auto-scaling-group")
            .key(key)
            .build();
        let r = self.asg.delete_tags().tags(tag).send().await;
        self.done("DeleteTags", r).map(|_| ())
    }

    async fn lifecycle_heartbeat(&self, a: &LifecycleAction) -> CloudResult<()> {
        let r = self
            .asg
            .record_lifecycle_action_heartbeat()
            .auto_scaling_group_name(&a.group)
            .lifecycle_hook_name(&a.hook)
            .instance_id(&a.instance_id)
            .set_lifecycle_action_token(a.token.clone())
            .send()
            .await;
        self.done("RecordLifecycleActionHeartbeat", r).map(|_| ())
    }

    async fn complete_lifecycle_action(
        &self,
        a: &LifecycleAction,
        result: LifecycleResult,
    ) -> CloudResult<()> {
        tracing::info!(group = %a.group, hook = %a.hook, instance = %a.instance_id, result = result.as_str(), "CompleteLifecycleAction");
        let r = self
            .asg
            .complete_lifecycle_action()
            .auto_scaling_group_name(&a.group)
            .lifecycle_hook_name(&a.hook)
            .instance_id(&a.instance_id)
            .set_lifecycle_action_token(a.token.clone())
            .lifecycle_action_result(result.as_str())
            .send()
            .await;
        self.done("CompleteLifecycleAction", r).map(|_| ())
    }

    async fn eks_nodegroup(&self, cluster: &str, nodegroup: &str) -> CloudResult<EksNodegroup> {
        let r = self
            .eks
            .describe_nodegroup()
            .cluster_name(cluster)
            .nodegroup_name(nodegroup)
            .send()
            .await;
        let page = self.done("DescribeNodegroup", r)?;
        let ng = page.nodegroup().ok_or_else(|| CloudError::NotFound {
            what: "EKS node group",
            name: format!("{cluster}/{nodegroup}"),
        })?;
        Ok(EksNodegroup {
            name: ng.nodegroup_name().map(str::to_string),
            capacity_type: ng.capacity_type().map(|c| c.as_str().to_string()),
            ami_type: ng.ami_type().map(|a| a.as_str().to_string()),
            disk_size_gib: ng.disk_size().map(i64::from),
            tags: ng
                .tags()
                .map(|t| t.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
                .unwrap_or_default(),
            labels: ng
                .labels()
                .map(|l| l.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
                .unwrap_or_default(),
            taints: ng
                .taints()
                .iter()
                .filter_map(|t| {
                    Some(Taint {
                        key: t.key()?.to_string(),
                        value: t.value().unwrap_or("").to_string(),
                        effect: match t.effect()?.as_str() {
                            "NO_SCHEDULE" => "NoSchedule",
                            "NO_EXECUTE" => "NoExecute",
                            "PREFER_NO_SCHEDULE" => "PreferNoSchedule",
                            _ => return None,
                        }
                        .to_string(),
                    })
                })
                .collect(),
        })
    }

    async fn instance_types_for_requirements(
        &self,
        requirements: &InstanceRequirements,
        image_id: Option<&str>,
    ) -> CloudResult<Vec<String>> {
        // The AMI's architecture, as in-tree AWS asks; x86_64 when the template names none.
        let mut arches = Vec::new();
        if let Some(image) = image_id {
            let r = self.ec2.describe_images().image_ids(image).send().await;
            let page = self.done("DescribeImages", r)?;
            arches.extend(
                page.images()
                    .iter()
                    .filter_map(|i| i.architecture())
                    .map(|a| ec2::types::ArchitectureType::from(a.as_str())),
            );
        }
        if arches.is_empty() {
            arches.push(ec2::types::ArchitectureType::X8664);
        }
        let r = self
            .ec2
            .get_instance_types_from_instance_requirements()
            .set_architecture_types(Some(arches))
            .virtualization_types(ec2::types::VirtualizationType::Hvm)
            .instance_requirements(requirements_request(requirements))
            .send()
            .await;
        let page = self.done("GetInstanceTypesFromInstanceRequirements", r)?;
        Ok(page
            .instance_types()
            .iter()
            .filter_map(|t| t.instance_type().map(str::to_string))
            .collect())
    }
}

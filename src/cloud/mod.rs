//! What the provider core needs from AWS, as plain data and one trait.
//!
//! Two backends implement [`Cloud`]: [`aws::AwsCloud`] (the real SDK) and
//! [`memory::MemoryCloud`] (in-memory ASGs for the demo and tests). Nothing in this
//! module's types comes from the SDK, so the core and the tests build state with them.

use std::collections::BTreeMap;
use std::fmt;

use async_trait::async_trait;

pub mod aws;
pub mod instrumented;
pub mod memory;
pub mod queue;
pub mod read_only;

/// How the service picks its Auto Scaling Groups.
#[derive(serde::Serialize, serde::Deserialize, Debug, Clone, Default, PartialEq, Eq)]
pub struct GroupSelector {
    /// ASG names listed explicitly (static groups).
    pub names: Vec<String>,
    /// Tag sets for auto-discovery: an ASG matches a set when it has every key of the
    /// set, and, where a value is given, that value. An ASG matching any set is taken.
    pub tag_sets: Vec<Vec<TagFilter>>,
}

/// One `key` or `key=value` term of CA's `asg:tag=` discovery syntax.
#[derive(serde::Serialize, serde::Deserialize, Debug, Clone, PartialEq, Eq, Hash)]
pub struct TagFilter {
    pub key: String,
    /// `None` means any value.
    pub value: Option<String>,
}

/// The term as CA's syntax writes it: `key` or `key=value`.
impl fmt::Display for TagFilter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.value {
            Some(v) => write!(f, "{}={v}", self.key),
            None => f.write_str(&self.key),
        }
    }
}

/// An ASG as read on refresh.
#[derive(serde::Serialize, serde::Deserialize, Debug, Clone, PartialEq)]
pub struct AsgSnapshot {
    pub name: String,
    pub min_size: i32,
    pub max_size: i32,
    pub desired_capacity: i32,
    pub availability_zones: Vec<String>,
    pub tags: BTreeMap<String, String>,
    pub launch: LaunchSpec,
    pub instances: Vec<AsgInstance>,
    /// Lifecycle hooks on `autoscaling:EC2_INSTANCE_TERMINATING`, when known.
    pub terminating_hooks: Vec<LifecycleHook>,
    /// The group's warm pool (DescribeAutoScalingGroups' WarmPoolConfiguration).
    pub warm_pool: Option<WarmPool>,
}

/// An ASG's warm pool as AWS configures it. Its instances are not the group's: they
/// count toward no desired capacity until they leave the pool.
#[derive(serde::Serialize, serde::Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct WarmPool {
    /// MinSize: instances kept in the pool at least.
    pub min_size: i32,
    /// MaxGroupPreparedCapacity; `None`: the group's max size (AWS's -1 or unset).
    pub max_prepared: Option<i32>,
    /// PoolState as AWS names it: `Stopped`, `Running` or `Hibernated`.
    pub pool_state: String,
    /// InstanceReusePolicy.ReuseOnScaleIn: a scale-in returns instances to the pool
    /// instead of ending them.
    pub reuse_on_scale_in: bool,
}

impl AsgSnapshot {
    /// Instances that fill a slot of the desired capacity
    /// ([`LifecycleState::fills_a_slot`]).
    pub fn instances_filling_slots(&self) -> i32 {
        self.instances
            .iter()
            .filter(|i| i.state.fills_a_slot())
            .count() as i32
    }
}

/// Where the ASG's instances get their configuration.
#[derive(serde::Serialize, serde::Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub enum LaunchSpec {
    LaunchTemplate(LaunchTemplateRef),
    LaunchConfiguration(String),
    MixedInstances {
        template: LaunchTemplateRef,
        /// Instance types of the policy's overrides, in order.
        override_types: Vec<String>,
        /// Attribute-based instance type selection: the policy's single override
        /// with InstanceRequirements (as in-tree AWS reads it).
        requirements: Option<Box<InstanceRequirements>>,
    },
    #[default]
    Unknown,
}

/// A launch template by id or name, with the version the ASG pins
/// (`$Default`, `$Latest` or a number); `None` means `$Default`.
#[derive(serde::Serialize, serde::Deserialize, Debug, Clone, PartialEq, Eq, Hash)]
pub struct LaunchTemplateRef {
    pub id: Option<String>,
    pub name: Option<String>,
    pub version: Option<String>,
}

impl fmt::Display for LaunchTemplateRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let who = self.id.as_deref().or(self.name.as_deref()).unwrap_or("?");
        write!(f, "{who}@{}", self.version.as_deref().unwrap_or("$Default"))
    }
}

/// What a launch template or launch configuration says about the instances.
#[derive(serde::Serialize, serde::Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct LaunchData {
    pub instance_type: Option<String>,
    /// Decoded (not base64) user data, if any.
    pub user_data: Option<String>,
    /// Tags the template puts on the instances it launches.
    pub instance_tags: BTreeMap<String, String>,
    /// The EBS volumes of the block device mappings, in order.
    pub volumes: Vec<BlockVolume>,
    /// The AMI the template launches (for the architecture of attribute-based types).
    pub image_id: Option<String>,
    /// InstanceRequirements in the launch template itself.
    pub requirements: Option<InstanceRequirements>,
}

/// One EBS volume of a block device mapping.
#[derive(serde::Serialize, serde::Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct BlockVolume {
    /// `/dev/xvda`, `/dev/xvdb`, ...
    pub device: String,
    /// None when the mapping keeps the AMI's size.
    pub size_gib: Option<i64>,
}

/// Attribute-based instance type selection (ASG override or launch template
/// InstanceRequirements), reduced to what a template node and the type lookup need.
#[derive(serde::Serialize, serde::Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct InstanceRequirements {
    pub vcpu_min: i64,
    pub vcpu_max: Option<i64>,
    pub memory_mib_min: i64,
    pub memory_mib_max: Option<i64>,
    /// `AcceleratorCount.Min` when the accelerators asked for are NVIDIA GPUs.
    pub nvidia_gpus_min: Option<i64>,
    pub allowed_types: Vec<String>,
    pub excluded_types: Vec<String>,
    /// `included`, `excluded` or `required`, when given.
    pub burstable: Option<String>,
    pub bare_metal: Option<String>,
    /// `intel`, `amd`, `amazon-web-services`, ... when given.
    pub cpu_manufacturers: Vec<String>,
}

/// One instance of an ASG.
#[derive(serde::Serialize, serde::Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct AsgInstance {
    pub id: String,
    pub zone: String,
    pub state: LifecycleState,
    pub instance_type: Option<String>,
}

impl AsgInstance {
    /// The providerID kubelet's AWS cloud provider gives this instance's Node.
    pub fn provider_id(&self) -> String {
        format!("aws:///{}/{}", self.zone, self.id)
    }
}

/// ASG instance lifecycle states
/// (<https://docs.aws.amazon.com/autoscaling/ec2/userguide/ec2-auto-scaling-lifecycle.html>),
/// the warm pool's (`Warmed:*`,
/// <https://docs.aws.amazon.com/autoscaling/ec2/userguide/warm-pool-instance-lifecycle.html>)
/// among them: every state AWS names is a variant, compared by variant, never by
/// spelling. [`Self::parse`] and [`Self::as_str`] are the one place each is spelled.
#[derive(serde::Serialize, serde::Deserialize, Debug, Clone, PartialEq, Eq, Hash)]
pub enum LifecycleState {
    Pending,
    PendingWait,
    PendingProceed,
    InService,
    Terminating,
    TerminatingWait,
    TerminatingProceed,
    Terminated,
    Detaching,
    Detached,
    EnteringStandby,
    Standby,
    /// On its way into the warm pool (a new instance warming up, or a scale-in under
    /// ReuseOnScaleIn), short of the hooks' wait.
    WarmedPending,
    /// Held there by lifecycle hooks: launch hooks for a new instance, terminating
    /// hooks (ours) for one a scale-in returns to the pool.
    WarmedPendingWait,
    WarmedPendingProceed,
    WarmedPendingRetained,
    /// The pool ends one of its instances, short of the terminating hooks' wait.
    WarmedTerminating,
    /// Held there by terminating hooks (ours).
    WarmedTerminatingWait,
    WarmedTerminatingProceed,
    WarmedTerminatingRetained,
    WarmedTerminated,
    /// Resting in the pool, in the pool's state.
    WarmedStopped,
    WarmedRunning,
    WarmedHibernated,
    /// A state this code does not know (a newer AWS), as AWS spelled it.
    Other(String),
}

/// Every state [`LifecycleState`] names, with AWS's spelling: the one table both
/// ways of the conversion read.
const SPELLED: [(LifecycleState, &str); 24] = [
    (LifecycleState::Pending, "Pending"),
    (LifecycleState::PendingWait, "Pending:Wait"),
    (LifecycleState::PendingProceed, "Pending:Proceed"),
    (LifecycleState::InService, "InService"),
    (LifecycleState::Terminating, "Terminating"),
    (LifecycleState::TerminatingWait, "Terminating:Wait"),
    (LifecycleState::TerminatingProceed, "Terminating:Proceed"),
    (LifecycleState::Terminated, "Terminated"),
    (LifecycleState::Detaching, "Detaching"),
    (LifecycleState::Detached, "Detached"),
    (LifecycleState::EnteringStandby, "EnteringStandby"),
    (LifecycleState::Standby, "Standby"),
    (LifecycleState::WarmedPending, "Warmed:Pending"),
    (LifecycleState::WarmedPendingWait, "Warmed:Pending:Wait"),
    (
        LifecycleState::WarmedPendingProceed,
        "Warmed:Pending:Proceed",
    ),
    (
        LifecycleState::WarmedPendingRetained,
        "Warmed:Pending:Retained",
    ),
    (LifecycleState::WarmedTerminating, "Warmed:Terminating"),
    (
        LifecycleState::WarmedTerminatingWait,
        "Warmed:Terminating:Wait",
    ),
    (
        LifecycleState::WarmedTerminatingProceed,
        "Warmed:Terminating:Proceed",
    ),
    (
        LifecycleState::WarmedTerminatingRetained,
        "Warmed:Terminating:Retained",
    ),
    (LifecycleState::WarmedTerminated, "Warmed:Terminated"),
    (LifecycleState::WarmedStopped, "Warmed:Stopped"),
    (LifecycleState::WarmedRunning, "Warmed:Running"),
    (LifecycleState::WarmedHibernated, "Warmed:Hibernated"),
];

impl LifecycleState {
    /// Every state AWS names (not [`Self::Other`]).
    pub fn all() -> impl Iterator<Item = LifecycleState> {
        SPELLED.iter().map(|(s, _)| s.clone())
    }

    /// The warm pool's states (`Warmed:*`).
    pub fn pool_states() -> impl Iterator<Item = LifecycleState> {
        Self::all().filter(Self::in_warm_pool)
    }

    /// Where an instance is before our EC2_INSTANCE_TERMINATING hook holds it: in
    /// service (TerminateInstanceInAutoScalingGroup was just called; AWS's reads lag),
    /// terminating, on its way into the warm pool, or the pool ending it. Our hook's
    /// action is still to come there: a "no action" answer is not a finished action.
    pub const BEFORE_OUR_HOLD: [LifecycleState; 4] = [
        LifecycleState::InService,
        LifecycleState::Terminating,
        LifecycleState::WarmedPending,
        LifecycleState::WarmedTerminating,
    ];

    /// Where our EC2_INSTANCE_TERMINATING hook holds an instance (every other
    /// terminating hook too): a "no action" answer there means our action is gone
    /// (completed before, timed out, its hook deleted), or AWS's lifecycle API lags
    /// its reads of the state.
    pub const OUR_HOLD: [LifecycleState; 3] = [
        LifecycleState::TerminatingWait,
        LifecycleState::WarmedPendingWait,
        LifecycleState::WarmedTerminatingWait,
    ];

    pub fn parse(s: &str) -> Self {
        SPELLED
            .iter()
            .find(|(_, spelled)| *spelled == s)
            .map(|(state, _)| state.clone())
            .unwrap_or_else(|| Self::Other(s.to_string()))
    }

    pub fn as_str(&self) -> &str {
        match self {
            Self::Other(s) => s,
            known => SPELLED
                .iter()
                .find(|(state, _)| state == known)
                .map(|(_, spelled)| *spelled)
                .expect("every named state is spelled in SPELLED"),
        }
    }

    /// On its way out of the group: terminating, or detaching/detached. Such an
    /// instance no longer fills a slot of the desired capacity, so every count of
    /// the instances that stay uses this one test (the listing CA sees included).
    pub fn is_leaving(&self) -> bool {
        self.is_terminating() || matches!(self, Self::Detaching | Self::Detached)
    }

    /// In Standby, or entering it: still in the group and running, but outside its
    /// desired capacity (AWS's ExitStandby raises the desired capacity by one per
    /// instance, and a group that kept its capacity on EnterStandby launches a
    /// replacement).
    pub fn is_standby(&self) -> bool {
        matches!(self, Self::EnteringStandby | Self::Standby)
    }

    /// Fills a slot of the desired capacity: neither leaving nor in Standby. Every count
    /// of the instances that meet the desired capacity uses this one test.
    pub fn fills_a_slot(&self) -> bool {
        !self.is_leaving() && !self.is_standby()
    }

    /// In the group's warm pool (`Warmed:*`): not the group's instance. A state this
    /// code does not know is read by its spelling (a newer pool state).
    pub fn in_warm_pool(&self) -> bool {
        match self {
            Self::WarmedPending
            | Self::WarmedPendingWait
            | Self::WarmedPendingProceed
            | Self::WarmedPendingRetained
            | Self::WarmedTerminating
            | Self::WarmedTerminatingWait
            | Self::WarmedTerminatingProceed
            | Self::WarmedTerminatingRetained
            | Self::WarmedTerminated
            | Self::WarmedStopped
            | Self::WarmedRunning
            | Self::WarmedHibernated => true,
            Self::Other(s) => s.starts_with("Warmed:"),
            _ => false,
        }
    }

    /// Resting in the pool past every hook: `Warmed:Pending:Proceed` and the pool's
    /// states (`Warmed:Stopped`, `Warmed:Running`, `Warmed:Hibernated`); not on its
    /// way in (another hook may still hold it), retained, or being ended.
    pub fn is_resting_in_pool(&self) -> bool {
        matches!(
            self,
            Self::WarmedPendingProceed
                | Self::WarmedStopped
                | Self::WarmedRunning
                | Self::WarmedHibernated
        )
    }

    /// Held by lifecycle hooks on its way into the warm pool (`Warmed:Pending:Wait`):
    /// a scale-in that returns the instance to the pool, where our
    /// EC2_INSTANCE_TERMINATING hook waits, or a new instance warming up, where only
    /// launch hooks do.
    pub fn is_pool_bound_wait(&self) -> bool {
        *self == Self::WarmedPendingWait
    }

    /// Held by lifecycle hooks while the pool ends one of its instances
    /// (`Warmed:Terminating:Wait`): only terminating hooks wait there.
    pub fn is_pool_ending_wait(&self) -> bool {
        *self == Self::WarmedTerminatingWait
    }

    /// On its way into the pool, short of the hooks' wait (`Warmed:Pending`) or held
    /// there (`Warmed:Pending:Wait`): an action of our hook may still be to come or
    /// be pending.
    pub fn is_pool_bound(&self) -> bool {
        matches!(self, Self::WarmedPending | Self::WarmedPendingWait)
    }

    /// Terminating, Terminating:Wait, Terminating:Proceed or Terminated.
    pub fn is_terminating(&self) -> bool {
        matches!(
            self,
            Self::Terminating | Self::TerminatingWait | Self::TerminatingProceed | Self::Terminated
        )
    }

    pub fn is_pending(&self) -> bool {
        matches!(
            self,
            Self::Pending | Self::PendingWait | Self::PendingProceed
        )
    }
}

/// An `autoscaling:EC2_INSTANCE_TERMINATING` lifecycle hook.
#[derive(serde::Serialize, serde::Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct LifecycleHook {
    pub name: String,
    pub heartbeat_timeout_secs: i32,
    /// `CONTINUE` or `ABANDON`.
    pub default_result: String,
}

/// A scaling activity that failed to launch capacity (for placeholders).
#[derive(serde::Serialize, serde::Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct LaunchFailure {
    pub group: String,
    /// Short machine code, e.g. `InsufficientInstanceCapacity`, `VcpuLimitExceeded`.
    pub code: String,
    pub message: String,
    /// Seconds since the Unix epoch when the activity started.
    pub started_at_unix: i64,
}

/// What a group's scaling activities say about its launches.
#[derive(serde::Serialize, serde::Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct LaunchHistory {
    /// Failed launches, newest first.
    pub failures: Vec<LaunchFailure>,
    /// Start (Unix seconds) of the newest launch activity, whatever its status: the
    /// ASG starts one as soon as desired capacity rises above the instances, so it
    /// tells every replica when the last increase took effect (kept in AWS, not in
    /// one replica's memory).
    pub last_launch_unix: Option<i64>,
}

/// What DescribeInstanceTypes says about one instance type.
#[derive(serde::Serialize, serde::Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct InstanceTypeInfo {
    pub name: String,
    pub vcpus: i64,
    pub memory_mib: i64,
    pub gpus: i64,
    /// GPU model name, e.g. `nvidia-tesla-t4`, when the type has GPUs.
    pub gpu_type: Option<String>,
    /// The GPU maker as DescribeInstanceTypes names it (`NVIDIA`, `AMD`, `Habana`),
    /// when the type has GPUs: it decides the device plugin's resource name.
    pub gpu_manufacturer: Option<String>,
    /// `amd64` or `arm64`.
    pub architecture: String,
    /// Maximum ENIs and IPv4 addresses per ENI (for max pods), when known.
    pub max_enis: Option<i64>,
    pub ipv4_per_eni: Option<i64>,
    /// Local instance-store size in GiB, when the type has one.
    pub instance_storage_gib: Option<i64>,
}

/// An ASG instance found by instance id (DescribeAutoScalingInstances).
#[derive(serde::Serialize, serde::Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct InstanceLocation {
    pub instance_id: String,
    pub group: String,
    pub zone: String,
    pub state: LifecycleState,
}

/// Errors from a cloud backend. `Throttled` and `Transient` may be retried; the rest
/// are answers.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CloudError {
    #[error("AWS throttled {operation}: {message}")]
    Throttled { operation: String, message: String },
    #[error("AWS {operation} failed transiently: {message}")]
    Transient { operation: String, message: String },
    /// The SDK found no usable credentials (IRSA, EKS Pod Identity, the environment):
    /// a setup problem that waiting does not fix, so not retryable. `hint` says what to
    /// check, from what the pod's environment shows.
    #[error("AWS {operation}: no AWS credentials, a credentials problem (not a passing AWS failure): {message}. {hint}")]
    Credentials {
        operation: String,
        message: String,
        hint: String,
    },
    #[error("{what} not found: {name}")]
    NotFound { what: &'static str, name: String },
    #[error("AWS {operation} rejected the request: {code}: {message}")]
    Rejected {
        operation: String,
        code: String,
        message: String,
    },
}

impl CloudError {
    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::Throttled { .. } | Self::Transient { .. })
    }
}

pub type CloudResult<T> = Result<T, CloudError>;

/// What the provider needs from AWS. Every method is one logical AWS operation,
/// batched and paginated inside the backend.
#[async_trait]
pub trait Cloud: Send + Sync + 'static {
    /// DescribeAutoScalingGroups for the selector: names in batches of up to 100, tag
    /// filters per set, every page.
    async fn describe_groups(&self, selector: &GroupSelector) -> CloudResult<Vec<AsgSnapshot>>;

    /// Recent failed scaling activities of one group (DescribeScalingActivities), newest
    /// first. Called only for groups whose desired capacity is not fulfilled.
    async fn launch_history(&self, group: &str) -> CloudResult<LaunchHistory>;

    /// Which ASG each instance belongs to (DescribeAutoScalingInstances, batched by 50).
    /// Instances in no ASG are absent from the answer.
    async fn locate_instances(&self, instance_ids: &[String])
        -> CloudResult<Vec<InstanceLocation>>;

    /// Of `instance_ids`, those EC2 shows ending or ended (`shutting-down`,
    /// `terminated`) or no longer knows (DescribeInstances filtered by id, batched):
    /// what tells an instance that left its group by ending from one detached from
    /// it or sent to a warm pool, which still runs or rests.
    async fn ended_instances(&self, instance_ids: &[String]) -> CloudResult<Vec<String>>;

    /// SetDesiredCapacity (HonorCooldown false).
    async fn set_desired_capacity(&self, group: &str, desired: i32) -> CloudResult<()>;

    /// The instances in one group's warm pool, in their `Warmed:*` states
    /// (DescribeWarmPool, every page). A group without a pool has none.
    async fn warm_pool_instances(&self, group: &str) -> CloudResult<Vec<AsgInstance>>;

    /// TerminateInstanceInAutoScalingGroup.
    async fn terminate_instance(
        &self,
        instance_id: &str,
        decrement_desired: bool,
    ) -> CloudResult<()>;

    /// DescribeInstanceTypes for these types (batched by 100). Unknown types are absent.
    async fn instance_types(&self, names: &[String]) -> CloudResult<Vec<InstanceTypeInfo>>;

    /// DescribeLaunchTemplateVersions for one template at its pinned version.
    async fn launch_template(&self, template: &LaunchTemplateRef) -> CloudResult<LaunchData>;

    /// DescribeLaunchConfigurations for one launch configuration.
    async fn launch_configuration(&self, name: &str) -> CloudResult<LaunchData>;

    /// DescribeLifecycleHooks of one group, only `autoscaling:EC2_INSTANCE_TERMINATING`.
    async fn terminating_hooks(&self, group: &str) -> CloudResult<Vec<LifecycleHook>>;

    /// PutLifecycleHook on EC2_INSTANCE_TERMINATING.
    async fn put_terminating_hook(&self, group: &str, hook: &LifecycleHook) -> CloudResult<()>;

    /// DeleteLifecycleHook. AWS completes the hook's outstanding actions with CONTINUE.
    async fn delete_terminating_hook(&self, group: &str, hook: &str) -> CloudResult<()>;

    /// CreateOrUpdateTags: one tag on the group, not propagated to its instances.
    async fn tag_group(&self, group: &str, key: &str, value: &str) -> CloudResult<()>;

    /// DeleteTags: one tag of the group, by key.
    async fn untag_group(&self, group: &str, key: &str) -> CloudResult<()>;

    /// RecordLifecycleActionHeartbeat.
    async fn lifecycle_heartbeat(&self, action: &LifecycleAction) -> CloudResult<()>;

    /// CompleteLifecycleAction with `CONTINUE` or `ABANDON`.
    async fn complete_lifecycle_action(
        &self,
        action: &LifecycleAction,
        result: LifecycleResult,
    ) -> CloudResult<()>;

    /// DescribeNodegroup of an EKS managed node group.
    async fn eks_nodegroup(&self, cluster: &str, nodegroup: &str) -> CloudResult<EksNodegroup>;

    /// The instance types that meet `requirements` for the AMI's architecture
    /// (DescribeImages, then the first page of GetInstanceTypesFromInstanceRequirements),
    /// in AWS's order.
    async fn instance_types_for_requirements(
        &self,
        requirements: &InstanceRequirements,
        image_id: Option<&str>,
    ) -> CloudResult<Vec<String>>;

    /// The `Cause` of the group's scaling activity that terminates the instance
    /// (DescribeScalingActivities, newest first, at most [`ACTIVITY_PAGES`] pages of
    /// 100: the activity `Terminating EC2 instance: ID`), at most 4 KiB of it; `None`
    /// when none of those names the instance (issue 71: a budget per ASG cause).
    async fn termination_cause(
        &self,
        group: &str,
        instance_id: &str,
    ) -> CloudResult<Option<String>>;

    // The last mile (issue 73), read only. No default: a backend or a wrapper that
    // left these out would answer "no load balancer" and the wait would end every
    // instance at once, failing open; each says what it has.

    /// The instance's private addresses (DescribeInstances of one id); an instance
    /// EC2 no longer knows has none.
    async fn instance_addresses(&self, instance_id: &str) -> CloudResult<InstanceAddresses>;

    /// Every ELBv2 target group of the region (DescribeTargetGroups, every page, 400
    /// a page).
    async fn target_groups(&self) -> CloudResult<Vec<TargetGroup>>;

    /// The registered targets of one target group and their states
    /// (DescribeTargetHealth). A target group deleted meanwhile is `NotFound`.
    async fn target_health(&self, arn: &str) -> CloudResult<Vec<TargetHealth>>;

    /// The target group's `deregistration_delay.timeout_seconds`
    /// (DescribeTargetGroupAttributes), as AWS spells the value.
    async fn deregistration_delay(&self, arn: &str) -> CloudResult<Option<String>>;

    // The last mile's one write (issue 73, item 3, opt-in per group): the instance
    // out of the target groups attached to its own group, before the wait.

    /// The ARNs of the ELBv2 target groups attached to the Auto Scaling group
    /// (DescribeLoadBalancerTargetGroups, every page).
    async fn group_target_groups(&self, group: &str) -> CloudResult<Vec<String>>;

    /// DeregisterTargets: these targets (id and port as DescribeTargetHealth gave
    /// them) out of one target group. Deregistering a target that is already
    /// draining or gone changes nothing.
    async fn deregister_targets(&self, arn: &str, targets: &[TargetHealth]) -> CloudResult<()>;
}

/// How many pages of 100 scaling activities [`Cloud::termination_cause`] reads at
/// most: a refresh of a few hundred instances, newest first.
pub const ACTIVITY_PAGES: usize = 5;

/// The instance a scaling activity's `Description` says it terminates
/// (`Terminating EC2 instance: i-...`), if it says so.
pub fn terminated_by(description: &str) -> Option<&str> {
    description
        .strip_prefix("Terminating EC2 instance: ")?
        .split_whitespace()
        .next()
}

/// A scaling activity's `Cause`, cut to at most 4 KiB on a character boundary.
pub fn bounded_cause(cause: &str) -> String {
    let mut end = cause.len().min(4096);
    while !cause.is_char_boundary(end) {
        end -= 1;
    }
    cause[..end].to_string()
}

/// An ELBv2 target group as DescribeTargetGroups lists it (ALB, NLB or GWLB).
#[derive(serde::Serialize, serde::Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct TargetGroup {
    pub arn: String,
    pub name: String,
    /// `instance`, `ip`, `lambda` or `alb`, as AWS spells it.
    pub target_type: String,
}

/// One registered target of a target group and its state (DescribeTargetHealth).
#[derive(serde::Serialize, serde::Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct TargetHealth {
    /// An instance id (`instance` targets) or an IP address (`ip` targets).
    pub id: String,
    pub port: Option<i32>,
    /// `initial`, `healthy`, `unhealthy`, `unhealthy.draining`, `unused`, `draining`,
    /// `unavailable`, as AWS spells it.
    pub state: String,
}

/// The private addresses EC2 gives an instance: every network interface's IPv4 and
/// IPv6 addresses (the node's InternalIP, and with the VPC CNI its pods' addresses)
/// and the prefixes delegated to them (prefix delegation), as `address/length`.
#[derive(serde::Serialize, serde::Deserialize, Debug, Clone, Default, PartialEq, Eq)]
pub struct InstanceAddresses {
    pub addresses: Vec<String>,
    pub prefixes: Vec<String>,
}

/// One pending lifecycle action: an instance held in `Terminating:Wait` by a hook.
#[derive(serde::Serialize, serde::Deserialize, Debug, Clone, PartialEq, Eq, Hash)]
pub struct LifecycleAction {
    pub group: String,
    pub hook: String,
    pub instance_id: String,
    /// The action token from the hook's notification, when one was received; AWS
    /// accepts the instance id alone.
    pub token: Option<String>,
}

#[derive(serde::Serialize, serde::Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub enum LifecycleResult {
    Continue,
    Abandon,
}

impl LifecycleResult {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Continue => "CONTINUE",
            Self::Abandon => "ABANDON",
        }
    }
}

impl InstanceRequirements {
    /// Whether an instance type meets the requirements' size, GPU and name terms
    /// (the in-memory cloud's stand-in for GetInstanceTypesFromInstanceRequirements).
    pub fn admits(&self, t: &InstanceTypeInfo) -> bool {
        let within = |v: i64, min: i64, max: Option<i64>| v >= min && max.is_none_or(|m| v <= m);
        let named = |patterns: &[String]| patterns.iter().any(|p| wildcard_match(p, &t.name));
        within(t.vcpus, self.vcpu_min, self.vcpu_max)
            && within(t.memory_mib, self.memory_mib_min, self.memory_mib_max)
            && self.nvidia_gpus_min.is_none_or(|n| {
                t.gpus >= n
                    && (n <= 0
                        || t.gpu_manufacturer
                            .as_deref()
                            .is_some_and(|m| m.eq_ignore_ascii_case("nvidia")))
            })
            && (self.allowed_types.is_empty() || named(&self.allowed_types))
            && !named(&self.excluded_types)
    }
}

/// AWS's instance type patterns: `*` matches any run of characters (`m5*`, `*.large`).
pub fn wildcard_match(pattern: &str, name: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == name,
        Some((head, rest)) => {
            let Some(tail) = name.strip_prefix(head) else {
                return false;
            };
            (0..=tail.len())
                .filter(|i| tail.is_char_boundary(*i))
                .any(|i| wildcard_match(rest, &tail[i..]))
        }
    }
}

/// What DescribeNodegroup says of an EKS managed node group that its nodes carry.
#[derive(serde::Serialize, serde::Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct EksNodegroup {
    pub name: Option<String>,
    /// The node group's own Kubernetes labels.
    pub labels: BTreeMap<String, String>,
    pub taints: Vec<Taint>,
    /// `ON_DEMAND` or `SPOT` (EKS labels its nodes `eks.amazonaws.com/capacityType`).
    pub capacity_type: Option<String>,
    /// `AL2023_x86_64_STANDARD`, `BOTTLEROCKET_ARM_64`, ...
    pub ami_type: Option<String>,
    /// The node group's disk size, when it launches without a launch template.
    pub disk_size_gib: Option<i64>,
    /// The node group's resource tags (CA's `node-template/resources/` tags count).
    pub tags: BTreeMap<String, String>,
}

/// A Kubernetes taint, as the core and the cloud backends share it.
#[derive(
    serde::Serialize, serde::Deserialize, Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord,
)]
pub struct Taint {
    pub key: String,
    pub value: String,
    /// `NoSchedule`, `PreferNoSchedule` or `NoExecute`.
    pub effect: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 70: every state AWS names is a variant, spelled once: each reads back as
    /// itself, a pool state is `Warmed:*` and nothing else is, a state this code does
    /// not know stays as AWS spelled it (and a `Warmed:` one of a newer AWS is still
    /// the pool's).
    #[test]
    fn every_lifecycle_state_is_a_variant_spelled_once() {
        let all: Vec<LifecycleState> = LifecycleState::all().collect();
        assert_eq!(all.len(), 24);
        for s in &all {
            assert_eq!(&LifecycleState::parse(s.as_str()), s);
            assert!(!matches!(s, LifecycleState::Other(_)));
            assert_eq!(s.in_warm_pool(), s.as_str().starts_with("Warmed:"), "{s:?}");
        }
        let spellings: std::collections::BTreeSet<&str> = all.iter().map(|s| s.as_str()).collect();
        assert_eq!(spellings.len(), all.len(), "each spelled once");
        assert_eq!(LifecycleState::pool_states().count(), 12);
        let new = LifecycleState::parse("Warmed:Something:New");
        assert_eq!(new.as_str(), "Warmed:Something:New");
        assert!(new.in_warm_pool() && !new.is_resting_in_pool());
        assert!(!LifecycleState::parse("Something").in_warm_pool());
    }

    /// Issue 70: "which states come before our hook's hold" was two unnamed lists, in
    /// the completion (`stages/terminate.rs`) and the heartbeats (`engine/keeper.rs`),
    /// and they disagreed. As they stood at ee40c0a: the heartbeats' list also held
    /// Terminating:Wait and Warmed:Pending:Wait (the hold itself: a heartbeat answered
    /// "no action" there goes on, since AWS's lifecycle API may lag its reads and
    /// stopping early lets the hook's timeout end the instance undrained; the
    /// completion takes "no action" there as done before), and neither held the pool
    /// ending one of its instances (Warmed:Terminating, before our terminating hook
    /// holds it at Warmed:Terminating:Wait), so a completion there was taken as done
    /// and the heartbeats stopped before the action came. Now one named set before the
    /// hold, one for the hold: every wait where a terminating hook holds an instance is
    /// in the hold, every state that leads to one is before it, and nothing else.
    #[test]
    fn the_states_before_and_at_our_hold_are_named_once() {
        use LifecycleState::*;
        let before = LifecycleState::BEFORE_OUR_HOLD;
        let hold = LifecycleState::OUR_HOLD;
        let old_completion = [InService, Terminating, WarmedPending];
        let old_heartbeats = [
            InService,
            Terminating,
            TerminatingWait,
            WarmedPending,
            WarmedPendingWait,
        ];
        for s in LifecycleState::all() {
            let was = (old_completion.contains(&s), old_heartbeats.contains(&s));
            let now = (
                before.contains(&s),
                before.contains(&s) || hold.contains(&s),
            );
            let differs = was != now;
            // What changed: the pool's ending, before and at the hold.
            assert_eq!(
                differs,
                matches!(s, WarmedTerminating | WarmedTerminatingWait),
                "{s:?}: was {was:?}, now {now:?}"
            );
            // The hold is exactly where terminating hooks wait.
            let waits =
                matches!(s, TerminatingWait) || s.is_pool_bound_wait() || s.is_pool_ending_wait();
            assert_eq!(hold.contains(&s), waits, "{s:?}");
            assert!(!(before.contains(&s) && hold.contains(&s)), "{s:?} both");
        }
    }

    #[test]
    fn wildcards_match_as_aws_patterns_do() {
        for (p, n, want) in [
            ("m5.large", "m5.large", true),
            ("m5*", "m5.large", true),
            ("m5*", "m5a.large", true),
            ("*.large", "c6i.large", true),
            ("*.large", "c6i.xlarge", false),
            ("c6*.*large", "c6i.2xlarge", true),
            ("*", "", true),
            ("m5", "m5.large", false),
            ("g3*", "g4dn.xlarge", false),
        ] {
            assert_eq!(wildcard_match(p, n), want, "{p} ~ {n}");
        }
    }

    #[test]
    fn requirements_admit_by_size_gpus_and_names() {
        let t = |name: &str, vcpus, memory_mib, gpus| InstanceTypeInfo {
            name: name.into(),
            vcpus,
            memory_mib,
            gpus,
            gpu_manufacturer: (gpus > 0).then(|| "NVIDIA".into()),
            ..Default::default()
        };
        let r = InstanceRequirements {
            vcpu_min: 4,
            vcpu_max: Some(8),
            memory_mib_min: 16384,
            excluded_types: vec!["r5*".into()],
            ..Default::default()
        };
        assert!(r.admits(&t("m5.xlarge", 4, 16384, 0)));
        assert!(!r.admits(&t("m5.large", 2, 8192, 0)));
        assert!(!r.admits(&t("m5.4xlarge", 16, 65536, 0)));
        assert!(!r.admits(&t("r5.xlarge", 4, 32768, 0)));
        let gpu = InstanceRequirements {
            nvidia_gpus_min: Some(1),
            allowed_types: vec!["g4dn.*".into()],
            ..Default::default()
        };
        assert!(gpu.admits(&t("g4dn.xlarge", 4, 16384, 1)));
        assert!(!gpu.admits(&t("m5.xlarge", 4, 16384, 0)));
        assert!(!gpu.admits(&t("p3.2xlarge", 8, 62464, 1)));
        // An NVIDIA requirement is not met by AMD's GPUs (g4ad).
        let any_nvidia = InstanceRequirements {
            nvidia_gpus_min: Some(1),
            ..Default::default()
        };
        let amd = InstanceTypeInfo {
            gpu_manufacturer: Some("AMD".into()),
            ..t("g4ad.xlarge", 4, 16384, 1)
        };
        assert!(any_nvidia.admits(&t("g4dn.xlarge", 4, 16384, 1)));
        assert!(!any_nvidia.admits(&amd));
    }
}

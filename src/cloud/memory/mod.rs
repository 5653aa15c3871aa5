//! In-memory ASGs for the demo, the tests and CA developers.
//!
//! Time-driven but lazy: each call first settles the state at "now" (pending instances
//! whose launch delay passed become InService, lifecycle actions whose heartbeat
//! timeout passed take their default result), so no background task is needed and a
//! test sees the same sequence every run. Launch failures can be injected per group.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use crate::clock::Instant;

use async_trait::async_trait;
use parking_lot::{Mutex, MutexGuard};

use super::{
    AsgInstance, AsgSnapshot, BlockVolume, Cloud, CloudError, CloudResult, EksNodegroup,
    GroupSelector, InstanceLocation, InstanceRequirements, InstanceTypeInfo, LaunchData,
    LaunchFailure, LaunchHistory, LaunchSpec, LaunchTemplateRef, LifecycleAction, LifecycleHook,
    LifecycleResult, LifecycleState, WarmPool,
};

/// How long a stale read ([`MemoryCloud::stale_reads`]) can lag AWS's truth at most:
/// AWS's describe calls converge within seconds; the provider's own guard against
/// them (`provider::written::SETTLE`) spans a minute.
pub const STALE_FOR: Duration = Duration::from_secs(30);

/// The region the in-memory cloud's zones (`us-east-1a`..) are in.
pub const REGION: &str = "us-east-1";

pub mod fleet;

/// The ASG to create in a [`MemoryCloud`].
#[derive(Debug, Clone)]
pub struct MemoryGroup {
    pub name: String,
    pub min_size: i32,
    pub max_size: i32,
    pub desired: i32,
    pub zones: Vec<String>,
    pub instance_type: String,
    pub tags: BTreeMap<String, String>,
    pub user_data: Option<String>,
    /// The group's EC2_INSTANCE_TERMINATING hooks (an EKS managed node group has
    /// EKS's `Terminate-LC-Hook` besides any other). An instance being ended waits in
    /// Terminating:Wait for every one of them.
    pub terminating_hooks: Vec<LifecycleHook>,
    /// A mixed instances policy with attribute-based selection instead of a type
    /// (instances still launch as `instance_type`).
    pub requirements: Option<InstanceRequirements>,
    /// The launch template version the ASG names (`$Default`, `$Latest`, a number);
    /// None names none, which AWS reads as `$Default`.
    pub launch_template_version: Option<String>,
    /// The group's warm pool configuration (its instances are not played).
    pub warm_pool: Option<WarmPool>,
}

impl MemoryGroup {
    pub fn new(name: &str, min: i32, max: i32, desired: i32, instance_type: &str) -> Self {
        Self {
            name: name.to_string(),
            min_size: min,
            max_size: max,
            desired,
            zones: vec![
                "us-east-1a".into(),
                "us-east-1b".into(),
                "us-east-1c".into(),
            ],
            instance_type: instance_type.to_string(),
            tags: BTreeMap::new(),
            user_data: None,
            terminating_hooks: Vec::new(),
            requirements: None,
            launch_template_version: None,
            warm_pool: None,
        }
    }

    /// A warm pool beside the group, as PutWarmPool configures one.
    pub fn warm_pool(mut self, pool: WarmPool) -> Self {
        self.warm_pool = Some(pool);
        self
    }

    /// The launch template version the ASG names (`$Latest`, `3`, ...).
    pub fn launch_template_version(mut self, version: &str) -> Self {
        self.launch_template_version = Some(version.to_string());
        self
    }

    pub fn instance_requirements(mut self, requirements: InstanceRequirements) -> Self {
        self.requirements = Some(requirements);
        self
    }

    pub fn tag(mut self, key: &str, value: &str) -> Self {
        self.tags.insert(key.to_string(), value.to_string());
        self
    }

    pub fn zones(mut self, zones: &[&str]) -> Self {
        self.zones = zones.iter().map(|z| z.to_string()).collect();
        self
    }

    pub fn user_data(mut self, data: &str) -> Self {
        self.user_data = Some(data.to_string());
        self
    }

    /// Adds (or, by name, replaces) an EC2_INSTANCE_TERMINATING hook whose default
    /// result is ABANDON.
    pub fn terminating_hook(self, name: &str, heartbeat_timeout_secs: i32) -> Self {
        self.hook(LifecycleHook {
            name: name.to_string(),
            heartbeat_timeout_secs,
            default_result: "ABANDON".into(),
        })
    }

    /// Adds (or, by name, replaces) an EC2_INSTANCE_TERMINATING hook, as
    /// PutLifecycleHook does.
    pub fn hook(mut self, hook: LifecycleHook) -> Self {
        put_hook(&mut self.terminating_hooks, hook);
        self
    }

    /// Makes the group an EKS managed node group's ASG: the tags `eks:cluster-name` and
    /// `eks:nodegroup-name`, and EKS's own `Terminate-LC-Hook` with `eks_timeout_secs`
    /// of heartbeat timeout and CONTINUE as its default result (EKS lets the
    /// termination go on when its drain did not finish in time).
    pub fn eks_managed(self, cluster: &str, nodegroup: &str, eks_timeout_secs: i32) -> Self {
        self.tag(EKS_CLUSTER_TAG, cluster)
            .tag(EKS_NODEGROUP_TAG, nodegroup)
            .hook(LifecycleHook {
                name: EKS_TERMINATE_HOOK.to_string(),
                heartbeat_timeout_secs: eks_timeout_secs,
                default_result: "CONTINUE".into(),
            })
    }
}

/// EKS's terminating hook on a managed node group's ASG.
pub const EKS_TERMINATE_HOOK: &str = "Terminate-LC-Hook";
/// The tags EKS puts on a managed node group's ASG.
pub const EKS_CLUSTER_TAG: &str = "eks:cluster-name";
pub const EKS_NODEGROUP_TAG: &str = "eks:nodegroup-name";

/// A target of the group out, `draining` from now for the group's delay; logged once
/// (a target already draining or unused is left as it is, as ELBv2 does).
fn deregister_in(st: &mut State, arn: &str, id: &str, by_service: bool) {
    let now = Instant::now();
    let Some(g) = st.target_groups.iter_mut().find(|g| g.arn == arn) else {
        return;
    };
    let mut changed = false;
    for t in g
        .targets
        .iter_mut()
        .filter(|t| t.id == id && t.deregistered.is_none())
    {
        t.deregistered = Some(now);
        changed = true;
    }
    if changed {
        st.lb_log.push((
            Instant::now(),
            LbEvent::Deregistered {
                target_group: arn.to_string(),
                target: id.to_string(),
                by_service,
            },
        ));
    }
}

fn put_hook(hooks: &mut Vec<LifecycleHook>, hook: LifecycleHook) {
    match hooks.iter_mut().find(|h| h.name == hook.name) {
        Some(h) => *h = hook,
        None => hooks.push(hook),
    }
}

/// What happened to a lifecycle action or its instance, in the order it happened
/// ([`MemoryCloud::lifecycle_log`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HookEvent {
    /// The hook's action was completed with this result.
    Completed {
        instance: String,
        hook: String,
        result: LifecycleResult,
    },
    /// The hook's timeout passed with no heartbeat or completion; its default
    /// result applied.
    TimedOut { instance: String, hook: String },
    /// An ABANDON (completed or by default) ended the instance's other hooks'
    /// actions unfinished, as AWS does on termination.
    Dropped { instance: String, hook: String },
    /// No hook holds the instance any more: Terminating:Proceed.
    Proceeded { instance: String },
    /// The instance is gone.
    Terminated { instance: String },
}

/// What happened at the load balancers and to the instances' end calls, in the
/// order it happened ([`MemoryCloud::lb_log`]): the order a test asserts instead of
/// times.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LbEvent {
    /// A target was deregistered: by the service's DeregisterTargets
    /// (`by_service`), or by a test playing a load balancer controller.
    Deregistered {
        target_group: String,
        target: String,
        by_service: bool,
    },
    /// A DescribeTargetHealth answer showed a target in a state other than the one
    /// the previous answer showed it in (the first answer counts as a change).
    Answered {
        target_group: String,
        target: String,
        state: String,
    },
    /// A call of the load balancers was refused or throttled (a test's fault).
    Refused { operation: String },
    /// The instance's addresses were asked for (DescribeInstances, the wait's first
    /// look where a group has `ip` targets): logged before the answer, refused or not.
    AddressesRead { instance: String },
    /// An instance's end was asked: CompleteLifecycleAction (`completed`) or
    /// TerminateInstanceInAutoScalingGroup, answered without an error.
    EndCall { instance: String, completed: bool },
}

/// One change of a group's desired capacity, and what made it
/// ([`MemoryCloud::desired_log`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DesiredChange {
    pub group: String,
    pub from: i32,
    pub to: i32,
    pub by: DesiredBy,
}

/// What changed a group's desired capacity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DesiredBy {
    /// TerminateInstanceInAutoScalingGroup with ShouldDecrementDesiredCapacity.
    Terminate { instance: String },
    /// SetDesiredCapacity.
    SetDesired,
    /// A scale-in that did not come from a caller ([`MemoryCloud::external_scale_in`]).
    External,
}

/// One hook's action an instance in Terminating:Wait waits for.
#[derive(Debug, Clone)]
struct Wait {
    hook: String,
    /// The action's LifecycleActionToken, as AWS puts it in the hook's notification.
    token: String,
    /// The hook's heartbeat timeout when the termination began.
    timeout: Duration,
    /// When the action times out (None until the instance is in Terminating:Wait).
    deadline: Option<Instant>,
    abandon_by_default: bool,
}

/// Timing of the simulated ASG.
#[derive(Debug, Clone)]
pub struct MemoryTiming {
    /// From launch to InService.
    pub launch_delay: Duration,
    /// From Terminating (or Terminating:Proceed) to gone.
    pub terminate_delay: Duration,
    /// With a terminating hook: from Terminating to Terminating:Wait (AWS takes a
    /// moment; until then there is no lifecycle action to heartbeat or complete).
    pub hook_delay: Duration,
}

impl Default for MemoryTiming {
    fn default() -> Self {
        Self {
            launch_delay: Duration::from_millis(1500),
            terminate_delay: Duration::from_millis(500),
            hook_delay: Duration::ZERO,
        }
    }
}

#[derive(Debug, Clone)]
struct MemInstance {
    id: String,
    zone: String,
    state: LifecycleState,
    instance_type: String,
    /// When the current state began.
    since: Instant,
    /// For Terminating (on its way to) and Terminating:Wait: the hooks' actions not
    /// completed or timed out yet.
    waits: Vec<Wait>,
    /// Terminating on its way to Terminating:Wait: when it gets there.
    enters_wait: Option<Instant>,
}

#[derive(Debug, Clone)]
struct MemAsg {
    spec: MemoryGroup,
    desired: i32,
    instances: Vec<MemInstance>,
    /// Launches fail with this code while set.
    fail_launches: Option<String>,
    failures: Vec<LaunchFailure>,
    /// When the newest launch activity started (a rise of desired capacity or a
    /// failed launch), as AWS keeps it in the scaling activities.
    last_launch_unix: Option<i64>,
    zone_cursor: usize,
    /// No replacement is launched before this (the health check after a reclaim).
    launches_held_until: Option<Instant>,
    /// Instances in the group's warm pool, in their `Warmed:*` state: not the
    /// group's (DescribeAutoScalingGroups leaves them out), still answered by
    /// DescribeAutoScalingInstances.
    pool: Vec<MemInstance>,
}

impl MemAsg {
    /// A group as created: its desired capacity as given, nothing launched yet.
    fn new(spec: MemoryGroup) -> MemAsg {
        MemAsg {
            desired: spec.desired,
            spec,
            instances: Vec::new(),
            fail_launches: None,
            launches_held_until: None,
            failures: Vec::new(),
            last_launch_unix: None,
            zone_cursor: 0,
            pool: Vec::new(),
        }
    }
}

/// Group `group` to change, or AWS's not-found.
fn group_mut<'a>(st: &'a mut State, group: &str) -> CloudResult<&'a mut MemAsg> {
    st.groups
        .get_mut(group)
        .ok_or_else(|| not_found("group", group))
}

/// Group `group` as a read sees it: from the stale view while one lasts
/// ([`MemoryCloud::stale_reads`]), else as it is; or AWS's not-found.
fn seen_group<'a>(
    stale: &'a Option<BTreeMap<String, MemAsg>>,
    groups: &'a BTreeMap<String, MemAsg>,
    group: &str,
) -> CloudResult<&'a MemAsg> {
    stale
        .as_ref()
        .unwrap_or(groups)
        .get(group)
        .ok_or_else(|| not_found("group", group))
}

#[derive(Default)]
struct State {
    groups: BTreeMap<String, MemAsg>,
    /// The `Cause` of each instance's termination activity, as AWS words it
    /// ([`MemoryCloud::termination_cause`]; [`MemoryCloud::set_termination_cause`]
    /// for the causes the memory cloud does not play, a refresh among them).
    termination_causes: BTreeMap<String, String>,
    next_instance: u64,
    calls: BTreeMap<String, u64>,
    completed_actions: Vec<(LifecycleAction, LifecycleResult)>,
    /// When each lifecycle action was completed, by instance.
    completed_at: Vec<(String, Instant)>,
    heartbeats: Vec<LifecycleAction>,
    /// At each heartbeat and completion: the instance and how long its hook had left.
    hook_slack: Vec<(String, Duration)>,
    /// Operations that fail once with a throttle, for error-path tests.
    throttle_next: BTreeMap<String, u32>,
    /// Operations refused with an error code (AccessDenied, ...) this many times.
    refuse_next: BTreeMap<String, (String, u32)>,
    /// EKS managed node groups by (cluster, node group), as DescribeNodegroup
    /// answers them; absent ones are NotFound.
    eks: BTreeMap<(String, String), EksNodegroup>,
    /// Instances the ASG chose to end itself because SetDesiredCapacity went below
    /// the instances it had (what a drain-aware caller must never cause).
    chosen_by_asg: Vec<String>,
    /// Instances whose lifecycle hook timed out (no heartbeat, no completion).
    hook_timeouts: Vec<String>,
    /// Every lifecycle action's end and every instance's way out, in order.
    log: Vec<HookEvent>,
    /// Every change of a desired capacity, in order.
    desired_log: Vec<DesiredChange>,
    /// Reads answered from an older state ([`MemoryCloud::stale_reads`]): that state,
    /// how many more reads get it, and until when at most.
    stale: Option<(BTreeMap<String, MemAsg>, u32, Instant)>,
    /// Heartbeats and completions that carry a token must carry the action's.
    check_tokens: bool,
    /// Instances detached from their group ([`MemoryCloud::detach`]): in no group,
    /// still running, as EC2 would show them.
    detached: BTreeSet<String>,
    /// ELBv2 target groups (the last mile), in the order added.
    target_groups: Vec<MemTargetGroup>,
    /// The last mile's reads, by trait method ([`MemoryCloud::lb_calls`]).
    lb_calls: BTreeMap<String, u64>,
    /// Target groups attached to each Auto Scaling group, by ARN.
    attached: BTreeMap<String, Vec<String>>,
    /// The load balancers' order of events, each with when it happened
    /// ([`MemoryCloud::lb_log`]).
    lb_log: Vec<(Instant, LbEvent)>,
    /// The state each target was last answered in: (group ARN, target) -> state.
    lb_answered: BTreeMap<(String, String), String>,
}

/// An ELBv2 target group of the memory cloud: its targets drain for its
/// deregistration delay once deregistered, then are `unused`.
#[derive(Debug, Clone)]
struct MemTargetGroup {
    arn: String,
    name: String,
    target_type: String,
    /// `deregistration_delay.timeout_seconds` as AWS would spell it.
    delay: String,
    targets: Vec<MemTarget>,
}

#[derive(Debug, Clone)]
struct MemTarget {
    id: String,
    /// `None`: registered (healthy); `Some(t)`: deregistered at `t`.
    deregistered: Option<Instant>,
}

impl MemTargetGroup {
    fn delay(&self) -> Duration {
        self.delay
            .parse::<u64>()
            .map(Duration::from_secs)
            .unwrap_or(Duration::from_secs(300))
    }

    fn state(&self, t: &MemTarget, now: Instant) -> &'static str {
        match t.deregistered {
            None => "healthy",
            Some(at) if now < at + self.delay() => "draining",
            Some(_) => "unused",
        }
    }
}

/// In-memory Auto Scaling. Cheap to clone (shared state).
#[derive(Clone)]
pub struct MemoryCloud {
    state: Arc<Mutex<State>>,
    timing: MemoryTiming,
    instance_types: Arc<BTreeMap<String, InstanceTypeInfo>>,
    /// How long every call takes before it is answered ([`MemoryCloud::slow`]).
    latency: Arc<Mutex<Duration>>,
    /// How long the answer of a call that already took effect takes to come back
    /// ([`MemoryCloud::slow_answers`]).
    answer_latency: Arc<Mutex<Duration>>,
}

impl MemoryCloud {
    pub fn new(groups: Vec<MemoryGroup>, timing: MemoryTiming) -> Self {
        let cloud = Self {
            state: Arc::new(Mutex::new(State::default())),
            timing,
            instance_types: Arc::new(builtin_instance_types()),
            latency: Arc::new(Mutex::new(Duration::ZERO)),
            answer_latency: Arc::new(Mutex::new(Duration::ZERO)),
        };
        {
            let mut st = cloud.state.lock();
            for g in groups {
                st.groups.insert(g.name.clone(), MemAsg::new(g));
            }
            // Instances that exist from the start are already InService.
            let now = Instant::now();
            let past = now.checked_sub(cloud.timing.launch_delay).unwrap_or(now);
            let names: Vec<String> = st.groups.keys().cloned().collect();
            for name in names {
                cloud.reconcile_group(&mut st, &name, past);
            }
        }
        cloud
    }

    /// Moves the group's scaling activities (failed launches, the newest launch)
    /// `secs` seconds into the past, as if that much time had gone by since.
    pub fn age_activities(&self, group: &str, secs: i64) {
        let mut st = self.state.lock();
        if let Some(g) = st.groups.get_mut(group) {
            for f in &mut g.failures {
                f.started_at_unix -= secs;
            }
            g.last_launch_unix = g.last_launch_unix.map(|t| t - secs);
        }
    }

    /// Makes launches of `group` fail with `code` (e.g. InsufficientInstanceCapacity)
    /// until called again with `None`.
    pub fn fail_launches(&self, group: &str, code: Option<&str>) {
        let mut st = self.state.lock();
        if let Some(g) = st.groups.get_mut(group) {
            g.fail_launches = code.map(str::to_string);
        }
    }

    /// EC2 ends an instance itself (a spot reclaim): no decrement, no lifecycle hook;
    /// the ASG notices after its health check (`replace_after`) and launches a
    /// replacement to keep desired capacity.
    pub fn reclaim(&self, instance_id: &str, replace_after: Duration) {
        let mut st = self.state.lock();
        let now = Instant::now();
        for g in st.groups.values_mut() {
            if let Some(i) = g.instances.iter_mut().find(|i| i.id == instance_id) {
                i.state = LifecycleState::Terminating;
                i.enters_wait = None;
                i.waits.clear();
                i.since = now;
                g.launches_held_until = Some(now + replace_after);
            }
        }
    }

    /// Sends an instance to its group's warm pool, as a scale-in with ReuseOnScaleIn
    /// does once the hooks let it go: it leaves the group's instances and its desired
    /// capacity (one lower) and waits in the pool in `state` (`Warmed:Stopped`, ...),
    /// where DescribeAutoScalingInstances still finds it. False: no such instance.
    pub fn send_to_warm_pool(&self, instance_id: &str, state: &str) -> bool {
        let mut st = self.state.lock();
        for g in st.groups.values_mut() {
            if let Some(at) = g.instances.iter().position(|i| i.id == instance_id) {
                let mut i = g.instances.remove(at);
                i.state = LifecycleState::parse(state);
                i.enters_wait = None;
                i.waits.clear();
                i.since = Instant::now();
                g.pool.push(i);
                g.desired = (g.desired - 1).max(0);
                return true;
            }
        }
        false
    }

    /// Launches a new instance into the group's warm pool, as AWS warms one up: it
    /// waits in `Warmed:Pending:Wait` for a launch hook named `launch_hook` (no
    /// terminating hook holds it) for `secs`, then rests in the pool. Returns its id.
    pub fn warm_up(&self, group: &str, launch_hook: &str, secs: u64) -> Option<String> {
        let mut st = self.state.lock();
        let id = format!("i-{:017x}", st.next_instance + 1);
        let g = st.groups.get_mut(group)?;
        let now = Instant::now();
        let zone = g
            .spec
            .zones
            .first()
            .cloned()
            .unwrap_or_else(|| "us-east-1a".into());
        g.pool.push(MemInstance {
            id: id.clone(),
            zone,
            state: POOL_BOUND_WAIT,
            instance_type: g.spec.instance_type.clone(),
            since: now,
            waits: vec![Wait {
                hook: launch_hook.to_string(),
                token: next_token(),
                timeout: Duration::from_secs(secs),
                deadline: Some(now + Duration::from_secs(secs)),
                abandon_by_default: false,
            }],
            enters_wait: None,
        });
        st.next_instance += 1;
        Some(id)
    }

    /// Puts a terminating hook on a running group, as an operator does by hand with
    /// PutLifecycleHook: instances that end from now on wait for it.
    pub fn add_hook(&self, group: &str, hook: LifecycleHook) {
        if let Some(g) = self.state.lock().groups.get_mut(group) {
            put_hook(&mut g.spec.terminating_hooks, hook);
        }
    }

    /// Deletes the group's terminating hooks (someone removed them, or the ASG was
    /// recreated under the same name without them).
    pub fn delete_hook(&self, group: &str) {
        if let Some(g) = self.state.lock().groups.get_mut(group) {
            g.spec.terminating_hooks.clear();
        }
    }

    /// Creates a group while the cloud runs (an ASG created, or given the discovery
    /// tags, after the service started); its instances are InService at once.
    pub fn add_group(&self, g: MemoryGroup) {
        let mut st = self.state.lock();
        let name = g.name.clone();
        st.groups.insert(name.clone(), MemAsg::new(g));
        let now = Instant::now();
        let past = now.checked_sub(self.timing.launch_delay).unwrap_or(now);
        self.reconcile_group(&mut st, &name, past);
    }

    /// Deletes a group (an ASG removed by its owner).
    pub fn delete_group(&self, group: &str) {
        self.state.lock().groups.remove(group);
    }

    /// From now on every call waits `latency` before it is answered, as AWS does when
    /// it is slow (zero: at once again).
    pub fn slow(&self, latency: Duration) {
        *self.latency.lock() = latency;
    }

    async fn pause(&self) {
        let latency = *self.latency.lock();
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
    }

    /// From now on every call takes effect at once but its answer takes `latency` to
    /// come back, as when AWS did the work and the response is slow or lost (a caller
    /// that gives up meanwhile does not know it happened). Zero: at once again.
    pub fn slow_answers(&self, latency: Duration) {
        *self.answer_latency.lock() = latency;
    }

    /// One call that changes AWS's state: the usual latency, the effect at once, then
    /// the answer as late as [`MemoryCloud::slow_answers`] says.
    async fn effect<T>(&self, act: impl FnOnce() -> CloudResult<T>) -> CloudResult<T> {
        self.pause().await;
        let answer = act();
        self.answer_later().await;
        answer
    }

    async fn answer_later(&self) {
        let latency = *self.answer_latency.lock();
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
    }

    /// The next `reads` reads (DescribeAutoScalingGroups, DescribeAutoScalingInstances,
    /// DescribeLifecycleHooks) answer the state as it is now, whatever happens
    /// meanwhile: AWS's eventual consistency, a read served from a lagging replica.
    /// For at most [`STALE_FOR`]: AWS's replicas converge within seconds, not
    /// minutes. Zero: fresh answers again.
    pub fn stale_reads(&self, reads: u32) {
        let mut st = self.settled();
        let until = Instant::now() + STALE_FOR;
        st.stale = (reads > 0).then(|| (st.groups.clone(), reads, until));
    }

    /// The older state a read answers from, if it is to be stale (counts the read).
    fn stale_view(st: &mut State) -> Option<BTreeMap<String, MemAsg>> {
        let (groups, left, until) = st.stale.as_mut()?;
        if Instant::now() >= *until {
            st.stale = None;
            return None;
        }
        let view = groups.clone();
        *left -= 1;
        if *left == 0 {
            st.stale = None;
        }
        Some(view)
    }

    /// Changes a hook's heartbeat timeout, as PutLifecycleHook does: actions already
    /// waiting keep their deadline until their next heartbeat, which extends them by
    /// the new timeout.
    pub fn set_heartbeat_timeout(&self, group: &str, hook: &str, secs: i32) {
        if let Some(g) = self.state.lock().groups.get_mut(group) {
            if let Some(h) = g.spec.terminating_hooks.iter_mut().find(|h| h.name == hook) {
                h.heartbeat_timeout_secs = secs;
            }
        }
    }

    /// From now on a heartbeat or completion that carries a LifecycleActionToken is
    /// refused unless it is the action's own ([`Self::action_token`]), as AWS refuses
    /// it ("No active Lifecycle Action found with token ..."); one without a token
    /// is taken by instance id, as AWS takes it.
    pub fn check_tokens(&self, on: bool) {
        self.state.lock().check_tokens = on;
    }

    /// The LifecycleActionToken of the hook's action on the instance, while it waits.
    pub fn action_token(&self, instance_id: &str, hook: &str) -> Option<String> {
        self.waits_on(instance_id)
            .into_iter()
            .find(|w| w.hook == hook)
            .map(|w| w.token)
    }

    /// The hooks' actions that hold the instance now, in the group's order: in the
    /// group, or on its way into or out of the warm pool (`Warmed:Pending:Wait`,
    /// `Warmed:Terminating:Wait`), where AWS holds it with a token as much.
    fn waits_on(&self, instance_id: &str) -> Vec<Wait> {
        self.settled()
            .groups
            .values()
            .flat_map(|g| g.instances.iter().chain(&g.pool))
            .filter(|i| i.id == instance_id)
            .flat_map(|i| i.waits.iter().cloned())
            .collect()
    }

    /// Every change of a desired capacity so far, in order, with what made it.
    pub fn desired_log(&self) -> Vec<DesiredChange> {
        self.state.lock().desired_log.clone()
    }

    /// DescribeNodegroup answers this for (cluster, node group); None makes it
    /// NotFound (UpdateNodegroupConfig, CreateNodegroup, DeleteNodegroup).
    pub fn set_eks_nodegroup(&self, cluster: &str, nodegroup: &str, ng: Option<EksNodegroup>) {
        let key = (cluster.to_string(), nodegroup.to_string());
        let mut st = self.state.lock();
        match ng {
            Some(ng) => st.eks.insert(key, ng),
            None => st.eks.remove(&key),
        };
    }

    /// A new launch template version becomes the one the group's reference names
    /// (`$Default` or `$Latest`): its instance type and user data. Instances
    /// launched from now on use it.
    pub fn new_launch_version(&self, group: &str, instance_type: &str, user_data: Option<&str>) {
        let mut st = self.state.lock();
        if let Some(g) = st.groups.get_mut(group) {
            g.spec.instance_type = instance_type.to_string();
            g.spec.user_data = user_data.map(str::to_string);
        }
    }

    /// The next `times` calls of `operation` are refused with `code` (AccessDenied,
    /// ...): an answer, not a passing failure.
    pub fn refuse(&self, operation: &str, code: &str, times: u32) {
        self.state
            .lock()
            .refuse_next
            .insert(operation.to_string(), (code.to_string(), times));
    }

    /// The ASG ends one of its instances in service for a reason of its own, without a
    /// decrement (an instance refresh, a health check's replacement, AZ rebalancing):
    /// through its terminating hooks, `cause` as the termination activity's `Cause`
    /// from the start; a replacement launches. Not an API call (no fault applies).
    /// False: no such instance in service.
    pub fn replace_instance(&self, instance_id: &str, cause: &str) -> bool {
        let mut st = self.settled();
        let now = Instant::now();
        let mut found = false;
        for g in st.groups.values_mut() {
            let hooks = g.spec.terminating_hooks.clone();
            if let Some(inst) = g
                .instances
                .iter_mut()
                .find(|i| i.id == instance_id && i.state == LifecycleState::InService)
            {
                begin_termination(inst, &hooks, now, self.timing.hook_delay);
                found = true;
            }
        }
        if found {
            st.termination_causes
                .insert(instance_id.to_string(), cause.to_string());
        }
        found
    }

    /// The `Cause` the instance's termination activity gives from now on (an
    /// instance refresh, an AZ rebalance: what the memory cloud does not play).
    pub fn set_termination_cause(&self, instance_id: &str, cause: &str) {
        self.state
            .lock()
            .termination_causes
            .insert(instance_id.to_string(), cause.to_string());
    }

    /// A new ELBv2 target group (`instance` or `ip` targets) with its deregistration
    /// delay as AWS spells it (`"300"`); its ARN.
    pub fn add_target_group(&self, name: &str, target_type: &str, delay: &str) -> String {
        let mut st = self.state.lock();
        let arn = format!(
            "arn:aws:elasticloadbalancing:{REGION}:123456789012:targetgroup/{name}/{:016x}",
            st.target_groups.len() + 1
        );
        st.target_groups.push(MemTargetGroup {
            arn: arn.clone(),
            name: name.to_string(),
            target_type: target_type.to_string(),
            delay: delay.to_string(),
            targets: Vec::new(),
        });
        arn
    }

    /// Registers a target (an instance id or an address): `healthy` at once.
    pub fn register_target(&self, arn: &str, id: &str) {
        let mut st = self.state.lock();
        if let Some(g) = st.target_groups.iter_mut().find(|g| g.arn == arn) {
            g.targets.retain(|t| t.id != id);
            g.targets.push(MemTarget {
                id: id.to_string(),
                deregistered: None,
            });
        }
    }

    /// Deregisters a target: `draining` for the group's delay from now, then `unused`
    /// (what the AWS Load Balancer Controller's deregistration looks like).
    pub fn deregister_target(&self, arn: &str, id: &str) {
        let mut st = self.state.lock();
        deregister_in(&mut st, arn, id, false);
    }

    /// Attaches a target group to an Auto Scaling group (AttachLoadBalancerTargetGroups).
    pub fn attach_target_group(&self, group: &str, arn: &str) {
        let mut st = self.state.lock();
        let list = st.attached.entry(group.to_string()).or_default();
        if !list.iter().any(|a| a == arn) {
            list.push(arn.to_string());
        }
    }

    /// What happened at the load balancers and to the instances' end calls, in order.
    pub fn lb_log(&self) -> Vec<LbEvent> {
        self.state
            .lock()
            .lb_log
            .iter()
            .map(|(_, e)| e.clone())
            .collect()
    }

    /// [`Self::lb_log`] with when each happened (a model's bounds).
    pub fn lb_log_timed(&self) -> Vec<(Instant, LbEvent)> {
        self.state.lock().lb_log.clone()
    }

    /// The states of a target group's targets now, by id.
    pub fn target_states(&self, arn: &str) -> Vec<(String, String)> {
        let now = Instant::now();
        let st = self.state.lock();
        st.target_groups
            .iter()
            .filter(|g| g.arn == arn)
            .flat_map(|g| {
                g.targets
                    .iter()
                    .map(move |t| (t.id.clone(), g.state(t, now).to_string()))
            })
            .collect()
    }

    /// The private address the memory cloud gives an instance (its node's InternalIP).
    pub fn address_of(instance_id: &str) -> Option<String> {
        let n = u64::from_str_radix(instance_id.strip_prefix("i-")?, 16).ok()?;
        Some(format!(
            "10.{}.{}.{}",
            (n >> 16) & 255,
            (n >> 8) & 255,
            n & 255
        ))
    }

    /// Lifts throttles, staleness and latency (the end of a test's faults).
    pub fn heal(&self) {
        {
            let mut st = self.state.lock();
            st.throttle_next.clear();
            st.refuse_next.clear();
            st.stale = None;
        }
        self.slow(Duration::ZERO);
        self.slow_answers(Duration::ZERO);
    }

    /// The next `times` calls of `operation` (a trait method name) answer Throttled.
    pub fn throttle(&self, operation: &str, times: u32) {
        self.state
            .lock()
            .throttle_next
            .insert(operation.to_string(), times);
    }

    /// Number of calls per trait method so far.
    pub fn calls(&self) -> BTreeMap<String, u64> {
        self.state.lock().calls.clone()
    }

    /// Number of the last mile's reads (target groups, their health and delays, an
    /// instance's addresses) per trait method so far.
    pub fn lb_calls(&self) -> BTreeMap<String, u64> {
        self.state.lock().lb_calls.clone()
    }

    /// Lifecycle actions completed so far, in order.
    pub fn completed_actions(&self) -> Vec<(LifecycleAction, LifecycleResult)> {
        self.state.lock().completed_actions.clone()
    }

    /// When each lifecycle action was completed: the instance and the instant.
    pub fn completed_at(&self) -> Vec<(String, Instant)> {
        self.state.lock().completed_at.clone()
    }

    /// Heartbeats recorded so far, in order.
    /// Per heartbeat and completion: the instance and the time its hook had left
    /// (zero: it had timed out).
    pub fn hook_slack(&self) -> Vec<(String, Duration)> {
        self.state.lock().hook_slack.clone()
    }

    pub fn heartbeats(&self) -> Vec<LifecycleAction> {
        self.state.lock().heartbeats.clone()
    }

    /// Instances the ASG picked and ended itself after a SetDesiredCapacity below its
    /// instance count, in order.
    pub fn chosen_by_asg(&self) -> Vec<String> {
        self.state.lock().chosen_by_asg.clone()
    }

    /// What happened to lifecycle actions and instances on their way out, in order.
    pub fn lifecycle_log(&self) -> Vec<HookEvent> {
        self.settled().log.clone()
    }

    /// The hooks whose actions hold the instance now (in Terminating:Wait, or on its
    /// way there), in the group's order.
    pub fn pending_hooks(&self, instance_id: &str) -> Vec<String> {
        self.waits_on(instance_id)
            .into_iter()
            .map(|w| w.hook)
            .collect()
    }

    /// Instances whose lifecycle hook timed out without completion, in order (one
    /// entry per hook that timed out).
    pub fn hook_timeouts(&self) -> Vec<String> {
        self.settled().hook_timeouts.clone()
    }

    /// The name of every group, in the cloud's order.
    pub fn group_names(&self) -> Vec<String> {
        self.settled().groups.keys().cloned().collect()
    }

    /// Desired capacity of a group now.
    pub fn desired(&self, group: &str) -> Option<i32> {
        self.settled().groups.get(group).map(|g| g.desired)
    }

    /// Every instance in a warm pool at "now": (group, instance). They still exist
    /// (a stopped instance is kept), so their Nodes stay.
    pub fn pooled(&self) -> Vec<(String, AsgInstance)> {
        self.listed(|g| &g.pool)
    }

    /// Every instance of every group at "now": (group, instance).
    pub fn instances(&self) -> Vec<(String, AsgInstance)> {
        self.listed(|g| &g.instances)
    }

    /// What `of` lists in every group at "now": (group, instance).
    fn listed(&self, of: impl Fn(&MemAsg) -> &Vec<MemInstance>) -> Vec<(String, AsgInstance)> {
        self.settled()
            .groups
            .values()
            .flat_map(|g| {
                of(g)
                    .iter()
                    .map(|i| (g.spec.name.clone(), to_asg_instance(i)))
            })
            .collect()
    }

    /// Scale-in that does not come from CA (a scaling policy, a person): lowers desired
    /// capacity and lets the ASG pick the newest instances to end. Returns their ids.
    pub fn external_scale_in(&self, group: &str, by: i32) -> CloudResult<Vec<String>> {
        let mut st = self.settled();
        let now = Instant::now();
        let g = group_mut(&mut st, group)?;
        let from = g.desired;
        g.desired = (g.desired - by).max(g.spec.min_size);
        let change = DesiredChange {
            group: group.to_string(),
            from,
            to: g.desired,
            by: DesiredBy::External,
        };
        let mut ended = Vec::new();
        let hooks = g.spec.terminating_hooks.clone();
        let reuse = g
            .spec
            .warm_pool
            .as_ref()
            .filter(|p| p.reuse_on_scale_in)
            .map(|p| p.pool_state.clone());
        for inst in g.instances.iter_mut().rev() {
            if ended.len() as i32 >= by {
                break;
            }
            if !inst.state.fills_a_slot() {
                continue;
            }
            match &reuse {
                // ReuseOnScaleIn: the instance goes back to the pool, through the
                // terminating hooks' wait in Warmed:Pending:Wait.
                Some(_) => begin_pool_return(inst, &hooks, now, self.timing.hook_delay),
                None => begin_termination(inst, &hooks, now, self.timing.hook_delay),
            }
            ended.push(inst.id.clone());
        }
        let stamp = crate::clock::utc_now().format("%Y-%m-%dT%H:%M:%SZ");
        for id in &ended {
            st.termination_causes.insert(
                id.clone(),
                format!("At {stamp} an instance was taken out of service in response to a difference between desired and actual capacity, shrinking the capacity from {from} to {}.", change.to),
            );
        }
        let g = group_mut(&mut st, group)?;
        // Out of the group's list: from now on DescribeWarmPool lists them.
        let (to_pool, stay): (Vec<MemInstance>, Vec<MemInstance>) =
            std::mem::take(&mut g.instances)
                .into_iter()
                .partition(|i| i.state.in_warm_pool());
        g.instances = stay;
        g.pool.extend(to_pool);
        st.desired_log.push(change);
        Ok(ended)
    }

    /// The pool ends one of its instances resting there (the pool shrinks, an instance
    /// refresh replaces it): with terminating hooks it waits (after `hook_delay`) in
    /// `Warmed:Terminating:Wait` for every one of them, then is gone
    /// (`Warmed:Terminated`); with none it goes at the next settle. False: no such
    /// instance at rest in a pool.
    pub fn end_pool_instance(&self, instance_id: &str) -> bool {
        let mut st = self.settled();
        let now = Instant::now();
        for g in st.groups.values_mut() {
            let hooks = g.spec.terminating_hooks.clone();
            let Some(inst) = g
                .pool
                .iter_mut()
                .find(|i| i.id == instance_id && is_resting_in_pool(&i.state))
            else {
                continue;
            };
            begin_termination(inst, &hooks, now, self.timing.hook_delay);
            inst.state = match inst.state {
                LifecycleState::TerminatingWait => POOL_ENDING_WAIT,
                _ if inst.waits.is_empty() => POOL_ENDING_WAIT,
                _ => POOL_ENDING,
            };
            return true;
        }
        false
    }

    /// Detaches an instance from its group (DetachInstances): it leaves the group's
    /// instances at once and runs on outside any group; with `decrement` the desired
    /// capacity drops by one, else the group launches a replacement.
    pub fn detach(&self, instance_id: &str, decrement: bool) -> CloudResult<()> {
        let mut st = self.settled();
        let now = Instant::now();
        let (name, g) = group_holding(&mut st, instance_id)?;
        g.instances.retain(|i| i.id != instance_id);
        if decrement {
            lower_by_hand(&mut st, &name);
        }
        st.detached.insert(instance_id.to_string());
        self.reconcile_group(&mut st, &name, now);
        Ok(())
    }

    /// EnterStandby, as AWS does it: the instance stays in the group, outside its
    /// desired capacity, which is lowered by one with `decrement`; without it the ASG
    /// launches a replacement.
    pub fn enter_standby(&self, instance_id: &str, decrement: bool) -> CloudResult<()> {
        let mut st = self.settled();
        let now = Instant::now();
        let (name, g) = group_holding(&mut st, instance_id)?;
        let inst = g
            .instances
            .iter_mut()
            .find(|i| i.id == instance_id)
            .expect("found above");
        if inst.state != LifecycleState::InService {
            return Err(CloudError::Rejected {
                operation: "EnterStandby".into(),
                code: "ValidationError".into(),
                message: format!("The instance {instance_id} is not in InService."),
            });
        }
        inst.state = LifecycleState::Standby;
        inst.since = now;
        if decrement {
            lower_by_hand(&mut st, &name);
        }
        self.reconcile_group(&mut st, &name, now);
        Ok(())
    }

    /// The state as it is now: locked, with what time has done since applied
    /// ([`Self::settle`]).
    fn settled(&self) -> MutexGuard<'_, State> {
        let mut st = self.state.lock();
        self.settle(&mut st);
        st
    }

    /// The state for one AWS call `op`: counted, refused or throttled as the test
    /// asked ([`Self::refuse`], [`Self::throttle`]), else locked and settled.
    fn call(&self, op: &str) -> CloudResult<MutexGuard<'_, State>> {
        let mut st = self.state.lock();
        *st.calls.entry(op.to_string()).or_default() += 1;
        Self::faults(&mut st, op)?;
        self.settle(&mut st);
        Ok(st)
    }

    /// A read of the load balancers (the last mile): counted apart from the Auto
    /// Scaling calls ([`Self::lb_calls`]) and leaving the groups unsettled, so a world
    /// without target groups counts and orders everything else as before.
    fn lb_call(&self, op: &str) -> CloudResult<MutexGuard<'_, State>> {
        let mut st = self.state.lock();
        *st.lb_calls.entry(op.to_string()).or_default() += 1;
        if let Err(e) = Self::faults(&mut st, op) {
            st.lb_log.push((
                Instant::now(),
                LbEvent::Refused {
                    operation: op.to_string(),
                },
            ));
            return Err(e);
        }
        Ok(st)
    }

    /// The refusal or throttle a test asked for `op`, if one is left.
    fn faults(st: &mut State, op: &str) -> CloudResult<()> {
        if let Some((code, n)) = st.refuse_next.get_mut(op) {
            if *n > 0 {
                *n -= 1;
                return Err(CloudError::Rejected {
                    operation: op.to_string(),
                    code: code.clone(),
                    message: format!("{op} refused (memory cloud)"),
                });
            }
        }
        if let Some(n) = st.throttle_next.get_mut(op) {
            if *n > 0 {
                *n -= 1;
                return Err(CloudError::Throttled {
                    operation: op.to_string(),
                    message: "Rate exceeded (memory cloud)".into(),
                });
            }
        }
        Ok(())
    }

    /// Advances every instance to where it should be now.
    fn settle(&self, st: &mut State) {
        let now = Instant::now();
        let names: Vec<String> = st.groups.keys().cloned().collect();
        for name in names {
            let Some(g) = st.groups.get_mut(&name) else {
                continue;
            };
            let mut timed_out = Vec::new();
            let mut log = Vec::new();
            for inst in &mut g.instances {
                match inst.state {
                    LifecycleState::Pending
                        if now.duration_since(inst.since) >= self.timing.launch_delay =>
                    {
                        inst.state = LifecycleState::InService;
                        inst.since = now;
                    }
                    // No heartbeat before a hook's timeout: its default result
                    // applies; with no hook left the instance goes on terminating.
                    LifecycleState::TerminatingWait
                        if inst
                            .waits
                            .iter()
                            .any(|w| w.deadline.is_some_and(|d| now >= d)) =>
                    {
                        expire_waits(inst, now, &mut timed_out, &mut log);
                        if inst.waits.is_empty() {
                            proceed(inst, now, &mut log);
                        }
                    }
                    LifecycleState::Terminating if inst.enters_wait.is_some_and(|at| now >= at) => {
                        enter_wait(inst, LifecycleState::TerminatingWait, now);
                    }
                    LifecycleState::Terminating | LifecycleState::TerminatingProceed
                        if inst.enters_wait.is_none()
                            && now.duration_since(inst.since) >= self.timing.terminate_delay =>
                    {
                        inst.state = LifecycleState::Terminated;
                        inst.since = now;
                        log.push(HookEvent::Terminated {
                            instance: inst.id.clone(),
                        });
                    }
                    _ => {}
                }
            }
            g.instances.retain(|i| {
                !(i.state == LifecycleState::Terminated
                    && now.duration_since(i.since) >= Duration::from_millis(1))
            });
            let pool_state = resting_pool_state(&g.spec);
            for inst in &mut g.pool {
                if inst.enters_wait.is_some_and(|at| now >= at) {
                    let wait = if inst.state == POOL_ENDING {
                        POOL_ENDING_WAIT
                    } else {
                        POOL_BOUND_WAIT
                    };
                    enter_wait(inst, wait, now);
                }
                if !is_hook_wait(&inst.state) {
                    continue;
                }
                let abandon = expire_waits(inst, now, &mut timed_out, &mut log);
                if inst.waits.is_empty() {
                    release_from_pool_wait(inst, &pool_state, abandon, now, &mut log);
                }
            }
            g.pool
                .retain(|i| i.state != LifecycleState::WarmedTerminated);
            st.hook_timeouts.extend(timed_out);
            st.log.extend(log);
            self.reconcile_group(st, &name, now);
        }
    }

    /// Launches instances until the group has `desired` live ones (or records a
    /// failed activity when launches are set to fail).
    fn reconcile_group(&self, st: &mut State, name: &str, now: Instant) {
        let Some(g) = st.groups.get(name) else { return };
        if g.launches_held_until.is_some_and(|t| now < t) {
            return;
        }
        let live = g
            .instances
            .iter()
            .filter(|i| i.state.fills_a_slot())
            .count() as i32;
        let missing = g.desired - live;
        if missing <= 0 {
            return;
        }
        let mut next = st.next_instance;
        let g = st.groups.get_mut(name).expect("group present");
        // A warm pool's prepared instances fill the group first: the same instance
        // (id, zone) leaves the pool and launches into the group.
        let mut missing = missing;
        while missing > 0 {
            let Some(at) = g.pool.iter().position(|i| is_resting_in_pool(&i.state)) else {
                break;
            };
            let mut i = g.pool.remove(at);
            i.state = LifecycleState::Pending;
            i.since = now;
            g.instances.push(i);
            missing -= 1;
        }
        if missing == 0 {
            return;
        }
        if let Some(code) = g.fail_launches.clone() {
            // One failed activity a minute while nothing changes; a rise of desired
            // capacity starts a launch activity of its own at once, which fails too.
            let newest_launch = g.last_launch_unix.unwrap_or(0);
            let already = g.failures.first().is_some_and(|f| {
                now_unix() - f.started_at_unix < 60
                    && f.code == code
                    && f.started_at_unix >= newest_launch
            });
            if !already {
                g.last_launch_unix = Some(g.last_launch_unix.unwrap_or(0).max(now_unix()));
                g.failures.insert(
                    0,
                    LaunchFailure {
                        group: name.to_string(),
                        code: code.clone(),
                        message: format!(
                            "Launching a new EC2 instance. Status Reason: We currently do not have sufficient {} capacity ({code}).",
                            g.spec.instance_type
                        ),
                        started_at_unix: now_unix(),
                    },
                );
            }
            return;
        }
        for _ in 0..missing {
            next += 1;
            let zone = if g.spec.zones.is_empty() {
                "us-east-1a".to_string()
            } else {
                let z = g.spec.zones[g.zone_cursor % g.spec.zones.len()].clone();
                g.zone_cursor += 1;
                z
            };
            g.instances.push(MemInstance {
                id: format!("i-{next:017x}"),
                zone,
                state: LifecycleState::Pending,
                instance_type: g.spec.instance_type.clone(),
                since: now,
                waits: Vec::new(),
                enters_wait: None,
            });
        }
        st.next_instance = next;
    }

    fn snapshot_of(g: &MemAsg) -> AsgSnapshot {
        AsgSnapshot {
            name: g.spec.name.clone(),
            min_size: g.spec.min_size,
            max_size: g.spec.max_size,
            desired_capacity: g.desired,
            availability_zones: g.spec.zones.clone(),
            tags: g.spec.tags.clone(),
            launch: {
                let template = LaunchTemplateRef {
                    id: Some(format!("lt-{}", g.spec.name)),
                    name: Some(g.spec.name.clone()),
                    version: g.spec.launch_template_version.clone(),
                };
                match &g.spec.requirements {
                    Some(r) => LaunchSpec::MixedInstances {
                        template,
                        override_types: Vec::new(),
                        requirements: Some(Box::new(r.clone())),
                    },
                    None => LaunchSpec::LaunchTemplate(template),
                }
            },
            instances: g.instances.iter().map(to_asg_instance).collect(),
            terminating_hooks: Vec::new(),
            warm_pool: g.spec.warm_pool.clone(),
        }
    }
}

/// Starts ending an instance: with hooks it waits (after `hook_delay`) in
/// Terminating:Wait for every one of them, each with its own timeout.
fn begin_termination(
    inst: &mut MemInstance,
    hooks: &[LifecycleHook],
    now: Instant,
    hook_delay: Duration,
) {
    inst.since = now;
    inst.waits = hooks
        .iter()
        .map(|h| Wait {
            hook: h.name.clone(),
            token: next_token(),
            timeout: Duration::from_secs(h.heartbeat_timeout_secs.max(1) as u64),
            deadline: None,
            abandon_by_default: h.default_result.eq_ignore_ascii_case("ABANDON"),
        })
        .collect();
    if inst.waits.is_empty() {
        inst.state = LifecycleState::Terminating;
    } else if hook_delay.is_zero() {
        inst.state = LifecycleState::TerminatingWait;
        for w in &mut inst.waits {
            w.deadline = Some(now + w.timeout);
        }
    } else {
        inst.state = LifecycleState::Terminating;
        inst.enters_wait = Some(now + hook_delay);
    }
}

/// A person's call (EnterStandby, DetachInstances with decrement) lowers the group's
/// desired capacity by one, logged as done from outside.
/// The name and the group whose instances hold `instance_id`; NotFound otherwise.
fn group_holding<'a>(
    st: &'a mut State,
    instance_id: &str,
) -> CloudResult<(String, &'a mut MemAsg)> {
    st.groups
        .iter_mut()
        .find(|(_, g)| g.instances.iter().any(|i| i.id == instance_id))
        .map(|(name, g)| (name.clone(), g))
        .ok_or_else(|| not_found("instance", instance_id))
}

fn lower_by_hand(st: &mut State, group: &str) {
    let Some(g) = st.groups.get_mut(group) else {
        return;
    };
    let from = g.desired;
    g.desired -= 1;
    st.desired_log.push(DesiredChange {
        group: group.to_string(),
        from,
        to: from - 1,
        by: DesiredBy::External,
    });
}

/// Where a scale-in under ReuseOnScaleIn holds an instance for the terminating hooks.
const POOL_BOUND_WAIT: LifecycleState = LifecycleState::WarmedPendingWait;
/// Where the pool ends one of its instances, on its way to the hooks' wait and held
/// there.
const POOL_ENDING: LifecycleState = LifecycleState::WarmedTerminating;
const POOL_ENDING_WAIT: LifecycleState = LifecycleState::WarmedTerminatingWait;

/// Starts returning an instance to the warm pool: with terminating hooks it waits
/// (after `hook_delay`) in `Warmed:Pending:Wait` for every one of them, as AWS holds
/// it there with Origin AutoScalingGroup and Destination WarmPool; with none it goes
/// through `Warmed:Pending` and rests in the pool at the next settle.
fn begin_pool_return(
    inst: &mut MemInstance,
    hooks: &[LifecycleHook],
    now: Instant,
    hook_delay: Duration,
) {
    begin_termination(inst, hooks, now, hook_delay);
    inst.state = match inst.state {
        LifecycleState::TerminatingWait => POOL_BOUND_WAIT,
        _ if inst.waits.is_empty() => POOL_BOUND_WAIT,
        _ => LifecycleState::WarmedPending,
    };
}

/// Held by lifecycle hooks: Terminating:Wait, or one of the pool's waits.
fn is_hook_wait(state: &LifecycleState) -> bool {
    *state == LifecycleState::TerminatingWait
        || state.is_pool_bound_wait()
        || state.is_pool_ending_wait()
}

/// Resting in the pool, ready to leave it for the group: `Warmed:Stopped`,
/// `Warmed:Running` or `Warmed:Hibernated`.
fn is_resting_in_pool(state: &LifecycleState) -> bool {
    matches!(
        state,
        LifecycleState::WarmedStopped
            | LifecycleState::WarmedRunning
            | LifecycleState::WarmedHibernated
    )
}

/// The state the group's pool keeps its instances in (`Warmed:Stopped` by default).
fn resting_pool_state(spec: &MemoryGroup) -> String {
    let state = spec
        .warm_pool
        .as_ref()
        .map(|p| p.pool_state.as_str())
        .unwrap_or("Stopped");
    format!("Warmed:{state}")
}

/// No hook holds a pool instance any more: one on its way into the pool rests
/// there (`Warmed:Stopped`, ...), unless an ABANDON ended it; one the pool was
/// ending is gone (`Warmed:Terminated`, dropped from the pool).
fn release_from_pool_wait(
    inst: &mut MemInstance,
    pool_state: &str,
    abandon: bool,
    now: Instant,
    log: &mut Vec<HookEvent>,
) {
    inst.since = now;
    if inst.state.is_pool_bound_wait() && !abandon {
        inst.state = LifecycleState::parse(pool_state);
        log.push(HookEvent::Proceeded {
            instance: inst.id.clone(),
        });
    } else {
        inst.state = LifecycleState::WarmedTerminated;
        log.push(HookEvent::Terminated {
            instance: inst.id.clone(),
        });
    }
}

/// The instance reaches its hooks' wait (`state`): each hook's timeout runs from now.
fn enter_wait(inst: &mut MemInstance, state: LifecycleState, now: Instant) {
    inst.enters_wait = None;
    inst.state = state;
    for w in &mut inst.waits {
        w.deadline = Some(now + w.timeout);
    }
    inst.since = now;
}

/// The hooks whose timeout passed with no heartbeat or completion: their default
/// result applies (logged as timed out); an ABANDON among them ends the others'
/// actions too. Returns whether one was ABANDON.
fn expire_waits(
    inst: &mut MemInstance,
    now: Instant,
    timed_out: &mut Vec<String>,
    log: &mut Vec<HookEvent>,
) -> bool {
    let (over, left): (Vec<Wait>, Vec<Wait>) = std::mem::take(&mut inst.waits)
        .into_iter()
        .partition(|w| w.deadline.is_some_and(|d| now >= d));
    inst.waits = left;
    let mut abandon = false;
    for w in over {
        timed_out.push(inst.id.clone());
        abandon |= w.abandon_by_default;
        log.push(HookEvent::TimedOut {
            instance: inst.id.clone(),
            hook: w.hook,
        });
    }
    if abandon {
        drop_waits(inst, log);
    }
    abandon
}

/// A fresh LifecycleActionToken (UUID-shaped, as AWS's).
fn next_token() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("{:08x}-0000-4000-8000-{:012x}", n >> 16, n)
}

/// A heartbeat or completion carrying another action's token.
fn wrong_token(action: &LifecycleAction, wait: &Wait, check: bool) -> Option<CloudError> {
    let sent = action.token.as_deref()?;
    (check && sent != wait.token).then(|| CloudError::Rejected {
        operation: "LifecycleAction".into(),
        code: "ValidationError".into(),
        message: format!("No active Lifecycle Action found with token {sent}"),
    })
}

/// ABANDON on termination stops the instance's remaining lifecycle actions (AWS:
/// "ABANDON stops any remaining actions, such as other lifecycle hooks").
fn drop_waits(inst: &mut MemInstance, log: &mut Vec<HookEvent>) {
    for w in inst.waits.drain(..) {
        log.push(HookEvent::Dropped {
            instance: inst.id.clone(),
            hook: w.hook,
        });
    }
}

/// No hook holds the instance any more: on to Terminating:Proceed.
fn proceed(inst: &mut MemInstance, now: Instant, log: &mut Vec<HookEvent>) {
    inst.state = LifecycleState::TerminatingProceed;
    inst.since = now;
    log.push(HookEvent::Proceeded {
        instance: inst.id.clone(),
    });
}

fn to_asg_instance(i: &MemInstance) -> AsgInstance {
    AsgInstance {
        id: i.id.clone(),
        zone: i.zone.clone(),
        state: i.state.clone(),
        instance_type: Some(i.instance_type.clone()),
    }
}

fn not_found(what: &'static str, name: &str) -> CloudError {
    CloudError::NotFound {
        what,
        name: name.to_string(),
    }
}

fn now_unix() -> i64 {
    crate::clock::system_now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

fn matches_selector(g: &MemAsg, sel: &GroupSelector) -> bool {
    if sel.names.iter().any(|n| n == &g.spec.name) {
        return true;
    }
    sel.tag_sets.iter().any(|set| {
        !set.is_empty()
            && set
                .iter()
                .all(|f| match (&f.value, g.spec.tags.get(&f.key)) {
                    (_, None) => false,
                    (None, Some(_)) => true,
                    (Some(want), Some(have)) => want == have,
                })
    })
}

#[async_trait]
impl Cloud for MemoryCloud {
    async fn describe_groups(&self, selector: &GroupSelector) -> CloudResult<Vec<AsgSnapshot>> {
        self.effect(|| -> CloudResult<Vec<AsgSnapshot>> {
            let mut st = self.call("describe_groups")?;
            let stale = Self::stale_view(&mut st);
            Ok(stale
                .as_ref()
                .unwrap_or(&st.groups)
                .values()
                .filter(|g| matches_selector(g, selector))
                // As AWS answers: DescribeAutoScalingGroups carries no lifecycle
                // hooks (DescribeLifecycleHooks does).
                .map(Self::snapshot_of)
                .collect())
        })
        .await
    }

    async fn launch_history(&self, group: &str) -> CloudResult<LaunchHistory> {
        self.effect(|| -> CloudResult<LaunchHistory> {
            let st = self.call("launch_failures")?;
            let g = st
                .groups
                .get(group)
                .ok_or_else(|| not_found("group", group))?;
            Ok(LaunchHistory {
                failures: g.failures.clone(),
                last_launch_unix: g.last_launch_unix,
            })
        })
        .await
    }

    async fn termination_cause(
        &self,
        group: &str,
        instance_id: &str,
    ) -> CloudResult<Option<String>> {
        self.effect(|| -> CloudResult<Option<String>> {
            let st = self.call("termination_cause")?;
            if !st.groups.contains_key(group) {
                return Err(not_found("group", group));
            }
            Ok(st
                .termination_causes
                .get(instance_id)
                .map(|c| super::bounded_cause(c)))
        })
        .await
    }

    async fn locate_instances(&self, ids: &[String]) -> CloudResult<Vec<InstanceLocation>> {
        self.effect(|| -> CloudResult<Vec<InstanceLocation>> {
            let mut st = self.call("locate_instances")?;
            let stale = Self::stale_view(&mut st);
            let mut out = Vec::new();
            for g in stale.as_ref().unwrap_or(&st.groups).values() {
                for i in g.instances.iter().chain(&g.pool) {
                    if ids.contains(&i.id) {
                        out.push(InstanceLocation {
                            instance_id: i.id.clone(),
                            group: g.spec.name.clone(),
                            zone: i.zone.clone(),
                            state: i.state.clone(),
                        });
                    }
                }
            }
            Ok(out)
        })
        .await
    }

    // The load balancers answer at once (no latency, no staleness): a world without
    // target groups sees the same timing with the last mile on or off.
    async fn instance_addresses(&self, instance_id: &str) -> CloudResult<super::InstanceAddresses> {
        self.state.lock().lb_log.push((
            Instant::now(),
            LbEvent::AddressesRead {
                instance: instance_id.to_string(),
            },
        ));
        let _st = self.lb_call("instance_addresses")?;
        Ok(super::InstanceAddresses {
            addresses: Self::address_of(instance_id).into_iter().collect(),
            prefixes: Vec::new(),
        })
    }

    async fn target_groups(&self) -> CloudResult<Vec<super::TargetGroup>> {
        let st = self.lb_call("target_groups")?;
        Ok(st
            .target_groups
            .iter()
            .map(|g| super::TargetGroup {
                arn: g.arn.clone(),
                name: g.name.clone(),
                target_type: g.target_type.clone(),
            })
            .collect())
    }

    async fn target_health(&self, arn: &str) -> CloudResult<Vec<super::TargetHealth>> {
        let now = Instant::now();
        let mut st = self.lb_call("target_health")?;
        let g = st
            .target_groups
            .iter()
            .find(|g| g.arn == arn)
            .ok_or_else(|| not_found("target group", arn))?;
        let out: Vec<super::TargetHealth> = g
            .targets
            .iter()
            .map(|t| super::TargetHealth {
                id: t.id.clone(),
                port: Some(80),
                state: g.state(t, now).to_string(),
            })
            .collect();
        for t in &out {
            let key = (arn.to_string(), t.id.clone());
            if st.lb_answered.get(&key) != Some(&t.state) {
                st.lb_answered.insert(key, t.state.clone());
                st.lb_log.push((
                    Instant::now(),
                    LbEvent::Answered {
                        target_group: arn.to_string(),
                        target: t.id.clone(),
                        state: t.state.clone(),
                    },
                ));
            }
        }
        Ok(out)
    }

    async fn group_target_groups(&self, group: &str) -> CloudResult<Vec<String>> {
        let st = self.lb_call("group_target_groups")?;
        if !st.groups.contains_key(group) {
            return Err(not_found("group", group));
        }
        Ok(st.attached.get(group).cloned().unwrap_or_default())
    }

    async fn deregister_targets(
        &self,
        arn: &str,
        targets: &[super::TargetHealth],
    ) -> CloudResult<()> {
        let mut st = self.lb_call("deregister_targets")?;
        if !st.target_groups.iter().any(|g| g.arn == arn) {
            return Err(not_found("target group", arn));
        }
        for t in targets {
            deregister_in(&mut st, arn, &t.id, true);
        }
        Ok(())
    }

    async fn deregistration_delay(&self, arn: &str) -> CloudResult<Option<String>> {
        let st = self.lb_call("deregistration_delay")?;
        let g = st
            .target_groups
            .iter()
            .find(|g| g.arn == arn)
            .ok_or_else(|| not_found("target group", arn))?;
        Ok(Some(g.delay.clone()))
    }

    async fn ended_instances(&self, ids: &[String]) -> CloudResult<Vec<String>> {
        self.effect(|| -> CloudResult<Vec<String>> {
            let st = self.call("ended_instances")?;
            // EC2 knows every instance of a group and its pool (ending once its
            // hooks let it go) and every detached one; the rest ended.
            let runs = |id: &str| {
                st.detached.contains(id)
                    || st.groups.values().any(|g| {
                        g.instances.iter().chain(&g.pool).any(|i| {
                            i.id == id
                                && !matches!(
                                    i.state,
                                    LifecycleState::TerminatingProceed | LifecycleState::Terminated
                                )
                        })
                    })
            };
            Ok(ids.iter().filter(|id| !runs(id)).cloned().collect())
        })
        .await
    }

    async fn warm_pool_instances(&self, group: &str) -> CloudResult<Vec<AsgInstance>> {
        self.effect(|| -> CloudResult<Vec<AsgInstance>> {
            let mut st = self.call("warm_pool_instances")?;
            let stale = Self::stale_view(&mut st);
            let g = seen_group(&stale, &st.groups, group)?;
            Ok(g.pool.iter().map(to_asg_instance).collect())
        })
        .await
    }

    async fn set_desired_capacity(&self, group: &str, desired: i32) -> CloudResult<()> {
        self.effect(|| -> CloudResult<()> {
            let mut st = self.call("set_desired_capacity")?;
            let g = group_mut(&mut st, group)?;
            if desired < g.spec.min_size || desired > g.spec.max_size {
                return Err(CloudError::Rejected {
                    operation: "SetDesiredCapacity".into(),
                    code: "ValidationError".into(),
                    message: format!(
                    "New SetDesiredCapacity value {desired} is outside the group's bounds [{}, {}]",
                    g.spec.min_size, g.spec.max_size
                ),
                });
            }
            let mut victims = Vec::new();
            if desired > g.desired {
                // The ASG starts launch activities for the new capacity at once.
                g.last_launch_unix = Some(now_unix());
            }
            let lower = desired < g.desired;
            let by = g.desired - desired;
            let change = (desired != g.desired).then(|| DesiredChange {
                group: group.to_string(),
                from: g.desired,
                to: desired,
                by: DesiredBy::SetDesired,
            });
            g.desired = desired;
            if lower {
                // The ASG ends instances itself when desired drops below the instances
                // that fill its slots (never one in Standby).
                let live = g
                    .instances
                    .iter()
                    .filter(|i| i.state.fills_a_slot())
                    .count() as i32;
                let excess = (live - desired).clamp(0, by);
                let hooks = g.spec.terminating_hooks.clone();
                let now = Instant::now();
                let mut n = 0;
                for inst in g.instances.iter_mut().rev() {
                    if n >= excess {
                        break;
                    }
                    if inst.state.fills_a_slot() {
                        begin_termination(inst, &hooks, now, self.timing.hook_delay);
                        victims.push(inst.id.clone());
                        n += 1;
                    }
                }
            }
            st.chosen_by_asg.extend(victims);
            st.desired_log.extend(change);
            let now = Instant::now();
            self.reconcile_group(&mut st, group, now);
            Ok(())
        })
        .await
    }

    async fn terminate_instance(&self, instance_id: &str, decrement: bool) -> CloudResult<()> {
        self.effect(|| -> CloudResult<()> {
            let mut st = self.call("terminate_instance")?;
            let now = Instant::now();
            let group = st
                .groups
                .values()
                .find(|g| g.instances.iter().any(|i| i.id == instance_id))
                .map(|g| g.spec.name.clone())
                .ok_or_else(|| not_found("instance", instance_id))?;
            let g = st.groups.get_mut(&group).expect("group present");
            if decrement && g.desired <= g.spec.min_size {
                return Err(CloudError::Rejected {
                operation: "TerminateInstanceInAutoScalingGroup".into(),
                code: "ValidationError".into(),
                message: format!(
                    "Currently, desiredSize equals minSize ({}). Terminating instance without replacement will violate group's min size constraint.",
                    g.spec.min_size
                ),
            });
            }
            let hooks = g.spec.terminating_hooks.clone();
            let inst = g
                .instances
                .iter_mut()
                .find(|i| i.id == instance_id)
                .expect("instance present");
            if inst.state.is_terminating() {
                return Ok(());
            }
            begin_termination(inst, &hooks, now, self.timing.hook_delay);
            let stamp = crate::clock::utc_now().format("%Y-%m-%dT%H:%M:%SZ");
            let shrinking = if decrement {
                format!(", shrinking the capacity from {} to {}", g.desired, g.desired - 1)
            } else {
                String::new()
            };
            st.termination_causes.insert(
                instance_id.to_string(),
                format!("At {stamp} instance {instance_id} was taken out of service in response to a user request{shrinking}."),
            );
            let g = st.groups.get_mut(&group).expect("group present");
            if decrement {
                g.desired -= 1;
                let change = DesiredChange {
                    group: group.clone(),
                    from: g.desired + 1,
                    to: g.desired,
                    by: DesiredBy::Terminate {
                        instance: instance_id.to_string(),
                    },
                };
                st.desired_log.push(change);
            }
            st.lb_log.push((Instant::now(), LbEvent::EndCall {
                instance: instance_id.to_string(),
                completed: false,
            }));
            self.reconcile_group(&mut st, &group, now);
            Ok(())
        })
        .await
    }

    async fn instance_types(&self, names: &[String]) -> CloudResult<Vec<InstanceTypeInfo>> {
        self.effect(|| -> CloudResult<Vec<InstanceTypeInfo>> {
            let _counted = self.call("instance_types")?;
            Ok(names
                .iter()
                .filter_map(|n| self.instance_types.get(n).cloned())
                .collect())
        })
        .await
    }

    async fn launch_template(&self, template: &LaunchTemplateRef) -> CloudResult<LaunchData> {
        self.effect(|| -> CloudResult<LaunchData> {
            let st = self.call("launch_template")?;
            let name = template.name.clone().unwrap_or_default();
            let g = st
                .groups
                .get(&name)
                .ok_or_else(|| not_found("launch template", &template.to_string()))?;
            Ok(LaunchData {
                instance_type: g
                    .spec
                    .requirements
                    .is_none()
                    .then(|| g.spec.instance_type.clone()),
                user_data: g.spec.user_data.clone(),
                instance_tags: BTreeMap::new(),
                volumes: vec![BlockVolume {
                    device: "/dev/xvda".into(),
                    size_gib: Some(80),
                }],
                image_id: Some("ami-memory".into()),
                requirements: None,
            })
        })
        .await
    }

    async fn launch_configuration(&self, name: &str) -> CloudResult<LaunchData> {
        self.effect(|| -> CloudResult<LaunchData> {
            let _counted = self.call("launch_configuration")?;
            Err(not_found("launch configuration", name))
        })
        .await
    }

    async fn terminating_hooks(&self, group: &str) -> CloudResult<Vec<LifecycleHook>> {
        self.effect(|| -> CloudResult<Vec<LifecycleHook>> {
            let mut st = self.call("terminating_hooks")?;
            let stale = Self::stale_view(&mut st);
            let g = seen_group(&stale, &st.groups, group)?;
            Ok(g.spec.terminating_hooks.clone())
        })
        .await
    }

    async fn put_terminating_hook(&self, group: &str, hook: &LifecycleHook) -> CloudResult<()> {
        self.effect(|| -> CloudResult<()> {
            let mut st = self.call("put_terminating_hook")?;
            let g = group_mut(&mut st, group)?;
            put_hook(&mut g.spec.terminating_hooks, hook.clone());
            Ok(())
        })
        .await
    }

    async fn delete_terminating_hook(&self, group: &str, hook: &str) -> CloudResult<()> {
        self.effect(|| -> CloudResult<()> {
            let mut st = self.call("delete_terminating_hook")?;
            let g = group_mut(&mut st, group)?;
            g.spec.terminating_hooks.retain(|h| h.name != hook);
            // As AWS does: the deleted hook's outstanding actions end with CONTINUE.
            let now = Instant::now();
            let pool_state = resting_pool_state(&g.spec);
            let mut log = Vec::new();
            for inst in g.instances.iter_mut().chain(g.pool.iter_mut()) {
                let before = inst.waits.len();
                inst.waits.retain(|w| w.hook != hook);
                if inst.waits.len() == before {
                    continue;
                }
                log.push(HookEvent::Completed {
                    instance: inst.id.clone(),
                    hook: hook.to_string(),
                    result: LifecycleResult::Continue,
                });
                if !inst.waits.is_empty() {
                    continue;
                }
                if inst.state == LifecycleState::TerminatingWait {
                    proceed(inst, now, &mut log);
                } else if inst.state == LifecycleState::Terminating {
                    inst.enters_wait = None;
                } else if is_hook_wait(&inst.state) {
                    release_from_pool_wait(inst, &pool_state, false, now, &mut log);
                }
            }
            g.pool
                .retain(|i| i.state != LifecycleState::WarmedTerminated);
            st.log.extend(log);
            Ok(())
        })
        .await
    }

    async fn tag_group(&self, group: &str, key: &str, value: &str) -> CloudResult<()> {
        self.effect(|| -> CloudResult<()> {
            let mut st = self.call("tag_group")?;
            let g = group_mut(&mut st, group)?;
            g.spec.tags.insert(key.to_string(), value.to_string());
            Ok(())
        })
        .await
    }

    async fn untag_group(&self, group: &str, key: &str) -> CloudResult<()> {
        self.effect(|| -> CloudResult<()> {
            let mut st = self.call("untag_group")?;
            let g = group_mut(&mut st, group)?;
            g.spec.tags.remove(key);
            Ok(())
        })
        .await
    }

    async fn lifecycle_heartbeat(&self, action: &LifecycleAction) -> CloudResult<()> {
        self.effect(|| -> CloudResult<()> {
            let mut st = self.call("lifecycle_heartbeat")?;
            let check = st.check_tokens;
            let g = st
                .groups
                .get_mut(&action.group)
                .ok_or_else(|| not_found("group", &action.group))?;
            let timeout = g
                .spec
                .terminating_hooks
                .iter()
                .find(|h| h.name == action.hook)
                .map(|h| h.heartbeat_timeout_secs)
                .ok_or_else(|| not_found("lifecycle hook", &action.hook))?;
            let wait = g
                .instances
                .iter_mut()
                .chain(g.pool.iter_mut())
                .find(|i| i.id == action.instance_id && is_hook_wait(&i.state))
                .and_then(|i| i.waits.iter_mut().find(|w| w.hook == action.hook))
                .ok_or_else(|| rejected_no_action(action))?;
            if let Some(e) = wrong_token(action, wait, check) {
                return Err(e);
            }
            let now = Instant::now();
            let left = wait.deadline.map(|d| d.saturating_duration_since(now));
            wait.deadline = Some(now + Duration::from_secs(timeout.max(1) as u64));
            st.heartbeats.push(action.clone());
            if let Some(left) = left {
                st.hook_slack.push((action.instance_id.clone(), left));
            }
            Ok(())
        })
        .await
    }

    async fn complete_lifecycle_action(
        &self,
        action: &LifecycleAction,
        result: LifecycleResult,
    ) -> CloudResult<()> {
        self.effect(|| -> CloudResult<()> {
            let mut st = self.call("complete_lifecycle_action")?;
            let check = st.check_tokens;
            let g = st
                .groups
                .get_mut(&action.group)
                .ok_or_else(|| not_found("group", &action.group))?;
            if !g
                .spec
                .terminating_hooks
                .iter()
                .any(|h| h.name == action.hook)
            {
                return Err(not_found("lifecycle hook", &action.hook));
            }
            let pool_state = resting_pool_state(&g.spec);
            let inst = g
                .instances
                .iter_mut()
                .chain(g.pool.iter_mut())
                .find(|i| {
                    i.id == action.instance_id
                        && is_hook_wait(&i.state)
                        && i.waits.iter().any(|w| w.hook == action.hook)
                })
                .ok_or_else(|| rejected_no_action(action))?;
            let now = Instant::now();
            let at = inst
                .waits
                .iter()
                .position(|w| w.hook == action.hook)
                .expect("checked");
            if let Some(e) = wrong_token(action, &inst.waits[at], check) {
                return Err(e);
            }
            let left = inst
                .waits
                .remove(at)
                .deadline
                .map(|d| d.saturating_duration_since(now));
            let mut log = vec![HookEvent::Completed {
                instance: inst.id.clone(),
                hook: action.hook.clone(),
                result,
            }];
            let abandon = result == LifecycleResult::Abandon;
            if abandon {
                drop_waits(inst, &mut log);
            }
            if inst.waits.is_empty() {
                if inst.state == LifecycleState::TerminatingWait {
                    proceed(inst, now, &mut log);
                } else {
                    release_from_pool_wait(inst, &pool_state, abandon, now, &mut log);
                }
            }
            if let Some(g) = st.groups.get_mut(&action.group) {
                g.pool
                    .retain(|i| i.state != LifecycleState::WarmedTerminated);
            }
            st.log.extend(log);
            st.completed_actions.push((action.clone(), result));
            st.completed_at
                .push((action.instance_id.clone(), Instant::now()));
            st.lb_log.push((
                Instant::now(),
                LbEvent::EndCall {
                    instance: action.instance_id.clone(),
                    completed: true,
                },
            ));
            if let Some(left) = left {
                st.hook_slack.push((action.instance_id.clone(), left));
            }
            Ok(())
        })
        .await
    }

    async fn eks_nodegroup(&self, cluster: &str, nodegroup: &str) -> CloudResult<EksNodegroup> {
        self.effect(|| -> CloudResult<EksNodegroup> {
            let st = self.call("eks_nodegroup")?;
            st.eks
                .get(&(cluster.to_string(), nodegroup.to_string()))
                .cloned()
                .ok_or_else(|| not_found("EKS node group", &format!("{cluster}/{nodegroup}")))
        })
        .await
    }

    async fn instance_types_for_requirements(
        &self,
        requirements: &InstanceRequirements,
        _image_id: Option<&str>,
    ) -> CloudResult<Vec<String>> {
        self.effect(|| -> CloudResult<Vec<String>> {
            let _counted = self.call("instance_types_for_requirements")?;
            let mut fits: Vec<&InstanceTypeInfo> = self
                .instance_types
                .values()
                .filter(|t| t.architecture == "amd64" && requirements.admits(t))
                .collect();
            fits.sort_by_key(|t| (t.vcpus, t.memory_mib, t.name.clone()));
            Ok(fits.into_iter().map(|t| t.name.clone()).collect())
        })
        .await
    }
}

fn rejected_no_action(action: &LifecycleAction) -> CloudError {
    CloudError::Rejected {
        operation: "CompleteLifecycleAction".into(),
        code: "ValidationError".into(),
        message: format!(
            "No active Lifecycle Action found with instance ID {} for hook {} of group {}",
            action.instance_id, action.hook, action.group
        ),
    }
}

/// A few real instance types, with the numbers DescribeInstanceTypes gives.
pub fn builtin_instance_types() -> BTreeMap<String, InstanceTypeInfo> {
    let t = |name: &str, vcpus, mem_gib: i64, arch: &str, enis, ips, gpus, gpu: Option<&str>| {
        (
            name.to_string(),
            InstanceTypeInfo {
                name: name.to_string(),
                vcpus,
                memory_mib: mem_gib * 1024,
                gpus,
                gpu_type: gpu.map(str::to_string),
                // The maker is the model name's first word (`nvidia-tesla-t4`).
                gpu_manufacturer: gpu.and_then(|g| g.split('-').next()).map(|m| match m {
                    "amd" => "AMD".to_string(),
                    other => other.to_ascii_uppercase(),
                }),
                architecture: arch.to_string(),
                max_enis: Some(enis),
                ipv4_per_eni: Some(ips),
                instance_storage_gib: None,
            },
        )
    };
    [
        t("t3.medium", 2, 4, "amd64", 3, 6, 0, None),
        t("m5.large", 2, 8, "amd64", 3, 10, 0, None),
        t("m5.xlarge", 4, 16, "amd64", 4, 15, 0, None),
        t("m5.2xlarge", 8, 32, "amd64", 4, 15, 0, None),
        t("c5.xlarge", 4, 8, "amd64", 4, 15, 0, None),
        t("r5.xlarge", 4, 32, "amd64", 4, 15, 0, None),
        t("m6g.large", 2, 8, "arm64", 3, 10, 0, None),
        t("m6g.xlarge", 4, 16, "arm64", 4, 15, 0, None),
        t(
            "g4dn.xlarge",
            4,
            16,
            "amd64",
            3,
            10,
            1,
            Some("nvidia-tesla-t4"),
        ),
        // AMD Radeon Pro V520: 2 ENIs x 4 IPv4 (aws/karpenter-provider-aws
        // pkg/providers/instancetype/zz_generated.vpclimits.go).
        t(
            "g4ad.xlarge",
            4,
            16,
            "amd64",
            2,
            4,
            1,
            Some("amd-radeon-pro-v520"),
        ),
        t(
            "p3.2xlarge",
            8,
            61,
            "amd64",
            4,
            15,
            1,
            Some("nvidia-tesla-v100"),
        ),
    ]
    .into_iter()
    .collect()
}

#[cfg(test)]
mod tests;

//! Scale-in configuration: the modes, the deadline and DaemonSet policies, and every
//! knob of the drain with its default.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;

use crate::scalein::decide::plan;
use crate::scalein::decide::record::Limits;

/// Which scale-in mode a group uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum ModeChoice {
    /// Lifecycle mode when the ASG has an EC2_INSTANCE_TERMINATING hook, else direct.
    #[default]
    Auto,
    Direct,
}

/// What to do with DaemonSet pods after the workloads are gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum DaemonSetPolicy {
    /// Evict them, gracefully, after every workload pod has exited.
    #[default]
    EvictLast,
    /// Leave them running; they end with the instance.
    Keep,
}

pub use crate::scalein::decide::record::DeadlinePolicy;

/// Scale-in configuration.
#[derive(Debug, Clone)]
pub struct ScaleInSettings {
    pub mode: ModeChoice,
    /// Put an EC2_INSTANCE_TERMINATING hook on groups that lack one.
    pub create_hook: bool,
    pub hook_name: String,
    pub hook_heartbeat_timeout: Duration,
    pub daemonsets: DaemonSetPolicy,
    pub workload_deadline: Duration,
    pub workload_deadline_policy: DeadlinePolicy,
    pub daemonset_deadline: Duration,
    pub daemonset_deadline_policy: DeadlinePolicy,
    pub volume_deadline: Duration,
    /// Wait between evictions a PodDisruptionBudget refused (kubectl uses 5 s).
    pub eviction_retry: Duration,
    pub max_concurrent_drains: usize,
    /// `scaleIn.budgets`, in the order written ([`Self::budgets_in_order`] adds
    /// `maxConcurrentDrains` as one more).
    pub budgets: Vec<crate::scalein::decide::budget::Budget>,
    /// Kubernetes API requests per second across all drains, and the burst.
    pub api_qps: f64,
    pub api_burst: u32,
    /// How often AWS is checked for instances in Terminating:Wait.
    pub lifecycle_poll_interval: Duration,
    /// With more than one replica: drain only on the holder of a Lease.
    pub leader_election: bool,
    pub lease_name: String,
    /// `None`: POD_NAMESPACE, then kube-system.
    pub lease_namespace: Option<String>,
    pub lease_duration: Duration,
    /// A pod still terminating this long after its grace period ended is stuck and
    /// no longer waited for (Karpenter's rule: one minute).
    pub stuck_after: Duration,
    /// `serve --dry-run`: drains are described (Event + log), never run.
    pub dry_run: bool,
    /// DaemonSets that leave after the volume detach, besides critical-priority ones.
    pub node_critical: plan::NodeCritical,
    /// After a budget's 429, retry when its pods change, not only at the fixed
    /// interval. Always on; off only in `loadgen --drain-floor`'s "before" runs.
    pub budget_watch: bool,
    /// From this many drains at once they share one watch of every pod instead of
    /// one watch of its node's pods each (0: never).
    pub shared_pod_watch_from: usize,
    /// How long a drained instance rests in its warm pool, as this replica saw it,
    /// before a read showing it back in the group hands its Node back
    /// ([`WARM_POOL_SETTLED`]; shorter only in tests).
    pub warm_pool_settle: Duration,
    /// How often the leader tells CA which nodes it may not pick for scale-down
    /// while a budget would hold their drain ([`TELL_CA_EVERY`]; shorter only in
    /// tests).
    pub tell_ca_every: Duration,
    /// `scaleIn.loadBalancers`: the last mile before an instance ends.
    pub load_balancers: LoadBalancerWait,
    /// `scaleIn.groupOverrides`, in the order written: the first that selects a
    /// group gives its settings ([`Self::limits_for`]).
    pub group_overrides: Vec<GroupOverride>,
    /// `waitForReplacement`: a drain starts only once its group has its desired
    /// capacity InService ([`crate::scalein::decide::budget::awaits_replacement`]).
    pub wait_for_replacement: bool,
}

/// One of `scaleIn.groupOverrides`: what the groups it selects take instead of the
/// cluster's settings (a field not given: the cluster's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupOverride {
    /// The budgets' selector: group names or group tags (never every group: that
    /// is the cluster's setting itself).
    pub groups: crate::scalein::decide::budget::Groups,
    pub workload_deadline: Option<Duration>,
    pub workload_deadline_policy: Option<DeadlinePolicy>,
    pub wait_for_replacement: Option<bool>,
    /// `loadBalancers.deregister` for these groups ([`ScaleInSettings::deregisters`]).
    pub deregister: Option<bool>,
}

/// `scaleIn.loadBalancers`: before the instance ends, wait until it is out of every
/// ELBv2 target group that has it, each for at most its deregistration delay plus
/// `margin`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoadBalancerWait {
    /// `waitForDeregistration` (default on: a node ending while a load balancer
    /// still sends it connections is what the wait is for).
    pub enabled: bool,
    /// `margin`: added to each group's deregistration delay.
    pub margin: Duration,
    /// How often the target groups are read again while the wait lasts.
    pub poll: Duration,
    /// `deregister` (default off): before the wait, the service deregisters the
    /// instance from the target groups attached to its own Auto Scaling group
    /// ([`crate::scalein::stages::deregister`]). Only with the wait on.
    pub deregister: bool,
}

impl Default for LoadBalancerWait {
    fn default() -> Self {
        Self {
            enabled: true,
            // An NLB is reported to take two to three minutes past the delay's start
            // to stop sending new connections; the margin covers the controller's
            // own reaction to the node's exclusion label besides.
            margin: Duration::from_secs(30),
            poll: Duration::from_secs(10),
            deregister: false,
        }
    }
}

impl ScaleInSettings {
    /// Every budget a drain passes: the configured ones, then `maxConcurrentDrains`
    /// as a budget of that many nodes over every group and cause.
    pub fn budgets_in_order(&self) -> Vec<crate::scalein::decide::budget::Budget> {
        use crate::scalein::decide::budget::{Budget, Groups, Nodes};
        let mut all = self.budgets.clone();
        all.push(Budget {
            name: "maxConcurrentDrains".into(),
            nodes: Nodes::Count(self.max_concurrent_drains.min(u32::MAX as usize) as u32),
            groups: Groups::All,
            zones: Default::default(),
            causes: None,
            window: None,
            rate: None,
        });
        all
    }

    /// The cluster's workload deadline and its policy: what a drain plans with when
    /// neither its record ([`crate::scalein::decide::record::DrainRecord::limits`])
    /// nor its group says otherwise.
    pub fn limits(&self) -> Limits {
        Limits {
            workload_deadline: self.workload_deadline,
            workload_policy: self.workload_deadline_policy,
            hook_room: None,
        }
    }

    /// The override that gives `group` its settings: the first that selects it.
    pub fn override_for(
        &self,
        group: &str,
        tags: &BTreeMap<String, String>,
    ) -> Option<&GroupOverride> {
        self.group_overrides
            .iter()
            .find(|o| o.groups.selects(group, tags))
    }

    /// What a drain of an instance of `group` (with its `tags`) begins with: the
    /// group's override, else the cluster's; for a drain our hook holds (its
    /// heartbeat timeout as AWS has it), the room the hook's global timeout leaves
    /// the workloads ([`Self::hook_room`]).
    pub fn limits_for(
        &self,
        group: &str,
        tags: &BTreeMap<String, String>,
        hook_heartbeat: Option<Duration>,
    ) -> Limits {
        let o = self.override_for(group, tags);
        Limits {
            workload_deadline: o
                .and_then(|o| o.workload_deadline)
                .unwrap_or(self.workload_deadline),
            workload_policy: o
                .and_then(|o| o.workload_deadline_policy)
                .unwrap_or(self.workload_deadline_policy),
            hook_room: hook_heartbeat.map(|h| self.hook_room(h)),
        }
    }

    /// Whether the last mile deregisters an instance of `group` (with its `tags`) from
    /// the target groups attached to it before the wait: the group's override, else
    /// the cluster's `loadBalancers.deregister`; never while the wait is off.
    pub fn deregisters(&self, group: &str, tags: &BTreeMap<String, String>) -> bool {
        self.load_balancers.enabled
            && self
                .override_for(group, tags)
                .and_then(|o| o.deregister)
                .unwrap_or(self.load_balancers.deregister)
    }

    /// check-config's lines on deadlines: the cluster's, each group override, and
    /// whether each fits inside the global timeout of the hook this service
    /// creates (a hook that exists with another heartbeat timeout is measured when
    /// its drain starts, and said in a `DeadlineCutByHook` Event).
    pub fn deadlines_said(&self) -> Vec<String> {
        use crate::duration::format_duration as said;
        let room = self.hook_room(self.hook_heartbeat_timeout);
        let fits = |d: Duration| {
            if d <= room {
                String::new()
            } else {
                format!(
                    "; in a drain our hook holds the workloads get {} (the hook's global timeout less the DaemonSet and volume phases and a margin)",
                    said(room)
                )
            }
        };
        let mut lines = vec![format!(
            "workload deadline: {}, then {}{}",
            said(self.workload_deadline),
            self.workload_deadline_policy.as_str(),
            fits(self.workload_deadline)
        )];
        for o in &self.group_overrides {
            let d = o.workload_deadline.unwrap_or(self.workload_deadline);
            let deregister = match o.deregister {
                Some(true) => "; deregistered from its attached target groups before the end",
                Some(false) => "; not deregistered from its target groups by this service",
                None => "",
            };
            lines.push(format!(
                "group override:    {}: workload deadline {}, then {}{}{deregister}",
                o.groups.said(),
                said(d),
                o.workload_deadline_policy
                    .unwrap_or(self.workload_deadline_policy)
                    .as_str(),
                fits(d)
            ));
        }
        lines.push(format!(
            "hook timeout:      our hook's heartbeat timeout {} holds an instance at most {} (100 heartbeat timeouts, at most 48h); drains it holds proceed at their deadline",
            said(self.hook_heartbeat_timeout),
            said(crate::scalein::decide::budget::hook_global(
                self.hook_heartbeat_timeout
            )),
        ));
        lines
    }

    /// Whether drains of `group` wait for its replacement instances
    /// (`waitForReplacement`, the group's override else the cluster's).
    pub fn waits_for_replacement(&self, group: &str, tags: &BTreeMap<String, String>) -> bool {
        self.override_for(group, tags)
            .and_then(|o| o.wait_for_replacement)
            .unwrap_or(self.wait_for_replacement)
    }

    /// What a drain takes after its workloads: the DaemonSet and volume phases.
    pub fn after_workloads(&self) -> Duration {
        self.daemonset_deadline + self.volume_deadline
    }

    /// How early a drain our hook holds plans its end: the hold's start is known to
    /// within the lifecycle poll, and a minute is left for the end's own calls.
    pub fn hook_margin(&self) -> Duration {
        self.lifecycle_poll_interval + Duration::from_secs(60)
    }

    /// For a hook whose heartbeat timeout is `heartbeat`: the longest the workloads
    /// of a drain it holds may take from the hold's start.
    pub fn hook_room(&self, heartbeat: Duration) -> Duration {
        crate::scalein::decide::budget::hook_room(
            heartbeat,
            self.after_workloads(),
            self.hook_margin(),
        )
    }
}

impl Default for ScaleInSettings {
    fn default() -> Self {
        Self {
            mode: ModeChoice::Auto,
            create_hook: false,
            hook_name: "ca-asg-provider-drain".into(),
            hook_heartbeat_timeout: Duration::from_secs(300),
            daemonsets: DaemonSetPolicy::EvictLast,
            workload_deadline: Duration::from_secs(10 * 60),
            workload_deadline_policy: DeadlinePolicy::Abandon,
            daemonset_deadline: Duration::from_secs(2 * 60),
            daemonset_deadline_policy: DeadlinePolicy::Proceed,
            volume_deadline: Duration::from_secs(2 * 60),
            eviction_retry: Duration::from_secs(5),
            max_concurrent_drains: 50,
            budgets: Vec::new(),
            api_qps: 50.0,
            api_burst: 100,
            // 200 hooked groups cost 24 DescribeAutoScalingGroups a minute at 5 s
            // (one per 100 groups per scan; tests/interruption.rs counts it): on the
            // account's one shared Auto Scaling bucket, whose size AWS does not publish,
            // about what CA's in-tree provider spends re-reading its groups. A held
            // instance is found 2.5 s after it is held on average instead of 7.5 s.
            lifecycle_poll_interval: Duration::from_secs(5),
            leader_election: false,
            lease_name: "ca-asg-provider".into(),
            lease_namespace: None,
            lease_duration: Duration::from_secs(15),
            stuck_after: Duration::from_secs(60),
            dry_run: false,
            node_critical: plan::NodeCritical::default(),
            budget_watch: true,
            // A lone drain's own watch is two requests the API server answers from
            // its index by node; the shared one lists every pod and keeps them. Ten
            // drains at once save twenty requests for that list: a storm, not an
            // everyday scale-in of a few nodes.
            shared_pod_watch_from: 10,
            warm_pool_settle: WARM_POOL_SETTLED,
            tell_ca_every: TELL_CA_EVERY,
            load_balancers: LoadBalancerWait::default(),
            group_overrides: Vec::new(),
            wait_for_replacement: false,
        }
    }
}

/// How long after our hook's hold on the way into the pool arrived a read showing
/// the instance in the group again hands its Node back. AWS's reads lag by seconds: a
/// read that much later cannot be one from before the scale-in that sent it to the
/// pool.
pub const WARM_POOL_SETTLED: Duration = Duration::from_secs(30);

/// Between two passes that tell CA which nodes a budget holds from its scale-down
/// (besides a pass when a drain's slot goes back): a window that opens or closes
/// is said within this long, about CA's own loop (`--scan-interval`, 10 s).
pub const TELL_CA_EVERY: Duration = Duration::from_secs(10);

/// Queue-mode configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct InterruptionSettings {
    /// The SQS queue; `None` turns queue mode off.
    pub queue_url: Option<String>,
    pub rebalance: crate::scalein::decide::notice::RebalanceAction,
    /// Also act on instances of groups this service does not manage.
    pub unmanaged: bool,
    /// Messages per receive (SQS allows 1 to 10).
    pub batch: i32,
    /// Messages handled at once.
    pub concurrency: usize,
    /// Long-poll wait per receive (at most 20 s).
    pub wait: Duration,
    /// Of a spot interruption's two minutes (or a scheduled change's time), what the
    /// DaemonSet pods get at the end.
    pub daemonset_share: Duration,
    /// A message received this often without being handled is dropped.
    pub max_receives: u32,
    /// With the queue on, the lifecycle poll is only a safety net this slow.
    pub safety_net_poll: Duration,
}

impl Default for InterruptionSettings {
    fn default() -> Self {
        Self {
            queue_url: None,
            rebalance: crate::scalein::decide::notice::RebalanceAction::Cordon,
            unmanaged: false,
            batch: 10,
            concurrency: 10,
            wait: Duration::from_secs(20),
            daemonset_share: Duration::from_secs(20),
            max_receives: 5,
            safety_net_poll: Duration::from_secs(300),
        }
    }
}

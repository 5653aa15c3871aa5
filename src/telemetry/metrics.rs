//! Prometheus metrics, in one place. Names follow Prometheus conventions
//! (`ca_asg_provider_` prefix, base units, `_total` for counters); the process metrics
//! carry the standard unprefixed `process_*` names.

use std::sync::atomic::AtomicU64;
use std::sync::OnceLock;
use std::time::Instant;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GroupAnswerLabels {
    pub node_group: String,
    pub answer: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RpcLabels {
    pub method: &'static str,
    pub code: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MethodLabels {
    pub method: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TemplateFailureLabels {
    pub node_group: String,
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TemplatePartLabels {
    pub node_group: String,
    pub part: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AwsLabels {
    pub operation: String,
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OperationLabels {
    pub operation: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    pub kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindOutcomeLabels {
    pub kind: &'static str,
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ActionLabels {
    pub action: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SourceLabels {
    pub source: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SourceOutcomeLabels {
    pub source: &'static str,
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BudgetLabels {
    pub budget: String,
}

/// One target group an instance about to end was waited out of, and how it ended.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TargetGroupLabels {
    pub target_group: String,
    /// `left`, `bound`, `unreadable` or `hook`.
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StageLabels {
    pub stage: String,
}

/// Named like cluster-autoscaler's own per-group metrics, so the two join.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GroupLabels {
    pub node_group: String,
}

/// A group's warm pool instances in one lifecycle state.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolStateLabels {
    pub node_group: String,
    pub state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BuildLabels {
    pub version: String,
    pub revision: String,
}

pub struct Metrics {
    pub registry: Registry,
    pub grpc_requests: Family<RpcLabels, Counter>,
    pub grpc_duration: Family<MethodLabels, Histogram>,
    pub aws_calls: Family<AwsLabels, Counter>,
    pub refreshes: Family<OutcomeLabels, Counter>,
    pub node_groups: Gauge,
    pub group_min: Family<GroupLabels, Gauge>,
    pub group_max: Family<GroupLabels, Gauge>,
    pub group_target: Family<GroupLabels, Gauge>,
    pub group_instances: Family<GroupLabels, Gauge>,
    pub group_failed_below_min: Family<GroupLabels, Gauge>,
    pub group_option_tags_unusable: Family<GroupLabels, Gauge>,
    pub options_without_startup_time: Family<GroupAnswerLabels, Counter>,
    pub drains_started: Counter,
    pub drains_finished: Family<OutcomeLabels, Counter>,
    pub drains_in_stage: Family<StageLabels, Gauge>,
    /// Drains cordoned and waiting because of a disruption budget, by budget.
    pub drains_waiting_for_budget: Family<BudgetLabels, Gauge>,
    /// Drains a budget may still start now (its nodes less the drains it counts),
    /// by budget, as the last drain to look saw it.
    pub budget_room: Family<BudgetLabels, Gauge>,
    /// Nodes kept out of CA's scale-down now because this budget would hold their
    /// drain, by budget, as the leader's last pass decided.
    pub nodes_held_from_ca: Family<BudgetLabels, Gauge>,
    /// Drains our hook holds started past a budget, to finish inside the hook's
    /// global timeout, by budget.
    pub drains_forced_past_budget: Family<BudgetLabels, Counter>,
    pub stage_duration: Family<StageLabels, Histogram>,
    /// A drain's pods leaving (from its slot to its pods gone, or its give-up), by
    /// who asked and how it ended.
    pub drain_duration: Family<SourceOutcomeLabels, Histogram>,
    /// From a drain's start (its reason's arrival, as the Node records it) to our
    /// call that ends the instance, by who asked.
    pub drain_start_to_end: Family<SourceLabels, Histogram>,
    /// Drains that met a PodDisruptionBudget that can never allow their evictions,
    /// named at their start, by why.
    pub eviction_deadlocks: Family<KindLabels, Counter>,
    pub evictions: Family<OutcomeLabels, Counter>,
    pub deadlines: Family<StageLabels, Counter>,
    pub heartbeats: Family<OutcomeLabels, Counter>,
    pub warm_pool_returns: Family<OutcomeLabels, Counter>,
    pub warm_pool_registered: Family<GroupLabels, Counter>,
    pub warm_pool_instances: Family<PoolStateLabels, Gauge>,
    pub leader: Gauge,
    pub drains_without_node: Counter,
    pub lifecycle_waiting: Gauge,
    pub daemonset_pods_evicted_early: Counter,
    pub template_failures: Family<TemplateFailureLabels, Counter>,
    pub template_incomplete: Family<TemplatePartLabels, Gauge>,
    pub build_info: Family<BuildLabels, Gauge>,
    pub tls_reloads: Family<OutcomeLabels, Counter>,
    pub dry_run_actions: Family<ActionLabels, Counter>,
    pub queue_messages: Family<KindLabels, Counter>,
    pub queue_handled: Family<KindOutcomeLabels, Counter>,
    pub queue_dropped: Family<ReasonLabels, Counter>,
    pub notice_to_drain: Family<KindLabels, Histogram>,
    pub notice_to_end: Family<KindLabels, Histogram>,
    /// The last mile: how long an instance was waited out of each target group.
    pub load_balancer_wait: Family<TargetGroupLabels, Histogram>,
    pub interruption_budget_missed: Counter,
    pub pod_events_dropped: Counter,
    pub stale_reads: Counter,
    pub aws_duration: Family<OperationLabels, Histogram>,
    pub last_refresh_ok: Gauge<f64, AtomicU64>,
    pub process_rss: Gauge,
    pub process_cpu: Counter<f64, AtomicU64>,
    pub process_fds: Gauge,
    pub process_threads: Gauge,
}

fn rpc_histogram() -> Histogram {
    // 10 us .. ~16 s: past CA's 5 s call timeout, so a call CA gave up on shows.
    Histogram::new(exponential_buckets(0.00001, 3.0, 14))
}

fn aws_histogram() -> Histogram {
    // 5 ms .. ~80 s: an SDK call with its retries and backoff.
    Histogram::new(exponential_buckets(0.005, 2.0, 15))
}

/// Buckets for the time from an interruption notice: dense around a spot warning's
/// 120 s (the budget's edge), then out to a retirement's hours.
/// A deregistration delay is 0 to 3600 s, 300 s by default.
fn load_balancer_histogram() -> Histogram {
    Histogram::new([
        1.0, 5.0, 10.0, 30.0, 60.0, 120.0, 180.0, 300.0, 360.0, 600.0, 1200.0, 3600.0,
    ])
}

fn notice_histogram() -> Histogram {
    Histogram::new([
        1.0,
        2.0,
        5.0,
        10.0,
        20.0,
        30.0,
        45.0,
        60.0,
        75.0,
        90.0,
        100.0,
        110.0,
        120.0,
        150.0,
        180.0,
        300.0,
        600.0,
        1800.0,
        3600.0,
        4.0 * 3600.0,
    ])
}

fn stage_histogram() -> Histogram {
    // 100 ms .. ~1.8 h
    Histogram::new(exponential_buckets(0.1, 3.0, 11))
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A registry of its own; the process uses [`metrics`], tests may count apart.
    pub fn new() -> Self {
        // The process metrics carry the standard unprefixed names (process_*, as every
        // Prometheus client library exports them), so that stock dashboards and alerts
        // read them; everything else is under ca_asg_provider_.
        let mut root = Registry::default();
        let m = Self {
            grpc_requests: Family::default(),
            grpc_duration: Family::new_with_constructor(rpc_histogram as fn() -> Histogram),
            aws_calls: Family::default(),
            refreshes: Family::default(),
            node_groups: Gauge::default(),
            group_min: Family::default(),
            group_max: Family::default(),
            group_target: Family::default(),
            group_instances: Family::default(),
            group_failed_below_min: Family::default(),
            group_option_tags_unusable: Family::default(),
            options_without_startup_time: Family::default(),
            drains_started: Counter::default(),
            drains_finished: Family::default(),
            drains_in_stage: Family::default(),
            drains_waiting_for_budget: Family::default(),
            budget_room: Family::default(),
            nodes_held_from_ca: Family::default(),
            drains_forced_past_budget: Family::default(),
            stage_duration: Family::new_with_constructor(stage_histogram as fn() -> Histogram),
            drain_duration: Family::new_with_constructor(stage_histogram as fn() -> Histogram),
            drain_start_to_end: Family::new_with_constructor(stage_histogram as fn() -> Histogram),
            eviction_deadlocks: Family::default(),
            evictions: Family::default(),
            deadlines: Family::default(),
            heartbeats: Family::default(),
            warm_pool_returns: Family::default(),
            warm_pool_registered: Family::default(),
            warm_pool_instances: Family::default(),
            leader: Gauge::default(),
            drains_without_node: Counter::default(),
            lifecycle_waiting: Gauge::default(),
            daemonset_pods_evicted_early: Counter::default(),
            template_failures: Family::default(),
            template_incomplete: Family::default(),
            build_info: Family::default(),
            tls_reloads: Family::default(),
            dry_run_actions: Family::default(),
            queue_messages: Family::default(),
            queue_handled: Family::default(),
            queue_dropped: Family::default(),
            notice_to_drain: Family::new_with_constructor(notice_histogram as fn() -> Histogram),
            notice_to_end: Family::new_with_constructor(notice_histogram as fn() -> Histogram),
            load_balancer_wait: Family::new_with_constructor(
                load_balancer_histogram as fn() -> Histogram,
            ),
            interruption_budget_missed: Counter::default(),
            pod_events_dropped: Counter::default(),
            stale_reads: Counter::default(),
            aws_duration: Family::new_with_constructor(aws_histogram as fn() -> Histogram),
            last_refresh_ok: Gauge::default(),
            process_rss: Gauge::default(),
            process_cpu: Counter::default(),
            process_fds: Gauge::default(),
            process_threads: Gauge::default(),
            registry: Registry::default(),
        };
        root.register(
            "process_resident_memory_bytes",
            "Resident memory of this process (compare with the container's memory limit)",
            m.process_rss.clone(),
        );
        root.register(
            "process_cpu_seconds",
            "User and system CPU time of this process",
            m.process_cpu.clone(),
        );
        root.register(
            "process_open_fds",
            "Open file descriptors of this process (connections from CA included)",
            m.process_fds.clone(),
        );
        root.register(
            "process_threads",
            "Threads of this process",
            m.process_threads.clone(),
        );
        let r = root.sub_registry_with_prefix("ca_asg_provider");
        r.register(
            "grpc_requests",
            "gRPC requests by method and status code",
            m.grpc_requests.clone(),
        );
        r.register(
            "grpc_request_duration_seconds",
            "gRPC handling time by method",
            m.grpc_duration.clone(),
        );
        r.register(
            "aws_calls",
            "AWS API calls by operation and outcome (ok, throttled, error, not_found, credentials)",
            m.aws_calls.clone(),
        );
        r.register(
            "refreshes",
            "Node-group refreshes by outcome (ok, failed, stale_served)",
            m.refreshes.clone(),
        );
        r.register("node_groups", "Managed node groups", m.node_groups.clone());
        r.register(
            "node_group_min_size",
            "Node group minimum size",
            m.group_min.clone(),
        );
        r.register(
            "node_group_max_size",
            "Node group maximum size",
            m.group_max.clone(),
        );
        r.register(
            "node_group_target_size",
            "Node group target size as reported to CA",
            m.group_target.clone(),
        );
        r.register(
            "node_group_instances",
            "Instances registered in the node group's ASG",
            m.group_instances.clone(),
        );
        r.register(
            "node_group_failed_below_min",
            "Instances that keep the node group at its ASG MinSize and recently failed to launch; CA sees them as unregistered nodes and only warns \"min size reached\", so alert on this",
            m.group_failed_below_min.clone(),
        );
        r.register(
            "node_group_option_tags_unusable",
            "autoscaling-options tags of the node group that cannot be used (unknown option, unreadable value, or an option no CA carries over externalgrpc); the rest of the group's options are still answered, and check-config names each tag",
            m.group_option_tags_unusable.clone(),
        );
        r.register(
            "options_without_startup_time",
            "NodeGroupGetOptions calls for option-tagged groups from a CA >= 1.35 (no MaxNodeStartupTime on the wire, kubernetes/autoscaler#10245), by node group and answer (unimplemented: CA keeps its defaults; answer: the tags apply and MaxNodeStartupTime reads as 0)",
            m.options_without_startup_time.clone(),
        );
        r.register("drains_started", "Drains started", m.drains_started.clone());
        r.register(
            "drains_finished",
            "Drains finished by outcome (ended, drained, abandoned, failed)",
            m.drains_finished.clone(),
        );
        r.register(
            "drains_in_progress",
            "Drains in progress by stage",
            m.drains_in_stage.clone(),
        );
        r.register(
            "drains_waiting_for_budget",
            "Drains cordoned and waiting for a disruption budget, by budget",
            m.drains_waiting_for_budget.clone(),
        );
        r.register(
            "budget_room",
            "Drains a disruption budget may still start now, by budget (as last looked at)",
            m.budget_room.clone(),
        );
        r.register(
            "nodes_held_from_ca",
            "Nodes kept out of cluster-autoscaler's scale-down because this disruption budget would hold their drain, by budget",
            m.nodes_held_from_ca.clone(),
        );
        r.register(
            "drains_forced_past_budget",
            "Drains our lifecycle hook holds, started past a disruption budget to finish inside the hook's global timeout, by budget",
            m.drains_forced_past_budget.clone(),
        );
        r.register(
            "drain_stage_duration_seconds",
            "Time spent per drain stage",
            m.stage_duration.clone(),
        );
        r.register(
            "drain_duration_seconds",
            "A drain's pods leaving, from its slot to its pods gone (or its give-up), by source and outcome",
            m.drain_duration.clone(),
        );
        r.register(
            "drain_start_to_end_seconds",
            "From a drain's start (its reason's arrival on the Node) to the call that ends the instance, by source",
            m.drain_start_to_end.clone(),
        );
        r.register(
            "eviction_deadlocks",
            "Drains that met a PodDisruptionBudget that can never allow their evictions, named at their start, by why",
            m.eviction_deadlocks.clone(),
        );
        r.register(
            "evictions",
            "Eviction requests by outcome (ok, pdb_blocked, error)",
            m.evictions.clone(),
        );
        r.register(
            "drain_deadlines_hit",
            "Drain deadlines that passed, by stage",
            m.deadlines.clone(),
        );
        r.register(
            "tls_reloads",
            "TLS certificate/key/client CA reloads after the files changed, by outcome (ok, error: the new files did not load and the previous certificate is still served)",
            m.tls_reloads.clone(),
        );
        r.register(
            "lifecycle_heartbeats",
            "Lifecycle hook heartbeats by outcome (ok, error, stopped)",
            m.heartbeats.clone(),
        );
        r.register(
            "warm_pool_returns",
            "Drained nodes whose instance went back to its group's warm pool, by step (in_pool: seen resting in the pool; handed_back: left the pool for the group, cordon and marks taken off; error: the Node could not be written, retried next poll)",
            m.warm_pool_returns.clone(),
        );
        r.register(
            "warm_pool_instances",
            "Instances in each hooked group's warm pool by lifecycle state (Warmed:Pending:Wait, Warmed:Stopped, ...), as the lifecycle scan last read them (DescribeWarmPool)",
            m.warm_pool_instances.clone(),
        );
        r.register(
            "warm_pool_registered_while_warming",
            "Instances found in a group's warm pool with a Node this service never drained: their bootstrap joined the cluster while warming (the Node goes NotReady when the instance stops in the pool)",
            m.warm_pool_registered.clone(),
        );
        r.register(
            "leader",
            "1 while this replica runs the drain loop (holds the Lease, or no leader election)",
            m.leader.clone(),
        );
        r.register(
            "drains_without_node",
            "Instances ended without a drain because the API server said no Node is theirs",
            m.drains_without_node.clone(),
        );
        r.register(
            "lifecycle_instances_waiting",
            "Instances held in Terminating:Wait by our hook that are being heartbeated",
            m.lifecycle_waiting.clone(),
        );
        r.register(
            "daemonset_pods_evicted_early",
            "DaemonSet pods found terminating when a drain CA asked for began (CA evicted them itself)",
            m.daemonset_pods_evicted_early.clone(),
        );
        r.register(
            "template_failures",
            "Template nodes that could not be built, by node group and reason (aws_error, cannot_build): the group cannot scale up from zero",
            m.template_failures.clone(),
        );
        r.register(
            "node_group_template_incomplete",
            "1 when a node group's template node is built from missing, expired or partly unusable data, by part (eks_nodegroup, launch_data, instance_type, user_data, tags): check-config and the log say what",
            m.template_incomplete.clone(),
        );
        r.register(
            "queue_messages",
            "Interruption queue messages received, by kind (spot_interruption, rebalance_recommendation, scheduled_change, state_change, lifecycle_terminate, other)",
            m.queue_messages.clone(),
        );
        r.register(
            "queue_messages_handled",
            "Interruption queue messages handled and deleted, by kind and outcome (drain, lifecycle_drain, cordon, stopped, duplicate, unmanaged, ignored)",
            m.queue_handled.clone(),
        );
        r.register(
            "queue_messages_dropped",
            "Interruption queue messages deleted without being handled, by reason (malformed, gave_up after too many receives)",
            m.queue_dropped.clone(),
        );
        r.register(
            "notice_to_drain_seconds",
            "Time from the event AWS sent to the drain it started, by kind",
            m.notice_to_drain.clone(),
        );
        r.register(
            "notice_to_drained_seconds",
            "Time from the event AWS sent to the end of its drain (node drained, or lifecycle action completed), by kind",
            m.notice_to_end.clone(),
        );
        r.register(
            "load_balancer_wait_seconds",
            "Time an instance about to end was waited out of one ELBv2 target group, by target group and outcome (left, bound, unreadable, hook)",
            m.load_balancer_wait.clone(),
        );
        r.register(
            "interruption_budget_missed",
            "Interruption drains (spot, scheduled change) still running when AWS ends the instance",
            m.interruption_budget_missed.clone(),
        );
        r.register(
            "stale_group_reads",
            "Node groups read again because AWS answered with a desired capacity from before this service's own write (eventual consistency)",
            m.stale_reads.clone(),
        );
        r.register(
            "pod_events_dropped",
            "Per-pod Evicted Events not published because their queue was full (a drain storm); the log line was written",
            m.pod_events_dropped.clone(),
        );
        r.register(
            "dry_run_actions",
            "What serve --dry-run decided but did not do, by action (IncreaseSize, DecreaseTargetSize, DeleteNodes, drain, CreateLifecycleHook, and any AWS write the guard refused)",
            m.dry_run_actions.clone(),
        );
        r.register(
            "aws_call_duration_seconds",
            "Time of each AWS call by operation, the SDK's retries included",
            m.aws_duration.clone(),
        );
        r.register(
            "last_successful_refresh_timestamp_seconds",
            "Unix time of the last node-group refresh that read AWS successfully",
            m.last_refresh_ok.clone(),
        );
        r.register(
            "build_info",
            "1, labelled with the running version and the source revision it was built from",
            m.build_info.clone(),
        );
        m.build_info
            .get_or_create(&BuildLabels {
                version: env!("CARGO_PKG_VERSION").to_string(),
                revision: super::REVISION.to_string(),
            })
            .set(1);
        Self {
            registry: root,
            ..m
        }
    }

    pub fn encode(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }

    /// Counts and times one RPC. Allocation-free: it runs on every hot call.
    pub fn rpc(&self, method: &'static str, code: tonic::Code, started: Instant) {
        self.grpc_requests
            .get_or_create(&RpcLabels {
                method,
                code: code_name(code),
            })
            .inc();
        self.grpc_duration
            .get_or_create(&MethodLabels { method })
            .observe(started.elapsed().as_secs_f64());
    }

    pub fn aws(&self, operation: &str, outcome: &str) {
        self.aws_calls
            .get_or_create(&AwsLabels {
                operation: operation.to_string(),
                outcome: outcome.to_string(),
            })
            .inc();
    }

    /// Times one AWS call.
    pub fn aws_duration(&self, operation: &'static str, took: std::time::Duration) {
        self.aws_duration
            .get_or_create(&OperationLabels { operation })
            .observe(took.as_secs_f64());
    }

    /// A refresh read AWS successfully now.
    pub fn refreshed(&self) {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or_default();
        self.last_refresh_ok.set(now);
    }

    /// Reads this process's memory, CPU, descriptors and threads from /proc (Linux;
    /// elsewhere the gauges stay 0). Called before each scrape.
    pub fn update_process(&self) {
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let field = |name: &str| -> Option<i64> {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse().ok())
        };
        if let Some(kb) = field("VmRSS:") {
            self.process_rss.set(kb * 1024);
        }
        if let Some(t) = field("Threads:") {
            self.process_threads.set(t);
        }
        if let Ok(fds) = std::fs::read_dir("/proc/self/fd") {
            self.process_fds.set(fds.count() as i64);
        }
        // utime and stime, fields 14 and 15 of /proc/self/stat, in USER_HZ (100 per
        // second on Linux whatever the kernel's own tick).
        let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
        let after_comm = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
        let f: Vec<&str> = after_comm.split_whitespace().collect();
        if let (Some(u), Some(s)) = (
            f.get(11).and_then(|v| v.parse::<f64>().ok()),
            f.get(12).and_then(|v| v.parse::<f64>().ok()),
        ) {
            let total = (u + s) / 100.0;
            let seen = self.process_cpu.get();
            if total > seen {
                self.process_cpu.inc_by(total - seen);
            }
        }
    }

    /// One action `serve --dry-run` decided on and did not take.
    pub fn options_without_startup_time(&self, group: &str, answer: &'static str) {
        self.options_without_startup_time
            .get_or_create(&GroupAnswerLabels {
                node_group: group.to_string(),
                answer,
            })
            .inc();
    }

    pub fn dry_run(&self, action: &str) {
        self.dry_run_actions
            .get_or_create(&ActionLabels {
                action: action.to_string(),
            })
            .inc();
    }

    pub fn tls_reloads(&self, outcome: &str) {
        Self::outcome(&self.tls_reloads, outcome);
    }

    pub fn outcome(family: &Family<OutcomeLabels, Counter>, outcome: &str) {
        family
            .get_or_create(&OutcomeLabels {
                outcome: outcome.to_string(),
            })
            .inc();
    }

    pub fn stage(&self, stage: &str) -> StageTimer<'_> {
        let labels = StageLabels {
            stage: stage.to_string(),
        };
        self.drains_in_stage.get_or_create(&labels).inc();
        StageTimer {
            metrics: self,
            labels,
            started: Instant::now(),
        }
    }
}

/// The gRPC status code's name, as in the protocol (`Ok`, `InvalidArgument`, ...).
pub fn code_name(code: tonic::Code) -> &'static str {
    use tonic::Code::*;
    match code {
        Ok => "Ok",
        Cancelled => "Cancelled",
        Unknown => "Unknown",
        InvalidArgument => "InvalidArgument",
        DeadlineExceeded => "DeadlineExceeded",
        NotFound => "NotFound",
        AlreadyExists => "AlreadyExists",
        PermissionDenied => "PermissionDenied",
        ResourceExhausted => "ResourceExhausted",
        FailedPrecondition => "FailedPrecondition",
        Aborted => "Aborted",
        OutOfRange => "OutOfRange",
        Unimplemented => "Unimplemented",
        Internal => "Internal",
        Unavailable => "Unavailable",
        DataLoss => "DataLoss",
        Unauthenticated => "Unauthenticated",
    }
}

/// Counts a drain in a stage while alive, and records the stage's duration on drop.
pub struct StageTimer<'a> {
    metrics: &'a Metrics,
    labels: StageLabels,
    started: Instant,
}

impl Drop for StageTimer<'_> {
    fn drop(&mut self) {
        self.metrics
            .drains_in_stage
            .get_or_create(&self.labels)
            .dec();
        self.metrics
            .stage_duration
            .get_or_create(&self.labels)
            .observe(self.started.elapsed().as_secs_f64());
    }
}

/// The process-wide metrics.
pub fn metrics() -> &'static Metrics {
    static M: OnceLock<Metrics> = OnceLock::new();
    M.get_or_init(Metrics::new)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_prometheus_conventions() {
        let m = metrics();
        m.update_process();
        m.rpc("NodeGroups", tonic::Code::Ok, Instant::now());
        m.aws("describe_groups", "throttled");
        Metrics::outcome(&m.evictions, "pdb_blocked");
        drop(m.stage("workloads"));
        let text = m.encode();
        for name in [
            "ca_asg_provider_grpc_requests_total{method=\"NodeGroups\",code=\"Ok\"}",
            "ca_asg_provider_grpc_request_duration_seconds_bucket",
            "ca_asg_provider_aws_calls_total{operation=\"describe_groups\",outcome=\"throttled\"}",
            "ca_asg_provider_evictions_total{outcome=\"pdb_blocked\"}",
            "ca_asg_provider_drain_stage_duration_seconds_count{stage=\"workloads\"}",
            "ca_asg_provider_drains_in_progress{stage=\"workloads\"} 0",
            "\nprocess_resident_memory_bytes ",
            "\nprocess_cpu_seconds_total ",
            "\nprocess_open_fds ",
            "\nprocess_threads ",
        ] {
            assert!(text.contains(name), "missing {name} in:\n{text}");
        }
        assert!(!text.contains("ca_asg_provider_process_"), "{text}");
        // One exposition: a single EOF, at the end.
        assert_eq!(text.matches("# EOF").count(), 1, "{text}");
        assert!(text.trim_end().ends_with("# EOF"), "{text}");
    }

    #[test]
    fn buckets_reach_past_cas_call_timeout_and_around_a_spot_warning() {
        let m = metrics();
        m.rpc("Refresh", tonic::Code::Ok, Instant::now());
        m.aws_duration(
            "DescribeAutoScalingGroups",
            std::time::Duration::from_millis(30),
        );
        m.notice_to_drain
            .get_or_create(&KindLabels { kind: "test" })
            .observe(118.0);
        m.update_process();
        let text = m.encode();
        let bound = |series: &str| -> f64 {
            text.lines()
                .filter(|l| l.starts_with(series))
                .filter_map(|l| l.split("le=\"").nth(1)?.split('"').next()?.parse().ok())
                .filter(|b: &f64| b.is_finite())
                .fold(0.0, f64::max)
        };
        assert!(bound("ca_asg_provider_grpc_request_duration_seconds_bucket") >= 10.0);
        assert!(bound("ca_asg_provider_aws_call_duration_seconds_bucket") >= 60.0);
        for edge in ["le=\"110.0\"", "le=\"120.0\"", "le=\"150.0\""] {
            assert!(
                text.lines().any(|l| l
                    .starts_with("ca_asg_provider_notice_to_drain_seconds_bucket")
                    && l.contains(edge)),
                "{edge}"
            );
        }
        let rss: f64 = text
            .lines()
            .find_map(|l| l.strip_prefix("process_resident_memory_bytes "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0.0);
        assert!(
            rss > 1_000_000.0,
            "the test process has more than 1 MB resident: {rss}"
        );
    }
}

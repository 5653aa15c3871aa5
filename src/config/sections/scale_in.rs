//! `scaleIn:`: the drain that runs before an instance ends.

use std::time::Duration;

use super::{bounded_duration, Problems};
use crate::config::ScaleInFile;
use crate::scalein::{decide::plan, ScaleInSettings};

/// The section's values: each key, else the default; each duration within its
/// minimum; the node-critical DaemonSets' selectors parsed. Counts and names are
/// checked by [`check_limits`].
pub fn resolve(si: &ScaleInFile, problems: &mut Problems) -> ScaleInSettings {
    let d = ScaleInSettings::default();
    let second = Duration::from_secs(1);
    let mut duration = |key: &str, value: Option<&String>, default: Duration, min: Duration| {
        bounded_duration(problems, key, value, default, min, None)
    };
    // Fields are evaluated in the order written: the problems come in this order.
    let mut scale_in = ScaleInSettings {
        dry_run: false,
        mode: si.mode.unwrap_or(d.mode),
        create_hook: si.create_lifecycle_hook.unwrap_or(d.create_hook),
        hook_name: si.hook_name.clone().unwrap_or(d.hook_name.clone()),
        hook_heartbeat_timeout: duration(
            "scaleIn.hookHeartbeatTimeout",
            si.hook_heartbeat_timeout.as_ref(),
            d.hook_heartbeat_timeout,
            Duration::from_secs(30),
        ),
        daemonsets: si.daemon_sets.unwrap_or(d.daemonsets),
        workload_deadline: duration(
            "scaleIn.workloadDeadline",
            si.workload_deadline.as_ref(),
            d.workload_deadline,
            second,
        ),
        workload_deadline_policy: si
            .workload_deadline_policy
            .unwrap_or(d.workload_deadline_policy),
        daemonset_deadline: duration(
            "scaleIn.daemonSetDeadline",
            si.daemon_set_deadline.as_ref(),
            d.daemonset_deadline,
            second,
        ),
        daemonset_deadline_policy: si
            .daemon_set_deadline_policy
            .unwrap_or(d.daemonset_deadline_policy),
        volume_deadline: duration(
            "scaleIn.volumeDetachDeadline",
            si.volume_detach_deadline.as_ref(),
            d.volume_deadline,
            Duration::ZERO,
        ),
        eviction_retry: duration(
            "scaleIn.evictionRetryInterval",
            si.eviction_retry_interval.as_ref(),
            d.eviction_retry,
            Duration::from_millis(100),
        ),
        max_concurrent_drains: si.max_concurrent_drains.unwrap_or(d.max_concurrent_drains),
        budgets: Vec::new(),
        api_qps: si.api_qps.unwrap_or(d.api_qps),
        api_burst: si.api_burst.unwrap_or(d.api_burst),
        lifecycle_poll_interval: duration(
            "scaleIn.lifecyclePollInterval",
            si.lifecycle_poll_interval.as_ref(),
            d.lifecycle_poll_interval,
            second,
        ),
        leader_election: si.leader_election.unwrap_or(true),
        lease_name: si.lease_name.clone().unwrap_or(d.lease_name.clone()),
        lease_namespace: si.lease_namespace.clone(),
        lease_duration: duration(
            "scaleIn.leaseDuration",
            si.lease_duration.as_ref(),
            d.lease_duration,
            Duration::from_secs(2),
        ),
        stuck_after: d.stuck_after,
        node_critical: d.node_critical.clone(),
        budget_watch: d.budget_watch,
        shared_pod_watch_from: si.shared_pod_watch_from.unwrap_or(d.shared_pod_watch_from),
        warm_pool_settle: d.warm_pool_settle,
        tell_ca_every: d.tell_ca_every,
        load_balancers: d.load_balancers,
        group_overrides: Vec::new(),
        wait_for_replacement: si.wait_for_replacement.unwrap_or(d.wait_for_replacement),
    };
    let lb = si.load_balancers.clone().unwrap_or_default();
    scale_in.load_balancers.enabled = lb
        .wait_for_deregistration
        .unwrap_or(d.load_balancers.enabled);
    scale_in.load_balancers.deregister = lb.deregister.unwrap_or(d.load_balancers.deregister);
    if scale_in.load_balancers.deregister && !scale_in.load_balancers.enabled {
        problems.bad(
            "scaleIn.loadBalancers.deregister",
            "is true while waitForDeregistration is false: the instance would end while its targets drain; turn the wait on or deregister off".to_string(),
        );
    }
    scale_in.load_balancers.margin = bounded_duration(
        problems,
        "scaleIn.loadBalancers.margin",
        lb.margin.as_ref(),
        d.load_balancers.margin,
        Duration::ZERO,
        Some(Duration::from_secs(3600)),
    );
    match plan::NodeCritical::parse(si.node_critical_daemon_sets.as_deref().unwrap_or_default()) {
        Ok(nc) => scale_in.node_critical = nc,
        Err(why) => problems.bad("scaleIn.nodeCriticalDaemonSets", why),
    }
    scale_in
}

/// The counts within their bounds (a wrong one falls back to the default) and the
/// lease's and hook's names of a length Kubernetes and AWS accept.
pub fn check_limits(scale_in: &mut ScaleInSettings, problems: &mut Problems) {
    let d = ScaleInSettings::default();
    if scale_in.max_concurrent_drains == 0 || scale_in.max_concurrent_drains > 10_000 {
        problems.bad(
            "scaleIn.maxConcurrentDrains",
            format!(
                "{} must be between 1 and 10000",
                scale_in.max_concurrent_drains
            ),
        );
        scale_in.max_concurrent_drains = d.max_concurrent_drains;
    }
    if scale_in.shared_pod_watch_from > 10_000 {
        problems.bad(
            "scaleIn.sharedPodWatchFrom",
            format!(
                "{} must be between 0 (never) and 10000",
                scale_in.shared_pod_watch_from
            ),
        );
        scale_in.shared_pod_watch_from = d.shared_pod_watch_from;
    }
    if !(scale_in.api_qps.is_finite() && scale_in.api_qps > 0.0) {
        problems.bad(
            "scaleIn.apiQps",
            format!("{} must be a positive number", scale_in.api_qps),
        );
    }
    if scale_in.api_burst == 0 {
        problems.bad("scaleIn.apiBurst", "0 must be at least 1".into());
    }
    if scale_in.lease_name.trim().is_empty() || scale_in.lease_name.len() > 253 {
        problems.bad(
            "scaleIn.leaseName",
            format!("{:?} must be 1 to 253 characters", scale_in.lease_name),
        );
    }
    if scale_in.hook_name.trim().is_empty() || scale_in.hook_name.len() > 255 {
        problems.bad(
            "scaleIn.hookName",
            format!("{:?} must be 1 to 255 characters", scale_in.hook_name),
        );
    }
}

//! Pure drain planning: which pods leave in which phase, in what order.
//!
//! Phase 1 takes every workload pod (not DaemonSet-owned, not a mirror pod), in
//! tiers like Karpenter's: non-critical first, then critical (system-cluster-critical
//! / system-node-critical priority classes), then pods that asked not to be disrupted
//! (evicted last, with an Event saying why: the instance is ending anyway). Pods that
//! asked to run to completion (CA 1.36's `safe-to-evict: "on-completion"`) are not
//! evicted: the drain waits for them to finish, bounded by the workload deadline.
//! Phase 2 takes DaemonSet pods, non-critical before critical, only after phase 1 is
//! empty.

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::{SignedDuration, Timestamp};

pub const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";
pub const SAFE_TO_EVICT: &str = "cluster-autoscaler.kubernetes.io/safe-to-evict";
pub const DO_NOT_DISRUPT: &str = "karpenter.sh/do-not-disrupt";
/// CA 1.36's value of [`SAFE_TO_EVICT`] for a pod that must run to its end (a Job's
/// pod): CA does not scale in its node while it runs.
pub const ON_COMPLETION: &str = "on-completion";
const CRITICAL_CLASSES: [&str; 2] = ["system-cluster-critical", "system-node-critical"];

/// A pod as the drain tracks it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// For naming the PodDisruptionBudgets that select it.
    pub labels: std::collections::BTreeMap<String, String>,
}

impl std::fmt::Display for PodRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Tier {
    Workload,
    CriticalWorkload,
    /// `safe-to-evict: "on-completion"`: never evicted; waited for until it finishes
    /// (or the workload deadline's policy decides).
    OnCompletion,
    DoNotDisrupt,
    DaemonSet,
    CriticalDaemonSet,
}

impl Tier {
    pub fn is_daemonset(self) -> bool {
        matches!(self, Tier::DaemonSet | Tier::CriticalDaemonSet)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Workload => "workload",
            Tier::CriticalWorkload => "critical-workload",
            Tier::OnCompletion => "on-completion",
            Tier::DoNotDisrupt => "do-not-disrupt",
            Tier::DaemonSet => "daemonset",
            Tier::CriticalDaemonSet => "critical-daemonset",
        }
    }
}

/// What the drain does with a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Disposition {
    /// Evict it in this tier.
    Evict(Tier),
    /// Already terminating: nothing to send, but wait for it in this tier.
    Wait(Tier),
    /// Never touched: mirror/static pods (kubelet owns them), finished pods.
    Skip(&'static str),
}

/// DaemonSets whose pods must outlive the volume detach, besides those of a
/// `system-node-critical`/`system-cluster-critical` priority class (EKS's own CNI,
/// kube-proxy and EBS CSI node plugin use that class; many third-party CNI, CSI and
/// node agents do not). Each selector is a set of pod labels that must all match
/// (`k8s-app=cilium`, `app=efs-csi-node,role=node`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeCritical {
    selectors: Vec<Vec<(String, String)>>,
}

impl NodeCritical {
    /// Parses `key=value[,key=value...]` selectors; the error names the bad entry.
    pub fn parse(entries: &[String]) -> Result<Self, String> {
        let mut selectors = Vec::new();
        for e in entries {
            let mut pairs = Vec::new();
            for part in e.split(',') {
                let (k, v) = part.split_once('=').ok_or_else(|| {
                    format!("{e:?}: each selector is key=value[,key=value...] (a pod label), {part:?} has no '='")
                })?;
                let (k, v) = (k.trim(), v.trim());
                if k.is_empty() || k.len() > 316 || v.len() > 63 || k.contains(char::is_whitespace)
                {
                    return Err(format!("{e:?}: {part:?} is not a label key=value"));
                }
                pairs.push((k.to_string(), v.to_string()));
            }
            selectors.push(pairs);
        }
        Ok(Self { selectors })
    }

    /// Whether one of the selectors matches the pod's labels.
    pub fn matches(&self, pod: &Pod) -> bool {
        let Some(labels) = pod.metadata.labels.as_ref() else {
            return false;
        };
        self.selectors.iter().any(|sel| {
            sel.iter()
                .all(|(k, v)| labels.get(k).is_some_and(|l| l == v))
        })
    }
}

/// Which tier (if any) a pod belongs to, and whether to send an eviction, with the
/// configured node-critical DaemonSets, at `now` (a `karpenter.sh/do-not-disrupt`
/// duration ends).
pub fn classify_at(pod: &Pod, node_critical: &NodeCritical, now: Timestamp) -> Disposition {
    let meta = &pod.metadata;
    let annotations = meta.annotations.as_ref();
    if annotations.is_some_and(|a| a.contains_key(MIRROR_ANNOTATION)) {
        return Disposition::Skip("mirror pod (static, owned by the kubelet)");
    }
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    if matches!(phase, Some("Succeeded") | Some("Failed")) {
        return Disposition::Skip("pod has finished");
    }
    let tier = tier_of(pod, node_critical, now);
    // Nothing is sent to a pod that runs to completion: the drain waits for it.
    if meta.deletion_timestamp.is_some() || tier == Tier::OnCompletion {
        Disposition::Wait(tier)
    } else {
        Disposition::Evict(tier)
    }
}

fn tier_of(pod: &Pod, node_critical: &NodeCritical, now: Timestamp) -> Tier {
    let critical = pod
        .spec
        .as_ref()
        .and_then(|s| s.priority_class_name.as_deref())
        .is_some_and(|c| CRITICAL_CLASSES.contains(&c));
    if is_daemonset_pod(pod) {
        return if critical || node_critical.matches(pod) {
            Tier::CriticalDaemonSet
        } else {
            Tier::DaemonSet
        };
    }
    if runs_to_completion(pod) {
        return Tier::OnCompletion;
    }
    if asks_not_to_be_disrupted_at(pod, now) {
        return Tier::DoNotDisrupt;
    }
    if critical {
        Tier::CriticalWorkload
    } else {
        Tier::Workload
    }
}

pub fn is_daemonset_pod(pod: &Pod) -> bool {
    pod.metadata.owner_references.as_ref().is_some_and(|o| {
        o.iter()
            .any(|r| r.kind == "DaemonSet" && r.controller == Some(true))
    })
}

/// Longest `karpenter.sh/do-not-disrupt` duration read; a longer one reads as `true`.
const MAX_DO_NOT_DISRUPT: std::time::Duration = std::time::Duration::from_secs(10 * 365 * 86400);

/// What a `karpenter.sh/do-not-disrupt` value asks for. Karpenter reads `"true"`, or a
/// duration (`"30m"`) counted from the pod's start after which the protection ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DoNotDisrupt {
    /// Not set, `"false"`, or unreadable (the value is named in the log by the caller).
    No,
    Always,
    For(std::time::Duration),
}

/// Reads a `karpenter.sh/do-not-disrupt` value, bounded: `"true"` (any case), or a
/// Go duration up to ten years; anything else does not protect the pod.
pub fn parse_do_not_disrupt(v: &str) -> DoNotDisrupt {
    let v = v.trim();
    if v.eq_ignore_ascii_case("true") {
        return DoNotDisrupt::Always;
    }
    if v.len() > 64 {
        return DoNotDisrupt::No;
    }
    match crate::duration::parse_duration(v) {
        Ok(d) if d > MAX_DO_NOT_DISRUPT => DoNotDisrupt::Always,
        Ok(d) => DoNotDisrupt::For(d),
        Err(_) => DoNotDisrupt::No,
    }
}

/// `safe-to-evict: "false"` (CA) or `karpenter.sh/do-not-disrupt: "true"`, or a
/// do-not-disrupt duration still running, at `now`: a duration protects the pod until its start
/// (`status.startTime`, else its creation) plus the duration.
pub fn asks_not_to_be_disrupted_at(pod: &Pod, now: Timestamp) -> bool {
    let Some(a) = pod.metadata.annotations.as_ref() else {
        return false;
    };
    if a.get(SAFE_TO_EVICT).is_some_and(|v| v == "false") {
        return true;
    }
    match a.get(DO_NOT_DISRUPT).map(|v| parse_do_not_disrupt(v)) {
        None | Some(DoNotDisrupt::No) => false,
        Some(DoNotDisrupt::Always) => true,
        Some(DoNotDisrupt::For(d)) => {
            let started = pod
                .status
                .as_ref()
                .and_then(|s| s.start_time.as_ref())
                .or(pod.metadata.creation_timestamp.as_ref());
            let Some(started) = started else {
                return true;
            };
            let d = SignedDuration::try_from(d).unwrap_or(SignedDuration::MAX);
            match started.0.checked_add(d) {
                Ok(until) => now < until,
                Err(_) => true,
            }
        }
    }
}

/// CA 1.36's `safe-to-evict: "on-completion"`: the pod runs until it finishes; the
/// drain never evicts it and waits for it, bounded by the workload deadline.
pub fn runs_to_completion(pod: &Pod) -> bool {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(SAFE_TO_EVICT))
        .is_some_and(|v| v.trim() == ON_COMPLETION)
}

/// Does the pod tolerate a taint (key, value, effect), by Kubernetes' rules: an
/// empty key with `Exists` tolerates everything, an empty effect matches every
/// effect, `Exists` ignores the value.
pub fn tolerates(pod: &Pod, key: &str, value: &str, effect: &str) -> bool {
    let Some(tolerations) = pod.spec.as_ref().and_then(|s| s.tolerations.as_ref()) else {
        return false;
    };
    tolerations.iter().any(|t| {
        let exists = t.operator.as_deref() == Some("Exists");
        let key_ok = match t.key.as_deref() {
            None | Some("") => exists,
            Some(k) => k == key,
        };
        let value_ok = exists || t.value.as_deref().unwrap_or("") == value;
        let effect_ok = t
            .effect
            .as_deref()
            .is_none_or(|e| e.is_empty() || e == effect);
        key_ok && value_ok && effect_ok
    })
}

/// How far behind ours the API server's clock may run (it writes creationTimestamp)
/// while [`is_replacement`] still tells every pod put back apart: a pod that can
/// come back is first asked to leave this long after [`arrivals_from`].
pub const CLOCK_MARGIN: std::time::Duration = std::time::Duration::from_millis(250);

/// The first whole second after the drain began. kube-apiserver writes
/// creationTimestamp in whole seconds (floored), so a pod stamped with this second or
/// a later one was created after the drain began, and one stamped earlier may have
/// been there before it.
pub fn arrivals_from(drain_started: Timestamp) -> Timestamp {
    drain_started
        .as_second()
        .checked_add(1)
        .and_then(|s| Timestamp::from_second(s).ok())
        .unwrap_or(Timestamp::MAX)
}

/// A pod that landed on the node after the drain began because it tolerates the
/// drain's taint (a blanket `operator: Exists`, a DaemonSet that tolerates
/// everything): the pods that were there were evicted once; their replacements
/// would only come back again, so they end with the instance instead of being
/// chased until the deadline (Karpenter leaves such pods alone too).
///
/// One rule for every process: it reads only the pod and the drain's start from the
/// record, so a restarted service or a new leader resuming the drain tells a pod
/// put back from one that was there as the first process did. It holds because no
/// pod that can come back is asked to leave before [`arrivals_from`]
/// ([`wait_before_evicting`]): its replacement is stamped with that second or a
/// later one, even when the drain began a moment before the second ran out.
pub fn is_replacement(
    pod: &Pod,
    drain_taint: (&str, &str, &str),
    drain_started: Timestamp,
) -> bool {
    let (key, value, effect) = drain_taint;
    let from = arrivals_from(drain_started);
    let created_after = pod
        .metadata
        .creation_timestamp
        .as_ref()
        .is_some_and(|t| t.0 >= from);
    created_after && tolerates(pod, key, value, effect)
}

/// How long the drain waits before it asks `pod` to leave (an eviction, or a delete
/// at a deadline): nothing for a pod that does not tolerate the drain's taint (no
/// replacement of it can land on the node); for one that does, until
/// [`arrivals_from`] plus [`CLOCK_MARGIN`], so that what the DaemonSet controller or
/// a ReplicaSet puts back reads as arrived after the drain began in every process
/// ([`is_replacement`]). A DaemonSet phase starts after the workloads have gone, so
/// it seldom waits at all.
pub fn wait_before_evicting(
    pod: &Pod,
    drain_taint: (&str, &str, &str),
    drain_started: Timestamp,
    now: Timestamp,
) -> std::time::Duration {
    let (key, value, effect) = drain_taint;
    if !tolerates(pod, key, value, effect) {
        return std::time::Duration::ZERO;
    }
    let margin = SignedDuration::try_from(CLOCK_MARGIN).unwrap_or(SignedDuration::ZERO);
    let at = arrivals_from(drain_started)
        .checked_add(margin)
        .unwrap_or(Timestamp::MAX);
    std::time::Duration::try_from(now.duration_until(at)).unwrap_or(std::time::Duration::ZERO)
}

/// Why the drain stops waiting for a pod that is still listed, if it does. Pure:
/// the caller says whether the pod's node is Ready and what time it is.
///
/// - finished (Succeeded/Failed): its containers have exited; only a finalizer keeps
///   the object;
/// - terminating on a node that is not Ready: no kubelet will confirm it, it would
///   stay until the Node object is gone;
/// - terminating past its deletion time (deletionTimestamp is when its grace period
///   ends) plus `stuck_after`: stuck, as Karpenter counts it.
pub fn not_waited_for(
    pod: &Pod,
    node_ready: bool,
    now: Timestamp,
    stuck_after: std::time::Duration,
) -> Option<&'static str> {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    if matches!(phase, Some("Succeeded") | Some("Failed")) {
        return Some("finished; only a finalizer keeps the object");
    }
    let deleting = pod.metadata.deletion_timestamp.as_ref()?;
    if !node_ready {
        return Some("terminating on a node that is not Ready: no kubelet will confirm it");
    }
    let stuck_at = deleting
        .0
        .checked_add(SignedDuration::try_from(stuck_after).unwrap_or(SignedDuration::MAX))
        .unwrap_or(Timestamp::MAX);
    (now > stuck_at).then_some("stuck terminating well past its grace period")
}

/// How long, from `now`, the grace periods of `pods` (workload pods deleted at the
/// deadline, or already terminating) can still run: the latest end among them. A pod
/// with a deletionTimestamp ends by then, whatever its spec says (a person may have
/// deleted it with a longer grace period than its spec's); one without is deleted now
/// with its spec's grace (30 s when unset). At most an hour. Pure.
pub fn grace_left(pods: &[Pod], now: Timestamp) -> std::time::Duration {
    const MAX: std::time::Duration = std::time::Duration::from_secs(3600);
    pods.iter()
        .map(|p| match &p.metadata.deletion_timestamp {
            Some(at) => {
                let left = at.0.duration_since(now);
                std::time::Duration::try_from(left).unwrap_or(std::time::Duration::ZERO)
            }
            None => grace_of(p),
        })
        .max()
        .unwrap_or(std::time::Duration::ZERO)
        .min(MAX)
}

/// A running pod's own grace period (`terminationGracePeriodSeconds`, 30 s when unset,
/// at most an hour).
pub fn grace_of(pod: &Pod) -> std::time::Duration {
    let secs = pod
        .spec
        .as_ref()
        .and_then(|s| s.termination_grace_period_seconds)
        .unwrap_or(30);
    std::time::Duration::from_secs(secs.clamp(0, 3600) as u64)
}

/// With `proceed`, the workload deadline ends the instance whatever the budgets say, so
/// each workload pod still running is deleted once the time `left` before the deadline
/// is no more than its own grace period: at (deadline - grace), as Karpenter's
/// `terminationGracePeriod` does. Every pod gets its whole grace before the deadline,
/// and none is deleted earlier than that (a pod whose grace is longer than what is left
/// is due at once). Terminating pods are already leaving and are left out. The pods due
/// now, and how long until the next of the others is.
pub fn grace_deletions(
    pods: &[&Pod],
    left: std::time::Duration,
) -> (Vec<PodRef>, Option<std::time::Duration>) {
    let mut due = Vec::new();
    let mut next: Option<std::time::Duration> = None;
    for p in pods
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
    {
        let grace = grace_of(p);
        if grace >= left {
            due.push(pod_ref(p));
        } else {
            let wait = left - grace;
            next = Some(next.map_or(wait, |n| n.min(wait)));
        }
    }
    (due, next)
}

pub fn pod_ref(pod: &Pod) -> PodRef {
    PodRef {
        namespace: pod
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into()),
        name: pod.metadata.name.clone().unwrap_or_default(),
        uid: pod.metadata.uid.clone().unwrap_or_default(),
        labels: pod.metadata.labels.clone().unwrap_or_default(),
    }
}

/// The next tier to work on and its pods: the lowest tier that still has pods
/// (phase-1 tiers before phase-2 tiers). `None` when nothing is left in the phases
/// asked for. Pods to evict and pods only to wait for are returned separately.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Step {
    pub tier: Option<Tier>,
    pub evict: Vec<PodRef>,
    pub wait: Vec<PodRef>,
}

/// The pod phases of a drain, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Every pod that is not DaemonSet-owned.
    Workloads,
    /// DaemonSet pods that are not node-critical (log shippers, metrics agents).
    DaemonSets,
    /// Node-critical DaemonSet pods (kube-proxy, the CNI, CSI node plugins): last
    /// of all, after volumes have detached, since detaching needs them.
    CriticalDaemonSets,
}

impl Phase {
    /// Whether pods of this tier belong to this phase. A later phase also takes the
    /// tiers of the phases before it: a workload pod still there in the DaemonSet phase
    /// (bound to the node by name after the workload phase ended) goes before any
    /// DaemonSet pod, since the lowest tier goes first; DaemonSet pods outlive every
    /// workload.
    pub fn takes(self, tier: Tier) -> bool {
        match self {
            Phase::Workloads => !tier.is_daemonset(),
            Phase::DaemonSets => tier != Tier::CriticalDaemonSet,
            Phase::CriticalDaemonSets => true,
        }
    }
}

/// The next tier of the phase to take, with the configured node-critical DaemonSets,
/// at `now`.
pub fn next_step_with(
    pods: &[Pod],
    phase: Phase,
    node_critical: &NodeCritical,
    now: Timestamp,
) -> Step {
    let mut best: Option<Tier> = None;
    let mut classified = Vec::with_capacity(pods.len());
    for p in pods {
        let d = classify_at(p, node_critical, now);
        let tier = match &d {
            Disposition::Evict(t) | Disposition::Wait(t) => *t,
            Disposition::Skip(_) => continue,
        };
        if !phase.takes(tier) {
            continue;
        }
        best = Some(best.map_or(tier, |b| b.min(tier)));
        classified.push((p, d, tier));
    }
    let Some(tier) = best else {
        return Step::default();
    };
    let mut step = Step {
        tier: Some(tier),
        ..Step::default()
    };
    for (p, d, t) in classified {
        if t != tier {
            continue;
        }
        match d {
            Disposition::Evict(_) => step.evict.push(pod_ref(p)),
            Disposition::Wait(_) => step.wait.push(pod_ref(p)),
            Disposition::Skip(_) => {}
        }
    }
    step.evict.sort();
    step.wait.sort();
    step
}

/// The whole plan, for `drain --dry-run` and Events: every pod with its tier or the
/// reason it is skipped, in the order the drain takes them.
pub fn full_plan(
    pods: &[Pod],
    include_daemonsets: bool,
    now: Timestamp,
) -> Vec<(PodRef, Result<Tier, &'static str>)> {
    let mut out: Vec<(PodRef, Result<Tier, &'static str>)> = pods
        .iter()
        .map(|p| {
            let r = match classify_at(p, &NodeCritical::default(), now) {
                Disposition::Evict(t) | Disposition::Wait(t)
                    if t.is_daemonset() && !include_daemonsets =>
                {
                    Err("DaemonSet pod kept (daemonSets: keep): it ends with the instance")
                }
                Disposition::Evict(t) | Disposition::Wait(t) => Ok(t),
                Disposition::Skip(why) => Err(why),
            };
            (pod_ref(p), r)
        })
        .collect();
    out.sort_by(|a, b| match (&a.1, &b.1) {
        (Ok(x), Ok(y)) => x.cmp(y).then(a.0.cmp(&b.0)),
        (Ok(_), Err(_)) => std::cmp::Ordering::Less,
        (Err(_), Ok(_)) => std::cmp::Ordering::Greater,
        (Err(_), Err(_)) => a.0.cmp(&b.0),
    });
    out
}

#[cfg(test)]
mod tests {
    /// The time the tests classify at.
    fn test_now() -> Timestamp {
        "2026-11-23T10:00:00Z".parse().unwrap()
    }

    fn classify(pod: &Pod) -> Disposition {
        classify_at(pod, &NodeCritical::default(), test_now())
    }

    fn next_step(pods: &[Pod], phase: Phase) -> Step {
        next_step_with(pods, phase, &NodeCritical::default(), test_now())
    }

    use super::*;

    /// Every pod with each grace, at every time left: due exactly when its grace is no
    /// shorter than what is left, the next wake the nearest (left - grace) of the rest,
    /// terminating pods never; so no pod is deleted before (deadline - its grace), and
    /// each is by then.
    #[test]
    fn each_pod_is_due_at_the_deadline_less_its_own_grace() {
        let with_grace = |name: &str, g: Option<i64>, terminating: bool| {
            let mut p = pod(name);
            p.metadata.uid = Some(name.into());
            p.spec
                .get_or_insert_with(Default::default)
                .termination_grace_period_seconds = g;
            if terminating {
                p.metadata.deletion_timestamp = Some(
                    k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(test_now()),
                );
            }
            p
        };
        let graces: [(Option<i64>, u64); 6] = [
            (Some(0), 0),
            (Some(5), 5),
            (None, 30),
            (Some(90), 90),
            (Some(7200), 3600),
            (Some(-3), 0),
        ];
        let pods: Vec<Pod> = graces
            .iter()
            .enumerate()
            .map(|(i, (g, _))| with_grace(&format!("p{i}"), *g, false))
            .chain([with_grace("leaving", Some(0), true)])
            .collect();
        let refs: Vec<&Pod> = pods.iter().collect();
        for left in [0u64, 1, 4, 5, 6, 29, 30, 31, 89, 90, 600, 3599, 3600, 7200] {
            let (due, next) = grace_deletions(&refs, std::time::Duration::from_secs(left));
            let due: Vec<String> = due.into_iter().map(|r| r.name).collect();
            let want: Vec<String> = graces
                .iter()
                .enumerate()
                .filter(|(_, (_, g))| *g >= left)
                .map(|(i, _)| format!("p{i}"))
                .collect();
            assert_eq!(due, want, "left {left}");
            let want_next = graces
                .iter()
                .filter(|(_, g)| *g < left)
                .map(|(_, g)| left - g)
                .min()
                .map(std::time::Duration::from_secs);
            assert_eq!(next, want_next, "left {left}");
        }
    }

    #[test]
    fn names_and_labels_read_as_the_docs_and_events_say() {
        let pod = PodRef {
            namespace: "shop".into(),
            name: "web-0".into(),
            uid: "u".into(),
            labels: Default::default(),
        };
        assert_eq!(pod.to_string(), "shop/web-0");
        let tiers = [
            Tier::Workload,
            Tier::CriticalWorkload,
            Tier::OnCompletion,
            Tier::DoNotDisrupt,
            Tier::DaemonSet,
            Tier::CriticalDaemonSet,
        ];
        assert_eq!(
            tiers.map(Tier::as_str),
            [
                "workload",
                "critical-workload",
                "on-completion",
                "do-not-disrupt",
                "daemonset",
                "critical-daemonset"
            ]
        );
    }

    #[test]
    fn node_critical_selectors_are_bounded_like_label_keys_and_values() {
        let one = |s: String| NodeCritical::parse(&[s]);
        let (key, value) = ("k".repeat(316), "v".repeat(63));
        assert!(
            one(format!("{key}={value}")).is_ok(),
            "the longest key and value"
        );
        assert!(
            one(format!("{key}k={value}")).is_err(),
            "a key one too long"
        );
        assert!(
            one(format!("{key}={value}v")).is_err(),
            "a value one too long"
        );
        assert!(one("=v".into()).is_err(), "an empty key");
        assert!(one("a b=v".into()).is_err(), "a key with a space");
        assert!(one("k=".into()).is_ok(), "an empty value is a label value");
    }
    use k8s_openapi::api::core::v1::{PodSpec, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};

    fn pod(name: &str) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                uid: Some(format!("uid-{name}")),
                ..Default::default()
            },
            spec: Some(PodSpec::default()),
            status: Some(PodStatus {
                phase: Some("Running".into()),
                ..Default::default()
            }),
        }
    }

    fn ds(mut p: Pod) -> Pod {
        p.metadata.owner_references = Some(vec![OwnerReference {
            api_version: "apps/v1".into(),
            kind: "DaemonSet".into(),
            name: "fluentd".into(),
            uid: "ds".into(),
            controller: Some(true),
            ..Default::default()
        }]);
        p
    }

    fn critical(mut p: Pod) -> Pod {
        p.spec.as_mut().unwrap().priority_class_name = Some("system-node-critical".into());
        p
    }

    fn annotate(mut p: Pod, k: &str, v: &str) -> Pod {
        p.metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(k.into(), v.into());
        p
    }

    fn names(v: &[PodRef]) -> Vec<&str> {
        v.iter().map(|p| p.name.as_str()).collect()
    }

    #[test]
    fn a_pod_that_runs_to_completion_is_waited_for_never_evicted() {
        let job = annotate(pod("a"), SAFE_TO_EVICT, ON_COMPLETION);
        assert_eq!(classify(&job), Disposition::Wait(Tier::OnCompletion));
        // A DaemonSet pod stays in its phase whatever it says.
        assert_eq!(
            classify(&ds(annotate(pod("a"), SAFE_TO_EVICT, ON_COMPLETION))),
            Disposition::Evict(Tier::DaemonSet)
        );
        // Finished, it is skipped like any finished pod: the drain goes on.
        let mut done = job.clone();
        done.status.as_mut().unwrap().phase = Some("Succeeded".into());
        assert!(matches!(classify(&done), Disposition::Skip(_)));
        // Among workloads it comes after the others and before do-not-disrupt pods;
        // nothing is evicted in its tier, its pods are only waited for.
        let pods = vec![
            job.clone(),
            annotate(pod("b"), DO_NOT_DISRUPT, "true"),
            pod("c"),
        ];
        let first = next_step(&pods, Phase::Workloads);
        assert_eq!(first.tier, Some(Tier::Workload));
        let step = next_step(&pods[..2], Phase::Workloads);
        assert_eq!(step.tier, Some(Tier::OnCompletion));
        assert!(step.evict.is_empty(), "{step:?}");
        assert_eq!(names(&step.wait), ["a"]);
        // Other values are not CA's run-to-completion.
        for v in ["true", "On-Completion ", "oncompletion", ""] {
            assert_ne!(
                classify(&annotate(pod("a"), SAFE_TO_EVICT, v)),
                Disposition::Wait(Tier::OnCompletion),
                "{v:?}"
            );
        }
    }

    #[test]
    fn do_not_disrupt_takes_true_or_a_duration_from_the_pod_start() {
        assert_eq!(parse_do_not_disrupt("true"), DoNotDisrupt::Always);
        assert_eq!(parse_do_not_disrupt(" TRUE "), DoNotDisrupt::Always);
        assert_eq!(
            parse_do_not_disrupt("30m"),
            DoNotDisrupt::For(std::time::Duration::from_secs(1800))
        );
        assert_eq!(
            parse_do_not_disrupt("87600h"),
            DoNotDisrupt::For(MAX_DO_NOT_DISRUPT)
        );
        for v in ["false", "", "-5m", "5", "soon", &"9".repeat(100)] {
            assert_eq!(parse_do_not_disrupt(v), DoNotDisrupt::No, "{v:?}");
        }
        let start: Timestamp = "2026-11-25T10:00:00Z".parse().unwrap();
        let mut p = annotate(pod("a"), DO_NOT_DISRUPT, "30m");
        p.status.as_mut().unwrap().start_time =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(start));
        let at = |mins: i64| start.checked_add(SignedDuration::from_mins(mins)).unwrap();
        let nc = NodeCritical::default();
        assert_eq!(
            classify_at(&p, &nc, at(29)),
            Disposition::Evict(Tier::DoNotDisrupt)
        );
        assert_eq!(
            classify_at(&p, &nc, at(30)),
            Disposition::Evict(Tier::Workload)
        );
        // No start time yet, no creation time: protected (fail closed on ordering).
        p.status.as_mut().unwrap().start_time = None;
        assert_eq!(
            classify_at(&p, &nc, at(600)),
            Disposition::Evict(Tier::DoNotDisrupt)
        );
        // The creation time stands in for a start time not yet written.
        p.metadata.creation_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(start));
        assert_eq!(
            classify_at(&p, &nc, at(31)),
            Disposition::Evict(Tier::Workload)
        );
    }

    #[test]
    fn classifies_every_kind_of_pod() {
        assert_eq!(classify(&pod("a")), Disposition::Evict(Tier::Workload));
        assert_eq!(
            classify(&critical(pod("a"))),
            Disposition::Evict(Tier::CriticalWorkload)
        );
        assert_eq!(classify(&ds(pod("a"))), Disposition::Evict(Tier::DaemonSet));
        assert_eq!(
            classify(&critical(ds(pod("a")))),
            Disposition::Evict(Tier::CriticalDaemonSet)
        );
        assert_eq!(
            classify(&annotate(pod("a"), SAFE_TO_EVICT, "false")),
            Disposition::Evict(Tier::DoNotDisrupt)
        );
        assert_eq!(
            classify(&annotate(pod("a"), SAFE_TO_EVICT, "true")),
            Disposition::Evict(Tier::Workload)
        );
        assert_eq!(
            classify(&annotate(pod("a"), DO_NOT_DISRUPT, "true")),
            Disposition::Evict(Tier::DoNotDisrupt)
        );
        assert!(matches!(
            classify(&annotate(pod("a"), MIRROR_ANNOTATION, "x")),
            Disposition::Skip(_)
        ));
        let mut done = pod("a");
        done.status.as_mut().unwrap().phase = Some("Succeeded".into());
        assert!(matches!(classify(&done), Disposition::Skip(_)));
        let mut failed = pod("a");
        failed.status.as_mut().unwrap().phase = Some("Failed".into());
        assert!(matches!(classify(&failed), Disposition::Skip(_)));
        let mut going = pod("a");
        going.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        assert_eq!(classify(&going), Disposition::Wait(Tier::Workload));
    }

    #[test]
    fn configured_node_critical_daemonsets_leave_after_the_volumes() {
        let nc = NodeCritical::parse(&[
            "k8s-app=cilium".into(),
            "app=efs-csi-node, role=node".into(),
        ])
        .unwrap();
        let labelled = |labels: &[(&str, &str)]| {
            let mut p = ds(pod("agent"));
            p.metadata.labels = Some(
                labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            );
            p
        };
        let tier = |p: &Pod| match classify_at(p, &nc, test_now()) {
            Disposition::Evict(t) | Disposition::Wait(t) => t,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            tier(&labelled(&[("k8s-app", "cilium")])),
            Tier::CriticalDaemonSet
        );
        assert_eq!(
            tier(&labelled(&[
                ("app", "efs-csi-node"),
                ("role", "node"),
                ("x", "y")
            ])),
            Tier::CriticalDaemonSet
        );
        // Every pair must match; a log shipper stays an ordinary DaemonSet pod.
        assert_eq!(tier(&labelled(&[("app", "efs-csi-node")])), Tier::DaemonSet);
        assert_eq!(tier(&labelled(&[("app", "fluentd")])), Tier::DaemonSet);
        // A workload with the label is still a workload.
        let mut w = pod("web");
        w.metadata.labels = Some([("k8s-app".to_string(), "cilium".to_string())].into());
        assert_eq!(tier(&w), Tier::Workload);
        // Without configuration, only the priority class counts.
        assert_eq!(
            classify(&labelled(&[("k8s-app", "cilium")])),
            Disposition::Evict(Tier::DaemonSet)
        );
        let step = next_step_with(
            &[labelled(&[("k8s-app", "cilium")])],
            Phase::DaemonSets,
            &nc,
            test_now(),
        );
        assert_eq!(
            step.tier, None,
            "not in the DaemonSet phase: after the volumes"
        );
        for bad in ["cilium", "k8s-app", "=x", "a b=c"] {
            let err = NodeCritical::parse(&[bad.to_string()]).unwrap_err();
            assert!(err.contains(bad), "{err}");
        }
    }

    #[test]
    fn a_non_controller_daemonset_reference_is_not_a_daemonset_pod() {
        let mut p = ds(pod("a"));
        p.metadata.owner_references.as_mut().unwrap()[0].controller = None;
        assert_eq!(classify(&p), Disposition::Evict(Tier::Workload));
    }

    #[test]
    fn daemonsets_wait_until_every_workload_is_gone() {
        let pods = vec![
            ds(pod("fluentd")),
            pod("app"),
            critical(pod("coredns")),
            critical(ds(pod("cni"))),
            annotate(pod("batch"), SAFE_TO_EVICT, "false"),
        ];
        let s = next_step(&pods, Phase::Workloads);
        assert_eq!(s.tier, Some(Tier::Workload));
        assert_eq!(names(&s.evict), vec!["app"]);
        let s = next_step(&pods[2..], Phase::Workloads);
        assert_eq!(s.tier, Some(Tier::CriticalWorkload));
        let s = next_step(
            &[pods[0].clone(), pods[3].clone(), pods[4].clone()],
            Phase::Workloads,
        );
        assert_eq!(
            s.tier,
            Some(Tier::DoNotDisrupt),
            "do-not-disrupt pods go at the end of phase 1"
        );
        // Phase 1 never touches DaemonSet pods.
        assert_eq!(
            next_step(&[pods[0].clone(), pods[3].clone()], Phase::Workloads),
            Step::default()
        );
        let s = next_step(&[pods[0].clone(), pods[3].clone()], Phase::DaemonSets);
        assert_eq!(s.tier, Some(Tier::DaemonSet));
        assert_eq!(names(&s.evict), vec!["fluentd"]);
        // A workload still there in a later phase (bound by name after phase 1) goes
        // before any DaemonSet pod.
        let s = next_step(&pods, Phase::DaemonSets);
        assert_eq!(s.tier, Some(Tier::Workload));
        assert_eq!(names(&s.evict), vec!["app"]);
        assert_eq!(
            next_step(&[pods[3].clone()], Phase::DaemonSets),
            Step::default(),
            "node-critical DaemonSet pods wait for the volumes"
        );
        let s = next_step(&[pods[3].clone()], Phase::CriticalDaemonSets);
        assert_eq!(s.tier, Some(Tier::CriticalDaemonSet));
        assert_eq!(names(&s.evict), vec!["cni"]);
        let s = next_step(
            &[pods[3].clone(), pods[0].clone()],
            Phase::CriticalDaemonSets,
        );
        assert_eq!(
            s.tier,
            Some(Tier::DaemonSet),
            "every tier before its own first"
        );
        let s = next_step(&pods, Phase::CriticalDaemonSets);
        assert_eq!(s.tier, Some(Tier::Workload));
        assert_eq!(next_step(&[], Phase::Workloads), Step::default());
    }

    #[test]
    fn a_terminating_workload_still_holds_back_daemonsets() {
        let mut going = pod("app");
        going.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        let s = next_step(&[ds(pod("fluentd")), going], Phase::Workloads);
        assert_eq!(s.tier, Some(Tier::Workload));
        assert!(s.evict.is_empty());
        assert_eq!(names(&s.wait), vec!["app"]);
    }

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + secs).unwrap()
    }

    #[test]
    fn the_grace_left_is_read_from_the_deletion_time_when_a_pod_has_one() {
        use std::time::Duration as D;
        let pod = |spec_grace: Option<i64>, deleting_at: Option<i64>| Pod {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                deletion_timestamp: deleting_at.map(|s| Time(at(s))),
                ..Default::default()
            },
            spec: Some(k8s_openapi::api::core::v1::PodSpec {
                termination_grace_period_seconds: spec_grace,
                ..Default::default()
            }),
            status: None,
        };
        let now = at(0);
        assert_eq!(grace_left(&[], now), D::ZERO);
        assert_eq!(grace_left(&[pod(Some(5), None)], now), D::from_secs(5));
        assert_eq!(
            grace_left(&[pod(None, None)], now),
            D::from_secs(30),
            "the default"
        );
        // Deleted by a person with a longer grace than its spec's: it runs until then.
        assert_eq!(grace_left(&[pod(Some(1), Some(60))], now), D::from_secs(60));
        // Deleted with a shorter one, or long ago: no more than what is left.
        assert_eq!(
            grace_left(&[pod(Some(300), Some(10))], now),
            D::from_secs(10)
        );
        assert_eq!(grace_left(&[pod(Some(30), Some(-5))], now), D::ZERO);
        // The latest end among them, at most an hour.
        assert_eq!(
            grace_left(
                &[
                    pod(Some(1), None),
                    pod(Some(1), Some(45)),
                    pod(Some(20), None)
                ],
                now
            ),
            D::from_secs(45)
        );
        assert_eq!(
            grace_left(&[pod(Some(1), Some(99_999))], now),
            D::from_secs(3600)
        );
        assert_eq!(
            grace_left(&[pod(Some(99_999), None)], now),
            D::from_secs(3600)
        );
        assert_eq!(grace_left(&[pod(Some(-3), None)], now), D::ZERO);
    }

    fn tolerating(mut p: Pod, t: &str) -> Pod {
        p.spec.as_mut().unwrap().tolerations = Some(vec![serde_json::from_str(t).unwrap()]);
        p
    }

    #[test]
    fn tolerations_follow_kubernetes_rules() {
        let t = ("ca-asg-provider.io/draining", "true", "NoSchedule");
        let ok = |p: &Pod| tolerates(p, t.0, t.1, t.2);
        assert!(ok(&tolerating(pod("a"), r#"{"operator":"Exists"}"#)));
        assert!(ok(&tolerating(
            pod("a"),
            r#"{"key":"ca-asg-provider.io/draining","operator":"Exists"}"#
        )));
        assert!(ok(&tolerating(
            pod("a"),
            r#"{"key":"ca-asg-provider.io/draining","operator":"Equal","value":"true","effect":"NoSchedule"}"#
        )));
        assert!(!ok(&tolerating(
            pod("a"),
            r#"{"key":"ca-asg-provider.io/draining","operator":"Equal","value":"false"}"#
        )));
        assert!(!ok(&tolerating(
            pod("a"),
            r#"{"operator":"Exists","effect":"NoExecute"}"#
        )));
        assert!(!ok(&tolerating(
            pod("a"),
            r#"{"key":"other","operator":"Exists"}"#
        )));
        assert!(!ok(&pod("a")));
    }

    #[test]
    fn only_tolerating_pods_created_after_the_start_are_replacements() {
        let t = ("ca-asg-provider.io/draining", "true", "NoSchedule");
        let created = |mut p: Pod, secs| {
            p.metadata.creation_timestamp = Some(Time(at(secs)));
            p
        };
        let blanket = |p| tolerating(p, r#"{"operator":"Exists"}"#);
        assert!(is_replacement(&created(blanket(pod("new")), 10), t, at(5)));
        assert!(!is_replacement(&created(blanket(pod("old")), 1), t, at(5)));
        assert!(!is_replacement(&created(pod("plain"), 10), t, at(5)));
        assert!(!is_replacement(&blanket(pod("no-timestamp")), t, at(5)));
        // Created in the drain's own second: it may have been there before (the
        // timestamp has whole seconds), so it is drained, never left behind.
        assert!(!is_replacement(&created(blanket(pod("same")), 5), t, at(5)));
    }

    #[test]
    fn a_pod_put_back_after_the_wait_is_a_replacement_in_every_process() {
        let t = ("ca-asg-provider.io/draining", "true", "NoSchedule");
        let started =
            Timestamp::from_nanosecond((1_700_000_005i128 * 1_000_000_000) + 300_000_000).unwrap();
        let created = |mut p: Pod, secs| {
            p.metadata.creation_timestamp = Some(Time(at(secs)));
            p
        };
        let blanket = |p| tolerating(p, r#"{"operator":"Exists"}"#);
        let shipper = |p| {
            tolerating(
                p,
                r#"{"key":"ca-asg-provider.io/draining","operator":"Exists","effect":"NoSchedule"}"#,
            )
        };
        assert_eq!(arrivals_from(started), at(6));
        assert_eq!(arrivals_from(at(5)), at(6));
        assert_eq!(arrivals_from(Timestamp::MAX), Timestamp::MAX);
        // Stamped with the start's own second: it may have been there before the
        // drain, so every process drains it; from the next second on, it came back.
        let own_second = created(blanket(pod("back")), 5);
        assert!(!is_replacement(&own_second, t, started));
        assert!(is_replacement(
            &created(blanket(pod("back")), 6),
            t,
            started
        ));
        assert!(is_replacement(
            &created(shipper(pod("back")), 6),
            t,
            started
        ));
        assert!(!is_replacement(&created(pod("plain"), 6), t, started));
        // Only what can come back waits, and only until the next second and the
        // margin: from 5.3 s, 950 ms.
        assert_eq!(
            wait_before_evicting(&blanket(pod("a")), t, started, started),
            std::time::Duration::from_millis(950)
        );
        assert_eq!(
            wait_before_evicting(&shipper(pod("a")), t, started, started),
            std::time::Duration::from_millis(950)
        );
        assert_eq!(
            wait_before_evicting(&pod("plain"), t, started, started),
            std::time::Duration::ZERO
        );
        assert_eq!(
            wait_before_evicting(&blanket(pod("a")), t, started, at(7)),
            std::time::Duration::ZERO
        );
    }

    proptest::proptest! {
        /// Whatever the second the drain began in and however late in it: a pod there
        /// before the drain is drained; one asked to leave no earlier than the wait
        /// says, and put back at any time after by an API server whose clock runs up
        /// to the margin behind ours, is a replacement in every process.
        #[test]
        fn the_wait_tells_every_pod_put_back_from_one_there_before(
            start_ns in 1_000_000_000_000_000_000i128..2_000_000_000_000_000_000i128,
            before_ns in 1i128..5_000_000_000i128,
            late_ns in 0i128..3_000_000_000i128,
            back_ns in 0i128..3_000_000_000i128,
            behind_ns in 0i128..=(CLOCK_MARGIN.as_nanos() as i128),
        ) {
            let t = ("ca-asg-provider.io/draining", "true", "NoSchedule");
            let stamped = |ns: i128| {
                let mut p = tolerating(pod("p"), r#"{"operator":"Exists"}"#);
                let secs = ns.div_euclid(1_000_000_000) as i64;
                p.metadata.creation_timestamp = Some(Time(Timestamp::from_second(secs).unwrap()));
                p
            };
            let started = Timestamp::from_nanosecond(start_ns).unwrap();
            proptest::prop_assert!(!is_replacement(&stamped(start_ns - before_ns), t, started));
            let wait = wait_before_evicting(&stamped(0), t, started, started).as_nanos() as i128;
            let asked = start_ns + wait + late_ns;
            let back = asked + back_ns - behind_ns;
            proptest::prop_assert!(is_replacement(&stamped(back), t, started));
        }
    }

    #[test]
    fn stuck_finished_and_unconfirmable_pods_are_not_waited_for() {
        let minute = std::time::Duration::from_secs(60);
        let deleting = |secs| {
            let mut p = pod("a");
            p.metadata.deletion_timestamp = Some(Time(at(secs)));
            p
        };
        assert_eq!(not_waited_for(&pod("a"), true, at(0), minute), None);
        assert_eq!(not_waited_for(&pod("a"), false, at(0), minute), None);
        assert_eq!(not_waited_for(&deleting(0), true, at(60), minute), None);
        assert!(
            not_waited_for(&deleting(0), true, at(61), minute).is_some_and(|w| w.contains("stuck"))
        );
        assert!(not_waited_for(&deleting(100), false, at(0), minute)
            .is_some_and(|w| w.contains("not Ready")));
        let mut done = deleting(100);
        done.status.as_mut().unwrap().phase = Some("Succeeded".into());
        done.metadata.finalizers = Some(vec!["example.com/hold".into()]);
        assert!(not_waited_for(&done, true, at(0), minute).is_some_and(|w| w.contains("finalizer")));
    }

    #[test]
    fn keep_leaves_daemonsets_alone() {
        let s = next_step(&[ds(pod("fluentd"))], Phase::Workloads);
        assert_eq!(s, Step::default());
        let plan = full_plan(&[ds(pod("fluentd")), pod("app")], false, test_now());
        assert_eq!(plan[0].1, Ok(Tier::Workload));
        assert!(plan[1].1.is_err());
    }

    #[test]
    fn full_plan_orders_by_tier_then_name_and_lists_skips_last() {
        let plan = full_plan(
            &[
                ds(pod("z-ds")),
                annotate(pod("m"), MIRROR_ANNOTATION, "x"),
                pod("b"),
                pod("a"),
                critical(pod("c")),
            ],
            true,
            test_now(),
        );
        let order: Vec<&str> = plan.iter().map(|(p, _)| p.name.as_str()).collect();
        assert_eq!(order, vec!["a", "b", "c", "z-ds", "m"]);
    }
}

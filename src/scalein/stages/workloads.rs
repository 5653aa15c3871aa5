//! The workload pods leave, tier by tier, through the Eviction API (a budget that
//! allows nothing waits), or the deadline's policy decides: `proceed` deletes each
//! pod left with its own grace period, `abandon` gives the node back. The tier loop
//! ([`phase`]) and a deadline's policy ([`deadline`]) serve the DaemonSet phases too.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use crate::clock::Instant;

use futures::future::join_all;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{DeleteParams, Preconditions};
use kube::Api;

use crate::scalein::decide::deadlock;
use crate::scalein::decide::plan::{self, Disposition, Tier};
use crate::scalein::decide::record::Plan;
use crate::scalein::kube::events::Reason;
use crate::scalein::kube::wait::NodePods;
use crate::scalein::stages::cordon;
use crate::scalein::stages::evict;
use crate::scalein::{DeadlinePolicy, Source};
use crate::telemetry::metrics::{metrics, KindLabels, StageLabels};

use crate::scalein::stages::port::{drain_taint, instant_of, NodeDrain, Runner, Stop};

/// How long a drain resumed past its workload deadline still waits for the first
/// list of the node's pods: it needs them for the DaemonSet phase.
const LIST_GRACE: Duration = Duration::from_secs(30);

/// How long a drain waits for the pass's first list of PodDisruptionBudgets before
/// its first eviction (usually no time: it lists while the pods do).
const BUDGETS_BEFORE_FIRST_EVICTION: Duration = Duration::from_secs(2);

/// Every workload pod leaves (tiered, through the Eviction API), or the
/// deadline's policy decides. Returns the node's pods for the stages after it.
pub(crate) async fn workloads(
    d: &NodeDrain<'_>,
    pass: &Arc<crate::scalein::kube::pass::Pass>,
    plan: &Plan,
) -> Result<NodePods, Stop> {
    let (r, node) = (d.r, d.node);
    let _stage = metrics().stage("workloads");
    let mut pods = pass.pods_of(node, r.port.drains_at_once());
    // The budgets' cache lists while the pods do, so the first evictions already
    // know what each budget allows (waited for briefly below; without it the API
    // server's 429s say the same, only dearer).
    let budgets_listed = pass.budgets();
    // Each reason's deadline counts from its own arrival; a budget only shortens.
    let workload_deadline = plan
        .workload_deadline
        .map(instant_of)
        .unwrap_or_else(Instant::now);
    // Fail closed: without the pod list nobody can tell what still runs there.
    if !pods
        .synced(workload_deadline.max(Instant::now() + LIST_GRACE))
        .await
    {
        return Err(Stop::Fail(format!(
            "could not list the pods of node {node}; the instance is not ended"
        )));
    }

    budgets_listed
        .ready(Instant::now() + BUDGETS_BEFORE_FIRST_EVICTION)
        .await;
    name_deadlocks(d, pass, &pods).await;
    say_cut_by_hook(d, plan).await;

    // CA's scale-in, whichever replica CA asked (a follower's drain reaches the
    // leader as a resumed or held one): CA's own taint on the Node says so.
    let fresh = d.source == Source::ClusterAutoscaler;
    if fresh
        || r.stage
            .nodes
            .has_taint(node, cordon::CA_TO_BE_DELETED_TAINT)
    {
        warn_daemonsets_evicted_early(d, &pods, fresh).await;
    }

    // With `proceed` the deadline ends the instance anyway: beside the evictions,
    // each pod still there is deleted at (deadline - its own grace).
    let counted = std::sync::atomic::AtomicBool::new(false);
    let on_time = delete_by_grace(d, pods.another(), workload_deadline, &counted);
    let evicting = phase(d, &mut pods, plan::Phase::Workloads, workload_deadline);
    let phased = if d.policy(plan.on_deadline) == DeadlinePolicy::Proceed {
        tokio::select! {
            r = evicting => r,
            never = on_time => match never {},
        }
    } else {
        evicting.await
    };
    match phased {
        Ok(()) => {
            r.stage
                .events
                .node(
                    node,
                    Reason::WorkloadsGone,
                    "every workload pod has exited".into(),
                )
                .await
        }
        Err(left) => {
            deadline(
                r,
                node,
                "workloads",
                plan.kept.workload_deadline,
                plan.on_deadline,
                left,
                !counted.load(std::sync::atomic::Ordering::Relaxed),
            )
            .await?;
            end_remaining_workloads(d, &mut pods).await?;
        }
    }
    Ok(pods)
}

/// At the drain's start, before its first eviction: the PodDisruptionBudgets that
/// can never allow the evictions it needs ([`deadlock::deadlocks`]), named at once in
/// one Event, on the Node's `DrainInProgress` condition and in a metric, instead of
/// when the deadline ends the wait. Information only: the evictions and the deadline
/// go on as they would.
async fn name_deadlocks(
    d: &NodeDrain<'_>,
    pass: &crate::scalein::kube::pass::Pass,
    pods: &NodePods,
) {
    if !pass.budgets().listed() {
        return;
    }
    let listed = pods.pods();
    let now = crate::clock::timestamp_now();
    let evicted: Vec<&Pod> = listed
        .iter()
        .filter(|p| {
            matches!(plan::classify_at(p, &d.r.stage.settings.node_critical, now), Disposition::Evict(t) if !t.is_daemonset())
                && !plan::is_replacement(p, drain_taint(), d.started)
                && d.not_waited_for(p).is_none()
        })
        .collect();
    let selecting: Vec<Vec<Arc<PodDisruptionBudget>>> = evicted
        .iter()
        .map(|p| {
            let ns = p.metadata.namespace.as_deref().unwrap_or("");
            let labels = p.metadata.labels.clone().unwrap_or_default();
            pass.budgets_selecting(ns, &labels)
                .into_iter()
                .map(|(b, _)| b)
                .collect()
        })
        .collect();
    let refs: Vec<Vec<&PodDisruptionBudget>> = selecting
        .iter()
        .map(|bs| bs.iter().map(|b| b.as_ref()).collect())
        .collect();
    let guarded: Vec<deadlock::Guarded<'_>> = evicted
        .iter()
        .zip(&refs)
        .map(|(pod, budgets)| deadlock::Guarded { pod, budgets })
        .collect();
    let found = deadlock::deadlocks(&guarded);
    if found.is_empty() {
        return;
    }
    for f in &found {
        metrics()
            .eviction_deadlocks
            .get_or_create(&KindLabels { kind: f.why.kind() })
            .inc();
    }
    let said: Vec<String> = found.iter().map(deadlock::Deadlock::said).collect();
    d.r.stage
        .events
        .node(
            d.node,
            Reason::EvictionDeadlocked,
            format!("{}; the {} ends the wait", said.join("; "), d.deadline_said),
        )
        .await;
    d.say_running("evicting workload pods", &said).await;
}

/// A drain our hook holds whose group's workload deadline would not leave the
/// DaemonSet and volume phases time inside the hook's global timeout: its workloads
/// get what the hook leaves ([`Plan::cut_by_hook`]). Said once at the phase's start.
async fn say_cut_by_hook(d: &NodeDrain<'_>, plan: &Plan) {
    let (true, Some(at), Some(room)) = (
        plan.cut_by_hook,
        plan.workload_deadline,
        plan.kept.hook_room,
    ) else {
        return;
    };
    let s = d.r.stage.settings;
    d.r.stage
        .events
        .node(
            d.node,
            Reason::DeadlineCutByHook,
            format!(
                "the workload deadline {} does not fit inside our lifecycle hook's global timeout (100 heartbeat timeouts, at most 48h, from the hold): the workloads get {} from the hold, until {}, so that the DaemonSet and volume phases ({}) and a margin ({}) end before AWS ends the instance; then what is left is deleted with its own grace period. Raise the hook's heartbeat timeout or lower the deadline (check-config says which groups)",
                crate::duration::format_duration(plan.kept.workload_deadline),
                crate::duration::format_duration(room),
                at.format("%Y-%m-%dT%H:%M:%SZ"),
                crate::duration::format_duration(s.after_workloads()),
                crate::duration::format_duration(s.hook_margin()),
            ),
        )
        .await;
}

/// CA left at `--daemonset-eviction-for-occupied-nodes=true` evicts DaemonSet pods
/// itself, with the workloads, before DeleteNodes: the log shipper is already going
/// when the drain starts. Say so once per drain, naming the pods and the fix.
async fn warn_daemonsets_evicted_early(d: &NodeDrain<'_>, pods: &NodePods, fresh: bool) {
    let listed = pods.pods();
    let early: Vec<String> = listed
        .iter()
        .filter(|p| plan::is_daemonset_pod(p) && p.metadata.deletion_timestamp.is_some())
        .map(|p| plan::pod_ref(p).to_string())
        .collect();
    // A drain that just started for CA cannot have evicted them itself. A resumed
    // one may have (its own DaemonSet phase): then only while workload pods are still
    // there is it CA's doing.
    let workloads_left = listed.iter().any(|p| {
        matches!(plan::classify_at(p, &d.r.stage.settings.node_critical, crate::clock::timestamp_now()), Disposition::Evict(t) | Disposition::Wait(t) if !t.is_daemonset())
    });
    if early.is_empty() || !(fresh || workloads_left) {
        return;
    }
    metrics()
        .daemonset_pods_evicted_early
        .inc_by(early.len() as u64);
    d.r
        .stage.events
        .node(
            d.node,
            Reason::DaemonSetEvictedEarly,
            format!(
                "DaemonSet pods were already terminating when the drain began ({}): cluster-autoscaler evicted them with the workloads, so logs written by the workloads' last seconds may be lost; run CA with --daemonset-eviction-for-occupied-nodes=false, or annotate the DaemonSet's pods cluster-autoscaler.kubernetes.io/enable-ds-eviction: \"false\"",
                early.join(", ")
            ),
        )
        .await;
}

/// Beside the evictions, with policy `proceed` (the instance ends at the deadline
/// whatever the budgets say): each workload pod still running is deleted at (deadline -
/// its own grace period) ([`plan::grace_deletions`]), so every pod gets its whole grace
/// before the deadline instead of all being deleted at it, and none earlier than that.
/// Runs until the phase ends (the caller drops it); past the deadline the phase's own
/// deadline handling takes over.
async fn delete_by_grace(
    d: &NodeDrain<'_>,
    mut pods: NodePods,
    deadline: Instant,
    counted: &std::sync::atomic::AtomicBool,
) -> std::convert::Infallible {
    let mut asked: BTreeSet<String> = BTreeSet::new();
    loop {
        let now = Instant::now();
        let left = deadline.saturating_duration_since(now);
        let listed = pods.pods();
        let running: Vec<&Pod> = listed
            .iter()
            .filter(|p| left_at_deadline(d, p) && !asked.contains(&plan::pod_ref(p).uid))
            .collect();
        let (due, next) = plan::grace_deletions(&running, left);
        if !due.is_empty() {
            asked.extend(due.iter().map(|r| r.uid.clone()));
            let view = &pods;
            let deletes = join_all(
                running
                    .iter()
                    .filter(|p| due.iter().any(|r| r.uid == plan::pod_ref(p).uid))
                    .map(|p| delete_until_accepted(d, view, p, Deleted::BeforeDeadline)),
            )
            .await;
            for (r, result) in deletes {
                match result {
                    Ok(true) => {
                        // The deadline decided: counted once per drain.
                        if !counted.swap(true, std::sync::atomic::Ordering::Relaxed) {
                            count_deadline(d.r, "workloads");
                        }
                        d.r.stage
                            .events
                            .node_about_pod(
                                d.node,
                                Reason::DeadlineHit,
                                format!(
                                    "deleted {r} with its own grace period so it is gone by the {} (the instance ends then whatever its budget says)",
                                    d.deadline_said
                                ),
                                &r,
                            )
                            .await
                    }
                    Ok(false) => {}
                    // The deadline's own delete tries it again.
                    Err(e) => {
                        tracing::warn!(node = d.node, pod = %r, error = %e, "could not delete a pod before the deadline; the deadline tries again");
                    }
                }
            }
        }
        if left.is_zero() {
            return std::future::pending().await;
        }
        let wake = next.map_or(deadline, |n| now + n).min(deadline);
        pods.next_change(wake).await;
    }
}

/// Why a workload pod is deleted rather than evicted, for its Event.
#[derive(Clone, Copy)]
enum Deleted {
    /// At the `proceed` deadline, what is left.
    AtDeadline,
    /// At (deadline - its grace), so it is gone by the deadline.
    BeforeDeadline,
}

/// How long a delete the API server refuses at a `proceed` deadline (APF's 429, a
/// 5xx, a webhook) is retried before the drain fails, the DaemonSet pods and the
/// instance left as they are (fail closed; a held or resumed drain tries again).
const DELETE_RETRY_FOR: Duration = Duration::from_secs(120);

/// Whether a `proceed` deadline ends this pod by a delete: a workload pod (evicted
/// or waited for, not a DaemonSet's), not a replacement that tolerates the drain
/// taint, and one the drain waits for. The deadline's own delete and the deletes at
/// (deadline - grace) before it choose by this one rule.
fn left_at_deadline(d: &NodeDrain<'_>, p: &Pod) -> bool {
    matches!(plan::classify_at(p, &d.r.stage.settings.node_critical, crate::clock::timestamp_now()), Disposition::Evict(t) | Disposition::Wait(t) if !t.is_daemonset())
        && !plan::is_replacement(p, drain_taint(), d.started)
        && d.not_waited_for(p).is_none()
}

/// A `proceed` deadline passed with workload pods left: the instance ends anyway, so
/// they are deleted now with their own grace period (preStop hooks run, SIGTERM
/// arrives), a refused delete retried with backoff, and the DaemonSet pods wait for
/// them, bounded by the longest grace. Fail closed: while one of them still runs and
/// is not terminating, the DaemonSet phase does not start.
async fn end_remaining_workloads(d: &NodeDrain<'_>, pods: &mut NodePods) -> Result<(), Stop> {
    let left: Vec<Pod> = pods
        .pods()
        .into_iter()
        .filter(|p| left_at_deadline(d, p))
        .collect();
    if left.is_empty() {
        return Ok(());
    }
    // Until the last of their grace periods ends: a pod already terminating by its
    // deletionTimestamp, not its spec (deleted with a longer grace, it runs on).
    let grace = plan::grace_left(&left, crate::clock::timestamp_now());
    let pods_ref: &NodePods = pods;
    let deletes = join_all(
        left.iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .map(|p| delete_until_accepted(d, pods_ref, p, Deleted::AtDeadline)),
    )
    .await;
    let mut deleted: Vec<plan::PodRef> = Vec::new();
    let mut refused = Vec::new();
    for (r, result) in deletes {
        match result {
            Ok(true) => deleted.push(r),
            Ok(false) => {}
            Err(e) => refused.push(format!("{r}: {e}")),
        }
    }
    // What was deleted, no more. About the first of them: an Event on the Node with
    // no related object would fold into the deadline's own Event series, note unseen.
    if let Some(first) = deleted.first() {
        let names: Vec<String> = deleted.iter().map(|r| r.to_string()).collect();
        d.r
            .stage.events
            .node_about_pod(
                d.node,
                Reason::DeadlineHit,
                format!(
                    "deleted {} workload pod(s) left at the deadline with their own grace period ({}); DaemonSet pods go after them",
                    names.len(),
                    names.join(", ")
                ),
                first,
            )
            .await;
    }
    if !refused.is_empty() {
        return Err(Stop::Fail(format!(
            "could not delete {} workload pod(s) left at the deadline ({}); the DaemonSet pods stay and the instance is not ended",
            refused.len(),
            refused.join("; ")
        )));
    }
    let uids: Vec<String> = left.iter().map(|p| plan::pod_ref(p).uid).collect();
    let by = Instant::now() + grace + Duration::from_secs(5);
    pods.wait_gone(&uids, by, |p| d.not_waited_for(p).is_some())
        .await;
    // Fail closed: a workload pod still there and not terminating (its delete was
    // undone, or never seen) keeps the DaemonSet pods.
    let running: Vec<String> = uids
        .iter()
        .filter_map(|u| pods.get(u))
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .map(|p| plan::pod_ref(&p).to_string())
        .collect();
    if !running.is_empty() {
        return Err(Stop::Fail(format!(
            "workload pod(s) still running after their delete at the deadline ({}); the DaemonSet pods stay and the instance is not ended",
            running.join(", ")
        )));
    }
    Ok(())
}

/// Deletes one pod left at a `proceed` deadline with its own grace period, retrying
/// what the API server refuses with backoff for [`DELETE_RETRY_FOR`]. `Ok(true)`:
/// deleted by this call; `Ok(false)`: gone, replaced or terminating without it.
async fn delete_until_accepted(
    d: &NodeDrain<'_>,
    pods: &NodePods,
    p: &Pod,
    why: Deleted,
) -> (plan::PodRef, Result<bool, String>) {
    let r = plan::pod_ref(p);
    tokio::time::sleep(d.wait_before_evicting(p)).await;
    let api: Api<Pod> = Api::namespaced(d.r.stage.client.clone(), &r.namespace);
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(r.uid.clone()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    let give_up = Instant::now() + DELETE_RETRY_FOR;
    let mut backoff = Duration::from_millis(200);
    loop {
        let terminating = pods
            .get(&r.uid)
            .is_none_or(|p| p.metadata.deletion_timestamp.is_some());
        if terminating {
            return (r, Ok(false));
        }
        match api.delete(&r.name, &params).await {
            Ok(_) => {
                d.r
                    .stage.events
                    .pod(
                        &r,
                        d.node,
                        Reason::PodEvicted,
                        match why {
                            Deleted::AtDeadline => format!(
                                "deleted by ca-asg-provider with its own grace period: node {} is being drained ({}) and the workload deadline passed",
                                d.node, d.why
                            ),
                            Deleted::BeforeDeadline => format!(
                                "deleted by ca-asg-provider with its own grace period: node {} is being drained ({}) and ends at its workload deadline, which leaves this pod no more than its grace",
                                d.node, d.why
                            ),
                        },
                    )
                    .await;
                return (r, Ok(true));
            }
            // Gone, or another pod of the same name (the uid precondition failed).
            Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => return (r, Ok(false)),
            Err(e) => {
                let wait =
                    backoff.mul_f64(0.5 + 0.5 * crate::clock::random_fraction(&r.to_string()));
                if Instant::now() + wait >= give_up {
                    return (r, Err(e.to_string()));
                }
                tracing::warn!(node = d.node, pod = %r, error = %e, retry_in = ?wait, "could not delete a pod left at the deadline; retrying");
                tokio::time::sleep(wait).await;
                backoff = (backoff * 2).min(Duration::from_secs(10));
            }
        }
    }
}

/// A phase deadline passed with `left` pods still there: apply the policy, loudly.
/// `count`: whether this deadline still goes in the counts (a drain whose pods were
/// already deleted before it, at (deadline - grace), was counted then).
pub(crate) async fn deadline(
    r: &Runner<'_>,
    node: &str,
    what: &str,
    limit: Duration,
    policy: DeadlinePolicy,
    left: usize,
    count: bool,
) -> Result<(), Stop> {
    if count {
        count_deadline(r, what);
    }
    let note = format!(
        "{what} deadline {limit:?} passed with {left} pod(s) still on the node; policy {}",
        policy.as_str()
    );
    r.stage
        .events
        .node(node, Reason::DeadlineHit, note.clone())
        .await;
    match policy {
        DeadlinePolicy::Proceed => Ok(()),
        DeadlinePolicy::Abandon => Err(Stop::Abandon(note)),
    }
}

/// A deadline of `what` decided something: in the stats and `drain_deadlines_hit_total`.
fn count_deadline(r: &Runner<'_>, what: &str) {
    r.stage
        .stats
        .deadlines_hit
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    metrics()
        .deadlines
        .get_or_create(&StageLabels {
            stage: what.to_string(),
        })
        .inc();
}

/// Runs tiers until nothing of the phase is left. `Err(n)`: the deadline passed with
/// `n` pods left. Pods that arrived after the drain began and tolerate its taint are
/// not chased; pods stuck terminating, finished, or on a node whose kubelet cannot
/// confirm them are not waited for; each gets one Event saying so.
pub(crate) async fn phase(
    d: &NodeDrain<'_>,
    pods: &mut NodePods,
    which: plan::Phase,
    deadline: Instant,
) -> Result<(), usize> {
    let mut evicted: BTreeSet<String> = BTreeSet::new();
    let mut told: BTreeSet<String> = BTreeSet::new();
    loop {
        let (current, skipped) = pods_of_phase(d, pods, which, &evicted, &mut told);
        say_not_waited_for(d, skipped).await;
        let step = plan::next_step_with(
            &current,
            which,
            &d.r.stage.settings.node_critical,
            crate::clock::timestamp_now(),
        );
        let Some(tier) = step.tier else { return Ok(()) };
        say_tier(d, tier, &step, &mut told).await;
        let accepted = evict_tier(d, pods, &step, &current, deadline).await;
        evicted.extend(step.evict.iter().map(|p| p.uid.clone()));
        tier_gone(d, pods, &step, &accepted, deadline).await?;
    }
}

/// The pods on the node this phase still waits for, and (once per pod, `told`
/// remembers) the pods it will not wait for, with why: finished pods a finalizer
/// keeps, replacements that tolerate the drain taint, and pods `not_waited_for`
/// names.
fn pods_of_phase(
    d: &NodeDrain<'_>,
    pods: &NodePods,
    which: plan::Phase,
    evicted: &BTreeSet<String>,
    told: &mut BTreeSet<String>,
) -> (Vec<Pod>, Vec<(plan::PodRef, &'static str)>) {
    let mut skipped: Vec<(plan::PodRef, &'static str)> = Vec::new();
    let current: Vec<Pod> = pods
        .pods()
        .into_iter()
        .filter(|p| {
            let r = plan::pod_ref(p);
            let in_phase = match plan::classify_at(p, &d.r.stage.settings.node_critical, crate::clock::timestamp_now()) {
                Disposition::Evict(t) | Disposition::Wait(t) => which.takes(t),
                Disposition::Skip(_) => {
                    // A finished pod a finalizer keeps: say once why it stays.
                    let held = p.metadata.deletion_timestamp.is_some()
                        && p.metadata.finalizers.as_ref().is_some_and(|f| !f.is_empty());
                    if held && which == plan::Phase::Workloads && told.insert(r.uid.clone()) {
                        if let Some(why) = d.not_waited_for(p) {
                            skipped.push((r.clone(), why));
                        }
                    }
                    false
                }
            };
            if !in_phase {
                return true;
            }
            if !evicted.contains(&r.uid) && plan::is_replacement(p, drain_taint(), d.started) {
                if told.insert(r.uid.clone()) {
                    skipped.push((r.clone(), "it arrived after the drain began and tolerates the drain taint; it ends with the instance"));
                }
                return false;
            }
            if let Some(why) = d.not_waited_for(p) {
                if told.insert(r.uid.clone()) {
                    skipped.push((r.clone(), why));
                }
                return false;
            }
            true
        })
        .collect();
    (current, skipped)
}

/// One `PodNotWaitedFor` Event per pod the phase will not wait for.
async fn say_not_waited_for(d: &NodeDrain<'_>, skipped: Vec<(plan::PodRef, &'static str)>) {
    for (pod, why) in skipped {
        d.r.stage
            .events
            .node_about_pod(
                d.node,
                Reason::PodNotWaitedFor,
                format!("{pod}: {why}"),
                &pod,
            )
            .await;
    }
}

/// The Events of a tier that waits instead of evicting (pods that run to completion,
/// each said once) or evicts pods that asked not to be disrupted.
async fn say_tier(d: &NodeDrain<'_>, tier: Tier, step: &plan::Step, told: &mut BTreeSet<String>) {
    let (r, node) = (d.r, d.node);
    if tier == Tier::OnCompletion {
        let new: Vec<String> = step
            .wait
            .iter()
            .filter(|p| told.insert(format!("completion:{}", p.uid)))
            .map(|p| p.to_string())
            .collect();
        if !new.is_empty() {
            r
                .stage.events
                .node(node, Reason::WaitingForCompletion, format!("waiting for pods that run to completion (cluster-autoscaler.kubernetes.io/safe-to-evict: on-completion) to finish: {}; nothing is evicted, and the workload deadline's policy applies if they are still running then", new.join(", ")))
                .await;
        }
    }
    if tier == Tier::DoNotDisrupt && !step.evict.is_empty() {
        let names: Vec<String> = step.evict.iter().map(|p| p.to_string()).collect();
        r
            .stage.events
            .node(node, Reason::EvictingDoNotDisrupt, format!("evicting pods that asked not to be disrupted ({}): the instance is ending anyway, so they go last among workloads", names.join(", ")))
            .await;
    }
}

/// Evicts the tier's pods at once, each after its own wait (`wait_before_evicting`),
/// each until the API server accepts or the deadline; one answer per pod, in order.
async fn evict_tier(
    d: &NodeDrain<'_>,
    pods: &NodePods,
    step: &plan::Step,
    current: &[Pod],
    deadline: Instant,
) -> Vec<bool> {
    let (r, node) = (d.r, d.node);
    let waits: BTreeMap<String, Duration> = current
        .iter()
        .map(|p| (plan::pod_ref(p).uid, d.wait_before_evicting(p)))
        .collect();
    join_all(step.evict.iter().map(|p| {
        let uid = p.uid.clone();
        let wait = waits.get(&uid).copied().unwrap_or_default();
        async move {
            tokio::time::sleep(wait).await;
            evict::until_accepted(&r.stage, node, p, d.why, deadline, move || {
                pods.contains(&uid)
            })
            .await
        }
    }))
    .await
}

/// Waits until the tier's pods (evicted and waited for) are gone. `Err(n)`: the
/// deadline passed, or an eviction was never accepted, with `n` of them left that the
/// drain waits for.
async fn tier_gone(
    d: &NodeDrain<'_>,
    pods: &mut NodePods,
    step: &plan::Step,
    accepted: &[bool],
    deadline: Instant,
) -> Result<(), usize> {
    let uids: Vec<String> = step
        .evict
        .iter()
        .chain(step.wait.iter())
        .map(|p| p.uid.clone())
        .collect();
    let gone = accepted.iter().all(|a| *a)
        && pods
            .wait_gone(&uids, deadline, |p| d.not_waited_for(p).is_some())
            .await;
    if !gone {
        let left = uids
            .iter()
            .filter(|u| pods.get(u).is_some_and(|p| d.not_waited_for(&p).is_none()))
            .count();
        return Err(left);
    }
    tracing::debug!(
        node = d.node,
        tier = step.tier.map(Tier::as_str),
        count = uids.len(),
        "tier gone"
    );
    Ok(())
}

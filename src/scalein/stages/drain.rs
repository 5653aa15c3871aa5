//! The stage list and its runner: locate the node, mark it, take a slot, run the
//! phases in order (the workloads, the DaemonSet pods, the volumes, the node-critical
//! DaemonSet pods), then end the instance, or give the node back at a deadline whose
//! policy abandons. The engine only through [`DrainPort`]. Deadlines count from the
//! drain's recorded start, so a resumed drain keeps its original deadlines.

use std::time::Duration;

use crate::clock::Instant;

use backon::{ExponentialBuilder, Retryable};
use k8s_openapi::api::core::v1::Pod;
use tracing::Instrument;

use crate::scalein::decide::conditions::DrainState;
use crate::scalein::decide::plan::{self, Disposition, Tier};
use crate::scalein::decide::record::{DrainRecord, End, How, Plan};
use crate::scalein::decide::story::Verdict;
use crate::scalein::kube::events::Reason;
use crate::scalein::kube::wait::NodePods;
use crate::scalein::stages::cordon::{self, Cordoned};
use crate::scalein::stages::{terminate, volumes};
use crate::scalein::{DaemonSetPolicy, DrainRequest, Mode, Outcome};
use crate::telemetry::metrics::{metrics, KindLabels, SourceLabels, SourceOutcomeLabels};

use crate::scalein::stages::daemonsets::daemonset_phase;
use crate::scalein::stages::port::{instant_of, DrainPort, NodeDrain, Runner, Stop};
use crate::scalein::stages::workloads::workloads;

/// The Node's record says our hook's action on the instance was completed before (by
/// a process that has since restarted, or another replica), so there is nothing to
/// drain or complete. AWS confirms before the hold is let go: not ours, another hook
/// (EKS's) holds the instance; ours after all (the record is older than this action,
/// now closed) or AWS unanswered, the hold is left to the lifecycle scan, which asks
/// AWS again and drains it as the new action it is.
async fn let_go_of_a_finished_action(r: &Runner<'_>, req: &DrainRequest) {
    let verdict = r.port.confirm_finished(&req.group, &req.instance_id).await;
    if verdict == Verdict::NotOurs {
        tracing::info!("our lifecycle action for this instance was completed before (the Node's record says so, AWS agrees); nothing to drain or complete");
        r.ending.port.action_done(&req.instance_id);
    } else {
        tracing::warn!(verdict = ?verdict, "the Node's record says our lifecycle action for this instance was completed before, but AWS does not confirm it; left to the lifecycle scan");
    }
    r.port.release(&req.instance_id);
}

/// `run`: which run of the instance's drain this is (its slot follows it across a
/// restart for a new reason).
pub async fn run(r: &Runner<'_>, req: &DrainRequest, run: u64) -> Outcome {
    let span = tracing::info_span!(
        "drain",
        instance = %req.instance_id,
        group = %req.group,
        mode = req.mode.as_str(),
        source = ?req.source,
        node = tracing::field::Empty,
    );
    let outcome = run_inner(r, req, run).instrument(span).await;
    // Past its first try to cordon, whatever came of this one (a Node that could not
    // be found, a failed drain tried again later): the others wait for no more.
    r.port.marked(run);
    outcome
}

async fn run_inner(r: &Runner<'_>, req: &DrainRequest, run: u64) -> Outcome {
    let node = match locate_node(r, req).await {
        Ok(n) => n,
        Err(why) => return Outcome::Failed(why),
    };
    if let Some(n) = &node {
        tracing::Span::current().record("node", n.as_str());
    }
    let drained = match &node {
        Some(n) => drain_node(r, req, n, run).await,
        None => {
            tracing::info!(
                "the API server has no Node for this instance (never registered or already gone); nothing to drain"
            );
            metrics().drains_without_node.inc();
            Ok(None)
        }
    };
    // How the instance ends: as every reason on the Node says (the strongest
    // decides), or as the request says when there is no Node.
    let (mode, budget) = match &drained {
        Ok(Some(plan)) => {
            if !plan.drains {
                // Every reason is done or cordon-only (a resume found nothing to do).
                if let End::Lifecycle { .. } = plan.ends {
                    let_go_of_a_finished_action(r, req).await;
                }
                return Outcome::Drained;
            }
            (ending(r, req, &plan.ends).await, plan.budget_ends)
        }
        _ => (req.mode.clone(), None),
    };
    let began = match &drained {
        Ok(Some(plan)) => plan.began,
        _ => None,
    };
    let outcome = match drained {
        Ok(_) => {
            match terminate::finish(
                &r.ending,
                &mode,
                &req.group,
                &req.instance_id,
                node.as_deref(),
            )
            .await
            {
                Ok(_) if mode == Mode::DrainOnly => {
                    if let Some(n) = &node {
                        record_end(r, n, How::Drained, Done::Mark).await;
                    }
                    Outcome::Drained
                }
                Ok(_) => {
                    if let Some(b) = began {
                        let took = (crate::clock::utc_now() - b).to_std().unwrap_or_default();
                        metrics()
                            .drain_start_to_end
                            .get_or_create(&SourceLabels {
                                source: req.source.label(),
                            })
                            .observe(took.as_secs_f64());
                    }
                    if let Some(n) = &node {
                        if matches!(mode, Mode::Lifecycle { .. }) {
                            r.port.release(&req.instance_id);
                            // On the Node, for a restart or a new leader: AWS keeps
                            // showing Terminating:Wait while another hook holds on.
                            record_end(r, n, How::Ending, Done::Mark).await;
                        } else {
                            // CA's scale-in stays until AWS shows the instance gone
                            // (the accounting follows it); its followers read the end.
                            record_end(r, n, How::Ending, Done::Keep).await;
                        }
                    }
                    Outcome::Ended
                }
                Err(e) => {
                    let why = format!("could not end instance {}: {e}", req.instance_id);
                    if let Some(n) = &node {
                        failed(r, &mode, n, &why).await;
                    }
                    Outcome::Failed(e)
                }
            }
        }
        Err(Stop::Abandon(why)) => {
            abandon(r, req, &mode, node.as_deref(), &why).await;
            Outcome::Abandoned(why)
        }
        Err(Stop::Fail(why)) => {
            if let Some(n) = &node {
                failed(r, &mode, n, &why).await;
            }
            Outcome::Failed(why)
        }
    };
    if let (Some(ends), Some(n)) = (budget, &node) {
        interruption_timing(r, n, ends).await;
    }
    if let (Some((kind, at)), Outcome::Ended | Outcome::Drained) = (req.noticed, &outcome) {
        let took = (crate::clock::utc_now() - at).to_std().unwrap_or_default();
        metrics()
            .notice_to_end
            .get_or_create(&KindLabels { kind })
            .observe(took.as_secs_f64());
    }
    outcome
}

/// The mode the drain ends in, from the record's plan: our hook's action (the
/// request's, with its token, or one built from the group and our configured
/// `hookName`, held at the hook's heartbeat timeout as AWS has it now), CA's direct
/// termination, or nothing. The hook named in the record is read back from the Node
/// (a hand edit, a forged annotation, a `hookName` since changed): it is never the
/// name of the action completed, so another tool's action is never completed.
async fn ending(r: &Runner<'_>, req: &DrainRequest, ends: &End) -> Mode {
    match ends {
        End::Lifecycle { .. } if matches!(req.mode, Mode::Lifecycle { .. }) => req.mode.clone(),
        End::Lifecycle { hook } => {
            let ours = &r.stage.settings.hook_name;
            if !hook.is_empty() && hook != ours {
                tracing::warn!(instance = %req.instance_id, recorded = %hook, ours = %ours, "the Node's drain record names a hook that is not ours; only our own hook's action is completed");
            }
            let action = crate::cloud::LifecycleAction {
                group: req.group.clone(),
                hook: ours.clone(),
                instance_id: req.instance_id.clone(),
                token: None,
            };
            // AWS's word now; else what the hold already follows; else the
            // configured value.
            let heartbeat_timeout = match r.port.hook_timeout_now(&req.group).await {
                Some(t) => t,
                None => r
                    .port
                    .held_timeout(&req.instance_id)
                    .unwrap_or(r.stage.settings.hook_heartbeat_timeout),
            };
            r.port.hold(&action, heartbeat_timeout);
            Mode::Lifecycle {
                action,
                heartbeat_timeout,
            }
        }
        End::Terminate => Mode::Direct,
        End::Leave => Mode::DrainOnly,
    }
}

/// Whether a drain's end marks its reasons done.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Done {
    /// Done: a restart does not drain the node again (it stays cordoned until a new
    /// reason comes or someone uncordons it).
    Mark,
    /// The reasons stay as they are; only the end is written (for the followers).
    Keep,
}

/// The drain ended `how`: written on the Node in one update, with its reasons done
/// or kept ([`Done`]).
async fn record_end(r: &Runner<'_>, node: &str, how: How, done: Done) {
    let at = crate::clock::utc_now();
    let written = crate::scalein::kube::node_record::update_record(
        r.stage.nodes,
        r.stage.client,
        node,
        |r| {
            let before = r.clone();
            match done {
                Done::Mark => r.end(how.clone(), at),
                Done::Keep => r.note_end(how.clone(), at),
            }
            *r != before
        },
    )
    .await;
    if let Err(e) = written {
        tracing::warn!(node, error = %e, "could not record how the drain ended; a restart may drain the node again");
    }
}

/// The drain could not go on: an Event for people and, unless our hook holds the
/// instance (the engine tries that drain again), the end on the Node for its
/// followers. The reasons stay: a restarted service resumes the drain.
async fn failed(r: &Runner<'_>, mode: &Mode, node: &str, why: &str) {
    r.stage
        .events
        .node(node, Reason::DrainFailed, why.to_string())
        .await;
    // Under our hook the engine tries again at once: the drain still runs.
    if !matches!(mode, Mode::Lifecycle { .. }) {
        let state = DrainState::Stopped {
            reason: "DrainFailed",
            message: format!("the drain stopped: {why}; the node stays cordoned and a restarted service resumes it"),
        };
        r.stage.say_state(node, &state).await;
        let how = How::Failed {
            why: why.to_string(),
        };
        record_end(r, node, how, Done::Keep).await;
    }
}

/// How an interruption drain stood against the time AWS ends the instance.
async fn interruption_timing(r: &Runner<'_>, node: &str, ends: chrono::DateTime<chrono::Utc>) {
    let now = Instant::now();
    let ends_at = instant_of(ends);
    if now <= ends_at {
        let left = ends_at - now;
        r.stage
            .events
            .node(
                node,
                Reason::InterruptionDrained,
                format!(
                    "interruption drain finished {:.1} s before AWS ends the instance",
                    left.as_secs_f64()
                ),
            )
            .await;
    } else {
        metrics().interruption_budget_missed.inc();
        r.stage
            .events
            .node(
                node,
                Reason::InterruptionBudgetMissed,
                format!(
                    "interruption drain still ran {:.1} s after the time AWS ends the instance",
                    (now - ends_at).as_secs_f64()
                ),
            )
            .await;
    }
}

/// Fail closed: the drain goes on only with the instance's Node, or with the API
/// server's word that there is none. While the cache is not synced or the API server
/// cannot be asked (down, RBAC), it retries until the workload deadline and then
/// fails without ending the instance.
async fn locate_node(r: &Runner<'_>, req: &DrainRequest) -> Result<Option<String>, String> {
    let give_up = Instant::now() + r.port.limits_of(req).workload_deadline;
    let policy = ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(200))
        .with_max_delay(Duration::from_secs(15))
        .without_max_times();
    (|| r.stage.find_node(&req.instance_id, req.node_name.as_deref()))
        .retry(policy)
        .sleep(tokio::time::sleep)
        // Another try only if it can start before the deadline.
        .adjust(|_, next| next.filter(|d| Instant::now() + *d < give_up))
        .notify(|e, retry_in| {
            tracing::warn!(error = %e, ?retry_in, "cannot tell whether the instance has a Node; not ending it, retrying");
        })
        .await
        .map_err(|e| {
            format!(
                "cannot tell whether instance {} has a Node ({e}); the instance is not ended",
                req.instance_id
            )
        })
}

pub(crate) struct AbortOnDrop(pub(crate) tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn abandon(r: &Runner<'_>, req: &DrainRequest, mode: &Mode, node: Option<&str>, why: &str) {
    let mut given = cordon::GivenBack::Schedulable;
    let what = match mode {
        Mode::Direct => {
            if let Some(n) = node {
                // CA's scale-in goes back to CA; other reasons on the Node (a
                // rebalance cordon) keep it cordoned.
                let at = crate::clock::utc_now();
                let rest = crate::scalein::kube::node_record::update_record(
                    r.stage.nodes,
                    r.stage.client,
                    n,
                    |r| {
                        r.without_scale_in();
                        r.end(abandoned(why), at);
                        true
                    },
                )
                .await;
                let give_back = match rest {
                    Ok(Some(r)) => r.reasons.is_empty(),
                    Ok(None) => true,
                    Err(e) => {
                        tracing::warn!(node = n, error = %e, "could not update the drain record of the abandoned node");
                        true
                    }
                };
                if give_back {
                    match cordon::uncordon(&r.stage, n).await {
                        Ok(g) => given = g,
                        Err(e) => {
                            tracing::warn!(node = n, error = %e, "could not uncordon the abandoned node")
                        }
                    }
                }
            }
            if let Some(p) = &r.ending.provider {
                p.deferred_cancelled(&req.instance_id);
            }
            match given {
                cordon::GivenBack::Schedulable => "the node is uncordoned and stays (unless another reason keeps it cordoned); the target size is restored",
                cordon::GivenBack::CordonKept => "the node stays and the target size is restored",
            }
        }
        // Not reached: lifecycle deadlines always proceed (see DeadlinePolicy).
        Mode::Lifecycle { .. } => "heartbeats go on; the hook's timeout ends the instance",
        Mode::DrainOnly => {
            if let Some(n) = node {
                record_end(r, n, abandoned(why), Done::Mark).await;
            }
            "the node stays cordoned"
        }
    };
    if let Some(n) = node {
        // The Event first: a `drain NODE` following this drain stops reading Events
        // soon after the record leaves the Node.
        r.stage
            .events
            .node(
                n,
                Reason::DrainAbandoned,
                format!("drain abandoned: {why}; {what}{}", given.note()),
            )
            .await;
        let state = DrainState::Stopped {
            reason: "DrainAbandoned",
            message: format!("drain abandoned: {why}; {what}"),
        };
        r.stage.say_state(n, &state).await;
    }
}

fn abandoned(why: &str) -> How {
    How::Abandoned {
        why: why.to_string(),
    }
}

/// The drain of a node, stage by stage: mark it, wait for a slot, say why, then the
/// workload pods, the DaemonSet pods, the volumes and the node-critical DaemonSet
/// pods. `Ok(None)`: the Node is gone. A plan that drains nothing (every reason done
/// or cordon-only) ends once the node is marked.
async fn drain_node(
    r: &Runner<'_>,
    req: &DrainRequest,
    node: &str,
    run: u64,
) -> Result<Option<Plan>, Stop> {
    let marked = mark(r, req, node).await;
    r.port.marked(run);
    let Some((record, plan)) = marked? else {
        return Ok(None);
    };
    if !plan.drains {
        return Ok(Some(plan));
    }
    let _slot = queue_for_slot(r, req, node, &record, run).await;
    cordons_first(r, run).await;
    say_started(r, req, node, &record).await;
    let d = NodeDrain::new(r, req, node, &record, &plan);
    let began = Instant::now();
    let phases = pod_phases(&d, &plan).await;
    metrics()
        .drain_duration
        .get_or_create(&SourceOutcomeLabels {
            source: req.source.label(),
            outcome: match &phases {
                Ok(()) => "drained",
                Err(Stop::Abandon(_)) => "abandoned",
                Err(Stop::Fail(_)) => "failed",
            },
        })
        .observe(began.elapsed().as_secs_f64());
    phases?;
    say_drained(&d, &plan).await;
    Ok(Some(plan))
}

/// The pod phases in order, each said on the Node as it begins: the workloads, the
/// DaemonSet pods, the volumes, the node-critical DaemonSet pods.
async fn pod_phases(d: &NodeDrain<'_>, plan: &Plan) -> Result<(), Stop> {
    let r = d.r;
    d.say_running("evicting workload pods", &[]).await;
    // Held to the end of the drain: the caches this drain shares with the others.
    let pass = r.stage.passes.join();
    let mut pods = workloads(d, &pass, plan).await?;
    let daemonsets_last = r.stage.settings.daemonsets == DaemonSetPolicy::EvictLast;
    if daemonsets_last {
        d.say_running("workload pods gone; evicting DaemonSet pods", &[])
            .await;
        let _stage = metrics().stage("daemonsets");
        daemonset_phase(d, &mut pods, plan::Phase::DaemonSets).await?;
    }
    d.say_running("waiting for volumes to detach", &[]).await;
    volumes_detach(d, &pods).await;
    // kube-proxy, the CNI, CSI node plugins: after the volumes.
    if daemonsets_last {
        let _stage = metrics().stage("critical-daemonsets");
        daemonset_phase(d, &mut pods, plan::Phase::CriticalDaemonSets).await?;
    }
    Ok(())
}

/// The drain's pods are gone: `Drained=True` on the Node, before the instance ends.
async fn say_drained(d: &NodeDrain<'_>, plan: &Plan) {
    let next = match plan.ends {
        End::Leave => "the instance stays (drain without --terminate); the node stays cordoned",
        End::Terminate | End::Lifecycle { .. } => {
            "the instance ends next, once its load balancers let it go"
        }
    };
    let state = DrainState::Drained {
        reason: d.condition_reason.to_string(),
        message: format!("the workload and DaemonSet pods are gone; {next}"),
    };
    d.r.stage.say_state(d.node, &state).await;
}

/// Cordon and mark the node with every reason; what they plan together.
/// `None`: the Node is gone.
async fn mark(
    r: &Runner<'_>,
    req: &DrainRequest,
    node: &str,
) -> Result<Option<(DrainRecord, Plan)>, Stop> {
    let _stage = metrics().stage("cordon");
    let limits = r.port.limits_of(req);
    match cordon::cordon(&r.stage, node, &req.reasons, &req.group, Some(limits)).await {
        Ok(Cordoned::NodeGone) => {
            tracing::info!(node, "the Node object is gone; nothing to drain");
            Ok(None)
        }
        Ok(Cordoned::Marked { record, .. }) => {
            let plan = record.plan(limits);
            Ok(Some((record, plan)))
        }
        Err(e) => Err(Stop::Fail(format!("could not cordon node {node}: {e}"))),
    }
}

/// A slot the disruption budgets give (`maxConcurrentDrains` is one of them). The
/// node is already cordoned and marked whatever the wait, so nothing is placed on a node that is going away
/// while its drain waits (in an instance refresh, replacements landed on the next
/// nodes of the refresh and were evicted again: 12% more evictions at 500 nodes).
///
/// The slot is kept in the engine's book, not in this task: a drain restarted for a
/// new reason (a spot warning joining a running drain) goes on in the slot the run
/// it replaced had, instead of queueing behind drains that budgets block.
async fn queue_for_slot<'e>(
    r: &'e Runner<'e>,
    req: &DrainRequest,
    node: &str,
    record: &DrainRecord,
    run: u64,
) -> Option<Slot<'e>> {
    let instance = &req.instance_id;
    let slot = Slot {
        port: r.port,
        instance: instance.to_string(),
        run,
    };
    if r.port.has_slot(instance, run) {
        return Some(slot);
    }
    let _queued = metrics().stage("queued");
    r.port
        .take_slot(req, node, record, run)
        .await
        .then_some(slot)
}

/// Cordons first, once the drain has its slot and before its first eviction: the
/// drains asked for beside it (an instance refresh ending many instances at once, a
/// scan finding them together) cordon their nodes before this one evicts anything,
/// so that nothing it evicts is placed on a node about to drain and evicted again
/// (the real control plane placed a replacement on a node whose cordon came a moment
/// after the first eviction). Bounded: past the wait, the drain goes on and says so.
async fn cordons_first(r: &Runner<'_>, run: u64) {
    let left = r.port.cordons_first(run).await;
    if left > 0 {
        tracing::warn!(
            left,
            "drains asked for before this one have still not cordoned their nodes; evicting anyway (a pod evicted now may be placed on one of those nodes and evicted again)"
        );
    }
}

/// A drain run's hold on its slot: given back when the run ends, unless a newer
/// run of the same instance's drain took it over.
struct Slot<'e> {
    port: &'e dyn DrainPort,
    instance: String,
    run: u64,
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.port.give_back_slot(&self.instance, self.run);
    }
}

/// The node's `DrainStarted` Event: every reason, who asked, the DaemonSet policy.
async fn say_started(r: &Runner<'_>, req: &DrainRequest, node: &str, record: &DrainRecord) {
    let reasons: Vec<String> = record
        .reasons
        .iter()
        .filter(|r| !r.done)
        .map(|r| format!("{} since {}", r.why.label(), r.at.format("%H:%M:%S")))
        .collect();
    let note = format!(
        "draining node for instance {}{} ({}; asked by {}); workloads first, DaemonSet pods {}",
        req.instance_id,
        if req.group.is_empty() {
            String::new()
        } else {
            format!(" of group {}", req.group)
        },
        reasons.join(", "),
        req.source.said(),
        match r.stage.settings.daemonsets {
            DaemonSetPolicy::EvictLast => "last",
            DaemonSetPolicy::Keep => "kept",
        }
    );
    r.stage.events.node(node, Reason::DrainStarted, note).await;
}

/// The node's VolumeAttachments detach, but not those of pods that stay
/// on the node (node-critical DaemonSet pods); past the volume deadline the drain
/// goes on and says so.
async fn volumes_detach(d: &NodeDrain<'_>, pods: &NodePods) {
    let (r, node) = (d.r, d.node);
    let _stage = metrics().stage("volumes");
    let staying: Vec<Pod> = pods
        .pods()
        .into_iter()
        .filter(|p| {
            !matches!(
                plan::classify_at(
                    p,
                    &r.stage.settings.node_critical,
                    crate::clock::timestamp_now()
                ),
                Disposition::Evict(Tier::CriticalDaemonSet)
                    | Disposition::Wait(Tier::CriticalDaemonSet)
            )
        })
        .collect();
    let staying = volumes::volumes_of(&r.stage, &staying).await;
    let volume_deadline = r.stage.settings.volume_deadline;
    let left =
        volumes::wait_detached(&r.stage, node, Instant::now() + volume_deadline, &staying).await;
    if left.is_empty() {
        r.stage
            .events
            .node(
                node,
                Reason::VolumesDetached,
                "no VolumeAttachment left on the node".into(),
            )
            .await;
    } else {
        r
            .stage.events
            .node(node, Reason::DeadlineHit, format!("volume detach deadline {:?} passed with {} attachment(s) left ({}); proceeding", volume_deadline, left.len(), left.join(", ")))
            .await;
    }
}

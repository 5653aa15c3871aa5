//! The drain of one node: cordon, workloads (tiered, PDB-aware), DaemonSets last,
//! volumes, then end the instance. Deadlines count from the drain's recorded start, so
//! a resumed drain keeps its original deadlines.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use crate::clock::Instant;

use backon::{ExponentialBuilder, Retryable};
use futures::future::join_all;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, Preconditions};
use kube::Api;
use tracing::Instrument;

use crate::cloud::LifecycleAction;
use crate::scalein::decide::plan::{self, Disposition, Tier};
use crate::scalein::decide::record::{DrainRecord, End, How, Plan};
use crate::scalein::decide::story::Verdict;
use crate::scalein::kube::events::Reason;
use crate::scalein::kube::wait::NodePods;
use crate::scalein::stages::cordon::{self, Cordoned};
use crate::scalein::stages::Stage;
use crate::scalein::stages::{evict, terminate, volumes};
use crate::scalein::{DaemonSetPolicy, DeadlinePolicy, DrainRequest, Mode, Outcome, Source};
use crate::telemetry::metrics::{metrics, KindLabels, StageLabels};

/// What the stage list's runner needs of the engine, besides what a stage reaches:
/// the `maxConcurrentDrains` slots, our hook's hold on the instance (its heartbeats
/// and their timeout), what is remembered of our actions, and how many drains run.
/// The engine implements it; the runner never reaches the engine or its book.
#[async_trait::async_trait]
pub trait DrainPort: Send + Sync {
    /// Whether this run of the instance's drain already holds a slot (a run it
    /// replaced for a new reason kept it).
    fn has_slot(&self, instance_id: &str, run: u64) -> bool;
    /// Waits for a slot and keeps it for this run. False: no slot can be had (the
    /// engine is going away); the drain goes on without one.
    async fn take_slot(&self, instance_id: &str, run: u64) -> bool;
    /// The run ended: its slot goes back, unless a newer run took it over.
    fn give_back_slot(&self, instance_id: &str, run: u64);
    /// Drains asked for and not finished (what the pod lists are sized for).
    fn drains_at_once(&self) -> usize;
    /// Heartbeats our hook's action at `timeout` (a second call corrects it).
    fn hold(&self, action: &LifecycleAction, timeout: Duration);
    /// The timeout the instance's hold is heartbeated at, if it is held.
    fn held_timeout(&self, instance_id: &str) -> Option<Duration>;
    /// Stops the heartbeats: the action was completed, or is not ours.
    fn release(&self, instance_id: &str);
    /// Our hook's heartbeat timeout on the group as AWS has it now.
    async fn hook_timeout_now(&self, group: &str) -> Option<Duration>;
    /// Whose the hold is, the Node's record saying our action was completed
    /// before: AWS asked first.
    async fn confirm_finished(&self, group: &str, instance_id: &str) -> Verdict;
}

/// What the stage list's runner reaches: what a stage reaches ([`Stage`]), what the
/// last stage reaches ([`terminate::Ending`]), and the engine through [`DrainPort`]
/// only.
pub struct Runner<'a> {
    pub stage: Stage<'a>,
    pub ending: terminate::Ending,
    pub port: &'a dyn DrainPort,
}

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

/// Why the pod phases stopped early.
enum Stop {
    Abandon(String),
    Fail(String),
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
    run_inner(r, req, run).instrument(span).await
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
    if !matches!(mode, Mode::Lifecycle { .. }) {
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

/// Converts a wall-clock time to the monotonic clock (past times are now).
fn instant_of(t: chrono::DateTime<chrono::Utc>) -> Instant {
    let now = Instant::now();
    match (t - crate::clock::utc_now()).to_std() {
        Ok(ahead) => now
            .checked_add(ahead.min(Duration::from_secs(365 * 86400)))
            .unwrap_or(now),
        Err(_) => now,
    }
}

/// Fail closed: the drain goes on only with the instance's Node, or with the API
/// server's word that there is none. While the cache is not synced or the API server
/// cannot be asked (down, RBAC), it retries until the workload deadline and then
/// fails without ending the instance.
async fn locate_node(r: &Runner<'_>, req: &DrainRequest) -> Result<Option<String>, String> {
    let give_up = Instant::now() + r.stage.settings.workload_deadline;
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
        r.stage
            .events
            .node(
                n,
                Reason::DrainAbandoned,
                format!("drain abandoned: {why}; {what}{}", given.note()),
            )
            .await;
    }
}

fn abandoned(why: &str) -> How {
    How::Abandoned {
        why: why.to_string(),
    }
}

/// When the drain began, as a time (which pods arrived after it): the reason that
/// drains, never an earlier cordon-only or finished one ([`DrainRecord::drain_began`]).
fn started_ts(record: &DrainRecord) -> Timestamp {
    record
        .drain_began()
        .and_then(|t| t.timestamp_nanos_opt())
        .and_then(|n| Timestamp::from_nanosecond(i128::from(n)).ok())
        .unwrap_or_else(crate::clock::timestamp_now)
}

/// How long a drain resumed past its workload deadline still waits for the first
/// list of the node's pods: it needs them for the DaemonSet phase.
const LIST_GRACE: Duration = Duration::from_secs(30);

/// A drain's node stage: what [`phase`] needs besides the pods.
struct NodeDrain<'a> {
    r: &'a Runner<'a>,
    node: &'a str,
    started: Timestamp,
    /// Lifecycle mode: the ASG ends the instance whatever the hook's result, so a
    /// deadline can only go on (abandoning would only skip the DaemonSet phase).
    lifecycle: bool,
    /// AWS ends the instance at a known time (spot, scheduled change): likewise,
    /// once it is spent. With the DaemonSet pods' share of it.
    budget: Option<(Instant, Duration)>,
    /// Why the node is drained, for the Events on its pods.
    why: &'static str,
    /// Who asked.
    source: Source,
}

impl<'a> NodeDrain<'a> {
    fn new(
        r: &'a Runner<'a>,
        req: &DrainRequest,
        node: &'a str,
        record: &DrainRecord,
        plan: &Plan,
    ) -> Self {
        NodeDrain {
            r,
            node,
            started: started_ts(record),
            lifecycle: matches!(plan.ends, End::Lifecycle { .. }),
            budget: plan
                .budget_ends
                .map(|e| (instant_of(e), plan.daemonset_share)),
            why: req.source.why(),
            source: req.source,
        }
    }

    fn policy(&self, configured: DeadlinePolicy) -> DeadlinePolicy {
        // An interruption budget forces the drain on only when it is the budget that
        // ran out: a retirement days away keeps the configured policy (and with
        // `abandon`, every PodDisruptionBudget).
        let budget_spent = self.budget.is_some_and(|(ends_at, share)| {
            Instant::now()
                .checked_add(share.saturating_add(Duration::from_secs(1)))
                .is_some_and(|t| t >= ends_at)
        });
        if self.lifecycle || budget_spent {
            DeadlinePolicy::Proceed
        } else {
            configured
        }
    }

    fn node_ready(&self) -> bool {
        self.r.stage.nodes.is_node_ready(self.node)
    }

    /// How long the drain waits before it asks this pod to leave: until a
    /// replacement of it reads as one in every process ([`plan::wait_before_evicting`]).
    fn wait_before_evicting(&self, p: &Pod) -> Duration {
        plan::wait_before_evicting(
            p,
            drain_taint(),
            self.started,
            crate::clock::timestamp_now(),
        )
    }

    /// Whether the drain stops waiting for this listed pod, and why.
    fn not_waited_for(&self, p: &Pod) -> Option<&'static str> {
        plan::not_waited_for(
            p,
            self.node_ready(),
            crate::clock::timestamp_now(),
            self.r.stage.settings.stuck_after,
        )
    }
}

/// How long a drain waits for the pass's first list of PodDisruptionBudgets before
/// its first eviction (usually no time: it lists while the pods do).
const BUDGETS_BEFORE_FIRST_EVICTION: Duration = Duration::from_secs(2);

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
    let Some((record, plan)) = mark(r, req, node).await? else {
        return Ok(None);
    };
    if !plan.drains {
        return Ok(Some(plan));
    }
    let _slot = queue_for_slot(r, &req.instance_id, run).await;
    say_started(r, req, node, &record).await;
    let d = NodeDrain::new(r, req, node, &record, &plan);
    // Held to the end of the drain: the caches this drain shares with the others.
    let pass = r.stage.passes.join();
    let mut pods = workloads(&d, &pass, &plan).await?;
    let daemonsets_last = r.stage.settings.daemonsets == DaemonSetPolicy::EvictLast;
    if daemonsets_last {
        let _stage = metrics().stage("daemonsets");
        daemonset_phase(&d, &mut pods, plan::Phase::DaemonSets).await?;
    }
    volumes_detach(&d, &pods).await;
    // kube-proxy, the CNI, CSI node plugins: after the volumes.
    if daemonsets_last {
        let _stage = metrics().stage("critical-daemonsets");
        daemonset_phase(&d, &mut pods, plan::Phase::CriticalDaemonSets).await?;
    }
    Ok(Some(plan))
}

/// Stage 1: cordon and mark the node with every reason; what they plan together.
/// `None`: the Node is gone.
async fn mark(
    r: &Runner<'_>,
    req: &DrainRequest,
    node: &str,
) -> Result<Option<(DrainRecord, Plan)>, Stop> {
    let _stage = metrics().stage("cordon");
    match cordon::cordon(&r.stage, node, &req.reasons, &req.group).await {
        Ok(Cordoned::NodeGone) => {
            tracing::info!(node, "the Node object is gone; nothing to drain");
            Ok(None)
        }
        Ok(Cordoned::Marked { record, .. }) => {
            let plan = record.plan(r.stage.limits());
            Ok(Some((record, plan)))
        }
        Err(e) => Err(Stop::Fail(format!("could not cordon node {node}: {e}"))),
    }
}

/// Stage 2: one of `maxConcurrentDrains` slots. The node is already cordoned and
/// marked whatever the queue, so nothing is placed on a node that is going away
/// while its drain waits (in an instance refresh, replacements landed on the next
/// nodes of the refresh and were evicted again: 12% more evictions at 500 nodes).
///
/// The slot is kept in the engine's book, not in this task: a drain restarted for a
/// new reason (a spot warning joining a running drain) goes on in the slot the run
/// it replaced had, instead of queueing behind drains that budgets block.
async fn queue_for_slot<'e>(r: &'e Runner<'e>, instance: &str, run: u64) -> Option<Slot<'e>> {
    let slot = Slot {
        port: r.port,
        instance: instance.to_string(),
        run,
    };
    if r.port.has_slot(instance, run) {
        return Some(slot);
    }
    let _queued = metrics().stage("queued");
    r.port.take_slot(instance, run).await.then_some(slot)
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

/// Stage 3: every workload pod leaves (tiered, through the Eviction API), or the
/// deadline's policy decides. Returns the node's pods for the stages after it.
async fn workloads(
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

    match phase(d, &mut pods, plan::Phase::Workloads, workload_deadline).await {
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
                r.stage.settings.workload_deadline,
                plan.on_deadline,
                left,
            )
            .await?;
            end_remaining_workloads(d, &mut pods).await?;
        }
    }
    Ok(pods)
}

/// Stage 5: the node's VolumeAttachments detach, but not those of pods that stay
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

async fn daemonset_phase(
    d: &NodeDrain<'_>,
    pods: &mut NodePods,
    which: plan::Phase,
) -> Result<(), Stop> {
    let s = &d.r.stage.settings;
    let (what, done) = match which {
        plan::Phase::CriticalDaemonSets => (
            "node-critical DaemonSet pods",
            "every node-critical DaemonSet pod has exited",
        ),
        _ => ("DaemonSet pods", "every DaemonSet pod has exited"),
    };
    let mut ds_deadline = Instant::now() + s.daemonset_deadline;
    if let Some((ends_at, _)) = d.budget {
        ds_deadline = ds_deadline.min(ends_at.max(Instant::now()));
    }
    match phase(d, pods, which, ds_deadline).await {
        Ok(()) => {
            d.r.stage
                .events
                .node(d.node, Reason::DaemonSetsGone, done.into())
                .await;
            Ok(())
        }
        Err(left) => {
            deadline(
                d.r,
                d.node,
                what,
                s.daemonset_deadline,
                d.policy(s.daemonset_deadline_policy),
                left,
            )
            .await
        }
    }
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

/// How long a delete the API server refuses at a `proceed` deadline (APF's 429, a
/// 5xx, a webhook) is retried before the drain fails, the DaemonSet pods and the
/// instance left as they are (fail closed; a held or resumed drain tries again).
const DELETE_RETRY_FOR: Duration = Duration::from_secs(120);

/// A `proceed` deadline passed with workload pods left: the instance ends anyway, so
/// they are deleted now with their own grace period (preStop hooks run, SIGTERM
/// arrives), a refused delete retried with backoff, and the DaemonSet pods wait for
/// them, bounded by the longest grace. Fail closed: while one of them still runs and
/// is not terminating, the DaemonSet phase does not start.
async fn end_remaining_workloads(d: &NodeDrain<'_>, pods: &mut NodePods) -> Result<(), Stop> {
    let left: Vec<Pod> = pods
        .pods()
        .into_iter()
        .filter(|p| {
            matches!(plan::classify_at(p, &d.r.stage.settings.node_critical, crate::clock::timestamp_now()), Disposition::Evict(t) | Disposition::Wait(t) if !t.is_daemonset())
                && !plan::is_replacement(p, drain_taint(), d.started)
                && d.not_waited_for(p).is_none()
        })
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
            .map(|p| delete_until_accepted(d, pods_ref, p)),
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
                        format!(
                            "deleted by ca-asg-provider with its own grace period: node {} is being drained ({}) and the workload deadline passed",
                            d.node, d.why
                        ),
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
async fn deadline(
    r: &Runner<'_>,
    node: &str,
    what: &str,
    limit: Duration,
    policy: DeadlinePolicy,
    left: usize,
) -> Result<(), Stop> {
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

fn drain_taint() -> (&'static str, &'static str, &'static str) {
    (cordon::TAINT_KEY, "true", "NoSchedule")
}

/// Runs tiers until nothing of the phase is left. `Err(n)`: the deadline passed with
/// `n` pods left. Pods that arrived after the drain began and tolerate its taint are
/// not chased; pods stuck terminating, finished, or on a node whose kubelet cannot
/// confirm them are not waited for; each gets one Event saying so.
async fn phase(
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

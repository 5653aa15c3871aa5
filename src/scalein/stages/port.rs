//! What one node's drain shares across its stages: the runner's way into the engine
//! ([`DrainPort`]), what the runner reaches ([`Runner`]), and what the pod phases
//! share ([`NodeDrain`], [`Stop`]). The runner and its list are in [`super::drain`],
//! the phases in [`super::workloads`] and [`super::daemonsets`].

use std::time::Duration;

use crate::clock::Instant;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;

use crate::cloud::LifecycleAction;
use crate::scalein::decide::conditions::DrainState;
use crate::scalein::decide::plan;
use crate::scalein::decide::record::{DrainRecord, End, Limits, Plan};
use crate::scalein::decide::story::Verdict;
use crate::scalein::stages::cordon;
use crate::scalein::stages::terminate;
use crate::scalein::stages::Stage;
use crate::scalein::{DeadlinePolicy, DrainRequest, Source};

/// What the stage list's runner needs of the engine, besides what a stage reaches:
/// the slots the disruption budgets give, our hook's hold on the instance (its heartbeats
/// and their timeout), what is remembered of our actions, and how many drains run.
/// The engine implements it; the runner never reaches the engine or its book.
#[async_trait::async_trait]
pub trait DrainPort: Send + Sync {
    /// Whether this run of the instance's drain already holds a slot (a run it
    /// replaced for a new reason kept it).
    fn has_slot(&self, instance_id: &str, run: u64) -> bool;
    /// Waits until the disruption budgets let this run start, and keeps its slot.
    /// False: no slot can be had (the engine is going away); the drain goes on
    /// without one.
    async fn take_slot(
        &self,
        req: &DrainRequest,
        node: &str,
        record: &DrainRecord,
        run: u64,
    ) -> bool;
    /// The run ended: its slot goes back, unless a newer run took it over.
    fn give_back_slot(&self, instance_id: &str, run: u64);
    /// This run is past its first try to cordon and mark its node (done or not).
    fn marked(&self, run: u64);
    /// Cordons first: waits, bounded, until every other drain started so far is past
    /// its first try to cordon its node. How many were not when the wait ran out.
    async fn cordons_first(&self, run: u64) -> usize;
    /// Drains asked for and not finished (what the pod lists are sized for).
    fn drains_at_once(&self) -> usize;
    /// What the request's drain begins with: its group's deadline and policy, and
    /// for a hold of our hook the room the hook's global timeout leaves.
    fn limits_of(&self, req: &DrainRequest) -> Limits;
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

/// Why the pod phases stopped early.
pub(crate) enum Stop {
    Abandon(String),
    Fail(String),
}

/// Converts a wall-clock time to the monotonic clock (past times are now).
pub(crate) fn instant_of(t: chrono::DateTime<chrono::Utc>) -> Instant {
    let now = Instant::now();
    match (t - crate::clock::utc_now()).to_std() {
        Ok(ahead) => now
            .checked_add(ahead.min(Duration::from_secs(365 * 86400)))
            .unwrap_or(now),
        Err(_) => now,
    }
}

/// When the drain began, as a time (which pods arrived after it): the reason that
/// drains, never an earlier cordon-only or finished one ([`DrainRecord::drain_began`]).
pub(crate) fn started_ts(record: &DrainRecord) -> Timestamp {
    record
        .drain_began()
        .and_then(|t| t.timestamp_nanos_opt())
        .and_then(|n| Timestamp::from_nanosecond(i128::from(n)).ok())
        .unwrap_or_else(crate::clock::timestamp_now)
}

/// A drain's node stage: what [`phase`] needs besides the pods.
pub(crate) struct NodeDrain<'a> {
    pub(crate) r: &'a Runner<'a>,
    pub(crate) node: &'a str,
    pub(crate) started: Timestamp,
    /// Lifecycle mode: the ASG ends the instance whatever the hook's result, so a
    /// deadline can only go on (abandoning would only skip the DaemonSet phase).
    pub(crate) lifecycle: bool,
    /// AWS ends the instance at a known time (spot, scheduled change): likewise,
    /// once it is spent. With the DaemonSet pods' share of it.
    pub(crate) budget: Option<(Instant, Duration)>,
    /// Why the node is drained, for the Events on its pods.
    pub(crate) why: &'static str,
    /// Who asked.
    pub(crate) source: Source,
    /// Who asked, as the Node's `DrainInProgress` reason.
    pub(crate) condition_reason: &'static str,
    /// The workload deadline and its policy, in words, for the Node's conditions.
    pub(crate) deadline_said: String,
}

impl<'a> NodeDrain<'a> {
    pub(crate) fn new(
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
            condition_reason: condition_reason(req.source, record),
            deadline_said: plan.deadline_said(),
        }
    }

    /// Says on the Node that the drain runs, in `phase`, held by `blocked` (empty:
    /// nothing named), and its deadline.
    pub(crate) async fn say_running(&self, phase: &str, blocked: &[String]) {
        let mut message = format!("{phase}; {}", self.deadline_said);
        if !blocked.is_empty() {
            message = format!(
                "{phase}; held: {}; {}",
                blocked.join("; "),
                self.deadline_said
            );
        }
        let state = DrainState::Running {
            reason: self.condition_reason.to_string(),
            message,
        };
        self.r.stage.say_state(self.node, &state).await;
    }

    pub(crate) fn policy(&self, configured: DeadlinePolicy) -> DeadlinePolicy {
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

    pub(crate) fn node_ready(&self) -> bool {
        self.r.stage.nodes.is_node_ready(self.node)
    }

    /// How long the drain waits before it asks this pod to leave: until a
    /// replacement of it reads as one in every process ([`plan::wait_before_evicting`]).
    pub(crate) fn wait_before_evicting(&self, p: &Pod) -> Duration {
        plan::wait_before_evicting(
            p,
            drain_taint(),
            self.started,
            crate::clock::timestamp_now(),
        )
    }

    /// Whether the drain stops waiting for this listed pod, and why.
    pub(crate) fn not_waited_for(&self, p: &Pod) -> Option<&'static str> {
        plan::not_waited_for(
            p,
            self.node_ready(),
            crate::clock::timestamp_now(),
            self.r.stage.settings.stuck_after,
        )
    }
}

/// Who asked for the drain, as a condition's reason (one word a reader can match on):
/// the request's source, or for a drain resumed after a restart its record's reason.
pub(crate) fn condition_reason(source: Source, record: &DrainRecord) -> &'static str {
    use crate::scalein::decide::record::Why;
    match source {
        Source::ClusterAutoscaler => "ClusterAutoscalerScaleDown",
        Source::Asg => "AutoScalingGroupTermination",
        Source::Cli => "DrainCommand",
        Source::Interruption => "InterruptionNotice",
        Source::Resume => match record.reasons.iter().find(|r| !r.done && r.why.drains()) {
            Some(r) => match r.why {
                Why::ScaleIn => "ClusterAutoscalerScaleDown",
                Why::Lifecycle { .. } => "AutoScalingGroupTermination",
                Why::DrainCommand => "DrainCommand",
                Why::Notice { .. } => "InterruptionNotice",
                Why::Rebalance => "RebalanceRecommendation",
            },
            None => "DrainResumed",
        },
    }
}

pub(crate) fn drain_taint() -> (&'static str, &'static str, &'static str) {
    (cordon::TAINT_KEY, "true", "NoSchedule")
}

//! The fourth source, queue mode (`interruption.queueUrl`): EC2 interruption notices
//! and the ASG's lifecycle actions from an SQS queue fed by EventBridge, each turned
//! into a drain request like the other sources'. Only the leader consumes: receive a
//! batch, handle each message, delete what is done (the drain started, the node
//! cordoned, or nothing to do) or can never be (malformed, received too often);
//! anything else is left for SQS to deliver again. Handling is idempotent: the engine
//! runs one drain per instance, and a notice seen again within [`REMEMBER`] (a
//! duplicate delivery, a redelivery after a restart) starts nothing new.
//!
//! - [`notice`]: what a message says (pure, fuzzed);
//! - the decision: [`crate::scalein::decide::notice`] (pure);
//! - here: the loop, the look-ups and the engine calls.

pub mod notice;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use crate::clock::Instant;

use backon::{ExponentialBuilder, Retryable};
use chrono::Utc;
use futures::StreamExt;
use parking_lot::Mutex;

use crate::cloud::queue::{Queue, QueueMessage};
use crate::cloud::{CloudError, LifecycleState};
use crate::provider::Provider;
use crate::scalein::decide::notice::{decide, Action, Notice};
use crate::scalein::decide::record::{DrainReason, Why};
use crate::scalein::decide::story::Verdict;
use crate::scalein::engine::keeper::{
    ask_hold, forget_earlier_action, judge_hold, with_hook_behind_its_list, FoundBy,
};
use crate::scalein::holds::Hold;
use crate::scalein::kube::events::Reason;
use crate::scalein::settings::InterruptionSettings;
use crate::scalein::stages::cordon::{self, Cordoned};
use crate::scalein::stages::drain::AbortOnDrop;
use crate::scalein::{DrainRequest, Engine, Mode, Source, Start};
use crate::telemetry::metrics::{metrics, KindLabels, KindOutcomeLabels, ReasonLabels};

/// How long a handled notice is remembered against duplicates.
pub const REMEMBER: Duration = Duration::from_secs(15 * 60);

/// How long after AWS sent a lifecycle message its reads may still show the
/// instance short of Terminating:Wait.
pub const SETTLE: Duration = Duration::from_secs(60);

/// What tells one draining notice of an instance from another of the same kind: the
/// end AWS gave it.
fn notice_key(instance_id: &str, ends_at: Option<chrono::DateTime<Utc>>) -> String {
    match ends_at {
        Some(t) => format!("{instance_id}@{}", t.timestamp()),
        None => instance_id.to_string(),
    }
}

pub struct Consumer {
    engine: Arc<Engine>,
    provider: Arc<Provider>,
    queue: Arc<dyn Queue>,
    settings: InterruptionSettings,
    /// (action, instance) -> when it was handled.
    recent: Mutex<BTreeMap<(&'static str, String), Instant>>,
}

/// Where AWS (or, failing it, the provider's snapshot) has an instance a notice names.
enum Place {
    Group(String),
    /// In the group's warm pool, in `state`.
    Pool {
        group: String,
        state: LifecycleState,
    },
    /// In no group this service manages.
    Unmanaged,
}

/// What became of one message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Handled {
    /// Handled (each action's outcome label) and deleted.
    Done(Vec<&'static str>),
    /// Deleted without handling: it never can be.
    Dropped(&'static str),
    /// Left in the queue for another delivery.
    Retry(String),
}

impl Consumer {
    pub fn new(
        engine: Arc<Engine>,
        provider: Arc<Provider>,
        queue: Arc<dyn Queue>,
        settings: InterruptionSettings,
    ) -> Arc<Self> {
        Arc::new(Self {
            engine,
            provider,
            queue,
            settings,
            recent: Mutex::new(BTreeMap::new()),
        })
    }

    /// The loop, restarted if it ever panics (a message no test foresaw must not stop
    /// the queue for good), until the returned task is aborted.
    pub fn spawn(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let this = self.clone();
        tokio::spawn(async move {
            loop {
                // Aborting this task drops the guard, which aborts the loop's task.
                let mut inner = AbortOnDrop(this.run());
                let ended = (&mut inner.0).await;
                drop(inner);
                match ended {
                    Err(e) if e.is_panic() => {
                        tracing::error!(error = %e, "the interruption queue's loop panicked; restarting it");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                    _ => return,
                }
            }
        })
    }

    /// The loop itself: receive a batch (leader only), handle it, until aborted.
    fn run(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let this = self.clone();
        tokio::spawn(async move {
            const NAME: &str = "interruption queue";
            let quiet = this.settings.wait + Duration::from_secs(120);
            loop {
                this.engine.tools.liveness.beat(NAME, quiet);
                if !this.engine.is_leader() {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
                let receive = || this.queue.receive(this.settings.batch, this.settings.wait);
                let batch = receive
                    .retry(crate::clock::jittered(
                        ExponentialBuilder::default()
                            .with_min_delay(Duration::from_secs(1))
                            .with_max_delay(Duration::from_secs(30))
                            .with_max_times(3),
                        "queue receive",
                    ))
                    .sleep(tokio::time::sleep)
                    .notify(|e: &CloudError, retry_in| {
                        tracing::warn!(error = %e, ?retry_in, "cannot receive from the interruption queue; retrying");
                    })
                    .await;
                match batch {
                    Ok(msgs) => {
                        futures::stream::iter(msgs)
                            .for_each_concurrent(this.settings.concurrency.max(1), |m| {
                                let this = this.clone();
                                async move {
                                    this.handle(m).await;
                                }
                            })
                            .await
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "the interruption queue keeps failing; the lifecycle poll still finds held instances");
                        tokio::time::sleep(Duration::from_secs(30)).await;
                    }
                }
            }
        })
    }

    /// Handles one message and deletes it when it is done or can never be.
    pub async fn handle(&self, m: QueueMessage) -> Handled {
        // A replica that does not lead (it lost the lease since the batch came) writes
        // nothing: not even the Node's record; the leader gets the message again.
        if !self.engine.is_leader() {
            return Handled::Retry("this replica does not lead".into());
        }
        let out = self.understand(&m).await;
        // Fenced: a replica that lost the lease while handling deletes nothing; the
        // leader gets the message again (what was recorded on the Node stays).
        let out = match out {
            Handled::Done(_) | Handled::Dropped(_) if !self.engine.is_leader() => {
                Handled::Retry("this replica no longer leads".into())
            }
            other => other,
        };
        match &out {
            Handled::Done(_) | Handled::Dropped(_) => {
                if let Err(e) = self.queue.delete(&m).await {
                    // Delivered again later; the duplicate starts nothing.
                    tracing::warn!(message = %m.id, error = %e, "could not delete a handled message");
                }
            }
            Handled::Retry(why) => {
                tracing::warn!(message = %m.id, receives = m.receive_count, "message left for another delivery: {why}");
            }
        }
        out
    }

    async fn understand(&self, m: &QueueMessage) -> Handled {
        let m_ = metrics();
        if m.receive_count > self.settings.max_receives {
            tracing::warn!(message = %m.id, receives = m.receive_count, body = %m.body, "dropping a message received too often without being handled");
            m_.queue_dropped
                .get_or_create(&ReasonLabels { reason: "gave_up" })
                .inc();
            return Handled::Dropped("gave_up");
        }
        let n = match notice::parse(&m.body) {
            Ok(n) => n,
            Err(why) => {
                tracing::warn!(message = %m.id, body = %m.body, "dropping a malformed message: {why}");
                m_.queue_dropped
                    .get_or_create(&ReasonLabels {
                        reason: "malformed",
                    })
                    .inc();
                return Handled::Dropped("malformed");
            }
        };
        let kind = n.kind();
        m_.queue_messages.get_or_create(&KindLabels { kind }).inc();
        let hook = self.engine.settings().hook_name.clone();
        let mut outcomes = Vec::new();
        for action in decide(&n, self.settings.rebalance, &hook, crate::clock::utc_now()) {
            match self.act(&n, action).await {
                Ok(outcome) => {
                    m_.queue_handled
                        .get_or_create(&KindOutcomeLabels { kind, outcome })
                        .inc();
                    outcomes.push(outcome);
                }
                Err(why) => return Handled::Retry(why),
            }
        }
        Handled::Done(outcomes)
    }

    /// True the first time (action or notice kind, instance) is seen within
    /// [`REMEMBER`]: a spot warning for an instance a retirement drains is new.
    fn first_time(&self, action: &'static str, instance: &str) -> bool {
        let mut recent = self.recent.lock();
        let now = Instant::now();
        recent.retain(|_, t| now.duration_since(*t) < REMEMBER);
        let key = (action, instance.to_string());
        if recent.contains_key(&key) {
            return false;
        }
        recent.insert(key, now);
        true
    }

    /// Where an instance is, for a notice about it. AWS is asked first: the
    /// provider's snapshot may be minutes old, and an instance it shows in service
    /// may rest in the group's warm pool since. Only AWS's word "in the pool"
    /// drops the notice; where AWS does not list the instance (its reads lag a
    /// new one) or cannot be asked, the snapshot decides as before, and a notice
    /// it knows nothing of is left for redelivery: a drain never ends an instance,
    /// and a spot warning cannot wait for a calmer AWS.
    async fn place(&self, instance_id: &str) -> Result<Place, String> {
        let reg = self.provider.registry();
        let snapshot = reg
            .group_of_instance(instance_id)
            .map(|g| g.asg.name.clone());
        let found = self
            .engine
            .cloud
            .locate_instances(&[instance_id.to_string()])
            .await;
        let found = match (found, snapshot) {
            (Ok(found), snapshot) => found
                .into_iter()
                .find(|l| l.instance_id == instance_id && reg.group(&l.group).is_some())
                .map(|l| (l.group, Some(l.state)))
                .or(snapshot.map(|g| (g, None))),
            (Err(e), Some(g)) => {
                tracing::warn!(instance = %instance_id, group = %g, error = %e, "cannot ask AWS where the instance is; acting on the provider's snapshot, which shows it in the group");
                Some((g, None))
            }
            (Err(e), None) => {
                return Err(format!(
                    "cannot tell which group instance {instance_id} is in: {e}"
                ))
            }
        };
        Ok(match found {
            Some((group, Some(state))) if state.in_warm_pool() => Place::Pool { group, state },
            Some((group, _)) => Place::Group(group),
            None => Place::Unmanaged,
        })
    }

    async fn act(&self, n: &Notice, action: Action) -> Result<&'static str, String> {
        let label = action.label();
        match action {
            Action::Nothing(why) => {
                tracing::debug!("interruption queue: {why}");
                Ok(label)
            }
            Action::StopDrain { instance_id } => {
                if self.engine.settings().dry_run {
                    return Ok("ignored");
                }
                let stopped = self.engine.instance_left(&instance_id).await.map_err(|e| {
                    format!("cannot record on the Node that instance {instance_id} stopped or ended: {e}")
                })?;
                if stopped {
                    tracing::info!(instance = %instance_id, "the instance stopped or ended: its drain has nothing left to protect and stops");
                    Ok(label)
                } else {
                    Ok("ignored")
                }
            }
            Action::Drain {
                instance_id,
                ends_at,
            } => {
                let group = match self.managed(&instance_id).await? {
                    Ok(group) => group,
                    Err(outcome) => return Ok(outcome),
                };
                let kind = n.kind();
                // The same notice again is a duplicate; another of the same kind with
                // another end is news (a scheduled change moved earlier): it is
                // recorded and joins the drain, whose plan keeps the earliest end.
                let seen = notice_key(&instance_id, ends_at);
                if !self.first_time(kind, &seen) {
                    return Ok("duplicate");
                }
                let reason = DrainReason::new(
                    Why::Notice {
                        notice: kind.to_string(),
                        ends_at,
                        daemonset_share_secs: self.settings.daemonset_share.as_secs(),
                    },
                    crate::clock::utc_now(),
                );
                // Recorded on the Node before the message is deleted: a restart or a
                // new leader finds the reason with its budget there, even while the
                // drain waits for a slot.
                let node = match self.record(&instance_id, &group, reason.clone()).await {
                    // The same notice again, its drain done (SQS delivering it after a
                    // restart or a new leader forgot it was seen): the Node's record
                    // keeps it done, and nothing drains the node a second time.
                    Ok(Some((_, false))) => return Ok("duplicate"),
                    Ok(Some((node, true))) => node,
                    Ok(None) => return Ok("no_node"),
                    Err(why) => {
                        self.forget(kind, &seen);
                        return Err(why);
                    }
                };
                let start = self.engine.start(DrainRequest {
                    instance_id: instance_id.clone(),
                    group,
                    node_name: Some(node),
                    mode: Mode::DrainOnly,
                    source: Source::Interruption,
                    reasons: vec![reason],
                    noticed: n.time().map(|t| (n.kind(), t)),
                });
                Ok(self.started(n, &instance_id, start, label))
            }
            Action::LifecycleDrain(action) => self.lifecycle_drain(n, action, label).await,
            Action::Cordon { instance_id } => {
                let group = match self.managed(&instance_id).await? {
                    Ok(group) => group,
                    Err(outcome) => return Ok(outcome),
                };
                if !self.first_time("cordon", &instance_id) {
                    return Ok("duplicate");
                }
                if self.engine.settings().dry_run {
                    tracing::info!(instance = %instance_id, "dry run: a rebalance recommendation would cordon the node");
                    metrics().dry_run("cordon");
                    return Ok(label);
                }
                let reason = DrainReason::new(Why::Rebalance, crate::clock::utc_now());
                match self.record(&instance_id, &group, reason).await {
                    Ok(Some((node, _))) => {
                        self.engine
                            .tools
                            .events
                            .node(
                                &node,
                                Reason::RebalanceCordoned,
                                format!("EC2 recommends rebalancing instance {instance_id}: cordoned and tainted so new pods go elsewhere; it drains if an interruption or a scale-in follows"),
                            )
                            .await;
                        Ok(label)
                    }
                    Ok(None) => Ok("ignored"),
                    Err(why) => {
                        self.forget("cordon", &instance_id);
                        Err(why)
                    }
                }
            }
        }
    }

    /// A lifecycle message of our hook: the instance is drained, and held with
    /// heartbeats, when AWS holds it under our hook now.
    async fn lifecycle_drain(
        &self,
        n: &Notice,
        mut action: crate::cloud::LifecycleAction,
        label: &'static str,
    ) -> Result<&'static str, String> {
        let Some(g) = self.provider.registry().group(&action.group).cloned() else {
            return Ok("unmanaged");
        };
        // A message is no proof that anyone is ending the instance (a replay, a
        // forgery): as the scan does, only an instance AWS shows in Terminating:Wait
        // in that group is drained, nothing else cordoned. AWS's reads lag its
        // holds: where they say no, the action itself is asked.
        let mut hold = None;
        let state = match self.not_held(n, &action).await {
            Ok(Ok(state)) => Some(state),
            no => {
                hold = Some(ask_hold(&self.engine, &action.group, &action.instance_id).await);
                if hold != Some(Hold::Held) {
                    return no.map(|held| held.err().unwrap_or("not_held"));
                }
                None
            }
        };
        if hold == Some(Hold::Held) {
            tracing::info!(instance = %action.instance_id, group = %action.group, "AWS's reads do not show the instance held yet, but our hook's action is there (a heartbeat was taken)");
        }
        // Whose the hold is, by the judgement the scan makes too (keeper::judge_hold): AWS
        // says, and the memories of finished actions count only while it cannot be
        // asked. Cannot tell: left for redelivery rather than drained or dropped on a
        // memory that may be stale. Not ours: our action is over and another hook
        // (EKS's) holds the instance.
        let verdict = match &state {
            // AWS's reads do not show the hold, but the heartbeat was taken: ours.
            None => {
                if !forget_earlier_action(&self.engine, &action.instance_id).await {
                    return Err(format!(
                        "cannot close the Node's record of our hook's last action on instance {}; left for redelivery",
                        action.instance_id
                    ));
                }
                Verdict::Ours
            }
            Some(state) => {
                let by = FoundBy::OurHooksMessage;
                judge_hold(&self.engine, &action.group, &action.instance_id, state, by).await
            }
        };
        match verdict {
            Verdict::Ours => {}
            Verdict::NotOurs => {
                tracing::info!(instance = %action.instance_id, "lifecycle message for a hold that is no pending action of our hook (ours completed already); another hook holds the instance");
                return Ok("duplicate");
            }
            Verdict::AskAgain => {
                return Err(format!(
                    "cannot ask AWS whether our hook holds instance {} with a new action (its last one was completed); left for redelivery",
                    action.instance_id
                ))
            }
        }
        let Some((g, heartbeat_timeout)) = self.held_by_our_hook(g, &action, hold).await? else {
            tracing::warn!(instance = %action.instance_id, group = %action.group, "lifecycle message for a group that no longer carries our hook; dropped");
            return Ok("not_held");
        };
        // One action is one token: the same message again is a duplicate, a later
        // action on the same instance (sent back to its warm pool, then ended by
        // it) is not.
        let seen = match &action.token {
            Some(t) => format!("{}#{t}", action.instance_id),
            None => action.instance_id.clone(),
        };
        if !self.first_time("lifecycle", &seen) {
            return Ok("duplicate");
        }
        action.hook = self.engine.settings().hook_name.clone();
        // The message's token is not AWS's word (a forged or corrupted message
        // carries any token, and AWS refuses a wrong one: every heartbeat would fail
        // and the hook's timeout end the instance undrained). AWS takes the instance
        // id alone, as the scan sends it.
        action.token = None;
        let instance_id = action.instance_id.clone();
        let mode = Mode::Lifecycle {
            action,
            heartbeat_timeout,
        };
        // AWS holds the instance (the scan is the safety net); the hook's reason
        // joins any drain already running there, and is heartbeated.
        let start = self.engine.start(DrainRequest::lifecycle(
            &instance_id,
            &g.asg.name,
            mode,
            n.time().map(|t| (n.kind(), t)),
        ));
        Ok(self.started(n, &instance_id, start, label))
    }

    /// The group with our hook as AWS has it now, and the heartbeat timeout the hold
    /// follows (the provider's list may be half an hour old). AWS notified our hook
    /// and holds the instance, yet its hook list may not show the hook (just added by
    /// hand; the list is eventually consistent): then the action decides (`hold`,
    /// asked already, or asked now). `None`: our hook holds nothing there.
    async fn held_by_our_hook(
        &self,
        g: crate::provider::Group,
        action: &crate::cloud::LifecycleAction,
        hold: Option<Hold>,
    ) -> Result<Option<(crate::provider::Group, std::time::Duration)>, String> {
        let mut g = self.engine.with_current_hooks(&g).await.map_err(|e| {
            format!(
                "cannot read the lifecycle hook of group {}: {e}",
                action.group
            )
        })?;
        if self.engine.our_hook(&g).is_none() {
            let hold = match hold {
                Some(h) => h,
                None => ask_hold(&self.engine, &action.group, &action.instance_id).await,
            };
            // Unknown (AWS throttled): held, as AWS shows the instance waiting. A
            // hook left to time out ends the instance undrained; a drain of an
            // instance AWS ends anyway costs nothing.
            if hold == Hold::NotHeld || self.engine.settings().dry_run {
                return Ok(None);
            }
            tracing::warn!(instance = %action.instance_id, group = %action.group, ?hold, "our hook holds the instance though AWS's hook list does not show it yet (just added?); held at the shortest timeout until the list does");
            g = with_hook_behind_its_list(&self.engine, &g);
        }
        Ok(match self.engine.mode_for(&g, &action.instance_id) {
            Mode::Lifecycle {
                heartbeat_timeout, ..
            } => Some((g, heartbeat_timeout)),
            _ => None,
        })
    }

    /// Whether AWS shows the action's instance held by our hook now: in
    /// Terminating:Wait, in the message's group. `Ok(state)`: it is, in that wait;
    /// `Err(outcome)`: it is not, and the message is dropped with that outcome. An error (AWS cannot be asked, or the
    /// instance is still on its way to Terminating:Wait) leaves it for redelivery.
    ///
    /// AWS's reads lag its notifications: a message sent within [`SETTLE`] for an
    /// instance AWS still shows in service, or terminating short of the wait, is
    /// taken as a hold on its way. The lifecycle scan looks every second for that
    /// long (the queue's redelivery, a minute later, and the safety-net poll, five,
    /// come after a short hook's timeout), and the message is left for redelivery.
    /// An older one is a replay or a forgery, dropped.
    async fn not_held(
        &self,
        n: &Notice,
        action: &crate::cloud::LifecycleAction,
    ) -> Result<Result<LifecycleState, &'static str>, String> {
        let found = self
            .engine
            .cloud
            .locate_instances(std::slice::from_ref(&action.instance_id))
            .await
            .map_err(|e| {
                format!(
                    "cannot tell whether instance {} is held by the hook: {e}",
                    action.instance_id
                )
            })?;
        let state = found
            .into_iter()
            .find(|l| l.instance_id == action.instance_id && l.group == action.group)
            .map(|l| l.state);
        let fresh = n
            .time()
            .is_none_or(|t| (crate::clock::utc_now() - t).to_std().unwrap_or_default() < SETTLE);
        match state {
            // Terminating:Wait, or a hold of the warm pool's: on the way back into it
            // (a scale-in under ReuseOnScaleIn, Destination WarmPool), or ending one
            // of its instances. The message names the terminating transition, so a
            // pool-bound wait here is our terminating hook's, not a launch hook's.
            Some(s) if LifecycleState::OUR_HOLD.contains(&s) => Ok(Ok(s)),
            Some(LifecycleState::WarmedPending) => {
                self.engine.schedule.expect_hold(SETTLE);
                Err(format!(
                    "instance {} is on its way into the warm pool in AWS's reads, not held yet; the scan looks every second meanwhile",
                    action.instance_id
                ))
            }
            Some(s @ (LifecycleState::Terminating | LifecycleState::InService))
                if fresh || s == LifecycleState::Terminating =>
            {
                self.engine.schedule.expect_hold(SETTLE);
                Err(format!(
                    "instance {} is {s:?} in AWS's reads, not in Terminating:Wait yet; the scan looks every second meanwhile",
                    action.instance_id
                ))
            }
            other => {
                tracing::warn!(instance = %action.instance_id, group = %action.group, state = ?other, "lifecycle message for an instance AWS does not hold in Terminating:Wait in that group (a replay, or not sent by AWS); dropped, nothing drained");
                Ok(Err("not_held"))
            }
        }
    }

    /// Records a reason on the instance's Node (cordoned, marked, the reason with
    /// every other). `Ok(Some((node, drains)))`: `drains` says whether the record now
    /// asks for a drain (not when every draining reason is done). `Ok(None)`: the API
    /// server says the instance has no Node, so nothing runs there to drain. In a dry
    /// run nothing is written; the Node's name is still looked up.
    async fn record(
        &self,
        instance_id: &str,
        group: &str,
        reason: DrainReason,
    ) -> Result<Option<(String, bool)>, String> {
        let node = match self.engine.find_node(instance_id, None).await {
            Ok(Some(node)) => node,
            Ok(None) => return Ok(None),
            Err(e) => {
                return Err(format!(
                    "cannot find the Node of instance {instance_id}: {e}"
                ))
            }
        };
        if self.engine.settings().dry_run {
            return Ok(Some((node, true)));
        }
        let keep = Some(self.engine.limits_for(group, None));
        match cordon::cordon(&self.engine.stage(), &node, &[reason], group, keep).await {
            Ok(Cordoned::Marked { record, .. }) => {
                let drains = record.drain_began().is_some();
                Ok(Some((node, drains)))
            }
            Ok(Cordoned::NodeGone) => Ok(None),
            Err(e) => Err(format!("cannot record the notice on node {node}: {e}")),
        }
    }

    fn forget(&self, action: &'static str, instance: &str) {
        self.recent.lock().remove(&(action, instance.to_string()));
    }

    /// The group to drain or cordon an instance for, or the outcome that leaves it
    /// alone. An instance resting in (or moving through) a warm pool is not the
    /// group's and runs nothing of it: a notice for it is a forgery or a mistake
    /// (warm pools take no Spot; a stopped instance gets no warning), and acting on
    /// it would leave a drain that never ends, or a reason that keeps the Node
    /// cordoned when the pool gives the instance back.
    async fn managed(&self, instance_id: &str) -> Result<Result<String, &'static str>, String> {
        match self.place(instance_id).await? {
            Place::Group(g) => Ok(Ok(g)),
            Place::Pool { group, state } => {
                tracing::warn!(instance = %instance_id, %group, state = state.as_str(), "interruption notice for an instance AWS shows in the warm pool, not the group; dropped, nothing drained or cordoned");
                Ok(Err("in_warm_pool"))
            }
            Place::Unmanaged if self.settings.unmanaged => Ok(Ok(String::new())),
            Place::Unmanaged => {
                tracing::info!(instance = %instance_id, "interruption notice for an instance of no managed group; ignored (interruption.unmanaged: true acts on it)");
                Ok(Err("unmanaged"))
            }
        }
    }

    /// The outcome label of a drain request, and the notice-to-drain time.
    fn started(
        &self,
        n: &Notice,
        instance_id: &str,
        start: Start,
        label: &'static str,
    ) -> &'static str {
        let kind = n.kind();
        match start {
            Start::Started => {}
            Start::Joined => {
                tracing::info!(instance = %instance_id, kind, "interruption notice joins the drain already running");
                return "joined";
            }
            Start::Unchanged => return "duplicate",
            // Recorded on the Node: the leader resumes it.
            Start::Refused => return "recorded",
        }
        if let Some(at) = n.time() {
            let lag = (crate::clock::utc_now() - at).to_std().unwrap_or_default();
            metrics()
                .notice_to_drain
                .get_or_create(&KindLabels { kind })
                .observe(lag.as_secs_f64());
        }
        tracing::info!(instance = %instance_id, kind, "interruption notice: drain started");
        label
    }
}

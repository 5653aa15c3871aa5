//! The holds the engine keeps: the heartbeats of each lifecycle action our hook
//! holds while its drain runs, AWS asked whether our hook holds an instance (a
//! heartbeat answers), and what this process and the Node remember of finished
//! actions judged against what AWS says, by the one rule every source uses
//! ([`HoldStory::verdict`]). The pacing and AWS's vocabulary are
//! [`crate::scalein::holds`]'s, which knows no engine.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use crate::clock::Instant;

use crate::cloud::{CloudError, LifecycleAction, LifecycleHook, LifecycleState};
use crate::telemetry::metrics::{metrics, Metrics};

use crate::scalein::decide::story::{Hold, HoldStory, Verdict};
use crate::scalein::holds::{
    global_limit, in_state, no_action, within_timeout, HeartbeatBackoff, AWS_MIN_HEARTBEAT_TIMEOUT,
};
use crate::scalein::kube::events::Reason;
use crate::scalein::Engine;

/// Keeps one lifecycle action alive until aborted: a RecordLifecycleActionHeartbeat
/// at once (the instance may have waited a while before it was found), then every
/// third of the hook's timeout less a random tenth (so many held instances do not
/// heartbeat in lockstep). After a failure (AWS throttling) it backs off with jitter
/// from a twelfth of the timeout, doubling, never past a third, so a throttled storm
/// spreads out and still lands inside the timeout. Until AWS has taken one of its
/// heartbeats, the action's clock is not known (the hold began, or an earlier
/// process or leader last heartbeated it, up to a timeout before it was found): the
/// retries stay a twelfth of the timeout apart at most ([`HeartbeatBackoff`]), so a
/// throttled run that ends before the hook's real timeout is followed by a heartbeat
/// in time. Stops when AWS says the action is
/// gone (ValidationError) and at the hook's global limit. Failures are counted; the
/// first of a run is published as an Event on the Node in the background (the next
/// try never waits on the API server). The hook's timeout comes through `timeout`:
/// when it changes, a heartbeat goes at once and the next ones at the new pace.
pub fn heartbeats(
    engine: Arc<Engine>,
    action: LifecycleAction,
    mut timeout: tokio::sync::watch::Receiver<Duration>,
) -> tokio::task::JoinHandle<()> {
    let pace = |t: Duration| (t / 3).max(Duration::from_millis(200));
    tokio::spawn(async move {
        let found = Instant::now();
        let _waiting = GaugeGuard::new(&metrics().lifecycle_waiting);
        let mut current = *timeout.borrow_and_update();
        let mut every = pace(current);
        let mut limit = global_limit(current);
        let mut backoff = HeartbeatBackoff::new(every, &action.instance_id);
        // The action's own clock: AWS counts the timeout from the last heartbeat it
        // took (or from the hold, before the first). Before this task's first one
        // is taken, `found` is only the latest it can be; the backoff knows.
        let mut last_ok = found;
        let mut follows = true;
        loop {
            if found.elapsed() >= limit {
                Metrics::outcome(&metrics().heartbeats, "stopped");
                tracing::warn!(instance = %action.instance_id, hook = %action.hook, limit = ?limit, "the lifecycle action reached its global limit; AWS ends it now whatever the heartbeats");
                return;
            }
            let next = match engine.cloud.lifecycle_heartbeat(&action).await {
                Ok(()) => {
                    heartbeat_taken(&engine);
                    tracing::debug!(instance = %action.instance_id, hook = %action.hook, "lifecycle heartbeat recorded");
                    last_ok = Instant::now();
                    backoff.ok()
                }
                Err(e)
                    if no_action(&e).is_some()
                        || matches!(&e, CloudError::Rejected { code, .. } if code == "ValidationError") =>
                {
                    let message = e.to_string();
                    // No action now. Right after TerminateInstanceInAutoScalingGroup the
                    // instance may not have reached our hold yet, or AWS's lifecycle API
                    // lags its reads of the hold: only an instance past the hook (or
                    // gone) ends the heartbeats (stopping early would let the hook's
                    // timeout end it undrained).
                    let may_still_wait: Vec<LifecycleState> = LifecycleState::BEFORE_OUR_HOLD
                        .into_iter()
                        .chain(LifecycleState::OUR_HOLD)
                        .collect();
                    if !in_state(engine.cloud.as_ref(), &action.instance_id, &may_still_wait).await
                    {
                        Metrics::outcome(&metrics().heartbeats, "stopped");
                        tracing::info!(instance = %action.instance_id, hook = %action.hook, %message, "no active lifecycle action any more; heartbeats stop");
                        return;
                    }
                    tracing::debug!(instance = %action.instance_id, hook = %action.hook, "no lifecycle action yet; the instance has not reached Terminating:Wait");
                    (every / 4).max(Duration::from_millis(100))
                }
                Err(e) => {
                    Metrics::outcome(&metrics().heartbeats, "error");
                    tracing::warn!(instance = %action.instance_id, hook = %action.hook, error = %e, "lifecycle heartbeat failed");
                    if backoff.failures == 0 {
                        if let Some(node) =
                            engine.tools.nodes.node_for_instance(&action.instance_id)
                        {
                            let engine = engine.clone();
                            let note = format!(
                                "lifecycle heartbeat for instance {} (hook {}) failed: {e}; retrying",
                                action.instance_id, action.hook
                            );
                            tokio::spawn(async move {
                                engine
                                    .tools
                                    .events
                                    .node(&node, Reason::HeartbeatFailed, note)
                                    .await;
                            });
                        }
                    }
                    // Failures in a row back off, but never past the time the
                    // action has left: the next try comes before the timeout runs out.
                    within_timeout(backoff.failed(), last_ok, current, Instant::now())
                }
            };
            let sleep = tokio::time::sleep(next);
            if !follows {
                sleep.await;
                continue;
            }
            tokio::select! {
                biased;
                _ = sleep => {}
                changed = timeout.changed() => match changed {
                    Ok(()) => {
                        let now = *timeout.borrow_and_update();
                        if now != current {
                            current = now;
                            every = pace(now);
                            limit = global_limit(now);
                            backoff = backoff.repaced(every);
                        }
                    }
                    // The hold is being dropped (which aborts this task).
                    Err(_) => follows = false,
                },
            }
        }
    })
}

/// Asks AWS whether our hook holds the instance, with a heartbeat: the action
/// itself answers, where AWS's reads (instance states, the hook list) are eventually
/// consistent and may lag a hold or a hook just added. A heartbeat taken only
/// restarts the hook's timeout of an action that is ours, which a hold starts with
/// anyway.
pub async fn ask_hold(engine: &Engine, group: &str, instance_id: &str) -> Hold {
    if engine.settings.dry_run {
        return Hold::Unknown;
    }
    let probe = LifecycleAction {
        group: group.to_string(),
        hook: engine.settings.hook_name.clone(),
        instance_id: instance_id.to_string(),
        token: None,
    };
    match engine.cloud.lifecycle_heartbeat(&probe).await {
        Ok(()) => {
            heartbeat_taken(engine);
            Hold::Held
        }
        Err(e) if no_action(&e).is_some() => Hold::NotHeld,
        Err(e) => {
            tracing::warn!(instance = %instance_id, group, error = %e, "cannot ask AWS whether our hook holds the instance");
            Hold::Unknown
        }
    }
}

/// Whether AWS said, less than [`NOT_HELD_RECHECK`](crate::scalein::decide::story::NOT_HELD_RECHECK) ago and with the instance in the
/// same wait as now (`state`), that our hook holds no pending action on it
/// ([`crate::scalein::decide::story::ActionMemories::not_held_lately`]).
pub(crate) fn not_held_lately(engine: &Engine, instance_id: &str, state: &LifecycleState) -> bool {
    engine.book.not_held_lately(instance_id, state.as_str())
}

/// Whether our hook holds the instance, waiting in `state`, with a pending action, as
/// AWS answers a heartbeat ([`ask_hold`]) unless it said no lately
/// ([`not_held_lately`]). Held: whatever this process and the Node remember of an
/// earlier action of the instance is dropped ([`forget_earlier_action`]), so the
/// hold drains as the new action it is; `Unknown` when the Node could not be written
/// (the next poll asks again).
pub(crate) async fn holds_pending_action(
    engine: &Engine,
    group: &str,
    instance_id: &str,
    state: &LifecycleState,
) -> Hold {
    if not_held_lately(engine, instance_id, state) {
        return Hold::NotHeld;
    }
    let aws = ask_hold_as_new(engine, group, instance_id).await;
    if aws == Hold::NotHeld {
        engine.book.aws_said_not_held(instance_id, state.as_str());
    }
    aws
}

/// AWS asked whether our hook holds the instance ([`ask_hold`]); held, what this
/// process and the Node remember of an earlier action is dropped first
/// ([`forget_earlier_action`]), so the hold drains as the new action it is, and a Node
/// that could not be written makes the answer `Unknown` (asked again later).
async fn ask_hold_as_new(engine: &Engine, group: &str, instance_id: &str) -> Hold {
    match ask_hold(engine, group, instance_id).await {
        Hold::Held if !forget_earlier_action(engine, instance_id).await => Hold::Unknown,
        aws => aws,
    }
}

/// How a source came to a hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FoundBy {
    /// AWS's lists show the instance waiting (the lifecycle scan).
    Lists,
    /// A lifecycle message of our hook's terminating transition names it (the queue):
    /// a wait on the way into the warm pool is then a terminating hook's, not a
    /// launch hook's holding a new instance warming up.
    OurHooksMessage,
}

/// Whose a hold AWS shows is (`state`, one of [`LifecycleState::OUR_HOLD`]): the one
/// judgement every source that finds a hold makes (the lifecycle scan, the queue).
/// A hold by the rule of its story ([`hold_verdict`]: AWS asked, the memories of
/// finished actions counting only while it cannot be), except a wait on the way into
/// the warm pool (`Warmed:Pending:Wait`) found in AWS's lists alone: a new instance
/// warming up waits there too (for launch hooks only), an instance whose action we
/// completed may wait there on another hook, and an instance back from the pool can
/// be sent there again before any read showed it in service (its Node still saying
/// our last action was completed), so only AWS's word makes it ours (a heartbeat of
/// our hook taken; a refusal believed for
/// [`NOT_HELD_RECHECK`](crate::scalein::decide::story::NOT_HELD_RECHECK) while the
/// instance waits there). A drain running here holds the action already.
pub(crate) async fn judge_hold(
    engine: &Engine,
    group: &str,
    instance_id: &str,
    state: &LifecycleState,
    found: FoundBy,
) -> Verdict {
    if !(state.is_pool_bound_wait() && found == FoundBy::Lists) {
        return hold_verdict(engine, group, instance_id, state).await;
    }
    if engine.is_draining(instance_id) {
        return Verdict::Ours;
    }
    match holds_pending_action(engine, group, instance_id, state).await {
        Hold::Held => Verdict::Ours,
        Hold::NotHeld => Verdict::NotOurs,
        Hold::Unknown => Verdict::AskAgain,
    }
}

/// Whose a hold AWS shows is (the instance in `Terminating:Wait`, or the pool ending
/// it): a pending action of our hook, to drain and heartbeat, or not; by the one rule
/// every source uses ([`HoldStory::verdict`]). The memories of finished actions (this
/// process's, for the actions it completed; the Node's record, for an earlier
/// process's or another replica's) can be older than the action that holds the
/// instance now, or late, so AWS decides ([`holds_pending_action`]: a hold is ours
/// when a heartbeat for our hook is accepted); the memories count only while AWS
/// cannot be asked. A drain running here is not asked: it holds the action already,
/// or completed it just now.
async fn hold_verdict(
    engine: &Engine,
    group: &str,
    instance_id: &str,
    state: &LifecycleState,
) -> Verdict {
    let mut story = HoldStory {
        draining_here: engine.is_draining(instance_id),
        finished_here: engine.book.action_done(instance_id),
        finished_on_node: false,
    };
    if !story.asks_aws() {
        return story.verdict(Hold::Unknown);
    }
    let aws = holds_pending_action(engine, group, instance_id, state).await;
    if aws == Hold::Unknown && !story.finished_here {
        // Read only when it counts: reading it teaches this process the Node's word.
        story.finished_on_node = engine.action_done_on_node(instance_id);
    }
    story.verdict(aws)
}

/// A drain found, from the Node's record alone, that our hook's action on the
/// instance was completed before (by a process since restarted, or another replica):
/// whose the hold is now, by the same rule ([`HoldStory::verdict`]), AWS asked first.
/// The record can be older than the action that holds the instance now; a hold let
/// go on its word alone would be left to the hook's timeout, undrained.
pub(crate) async fn confirm_finished_on_node(
    engine: &Engine,
    group: &str,
    instance_id: &str,
) -> Verdict {
    let story = HoldStory {
        draining_here: false,
        finished_here: false,
        finished_on_node: true,
    };
    story.verdict(ask_hold_as_new(engine, group, instance_id).await)
}

/// Our hook holds the instance with a new action: what this process remembers of
/// an earlier one is dropped, and so is a finished lifecycle reason (and a pool
/// rest) on its Node, which would otherwise make the new hold a repeat of the old
/// and drain nothing. The cordon stays: the node is leaving again. False when the
/// Node could not be written (the next poll tries again).
pub(crate) async fn forget_earlier_action(engine: &Engine, iid: &str) -> bool {
    engine.book.forget_action_done(iid);
    let Some(node) = engine.tools.nodes.node_for_instance(iid) else {
        return true;
    };
    let now = crate::clock::utc_now();
    let stale = |r: &crate::scalein::decide::record::DrainRecord| {
        r.lifecycle_completed(now) || r.in_warm_pool_since.is_some()
    };
    if !engine.cached_record(&node).is_some_and(|r| stale(&r)) {
        return true;
    }
    let written = crate::scalein::kube::node_record::update_record(
        &engine.tools.nodes,
        &engine.tools.client,
        &node,
        |r| {
            if !stale(r) {
                return false;
            }
            r.reasons.retain(|x| {
                !(x.done && matches!(x.why, crate::scalein::decide::record::Why::Lifecycle { .. }))
            });
            r.in_warm_pool_since = None;
            true
        },
    )
    .await;
    match written {
        Ok(_) => {
            tracing::info!(
                node,
                instance = iid,
                "a new action of our hook holds the instance: the Node's record of the last one is closed"
            );
            true
        }
        Err(e) => {
            tracing::warn!(node, instance = iid, error = %e, "cannot close the Node's record of our hook's last action on the instance; next poll retries");
            false
        }
    }
}

/// Counts a heartbeat AWS took, whoever sent it (the hold's loop, or a probe).
fn heartbeat_taken(engine: &Engine) {
    engine
        .tools
        .stats
        .heartbeats
        .fetch_add(1, Ordering::Relaxed);
    Metrics::outcome(&metrics().heartbeats, "ok");
}

/// The group with our hook added, for a hold AWS's hook list does not show yet (an
/// operator just added the hook; the list is eventually consistent): the hook's
/// timeout unknown, the hold follows the shortest it can be, AWS's minimum or the
/// configured `hookHeartbeatTimeout` when shorter. The provider is told, so the scan
/// looks at the group again and corrects the timeout once the list shows the hook.
pub fn with_hook_behind_its_list(
    engine: &Engine,
    group: &crate::provider::Group,
) -> crate::provider::Group {
    let timeout = AWS_MIN_HEARTBEAT_TIMEOUT.min(engine.settings.hook_heartbeat_timeout);
    let mut held = group.clone();
    held.hooks.push(LifecycleHook {
        name: engine.settings.hook_name.clone(),
        heartbeat_timeout_secs: timeout.as_secs().max(1) as i32,
        default_result: "ABANDON".into(),
    });
    if let Some(p) = &engine.provider {
        p.note_hooks(&held.asg.name, held.hooks.clone());
    }
    held
}

/// Counts a gauge up for as long as it lives.
struct GaugeGuard(prometheus_client::metrics::gauge::Gauge);

impl GaugeGuard {
    fn new(g: &prometheus_client::metrics::gauge::Gauge) -> Self {
        g.inc();
        Self(g.clone())
    }
}

impl Drop for GaugeGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}

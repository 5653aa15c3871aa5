//! End the instance, exactly once: CompleteLifecycleAction CONTINUE in
//! lifecycle mode, TerminateInstanceInAutoScalingGroup with decrement in direct mode.
//! Both check first whether the work is already done (a resumed drain).
//!
//! Before either, the instance is waited out of the load balancers' target groups
//! ([`super::last_mile`], bounded).
//!
//! This is the one room of the drain that ends an instance (`tests/layers.rs` checks
//! it): the drain's last stage, and the two ends a source asks for before any drain
//! ([`hand_to_hook`], [`end_without_node`]).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use backon::{ExponentialBuilder, Retryable};
use tokio::sync::OwnedMutexGuard;

use crate::cloud::{Cloud, CloudError, LifecycleAction, LifecycleResult, LifecycleState};
use crate::provider::{Group, Provider, ProviderError};
use crate::scalein::holds::Hold;
use crate::scalein::kube::events::Reason;
use crate::scalein::Mode;

use super::{deregister, last_mile};

const ATTEMPTS: u32 = 6;

/// What ending an instance needs of whoever runs the drain (the engine), and no more:
/// the fence, the instance's turn to be ended, the note that our action on it is
/// finished, AWS asked whether our hook holds it, the group's hooks as AWS has them
/// now, and what the wait for the load balancers needs (the Node's Event among it,
/// [`last_mile::WaitPort`]).
#[async_trait]
pub trait EndPort: last_mile::WaitPort {
    /// Whether this replica may end an instance now (it leads).
    fn may_end(&self) -> bool;
    /// The instance's turn to be ended, held while its termination and the note of it
    /// run: a second drain of the instance waits for them.
    async fn turn(&self, instance_id: &str) -> OwnedMutexGuard<()>;
    /// Our hook's lifecycle action on the instance is finished.
    fn action_done(&self, instance_id: &str);
    /// Whether our hook holds the instance, as AWS answers a heartbeat.
    async fn ask_hold(&self, group: &str, instance_id: &str) -> Hold;
    /// The group with its terminating hooks as AWS has them now.
    async fn hooks_now(&self, group: &Group) -> Result<Group, ProviderError>;
}

/// What the last stage may reach: AWS, the provider's accounting of what CA asked,
/// our hook's name, and the engine through [`EndPort`] only.
#[derive(Clone)]
pub struct Ending {
    pub cloud: Arc<dyn Cloud>,
    pub provider: Option<Arc<Provider>>,
    /// `hookName`: our EC2_INSTANCE_TERMINATING hook.
    pub hook_name: String,
    pub port: Arc<dyn EndPort>,
    /// The wait for the load balancers before the end ([`last_mile::wait_out`]).
    pub last_mile: last_mile::LastMile,
}

impl Ending {
    fn our_hook<'g>(&self, group: &'g Group) -> Option<&'g crate::cloud::LifecycleHook> {
        group.hooks.iter().find(|h| h.name == self.hook_name)
    }
}

/// TerminateInstanceInAutoScalingGroup with decrement for an instance of a group our
/// lifecycle hook holds: AWS then holds it in `Terminating:Wait` and the hold's drain
/// (the lifecycle scan's, or the caller's) ends it with [`finish`].
pub async fn hand_to_hook(cloud: &dyn Cloud, instance_id: &str) -> Result<(), CloudError> {
    cloud.terminate_instance(instance_id, true).await
}

/// TerminateInstanceInAutoScalingGroup with decrement, at once, for an instance the API
/// server says no Node is for: nothing can run on it, so there is nothing to drain.
pub async fn end_without_node(cloud: &dyn Cloud, instance_id: &str) -> Result<(), CloudError> {
    cloud.terminate_instance(instance_id, true).await
}

/// Ends the instance. Returns a human summary, or the last error.
pub async fn finish(
    end: &Ending,
    mode: &Mode,
    group: &str,
    instance_id: &str,
    node: Option<&str>,
) -> Result<String, String> {
    // Out of the load balancers first (bounded; our hook's heartbeats go on): out of
    // the group's own target groups when it asks for it, then the wait.
    deregister::deregister_own(
        end.cloud.as_ref(),
        &end.last_mile,
        end.port.as_ref(),
        mode,
        group,
        instance_id,
        node,
    )
    .await;
    last_mile::wait_out(
        end.cloud.as_ref(),
        &end.last_mile,
        end.port.as_ref(),
        mode,
        instance_id,
        node,
    )
    .await;
    let summary = (|| end_once(end, mode, group, instance_id))
        .retry(retry_policy(instance_id))
        .sleep(tokio::time::sleep)
        .when(CloudError::is_retryable)
        .notify(|e, retry_in| {
            tracing::warn!(instance = instance_id, group, error = %e, ?retry_in, "ending the instance failed; retrying");
        })
        .await
        .map_err(|e| e.to_string())?;
    if let Mode::Lifecycle { .. } = mode {
        // Another hook (EKS's) may hold the instance in Terminating:Wait a while yet.
        end.port.action_done(instance_id);
    }
    if let (Some(node), false) = (node, matches!(mode, Mode::DrainOnly)) {
        let reason = match mode {
            Mode::Lifecycle { .. } => Reason::LifecycleCompleted,
            _ => Reason::InstanceTerminated,
        };
        end.port.say(node, reason, summary.clone()).await;
    }
    Ok(summary)
}

/// Six attempts in all, 0.5 s doubling to 10 s with jitter: about 30 s of AWS
/// throttling or 5xx before the drain reports the failure (the hook's heartbeat keeps
/// the instance held meanwhile).
fn retry_policy(instance_id: &str) -> ExponentialBuilder {
    attempts(
        Duration::from_millis(500),
        Duration::from_secs(10),
        &format!("ending {instance_id}"),
    )
}

/// Asking whether a hook added since holds the ended instance, and completing its
/// action: six attempts, 0.2 s doubling to 2 s with jitter (about 5 s), so a throttled
/// answer is asked again well inside the shortest heartbeat timeout AWS allows (30 s);
/// without it one throttled heartbeat left the hold to time out (all_sources_model,
/// `MODEL_SEED=1795866496873429417 MODEL_CASE=1760`).
fn probe_policy(instance_id: &str) -> ExponentialBuilder {
    attempts(
        Duration::from_millis(200),
        Duration::from_secs(2),
        &format!("asking the hold of {instance_id}"),
    )
}

/// [`ATTEMPTS`] attempts in all, `min` doubling to `max`, jittered by `key`.
fn attempts(min: Duration, max: Duration, key: &str) -> ExponentialBuilder {
    let policy = ExponentialBuilder::default()
        .with_min_delay(min)
        .with_max_delay(max)
        .with_max_times(ATTEMPTS as usize - 1);
    crate::clock::jittered(policy, key)
}

/// The fence's refusal: this replica does not lead, so the leader ends the instance.
fn not_leader(instance_id: &str) -> CloudError {
    CloudError::Rejected {
        operation: "end the instance".into(),
        code: "NotLeader".into(),
        message: format!("this replica no longer leads; the leader ends {instance_id}"),
    }
}

/// One attempt at ending the instance.
async fn end_once(
    end: &Ending,
    mode: &Mode,
    group: &str,
    instance_id: &str,
) -> Result<String, CloudError> {
    // Fenced: only the leader ends an instance or completes an action (a replica
    // that lost the lease mid-drain leaves it to the new leader, which resumes it).
    if !end.port.may_end() && !matches!(mode, Mode::DrainOnly) {
        return Err(not_leader(instance_id));
    }
    match mode {
        Mode::DrainOnly => Ok("drained; the instance is left running (drain only)".into()),
        Mode::Lifecycle { action, .. } => {
            match end.cloud.complete_lifecycle_action(action, LifecycleResult::Continue).await {
                Ok(()) => Ok(format!(
                    "completed lifecycle action CONTINUE for {instance_id} (hook {}, group {group})",
                    action.hook
                )),
                // No action pending: a previous run completed it, the hook timed
                // out or was deleted by hand (AWS then holds nothing under it), and
                // the instance is on its way out; or (a fast drain right after
                // TerminateInstanceInAutoScalingGroup) the instance has not reached
                // Terminating:Wait yet, and the action is still to come.
                Err(e) if crate::scalein::holds::no_action(&e).is_some() => {
                    let message = crate::scalein::holds::no_action(&e).unwrap_or_default();
                    // Not yet held by the hook: the action is still to come. (Held, a
                    // "no action" is an action gone: completed before, timed out.)
                    if crate::scalein::holds::in_state(end.cloud.as_ref(), instance_id, &LifecycleState::BEFORE_OUR_HOLD).await {
                        Err(CloudError::Transient {
                            operation: "CompleteLifecycleAction".into(),
                            message: format!("instance {instance_id} has not reached Terminating:Wait yet"),
                        })
                    } else {
                        Ok(format!("lifecycle action for {instance_id} was already complete ({message})"))
                    }
                }
                Err(e) => Err(e),
            }
        }
        Mode::Direct => direct(end, group, instance_id).await,
    }
}

/// Direct mode's end, run to its end whatever happens to the drain: once
/// TerminateInstanceInAutoScalingGroup is sent the decrement may be done, so the
/// call and its note to the provider go on in their own task when the drain is
/// stopped (a lost Lease, a joining reason). One end per instance at a time: a
/// resumed drain waits for the one in flight before it reads the instance's state,
/// or it would take the instance for one ended elsewhere and give up its slot a
/// second time.
async fn direct(end: &Ending, group: &str, instance_id: &str) -> Result<String, CloudError> {
    let turn = end.port.turn(instance_id).await;
    let (end, group, id) = (end.clone(), group.to_string(), instance_id.to_string());
    tokio::spawn(async move {
        let _turn = turn;
        direct_once(&end, &group, &id).await
    })
    .await
    .unwrap_or_else(|e| {
        Err(CloudError::Transient {
            operation: "TerminateInstanceInAutoScalingGroup".into(),
            message: format!("the termination's task ended early: {e}"),
        })
    })
}

async fn direct_once(end: &Ending, group: &str, instance_id: &str) -> Result<String, CloudError> {
    let ids = [instance_id.to_string()];
    let state = end.cloud.locate_instances(&ids).await?;
    // Gone, ending, or sent back to the warm pool by a termination that went out
    // before (a pool that reuses instances on scale-in keeps them): nothing to end.
    let already = match state.first() {
        None => true,
        Some(loc) => loc.state.is_terminating() || loc.state.in_warm_pool(),
    };
    // The fence again after the read, which can outlast the term (the leadership
    // model, with AWS slow): nothing is sent yet, so nothing is done twice.
    if !already && !end.port.may_end() {
        return Err(not_leader(instance_id));
    }
    if !already {
        tracing::info!(
            group,
            instance = instance_id,
            "terminating instance with decrement"
        );
        end.cloud.terminate_instance(instance_id, true).await?;
        learn_a_hook_added_since(end, group, instance_id).await;
    }
    if let Some(p) = &end.provider {
        if already {
            // Ended by someone else (EC2 reclaiming a spot instance): no decrement
            // happened; its slot is given up only while nothing refilled it.
            p.deferred_ended_elsewhere(instance_id).await;
        } else {
            p.deferred_terminated(instance_id);
        }
    }
    Ok(if already {
        format!("instance {instance_id} was already terminating")
    } else {
        format!("terminated instance {instance_id} in {group} (desired capacity decremented)")
    })
}

/// Direct mode ends an instance of a group the service knows without our hook. If an
/// operator has added our hook since (the quickstart has them add it by hand), AWS now
/// holds the instance in Terminating:Wait under it. The group's hooks are read at once,
/// so the lifecycle scan takes the group from its next poll and completes the action
/// of the drained node, instead of the hook waiting until a refresh learns of it (a
/// refresh interval plus 10 s: longer than a 30 s hook). A failed read changes
/// nothing; the next refresh finds the hook, as before.
///
/// AWS's hook list is eventually consistent: a hook added a moment ago may be missing
/// from it still. So when the list still shows no hook of ours, the action itself is
/// asked ([`crate::scalein::engine::keeper::ask_hold`]); if our hook holds the instance, its drain is over
/// (this is its end) and the action is completed at once (all_sources_model found a
/// hook added while AWS's reads lagged timing out after a direct drain's end). A
/// throttled question or completion is asked again ([`probe_policy`]).
///
/// Only the leader asks and completes (both are writes): a replica that stepped down
/// meanwhile leaves the hold to the new leader's scan.
async fn learn_a_hook_added_since(end: &Ending, group: &str, instance_id: &str) {
    let Some(p) = &end.provider else { return };
    if !end.port.may_end() {
        return;
    }
    let Some(g) = p.registry().group(group).cloned() else {
        return;
    };
    if end.our_hook(&g).is_some() {
        return;
    }
    match end.port.hooks_now(&g).await {
        Ok(g) if end.our_hook(&g).is_some() => return,
        Ok(_) => {}
        Err(e) => {
            tracing::debug!(group, error = %e, "could not read the group's hooks after ending an instance; the next refresh will")
        }
    }
    let asked = (|| async {
        match end.port.ask_hold(group, instance_id).await {
            Hold::Unknown => Err(()),
            known => Ok(known),
        }
    })
    .retry(probe_policy(instance_id))
    .sleep(tokio::time::sleep)
    .await;
    if asked != Ok(Hold::Held) || !end.port.may_end() {
        return;
    }
    let action = LifecycleAction {
        group: group.to_string(),
        hook: end.hook_name.clone(),
        instance_id: instance_id.to_string(),
        token: None,
    };
    let completed = (|| {
        end.cloud
            .complete_lifecycle_action(&action, LifecycleResult::Continue)
    })
    .retry(probe_policy(instance_id))
    .sleep(tokio::time::sleep)
    .when(CloudError::is_retryable)
    .await;
    match completed {
        Ok(()) => {
            end.port.action_done(instance_id);
            tracing::info!(group, instance = instance_id, hook = %action.hook, "our hook, added since the drain began, held the drained instance: completed CONTINUE");
        }
        Err(e) => {
            tracing::warn!(group, instance = instance_id, error = %e, "our hook holds the drained instance and its completion failed; the lifecycle scan completes it")
        }
    }
}

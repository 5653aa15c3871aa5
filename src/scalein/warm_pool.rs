//! Instances that go back to their group's warm pool (`ReuseOnScaleIn`). The drain
//! is the one every scale-in gets: the lifecycle scan finds our hook's hold in
//! `Warmed:Pending:Wait` (Destination WarmPool) as it finds `Terminating:Wait`, and
//! the drain completes the action. What is left is the Node: the instance keeps it
//! while it rests in the pool (a stopped instance still exists), and when it leaves
//! the pool for the group the kubelet comes back to a Node this service cordoned,
//! tainted and marked. [`follow`] hands it back then, so the reused instance takes
//! pods again with nothing of this service on it.
//!
//! Two steps, each decided by [`step`] (pure) from the Node's record and AWS's
//! state of the instance, each written to the Node so a restart or a new leader
//! goes on from there:
//! - our hook's action is completed and AWS shows the instance resting in the pool:
//!   the record notes when ([`DrainRecord::in_warm_pool_since`]), Event
//!   `ReturnedToWarmPool`;
//! - the record says it rested in the pool and AWS shows it in the group again
//!   (Pending on its way, or InService): cordon, taint, marks and labels this
//!   service put on come off ([`super::cordon::uncordon`]), Event `BackFromWarmPool`.
//!   The record goes with them, so the instance's next scale-in is a new action
//!   and not taken for the finished one.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::cloud::LifecycleState;
use crate::provider::Provider;
use crate::telemetry::metrics::{metrics, Metrics};

use super::events::Reason;
use super::record::{after, DrainRecord};
use super::Engine;

/// How long an instance rests in the pool, as this service saw it, before a read
/// showing it in the group again hands its Node back. AWS's reads lag by seconds: a
/// read that old cannot be one from before the scale-in that sent it to the pool.
pub const SETTLED: Duration = Duration::from_secs(30);

/// What [`follow`] does with one Node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    Nothing,
    /// Note on the Node that the instance rests in the pool.
    InPool,
    /// Hand the Node back: the instance left the pool for its group.
    HandBack,
}

/// The step for a Node with `record`, whose instance AWS shows in `state` (`None`:
/// AWS does not know it). Nothing while any reason still drains; a pool rest is
/// noted only after our hook's action was completed (a node handed back must have
/// been drained for the pool, never one a read showed in the group before its
/// scale-in); the hand-back only from the group's own states (Pending on the way in,
/// InService), never from a state this code does not know.
pub fn step(
    record: &DrainRecord,
    state: Option<&LifecycleState>,
    now: DateTime<Utc>,
    settle: Duration,
) -> Step {
    let Some(state) = state else {
        return Step::Nothing;
    };
    if record.drain_began().is_some() {
        return Step::Nothing;
    }
    match record.in_warm_pool_since {
        None if record.lifecycle_completed(now) && resting_in_pool(state) => Step::InPool,
        Some(since)
            if (*state == LifecycleState::InService || state.is_pending())
                && now >= after(since, settle) =>
        {
            Step::HandBack
        }
        _ => Step::Nothing,
    }
}

/// In the pool past our hook: `Warmed:Pending:Proceed`, `Warmed:Stopped`,
/// `Warmed:Running`, `Warmed:Hibernated`; not on its way in (`Warmed:Pending`,
/// `Warmed:Pending:Wait`, another hook may still hold it) and not being ended.
fn resting_in_pool(state: &LifecycleState) -> bool {
    state.in_warm_pool() && !state.is_pool_bound() && !state.as_str().contains("Terminat")
}

/// One pass over the Nodes whose drain finished for a group with a warm pool (and
/// those noted in the pool): one DescribeAutoScalingInstances for all of them, then
/// each Node's [`step`]. Leader only, never in a dry run. Returns how many Nodes
/// were handed back.
pub async fn follow(engine: &Arc<Engine>, provider: &Arc<Provider>) -> usize {
    if engine.settings.dry_run {
        return 0;
    }
    let now = Utc::now();
    let reg = provider.registry();
    let marks: Vec<(String, String, DrainRecord)> = engine
        .nodes
        .marked_for_drain()
        .into_iter()
        .filter_map(|m| {
            let iid = m.instance?;
            let pooled = m.record.in_warm_pool_since.is_some()
                || (m.record.lifecycle_completed(now)
                    && reg
                        .group(&m.group)
                        .is_some_and(|g| g.asg.warm_pool.is_some()));
            (pooled && !engine.is_draining(&iid)).then_some((m.node, iid, m.record))
        })
        .collect();
    if marks.is_empty() {
        return 0;
    }
    let ids: Vec<String> = marks.iter().map(|(_, i, _)| i.clone()).collect();
    let states: BTreeMap<String, LifecycleState> = match engine.cloud.locate_instances(&ids).await {
        Ok(found) => found
            .into_iter()
            .map(|l| (l.instance_id, l.state))
            .collect(),
        Err(e) => {
            tracing::warn!(error = %e, "warm pool: cannot read where drained instances are; next poll retries");
            return 0;
        }
    };
    let mut handed_back = 0;
    for (node, iid, record) in marks {
        let state = states.get(&iid);
        match step(&record, state, now, engine.settings.warm_pool_settle) {
            Step::Nothing => {}
            Step::InPool => note_in_pool(engine, &node, &iid, state, now).await,
            Step::HandBack => {
                if hand_back(engine, &node, &iid, state).await {
                    handed_back += 1;
                }
            }
        }
    }
    handed_back
}

async fn note_in_pool(
    engine: &Engine,
    node: &str,
    iid: &str,
    state: Option<&LifecycleState>,
    now: DateTime<Utc>,
) {
    let written = super::cordon::update_record(engine, node, |r| {
        let first = r.in_warm_pool_since.is_none();
        r.in_warm_pool_since.get_or_insert(now);
        first
    })
    .await;
    match written {
        Ok(_) => {
            Metrics::outcome(&metrics().warm_pool_returns, "in_pool");
            let state = state.map(LifecycleState::as_str).unwrap_or("?");
            tracing::info!(node, instance = iid, state, "drained instance rests in its group's warm pool; its Node is handed back when it leaves the pool");
            engine
                .events
                .node(
                    node,
                    Reason::ReturnedToWarmPool,
                    format!("instance {iid} rests in its group's warm pool ({state}); the node is handed back when the instance returns to the group"),
                )
                .await;
        }
        Err(e) => {
            Metrics::outcome(&metrics().warm_pool_returns, "error");
            tracing::warn!(node, instance = iid, error = %e, "warm pool: cannot note the pool rest on the Node; next poll retries");
        }
    }
}

async fn hand_back(engine: &Engine, node: &str, iid: &str, state: Option<&LifecycleState>) -> bool {
    let state = state.map(LifecycleState::as_str).unwrap_or("?");
    match super::cordon::uncordon(engine, node).await {
        Ok(()) => {
            Metrics::outcome(&metrics().warm_pool_returns, "handed_back");
            tracing::info!(node, instance = iid, state, "instance left the warm pool for its group: node handed back (uncordoned, marks removed)");
            engine
                .events
                .node(
                    node,
                    Reason::BackFromWarmPool,
                    format!("instance {iid} left the warm pool for its group ({state}): this service's cordon, taint and drain record are removed"),
                )
                .await;
            true
        }
        Err(e) => {
            Metrics::outcome(&metrics().warm_pool_returns, "error");
            tracing::warn!(node, instance = iid, error = %e, "warm pool: cannot hand the Node back; next poll retries");
            false
        }
    }
}

#[cfg(test)]
mod tests;

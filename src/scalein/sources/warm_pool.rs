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
//! - AWS shows it in the group again (Pending on its way, or InService) after our
//!   hook's action let it go (a rest in the pool seen or not: it can come back
//!   between two polls): cordon, taint, marks and labels this service put on come
//!   off ([`crate::scalein::stages::cordon::uncordon`]), Event `BackFromWarmPool`.
//!   The record goes with them, so the instance's next scale-in is a new action
//!   and not taken for the finished one.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::cloud::LifecycleState;
use crate::provider::Provider;
use crate::telemetry::metrics::{metrics, Metrics};

use crate::scalein::decide::record::{after, DrainRecord};
use crate::scalein::kube::events::Reason;
use crate::scalein::Engine;

pub use crate::scalein::settings::WARM_POOL_SETTLED as SETTLED;

/// How long the loop looks every second (the lifecycle loop's `SOON`) for instances leaving a
/// group's pool after CA raised the group's size (the pool fills the new capacity
/// first): their Nodes are handed back by the poll after AWS shows them in the group,
/// not a poll interval (in queue mode, the safety net's) later.
pub const RETURN_WATCH: Duration = Duration::from_secs(90);

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
/// AWS does not know it). Nothing while a reason other than our hook's still
/// drains. A pool rest is noted only after our hook's action was completed. The
/// hand-back comes only from the group's own states (Pending on the way in,
/// InService), never from a state this code does not know, and only for a node our
/// hook's action let go: an instance whose terminating action is over never serves
/// the group again unless the warm pool gave it back, and one back in the group has
/// no such action pending, whatever the record says (the completion's note on the
/// Node can be lost to a refused write or a crash). It comes `settle` after that
/// action's hold arrived (a rest in the pool seen or not: taken back between two
/// polls, or while no replica led): the scale-in came before the hold, so a read that
/// much later cannot be one from before it, and a lagging read never uncordons a node
/// on its way out. A scale-up minutes after the scale-in is handed back at once.
pub fn step(
    record: &DrainRecord,
    state: Option<&LifecycleState>,
    now: DateTime<Utc>,
    settle: Duration,
) -> Step {
    let Some(state) = state else {
        return Step::Nothing;
    };
    let back_in_group = *state == LifecycleState::InService || state.is_pending();
    let mut let_go_at = None;
    for r in &record.reasons {
        match (&r.why, r.done) {
            (crate::scalein::decide::record::Why::Lifecycle { .. }, done)
                if done || back_in_group =>
            {
                let_go_at = let_go_at.max(Some(r.at));
            }
            (crate::scalein::decide::record::Why::Lifecycle { .. }, _) => return Step::Nothing,
            (why, false) if why.drains() => return Step::Nothing,
            _ => {}
        }
    }
    match let_go_at.or(record.in_warm_pool_since) {
        Some(at) if back_in_group && now >= after(at, settle) => Step::HandBack,
        _ if record.in_warm_pool_since.is_none()
            && record.lifecycle_completed(now)
            && state.is_resting_in_pool() =>
        {
            Step::InPool
        }
        _ => Step::Nothing,
    }
}

/// `warm_pool_instances{node_group,state}` from one read of the group's pool: each
/// state AWS names (0 when none), and any other the read showed.
pub fn count_states(group: &str, pool: &[crate::cloud::AsgInstance]) {
    let states: Vec<LifecycleState> = LifecycleState::pool_states().collect();
    let mut counts: BTreeMap<&str, i64> = states.iter().map(|s| (s.as_str(), 0)).collect();
    for i in pool {
        *counts.entry(i.state.as_str()).or_default() += 1;
    }
    for (state, n) in counts {
        metrics()
            .warm_pool_instances
            .get_or_create(&crate::telemetry::metrics::PoolStateLabels {
                node_group: group.to_string(),
                state: state.to_string(),
            })
            .set(n);
    }
}

/// Instances resting or warming in the pool (not on their way in from a scale-in)
/// whose Node carries no drain of this service: their bootstrap joined the cluster
/// while warming. The Node goes NotReady when the instance stops, and counts in CA's
/// unready nodes. Said once per instance and process: a warning Event on the Node,
/// a log line, `warm_pool_registered_while_warming_total{node_group}`.
pub async fn registered_while_warming(
    engine: &Engine,
    group: &str,
    pool: &[crate::cloud::AsgInstance],
) {
    for inst in pool {
        if inst.state.is_pool_bound_wait() || inst.state.as_str().contains("Terminat") {
            continue;
        }
        let Some(node) = engine.tools.nodes.node_for_instance(&inst.id) else {
            continue;
        };
        if engine.cached_record(&node).is_some()
            || !engine
                .book
                .note_once("registered while warming", inst.id.clone())
        {
            continue;
        }
        metrics()
            .warm_pool_registered
            .get_or_create(&crate::telemetry::metrics::GroupLabels {
                node_group: group.to_string(),
            })
            .inc();
        let note = format!(
            "instance {} is in group {group}'s warm pool ({}) and registered this Node while warming: its user data joined the cluster before the instance entered service; keep the bootstrap from joining in the pool (docs/node-groups.md)",
            inst.id,
            inst.state.as_str()
        );
        tracing::warn!(node, instance = %inst.id, group, "{note}");
        engine
            .tools
            .events
            .node(&node, Reason::RegisteredWhileWarming, note)
            .await;
    }
}

/// CA raised `group`'s size: when Nodes of instances this service sent to the
/// group's pool wait to be handed back, the loop looks every
/// second for [`RETURN_WATCH`] ([`follow`] each time), so the
/// Node of an instance the pool gives back takes pods within about a second of AWS
/// showing it in the group.
pub fn capacity_added(engine: &Engine, group: &crate::provider::Group) {
    let waiting = engine
        .tools
        .nodes
        .marked_for_drain()
        .iter()
        .any(|m| m.group == group.asg.name && m.record.in_warm_pool_since.is_some());
    if waiting {
        tracing::debug!(group = %group.asg.name, "size raised with Nodes resting in the warm pool: watching for their return");
        engine.schedule.follow_soon(RETURN_WATCH);
    }
}

/// One pass over the Nodes whose drain finished for a group with a warm pool (and
/// those noted in the pool): one DescribeAutoScalingInstances for all of them, then
/// each Node's [`step`]. Leader only, never in a dry run. Returns how many Nodes
/// were handed back.
pub async fn follow(engine: &Arc<Engine>, provider: &Arc<Provider>) -> usize {
    if engine.settings.dry_run {
        return 0;
    }
    let now = crate::clock::utc_now();
    let reg = provider.registry();
    let marks: Vec<(String, String, DrainRecord)> = engine
        .tools
        .nodes
        .marked_for_drain()
        .into_iter()
        .filter_map(|m| {
            let iid = m.instance?;
            let ours =
                m.record.reasons.iter().any(|r| {
                    matches!(r.why, crate::scalein::decide::record::Why::Lifecycle { .. })
                });
            let pooled = m.record.in_warm_pool_since.is_some()
                || (ours
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
        // The AWS read above can outlast this replica's term (the soak's seed 3008: a
        // pool rest noted on a Node 2.6 s after the replica stepped down): a pass that
        // is no longer the leader's writes nothing more.
        if !engine.is_leader() {
            break;
        }
        let state = states.get(&iid);
        match step(&record, state, now, engine.settings.warm_pool_settle) {
            Step::Nothing => {}
            Step::InPool => note_in_pool(engine, &node, &iid, state, now).await,
            Step::HandBack => {
                if hand_back(engine, &node, &iid, state, &record).await {
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
    let written = crate::scalein::kube::node_record::update_record(
        &engine.tools.nodes,
        &engine.tools.client,
        node,
        |r| {
            let first = r.in_warm_pool_since.is_none();
            r.in_warm_pool_since.get_or_insert(now);
            first
        },
    )
    .await;
    match written {
        Ok(_) => {
            Metrics::outcome(&metrics().warm_pool_returns, "in_pool");
            let state = state.map(LifecycleState::as_str).unwrap_or("?");
            tracing::info!(node, instance = iid, state, "drained instance rests in its group's warm pool; its Node is handed back when it leaves the pool");
            engine
                .tools
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

/// Gives the node back, only while its record is the one the hand-back was decided
/// from: a reason recorded meanwhile (the instance leaving again) keeps it.
async fn hand_back(
    engine: &Engine,
    node: &str,
    iid: &str,
    state: Option<&LifecycleState>,
    decided_on: &DrainRecord,
) -> bool {
    let state = state.map(LifecycleState::as_str).unwrap_or("?");
    match crate::scalein::stages::cordon::uncordon_if(&engine.stage(), node, decided_on).await {
        Ok(None) => {
            tracing::info!(node, instance = iid, state, "warm pool: the Node's drain record changed since the hand-back was decided; not handed back (the next poll decides again)");
            false
        }
        Ok(Some(given)) => {
            Metrics::outcome(&metrics().warm_pool_returns, "handed_back");
            tracing::info!(node, instance = iid, state, "instance left the warm pool for its group: node handed back (uncordoned, marks removed)");
            engine
                .tools
                .events
                .node(
                    node,
                    Reason::BackFromWarmPool,
                    format!("instance {iid} left the warm pool for its group ({state}): this service's cordon, taint and drain record are removed{}", given.note()),
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

//! Telling cluster-autoscaler before it picks: the leader keeps
//! `cluster-autoscaler.kubernetes.io/scale-down-disabled` on the nodes a disruption
//! budget would hold from CA's scale-in now, and takes it off again once the budget
//! has room ([`crate::scalein::decide::ca_hold`] decides; the annotation is written
//! with our mark, and only a Node with our mark is ever released).
//!
//! A pass runs every `tell_ca_every` (10 s) and when a drain's slot goes back. It
//! reads the Nodes from the engine's watch, so a pass with nothing to change sends
//! no request (one list of pods when a budget tells empty from occupied nodes); it
//! writes only transitions, at most [`WRITES_PER_PASS`] of them (the rest next
//! pass), holds before releases. A refused write is logged and tried again next
//! pass. The state lives on the Nodes: a restarted or new leader reads it back.

use std::collections::BTreeMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};

use crate::scalein::decide::budget::{self, Place};
use crate::scalein::decide::ca_hold::{self, Candidate, Change};
use crate::scalein::engine::{gate, Engine};
use crate::scalein::kube::ca_hold::{ApiNotes, HoldNotes};
use crate::telemetry::metrics::{metrics, BudgetLabels};

/// At most this many Nodes written per pass: a closed window over a 500-node
/// group is said in ten passes, not by 500 patches at once.
pub const WRITES_PER_PASS: usize = 50;

const NAME: &str = "scale-down hold for CA";

/// What a pass did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Told {
    /// Nodes held from CA now.
    pub held: usize,
    /// Writes made, and refused (tried again next pass).
    pub written: usize,
    pub refused: usize,
    /// Transitions left for the next pass (over [`WRITES_PER_PASS`]).
    pub left: usize,
}

/// Runs the passes while the engine lives (only the leader writes).
pub(crate) fn spawn(engine: Weak<Engine>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let Some(mut ready) = engine.upgrade().map(|e| e.tools.nodes.readiness()) else {
            return;
        };
        if ready.wait_for(|r| *r).await.is_err() {
            return;
        }
        loop {
            let Some(e) = engine.upgrade() else {
                return;
            };
            turn(&e).await;
        }
    })
}

/// One pass and the wait for the next.
async fn turn(e: &Arc<Engine>) {
    let every = e.settings.tell_ca_every;
    e.tools
        .liveness
        .beat(NAME, every.saturating_mul(6).max(Duration::from_secs(60)));
    let freed = e.book.slot_freed();
    tokio::pin!(freed);
    freed.as_mut().enable();
    if e.is_leader() && !e.settings.dry_run {
        tell(e, &ApiNotes(&e.tools.client)).await;
    }
    tokio::select! {
        () = &mut freed => {
            // Drains that end together make one pass.
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        () = tokio::time::sleep(every) => {}
    }
}

/// One pass: decide which nodes CA may not pick, and write what changed.
pub async fn tell(engine: &Engine, notes: &impl HoldNotes) -> Told {
    let budgets = engine.settings.budgets_in_order();
    let now = crate::clock::utc_now();
    let nodes = engine.tools.nodes.store().state();
    let held = decide(engine, &budgets, &nodes, now).await;
    say_held(&budgets, &held);
    let mut changes: Vec<(Arc<Node>, Option<&str>, Change)> = nodes
        .iter()
        .filter_map(|n| {
            let name = n.metadata.name.as_deref()?;
            let want = held.get(name).map(String::as_str);
            let annotations = n.metadata.annotations.clone().unwrap_or_default();
            ca_hold::change(&annotations, want).map(|c| (n.clone(), want, c))
        })
        .collect();
    // Holds first: a node CA must not pick matters more than one it may again. Then
    // by name: the store's order is a hash map's, and a pass writes in one order
    // on every replay.
    changes.sort_by(|(a, _, ca), (b, _, cb)| {
        (matches!(ca, Change::Release), &a.metadata.name)
            .cmp(&(matches!(cb, Change::Release), &b.metadata.name))
    });
    let mut told = Told {
        held: held.len(),
        left: changes.len().saturating_sub(WRITES_PER_PASS),
        ..Told::default()
    };
    for (node, want, _) in changes.into_iter().take(WRITES_PER_PASS) {
        let name = node.metadata.name.clone().unwrap_or_default();
        match notes.write(&name, Some(node), want).await {
            Ok(Some(c)) => {
                told.written += 1;
                tracing::info!(node = %name, budget = want.unwrap_or(""), "{}", said(&c));
            }
            Ok(None) => {}
            Err(e) => {
                told.refused += 1;
                tracing::warn!(node = %name, error = %e, "cannot write whether CA may pick the node for scale-down; tried again next pass");
            }
        }
    }
    told
}

fn said(c: &Change) -> String {
    match c {
        Change::Hold(b) => format!("node kept out of cluster-autoscaler's scale-down: disruption budget {b:?} would hold its drain now"),
        Change::Release => "node given back to cluster-autoscaler's scale-down: no budget would hold its drain now".to_string(),
    }
}

/// The nodes held, each with its budget: every node of a group the provider knows
/// (warm-pool instances aside), as the gate would see CA's drain of it now.
async fn decide(
    engine: &Engine,
    budgets: &[budget::Budget],
    nodes: &[Arc<Node>],
    now: chrono::DateTime<chrono::Utc>,
) -> BTreeMap<String, String> {
    let Some(provider) = &engine.provider else {
        return BTreeMap::new();
    };
    if budgets.iter().all(|b| b.in_force(now).is_none()) {
        return BTreeMap::new();
    }
    let registry = provider.registry();
    let by_instance: BTreeMap<&str, &str> = nodes
        .iter()
        .filter_map(|n| {
            let id = n
                .spec
                .as_ref()?
                .provider_id
                .as_deref()
                .and_then(crate::provider::provider_id::instance_id)?;
            Some((id, n.metadata.name.as_deref()?))
        })
        .collect();
    let empty = emptiness(engine, budgets, now).await;
    let mut candidates = Vec::new();
    for g in &registry.groups {
        for i in g.asg.instances.iter().filter(|i| !i.state.in_warm_pool()) {
            let Some(node) = by_instance.get(i.id.as_str()) else {
                continue;
            };
            candidates.push(Candidate {
                node,
                place: Place {
                    group: &g.asg.name,
                    zone: &i.zone,
                    tags: &g.asg.tags,
                },
                empty: empty
                    .as_ref()
                    .map(|e| !e.get(*node).copied().unwrap_or(false)),
            });
        }
    }
    gate::read_world(engine, now, |world| {
        ca_hold::held(budgets, world, &candidates)
    })
}

/// When a budget in force tells empty from occupied nodes: whether each node runs
/// workload pods (a node absent runs none), from one list of every pod. `None`:
/// not needed, or the list failed (every node then counts as both, rule 2).
async fn emptiness(
    engine: &Engine,
    budgets: &[budget::Budget],
    now: chrono::DateTime<chrono::Utc>,
) -> Option<BTreeMap<String, bool>> {
    let in_force: Vec<budget::Budget> = budgets
        .iter()
        .filter(|b| b.in_force(now).is_some())
        .cloned()
        .collect();
    if !ca_hold::tells_empty_from_occupied(&in_force) {
        return None;
    }
    let pods: kube::Api<Pod> = kube::Api::all(engine.tools.client.clone());
    let list = match pods.list(&kube::api::ListParams::default()).await {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!(error = %e, "cannot list pods to tell empty nodes from occupied ones; every node counts as both for CA's scale-down");
            return None;
        }
    };
    let mut on: BTreeMap<String, Vec<&Pod>> = BTreeMap::new();
    for p in &list.items {
        if let Some(n) = p.spec.as_ref().and_then(|s| s.node_name.clone()) {
            on.entry(n).or_default().push(p);
        }
    }
    Some(
        on.into_iter()
            .map(|(n, pods)| (n, gate::runs_workload(engine, pods)))
            .collect(),
    )
}

/// `nodes_held_from_ca{budget}`: every budget's count, zero for those holding none.
fn say_held(budgets: &[budget::Budget], held: &BTreeMap<String, String>) {
    for b in budgets {
        let n = held.values().filter(|h| **h == b.name).count();
        metrics()
            .nodes_held_from_ca
            .get_or_create(&BudgetLabels {
                budget: b.name.clone(),
            })
            .set(n as i64);
    }
}

//! Telling cluster-autoscaler before it picks (issue 71), on the real engine (memory
//! cloud, in-memory API server): while a budget governing CA's scale-in is closed
//! or full, the leader keeps `cluster-autoscaler.kubernetes.io/scale-down-disabled`
//! (with our mark) on the nodes it covers and no other; once the budget has room it
//! removes only its own; an operator's annotation is never taken over nor removed; a
//! restart reads the state back from the Nodes and writes nothing; a DeleteNodes that
//! still arrives for a held node is answered and counted as any other, and held.

use std::sync::Arc;
use std::time::Duration;

use ca_asg_provider::cloud::memory::MemoryGroup;
use ca_asg_provider::scalein::decide::budget::{cron::Cron, Budget, Cause, Groups, Nodes, Window};
use ca_asg_provider::scalein::decide::ca_hold::{HELD_BY, SCALE_DOWN_DISABLED};
use ca_asg_provider::scalein::{Outcome, ScaleInSettings};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;

mod support;
use support::eventually;
use support::world::*;

/// A budget over CA's scale-in of the group `web`.
fn for_ca_on_web(name: &str, nodes: Nodes) -> Budget {
    Budget {
        name: name.into(),
        nodes,
        groups: Groups::Named(["web".to_string()].into()),
        zones: Default::default(),
        causes: Some([Cause::CaEmpty, Cause::CaOccupied].into()),
        window: None,
        rate: None,
    }
}

/// A window in force all the time the test runs: no scale-in of `web` by CA.
fn frozen() -> Budget {
    Budget {
        window: Some(Window {
            schedule: Cron::parse("* * * * *").unwrap(),
            duration: Duration::from_secs(3600),
        }),
        ..for_ca_on_web("frozen", Nodes::Count(0))
    }
}

fn settings(budgets: Vec<Budget>) -> ScaleInSettings {
    ScaleInSettings {
        budgets,
        tell_ca_every: Duration::from_millis(100),
        ..fast_settings()
    }
}

/// (scale-down-disabled, our mark) on the Node.
fn says(w: &World, node: &str) -> (Option<String>, Option<String>) {
    let n = w.sim.get::<Node>("", node).unwrap();
    let a = &n["metadata"]["annotations"];
    let get = |k: &str| a[k].as_str().map(str::to_string);
    (get(SCALE_DOWN_DISABLED), get(HELD_BY))
}

fn held_by(w: &World, node: &str, budget: &str) -> bool {
    says(w, node) == (Some("true".into()), Some(budget.into()))
}

const FREE: (Option<String>, Option<String>) = (None, None);

fn operators() -> (Option<String>, Option<String>) {
    (Some("true".into()), None)
}

/// The operator's own `kubectl annotate node NODE scale-down-disabled=true`.
async fn operator_annotates(w: &World, node: &str) {
    let api: kube::Api<Node> = kube::Api::all(w.sim.client_as("operator"));
    let patch = serde_json::json!({"metadata": {"annotations": {SCALE_DOWN_DISABLED: "true"}}});
    api.patch(
        node,
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(&patch),
    )
    .await
    .unwrap();
}

/// Writes to Nodes that reached the API server from `who`.
fn node_writes(w: &World, who: &str) -> usize {
    w.sim
        .requests()
        .writes()
        .iter()
        .filter(|x| x.user == who && x.resource == "nodes")
        .count()
}

/// The service is stopped and started again as `who` with `budgets`.
async fn restart(w: &mut World, who: &str, budgets: Vec<Budget>) {
    w.engine.shutdown();
    let cloud: Arc<dyn ca_asg_provider::cloud::Cloud> = Arc::new(w.cloud.clone());
    (w.provider, w.engine, w.ca) = replica(&w.sim, who, cloud, &w.groups, settings(budgets)).await;
}

#[tokio::test]
async fn a_closed_window_keeps_its_groups_nodes_from_ca_and_gives_back_only_its_own() {
    let mut w = World::builder()
        .web(4, 3)
        .group(MemoryGroup::new("batch", 0, 4, 2, "m5.large"))
        .settings(settings(vec![]))
        .build()
        .await;
    let web: Vec<String> = nodes_of(&w, "web").into_iter().map(|n| n.0).collect();
    let batch: Vec<String> = nodes_of(&w, "batch").into_iter().map(|n| n.0).collect();
    operator_annotates(&w, &web[1]).await;
    operator_annotates(&w, &batch[0]).await;

    // The window closes (the service starts with it in force).
    restart(&mut w, "replica-1", vec![frozen()]).await;
    eventually("the window's group is kept from CA", 10, || {
        held_by(&w, &web[0], "frozen") && held_by(&w, &web[2], "frozen")
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(says(&w, &web[1]), operators(), "not taken over");
    assert_eq!(says(&w, &batch[0]), operators());
    assert_eq!(says(&w, &batch[1]), FREE, "another group is not held");
    assert_eq!(
        node_writes(&w, "replica-1"),
        2,
        "one write per node held, none again on later passes"
    );

    // A restart while it is closed reads the state back and writes nothing.
    restart(&mut w, "replica-2", vec![frozen()]).await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(node_writes(&w, "replica-2"), 0);
    assert!(held_by(&w, &web[0], "frozen") && held_by(&w, &web[2], "frozen"));

    // The window opens (the service runs without it): only ours is removed.
    restart(&mut w, "replica-3", vec![]).await;
    eventually("our holds are removed", 10, || {
        says(&w, &web[0]) == FREE && says(&w, &web[2]) == FREE
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(says(&w, &web[1]), operators(), "an operator's stays");
    assert_eq!(says(&w, &batch[0]), operators());
    assert_eq!(node_writes(&w, "replica-3"), 2);
}

/// A budget of one drain at once for CA on `web`: while a drain holds its slot every
/// other node of the group is kept from CA. A DeleteNodes that still arrives for one
/// (CA raced the annotation) is answered as any other and counted in the target
/// size, and its drain waits; once the slots free up, the holds go.
#[tokio::test]
async fn a_full_budget_keeps_the_rest_from_ca_and_a_raced_delete_is_still_exact() {
    let mut w = World::builder()
        .web(4, 3)
        .settings(settings(vec![for_ca_on_web("one", Nodes::Count(1))]))
        .build()
        .await;
    let web = nodes_of(&w, "web");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        web.iter().all(|(n, _)| says(&w, n) == FREE),
        "room: nothing held"
    );
    guarded_app(&w, &web[0].0, "app0").await;
    delete_nodes(&mut w, "web", &web[..1]).await;
    assert_eq!(target(&mut w, "web").await, 2);
    eventually("the rest of the group is kept from CA", 10, || {
        held_by(&w, &web[1].0, "one") && held_by(&w, &web[2].0, "one")
    })
    .await;

    // CA raced the annotation: its DeleteNodes is answered and counted as any other.
    let raced =
        w.ca.node_group_delete_nodes(delete_request("web", &web[1..2]))
            .await;
    assert!(raced.is_ok(), "{raced:?}");
    assert_eq!(target(&mut w, "web").await, 1, "CA's accounting is exact");
    eventually("the raced drain waits for the budget", 10, || {
        events(&w.sim)
            .iter()
            .any(|(r, n)| r == "DrainWaitingForBudget" && n.contains(&web[1].1))
    })
    .await;
    assert!(w.engine.is_draining(&web[1].1));

    // The first drain ends; the raced one runs; then the last node is given back.
    assert!(w.sim.remove::<PodDisruptionBudget>("shop", "app0-pdb"));
    assert_eq!(w.engine.wait_for(&web[0].1).await, Some(Outcome::Ended));
    assert_eq!(w.engine.wait_for(&web[1].1).await, Some(Outcome::Ended));
    eventually("the last node is given back to CA", 10, || {
        says(&w, &web[2].0) == FREE
    })
    .await;
    assert_eq!(w.cloud.calls()["terminate_instance"], 2);
    assert_eq!(target(&mut w, "web").await, 1);
}

//! Drains as fast as the pods allow: after a PodDisruptionBudget's 429 the drain
//! evicts again as soon as a pod the budget selects changes (the replacement is
//! Ready), not at the next tick of the fixed retry.

use std::time::Duration;

use ca_asg_provider::cloud::memory::MemoryGroup;
use ca_asg_provider::scalein::{Outcome, ScaleInSettings};
use ca_asg_provider::sim::fixtures;
use k8s_openapi::api::core::v1::Pod;

mod support;
use support::eventually;
use support::world::*;

/// Two replicas of one ReplicaSet on the node, a budget that allows one disruption:
/// the second eviction waits for the first one's replacement to be Ready elsewhere.
/// The fixed retry is a minute here, so only the budget's watch can end the drain
/// within the test's bound.
#[tokio::test]
async fn the_next_eviction_goes_when_the_replacement_is_ready_not_at_the_retry_tick() {
    let settings = ScaleInSettings {
        eviction_retry: Duration::from_secs(60),
        ..fast_settings()
    };
    let mut w = world(
        vec![MemoryGroup::new("web", 0, 4, 3, "m5.large")],
        settings,
        Duration::from_millis(200),
    )
    .await;
    let web = nodes_of(&w, "web");
    let (node, iid) = web[0].clone();
    // Both replicas on `node`: the others are cordoned while they are placed.
    for (other, _) in &web[1..] {
        set_unschedulable(&w, other, true).await;
    }
    w.sim.create(&fixtures::pdb("shop", "web", 1)).unwrap();
    w.sim
        .create(&fixtures::replicaset("shop", "web", 2, 0.1))
        .unwrap();
    pods_ready(&w, 2).await;
    let on_node = |w: &World| {
        w.sim
            .list::<Pod>()
            .iter()
            .filter(|p| p["spec"]["nodeName"] == node.as_str())
            .count()
    };
    assert_eq!(on_node(&w), 2);
    for (other, _) in &web[1..] {
        set_unschedulable(&w, other, false).await;
    }
    delete_nodes(&mut w, "web", &[(node.clone(), iid.clone())]).await;
    eventually("the budget refuses the second eviction", 10, || {
        events(&w.sim).iter().any(|(r, _)| r == "EvictionBlocked")
    })
    .await;
    assert_eq!(
        w.engine.budgets.open(),
        1,
        "one watch for the budget's pods"
    );
    // A minute's fixed retry would not fit this bound; the budget's watch does.
    eventually("the node is drained and its instance ended", 20, || {
        w.cloud.calls().get("terminate_instance") == Some(&1)
    })
    .await;
    assert_eq!(w.engine.wait_for(&iid).await, Some(Outcome::Ended));
    let blocked = w
        .sim
        .audit()
        .iter()
        .filter(|a| a.verb == "evicted" && a.name.starts_with("web"))
        .count();
    assert_eq!(blocked, 2, "each replica evicted once");
    eventually(
        "the budget's watch is closed when no drain waits",
        5,
        || w.engine.budgets.open() == 0,
    )
    .await;
}

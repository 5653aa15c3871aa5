//! Drains as fast as the pods allow: an eviction a PodDisruptionBudget does not allow
//! yet goes again as soon as the budget's status allows it (the replacement is
//! Ready), not at the next tick of the fixed retry, and without a 429 to ask.

use std::sync::atomic::Ordering;
use std::time::Duration;

use ca_asg_provider::scalein::{Outcome, ScaleInSettings};
use ca_asg_provider::sim::fixtures;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;

mod support;
use support::eventually;
use support::world::*;

/// Two replicas of one ReplicaSet on the node, a budget that allows one disruption:
/// the second eviction waits for the first one's replacement to be Ready elsewhere.
/// The fixed retry is a minute here, so only the budget's watch can end the drain
/// within the test's bound. The wait is on the budget's status (the drain pass's
/// cache of budgets), so no watch of the budget's pods opens.
#[tokio::test]
async fn the_next_eviction_goes_when_the_replacement_is_ready_not_at_the_retry_tick() {
    let settings = ScaleInSettings {
        eviction_retry: Duration::from_secs(60),
        ..fast_settings()
    };
    let mut w = World::builder()
        .web(4, 3)
        .settings(settings)
        .ready_delay(Duration::from_millis(200))
        .build()
        .await;
    let web = nodes_of(&w, "web");
    let (node, iid) = web[0].clone();
    // Both replicas on `node`: the others are cordoned while they are placed.
    for (other, _) in &web[1..] {
        set_unschedulable(&w, other, true).await;
    }
    w.put(&fixtures::pdb("shop", "web", 1));
    w.put(&fixtures::replicaset("shop", "web", 2, 0.1));
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
    eventually("the budget holds the second eviction", 10, || {
        w.engine.tools.stats.evictions_held.load(Ordering::Relaxed) >= 1
    })
    .await;
    assert_eq!(
        w.engine.tools.budgets.open(),
        0,
        "its status says when: no watch of the budget's pods"
    );
    // A minute's fixed retry would not fit this bound; the budget's watch does.
    eventually("the node is drained and its instance ended", 20, || {
        w.cloud.calls().get("terminate_instance") == Some(&1)
    })
    .await;
    assert_eq!(w.engine.wait_for(&iid).await, Some(Outcome::Ended));
    let blocked = evictions_of(&w, "web");
    assert_eq!(blocked, 2, "each replica evicted once");
}

/// The budget's status says no at first (its pods are not Ready yet), so the
/// eviction is held; when the disruption controller of the fake writes a status that
/// allows one, it goes, with no 429 on the way. A minute's fixed retry could not end
/// it within the bound, and a try before the status allowed would have been refused.
#[tokio::test]
async fn an_eviction_held_by_the_budgets_status_goes_when_the_status_allows() {
    let settings = ScaleInSettings {
        eviction_retry: Duration::from_secs(60),
        ..fast_settings()
    };
    let (mut w, node, iid) = guarded_pod_with_a_slow_sibling(settings, 3000).await;
    delete_nodes(&mut w, "web", &[(node, iid.clone())]).await;
    eventually("the eviction is held by the budget's status", 10, || {
        w.engine.tools.stats.evictions_held.load(Ordering::Relaxed) >= 1
    })
    .await;
    assert!(
        w.sim.get::<Pod>("shop", "web-a").is_some(),
        "not evicted yet"
    );
    eventually("the node is drained and its instance ended", 20, || {
        w.cloud.calls().get("terminate_instance") == Some(&1)
    })
    .await;
    assert_eq!(w.engine.wait_for(&iid).await, Some(Outcome::Ended));
    let audit = w.sim.audit();
    assert!(
        !audit.iter().any(|a| a.verb == "eviction-denied"),
        "no try before the status allowed it"
    );
    assert!(audit
        .iter()
        .any(|a| a.verb == "evicted" && a.name == "web-a"));
    assert_eq!(w.engine.tools.budgets.open(), 0);
}

/// Four nodes drained at once, each with a DaemonSet pod and an app pod. With
/// `sharedPodWatchFrom` 2 they share one watch of every pod (a drain that begins
/// before a second one is asked for watches its own node); with 0 each drain lists
/// its own node. Either way the pass
/// lists VolumeAttachments once for all four, and every node ends DaemonSet-last.
async fn four_drains_at_once(shared_from: usize) -> (u64, u64) {
    let settings = ScaleInSettings {
        shared_pod_watch_from: shared_from,
        ..fast_settings()
    };
    let mut w = World::builder()
        .web(6, 6)
        .settings(settings)
        .ready_delay(Duration::from_millis(100))
        .build()
        .await;
    let web = nodes_of(&w, "web");
    let drained: Vec<(String, String)> = web[..4].to_vec();
    fluentd_and_an_app_on_each(&w, &drained, 0.2, 0.5);
    pods_ready(&w, 6 + 4).await;
    let lists = |w: &World| {
        (
            w.sim.requests().get("list", "pods"),
            w.sim.requests().get("list", "volumeattachments"),
        )
    };
    // Each drained node's DaemonSet pod, by name.
    let fluentd_on = |node: &str| -> String {
        w.sim
            .list::<Pod>()
            .iter()
            .find(|p| p["metadata"]["namespace"] == "logging" && p["spec"]["nodeName"] == node)
            .and_then(|p| p["metadata"]["name"].as_str().map(str::to_string))
            .expect("a fluentd pod on every node")
    };
    let fluentd: Vec<String> = drained.iter().map(|(n, _)| fluentd_on(n)).collect();
    let before = lists(&w);
    delete_nodes(&mut w, "web", &drained).await;
    for (_, iid) in &drained {
        assert_eq!(w.engine.wait_for(iid).await, Some(Outcome::Ended));
    }
    let audit = w.sim.audit();
    for (i, ds) in fluentd.iter().enumerate() {
        let app_gone = audit_index(&audit, "removed", "Pod", &format!("app-{i}"))
            .unwrap_or_else(|| panic!("app-{i} removed"));
        let ds_leaves = audit
            .iter()
            .position(|a| {
                a.kind == "Pod"
                    && a.name == *ds
                    && a.verb != "create"
                    && a.verb != "ready"
                    && a.verb != "update"
                    && a.verb != "patch"
            })
            .unwrap_or_else(|| panic!("{ds} left"));
        assert!(
            app_gone < ds_leaves,
            "{ds} began leaving (audit {ds_leaves}) before app-{i} was gone (audit {app_gone})"
        );
    }
    let after = lists(&w);
    (after.0 - before.0, after.1 - before.1)
}

#[tokio::test]
async fn drains_running_together_share_one_watch_of_every_pod() {
    let (pod_lists, attachment_lists) = four_drains_at_once(2).await;
    assert!(
        (1..=2).contains(&pod_lists),
        "one list of every pod, and at most the first drain's own list of its node: {pod_lists}"
    );
    assert_eq!(attachment_lists, 1, "one list of attachments for the pass");
}

#[tokio::test]
async fn below_the_threshold_each_drain_watches_its_own_node() {
    let (pod_lists, attachment_lists) = four_drains_at_once(0).await;
    assert_eq!(pod_lists, 4, "one list of its node's pods per drain");
    assert_eq!(attachment_lists, 1, "one list of attachments for the pass");
}

/// The drain's cache of budgets stops hearing (its watch is refused) while it says
/// the budget allows nothing. The budget's real status moves on; after
/// `evictionRetryInterval` without a change the eviction is tried anyway and the API
/// server, which guards the budget, accepts it. A stale cache costs a retry interval,
/// never the drain.
#[tokio::test]
async fn a_stale_cache_of_budgets_costs_a_retry_not_the_drain() {
    let settings = ScaleInSettings {
        eviction_retry: Duration::from_millis(500),
        ..fast_settings()
    };
    let (mut w, node, iid) = guarded_pod_with_a_slow_sibling(settings, 1500).await;
    // Lists answer, watches of budgets do not: the cache keeps the first list.
    w.sim.deny(&[("watch", "poddisruptionbudgets")]);
    delete_nodes(&mut w, "web", &[(node, iid.clone())]).await;
    eventually("the node is drained and its instance ended", 20, || {
        w.cloud.calls().get("terminate_instance") == Some(&1)
    })
    .await;
    assert_eq!(w.engine.wait_for(&iid).await, Some(Outcome::Ended));
    assert!(w.engine.tools.stats.evictions_held.load(Ordering::Relaxed) >= 1);
    assert!(
        w.engine
            .tools
            .stats
            .evictions_forced
            .load(Ordering::Relaxed)
            >= 1,
        "tried past the cache's word"
    );
    w.sim.deny(&[]);
}

/// Drains beyond `maxConcurrentDrains` wait for a slot with their node already
/// cordoned and marked: a pod created meanwhile is not placed on a node that is going
/// away (in an instance refresh it would be evicted again a moment later).
#[tokio::test]
async fn a_drain_waiting_for_a_slot_has_its_node_cordoned_already() {
    let settings = ScaleInSettings {
        max_concurrent_drains: 1,
        ..fast_settings()
    };
    let mut w = World::builder()
        .web(4, 3)
        .settings(settings)
        .ready_delay(Duration::from_millis(100))
        .build()
        .await;
    let web = nodes_of(&w, "web");
    // On each of the two nodes to go, a pod whose budget allows nothing: whichever
    // drain takes the slot keeps it.
    for (i, (node, _)) in web[..2].iter().enumerate() {
        let app = format!("held-{i}");
        w.put(&fixtures::pdb("shop", &app, 0));
        w.put(&fixtures::pod("shop", &app, node, &app, 0.1));
    }
    pods_ready(&w, 2).await;
    delete_nodes(&mut w, "web", &web[..2]).await;
    let cordoned = |w: &World, node: &str| {
        w.sim
            .get::<Node>("", node)
            .is_some_and(|n| n["spec"]["unschedulable"] == true)
    };
    eventually("both nodes cordoned, one drain running", 10, || {
        cordoned(&w, &web[0].0) && cordoned(&w, &web[1].0)
    })
    .await;
    let started = |w: &World| {
        events(&w.sim)
            .iter()
            .filter(|(r, _)| r == "DrainStarted")
            .count()
    };
    eventually("one drain started", 10, || started(&w) >= 1).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(started(&w), 1, "the other drain waits for the slot");
    // New pods go to the node that stays.
    w.put(&fixtures::replicaset("shop", "later", 3, 0.1));
    pods_ready(&w, 5).await;
    for p in w.sim.list::<Pod>() {
        if p["metadata"]["name"].as_str().unwrap().starts_with("later") {
            assert_eq!(
                p["spec"]["nodeName"],
                web[2].0.as_str(),
                "placed on a node that goes"
            );
        }
    }
    // The budgets allow: both drains end.
    for i in 0..2 {
        w.sim
            .remove::<PodDisruptionBudget>("shop", &format!("held-{i}-pdb"));
    }
    for (_, iid) in &web[..2] {
        assert_eq!(w.engine.wait_for(iid).await, Some(Outcome::Ended));
    }
}

/// A world of three nodes; on the first, `web-a` under a budget that allows one of
/// two disruptions; on the second, its sibling `web-b`, Ready only `ready_after_ms`
/// after it is placed, so until then the budget's status (waited for here) allows none.
/// Returns the first node and its instance.
async fn guarded_pod_with_a_slow_sibling(
    settings: ScaleInSettings,
    ready_after_ms: u64,
) -> (World, String, String) {
    let w = World::builder()
        .web(3, 2)
        .settings(settings)
        .ready_delay(Duration::from_millis(100))
        .build()
        .await;
    let web = nodes_of(&w, "web");
    let (node, iid) = web[0].clone();
    w.put(&fixtures::pdb("shop", "web", 1));
    let mut slow = fixtures::pod("shop", "web-b", &web[1].0, "web", 0.1);
    slow.metadata.annotations.get_or_insert_default().insert(
        ca_asg_provider::sim::cluster::READY_AFTER_ANNOTATION.into(),
        ready_after_ms.to_string(),
    );
    w.put(&fixtures::pod("shop", "web-a", &node, "web", 0.1));
    pods_ready(&w, 1).await;
    w.put(&slow);
    eventually(
        "the budget's status counts both and allows none",
        10,
        || {
            w.sim
                .get::<PodDisruptionBudget>("shop", "web-pdb")
                .is_some_and(|b| {
                    b["status"]["expectedPods"] == 2 && b["status"]["disruptionsAllowed"] == 0
                })
        },
    )
    .await;
    (w, node, iid)
}

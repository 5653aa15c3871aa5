//! Warm pools that reuse instances on scale-in (issue 47): an instance the ASG sends
//! back to the pool is held by our hook in `Warmed:Pending:Wait`, drained as any
//! other scale-in (workloads first, DaemonSet pods last, our action completed once),
//! rests in the pool with its Node, and when it leaves the pool for the group its
//! Node is handed back with none of this service's cordon, taint or record.

use std::sync::Arc;
use std::time::Duration;

use ca_asg_provider::cloud::memory::MemoryGroup;
use ca_asg_provider::cloud::queue::MemoryQueue;
use ca_asg_provider::cloud::{LifecycleState, WarmPool};
use ca_asg_provider::proto;
use ca_asg_provider::scalein::decide::notice::RebalanceAction;
use ca_asg_provider::scalein::sources::queue::Handled;
use ca_asg_provider::scalein::{self, decide::record, stages::cordon};
use k8s_openapi::api::core::v1::Node;

mod support;
use support::eventually;
use support::notices::eventbridge;
use support::queue::{consumer, handle_next};
use support::world::*;

const HOOK: &str = "ca-asg-provider-drain";

fn pooled_group(pool_state: &str) -> MemoryGroup {
    pooled_group_of(1, pool_state)
}

/// Group "web" with `desired` instances, our hook, and a pool in `pool_state` that
/// reuses instances.
fn pooled_group_of(desired: i32, pool_state: &str) -> MemoryGroup {
    MemoryGroup::new("web", 0, 3, desired, "m5.large")
        .terminating_hook(HOOK, 300)
        .warm_pool(WarmPool {
            min_size: 0,
            max_prepared: None,
            pool_state: pool_state.into(),
            reuse_on_scale_in: true,
        })
}

fn settings() -> scalein::ScaleInSettings {
    scalein::ScaleInSettings {
        warm_pool_settle: Duration::from_millis(300),
        ..fast_settings()
    }
}

fn state_of(w: &World, iid: &str) -> Option<LifecycleState> {
    w.cloud
        .instances()
        .into_iter()
        .chain(w.cloud.pooled())
        .find(|(_, i)| i.id == iid)
        .map(|(_, i)| i.state)
}

/// A world of one group "web" whose warm pool (in `pool_state`) reuses instances.
async fn pooled_world(pool_state: &str) -> World {
    World::builder()
        .group(pooled_group(pool_state))
        .settings(settings())
        .build()
        .await
}

/// How many lifecycle actions of the instance were completed (the group has our
/// hook alone).
fn completions(w: &World, iid: &str) -> usize {
    w.cloud
        .completed_actions()
        .iter()
        .filter(|(a, _)| a.instance_id == iid)
        .count()
}

/// Whether the instance rests in the pool in `state` (`Warmed:Stopped`, ...).
fn resting(w: &World, iid: &str, state: &str) -> bool {
    state_of(w, iid).is_some_and(|s| s.as_str() == state)
}

fn node(w: &World, name: &str) -> serde_json::Value {
    w.sim.get::<Node>("", name).expect("the Node stays")
}

/// Nothing of this service on the Node: schedulable, no taint of ours or CA's,
/// no drain annotation, no load-balancer exclusion.
fn clean(n: &serde_json::Value) -> bool {
    let taints = n["spec"]["taints"].as_array().cloned().unwrap_or_default();
    let annotations = n["metadata"]["annotations"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    n["spec"]["unschedulable"].as_bool() != Some(true)
        && !taints
            .iter()
            .any(|t| t["key"] == cordon::TAINT_KEY || t["key"] == cordon::CA_TO_BE_DELETED_TAINT)
        && !annotations
            .keys()
            .any(|k| k.starts_with("ca-asg-provider.io/"))
        && n["metadata"]["labels"][cordon::LB_EXCLUDE_LABEL].is_null()
}

#[tokio::test]
async fn a_scale_in_into_the_warm_pool_is_drained_and_the_reused_node_comes_back_clean() {
    let mut w = pooled_world("Stopped").await;
    let lifecycle = scalein::sources::hook_scan::spawn_loop(w.engine.clone(), w.provider.clone());
    let (node_name, iid) = node_with_fluentd_and_app(&w, 1.0).await;

    // A scale-in policy lowers the group: ReuseOnScaleIn sends the instance back to
    // the pool, held by our hook in Warmed:Pending:Wait (out of the group's list).
    assert_eq!(
        w.cloud.external_scale_in("web", 1).unwrap(),
        vec![iid.clone()]
    );
    assert_eq!(state_of(&w, &iid).unwrap().as_str(), "Warmed:Pending:Wait");

    let victim = iid.clone();
    eventually(
        "our action completed and the instance rests in the pool",
        20,
        || resting(&w, &victim, "Warmed:Stopped"),
    )
    .await;
    let done: Vec<_> = w
        .cloud
        .completed_actions()
        .into_iter()
        .filter(|(a, _)| a.instance_id == iid)
        .collect();
    assert_eq!(done.len(), 1, "completed once: {done:?}");
    assert_eq!(done[0].0.hook, HOOK);
    assert!(w.cloud.hook_timeouts().is_empty(), "the hook timed out");
    // Drained as any scale-in: the app gone before the log shipper is asked to go.
    let a = w.sim.audit();
    let app_gone = audit_index(&a, "removed", "Pod", "app").expect("app removed");
    let ds_start = audit_index(&a, "deletion-started", "Pod", "fluentd").expect("fluentd evicted");
    assert!(app_gone < ds_start, "{app_gone} {ds_start}");

    // At rest in the pool the Node stays cordoned, and says so.
    let n = node_name.clone();
    eventually("the pool rest noted on the Node", 10, || {
        let node = node(&w, &n);
        let rec = node["metadata"]["annotations"][record::ANNOTATION]
            .as_str()
            .unwrap_or("")
            .to_string();
        rec.contains("in_warm_pool_since") && node["spec"]["unschedulable"] == true
    })
    .await;
    eventually("Event ReturnedToWarmPool", 10, || {
        events(&w.sim)
            .iter()
            .any(|(r, n)| r == "ReturnedToWarmPool" && n.contains(&iid))
    })
    .await;
    // The pool's instance is not the group's: CA's view (after its Refresh) has none.
    w.provider.refresh_now().await.unwrap();
    assert_eq!(target(&mut w, "web").await, 0);
    let listed =
        w.ca.node_group_nodes(proto::NodeGroupNodesRequest { id: "web".into() })
            .await
            .unwrap()
            .into_inner()
            .instances;
    assert!(listed.is_empty(), "{listed:?}");

    // CA scales the group up: the ASG takes the instance from the pool (same id).
    taken_back_clean(&mut w, &node_name).await;
    eventually("the instance back in service in the group", 10, || {
        state_of(&w, &iid) == Some(LifecycleState::InService)
    })
    .await;
    eventually("Event BackFromWarmPool", 10, || {
        events(&w.sim)
            .iter()
            .any(|(r, n)| r == "BackFromWarmPool" && n.contains(&iid))
    })
    .await;
    lifecycle.abort();
    assert_eq!(target(&mut w, "web").await, 1);
    assert_eq!(completions(&w, &iid), 1, "nothing completed again");
}

/// The next scale-in of a reused instance is a new action, drained and completed
/// again: the record that would have said "already completed" left with the
/// hand-back.
#[tokio::test]
async fn a_reused_instance_scaled_in_again_is_drained_again() {
    let mut w = pooled_world("Running").await;
    let lifecycle = scalein::sources::hook_scan::spawn_loop(w.engine.clone(), w.provider.clone());
    let (node_name, iid) = node_with_fluentd_and_app(&w, 0.2).await;
    for round in 1..=2usize {
        w.cloud.external_scale_in("web", 1).unwrap();
        let victim = iid.clone();
        eventually("resting in the pool", 20, || {
            resting(&w, &victim, "Warmed:Running")
        })
        .await;
        assert_eq!(
            completions(&w, &iid),
            round,
            "round {round}: our action completed once per scale-in"
        );
        eventually("the pool rest noted", 10, || {
            pool_rest_noted(&w, &node_name)
        })
        .await;
        taken_back_clean(&mut w, &node_name).await;
        assert_eq!(target(&mut w, "web").await, 1, "round {round}");
    }
    lifecycle.abort();
    assert!(w.cloud.hook_timeouts().is_empty(), "a hook timed out");
    // Each round drained the node: its log shipper (put back by its DaemonSet on
    // the node handed back) asked to leave once per round.
    let shipper_evictions = w
        .sim
        .audit()
        .iter()
        .filter(|a| {
            a.verb == "deletion-started" && a.kind == "Pod" && a.name.starts_with("fluentd")
        })
        .count();
    assert_eq!(shipper_evictions, 2, "{:?}", events(&w.sim));
}

/// Queue mode: the hook's EventBridge message for a return to the pool (Origin
/// AutoScalingGroup, Destination WarmPool) names the terminating transition; the
/// instance waits in Warmed:Pending:Wait, not Terminating:Wait, and is drained.
#[tokio::test]
async fn a_lifecycle_message_for_a_return_to_the_pool_is_drained() {
    let w = pooled_world("Stopped").await;
    let (_node, iid) = node_with_fluentd_and_app(&w, 0.2).await;
    w.cloud.external_scale_in("web", 1).unwrap();
    let q = Arc::new(MemoryQueue::default());
    let c = consumer(&w, &q, RebalanceAction::Cordon);
    q.send(&eventbridge(
        "EC2 Instance-terminate Lifecycle Action",
        "aws.autoscaling",
        serde_json::json!({
            "LifecycleActionToken": "87654321-4321-4321-4321-210987654321",
            "AutoScalingGroupName": "web",
            "LifecycleHookName": HOOK,
            "EC2InstanceId": iid,
            "LifecycleTransition": "autoscaling:EC2_INSTANCE_TERMINATING",
            "Origin": "AutoScalingGroup",
            "Destination": "WarmPool",
        }),
    ));
    assert_eq!(
        handle_next(&c, &q).await,
        Handled::Done(vec!["lifecycle_drain"])
    );
    let victim = iid.clone();
    eventually("drained and completed into the pool", 20, || {
        resting(&w, &victim, "Warmed:Stopped")
    })
    .await;
    assert!(w.cloud.hook_timeouts().is_empty());
    assert_eq!(completions(&w, &iid), 1);
}

/// A scale-in returning an instance whose Node is gone (never registered, or
/// deleted): nothing to drain, our action is completed at once instead of holding the
/// instance for the hook's whole timeout.
#[tokio::test]
async fn a_pool_bound_instance_without_a_node_has_our_action_completed_at_once() {
    let w = pooled_world("Stopped").await;
    let (_node, iid) = nodes_of(&w, "web").remove(0);
    let nodes: kube::Api<Node> = kube::Api::all(w.sim.client());
    let name = ca_asg_provider::sim::node_name(&iid);
    w.cloud.external_scale_in("web", 1).unwrap();
    let _ = nodes.delete(&name, &Default::default()).await;
    eventually("the Node gone from the engine's cache", 10, || {
        w.engine.tools.nodes.node_for_instance(&iid).is_none()
    })
    .await;
    let lifecycle = scalein::sources::hook_scan::spawn_loop(w.engine.clone(), w.provider.clone());
    let victim = iid.clone();
    eventually(
        "our action completed, the instance at rest in the pool",
        10,
        || resting(&w, &victim, "Warmed:Stopped"),
    )
    .await;
    lifecycle.abort();
    assert!(w.cloud.hook_timeouts().is_empty());
    assert_eq!(completions(&w, &iid), 1);
}

/// A new instance warming up waits in Warmed:Pending:Wait too, for launch hooks only,
/// and has no Node: one heartbeat finds no action of ours there, and the scans that
/// follow neither drain it nor ask again (for 30 s).
#[tokio::test]
async fn an_instance_warming_up_is_not_taken_for_a_scale_in() {
    // Beside a hooked group without a pool, scanned first: its (empty) pool read
    // must not forget what was learnt of the other group's.
    let w = World::builder()
        .group(pooled_group("Stopped"))
        .group(MemoryGroup::new("plain", 0, 3, 1, "m5.large").terminating_hook(HOOK, 300))
        .settings(settings())
        .build()
        .await;
    let warming = w.cloud.warm_up("web", "bootstrap-launch", 60).unwrap();
    assert_eq!(
        state_of(&w, &warming).unwrap().as_str(),
        "Warmed:Pending:Wait"
    );
    for _ in 0..3 {
        assert_eq!(
            scalein::sources::hook_scan::scan(&w.engine, &w.provider).await,
            0
        );
    }
    assert_eq!(
        w.cloud.calls().get("lifecycle_heartbeat").copied(),
        Some(1),
        "one probe, then believed"
    );
    assert!(w.cloud.heartbeats().is_empty());
    assert!(w.cloud.completed_actions().is_empty());
    assert!(!w.engine.is_draining(&warming));
}

/// An instance's bootstrap that joins the cluster while it warms in the pool leaves
/// a Node that goes NotReady when the instance stops there: said once, on the Node,
/// in the log and in a metric, and nothing is drained for it.
#[tokio::test]
async fn a_node_registered_by_an_instance_warming_in_the_pool_is_reported_once() {
    let w = pooled_world("Stopped").await;
    let warming = w.cloud.warm_up("web", "bootstrap-launch", 0).unwrap();
    let zone = "us-east-1a";
    let name = ca_asg_provider::sim::node_name(&warming);
    w.put(&ca_asg_provider::sim::fixtures::node(
        &name,
        &format!("aws:///{zone}/{warming}"),
        &[("topology.kubernetes.io/zone", zone)],
    ));
    let id = warming.clone();
    eventually("the engine sees the Node", 10, || {
        w.engine.tools.nodes.node_for_instance(&id).is_some() && resting(&w, &id, "Warmed:Stopped")
    })
    .await;
    for _ in 0..3 {
        assert_eq!(
            scalein::sources::hook_scan::scan(&w.engine, &w.provider).await,
            0
        );
    }
    eventually("the warning Event", 10, || {
        events(&w.sim)
            .iter()
            .any(|(r, n)| r == "RegisteredWhileWarming" && n.contains(&warming))
    })
    .await;
    let said = events(&w.sim)
        .iter()
        .filter(|(r, _)| r == "RegisteredWhileWarming")
        .count();
    assert_eq!(said, 1, "said once");
    assert!(!w.engine.is_draining(&warming));
    let node = node(&w, &name);
    assert!(node["spec"]["unschedulable"] != true, "nothing cordoned");
}

/// The soak's seed 313739: a spot warning (a forgery: warm pools take no Spot, and a
/// stopped instance gets no warning) for an instance resting in the pool. The Node
/// stays as its rest left it: AWS shows the instance in `Warmed:Stopped`, so the
/// notice is dropped, not drained for (a drain that waits for AWS to end an instance
/// it never will); a rebalance recommendation cordons nothing either (its reason
/// would keep the Node cordoned when the pool gives the instance back), and the
/// reused Node comes back clean.
#[tokio::test]
async fn a_notice_for_an_instance_resting_in_the_pool_drains_and_cordons_nothing() {
    let mut w = pooled_world("Stopped").await;
    let lifecycle = scalein::sources::hook_scan::spawn_loop(w.engine.clone(), w.provider.clone());
    let (node_name, iid) = node_with_fluentd_and_app(&w, 0.2).await;
    rest_in_pool(&w, &node_name, &iid, "Warmed:Stopped").await;
    let rested = node(&w, &node_name);
    let audit_before = w.sim.audit().len();

    let q = Arc::new(MemoryQueue::default());
    let c = consumer(&w, &q, RebalanceAction::Cordon);
    for body in [
        support::notices::spot(&iid),
        support::notices::rebalance(&iid),
        support::notices::retirement(&iid),
    ] {
        q.send(&body);
        assert_eq!(
            handle_next(&c, &q).await,
            Handled::Done(vec!["in_warm_pool"]),
            "{body}"
        );
    }
    let now = node(&w, &node_name);
    assert_eq!(
        now["metadata"]["annotations"], rested["metadata"]["annotations"],
        "the Node's record and marks are the rest's"
    );
    assert_eq!(now["spec"], rested["spec"]);
    let evicted: Vec<_> = w.sim.audit()[audit_before..]
        .iter()
        .filter(|a| a.kind == "Pod" && matches!(a.verb.as_str(), "evicted" | "deletion-started"))
        .map(|a| a.name.clone())
        .collect();
    assert!(evicted.is_empty(), "evicted after the notices: {evicted:?}");

    // The pool gives the instance back: nothing of the notices keeps it cordoned.
    taken_back_clean(&mut w, &node_name).await;
    lifecycle.abort();
    assert_eq!(target(&mut w, "web").await, 1);
}

/// Scales "web" in by one into its pool and waits until the instance rests there
/// and its Node says so (the record of our completed action kept on it).
async fn rest_in_pool(w: &World, node_name: &str, iid: &str, state: &str) {
    w.cloud.external_scale_in("web", 1).unwrap();
    eventually("our action completed, at rest in the pool", 20, || {
        resting(w, iid, state)
    })
    .await;
    eventually("the pool rest noted on the Node", 10, || {
        pool_rest_noted(w, node_name)
    })
    .await;
}

/// CA raises "web" by one: the ASG takes the resting instance back from the pool
/// (same id), and its Node is handed back with nothing of this service on it.
async fn taken_back_clean(w: &mut World, node_name: &str) {
    w.ca.node_group_increase_size(proto::NodeGroupIncreaseSizeRequest {
        id: "web".into(),
        delta: 1,
    })
    .await
    .unwrap();
    eventually("the reused node handed back clean", 10, || {
        clean(&node(w, node_name))
    })
    .await;
}

/// Whether the Node's record says its instance rests in the warm pool.
fn pool_rest_noted(w: &World, node_name: &str) -> bool {
    node(w, node_name)["metadata"]["annotations"][record::ANNOTATION]
        .as_str()
        .is_some_and(|r| r.contains("in_warm_pool_since"))
}

/// Our hook's reason on a Node, its action completed five minutes ago.
fn our_action_done_earlier() -> record::DrainReason {
    let mut done = record::DrainReason::new(
        record::Why::Lifecycle {
            hook: HOOK.into(),
            by_ca: false,
        },
        ca_asg_provider::clock::utc_now() - chrono::Duration::minutes(5),
    );
    done.done = true;
    done
}

/// Issue 59 (3): an instance drained into the pool, then ended by the pool, is held by
/// a new action of our hook in `Warmed:Terminating:Wait`. The memories of the earlier,
/// finished action (this process's, the Node's record) are confirmed with AWS before
/// they let the hold go by: our action is completed, not left to the hook's timeout.
#[tokio::test]
async fn a_reused_instance_the_pool_ends_later_has_our_new_action_completed() {
    let w = pooled_world("Stopped").await;
    let lifecycle = scalein::sources::hook_scan::spawn_loop(w.engine.clone(), w.provider.clone());
    let (node_name, iid) = node_with_fluentd_and_app(&w, 0.2).await;
    rest_in_pool(&w, &node_name, &iid, "Warmed:Stopped").await;
    assert_eq!(completions(&w, &iid), 1);
    assert!(w.cloud.end_pool_instance(&iid), "the pool ends it");
    let gone = iid.clone();
    eventually(
        "our second action completed and the instance gone (300 s hook)",
        20,
        || state_of(&w, &gone).is_none(),
    )
    .await;
    lifecycle.abort();
    assert_eq!(completions(&w, &iid), 2, "each action completed once");
    assert!(w.cloud.hook_timeouts().is_empty(), "a hook timed out");
}

/// Issue 59 (3), queue mode: the hook's message for the pool's ending of that
/// instance (a new token) is a new action, not a duplicate of the finished one.
#[tokio::test]
async fn a_lifecycle_message_for_the_pools_end_of_a_reused_instance_is_not_a_duplicate() {
    let w = pooled_world("Stopped").await;
    let lifecycle = scalein::sources::hook_scan::spawn_loop(w.engine.clone(), w.provider.clone());
    let (node_name, iid) = node_with_fluentd_and_app(&w, 0.2).await;
    let q = Arc::new(MemoryQueue::default());
    let c = consumer(&w, &q, RebalanceAction::Cordon);
    let message = |token: &str, origin: &str, destination: &str| {
        eventbridge(
            "EC2 Instance-terminate Lifecycle Action",
            "aws.autoscaling",
            serde_json::json!({
                "LifecycleActionToken": token,
                "AutoScalingGroupName": "web",
                "LifecycleHookName": HOOK,
                "EC2InstanceId": iid,
                "LifecycleTransition": "autoscaling:EC2_INSTANCE_TERMINATING",
                "Origin": origin,
                "Destination": destination,
            }),
        )
    };
    rest_in_pool(&w, &node_name, &iid, "Warmed:Stopped").await;
    // The message of the scale-in into the pool, handled after its action ended.
    q.send(&message(
        "11111111-1111-1111-1111-111111111111",
        "AutoScalingGroup",
        "WarmPool",
    ));
    assert_ne!(
        handle_next(&c, &q).await,
        Handled::Done(vec!["lifecycle_drain"]),
        "the finished action again"
    );
    lifecycle.abort();
    assert!(w.cloud.end_pool_instance(&iid));
    let waiting = iid.clone();
    eventually("held in Warmed:Terminating:Wait", 10, || {
        state_of(&w, &waiting).is_some_and(|s| s.as_str() == "Warmed:Terminating:Wait")
    })
    .await;
    q.send(&message(
        "22222222-2222-2222-2222-222222222222",
        "WarmPool",
        "EC2",
    ));
    assert_eq!(
        handle_next(&c, &q).await,
        Handled::Done(vec!["lifecycle_drain"])
    );
    let gone = iid.clone();
    eventually("our second action completed", 20, || {
        state_of(&w, &gone).is_none()
    })
    .await;
    assert_eq!(completions(&w, &iid), 2);
    assert!(w.cloud.hook_timeouts().is_empty());
}

/// Issue 59 (4): the Node of an instance resting in the pool maps to no group (CA
/// would count it among the group's unready nodes while NodeGroupNodes leaves it
/// out); nor does a detached instance's, still running outside the group (a
/// DeleteNodes for it would end nothing). An instance that ended without a decrement
/// still maps to its former group while CA's cached list names it.
#[tokio::test]
async fn only_an_instance_that_ended_maps_to_the_group_it_left() {
    let mut w = World::builder()
        .group(pooled_group_of(3, "Stopped"))
        .settings(settings())
        .build()
        .await;
    let lifecycle = scalein::sources::hook_scan::spawn_loop(w.engine.clone(), w.provider.clone());
    let nodes = nodes_of(&w, "web");
    assert_eq!(nodes.len(), 3);
    w.provider.refresh_now().await.unwrap();
    let (pooled, detached, reclaimed) =
        (nodes[2].1.clone(), nodes[0].1.clone(), nodes[1].1.clone());
    for (_, iid) in &nodes {
        assert_eq!(group_for(&mut w.ca, iid).await, "web");
    }
    // The scale-in sends the newest instance back to the pool.
    rest_in_pool(&w, &nodes[2].0, &pooled, "Warmed:Stopped").await;
    lifecycle.abort();
    w.cloud.detach(&detached, true).unwrap();
    w.cloud.reclaim(&reclaimed, Duration::from_secs(3600));
    let ended = reclaimed.clone();
    eventually("EC2 ended the reclaimed instance", 10, || {
        !w.cloud.instances().iter().any(|(_, i)| i.id == ended)
    })
    .await;
    w.provider.refresh_now().await.unwrap();
    assert_eq!(
        group_for(&mut w.ca, &pooled).await,
        "",
        "at rest in the pool"
    );
    assert_eq!(
        group_for(&mut w.ca, &detached).await,
        "",
        "detached, running"
    );
    assert_eq!(group_for(&mut w.ca, &reclaimed).await, "web", "ended");
    // The detached instance is no node of the group CA could delete.
    let e =
        w.ca.node_group_delete_nodes(delete_request(
            "web",
            &[(ca_asg_provider::sim::node_name(&detached), detached.clone())],
        ))
        .await
        .unwrap_err();
    assert!(e.message().contains("not in node group"), "{e:?}");
}

/// Issue 59: from CA's IncreaseSize that takes an instance back from the pool to a
/// pod waiting for a node running on it, with the production settle (30 s after the
/// hold) and a lifecycle poll of a minute (queue mode's safety net polls every 5),
/// on a paused clock (virtual time, never the machine's). The scale-up comes 45 s
/// after the instance was seen at rest, 15 s before the next poll: the Node is handed
/// back at the first follow after AWS shows the instance in the group
/// (Engine::follow_soon), not at the next poll nor 30 s after the rest was seen.
#[test]
fn a_node_back_from_the_pool_takes_a_waiting_pod_within_seconds_of_the_scale_up() {
    use ca_asg_provider::clock::Instant;
    let took = support::model::on_paused_clock(async {
        let settings = scalein::ScaleInSettings {
            warm_pool_settle: scalein::sources::warm_pool::SETTLED,
            lifecycle_poll_interval: Duration::from_secs(60),
            ..settings()
        };
        let w = World::builder()
            .group(pooled_group("Stopped"))
            .settings(settings)
            .ready_delay(Duration::from_millis(20))
            .in_process()
            .build()
            .await;
        let lifecycle =
            scalein::sources::hook_scan::spawn_loop(w.engine.clone(), w.provider.clone());
        let (node_name, iid) = nodes_of(&w, "web").remove(0);
        w.cloud.external_scale_in("web", 1).unwrap();
        let noted = |w: &World| {
            resting(w, &iid, "Warmed:Stopped")
                && node(w, &node_name)["metadata"]["annotations"][record::ANNOTATION]
                    .as_str()
                    .is_some_and(|r| r.contains("in_warm_pool_since"))
        };
        let bound = Instant::now() + Duration::from_secs(300);
        while !noted(&w) {
            assert!(Instant::now() < bound, "never came to rest in the pool");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        tokio::time::sleep(Duration::from_secs(44)).await;
        w.put(&ca_asg_provider::sim::fixtures::replicaset(
            "shop", "web", 1, 0.0,
        ));
        tokio::time::sleep(Duration::from_secs(1)).await;
        let running = |w: &World| {
            w.sim
                .list::<k8s_openapi::api::core::v1::Pod>()
                .iter()
                .any(|p| {
                    p["spec"]["nodeName"] == node_name.as_str()
                        && p["status"]["phase"] == "Running"
                        && p["metadata"]["labels"]["app"] == "web"
                })
        };
        assert!(!running(&w), "no node for the pod while the instance rests");
        let t0 = Instant::now();
        w.ca.clone()
            .node_group_increase_size(proto::NodeGroupIncreaseSizeRequest {
                id: "web".into(),
                delta: 1,
            })
            .await
            .unwrap();
        let bound = t0 + Duration::from_secs(120);
        while !running(&w) {
            assert!(
                Instant::now() < bound,
                "the pod never ran on the node back from the pool"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        lifecycle.abort();
        t0.elapsed()
    });
    println!("scale-up to the pod running on the node back from the pool: {took:?} (virtual)");
    assert!(took < Duration::from_secs(5), "{took:?}");
}

/// Issue 69 (suspected, proven): the warm pool's hand-back is decided from a snapshot
/// of the Node's record and then written. A reason recorded between the two (here a
/// rebalance recommendation's cordon; CA's scale-in or a notice alike) was erased with
/// the marks and the node uncordoned: the give-back patched unconditionally (shown
/// below with `uncordon`). It now gives back only while the record is the one it
/// decided from.
#[tokio::test]
async fn a_hand_back_decided_before_a_new_reason_keeps_the_node() {
    use record::{DrainReason, DrainRecord, Why};
    let w = World::builder()
        .group(pooled_group_of(2, "Stopped"))
        .settings(settings())
        .build()
        .await;
    let stage = w.engine.stage();
    let nodes: Vec<String> = nodes_of(&w, "web").into_iter().map(|(n, _)| n).collect();
    assert_eq!(nodes.len(), 2);
    async fn mark(
        stage: &scalein::stages::Stage<'_>,
        name: &str,
        rec: &DrainRecord,
    ) -> cordon::Cordoned {
        cordon::cordon(stage, name, &rec.reasons, "web", None)
            .await
            .unwrap()
    }
    let done = our_action_done_earlier();
    for (i, old_call) in [false, true].into_iter().enumerate() {
        let name = &nodes[i];
        // The record the hand-back is decided from: our action done, resting.
        let decided_on = match mark(
            &stage,
            name,
            &DrainRecord {
                reasons: vec![done.clone()],
                ..Default::default()
            },
        )
        .await
        {
            cordon::Cordoned::Marked { record, .. } => record,
            cordon::Cordoned::NodeGone => panic!("the Node is there"),
        };
        // Meanwhile a rebalance recommendation cordons it: its reason is recorded.
        mark(
            &stage,
            name,
            &DrainRecord {
                reasons: vec![DrainReason::new(
                    Why::Rebalance,
                    ca_asg_provider::clock::utc_now(),
                )],
                ..Default::default()
            },
        )
        .await;
        let n = node(&w, name);
        let ann = n["metadata"]["annotations"][record::ANNOTATION]
            .as_str()
            .unwrap()
            .to_string();
        assert!(ann.contains("rebalance"), "{ann}");
        if old_call {
            // What the hand-back did before: the reason and the cordon are gone.
            cordon::uncordon(&stage, name).await.unwrap();
            assert!(
                clean(&node(&w, name)),
                "the unconditional give-back erased the cordon's reason"
            );
        } else {
            let given = cordon::uncordon_if(&stage, name, &decided_on)
                .await
                .unwrap();
            assert_eq!(given, None, "a reason recorded since keeps the node");
            let n = node(&w, name);
            assert_eq!(n["spec"]["unschedulable"].as_bool(), Some(true));
            assert_eq!(
                n["metadata"]["annotations"][record::ANNOTATION].as_str(),
                Some(ann.as_str()),
                "the record as it was"
            );
            // Decided from the record as it is now, it goes back.
            let now_rec = DrainRecord::read(
                &serde_json::from_value(n["metadata"]["annotations"].clone()).unwrap(),
                ca_asg_provider::clock::utc_now(),
            )
            .unwrap();
            assert!(cordon::uncordon_if(&stage, name, &now_rec)
                .await
                .unwrap()
                .is_some());
            assert!(clean(&node(&w, name)));
        }
    }
    w.engine.shutdown();
}

/// Issue 69 (suspected): `drain NODE --terminate` on a group whose warm pool takes
/// instances back said "AWS ends the instance", where AWS may return it to the pool
/// instead. It now says both, before and after.
#[tokio::test]
async fn drain_terminate_into_a_reusing_warm_pool_says_the_pool_may_take_the_instance_back() {
    let w = pooled_world("Stopped").await;
    let (node_name, iid) = node_with_fluentd_and_app(&w, 0.2).await;
    let mut cfg = ca_asg_provider::config::ConfigArgs {
        region: Some("us-east-1".into()),
        ..Default::default()
    }
    .load()
    .unwrap();
    cfg.provider.selector = ca_asg_provider::world::named(&["web"]);
    cfg.scale_in = scalein::ScaleInSettings {
        leader_election: true,
        ..settings()
    };
    let args = ca_asg_provider::commands::drain::DrainArgs {
        node: node_name.clone(),
        dry_run: false,
        terminate: true,
        config: ca_asg_provider::config::ConfigArgs::default(),
    };
    let lines = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let sink = lines.clone();
    let cloud: Arc<dyn ca_asg_provider::cloud::Cloud> = Arc::new(w.cloud.clone());
    tokio::time::timeout(
        Duration::from_secs(60),
        ca_asg_provider::commands::drain::drain_in(
            w.sim.client(),
            Some(cloud),
            &cfg,
            &args,
            Arc::new(move |l: &str| sink.lock().unwrap().push(l.to_string())),
        ),
    )
    .await
    .expect("the command ends")
    .unwrap();
    let said = lines.lock().unwrap().join("\n");
    assert!(
        said.contains("is completed and AWS ends it or, as the group's warm pool reuses instances on scale-in, returns it to the pool"),
        "{said}"
    );
    assert!(
        said.contains("done: node drained; the lifecycle hook's action was completed and AWS ends the instance or returns it to the group's warm pool"),
        "{said}"
    );
    assert!(
        !in_service(&w.cloud, &iid),
        "the instance left the group, ended or back in the pool"
    );
    w.engine.shutdown();
}

/// Issue 75 (the soak, seed 3008, replicas as processes): a follow pass that began
/// while its replica led read AWS for longer than the replica's term, then wrote the
/// pool rest on a Node 2.6 s after the replica stepped down. A replica that does not
/// lead writes nothing: the pass looks again after its read, and the engine's client
/// refuses every write but an Event while the replica does not lead, whatever path
/// sends it (each of the two alone keeps this test green; without both it fails).
#[tokio::test]
async fn a_follow_pass_whose_aws_read_outlasts_the_term_writes_nothing() {
    let w = World::builder()
        .group(pooled_group_of(2, "Stopped"))
        .settings(settings())
        .build()
        .await;
    let stage = w.engine.stage();
    let nodes = nodes_of(&w, "web");
    assert_eq!(nodes.len(), 2);
    let done = our_action_done_earlier();
    let rested = |name: &str| pool_rest_noted(&w, name);
    // Drained into the pool: our action done and recorded on the Node.
    let drained_into_pool = |i: usize| {
        let (name, iid) = nodes[i].clone();
        let (stage, w, done) = (&stage, &w, done.clone());
        async move {
            cordon::cordon(stage, &name, &[done], "web", None)
                .await
                .unwrap();
            assert!(w.cloud.send_to_warm_pool(&iid, "Warmed:Stopped"));
            eventually("the Node index sees the mark", 10, || {
                w.engine
                    .tools
                    .nodes
                    .marked_for_drain()
                    .iter()
                    .any(|m| m.node == name)
            })
            .await;
            name
        }
    };

    // The leader's pass notes the rest (what the test could fail on).
    let led = drained_into_pool(0).await;
    scalein::sources::warm_pool::follow(&w.engine, &w.provider).await;
    assert!(rested(&led), "the leader notes the pool rest");

    // The next pass reads AWS slowly; the replica steps down during the read.
    let late = drained_into_pool(1).await;
    w.cloud.slow(Duration::from_millis(800));
    let pass = {
        let (engine, provider) = (w.engine.clone(), w.provider.clone());
        tokio::spawn(async move { scalein::sources::warm_pool::follow(&engine, &provider).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    w.engine.leadership.stop_acting();
    let stepped_down = ca_asg_provider::clock::Instant::now();
    pass.await.unwrap();
    w.cloud.slow(Duration::ZERO);
    assert!(!rested(&late), "nothing written after the step-down");
    let late_writes: Vec<_> = w
        .sim
        .requests()
        .writes()
        .into_iter()
        .filter(|s| s.at >= stepped_down && s.resource.starts_with("nodes"))
        .collect();
    assert!(late_writes.is_empty(), "{late_writes:?}");
    w.engine.shutdown();
}

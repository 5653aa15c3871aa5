//! EKS managed node groups: the ASG carries EKS's own `Terminate-LC-Hook` besides
//! (or instead of) this service's hook, and EKS drains the node itself, through the
//! Eviction API, at the same time as this service does. The memory cloud holds an
//! instance in Terminating:Wait until every hook's action is completed or timed out;
//! EKS's drainer (tests/support/eks.rs) evicts every workload pod at once and leaves
//! DaemonSet pods alone. Whatever the mix, budgets hold, DaemonSet pods leave after the
//! workloads, the instance ends only when both hooks let it, each of our actions is
//! completed once and the desired capacity drops once.

use std::sync::atomic::Ordering;
use std::time::Duration;

use ca_asg_provider::cloud::memory::{
    HookEvent, MemoryCloud, MemoryGroup, MemoryTiming, EKS_TERMINATE_HOOK,
};
use ca_asg_provider::cloud::{Cloud, LifecycleAction, LifecycleResult, LifecycleState};
use ca_asg_provider::scalein;
use ca_asg_provider::sim::{fixtures, AuditEntry};
use k8s_openapi::api::core::v1::Pod;

mod support;
use support::budget_floor::BudgetFloor;
use support::eks::{EksDrainer, EksOptions};
use support::eventually;
use support::world::*;

const HOOK: &str = "ca-asg-provider-drain";
const GROUP: &str = "ng";

/// EKS's drainer that completes its hook once the node's pods are gone (30 s at most).
const EKS_COMPLETES: EksOptions = EksOptions {
    complete: true,
    timeout: Duration::from_secs(30),
};

fn managed(desired: i32, ours: Option<i32>, eks_timeout_secs: i32) -> MemoryGroup {
    let g = MemoryGroup::new(GROUP, 0, 5, desired, "m5.large").eks_managed(
        "prod",
        "ng-1",
        eks_timeout_secs,
    );
    match ours {
        Some(t) => g.terminating_hook(HOOK, t),
        None => g,
    }
}

// ---------------------------------------------------------------------------------
// The memory cloud's model of several hooks.

fn action(hook: &str, id: &str) -> LifecycleAction {
    LifecycleAction {
        group: GROUP.into(),
        hook: hook.into(),
        instance_id: id.into(),
        token: None,
    }
}

fn quick() -> MemoryTiming {
    ca_asg_provider::sim::world::instant_timing()
}

#[tokio::test]
async fn an_instance_waits_for_every_hook_and_goes_on_after_the_last() {
    let cloud = MemoryCloud::new(vec![managed(2, Some(300), 300)], quick());
    let snap = &cloud
        .describe_groups(&ca_asg_provider::world::named(&[GROUP]))
        .await
        .unwrap()[0];
    // As AWS: DescribeAutoScalingGroups carries no hooks; DescribeLifecycleHooks
    // lists them.
    assert!(snap.terminating_hooks.is_empty());
    assert_eq!(snap.tags["eks:cluster-name"], "prod");
    assert_eq!(snap.tags["eks:nodegroup-name"], "ng-1");
    let hooks = cloud.terminating_hooks(GROUP).await.unwrap();
    let names: Vec<&str> = hooks.iter().map(|h| h.name.as_str()).collect();
    assert_eq!(names, vec![EKS_TERMINATE_HOOK, HOOK]);

    let id = cloud.instances()[0].1.id.clone();
    cloud.terminate_instance(&id, true).await.unwrap();
    assert_eq!(cloud.pending_hooks(&id), vec![EKS_TERMINATE_HOOK, HOOK]);
    // Ours done: EKS's still holds it.
    cloud
        .complete_lifecycle_action(&action(HOOK, &id), LifecycleResult::Continue)
        .await
        .unwrap();
    assert_eq!(state_of(&cloud, &id), Some(LifecycleState::TerminatingWait));
    assert_eq!(cloud.pending_hooks(&id), vec![EKS_TERMINATE_HOOK]);
    // Our action is over: a second completion or a heartbeat finds none.
    assert!(cloud
        .complete_lifecycle_action(&action(HOOK, &id), LifecycleResult::Continue)
        .await
        .is_err());
    assert!(cloud.lifecycle_heartbeat(&action(HOOK, &id)).await.is_err());
    // EKS's heartbeat still counts.
    cloud
        .lifecycle_heartbeat(&action(EKS_TERMINATE_HOOK, &id))
        .await
        .unwrap();
    cloud
        .complete_lifecycle_action(&action(EKS_TERMINATE_HOOK, &id), LifecycleResult::Continue)
        .await
        .unwrap();
    eventually("the instance ends", 5, || state_of(&cloud, &id).is_none()).await;
    let log: Vec<HookEvent> = cloud.lifecycle_log();
    assert!(
        matches!(&log[..], [
            HookEvent::Completed { hook: a, .. },
            HookEvent::Completed { hook: b, .. },
            HookEvent::Proceeded { .. },
            HookEvent::Terminated { .. },
        ] if a == HOOK && b == EKS_TERMINATE_HOOK),
        "{log:?}"
    );
    assert_eq!(cloud.desired(GROUP), Some(1));
}

#[tokio::test]
async fn one_hook_timing_out_leaves_the_other_holding_and_abandon_ends_them_all() {
    // EKS's hook (CONTINUE by default) times out after 1 s; ours (300 s) holds on.
    let cloud = MemoryCloud::new(vec![managed(3, Some(300), 1)], quick());
    let ids: Vec<String> = cloud.instances().into_iter().map(|(_, i)| i.id).collect();
    cloud.terminate_instance(&ids[0], true).await.unwrap();
    eventually("EKS's hook times out", 5, || {
        cloud.pending_hooks(&ids[0]) == vec![HOOK.to_string()]
    })
    .await;
    assert_eq!(
        state_of(&cloud, &ids[0]),
        Some(LifecycleState::TerminatingWait)
    );
    assert_eq!(cloud.hook_timeouts(), vec![ids[0].clone()]);
    cloud
        .complete_lifecycle_action(&action(HOOK, &ids[0]), LifecycleResult::Continue)
        .await
        .unwrap();
    eventually("it ends", 5, || state_of(&cloud, &ids[0]).is_none()).await;

    // ABANDON on termination stops the remaining actions (AWS's rule): EKS's too.
    cloud.terminate_instance(&ids[1], true).await.unwrap();
    cloud
        .complete_lifecycle_action(&action(HOOK, &ids[1]), LifecycleResult::Abandon)
        .await
        .unwrap();
    assert!(cloud.pending_hooks(&ids[1]).is_empty());
    eventually("it ends", 5, || state_of(&cloud, &ids[1]).is_none()).await;
    assert!(cloud.lifecycle_log().contains(&HookEvent::Dropped {
        instance: ids[1].clone(),
        hook: EKS_TERMINATE_HOOK.into(),
    }));
}

// ---------------------------------------------------------------------------------
// The drain with EKS's drainer beside it.

/// A managed node group's workloads: `api` (6 replicas, 2 a node, at most 1
/// unavailable, so 5 Ready at every moment), a fluentd DaemonSet and a bare pod `app` on `victim`.
struct Scene {
    node: String,
    iid: String,
    workloads: Vec<String>,
    fluentd: String,
    floor: BudgetFloor,
    desired: i32,
}

/// The managed group with three instances (our hook's timeout `ours`, EKS's
/// `eks_timeout_secs`), pods Ready 300 ms after binding.
async fn managed_world(ours: Option<i32>, eks_timeout_secs: i32) -> World {
    World::builder()
        .group(managed(3, ours, eks_timeout_secs))
        .ready_delay(Duration::from_millis(300))
        .build()
        .await
}

async fn scene(w: &World) -> Scene {
    let nodes = nodes_of(w, GROUP);
    // The ASG ends the newest instance itself: the same one in every test.
    let (node, iid) = nodes.last().cloned().unwrap();
    w.put(&fixtures::replicaset("shop", "api", 6, 0.3));
    w.put(&fixtures::pdb("shop", "api", 1));
    // Placed first, by least load: two on each node.
    pods_ready(w, 6).await;
    w.put(&fixtures::daemonset("logging", "fluentd", 0.3, false));
    w.put(&fixtures::pod("shop", "app", &node, "app", 1.0));
    pods_ready(w, 6 + nodes.len() + 1).await;
    let on_node: Vec<serde_json::Value> = w
        .sim
        .list::<Pod>()
        .into_iter()
        .filter(|p| p["spec"]["nodeName"] == node.as_str())
        .collect();
    let name = |p: &serde_json::Value| p["metadata"]["name"].as_str().unwrap().to_string();
    let fluentd = on_node
        .iter()
        .filter(|p| p["metadata"]["namespace"] == "logging")
        .map(name)
        .next()
        .expect("a fluentd pod on the node");
    let workloads: Vec<String> = on_node
        .iter()
        .filter(|p| p["metadata"]["namespace"] == "shop")
        .map(name)
        .collect();
    assert!(workloads.iter().any(|n| n == "app"), "{workloads:?}");
    // Two replicas on the node: the second eviction has to wait for the budget.
    assert!(
        workloads.iter().filter(|n| n.starts_with("api-")).count() >= 2,
        "{workloads:?}"
    );
    let floor = BudgetFloor::watch(&w.sim, "api", 5);
    let desired = w.cloud.desired(GROUP).unwrap();
    Scene {
        node,
        iid,
        workloads,
        fluentd,
        floor,
        desired,
    }
}

/// CA's target for the group after a Refresh, as CA reads it.
async fn refreshed_target(w: &mut World) -> i32 {
    w.ca.refresh(ca_asg_provider::proto::RefreshRequest {})
        .await
        .unwrap();
    target(w, GROUP).await
}

fn at(a: &[AuditEntry], verb: &str, kind: &str, name: &str) -> Option<usize> {
    a.iter()
        .position(|e| e.verb == verb && e.kind == kind && e.name == name)
}

/// Waits for the instance to be gone, then checks what every test promises.
async fn ended_as_promised(w: &World, s: &Scene, eks: &EksDrainer, ours: Option<&str>) {
    eventually("the instance is gone", 30, || {
        w.cloud.lifecycle_log().contains(&HookEvent::Terminated {
            instance: s.iid.clone(),
        })
    })
    .await;
    eventually("the Node goes with the instance", 10, || {
        w.sim
            .get::<k8s_openapi::api::core::v1::Node>("", &s.node)
            .is_none()
    })
    .await;
    // Budgets: from outside, and no pod of the shop deleted but through an eviction.
    s.floor.assert_held();
    let a = w.sim.audit();
    for (i, e) in a.iter().enumerate() {
        if e.kind == "Pod" && e.namespace == "shop" && e.verb == "deletion-started" {
            assert!(
                a[..i]
                    .iter()
                    .any(|x| x.verb == "evicted" && x.kind == "Pod" && x.name == e.name),
                "{} deleted without an eviction",
                e.name
            );
        }
    }
    // The budget did hold an eviction back (whose, the two drainers race for).
    assert!(
        a.iter()
            .any(|e| e.verb == "eviction-denied" && e.name.starts_with("api-"))
            || w.engine.tools.stats.evictions_held.load(Ordering::Relaxed) > 0,
        "no eviction was held by the budget"
    );
    // DaemonSet pods last: fluentd is evicted after every workload pod of the node
    // is gone, and the Node goes after fluentd.
    let last_workload_gone = s
        .workloads
        .iter()
        .map(|p| at(&a, "removed", "Pod", p).unwrap_or_else(|| panic!("{p} never removed")))
        .max()
        .unwrap();
    let ds_evicted = at(&a, "evicted", "Pod", &s.fluentd).expect("fluentd evicted");
    let ds_gone = at(&a, "removed", "Pod", &s.fluentd).expect("fluentd removed");
    let node_gone = at(&a, "removed", "Node", &s.node).expect("Node removed");
    assert!(
        last_workload_gone < ds_evicted && ds_evicted < ds_gone && ds_gone < node_gone,
        "{last_workload_gone} {ds_evicted} {ds_gone} {node_gone}"
    );
    // The instance went on only after both hooks' actions ended, and once.
    let log: Vec<HookEvent> = w
        .cloud
        .lifecycle_log()
        .into_iter()
        .filter(|e| match e {
            HookEvent::Completed { instance, .. }
            | HookEvent::TimedOut { instance, .. }
            | HookEvent::Dropped { instance, .. }
            | HookEvent::Proceeded { instance }
            | HookEvent::Terminated { instance } => instance == &s.iid,
        })
        .collect();
    let ended = |hook: &str| {
        log.iter().position(|e| match e {
            HookEvent::Completed { hook: h, .. } | HookEvent::TimedOut { hook: h, .. } => h == hook,
            _ => false,
        })
    };
    let proceeded = log
        .iter()
        .position(|e| matches!(e, HookEvent::Proceeded { .. }))
        .expect("proceeded");
    let eks_end = ended(EKS_TERMINATE_HOOK).expect("EKS's action ended");
    assert!(eks_end < proceeded, "{log:?}");
    assert!(
        !log.iter().any(|e| matches!(e, HookEvent::Dropped { .. })),
        "{log:?}"
    );
    assert_eq!(log.len(), if ours.is_some() { 4 } else { 3 }, "{log:?}");
    // EKS's hook: only EKS's drainer completed it; the service never touched it.
    let done = w.cloud.completed_actions();
    let eks_done = done
        .iter()
        .filter(|(a, _)| a.hook == EKS_TERMINATE_HOOK && a.instance_id == s.iid)
        .count();
    assert_eq!(
        eks_done,
        usize::from(eks.drain_of(&s.iid).expect("EKS saw it").completed)
    );
    assert!(
        !w.cloud
            .heartbeats()
            .iter()
            .any(|h| h.hook == EKS_TERMINATE_HOOK),
        "the service heartbeated EKS's hook"
    );
    if let Some(hook) = ours {
        let ours_end = ended(hook).expect("our action ended");
        assert!(ours_end < proceeded, "{log:?}");
        assert!(
            matches!(
                &log[ours_end],
                HookEvent::Completed {
                    result: LifecycleResult::Continue,
                    ..
                }
            ),
            "{log:?}"
        );
        let mine: Vec<_> = done
            .iter()
            .filter(|(a, _)| a.hook == hook && a.instance_id == s.iid)
            .collect();
        assert_eq!(mine.len(), 1, "{done:?}");
    }
    // One drain of the instance, ended once (not `Engine::wait_for`, which forgets
    // the drain: the running loop would resume it), and the desired capacity one
    // lower, once.
    eventually("our drain ends", 10, || !w.engine.is_draining(&s.iid)).await;
    assert_eq!(w.engine.tools.stats.started.load(Ordering::Relaxed), 1);
    assert_eq!(w.engine.tools.stats.ended.load(Ordering::Relaxed), 1);
    assert_eq!(w.cloud.desired(GROUP), Some(s.desired - 1));
    assert_eq!(w.cloud.calls().get("set_desired_capacity"), None);
    let live = w
        .cloud
        .instances()
        .into_iter()
        .filter(|(_, i)| !i.state.is_terminating())
        .count() as i32;
    assert_eq!(live, s.desired - 1);
}

#[tokio::test]
async fn cas_scale_in_in_lifecycle_mode_with_eks_draining_beside_it() {
    let mut w = managed_world(Some(30), 30).await;
    scalein::sources::hook_scan::spawn_loop(w.engine.clone(), w.provider.clone());
    let s = scene(&w).await;
    let eks = EksDrainer::start(&w.sim, &w.cloud, GROUP, EKS_COMPLETES);
    delete_nodes(&mut w, GROUP, &[(s.node.clone(), s.iid.clone())]).await;
    assert_eq!(refreshed_target(&mut w).await, s.desired - 1);
    ended_as_promised(&w, &s, &eks, Some(HOOK)).await;
    assert_eq!(refreshed_target(&mut w).await, s.desired - 1);
    let d = eks.drain_of(&s.iid).unwrap();
    // EKS really drained beside ours: it evicted, or its evictions met the budget.
    assert!(!d.evicted.is_empty() || d.refused > 0, "{d:?}");
    assert!(d.completed, "{d:?}");
    assert_eq!(w.cloud.calls()["terminate_instance"], 1);
}

#[tokio::test]
async fn an_asg_started_scale_in_with_both_hooks_and_eks_timing_out() {
    // EKS's drainer does not complete its hook: it times out after 6 s, after ours
    // was completed (our drain takes about 1.5 s), so the instance waits in
    // Terminating:Wait on EKS's hook alone for seconds, under the service's scans
    // (every 200 ms). Before the fix each scan took it for a new action of ours.
    let mut w = managed_world(Some(30), 6).await;
    scalein::sources::hook_scan::spawn_loop(w.engine.clone(), w.provider.clone());
    let s = scene(&w).await;
    let eks = EksDrainer::start(
        &w.sim,
        &w.cloud,
        GROUP,
        EksOptions {
            complete: false,
            timeout: Duration::from_secs(6),
        },
    );
    let ended = w.cloud.external_scale_in(GROUP, 1).unwrap();
    assert_eq!(ended, vec![s.iid.clone()]);
    eventually("our action completed", 20, || {
        w.cloud
            .completed_actions()
            .iter()
            .any(|(a, _)| a.hook == HOOK && a.instance_id == s.iid)
    })
    .await;
    let heartbeats = w.cloud.heartbeats().len();
    let asked = w
        .cloud
        .calls()
        .get("lifecycle_heartbeat")
        .copied()
        .unwrap_or(0);
    // Held by EKS's hook alone now: CA's target counts the instance gone, once.
    assert_eq!(refreshed_target(&mut w).await, s.desired - 1);
    ended_as_promised(&w, &s, &eks, Some(HOOK)).await;
    assert_eq!(refreshed_target(&mut w).await, s.desired - 1);
    // EKS's hook alone held the instance after ours was completed, under the
    // service's scans: no new drain (checked above), no heartbeat of our action
    // taken. The scans asked AWS whether our hook holds a new action there (one
    // heartbeat AWS refused, believed for lifecycle::NOT_HELD_RECHECK).
    let log = w.cloud.lifecycle_log();
    let ours = log.iter().position(|e| {
        matches!(e, HookEvent::Completed { instance, hook, .. } if *instance == s.iid && hook == HOOK)
    });
    let eks_out = log.iter().position(|e| {
        *e == HookEvent::TimedOut {
            instance: s.iid.clone(),
            hook: EKS_TERMINATE_HOOK.into(),
        }
    });
    assert!(
        ours.is_some() && eks_out.is_some() && ours < eks_out,
        "ours completed, then EKS's timed out: {log:?}"
    );
    assert_eq!(w.cloud.heartbeats().len(), heartbeats, "a heartbeat taken");
    let probes = w
        .cloud
        .calls()
        .get("lifecycle_heartbeat")
        .copied()
        .unwrap_or(0)
        - asked;
    assert!(probes <= 1, "{probes} probes within the recheck");
    assert_eq!(w.cloud.calls().get("terminate_instance"), None);
}

#[tokio::test]
async fn direct_mode_drains_first_and_eks_finds_nothing_to_evict() {
    let mut w = managed_world(None, 30).await;
    scalein::sources::hook_scan::spawn_loop(w.engine.clone(), w.provider.clone());
    let s = scene(&w).await;
    let eks = EksDrainer::start(&w.sim, &w.cloud, GROUP, EKS_COMPLETES);
    delete_nodes(&mut w, GROUP, &[(s.node.clone(), s.iid.clone())]).await;
    assert_eq!(refreshed_target(&mut w).await, s.desired - 1);
    ended_as_promised(&w, &s, &eks, None).await;
    assert_eq!(refreshed_target(&mut w).await, s.desired - 1);
    // EKS's hook held the instance after the service's TerminateInstance..., and its
    // drainer found nothing to evict (the workloads were gone; DaemonSet pods it
    // leaves alone), then completed its hook.
    let d = eks.drain_of(&s.iid).expect("EKS's hook held the instance");
    assert!(d.evicted.is_empty() && d.refused == 0, "{d:?}");
    assert!(d.completed, "{d:?}");
    assert_eq!(w.cloud.calls()["terminate_instance"], 1);
    assert!(w
        .cloud
        .completed_actions()
        .iter()
        .all(|(a, _)| a.hook == EKS_TERMINATE_HOOK));
}

/// The ASG's lifecycle notification for `iid` under our hook, as EventBridge sends it.
fn lifecycle_note(iid: &str) -> String {
    support::notices::lifecycle(GROUP, iid, HOOK, Some("tok-1"))
}

/// Issue 39 (suspected item, proven): our hook's action is completed and EKS's hook
/// holds the instance in Terminating:Wait a while yet; then the service restarts (or
/// another replica takes the Lease). The memory of completed actions was the
/// process's alone: the new process's scan took the held instance for a new action
/// of ours and drained the node again (measured on the old code: a second drain, a
/// second drain Event, a heartbeat and a CompleteLifecycleAction of the finished
/// action, which AWS refuses; the log shipper the DaemonSet controller had put back
/// was spared only because a DaemonSet pod that arrives after a drain began is not
/// chased), and SQS's redelivery of the lifecycle message did the same. Now the
/// Node's record says the action was completed: no drain starts, no pod is evicted
/// again, nothing is heartbeated or completed a second time.
#[tokio::test]
async fn a_restarted_service_does_not_drain_again_an_instance_only_eks_still_holds() {
    let w = managed_world(Some(30), 60).await;
    let lifecycle = scalein::sources::hook_scan::spawn_loop(w.engine.clone(), w.provider.clone());
    let s = scene(&w).await;
    // A log shipper that tolerates every taint: the DaemonSet controller puts it
    // back on the cordoned node after each eviction.
    let nodes = nodes_of(&w, GROUP).len();
    w.put(&fixtures::daemonset("logging", "shipper", 0.2, true));
    pods_ready(&w, 6 + 2 * nodes + 1).await;
    let _eks = EksDrainer::start(
        &w.sim,
        &w.cloud,
        GROUP,
        EksOptions {
            complete: false,
            timeout: Duration::from_secs(60),
        },
    );
    assert_eq!(
        w.cloud.external_scale_in(GROUP, 1).unwrap(),
        vec![s.iid.clone()]
    );
    let ours_completed = |w: &World| {
        w.cloud
            .completed_actions()
            .iter()
            .filter(|(a, _)| a.hook == HOOK && a.instance_id == s.iid)
            .count()
    };
    eventually("our action completed", 20, || ours_completed(&w) == 1).await;
    let shippers_evicted = |w: &World| {
        w.sim
            .audit()
            .iter()
            .filter(|e| e.verb == "evicted" && e.kind == "Pod" && e.name.starts_with("shipper-"))
            .count()
    };
    assert_eq!(
        shippers_evicted(&w),
        1,
        "our drain evicted the node's shipper"
    );
    eventually("the shipper is back on the cordoned node", 10, || {
        w.sim.list::<Pod>().iter().any(|p| {
            p["spec"]["nodeName"] == s.node.as_str()
                && p["metadata"]["name"]
                    .as_str()
                    .is_some_and(|n| n.starts_with("shipper-"))
                && p["metadata"]["deletionTimestamp"].is_null()
        })
    })
    .await;
    assert_eq!(w.cloud.pending_hooks(&s.iid), vec![EKS_TERMINATE_HOOK]);

    // A new process: nothing remembered but what AWS and the Nodes say.
    lifecycle.abort();
    w.engine.shutdown();
    let completes = || w.cloud.calls().get("complete_lifecycle_action").copied();
    let (heartbeats, completions) = (w.cloud.heartbeats().len(), completes());
    let (provider2, engine2, _ca2) = service(&w.sim, &w.cloud, &w.groups, fast_settings()).await;
    let lifecycle2 = scalein::sources::hook_scan::spawn_loop(engine2.clone(), provider2.clone());
    // Ten scans and more.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        engine2.tools.stats.started.load(Ordering::Relaxed),
        0,
        "the scan drained again"
    );
    assert_eq!(
        shippers_evicted(&w),
        1,
        "the scan's drain evicted the shipper again"
    );
    // SQS delivers the lifecycle message again.
    let q = std::sync::Arc::new(ca_asg_provider::cloud::queue::MemoryQueue::default());
    let c = ca_asg_provider::scalein::sources::queue::Consumer::new(
        engine2.clone(),
        provider2.clone(),
        q.clone(),
        Default::default(),
    );
    q.send(&lifecycle_note(&s.iid));
    let mut got = ca_asg_provider::cloud::queue::Queue::receive(&*q, 1, Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(
        c.handle(got.remove(0)).await,
        ca_asg_provider::scalein::sources::queue::Handled::Done(vec!["duplicate"])
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        shippers_evicted(&w),
        1,
        "the shipper that came back was evicted again"
    );
    assert_eq!(
        engine2.tools.stats.started.load(Ordering::Relaxed),
        0,
        "a drain started again"
    );
    assert!(!engine2.is_draining(&s.iid));
    assert!(!engine2.holds_hook(&s.iid));
    assert_eq!(
        w.cloud.heartbeats().len(),
        heartbeats,
        "our finished action heartbeated"
    );
    assert_eq!(
        completes(),
        completions,
        "our finished action completed again"
    );
    assert_eq!(ours_completed(&w), 1);
    assert_eq!(w.cloud.pending_hooks(&s.iid), vec![EKS_TERMINATE_HOOK]);
    lifecycle2.abort();
    engine2.shutdown();
}

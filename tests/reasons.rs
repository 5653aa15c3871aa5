//! One drain per instance, many reasons: a rebalance cordon, a notice, the ASG's hook
//! and CA's scale-in on the same node, each keeping its own promise. On the in-memory
//! API server over HTTP and the memory cloud, through the consumer and the lifecycle
//! loop the service runs.

use std::time::Duration;

use ca_asg_provider::cloud::memory::MemoryGroup;
use ca_asg_provider::cloud::LifecycleHook;
use ca_asg_provider::scalein::decide::notice::RebalanceAction;
use ca_asg_provider::scalein::sources::queue::Handled;
use ca_asg_provider::scalein::{self, decide::record, Outcome, ScaleInSettings};
use ca_asg_provider::sim::fixtures;
use k8s_openapi::api::core::v1::{Node, Pod, Toleration};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;

mod support;
use support::eventually;
use support::notices::{rebalance, spot, spot_at};
use support::queue::{handle_all, handle_next, queue_and_consumer, running};
use support::world::*;

const HOOK: &str = "ca-asg-provider-drain";

fn blocked(w: &World) -> bool {
    events(&w.sim).iter().any(|(r, _)| r == "EvictionBlocked")
}

fn record_on(w: &World, node: &str) -> Option<record::DrainRecord> {
    let n = w.sim.get::<Node>("", node)?;
    let a: std::collections::BTreeMap<String, String> =
        serde_json::from_value(n["metadata"]["annotations"].clone()).ok()?;
    record::DrainRecord::read(&a, ca_asg_provider::clock::utc_now())
}

/// The ASG scales web in by one itself and picks `iid` (the newest), which our hook
/// then holds.
/// The reasons of a drain record, by label, in order.
fn labels(r: &record::DrainRecord) -> Vec<&'static str> {
    r.reasons.iter().map(|r| r.why.label()).collect()
}

/// Lifts the guarded app's budget and waits (20 s at most) for a lifecycle action to
/// be completed.
async fn lift_budget_until_completed(w: &World) {
    assert!(w.sim.remove::<PodDisruptionBudget>("shop", "app-pdb"));
    eventually("the lifecycle action is completed", 20, || {
        !w.cloud.completed_actions().is_empty()
    })
    .await;
}

fn asg_ends(w: &World, iid: &str) {
    assert_eq!(
        w.cloud.external_scale_in("web", 1).unwrap(),
        vec![iid.to_string()]
    );
}

/// A world with one hooked instance (our hook's timeout `timeout_secs`) whose node
/// runs the app `app` under a budget that allows nothing: the world, the node and
/// its instance.
async fn guarded_on_a_hooked_node(timeout_secs: i32) -> (World, String, String) {
    let w = World::builder()
        .groups(hooked(1, timeout_secs))
        .build()
        .await;
    let (node, iid) = nodes_of(&w, "web").remove(0);
    guarded_app(&w, &node, "app").await;
    (w, node, iid)
}

fn hooked(desired: i32, timeout_secs: i32) -> Vec<MemoryGroup> {
    vec![MemoryGroup::new("web", 0, 3, desired, "m5.large").terminating_hook(HOOK, timeout_secs)]
}

/// The seen failure: `rebalance: cordon` (the default) marked the node an hour ago;
/// the ASG now ends it through the hook. The hook's drain has its own ten minutes:
/// the PDB's 429s are waited out, the pod is never deleted around them.
#[tokio::test]
async fn a_hook_drain_after_an_old_rebalance_cordon_keeps_the_pdb() {
    let (w, node, iid) = guarded_on_a_hooked_node(300).await;
    // The cordon as a rebalance recommendation left it, an hour ago (the marks every
    // version writes: start time and mode).
    set_unschedulable(&w, &node, true).await;
    let an_hour_ago = (chrono::Utc::now() - chrono::Duration::hours(1)).to_rfc3339();
    let nodes: kube::Api<Node> = kube::Api::all(w.sim.client());
    nodes
        .patch(
            &node,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({"metadata": {"annotations": {
                scalein::stages::cordon::STARTED_ANNOTATION: an_hour_ago,
                scalein::stages::cordon::MODE_ANNOTATION: "rebalance",
            }}})),
        )
        .await
        .unwrap();
    let lifecycle = scalein::sources::hook_scan::spawn_loop(w.engine.clone(), w.provider.clone());
    asg_ends(&w, &iid);
    eventually("the PDB refuses the eviction", 10, || blocked(&w)).await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(
        running(&w, "app"),
        "the hook's drain waits on the PDB; its deadline counts from its own arrival"
    );
    let r = record_on(&w, &node).expect("the drain is recorded on the Node");
    assert_eq!(labels(&r), ["rebalance cordon", "lifecycle hook"]);
    // The budget allows it now: evicted, then the action completed.
    lift_budget_until_completed(&w).await;
    lifecycle.abort();
    let evicted = evictions_of(&w, "app");
    assert_eq!(evicted, 1, "evicted through the Eviction API, not deleted");
    assert!(w.cloud.hook_timeouts().is_empty());
}

/// Issue 30, 1: `rebalance: cordon` marked the node; then a workload pod with a
/// blanket toleration (`operator: Exists`) was put on it; later the ASG ends the node
/// through the hook. The drain began with the hook, not with the cordon (which never
/// drains): the pod was there before it, so it is no replacement. It is evicted
/// through its PDB, and the action is completed only once it is gone.
#[tokio::test]
async fn a_pod_that_landed_during_a_rebalance_cordon_is_drained_by_the_hook() {
    let w = World::builder().groups(hooked(1, 300)).build().await;
    let (node, iid) = nodes_of(&w, "web").remove(0);
    let (q, c) = queue_and_consumer(&w, RebalanceAction::Cordon);
    q.send(&rebalance(&iid));
    assert_eq!(handle_next(&c, &q).await, Handled::Done(vec!["cordon"]));
    // After the cordon: a pod that tolerates every taint lands on the node.
    w.put(&fixtures::pdb("shop", "app", 0));
    let mut pod = fixtures::pod("shop", "app", &node, "app", 0.1);
    pod.spec.as_mut().unwrap().tolerations = Some(vec![Toleration {
        operator: Some("Exists".into()),
        ..Default::default()
    }]);
    w.put(&pod);
    pods_ready(&w, 1).await;

    let lifecycle = scalein::sources::hook_scan::spawn_loop(w.engine.clone(), w.provider.clone());
    asg_ends(&w, &iid);
    eventually(
        "the hook's drain evicts the pod: the PDB refuses",
        10,
        || blocked(&w),
    )
    .await;
    assert!(running(&w, "app"));
    assert!(
        w.cloud.completed_actions().is_empty(),
        "not completed with the pod running"
    );
    let r = record_on(&w, &node).expect("recorded on the Node");
    assert_eq!(labels(&r), ["rebalance cordon", "lifecycle hook"]);

    lift_budget_until_completed(&w).await;
    lifecycle.abort();
    assert!(!running(&w, "app"));
    let evicted = evictions_of(&w, "app");
    assert_eq!(evicted, 1);
    assert!(w.cloud.hook_timeouts().is_empty());
}

/// `rebalance: drain` is draining the node, held by a PDB, when an instance refresh
/// ends the instance through the hook: the hook is heartbeated (its timeout is 3 s
/// here) and completed when the drain ends, never left to time out with the workload
/// running.
#[tokio::test]
async fn a_hook_on_an_instance_another_drain_holds_is_heartbeated_and_completed() {
    let (w, _, iid) = guarded_on_a_hooked_node(3).await;
    let (q, c) = queue_and_consumer(&w, RebalanceAction::Drain);
    q.send(&rebalance(&iid));
    assert_eq!(handle_next(&c, &q).await, Handled::Done(vec!["drain"]));
    eventually("the PDB refuses the eviction", 10, || blocked(&w)).await;

    let lifecycle = scalein::sources::hook_scan::spawn_loop(w.engine.clone(), w.provider.clone());
    asg_ends(&w, &iid);
    eventually("the hook is heartbeated", 10, || {
        w.cloud.heartbeats().iter().any(|a| a.instance_id == iid)
    })
    .await;
    // Longer than the hook's timeout: only heartbeats keep the instance.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(
        w.cloud.hook_timeouts().is_empty(),
        "the hook never timed out"
    );
    assert!(running(&w, "app"), "the PDB still holds");

    assert!(w.sim.remove::<PodDisruptionBudget>("shop", "app-pdb"));
    action_completed(&w, &iid, 20).await;
    lifecycle.abort();
    assert!(w.cloud.hook_timeouts().is_empty());
}

/// A spot warning for an instance is recorded on the Node, with its budget, before
/// its message is deleted, and its drain starts at once although
/// `maxConcurrentDrains` is busy (the instance ends anyway: exempt from every
/// disruption budget); a restart while a PodDisruptionBudget still holds it
/// resumes it with the budget.
#[tokio::test]
async fn a_notice_is_on_the_node_before_its_message_goes_and_survives_a_restart() {
    let one_at_a_time = ScaleInSettings {
        max_concurrent_drains: 1,
        ..fast_settings()
    };
    let mut w = World::builder()
        .web(3, 2)
        .settings(one_at_a_time)
        .build()
        .await;
    let web = nodes_of(&w, "web");
    let ((busy_node, busy), (node, iid)) = (web[0].clone(), web[1].clone());
    guarded_app(&w, &busy_node, "held").await;
    guarded_app(&w, &node, "app").await;
    let (q, c) = queue_and_consumer(&w, RebalanceAction::Drain);
    q.send(&rebalance(&busy));
    assert_eq!(handle_next(&c, &q).await, Handled::Done(vec!["drain"]));
    eventually("the first drain holds the only slot", 10, || blocked(&w)).await;

    q.send(&spot(&iid));
    assert_eq!(handle_next(&c, &q).await, Handled::Done(vec!["drain"]));
    assert_eq!(q.pending(), 0, "the message is deleted");
    let r = record_on(&w, &node).expect("recorded on the Node before the message went");
    let plan = r.plan(w.engine.limits());
    assert!(plan.drains);
    assert!(plan.budget_ends.is_some(), "{r:?}");
    eventually(
        "the spot drain runs beside the one that holds the only slot",
        10,
        || {
            w.engine
                .book
                .stories()
                .values()
                .filter(|s| s.slot_run.is_some())
                .count()
                == 2
        },
    )
    .await;
    assert!(running(&w, "app"), "the app's budget holds the spot drain");

    // The process dies in that window.
    w.engine.abort_all();
    w.engine.shutdown();
    let two = ScaleInSettings {
        max_concurrent_drains: 2,
        ..fast_settings()
    };
    let (provider, engine, ca) = service(&w.sim, &w.cloud, &w.groups, two).await;
    w.provider = provider;
    w.engine = engine;
    w.ca = ca;
    let lifecycle = scalein::sources::hook_scan::spawn_loop(w.engine.clone(), w.provider.clone());
    assert!(w.sim.remove::<PodDisruptionBudget>("shop", "app-pdb"));
    eventually("the spot drain resumes and evicts the app", 20, || {
        !running(&w, "app")
    })
    .await;
    eventually(
        "the resumed drain is measured against the spot budget",
        20,
        || {
            events(&w.sim).iter().any(|(r, n)| {
                r == "InterruptionDrained" && n.contains("before AWS ends the instance")
            })
        },
    )
    .await;
    lifecycle.abort();
    assert!(running(&w, "held"), "the PDB of the other node still holds");
}

/// A spot warning for an instance a rebalance drain already drains (held by a PDB,
/// ten minutes to go) brings its budget to that drain: with 15 s of its two minutes
/// left the budget is spent, so the drain goes on and the pod gets its graceful stop
/// before EC2 takes the instance.
#[tokio::test]
async fn a_notice_for_an_instance_already_draining_brings_its_budget() {
    let w = World::builder().web(3, 1).build().await;
    let (node, iid) = nodes_of(&w, "web").remove(0);
    guarded_app(&w, &node, "app").await;
    let (q, c) = queue_and_consumer(&w, RebalanceAction::Drain);
    q.send(&rebalance(&iid));
    assert_eq!(handle_next(&c, &q).await, Handled::Done(vec!["drain"]));
    eventually("the PDB refuses the eviction", 10, || blocked(&w)).await;
    assert!(running(&w, "app"));

    q.send(&spot_at(
        &iid,
        chrono::Utc::now() - chrono::Duration::seconds(105),
    ));
    assert_eq!(handle_next(&c, &q).await, Handled::Done(vec!["joined"]));
    assert_eq!(w.engine.wait_for(&iid).await, Some(Outcome::Drained));
    assert!(!running(&w, "app"), "the spent budget went on");
    assert_eq!(w.cloud.calls().get("terminate_instance"), None);
}

/// Issue 39, 5: a spot warning joining a drain that holds a slot (`maxConcurrentDrains`
/// reached) restarts it in that slot. Before, the restart gave the slot away: the
/// drain queued behind another blocked by its budget, and the warning's two minutes
/// ran out with the node's pods never asked to leave.
#[tokio::test]
async fn a_spot_warning_joining_a_drain_keeps_its_slot() {
    // b's drain gives up waiting on its budget after 5 s and deletes its pod: a's
    // drain must be over before that, not queued behind it.
    let one_at_a_time = ScaleInSettings {
        max_concurrent_drains: 1,
        workload_deadline: Duration::from_secs(5),
        workload_deadline_policy: scalein::DeadlinePolicy::Proceed,
        ..fast_settings()
    };
    let w = World::builder()
        .web(3, 2)
        .settings(one_at_a_time)
        .build()
        .await;
    let web = nodes_of(&w, "web");
    let ((node_a, a), (node_b, b)) = (web[0].clone(), web[1].clone());
    guarded_app(&w, &node_a, "app").await;
    guarded_app(&w, &node_b, "other").await;
    let (q, c) = queue_and_consumer(&w, RebalanceAction::Drain);
    q.send(&rebalance(&a));
    assert_eq!(handle_next(&c, &q).await, Handled::Done(vec!["drain"]));
    eventually("a's drain holds the only slot, blocked", 10, || blocked(&w)).await;
    q.send(&rebalance(&b));
    assert_eq!(handle_next(&c, &q).await, Handled::Done(vec!["drain"]));
    assert!(w.engine.is_draining(&b), "b's drain waits for the slot");

    // 15 s of the warning's two minutes left: spent, a's drain goes on at once.
    q.send(&spot_at(
        &a,
        chrono::Utc::now() - chrono::Duration::seconds(105),
    ));
    assert_eq!(handle_next(&c, &q).await, Handled::Done(vec!["joined"]));
    assert_eq!(w.engine.wait_for(&a).await, Some(Outcome::Drained));
    assert!(
        !running(&w, "app"),
        "a's pod got its graceful stop in the budget"
    );
    assert!(
        running(&w, "other"),
        "a's drain finished only after b's deadline: it had queued behind b for a slot"
    );
    let _ = node_b;
}

/// A finished interruption drain is recorded as done: the loop's resume does not
/// drain the node again every poll (Events, a cluster-wide VolumeAttachment list).
#[tokio::test]
async fn a_finished_drain_is_not_drained_again() {
    let w = World::builder().web(3, 1).build().await;
    let (node, iid) = node_with_fluentd_and_app(&w, 0.1).await;
    let (q, c) = queue_and_consumer(&w, RebalanceAction::Cordon);
    q.send(&spot(&iid));
    assert_eq!(handle_next(&c, &q).await, Handled::Done(vec!["drain"]));
    assert_eq!(w.engine.wait_for(&iid).await, Some(Outcome::Drained));
    let r = record_on(&w, &node).unwrap();
    assert!(r.reasons.iter().all(|r| r.done), "{r:?}");
    assert_eq!(
        scalein::sources::hook_scan::resume(&w.engine, &w.provider).await,
        0,
        "nothing to resume"
    );
    assert!(!w.engine.is_draining(&iid));
    let n = w.sim.get::<Node>("", &node).unwrap();
    assert_eq!(
        n["spec"]["unschedulable"], true,
        "it stays cordoned for AWS"
    );
}

/// The hook list is never stale: a hook deleted after the last refresh (or an ASG
/// recreated under the same name without it) must not end an instance undrained. CA's
/// DeleteNodes finds the hook gone and drains the node first (direct mode).
#[tokio::test]
async fn a_deleted_hook_does_not_end_an_instance_undrained() {
    let (mut w, node, iid) = guarded_on_a_hooked_node(300).await;
    w.cloud.delete_hook("web");
    delete_nodes(&mut w, "web", &[(node.clone(), iid.clone())]).await;
    eventually("the PDB refuses the eviction", 10, || blocked(&w)).await;
    assert_eq!(
        w.cloud.calls().get("terminate_instance"),
        None,
        "not terminated through a hook that is gone"
    );
    assert!(running(&w, "app"));
    let r = record_on(&w, &node).expect("the drain is recorded on the Node");
    assert!(r.has_scale_in(), "{r:?}");
    assert!(w.sim.remove::<PodDisruptionBudget>("shop", "app-pdb"));
    assert_eq!(w.engine.wait_for(&iid).await, Some(Outcome::Ended));
    assert_eq!(w.cloud.calls().get("terminate_instance"), Some(&1));
}

/// The hook deleted while AWS's reads still show it (DescribeLifecycleHooks is
/// eventually consistent): CA's DeleteNodes takes the hooked path and terminates, and
/// nothing holds the instance. The service cannot tell this from AWS's answers. What it
/// can do: not keep a drain in flight, and a drain slot taken, for an action that will
/// never come. Before, the completion's "hook not found" was retried forever (5 s,
/// 10 s, 20 s ... 60 s), and the heartbeats too, while the instance was long gone
/// (all_sources_model, `[AwsStale(3), HookRemoved, CaScaleIn(0)]`).
#[tokio::test]
async fn a_hook_deleted_behind_a_stale_read_leaves_no_drain_in_flight() {
    let mut w = World::builder().groups(hooked(1, 300)).build().await;
    let (node, iid) = nodes_of(&w, "web").remove(0);
    w.put(&fixtures::pod("shop", "app", &node, "app", 0.1));
    pods_ready(&w, 1).await;
    // Every read of the scale-in (the group, its hooks, the instance) answers from
    // before the deletion.
    w.cloud.stale_reads(20);
    w.cloud.delete_hook("web");
    delete_nodes(&mut w, "web", &[(node.clone(), iid.clone())]).await;
    assert_eq!(
        w.cloud.calls().get("terminate_instance"),
        Some(&1),
        "the stale answer showed the hook: the hooked path terminates first"
    );
    w.cloud.stale_reads(0);
    assert_eq!(
        tokio::time::timeout(Duration::from_secs(10), w.engine.wait_for(&iid))
            .await
            .expect("the drain still in flight 10 s after AWS ended the instance"),
        Some(Outcome::Ended)
    );
    assert!(!w.engine.is_draining(&iid));
    assert!(
        !w.engine.holds_hook(&iid),
        "heartbeats go on for an action that is gone"
    );
}

/// `createLifecycleHook` puts the hook once, not on every poll until the hook list is
/// re-read (30 minutes by default).
#[tokio::test]
async fn a_created_hook_is_put_once() {
    let settings = ScaleInSettings {
        create_hook: true,
        ..fast_settings()
    };
    let w = World::builder().web(3, 1).settings(settings).build().await;
    for _ in 0..3 {
        scalein::sources::hook_scan::scan(&w.engine, &w.provider).await;
        w.provider.refresh_now().await.unwrap();
    }
    assert_eq!(w.cloud.calls().get("put_terminating_hook"), Some(&1));
    let reg = w.provider.registry();
    assert!(w.engine.our_hook(reg.group("web").unwrap()).is_some());
    // Issue 62: the group records that this service created the hook (what
    // `remove-hooks` removes at uninstall), once, with the hook.
    assert_eq!(w.cloud.calls().get("tag_group"), Some(&1));
    let web = reg.group("web").unwrap();
    assert!(
        ca_asg_provider::scalein::decide::hooks::hook_recorded(
            &web.asg.tags,
            "ca-asg-provider-drain"
        ),
        "{:?}",
        web.asg.tags
    );
}

/// Issue 69 (suspected, proven): the group's record that this service created its
/// hook was written before PutLifecycleHook and left when that call failed, so a
/// hook of the same name put later by hand was taken for ours and removed at
/// uninstall. A hook that was not created leaves no record; the next poll records and
/// puts it.
#[tokio::test]
async fn a_hook_that_could_not_be_put_leaves_no_record() {
    use ca_asg_provider::scalein::decide::hooks::hook_recorded;
    let settings = ScaleInSettings {
        create_hook: true,
        ..fast_settings()
    };
    let w = World::builder().web(3, 1).settings(settings).build().await;
    let recorded = async || {
        use ca_asg_provider::cloud::Cloud;
        let web = ca_asg_provider::cloud::GroupSelector {
            names: vec!["web".into()],
            tag_sets: Vec::new(),
        };
        let groups = w.cloud.describe_groups(&web).await.unwrap();
        hook_recorded(&groups[0].tags, "ca-asg-provider-drain")
    };
    w.cloud.refuse("put_terminating_hook", "AccessDenied", 1);
    scalein::sources::hook_scan::scan(&w.engine, &w.provider).await;
    assert_eq!(w.cloud.calls().get("put_terminating_hook"), Some(&1));
    assert!(!recorded().await, "no hook, no record of one");
    w.provider.refresh_now().await.unwrap();
    scalein::sources::hook_scan::scan(&w.engine, &w.provider).await;
    assert_eq!(w.cloud.calls().get("put_terminating_hook"), Some(&2));
    assert!(recorded().await, "put the second time, and recorded");
}

/// Issue 39, 6: the replica that leads the drains may not be the one CA calls, so no
/// Refresh reaches it. A hook it creates is known at once (not put again on every
/// poll: 16 times in 75 s before), and its picture of AWS is read again on its own
/// timer.
#[tokio::test]
async fn a_replica_ca_does_not_call_keeps_its_picture_fresh_and_puts_its_hook_once() {
    let settings = ScaleInSettings {
        create_hook: true,
        ..fast_settings()
    };
    let w = World::builder().web(3, 2).settings(settings).build().await;
    for _ in 0..4 {
        scalein::sources::hook_scan::scan(&w.engine, &w.provider).await;
    }
    assert_eq!(w.cloud.calls().get("put_terminating_hook"), Some(&1));
    // AWS changes (the ASG scales in by itself); nobody calls Refresh.
    let _fresh = w.provider.spawn_keep_fresh(|| true);
    let ended = w.cloud.external_scale_in("web", 1).unwrap();
    eventually(
        "the snapshot shows the instance leaving, with no Refresh from CA",
        10,
        || {
            w.provider.registry().group("web").is_some_and(|g| {
                g.asg
                    .instances
                    .iter()
                    .any(|i| i.id == ended[0] && i.state.is_leaving())
            })
        },
    )
    .await;
}

/// CA left at `--daemonset-eviction-for-occupied-nodes=true` evicted the log shipper
/// before DeleteNodes, which reached a follower: the leader's resumed drain still says
/// so (CA's taint on the Node tells a CA scale-in whichever replica CA asked).
#[tokio::test]
async fn a_daemonset_ca_evicted_early_is_reported_when_the_drain_reached_a_follower() {
    let mut w = World::builder().web(3, 1).build().await;
    let (node, iid) = nodes_of(&w, "web").remove(0);
    w.put(&fixtures::daemonset("logging", "fluentd", 5.0, false));
    w.put(&fixtures::pod("shop", "app", &node, "app", 0.3));
    pods_ready(&w, 2).await;
    // What CA does before DeleteNodes: its taint, and (with the flag left at true) the
    // DaemonSet pod evicted with the workloads.
    let nodes: kube::Api<Node> = kube::Api::all(w.sim.client());
    nodes
        .patch(
            &node,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({"spec": {"taints": [
                {"key": "ToBeDeletedByClusterAutoscaler", "value": "1", "effect": "NoSchedule"}
            ]}})),
        )
        .await
        .unwrap();
    let pods: kube::Api<Pod> = kube::Api::namespaced(w.sim.client(), "logging");
    let fluentd = w
        .sim
        .list::<Pod>()
        .iter()
        .find_map(|p| {
            p["metadata"]["name"]
                .as_str()
                .filter(|n| n.starts_with("fluentd"))
                .map(str::to_string)
        })
        .unwrap();
    pods.delete(&fluentd, &Default::default()).await.unwrap();

    // DeleteNodes reaches a follower: it marks the Node, the leader drains.
    let (_lease, follower) = tokio::sync::watch::channel(false);
    w.engine.leadership.follow(follower);
    delete_nodes(&mut w, "web", &[(node.clone(), iid.clone())]).await;
    assert!(!w.engine.is_draining(&iid));
    let (provider, engine, _ca) = service(&w.sim, &w.cloud, &w.groups, fast_settings()).await;
    let lifecycle = scalein::sources::hook_scan::spawn_loop(engine.clone(), provider.clone());
    eventually(
        "the leader says CA evicted the DaemonSet pod early",
        10,
        || {
            events(&w.sim)
                .iter()
                .any(|(r, n)| r == "DaemonSetEvictedEarly" && n.contains("fluentd"))
        },
    )
    .await;
    lifecycle.abort();
    engine.shutdown();
}

/// EC2 reclaims a spot instance that CA's direct scale-in is draining (held by a PDB).
/// Nobody decremented, so AWS's desired capacity still holds the slot: the drain gives
/// it up while nothing refilled it (no replacement CA did not ask for). If the ASG
/// already launched a replacement, the slot stays (lowering desired capacity then
/// would make the ASG pick a victim), and CA sees the replacement as a new node.
#[tokio::test]
async fn a_spot_instance_ec2_reclaims_mid_drain_is_not_replaced_behind_cas_back() {
    for (replace_after, gives_up) in [(Duration::from_secs(4), true), (Duration::ZERO, false)] {
        let mut w = World::builder().web(3, 2).build().await;
        let (node, iid) = nodes_of(&w, "web")[1].clone();
        guarded_app(&w, &node, "app").await;
        delete_nodes(&mut w, "web", &[(node.clone(), iid.clone())]).await;
        assert_eq!(target(&mut w, "web").await, 1);
        eventually("the PDB refuses the eviction", 10, || blocked(&w)).await;
        w.cloud.reclaim(&iid, replace_after);
        if !gives_up {
            eventually("the ASG launched a replacement", 10, || {
                nodes_of(&w, "web").len() == 2
            })
            .await;
        }
        assert!(w.sim.remove::<PodDisruptionBudget>("shop", "app-pdb"));
        let out = w.engine.wait_for(&iid).await;
        assert_eq!(out, Some(Outcome::Ended), "replace_after {replace_after:?}");
        assert!(
            w.cloud.chosen_by_asg().is_empty(),
            "no victim picked by the ASG"
        );
        if gives_up {
            assert_eq!(
                w.cloud.desired("web"),
                Some(1),
                "the reclaimed slot is given up"
            );
            tokio::time::sleep(replace_after + Duration::from_millis(300)).await;
            assert_eq!(
                nodes_of(&w, "web").len(),
                1,
                "no replacement CA did not ask for"
            );
            w.provider.refresh_now().await.unwrap();
            assert_eq!(
                target(&mut w, "web").await,
                1,
                "CA's target is what CA asked for"
            );
        } else {
            assert_eq!(
                w.cloud.desired("web"),
                Some(2),
                "the replacement keeps its slot"
            );
            assert_eq!(nodes_of(&w, "web").len(), 2);
        }
    }
}

/// The max size NodeGroups tells CA for `group`.
async fn max_size(w: &mut World, group: &str) -> i32 {
    w.ca.node_groups(ca_asg_provider::proto::NodeGroupsRequest {})
        .await
        .unwrap()
        .into_inner()
        .node_groups
        .into_iter()
        .find(|g| g.id == group)
        .unwrap()
        .max_size
}

/// Asking CA only for what can be given: while a direct-mode drain holds its slot in
/// AWS's desired capacity, NodeGroups reports MaxSize less that slot, so CA never asks
/// for an increase that would be refused (and back the group off for minutes).
#[tokio::test]
async fn the_max_ca_is_told_leaves_out_slots_drains_still_hold() {
    let mut w = World::builder().web(3, 3).build().await;
    assert_eq!(max_size(&mut w, "web").await, 3);
    let (node, iid) = nodes_of(&w, "web").remove(0);
    guarded_app(&w, &node, "app").await;
    delete_nodes(&mut w, "web", &[(node, iid.clone())]).await;
    eventually("the PDB refuses the eviction", 10, || blocked(&w)).await;
    assert_eq!(
        max_size(&mut w, "web").await,
        2,
        "one slot is the drain's until its instance ends"
    );
    assert_eq!(target(&mut w, "web").await, 2);
    // What CA would ask with the old max: refused, as the max it is now told says.
    let refused =
        w.ca.node_group_increase_size(ca_asg_provider::proto::NodeGroupIncreaseSizeRequest {
            id: "web".into(),
            delta: 1,
        })
        .await;
    assert!(refused.is_err());
    assert!(w.sim.remove::<PodDisruptionBudget>("shop", "app-pdb"));
    assert_eq!(w.engine.wait_for(&iid).await, Some(Outcome::Ended));
    w.provider.refresh_now().await.unwrap();
    assert_eq!(max_size(&mut w, "web").await, 3, "the slot is free again");
}

/// Issue 30, 4: a record read back from the Node with a DaemonSet share nobody could
/// have configured (1e19 s; a newer version, a hand edit) and a spent budget. Once
/// panicked the drain ("overflow when adding duration to instant"); it is bounded
/// where it is read, and the resumed drain ends.
#[tokio::test]
async fn a_share_read_back_from_the_node_does_not_panic_the_drain() {
    let w = World::builder().web(3, 1).build().await;
    let (node, iid) = node_with_fluentd_and_app(&w, 0.1).await;
    let now = chrono::Utc::now();
    let spent = (now - chrono::Duration::seconds(10)).to_rfc3339();
    let json = format!(
        r#"{{"reasons":[{{"kind":"notice","notice":"spot_interruption","ends_at":"{spent}","daemonset_share_secs":10000000000000000000,"at":"{}"}}]}}"#,
        now.to_rfc3339()
    );
    put_drain_record(&w, &node, &json, now, "interruption").await;
    // Resumed once the engine's Node cache has the record.
    let mut resumed = 0;
    for _ in 0..100 {
        resumed = scalein::sources::hook_scan::resume(&w.engine, &w.provider).await;
        if resumed > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(resumed, 1);
    assert_eq!(
        w.engine.wait_for(&iid).await,
        Some(Outcome::Drained),
        "the drain ends, never panics"
    );
    assert!(!running(&w, "app"), "the spent budget went on");
}

/// The ASG's lifecycle notification for `iid` under `hook`, as EventBridge sends it.
fn lifecycle_note(iid: &str, hook: &str) -> String {
    lifecycle_note_at(iid, hook, chrono::Utc::now())
}

/// [`lifecycle_note`] sent at `at`.
fn lifecycle_note_at(iid: &str, hook: &str, at: chrono::DateTime<chrono::Utc>) -> String {
    support::notices::lifecycle_at("web", iid, hook, Some("tok-1"), at)
}

/// The hook's heartbeat timeout is now `secs` (the provider's list, re-read every
/// half hour, still says what it was).
async fn set_hook_timeout(w: &World, secs: i32) {
    use ca_asg_provider::cloud::{Cloud, LifecycleHook};
    w.cloud
        .put_terminating_hook(
            "web",
            &LifecycleHook {
                name: HOOK.into(),
                heartbeat_timeout_secs: secs,
                default_result: "ABANDON".into(),
            },
        )
        .await
        .unwrap();
}

/// Issue 30, 2: the hook's heartbeat timeout went from 300 s to 3 s since the
/// provider read it. A lifecycle action from the queue is heartbeated at the hook's
/// current timeout, read when the hold starts: the drain (a PDB holds it) outlives
/// several timeouts and the ASG never ends the instance undrained.
#[tokio::test]
async fn a_lifecycle_action_from_the_queue_heartbeats_at_the_hooks_current_timeout() {
    let (w, _, iid) = guarded_on_a_hooked_node(300).await;
    set_hook_timeout(&w, 3).await;
    asg_ends(&w, &iid);
    let (q, c) = queue_and_consumer(&w, RebalanceAction::Cordon);
    q.send(&lifecycle_note(&iid, HOOK));
    assert_eq!(
        handle_next(&c, &q).await,
        Handled::Done(vec!["lifecycle_drain"])
    );
    eventually("the PDB refuses the eviction", 10, || blocked(&w)).await;
    // Longer than the hook's timeout: only heartbeats at its pace keep the instance.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(
        w.cloud.hook_timeouts().is_empty(),
        "the hook never timed out"
    );
    assert!(running(&w, "app"), "the PDB still holds");
    assert!(w.sim.remove::<PodDisruptionBudget>("shop", "app-pdb"));
    assert_eq!(w.engine.wait_for(&iid).await, Some(Outcome::Ended));
    assert!(w.cloud.hook_timeouts().is_empty());
}

/// Issue 30, 2: the hook's timeout changes while the instance is held (300 s to 3 s):
/// the next scan corrects the hold and the heartbeats follow the new pace at once.
#[tokio::test]
async fn a_changed_hook_timeout_reschedules_the_heartbeats_of_a_held_instance() {
    let (w, _, iid) = guarded_on_a_hooked_node(300).await;
    let lifecycle = scalein::sources::hook_scan::spawn_loop(w.engine.clone(), w.provider.clone());
    asg_ends(&w, &iid);
    eventually("the PDB refuses the eviction", 10, || blocked(&w)).await;
    let beats = || {
        w.cloud
            .heartbeats()
            .iter()
            .filter(|a| a.instance_id == iid)
            .count()
    };
    let before = beats();
    assert!(before >= 1);
    set_hook_timeout(&w, 3).await;
    eventually("heartbeats at the new pace", 10, || beats() >= before + 3).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(
        w.cloud.hook_timeouts().is_empty(),
        "the hook never timed out"
    );
    assert!(running(&w, "app"));
    lift_budget_until_completed(&w).await;
    lifecycle.abort();
    assert!(w.cloud.hook_timeouts().is_empty());
}

/// Issue 30, 5: a replayed or forged lifecycle message for an instance in service
/// (nobody is ending it) is dropped: no drain, no cordon, no heartbeat of an action
/// that does not exist. One sent within the last minute is left for redelivery
/// (AWS's reads may lag it: see
/// a_lifecycle_message_read_before_aws_shows_the_hold_is_not_lost), and drains
/// nothing either.
#[tokio::test]
async fn a_lifecycle_message_for_an_instance_nobody_ends_is_dropped() {
    let (w, node, iid) = guarded_on_a_hooked_node(300).await;
    let (q, c) = queue_and_consumer(&w, RebalanceAction::Cordon);
    q.send(&lifecycle_note(&iid, HOOK));
    assert!(matches!(handle_next(&c, &q).await, Handled::Retry(_)));
    assert!(!w.engine.is_draining(&iid));
    q.redeliver();
    assert_eq!(handle_all(&c, &q).await.len(), 1);
    let ten_minutes_ago = chrono::Utc::now() - chrono::Duration::minutes(10);
    q.send(&lifecycle_note_at(&iid, HOOK, ten_minutes_ago));
    assert_eq!(handle_next(&c, &q).await, Handled::Done(vec!["not_held"]));
    assert_eq!(q.pending(), 1, "the old one dropped; the fresh one waits");
    assert!(!w.engine.is_draining(&iid));
    assert!(!w.engine.holds_hook(&iid));
    let n = w.sim.get::<Node>("", &node).unwrap();
    assert_ne!(n["spec"]["unschedulable"], true, "not cordoned");
    assert!(record_on(&w, &node).is_none());
    assert!(running(&w, "app"));
    assert!(w.cloud.heartbeats().is_empty());
    // An instance of another group, or one that is gone, likewise (at once).
    q.send(&lifecycle_note("i-0123456789abcdef0", HOOK));
    assert_eq!(handle_next(&c, &q).await, Handled::Done(vec!["not_held"]));
}

/// A scheduled change of the same kind with an earlier start, within the 15 minutes
/// duplicates are remembered (AWS moved the retirement forward): it is news, not a
/// duplicate. It is recorded on the Node and joins the drain, whose budget now ends
/// at the earlier start; the same message again is still a duplicate.
#[tokio::test]
async fn a_scheduled_change_moved_earlier_is_not_taken_for_a_duplicate() {
    let (w, node, iid) = guarded_on_a_hooked_node(300).await;
    let (q, c) = queue_and_consumer(&w, RebalanceAction::Cordon);
    let retirement = |start| support::notices::retirement_at(&iid, start);
    let ends = |w: &World| {
        record_on(w, &node).and_then(|r| {
            r.reasons.iter().find_map(|r| match &r.why {
                record::Why::Notice { ends_at, .. } => *ends_at,
                _ => None,
            })
        })
    };
    let now = chrono::Utc::now();
    let (far, near) = (
        now + chrono::Duration::days(2),
        now + chrono::Duration::hours(3),
    );
    q.send(&retirement(far));
    assert_eq!(handle_next(&c, &q).await, Handled::Done(vec!["drain"]));
    eventually("the PDB holds the drain", 10, || blocked(&w)).await;
    let first = ends(&w).expect("the notice is recorded");
    assert_eq!(first.timestamp(), far.timestamp());

    q.send(&retirement(near));
    assert_eq!(handle_next(&c, &q).await, Handled::Done(vec!["joined"]));
    let moved = ends(&w).expect("still recorded");
    assert_eq!(
        moved.timestamp(),
        near.timestamp(),
        "the earlier start counts"
    );
    assert!(w.engine.is_draining(&iid));

    q.send(&retirement(near));
    assert_eq!(handle_next(&c, &q).await, Handled::Done(vec!["duplicate"]));
    w.engine.shutdown();
}

/// A replica that loses the Lease stops its drains at once, whatever its lifecycle
/// loop is doing (here it runs none, as when a scan hangs on a slow AWS call): no
/// more evictions, deadlines or uncordons beside the new leader. The Node keeps its
/// cordon and marks for the leader to resume.
#[tokio::test]
async fn a_replica_that_loses_the_lease_stops_its_drains_at_once() {
    let mut w = World::builder().web(3, 2).build().await;
    let (node, iid) = nodes_of(&w, "web")[1].clone();
    guarded_app(&w, &node, "app").await;
    let (lease, leads) = tokio::sync::watch::channel(true);
    w.engine.leadership.follow(leads);
    delete_nodes(&mut w, "web", &[(node.clone(), iid.clone())]).await;
    eventually("the PDB holds the drain", 10, || blocked(&w)).await;
    assert!(w.engine.is_draining(&iid));

    lease.send_replace(false);
    eventually("the drain stops when the Lease is lost", 5, || {
        !w.engine.is_draining(&iid)
    })
    .await;
    let n = w.sim.get::<Node>("", &node).unwrap();
    assert_eq!(
        n["spec"]["unschedulable"], true,
        "left cordoned for the leader"
    );
    assert!(record_on(&w, &node).is_some_and(|r| r.has_scale_in()));
    assert!(running(&w, "app"));
    w.engine.shutdown();
}

/// A direct-mode drain stopped while TerminateInstanceInAutoScalingGroup is in flight
/// (AWS took the decrement, the answer is still on its way), then resumed while EC2
/// reclaims another instance of the group: the call and its note go on behind the
/// stopped drain, and the resumed drain waits for them. Before, the note was lost
/// and the resumed drain took the instance for one ended elsewhere and gave up a
/// slot again: the reclaimed instance's, which the ASG then never replaced.
#[tokio::test]
async fn a_drain_stopped_mid_termination_lowers_the_desired_capacity_once() {
    let mut w = World::builder().web(4, 3).build().await;
    let web = nodes_of(&w, "web");
    let ((node, iid), (_, reclaimed)) = (web[0].clone(), web[1].clone());
    w.cloud.slow_answers(Duration::from_secs(2));
    delete_nodes(&mut w, "web", &[(node.clone(), iid.clone())]).await;
    eventually("AWS took the termination", 10, || {
        w.cloud.desired("web") == Some(2)
    })
    .await;
    assert!(w.engine.is_draining(&iid), "the answer is still on its way");
    w.engine.abort_all();
    w.cloud.reclaim(&reclaimed, Duration::from_secs(600));
    w.engine.start(scalein::DrainRequest {
        instance_id: iid.clone(),
        group: "web".into(),
        node_name: Some(node),
        mode: scalein::Mode::Direct,
        source: scalein::Source::Resume,
        reasons: Vec::new(),
        noticed: None,
    });
    assert_eq!(w.engine.wait_for(&iid).await, Some(Outcome::Ended));
    assert_eq!(
        w.cloud.desired("web"),
        Some(2),
        "lowered once, for the instance CA removed; the reclaimed instance's slot stays"
    );
    w.engine.shutdown();
}

/// A lifecycle message whose LifecycleActionToken is not the action's (forged, or
/// corrupted on its way) for an instance our hook holds, arriving while no drain of
/// it runs (after a restart, before the scan): AWS refuses that token, so the drain
/// acts by instance id, as the scan does, and the hook never times out. Before, the
/// forged token was heartbeated, every heartbeat was refused, and the hook's timeout
/// ended the instance with its budget-held pod still running.
#[tokio::test]
async fn a_lifecycle_message_with_a_wrong_token_does_not_cost_the_hook() {
    let w = World::builder().groups(hooked(1, 3)).build().await;
    w.cloud.check_tokens(true);
    let (node, iid) = nodes_of(&w, "web").remove(0);
    guarded_app(&w, &node, "app").await;
    w.cloud.external_scale_in("web", 1).unwrap();
    let (q, c) = queue_and_consumer(&w, RebalanceAction::Cordon);
    q.send(&lifecycle_note(&iid, HOOK));
    assert_eq!(
        handle_next(&c, &q).await,
        Handled::Done(vec!["lifecycle_drain"])
    );
    assert!(w.engine.holds_hook(&iid));
    // Past the hook's timeout: still held, heartbeated, the pod still there.
    tokio::time::sleep(Duration::from_millis(4000)).await;
    assert_eq!(w.cloud.hook_timeouts(), Vec::<String>::new());
    assert!(!w.cloud.heartbeats().is_empty());
    assert!(w.cloud.pending_hooks(&iid).contains(&HOOK.to_string()));
    assert!(running(&w, "app"));
    w.engine.shutdown();
}

/// EC2's state-change notice for `iid`, now in `state`.
fn state_change(iid: &str, state: &str) -> String {
    support::notices::eventbridge(
        "EC2 Instance State-change Notification",
        "aws.ec2",
        serde_json::json!({"instance-id": iid, "state": state}),
    )
}

/// Issue 39 (suspected item, proven): a spot warning's drain is held by a budget;
/// then EC2 says the instance is stopping. The drain stops, as nothing is left to
/// protect. Before, the notice stayed active on the Node's record and the next poll
/// (every 200 ms here, 5 s by default) resumed the drain the notice had stopped: it
/// went on asking for evictions of pods on a stopped instance. Now the notice is
/// recorded done with the stop, and stays done however many polls follow (CA's
/// scale-in and our hook stay active: record::tests::a_stopped_instance_closes_only_the_reasons_that_leave_it_to_aws).
#[tokio::test]
async fn a_stop_notice_is_not_undone_by_the_next_poll() {
    let w = World::builder().web(3, 2).build().await;
    let (node, iid) = nodes_of(&w, "web").remove(0);
    guarded_app(&w, &node, "app").await;
    let lifecycle = scalein::sources::hook_scan::spawn_loop(w.engine.clone(), w.provider.clone());
    let (q, c) = queue_and_consumer(&w, RebalanceAction::Cordon);
    q.send(&spot(&iid));
    assert_eq!(handle_next(&c, &q).await, Handled::Done(vec!["drain"]));
    eventually("the PDB holds the drain", 10, || blocked(&w)).await;
    assert!(w.engine.is_draining(&iid));

    q.send(&state_change(&iid, "stopping"));
    assert_eq!(handle_next(&c, &q).await, Handled::Done(vec!["stopped"]));
    assert!(!w.engine.is_draining(&iid));
    let asked = || {
        w.sim
            .audit()
            .iter()
            .filter(|e| e.name == "app" && e.verb.starts_with("evict"))
            .count()
    };
    let before = asked();
    // Many polls.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        !w.engine.is_draining(&iid),
        "the next poll resumed the stopped drain"
    );
    assert_eq!(asked(), before, "evictions asked for after the stop");
    assert_eq!(
        w.engine
            .tools
            .stats
            .started
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    let r = record_on(&w, &node).expect("the record stays on the Node");
    assert!(!r.plan(w.engine.limits()).drains, "{r:?}");
    assert!(running(&w, "app"), "the budget was never gone around");
    // A second stop notice (EC2 sends stopping, then stopped) changes nothing.
    q.send(&state_change(&iid, "stopped"));
    assert_eq!(handle_next(&c, &q).await, Handled::Done(vec!["ignored"]));
    lifecycle.abort();
    w.engine.shutdown();
}

/// One web node of `hooked(2, 4)` running the pod `app`, the lifecycle loop scanning
/// every five minutes (queue mode: the scan is only a safety net), its first scan
/// done; the node's instance, and the loop.
async fn one_app_queue_mode(
    hook_heartbeat_timeout: Duration,
) -> (World, String, tokio::task::JoinHandle<()>) {
    // A 4 s hook is held at most 400 s; with a five-minute poll (the margin for when a
    // hold began) and the default two-minute DaemonSet phase it would leave the
    // workloads no room (issue 72: the app, its grace 30 s, would be deleted at once,
    // not evicted). A one-second DaemonSet phase (there is no DaemonSet pod here)
    // leaves them 38 s: the app is evicted well before 38 s less its grace.
    let s = ScaleInSettings {
        lifecycle_poll_interval: Duration::from_secs(300),
        hook_heartbeat_timeout,
        daemonset_deadline: Duration::from_secs(1),
        ..fast_settings()
    };
    let w = World::builder()
        .groups(hooked(2, 4))
        .settings(s)
        .build()
        .await;
    let (node, iid) = nodes_of(&w, "web").pop().unwrap();
    w.put(&fixtures::pod("shop", "app", &node, "app", 0.1));
    pods_ready(&w, 1).await;
    let lifecycle = scalein::sources::hook_scan::spawn_loop(w.engine.clone(), w.provider.clone());
    tokio::time::sleep(Duration::from_millis(500)).await;
    (w, iid, lifecycle)
}

/// Our hook's action for `iid` completes, no hook ran out, and `app` was evicted.
async fn drained_and_completed(w: &World, iid: &str) {
    eventually("the lifecycle action is completed", 15, || {
        w.cloud
            .completed_actions()
            .iter()
            .any(|(a, _)| a.instance_id == iid && a.hook == HOOK)
    })
    .await;
    assert!(w.cloud.hook_timeouts().is_empty(), "the hook ran out");
    assert!(
        w.sim
            .audit()
            .iter()
            .any(|e| e.verb == "evicted" && e.name == "app"),
        "the app was drained"
    );
}

/// AWS's reads lag its notification (the instance still in service, our hook not
/// in the list yet): the action itself answers a heartbeat, so the message is taken
/// at once, with no redelivery and no scan (every five minutes here), and the hold
/// is heartbeated, drained and completed. Before, the message waited for the scan,
/// which does not look at a group whose hook it has not seen: the hook timed out.
#[tokio::test]
async fn a_lifecycle_message_is_taken_on_the_actions_word_when_aws_reads_lag() {
    let (w, iid, lifecycle) = one_app_queue_mode(Duration::from_secs(4)).await;
    // The hook was away when this process last read the group, and is back (an
    // operator added it by hand); AWS's next reads still answer from before: no
    // hook, the instance in service.
    w.cloud.delete_hook("web");
    w.provider.note_hooks("web", Vec::new());
    w.cloud.stale_reads(3);
    w.cloud.add_hook(
        "web",
        LifecycleHook {
            name: HOOK.into(),
            heartbeat_timeout_secs: 4,
            default_result: "ABANDON".into(),
        },
    );
    asg_ends(&w, &iid);
    let (q, c) = queue_and_consumer(&w, RebalanceAction::Cordon);
    q.send(&lifecycle_note(&iid, HOOK));
    let out = handle_next(&c, &q).await;
    assert!(matches!(out, Handled::Done(_)), "{out:?}");
    drained_and_completed(&w, &iid).await;
    lifecycle.abort();
    w.engine.shutdown();
}

/// Issue 39 (suspected item, proven): in queue mode the lifecycle scan is a safety
/// net every five minutes. AWS's lifecycle message arrives while its own reads still
/// show the instance in service (they lag the notification). Before, the message
/// was dropped as a replay, and the hook (here 4 s) ran out with nothing drained:
/// the ASG ended the instance under its pods. Now the message is left for
/// redelivery and the scan looks every second for a minute: the hold is found,
/// heartbeated, drained and completed. (The action itself is asked first, with a
/// heartbeat: throttled here, so only the scan can find the hold.)
#[tokio::test]
async fn a_lifecycle_message_read_before_aws_shows_the_hold_is_not_lost() {
    let (w, iid, lifecycle) =
        one_app_queue_mode(ScaleInSettings::default().hook_heartbeat_timeout).await;
    w.cloud.stale_reads(1);
    asg_ends(&w, &iid);
    let (q, c) = queue_and_consumer(&w, RebalanceAction::Cordon);
    w.cloud.throttle("lifecycle_heartbeat", 1);
    q.send(&lifecycle_note(&iid, HOOK));
    assert!(
        matches!(handle_next(&c, &q).await, Handled::Retry(_)),
        "dropped while AWS's read lagged"
    );
    drained_and_completed(&w, &iid).await;
    // Redelivered: the hold is known, nothing starts again.
    q.redeliver();
    let again = handle_all(&c, &q).await;
    assert_eq!(again.len(), 1);
    assert!(
        matches!(&again[0], Handled::Done(o) if o == &vec!["duplicate"])
            || matches!(&again[0], Handled::Done(o) if o == &vec!["not_held"]),
        "{again:?}"
    );
    assert_eq!(
        w.engine
            .tools
            .stats
            .started
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    lifecycle.abort();
    w.engine.shutdown();
}

/// Writes on `node` the record an earlier process leaves when it completed our hook's
/// action five minutes ago, and waits until the engine's Node cache has it.
async fn record_a_finished_action(w: &World, node: &str) {
    use kube::api::{Api, Patch, PatchParams};
    let mut finished = record::DrainReason::new(
        record::Why::Lifecycle {
            hook: HOOK.into(),
            by_ca: false,
        },
        chrono::Utc::now() - chrono::Duration::minutes(5),
    );
    finished.done = true;
    let rec = record::DrainRecord {
        reasons: vec![finished],
        ..Default::default()
    };
    let nodes: Api<Node> = Api::all(w.sim.client());
    let patch = serde_json::json!({"metadata": {"annotations": {
        record::ANNOTATION: rec.to_json(),
        record::GROUP_ANNOTATION: "web",
    }}});
    nodes
        .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    eventually("the engine's Node cache has the record", 10, || {
        w.engine.cached_record(node).is_some()
    })
    .await;
}

/// The drain a restarted process resumes for our hook's hold on `iid`, from what
/// the Node says (no reason of its own).
async fn resume_lifecycle_drain(w: &World, node: &str, iid: &str) {
    let action = ca_asg_provider::cloud::LifecycleAction {
        group: "web".into(),
        hook: HOOK.into(),
        instance_id: iid.to_string(),
        token: None,
    };
    w.engine.start(scalein::DrainRequest {
        instance_id: iid.to_string(),
        group: "web".into(),
        node_name: Some(node.to_string()),
        mode: scalein::Mode::Lifecycle {
            action,
            heartbeat_timeout: Duration::from_secs(30),
        },
        source: scalein::Source::Resume,
        reasons: Vec::new(),
        noticed: None,
    });
    w.engine.wait_for(iid).await;
}

/// Issue 60: a drain that finds, on the Node's record alone, our hook's action on the
/// instance completed before (an earlier process wrote it) asks AWS before it lets
/// the hold go. Here the record is older than the action that holds the instance now:
/// AWS takes the heartbeat, so the stale record is closed and nothing remembers the
/// action as finished (before, the drain believed the record and taught it to the
/// process's memory, which then alone decided the hold while AWS could not be asked);
/// the lifecycle scan drains the hold as the new action it is and completes it.
#[tokio::test]
async fn a_recorded_finished_action_is_confirmed_with_aws_before_the_hold_goes() {
    let w = World::builder().groups(hooked(1, 30)).build().await;
    let (node, iid) = node_with_fluentd_and_app(&w, 0.1).await;
    record_a_finished_action(&w, &node).await;
    asg_ends(&w, &iid);
    resume_lifecycle_drain(&w, &node, &iid).await;
    assert!(
        !w.engine.book.action_done(&iid),
        "a record AWS contradicts is not taken for a finished action"
    );
    assert!(
        !record_on(&w, &node).is_some_and(|r| r.lifecycle_completed(chrono::Utc::now())),
        "the stale record of the finished action is closed"
    );
    assert!(
        w.cloud.completed_actions().is_empty(),
        "nothing was completed on the record's word"
    );
    let lifecycle = scalein::sources::hook_scan::spawn_loop(w.engine.clone(), w.provider.clone());
    eventually("the new action is drained and completed", 20, || {
        !w.cloud.completed_actions().is_empty()
    })
    .await;
    assert!(
        w.sim.get::<Pod>("shop", "app").is_none(),
        "the app was drained before the action was completed"
    );
    lifecycle.abort();
    w.engine.shutdown();
}

/// The other side of the same rule: the record's finished action is confirmed (AWS
/// refuses the heartbeat: no action of ours holds the instance, another hook does), so
/// the hold is let go and remembered as finished, and nothing is drained or completed.
#[tokio::test]
async fn a_recorded_finished_action_aws_confirms_lets_the_hold_go_undrained() {
    let w = World::builder().groups(hooked(1, 30)).build().await;
    let (node, iid) = node_with_fluentd_and_app(&w, 0.1).await;
    record_a_finished_action(&w, &node).await;
    resume_lifecycle_drain(&w, &node, &iid).await;
    assert!(w.engine.book.action_done(&iid), "AWS confirmed the record");
    assert!(!w.engine.is_draining(&iid));
    assert!(
        w.sim.get::<Pod>("shop", "app").is_some(),
        "nothing was drained"
    );
    assert!(w.cloud.completed_actions().is_empty());
    w.engine.shutdown();
}

const SLOW_ANSWER_SECS: u64 = 2;

/// A direct-mode drain's TerminateInstanceInAutoScalingGroup (with decrement) in flight
/// and an IncreaseSize of the same group at the same time: an absolute
/// SetDesiredCapacity computed while the decrement is in flight (the drained instance's
/// slot still counted) would write back the slot AWS just gave up, and the ASG would
/// launch one instance more than CA asked for. The size change is written after the
/// decrement is answered and noted, so AWS's desired capacity, and CA's target as the
/// provider keeps it before any refresh, are what CA asked.
#[tokio::test]
async fn an_increase_during_a_direct_termination_adds_exactly_what_ca_asked() {
    let mut w = World::builder().web(6, 3).build().await;
    let (node, iid) = nodes_of(&w, "web").remove(0);
    assert_eq!(target(&mut w, "web").await, 3);
    guarded_app(&w, &node, "app").await;
    delete_nodes(&mut w, "web", &[(node, iid.clone())]).await;
    eventually("the PDB holds the drain", 10, || blocked(&w)).await;
    // AWS's answer to the termination comes back slower than a size change's reads
    // of the group wait for a write of this service to show.
    w.cloud.slow_answers(Duration::from_secs(SLOW_ANSWER_SECS));
    assert!(w.sim.remove::<PodDisruptionBudget>("shop", "app-pdb"));
    eventually("AWS took the termination", 10, || {
        w.cloud.desired("web") == Some(2)
    })
    .await;
    assert!(w.engine.is_draining(&iid), "its answer is still on its way");
    // CA's target is 2 now (3 less the node it deleted); it asks for one more.
    w.ca.node_group_increase_size(ca_asg_provider::proto::NodeGroupIncreaseSizeRequest {
        id: "web".into(),
        delta: 1,
    })
    .await
    .unwrap();
    assert_eq!(w.engine.wait_for(&iid).await, Some(Outcome::Ended));
    w.cloud.slow_answers(Duration::ZERO);
    assert_eq!(
        target(&mut w, "web").await,
        3,
        "CA's target as the provider keeps it, before any refresh"
    );
    w.provider.refresh_now().await.unwrap();
    assert_eq!(
        w.cloud.desired("web"),
        Some(3),
        "AWS's desired capacity is CA's target: 2 left + 1 asked"
    );
    assert_eq!(target(&mut w, "web").await, 3);
    w.engine.shutdown();
}

//! Scale-in that never ends the wrong instance: the accounting while direct drains
//! run, drains recorded before DeleteNodes answers, every waiting instance
//! heartbeated from the moment it is found, fail-closed node lookup, and only our own
//! lifecycle hook completed. Real engine, memory cloud, in-memory API server.

use std::time::Duration;

use ca_asg_provider::clock::Instant;

use ca_asg_provider::cloud::memory::MemoryGroup;
use ca_asg_provider::cloud::{Cloud, LifecycleResult, LifecycleState};
use ca_asg_provider::proto;
use ca_asg_provider::scalein::{self, stages::cordon, Outcome, ScaleInSettings};
use ca_asg_provider::sim::fixtures;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;

mod support;
use support::eventually;
use support::world::*;

fn live(w: &World, group: &str) -> usize {
    w.cloud
        .instances()
        .iter()
        .filter(|(g, i)| g == group && !i.state.is_terminating())
        .count()
}

/// Issue item 1 as reproduced, and item 2: desired 4, DeleteNodes on two nodes whose
/// drains are held by a PodDisruptionBudget, then IncreaseSize(+1).
#[tokio::test]
async fn growing_a_group_while_direct_drains_run_ends_no_instance_of_the_asgs_choosing() {
    let mut w = World::builder()
        .web(10, 4)
        .settings(ScaleInSettings {
            workload_deadline: Duration::from_secs(30),
            ..fast_settings()
        })
        .build()
        .await;
    let victims: Vec<(String, String)> = nodes_of(&w, "web").into_iter().take(2).collect();
    for (i, (node, _)) in victims.iter().enumerate() {
        w.put(&fixtures::pod(
            "shop",
            &format!("held-{i}"),
            node,
            "held",
            0.0,
        ));
    }
    w.put(&fixtures::pdb("shop", "held", 0));
    pods_ready(&w, 2).await;

    delete_nodes(&mut w, "web", &victims).await;
    // Recorded before DeleteNodes answered: cordoned, tainted, marked.
    for (node, _) in &victims {
        let n = w.sim.get::<Node>("", node).unwrap();
        assert_eq!(n["spec"]["unschedulable"], true, "{node} cordoned");
        assert_eq!(
            n["metadata"]["annotations"][cordon::MODE_ANNOTATION],
            "direct",
            "{node} marked"
        );
        assert!(n["spec"]["taints"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["key"] == cordon::TAINT_KEY));
    }
    assert_eq!(target(&mut w, "web").await, 2);

    w.ca.node_group_increase_size(proto::NodeGroupIncreaseSizeRequest {
        id: "web".into(),
        delta: 1,
    })
    .await
    .unwrap();
    assert_eq!(
        target(&mut w, "web").await,
        3,
        "CA's target is what CA asked"
    );
    assert_eq!(
        w.cloud.desired("web"),
        Some(5),
        "AWS keeps room for the two draining instances"
    );
    assert!(w.cloud.chosen_by_asg().is_empty());
    for (_, iid) in &victims {
        assert_eq!(state_of(&w.cloud, iid), Some(LifecycleState::InService));
    }

    // The budget allows the evictions now; both drains end with a decrement.
    assert!(w.sim.remove::<PodDisruptionBudget>("shop", "held-pdb"));
    for (_, iid) in &victims {
        assert_eq!(w.engine.wait_for(iid).await, Some(Outcome::Ended), "{iid}");
    }
    eventually("the new instance is in service", 10, || {
        live(&w, "web") == 3
    })
    .await;
    assert_eq!(target(&mut w, "web").await, 3);
    assert_eq!(w.cloud.desired("web"), Some(3));
    assert!(
        w.cloud.chosen_by_asg().is_empty(),
        "the ASG ended {:?} of its own choosing",
        w.cloud.chosen_by_asg()
    );
    support::rbac::assert_rbac_covers(&w.sim);
}

/// Item 2: a crash right after DeleteNodes answered loses no drain, and the new
/// process counts it against the target before anything else happens.
#[tokio::test]
async fn a_crash_right_after_delete_nodes_loses_no_drain() {
    let mut w = World::builder()
        .web(5, 3)
        .settings(ScaleInSettings {
            max_concurrent_drains: 1,
            ..fast_settings()
        })
        .build()
        .await;
    let (node, iid) = nodes_of(&w, "web").remove(0);
    w.put(&fixtures::pod("shop", "app", &node, "app", 0.2));
    delete_nodes(&mut w, "web", &[(node.clone(), iid.clone())]).await;
    // kill -9: the drain task goes before it did anything of its own.
    w.engine.abort_all();
    w.engine.shutdown();
    let (provider2, engine2, mut ca2) = service(&w.sim, &w.cloud, &w.groups, fast_settings()).await;
    let t = target_of(&mut ca2, "web").await;
    assert_eq!(t, 2, "the recorded drain counts against the target at once");
    assert_eq!(
        scalein::sources::hook_scan::resume(&engine2, &provider2).await,
        1
    );
    assert_eq!(engine2.wait_for(&iid).await, Some(Outcome::Ended));
    assert_eq!(w.cloud.calls()["terminate_instance"], 1);
    assert!(w
        .sim
        .audit()
        .iter()
        .any(|a| a.verb == "deletion-started" && a.name == "app"));
    support::rbac::assert_rbac_covers(&w.sim);
}

/// Items 0 and 3: 200 instances enter Terminating:Wait at once (an instance refresh)
/// under a 1 s hook, with 10 drain slots and a provider refresh interval of 60 s.
/// The lifecycle loop finds them at its own interval and heartbeats each one from
/// the moment it is found, not from when a slot frees: none reaches its timeout.
#[tokio::test]
async fn two_hundred_waiting_instances_are_all_heartbeated_until_drained() {
    const N: usize = 200;
    let w = World::builder()
        .group(
            MemoryGroup::new("fleet", 0, N as i32, N as i32, "m5.large")
                .terminating_hook("ca-asg-provider-drain", 1),
        )
        .settings(ScaleInSettings {
            max_concurrent_drains: 10,
            api_qps: 400.0,
            api_burst: 400,
            ..fast_settings()
        })
        .ready_delay(Duration::from_millis(20))
        .refresh_interval(Duration::from_secs(60))
        .build()
        .await;
    let nodes = nodes_of(&w, "fleet");
    for (node, _) in &nodes {
        w.put(&fixtures::pod(
            "shop",
            &format!("app-{node}"),
            node,
            "app",
            0.3,
        ));
    }
    let _loop = scalein::sources::hook_scan::spawn_loop(w.engine.clone(), w.provider.clone());
    let ended = w.cloud.external_scale_in("fleet", N as i32).unwrap();
    assert_eq!(ended.len(), N);
    let end = Instant::now() + Duration::from_secs(180);
    while w.cloud.completed_actions().len() < N {
        assert!(
            w.cloud.hook_timeouts().is_empty(),
            "hooks timed out undrained: {:?}",
            w.cloud.hook_timeouts()
        );
        assert!(
            Instant::now() < end,
            "{} of {N} completed",
            w.cloud.completed_actions().len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(w.cloud.hook_timeouts().is_empty());
    assert!(w
        .cloud
        .completed_actions()
        .iter()
        .all(|(_, r)| *r == LifecycleResult::Continue));
    let evicted = w
        .sim
        .audit()
        .iter()
        .filter(|a| a.verb == "deletion-started" && a.name.starts_with("app-"))
        .count();
    assert_eq!(
        evicted, N,
        "every node was drained before its hook completed"
    );
    let beats = w.cloud.heartbeats();
    for iid in &ended {
        assert!(
            beats.iter().any(|a| &a.instance_id == iid),
            "{iid} never heartbeated"
        );
    }
}

/// Item 4: a drain that cannot tell whether its instance has a Node (the cache does
/// not know it, the API server is down) neither completes the lifecycle action nor
/// terminates; it keeps the hook alive and drains once the API server answers.
#[tokio::test]
async fn a_drain_that_cannot_find_its_node_does_not_end_the_instance() {
    let w = World::builder()
        .web_hooked(5, 1, 1)
        .ready_delay(Duration::from_millis(20))
        .build()
        .await;
    let sim = w.sim.clone();
    let outage = tokio::spawn(async move { sim.outage(Duration::from_secs(3)).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    // While the API server is down a new instance registers its Node (the engine's
    // cache cannot see it), gets a pod, and the ASG then scales it in.
    let before: Vec<String> = w.cloud.instances().into_iter().map(|(_, i)| i.id).collect();
    w.cloud.set_desired_capacity("web", 2).await.unwrap();
    eventually("the new Node exists", 10, || {
        w.sim.list::<Node>().len() == 2
    })
    .await;
    let (node, iid) = nodes_of(&w, "web")
        .into_iter()
        .find(|(_, i)| !before.contains(i))
        .expect("the new instance");
    w.put(&fixtures::pod("shop", "late", &node, "late", 0.1));
    assert_eq!(
        w.cloud.external_scale_in("web", 1).unwrap(),
        vec![iid.clone()]
    );
    let end = Instant::now() + Duration::from_secs(10);
    while !w.engine.is_draining(&iid) {
        assert!(Instant::now() < end, "the scan never picked it up");
        scalein::sources::hook_scan::scan(&w.engine, &w.provider).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(!outage.is_finished(), "the API server is still down");
    assert!(
        w.cloud.completed_actions().is_empty(),
        "completed without knowing whether the instance had a Node"
    );
    assert_eq!(
        state_of(&w.cloud, &iid),
        Some(LifecycleState::TerminatingWait)
    );
    assert!(w.cloud.hook_timeouts().is_empty(), "heartbeats kept it");
    outage.await.unwrap().unwrap();
    assert_eq!(w.engine.wait_for(&iid).await, Some(Outcome::Ended));
    assert!(w
        .sim
        .audit()
        .iter()
        .any(|a| a.verb == "deletion-started" && a.name == "late"));
    assert_eq!(w.cloud.completed_actions().len(), 1);
}

/// Item 10: another tool's EC2_INSTANCE_TERMINATING hook (NTH's) is never completed
/// by this service; without our own hook the group drains in direct mode.
#[tokio::test]
async fn another_tools_hook_is_never_completed() {
    let mut w = World::builder()
        .group(MemoryGroup::new("web", 0, 5, 2, "m5.large").terminating_hook("nth-hook", 30))
        .ready_delay(Duration::from_millis(20))
        .build()
        .await;
    let (node, iid) = nodes_of(&w, "web").remove(0);
    delete_nodes(&mut w, "web", &[(node, iid.clone())]).await;
    assert_eq!(w.engine.wait_for(&iid).await, Some(Outcome::Ended));
    assert!(
        w.cloud.completed_actions().is_empty(),
        "completed another tool's lifecycle action: {:?}",
        w.cloud.completed_actions()
    );
    // Terminated with decrement; NTH's hook holds it for NTH.
    assert_eq!(
        state_of(&w.cloud, &iid),
        Some(LifecycleState::TerminatingWait)
    );
    assert_eq!(w.cloud.desired("web"), Some(1));
    assert_eq!(target(&mut w, "web").await, 1);
}

/// Right after TerminateInstanceInAutoScalingGroup, AWS takes a moment to move the
/// instance to Terminating:Wait: until then there is no action to heartbeat or
/// complete. A drain that finishes in that moment must neither stop its heartbeats
/// nor take the action as done, or the hook holds the drained instance until it
/// times out.
#[tokio::test]
async fn a_drain_faster_than_the_hook_still_completes_the_action() {
    let w = World::builder()
        .web_hooked(3, 2, 2)
        .ready_delay(Duration::from_millis(20))
        .refresh_interval(Duration::from_millis(100))
        .timing(ca_asg_provider::cloud::memory::MemoryTiming {
            hook_delay: Duration::from_millis(700),
            ..timing()
        })
        .build()
        .await;
    let mut w = w;
    let (node, iid) = nodes_of(&w, "web").remove(0);
    delete_nodes(&mut w, "web", &[(node, iid.clone())]).await;
    assert_eq!(state_of(&w.cloud, &iid), Some(LifecycleState::Terminating));
    assert_eq!(w.engine.wait_for(&iid).await, Some(Outcome::Ended));
    let done = w.cloud.completed_actions();
    assert_eq!(done.len(), 1, "{done:?}");
    assert_eq!(done[0].0.instance_id, iid);
    assert_eq!(done[0].1, LifecycleResult::Continue);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(w.cloud.hook_timeouts().is_empty());
}

/// docs/operations.md, "When a call is refused": the pod list of the node refused
/// for good (here an admission webhook's 403 on every list of pods). Without the
/// list nobody can tell what still runs there, so once the workload deadline and
/// the list's grace have passed the drain fails closed: nothing is evicted,
/// nothing ends, and the Node says why.
#[tokio::test]
async fn a_pod_list_refused_for_good_fails_the_drain_closed() {
    let settings = ScaleInSettings {
        workload_deadline: Duration::from_secs(1),
        ..fast_settings()
    };
    let (mut w, node, iid) = web_node_with_an_app(settings).await;
    w.sim.refuse(
        "list",
        "pods",
        u32::MAX,
        ca_asg_provider::sim::Refusal::Forbidden,
    );
    delete_nodes(&mut w, "web", &[(node.clone(), iid.clone())]).await;
    let outcome = w.engine.wait_for(&iid).await;
    assert!(
        matches!(&outcome, Some(Outcome::Failed(why)) if why.contains("could not list the pods")),
        "{outcome:?}"
    );
    assert_eq!(state_of(&w.cloud, &iid), Some(LifecycleState::InService));
    assert_eq!(w.cloud.calls().get("terminate_instance"), None);
    assert!(
        !w.sim
            .audit()
            .iter()
            .any(|a| a.kind == "Pod" && a.name == "app" && a.verb != "create" && a.verb != "ready"),
        "the app was touched without the pod list"
    );
    assert!(
        events(&w.sim)
            .iter()
            .any(|(r, n)| r == "DrainFailed" && n.contains("could not list the pods")),
        "the Node says why: {:?}",
        events(&w.sim)
    );
}

/// The same refusal for a few lists only: the drain waits for an answer (no pod is
/// evicted blind), then drains as usual and ends the instance.
#[tokio::test]
async fn a_pod_list_refused_for_a_while_holds_the_drain_until_answered() {
    let (mut w, node, iid) = web_node_with_an_app(fast_settings()).await;
    w.sim.refuse(
        "list",
        "pods",
        3,
        ca_asg_provider::sim::Refusal::Unavailable,
    );
    delete_nodes(&mut w, "web", &[(node.clone(), iid.clone())]).await;
    assert_eq!(w.engine.wait_for(&iid).await, Some(Outcome::Ended));
    assert_eq!(
        w.sim.refusals_left("list", "pods"),
        0,
        "the drain asked through the refusals"
    );
    assert_eq!(w.cloud.calls()["terminate_instance"], 1);
    assert!(w
        .sim
        .audit()
        .iter()
        .any(|e| e.kind == "Pod" && e.name == "app" && e.verb == "evicted"));
}

/// A world with two web instances, and an app pod running on the first one's Node.
async fn web_node_with_an_app(settings: ScaleInSettings) -> (World, String, String) {
    let w = World::builder()
        .web(3, 2)
        .settings(settings)
        .ready_delay(Duration::from_millis(20))
        .build()
        .await;
    let (node, iid) = nodes_of(&w, "web").remove(0);
    w.put(&fixtures::pod("shop", "app", &node, "app", 0.1));
    pods_ready(&w, 1).await;
    (w, node, iid)
}

/// Issue 39, suspected item proven: the hook named in the Node's drain record was
/// trusted over `hookName`. A record read back from the Node naming another tool's
/// hook (a hand edit, a forged annotation, or a `hookName` since changed), joined by a
/// spot warning, made the drain complete that tool's lifecycle action, ending the
/// instance under NTH's drain. Only our own hook's action is completed, by the name
/// configured now.
#[tokio::test]
async fn a_hook_named_in_the_nodes_record_is_never_completed_unless_it_is_ours() {
    use ca_asg_provider::scalein::{decide::record, DrainRequest, Mode, Source};
    let w = World::builder()
        .group(
            MemoryGroup::new("web", 0, 5, 2, "m5.large")
                .terminating_hook("ca-asg-provider-drain", 300)
                .terminating_hook("nth-hook", 300),
        )
        .ready_delay(Duration::from_millis(20))
        .build()
        .await;
    // The ASG ends an instance: both hooks hold it in Terminating:Wait.
    let before = nodes_of(&w, "web");
    let iid = w.cloud.external_scale_in("web", 1).unwrap().remove(0);
    let (node, _) = before
        .into_iter()
        .find(|(_, i)| *i == iid)
        .expect("the ended instance's Node");
    eventually("the instance held by both hooks", 10, || {
        state_of(&w.cloud, &iid) == Some(LifecycleState::TerminatingWait)
    })
    .await;
    let now = chrono::Utc::now();
    let json = format!(
        r#"{{"reasons":[{{"kind":"lifecycle","hook":"nth-hook","at":"{}"}}]}}"#,
        now.to_rfc3339()
    );
    put_drain_record(&w, &node, &json, now, cordon::LIFECYCLE_MARK).await;
    let spot = record::DrainReason::new(
        record::Why::Notice {
            notice: "spot_interruption".into(),
            ends_at: Some(now + chrono::Duration::seconds(120)),
            daemonset_share_secs: 0,
        },
        now,
    );
    w.engine.start(DrainRequest {
        instance_id: iid.clone(),
        group: "web".into(),
        node_name: Some(node),
        mode: Mode::DrainOnly,
        source: Source::Interruption,
        reasons: vec![spot],
        noticed: None,
    });
    let _ = w.engine.wait_for(&iid).await;
    let foreign: Vec<_> = w
        .cloud
        .completed_actions()
        .into_iter()
        .filter(|(a, _)| a.hook == "nth-hook")
        .collect();
    assert!(
        foreign.is_empty(),
        "completed another tool's lifecycle action: {foreign:?}"
    );
    assert!(
        w.cloud
            .completed_actions()
            .iter()
            .any(|(a, _)| a.hook == "ca-asg-provider-drain" && a.instance_id == iid),
        "our own hook's action is completed once the drain ends: {:?}",
        w.cloud.completed_actions()
    );
    assert!(
        w.cloud
            .pending_hooks(&iid)
            .contains(&"nth-hook".to_string()),
        "NTH's hook still holds the instance for NTH: {:?}",
        w.cloud.pending_hooks(&iid)
    );
}

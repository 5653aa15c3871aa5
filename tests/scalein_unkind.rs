//! The drain against a cluster as unkind as a real one: pods that tolerate the drain
//! taint and come back to the cordoned node, kubelets that die, containers that
//! never exit, finalizers, API Priority and Fairness 429s, overlapping budgets, and
//! deadlines in both modes. Each test fails on a drain that trusts a kind cluster.

use std::sync::Arc;
use std::time::Duration;

use ca_asg_provider::cloud::memory::MemoryGroup;
use ca_asg_provider::cloud::LifecycleResult;
use ca_asg_provider::scalein::{DeadlinePolicy, Outcome, ScaleInSettings};
use ca_asg_provider::sim::{self, cluster, fixtures};
use k8s_openapi::api::core::v1::{Pod, Toleration};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::ObjectMeta;

mod support;
use support::eventually;
use support::world::*;

/// Group `web` (at most 3, `desired` of them) under the drain settings `s`, pods
/// Ready 20 ms after binding.
async fn web_world(desired: i32, s: ScaleInSettings) -> World {
    World::builder()
        .web(3, desired)
        .settings(s)
        .ready_delay(Duration::from_millis(20))
        .build()
        .await
}

fn settings(deadline_secs: u64) -> ScaleInSettings {
    ScaleInSettings {
        workload_deadline: Duration::from_secs(deadline_secs),
        daemonset_deadline: Duration::from_secs(deadline_secs),
        stuck_after: Duration::from_secs(1),
        ..fast_settings()
    }
}

fn reasons(w: &World) -> Vec<(String, String)> {
    events(&w.sim)
}

fn first(audit: &[sim::AuditEntry], verb: &str, prefix: &str) -> usize {
    audit_index(audit, verb, "Pod", prefix)
        .unwrap_or_else(|| panic!("no {verb} of a pod {prefix}*: {audit:?}"))
}

/// Item 6: a replica with a blanket toleration is evicted once; its replacement,
/// which kube-scheduler puts back on the cordoned node, is not chased.
#[tokio::test]
async fn a_replacement_that_tolerates_the_drain_taint_is_not_chased() {
    let mut w = web_world(1, settings(20)).await;
    let (node, iid) = nodes_of(&w, "web").remove(0);
    let mut rs = fixtures::replicaset("shop", "tolerant", 1, 0.05);
    rs.spec
        .as_mut()
        .unwrap()
        .template
        .as_mut()
        .unwrap()
        .spec
        .as_mut()
        .unwrap()
        .tolerations = Some(vec![Toleration {
        operator: Some("Exists".into()),
        ..Default::default()
    }]);
    w.put(&rs);
    pods_ready(&w, 1).await;
    delete_nodes(&mut w, "web", &[(node.clone(), iid.clone())]).await;
    assert_eq!(w.engine.wait_for(&iid).await, Some(Outcome::Ended));
    let evicted = evictions_of(&w, "tolerant");
    assert_eq!(evicted, 1, "evicted once, the replacement not chased");
    let ev = reasons(&w);
    assert!(
        ev.iter()
            .any(|(r, n)| r == "PodNotWaitedFor" && n.contains("tolerates the drain taint")),
        "{ev:?}"
    );
}

/// Item 7: the node's kubelet dies mid-scale-in; its pods stay terminating forever.
/// The drain does not wait for them to its deadline, and still takes the log
/// shipper only after the workload.
#[tokio::test]
async fn a_dead_kubelet_does_not_hold_the_drain_to_its_deadline() {
    let mut w = web_world(1, settings(30)).await;
    let (node, iid) = node_with_fluentd_and_app(&w, 0.1).await;
    w.sim.stop_kubelet(&node).unwrap();
    delete_nodes(&mut w, "web", &[(node.clone(), iid.clone())]).await;
    assert_eq!(w.engine.wait_for(&iid).await, Some(Outcome::Ended));
    let a = w.sim.audit();
    assert!(first(&a, "evicted", "app") < first(&a, "evicted", "fluentd"));
    assert!(
        w.sim.get::<Pod>("shop", "app").is_some(),
        "the app pod is still terminating: nobody confirmed it"
    );
    let ev = reasons(&w);
    assert!(
        ev.iter()
            .any(|(r, n)| r == "PodNotWaitedFor" && n.contains("not Ready")),
        "{ev:?}"
    );
    assert!(!ev.iter().any(|(r, _)| r == "DeadlineHit"), "{ev:?}");
}

/// Item 7: a container that never exits (stuck terminating past its grace period)
/// and a finished pod held by a finalizer do not hold the drain.
#[tokio::test]
async fn stuck_and_finalizer_held_pods_do_not_hold_the_drain() {
    let mut w = web_world(1, settings(30)).await;
    let (node, iid) = nodes_of(&w, "web").remove(0);
    let mut wedged = fixtures::pod("shop", "wedged", &node, "wedged", 0.0);
    wedged
        .metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(cluster::NEVER_EXITS_ANNOTATION.into(), "true".into());
    wedged
        .spec
        .as_mut()
        .unwrap()
        .termination_grace_period_seconds = Some(1);
    w.put(&wedged);
    let mut held = fixtures::pod("shop", "held", &node, "held", 0.0);
    held.metadata.finalizers = Some(vec!["example.com/keep".into()]);
    w.put(&held);
    pods_ready(&w, 2).await;
    delete_nodes(&mut w, "web", &[(node.clone(), iid.clone())]).await;
    assert_eq!(w.engine.wait_for(&iid).await, Some(Outcome::Ended));
    assert!(w.sim.get::<Pod>("shop", "wedged").is_some());
    assert!(w.sim.get::<Pod>("shop", "held").is_some());
    let ev = reasons(&w);
    for (pod, why) in [("wedged", "stuck terminating"), ("held", "finalizer")] {
        assert!(
            ev.iter()
                .any(|(r, n)| r == "PodNotWaitedFor" && n.contains(pod) && n.contains(why)),
            "{pod}: {ev:?}"
        );
    }
}

/// Item 5, direct mode: at a `proceed` deadline the workload a budget still holds is
/// ended with its own grace period first; only then does the log shipper go.
#[tokio::test]
async fn proceed_ends_the_workloads_before_the_daemonset_pods() {
    let mut w = web_world(
        1,
        ScaleInSettings {
            workload_deadline_policy: DeadlinePolicy::Proceed,
            ..settings(1)
        },
    )
    .await;
    let (node, iid) = node_with_fluentd_and_app(&w, 0.5).await;
    w.put(&fixtures::pdb("shop", "app", 0));
    delete_nodes(&mut w, "web", &[(node, iid.clone())]).await;
    assert_eq!(w.engine.wait_for(&iid).await, Some(Outcome::Ended));
    let a = w.sim.audit();
    assert!(
        audit_index(&a, "evicted", "Pod", "app").is_none(),
        "the budget was never broken by an eviction"
    );
    let app_gone = first(&a, "removed", "app");
    let fluentd_evicted = first(&a, "evicted", "fluentd");
    assert!(
        app_gone < fluentd_evicted,
        "fluentd was evicted while the app still ran: {a:?}"
    );
}

/// Issue 30, 3: at a `proceed` deadline the API server refuses the workload pod's
/// delete (RBAC, a webhook, a 5xx: 403 here). The delete is retried, and while the
/// pod runs the log shipper stays: the DaemonSet phase never starts before it, and
/// no Event claims a delete that did not happen. Once the API server accepts it, the
/// pod goes first, then fluentd.
#[tokio::test]
async fn a_refused_delete_at_a_proceed_deadline_keeps_the_daemonset_pods() {
    let mut w = web_world(
        1,
        ScaleInSettings {
            workload_deadline_policy: DeadlinePolicy::Proceed,
            ..settings(1)
        },
    )
    .await;
    let (node, iid) = nodes_of(&w, "web").remove(0);
    w.put(&fixtures::daemonset("logging", "fluentd", 0.2, false));
    // A short grace period: a drain that stops waiting for it after grace + 5 s does
    // so within the test.
    let mut app = fixtures::pod("shop", "app", &node, "app", 0.2);
    app.spec.as_mut().unwrap().termination_grace_period_seconds = Some(1);
    w.put(&app);
    w.put(&fixtures::pdb("shop", "app", 0));
    pods_ready(&w, 2).await;
    w.sim.deny(&[("delete", "pods")]);
    delete_nodes(&mut w, "web", &[(node, iid.clone())]).await;
    eventually("the workload deadline passes", 10, || {
        reasons(&w)
            .iter()
            .any(|(r, n)| r == "DeadlineHit" && n.starts_with("workloads deadline"))
    })
    .await;
    // Longer than the pod's grace period and 5 s more.
    tokio::time::sleep(Duration::from_secs(8)).await;
    let a = w.sim.audit();
    assert!(
        audit_index(&a, "evicted", "Pod", "fluentd").is_none(),
        "fluentd was evicted while the app still ran: {a:?}"
    );
    assert!(
        !reasons(&w)
            .iter()
            .any(|(r, n)| r == "DeadlineHit" && n.starts_with("deleted")),
        "no Event claims a delete the API server refused"
    );
    assert!(w.engine.is_draining(&iid), "the delete is still retried");

    w.sim.deny(&[]);
    assert_eq!(w.engine.wait_for(&iid).await, Some(Outcome::Ended));
    let a = w.sim.audit();
    assert!(first(&a, "removed", "app") < first(&a, "evicted", "fluentd"));
    assert!(reasons(&w)
        .iter()
        .any(|(r, n)| r == "DeadlineHit" && n.starts_with("deleted 1 workload pod(s)")));
}

/// Item 5, lifecycle mode: both hook results end the instance, so `abandon` cannot
/// keep the node; the drain goes on to the DaemonSet phase and completes CONTINUE
/// instead of leaving fluentd to die with the instance when the hook times out.
#[tokio::test]
async fn a_lifecycle_deadline_proceeds_whatever_the_policy() {
    let mut w = World::builder()
        .web_hooked(3, 1, 30)
        .settings(ScaleInSettings {
            workload_deadline_policy: DeadlinePolicy::Abandon,
            ..settings(1)
        })
        .ready_delay(Duration::from_millis(20))
        .build()
        .await;
    let (node, iid) = node_with_fluentd_and_app(&w, 0.2).await;
    w.put(&fixtures::pdb("shop", "app", 0));
    delete_nodes(&mut w, "web", &[(node, iid.clone())]).await;
    assert_eq!(w.engine.wait_for(&iid).await, Some(Outcome::Ended));
    let done = w.cloud.completed_actions();
    assert_eq!(done.len(), 1);
    assert_eq!(done[0].1, LifecycleResult::Continue);
    let a = w.sim.audit();
    assert!(first(&a, "removed", "app") < first(&a, "evicted", "fluentd"));
}

/// Item 9: API Priority and Fairness sheds evictions with 429s that name no budget;
/// they are retried after Retry-After and never reported as a budget's refusal.
/// Two budgets over one pod make the Eviction API answer 500: the Event names both.
#[tokio::test]
async fn throttled_evictions_are_not_budget_blocks_and_overlapping_budgets_are_named() {
    let mut w = web_world(2, settings(30)).await;
    let nodes = nodes_of(&w, "web");
    let (n1, i1) = nodes[0].clone();
    w.put(&fixtures::pod("shop", "busy", &n1, "busy", 0.0));
    pods_ready(&w, 1).await;
    w.sim.throttle("create", "pods/eviction", 2);
    delete_nodes(&mut w, "web", &[(n1, i1.clone())]).await;
    assert_eq!(w.engine.wait_for(&i1).await, Some(Outcome::Ended));
    let ev = reasons(&w);
    assert!(
        !ev.iter().any(|(r, _)| r == "EvictionBlocked"),
        "a throttled eviction is not a budget's refusal: {ev:?}"
    );

    let (n2, i2) = nodes[1].clone();
    w.put(&fixtures::pod("shop", "double", &n2, "double", 0.0));
    let mut second = fixtures::pdb("shop", "double", 1);
    second.metadata.name = Some("double-again".into());
    w.put(&fixtures::pdb("shop", "double", 1));
    w.put(&second);
    pods_ready(&w, 1).await;
    delete_nodes(&mut w, "web", &[(n2, i2.clone())]).await;
    eventually("an Event naming both budgets", 10, || {
        reasons(&w).iter().any(|(r, n)| {
            r == "EvictionBlocked" && n.contains("double-pdb") && n.contains("double-again")
        })
    })
    .await;
    assert!(w
        .sim
        .remove::<k8s_openapi::api::policy::v1::PodDisruptionBudget>("shop", "double-again"));
    assert_eq!(w.engine.wait_for(&i2).await, Some(Outcome::Ended));
    support::rbac::assert_rbac_covers(&w.sim);
}

/// [`settings`] with 30 s for the drain, a volume waited for up to 20 s.
fn waiting_20s_for_volumes() -> ScaleInSettings {
    ScaleInSettings {
        volume_deadline: Duration::from_secs(20),
        ..settings(30)
    }
}

/// How many times the drain asked pod `name` to leave.
fn times_asked(audit: &[ca_asg_provider::sim::AuditEntry], name: &str) -> usize {
    audit
        .iter()
        .filter(|e| e.verb == "eviction-requested" && e.name == name)
        .count()
}

/// Item 8: kube-proxy, the CNI and CSI node plugins (system-node-critical DaemonSet
/// pods) leave after the volumes have detached; the log shipper before them.
#[tokio::test]
async fn node_critical_daemonsets_leave_after_the_volumes() {
    let mut w = web_world(1, waiting_20s_for_volumes()).await;
    let (node, iid) = node_with_fluentd_and_app(&w, 0.1).await;
    let mut csi = fixtures::daemonset("kube-system", "ebs-csi-node", 0.05, false);
    csi.spec
        .as_mut()
        .and_then(|s| s.template.spec.as_mut())
        .unwrap()
        .priority_class_name = Some("system-node-critical".into());
    w.put(&csi);
    pods_ready(&w, 3).await;
    w.put(&fixtures::volume_attachment("csi-vol", &node, "pv-1"));
    delete_nodes(&mut w, "web", &[(node, iid.clone())]).await;
    eventually("fluentd evicted", 10, || {
        audit_index(&w.sim.audit(), "evicted", "Pod", "fluentd").is_some()
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        audit_index(&w.sim.audit(), "evicted", "Pod", "ebs-csi-node").is_none(),
        "the CSI node plugin went while a volume was still attached"
    );
    assert!(w.sim.remove::<VolumeAttachment>("", "csi-vol"));
    assert_eq!(w.engine.wait_for(&iid).await, Some(Outcome::Ended));
    let a = w.sim.audit();
    assert!(first(&a, "evicted", "fluentd") < first(&a, "evicted", "ebs-csi-node"));
}

/// Item 12: CA left at `--daemonset-eviction-for-occupied-nodes=true` evicts the log
/// shipper with the workloads before DeleteNodes; the drain says so, and how to fix it.
#[tokio::test]
async fn daemonset_pods_ca_evicted_early_are_reported() {
    let mut w = web_world(1, settings(30)).await;
    let mut ds = fixtures::daemonset("logging", "fluentd", 2.0, false);
    ds.spec
        .as_mut()
        .and_then(|s| s.template.spec.as_mut())
        .unwrap()
        .termination_grace_period_seconds = Some(30);
    w.put(&ds);
    let (node, iid) = nodes_of(&w, "web").remove(0);
    pods_ready(&w, 1).await;
    // What CA does before DeleteNodes with the flag left at its default.
    let fluentd = w
        .sim
        .list::<Pod>()
        .into_iter()
        .find(|p| {
            p["metadata"]["name"]
                .as_str()
                .unwrap()
                .starts_with("fluentd")
        })
        .unwrap();
    let name = fluentd["metadata"]["name"].as_str().unwrap().to_string();
    let pods: kube::Api<Pod> = kube::Api::namespaced(w.sim.client(), "logging");
    pods.evict(&name, &Default::default()).await.unwrap();
    delete_nodes(&mut w, "web", &[(node, iid.clone())]).await;
    assert_eq!(w.engine.wait_for(&iid).await, Some(Outcome::Ended));
    let ev = reasons(&w);
    assert!(
        ev.iter().any(|(r, n)| r == "DaemonSetEvictedEarly"
            && n.contains(&name)
            && n.contains("--daemonset-eviction-for-occupied-nodes=false")
            && n.contains("enable-ds-eviction")),
        "{ev:?}"
    );
}

/// Item 8: the volume wait leaves out the volume of a pod that stays on the node (its
/// kubelet died, nothing will unmount it) and still waits for the others.
#[tokio::test]
async fn the_volume_wait_leaves_out_volumes_of_pods_that_stay() {
    use k8s_openapi::api::core::v1::{
        PersistentVolumeClaim, PersistentVolumeClaimSpec, PersistentVolumeClaimVolumeSource, Volume,
    };
    let mut w = web_world(
        1,
        ScaleInSettings {
            volume_deadline: Duration::from_secs(60),
            ..settings(30)
        },
    )
    .await;
    let (node, iid) = nodes_of(&w, "web").remove(0);
    let mut db = fixtures::pod("shop", "db", &node, "db", 0.0);
    db.spec.as_mut().unwrap().volumes = Some(vec![Volume {
        name: "data".into(),
        persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
            claim_name: "db-data".into(),
            read_only: None,
        }),
        ..Default::default()
    }]);
    w.put(&db);
    w.put(&PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some("db-data".into()),
            namespace: Some("shop".into()),
            ..Default::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            volume_name: Some("pv-db".into()),
            ..Default::default()
        }),
        status: None,
    });
    pods_ready(&w, 1).await;
    for (name, pv) in [("va-db", "pv-db"), ("va-other", "pv-other")] {
        w.put(&fixtures::volume_attachment(name, &node, pv));
    }
    w.sim.stop_kubelet(&node).unwrap();
    delete_nodes(&mut w, "web", &[(node, iid.clone())]).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        w.engine.is_draining(&iid),
        "pv-other was still attached, yet the drain did not wait for it"
    );
    assert!(w.sim.remove::<VolumeAttachment>("", "va-other"));
    assert_eq!(w.engine.wait_for(&iid).await, Some(Outcome::Ended));
    assert!(
        w.sim.get::<VolumeAttachment>("", "va-db").is_some(),
        "the stuck pod's volume is still attached, and the drain did not wait for it"
    );
    support::rbac::assert_rbac_covers(&w.sim);
}

/// Item 5: a drain resumed after its workload deadline under `proceed` still ends the
/// workloads first, then runs the DaemonSet phase, instead of ending the instance
/// with the log shipper never evicted.
#[tokio::test]
async fn a_drain_resumed_past_its_deadline_still_takes_the_daemonsets_last() {
    let s = ScaleInSettings {
        workload_deadline_policy: DeadlinePolicy::Proceed,
        ..settings(1)
    };
    let mut w = web_world(1, s.clone()).await;
    let (node, iid) = node_with_fluentd_and_app(&w, 0.2).await;
    w.put(&fixtures::pdb("shop", "app", 0));
    delete_nodes(&mut w, "web", &[(node, iid.clone())]).await;
    // The service dies at once and comes back after the deadline has passed.
    w.engine.abort_all();
    w.engine.shutdown();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (provider2, engine2, _ca2) = service(&w.sim, &w.cloud, &w.groups, s).await;
    assert_eq!(
        ca_asg_provider::scalein::sources::hook_scan::resume(&engine2, &provider2).await,
        1
    );
    assert_eq!(engine2.wait_for(&iid).await, Some(Outcome::Ended));
    let a = w.sim.audit();
    assert!(first(&a, "removed", "app") < first(&a, "evicted", "fluentd"));
}

/// Issue 39, suspected item proven: at the workload deadline (`proceed`) the drain
/// deletes the workload pods left and waits for them before the DaemonSet pods. A pod a
/// person had already deleted with a longer grace period than its spec's (`kubectl
/// delete --grace-period=60`) runs until its deletionTimestamp; the wait was bounded by
/// the spec's grace (1 s here, plus 5 s), and the log shipper was evicted while that
/// pod still ran its 12 s preStop. The wait now lasts until the latest deletion time.
#[tokio::test]
async fn at_the_deadline_a_pod_deleted_with_a_longer_grace_keeps_the_daemonsets_until_it_exits() {
    let s = ScaleInSettings {
        workload_deadline_policy: DeadlinePolicy::Proceed,
        ..settings(1)
    };
    let mut w = web_world(1, s).await;
    let (node, iid) = nodes_of(&w, "web").remove(0);
    w.put(&fixtures::daemonset("logging", "fluentd", 0.2, false));
    let short_grace = |mut p: Pod| {
        p.spec.as_mut().unwrap().termination_grace_period_seconds = Some(1);
        p
    };
    // `app` behind a budget that allows nothing: the deadline comes.
    w.put(&short_grace(fixtures::pod(
        "shop", "app", &node, "app", 0.0,
    )));
    w.put(&fixtures::pdb("shop", "app", 0));
    w.put(&short_grace(fixtures::pod(
        "shop", "slow", &node, "slow", 12.0,
    )));
    pods_ready(&w, 3).await;
    let pods: kube::Api<Pod> = kube::Api::namespaced(w.sim.client(), "shop");
    let longer = kube::api::DeleteParams {
        grace_period_seconds: Some(60),
        ..Default::default()
    };
    pods.delete("slow", &longer).await.unwrap();
    delete_nodes(&mut w, "web", &[(node, iid.clone())]).await;
    assert_eq!(w.engine.wait_for(&iid).await, Some(Outcome::Ended));
    let a = w.sim.audit();
    let slow_gone = audit_index(&a, "removed", "Pod", "slow");
    let fluentd_asked = first(&a, "evicted", "fluentd");
    assert!(
        slow_gone.is_some_and(|gone| gone < fluentd_asked),
        "the log shipper was evicted while a workload pod still ran (slow removed at {slow_gone:?}, fluentd evicted at {fluentd_asked}): {a:?}"
    );
}

/// Issue 39, suspected item proven: a workload pod bound to the node by name
/// (`spec.nodeName`, past the scheduler and the cordon) while the DaemonSet phase runs
/// was never evicted: the phase took DaemonSet pods only, the log shipper went, and the
/// instance ended under the workload. A workload still there in a later phase now
/// goes first, before any DaemonSet pod that is still running.
#[tokio::test]
async fn a_workload_bound_by_name_during_the_daemonset_phase_is_evicted_before_the_rest() {
    let mut w = web_world(1, settings(30)).await;
    let (node, iid) = nodes_of(&w, "web").remove(0);
    // A log shipper slow to stop, and a node-critical DaemonSet (kube-proxy's kind),
    // which goes last of all.
    w.put(&fixtures::daemonset("logging", "fluentd", 3.0, false));
    w.put(&fixtures::daemonset_tolerating(
        "kube-system",
        "kube-proxy",
        0.1,
        &[],
        Some("system-node-critical"),
    ));
    w.put(&fixtures::pod("shop", "app", &node, "app", 0.0));
    pods_ready(&w, 3).await;
    delete_nodes(&mut w, "web", &[(node.clone(), iid.clone())]).await;
    eventually("the DaemonSet phase under way", 10, || {
        audit_index(&w.sim.audit(), "eviction-requested", "Pod", "fluentd").is_some()
    })
    .await;
    // Bound by name: no scheduler, no cordon in its way.
    w.put(&fixtures::pod("shop", "late", &node, "late", 0.0));
    assert_eq!(w.engine.wait_for(&iid).await, Some(Outcome::Ended));
    let a = w.sim.audit();
    let late_asked = audit_index(&a, "eviction-requested", "Pod", "late");
    assert!(
        late_asked.is_some(),
        "the workload bound during the DaemonSet phase was never asked to leave: {a:?}"
    );
    // Before the DaemonSet pods still running were asked to leave.
    assert!(
        first(&a, "removed", "late") < first(&a, "eviction-requested", "kube-proxy"),
        "{a:?}"
    );
    support::world::assert_no_pod_evicted_twice(&a);
}

/// The Node cache's first list cannot arrive (the API server is down) while two
/// waiters wait for it, as the drain-mark sync and the lifecycle loop's resume do at
/// start: both must wake when it arrives. kube's own readiness wakes only the last
/// waiter; the first one used to wait forever, and every size change CA asked for
/// was answered Unavailable from then on.
#[tokio::test]
async fn every_waiter_for_the_node_cache_wakes_when_the_first_list_arrives() {
    use ca_asg_provider::scalein::kube::nodes::NodeIndex;
    // Each waits as long as the marks sync does: without a bound of its own.
    both_waiters_wake_after_an_outage(
        |client| Arc::new(NodeIndex::start(client)),
        |n| async move { n.ready(Duration::from_secs(3600)).await },
    )
    .await;
}

/// An API-server outage begins; then a cache is started and two waiters wait for its
/// first list, 20 ms apart. Both must wake once the list arrives after the outage.
async fn both_waiters_wake_after_an_outage<C, F>(
    start: impl FnOnce(kube::Client) -> C,
    wait: impl Fn(C) -> F,
) where
    C: Clone,
    F: std::future::Future<Output = bool> + Send + 'static,
{
    let sim = Arc::new(
        ca_asg_provider::sim::SimCluster::start(ca_asg_provider::sim::SimOptions::default())
            .await
            .unwrap(),
    );
    let down = {
        let sim = sim.clone();
        tokio::spawn(async move { sim.outage(Duration::from_millis(800)).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    let cache = start(sim.client());
    let first = tokio::spawn(wait(cache.clone()));
    tokio::time::sleep(Duration::from_millis(20)).await;
    let second = tokio::spawn(wait(cache.clone()));
    down.await.unwrap().unwrap();
    // A hang guard, not a timing: the list arrives about a second after the outage.
    for (name, w) in [("second", second), ("first", first)] {
        let woke = tokio::time::timeout(Duration::from_secs(30), w).await;
        assert!(
            matches!(woke, Ok(Ok(true))),
            "the {name} waiter never woke after the first list arrived"
        );
    }
}

/// The same for the drain pass's caches: several drains wait for the first list of
/// VolumeAttachments (or budgets) at once while the API server is down, and every one
/// wakes when it arrives instead of sitting out its volume deadline.
#[tokio::test]
async fn every_waiter_for_a_drain_pass_cache_wakes_when_the_first_list_arrives() {
    use ca_asg_provider::scalein::kube::pass::{Pass, Passes};
    both_waiters_wake_after_an_outage(
        |client| {
            // The pass lives while its handles do: the Passes only point at it.
            Passes::new(client, 10).join()
        },
        |p: Arc<Pass>| async move {
            p.attachments()
                .ready(ca_asg_provider::clock::now() + Duration::from_secs(3600))
                .await
        },
    )
    .await;
}

/// The watches a drain opens on a budget's pods after its 429: one per namespace and
/// selector however many drains wait on it; a waiter wakes on a change of a selected
/// pod and not before (nor on nothing at all); the watch closes with its last waiter.
#[tokio::test]
async fn budget_watches_are_shared_wake_on_a_change_only_and_close_with_the_last_waiter() {
    use ca_asg_provider::scalein::kube::budgets::{any_changed, BudgetWatches};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
    let sim = sim::SimCluster::start(Default::default()).await.unwrap();
    let watches = BudgetWatches::new(sim.client());
    let selector = kube::core::Selector::try_from(LabelSelector {
        match_labels: Some([("app".to_string(), "web".to_string())].into()),
        ..Default::default()
    })
    .unwrap();
    let mut a = watches.subscribe("shop", &selector, None);
    let b = watches.subscribe("shop", &selector, None);
    assert_eq!(watches.open(), 1, "one watch for both waiters");
    let quiet = Duration::from_millis(300);
    assert!(
        tokio::time::timeout(quiet, a.changed()).await.is_err(),
        "no change, no wake"
    );
    assert!(
        tokio::time::timeout(quiet, any_changed(&mut []))
            .await
            .is_err(),
        "waiting on no budget never wakes"
    );
    // A selected pod appears (again until the watch's first list is behind it).
    let mut woke = false;
    for i in 0..20 {
        sim.create(&fixtures::pod(
            "shop",
            &format!("web-{i}"),
            "n1",
            "web",
            0.1,
        ))
        .unwrap();
        if tokio::time::timeout(quiet, any_changed(std::slice::from_mut(&mut a)))
            .await
            .is_ok()
        {
            woke = true;
            break;
        }
    }
    assert!(woke, "a change of a selected pod wakes the waiter");
    assert_eq!(
        sim.requests().get("list", "pods"),
        1,
        "one list of the selected pods for both waiters"
    );
    drop(a);
    assert_eq!(watches.open(), 1, "open while a waiter is left");
    drop(b);
    assert_eq!(watches.open(), 0, "closed with the last waiter");
    sim.shutdown().await;
}

/// Issue 31, 4: DaemonSets that tolerate everything (kube-proxy, the VPC CNI aws-node,
/// the EBS CSI node plugin, all system-node-critical) and a log shipper that
/// tolerates the drain taint, which the DaemonSet controller puts straight back on
/// the cordoned, tainted node once their pod is gone. The drain ends; every
/// DaemonSet pod leaves after the workload pod; the node-critical ones after the
/// volume has detached (the CSI node plugin detaches it) and after the log shipper
/// and fluentd; and each set is asked to leave once: what comes back is not chased.
/// The drain starts at the top of a second, so what the controller puts back within
/// it carries a creationTimestamp (whole seconds, as kube-apiserver writes it) no
/// later than the drain's start.
#[tokio::test]
async fn daemonsets_that_tolerate_everything_leave_once_last_and_after_the_volumes() {
    let mut w = web_world(1, waiting_20s_for_volumes()).await;
    let (node, iid) = node_with_fluentd_and_app(&w, 0.1).await;
    for ds in [
        fixtures::log_shipper_tolerating_drain(0.0),
        fixtures::kube_proxy(0.0),
        fixtures::aws_node(0.0),
        fixtures::csi_node(0.0),
    ] {
        w.put(&ds);
    }
    pods_ready(&w, 6).await;
    w.put(&fixtures::volume_attachment("csi-vol", &node, "pv-1"));
    let into_second = chrono::Utc::now().timestamp_subsec_millis() as u64;
    tokio::time::sleep(Duration::from_millis(1020 - into_second)).await;
    delete_nodes(&mut w, "web", &[(node.clone(), iid.clone())]).await;
    eventually("the log shipper evicted", 10, || {
        audit_index(&w.sim.audit(), "evicted", "Pod", "log-shipper").is_some()
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    for critical in ["kube-proxy", "aws-node", "ebs-csi-node"] {
        assert!(
            audit_index(&w.sim.audit(), "evicted", "Pod", critical).is_none(),
            "{critical} went while a volume was still attached"
        );
    }
    assert!(w.sim.remove::<VolumeAttachment>("", "csi-vol"));
    assert_eq!(w.engine.wait_for(&iid).await, Some(Outcome::Ended));
    let a = w.sim.audit();
    let app_gone = first(&a, "removed", "app");
    let detached = audit_index(&a, "removed", "VolumeAttachment", "csi-vol").unwrap();
    for set in [
        "fluentd",
        "log-shipper",
        "kube-proxy",
        "aws-node",
        "ebs-csi-node",
    ] {
        let asked = a
            .iter()
            .filter(|e| e.verb == "eviction-requested" && e.name.starts_with(set))
            .count();
        assert_eq!(asked, 1, "{set} asked to leave {asked} times: {a:?}");
        let leaves = first(&a, "deletion-started", set);
        assert!(app_gone < leaves, "{set} left before the workload pod");
    }
    for critical in ["kube-proxy", "aws-node", "ebs-csi-node"] {
        let leaves = first(&a, "deletion-started", critical);
        assert!(
            detached < leaves,
            "{critical} left before the volume detached"
        );
        for shipper in ["fluentd", "log-shipper"] {
            assert!(first(&a, "deletion-started", shipper) < leaves);
        }
    }
}

/// A reason that joins a running drain restarts it with every reason (docs/scale-in.md:
/// "its state is in the pods and on the Node, so nothing is evicted twice"). Found by
/// all_sources_model (CA's scale-in and a rebalance drain on one node, the machine
/// busy): the new run asked for a pod the previous run had just evicted. Two ways:
/// the previous run's eviction was still in flight (here behind a slow admission
/// webhook) and landed after the new run listed the pods; or the new run saw the
/// pods through the pass's shared watch, behind by a moment (a watch cache behind
/// etcd), which another drain kept alive. Either way the app is asked to leave once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_restarted_after_its_eviction_does_not_evict_again() {
    use ca_asg_provider::scalein::{self, DrainRequest, Mode, Source};
    for (lag, webhook) in [(600, 0), (0, 600)] {
        // Every drain sees its pods through the pass's one watch.
        let mut w = web_world(
            2,
            ScaleInSettings {
                shared_pod_watch_from: 1,
                ..settings(30)
            },
        )
        .await;
        let nodes = nodes_of(&w, "web");
        let (node, iid) = nodes[0].clone();
        w.put(&fixtures::pod("shop", "app", &node, "app", 1.0));
        pods_ready(&w, 1).await;
        if lag > 0 {
            // Another drain, held by a budget that allows nothing, keeps the pass and
            // its watch alive across the restart.
            let (held_node, held_iid) = nodes[1].clone();
            w.put(&fixtures::pod("shop", "held", &held_node, "held", 0.1));
            w.put(&fixtures::pdb("shop", "held", 0));
            pods_ready(&w, 2).await;
            delete_nodes(&mut w, "web", &[(held_node, held_iid)]).await;
            eventually("the held pod refused", 10, || {
                audit_index(&w.sim.audit(), "eviction-denied", "Pod", "held").is_some()
            })
            .await;
            w.sim.lag_watches(Duration::from_millis(lag));
        } else {
            w.sim
                .slow_requests("create", "pods/eviction", Duration::from_millis(webhook));
        }
        delete_nodes(&mut w, "web", &[(node.clone(), iid.clone())]).await;
        eventually("the app's eviction sent", 10, || {
            if lag > 0 {
                audit_index(&w.sim.audit(), "evicted", "Pod", "app").is_some()
            } else {
                w.sim.requests().get("create", "pods/eviction") >= 1
            }
        })
        .await;
        // `drain NODE` joins: the drain restarts with both reasons.
        let mode = Mode::DrainOnly;
        w.engine.start(DrainRequest {
            instance_id: iid.clone(),
            group: "web".into(),
            node_name: Some(node.clone()),
            reasons: vec![scalein::ca_reason(&mode)],
            mode,
            source: Source::Cli,
            noticed: None,
        });
        assert_eq!(w.engine.wait_for(&iid).await, Some(Outcome::Ended));
        let a = w.sim.audit();
        let asked = times_asked(&a, "app");
        assert_eq!(
            asked, 1,
            "watch lag {lag} ms, webhook {webhook} ms: the app was asked to leave {asked} times"
        );
        support::world::assert_no_pod_evicted_twice(&a);
        w.sim.heal();
        w.engine.shutdown();
    }
}

/// The same, when the reason that joins has no time left: a spot warning whose two
/// minutes are nearly spent joins CA's scale-in while the app's eviction is in flight
/// (behind a slow admission webhook). The new run's deadline has passed before it
/// starts; it must not ask for the app again, it waits for that answer or deletes the
/// app at the deadline. Found by unkind_model (MODEL_SEED=1795589335690274405
/// MODEL_CASE=428: CaScaleIn(2), SpotLate(2, 3), ...: "app-2 was evicted twice").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reason_past_its_deadline_joining_an_eviction_in_flight_does_not_evict_again() {
    use ca_asg_provider::scalein::{decide::record, DrainRequest, Mode, Source};
    let mut w = World::builder()
        .group(MemoryGroup::new("batch", 0, 3, 1, "m5.large"))
        .settings(settings(30))
        .ready_delay(Duration::from_millis(20))
        .build()
        .await;
    let (node, iid) = nodes_of(&w, "batch").remove(0);
    w.put(&fixtures::pod("shop", "app", &node, "app", 1.0));
    pods_ready(&w, 1).await;
    w.sim
        .slow_requests("create", "pods/eviction", Duration::from_millis(800));
    delete_nodes(&mut w, "batch", &[(node.clone(), iid.clone())]).await;
    eventually("the app's eviction sent", 10, || {
        w.sim.requests().get("create", "pods/eviction") >= 1
    })
    .await;
    let now = chrono::Utc::now();
    let spent = record::DrainReason::new(
        record::Why::Notice {
            notice: "spot_interruption".into(),
            ends_at: Some(now),
            daemonset_share_secs: 0,
        },
        now,
    );
    w.engine.start(DrainRequest {
        instance_id: iid.clone(),
        group: "batch".into(),
        node_name: Some(node.clone()),
        reasons: vec![spent],
        mode: Mode::DrainOnly,
        source: Source::Interruption,
        noticed: None,
    });
    assert_eq!(w.engine.wait_for(&iid).await, Some(Outcome::Ended));
    let a = w.sim.audit();
    let asked = times_asked(&a, "app");
    assert_eq!(asked, 1, "the app was asked to leave {asked} times: {a:?}");
    support::world::assert_no_pod_evicted_twice(&a);
    w.sim.heal();
    w.engine.shutdown();
}

/// Issue 30, the unkind model's intermittent failure (a log shipper asked to leave
/// four times): a DaemonSet pod that tolerates the drain taint, evicted and put back
/// within the second the drain began, was asked to leave again by every process that
/// resumed the drain (a restart, a new leader). Its replacement's creationTimestamp
/// (whole seconds) read as no later than the start, and only the process that began
/// the drain remembered which pods it had first seen. Now no pod that can come back
/// is asked to leave before the next whole second, so a resumed drain tells the pod
/// put back as the first process did, and the log shipper is asked to leave once.
#[tokio::test]
async fn a_daemonset_pod_put_back_is_not_asked_to_leave_again_after_a_restart() {
    let mut w = web_world(1, settings(30)).await;
    let (node, iid) = nodes_of(&w, "web").remove(0);
    // fluentd flushes for 3 s: the DaemonSet phase still waits for it when the
    // process dies.
    w.put(&fixtures::daemonset("logging", "fluentd", 3.0, false));
    w.put(&fixtures::log_shipper_tolerating_drain(0.0));
    w.put(&fixtures::pod("shop", "app", &node, "app", 0.05));
    pods_ready(&w, 3).await;
    // The drain begins at the top of a second: a log shipper evicted at once would be
    // put back within it.
    let into_second = chrono::Utc::now().timestamp_subsec_millis() as u64;
    tokio::time::sleep(Duration::from_millis(1020 - into_second)).await;
    delete_nodes(&mut w, "web", &[(node.clone(), iid.clone())]).await;
    let shippers_created = |a: &[sim::AuditEntry]| {
        a.iter()
            .filter(|e| e.kind == "Pod" && e.verb == "create" && e.name.starts_with("log-shipper"))
            .count()
    };
    eventually("the log shipper evicted and put back", 10, || {
        shippers_created(&w.sim.audit()) >= 2
    })
    .await;
    // The service dies; a new process resumes the drain from the Node's record.
    w.engine.abort_all();
    w.engine.shutdown();
    let (provider2, engine2, _ca2) = service(&w.sim, &w.cloud, &w.groups, settings(30)).await;
    assert_eq!(
        ca_asg_provider::scalein::sources::hook_scan::resume(&engine2, &provider2).await,
        1
    );
    assert_eq!(engine2.wait_for(&iid).await, Some(Outcome::Ended));
    let a = w.sim.audit();
    for set in ["fluentd", "log-shipper"] {
        let asked = a
            .iter()
            .filter(|e| e.verb == "eviction-requested" && e.name.starts_with(set))
            .count();
        assert_eq!(asked, 1, "{set} asked to leave {asked} times: {a:?}");
        assert!(first(&a, "removed", "app") < first(&a, "deletion-started", set));
    }
}

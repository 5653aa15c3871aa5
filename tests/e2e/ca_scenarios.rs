//! The scenarios where cluster-autoscaler decides, each run once per CA profile by
//! `tests/e2e_real.rs`, on the real control plane, with the suite's client playing that
//! CA version (`driver.rs`). CA's ServiceAccount has exactly the shipped RBAC: the
//! service's (`deploy/base/rbac.yaml`) and CA's own (`deploy/cluster-autoscaler`). The
//! report's row names the scenario and the driver ("suite client as CA 1.36"); a failure
//! names both and the step.
#![allow(dead_code)] // shared by the e2e test crates, each using a part

use std::collections::BTreeSet;
use std::time::Duration;

use ca_asg_provider::clock::Instant;

use ca_asg_provider::scalein::settings::DeadlinePolicy;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use serde_json::json;

use super::ca_profile::CaProfile;
use super::checks;
use super::control_plane::Who;
use super::driver::{CleanUpMemory, Deletion, SuiteCa};
use super::rig::{self, binaries, until, More, Rig, Setup, Workloads, SERIAL};

/// A scenario's start, one at a time (the guard returned): its rig ([`rig_for`]; `None`
/// after saying what is missing), then the suite's client as CA of `profile`
/// ([`ca_starts`]).
async fn ca_scenario(
    scenario: &str,
    profile: &'static CaProfile,
    desired: i32,
    hooked: bool,
    more: More,
) -> Option<(tokio::sync::MutexGuard<'static, ()>, Rig, SuiteCa)> {
    let one_at_a_time = SERIAL.lock().await;
    let rig = rig_for(scenario, profile, desired, hooked, more).await?;
    let ca = ca_starts(&rig, profile).await;
    Some((one_at_a_time, rig, ca))
}

/// The rig of a scenario under `profile`: both shipped RBACs, the report naming the
/// profile, `desired` instances of "web".
async fn rig_for(
    scenario: &str,
    profile: &'static CaProfile,
    desired: i32,
    hooked: bool,
    more: More,
) -> Option<Rig> {
    let bin = binaries(&format!("{scenario} ({})", profile.driver()))?;
    let setup = Setup {
        desired,
        hooked,
        real: None,
        workloads: Workloads::Budgeted,
    };
    let more = More {
        ca_rbac: true,
        driver: profile.driver(),
        ..more
    };
    Some(Rig::start_more(scenario, &bin, setup, more).await)
}

/// The suite's client as CA of `profile`, as CA's ServiceAccount, on the rig's service;
/// started as that CA starts (DRA watches, clean-up of its marks, a first loop, the
/// template), its loop then kept going.
async fn ca_starts(rig: &Rig, profile: &'static CaProfile) -> SuiteCa {
    let ca = SuiteCa::new(
        profile,
        rig.ca.clone(),
        rig.cp.client(Who::Service).await.unwrap(),
        "web",
    );
    rig.report.step(&format!(
        "CA {} starts as its ServiceAccount{}: clean-up of its marks, first loop, template ({:?})",
        profile.name,
        if profile.dra_watches {
            " (list and watch resource.k8s.io deviceclasses, resourceclaims, resourceslices)"
        } else {
            ""
        },
        profile.template
    ));
    ca.start().await.unwrap_or_else(|e| {
        panic!(
            "{e}\nwhat CA {} does here, from its source:\n{}",
            profile.name,
            profile.cite()
        )
    });
    ca.keep_looping();
    ca
}

/// CA's loop stopped, then [`ca_saw_no_errors`] and the service's own counts of what it
/// answered ([`Rig::no_provider_errors`]).
fn ca_and_service_saw_no_errors(rig: &Rig, ca: &SuiteCa) {
    ca_stops_having_seen_no_error(rig, ca);
    rig.report.step("check: no error answered to CA's calls");
    rig.no_provider_errors(&[]);
}

/// CA's loop stopped, then [`ca_saw_no_errors`].
fn ca_stops_having_seen_no_error(rig: &Rig, ca: &SuiteCa) {
    ca.stop_loop();
    ca_saw_no_errors(rig, ca);
}

/// No call of the client was answered with an error other than Unimplemented.
fn ca_saw_no_errors(rig: &Rig, ca: &SuiteCa) {
    rig.report
        .step("check: CA saw no error from the service (its own record of every answer)");
    let errors = ca.errors();
    assert!(
        errors.is_empty(),
        "the service answered CA {} with errors: {errors:#?}",
        ca.profile.name
    );
}

/// CA's scale-down of `nodes`, every node deleted.
async fn ca_deletes(rig: &Rig, ca: &SuiteCa, nodes: &[(String, String)]) {
    let names: Vec<String> = nodes.iter().map(|(n, _)| n.clone()).collect();
    let results = ca.scale_down(&names).await;
    let not: Vec<_> = results
        .iter()
        .filter(|(_, r)| **r != Deletion::Deleted)
        .collect();
    assert!(
        not.is_empty(),
        "CA {} did not get its nodes deleted: {not:?}",
        ca.profile.name
    );
    let _ = rig;
}

pub async fn scale_up_from_pending_pods(profile: &'static CaProfile) {
    let Some((_one_at_a_time, mut rig, ca)) = ca_scenario(
        "scale-up from pending pods",
        profile,
        3,
        false,
        More::default(),
    )
    .await
    else {
        return;
    };
    rig.report
        .step("the app grows to 5 replicas: two pods find no node (one per node)");
    rig::scale_app(&rig.admin, 5).await;
    until("the scheduler to find two pods unschedulable", 60, || {
        let ca = ca.clone();
        async move { ca.unschedulable_pods().await.map(|p| p.len()) == Ok(2) }
    })
    .await;
    rig.report
        .scale_in_begins("CA scales up for the pending pods (template, NodeGroupIncreaseSize)");
    let delta = ca
        .scale_up_for(2)
        .await
        .unwrap_or_else(|e| panic!("CA {}: {e}", profile.name));
    assert_eq!(delta, 2, "CA asks for one node per pending pod");
    rig.report
        .step("wait for two new Ready Nodes and every app pod Ready on them");
    let started = Instant::now();
    until("5 Nodes and 5 app pods Ready", 90, || {
        let admin = rig.admin.clone();
        let k = rig.kubelet.clone();
        async move { k.nodes().len() == 5 && rig::app_ready(&admin).await == 5 }
    })
    .await;
    *rig.report.scale_in_secs.lock() = Some(started.elapsed().as_secs_f64());
    rig.report
        .step("check: CA's target and the ASG's desired capacity are 5");
    assert_eq!(rig.ca_target().await, 5, "the target size CA reads");
    assert_eq!(
        rig.cloud.desired("web"),
        Some(5),
        "the ASG's desired capacity"
    );
    rig.report
        .step("check: CA's pods are scheduled: none unschedulable");
    assert_eq!(ca.unschedulable_pods().await, Ok(vec![]));
    ca_and_service_saw_no_errors(&rig, &ca);
}

/// CA scales in two occupied nodes, with (`hooked`) or without our lifecycle hook: both
/// drain at once under the real disruption controller's budget, DaemonSet pods last,
/// then each instance ends once.
pub async fn ca_scale_in_of_occupied_nodes(profile: &'static CaProfile, hooked: bool) {
    let _one_at_a_time = SERIAL.lock().await;
    let name = if hooked {
        "CA scale-in, hook"
    } else {
        "CA scale-in, direct"
    };
    let Some(mut rig) = rig_for(name, profile, 5, hooked, More::default()).await else {
        return;
    };
    if hooked {
        rig.run_lifecycle_loop();
    }
    let ca = ca_starts(&rig, profile).await;
    let victims: Vec<(String, String)> = rig.occupied().await.into_iter().take(2).collect();
    assert_eq!(victims.len(), 2, "two occupied nodes");
    rig.report.scale_in_begins(&format!(
        "CA {} scales down two occupied nodes (marks, then per node GetOptions and one DeleteNodes, in parallel)",
        profile.name
    ));
    ca_deletes(&rig, &ca, &victims).await;
    if !hooked {
        assert_eq!(
            rig.ca_target().await,
            3,
            "direct mode reports the decrease at once"
        );
    }
    rig.ends_keeping_promises(&victims, 3, 2, hooked).await;
    ca_stops_having_seen_no_error(&rig, &ca);
}

/// CA run with `--node-deletion-batcher-interval`: the nodes of a scale-down go in
/// one NodeGroupDeleteNodes. Two occupied nodes, direct mode: the one call is
/// answered OK within CA's deadline, CA's target drops by two at once, and each node
/// is drained keeping the promises.
pub async fn ca_scale_in_batched(profile: &'static CaProfile) {
    let Some((_one_at_a_time, mut rig, ca)) =
        ca_scenario("CA scale-in, batched", profile, 5, false, More::default()).await
    else {
        return;
    };
    let victims: Vec<(String, String)> = rig.occupied().await.into_iter().take(2).collect();
    assert_eq!(victims.len(), 2, "two occupied nodes");
    rig.report.scale_in_begins(&format!(
        "CA {} with a batcher interval of 1 s scales down two occupied nodes in one DeleteNodes",
        profile.name
    ));
    let names: Vec<String> = victims.iter().map(|(n, _)| n.clone()).collect();
    let deletes_before = ca.count("NodeGroupDeleteNodes");
    let results = ca.scale_down_batched(&names, Duration::from_secs(1)).await;
    assert!(
        results.values().all(|r| *r == Deletion::Deleted),
        "CA {} did not get its batch deleted: {results:?}",
        profile.name
    );
    assert_eq!(
        ca.count("NodeGroupDeleteNodes") - deletes_before,
        1,
        "one call for the batch"
    );
    assert_eq!(rig.ca_target().await, 3, "the batch's decrease at once");
    rig.ends_keeping_promises(&victims, 3, 2, false).await;
    ca_stops_having_seen_no_error(&rig, &ca);
}

/// A group held at its MinSize loses an instance and the ASG's relaunch fails for
/// capacity; a pod left pending makes CA scale up, which fails too. CA's loops go on
/// (no error ends them), CA deletes only placeholders that carry the out-of-resources
/// error, is never asked to take the group below its min, and no live instance ends.
pub async fn a_group_at_min_whose_relaunch_fails(profile: &'static CaProfile) {
    let more = More {
        min: 3,
        ..More::default()
    };
    let Some((_one_at_a_time, rig, ca)) = ca_scenario(
        "a group at MinSize whose relaunch fails",
        profile,
        3,
        false,
        more,
    )
    .await
    else {
        return;
    };
    let mut memory = CleanUpMemory::default();
    let mut asked_all = Vec::new();
    // CA's cache of the group's instances holds the three live ones when one dies:
    // for up to two minutes CA goes on seeing the dead one, unregistered.
    let (asked, _) = ca_loop(
        &rig,
        &ca,
        &mut memory,
        "CA's loop 0: the group's three instances, cached for two minutes",
    )
    .await;
    asked_all.extend(asked);
    let (dead_node, dead) = rig.an_instance_dies_relaunches_failing().await;
    until("the dead instance's Node to go", 30, || {
        let k = rig.kubelet.clone();
        let n = dead_node.clone();
        async move { !k.nodes().contains_key(&n) }
    })
    .await;
    until("AWS to list the dead instance no more", 30, || {
        let ca = ca.clone();
        let dead = dead.clone();
        async move {
            let _ = ca.refresh().await;
            ca.instances()
                .await
                .is_ok_and(|l| !l.iter().any(|i| i.id.ends_with(&format!("/{dead}"))))
        }
    })
    .await;
    let before = live(&rig);
    assert_eq!(before.len(), 2);

    for i in 1..=6 {
        if i == 4 {
            // Two minutes on: CA's cache refresh drops the dead instance and shows the
            // placeholder the ASG cannot fill.
            memory.instances_read_again();
        }
        let which = if i < 4 {
            "its cached list still names the dead instance"
        } else {
            "its list read again shows the placeholder"
        };
        let (asked, logged) = ca_loop(
            &rig,
            &ca,
            &mut memory,
            &format!("CA's loop {i} at min ({which}): must go on"),
        )
        .await;
        eprintln!("e2e: CA's loop {i}: asked to delete {asked:?}; {logged:?}");
        asked_all.extend(asked);
    }
    rig.report
        .step("the app's pod left pending: CA scales up by one, and the launch fails");
    // The pod GC controller deletes pods bound to a Node that is gone (after its own
    // quarantine); played here at once, so the ReplicaSet's replacement is created.
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::all(rig.admin.clone());
    let on_dead = pods
        .list(&kube::api::ListParams::default().fields(&format!("spec.nodeName={dead_node}")))
        .await
        .expect("list the dead node's pods");
    for p in on_dead.items {
        let ns = p.metadata.namespace.clone().unwrap_or_default();
        let api: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(rig.admin.clone(), &ns);
        let _ = api
            .delete(
                &p.metadata.name.clone().unwrap_or_default(),
                &kube::api::DeleteParams::default().grace_period(0),
            )
            .await;
    }
    let end = Instant::now() + Duration::from_secs(60);
    while ca.unschedulable_pods().await.map(|p| p.len()) != Ok(1) {
        if Instant::now() > end {
            let all = pods.list(&Default::default()).await.expect("list pods");
            let seen: Vec<String> = all
                .items
                .iter()
                .map(|p| {
                    format!(
                        "{}/{} on {:?}: {:?}",
                        p.metadata.namespace.clone().unwrap_or_default(),
                        p.metadata.name.clone().unwrap_or_default(),
                        p.spec.as_ref().and_then(|s| s.node_name.clone()),
                        p.status.as_ref().and_then(|s| s.conditions.clone())
                    )
                })
                .collect();
            panic!("timed out after 60 s waiting for one unschedulable app pod; pods: {seen:#?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        ca.scale_up_for(1)
            .await
            .unwrap_or_else(|e| panic!("CA {}: {e}", profile.name)),
        1
    );
    // A group scaling up has its cache entry dropped every loop.
    memory.instances_read_again();
    until("a placeholder with an out-of-resources error", 30, || {
        let ca = ca.clone();
        async move {
            let _ = ca.refresh().await;
            ca.instances().await.is_ok_and(|l| {
                l.iter().any(|i| {
                    i.status
                        .as_ref()
                        .and_then(|s| s.error_info.as_ref())
                        .is_some_and(|e| e.instance_error_class == 1)
                })
            })
        }
    })
    .await;
    for i in 7..=10 {
        memory.instances_read_again();
        let (asked, logged) = ca_loop(
            &rig,
            &ca,
            &mut memory,
            &format!("CA's loop {i} after the failed scale-up: deletes the errored placeholder"),
        )
        .await;
        eprintln!("e2e: CA's loop {i}: asked to delete {asked:?}; {logged:?}");
        asked_all.extend(asked);
    }
    rig.report
        .step("check: CA asked to delete placeholders only, never a live instance");
    for id in &asked_all {
        let iid = id.rsplit('/').next().unwrap_or_default();
        assert!(
            !before.contains(iid),
            "CA was asked to delete a live instance: {id} (all asked: {asked_all:?})"
        );
    }
    assert!(
        !asked_all.is_empty(),
        "CA never deleted the errored placeholder"
    );
    rig.report
        .step("check: the group stays at its min; only the dead instance ended");
    assert_eq!(
        rig.cloud.desired("web"),
        Some(3),
        "the ASG's desired capacity"
    );
    let target = ca.target_size().await.expect("NodeGroupTargetSize");
    assert_eq!(target, 3, "CA's target after its clean-up");
    assert_eq!(rig.kubelet.instances_ended(), vec![dead.clone()]);
    assert_eq!(live(&rig), before, "the live instances");
    ca_and_service_saw_no_errors(&rig, &ca);
}

/// The group has two option tags, one malformed: NodeGroupGetOptions must never answer
/// an error other than Unimplemented (CA would skip the node), so CA's scale-down of an
/// occupied node goes through and the drain keeps every promise. CA <= 1.34 reads the
/// good tag's value in its own Duration fields; CA >= 1.35 gets Unimplemented (the
/// service's default for a CA without MaxNodeStartupTime on the wire) and keeps its own.
pub async fn option_tags_with_one_malformed(profile: &'static CaProfile) {
    let more = More::option_tags_one_malformed("5m");
    let Some((_one_at_a_time, mut rig, ca)) =
        ca_scenario("option tags, one malformed", profile, 4, false, more).await
    else {
        return;
    };
    rig.report.step(&format!(
        "NodeGroupGetOptions as CA {} sends it ({:?} Durations): no error but Unimplemented",
        profile.name, profile.durations
    ));
    let read = ca.options().await.unwrap_or_else(|s| {
        panic!(
            "NodeGroupGetOptions answered {:?} ({}): CA {} would never scale this group down",
            s.code(),
            s.message(),
            profile.name
        )
    });
    eprintln!("e2e: CA {} reads the options {read:?}", profile.name);
    if let Some(o) = &read {
        assert_eq!(
            o.scale_down_unneeded,
            Duration::from_secs(300),
            "CA {} reads scaleDownUnneededTime from its {:?} fields",
            profile.name,
            profile.durations
        );
        assert!(
            o.max_node_provision > Duration::ZERO,
            "CA {} would read MaxNodeProvisionTime 0",
            profile.name
        );
    }
    let victims: Vec<(String, String)> = rig.occupied().await.into_iter().take(1).collect();
    rig.report
        .scale_in_begins("CA scales down an occupied node of the group with the malformed tag");
    ca_deletes(&rig, &ca, &victims).await;
    rig.ends_keeping_promises(&victims, 3, 1, false).await;
    ca_stops_having_seen_no_error(&rig, &ca);
}

/// CA marks a node (CA >= 1.34: cordon and taint; older: taint) and deletes it; a pod
/// whose budget never allows its eviction keeps the drain in its workload phase past the
/// deadline, and the `abandon` policy gives the node back: schedulable, without the
/// service's taint or CA's, the instance running, CA's target counting it again, no
/// DaemonSet pod asked to leave.
pub async fn a_drain_abandoned_after_cas_cordon(profile: &'static CaProfile) {
    let mut settings = rig::settings();
    settings.workload_deadline = Duration::from_secs(5);
    settings.workload_deadline_policy = DeadlinePolicy::Abandon;
    let more = More {
        settings,
        ..More::default()
    };
    let Some((_one_at_a_time, mut rig, ca)) = ca_scenario(
        "a drain abandoned after CA's cordon",
        profile,
        4,
        false,
        more,
    )
    .await
    else {
        return;
    };
    let (node, iid) = rig.occupied().await.remove(0);
    rig.report
        .step("a pod on the node whose budget allows no eviction (minAvailable 1 of 1)");
    rig::create(
        &rig.admin,
        Some("shop"),
        json!({
            "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "pinned"},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "pinned"}},
                "template": {"metadata": {"labels": {"app": "pinned"}}, "spec": {
                    "nodeSelector": {"kubernetes.io/hostname": node},
                    "containers": [{"name": "main", "image": "e2e/app:1"}]}}}
        }),
    )
    .await;
    rig::create(
        &rig.admin,
        Some("shop"),
        json!({
            "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": "pinned"},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "pinned"}}}
        }),
    )
    .await;
    rig::until_ready_on(
        &rig.admin,
        "shop/pinned-",
        &node,
        "the pinned pod Ready on the node",
    )
    .await;
    rig.report.scale_in_begins(&format!(
        "CA {} marks the node ({}) and deletes it",
        profile.name,
        if profile.cordons {
            "cordon + ToBeDeletedByClusterAutoscaler"
        } else {
            "ToBeDeletedByClusterAutoscaler only"
        }
    ));
    ca_deletes(&rig, &ca, &[(node.clone(), iid.clone())]).await;
    rig.report.step(
        "wait for the drain to be abandoned at the workload deadline and the node handed back",
    );
    let nodes: Api<Node> = Api::all(rig.admin.clone());
    let started = Instant::now();
    let end = Instant::now() + Duration::from_secs(60);
    loop {
        let n = nodes.get(&node).await.expect("the node");
        match checks::handed_back(&n) {
            Ok(()) => break,
            Err(e) if Instant::now() > end => panic!(
                "timed out after 60 s waiting for the node to be handed back: {e}\nunschedulable: {:?}\ntaints: {:?}\nannotations: {:?}\nthe service's Events:\n{}",
                n.spec.as_ref().and_then(|s| s.unschedulable),
                n.spec.as_ref().and_then(|s| s.taints.clone()),
                n.metadata.annotations,
                events_text(&rig.admin).await
            ),
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
    *rig.report.scale_in_secs.lock() = Some(started.elapsed().as_secs_f64());
    rig.report
        .step("check: the node stays handed back (read again after CA's next loops)");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let n = nodes.get(&node).await.expect("the node");
    checks::handed_back(&n).unwrap_or_else(|e| panic!("after the abandon: {e}"));
    rig.report
        .step("check: the instance runs, nothing ended, CA's target counts the node again");
    assert!(
        !rig.kubelet.instances_ended().contains(&iid),
        "the instance ended"
    );
    assert_eq!(
        rig.cloud
            .calls()
            .get("terminate_instance")
            .copied()
            .unwrap_or(0),
        0
    );
    assert_eq!(rig.cloud.desired("web"), Some(4));
    assert_eq!(rig.ca_target().await, 4, "the target size CA reads");
    rig.report
        .step("check: no DaemonSet pod of the node was asked to leave; no pod deleted");
    let stops = rig.kubelet.stops();
    let ds: Vec<_> = stops
        .iter()
        .filter(|s| s.node == node && s.daemonset)
        .collect();
    assert!(ds.is_empty(), "DaemonSet pods stopped: {ds:?}");
    checks::evictions_only(&rig.cp.audit(), &stops, std::slice::from_ref(&node))
        .unwrap_or_else(|e| panic!("{e}"));
    ca_and_service_saw_no_errors(&rig, &ca);
}

/// CA deletes an occupied node and is restarted while the service drains it: the new
/// CA's start-up clean-up removes its taint (and, >= 1.34, its cordon) from the node; the
/// drain still finishes DaemonSet-last and ends the instance once.
pub async fn ca_restarted_mid_drain(profile: &'static CaProfile) {
    let Some((_one_at_a_time, mut rig, ca)) =
        ca_scenario("CA restarted mid-drain", profile, 4, false, More::default()).await
    else {
        return;
    };
    let victims: Vec<(String, String)> = rig.occupied().await.into_iter().take(1).collect();
    let (node, _) = victims[0].clone();
    rig.report
        .scale_in_begins("CA scales down an occupied node");
    ca_deletes(&rig, &ca, &victims).await;
    rig.report
        .step("wait for the drain to begin (a pod of the node stopping)");
    until("a pod of the node to stop", 60, || {
        let k = rig.kubelet.clone();
        let node = node.clone();
        async move { k.stops().iter().any(|s| s.node == node) }
    })
    .await;
    rig.report.step(&format!(
        "CA {} restarts: its start-up clean-up runs while the service drains",
        profile.name
    ));
    ca.stop_loop();
    let again = ca.restarted(rig.ca.clone());
    let cleaned = again
        .clean_all_to_be_deleted()
        .await
        .unwrap_or_else(|e| panic!("CA's start-up clean-up: {e}"));
    assert!(
        cleaned.contains(&node) || rig.kubelet.instances_ended().contains(&victims[0].1),
        "CA's clean-up found its taint on {node}: {cleaned:?}"
    );
    again.start().await.unwrap_or_else(|e| panic!("{e}"));
    again.keep_looping();
    rig.ends_keeping_promises(&victims, 3, 1, false).await;
    ca_stops_having_seen_no_error(&rig, &again);
}

/// Every Event in the cluster (reason, object, message), for a failure message.
async fn events_text(admin: &kube::Client) -> String {
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::all(admin.clone());
    match events.list(&Default::default()).await {
        Ok(l) => l
            .items
            .iter()
            .map(|e| {
                format!(
                    "  {} {} {}/{}: {}",
                    e.metadata
                        .creation_timestamp
                        .as_ref()
                        .map(|t| t.0.to_string())
                        .unwrap_or_default(),
                    e.reason.clone().unwrap_or_default(),
                    e.involved_object.kind.clone().unwrap_or_default(),
                    e.involved_object.name.clone().unwrap_or_default(),
                    e.message.clone().unwrap_or_default()
                )
            })
            .collect::<Vec<_>>()
            .join("\n"),
        Err(e) => format!("  (no Events: {e})"),
    }
}

/// The instances with a Node.
fn live(rig: &Rig) -> BTreeSet<String> {
    rig.kubelet.nodes().into_values().collect()
}

/// One of CA's loops over the group's unregistered instances; its end fails the step.
async fn ca_loop(
    rig: &Rig,
    ca: &SuiteCa,
    memory: &mut CleanUpMemory,
    label: &str,
) -> (Vec<String>, Vec<String>) {
    rig.report.step(label);
    ca.clean_up_loop(memory, &live(rig))
        .await
        .unwrap_or_else(|e| panic!("CA's loop ended: {e}"))
}

//! The end-to-end suite on a real control plane: etcd, kube-apiserver,
//! kube-controller-manager and kube-scheduler built from the Go module proxy by
//! `scripts/e2e/build.sh`, the service running as the ServiceAccount the shipped RBAC
//! binds, nodes played by the suite's fake kubelet, and the gRPC calls cluster-autoscaler
//! makes, in the shapes it sends them. Run it with `scripts/e2e.sh`: without
//! `E2E_K8S_BIN` every scenario says it was skipped (and fails when `E2E_REQUIRED=1`).
//!
//! Every scenario where CA decides (`tests/e2e/ca_scenarios.rs`) runs once per CA
//! profile (`tests/e2e/ca_profile.rs`: 1.31, 1.34, 1.36, master), each as its own test
//! (`ca_1_36::scale_up_from_pending_pods`), driven by the suite's client playing that
//! version (`tests/e2e/driver.rs`).
//!
//! Each scenario writes one row (scenario, driver, Kubernetes version, PASS/FAIL, the
//! failing step, the time from the scale-in to the last instance's end) to `E2E_RESULTS`.

mod support;

#[path = "e2e/ca_profile.rs"]
mod ca_profile;
#[path = "e2e/ca_scenarios.rs"]
mod ca_scenarios;
#[path = "e2e/checks.rs"]
mod checks;
#[path = "e2e/control_plane.rs"]
mod control_plane;
#[path = "e2e/driver.rs"]
mod driver;
#[path = "e2e/kubelet.rs"]
mod kubelet;
#[path = "e2e/real_ca.rs"]
mod real_ca;
#[path = "e2e/real_ca_scenarios.rs"]
mod real_ca_scenarios;
#[path = "e2e/real_node.rs"]
mod real_node;
#[path = "e2e/rig.rs"]
mod rig;

use rig::{binaries, other_drainer, until, Rig, SERIAL};

/// The ASG ends an instance on its own (a scale-in policy, a rebalance, a refresh):
/// the hook holds it, the service drains it, and is killed mid-drain; the new process
/// finds the held instance and finishes the drain, completing the action once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn asg_ends_an_instance_and_the_service_restarts_mid_drain() {
    let Some(bin) = binaries("asg_ends_an_instance_and_the_service_restarts_mid_drain") else {
        return;
    };
    let _one_at_a_time = SERIAL.lock().await;
    let mut rig = Rig::start("ASG scale-in, hook, restart mid-drain", &bin, 4, true).await;
    rig.run_lifecycle_loop();
    rig.report.scale_in_begins("the ASG scales in by one");
    let ended = rig.cloud.external_scale_in("web", 1).unwrap();
    assert_eq!(ended.len(), 1);
    let node = kubelet::node_name(&ended[0]);
    let victims = vec![(node.clone(), ended[0].clone())];
    rig.report
        .step("wait for the drain to begin (a pod of the node stopping)");
    until("a pod of the node to stop", 60, || {
        let k = rig.kubelet.clone();
        let node = node.clone();
        let iid = ended[0].clone();
        async move { k.stops().iter().any(|s| s.node == node) || k.instances_ended().contains(&iid) }
    })
    .await;
    rig.report
        .step("kill the service mid-drain and start a new one");
    rig.restart_service().await;
    // The ASG picked its own victim and lowered its own desired capacity: 4 -> 3.
    rig.ends_keeping_promises(&victims, 3, 0, true).await;
}

/// Disruption budgets on the real control plane (issue 71): an instance refresh asks
/// AWS to end all six instances of two groups at once (each through
/// TerminateInstanceInAutoScalingGroup without a decrement, as a refresh replaces its
/// instances; our hook holds each), under one budget of 2 over every group. Read from
/// outside: never more than 2 nodes draining at once (a node drains from the first
/// eviction of one of its pods to its last pod's exit), no evicted pod lands on a node
/// of the refresh, each instance ends only after its drain, the app's budget holds,
/// DaemonSet pods go last, each action is completed once and no hold times out.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_instance_refresh_of_six_over_two_groups_drains_two_at_a_time() {
    use ca_asg_provider::cloud::Cloud as _;
    use ca_asg_provider::scalein::decide::budget::{Budget, Nodes};
    use ca_asg_provider::scalein::ScaleInSettings;
    use k8s_openapi::api::events::v1::Event;

    let Some(bin) = binaries("an_instance_refresh_of_six_over_two_groups_drains_two_at_a_time")
    else {
        return;
    };
    let _one_at_a_time = SERIAL.lock().await;
    let setup = rig::Setup {
        desired: 3,
        hooked: true,
        real: None,
        workloads: rig::Workloads::Budgeted,
    };
    let more = rig::More {
        second_group: 3,
        settings: ScaleInSettings {
            budgets: vec![Budget::always("two-at-a-time", Nodes::Count(2))],
            ..rig::settings()
        },
        ..rig::More::default()
    };
    let mut rig = Rig::start_more(
        "instance refresh of 6 over 2 groups, budget of 2",
        &bin,
        setup,
        more,
    )
    .await;
    rig.run_lifecycle_loop();
    let refreshed: Vec<(String, String)> = rig.kubelet.nodes().into_iter().collect();
    assert_eq!(refreshed.len(), 6, "{refreshed:?}");
    rig.report
        .scale_in_begins("an instance refresh asks AWS to end all six instances at once");
    for (_, iid) in &refreshed {
        rig.cloud
            .terminate_instance(iid, false)
            .await
            .expect("the refresh ends the instance");
    }
    rig.report.step("wait for the instances to end");
    rig.wait_ended(&rig::ids(&refreshed), 240).await;

    let audit = rig.cp.audit();
    let stops = rig.kubelet.stops();
    let nodes: Vec<String> = refreshed.iter().map(|(n, _)| n.clone()).collect();
    let asked = rig.report.scale_in_asked.lock().expect("asked");
    rig.report
        .step("check: never more than 2 nodes draining at once");
    let (most, drains) =
        checks::most_draining_at_once(&audit, &stops, &nodes).unwrap_or_else(|e| panic!("{e}"));
    assert!(
        (1..=2).contains(&most),
        "{most} nodes drained at once under a budget of 2: {drains:?}\nthe pods' stops: {:#?}",
        stops
            .iter()
            .map(|s| (&s.pod, &s.node, s.daemonset, s.began, s.ended, &s.how))
            .collect::<Vec<_>>()
    );
    rig.report
        .step("check: the budget held drains back, and said so");
    let events: kube::Api<Event> = kube::Api::all(rig.admin.clone());
    let waited = events
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("DrainWaitingForBudget"))
        .filter(|e| {
            e.note
                .as_deref()
                .is_some_and(|n| n.contains("two-at-a-time"))
        })
        .count();
    assert!(waited >= 1, "no drain waited for the budget");
    eprintln!(
        "e2e: at most {most} of 6 nodes drained at once; {waited} drains waited for the budget"
    );
    rig.report
        .step("check: no evicted pod landed on a node of the refresh");
    checks::none_landed_on(&stops, &nodes, asked).unwrap_or_else(|e| panic!("{e}"));
    rig.report.step("check: evictions only, none twice");
    checks::evictions_only(&audit, &stops, &nodes).unwrap_or_else(|e| panic!("{e}"));
    rig.report
        .step("check: the app's budget held (Ready app pods never below 2)");
    let fewest = checks::fewest_ready(
        &rig.kubelet.readies(),
        &stops,
        "shop/app-",
        rig::APP_REPLICAS,
    );
    assert!(fewest >= rig::APP_MIN_READY, "only {fewest} app pods Ready");
    rig.report
        .step("check: DaemonSet pods last, each instance ended after its drain");
    checks::daemonset_last(&stops, &nodes, asked).unwrap_or_else(|e| panic!("{e}"));
    rig.hooks_completed_once(&rig::ids(&refreshed));
    assert!(
        rig.cloud.hook_timeouts().is_empty(),
        "a held hook timed out"
    );
    assert_eq!(
        (
            rig.cloud.desired("web"),
            rig.cloud.desired(rig::SECOND_GROUP)
        ),
        (Some(3), Some(3)),
        "a refresh keeps each group's desired capacity"
    );
    rig.no_provider_errors(&[]);
}

/// The last mile (issue 73) on the real control plane: the ASG ends one of three
/// instances on its own, our hook holds it and the service drains it. Each instance is
/// a target of an ALB's `instance` group (delay 8 s) and an NLB's `ip` group at its
/// address (delay 3 s): the memory cloud plays ELBv2 (`draining` for the delay, then
/// `unused`), and the test plays the AWS Load Balancer Controller: it deregisters the
/// node's ALB target once the real API server shows its
/// `node.kubernetes.io/exclude-from-external-load-balancers` label (the cordon sets
/// it), and, slower, its NLB target only once the Node says the wait began (so that
/// target drains during the wait). The action is completed only after both targets
/// read `unused` and after every pod of the node stopped; the Node carried the wait
/// for `status` and an Event named the NLB; the other instances' targets were left
/// alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_instance_leaves_its_load_balancers_before_it_ends() {
    use ca_asg_provider::cloud::memory::{LbEvent, MemoryCloud};
    use ca_asg_provider::cloud::Cloud as _;
    use ca_asg_provider::scalein::decide::last_mile;
    use ca_asg_provider::scalein::stages::cordon::LB_EXCLUDE_LABEL;
    use ca_asg_provider::scalein::{LoadBalancerWait, ScaleInSettings};
    use k8s_openapi::api::core::v1::Node;
    use k8s_openapi::api::events::v1::Event;
    use std::time::{Duration, Instant};

    let Some(bin) = binaries("the_instance_leaves_its_load_balancers_before_it_ends") else {
        return;
    };
    let _one_at_a_time = SERIAL.lock().await;
    let setup = rig::Setup {
        desired: 3,
        hooked: true,
        real: None,
        workloads: rig::Workloads::Budgeted,
    };
    let more = rig::More {
        settings: ScaleInSettings {
            load_balancers: LoadBalancerWait {
                enabled: true,
                margin: Duration::from_secs(2),
                poll: Duration::from_millis(500),
                deregister: false,
            },
            ..rig::settings()
        },
        ..rig::More::default()
    };
    let mut rig = Rig::start_more(
        "the last mile: out of the load balancers, then ended",
        &bin,
        setup,
        more,
    )
    .await;
    rig.run_lifecycle_loop();
    let all: Vec<(String, String)> = rig.kubelet.nodes().into_iter().collect();
    assert_eq!(all.len(), 3, "{all:?}");
    let (node, iid) = all[0].clone();
    let alb = rig.cloud.add_target_group("web-alb", "instance", "8");
    let nlb = rig.cloud.add_target_group("web-nlb", "ip", "3");
    let targets = |iid: &str| {
        [
            (alb.clone(), iid.to_string()),
            (
                nlb.clone(),
                MemoryCloud::address_of(iid).expect("an address"),
            ),
        ]
    };
    for (_, i) in &all {
        for (arn, id) in targets(i) {
            rig.cloud.register_target(&arn, &id);
        }
    }

    // The AWS Load Balancer Controller, as far as this scenario needs it: a node
    // labelled for exclusion leaves the ALB at once and the NLB once the wait began
    // (the Node's annotation, which `status` reads).
    let controller = {
        let nodes: kube::Api<Node> = kube::Api::all(rig.admin.clone());
        let (cloud, kubelet, node, iid) = (
            rig.cloud.clone(),
            rig.kubelet.clone(),
            node.clone(),
            iid.clone(),
        );
        let [(alb_arn, alb_id), (nlb_arn, nlb_id)] = targets(&iid);
        tokio::spawn(async move {
            let (mut labelled, mut noted) = (None, None);
            let until = Instant::now() + Duration::from_secs(180);
            while Instant::now() < until && !kubelet.instances_ended().contains(&iid) {
                if let Ok(n) = nodes.get(&node).await {
                    let labels = n.metadata.labels.unwrap_or_default();
                    if labelled.is_none() && labels.contains_key(LB_EXCLUDE_LABEL) {
                        labelled = Some(Instant::now());
                        cloud.deregister_target(&alb_arn, &alb_id);
                    }
                    let note = n
                        .metadata
                        .annotations
                        .unwrap_or_default()
                        .get(last_mile::ANNOTATION)
                        .and_then(|a| last_mile::Waiting::read(a));
                    if noted.is_none() && note.is_some() {
                        cloud.deregister_target(&nlb_arn, &nlb_id);
                    }
                    noted = noted.or(note);
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            (labelled, noted)
        })
    };

    rig.report
        .scale_in_begins("the ASG ends one instance on its own");
    rig.cloud
        .terminate_instance(&iid, false)
        .await
        .expect("the ASG ends the instance");
    rig.report.step("wait for the instance to end");
    rig.wait_ended(std::slice::from_ref(&iid), 180).await;
    let (labelled, noted) = controller.await.expect("the controller");

    rig.report
        .step("check: the node was labelled for exclusion and its targets deregistered");
    assert!(
        labelled.is_some(),
        "the exclusion label never showed on {node}"
    );
    let log = rig.cloud.lb_log_timed();
    let at = |want: &dyn Fn(&LbEvent) -> bool| log.iter().position(|(_, e)| want(e));
    let completed =
        at(&|e| matches!(e, LbEvent::EndCall { instance, completed: true } if *instance == iid))
            .unwrap_or_else(|| panic!("our hook's action was never completed: {log:?}"));
    rig.report
        .step("check: the action completed only after both targets read unused");
    for (arn, id) in targets(&iid) {
        let off = at(&|e| {
            matches!(e, LbEvent::Deregistered { target_group, target, by_service: false }
                if *target_group == arn && *target == id)
        })
        .unwrap_or_else(|| panic!("{id} was never deregistered from {arn}: {log:?}"));
        let out = at(&|e| {
            matches!(e, LbEvent::Answered { target_group, target, state }
                if *target_group == arn && *target == id && state == "unused")
        })
        .unwrap_or_else(|| panic!("{id} never read unused in {arn}: {log:?}"));
        assert!(off < out && out < completed, "{id} in {arn}: {log:?}");
        let waited = log[completed].0.saturating_duration_since(log[off].0);
        eprintln!(
            "e2e: {} deregistered from {} {:.1} s before the action was completed",
            id,
            last_mile::group_name(&arn),
            waited.as_secs_f64()
        );
    }
    rig.report
        .step("check: every pod of the node stopped before the action was completed");
    let completed_utc = chrono::Utc::now()
        - chrono::Duration::from_std(log[completed].0.elapsed()).expect("a duration");
    let stops = rig.kubelet.stops();
    let asked = rig.report.scale_in_asked.lock().expect("asked");
    // The pods the drain found (a DaemonSet pod the controller put back on the
    // cordoned node after its eviction ends with the instance: not the drain's).
    let on_node: Vec<_> = stops
        .iter()
        .filter(|s| s.node == node && s.started < asked)
        .collect();
    assert!(!on_node.is_empty(), "no pod stopped on {node}");
    for s in &on_node {
        assert!(
            s.ended < completed_utc,
            "{} on {node} ended at {} after the action was completed at {completed_utc}",
            s.pod,
            s.ended
        );
    }
    rig.report
        .step("check: the Node said the wait, and an Event named both groups");
    let noted = noted.expect("the Node never carried the wait for the load balancers");
    assert!((1..=2).contains(&noted.groups), "{noted:?}");
    let events: kube::Api<Event> = kube::Api::all(rig.admin.clone());
    let said: Vec<(String, String)> = events
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(node.as_str()))
        .map(|e| (e.reason.unwrap_or_default(), e.note.unwrap_or_default()))
        .collect();
    let waiting = said
        .iter()
        .find(|(r, _)| r == "WaitingForLoadBalancers")
        .unwrap_or_else(|| panic!("{said:?}"));
    assert!(waiting.1.contains("web-nlb"), "{waiting:?}");
    assert!(
        !said.iter().any(|(r, _)| r == "LoadBalancerWaitOver"),
        "{said:?}"
    );
    rig.report
        .step("check: the other instances' targets were left alone");
    for (_, other) in all.iter().skip(1) {
        for (arn, id) in targets(other) {
            let state = rig
                .cloud
                .target_states(&arn)
                .into_iter()
                .find(|(t, _)| *t == id)
                .map(|(_, s)| s);
            assert_eq!(state.as_deref(), Some("healthy"), "{id} in {arn}");
        }
    }
    let audit = rig.cp.audit();
    let nodes = vec![node.clone()];
    rig.report
        .step("check: evictions only, DaemonSet pods last");
    checks::evictions_only(&audit, &stops, &nodes).unwrap_or_else(|e| panic!("{e}"));
    checks::daemonset_last(&stops, &nodes, asked).unwrap_or_else(|e| panic!("{e}"));
    rig.hooks_completed_once(std::slice::from_ref(&iid));
    assert!(
        rig.cloud.hook_timeouts().is_empty(),
        "a held hook timed out"
    );
    rig.no_provider_errors(&[]);
}

/// Warm pools (issue 47): the ASG scales in by one into its warm pool
/// (ReuseOnScaleIn); our hook holds the instance in Warmed:Pending:Wait and the service
/// drains it keeping every promise (evictions only, the budget, DaemonSet pods last,
/// the action completed once, nothing terminated), while CA's target reads one lower.
/// CA then scales up: the ASG takes the same instance from the pool, and its Node,
/// which stayed cordoned in the pool, is handed back with no cordon or taint: the real
/// scheduler places a new pod on it. The hand-back waits 2 s of rest in the pool here
/// (`warm_pool_settle`; 30 s as shipped).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn asg_scales_in_into_its_warm_pool_and_the_reused_node_comes_back() {
    use ca_asg_provider::cloud::{LifecycleState, WarmPool};
    use ca_asg_provider::proto;
    use k8s_openapi::api::core::v1::{Node, Pod};

    let Some(bin) = binaries("asg_scales_in_into_its_warm_pool_and_the_reused_node_comes_back")
    else {
        return;
    };
    let _one_at_a_time = SERIAL.lock().await;
    let setup = rig::Setup {
        desired: 4,
        hooked: true,
        real: None,
        workloads: rig::Workloads::Budgeted,
    };
    let more = rig::More {
        warm_pool: Some(WarmPool {
            min_size: 0,
            max_prepared: None,
            pool_state: "Stopped".into(),
            reuse_on_scale_in: true,
        }),
        settings: ca_asg_provider::scalein::ScaleInSettings {
            warm_pool_settle: std::time::Duration::from_secs(2),
            ..rig::settings()
        },
        ..rig::More::default()
    };
    let mut rig =
        Rig::start_more("ASG scale-in into the warm pool, reused", &bin, setup, more).await;
    rig.run_lifecycle_loop();
    rig.report
        .scale_in_begins("the ASG scales in by one into its warm pool");
    let ended = rig.cloud.external_scale_in("web", 1).unwrap();
    assert_eq!(ended.len(), 1);
    let iid = ended[0].clone();
    let node = kubelet::node_name(&iid);
    let victims = vec![(node.clone(), iid.clone())];
    let resting = |cloud: &ca_asg_provider::cloud::memory::MemoryCloud, iid: &str| {
        cloud
            .pooled()
            .iter()
            .any(|(_, i)| i.id == iid && i.state.as_str() == "Warmed:Stopped")
    };
    rig.report
        .step("wait for the drain to complete our action: the instance rests in the pool");
    until("the instance to rest in the warm pool", 120, || {
        let cloud = rig.cloud.clone();
        let iid = iid.clone();
        async move { resting(&cloud, &iid) }
    })
    .await;
    let began = (*rig.report.scale_in_began.lock()).expect("the scale-in began");
    *rig.report.scale_in_secs.lock() = Some(began.elapsed().as_secs_f64());
    // Every promise of a scale-in, but the instance is kept: no termination, the
    // desired capacity (and CA's target) one lower, no hook timed out.
    rig.check_promises(&victims, 3, 0).await;
    rig.hooks_completed_once(std::slice::from_ref(&iid));
    let nodes: kube::Api<Node> = kube::Api::all(rig.admin.clone());
    rig.report
        .step("check: the Node stays, cordoned, while its instance rests in the pool");
    let n = nodes
        .get(&node)
        .await
        .expect("the Node of a pooled instance stays");
    assert!(
        checks::handed_back(&n).is_err(),
        "a node in the pool must stay cordoned"
    );

    rig.report
        .step("CA scales up by one: the ASG takes the instance back from the pool");
    rig.ca
        .node_group_increase_size(proto::NodeGroupIncreaseSizeRequest {
            id: "web".into(),
            delta: 1,
        })
        .await
        .expect("IncreaseSize");
    until("the same instance in service in the group", 60, || {
        let cloud = rig.cloud.clone();
        let iid = iid.clone();
        async move {
            cloud
                .instances()
                .iter()
                .any(|(_, i)| i.id == iid && i.state == LifecycleState::InService)
        }
    })
    .await;
    rig.report.step("wait for the Node to be handed back");
    until("the reused Node handed back", 60, || {
        let nodes = nodes.clone();
        let node = node.clone();
        async move {
            nodes
                .get(&node)
                .await
                .is_ok_and(|n| checks::handed_back(&n).is_ok())
        }
    })
    .await;
    let n = nodes.get(&node).await.unwrap();
    let marks: Vec<&String> = n
        .metadata
        .annotations
        .iter()
        .flatten()
        .map(|(k, _)| k)
        .filter(|k| k.starts_with("ca-asg-provider.io/"))
        .collect();
    assert!(marks.is_empty(), "marks left on the reused Node: {marks:?}");
    assert_eq!(rig.ca_target().await, 4, "the target size CA reads");

    rig.report
        .step("the real scheduler places a new pod on the reused node");
    let pods: kube::Api<Pod> = kube::Api::namespaced(rig.admin.clone(), "shop");
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "after-the-pool"},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "containers": [{"name": "c", "image": "busybox", "command": ["sleep", "3600"]}],
        },
    }))
    .unwrap();
    pods.create(&Default::default(), &pod)
        .await
        .expect("create the pod");
    until("the new pod bound to the reused node", 60, || {
        let pods = pods.clone();
        let node = node.clone();
        async move {
            pods.get("after-the-pool")
                .await
                .is_ok_and(|p| p.spec.and_then(|s| s.node_name).as_deref() == Some(node.as_str()))
        }
    })
    .await;
    assert_eq!(
        rig.cloud
            .completed_actions()
            .iter()
            .filter(|(a, _)| a.instance_id == iid)
            .count(),
        1,
        "nothing completed again"
    );
}

/// The checks can fail on the real system: CA's own drain with its default
/// `--daemonset-eviction-for-occupied-nodes=true` evicts the log shipper together with
/// the workload, and the DaemonSet-last check says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_checks_catch_a_drain_that_evicts_daemonset_pods_with_the_workload() {
    let Some(bin) =
        binaries("the_checks_catch_a_drain_that_evicts_daemonset_pods_with_the_workload")
    else {
        return;
    };
    let _one_at_a_time = SERIAL.lock().await;
    let rig = Rig::start("checks catch CA's default drain", &bin, 4, false).await;
    let (node, iid) = rig.occupied().await.remove(0);
    rig.report
        .scale_in_begins("evict every pod of the node at once, then end the instance");
    other_drainer(&rig.admin, &rig.cloud, &node, &iid, true).await;
    rig.wait_ended(std::slice::from_ref(&iid), 60).await;
    rig.report.step("the DaemonSet-last check fails");
    let asked = rig.report.scale_in_asked.lock().unwrap();
    let broken = checks::daemonset_last(&rig.kubelet.stops(), std::slice::from_ref(&node), asked);
    assert!(
        broken.is_err(),
        "CA's default drain stopped the log shipper with the app; the check must see it: {:?}",
        rig.kubelet.stops()
    );
    // The storm's count of log shippers stopped early sees it too.
    let stops = rig.kubelet.stops();
    let early = checks::daemonsets_stopped_early(&stops, &node, asked);
    assert!(
        !early.is_empty(),
        "the log shipper of {node} stopped before its app: {stops:?}"
    );
    eprintln!("e2e: as expected, {}", broken.unwrap_err());
}

/// Queue mode, two reasons on one node: a rebalance recommendation cordons it (the
/// default `rebalance: cordon`); an agent with a blanket toleration lands on it anyway;
/// then the ASG ends it and the lifecycle message arrives through the queue. The hook's
/// drain evicts the agent too (it arrived after the cordon, not after the drain began),
/// DaemonSet pods last, the action completed once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn queue_mode_a_rebalance_cordon_then_the_hook() {
    use ca_asg_provider::cloud::queue::MemoryQueue;
    use ca_asg_provider::scalein::sources::queue::Consumer;
    use ca_asg_provider::scalein::{
        decide::notice::RebalanceAction, settings::InterruptionSettings,
    };
    use std::sync::Arc;

    let Some(bin) = binaries("queue_mode_a_rebalance_cordon_then_the_hook") else {
        return;
    };
    let _one_at_a_time = SERIAL.lock().await;
    let mut rig = Rig::start("queue: rebalance cordon, then the hook", &bin, 4, true).await;
    rig.run_lifecycle_loop();
    let queue = Arc::new(MemoryQueue::default());
    let consumer = Consumer::new(
        rig.engine.clone(),
        rig.provider.clone(),
        queue.clone(),
        InterruptionSettings {
            wait: std::time::Duration::from_millis(100),
            rebalance: RebalanceAction::Cordon,
            ..Default::default()
        },
    );
    // The ASG's scale-in takes its newest instance: the one the rebalance names.
    let (_, newest) = rig.cloud.instances().pop().expect("an instance");
    let (node, iid) = (kubelet::node_name(&newest.id), newest.id.clone());

    rig.report
        .step("a rebalance recommendation through the queue cordons the node");
    queue.send(&support::notices::rebalance(&iid));
    support::queue::handle_next(&consumer, &queue).await;
    until("the node cordoned", 30, || {
        let admin = rig.admin.clone();
        let node = node.clone();
        async move {
            let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(admin);
            nodes
                .get(&node)
                .await
                .ok()
                .and_then(|n| n.spec)
                .and_then(|s| s.unschedulable)
                == Some(true)
        }
    })
    .await;

    rig.report
        .step("an agent that tolerates every taint lands on the cordoned node");
    rig::create(
        &rig.admin,
        Some("shop"),
        serde_json::json!({
            "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "agent"},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "agent"}},
                "template": {"metadata": {"labels": {"app": "agent"}}, "spec": {
                    "tolerations": [{"operator": "Exists"}],
                    "nodeSelector": {"kubernetes.io/hostname": node},
                    "containers": [{"name": "main", "image": "e2e/agent:1",
                        "lifecycle": {"preStop": {"exec": {"command": ["sleep", "1"]}}}}]}}}
        }),
    )
    .await;
    rig::until_ready_on(
        &rig.admin,
        "shop/agent-",
        &node,
        "the agent Ready on the node",
    )
    .await;

    rig.report
        .scale_in_begins("the ASG ends the node; its lifecycle message comes through the queue");
    assert_eq!(
        rig.cloud.external_scale_in("web", 1).unwrap(),
        vec![iid.clone()]
    );
    let token = format!("tok-{iid}");
    queue.send(&support::notices::lifecycle(
        "web",
        &iid,
        rig::HOOK,
        Some(&token),
    ));
    support::queue::handle_next(&consumer, &queue).await;
    let victims = vec![(node.clone(), iid.clone())];
    rig.ends_keeping_promises(&victims, 3, 0, true).await;
}

/// One test per scenario where CA decides and per CA profile: `ca_1_31::...`,
/// `ca_1_34::...`, `ca_1_36::...`, `ca_master::...`.
macro_rules! every_profile {
    ($($module:ident => $profile:expr;)*) => {$(
        mod $module {
            use super::ca_scenarios as s;
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn scale_up_from_pending_pods() {
                s::scale_up_from_pending_pods($profile).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn ca_scale_in_of_occupied_nodes_direct() {
                s::ca_scale_in_of_occupied_nodes($profile, false).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn ca_scale_in_of_occupied_nodes_through_the_hook() {
                s::ca_scale_in_of_occupied_nodes($profile, true).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn ca_scale_in_batched() {
                s::ca_scale_in_batched($profile).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn a_group_at_min_whose_relaunch_fails() {
                s::a_group_at_min_whose_relaunch_fails($profile).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn option_tags_with_one_malformed() {
                s::option_tags_with_one_malformed($profile).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn a_drain_abandoned_after_cas_cordon() {
                s::a_drain_abandoned_after_cas_cordon($profile).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn ca_restarted_mid_drain() {
                s::ca_restarted_mid_drain($profile).await
            }
        }
    )*};
}

every_profile! {
    ca_1_31 => &super::ca_profile::CA_1_31;
    ca_1_34 => &super::ca_profile::CA_1_34;
    ca_1_36 => &super::ca_profile::CA_1_36;
    ca_master => &super::ca_profile::CA_MASTER;
}

/// The real-CA tier (issue 43, 4): each cluster-autoscaler binary of `E2E_CA_BINS`
/// (`tests/e2e/real_ca.rs`) drives every scenario of `tests/e2e/real_ca_scenarios.rs`,
/// one row per binary and scenario. Without the variable: one line saying the tier was
/// skipped and why. Every scenario runs even when one fails; the test fails at the end,
/// naming each failed binary and scenario.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn real_ca_tier() {
    use futures::FutureExt as _;
    let bins = match real_ca::binaries_from_env() {
        Ok(b) => b,
        Err(why) => {
            eprintln!("real-CA tier skipped: {why}");
            return;
        }
    };
    let Some(k8s) = binaries("real_ca_tier") else {
        return;
    };
    let _one_at_a_time = SERIAL.lock().await;
    // `E2E_REAL_CA_SCENARIO=TEXT`: only the scenarios whose name contains TEXT.
    let only = std::env::var("E2E_REAL_CA_SCENARIO").ok();
    let mut failed = Vec::new();
    for bin in &bins {
        eprintln!(
            "e2e: real-CA tier with {} (version from its {})",
            bin.label(),
            bin.version_source
        );
        for name in real_ca_scenarios::SCENARIOS {
            if only.as_deref().is_some_and(|o| !name.contains(o)) {
                continue;
            }
            let run = std::panic::AssertUnwindSafe(real_ca_scenarios::run(name, bin, &k8s));
            if run.catch_unwind().await.is_err() {
                failed.push(format!("{name} with {}", bin.label()));
            }
        }
        for (name, why) in real_ca_scenarios::NOT_RUN {
            eprintln!("e2e: {name} with {}: not run ({why})", bin.label());
        }
    }
    assert!(failed.is_empty(), "real-CA scenarios failed: {failed:#?}");
}

/// Issue 72 on the real control plane (the disruption controller computes the budget's
/// status, the service writes as the shipped ServiceAccount): a single replica under
/// `minAvailable: 1` on a node drained as `drain NODE` drains it. The budget is named at
/// the drain's start (one `EvictionDeadlocked` Event, and the Node's `DrainInProgress`
/// condition as `kubectl get node -o jsonpath` reads it), the workload deadline
/// (`proceed`, 6 s) ends the wait (the pod deleted at the deadline less its 2 s grace),
/// `Drained` turns True with the kubelet's conditions kept, and `undrain` sets both
/// False.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_budget_that_never_allows_is_named_and_the_node_says_where_the_drain_is() {
    use ca_asg_provider::commands::undrain;
    use ca_asg_provider::scalein::decide::record::{DrainReason, Why};
    use ca_asg_provider::scalein::decide::undo::Window;
    use ca_asg_provider::scalein::{
        DeadlinePolicy, DrainRequest, Mode, Outcome, ScaleInSettings, Source,
    };
    use k8s_openapi::api::core::v1::Node;
    use k8s_openapi::api::events::v1::Event;
    use serde_json::json;

    let Some(bin) =
        binaries("a_budget_that_never_allows_is_named_and_the_node_says_where_the_drain_is")
    else {
        return;
    };
    let _one_at_a_time = SERIAL.lock().await;
    let setup = rig::Setup {
        desired: 3,
        hooked: false,
        real: None,
        workloads: rig::Workloads::Budgeted,
    };
    let more = rig::More {
        settings: ScaleInSettings {
            workload_deadline: std::time::Duration::from_secs(6),
            workload_deadline_policy: DeadlinePolicy::Proceed,
            ..rig::settings()
        },
        // KEP-5683's gate on, as a cluster that adopts the conditions runs it; every other
        // scenario writes the same conditions with the gate off (its default).
        feature_gates: &["NodeLifecycleConditions=true"],
        ..rig::More::default()
    };
    let gated = bin.knows_gate("NodeLifecycleConditions");
    let rig = Rig::start_more(
        match gated {
            true => "a budget that never allows, Node conditions (NodeLifecycleConditions on)",
            false => "a budget that never allows, Node conditions (no NodeLifecycleConditions gate in this version)",
        },
        &bin,
        setup,
        more,
    )
    .await;
    // A version older than the gate (the matrix's v1.34) runs without it: the conditions
    // are plain conditions there, and the rest of the scenario is the same.
    if gated {
        rig.report
            .step("the API server says NodeLifecycleConditions is on");
        let metrics = rig
            .admin
            .request_text(http::Request::get("/metrics").body(Vec::new()).unwrap())
            .await
            .unwrap();
        assert!(
            metrics
                .lines()
                .any(|l| l.starts_with("kubernetes_feature_enabled{")
                    && l.contains("name=\"NodeLifecycleConditions\"")
                    && l.ends_with(" 1")),
            "kubernetes_feature_enabled for NodeLifecycleConditions is not 1"
        );
    }
    rig.report.step("a single replica under minAvailable: 1");
    rig::create(
        &rig.admin,
        Some("shop"),
        json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "solo"},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "solo"}},
                "template": {"metadata": {"labels": {"app": "solo"}}, "spec": {
                    "terminationGracePeriodSeconds": 2, "containers": rig::containers(1)}}}
        }),
    )
    .await;
    rig::create(
        &rig.admin,
        Some("shop"),
        json!({
            "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": "solo"},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "solo"}}}
        }),
    )
    .await;
    let admin = rig.admin.clone();
    until(
        "the single replica Ready and its budget computed",
        60,
        || {
            let admin = admin.clone();
            async move {
                let pdbs: kube::Api<k8s_openapi::api::policy::v1::PodDisruptionBudget> =
                    kube::Api::namespaced(admin.clone(), "shop");
                let computed = pdbs
                    .get("solo")
                    .await
                    .ok()
                    .and_then(|b| b.status)
                    .is_some_and(|s| s.expected_pods == 1 && s.current_healthy == 1);
                computed
                    && rig::ready_pods(&admin)
                        .await
                        .keys()
                        .any(|p| p.starts_with("shop/solo-"))
            }
        },
    )
    .await;
    let on = rig::ready_pods(&rig.admin)
        .await
        .into_iter()
        .find(|(p, _)| p.starts_with("shop/solo-"))
        .map(|(_, n)| n)
        .unwrap();
    let (node, iid) = rig
        .kubelet
        .nodes()
        .into_iter()
        .find(|(n, _)| *n == on)
        .unwrap();

    rig.report.step("drain the node as `drain NODE` does");
    rig.engine.start(DrainRequest {
        instance_id: iid.clone(),
        group: "web".into(),
        node_name: Some(node.clone()),
        mode: Mode::DrainOnly,
        source: Source::Cli,
        reasons: vec![DrainReason::new(Why::DrainCommand, chrono::Utc::now())],
        noticed: None,
    });
    let nodes: kube::Api<Node> = kube::Api::all(rig.admin.clone());
    // What `kubectl get node -o jsonpath='{.status.conditions[?(@.type=="T")]}'` shows.
    let condition = |n: &Node, kind: &str| {
        n.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == kind).cloned())
    };
    rig.report
        .step("DrainInProgress names the budget before the deadline");
    until("DrainInProgress naming shop/solo", 5, || {
        let nodes = nodes.clone();
        let node = node.clone();
        async move {
            nodes
                .get(&node)
                .await
                .ok()
                .and_then(|n| condition(&n, "DrainInProgress"))
                .is_some_and(|c| {
                    c.status == "True"
                        && c.reason.as_deref() == Some("DrainCommand")
                        && c.message.as_deref().is_some_and(|m| {
                            m.contains("held: PodDisruptionBudget shop/solo")
                                && m.contains("minAvailable: 1")
                        })
                })
        }
    })
    .await;
    let events: kube::Api<Event> = kube::Api::all(rig.admin.clone());
    let named: Vec<String> = events
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("EvictionDeadlocked"))
        .filter_map(|e| e.note)
        .collect();
    assert_eq!(named.len(), 1, "{named:?}");
    assert!(
        named[0].contains("shop/solo") && named[0].contains("workload deadline"),
        "{named:?}"
    );

    rig.report.step("the deadline proceeds; Drained turns True");
    assert_eq!(rig.engine.wait_for(&iid).await, Some(Outcome::Drained));
    let n = nodes.get(&node).await.unwrap();
    let drained = condition(&n, "Drained").expect("Drained");
    assert_eq!(
        (drained.status.as_str(), drained.reason.as_deref()),
        ("True", Some("DrainCommand"))
    );
    assert!(drained.last_transition_time.is_some());
    assert!(
        condition(&n, "Ready").is_some(),
        "the kubelet's conditions stay"
    );

    rig.report.step("undrain sets both False");
    let window = Window {
        limits: rig.settings.limits(),
        after_deadline: std::time::Duration::from_secs(240),
    };
    let undone = undrain::undrain(&rig.admin, &node, window, true, chrono::Utc::now())
        .await
        .unwrap();
    assert!(
        matches!(undone, Some(undrain::Undone::GivenBack { .. })),
        "{undone:?}"
    );
    let n = nodes.get(&node).await.unwrap();
    for kind in ["DrainInProgress", "Drained"] {
        let c = condition(&n, kind).unwrap();
        assert_eq!(
            (c.status.as_str(), c.reason.as_deref()),
            ("False", Some("DrainUndone")),
            "{kind}"
        );
    }
}

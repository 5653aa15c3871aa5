//! The real-CA tier: the scenarios of `ca_scenarios.rs` with a real cluster-autoscaler
//! binary (`real_ca.rs`, from `E2E_CA_BINS`) as the driver. Real CA decides by itself, so
//! each scenario makes the conditions (pending pods for a scale-up; nodes whose pods can
//! move, with `--scale-down-unneeded-time=5s`, for a scale-down) and waits for CA to act.
//! CA runs as its ServiceAccount with exactly the shipped RBAC (the service's and CA's
//! own), with the flags the project tells users to set
//! (`--daemonset-eviction-for-occupied-nodes=false`). Checks: the same outside checks as
//! the suite's client, plus CA's own metrics say what it did and its log has no provider
//! error and no refusal of the API server.
#![allow(dead_code)] // shared by the e2e test crates, each using a part

use std::collections::BTreeSet;
use std::time::Duration;

use ca_asg_provider::clock::Instant;

use k8s_openapi::api::core::v1::Node;
use kube::Api;
use serde_json::json;

use super::ca_profile::CaProfile;
use super::control_plane::Binaries;
use super::real_ca::{CaBinary, RealCa, FIRST_LOOP_SECS};
use super::rig::{self, More, Rig, Setup, Workloads};

/// The real-CA scenarios, in the order they run for each binary.
pub const SCENARIOS: [&str; 7] = [
    "scale-up from pending pods",
    "CA scale-in, direct",
    "CA scale-in, hook",
    "a group at MinSize whose relaunch fails",
    "option tags, one malformed",
    "CA restarted mid-drain",
    "a closed window, then open",
];

/// Not run with real CA, and why.
pub const NOT_RUN: [(&str, &str); 1] = [(
    "a drain abandoned after CA's cordon",
    "CA never chooses a node whose pod a budget keeps from being evicted (its planner checks every PodDisruptionBudget), so a real CA cannot be brought to start this drain; the suite's client plays it",
)];

/// The flags every scenario gives CA on top of the harness's (fast timings, --v=5).
fn flags() -> Vec<String> {
    vec![
        "--daemonset-eviction-for-occupied-nodes=false".into(),
        "--scale-down-unneeded-time=5s".into(),
        "--scale-down-delay-after-add=0s".into(),
        "--scale-down-delay-after-delete=0s".into(),
        "--scale-down-delay-after-failure=5s".into(),
        "--skip-nodes-with-local-storage=false".into(),
        "--max-graceful-termination-sec=30".into(),
        "--expendable-pods-priority-cutoff=-10".into(),
        // A node the budget kept this loop is looked at again at once, not in 5 min.
        "--unremovable-node-recheck-timeout=5s".into(),
    ]
}

/// Runs scenario `name` with `bin` as the driver.
pub async fn run(name: &str, bin: &CaBinary, k8s: &Binaries) {
    match name {
        "scale-up from pending pods" => scale_up(bin, k8s).await,
        "CA scale-in, direct" => scale_in(bin, k8s, false).await,
        "CA scale-in, hook" => scale_in(bin, k8s, true).await,
        "a group at MinSize whose relaunch fails" => at_min_relaunch_fails(bin, k8s).await,
        "option tags, one malformed" => option_tags(bin, k8s).await,
        "CA restarted mid-drain" => restarted_mid_drain(bin, k8s).await,
        "a closed window, then open" => closed_window_then_open(bin, k8s).await,
        other => panic!("no real-CA scenario {other}"),
    }
}

fn driver(bin: &CaBinary) -> String {
    format!("cluster-autoscaler {}", bin.version)
}

async fn rig_for(
    name: &str,
    bin: &CaBinary,
    k8s: &Binaries,
    desired: i32,
    hooked: bool,
    more: More,
) -> Rig {
    let setup = Setup {
        desired,
        hooked,
        real: None,
        workloads: Workloads::Budgeted,
    };
    let more = More {
        ca_rbac: true,
        driver: driver(bin),
        ..more
    };
    Rig::start_more(name, k8s, setup, more).await
}

/// CA started on the rig's service, at its first loop.
async fn ca_starts(rig: &Rig, bin: &CaBinary, extra: &[String]) -> RealCa {
    rig.report.step(&format!(
        "{} starts as its ServiceAccount and reaches its first loop",
        bin.label()
    ));
    let mut f = flags();
    f.extend(extra.iter().cloned());
    let mut ca =
        RealCa::start(bin, &rig.cp, &rig.grpc_addr, &f).unwrap_or_else(|e| panic!("{e:#}"));
    ca.first_loop(FIRST_LOOP_SECS)
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
    ca
}

/// CA's log has no provider error and no refusal of the API server.
fn ca_log_clean(rig: &Rig, ca: &RealCa) {
    rig.report
        .step("check: CA's log has no provider error and no refusal of the API server");
    ca.assert_log_clean();
}

/// Nodes CA must leave alone: `cluster-autoscaler.kubernetes.io/scale-down-disabled`.
/// The nodes that are none of `occupied` (no app pod on them), kept from CA's scale-down
/// by its scale-down-disabled annotation: their names.
async fn keep_the_others(rig: &Rig, occupied: &[(String, String)]) -> Vec<String> {
    let others: Vec<String> = rig
        .kubelet
        .nodes()
        .into_keys()
        .filter(|n| !occupied.iter().any(|(o, _)| o == n))
        .collect();
    rig::scale_down_disabled(&rig.admin, &others).await;
    others
}

/// CA scales web in to 3 (within 240 s), then the instances of `occupied` end until
/// `enough` of them have (`what`, within 120 s): the nodes of `occupied` whose instances
/// ended.
async fn ca_scales_in_to_3(
    ca: &mut RealCa,
    rig: &Rig,
    occupied: Vec<(String, String)>,
    what: &str,
    enough: impl Fn(usize) -> bool,
) -> Vec<(String, String)> {
    let cloud = rig.cloud.clone();
    ca.wait("CA to scale web in to 3", 240, |_| {
        cloud.desired("web") == Some(3)
    })
    .await;
    let k = rig.kubelet.clone();
    let ids: BTreeSet<String> = occupied.iter().map(|(_, i)| i.clone()).collect();
    ca.wait(what, 120, |_| {
        enough(
            k.instances_ended()
                .iter()
                .filter(|i| ids.contains(*i))
                .count(),
        )
    })
    .await;
    let ended: BTreeSet<String> = rig.kubelet.instances_ended().into_iter().collect();
    occupied
        .into_iter()
        .filter(|(_, i)| ended.contains(i))
        .collect()
}

fn scaled_down(ca: &RealCa) -> f64 {
    ca.metric_sum("cluster_autoscaler_scaled_down_nodes_total", &[])
        .unwrap_or(0.0)
}

async fn scale_up(bin: &CaBinary, k8s: &Binaries) {
    let mut rig = rig_for(SCENARIOS[0], bin, k8s, 3, false, More::default()).await;
    let mut ca = ca_starts(&rig, bin, &[]).await;
    rig.report
        .scale_in_begins("the app grows to 5 replicas: two pods find no node; CA must scale up");
    rig::scale_app(&rig.admin, 5).await;
    let started = Instant::now();
    let k = rig.kubelet.clone();
    ca.wait("CA to add two Ready Nodes", 120, |_| k.nodes().len() == 5)
        .await;
    rig::until_or_say(
        "5 app pods Ready",
        60,
        || {
            let admin = rig.admin.clone();
            async move { rig::app_ready(&admin).await == 5 }
        },
        || rig::pod_states(&rig.admin, "shop/app-"),
    )
    .await;
    *rig.report.scale_in_secs.lock() = Some(started.elapsed().as_secs_f64());
    rig.report
        .step("check: CA's metrics count the scale-up; target and desired 5");
    let up = ca
        .metric_sum("cluster_autoscaler_scaled_up_nodes_total", &[])
        .unwrap_or(0.0);
    assert!(
        up >= 2.0,
        "{}",
        ca.failure(&format!("scaled_up_nodes_total {up}"))
    );
    assert_eq!(rig.cloud.desired("web"), Some(5));
    assert_eq!(rig.ca_target().await, 5);
    ca_log_clean(&rig, &ca);
    rig.report.step("check: no error answered to CA's calls");
    rig.no_provider_errors(&[]);
    ca.stop();
}

/// Five nodes, three running an app pod (one per node) and two with DaemonSet pods only,
/// kept by the scale-down-disabled annotation: CA's only way down is two occupied nodes,
/// whose app pods move to the kept ones. CA evicts the app pods itself (honouring the
/// budget), then calls DeleteNodes; the service drains the DaemonSet pods last.
async fn scale_in(bin: &CaBinary, k8s: &Binaries, hooked: bool) {
    let name = if hooked { SCENARIOS[2] } else { SCENARIOS[1] };
    let mut rig = rig_for(name, bin, k8s, 5, hooked, More::default()).await;
    if hooked {
        rig.run_lifecycle_loop();
    }
    let occupied: Vec<(String, String)> = rig.occupied().await;
    rig.report
        .step("the two nodes without an app pod are kept (scale-down-disabled)");
    let empty = keep_the_others(&rig, &occupied).await;
    assert_eq!(empty.len(), 2, "two nodes without an app pod");
    rig.report
        .scale_in_begins("CA finds two occupied nodes unneeded and scales them in");
    let mut ca = ca_starts(&rig, bin, &[]).await;
    let victims = ca_scales_in_to_3(
        &mut ca,
        &rig,
        occupied,
        "two occupied instances to end",
        |n| n == 2,
    )
    .await;
    rig.ends_keeping_promises(&victims, 3, 2, hooked).await;
    rig.report
        .step("check: CA's metrics count two nodes scaled down, none failed");
    ca.wait("CA's scaled_down_nodes_total to reach 2", 30, |ca| {
        scaled_down(ca) >= 2.0
    })
    .await;
    no_failed_scale_down(&ca);
    ca_log_clean(&rig, &ca);
    ca.stop();
}

/// min 3 = desired 3; an instance dies and every relaunch fails for capacity: CA keeps
/// looping, never deletes a live instance, never takes the group below its min; the
/// app's pod left pending makes CA scale up, which fails (an out-of-resources
/// placeholder): CA backs off and cleans it up.
async fn at_min_relaunch_fails(bin: &CaBinary, k8s: &Binaries) {
    let more = More {
        min: 3,
        ..More::default()
    };
    let rig = rig_for(SCENARIOS[3], bin, k8s, 3, false, more).await;
    let mut ca = ca_starts(&rig, bin, &[]).await;
    let (_, dead) = rig.an_instance_dies_relaunches_failing().await;
    let live: BTreeSet<String> = rig
        .kubelet
        .nodes()
        .into_values()
        .filter(|i| *i != dead)
        .collect();
    rig.report
        .step("CA sees the pending app pod, scales up, the launch fails: CA backs off");
    ca.wait("CA to call NodeGroupIncreaseSize", 120, |ca| {
        ca.rpc_calls("NodeGroupIncreaseSize") >= 1
    })
    .await;
    let loops = main_loops(&ca);
    ca.wait("ten more of CA's loops", 120, |ca| {
        main_loops(ca) >= loops + 10
    })
    .await;
    rig.report
        .step("check: the group at its min, only the dead instance ended, CA still looping");
    assert_eq!(
        rig.cloud.desired("web"),
        Some(3),
        "{}",
        ca.failure("desired capacity")
    );
    assert_eq!(rig.kubelet.instances_ended(), vec![dead.clone()]);
    let now: BTreeSet<String> = rig.kubelet.nodes().into_values().collect();
    assert!(
        live.is_subset(&now),
        "a live instance ended: {live:?} -> {now:?}"
    );
    let fatal = ca.log_lines_matching("Failed to fix node group sizes");
    assert!(
        fatal.is_empty(),
        "{}",
        ca.failure(&format!("CA's loop ended: {fatal:?}"))
    );
    ca_log_clean(&rig, &ca);
    rig.report.step("check: no error answered to CA's calls");
    rig.no_provider_errors(&[]);
    ca.stop();
}

fn main_loops(ca: &RealCa) -> usize {
    ca.log_lines_matching("Starting main loop").len()
}

/// CA counted no failed scale-down (`cluster_autoscaler_failed_scale_downs_total`).
fn no_failed_scale_down(ca: &RealCa) {
    let failed = ca
        .metric_sum("cluster_autoscaler_failed_scale_downs_total", &[])
        .unwrap_or(0.0);
    assert!(
        failed == 0.0,
        "{}",
        ca.failure(&format!("failed_scale_downs_total {failed}"))
    );
}

/// The malformed tag beside a good one: CA (whatever it reads of the options) scales an
/// occupied node of the group in; the drain keeps every promise.
async fn option_tags(bin: &CaBinary, k8s: &Binaries) {
    let more = More::option_tags_one_malformed("6s");
    let mut rig = rig_for(SCENARIOS[4], bin, k8s, 4, false, more).await;
    let occupied = rig.occupied().await;
    keep_the_others(&rig, &occupied).await;
    rig.report
        .scale_in_begins("CA scales in an occupied node of the group with the malformed tag");
    let mut ca = ca_starts(&rig, bin, &[]).await;
    let victims = ca_scales_in_to_3(
        &mut ca,
        &rig,
        occupied,
        "an occupied instance to end",
        |n| n >= 1,
    )
    .await;
    rig.ends_keeping_promises(&victims, 3, 1, false).await;
    assert!(
        ca.rpc_calls("NodeGroupGetOptions") >= 1,
        "{}",
        ca.failure("CA never asked for the group's options")
    );
    no_failed_scale_down(&ca);
    ca_log_clean(&rig, &ca);
    ca.stop();
}

/// CA scales in an occupied node; while the service drains it (its drain mark on the
/// Node), CA is killed and started again: its start-up clean-up removes its taint (and,
/// >= 1.34, its cordon); the drain still ends the instance once, DaemonSet pods last.
async fn restarted_mid_drain(bin: &CaBinary, k8s: &Binaries) {
    let mut rig = rig_for(SCENARIOS[5], bin, k8s, 4, false, More::default()).await;
    let occupied = rig.occupied().await;
    keep_the_others(&rig, &occupied).await;
    rig.report.scale_in_begins("CA scales in an occupied node");
    let mut ca = ca_starts(&rig, bin, &[]).await;
    rig.report
        .step("wait for the service's drain mark on a node CA chose");
    let nodes: Api<Node> = Api::all(rig.admin.clone());
    let end = Instant::now() + Duration::from_secs(240);
    let victim = loop {
        let marked = nodes
            .list(&Default::default())
            .await
            .map(|l| {
                l.items.into_iter().find(|n| {
                    n.metadata
                        .annotations
                        .as_ref()
                        .is_some_and(|a| a.contains_key("ca-asg-provider.io/drain-started-at"))
                })
            })
            .ok()
            .flatten();
        if let Some(n) = marked {
            break n.metadata.name.unwrap_or_default();
        }
        if let Err(e) = ca.check_alive() {
            panic!("{e:#}");
        }
        assert!(
            Instant::now() < end,
            "{}",
            ca.failure("no drain began in 240 s")
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    rig.report.step(&format!(
        "kill -9 CA while {victim} drains, and start it again (its start-up clean-up)"
    ));
    ca.restart().unwrap_or_else(|e| panic!("{e:#}"));
    let mid = !rig
        .kubelet
        .instances_ended()
        .iter()
        .any(|i| super::kubelet::node_name(i) == victim);
    rig.report
        .extra
        .lock()
        .insert("restarted_mid_drain".into(), json!(mid));
    ca.first_loop(FIRST_LOOP_SECS)
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
    let iid = occupied
        .iter()
        .find(|(n, _)| *n == victim)
        .map(|(_, i)| i.clone())
        .expect("the victim is an occupied node");
    let k = rig.kubelet.clone();
    ca.wait("the victim's instance to end", 120, |_| {
        k.instances_ended().contains(&iid)
    })
    .await;
    let victims = vec![(victim.clone(), iid)];
    rig.ends_keeping_promises(&victims, 3, 1, false).await;
    no_failed_scale_down(&ca);
    ca_log_clean(&rig, &ca);
    ca.stop();
}

/// How long the window stays closed from the moment the scenario's settings are made:
/// the rig's start (about 5 s) and CA's start (2 to 4 s) leave CA about a minute of
/// loops (every 2 s) in which two nodes are plainly unneeded.
const CLOSED_SECS: i64 = 75;

/// A window that is in force now and ends `closed` from now (issue 71): a schedule on
/// this UTC minute, lasting from the minute's start to `now + closed`. Its end.
fn closing_now_for(
    closed: chrono::Duration,
) -> (
    ca_asg_provider::scalein::decide::budget::Budget,
    chrono::DateTime<chrono::Utc>,
) {
    use ca_asg_provider::scalein::decide::budget::{
        cron::Cron, Budget, Cause, Groups, Nodes, Window,
    };
    use chrono::{Timelike, Utc};
    let now = Utc::now();
    let minute = now
        .with_second(0)
        .and_then(|t| t.with_nanosecond(0))
        .expect("a minute's start");
    let opens = now + closed;
    let budget = Budget {
        window: Some(Window {
            schedule: Cron::parse(&format!("{} {} * * *", minute.minute(), minute.hour()))
                .expect("a schedule"),
            duration: (opens - minute).to_std().expect("a duration"),
        }),
        groups: Groups::Named(["web".to_string()].into()),
        causes: Some([Cause::CaEmpty, Cause::CaOccupied].into()),
        ..Budget::always("closed-for-ca", Nodes::Count(0))
    };
    (budget, opens)
}

/// The nodes carrying scale-down-disabled with the service's mark.
async fn held_from_ca(rig: &Rig) -> BTreeSet<String> {
    use ca_asg_provider::scalein::decide::ca_hold::{HELD_BY, SCALE_DOWN_DISABLED};
    let nodes: Api<Node> = Api::all(rig.admin.clone());
    let Ok(list) = nodes.list(&Default::default()).await else {
        return BTreeSet::new();
    };
    list.items
        .into_iter()
        .filter(|n| {
            n.metadata.annotations.as_ref().is_some_and(|a| {
                a.get(SCALE_DOWN_DISABLED).map(String::as_str) == Some("true")
                    && a.contains_key(HELD_BY)
            })
        })
        .filter_map(|n| n.metadata.name)
        .collect()
}

/// A disruption budget closes CA's scale-in of web for about a minute (issue 71): five
/// nodes, three with an app pod, two with DaemonSet pods only, which CA would remove at
/// its first loops. While the window is closed the service keeps every node of web out
/// of CA's choice (`scale-down-disabled` with its mark): CA's own log says it skipped
/// each of them as marked, and nothing is asked or ended. Once the window opens the
/// service takes its marks off, CA scales web in to 3, and each drain keeps its
/// promises.
async fn closed_window_then_open(bin: &CaBinary, k8s: &Binaries) {
    let (budget, opens) = closing_now_for(chrono::Duration::seconds(CLOSED_SECS));
    let more = More {
        settings: ca_asg_provider::scalein::ScaleInSettings {
            budgets: vec![budget],
            tell_ca_every: Duration::from_secs(2),
            ..rig::settings()
        },
        ..More::default()
    };
    let mut rig = rig_for(SCENARIOS[6], bin, k8s, 5, false, more).await;
    let all: BTreeSet<String> = rig.kubelet.nodes().into_keys().collect();
    assert_eq!(all.len(), 5, "{all:?}");
    rig.report
        .step("the window is closed: every node of web held from CA (the service's mark)");
    rig::until_or_say(
        "the service to hold every node of web from CA",
        30,
        || {
            let (rig, all) = (&rig, &all);
            async move { held_from_ca(rig).await == *all }
        },
        || async { format!("held: {:?}", held_from_ca(&rig).await) },
    )
    .await;
    rig.report
        .scale_in_begins("CA loops while the window is closed, then it opens");
    let mut ca = ca_starts(&rig, bin, &[]).await;
    let loops_before = main_loops(&ca);
    let cloud = rig.cloud.clone();
    let k = rig.kubelet.clone();
    ca.wait("the window to open", (CLOSED_SECS + 30) as u64, |_| {
        assert_eq!(
            cloud.desired("web"),
            Some(5),
            "web scaled in while the window was closed"
        );
        assert!(
            k.instances_ended().is_empty(),
            "an instance ended while the window was closed"
        );
        chrono::Utc::now() >= opens
    })
    .await;
    rig.report
        .step("check: while closed, CA looped, skipped every node as marked, asked nothing");
    let loops = main_loops(&ca) - loops_before;
    assert!(
        loops >= 3,
        "{}",
        ca.failure(&format!(
            "CA looped {loops} times while the window was closed"
        ))
    );
    for node in &all {
        let skipped = format!(
            "Skipping {node} from delete consideration - the node is marked as no scale down"
        );
        assert!(
            !ca.log_lines_matching(&skipped).is_empty(),
            "{}",
            ca.failure(&format!("CA's log never skipped {node} as marked"))
        );
    }
    assert_eq!(
        rig.ca_target().await,
        5,
        "CA's target while the window was closed"
    );
    assert_eq!(
        scaled_down(&ca),
        0.0,
        "CA scaled down while the window was closed"
    );
    rig.report
        .step("the window opens: the marks come off and CA scales web in");
    let victims_of = |ended: &[String]| -> Vec<(String, String)> {
        ended
            .iter()
            .map(|i| (super::kubelet::node_name(i), i.clone()))
            .collect()
    };
    let opened = Instant::now();
    ca.wait("CA to scale web in to 3", 180, |_| {
        cloud.desired("web") == Some(3)
    })
    .await;
    eprintln!(
        "e2e: CA looped {loops} times while the window was closed, skipping all 5 nodes; it scaled web in to 3 {:.1} s after the window opened",
        opened.elapsed().as_secs_f64()
    );
    ca.wait("two instances to end", 120, |_| {
        k.instances_ended().len() == 2
    })
    .await;
    let victims = victims_of(&rig.kubelet.instances_ended());
    rig.ends_keeping_promises(&victims, 3, victims.len() as u64, false)
        .await;
    rig.report
        .step("check: no node carries the service's mark once the window is open");
    let held = held_from_ca(&rig).await;
    assert!(
        held.is_empty(),
        "still held from CA after the window opened: {held:?}"
    );
    no_failed_scale_down(&ca);
    ca_log_clean(&rig, &ca);
    ca.stop();
}

/// The profile the suite's client would play for this binary.
pub fn profile_of(bin: &CaBinary) -> CaProfile {
    CaProfile::for_version(bin.semver())
}

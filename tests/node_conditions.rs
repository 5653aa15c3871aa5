//! Issue 72 on the real engine (memory cloud, in-memory API server): the drain's state
//! on the Node as KEP-5683's conditions (`DrainInProgress`, `Drained`) through
//! `nodes/status`, and the PodDisruptionBudgets that can never allow an eviction
//! named when the drain starts, not when its deadline ends the wait.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ca_asg_provider::cloud::memory::MemoryGroup;
use ca_asg_provider::scalein::decide::budget::Groups;
use ca_asg_provider::scalein::decide::record::{self, DrainReason, DrainRecord, Why};
use ca_asg_provider::scalein::decide::undo::Window;
use ca_asg_provider::scalein::settings::GroupOverride;
use ca_asg_provider::scalein::{
    DeadlinePolicy, DrainRequest, Mode, Outcome, ScaleInSettings, Source,
};
use ca_asg_provider::sim::{fixtures, SimCluster};
use ca_asg_provider::telemetry::metrics::{metrics, KindLabels};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

mod support;
use support::eventually;
use support::world::*;

/// One condition as the Node has it: status, reason, message, lastTransitionTime.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Said {
    status: String,
    reason: String,
    message: String,
    since: String,
}

fn conditions(sim: &SimCluster, node: &str) -> BTreeMap<String, Said> {
    let Some(n) = sim.get::<Node>("", node) else {
        return BTreeMap::new();
    };
    let s = |v: &serde_json::Value| v.as_str().unwrap_or("").to_string();
    n["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            (
                s(&c["type"]),
                Said {
                    status: s(&c["status"]),
                    reason: s(&c["reason"]),
                    message: s(&c["message"]),
                    since: s(&c["lastTransitionTime"]),
                },
            )
        })
        .collect()
}

/// (DrainInProgress, Drained) as the Node showed them at one read.
type Pair = (Option<Said>, Option<Said>);

/// Every distinct pair of (DrainInProgress, Drained) the Node showed, in order,
/// read every 10 ms until the handle is dropped.
struct History {
    seen: Arc<parking_lot::Mutex<Vec<Pair>>>,
    task: tokio::task::JoinHandle<()>,
}

impl History {
    fn of(sim: &Arc<SimCluster>, node: &str) -> Self {
        let seen: Arc<parking_lot::Mutex<Vec<Pair>>> = Arc::default();
        let (sim, node, into) = (sim.clone(), node.to_string(), seen.clone());
        let task = tokio::spawn(async move {
            loop {
                let c = conditions(&sim, &node);
                let now = (c.get("DrainInProgress").cloned(), c.get("Drained").cloned());
                {
                    let mut seen = into.lock();
                    if seen.last() != Some(&now) {
                        seen.push(now);
                    }
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        });
        History { seen, task }
    }

    fn seen(&self) -> Vec<Pair> {
        self.seen.lock().clone()
    }
}

impl Drop for History {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A pod of app `name` on `node` whose grace period is `grace` seconds.
fn pod_with_grace(node: &str, name: &str, grace: i64) -> k8s_openapi::api::core::v1::Pod {
    let mut p = fixtures::pod("shop", name, node, name, 0.1);
    p.spec.as_mut().unwrap().termination_grace_period_seconds = Some(grace);
    p
}

/// The notes of the Events of `reason`.
fn notes(w: &World, reason: &str) -> Vec<String> {
    events(&w.sim)
        .into_iter()
        .filter(|(r, _)| r == reason)
        .map(|(_, n)| n)
        .collect()
}

/// A single-replica app whose budget wants its one pod: `minAvailable: 1`; its pod's
/// grace period is 1 s.
async fn single_replica_app(w: &World, node: &str, name: &str) {
    w.put(&PodDisruptionBudget {
        metadata: ObjectMeta {
            name: Some(format!("{name}-pdb")),
            namespace: Some("shop".into()),
            ..Default::default()
        },
        spec: Some(PodDisruptionBudgetSpec {
            min_available: Some(IntOrString::Int(1)),
            selector: Some(LabelSelector {
                match_labels: Some([("app".to_string(), name.to_string())].into()),
                ..Default::default()
            }),
            ..Default::default()
        }),
        status: None,
    });
    w.put(&pod_with_grace(node, name, 1));
    pod_ready(w, name).await;
}

fn settings(deadline: Duration, policy: DeadlinePolicy) -> ScaleInSettings {
    ScaleInSettings {
        workload_deadline: deadline,
        workload_deadline_policy: policy,
        ..fast_settings()
    }
}

fn deadlocks_counted(kind: &'static str) -> u64 {
    metrics()
        .eviction_deadlocks
        .get_or_create(&KindLabels { kind })
        .get()
}

#[tokio::test]
async fn budgets_that_never_allow_are_named_at_the_start_and_the_node_says_where_the_drain_is() {
    let mut w = World::builder()
        .web(2, 2)
        .settings(settings(Duration::from_secs(3), DeadlinePolicy::Proceed))
        .build()
        .await;
    let (node, iid) = nodes_of(&w, "web").remove(0);
    let before = deadlocks_counted("wants-every-pod");
    // maxUnavailable: 0, and minAvailable: 1 of 1; both pods' grace 1 s, so the
    // deadline's deletions come 2 s after the start.
    w.put(&fixtures::pdb("shop", "solo", 0));
    w.put(&pod_with_grace(&node, "solo", 1));
    pod_ready(&w, "solo").await;
    single_replica_app(&w, &node, "single").await;
    let history = History::of(&w.sim, &node);
    delete_nodes(&mut w, "web", &[(node.clone(), iid.clone())]).await;

    // Named at once, before the 3 s deadline ends the wait (its deletions come at
    // deadline - grace, 2 s after the start): both budgets, their pods, and what ends
    // the wait.
    eventually("the deadlock is named", 10, || {
        events(&w.sim)
            .iter()
            .any(|(r, _)| r == "EvictionDeadlocked")
    })
    .await;
    let named: Vec<String> = notes(&w, "EvictionDeadlocked");
    assert_eq!(named.len(), 1, "one Event per drain: {named:?}");
    let note = &named[0];
    for want in [
        "shop/solo-pdb",
        "maxUnavailable: 0",
        "shop/solo",
        "shop/single-pdb",
        "minAvailable: 1",
        "workload deadline",
    ] {
        assert!(note.contains(want), "{want} missing: {note}");
    }
    assert!(
        !events(&w.sim).iter().any(|(r, _)| r == "DeadlineHit"),
        "named before the deadline"
    );
    assert!(deadlocks_counted("wants-every-pod") >= before + 2);

    // The Node says it: DrainInProgress True, who asked, what holds it, the deadline.
    eventually("DrainInProgress names the budgets", 10, || {
        conditions(&w.sim, &node)
            .get("DrainInProgress")
            .is_some_and(|c| {
                c.status == "True"
                    && c.message
                        .contains("held: PodDisruptionBudget shop/single-pdb")
            })
    })
    .await;
    let c = conditions(&w.sim, &node);
    assert_eq!(c["DrainInProgress"].reason, "ClusterAutoscalerScaleDown");
    assert!(
        c["DrainInProgress"].message.contains("workload deadline"),
        "{c:?}"
    );
    assert_eq!(
        (c["Drained"].status.as_str(), c["Drained"].reason.as_str()),
        ("False", "DrainStarted")
    );
    assert!(
        c.contains_key("Ready"),
        "the kubelet's conditions stay: {c:?}"
    );

    // The deadline proceeds; the pods go; Drained before the instance ends.
    assert_eq!(w.engine.wait_for(&iid).await, Some(Outcome::Ended));
    let seen = history.seen();
    let last = conditions(&w.sim, &node);
    let (dip, drained) = (last["DrainInProgress"].clone(), last["Drained"].clone());
    assert_eq!(
        (dip.status.as_str(), dip.reason.as_str()),
        ("False", "DrainFinished")
    );
    assert_eq!(
        (drained.status.as_str(), drained.reason.as_str()),
        ("True", "ClusterAutoscalerScaleDown")
    );
    assert!(
        drained.message.contains("the instance ends next"),
        "{drained:?}"
    );
    // While it ran, its messages changed (the budgets, then the DaemonSet pods, the
    // volumes) and its transition time did not.
    let running: Vec<&Said> = seen
        .iter()
        .filter_map(|(d, _)| d.as_ref())
        .filter(|d| d.status == "True")
        .collect();
    assert!(!running.is_empty(), "{seen:#?}");
    assert!(
        running.iter().all(|d| d.since == running[0].since),
        "{running:#?}"
    );
    assert!(!running[0].since.is_empty());
    // Every write of them went through nodes/status, and was accepted.
    let writes: Vec<_> = w
        .sim
        .requests()
        .writes()
        .into_iter()
        .filter(|x| x.resource == "nodes/status")
        .collect();
    assert!(
        !writes.is_empty() && writes.iter().all(|x| x.status < 300 && x.name == node),
        "{writes:?}"
    );
}

#[tokio::test]
async fn an_abandoned_drain_says_so_and_a_budget_that_may_allow_is_not_named() {
    let mut w = World::builder()
        .web(2, 2)
        .settings(settings(Duration::from_secs(1), DeadlinePolicy::Abandon))
        .build()
        .await;
    let (node, iid) = nodes_of(&w, "web").remove(0);
    // maxUnavailable 1 over one pod: allows its eviction; nothing is named.
    w.put(&fixtures::pdb("shop", "free", 1));
    w.put(&fixtures::pod("shop", "free", &node, "free", 0.1));
    guarded_app(&w, &node, "held").await;
    delete_nodes(&mut w, "web", &[(node.clone(), iid.clone())]).await;
    assert!(matches!(
        w.engine.wait_for(&iid).await,
        Some(Outcome::Abandoned(_))
    ));
    let named: Vec<String> = notes(&w, "EvictionDeadlocked");
    assert_eq!(named.len(), 1, "{named:?}");
    assert!(
        named[0].contains("shop/held-pdb") && !named[0].contains("free"),
        "{named:?}"
    );
    let c = conditions(&w.sim, &node);
    assert_eq!(
        (
            c["DrainInProgress"].status.as_str(),
            c["DrainInProgress"].reason.as_str()
        ),
        ("False", "DrainAbandoned"),
        "{c:?}"
    );
    assert_eq!(c["Drained"].status, "False");
    assert!(c["DrainInProgress"].message.contains("abandoned"), "{c:?}");
}

#[tokio::test]
async fn a_drain_without_terminate_stays_drained_until_undrain_clears_it() {
    let w = World::builder().web(2, 2).build().await;
    let (node, iid) = nodes_of(&w, "web").remove(0);
    let now = chrono::Utc::now();
    w.engine.start(DrainRequest {
        instance_id: iid.clone(),
        group: "web".into(),
        node_name: Some(node.clone()),
        mode: Mode::DrainOnly,
        source: Source::Cli,
        reasons: vec![DrainReason::new(Why::DrainCommand, now)],
        noticed: None,
    });
    assert_eq!(w.engine.wait_for(&iid).await, Some(Outcome::Drained));
    let c = conditions(&w.sim, &node);
    assert_eq!(
        (c["Drained"].status.as_str(), c["Drained"].reason.as_str()),
        ("True", "DrainCommand"),
        "{c:?}"
    );
    assert!(c["Drained"].message.contains("the instance stays"), "{c:?}");
    let drained_since = c["Drained"].since.clone();

    let window = Window {
        limits: fast_settings().limits(),
        after_deadline: Duration::from_secs(240),
    };
    let undone = ca_asg_provider::commands::undrain::undrain(
        &w.sim.client(),
        &node,
        window,
        false,
        chrono::Utc::now(),
    )
    .await
    .unwrap();
    assert!(
        matches!(
            undone,
            Some(ca_asg_provider::commands::undrain::Undone::GivenBack { .. })
        ),
        "{undone:?}"
    );
    let c = conditions(&w.sim, &node);
    for kind in ["DrainInProgress", "Drained"] {
        assert_eq!(
            (c[kind].status.as_str(), c[kind].reason.as_str()),
            ("False", "DrainUndone"),
            "{kind}: {c:?}"
        );
    }
    assert!(c["Drained"].since >= drained_since);
    // A second undrain finds nothing to say again.
    let writes_before = w.sim.requests().writes().len();
    ca_asg_provider::commands::undrain::undrain(
        &w.sim.client(),
        &node,
        window,
        false,
        chrono::Utc::now(),
    )
    .await
    .unwrap();
    assert!(
        !w.sim.requests().writes()[writes_before..]
            .iter()
            .any(|x| x.resource == "nodes/status"),
        "nothing new to say, nothing written"
    );
}

/// With `proceed`, each pod a budget holds is deleted at (deadline - its own grace),
/// not all at the deadline: the pod with the longer grace goes first, both are gone by
/// the deadline (nothing is left for the deadline's own deletion), and the DaemonSet
/// pods go after both.
#[tokio::test]
async fn at_a_proceed_deadline_each_pod_is_deleted_at_the_deadline_less_its_grace() {
    let mut w = World::builder()
        .web(2, 2)
        .settings(settings(Duration::from_secs(6), DeadlinePolicy::Proceed))
        .build()
        .await;
    let (node, iid) = nodes_of(&w, "web").remove(0);
    w.sim
        .create(&fixtures::daemonset("logging", "fluentd", 0.2, false))
        .unwrap();
    eventually("fluentd on both nodes", 10, || {
        ca_asg_provider::sim::world::ready_pods(&w.sim) == 2
    })
    .await;
    for (name, grace) in [("short", 1), ("long", 4)] {
        w.put(&fixtures::pdb("shop", name, 0));
        w.put(&pod_with_grace(&node, name, grace));
        pod_ready(&w, name).await;
    }
    delete_nodes(&mut w, "web", &[(node.clone(), iid.clone())]).await;
    assert_eq!(w.engine.wait_for(&iid).await, Some(Outcome::Ended));
    let audit = w.sim.audit();
    let at = |verb: &str, name: &str| {
        audit
            .iter()
            .position(|a| a.verb == verb && a.name == name)
            .unwrap_or_else(|| panic!("no {verb} of {name}"))
    };
    assert!(
        at("deletion-started", "long") < at("deletion-started", "short"),
        "the longer grace is deleted first"
    );
    let notes: Vec<String> = notes(&w, "DeadlineHit");
    for name in ["shop/long", "shop/short"] {
        assert!(
            notes
                .iter()
                .any(|n| n.contains(name) && n.contains("so it is gone by the workload deadline")),
            "{name}: {notes:?}"
        );
    }
    assert!(
        !notes.iter().any(|n| n.contains("left at the deadline")),
        "nothing was left for the deadline's own deletion: {notes:?}"
    );
    let ds_leaves = audit
        .iter()
        .position(|a| {
            a.kind == "Pod" && a.namespace == "logging" && a.verb != "create" && a.verb != "ready"
        })
        .expect("a DaemonSet pod left");
    assert!(at("removed", "long") < ds_leaves && at("removed", "short") < ds_leaves);
}

/// The record on `node`, as the service wrote it.
fn record_on(sim: &SimCluster, node: &str) -> Option<DrainRecord> {
    let n = sim.get::<Node>("", node)?;
    let text = n["metadata"]["annotations"][record::ANNOTATION].as_str()?;
    serde_json::from_str(text).ok()
}

/// Issue 72, item 1: a group override (selected by the group's tags, as budgets
/// select) gives that group's drains their own deadline and policy, kept in the
/// Node's record; a group no override selects keeps the cluster's.
#[tokio::test]
async fn a_group_override_gives_its_nodes_their_own_deadline_and_policy() {
    let settings = ScaleInSettings {
        group_overrides: vec![GroupOverride {
            groups: Groups::Tagged([("team".to_string(), Some("batch".to_string()))].into()),
            workload_deadline: Some(Duration::from_secs(1)),
            workload_deadline_policy: Some(DeadlinePolicy::Abandon),
            wait_for_replacement: None,
            deregister: None,
        }],
        ..settings(Duration::from_secs(2), DeadlinePolicy::Proceed)
    };
    let mut w = World::builder()
        .groups([
            MemoryGroup::new("batch", 0, 2, 2, "m5.large").tag("team", "batch"),
            MemoryGroup::new("web", 0, 2, 2, "m5.large"),
        ])
        .settings(settings)
        .build()
        .await;
    let (batch_node, batch_iid) = nodes_of(&w, "batch").remove(0);
    let (web_node, web_iid) = nodes_of(&w, "web").remove(0);
    guarded_app(&w, &batch_node, "batch-app").await;
    guarded_app(&w, &web_node, "web-app").await;
    delete_nodes(&mut w, "batch", &[(batch_node.clone(), batch_iid.clone())]).await;
    delete_nodes(&mut w, "web", &[(web_node.clone(), web_iid.clone())]).await;
    // Each record keeps the deadline its drain began with (read while the drain
    // runs: giving a node back removes its record).
    let kept = |node: &str| record_on(&w.sim, node).and_then(|r| r.limits);
    let batch = kept(&batch_node).expect("the batch drain's record keeps its limits");
    assert_eq!(
        (batch.workload_deadline, batch.workload_policy),
        (Duration::from_secs(1), DeadlinePolicy::Abandon)
    );
    let web = kept(&web_node).expect("the web drain's record keeps its limits");
    assert_eq!(
        (web.workload_deadline, web.workload_policy),
        (Duration::from_secs(2), DeadlinePolicy::Proceed)
    );

    // The batch group's override: given up at its 1 s deadline, the node kept.
    assert!(matches!(
        w.engine.wait_for(&batch_iid).await,
        Some(Outcome::Abandoned(_))
    ));
    assert!(in_service(&w.cloud, &batch_iid));
    // The cluster's for web: on at its 2 s deadline, the instance ended.
    assert_eq!(w.engine.wait_for(&web_iid).await, Some(Outcome::Ended));
}

/// Issue 72, item 1: a drain our hook holds whose group's deadline does not fit
/// inside the hook's global timeout (100 heartbeat timeouts of 2 s) gets what the
/// hook leaves after the DaemonSet and volume phases, and says so at its start: an
/// Event, and the deadline on the Node's condition.
#[tokio::test]
async fn a_deadline_that_does_not_fit_the_hooks_timeout_is_cut_and_said() {
    let settings = ScaleInSettings {
        group_overrides: vec![GroupOverride {
            groups: Groups::Named(["web".to_string()].into()),
            workload_deadline: Some(Duration::from_secs(3600)),
            workload_deadline_policy: None,
            wait_for_replacement: None,
            deregister: None,
        }],
        ..fast_settings()
    };
    let room = settings.hook_room(Duration::from_secs(2));
    assert!(
        room < Duration::from_secs(3600) && room > Duration::ZERO,
        "{room:?}"
    );
    let w = World::builder()
        .web_hooked(3, 2, 2)
        .settings(settings)
        .build()
        .await;
    let lifecycle = ca_asg_provider::scalein::sources::hook_scan::spawn_loop(
        w.engine.clone(),
        w.provider.clone(),
    );
    let ended = w.cloud.external_scale_in("web", 1).unwrap();
    let iid = ended[0].clone();
    action_completed(&w, &iid, 20).await;
    lifecycle.abort();
    let cut = notes(&w, "DeadlineCutByHook");
    assert_eq!(cut.len(), 1, "once per drain: {cut:?}");
    for want in [
        "the workload deadline 1h0m0s does not fit",
        &format!(
            "the workloads get {}",
            ca_asg_provider::duration::format_duration(room)
        ),
    ] {
        assert!(cut[0].contains(want), "{want} missing: {}", cut[0]);
    }
    let node = w
        .sim
        .list::<Node>()
        .into_iter()
        .find(|n| {
            n["spec"]["providerID"]
                .as_str()
                .is_some_and(|p| p.ends_with(&iid))
        })
        .and_then(|n| n["metadata"]["name"].as_str().map(str::to_string))
        .expect("the node of the ended instance");
    let kept = record_on(&w.sim, &node)
        .and_then(|r| r.limits)
        .expect("kept");
    assert_eq!(kept.workload_deadline, Duration::from_secs(3600));
    assert_eq!(kept.hook_room, Some(room));
}

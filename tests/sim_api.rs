//! The in-memory API server through a real kube::Client over HTTP.

use std::sync::Arc;
use std::time::Duration;

use ca_asg_provider::clock::Instant;

use ca_asg_provider::sim::{fixtures, SimCluster, SimOptions};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{DeleteParams, EvictParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{reflector, watcher, WatchStreamExt};
use kube::Api;
use serde_json::json;

async fn eventually<F: FnMut() -> bool>(what: &str, mut f: F) {
    let end = Instant::now() + Duration::from_secs(20);
    while Instant::now() < end {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("timed out waiting for {what}");
}

async fn sim() -> SimCluster {
    SimCluster::start(SimOptions {
        ready_delay: Duration::from_millis(50),
    })
    .await
    .unwrap()
}

fn api_err(e: kube::Error) -> (u16, String) {
    match e {
        kube::Error::Api(s) => (s.code, s.message),
        other => panic!("not an API error: {other}"),
    }
}

/// Merges `spec` into Node `name`'s spec (a merge patch), which must succeed.
async fn merge_spec(nodes: &Api<Node>, name: &str, spec: serde_json::Value) {
    nodes
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": spec })),
        )
        .await
        .unwrap();
}

#[tokio::test]
async fn crud_and_status_errors() {
    let s = sim().await;
    let nodes: Api<Node> = Api::all(s.client());
    nodes
        .create(
            &PostParams::default(),
            &fixtures::node("n1", "aws:///us-east-1a/i-1", &[]),
        )
        .await
        .unwrap();
    let n = nodes.get("n1").await.unwrap();
    assert_eq!(
        n.spec.unwrap().provider_id.as_deref(),
        Some("aws:///us-east-1a/i-1")
    );
    assert!(n.metadata.uid.is_some() && n.metadata.resource_version.is_some());
    let (code, msg) = api_err(
        nodes
            .create(&PostParams::default(), &fixtures::node("n1", "x", &[]))
            .await
            .unwrap_err(),
    );
    assert_eq!(code, 409);
    assert!(msg.contains("n1"));
    let (code, _) = api_err(nodes.get("missing").await.unwrap_err());
    assert_eq!(code, 404);
    assert!(nodes.get_opt("missing").await.unwrap().is_none());
    // A stale resourceVersion on replace is a conflict.
    let mut stale = nodes.get("n1").await.unwrap();
    nodes
        .patch(
            "n1",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"a": "b"}}})),
        )
        .await
        .unwrap();
    stale
        .metadata
        .labels
        .get_or_insert_with(Default::default)
        .insert("c".into(), "d".into());
    let (code, _) = api_err(
        nodes
            .replace("n1", &PostParams::default(), &stale)
            .await
            .unwrap_err(),
    );
    assert_eq!(code, 409);
    nodes.delete("n1", &DeleteParams::default()).await.unwrap();
    assert!(nodes.get_opt("n1").await.unwrap().is_none());
}

#[tokio::test]
async fn selectors_and_bad_selectors() {
    let s = sim().await;
    for (n, node) in [("a", "n1"), ("b", "n1"), ("c", "n2")] {
        s.create(&fixtures::pod(
            "ns",
            n,
            node,
            if n == "c" { "db" } else { "web" },
            0.0,
        ))
        .unwrap();
    }
    let pods: Api<Pod> = Api::all(s.client());
    let on_n1 = pods
        .list(&ListParams::default().fields("spec.nodeName=n1"))
        .await
        .unwrap();
    assert_eq!(on_n1.items.len(), 2);
    let web = pods
        .list(&ListParams::default().labels("app in (web)"))
        .await
        .unwrap();
    assert_eq!(web.items.len(), 2);
    let ns_pods: Api<Pod> = Api::namespaced(s.client(), "ns");
    let not_web = ns_pods
        .list(&ListParams::default().labels("app!=web"))
        .await
        .unwrap();
    assert_eq!(not_web.items.len(), 1);
    let (code, msg) = api_err(
        pods.list(&ListParams::default().labels("app in web"))
            .await
            .unwrap_err(),
    );
    assert_eq!(code, 400);
    assert!(msg.contains("app in web"), "{msg}");
    let (code, msg) = api_err(
        pods.list(&ListParams::default().fields("spec.color=red"))
            .await
            .unwrap_err(),
    );
    assert_eq!(code, 400);
    assert!(msg.contains("spec.color"), "{msg}");
}

#[tokio::test]
async fn patches_cordon_and_taint_a_node() {
    let s = sim().await;
    let nodes: Api<Node> = Api::all(s.client());
    nodes
        .create(&PostParams::default(), &fixtures::node("n1", "p", &[]))
        .await
        .unwrap();
    merge_spec(&nodes, "n1", json!({"unschedulable": true})).await;
    let ops: json_patch::Patch = serde_json::from_value(json!([{"op": "add", "path": "/spec/taints", "value": [{"key": "k", "effect": "NoSchedule"}]}])).unwrap();
    nodes
        .patch("n1", &PatchParams::default(), &Patch::<()>::Json(ops))
        .await
        .unwrap();
    let n = nodes.get("n1").await.unwrap().spec.unwrap();
    assert_eq!(n.unschedulable, Some(true));
    assert_eq!(n.taints.unwrap()[0].key, "k");
}

/// As the real API server: a strategic merge patch of `nodes/status` merges the
/// conditions by type (the kubelet's stay), an element's fields not in the patch stay
/// (its lastTransitionTime), and the status subresource leaves the spec alone.
#[tokio::test]
async fn a_status_patch_merges_node_conditions_by_type_and_changes_only_the_status() {
    let s = sim().await;
    let nodes: Api<Node> = Api::all(s.client());
    let mut n = fixtures::node("n1", "p", &[]);
    n.status.get_or_insert_with(Default::default).conditions =
        Some(vec![k8s_openapi::api::core::v1::NodeCondition {
            type_: "Ready".into(),
            status: "True".into(),
            ..Default::default()
        }]);
    nodes.create(&PostParams::default(), &n).await.unwrap();
    let strategic = |v: serde_json::Value| Patch::Strategic(v);
    nodes
        .patch_status(
            "n1",
            &PatchParams::default(),
            &strategic(json!({"status": {"conditions": [
                {"type": "DrainInProgress", "status": "True", "reason": "A", "message": "one",
                 "lastTransitionTime": "2026-11-28T10:00:00Z"}]}})),
        )
        .await
        .unwrap();
    nodes
        .patch_status(
            "n1",
            &PatchParams::default(),
            &strategic(json!({
                "spec": {"unschedulable": true},
                "status": {"conditions": [{"type": "DrainInProgress", "status": "True", "reason": "A", "message": "two"}]}})),
        )
        .await
        .unwrap();
    let got = nodes.get("n1").await.unwrap();
    let conditions = got.status.unwrap().conditions.unwrap();
    let types: Vec<&str> = conditions.iter().map(|c| c.type_.as_str()).collect();
    assert_eq!(types, vec!["Ready", "DrainInProgress"]);
    assert_eq!(conditions[1].message.as_deref(), Some("two"));
    assert_eq!(
        conditions[1]
            .last_transition_time
            .as_ref()
            .map(|t| t.0.to_string()),
        Some("2026-11-28T10:00:00Z".to_string())
    );
    assert_eq!(
        got.spec.unwrap().unschedulable,
        None,
        "the status subresource changes no spec"
    );
}

#[tokio::test]
async fn watch_and_reflector_follow_changes_and_survive_a_restart() {
    let s = sim().await;
    let client = s.client();
    let nodes: Api<Node> = Api::all(client.clone());
    let (store, writer) = reflector::store::<Node>();
    let stream = reflector::reflector(writer, watcher(nodes.clone(), watcher::Config::default()))
        .default_backoff()
        .touched_objects();
    tokio::spawn(async move {
        futures::pin_mut!(stream);
        while stream.next().await.is_some() {}
    });
    s.create(&fixtures::node("n1", "p1", &[])).unwrap();
    eventually("reflector sees n1", || {
        store.get(&reflector::ObjectRef::new("n1")).is_some()
    })
    .await;
    s.restart_http().await.unwrap();
    s.create(&fixtures::node("n2", "p2", &[])).unwrap();
    eventually("reflector sees n2 after the restart", || {
        store.state().len() == 2
    })
    .await;
    assert!(s.remove::<Node>("", "n1"));
    eventually("reflector drops n1", || store.state().len() == 1).await;
    // State survived the restart.
    assert!(nodes.get("n2").await.is_ok());
}

#[tokio::test]
async fn graceful_deletion_waits_for_the_prestop_hook() {
    let s = sim().await;
    s.create(&fixtures::node("n1", "p", &[])).unwrap();
    s.create(&fixtures::pod("ns", "app", "n1", "web", 0.3))
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(s.client(), "ns");
    pods.delete("app", &DeleteParams::default()).await.unwrap();
    let p = pods.get("app").await.unwrap();
    assert!(
        p.metadata.deletion_timestamp.is_some(),
        "still there, terminating"
    );
    eventually("the kubelet removes the pod", || {
        s.get::<Pod>("ns", "app").is_none()
    })
    .await;
    let audit = s.audit();
    let started = audit
        .iter()
        .position(|a| a.verb == "deletion-started" && a.name == "app")
        .unwrap();
    let removed = audit
        .iter()
        .position(|a| a.verb == "removed" && a.name == "app")
        .unwrap();
    assert!(started < removed);
    assert!(audit[removed].at.duration_since(audit[started].at) >= Duration::from_millis(250));
}

/// Two nodes, ReplicaSet `web` (2 replicas, `prestop` seconds) in `ns` and its budget
/// `web-pdb` allowing one disruption.
async fn web_behind_a_budget(ready_delay: Duration, prestop: f64) -> SimCluster {
    let s = SimCluster::start(SimOptions { ready_delay }).await.unwrap();
    s.create(&fixtures::node("n1", "p1", &[])).unwrap();
    s.create(&fixtures::node("n2", "p2", &[])).unwrap();
    s.create(&fixtures::replicaset("ns", "web", 2, prestop))
        .unwrap();
    s.create(&fixtures::pdb("ns", "web", 1)).unwrap();
    s
}

/// A new spec for `web-pdb`: two may go.
async fn allow_two(budgets: &Api<PodDisruptionBudget>) {
    budgets
        .patch(
            "web-pdb",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"maxUnavailable": 2}})),
        )
        .await
        .unwrap();
}

/// `web-pdb`'s stored `status.disruptionsAllowed`.
fn allowed(s: &SimCluster) -> Option<i64> {
    s.get::<PodDisruptionBudget>("ns", "web-pdb")
        .and_then(|b| b["status"]["disruptionsAllowed"].as_i64())
}

async fn pod_names(pods: &Api<Pod>) -> Vec<String> {
    pods.list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|p| p.metadata.name.unwrap())
        .collect()
}

#[tokio::test]
async fn eviction_respects_the_pdb_and_the_replicaset_replaces_the_pod() {
    // Replacements take a second to be Ready, so the second eviction surely comes first.
    let s = web_behind_a_budget(Duration::from_secs(1), 0.1).await;
    let pods: Api<Pod> = Api::namespaced(s.client(), "ns");
    let ready = |s: &SimCluster| {
        s.list::<Pod>()
            .iter()
            .filter(|p| {
                p["metadata"]["deletionTimestamp"].is_null()
                    && p["status"]["conditions"][0]["status"] == "True"
            })
            .count()
    };
    eventually("2 ready replicas", || ready(&s) == 2).await;
    // The disruption controller writes the status a moment after the pods change;
    // the API server decides on that status.
    eventually("the budget allows one", || allowed(&s) == Some(1)).await;
    let names = pod_names(&pods).await;
    // Cordon n1 so the replacement lands elsewhere.
    let nodes: Api<Node> = Api::all(s.client());
    merge_spec(&nodes, "n1", json!({"unschedulable": true})).await;
    pods.evict(&names[0], &EvictParams::default())
        .await
        .unwrap();
    // The second eviction right away would leave 0 ready: 429.
    let (code, msg) = api_err(
        pods.evict(&names[1], &EvictParams::default())
            .await
            .unwrap_err(),
    );
    assert_eq!(code, 429);
    assert!(msg.contains("disruption budget"), "{msg}");
    // The ReplicaSet replaces the evicted pod; once Ready, the budget allows again.
    eventually("replacement ready", || {
        ready(&s) == 2 && s.get::<Pod>("ns", &names[0]).is_none()
    })
    .await;
    eventually("the budget allows one again", || allowed(&s) == Some(1)).await;
    pods.evict(&names[1], &EvictParams::default())
        .await
        .unwrap();
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(s.client(), "ns");
    let st = pdbs.get("web-pdb").await.unwrap().status.unwrap();
    assert_eq!(st.disruptions_allowed, 0);
    let audit = s.audit();
    assert!(audit
        .iter()
        .any(|a| a.verb == "eviction-denied" && a.name == names[1]));
    assert!(s.list::<ReplicaSet>().len() == 1);
}

/// The disruption controller of the fake writes a budget's status when its pods
/// change, so a watch of budgets sees `disruptionsAllowed` move; the API server
/// decides evictions on that status, and refuses while it describes an older spec.
#[tokio::test]
async fn a_budgets_status_is_written_and_watched_and_decides_evictions() {
    let s = web_behind_a_budget(Duration::from_millis(300), 0.0).await;
    let budgets: Api<PodDisruptionBudget> = Api::namespaced(s.client(), "ns");
    let seen: Arc<parking_lot::Mutex<Vec<(i32, i64)>>> = Arc::default();
    let watch = {
        let seen = seen.clone();
        let budgets = budgets.clone();
        tokio::spawn(async move {
            let stream = watcher(budgets, watcher::Config::default()).applied_objects();
            futures::pin_mut!(stream);
            while let Some(Ok(b)) = stream.next().await {
                if let Some(st) = b.status {
                    seen.lock()
                        .push((st.disruptions_allowed, st.observed_generation.unwrap_or(0)));
                }
            }
        })
    };
    eventually("the budget allows one", || allowed(&s) == Some(1)).await;
    eventually("the watch saw it", || seen.lock().last() == Some(&(1, 1))).await;
    let pods: Api<Pod> = Api::namespaced(s.client(), "ns");
    let names = pod_names(&pods).await;
    pods.evict(&names[0], &EvictParams::default())
        .await
        .unwrap();
    // Written with the eviction, before it answered: no lag to race.
    assert_eq!(allowed(&s), Some(0));
    eventually("the watch saw none allowed", || {
        seen.lock().last() == Some(&(0, 1))
    })
    .await;
    // The replacement becomes Ready: the controller allows one again, on the watch.
    eventually("the watch saw one allowed again", || {
        seen.lock().last() == Some(&(1, 1))
    })
    .await;
    // A new spec: the generation moves, and the status follows it.
    allow_two(&budgets).await;
    eventually("the status describes generation 2", || {
        seen.lock().last() == Some(&(2, 2))
    })
    .await;
    let b = budgets.get("web-pdb").await.unwrap();
    assert_eq!(b.metadata.generation, Some(2));
    watch.abort();
}

#[tokio::test]
async fn an_eviction_is_refused_while_the_status_describes_an_older_spec() {
    let s = sim().await;
    s.create(&fixtures::node("n1", "p1", &[])).unwrap();
    s.create(&fixtures::replicaset("ns", "web", 3, 0.0))
        .unwrap();
    s.create(&fixtures::pdb("ns", "web", 1)).unwrap();
    let status_of = |s: &SimCluster| {
        s.get::<PodDisruptionBudget>("ns", "web-pdb")
            .map(|b| b["status"].clone())
            .unwrap_or_default()
    };
    eventually("3 ready and one allowed", || {
        status_of(&s)["disruptionsAllowed"] == 1 && status_of(&s)["currentHealthy"] == 3
    })
    .await;
    // A status a lagging disruption controller left: it describes no spec yet. The
    // fake's controller writes again only when pods or the spec change.
    let budgets: Api<PodDisruptionBudget> = Api::namespaced(s.client(), "ns");
    budgets
        .patch(
            "web-pdb",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"observedGeneration": 0}})),
        )
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(s.client(), "ns");
    let name = pods.list(&ListParams::default()).await.unwrap().items[0]
        .metadata
        .name
        .clone()
        .unwrap();
    let refused = match pods.evict(&name, &EvictParams::default()).await {
        Err(kube::Error::Api(s)) => s,
        other => panic!("the pods would allow one, the stored status does not: {other:?}"),
    };
    assert_eq!(refused.code, 429);
    let cause = &refused.details.as_ref().unwrap().causes[0];
    assert_eq!(cause.reason, "DisruptionBudget");
    assert!(cause.message.contains("still being processed"), "{cause:?}");
    // A new spec: the controller writes a status for it, and the eviction goes.
    allow_two(&budgets).await;
    eventually("a status for generation 2", || {
        status_of(&s)["observedGeneration"] == 2
    })
    .await;
    pods.evict(&name, &EvictParams::default()).await.unwrap();
}

#[tokio::test]
async fn daemonset_pods_follow_nodes_and_taints() {
    let s = sim().await;
    s.create(&fixtures::node("n1", "p1", &[])).unwrap();
    s.create(&fixtures::node("n2", "p2", &[])).unwrap();
    s.create(&fixtures::daemonset("logging", "fluentd", 0.0, false))
        .unwrap();
    let on = |s: &SimCluster, node: &str| {
        s.list::<Pod>()
            .iter()
            .filter(|p| {
                p["spec"]["nodeName"] == node && p["metadata"]["deletionTimestamp"].is_null()
            })
            .count()
    };
    eventually("one fluentd per node", || {
        on(&s, "n1") == 1 && on(&s, "n2") == 1
    })
    .await;
    // Taint n1 with something fluentd does not tolerate, evict its pod: not recreated.
    let nodes: Api<Node> = Api::all(s.client());
    let taints = json!([{"key": "drain", "effect": "NoSchedule"}]);
    merge_spec(
        &nodes,
        "n1",
        json!({"unschedulable": true, "taints": taints}),
    )
    .await;
    let pods: Api<Pod> = Api::namespaced(s.client(), "logging");
    let victim = s
        .list::<Pod>()
        .into_iter()
        .find(|p| p["spec"]["nodeName"] == "n1")
        .unwrap();
    pods.evict(
        victim["metadata"]["name"].as_str().unwrap(),
        &EvictParams::default(),
    )
    .await
    .unwrap();
    eventually("n1 has no fluentd", || on(&s, "n1") == 0).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        on(&s, "n1"),
        0,
        "not recreated on a node it does not tolerate"
    );
    assert_eq!(on(&s, "n2"), 1);
    // A deleted node's pods are collected.
    s.remove::<Node>("", "n2");
    eventually("n2's pods gone", || on(&s, "n2") == 0).await;
    assert!(s.requests().total() > 0);
}

/// A DaemonSet that tolerates everything (kube-proxy, the VPC CNI, CSI node plugins,
/// many log shippers) is put back on a cordoned, tainted node once its evicted pod is
/// gone, and not before (the real controller's `shouldRun && !exists`, no surge).
#[tokio::test]
async fn a_daemonset_that_tolerates_everything_comes_back_once_its_pod_is_gone() {
    let s = sim().await;
    s.create(&fixtures::node("n1", "p1", &[])).unwrap();
    s.create(&fixtures::daemonset("kube-system", "kube-proxy", 0.3, true))
        .unwrap();
    let here = |s: &SimCluster| -> Vec<(String, bool)> {
        s.list::<Pod>()
            .iter()
            .filter(|p| p["spec"]["nodeName"] == "n1")
            .map(|p| {
                (
                    p["metadata"]["name"].as_str().unwrap().to_string(),
                    !p["metadata"]["deletionTimestamp"].is_null(),
                )
            })
            .collect()
    };
    eventually("kube-proxy on n1", || here(&s).len() == 1).await;
    let nodes: Api<Node> = Api::all(s.client());
    let taints =
        json!([{"key": "ca-asg-provider.io/draining", "value": "true", "effect": "NoSchedule"}]);
    merge_spec(
        &nodes,
        "n1",
        json!({"unschedulable": true, "taints": taints}),
    )
    .await;
    let first = here(&s).remove(0).0;
    let pods: Api<Pod> = Api::namespaced(s.client(), "kube-system");
    pods.evict(&first, &EvictParams::default()).await.unwrap();
    // While the evicted pod runs its preStop, no second pod is placed.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(here(&s), vec![(first.clone(), true)]);
    eventually("a new kube-proxy on the cordoned node", || {
        let h = here(&s);
        h.len() == 1 && h[0].0 != first && !h[0].1
    })
    .await;
    let removed_before_created = {
        let a = s.audit();
        let removed = a
            .iter()
            .position(|e| e.verb == "removed" && e.name == first)
            .unwrap();
        let created = a
            .iter()
            .position(|e| e.verb == "create" && e.kind == "Pod" && e.name != first)
            .unwrap_or(usize::MAX);
        removed < created
    };
    assert!(removed_before_created, "{:?}", s.audit());
}

/// Refusals as a real API server gives them: 403 from a webhook, APF's 429, 500 and
/// 503, each for as many requests as asked, nothing written meanwhile.
#[tokio::test]
async fn refusals_answer_their_status_for_as_many_requests_as_asked() {
    use ca_asg_provider::sim::Refusal;
    let s = sim().await;
    s.create(&fixtures::node("n1", "p1", &[])).unwrap();
    let nodes: Api<Node> = Api::all(s.client());
    let (pp, cordoned) = (
        PatchParams::default(),
        Patch::Merge(json!({"spec": {"unschedulable": true}})),
    );
    let cordon = || nodes.patch("n1", &pp, &cordoned);
    for how in [
        Refusal::Forbidden,
        Refusal::TooManyRequests,
        Refusal::Internal,
        Refusal::Unavailable,
    ] {
        s.refuse("patch", "nodes", 2, how);
        for _ in 0..2 {
            let (code, _) = api_err(cordon().await.unwrap_err());
            assert_eq!(code, how.code(), "{how:?}");
        }
        assert_eq!(
            s.get::<Node>("", "n1").unwrap()["spec"]["unschedulable"],
            serde_json::Value::Null,
            "nothing written while refused"
        );
    }
    s.refuse("patch", "nodes", 5, Refusal::Internal);
    s.heal();
    cordon().await.unwrap();
    assert_eq!(
        s.get::<Node>("", "n1").unwrap()["spec"]["unschedulable"],
        true
    );
    // Other verbs and resources are untouched by a refusal.
    s.refuse("patch", "nodes", 1, Refusal::Unavailable);
    nodes.get("n1").await.unwrap();
}

//! What runs inside the simulated cluster: a fake kubelet (pods become Ready after a
//! delay, terminating pods go away after their preStop time), a scheduler, and the
//! ReplicaSet and DaemonSet controllers, all driven by store changes, not polling.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::sync::broadcast::error::RecvError;

use super::selectors::labels_of;
use super::store::{resource, ResourceDef, Store};
use super::SimOptions;

pub const PRESTOP_ANNOTATION: &str = "sim.ca-asg-provider.io/prestop-seconds";
pub const READY_AFTER_ANNOTATION: &str = "sim.ca-asg-provider.io/ready-after-ms";
/// On a pod whose container never exits after SIGTERM and whose kubelet never
/// confirms its end (a wedged runtime): it stays terminating.
pub const NEVER_EXITS_ANNOTATION: &str = "sim.ca-asg-provider.io/never-exits";
/// On a Node whose kubelet stopped ([`super::SimCluster::stop_kubelet`]).
pub const KUBELET_STOPPED_ANNOTATION: &str = "sim.ca-asg-provider.io/kubelet-stopped";

fn kubelet_stopped(store: &super::store::Inner, node: &str) -> bool {
    store
        .get(nodes(), "", node)
        .is_some_and(|n| !n["metadata"]["annotations"][KUBELET_STOPPED_ANNOTATION].is_null())
}

fn has_finalizers(p: &Value) -> bool {
    p["metadata"]["finalizers"]
        .as_array()
        .is_some_and(|f| !f.is_empty())
}

fn pods() -> &'static ResourceDef {
    resource("", "pods").expect("pods")
}
fn nodes() -> &'static ResourceDef {
    resource("", "nodes").expect("nodes")
}

fn is_ready(o: &Value) -> bool {
    o["status"]["conditions"].as_array().is_some_and(|c| {
        c.iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
    })
}
fn terminating(o: &Value) -> bool {
    !o["metadata"]["deletionTimestamp"].is_null()
}
fn finished(p: &Value) -> bool {
    matches!(
        p["status"]["phase"].as_str(),
        Some("Succeeded") | Some("Failed")
    )
}
fn s<'a>(v: &'a Value, path: &[&str]) -> &'a str {
    let mut cur = v;
    for p in path {
        cur = &cur[*p];
    }
    cur.as_str().unwrap_or("")
}

/// Does a pod's toleration list tolerate this taint?
pub fn tolerates(tolerations: &Value, taint: &Value) -> bool {
    tolerations.as_array().is_some_and(|ts| {
        ts.iter().any(|t| {
            let key_ok = match t["key"].as_str() {
                None | Some("") => t["operator"] == "Exists",
                Some(k) => k == s(taint, &["key"]),
            };
            let value_ok = t["operator"] == "Exists"
                || t["value"].as_str().unwrap_or("") == s(taint, &["value"]);
            let effect_ok = t["effect"]
                .as_str()
                .is_none_or(|e| e.is_empty() || e == s(taint, &["effect"]));
            key_ok && value_ok && effect_ok
        })
    })
}

fn blocking_taints(node: &Value) -> Vec<Value> {
    node["spec"]["taints"]
        .as_array()
        .map(|ts| {
            ts.iter()
                .filter(|t| matches!(t["effect"].as_str(), Some("NoSchedule") | Some("NoExecute")))
                .cloned()
                .collect()
        })
        .unwrap_or_default()
}

/// The node a new pod goes to: Ready, schedulable, taints tolerated, nodeSelector
/// matched; the least loaded.
pub fn pick_node(nodes_list: &[Value], pods_list: &[Value], spec: &Value) -> Option<String> {
    pick_node_loaded(nodes_list, &node_load(pods_list), spec)
}

/// Pods per node, not counting terminating ones.
fn node_load(pods_list: &[Value]) -> HashMap<String, usize> {
    let mut load = HashMap::new();
    for p in pods_list.iter().filter(|p| !terminating(p)) {
        *load
            .entry(s(p, &["spec", "nodeName"]).to_string())
            .or_default() += 1;
    }
    load
}

/// [`pick_node`] with the pods per node counted once by the caller: the controllers
/// place thousands of pods in a storm, and recounting per pod was quadratic.
fn pick_node_loaded(
    nodes_list: &[Value],
    load: &HashMap<String, usize>,
    spec: &Value,
) -> Option<String> {
    let selector = spec["nodeSelector"].as_object();
    nodes_list
        .iter()
        .filter(|n| is_ready(n) && !terminating(n))
        // kube-scheduler's NodeUnschedulable filter: a cordoned node takes pods that
        // tolerate node.kubernetes.io/unschedulable (a blanket `Exists` does).
        .filter(|n| {
            n["spec"]["unschedulable"] != true
                || tolerates(
                    &spec["tolerations"],
                    &json!({"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}),
                )
        })
        .filter(|n| {
            blocking_taints(n)
                .iter()
                .all(|t| tolerates(&spec["tolerations"], t))
        })
        .filter(|n| {
            let labels = labels_of(n);
            selector.is_none_or(|sel| {
                sel.iter()
                    .all(|(k, v)| labels.get(k).map(String::as_str) == v.as_str())
            })
        })
        .min_by_key(|n| {
            let name = s(n, &["metadata", "name"]);
            (load.get(name).copied().unwrap_or(0), name.to_string())
        })
        .map(|n| s(n, &["metadata", "name"]).to_string())
}

fn owner_ref(kind: &str, obj: &Value) -> Value {
    json!([{
        "apiVersion": "apps/v1", "kind": kind, "name": s(obj, &["metadata", "name"]),
        "uid": s(obj, &["metadata", "uid"]), "controller": true, "blockOwnerDeletion": true,
    }])
}

/// Runs the kubelet and controllers until the store's channel closes.
pub fn spawn(store: Arc<Store>, opts: SimOptions) -> tokio::task::JoinHandle<()> {
    let mut rx = store.subscribe();
    tokio::spawn(async move {
        let mut timers: HashSet<String> = HashSet::new();
        reconcile(&store, &opts, &mut timers);
        loop {
            match rx.recv().await {
                Ok(c) => {
                    if c.res.plural == "nodes" && c.kind == super::store::EventType::Deleted {
                        gc_node_pods(&store, s(&c.object, &["metadata", "name"]));
                    }
                }
                Err(RecvError::Lagged(_)) => {}
                Err(RecvError::Closed) => return,
            }
            // Drain whatever else is queued, then reconcile once.
            while let Ok(c) = rx.try_recv() {
                if c.res.plural == "nodes" && c.kind == super::store::EventType::Deleted {
                    gc_node_pods(&store, s(&c.object, &["metadata", "name"]));
                }
            }
            reconcile(&store, &opts, &mut timers);
        }
    })
}

fn gc_node_pods(store: &Store, node: &str) {
    let mut inner = store.lock();
    for p in inner.list(pods(), None) {
        if s(&p, &["spec", "nodeName"]) == node {
            inner.remove(
                pods(),
                s(&p, &["metadata", "namespace"]),
                s(&p, &["metadata", "name"]),
            );
        }
    }
}

fn reconcile(store: &Arc<Store>, opts: &SimOptions, timers: &mut HashSet<String>) {
    let mut inner = store.lock();
    let all_pods = inner.list(pods(), None);
    let all_nodes = inner.list(nodes(), None);
    // Kubelet: timers for pods to become Ready or to finish terminating.
    for p in &all_pods {
        let uid = s(p, &["metadata", "uid"]).to_string();
        let node = s(p, &["spec", "nodeName"]);
        if node.is_empty() {
            continue;
        }
        if terminating(p) {
            let key = format!("del/{uid}");
            if timers.insert(key) {
                let grace = p["metadata"]["deletionGracePeriodSeconds"]
                    .as_f64()
                    .unwrap_or(30.0);
                let prestop = p["metadata"]["annotations"][PRESTOP_ANNOTATION]
                    .as_str()
                    .and_then(|v| v.parse::<f64>().ok())
                    .unwrap_or(0.0);
                let after = Duration::from_secs_f64(prestop.min(grace).max(0.0) + 0.02);
                let (st, ns, name) = (
                    store.clone(),
                    s(p, &["metadata", "namespace"]).to_string(),
                    s(p, &["metadata", "name"]).to_string(),
                );
                let node = node.to_string();
                tokio::spawn(async move {
                    tokio::time::sleep(after).await;
                    let mut inner = st.lock();
                    let Some(p) = inner
                        .get(pods(), &ns, &name)
                        .filter(|p| s(p, &["metadata", "uid"]) == uid)
                        .cloned()
                    else {
                        return;
                    };
                    if kubelet_stopped(&inner, &node)
                        || !p["metadata"]["annotations"][NEVER_EXITS_ANNOTATION].is_null()
                    {
                        // Nobody confirms the termination: it stays terminating.
                        return;
                    }
                    if has_finalizers(&p) {
                        // The containers exited; the object waits for its finalizers.
                        let _ = inner.update(pods(), &ns, &name, "containers-exited", |o| {
                            let mut n = o.clone();
                            n["status"]["phase"] = json!("Succeeded");
                            n["status"]["conditions"] =
                                json!([{"type": "Ready", "status": "False"}]);
                            Ok(n)
                        });
                    } else {
                        inner.remove(pods(), &ns, &name);
                    }
                });
            }
        } else if !is_ready(p) && !finished(p) {
            let key = format!("ready/{uid}");
            if timers.insert(key) {
                let after = p["metadata"]["annotations"][READY_AFTER_ANNOTATION]
                    .as_str()
                    .and_then(|v| v.parse::<u64>().ok())
                    .map(Duration::from_millis)
                    .unwrap_or(opts.ready_delay);
                let (st, ns, name) = (
                    store.clone(),
                    s(p, &["metadata", "namespace"]).to_string(),
                    s(p, &["metadata", "name"]).to_string(),
                );
                tokio::spawn(async move {
                    tokio::time::sleep(after).await;
                    let mut inner = st.lock();
                    let ok = inner
                        .get(pods(), &ns, &name)
                        .is_some_and(|p| s(p, &["metadata", "uid"]) == uid && !terminating(p));
                    if ok {
                        let _ = inner.update(pods(), &ns, &name, "ready", |o| {
                            let mut n = o.clone();
                            n["status"]["phase"] = json!("Running");
                            n["status"]["conditions"] =
                                json!([{"type": "Ready", "status": "True"}]);
                            Ok(n)
                        });
                    }
                });
            }
        }
    }
    // A terminating pod whose containers exited goes once its finalizers are gone.
    for p in all_pods
        .iter()
        .filter(|p| terminating(p) && finished(p) && !has_finalizers(p))
    {
        inner.remove(
            pods(),
            s(p, &["metadata", "namespace"]),
            s(p, &["metadata", "name"]),
        );
    }
    // Scheduler: bind pending pods.
    for p in all_pods
        .iter()
        .filter(|p| s(p, &["spec", "nodeName"]).is_empty() && !terminating(p))
    {
        if let Some(node) = pick_node(&all_nodes, &all_pods, &p["spec"]) {
            let (ns, name) = (
                s(p, &["metadata", "namespace"]).to_string(),
                s(p, &["metadata", "name"]).to_string(),
            );
            let _ = inner.update(pods(), &ns, &name, "bind", |o| {
                let mut n = o.clone();
                n["spec"]["nodeName"] = json!(node);
                Ok(n)
            });
        }
    }
    // ReplicaSets and DaemonSets, from one list of the pods and nodes as they are
    // now (kept current as pods are created), not one list per set and node.
    let pods_now = inner.list(pods(), None);
    let nodes_now = inner.list(nodes(), None);
    let mut load = node_load(&pods_now);
    let mut live: HashMap<String, i64> = HashMap::new();
    let mut ds_on: HashSet<(String, String)> = HashSet::new();
    for p in pods_now.iter().filter(|p| !terminating(p) && !finished(p)) {
        for r in p["metadata"]["ownerReferences"]
            .as_array()
            .into_iter()
            .flatten()
        {
            if r["controller"] != true {
                continue;
            }
            let uid = r["uid"].as_str().unwrap_or_default().to_string();
            *live.entry(uid.clone()).or_default() += 1;
            ds_on.insert((uid, s(p, &["spec", "nodeName"]).to_string()));
        }
    }
    let rs_res = resource("apps", "replicasets").expect("rs");
    for rs in inner.list(rs_res, None) {
        let uid = s(&rs, &["metadata", "uid"]).to_string();
        let ns = s(&rs, &["metadata", "namespace"]).to_string();
        let have = live.get(&uid).copied().unwrap_or(0);
        let want = rs["spec"]["replicas"].as_i64().unwrap_or(1);
        for _ in have..want {
            let mut pod = json!({"metadata": rs["spec"]["template"]["metadata"].clone(), "spec": rs["spec"]["template"]["spec"].clone()});
            pod["metadata"]["generateName"] = json!(format!("{}-", s(&rs, &["metadata", "name"])));
            pod["metadata"]["ownerReferences"] = owner_ref("ReplicaSet", &rs);
            if let Some(n) = pick_node_loaded(&nodes_now, &load, &pod["spec"]) {
                *load.entry(n.clone()).or_default() += 1;
                pod["spec"]["nodeName"] = json!(n);
            }
            pod["status"] = json!({"phase": "Pending"});
            let _ = inner.create(pods(), &ns, pod);
        }
    }
    // DaemonSets: one pod per eligible node.
    let ds_res = resource("apps", "daemonsets").expect("ds");
    for ds in inner.list(ds_res, None) {
        let uid = s(&ds, &["metadata", "uid"]).to_string();
        let ns = s(&ds, &["metadata", "namespace"]).to_string();
        let tolerations = &ds["spec"]["template"]["spec"]["tolerations"];
        for node in &nodes_now {
            let name = s(node, &["metadata", "name"]).to_string();
            if terminating(node) {
                continue;
            }
            let eligible = blocking_taints(node)
                .iter()
                .filter(|t| t["key"] != "node.kubernetes.io/unschedulable")
                .all(|t| tolerates(tolerations, t));
            if !eligible || ds_on.contains(&(uid.clone(), name.clone())) {
                continue;
            }
            let mut pod = json!({"metadata": ds["spec"]["template"]["metadata"].clone(), "spec": ds["spec"]["template"]["spec"].clone()});
            pod["metadata"]["generateName"] = json!(format!("{}-", s(&ds, &["metadata", "name"])));
            pod["metadata"]["ownerReferences"] = owner_ref("DaemonSet", &ds);
            pod["spec"]["nodeName"] = json!(name.clone());
            pod["status"] = json!({"phase": "Pending"});
            if inner.create(pods(), &ns, pod).is_ok() {
                ds_on.insert((uid.clone(), name));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tolerations() {
        let taint = json!({"key": "dedicated", "value": "gpu", "effect": "NoSchedule"});
        assert!(tolerates(&json!([{"operator": "Exists"}]), &taint));
        assert!(tolerates(
            &json!([{"key": "dedicated", "operator": "Equal", "value": "gpu"}]),
            &taint
        ));
        assert!(tolerates(
            &json!([{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}]),
            &taint
        ));
        assert!(!tolerates(
            &json!([{"key": "dedicated", "operator": "Equal", "value": "cpu"}]),
            &taint
        ));
        assert!(!tolerates(
            &json!([{"key": "dedicated", "operator": "Exists", "effect": "NoExecute"}]),
            &taint
        ));
        assert!(!tolerates(&Value::Null, &taint));
    }

    #[test]
    fn scheduler_skips_cordoned_tainted_and_unready_nodes_unless_tolerated() {
        let node = |name: &str, extra: Value| {
            let mut n = json!({"metadata": {"name": name, "labels": {"zone": "a"}}, "spec": {}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}});
            crate::sim::http::merge(&mut n, &extra);
            n
        };
        let nodes = vec![
            node("cordoned", json!({"spec": {"unschedulable": true}})),
            node(
                "tainted",
                json!({"spec": {"taints": [{"key": "x", "effect": "NoSchedule"}]}}),
            ),
            node("busy", json!({})),
            node("free", json!({})),
            node(
                "unready",
                json!({"status": {"conditions": [{"type": "Ready", "status": "False"}]}}),
            ),
        ];
        let pods = vec![json!({"metadata": {}, "spec": {"nodeName": "busy"}})];
        assert_eq!(
            pick_node(&nodes, &pods, &json!({})).as_deref(),
            Some("free")
        );
        assert_eq!(
            pick_node(&nodes, &pods, &json!({"nodeSelector": {"zone": "b"}})),
            None
        );
        // kube-scheduler's NodeUnschedulable filter honours tolerations: a blanket
        // `Exists` lands on a cordoned node too.
        assert_eq!(
            pick_node(
                &nodes[..2],
                &pods,
                &json!({"tolerations": [{"operator": "Exists"}]})
            )
            .as_deref(),
            Some("cordoned")
        );
        assert_eq!(
            pick_node(
                &nodes[..2],
                &pods,
                &json!({"tolerations": [{"key": "x", "operator": "Exists"}]})
            )
            .as_deref(),
            Some("tainted")
        );
    }
}

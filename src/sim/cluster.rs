//! What runs inside the simulated cluster: a fake kubelet (pods become Ready after a
//! delay, terminating pods go away after their preStop time), a scheduler, and the
//! ReplicaSet and DaemonSet controllers, all driven by store changes, not polling.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::sync::broadcast::error::{RecvError, TryRecvError};

use super::eviction;
use super::store::{resource, Change, EventType, Inner, ResourceDef, Store};
use super::SimOptions;

pub const PRESTOP_ANNOTATION: &str = "sim.ca-asg-provider.io/prestop-seconds";
pub const READY_AFTER_ANNOTATION: &str = "sim.ca-asg-provider.io/ready-after-ms";
/// On a pod whose container never exits after SIGTERM and whose kubelet never
/// confirms its end (a wedged runtime): it stays terminating.
pub const NEVER_EXITS_ANNOTATION: &str = "sim.ca-asg-provider.io/never-exits";
/// On a Node whose kubelet stopped ([`super::SimCluster::stop_kubelet`]).
pub const KUBELET_STOPPED_ANNOTATION: &str = "sim.ca-asg-provider.io/kubelet-stopped";

fn kubelet_stopped(store: &Inner, node: &str) -> bool {
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

fn blocking_taints(node: &Value) -> impl Iterator<Item = &Value> {
    node["spec"]["taints"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|t| matches!(t["effect"].as_str(), Some("NoSchedule") | Some("NoExecute")))
}

/// The taint kube-scheduler's NodeUnschedulable filter stands for.
fn unschedulable_taint() -> &'static Value {
    static TAINT: std::sync::LazyLock<Value> = std::sync::LazyLock::new(
        || json!({"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}),
    );
    &TAINT
}

/// The node a new pod goes to: Ready, schedulable, taints tolerated, nodeSelector
/// matched; the least loaded.
pub fn pick_node(nodes_list: &[Value], pods_list: &[Value], spec: &Value) -> Option<String> {
    let mut load = BTreeMap::new();
    for p in pods_list.iter().filter(|p| !terminating(p)) {
        *load
            .entry(s(p, &["spec", "nodeName"]).to_string())
            .or_default() += 1;
    }
    pick_node_loaded(nodes_list.iter(), &load, spec)
}

/// [`pick_node`] with the pods per node kept by the caller: the controllers place
/// thousands of pods in a storm, and recounting per pod was quadratic.
fn pick_node_loaded<'a>(
    nodes_list: impl Iterator<Item = &'a Value>,
    load: &BTreeMap<String, usize>,
    spec: &Value,
) -> Option<String> {
    let selector = spec["nodeSelector"].as_object();
    let tolerations = &spec["tolerations"];
    nodes_list
        .filter(|n| is_ready(n) && !terminating(n))
        // kube-scheduler's NodeUnschedulable filter: a cordoned node takes pods that
        // tolerate node.kubernetes.io/unschedulable (a blanket `Exists` does).
        .filter(|n| {
            n["spec"]["unschedulable"] != true || tolerates(tolerations, unschedulable_taint())
        })
        .filter(|n| blocking_taints(n).all(|t| tolerates(tolerations, t)))
        .filter(|n| {
            let labels = &n["metadata"]["labels"];
            selector.is_none_or(|sel| {
                sel.iter()
                    .all(|(k, v)| labels[k].as_str().is_some() && labels[k].as_str() == v.as_str())
            })
        })
        .min_by_key(|n| {
            let name = s(n, &["metadata", "name"]);
            (load.get(name).copied().unwrap_or(0), name)
        })
        .map(|n| s(n, &["metadata", "name"]).to_string())
}

fn owner_ref(kind: &str, obj: &Value) -> Value {
    json!([{
        "apiVersion": "apps/v1", "kind": kind, "name": s(obj, &["metadata", "name"]),
        "uid": s(obj, &["metadata", "uid"]), "controller": true, "blockOwnerDeletion": true,
    }])
}

/// A new pod from a controller's template, owned by it (status and node set by the caller).
fn pod_of(kind: &str, owner: &Value) -> Value {
    let template = &owner["spec"]["template"];
    let mut pod =
        json!({"metadata": template["metadata"].clone(), "spec": template["spec"].clone()});
    pod["metadata"]["generateName"] = json!(format!("{}-", s(owner, &["metadata", "name"])));
    pod["metadata"]["ownerReferences"] = owner_ref(kind, owner);
    pod
}

/// The kind and UID of a pod's controller (its ownerReference with `controller: true`).
fn controller_of(p: &Value) -> Option<(&str, &str)> {
    let r = p["metadata"]["ownerReferences"]
        .as_array()?
        .iter()
        .find(|r| r["controller"] == true)?;
    Some((r["kind"].as_str().unwrap_or(""), r["uid"].as_str()?))
}

/// Runs the kubelet and controllers until the store's channel closes.
pub fn spawn(store: Arc<Store>, opts: SimOptions) -> tokio::task::JoinHandle<()> {
    let mut rx = store.subscribe();
    tokio::spawn(async move {
        let mut state = Controllers::new(opts);
        {
            let mut inner = store.lock();
            state.rebuild(&store, &mut inner);
            state.act(&mut inner);
        }
        loop {
            let first = match rx.recv().await {
                Ok(c) => Some(c),
                Err(RecvError::Lagged(_)) => None,
                Err(RecvError::Closed) => return,
            };
            // Every change up to the store's current version is in the channel when
            // the lock is held (changes are sent under it): fold them all, then act
            // on a view that is exact.
            let mut inner = store.lock();
            let mut lagged = first.is_none();
            if let Some(c) = first {
                state.fold(&store, &mut inner, &c);
            }
            loop {
                match rx.try_recv() {
                    Ok(c) => state.fold(&store, &mut inner, &c),
                    Err(TryRecvError::Lagged(_)) => lagged = true,
                    Err(_) => break,
                }
            }
            if lagged {
                state.rebuild(&store, &mut inner);
            }
            state.act(&mut inner);
        }
    })
}

/// The kubelet's, the scheduler's and the controllers' view, kept from the store's
/// changes (a full pass over every pod per change made a 500-node storm measure the
/// fake instead of the drain).
struct Controllers {
    opts: SimOptions,
    /// Pods (by UID) whose Ready or termination timer is set.
    ready_timers: BTreeSet<String>,
    gone_timers: BTreeSet<String>,
    /// Live (not terminating, not finished) pods per controller UID.
    live: BTreeMap<String, i64>,
    /// Every pod object (terminating and finished ones too, until removed) per
    /// controller UID and node: the DaemonSet controller puts a pod back on a node
    /// only once the one there is gone, as the real one does without `maxSurge`.
    held_on_node: BTreeMap<String, BTreeMap<String, i64>>,
    /// Pods per node, not counting terminating ones (the scheduler's spreading).
    load: BTreeMap<String, usize>,
    /// Every pod bound to a node, for the pod GC when the node goes.
    bound: BTreeMap<String, BTreeSet<(String, String)>>,
    /// Pods waiting for a node.
    pending: BTreeSet<(String, String)>,
    /// ReplicaSets by UID, to find the ones whose pods changed.
    replicasets: BTreeMap<String, (String, String)>,
    /// What changed since the last pass, so each controller looks only at that: the
    /// ReplicaSets whose pods changed (all of them after a ReplicaSet change), the
    /// nodes a DaemonSet pod or the Node itself changed on (all of them after a
    /// DaemonSet change), and whether a pod waits for the scheduler. A pass over every
    /// set and node per change made the fake, not the drain, the cost of a storm.
    rs_dirty: BTreeSet<String>,
    all_rs_dirty: bool,
    ds_nodes_dirty: BTreeSet<String>,
    all_ds_dirty: bool,
    sched_dirty: bool,
    /// The disruption controller's work: the budgets (namespace, name) whose pods,
    /// ReplicaSets or spec changed, so their status is written again.
    budgets_dirty: BTreeSet<(String, String)>,
    all_budgets_dirty: bool,
}

/// What one pod adds to the controllers' counts.
struct Contribution {
    ns: String,
    name: String,
    node: String,
    owner: Option<String>,
    owned_by_daemonset: bool,
    live: bool,
    counts_load: bool,
    pending: bool,
}

impl Contribution {
    fn of(p: &Value) -> Self {
        let (term, done) = (terminating(p), finished(p));
        let node = s(p, &["spec", "nodeName"]).to_string();
        Self {
            ns: s(p, &["metadata", "namespace"]).to_string(),
            name: s(p, &["metadata", "name"]).to_string(),
            owner: controller_of(p).map(|(_, uid)| uid.to_string()),
            owned_by_daemonset: controller_of(p).is_some_and(|(kind, _)| kind == "DaemonSet"),
            live: !term && !done,
            counts_load: !term,
            pending: node.is_empty() && !term,
            node,
        }
    }
}

impl Controllers {
    fn new(opts: SimOptions) -> Self {
        Self {
            opts,
            ready_timers: BTreeSet::new(),
            gone_timers: BTreeSet::new(),
            live: BTreeMap::new(),
            held_on_node: BTreeMap::new(),
            load: BTreeMap::new(),
            bound: BTreeMap::new(),
            pending: BTreeSet::new(),
            replicasets: BTreeMap::new(),
            rs_dirty: BTreeSet::new(),
            all_rs_dirty: true,
            ds_nodes_dirty: BTreeSet::new(),
            all_ds_dirty: true,
            sched_dirty: true,
            budgets_dirty: BTreeSet::new(),
            all_budgets_dirty: true,
        }
    }

    /// The budgets that select `p` (as it was or is now) need their status again.
    fn budgets_of_pod(&mut self, inner: &Inner, p: &Value) {
        let ns = s(p, &["metadata", "namespace"]);
        for b in eviction::budgets_selecting(inner, ns, p) {
            self.budgets_dirty
                .insert((ns.to_string(), s(&b, &["metadata", "name"]).to_string()));
        }
    }

    fn count(&mut self, p: &Value, sign: i64) {
        let c = Contribution::of(p);
        let key = (c.ns.clone(), c.name.clone());
        if c.owned_by_daemonset {
            self.ds_nodes_dirty.insert(c.node.clone());
        } else if let Some(owner) = &c.owner {
            self.rs_dirty.insert(owner.clone());
        }
        if let Some(owner) = &c.owner {
            *self
                .held_on_node
                .entry(owner.clone())
                .or_default()
                .entry(c.node.clone())
                .or_default() += sign;
        }
        if c.live {
            if let Some(owner) = &c.owner {
                *self.live.entry(owner.clone()).or_default() += sign;
            }
        }
        if c.counts_load {
            let l = self.load.entry(c.node.clone()).or_default();
            *l = if sign > 0 {
                *l + 1
            } else {
                l.saturating_sub(1)
            };
        }
        if !c.node.is_empty() {
            let on = self.bound.entry(c.node.clone()).or_default();
            if sign > 0 {
                on.insert(key.clone());
            } else {
                on.remove(&key);
            }
        }
        if c.pending && sign > 0 {
            self.pending.insert(key);
            self.sched_dirty = true;
        } else if sign < 0 {
            self.pending.remove(&key);
        }
    }

    /// Recounts everything from the store (at start, and when the channel lagged).
    fn rebuild(&mut self, store: &Arc<Store>, inner: &mut Inner) {
        self.live.clear();
        self.held_on_node.clear();
        self.load.clear();
        self.bound.clear();
        self.pending.clear();
        let all: Vec<Arc<Value>> = inner.list(pods(), None);
        for p in &all {
            self.count(p, 1);
        }
        for p in &all {
            self.kubelet(store, inner, p);
        }
        self.replicasets = inner
            .iter(replicasets(), None)
            .map(|rs| {
                (
                    s(rs, &["metadata", "uid"]).to_string(),
                    (
                        s(rs, &["metadata", "namespace"]).to_string(),
                        s(rs, &["metadata", "name"]).to_string(),
                    ),
                )
            })
            .collect();
        self.all_rs_dirty = true;
        self.all_ds_dirty = true;
        self.sched_dirty = true;
        self.all_budgets_dirty = true;
    }

    fn fold(&mut self, store: &Arc<Store>, inner: &mut Inner, c: &Change) {
        match (c.res.plural, c.res.group) {
            ("pods", "") => {
                self.budgets_of_pod(inner, &c.object);
                if let Some(old) = &c.old {
                    self.budgets_of_pod(inner, old);
                    self.count(old, -1);
                } else if c.kind == EventType::Modified {
                    // A change without its old object: recount from scratch.
                    self.rebuild(store, inner);
                    return;
                }
                match c.kind {
                    EventType::Deleted => self.count(&c.object, -1),
                    EventType::Added | EventType::Modified => {
                        self.count(&c.object, 1);
                        self.kubelet(store, inner, &c.object);
                    }
                }
            }
            ("nodes", "") => {
                if c.kind == EventType::Deleted {
                    let name = s(&c.object, &["metadata", "name"]).to_string();
                    self.gc_node_pods(inner, &name);
                }
                self.ds_nodes_dirty
                    .insert(s(&c.object, &["metadata", "name"]).to_string());
                self.sched_dirty = true;
            }
            ("replicasets", "apps") => {
                let uid = s(&c.object, &["metadata", "uid"]).to_string();
                if c.kind == EventType::Deleted {
                    self.replicasets.remove(&uid);
                } else {
                    let key = (
                        s(&c.object, &["metadata", "namespace"]).to_string(),
                        s(&c.object, &["metadata", "name"]).to_string(),
                    );
                    // A new scale changes the pods a budget expects.
                    for b in eviction::budget_names(inner, Some(&key.0)) {
                        self.budgets_dirty.insert(b);
                    }
                    self.replicasets.insert(uid.clone(), key);
                    self.rs_dirty.insert(uid);
                }
            }
            ("daemonsets", "apps") => self.all_ds_dirty = true,
            ("poddisruptionbudgets", "policy") => {
                // Its own status write comes back too: only a new spec is work.
                let spec_changed = c
                    .old
                    .as_ref()
                    .is_none_or(|old| old["spec"] != c.object["spec"]);
                if c.kind != EventType::Deleted && spec_changed {
                    self.budgets_dirty.insert((
                        s(&c.object, &["metadata", "namespace"]).to_string(),
                        s(&c.object, &["metadata", "name"]).to_string(),
                    ));
                }
            }
            _ => {}
        }
    }

    /// The pod GC: pods bound to a Node that is gone are removed.
    fn gc_node_pods(&mut self, inner: &mut Inner, node: &str) {
        for (ns, name) in self.bound.remove(node).unwrap_or_default() {
            let here = inner
                .get(pods(), &ns, &name)
                .is_some_and(|p| s(p, &["spec", "nodeName"]) == node);
            if here {
                inner.remove(pods(), &ns, &name);
            }
        }
    }

    /// The kubelet for one pod as it is now: timers to become Ready or to finish
    /// terminating; a pod whose containers exited goes once its finalizers are gone.
    fn kubelet(&mut self, store: &Arc<Store>, inner: &mut Inner, p: &Value) {
        let uid = s(p, &["metadata", "uid"]).to_string();
        let node = s(p, &["spec", "nodeName"]);
        if node.is_empty() {
            return;
        }
        if terminating(p) && finished(p) && !has_finalizers(p) {
            // `p` is the object as the change carried it: remove what is stored only
            // if it is still that pod and still done.
            let (ns, name) = (
                s(p, &["metadata", "namespace"]),
                s(p, &["metadata", "name"]),
            );
            let still = inner.get(pods(), ns, name).is_some_and(|now| {
                s(now, &["metadata", "uid"]) == uid
                    && terminating(now)
                    && finished(now)
                    && !has_finalizers(now)
            });
            if still {
                inner.remove(pods(), ns, name);
            }
            return;
        }
        if terminating(p) {
            if self.gone_timers.contains(&uid) {
                return;
            }
            self.gone_timers.insert(uid.clone());
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
                        n["status"]["conditions"] = json!([{"type": "Ready", "status": "False"}]);
                        Ok(n)
                    });
                } else {
                    inner.remove(pods(), &ns, &name);
                }
            });
        } else if !is_ready(p) && !finished(p) {
            if self.ready_timers.contains(&uid) {
                return;
            }
            self.ready_timers.insert(uid.clone());
            let after = p["metadata"]["annotations"][READY_AFTER_ANNOTATION]
                .as_str()
                .and_then(|v| v.parse::<u64>().ok())
                .map(Duration::from_millis)
                .unwrap_or(self.opts.ready_delay);
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
                        n["status"]["conditions"] = json!([{"type": "Ready", "status": "True"}]);
                        Ok(n)
                    });
                }
            });
        }
    }

    /// The scheduler and the ReplicaSet and DaemonSet controllers, on the folded view.
    /// Their own writes come back as changes and are folded before the next pass.
    fn act(&mut self, inner: &mut Inner) {
        let sched = self.sched_dirty && !self.pending.is_empty();
        let rs_work = self.all_rs_dirty || !self.rs_dirty.is_empty();
        let ds_work = self.all_ds_dirty || !self.ds_nodes_dirty.is_empty();
        let budget_work = self.all_budgets_dirty || !self.budgets_dirty.is_empty();
        if !(sched || rs_work || ds_work || budget_work) {
            return;
        }
        // Listed when a pod is first placed in this pass, not on every pass.
        let mut nodes_now: Option<Vec<Arc<Value>>> = None;
        // This pass's placements, on top of the folded load (copied only if used).
        let mut load: Option<BTreeMap<String, usize>> = None;
        if sched {
            let mut waiting: Vec<(String, String)> = self.pending.iter().cloned().collect();
            waiting.sort();
            for (ns, name) in waiting {
                let Some(p) = inner.get_shared(pods(), &ns, &name).cloned() else {
                    continue;
                };
                let load = load.get_or_insert_with(|| self.load.clone());
                let candidates = nodes_now.get_or_insert_with(|| inner.list(nodes(), None));
                if let Some(node) =
                    pick_node_loaded(candidates.iter().map(|n| &**n), load, &p["spec"])
                {
                    *load.entry(node.clone()).or_default() += 1;
                    let _ = inner.update(pods(), &ns, &name, "bind", |o| {
                        let mut n = o.clone();
                        n["spec"]["nodeName"] = json!(node);
                        Ok(n)
                    });
                }
            }
        }
        if rs_work {
            let sets: Vec<Arc<Value>> = if self.all_rs_dirty {
                inner.list(replicasets(), None)
            } else {
                self.rs_dirty
                    .iter()
                    .filter_map(|uid| self.replicasets.get(uid))
                    .filter_map(|(ns, name)| inner.get_shared(replicasets(), ns, name).cloned())
                    .collect()
            };
            for rs in sets {
                let uid = s(&rs, &["metadata", "uid"]);
                let have = self.live.get(uid).copied().unwrap_or(0);
                let want = rs["spec"]["replicas"].as_i64().unwrap_or(1);
                let ns = s(&rs, &["metadata", "namespace"]);
                for _ in have..want {
                    let mut pod = pod_of("ReplicaSet", &rs);
                    let load = load.get_or_insert_with(|| self.load.clone());
                    let candidates = nodes_now.get_or_insert_with(|| inner.list(nodes(), None));
                    if let Some(n) =
                        pick_node_loaded(candidates.iter().map(|n| &**n), load, &pod["spec"])
                    {
                        *load.entry(n.clone()).or_default() += 1;
                        pod["spec"]["nodeName"] = json!(n);
                    }
                    pod["status"] = json!({"phase": "Pending"});
                    let _ = inner.create(pods(), ns, pod);
                }
            }
        }
        if ds_work {
            // DaemonSets: one pod per eligible node, on the nodes where something changed.
            // A node whose pod of the set was evicted or deleted gets a new one once
            // that pod is gone, if the set tolerates the node's taints (kube-proxy,
            // the CNI, CSI node plugins and many log shippers tolerate everything):
            // the real controller's `shouldRun && !exists`, cordon included (its pods
            // tolerate node.kubernetes.io/unschedulable).
            let check: Vec<Arc<Value>> = if self.all_ds_dirty {
                inner.list(nodes(), None)
            } else {
                self.ds_nodes_dirty
                    .iter()
                    .filter_map(|n| inner.get_shared(nodes(), "", n).cloned())
                    .collect()
            };
            let ds_res = resource("apps", "daemonsets").expect("ds");
            for ds in inner.list(ds_res, None) {
                let uid = s(&ds, &["metadata", "uid"]);
                let ns = s(&ds, &["metadata", "namespace"]);
                let tolerations = &ds["spec"]["template"]["spec"]["tolerations"];
                let placed = self.held_on_node.get(uid);
                for node in &check {
                    if terminating(node) {
                        continue;
                    }
                    let name = s(node, &["metadata", "name"]);
                    if placed.and_then(|m| m.get(name)).is_some_and(|n| *n > 0) {
                        continue;
                    }
                    let eligible = blocking_taints(node)
                        .filter(|t| t["key"] != "node.kubernetes.io/unschedulable")
                        .all(|t| tolerates(tolerations, t));
                    if !eligible {
                        continue;
                    }
                    let mut pod = pod_of("DaemonSet", &ds);
                    pod["spec"]["nodeName"] = json!(name);
                    pod["status"] = json!({"phase": "Pending"});
                    let _ = inner.create(pods(), ns, pod);
                }
            }
        }
        if budget_work {
            // The disruption controller, after the others: a status describes the pods
            // as this pass left them (its writes come back as changes, like theirs).
            let mut by_ns: BTreeMap<String, Vec<String>> = BTreeMap::new();
            let dirty: Vec<(String, String)> = if self.all_budgets_dirty {
                eviction::budget_names(inner, None)
            } else {
                std::mem::take(&mut self.budgets_dirty)
                    .into_iter()
                    .collect()
            };
            for (ns, name) in dirty {
                by_ns.entry(ns).or_default().push(name);
            }
            for (ns, names) in by_ns {
                eviction::refresh_statuses(inner, &ns, names.iter().map(String::as_str));
            }
        }
        self.budgets_dirty.clear();
        self.all_budgets_dirty = false;
        self.rs_dirty.clear();
        self.all_rs_dirty = false;
        self.ds_nodes_dirty.clear();
        self.all_ds_dirty = false;
        self.sched_dirty = false;
    }
}

fn replicasets() -> &'static ResourceDef {
    resource("apps", "replicasets").expect("replicasets")
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

//! Knowing when pods are gone without polling. A [`PodWatch`] keeps pods indexed by
//! node: either one node's (field selector `spec.nodeName`, a drain's own) or every
//! pod of the cluster (a drain pass's, shared by every drain in it and by the waits
//! on PodDisruptionBudgets). A drain sees its node through [`NodePods`] either way.
//! The watch re-lists by itself after an API-server restart.

use crate::clock::Instant;
use std::collections::BTreeMap;
use std::sync::{Arc, LazyLock};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::core::{Selector, SelectorExt};
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::Api;
use parking_lot::Mutex;
use tokio::sync::watch;

/// How often a wait re-asks whether a listed pod still counts.
const RECHECK: std::time::Duration = std::time::Duration::from_secs(1);

/// The annotation `kubectl apply` leaves: a copy of the whole manifest, never read here.
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// A watch of pods, indexed by node. Dropping the last handle closes it.
pub struct PodWatch {
    index: Arc<Mutex<Index>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for PodWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[derive(Default)]
struct Index {
    /// node -> uid -> pod. Pods not yet bound to a node are not kept.
    by_node: BTreeMap<String, BTreeMap<String, Pod>>,
    /// uid -> its node, to find a pod whose delete event comes.
    node_of: BTreeMap<String, String>,
    /// Buffer for a (re-)list in progress.
    relist: Option<Vec<Pod>>,
    synced: bool,
    /// The drains' wake-ups, per node.
    nodes: BTreeMap<String, watch::Sender<u64>>,
    /// The budget waits' wake-ups: (namespace, selector) -> its matcher and sender.
    selectors: BTreeMap<(String, String), (Selector, watch::Sender<u64>)>,
}

fn uid(p: &Pod) -> String {
    p.metadata.uid.clone().unwrap_or_else(|| {
        format!(
            "{}/{}",
            p.metadata.namespace.as_deref().unwrap_or(""),
            p.metadata.name.as_deref().unwrap_or("")
        )
    })
}

fn node_of(p: &Pod) -> Option<&str> {
    p.spec.as_ref()?.node_name.as_deref()
}

/// What a drain never reads: field owners and `kubectl apply`'s copy of the manifest
/// are most of a stored pod's size, and a pass may hold every pod of the cluster.
fn slim(mut p: Pod) -> Pod {
    p.metadata.managed_fields = None;
    if let Some(a) = p.metadata.annotations.as_mut() {
        a.remove(LAST_APPLIED);
    }
    p
}

impl Index {
    fn bump(&self, node: &str, pod: &Pod) {
        if let Some(tx) = self.nodes.get(node) {
            tx.send_modify(|g| *g += 1);
        }
        let ns = pod.metadata.namespace.as_deref().unwrap_or("");
        let empty = std::collections::BTreeMap::new();
        let labels = pod.metadata.labels.as_ref().unwrap_or(&empty);
        for ((sel_ns, _), (selector, tx)) in &self.selectors {
            if sel_ns == ns && selector.matches(labels) {
                tx.send_modify(|g| *g += 1);
            }
        }
    }

    fn bump_all(&self) {
        for tx in self.nodes.values() {
            tx.send_modify(|g| *g += 1);
        }
        for (_, tx) in self.selectors.values() {
            tx.send_modify(|g| *g += 1);
        }
    }

    fn remove(&mut self, uid: &str) -> Option<(String, Pod)> {
        let node = self.node_of.remove(uid)?;
        let pods = self.by_node.get_mut(&node)?;
        let pod = pods.remove(uid)?;
        if pods.is_empty() {
            self.by_node.remove(&node);
        }
        Some((node, pod))
    }

    fn apply(&mut self, ev: Event<Pod>) {
        match ev {
            Event::Apply(p) => {
                let p = slim(p);
                let id = uid(&p);
                // A pod's node never changes once set, but its first bind arrives as
                // an update of a pod seen unbound.
                if let Some((old, before)) = self.remove(&id) {
                    if node_of(&p) != Some(old.as_str()) {
                        self.bump(&old, &before);
                    }
                }
                if let Some(node) = node_of(&p).map(str::to_string) {
                    self.bump(&node, &p);
                    self.node_of.insert(id.clone(), node.clone());
                    self.by_node.entry(node).or_default().insert(id, p);
                }
            }
            Event::Delete(p) => {
                if let Some((node, before)) = self.remove(&uid(&p)) {
                    self.bump(&node, &before);
                }
            }
            Event::Init => self.relist = Some(Vec::new()),
            Event::InitApply(p) => self.relist.get_or_insert_with(Vec::new).push(slim(p)),
            Event::InitDone => {
                self.by_node.clear();
                self.node_of.clear();
                for p in self.relist.take().unwrap_or_default() {
                    if let Some(node) = node_of(&p).map(str::to_string) {
                        let id = uid(&p);
                        self.node_of.insert(id.clone(), node.clone());
                        self.by_node.entry(node).or_default().insert(id, p);
                    }
                }
                self.synced = true;
                // What changed while the watch was down is not known: everyone looks.
                self.bump_all();
            }
        }
    }
}

impl PodWatch {
    /// One node's pods (a drain's own watch: the API server answers it from its
    /// index by node).
    pub fn of_node(client: kube::Client, node: &str) -> Arc<Self> {
        let cfg = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
        Self::start(Api::all(client), cfg, format!("node {node}"))
    }

    /// Every pod of the cluster (a drain pass's).
    pub fn of_cluster(client: kube::Client) -> Arc<Self> {
        Self::start(
            Api::all(client),
            watcher::Config::default(),
            "every node".into(),
        )
    }

    fn start(api: Api<Pod>, cfg: watcher::Config, what: String) -> Arc<Self> {
        let index = Arc::new(Mutex::new(Index::default()));
        let ix = index.clone();
        let backoff = crate::scalein::kube::watch_backoff::for_watch(&format!("pods {what}"));
        let task = tokio::spawn(async move {
            let stream = watcher::watcher(api, cfg).backoff(backoff);
            futures::pin_mut!(stream);
            while let Some(ev) = stream.next().await {
                match ev {
                    Ok(ev) => ix.lock().apply(ev),
                    Err(e) => {
                        tracing::debug!(pods = %what, error = %e, "pod watch error; the watcher retries")
                    }
                }
            }
        });
        Arc::new(Self { index, task })
    }

    /// A drain's view of one node's pods.
    pub fn node(self: &Arc<Self>, node: &str) -> NodePods {
        let changed = {
            let mut ix = self.index.lock();
            ix.nodes.retain(|_, tx| tx.receiver_count() > 0);
            ix.nodes
                .entry(node.to_string())
                .or_insert_with(|| watch::channel(0).0)
                .subscribe()
        };
        NodePods {
            watch: self.clone(),
            node: node.to_string(),
            changed,
        }
    }

    /// Ticks whenever a pod `selector` picks in `namespace` changes (after the
    /// first list; a re-list ticks too).
    pub fn selector_changes(&self, namespace: &str, selector: &Selector) -> watch::Receiver<u64> {
        let mut ix = self.index.lock();
        ix.selectors.retain(|_, (_, tx)| tx.receiver_count() > 0);
        let key = (namespace.to_string(), selector.to_string());
        let mut rx = ix
            .selectors
            .entry(key)
            .or_insert_with(|| (selector.clone(), watch::channel(0).0))
            .1
            .subscribe();
        rx.borrow_and_update();
        rx
    }
}

static NO_PODS: LazyLock<BTreeMap<String, Pod>> = LazyLock::new(BTreeMap::new);

/// The live set of pods on one node.
pub struct NodePods {
    watch: Arc<PodWatch>,
    node: String,
    changed: watch::Receiver<u64>,
}

impl NodePods {
    /// A drain's own watch of its node's pods.
    pub fn watch(client: kube::Client, node: &str) -> Self {
        PodWatch::of_node(client, node).node(node)
    }

    fn with<R>(&self, f: impl FnOnce(&BTreeMap<String, Pod>, bool) -> R) -> R {
        let ix = self.watch.index.lock();
        f(ix.by_node.get(&self.node).unwrap_or(&NO_PODS), ix.synced)
    }

    /// The pods on the node now (empty until the first list arrived).
    /// A second view of the same node's pods on the same watch (its own change
    /// notifications), for a task beside the one that holds this view.
    pub fn another(&self) -> NodePods {
        self.watch.node(&self.node)
    }

    pub fn pods(&self) -> Vec<Pod> {
        self.with(|pods, _| pods.values().cloned().collect())
    }

    pub fn contains(&self, uid: &str) -> bool {
        self.with(|pods, _| pods.contains_key(uid))
    }

    /// Waits until the first full list arrived, or the deadline.
    pub async fn synced(&mut self, deadline: Instant) -> bool {
        loop {
            if self.with(|_, synced| synced) {
                return true;
            }
            match tokio::time::timeout_at(deadline, self.changed.changed()).await {
                Ok(Ok(())) => continue,
                Ok(Err(_)) | Err(_) => return self.with(|_, synced| synced),
            }
        }
    }

    /// Waits until none of these pods (by uid) is on the node, or `done` says the
    /// one still listed need not be waited for, or the deadline. `done` is asked
    /// again every second, so time-based answers (a pod stuck terminating) are
    /// seen without a pod event. Returns whether they are all gone or done.
    pub async fn wait_gone(
        &mut self,
        uids: &[String],
        deadline: Instant,
        done: impl Fn(&Pod) -> bool,
    ) -> bool {
        let all =
            |pods: &BTreeMap<String, Pod>, _| uids.iter().all(|u| pods.get(u).is_none_or(&done));
        loop {
            if self.with(all) {
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            let tick = (now + RECHECK).min(deadline);
            if let Ok(Err(_)) = tokio::time::timeout_at(tick, self.changed.changed()).await {
                // The watch is gone: nothing will wake us but the clock.
                tokio::time::sleep_until(tick).await;
            }
        }
    }

    /// The pod with this uid, if still listed.
    pub fn get(&self, uid: &str) -> Option<Pod> {
        self.with(|pods, _| pods.get(uid).cloned())
    }

    /// Waits for the next change of the pod set (or the deadline).
    pub async fn next_change(&mut self, deadline: Instant) {
        let _ = tokio::time::timeout_at(deadline, self.changed.changed()).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PodSpec;
    use kube::api::ObjectMeta;

    fn pod(uid: &str, node: Option<&str>, labels: &[(&str, &str)]) -> Pod {
        Pod {
            metadata: ObjectMeta {
                uid: Some(uid.into()),
                namespace: Some("ns".into()),
                name: Some(uid.into()),
                labels: Some(
                    labels
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                ),
                annotations: Some([(LAST_APPLIED.to_string(), "{...}".to_string())].into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                node_name: node.map(str::to_string),
                ..Default::default()
            }),
            status: None,
        }
    }

    fn sub(ix: &mut Index, node: &str) -> watch::Receiver<u64> {
        ix.nodes
            .entry(node.into())
            .or_insert_with(|| watch::channel(0).0)
            .subscribe()
    }

    #[test]
    fn pods_are_indexed_by_node_and_each_node_wakes_only_for_its_own() {
        let mut ix = Index::default();
        let mut a = sub(&mut ix, "a");
        let mut b = sub(&mut ix, "b");
        ix.apply(Event::Init);
        ix.apply(Event::InitApply(pod("1", Some("a"), &[])));
        ix.apply(Event::InitApply(pod("2", Some("b"), &[])));
        ix.apply(Event::InitApply(pod("3", None, &[])));
        assert!(!ix.synced, "not synced before the list ends");
        ix.apply(Event::InitDone);
        assert!(ix.synced);
        assert!(a.has_changed().unwrap() && b.has_changed().unwrap());
        a.borrow_and_update();
        b.borrow_and_update();
        assert_eq!(ix.by_node["a"].len(), 1);
        assert!(
            !ix.node_of.contains_key("3"),
            "an unbound pod is not on a node"
        );
        let stored = &ix.by_node["a"]["1"];
        assert!(
            stored.metadata.annotations.as_ref().unwrap().is_empty(),
            "the manifest copy is not kept"
        );

        // The pending pod is bound to b: only b wakes.
        ix.apply(Event::Apply(pod("3", Some("b"), &[])));
        assert!(!a.has_changed().unwrap());
        assert!(b.has_changed().unwrap());
        b.borrow_and_update();
        assert_eq!(ix.by_node["b"].len(), 2);

        // A pod of a leaves: a wakes, its node empties.
        ix.apply(Event::Delete(pod("1", Some("a"), &[])));
        assert!(a.has_changed().unwrap());
        assert!(!b.has_changed().unwrap());
        assert!(!ix.by_node.contains_key("a"));
    }

    #[test]
    fn a_budget_wait_wakes_only_for_the_pods_its_selector_picks() {
        let mut ix = Index::default();
        let web: Selector = kube::core::Expression::Equal("app".into(), "web".into()).into();
        let mut rx = ix
            .selectors
            .entry(("ns".into(), web.to_string()))
            .or_insert_with(|| (web.clone(), watch::channel(0).0))
            .1
            .subscribe();
        ix.apply(Event::Init);
        ix.apply(Event::InitDone);
        rx.borrow_and_update();
        ix.apply(Event::Apply(pod("1", Some("a"), &[("app", "db")])));
        assert!(!rx.has_changed().unwrap(), "another app's pod");
        ix.apply(Event::Apply(pod("2", Some("a"), &[("app", "web")])));
        assert!(rx.has_changed().unwrap(), "a selected pod changed");
        rx.borrow_and_update();
        let mut other_ns = pod("3", Some("a"), &[("app", "web")]);
        other_ns.metadata.namespace = Some("other".into());
        ix.apply(Event::Apply(other_ns));
        assert!(!rx.has_changed().unwrap(), "same labels, another namespace");
    }
}

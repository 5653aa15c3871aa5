//! The object store of the in-memory API server: JSON objects by resource, one
//! global resourceVersion, a bounded history for watch resumption, an audit log.

use crate::clock::Instant;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

use parking_lot::Mutex;
use serde_json::{json, Value};
use tokio::sync::broadcast;

/// One served resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResourceDef {
    pub group: &'static str,
    pub version: &'static str,
    pub plural: &'static str,
    pub kind: &'static str,
    pub namespaced: bool,
}

impl ResourceDef {
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    fn is_pods(&self) -> bool {
        self.group.is_empty() && self.plural == "pods"
    }
}

pub const RESOURCES: &[ResourceDef] = &[
    ResourceDef {
        group: "",
        version: "v1",
        plural: "pods",
        kind: "Pod",
        namespaced: true,
    },
    ResourceDef {
        group: "",
        version: "v1",
        plural: "nodes",
        kind: "Node",
        namespaced: false,
    },
    ResourceDef {
        group: "",
        version: "v1",
        plural: "persistentvolumeclaims",
        kind: "PersistentVolumeClaim",
        namespaced: true,
    },
    ResourceDef {
        group: "",
        version: "v1",
        plural: "namespaces",
        kind: "Namespace",
        namespaced: false,
    },
    ResourceDef {
        group: "",
        version: "v1",
        plural: "events",
        kind: "Event",
        namespaced: true,
    },
    ResourceDef {
        group: "events.k8s.io",
        version: "v1",
        plural: "events",
        kind: "Event",
        namespaced: true,
    },
    ResourceDef {
        group: "policy",
        version: "v1",
        plural: "poddisruptionbudgets",
        kind: "PodDisruptionBudget",
        namespaced: true,
    },
    ResourceDef {
        group: "apps",
        version: "v1",
        plural: "daemonsets",
        kind: "DaemonSet",
        namespaced: true,
    },
    ResourceDef {
        group: "apps",
        version: "v1",
        plural: "replicasets",
        kind: "ReplicaSet",
        namespaced: true,
    },
    ResourceDef {
        group: "storage.k8s.io",
        version: "v1",
        plural: "volumeattachments",
        kind: "VolumeAttachment",
        namespaced: false,
    },
    ResourceDef {
        group: "coordination.k8s.io",
        version: "v1",
        plural: "leases",
        kind: "Lease",
        namespaced: true,
    },
    // Answered, not stored: see `SimCluster::grant`.
    ResourceDef {
        group: "authorization.k8s.io",
        version: "v1",
        plural: "selfsubjectaccessreviews",
        kind: "SelfSubjectAccessReview",
        namespaced: false,
    },
];

pub fn resource(group: &str, plural: &str) -> Option<&'static ResourceDef> {
    RESOURCES
        .iter()
        .find(|r| r.group == group && r.plural == plural)
}

pub fn resource_of_kind(kind: &str, api_version: &str) -> Option<&'static ResourceDef> {
    RESOURCES
        .iter()
        .find(|r| r.kind == kind && r.api_version() == api_version)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// A change, as watchers and the sim's controllers see it.
#[derive(Debug, Clone)]
pub struct Change {
    pub rv: u64,
    pub res: &'static ResourceDef,
    pub kind: EventType,
    /// Shared with the store: a change costs a reference count, not a copy.
    pub object: Arc<Value>,
    pub old: Option<Arc<Value>>,
}

/// An API error as a Status.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{code} {reason}: {message}")]
pub struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    pub causes: Vec<Value>,
}

impl ApiError {
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason,
            message: message.into(),
            causes: vec![],
        }
    }

    pub fn not_found(res: &ResourceDef, name: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("{} \"{name}\" not found", res.plural),
        )
    }

    pub fn to_status(&self) -> Value {
        json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {},
            "status": "Failure", "message": self.message, "reason": self.reason,
            "details": {"causes": self.causes}, "code": self.code,
        })
    }
}

/// One line of the audit log, in order.
#[derive(Debug, Clone)]
pub struct AuditEntry {
    pub seq: u64,
    pub at: Instant,
    /// create, update, patch, patch status (through the status subresource), delete,
    /// deletion-started, removed, evicted, eviction-denied, ready.
    pub verb: String,
    pub kind: &'static str,
    pub namespace: String,
    pub name: String,
}

const HISTORY: usize = 20_000;

/// Changes to replay and the channel for the ones that follow.
pub(crate) type Resume = (Vec<Arc<Change>>, broadcast::Receiver<Arc<Change>>);

/// Objects of one resource, by namespace ("" for cluster-scoped ones), then name.
/// Values are shared: a list or a change hands out references, never copies.
type Objects = BTreeMap<String, BTreeMap<String, Arc<Value>>>;

/// Pod names by (namespace, label key, label value).
type LabelIndex = BTreeMap<(String, String, String), BTreeSet<String>>;

pub(crate) struct Inner {
    /// By (API group, plural).
    objects: BTreeMap<(&'static str, &'static str), Objects>,
    /// Pods by label, for PodDisruptionBudget selectors: an eviction checks the
    /// budget's pods, not every pod of the namespace.
    pod_labels: LabelIndex,
    rv: u64,
    uid: u64,
    history: VecDeque<Arc<Change>>,
    pub(crate) audit: Vec<AuditEntry>,
    tx: broadcast::Sender<Arc<Change>>,
}

pub struct Store {
    inner: Mutex<Inner>,
    tx: broadcast::Sender<Arc<Change>>,
}

/// A time as kube-apiserver writes `metav1.Time` (creationTimestamp,
/// deletionTimestamp): RFC 3339 in whole seconds, the fraction cut off.
fn whole_seconds(t: k8s_openapi::jiff::Timestamp) -> String {
    k8s_openapi::jiff::Timestamp::from_second(t.as_second())
        .unwrap_or(t)
        .to_string()
}

fn rfc3339_in(secs: i64) -> String {
    let t = k8s_openapi::jiff::Timestamp::from_second(crate::clock::utc_now().timestamp())
        .unwrap_or(k8s_openapi::jiff::Timestamp::MIN)
        .checked_add(k8s_openapi::jiff::SignedDuration::from_secs(secs))
        .unwrap_or(k8s_openapi::jiff::Timestamp::MAX);
    whole_seconds(t)
}

fn now_rfc3339() -> String {
    whole_seconds(
        k8s_openapi::jiff::Timestamp::from_second(crate::clock::utc_now().timestamp())
            .unwrap_or(k8s_openapi::jiff::Timestamp::MIN),
    )
}

impl Inner {
    fn bump(&mut self) -> u64 {
        self.rv += 1;
        self.rv
    }

    fn emit(
        &mut self,
        res: &'static ResourceDef,
        kind: EventType,
        object: Arc<Value>,
        old: Option<Arc<Value>>,
    ) {
        let c = Arc::new(Change {
            rv: self.rv,
            res,
            kind,
            object,
            old,
        });
        if self.history.len() >= HISTORY {
            self.history.pop_front();
        }
        self.history.push_back(c.clone());
        let _ = self.tx.send(c);
    }

    pub(crate) fn note(&mut self, verb: &str, res: &ResourceDef, ns: &str, name: &str) {
        let seq = self.audit.len() as u64;
        self.audit.push(AuditEntry {
            seq,
            at: Instant::now(),
            verb: verb.to_string(),
            kind: res.kind,
            namespace: ns.to_string(),
            name: name.to_string(),
        });
    }

    pub(crate) fn get(&self, res: &ResourceDef, ns: &str, name: &str) -> Option<&Value> {
        self.get_shared(res, ns, name).map(|v| &**v)
    }

    pub(crate) fn get_shared(
        &self,
        res: &ResourceDef,
        ns: &str,
        name: &str,
    ) -> Option<&Arc<Value>> {
        self.objects
            .get(&(res.group, res.plural))?
            .get(ns)?
            .get(name)
    }

    /// The objects of a resource (in one namespace or all), in key order.
    pub(crate) fn iter<'a>(
        &'a self,
        res: &ResourceDef,
        ns: Option<&'a str>,
    ) -> impl Iterator<Item = &'a Arc<Value>> + 'a {
        self.objects
            .get(&(res.group, res.plural))
            .into_iter()
            .flat_map(move |by_ns| {
                by_ns
                    .iter()
                    .filter(move |(n, _)| ns.is_none_or(|x| x == n.as_str()))
                    .flat_map(|(_, by_name)| by_name.values())
            })
    }

    /// [`Self::iter`], collected: shared references, cheap to take under the lock.
    pub(crate) fn list(&self, res: &ResourceDef, ns: Option<&str>) -> Vec<Arc<Value>> {
        self.iter(res, ns).cloned().collect()
    }

    fn index_pod(&mut self, ns: &str, name: &str, obj: &Value, add: bool) {
        let Some(labels) = obj["metadata"]["labels"].as_object() else {
            return;
        };
        for (k, v) in labels {
            let Some(v) = v.as_str() else { continue };
            let key = (ns.to_string(), k.clone(), v.to_string());
            if add {
                self.pod_labels
                    .entry(key)
                    .or_default()
                    .insert(name.to_string());
            } else if let Some(names) = self.pod_labels.get_mut(&key) {
                names.remove(name);
                if names.is_empty() {
                    self.pod_labels.remove(&key);
                }
            }
        }
    }

    /// The pods of a namespace that carry `key=value`.
    pub(crate) fn pods_labelled<'a>(
        &'a self,
        ns: &'a str,
        key: &str,
        value: &str,
    ) -> impl Iterator<Item = &'a Arc<Value>> + 'a {
        let pods = resource("", "pods").expect("pods");
        self.pod_labels
            .get(&(ns.to_string(), key.to_string(), value.to_string()))
            .into_iter()
            .flatten()
            .filter_map(move |name| self.get_shared(pods, ns, name))
    }

    fn put(&mut self, res: &ResourceDef, ns: &str, name: &str, obj: Arc<Value>) {
        if res.is_pods() {
            if let Some(old) = self.get_shared(res, ns, name).cloned() {
                self.index_pod(ns, name, &old, false);
            }
            self.index_pod(ns, name, &obj, true);
        }
        self.objects
            .entry((res.group, res.plural))
            .or_default()
            .entry(ns.to_string())
            .or_default()
            .insert(name.to_string(), obj);
    }

    pub(crate) fn create(
        &mut self,
        res: &'static ResourceDef,
        ns: &str,
        mut obj: Value,
    ) -> Result<Arc<Value>, ApiError> {
        if !obj.is_object() {
            return Err(ApiError::new(
                400,
                "BadRequest",
                "the body is not a JSON object",
            ));
        }
        let mut name = obj["metadata"]["name"].as_str().unwrap_or("").to_string();
        if name.is_empty() {
            let prefix = obj["metadata"]["generateName"]
                .as_str()
                .unwrap_or("")
                .to_string();
            if prefix.is_empty() {
                return Err(ApiError::new(
                    422,
                    "Invalid",
                    format!(
                        "{} metadata.name: Required value: name or generateName is required",
                        res.kind
                    ),
                ));
            }
            self.uid += 1;
            name = format!("{prefix}{:05x}", self.uid);
        }
        let ns = if res.namespaced {
            if ns.is_empty() {
                "default"
            } else {
                ns
            }
        } else {
            ""
        };
        if self.get(res, ns, &name).is_some() {
            return Err(ApiError::new(
                409,
                "AlreadyExists",
                format!("{} \"{name}\" already exists", res.plural),
            ));
        }
        let rv = self.bump();
        self.uid += 1;
        let meta = &mut obj["metadata"];
        if !meta.is_object() {
            *meta = json!({});
        }
        meta["name"] = json!(name);
        if res.namespaced {
            meta["namespace"] = json!(ns);
        }
        meta["uid"] = json!(format!("{:08x}-0000-4000-8000-{:012x}", self.uid, rv));
        meta["resourceVersion"] = json!(rv.to_string());
        meta["creationTimestamp"] = json!(now_rfc3339());
        // As the API server does for kinds with a spec: a status writer's
        // `observedGeneration` says which spec its status describes.
        if !obj["spec"].is_null() {
            obj["metadata"]["generation"] = json!(1);
        }
        obj["apiVersion"] = json!(res.api_version());
        obj["kind"] = json!(res.kind);
        let shared = Arc::new(obj);
        self.put(res, ns, &name, shared.clone());
        self.note("create", res, ns, &name);
        self.emit(res, EventType::Added, shared.clone(), None);
        Ok(shared)
    }

    /// Replaces an object with `f(old)`; keeps identity fields; bumps the version.
    pub(crate) fn update(
        &mut self,
        res: &'static ResourceDef,
        ns: &str,
        name: &str,
        verb: &str,
        f: impl FnOnce(&Value) -> Result<Value, ApiError>,
    ) -> Result<Arc<Value>, ApiError> {
        let old = self
            .get_shared(res, ns, name)
            .cloned()
            .ok_or_else(|| ApiError::not_found(res, name))?;
        let mut new = f(&old)?;
        if !new.is_object() || !new["metadata"].is_object() {
            return Err(ApiError::new(
                422,
                "Invalid",
                "the result is not an object with metadata",
            ));
        }
        if let Some(want) = new["metadata"]["resourceVersion"].as_str() {
            if want != old["metadata"]["resourceVersion"].as_str().unwrap_or("") {
                return Err(ApiError::new(
                    409,
                    "Conflict",
                    format!("Operation cannot be fulfilled on {} \"{name}\": the object has been modified; please apply your changes to the latest version and try again", res.plural),
                ));
            }
        }
        let rv = self.bump();
        for f in [
            "name",
            "namespace",
            "uid",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
        ] {
            if !old["metadata"][f].is_null() {
                new["metadata"][f] = old["metadata"][f].clone();
            }
        }
        new["metadata"]["resourceVersion"] = json!(rv.to_string());
        // The generation moves with the spec alone, never with the status.
        match old["metadata"]["generation"].as_i64() {
            Some(g) => {
                new["metadata"]["generation"] = json!(g + i64::from(new["spec"] != old["spec"]))
            }
            None => {
                if let Some(m) = new["metadata"].as_object_mut() {
                    m.remove("generation");
                }
            }
        }
        new["apiVersion"] = json!(res.api_version());
        new["kind"] = json!(res.kind);
        if new == *old {
            return Ok(old);
        }
        let shared = Arc::new(new);
        self.put(res, ns, name, shared.clone());
        self.note(verb, res, ns, name);
        self.emit(res, EventType::Modified, shared.clone(), Some(old));
        Ok(shared)
    }

    /// Removes an object for good.
    pub(crate) fn remove(
        &mut self,
        res: &'static ResourceDef,
        ns: &str,
        name: &str,
    ) -> Option<Arc<Value>> {
        let by_ns = self.objects.get_mut(&(res.group, res.plural))?;
        let by_name = by_ns.get_mut(ns)?;
        let obj = by_name.remove(name)?;
        if by_name.is_empty() {
            by_ns.remove(ns);
        }
        if res.is_pods() {
            self.index_pod(ns, name, &obj, false);
        }
        let mut obj = Arc::unwrap_or_clone(obj);
        let rv = self.bump();
        obj["metadata"]["resourceVersion"] = json!(rv.to_string());
        self.note("removed", res, ns, name);
        let shared = Arc::new(obj);
        self.emit(res, EventType::Deleted, shared.clone(), None);
        Some(shared)
    }

    /// DELETE: graceful for pods bound to an existing node, at once otherwise.
    pub(crate) fn delete(
        &mut self,
        res: &'static ResourceDef,
        ns: &str,
        name: &str,
        grace: Option<i64>,
    ) -> Result<Arc<Value>, ApiError> {
        let obj = self
            .get_shared(res, ns, name)
            .cloned()
            .ok_or_else(|| ApiError::not_found(res, name))?;
        if !res.is_pods() {
            return Ok(self.remove(res, ns, name).unwrap_or(obj));
        }
        let node = obj["spec"]["nodeName"].as_str().unwrap_or("").to_string();
        let phase = obj["status"]["phase"].as_str().unwrap_or("");
        let node_exists = !node.is_empty()
            && self
                .get(resource("", "nodes").expect("nodes"), "", &node)
                .is_some();
        let default_grace = obj["spec"]["terminationGracePeriodSeconds"]
            .as_i64()
            .unwrap_or(30);
        let grace = grace.unwrap_or(default_grace).max(0);
        if grace == 0 || !node_exists || matches!(phase, "Succeeded" | "Failed") {
            return Ok(self.remove(res, ns, name).unwrap_or(obj));
        }
        let current = obj["metadata"]["deletionGracePeriodSeconds"].as_i64();
        if current.is_some_and(|c| c <= grace) {
            return Ok(obj);
        }
        let first = current.is_none();
        let mut new = (*obj).clone();
        let rv = self.bump();
        if first {
            // As the API server does: the time the grace period ends.
            new["metadata"]["deletionTimestamp"] = json!(rfc3339_in(grace));
        }
        new["metadata"]["deletionGracePeriodSeconds"] = json!(grace);
        new["metadata"]["resourceVersion"] = json!(rv.to_string());
        let shared = Arc::new(new);
        self.put(res, ns, name, shared.clone());
        if first {
            self.note("deletion-started", res, ns, name);
        }
        self.emit(res, EventType::Modified, shared.clone(), Some(obj));
        Ok(shared)
    }

    pub(crate) fn rv(&self) -> u64 {
        self.rv
    }
}

impl Store {
    pub fn new() -> Self {
        let (tx, _) = broadcast::channel(65_536);
        Self {
            inner: Mutex::new(Inner {
                objects: BTreeMap::new(),
                pod_labels: BTreeMap::new(),
                rv: 1,
                uid: 0,
                history: VecDeque::new(),
                audit: Vec::new(),
                tx: tx.clone(),
            }),
            tx,
        }
    }

    pub(crate) fn lock(&self) -> parking_lot::MutexGuard<'_, Inner> {
        self.inner.lock()
    }

    pub fn subscribe(&self) -> broadcast::Receiver<Arc<Change>> {
        self.tx.subscribe()
    }

    /// The objects of `res` now (in namespace `ns`, or in all), and a subscription to
    /// every change after them: taken under one lock, so none is missed or seen twice.
    pub fn list_and_subscribe(
        &self,
        res: &ResourceDef,
        ns: Option<&str>,
    ) -> (Vec<Arc<Value>>, broadcast::Receiver<Arc<Change>>) {
        let inner = self.inner.lock();
        (inner.list(res, ns), self.tx.subscribe())
    }

    /// Changes after `rv` still in history, or `Err` when `rv` is too old (410 Gone).
    pub(crate) fn since(&self, rv: u64) -> Result<Resume, ApiError> {
        let inner = self.inner.lock();
        let rx = self.tx.subscribe();
        if let Some(first) = inner.history.front() {
            if rv + 1 < first.rv && rv != 0 {
                return Err(ApiError::new(
                    410,
                    "Expired",
                    format!("too old resource version: {rv} ({})", first.rv - 1),
                ));
            }
        }
        let past = inner
            .history
            .iter()
            .filter(|c| c.rv > rv)
            .cloned()
            .collect();
        Ok((past, rx))
    }

    pub fn audit(&self) -> Vec<AuditEntry> {
        self.inner.lock().audit.clone()
    }
}

impl Default for Store {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_label_index_follows_creates_relabels_and_removals() {
        let store = Store::new();
        let pods = resource("", "pods").expect("pods");
        let mut inner = store.lock();
        let names = |inner: &Inner, app: &str| -> Vec<String> {
            inner
                .pods_labelled("shop", "app", app)
                .map(|p| p["metadata"]["name"].as_str().unwrap_or("").to_string())
                .collect()
        };
        inner
            .create(
                pods,
                "shop",
                json!({"metadata": {"name": "p1", "labels": {"app": "a"}}}),
            )
            .unwrap();
        assert_eq!(names(&inner, "a"), ["p1"]);
        inner
            .update(pods, "shop", "p1", "patch", |o| {
                let mut n = o.clone();
                n["metadata"]["labels"]["app"] = json!("b");
                Ok(n)
            })
            .unwrap();
        assert!(names(&inner, "a").is_empty(), "relabelled out");
        assert_eq!(names(&inner, "b"), ["p1"]);
        assert!(inner.pods_labelled("other", "app", "b").next().is_none());
        inner.remove(pods, "shop", "p1");
        assert!(names(&inner, "b").is_empty(), "removed");
    }
}

//! A reflector of Nodes: instance id -> Node name, for drains that start from AWS
//! (lifecycle hooks) and know only the instance, and the drain marks every replica's
//! size accounting follows. [`find_node`] asks the API server itself, for answers
//! that must not come from a cache that may not have caught up.

use std::collections::BTreeMap;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::ListParams;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::Api;
use tokio::sync::watch;

use crate::provider::{provider_id, DrainMarks};
use crate::scalein::decide::record::DrainRecord;
use crate::scalein::decide::record::{CordonSeen, GROUP_ANNOTATION, STARTED_ANNOTATION};

pub struct NodeIndex {
    store: Store<Node>,
    /// How each Node came to be cordoned, as this watch saw it happen
    /// ([`CordonSeen`]): the one memory of a Node's past states.
    cordons: std::sync::Arc<parking_lot::Mutex<BTreeMap<String, CordonSeen>>>,
    task: tokio::task::JoinHandle<()>,
    changed: watch::Receiver<u64>,
    /// True once the first list arrived. A watch, because the reflector's own
    /// `wait_until_ready` wakes only the last of several concurrent waiters (one
    /// oneshot waker inside): the drain-mark sync and the lifecycle loop's resume
    /// both wait, and the one not woken waited forever, leaving every size change
    /// answered Unavailable. Only `readiness_task` waits on the store.
    ready: watch::Receiver<bool>,
    readiness_task: tokio::task::JoinHandle<()>,
}

fn instance_of(n: &Node) -> Option<&str> {
    n.spec
        .as_ref()
        .and_then(|s| s.provider_id.as_deref())
        .and_then(provider_id::instance_id)
}

/// Finds the Node of an instance by asking the API server: by `name` first (CA
/// names it), then by providerID over a full list. `Ok(None)` only when the API
/// server answered and no Node is that instance's; any failure is an `Err`, so a
/// caller that cannot tell never treats the node as absent.
pub async fn find_node(
    client: &kube::Client,
    instance_id: &str,
    name: Option<&str>,
) -> Result<Option<String>, kube::Error> {
    let api: Api<Node> = Api::all(client.clone());
    // CA's fake node for an instance that never registered is named after its
    // providerID (`aws:///zone/i-...`): no Node has such a name, and it must not go
    // into a URL path.
    if let Some(name) = name.filter(|n| is_node_name(n)) {
        if let Some(n) = api.get_opt(name).await? {
            // A Node without a providerID yet (kubelet still registering) is taken
            // by the name CA gave.
            if instance_of(&n).is_none_or(|i| i == instance_id) {
                return Ok(Some(name.to_string()));
            }
        }
    }
    let mut params = ListParams::default().limit(500);
    loop {
        let page = api.list(&params).await?;
        if let Some(n) = page
            .items
            .iter()
            .find(|n| instance_of(n) == Some(instance_id))
        {
            return Ok(n.metadata.name.clone());
        }
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(None),
        }
    }
}

/// Whether `name` can be a Node's name (a DNS subdomain: no `/`, no `:`).
pub fn is_node_name(name: &str) -> bool {
    !name.is_empty() && name.len() <= 253 && !name.contains(['/', ':'])
}

/// The pods bound to a node, from the API server (one list by field selector): what
/// a plan is made of when no drain's watch is running.
pub async fn pods_on(client: &kube::Client, node: &str) -> Result<Vec<Pod>, kube::Error> {
    let pods: Api<Pod> = Api::all(client.clone());
    let list = pods
        .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
        .await?;
    Ok(list.items)
}

impl NodeIndex {
    /// Starts the reflector in the background (it re-lists by itself after API-server
    /// restarts).
    pub fn start(client: kube::Client) -> Self {
        let (store, writer) = reflector::store();
        let (tx, changed) = watch::channel(0u64);
        let api: Api<Node> = Api::all(client);
        let stream = reflector::reflector(writer, watcher(api, watcher::Config::default()))
            .backoff(crate::scalein::kube::watch_backoff::for_watch("nodes"));
        let cordons: std::sync::Arc<parking_lot::Mutex<BTreeMap<String, CordonSeen>>> =
            std::sync::Arc::default();
        let seen = cordons.clone();
        let listed = store.clone();
        let task = tokio::spawn(async move {
            futures::pin_mut!(stream);
            while let Some(item) = stream.next().await {
                match item {
                    Ok(watcher::Event::Apply(n) | watcher::Event::InitApply(n)) => {
                        if let Some(name) = n.metadata.name.clone() {
                            let mut seen = seen.lock();
                            match CordonSeen::after(seen.get(&name).copied(), &n) {
                                Some(now) => seen.insert(name, now),
                                None => seen.remove(&name),
                            };
                        }
                        tx.send_modify(|g| *g += 1);
                    }
                    Ok(watcher::Event::Delete(n)) => {
                        if let Some(name) = &n.metadata.name {
                            seen.lock().remove(name);
                        }
                        tx.send_modify(|g| *g += 1);
                    }
                    // A new list replaced the cache: Nodes deleted meanwhile go.
                    Ok(watcher::Event::InitDone) => {
                        seen.lock().retain(|name, _| {
                            listed
                                .get(&kube::runtime::reflector::ObjectRef::new(name))
                                .is_some()
                        });
                    }
                    Ok(watcher::Event::Init) => {}
                    Err(e) => tracing::debug!(error = %e, "node watch error; retrying"),
                }
            }
        });
        let (ready_tx, ready) = watch::channel(false);
        let first_list = store.clone();
        let readiness_task = tokio::spawn(async move {
            if first_list.wait_until_ready().await.is_ok() {
                let _ = ready_tx.send(true);
            }
        });
        Self {
            store,
            cordons,
            task,
            changed,
            ready,
            readiness_task,
        }
    }

    /// Ticks on every Node change the reflector saw.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.changed.clone()
    }

    /// Stops the watch (the engine is being shut down).
    pub fn stop(&self) {
        self.task.abort();
        self.readiness_task.abort();
    }

    /// The Node whose providerID names this instance.
    pub fn node_for_instance(&self, instance_id: &str) -> Option<String> {
        self.store
            .state()
            .iter()
            .find(|n| instance_of(n) == Some(instance_id))
            .and_then(|n| n.metadata.name.clone())
    }

    /// Whether the Node's Ready condition is True. A Node the cache does not know
    /// counts as Ready: only a kubelet seen failing lets the drain stop waiting.
    pub fn is_node_ready(&self, name: &str) -> bool {
        let Some(n) = self
            .store
            .get(&kube::runtime::reflector::ObjectRef::new(name))
        else {
            return true;
        };
        n.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
            .is_none_or(|c| c.status == "True")
    }

    /// Whether the cached Node carries a taint with this key.
    pub fn has_taint(&self, name: &str, key: &str) -> bool {
        self.store
            .get(&kube::runtime::reflector::ObjectRef::new(name))
            .is_some_and(|n| {
                n.spec
                    .as_ref()
                    .and_then(|s| s.taints.as_ref())
                    .is_some_and(|t| t.iter().any(|t| t.key == key))
            })
    }

    /// How the Node came to be cordoned, as this watch saw it ([`CordonSeen`]);
    /// `None`: first seen cordoned with CA's deletion taint, or never seen.
    pub fn cordon_seen(&self, name: &str) -> Option<CordonSeen> {
        self.cordons.lock().get(name).copied()
    }

    /// The Node as the cache has it (possibly behind the API server).
    pub fn cached(&self, name: &str) -> Option<std::sync::Arc<Node>> {
        self.store
            .get(&kube::runtime::reflector::ObjectRef::new(name))
    }

    /// The reflector's store (read-only handle).
    pub fn store(&self) -> Store<Node> {
        self.store.clone()
    }

    /// Waits until the first list arrived (bounded). Any number may wait at once.
    pub async fn ready(&self, within: std::time::Duration) -> bool {
        let mut ready = self.ready.clone();
        tokio::time::timeout(within, ready.wait_for(|r| *r))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// Turns true once the first list arrived; closed if it never can.
    pub fn readiness(&self) -> watch::Receiver<bool> {
        self.ready.clone()
    }

    /// Every Node carrying our drain annotation: (node name, instance id, mode).
    pub fn marked_for_drain(&self) -> Vec<DrainMark> {
        marked_for_drain(&self.store)
    }
}

/// What the Nodes say about direct-mode drains: marked instances, and instances
/// whose Node has no such mark.
pub fn direct_marks(store: &Store<Node>) -> DrainMarks {
    let mut marks = DrainMarks::default();
    for n in store.state().iter() {
        let Some(iid) = instance_of(n) else { continue };
        // CA's direct scale-in among the reasons on the Node, whatever else is.
        let direct = n
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| DrainRecord::read(a, crate::clock::utc_now()))
            .is_some_and(|r| r.has_scale_in());
        if direct {
            marks.marked.insert(iid.to_string());
        } else {
            marks.unmarked.insert(iid.to_string());
        }
    }
    marks
}

/// A drain recorded on a Node by [`crate::scalein::stages::cordon::cordon`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DrainMark {
    pub node: String,
    /// From the Node's providerID, when it names an AWS instance.
    pub instance: Option<String>,
    pub group: String,
    /// Every reason recorded on the Node.
    pub record: DrainRecord,
}

/// In the Nodes' name order (the cache's own order is a hash's): drains resume in
/// the same order on every start.
fn marked_for_drain(store: &Store<Node>) -> Vec<DrainMark> {
    let mut marks: Vec<DrainMark> = store
        .state()
        .iter()
        .filter_map(|n| {
            let a = n.metadata.annotations.as_ref()?;
            a.get(STARTED_ANNOTATION)?;
            Some(DrainMark {
                node: n.metadata.name.clone()?,
                instance: instance_of(n).map(str::to_string),
                group: a.get(GROUP_ANNOTATION).cloned().unwrap_or_default(),
                record: DrainRecord::read(a, crate::clock::utc_now())?,
            })
        })
        .collect();
    marks.sort_by(|a, b| a.node.cmp(&b.node));
    marks
}

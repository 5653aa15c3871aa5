//! One cache per drain pass. Drains that run at the same time share what they read of
//! the cluster instead of each listing it: the PodDisruptionBudgets (which budget
//! refused an eviction), the VolumeAttachments (the volume stage) and, once enough
//! drains run together, the pods. A pass begins with the first drain's node stage and
//! ends with the last one's; its watches close with it, so an idle service holds
//! nothing.
//!
//! Pods are shared only from `sharedPodWatchFrom` drains at once: a drain's own watch
//! (`spec.nodeName=`) costs two requests the API server answers from its index by
//! node, while the shared one lists and keeps every pod of the cluster. A storm pays
//! the second once instead of the first per node; a lone drain in a big cluster does
//! not pay for every pod.

use std::sync::{Arc, OnceLock, Weak};
use std::time::Instant;

use futures::StreamExt;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::Api;
use parking_lot::Mutex;
use tokio::sync::watch;

use super::wait::{NodePods, PodWatch};

/// Begins and joins drain passes.
pub struct Passes {
    client: kube::Client,
    /// Drains at once from which they share one watch of every pod (0: never).
    share_pods_from: usize,
    current: Mutex<Weak<Pass>>,
}

impl Passes {
    pub fn new(client: kube::Client, share_pods_from: usize) -> Self {
        Self {
            client,
            share_pods_from,
            current: Mutex::new(Weak::new()),
        }
    }

    /// Joins the running pass, or begins one. The pass lasts while a handle lives.
    pub fn join(&self) -> Arc<Pass> {
        let mut current = self.current.lock();
        if let Some(p) = current.upgrade() {
            return p;
        }
        let p = Arc::new(Pass {
            client: self.client.clone(),
            share_pods_from: self.share_pods_from,
            pods: OnceLock::new(),
            budgets: OnceLock::new(),
            attachments: OnceLock::new(),
        });
        *current = Arc::downgrade(&p);
        p
    }

    /// The running pass, if a drain holds one.
    pub fn current(&self) -> Option<Arc<Pass>> {
        self.current.lock().upgrade()
    }

    /// The pass's watch of every pod, if it shares one now.
    pub fn shared_pods(&self) -> Option<Arc<PodWatch>> {
        self.current()?.pods.get().cloned()
    }
}

/// The caches of one drain pass.
pub struct Pass {
    client: kube::Client,
    share_pods_from: usize,
    pods: OnceLock<Arc<PodWatch>>,
    budgets: OnceLock<Feed<PodDisruptionBudget>>,
    attachments: OnceLock<Feed<VolumeAttachment>>,
}

impl Pass {
    /// A drain's view of its node's pods: the pass's watch of every pod once
    /// `sharedPodWatchFrom` drains hold the pass (or it already shares one), the
    /// drain's own watch of its node before.
    pub fn pods_of(self: &Arc<Self>, node: &str) -> NodePods {
        // The handles alive are the drains in the pass (and, for a moment, an
        // eviction looking up the pass).
        let share = self.share_pods_from > 0 && Arc::strong_count(self) >= self.share_pods_from;
        let shared = match self.pods.get() {
            Some(w) => Some(w.clone()),
            None if share => Some(
                self.pods
                    .get_or_init(|| {
                        tracing::info!(
                            drains = Arc::strong_count(self),
                            "many drains at once: one watch of every pod serves them all"
                        );
                        PodWatch::of_cluster(self.client.clone())
                    })
                    .clone(),
            ),
            None => None,
        };
        match shared {
            Some(w) => w.node(node),
            None => NodePods::watch(self.client.clone(), node),
        }
    }

    /// Every PodDisruptionBudget of the cluster.
    pub fn budgets(&self) -> &Feed<PodDisruptionBudget> {
        self.budgets
            .get_or_init(|| Feed::start(Api::all(self.client.clone()), "poddisruptionbudgets"))
    }

    /// Every VolumeAttachment of the cluster (they cannot be selected by node, and
    /// there are few).
    pub fn attachments(&self) -> &Feed<VolumeAttachment> {
        self.attachments
            .get_or_init(|| Feed::start(Api::all(self.client.clone()), "volumeattachments"))
    }
}

/// A watched, cached kind: its store, and a tick on every change.
pub struct Feed<K>
where
    K: kube::Resource<DynamicType = ()> + Clone + 'static,
{
    store: Store<K>,
    changes: watch::Receiver<u64>,
    /// True from the end of the first list. Not the store's own readiness, which
    /// wakes only one of several waiters (see `nodes::NodeIndex`).
    listed: watch::Receiver<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl<K> Drop for Feed<K>
where
    K: kube::Resource<DynamicType = ()> + Clone + 'static,
{
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl<K> Feed<K>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    fn start(api: Api<K>, what: &'static str) -> Self {
        let (store, writer) = reflector::store();
        let (tx, changes) = watch::channel(0u64);
        let (listed_tx, listed) = watch::channel(false);
        // The raw events (not touched_objects), so the end of the first list ticks
        // too: a wait for "none left" can answer at once.
        let stream = reflector::reflector(writer, watcher(api, watcher::Config::default()))
            .default_backoff();
        let task = tokio::spawn(async move {
            futures::pin_mut!(stream);
            while let Some(ev) = stream.next().await {
                match ev {
                    Ok(watcher::Event::Init | watcher::Event::InitApply(_)) => {}
                    Ok(watcher::Event::InitDone) => {
                        listed_tx.send_replace(true);
                        tx.send_modify(|g| *g += 1);
                    }
                    Ok(_) => tx.send_modify(|g| *g += 1),
                    Err(e) => tracing::debug!(what, error = %e, "watch error; the watcher retries"),
                }
            }
        });
        Self {
            store,
            changes,
            listed,
            task,
        }
    }

    /// Waits for the first list (or the deadline); whether it arrived. Any number
    /// may wait at once.
    pub async fn ready(&self, deadline: Instant) -> bool {
        let mut listed = self.listed.clone();
        tokio::time::timeout_at(deadline.into(), listed.wait_for(|l| *l))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// Everything cached now.
    pub fn state(&self) -> Vec<Arc<K>> {
        self.store.state()
    }

    /// Ticks on every change after the first list (and at its end).
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.changes.clone()
    }
}

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

use crate::clock::Instant;
use std::sync::{Arc, OnceLock, Weak};

use futures::StreamExt;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::Api;
use parking_lot::Mutex;
use tokio::sync::watch;

use crate::scalein::kube::budgets::{BudgetView, Claim, Claims};
use crate::scalein::kube::wait::{NodePods, PodWatch};

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
            budget_ticks: Arc::default(),
            claims: Arc::default(),
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
    /// A tick per budget on each of its changes, for the tries waiting on it.
    budget_ticks: Arc<Ticks>,
    /// This pass's tries against each budget's status.
    claims: Arc<Claims>,
    attachments: OnceLock<Feed<VolumeAttachment>>,
}

/// Budgets' changes by (namespace, name), for those who wait on one budget: a storm
/// changes a budget's status thousands of times, and a try waits only on its own.
#[derive(Default)]
struct Ticks {
    senders: Mutex<std::collections::BTreeMap<(String, String), watch::Sender<u64>>>,
}

impl Ticks {
    fn subscribe(&self, namespace: &str, name: &str) -> watch::Receiver<u64> {
        let mut senders = self.senders.lock();
        senders.retain(|_, tx| tx.receiver_count() > 0);
        senders
            .entry((namespace.to_string(), name.to_string()))
            .or_insert_with(|| watch::channel(0).0)
            .subscribe()
    }

    /// One budget changed (`Some`), or any may have (`None`: a new list).
    fn tick(&self, budget: Option<&PodDisruptionBudget>) {
        let senders = self.senders.lock();
        match budget {
            Some(b) => {
                let key = (
                    b.metadata.namespace.clone().unwrap_or_default(),
                    b.metadata.name.clone().unwrap_or_default(),
                );
                if let Some(tx) = senders.get(&key) {
                    tx.send_modify(|g| *g += 1);
                }
            }
            None => senders.values().for_each(|tx| tx.send_modify(|g| *g += 1)),
        }
    }
}

/// What the cached status of the budget selecting a pod says of a try now.
pub enum Verdict {
    /// Try (with the ticket that counts it, when the status was known).
    Go(Option<crate::scalein::kube::budgets::Ticket>),
    /// Wait for the budget's next change.
    Hold {
        budget: String,
        allowed: i32,
        /// A try of this process at the budget's status is not answered yet.
        answer_pending: bool,
        changes: watch::Receiver<u64>,
    },
}

impl Pass {
    /// A drain's view of its node's pods: the pass's watch of every pod once
    /// `sharedPodWatchFrom` drains hold the pass or wait for a slot to join it
    /// (`drains_at_once`), or it already shares one; the drain's own watch of its node
    /// before.
    pub fn pods_of(self: &Arc<Self>, node: &str, drains_at_once: usize) -> NodePods {
        // The handles alive are the drains in the pass (and, for a moment, an
        // eviction looking up the pass).
        let at_once = Arc::strong_count(self).max(drains_at_once);
        let share = self.share_pods_from > 0 && at_once >= self.share_pods_from;
        let shared = match self.pods.get() {
            Some(w) => Some(w.clone()),
            None if share => Some(
                self.pods
                    .get_or_init(|| {
                        tracing::info!(
                            drains = at_once,
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
        self.budgets.get_or_init(|| {
            let ticks = self.budget_ticks.clone();
            Feed::start(
                Api::all(self.client.clone()),
                "poddisruptionbudgets",
                move |b| ticks.tick(b),
            )
        })
    }

    /// The cached budgets of `namespace` that select a pod with `labels`, with their
    /// selectors.
    pub fn budgets_selecting(
        &self,
        namespace: &str,
        labels: &std::collections::BTreeMap<String, String>,
    ) -> Vec<(Arc<PodDisruptionBudget>, kube::core::Selector)> {
        let mut picking: Vec<_> = self
            .budgets()
            .state()
            .into_iter()
            .filter(|b| b.metadata.namespace.as_deref() == Some(namespace))
            .filter_map(|b| {
                crate::scalein::kube::budgets::selector_picking(&b, labels).map(|sel| (b, sel))
            })
            .collect();
        // In name order, not the cache's hash order: the same budget first every time.
        picking.sort_by(|(a, _), (b, _)| a.metadata.name.cmp(&b.metadata.name));
        picking
    }

    /// Asks the cached status of the budget that selects the pod (`namespace`,
    /// `labels`) whether a try may go now. Without the cache's first list, or
    /// without a budget whose status is known, it may: the API server decides.
    pub fn verdict(
        &self,
        namespace: &str,
        labels: &std::collections::BTreeMap<String, String>,
    ) -> Verdict {
        let feed = self.budgets();
        if !feed.listed() {
            return Verdict::Go(None);
        }
        let views: Vec<BudgetView> = self
            .budgets_selecting(namespace, labels)
            .into_iter()
            .map(|(b, _)| BudgetView::of(&b))
            .collect();
        match self.claims.claim(&views) {
            Claim::Go(ticket) => Verdict::Go(ticket),
            Claim::Hold {
                allowed,
                answer_pending,
            } => {
                let b = &views[0];
                let mut changes = self.budget_ticks.subscribe(&b.namespace, &b.name);
                // A change between the read above and the subscription is not lost.
                let now = feed.get(&b.namespace, &b.name);
                if now
                    .and_then(|n| n.metadata.resource_version.clone())
                    .as_deref()
                    != Some(b.resource_version.as_str())
                {
                    changes.mark_changed();
                }
                Verdict::Hold {
                    budget: format!("{}/{}", b.namespace, b.name),
                    allowed,
                    answer_pending,
                    changes,
                }
            }
        }
    }

    /// Every VolumeAttachment of the cluster (they cannot be selected by node, and
    /// there are few).
    pub fn attachments(&self) -> &Feed<VolumeAttachment> {
        self.attachments
            .get_or_init(|| Feed::start(Api::all(self.client.clone()), "volumeattachments", |_| {}))
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
    /// Starts the watch; `changed` hears each object that changed, and `None` at the
    /// end of each list (after a list anything may have changed).
    fn start(
        api: Api<K>,
        what: &'static str,
        changed: impl Fn(Option<&K>) + Send + 'static,
    ) -> Self {
        let (store, writer) = reflector::store();
        let (tx, changes) = watch::channel(0u64);
        let (listed_tx, listed) = watch::channel(false);
        // The raw events (not touched_objects), so the end of the first list ticks
        // too: a wait for "none left" can answer at once.
        let stream = reflector::reflector(writer, watcher(api, watcher::Config::default()))
            .backoff(crate::scalein::kube::watch_backoff::for_watch(
                "poddisruptionbudgets",
            ));
        let task = tokio::spawn(async move {
            futures::pin_mut!(stream);
            while let Some(ev) = stream.next().await {
                match ev {
                    Ok(watcher::Event::Init | watcher::Event::InitApply(_)) => {}
                    Ok(watcher::Event::InitDone) => {
                        listed_tx.send_replace(true);
                        tx.send_modify(|g| *g += 1);
                        changed(None);
                    }
                    Ok(watcher::Event::Apply(o) | watcher::Event::Delete(o)) => {
                        tx.send_modify(|g| *g += 1);
                        changed(Some(&o));
                    }
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
        tokio::time::timeout_at(deadline, listed.wait_for(|l| *l))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// Whether the first list arrived (no wait).
    pub fn listed(&self) -> bool {
        *self.listed.borrow()
    }

    /// One cached object.
    pub fn get(&self, namespace: &str, name: &str) -> Option<Arc<K>> {
        self.store
            .get(&reflector::ObjectRef::new(name).within(namespace))
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

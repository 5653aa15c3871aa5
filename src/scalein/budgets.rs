//! Waiting on a PodDisruptionBudget, not on a timer. After a budget refuses an
//! eviction, the drain waits until a pod the budget selects changes (its replacement
//! is created, becomes Ready, a pod leaves): that is when the budget can allow the
//! next eviction. The fixed `evictionRetryInterval` stays as the fallback (a change
//! missed while the watch starts, a budget whose status lags). One watch per budget
//! selector, shared by every drain blocked on it and dropped when none waits, so a
//! storm of drains behind one budget opens one watch, not one per pod; and none at all
//! while the drain pass already watches every pod (its changes are matched here).

use std::collections::HashMap;
use std::sync::{Arc, Weak};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::core::Selector;
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::Api;
use parking_lot::Mutex;
use tokio::sync::watch;

use super::wait::PodWatch;

/// (namespace, label selector) -> the watch of its pods, while anyone waits on it.
pub struct BudgetWatches {
    client: kube::Client,
    open: Mutex<HashMap<(String, String), Weak<Shared>>>,
}

struct Shared {
    changes: watch::Receiver<u64>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Shared {
    /// The last waiter gone: the watch closes.
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A subscription to the changes of one budget's pods.
pub struct BudgetWait {
    /// What keeps its watch open.
    _source: Source,
    changes: watch::Receiver<u64>,
}

enum Source {
    /// A watch of this budget's pods alone.
    Own { _watch: Arc<Shared> },
    /// The drain pass's watch of every pod.
    Pass { _watch: Arc<PodWatch> },
}

impl BudgetWatches {
    pub fn new(client: kube::Client) -> Self {
        Self {
            client,
            open: Mutex::new(HashMap::new()),
        }
    }

    /// Waits from now on for changes of the pods `selector` picks in `namespace`:
    /// on the pass's watch of every pod when there is one (no request), else on a
    /// watch of those pods.
    pub fn subscribe(
        &self,
        namespace: &str,
        selector: &Selector,
        every_pod: Option<Arc<PodWatch>>,
    ) -> BudgetWait {
        if let Some(pods) = every_pod {
            return BudgetWait {
                changes: pods.selector_changes(namespace, selector),
                _source: Source::Pass { _watch: pods },
            };
        }
        let selector = selector.to_string();
        let key = (namespace.to_string(), selector.clone());
        let mut open = self.open.lock();
        open.retain(|_, w| w.strong_count() > 0);
        let shared = match open.get(&key).and_then(Weak::upgrade) {
            Some(s) => s,
            None => {
                let s = Arc::new(self.start(namespace, &selector));
                open.insert(key, Arc::downgrade(&s));
                s
            }
        };
        let mut changes = shared.changes.clone();
        changes.borrow_and_update();
        BudgetWait {
            _source: Source::Own { _watch: shared },
            changes,
        }
    }

    /// Budget watches open now (tests, and the storm's request count).
    pub fn open(&self) -> usize {
        self.open
            .lock()
            .values()
            .filter(|w| w.strong_count() > 0)
            .count()
    }

    fn start(&self, namespace: &str, selector: &str) -> Shared {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        let cfg = watcher::Config::default().labels(selector);
        let (tx, changes) = watch::channel(0u64);
        let what = format!("{namespace}/{selector}");
        let task = tokio::spawn(async move {
            let stream = watcher::watcher(api, cfg).default_backoff();
            futures::pin_mut!(stream);
            while let Some(ev) = stream.next().await {
                match ev {
                    // The initial list says nothing new; a change after it does.
                    Ok(Event::Init | Event::InitApply(_) | Event::InitDone) => {}
                    Ok(Event::Apply(_) | Event::Delete(_)) => tx.send_modify(|g| *g += 1),
                    Err(e) => {
                        tracing::debug!(pods = %what, error = %e, "budget watch error; the fixed retry covers the gap")
                    }
                }
            }
        });
        Shared { changes, task }
    }
}

impl BudgetWait {
    /// Resolves at the next change of a selected pod (never, if the watch is gone:
    /// callers race it against their fallback timer).
    pub async fn changed(&mut self) {
        if self.changes.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// Resolves when any of the waits sees a change.
pub async fn any_changed(waits: &mut [BudgetWait]) {
    if waits.is_empty() {
        return std::future::pending().await;
    }
    let futs = waits.iter_mut().map(|w| Box::pin(w.changed()));
    futures::future::select_all(futs).await;
}

//! Knowing when pods are gone without polling: one watch per draining node (field
//! selector `spec.nodeName`), shared by every stage of that node's drain. The watch
//! re-lists by itself after an API-server restart.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::Api;
use parking_lot::Mutex;
use tokio::sync::watch;

/// How often a wait re-asks whether a listed pod still counts.
const RECHECK: std::time::Duration = std::time::Duration::from_secs(1);

/// The live set of pods on one node.
pub struct NodePods {
    pods: Arc<Mutex<State>>,
    changed: watch::Receiver<u64>,
    task: tokio::task::JoinHandle<()>,
}

#[derive(Default)]
struct State {
    by_uid: HashMap<String, Pod>,
    /// Buffer for a re-list in progress.
    relist: Option<HashMap<String, Pod>>,
    synced: bool,
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

impl NodePods {
    pub fn watch(client: kube::Client, node: &str) -> Self {
        let api: Api<Pod> = Api::all(client);
        let cfg = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
        let state = Arc::new(Mutex::new(State::default()));
        let (tx, rx) = watch::channel(0u64);
        let st = state.clone();
        let node = node.to_string();
        let task = tokio::spawn(async move {
            let stream = watcher::watcher(api, cfg).default_backoff();
            futures::pin_mut!(stream);
            let mut generation = 0u64;
            while let Some(ev) = stream.next().await {
                let mut s = st.lock();
                match ev {
                    Ok(Event::Apply(p)) => {
                        s.by_uid.insert(uid(&p), p);
                    }
                    Ok(Event::Delete(p)) => {
                        s.by_uid.remove(&uid(&p));
                    }
                    Ok(Event::Init) => s.relist = Some(HashMap::new()),
                    Ok(Event::InitApply(p)) => {
                        s.relist.get_or_insert_with(HashMap::new).insert(uid(&p), p);
                    }
                    Ok(Event::InitDone) => {
                        s.by_uid = s.relist.take().unwrap_or_default();
                        s.synced = true;
                    }
                    Err(e) => {
                        tracing::debug!(node = %node, error = %e, "pod watch error; the watcher retries");
                        continue;
                    }
                }
                drop(s);
                generation += 1;
                let _ = tx.send(generation);
            }
        });
        Self {
            pods: state,
            changed: rx,
            task,
        }
    }

    /// The pods on the node now (empty until the first list arrived).
    pub fn pods(&self) -> Vec<Pod> {
        self.pods.lock().by_uid.values().cloned().collect()
    }

    pub fn contains(&self, uid: &str) -> bool {
        self.pods.lock().by_uid.contains_key(uid)
    }

    /// Waits until the first full list arrived, or the deadline.
    pub async fn synced(&mut self, deadline: Instant) -> bool {
        self.wait_until(deadline, |s| s.synced).await
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
        let all = |s: &State| uids.iter().all(|u| s.by_uid.get(u).is_none_or(&done));
        loop {
            if all(&self.pods.lock()) {
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            let tick = (now + RECHECK).min(deadline);
            if let Ok(Err(_)) = tokio::time::timeout_at(tick.into(), self.changed.changed()).await {
                // The watch task is gone: nothing will wake us but the clock.
                tokio::time::sleep_until(tick.into()).await;
            }
        }
    }

    /// The pod with this uid, if still listed.
    pub fn get(&self, uid: &str) -> Option<Pod> {
        self.pods.lock().by_uid.get(uid).cloned()
    }

    /// Waits for the next change of the pod set (or the deadline).
    pub async fn next_change(&mut self, deadline: Instant) {
        let _ = tokio::time::timeout_at(deadline.into(), self.changed.changed()).await;
    }

    async fn wait_until(&mut self, deadline: Instant, cond: impl Fn(&State) -> bool) -> bool {
        loop {
            if cond(&self.pods.lock()) {
                return true;
            }
            match tokio::time::timeout_at(deadline.into(), self.changed.changed()).await {
                Ok(Ok(())) => continue,
                Ok(Err(_)) | Err(_) => return cond(&self.pods.lock()),
            }
        }
    }
}

impl Drop for NodePods {
    fn drop(&mut self) {
        self.task.abort();
    }
}

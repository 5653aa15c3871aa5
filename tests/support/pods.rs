//! Where every pod ran and what owned it, from the fake API server's stream of
//! changes (every change seen, not samples): the model tests map the audit's pod
//! names to nodes with it, DaemonSet pods put back under new names included.

use ca_asg_provider::sim::{store::EventType, SimCluster};
use k8s_openapi::api::core::v1::Pod;
use serde_json::Value;
use std::collections::HashMap;

/// One pod as first seen bound to a node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placed {
    pub node: String,
    /// `DaemonSet/<name>`, `ReplicaSet/<name>`, or empty for a bare pod.
    pub owner: String,
}

impl Placed {
    pub fn is_daemonset(&self) -> bool {
        self.owner.starts_with("DaemonSet/")
    }
}

pub struct PodLog {
    state: parking_lot::Mutex<Seen>,
}

struct Seen {
    pods: HashMap<String, Placed>,
    rx: tokio::sync::broadcast::Receiver<std::sync::Arc<ca_asg_provider::sim::store::Change>>,
    lagged: bool,
}

fn placed(p: &Value) -> Option<(String, Placed)> {
    let node = p["spec"]["nodeName"].as_str().filter(|n| !n.is_empty())?;
    let owner = p["metadata"]["ownerReferences"]
        .as_array()
        .and_then(|o| o.iter().find(|r| r["controller"] == true))
        .map(|r| {
            format!(
                "{}/{}",
                r["kind"].as_str().unwrap_or(""),
                r["name"].as_str().unwrap_or("")
            )
        })
        .unwrap_or_default();
    Some((
        p["metadata"]["name"].as_str()?.to_string(),
        Placed {
            node: node.to_string(),
            owner,
        },
    ))
}

impl PodLog {
    /// Follows the pods from now on (and those there now). Every query first takes
    /// in every change the store has sent so far, so it is exact at that moment.
    pub fn watch(sim: &SimCluster) -> PodLog {
        let rx = sim.store.subscribe();
        let mut pods = HashMap::new();
        // Seeded after subscribing: a change in between is seen twice, never missed.
        for p in sim.list::<Pod>() {
            if let Some((name, at)) = placed(&p) {
                pods.insert(name, at);
            }
        }
        PodLog {
            state: parking_lot::Mutex::new(Seen {
                pods,
                rx,
                lagged: false,
            }),
        }
    }

    fn synced(&self) -> parking_lot::MutexGuard<'_, Seen> {
        use tokio::sync::broadcast::error::TryRecvError;
        let mut g = self.state.lock();
        loop {
            match g.rx.try_recv() {
                Ok(c) => {
                    if c.res.plural == "pods" && c.kind != EventType::Deleted {
                        if let Some((name, at)) = placed(&c.object) {
                            g.pods.entry(name).or_insert(at);
                        }
                    }
                }
                Err(TryRecvError::Lagged(_)) => g.lagged = true,
                Err(_) => break,
            }
        }
        assert!(
            !g.lagged,
            "the pod change stream lagged: placements not followed"
        );
        g
    }

    /// Where the pod named `name` ran, if it was ever bound.
    pub fn of(&self, name: &str) -> Option<Placed> {
        self.synced().pods.get(name).cloned()
    }

    /// Every pod ever bound, by name.
    pub fn all(&self) -> HashMap<String, Placed> {
        self.synced().pods.clone()
    }
}

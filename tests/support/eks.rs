//! EKS's own drainer of a managed node group, as the tests need it: when an instance
//! of the group enters Terminating:Wait with EKS's `Terminate-LC-Hook` pending, it
//! cordons the Node and evicts every pod there that is neither DaemonSet-owned nor a
//! mirror pod, all at once, through the Eviction API (a 429 is retried), then
//! completes EKS's hook (CONTINUE) once those pods are gone. Told not to complete, or
//! when the pods outlive EKS's timeout, it leaves the hook to time out. It runs beside
//! the service's drain and knows nothing of it.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use ca_asg_provider::clock::Instant;

use ca_asg_provider::cloud::memory::{MemoryCloud, EKS_TERMINATE_HOOK};
use ca_asg_provider::cloud::{Cloud, LifecycleAction, LifecycleResult, LifecycleState};
use ca_asg_provider::sim::{self, SimCluster};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{EvictParams, Patch, PatchParams};
use kube::Api;
use parking_lot::Mutex;
use serde_json::{json, Value};

/// What EKS's drainer did for one instance.
#[derive(Debug, Clone, Default)]
pub struct EksDrain {
    /// The pods (namespace/name) it asked the Eviction API to evict.
    pub evicted: Vec<String>,
    /// Eviction requests answered 429 (a budget said not now).
    pub refused: u32,
    /// It completed EKS's hook (false: left to time out).
    pub completed: bool,
}

#[derive(Default)]
struct Seen {
    drains: BTreeMap<String, EksDrain>,
}

pub struct EksDrainer {
    seen: Arc<Mutex<Seen>>,
    task: tokio::task::JoinHandle<()>,
}

/// How EKS's drainer behaves.
#[derive(Debug, Clone, Copy)]
pub struct EksOptions {
    /// Complete EKS's hook once the evicted pods are gone (else let it time out).
    pub complete: bool,
    /// How long it drains before giving up (EKS's hook timeout).
    pub timeout: Duration,
}

impl EksDrainer {
    /// Follows the instances of `group` in `cloud`; acts on each one once.
    pub fn start(sim: &Arc<SimCluster>, cloud: &MemoryCloud, group: &str, o: EksOptions) -> Self {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let (sim, cloud, group, s) = (sim.clone(), cloud.clone(), group.to_string(), seen.clone());
        let task = tokio::spawn(async move {
            let mut started = HashSet::new();
            loop {
                for (g, i) in cloud.instances() {
                    if g != group
                        || i.state != LifecycleState::TerminatingWait
                        || started.contains(&i.id)
                        || !cloud
                            .pending_hooks(&i.id)
                            .iter()
                            .any(|h| h == EKS_TERMINATE_HOOK)
                    {
                        continue;
                    }
                    started.insert(i.id.clone());
                    s.lock().drains.insert(i.id.clone(), EksDrain::default());
                    tokio::spawn(drain(
                        sim.clone(),
                        cloud.clone(),
                        group.clone(),
                        i.id.clone(),
                        o,
                        s.clone(),
                    ));
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        });
        EksDrainer { seen, task }
    }

    /// What it did for `instance`, if it saw it.
    pub fn drain_of(&self, instance: &str) -> Option<EksDrain> {
        self.seen.lock().drains.get(instance).cloned()
    }
}

impl Drop for EksDrainer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn is_daemonset_or_mirror(p: &Value) -> bool {
    let ds = p["metadata"]["ownerReferences"]
        .as_array()
        .is_some_and(|o| o.iter().any(|r| r["kind"] == "DaemonSet"));
    let mirror = !p["metadata"]["annotations"]["kubernetes.io/config.mirror"].is_null();
    ds || mirror
}

fn uid(p: &Value) -> String {
    p["metadata"]["uid"].as_str().unwrap_or("").to_string()
}

async fn drain(
    sim: Arc<SimCluster>,
    cloud: MemoryCloud,
    group: String,
    instance: String,
    o: EksOptions,
    seen: Arc<Mutex<Seen>>,
) {
    let end = Instant::now() + o.timeout;
    let node = sim::node_name(&instance);
    let client = sim.client();
    let nodes: Api<Node> = Api::all(client.clone());
    let _ = nodes
        .patch(
            &node,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"unschedulable": true}})),
        )
        .await;
    let pods: Vec<Value> = sim
        .list::<Pod>()
        .into_iter()
        .filter(|p| {
            p["spec"]["nodeName"] == node.as_str()
                && p["metadata"]["deletionTimestamp"].is_null()
                && !is_daemonset_or_mirror(p)
        })
        .collect();
    // Every eviction at once, each retried on 429 until EKS gives up.
    let evictions: Vec<_> = pods
        .iter()
        .map(|p| {
            let ns = p["metadata"]["namespace"]
                .as_str()
                .unwrap_or("")
                .to_string();
            let name = p["metadata"]["name"].as_str().unwrap_or("").to_string();
            let (client, seen, instance) = (client.clone(), seen.clone(), instance.clone());
            async move {
                let api: Api<Pod> = Api::namespaced(client, &ns);
                loop {
                    match api.evict(&name, &EvictParams::default()).await {
                        Ok(_) => {
                            if let Some(d) = seen.lock().drains.get_mut(&instance) {
                                d.evicted.push(format!("{ns}/{name}"));
                            }
                            return;
                        }
                        Err(kube::Error::Api(s)) if s.code == 429 => {
                            if let Some(d) = seen.lock().drains.get_mut(&instance) {
                                d.refused += 1;
                            }
                        }
                        Err(kube::Error::Api(s)) if s.code == 404 => return,
                        Err(_) => {}
                    }
                    if Instant::now() >= end {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        })
        .collect();
    futures::future::join_all(evictions).await;
    let uids: HashSet<String> = pods.iter().map(uid).collect();
    loop {
        let left = sim.list::<Pod>().iter().any(|p| uids.contains(&uid(p)));
        if !left {
            break;
        }
        if Instant::now() >= end {
            // EKS's hook times out by itself.
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    if !o.complete {
        return;
    }
    let action = LifecycleAction {
        group,
        hook: EKS_TERMINATE_HOOK.to_string(),
        instance_id: instance.clone(),
        token: None,
    };
    if cloud
        .complete_lifecycle_action(&action, LifecycleResult::Continue)
        .await
        .is_ok()
    {
        if let Some(d) = seen.lock().drains.get_mut(&instance) {
            d.completed = true;
        }
    }
}

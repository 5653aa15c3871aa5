//! The suite's fake kubelet, over real HTTP against the real API server: every EC2
//! instance of the memory cloud becomes a Ready Node with the providerID cluster-autoscaler
//! expects; a pod bound to one of them runs (Running, Ready); a pod being deleted runs its
//! preStop (`sleep N`), bounded by its grace period, then its containers stop and the
//! kubelet deletes it for good, as a kubelet does. When an instance ends, its Node goes
//! and whatever still ran on it dies with it. Each pod's stop is recorded: the checks read
//! the order from here and from the API server's audit log.
#![allow(dead_code)] // shared by the e2e test crates, each using a part

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use ca_asg_provider::cloud::memory::MemoryCloud;
use ca_asg_provider::cloud::{AsgInstance, LifecycleState};
use chrono::{DateTime, Utc};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::watcher;
use kube::Api;
use parking_lot::Mutex;
use serde_json::json;

/// How a pod's containers ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// Deleted or evicted: preStop ran, then SIGTERM, then the pod was removed.
    Graceful,
    /// Its instance ended under it: no preStop, no flush.
    WithInstance,
}

#[derive(Debug, Clone)]
pub struct PodStop {
    pub pod: String,
    pub node: String,
    pub daemonset: bool,
    /// When the kubelet started it.
    pub started: DateTime<Utc>,
    /// When the kubelet saw the deletion (preStop began); for `WithInstance`, the end.
    pub began: DateTime<Utc>,
    pub ended: DateTime<Utc>,
    pub how: Ending,
}

#[derive(Default)]
struct State {
    /// Node name -> instance id, for Nodes this kubelet registered and that still exist.
    nodes: BTreeMap<String, String>,
    /// Pods started (by uid), and pods whose stop has begun.
    started: BTreeSet<String>,
    stopping: BTreeSet<String>,
    /// uid -> (ns/name, node, daemonset) of every pod running on a node of ours.
    running: BTreeMap<String, (String, String, bool)>,
    /// uid -> when it was started.
    started_at: BTreeMap<String, DateTime<Utc>>,
    stops: Vec<PodStop>,
    /// (ns/name, when it became Ready).
    readies: Vec<(String, DateTime<Utc>)>,
    instances_ended: Vec<String>,
}

#[derive(Clone)]
pub struct FakeKubelet {
    client: kube::Client,
    state: Arc<Mutex<State>>,
    /// Instances a real kubelet plays: never registered here; when one ends, its id is
    /// sent here (the machine powers off) before its Node is deleted.
    real: Arc<BTreeSet<String>>,
    real_ended: tokio::sync::mpsc::UnboundedSender<String>,
    /// Its two loops, stopped by [`FakeKubelet::stop`].
    loops: Arc<Mutex<Vec<tokio::task::AbortHandle>>>,
}

pub fn node_name(instance_id: &str) -> String {
    ca_asg_provider::sim::node_name(instance_id)
}

fn prestop_secs(p: &Pod) -> f64 {
    let Some(cmd) = p
        .spec
        .as_ref()
        .and_then(|s| s.containers.first())
        .and_then(|c| c.lifecycle.as_ref())
        .and_then(|l| l.pre_stop.as_ref())
        .and_then(|h| h.exec.as_ref())
        .and_then(|e| e.command.clone())
    else {
        return 0.0;
    };
    // ["sleep", "N"] or ["sh", "-c", "... sleep N"]
    cmd.join(" ")
        .split_whitespace()
        .skip_while(|w| *w != "sleep")
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(0.0)
}

fn is_daemonset(p: &Pod) -> bool {
    p.metadata
        .owner_references
        .as_ref()
        .is_some_and(|o| o.iter().any(|r| r.kind == "DaemonSet"))
}

impl FakeKubelet {
    /// Starts following `cloud` (Nodes) and the API server (pods).
    pub fn start(client: kube::Client, cloud: MemoryCloud) -> FakeKubelet {
        Self::start_beside(client, cloud, BTreeSet::new()).0
    }

    /// [`FakeKubelet::start`], leaving the instances `real` to real kubelets; the receiver
    /// hears of each of them that ends.
    pub fn start_beside(
        client: kube::Client,
        cloud: MemoryCloud,
        real: BTreeSet<String>,
    ) -> (FakeKubelet, tokio::sync::mpsc::UnboundedReceiver<String>) {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let k = FakeKubelet {
            client,
            state: Arc::default(),
            real: Arc::new(real),
            real_ended: tx,
            loops: Arc::default(),
        };
        let follow = tokio::spawn(k.clone().follow_cloud(move || {
            // An instance in a warm pool still exists: its Node stays (a stopped
            // instance's too, as the cloud's node controller keeps it).
            let mut instances = cloud.instances();
            instances.extend(cloud.pooled());
            async move { Some(instances) }
        }));
        let pods = tokio::spawn(k.clone().run_pods());
        k.loops
            .lock()
            .extend([follow.abort_handle(), pods.abort_handle()]);
        (k, rx)
    }

    /// [`FakeKubelet::start`] for a cloud the test reads through a call (moto, through
    /// the SDK): `instances` lists every (group, instance) the cloud has, or `None` when
    /// the cloud could not be read this time (nothing is concluded from that read).
    pub fn start_following<F, Fut>(client: kube::Client, instances: F) -> FakeKubelet
    where
        F: FnMut() -> Fut + Send + 'static,
        Fut: std::future::Future<Output = Option<Vec<(String, AsgInstance)>>> + Send + 'static,
    {
        let (tx, _) = tokio::sync::mpsc::unbounded_channel();
        let k = FakeKubelet {
            client,
            state: Arc::default(),
            real: Arc::new(BTreeSet::new()),
            real_ended: tx,
            loops: Arc::default(),
        };
        let follow = tokio::spawn(k.clone().follow_cloud(instances));
        let pods = tokio::spawn(k.clone().run_pods());
        k.loops
            .lock()
            .extend([follow.abort_handle(), pods.abort_handle()]);
        k
    }

    /// Stops following the cloud and the API server (before its control plane goes,
    /// when a test runs more than one).
    pub fn stop(&self) {
        for l in self.loops.lock().drain(..) {
            l.abort();
        }
    }

    pub fn stops(&self) -> Vec<PodStop> {
        self.state.lock().stops.clone()
    }

    /// (ns/name, when it became Ready) of every pod this kubelet started.
    pub fn readies(&self) -> Vec<(String, DateTime<Utc>)> {
        self.state.lock().readies.clone()
    }

    pub fn instances_ended(&self) -> Vec<String> {
        self.state.lock().instances_ended.clone()
    }

    pub fn nodes(&self) -> BTreeMap<String, String> {
        self.state.lock().nodes.clone()
    }

    async fn follow_cloud<F, Fut>(self, mut read: F)
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Option<Vec<(String, AsgInstance)>>>,
    {
        let nodes: Api<Node> = Api::all(self.client.clone());
        // A run of failed registrations (the API server away) is said once, and its end.
        let mut failing = 0u64;
        loop {
            let Some(instances) = read().await else {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            };
            for (group, inst) in &instances {
                let name = node_name(&inst.id);
                let known = self.state.lock().nodes.contains_key(&name);
                if inst.state == LifecycleState::InService && !known {
                    if !self.real.contains(&inst.id) {
                        if let Err(e) = self.register(&nodes, group, inst).await {
                            if failing == 0 {
                                eprintln!(
                                    "fake kubelet: register {name}: {e} (trying again; said once)"
                                );
                            }
                            failing += 1;
                            continue;
                        }
                        if failing > 0 {
                            eprintln!(
                                "fake kubelet: registered {name} after {failing} failed tries"
                            );
                            failing = 0;
                        }
                    }
                    self.state
                        .lock()
                        .nodes
                        .insert(name.clone(), inst.id.clone());
                    if !self.real.contains(&inst.id) {
                        self.pods_bound_before(&name).await;
                    }
                }
            }
            let alive: BTreeSet<&str> = instances
                .iter()
                .filter(|(_, i)| i.state != LifecycleState::Terminated)
                .map(|(_, i)| i.id.as_str())
                .collect();
            let gone: Vec<(String, String)> = self
                .state
                .lock()
                .nodes
                .iter()
                .filter(|(_, iid)| !alive.contains(iid.as_str()))
                .map(|(n, i)| (n.clone(), i.clone()))
                .collect();
            for (node, iid) in gone {
                self.instance_ended(&nodes, &node, &iid).await;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The pods bound to `node` before it was counted as this kubelet's (between its
    /// Node's create and its Ready): the watch said them while the kubelet ignored the
    /// node, and says nothing more until something changes them. A kubelet lists its
    /// node's pods as it starts.
    async fn pods_bound_before(&self, node: &str) {
        let pods: Api<Pod> = Api::all(self.client.clone());
        let lp = kube::api::ListParams::default().fields(&format!("spec.nodeName={node}"));
        let what = format!("list the pods of {node}");
        if let Some(list) = until_written(&what, || pods.list(&lp)).await {
            list.items.into_iter().for_each(|p| self.on_pod(p));
        }
    }

    async fn register(
        &self,
        nodes: &Api<Node>,
        group: &str,
        inst: &AsgInstance,
    ) -> anyhow::Result<()> {
        let name = node_name(&inst.id);
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "topology.kubernetes.io/zone": inst.zone,
                "node.kubernetes.io/instance-type": inst.instance_type.clone().unwrap_or_default(),
                "e2e.ca-asg-provider.io/group": group,
            }},
            "spec": {"providerID": inst.provider_id()},
        }))?;
        match nodes.create(&PostParams::default(), &node).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => return Err(e.into()),
        }
        let now = Utc::now().to_rfc3339();
        nodes
            .patch_status(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {
                    "capacity": {"cpu": "4", "memory": "16Gi", "pods": "110"},
                    "allocatable": {"cpu": "4", "memory": "16Gi", "pods": "110"},
                    "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                        "lastHeartbeatTime": now, "lastTransitionTime": now}],
                }})),
            )
            .await?;
        // The API server's admission taints a new Node not-ready; the node lifecycle
        // controller (not run here: it would want Lease heartbeats) lifts it once the
        // Node is Ready.
        nodes
            .patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"taints": null}})),
            )
            .await?;
        Ok(())
    }

    /// The instance is gone: what ran on it dies now, and the Node goes (as the cloud
    /// node controller deletes a Node whose instance ended).
    async fn instance_ended(&self, nodes: &Api<Node>, node: &str, iid: &str) {
        if self.real.contains(iid) {
            let _ = self.real_ended.send(iid.to_string());
            self.state.lock().nodes.remove(node);
            self.state.lock().instances_ended.push(iid.to_string());
            let dp = DeleteParams::default();
            until_written(&format!("delete Node {node}"), || nodes.delete(node, &dp)).await;
            return;
        }
        let now = Utc::now();
        let killed: Vec<(String, (String, String, bool))> = {
            let mut st = self.state.lock();
            st.nodes.remove(node);
            st.instances_ended.push(iid.to_string());
            let on: Vec<_> = st
                .running
                .iter()
                .filter(|(_, (_, n, _))| n == node)
                .map(|(u, v)| (u.clone(), v.clone()))
                .collect();
            for (uid, (pod, node, daemonset)) in &on {
                st.running.remove(uid);
                st.stopping.insert(uid.clone());
                let started = st.started_at.get(uid).copied().unwrap_or(now);
                st.stops.push(PodStop {
                    pod: pod.clone(),
                    node: node.clone(),
                    daemonset: *daemonset,
                    started,
                    began: now,
                    ended: now,
                    how: Ending::WithInstance,
                });
            }
            on
        };
        for (_, (pod, _, _)) in killed {
            let (ns, name) = pod.split_once('/').expect("ns/name");
            let api: Api<Pod> = Api::namespaced(self.client.clone(), ns);
            let at_once = DeleteParams::default().grace_period(0);
            until_written(&format!("delete {pod}"), || api.delete(name, &at_once)).await;
        }
        let dp = DeleteParams::default();
        until_written(&format!("delete Node {node}"), || nodes.delete(node, &dp)).await;
    }

    async fn run_pods(self) {
        let pods: Api<Pod> = Api::all(self.client.clone());
        let mut stream = watcher(pods, watcher::Config::default()).boxed();
        // A run of failures is said once, and its end with how many there were: a
        // kubelet that outlives its control plane (a scenario that does not stop it)
        // would otherwise print a line every 200 ms until the test binary ends.
        let mut failing = 0u64;
        while let Some(ev) = stream.next().await {
            let list = match ev {
                Ok(watcher::Event::Apply(p)) | Ok(watcher::Event::InitApply(p)) => vec![p],
                Ok(_) => continue,
                Err(e) => {
                    if failing == 0 {
                        eprintln!(
                            "fake kubelet: pod watch: {e} (retrying every 200 ms; said once)"
                        );
                    }
                    failing += 1;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            };
            if failing > 0 {
                eprintln!("fake kubelet: pod watch back after {failing} failed tries");
                failing = 0;
            }
            for p in list {
                self.on_pod(p);
            }
        }
    }

    fn on_pod(&self, p: Pod) {
        let Some(node) = p.spec.as_ref().and_then(|s| s.node_name.clone()) else {
            return;
        };
        let uid = p.metadata.uid.clone().unwrap_or_default();
        let ns = p.metadata.namespace.clone().unwrap_or_default();
        let name = p.metadata.name.clone().unwrap_or_default();
        let mut st = self.state.lock();
        let real = st.nodes.get(&node).is_some_and(|i| self.real.contains(i));
        if !st.nodes.contains_key(&node) || real || st.stopping.contains(&uid) {
            return;
        }
        if p.metadata.deletion_timestamp.is_some() {
            st.stopping.insert(uid.clone());
            st.running.remove(&uid);
            let grace = p
                .metadata
                .deletion_grace_period_seconds
                .unwrap_or(30)
                .max(0) as f64;
            let run_for = prestop_secs(&p).min(grace);
            let me = self.clone();
            let daemonset = is_daemonset(&p);
            let started = st.started_at.get(&uid).copied().unwrap_or_else(Utc::now);
            tokio::spawn(async move {
                let began = Utc::now();
                tokio::time::sleep(Duration::from_secs_f64(run_for)).await;
                let ended = Utc::now();
                me.state.lock().stops.push(PodStop {
                    pod: format!("{ns}/{name}"),
                    node,
                    daemonset,
                    started,
                    began,
                    ended,
                    how: Ending::Graceful,
                });
                let api: Api<Pod> = Api::namespaced(me.client.clone(), &ns);
                let dp = DeleteParams {
                    grace_period_seconds: Some(0),
                    preconditions: Some(Preconditions {
                        uid: Some(uid),
                        resource_version: None,
                    }),
                    ..Default::default()
                };
                until_written(&format!("delete {ns}/{name}"), || api.delete(&name, &dp)).await;
            });
            return;
        }
        if st.started.insert(uid.clone()) {
            st.started_at.insert(uid.clone(), Utc::now());
            st.running
                .insert(uid, (format!("{ns}/{name}"), node, is_daemonset(&p)));
            drop(st);
            let api: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
            let state = self.state.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(100)).await;
                let now = Utc::now().to_rfc3339();
                let cond =
                    |t: &str| json!({"type": t, "status": "True", "lastTransitionTime": now});
                let status = json!({"status": {
                    "phase": "Running",
                    "startTime": now,
                    "conditions": [cond("PodScheduled"), cond("Initialized"), cond("ContainersReady"), cond("Ready")],
                    "containerStatuses": [{"name": "main", "ready": true, "started": true, "restartCount": 0,
                        "image": "e2e/app:1", "imageID": "", "state": {"running": {"startedAt": now}}}],
                }});
                let (pp, patch) = (PatchParams::default(), Patch::Merge(status));
                let started = until_written(&format!("start {ns}/{name}"), || {
                    api.patch_status(&name, &pp, &patch)
                })
                .await;
                if started.is_some() {
                    state
                        .lock()
                        .readies
                        .push((format!("{ns}/{name}"), Utc::now()));
                }
            });
        }
    }
}

/// A write (or read) the kubelet keeps sending while the API server is away (restarting,
/// its etcd down), as a kubelet does: until it is answered, its object is gone or changed
/// under it (404, 409: nothing left to do), or two minutes have passed (said). The answer.
async fn until_written<T, F, Fut>(what: &str, mut write: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, kube::Error>>,
{
    let began = tokio::time::Instant::now();
    let mut tries = 0u32;
    loop {
        match write().await {
            Ok(v) => return Some(v),
            Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => return None,
            Err(e) => {
                tries += 1;
                if tries == 1 {
                    eprintln!("fake kubelet: {what}: {e} (trying again every 200 ms)");
                }
                if began.elapsed() > Duration::from_secs(120) {
                    eprintln!("fake kubelet: {what}: gave up after {tries} tries: {e}");
                    return None;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

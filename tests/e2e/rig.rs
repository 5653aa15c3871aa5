//! What every end-to-end scenario shares: the report row, the control plane, the memory
//! cloud and its nodes (fake, or one real), the workloads, the service as it runs in a
//! cluster, and the calls cluster-autoscaler makes.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ca_asg_provider::cloud::memory::{MemoryCloud, MemoryGroup};
use ca_asg_provider::proto::{self, cloud_provider_client::CloudProviderClient};
use ca_asg_provider::provider::Provider;
use ca_asg_provider::scalein::{self, Engine, ScaleInSettings};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DynamicObject, PostParams};
use kube::discovery::ApiResource;
use kube::Api;
use serde_json::json;
use tonic::transport::Channel;

use super::checks;
use super::control_plane::{Binaries, ControlPlane, Who};
use super::kubelet::FakeKubelet;
use super::support::world::{service_on, timing};

pub const HOOK: &str = "ca-asg-provider-drain";
pub const APP_REPLICAS: usize = 3;
/// The scenario's budget: `maxUnavailable: 1` over the app's three replicas.
pub const APP_MIN_READY: usize = APP_REPLICAS - 1;

/// The step a scenario is in, written to the report when it fails.
pub struct Report {
    pub scenario: &'static str,
    pub version: String,
    pub step: parking_lot::Mutex<String>,
    pub scale_in_secs: parking_lot::Mutex<Option<f64>>,
}

impl Report {
    pub fn step(&self, s: &str) {
        eprintln!(
            "e2e [{} on Kubernetes {}]: {s}",
            self.scenario, self.version
        );
        *self.step.lock() = s.to_string();
    }
}

impl Drop for Report {
    fn drop(&mut self) {
        let passed = !std::thread::panicking();
        let row = json!({
            "scenario": self.scenario,
            "kubernetes": self.version,
            "driver": "CA's gRPC calls (the suite's client)",
            "result": if passed { "PASS" } else { "FAIL" },
            "step": if passed { String::new() } else { self.step.lock().clone() },
            "scale_in_secs": *self.scale_in_secs.lock(),
        });
        if !passed {
            eprintln!(
                "e2e FAILED: scenario {} on Kubernetes {} at step: {}",
                self.scenario,
                self.version,
                self.step.lock()
            );
        }
        if let Some(path) = std::env::var_os("E2E_RESULTS") {
            use std::io::Write;
            if let Ok(mut f) = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
            {
                let _ = writeln!(f, "{row}");
            }
        }
    }
}

/// One scenario at a time: each starts its own control plane, and two at once on a small
/// machine would measure the machine.
pub static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The binaries, or `None` (the scenario is skipped) when the suite was not asked for.
pub fn binaries(scenario: &str) -> Option<Binaries> {
    match Binaries::from_env() {
        Some(b) => Some(b),
        None if std::env::var("E2E_REQUIRED").as_deref() == Ok("1") => {
            panic!("{scenario}: E2E_REQUIRED=1 but E2E_K8S_BIN/E2E_ETCD are not set (run scripts/e2e.sh)")
        }
        None => {
            eprintln!("{scenario}: skipped (no real control plane: run scripts/e2e.sh)");
            None
        }
    }
}

/// One scenario's world: the control plane, the memory cloud, the fake kubelet, and the
/// service as it runs in a cluster.
pub struct Rig {
    pub cp: ControlPlane,
    pub cloud: MemoryCloud,
    pub kubelet: FakeKubelet,
    pub admin: kube::Client,
    pub provider: Arc<Provider>,
    pub engine: Arc<Engine>,
    pub ca: CloudProviderClient<Channel>,
    pub lifecycle: Option<tokio::task::JoinHandle<()>>,
    pub report: Report,
}

pub fn settings() -> ScaleInSettings {
    ScaleInSettings {
        eviction_retry: Duration::from_millis(500),
        volume_deadline: Duration::from_secs(2),
        lifecycle_poll_interval: Duration::from_millis(500),
        ..ScaleInSettings::default()
    }
}

/// Applies the service's RBAC exactly as deploy/base ships it (namespace kube-system).
pub async fn apply_shipped_rbac(admin: &kube::Client) {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/deploy/base/rbac.yaml"
    ))
    .expect("deploy/base/rbac.yaml");
    for doc in text.split("\n---") {
        let v: serde_json::Value = match serde_saphyr::from_str(doc) {
            Ok(v) => v,
            Err(e) => panic!("deploy/base/rbac.yaml: {e}"),
        };
        if v.is_null() {
            continue;
        }
        let kind = v["kind"].as_str().expect("kind").to_string();
        let ar = ApiResource {
            group: "rbac.authorization.k8s.io".into(),
            version: "v1".into(),
            api_version: "rbac.authorization.k8s.io/v1".into(),
            kind: kind.clone(),
            plural: format!("{}s", kind.to_lowercase()),
        };
        let obj: DynamicObject = serde_json::from_value(v).expect("an RBAC object");
        let api: Api<DynamicObject> = if kind.starts_with("Cluster") {
            Api::all_with(admin.clone(), &ar)
        } else {
            Api::namespaced_with(admin.clone(), "kube-system", &ar)
        };
        api.create(&PostParams::default(), &obj)
            .await
            .unwrap_or_else(|e| panic!("apply {kind} from deploy/base/rbac.yaml: {e}"));
    }
}

pub async fn create(admin: &kube::Client, ns: Option<&str>, v: serde_json::Value) {
    let kind = v["kind"].as_str().unwrap().to_string();
    let api_version = v["apiVersion"].as_str().unwrap().to_string();
    let (group, version) = api_version
        .split_once('/')
        .map(|(g, v)| (g.to_string(), v.to_string()))
        .unwrap_or((String::new(), api_version.clone()));
    let ar = ApiResource {
        group,
        version,
        api_version,
        kind: kind.clone(),
        plural: match kind.as_str() {
            "PodDisruptionBudget" => "poddisruptionbudgets".into(),
            k => format!("{}s", k.to_lowercase()),
        },
    };
    let obj: DynamicObject = serde_json::from_value(v).unwrap();
    let api: Api<DynamicObject> = match ns {
        Some(ns) => Api::namespaced_with(admin.clone(), ns, &ar),
        None => Api::all_with(admin.clone(), &ar),
    };
    api.create(&PostParams::default(), &obj)
        .await
        .unwrap_or_else(|e| panic!("create {kind}: {e}"));
}

/// An app of three replicas, one per node (required anti-affinity), each with a 2 s
/// preStop, behind a budget of `maxUnavailable: 1`; and a log shipper DaemonSet that
/// tolerates every taint (as fluent-bit, kube-proxy and the VPC CNI do), 1 s preStop.
pub async fn workloads(admin: &kube::Client, cp: &mut ControlPlane) {
    create(
        admin,
        None,
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "shop"}}),
    )
    .await;
    create(
        admin,
        None,
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "logging"}}),
    )
    .await;
    cp.wait_default_service_account("shop").await.unwrap();
    cp.wait_default_service_account("logging").await.unwrap();
    let container = |prestop: u32| {
        json!([{"name": "main", "image": "e2e/app:1",
            "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}},
            "lifecycle": {"preStop": {"exec": {"command": ["sleep", prestop.to_string()]}}}}])
    };
    create(admin, Some("shop"), json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "app"},
        "spec": {"replicas": APP_REPLICAS, "selector": {"matchLabels": {"app": "app"}},
            "template": {"metadata": {"labels": {"app": "app"}}, "spec": {
                "terminationGracePeriodSeconds": 30,
                "containers": container(2),
                "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                    {"labelSelector": {"matchLabels": {"app": "app"}}, "topologyKey": "kubernetes.io/hostname"}]}}}}}
    })).await;
    create(
        admin,
        Some("shop"),
        json!({
            "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": "app"},
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": "app"}}}
        }),
    )
    .await;
    create(
        admin,
        Some("logging"),
        json!({
            "apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": "fluent-bit"},
            "spec": {"selector": {"matchLabels": {"app": "fluent-bit"}},
                "template": {"metadata": {"labels": {"app": "fluent-bit"}}, "spec": {
                    "terminationGracePeriodSeconds": 30,
                    "tolerations": [{"operator": "Exists"}],
                    "containers": container(1)}}}
        }),
    )
    .await;
}

pub async fn ready_pods(admin: &kube::Client) -> BTreeMap<String, String> {
    let pods: Api<Pod> = Api::all(admin.clone());
    pods.list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|p| {
            p.metadata.deletion_timestamp.is_none()
                && p.status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        })
        .map(|p| {
            (
                format!(
                    "{}/{}",
                    p.metadata.namespace.unwrap(),
                    p.metadata.name.unwrap()
                ),
                p.spec.and_then(|s| s.node_name).unwrap_or_default(),
            )
        })
        .collect()
}

pub async fn until<F, Fut>(what: &str, secs: u64, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let end = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < end {
        if f().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("timed out after {secs} s waiting for {what}");
}

impl Rig {
    /// The control plane, `desired` instances of group "web" (with our hook when
    /// `hooked`), a Ready Node per instance, the workloads running, and the service.
    pub async fn start(scenario: &'static str, bin: &Binaries, desired: i32, hooked: bool) -> Rig {
        let report = Report {
            scenario,
            version: bin.version.clone(),
            step: parking_lot::Mutex::new(String::new()),
            scale_in_secs: parking_lot::Mutex::new(None),
        };
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
        report.step("start the control plane");
        let mut cp = ControlPlane::start(bin)
            .await
            .unwrap_or_else(|e| panic!("{e:#}"));
        let admin = cp.client(Who::Admin).await.unwrap();
        report.step("apply the shipped RBAC");
        apply_shipped_rbac(&admin).await;
        report.step("register a Ready Node per instance");
        let mut group = MemoryGroup::new("web", 0, 8, desired, "m5.large");
        if hooked {
            group = group.terminating_hook(HOOK, 300);
        }
        let cloud = MemoryCloud::new(vec![group], timing());
        let kubelet = FakeKubelet::start(cp.client(Who::Kubelet).await.unwrap(), cloud.clone());
        until("a Ready Node per instance", 30, || {
            let k = kubelet.clone();
            async move { k.nodes().len() == desired as usize }
        })
        .await;
        report.step("run the workloads");
        workloads(&admin, &mut cp).await;
        let want = APP_REPLICAS + desired as usize;
        until("every app and DaemonSet pod Ready", 60, || {
            let a = admin.clone();
            async move { ready_pods(&a).await.len() == want }
        })
        .await;
        report.step("start the service as its ServiceAccount");
        let (provider, engine, ca) = service_on(
            cp.client(Who::Service).await.unwrap(),
            &cloud,
            &["web".to_string()],
            settings(),
            Duration::from_millis(500),
        )
        .await;
        Rig {
            cp,
            cloud,
            kubelet,
            admin,
            provider,
            engine,
            ca,
            lifecycle: None,
            report,
        }
    }

    /// The lifecycle loop the service runs (finds instances our hook holds).
    pub fn run_lifecycle_loop(&mut self) {
        self.lifecycle = Some(scalein::lifecycle::spawn_loop(
            self.engine.clone(),
            self.provider.clone(),
        ));
    }

    /// The service stops at once (its tasks aborted, as a kill -9 leaves them), and a
    /// fresh one starts over the same cloud and cluster.
    pub async fn restart_service(&mut self) {
        if let Some(l) = self.lifecycle.take() {
            l.abort();
        }
        self.engine.abort_all();
        self.engine.shutdown();
        let (provider, engine, ca) = service_on(
            self.cp.client(Who::Service).await.unwrap(),
            &self.cloud,
            &["web".to_string()],
            settings(),
            Duration::from_millis(500),
        )
        .await;
        self.provider = provider;
        self.engine = engine;
        self.ca = ca;
        self.run_lifecycle_loop();
    }

    /// The nodes running an app pod (the ones a scale-in of an occupied node picks).
    pub async fn occupied(&self) -> Vec<(String, String)> {
        let on: std::collections::BTreeSet<String> = ready_pods(&self.admin)
            .await
            .into_iter()
            .filter(|(p, _)| p.starts_with("shop/app-"))
            .map(|(_, n)| n)
            .collect();
        self.kubelet
            .nodes()
            .into_iter()
            .filter(|(n, _)| on.contains(n))
            .collect()
    }

    /// CA's NodeGroupDeleteNodes, as CA sends it (node name, providerID, labels), under
    /// CA's 5 s gRPC deadline.
    pub async fn ca_deletes(&mut self, nodes: &[(String, String)]) {
        let req = proto::NodeGroupDeleteNodesRequest {
            id: "web".into(),
            nodes: nodes
                .iter()
                .map(|(name, iid)| proto::ExternalGrpcNode {
                    provider_id: format!("aws:///us-east-1a/{iid}"),
                    name: name.clone(),
                    labels: [("kubernetes.io/hostname".to_string(), name.clone())].into(),
                    ..Default::default()
                })
                .collect(),
        };
        let mut r = tonic::Request::new(req);
        r.set_timeout(Duration::from_secs(5));
        self.ca
            .node_group_delete_nodes(r)
            .await
            .unwrap_or_else(|e| panic!("NodeGroupDeleteNodes: {e}"));
    }

    pub async fn ca_target(&mut self) -> i32 {
        self.ca
            .node_group_target_size(proto::NodeGroupTargetSizeRequest { id: "web".into() })
            .await
            .unwrap()
            .into_inner()
            .target_size
    }

    pub async fn wait_ended(&self, iids: &[String], secs: u64) {
        let started = Instant::now();
        until("the instances to end", secs, || {
            let k = self.kubelet.clone();
            let want = iids.to_vec();
            async move {
                let ended = k.instances_ended();
                want.iter().all(|i| ended.contains(i))
            }
        })
        .await;
        *self.report.scale_in_secs.lock() = Some(started.elapsed().as_secs_f64());
    }

    /// Every promise the scenario keeps, read from outside the service.
    /// `terminations`: the TerminateInstanceInAutoScalingGroup calls the service makes
    /// (one per instance CA named; none for an instance the ASG chose itself).
    pub async fn check_promises(
        &mut self,
        drained: &[(String, String)],
        desired_after: i32,
        terminations: u64,
    ) {
        let audit = self.cp.audit();
        let stops = self.kubelet.stops();
        let nodes: Vec<String> = drained.iter().map(|(n, _)| n.clone()).collect();

        self.report.step("check: evictions only, none twice");
        let evicted =
            checks::evictions_only(&audit, &stops, &nodes).unwrap_or_else(|e| panic!("{e}"));
        eprintln!(
            "e2e: {evicted} pods evicted, {} evictions refused (429); the service's User-Agents: {:?}",
            checks::refused_evictions(&audit),
            checks::service_user_agents(&audit)
        );

        self.report
            .step("check: the budget held (Ready app pods never below 2)");
        let fewest =
            checks::fewest_ready(&self.kubelet.readies(), &stops, "shop/app-", APP_REPLICAS);
        assert!(
            fewest >= APP_MIN_READY,
            "only {fewest} app pods were Ready at one moment; the budget allows no fewer than {APP_MIN_READY}"
        );

        self.report
            .step("check: DaemonSet pods last on every drained node");
        checks::daemonset_last(&stops, &nodes).unwrap_or_else(|e| panic!("{e}"));

        self.report
            .step("check: each instance ended once, desired capacity right");
        let calls = self.cloud.calls();
        let terminated = calls.get("terminate_instance").copied().unwrap_or(0);
        assert_eq!(
            terminated, terminations,
            "TerminateInstanceInAutoScalingGroup calls: {calls:?}"
        );
        assert_eq!(
            self.cloud.desired("web"),
            Some(desired_after),
            "the ASG's desired capacity"
        );
        assert_eq!(
            self.ca_target().await,
            desired_after,
            "the target size CA reads"
        );
        assert!(
            self.cloud.hook_timeouts().is_empty(),
            "a held hook timed out"
        );
        self.cp
            .check_alive()
            .unwrap_or_else(|e| panic!("a control plane component died: {e}"));
    }

    pub fn hooks_completed_once(&self, iids: &[String]) {
        self.report
            .step("check: each lifecycle action completed once");
        let done = self.cloud.completed_actions();
        for iid in iids {
            let n = done.iter().filter(|(a, _)| &a.instance_id == iid).count();
            assert_eq!(n, 1, "lifecycle actions completed for {iid}: {done:?}");
        }
    }
}

/// What another drainer does, for comparison: CA's own drain with its default
/// `--daemonset-eviction-for-occupied-nodes=true` (every pod evicted at once, DaemonSet
/// pods included), or `kubectl drain --ignore-daemonsets` (workload pods only). Cordons the
/// node, evicts as admin, waits until the evicted pods are gone, then ends the instance
/// with a decrement, as CA's in-tree provider does.
pub async fn other_drainer(
    admin: &kube::Client,
    cloud: &MemoryCloud,
    node: &str,
    iid: &str,
    daemonsets_too: bool,
) {
    use ca_asg_provider::cloud::Cloud as _;
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(admin.clone());
    nodes
        .patch(
            node,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"spec": {"unschedulable": true}})),
        )
        .await
        .expect("cordon");
    let pods: Api<Pod> = Api::all(admin.clone());
    let on = pods
        .list(&kube::api::ListParams::default().fields(&format!("spec.nodeName={node}")))
        .await
        .expect("list the node's pods")
        .items;
    let mut evicted = Vec::new();
    for p in on {
        let ds = p
            .metadata
            .owner_references
            .as_ref()
            .is_some_and(|o| o.iter().any(|r| r.kind == "DaemonSet"));
        if ds && !daemonsets_too {
            continue;
        }
        let (ns, name) = (p.metadata.namespace.unwrap(), p.metadata.name.unwrap());
        let api: Api<Pod> = Api::namespaced(admin.clone(), &ns);
        api.evict(&name, &Default::default()).await.expect("evict");
        evicted.push((ns, name, p.metadata.uid.unwrap_or_default()));
    }
    until("the evicted pods to be gone", 90, || {
        let admin = admin.clone();
        let evicted = evicted.clone();
        async move {
            for (ns, name, uid) in &evicted {
                let api: Api<Pod> = Api::namespaced(admin.clone(), ns);
                if let Ok(Some(p)) = api.get_opt(name).await {
                    if p.metadata.uid.as_deref() == Some(uid) {
                        return false;
                    }
                }
            }
            true
        }
    })
    .await;
    cloud
        .terminate_instance(iid, true)
        .await
        .expect("TerminateInstanceInAutoScalingGroup");
}

pub fn ids(nodes: &[(String, String)]) -> Vec<String> {
    nodes.iter().map(|(_, i)| i.clone()).collect()
}

//! What every end-to-end scenario shares: the report row, the control plane, the memory
//! cloud and its nodes (fake, or one real), the workloads, the service as it runs in a
//! cluster, and the calls cluster-autoscaler makes.
#![allow(dead_code)] // shared by the e2e test crates, each using a part

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ca_asg_provider::clock::Instant;

use ca_asg_provider::cloud::memory::{MemoryCloud, MemoryGroup};
use ca_asg_provider::cloud::GroupSelector;
use ca_asg_provider::config::ListenAddr;
use ca_asg_provider::proto::{self, cloud_provider_client::CloudProviderClient};
use ca_asg_provider::provider::{Provider, ProviderSettings};
use ca_asg_provider::scalein::{self, DrainScaleIn, Engine, ScaleInSettings};
use ca_asg_provider::telemetry::metrics::Metrics;
use k8s_openapi::api::core::v1::{Pod, PodCondition};
use kube::api::{DynamicObject, PostParams};
use kube::discovery::ApiResource;
use kube::Api;
use serde_json::json;
use tonic::transport::Channel;

use super::checks;
use super::control_plane::{Binaries, ControlPlane, Who};
use super::kubelet::FakeKubelet;
use super::real_node::RealNode;
use super::support::world::timing;

pub const HOOK: &str = "ca-asg-provider-drain";
pub const APP_REPLICAS: usize = 3;
/// The scenario's budget: `maxUnavailable: 1` over the app's three replicas.
pub const APP_MIN_READY: usize = APP_REPLICAS - 1;

/// The step a scenario is in, written to the report when it fails.
pub struct Report {
    pub scenario: String,
    /// Who makes CA's calls: "suite client as CA 1.36", "cluster-autoscaler 1.36.1", ...
    pub driver: String,
    pub version: String,
    pub step: parking_lot::Mutex<String>,
    pub scale_in_secs: parking_lot::Mutex<Option<f64>>,
    /// When the scale-in was asked for (the time to the instance's end counts from here).
    pub scale_in_began: parking_lot::Mutex<Option<Instant>>,
    pub scale_in_asked: parking_lot::Mutex<Option<chrono::DateTime<chrono::Utc>>>,
    /// When the scenario began (its wall time, control plane included, goes in the row).
    pub began: Instant,
    /// More columns for the row (lines written and lost, for the real-node scenarios).
    pub extra: parking_lot::Mutex<serde_json::Map<String, serde_json::Value>>,
}

impl Report {
    /// A scenario's report, begun now, on Kubernetes `version`, `driver` making CA's calls.
    pub fn new(scenario: &str, driver: &str, version: &str) -> Report {
        Report {
            scenario: scenario.to_string(),
            driver: driver.to_string(),
            version: version.to_string(),
            step: parking_lot::Mutex::new(String::new()),
            scale_in_secs: parking_lot::Mutex::new(None),
            scale_in_began: parking_lot::Mutex::new(None),
            scale_in_asked: parking_lot::Mutex::new(None),
            began: Instant::now(),
            extra: Default::default(),
        }
    }

    /// The scale-in is asked for now: the time to the instance's end counts from here.
    pub fn scale_in_begins(&self, s: &str) {
        self.step(s);
        *self.scale_in_began.lock() = Some(Instant::now());
        *self.scale_in_asked.lock() = Some(chrono::Utc::now());
    }

    pub fn step(&self, s: &str) {
        eprintln!(
            "e2e [{} | {} | Kubernetes {}]: {s}",
            self.scenario, self.driver, self.version
        );
        *self.step.lock() = s.to_string();
    }
}

impl Drop for Report {
    fn drop(&mut self) {
        let passed = !std::thread::panicking();
        let mut row = json!({
            "scenario": self.scenario,
            "kubernetes": self.version,
            "driver": self.driver,
            "result": if passed { "PASS" } else { "FAIL" },
            "step": if passed { String::new() } else { self.step.lock().clone() },
            "scale_in_secs": *self.scale_in_secs.lock(),
            "wall_secs": self.began.elapsed().as_secs_f64(),
        });
        for (k, v) in self.extra.lock().iter() {
            row[k] = v.clone();
        }
        if !passed {
            eprintln!(
                "e2e FAILED: scenario {} driven by {} on Kubernetes {} at step: {}",
                self.scenario,
                self.driver,
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
    /// Dropped first: its kubelet and containers go before the control plane.
    pub real: Option<Arc<parking_lot::Mutex<Option<RealNode>>>>,
    pub cp: ControlPlane,
    pub cloud: MemoryCloud,
    pub kubelet: FakeKubelet,
    pub admin: kube::Client,
    pub provider: Arc<Provider>,
    pub engine: Arc<Engine>,
    pub ca: CloudProviderClient<Channel>,
    /// Where the service serves gRPC (for a real cluster-autoscaler): a Unix socket, as
    /// in the chart's sidecar and bundled modes; and its own counts of the answers it
    /// gave (method, code).
    pub grpc_addr: ListenAddr,
    pub counts: &'static Metrics,
    /// Every process of the service so far, for the check of the answers it gave.
    pub all_counts: Vec<&'static Metrics>,
    pub settings: ScaleInSettings,
    pub lifecycle: Option<tokio::task::JoinHandle<()>>,
    pub report: Report,
}

/// The driver named in the report of scenarios that make CA's calls by hand.
pub const BY_HAND: &str = "CA's gRPC calls (the suite's client)";

/// More of a scenario's world than [`Setup`] says.
pub struct More {
    /// The group's MinSize.
    pub min: i32,
    /// ASG tags of the group.
    pub tags: Vec<(String, String)>,
    pub settings: ScaleInSettings,
    /// Also apply CA's own RBAC (`kubectl kustomize deploy/cluster-autoscaler`).
    pub ca_rbac: bool,
    /// The report's driver column.
    pub driver: String,
    /// A warm pool beside the group.
    pub warm_pool: Option<ca_asg_provider::cloud::WarmPool>,
    /// Feature gates of the API server and the controller manager (`Name=true`).
    pub feature_gates: &'static [&'static str],
    /// The desired capacity of a second group, `api`, beside `web` (0: none); it has
    /// `web`'s hook, and the service manages both.
    pub second_group: i32,
}

/// The second group's name ([`More::second_group`]).
pub const SECOND_GROUP: &str = "api";

impl Default for More {
    fn default() -> Self {
        More {
            min: 0,
            tags: Vec::new(),
            settings: settings(),
            ca_rbac: false,
            driver: BY_HAND.to_string(),
            warm_pool: None,
            feature_gates: &[],
            second_group: 0,
        }
    }
}

impl More {
    /// The group's autoscaling-option tags: scale-down-unneeded-time `unneeded`, and a
    /// malformed utilization threshold beside it.
    pub fn option_tags_one_malformed(unneeded: &str) -> More {
        let prefix = "k8s.io/cluster-autoscaler/node-template/autoscaling-options/";
        More {
            tags: vec![
                (format!("{prefix}scaledownunneededtime"), unneeded.into()),
                (
                    format!("{prefix}scaledownutilizationthreshold"),
                    "lots".into(),
                ),
            ],
            ..More::default()
        }
    }
}

/// A service started by [`serve`]: its provider, its drain engine, a client as CA, where
/// it serves gRPC and its own answer counts.
pub type Served = (
    Arc<Provider>,
    Arc<Engine>,
    CloudProviderClient<Channel>,
    ListenAddr,
    &'static Metrics,
);

/// The service as it runs in a cluster over `cloud`: its drain engine as the
/// ServiceAccount, gRPC on a Unix socket of its own (the sidecar's transport; a
/// restarted service gets a new one) with its own answer counts, and a client as CA.
pub async fn serve(client: kube::Client, cloud: &MemoryCloud, s: ScaleInSettings) -> Served {
    serve_over(client, Arc::new(cloud.clone()), cloud.group_names(), s).await
}

/// [`serve`] over `cloud` as this process sees it (the soak's replicas each see the
/// shared memory cloud through a recorder of their own), managing the groups `names`.
pub async fn serve_over(
    client: kube::Client,
    cloud: Arc<dyn ca_asg_provider::cloud::Cloud>,
    names: Vec<String>,
    s: ScaleInSettings,
) -> Served {
    let provider = Provider::new(
        cloud.clone(),
        ProviderSettings {
            selector: GroupSelector {
                names,
                tag_sets: vec![],
            },
            refresh_interval: Duration::from_millis(500),
            ..ProviderSettings::default()
        },
    );
    // As the service's own start does (`Provider::spawn_initial_refresh`): a first
    // read AWS fails (the soak's injected 5xx and throttling) is tried again.
    let mut tries = 0;
    while let Err(e) = provider.refresh_now().await {
        tries += 1;
        assert!(tries < 40, "the service's first refresh: {e:?}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let engine = Engine::new(client, cloud, Some(provider.clone()), s);
    provider.set_scale_in(Arc::new(DrainScaleIn(engine.clone())));
    let counts: &'static Metrics = Box::leak(Box::new(Metrics::new()));
    let path = socket_path();
    let addr = ListenAddr::Unix(path.clone());
    let (l, _) = ca_asg_provider::grpc::bind_listen(&addr)
        .await
        .expect("a socket for gRPC");
    tokio::spawn(ca_asg_provider::grpc::serve_counted(
        l,
        provider.clone(),
        None,
        std::future::pending(),
        Default::default(),
        counts,
    ));
    let ca = CloudProviderClient::new(
        ca_asg_provider::grpc::connect_unix(&path)
            .await
            .expect("connect to the service"),
    );
    until_sync("the service to read the drain marks on Nodes", 20, || {
        provider.drain_state_known()
    })
    .await;
    (provider, engine, ca, addr, counts)
}

/// A new socket path in this test process's own directory (`grpc-N.sock`).
pub fn socket_path() -> std::path::PathBuf {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!("ca-asg-provider-e2e-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("the sockets' directory");
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    dir.join(format!("grpc-{n}.sock"))
}

async fn until_sync(what: &str, secs: u64, mut f: impl FnMut() -> bool) {
    until(what, secs, || std::future::ready(f())).await
}

/// CA's own RBAC as the project ships it (`kubectl kustomize deploy/cluster-autoscaler`,
/// or its rbac.yaml without kubectl), applied as admin.
pub async fn apply_ca_rbac(admin: &kube::Client) {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/cluster-autoscaler");
    let text = match std::process::Command::new("kubectl")
        .args(["kustomize", dir])
        .output()
    {
        Ok(out) if out.status.success() => String::from_utf8(out.stdout).expect("UTF-8"),
        Ok(out) => panic!(
            "kubectl kustomize {dir}: {}",
            String::from_utf8_lossy(&out.stderr)
        ),
        Err(_) => std::fs::read_to_string(format!("{dir}/rbac.yaml")).expect("its rbac.yaml"),
    };
    apply_rbac(admin, &text, "deploy/cluster-autoscaler").await;
}

/// Each RBAC object of the YAML documents in `text` (from `origin`), created as admin:
/// a cluster-wide kind as it is, another in its namespace (kube-system when it names none).
async fn apply_rbac(admin: &kube::Client, text: &str, origin: &str) {
    for doc in text.split("\n---") {
        let v: serde_json::Value = match serde_saphyr::from_str(doc) {
            Ok(v) => v,
            Err(e) => panic!("{origin}: {e}"),
        };
        if v.is_null() {
            continue;
        }
        let kind = v["kind"].as_str().expect("kind").to_string();
        super::control_plane::create_rbac(admin, &v)
            .await
            .unwrap_or_else(|e| panic!("apply {kind} from {origin}: {e}"));
    }
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
    apply_rbac(admin, &text, "deploy/base/rbac.yaml").await;
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
    namespaces(admin, cp, &["shop", "logging"]).await;
    create(admin, Some("shop"), json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "app"},
        "spec": {"replicas": APP_REPLICAS, "selector": {"matchLabels": {"app": "app"}},
            "template": {"metadata": {"labels": {"app": "app"}}, "spec": {
                "terminationGracePeriodSeconds": 30,
                "containers": containers(2),
                "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                    {"labelSelector": {"matchLabels": {"app": "app"}}, "topologyKey": "kubernetes.io/hostname"}]}}}}}
    })).await;
    budget(admin, "app").await;
    log_shipper(admin, 1).await;
}

/// Namespaces, each once its `default` ServiceAccount exists (pods are refused before).
pub async fn namespaces(admin: &kube::Client, cp: &mut ControlPlane, names: &[&str]) {
    for ns in names {
        create(
            admin,
            None,
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
        )
        .await;
    }
    for ns in names {
        cp.wait_default_service_account(ns).await.unwrap();
    }
}

/// The fake kubelet's container: 100m CPU, 64Mi, a preStop of `prestop` seconds.
pub fn containers(prestop: u32) -> serde_json::Value {
    json!([{"name": "main", "image": "e2e/app:1",
        "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}},
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", prestop.to_string()]}}}}])
}

/// Nodes a CA deciding by itself must leave alone:
/// `cluster-autoscaler.kubernetes.io/scale-down-disabled`.
pub async fn scale_down_disabled(admin: &kube::Client, nodes: &[String]) {
    let api: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(admin.clone());
    for n in nodes {
        let keep = json!({"metadata": {"annotations": {
            "cluster-autoscaler.kubernetes.io/scale-down-disabled": "true"}}});
        api.patch(
            n,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(keep),
        )
        .await
        .unwrap_or_else(|e| panic!("annotate {n}: {e}"));
    }
}

/// A budget of `maxUnavailable: 1` over the pods labelled `app: <app>` in `shop`.
pub async fn budget(admin: &kube::Client, app: &str) {
    create(
        admin,
        Some("shop"),
        json!({
            "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": app},
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": app}}}
        }),
    )
    .await;
}

/// The log shipper DaemonSet `logging/fluent-bit`: tolerates every taint (as
/// fluent-bit, kube-proxy and the VPC CNI do), a preStop of `prestop` seconds.
pub async fn log_shipper(admin: &kube::Client, prestop: u32) {
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
                    "containers": containers(prestop)}}}
        }),
    )
    .await;
}

/// The field report's pods, on the real node: an app that writes a numbered line every
/// 100 ms and keeps writing through a 15 s preStop (every number also in `shared/written`),
/// and a log shipper that tails the node's container logs and forwards them off the node
/// to 127.0.0.1:`port`, every 5 s and on SIGTERM after a 2 s grace (a buffered shipper,
/// as fluent-bit and fluentd are).
pub async fn logging_workloads(
    admin: &kube::Client,
    cp: &mut ControlPlane,
    port: u16,
    shared: &std::path::Path,
) {
    namespaces(admin, cp, &["shop", "logging"]).await;
    // This run's app only: the host's /var/log may hold other runs' logs.
    let app_name = format!(
        "app-{:x}",
        std::process::id() ^ chrono::Utc::now().timestamp_subsec_nanos()
    );
    let shipper = format!(
        r#"buf=/tmp/buf; : > $buf; sent=0
ship() {{
  size=$(wc -c < $buf)
  if [ "$size" -gt "$sent" ]; then
    if tail -c +$((sent + 1)) $buf | head -c $((size - sent)) | nc 127.0.0.1 {port}; then sent=$size; fi
  fi
}}
# On SIGTERM: read what the file still holds (busybox tail polls each second), then flush,
# as fluent-bit's shutdown grace (5 s by default) and fluentd's final flush do.
trap 'sleep 2; ship; exit 0' TERM
while ! ls /var/log/containers/{app}-*_shop_main-*.log >/dev/null 2>&1; do sleep 0.2; done
tail -n +1 -F $(ls /var/log/containers/{app}-*_shop_main-*.log) >> $buf &
while :; do sleep 5 & wait $!; ship; done
"#,
        app = app_name
    );
    // Each number goes to the count file first, then to stdout: the file holds every
    // line the app wrote.
    let app = "i=0\ntrap 'exit 0' TERM\nwhile :; do i=$((i+1)); echo $i >> /count/written; echo \"line $i\"; sleep 0.1; done\n";
    let pod = |script: &str, extra: serde_json::Value| {
        let mut spec = json!({
            "nodeSelector": {"e2e/real": "true"},
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 30,
            "containers": [{"name": "main", "image": "e2e.local/busybox:1", "imagePullPolicy": "Never",
                "command": ["/bin/sh", "-c"], "args": [script]}],
        });
        for (k, v) in extra.as_object().unwrap() {
            if k == "container" {
                for (ck, cv) in v.as_object().unwrap() {
                    spec["containers"][0][ck] = cv.clone();
                }
            } else {
                spec[k] = v.clone();
            }
        }
        spec
    };
    create(admin, Some("logging"), json!({
        "apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "shipper"},
        "spec": {"selector": {"matchLabels": {"app": "shipper"}},
            // No blanket toleration (fluent-bit's chart ships none): evicted from a node
            // being drained, it does not come back.
            "template": {"metadata": {"labels": {"app": "shipper"}}, "spec": pod(&shipper, json!({
                "hostNetwork": true,
                "volumes": [{"name": "varlog", "hostPath": {"path": "/var/log"}}],
                "container": {"volumeMounts": [{"name": "varlog", "mountPath": "/var/log", "readOnly": true}]},
            }))}}
    })).await;
    create(admin, Some("shop"), json!({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": app_name},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "app"}},
            "template": {"metadata": {"labels": {"app": "app"}}, "spec": pod(app, json!({
                "volumes": [{"name": "count", "hostPath": {"path": shared.display().to_string()}}],
                "container": {
                    "volumeMounts": [{"name": "count", "mountPath": "/count"}],
                    "lifecycle": {"preStop": {"exec": {"command": ["sleep", "15"]}}},
                },
            }))}}
    })).await;
}

/// The nodes of `kubelet` running a Ready app pod (`shop/app-*`), (node, instance): the
/// ones a scale-in of an occupied node picks.
pub async fn occupied(admin: &kube::Client, kubelet: &FakeKubelet) -> Vec<(String, String)> {
    let on: std::collections::BTreeSet<String> = ready_pods(admin)
        .await
        .into_iter()
        .filter(|(p, _)| p.starts_with("shop/app-"))
        .map(|(_, n)| n)
        .collect();
    kubelet
        .nodes()
        .into_iter()
        .filter(|(n, _)| on.contains(n))
        .collect()
}

/// CA's NodeGroupDeleteNodes of `nodes` (node, instance) in group `web`, as CA sends it
/// (node name, providerID, hostname label), under CA's 5 s gRPC deadline.
pub async fn ca_deletes(ca: &mut CloudProviderClient<Channel>, nodes: &[(String, String)]) {
    try_ca_deletes(ca, nodes)
        .await
        .unwrap_or_else(|e| panic!("NodeGroupDeleteNodes: {e}"));
}

/// [`ca_deletes`], its answer returned: the soak's AWS faults may fail it, and CA asks
/// again.
pub async fn try_ca_deletes(
    ca: &mut CloudProviderClient<Channel>,
    nodes: &[(String, String)],
) -> Result<(), tonic::Status> {
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
    ca.node_group_delete_nodes(r).await.map(|_| ())
}

/// Group `web`'s NodeGroupTargetSize after a Refresh, as CA reads it at the start of
/// each loop.
pub async fn ca_target(ca: &mut CloudProviderClient<Channel>) -> i32 {
    ca.refresh(proto::RefreshRequest {}).await.expect("Refresh");
    ca.node_group_target_size(proto::NodeGroupTargetSizeRequest { id: "web".into() })
        .await
        .expect("NodeGroupTargetSize")
        .into_inner()
        .target_size
}

/// The app (`shop/app`) scaled to `replicas`.
pub async fn scale_app(admin: &kube::Client, replicas: usize) {
    let deployments: Api<k8s_openapi::api::apps::v1::Deployment> =
        Api::namespaced(admin.clone(), "shop");
    deployments
        .patch(
            "app",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"spec": {"replicas": replicas}})),
        )
        .await
        .expect("scale the app");
}

/// Whether pod `p` is not being deleted and has a condition that `holds`.
pub fn live_with(p: &Pod, holds: impl Fn(&PodCondition) -> bool) -> bool {
    p.metadata.deletion_timestamp.is_none()
        && p.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(holds))
}

/// Whether pod `p` is Ready (and not being deleted).
pub fn is_ready(p: &Pod) -> bool {
    live_with(p, |c| c.type_ == "Ready" && c.status == "True")
}

/// How many of the app's pods (`shop/app-*`) are Ready.
pub async fn app_ready(admin: &kube::Client) -> usize {
    ready_pods(admin)
        .await
        .keys()
        .filter(|p| p.starts_with("shop/app-"))
        .count()
}

/// Waits up to 60 s for `what`: a Ready pod whose `namespace/name` starts with `prefix`
/// on `node`.
pub async fn until_ready_on(admin: &kube::Client, prefix: &str, node: &str, what: &str) {
    until(what, 60, || async {
        ready_pods(admin)
            .await
            .iter()
            .any(|(p, n)| p.starts_with(prefix) && n == node)
    })
    .await
}

pub async fn ready_pods(admin: &kube::Client) -> BTreeMap<String, String> {
    let pods: Api<Pod> = Api::all(admin.clone());
    pods.list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(is_ready)
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

pub async fn until<F, Fut>(what: &str, secs: u64, f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    until_or_say(what, secs, f, || async { String::new() }).await
}

/// [`until`], and on a timeout what `say` finds then (the state that was waited on),
/// in the panic's message.
pub async fn until_or_say<F, Fut, S, SFut>(what: &str, secs: u64, mut f: F, say: S)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
    S: FnOnce() -> SFut,
    SFut: std::future::Future<Output = String>,
{
    let end = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < end {
        if f().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let state = say().await;
    panic!(
        "timed out after {secs} s waiting for {what}{}{state}",
        if state.is_empty() { "" } else { "; then: " }
    );
}

/// Each pod whose `namespace/name` starts with `prefix`, in a line: its node, phase,
/// conditions that are not True and its containers' waiting reasons, so a wait for
/// pods that times out says why they were not Ready.
pub async fn pod_states(admin: &kube::Client, prefix: &str) -> String {
    let pods: Api<Pod> = Api::all(admin.clone());
    let Ok(list) = pods.list(&Default::default()).await else {
        return "the pod list was refused".into();
    };
    let mut out = Vec::new();
    for p in list.items {
        let name = format!(
            "{}/{}",
            p.metadata.namespace.clone().unwrap_or_default(),
            p.metadata.name.clone().unwrap_or_default()
        );
        if !name.starts_with(prefix) {
            continue;
        }
        let node = p.spec.as_ref().and_then(|s| s.node_name.clone());
        let status = p.status.unwrap_or_default();
        let not_true: Vec<String> = status
            .conditions
            .iter()
            .flatten()
            .filter(|c| c.status != "True")
            .map(|c| {
                format!(
                    "{}={} ({})",
                    c.type_,
                    c.status,
                    c.reason.clone().unwrap_or_default()
                )
            })
            .collect();
        let waiting: Vec<String> = status
            .container_statuses
            .iter()
            .flatten()
            .filter_map(|c| c.state.as_ref()?.waiting.as_ref()?.reason.clone())
            .collect();
        out.push(format!(
            "{name} on {} phase {} deleting {} not-true [{}] waiting [{}]",
            node.as_deref().unwrap_or("(unscheduled)"),
            status.phase.unwrap_or_default(),
            p.metadata.deletion_timestamp.is_some(),
            not_true.join(", "),
            waiting.join(", "),
        ));
    }
    out.join("\n  ")
}

/// What a scenario's cluster runs.
pub enum Workloads {
    /// Three app replicas behind a budget and a log shipper that tolerates everything.
    Budgeted,
    /// On the real node: an app writing a numbered line every 100 ms through a 15 s
    /// preStop, and a log shipper that forwards the node's container logs to
    /// 127.0.0.1:`port`, flushing every 5 s and on SIGTERM.
    Logging { port: u16 },
    /// Only the namespaces `shop` and `logging`: the scenario makes its own pods.
    Own,
}

pub struct Setup {
    pub desired: i32,
    pub hooked: bool,
    /// The first instance is a real node (kubelet + containerd), with these images.
    pub real: Option<std::path::PathBuf>,
    pub workloads: Workloads,
}

impl Rig {
    /// The control plane, `desired` instances of group "web" (with our hook when
    /// `hooked`), a Ready Node per instance, the workloads running, and the service.
    pub async fn start(scenario: &str, bin: &Binaries, desired: i32, hooked: bool) -> Rig {
        let setup = Setup {
            desired,
            hooked,
            real: None,
            workloads: Workloads::Budgeted,
        };
        Self::start_with(scenario, bin, setup).await
    }

    pub async fn start_with(scenario: &str, bin: &Binaries, setup: Setup) -> Rig {
        Self::start_more(scenario, bin, setup, More::default()).await
    }

    /// [`Rig::start_with`], with the group's min and tags, the service's settings, CA's
    /// own RBAC and the report's driver given.
    pub async fn start_more(scenario: &str, bin: &Binaries, setup: Setup, more: More) -> Rig {
        let Setup {
            desired,
            hooked,
            real,
            workloads: what,
        } = setup;
        let report = Report::new(scenario, &more.driver, &bin.version);
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
        report.step("start the control plane");
        let mut cp = ControlPlane::start_gated(bin, more.feature_gates)
            .await
            .unwrap_or_else(|e| panic!("{e:#}"));
        let admin = cp.client(Who::Admin).await.unwrap();
        report.step("apply the shipped RBAC");
        apply_shipped_rbac(&admin).await;
        if more.ca_rbac {
            report.step("apply CA's shipped RBAC (kubectl kustomize deploy/cluster-autoscaler)");
            apply_ca_rbac(&admin).await;
        }
        report.step("register a Ready Node per instance");
        let mut group = MemoryGroup::new("web", more.min, 8, desired, "m5.large");
        for (k, v) in &more.tags {
            group = group.tag(k, v);
        }
        if hooked {
            group = group.terminating_hook(HOOK, 300);
        }
        if let Some(pool) = more.warm_pool.clone() {
            group = group.warm_pool(pool);
        }
        let mut groups = vec![group];
        if more.second_group > 0 {
            let mut api = MemoryGroup::new(SECOND_GROUP, 0, 8, more.second_group, "m5.large");
            if hooked {
                api = api.terminating_hook(HOOK, 300);
            }
            groups.push(api);
        }
        let nodes = (desired + more.second_group) as usize;
        let cloud = MemoryCloud::new(groups, timing());
        let real_iid: std::collections::BTreeSet<String> = match real {
            Some(_) => cloud
                .instances()
                .into_iter()
                .take(1)
                .map(|(_, i)| i.id)
                .collect(),
            None => Default::default(),
        };
        let (kubelet, mut real_ended) = FakeKubelet::start_beside(
            cp.client(Who::Kubelet).await.unwrap(),
            cloud.clone(),
            real_iid.clone(),
        );
        let real_node = match (&real, real_iid.iter().next()) {
            (Some(images), Some(iid)) => {
                report.step("start a real node (containerd + kubelet)");
                let (_, inst) = cloud
                    .instances()
                    .into_iter()
                    .find(|(_, i)| &i.id == iid)
                    .expect("the real node's instance");
                let node = RealNode::start(
                    &cp,
                    &bin.k8s.join("kubelet"),
                    images,
                    &super::kubelet::node_name(iid),
                    &inst.provider_id(),
                    "e2e.ca-asg-provider.io/group=web,e2e/real=true",
                )
                .await
                .unwrap_or_else(|e| panic!("{e:#}"));
                let node = Arc::new(parking_lot::Mutex::new(Some(node)));
                let weak = Arc::downgrade(&node);
                tokio::spawn(async move {
                    while real_ended.recv().await.is_some() {
                        if let Some(n) = weak.upgrade() {
                            if let Some(n) = n.lock().as_mut() {
                                n.power_off();
                            }
                        }
                    }
                });
                Some(node)
            }
            _ => None,
        };
        until("a Ready Node per instance", 30, || {
            let k = kubelet.clone();
            async move { k.nodes().len() == nodes }
        })
        .await;
        report.step("run the workloads");
        let want = match what {
            Workloads::Budgeted => {
                workloads(&admin, &mut cp).await;
                APP_REPLICAS + nodes
            }
            Workloads::Logging { port } => {
                let shared = real_node
                    .as_ref()
                    .and_then(|n| n.lock().as_ref().map(|n| n.shared.clone()))
                    .expect("the logging workloads run on a real node");
                logging_workloads(&admin, &mut cp, port, &shared).await;
                2
            }
            Workloads::Own => {
                namespaces(&admin, &mut cp, &["shop", "logging"]).await;
                0
            }
        };
        until("every app and DaemonSet pod Ready", 60, || {
            let a = admin.clone();
            async move { ready_pods(&a).await.len() == want }
        })
        .await;
        report.step("start the service as its ServiceAccount");
        let (provider, engine, ca, grpc_addr, counts) = serve(
            cp.client(Who::Service).await.unwrap(),
            &cloud,
            more.settings.clone(),
        )
        .await;
        Rig {
            real: real_node,
            cp,
            cloud,
            kubelet,
            admin,
            provider,
            engine,
            ca,
            grpc_addr,
            counts,
            all_counts: vec![counts],
            settings: more.settings,
            lifecycle: None,
            report,
        }
    }

    /// The lifecycle loop the service runs (finds instances our hook holds).
    pub fn run_lifecycle_loop(&mut self) {
        self.lifecycle = Some(scalein::sources::hook_scan::spawn_loop(
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
        let (provider, engine, ca, addr, counts) = serve(
            self.cp.client(Who::Service).await.unwrap(),
            &self.cloud,
            self.settings.clone(),
        )
        .await;
        self.provider = provider;
        self.engine = engine;
        self.ca = ca;
        self.grpc_addr = addr;
        self.counts = counts;
        self.all_counts.push(counts);
        self.run_lifecycle_loop();
    }

    /// The nodes running an app pod (the ones a scale-in of an occupied node picks).
    pub async fn occupied(&self) -> Vec<(String, String)> {
        occupied(&self.admin, &self.kubelet).await
    }

    /// Launches of `web` fail for capacity, then an occupied instance dies (the group's
    /// desired capacity not decremented): its (node, instance).
    pub async fn an_instance_dies_relaunches_failing(&self) -> (String, String) {
        use ca_asg_provider::cloud::Cloud as _;
        self.report
            .step("launches fail for capacity; an instance of the group dies (no decrement)");
        self.cloud
            .fail_launches("web", Some("InsufficientInstanceCapacity"));
        let (node, dead) = self.occupied().await.remove(0);
        self.cloud
            .terminate_instance(&dead, false)
            .await
            .expect("the instance dies");
        (node, dead)
    }

    /// CA's NodeGroupDeleteNodes, as CA sends it ([`ca_deletes`]).
    pub async fn ca_deletes(&mut self, nodes: &[(String, String)]) {
        ca_deletes(&mut self.ca, nodes).await
    }

    /// NodeGroupTargetSize after a Refresh ([`ca_target`]).
    pub async fn ca_target(&mut self) -> i32 {
        ca_target(&mut self.ca).await
    }

    pub async fn wait_ended(&self, iids: &[String], secs: u64) {
        let started = self
            .report
            .scale_in_began
            .lock()
            .unwrap_or_else(Instant::now);
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
        let asked = self
            .report
            .scale_in_asked
            .lock()
            .expect("the scale-in was asked for");
        checks::daemonset_last(&stops, &nodes, asked).unwrap_or_else(|e| panic!("{e}"));

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
        self.report
            .step("check: no error answered to CA's calls (the service's own counts)");
        self.no_provider_errors(&[]);
        self.cp
            .check_alive()
            .unwrap_or_else(|e| panic!("a control plane component died: {e}"));
    }

    /// Every answer of every process of the service so far was OK, Unimplemented, or one
    /// of `expected` (method, code).
    pub fn no_provider_errors(&self, expected: &[(&str, &str)]) {
        let texts: Vec<String> = self.all_counts.iter().map(|m| m.encode()).collect();
        checks::provider_errors(&texts, expected).unwrap_or_else(|e| panic!("{e}"));
    }

    /// The end of every promise scenario: the instances end, every promise is checked,
    /// and with `hooked` each lifecycle action was completed once.
    pub async fn ends_keeping_promises(
        &mut self,
        victims: &[(String, String)],
        desired_after: i32,
        terminations: u64,
        hooked: bool,
    ) {
        self.report.step("wait for the instances to end");
        self.wait_ended(&ids(victims), 180).await;
        self.check_promises(victims, desired_after, terminations)
            .await;
        if hooked {
            self.hooks_completed_once(&ids(victims));
        }
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
    // CA taints the node it scales in (ToBeDeletedByClusterAutoscaler, NoSchedule);
    // kubectl drain cordons it.
    let mark = if daemonsets_too {
        json!({"spec": {"taints": [{"key": "ToBeDeletedByClusterAutoscaler",
            "value": chrono::Utc::now().timestamp().to_string(), "effect": "NoSchedule"}]}})
    } else {
        json!({"spec": {"unschedulable": true}})
    };
    nodes
        .patch(
            node,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(mark),
        )
        .await
        .expect("mark the node");
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

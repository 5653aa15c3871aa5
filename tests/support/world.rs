//! The scale-in world shared by the drain tests: the in-memory API server, the
//! memory cloud, the provider core with the drain engine, and a gRPC client as CA.

use std::sync::Arc;
use std::time::Duration;

use ca_asg_provider::cloud::memory::{MemoryCloud, MemoryGroup, MemoryTiming};
use ca_asg_provider::proto::{self, cloud_provider_client::CloudProviderClient};
use ca_asg_provider::provider::Provider;
use ca_asg_provider::scalein::{Engine, ScaleInSettings};
pub use ca_asg_provider::sim::world::web_group;
use ca_asg_provider::sim::world::{Ground, GroundBuilder};
use ca_asg_provider::sim::{self, fixtures, SimCluster};
use ca_asg_provider::world::ServiceBuilder;
use k8s_openapi::api::core::v1::Node;
use tonic::transport::Channel;

use super::eventually;

/// A drain test's world: the ground ([`Ground`]) and the service on it.
pub struct World {
    /// The in-memory API server, a Node per instance.
    pub sim: Arc<SimCluster>,
    /// AWS: the groups and their instances.
    pub cloud: MemoryCloud,
    /// The provider CA talks to.
    pub provider: Arc<Provider>,
    /// The drain behind DeleteNodes.
    pub engine: Arc<Engine>,
    /// CA's gRPC client to the provider.
    pub ca: CloudProviderClient<Channel>,
    /// The groups' names, in the order given.
    pub groups: Vec<String>,
}

impl World {
    /// Creates `obj` on the API server, as `kubectl create` does; the test fails if
    /// it is refused.
    pub fn put<K: serde::Serialize + k8s_openapi::Resource>(&self, obj: &K) {
        self.sim.create(obj).unwrap();
    }
}

/// The provider's refresh interval in a world unless a test gives its own.
pub const REFRESH: Duration = Duration::from_millis(100);

pub fn fast_settings() -> ScaleInSettings {
    ScaleInSettings {
        eviction_retry: Duration::from_millis(100),
        volume_deadline: Duration::from_millis(300),
        api_qps: 200.0,
        api_burst: 200,
        lifecycle_poll_interval: Duration::from_millis(200),
        ..ScaleInSettings::default()
    }
}

/// Launches and terminations in 50 ms, hooks that hold at once.
pub fn timing() -> MemoryTiming {
    sim::world::quick_timing()
}

/// Provider + engine + gRPC server over an existing cloud and sim (a fresh process).
pub async fn service(
    sim: &Arc<SimCluster>,
    cloud: &MemoryCloud,
    groups: &[String],
    s: ScaleInSettings,
) -> (Arc<Provider>, Arc<Engine>, CloudProviderClient<Channel>) {
    service_with(sim, cloud, groups, s, REFRESH).await
}

/// [`service`] with the provider's refresh interval given.
pub async fn service_with(
    sim: &Arc<SimCluster>,
    cloud: &MemoryCloud,
    groups: &[String],
    s: ScaleInSettings,
    refresh_interval: Duration,
) -> (Arc<Provider>, Arc<Engine>, CloudProviderClient<Channel>) {
    let client = sim.client_as(super::rbac::ENGINE_USER);
    let cloud = Arc::new(cloud.clone());
    service_over_door(client, cloud, groups, s, refresh_interval, sim.in_process()).await
}

/// The service over any API server (`client` as the identity it runs as) and any
/// cloud (a replica's logged view of the shared one, say): the in-memory one, or the
/// real control plane of the end-to-end suite.
pub async fn service_over(
    client: kube::Client,
    cloud: Arc<dyn ca_asg_provider::cloud::Cloud>,
    groups: &[String],
    s: ScaleInSettings,
    refresh_interval: Duration,
) -> (Arc<Provider>, Arc<Engine>, CloudProviderClient<Channel>) {
    service_over_door(client, cloud, groups, s, refresh_interval, false).await
}

/// A replica of the service that runs as its own identity `who` on the API server
/// and sees AWS through `cloud` (a [`super::acting::AwsActs`] view, so its writes are
/// logged as its own), CA reaching it in process when the API server is reached so:
/// for tests that name the replica that acted.
pub async fn replica(
    sim: &Arc<SimCluster>,
    who: &str,
    cloud: Arc<dyn ca_asg_provider::cloud::Cloud>,
    groups: &[String],
    s: ScaleInSettings,
) -> (Arc<Provider>, Arc<Engine>, CloudProviderClient<Channel>) {
    service_over_door(
        sim.client_as(who),
        cloud,
        groups,
        s,
        REFRESH,
        sim.in_process(),
    )
    .await
}

/// The service of `crate::world`, CA reaching it in process (`in_process`: for a
/// case on tokio's paused clock, where nothing may wait on a socket) or over TCP.
async fn service_over_door(
    client: kube::Client,
    cloud: Arc<dyn ca_asg_provider::cloud::Cloud>,
    groups: &[String],
    s: ScaleInSettings,
    refresh_interval: Duration,
    in_process: bool,
) -> (Arc<Provider>, Arc<Engine>, CloudProviderClient<Channel>) {
    let service = ServiceBuilder::over(client, cloud)
        .groups(groups)
        .refresh_interval(refresh_interval)
        .scale_in(s)
        .build()
        .await
        .unwrap();
    let ca = if in_process {
        service.ca_in_process().await.unwrap()
    } else {
        service.ca_over_tcp().await.unwrap().ca
    };
    eventually("the drain marks on Nodes are read", 10, || {
        service.provider.drain_state_known()
    })
    .await;
    (service.provider, service.engine, ca)
}

/// The gRPC server over `provider` on a free port, and a client as CA.
pub async fn serve_ca(provider: &Arc<Provider>) -> CloudProviderClient<Channel> {
    ca_asg_provider::world::tcp_door(provider).await.unwrap().ca
}

/// What [`World::builder`] starts, by options: the groups, the drain's settings, the
/// API server's readiness delay, the provider's refresh interval, the cloud's
/// timing, and how CA and the engine reach their servers.
pub struct WorldBuilder {
    ground: GroundBuilder,
    settings: ScaleInSettings,
    refresh_interval: Duration,
}

impl World {
    /// No groups yet, [`fast_settings`], pods Ready 50 ms after binding, [`REFRESH`],
    /// [`timing`], everything reached over sockets.
    pub fn builder() -> WorldBuilder {
        WorldBuilder {
            ground: Ground::builder()
                .timing(timing())
                .ready_delay(Duration::from_millis(50)),
            settings: fast_settings(),
            refresh_interval: REFRESH,
        }
    }
}

impl WorldBuilder {
    pub fn group(mut self, g: MemoryGroup) -> Self {
        self.ground = self.ground.group(g);
        self
    }

    pub fn groups(mut self, gs: impl IntoIterator<Item = MemoryGroup>) -> Self {
        self.ground = self.ground.groups(gs);
        self
    }

    /// The group `web` ([`web_group`]).
    pub fn web(self, max: i32, desired: i32) -> Self {
        self.group(web_group(max, desired))
    }

    /// The group `web` with our terminating hook (`ca-asg-provider-drain`, its
    /// heartbeat timeout `timeout_secs`).
    pub fn web_hooked(self, max: i32, desired: i32, timeout_secs: i32) -> Self {
        self.group(web_group(max, desired).terminating_hook("ca-asg-provider-drain", timeout_secs))
    }

    pub fn settings(mut self, s: ScaleInSettings) -> Self {
        self.settings = s;
        self
    }

    /// From a pod's binding to Ready.
    pub fn ready_delay(mut self, d: Duration) -> Self {
        self.ground = self.ground.ready_delay(d);
        self
    }

    pub fn refresh_interval(mut self, d: Duration) -> Self {
        self.refresh_interval = d;
        self
    }

    /// The memory cloud's timing.
    pub fn timing(mut self, t: MemoryTiming) -> Self {
        self.ground = self.ground.timing(t);
        self
    }

    /// The API server and the gRPC server reached in process: for a case on tokio's
    /// paused clock (support::model::on_paused_clock), where a socket's wait would let
    /// the clock jump (issue 39).
    pub fn in_process(mut self) -> Self {
        self.ground = self.ground.in_process(true);
        self
    }

    /// The ground (a Node per instance), then the service on it as the engine's
    /// identity.
    pub async fn build(self) -> World {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
        let Ground { sim, cloud, groups } = self.ground.build().await.unwrap();
        let (provider, engine, ca) =
            service_with(&sim, &cloud, &groups, self.settings, self.refresh_interval).await;
        World {
            sim,
            cloud,
            provider,
            engine,
            ca,
            groups,
        }
    }
}

pub fn nodes_of(w: &World, group: &str) -> Vec<(String, String)> {
    nodes_of_cloud(&w.cloud, group)
}

/// The (Node name, instance id, group) of every instance of `groups` not on its way
/// out, group by group.
pub fn nodes_of_groups(w: &World, groups: &[&'static str]) -> Vec<(String, String, &'static str)> {
    groups
        .iter()
        .flat_map(|g| nodes_of(w, g).into_iter().map(|(n, i)| (n, i, *g)))
        .collect()
}

/// The (Node name, instance id) of every instance of `group` not on its way out.
pub fn nodes_of_cloud(cloud: &MemoryCloud, group: &str) -> Vec<(String, String)> {
    ca_asg_provider::sim::world::nodes_of(cloud, group)
}

/// The one node of group "web" with a fluentd-like DaemonSet pod and an app pod whose
/// preStop takes `prestop` seconds, both Ready. Returns the node and its instance.
pub async fn node_with_fluentd_and_app(w: &World, prestop: f64) -> (String, String) {
    let (node, iid) = nodes_of(w, "web").remove(0);
    w.sim
        .create(&fixtures::daemonset("logging", "fluentd", 0.2, false))
        .unwrap();
    w.sim
        .create(&fixtures::pod("shop", "app", &node, "app", prestop))
        .unwrap();
    eventually("fluentd and app running", 10, || {
        sim::world::ready_pods(&w.sim) == 2
    })
    .await;
    (node, iid)
}

/// A fluentd-like DaemonSet (its pods' preStop `fluentd_prestop` s) and on each of
/// `nodes` an app pod `app-{i}` (preStop `app_prestop` s). Callers wait for what they
/// need Ready.
pub fn fluentd_and_an_app_on_each(
    w: &World,
    nodes: &[(String, String)],
    fluentd_prestop: f64,
    app_prestop: f64,
) {
    sim::world::daemonset_and_an_app_on_each(
        &w.sim,
        "fluentd",
        fluentd_prestop,
        nodes,
        app_prestop,
    )
    .unwrap();
}

/// CA's DeleteNodes, sent as CA sends it: with a 5 s deadline (`grpc-timeout`), so a
/// call that waits on a drain (or on anything slow) fails here.
pub async fn delete_nodes(w: &mut World, group: &str, nodes: &[(String, String)]) {
    w.ca.node_group_delete_nodes(delete_request(group, nodes))
        .await
        .unwrap();
}

/// A DeleteNodes request for these (node, instance) pairs with CA's 5 s deadline.
pub fn delete_request(
    group: &str,
    nodes: &[(String, String)],
) -> tonic::Request<proto::NodeGroupDeleteNodesRequest> {
    let mut req = tonic::Request::new(delete_nodes_message(group, nodes));
    req.set_timeout(Duration::from_secs(5));
    req
}

/// CA's DeleteNodes message for these (node, instance) pairs, without a deadline.
pub fn delete_nodes_message(
    group: &str,
    nodes: &[(String, String)],
) -> proto::NodeGroupDeleteNodesRequest {
    proto::NodeGroupDeleteNodesRequest {
        id: group.into(),
        nodes: nodes
            .iter()
            .map(|(name, id)| proto::ExternalGrpcNode {
                provider_id: format!("aws:///us-east-1a/{id}"),
                name: name.clone(),
                ..Default::default()
            })
            .collect(),
    }
}

/// The group CA's NodeGroupForNode answers for an instance's Node, as CA's loop asks
/// it for every Node ("" for none).
pub async fn group_for(ca: &mut CloudProviderClient<Channel>, iid: &str) -> String {
    ca.node_group_for_node(proto::NodeGroupForNodeRequest {
        node: Some(proto::ExternalGrpcNode {
            provider_id: format!("aws:///us-east-1a/{iid}"),
            name: sim::node_name(iid),
            ..Default::default()
        }),
    })
    .await
    .unwrap()
    .into_inner()
    .node_group
    .map(|g| g.id)
    .unwrap_or_default()
}

pub async fn target(w: &mut World, group: &str) -> i32 {
    target_of(&mut w.ca, group).await
}

/// The target size CA's NodeGroupTargetSize answers for `group` through `ca`.
pub async fn target_of(ca: &mut CloudProviderClient<Channel>, group: &str) -> i32 {
    ca.node_group_target_size(proto::NodeGroupTargetSizeRequest { id: group.into() })
        .await
        .unwrap()
        .into_inner()
        .target_size
}

pub async fn set_unschedulable(w: &World, node: &str, on: bool) {
    sim::world::set_unschedulable(&w.sim, node, on)
        .await
        .unwrap();
}

/// How many pods whose name starts with `prefix` the API server evicted.
pub fn evictions_of(w: &World, prefix: &str) -> usize {
    w.sim
        .audit()
        .iter()
        .filter(|a| a.verb == "evicted" && a.name.starts_with(prefix))
        .count()
}

pub fn audit_index(
    audit: &[sim::AuditEntry],
    verb: &str,
    kind: &str,
    name_prefix: &str,
) -> Option<usize> {
    audit
        .iter()
        .position(|a| a.verb == verb && a.kind == kind && a.name.starts_with(name_prefix))
}

pub fn events(sim: &SimCluster) -> Vec<(String, String)> {
    sim.list::<k8s_openapi::api::events::v1::Event>()
        .iter()
        .map(|e| {
            (
                e["reason"].as_str().unwrap_or("").to_string(),
                e["note"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

/// Waits until at least `n` pods are Ready.
/// Writes a drain record onto `node` as the service would have left it (its reasons'
/// JSON, the drain's start and a mode mark): a record read back after a restart, from
/// another version, or edited by hand.
pub async fn put_drain_record(
    w: &World,
    node: &str,
    reasons_json: &str,
    started: chrono::DateTime<chrono::Utc>,
    mode: &str,
) {
    use ca_asg_provider::scalein::decide::record;
    let nodes: kube::Api<Node> = kube::Api::all(w.sim.client());
    nodes
        .patch(
            node,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({"metadata": {"annotations": {
                record::ANNOTATION: reasons_json,
                record::STARTED_ANNOTATION: started.to_rfc3339(),
                record::MODE_ANNOTATION: mode,
            }}})),
        )
        .await
        .unwrap();
}

pub async fn pods_ready(w: &World, n: usize) {
    eventually("pods ready", 10, || sim::world::ready_pods(&w.sim) >= n).await;
}

/// Every eviction request the API server got, per pod: once one was let through, any
/// further request for that pod is a second eviction (a real API server answers it 200
/// for a terminating pod, and nothing else shows).
pub fn assert_no_pod_evicted_twice(audit: &[sim::AuditEntry]) {
    assert_no_pod_evicted_twice_naming(audit, |_| Vec::new())
}

/// [`assert_no_pod_evicted_twice`], the failure naming what `who` says was done to
/// the pod, and by which process (support::acting::Processes::who_touched).
pub fn assert_no_pod_evicted_twice_naming(
    audit: &[sim::AuditEntry],
    who: impl Fn(&str) -> Vec<String>,
) {
    let mut evicted = std::collections::BTreeSet::new();
    for e in audit.iter().filter(|e| e.kind == "Pod") {
        match e.verb.as_str() {
            "eviction-requested" => {
                assert!(
                    !evicted.contains(&e.name),
                    "{} was evicted twice: {:#?}",
                    e.name,
                    who(&e.name)
                )
            }
            "evicted" => {
                evicted.insert(e.name.clone());
            }
            _ => {}
        }
    }
}

/// The lifecycle state of an instance of the cloud's groups (`None`: not in one).
pub fn state_of(cloud: &MemoryCloud, id: &str) -> Option<ca_asg_provider::cloud::LifecycleState> {
    cloud
        .instances()
        .into_iter()
        .find(|(_, i)| i.id == id)
        .map(|(_, i)| i.state)
}

/// The placeholders the provider lists in `group` (capacity asked for and not
/// launched), as CA names them back in DeleteNodes.
pub fn placeholders(provider: &Provider, group: &str) -> Vec<ca_asg_provider::provider::NodeRef> {
    provider
        .nodes(group)
        .unwrap()
        .into_iter()
        .filter(|v| v.id.contains("i-placeholder-"))
        .map(|v| ca_asg_provider::provider::NodeRef {
            name: v.id.clone(),
            provider_id: v.id,
        })
        .collect()
}

/// The instances the provider lists as running in `group`, as CA names them
/// (`aws:///zone/i-...`).
pub fn running(provider: &Provider, group: &str) -> Vec<String> {
    provider
        .nodes(group)
        .unwrap()
        .into_iter()
        .filter(|v| v.state == ca_asg_provider::provider::InstanceState::Running)
        .map(|v| v.id)
        .collect()
}

/// What a model's CA names for removal: `n` of `running` (all at most), in order from
/// the `pick`-th on, wrapping round; none of none.
pub fn pick(running: &[String], n: usize, pick: u64) -> Vec<String> {
    if running.is_empty() {
        return Vec::new();
    }
    let start = (pick as usize) % running.len();
    running
        .iter()
        .cycle()
        .skip(start)
        .take(n.min(running.len()))
        .cloned()
        .collect()
}

/// CA's shape for an instance it lists: name and providerID both `id`
/// (`aws:///zone/i-...`).
pub fn ca_node(id: &str) -> ca_asg_provider::provider::NodeRef {
    ca_asg_provider::provider::NodeRef {
        provider_id: id.to_string(),
        name: id.to_string(),
    }
}

/// Whether the instance is in the cloud and not on its way out.
pub fn in_service(cloud: &MemoryCloud, id: &str) -> bool {
    cloud
        .instances()
        .iter()
        .any(|(_, i)| i.id == id && !i.state.is_terminating())
}

/// A pod `name` on `node` whose PodDisruptionBudget (`{name}-pdb`) allows no
/// eviction until it is removed; returns once the pod is Ready.
#[allow(dead_code)]
pub async fn guarded_app(w: &World, node: &str, name: &str) {
    w.put(&fixtures::pdb("shop", name, 0));
    w.put(&fixtures::pod("shop", name, node, name, 0.1));
    pod_ready(w, name).await;
}

/// Waits until the pod named `name` is Ready.
pub async fn pod_ready(w: &World, name: &str) {
    super::eventually("the pod is Ready", 10, || {
        w.sim
            .list::<k8s_openapi::api::core::v1::Pod>()
            .iter()
            .any(|p| {
                p["metadata"]["name"] == name && p["status"]["conditions"][0]["status"] == "True"
            })
    })
    .await;
}

/// Waits (`secs` at most) until our hook's action for `iid` is completed.
pub async fn action_completed(w: &World, iid: &str, secs: u64) {
    crate::support::eventually("the lifecycle action is completed", secs, || {
        w.cloud
            .completed_actions()
            .iter()
            .any(|(a, _)| a.instance_id == iid)
    })
    .await;
}

//! An in-memory Kubernetes API server over real HTTP, with a fake kubelet, scheduler
//! and ReplicaSet/DaemonSet controllers, for the demo and the tests. kube-rs talks to
//! it exactly as to a real API server (list, watch with resourceVersion, selectors,
//! merge and JSON patch, graceful deletion, pods/eviction with PDB 429s).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use serde_json::Value;

pub mod cluster;
pub mod eviction;
pub mod fixtures;
pub mod http;
pub mod preconditions;
pub mod selectors;
pub mod store;
pub mod world;

pub use store::AuditEntry;
use store::{resource_of_kind, ApiError, Store};

#[derive(Debug, Clone)]
pub struct SimOptions {
    /// From a pod's binding to Ready (per-pod annotation overrides).
    pub ready_delay: Duration,
}

impl Default for SimOptions {
    fn default() -> Self {
        Self {
            ready_delay: Duration::from_millis(200),
        }
    }
}

/// API requests by (verb, resource), and what each identity (the bearer token a
/// client sends, see [`SimCluster::client_as`]) used, as RBAC sees it, with the
/// User-Agent it was sent with (the audit log's `userAgent`).
#[derive(Debug, Default)]
pub struct RequestStats {
    counts: Mutex<BTreeMap<(String, String), u64>>,
    /// The writes that reached the server, in order (the last [`WRITES_KEPT`]).
    writes: Mutex<std::collections::VecDeque<WriteSeen>>,
    used: Mutex<BTreeMap<String, std::collections::BTreeSet<RbacUse>>>,
    agents: Mutex<BTreeMap<String, std::collections::BTreeSet<(String, RbacUse)>>>,
}

/// How many of the latest writes [`RequestStats::writes`] keeps.
pub const WRITES_KEPT: usize = 50_000;

/// A write (create, update, patch, delete) that reached the server: who sent it,
/// when it arrived, what it was of and how it was answered, for tests that judge
/// which replica acted when (and which one held the Lease then).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteSeen {
    pub at: crate::clock::Instant,
    /// The bearer token's identity; empty without one.
    pub user: String,
    pub verb: String,
    /// `resource` or `resource/subresource` (`pods/eviction`).
    pub resource: String,
    /// The object's name; empty for a write to a collection (a create).
    pub name: String,
    /// The HTTP status the server answered with (the effect is in when it is 2xx).
    pub status: u16,
}

/// One (verb, API group, resource[/subresource]) an identity used.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct RbacUse {
    pub verb: String,
    pub group: String,
    pub resource: String,
}

impl RequestStats {
    fn count(
        &self,
        user: Option<&str>,
        user_agent: Option<&str>,
        verb: &str,
        group: &str,
        res: &str,
    ) {
        *self
            .counts
            .lock()
            .entry((verb.to_string(), res.to_string()))
            .or_default() += 1;
        if let Some(user) = user {
            let used = RbacUse {
                verb: verb.to_string(),
                group: group.to_string(),
                resource: res.to_string(),
            };
            self.agents
                .lock()
                .entry(user.to_string())
                .or_default()
                .insert((user_agent.unwrap_or_default().to_string(), used.clone()));
            self.used
                .lock()
                .entry(user.to_string())
                .or_default()
                .insert(used);
        }
    }

    /// Keeps a write once it is answered (`w.at` is when it arrived).
    pub(crate) fn wrote(&self, w: WriteSeen) {
        let mut writes = self.writes.lock();
        if writes.len() >= WRITES_KEPT {
            writes.pop_front();
        }
        writes.push_back(w);
    }

    /// Every (User-Agent, use) of the identity `user` so far; an empty agent is a
    /// request sent without the header.
    pub fn agents_of(&self, user: &str) -> Vec<(String, RbacUse)> {
        self.agents
            .lock()
            .get(user)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// The writes that reached the server so far, in the order they were answered
    /// (the latest [`WRITES_KEPT`]).
    pub fn writes(&self) -> Vec<WriteSeen> {
        self.writes.lock().iter().cloned().collect()
    }

    /// Every (verb, group, resource) the identity `user` used so far.
    pub fn used_by(&self, user: &str) -> Vec<RbacUse> {
        self.used
            .lock()
            .get(user)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default()
    }

    pub fn snapshot(&self) -> BTreeMap<(String, String), u64> {
        self.counts.lock().clone()
    }

    pub fn total(&self) -> u64 {
        self.counts.lock().values().sum()
    }

    pub fn get(&self, verb: &str, res: &str) -> u64 {
        self.counts
            .lock()
            .get(&(verb.to_string(), res.to_string()))
            .copied()
            .unwrap_or(0)
    }
}

/// One RBAC-like rule for the SelfSubjectAccessReviews the sim answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub verbs: Vec<String>,
    pub groups: Vec<String>,
    pub resources: Vec<String>,
}

impl Grant {
    pub fn allows(&self, verb: &str, group: &str, resource: &str) -> bool {
        let any = |v: &[String], x: &str| v.iter().any(|s| s == x || s == "*");
        any(&self.verbs, verb) && any(&self.groups, group) && any(&self.resources, resource)
    }
}

pub struct SimCluster {
    pub store: Arc<Store>,
    stats: Arc<RequestStats>,
    addr: SocketAddr,
    epoch: tokio::sync::watch::Sender<u64>,
    server: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// The same server without a socket, for clients built in process
    /// ([`SimCluster::start_in_process`]); `None` while the server is down.
    door: Arc<Mutex<Option<axum::Router>>>,
    in_process: bool,
    actors: tokio::task::JoinHandle<()>,
    grants: Arc<Mutex<Option<Vec<Grant>>>>,
    faults: Arc<Mutex<Faults>>,
}

/// What the API server refuses on purpose, as a real one does under RBAC and under
/// API Priority and Fairness.
#[derive(Debug, Default)]
pub struct Faults {
    /// (verb, resource[/subresource]) refused with 403.
    pub denied: Vec<(String, String)>,
    /// (verb, resource[/subresource]) -> how many more requests get APF's 429
    /// (reason TooManyRequests, no PodDisruptionBudget cause, Retry-After).
    pub throttled: std::collections::BTreeMap<(String, String), u32>,
    /// (verb, resource[/subresource]) -> how many more requests are refused, and
    /// with which status ([`Refusal`]), before the request is looked at.
    pub refused: std::collections::BTreeMap<(String, String), (u32, Refusal)>,
    /// How long every request waits before it is handled (an overloaded server).
    pub latency: Duration,
    /// How late every watch event arrives (a watch cache behind etcd).
    pub watch_lag: Duration,
    /// (verb, resource[/subresource]) -> how long such requests wait besides (a slow
    /// admission webhook on them).
    pub slow_requests: std::collections::BTreeMap<(String, String), Duration>,
    /// (verb, resource[/subresource], name) -> the same for one object only (a
    /// webhook slow for one Node, a write stuck behind etcd's lock on one key).
    pub slow_objects: std::collections::BTreeMap<(String, String, String), Duration>,
    /// (verb, resource[/subresource]) -> how long such requests' answers wait after
    /// the request took effect (the write landed; its answer is slow to come back).
    pub slow_answers: std::collections::BTreeMap<(String, String), Duration>,
    /// Clients (bearer token users) cut off from the server: their requests never
    /// reach it and are never answered (a network partition of one replica).
    pub cut: std::collections::BTreeSet<String>,
}

/// How a refused request is answered ([`SimCluster::refuse`]), as a real API server
/// answers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// 403 Forbidden: RBAC, or an admission webhook that denies.
    Forbidden,
    /// 429 TooManyRequests from API Priority and Fairness (no budget cause).
    TooManyRequests,
    /// 500 InternalError: etcd timed out, a webhook failed, a panic.
    Internal,
    /// 503 ServiceUnavailable: the server is shutting down or overloaded.
    Unavailable,
}

impl Refusal {
    pub fn code(self) -> u16 {
        match self {
            Refusal::Forbidden => 403,
            Refusal::TooManyRequests => 429,
            Refusal::Internal => 500,
            Refusal::Unavailable => 503,
        }
    }
}

fn router(ctx: Arc<http::Ctx>) -> axum::Router {
    axum::Router::new().fallback(http::handle).with_state(ctx)
}

async fn serve(listener: tokio::net::TcpListener, app: axum::Router) {
    let _ = axum::serve(listener, app).await;
}

impl SimCluster {
    pub async fn start(opts: SimOptions) -> anyhow::Result<SimCluster> {
        Self::start_with(opts, false).await
    }

    /// [`SimCluster::start`] whose clients ([`SimCluster::client`],
    /// [`SimCluster::client_as`]) reach the server in process, without a socket: a
    /// request is handled on the caller's runtime and nothing waits on the kernel, so
    /// on tokio's paused clock a case's time moves only when every task waits (issue
    /// 39: model tests that replay exactly). The server still listens on
    /// [`SimCluster::url`] for anything else.
    pub async fn start_in_process(opts: SimOptions) -> anyhow::Result<SimCluster> {
        Self::start_with(opts, true).await
    }

    async fn start_with(opts: SimOptions, in_process: bool) -> anyhow::Result<SimCluster> {
        let store = Arc::new(Store::new());
        let stats = Arc::new(RequestStats::default());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (epoch, epoch_rx) = tokio::sync::watch::channel(0u64);
        let grants = Arc::new(Mutex::new(None));
        let faults = Arc::new(Mutex::new(Faults::default()));
        let ctx = Arc::new(http::Ctx {
            store: store.clone(),
            stats: stats.clone(),
            epoch: epoch_rx,
            grants: grants.clone(),
            faults: faults.clone(),
        });
        let app = router(ctx);
        let door = Arc::new(Mutex::new(Some(app.clone())));
        let server = tokio::spawn(serve(listener, app));
        let actors = cluster::spawn(store.clone(), opts);
        Ok(SimCluster {
            store,
            stats,
            addr,
            epoch,
            server: Mutex::new(Some(server)),
            door,
            in_process,
            actors,
            grants,
            faults,
        })
    }

    /// Whether its clients reach it in process ([`SimCluster::start_in_process`]).
    pub fn in_process(&self) -> bool {
        self.in_process
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// From now on SelfSubjectAccessReviews allow only what `grants` allow (by default
    /// everything is allowed). Other requests are not checked.
    pub fn grant(&self, grants: Vec<Grant>) {
        *self.grants.lock() = Some(grants);
    }

    /// From now on every request with this verb (`get`, `list`, `watch`, `patch`, ...)
    /// on this resource (`nodes`, `pods/eviction`, ...) is refused with 403, as RBAC
    /// refuses what a role does not grant. An empty list lifts every refusal.
    pub fn deny(&self, rules: &[(&str, &str)]) {
        self.faults.lock().denied = rules
            .iter()
            .map(|(v, r)| (v.to_string(), r.to_string()))
            .collect();
    }

    /// The next `times` requests with this verb on this resource are answered as API
    /// Priority and Fairness answers an overloaded server: 429 TooManyRequests with
    /// Retry-After, and no PodDisruptionBudget cause.
    pub fn throttle(&self, verb: &str, resource: &str, times: u32) {
        self.faults
            .lock()
            .throttled
            .insert((verb.to_string(), resource.to_string()), times);
    }

    /// The next `times` requests with this verb on this resource are refused as
    /// `how` says (403, APF's 429, 500 or 503), before anything is done: nothing is
    /// written, nothing is in the audit. Zero times lifts it.
    pub fn refuse(&self, verb: &str, resource: &str, times: u32, how: Refusal) {
        self.faults
            .lock()
            .refused
            .insert((verb.to_string(), resource.to_string()), (times, how));
    }

    /// How many more requests with this verb on this resource [`Self::refuse`] still
    /// refuses (zero once they are spent or lifted).
    pub fn refusals_left(&self, verb: &str, resource: &str) -> u32 {
        self.faults
            .lock()
            .refused
            .get(&(verb.to_string(), resource.to_string()))
            .map_or(0, |(times, _)| *times)
    }

    /// Lifts every refusal, throttle, denial and delay at once.
    pub fn heal(&self) {
        let mut f = self.faults.lock();
        f.denied.clear();
        f.throttled.clear();
        f.refused.clear();
        f.slow_requests.clear();
        f.slow_objects.clear();
        f.slow_answers.clear();
        f.cut.clear();
        f.watch_lag = Duration::ZERO;
        f.latency = Duration::ZERO;
    }

    /// From now on every watch event reaches its watcher `lag` late, as from a watch
    /// cache behind etcd: a list is current, a watch behind it (zero: at once).
    pub fn lag_watches(&self, lag: Duration) {
        self.faults.lock().watch_lag = lag;
    }

    /// From now on requests with this verb on this resource wait `latency` more before
    /// they are handled, as behind a slow admission webhook; such a request, once
    /// received, is carried out even if its client goes away meanwhile (its answer is
    /// lost, its effect is not). Zero: no more delay.
    pub fn slow_requests(&self, verb: &str, resource: &str, latency: Duration) {
        self.faults
            .lock()
            .slow_requests
            .insert((verb.to_string(), resource.to_string()), latency);
    }

    /// [`Self::slow_requests`] for the object named `name` only.
    pub fn slow_requests_to(&self, verb: &str, resource: &str, name: &str, latency: Duration) {
        self.faults.lock().slow_objects.insert(
            (verb.to_string(), resource.to_string(), name.to_string()),
            latency,
        );
    }

    /// From now on requests with this verb on this resource take effect at once and
    /// are answered `latency` later (zero: at once again): a renewal that lands while
    /// its answer is stuck on the way back.
    pub fn slow_answers(&self, verb: &str, resource: &str, latency: Duration) {
        self.faults
            .lock()
            .slow_answers
            .insert((verb.to_string(), resource.to_string()), latency);
    }

    /// Cuts the client of `user` off (true) or lets it through again (false): its
    /// requests from now on never reach the server and are never answered, as for a
    /// replica behind a network partition; requests already taken on finish.
    pub fn cut(&self, user: &str, cut: bool) {
        let mut f = self.faults.lock();
        if cut {
            f.cut.insert(user.to_string());
        } else {
            f.cut.remove(user);
        }
    }

    /// From now on every request waits `latency` before it is handled, as a slow or
    /// overloaded API server answers (zero: at once again).
    pub fn slow(&self, latency: Duration) {
        self.faults.lock().latency = latency;
    }

    /// The kubelet of this node stops: the Node turns NotReady (Ready Unknown, as the
    /// node lifecycle controller marks it) and nothing on it ever confirms a pod's
    /// termination again, so terminating pods stay until the Node is deleted.
    pub fn stop_kubelet(&self, node: &str) -> Result<(), ApiError> {
        let nodes = store::resource("", "nodes").expect("nodes");
        self.store
            .lock()
            .update(nodes, "", node, "kubelet-stopped", |n| {
                let mut n = n.clone();
                n["metadata"]["annotations"][cluster::KUBELET_STOPPED_ANNOTATION] = "true".into();
                n["status"]["conditions"] = serde_json::json!([
                    {"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown",
                     "message": "Kubelet stopped posting node status."}
                ]);
                Ok(n)
            })?;
        Ok(())
    }

    /// The pod's readiness as its kubelet reports it, set by hand: `false` is a
    /// readiness probe that starts failing (the pod stays, not Ready, nothing evicts
    /// it), `true` one that passes again. The fake kubelet makes a pod Ready once, at
    /// its ready delay; after that only this changes it.
    pub fn set_ready(&self, ns: &str, name: &str, ready: bool) -> Result<(), ApiError> {
        let pods = store::resource("", "pods").expect("pods");
        let status = if ready { "True" } else { "False" };
        self.store.lock().update(
            pods,
            ns,
            name,
            if ready { "ready" } else { "unready" },
            |p| {
                let mut p = p.clone();
                p["status"]["phase"] = "Running".into();
                p["status"]["conditions"] =
                    serde_json::json!([{"type": "Ready", "status": status}]);
                Ok(p)
            },
        )?;
        Ok(())
    }

    /// A kube::Client over real HTTP to this server (in process after
    /// [`SimCluster::start_in_process`]).
    pub fn client(&self) -> kube::Client {
        if self.in_process {
            return self.client_in_process(None);
        }
        self.client_with(|_| {})
    }

    /// A client whose requests are recorded under `user` (sent as its bearer token), so
    /// a test can compare what that identity used with an RBAC role.
    pub fn client_as(&self, user: &str) -> kube::Client {
        if self.in_process {
            return self.client_in_process(Some(user));
        }
        let user = user.to_string();
        self.client_with(move |cfg| cfg.auth_info.token = Some(user.into()))
    }

    /// A client whose requests go to the router as they are, with `user`'s bearer
    /// token; refused as a closed port is while the server is down.
    fn client_in_process(&self, user: Option<&str>) -> kube::Client {
        use tower::ServiceExt;
        let door = self.door.clone();
        let bearer = user.map(|u| {
            axum::http::HeaderValue::from_str(&format!("Bearer {u}")).expect("a user is a header")
        });
        let service = tower::service_fn(move |mut req: axum::http::Request<kube::client::Body>| {
            if let Some(b) = &bearer {
                req.headers_mut()
                    .insert(axum::http::header::AUTHORIZATION, b.clone());
            }
            let app = door.lock().clone();
            async move {
                let Some(app) = app else {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::ConnectionRefused,
                        "the in-memory API server is down",
                    ));
                };
                let answer = app.oneshot(req).await;
                Ok(answer.unwrap_or_else(|never| match never {}))
            }
        });
        kube::Client::new(service, "default")
    }

    fn client_with(&self, f: impl FnOnce(&mut kube::Config)) -> kube::Client {
        let uri: hyper::Uri = self.url().parse().expect("own URL parses");
        let mut cfg = kube::Config::new(uri);
        cfg.default_namespace = "default".into();
        cfg.read_timeout = Some(Duration::from_secs(300));
        // Like the engine's client: a 429 from a PDB must reach the caller.
        cfg.default_retry = false;
        f(&mut cfg);
        kube::Client::try_from(cfg).expect("client for a plain HTTP URL")
    }

    /// Inserts an object through the same path as a POST (watchers see it).
    pub fn create<K: serde::Serialize + k8s_openapi::Resource>(
        &self,
        obj: &K,
    ) -> Result<Value, ApiError> {
        let res = resource_of_kind(K::KIND, K::API_VERSION).ok_or_else(|| {
            ApiError::new(404, "NotFound", format!("kind {} is not served", K::KIND))
        })?;
        let v = serde_json::to_value(obj)
            .map_err(|e| ApiError::new(400, "BadRequest", e.to_string()))?;
        let ns = v["metadata"]["namespace"]
            .as_str()
            .unwrap_or("default")
            .to_string();
        self.store
            .lock()
            .create(res, &ns, v)
            .map(Arc::unwrap_or_clone)
    }

    /// An object as stored, by kind.
    pub fn get<K: k8s_openapi::Resource>(&self, ns: &str, name: &str) -> Option<Value> {
        let res = resource_of_kind(K::KIND, K::API_VERSION)?;
        self.store.lock().get(res, ns, name).cloned()
    }

    /// Every object of a kind, as stored.
    pub fn list<K: k8s_openapi::Resource>(&self) -> Vec<Value> {
        self.list_shared::<K>()
            .iter()
            .map(|v| Value::clone(v))
            .collect()
    }

    /// [`Self::list`] without copying the objects (they are the store's own, shared).
    pub fn list_shared<K: k8s_openapi::Resource>(&self) -> Vec<Arc<Value>> {
        match resource_of_kind(K::KIND, K::API_VERSION) {
            Some(res) => self.store.lock().list(res, None),
            None => Vec::new(),
        }
    }

    /// Deletes at once (no grace), as for a Node removed by the cloud controller.
    pub fn remove<K: k8s_openapi::Resource>(&self, ns: &str, name: &str) -> bool {
        match resource_of_kind(K::KIND, K::API_VERSION) {
            Some(res) => self.store.lock().remove(res, ns, name).is_some(),
            None => false,
        }
    }

    pub fn audit(&self) -> Vec<AuditEntry> {
        self.store.audit()
    }

    pub fn requests(&self) -> &RequestStats {
        &self.stats
    }

    /// Drops every open watch and listens again on the same port, keeping the state.
    pub async fn restart_http(&self) -> anyhow::Result<()> {
        self.outage(Duration::from_millis(50)).await
    }

    /// An API-server restart with `down` of refused connections: open watches end,
    /// requests fail, then it listens again on the same port with the same state (the
    /// cluster's controllers and kubelet keep running, as etcd would keep the data).
    pub async fn outage(&self, down: Duration) -> anyhow::Result<()> {
        self.outage_until(tokio::time::sleep(down)).await
    }

    /// The API server is down until `back` resolves (a test ends an outage when
    /// what it waits for happened, not after a time a busy machine may not keep).
    pub async fn outage_until(
        &self,
        back: impl std::future::Future<Output = ()>,
    ) -> anyhow::Result<()> {
        if let Some(h) = self.server.lock().take() {
            h.abort();
        }
        *self.door.lock() = None;
        self.epoch.send_modify(|e| *e += 1);
        back.await;
        let listener = tokio::net::TcpListener::bind(self.addr).await?;
        let ctx = Arc::new(http::Ctx {
            store: self.store.clone(),
            stats: self.stats.clone(),
            epoch: self.epoch.subscribe(),
            grants: self.grants.clone(),
            faults: self.faults.clone(),
        });
        let app = router(ctx);
        *self.door.lock() = Some(app.clone());
        *self.server.lock() = Some(tokio::spawn(serve(listener, app)));
        Ok(())
    }

    /// Keeps one Node per InService instance of a memory cloud (and removes Nodes of
    /// instances that are gone), like kubelet registration and the cloud controller.
    pub fn follow_cloud(
        self: &Arc<Self>,
        cloud: crate::cloud::memory::MemoryCloud,
    ) -> tokio::task::JoinHandle<()> {
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                let Some(sim) = weak.upgrade() else { return };
                sim.sync_nodes(&cloud);
                drop(sim);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    }

    fn sync_nodes(&self, cloud: &crate::cloud::memory::MemoryCloud) {
        use crate::cloud::LifecycleState;
        let instances = cloud.instances();
        // An instance in a warm pool still exists (stopped, or running): its Node
        // stays, as the cloud's node controller keeps the Node of a stopped instance.
        let pooled = cloud.pooled();
        let existing = self.list_shared::<k8s_openapi::api::core::v1::Node>();
        // Sets, not scans: this runs every 100 ms over thousands of nodes in a storm.
        let known: std::collections::BTreeSet<&str> = existing
            .iter()
            .filter_map(|n| n["metadata"]["name"].as_str())
            .collect();
        let alive: std::collections::BTreeSet<&str> = instances
            .iter()
            .chain(&pooled)
            .filter(|(_, i)| i.state != LifecycleState::Terminated)
            .map(|(_, i)| i.id.as_str())
            .collect();
        for (group, inst) in &instances {
            let name = node_name(&inst.id);
            if inst.state == LifecycleState::InService && !known.contains(name.as_str()) {
                let labels = [
                    ("topology.kubernetes.io/zone", inst.zone.as_str()),
                    (
                        "node.kubernetes.io/instance-type",
                        inst.instance_type.as_deref().unwrap_or(""),
                    ),
                    ("sim.ca-asg-provider.io/group", group.as_str()),
                ];
                let _ = self.create(&fixtures::node(&name, &inst.provider_id(), &labels));
            }
        }
        for n in &existing {
            let pid = n["spec"]["providerID"].as_str().unwrap_or("");
            let id = instance_of(pid).unwrap_or("");
            if !alive.contains(id) && pid.starts_with("aws://") {
                let name = n["metadata"]["name"].as_str().unwrap_or("").to_string();
                self.remove::<k8s_openapi::api::core::v1::Node>("", &name);
            }
        }
    }

    pub async fn shutdown(self) {
        if let Some(h) = self.server.lock().take() {
            h.abort();
        }
        self.actors.abort();
    }
}

impl Drop for SimCluster {
    fn drop(&mut self) {
        if let Some(h) = self.server.lock().take() {
            h.abort();
        }
        self.actors.abort();
    }
}

/// The instance id in a providerID as the fake's kubelet writes it,
/// `aws:///<zone>/<instance-id>`. The fake's own reading, not the service's parser:
/// a fault in that one is not shared by the fake that tests it.
fn instance_of(provider_id: &str) -> Option<&str> {
    let (zone, id) = provider_id.strip_prefix("aws:///")?.split_once('/')?;
    let ok = !zone.is_empty()
        && id.len() > 2
        && id.starts_with("i-")
        && id[2..]
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-');
    ok.then_some(id)
}

/// The Node name the simulated kubelet registers for an instance.
pub fn node_name(instance_id: &str) -> String {
    format!("ip-{}.ec2.internal", instance_id.trim_start_matches("i-"))
}

#[cfg(test)]
mod tests {
    use super::instance_of;

    #[test]
    fn the_fake_reads_the_provider_ids_its_kubelet_writes() {
        assert_eq!(instance_of("aws:///us-east-1a/i-0abc"), Some("i-0abc"));
        for wrong in [
            "",
            "i-0abc",
            "aws:///i-0abc",
            "aws:///a/b/i-0abc",
            "gce:///a/i-1",
            "aws:///us-east-1a/",
        ] {
            assert_eq!(instance_of(wrong), None, "{wrong}");
        }
    }
}

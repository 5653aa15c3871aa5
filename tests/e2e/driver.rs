//! The suite's CA-shaped client: what a cluster-autoscaler of one [`CaProfile`] does to
//! the service and to the cluster around its calls, on the real control plane, as CA's
//! ServiceAccount. The scenario decides (which nodes go, how many are added); this client
//! carries the decision out the way that CA version does:
//!
//! - at start: (>= 1.35) list and watch the Dynamic Resource Allocation objects, then
//!   clean its `ToBeDeletedByClusterAutoscaler` taint (and, >= 1.34, its cordon) from
//!   every node of the group;
//! - the template read from field 1 or `nodeBytes`, the option Durations sent and read
//!   in the version's fields;
//! - a scale-down: every node marked in one Update (taint; cordon too from 1.34), then
//!   each node in its own task, at most `--max-scale-down-parallelism` at once:
//!   NodeGroupGetOptions (an error other than Unimplemented skips the node and cleans its
//!   marks), then one NodeGroupDeleteNodes for that node (a failure cleans its marks);
//!   with a batcher interval, one NodeGroupDeleteNodes for every node gathered in it
//!   ([`SuiteCa::scale_down_batched`]);
//! - a loop that keeps calling Refresh, NodeGroups, NodeGroupForNode, NodeGroupTargetSize
//!   and NodeGroupNodes while the deletions run;
//! - every call under CA's 5 s deadline (gRPC's `grpc-timeout`).
//!
//! Every answer the service gives is recorded; [`SuiteCa::errors`] lists those other
//! than OK and Unimplemented.
#![allow(dead_code)] // shared by the e2e test crates, each using a part

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use ca_asg_provider::proto::{self, cloud_provider_client::CloudProviderClient};
use k8s_openapi::api::core::v1::{Node, Pod, Taint};
use kube::api::{ListParams, PostParams};
use kube::Api;
use parking_lot::Mutex;
use prost::Message as _;
use tonic::transport::Channel;
use tonic::Code;

use super::ca_profile::{CaProfile, Durations, TemplateRead};

pub const CA_TAINT: &str = "ToBeDeletedByClusterAutoscaler";

/// One answer of the service to the client.
#[derive(Debug, Clone)]
pub struct Call {
    pub rpc: &'static str,
    pub code: Code,
    pub message: String,
}

/// What became of one node CA chose to delete.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Deletion {
    /// NodeGroupDeleteNodes answered OK.
    Deleted,
    /// NodeGroupGetOptions answered an error other than Unimplemented: not deleted, marks
    /// cleaned.
    SkippedOnOptions(String),
    /// NodeGroupDeleteNodes failed: marks cleaned, the node stays.
    Failed(String),
    /// The marks could not be set (CA aborts the whole scale-down then).
    NotMarked(String),
}

/// The options as this CA version reads them from an answer.
#[derive(Debug, Clone, PartialEq)]
pub struct ReadOptions {
    pub scale_down_utilization_threshold: f64,
    pub scale_down_unneeded: Duration,
    pub scale_down_unready: Duration,
    pub max_node_provision: Duration,
}

#[derive(Clone)]
pub struct SuiteCa {
    pub profile: &'static CaProfile,
    pub group: String,
    grpc: CloudProviderClient<Channel>,
    /// As CA's ServiceAccount.
    kube: kube::Client,
    calls: Arc<Mutex<Vec<Call>>>,
    /// The loop that keeps calling while deletions run.
    background: Arc<Mutex<Option<tokio::task::JoinHandle<()>>>>,
}

/// CA's flag defaults, the `defaults` of every NodeGroupGetOptions.
fn ca_defaults() -> (f64, Duration, Duration, Duration) {
    (
        0.5,
        Duration::from_secs(600),
        Duration::from_secs(1200),
        Duration::from_secs(900),
    )
}

fn meta(d: Duration) -> Option<proto::MetaDuration> {
    Some(proto::MetaDuration {
        duration: d.as_nanos() as i64,
    })
}

fn google(d: Duration) -> Option<prost_types::Duration> {
    Some(prost_types::Duration {
        seconds: d.as_secs() as i64,
        nanos: d.subsec_nanos() as i32,
    })
}

fn from_meta(d: &Option<proto::MetaDuration>) -> Duration {
    Duration::from_nanos(d.as_ref().map_or(0, |d| d.duration.max(0) as u64))
}

fn from_google(d: &prost_types::Duration) -> Duration {
    Duration::from_secs(d.seconds.max(0) as u64) + Duration::from_nanos(d.nanos.max(0) as u64)
}

impl SuiteCa {
    pub fn new(
        profile: &'static CaProfile,
        grpc: CloudProviderClient<Channel>,
        kube: kube::Client,
        group: &str,
    ) -> SuiteCa {
        SuiteCa {
            profile,
            group: group.to_string(),
            grpc,
            kube,
            calls: Arc::default(),
            background: Arc::default(),
        }
    }

    /// The same CA after a restart: a new connection, the record kept.
    pub fn restarted(&self, grpc: CloudProviderClient<Channel>) -> SuiteCa {
        self.stop_loop();
        SuiteCa {
            grpc,
            background: Arc::default(),
            ..self.clone()
        }
    }

    fn req<T>(&self, m: T) -> tonic::Request<T> {
        let mut r = tonic::Request::new(m);
        r.set_timeout(self.profile.grpc_timeout);
        r
    }

    fn record<T>(
        &self,
        rpc: &'static str,
        r: Result<tonic::Response<T>, tonic::Status>,
    ) -> Result<T, tonic::Status> {
        let (code, message) = match &r {
            Ok(_) => (Code::Ok, String::new()),
            Err(s) => (s.code(), s.message().to_string()),
        };
        self.calls.lock().push(Call { rpc, code, message });
        r.map(|r| r.into_inner())
    }

    /// Every call answered with an error other than Unimplemented.
    pub fn errors(&self) -> Vec<Call> {
        self.calls
            .lock()
            .iter()
            .filter(|c| c.code != Code::Ok && c.code != Code::Unimplemented)
            .cloned()
            .collect()
    }

    /// How many calls of `rpc` were made.
    pub fn count(&self, rpc: &str) -> usize {
        self.calls.lock().iter().filter(|c| c.rpc == rpc).count()
    }

    fn nodes_api(&self) -> Api<Node> {
        Api::all(self.kube.clone())
    }

    // ---- calls ----

    pub async fn refresh(&self) -> Result<(), tonic::Status> {
        let mut g = self.grpc.clone();
        let r = g.refresh(self.req(proto::RefreshRequest {})).await;
        self.record("Refresh", r).map(|_| ())
    }

    pub async fn node_groups(&self) -> Result<Vec<proto::NodeGroup>, tonic::Status> {
        let mut g = self.grpc.clone();
        let r = g.node_groups(self.req(proto::NodeGroupsRequest {})).await;
        self.record("NodeGroups", r).map(|r| r.node_groups)
    }

    pub async fn target_size(&self) -> Result<i32, tonic::Status> {
        let mut g = self.grpc.clone();
        let r = g
            .node_group_target_size(self.req(proto::NodeGroupTargetSizeRequest {
                id: self.group.clone(),
            }))
            .await;
        self.record("NodeGroupTargetSize", r).map(|r| r.target_size)
    }

    pub async fn instances(&self) -> Result<Vec<proto::Instance>, tonic::Status> {
        let mut g = self.grpc.clone();
        let r = g
            .node_group_nodes(self.req(proto::NodeGroupNodesRequest {
                id: self.group.clone(),
            }))
            .await;
        self.record("NodeGroupNodes", r).map(|r| r.instances)
    }

    pub async fn group_for(&self, node: proto::ExternalGrpcNode) -> Result<String, tonic::Status> {
        let mut g = self.grpc.clone();
        let r = g
            .node_group_for_node(self.req(proto::NodeGroupForNodeRequest { node: Some(node) }))
            .await;
        self.record("NodeGroupForNode", r)
            .map(|r| r.node_group.map(|g| g.id).unwrap_or_default())
    }

    pub async fn increase_size(&self, delta: i32) -> Result<(), tonic::Status> {
        let mut g = self.grpc.clone();
        let r = g
            .node_group_increase_size(self.req(proto::NodeGroupIncreaseSizeRequest {
                id: self.group.clone(),
                delta,
            }))
            .await;
        self.record("NodeGroupIncreaseSize", r).map(|_| ())
    }

    pub async fn decrease_target_size(&self, delta: i32) -> Result<(), tonic::Status> {
        let mut g = self.grpc.clone();
        let r = g
            .node_group_decrease_target_size(self.req(proto::NodeGroupDecreaseTargetSizeRequest {
                id: self.group.clone(),
                delta,
            }))
            .await;
        self.record("NodeGroupDecreaseTargetSize", r).map(|_| ())
    }

    pub async fn delete_nodes(
        &self,
        nodes: Vec<proto::ExternalGrpcNode>,
    ) -> Result<(), tonic::Status> {
        let mut g = self.grpc.clone();
        let r = g
            .node_group_delete_nodes(self.req(proto::NodeGroupDeleteNodesRequest {
                id: self.group.clone(),
                nodes,
            }))
            .await;
        self.record("NodeGroupDeleteNodes", r).map(|_| ())
    }

    /// NodeGroupTemplateNodeInfo, read as this version reads it: the Node's name and
    /// labels, `Ok(None)` for Unimplemented or an answer this version finds empty.
    pub async fn template(&self) -> Result<Option<k8s_pb::api::core::v1::Node>, String> {
        let mut g = self.grpc.clone();
        let r = g
            .node_group_template_node_info(self.req(proto::NodeGroupTemplateNodeInfoRequest {
                id: self.group.clone(),
            }))
            .await;
        let answer = match self.record("NodeGroupTemplateNodeInfo", r) {
            Ok(a) => a,
            Err(s) if s.code() == Code::Unimplemented => return Ok(None),
            Err(s) => return Err(format!("NodeGroupTemplateNodeInfo: {s}")),
        };
        let bytes = match self.profile.template {
            TemplateRead::Field1 => &answer.node_info,
            TemplateRead::PreferBytes if !answer.node_bytes.is_empty() => &answer.node_bytes,
            TemplateRead::PreferBytes => &answer.node_info,
            TemplateRead::BytesOnly => &answer.node_bytes,
        };
        if bytes.is_empty() {
            return Ok(None);
        }
        k8s_pb::api::core::v1::Node::decode(bytes.as_ref())
            .map(Some)
            .map_err(|e| {
                format!(
                    "CA {} reads the template ({:?}) and cannot decode it: {e}",
                    self.profile.name, self.profile.template
                )
            })
    }

    /// NodeGroupGetOptions as this version sends it (CA's flag defaults in its Duration
    /// fields) and reads it: `Ok(None)` for Unimplemented (CA keeps its defaults).
    pub async fn options(&self) -> Result<Option<ReadOptions>, tonic::Status> {
        let (threshold, unneeded, unready, provision) = ca_defaults();
        let mut defaults = proto::NodeGroupAutoscalingOptions {
            scale_down_utilization_threshold: threshold,
            scale_down_gpu_utilization_threshold: threshold,
            ..Default::default()
        };
        if matches!(self.profile.durations, Durations::Meta | Durations::Both) {
            defaults.scale_down_unneeded_time = meta(unneeded);
            defaults.scale_down_unready_time = meta(unready);
            defaults.max_node_provision_time = meta(provision);
        }
        if matches!(self.profile.durations, Durations::Google | Durations::Both) {
            defaults.scale_down_unneeded_duration = google(unneeded);
            defaults.scale_down_unready_duration = google(unready);
            defaults.max_node_provision_duration = google(provision);
        }
        if self.profile.version.0 >= 33 {
            defaults.ignore_daemon_sets_utilization = false;
            defaults.zero_or_max_node_scaling = false;
        }
        let mut g = self.grpc.clone();
        let r = g
            .node_group_get_options(self.req(proto::NodeGroupAutoscalingOptionsRequest {
                id: self.group.clone(),
                defaults: Some(defaults),
            }))
            .await;
        let answer = match self.record("NodeGroupGetOptions", r) {
            Ok(a) => a,
            Err(s) if s.code() == Code::Unimplemented => return Ok(None),
            Err(s) => return Err(s),
        };
        let Some(o) = answer.node_group_autoscaling_options else {
            return Ok(None);
        };
        let pick = |g: &Option<prost_types::Duration>, m: &Option<proto::MetaDuration>| match (
            self.profile.durations,
            g,
        ) {
            (Durations::Meta, _) => from_meta(m),
            (Durations::Both, Some(g)) => from_google(g),
            (Durations::Both, None) => from_meta(m),
            (Durations::Google, Some(g)) => from_google(g),
            (Durations::Google, None) => Duration::ZERO,
        };
        Ok(Some(ReadOptions {
            scale_down_utilization_threshold: o.scale_down_utilization_threshold,
            scale_down_unneeded: pick(&o.scale_down_unneeded_duration, &o.scale_down_unneeded_time),
            scale_down_unready: pick(&o.scale_down_unready_duration, &o.scale_down_unready_time),
            max_node_provision: pick(&o.max_node_provision_duration, &o.max_node_provision_time),
        }))
    }

    // ---- the cluster around the calls ----

    /// The node as CA sends it in DeleteNodes and NodeGroupForNode (name, providerID,
    /// labels, annotations), read from the API server.
    pub async fn grpc_node(&self, name: &str) -> Result<proto::ExternalGrpcNode, String> {
        let n = self
            .nodes_api()
            .get(name)
            .await
            .map_err(|e| format!("get node {name} as CA: {e}"))?;
        Ok(to_grpc_node(&n))
    }

    /// CA's start, before its first loop: (>= 1.35) the DRA lists and watches, then the
    /// clean-up of its marks on every node of the group; then a first loop's calls and
    /// the template.
    pub async fn start(&self) -> Result<(), String> {
        if self.profile.dra_watches {
            self.dra_watches().await?;
        }
        self.clean_all_to_be_deleted().await?;
        self.one_loop().await;
        let groups = self
            .node_groups()
            .await
            .map_err(|e| format!("NodeGroups: {e}"))?;
        if !groups.iter().any(|g| g.id == self.group) {
            return Err(format!(
                "NodeGroups does not list {}: {groups:?}",
                self.group
            ));
        }
        match self.template().await? {
            Some(t) => {
                let labels = t.metadata.as_ref().map(|m| m.labels.clone());
                if !labels
                    .as_ref()
                    .is_some_and(|l| l.contains_key("node.kubernetes.io/instance-type"))
                {
                    return Err(format!(
                        "the template CA {} reads has no instance-type label: {labels:?}",
                        self.profile.name
                    ));
                }
            }
            None => {
                return Err(format!(
                    "CA {} reads no template for {} ({:?})",
                    self.profile.name, self.group, self.profile.template
                ))
            }
        }
        Ok(())
    }

    /// resource.k8s.io/v1 deviceclasses, resourceclaims, resourceslices: list, then a
    /// watch from the list's version, as CA's informers do, as CA's ServiceAccount.
    async fn dra_watches(&self) -> Result<(), String> {
        use kube::api::{ApiResource, DynamicObject, WatchParams};
        for (kind, plural) in [
            ("DeviceClass", "deviceclasses"),
            ("ResourceClaim", "resourceclaims"),
            ("ResourceSlice", "resourceslices"),
        ] {
            let ar = ApiResource {
                group: "resource.k8s.io".into(),
                version: "v1".into(),
                api_version: "resource.k8s.io/v1".into(),
                kind: kind.into(),
                plural: plural.into(),
            };
            let api: Api<DynamicObject> = Api::all_with(self.kube.clone(), &ar);
            let list = api.list(&ListParams::default()).await.map_err(|e| {
                format!(
                    "CA {} lists resource.k8s.io/v1 {plural} at start as its ServiceAccount: {e}",
                    self.profile.name
                )
            })?;
            let rv = list.metadata.resource_version.unwrap_or_default();
            let watch = api
                .watch(&WatchParams::default().timeout(1), &rv)
                .await
                .map_err(|e| {
                    format!(
                        "CA {} watches resource.k8s.io/v1 {plural} at start as its ServiceAccount: {e}",
                        self.profile.name
                    )
                })?;
            use futures::StreamExt as _;
            let mut watch = watch.boxed();
            if let Some(Err(e)) = watch.next().await {
                return Err(format!(
                    "CA {} watches resource.k8s.io/v1 {plural}: {e}",
                    self.profile.name
                ));
            }
        }
        Ok(())
    }

    /// `CleanAllToBeDeleted`: every node of the group carrying CA's taint loses it (and
    /// its cordon, when this version cordons).
    pub async fn clean_all_to_be_deleted(&self) -> Result<Vec<String>, String> {
        let nodes = self
            .nodes_api()
            .list(&ListParams::default())
            .await
            .map_err(|e| format!("CA lists nodes at start: {e}"))?;
        let mut cleaned = Vec::new();
        for n in nodes.items {
            let name = n.metadata.name.clone().unwrap_or_default();
            if !has_taint(&n, CA_TAINT) {
                continue;
            }
            if self.group_for(to_grpc_node(&n)).await.unwrap_or_default() != self.group {
                continue;
            }
            self.clean_to_be_deleted(&name).await?;
            cleaned.push(name);
        }
        Ok(cleaned)
    }

    /// `MarkToBeDeleted`: CA's taint (value: unix seconds), and from 1.34 the cordon, in
    /// one Update (retried on conflict, as CA does).
    pub async fn mark_to_be_deleted(&self, name: &str) -> Result<(), String> {
        let cordon = self.profile.cordons;
        self.update_node(name, |n| {
            if has_taint(n, CA_TAINT) {
                return false;
            }
            let spec = n.spec.get_or_insert_with(Default::default);
            spec.taints.get_or_insert_with(Vec::new).push(Taint {
                key: CA_TAINT.into(),
                value: Some(chrono::Utc::now().timestamp().to_string()),
                effect: "NoSchedule".into(),
                time_added: None,
            });
            if cordon {
                spec.unschedulable = Some(true);
            }
            true
        })
        .await
    }

    /// `CleanToBeDeleted`: the taint removed, and from 1.34 `spec.unschedulable=false`,
    /// in one Update; nothing when the taint is not there.
    pub async fn clean_to_be_deleted(&self, name: &str) -> Result<(), String> {
        let cordon = self.profile.cordons;
        self.update_node(name, |n| {
            if !has_taint(n, CA_TAINT) {
                return false;
            }
            let spec = n.spec.get_or_insert_with(Default::default);
            if let Some(t) = spec.taints.as_mut() {
                t.retain(|t| t.key != CA_TAINT);
            }
            if cordon {
                spec.unschedulable = Some(false);
            }
            true
        })
        .await
    }

    async fn update_node(
        &self,
        name: &str,
        mut change: impl FnMut(&mut Node) -> bool,
    ) -> Result<(), String> {
        let api = self.nodes_api();
        for _ in 0..50 {
            let mut n = match api.get_opt(name).await {
                Ok(Some(n)) => n,
                Ok(None) => return Ok(()),
                Err(e) => return Err(format!("get node {name} as CA: {e}")),
            };
            if !change(&mut n) {
                return Ok(());
            }
            match api.replace(name, &PostParams::default(), &n).await {
                Ok(_) => return Ok(()),
                Err(kube::Error::Api(e)) if e.code == 409 => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(kube::Error::Api(e)) if e.code == 404 => return Ok(()),
                Err(e) => return Err(format!("update node {name} as CA: {e}")),
            }
        }
        Err(format!("update node {name} as CA: conflicts for 5 s"))
    }

    // ---- CA's loop ----

    /// One loop's reads: Refresh, NodeGroups, NodeGroupForNode of every node,
    /// NodeGroupTargetSize, NodeGroupNodes. Errors are recorded, not returned.
    pub async fn one_loop(&self) {
        let _ = self.refresh().await;
        let _ = self.node_groups().await;
        if let Ok(nodes) = self.nodes_api().list(&ListParams::default()).await {
            for n in nodes.items {
                let _ = self.group_for(to_grpc_node(&n)).await;
            }
        }
        let _ = self.target_size().await;
        let _ = self.instances().await;
    }

    /// CA's loop goes on (every 300 ms here) until [`SuiteCa::stop_loop`].
    pub fn keep_looping(&self) {
        let me = self.clone();
        let h = tokio::spawn(async move {
            loop {
                me.one_loop().await;
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        });
        if let Some(old) = self.background.lock().replace(h) {
            old.abort();
        }
    }

    pub fn stop_loop(&self) {
        if let Some(h) = self.background.lock().take() {
            h.abort();
        }
    }

    /// A scale-down of `nodes` (names), as this version's actuator carries it out.
    pub async fn scale_down(&self, nodes: &[String]) -> BTreeMap<String, Deletion> {
        let mut out = BTreeMap::new();
        if let Err(not_marked) = self.mark_all(nodes).await {
            return not_marked;
        }
        let sem = Arc::new(tokio::sync::Semaphore::new(
            self.profile.max_scale_down_parallelism,
        ));
        let mut tasks = Vec::new();
        for name in nodes {
            let me = self.clone();
            let name = name.clone();
            let sem = sem.clone();
            tasks.push(tokio::spawn(async move {
                let _slot = sem.acquire().await.expect("the semaphore");
                let result = me.delete_one(&name).await;
                if result != Deletion::Deleted {
                    let _ = me.clean_to_be_deleted(&name).await;
                }
                (name, result)
            }));
        }
        for t in tasks {
            let (name, result) = t.await.expect("a deletion task");
            out.insert(name, result);
        }
        out
    }

    /// taintNodesSync: every node marked before any deletion starts; one that cannot
    /// be marked aborts the scale-down and the marks already set are cleaned.
    async fn mark_all(&self, nodes: &[String]) -> Result<(), BTreeMap<String, Deletion>> {
        for (i, name) in nodes.iter().enumerate() {
            if let Err(e) = self.mark_to_be_deleted(name).await {
                for done in &nodes[..i] {
                    let _ = self.clean_to_be_deleted(done).await;
                }
                return Err(nodes
                    .iter()
                    .map(|n| (n.clone(), Deletion::NotMarked(e.clone())))
                    .collect());
            }
        }
        Ok(())
    }

    /// A scale-down with `--node-deletion-batcher-interval` set
    /// (`core/scaledown/actuation/delete_in_batch.go`, AddNodes with a non-zero
    /// interval): the marks as in [`Self::scale_down`], NodeGroupGetOptions per node
    /// in its own task, then the nodes that passed it, gathered for `interval`, go in
    /// one NodeGroupDeleteNodes; a failed call fails every node of the batch and
    /// cleans their marks.
    pub async fn scale_down_batched(
        &self,
        nodes: &[String],
        interval: Duration,
    ) -> BTreeMap<String, Deletion> {
        if let Err(not_marked) = self.mark_all(nodes).await {
            return not_marked;
        }
        let checked = futures::future::join_all(nodes.iter().map(|name| async move {
            let checked = match self.options().await {
                Ok(_) => self.grpc_node(name).await.map_err(Deletion::Failed),
                Err(s) => Err(Deletion::SkippedOnOptions(format!(
                    "{:?}: {}",
                    s.code(),
                    s.message()
                ))),
            };
            (name.clone(), checked)
        }))
        .await;
        tokio::time::sleep(interval).await;
        let mut out = BTreeMap::new();
        let mut batch = Vec::new();
        for (name, checked) in checked {
            match checked {
                Ok(node) => batch.push((name, node)),
                Err(d) => {
                    let _ = self.clean_to_be_deleted(&name).await;
                    out.insert(name, d);
                }
            }
        }
        if batch.is_empty() {
            return out;
        }
        let grpc_nodes = batch.iter().map(|(_, n)| n.clone()).collect();
        let result = match self.delete_nodes(grpc_nodes).await {
            Ok(()) => Deletion::Deleted,
            Err(s) => Deletion::Failed(format!("{:?}: {}", s.code(), s.message())),
        };
        for (name, _) in batch {
            if result != Deletion::Deleted {
                let _ = self.clean_to_be_deleted(&name).await;
            }
            out.insert(name, result.clone());
        }
        out
    }

    async fn delete_one(&self, name: &str) -> Deletion {
        if let Err(s) = self.options().await {
            return Deletion::SkippedOnOptions(format!("{:?}: {}", s.code(), s.message()));
        }
        let node = match self.grpc_node(name).await {
            Ok(n) => n,
            Err(e) => return Deletion::Failed(e),
        };
        match self.delete_nodes(vec![node]).await {
            Ok(()) => Deletion::Deleted,
            Err(s) => Deletion::Failed(format!("{:?}: {}", s.code(), s.message())),
        }
    }

    /// Pods CA would scale up for: unscheduled, the scheduler said Unschedulable.
    pub async fn unschedulable_pods(&self) -> Result<Vec<String>, String> {
        let pods: Api<Pod> = Api::all(self.kube.clone());
        let list = pods
            .list(&ListParams::default().fields("spec.nodeName="))
            .await
            .map_err(|e| format!("CA lists unscheduled pods: {e}"))?;
        Ok(list
            .items
            .into_iter()
            .filter(|p| {
                super::rig::live_with(p, |c| {
                    c.type_ == "PodScheduled"
                        && c.status == "False"
                        && c.reason.as_deref() == Some("Unschedulable")
                })
            })
            .map(|p| {
                format!(
                    "{}/{}",
                    p.metadata.namespace.unwrap_or_default(),
                    p.metadata.name.unwrap_or_default()
                )
            })
            .collect())
    }

    /// One node per unschedulable pod (the scenario's pods spread one per node), from a
    /// template this version can read, within the group's max: NodeGroupIncreaseSize.
    pub async fn scale_up_for(&self, pending: usize) -> Result<i32, String> {
        self.template()
            .await?
            .ok_or_else(|| format!("CA {} reads no template", self.profile.name))?;
        let groups = self
            .node_groups()
            .await
            .map_err(|e| format!("NodeGroups: {e}"))?;
        let max = groups
            .iter()
            .find(|g| g.id == self.group)
            .map(|g| g.max_size)
            .ok_or("the group is not listed")?;
        let target = self
            .target_size()
            .await
            .map_err(|e| format!("NodeGroupTargetSize: {e}"))?;
        let delta = (pending as i32).min(max - target);
        if delta > 0 {
            self.increase_size(delta)
                .await
                .map_err(|e| format!("NodeGroupIncreaseSize({delta}): {e}"))?;
        }
        Ok(delta)
    }

    /// One RunOnce's clean-up of a group's instances that never registered
    /// (`registered`: the instance ids with a Node), as every version 1.31 to master does
    /// it: errored instances deleted (deleteCreatedNodesWithErrors); instances without an
    /// error unregistered for a whole loop deleted only above the group's min
    /// (removeOldUnregisteredNodes); a lasting incorrect size fixed with
    /// DecreaseTargetSize (fixNodeGroupSize), whose error ends the loop (`Err`). Returns
    /// the ids CA asked to delete, and what it would log.
    ///
    /// The instance list comes from CA's cache of it (`seen`, see [`CleanUpMemory`]),
    /// as in clusterstate's CloudProviderNodeInstancesCache; each unregistered
    /// instance's fake node is mapped with NodeGroupForNode every loop, and one the
    /// service maps to no group (or another) fails the loop, as the check before did
    /// for long-unregistered ones.
    pub async fn clean_up_loop(
        &self,
        seen: &mut CleanUpMemory,
        registered: &BTreeSet<String>,
    ) -> Result<(Vec<String>, Vec<String>), String> {
        let mut logged = Vec::new();
        let mut asked = Vec::new();
        let _ = self.refresh().await;
        let listed = match &seen.cached {
            Some(l) => l.clone(),
            None => {
                let l = self
                    .instances()
                    .await
                    .map_err(|e| format!("NodeGroupNodes: {e}"))?;
                seen.cached = Some(l.clone());
                l
            }
        };
        let target = self
            .target_size()
            .await
            .map_err(|e| format!("NodeGroupTargetSize: {e}"))?;
        let iid = |i: &proto::Instance| i.id.rsplit('/').next().unwrap_or_default().to_string();
        let state = |i: &proto::Instance| i.status.as_ref().map_or(0, |s| s.instance_state);
        let fake = |i: &proto::Instance| proto::ExternalGrpcNode {
            provider_id: i.id.clone(),
            name: i.id.clone(),
            ..Default::default()
        };
        let errored: Vec<&proto::Instance> = listed
            .iter()
            .filter(|i| !registered.contains(&iid(i)))
            .filter(|i| state(i) == 2 && i.status.as_ref().unwrap().error_info.is_some())
            .collect();
        let mut unregistered: Vec<&proto::Instance> = Vec::new();
        for i in listed
            .iter()
            .filter(|i| !registered.contains(&iid(i)))
            .filter(|i| state(i) != 3 && i.status.as_ref().is_none_or(|s| s.error_info.is_none()))
        {
            let g = self
                .group_for(fake(i))
                .await
                .map_err(|e| format!("NodeGroupForNode({}): {e}", i.id))?;
            // CA would leave it out of the group ("Nodegroup is nil for ..."), count
            // the group short and, at its min, end its loop: the service must map it.
            if g != self.group {
                return Err(format!(
                    "NodeGroupForNode({}) answers {g:?}, not {}",
                    i.id, self.group
                ));
            }
            unregistered.push(i);
        }
        let reg_here = listed
            .iter()
            .filter(|i| registered.contains(&iid(i)))
            .count() as i32;
        let incorrect =
            (reg_here < target - unregistered.len() as i32).then_some((reg_here, target));
        let lasting = incorrect.filter(|now| seen.incorrect.as_ref() == Some(now));
        let long: Vec<&proto::Instance> = unregistered
            .iter()
            .copied()
            .filter(|i| seen.unregistered.contains(&i.id))
            .collect();
        seen.unregistered = unregistered.iter().map(|i| i.id.clone()).collect();
        seen.incorrect = incorrect;
        let fake = |i: &proto::Instance| proto::ExternalGrpcNode {
            provider_id: i.id.clone(),
            name: i.id.clone(),
            ..Default::default()
        };
        if !long.is_empty() {
            let min = self
                .node_groups()
                .await
                .map_err(|e| format!("NodeGroups: {e}"))?
                .into_iter()
                .find(|g| g.id == self.group)
                .map(|g| g.min_size)
                .unwrap_or(0);
            let size = self
                .target_size()
                .await
                .map_err(|e| format!("NodeGroupTargetSize: {e}"))?;
            if size - min <= 0 {
                logged.push(format!(
                    "Node group {} min size reached, skipping removal of {} unregistered nodes",
                    self.group,
                    long.len()
                ));
            } else {
                let take: Vec<&proto::Instance> =
                    long.iter().copied().take((size - min) as usize).collect();
                asked.extend(take.iter().map(|i| i.id.clone()));
                match self
                    .delete_nodes(take.iter().map(|i| fake(i)).collect())
                    .await
                {
                    Ok(()) => logged.push("Removing unregistered nodes".into()),
                    Err(e) => logged.push(format!("Failed to remove unregistered nodes: {e}")),
                }
            }
        }
        if !errored.is_empty() {
            asked.extend(errored.iter().map(|i| i.id.clone()));
            match self
                .delete_nodes(errored.iter().map(|i| fake(i)).collect())
                .await
            {
                Ok(()) => logged.push("Deleting nodes because of create errors".into()),
                Err(e) => logged.push(format!("Error while trying to delete nodes: {e}")),
            }
        }
        if let Some((current, expected)) = lasting {
            let delta = current - expected;
            if delta < 0 {
                self.decrease_target_size(delta)
                    .await
                    .map_err(|e| format!("Failed to fix node group sizes: {e}"))?;
                logged.push(format!("Decreasing size of {} delta={delta}", self.group));
            }
        }
        Ok((asked, logged))
    }
}

/// What CA remembers between loops for [`SuiteCa::clean_up_loop`].
#[derive(Default)]
pub struct CleanUpMemory {
    unregistered: BTreeSet<String>,
    incorrect: Option<(i32, i32)>,
    /// CA's cached instance list of the group: read on the first loop, then kept until
    /// its background refresh (every 2 minutes, 1.31 to master:
    /// clusterstate/utils/node_instances_cache.go) or until CA drops the entry (a
    /// scale-up of the group, a deletion).
    cached: Option<Vec<proto::Instance>>,
}

impl CleanUpMemory {
    /// CA's cache of the group's instances is read again at the next loop: two minutes
    /// passed, or CA scaled the group up or deleted from it.
    pub fn instances_read_again(&mut self) {
        self.cached = None;
    }
}

pub fn has_taint(n: &Node, key: &str) -> bool {
    n.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| t.iter().any(|t| t.key == key))
}

pub fn to_grpc_node(n: &Node) -> proto::ExternalGrpcNode {
    proto::ExternalGrpcNode {
        provider_id: n
            .spec
            .as_ref()
            .and_then(|s| s.provider_id.clone())
            .unwrap_or_default(),
        name: n.metadata.name.clone().unwrap_or_default(),
        labels: n
            .metadata
            .labels
            .clone()
            .unwrap_or_default()
            .into_iter()
            .collect(),
        annotations: n
            .metadata
            .annotations
            .clone()
            .unwrap_or_default()
            .into_iter()
            .collect(),
    }
}

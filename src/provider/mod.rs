//! The provider core: node-group registry, providerID index, target sizes, template
//! nodes and autoscaling options. It talks to AWS only through the [`Cloud`] trait and
//! knows nothing of tonic or Kubernetes clients.
//!
//! Hot RPCs (NodeGroupForNode, TargetSize, NodeGroupNodes, GetOptions, and templates
//! once built) answer from an immutable [`Registry`] snapshot plus a small overlay of
//! changes this service made since the snapshot. Only Refresh, the size changes and
//! the first template of a group reach AWS.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use parking_lot::{Mutex, RwLock};

use crate::cloud::{AsgInstance, Cloud, CloudError, GroupSelector, LaunchFailure};

pub mod instances;
pub mod options;
pub mod provider_id;
pub mod refresh;
pub mod registry;
pub mod sizes;
pub mod template;
pub mod templates;

pub use instances::{InstanceState, InstanceView};
pub use registry::{Bounds, Group, Registry};
use template::TemplateOverrides;

/// Errors the core returns; the gRPC layer maps each to a status code.
#[derive(Debug, thiserror::Error)]
pub enum ProviderError {
    #[error("node group {0:?} is not managed by this provider")]
    UnknownGroup(String),
    #[error("{0}")]
    InvalidArgument(String),
    #[error("{0}")]
    FailedPrecondition(String),
    #[error("{0}")]
    Unavailable(String),
    #[error("{0}")]
    Unimplemented(String),
    #[error(transparent)]
    Cloud(#[from] CloudError),
}

/// What the core needs to know from configuration.
#[derive(Debug, Clone)]
pub struct ProviderSettings {
    pub selector: GroupSelector,
    pub static_bounds: HashMap<String, Bounds>,
    pub refresh_interval: Duration,
    /// How long the Refresh RPC waits for AWS before answering from the last state
    /// (CA gives each call 5 s).
    pub refresh_wait: Duration,
    pub region: String,
    /// `*` applies to every group, a group name to that group (merged over `*`).
    pub templates: HashMap<String, TemplateOverrides>,
    /// Launch failures older than this do not mark placeholders.
    pub launch_failure_window: Duration,
    /// How often lifecycle hooks are re-read per group.
    pub hook_refresh_interval: Duration,
    /// Smallest gap between two background instance lookups.
    pub lookup_interval: Duration,
}

impl Default for ProviderSettings {
    fn default() -> Self {
        Self {
            selector: GroupSelector::default(),
            static_bounds: HashMap::new(),
            refresh_interval: Duration::from_secs(60),
            refresh_wait: Duration::from_secs(4),
            region: "us-east-1".into(),
            templates: HashMap::new(),
            launch_failure_window: Duration::from_secs(15 * 60),
            hook_refresh_interval: Duration::from_secs(30 * 60),
            lookup_interval: Duration::from_secs(1),
        }
    }
}

/// The NodeGroup message's content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupInfo {
    pub id: String,
    pub min: i32,
    pub max: i32,
    pub debug: String,
}

impl From<&Group> for GroupInfo {
    fn from(g: &Group) -> Self {
        Self {
            id: g.asg.name.clone(),
            min: g.min,
            max: g.max,
            debug: g.debug(),
        }
    }
}

/// A node as CA names it in DeleteNodes / NodeGroupForNode.
#[derive(Debug, Clone, Default)]
pub struct NodeRef {
    pub provider_id: String,
    pub name: String,
}

/// How a removal was accounted for in AWS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Removal {
    /// The ASG's desired capacity already went down by one.
    Decremented,
    /// The instance is being drained and will be terminated with decrement later;
    /// until then the target size is reported one lower and the instance as deleting.
    Deferred,
}

/// Ends instances for DeleteNodes. The default terminates at once; the scale-in
/// engine puts the drain behind this interface.
#[async_trait]
pub trait ScaleIn: Send + Sync + 'static {
    async fn remove(
        &self,
        group: &Group,
        instance: &AsgInstance,
        node_name: Option<&str>,
    ) -> Result<Removal, ProviderError>;
}

/// TerminateInstanceInAutoScalingGroup with decrement, no drain.
pub struct TerminateNow(pub Arc<dyn Cloud>);

#[async_trait]
impl ScaleIn for TerminateNow {
    async fn remove(
        &self,
        group: &Group,
        instance: &AsgInstance,
        _node_name: Option<&str>,
    ) -> Result<Removal, ProviderError> {
        tracing::info!(group = %group.asg.name, instance = %instance.id, "terminating instance with decrement");
        self.0.terminate_instance(&instance.id, true).await?;
        Ok(Removal::Decremented)
    }
}

/// Changes this service made that the current snapshot may not show yet.
#[derive(Debug, Default)]
struct Overlay {
    /// Target sizes written to AWS since the snapshot.
    target: HashMap<String, i32>,
    /// Instances this service ended (or is ending), until AWS shows them terminating.
    deleting: HashSet<String>,
    /// Unix time of the last size increase per group.
    last_increase: HashMap<String, i64>,
    /// Instances found by background lookup: instance id -> group.
    located: HashMap<String, String>,
    /// Direct-mode drains not yet terminated: instance id -> group. Each lowers its
    /// group's target by one and shows the instance as deleting.
    deferred: HashMap<String, String>,
}

/// Counters for metrics and tests.
#[derive(Debug, Default)]
pub struct ProviderStats {
    pub refreshes: AtomicU64,
    pub refresh_failures: AtomicU64,
    /// Refresh RPCs answered from the last good state after an AWS failure.
    pub stale_serves: AtomicU64,
    pub lookups: AtomicU64,
}

pub struct Provider {
    cloud: Arc<dyn Cloud>,
    settings: ProviderSettings,
    registry: RwLock<Arc<Registry>>,
    loaded: AtomicBool,
    overlay: Mutex<Overlay>,
    /// Serialises AWS writes and the application of refreshes.
    ops: tokio::sync::Mutex<()>,
    refresh: refresh::RefreshState,
    templates: templates::TemplateCache,
    lookups: Mutex<refresh::LookupQueue>,
    lookup_wake: Arc<tokio::sync::Notify>,
    scale_in: RwLock<Arc<dyn ScaleIn>>,
    /// Counts AWS writes, so a refresh can tell that one raced with its read.
    writes: AtomicU64,
    pub stats: ProviderStats,
}

impl Provider {
    pub fn new(cloud: Arc<dyn Cloud>, settings: ProviderSettings) -> Arc<Self> {
        let scale_in: Arc<dyn ScaleIn> = Arc::new(TerminateNow(cloud.clone()));
        Arc::new(Self {
            cloud,
            settings,
            registry: RwLock::new(Arc::new(Registry::default())),
            loaded: AtomicBool::new(false),
            overlay: Mutex::new(Overlay::default()),
            ops: tokio::sync::Mutex::new(()),
            refresh: refresh::RefreshState::default(),
            templates: templates::TemplateCache::default(),
            lookups: Mutex::new(refresh::LookupQueue::default()),
            lookup_wake: Arc::new(tokio::sync::Notify::new()),
            scale_in: RwLock::new(scale_in),
            writes: AtomicU64::new(0),
            stats: ProviderStats::default(),
        })
    }

    /// Puts a different scale-in behind DeleteNodes (the drain engine).
    pub fn set_scale_in(&self, scale_in: Arc<dyn ScaleIn>) {
        *self.scale_in.write() = scale_in;
    }

    pub fn cloud(&self) -> &Arc<dyn Cloud> {
        &self.cloud
    }

    pub fn settings(&self) -> &ProviderSettings {
        &self.settings
    }

    /// The current snapshot.
    pub fn registry(&self) -> Arc<Registry> {
        self.registry.read().clone()
    }

    pub fn is_loaded(&self) -> bool {
        self.loaded.load(Ordering::Acquire)
    }

    fn group(&self, id: &str) -> Result<(Arc<Registry>, usize), ProviderError> {
        let reg = self.registry();
        let idx = reg
            .groups
            .iter()
            .position(|g| g.asg.name == id)
            .ok_or_else(|| ProviderError::UnknownGroup(id.to_string()))?;
        Ok((reg, idx))
    }

    fn with_group<T>(&self, id: &str, f: impl FnOnce(&Group) -> T) -> Result<T, ProviderError> {
        let reg = self.registry();
        let g = reg
            .group(id)
            .ok_or_else(|| ProviderError::UnknownGroup(id.to_string()))?;
        Ok(f(g))
    }

    // ---- hot, answered from memory ----

    pub fn node_groups(&self) -> Vec<GroupInfo> {
        self.registry().groups.iter().map(GroupInfo::from).collect()
    }

    /// The group of a node, or `None` for nodes this provider does not manage (CA
    /// expects an empty group then, not an error). An AWS instance that the snapshot
    /// does not know yet is looked up in the background.
    pub fn group_for_node(&self, node: &NodeRef) -> Option<GroupInfo> {
        let pid = if node.provider_id.is_empty() {
            &node.name
        } else {
            &node.provider_id
        };
        let id = provider_id::instance_id(pid)?;
        // Clone the snapshot pointer so no registry lock is held while the overlay
        // lock is taken (lock order: registry, then overlay, never nested).
        let reg = self.registry();
        if let Some(g) = reg.group_of_instance(id) {
            return Some(GroupInfo::from(g));
        }
        if let Some(name) = self.overlay.lock().located.get(id) {
            return reg.group(name).map(GroupInfo::from);
        }
        if pid.starts_with("aws://") && !instances::is_placeholder(id) {
            self.enqueue_lookup(id);
        }
        None
    }

    pub fn target_size(&self, id: &str) -> Result<i32, ProviderError> {
        let ov = self.overlay.lock();
        self.with_group(id, |g| Self::target_of(&ov, g))
    }

    fn target_of(ov: &Overlay, g: &Group) -> i32 {
        let base = ov
            .target
            .get(&g.asg.name)
            .copied()
            .unwrap_or(g.asg.desired_capacity);
        let deferred = ov
            .deferred
            .values()
            .filter(|grp| **grp == g.asg.name)
            .count() as i32;
        base - deferred
    }

    fn is_deleting(ov: &Overlay, instance_id: &str) -> bool {
        ov.deleting.contains(instance_id) || ov.deferred.contains_key(instance_id)
    }

    /// A direct-mode drain (found again after a restart) counts against the target.
    pub fn register_deferred(&self, instance_id: &str, group: &str) {
        self.overlay
            .lock()
            .deferred
            .insert(instance_id.to_string(), group.to_string());
    }

    /// A direct-mode drain terminated its instance with decrement: AWS's desired
    /// capacity now carries the decrement, so the deferred entry becomes a plain one.
    pub fn deferred_terminated(&self, instance_id: &str) {
        let reg = self.registry();
        let mut ov = self.overlay.lock();
        let Some(group) = ov.deferred.get(instance_id).cloned() else {
            return;
        };
        if let Some(g) = reg.group(&group) {
            let t = Self::target_of(&ov, g);
            ov.deferred.remove(instance_id);
            ov.target.insert(group, t);
        } else {
            ov.deferred.remove(instance_id);
        }
        ov.deleting.insert(instance_id.to_string());
        drop(ov);
        self.writes.fetch_add(1, Ordering::AcqRel);
        self.invalidate();
    }

    /// A direct-mode drain was abandoned: the node stays, the target goes back up.
    pub fn deferred_cancelled(&self, instance_id: &str) {
        self.overlay.lock().deferred.remove(instance_id);
    }

    pub fn nodes(&self, id: &str) -> Result<Vec<InstanceView>, ProviderError> {
        let ov = self.overlay.lock();
        self.with_group(id, |g| {
            let target = Self::target_of(&ov, g);
            let failure = self.recent_failure(&ov, g);
            instances::list(
                &g.asg.name,
                g.placeholder_zone(),
                &g.asg.instances,
                target,
                &|iid| Self::is_deleting(&ov, iid),
                failure,
            )
        })
    }

    /// The newest launch failure that is recent and not older than our last increase.
    fn recent_failure<'a>(&self, ov: &Overlay, g: &'a Group) -> Option<&'a LaunchFailure> {
        let now = unix_now();
        let window = self.settings.launch_failure_window.as_secs() as i64;
        let since_increase = ov
            .last_increase
            .get(&g.asg.name)
            .copied()
            .unwrap_or(i64::MIN);
        g.failures.iter().find(|f| {
            now - f.started_at_unix <= window
                && f.started_at_unix >= since_increase.saturating_sub(5)
        })
    }

    pub fn options(
        &self,
        id: &str,
        defaults: &options::AutoscalingOptions,
    ) -> Result<options::AutoscalingOptions, ProviderError> {
        self.with_group(id, |g| {
            let (opts, warnings) = options::overlay_from_tags(defaults, &g.asg.tags);
            for w in warnings {
                tracing::debug!(group = %g.asg.name, "{w}");
            }
            opts
        })
    }

    pub const GPU_LABEL: &'static str = "k8s.amazonaws.com/accelerator";

    /// GPU models of the instance types of managed groups, as far as known.
    pub fn gpu_types(&self) -> Vec<String> {
        self.templates.gpu_types()
    }

    // ---- writes ----

    pub async fn increase_size(&self, id: &str, delta: i32) -> Result<(), ProviderError> {
        let _ops = self.ops.lock().await;
        let (reg, idx) = self.group(id)?;
        let g = &reg.groups[idx];
        let target = Self::target_of(&self.overlay.lock(), g);
        let new = sizes::check_increase(id, target, g.max, delta)?;
        tracing::info!(
            group = id,
            from = target,
            to = new,
            "increasing desired capacity"
        );
        self.writes.fetch_add(1, Ordering::AcqRel);
        self.cloud.set_desired_capacity(id, new).await?;
        let mut ov = self.overlay.lock();
        ov.target.insert(id.to_string(), new);
        ov.last_increase.insert(id.to_string(), unix_now());
        drop(ov);
        // The next Refresh reads AWS, so the new instances show up by CA's next loop.
        self.invalidate();
        Ok(())
    }

    pub async fn decrease_target_size(&self, id: &str, delta: i32) -> Result<(), ProviderError> {
        let _ops = self.ops.lock().await;
        let (reg, idx) = self.group(id)?;
        let g = &reg.groups[idx];
        let (target, live) = {
            let ov = self.overlay.lock();
            let live = g
                .asg
                .instances
                .iter()
                .filter(|i| !i.state.is_terminating() && !Self::is_deleting(&ov, &i.id))
                .count() as i32;
            (Self::target_of(&ov, g), live)
        };
        let new = sizes::check_decrease(id, target, live, delta)?;
        tracing::info!(
            group = id,
            from = target,
            to = new,
            "decreasing desired capacity (unfulfilled only)"
        );
        self.writes.fetch_add(1, Ordering::AcqRel);
        self.cloud.set_desired_capacity(id, new).await?;
        self.overlay.lock().target.insert(id.to_string(), new);
        self.invalidate();
        Ok(())
    }

    /// Removes nodes from a group. Validates everything before touching anything:
    /// every node must belong to the group, and the group must stay at or above its
    /// minimum. Instances already on their way out are skipped (CA re-sends).
    pub async fn delete_nodes(&self, id: &str, nodes: &[NodeRef]) -> Result<(), ProviderError> {
        let _ops = self.ops.lock().await;
        let (reg, idx) = self.group(id)?;
        let g = &reg.groups[idx];
        let placeholder_prefix = format!("{}{}-", instances::PLACEHOLDER_PREFIX, g.asg.name);
        let mut real: Vec<(&AsgInstance, &str)> = Vec::new();
        let mut placeholders = 0i32;
        let mut seen = HashSet::new();
        {
            let ov = self.overlay.lock();
            for n in nodes {
                let pid = if n.provider_id.is_empty() {
                    &n.name
                } else {
                    &n.provider_id
                };
                let iid = provider_id::instance_id(pid).ok_or_else(|| {
                    ProviderError::InvalidArgument(format!(
                        "node {:?}: providerID {:?} is not an AWS instance",
                        n.name, n.provider_id
                    ))
                })?;
                if !seen.insert(iid.to_string()) {
                    continue;
                }
                if iid.starts_with(&placeholder_prefix) {
                    placeholders += 1;
                    continue;
                }
                match g.asg.instances.iter().find(|i| i.id == iid) {
                    Some(inst) if inst.state.is_terminating() || Self::is_deleting(&ov, iid) => {
                        tracing::debug!(group = id, instance = iid, "already terminating; skipped");
                    }
                    Some(inst) => real.push((inst, n.name.as_str())),
                    None => {
                        let owner = reg
                            .group_of_instance(iid)
                            .map(|o| o.asg.name.clone())
                            .or_else(|| ov.located.get(iid).cloned());
                        return Err(ProviderError::InvalidArgument(match owner {
                            Some(o) => format!(
                                "node {:?} (instance {iid}) belongs to node group {o}, not {id}",
                                n.name
                            ),
                            None => format!(
                                "node {:?} (instance {iid}) is not in node group {id}",
                                n.name
                            ),
                        }));
                    }
                }
            }
        }
        let (target, live) = {
            let ov = self.overlay.lock();
            let live = g
                .asg
                .instances
                .iter()
                .filter(|i| !i.state.is_terminating() && !Self::is_deleting(&ov, &i.id))
                .count() as i32;
            (Self::target_of(&ov, g), live)
        };
        // Placeholders beyond the unfulfilled capacity are already gone.
        let placeholders = placeholders.min((target - live).max(0));
        sizes::check_delete(id, target, g.min, placeholders + real.len() as i32)?;
        if placeholders > 0 {
            let new = target - placeholders;
            tracing::info!(
                group = id,
                from = target,
                to = new,
                "removing {placeholders} placeholder(s)"
            );
            self.writes.fetch_add(1, Ordering::AcqRel);
            self.cloud.set_desired_capacity(id, new).await?;
            self.overlay.lock().target.insert(id.to_string(), new);
        }
        let scale_in = self.scale_in.read().clone();
        for (inst, node_name) in real {
            self.writes.fetch_add(1, Ordering::AcqRel);
            let name = (!node_name.is_empty() && node_name != inst.id).then_some(node_name);
            match scale_in.remove(g, inst, name).await? {
                Removal::Decremented => {
                    let mut ov = self.overlay.lock();
                    let t = Self::target_of(&ov, g);
                    ov.target.insert(id.to_string(), t - 1);
                    ov.deleting.insert(inst.id.clone());
                }
                Removal::Deferred => {
                    self.register_deferred(&inst.id, id);
                }
            }
        }
        self.invalidate();
        Ok(())
    }

    /// CA's Cleanup: nothing a later call needs is stopped; background lookups and the
    /// last snapshot stay.
    pub fn cleanup(&self) {
        tracing::info!("cleanup requested by cluster-autoscaler");
    }
}

pub(crate) fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// Monotonic "now", in one place for the modules that keep timestamps.
pub(crate) fn now() -> Instant {
    Instant::now()
}

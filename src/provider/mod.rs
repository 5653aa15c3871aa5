//! The provider core: node-group registry, providerID index, target sizes, template
//! nodes and autoscaling options. It talks to AWS only through the [`Cloud`] trait and
//! knows nothing of tonic or Kubernetes clients.
//!
//! Hot RPCs (NodeGroupForNode, TargetSize, NodeGroupNodes, GetOptions, and templates
//! once built) answer from an immutable [`Registry`] snapshot plus a small overlay of
//! changes this service made since the snapshot. Only Refresh, the size changes and
//! the first template of a group reach AWS.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use crate::clock::Instant;

use async_trait::async_trait;
use parking_lot::{Mutex, RwLock};

use crate::cloud::{AsgInstance, Cloud, CloudError, GroupSelector, LaunchFailure, LifecycleHook};

pub mod bound;
mod delete;
pub mod instances;
pub mod known;
pub mod options;
pub mod provider_id;
pub mod refresh;
pub mod registry;
pub mod sizes;
mod status;
pub use status::looked_for;
pub mod template;
pub mod templates;
pub mod written;

pub use instances::{InstanceState, InstanceView};
pub use registry::{Bounds, Group, Registry};
use template::TemplateOverrides;

/// Errors the core returns; the gRPC layer maps each to a status code.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ProviderError {
    #[error("node group {} is not managed by this provider", echo(.0))]
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

/// What kind of failure a [`ProviderError`] is, for the layers above it (the gRPC
/// codes), so that they need not know the cloud's own error type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    UnknownGroup,
    InvalidArgument,
    FailedPrecondition,
    /// Worth retrying: AWS throttled or failed for a moment, the API server did not
    /// answer, a bound passed.
    Unavailable,
    Unimplemented,
    /// AWS says the thing asked about does not exist.
    NotFound,
}

impl ProviderError {
    pub fn kind(&self) -> ErrorKind {
        match self {
            ProviderError::UnknownGroup(_) => ErrorKind::UnknownGroup,
            ProviderError::InvalidArgument(_) => ErrorKind::InvalidArgument,
            ProviderError::FailedPrecondition(_) => ErrorKind::FailedPrecondition,
            ProviderError::Unavailable(_) => ErrorKind::Unavailable,
            ProviderError::Unimplemented(_) => ErrorKind::Unimplemented,
            ProviderError::Cloud(c) => match c {
                CloudError::Throttled { .. } | CloudError::Transient { .. } => {
                    ErrorKind::Unavailable
                }
                CloudError::NotFound { .. } => ErrorKind::NotFound,
                CloudError::Rejected { .. } | CloudError::Credentials { .. } => {
                    ErrorKind::FailedPrecondition
                }
            },
        }
    }
}

/// What the core needs to know from configuration.
#[derive(Debug, Clone)]
pub struct ProviderSettings {
    pub selector: GroupSelector,
    pub static_bounds: std::collections::HashMap<String, Bounds>,
    pub refresh_interval: Duration,
    /// How long the Refresh RPC waits for AWS before answering from the last state
    /// (CA gives each call 5 s).
    pub refresh_wait: Duration,
    pub region: String,
    /// `*` applies to every group, a group name to that group (merged over `*`).
    pub templates: std::collections::HashMap<String, TemplateOverrides>,
    /// Launch failures older than this do not mark placeholders.
    pub launch_failure_window: Duration,
    /// How often lifecycle hooks are re-read per group.
    pub hook_refresh_interval: Duration,
    /// Smallest gap between two background instance lookups.
    pub lookup_interval: Duration,
    /// `serve --dry-run`: every write is decided, described and refused; AWS and the
    /// cluster are left as they are.
    pub dry_run: bool,
    /// The longest DeleteNodes takes to check a request and record its removals
    /// (CA gives each call 5 s): past it the call fails, so CA never waits on it.
    pub delete_nodes_bound: Duration,
    /// NodeGroupGetOptions for option-tagged groups asked by a CA without
    /// MaxNodeStartupTime on the wire (>= 1.35).
    pub options_without_startup_time: options::OptionsWithoutStartupTime,
    /// The first wait before a group whose answer predates this service's own write
    /// is read again (doubling, three times at most; see [`written`]).
    pub stale_reread_wait: Duration,
}

impl Default for ProviderSettings {
    fn default() -> Self {
        Self {
            selector: GroupSelector::default(),
            static_bounds: std::collections::HashMap::new(),
            refresh_interval: Duration::from_secs(60),
            refresh_wait: Duration::from_secs(4),
            region: "us-east-1".into(),
            templates: std::collections::HashMap::new(),
            launch_failure_window: Duration::from_secs(15 * 60),
            hook_refresh_interval: Duration::from_secs(30 * 60),
            lookup_interval: Duration::from_secs(1),
            dry_run: false,
            delete_nodes_bound: Duration::from_secs(4),
            options_without_startup_time: options::OptionsWithoutStartupTime::default(),
            stale_reread_wait: Duration::from_millis(100),
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

/// A size change begun ([`Provider::begin_size_change`]): the size lock held, the
/// group as AWS answers it now (at `idx` of `reg`), and its sizes as this service
/// counts them: CA's target, the instances that fill a slot, the ones ending that
/// still count in AWS's desired capacity.
struct SizeChange {
    ops: tokio::sync::OwnedMutexGuard<()>,
    reg: Arc<Registry>,
    idx: usize,
    target: i32,
    live: i32,
    deferred: i32,
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
    /// What a batch of removals must know of the group that AWS may have changed
    /// since the registry read it, asked beside the batch's own read of the group:
    /// one request per batch, no extra round trip before the answers. The drain
    /// confirms its lifecycle hook here. `Ok(None)`: nothing to confirm, the
    /// registry's hooks stand.
    async fn confirm_hooks(
        &self,
        group: &Group,
    ) -> Result<Option<Vec<LifecycleHook>>, ProviderError> {
        let _ = group;
        Ok(None)
    }

    /// Ends (or starts to end) one instance. `group` carries the hooks
    /// [`Self::confirm_hooks`] returned for this batch.
    async fn remove(
        &self,
        group: &Group,
        instance: &AsgInstance,
        node_name: Option<&str>,
    ) -> Result<Removal, ProviderError>;

    /// CA raised the group's size (the write landed). A group with a warm pool fills
    /// the new capacity from its pool first: the drain hands back the Nodes of
    /// instances it sent there as soon as AWS shows them in the group.
    fn capacity_added(&self, group: &Group) {
        let _ = group;
    }

    /// What `remove` would do, for `serve --dry-run`: described (logged, evented),
    /// nothing changed.
    async fn preview(
        &self,
        group: &Group,
        instance: &AsgInstance,
        node_name: Option<&str>,
    ) -> String {
        let _ = node_name;
        format!(
            "would terminate instance {} of group {} with decrement (no drain)",
            instance.id, group.asg.name
        )
    }
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
    target: BTreeMap<String, i32>,
    /// This service's recent writes of desired capacity per group and what each
    /// replaced, kept past the snapshot: a read that shows a replaced capacity is
    /// older than the write and is read again ([`written`]).
    written: BTreeMap<String, written::Written>,
    /// Unix time of the last size increase per group.
    last_increase: BTreeMap<String, i64>,
    /// What is known of each instance beyond the snapshot, one record per instance:
    /// ended by us, a direct-mode drain pending, located by a lookup, left its group
    /// ([`known`]).
    known: known::Known,
    /// The direct-mode drain marks on Nodes, as last read from the cluster; `None`
    /// until read once (see [`Provider::expect_drain_marks`]).
    direct_marks: Option<DrainMarks>,
    /// Groups whose launch failure below the minimum was logged, with the failure's
    /// start: told once per failure, not every CA loop.
    told_below_min: BTreeMap<String, i64>,
}

/// What the Nodes say about direct-mode drains, by instance id.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DrainMarks {
    /// Instances whose Node carries a direct-mode drain mark.
    pub marked: BTreeSet<String>,
    /// Instances whose Node exists without one (a drain there was abandoned or
    /// never started). An instance with no Node at all is in neither set: its Node
    /// goes away after the instance ended, before a snapshot may show that.
    pub unmarked: BTreeSet<String>,
}

use known::{Deferred, UNCONFIRMED_TTL};

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
    /// When this provider started, and whether it said that size changes are open.
    started: Instant,
    told_open: AtomicBool,
    overlay: Mutex<Overlay>,
    /// Serialises AWS writes and the application of refreshes.
    ops: Arc<tokio::sync::Mutex<()>>,
    refresh: refresh::RefreshState,
    templates: templates::TemplateCache,
    lookups: Mutex<refresh::LookupQueue>,
    lookup_wake: Arc<tokio::sync::Notify>,
    scale_in: RwLock<Arc<dyn ScaleIn>>,
    /// Counts AWS writes, so a refresh can tell that one raced with its read.
    writes: AtomicU64,
    /// Per group, the count of [`Self::writes`] when a size change last read it again
    /// from AWS: a refresh whose read began before that keeps the newer group.
    reread_at: Mutex<BTreeMap<String, u64>>,
    /// Option-tagged groups already warned about a CA without MaxNodeStartupTime.
    told_startup_time: Mutex<BTreeSet<String>>,
    /// The unusable autoscaling-options tags last logged per group.
    told_option_tags: Mutex<BTreeMap<String, Vec<String>>>,
    /// DeleteNodes calls waiting, per group, for the batch that records them
    /// ([`delete`]): calls that arrive while another holds the size lock are recorded
    /// together, with one read of the group, instead of one after another.
    delete_batches: Mutex<BTreeMap<String, Vec<delete::DeleteCall>>>,
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
            started: Instant::now(),
            told_open: AtomicBool::new(false),
            overlay: Mutex::new(Overlay {
                direct_marks: Some(DrainMarks::default()),
                ..Overlay::default()
            }),
            ops: Arc::new(tokio::sync::Mutex::new(())),
            refresh: refresh::RefreshState::default(),
            templates: templates::TemplateCache::default(),
            lookups: Mutex::new(refresh::LookupQueue::default()),
            lookup_wake: Arc::new(tokio::sync::Notify::new()),
            scale_in: RwLock::new(scale_in),
            writes: AtomicU64::new(0),
            reread_at: Mutex::default(),
            told_startup_time: Mutex::new(BTreeSet::new()),
            told_option_tags: Mutex::new(BTreeMap::new()),
            delete_batches: Mutex::new(BTreeMap::new()),
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

    /// A group of the registry by id, re-read from AWS first (size changes).
    async fn fresh_group(&self, id: &str) -> Result<(Arc<Registry>, usize), ProviderError> {
        let reg = self.reread_group(id).await?;
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
        let reg = self.registry();
        let ov = self.overlay.lock();
        reg.groups
            .iter()
            .map(|g| {
                let mut info = GroupInfo::from(g);
                // A direct-mode drain holds its slot in AWS's desired capacity until
                // its instance ends: CA can use only MaxSize less those. Asked for
                // more, IncreaseSize would be refused and CA would back the group off
                // for minutes; told the usable max, CA never asks.
                let draining = Self::deferred_in(&ov, g);
                if draining > 0 {
                    let usable = (g.asg.max_size - draining).max(info.min);
                    if usable < info.max {
                        info.max = usable;
                        info.debug.push_str(&format!(
                            "; max {usable} while {draining} drain(s) hold their slots"
                        ));
                    }
                }
                if let Some((n, f)) = self.failed_below_min_in(&ov, g) {
                    // CA logs the debug string with its scale-up decisions: the
                    // failure CA is not told through error info is named here.
                    info.debug.push_str(&format!(
                        "; {n} instance(s) below MinSize {} failed to launch: {} ({})",
                        Self::floor_of(g),
                        f.code,
                        f.message
                    ));
                }
                info
            })
            .collect()
    }

    /// The size below which placeholders carry no error info: the larger of the
    /// ASG's MinSize and the MinSize CA is told (see [`instances::list`]).
    fn floor_of(g: &Group) -> i32 {
        g.min.max(g.asg.min_size)
    }

    /// Slots below the group's minimum whose launch recently failed, with the
    /// failure; `None` when there are none.
    fn failed_below_min_in<'a>(
        &self,
        ov: &Overlay,
        g: &'a Group,
    ) -> Option<(i32, &'a LaunchFailure)> {
        let f = self.recent_failure(ov, g)?;
        let n = instances::failed_below_floor(
            Self::live_count(ov, g),
            Self::target_of(ov, g),
            Self::floor_of(g),
            true,
        );
        (n > 0).then_some((n, f))
    }

    /// Instances below the group's minimum that failed to launch recently (0 if
    /// none): CA is not told through error info (it would stop its loop), so this
    /// is the metric `ca_asg_provider_node_group_failed_below_min`.
    pub fn failed_below_min(&self, id: &str) -> Result<i32, ProviderError> {
        let ov = self.overlay.lock();
        self.with_group(id, |g| {
            self.failed_below_min_in(&ov, g).map_or(0, |(n, _)| n)
        })
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
        {
            let ov = self.overlay.lock();
            if let Some(name) = ov.known.located(id) {
                return reg.group(name).map(GroupInfo::from);
            }
            // An instance that left its group (ended without a decrement) while CA's
            // cached instance list still names it: its former group, so CA counts it
            // as unregistered rather than the group as one node short.
            if let Some(name) = ov.known.group_left(id) {
                return reg.group(name).map(GroupInfo::from);
            }
        }
        // CA builds a fake node for every instance that never registered (placeholders
        // included, name = providerID); it must map to its group, or CA never counts
        // it as unregistered and never cleans it up.
        if let Some(g) = instances::placeholder_group(id).and_then(|name| reg.group(&name)) {
            return Some(GroupInfo::from(g));
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

    /// AWS's desired capacity as this service knows it: what it wrote since the
    /// snapshot, else the snapshot's.
    fn desired_of(ov: &Overlay, g: &Group) -> i32 {
        ov.target
            .get(&g.asg.name)
            .copied()
            .unwrap_or(g.asg.desired_capacity)
    }

    /// Direct-mode drains of the group not terminated yet: instances that AWS's
    /// desired capacity still counts but CA's target does not.
    fn deferred_in(ov: &Overlay, g: &Group) -> i32 {
        ov.known.deferred_in(&g.asg.name) as i32
    }

    /// CA's target: AWS's desired capacity less the drains that will end with a
    /// decrement. Every desired capacity written to AWS is CA's new target plus
    /// those drains, so the ASG never has fewer slots than instances it must keep
    /// and never picks a victim itself.
    fn target_of(ov: &Overlay, g: &Group) -> i32 {
        Self::desired_of(ov, g) - Self::deferred_in(ov, g)
    }

    fn is_deleting(ov: &Overlay, instance_id: &str) -> bool {
        ov.known.is_deleting(instance_id)
    }

    /// Instances that stay: not leaving in AWS and not being ended by us. Counted
    /// exactly as [`instances::list`] counts them, so the placeholders CA sees and
    /// the capacity DecreaseTargetSize may remove are the same number.
    fn live_count(ov: &Overlay, g: &Group) -> i32 {
        g.asg
            .instances
            .iter()
            .filter(|i| i.state.fills_a_slot() && !Self::is_deleting(ov, &i.id))
            .count() as i32
    }

    /// A drain engine is attached: size changes wait until the direct-mode drains
    /// recorded on Nodes have been read ([`Self::sync_direct_drains`]), since CA's
    /// target cannot be told from AWS's desired capacity without them.
    pub fn expect_drain_marks(&self) {
        self.overlay.lock().direct_marks = None;
    }

    /// Whether the pending direct-mode drains are known (always, without an engine).
    pub fn drain_state_known(&self) -> bool {
        self.is_loaded() && self.overlay.lock().direct_marks.is_some()
    }

    fn require_drain_state(&self) -> Result<(), ProviderError> {
        if self.drain_state_known() {
            return Ok(());
        }
        Err(ProviderError::Unavailable(
            "size changes wait until the node groups and the drains recorded on Nodes have been read once; retry shortly".into(),
        ))
    }

    /// The direct-mode drain marks on Nodes, as read from the cluster now. Every
    /// replica calls this on Node changes, so each one's accounting follows drains
    /// that another replica started, ended or abandoned.
    pub fn sync_direct_drains(&self, marks: DrainMarks) {
        let reg = self.registry();
        let mut ov = self.overlay.lock();
        ov.direct_marks = Some(marks);
        Self::apply_marks(&mut ov, &reg);
        drop(ov);
        self.note_open();
    }

    /// Says once, after a start, when size changes are first accepted: the window
    /// in which they answered Unavailable is the first refresh and the first Node list.
    pub(crate) fn note_open(&self) {
        if self.drain_state_known() && !self.told_open.swap(true, Ordering::AcqRel) {
            tracing::info!(
                after_ms = self.started.elapsed().as_millis() as u64,
                "node groups and drain marks read: size changes accepted"
            );
        }
    }

    /// Brings the deferred set in line with the marks and the snapshot: a marked
    /// instance still in service counts as a pending drain; an entry stops counting
    /// when its instance is terminating or gone in the snapshot, or when its Node is
    /// there without the mark (abandoned). A Node that disappeared is not enough:
    /// it goes when the instance ended, and the snapshot that shows the decrement
    /// may be a refresh away.
    fn apply_marks(ov: &mut Overlay, reg: &Registry) {
        let live = |id: &str| -> Option<String> {
            let g = reg.group_of_instance(id)?;
            let inst = g.asg.instances.iter().find(|i| i.id == id)?;
            (!inst.state.is_terminating()).then(|| g.asg.name.clone())
        };
        let Some(marks) = ov.direct_marks.take() else {
            ov.known.keep_deferred(|id, _| live(id).is_some());
            return;
        };
        for id in &marks.marked {
            if ov.known.is_ending(id) {
                continue;
            }
            if let Some(group) = live(id) {
                ov.known
                    .defer(id, || Deferred {
                        group,
                        confirmed: true,
                        since: now(),
                    })
                    .confirmed = true;
            }
        }
        ov.known.keep_deferred(|id, d| {
            live(id).is_some()
                && if d.confirmed {
                    !marks.unmarked.contains(id)
                } else {
                    d.since.elapsed() < UNCONFIRMED_TTL
                }
        });
        ov.direct_marks = Some(marks);
    }

    /// A direct-mode drain CA asked for (or found again after a restart) counts
    /// against CA's target from now on.
    pub fn register_deferred(&self, instance_id: &str, group: &str) {
        let mut ov = self.overlay.lock();
        let confirmed = ov
            .direct_marks
            .as_ref()
            .is_some_and(|m| m.marked.contains(instance_id));
        ov.known.defer(instance_id, || Deferred {
            group: group.to_string(),
            confirmed,
            since: now(),
        });
    }

    /// A direct-mode drain terminated its instance with decrement: AWS's desired
    /// capacity went down by one and the instance no longer counts as deferred, so
    /// CA's target stays where it was.
    pub fn deferred_terminated(&self, instance_id: &str) {
        let reg = self.registry();
        let mut ov = self.overlay.lock();
        let Some(d) = ov.known.take_deferred(instance_id) else {
            return;
        };
        Self::note_decrement(&mut ov, &d.group, reg.group(&d.group), instance_id);
        drop(ov);
        self.writes.fetch_add(1, Ordering::AcqRel);
        self.invalidate();
    }

    /// A direct-mode drain found its instance already ended by someone else: EC2
    /// reclaimed a spot instance, a person terminated it without decrement. CA's
    /// removal of it still stands, but nobody decremented: AWS's desired capacity
    /// still holds the slot and the ASG would launch a replacement CA did not ask for.
    /// The slot is given up while it is unfulfilled, read from AWS now (no instance it
    /// keeps can be picked as a victim); once a replacement runs, it stays, and CA sees
    /// it like any new node. Returns whether desired capacity was lowered.
    pub async fn deferred_ended_elsewhere(&self, instance_id: &str) -> bool {
        let Some(group) = self
            .overlay
            .lock()
            .known
            .deferred(instance_id)
            .map(|d| d.group.clone())
        else {
            return false;
        };
        let _ops = self.ops.lock().await;
        {
            let mut ov = self.overlay.lock();
            ov.known.take_deferred(instance_id);
            ov.known.note_ending(instance_id);
        }
        self.invalidate();
        let (reg, idx) = match self.fresh_group(&group).await {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!(group = %group, instance = instance_id, error = %e, "cannot read the group after its instance ended elsewhere; CA sees any replacement as a new node");
                return false;
            }
        };
        let g = &reg.groups[idx];
        let kept = g.live_instances();
        let desired = g.asg.desired_capacity;
        if kept >= desired || desired - 1 < g.asg.min_size || self.settings.dry_run {
            tracing::info!(group = %group, instance = instance_id, kept, desired, "instance ended outside the drain; its slot is already refilled (or at MinSize): nothing to give up");
            return false;
        }
        tracing::info!(group = %group, instance = instance_id, from = desired, to = desired - 1, "instance ended outside the drain without a decrement: giving up its unfulfilled slot, as CA asked");
        match self.write_desired(&group, desired - 1).await {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(group = %group, error = %e, "could not give up the slot; CA sees the replacement as a new node");
                false
            }
        }
    }

    /// A direct-mode drain was abandoned: the node stays, so CA's target counts it
    /// again (CA's deletion of it failed).
    pub fn deferred_cancelled(&self, instance_id: &str) {
        self.overlay.lock().known.take_deferred(instance_id);
    }

    pub fn nodes(&self, id: &str) -> Result<Vec<InstanceView>, ProviderError> {
        let mut ov = self.overlay.lock();
        self.with_group(id, |g| {
            let target = Self::target_of(&ov, g);
            let failure = self.recent_failure(&ov, g);
            if let Some((n, f)) = self.failed_below_min_in(&ov, g) {
                if ov.told_below_min.get(&g.asg.name) != Some(&f.started_at_unix) {
                    tracing::warn!(
                        group = %g.asg.name,
                        failed = n,
                        min = Self::floor_of(g),
                        code = %f.code,
                        "the ASG cannot launch the instances that keep it at its minimum: {}; \
                         cluster-autoscaler sees them as unregistered nodes (not as failed, \
                         which would stop its whole loop) and warns \"min size reached\"",
                        f.message
                    );
                    ov.told_below_min
                        .insert(g.asg.name.clone(), f.started_at_unix);
                }
            }
            instances::list(
                &g.asg.name,
                g.placeholder_zone(),
                &g.asg.instances,
                target,
                Self::floor_of(g),
                &|iid| Self::is_deleting(&ov, iid),
                failure,
            )
        })
    }

    /// The newest launch failure that is recent and not older than the last increase.
    /// The last increase is the newer of this replica's own (known the moment it
    /// wrote it) and the newest launch activity AWS shows (known to every replica,
    /// so a failover does not attach a failure from before a fresh scale-up).
    fn recent_failure<'a>(&self, ov: &Overlay, g: &'a Group) -> Option<&'a LaunchFailure> {
        let now = unix_now();
        let window = self.settings.launch_failure_window.as_secs() as i64;
        let since_increase = last_increase(
            ov.last_increase.get(&g.asg.name).copied(),
            g.last_launch_unix,
        );
        g.failures.iter().find(|f| {
            now - f.started_at_unix <= window
                && f.started_at_unix >= since_increase.saturating_sub(5)
        })
    }

    /// NodeGroupGetOptions. `ca_lacks_startup_time`: the request came from a CA with
    /// no MaxNodeStartupTime on the wire (>= 1.35, see
    /// [`options::OptionsWithoutStartupTime`]).
    pub fn options(
        &self,
        id: &str,
        defaults: &options::AutoscalingOptions,
        ca_lacks_startup_time: bool,
    ) -> Result<options::AutoscalingOptions, ProviderError> {
        let overlay = self.with_group(id, |g| options::overlay_from_tags(defaults, &g.asg.tags))?;
        // Unusable tags are said once per group and set of tags (the metric
        // node_group_option_tags_unusable and check-config say it all the time);
        // the rest of the group's options are answered.
        if !overlay.warnings.is_empty() {
            let mut told = self.told_option_tags.lock();
            if told.get(id) != Some(&overlay.warnings) {
                for w in &overlay.warnings {
                    tracing::warn!(group = id, "{w}");
                }
                told.insert(id.to_string(), overlay.warnings.clone());
            }
        }
        // Any answer replaces CA's whole options struct, and fields the protocol does
        // not carry come back as zero (CA 1.35+: MaxNodeStartupTime = 0; CA 1.31/1.32:
        // the DaemonSet-utilization and zero-or-max settings off). A group with no
        // option tag has nothing to add: CA keeps its own defaults.
        if overlay.applied == 0 {
            return Err(ProviderError::Unimplemented(format!(
                "node group {id} has no autoscaling-options tags; CA's defaults apply"
            )));
        }
        // Any error but Unimplemented makes CA skip the deletion of the node it asked
        // for (every version 1.31 to master): options that cannot be answered leave
        // CA on its own defaults instead of blocking the group's scale-down.
        if let Err(e) = options::validate(&overlay.options) {
            tracing::warn!(
                group = id,
                "autoscaling options not answered: {e}; CA's defaults apply"
            );
            return Err(ProviderError::Unimplemented(format!(
                "node group {id}: {e}; CA's defaults apply"
            )));
        }
        if ca_lacks_startup_time {
            let policy = self.settings.options_without_startup_time;
            crate::telemetry::metrics::metrics().options_without_startup_time(id, policy.as_str());
            if self.told_startup_time.lock().insert(id.to_string()) {
                tracing::warn!(
                    group = id,
                    answer = policy.as_str(),
                    "cluster-autoscaler >= 1.35 asked for the options of a group with autoscaling-options tags; it has no MaxNodeStartupTime on the wire and would read it as 0 from any answer, so booting nodes count as unready at once and pending pods scale the group up twice (kubernetes/autoscaler#10245). {}",
                    match policy {
                        options::OptionsWithoutStartupTime::Unimplemented => "Answering Unimplemented: CA keeps its own defaults and the group's option tags do not apply (config optionsWithoutStartupTime: unimplemented)",
                        options::OptionsWithoutStartupTime::Answer => "Answering the tagged options anyway (config optionsWithoutStartupTime: answer)",
                    }
                );
            }
            if policy == options::OptionsWithoutStartupTime::Unimplemented {
                return Err(ProviderError::Unimplemented(format!(
                    "node group {id}: its autoscaling-options tags are not answered to cluster-autoscaler >= 1.35, which would read MaxNodeStartupTime as 0 (kubernetes/autoscaler#10245); CA's defaults apply (config optionsWithoutStartupTime: unimplemented)"
                )));
            }
        }
        Ok(overlay.options)
    }

    /// Whether the group was warned about a CA >= 1.35 asking for its tagged options.
    pub fn startup_time_told(&self, id: &str) -> bool {
        self.told_startup_time.lock().contains(id)
    }

    pub const GPU_LABEL: &'static str = "k8s.amazonaws.com/accelerator";

    /// GPU models of the instance types of managed groups, as far as known.
    pub fn gpu_types(&self) -> Vec<String> {
        self.templates.gpu_types()
    }

    // ---- writes ----

    pub async fn increase_size(
        self: &Arc<Self>,
        id: &str,
        delta: i32,
    ) -> Result<(), ProviderError> {
        self.increase_size_within(id, delta, None).await
    }

    /// IncreaseSize answering within `bound` (what is left of CA's deadline; `None`:
    /// unbounded): past it, or too near it to write, nothing is changed ([`bound`]).
    pub async fn increase_size_within(
        self: &Arc<Self>,
        id: &str,
        delta: i32,
        bound: Option<Duration>,
    ) -> Result<(), ProviderError> {
        let bound = bound::Bound::new("IncreaseSize", id, bound);
        let change = self.begin_size_change(&bound, id).await?;
        let g = &change.reg.groups[change.idx];
        let (target, deferred) = (change.target, change.deferred);
        let new = sizes::check_increase(id, target, g.max, delta)?;
        let desired = sizes::desired_for(id, new, deferred, g.asg.max_size)?;
        if self.settings.dry_run {
            return Err(self.dry_run_refusal(
                "IncreaseSize",
                format!("would raise the target of {id} from {target} to {new} (SetDesiredCapacity {desired})"),
            ));
        }
        tracing::info!(
            group = id,
            from = target,
            to = new,
            desired,
            draining = deferred,
            "increasing desired capacity"
        );
        self.write_desired_within(&bound, change.ops, id, desired)
            .await?;
        self.overlay
            .lock()
            .last_increase
            .insert(id.to_string(), unix_now());
        if g.asg.warm_pool.is_some() {
            let scale_in = self.scale_in.read().clone();
            scale_in.capacity_added(g);
        }
        // The next Refresh reads AWS, so the new instances show up by CA's next loop.
        self.invalidate();
        Ok(())
    }

    /// What every size change does first, each wait within `bound`: the size lock, the
    /// drains' state known, the group read again from AWS, and its sizes as this
    /// service counts them.
    async fn begin_size_change(
        &self,
        bound: &bound::Bound,
        id: &str,
    ) -> Result<SizeChange, ProviderError> {
        let ops = bound.lock(&self.ops).await?;
        self.require_drain_state()?;
        let (reg, idx) = bound.read(self.fresh_group(id)).await?;
        let (target, live, deferred) = {
            let ov = self.overlay.lock();
            let g = &reg.groups[idx];
            (
                Self::target_of(&ov, g),
                Self::live_count(&ov, g),
                Self::deferred_in(&ov, g),
            )
        };
        Ok(SizeChange {
            ops,
            reg,
            idx,
            target,
            live,
            deferred,
        })
    }

    pub async fn decrease_target_size(
        self: &Arc<Self>,
        id: &str,
        delta: i32,
    ) -> Result<(), ProviderError> {
        self.decrease_target_size_within(id, delta, None).await
    }

    /// DecreaseTargetSize answering within `bound`, as [`Self::increase_size_within`].
    pub async fn decrease_target_size_within(
        self: &Arc<Self>,
        id: &str,
        delta: i32,
        bound: Option<Duration>,
    ) -> Result<(), ProviderError> {
        let bound = bound::Bound::new("DecreaseTargetSize", id, bound);
        let change = self.begin_size_change(&bound, id).await?;
        let g = &change.reg.groups[change.idx];
        let (target, live, deferred) = (change.target, change.live, change.deferred);
        let dec = sizes::check_decrease(id, target, live, g.asg.min_size, delta)?;
        let new = dec.new;
        let desired = sizes::desired_for(id, new, deferred, g.asg.max_size)?;
        if self.settings.dry_run {
            return Err(self.dry_run_refusal(
                "DecreaseTargetSize",
                format!(
                    "would lower the target of {id} from {target} to {new} (asked {}, unfulfilled part only; SetDesiredCapacity {desired})",
                    dec.asked
                ),
            ));
        }
        if dec.partial() {
            tracing::warn!(
                group = id,
                from = target,
                to = new,
                asked = dec.asked,
                removed = dec.removed,
                live,
                min = g.asg.min_size,
                "cluster-autoscaler asked to remove more capacity than is unfulfilled; removing only the unfulfilled part (instances that exist go through DeleteNodes)"
            );
        } else {
            tracing::info!(
                group = id,
                from = target,
                to = new,
                desired,
                draining = deferred,
                "decreasing desired capacity (unfulfilled only)"
            );
        }
        self.write_desired_within(&bound, change.ops, id, desired)
            .await?;
        self.invalidate();
        Ok(())
    }

    /// SetDesiredCapacity as a task of its own that holds the size lock (`ops`) until
    /// AWS answers, so that no later size change reads the group before the write has
    /// landed or failed; the call waits for it within `bound` ([`bound::Bound::write`]).
    /// The write is noted when AWS answers, whether or not the call is still there.
    /// Nothing is written when too little of `bound` is left ([`bound::Bound::may_write`]).
    async fn write_desired_within(
        self: &Arc<Self>,
        bound: &bound::Bound,
        ops: tokio::sync::OwnedMutexGuard<()>,
        id: &str,
        desired: i32,
    ) -> Result<(), ProviderError> {
        bound.may_write()?;
        let (me, group) = (self.clone(), id.to_string());
        let write = tokio::spawn(async move {
            let _ops = ops;
            me.write_desired(&group, desired).await
        });
        bound.write(desired, write).await
    }

    /// The answer to a write in a dry run: the decision logged and counted, and an
    /// error that tells CA (and its log) what would have happened. An error, not a
    /// pretended success: CA then undoes its own marks (the ToBeDeleted taint) and does
    /// not wait for nodes that will never come.
    fn dry_run_refusal(&self, action: &str, what: String) -> ProviderError {
        tracing::info!(action, "dry run: {what}; nothing was changed");
        crate::telemetry::metrics::metrics().dry_run(action);
        ProviderError::FailedPrecondition(format!(
            "dry run (serve --dry-run): {what}; nothing was changed"
        ))
    }

    /// SetDesiredCapacity, counted as a write, and remembered until the next refresh
    /// shows it.
    async fn write_desired(&self, id: &str, desired: i32) -> Result<(), ProviderError> {
        self.writes.fetch_add(1, Ordering::AcqRel);
        self.cloud.set_desired_capacity(id, desired).await?;
        let reg = self.registry();
        let mut ov = self.overlay.lock();
        let before = reg.group(id).map(|g| Self::desired_of(&ov, g));
        Self::note_write(&mut ov, id, before, desired);
        Ok(())
    }

    /// The one place that notes an instance of group `id` ended with decrement (a
    /// removal here, or a direct-mode drain's termination): AWS's desired capacity as
    /// this service knows it went down by one (when the group is still known), and the
    /// instance is ending.
    fn note_decrement(ov: &mut Overlay, id: &str, group: Option<&Group>, instance_id: &str) {
        if let Some(g) = group {
            let desired = Self::desired_of(ov, g);
            Self::note_write(ov, id, Some(desired), desired - 1);
        }
        ov.known.note_ending(instance_id);
    }

    /// Remembers a desired capacity AWS took from us (a write, or a termination with
    /// decrement) over `before`, the capacity we took AWS to have.
    fn note_write(ov: &mut Overlay, id: &str, before: Option<i32>, desired: i32) {
        let at = now();
        let w = written::Written::new(ov.written.get(id), before, desired, at);
        ov.written.insert(id.to_string(), w);
        ov.written.retain(|_, w| !w.settled(at));
        ov.target.insert(id.to_string(), desired);
    }

    /// CA's Cleanup: nothing a later call needs is stopped; background lookups and the
    /// last snapshot stay.
    pub fn cleanup(&self) {
        tracing::info!("cleanup requested by cluster-autoscaler");
    }
}

/// A value from a request as error messages echo it: quoted, control characters
/// escaped, at most [`ECHO_MAX`] characters (then how long it really was), so a
/// hostile request cannot make the answer large.
pub fn echo(value: &str) -> String {
    let mut out = String::with_capacity(ECHO_MAX.min(value.len()) + 32);
    out.push('"');
    for (shown, c) in value.chars().enumerate() {
        if shown == ECHO_MAX {
            out.push_str(&format!("\"... ({} bytes)", value.len()));
            return out;
        }
        out.extend(c.escape_debug());
    }
    out.push('"');
    out
}

/// Most characters of a request value an error message repeats.
pub const ECHO_MAX: usize = 128;

/// When the group last grew, from this replica's memory and from AWS's newest launch
/// activity: the newer of the two; `i64::MIN` when neither is known. Pure.
pub fn last_increase(remembered: Option<i64>, newest_launch: Option<i64>) -> i64 {
    remembered.max(newest_launch).unwrap_or(i64::MIN)
}

pub(crate) fn unix_now() -> i64 {
    crate::clock::system_now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// Monotonic "now", in one place for the modules that keep timestamps.
pub(crate) fn now() -> Instant {
    Instant::now()
}

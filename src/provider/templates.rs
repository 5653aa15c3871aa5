//! Template nodes, built per group from cached AWS reads and kept encoded, so
//! NodeGroupTemplateNodeInfo answers from memory.
//!
//! Every piece a template is built from has a lifetime ([`FLOATING_LAUNCH_TTL`],
//! [`PINNED_LAUNCH_TTL`], [`INSTANCE_TYPE_TTL`], [`EKS_NODEGROUP_TTL`]) on a clock the
//! tests control ([`Clock`]). After each refresh (and on a Refresh call whenever a
//! template is due) the prefetch re-reads what has expired and what could not be read
//! (a throttled DescribeNodegroup is asked again on the next Refresh, not cached), and
//! rebuilds the template from what it read: a template is keyed by the content of its
//! inputs, not only by its group. A read that fails keeps the last answer, if there
//! was one, and is asked again next time. A template built from missing or expired
//! data says so: the gauge `node_group_template_incomplete{node_group,part}`,
//! a warning in the log and a problem line of check-config.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use crate::clock::Instant;

use bytes::Bytes;
use futures::future::{BoxFuture, FutureExt, Shared};
use parking_lot::{Mutex, RwLock};

use super::template::{self, TemplateInputs, TemplateOverrides};
use super::{echo, Group, Provider, ProviderError};
use crate::cloud::{
    CloudError, EksNodegroup, InstanceRequirements, InstanceTypeInfo, LaunchData, LaunchSpec,
    LaunchTemplateRef,
};

/// Attribute-based selection applies when no instance type is named: the mixed
/// instances policy's requirements override, else the launch template's own.
fn requirements_for(spec: &LaunchSpec, launch: &LaunchData) -> Option<InstanceRequirements> {
    match spec {
        LaunchSpec::MixedInstances { requirements, .. } => requirements
            .as_deref()
            .or(launch.requirements.as_ref())
            .cloned(),
        _ => launch.requirements.clone(),
    }
}

/// A launch template at `$Default`, `$Latest` or no version: another version can
/// become the one the ASG launches under the same reference.
pub const FLOATING_LAUNCH_TTL: Duration = Duration::from_secs(5 * 60);
/// A numbered launch template version or a launch configuration: AWS never changes
/// one, so it is read again only to heal a wrong read.
pub const PINNED_LAUNCH_TTL: Duration = Duration::from_secs(6 * 60 * 60);
/// DescribeInstanceTypes' answer for one type.
pub const INSTANCE_TYPE_TTL: Duration = Duration::from_secs(24 * 60 * 60);
/// DescribeNodegroup's answer, found or refused (AccessDenied, NotFound): labels,
/// taints and the capacity type change with UpdateNodegroupConfig, and a fixed
/// permission reaches the template within this. A throttled or failed read is not
/// kept: it is asked again on the next Refresh. (In-tree AWS keeps the same answer
/// about 6 minutes.)
pub const EKS_NODEGROUP_TTL: Duration = Duration::from_secs(5 * 60);

/// Where template lifetimes get "now": the system's monotonic clock, or one a test
/// moves ([`ManualClock`]).
pub trait Clock: Send + Sync + 'static {
    fn now(&self) -> Instant;
}

/// The monotonic system clock.
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }
}

/// A clock that stands still until [`ManualClock::advance`] moves it.
#[derive(Clone)]
pub struct ManualClock {
    base: Instant,
    offset: Arc<Mutex<Duration>>,
}

impl Default for ManualClock {
    fn default() -> Self {
        Self::new()
    }
}

impl ManualClock {
    pub fn new() -> Self {
        Self {
            base: Instant::now(),
            offset: Arc::new(Mutex::new(Duration::ZERO)),
        }
    }

    pub fn advance(&self, by: Duration) {
        *self.offset.lock() += by;
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Instant {
        self.base + *self.offset.lock()
    }
}

/// A piece of a template that is missing, past its lifetime or partly unusable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Part {
    /// DescribeNodegroup failed or was refused: no EKS labels, taints, capacity type.
    EksNodegroup,
    /// The launch template / configuration could not be re-read after its lifetime.
    LaunchData,
    /// The instance type could not be re-read after its lifetime.
    InstanceType,
    /// Settings in the user data that could not be read or are not modelled.
    UserData,
    /// ASG tags or `templates:` config entries that could not be used.
    Tags,
}

impl Part {
    pub const ALL: [Part; 5] = [
        Part::EksNodegroup,
        Part::LaunchData,
        Part::InstanceType,
        Part::UserData,
        Part::Tags,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Part::EksNodegroup => "eks_nodegroup",
            Part::LaunchData => "launch_data",
            Part::InstanceType => "instance_type",
            Part::UserData => "user_data",
            Part::Tags => "tags",
        }
    }
}

/// What is known to be missing or wrong in a group's template.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TemplateFindings {
    /// Each part built from missing or expired data, with why.
    pub incomplete: Vec<(Part, String)>,
    /// Every tag, flag or setting that could not be used, naming it and its value.
    pub warnings: Vec<String>,
}

pub(crate) struct TemplateCache {
    inner: Mutex<Inner>,
    clock: RwLock<Arc<dyn Clock>>,
    /// One builder at a time per provider keeps AWS reads deduplicated.
    build: tokio::sync::Mutex<()>,
    /// One prefetch at a time; the generation counters let callers wait for the
    /// prefetch that follows a refresh.
    prefetch: tokio::sync::Mutex<()>,
    requested: std::sync::atomic::AtomicU64,
    done: tokio::sync::watch::Sender<u64>,
    /// Builds a call started, one per group, running on past the call that started
    /// them: a build slower than CA's deadline still ends, and the next call joins
    /// it or reads its result ([`Provider::template_node_within`]).
    building: Mutex<HashMap<String, Building>>,
}

/// A template build every caller for its group waits on.
type Building = Shared<BoxFuture<'static, Result<Bytes, ProviderError>>>;

impl Default for TemplateCache {
    fn default() -> Self {
        Self {
            inner: Mutex::default(),
            clock: RwLock::new(Arc::new(SystemClock)),
            build: tokio::sync::Mutex::default(),
            prefetch: tokio::sync::Mutex::default(),
            requested: std::sync::atomic::AtomicU64::default(),
            done: tokio::sync::watch::Sender::default(),
            building: Mutex::default(),
        }
    }
}

/// An answer and when it was read. `read_at` stays at the last successful read, so a
/// failed re-read leaves it expired and it is asked again next time.
#[derive(Clone)]
struct Stamped<T> {
    read_at: Instant,
    ttl: Duration,
    value: T,
}

impl<T> Stamped<T> {
    fn fresh(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.read_at) < self.ttl
    }
}

/// What DescribeNodegroup answered for an EKS managed node group.
#[derive(Clone, PartialEq, Debug)]
enum EksAnswer {
    Found(EksNodegroup),
    /// A refusal that is an answer (AccessDenied, NotFound): kept for its lifetime.
    Refused(String),
}

#[derive(Default)]
struct Inner {
    built: HashMap<String, Built>,
    instance_types: HashMap<String, Stamped<InstanceTypeInfo>>,
    launch: HashMap<LaunchKey, Stamped<LaunchData>>,
    eks: HashMap<(String, String), Stamped<EksAnswer>>,
    /// (group, why) of template failures already logged: once each, not every loop.
    failures_told: std::collections::HashSet<(String, String)>,
    /// Groups whose template cannot be built from what AWS answered (no instance
    /// type, an unknown one): not tried again on every Refresh, only after
    /// [`FLOATING_LAUNCH_TTL`] or when the ASG changes.
    unbuildable: HashMap<String, (BuildKey, Instant)>,
}

/// One built template and everything it was built from.
struct Built {
    key: BuildKey,
    from: BuiltFrom,
    bytes: Bytes,
    findings: TemplateFindings,
}

/// The cache keys of a template's inputs, to tell when one is due.
#[derive(Clone, PartialEq, Debug)]
struct Sources {
    launch: Option<LaunchKey>,
    instance_type: String,
    eks: Option<(String, String)>,
}

/// The content a template was built from: a template is rebuilt when any differs.
#[derive(Clone, PartialEq, Debug)]
struct BuiltFrom {
    sources: Sources,
    launch: LaunchData,
    instance_type: InstanceTypeInfo,
    eks: Option<EksAnswer>,
    requirements: Option<InstanceRequirements>,
    overrides: TemplateOverrides,
}

#[derive(Clone, PartialEq, Eq, Hash, Debug)]
enum LaunchKey {
    Template(LaunchTemplateRef),
    Configuration(String),
}

impl LaunchKey {
    /// `$Default`, `$Latest` or no version.
    fn floating(&self) -> bool {
        match self {
            LaunchKey::Template(r) => r
                .version
                .as_deref()
                .is_none_or(|v| v.trim().parse::<u64>().is_err()),
            LaunchKey::Configuration(_) => false,
        }
    }

    fn ttl(&self) -> Duration {
        if self.floating() {
            FLOATING_LAUNCH_TTL
        } else {
            PINNED_LAUNCH_TTL
        }
    }

    fn of(spec: &LaunchSpec) -> Option<Self> {
        match spec {
            LaunchSpec::LaunchTemplate(r) => Some(Self::Template(r.clone())),
            LaunchSpec::MixedInstances { template, .. } => Some(Self::Template(template.clone())),
            LaunchSpec::LaunchConfiguration(n) => Some(Self::Configuration(n.clone())),
            LaunchSpec::Unknown => None,
        }
    }
}

/// A template is rebuilt when any of these change.
#[derive(Clone, PartialEq, Debug)]
struct BuildKey {
    launch: LaunchSpec,
    tags: std::collections::BTreeMap<String, String>,
    zones: Vec<String>,
}

impl BuildKey {
    fn of(g: &Group) -> Self {
        Self {
            launch: g.asg.launch.clone(),
            tags: g.asg.tags.clone(),
            zones: g.asg.availability_zones.clone(),
        }
    }
}

/// The EKS managed node group of an ASG, from EKS's tags on it.
fn eks_key(g: &Group) -> Option<(String, String)> {
    let cluster = g.asg.tags.get("eks:cluster-name")?;
    let ng = g.asg.tags.get("eks:nodegroup-name")?;
    Some((cluster.clone(), ng.clone()))
}

impl TemplateCache {
    pub(crate) fn gpu_types(&self) -> Vec<String> {
        let inner = self.inner.lock();
        let set: BTreeSet<String> = inner
            .instance_types
            .values()
            .filter_map(|t| t.value.gpu_type.clone())
            .collect();
        set.into_iter().collect()
    }

    fn now(&self) -> Instant {
        self.clock.read().now()
    }

    /// The template built for the group as it is now (same ASG launch spec, tags and
    /// zones), whatever its inputs' age: the hot path never waits on AWS.
    fn cached(&self, g: &Group) -> Option<Bytes> {
        let inner = self.inner.lock();
        let b = inner.built.get(&g.asg.name)?;
        (b.key == BuildKey::of(g)).then(|| b.bytes.clone())
    }

    /// Whether the group's template must be (re)built: none yet, the ASG changed, or
    /// an input is past its lifetime or could not be read.
    fn due(&self, g: &Group) -> bool {
        let now = self.now();
        let inner = self.inner.lock();
        let Some(b) = inner.built.get(&g.asg.name) else {
            return inner.unbuildable.get(&g.asg.name).is_none_or(|(key, at)| {
                key != &BuildKey::of(g) || now.saturating_duration_since(*at) >= FLOATING_LAUNCH_TTL
            });
        };
        if b.key != BuildKey::of(g) {
            return true;
        }
        let s = &b.from.sources;
        let launch_due = s
            .launch
            .as_ref()
            .is_some_and(|k| inner.launch.get(k).is_none_or(|e| !e.fresh(now)));
        let type_due = inner
            .instance_types
            .get(&s.instance_type)
            .is_none_or(|e| !e.fresh(now));
        let eks_due = s
            .eks
            .as_ref()
            .is_some_and(|k| inner.eks.get(k).is_none_or(|e| !e.fresh(now)));
        launch_due || type_due || eks_due
    }
}

impl Provider {
    /// Puts a clock under the template lifetimes (tests move it by hand).
    pub fn set_template_clock(&self, clock: Arc<dyn Clock>) {
        *self.templates.clock.write() = clock;
    }

    /// The encoded template Node of a group (CA's NodeGroupTemplateNodeInfo).
    /// The group's template node for CA, answered within `bound` (what is left of
    /// CA's deadline). A template built for the group as it is now is answered from
    /// memory. Otherwise the build runs as a task of its own that the answer waits
    /// for: when AWS is too slow for the bound, CA is told the template is not ready
    /// (its loop skips the group this once, as for any template error), the build
    /// ends behind the answer and the next call gets it. Cancelled with each call, a
    /// build slower than CA's deadline would never end.
    pub async fn template_node_within(
        self: &Arc<Self>,
        id: &str,
        bound: Option<Duration>,
    ) -> Result<Bytes, ProviderError> {
        if let Some(b) = self.kept_template(id)? {
            return Ok(b);
        }
        let build = self.template_build(id.to_string());
        let Some(bound) = bound else {
            return build.await;
        };
        match tokio::time::timeout(bound, build).await {
            Ok(built) => built,
            Err(_) => Err(ProviderError::Unavailable(format!(
                "node group {}: its template node is still being built from AWS's answers, which take longer than {bound:?}; the build goes on and the next call gets it",
                echo(id)
            ))),
        }
    }

    /// The group's running build, or a new one.
    fn template_build(self: &Arc<Self>, group: String) -> Building {
        let mut building = self.templates.building.lock();
        if let Some(b) = building.get(&group) {
            return b.clone();
        }
        let (this, name) = (self.clone(), group.clone());
        let task = tokio::spawn(async move {
            let built = this.template_node(&name).await;
            this.templates.building.lock().remove(&name);
            built
        });
        let build: Building = async move {
            task.await.unwrap_or_else(|e| {
                Err(ProviderError::Unavailable(format!(
                    "the template build stopped: {e}"
                )))
            })
        }
        .boxed()
        .shared();
        building.insert(group, build.clone());
        build
    }

    /// The group's template node, built now when none is kept for the group as it is
    /// (no bound: `check-config` and tests).
    pub async fn template_node(&self, id: &str) -> Result<Bytes, ProviderError> {
        if let Some(b) = self.kept_template(id)? {
            return Ok(b);
        }
        let _one = self.templates.build.lock().await;
        let reg = self.registry();
        let g = reg
            .group(id)
            .ok_or_else(|| ProviderError::UnknownGroup(id.to_string()))?;
        if let Some(b) = self.templates.cached(g) {
            return Ok(b);
        }
        self.build_and_keep(g).await
    }

    /// The template kept for the group as it is now, if any; an error for a group
    /// not managed. Answered from memory.
    fn kept_template(&self, id: &str) -> Result<Option<Bytes>, ProviderError> {
        let reg = self.registry();
        let g = reg
            .group(id)
            .ok_or_else(|| ProviderError::UnknownGroup(id.to_string()))?;
        Ok(self.templates.cached(g))
    }

    /// What is missing or unusable in the group's template as last built (None
    /// before the first build).
    pub fn template_findings(&self, id: &str) -> Option<TemplateFindings> {
        self.templates
            .inner
            .lock()
            .built
            .get(id)
            .map(|b| b.findings.clone())
    }

    /// Builds the group's template from its inputs (re-reading those past their
    /// lifetime) and keeps it. The caller holds the build lock.
    async fn build_and_keep(&self, g: &Group) -> Result<Bytes, ProviderError> {
        let (bytes, from, findings) = match self.build_template(g).await {
            Ok(b) => b,
            Err(e) => {
                self.template_failed(&g.asg.name, &e);
                if matches!(e, ProviderError::Unimplemented(_)) {
                    let at = self.templates.now();
                    self.templates
                        .inner
                        .lock()
                        .unbuildable
                        .insert(g.asg.name.clone(), (BuildKey::of(g), at));
                }
                return Err(e);
            }
        };
        let mut inner = self.templates.inner.lock();
        inner.unbuildable.remove(&g.asg.name);
        let before = inner.built.get(&g.asg.name);
        let rebuilt = before.is_some_and(|b| b.from != from);
        let changed_findings = before.is_none_or(|b| b.findings != findings);
        if rebuilt {
            tracing::info!(group = %g.asg.name, "template node rebuilt: what it is built from changed");
        }
        if changed_findings {
            tell_findings(&g.asg.name, &findings);
        }
        inner.built.insert(
            g.asg.name.clone(),
            Built {
                key: BuildKey::of(g),
                from,
                bytes: bytes.clone(),
                findings,
            },
        );
        Ok(bytes)
    }

    /// CA does not log an Unimplemented template answer, so a group that cannot scale
    /// from zero would fail silently: count every failure, and warn once per group and
    /// cause (check-config names them too).
    fn template_failed(&self, group: &str, e: &ProviderError) {
        let reason = match e {
            ProviderError::Cloud(_) => "aws_error",
            ProviderError::Unimplemented(_) => "cannot_build",
            _ => "other",
        };
        crate::telemetry::metrics::metrics()
            .template_failures
            .get_or_create(&crate::telemetry::metrics::TemplateFailureLabels {
                node_group: group.to_string(),
                reason: reason.to_string(),
            })
            .inc();
        let first = self
            .templates
            .inner
            .lock()
            .failures_told
            .insert((group.to_string(), e.to_string()));
        if first {
            tracing::warn!(group, reason, error = %e, "cannot build the template node: cluster-autoscaler cannot scale this group up from zero (it does not log this answer itself)");
        }
    }

    /// Whether this template failure of the group was logged already (tests).
    pub fn template_failure_told(&self, group: &str, why: &str) -> bool {
        self.templates
            .inner
            .lock()
            .failures_told
            .contains(&(group.to_string(), why.to_string()))
    }

    async fn build_template(
        &self,
        g: &Group,
    ) -> Result<(Bytes, BuiltFrom, TemplateFindings), ProviderError> {
        let mut incomplete = Vec::new();
        let (launch, type_name) = self.launch_data(g, &mut incomplete).await?;
        let requirements = type_name
            .is_none()
            .then(|| requirements_for(&g.asg.launch, &launch))
            .flatten();
        let type_name = match (type_name, &requirements) {
            (Some(t), _) => t,
            (None, Some(r)) => self.type_for_requirements(g, r, &launch).await?,
            (None, None) => {
                return Err(ProviderError::Unimplemented(format!(
                    "node group {}: no instance type or InstanceRequirements in its launch template, launch configuration or mixed instances policy",
                    g.asg.name
                )))
            }
        };
        let itype = self.instance_type(&type_name, &mut incomplete).await?;
        let eks = self.eks_nodegroup(g, &mut incomplete).await;
        let overrides = self.overrides_for(&g.asg.name);
        let found = match &eks {
            Some(EksAnswer::Found(ng)) => Some(ng),
            _ => None,
        };
        let inputs = TemplateInputs {
            group: &g.asg,
            region: &self.settings.region,
            launch: &launch,
            instance_type: &itype,
            eks: found,
            requirements: requirements.as_ref(),
            overrides: &overrides,
        };
        let node = template::build_template(&inputs)
            .map_err(|e| ProviderError::Unimplemented(e.to_string()))?;
        if !node.user_data_warnings.is_empty() {
            incomplete.push((
                Part::UserData,
                format!(
                    "{} setting(s) in the user data not read: {}",
                    node.user_data_warnings.len(),
                    node.user_data_warnings.join("; ")
                ),
            ));
        }
        let other = node.warnings.len() - node.user_data_warnings.len().min(node.warnings.len());
        if other > 0 {
            incomplete.push((
                Part::Tags,
                format!("{other} tag(s) or config entries not usable (see the warnings)"),
            ));
        }
        let bytes = Bytes::from(template::encode_node(&node));
        let from = BuiltFrom {
            sources: Sources {
                launch: LaunchKey::of(&g.asg.launch),
                instance_type: type_name,
                eks: eks_key(g),
            },
            launch,
            instance_type: itype,
            eks,
            requirements,
            overrides,
        };
        let findings = TemplateFindings {
            incomplete,
            warnings: node.warnings,
        };
        Ok((bytes, from, findings))
    }

    /// The first instance type AWS matches to attribute-based requirements (as
    /// in-tree AWS picks it), for the labels; the size comes from the requirements.
    async fn type_for_requirements(
        &self,
        g: &Group,
        r: &InstanceRequirements,
        launch: &LaunchData,
    ) -> Result<String, ProviderError> {
        let types = self
            .cloud
            .instance_types_for_requirements(r, launch.image_id.as_deref())
            .await?;
        types.into_iter().next().ok_or_else(|| {
            ProviderError::Unimplemented(format!(
                "node group {}: no instance type meets its InstanceRequirements (vCPU >= {}, memory >= {} MiB)",
                g.asg.name, r.vcpu_min, r.memory_mib_min
            ))
        })
    }

    /// Config overrides: `*` first, then the group's own on top.
    fn overrides_for(&self, group: &str) -> TemplateOverrides {
        let mut o = self
            .settings
            .templates
            .get("*")
            .cloned()
            .unwrap_or_default();
        if let Some(own) = self.settings.templates.get(group) {
            o.labels.extend(own.labels.clone());
            o.taints.extend(own.taints.clone());
            o.resources.extend(own.resources.clone());
            if own.max_pods.is_some() {
                o.max_pods = own.max_pods;
            }
            if own.vm_memory_overhead_percent.is_some() {
                o.vm_memory_overhead_percent = own.vm_memory_overhead_percent;
            }
        }
        o
    }

    /// Launch data and the instance type to model.
    async fn launch_data(
        &self,
        g: &Group,
        incomplete: &mut Vec<(Part, String)>,
    ) -> Result<(LaunchData, Option<String>), ProviderError> {
        let Some(key) = LaunchKey::of(&g.asg.launch) else {
            return Err(ProviderError::Unimplemented(format!(
                "node group {}: the ASG has no launch template, launch configuration or mixed instances policy",
                g.asg.name
            )));
        };
        let d = self.cached_launch(key, incomplete).await?;
        let t = match &g.asg.launch {
            LaunchSpec::MixedInstances { override_types, .. } => override_types
                .first()
                .cloned()
                .or_else(|| d.instance_type.clone()),
            _ => d.instance_type.clone(),
        };
        Ok((d, t))
    }

    /// The launch data, read again once past its lifetime; a failed re-read keeps
    /// the last answer (noted as incomplete) and is asked again next time.
    async fn cached_launch(
        &self,
        key: LaunchKey,
        incomplete: &mut Vec<(Part, String)>,
    ) -> Result<LaunchData, ProviderError> {
        let now = self.templates.now();
        let old = self.templates.inner.lock().launch.get(&key).cloned();
        if let Some(e) = old.as_ref().filter(|e| e.fresh(now)) {
            return Ok(e.value.clone());
        }
        let read = match &key {
            LaunchKey::Template(r) => self.cloud.launch_template(r).await,
            LaunchKey::Configuration(n) => self.cloud.launch_configuration(n).await,
        };
        match (read, old) {
            (Ok(d), _) => {
                self.templates.inner.lock().launch.insert(
                    key.clone(),
                    Stamped {
                        read_at: self.templates.now(),
                        ttl: key.ttl(),
                        value: d.clone(),
                    },
                );
                Ok(d)
            }
            (Err(e), Some(old)) => {
                incomplete.push((
                    Part::LaunchData,
                    format!(
                        "re-reading {key:?} failed ({e}); the answer of {:?} ago is used",
                        now.saturating_duration_since(old.read_at)
                    ),
                ));
                Ok(old.value)
            }
            (Err(e), None) => Err(e.into()),
        }
    }

    async fn instance_type(
        &self,
        name: &str,
        incomplete: &mut Vec<(Part, String)>,
    ) -> Result<InstanceTypeInfo, ProviderError> {
        let now = self.templates.now();
        let old = self
            .templates
            .inner
            .lock()
            .instance_types
            .get(name)
            .cloned();
        if let Some(e) = old.as_ref().filter(|e| e.fresh(now)) {
            return Ok(e.value.clone());
        }
        let loaded = self.load_instance_types(&[name.to_string()]).await;
        let fresh = self
            .templates
            .inner
            .lock()
            .instance_types
            .get(name)
            .filter(|e| e.fresh(self.templates.now()))
            .map(|e| e.value.clone());
        match (fresh, old, loaded) {
            (Some(t), _, _) => Ok(t),
            (None, Some(old), r) => {
                let why = match r {
                    Err(e) => e.to_string(),
                    Ok(()) => "DescribeInstanceTypes no longer names it".to_string(),
                };
                incomplete.push((
                    Part::InstanceType,
                    format!("re-reading instance type {name} failed ({why}); the answer of {:?} ago is used", now.saturating_duration_since(old.read_at)),
                ));
                Ok(old.value)
            }
            (None, None, Err(e)) => Err(e),
            (None, None, Ok(())) => Err(ProviderError::Unimplemented(format!(
                "instance type {name:?} is unknown to DescribeInstanceTypes"
            ))),
        }
    }

    /// Reads the types that are not cached or past their lifetime, in one call.
    async fn load_instance_types(&self, names: &[String]) -> Result<(), ProviderError> {
        let now = self.templates.now();
        let missing: Vec<String> = {
            let inner = self.templates.inner.lock();
            let set: BTreeSet<&String> = names
                .iter()
                .filter(|n| inner.instance_types.get(*n).is_none_or(|e| !e.fresh(now)))
                .collect();
            set.into_iter().cloned().collect()
        };
        if missing.is_empty() {
            return Ok(());
        }
        let found = self.cloud.instance_types(&missing).await?;
        let at = self.templates.now();
        let mut inner = self.templates.inner.lock();
        for t in found {
            inner.instance_types.insert(
                t.name.clone(),
                Stamped {
                    read_at: at,
                    ttl: INSTANCE_TYPE_TTL,
                    value: t,
                },
            );
        }
        Ok(())
    }

    /// EKS managed node groups tag their ASG with the cluster and node-group names.
    /// An answer (found or refused) lives [`EKS_NODEGROUP_TTL`]; a throttled or
    /// failed read is not kept, so the next Refresh asks again, and the last answer,
    /// if any, is used meanwhile.
    async fn eks_nodegroup(
        &self,
        g: &Group,
        incomplete: &mut Vec<(Part, String)>,
    ) -> Option<EksAnswer> {
        let key = eks_key(g)?;
        let (cluster, ng) = &key;
        let now = self.templates.now();
        let old = self.templates.inner.lock().eks.get(&key).cloned();
        let answer = match old.as_ref().filter(|e| e.fresh(now)) {
            Some(e) => e.value.clone(),
            None => match self.cloud.eks_nodegroup(cluster, ng).await {
                Ok(v) => self.keep_eks(&key, EksAnswer::Found(v)),
                Err(e) if e.is_retryable() => {
                    tracing::warn!(group = %g.asg.name, cluster = %cluster, nodegroup = %ng, error = %e, "could not read the EKS node group; asked again on the next Refresh");
                    match old {
                        Some(old) => {
                            incomplete.push((
                                Part::EksNodegroup,
                                format!("DescribeNodegroup {cluster}/{ng} failed ({e}); the answer of {:?} ago is used until it is read again", now.saturating_duration_since(old.read_at)),
                            ));
                            old.value
                        }
                        None => {
                            incomplete.push((Part::EksNodegroup, eks_missing(cluster, ng, &e)));
                            return None;
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(group = %g.asg.name, cluster = %cluster, nodegroup = %ng, error = %e, "the EKS node group read was refused; template uses ASG data only until it is read again");
                    self.keep_eks(&key, EksAnswer::Refused(e.to_string()))
                }
            },
        };
        if let EksAnswer::Refused(why) = &answer {
            incomplete.push((
                Part::EksNodegroup,
                format!("DescribeNodegroup {cluster}/{ng} was refused ({why}): the template has no EKS labels, taints or capacity type; read again within {}s", EKS_NODEGROUP_TTL.as_secs()),
            ));
        }
        Some(answer)
    }

    fn keep_eks(&self, key: &(String, String), answer: EksAnswer) -> EksAnswer {
        self.templates.inner.lock().eks.insert(
            key.clone(),
            Stamped {
                read_at: self.templates.now(),
                ttl: EKS_NODEGROUP_TTL,
                value: answer.clone(),
            },
        );
        answer
    }

    /// After a refresh: read the launch data of every group whose template is due
    /// (none yet, or an input past its lifetime or unread), then every instance type
    /// they need in one batched call, then build, so CA's first ask is answered from
    /// memory and 250 groups over 20 types cost one DescribeInstanceTypes, not 20.
    pub(crate) fn spawn_prefetch(self: &Arc<Self>) {
        use std::sync::atomic::Ordering;
        let generation = self.templates.requested.fetch_add(1, Ordering::SeqCst) + 1;
        let this = self.clone();
        tokio::spawn(async move {
            let _one = this.templates.prefetch.lock().await;
            this.prefetch_templates().await;
            this.templates
                .done
                .send_modify(|d| *d = (*d).max(generation));
        });
    }

    /// On a Refresh that does not re-read the ASGs: starts the prefetch when a
    /// template is due (an input past its lifetime, or a read that failed), unless
    /// one is running already.
    pub(crate) fn heal_templates(self: &Arc<Self>) {
        if self.templates.prefetch.try_lock().is_err() {
            return;
        }
        let reg = self.registry();
        if reg.groups.iter().any(|g| self.templates.due(g)) {
            self.spawn_prefetch();
        }
    }

    /// Drops the templates of groups no longer managed, and their gauge series.
    pub(crate) fn forget_gone_templates(&self, reg: &super::Registry) {
        let gone: Vec<String> = {
            let mut inner = self.templates.inner.lock();
            let gone: Vec<String> = inner
                .built
                .keys()
                .filter(|g| reg.group(g).is_none())
                .cloned()
                .collect();
            for g in &gone {
                inner.built.remove(g);
            }
            inner.unbuildable.retain(|g, _| reg.group(g).is_some());
            gone
        };
        let m = crate::telemetry::metrics::metrics();
        for g in gone {
            for part in Part::ALL {
                m.template_incomplete
                    .remove(&crate::telemetry::metrics::TemplatePartLabels {
                        node_group: g.clone(),
                        part: part.as_str(),
                    });
            }
        }
    }

    /// Waits until the template prefetch that followed the latest refresh is over
    /// (used by the warm-up path and tests; CA never waits for it).
    pub async fn templates_prefetched(&self) {
        use std::sync::atomic::Ordering;
        let want = self.templates.requested.load(Ordering::SeqCst);
        let mut rx = self.templates.done.subscribe();
        let _ = rx.wait_for(|d| *d >= want).await;
    }

    async fn prefetch_templates(&self) {
        let reg = self.registry();
        let due: Vec<&Group> = reg
            .groups
            .iter()
            .filter(|g| self.templates.due(g))
            .collect();
        let mut types = Vec::new();
        for g in &due {
            // Under the build lock, so a concurrent template_node reads the cache.
            let read = {
                let _one = self.templates.build.lock().await;
                self.launch_data(g, &mut Vec::new()).await
            };
            match read {
                Ok((_, Some(t))) => types.push(t),
                Ok((_, None)) => {}
                Err(e) => {
                    tracing::debug!(group = %g.asg.name, error = %e, "launch data prefetch failed")
                }
            }
        }
        types.sort();
        types.dedup();
        if let Err(e) = self.load_instance_types(&types).await {
            tracing::debug!(error = %e, "instance type prefetch failed; templates will read on demand");
        }
        for g in due {
            // Due when the loop began: the launch data it re-read above are fresh
            // now, and the template must still be built from them.
            let _one = self.templates.build.lock().await;
            if let Err(e) = self.build_and_keep(g).await {
                tracing::debug!(group = %g.asg.name, error = %e, "template prefetch failed");
            }
        }
    }
}

fn eks_missing(cluster: &str, ng: &str, e: &CloudError) -> String {
    format!("DescribeNodegroup {cluster}/{ng} failed ({e}): the template has no EKS labels, taints or capacity type until it is read (asked again on the next Refresh)")
}

/// Logs what a template lacks, and sets the gauge per part.
fn tell_findings(group: &str, f: &TemplateFindings) {
    let m = crate::telemetry::metrics::metrics();
    for part in Part::ALL {
        let on = f.incomplete.iter().any(|(p, _)| *p == part);
        m.template_incomplete
            .get_or_create(&crate::telemetry::metrics::TemplatePartLabels {
                node_group: group.to_string(),
                part: part.as_str(),
            })
            .set(i64::from(on));
    }
    for (part, why) in &f.incomplete {
        tracing::warn!(
            group,
            part = part.as_str(),
            "template node built from incomplete data: {why}"
        );
    }
    for w in &f.warnings {
        tracing::warn!(group, "template node: {w}");
    }
}

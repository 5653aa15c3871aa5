//! Template nodes, built once per group from cached AWS reads and kept encoded, so
//! NodeGroupTemplateNodeInfo answers from memory. Instance types are read once per
//! type (batched), launch templates once per pinned version (and again after a while
//! for `$Default`/`$Latest`), EKS node groups once.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::Mutex;

use super::template::{self, TemplateInputs, TemplateOverrides};
use super::{now, Group, Provider, ProviderError};
use crate::cloud::{
    EksNodegroup, InstanceRequirements, InstanceTypeInfo, LaunchData, LaunchSpec, LaunchTemplateRef,
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

/// `$Default` / `$Latest` can change under the same reference.
const FLOATING_VERSION_TTL: Duration = Duration::from_secs(10 * 60);

#[derive(Default)]
pub(crate) struct TemplateCache {
    inner: Mutex<Inner>,
    /// One builder at a time per provider keeps AWS reads deduplicated.
    build: tokio::sync::Mutex<()>,
    /// One prefetch at a time; the generation counters let callers wait for the
    /// prefetch that follows a refresh.
    prefetch: tokio::sync::Mutex<()>,
    requested: std::sync::atomic::AtomicU64,
    done: tokio::sync::watch::Sender<u64>,
}

#[derive(Default)]
struct Inner {
    /// Group -> (what it was built from, encoded Node).
    built: HashMap<String, (BuildKey, Bytes)>,
    instance_types: HashMap<String, InstanceTypeInfo>,
    launch: HashMap<LaunchKey, (Instant, LaunchData)>,
    eks: HashMap<(String, String), Option<EksNodegroup>>,
    /// (group, why) of template failures already logged: once each, not every loop.
    failures_told: std::collections::HashSet<(String, String)>,
}

#[derive(Clone, PartialEq, Eq, Hash, Debug)]
enum LaunchKey {
    Template(LaunchTemplateRef),
    Configuration(String),
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

impl TemplateCache {
    pub(crate) fn gpu_types(&self) -> Vec<String> {
        let inner = self.inner.lock();
        let set: BTreeSet<String> = inner
            .instance_types
            .values()
            .filter_map(|t| t.gpu_type.clone())
            .collect();
        set.into_iter().collect()
    }

    fn cached(&self, g: &Group) -> Option<Bytes> {
        let inner = self.inner.lock();
        let (key, bytes) = inner.built.get(&g.asg.name)?;
        (key == &BuildKey::of(g)).then(|| bytes.clone())
    }
}

impl Provider {
    /// The encoded template Node of a group (CA's NodeGroupTemplateNodeInfo).
    pub async fn template_node(&self, id: &str) -> Result<Bytes, ProviderError> {
        let reg = self.registry();
        let g = reg
            .group(id)
            .ok_or_else(|| ProviderError::UnknownGroup(id.to_string()))?;
        if let Some(b) = self.templates.cached(g) {
            return Ok(b);
        }
        let _one = self.templates.build.lock().await;
        if let Some(b) = self.templates.cached(g) {
            return Ok(b);
        }
        let bytes = match self.build_template(g).await {
            Ok(b) => b,
            Err(e) => {
                self.template_failed(&g.asg.name, &e);
                return Err(e);
            }
        };
        self.templates
            .inner
            .lock()
            .built
            .insert(g.asg.name.clone(), (BuildKey::of(g), bytes.clone()));
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

    async fn build_template(&self, g: &Group) -> Result<Bytes, ProviderError> {
        let (launch, type_name) = self.launch_data(g).await?;
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
        let itype = self.instance_type(&type_name).await?;
        let eks = self.eks_nodegroup(g).await;
        let overrides = self.overrides_for(&g.asg.name);
        let inputs = TemplateInputs {
            group: &g.asg,
            region: &self.settings.region,
            launch: &launch,
            instance_type: &itype,
            eks: eks.as_ref(),
            requirements: requirements.as_ref(),
            overrides: &overrides,
        };
        let node = template::build_template(&inputs)
            .map_err(|e| ProviderError::Unimplemented(e.to_string()))?;
        Ok(Bytes::from(template::encode_node(&node)))
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
    async fn launch_data(&self, g: &Group) -> Result<(LaunchData, Option<String>), ProviderError> {
        match &g.asg.launch {
            LaunchSpec::LaunchTemplate(r) => {
                let d = self.cached_launch(LaunchKey::Template(r.clone())).await?;
                let t = d.instance_type.clone();
                Ok((d, t))
            }
            LaunchSpec::MixedInstances {
                template,
                override_types,
                ..
            } => {
                let d = self.cached_launch(LaunchKey::Template(template.clone())).await?;
                let t = override_types.first().cloned().or_else(|| d.instance_type.clone());
                Ok((d, t))
            }
            LaunchSpec::LaunchConfiguration(name) => {
                let d = self.cached_launch(LaunchKey::Configuration(name.clone())).await?;
                let t = d.instance_type.clone();
                Ok((d, t))
            }
            LaunchSpec::Unknown => Err(ProviderError::Unimplemented(format!(
                "node group {}: the ASG has no launch template, launch configuration or mixed instances policy",
                g.asg.name
            ))),
        }
    }

    async fn cached_launch(&self, key: LaunchKey) -> Result<LaunchData, ProviderError> {
        let floating = match &key {
            LaunchKey::Template(r) => r
                .version
                .as_deref()
                .is_none_or(|v| v.parse::<u64>().is_err()),
            LaunchKey::Configuration(_) => false,
        };
        if let Some((at, d)) = self.templates.inner.lock().launch.get(&key) {
            if !floating || at.elapsed() < FLOATING_VERSION_TTL {
                return Ok(d.clone());
            }
        }
        let d = match &key {
            LaunchKey::Template(r) => self.cloud.launch_template(r).await?,
            LaunchKey::Configuration(n) => self.cloud.launch_configuration(n).await?,
        };
        self.templates
            .inner
            .lock()
            .launch
            .insert(key, (now(), d.clone()));
        Ok(d)
    }

    async fn instance_type(&self, name: &str) -> Result<InstanceTypeInfo, ProviderError> {
        if let Some(t) = self.templates.inner.lock().instance_types.get(name) {
            return Ok(t.clone());
        }
        self.load_instance_types(&[name.to_string()]).await?;
        self.templates
            .inner
            .lock()
            .instance_types
            .get(name)
            .cloned()
            .ok_or_else(|| {
                ProviderError::Unimplemented(format!(
                    "instance type {name:?} is unknown to DescribeInstanceTypes"
                ))
            })
    }

    async fn load_instance_types(&self, names: &[String]) -> Result<(), ProviderError> {
        let missing: Vec<String> = {
            let inner = self.templates.inner.lock();
            let set: BTreeSet<&String> = names
                .iter()
                .filter(|n| !inner.instance_types.contains_key(*n))
                .collect();
            set.into_iter().cloned().collect()
        };
        if missing.is_empty() {
            return Ok(());
        }
        let found = self.cloud.instance_types(&missing).await?;
        let mut inner = self.templates.inner.lock();
        for t in found {
            inner.instance_types.insert(t.name.clone(), t);
        }
        Ok(())
    }

    /// EKS managed node groups tag their ASG with the cluster and node-group names.
    async fn eks_nodegroup(&self, g: &Group) -> Option<EksNodegroup> {
        let cluster = g.asg.tags.get("eks:cluster-name")?;
        let ng = g.asg.tags.get("eks:nodegroup-name")?;
        let key = (cluster.clone(), ng.clone());
        if let Some(v) = self.templates.inner.lock().eks.get(&key) {
            return v.clone();
        }
        let v = match self.cloud.eks_nodegroup(cluster, ng).await {
            Ok(v) => Some(v),
            Err(e) => {
                tracing::warn!(group = %g.asg.name, cluster = %cluster, nodegroup = %ng, error = %e, "could not read the EKS node group; template uses ASG data only");
                if e.is_retryable() {
                    return None;
                }
                None
            }
        };
        self.templates.inner.lock().eks.insert(key, v.clone());
        v
    }

    /// After a refresh: read the launch data of every group that has no template yet
    /// (cached per launch template), then every instance type they need in one batched
    /// call, then build, so CA's first ask is answered from memory and 250 groups over
    /// 20 types cost one DescribeInstanceTypes, not 20.
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
        let mut types = Vec::new();
        for g in &reg.groups {
            if self.templates.cached(g).is_some() {
                continue;
            }
            // Under the build lock, so a concurrent template_node reads the cache.
            let read = {
                let _one = self.templates.build.lock().await;
                self.launch_data(g).await
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
        for g in &reg.groups {
            if self.templates.cached(g).is_none() {
                if let Err(e) = self.template_node(&g.asg.name).await {
                    tracing::debug!(group = %g.asg.name, error = %e, "template prefetch failed");
                }
            }
        }
    }
}

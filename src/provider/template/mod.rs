//! Template nodes for scale-from-zero: what a new node of a group will look like.
//! Pure: inputs are plain data read by the cloud backend, output is a [`TemplateNode`]
//! that `encode` turns into a Kubernetes-protobuf v1.Node.

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::cloud::{AsgSnapshot, EksNodegroup, InstanceTypeInfo, LaunchData, Taint};

pub mod allocatable;
pub mod encode;
pub mod userdata;

pub use encode::encode_node;

/// Operator-given template settings (config `templates:` per group or `*`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TemplateOverrides {
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// `key=value:Effect` or `key:Effect`.
    #[serde(default)]
    pub taints: Vec<String>,
    /// Extra resources, e.g. `hugepages-2Mi: 1Gi`.
    #[serde(default)]
    pub resources: BTreeMap<String, String>,
    /// Overrides the max-pods computed from the instance type's ENI limits.
    #[serde(default)]
    pub max_pods: Option<i64>,
}

/// Everything a template is built from.
#[derive(Debug, Clone)]
pub struct TemplateInputs<'a> {
    pub group: &'a AsgSnapshot,
    pub region: &'a str,
    pub launch: &'a LaunchData,
    pub instance_type: &'a InstanceTypeInfo,
    pub eks: Option<&'a EksNodegroup>,
    pub overrides: &'a TemplateOverrides,
}

/// A node as CA should imagine it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TemplateNode {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub taints: Vec<Taint>,
    /// Quantities as Kubernetes strings (`4`, `16Gi`, `3920m`).
    pub capacity: BTreeMap<String, String>,
    pub allocatable: BTreeMap<String, String>,
    /// Tags, flags or settings that could not be used, naming each and its value.
    pub warnings: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    #[error("group {group}: {message}")]
    Invalid { group: String, message: String },
}

pub const TAG_LABEL: &str = "k8s.io/cluster-autoscaler/node-template/label/";
pub const TAG_TAINT: &str = "k8s.io/cluster-autoscaler/node-template/taint/";
pub const TAG_RESOURCE: &str = "k8s.io/cluster-autoscaler/node-template/resources/";
pub const GPU_LABEL: &str = "k8s.amazonaws.com/accelerator";
const DEFAULT_EPHEMERAL_GIB: i64 = 20;
const DEFAULT_MAX_PODS: i64 = 110;

/// The zone a new node most likely lands in: the ASG's zone with the fewest
/// instances (the ASG balances across zones), ties by name.
pub fn pick_zone(group: &AsgSnapshot) -> Option<String> {
    let mut zones: Vec<(usize, &String)> = group
        .availability_zones
        .iter()
        .map(|z| (group.instances.iter().filter(|i| &i.zone == z).count(), z))
        .collect();
    zones.sort();
    zones.first().map(|(_, z)| (*z).clone())
}

/// `4`, `16Gi`-style quantities: checks the shape only (digits, optional fraction,
/// optional suffix), enough to refuse typos.
pub fn valid_quantity(q: &str) -> bool {
    let q = q.trim();
    let num_end = q
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(q.len());
    if num_end == 0 || q[..num_end].parse::<f64>().is_err() {
        return false;
    }
    matches!(
        &q[num_end..],
        "" | "m"
            | "k"
            | "K"
            | "M"
            | "G"
            | "T"
            | "P"
            | "E"
            | "Ki"
            | "Mi"
            | "Gi"
            | "Ti"
            | "Pi"
            | "Ei"
    )
}

fn put_taint(taints: &mut Vec<Taint>, t: Taint) {
    taints.retain(|x| !(x.key == t.key && x.effect == t.effect));
    taints.push(t);
}

/// Builds the template node of one group.
pub fn build_template(inputs: &TemplateInputs<'_>) -> Result<TemplateNode, TemplateError> {
    let g = inputs.group;
    let it = inputs.instance_type;
    if it.vcpus <= 0 || it.memory_mib <= 0 {
        return Err(TemplateError::Invalid {
            group: g.name.clone(),
            message: format!(
                "instance type {} has no usable capacity (vcpus {}, memory {} MiB)",
                it.name, it.vcpus, it.memory_mib
            ),
        });
    }
    let mut warnings = Vec::new();
    let mut labels = BTreeMap::new();
    let mut taints: Vec<Taint> = Vec::new();
    let name = format!("template-node-for-{}", g.name);
    let arch = if it.architecture.is_empty() {
        "amd64"
    } else {
        it.architecture.as_str()
    };
    for (k, v) in [
        ("kubernetes.io/arch", arch),
        ("beta.kubernetes.io/arch", arch),
        ("kubernetes.io/os", "linux"),
        ("beta.kubernetes.io/os", "linux"),
        ("kubernetes.io/hostname", name.as_str()),
        ("node.kubernetes.io/instance-type", it.name.as_str()),
        ("beta.kubernetes.io/instance-type", it.name.as_str()),
        ("topology.kubernetes.io/region", inputs.region),
        ("failure-domain.beta.kubernetes.io/region", inputs.region),
    ] {
        labels.insert(k.to_string(), v.to_string());
    }
    if let Some(zone) = pick_zone(g) {
        labels.insert("topology.kubernetes.io/zone".into(), zone.clone());
        // The EBS CSI driver's topology key: without it, a pending pod with a zonal
        // EBS volume never matches a group at zero (in-tree AWS sets it too).
        labels.insert("topology.ebs.csi.aws.com/zone".into(), zone.clone());
        labels.insert("failure-domain.beta.kubernetes.io/zone".into(), zone);
    }
    if let Some(gpu) = it.gpu_type.as_ref().filter(|_| it.gpus > 0) {
        labels.insert(GPU_LABEL.into(), gpu.clone());
    }
    // EKS managed node group: its own labels and taints.
    if let Some(ng) = g.tags.get("eks:nodegroup-name") {
        labels.insert("eks.amazonaws.com/nodegroup".into(), ng.clone());
    }
    if let Some(eks) = inputs.eks {
        labels.extend(eks.labels.clone());
        for t in &eks.taints {
            put_taint(&mut taints, t.clone());
        }
    }
    // Kubelet flags in the launch template's user data.
    let mut max_pods = None;
    if let Some(ud) = &inputs.launch.user_data {
        let flags = userdata::parse(ud);
        labels.extend(flags.labels);
        for t in flags.taints {
            put_taint(&mut taints, t);
        }
        max_pods = flags.max_pods;
        warnings.extend(
            flags
                .warnings
                .into_iter()
                .map(|w| format!("group {}: {w}", g.name)),
        );
    }
    // ASG tags.
    let mut extra: BTreeMap<String, String> = BTreeMap::new();
    for (k, v) in &g.tags {
        if let Some(l) = k.strip_prefix(TAG_LABEL) {
            if !l.is_empty() {
                labels.insert(l.to_string(), v.clone());
            }
        } else if let Some(key) = k.strip_prefix(TAG_TAINT) {
            match userdata::parse_taint(&format!("{key}={v}")) {
                Ok(t) if !key.is_empty() => put_taint(&mut taints, t),
                Ok(_) => {}
                Err(_) => warnings.push(format!("group {}: tag {k}={v:?} is not value:Effect (NoSchedule, PreferNoSchedule, NoExecute); skipped", g.name)),
            }
        } else if let Some(r) = k.strip_prefix(TAG_RESOURCE) {
            if valid_quantity(v) {
                extra.insert(r.to_string(), v.trim().to_string());
            } else {
                warnings.push(format!(
                    "group {}: tag {k}={v:?} is not a quantity; skipped",
                    g.name
                ));
            }
        }
    }
    // Operator overrides last.
    let o = inputs.overrides;
    labels.extend(o.labels.clone());
    for t in &o.taints {
        match userdata::parse_taint(t) {
            Ok(t) => put_taint(&mut taints, t),
            Err(e) => warnings.push(format!("group {}: config template taint: {e}", g.name)),
        }
    }
    for (k, v) in &o.resources {
        if valid_quantity(v) {
            extra.insert(k.clone(), v.trim().to_string());
        } else {
            warnings.push(format!(
                "group {}: config template resource {k}={v:?} is not a quantity; skipped",
                g.name
            ));
        }
    }
    let max_pods = o
        .max_pods
        .or(max_pods)
        .or_else(|| {
            allocatable::eni_max_pods(it.max_enis.unwrap_or(0), it.ipv4_per_eni.unwrap_or(0))
        })
        .unwrap_or(DEFAULT_MAX_PODS);
    let ephemeral_gib = inputs
        .launch
        .root_volume_gib
        .filter(|v| *v > 0)
        .unwrap_or(DEFAULT_EPHEMERAL_GIB);
    let alloc = allocatable::allocatable(it.vcpus, it.memory_mib, max_pods, ephemeral_gib);

    let mut capacity = BTreeMap::new();
    capacity.insert("cpu".to_string(), it.vcpus.to_string());
    capacity.insert("memory".to_string(), format!("{}Mi", it.memory_mib));
    capacity.insert("pods".to_string(), max_pods.to_string());
    capacity.insert(
        "ephemeral-storage".to_string(),
        format!("{ephemeral_gib}Gi"),
    );
    if it.gpus > 0 {
        capacity.insert("nvidia.com/gpu".to_string(), it.gpus.to_string());
    }
    let mut allocatable = capacity.clone();
    allocatable.insert("cpu".into(), format!("{}m", alloc.cpu_millis));
    allocatable.insert("memory".into(), format!("{}Mi", alloc.memory_mib));
    allocatable.insert(
        "ephemeral-storage".into(),
        format!("{}Mi", alloc.ephemeral_mib),
    );
    for (k, v) in extra {
        capacity.insert(k.clone(), v.clone());
        allocatable.insert(k, v);
    }
    taints.sort();
    Ok(TemplateNode {
        name,
        labels,
        taints,
        capacity,
        allocatable,
        warnings,
    })
}

#[cfg(test)]
mod tests;

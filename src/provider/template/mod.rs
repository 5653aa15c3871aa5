//! Template nodes for scale-from-zero: what a new node of a group will look like.
//! Pure: inputs are plain data read by the cloud backend, output is a [`TemplateNode`]
//! that `encode` turns into a Kubernetes-protobuf v1.Node.

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::cloud::{
    AsgSnapshot, BlockVolume, EksNodegroup, InstanceRequirements, InstanceTypeInfo, LaunchData,
    Taint,
};

pub mod allocatable;
pub mod encode;
pub mod userdata;

pub use encode::{describe, encode_node};

/// Operator-given template settings (config `templates:` per group or `*`).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
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
    /// Percent of the instance type's nominal memory kept for the VM, firmware and
    /// kernel (default [`allocatable::DEFAULT_VM_MEMORY_OVERHEAD_PERCENT`]; 7.5 means
    /// 7.5 %, where Karpenter's flag of the same name takes the fraction 0.075).
    #[serde(default)]
    pub vm_memory_overhead_percent: Option<f64>,
}

/// Everything a template is built from.
#[derive(Debug, Clone)]
pub struct TemplateInputs<'a> {
    pub group: &'a AsgSnapshot,
    pub region: &'a str,
    pub launch: &'a LaunchData,
    pub instance_type: &'a InstanceTypeInfo,
    pub eks: Option<&'a EksNodegroup>,
    /// Attribute-based selection: `instance_type` is the first type AWS matched, and
    /// the node is sized at the requirements' minimums (a new node may be the
    /// smallest type that qualifies), as in-tree AWS does.
    pub requirements: Option<&'a InstanceRequirements>,
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
    /// The ones of `warnings` that come from the user data.
    pub user_data_warnings: Vec<String>,
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
pub const OS_LABEL: &str = "kubernetes.io/os";
pub const WINDOWS_BUILD_LABEL: &str = "node.kubernetes.io/windows-build";
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

/// The operating system of a group's nodes, as `kubernetes.io/os` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeOs {
    Linux,
    Windows,
}

impl NodeOs {
    pub fn label(self) -> &'static str {
        match self {
            NodeOs::Linux => "linux",
            NodeOs::Windows => "windows",
        }
    }
}

/// The OS from the EKS node group's AMI type, else from the launch template's user
/// data. An EKS AMI type other than `CUSTOM` decides (`WINDOWS_*` is Windows, `AL2_*`,
/// `AL2023_*`, `BOTTLEROCKET_*` are Linux); with `CUSTOM` or no node group the user
/// data decides ([`userdata::is_windows_user_data`]); with neither, Linux.
pub fn node_os(eks_ami_type: Option<&str>, user_data_is_windows: bool) -> NodeOs {
    match eks_ami_type.map(str::trim).filter(|a| !a.is_empty()) {
        Some(a) if a.to_ascii_uppercase().starts_with("WINDOWS_") => NodeOs::Windows,
        Some(a) if !a.eq_ignore_ascii_case("CUSTOM") => NodeOs::Linux,
        _ if user_data_is_windows => NodeOs::Windows,
        _ => NodeOs::Linux,
    }
}

/// `node.kubernetes.io/windows-build` (kubelet sets it on Windows nodes: major.minor.
/// build) from an EKS Windows AMI type: Windows Server 2019 is build 17763, 2022 is
/// 20348. None for other AMI types and releases not listed.
pub fn windows_build(eks_ami_type: Option<&str>) -> Option<&'static str> {
    let a = eks_ami_type?.to_ascii_uppercase();
    if !a.starts_with("WINDOWS_") {
        return None;
    }
    if a.contains("_2019_") {
        Some("10.0.17763")
    } else if a.contains("_2022_") {
        Some("10.0.20348")
    } else {
        None
    }
}

/// The extended resource a GPU's device plugin advertises, by the maker
/// DescribeInstanceTypes names (`GpuInfo.Gpus[].Manufacturer`): NVIDIA's plugin
/// `nvidia.com/gpu`, AMD's (g4ad) `amd.com/gpu`, Habana's (dl1) `habana.ai/gaudi`, as
/// Karpenter maps them (aws/karpenter-provider-aws pkg/apis/v1/labels.go and
/// pkg/providers/instancetype/types.go). None for a maker without a known plugin: a
/// template must not promise a resource no plugin will advertise.
pub fn gpu_resource_name(manufacturer: &str) -> Option<&'static str> {
    match manufacturer.trim().to_ascii_lowercase().as_str() {
        "nvidia" => Some("nvidia.com/gpu"),
        "amd" => Some("amd.com/gpu"),
        "habana" => Some("habana.ai/gaudi"),
        _ => None,
    }
}

/// Max pods of a Windows node with the VPC CNI: Windows nodes use one ENI, so the
/// IPv4 addresses of that ENI less its own (EKS user guide, "Deploy Windows nodes on
/// EKS clusters": IPs per ENI minus one).
pub fn windows_max_pods(ipv4_per_eni: i64) -> Option<i64> {
    (ipv4_per_eni > 1).then(|| ipv4_per_eni - 1)
}

/// EKS labels every node of a managed node group with these.
pub const EKS_CAPACITY_TYPE_LABEL: &str = "eks.amazonaws.com/capacityType";
pub const EKS_NODEGROUP_LABEL: &str = "eks.amazonaws.com/nodegroup";

/// The size of the volume pods' ephemeral storage lives on, in GiB. Bottlerocket keeps
/// its OS on a small first volume (`/dev/xvda`) and kubelet's data on the second
/// (`/dev/xvdb`), so that one counts; other AMIs use the root volume (`/dev/xvda`,
/// `/dev/sda1`, else the first mapping). None when the mapping keeps the AMI's size.
pub fn ephemeral_volume_gib(volumes: &[BlockVolume], bottlerocket: bool) -> Option<i64> {
    let sized = |v: &&BlockVolume| v.size_gib.is_some_and(|s| s > 0);
    let on = |dev: &str| volumes.iter().find(|v| v.device == dev);
    let chosen = if bottlerocket {
        on("/dev/xvdb")
    } else {
        on("/dev/xvda")
            .or_else(|| on("/dev/sda1"))
            .or_else(|| volumes.first())
    };
    chosen.filter(sized).and_then(|v| v.size_gib)
}

fn put_taint(taints: &mut Vec<Taint>, t: Taint) {
    taints.retain(|x| !(x.key == t.key && x.effect == t.effect));
    taints.push(t);
}

/// Builds the template node of one group, in steps: what the node has (the instance
/// type, or the requirements' minimums), the labels every node carries, the kubelet's
/// flags from the user data, the OS, the ASG's tags, the EKS node group's own labels,
/// taints and resources, the operator's overrides (each later source wins), then the
/// pods it takes and its capacity and allocatable.
pub fn build_template(inputs: &TemplateInputs<'_>) -> Result<TemplateNode, TemplateError> {
    let size = Size::of(inputs)?;
    let name = format!("template-node-for-{}", inputs.group.name);
    let arch = if inputs.instance_type.architecture.is_empty() {
        "amd64"
    } else {
        inputs.instance_type.architecture.as_str()
    };
    let mut d = Draft::default();
    d.well_known_labels(inputs, &name, arch, size.gpus);
    let mut kubelet = d.user_data(inputs);
    let os = d.os(inputs, kubelet.windows);
    d.asg_tags(inputs.group);
    d.eks(inputs);
    d.overrides(inputs);
    let max_pods = max_pods(inputs, &mut kubelet, os, size.vcpus);
    let (capacity, allocatable) = d.resources(inputs, &size, arch, max_pods, &kubelet);
    let Draft {
        labels,
        mut taints,
        warnings,
        user_data_warnings,
        ..
    } = d;
    taints.sort();
    Ok(TemplateNode {
        name,
        labels,
        taints,
        capacity,
        allocatable,
        warnings,
        user_data_warnings,
    })
}

/// What the template node has: the instance type's, or the requirements' minimums.
struct Size<'a> {
    vcpus: i64,
    memory_mib: i64,
    gpus: i64,
    gpu_maker: Option<&'a str>,
}

impl<'a> Size<'a> {
    fn of(inputs: &TemplateInputs<'a>) -> Result<Self, TemplateError> {
        let (g, it, req) = (inputs.group, inputs.instance_type, inputs.requirements);
        let vcpus = req
            .map(|r| r.vcpu_min)
            .filter(|v| *v > 0)
            .unwrap_or(it.vcpus);
        let memory_mib = req
            .map(|r| r.memory_mib_min)
            .filter(|v| *v > 0)
            .unwrap_or(it.memory_mib);
        // Only the GPUs the requirements guarantee: the first matching type may have some
        // that another qualifying type lacks (requirements only ever ask for NVIDIA ones).
        let (gpus, gpu_maker) = match req {
            Some(r) => (r.nvidia_gpus_min.unwrap_or(0), Some("nvidia")),
            None => (it.gpus, it.gpu_manufacturer.as_deref()),
        };
        if vcpus <= 0 || memory_mib <= 0 {
            return Err(TemplateError::Invalid {
                group: g.name.clone(),
                message: format!(
                    "instance type {} has no usable capacity (vcpus {vcpus}, memory {memory_mib} MiB)",
                    it.name
                ),
            });
        }
        Ok(Size {
            vcpus,
            memory_mib,
            gpus,
            gpu_maker,
        })
    }
}

/// The kubelet's flags the user data sets, and what it says of the OS.
#[derive(Default)]
struct Kubelet {
    max_pods: Option<i64>,
    reservations: allocatable::Reservations,
    pods_per_core: Option<i64>,
    use_max_pods: Option<bool>,
    windows: bool,
    bottlerocket: bool,
}

/// The template node as its sources add to it, in order.
#[derive(Default)]
struct Draft {
    labels: BTreeMap<String, String>,
    taints: Vec<Taint>,
    /// Extended resources (`node-template/resources/...`), in capacity and allocatable.
    extra: BTreeMap<String, String>,
    warnings: Vec<String>,
    user_data_warnings: Vec<String>,
}

impl Draft {
    /// The labels every node of the group carries: architecture, host name, instance
    /// type, region and zone, GPU type, EKS node group name.
    fn well_known_labels(
        &mut self,
        inputs: &TemplateInputs<'_>,
        name: &str,
        arch: &str,
        gpus: i64,
    ) {
        let (g, it) = (inputs.group, inputs.instance_type);
        for (k, v) in [
            ("kubernetes.io/arch", arch),
            ("beta.kubernetes.io/arch", arch),
            ("kubernetes.io/hostname", name),
            ("node.kubernetes.io/instance-type", it.name.as_str()),
            ("beta.kubernetes.io/instance-type", it.name.as_str()),
            ("topology.kubernetes.io/region", inputs.region),
            ("failure-domain.beta.kubernetes.io/region", inputs.region),
        ] {
            self.labels.insert(k.to_string(), v.to_string());
        }
        if let Some(zone) = pick_zone(g) {
            self.labels
                .insert("topology.kubernetes.io/zone".into(), zone.clone());
            // The EBS CSI driver's topology key: without it, a pending pod with a zonal
            // EBS volume never matches a group at zero (in-tree AWS sets it too).
            self.labels
                .insert("topology.ebs.csi.aws.com/zone".into(), zone.clone());
            self.labels
                .insert("failure-domain.beta.kubernetes.io/zone".into(), zone);
        }
        if let Some(gpu) = it.gpu_type.as_ref().filter(|_| gpus > 0) {
            self.labels.insert(GPU_LABEL.into(), gpu.clone());
        }
        if let Some(ng) = g.tags.get("eks:nodegroup-name") {
            self.labels.insert(EKS_NODEGROUP_LABEL.into(), ng.clone());
        }
    }

    /// Kubelet flags in the launch template's user data: labels, taints, max pods,
    /// reservations; what it cannot use is warned of.
    fn user_data(&mut self, inputs: &TemplateInputs<'_>) -> Kubelet {
        let mut k = Kubelet {
            bottlerocket: inputs
                .eks
                .and_then(|e| e.ami_type.as_deref())
                .is_some_and(|a| a.starts_with("BOTTLEROCKET")),
            ..Kubelet::default()
        };
        if let Some(ud) = &inputs.launch.user_data {
            let flags = userdata::parse(ud);
            k.bottlerocket |= flags.bottlerocket;
            k.windows = flags.windows;
            self.labels.extend(flags.labels);
            for t in flags.taints {
                put_taint(&mut self.taints, t);
            }
            k.max_pods = flags.max_pods;
            k.reservations = flags.reservations;
            k.pods_per_core = flags.pods_per_core;
            k.use_max_pods = flags.use_max_pods;
            self.user_data_warnings.extend(
                flags
                    .warnings
                    .into_iter()
                    .map(|w| format!("group {}: {w}", inputs.group.name)),
            );
            self.warnings
                .extend(self.user_data_warnings.iter().cloned());
        }
        k
    }

    /// The OS labels (and a Windows node's build).
    fn os(&mut self, inputs: &TemplateInputs<'_>, windows_user_data: bool) -> NodeOs {
        let ami_type = inputs.eks.and_then(|e| e.ami_type.as_deref());
        let os = node_os(ami_type, windows_user_data);
        self.labels.insert(OS_LABEL.into(), os.label().into());
        self.labels
            .insert("beta.kubernetes.io/os".into(), os.label().into());
        if let Some(build) = windows_build(ami_type).filter(|_| os == NodeOs::Windows) {
            self.labels.insert(WINDOWS_BUILD_LABEL.into(), build.into());
        }
        os
    }

    /// The ASG's `node-template` tags: labels, taints and resources.
    fn asg_tags(&mut self, g: &AsgSnapshot) {
        for (k, v) in &g.tags {
            if let Some(l) = k.strip_prefix(TAG_LABEL) {
                if !l.is_empty() {
                    self.labels.insert(l.to_string(), v.clone());
                }
            } else if let Some(key) = k.strip_prefix(TAG_TAINT) {
                match userdata::parse_taint(&format!("{key}={v}")) {
                    Ok(t) if !key.is_empty() => put_taint(&mut self.taints, t),
                    Ok(_) => {}
                    Err(_) => self.warnings.push(format!("group {}: tag {k}={v:?} is not value:Effect (NoSchedule, PreferNoSchedule, NoExecute); skipped", g.name)),
                }
            } else if let Some(r) = k.strip_prefix(TAG_RESOURCE) {
                if valid_quantity(v) {
                    self.extra.insert(r.to_string(), v.trim().to_string());
                } else {
                    self.warnings.push(format!(
                        "group {}: tag {k}={v:?} is not a quantity; skipped",
                        g.name
                    ));
                }
            }
        }
    }

    /// EKS managed node group: what EKS puts on its nodes wins over ASG tags, as in
    /// in-tree AWS (EKS does not copy ASG tags to nodes); its resource tags win too.
    fn eks(&mut self, inputs: &TemplateInputs<'_>) {
        let Some(eks) = inputs.eks else { return };
        if let Some(name) = &eks.name {
            self.labels.insert(EKS_NODEGROUP_LABEL.into(), name.clone());
        }
        if let Some(ct) = &eks.capacity_type {
            self.labels
                .insert(EKS_CAPACITY_TYPE_LABEL.into(), ct.clone());
        }
        self.labels.extend(eks.labels.clone());
        for t in &eks.taints {
            put_taint(&mut self.taints, t.clone());
        }
        for (k, v) in &eks.tags {
            if let Some(r) = k.strip_prefix(TAG_RESOURCE) {
                if valid_quantity(v) {
                    self.extra.insert(r.to_string(), v.trim().to_string());
                } else {
                    self.warnings.push(format!(
                        "group {}: EKS node group tag {k}={v:?} is not a quantity; skipped",
                        inputs.group.name
                    ));
                }
            }
        }
    }

    /// The operator's overrides, last.
    fn overrides(&mut self, inputs: &TemplateInputs<'_>) {
        let (o, g) = (inputs.overrides, inputs.group);
        self.labels.extend(o.labels.clone());
        for t in &o.taints {
            match userdata::parse_taint(t) {
                Ok(t) => put_taint(&mut self.taints, t),
                Err(e) => self
                    .warnings
                    .push(format!("group {}: config template taint: {e}", g.name)),
            }
        }
        for (k, v) in &o.resources {
            if valid_quantity(v) {
                self.extra.insert(k.clone(), v.trim().to_string());
            } else {
                self.warnings.push(format!(
                    "group {}: config template resource {k}={v:?} is not a quantity; skipped",
                    g.name
                ));
            }
        }
    }

    /// Capacity and allocatable: CPU, the memory the node will report, pods, ephemeral
    /// storage, GPUs by their device plugin's resource, and the extended resources.
    fn resources(
        &mut self,
        inputs: &TemplateInputs<'_>,
        size: &Size<'_>,
        arch: &str,
        max_pods: i64,
        kubelet: &Kubelet,
    ) -> (BTreeMap<String, String>, BTreeMap<String, String>) {
        let (g, it, o) = (inputs.group, inputs.instance_type, inputs.overrides);
        let vcpus = size.vcpus;
        let ephemeral_gib = ephemeral_volume_gib(&inputs.launch.volumes, kubelet.bottlerocket)
            .or_else(|| inputs.eks.and_then(|e| e.disk_size_gib).filter(|v| *v > 0))
            .unwrap_or(DEFAULT_EPHEMERAL_GIB);
        // What the node will report as memory capacity, not the nominal size: the VM
        // and kernel keep a share a pod can never have.
        let overhead = o
            .vm_memory_overhead_percent
            .unwrap_or(allocatable::DEFAULT_VM_MEMORY_OVERHEAD_PERCENT);
        let memory_capacity_mib = allocatable::memory_capacity_mib(size.memory_mib, arch, overhead);
        let alloc = allocatable::allocatable_with(
            vcpus,
            memory_capacity_mib,
            max_pods,
            ephemeral_gib,
            &kubelet.reservations,
        );
        let mut capacity = BTreeMap::new();
        capacity.insert("cpu".to_string(), vcpus.to_string());
        capacity.insert("memory".to_string(), format!("{memory_capacity_mib}Mi"));
        capacity.insert("pods".to_string(), max_pods.to_string());
        capacity.insert(
            "ephemeral-storage".to_string(),
            format!("{ephemeral_gib}Gi"),
        );
        let gpus = size.gpus;
        if gpus > 0 {
            match size.gpu_maker.and_then(gpu_resource_name) {
                Some(resource) => {
                    capacity.insert(resource.to_string(), gpus.to_string());
                }
                None => self.warnings.push(format!(
                    "group {}: instance type {} has {gpus} GPU(s) by maker {:?}, which has no known device-plugin resource; the template offers none (add a node-template/resources/ tag to name it)",
                    g.name,
                    it.name,
                    size.gpu_maker.unwrap_or("unknown")
                )),
            }
        }
        let mut allocatable = capacity.clone();
        allocatable.insert("cpu".into(), format!("{}m", alloc.cpu_millis));
        allocatable.insert("memory".into(), format!("{}Mi", alloc.memory_mib));
        allocatable.insert(
            "ephemeral-storage".into(),
            format!("{}Mi", alloc.ephemeral_mib),
        );
        for (k, v) in std::mem::take(&mut self.extra) {
            capacity.insert(k.clone(), v.clone());
            allocatable.insert(k, v);
        }
        (capacity, allocatable)
    }
}

/// The pods the node takes: the operator's override, else the user data's, else the
/// ENI limit (unless bootstrap is told not to use it), else the default; capped by
/// pods-per-core times the cores. AL2's bootstrap.sh `--use-max-pods false` leaves
/// kubelet at its own default, its kube-reserved memory still computed from the ENIs.
fn max_pods(inputs: &TemplateInputs<'_>, kubelet: &mut Kubelet, os: NodeOs, vcpus: i64) -> i64 {
    let (it, o) = (inputs.instance_type, inputs.overrides);
    let eni_max_pods = match os {
        NodeOs::Windows => windows_max_pods(it.ipv4_per_eni.unwrap_or(0)),
        NodeOs::Linux => {
            allocatable::eni_max_pods(it.max_enis.unwrap_or(0), it.ipv4_per_eni.unwrap_or(0))
        }
    };
    let unset_max_pods = if kubelet.use_max_pods == Some(false) {
        if let Some(eni) = eni_max_pods {
            let memory = &mut kubelet.reservations.kube_reserved.memory_mib;
            *memory = memory.or(Some(allocatable::kube_reserved_memory_mib(eni)));
        }
        None
    } else {
        eni_max_pods
    };
    let mut max_pods = o
        .max_pods
        .or(kubelet.max_pods)
        .or(unset_max_pods)
        .unwrap_or(DEFAULT_MAX_PODS);
    // kubelet: pods-per-core x cores, when lower than max pods.
    if let Some(ppc) = kubelet.pods_per_core.filter(|_| o.max_pods.is_none()) {
        max_pods = max_pods.min(ppc.saturating_mul(vcpus)).max(1);
    }
    max_pods
}

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

use super::*;
use crate::cloud::{
    AsgInstance, BlockVolume, EksNodegroup, InstanceRequirements, InstanceTypeInfo, LaunchData,
    LaunchSpec, LifecycleState,
};

fn asg(tags: &[(&str, &str)]) -> AsgSnapshot {
    AsgSnapshot {
        name: "g".into(),
        min_size: 0,
        max_size: 5,
        desired_capacity: 1,
        availability_zones: vec!["us-east-1a".into(), "us-east-1b".into()],
        tags: tags
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        launch: LaunchSpec::Unknown,
        instances: vec![AsgInstance {
            id: "i-1".into(),
            zone: "us-east-1a".into(),
            state: LifecycleState::InService,
            instance_type: None,
        }],
        terminating_hooks: vec![],
        warm_pool: None,
    }
}

fn m5_large() -> InstanceTypeInfo {
    InstanceTypeInfo {
        name: "m5.large".into(),
        vcpus: 2,
        memory_mib: 8192,
        architecture: "amd64".into(),
        max_enis: Some(3),
        ipv4_per_eni: Some(10),
        ..Default::default()
    }
}

fn build(
    group: &AsgSnapshot,
    launch: &LaunchData,
    it: &InstanceTypeInfo,
    eks: Option<&EksNodegroup>,
    o: &TemplateOverrides,
) -> TemplateNode {
    build_template(&TemplateInputs {
        group,
        region: "us-east-1",
        launch,
        instance_type: it,
        eks,
        requirements: None,
        overrides: o,
    })
    .unwrap()
}

/// [`build`] for the group of [`asg`] without tags, no overrides.
fn plain(launch: &LaunchData, it: &InstanceTypeInfo, eks: Option<&EksNodegroup>) -> TemplateNode {
    build(&asg(&[]), launch, it, eks, &TemplateOverrides::default())
}

#[test]
fn standard_labels_capacity_and_allocatable() {
    let n = plain(&LaunchData::default(), &m5_large(), None);
    let l = |k: &str| n.labels.get(k).map(String::as_str);
    assert_eq!(l("kubernetes.io/arch"), Some("amd64"));
    assert_eq!(l("kubernetes.io/os"), Some("linux"));
    assert_eq!(l("node.kubernetes.io/instance-type"), Some("m5.large"));
    assert_eq!(l("topology.kubernetes.io/region"), Some("us-east-1"));
    // us-east-1a already has an instance: the next one goes to 1b.
    assert_eq!(l("topology.kubernetes.io/zone"), Some("us-east-1b"));
    assert_eq!(l("topology.ebs.csi.aws.com/zone"), Some("us-east-1b"));
    assert_eq!(l("kubernetes.io/hostname"), Some(n.name.as_str()));
    assert_eq!(n.capacity["cpu"], "2");
    // 8192 MiB nominal less 7.5 % (614.4, rounded up to 615) for the VM.
    assert_eq!(n.capacity["memory"], "7577Mi");
    assert_eq!(n.capacity["pods"], "29");
    assert_eq!(n.capacity["ephemeral-storage"], "20Gi");
    assert_eq!(n.allocatable["cpu"], "1930m");
    // Less 574 kube-reserved and 100 eviction: below the ~7070Mi a real m5.large
    // reports (issue 21), where the nominal-based 7518Mi was above it.
    assert_eq!(n.allocatable["memory"], "6903Mi");
    assert!(!n.capacity.contains_key("nvidia.com/gpu"));
}

#[test]
fn gpu_types_get_the_accelerator_label_and_gpu_capacity() {
    let it = InstanceTypeInfo {
        name: "g4dn.xlarge".into(),
        vcpus: 4,
        memory_mib: 16384,
        gpus: 1,
        gpu_type: Some("nvidia-tesla-t4".into()),
        architecture: "amd64".into(),
        ..Default::default()
    };
    let n = plain(&LaunchData::default(), &it, None);
    assert_eq!(n.labels[GPU_LABEL], "nvidia-tesla-t4");
    assert!(
        n.warnings
            .iter()
            .any(|w| w.contains("no known device-plugin")),
        "a GPU without a maker is not promised as nvidia.com/gpu: {:?}",
        n.capacity
    );
    assert!(!n.capacity.contains_key("nvidia.com/gpu"));
    let it = InstanceTypeInfo {
        gpu_manufacturer: Some("NVIDIA".into()),
        ..it
    };
    let n = plain(&LaunchData::default(), &it, None);
    assert_eq!(n.capacity["nvidia.com/gpu"], "1");
    assert_eq!(n.allocatable["nvidia.com/gpu"], "1");
    assert_eq!(
        n.capacity["pods"], "110",
        "unknown ENI limits fall back to 110"
    );
}

fn vol(device: &str, size: Option<i64>) -> BlockVolume {
    BlockVolume {
        device: device.into(),
        size_gib: size,
    }
}

#[test]
fn sources_layer_in_order_user_data_then_tags_then_the_eks_node_group() {
    let eks = EksNodegroup {
        name: Some("ng-1".into()),
        labels: BTreeMap::from([
            ("team".into(), "eks".into()),
            ("from-eks".into(), "yes".into()),
        ]),
        taints: vec![Taint {
            key: "k".into(),
            value: "eks".into(),
            effect: "NoSchedule".into(),
        }],
        capacity_type: Some("SPOT".into()),
        tags: BTreeMap::from([
            (format!("{TAG_RESOURCE}hugepages-2Mi"), "2Gi".into()),
            (format!("{TAG_RESOURCE}bad"), "lots".into()),
        ]),
        ..Default::default()
    };
    let launch = LaunchData {
        user_data: Some("/etc/eks/bootstrap.sh c --kubelet-extra-args '--node-labels=team=userdata,ud=1,tagged=ud --register-with-taints=k=ud:NoSchedule --max-pods=17'".into()),
        volumes: vec![vol("/dev/xvda", Some(100))],
        ..Default::default()
    };
    let g = asg(&[
        ("eks:nodegroup-name", "ng-1"),
        ("k8s.io/cluster-autoscaler/node-template/label/team", "tag"),
        (
            "k8s.io/cluster-autoscaler/node-template/label/tagged",
            "tag",
        ),
        (
            "k8s.io/cluster-autoscaler/node-template/label/eks.amazonaws.com/capacityType",
            "ON_DEMAND",
        ),
        (
            "k8s.io/cluster-autoscaler/node-template/taint/k",
            "tag:NoSchedule",
        ),
        (
            "k8s.io/cluster-autoscaler/node-template/taint/other",
            ":NoExecute",
        ),
        (
            "k8s.io/cluster-autoscaler/node-template/resources/hugepages-2Mi",
            "1Gi",
        ),
        (
            "k8s.io/cluster-autoscaler/node-template/resources/example.com/dongle",
            "2",
        ),
    ]);
    let n = build(
        &g,
        &launch,
        &m5_large(),
        Some(&eks),
        &TemplateOverrides::default(),
    );
    // The node group's labels win over ASG tags (as in-tree), tags over user data.
    assert_eq!(n.labels["team"], "eks");
    assert_eq!(n.labels["tagged"], "tag");
    assert_eq!(n.labels["from-eks"], "yes");
    assert_eq!(n.labels["ud"], "1");
    assert_eq!(n.labels["eks.amazonaws.com/nodegroup"], "ng-1");
    assert_eq!(n.labels["eks.amazonaws.com/capacityType"], "SPOT");
    let k: Vec<_> = n.taints.iter().filter(|t| t.key == "k").collect();
    assert_eq!(k.len(), 1);
    assert_eq!(k[0].value, "eks");
    assert!(n
        .taints
        .iter()
        .any(|t| t.key == "other" && t.effect == "NoExecute" && t.value.is_empty()));
    assert_eq!(n.capacity["pods"], "17", "--max-pods from user data");
    assert_eq!(n.capacity["ephemeral-storage"], "100Gi");
    // The node group's resource tags win over the ASG's; the ASG's others stay.
    assert_eq!(n.capacity["hugepages-2Mi"], "2Gi");
    assert_eq!(n.allocatable["hugepages-2Mi"], "2Gi");
    assert_eq!(n.capacity["example.com/dongle"], "2");
    assert!(!n.capacity.contains_key("bad"));
    assert!(
        n.warnings
            .iter()
            .any(|w| w.contains("bad") && w.contains("lots")),
        "{:?}",
        n.warnings
    );
}

#[test]
fn ephemeral_storage_comes_from_the_volume_kubelet_uses() {
    let cases: [(&[BlockVolume], bool, Option<i64>); 8] = [
        (&[], false, None),
        (&[vol("/dev/xvda", Some(50))], false, Some(50)),
        (&[vol("/dev/sda1", Some(60))], false, Some(60)),
        (
            &[vol("/dev/sdf", Some(30)), vol("/dev/xvda", Some(70))],
            false,
            Some(70),
        ),
        (&[vol("/dev/sdf", Some(30))], false, Some(30)),
        // Bottlerocket: the OS volume is small; kubelet's data volume counts.
        (
            &[vol("/dev/xvda", Some(4)), vol("/dev/xvdb", Some(200))],
            true,
            Some(200),
        ),
        // Bottlerocket that keeps the AMI's data volume size: unknown here.
        (&[vol("/dev/xvda", Some(4))], true, None),
        (&[vol("/dev/xvda", None)], false, None),
    ];
    for (volumes, bottlerocket, want) in cases {
        assert_eq!(
            ephemeral_volume_gib(volumes, bottlerocket),
            want,
            "{volumes:?} bottlerocket={bottlerocket}"
        );
    }
}

#[test]
fn bottlerocket_templates_count_the_data_volume() {
    let volumes = vec![vol("/dev/xvda", Some(4)), vol("/dev/xvdb", Some(120))];
    let toml = LaunchData {
        user_data: Some("[settings.kubernetes]\ncluster-name = \"c\"\n".into()),
        volumes: volumes.clone(),
        ..Default::default()
    };
    let no_user_data = LaunchData {
        volumes,
        ..Default::default()
    };
    let bottlerocket_ami = EksNodegroup {
        ami_type: Some("BOTTLEROCKET_ARM_64".into()),
        ..Default::default()
    };
    let disk_80 = EksNodegroup {
        disk_size_gib: Some(80),
        ..Default::default()
    };
    let cases: [(&str, &LaunchData, Option<&EksNodegroup>, &str); 4] = [
        ("Bottlerocket's TOML user data", &toml, None, "120Gi"),
        // Known from the EKS node group's AMI type, without user data.
        (
            "the AMI type",
            &no_user_data,
            Some(&bottlerocket_ami),
            "120Gi",
        ),
        // Not Bottlerocket: the root volume.
        ("not Bottlerocket", &no_user_data, None, "4Gi"),
        // A managed node group without a launch template: its disk size.
        (
            "a disk size",
            &LaunchData::default(),
            Some(&disk_80),
            "80Gi",
        ),
    ];
    for (case, launch, eks, want) in cases {
        let n = plain(launch, &m5_large(), eks);
        assert_eq!(n.capacity["ephemeral-storage"], want, "{case}");
    }
}

#[test]
fn attribute_based_groups_are_sized_at_the_requirements_minimums() {
    let req = InstanceRequirements {
        vcpu_min: 4,
        vcpu_max: Some(8),
        memory_mib_min: 12288,
        nvidia_gpus_min: Some(2),
        ..Default::default()
    };
    let it = InstanceTypeInfo {
        name: "g4dn.2xlarge".into(),
        vcpus: 8,
        memory_mib: 32768,
        gpus: 1,
        gpu_type: Some("nvidia-tesla-t4".into()),
        architecture: "amd64".into(),
        ..Default::default()
    };
    let n = build_template(&TemplateInputs {
        group: &asg(&[]),
        region: "us-east-1",
        launch: &LaunchData::default(),
        instance_type: &it,
        eks: None,
        requirements: Some(&req),
        overrides: &TemplateOverrides::default(),
    })
    .unwrap();
    assert_eq!(n.capacity["cpu"], "4");
    // The requirements' 12288 MiB minimum, less ceil(7.5 %) = 922.
    assert_eq!(n.capacity["memory"], "11366Mi");
    assert_eq!(n.capacity["nvidia.com/gpu"], "2");
    assert_eq!(n.labels["node.kubernetes.io/instance-type"], "g4dn.2xlarge");
    assert_eq!(n.labels[GPU_LABEL], "nvidia-tesla-t4");
    let cpu_millis: i64 = n.allocatable["cpu"].trim_end_matches('m').parse().unwrap();
    assert!(
        cpu_millis < 4000,
        "allocatable from the minimum: {cpu_millis}m"
    );
}

#[test]
fn config_overrides_win_and_bad_entries_become_warnings() {
    let g = asg(&[
        ("k8s.io/cluster-autoscaler/node-template/label/team", "tag"),
        (
            "k8s.io/cluster-autoscaler/node-template/taint/bad",
            "v:Sometimes",
        ),
        (
            "k8s.io/cluster-autoscaler/node-template/resources/foo",
            "lots",
        ),
    ]);
    let o = TemplateOverrides {
        labels: BTreeMap::from([("team".into(), "config".into())]),
        taints: vec!["dedicated=x:NoSchedule".into(), "broken".into()],
        resources: BTreeMap::from([("example.com/dongle".into(), "2".into())]),
        max_pods: Some(58),
        vm_memory_overhead_percent: Some(2.5),
    };
    let n = build(&g, &LaunchData::default(), &m5_large(), None, &o);
    // 8192 less ceil(2.5 % of it) = 205; less 11 x 58 + 255 kube-reserved and 100.
    assert_eq!(n.capacity["memory"], "7987Mi");
    assert_eq!(n.allocatable["memory"], format!("{}Mi", 7987 - 893 - 100));
    assert_eq!(n.labels["team"], "config");
    assert!(n.taints.iter().any(|t| t.key == "dedicated"));
    assert!(!n.taints.iter().any(|t| t.key == "bad"));
    assert_eq!(n.capacity["pods"], "58");
    assert_eq!(n.capacity["example.com/dongle"], "2");
    assert!(!n.capacity.contains_key("foo"));
    assert_eq!(n.warnings.len(), 3, "{:?}", n.warnings);
    assert!(n.warnings.iter().any(|w| w.contains("Sometimes")));
    assert!(n.warnings.iter().any(|w| w.contains("lots")));
    assert!(n.warnings.iter().any(|w| w.contains("broken")));
}

#[test]
fn arm_and_empty_types() {
    let it = InstanceTypeInfo {
        name: "m6g.large".into(),
        vcpus: 2,
        memory_mib: 8192,
        architecture: "arm64".into(),
        ..Default::default()
    };
    let n = plain(&LaunchData::default(), &it, None);
    assert_eq!(n.labels["kubernetes.io/arch"], "arm64");
    let bad = InstanceTypeInfo {
        name: "x".into(),
        ..Default::default()
    };
    let e = build_template(&TemplateInputs {
        group: &asg(&[]),
        region: "r",
        launch: &LaunchData::default(),
        instance_type: &bad,
        eks: None,
        requirements: None,
        overrides: &TemplateOverrides::default(),
    })
    .unwrap_err();
    assert!(e.to_string().contains("x"));
}

#[test]
fn quantities_are_checked() {
    for ok in ["1", "1.5", "100m", "16Gi", "2k", "1E"] {
        assert!(valid_quantity(ok), "{ok}");
    }
    for bad in ["", "Gi", "1 Gi", "1.2.3", "1Xi", "-1"] {
        assert!(!valid_quantity(bad), "{bad}");
    }
}

#[test]
fn zone_pick_balances() {
    let mut g = asg(&[]);
    g.instances.clear();
    assert_eq!(pick_zone(&g).as_deref(), Some("us-east-1a"));
    g.availability_zones.clear();
    assert_eq!(pick_zone(&g), None);
}

#[test]
fn amd_and_habana_gpus_get_their_own_resource_names() {
    for (maker, model, resource) in [
        ("AMD", "amd-radeon-pro-v520", "amd.com/gpu"),
        ("Habana", "habana-gaudi-hl-205", "habana.ai/gaudi"),
        ("NVIDIA", "nvidia-tesla-t4", "nvidia.com/gpu"),
    ] {
        let it = InstanceTypeInfo {
            name: "x.xlarge".into(),
            vcpus: 4,
            memory_mib: 16384,
            gpus: 2,
            gpu_type: Some(model.into()),
            gpu_manufacturer: Some(maker.into()),
            architecture: "amd64".into(),
            ..Default::default()
        };
        let n = plain(&LaunchData::default(), &it, None);
        assert_eq!(
            n.capacity.get(resource).map(String::as_str),
            Some("2"),
            "{maker}"
        );
        assert_eq!(n.allocatable.get(resource).map(String::as_str), Some("2"));
        let gpu_like = n
            .capacity
            .keys()
            .filter(|k| k.ends_with("/gpu") || k.ends_with("/gaudi"))
            .count();
        assert_eq!(
            gpu_like, 1,
            "{maker}: only its own resource: {:?}",
            n.capacity
        );
        assert_eq!(n.labels[GPU_LABEL], model);
    }
}

#[test]
fn gpu_resource_names_by_maker() {
    assert_eq!(gpu_resource_name("NVIDIA"), Some("nvidia.com/gpu"));
    assert_eq!(gpu_resource_name("nvidia"), Some("nvidia.com/gpu"));
    assert_eq!(gpu_resource_name("AMD"), Some("amd.com/gpu"));
    assert_eq!(gpu_resource_name(" amd "), Some("amd.com/gpu"));
    assert_eq!(gpu_resource_name("Habana"), Some("habana.ai/gaudi"));
    for unknown in ["", "Xilinx", "Intel", "gpu", "nvidia.com/gpu", "AMDX"] {
        assert_eq!(gpu_resource_name(unknown), None, "{unknown:?}");
    }
}

#[test]
fn node_os_from_the_ami_type_then_the_user_data() {
    use NodeOs::*;
    let ami_types = [
        (None, None),
        (Some(""), None),
        (Some("CUSTOM"), None),
        (Some("custom"), None),
        (Some("AL2_x86_64"), Some(Linux)),
        (Some("AL2023_ARM_64_STANDARD"), Some(Linux)),
        (Some("BOTTLEROCKET_x86_64_NVIDIA"), Some(Linux)),
        (Some("WINDOWS_CORE_2019_x86_64"), Some(Windows)),
        (Some("WINDOWS_FULL_2022_x86_64"), Some(Windows)),
        (Some("windows_core_2022_x86_64"), Some(Windows)),
    ];
    for (ami, decided) in ami_types {
        for ud_windows in [false, true] {
            let want = decided.unwrap_or(if ud_windows { Windows } else { Linux });
            assert_eq!(node_os(ami, ud_windows), want, "{ami:?} {ud_windows}");
        }
    }
    assert_eq!(
        windows_build(Some("WINDOWS_CORE_2019_x86_64")),
        Some("10.0.17763")
    );
    assert_eq!(
        windows_build(Some("WINDOWS_FULL_2022_x86_64")),
        Some("10.0.20348")
    );
    assert_eq!(windows_build(Some("WINDOWS_CORE_2035_x86_64")), None);
    assert_eq!(windows_build(Some("AL2_x86_2019_64")), None);
    assert_eq!(windows_build(None), None);
    assert_eq!(windows_max_pods(10), Some(9));
    assert_eq!(windows_max_pods(1), None);
    assert_eq!(windows_max_pods(-3), None);
}

const WINDOWS_USER_DATA: &str = "<powershell>\n[string]$EKSBootstrapScriptFile = \"$env:ProgramFiles\\Amazon\\EKS\\Start-EKSBootstrap.ps1\"\n& $EKSBootstrapScriptFile -EKSClusterName demo -KubeletExtraArgs '--node-labels=team=win --register-with-taints=os=windows:NoSchedule' 3>&1 4>&1 5>&1 6>&1\n</powershell>\n";

#[test]
fn windows_groups_template_windows_nodes() {
    // Self-managed: the launch template's PowerShell user data says Windows.
    let launch = LaunchData {
        user_data: Some(WINDOWS_USER_DATA.into()),
        ..Default::default()
    };
    let n = plain(&launch, &m5_large(), None);
    assert_eq!(n.labels[OS_LABEL], "windows");
    assert_eq!(n.labels["beta.kubernetes.io/os"], "windows");
    assert_eq!(n.labels["team"], "win", "-KubeletExtraArgs is read");
    assert!(n
        .taints
        .iter()
        .any(|t| t.key == "os" && t.effect == "NoSchedule"));
    // One ENI of 10 IPv4 addresses, less its own.
    assert_eq!(n.capacity["pods"], "9");
    assert!(!n.labels.contains_key(WINDOWS_BUILD_LABEL));
    // An EKS managed node group: its AMI type says Windows and which build.
    let eks = EksNodegroup {
        ami_type: Some("WINDOWS_CORE_2022_x86_64".into()),
        ..Default::default()
    };
    let n = plain(&LaunchData::default(), &m5_large(), Some(&eks));
    assert_eq!(n.labels[OS_LABEL], "windows");
    assert_eq!(n.labels[WINDOWS_BUILD_LABEL], "10.0.20348");
    // A Linux AMI type wins over user data that merely mentions PowerShell.
    let eks = EksNodegroup {
        ami_type: Some("AL2023_x86_64_STANDARD".into()),
        ..Default::default()
    };
    let n = plain(&launch, &m5_large(), Some(&eks));
    assert_eq!(n.labels[OS_LABEL], "linux");
    assert_eq!(n.capacity["pods"], "29");
}

#[test]
fn template_memory_never_exceeds_nominal_less_the_overhead() {
    // Every size of every architecture at several overheads: capacity is the
    // nominal less at least the overhead (and the CMA on arm64), allocatable less
    // again, both never negative.
    for arch in ["amd64", "arm64"] {
        for nominal in (0..=4096).chain([8192, 16384, 65536, 786_432, 24_576 * 1024]) {
            for pct in [0.0, 0.5, 2.5, 7.5, 10.0, 50.0] {
                let cap = allocatable::memory_capacity_mib(nominal, arch, pct);
                let cma = if arch == "arm64" {
                    allocatable::ARM64_CMA_MIB
                } else {
                    0
                };
                let base = (nominal - cma).max(0);
                let overhead = base - cap;
                assert!(cap >= 0 && cap <= base, "{arch} {nominal} {pct}");
                // The overhead is the percent rounded up, not down.
                assert!(
                    overhead as f64 >= base as f64 * pct / 100.0 - 1e-9,
                    "{arch} {nominal} {pct}"
                );
                assert!(
                    (overhead as f64) < base as f64 * pct / 100.0 + 1.0,
                    "{arch} {nominal} {pct}"
                );
            }
        }
    }
}

fn with_user_data(ud: &str) -> TemplateNode {
    let launch = LaunchData {
        user_data: Some(ud.into()),
        ..Default::default()
    };
    plain(&launch, &m5_large(), None)
}

#[test]
fn nodeadm_register_with_taints_are_the_templates_taints() {
    let n = with_user_data(
        "apiVersion: node.eks.aws/v1alpha1\nkind: NodeConfig\nspec:\n  cluster:\n    name: c\n  kubelet:\n    config:\n      maxPods: 20\n      registerWithTaints:\n        - key: nvidia.com/gpu\n          value: \"true\"\n          effect: NoSchedule\n",
    );
    assert_eq!(
        n.taints,
        vec![Taint {
            key: "nvidia.com/gpu".into(),
            value: "true".into(),
            effect: "NoSchedule".into()
        }]
    );
    assert_eq!(n.capacity["pods"], "20");
    assert!(
        n.user_data_warnings.is_empty(),
        "{:?}",
        n.user_data_warnings
    );
}

#[test]
fn reservations_from_user_data_set_allocatable() {
    // m5.large: 7577Mi capacity, 29 pods, 20Gi root volume.
    let n = with_user_data(
        "#!/bin/bash\n/etc/eks/bootstrap.sh c --kubelet-extra-args '--kube-reserved=cpu=250m,memory=1Gi --system-reserved=memory=256Mi,ephemeral-storage=1Gi --eviction-hard=memory.available<500Mi,nodefs.available<5%'\n",
    );
    assert_eq!(n.allocatable["cpu"], "1750m");
    assert_eq!(
        n.allocatable["memory"],
        format!("{}Mi", 7577 - 1024 - 256 - 500)
    );
    // 20480 less 1024 kube-reserved (default), 1024 system, 5 % (1024).
    assert_eq!(
        n.allocatable["ephemeral-storage"],
        format!("{}Mi", 20480 - 1024 - 1024 - 1024)
    );
    assert!(n.warnings.is_empty(), "{:?}", n.warnings);
}

#[test]
fn pods_per_core_and_use_max_pods_false_set_max_pods() {
    let n = with_user_data("/etc/eks/bootstrap.sh c --kubelet-extra-args '--pods-per-core=5'\n");
    assert_eq!(n.capacity["pods"], "10", "5 per core x 2 vCPUs, below 29");
    let n = with_user_data("/etc/eks/bootstrap.sh c --use-max-pods false\n");
    assert_eq!(n.capacity["pods"], "110", "kubelet's own default");
    // kube-reserved memory still from the ENI number (29): 574.
    assert_eq!(n.allocatable["memory"], format!("{}Mi", 7577 - 574 - 100));
    let n = with_user_data(
        "/etc/eks/bootstrap.sh c --use-max-pods false --kubelet-extra-args '--max-pods=50'\n",
    );
    assert_eq!(n.capacity["pods"], "50");
}

#[test]
fn unread_user_data_settings_are_kept_apart_from_tag_warnings() {
    let g = asg(&[(
        "k8s.io/cluster-autoscaler/node-template/resources/foo",
        "lots",
    )]);
    let launch = LaunchData {
        user_data: Some(
            "/etc/eks/bootstrap.sh c --kubelet-extra-args '--reserved-cpus=0 --node-label=a=b'\n"
                .into(),
        ),
        ..Default::default()
    };
    let n = build(
        &g,
        &launch,
        &m5_large(),
        None,
        &TemplateOverrides::default(),
    );
    assert_eq!(n.user_data_warnings.len(), 2, "{:?}", n.user_data_warnings);
    assert_eq!(n.warnings.len(), 3, "{:?}", n.warnings);
    assert!(n
        .user_data_warnings
        .iter()
        .all(|w| w.starts_with("group g: user data")));
}

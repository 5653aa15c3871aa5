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

#[test]
fn standard_labels_capacity_and_allocatable() {
    let n = build(
        &asg(&[]),
        &LaunchData::default(),
        &m5_large(),
        None,
        &TemplateOverrides::default(),
    );
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
    assert_eq!(n.capacity["memory"], "8192Mi");
    assert_eq!(n.capacity["pods"], "29");
    assert_eq!(n.capacity["ephemeral-storage"], "20Gi");
    assert_eq!(n.allocatable["cpu"], "1930m");
    assert_eq!(n.allocatable["memory"], "7518Mi");
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
    let n = build(
        &asg(&[]),
        &LaunchData::default(),
        &it,
        None,
        &TemplateOverrides::default(),
    );
    assert_eq!(n.labels[GPU_LABEL], "nvidia-tesla-t4");
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
    let n = build(
        &asg(&[]),
        &toml,
        &m5_large(),
        None,
        &TemplateOverrides::default(),
    );
    assert_eq!(n.capacity["ephemeral-storage"], "120Gi");
    // Known from the EKS node group's AMI type, without user data.
    let eks = EksNodegroup {
        ami_type: Some("BOTTLEROCKET_ARM_64".into()),
        ..Default::default()
    };
    let plain = LaunchData {
        volumes,
        ..Default::default()
    };
    let n = build(
        &asg(&[]),
        &plain,
        &m5_large(),
        Some(&eks),
        &TemplateOverrides::default(),
    );
    assert_eq!(n.capacity["ephemeral-storage"], "120Gi");
    // Not Bottlerocket: the root volume.
    let n = build(
        &asg(&[]),
        &plain,
        &m5_large(),
        None,
        &TemplateOverrides::default(),
    );
    assert_eq!(n.capacity["ephemeral-storage"], "4Gi");
    // A managed node group without a launch template: its disk size.
    let eks = EksNodegroup {
        disk_size_gib: Some(80),
        ..Default::default()
    };
    let n = build(
        &asg(&[]),
        &LaunchData::default(),
        &m5_large(),
        Some(&eks),
        &TemplateOverrides::default(),
    );
    assert_eq!(n.capacity["ephemeral-storage"], "80Gi");
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
    assert_eq!(n.capacity["memory"], "12288Mi");
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
    };
    let n = build(&g, &LaunchData::default(), &m5_large(), None, &o);
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
    let n = build(
        &asg(&[]),
        &LaunchData::default(),
        &it,
        None,
        &TemplateOverrides::default(),
    );
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

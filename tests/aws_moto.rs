//! The AWS backend through the real SDK against moto.

mod support;

use std::sync::Arc;

use aws_sdk_autoscaling as asg;
use aws_sdk_ec2 as ec2;
use base64::Engine as _;
use ca_asg_provider::cloud::aws::AwsCloud;
use ca_asg_provider::cloud::{
    Cloud, CloudError, GroupSelector, LaunchSpec, LaunchTemplateRef, LifecycleHook, LifecycleState,
    TagFilter,
};
use ca_asg_provider::provider::{Provider, ProviderSettings};
use support::moto::MotoServer;

const AMI: &str = "ami-12c6146b";
const USER_DATA: &str = "#!/bin/bash\n/etc/eks/bootstrap.sh prod --kubelet-extra-args '--node-labels=team=web --register-with-taints=dedicated=web:NoSchedule'\n";

struct Env {
    _moto: MotoServer,
    asg: asg::Client,
    ec2: ec2::Client,
    cloud: AwsCloud,
}

async fn env() -> Env {
    let moto = MotoServer::start();
    let cfg = moto.sdk_config().await;
    Env {
        asg: asg::Client::new(&cfg),
        ec2: ec2::Client::new(&cfg),
        cloud: AwsCloud::from_sdk_config(&cfg),
        _moto: moto,
    }
}

async fn launch_template(e: &Env, name: &str, itype: &str, user_data: Option<&str>) {
    let mut data = ec2::types::RequestLaunchTemplateData::builder()
        .image_id(AMI)
        .instance_type(ec2::types::InstanceType::from(itype))
        .block_device_mappings(
            ec2::types::LaunchTemplateBlockDeviceMappingRequest::builder()
                .device_name("/dev/xvda")
                .ebs(
                    ec2::types::LaunchTemplateEbsBlockDeviceRequest::builder()
                        .volume_size(100)
                        .build(),
                )
                .build(),
        );
    if let Some(u) = user_data {
        data = data.user_data(base64::engine::general_purpose::STANDARD.encode(u));
    }
    e.ec2
        .create_launch_template()
        .launch_template_name(name)
        .launch_template_data(data.build())
        .send()
        .await
        .unwrap();
}

async fn group(e: &Env, name: &str, lt: &str, desired: i32, tags: &[(&str, &str)]) {
    let req = support::moto::group_on(&e.asg, name, lt, "$Default").desired_capacity(desired);
    support::moto::tagged(req, name, tags).send().await.unwrap();
}

/// A provider over `cloud`'s groups tagged `k8s.io/cluster-autoscaler/enabled`.
async fn autoscaler_enabled(cloud: AwsCloud) -> Arc<Provider> {
    ca_asg_provider::world::provider(
        Arc::new(cloud),
        discovery(&[("k8s.io/cluster-autoscaler/enabled", None)]),
    )
    .await
    .unwrap()
}

/// EKS cluster `prod` in subnet-1.
async fn cluster_prod(eks: &aws_sdk_eks::Client) {
    eks.create_cluster()
        .name("prod")
        .role_arn("arn:aws:iam::123456789012:role/eks")
        .resources_vpc_config(
            aws_sdk_eks::types::VpcConfigRequest::builder()
                .subnet_ids("subnet-1")
                .build(),
        )
        .send()
        .await
        .unwrap();
}

/// The request that creates managed node group `name` of cluster `prod` (subnet-1);
/// the caller may add to it, then sends it.
fn nodegroup_of_prod(
    eks: &aws_sdk_eks::Client,
    name: &str,
) -> aws_sdk_eks::operation::create_nodegroup::builders::CreateNodegroupFluentBuilder {
    eks.create_nodegroup()
        .cluster_name("prod")
        .nodegroup_name(name)
        .node_role("arn:aws:iam::123456789012:role/node")
        .subnets("subnet-1")
}

fn discovery(terms: &[(&str, Option<&str>)]) -> GroupSelector {
    GroupSelector {
        names: vec![],
        tag_sets: vec![terms
            .iter()
            .map(|(k, v)| TagFilter {
                key: k.to_string(),
                value: v.map(str::to_string),
            })
            .collect()],
    }
}

#[tokio::test]
async fn describes_groups_by_name_with_instances_tags_and_launch_template() {
    let e = env().await;
    launch_template(&e, "lt-web", "m5.large", Some(USER_DATA)).await;
    group(&e, "web", "lt-web", 2, &[("team", "web")]).await;
    group(&e, "other", "lt-web", 0, &[]).await;
    let sel = ca_asg_provider::world::named(&["web", "missing"]);
    let gs = e.cloud.describe_groups(&sel).await.unwrap();
    assert_eq!(gs.len(), 1);
    let g = &gs[0];
    assert_eq!(
        (g.name.as_str(), g.min_size, g.max_size, g.desired_capacity),
        ("web", 0, 10, 2)
    );
    assert_eq!(g.tags["team"], "web");
    assert_eq!(g.instances.len(), 2);
    assert!(g
        .instances
        .iter()
        .all(|i| i.id.starts_with("i-") && i.zone == "us-east-1a"));
    assert!(
        g.instances
            .iter()
            .all(|i| i.state == LifecycleState::InService),
        "{:?}",
        g.instances
    );
    match &g.launch {
        LaunchSpec::LaunchTemplate(r) => assert_eq!(r.name.as_deref(), Some("lt-web")),
        other => panic!("launch spec {other:?}"),
    }
}

#[tokio::test]
async fn discovery_by_tag_needs_every_term_and_pages_past_100_groups() {
    let e = env().await;
    launch_template(&e, "lt", "m5.large", None).await;
    for i in 0..250 {
        group(
            &e,
            &format!("asg-{i:03}"),
            "lt",
            0,
            &[
                ("k8s.io/cluster-autoscaler/enabled", "true"),
                ("k8s.io/cluster-autoscaler/prod", "owned"),
            ],
        )
        .await;
    }
    group(
        &e,
        "staging",
        "lt",
        0,
        &[
            ("k8s.io/cluster-autoscaler/enabled", "true"),
            ("env", "staging"),
        ],
    )
    .await;
    group(&e, "untagged", "lt", 0, &[]).await;
    let before = e.cloud.calls().count("DescribeAutoScalingGroups");
    let gs = e
        .cloud
        .describe_groups(&discovery(&[
            ("k8s.io/cluster-autoscaler/enabled", None),
            ("k8s.io/cluster-autoscaler/prod", None),
        ]))
        .await
        .unwrap();
    assert_eq!(gs.len(), 250);
    assert!(gs.iter().all(|g| g.name.starts_with("asg-")));
    assert_eq!(
        e.cloud.calls().count("DescribeAutoScalingGroups") - before,
        3,
        "ceil(250/100) pages"
    );
    // key=value terms.
    let gs = e
        .cloud
        .describe_groups(&discovery(&[("env", Some("staging"))]))
        .await
        .unwrap();
    assert_eq!(
        gs.iter().map(|g| g.name.as_str()).collect::<Vec<_>>(),
        vec!["staging"]
    );
    let gs = e
        .cloud
        .describe_groups(&discovery(&[("env", Some("prod"))]))
        .await
        .unwrap();
    assert!(gs.is_empty());
}

#[tokio::test]
async fn static_names_are_batched_by_100() {
    let e = env().await;
    launch_template(&e, "lt", "m5.large", None).await;
    let names: Vec<String> = (0..120).map(|i| format!("g-{i}")).collect();
    for n in &names {
        group(&e, n, "lt", 0, &[]).await;
    }
    let before = e.cloud.calls().count("DescribeAutoScalingGroups");
    let gs = e
        .cloud
        .describe_groups(&GroupSelector {
            names: names.clone(),
            tag_sets: vec![],
        })
        .await
        .unwrap();
    assert_eq!(gs.len(), 120);
    assert_eq!(
        e.cloud.calls().count("DescribeAutoScalingGroups") - before,
        2
    );
}

#[tokio::test]
async fn launch_template_versions_user_data_and_root_volume() {
    let e = env().await;
    launch_template(&e, "lt", "m5.large", Some(USER_DATA)).await;
    e.ec2
        .create_launch_template_version()
        .launch_template_name("lt")
        .launch_template_data(
            ec2::types::RequestLaunchTemplateData::builder()
                .image_id(AMI)
                .instance_type(ec2::types::InstanceType::M5Xlarge)
                .build(),
        )
        .send()
        .await
        .unwrap();
    let r = |v: Option<&str>| LaunchTemplateRef {
        id: None,
        name: Some("lt".into()),
        version: v.map(str::to_string),
    };
    let d = e.cloud.launch_template(&r(None)).await.unwrap();
    assert_eq!(d.instance_type.as_deref(), Some("m5.large"));
    assert_eq!(d.user_data.as_deref(), Some(USER_DATA));
    assert_eq!(d.volumes.len(), 1);
    assert_eq!(d.volumes[0].device, "/dev/xvda");
    assert_eq!(d.volumes[0].size_gib, Some(100));
    assert_eq!(d.image_id.as_deref(), Some(AMI));
    let v2 = e.cloud.launch_template(&r(Some("2"))).await.unwrap();
    assert_eq!(v2.instance_type.as_deref(), Some("m5.xlarge"));
    let latest = e.cloud.launch_template(&r(Some("$Latest"))).await.unwrap();
    assert_eq!(latest.instance_type.as_deref(), Some("m5.xlarge"));
    let err = e
        .cloud
        .launch_template(&LaunchTemplateRef {
            id: None,
            name: Some("nope".into()),
            version: None,
        })
        .await
        .unwrap_err();
    assert!(!matches!(err, CloudError::Throttled { .. }), "{err:?}");
}

#[tokio::test]
async fn desired_capacity_terminate_with_decrement_and_locate() {
    let e = env().await;
    launch_template(&e, "lt", "m5.large", None).await;
    group(&e, "web", "lt", 1, &[]).await;
    e.cloud.set_desired_capacity("web", 3).await.unwrap();
    let sel = ca_asg_provider::world::named(&["web"]);
    let g = e.cloud.describe_groups(&sel).await.unwrap().remove(0);
    assert_eq!(g.desired_capacity, 3);
    assert_eq!(g.instances.len(), 3);
    let victim = g.instances[0].id.clone();
    let found = e
        .cloud
        .locate_instances(&[victim.clone(), "i-0000000000000beef".into()])
        .await
        .unwrap();
    assert_eq!(found.len(), 1);
    assert_eq!(
        (found[0].instance_id.as_str(), found[0].group.as_str()),
        (victim.as_str(), "web")
    );
    e.cloud.terminate_instance(&victim, true).await.unwrap();
    let g = e.cloud.describe_groups(&sel).await.unwrap().remove(0);
    assert_eq!(g.desired_capacity, 2, "decremented");
    assert!(g
        .instances
        .iter()
        .filter(|i| !i.state.is_terminating())
        .all(|i| i.id != victim));
}

#[tokio::test]
async fn instance_types_with_gpus_arm_and_an_unknown_name() {
    let e = env().await;
    let names: Vec<String> = ["m5.large", "g4dn.xlarge", "m6g.large", "x9.nonexistent"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let mut got = e.cloud.instance_types(&names).await.unwrap();
    got.sort_by(|a, b| a.name.cmp(&b.name));
    let by = |n: &str| {
        got.iter()
            .find(|t| t.name == n)
            .unwrap_or_else(|| panic!("{n} missing from {got:?}"))
    };
    assert_eq!(got.len(), 3, "{got:?}");
    let m5 = by("m5.large");
    assert_eq!(
        (m5.vcpus, m5.memory_mib, m5.architecture.as_str()),
        (2, 8192, "amd64")
    );
    assert_eq!((m5.max_enis, m5.ipv4_per_eni), (Some(3), Some(10)));
    let g4 = by("g4dn.xlarge");
    assert_eq!(g4.gpus, 1);
    assert!(
        g4.gpu_type.as_deref().unwrap().contains("t4"),
        "{:?}",
        g4.gpu_type
    );
    // The maker decides the device plugin's resource (nvidia.com/gpu here).
    assert_eq!(g4.gpu_manufacturer.as_deref(), Some("NVIDIA"));
    assert_eq!(by("m6g.large").architecture, "arm64");
}

#[tokio::test]
async fn launch_configuration_and_lifecycle_hooks() {
    let e = env().await;
    e.asg
        .create_launch_configuration()
        .launch_configuration_name("lc")
        .image_id(AMI)
        .instance_type("c5.xlarge")
        .user_data(base64::engine::general_purpose::STANDARD.encode(USER_DATA))
        .send()
        .await
        .unwrap();
    e.asg
        .create_auto_scaling_group()
        .auto_scaling_group_name("legacy")
        .launch_configuration_name("lc")
        .min_size(0)
        .max_size(3)
        .availability_zones("us-east-1a")
        .send()
        .await
        .unwrap();
    let d = e.cloud.launch_configuration("lc").await.unwrap();
    assert_eq!(d.instance_type.as_deref(), Some("c5.xlarge"));
    assert_eq!(d.user_data.as_deref(), Some(USER_DATA));
    let g = e
        .cloud
        .describe_groups(&ca_asg_provider::world::named(&["legacy"]))
        .await
        .unwrap()
        .remove(0);
    assert_eq!(g.launch, LaunchSpec::LaunchConfiguration("lc".into()));
    assert!(e
        .cloud
        .terminating_hooks("legacy")
        .await
        .unwrap()
        .is_empty());
    let hook = LifecycleHook {
        name: "drain".into(),
        heartbeat_timeout_secs: 300,
        default_result: "CONTINUE".into(),
    };
    e.cloud.put_terminating_hook("legacy", &hook).await.unwrap();
    assert_eq!(
        e.cloud.terminating_hooks("legacy").await.unwrap(),
        vec![hook]
    );
}

#[tokio::test]
async fn provider_over_moto_builds_templates_with_one_type_lookup_per_type() {
    let e = env().await;
    launch_template(&e, "lt-web", "m5.large", Some(USER_DATA)).await;
    launch_template(&e, "lt-gpu", "g4dn.xlarge", None).await;
    for i in 0..6 {
        let lt = if i % 2 == 0 { "lt-web" } else { "lt-gpu" };
        group(
            &e,
            &format!("g{i}"),
            lt,
            0,
            &[
                ("k8s.io/cluster-autoscaler/enabled", "true"),
                (
                    "k8s.io/cluster-autoscaler/node-template/label/pool",
                    &format!("p{i}"),
                ),
            ],
        )
        .await;
    }
    let counter = e.cloud.calls();
    let cloud = Arc::new(e.cloud);
    let settings = ProviderSettings {
        selector: discovery(&[("k8s.io/cluster-autoscaler/enabled", None)]),
        ..ProviderSettings::default()
    };
    let p = Provider::new(cloud, settings);
    p.refresh_now().await.unwrap();
    assert_eq!(p.node_groups().len(), 6);
    for i in 0..6 {
        let bytes = p.template_node(&format!("g{i}")).await.unwrap();
        let node = <k8s_pb::api::core::v1::Node as prost::Message>::decode(bytes.as_ref()).unwrap();
        let labels = node.metadata.unwrap().labels;
        assert_eq!(labels["pool"], format!("p{i}"));
        if i % 2 == 0 {
            assert_eq!(labels["team"], "web", "from user data");
            assert_eq!(labels["node.kubernetes.io/instance-type"], "m5.large");
        } else {
            assert!(labels["k8s.amazonaws.com/accelerator"].contains("t4"));
        }
    }
    assert!(
        counter.count("DescribeInstanceTypes") <= 2,
        "{:?}",
        counter.snapshot()
    );
    assert_eq!(
        counter.count("DescribeLaunchTemplateVersions"),
        2,
        "one per template, cached"
    );
    // A second round of templates is answered from memory.
    let before = counter.snapshot();
    for i in 0..6 {
        p.template_node(&format!("g{i}")).await.unwrap();
    }
    assert_eq!(counter.snapshot(), before);
}

/// The AWS budget at 250 discovered groups over 20 instance types: the first refresh
/// reads each launch template once and the instance types in one batch; a steady-state
/// refresh is ceil(250/100) DescribeAutoScalingGroups pages and nothing else.
#[tokio::test]
async fn aws_budget_at_250_groups_and_20_instance_types() {
    const TYPES: [&str; 20] = [
        "m5.large",
        "m5.xlarge",
        "m5.2xlarge",
        "m5.4xlarge",
        "c5.large",
        "c5.xlarge",
        "c5.2xlarge",
        "c5.4xlarge",
        "r5.large",
        "r5.xlarge",
        "r5.2xlarge",
        "r5.4xlarge",
        "t3.medium",
        "t3.large",
        "t3.xlarge",
        "m6i.large",
        "m6i.xlarge",
        "c6i.large",
        "c6g.large",
        "m6g.large",
    ];
    let e = env().await;
    for t in TYPES {
        launch_template(&e, &format!("lt-{t}"), t, None).await;
    }
    for i in 0..250 {
        let lt = format!("lt-{}", TYPES[i % TYPES.len()]);
        group(
            &e,
            &format!("asg-{i:03}"),
            &lt,
            0,
            &[("k8s.io/cluster-autoscaler/enabled", "true")],
        )
        .await;
    }
    let counter = e.cloud.calls();
    let p = autoscaler_enabled(e.cloud).await;
    p.templates_prefetched().await;
    assert_eq!(p.node_groups().len(), 250);
    let first = counter.snapshot();
    assert_eq!(
        counter.count("DescribeInstanceTypes"),
        1,
        "one batched lookup for 20 types: {first:?}"
    );
    assert_eq!(
        counter.count("DescribeLaunchTemplateVersions"),
        20,
        "one per launch template: {first:?}"
    );
    // Every template is then answered from memory.
    for i in 0..250 {
        let bytes = p.template_node(&format!("asg-{i:03}")).await.unwrap();
        let node = <k8s_pb::api::core::v1::Node as prost::Message>::decode(bytes.as_ref()).unwrap();
        assert_eq!(
            node.metadata.unwrap().labels["node.kubernetes.io/instance-type"],
            TYPES[i % TYPES.len()]
        );
    }
    assert_eq!(counter.snapshot(), first, "templates made no AWS call");
    // Steady state.
    p.refresh_now().await.unwrap();
    p.templates_prefetched().await;
    let steady: Vec<_> = counter
        .snapshot()
        .into_iter()
        .filter_map(|(k, n)| {
            let d = n - first.get(&k).copied().unwrap_or(0);
            (d > 0).then_some((k.0, d))
        })
        .collect();
    assert_eq!(
        steady,
        vec![("DescribeAutoScalingGroups".to_string(), 3)],
        "steady-state refresh"
    );
}

/// An EKS managed node group's ASG: the template carries what EKS puts on its nodes
/// (capacity type, the node group's labels over ASG tags, its taints, its resource
/// tags), read through DescribeNodegroup.
#[tokio::test]
async fn eks_managed_node_group_templates_carry_capacity_type_labels_taints_and_tags() {
    let e = env().await;
    let cfg = e._moto.sdk_config().await;
    let eks = aws_sdk_eks::Client::new(&cfg);
    cluster_prod(&eks).await;
    nodegroup_of_prod(&eks, "spot-ng")
        .capacity_type(aws_sdk_eks::types::CapacityTypes::Spot)
        .disk_size(60)
        .labels("team", "ml")
        .taints(
            aws_sdk_eks::types::Taint::builder()
                .key("dedicated")
                .value("ml")
                .effect(aws_sdk_eks::types::TaintEffect::NoSchedule)
                .build(),
        )
        .tags(
            "k8s.io/cluster-autoscaler/node-template/resources/hugepages-2Mi",
            "2Gi",
        )
        .send()
        .await
        .unwrap();
    launch_template(&e, "lt-ng", "m5.large", None).await;
    group(
        &e,
        "eks-spot-ng-1234",
        "lt-ng",
        0,
        &[
            ("k8s.io/cluster-autoscaler/enabled", "true"),
            ("eks:cluster-name", "prod"),
            ("eks:nodegroup-name", "spot-ng"),
            (
                "k8s.io/cluster-autoscaler/node-template/label/team",
                "asg-tag",
            ),
            (
                "k8s.io/cluster-autoscaler/node-template/resources/hugepages-2Mi",
                "1Gi",
            ),
        ],
    )
    .await;
    let counter = e.cloud.calls();
    let p = autoscaler_enabled(e.cloud).await;
    let bytes = p.template_node("eks-spot-ng-1234").await.unwrap();
    let node = <k8s_pb::api::core::v1::Node as prost::Message>::decode(bytes.as_ref()).unwrap();
    let labels = node.metadata.unwrap().labels;
    assert_eq!(labels["eks.amazonaws.com/capacityType"], "SPOT");
    assert_eq!(labels["eks.amazonaws.com/nodegroup"], "spot-ng");
    assert_eq!(
        labels["team"], "ml",
        "the node group's label wins over the ASG tag"
    );
    let spec = node.spec.unwrap();
    assert!(
        spec.taints
            .iter()
            .any(|t| t.key.as_deref() == Some("dedicated")
                && t.value.as_deref() == Some("ml")
                && t.effect.as_deref() == Some("NoSchedule")),
        "{:?}",
        spec.taints
    );
    let capacity = node.status.unwrap().capacity;
    assert_eq!(
        capacity["hugepages-2Mi"].string.as_deref(),
        Some("2Gi"),
        "the node group's resource tag wins"
    );
    assert_eq!(counter.count("DescribeNodegroup"), 1);
}

/// `check-config` (the `helm test` Pod's command) against moto, on groups carrying
/// hooks as EKS leaves them: exit 0 with an explanation for a managed node group with
/// EKS's Terminate-LC-Hook and Launch-LC-Hook beside this service's hook; exit 1 for a
/// real second drainer (NTH's hook on a managed node group, EKS's hook name on a group
/// without the EKS tags).
#[tokio::test]
async fn check_config_explains_eks_hooks_on_managed_node_groups_and_fails_on_a_second_drainer() {
    let e = env().await;
    // The managed node group exists: a template built without its DescribeNodegroup
    // answer is a problem of its own (docs/node-groups.md).
    let eks = aws_sdk_eks::Client::new(&e._moto.sdk_config().await);
    cluster_prod(&eks).await;
    nodegroup_of_prod(&eks, "ng-1").send().await.unwrap();
    launch_template(&e, "lt", "m5.large", None).await;
    let eks_tags = [
        ("eks:nodegroup-name", "ng-1"),
        ("eks:cluster-name", "prod"),
        ("k8s.io/cluster-autoscaler/enabled", "true"),
    ];
    group(&e, "eks-ng", "lt", 0, &eks_tags).await;
    group(&e, "eks-ng-nth", "lt", 0, &eks_tags).await;
    group(
        &e,
        "not-eks",
        "lt",
        0,
        &[("k8s.io/cluster-autoscaler/enabled", "true")],
    )
    .await;
    let put = |g: &'static str, name: &'static str, transition: &'static str| {
        e.asg
            .put_lifecycle_hook()
            .auto_scaling_group_name(g)
            .lifecycle_hook_name(name)
            .lifecycle_transition(transition)
            .heartbeat_timeout(1800)
            .default_result("CONTINUE")
            .send()
    };
    const T: &str = "autoscaling:EC2_INSTANCE_TERMINATING";
    const L: &str = "autoscaling:EC2_INSTANCE_LAUNCHING";
    for g in ["eks-ng", "eks-ng-nth", "not-eks"] {
        put(g, "Terminate-LC-Hook", T).await.unwrap();
        put(g, "Launch-LC-Hook", L).await.unwrap();
        put(g, "ca-asg-provider-drain", T).await.unwrap();
    }
    put("eks-ng-nth", "nth-hook", T).await.unwrap();

    let dir = tempfile::tempdir().unwrap();
    let check = |group: &str| {
        let path = dir.path().join(format!("{group}.yaml"));
        std::fs::write(
            &path,
            format!("aws:\n  region: us-east-1\nnodeGroups:\n  - name: {group}\n"),
        )
        .unwrap();
        support::moto::said(
            &mut support::moto::offline("check-config", &e._moto.url, &path, dir.path()),
            group,
        )
    };
    let (code, text) = check("eks-ng");
    assert_eq!(code, Some(0), "{text}");
    support::assert_says(
        &text,
        &[
            "scale-in: lifecycle hook ca-asg-provider-drain",
            "EKS's own hook (managed node group ng-1 of cluster prod)",
            "waits for every hook",
            "Eviction API",
            "does not evict DaemonSet pods",
            "no problems found",
        ],
    );
    assert!(
        !text.contains("another EC2_INSTANCE_TERMINATING hook"),
        "{text}"
    );
    let (code, text) = check("eks-ng-nth");
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains("another EC2_INSTANCE_TERMINATING hook \"nth-hook\""),
        "{text}"
    );
    assert!(
        !text.contains("hook \"Terminate-LC-Hook\" (NTH's"),
        "{text}"
    );
    let (code, text) = check("not-eks");
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains("another EC2_INSTANCE_TERMINATING hook \"Terminate-LC-Hook\"")
            && text.contains("lacks the tags"),
        "{text}"
    );
}

/// Issue 47: a group's warm pool is read from DescribeAutoScalingGroups'
/// WarmPoolConfiguration (state, sizes, reuse on scale-in); a group without one has
/// none.
#[tokio::test]
async fn a_groups_warm_pool_is_read_from_its_description() {
    let e = env().await;
    launch_template(&e, "lt", "m5.large", None).await;
    group(&e, "pooled", "lt", 0, &[]).await;
    group(&e, "plain", "lt", 0, &[]).await;
    e.asg
        .put_warm_pool()
        .auto_scaling_group_name("pooled")
        .min_size(2)
        .max_group_prepared_capacity(6)
        .pool_state(aws_sdk_autoscaling::types::WarmPoolState::Hibernated)
        .instance_reuse_policy(
            aws_sdk_autoscaling::types::InstanceReusePolicy::builder()
                .reuse_on_scale_in(true)
                .build(),
        )
        .send()
        .await
        .unwrap();
    let gs = e
        .cloud
        .describe_groups(&ca_asg_provider::world::named(&["pooled", "plain"]))
        .await
        .unwrap();
    let pool = |name: &str| {
        gs.iter()
            .find(|g| g.name == name)
            .unwrap()
            .warm_pool
            .clone()
    };
    assert_eq!(
        pool("pooled"),
        Some(ca_asg_provider::cloud::WarmPool {
            min_size: 2,
            max_prepared: Some(6),
            pool_state: "Hibernated".into(),
            reuse_on_scale_in: true,
        })
    );
    assert_eq!(pool("plain"), None);
    // DescribeWarmPool as the lifecycle scan sends it: moto keeps no pool instances.
    assert_eq!(e.cloud.warm_pool_instances("pooled").await.unwrap(), vec![]);
}

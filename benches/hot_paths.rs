//! The hot pure paths, measured with criterion (`cargo bench`): providerID -> group at
//! 5,000 nodes, template Node encoding, the options overlay, and drain planning for a
//! node with 110 pods. Numbers are in docs/performance.md.

use std::collections::BTreeMap;
use std::hint::black_box;
use std::sync::Arc;

use ca_asg_provider::cloud::memory::{MemoryCloud, MemoryTiming};
use ca_asg_provider::cloud::{Cloud, Taint};
use ca_asg_provider::provider::options::{overlay_from_tags, AutoscalingOptions, TAG_PREFIX};
use ca_asg_provider::provider::template::encode::encode_node;
use ca_asg_provider::provider::template::TemplateNode;
use ca_asg_provider::provider::{NodeRef, Provider, ProviderSettings};
use ca_asg_provider::scalein::decide::plan::{full_plan, next_step_with, NodeCritical, Phase};
use ca_asg_provider::sim::fixtures;
use criterion::{criterion_group, criterion_main, Criterion};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

fn provider_at_5000() -> (Arc<Provider>, Vec<NodeRef>) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let cloud = MemoryCloud::new(
            ca_asg_provider::cloud::memory::fleet::fleet(200, 5000),
            MemoryTiming::default(),
        );
        let nodes: Vec<NodeRef> = cloud
            .instances()
            .into_iter()
            .map(|(_, i)| NodeRef {
                provider_id: format!("aws:///{}/{}", i.zone, i.id),
                name: format!("ip-{}.ec2.internal", i.id),
            })
            .collect();
        let cloud: Arc<dyn Cloud> = Arc::new(cloud);
        let settings = ProviderSettings {
            selector: ca_asg_provider::world::tagged(&["k8s.io/cluster-autoscaler/enabled"]),
            ..ProviderSettings::default()
        };
        let p = Provider::new(cloud, settings);
        p.refresh_now().await.unwrap();
        (p, nodes)
    })
}

fn group_lookup(c: &mut Criterion) {
    let (p, nodes) = provider_at_5000();
    let mut i = 0;
    c.bench_function("group_for_node (5000 nodes, 200 groups)", |b| {
        b.iter(|| {
            i = (i + 1) % nodes.len();
            black_box(p.group_for_node(black_box(&nodes[i])))
        })
    });
    let unmanaged = NodeRef {
        provider_id: "gce://project/zone/vm".into(),
        name: "vm".into(),
    };
    c.bench_function("group_for_node (not an AWS node)", |b| {
        b.iter(|| black_box(p.group_for_node(black_box(&unmanaged))))
    });
}

fn template_encoding(c: &mut Criterion) {
    let labels: BTreeMap<String, String> = [
        ("kubernetes.io/arch", "amd64"),
        ("kubernetes.io/os", "linux"),
        ("kubernetes.io/hostname", "template-ng-001-1234"),
        ("node.kubernetes.io/instance-type", "m5.2xlarge"),
        ("topology.kubernetes.io/zone", "us-east-1a"),
        ("topology.kubernetes.io/region", "us-east-1"),
        ("eks.amazonaws.com/nodegroup", "ng-001"),
        ("pool", "pool-1"),
        ("team", "platform"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let q = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let node = TemplateNode {
        name: "template-ng-001-1234".into(),
        labels,
        taints: vec![Taint {
            key: "dedicated".into(),
            value: "batch".into(),
            effect: "NoSchedule".into(),
        }],
        capacity: q(&[
            ("cpu", "8"),
            ("memory", "32Gi"),
            ("pods", "58"),
            ("ephemeral-storage", "20Gi"),
        ]),
        allocatable: q(&[
            ("cpu", "7910m"),
            ("memory", "30068Mi"),
            ("pods", "58"),
            ("ephemeral-storage", "18Gi"),
        ]),
        warnings: vec![],
        user_data_warnings: vec![],
    };
    c.bench_function("encode template Node (k8s protobuf)", |b| {
        b.iter(|| black_box(encode_node(black_box(&node))))
    });
}

fn options_overlay(c: &mut Criterion) {
    let defaults = AutoscalingOptions {
        scale_down_utilization_threshold: 0.5,
        scale_down_gpu_utilization_threshold: 0.5,
        scale_down_unneeded_time: Some(std::time::Duration::from_secs(600)),
        scale_down_unready_time: Some(std::time::Duration::from_secs(1200)),
        max_node_provision_time: Some(std::time::Duration::from_secs(900)),
        ..Default::default()
    };
    let mut tags: BTreeMap<String, String> = (0..17)
        .map(|i| (format!("team/tag-{i}"), format!("value-{i}")))
        .collect();
    tags.insert(
        format!("{TAG_PREFIX}scaledownutilizationthreshold"),
        "0.6".into(),
    );
    tags.insert(format!("{TAG_PREFIX}scaledownunneededtime"), "5m".into());
    tags.insert(
        format!("{TAG_PREFIX}ignoredaemonsetsutilization"),
        "true".into(),
    );
    c.bench_function("options overlay (20 tags, 3 options)", |b| {
        b.iter(|| black_box(overlay_from_tags(black_box(&defaults), black_box(&tags))))
    });
}

fn pods_110() -> Vec<Pod> {
    (0..110)
        .map(|i| {
            let mut p = fixtures::pod("shop", &format!("pod-{i:03}"), "node-a", "app", 0.0);
            if i % 11 == 0 {
                p.metadata.owner_references = Some(vec![OwnerReference {
                    api_version: "apps/v1".into(),
                    kind: "DaemonSet".into(),
                    name: format!("ds-{i}"),
                    uid: format!("uid-{i}"),
                    controller: Some(true),
                    ..Default::default()
                }]);
            }
            if i % 17 == 0 {
                p.spec.as_mut().unwrap().priority_class_name = Some("system-node-critical".into());
            }
            p
        })
        .collect()
}

fn drain_planning(c: &mut Criterion) {
    let pods = pods_110();
    c.bench_function("drain plan, 110 pods (full plan)", |b| {
        let now = ca_asg_provider::clock::timestamp_now();
        b.iter(|| black_box(full_plan(black_box(&pods), true, now)))
    });
    c.bench_function("drain plan, 110 pods (next step, workloads)", |b| {
        let (nc, now) = (
            NodeCritical::default(),
            ca_asg_provider::clock::timestamp_now(),
        );
        b.iter(|| black_box(next_step_with(black_box(&pods), Phase::Workloads, &nc, now)))
    });
}

criterion_group!(
    benches,
    group_lookup,
    template_encoding,
    options_overlay,
    drain_planning
);
criterion_main!(benches);

//! TemplateNode -> Kubernetes-protobuf v1.Node bytes (k8s-pb), the bare message
//! without the `k8s\0` envelope, as CA's `Node.Unmarshal` reads it.

use k8s_pb::api::core::v1 as core;
use k8s_pb::apimachinery::pkg::api::resource::Quantity;
use k8s_pb::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use prost::Message;

use super::TemplateNode;

fn quantities(
    m: &std::collections::BTreeMap<String, String>,
) -> std::collections::BTreeMap<String, Quantity> {
    m.iter()
        .map(|(k, v)| {
            (
                k.clone(),
                Quantity {
                    string: Some(v.clone()),
                },
            )
        })
        .collect()
}

/// The v1.Node CA will reason about.
pub fn to_node(node: &TemplateNode) -> core::Node {
    core::Node {
        metadata: Some(ObjectMeta {
            name: Some(node.name.clone()),
            labels: node.labels.clone().into_iter().collect(),
            ..Default::default()
        }),
        spec: Some(core::NodeSpec {
            taints: node
                .taints
                .iter()
                .map(|t| core::Taint {
                    key: Some(t.key.clone()),
                    value: Some(t.value.clone()),
                    effect: Some(t.effect.clone()),
                    time_added: None,
                })
                .collect(),
            ..Default::default()
        }),
        status: Some(core::NodeStatus {
            capacity: quantities(&node.capacity),
            allocatable: quantities(&node.allocatable),
            phase: Some("Running".into()),
            conditions: vec![core::NodeCondition {
                r#type: Some("Ready".into()),
                status: Some("True".into()),
                reason: Some("KubeletReady".into()),
                ..Default::default()
            }],
            ..Default::default()
        }),
    }
}

pub fn encode_node(node: &TemplateNode) -> Vec<u8> {
    to_node(node).encode_to_vec()
}

/// The template as `check-config` and the demo print it: labels, taints, capacity and
/// allocatable, one per line, sorted, indented for a report.
pub fn describe(node: &core::Node) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let labels = node
        .metadata
        .as_ref()
        .map(|m| m.labels.clone())
        .unwrap_or_default();
    let mut keys: Vec<_> = labels.iter().collect();
    keys.sort();
    let _ = writeln!(out, "    template labels:");
    for (k, v) in keys {
        let _ = writeln!(out, "      {k}={v}");
    }
    if let Some(spec) = &node.spec {
        for t in &spec.taints {
            let _ = writeln!(
                out,
                "    template taint: {}={}:{}",
                t.key.as_deref().unwrap_or(""),
                t.value.as_deref().unwrap_or(""),
                t.effect.as_deref().unwrap_or("")
            );
        }
    }
    if let Some(status) = &node.status {
        let q = |m: &std::collections::BTreeMap<String, Quantity>| {
            let mut v: Vec<String> = m
                .iter()
                .map(|(k, q)| format!("{k}={}", q.string.as_deref().unwrap_or("?")))
                .collect();
            v.sort();
            v.join(" ")
        };
        let _ = writeln!(out, "    capacity:    {}", q(&status.capacity));
        let _ = writeln!(out, "    allocatable: {}", q(&status.allocatable));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cloud::Taint;

    #[test]
    fn round_trips_through_protobuf() {
        let mut n = TemplateNode {
            name: "template-node-for-g".into(),
            ..Default::default()
        };
        n.labels.insert("kubernetes.io/arch".into(), "arm64".into());
        n.taints.push(Taint {
            key: "k".into(),
            value: "v".into(),
            effect: "NoSchedule".into(),
        });
        n.capacity.insert("cpu".into(), "4".into());
        n.allocatable.insert("memory".into(), "15000Mi".into());
        let bytes = encode_node(&n);
        assert!(!bytes.starts_with(b"k8s\0"));
        let back = core::Node::decode(bytes.as_slice()).unwrap();
        let meta = back.metadata.unwrap();
        assert_eq!(meta.name.as_deref(), Some("template-node-for-g"));
        assert_eq!(meta.labels["kubernetes.io/arch"], "arm64");
        let spec = back.spec.unwrap();
        assert_eq!(spec.taints[0].effect.as_deref(), Some("NoSchedule"));
        let st = back.status.unwrap();
        assert_eq!(st.capacity["cpu"].string.as_deref(), Some("4"));
        assert_eq!(st.allocatable["memory"].string.as_deref(), Some("15000Mi"));
        assert_eq!(st.conditions[0].status.as_deref(), Some("True"));
    }

    #[test]
    fn describe_prints_what_ca_will_see_sorted() {
        let mut n = TemplateNode {
            name: "t".into(),
            ..Default::default()
        };
        n.labels.insert("zone".into(), "a".into());
        n.labels.insert("arch".into(), "arm64".into());
        n.taints.push(Taint {
            key: "gpu".into(),
            value: "true".into(),
            effect: "NoSchedule".into(),
        });
        n.capacity.insert("memory".into(), "16Gi".into());
        n.capacity.insert("cpu".into(), "4".into());
        let node = core::Node::decode(encode_node(&n).as_slice()).unwrap();
        let text = describe(&node);
        let lines: Vec<&str> = text.lines().map(str::trim).collect();
        assert_eq!(
            &lines[..4],
            &[
                "template labels:",
                "arch=arm64",
                "zone=a",
                "template taint: gpu=true:NoSchedule"
            ]
        );
        assert!(text.contains("capacity:    cpu=4 memory=16Gi"), "{text}");
    }
}

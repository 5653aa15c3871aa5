//! Typical objects, built through the same k8s-openapi types the program uses.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{DaemonSet, DaemonSetSpec, ReplicaSet, ReplicaSetSpec};
use k8s_openapi::api::core::v1::{
    Container, Node, NodeCondition, NodeSpec, NodeStatus, Pod, PodSpec, PodTemplateSpec, Toleration,
};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::api::storage::v1::{
    VolumeAttachment, VolumeAttachmentSource, VolumeAttachmentSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::cluster::PRESTOP_ANNOTATION;

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// A Ready node with a providerID.
pub fn node(name: &str, provider_id: &str, extra_labels: &[(&str, &str)]) -> Node {
    let mut l = labels(extra_labels);
    l.insert("kubernetes.io/hostname".into(), name.into());
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(l),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            provider_id: Some(provider_id.into()),
            ..Default::default()
        }),
        status: Some(NodeStatus {
            conditions: Some(vec![NodeCondition {
                type_: "Ready".into(),
                status: "True".into(),
                ..Default::default()
            }]),
            ..Default::default()
        }),
    }
}

fn pod_spec(prestop_node: Option<&str>, grace: i64) -> PodSpec {
    PodSpec {
        node_name: prestop_node.map(str::to_string),
        termination_grace_period_seconds: Some(grace),
        containers: vec![Container {
            name: "main".into(),
            image: Some("registry.example/app:1".into()),
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// A template whose pods take `prestop` seconds to stop.
pub fn template(app: &str, prestop: f64) -> PodTemplateSpec {
    PodTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: Some(labels(&[("app", app)])),
            annotations: Some(labels(&[(PRESTOP_ANNOTATION, &prestop.to_string())])),
            ..Default::default()
        }),
        spec: Some(pod_spec(None, 30)),
    }
}

/// A ReplicaSet of `replicas` pods labelled `app`.
pub fn replicaset(ns: &str, app: &str, replicas: i32, prestop: f64) -> ReplicaSet {
    ReplicaSet {
        metadata: ObjectMeta {
            name: Some(app.into()),
            namespace: Some(ns.into()),
            ..Default::default()
        },
        spec: Some(ReplicaSetSpec {
            replicas: Some(replicas),
            selector: LabelSelector {
                match_labels: Some(labels(&[("app", app)])),
                ..Default::default()
            },
            template: Some(template(app, prestop)),
            ..Default::default()
        }),
        status: None,
    }
}

/// A DaemonSet (a log shipper) labelled `app`, tolerating `tolerate_all` taints or none.
pub fn daemonset(ns: &str, app: &str, prestop: f64, tolerate_all: bool) -> DaemonSet {
    let mut t = template(app, prestop);
    if tolerate_all {
        t.spec.as_mut().expect("spec").tolerations = Some(vec![Toleration {
            operator: Some("Exists".into()),
            ..Default::default()
        }]);
    }
    DaemonSet {
        metadata: ObjectMeta {
            name: Some(app.into()),
            namespace: Some(ns.into()),
            ..Default::default()
        },
        spec: Some(DaemonSetSpec {
            selector: LabelSelector {
                match_labels: Some(labels(&[("app", app)])),
                ..Default::default()
            },
            template: t,
            ..Default::default()
        }),
        status: None,
    }
}

/// A DaemonSet labelled `app` whose pods tolerate the taints keyed `keys` (`""`: every
/// taint, `operator: Exists` with no key) and run at `priority_class`: the agents an
/// EKS node carries and the DaemonSet controller puts straight back on a cordoned,
/// tainted node (see [`kube_proxy`], [`aws_node`], [`csi_node`]).
pub fn daemonset_tolerating(
    ns: &str,
    app: &str,
    prestop: f64,
    keys: &[&str],
    priority_class: Option<&str>,
) -> DaemonSet {
    let mut ds = daemonset(ns, app, prestop, false);
    let spec = ds
        .spec
        .as_mut()
        .and_then(|s| s.template.spec.as_mut())
        .expect("template spec");
    spec.tolerations = Some(
        keys.iter()
            .map(|k| Toleration {
                key: (!k.is_empty()).then(|| k.to_string()),
                operator: Some("Exists".into()),
                ..Default::default()
            })
            .collect(),
    );
    spec.priority_class_name = priority_class.map(str::to_string);
    ds
}

/// kube-proxy as EKS runs it: tolerates everything, system-node-critical.
pub fn kube_proxy(prestop: f64) -> DaemonSet {
    daemonset_tolerating(
        "kube-system",
        "kube-proxy",
        prestop,
        &[""],
        Some("system-node-critical"),
    )
}

/// The VPC CNI (aws-node): tolerates everything, system-node-critical.
pub fn aws_node(prestop: f64) -> DaemonSet {
    daemonset_tolerating(
        "kube-system",
        "aws-node",
        prestop,
        &[""],
        Some("system-node-critical"),
    )
}

/// The EBS CSI node plugin (ebs-csi-node): tolerates everything, system-node-critical;
/// volumes detach through it, so it must outlive the detach.
pub fn csi_node(prestop: f64) -> DaemonSet {
    daemonset_tolerating(
        "kube-system",
        "ebs-csi-node",
        prestop,
        &[""],
        Some("system-node-critical"),
    )
}

/// A log shipper that tolerates the drain taint by its key (and nothing else), at
/// no special priority: it leaves with the other DaemonSet pods, before the volumes.
pub fn log_shipper_tolerating_drain(prestop: f64) -> DaemonSet {
    daemonset_tolerating(
        "logging",
        "log-shipper",
        prestop,
        &["ca-asg-provider.io/draining"],
        None,
    )
}

/// A bare pod on a node (no controller).
pub fn pod(ns: &str, name: &str, node: &str, app: &str, prestop: f64) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(ns.into()),
            labels: Some(labels(&[("app", app)])),
            annotations: Some(labels(&[(PRESTOP_ANNOTATION, &prestop.to_string())])),
            ..Default::default()
        },
        spec: Some(pod_spec(Some(node), 30)),
        status: None,
    }
}

/// A PDB over `app` with maxUnavailable.
pub fn pdb(ns: &str, app: &str, max_unavailable: i32) -> PodDisruptionBudget {
    PodDisruptionBudget {
        metadata: ObjectMeta {
            name: Some(format!("{app}-pdb")),
            namespace: Some(ns.into()),
            ..Default::default()
        },
        spec: Some(PodDisruptionBudgetSpec {
            max_unavailable: Some(IntOrString::Int(max_unavailable)),
            selector: Some(LabelSelector {
                match_labels: Some(labels(&[("app", app)])),
                ..Default::default()
            }),
            ..Default::default()
        }),
        status: None,
    }
}

/// A CSI VolumeAttachment of persistent volume `pv` to `node`.
pub fn volume_attachment(name: &str, node: &str, pv: &str) -> VolumeAttachment {
    VolumeAttachment {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        spec: VolumeAttachmentSpec {
            attacher: "ebs.csi.aws.com".into(),
            node_name: node.into(),
            source: VolumeAttachmentSource {
                persistent_volume_name: Some(pv.into()),
                ..Default::default()
            },
        },
        status: None,
    }
}

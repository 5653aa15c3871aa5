//! Template nodes for scale-from-zero: what a new node of a group will look like.
//! Pure: inputs are plain data read by the cloud backend, output is a [`TemplateNode`]
//! that `encode` turns into a Kubernetes-protobuf v1.Node.

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::cloud::{AsgSnapshot, EksNodegroup, InstanceTypeInfo, LaunchData, Taint};

pub mod encode;

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
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    #[error("group {group}: {message}")]
    Invalid { group: String, message: String },
}

/// Builds the template node of one group.
pub fn build_template(inputs: &TemplateInputs<'_>) -> Result<TemplateNode, TemplateError> {
    let _ = inputs;
    Err(TemplateError::Invalid {
        group: inputs.group.name.clone(),
        message: "template building not implemented yet".into(),
    })
}

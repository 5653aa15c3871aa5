//! TemplateNode -> Kubernetes-protobuf v1.Node bytes (k8s-pb), the bare message
//! without the `k8s\0` envelope, as CA's `Node.Unmarshal` reads it.

use super::TemplateNode;

pub fn encode_node(node: &TemplateNode) -> Vec<u8> {
    let _ = node;
    Vec::new()
}

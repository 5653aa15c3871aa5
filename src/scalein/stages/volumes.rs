//! Wait (bounded) until the node's VolumeAttachments are gone, so EBS
//! volumes detach cleanly before the instance ends and the next pod can attach them.

use crate::clock::Instant;
use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};

use kube::Api;

use crate::scalein::stages::Stage;

/// Waits until no VolumeAttachment names this node, or the deadline, leaving out the
/// attachments of `staying` persistent volumes (those of pods that stay on the node:
/// stuck, on a dead kubelet, kept DaemonSets; nothing will unmount them). Returns
/// the attachments still there (empty = all detached).
pub async fn wait_detached(
    stage: &Stage<'_>,
    node: &str,
    deadline: Instant,
    staying: &BTreeSet<String>,
) -> Vec<String> {
    // The pass's watch of every attachment: a storm lists them once, not per node.
    let pass = stage.passes.join();
    let feed = pass.attachments();
    let mut changes = feed.changes();
    let on_node = || -> Vec<String> {
        let mut left: Vec<String> = feed
            .state()
            .iter()
            .filter(|va| va.spec.node_name == node)
            .filter(|va| {
                va.spec
                    .source
                    .persistent_volume_name
                    .as_ref()
                    .is_none_or(|pv| !staying.contains(pv))
            })
            .filter_map(|va| va.metadata.name.clone())
            .collect();
        left.sort();
        left
    };
    if !feed.ready(deadline).await {
        tracing::debug!(
            node,
            "no list of VolumeAttachments before the volume deadline"
        );
        return on_node();
    }
    loop {
        let left = on_node();
        if left.is_empty() {
            return left;
        }
        match tokio::time::timeout_at(deadline, changes.changed()).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) | Err(_) => return on_node(),
        }
    }
}

/// The persistent volumes of these pods (their claims' bound volumes). A claim that
/// cannot be read is left out, so its attachment is waited for (bounded).
pub async fn volumes_of(stage: &Stage<'_>, pods: &[Pod]) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for p in pods {
        let ns = p.metadata.namespace.as_deref().unwrap_or("default");
        let claims = p
            .spec
            .iter()
            .flat_map(|s| s.volumes.iter().flatten())
            .filter_map(|v| v.persistent_volume_claim.as_ref())
            .map(|c| c.claim_name.clone());
        for claim in claims {
            let api: Api<PersistentVolumeClaim> = Api::namespaced(stage.client.clone(), ns);
            match api.get_opt(&claim).await {
                Ok(Some(pvc)) => {
                    if let Some(pv) = pvc.spec.and_then(|s| s.volume_name) {
                        out.insert(pv);
                    }
                }
                Ok(None) => {}
                Err(e) => tracing::debug!(claim, error = %e, "could not read a claim"),
            }
        }
    }
    out
}

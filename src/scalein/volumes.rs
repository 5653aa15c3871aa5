//! Stage 3: wait (bounded) until the node's VolumeAttachments are gone, so EBS
//! volumes detach cleanly before the instance ends and the next pod can attach them.

use std::collections::HashSet;
use std::time::Instant;

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};

use futures::StreamExt;
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::runtime::reflector;
use kube::runtime::{watcher, WatchStreamExt};
use kube::Api;

use super::Engine;

/// Waits until no VolumeAttachment names this node, or the deadline, leaving out the
/// attachments of `staying` persistent volumes (those of pods that stay on the node:
/// stuck, on a dead kubelet, kept DaemonSets; nothing will unmount them). Returns
/// the attachments still there (empty = all detached).
pub async fn wait_detached(
    engine: &Engine,
    node: &str,
    deadline: Instant,
    staying: &HashSet<String>,
) -> Vec<String> {
    let api: Api<VolumeAttachment> = Api::all(engine.client.clone());
    let (store, writer) = reflector::store();
    // VolumeAttachments cannot be field-selected by node, but there are few of them.
    // The raw event stream is used (not touched_objects) so the end of the initial
    // list is seen: a node with no attachments finishes at once.
    let stream =
        reflector::reflector(writer, watcher(api, watcher::Config::default())).default_backoff();
    let on_node = |store: &reflector::Store<VolumeAttachment>| -> Vec<String> {
        store
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
            .collect()
    };
    futures::pin_mut!(stream);
    let mut listed = false;
    loop {
        if listed {
            let left = on_node(&store);
            if left.is_empty() {
                return left;
            }
        }
        match tokio::time::timeout_at(deadline.into(), stream.next()).await {
            Ok(Some(Ok(watcher::Event::InitDone))) => listed = true,
            Ok(Some(Ok(_))) => {}
            Ok(Some(Err(e))) => tracing::debug!(node, error = %e, "volume attachment watch error"),
            Ok(None) | Err(_) => return on_node(&store),
        }
    }
}

/// The persistent volumes of these pods (their claims' bound volumes). A claim that
/// cannot be read is left out, so its attachment is waited for (bounded).
pub async fn volumes_of(engine: &Engine, pods: &[Pod]) -> HashSet<String> {
    let mut out = HashSet::new();
    for p in pods {
        let ns = p.metadata.namespace.as_deref().unwrap_or("default");
        let claims = p
            .spec
            .iter()
            .flat_map(|s| s.volumes.iter().flatten())
            .filter_map(|v| v.persistent_volume_claim.as_ref())
            .map(|c| c.claim_name.clone());
        for claim in claims {
            let api: Api<PersistentVolumeClaim> = Api::namespaced(engine.client.clone(), ns);
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

//! Stage 3: wait (bounded) until the node's VolumeAttachments are gone, so EBS
//! volumes detach cleanly before the instance ends and the next pod can attach them.

use std::time::Instant;

use futures::StreamExt;
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::runtime::reflector;
use kube::runtime::{watcher, WatchStreamExt};
use kube::Api;

use super::Engine;

/// Waits until no VolumeAttachment names this node, or the deadline. Returns the
/// attachments still there (empty = all detached).
pub async fn wait_detached(engine: &Engine, node: &str, deadline: Instant) -> Vec<String> {
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

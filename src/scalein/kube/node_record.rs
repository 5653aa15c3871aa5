//! The Node's record as stored: every write to a Node (the cordon, the drain record,
//! the give-back) is a read-modify-write fenced by the resourceVersion it was decided
//! on, so nothing another writer put on the Node meanwhile is lost.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams};
use kube::Api;
use serde_json::json;

use crate::scalein::decide::record::{
    DrainRecord, ANNOTATION as RECORD_ANNOTATION, MODE_ANNOTATION,
};
use crate::scalein::kube::nodes::NodeIndex;

pub const CONFLICT_RETRIES: usize = 8;

/// The drain record a Node's annotations carry, read at the clock's time
/// ([`DrainRecord::read`]). `None`: the Node carries no drain.
pub fn record_of(annotations: &std::collections::BTreeMap<String, String>) -> Option<DrainRecord> {
    DrainRecord::read(annotations, crate::clock::utc_now())
}

/// What a read-modify-write of a Node decided from the Node as read.
pub enum Write<T> {
    /// Nothing to write; the answer.
    Keep(T),
    /// Write this merge patch, then answer.
    Patch(serde_json::Value, T),
}

/// Reads the Node, lets `decide` say what to write, and writes it as a merge patch
/// carrying the Node's resourceVersion: a concurrent writer makes it a 409 and the
/// Node is read again, so no taint, mark or reason someone else wrote meanwhile is
/// lost. `Ok(None)`: there is no Node (or it went away). An error after
/// [`CONFLICT_RETRIES`] conflicts: nothing is reported written that was not.
pub async fn read_modify_write<T>(
    nodes: &NodeIndex,
    client: &kube::Client,
    node: &str,
    decide: impl FnMut(&Node) -> Write<T>,
) -> Result<Option<T>, kube::Error> {
    // The first try starts from the Node cache: a patch is fenced by the
    // resourceVersion it was decided on (a stale copy gets a 409 and the loop reads
    // the Node), so a write that goes through was decided on the Node as it was. A
    // decision to leave the Node alone is not trusted to the cache: it is read.
    read_modify_write_from(nodes.cached(node), client, node, decide).await
}

/// [`read_modify_write`] starting from `cached` (`None`: from a read), for a command
/// that keeps no Node cache.
pub async fn read_modify_write_from<T>(
    mut cached: Option<Arc<Node>>,
    client: &kube::Client,
    node: &str,
    mut decide: impl FnMut(&Node) -> Write<T>,
) -> Result<Option<T>, kube::Error> {
    let api: Api<Node> = Api::all(client.clone());
    for _ in 0..CONFLICT_RETRIES {
        let from_cache = cached.is_some();
        let current = match cached.take() {
            Some(n) => n,
            None => match api.get_opt(node).await? {
                Some(n) => Arc::new(n),
                None => return Ok(None),
            },
        };
        let (mut patch, answer) = match decide(&current) {
            Write::Keep(_) if from_cache => continue,
            Write::Keep(answer) => return Ok(Some(answer)),
            Write::Patch(patch, answer) => (patch, answer),
        };
        patch["metadata"]["resourceVersion"] = json!(current.metadata.resource_version);
        match api
            .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => return Ok(Some(answer)),
            Err(kube::Error::Api(s)) if s.code == 409 => continue,
            Err(kube::Error::Api(s)) if s.code == 404 => return Ok(None),
            Err(e) => return Err(e),
        }
    }
    Err(kube::Error::Api(
        kube::core::Status::failure(
            &format!("node {node}: gave up after {CONFLICT_RETRIES} conflicting updates"),
            "Conflict",
        )
        .with_code(409)
        .boxed(),
    ))
}

/// Rewrites the drain record on the Node (its drain finished: the reasons are done),
/// keeping the cordon. `change` returns false to leave the Node as it is. `Ok(None)`:
/// no Node, or no record on it.
pub async fn update_record(
    nodes: &NodeIndex,
    client: &kube::Client,
    node: &str,
    change: impl Fn(&mut DrainRecord) -> bool,
) -> Result<Option<DrainRecord>, kube::Error> {
    let updated = read_modify_write(nodes, client, node, |current| {
        let annotations = current.metadata.annotations.clone().unwrap_or_default();
        let Some(mut record) = record_of(&annotations) else {
            return Write::Keep(None);
        };
        if !change(&mut record) {
            return Write::Keep(Some(record));
        }
        let patch = json!({
            "metadata": {
                "annotations": {
                    MODE_ANNOTATION: record.mark(),
                    RECORD_ANNOTATION: record.to_json(),
                },
            },
        });
        Write::Patch(patch, Some(record))
    })
    .await?;
    Ok(updated.flatten())
}

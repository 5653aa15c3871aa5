//! Writes the drain's state on the Node as conditions ([`crate::scalein::decide::conditions`]
//! decides the patch): a strategic merge patch of `nodes/status` carrying only
//! `DrainInProgress` and `Drained`, merged by type, so the kubelet's conditions and
//! anyone else's stay. Information only: a write the API server refuses is logged and
//! the drain goes on; no decision of the service ever reads these conditions back.

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};

use crate::scalein::decide::conditions::{self, DrainState};

/// Says `state` on `node`, whose conditions are now as `current` has them (the Node
/// cache's copy, or a read); nothing is written when they already say it.
pub async fn say(client: &kube::Client, current: Option<&Node>, node: &str, state: &DrainState) {
    let have = current
        .and_then(|n| n.status.as_ref())
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default();
    let Some(patch) = conditions::patch(&have, state, crate::clock::timestamp_now()) else {
        return;
    };
    let api: Api<Node> = Api::all(client.clone());
    match api
        .patch_status(node, &PatchParams::default(), &Patch::Strategic(&patch))
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(e) => {
            tracing::warn!(node, error = %e, "could not write the drain's conditions (DrainInProgress, Drained) on the Node; the drain goes on (the service account needs patch on nodes/status)")
        }
    }
}

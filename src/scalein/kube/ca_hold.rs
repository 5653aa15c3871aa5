//! Writing on Nodes which ones cluster-autoscaler may not pick for scale-down now
//! ([`crate::scalein::decide::ca_hold`] decides which, and what to write). Every
//! write is fenced by the version it was decided on, so an annotation an operator
//! sets meanwhile is read again and left alone.

use std::future::Future;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;

use crate::scalein::decide::ca_hold::{self, Change};
use crate::scalein::kube::node_record::{read_modify_write_from, Write};

/// Where the holds are written: the API server ([`ApiNotes`]), or a test's fake.
pub trait HoldNotes: Send + Sync {
    /// Makes `node` say `want` (the budget that holds it, `None`: not held) as
    /// [`ca_hold::change`] rules, deciding again on the Node as read when `cached`
    /// is stale. `Ok(Some(change))`: written; `Ok(None)`: nothing to write (or no
    /// such Node).
    fn write(
        &self,
        node: &str,
        cached: Option<Arc<Node>>,
        want: Option<&str>,
    ) -> impl Future<Output = Result<Option<Change>, kube::Error>> + Send;
}

/// [`HoldNotes`] on the API server: one merge patch of the Node's annotations.
pub struct ApiNotes<'a>(pub &'a kube::Client);

impl HoldNotes for ApiNotes<'_> {
    async fn write(
        &self,
        node: &str,
        cached: Option<Arc<Node>>,
        want: Option<&str>,
    ) -> Result<Option<Change>, kube::Error> {
        let written = read_modify_write_from(cached, self.0, node, |current| {
            let annotations = current.metadata.annotations.clone().unwrap_or_default();
            match ca_hold::change(&annotations, want) {
                Some(c) => Write::Patch(c.patch(), Some(c)),
                None => Write::Keep(None),
            }
        })
        .await?;
        Ok(written.flatten())
    }
}

/// Releases every Node that carries our mark (`undrain --all`, the uninstall's
/// give-back: no replica is left to release them). The names released, in name
/// order; an operator's own annotation (no mark of ours) stays.
pub async fn release_all(client: &kube::Client) -> Result<Vec<String>, kube::Error> {
    let nodes: kube::Api<Node> = kube::Api::all(client.clone());
    let listed = nodes.list(&kube::api::ListParams::default()).await?;
    let mut ours: Vec<String> = listed
        .items
        .iter()
        .filter(|n| {
            n.metadata
                .annotations
                .as_ref()
                .is_some_and(ca_hold::is_ours)
        })
        .filter_map(|n| n.metadata.name.clone())
        .collect();
    ours.sort();
    let mut released = Vec::new();
    for name in ours {
        if ApiNotes(client).write(&name, None, None).await?.is_some() {
            released.push(name);
        }
    }
    Ok(released)
}

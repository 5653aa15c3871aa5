//! Feeds the provider's accounting with the direct-mode drain marks on Nodes, so
//! CA's target size counts a node whose drain runs as already gone.

use std::sync::Arc;
use std::time::Duration;

use crate::provider::Provider;
use crate::scalein::kube::nodes;

/// Every Node change (and every few seconds, for refreshes that changed which
/// instances are in service) hands the direct-mode drain marks to the provider.
pub(crate) fn spawn_marks_sync(
    nodes: &nodes::NodeIndex,
    provider: std::sync::Weak<Provider>,
    liveness: Arc<crate::telemetry::liveness::Liveness>,
) -> tokio::task::JoinHandle<()> {
    const NAME: &str = "drain-mark sync";
    if let Some(p) = provider.upgrade() {
        p.expect_drain_marks();
    }
    let mut changes = nodes.changes();
    let store = nodes.store();
    let mut ready = nodes.readiness();
    tokio::spawn(async move {
        if ready.wait_for(|r| *r).await.is_err() {
            return;
        }
        loop {
            let Some(p) = provider.upgrade() else {
                liveness.done(NAME);
                return;
            };
            liveness.beat(NAME, Duration::from_secs(60));
            p.sync_direct_drains(nodes::direct_marks(&store));
            drop(p);
            match tokio::time::timeout(Duration::from_secs(2), changes.changed()).await {
                Ok(Ok(())) => {
                    // Coalesce a burst of Node updates into one pass over the Nodes.
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    changes.borrow_and_update();
                }
                // The Node watch is gone: keep re-reading its last state slowly.
                Ok(Err(_)) => tokio::time::sleep(Duration::from_secs(2)).await,
                Err(_) => {}
            }
        }
    })
}

//! A reflector of Nodes: instance id -> Node name, for drains that start from AWS
//! (lifecycle hooks) and know only the instance.

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::Api;

use crate::provider::provider_id;

pub struct NodeIndex {
    store: Store<Node>,
    task: tokio::task::JoinHandle<()>,
}

impl NodeIndex {
    /// Starts the reflector in the background (it re-lists by itself after API-server
    /// restarts).
    pub fn start(client: kube::Client) -> Self {
        let (store, writer) = reflector::store();
        let api: Api<Node> = Api::all(client);
        let stream = reflector::reflector(writer, watcher(api, watcher::Config::default()))
            .default_backoff()
            .touched_objects();
        let task = tokio::spawn(async move {
            futures::pin_mut!(stream);
            while let Some(item) = stream.next().await {
                if let Err(e) = item {
                    tracing::debug!(error = %e, "node watch error; retrying");
                }
            }
        });
        Self { store, task }
    }

    /// Stops the watch (the engine is being shut down).
    pub fn stop(&self) {
        self.task.abort();
    }

    /// The Node whose providerID names this instance.
    pub fn node_for_instance(&self, instance_id: &str) -> Option<String> {
        self.store
            .state()
            .iter()
            .find(|n| {
                n.spec
                    .as_ref()
                    .and_then(|s| s.provider_id.as_deref())
                    .and_then(provider_id::instance_id)
                    == Some(instance_id)
            })
            .and_then(|n| n.metadata.name.clone())
    }

    /// Waits until the first list arrived (bounded).
    pub async fn ready(&self, within: std::time::Duration) -> bool {
        tokio::time::timeout(within, self.store.wait_until_ready())
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// Every Node carrying our drain annotation: (node name, instance id, mode).
    pub fn marked_for_drain(&self) -> Vec<(String, Option<String>, String)> {
        self.store
            .state()
            .iter()
            .filter_map(|n| {
                let a = n.metadata.annotations.as_ref()?;
                let mode = a.get(super::cordon::MODE_ANNOTATION)?.clone();
                a.get(super::cordon::STARTED_ANNOTATION)?;
                let iid = n
                    .spec
                    .as_ref()
                    .and_then(|s| s.provider_id.as_deref())
                    .and_then(provider_id::instance_id)
                    .map(str::to_string);
                Some((n.metadata.name.clone()?, iid, mode))
            })
            .collect()
    }
}

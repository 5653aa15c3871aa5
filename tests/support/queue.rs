//! Driving the queue consumer by hand, as the queue-mode tests do.

use std::sync::Arc;
use std::time::Duration;

use ca_asg_provider::cloud::queue::{MemoryQueue, Queue};
use ca_asg_provider::scalein::sources::queue::{Consumer, Handled};
use ca_asg_provider::scalein::{decide::notice::RebalanceAction, settings::InterruptionSettings};
use k8s_openapi::api::core::v1::Pod;

use super::world::World;

/// The world's consumer on `queue`, with rebalance recommendations doing `rebalance`.
pub fn consumer(w: &World, queue: &Arc<MemoryQueue>, rebalance: RebalanceAction) -> Arc<Consumer> {
    Consumer::new(
        w.engine.clone(),
        w.provider.clone(),
        queue.clone() as Arc<dyn Queue>,
        InterruptionSettings {
            wait: Duration::from_millis(100),
            rebalance,
            ..Default::default()
        },
    )
}

/// A queue and the world's consumer on it ([`consumer`]).
pub fn queue_and_consumer(
    w: &World,
    rebalance: RebalanceAction,
) -> (Arc<MemoryQueue>, Arc<Consumer>) {
    let q = Arc::new(MemoryQueue::default());
    let c = consumer(w, &q, rebalance);
    (q, c)
}

/// Receives the one waiting message and handles it.
pub async fn handle_next(c: &Consumer, q: &MemoryQueue) -> Handled {
    let mut got = q.receive(1, Duration::from_millis(10)).await.unwrap();
    assert_eq!(got.len(), 1, "one message waiting");
    c.handle(got.remove(0)).await
}

/// Hands every visible message to the consumer until the queue shows none, and
/// says what each came to (a message left for another delivery stays in the queue).
pub async fn handle_all(c: &Consumer, q: &MemoryQueue) -> Vec<Handled> {
    let mut outcomes = Vec::new();
    loop {
        let got = q.receive(10, Duration::ZERO).await.unwrap();
        if got.is_empty() {
            return outcomes;
        }
        for m in got {
            outcomes.push(c.handle(m).await);
        }
    }
}

/// Whether a pod named `prefix...` is there and not terminating.
pub fn running(w: &World, prefix: &str) -> bool {
    w.sim.list::<Pod>().iter().any(|p| {
        p["metadata"]["name"]
            .as_str()
            .is_some_and(|n| n.starts_with(prefix))
            && p["metadata"]["deletionTimestamp"].is_null()
    })
}

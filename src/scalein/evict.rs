//! Stage 2: evictions through the Eviction API (policy/v1). A 429 means a
//! PodDisruptionBudget does not allow it yet: wait and retry, never delete around it.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::EvictParams;
use kube::Api;

use super::events::Reason;
use super::plan::PodRef;
use super::Engine;
use crate::telemetry::metrics::{metrics, Metrics};

/// What one eviction attempt answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attempt {
    /// Accepted: graceful deletion started.
    Evicted,
    /// The pod is gone already.
    Gone,
    /// A PodDisruptionBudget refused it (429), with the API server's message.
    Blocked(String),
    /// Anything else (API unreachable, 500 for overlapping PDBs, ...).
    Error(String),
}

/// One eviction request, rate-limited.
pub async fn attempt(engine: &Engine, pod: &PodRef) -> Attempt {
    let api: Api<Pod> = Api::namespaced(engine.client.clone(), &pod.namespace);
    engine.limiter.acquire().await;
    match api.evict(&pod.name, &EvictParams::default()).await {
        Ok(_) => {
            engine.stats.evictions_ok.fetch_add(1, Ordering::Relaxed);
            Metrics::outcome(&metrics().evictions, "ok");
            Attempt::Evicted
        }
        Err(kube::Error::Api(s)) if s.code == 404 => Attempt::Gone,
        Err(kube::Error::Api(s)) if s.code == 429 => {
            engine
                .stats
                .evictions_pdb_blocked
                .fetch_add(1, Ordering::Relaxed);
            Metrics::outcome(&metrics().evictions, "pdb_blocked");
            let why = s
                .details
                .as_ref()
                .and_then(|d| d.causes.first())
                .map(|c| c.message.clone())
                .filter(|m| !m.is_empty())
                .unwrap_or_else(|| s.message.clone());
            Attempt::Blocked(why)
        }
        Err(e) => {
            engine.stats.evictions_error.fetch_add(1, Ordering::Relaxed);
            Metrics::outcome(&metrics().evictions, "error");
            Attempt::Error(e.to_string())
        }
    }
}

/// Evicts one pod, retrying refusals until accepted, gone, or the deadline. Publishes
/// one Event the first time a PDB blocks it. Returns whether it was accepted or gone.
pub async fn until_accepted(
    engine: &Engine,
    node: &str,
    pod: &PodRef,
    deadline: Instant,
    still_there: impl Fn() -> bool,
) -> bool {
    let mut told = false;
    let mut backoff = engine.settings.eviction_retry;
    loop {
        if !still_there() {
            return true;
        }
        match attempt(engine, pod).await {
            Attempt::Evicted | Attempt::Gone => return true,
            Attempt::Blocked(why) => {
                if !told {
                    engine
                        .events
                        .node(node, Reason::EvictionBlocked, format!("eviction of {pod} blocked by a PodDisruptionBudget: {why}; retrying every {backoff:?}"))
                        .await;
                    told = true;
                }
                backoff = engine.settings.eviction_retry;
            }
            Attempt::Error(e) => {
                tracing::warn!(node, pod = %pod, error = %e, "eviction failed; retrying");
                backoff = (backoff * 2)
                    .min(Duration::from_secs(30))
                    .max(engine.settings.eviction_retry);
            }
        }
        let now = Instant::now();
        if now >= deadline {
            return false;
        }
        tokio::time::sleep(jitter(backoff).min(deadline - now)).await;
    }
}

/// +-10% so many drains blocked by the same PDB do not retry in lockstep.
fn jitter(d: Duration) -> Duration {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|t| t.subsec_nanos())
        .unwrap_or(0);
    let f = 0.9 + f64::from(nanos % 1000) / 5000.0;
    d.mul_f64(f)
}

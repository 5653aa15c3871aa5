//! The operations HTTP port: `/metrics` (Prometheus text), `/healthz` (the process
//! answers and its background loops turn), `/readyz` (ready once node groups were
//! loaded from AWS).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;

use crate::provider::Provider;

use super::liveness::Liveness;
use super::metrics::{metrics, GroupLabels};

use std::collections::BTreeSet;

/// The groups the last scrape exported series for.
static SHOWN_GROUPS: parking_lot::Mutex<BTreeSet<String>> =
    parking_lot::Mutex::new(BTreeSet::new());

/// Serves the operations endpoints until `shutdown` resolves.
pub async fn serve(
    listener: tokio::net::TcpListener,
    provider: Arc<Provider>,
    liveness: Arc<Liveness>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let app = Router::new()
        .route("/metrics", get(metrics_handler))
        .route("/readyz", get(ready_handler))
        .with_state(provider)
        .route(
            "/healthz",
            get(move || {
                let liveness = liveness.clone();
                async move {
                    match liveness.problem() {
                        None => (StatusCode::OK, "ok\n".to_string()),
                        Some(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("wedged: {why}\n")),
                    }
                }
            }),
        );
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await?;
    Ok(())
}

pub async fn bind(addr: SocketAddr) -> anyhow::Result<(tokio::net::TcpListener, SocketAddr)> {
    let l = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {addr} for metrics: {e}"))?;
    let a = l.local_addr()?;
    Ok((l, a))
}

async fn ready_handler(State(p): State<Arc<Provider>>) -> (StatusCode, String) {
    if p.is_loaded() {
        (StatusCode::OK, "ready\n".into())
    } else {
        let why = p
            .last_refresh_error()
            .unwrap_or_else(|| "no refresh yet".into());
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: node groups not loaded: {why}\n"),
        )
    }
}

async fn metrics_handler(
    State(p): State<Arc<Provider>>,
) -> ([(axum::http::HeaderName, &'static str); 1], String) {
    let m = metrics();
    let reg = p.registry();
    m.node_groups.set(reg.groups.len() as i64);
    // A group that is no longer managed loses its series instead of keeping its
    // last values forever.
    let now: BTreeSet<String> = reg.groups.iter().map(|g| g.asg.name.clone()).collect();
    {
        let mut shown = SHOWN_GROUPS.lock();
        for gone in shown.difference(&now) {
            let l = GroupLabels {
                node_group: gone.clone(),
            };
            m.group_min.remove(&l);
            m.group_max.remove(&l);
            m.group_instances.remove(&l);
            m.group_target.remove(&l);
        }
        *shown = now;
    }
    for g in &reg.groups {
        let l = GroupLabels {
            node_group: g.asg.name.clone(),
        };
        m.group_min.get_or_create(&l).set(i64::from(g.min));
        m.group_max.get_or_create(&l).set(i64::from(g.max));
        m.group_instances
            .get_or_create(&l)
            .set(g.asg.instances.len() as i64);
        if let Ok(t) = p.target_size(&g.asg.name) {
            m.group_target.get_or_create(&l).set(i64::from(t));
        }
    }
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        m.encode(),
    )
}

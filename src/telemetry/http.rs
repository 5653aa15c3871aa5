//! The operations HTTP port: `/metrics` (Prometheus text), `/healthz` (the process
//! answers and its background loops turn), `/readyz` (ready once node groups were
//! loaded from AWS).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;

use super::liveness::Liveness;
use super::metrics::metrics;

/// What the operations port asks of the service it reports on. The provider answers
/// it; telemetry does not know the provider.
pub trait Status: Send + Sync + 'static {
    /// `Ok` once the service can answer CA; `Err(why)` before.
    fn readiness(&self) -> Result<(), String>;
    /// Brings the gauges that describe current state up to date, just before a scrape.
    fn before_scrape(&self) {}
}

/// Serves the operations endpoints until `shutdown` resolves.
pub async fn serve(
    listener: tokio::net::TcpListener,
    status: Arc<dyn Status>,
    liveness: Arc<Liveness>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let troubles = liveness.clone();
    let app = Router::new()
        .route("/metrics", get(metrics_handler))
        .route(
            "/readyz",
            get(move |s: State<Arc<dyn Status>>| {
                let troubles = troubles.clone();
                async move { ready_handler(s, &troubles) }
            }),
        )
        .with_state(status)
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

/// Ready once the service can answer CA and no background loop reports trouble (a
/// replica that cannot take part in leader election says so here): `/readyz`'s answer,
/// and what the pod's readiness Events tell ([`super::readiness`]).
pub fn readiness(s: &dyn Status, liveness: &Liveness) -> Result<(), String> {
    s.readiness()
        .and_then(|()| liveness.troubles().map_or(Ok(()), Err))
}

fn ready_handler(State(s): State<Arc<dyn Status>>, liveness: &Liveness) -> (StatusCode, String) {
    match readiness(&*s, liveness) {
        Ok(()) => (StatusCode::OK, "ready\n".into()),
        Err(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {why}\n"),
        ),
    }
}

async fn metrics_handler(
    State(s): State<Arc<dyn Status>>,
) -> ([(axum::http::HeaderName, &'static str); 1], String) {
    s.before_scrape();
    metrics().update_process();
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        metrics().encode(),
    )
}

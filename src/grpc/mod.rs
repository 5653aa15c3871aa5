//! The externalgrpc CloudProvider service (tonic): decode, validate, call the core,
//! map errors to status codes. No business logic lives here.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;

use crate::proto::cloud_provider_server::CloudProviderServer;
use crate::provider::Provider;

pub mod door;
pub mod options;
mod service;

pub use door::ConnectionLimits;
pub use service::CloudProviderService;

/// Serves the CloudProvider service and grpc.health.v1 on `listener` until
/// `shutdown` resolves, with the default connection limits.
pub async fn serve(
    listener: TcpListener,
    provider: Arc<Provider>,
    tls: Option<tonic::transport::ServerTlsConfig>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    serve_with(
        listener,
        provider,
        tls,
        shutdown,
        ConnectionLimits::default(),
    )
    .await
}

/// TLS handshakes that do not finish in this time are dropped.
const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// [`serve`] with the connection limits given.
pub async fn serve_with(
    listener: TcpListener,
    provider: Arc<Provider>,
    tls: Option<tonic::transport::ServerTlsConfig>,
    shutdown: impl Future<Output = ()> + Send + 'static,
    limits: ConnectionLimits,
) -> anyhow::Result<()> {
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_serving::<CloudProviderServer<CloudProviderService>>()
        .await;
    let mut builder = tonic::transport::Server::builder()
        // A peer that stops answering pings is gone: its connection is closed.
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(Duration::from_secs(10)))
        .tcp_keepalive(Some(Duration::from_secs(60)))
        .max_concurrent_streams(Some(128));
    if let Some(tls) = tls {
        builder = builder.tls_config(tls.timeout(TLS_HANDSHAKE_TIMEOUT))?;
    }
    builder
        .add_service(health)
        .add_service(CloudProviderServer::new(CloudProviderService::new(
            provider,
        )))
        .serve_with_incoming_shutdown(door::incoming(listener, limits), shutdown)
        .await?;
    Ok(())
}

/// mTLS: our certificate and key, and the CA client certificates must chain to.
pub fn tls_config(t: &crate::config::TlsFile) -> anyhow::Result<tonic::transport::ServerTlsConfig> {
    let read = |what: &str, p: &std::path::Path| {
        std::fs::read(p)
            .map_err(|e| anyhow::anyhow!("tls.{what}: cannot read {}: {e}", p.display()))
    };
    let identity =
        tonic::transport::Identity::from_pem(read("cert", &t.cert)?, read("key", &t.key)?);
    let ca = tonic::transport::Certificate::from_pem(read("clientCA", &t.client_ca)?);
    Ok(tonic::transport::ServerTlsConfig::new()
        .identity(identity)
        .client_ca_root(ca))
}

/// Binds `addr` (port 0 picks a free port) and returns the listener and its address.
pub async fn bind(addr: SocketAddr) -> anyhow::Result<(TcpListener, SocketAddr)> {
    let l = TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {addr}: {e}"))?;
    let local = l.local_addr()?;
    Ok((l, local))
}

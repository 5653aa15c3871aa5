//! The externalgrpc CloudProvider service (tonic): decode, validate, call the core,
//! map errors to status codes. No business logic lives here.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;

use crate::proto::cloud_provider_server::CloudProviderServer;
use crate::provider::Provider;

pub mod options;
mod service;

pub use service::CloudProviderService;

/// Serves the CloudProvider service and grpc.health.v1 on `listener` until
/// `shutdown` resolves.
pub async fn serve(
    listener: TcpListener,
    provider: Arc<Provider>,
    tls: Option<tonic::transport::ServerTlsConfig>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_serving::<CloudProviderServer<CloudProviderService>>()
        .await;
    let mut builder = tonic::transport::Server::builder();
    if let Some(tls) = tls {
        builder = builder.tls_config(tls)?;
    }
    builder
        .add_service(health)
        .add_service(CloudProviderServer::new(CloudProviderService::new(
            provider,
        )))
        // No Nagle: unary answers are small, and a delayed ACK would add ~40 ms each.
        .serve_with_incoming_shutdown(
            tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true)),
            shutdown,
        )
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

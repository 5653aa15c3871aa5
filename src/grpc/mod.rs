//! The externalgrpc CloudProvider service (tonic): decode, validate, call the core,
//! map errors to status codes. No business logic lives here.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;

use crate::proto::cloud_provider_server::CloudProviderServer;
use crate::provider::Provider;
use crate::telemetry::metrics::{metrics, Metrics};

pub mod deadline;
pub mod door;
pub mod metered;
pub mod options;
mod service;
pub mod tls;

pub use door::ConnectionLimits;
pub use service::CloudProviderService;
pub use tls::ReloadingTls;

/// Serves the CloudProvider service and grpc.health.v1 on `listener` until
/// `shutdown` resolves, with the default connection limits.
pub async fn serve(
    listener: TcpListener,
    provider: Arc<Provider>,
    tls: Option<Arc<ReloadingTls>>,
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

/// The largest request decoded. CA sends every node of a DeleteNodes call with its
/// labels and annotations (`externalgrpc_node_group.go` DeleteNodes), and with
/// `--node-deletion-batcher-interval` one call carries a whole scale-down: thousands
/// of nodes of a few KiB each pass gRPC's default 4 MiB. Bounded all the same.
pub const MAX_REQUEST_BYTES: usize = 64 << 20;

/// TLS handshakes that do not finish in this time are dropped.
const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The server's HTTP/2 and TCP settings. `loadgen --floor` serves its transport floor
/// with the same, so that the two servers differ only in what answers.
pub fn transport() -> tonic::transport::Server {
    tonic::transport::Server::builder()
        // A peer that stops answering pings is gone: its connection is closed.
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(Duration::from_secs(10)))
        .tcp_keepalive(Some(Duration::from_secs(60)))
        .max_concurrent_streams(Some(128))
}

/// [`serve`] with the connection limits given.
pub async fn serve_with(
    listener: TcpListener,
    provider: Arc<Provider>,
    tls: Option<Arc<ReloadingTls>>,
    shutdown: impl Future<Output = ()> + Send + 'static,
    limits: ConnectionLimits,
) -> anyhow::Result<()> {
    serve_counted(listener, provider, tls, shutdown, limits, metrics()).await
}

/// [`serve_with`], counting and timing the CloudProvider RPCs into `counts` (the
/// process's [`metrics`] in production; a test's own, to count exactly).
pub async fn serve_counted(
    listener: TcpListener,
    provider: Arc<Provider>,
    tls: Option<Arc<ReloadingTls>>,
    shutdown: impl Future<Output = ()> + Send + 'static,
    limits: ConnectionLimits,
    counts: &'static Metrics,
) -> anyhow::Result<()> {
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_serving::<CloudProviderServer<CloudProviderService>>()
        .await;
    let router = transport()
        .add_service(health)
        .add_service(metered::Metered::new(
            CloudProviderServer::new(CloudProviderService::new(provider))
                .max_decoding_message_size(MAX_REQUEST_BYTES),
            counts,
        ));
    let tcp = door::incoming(listener, limits);
    match tls {
        None => router.serve_with_incoming_shutdown(tcp, shutdown).await?,
        Some(tls) => {
            router
                .serve_with_incoming_shutdown(handshaken(tcp, tls), shutdown)
                .await?
        }
    }
    Ok(())
}

/// TLS over the door's connections: each handshake runs in its own task (with the
/// config current at that moment, so renewed files apply to new connections), bounded
/// by [`TLS_HANDSHAKE_TIMEOUT`]; only finished handshakes reach the server.
fn handshaken(
    tcp: impl futures::Stream<Item = std::io::Result<door::LimitedStream>> + Send + 'static,
    tls: Arc<ReloadingTls>,
) -> impl futures::Stream<Item = std::io::Result<tokio_rustls::server::TlsStream<door::LimitedStream>>>
       + Send
       + 'static {
    use futures::StreamExt;
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    tokio::spawn(async move {
        let mut tcp = std::pin::pin!(tcp);
        while let Some(conn) = tcp.next().await {
            let Ok(conn) = conn else { continue };
            let acceptor = tokio_rustls::TlsAcceptor::from(tls.config());
            let tx = tx.clone();
            tokio::spawn(async move {
                match tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, acceptor.accept(conn)).await {
                    Ok(Ok(stream)) => {
                        let _ = tx.send(Ok(stream)).await;
                    }
                    Ok(Err(e)) => tracing::debug!(error = %e, "TLS handshake failed"),
                    Err(_) => tracing::debug!("TLS handshake timed out"),
                }
            });
        }
    });
    futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|s| (s, rx)) })
}

/// mTLS: our certificate and key, and the CA client certificates must chain to, read
/// again whenever the files change.
pub fn tls_config(t: &crate::config::TlsFile) -> anyhow::Result<Arc<ReloadingTls>> {
    Ok(Arc::new(ReloadingTls::load(t)?))
}

/// Binds `addr` (port 0 picks a free port) and returns the listener and its address.
pub async fn bind(addr: SocketAddr) -> anyhow::Result<(TcpListener, SocketAddr)> {
    let l = TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {addr}: {e}"))?;
    let local = l.local_addr()?;
    Ok((l, local))
}

//! The externalgrpc CloudProvider service (tonic): decode, validate, call the core,
//! map errors to status codes. No business logic lives here.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, UnixListener};

use crate::proto::cloud_provider_server::CloudProviderServer;
use crate::provider::Provider;
use crate::telemetry::metrics::{metrics, Metrics};

pub mod deadline;
pub mod door;
pub mod in_process;
pub mod listen;
pub mod metered;
pub mod options;
mod service;
pub mod tls;

pub use crate::config::ListenAddr;
pub use door::ConnectionLimits;

/// A bound listener the server takes connections from.
#[derive(Debug)]
pub enum Listener {
    Tcp(TcpListener),
    /// The socket file is removed when the server stops serving it.
    Unix(UnixListener, listen::SocketFile),
}

impl From<TcpListener> for Listener {
    fn from(l: TcpListener) -> Self {
        Listener::Tcp(l)
    }
}

/// Binds `addr`: a TCP address (port 0 picks a free port), or a Unix socket file
/// made as [`listen::bind_unix`] says. Returns the listener and where it listens.
pub async fn bind_listen(addr: &ListenAddr) -> anyhow::Result<(Listener, String)> {
    match addr {
        ListenAddr::Tcp(a) => {
            let (l, local) = bind(*a).await?;
            Ok((Listener::Tcp(l), local.to_string()))
        }
        ListenAddr::Unix(path) => {
            let (l, file) = listen::bind_unix(path).await?;
            Ok((Listener::Unix(l, file), addr.to_string()))
        }
    }
}
pub use service::CloudProviderService;
pub use tls::ReloadingTls;

/// Serves the CloudProvider service and grpc.health.v1 on `listener` until
/// `shutdown` resolves, with the default connection limits.
pub async fn serve(
    listener: impl Into<Listener>,
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
    listener: impl Into<Listener>,
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
    listener: impl Into<Listener>,
    provider: Arc<Provider>,
    tls: Option<Arc<ReloadingTls>>,
    shutdown: impl Future<Output = ()> + Send + 'static,
    limits: ConnectionLimits,
    counts: &'static Metrics,
) -> anyhow::Result<()> {
    let router = router(provider, counts).await;
    match (listener.into(), tls) {
        (Listener::Tcp(l), None) => {
            router
                .serve_with_incoming_shutdown(door::incoming(l, limits), shutdown)
                .await?
        }
        (Listener::Tcp(l), Some(tls)) => {
            let tcp = door::incoming(l, limits);
            router
                .serve_with_incoming_shutdown(handshaken(tcp, tls), shutdown)
                .await?
        }
        (Listener::Unix(l, _file), None) => {
            router
                .serve_with_incoming_shutdown(unix_incoming(l, limits), shutdown)
                .await?
        }
        (Listener::Unix(_, file), Some(_)) => anyhow::bail!(
            "{}: TLS is for TCP; a Unix socket is guarded by its file's owner and mode",
            file.path().display()
        ),
    }
    Ok(())
}

/// The Unix socket's connections, through the front door and the authority rewrite:
/// clients on gRPC's C core send the socket's path as `:authority`, which h2 refuses;
/// on the socket only, such an authority becomes `localhost` ([`crate::h2_authority`] says why
/// that is safe). TCP connections never pass through it.
pub fn unix_incoming(
    listener: UnixListener,
    limits: ConnectionLimits,
) -> impl futures::Stream<
    Item = std::io::Result<
        crate::h2_authority::Rewritten<door::LimitedStream<tokio::net::UnixStream>>,
    >,
> + Send
       + 'static {
    use futures::StreamExt;
    door::incoming(listener, limits).map(|c| c.map(crate::h2_authority::Rewritten::new))
}

/// The services a server offers: health, and the CloudProvider service over
/// `provider`, metered into `counts`.
async fn router(
    provider: Arc<Provider>,
    counts: &'static Metrics,
) -> tonic::transport::server::Router {
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_serving::<CloudProviderServer<CloudProviderService>>()
        .await;
    transport()
        .add_service(health)
        .add_service(metered::Metered::new(
            CloudProviderServer::new(CloudProviderService::new(provider))
                .max_decoding_message_size(MAX_REQUEST_BYTES),
            counts,
        ))
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

/// A client channel to a server on the Unix socket at `path` (loadgen, tests,
/// `check-config` in a pod). The URI is only a placeholder HTTP/2 needs.
pub async fn connect_unix(path: &std::path::Path) -> anyhow::Result<tonic::transport::Channel> {
    let path = path.to_path_buf();
    let shown = path.display().to_string();
    tonic::transport::Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_: http::Uri| {
            let path = path.clone();
            async move {
                tokio::net::UnixStream::connect(path)
                    .await
                    .map(hyper_util::rt::TokioIo::new)
            }
        }))
        .await
        .map_err(|e| anyhow::anyhow!("cannot connect to unix://{shown}: {e}"))
}

/// Binds `addr` (port 0 picks a free port) and returns the listener and its address.
pub async fn bind(addr: SocketAddr) -> anyhow::Result<(TcpListener, SocketAddr)> {
    let l = TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {addr}: {e}"))?;
    let local = l.local_addr()?;
    Ok((l, local))
}

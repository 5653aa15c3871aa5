//! The gRPC server without a socket: CA's calls reach it over in-memory pipes on
//! the caller's runtime. For tests on tokio's paused clock, where nothing may wait on
//! the kernel (issue 39: model tests that replay exactly); the server is the one
//! [`super::serve`] runs, with the same services, limits and metrics.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, DuplexStream, ReadBuf};
use tonic::transport::{server::Connected, Channel, Endpoint};

use crate::provider::Provider;
use crate::telemetry::metrics::metrics;

/// How much one pipe holds in each direction before a writer waits.
const PIPE_BYTES: usize = 1 << 20;

/// One end of a pipe the server takes as a connection.
pub struct Pipe(DuplexStream);

impl Connected for Pipe {
    type ConnectInfo = ();
    fn connect_info(&self) -> Self::ConnectInfo {}
}

impl AsyncRead for Pipe {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for Pipe {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

/// Serves `provider` on a task of the current runtime and returns a channel to it:
/// every connection the channel opens is a new pipe the server takes.
pub async fn serve(provider: Arc<Provider>) -> anyhow::Result<Channel> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Pipe>();
    let incoming = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|pipe| (Ok::<_, io::Error>(pipe), rx))
    });
    let router = super::router(provider, metrics()).await;
    tokio::spawn(async move {
        if let Err(e) = router.serve_with_incoming(incoming).await {
            tracing::warn!(error = %e, "the in-process gRPC server stopped");
        }
    });
    let channel = Endpoint::from_static("http://in-process")
        .connect_with_connector(tower::service_fn(move |_: http::Uri| {
            let (ours, theirs) = tokio::io::duplex(PIPE_BYTES);
            let sent = tx.send(Pipe(theirs));
            async move {
                sent.map_err(|_| io::Error::new(io::ErrorKind::ConnectionRefused, "server gone"))?;
                Ok::<_, io::Error>(hyper_util::rt::TokioIo::new(ours))
            }
        }))
        .await?;
    Ok(channel)
}

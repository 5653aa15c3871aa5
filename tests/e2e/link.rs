//! A replica's link to the API server that the soak can cut (issue 75's network pause):
//! a TCP relay on loopback between one client and kube-apiserver, bytes passed as they
//! come (TLS end to end: the relay reads nothing). `cut` plays a partition as the
//! client sees one: silence, not an error. Every connection open at the cut, and every
//! one opened during it, stops passing bytes both ways and stays open; at `heal` those
//! connections are closed (what was sent into the silence is never delivered, as when a
//! middlebox forgets the flow), and new connections pass bytes again.
//!
//! Not played: bytes held through the partition and delivered late (a request sent
//! before the cut reaching the API server after another replica took the Lease). The
//! soak's checker judges each write by the Lease's holder when the API server logged
//! it, so it could not tell such a late write from a replica that wrote while it did not
//! lead.

use std::net::SocketAddr;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

pub struct Link {
    /// Where the client connects (`https://{addr}` in its kubeconfig).
    pub addr: SocketAddr,
    /// Whether the link is cut.
    state: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Link {
    /// A relay to `upstream` on a port of its own, on the runtime that calls it.
    pub async fn start(upstream: SocketAddr) -> std::io::Result<Link> {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let (state, watching) = watch::channel(false);
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                tokio::spawn(relay(client, upstream, watching.clone()));
            }
        });
        Ok(Link { addr, state, task })
    }

    /// The partition begins.
    pub fn cut(&self) {
        self.state.send_replace(true);
    }

    /// The partition ends: what it held is closed, new connections pass.
    pub fn heal(&self) {
        self.state.send_replace(false);
    }

    pub fn is_cut(&self) -> bool {
        *self.state.borrow()
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One client connection: passed to `upstream` until a cut; then held silent until the
/// heal, and closed.
async fn relay(mut client: TcpStream, upstream: SocketAddr, mut state: watch::Receiver<bool>) {
    let _ = client.set_nodelay(true);
    if !*state.borrow_and_update() {
        let Ok(mut server) = TcpStream::connect(upstream).await else {
            return; // the API server is down: the client sees its connection closed
        };
        let _ = server.set_nodelay(true);
        let passed = tokio::select! {
            _ = tokio::io::copy_bidirectional(&mut client, &mut server) => true,
            _ = state.wait_for(|cut| *cut) => false,
        };
        if passed {
            return; // one side closed: the relay closes the other
        }
        // Cut: both sockets stay open and silent until the heal.
        let _ = state.wait_for(|cut| !*cut).await;
        drop(server);
    } else {
        let _ = state.wait_for(|cut| !*cut).await;
    }
    drop(client);
}

/// `kubeconfig`'s text with its server's address replaced by the link's.
pub fn through(kubeconfig: &str, server: &str, link: &Link) -> String {
    kubeconfig.replace(server, &format!("https://{}", link.addr))
}

//! A replica's link to the API server that the soak can break (issue 75's network pause):
//! a TCP relay on loopback between one client and kube-apiserver, bytes passed as they
//! come (TLS end to end: the relay reads nothing). Two breaks, both silence as the
//! client sees them, not an error:
//!
//! - `cut`: a partition the connections do not survive. Every connection open at the
//!   cut, and every one opened during it, stops passing bytes both ways and stays open;
//!   at `heal` those connections are closed (what was sent into the silence is never
//!   delivered, as when a middlebox forgets the flow), and new connections pass again.
//! - `pause`: a pause the path recovers from, as TCP does by sending again. Nothing
//!   passes while it lasts; at `heal` what either side sent is delivered, in order, and
//!   the connections go on. A request sent before or during the pause reaches the API
//!   server late, perhaps after another replica took the Lease. Each pause is recorded
//!   ([`Link::pauses`]): when it began and healed, and for each connection that held
//!   bytes the client sent, when the first of them came (over HTTP/1.1 a connection
//!   carries one request at a time, and one sent into a pause waits there for its
//!   answer: so when the request was sent), for the checker to tell a late write from
//!   a replica writing while it did not lead.

use std::net::SocketAddr;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Open,
    Cut,
    Pause,
}

/// The link's state: its mode, how many cuts it has had (a connection that lived
/// through one is closed) and how many pauses (each counts a connection's held bytes
/// once).
#[derive(Debug, Clone, Copy)]
struct State {
    mode: Mode,
    cuts: u64,
    pauses: u64,
}

/// One pause: when it began and healed (RFC 3339 UTC), and when each connection that
/// held bytes the client sent got the first of them (delivered at the heal).
#[derive(Debug, Clone)]
pub struct Pause {
    pub from: String,
    pub to: String,
    pub sent: Vec<String>,
}

/// When each connection first held the client's bytes in the pause under way.
type Held = Arc<Mutex<Vec<String>>>;

pub struct Link {
    /// Where the client connects (`https://{addr}` in its kubeconfig).
    pub addr: SocketAddr,
    state: watch::Sender<State>,
    /// Connections that held the client's bytes in the pause under way.
    held: Held,
    began: Mutex<Option<String>>,
    pauses: Mutex<Vec<Pause>>,
    task: tokio::task::JoinHandle<()>,
}

fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
}

impl Link {
    /// A relay to `upstream` on a port of its own, on the runtime that calls it.
    pub async fn start(upstream: SocketAddr) -> std::io::Result<Link> {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let (state, watching) = watch::channel(State {
            mode: Mode::Open,
            cuts: 0,
            pauses: 0,
        });
        let held = Held::default();
        let counted = held.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                tokio::spawn(relay(client, upstream, watching.clone(), counted.clone()));
            }
        });
        Ok(Link {
            addr,
            state,
            held,
            began: Mutex::new(None),
            pauses: Mutex::new(Vec::new()),
            task,
        })
    }

    /// The partition begins: what it holds is closed at the heal.
    pub fn cut(&self) {
        self.state.send_modify(|s| {
            s.mode = Mode::Cut;
            s.cuts += 1;
        });
    }

    /// The pause begins: what it holds is delivered at the heal.
    pub fn pause(&self) {
        self.held.lock().clear();
        *self.began.lock() = Some(now());
        self.state.send_modify(|s| {
            s.mode = Mode::Pause;
            s.pauses += 1;
        });
    }

    /// The break ends: a cut's connections are closed, a pause's deliver what they
    /// held; new connections pass.
    pub fn heal(&self) {
        let was = self.state.borrow().mode;
        if was == Mode::Pause {
            let from = self.began.lock().take().unwrap_or_default();
            self.pauses.lock().push(Pause {
                from,
                to: now(),
                sent: std::mem::take(&mut *self.held.lock()),
            });
        }
        self.state.send_modify(|s| s.mode = Mode::Open);
    }

    /// Whether the link is cut or paused.
    pub fn is_broken(&self) -> bool {
        self.state.borrow().mode != Mode::Open
    }

    /// Every pause so far that has healed.
    pub fn pauses(&self) -> Vec<Pause> {
        self.pauses.lock().clone()
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// How one direction of a connection ended.
#[derive(PartialEq, Eq)]
enum Ended {
    /// Its sender closed (or failed): the other direction goes on.
    Closed,
    /// The connection lived through a cut: both directions end, the sockets close.
    Cut,
}

/// One client connection: opened upstream once the link is open (a cut's are closed
/// at its heal), then passed both ways.
async fn relay(
    client: TcpStream,
    upstream: SocketAddr,
    mut state: watch::Receiver<State>,
    held: Held,
) {
    let start = *state.borrow_and_update();
    let born = start.cuts;
    match start.mode {
        Mode::Open => {}
        Mode::Cut => {
            // Opened during a cut: closed at its heal, what it sent never delivered.
            let _ = state.wait_for(|s| s.mode == Mode::Open).await;
            return;
        }
        Mode::Pause => {
            // Opened during a pause: it holds what the client sends until the heal.
            held.lock().push(now());
            let _ = state.wait_for(|s| s.mode == Mode::Open).await;
            if state.borrow().cuts != born {
                return;
            }
        }
    }
    let _ = client.set_nodelay(true);
    let Ok(server) = TcpStream::connect(upstream).await else {
        return; // the API server is down: the client sees its connection closed
    };
    let _ = server.set_nodelay(true);
    let (from_client, to_client) = client.into_split();
    let (from_server, to_server) = server.into_split();
    let up = pump(from_client, to_server, state.clone(), born, Some(held));
    let down = pump(from_server, to_client, state, born, None);
    tokio::pin!(up, down);
    let (first, other_up) = tokio::select! {
        e = &mut up => (e, false),
        e = &mut down => (e, true),
    };
    if first == Ended::Closed {
        // One side closed: the other direction goes on until it closes or is cut.
        if other_up {
            up.await;
        } else {
            down.await;
        }
    }
}

/// One direction: read, and pass on while the link is open. A chunk read during a
/// break is held until it heals (counted in `held`, for the client's direction of a
/// pause), and nothing more is read meanwhile: the rest waits in the sockets as in a
/// stalled TCP flow. A connection that lived through a cut ends at its heal.
async fn pump(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    mut state: watch::Receiver<State>,
    born: u64,
    held: Option<Held>,
) -> Ended {
    let mut buf = vec![0u8; 64 * 1024];
    let mut counted = 0; // the last pause this connection's bytes were counted in
    loop {
        let n = tokio::select! {
            r = from.read(&mut buf) => match r {
                Ok(0) | Err(_) => {
                    let _ = to.shutdown().await;
                    return Ended::Closed;
                }
                Ok(n) => Some(n),
            },
            // An idle connection lives through a cut too: it ends at the heal.
            _ = async { drop(state.wait_for(|s| s.cuts != born).await) } => None,
        };
        let Some(n) = n else {
            let _ = state.wait_for(|s| s.mode == Mode::Open).await;
            return Ended::Cut;
        };
        let now = *state.borrow_and_update();
        if let (Mode::Pause, Some(h)) = (now.mode, &held) {
            if counted != now.pauses {
                counted = now.pauses;
                h.lock().push(self::now());
            }
        }
        if now.mode != Mode::Open {
            let _ = state.wait_for(|s| s.mode == Mode::Open).await;
        }
        if state.borrow().cuts != born {
            return Ended::Cut;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return Ended::Closed;
        }
    }
}

/// `kubeconfig`'s text with its server's address replaced by the link's.
pub fn through(kubeconfig: &str, server: &str, link: &Link) -> String {
    kubeconfig.replace(server, &format!("https://{}", link.addr))
}

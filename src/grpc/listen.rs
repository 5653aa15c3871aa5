//! The Unix socket the CloudProvider API is served on (sidecar and bundled modes, as
//! the kubelet's device plugins and CSI drivers do): only the pod's own user and group
//! may open it.
//!
//! The socket file is made safely, at its own path and no other: bound, given mode
//! 0660, and only then listened on. A Unix socket that is bound but not yet listening
//! refuses every connection (ECONNREFUSED), so no other user can reach it while its
//! mode is still the umask's; and `bind` creates the file or fails, so it never
//! replaces one. No temporary, longer name is needed: every path of at most 107 bytes
//! (the kernel's limit, which the configuration checks) can be listened on. A socket
//! file left by a process that died is replaced; one a live server answers on is not,
//! and neither is anything that is not a socket. The file is removed when the server
//! stops, if it is still the one this process made.

use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use tokio::net::UnixListener;

/// Who may open the socket: its owner and group, read and write (connecting needs
/// write permission).
pub const SOCKET_MODE: u32 = 0o660;

/// Connections the kernel queues before the server accepts them (std's own default).
const LISTEN_BACKLOG: i32 = 1024;

/// A bound socket file: removed on drop if the file at its path is still this one.
#[derive(Debug)]
pub struct SocketFile {
    path: PathBuf,
    /// (device, inode) of the socket this process made.
    id: (u64, u64),
}

impl SocketFile {
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for SocketFile {
    fn drop(&mut self) {
        match std::fs::symlink_metadata(&self.path) {
            Ok(m) if (m.dev(), m.ino()) == self.id => {
                if let Err(e) = std::fs::remove_file(&self.path) {
                    tracing::warn!(path = %self.path.display(), error = %e, "could not remove the gRPC socket file");
                }
            }
            // Replaced by another process's socket since, or gone: not ours to remove.
            _ => {}
        }
    }
}

/// Binds the Unix socket at `path` with [`SOCKET_MODE`]: a stale socket left there
/// is replaced, a live one or anything else is refused. Errors name the path and
/// what to do.
pub async fn bind_unix(path: &Path) -> anyhow::Result<(UnixListener, SocketFile)> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .ok_or_else(|| anyhow::anyhow!("{}: the socket path has no directory", path.display()))?;
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => anyhow::bail!(
            "cannot listen on {}: {} is not a directory",
            path.display(),
            dir.display()
        ),
        Err(e) => anyhow::bail!(
            "cannot listen on {}: its directory {} cannot be used ({e}); create it (in a pod: an emptyDir mounted there in both containers)",
            path.display(),
            dir.display()
        ),
    }
    clear_stale(path).await?;
    let addr = socket2::SockAddr::unix(path)
        .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", path.display()))?;
    let socket = socket2::Socket::new(socket2::Domain::UNIX, socket2::Type::STREAM, None)
        .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", path.display()))?;
    socket.bind(&addr).map_err(|e| {
        if e.kind() == std::io::ErrorKind::AddrInUse {
            anyhow::anyhow!(
                "cannot listen on {}: a file appeared there while starting; not replacing it",
                path.display()
            )
        } else {
            anyhow::anyhow!(
                "cannot listen on {}: binding in {} failed ({e}); the directory must be writable by this user",
                path.display(),
                dir.display()
            )
        }
    })?;
    // Bound, not listening: every connection is refused until listen() below, so the
    // mode the umask gave the file for this moment lets nobody in.
    let m = std::fs::symlink_metadata(path).map_err(|e| {
        let _ = std::fs::remove_file(path);
        anyhow::anyhow!("cannot listen on {}: {e}", path.display())
    })?;
    let file = SocketFile {
        path: path.to_path_buf(),
        id: (m.dev(), m.ino()),
    };
    // From here on, a failure removes the file again (SocketFile's drop).
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(SOCKET_MODE))
        .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", path.display()))?;
    socket
        .listen(LISTEN_BACKLOG)
        .and_then(|()| socket.set_nonblocking(true))
        .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", path.display()))?;
    let listener = UnixListener::from_std(std::os::unix::net::UnixListener::from(socket))
        .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", path.display()))?;
    Ok((listener, file))
}
/// Removes a socket file no server answers on; refuses a live one and anything that
/// is not a socket.
async fn clear_stale(path: &Path) -> anyhow::Result<()> {
    let m = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => anyhow::bail!("cannot listen on {}: {e}", path.display()),
    };
    if !m.file_type().is_socket() {
        anyhow::bail!(
            "cannot listen on {}: a file that is not a socket is there; not replacing it",
            path.display()
        );
    }
    match tokio::net::UnixStream::connect(path).await {
        Ok(_) => anyhow::bail!(
            "cannot listen on {}: another server is answering on that socket",
            path.display()
        ),
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
            tracing::info!(path = %path.display(), "replacing a socket file no server answers on (left by a process that stopped)");
            std::fs::remove_file(path)
                .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", path.display()))
        }
        Err(e) => anyhow::bail!(
            "cannot listen on {}: a socket is there and cannot be checked ({e}); not replacing it",
            path.display()
        ),
    }
}

//! The CloudProvider API on a Unix socket (issue 45): `listen: unix:///path` serves
//! the same API on a socket file only its owner and group may open (0660), made
//! safely, replacing a stale socket but never a live one or another file, with a clear
//! error when its directory is missing, and removed when the server stops.

use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use ca_asg_provider::cloud::memory::{MemoryCloud, MemoryGroup, MemoryTiming};
use ca_asg_provider::config::ListenAddr;
use ca_asg_provider::grpc;
use ca_asg_provider::proto::cloud_provider_client::CloudProviderClient;
use ca_asg_provider::proto::NodeGroupsRequest;
use ca_asg_provider::provider::Provider;

mod support;

async fn provider() -> Arc<Provider> {
    let cloud = MemoryCloud::new(
        vec![MemoryGroup::new("web", 0, 5, 2, "m5.large")],
        MemoryTiming::default(),
    );
    let p =
        ca_asg_provider::world::provider(Arc::new(cloud), ca_asg_provider::world::named(&["web"]))
            .await
            .unwrap();
    p
}

/// A directory anyone may enter, so that only the socket's own mode decides who
/// connects.
fn socket_dir() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = dir.path().join("grpc.sock");
    (dir, path)
}

/// Serves the provider on `path` until the returned sender is dropped or fired.
async fn serve_on(
    path: &Path,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<anyhow::Result<()>>,
) {
    let (listener, shown) = grpc::bind_listen(&ListenAddr::Unix(path.to_path_buf()))
        .await
        .unwrap();
    assert_eq!(shown, format!("unix://{}", path.display()));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(grpc::serve(listener, provider().await, None, async {
        let _ = stopped.await;
    }));
    (stop, server)
}

#[tokio::test]
async fn the_api_is_served_on_a_socket_only_its_owner_and_group_may_open_and_removed_at_stop() {
    let (_dir, path) = socket_dir();
    let (stop, server) = serve_on(&path).await;
    let meta = std::fs::symlink_metadata(&path).unwrap();
    assert!(meta.file_type().is_socket());
    assert_eq!(
        meta.permissions().mode() & 0o777,
        0o660,
        "owner and group only"
    );
    let mut ca = CloudProviderClient::new(grpc::connect_unix(&path).await.unwrap());
    let groups = ca
        .node_groups(NodeGroupsRequest {})
        .await
        .unwrap()
        .into_inner()
        .node_groups;
    assert_eq!(groups.len(), 1);
    assert_eq!(groups[0].id, "web");
    assert_eq!(
        std::fs::read_dir(path.parent().unwrap()).unwrap().count(),
        1,
        "no temporary file is left beside the socket"
    );
    drop(ca);
    stop.send(()).unwrap();
    server.await.unwrap().unwrap();
    assert!(
        !path.exists(),
        "the socket file is removed when the server stops"
    );
}

#[tokio::test]
async fn a_stale_socket_is_replaced_and_a_live_one_or_another_file_is_not() {
    let (_dir, path) = socket_dir();
    // A socket file left by a process that died: nobody answers on it.
    drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
    assert!(path.exists());
    let (stop, server) = serve_on(&path).await;
    let mut ca = CloudProviderClient::new(grpc::connect_unix(&path).await.unwrap());
    ca.node_groups(NodeGroupsRequest {}).await.unwrap();
    // A second server on the same path while the first answers: refused, and the
    // first keeps serving.
    let e = grpc::bind_listen(&ListenAddr::Unix(path.clone()))
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("another server is answering"), "{e}");
    ca.node_groups(NodeGroupsRequest {}).await.unwrap();
    drop(ca);
    stop.send(()).unwrap();
    server.await.unwrap().unwrap();
    // Anything that is not a socket is never removed.
    std::fs::write(&path, b"not a socket").unwrap();
    let e = grpc::bind_listen(&ListenAddr::Unix(path.clone()))
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("not a socket") && e.contains("grpc.sock"), "{e}");
    assert_eq!(std::fs::read(&path).unwrap(), b"not a socket");
}

#[tokio::test]
async fn a_missing_directory_is_named_in_the_error() {
    let (dir, _) = socket_dir();
    let path = dir.path().join("absent").join("grpc.sock");
    let e = grpc::bind_listen(&ListenAddr::Unix(path))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("absent") && e.contains("cannot be used") && e.contains("emptyDir"),
        "{e}"
    );
}

/// What a process of another user (and group `gid`) gets when it connects: 0 when
/// it connected, else the errno. Run in a forked child that drops root first.
fn connect_as(path: &Path, uid: u32, gid: u32) -> i32 {
    use std::os::unix::ffi::OsStrExt;
    let bytes = path.as_os_str().as_bytes();
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (d, s) in addr.sun_path.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    // SAFETY: the child only makes system calls and exits; nothing is allocated
    // between fork and _exit.
    unsafe {
        let pid = libc::fork();
        assert!(pid >= 0, "fork");
        if pid == 0 {
            if libc::setgroups(0, std::ptr::null()) != 0
                || libc::setgid(gid) != 0
                || libc::setuid(uid) != 0
            {
                libc::_exit(100);
            }
            let fd = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0);
            let r = libc::connect(
                fd,
                &addr as *const libc::sockaddr_un as *const libc::sockaddr,
                std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t,
            );
            let code = if r == 0 { 0 } else { *libc::__errno_location() };
            libc::_exit(code);
        }
        let mut status = 0;
        libc::waitpid(pid, &mut status, 0);
        libc::WEXITSTATUS(status)
    }
}

/// Only the socket's owner and group connect: a process of another user and group
/// is refused (EACCES); one in the socket's group connects. Needs root to act as
/// other users; says so and checks nothing else without it.
#[tokio::test]
async fn a_client_without_the_sockets_user_or_group_is_refused() {
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: acting as other users needs root");
        return;
    }
    let (_dir, path) = socket_dir();
    let (stop, server) = serve_on(&path).await;
    // The group CA's container runs as (the chart gives both containers one group).
    let group = 65532;
    std::os::unix::fs::chown(&path, None, Some(group)).unwrap();
    let stranger = tokio::task::spawn_blocking({
        let path = path.clone();
        move || connect_as(&path, 65534, 65534)
    });
    assert_eq!(
        stranger.await.unwrap(),
        libc::EACCES,
        "another user and group is refused"
    );
    let member = tokio::task::spawn_blocking({
        let path = path.clone();
        move || connect_as(&path, 65533, group)
    });
    assert_eq!(member.await.unwrap(), 0, "the socket's group connects");
    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(10), server)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

/// `serve --listen unix://PATH` with the real binary: the child, and its stderr.
fn spawn_serve(listen: &str) -> std::process::Child {
    std::process::Command::new(env!("CARGO_BIN_EXE_ca-asg-provider"))
        .args(["serve", "--memory-cloud", "2:4", "--listen", listen])
        .args(["--metrics-listen", "127.0.0.1:0"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

/// Waits until the socket answers NodeGroups (or the child exits, or 20 s pass).
async fn wait_served(path: &Path, child: &mut std::process::Child) -> Vec<String> {
    for _ in 0..400 {
        if let Some(status) = child.try_wait().unwrap() {
            let mut err = String::new();
            std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
            panic!(
                "serve exited ({status}) before serving {}: {err}",
                path.display()
            );
        }
        if let Ok(channel) = grpc::connect_unix(path).await {
            if let Ok(r) = CloudProviderClient::new(channel)
                .node_groups(NodeGroupsRequest {})
                .await
            {
                return r
                    .into_inner()
                    .node_groups
                    .into_iter()
                    .map(|g| g.id)
                    .collect();
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{} never answered", path.display());
}

/// SIGTERM, then the exit status within 20 s.
async fn stop(child: &mut std::process::Child) -> std::process::ExitStatus {
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    for _ in 0..400 {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = child.kill();
    panic!("still running 20 s after SIGTERM");
}

/// A socket path of exactly `len` bytes under `base`: directories of at most 51
/// bytes each ("/" and the name), then "/grpc.sock".
fn path_of_len(base: &Path, len: usize) -> PathBuf {
    let left = len - base.as_os_str().len() - "/grpc.sock".len();
    let parts = left.div_ceil(51);
    let mut dir = base.to_path_buf();
    for i in 0..parts {
        let part = left / parts + usize::from(i < left % parts);
        dir = dir.join("d".repeat(part - 1));
    }
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("grpc.sock");
    assert_eq!(path.as_os_str().len(), len);
    path
}

/// Issue 59: every socket path the configuration accepts (up to 107 bytes, the
/// kernel's sun_path) is listened on by `serve`, with the file's mode and removal
/// as for any path; the first it refuses, 108 bytes, is refused by the configuration
/// check, naming the field and the path's length. (Until the fix, `serve` bound under
/// a longer temporary name and failed to start from 101 bytes on.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_socket_path_the_configuration_accepts_is_served_and_the_first_it_refuses_is_named() {
    let base = tempfile::tempdir().unwrap();
    for len in [100, 101, 106, 107] {
        let case = base.path().join(len.to_string());
        std::fs::create_dir(&case).unwrap();
        let path = path_of_len(&case, len);
        let mut child = spawn_serve(&format!("unix://{}", path.display()));
        let groups = wait_served(&path, &mut child).await;
        assert_eq!(groups.len(), 2, "{len} bytes: {groups:?}");
        let mode = std::fs::symlink_metadata(&path)
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o660, "{len} bytes");
        assert_eq!(
            std::fs::read_dir(path.parent().unwrap()).unwrap().count(),
            1,
            "{len} bytes: nothing but the socket beside it"
        );
        assert!(stop(&mut child).await.success(), "{len} bytes");
        assert!(!path.exists(), "{len} bytes: removed at stop");
    }
    let case = base.path().join("108");
    std::fs::create_dir(&case).unwrap();
    let path = path_of_len(&case, 108);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ca-asg-provider"))
        .args(["serve", "--memory-cloud", "2:4", "--listen"])
        .arg(format!("unix://{}", path.display()))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "refused at start: {err}");
    assert!(
        err.contains("listen:") && err.contains("108 bytes") && err.contains("at most 107"),
        "{err}"
    );
    assert!(!path.exists());
}

/// Issue 59: a client on gRPC's C core (grpcio; the C++, Ruby, PHP and C# stacks share
/// it) reaches the service over the socket with its default authority, as grpc-go
/// (CA) and tonic do. The socket is made as the chart's sidecar and bundled modes
/// (`transport: unix`, the default) and the sidecar overlay make it: `serve` with
/// `listen: unix://<socketDir>/grpc.sock` in a directory anyone may write (an
/// emptyDir), the file 0660.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_on_grpcs_c_core_is_answered_over_the_socket_with_its_default_authority() {
    let Some(python) = support::grpcio::python() else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    let socket_dir = root.path().join("var/run/ca-asg-provider");
    std::fs::create_dir_all(&socket_dir).unwrap();
    std::fs::set_permissions(&socket_dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let path = socket_dir.join("grpc.sock");
    let mut child = spawn_serve(&format!("unix://{}", path.display()));
    wait_served(&path, &mut child).await;
    let mode = std::fs::symlink_metadata(&path)
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o660);
    // grpcio sends this target's path, percent-encoded, as its :authority.
    let (groups, label) =
        support::grpcio::ask(&python, &format!("unix://{}", path.display()), None).await;
    for g in &groups {
        assert_eq!(g.len(), 2, "{groups:?}");
    }
    assert_eq!(label, "k8s.amazonaws.com/accelerator");
    assert!(stop(&mut child).await.success());
    assert!(!path.exists());
}

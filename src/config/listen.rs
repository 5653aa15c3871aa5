//! Where the CloudProvider API is served: a TCP address, or a Unix socket file
//! (`unix:///path`) that only the pod's own user and group may open, for sidecar and
//! bundled modes where CA and the service share a pod. Parsed here; bound by
//! `grpc::listen`.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;

/// The scheme CA's externalgrpc `address` takes for a socket (grpc-go's resolver).
pub const UNIX_SCHEME: &str = "unix://";

/// The longest socket path the kernel takes (`sun_path` holds 108 bytes with the NUL).
pub const MAX_SOCKET_PATH: usize = 107;

/// Where the gRPC server listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListenAddr {
    Tcp(SocketAddr),
    /// An absolute path, from `unix:///path`.
    Unix(PathBuf),
}

impl fmt::Display for ListenAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ListenAddr::Tcp(a) => write!(f, "{a}"),
            ListenAddr::Unix(p) => write!(f, "{UNIX_SCHEME}{}", p.display()),
        }
    }
}

impl ListenAddr {
    /// Reads `host:port` or `unix:///absolute/path`. Pure; the error names what is
    /// wrong with the value.
    pub fn parse(value: &str) -> Result<Self, String> {
        let Some(rest) = value.strip_prefix(UNIX_SCHEME) else {
            return value.parse::<SocketAddr>().map(ListenAddr::Tcp).map_err(|_| {
                format!(
                    "{value:?} is not an address like 127.0.0.1:8086 or unix:///var/run/ca-asg-provider/grpc.sock"
                )
            });
        };
        if !rest.starts_with('/') {
            return Err(format!(
                "{value:?}: a Unix socket address takes an absolute path after unix:// (unix:///var/run/ca-asg-provider/grpc.sock)"
            ));
        }
        if rest.len() > MAX_SOCKET_PATH {
            return Err(format!(
                "{value:?}: the socket path is {} bytes; the kernel takes at most {MAX_SOCKET_PATH}",
                rest.len()
            ));
        }
        if rest.contains('\0') {
            return Err(format!("{value:?}: the socket path holds a NUL byte"));
        }
        // CA passes its address through Go's net.SplitHostPort before dialing: a path
        // with a colon of its own fails there ("too many colons in address").
        if rest.contains(':') {
            return Err(format!(
                "{value:?}: the socket path holds a colon, which cluster-autoscaler cannot dial (its address goes through net.SplitHostPort)"
            ));
        }
        if rest.ends_with('/') {
            return Err(format!(
                "{value:?}: the socket path names a directory; name the socket file"
            ));
        }
        Ok(ListenAddr::Unix(PathBuf::from(rest)))
    }

    /// Whether a client outside this machine could reach it: a TCP address that is
    /// not loopback (a socket file never is).
    pub fn is_exposed(&self) -> bool {
        match self {
            ListenAddr::Tcp(a) => !a.ip().is_loopback(),
            ListenAddr::Unix(_) => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_tcp_and_unix_addresses_and_names_what_is_wrong() {
        assert_eq!(
            ListenAddr::parse("127.0.0.1:8086").unwrap(),
            ListenAddr::Tcp("127.0.0.1:8086".parse().unwrap())
        );
        let sock = ListenAddr::parse("unix:///var/run/ca-asg-provider/grpc.sock").unwrap();
        assert_eq!(
            sock,
            ListenAddr::Unix("/var/run/ca-asg-provider/grpc.sock".into())
        );
        assert_eq!(
            sock.to_string(),
            "unix:///var/run/ca-asg-provider/grpc.sock"
        );
        assert!(!sock.is_exposed());
        assert!(ListenAddr::parse("0.0.0.0:1").unwrap().is_exposed());
        assert!(!ListenAddr::parse("[::1]:1").unwrap().is_exposed());
        for (bad, says) in [
            ("nowhere", "not an address like"),
            ("unix://relative/grpc.sock", "absolute path"),
            ("unix:/var/run/x.sock", "not an address like"),
            ("unix:///var/run/a:b/grpc.sock", "colon"),
            ("unix:///var/run/dir/", "directory"),
            ("unix:///var/run/\0x", "NUL"),
        ] {
            let e = ListenAddr::parse(bad).unwrap_err();
            assert!(e.contains(says), "{bad:?}: {e}");
        }
        let long = format!("unix:///{}", "a".repeat(MAX_SOCKET_PATH));
        assert!(ListenAddr::parse(&long)
            .unwrap_err()
            .contains("at most 107"));
        let fits = format!("unix:///{}", "a".repeat(MAX_SOCKET_PATH - 1));
        assert!(ListenAddr::parse(&fits).is_ok());
    }
}

//! `listen`, `metricsListen`, `tls` and `insecure`: the two doors and who may knock.

use std::net::SocketAddr;

use super::Problems;
use crate::config::{FileConfig, ListenAddr, Overrides, TlsFile};
use crate::config::{DEFAULT_LISTEN, DEFAULT_METRICS_LISTEN};

/// The resolved doors.
pub struct Doors {
    pub listen: ListenAddr,
    pub metrics_listen: SocketAddr,
    pub tls: Option<TlsFile>,
}

/// The flag over the file over the default for each address; TLS files readable, and
/// a non-loopback gRPC address without TLS refused unless `insecure`.
pub fn resolve(file: &FileConfig, flags: &Overrides, problems: &mut Problems) -> Doors {
    let listen_s = flags
        .listen
        .clone()
        .or(file.listen.clone())
        .unwrap_or_else(|| DEFAULT_LISTEN.to_string());
    let listen = match ListenAddr::parse(&listen_s) {
        Ok(a) => a,
        Err(e) => {
            problems.bad("listen", e);
            ListenAddr::parse(DEFAULT_LISTEN).expect("default listen address parses")
        }
    };

    let metrics_s = flags
        .metrics_listen
        .clone()
        .or_else(|| file.metrics_listen.clone())
        .unwrap_or_else(|| DEFAULT_METRICS_LISTEN.to_string());
    let metrics_listen = match metrics_s.parse::<SocketAddr>() {
        Ok(a) => a,
        Err(_) => {
            problems.bad(
                "metricsListen",
                format!("{metrics_s:?} is not an address like 0.0.0.0:8087"),
            );
            DEFAULT_METRICS_LISTEN
                .parse()
                .expect("default metrics address parses")
        }
    };

    let insecure = flags.insecure || file.insecure.unwrap_or(false);
    if let (Some(_), ListenAddr::Unix(_)) = (&file.tls, &listen) {
        problems.bad(
            "tls",
            format!("{listen} is a Unix socket, guarded by its file's owner and mode (0660): tls applies to a TCP listen address only; remove tls or listen on TCP"),
        );
    } else if let Some(t) = &file.tls {
        for (k, p) in [
            ("tls.cert", &t.cert),
            ("tls.key", &t.key),
            ("tls.clientCA", &t.client_ca),
        ] {
            if !p.is_file() {
                problems.bad(k, format!("{} is not a readable file", p.display()));
            }
        }
    } else if listen.is_exposed() && !insecure {
        problems.bad(
            "listen",
            format!("{listen} is not a loopback address and no tls is configured: refusing to expose the CloudProvider API in clear text (set tls, or --insecure to accept the risk)"),
        );
    }

    Doors {
        listen,
        metrics_listen,
        tls: file.tls.clone(),
    }
}

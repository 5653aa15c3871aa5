//! mTLS whose certificate, key and client CA follow the files on disk. cert-manager
//! renews them in place (a Secret volume swaps a symlink); a server that read them
//! once would serve an expired certificate after 90 days of uptime, and refuse CA's
//! renewed client certificate once the client CA rotates.
//!
//! Each handshake takes the current rustls config. The files are looked at (three
//! `stat`s) at most once per [`RECHECK`]; when one changed, all three are read and a
//! new config is built. A set that does not load (a rotation caught halfway) keeps
//! the previous config, is logged and counted, and is tried again at the next check.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use parking_lot::Mutex;
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::config::TlsFile;

/// How often the files are looked at, at most.
pub const RECHECK: Duration = Duration::from_secs(5);

/// What identifies one version of a file: its modification time and length, and the
/// target of a symlink (a Secret volume's `..data` swap changes only that).
type Stamp = Option<(Option<SystemTime>, u64, Option<PathBuf>)>;

fn stamp(p: &Path) -> Stamp {
    let meta = std::fs::metadata(p).ok()?;
    Some((
        meta.modified().ok(),
        meta.len(),
        std::fs::canonicalize(p).ok(),
    ))
}

struct Current {
    config: Arc<rustls::ServerConfig>,
    stamps: [Stamp; 3],
    checked: Instant,
    /// The stamps of a set that failed to load, so it is reported once.
    failed: Option<[Stamp; 3]>,
}

/// The server's TLS settings, reloaded when the files change.
pub struct ReloadingTls {
    files: TlsFile,
    recheck: Duration,
    current: Mutex<Current>,
}

impl ReloadingTls {
    /// Reads the files once; an unreadable or invalid set is an error naming the
    /// file, so a bad mount stops the start instead of the first handshake.
    pub fn load(files: &TlsFile) -> anyhow::Result<Self> {
        Self::with_recheck(files, RECHECK)
    }

    /// [`Self::load`] with another recheck interval (tests).
    pub fn with_recheck(files: &TlsFile, recheck: Duration) -> anyhow::Result<Self> {
        let stamps = stamps(files);
        let config = build(files)?;
        Ok(Self {
            files: files.clone(),
            recheck,
            current: Mutex::new(Current {
                config,
                stamps,
                checked: Instant::now(),
                failed: None,
            }),
        })
    }

    /// The config for the next handshake.
    pub fn config(&self) -> Arc<rustls::ServerConfig> {
        let mut cur = self.current.lock();
        if cur.checked.elapsed() < self.recheck {
            return cur.config.clone();
        }
        cur.checked = Instant::now();
        let now = stamps(&self.files);
        if now == cur.stamps || cur.failed.as_ref() == Some(&now) {
            return cur.config.clone();
        }
        match build(&self.files) {
            Ok(config) => {
                tracing::info!(cert = %self.files.cert.display(), "TLS certificate, key or client CA changed on disk; new handshakes use them");
                crate::telemetry::metrics::metrics().tls_reloads("ok");
                cur.config = config;
                cur.stamps = now;
                cur.failed = None;
            }
            Err(e) => {
                tracing::warn!(error = %e, "TLS files changed but do not load (yet); still serving the previous certificate");
                crate::telemetry::metrics::metrics().tls_reloads("error");
                cur.failed = Some(now);
            }
        }
        cur.config.clone()
    }
}

fn stamps(f: &TlsFile) -> [Stamp; 3] {
    [stamp(&f.cert), stamp(&f.key), stamp(&f.client_ca)]
}

fn read(what: &str, p: &Path) -> anyhow::Result<Vec<u8>> {
    std::fs::read(p).map_err(|e| anyhow::anyhow!("tls.{what}: cannot read {}: {e}", p.display()))
}

/// A rustls server config: our chain and key, client certificates required and
/// verified against the client CA, HTTP/2 only.
fn build(f: &TlsFile) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    let bad = |what: &str, p: &Path, e: &dyn std::fmt::Display| {
        anyhow::anyhow!("tls.{what}: {}: {e}", p.display())
    };
    let cert_pem = read("cert", &f.cert)?;
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&cert_pem)
        .collect::<Result<_, _>>()
        .map_err(|e| bad("cert", &f.cert, &e))?;
    if chain.is_empty() {
        return Err(bad("cert", &f.cert, &"no PEM certificate in the file"));
    }
    let key_pem = read("key", &f.key)?;
    let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| bad("key", &f.key, &e))?;
    let ca_pem = read("clientCA", &f.client_ca)?;
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(&ca_pem) {
        let c = c.map_err(|e| bad("clientCA", &f.client_ca, &e))?;
        roots
            .add(c)
            .map_err(|e| bad("clientCA", &f.client_ca, &e))?;
    }
    if roots.is_empty() {
        return Err(bad(
            "clientCA",
            &f.client_ca,
            &"no PEM certificate in the file",
        ));
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .build()
    .map_err(|e| bad("clientCA", &f.client_ca, &e))?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| anyhow::anyhow!("tls: {e}"))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .map_err(|e| anyhow::anyhow!("tls.cert/tls.key ({}): {e}", f.cert.display()))?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

//! Logging setup in one place: human-readable on a terminal, JSON with
//! `--log-format json`; level from `--log-level` or `RUST_LOG`.

pub mod http;
pub mod liveness;
pub mod metrics;
pub mod process;
pub mod readiness;

use std::io::IsTerminal;

/// The source revision this binary was built from (build.rs: the release's, the
/// checkout's commit, or `unknown` without git), shown by `--version` and `build_info`.
pub const REVISION: &str = env!("CA_ASG_PROVIDER_REVISION");

/// `--version`: the crate's version and the revision, so two builds of one version differ.
pub const LONG_VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (revision ",
    env!("CA_ASG_PROVIDER_REVISION"),
    ")"
);

use tracing_subscriber::{fmt, EnvFilter};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Human,
    Json,
}

/// Installs the global subscriber. Safe to call twice (the second call is ignored).
pub fn init_logging(format: LogFormat, level: &str) {
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(level))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = fmt().with_env_filter(filter).with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
        LogFormat::Human => builder
            .with_ansi(std::io::stderr().is_terminal())
            .compact()
            .try_init(),
    };
}

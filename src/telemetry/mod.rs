//! Logging setup in one place: human-readable on a terminal, JSON with
//! `--log-format json`; level from `--log-level` or `RUST_LOG`.

pub mod http;
pub mod liveness;
pub mod metrics;
pub mod process;
pub mod readiness;

use std::io::IsTerminal;

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

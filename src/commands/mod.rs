//! The command line: one file per command. A command uses the library, never another
//! command; what two commands share lives with its subject (the configuration flags in
//! `config`, the AWS client in `cloud::aws`, template printing in `provider::template`).

pub mod check;
pub mod demo;
pub mod drain;
pub mod remove_hooks;
pub mod serve;
pub mod status;
pub mod undrain;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::config::ConfigArgs;
use crate::telemetry::{init_logging, LogFormat};

#[derive(Debug, Parser)]
#[command(
    name = "ca-asg-provider",
    version = crate::telemetry::LONG_VERSION,
    about = "cluster-autoscaler externalgrpc cloud provider for EC2 Auto Scaling Groups"
)]
pub struct Cli {
    /// Log format: human (default) or json.
    #[arg(long, value_enum, default_value = "human", global = true)]
    pub log_format: LogFormat,
    /// Log level or filter (RUST_LOG wins when set).
    #[arg(long, default_value = "info", global = true)]
    pub log_level: String,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the externalgrpc CloudProvider API for cluster-autoscaler.
    #[command(
        after_help = "Exit codes: 0 stopped cleanly (SIGTERM or SIGINT); 1 it could not start \
(an invalid configuration, no region, an address it cannot listen on) or stopped on an error."
    )]
    Serve(serve::ServeArgs),
    /// Run the real server on an in-memory cloud and drive it like cluster-autoscaler.
    #[command(after_help = "Exit codes: 0 the demo ran through; 1 a step of it failed.")]
    Demo(demo::DemoArgs),
    /// Load and validate the configuration, read AWS, and print what was found.
    #[command(
        after_help = "Exit codes: 0 all is well; 1 an AWS, group, queue or Kubernetes \
permission problem (finding no group is one); 2 the configuration is invalid (a region \
that is not an AWS region, or none set)."
    )]
    CheckConfig(ConfigArgs),
    /// Drain one node with the scale-in engine (workloads first, DaemonSet pods last).
    #[command(
        after_help = "Exit codes: 0 drained (with --terminate: and its instance ended), or \
the plan printed (--dry-run); 1 the node is not found, the configuration is invalid, or the \
drain was abandoned at its deadline or failed (the node is given back when abandoned), or \
it was interrupted (SIGINT or SIGTERM: it says how the node is left, releases its Lease and \
prints the `undrain` line)."
    )]
    Drain(drain::DrainArgs),
    /// List the drains in progress (read-only): node, group, reasons, phase, elapsed,
    /// what blocks it, its deadline.
    #[command(
        after_help = "Exit codes: 0 listed (also when nothing drains); 1 the cluster \
cannot be read; 2 the configuration is invalid."
    )]
    Status(status::StatusArgs),
    /// Remove the lifecycle hooks this service created (at uninstall), so that no
    /// instance waits for a hook nobody answers.
    RemoveHooks(remove_hooks::RemoveHooksArgs),
    /// Give a node back after an abandoned or interrupted drain: remove this service's
    /// taint, drain record and own cordon, only when no drain runs for it.
    Undrain(undrain::UndrainArgs),
}

/// The multi-threaded runtime a binary runs its command on (`ca-asg-provider`,
/// `loadgen`); when it cannot start, the error is said and the exit code given.
pub fn runtime() -> Result<tokio::runtime::Runtime, ExitCode> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| {
            eprintln!("error: cannot start the async runtime: {e}");
            ExitCode::FAILURE
        })
}

pub async fn run(cli: Cli) -> ExitCode {
    match cli.command {
        Command::Demo(args) => {
            init_logging(cli.log_format, quiet_default(&cli.log_level));
            report(demo::run(args).await)
        }
        Command::Serve(args) => {
            init_logging(cli.log_format, &cli.log_level);
            report(serve::run(args).await)
        }
        Command::Drain(args) => {
            init_logging(cli.log_format, &cli.log_level);
            report(drain::run(args).await)
        }
        Command::CheckConfig(args) => {
            // Its answer is the report: the AWS SDK's own warnings (a region or
            // credentials provider that found nothing) would come before it and say
            // less; the report says what is wrong.
            let level = match cli.log_level.as_str() {
                "info" => "warn,aws=error",
                other => other,
            };
            init_logging(cli.log_format, level);
            check::run(args).await
        }
        Command::RemoveHooks(args) => {
            init_logging(cli.log_format, quiet_default(&cli.log_level));
            remove_hooks::run(args).await
        }
        Command::Status(args) => {
            init_logging(cli.log_format, quiet_default(&cli.log_level));
            status::run(args).await
        }
        Command::Undrain(args) => {
            init_logging(cli.log_format, quiet_default(&cli.log_level));
            undrain::run(args).await
        }
    }
}

/// Commands that print their own report log only warnings unless a level was asked
/// for (the default `info` would interleave with their output).
fn quiet_default(level: &str) -> &str {
    if level == "info" {
        "warn"
    } else {
        level
    }
}

fn report(r: anyhow::Result<()>) -> ExitCode {
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Resolves on SIGTERM or Ctrl-C (`serve` stops; `drain NODE` stops and says how
/// the node is left).
pub(crate) async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {},
                    _ = tokio::signal::ctrl_c() => {},
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
    tracing::info!("shutdown signal received");
}

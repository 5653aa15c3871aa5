//! The command line: one file per command. A command uses the library, never another
//! command; what two commands share lives with its subject (the configuration flags in
//! `config`, the AWS client in `cloud::aws`, template printing in `provider::template`).

pub mod check;
pub mod demo;
pub mod drain;
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
    version,
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
    Serve(serve::ServeArgs),
    /// Run the real server on an in-memory cloud and drive it like cluster-autoscaler.
    Demo(demo::DemoArgs),
    /// Load and validate the configuration, read AWS, and print what was found.
    CheckConfig(ConfigArgs),
    /// Drain one node with the scale-in engine (workloads first, DaemonSet pods last).
    Drain(drain::DrainArgs),
    /// List the drains in progress (read-only): node, group, reasons, phase, elapsed,
    /// what blocks it, its deadline.
    Status(status::StatusArgs),
    /// Give a node back after an abandoned or interrupted drain: remove this service's
    /// taint, drain record and own cordon, only when no drain runs for it.
    Undrain(undrain::UndrainArgs),
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
            init_logging(cli.log_format, quiet_default(&cli.log_level));
            check::run(args).await
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

//! The `ca-asg-provider` binary: parses the command line and hands over to the library.

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = ca_asg_provider::commands::Cli::parse();
    let rt = match ca_asg_provider::commands::runtime() {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    rt.block_on(ca_asg_provider::commands::run(cli))
}

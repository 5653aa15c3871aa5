//! The `loadgen` binary: parses the command line and hands over to the library.

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let rt = match ca_asg_provider::commands::runtime() {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    // `loadgen serve ...` is the server child loadgen starts: the product's own command
    // line and code (`ca_asg_provider::commands`) on the same runtime, as the shipped
    // `ca-asg-provider serve` runs them.
    if std::env::args_os()
        .nth(1)
        .is_some_and(|a| a == loadgen::SERVE)
    {
        let cli = ca_asg_provider::commands::Cli::parse();
        return rt.block_on(ca_asg_provider::commands::run(cli));
    }
    let cli = loadgen::Cli::parse();
    ca_asg_provider::telemetry::init_logging(cli.log_format, &cli.log_level);
    match rt.block_on(loadgen::run(cli.args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

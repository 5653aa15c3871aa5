//! The command-line flags every command that reads the configuration shares
//! (`serve`, `check-config`, `drain`): the file and the flags that override it.
//! The flags only `serve` uses (where it listens, `--insecure`) are [`ServeFlags`]:
//! the other commands refuse them.

use std::path::PathBuf;

use clap::Args;

use super::{Config, ConfigError, Overrides};

#[derive(Debug, Args, Clone, Default)]
pub struct ConfigArgs {
    /// YAML configuration file.
    #[arg(long, short = 'c', env = "CA_ASG_PROVIDER_CONFIG")]
    pub config: Option<PathBuf>,
    /// AWS region (default: AWS_REGION, the AWS profile, then the instance metadata; never guessed).
    #[arg(long)]
    pub region: Option<String>,
    /// AWS endpoint override, e.g. http://127.0.0.1:5000 for moto.
    #[arg(long)]
    pub aws_endpoint: Option<String>,
    /// A static group, CA syntax min:max:name. Repeatable.
    #[arg(long = "nodes")]
    pub nodes: Vec<String>,
    /// Tag discovery, CA syntax asg:tag=key[=value],key2. Repeatable.
    #[arg(long = "node-group-auto-discovery")]
    pub auto_discovery: Vec<String>,
    /// How often Refresh re-reads AWS, e.g. 60s.
    #[arg(long)]
    pub refresh_interval: Option<String>,
}

/// The flags only `serve` takes: where it listens, and `--insecure`.
#[derive(Debug, Args, Clone, Default)]
pub struct ServeFlags {
    /// gRPC listen address (default 127.0.0.1:8086).
    #[arg(long)]
    pub listen: Option<String>,
    /// Address for /metrics, /healthz and /readyz (overrides metricsListen).
    #[arg(long)]
    pub metrics_listen: Option<String>,
    /// Allow listening on a non-loopback address without TLS.
    #[arg(long)]
    pub insecure: bool,
}

impl ConfigArgs {
    /// The overrides these flags and `serve`'s give.
    pub fn overrides(&self, serve: &ServeFlags) -> Overrides {
        Overrides {
            listen: serve.listen.clone(),
            metrics_listen: serve.metrics_listen.clone(),
            region: self.region.clone(),
            aws_endpoint: self.aws_endpoint.clone(),
            nodes: self.nodes.clone(),
            auto_discovery: self.auto_discovery.clone(),
            refresh_interval: self.refresh_interval.clone(),
            insecure: serve.insecure,
        }
    }

    /// The configuration, for a command that does not serve.
    pub fn load(&self) -> Result<Config, ConfigError> {
        self.load_serving(&ServeFlags::default())
    }

    /// The configuration in `file` (else the defaults and the environment), for a
    /// command whose only configuration flag is `--config` (`status`, `undrain`).
    pub fn load_file(file: Option<&PathBuf>) -> Result<Config, ConfigError> {
        ConfigArgs {
            config: file.cloned(),
            ..Default::default()
        }
        .load()
    }

    /// The configuration with `serve`'s own flags.
    pub fn load_serving(&self, serve: &ServeFlags) -> Result<Config, ConfigError> {
        super::load(self.config.as_ref(), &self.overrides(serve))
    }
}

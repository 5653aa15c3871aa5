//! Command line: `serve`, `demo`, `check-config`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::cloud::Cloud;
use crate::config::{self, Config, Overrides};
use crate::provider::Provider;
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
    Serve(ServeArgs),
    /// Run the real server on an in-memory cloud and drive it like cluster-autoscaler.
    Demo(crate::demo::DemoArgs),
    /// Load and validate the configuration, read AWS, and print what was found.
    CheckConfig(ConfigArgs),
    /// Drain one node with the scale-in engine (workloads first, DaemonSet pods last).
    Drain(DrainArgs),
    /// Act like cluster-autoscaler against a server on a seeded memory cloud and
    /// report latency, RPC/s, CPU and memory.
    Loadgen(crate::loadgen::LoadgenArgs),
}

#[derive(Debug, Args, Clone)]
pub struct ServeArgs {
    #[command(flatten)]
    pub config: ConfigArgs,
    /// Serve the built-in in-memory cloud seeded with GROUPS:NODES instead of AWS (for
    /// load tests; scale-in then terminates at once, there is no cluster to drain).
    #[arg(long, value_name = "GROUPS:NODES")]
    pub memory_cloud: Option<String>,
}

#[derive(Debug, Args, Clone)]
pub struct DrainArgs {
    /// The Node to drain.
    pub node: String,
    /// Print the plan (which pods, in which phase) and change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// After the drain, end the instance as DeleteNodes would (lifecycle hook or
    /// terminate with decrement). Without it the node is left cordoned and running.
    #[arg(long)]
    pub terminate: bool,
    #[command(flatten)]
    pub config: ConfigArgs,
}

#[derive(Debug, Args, Clone, Default)]
pub struct ConfigArgs {
    /// YAML configuration file.
    #[arg(long, short = 'c', env = "CA_ASG_PROVIDER_CONFIG")]
    pub config: Option<PathBuf>,
    /// gRPC listen address (default 127.0.0.1:8086).
    #[arg(long)]
    pub listen: Option<String>,
    /// Address for /metrics, /healthz and /readyz (overrides metricsListen).
    #[arg(long)]
    pub metrics_listen: Option<String>,
    /// AWS region (default: AWS_REGION, then us-east-1).
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
    /// Allow listening on a non-loopback address without TLS.
    #[arg(long)]
    pub insecure: bool,
}

impl ConfigArgs {
    fn overrides(&self) -> Overrides {
        Overrides {
            listen: self.listen.clone(),
            metrics_listen: self.metrics_listen.clone(),
            region: self.region.clone(),
            aws_endpoint: self.aws_endpoint.clone(),
            nodes: self.nodes.clone(),
            auto_discovery: self.auto_discovery.clone(),
            refresh_interval: self.refresh_interval.clone(),
            insecure: self.insecure,
        }
    }

    pub fn load(&self) -> Result<Config, config::ConfigError> {
        config::load(self.config.as_ref(), &self.overrides())
    }
}

pub async fn run(cli: Cli) -> ExitCode {
    match cli.command {
        Command::Demo(args) => {
            init_logging(cli.log_format, quiet_default(&cli.log_level));
            report(crate::demo::run(args).await)
        }
        Command::Serve(args) => {
            init_logging(cli.log_format, &cli.log_level);
            report(serve(args).await)
        }
        Command::Loadgen(args) => {
            init_logging(cli.log_format, quiet_default(&cli.log_level));
            report(crate::loadgen::run(args).await)
        }
        Command::Drain(args) => {
            init_logging(cli.log_format, &cli.log_level);
            report(crate::drain_cmd::run(args).await)
        }
        Command::CheckConfig(args) => {
            init_logging(cli.log_format, quiet_default(&cli.log_level));
            crate::check::run(args).await
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

/// The AWS backend for a configuration.
pub async fn aws_cloud(cfg: &Config) -> anyhow::Result<Arc<dyn Cloud>> {
    let settings = crate::cloud::aws::AwsSettings {
        region: Some(cfg.region.clone()),
        endpoint_url: cfg.aws_endpoint.clone(),
        max_attempts: cfg.aws_max_attempts,
    };
    let aws: Arc<dyn Cloud> = Arc::new(crate::cloud::aws::AwsCloud::new(&settings).await);
    Ok(Arc::new(crate::cloud::instrumented::Instrumented(aws)))
}

async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let mut cfg = args.config.load()?;
    let cloud = match &args.memory_cloud {
        Some(shape) => {
            let (groups, nodes) =
                crate::loadgen::seed::parse_shape(shape).map_err(anyhow::Error::msg)?;
            let memory = crate::cloud::memory::MemoryCloud::new(
                crate::loadgen::seed::fleet(groups, nodes),
                crate::cloud::memory::MemoryTiming::default(),
            );
            if cfg.provider.selector.names.is_empty() && cfg.provider.selector.tag_sets.is_empty() {
                cfg.provider.selector.tag_sets = vec![vec![crate::cloud::TagFilter {
                    key: "k8s.io/cluster-autoscaler/enabled".into(),
                    value: None,
                }]];
            }
            cfg.drain_enabled = false;
            tracing::warn!(groups, nodes, "serving the in-memory cloud, not AWS");
            let memory: Arc<dyn Cloud> = Arc::new(memory);
            Arc::new(crate::cloud::instrumented::Instrumented(memory)) as Arc<dyn Cloud>
        }
        None => {
            cfg.require_groups()?;
            aws_cloud(&cfg).await?
        }
    };
    let provider = Provider::new(cloud.clone(), cfg.provider.clone());
    provider.start_background();
    spawn_initial_refresh(provider.clone());
    let mut engine_for_shutdown = None;
    let mut liveness = Arc::new(crate::telemetry::liveness::Liveness::default());
    if cfg.drain_enabled {
        let client = crate::scalein::kube_client().await?;
        let engine = crate::scalein::Engine::new(
            client,
            cloud,
            Some(provider.clone()),
            cfg.scale_in.clone(),
        );
        provider.set_scale_in(Arc::new(crate::scalein::DrainScaleIn(engine.clone())));
        engine.elect_leader();
        liveness = engine.liveness.clone();
        engine_for_shutdown = Some(engine.clone());
        crate::scalein::lifecycle::spawn_loop(engine, provider.clone());
        tracing::info!(daemonsets = ?cfg.scale_in.daemonsets, mode = ?cfg.scale_in.mode, "scale-in drain enabled");
    } else {
        tracing::warn!(
            "scale-in drain disabled (scaleIn.enabled: false): DeleteNodes terminates at once"
        );
    }
    let (mlistener, maddr) = crate::telemetry::http::bind(cfg.metrics_listen).await?;
    tracing::info!(addr = %maddr, "serving /metrics, /healthz, /readyz");
    tokio::spawn(crate::telemetry::http::serve(
        mlistener,
        provider.clone(),
        liveness,
        shutdown_signal(),
    ));
    let (listener, addr) = crate::grpc::bind(cfg.listen).await?;
    tracing::info!(%addr, groups = ?cfg.provider.selector.names, discovery = cfg.provider.selector.tag_sets.len(), "serving externalgrpc CloudProvider");
    let tls = match &cfg.tls {
        Some(t) => Some(crate::grpc::tls_config(t)?),
        None => None,
    };
    let grpc = crate::grpc::serve(listener, provider, tls, shutdown_signal());
    // Graceful, but bounded: a client that never answers the GOAWAY must not keep the
    // process alive until the kubelet's SIGKILL.
    let deadline = async {
        shutdown_signal().await;
        tokio::time::sleep(SHUTDOWN_GRACE).await;
    };
    tokio::select! {
        r = grpc => r?,
        _ = deadline => tracing::warn!(grace = ?SHUTDOWN_GRACE, "connections still open after the shutdown grace period; exiting"),
    }
    if let Some(engine) = engine_for_shutdown {
        engine.step_down().await;
    }
    tracing::info!("stopped");
    Ok(())
}

/// How long in-flight RPCs get to finish after SIGTERM.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// Loads the first state in the background, retrying with backoff, so the server
/// listens at once and Refresh answers Unavailable until AWS has been read.
pub fn spawn_initial_refresh(provider: Arc<Provider>) {
    tokio::spawn(async move {
        let mut delay = Duration::from_secs(1);
        while !provider.is_loaded() {
            match provider.refresh_now().await {
                Ok(()) => {
                    tracing::info!(
                        groups = provider.registry().groups.len(),
                        "node groups loaded"
                    );
                    return;
                }
                Err(e) => {
                    tracing::warn!(error = %e, retry_in = ?delay, "first refresh failed");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(30));
                }
            }
        }
    });
}

/// Resolves on SIGTERM or Ctrl-C.
pub async fn shutdown_signal() {
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

//! `serve`: the externalgrpc CloudProvider for cluster-autoscaler, the scale-in drain,
//! the lifecycle-hook loop and the operations port, until SIGTERM.

use std::sync::Arc;
use std::time::Duration;

use clap::Args;

use crate::cloud::memory::{fleet, MemoryCloud, MemoryTiming};
use crate::cloud::Cloud;
use crate::config::{ConfigArgs, ServeFlags};
use crate::provider::Provider;

#[derive(Debug, Args, Clone)]
pub struct ServeArgs {
    #[command(flatten)]
    pub config: ConfigArgs,
    #[command(flatten)]
    pub serve: ServeFlags,
    /// Serve the built-in in-memory cloud seeded with GROUPS:NODES instead of AWS (for
    /// load tests; scale-in then terminates at once, there is no cluster to drain).
    #[arg(long, value_name = "GROUPS:NODES")]
    pub memory_cloud: Option<String>,
    /// Observe only (for a staged rollout): answer CA's reads, decide every write and
    /// every drain, log it and put it in an Event, but change nothing in AWS or the
    /// cluster. CA's IncreaseSize/DecreaseTargetSize/DeleteNodes get an error that
    /// says what would have happened.
    #[arg(long)]
    pub dry_run: bool,
}

pub async fn run(args: ServeArgs) -> anyhow::Result<()> {
    let mut cfg = args.config.load_serving(&args.serve)?;
    let cloud = match &args.memory_cloud {
        Some(shape) => {
            let (groups, nodes) = fleet::parse_shape(shape).map_err(anyhow::Error::msg)?;
            let memory = MemoryCloud::new(fleet::fleet(groups, nodes), MemoryTiming::default());
            if cfg.region.is_empty() {
                cfg.set_region(crate::cloud::memory::REGION.into());
            }
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
            let region = crate::cloud::aws::resolve_known_region(&cfg.aws_settings())
                .await
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            cfg.set_region(region);
            crate::cloud::aws::connect(&cfg.aws_settings()).await
        }
    };
    serve_with(cfg, &args, cloud).await
}

/// `serve` once its configuration is read and its cloud chosen (AWS, or the built-in
/// memory cloud): the provider, the drain with its election, queue and hook scan, the
/// operations port and CA's gRPC, until SIGTERM. The soak (`tests/e2e_soak.rs`) runs
/// each of its replicas through here with the cloud its driver serves.
pub async fn serve_with(
    mut cfg: crate::config::Config,
    args: &ServeArgs,
    cloud: Arc<dyn Cloud>,
) -> anyhow::Result<()> {
    let cloud = if args.dry_run {
        tracing::warn!(
            "DRY RUN: nothing is written to AWS or the cluster; decisions are logged and evented"
        );
        cfg.provider.dry_run = true;
        cfg.scale_in.dry_run = true;
        Arc::new(crate::cloud::read_only::ReadOnly(cloud)) as Arc<dyn Cloud>
    } else {
        cloud
    };
    let provider = Provider::new(cloud.clone(), cfg.provider.clone());
    provider.start_background();
    provider.spawn_initial_refresh();
    let mut engine_for_shutdown = None;
    let mut liveness = Arc::new(crate::telemetry::liveness::Liveness::default());
    if cfg.drain_enabled {
        let mut client = crate::scalein::kube_client().await?;
        if args.dry_run {
            client = crate::scalein::stages::preview::read_only_client(client);
        }
        let engine = crate::scalein::Engine::new(
            client,
            cloud,
            Some(provider.clone()),
            cfg.scale_in.clone(),
        );
        provider.set_scale_in(Arc::new(crate::scalein::DrainScaleIn(engine.clone())));
        engine.elect_leader();
        // The leader's own picture of AWS stays fresh whether CA calls it or not.
        let leads = Arc::downgrade(&engine);
        provider.spawn_keep_fresh(move || leads.upgrade().is_some_and(|e| e.is_leader()));
        liveness = engine.tools.liveness.clone();
        engine_for_shutdown = Some(engine.clone());
        start_queue(&cfg, args, &engine, &provider).await;
        crate::scalein::sources::hook_scan::spawn_loop(engine, provider.clone());
        tracing::info!(daemonsets = ?cfg.scale_in.daemonsets, mode = ?cfg.scale_in.mode, "scale-in drain enabled");
    } else {
        tracing::warn!(
            "scale-in drain disabled (scaleIn.enabled: false): DeleteNodes terminates at once"
        );
    }
    let (mlistener, maddr) = crate::telemetry::http::bind(cfg.metrics_listen).await?;
    tracing::info!(addr = %maddr, "serving /metrics, /healthz, /readyz");
    let status: Arc<dyn crate::telemetry::http::Status> = match &cfg.listen {
        crate::config::ListenAddr::Unix(path) => Arc::new(ThroughTheSocket {
            inner: provider.clone(),
            path: path.clone(),
        }),
        crate::config::ListenAddr::Tcp(_) => provider.clone(),
    };
    // An unready pod says why in its own Events (needs the drain's Kubernetes client).
    if let (Some(engine), Some(pod)) =
        (&engine_for_shutdown, crate::telemetry::readiness::own_pod())
    {
        crate::telemetry::readiness::spawn(
            engine.tools.client.clone(),
            pod,
            status.clone(),
            liveness.clone(),
            crate::telemetry::readiness::Teller::default(),
            crate::telemetry::readiness::LOOK_EVERY,
        );
    }
    tokio::spawn(crate::telemetry::http::serve(
        mlistener,
        status,
        liveness,
        super::shutdown_signal(),
    ));
    let (listener, addr) = crate::grpc::bind_listen(&cfg.listen).await?;
    tracing::info!(%addr, groups = ?cfg.provider.selector.names, discovery = cfg.provider.selector.tag_sets.len(), "serving externalgrpc CloudProvider");
    let tls = match &cfg.tls {
        Some(t) => Some(crate::grpc::tls_config(t)?),
        None => None,
    };
    let grpc = crate::grpc::serve(listener, provider, tls, super::shutdown_signal());
    // Graceful, but bounded: a client that never answers the GOAWAY must not keep the
    // process alive until the kubelet's SIGKILL.
    let deadline = async {
        super::shutdown_signal().await;
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

/// Queue mode, when configured: the consumer runs on the leader beside the lifecycle
/// poll, which stays as the safety net (slowed to `safetyNetPollInterval` by the
/// configuration). Not in a dry run: receiving hides a message from its consumer.
async fn start_queue(
    cfg: &crate::config::Config,
    args: &ServeArgs,
    engine: &Arc<crate::scalein::Engine>,
    provider: &Arc<Provider>,
) {
    let Some(url) = &cfg.interruption.queue_url else {
        return;
    };
    if args.dry_run {
        tracing::warn!(queue = %url, "dry run: the interruption queue is not consumed (a received message is hidden from its real consumer)");
        return;
    }
    let queue = crate::cloud::aws::sqs::SqsQueue::new(&cfg.aws_settings(), url).await;
    let consumer = crate::scalein::sources::queue::Consumer::new(
        engine.clone(),
        provider.clone(),
        Arc::new(queue),
        cfg.interruption.clone(),
    );
    consumer.spawn();
    tracing::info!(queue = %url, rebalance = ?cfg.interruption.rebalance, safety_net_poll = ?engine.settings().lifecycle_poll_interval, "interruption queue mode on");
}

/// How long in-flight RPCs get to finish after SIGTERM.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// Readiness through the gRPC socket: ready only while a client can connect to it, as
/// CA in the same pod does. A socket file removed or replaced under the service (a
/// second container binding the same path) makes the pod unready instead of leaving CA
/// unable to reach it unnoticed.
struct ThroughTheSocket {
    inner: Arc<Provider>,
    path: std::path::PathBuf,
}

impl crate::telemetry::http::Status for ThroughTheSocket {
    fn readiness(&self) -> Result<(), String> {
        crate::telemetry::http::Status::readiness(&*self.inner)?;
        std::os::unix::net::UnixStream::connect(&self.path)
            .map(drop)
            .map_err(|e| {
                format!(
                    "the gRPC socket unix://{} does not take connections: {e}",
                    self.path.display()
                )
            })
    }

    fn before_scrape(&self) {
        crate::telemetry::http::Status::before_scrape(&*self.inner)
    }
}

//! `ca-asg-provider loadgen`: acts like cluster-autoscaler against a server on the
//! memory cloud seeded with N nodes in G groups, and reports per-RPC latency, RPC/s,
//! loop time, and the server's CPU and memory read from /proc.

mod ca_loop;
pub mod drain_overhead;
pub mod drain_storm;
mod process;
pub mod stats;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Serialize;
use tonic::transport::{Channel, Endpoint};

use ca_loop::Client;
pub use ca_loop::{node_for, Fleet};
use process::{ProcSample, ProcWatch};
use stats::{MethodSummary, Samples};

#[derive(Debug, clap::Args, Clone)]
pub struct LoadgenArgs {
    /// Nodes (running instances) in the memory cloud.
    #[arg(long, default_value_t = 5000)]
    pub nodes: usize,
    /// Node groups (ASGs) in the memory cloud.
    #[arg(long, default_value_t = 200)]
    pub groups: usize,
    /// Measured CA loops (after one warm-up loop).
    #[arg(long, default_value_t = 10)]
    pub loops: usize,
    /// Connections for the concurrent NodeGroupForNode phase.
    #[arg(long, default_value_t = 8)]
    pub connections: usize,
    /// Passes over every node in the concurrent phase.
    #[arg(long, default_value_t = 4)]
    pub concurrent_passes: usize,
    /// Use a server that is already running at this address instead of starting one
    /// (its CPU and memory are read only with --server-pid).
    #[arg(long)]
    pub server: Option<SocketAddr>,
    #[arg(long, requires = "server")]
    pub server_pid: Option<u32>,
    /// Also measure the drain overhead over this many nodes on the in-memory API
    /// server (0 = skip).
    #[arg(long, default_value_t = 10)]
    pub drain_nodes: usize,
    /// Write the report as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Instead of the CA loop: a drain storm of this many nodes entering
    /// Terminating:Wait at once, on the in-memory API server (README "Performance").
    #[arg(long, value_name = "NODES")]
    pub drain_storm: Option<usize>,
    /// The storm's Kubernetes API rate limit (scaleIn.apiQps).
    #[arg(long, default_value_t = 50.0)]
    pub storm_api_qps: f64,
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub nodes: usize,
    pub groups: usize,
    pub loops: usize,
    pub rpcs_per_loop: usize,
    pub sequential: Vec<MethodSummary>,
    pub loop_wall_ms: Summary,
    pub server_cpu_ms_per_loop: Option<Summary>,
    /// Share of the server's CPU in the loops spent in the kernel (syscalls, wakeups).
    pub server_cpu_kernel_share: Option<f64>,
    pub concurrent: Option<Concurrent>,
    pub server_rss_mib_after_loops: Option<f64>,
    pub server_peak_rss_mib: Option<f64>,
    pub aws_calls_in_steady_loops: Option<u64>,
    pub drain_overhead: Option<drain_overhead::Overhead>,
}

#[derive(Debug, Serialize)]
pub struct Concurrent {
    pub connections: usize,
    pub calls: usize,
    pub rpc_per_second: f64,
    pub latency: MethodSummary,
    pub server_cpu_us_per_rpc: Option<f64>,
}

/// min / mean / max of a few measurements.
#[derive(Debug, Serialize, Clone, Copy)]
pub struct Summary {
    pub min: f64,
    pub mean: f64,
    pub max: f64,
}

impl Summary {
    pub fn of(v: &[f64]) -> Self {
        let round = |x: f64| (x * 100.0).round() / 100.0;
        if v.is_empty() {
            return Self {
                min: 0.0,
                mean: 0.0,
                max: 0.0,
            };
        }
        Self {
            min: round(v.iter().copied().fold(f64::INFINITY, f64::min)),
            mean: round(v.iter().sum::<f64>() / v.len() as f64),
            max: round(v.iter().copied().fold(f64::NEG_INFINITY, f64::max)),
        }
    }
}

/// Waits until `f` holds, polling every 20 ms; an error naming `what` after `limit`.
async fn until(what: &str, limit: Duration, mut f: impl FnMut() -> bool) -> anyhow::Result<()> {
    let end = Instant::now() + limit;
    while !f() {
        anyhow::ensure!(Instant::now() < end, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// The server child process, killed when dropped.
struct ServerChild {
    child: Child,
    addr: SocketAddr,
    metrics: SocketAddr,
}

impl Drop for ServerChild {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> anyhow::Result<SocketAddr> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?)
}

fn start_server(args: &LoadgenArgs) -> anyhow::Result<ServerChild> {
    let addr = free_port()?;
    let metrics = free_port()?;
    let exe = std::env::current_exe().context("finding this program to start the server")?;
    let child = Command::new(exe)
        .args([
            "serve",
            "--memory-cloud",
            &format!("{}:{}", args.groups, args.nodes),
            "--listen",
            &addr.to_string(),
            "--metrics-listen",
            &metrics.to_string(),
            "--log-level",
            "warn",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .context("starting the server")?;
    Ok(ServerChild {
        child,
        addr,
        metrics,
    })
}

async fn connect(addr: SocketAddr) -> anyhow::Result<Channel> {
    Ok(Endpoint::from_shared(format!("http://{addr}"))?
        .tcp_nodelay(true)
        .timeout(Duration::from_secs(5))
        .connect()
        .await?)
}

/// Waits until the server answers Refresh (its first state is loaded).
async fn wait_ready(addr: SocketAddr) -> anyhow::Result<Channel> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(ch) = connect(addr).await {
            let mut ca = Client::new(ch.clone());
            if ca.refresh(crate::proto::RefreshRequest {}).await.is_ok() {
                return Ok(ch);
            }
        }
        if Instant::now() > deadline {
            anyhow::bail!("the server at {addr} did not become ready within 60 s");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The server's AWS call counter, summed over operations and outcomes.
async fn aws_calls(metrics: SocketAddr) -> Option<u64> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(metrics).await.ok()?;
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: loadgen\r\n\r\n")
        .await
        .ok()?;
    let mut body = String::new();
    s.read_to_string(&mut body).await.ok()?;
    Some(sum_counter(&body, "ca_asg_provider_aws_calls_total"))
}

/// Sums every sample of one counter in a Prometheus text exposition.
pub fn sum_counter(text: &str, name: &str) -> u64 {
    text.lines()
        .filter(|l| {
            l.starts_with(name) && matches!(l.as_bytes().get(name.len()), Some(b'{' | b' '))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

fn mib(b: u64) -> f64 {
    (b as f64 / (1024.0 * 1024.0) * 10.0).round() / 10.0
}

pub async fn run(args: LoadgenArgs) -> anyhow::Result<()> {
    if let Some(nodes) = args.drain_storm {
        anyhow::ensure!(nodes >= 1, "--drain-storm must be at least 1");
        let mut o = drain_storm::StormOptions::new(nodes);
        o.api_qps = args.storm_api_qps;
        o.api_burst = (args.storm_api_qps * 2.0) as u32;
        let report = drain_storm::run(&o).await?;
        println!("{}", serde_json::to_string_pretty(&report)?);
        if let Some(path) = &args.json {
            std::fs::write(path, serde_json::to_vec_pretty(&report)?)
                .with_context(|| format!("writing {}", path.display()))?;
        }
        return Ok(());
    }
    let report = measure(&args).await?;
    print(&report);
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_vec_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
        println!("\nreport written to {}", path.display());
    }
    Ok(())
}

pub async fn measure(args: &LoadgenArgs) -> anyhow::Result<Report> {
    anyhow::ensure!(args.connections >= 1, "--connections must be at least 1");
    let child = match args.server {
        Some(_) => None,
        None => Some(start_server(args)?),
    };
    let addr = args
        .server
        .or(child.as_ref().map(|c| c.addr))
        .expect("an address");
    let pid = args.server_pid.or(child.as_ref().map(|c| c.child.id()));
    let watch = pid.map(ProcWatch::new);
    let sample = || watch.as_ref().and_then(|w| w.sample().ok());
    let metrics = child.as_ref().map(|c| c.metrics);

    eprintln!("loadgen: waiting for the server at {addr}");
    let ch = wait_ready(addr).await?;
    let mut ca = Client::new(ch.clone());
    let fleet = ca_loop::discover(&mut ca).await?;
    eprintln!(
        "loadgen: {} groups, {} nodes; 1 warm-up loop, then {} measured",
        fleet.groups.len(),
        fleet.nodes.len(),
        args.loops
    );
    ca_loop::run_loop(&mut ca, &fleet, &mut Samples::default()).await?;

    let aws_before = match metrics {
        Some(m) => aws_calls(m).await,
        None => None,
    };
    let mut samples = Samples::default();
    let (mut walls, mut cpus) = (Vec::new(), Vec::new());
    let mut kernel_ms = 0.0;
    for _ in 0..args.loops {
        let before: Option<ProcSample> = sample();
        let t = Instant::now();
        ca_loop::run_loop(&mut ca, &fleet, &mut samples).await?;
        walls.push(t.elapsed().as_secs_f64() * 1000.0);
        if let (Some(b), Some(a)) = (before, sample()) {
            cpus.push((a.cpu_seconds - b.cpu_seconds) * 1000.0);
            kernel_ms += (a.system_seconds - b.system_seconds) * 1000.0;
        }
    }
    let after_loops = sample();
    let aws_after = match metrics {
        Some(m) => aws_calls(m).await,
        None => None,
    };

    let mut channels = Vec::new();
    for _ in 0..args.connections {
        channels.push(connect(addr).await?);
    }
    let before = sample();
    let (csamples, cwall) =
        ca_loop::run_concurrent(&channels, &fleet, args.concurrent_passes).await?;
    let after = sample();
    let calls = csamples.count();
    let concurrent = Concurrent {
        connections: args.connections,
        calls,
        rpc_per_second: (calls as f64 / cwall.as_secs_f64()).round(),
        latency: csamples
            .summary()
            .into_iter()
            .next()
            .unwrap_or_else(|| MethodSummary::of("NodeGroupForNode", &[])),
        server_cpu_us_per_rpc: match (before, after) {
            (Some(b), Some(a)) if calls > 0 => {
                Some(((a.cpu_seconds - b.cpu_seconds) * 1e6 / calls as f64 * 10.0).round() / 10.0)
            }
            _ => None,
        },
    };
    let peak = sample();
    drop(child);

    let drain_overhead = if args.drain_nodes > 0 {
        eprintln!(
            "loadgen: drain overhead over {} nodes on the in-memory API server",
            args.drain_nodes
        );
        Some(drain_overhead::measure(args.drain_nodes).await?)
    } else {
        None
    };

    Ok(Report {
        nodes: fleet.nodes.len(),
        groups: fleet.groups.len(),
        loops: args.loops,
        rpcs_per_loop: 2 * fleet.nodes.len() + 5 * fleet.groups.len() + 2,
        sequential: samples.summary(),
        loop_wall_ms: Summary::of(&walls),
        server_cpu_ms_per_loop: (!cpus.is_empty()).then(|| Summary::of(&cpus)),
        server_cpu_kernel_share: {
            let total: f64 = cpus.iter().sum();
            (total > 0.0).then(|| (kernel_ms / total * 100.0).round() / 100.0)
        },
        concurrent: Some(concurrent),
        server_rss_mib_after_loops: after_loops.map(|s| mib(s.rss_bytes)),
        server_peak_rss_mib: peak.map(|s| mib(s.peak_rss_bytes)),
        aws_calls_in_steady_loops: match (aws_before, aws_after) {
            (Some(b), Some(a)) => Some(a.saturating_sub(b)),
            _ => None,
        },
        drain_overhead,
    })
}

fn print(r: &Report) {
    println!(
        "\nCA loop at N = {} nodes, G = {} groups ({} RPCs per loop, {} loops)\n",
        r.nodes, r.groups, r.rpcs_per_loop, r.loops
    );
    println!(
        "{:<28} {:>8} {:>9} {:>9} {:>9} {:>9}",
        "sequential RPC", "calls", "p50 us", "p99 us", "max us", "mean us"
    );
    for m in &r.sequential {
        println!(
            "{:<28} {:>8} {:>9} {:>9} {:>9} {:>9.1}",
            m.method, m.calls, m.p50_us, m.p99_us, m.max_us, m.mean_us
        );
    }
    let w = r.loop_wall_ms;
    println!(
        "\nloop wall time        {:.0} ms mean (min {:.0}, max {:.0})",
        w.mean, w.min, w.max
    );
    if let Some(c) = r.server_cpu_ms_per_loop {
        let kernel = r
            .server_cpu_kernel_share
            .map(|k| format!(", {:.0} % in the kernel", k * 100.0))
            .unwrap_or_default();
        println!(
            "server CPU per loop   {:.0} ms mean (min {:.0}, max {:.0}{kernel})",
            c.mean, c.min, c.max
        );
    }
    if let Some(c) = &r.concurrent {
        println!(
            "\nNodeGroupForNode over {} connections: {} calls, {:.0} RPC/s, p50 {} us, p99 {} us, max {} us",
            c.connections, c.calls, c.rpc_per_second, c.latency.p50_us, c.latency.p99_us, c.latency.max_us
        );
        if let Some(cpu) = c.server_cpu_us_per_rpc {
            println!("server CPU per RPC    {cpu:.1} us");
        }
    }
    if let (Some(rss), Some(peak)) = (r.server_rss_mib_after_loops, r.server_peak_rss_mib) {
        println!("\nserver RSS            {rss:.1} MiB after the loops, peak {peak:.1} MiB");
    }
    if let Some(n) = r.aws_calls_in_steady_loops {
        println!(
            "AWS calls             {n} during the {} measured loops",
            r.loops
        );
    }
    if let Some(d) = &r.drain_overhead {
        println!(
            "\ndrain overhead        last pod gone -> instance ended: p50 {} ms, max {} ms over {} nodes ({} API requests)",
            d.p50_ms, d.max_ms, d.nodes, d.api_requests
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_one_counter_only() {
        let text = "# TYPE ca_asg_provider_aws_calls counter\n\
            ca_asg_provider_aws_calls_total{operation=\"DescribeAutoScalingGroups\",outcome=\"ok\"} 3\n\
            ca_asg_provider_aws_calls_total{operation=\"DescribeInstanceTypes\",outcome=\"ok\"} 1\n\
            ca_asg_provider_aws_calls_totalx 100\n\
            ca_asg_provider_refreshes_total{outcome=\"ok\"} 9\n";
        assert_eq!(sum_counter(text, "ca_asg_provider_aws_calls_total"), 4);
        assert_eq!(sum_counter("", "x"), 0);
    }

    #[test]
    fn summaries_round_and_handle_empty() {
        let s = Summary::of(&[1.0, 2.0, 4.0]);
        assert_eq!((s.min, s.mean, s.max), (1.0, 2.33, 4.0));
        assert_eq!(Summary::of(&[]).max, 0.0);
    }
}

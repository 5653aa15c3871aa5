//! `loadgen`: acts like cluster-autoscaler against a server on the memory cloud
//! seeded with N nodes in G groups, and reports per-RPC latency, RPC/s, loop time, and
//! the server's CPU and memory read from /proc. With `--floor`, also the same loops
//! against a server that only replays recorded answers (`floor`), so the report can
//! tell this code's CPU from the gRPC transport's. The test rig, out of the shipped
//! binary: it uses the `ca_asg_provider` library's public API only.

mod ca_loop;
pub mod delete_storm;
pub mod drain_floor;
pub mod drain_overhead;
pub mod drain_storm;
mod floor;
pub mod stats;

use std::ffi::OsStr;
use std::net::SocketAddr;

use ca_asg_provider::config::ListenAddr;
/// Waits until a condition holds (the drain benchmarks' setup and measures).
use ca_asg_provider::sim::world::until;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use ca_asg_provider::clock::Instant;

use anyhow::Context;
use serde::Serialize;
use tonic::transport::{Channel, Endpoint};

use ca_asg_provider::telemetry::process::{ProcSample, ProcWatch};
use ca_asg_provider::telemetry::LogFormat;
use ca_loop::Client;
pub use ca_loop::{node_for, Fleet};
use stats::{MethodSummary, Samples};

/// The `loadgen` command line.
#[derive(Debug, clap::Parser)]
#[command(
    name = "loadgen",
    version,
    about = "Act like cluster-autoscaler against a ca-asg-provider server on a seeded memory \
             cloud and report latency, RPC/s, CPU and memory"
)]
pub struct Cli {
    /// Log format: human (default) or json.
    #[arg(long, value_enum, default_value = "human")]
    pub log_format: LogFormat,
    /// Log level or filter (RUST_LOG wins when set). Warnings only by default: the
    /// report is printed on stdout.
    #[arg(long, default_value = "warn")]
    pub log_level: String,
    #[command(flatten)]
    pub args: LoadgenArgs,
}

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
    /// Use a server that is already running at this address (`host:port` or
    /// `unix:///path`) instead of starting one (its CPU and memory are read only with
    /// --server-pid).
    #[arg(long, value_parser = parse_listen)]
    pub server: Option<ListenAddr>,
    /// The server (and the floor) started by loadgen listen on a Unix socket in a
    /// temporary directory instead of a TCP port on 127.0.0.1: the transport of the
    /// sidecar and bundled modes.
    #[arg(long, conflicts_with = "server")]
    pub socket: bool,
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
    /// Terminating:Wait at once, on the in-memory API server (docs/performance.md).
    #[arg(long, value_name = "NODES")]
    pub drain_storm: Option<usize>,
    /// Instead of the CA loop: one node's drain against its pods' own floor, each way
    /// of finding the held instance, this many runs each (docs/performance.md).
    #[arg(long, value_name = "RUNS", conflicts_with = "drain_storm")]
    pub drain_floor: Option<usize>,
    /// Instead of the CA loop: this many one-node NodeGroupDeleteNodes as CA sends
    /// them (`--delete-parallelism` at once, each under a 5 s deadline), on a hooked
    /// group and on one in direct mode, with every AWS request taking
    /// `--aws-latency-ms` (docs/performance.md).
    #[arg(
        long,
        value_name = "NODES",
        conflicts_with_all = ["drain_storm", "drain_floor", "floor"]
    )]
    pub delete_storm: Option<usize>,
    /// The delete storm's AWS latency: how long every request takes.
    #[arg(long, default_value_t = 100, requires = "delete_storm")]
    pub aws_latency_ms: u64,
    /// The delete storm's calls in flight at once (CA's --max-scale-down-parallelism).
    #[arg(long, default_value_t = 10, requires = "delete_storm")]
    pub delete_parallelism: usize,
    /// The delete storm's group also has this many slots whose launches failed
    /// (placeholders), each given up by a call of its own among the nodes' calls; the
    /// run counts size changes that landed after an answer that said nothing changed.
    #[arg(long, default_value_t = 0, requires = "delete_storm")]
    pub delete_placeholders: usize,
    /// The deadline each delete storm call carries (CA's grpc_timeout).
    #[arg(long, default_value_t = 5000, requires = "delete_storm")]
    pub delete_deadline_ms: u64,
    /// The storm's Kubernetes API rate limit (scaleIn.apiQps; also the delete
    /// storm's, burst twice it).
    #[arg(long, default_value_t = 50.0)]
    pub storm_api_qps: f64,
    /// The storm's scaleIn.maxConcurrentDrains (the shipped default is 50).
    #[arg(long, default_value_t = 50)]
    pub storm_concurrency: usize,
    /// The storm's nodes also run kube-proxy, the EBS CSI node plugin and a log
    /// shipper that tolerate the drain taint: the DaemonSet controller puts them
    /// straight back on the draining nodes.
    #[arg(long, requires = "drain_storm")]
    pub storm_daemonsets_that_come_back: bool,
    /// A disruption budget over the storm's group (`scaleIn.budgets[].nodes`: a count
    /// or a percent, `10%`), beside `--storm-concurrency`.
    #[arg(long, requires = "drain_storm", value_parser = parse_budget)]
    pub storm_budget: Option<ca_asg_provider::scalein::decide::budget::Nodes>,
    /// Also run each measured loop against the transport floor: a server on the same
    /// gRPC stack that replays the real server's recorded answers and runs no provider
    /// code. Loops alternate between the two (ABBA); the report gives both CPUs and
    /// their ratio (docs/performance.md).
    #[arg(long, conflicts_with = "drain_storm")]
    pub floor: bool,
    /// Internal: serve as the floor, with the answers in this file (`--floor` starts
    /// this program so). (The real server is this program started as `loadgen serve
    /// ...`: see `start_server`.)
    #[arg(long, hide = true, requires = "floor_listen")]
    pub serve_floor: Option<PathBuf>,
    /// Internal: the floor's listen address.
    #[arg(long, hide = true, requires = "serve_floor", value_parser = parse_listen)]
    pub floor_listen: Option<ListenAddr>,
}

fn parse_listen(s: &str) -> Result<ListenAddr, String> {
    ListenAddr::parse(s)
}

#[derive(Debug, Serialize)]
pub struct Report {
    /// "tcp" (127.0.0.1) or "unix" (a socket file).
    pub transport: &'static str,
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
    /// The real server against the transport floor (`--floor`).
    pub floor: Option<FloorComparison>,
}

/// The same loops against the real server and the floor, alternating.
#[derive(Debug, Serialize)]
pub struct FloorComparison {
    /// Rounds of one loop against each server.
    pub rounds: usize,
    pub real_cpu_ms_per_loop: Summary,
    pub floor_cpu_ms_per_loop: Summary,
    /// Mean real CPU / mean floor CPU per loop: how many times its bare transport the
    /// real server costs (None if the floor's CPU read 0).
    pub ratio: Option<f64>,
    /// The same ratio within each round.
    pub ratio_per_round: Summary,
    pub real_loop_wall_ms: Summary,
    pub floor_loop_wall_ms: Summary,
    /// Latency per RPC against the floor, client included: the transport's share of
    /// `sequential`.
    pub floor_sequential: Vec<MethodSummary>,
    pub floor_rss_mib: Option<f64>,
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

/// A server child process (the real server or the floor), killed when dropped.
struct ServerChild {
    child: Child,
    addr: ListenAddr,
    /// The real server's /metrics (the floor has none).
    metrics: Option<SocketAddr>,
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

/// Where a child server listens: a free TCP port, or with `socket` a socket file
/// named `name` in this process's temporary directory (made here).
fn free_listen(socket: bool, name: &str) -> anyhow::Result<ListenAddr> {
    if !socket {
        return Ok(ListenAddr::Tcp(free_port()?));
    }
    let dir = std::env::temp_dir().join(format!("ca-asg-provider-loadgen-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("making {}", dir.display()))?;
    Ok(ListenAddr::Unix(dir.join(format!("{name}.sock"))))
}

/// Starts this program with `args` as `what` (stdout dropped, stderr shared).
fn spawn_self<S: AsRef<OsStr>>(args: &[S], what: &str) -> anyhow::Result<Child> {
    let exe =
        std::env::current_exe().with_context(|| format!("finding this program to start {what}"))?;
    Command::new(exe)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .with_context(|| format!("starting {what}"))
}

/// The first argument that makes this program the server it measures (main.rs).
pub const SERVE: &str = "serve";

/// The server under measure: this program started as `loadgen serve ...`, which runs
/// the library's own command line (`ca_asg_provider::commands`), the code
/// `ca-asg-provider serve` runs (main.rs).
fn start_server(args: &LoadgenArgs) -> anyhow::Result<ServerChild> {
    let addr = free_listen(args.socket, "server")?;
    let metrics = free_port()?;
    let child = spawn_self(
        &[
            SERVE,
            "--memory-cloud",
            &format!("{}:{}", args.groups, args.nodes),
            "--listen",
            &addr.to_string(),
            "--metrics-listen",
            &metrics.to_string(),
            "--log-level",
            "warn",
        ],
        "the server",
    )?;
    Ok(ServerChild {
        child,
        addr,
        metrics: Some(metrics),
    })
}

/// A file removed when dropped.
struct TempFile(PathBuf);

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The floor child and what measuring it needs.
struct FloorChild {
    /// Held to end the floor when dropped.
    _server: ServerChild,
    ca: Client,
    watch: ProcWatch,
}

/// Records one loop's answers from the real server, writes them to a temporary file
/// and starts the floor on them; returns once the floor answers.
async fn start_floor(real: &mut Client, fleet: &Fleet, socket: bool) -> anyhow::Result<FloorChild> {
    let answers = ca_loop::record(real, fleet).await?;
    let file = TempFile(
        std::env::temp_dir().join(format!("ca-asg-provider-floor-{}.json", std::process::id())),
    );
    floor::write(&file.0, &answers)?;
    let addr = free_listen(socket, "floor")?;
    let listen = addr.to_string();
    let child = spawn_self(
        &[
            OsStr::new("--serve-floor"),
            file.0.as_os_str(),
            OsStr::new("--floor-listen"),
            OsStr::new(&listen),
            OsStr::new("--log-level"),
            OsStr::new("warn"),
        ],
        "the floor server",
    )?;
    let server = ServerChild {
        child,
        addr,
        metrics: None,
    };
    let watch = ProcWatch::new(server.child.id());
    let ch = wait_ready(&server.addr).await?;
    // The floor has read its answers once it answers.
    drop(file);
    Ok(FloorChild {
        _server: server,
        ca: Client::new(ch),
        watch,
    })
}

/// One measured loop: its wall time and the server's readings around it.
#[derive(Debug, Clone, Copy)]
struct LoopCost {
    wall_ms: f64,
    /// Before and after (None without the server's pid).
    readings: Option<(ProcSample, ProcSample)>,
}

impl LoopCost {
    fn cpu_ms(&self) -> Option<f64> {
        self.readings.map(|(b, a)| a.cpu_ms_since(&b))
    }
}

async fn measured_loop(
    ca: &mut Client,
    fleet: &Fleet,
    samples: &mut Samples,
    watch: Option<&ProcWatch>,
) -> anyhow::Result<LoopCost> {
    let sample = || watch.and_then(|w| w.sample().ok());
    let before = sample();
    let t = Instant::now();
    ca_loop::run_loop(ca, fleet, samples).await?;
    let wall_ms = t.elapsed().as_secs_f64() * 1000.0;
    Ok(LoopCost {
        wall_ms,
        readings: before.zip(sample()),
    })
}

/// The real server's loops against the floor's, round by round (`real[i]` and
/// `floor[i]` ran in the same round).
fn compare(
    real: &[LoopCost],
    floor: &[LoopCost],
    floor_sequential: Vec<MethodSummary>,
    floor_rss_mib: Option<f64>,
) -> FloorComparison {
    let real_cpu: Vec<f64> = real.iter().filter_map(LoopCost::cpu_ms).collect();
    let floor_cpu: Vec<f64> = floor.iter().filter_map(LoopCost::cpu_ms).collect();
    let per_round: Vec<f64> = real
        .iter()
        .zip(floor)
        .filter_map(|(r, f)| Some((r.cpu_ms()?, f.cpu_ms()?)))
        .filter(|&(_, f)| f > 0.0)
        .map(|(r, f)| r / f)
        .collect();
    let (real_cpu, floor_cpu) = (Summary::of(&real_cpu), Summary::of(&floor_cpu));
    let walls = |v: &[LoopCost]| Summary::of(&v.iter().map(|c| c.wall_ms).collect::<Vec<_>>());
    FloorComparison {
        rounds: floor.len(),
        ratio: (floor_cpu.mean > 0.0)
            .then(|| (real_cpu.mean / floor_cpu.mean * 100.0).round() / 100.0),
        real_cpu_ms_per_loop: real_cpu,
        floor_cpu_ms_per_loop: floor_cpu,
        ratio_per_round: Summary::of(&per_round),
        real_loop_wall_ms: walls(real),
        floor_loop_wall_ms: walls(floor),
        floor_sequential,
        floor_rss_mib,
    }
}

async fn connect(addr: &ListenAddr) -> anyhow::Result<Channel> {
    match addr {
        ListenAddr::Tcp(a) => Ok(Endpoint::from_shared(format!("http://{a}"))?
            .tcp_nodelay(true)
            .timeout(Duration::from_secs(5))
            .connect()
            .await?),
        ListenAddr::Unix(path) => ca_asg_provider::grpc::connect_unix(path).await,
    }
}

/// Waits until the server answers Refresh (its first state is loaded).
async fn wait_ready(addr: &ListenAddr) -> anyhow::Result<Channel> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(ch) = connect(addr).await {
            let mut ca = Client::new(ch.clone());
            if ca
                .refresh(ca_asg_provider::proto::RefreshRequest {})
                .await
                .is_ok()
            {
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
    if let (Some(file), Some(listen)) = (&args.serve_floor, &args.floor_listen) {
        return floor::serve_file(file, listen).await;
    }
    if let Some(runs) = args.drain_floor {
        anyhow::ensure!(
            (1..=20).contains(&runs),
            "--drain-floor must be between 1 and 20 runs, not {runs}"
        );
        let report = drain_floor::run(runs).await?;
        println!("{}", serde_json::to_string_pretty(&report)?);
        return write_json(args.json.as_deref(), &report);
    }
    if let Some(nodes) = args.delete_storm {
        let mut o = delete_storm::DeleteStormOptions::new(nodes);
        o.aws_latency = Duration::from_millis(args.aws_latency_ms);
        o.parallelism = args.delete_parallelism;
        o.placeholders = args.delete_placeholders;
        o.deadline = Duration::from_millis(args.delete_deadline_ms);
        o.api_qps = args.storm_api_qps;
        o.api_burst = (args.storm_api_qps * 2.0) as u32;
        let report = delete_storm::run(&o).await?;
        delete_storm::print(&report);
        write_json(args.json.as_deref(), &report)?;
        let failures = report.failures();
        anyhow::ensure!(failures == 0, "the delete storm had {failures} failure(s)");
        return Ok(());
    }
    if let Some(nodes) = args.drain_storm {
        anyhow::ensure!(nodes >= 1, "--drain-storm must be at least 1");
        let mut o = drain_storm::StormOptions::new(nodes);
        o.api_qps = args.storm_api_qps;
        o.api_burst = (args.storm_api_qps * 2.0) as u32;
        o.max_concurrent_drains = args.storm_concurrency;
        o.daemonsets_that_come_back = args.storm_daemonsets_that_come_back;
        o.budget = args.storm_budget;
        let report = drain_storm::run(&o).await?;
        println!("{}", serde_json::to_string_pretty(&report)?);
        return write_json(args.json.as_deref(), &report);
    }
    let report = measure(&args).await?;
    print(&report);
    write_json(args.json.as_deref(), &report)?;
    if let Some(path) = &args.json {
        println!("\nreport written to {}", path.display());
    }
    Ok(())
}

/// `--json FILE`: the report, pretty-printed.
fn write_json(path: Option<&std::path::Path>, report: &impl Serialize) -> anyhow::Result<()> {
    if let Some(path) = path {
        std::fs::write(path, serde_json::to_vec_pretty(report)?)
            .with_context(|| format!("writing {}", path.display()))?;
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
        .clone()
        .or(child.as_ref().map(|c| c.addr.clone()))
        .expect("an address");
    let transport = match addr {
        ListenAddr::Tcp(_) => "tcp",
        ListenAddr::Unix(_) => "unix",
    };
    let pid = args.server_pid.or(child.as_ref().map(|c| c.child.id()));
    anyhow::ensure!(
        !args.floor || pid.is_some(),
        "--floor compares the servers' CPU: with --server, give --server-pid too"
    );
    let watch = pid.map(ProcWatch::new);
    let sample = || watch.as_ref().and_then(|w| w.sample().ok());
    let metrics = child.as_ref().and_then(|c| c.metrics);

    eprintln!("loadgen: waiting for the server at {addr}");
    let ch = wait_ready(&addr).await?;
    let mut ca = Client::new(ch.clone());
    let fleet = ca_loop::discover(&mut ca).await?;
    eprintln!(
        "loadgen: {} groups, {} nodes; 1 warm-up loop, then {} measured",
        fleet.groups.len(),
        fleet.nodes.len(),
        args.loops
    );
    ca_loop::run_loop(&mut ca, &fleet, &mut Samples::default()).await?;
    let mut floor = if args.floor {
        eprintln!("loadgen: recording one loop's answers; the floor replays them");
        let mut f = start_floor(&mut ca, &fleet, args.socket).await?;
        // The floor gets its warm-up loop too.
        ca_loop::run_loop(&mut f.ca, &fleet, &mut Samples::default())
            .await
            .context("the warm-up loop against the floor")?;
        Some(f)
    } else {
        None
    };

    let aws_before = match metrics {
        Some(m) => aws_calls(m).await,
        None => None,
    };
    let mut samples = Samples::default();
    let mut floor_samples = Samples::default();
    let (mut real_loops, mut floor_loops) = (Vec::new(), Vec::new());
    for round in 0..args.loops {
        // ABBA: the floor goes first in every other round, so a drift (the VM's noise,
        // caches warming up) weighs on both servers alike.
        let floor_first = round % 2 == 1;
        for on_floor in [floor_first, !floor_first] {
            match (on_floor, floor.as_mut()) {
                (false, _) => real_loops
                    .push(measured_loop(&mut ca, &fleet, &mut samples, watch.as_ref()).await?),
                (true, Some(f)) => floor_loops.push(
                    measured_loop(&mut f.ca, &fleet, &mut floor_samples, Some(&f.watch))
                        .await
                        .context("a loop against the floor")?,
                ),
                (true, None) => {}
            }
        }
    }
    let after_loops = sample();
    let aws_after = match metrics {
        Some(m) => aws_calls(m).await,
        None => None,
    };
    let walls: Vec<f64> = real_loops.iter().map(|c| c.wall_ms).collect();
    let cpus: Vec<f64> = real_loops.iter().filter_map(LoopCost::cpu_ms).collect();
    // The kernel's share in ticks over ticks: both from /proc/PID/stat.
    let (mut kernel_ms, mut tick_ms) = (0.0, 0.0);
    for (b, a) in real_loops.iter().filter_map(|c| c.readings) {
        kernel_ms += (a.system_seconds - b.system_seconds) * 1000.0;
        tick_ms += (a.cpu_seconds - b.cpu_seconds) * 1000.0;
    }
    let floor_report = floor.as_ref().map(|f| {
        let rss = f.watch.sample().ok().map(|s| mib(s.rss_bytes));
        compare(&real_loops, &floor_loops, floor_samples.summary(), rss)
    });
    // The concurrent phase runs against the real server only.
    drop(floor);

    let mut channels = Vec::new();
    for _ in 0..args.connections {
        channels.push(connect(&addr).await?);
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

    if let ListenAddr::Unix(path) = &addr {
        if let Some(dir) = path.parent().filter(|_| args.socket) {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
    Ok(Report {
        transport,
        nodes: fleet.nodes.len(),
        groups: fleet.groups.len(),
        loops: args.loops,
        rpcs_per_loop: 2 * fleet.nodes.len() + 5 * fleet.groups.len() + 2,
        sequential: samples.summary(),
        loop_wall_ms: Summary::of(&walls),
        server_cpu_ms_per_loop: (!cpus.is_empty()).then(|| Summary::of(&cpus)),
        server_cpu_kernel_share: (tick_ms > 0.0)
            .then(|| (kernel_ms / tick_ms * 100.0).round() / 100.0),
        concurrent: Some(concurrent),
        server_rss_mib_after_loops: after_loops.map(|s| mib(s.rss_bytes)),
        server_peak_rss_mib: peak.map(|s| mib(s.peak_rss_bytes)),
        aws_calls_in_steady_loops: match (aws_before, aws_after) {
            (Some(b), Some(a)) => Some(a.saturating_sub(b)),
            _ => None,
        },
        drain_overhead,
        floor: floor_report,
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
    if let Some(f) = &r.floor {
        let ratio = f
            .ratio
            .map(|x| format!("{x:.2}"))
            .unwrap_or_else(|| "n/a".to_string());
        println!(
            "\nserver CPU per loop: {:.1} ms, floor {:.1} ms, ratio {ratio} (the part this code adds: {:.1} ms)",
            f.real_cpu_ms_per_loop.mean,
            f.floor_cpu_ms_per_loop.mean,
            f.real_cpu_ms_per_loop.mean - f.floor_cpu_ms_per_loop.mean
        );
        println!(
            "  ratio per round {:.2} to {:.2}; loop wall time {:.0} ms, floor {:.0} ms; {} rounds, ABBA",
            f.ratio_per_round.min,
            f.ratio_per_round.max,
            f.real_loop_wall_ms.mean,
            f.floor_loop_wall_ms.mean,
            f.rounds
        );
        if let Some(rss) = f.floor_rss_mib {
            println!("  floor RSS {rss:.1} MiB");
        }
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

/// `--storm-budget`: the budgets' own reading of `nodes`.
fn parse_budget(text: &str) -> Result<ca_asg_provider::scalein::decide::budget::Nodes, String> {
    ca_asg_provider::scalein::decide::budget::Nodes::parse(text)
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

    fn cost(wall_ms: f64, cpu_ms: f64) -> LoopCost {
        let at = |s: f64| ProcSample {
            on_cpu_seconds: Some(s),
            ..ProcSample::default()
        };
        LoopCost {
            wall_ms,
            readings: Some((at(1.0), at(1.0 + cpu_ms / 1000.0))),
        }
    }

    #[test]
    fn compares_the_real_server_with_the_floor_round_by_round() {
        let real = [cost(100.0, 30.0), cost(120.0, 50.0)];
        let floor = [cost(80.0, 20.0), cost(90.0, 20.0)];
        let c = compare(&real, &floor, Vec::new(), Some(12.5));
        assert_eq!(c.rounds, 2);
        assert_eq!(c.real_cpu_ms_per_loop.mean, 40.0);
        assert_eq!(c.floor_cpu_ms_per_loop.mean, 20.0);
        assert_eq!(c.ratio, Some(2.0));
        assert_eq!((c.ratio_per_round.min, c.ratio_per_round.max), (1.5, 2.5));
        assert_eq!(
            (c.real_loop_wall_ms.mean, c.floor_loop_wall_ms.mean),
            (110.0, 85.0)
        );
        let idle = [cost(80.0, 0.0), cost(90.0, 0.0)];
        assert_eq!(compare(&real, &idle, Vec::new(), None).ratio, None);
    }

    #[test]
    fn summaries_round_and_handle_empty() {
        let s = Summary::of(&[1.0, 2.0, 4.0]);
        assert_eq!((s.min, s.mean, s.max), (1.0, 2.33, 4.0));
        assert_eq!(Summary::of(&[]).max, 0.0);
    }
}

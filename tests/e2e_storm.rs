//! The drain storm on the real control plane (issue 44; `scripts/e2e.sh storm N`), and
//! the service's memory with thousands of Nodes watched through the real API server.
//! Not part of `.ci/run`: each asks for its size in the environment and otherwise says
//! it was skipped.
//!
//! - `E2E_STORM=100,200`: one storm per size, ended by the service, then (with
//!   `kubectl` on the PATH, or `E2E_STORM_KUBECTL=path`) the same storm ended by
//!   `kubectl drain` per node on a control plane of its own. Prints the figures side by
//!   side (Markdown) and appends them as JSON lines to `E2E_STORM_JSON` when set.
//! - `E2E_STORM_DRAINERS=service,queue,kubectl,ca`: which drainers run (default:
//!   service, kubectl, and ca when `E2E_CA_BINS` is set); `queue` is the service in
//!   queue mode, told of the ASG's half by the ASG's notification per instance on the
//!   interruption queue, its lifecycle poll slowed to the 5-minute safety net, as
//!   `serve` runs with a queue. `ca` is the newest cluster-autoscaler of `E2E_CA_BINS`
//!   deciding and draining by itself with every flag of its drain at its default
//!   (`storm::ca_flags`; `E2E_STORM_CA_FLAGS="--max-drain-parallelism=10"` adds some),
//!   handing each drained node to the service, which ends the instance.
//! - `E2E_STORM_API_QPS=Q`: the service's `apiQps` (burst 2Q) instead of the shipped
//!   50 (and the pacing floor at that rate): what the shipped limit costs.
//! - `E2E_STORM_DRAINING=K`: only K of each storm's N nodes end (half through the
//!   hook, half through CA's DeleteNodes; the others stay with their pods): the
//!   service's memory with the cluster fixed and the number of draining nodes varied.
//! - `E2E_STORM_LIMIT_S=S`: each storm cut S seconds after the decision instead of at
//!   its own bound (CA's: 600 s + 60 s per node). A storm cut, by either, still records
//!   its figures (`cut: true`, the instances ended and when) before the test fails.
//! - `E2E_STORM_WATCH=5000`: that many Nodes (each with a pod bound to it) on the real
//!   API server, the service started over them as it ships, and its heap once its
//!   caches hold them all.
//!
//! The service runs in this process on a runtime of its own (threads named
//! `storm-service`): its CPU is those threads' CPU, its memory the heap allocated on them
//! and still live (this test binary's allocator tags every block with the thread kind
//! that allocated it). The fake kubelet, the memory cloud's clock and the test run on
//! the test's own runtime and are not counted.

mod support;

#[path = "e2e/checks.rs"]
mod checks;
#[path = "e2e/control_plane.rs"]
mod control_plane;
#[path = "e2e/kubelet.rs"]
mod kubelet;
#[path = "e2e/real_ca.rs"]
mod real_ca;
#[path = "e2e/real_node.rs"]
mod real_node;
#[path = "e2e/rig.rs"]
mod rig;
#[path = "e2e/storm.rs"]
mod storm;

use std::io::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use ca_asg_provider::telemetry::process::ProcWatch;
use control_plane::{ControlPlane, Who};
use rig::{binaries, until, SERIAL};
use storm::{Drainer, Figures, Gauge, Intake, Shape};

/// Heap accounting by the kind of thread that allocated: each block carries a one-byte
/// tag in a header before it, so a block freed on another thread is still taken off
/// the right count.
mod heap {
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::cell::Cell;
    use std::sync::atomic::{AtomicI64, Ordering};

    pub struct Tagged;

    thread_local! {
        static SERVICE: Cell<bool> = const { Cell::new(false) };
    }
    static LIVE: AtomicI64 = AtomicI64::new(0);
    static PEAK: AtomicI64 = AtomicI64::new(0);
    const HEADER: usize = 16;

    /// Blocks allocated on this thread from now on count as the service's.
    pub fn mark_service_thread() {
        SERVICE.with(|c| c.set(true));
    }

    pub fn live() -> i64 {
        LIVE.load(Ordering::Relaxed)
    }

    pub fn peak() -> i64 {
        PEAK.load(Ordering::Relaxed)
    }

    pub fn reset_peak() {
        PEAK.store(LIVE.load(Ordering::Relaxed), Ordering::Relaxed);
    }

    fn outer(l: Layout) -> Option<(Layout, usize)> {
        let pre = HEADER.max(l.align());
        let size = l.size().checked_add(pre)?;
        Some((Layout::from_size_align(size, pre).ok()?, pre))
    }

    unsafe impl GlobalAlloc for Tagged {
        unsafe fn alloc(&self, l: Layout) -> *mut u8 {
            let Some((big, pre)) = outer(l) else {
                return std::ptr::null_mut();
            };
            // SAFETY: `big` has a non-zero size (it holds the header).
            let base = unsafe { System.alloc(big) };
            if base.is_null() {
                return base;
            }
            let service = SERVICE.try_with(|c| c.get()).unwrap_or(false);
            // SAFETY: the header lies inside the block just allocated.
            unsafe { *base.add(pre - 1) = service as u8 };
            if service {
                let now = LIVE.fetch_add(l.size() as i64, Ordering::Relaxed) + l.size() as i64;
                PEAK.fetch_max(now, Ordering::Relaxed);
            }
            // SAFETY: `pre` < big's size, and base + pre is aligned to `pre` >= l.align().
            unsafe { base.add(pre) }
        }

        unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
            let Some((big, pre)) = outer(l) else { return };
            // SAFETY: `p` came from `alloc` with the same layout: its header is `pre`
            // bytes before it.
            unsafe {
                let base = p.sub(pre);
                if *base.add(pre - 1) == 1 {
                    LIVE.fetch_sub(l.size() as i64, Ordering::Relaxed);
                }
                System.dealloc(base, big);
            }
        }
    }
}

#[global_allocator]
static ALLOC: heap::Tagged = heap::Tagged;

const SERVICE_THREAD: &str = "storm-service";

/// The service's runtime: its threads are counted as the service's.
fn service_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name(SERVICE_THREAD)
        .on_thread_start(heap::mark_service_thread)
        .enable_all()
        .build()
        .expect("the service's runtime")
}

/// The service's CPU (its threads', from /proc/self/task) and heap.
struct ServiceGauge;

impl Gauge for ServiceGauge {
    fn cpu_seconds(&self) -> f64 {
        let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
            return 0.0;
        };
        tasks
            .flatten()
            .filter(|t| {
                std::fs::read_to_string(t.path().join("comm"))
                    .is_ok_and(|c| c.trim() == SERVICE_THREAD)
            })
            .filter_map(|t| t.file_name().to_str()?.parse::<u32>().ok())
            .filter_map(|tid| ProcWatch::thread(tid).sample().ok())
            .map(|s| s.cpu_seconds)
            .sum()
    }
    fn peak_memory(&self) -> Option<(u64, &'static str)> {
        Some((heap::peak().max(0) as u64, "live heap, peak"))
    }
    fn reset_peak(&self) {
        heap::reset_peak();
    }
}

fn sizes(var: &str) -> Option<Vec<usize>> {
    let text = std::env::var(var).ok()?;
    let sizes: Vec<usize> = text
        .split(',')
        .map(|s| {
            s.trim()
                .parse()
                .unwrap_or_else(|_| panic!("{var}: {s:?} is not a number of nodes"))
        })
        .collect();
    Some(sizes)
}

/// The sizes `var` asks for and the control plane's binaries, or `None` (the test says
/// it was skipped) when either is not there.
fn asked_for(test: &str, var: &str) -> Option<(Vec<usize>, control_plane::Binaries)> {
    let Some(sizes) = sizes(var) else {
        eprintln!("{test}: skipped (set {var}=N[,N...]; scripts/e2e.sh storm|watch N)");
        return None;
    };
    Some((sizes, binaries(test)?))
}

fn kubectl() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("E2E_STORM_KUBECTL") {
        return Some(PathBuf::from(p));
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("kubectl"))
            .find(|p| p.is_file())
    })
}

fn record(rows: &[Figures]) {
    let Some(path) = std::env::var_os("E2E_STORM_JSON") else {
        return;
    };
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .expect("E2E_STORM_JSON");
    for r in rows {
        writeln!(f, "{}", serde_json::to_string(r).unwrap()).unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_storm_on_the_real_api_server() {
    let Some((sizes, bin)) = asked_for("drain_storm_on_the_real_api_server", "E2E_STORM") else {
        return;
    };
    let _one_at_a_time = SERIAL.lock().await;
    let rt = service_runtime();
    // E2E_STORM_DRAINERS=service,queue,kubectl: those (default: service and kubectl;
    // `queue` is the service in queue mode, the ASG's notifications on the queue).
    let only = std::env::var("E2E_STORM_DRAINERS").unwrap_or_default();
    let wanted = |d: &str| only.is_empty() || only.split(',').any(|o| o.trim() == d);
    let mut drainers = Vec::new();
    if wanted("service") {
        drainers.push(Drainer::Service(Intake::Poll));
    }
    if only.split(',').any(|o| o.trim() == "queue") {
        drainers.push(Drainer::Service(Intake::Queue));
    }
    if wanted("kubectl") {
        match kubectl() {
            Some(k) => drainers.push(Drainer::KubectlDrain(k)),
            None => eprintln!("storm: no kubectl on the PATH: the kubectl drain anchor is not run"),
        }
    }
    let ca_by_default = only.is_empty() && std::env::var_os(real_ca::ENV).is_some();
    if ca_by_default || only.split(',').any(|o| o.trim() == "ca") {
        match real_ca::binaries_from_env() {
            Ok(bins) => {
                let newest = bins
                    .last()
                    .expect("binaries_in returns at least one")
                    .clone();
                drainers.push(Drainer::RealCa(newest));
            }
            Err(why) => eprintln!("storm: real CA's own drain is not run: {why}"),
        }
    }
    let mut rows = Vec::new();
    // E2E_STORM_DRAINING=K: only K of each size's nodes end (the cluster stays N).
    let draining: Option<usize> = std::env::var("E2E_STORM_DRAINING").ok().map(|v| {
        v.trim()
            .parse()
            .expect("E2E_STORM_DRAINING: a number of nodes")
    });
    // E2E_STORM_API_QPS=Q: the service's apiQps (burst 2Q) instead of the shipped 50.
    let api_qps: Option<f64> = std::env::var("E2E_STORM_API_QPS").ok().map(|v| {
        v.trim()
            .parse()
            .expect("E2E_STORM_API_QPS: requests per second")
    });
    // E2E_STORM_LIMIT_S=S: each storm cut S seconds after the decision (its figures
    // so far recorded, then the test fails) instead of at its own bound.
    let limit_s: Option<u64> = std::env::var("E2E_STORM_LIMIT_S").ok().map(|v| {
        v.trim()
            .parse()
            .expect("E2E_STORM_LIMIT_S: a number of seconds")
    });
    for n in sizes {
        let mut shape = Shape::new(n).draining(draining.unwrap_or(n));
        if let Some(q) = api_qps {
            shape = shape.api_qps(q);
        }
        if let Some(s) = limit_s {
            shape = shape.storm_limit_s(s);
        }
        for d in &drainers {
            let name = d.name();
            let k = shape.draining;
            let step = |s: &str| {
                eprintln!(
                    "storm N={n}, {k} ending ({name}, Kubernetes {}): {s}",
                    bin.version
                )
            };
            let f = storm::run(&bin, &shape, d, rt.handle(), &ServiceGauge, &step).await;
            eprintln!(
                "storm N={n} ({name}): {}",
                serde_json::to_string(&f).unwrap()
            );
            record(std::slice::from_ref(&f));
            let cut = f.cut_why.clone();
            rows.push(f);
            if let Some(why) = cut {
                // What ran is on record (E2E_STORM_JSON) and on stdout before the failure.
                println!("\n{}", storm::table(&rows));
                panic!("storm N={n} ({name}) cut: {why}");
            }
        }
    }
    println!("\n{}", storm::table(&rows));
    rt.shutdown_background();
}

/// `E2E_STORM_WATCH` Nodes, each with one pod bound to it, created on the real API
/// server; then the service as it ships over them. Its heap (live, and peak while its
/// cache filled) once its Node cache holds them all (its pod watch starts with the first
/// drains).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_memory_with_thousands_of_nodes_watched() {
    let Some((sizes, bin)) = asked_for(
        "service_memory_with_thousands_of_nodes_watched",
        "E2E_STORM_WATCH",
    ) else {
        return;
    };
    let _one_at_a_time = SERIAL.lock().await;
    for n in sizes {
        let rt = service_runtime();
        let mut cp = ControlPlane::start_api_server(&bin)
            .await
            .unwrap_or_else(|e| panic!("{e:#}"));
        let admin = cp.client(Who::Admin).await.unwrap();
        rig::apply_shipped_rbac(&admin).await;
        let t = ca_asg_provider::clock::Instant::now();
        populate(&admin, &mut cp, n).await;
        eprintln!(
            "watch N={n}: {n} Nodes and {n} pods created in {:.0} s",
            t.elapsed().as_secs_f64()
        );
        let before = heap::live();
        heap::reset_peak();
        let cloud = ca_asg_provider::cloud::memory::MemoryCloud::new(
            vec![ca_asg_provider::cloud::memory::MemoryGroup::new(
                "web", 0, 1, 0, "m5.large",
            )],
            support::world::timing(),
        );
        let kubeconfig = cp.kubeconfig(Who::Service).unwrap();
        let svc = rt
            .spawn(async move {
                let client = control_plane::client_from(&kubeconfig)
                    .await
                    .expect("the service's client");
                let (_provider, engine, _ca, _addr, _counts) =
                    rig::serve(client, &cloud, storm::shipped_settings()).await;
                engine.elect_leader();
                engine
            })
            .await
            .unwrap();
        // The service's caches are full once it has read every Node and pod: wait for
        // the API server to have answered its lists, then for the heap to settle.
        let mut last = heap::live();
        let mut still = 0;
        until("the service's heap to settle", 300, || {
            let now = heap::live();
            still = if (now - last).abs() < 64 * 1024 {
                still + 1
            } else {
                0
            };
            last = now;
            std::future::ready(still >= 10)
        })
        .await;
        let live = heap::live() - before;
        let peak = heap::peak() - before;
        let rss = cp.peak_rss();
        println!(
            "watch N={n}: the service's heap {:.1} MB live, {:.1} MB at its peak; kube-apiserver peak RSS {:.0} MB",
            live as f64 / 1e6,
            peak as f64 / 1e6,
            rss.get("kube-apiserver").copied().unwrap_or(0) as f64 / 1e6
        );
        {
            let _g = rt.enter();
            engine_stop(&svc);
        }
        rt.shutdown_background();
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn engine_stop(e: &std::sync::Arc<ca_asg_provider::scalein::Engine>) {
    e.abort_all();
    e.shutdown();
}

/// `n` Ready Nodes and one running pod bound to each, 32 writes at a time.
async fn populate(admin: &kube::Client, cp: &mut ControlPlane, n: usize) {
    use futures::StreamExt;
    use k8s_openapi::api::core::v1::{Node, Pod};
    use kube::api::{Api, PostParams};
    rig::create(
        admin,
        None,
        serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "shop"}}),
    )
    .await;
    // No ServiceAccount controller runs beside this API server: its admission wants
    // the namespace's `default` ServiceAccount, so it is made by hand.
    rig::create(
        admin,
        Some("shop"),
        serde_json::json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}}),
    )
    .await;
    let _ = cp;
    let nodes: Api<Node> = Api::all(admin.clone());
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "shop");
    futures::stream::iter(0..n)
        .for_each_concurrent(32, |i| {
            let (nodes, pods) = (nodes.clone(), pods.clone());
            async move {
                let name = format!("ip-10-{}-{}-{}.ec2.internal", i / 65536, (i / 256) % 256, i % 256);
                let node: Node = serde_json::from_value(serde_json::json!({
                    "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
                    "spec": {"providerID": format!("aws:///us-east-1a/i-{i:017x}")},
                }))
                .unwrap();
                nodes.create(&PostParams::default(), &node).await.unwrap();
                let pod: Pod = serde_json::from_value(serde_json::json!({
                    "metadata": {"name": format!("app-{i}"), "labels": {"app": "app"}},
                    "spec": {"nodeName": name, "containers": [{"name": "main", "image": "e2e/app:1"}]},
                }))
                .unwrap();
                pods.create(&PostParams::default(), &pod).await.unwrap();
            }
        })
        .await;
}

/// The CA row's pacing figure is at the rate CA ran with: its defaults, or the last
/// `--kube-client-qps` / `--kube-client-burst` of `E2E_STORM_CA_FLAGS`.
#[test]
fn the_ca_row_is_paced_at_the_client_rate_ca_ran_with() {
    assert_eq!(storm::ca_client_rate(&storm::ca_flags(&[])), (5.0, 10.0));
    let flags = storm::ca_flags(&[
        "--kube-client-qps=20".into(),
        "--max-drain-parallelism=10".into(),
        "--kube-client-qps=50".into(),
        "--kube-client-burst=100".into(),
    ]);
    assert_eq!(storm::ca_client_rate(&flags), (50.0, 100.0));
    let bad = storm::ca_flags(&["--kube-client-qps=fast".into()]);
    assert_eq!(storm::ca_client_rate(&bad).0, 5.0);
}

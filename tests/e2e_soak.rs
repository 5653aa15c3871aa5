//! The soak (issue 75; `scripts/soak.sh [--seed S] [--minutes M]`): the real control
//! plane with its audit log, the suite's nodes (the fake kubelet), the memory cloud, the
//! interruption queue on moto's SQS (through the SDK, as shipped: 60 s visibility, 20 s
//! long poll), and
//! TWO replicas of the service with leader election over the Lease, each a process of
//! its own running `serve` from a config file (this test binary again, running
//! [`soak_replica`]) under an identity of its own, asking the driver's memory cloud over
//! loopback (`e2e/remote_cloud.rs`: moto lacks the lifecycle wait states our hook
//! needs). A seeded driver does, at random
//! and at once, CA-shaped scale-ups (NodeGroupIncreaseSize) and DeleteNodes of occupied
//! nodes (to the replica that leads, as CA's calls reach the leader's sidecar), ASG
//! scale-ins through our hook with their notifications on the interruption queue (a
//! third sent twice; each replica runs the queue's consumer loop), spot interruption
//! warnings (alone, or after a rebalance recommendation) and scheduled retirements with
//! EC2's end of the instance once drained or at two minutes, a person's `drain NODE`
//! from the command line and its `undrain`, instance refreshes (one instance replaced
//! through our hook, no decrement), a rebalance recommendation alone (its node stays
//! cordoned until something ends it), warm-pool moves in a second group (`batch`,
//! ReuseOnScaleIn: the ASG's scale-in sends an instance into the pool through our
//! hook, CA's scale-up takes it out again under the same Node name, which the service
//! hands back), forged and replayed queue messages (a
//! lifecycle notice with a wrong token or none for an instance in service, a spot
//! warning for one that is gone, an old message again), and faults: a replica killed
//! (the leader too: SIGKILL,
//! its Lease not released, a fresh process of the same identity started a few steps
//! later), a replica's link to the API server cut or paused for 1
//! to 10 s (its link, `e2e/link.rs`, falls silent; a pause delivers what it held late), kube-apiserver restarted (SIGTERM) and etcd killed and
//! restarted, AWS throttling, AWS 5xx (InternalFailure) and slow answers. Then the run
//! settles and `scripts/soak_check.py`, which shares no code with the service, judges it
//! from the audit log, the cloud's record and the objects at the end.
//!
//! `SOAK_MINUTES` (default 5, as `.ci/run` runs it: the driver's time; settling comes
//! after), `SOAK_SEED` (default: from the clock, printed), `SOAK_DIR` (where the run's files go, kept; by
//! default `target/soak/seed-S`, kept only when the run fails). Without the e2e environment it says
//! it was skipped (and fails under `E2E_REQUIRED=1`), as `e2e_real` does.

mod support;

#[path = "e2e/checks.rs"]
mod checks;
#[path = "e2e/control_plane.rs"]
mod control_plane;
#[path = "e2e/kubelet.rs"]
mod kubelet;
#[path = "e2e/link.rs"]
mod link;
#[path = "e2e/real_node.rs"]
mod real_node;
#[path = "e2e/remote_cloud.rs"]
mod remote_cloud;
#[path = "e2e/rig.rs"]
mod rig;

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use ca_asg_provider::cloud::memory::{HookEvent, MemoryCloud, MemoryGroup};
use ca_asg_provider::proto::{self, cloud_provider_client::CloudProviderClient};
use ca_asg_provider::scalein::ScaleInSettings;
use control_plane::{ControlPlane, Stop, Who};
use kubelet::FakeKubelet;
use link::Link;
use rig::{binaries, until, HOOK, SERIAL};
use serde_json::{json, Value};
use support::acting::AwsActs;
use tonic::transport::Channel;

const GROUP: &str = "web";
/// The group's size stays between these (the app's three replicas, one per node, and
/// its budget of one unavailable always have room to move).
const FLOOR: i32 = 4;
const CEILING: i32 = 7;
/// A second group, with a warm pool that takes instances back on scale-in
/// (ReuseOnScaleIn): its instances go into the pool through our hook and out again
/// under the same Node name. Only the pool's own faces (the ASG's scale-in into the
/// pool, CA's scale-up out of it) and the faults touch it; its size stays between these.
const POOLED: &str = "batch";
const POOL_FLOOR: i32 = 1;
const POOL_CEILING: i32 = 3;
/// Each group's maximum size in the ASG (and CA's, from `--nodes`); both minimums 0.
const GROUP_MAX: i32 = 8;
const POOL_MAX: i32 = 4;
/// The states an instance rests in inside a warm pool, its drain over.
const RESTING: [&str; 3] = ["Warmed:Stopped", "Warmed:Running", "Warmed:Hibernated"];

/// splitmix64: the driver's only source of chance.
struct Dice(u64);

impl Dice {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    /// One of `xs` (not empty), by one roll of [`Dice::below`].
    fn pick<'a, T>(&mut self, xs: &'a [T]) -> &'a T {
        &xs[self.below(xs.len() as u64) as usize]
    }
}

/// One replica of the service as a process of its own: this test binary again, running
/// [`soak_replica`], which is `serve` (`commands::serve::serve_with`) with its config
/// file and flags, its cloud the driver's. Killed with SIGKILL; its CA client; whether
/// it leads, as its metrics say.
struct Replica {
    who: Who,
    /// Its link to the API server (kept across its restarts: one per identity).
    link: Arc<Link>,
    process: Option<std::process::Child>,
    ca: Option<CloudProviderClient<Channel>>,
    /// The run's directory: the replica's config (`replica-ID.yaml`) and log
    /// (`replica-ID.log`, every start of it).
    dir: PathBuf,
    /// Its `ca_asg_provider_leader` gauge, read every 200 ms while it runs.
    leads: Arc<std::sync::atomic::AtomicBool>,
    reader: Option<tokio::task::JoinHandle<()>>,
}

/// What a replica process is told (`SOAK_REPLICA`, JSON): whose view of the driver's
/// cloud it asks, and `serve`'s command line.
#[derive(serde::Serialize, serde::Deserialize)]
struct ReplicaSpec {
    id: String,
    cloud: std::net::SocketAddr,
    args: Vec<String>,
}

/// `serve`'s flags, as the shipped binary parses them.
#[derive(clap::Parser)]
struct ServeCommand {
    #[command(flatten)]
    serve: ca_asg_provider::commands::serve::ServeArgs,
}

impl Replica {
    fn alive(&self) -> bool {
        self.process.is_some()
    }

    /// Whether it runs and says it leads (its own belief: its leader gauge).
    fn leads(&self) -> bool {
        self.alive() && self.leads.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// kill -9: the process ends at once, its Lease not released, nothing flushed;
    /// what it had sent the API server or the cloud is carried out or lost there.
    fn kill(&mut self) {
        if let Some(mut p) = self.process.take() {
            let _ = p.kill();
            let _ = p.wait();
        }
        if let Some(r) = self.reader.take() {
            r.abort();
        }
        self.leads.store(false, std::sync::atomic::Ordering::SeqCst);
        self.ca = None;
    }

    async fn start(
        &mut self,
        cp: &ControlPlane,
        cloud: &MemoryCloud,
        served: &remote_cloud::Server,
        aws: &AwsActs,
        queue: &SoakQueue,
    ) {
        // The replica reaches the API server through its link, which the soak can cut.
        let direct = cp.kubeconfig(self.who).unwrap();
        let kubeconfig = direct.with_extension("linked");
        let text = std::fs::read_to_string(&direct).unwrap();
        std::fs::write(&kubeconfig, link::through(&text, &cp.url, &self.link)).unwrap();
        let id = self.who.uid().to_string();
        // Its writes to the cloud are logged under its name (the checker's record).
        served.serve_as(&id, aws.cloud(&id, Arc::new(cloud.clone())));
        let socket = rig::socket_path();
        let metrics = control_plane::free_port();
        let config = self.dir.join(format!("replica-{id}.yaml"));
        std::fs::write(&config, replica_config(&queue.url)).unwrap();
        let mut args: Vec<String> = vec!["ca-asg-provider".into()];
        for (flag, value) in [
            ("--config", config.display().to_string()),
            ("--region", "us-east-1".into()),
            ("--aws-endpoint", queue.moto.clone()),
            ("--nodes", format!("0:{GROUP_MAX}:{GROUP}")),
            ("--nodes", format!("0:{POOL_MAX}:{POOLED}")),
            ("--listen", format!("unix://{}", socket.display())),
            ("--metrics-listen", format!("127.0.0.1:{metrics}")),
        ] {
            args.extend([flag.to_string(), value]);
        }
        let spec = ReplicaSpec {
            id: id.clone(),
            cloud: served.addr,
            args,
        };
        let log_path = self.dir.join(format!("replica-{id}.log"));
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .expect("the replica's log");
        let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
        cmd.args(["soak_replica", "--exact", "--ignored", "--nocapture"])
            .env("SOAK_REPLICA", serde_json::to_string(&spec).unwrap())
            // As a pod of the Deployment: its name is its identity in the election.
            .env("POD_NAME", &id)
            .env_remove("POD_NAMESPACE")
            .env_remove("CA_ASG_PROVIDER_CONFIG")
            .env("KUBECONFIG", &kubeconfig)
            .env("AWS_ACCESS_KEY_ID", "test")
            .env("AWS_SECRET_ACCESS_KEY", "test")
            .env("AWS_EC2_METADATA_DISABLED", "true")
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        let mut process = control_plane::dies_with_the_test(cmd)
            .spawn()
            .expect("the replica's process");
        let began = std::time::Instant::now();
        while http_get(metrics, "/readyz").await.map(|(status, _)| status) != Some(200) {
            if let Ok(Some(status)) = process.try_wait() {
                panic!(
                    "replica {id} ended as it started ({status}): {}",
                    log_tail(&log_path)
                );
            }
            assert!(
                began.elapsed() < Duration::from_secs(90),
                "replica {id} was not ready in 90 s: {}",
                log_tail(&log_path)
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let ca = CloudProviderClient::new(
            ca_asg_provider::grpc::connect_unix(&socket)
                .await
                .expect("connect to the replica"),
        );
        let leads = self.leads.clone();
        self.reader = Some(tokio::spawn(async move {
            loop {
                if let Some((200, body)) = http_get(metrics, "/metrics").await {
                    let now = body.lines().any(|l| l.trim() == "ca_asg_provider_leader 1");
                    leads.store(now, std::sync::atomic::Ordering::SeqCst);
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }));
        self.process = Some(process);
        self.ca = Some(ca);
    }
}

/// A replica's config file: the suite's quick timings (the soak's actions come every
/// second or two), a 3 s Lease, and queue mode on the soak's queue (the hook scan then
/// runs as its safety net, every 15 s, as shipped).
fn replica_config(queue_url: &str) -> String {
    format!(
        "refreshInterval: 1s\n\
         scaleIn:\n\
         \x20 hookName: {HOOK}\n\
         \x20 evictionRetryInterval: 500ms\n\
         \x20 volumeDetachDeadline: 2s\n\
         \x20 lifecyclePollInterval: 1s\n\
         \x20 leaseName: ca-asg-provider\n\
         \x20 leaseNamespace: kube-system\n\
         \x20 leaseDuration: 3s\n\
         interruption:\n\
         \x20 queueUrl: {queue_url}\n\
         \x20 safetyNetPollInterval: 15s\n"
    )
}

/// GET `path` on the loopback port: its status and body, `None` when nothing answers.
async fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let exchange = async {
        let mut conn = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .ok()?;
        let request =
            format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
        conn.write_all(request.as_bytes()).await.ok()?;
        let mut answer = Vec::new();
        conn.read_to_end(&mut answer).await.ok()?;
        let text = String::from_utf8_lossy(&answer).into_owned();
        let status = text.split_whitespace().nth(1)?.parse().ok()?;
        Some((status, text))
    };
    tokio::time::timeout(Duration::from_secs(2), exchange)
        .await
        .ok()
        .flatten()
}

/// The last lines of a replica's log, for a failure's message.
fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

/// One replica of the soak, as its process runs it (the soak starts this test binary
/// again with `SOAK_REPLICA`; not a test of its own): `serve` with the config file and
/// flags the soak wrote, as the shipped binary runs it (the provider, the drain with
/// its election, the interruption queue's consumer, the hook scan as its safety net,
/// the operations port, CA's gRPC), its cloud the driver's, until it is killed.
#[test]
#[ignore = "one replica of the soak as a process of its own: the soak starts it"]
fn soak_replica() {
    use clap::Parser as _;
    let spec: ReplicaSpec = serde_json::from_str(
        &std::env::var("SOAK_REPLICA").expect("SOAK_REPLICA: the soak sets it"),
    )
    .expect("SOAK_REPLICA: the soak's spec");
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_ansi(false)
        .try_init();
    let command = ServeCommand::parse_from(&spec.args);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("the replica's runtime");
    rt.block_on(async move {
        let cfg = command
            .serve
            .config
            .load_serving(&command.serve.serve)
            .expect("the replica's config");
        let cloud = Arc::new(remote_cloud::Remote::new(spec.cloud, &spec.id));
        ca_asg_provider::commands::serve::serve_with(cfg, &command.serve, cloud)
            .await
            .expect("serve");
    });
}

/// What the run recorded beside the audit log: the choices (CA's, the ASG's) and the
/// driver's schedule.
struct Record {
    dir: PathBuf,
    origin: (
        ca_asg_provider::clock::Instant,
        chrono::DateTime<chrono::Utc>,
    ),
    choices: Vec<Value>,
    schedule: std::fs::File,
    counts: BTreeMap<String, u64>,
}

impl Record {
    /// A choice (or a warm-pool move the driver saw), stamped with when it was recorded.
    fn choice(&mut self, mut v: Value) {
        v["at"] = chrono::Utc::now()
            .to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
            .into();
        self.choices.push(v);
    }
    fn step(&mut self, step: usize, seed: u64, what: &str, detail: Value) {
        *self.counts.entry(what.to_string()).or_default() += 1;
        let line = json!({"seed": seed, "step": step, "what": what, "detail": detail,
            "at": chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true)});
        writeln!(self.schedule, "{line}").unwrap();
    }
    fn wall(&self, at: ca_asg_provider::clock::Instant) -> String {
        let since = at.saturating_duration_since(self.origin.0);
        (self.origin.1 + chrono::Duration::from_std(since).unwrap())
            .to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
    }
}

fn seed() -> u64 {
    match std::env::var("SOAK_SEED") {
        Ok(s) => s.trim().parse().expect("SOAK_SEED: a number"),
        Err(_) => {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                % 1_000_000
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_two_replicas_under_faults_judged_from_outside() {
    let Some(bin) = binaries("soak_two_replicas_under_faults_judged_from_outside") else {
        return;
    };
    let _one_at_a_time = SERIAL.lock().await;
    let seed = seed();
    let minutes: f64 = std::env::var("SOAK_MINUTES")
        .ok()
        .map(|m| m.trim().parse().expect("SOAK_MINUTES: a number"))
        .unwrap_or(5.0);
    // A run's files are kept when it fails, or when SOAK_DIR names where they go.
    let asked_dir = std::env::var_os("SOAK_DIR").map(PathBuf::from);
    let dir = asked_dir.clone().unwrap_or_else(|| {
        std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/target")))
            .join("soak")
            .join(format!("seed-{seed}"))
    });
    std::fs::create_dir_all(&dir).expect("SOAK_DIR");
    eprintln!(
        "soak: seed {seed}, {minutes} min, files in {}",
        dir.display()
    );

    let mut cp = ControlPlane::start(&bin)
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
    let admin = cp.client(Who::Admin).await.unwrap();
    rig::apply_shipped_rbac(&admin).await;
    let group = MemoryGroup::new(GROUP, 0, GROUP_MAX, 5, "m5.large").terminating_hook(HOOK, 300);
    let pooled = MemoryGroup::new(POOLED, 0, POOL_MAX, 2, "m5.large")
        .terminating_hook(HOOK, 300)
        .warm_pool(ca_asg_provider::cloud::WarmPool {
            min_size: 0,
            max_prepared: None,
            pool_state: "Stopped".into(),
            reuse_on_scale_in: true,
        });
    let cloud = MemoryCloud::new(vec![group, pooled], support::world::timing());
    let kubelet = FakeKubelet::start(cp.client(Who::Kubelet).await.unwrap(), cloud.clone());
    until("a Ready Node per instance", 30, || {
        let k = kubelet.clone();
        async move { k.nodes().len() == 7 }
    })
    .await;
    rig::workloads(&admin, &mut cp).await;
    until("every app and DaemonSet pod Ready", 90, || {
        let a = admin.clone();
        async move { rig::ready_pods(&a).await.len() == rig::APP_REPLICAS + 7 }
    })
    .await;

    let aws = AwsActs::default();
    // The interruption queue: SQS on moto, through the SDK, with the shipped queue's
    // visibility timeout. On it the ASG's lifecycle messages, some sent twice, and
    // forged or stale ones.
    let moto = support::moto::MotoServer::start();
    let queue = SoakQueue::create(&moto).await;
    // The cloud, served to the replicas' processes (each its own view, logged).
    let served = remote_cloud::Server::start().await;
    let mut sent: Vec<String> = Vec::new();
    let mut rec = Record {
        dir: dir.clone(),
        origin: (ca_asg_provider::clock::Instant::now(), chrono::Utc::now()),
        choices: vec![
            json!({"who": "aws", "op": "Group", "group": GROUP, "desired": 5}),
            json!({"who": "aws", "op": "Group", "group": POOLED, "desired": 2}),
        ],
        schedule: std::fs::File::create(dir.join("schedule.jsonl")).unwrap(),
        counts: BTreeMap::new(),
    };
    let upstream: std::net::SocketAddr = cp
        .url
        .trim_start_matches("https://")
        .parse()
        .expect("the API server's address");
    let links = [
        Arc::new(Link::start(upstream).await.expect("a link")),
        Arc::new(Link::start(upstream).await.expect("a link")),
    ];
    let mut replicas = [(Who::ReplicaA, 0), (Who::ReplicaB, 1)].map(|(who, i)| Replica {
        who,
        link: links[i].clone(),
        process: None,
        ca: None,
        dir: dir.clone(),
        leads: Arc::default(),
        reader: None,
    });
    for r in &mut replicas {
        r.start(&cp, &cloud, &served, &aws, &queue).await;
    }
    until("one replica leads", 30, || {
        std::future::ready(replicas.iter().any(|r| r.leads()))
    })
    .await;

    // The driver: one step every 0.5 to 2.5 s, until the soak's time is up.
    let mut dice = Dice(seed);
    let started = ca_asg_provider::clock::Instant::now();
    let mut dead: Vec<(usize, usize)> = Vec::new(); // (replica, step to restart at)
    let mut slow_until: Option<usize> = None;
    let mut chosen: std::collections::BTreeSet<String> = Default::default();
    let mut step = 0;
    // DeleteNodes CA sent that failed: CA asks again (one a step, then while settling).
    let mut again: Vec<(String, String)> = Vec::new();
    // Spot warnings sent, each instance EC2 reclaims: once its node has no app pod
    // left (a few steps at least), or at the warning's two minutes whatever.
    let mut warned: Vec<Warned> = Vec::new();
    // A person's `drain NODE` from the command line (one at a time), until undone.
    let mut cli: Option<CliDrain> = None;
    // The instance of the last rebalance recommendation sent alone.
    let mut rebalanced: Option<String> = None;
    // The instances resting in the warm pool when the driver last looked.
    let mut resting: std::collections::BTreeSet<String> = Default::default();
    while started.elapsed() < Duration::from_secs_f64(minutes * 60.0) {
        step += 1;
        tokio::time::sleep(Duration::from_millis(500 + dice.below(2000))).await;
        for (i, _) in dead.iter().filter(|(_, at)| *at <= step) {
            replicas[*i].start(&cp, &cloud, &served, &aws, &queue).await;
            rec.step(
                step,
                seed,
                "restart",
                json!({"replica": replicas[*i].who.uid()}),
            );
        }
        dead.retain(|(_, at)| *at > step);
        if slow_until.is_some_and(|s| s <= step) {
            cloud.slow_answers(Duration::ZERO);
            slow_until = None;
            rec.step(step, seed, "slow_answers_end", json!({}));
        }
        ask_again(&replicas, &mut again, &mut rec, step, seed).await;
        reclaim_due(
            &cloud,
            &admin,
            &kubelet,
            &mut warned,
            &mut rec,
            (step, false),
            seed,
        )
        .await;
        watch_pool(&cloud, &mut resting, &mut chosen, &mut rec);
        let desired = cloud.desired(GROUP).unwrap_or(0);
        let roll = dice.below(124);
        let leader = replicas.iter().position(|r| r.leads());
        match roll {
            0..=19 => {
                if desired < CEILING {
                    if let Some(l) = leader {
                        let mut ca = replicas[l].ca.clone().unwrap();
                        let error = ca_increase(&mut ca, GROUP, &mut rec).await;
                        rec.step(
                            step,
                            seed,
                            "ca_increase_size",
                            json!({"ok": error.is_none(), "error": error}),
                        );
                        continue;
                    }
                }
                rec.step(step, seed, "skip", json!({"why": "ceiling or no leader"}));
            }
            20..=39 => {
                let web = of_group(&cloud, GROUP);
                let free: Vec<(String, String)> = rig::occupied(&admin, &kubelet)
                    .await
                    .into_iter()
                    .filter(|(_, iid)| !chosen.contains(iid) && web.contains(iid))
                    .collect();
                let room = desired - FLOOR;
                match (leader, free.is_empty() || room <= 0) {
                    (Some(l), false) => {
                        let pick = dice.pick(&free).clone();
                        let mut ca = replicas[l].ca.clone().unwrap();
                        // CA asks; the instance is CA's choice whatever the answer.
                        rec.choice(json!({"who": "ca", "op": "DeleteNodes", "group": GROUP, "instance": pick.1, "node": pick.0}));
                        chosen.insert(pick.1.clone());
                        delete_nodes(
                            &mut ca,
                            pick,
                            &mut again,
                            &mut rec,
                            step,
                            seed,
                            "ca_delete_nodes",
                        )
                        .await;
                    }
                    _ => rec.step(
                        step,
                        seed,
                        "skip",
                        json!({"why": "floor, no occupied node or no leader"}),
                    ),
                }
            }
            40..=54 => {
                if desired > FLOOR {
                    let (ended, twice) = asg_scale_in(
                        (&cloud, GROUP, support::notices::lifecycle),
                        (&queue, &mut dice, &mut sent),
                        &mut chosen,
                        &mut rec,
                    )
                    .await;
                    rec.step(
                        step,
                        seed,
                        "asg_scale_in",
                        json!({"instances": ended, "message_twice": twice}),
                    );
                } else {
                    rec.step(step, seed, "skip", json!({"why": "floor"}));
                }
            }
            55..=64 => {
                // Kill a replica: the leader half the time.
                let alive: Vec<usize> = (0..2).filter(|i| replicas[*i].alive()).collect();
                if alive.len() == 2 {
                    let i = match (dice.below(2), leader) {
                        (0, Some(l)) => l,
                        _ => alive[dice.below(2) as usize],
                    };
                    let was_leader = leader == Some(i);
                    replicas[i].kill();
                    let back = step + 2 + dice.below(6) as usize;
                    dead.push((i, back));
                    rec.step(step, seed, "kill", json!({"replica": replicas[i].who.uid(), "leader": was_leader, "restart_at_step": back}));
                } else {
                    rec.step(
                        step,
                        seed,
                        "skip",
                        json!({"why": "a replica is already down"}),
                    );
                }
            }
            75..=79 => match cli.take() {
                // The person gives the node back (`undrain`), refused while the drain
                // runs (then tried again at a later step).
                Some(mut d) => {
                    let (said, kept) = d.undo(&admin, false).await;
                    rec.step(
                        step,
                        seed,
                        "cli_undrain",
                        json!({"node": d.node, "said": said}),
                    );
                    if kept {
                        cli = Some(d);
                    }
                }
                None => {
                    let web = of_group(&cloud, GROUP);
                    let free: Vec<String> = kubelet
                        .nodes()
                        .into_iter()
                        .filter(|(_, iid)| !chosen.contains(iid) && web.contains(iid))
                        .map(|(node, _)| node)
                        .collect();
                    if free.len() as i32 > FLOOR {
                        let node = dice.pick(&free).clone();
                        rec.choice(json!({"who": "person", "op": "Drain", "node": node}));
                        rec.step(step, seed, "cli_drain", json!({"node": node}));
                        cli = Some(CliDrain::start(&cp, &cloud, &node).await);
                    } else {
                        rec.step(
                            step,
                            seed,
                            "skip",
                            json!({"why": "too few nodes to drain one"}),
                        );
                    }
                }
            },
            65..=74 => {
                let ops = [
                    "terminate_instance",
                    "lifecycle_heartbeat",
                    "complete_lifecycle_action",
                    "describe_groups",
                    "set_desired_capacity",
                ];
                let op = *dice.pick(&ops);
                let times = 1 + dice.below(3) as u32;
                cloud.throttle(op, times);
                rec.step(
                    step,
                    seed,
                    "aws_throttle",
                    json!({"op": op, "times": times}),
                );
            }
            87..=91 => {
                // EC2 will end an instance: a spot warning, a rebalance recommendation
                // just before it (the rebalance cordons, the warning joins it), or an
                // AWS Health scheduled retirement two minutes out; its message on the
                // queue (a third of the time twice), the end once drained or at its
                // deadline.
                let live = in_service_unchosen(&cloud, &kubelet, &chosen);
                if live.len() as i32 > FLOOR {
                    let (node, iid) = dice.pick(&live).clone();
                    let deadline = chrono::Utc::now() + chrono::Duration::seconds(SPOT_NOTICE_SECS);
                    chosen.insert(iid.clone());
                    rec.choice(json!({"who": "ec2", "op": "Reclaim", "group": GROUP, "instance": iid, "node": node,
                        "deadline": deadline.to_rfc3339_opts(chrono::SecondsFormat::Micros, true)}));
                    let (what, body) = match dice.below(3) {
                        0 => ("spot_warning", support::notices::spot(&iid)),
                        1 => {
                            queue.send(&support::notices::rebalance(&iid)).await;
                            ("rebalance_then_spot", support::notices::spot(&iid))
                        }
                        _ => (
                            "scheduled_retirement",
                            support::notices::retirement_at(&iid, deadline),
                        ),
                    };
                    let twice = at_least_once(&queue, &mut dice, &mut sent, body).await;
                    warned.push(Warned {
                        instance: iid.clone(),
                        not_before: step + 3,
                        deadline,
                    });
                    rec.step(
                        step,
                        seed,
                        what,
                        json!({"instance": iid, "node": node, "message_twice": twice}),
                    );
                } else {
                    rec.step(
                        step,
                        seed,
                        "skip",
                        json!({"why": "too few nodes to warn one"}),
                    );
                }
            }
            80..=86 => {
                let ops = [
                    "terminate_instance",
                    "complete_lifecycle_action",
                    "describe_groups",
                ];
                let op = *dice.pick(&ops);
                cloud.refuse(op, "InternalFailure", 1);
                rec.step(step, seed, "aws_5xx", json!({"op": op}));
            }
            95..=99 => {
                // A message nobody at AWS sent now: a lifecycle notice with a wrong
                // token or none for an instance in service (stamped ten minutes ago,
                // a replay), a spot warning for an instance that is gone, or an old
                // message again.
                let live: Vec<String> = cloud
                    .instances()
                    .into_iter()
                    .filter(|(_, i)| !i.state.is_terminating())
                    .map(|(_, i)| i.id)
                    .collect();
                let gone: Vec<String> = chosen
                    .iter()
                    .filter(|c| !live.contains(c))
                    .cloned()
                    .collect();
                let ago = chrono::Utc::now() - chrono::Duration::minutes(10);
                let (kind, body) = match dice.below(4) {
                    0 if !live.is_empty() => {
                        let iid = dice.pick(&live);
                        let token = "87654321-4321-4321-4321-210987654321";
                        (
                            "lifecycle_wrong_token",
                            support::notices::lifecycle_at(GROUP, iid, HOOK, Some(token), ago),
                        )
                    }
                    1 if !live.is_empty() => {
                        let iid = dice.pick(&live);
                        (
                            "lifecycle_no_token",
                            support::notices::lifecycle_at(GROUP, iid, HOOK, None, ago),
                        )
                    }
                    2 if !gone.is_empty() => {
                        let iid = dice.pick(&gone);
                        ("spot_for_gone", support::notices::spot(iid))
                    }
                    _ if !sent.is_empty() => ("replayed", dice.pick(&sent).clone()),
                    _ => ("none", String::new()),
                };
                if !body.is_empty() {
                    queue.send(&body).await;
                }
                rec.step(step, seed, "queue_forged", json!({"kind": kind}));
            }
            100..=104 => {
                // The network between a replica (the leader half the time) and the API
                // server breaks for 1 to 10 s, healed by the clock whatever the driver
                // waits on: a partition (its connections fall silent, and are closed
                // when it heals) or a pause (silent too, and what both sides sent is
                // delivered late when it heals).
                let broken = links.iter().any(|l| l.is_broken());
                if broken {
                    rec.step(
                        step,
                        seed,
                        "skip",
                        json!({"why": "a link is already broken"}),
                    );
                } else {
                    let i = match (dice.below(2), leader) {
                        (0, Some(l)) => l,
                        _ => dice.below(2) as usize,
                    };
                    let secs = 1 + dice.below(10);
                    let what = if dice.below(2) == 0 {
                        links[i].cut();
                        "net_cut"
                    } else {
                        links[i].pause();
                        "net_pause"
                    };
                    let l = links[i].clone();
                    tokio::spawn(async move {
                        tokio::time::sleep(Duration::from_secs(secs)).await;
                        l.heal();
                    });
                    rec.step(step, seed, what, json!({"replica": replicas[i].who.uid(), "leader": leader == Some(i), "secs": secs}));
                }
            }
            105..=109 => {
                // The control plane restarts a part: kube-apiserver as a rolling restart
                // does (SIGTERM), or etcd crashing (SIGKILL); the driver waits until the
                // API server is ready again, the replicas and the kubelet do not.
                let (what, part, how) = match roll {
                    105..=107 => ("apiserver_restart", "kube-apiserver", Stop::Term),
                    _ => ("etcd_restart", "etcd", Stop::Kill),
                };
                let took = cp.restart(part, how).await.unwrap_or_else(|e| {
                    panic!("soak: {part} did not come back (seed {seed}): {e:#}")
                });
                // The driver's own client may hold connections the restart closed:
                // its next reads (which do not try again) go on fresh ones.
                let mut refreshed = 0;
                while kube::Api::<k8s_openapi::api::core::v1::Node>::all(admin.clone())
                    .list(&Default::default())
                    .await
                    .is_err()
                    && refreshed < 25
                {
                    refreshed += 1;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                rec.step(
                    step,
                    seed,
                    what,
                    json!({"ready_after_ms": took.as_millis() as u64}),
                );
            }
            110..=114 => {
                // An instance refresh replaces one instance nobody chose (while more
                // than 4 such are left): the ASG ends it without a decrement (its
                // replacement launches), through our hook, its activity saying why, and
                // sends the hook's notification (a third of the time twice).
                let live = in_service_unchosen(&cloud, &kubelet, &chosen);
                if live.len() as i32 > FLOOR {
                    let (node, iid) = dice.pick(&live).clone();
                    let cause = format!(
                        "At {} an instance was taken out of service in response to an instance refresh.",
                        chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ")
                    );
                    if cloud.replace_instance(&iid, &cause) {
                        chosen.insert(iid.clone());
                        rec.choice(json!({"who": "asg", "op": "Refresh", "group": GROUP, "instance": iid, "node": node}));
                        let token = cloud.action_token(&iid, HOOK);
                        let body = support::notices::lifecycle(GROUP, &iid, HOOK, token.as_deref());
                        let twice = at_least_once(&queue, &mut dice, &mut sent, body).await;
                        rec.step(
                            step,
                            seed,
                            "asg_instance_refresh",
                            json!({"instance": iid, "node": node, "message_twice": twice}),
                        );
                    } else {
                        rec.step(
                            step,
                            seed,
                            "skip",
                            json!({"why": "the instance left service"}),
                        );
                    }
                } else {
                    rec.step(
                        step,
                        seed,
                        "skip",
                        json!({"why": "too few nodes to refresh one"}),
                    );
                }
            }
            115..=117 => {
                // A rebalance recommendation alone (one standing at a time), for an
                // instance in service nobody chose (while more than 4 such are left):
                // the service cordons and taints its node for good; CA, the ASG or EC2
                // may end it later (the reason joins), or nothing does.
                let standing = rebalanced.as_ref().is_some_and(|iid| {
                    cloud
                        .instances()
                        .iter()
                        .any(|(_, i)| i.id == *iid && !i.state.is_terminating())
                });
                let live = in_service_unchosen(&cloud, &kubelet, &chosen);
                if !standing && live.len() as i32 > FLOOR {
                    let (node, iid) = dice.pick(&live).clone();
                    // Chooses nothing to end: no "instance" for the checker.
                    rec.choice(json!({"who": "ec2", "op": "Rebalance", "group": GROUP, "node": node, "rebalanced": iid}));
                    let body = support::notices::rebalance(&iid);
                    let twice = at_least_once(&queue, &mut dice, &mut sent, body).await;
                    rebalanced = Some(iid.clone());
                    rec.step(
                        step,
                        seed,
                        "rebalance_alone",
                        json!({"instance": iid, "node": node, "message_twice": twice}),
                    );
                } else {
                    rec.step(
                        step,
                        seed,
                        "skip",
                        json!({"why": "a rebalanced node stands, or too few nodes"}),
                    );
                }
            }
            118..=120 => {
                // The ASG scales the pooled group in by one: under ReuseOnScaleIn the
                // instance goes back into the warm pool through our hook
                // (Warmed:Pending:Wait), its notification saying Destination WarmPool
                // (a third of the time twice), its Node kept for the next scale-up.
                let pooled_desired = cloud.desired(POOLED).unwrap_or(0);
                if pooled_desired > POOL_FLOOR {
                    let (into, twice) = asg_scale_in(
                        (&cloud, POOLED, support::notices::lifecycle_into_pool),
                        (&queue, &mut dice, &mut sent),
                        &mut chosen,
                        &mut rec,
                    )
                    .await;
                    rec.step(
                        step,
                        seed,
                        "asg_scale_in_into_pool",
                        json!({"instances": into, "message_twice": twice}),
                    );
                } else {
                    rec.step(
                        step,
                        seed,
                        "skip",
                        json!({"why": "pool group at its floor"}),
                    );
                }
            }
            121..=123 => {
                // CA scales the pooled group up by one: the ASG takes an instance
                // resting in the pool first (the same instance and Node name), and the
                // service hands its Node back once it has settled in service.
                let pooled_desired = cloud.desired(POOLED).unwrap_or(0);
                match leader {
                    Some(l) if pooled_desired < POOL_CEILING => {
                        let mut ca = replicas[l].ca.clone().unwrap();
                        let error = ca_increase(&mut ca, POOLED, &mut rec).await;
                        rec.step(step, seed, "ca_increase_size_from_pool", json!({"ok": error.is_none(), "resting": resting.len(), "error": error}));
                    }
                    _ => rec.step(
                        step,
                        seed,
                        "skip",
                        json!({"why": "pool group at its ceiling, or no leader"}),
                    ),
                }
            }
            _ => {
                if slow_until.is_none() {
                    let ms = 200 + dice.below(1300);
                    cloud.slow_answers(Duration::from_millis(ms));
                    slow_until = Some(step + 1 + dice.below(4) as usize);
                    rec.step(
                        step,
                        seed,
                        "aws_slow_answers",
                        json!({"ms": ms, "until_step": slow_until}),
                    );
                } else {
                    rec.step(step, seed, "skip", json!({"why": "already slow"}));
                }
            }
        }
    }
    let driven = started.elapsed();

    // Settle: faults off, both replicas up, every chosen instance ended, the app whole.
    cloud.slow_answers(Duration::ZERO);
    for l in &links {
        l.heal();
    }
    for (i, _) in std::mem::take(&mut dead) {
        replicas[i].start(&cp, &cloud, &served, &aws, &queue).await;
        rec.step(
            step,
            seed,
            "restart",
            json!({"replica": replicas[i].who.uid(), "settling": true}),
        );
    }
    // Settled: every chosen instance out of service (ended, or at rest in the warm
    // pool), a Node for each instance there is (the pool's keep theirs), every pod Ready.
    // What is not settled yet (empty: settled), said when the run does not settle.
    let unsettled = |cloud: MemoryCloud,
                     kubelet: FakeKubelet,
                     admin: kube::Client,
                     chosen: std::collections::BTreeSet<String>| async move {
        let live: std::collections::BTreeSet<String> =
            cloud.instances().into_iter().map(|(_, i)| i.id).collect();
        let pool = cloud.pooled();
        let nodes = kubelet.nodes();
        let ready = rig::ready_pods(&admin).await;
        let mut not = Vec::new();
        let serving: Vec<&String> = chosen.iter().filter(|c| live.contains(*c)).collect();
        if !serving.is_empty() {
            not.push(format!("chosen instances not ended: {serving:?}"));
        }
        let moving: Vec<String> = pool
            .iter()
            .filter(|(_, i)| !RESTING.contains(&i.state.as_str()))
            .map(|(_, i)| format!("{} {}", i.id, i.state.as_str()))
            .collect();
        if !moving.is_empty() {
            not.push(format!("not at rest in the warm pool: {moving:?}"));
        }
        if nodes.len() != live.len() + pool.len() {
            not.push(format!(
                "{} Nodes for {} instances and {} in the pool",
                nodes.len(),
                live.len(),
                pool.len()
            ));
        }
        if ready.len() != rig::APP_REPLICAS + nodes.len() {
            let bare: Vec<&String> = nodes
                .keys()
                .filter(|n| {
                    !ready
                        .iter()
                        .any(|(p, on)| on == *n && p.starts_with("logging/"))
                })
                .collect();
            not.push(format!(
                "{} pods Ready, {} wanted (the app's {} and a log shipper per Node; Nodes with none Ready: {bare:?})",
                ready.len(),
                rig::APP_REPLICAS + nodes.len(),
                rig::APP_REPLICAS
            ));
        }
        not
    };
    let settled_by = ca_asg_provider::clock::Instant::now();
    let mut settled = false;
    let mut why_not: Vec<String> = Vec::new();
    // Since when only pods keep the run from settling, and whether the controller
    // manager was restarted for it (once a settling).
    let mut only_pods_since: Option<ca_asg_provider::clock::Instant> = None;
    let mut kcm_restarted = false;
    while settled_by.elapsed() < Duration::from_secs(240) {
        watch_pool(&cloud, &mut resting, &mut chosen, &mut rec);
        ask_again(&replicas, &mut again, &mut rec, step, seed).await;
        reclaim_due(
            &cloud,
            &admin,
            &kubelet,
            &mut warned,
            &mut rec,
            (step, true),
            seed,
        )
        .await;
        // The person stops a drain command still following, and gives the node back
        // once its drain has ended.
        if let Some(mut d) = cli.take() {
            let (said, kept) = d.undo(&admin, true).await;
            if kept {
                cli = Some(d);
            } else {
                rec.step(
                    step,
                    seed,
                    "cli_undrain",
                    json!({"node": d.node, "said": said, "settling": true}),
                );
            }
        }
        let not = unsettled(
            cloud.clone(),
            kubelet.clone(),
            admin.clone(),
            chosen.clone(),
        )
        .await;
        if not.is_empty() && cli.is_none() {
            settled = true;
            break;
        }
        // The real controller manager's DaemonSet controller can stand still after API
        // server restarts close together: its pod informer stays behind the pods it
        // wrote ("read version ... is not as new as written version"), its retries back
        // off for minutes, and no log shipper comes to a new Node. When only pods keep
        // the run from settling for 60 s, it is restarted once, as an operator would
        // (recorded in the schedule): the checker's rules do not rest on it.
        let only_pods = not.len() == 1 && not[0].contains("pods Ready") && cli.is_none();
        if !only_pods {
            only_pods_since = None;
        } else if !kcm_restarted
            && only_pods_since
                .get_or_insert_with(ca_asg_provider::clock::Instant::now)
                .elapsed()
                > Duration::from_secs(60)
        {
            kcm_restarted = true;
            let took = cp
                .restart("kube-controller-manager", Stop::Term)
                .await
                .expect("the controller manager restarts");
            rec.step(
                step,
                seed,
                "kcm_restart",
                json!({"settling": true, "why": not[0], "ready_after_ms": took.as_millis() as u64}),
            );
        }
        why_not = not;
        if cli.is_some() {
            why_not.push("a drain command still follows its drain".into());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // CA reads its target size once more, from the leader (a replica restarted while
    // settling may still wait for the dead one's Lease to expire: up to a lease).
    let waited = ca_asg_provider::clock::Instant::now();
    while !replicas.iter().any(|r| r.leads()) && waited.elapsed() < Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let leader = replicas.iter().position(|r| r.leads());
    watch_pool(&cloud, &mut resting, &mut chosen, &mut rec);
    if let Some(l) = leader {
        let mut ca = replicas[l].ca.clone().unwrap();
        for group in [GROUP, POOLED] {
            let size = target_of(&mut ca, group).await;
            rec.choice(json!({"who": "ca", "op": "TargetSize", "group": group, "size": size}));
        }
    }
    for (r, l) in replicas.iter().zip(&links) {
        for p in l.pauses() {
            rec.choices.push(json!({"who": "net", "op": "Pause", "replica": r.who.uid(), "from": p.from, "to": p.to, "held": p.sent.len(), "sent": p.sent}));
        }
    }
    write_run(&rec, &cloud, &aws, &admin, &cp.audit_log()).await;
    // The control plane's own logs beside the run's (kept when it fails): what a real
    // part did about a fault is there.
    for (name, path) in cp.part_logs() {
        let _ = std::fs::copy(path, dir.join(name));
    }
    let ended = cloud
        .lifecycle_log()
        .iter()
        .filter(|e| matches!(e, HookEvent::Terminated { .. }))
        .count();
    for r in &mut replicas {
        r.kill();
    }
    kubelet.stop();

    let out = std::process::Command::new(python())
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/scripts/soak_check.py"
        ))
        .arg(&dir)
        .output()
        .expect("run scripts/soak_check.py");
    let said = String::from_utf8_lossy(&out.stdout);
    let steps = step as f64;
    let per_min = steps / (driven.as_secs_f64() / 60.0);
    println!(
        "soak: seed {seed}, {:.1} min driven, {step} steps ({per_min:.1} a minute), by kind {:?}, {ended} instances ended, settled: {settled}\n{said}",
        driven.as_secs_f64() / 60.0,
        rec.counts
    );
    let passed = settled && out.status.success();
    if passed && asked_dir.is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    if !passed {
        // The schedule goes to the output too: a CI run's files go with its machine,
        // its output is kept.
        let schedule = std::fs::read_to_string(dir.join("schedule.jsonl")).unwrap_or_default();
        eprintln!("soak: the schedule of seed {seed} (schedule.jsonl):\n{schedule}soak: end of the schedule");
    }
    assert!(
        passed,
        "soak FAILED (seed {seed}; schedule {}; run files in {}; settled: {settled}{}):\n{said}{}",
        dir.join("schedule.jsonl").display(),
        dir.display(),
        if settled {
            String::new()
        } else {
            format!(", not settled after 240 s: {}", why_not.join("; "))
        },
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A person's `ca-asg-provider drain NODE` (drain only), run as the suite's admin with
/// its own configuration: it hands its drain to the replica that leads (or, none
/// renewing the Lease, runs it under the Lease itself), then follows it.
struct CliDrain {
    node: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl CliDrain {
    async fn start(cp: &ControlPlane, cloud: &MemoryCloud, node: &str) -> CliDrain {
        use ca_asg_provider::commands::drain::{drain_until, DrainArgs};
        use ca_asg_provider::config::ConfigArgs;
        let client = cp.client(Who::Admin).await.unwrap();
        let mut cfg = ConfigArgs {
            region: Some("us-east-1".into()),
            ..Default::default()
        }
        .load()
        .unwrap();
        cfg.scale_in = ScaleInSettings {
            leader_election: true,
            lease_namespace: Some("kube-system".into()),
            ..rig::settings()
        };
        let args = DrainArgs {
            node: node.to_string(),
            dry_run: false,
            terminate: false,
            config: ConfigArgs::default(),
        };
        let cloud: Arc<dyn ca_asg_provider::cloud::Cloud> = Arc::new(cloud.clone());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            drain_until(
                client,
                Some(cloud),
                &cfg,
                &args,
                Arc::new(|_: &str| {}),
                async {
                    let _ = stopped.await;
                },
            )
            .await
        });
        CliDrain {
            node: node.to_string(),
            stop: Some(stop),
            task,
        }
    }

    /// `undrain NODE` (`settling`: the command is stopped first, as with ^C, and the
    /// leader's drain is left to end). What it said, and whether the node is still
    /// drained (refused: a drain runs).
    async fn undo(&mut self, admin: &kube::Client, settling: bool) -> (String, bool) {
        use ca_asg_provider::commands::undrain::{undrain, Undone};
        use ca_asg_provider::scalein::decide::undo::Window;
        if settling {
            if let Some(stop) = self.stop.take() {
                let _ = stop.send(());
            }
        }
        if !self.task.is_finished() && !settling {
            return ("the command still runs".into(), true);
        }
        let window = Window {
            limits: rig::settings().limits(),
            after_deadline: Duration::from_secs(240),
        };
        match undrain(admin, &self.node, window, false, chrono::Utc::now()).await {
            Ok(Some(Undone::Refused(_))) => ("refused: a drain runs".into(), true),
            Ok(Some(u)) => (format!("{u:?}"), false),
            Ok(None) => ("no such Node".into(), false),
            Err(e) => (format!("error: {e}"), true),
        }
    }
}

/// The interruption queue on moto's SQS: the driver sends to it through the SDK as
/// AWS's services do; each replica reads it through a client of its own.
struct SoakQueue {
    /// moto's URL (each replica builds its own client to it).
    moto: String,
    url: String,
    sqs: aws_sdk_sqs::Client,
}

impl SoakQueue {
    /// Creates the queue with deploy/aws/interruption-queue.yaml's visibility timeout
    /// (60 s): a message a consumer received and did not delete (a follower's retry, a
    /// replica killed while handling it) is seen again a minute later, as in production.
    async fn create(moto: &support::moto::MotoServer) -> SoakQueue {
        let config = moto.sdk_config().await;
        let sqs = aws_sdk_sqs::Client::new(&config);
        let url = sqs
            .create_queue()
            .queue_name("ca-asg-provider-soak")
            .attributes(
                aws_sdk_sqs::types::QueueAttributeName::VisibilityTimeout,
                "60",
            )
            .send()
            .await
            .expect("moto creates the queue")
            .queue_url
            .expect("the queue's URL");
        SoakQueue {
            moto: moto.url.clone(),
            url,
            sqs,
        }
    }

    /// SendMessage, tried until moto answers (it is never faulted here).
    async fn send(&self, body: &str) {
        for _ in 0..50 {
            let sent = self
                .sqs
                .send_message()
                .queue_url(&self.url)
                .message_body(body)
                .send()
                .await;
            if sent.is_ok() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("moto did not take a message in 50 tries");
    }
}

/// Sends `body` to the queue as AWS's services do, at least once: a third of the time
/// twice. Kept in `sent` (a later step may replay it). Whether it went twice.
async fn at_least_once(
    queue: &SoakQueue,
    dice: &mut Dice,
    sent: &mut Vec<String>,
    body: String,
) -> bool {
    queue.send(&body).await;
    let twice = dice.below(3) == 0;
    if twice {
        queue.send(&body).await;
    }
    sent.push(body);
    twice
}

/// The (node, instance) of every instance of `web` in service with a Node that nobody
/// chose.
fn in_service_unchosen(
    cloud: &MemoryCloud,
    kubelet: &FakeKubelet,
    chosen: &std::collections::BTreeSet<String>,
) -> Vec<(String, String)> {
    let in_service = cloud.instances();
    kubelet
        .nodes()
        .into_iter()
        .filter(|(_, iid)| !chosen.contains(iid))
        .filter(|(_, iid)| {
            in_service.iter().any(|(g, i)| {
                g == GROUP
                    && i.id == *iid
                    && i.state == ca_asg_provider::cloud::LifecycleState::InService
            })
        })
        .collect()
}

/// CA's NodeGroupIncreaseSize of `group` by 1 (to the leader's replica); answered, the
/// increase is CA's choice. The error CA saw, if any.
async fn ca_increase(
    ca: &mut CloudProviderClient<Channel>,
    group: &str,
    rec: &mut Record,
) -> Option<String> {
    let r = ca
        .node_group_increase_size(proto::NodeGroupIncreaseSizeRequest {
            id: group.into(),
            delta: 1,
        })
        .await;
    if r.is_ok() {
        rec.choice(json!({"who": "ca", "op": "IncreaseSize", "group": group, "delta": 1}));
    }
    r.err().map(|e| e.to_string())
}

/// The hook's notification for an instance of a group: (group, instance, hook, token).
type Notice = fn(&str, &str, &str, Option<&str>) -> String;

/// The ASG scales `group` in by 1 on its own, through our hook: each instance it takes
/// out of service is chosen, and the hook's notification (`notice`: into the warm
/// pool or to its end) goes to the queue as the ASG sends it, a third of the time
/// twice (SQS delivers at least once). The instances, and whether a message went twice.
async fn asg_scale_in(
    (cloud, group, notice): (&MemoryCloud, &str, Notice),
    (queue, dice, sent): (&SoakQueue, &mut Dice, &mut Vec<String>),
    chosen: &mut std::collections::BTreeSet<String>,
    rec: &mut Record,
) -> (Vec<String>, bool) {
    let ended = cloud.external_scale_in(group, 1).unwrap();
    let mut twice = false;
    for iid in &ended {
        chosen.insert(iid.clone());
        rec.choice(json!({"who": "asg", "op": "ScaleIn", "group": group, "instance": iid}));
        let token = cloud.action_token(iid, HOOK);
        let body = notice(group, iid, HOOK, token.as_deref());
        twice = at_least_once(queue, dice, sent, body).await;
    }
    (ended, twice)
}

/// CA's NodeGroupTargetSize of `group`, after a Refresh (as CA reads it each loop).
async fn target_of(ca: &mut CloudProviderClient<Channel>, group: &str) -> i32 {
    ca.refresh(proto::RefreshRequest {}).await.expect("Refresh");
    ca.node_group_target_size(proto::NodeGroupTargetSizeRequest { id: group.into() })
        .await
        .expect("NodeGroupTargetSize")
        .into_inner()
        .target_size
}

/// The instances of `group` (not those in its warm pool).
fn of_group(cloud: &MemoryCloud, group: &str) -> std::collections::BTreeSet<String> {
    cloud
        .instances()
        .into_iter()
        .filter(|(g, _)| g == group)
        .map(|(_, i)| i.id)
        .collect()
}

/// Warm-pool moves as the driver sees them (before each step, and while settling): an
/// instance that came to rest in the pool (`Pooled`), and one that was resting there
/// and is back in the group (`Reused`: under the same Node name, and no longer chosen:
/// a later scale-in may choose it again). The checker tells each stay in service apart
/// by these; they are seen up to a step late.
fn watch_pool(
    cloud: &MemoryCloud,
    resting: &mut std::collections::BTreeSet<String>,
    chosen: &mut std::collections::BTreeSet<String>,
    rec: &mut Record,
) {
    let pool = cloud.pooled();
    let now: std::collections::BTreeSet<String> = pool
        .iter()
        .filter(|(_, i)| RESTING.contains(&i.state.as_str()))
        .map(|(_, i)| i.id.clone())
        .collect();
    let back = of_group(cloud, POOLED);
    for iid in now.difference(resting) {
        rec.choice(json!({"who": "aws", "op": "Pooled", "group": POOLED, "instance": iid}));
    }
    for iid in resting.iter().filter(|i| back.contains(*i)) {
        rec.choice(json!({"who": "aws", "op": "Reused", "group": POOLED, "instance": iid}));
        chosen.remove(iid);
    }
    // Still in the pool, resting or not: remembered until seen back in the group.
    let in_pool: std::collections::BTreeSet<String> =
        pool.iter().map(|(_, i)| i.id.clone()).collect();
    *resting = resting
        .iter()
        .filter(|i| in_pool.contains(*i))
        .cloned()
        .chain(now)
        .collect();
}

/// A spot warning's notice: EC2 reclaims the instance two minutes after it.
const SPOT_NOTICE_SECS: i64 = 120;

/// A spot instance EC2 has warned of and not reclaimed yet.
struct Warned {
    instance: String,
    /// The driver's step before which it is not reclaimed, drained or not.
    not_before: usize,
    deadline: chrono::DateTime<chrono::Utc>,
}

/// EC2 reclaims each warned instance whose node runs no app pod any more (the
/// service's drain is done, or it never had one), from its `not_before` step on, and
/// every one whose two minutes are up, drained or not, as EC2 does. The ASG replaces
/// it after its health check (5 s here). `settling`: the driver has stopped, so no
/// step bound is waited for.
async fn reclaim_due(
    cloud: &MemoryCloud,
    admin: &kube::Client,
    kubelet: &FakeKubelet,
    warned: &mut Vec<Warned>,
    rec: &mut Record,
    (step, settling): (usize, bool),
    seed: u64,
) {
    if warned.is_empty() {
        return;
    }
    let occupied: std::collections::BTreeSet<String> = rig::occupied(admin, kubelet)
        .await
        .into_iter()
        .map(|(_, iid)| iid)
        .collect();
    let now = chrono::Utc::now();
    let mut left = Vec::new();
    for w in warned.drain(..) {
        let drained = !occupied.contains(&w.instance);
        let late = now >= w.deadline;
        if (drained && (settling || step >= w.not_before)) || late {
            cloud.reclaim(&w.instance, Duration::from_secs(5));
            rec.step(
                step,
                seed,
                "spot_reclaim",
                json!({"instance": w.instance, "drained": drained, "at_deadline": late}),
            );
        } else {
            left.push(w);
        }
    }
    *warned = left;
}

/// CA's NodeGroupDeleteNodes of `pick` (node, instance); when it fails (the AWS faults
/// reach it), CA will ask again: `pick` goes to `again`.
async fn delete_nodes(
    ca: &mut CloudProviderClient<Channel>,
    pick: (String, String),
    again: &mut Vec<(String, String)>,
    rec: &mut Record,
    step: usize,
    seed: u64,
    what: &str,
) {
    let r = rig::try_ca_deletes(ca, std::slice::from_ref(&pick)).await;
    let error = r.as_ref().err().map(|e| e.to_string());
    rec.step(
        step,
        seed,
        what,
        json!({"node": pick.0, "instance": pick.1, "error": error}),
    );
    if r.is_err() {
        again.push(pick);
    }
}

/// The first DeleteNodes that failed, sent again to the replica that leads (if one does).
async fn ask_again(
    replicas: &[Replica],
    again: &mut Vec<(String, String)>,
    rec: &mut Record,
    step: usize,
    seed: u64,
) {
    let Some(l) = replicas.iter().position(|r| r.leads()) else {
        return;
    };
    if again.is_empty() {
        return;
    }
    let mut ca = replicas[l].ca.clone().unwrap();
    let pick = again.remove(0);
    delete_nodes(
        &mut ca,
        pick,
        again,
        rec,
        step,
        seed,
        "ca_delete_nodes_again",
    )
    .await;
}

/// The Python the checker runs on: `SOAK_PYTHON`, else `python3` (the checker needs
/// nothing but the standard library).
fn python() -> String {
    std::env::var("SOAK_PYTHON").unwrap_or_else(|_| "python3".into())
}

/// The checker's input (scripts/soak_check.py's contract): audit.log, cloud.jsonl,
/// end.json in `rec.dir`.
async fn write_run(
    rec: &Record,
    cloud: &MemoryCloud,
    aws: &AwsActs,
    admin: &kube::Client,
    audit: &Path,
) {
    use k8s_openapi::api::core::v1::{Node, Pod};
    let dir = &rec.dir;
    std::fs::copy(audit, dir.join("audit.log")).expect("copy the audit log");
    let mut lines: Vec<Value> = rec.choices.clone();
    for a in aws.all() {
        let mut words = a.what.split_whitespace();
        let op = words.next().unwrap_or_default().to_string();
        let instance = words.next().filter(|w| w.starts_with("i-"));
        lines.push(json!({"who": a.who, "op": op, "instance": instance, "at": rec.wall(a.at), "what": a.what}));
    }
    for e in cloud.lifecycle_log() {
        lines.push(match e {
            HookEvent::Completed { instance, hook, result } => {
                json!({"who": "aws", "op": "Completed", "instance": instance, "hook": hook, "result": result.as_str()})
            }
            HookEvent::TimedOut { instance, hook } => {
                json!({"who": "aws", "op": "TimedOut", "instance": instance, "hook": hook})
            }
            HookEvent::Dropped { instance, hook } => {
                json!({"who": "aws", "op": "Dropped", "instance": instance, "hook": hook})
            }
            HookEvent::Proceeded { instance } => json!({"who": "aws", "op": "Proceeded", "instance": instance}),
            HookEvent::Terminated { instance } => json!({"who": "aws", "op": "Terminated", "instance": instance}),
        });
    }
    for group in [GROUP, POOLED] {
        lines.push(
            json!({"who": "aws", "op": "Desired", "group": group, "desired": cloud.desired(group)}),
        );
    }
    for (group, i) in cloud.pooled() {
        lines.push(json!({"who": "aws", "op": "InPool", "group": group, "instance": i.id, "state": i.state.as_str()}));
    }
    let mut f = std::fs::File::create(dir.join("cloud.jsonl")).unwrap();
    for l in lines {
        writeln!(f, "{l}").unwrap();
    }
    let nodes = kube::Api::<Node>::all(admin.clone())
        .list(&Default::default())
        .await
        .expect("list Nodes");
    let pods = kube::Api::<Pod>::all(admin.clone())
        .list(&Default::default())
        .await
        .expect("list pods");
    let end = json!({"nodes": nodes.items, "pods": pods.items});
    std::fs::write(dir.join("end.json"), end.to_string()).unwrap();
}

/// The link's two breaks on a plain TCP echo server: a pause holds what the client
/// sent and delivers it at the heal on the same connection (counted as held); a cut
/// delivers nothing and closes the connection at the heal, and a new connection passes.
#[tokio::test]
async fn a_pause_delivers_late_and_a_cut_closes() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let echo = tokio::net::TcpListener::bind(("127.0.0.1", 0))
        .await
        .unwrap();
    let upstream = echo.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut c, _)) = echo.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = c.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    let link = Link::start(upstream).await.unwrap();
    let mut c = tokio::net::TcpStream::connect(link.addr).await.unwrap();
    let mut got = [0u8; 5];
    c.write_all(b"hello").await.unwrap();
    c.read_exact(&mut got).await.unwrap();
    assert_eq!(&got, b"hello");

    link.pause();
    c.write_all(b"late!").await.unwrap();
    // One opened during the pause delivers at the heal as well (counted as held).
    let mut opened = tokio::net::TcpStream::connect(link.addr).await.unwrap();
    opened.write_all(b"later").await.unwrap();
    let silent = tokio::time::timeout(Duration::from_millis(300), c.read_exact(&mut got)).await;
    assert!(silent.is_err(), "nothing passes during a pause");
    link.heal();
    c.read_exact(&mut got).await.unwrap();
    assert_eq!(
        &got, b"late!",
        "delivered at the heal, on the same connection"
    );
    opened.read_exact(&mut got).await.unwrap();
    assert_eq!(
        &got, b"later",
        "a connection opened during the pause delivers too"
    );
    let pauses = link.pauses();
    assert_eq!(pauses.len(), 1);
    assert_eq!(
        pauses[0].sent.len(),
        2,
        "two connections held the client's bytes"
    );
    assert!(
        pauses[0]
            .sent
            .iter()
            .all(|t| pauses[0].from <= *t && *t <= pauses[0].to),
        "each held connection's first bytes came during the pause: {:?}",
        pauses[0]
    );

    link.cut();
    c.write_all(b"never").await.unwrap();
    // A connection opened during the cut (a client's new request while the others
    // hang) is closed at the heal too, what it sent never delivered.
    let mut during = tokio::net::TcpStream::connect(link.addr).await.unwrap();
    during.write_all(b"never").await.unwrap();
    let silent = tokio::time::timeout(Duration::from_millis(300), c.read(&mut got)).await;
    assert!(silent.is_err(), "nothing passes during a cut");
    link.heal();
    for (which, conn) in [
        ("open at the cut", &mut c),
        ("opened during it", &mut during),
    ] {
        let n = tokio::time::timeout(Duration::from_secs(5), conn.read(&mut got))
            .await
            .unwrap_or_else(|_| panic!("{which}: closed at the heal"))
            .unwrap_or(0);
        assert_eq!(n, 0, "{which}: closed, what it held never delivered");
    }
    let mut fresh = tokio::net::TcpStream::connect(link.addr).await.unwrap();
    fresh.write_all(b"again").await.unwrap();
    fresh.read_exact(&mut got).await.unwrap();
    assert_eq!(&got, b"again");
    assert_eq!(link.pauses().len(), 1, "a cut is not a pause");
}

/// The cloud the replicas' processes ask: each call is answered by the replica's own
/// view (its writes logged under its name), AWS's errors come through as they are, a
/// caller the server does not know is refused, and a server that is gone is a
/// transient failure, never an answer. Runs without the e2e environment.
#[tokio::test]
async fn the_served_cloud_answers_as_the_cloud_and_fails_as_a_network() {
    use ca_asg_provider::cloud::{Cloud, CloudError, GroupSelector};
    let cloud = MemoryCloud::new(
        vec![MemoryGroup::new(GROUP, 0, 8, 2, "m5.large").terminating_hook(HOOK, 300)],
        support::world::timing(),
    );
    let aws = AwsActs::default();
    let served = remote_cloud::Server::start().await;
    served.serve_as("replica-a", aws.cloud("replica-a", Arc::new(cloud.clone())));
    let remote = remote_cloud::Remote::new(served.addr, "replica-a");
    let selector = GroupSelector {
        names: vec![GROUP.into()],
        tag_sets: vec![],
    };

    let direct = cloud.describe_groups(&selector).await.unwrap();
    let asked = remote.describe_groups(&selector).await.unwrap();
    assert_eq!(asked, direct);
    assert_eq!(asked[0].instances.len(), 2);

    remote.set_desired_capacity(GROUP, 3).await.unwrap();
    assert_eq!(cloud.desired(GROUP), Some(3), "the write reached the cloud");
    assert!(
        aws.all().iter().any(|a| a.who == "replica-a"),
        "logged under the replica's name: {:?}",
        aws.all()
    );

    cloud.throttle("set_desired_capacity", 1);
    let throttled = remote.set_desired_capacity(GROUP, 4).await.unwrap_err();
    assert!(
        matches!(throttled, CloudError::Throttled { .. }),
        "{throttled:?}"
    );
    let missing = remote.terminating_hooks("no-such-group").await.unwrap_err();
    assert!(
        matches!(
            missing,
            CloudError::NotFound { .. } | CloudError::Rejected { .. }
        ),
        "{missing:?}"
    );

    let stranger = remote_cloud::Remote::new(served.addr, "replica-z");
    let refused = stranger.describe_groups(&selector).await.unwrap_err();
    assert!(
        matches!(&refused, CloudError::Rejected { code, .. } if code == "UnknownCaller"),
        "{refused:?}"
    );

    // A port nobody listens on: the call failed transiently (whether it took effect is
    // not known), and may be tried again.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let nowhere = port.local_addr().unwrap();
    drop(port);
    let gone = remote_cloud::Remote::new(nowhere, "replica-a")
        .describe_groups(&selector)
        .await
        .unwrap_err();
    assert!(gone.is_retryable(), "{gone:?}");
}

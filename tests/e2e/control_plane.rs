//! A real Kubernetes control plane on 127.0.0.1: etcd, kube-apiserver (RBAC, one static
//! token per client, an audit log of the writes the checks read), kube-controller-manager
//! (ReplicaSet, Deployment, DaemonSet, disruption, garbage-collector, pod GC,
//! ServiceAccount and Job controllers) and kube-scheduler, built from the Go module proxy by
//! `scripts/e2e/build.sh`. Every process is ours: killed by PID on drop, its files in a
//! temporary directory.
#![allow(dead_code)] // shared by the e2e test crates, each using a part

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use ca_asg_provider::clock::Instant;

use anyhow::{bail, Context};
use ca_asg_provider::telemetry::process::{ProcSample, ProcWatch};
use serde::Deserialize;

/// Where the upstream binaries are: `E2E_K8S_BIN` (kube-apiserver, kube-controller-manager,
/// kube-scheduler) and `E2E_ETCD` (the etcd binary), both set by `scripts/e2e.sh`.
pub struct Binaries {
    pub k8s: PathBuf,
    pub etcd: PathBuf,
    /// The Kubernetes version the binaries were built from (for the report).
    pub version: String,
}

impl Binaries {
    /// The binaries named by the environment, or `None` when the suite was not asked for.
    pub fn from_env() -> Option<Binaries> {
        let k8s = PathBuf::from(std::env::var_os("E2E_K8S_BIN")?);
        let etcd = PathBuf::from(std::env::var_os("E2E_ETCD")?);
        let version = std::env::var("E2E_K8S_VERSION").unwrap_or_else(|_| "unknown".into());
        Some(Binaries { k8s, etcd, version })
    }

    /// Whether this version's kube-apiserver knows the feature gate `name` (its
    /// `--help` lists every gate it has).
    pub fn knows_gate(&self, name: &str) -> bool {
        std::process::Command::new(self.k8s.join("kube-apiserver"))
            .arg("--help")
            .output()
            .is_ok_and(|o| {
                String::from_utf8_lossy(&o.stdout).contains(&format!("{name}=true|false"))
            })
    }
}

/// An identity the API server knows by its static token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Who {
    /// system:masters: the test driver.
    Admin,
    /// The controller manager (system:masters, so every controller may act as itself).
    ControllerManager,
    /// kube-scheduler's own user, bound by the API server's bootstrap RBAC.
    Scheduler,
    /// The fake kubelet (system:masters: it stands in for every node's kubelet and the
    /// cloud node controller that deletes a Node whose instance ended).
    Kubelet,
    /// The service, as the ServiceAccount the shipped RBAC binds.
    Service,
    /// Another drainer run beside the service for comparison (`kubectl drain` in the
    /// storm): system:masters, under a name of its own so the audit log tells its
    /// requests apart.
    Drainer,
    /// The soak's two replicas of the service (`tests/e2e/soak.rs`): the ServiceAccount's
    /// user, each under its own uid (its identity in the Lease), so the audit log tells
    /// their requests apart.
    ReplicaA,
    ReplicaB,
}

pub const SERVICE_USER: &str = "system:serviceaccount:kube-system:cluster-autoscaler";
pub const KUBELET_USER: &str = "e2e:fake-kubelet";
pub const DRAINER_USER: &str = "e2e:drainer";

impl Who {
    const ALL: [Who; 8] = [
        Who::Admin,
        Who::ControllerManager,
        Who::Scheduler,
        Who::Kubelet,
        Who::Service,
        Who::Drainer,
        Who::ReplicaA,
        Who::ReplicaB,
    ];

    fn token(self) -> String {
        format!("e2e-token-{}", self.uid().replace([':', '/'], "-"))
    }

    /// The user's uid in the audit log: its name, but a replica's identity for each of
    /// the soak's replicas.
    pub fn uid(self) -> &'static str {
        match self {
            Who::ReplicaA => "replica-a",
            Who::ReplicaB => "replica-b",
            _ => self.user(),
        }
    }

    pub fn user(self) -> &'static str {
        match self {
            Who::Admin => "e2e:admin",
            Who::ControllerManager => "system:kube-controller-manager",
            Who::Scheduler => "system:kube-scheduler",
            Who::Kubelet => KUBELET_USER,
            Who::Service | Who::ReplicaA | Who::ReplicaB => SERVICE_USER,
            Who::Drainer => DRAINER_USER,
        }
    }

    fn groups(self) -> &'static str {
        match self {
            Who::Admin | Who::ControllerManager | Who::Kubelet | Who::Drainer => "system:masters",
            Who::Scheduler => "system:authenticated",
            Who::Service | Who::ReplicaA | Who::ReplicaB => {
                "system:serviceaccounts,system:serviceaccounts:kube-system"
            }
        }
    }
}

/// One audit event, as kube-apiserver writes it (JSON lines; `ResponseComplete`, and
/// `ResponseStarted` for a watch as it opens).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AuditEvent {
    #[serde(default)]
    pub stage: String,
    /// When the stage was reached (RFC 3339, microseconds).
    #[serde(default)]
    pub stage_timestamp: Option<chrono::DateTime<chrono::Utc>>,
    pub verb: String,
    pub user: AuditUser,
    #[serde(default)]
    pub user_agent: String,
    #[serde(default)]
    pub object_ref: Option<ObjectRef>,
    #[serde(default)]
    pub response_status: Option<ResponseStatus>,
    /// The request's body, where the policy logs it (a budget's status).
    #[serde(default)]
    pub request_object: Option<serde_json::Value>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct AuditUser {
    pub username: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct ObjectRef {
    #[serde(default)]
    pub resource: String,
    #[serde(default)]
    pub subresource: String,
    #[serde(default)]
    pub namespace: String,
    #[serde(default)]
    pub name: String,
}

#[derive(Debug, Clone, Deserialize)]
pub struct ResponseStatus {
    #[serde(default)]
    pub code: u16,
}

impl AuditEvent {
    pub fn code(&self) -> u16 {
        self.response_status.as_ref().map_or(0, |s| s.code)
    }
    pub fn is(&self, verb: &str, resource: &str, subresource: &str) -> bool {
        let r = self.object_ref.clone().unwrap_or_default();
        self.verb == verb && r.resource == resource && r.subresource == subresource
    }
    pub fn target(&self) -> String {
        let r = self.object_ref.clone().unwrap_or_default();
        format!("{}/{}", r.namespace, r.name)
    }
}

pub struct ControlPlane {
    dir: tempfile::TempDir,
    procs: Vec<(&'static str, Child)>,
    /// How each process was started (its program and arguments), to start it again.
    launched: BTreeMap<&'static str, (PathBuf, Vec<String>)>,
    pub url: String,
    ca_pem: Vec<u8>,
    /// Feature gates the API server and the controller manager run with (`A=true,B=false`).
    gates: String,
}

/// A free port on 127.0.0.1 (bound, then released for the process that takes it),
/// below the kernel's ephemeral range and the NodePorts: a port from that range, once
/// released, can be taken as the source port of any outgoing connection (the suite's
/// own clients make many) before etcd or the API server binds it (CI here: etcd's
/// "bind: address already in use" at "start the control plane"). Ports are handed
/// out in turn from a start of this process's own, each checked free when handed
/// out; without such a range (an unusual `ip_local_port_range`) the kernel picks.
pub fn free_port() -> u16 {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(0);
    // Below NodePorts (30000 and up), which kube-proxy may hold open too.
    const FROM: u32 = 10_000;
    let to = low.min(30_000);
    if to > FROM + 1_000 {
        let span = to - FROM;
        let start = std::process::id().wrapping_mul(7_919) % span;
        for _ in 0..span {
            let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let port = FROM + (start + n) % span;
            if TcpListener::bind(("127.0.0.1", port as u16)).is_ok() {
                return port as u16;
            }
        }
    }
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port on 127.0.0.1")
}

/// Every request of the service and of a drainer compared with it (what the storm
/// counts), and everyone's writes of pods, evictions, Nodes and budgets (what the
/// checks read). For the soak's checker (scripts/soak_check.py), which reads nothing
/// else: Lease writes with their body (the holder), pod creates with their answer (the
/// name, the owner), bindings and Node creates with their body (the node, the
/// providerID).
const AUDIT_POLICY: &str = r#"apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
  - level: Request
    verbs: ["create", "update", "patch"]
    resources:
      - group: "coordination.k8s.io"
        resources: ["leases"]
  - level: RequestResponse
    verbs: ["create"]
    resources:
      - group: ""
        resources: ["pods"]
  - level: Request
    verbs: ["create"]
    resources:
      - group: ""
        resources: ["pods/binding", "nodes"]
  - level: Request
    users: ["system:serviceaccount:kube-system:cluster-autoscaler", "e2e:drainer"]
    verbs: ["update", "patch"]
    resources:
      - group: ""
        resources: ["nodes"]
  - level: Request
    users: ["system:serviceaccount:kube-system:cluster-autoscaler", "e2e:drainer"]
    verbs: ["create", "patch"]
    resources:
      - group: ""
        resources: ["events"]
      - group: "events.k8s.io"
        resources: ["events"]
  - level: Metadata
    users: ["system:serviceaccount:kube-system:cluster-autoscaler", "e2e:drainer"]
  - level: Request
    verbs: ["update", "patch"]
    resources:
      - group: "policy"
        resources: ["poddisruptionbudgets/status"]
  - level: Metadata
    verbs: ["create", "update", "patch", "delete", "deletecollection"]
    resources:
      - group: ""
        resources: ["pods", "pods/eviction", "nodes"]
      - group: "policy"
        resources: ["poddisruptionbudgets"]
  - level: None
"#;

/// How [`ControlPlane::wait_for`] waits: up to `secs`, every `pause_ms`; the logs it
/// shows when a component exits, and what it says at the deadline.
/// How [`ControlPlane::restart`] stops a component.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// SIGTERM: a graceful stop, as a rolling restart does.
    Term,
    /// SIGKILL: a crash.
    Kill,
}

struct Waiting {
    secs: u64,
    pause_ms: u64,
    dead_logs: [&'static str; 2],
    late: String,
    late_log: &'static str,
}

impl Waiting {
    /// For the API server's `/readyz`: 90 s, etcd's and its log if either dies.
    fn api_server(late: String) -> Waiting {
        Waiting {
            secs: 90,
            pause_ms: 200,
            dead_logs: ["etcd", "kube-apiserver"],
            late,
            late_log: "kube-apiserver",
        }
    }
}

impl ControlPlane {
    /// Starts etcd, the API server, the controller manager and the scheduler, and waits
    /// until the API server answers `/readyz` and the default ServiceAccount exists.
    pub async fn start(bin: &Binaries) -> anyhow::Result<ControlPlane> {
        ControlPlane::start_gated(bin, &[]).await
    }

    /// [`ControlPlane::start`] with feature gates (`Name=true`) given to the API server
    /// and the controller manager alike, as a cluster that turns a gate on does; a gate
    /// this version does not have yet is left out (it would refuse to start).
    pub async fn start_gated(bin: &Binaries, gates: &[&str]) -> anyhow::Result<ControlPlane> {
        let mut cp = ControlPlane::empty()?;
        let known: Vec<&str> = gates
            .iter()
            .copied()
            .filter(|g| bin.knows_gate(g.split('=').next().unwrap_or(g)))
            .collect();
        cp.gates = known.join(",");
        cp.start_etcd(bin)?;
        cp.start_apiserver(bin).await?;
        cp.start_controllers(bin)?;
        cp.wait_default_service_account("default").await?;
        Ok(cp)
    }

    /// etcd and the API server only (no controllers, no scheduler): for a test that asks
    /// the API server questions (RBAC) and runs no workload. Waits for `/readyz`.
    pub async fn start_api_server(bin: &Binaries) -> anyhow::Result<ControlPlane> {
        let mut cp = ControlPlane::empty()?;
        cp.start_etcd(bin)?;
        cp.start_apiserver(bin).await?;
        Ok(cp)
    }

    /// Nothing started yet: the directory every component writes in.
    fn empty() -> anyhow::Result<ControlPlane> {
        let dir = tempfile::Builder::new().prefix("ca-asg-e2e-").tempdir()?;
        Ok(ControlPlane {
            dir,
            procs: Vec::new(),
            launched: BTreeMap::new(),
            url: String::new(),
            ca_pem: Vec::new(),
            gates: String::new(),
        })
    }

    /// `--feature-gates=...` when any gate was given.
    fn gate_args(&self) -> Vec<String> {
        if self.gates.is_empty() {
            Vec::new()
        } else {
            vec![format!("--feature-gates={}", self.gates)]
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn spawn(&mut self, name: &'static str, program: &Path, args: &[String]) -> anyhow::Result<()> {
        let child = self.launch(name, program, args)?;
        self.launched
            .insert(name, (program.to_path_buf(), args.to_vec()));
        self.procs.push((name, child));
        Ok(())
    }

    /// Starts `program` with `args`, its output appended to `{name}.log`.
    fn launch(&self, name: &str, program: &Path, args: &[String]) -> anyhow::Result<Child> {
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.path(&format!("{name}.log")))?;
        dies_with_the_test(Command::new(program))
            .args(args)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("start {}", program.display()))
    }

    /// Restarts one component (`etcd`, `kube-apiserver`, ...) as an operator's restart
    /// or a crash does: `how` stops it (SIGTERM, as a rolling restart: the API server
    /// stops listening at once and finishes the requests it answers, each written to its
    /// audit log; what still runs 5 s later, the watches it holds open, is killed, as a
    /// short grace period does; or SIGKILL), then it starts again with the same arguments, files and port
    /// (the API server keeps its serving certificate in its `--cert-dir`, etcd its data),
    /// and the call waits until the API server answers `/readyz` again. The time from the
    /// stop to ready.
    pub async fn restart(&mut self, name: &'static str, how: Stop) -> anyhow::Result<Duration> {
        let i = self
            .procs
            .iter()
            .position(|(n, _)| *n == name)
            .with_context(|| format!("no component {name}"))?;
        let began = Instant::now();
        let pid = self.procs[i].1.id() as libc::pid_t;
        match how {
            // SAFETY: a signal to our own child, which has not been reaped (we hold it).
            Stop::Term => unsafe {
                libc::kill(pid, libc::SIGTERM);
            },
            Stop::Kill => {
                let _ = self.procs[i].1.kill();
            }
        }
        let stopped = Instant::now();
        while self.procs[i].1.try_wait()?.is_none() {
            if stopped.elapsed() > Duration::from_secs(5) {
                let _ = self.procs[i].1.kill();
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let (program, args) = self.launched[name].clone();
        self.procs[i].1 = self.launch(name, &program, &args)?;
        let client = self.client(Who::Admin).await?;
        let waiting = Waiting::api_server(format!(
            "kube-apiserver not ready 90 s after {name} restarted"
        ));
        self.wait_for(waiting, async |_| {
            let req = http::Request::get("/readyz").body(Vec::new())?;
            Ok(client.request_text(req).await.is_ok())
        })
        .await?;
        Ok(began.elapsed())
    }

    /// The last lines a component logged, for a failure message.
    pub fn log_tail(&self, name: &str) -> String {
        let text = fs::read_to_string(self.path(&format!("{name}.log"))).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    fn exited(&mut self) -> Option<String> {
        for (name, child) in &mut self.procs {
            if let Ok(Some(status)) = child.try_wait() {
                return Some(format!("{name} exited ({status})"));
            }
        }
        None
    }

    fn start_etcd(&mut self, bin: &Binaries) -> anyhow::Result<()> {
        let (client, peer) = (free_port(), free_port());
        let data = self.path("etcd");
        self.spawn(
            "etcd",
            &bin.etcd.clone(),
            &[
                "--name=e2e".into(),
                format!("--data-dir={}", data.display()),
                format!("--listen-client-urls=http://127.0.0.1:{client}"),
                format!("--advertise-client-urls=http://127.0.0.1:{client}"),
                format!("--listen-peer-urls=http://127.0.0.1:{peer}"),
                format!("--initial-advertise-peer-urls=http://127.0.0.1:{peer}"),
                format!("--initial-cluster=e2e=http://127.0.0.1:{peer}"),
                "--unsafe-no-fsync=true".into(),
                "--log-level=warn".into(),
            ],
        )?;
        fs::write(self.path("etcd.url"), format!("http://127.0.0.1:{client}"))?;
        Ok(())
    }

    async fn start_apiserver(&mut self, bin: &Binaries) -> anyhow::Result<()> {
        let port = free_port();
        let etcd = fs::read_to_string(self.path("etcd.url"))?;
        let mut tokens = fs::File::create(self.path("tokens.csv"))?;
        for who in Who::ALL {
            writeln!(
                tokens,
                "{},{},{},\"{}\"",
                who.token(),
                who.user(),
                who.uid(),
                who.groups()
            )?;
        }
        let sa_key = rcgen::KeyPair::generate()?;
        fs::write(self.path("sa.key"), sa_key.serialize_pem())?;
        fs::write(self.path("sa.pub"), sa_key.public_key_pem())?;
        fs::write(self.path("audit-policy.yaml"), AUDIT_POLICY)?;
        let certs = self.path("certs");
        let p = |n: &str| self.path(n).display().to_string();
        let mut args = vec![
            format!("--etcd-servers={etcd}"),
            "--bind-address=127.0.0.1".into(),
            "--advertise-address=127.0.0.1".into(),
            format!("--secure-port={port}"),
            format!("--cert-dir={}", certs.display()),
            format!("--token-auth-file={}", p("tokens.csv")),
            "--authorization-mode=RBAC".into(),
            "--service-account-issuer=https://kubernetes.default.svc".into(),
            format!("--service-account-key-file={}", p("sa.pub")),
            format!("--service-account-signing-key-file={}", p("sa.key")),
            "--service-cluster-ip-range=10.96.0.0/24".into(),
            format!("--audit-policy-file={}", p("audit-policy.yaml")),
            format!("--audit-log-path={}", p("audit.log")),
            "--audit-log-format=json".into(),
            "--audit-log-mode=blocking".into(),
            "--endpoint-reconciler-type=none".into(),
            "--enable-priority-and-fairness=true".into(),
            // A real node's kubelet (real_node.rs) by its InternalIP, as on EKS, for `kubectl
            // exec` and `logs`: the Nodes' hostnames resolve nowhere.
            "--kubelet-preferred-address-types=InternalIP,Hostname".into(),
        ];
        args.extend(self.gate_args());
        self.spawn("kube-apiserver", &bin.k8s.join("kube-apiserver"), &args)?;
        self.url = format!("https://127.0.0.1:{port}");
        let ready = async |cp: &mut ControlPlane| {
            let Ok(ca) = fs::read(certs.join("apiserver.crt")) else {
                return Ok(false);
            };
            cp.ca_pem = ca;
            let Ok(client) = cp.client(Who::Admin).await else {
                return Ok(false);
            };
            let req = http::Request::get("/readyz").body(Vec::new())?;
            Ok(client.request_text(req).await.is_ok())
        };
        let waiting = Waiting::api_server("kube-apiserver not ready in 90 s".into());
        self.wait_for(waiting, ready).await
    }

    /// Waits until `ready` answers true, polling: an error as soon as a component exited
    /// (with the tails of `dead_logs`), or at the deadline (`late`, with `late_log`'s).
    async fn wait_for(
        &mut self,
        w: Waiting,
        mut ready: impl AsyncFnMut(&mut ControlPlane) -> anyhow::Result<bool>,
    ) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(w.secs);
        loop {
            if let Some(dead) = self.exited() {
                let [a, b] = w.dead_logs;
                bail!(
                    "{dead}\n--- {a}:\n{}\n--- {b}:\n{}",
                    self.log_tail(a),
                    self.log_tail(b)
                );
            }
            if ready(self).await? {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("{}:\n{}", w.late, self.log_tail(w.late_log));
            }
            tokio::time::sleep(Duration::from_millis(w.pause_ms)).await;
        }
    }

    /// A kubeconfig for `who` (written once, beside the other files).
    pub fn kubeconfig(&self, who: Who) -> anyhow::Result<PathBuf> {
        use base64::Engine as _;
        let path = self.path(&format!(
            "{}.kubeconfig",
            who.uid().replace([':', '/'], "-")
        ));
        let ca = base64::engine::general_purpose::STANDARD.encode(&self.ca_pem);
        fs::write(
            &path,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: e2e\n  cluster:\n    server: {}\n    certificate-authority-data: {ca}\nusers:\n- name: u\n  user:\n    token: {}\ncontexts:\n- name: e2e\n  context: {{cluster: e2e, user: u}}\ncurrent-context: e2e\n",
                self.url,
                who.token()
            ),
        )?;
        Ok(path)
    }

    /// A kube client as `who`, over the API server's own serving certificate.
    pub async fn client(&self, who: Who) -> anyhow::Result<kube::Client> {
        client_from(&self.kubeconfig(who)?).await
    }

    fn start_controllers(&mut self, bin: &Binaries) -> anyhow::Result<()> {
        let mut kcm = self.controller_args(Who::ControllerManager, "kcm-certs")?;
        kcm.extend([
            "--controllers=replicaset-controller,deployment-controller,daemonset-controller,disruption-controller,garbage-collector-controller,pod-garbage-collector-controller,serviceaccount-controller,job-controller".into(),
            "--use-service-account-credentials=false".into(),
            "--kube-api-qps=100".into(),
            "--kube-api-burst=200".into(),
        ]);
        kcm.extend(self.gate_args());
        self.spawn(
            "kube-controller-manager",
            &bin.k8s.join("kube-controller-manager"),
            &kcm,
        )?;
        let sched = self.controller_args(Who::Scheduler, "scheduler-certs")?;
        self.spawn("kube-scheduler", &bin.k8s.join("kube-scheduler"), &sched)?;
        Ok(())
    }

    /// What kube-controller-manager and kube-scheduler are both started with: `who`'s
    /// kubeconfig (for the API, authentication and authorization), no leader election, a
    /// secure port of their own on loopback with certificates in `certs`.
    fn controller_args(&self, who: Who, certs: &str) -> anyhow::Result<Vec<String>> {
        let kubeconfig = self.kubeconfig(who)?.display().to_string();
        Ok(vec![
            format!("--kubeconfig={kubeconfig}"),
            "--leader-elect=false".into(),
            format!("--secure-port={}", free_port()),
            "--bind-address=127.0.0.1".into(),
            format!("--cert-dir={}", self.path(certs).display()),
            format!("--authentication-kubeconfig={kubeconfig}"),
            format!("--authorization-kubeconfig={kubeconfig}"),
            "--authentication-skip-lookup=true".into(),
        ])
    }

    /// Waits for the ServiceAccount controller to create `default` in `ns` (pods are
    /// refused before it exists).
    pub async fn wait_default_service_account(&mut self, ns: &str) -> anyhow::Result<()> {
        let client = self.client(Who::Admin).await?;
        let sas: kube::Api<k8s_openapi::api::core::v1::ServiceAccount> =
            kube::Api::namespaced(client, ns);
        let waiting = Waiting {
            secs: 60,
            pause_ms: 100,
            dead_logs: ["kube-controller-manager", "kube-scheduler"],
            late: format!("no default ServiceAccount in {ns} after 60 s"),
            late_log: "kube-controller-manager",
        };
        self.wait_for(waiting, async |_| {
            Ok(sas.get_opt("default").await?.is_some())
        })
        .await
    }

    /// The audit log's file (JSON lines).
    pub fn audit_log(&self) -> PathBuf {
        self.path("audit.log")
    }

    /// The log of each part it runs (`etcd.log`, `kube-apiserver.log`, ...): (name, path).
    pub fn part_logs(&self) -> Vec<(String, PathBuf)> {
        self.procs
            .iter()
            .map(|(name, _)| (format!("{name}.log"), self.path(&format!("{name}.log"))))
            .collect()
    }

    /// Every audit event written so far.
    pub fn audit(&self) -> Vec<AuditEvent> {
        let text = fs::read_to_string(self.path("audit.log")).unwrap_or_default();
        text.lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// CPU seconds (user + system) each component has used so far, read from /proc.
    pub fn cpu_seconds(&self) -> BTreeMap<&'static str, f64> {
        self.procs
            .iter()
            .filter_map(|(name, child)| Some((*name, sample(child.id())?.cpu_seconds)))
            .collect()
    }

    /// Peak resident memory (VmHWM, bytes) of each component, read from /proc.
    pub fn peak_rss(&self) -> BTreeMap<&'static str, u64> {
        self.procs
            .iter()
            .filter_map(|(name, child)| Some((*name, sample(child.id())?.peak_rss_bytes)))
            .collect()
    }

    /// Any component that died: the suite cannot trust a run after that.
    pub fn check_alive(&mut self) -> anyhow::Result<()> {
        match self.exited() {
            Some(dead) => bail!("{dead}"),
            None => Ok(()),
        }
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        // Controllers first, the store last.
        for (_, child) in self.procs.iter_mut().rev() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if std::env::var_os("E2E_KEEP").is_some() {
            let kept = self.dir.path().to_path_buf();
            eprintln!("e2e: kept {}", kept.display());
            std::mem::forget(std::mem::replace(
                &mut self.dir,
                tempfile::tempdir().expect("tempdir"),
            ));
        }
    }
}

/// A kube client from a kubeconfig of [`ControlPlane::kubeconfig`], built on the
/// runtime that calls it (its connections live there).
pub async fn client_from(path: &Path) -> anyhow::Result<kube::Client> {
    let kc = kube::config::Kubeconfig::read_from(path)?;
    let mut cfg =
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await?;
    // As the service builds its own client (`scalein::kube_client`): no retries of
    // 429s inside the client, or a budget's refusal of an eviction is retried there
    // for minutes and the drain never sees it (nor its deadline).
    cfg.default_retry = false;
    Ok(kube::Client::try_from(cfg)?)
}

/// A process's CPU times and memory, as `loadgen` reads them.
fn sample(pid: u32) -> Option<ProcSample> {
    ProcWatch::new(pid).sample().ok()
}

/// Peak resident memory (VmHWM, bytes) of a process.
pub fn proc_peak_rss(pid: u32) -> Option<u64> {
    sample(pid).map(|s| s.peak_rss_bytes)
}

/// A command whose process the kernel kills when the test that started it dies (a
/// killed or timed-out test run leaves no etcd, API server or kubelet behind; the
/// normal end still stops them in order). Linux's parent-death signal, sent when the
/// thread that spawned the process ends: the test's runtime thread.
pub fn dies_with_the_test(mut cmd: Command) -> Command {
    use std::os::unix::process::CommandExt;
    // SAFETY: between fork and exec only prctl, which is async-signal-safe, runs.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd
}

/// Creates one RBAC object (ClusterRole, ClusterRoleBinding, Role or RoleBinding) from its
/// manifest `v` as `admin`: a namespaced one in its namespace (kube-system when it names
/// none).
pub async fn create_rbac(admin: &kube::Client, v: &serde_json::Value) -> anyhow::Result<()> {
    use kube::api::{Api, DynamicObject, PostParams};
    let kind = v["kind"].as_str().unwrap_or_default();
    if !["ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"].contains(&kind) {
        bail!(
            "not a role or binding: {}/{}",
            v["kind"],
            v["metadata"]["name"]
        );
    }
    let ar = kube::discovery::ApiResource {
        group: "rbac.authorization.k8s.io".into(),
        version: "v1".into(),
        api_version: "rbac.authorization.k8s.io/v1".into(),
        kind: kind.to_string(),
        plural: format!("{}s", kind.to_lowercase()),
    };
    let ns = v["metadata"]["namespace"].as_str().unwrap_or("kube-system");
    let obj: DynamicObject = serde_json::from_value(v.clone())?;
    let api: Api<DynamicObject> = if kind.starts_with("Cluster") {
        Api::all_with(admin.clone(), &ar)
    } else {
        Api::namespaced_with(admin.clone(), ns, &ar)
    };
    api.create(&PostParams::default(), &obj).await?;
    Ok(())
}

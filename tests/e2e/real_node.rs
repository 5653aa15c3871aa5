//! A real node: a kubelet built from `k8s.io/kubernetes` (the control plane's version)
//! with its own containerd (Debian's containerd and runc, CNI bridge plugins), registered
//! with the providerID of an instance of the memory cloud, so the service and the ASG see
//! it as a member of the group. Images come from `scripts/e2e/images.py` (no registry).
//!
//! When the instance ends, the machine goes: the kubelet, containerd and every container
//! are killed at once, as a powered-off instance leaves them. `Drop` removes everything
//! the node made (containers, mounts, the CNI bridge, the kubepods cgroups, directories),
//! so the suite can run again on the same machine.
#![allow(dead_code)] // shared by the e2e test crates, each using a part

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use ca_asg_provider::clock::Instant;

use anyhow::{bail, Context};

use super::control_plane::{dies_with_the_test, free_port, ControlPlane, Who};

/// Whether this machine can run a real node (root, containerd, runc, the CNI plugins,
/// and the images directory `E2E_IMAGES` from scripts/e2e/images.py).
pub fn available() -> Option<PathBuf> {
    let images = PathBuf::from(std::env::var_os("E2E_IMAGES")?);
    let ok = images.join("pause.tar").exists()
        && images.join("busybox.tar").exists()
        && Path::new("/usr/lib/cni/bridge").exists()
        && which("containerd")
        && which("runc")
        && which("ctr");
    ok.then_some(images)
}

/// This machine's address on its default route: the address a kubelet without
/// `--node-ip` reports as the Node's InternalIP (found without sending a packet).
fn node_ip() -> anyhow::Result<std::net::IpAddr> {
    let s = std::net::UdpSocket::bind("0.0.0.0:0")?;
    s.connect("8.8.8.8:53")
        .context("no default route: the node has no address pods reach")?;
    Ok(s.local_addr()?.ip())
}

fn which(cmd: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {cmd}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

pub struct RealNode {
    pub name: String,
    dir: PathBuf,
    bridge: String,
    containerd: Option<Child>,
    kubelet: Option<Child>,
    /// The host directory the scenario's pods share with the test (hostPath).
    pub shared: PathBuf,
    /// Network namespaces, pod log directories and container log links that were there
    /// before this node (the rest are its pods').
    netns_before: Vec<String>,
    logs_before: Vec<String>,
}

fn pod_logs() -> Vec<String> {
    ["/var/log/pods", "/var/log/containers"]
        .iter()
        .flat_map(|d| fs::read_dir(d).into_iter().flatten().flatten())
        .map(|e| e.path().display().to_string())
        .collect()
}

fn netns() -> Vec<String> {
    fs::read_dir("/run/netns")
        .map(|d| {
            d.flatten()
                .map(|e| e.path().display().to_string())
                .collect()
        })
        .unwrap_or_default()
}

impl RealNode {
    /// Starts containerd and a kubelet for `name` (instance `provider_id`), imports the
    /// images, and waits until the Node is Ready.
    pub async fn start(
        cp: &ControlPlane,
        kubelet_bin: &Path,
        images: &Path,
        name: &str,
        provider_id: &str,
        labels: &str,
    ) -> anyhow::Result<RealNode> {
        let dir = tempfile::Builder::new()
            .prefix("ca-asg-e2e-node-")
            .tempdir()?
            .keep();
        let shared = dir.join("shared");
        fs::create_dir_all(&shared)?;
        // One /24 and bridge per process, so two runs on one machine do not meet.
        let n = (std::process::id() % 200 + 20) as u8;
        let bridge = format!("e2ebr{n}");
        let mut node = RealNode {
            name: name.to_string(),
            dir: dir.clone(),
            bridge: bridge.clone(),
            containerd: None,
            kubelet: None,
            shared,
            netns_before: netns(),
            logs_before: pod_logs(),
        };
        node.start_containerd(n)?;
        node.import(images)?;
        node.start_kubelet(cp, kubelet_bin, provider_id, labels)?;
        let nodes: kube::Api<k8s_openapi::api::core::v1::Node> =
            kube::Api::all(cp.client(Who::Admin).await?);
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            if let Some(n) = nodes.get_opt(name).await? {
                let ready = n
                    .status
                    .and_then(|s| s.conditions)
                    .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
                if ready {
                    // The node lifecycle controller's part (not run here: it would taint
                    // the fake nodes, whose kubelets renew no Lease): lift the not-ready
                    // taint the kubelet registers with once the node is Ready.
                    let patch = serde_json::json!({"spec": {"taints": null}});
                    nodes
                        .patch(
                            name,
                            &kube::api::PatchParams::default(),
                            &kube::api::Patch::Merge(patch),
                        )
                        .await?;
                    return Ok(node);
                }
            }
            if let Some(k) = node.kubelet.as_mut() {
                if let Ok(Some(st)) = k.try_wait() {
                    bail!("kubelet exited ({st}):\n{}", node.log_tail("kubelet"));
                }
            }
            if Instant::now() > deadline {
                bail!(
                    "node {name} not Ready after 90 s:\n{}",
                    node.log_tail("kubelet")
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    fn p(&self, rel: &str) -> PathBuf {
        self.dir.join(rel)
    }

    fn socket(&self) -> PathBuf {
        self.p("containerd/containerd.sock")
    }

    pub fn log_tail(&self, name: &str) -> String {
        let text = fs::read_to_string(self.p(&format!("{name}.log"))).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(25)..].join("\n")
    }

    fn start_containerd(&mut self, n: u8) -> anyhow::Result<()> {
        let d = self.dir.display().to_string();
        fs::create_dir_all(self.p("cni"))?;
        fs::write(
            self.p("containerd.toml"),
            format!(
                r#"version = 2
root = "{d}/containerd/root"
state = "{d}/containerd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.devmapper"]
[grpc]
  address = "{d}/containerd/containerd.sock"
[ttrpc]
  address = "{d}/containerd/containerd.sock.ttrpc"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "e2e.local/pause:1"
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{d}/cni"
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "{d}/certs.d"
"#
            ),
        )?;
        // The bridge is the pods' default gateway: a pod reaches this machine's
        // addresses (the API server's in-cluster address, moto on the node's IP) through it.
        fs::write(
            self.p("cni/10-bridge.conflist"),
            format!(
                r#"{{"cniVersion": "0.4.0", "name": "e2e-{n}", "plugins": [
 {{"type": "bridge", "bridge": "{}", "isGateway": true, "isDefaultGateway": true, "ipMasq": false,
  "ipam": {{"type": "host-local", "ranges": [[{{"subnet": "10.244.{n}.0/24"}}]], "dataDir": "{d}/ipam"}}}},
 {{"type": "loopback"}}]}}"#,
                self.bridge
            ),
        )?;
        let log = fs::File::create(self.p("containerd.log"))?;
        let child = dies_with_the_test(Command::new("containerd"))
            .arg("--config")
            .arg(self.p("containerd.toml"))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("start containerd")?;
        self.containerd = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self.socket().exists() {
            if Instant::now() > deadline {
                bail!("containerd did not start:\n{}", self.log_tail("containerd"));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(())
    }

    fn ctr(&self, args: &[&str]) -> anyhow::Result<String> {
        let out = Command::new("ctr")
            .arg("-a")
            .arg(self.socket())
            .args(["-n", "k8s.io"])
            .args(args)
            .output()?;
        if !out.status.success() {
            bail!(
                "ctr {args:?}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Imports one more image archive (docker-archive or OCI archive) into the node's
    /// containerd, as `ctr -n k8s.io images import` does; returns what ctr printed.
    pub fn import_image(&self, archive: &Path) -> anyhow::Result<String> {
        self.ctr(&["images", "import", &archive.display().to_string()])
    }

    /// Lets the node's containerd pull from `host` (`127.0.0.1:PORT`, a registry the test
    /// started on loopback) over plain HTTP: its `hosts.toml` in the registry config
    /// directory, which containerd reads at each pull.
    pub fn trust_registry(&self, host: &str) -> anyhow::Result<()> {
        let dir = self.p("certs.d").join(host);
        fs::create_dir_all(&dir)?;
        fs::write(
            dir.join("hosts.toml"),
            format!(
                "server = \"http://{host}\"\n\n[host.\"http://{host}\"]\n  capabilities = [\"pull\", \"resolve\"]\n"
            ),
        )?;
        Ok(())
    }

    fn import(&self, images: &Path) -> anyhow::Result<()> {
        for tar in ["pause.tar", "busybox.tar"] {
            self.ctr(&["images", "import", &images.join(tar).display().to_string()])?;
        }
        Ok(())
    }

    fn start_kubelet(
        &mut self,
        cp: &ControlPlane,
        bin: &Path,
        provider_id: &str,
        labels: &str,
    ) -> anyhow::Result<()> {
        let (port, healthz) = (free_port(), free_port());
        // The kubelet serves on the node's own IP (the InternalIP it reports, set with
        // --node-ip) rather than 127.0.0.1, so that the API server reaches it for `kubectl
        // exec` and `kubectl logs` as on a real cluster (the quickstart's scripts use both).
        let ip = node_ip()?;
        fs::write(
            self.p("kubelet.yaml"),
            format!(
                r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
failSwapOn: false
failCgroupV1: false
containerRuntimeEndpoint: unix://{sock}
readOnlyPort: 0
address: {ip}
port: {port}
healthzBindAddress: 127.0.0.1
healthzPort: {healthz}
makeIPTablesUtilChains: false
evictionHard:
  memory.available: "100Mi"
  nodefs.available: "1%"
  imagefs.available: "1%"
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
providerID: "{provider_id}"
serializeImagePulls: false
authentication:
  anonymous:
    enabled: true
  webhook:
    enabled: false
authorization:
  mode: AlwaysAllow
"#,
                sock = self.socket().display()
            ),
        )?;
        let kubeconfig = cp.kubeconfig(Who::Kubelet)?;
        let log = fs::File::create(self.p("kubelet.log"))?;
        let child = dies_with_the_test(Command::new(bin))
            .arg(format!("--config={}", self.p("kubelet.yaml").display()))
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg(format!("--hostname-override={}", self.name))
            .arg(format!("--node-ip={ip}"))
            .arg(format!("--root-dir={}", self.p("kubelet").display()))
            .arg(format!("--cert-dir={}", self.p("kubelet-pki").display()))
            .arg(format!("--node-labels={labels}"))
            .arg("--v=1")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("start kubelet")?;
        self.kubelet = Some(child);
        Ok(())
    }

    /// The instance ends: the kubelet, containerd and every container die at once.
    pub fn power_off(&mut self) {
        for child in [self.kubelet.take(), self.containerd.take()]
            .into_iter()
            .flatten()
        {
            kill(child);
        }
        // The shims and the containers outlive containerd: kill them by their cgroup.
        for pid in pids_under(&self.kubepods()) {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
        }
        let shim = format!("{}/containerd/containerd.sock", self.dir.display());
        let _ = Command::new("pkill").args(["-9", "-f", &shim]).status();
    }

    fn kubepods(&self) -> Vec<PathBuf> {
        [
            "cpu", "memory", "pids", "cpuset", "blkio", "freezer", "devices", "cpuacct", "systemd",
            "unified", "hugetlb",
        ]
        .iter()
        .map(|c| PathBuf::from(format!("/sys/fs/cgroup/{c}/kubepods")))
        .filter(|p| p.exists())
        .collect()
    }

    fn teardown(&mut self) {
        // Containers first (through containerd while it runs), then the processes.
        if self.containerd.is_some() {
            if let Ok(tasks) = self.ctr(&["tasks", "ls", "-q"]) {
                for t in tasks.lines() {
                    let _ = self.ctr(&["tasks", "kill", "-s", "SIGKILL", t]);
                    let _ = self.ctr(&["tasks", "delete", "-f", t]);
                }
            }
            if let Ok(cs) = self.ctr(&["containers", "ls", "-q"]) {
                for c in cs.lines() {
                    let _ = self.ctr(&["containers", "delete", c]);
                }
            }
        }
        self.power_off();
        // Mounts the kubelet and containerd made under the node's directory, deepest first.
        let mounts = fs::read_to_string("/proc/self/mounts").unwrap_or_default();
        let pods_netns: Vec<String> = netns()
            .into_iter()
            .filter(|n| !self.netns_before.contains(n))
            .collect();
        let mut ours: Vec<&str> = mounts
            .lines()
            .filter_map(|l| l.split_whitespace().nth(1))
            .filter(|m| {
                m.starts_with(&self.dir.display().to_string()) || pods_netns.iter().any(|n| n == m)
            })
            .collect();
        ours.sort_by_key(|m| std::cmp::Reverse(m.len()));
        for m in ours {
            let _ = Command::new("umount").args(["-l", m]).status();
        }
        for n in &pods_netns {
            let _ = fs::remove_file(n);
        }
        // The kubelet's pod logs live in the host's /var/log: its pods' go with it.
        for p in pod_logs() {
            if !self.logs_before.contains(&p) {
                let path = Path::new(&p);
                let _ = if path.is_dir() && !path.is_symlink() {
                    fs::remove_dir_all(path)
                } else {
                    fs::remove_file(path)
                };
            }
        }
        let _ = Command::new("ip")
            .args(["link", "delete", &self.bridge])
            .stderr(Stdio::null())
            .status();
        for root in self.kubepods() {
            remove_cgroup_tree(&root);
        }
        if std::env::var_os("E2E_KEEP").is_some() {
            let keep = std::env::temp_dir().join(format!("ca-asg-e2e-{}-logs", self.name));
            let _ = fs::create_dir_all(&keep);
            for f in ["kubelet.log", "containerd.log"] {
                let _ = fs::copy(self.p(f), keep.join(f));
            }
            let _ = fs::copy(self.shared.join("written"), keep.join("written"));
            eprintln!("e2e: kept the node's logs in {}", keep.display());
        }
        let _ = fs::remove_dir_all(&self.dir);
    }
}

fn kill(mut child: Child) {
    let _ = child.kill();
    let _ = child.wait();
}

fn pids_under(roots: &[PathBuf]) -> Vec<u32> {
    let mut pids = Vec::new();
    let mut stack: Vec<PathBuf> = roots.to_vec();
    while let Some(d) = stack.pop() {
        if let Ok(text) = fs::read_to_string(d.join("cgroup.procs")) {
            pids.extend(text.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
        }
        if let Ok(entries) = fs::read_dir(&d) {
            stack.extend(entries.flatten().map(|e| e.path()).filter(|p| p.is_dir()));
        }
    }
    pids
}

fn remove_cgroup_tree(root: &Path) {
    let mut dirs = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        if let Ok(entries) = fs::read_dir(&d) {
            stack.extend(entries.flatten().map(|e| e.path()).filter(|p| p.is_dir()));
        }
        dirs.push(d);
    }
    dirs.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
    for d in dirs {
        let _ = fs::remove_dir(&d);
    }
}

impl Drop for RealNode {
    fn drop(&mut self) {
        self.teardown();
    }
}

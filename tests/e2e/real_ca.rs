//! The real-CA tier: upstream cluster-autoscaler binaries, run against the service over
//! externalgrpc on the suite's real control plane, as CA's ServiceAccount with exactly the
//! RBAC the project ships.
//!
//! Nobody's registry serves cluster-autoscaler, so the binaries come from the user:
//! `E2E_CA_BINS` names a directory of `cluster-autoscaler*` executables copied out of the
//! official images (`registry.k8s.io/autoscaling/cluster-autoscaler:vX.Y.Z`, file
//! `/cluster-autoscaler`, renamed with its version: `cluster-autoscaler-1.36.1`). Without
//! it [`binaries_from_env`] says why, and the caller prints one "real-CA tier skipped" line.
//!
//! Each binary is asked which flags it knows (`--help`): a flag the version lacks is never
//! passed (CA exits at once on an unknown flag), and is listed in [`RealCa::dropped_flags`].
//! Its version: no upstream CA has `--version` (1.31.5 to master answer with the usage),
//! so it is read from the line every version logs at start, `Cluster Autoscaler 1.36.1`
//! (`main.go`, V(1); a build from master says `dev`), else from the file name.
//! CA logs to stderr (klog's default in every version), which goes to a file in the
//! control plane's temporary directory, kept with it under `E2E_KEEP`.
#![allow(dead_code)] // shared by the e2e test crates, each using a part

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use ca_asg_provider::clock::Instant;

use anyhow::{anyhow, bail, Context};
use ca_asg_provider::config::ListenAddr;

use super::control_plane::{dies_with_the_test, free_port, ControlPlane, Who};

/// The directory of binaries, set by whoever runs the tier.
pub const ENV: &str = "E2E_CA_BINS";

/// How long CA may take from its start to its first loop before [`RealCa::first_loop`]
/// gives up (CA >= 1.35 waits forever for caches it may not list: RBAC).
pub const FIRST_LOOP_SECS: u64 = 90;

/// ... or once it has been refused by the API server and not started this long after its
/// start (it starts in 2 to 4 s on a small machine).
pub const REFUSED_SECS: u64 = 30;

/// One cluster-autoscaler binary of the directory.
#[derive(Debug, Clone)]
pub struct CaBinary {
    pub path: PathBuf,
    /// `1.36.1`, or what is known of it (`master`, `dev`, `unknown`).
    pub version: String,
    /// Where the version was read: `--version`, `startup log` or `file name`.
    pub version_source: &'static str,
    /// The long flags the binary's `--help` lists (empty when it listed none: then the
    /// table of [`known_by_version`] decides).
    pub flags: BTreeSet<String>,
}

impl CaBinary {
    /// Reads what the binary at `path` is: its flags (`--help`) and its version.
    pub fn probe(path: &Path) -> Result<CaBinary, String> {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let (_, help) = run_captured(path, &["--help".into()], Duration::from_secs(20))
            .map_err(|e| format!("cannot run {}: {e}", path.display()))?;
        let flags = help_flags(&help);

        let mut found: Option<(String, &'static str)> = None;
        if let Ok((Some(status), out)) =
            run_captured(path, &["--version".into()], Duration::from_secs(10))
        {
            if status.success() {
                if let Some(v) = version_in(&out) {
                    found = Some((v, "--version"));
                }
            }
        }
        let mut banner: Option<String> = None;
        if found.is_none() {
            banner = startup_banner(path, &flags);
            if let Some(v) = banner.as_deref().and_then(version_in) {
                found = Some((v, "startup log"));
            }
        }
        let (version, version_source) = match found {
            Some(f) => f,
            None => {
                let suffix = name
                    .trim_start_matches("cluster-autoscaler")
                    .trim_start_matches(['-', '_', '.'])
                    .trim_start_matches('v')
                    .to_string();
                if !suffix.is_empty() {
                    (version_in(&suffix).unwrap_or(suffix), "file name")
                } else {
                    (banner.unwrap_or_else(|| "unknown".into()), "startup log")
                }
            }
        };
        Ok(CaBinary {
            path: path.to_path_buf(),
            version,
            version_source,
            flags,
        })
    }

    /// `(major, minor, patch)` when the version is a release number.
    pub fn semver(&self) -> Option<(u64, u64, u64)> {
        semver(&self.version)
    }

    /// Whether this binary takes `--name` (from its `--help`; else from the table of
    /// flags read at the tags).
    pub fn knows(&self, name: &str) -> bool {
        if !self.flags.is_empty() {
            return self.flags.contains(name);
        }
        known_by_version(name, self.semver())
    }

    /// "cluster-autoscaler 1.36.1 (/dir/cluster-autoscaler-1.36.1)": how errors name it.
    pub fn label(&self) -> String {
        format!(
            "cluster-autoscaler {} ({})",
            self.version,
            self.path.display()
        )
    }
}

/// The binaries of `$E2E_CA_BINS`, oldest version first; `Err(why)` when the tier cannot
/// run (unset, empty, unreadable, or a binary that does not run at all).
pub fn binaries_from_env() -> Result<Vec<CaBinary>, String> {
    let dir = match std::env::var_os(ENV) {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => {
            return Err(format!(
                "{ENV} is not set (a directory of cluster-autoscaler binaries copied out of the official images)"
            ))
        }
    };
    binaries_in(&dir)
}

/// [`binaries_from_env`] for a given directory.
pub fn binaries_in(dir: &Path) -> Result<Vec<CaBinary>, String> {
    use std::os::unix::fs::PermissionsExt;
    let entries = fs::read_dir(dir).map_err(|e| format!("{ENV}={}: {e}", dir.display()))?;
    let mut paths = Vec::new();
    let mut not_executable = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| format!("{ENV}={}: {e}", dir.display()))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with("cluster-autoscaler") {
            continue;
        }
        let path = entry.path();
        // Follows symbolic links: a link to a binary elsewhere counts.
        match fs::metadata(&path) {
            Ok(m) if m.is_file() && m.permissions().mode() & 0o111 != 0 => paths.push(path),
            Ok(m) if m.is_file() => not_executable.push(name),
            _ => {}
        }
    }
    if paths.is_empty() {
        let also = if not_executable.is_empty() {
            String::new()
        } else {
            format!(" (not executable: {})", not_executable.join(", "))
        };
        return Err(format!(
            "{ENV}={}: no executable cluster-autoscaler* file{also}",
            dir.display()
        ));
    }
    let mut bins = paths
        .iter()
        .map(|p| CaBinary::probe(p))
        .collect::<Result<Vec<_>, _>>()?;
    bins.sort_by(|a, b| {
        let key = |c: &CaBinary| (c.semver().is_none(), c.semver(), c.version.clone());
        key(a).cmp(&key(b)).then_with(|| a.path.cmp(&b.path))
    });
    Ok(bins)
}

/// Flags read at the tags (`config/flags/flags.go`, `main.go`) for a binary whose `--help`
/// said nothing: everything the suite passes exists in 1.31.5 to master but these.
pub fn known_by_version(name: &str, v: Option<(u64, u64, u64)>) -> bool {
    // A version we cannot read is newer than every tag (a build from master).
    let at_least = |minor: u64| v.is_none_or(|(maj, min, _)| maj > 1 || min >= minor);
    match name {
        // 1.32.0 (kubernetes/autoscaler#7530); locked to true from 1.35.
        "enable-dynamic-resource-allocation" => at_least(32),
        // 1.35.0: per-group MaxNodeStartupTime.
        "max-node-startup-time" => at_least(35),
        // 1.36.0.
        "max-startup-time" => at_least(36),
        _ => true,
    }
}

/// A running cluster-autoscaler, killed when dropped (and with the test's thread).
pub struct RealCa {
    pub bin: CaBinary,
    /// The arguments it runs with (after dropping flags the version lacks).
    pub args: Vec<String>,
    /// Where its metrics are served (`--address`).
    pub metrics_addr: SocketAddr,
    pub log_path: PathBuf,
    pub cloud_config: PathBuf,
    dropped: Vec<String>,
    admin_kubeconfig: PathBuf,
    child: Option<Child>,
    /// When the current process was started, and where its log begins.
    started: Instant,
    log_offset: u64,
    starts: u32,
}

/// The flags every run gets, before the caller's (a caller's flag of the same name wins).
/// Fast test timings; `--v=5` logs every gRPC call CA makes ("Performing gRPC call X"),
/// its main loop ("Starting main loop", V(4)) and its scale-down decisions.
fn default_flags(
    cloud_config: &Path,
    kubeconfig: &Path,
    metrics: SocketAddr,
) -> Vec<(String, Option<String>)> {
    let f = |n: &str, v: &str| (n.to_string(), Some(v.to_string()));
    vec![
        f("cloud-provider", "externalgrpc"),
        f("cloud-config", &cloud_config.display().to_string()),
        f("kubeconfig", &kubeconfig.display().to_string()),
        f("namespace", "kube-system"),
        f("leader-elect", "false"),
        f("scan-interval", "2s"),
        f("scale-down-delay-after-add", "0s"),
        f("scale-down-unneeded-time", "5s"),
        f("scale-down-unready-time", "10s"),
        f("max-node-provision-time", "30s"),
        f("address", &metrics.to_string()),
        f("v", "5"),
    ]
}

/// `--name=value` / `--name` / `-v=5` into (name, value).
fn split_flag(s: &str) -> (String, Option<String>) {
    let body = s.trim_start_matches('-');
    match body.split_once('=') {
        Some((n, v)) => (n.to_string(), Some(v.to_string())),
        None => (body.to_string(), None),
    }
}

impl RealCa {
    /// Starts `bin` against the provider at `provider_addr`, as CA's ServiceAccount, with
    /// the default flags and then `flags` (`--name=value`; one of the same name replaces
    /// the default). Call it from the test's own thread (not `spawn_blocking`): the
    /// process dies when the thread that started it ends.
    pub fn start(
        bin: &CaBinary,
        cp: &ControlPlane,
        provider_addr: &ListenAddr,
        flags: &[String],
    ) -> anyhow::Result<RealCa> {
        Self::start_as(bin, cp, Who::Service, provider_addr, flags)
    }

    /// [`RealCa::start`] as `who` on the API server (the drain storm runs CA under a
    /// name of its own, so the audit log tells its requests from the service's).
    pub fn start_as(
        bin: &CaBinary,
        cp: &ControlPlane,
        who: Who,
        provider_addr: &ListenAddr,
        flags: &[String],
    ) -> anyhow::Result<RealCa> {
        let label = bin.label();
        let kubeconfig = cp
            .kubeconfig(who)
            .with_context(|| format!("{label}: the kubeconfig of {who:?}"))?;
        let admin_kubeconfig = cp
            .kubeconfig(Who::Admin)
            .with_context(|| format!("{label}: the admin kubeconfig"))?;
        let dir = kubeconfig
            .parent()
            .ok_or_else(|| anyhow!("{label}: the kubeconfig has no directory"))?
            .to_path_buf();
        let metrics_addr: SocketAddr = ([127, 0, 0, 1], free_port()).into();
        let stem = format!(
            "cluster-autoscaler-{}-{}",
            bin.version.replace(['/', ' '], "_"),
            metrics_addr.port()
        );
        let cloud_config = dir.join(format!("{stem}.cloud-config.yaml"));
        fs::write(
            &cloud_config,
            format!("address: \"{provider_addr}\"\ngrpc_timeout: 5s\n"),
        )
        .with_context(|| format!("{label}: write {}", cloud_config.display()))?;

        let mut merged = default_flags(&cloud_config, &kubeconfig, metrics_addr);
        for f in flags {
            let (name, value) = split_flag(f);
            match merged.iter_mut().find(|(n, _)| *n == name) {
                Some(slot) => slot.1 = value,
                None => merged.push((name, value)),
            }
        }
        let mut args = Vec::new();
        let mut dropped = Vec::new();
        for (name, value) in merged {
            let text = match value {
                Some(v) => format!("--{name}={v}"),
                None => format!("--{name}"),
            };
            if bin.knows(&name) {
                args.push(text);
            } else {
                dropped.push(text);
            }
        }
        if !dropped.is_empty() {
            eprintln!(
                "e2e: {label} does not know {}; not passed",
                dropped.join(" ")
            );
        }
        let mut ca = RealCa {
            bin: bin.clone(),
            args,
            metrics_addr,
            log_path: dir.join(format!("{stem}.log")),
            cloud_config,
            dropped,
            admin_kubeconfig,
            child: None,
            started: Instant::now(),
            log_offset: 0,
            starts: 0,
        };
        ca.spawn()?;
        Ok(ca)
    }

    fn spawn(&mut self) -> anyhow::Result<()> {
        let label = self.bin.label();
        self.starts += 1;
        let mut log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log_path)
            .with_context(|| format!("{label}: open {}", self.log_path.display()))?;
        writeln!(
            log,
            "=== e2e: start #{} of {label}: {}",
            self.starts,
            self.args.join(" ")
        )?;
        log.flush()?;
        self.log_offset = fs::metadata(&self.log_path).map(|m| m.len()).unwrap_or(0);
        self.started = Instant::now();
        let child = dies_with_the_test(Command::new(&self.bin.path))
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("{label}: start"))?;
        self.child = Some(child);
        Ok(())
    }

    pub fn label(&self) -> String {
        self.bin.label()
    }

    /// Flags the caller or the defaults named that this version does not know.
    pub fn dropped_flags(&self) -> &[String] {
        &self.dropped
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// Everything every process of this CA logged (restarts marked by `=== e2e:` lines).
    pub fn log(&self) -> String {
        fs::read(&self.log_path)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }

    /// What the current process logged since it started.
    pub fn current_log(&self) -> String {
        let Ok(mut f) = fs::File::open(&self.log_path) else {
            return String::new();
        };
        use std::io::Seek;
        let mut buf = Vec::new();
        if f.seek(std::io::SeekFrom::Start(self.log_offset)).is_err() {
            return String::new();
        }
        let _ = f.read_to_end(&mut buf);
        String::from_utf8_lossy(&buf).into_owned()
    }

    /// The lines (of every process) containing `needle`.
    pub fn log_lines_matching(&self, needle: &str) -> Vec<String> {
        self.log()
            .lines()
            .filter(|l| l.contains(needle))
            .map(str::to_string)
            .collect()
    }

    /// The last `n` lines, for a failure message.
    pub fn log_tail(&self, n: usize) -> String {
        let text = self.log();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// Lines where a call to the provider failed: CA logs `Error on gRPC call <RPC>: ...`
    /// for every error but Unimplemented (every version, `cloudprovider/externalgrpc`),
    /// and ends with `Could not create gRPC client` on a bad cloud-config.
    pub fn provider_errors(&self) -> Vec<String> {
        self.log()
            .lines()
            .filter(|l| {
                l.contains("Error on gRPC call") || l.contains("Could not create gRPC client")
            })
            .map(str::to_string)
            .collect()
    }

    /// Requests the API server refused CA (its RBAC): `... is forbidden: User ...`.
    pub fn forbidden(&self) -> Vec<String> {
        self.log_lines_matching("is forbidden")
    }

    /// How many times CA called `rpc` (`NodeGroups`, `Refresh`, `NodeGroupDeleteNodes`,
    /// ...), counted from its log (needs `--v=5`, the default here).
    pub fn rpc_calls(&self, rpc: &str) -> usize {
        let needle = "Performing gRPC call ";
        self.log()
            .lines()
            .filter_map(|l| l.split_once(needle).map(|(_, rest)| rest))
            .filter(|rest| rest.split_whitespace().next() == Some(rpc))
            .count()
    }

    /// Waits up to `secs` for `f`, failing with CA's log when CA dies or time runs out.
    pub async fn wait(&mut self, what: &str, secs: u64, mut f: impl FnMut(&RealCa) -> bool) {
        let end = Instant::now() + Duration::from_secs(secs);
        loop {
            if f(self) {
                return;
            }
            if let Err(e) = self.check_alive() {
                panic!("waiting for {what}: {e:#}");
            }
            if Instant::now() > end {
                panic!(
                    "{}",
                    self.failure(&format!("timed out after {secs} s waiting for {what}"))
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// CA's log has no provider error and no refusal of the API server (a failure shows
    /// them, with the log).
    pub fn assert_log_clean(&self) {
        let errors = self.provider_errors();
        assert!(
            errors.is_empty(),
            "{}",
            self.failure(&format!("provider calls failed:\n{}", errors.join("\n")))
        );
        let denied = self.forbidden();
        assert!(
            denied.is_empty(),
            "{}",
            self.failure(&format!(
                "the API server refused CA:\n{}",
                denied.join("\n")
            ))
        );
    }

    /// `Err` with the log's tail if the current process has exited.
    pub fn check_alive(&mut self) -> anyhow::Result<()> {
        let exited = match self.child.as_mut() {
            None => Some("was stopped".to_string()),
            Some(c) => match c.try_wait() {
                Ok(Some(status)) => Some(format!("exited ({status})")),
                Ok(None) => None,
                Err(e) => Some(format!("cannot be waited for: {e}")),
            },
        };
        match exited {
            Some(how) => bail!("{} {how}:\n{}", self.label(), self.log_tail(30)),
            None => Ok(()),
        }
    }

    /// Waits until the current process logs a line containing `needle`; returns it.
    /// Fails (naming the binary, with the log's tail) on timeout or when CA exits.
    pub async fn wait_log(&mut self, needle: &str, secs: u64) -> anyhow::Result<String> {
        let end = Instant::now() + Duration::from_secs(secs);
        loop {
            if let Some(l) = self.current_log().lines().find(|l| l.contains(needle)) {
                return Ok(l.to_string());
            }
            if let Err(e) = self.check_alive() {
                return Err(e.context(format!("while waiting for {needle:?} in its log")));
            }
            if Instant::now() > end {
                bail!(
                    "{}: no {needle:?} in its log after {secs} s:\n{}",
                    self.label(),
                    self.log_tail(30)
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits for the current process's first loop (`Starting main loop`); returns the
    /// time from its start. CA >= 1.35 never gets there without list/watch on
    /// resource.k8s.io: the error then names what the API server refused it.
    pub async fn first_loop(&mut self, secs: u64) -> anyhow::Result<Duration> {
        let end = Instant::now() + Duration::from_secs(secs);
        loop {
            if self
                .current_log()
                .lines()
                .any(|l| l.contains("Starting main loop"))
            {
                return Ok(self.started.elapsed());
            }
            self.check_alive()
                .map_err(|e| e.context("before its first loop"))?;
            // A CA the API server refuses its caches never starts: no need to wait the
            // whole time once it has been refused for a while.
            let refused_for_long = self.started.elapsed() > Duration::from_secs(REFUSED_SECS)
                && !self.forbidden().is_empty();
            if Instant::now() > end || refused_for_long {
                let refused = self.refused();
                let why = if refused.is_empty() {
                    String::new()
                } else {
                    format!(
                        "; the API server refused it: {}",
                        refused.into_iter().collect::<Vec<_>>().join(", ")
                    )
                };
                bail!(
                    "{}: no first loop (\"Starting main loop\") {:.0} s after its start{why}\n--- its log:\n{}",
                    self.label(),
                    self.started.elapsed().as_secs_f64(),
                    self.log_tail(15)
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// What the API server refused CA, as `verb resource.group` (`list
    /// deviceclasses.resource.k8s.io`), from its `... cannot <verb> resource "<r>" in API
    /// group "<g>"` lines.
    pub fn refused(&self) -> BTreeSet<String> {
        refused_in(&self.forbidden())
    }

    /// Time since the current process started.
    pub fn uptime(&self) -> Duration {
        self.started.elapsed()
    }

    /// CA's Prometheus metrics (`GET /metrics` on `--address`).
    pub fn metrics(&self) -> anyhow::Result<String> {
        http_get(self.metrics_addr, "/metrics")
            .with_context(|| format!("{}: GET /metrics", self.label()))
    }

    /// The first sample of `name` carrying every `labels` pair (others may be there too);
    /// `None` when CA does not answer or has no such sample.
    pub fn metric(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let text = self.metrics().ok()?;
        samples(&text, name, labels).into_iter().next()
    }

    /// The sum of every sample of `name` carrying every `labels` pair (0 when none).
    pub fn metric_sum(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let text = self.metrics().ok()?;
        Some(samples(&text, name, labels).into_iter().sum())
    }

    fn flag_value(&self, name: &str) -> Option<String> {
        self.args.iter().rev().find_map(|a| {
            let (n, v) = split_flag(a);
            (n == name).then_some(v).flatten()
        })
    }

    /// CA's status ConfigMap (`--status-config-map-name` in `--namespace`), read as
    /// admin: its data, or `None` while CA has not written it.
    pub async fn status_configmap(&self) -> anyhow::Result<Option<BTreeMap<String, String>>> {
        use k8s_openapi::api::core::v1::ConfigMap;
        let ns = self
            .flag_value("namespace")
            .unwrap_or_else(|| "kube-system".into());
        let name = self
            .flag_value("status-config-map-name")
            .unwrap_or_else(|| "cluster-autoscaler-status".into());
        let kc = kube::config::Kubeconfig::read_from(&self.admin_kubeconfig)?;
        let cfg =
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await?;
        let client = kube::Client::try_from(cfg)?;
        let cms: kube::Api<ConfigMap> = kube::Api::namespaced(client, &ns);
        let cm = cms
            .get_opt(&name)
            .await
            .with_context(|| format!("{}: read ConfigMap {ns}/{name}", self.label()))?;
        Ok(cm.map(|c| c.data.unwrap_or_default()))
    }

    /// The human-readable status CA writes (the ConfigMap's `status` key), or "".
    pub async fn status_text(&self) -> anyhow::Result<String> {
        Ok(self
            .status_configmap()
            .await?
            .and_then(|mut d| d.remove("status"))
            .unwrap_or_default())
    }

    fn signal(&mut self, sig: libc::c_int) {
        if let Some(c) = self.child.as_ref() {
            // SAFETY: kill(2) on our own child's pid; no memory involved.
            unsafe {
                libc::kill(c.id() as libc::pid_t, sig);
            }
        }
    }

    /// SIGKILL, as a node's death or an OOM leaves it: no cleanup of its taints.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM, as the kubelet stops the pod (CA cleans up its taints and, while it may,
    /// its status ConfigMap); SIGKILL after 10 s. Returns how it ended.
    pub fn stop(&mut self) -> Option<ExitStatus> {
        self.signal(libc::SIGTERM);
        let mut c = self.child.take()?;
        let end = Instant::now() + Duration::from_secs(10);
        while Instant::now() < end {
            if let Ok(Some(status)) = c.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = c.kill();
        c.wait().ok()
    }

    /// kill -9, then the same binary with the same arguments (same metrics port, same
    /// log file, after an `=== e2e: start #N` line).
    pub fn restart(&mut self) -> anyhow::Result<()> {
        self.kill();
        self.spawn()
    }

    /// The error for a failed check, naming the binary and carrying the log's tail.
    pub fn failure(&self, what: &str) -> anyhow::Error {
        anyhow!(
            "{}: {what}\n--- its log:\n{}",
            self.label(),
            self.log_tail(40)
        )
    }
}

impl Drop for RealCa {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Applies multi-document YAML as admin (server-side apply, so it may run twice): every
/// kind the API server knows, namespaced objects without a namespace going to `default_ns`.
pub async fn apply_yaml(admin: &kube::Client, text: &str, default_ns: &str) -> anyhow::Result<()> {
    use kube::api::{Api, DynamicObject, GroupVersionKind, Patch, PatchParams};
    use kube::discovery::Scope;
    for doc in text.split("\n---") {
        let v: serde_json::Value =
            serde_saphyr::from_str(doc).map_err(|e| anyhow!("a YAML document: {e}"))?;
        if v.is_null() {
            continue;
        }
        let api_version = v["apiVersion"].as_str().unwrap_or_default().to_string();
        let kind = v["kind"].as_str().unwrap_or_default().to_string();
        let name = v["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let (group, version) = api_version
            .split_once('/')
            .map(|(g, v)| (g.to_string(), v.to_string()))
            .unwrap_or((String::new(), api_version.clone()));
        let gvk = GroupVersionKind::gvk(&group, &version, &kind);
        let (ar, caps) = kube::discovery::pinned_kind(admin, &gvk)
            .await
            .with_context(|| format!("discover {api_version} {kind}"))?;
        let obj: DynamicObject = serde_json::from_value(v.clone())?;
        let api: Api<DynamicObject> = match caps.scope {
            Scope::Cluster => Api::all_with(admin.clone(), &ar),
            Scope::Namespaced => {
                let ns = v["metadata"]["namespace"].as_str().unwrap_or(default_ns);
                Api::namespaced_with(admin.clone(), ns, &ar)
            }
        };
        api.patch(
            &name,
            &PatchParams::apply("e2e").force(),
            &Patch::Apply(&obj),
        )
        .await
        .with_context(|| format!("apply {kind} {name}"))?;
    }
    Ok(())
}

/// CA's own RBAC exactly as the project ships it: `kubectl kustomize
/// deploy/cluster-autoscaler` (without kubectl: its one resource, in kube-system, which is
/// all that kustomization does).
pub fn shipped_ca_rbac() -> anyhow::Result<String> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/cluster-autoscaler");
    match Command::new("kubectl")
        .arg("kustomize")
        .arg(&dir)
        .stdin(Stdio::null())
        .output()
    {
        Ok(out) if out.status.success() => Ok(String::from_utf8(out.stdout)?),
        Ok(out) => bail!(
            "kubectl kustomize {}: {}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr)
        ),
        Err(_) => Ok(fs::read_to_string(dir.join("rbac.yaml"))?),
    }
}

/// Applies what a cluster running CA beside the service has: CA's RBAC
/// ([`shipped_ca_rbac`]) and the service's (`deploy/base/rbac.yaml`), both bound to
/// `system:serviceaccount:kube-system:cluster-autoscaler`.
pub async fn apply_shipped_rbac_for_ca(admin: &kube::Client) -> anyhow::Result<()> {
    apply_yaml(admin, &shipped_ca_rbac()?, "kube-system").await?;
    let base = fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/deploy/base/rbac.yaml"
    ))?;
    apply_yaml(admin, &base, "kube-system").await
}

// ---- helpers ----

/// Runs `path args`, output (both streams) to a temporary file, for at most `limit`
/// (then killed: `None`).
fn run_captured(
    path: &Path,
    args: &[String],
    limit: Duration,
) -> std::io::Result<(Option<ExitStatus>, String)> {
    let out = tempfile::NamedTempFile::new()?;
    let mut child = dies_with_the_test(Command::new(path))
        .args(args)
        .stdin(Stdio::null())
        .stdout(out.reopen()?)
        .stderr(out.reopen()?)
        .spawn()?;
    let end = Instant::now() + limit;
    let status = loop {
        if let Some(s) = child.try_wait()? {
            break Some(s);
        }
        if Instant::now() > end {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let text = String::from_utf8_lossy(&fs::read(out.path())?).into_owned();
    Ok((status, text))
}

/// The long flag names a pflag `--help` lists (`      --scan-interval duration  ...`,
/// `  -v, --v Level  ...`).
fn help_flags(help: &str) -> BTreeSet<String> {
    help.lines()
        .filter_map(|l| {
            let t = l.trim_start();
            let t = match t.strip_prefix('-') {
                Some(rest) if !rest.starts_with('-') => rest.split_once(", ")?.1,
                _ => t,
            };
            let name: String = t
                .strip_prefix("--")?
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_' || *c == '.')
                .collect();
            (!name.is_empty()).then_some(name)
        })
        .collect()
}

/// The line CA logs at V(1) before it touches anything: `Cluster Autoscaler 1.36.1`.
/// Read from a start bound to fail at once (no kubeconfig, no cloud-config).
fn startup_banner(path: &Path, flags: &BTreeSet<String>) -> Option<String> {
    let missing = std::env::temp_dir().join(format!("e2e-no-such-file-{}", std::process::id()));
    let all = [
        "--v=1".to_string(),
        "--cloud-provider=externalgrpc".to_string(),
        format!("--cloud-config={}", missing.display()),
        format!("--kubeconfig={}", missing.display()),
        "--leader-elect=false".to_string(),
        "--address=127.0.0.1:0".to_string(),
    ];
    let args: Vec<String> = all
        .into_iter()
        .filter(|a| {
            let (n, _) = split_flag(a);
            flags.is_empty() || flags.contains(&n)
        })
        .collect();
    let (_, out) = run_captured(path, &args, Duration::from_secs(10)).ok()?;
    out.lines().find_map(|l| {
        let (_, rest) = l.split_once("Cluster Autoscaler ")?;
        rest.split_whitespace().next().map(str::to_string)
    })
}

/// `verb resource.group` for each `... cannot <verb> resource "<r>" in API group "<g>"`
/// (quotes escaped or not, as klog's structured and plain lines have them).
fn refused_in(lines: &[String]) -> BTreeSet<String> {
    lines
        .iter()
        .filter_map(|l| {
            let (_, rest) = l.split_once("cannot ")?;
            let verb = rest.split_whitespace().next()?;
            let quoted: Vec<&str> = rest.split('"').skip(1).step_by(2).collect();
            let resource = quoted.first()?.trim_end_matches('\\');
            let group = quoted.get(1).map_or("", |g| g.trim_end_matches('\\'));
            Some(if group.is_empty() {
                format!("{verb} {resource}")
            } else {
                format!("{verb} {resource}.{group}")
            })
        })
        .collect()
}

/// The first `X.Y` or `X.Y.Z` in `s` (a leading `v` dropped), e.g. "1.36.1".
fn version_in(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i].is_ascii_digit()
            && (i == 0 || !b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'v')
        {
            let start = i;
            let mut parts = 0;
            loop {
                let digits = b[i..].iter().take_while(|c| c.is_ascii_digit()).count();
                if digits == 0 {
                    break;
                }
                i += digits;
                parts += 1;
                if parts < 3 && i + 1 < b.len() && b[i] == b'.' && b[i + 1].is_ascii_digit() {
                    i += 1;
                } else {
                    break;
                }
            }
            if parts >= 2 {
                return Some(s[start..i].to_string());
            }
        }
        i += 1;
    }
    None
}

fn semver(v: &str) -> Option<(u64, u64, u64)> {
    let v = version_in(v)?;
    let mut it = v.split('.').map(|p| p.parse::<u64>().ok());
    Some((it.next()??, it.next()??, it.next().flatten().unwrap_or(0)))
}

/// A plain HTTP/1.0 GET on loopback (no chunking; the server closes), 5 s at most.
fn http_get(addr: SocketAddr, path: &str) -> anyhow::Result<String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    s.set_write_timeout(Some(Duration::from_secs(5)))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| anyhow!("no HTTP response from {addr}"))?;
    let status = head.lines().next().unwrap_or_default();
    if status.split_whitespace().nth(1) != Some("200") {
        bail!("{addr}{path}: {status}");
    }
    Ok(body.to_string())
}

/// Samples of `name` in Prometheus text format carrying every `want` label pair.
pub fn samples(text: &str, name: &str, want: &[(&str, &str)]) -> Vec<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let rest = l.strip_prefix(name)?;
            let (labels, value) = if let Some(r) = rest.strip_prefix('{') {
                let close = label_block_end(r)?;
                (parse_labels(&r[..close]), r[close + 1..].trim())
            } else if rest.starts_with([' ', '\t']) {
                (Vec::new(), rest.trim())
            } else {
                return None; // another metric whose name starts with `name`
            };
            let have = |k: &str, v: &str| labels.iter().any(|(lk, lv)| lk == k && lv == v);
            if !want.iter().all(|(k, v)| have(k, v)) {
                return None;
            }
            value.split_whitespace().next()?.parse::<f64>().ok()
        })
        .collect()
}

/// Where the `{...}` block ends (the `}` outside quotes).
fn label_block_end(s: &str) -> Option<usize> {
    let mut quoted = false;
    let mut escaped = false;
    for (i, c) in s.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            '}' if !quoted => return Some(i),
            _ => {}
        }
    }
    None
}

fn parse_labels(s: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = s;
    while let Some((k, after)) = rest.split_once('=') {
        let k = k.trim().trim_start_matches(',').trim().to_string();
        let Some(after) = after.trim_start().strip_prefix('"') else {
            break;
        };
        let mut v = String::new();
        let mut chars = after.char_indices();
        let mut end = after.len();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some((_, 'n')) => v.push('\n'),
                    Some((_, o)) => v.push(o),
                    None => {}
                },
                '"' => {
                    end = i + 1;
                    break;
                }
                o => v.push(o),
            }
        }
        out.push((k, v));
        rest = &after[end.min(after.len())..];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_are_named() {
        let lines = vec![
            r#"E1125 08:34:02.320680   31542 reflector.go:227] "Failed to watch" err="failed to list *v1.ResourceSlice: resourceslices.resource.k8s.io is forbidden: User \"system:serviceaccount:kube-system:cluster-autoscaler\" cannot list resource \"resourceslices\" in API group \"resource.k8s.io\" at the cluster scope" logger="UnhandledError""#.to_string(),
            r#"E1 x.go:1] configmaps "s" is forbidden: User "u" cannot get resource "configmaps" in API group "" in the namespace "kube-system""#.to_string(),
        ];
        let r: Vec<String> = refused_in(&lines).into_iter().collect();
        assert_eq!(
            r,
            vec!["get configmaps", "list resourceslices.resource.k8s.io"]
        );
    }

    #[test]
    fn versions_are_read_from_any_text() {
        assert_eq!(
            version_in("Cluster Autoscaler 1.36.1").as_deref(),
            Some("1.36.1")
        );
        assert_eq!(version_in("v1.34.5-gke.1").as_deref(), Some("1.34.5"));
        assert_eq!(version_in("1.35").as_deref(), Some("1.35"));
        assert_eq!(version_in("dev"), None);
        assert_eq!(version_in("master"), None);
        assert_eq!(semver("1.31.5"), Some((1, 31, 5)));
        assert_eq!(semver("master"), None);
    }

    #[test]
    fn help_lists_long_flags() {
        let help = "Usage of cluster-autoscaler:\n      --address string    The address\n  -v, --v Level    number for the log level\n      --scan-interval duration   How often\n";
        let f = help_flags(help);
        assert!(f.contains("address") && f.contains("v") && f.contains("scan-interval"));
        assert_eq!(f.len(), 3, "{f:?}");
    }

    #[test]
    fn metrics_samples_match_labels() {
        let text = "# HELP x\ncluster_autoscaler_last_activity{activity=\"main\"} 1.7e+09\ncluster_autoscaler_last_activity{activity=\"scaleDown\"} 5\ncluster_autoscaler_nodes_count{state=\"ready\"} 3\ncluster_autoscaler_nodes_count_x 9\ncluster_autoscaler_errors_total{type=\"a\\\"b}\"} 2\n";
        assert_eq!(
            samples(
                text,
                "cluster_autoscaler_last_activity",
                &[("activity", "scaleDown")]
            ),
            vec![5.0]
        );
        assert_eq!(
            samples(text, "cluster_autoscaler_nodes_count", &[]),
            vec![3.0]
        );
        assert_eq!(
            samples(
                text,
                "cluster_autoscaler_errors_total",
                &[("type", "a\"b}")]
            ),
            vec![2.0]
        );
    }
}

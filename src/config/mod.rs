//! Typed configuration: a YAML file, overridden by flags. Unknown keys and bad values
//! are errors that name the key, the value and the file; validation reports every
//! problem at once.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::cloud::aws::AwsSettings;
use crate::cloud::{GroupSelector, TagFilter};
use crate::duration::parse_duration;
use crate::interruption::{InterruptionSettings, RebalanceAction};
use crate::provider::template::TemplateOverrides;
use crate::provider::{Bounds, ProviderSettings};
use crate::scalein::{decide::plan, DaemonSetPolicy, DeadlinePolicy, ModeChoice, ScaleInSettings};

mod args;
pub mod listen;
pub use args::ConfigArgs;
pub use listen::ListenAddr;

pub const DEFAULT_LISTEN: &str = "127.0.0.1:8086";
pub const DEFAULT_METRICS_LISTEN: &str = "0.0.0.0:8087";

/// The YAML file, as written.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct FileConfig {
    /// gRPC listen address.
    pub listen: Option<String>,
    /// Address of /metrics, /healthz and /readyz.
    pub metrics_listen: Option<String>,
    /// mTLS for the gRPC port (CA's cloud-config `cert`/`key`/`cacert` on the other side).
    pub tls: Option<TlsFile>,
    /// Allow a non-loopback listen address without TLS.
    pub insecure: Option<bool>,
    #[serde(default)]
    pub aws: AwsConfig,
    /// How often Refresh re-reads the ASGs, e.g. `60s`.
    pub refresh_interval: Option<String>,
    /// How long the Refresh RPC waits for AWS before answering from the last state.
    pub refresh_wait: Option<String>,
    /// CA's per-call timeout (its cloud-config `grpc_timeout`, 5 s unless set): every
    /// answer that may wait (Refresh) must come before it.
    pub ca_call_timeout: Option<String>,
    /// Static groups, like CA's `--nodes=min:max:name`.
    #[serde(default)]
    pub node_groups: Vec<StaticGroup>,
    /// Tag auto-discovery, like CA's `--node-group-auto-discovery=asg:tag=...`.
    #[serde(default)]
    pub auto_discovery: Vec<Discovery>,
    /// Template settings for scale-from-zero, by group name or `*`.
    #[serde(default)]
    pub templates: BTreeMap<String, TemplateOverrides>,
    /// Launch failures older than this do not mark placeholders, e.g. `15m`.
    pub launch_failure_window: Option<String>,
    /// NodeGroupGetOptions for option-tagged groups asked by CA >= 1.35, which has
    /// no MaxNodeStartupTime on the wire: `unimplemented` (default, CA keeps its own
    /// defaults) or `answer` (the tags apply, MaxNodeStartupTime reads as 0).
    pub options_without_startup_time: Option<crate::provider::options::OptionsWithoutStartupTime>,
    /// The drain that runs before an instance ends.
    #[serde(default)]
    pub scale_in: ScaleInFile,
    /// Queue mode: EC2 interruption notices and lifecycle actions from SQS.
    #[serde(default)]
    pub interruption: InterruptionFile,
}

/// `interruption:` as written.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct InterruptionFile {
    /// The SQS queue URL; unset: queue mode off.
    pub queue_url: Option<String>,
    /// `cordon` (default) or `drain`.
    pub rebalance: Option<RebalanceAction>,
    /// Also act on instances of groups this service does not manage.
    pub unmanaged_instances: Option<bool>,
    pub batch_size: Option<i32>,
    pub concurrency: Option<usize>,
    pub wait_time: Option<String>,
    pub daemon_set_share: Option<String>,
    pub max_receives: Option<u32>,
    pub safety_net_poll_interval: Option<String>,
}

/// `scaleIn:` as written. Durations are Go-style strings.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ScaleInFile {
    /// `false`: DeleteNodes terminates at once, no drain (default `true`).
    pub enabled: Option<bool>,
    pub mode: Option<ModeChoice>,
    pub create_lifecycle_hook: Option<bool>,
    pub hook_name: Option<String>,
    pub hook_heartbeat_timeout: Option<String>,
    pub daemon_sets: Option<DaemonSetPolicy>,
    pub workload_deadline: Option<String>,
    pub workload_deadline_policy: Option<DeadlinePolicy>,
    pub daemon_set_deadline: Option<String>,
    pub daemon_set_deadline_policy: Option<DeadlinePolicy>,
    pub volume_detach_deadline: Option<String>,
    pub eviction_retry_interval: Option<String>,
    pub max_concurrent_drains: Option<usize>,
    pub api_qps: Option<f64>,
    pub api_burst: Option<u32>,
    pub lifecycle_poll_interval: Option<String>,
    /// Run the drain loop only on the replica holding a Lease (default `true`).
    pub leader_election: Option<bool>,
    pub lease_name: Option<String>,
    /// Default: POD_NAMESPACE, then kube-system.
    pub lease_namespace: Option<String>,
    pub lease_duration: Option<String>,
    /// Pod label selectors (`key=value[,key=value]`) of DaemonSets that must outlive
    /// the volume detach, besides those of a critical priority class.
    pub node_critical_daemon_sets: Option<Vec<String>>,
    /// From this many drains at once, one watch of every pod serves them all
    /// (default 10; 0: never).
    pub shared_pod_watch_from: Option<usize>,
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TlsFile {
    /// Server certificate (PEM).
    pub cert: PathBuf,
    /// Server private key (PEM).
    pub key: PathBuf,
    /// CA that client certificates must chain to (PEM). Clients without one are refused.
    #[serde(rename = "clientCA")]
    pub client_ca: PathBuf,
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct AwsConfig {
    pub region: Option<String>,
    /// Endpoint override (moto, LocalStack, VPC endpoints).
    pub endpoint: Option<String>,
    /// SDK attempts per call, including the first (default 3).
    pub max_attempts: Option<u32>,
}

#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct StaticGroup {
    pub name: String,
    pub min_size: Option<i32>,
    pub max_size: Option<i32>,
}

#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Discovery {
    /// Terms `key` or `key=value`; an ASG must carry all of them.
    pub tags: Vec<String>,
}

/// Flags that override the file (`serve` and `check-config`).
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    pub listen: Option<String>,
    pub metrics_listen: Option<String>,
    pub region: Option<String>,
    pub aws_endpoint: Option<String>,
    /// CA syntax `min:max:name`, repeatable.
    pub nodes: Vec<String>,
    /// CA syntax `asg:tag=key[=value],key2`, repeatable.
    pub auto_discovery: Vec<String>,
    pub refresh_interval: Option<String>,
    pub insecure: bool,
}

/// The validated configuration the program runs with.
#[derive(Debug, Clone)]
pub struct Config {
    pub source: String,
    pub listen: ListenAddr,
    pub metrics_listen: SocketAddr,
    pub tls: Option<TlsFile>,
    pub region: String,
    pub aws_endpoint: Option<String>,
    pub aws_max_attempts: u32,
    pub provider: ProviderSettings,
    /// Whether DeleteNodes drains (true) or terminates at once.
    pub drain_enabled: bool,
    pub scale_in: ScaleInSettings,
    pub interruption: InterruptionSettings,
}

/// One thing wrong, with where it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub key: String,
    pub message: String,
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.key, self.message)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("config file {path}: {message}")]
    Read { path: String, message: String },
    #[error("config file {path}: {message}")]
    Parse { path: String, message: String },
    #[error("{source_name}: {} problem(s):\n{}", problems.len(), problems.iter().map(|p| format!("  - {p}")).collect::<Vec<_>>().join("\n"))]
    Invalid {
        source_name: String,
        problems: Vec<Problem>,
    },
}

impl FileConfig {
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Read {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        Self::parse(&text, &path.display().to_string())
    }

    pub fn parse(text: &str, path: &str) -> Result<Self, ConfigError> {
        if text.trim().is_empty() {
            return Ok(Self::default());
        }
        serde_saphyr::from_str(text).map_err(|e| ConfigError::Parse {
            path: path.to_string(),
            message: e.to_string(),
        })
    }
}

/// Reads the file (if any), applies the flags, validates everything.
pub fn load(path: Option<&PathBuf>, flags: &Overrides) -> Result<Config, ConfigError> {
    let file = match path {
        Some(p) => FileConfig::load(p)?,
        None => FileConfig::default(),
    };
    let source = path
        .map(|p| format!("config file {}", p.display()))
        .unwrap_or_else(|| "flags".to_string());
    resolve(file, flags, &source)
}

/// File + flags -> Config, collecting every problem.
pub fn resolve(file: FileConfig, flags: &Overrides, source: &str) -> Result<Config, ConfigError> {
    let mut problems = Vec::new();
    let mut bad = |key: &str, message: String| {
        problems.push(Problem {
            key: key.to_string(),
            message,
        })
    };

    let listen_s = flags
        .listen
        .clone()
        .or(file.listen.clone())
        .unwrap_or_else(|| DEFAULT_LISTEN.to_string());
    let listen = match ListenAddr::parse(&listen_s) {
        Ok(a) => a,
        Err(e) => {
            bad("listen", e);
            ListenAddr::parse(DEFAULT_LISTEN).expect("default listen address parses")
        }
    };

    let metrics_s = flags
        .metrics_listen
        .clone()
        .or_else(|| file.metrics_listen.clone())
        .unwrap_or_else(|| DEFAULT_METRICS_LISTEN.to_string());
    let metrics_listen = match metrics_s.parse::<SocketAddr>() {
        Ok(a) => a,
        Err(_) => {
            bad(
                "metricsListen",
                format!("{metrics_s:?} is not an address like 0.0.0.0:8087"),
            );
            DEFAULT_METRICS_LISTEN
                .parse()
                .expect("default metrics address parses")
        }
    };

    let insecure = flags.insecure || file.insecure.unwrap_or(false);
    if let (Some(_), ListenAddr::Unix(_)) = (&file.tls, &listen) {
        bad(
            "tls",
            format!("{listen} is a Unix socket, guarded by its file's owner and mode (0660): tls applies to a TCP listen address only; remove tls or listen on TCP"),
        );
    } else if let Some(t) = &file.tls {
        for (k, p) in [
            ("tls.cert", &t.cert),
            ("tls.key", &t.key),
            ("tls.clientCA", &t.client_ca),
        ] {
            if !p.is_file() {
                bad(k, format!("{} is not a readable file", p.display()));
            }
        }
    } else if listen.is_exposed() && !insecure {
        bad(
            "listen",
            format!("{listen} is not a loopback address and no tls is configured: refusing to expose the CloudProvider API in clear text (set tls, or --insecure to accept the risk)"),
        );
    }

    let region = flags
        .region
        .clone()
        .or(file.aws.region.clone())
        .or_else(|| std::env::var("AWS_REGION").ok())
        .or_else(|| std::env::var("AWS_DEFAULT_REGION").ok())
        .filter(|r| !r.trim().is_empty())
        // Empty: not given here; the AWS SDK's chain (profile, instance metadata) is
        // asked when AWS is reached, and the commands refuse to start without one
        // (cloud::aws::resolve_region). Never guessed.
        .unwrap_or_default();
    let aws_endpoint = flags.aws_endpoint.clone().or(file.aws.endpoint.clone());
    if let Some(e) = &aws_endpoint {
        if !(e.starts_with("http://") || e.starts_with("https://")) {
            bad(
                "aws.endpoint",
                format!("{e:?} must start with http:// or https://"),
            );
        }
    }
    let aws_max_attempts = file.aws.max_attempts.unwrap_or(3);
    if aws_max_attempts == 0 || aws_max_attempts > 20 {
        bad(
            "aws.maxAttempts",
            format!("{aws_max_attempts} must be between 1 and 20"),
        );
    }

    let mut duration = |key: &str,
                        flag: Option<&String>,
                        file_v: Option<&String>,
                        default: Duration,
                        min: Duration| {
        bounded_duration(&mut bad, key, flag.or(file_v), default, min, None)
    };
    let refresh_interval = duration(
        "refreshInterval",
        flags.refresh_interval.as_ref(),
        file.refresh_interval.as_ref(),
        Duration::from_secs(60),
        Duration::from_secs(1),
    );
    let refresh_wait = duration(
        "refreshWait",
        None,
        file.refresh_wait.as_ref(),
        Duration::from_secs(4),
        Duration::from_millis(100),
    );
    let ca_call_timeout = duration(
        "caCallTimeout",
        None,
        file.ca_call_timeout.as_ref(),
        Duration::from_secs(5),
        Duration::from_millis(500),
    );
    let launch_failure_window = duration(
        "launchFailureWindow",
        None,
        file.launch_failure_window.as_ref(),
        Duration::from_secs(15 * 60),
        Duration::from_secs(10),
    );

    let si = &file.scale_in;
    let d = ScaleInSettings::default();
    let second = Duration::from_secs(1);
    let mut scale_in = ScaleInSettings {
        dry_run: false,
        mode: si.mode.unwrap_or(d.mode),
        create_hook: si.create_lifecycle_hook.unwrap_or(d.create_hook),
        hook_name: si.hook_name.clone().unwrap_or(d.hook_name.clone()),
        hook_heartbeat_timeout: duration(
            "scaleIn.hookHeartbeatTimeout",
            None,
            si.hook_heartbeat_timeout.as_ref(),
            d.hook_heartbeat_timeout,
            Duration::from_secs(30),
        ),
        daemonsets: si.daemon_sets.unwrap_or(d.daemonsets),
        workload_deadline: duration(
            "scaleIn.workloadDeadline",
            None,
            si.workload_deadline.as_ref(),
            d.workload_deadline,
            second,
        ),
        workload_deadline_policy: si
            .workload_deadline_policy
            .unwrap_or(d.workload_deadline_policy),
        daemonset_deadline: duration(
            "scaleIn.daemonSetDeadline",
            None,
            si.daemon_set_deadline.as_ref(),
            d.daemonset_deadline,
            second,
        ),
        daemonset_deadline_policy: si
            .daemon_set_deadline_policy
            .unwrap_or(d.daemonset_deadline_policy),
        volume_deadline: duration(
            "scaleIn.volumeDetachDeadline",
            None,
            si.volume_detach_deadline.as_ref(),
            d.volume_deadline,
            Duration::ZERO,
        ),
        eviction_retry: duration(
            "scaleIn.evictionRetryInterval",
            None,
            si.eviction_retry_interval.as_ref(),
            d.eviction_retry,
            Duration::from_millis(100),
        ),
        max_concurrent_drains: si.max_concurrent_drains.unwrap_or(d.max_concurrent_drains),
        api_qps: si.api_qps.unwrap_or(d.api_qps),
        api_burst: si.api_burst.unwrap_or(d.api_burst),
        lifecycle_poll_interval: duration(
            "scaleIn.lifecyclePollInterval",
            None,
            si.lifecycle_poll_interval.as_ref(),
            d.lifecycle_poll_interval,
            second,
        ),
        leader_election: si.leader_election.unwrap_or(true),
        lease_name: si.lease_name.clone().unwrap_or(d.lease_name.clone()),
        lease_namespace: si.lease_namespace.clone(),
        lease_duration: duration(
            "scaleIn.leaseDuration",
            None,
            si.lease_duration.as_ref(),
            d.lease_duration,
            Duration::from_secs(2),
        ),
        stuck_after: d.stuck_after,
        node_critical: d.node_critical.clone(),
        budget_watch: d.budget_watch,
        shared_pod_watch_from: si.shared_pod_watch_from.unwrap_or(d.shared_pod_watch_from),
        warm_pool_settle: d.warm_pool_settle,
    };
    match plan::NodeCritical::parse(si.node_critical_daemon_sets.as_deref().unwrap_or_default()) {
        Ok(nc) => scale_in.node_critical = nc,
        Err(why) => bad("scaleIn.nodeCriticalDaemonSets", why),
    }
    if refresh_wait >= ca_call_timeout {
        bad(
            "refreshWait",
            format!(
                "{refresh_wait:?} must be shorter than caCallTimeout {ca_call_timeout:?} (CA's grpc_timeout): CA would give up on Refresh and fail its loop"
            ),
        );
    }
    if scale_in.max_concurrent_drains == 0 || scale_in.max_concurrent_drains > 10_000 {
        bad(
            "scaleIn.maxConcurrentDrains",
            format!(
                "{} must be between 1 and 10000",
                scale_in.max_concurrent_drains
            ),
        );
        scale_in.max_concurrent_drains = d.max_concurrent_drains;
    }
    if scale_in.shared_pod_watch_from > 10_000 {
        bad(
            "scaleIn.sharedPodWatchFrom",
            format!(
                "{} must be between 0 (never) and 10000",
                scale_in.shared_pod_watch_from
            ),
        );
        scale_in.shared_pod_watch_from = d.shared_pod_watch_from;
    }
    if !(scale_in.api_qps.is_finite() && scale_in.api_qps > 0.0) {
        bad(
            "scaleIn.apiQps",
            format!("{} must be a positive number", scale_in.api_qps),
        );
    }
    if scale_in.api_burst == 0 {
        bad("scaleIn.apiBurst", "0 must be at least 1".into());
    }
    if scale_in.lease_name.trim().is_empty() || scale_in.lease_name.len() > 253 {
        bad(
            "scaleIn.leaseName",
            format!("{:?} must be 1 to 253 characters", scale_in.lease_name),
        );
    }
    if scale_in.hook_name.trim().is_empty() || scale_in.hook_name.len() > 255 {
        bad(
            "scaleIn.hookName",
            format!("{:?} must be 1 to 255 characters", scale_in.hook_name),
        );
    }

    let mut selector = GroupSelector::default();
    let mut static_bounds = HashMap::new();
    let mut groups: Vec<(String, StaticGroup)> = file
        .node_groups
        .iter()
        .enumerate()
        .map(|(i, g)| (format!("nodeGroups[{i}]"), g.clone()))
        .collect();
    for (i, spec) in flags.nodes.iter().enumerate() {
        match parse_nodes_flag(spec) {
            Ok(g) => groups.push((format!("--nodes[{i}]"), g)),
            Err(m) => bad(&format!("--nodes[{i}]"), m),
        }
    }
    for (key, g) in &groups {
        if g.name.trim().is_empty() {
            bad(&format!("{key}.name"), "must not be empty".into());
            continue;
        }
        if let (Some(min), Some(max)) = (g.min_size, g.max_size) {
            if min > max {
                bad(
                    key,
                    format!(
                        "minSize {min} is greater than maxSize {max} for group {}",
                        g.name
                    ),
                );
            }
        }
        for (field, v) in [("minSize", g.min_size), ("maxSize", g.max_size)] {
            if let Some(v) = v.filter(|v| *v < 0) {
                bad(
                    &format!("{key}.{field}"),
                    format!("{v} must not be negative"),
                );
            }
        }
        if static_bounds
            .insert(
                g.name.clone(),
                Bounds {
                    min: g.min_size,
                    max: g.max_size,
                },
            )
            .is_some()
        {
            bad(key, format!("group {} is listed twice", g.name));
        } else {
            selector.names.push(g.name.clone());
        }
    }

    for (i, d) in file.auto_discovery.iter().enumerate() {
        let key = format!("autoDiscovery[{i}].tags");
        match parse_tag_terms(&d.tags.join(",")) {
            Ok(set) => selector.tag_sets.push(set),
            Err(m) => bad(&key, m),
        }
    }
    for (i, spec) in flags.auto_discovery.iter().enumerate() {
        match parse_discovery_flag(spec) {
            Ok(set) => selector.tag_sets.push(set),
            Err(m) => bad(&format!("--node-group-auto-discovery[{i}]"), m),
        }
    }

    let mut templates = HashMap::new();
    for (name, t) in &file.templates {
        for (j, taint) in t.taints.iter().enumerate() {
            if let Err(m) = parse_taint(taint) {
                bad(&format!("templates.{name}.taints[{j}]"), m);
            }
        }
        if let Some(p) = t.max_pods.filter(|p| *p <= 0 || *p > 1000) {
            bad(
                &format!("templates.{name}.maxPods"),
                format!("{p} must be between 1 and 1000"),
            );
        }
        if let Some(p) = t.vm_memory_overhead_percent {
            if let Err(m) = check_vm_memory_overhead_percent(p) {
                bad(&format!("templates.{name}.vmMemoryOverheadPercent"), m);
            }
        }
        templates.insert(name.clone(), t.clone());
    }

    let interruption = interruption_settings(&file.interruption, &mut bad);
    if interruption.queue_url.is_some() {
        // The queue delivers lifecycle actions; the poll only catches what it missed.
        scale_in.lifecycle_poll_interval = scale_in
            .lifecycle_poll_interval
            .max(interruption.safety_net_poll);
    }
    if interruption.queue_url.is_some() && file.scale_in.enabled == Some(false) {
        bad(
            "interruption.queueUrl",
            "queue mode drains nodes; it needs scaleIn.enabled: true".into(),
        );
    }

    if !problems.is_empty() {
        return Err(ConfigError::Invalid {
            source_name: source.to_string(),
            problems,
        });
    }
    Ok(Config {
        source: source.to_string(),
        listen,
        metrics_listen,
        tls: file.tls.clone(),
        region: region.clone(),
        aws_endpoint,
        aws_max_attempts,
        provider: ProviderSettings {
            selector,
            static_bounds,
            refresh_interval,
            refresh_wait,
            region,
            templates,
            launch_failure_window,
            options_without_startup_time: file.options_without_startup_time.unwrap_or_default(),
            ..ProviderSettings::default()
        },
        drain_enabled: file.scale_in.enabled.unwrap_or(true),
        scale_in,
        interruption,
    })
}

/// A Go-style duration from the file or a flag, `default` when unset; one problem
/// naming the key and the value when it does not parse or lies outside the bounds.
fn bounded_duration(
    bad: &mut impl FnMut(&str, String),
    key: &str,
    value: Option<&String>,
    default: Duration,
    min: Duration,
    max: Option<Duration>,
) -> Duration {
    let Some(s) = value else {
        return default;
    };
    match (parse_duration(s), max) {
        (Ok(d), None) if d >= min => d,
        (Ok(d), None) => {
            bad(
                key,
                format!("{s:?} ({d:?}) is shorter than the minimum {min:?}"),
            );
            default
        }
        (Ok(d), Some(max)) if d >= min && d <= max => d,
        (Ok(d), Some(max)) => {
            bad(
                key,
                format!("{s:?} ({d:?}) must be between {min:?} and {max:?}"),
            );
            default
        }
        (Err(e), _) => {
            bad(key, format!("{s:?}: {e}"));
            default
        }
    }
}

/// `interruption:` validated; each problem names its key.
fn interruption_settings(
    f: &InterruptionFile,
    bad: &mut impl FnMut(&str, String),
) -> InterruptionSettings {
    let d = InterruptionSettings::default();
    let mut duration =
        |key: &str, v: Option<&String>, default: Duration, min: Duration, max: Duration| {
            bounded_duration(bad, key, v, default, min, Some(max))
        };
    let wait = duration(
        "interruption.waitTime",
        f.wait_time.as_ref(),
        d.wait,
        Duration::ZERO,
        Duration::from_secs(20),
    );
    let daemonset_share = duration(
        "interruption.daemonSetShare",
        f.daemon_set_share.as_ref(),
        d.daemonset_share,
        Duration::ZERO,
        crate::scalein::decide::record::MAX_DAEMONSET_SHARE,
    );
    let safety_net_poll = duration(
        "interruption.safetyNetPollInterval",
        f.safety_net_poll_interval.as_ref(),
        d.safety_net_poll,
        Duration::from_secs(15),
        Duration::from_secs(3600),
    );
    if let Some(u) = &f.queue_url {
        if !(u.starts_with("https://") || u.starts_with("http://")) {
            bad(
                "interruption.queueUrl",
                format!("{u:?} is not an SQS queue URL (https://sqs.<region>.amazonaws.com/<account>/<name>)"),
            );
        }
    }
    let batch = f.batch_size.unwrap_or(d.batch);
    if !(1..=10).contains(&batch) {
        bad(
            "interruption.batchSize",
            format!("{batch} must be between 1 and 10 (SQS's limit)"),
        );
    }
    let concurrency = f.concurrency.unwrap_or(d.concurrency);
    if !(1..=100).contains(&concurrency) {
        bad(
            "interruption.concurrency",
            format!("{concurrency} must be between 1 and 100"),
        );
    }
    let max_receives = f.max_receives.unwrap_or(d.max_receives);
    if max_receives == 0 {
        bad("interruption.maxReceives", "0 must be at least 1".into());
    }
    InterruptionSettings {
        queue_url: f.queue_url.clone(),
        rebalance: f.rebalance.unwrap_or(d.rebalance),
        unmanaged: f.unmanaged_instances.unwrap_or(d.unmanaged),
        batch: batch.clamp(1, 10),
        concurrency: concurrency.clamp(1, 100),
        wait,
        daemonset_share,
        max_receives: max_receives.max(1),
        safety_net_poll,
    }
}

impl Config {
    /// How to reach AWS: the region, the endpoint override and the SDK's attempts.
    pub fn aws_settings(&self) -> AwsSettings {
        AwsSettings {
            region: (!self.region.is_empty()).then(|| self.region.clone()),
            endpoint_url: self.aws_endpoint.clone(),
            max_attempts: self.aws_max_attempts,
        }
    }

    /// The region AWS is reached in: the configured one, else the SDK's chain
    /// (profile, instance metadata). Without one, an error saying where to set it:
    /// the region is never guessed (a wrong one finds no groups, or other groups).
    pub fn set_region(&mut self, region: String) {
        self.provider.region.clone_from(&region);
        self.region = region;
    }

    /// `serve` needs something to manage.
    pub fn require_groups(&self) -> Result<(), ConfigError> {
        let s = &self.provider.selector;
        if s.names.is_empty() && s.tag_sets.is_empty() {
            return Err(ConfigError::Invalid {
                source_name: self.source.clone(),
                problems: vec![Problem {
                    key: "nodeGroups/autoDiscovery".into(),
                    message: "no node groups: list them under nodeGroups (or --nodes=min:max:name) or discover them by tag under autoDiscovery (or --node-group-auto-discovery=asg:tag=...)".into(),
                }],
            });
        }
        Ok(())
    }
}

/// CA's `--nodes=<min>:<max>:<name>`.
pub fn parse_nodes_flag(spec: &str) -> Result<StaticGroup, String> {
    let parts: Vec<&str> = spec.splitn(3, ':').collect();
    if parts.len() != 3 {
        return Err(format!("{spec:?} is not min:max:name"));
    }
    let num = |what: &str, s: &str| {
        s.trim()
            .parse::<i32>()
            .map_err(|_| format!("{spec:?}: {what} {s:?} is not a whole number"))
    };
    let min = num("min", parts[0])?;
    let max = num("max", parts[1])?;
    let name = parts[2].trim();
    if name.is_empty() {
        return Err(format!("{spec:?}: the group name is empty"));
    }
    Ok(StaticGroup {
        name: name.to_string(),
        min_size: Some(min),
        max_size: Some(max),
    })
}

/// CA's `--node-group-auto-discovery=asg:tag=<key>[=<value>],<key2>...`.
pub fn parse_discovery_flag(spec: &str) -> Result<Vec<TagFilter>, String> {
    let rest = spec
        .strip_prefix("asg:")
        .ok_or_else(|| format!("{spec:?}: only the asg: discoverer is supported (asg:tag=...)"))?;
    let terms = rest
        .strip_prefix("tag=")
        .ok_or_else(|| format!("{spec:?}: expected asg:tag=<key>[=<value>],..."))?;
    parse_tag_terms(terms).map_err(|m| format!("{spec:?}: {m}"))
}

/// `key` or `key=value` terms, comma-separated.
pub fn parse_tag_terms(terms: &str) -> Result<Vec<TagFilter>, String> {
    let mut out = Vec::new();
    for term in terms.split(',') {
        let term = term.trim();
        if term.is_empty() {
            return Err(format!("empty tag term in {terms:?}"));
        }
        let (key, value) = match term.split_once('=') {
            Some((k, v)) => (k.trim(), Some(v.trim().to_string())),
            None => (term, None),
        };
        if key.is_empty() {
            return Err(format!("tag term {term:?} has an empty key"));
        }
        out.push(TagFilter {
            key: key.to_string(),
            value,
        });
    }
    Ok(out)
}

/// A VM memory overhead percent: a number from 0 to 50 (7.5 means 7.5 %).
pub fn check_vm_memory_overhead_percent(p: f64) -> Result<(), String> {
    let max = crate::provider::template::allocatable::MAX_VM_MEMORY_OVERHEAD_PERCENT;
    if p.is_finite() && (0.0..=max).contains(&p) {
        Ok(())
    } else {
        Err(format!(
            "{p} must be a percent between 0 and {max} (7.5 means 7.5 %; Karpenter's fraction 0.075 is 7.5 here)"
        ))
    }
}

/// `key=value:Effect` or `key:Effect` (validation only; the template builder parses).
pub fn parse_taint(s: &str) -> Result<(String, String, String), String> {
    let (kv, effect) = s
        .rsplit_once(':')
        .ok_or_else(|| format!("{s:?} is not key=value:Effect"))?;
    if !matches!(effect, "NoSchedule" | "PreferNoSchedule" | "NoExecute") {
        return Err(format!(
            "{s:?}: effect {effect:?} is not NoSchedule, PreferNoSchedule or NoExecute"
        ));
    }
    let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
    if k.is_empty() {
        return Err(format!("{s:?}: the taint key is empty"));
    }
    Ok((k.to_string(), v.to_string(), effect.to_string()))
}

#[cfg(test)]
mod tests;

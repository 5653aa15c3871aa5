//! Typed configuration: a YAML file, overridden by flags. Unknown keys and bad values
//! are errors that name the key, the value and the file; validation reports every
//! problem at once.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::cloud::aws::AwsSettings;
use crate::provider::template::TemplateOverrides;
use crate::provider::ProviderSettings;
use crate::scalein::{decide::notice::RebalanceAction, settings::InterruptionSettings};
use crate::scalein::{DaemonSetPolicy, DeadlinePolicy, ModeChoice, ScaleInSettings};
// What the tests read through `use super::*` besides the above.
#[cfg(test)]
use crate::cloud::TagFilter;
#[cfg(test)]
use crate::provider::Bounds;
#[cfg(test)]
use std::time::Duration;

mod args;
pub mod listen;
mod sections;
pub use args::{ConfigArgs, ServeFlags};
pub use listen::ListenAddr;
pub use sections::groups::{parse_discovery_flag, parse_nodes_flag, parse_tag_terms};
pub use sections::templates::{check_vm_memory_overhead_percent, parse_taint};
use sections::Problems;

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
    /// Disruption budgets: how many drains at once, how fast and when
    /// ([`sections::budgets`]).
    pub budgets: Option<Vec<BudgetFile>>,
    /// The last mile: out of the load balancers before the instance ends.
    pub load_balancers: Option<LoadBalancersFile>,
    /// Settings a group takes instead of the cluster's; the first that selects
    /// the group wins ([`sections::group_overrides`]).
    pub group_overrides: Option<Vec<GroupOverrideFile>>,
    /// Start a drain only once its group has its desired capacity InService.
    pub wait_for_replacement: Option<bool>,
}

/// One of `scaleIn.groupOverrides` as written.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct GroupOverrideFile {
    /// Group names (or `groupTags`, not both).
    pub groups: Option<Vec<String>>,
    /// Tags every selected group carries (`""`: any value).
    pub group_tags: Option<std::collections::BTreeMap<String, String>>,
    pub workload_deadline: Option<String>,
    pub workload_deadline_policy: Option<DeadlinePolicy>,
    pub wait_for_replacement: Option<bool>,
    /// The group's part of `scaleIn.loadBalancers`.
    pub load_balancers: Option<GroupLoadBalancersFile>,
}

/// `scaleIn.groupOverrides[i].loadBalancers` as written: what a group may set of the
/// last mile (the wait itself and its margin stay the cluster's).
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct GroupLoadBalancersFile {
    /// Deregister the group's instances from its attached target groups first.
    pub deregister: Option<bool>,
}

/// `scaleIn.loadBalancers` as written.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct LoadBalancersFile {
    /// Wait until the instance is out of every ELBv2 target group (default `true`).
    pub wait_for_deregistration: Option<bool>,
    /// Added to each target group's deregistration delay (default `30s`).
    pub margin: Option<String>,
    /// Deregister the instance from the target groups attached to its Auto Scaling
    /// group before the wait (default `false`).
    pub deregister: Option<bool>,
}

/// One of `scaleIn.budgets` as written.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct BudgetFile {
    pub name: Option<String>,
    /// A count (`3`) or a percent (`"20%"`) of the nodes the budget covers.
    pub nodes: Option<CountOrPercent>,
    /// Group names; none (and no `groupTags`): every group.
    pub groups: Option<Vec<String>>,
    /// Tags every covered group carries (`""`: any value).
    pub group_tags: Option<std::collections::BTreeMap<String, String>>,
    pub zones: Option<Vec<String>>,
    /// Causes the budget governs; none: every cause.
    pub reasons: Option<Vec<String>>,
    /// Cron, UTC: when the budget comes in force, for `duration`.
    pub schedule: Option<String>,
    pub duration: Option<String>,
    pub rate: Option<RateFile>,
}

/// `nodes:` as YAML writes it: a number or a string.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum CountOrPercent {
    Count(u64),
    Text(String),
}

/// `rate:`: at most `starts` drain starts per `per`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RateFile {
    pub starts: Option<u32>,
    pub per: Option<String>,
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

/// File + flags -> Config, collecting every problem: each section resolves in its
/// room under `sections/` and adds what is wrong to one list, in this order.
pub fn resolve(file: FileConfig, flags: &Overrides, source: &str) -> Result<Config, ConfigError> {
    let mut problems = Problems::default();
    let doors = sections::listen::resolve(&file, flags, &mut problems);
    let aws = sections::aws::resolve(&file.aws, flags, &mut problems);
    let timing = sections::timing::resolve(&file, flags, &mut problems);
    let mut scale_in = sections::scale_in::resolve(&file.scale_in, &mut problems);
    scale_in.budgets = sections::budgets::resolve(file.scale_in.budgets.as_deref(), &mut problems);
    scale_in.group_overrides = sections::group_overrides::resolve(
        file.scale_in.group_overrides.as_deref(),
        scale_in.load_balancers.enabled,
        &mut problems,
    );
    // Checked between the scale-in values and their limits: the order problems have
    // always been reported in.
    sections::timing::check_refresh_wait_fits_ca_call(&timing, &mut problems);
    sections::scale_in::check_limits(&mut scale_in, &mut problems);
    let groups = sections::groups::resolve(&file, flags, &mut problems);
    let templates = sections::templates::resolve(&file.templates, &mut problems);
    let interruption = sections::interruption::resolve(&file.interruption, &mut problems);
    sections::interruption::fit_scale_in(
        &interruption,
        file.scale_in.enabled,
        &mut scale_in,
        &mut problems,
    );

    let problems = problems.into_vec();
    if !problems.is_empty() {
        return Err(ConfigError::Invalid {
            source_name: source.to_string(),
            problems,
        });
    }
    Ok(Config {
        source: source.to_string(),
        listen: doors.listen,
        metrics_listen: doors.metrics_listen,
        tls: doors.tls,
        region: aws.region.clone(),
        aws_endpoint: aws.endpoint,
        aws_max_attempts: aws.max_attempts,
        provider: ProviderSettings {
            selector: groups.selector,
            static_bounds: groups.static_bounds,
            refresh_interval: timing.refresh_interval,
            refresh_wait: timing.refresh_wait,
            region: aws.region,
            templates,
            launch_failure_window: timing.launch_failure_window,
            options_without_startup_time: file.options_without_startup_time.unwrap_or_default(),
            ..ProviderSettings::default()
        },
        drain_enabled: file.scale_in.enabled.unwrap_or(true),
        scale_in,
        interruption,
    })
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

#[cfg(test)]
mod tests;

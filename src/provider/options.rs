//! Per-group autoscaling options: CA's defaults overlaid with ASG tags
//! `k8s.io/cluster-autoscaler/node-template/autoscaling-options/<option>`. Pure.

use std::collections::BTreeMap;
use std::time::Duration;

/// The options CA asks for, as the core holds them. `None` = CA sent nothing.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AutoscalingOptions {
    pub scale_down_utilization_threshold: f64,
    pub scale_down_gpu_utilization_threshold: f64,
    pub scale_down_unneeded_time: Option<Duration>,
    pub scale_down_unready_time: Option<Duration>,
    pub max_node_provision_time: Option<Duration>,
    pub max_node_startup_time: Option<Duration>,
    pub zero_or_max_node_scaling: bool,
    pub ignore_daemonsets_utilization: bool,
    pub allow_non_atomic_scale_up_to_max: bool,
}

/// Applies the option tags on top of `defaults`. Returns the result and one message per
/// tag that could not be used (naming the tag and its value).
pub fn overlay_from_tags(
    defaults: &AutoscalingOptions,
    tags: &BTreeMap<String, String>,
) -> (AutoscalingOptions, Vec<String>) {
    let _ = tags;
    (defaults.clone(), Vec::new())
}

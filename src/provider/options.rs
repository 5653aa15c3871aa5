//! Per-group autoscaling options: CA's defaults overlaid with ASG tags
//! `k8s.io/cluster-autoscaler/node-template/autoscaling-options/<option>`. Pure.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::duration::parse_duration;

pub const TAG_PREFIX: &str = "k8s.io/cluster-autoscaler/node-template/autoscaling-options/";

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
    let mut o = defaults.clone();
    let mut warnings = Vec::new();
    for (k, v) in tags {
        let Some(name) = k.strip_prefix(TAG_PREFIX) else {
            continue;
        };
        let v = v.trim();
        let ratio = |warnings: &mut Vec<String>| match v.parse::<f64>() {
            Ok(x) if (0.0..=1.0).contains(&x) => Some(x),
            _ => {
                warnings.push(format!(
                    "tag {k}={v:?}: expected a number between 0 and 1; default kept"
                ));
                None
            }
        };
        let dur = |warnings: &mut Vec<String>| match parse_duration(v) {
            Ok(d) => Some(d),
            Err(e) => {
                warnings.push(format!("tag {k}={v:?}: {e}; default kept"));
                None
            }
        };
        let boolean = |warnings: &mut Vec<String>| match v.to_ascii_lowercase().as_str() {
            "true" => Some(true),
            "false" => Some(false),
            _ => {
                warnings.push(format!(
                    "tag {k}={v:?}: expected true or false; default kept"
                ));
                None
            }
        };
        match name.to_ascii_lowercase().as_str() {
            "scaledownutilizationthreshold" => {
                if let Some(x) = ratio(&mut warnings) {
                    o.scale_down_utilization_threshold = x;
                }
            }
            "scaledowngpuutilizationthreshold" => {
                if let Some(x) = ratio(&mut warnings) {
                    o.scale_down_gpu_utilization_threshold = x;
                }
            }
            "scaledownunneededtime" => {
                if let Some(d) = dur(&mut warnings) {
                    o.scale_down_unneeded_time = Some(d);
                }
            }
            "scaledownunreadytime" => {
                if let Some(d) = dur(&mut warnings) {
                    o.scale_down_unready_time = Some(d);
                }
            }
            "maxnodeprovisiontime" => {
                if let Some(d) = dur(&mut warnings) {
                    o.max_node_provision_time = Some(d);
                }
            }
            "maxnodestartuptime" => {
                if let Some(d) = dur(&mut warnings) {
                    o.max_node_startup_time = Some(d);
                }
            }
            "ignoredaemonsetsutilization" => {
                if let Some(b) = boolean(&mut warnings) {
                    o.ignore_daemonsets_utilization = b;
                }
            }
            "zeroormaxnodescaling" => {
                if let Some(b) = boolean(&mut warnings) {
                    o.zero_or_max_node_scaling = b;
                }
            }
            "allownonatomicscaleuptomax" => {
                if let Some(b) = boolean(&mut warnings) {
                    o.allow_non_atomic_scale_up_to_max = b;
                }
            }
            _ => warnings.push(format!(
                "tag {k}: unknown autoscaling option {name:?}; ignored"
            )),
        }
    }
    (o, warnings)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tags(t: &[(&str, &str)]) -> BTreeMap<String, String> {
        t.iter()
            .map(|(k, v)| (format!("{TAG_PREFIX}{k}"), v.to_string()))
            .collect()
    }

    fn defaults() -> AutoscalingOptions {
        AutoscalingOptions {
            scale_down_utilization_threshold: 0.5,
            scale_down_gpu_utilization_threshold: 0.5,
            scale_down_unneeded_time: Some(Duration::from_secs(600)),
            scale_down_unready_time: Some(Duration::from_secs(1200)),
            max_node_provision_time: Some(Duration::from_secs(900)),
            max_node_startup_time: Some(Duration::from_secs(900)),
            ..Default::default()
        }
    }

    #[test]
    fn no_tags_echo_the_defaults() {
        let (o, w) = overlay_from_tags(&defaults(), &BTreeMap::new());
        assert_eq!(o, defaults());
        assert!(w.is_empty());
    }

    #[test]
    fn every_option_overlays() {
        let (o, w) = overlay_from_tags(
            &defaults(),
            &tags(&[
                ("scaledownutilizationthreshold", "0.3"),
                ("scaledowngpuutilizationthreshold", "0.7"),
                ("scaledownunneededtime", "1m30s"),
                ("scaledownunreadytime", "5m"),
                ("maxnodeprovisiontime", "1h"),
                ("maxNodeStartupTime", "20m"),
                ("ignoredaemonsetsutilization", "true"),
                ("zeroormaxnodescaling", "TRUE"),
                ("allownonatomicscaleuptomax", "false"),
            ]),
        );
        assert!(w.is_empty(), "{w:?}");
        assert_eq!(o.scale_down_utilization_threshold, 0.3);
        assert_eq!(o.scale_down_gpu_utilization_threshold, 0.7);
        assert_eq!(o.scale_down_unneeded_time, Some(Duration::from_secs(90)));
        assert_eq!(o.scale_down_unready_time, Some(Duration::from_secs(300)));
        assert_eq!(o.max_node_provision_time, Some(Duration::from_secs(3600)));
        assert_eq!(o.max_node_startup_time, Some(Duration::from_secs(1200)));
        assert!(o.ignore_daemonsets_utilization && o.zero_or_max_node_scaling);
    }

    #[test]
    fn bad_values_keep_the_default_and_name_the_tag() {
        let (o, w) = overlay_from_tags(
            &defaults(),
            &tags(&[
                ("scaledownutilizationthreshold", "1.5"),
                ("scaledownunneededtime", "soon"),
                ("zeroormaxnodescaling", "yes"),
                ("bogus", "1"),
            ]),
        );
        assert_eq!(o, defaults());
        assert_eq!(w.len(), 4, "{w:?}");
        assert!(w[0].contains("bogus") || w.iter().any(|x| x.contains("bogus")));
        assert!(w
            .iter()
            .any(|x| x.contains("1.5") && x.contains("scaledownutilizationthreshold")));
        assert!(w.iter().any(|x| x.contains("soon")));
    }
}

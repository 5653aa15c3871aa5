//! Per-group autoscaling options: CA's defaults overlaid with ASG tags
//! `k8s.io/cluster-autoscaler/node-template/autoscaling-options/<option>`. Pure.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::duration::parse_duration;

/// What NodeGroupGetOptions answers, for a group with option tags, to a CA that has
/// no MaxNodeStartupTime on the wire (CA >= 1.35: its request carries the Duration
/// fields 8-10 and not 3-5). Such a CA builds its whole options struct from any
/// answer, so MaxNodeStartupTime becomes 0 for the group (upstream issue
/// kubernetes/autoscaler#10245, fix proposed in PR #10266): every registered node
/// that is still booting counts as unready at once and not as upcoming, the same
/// pending pods scale the group up again, and a large scale-up can trip CA's unready
/// limits and skip whole loops.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OptionsWithoutStartupTime {
    /// Answer Unimplemented: CA keeps its own defaults (its flags) for every field
    /// and the group's option tags do not apply. The default: losing per-group
    /// tweaks costs less than over-scaling and skipped loops for the whole cluster.
    #[default]
    Unimplemented,
    /// Answer the tagged options anyway (MaxNodeStartupTime reads as 0).
    Answer,
}

impl OptionsWithoutStartupTime {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Unimplemented => "unimplemented",
            Self::Answer => "answer",
        }
    }
}

pub const TAG_PREFIX: &str = "k8s.io/cluster-autoscaler/node-template/autoscaling-options/";

/// The options CA asks for, as the core holds them. `None` = CA sent nothing.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AutoscalingOptions {
    pub scale_down_utilization_threshold: f64,
    pub scale_down_gpu_utilization_threshold: f64,
    pub scale_down_unneeded_time: Option<Duration>,
    pub scale_down_unready_time: Option<Duration>,
    pub max_node_provision_time: Option<Duration>,
    pub zero_or_max_node_scaling: bool,
    pub ignore_daemonsets_utilization: bool,
}

impl AutoscalingOptions {
    /// What CA sends when nothing overrides it: its flag defaults
    /// (`--scale-down-utilization-threshold=0.5`, `--scale-down-unneeded-time=10m`,
    /// `--scale-down-unready-time=20m`, `--max-node-provision-time=15m`).
    pub fn ca_defaults() -> Self {
        AutoscalingOptions {
            scale_down_utilization_threshold: 0.5,
            scale_down_gpu_utilization_threshold: 0.5,
            scale_down_unneeded_time: Some(Duration::from_secs(600)),
            scale_down_unready_time: Some(Duration::from_secs(1200)),
            max_node_provision_time: Some(Duration::from_secs(900)),
            ..Default::default()
        }
    }
}

/// Longest duration every field can carry: the meta Duration (fields 3-5) holds
/// int64 nanoseconds, about 292 years.
pub const MAX_DURATION: Duration = Duration::from_nanos(i64::MAX as u64);

/// What the tags of a group made of CA's defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct Overlay {
    pub options: AutoscalingOptions,
    /// How many option tags took effect. With none, the group has nothing to say
    /// and CA keeps its own defaults (see [`crate::provider::Provider::options`]).
    pub applied: usize,
    /// One message per tag that could not be used, naming the tag and its value.
    pub warnings: Vec<String>,
}

/// The options are answered only when every value fits the wire: a threshold that
/// is a number between 0 and 1, durations CA's fields can carry. Names the field.
pub fn validate(o: &AutoscalingOptions) -> Result<(), String> {
    for (field, x) in [
        (
            "scaleDownUtilizationThreshold",
            o.scale_down_utilization_threshold,
        ),
        (
            "scaleDownGpuUtilizationThreshold",
            o.scale_down_gpu_utilization_threshold,
        ),
    ] {
        if !(x.is_finite() && (0.0..=1.0).contains(&x)) {
            return Err(format!(
                "field {field}: {x} is not a number between 0 and 1"
            ));
        }
    }
    for (field, d) in [
        ("scaleDownUnneededTime", o.scale_down_unneeded_time),
        ("scaleDownUnreadyTime", o.scale_down_unready_time),
        ("MaxNodeProvisionTime", o.max_node_provision_time),
    ] {
        if let Some(d) = d.filter(|d| *d > MAX_DURATION) {
            return Err(format!(
                "field {field}: {d:?} is longer than a Duration field can carry ({MAX_DURATION:?})"
            ));
        }
    }
    Ok(())
}

/// The autoscaling-options tags of a group that cannot be used, one message each
/// (what the gauge, the Event and the log report).
pub fn unusable_tags(tags: &BTreeMap<String, String>) -> Vec<String> {
    overlay_from_tags(&AutoscalingOptions::ca_defaults(), tags).warnings
}

/// Applies the option tags on top of `defaults`.
pub fn overlay_from_tags(
    defaults: &AutoscalingOptions,
    tags: &BTreeMap<String, String>,
) -> Overlay {
    let mut o = defaults.clone();
    let mut warnings = Vec::new();
    let mut applied = 0;
    for (k, v) in tags {
        let Some(name) = k.strip_prefix(TAG_PREFIX) else {
            continue;
        };
        let v = v.trim();
        // Each tag sets its option, or says in one warning why it does not.
        let ratio = || match v.parse::<f64>() {
            Ok(x) if (0.0..=1.0).contains(&x) => Ok(x),
            _ => Err(format!(
                "tag {k}={v:?}: expected a number between 0 and 1; default kept"
            )),
        };
        let dur = || parse_duration(v).map_err(|e| format!("tag {k}={v:?}: {e}; default kept"));
        let boolean = || match v.to_ascii_lowercase().as_str() {
            "true" => Ok(true),
            "false" => Ok(false),
            _ => Err(format!(
                "tag {k}={v:?}: expected true or false; default kept"
            )),
        };
        let set: Result<(), String> = match name.to_ascii_lowercase().as_str() {
            "scaledownutilizationthreshold" => {
                ratio().map(|x| o.scale_down_utilization_threshold = x)
            }
            "scaledowngpuutilizationthreshold" => {
                ratio().map(|x| o.scale_down_gpu_utilization_threshold = x)
            }
            "scaledownunneededtime" => dur().map(|d| o.scale_down_unneeded_time = Some(d)),
            "scaledownunreadytime" => dur().map(|d| o.scale_down_unready_time = Some(d)),
            "maxnodeprovisiontime" => dur().map(|d| o.max_node_provision_time = Some(d)),
            "maxnodestartuptime" | "allownonatomicscaleuptomax" => Err(format!(
                "tag {k}: no effect: no cluster-autoscaler version carries {name:?} over externalgrpc (CA 1.35+ reads MaxNodeStartupTime as 0 for every group that answers GetOptions)"
            )),
            "ignoredaemonsetsutilization" => {
                boolean().map(|b| o.ignore_daemonsets_utilization = b)
            }
            "zeroormaxnodescaling" => boolean().map(|b| o.zero_or_max_node_scaling = b),
            _ => Err(format!(
                "tag {k}: unknown autoscaling option {name:?}; ignored"
            )),
        };
        match set {
            Ok(()) => applied += 1,
            Err(w) => warnings.push(w),
        }
    }
    Overlay {
        options: o,
        applied,
        warnings,
    }
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
        AutoscalingOptions::ca_defaults()
    }

    #[test]
    fn no_tags_echo_the_defaults_and_apply_nothing() {
        let o = overlay_from_tags(&defaults(), &BTreeMap::new());
        assert_eq!(o.options, defaults());
        assert_eq!(o.applied, 0);
        assert!(o.warnings.is_empty());
    }

    #[test]
    fn tags_no_ca_carries_apply_nothing_and_say_so() {
        let o = overlay_from_tags(
            &defaults(),
            &tags(&[
                ("maxNodeStartupTime", "20m"),
                ("allownonatomicscaleuptomax", "true"),
            ]),
        );
        assert_eq!(o.applied, 0);
        assert_eq!(o.options, defaults());
        assert_eq!(o.warnings.len(), 2);
        assert!(
            o.warnings.iter().all(|w| w.contains("no effect")),
            "{:?}",
            o.warnings
        );
    }

    #[test]
    fn values_the_wire_cannot_carry_are_refused_by_field() {
        assert!(validate(&defaults()).is_ok());
        let mut nan = defaults();
        nan.scale_down_utilization_threshold = f64::NAN;
        assert!(validate(&nan)
            .unwrap_err()
            .contains("field scaleDownUtilizationThreshold"));
        let mut inf = defaults();
        inf.scale_down_gpu_utilization_threshold = f64::INFINITY;
        assert!(validate(&inf)
            .unwrap_err()
            .contains("scaleDownGpuUtilizationThreshold"));
        let mut long = defaults();
        long.max_node_provision_time = Some(Duration::from_secs(u64::MAX / 2));
        assert!(validate(&long)
            .unwrap_err()
            .contains("field MaxNodeProvisionTime"));
    }

    #[test]
    fn every_option_overlays() {
        let Overlay {
            options: o,
            applied,
            warnings: w,
        } = overlay_from_tags(
            &defaults(),
            &tags(&[
                ("scaledownutilizationthreshold", "0.3"),
                ("scaledowngpuutilizationthreshold", "0.7"),
                ("scaledownunneededtime", "1m30s"),
                ("scaledownunreadytime", "5m"),
                ("maxnodeprovisiontime", "1h"),
                ("ignoredaemonsetsutilization", "true"),
                ("zeroormaxnodescaling", "TRUE"),
            ]),
        );
        assert!(w.is_empty(), "{w:?}");
        assert_eq!(applied, 7);
        assert_eq!(o.scale_down_utilization_threshold, 0.3);
        assert_eq!(o.scale_down_gpu_utilization_threshold, 0.7);
        assert_eq!(o.scale_down_unneeded_time, Some(Duration::from_secs(90)));
        assert_eq!(o.scale_down_unready_time, Some(Duration::from_secs(300)));
        assert_eq!(o.max_node_provision_time, Some(Duration::from_secs(3600)));
        assert!(o.ignore_daemonsets_utilization && o.zero_or_max_node_scaling);
    }

    #[test]
    fn bad_values_keep_the_default_and_name_the_tag() {
        let Overlay {
            options: o,
            applied,
            warnings: w,
        } = overlay_from_tags(
            &defaults(),
            &tags(&[
                ("scaledownutilizationthreshold", "1.5"),
                ("scaledownunneededtime", "soon"),
                ("zeroormaxnodescaling", "yes"),
                ("bogus", "1"),
            ]),
        );
        assert_eq!(o, defaults());
        assert_eq!(applied, 0);
        assert_eq!(w.len(), 4, "{w:?}");
        assert!(w[0].contains("bogus") || w.iter().any(|x| x.contains("bogus")));
        assert!(w
            .iter()
            .any(|x| x.contains("1.5") && x.contains("scaledownutilizationthreshold")));
        assert!(w.iter().any(|x| x.contains("soon")));
    }
}

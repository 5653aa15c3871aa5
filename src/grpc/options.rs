//! NodeGroupAutoscalingOptions <-> AutoscalingOptions, reading whichever Duration set
//! CA sent (fields 8-10 google Duration preferred, else 3-5 meta Duration) and writing
//! both, so CA 1.31 through the newest read the same values. The two Duration types
//! differ on the wire (nanoseconds vs seconds+nanos): mixing them up turns 10 minutes
//! into 600 nanoseconds.

use std::time::Duration;

use crate::proto;
use crate::provider::options::AutoscalingOptions;

fn from_google(d: &prost_types::Duration) -> Option<Duration> {
    if d.seconds < 0 || d.nanos < 0 {
        return None;
    }
    Some(Duration::new(
        d.seconds as u64,
        d.nanos.clamp(0, 999_999_999) as u32,
    ))
}

fn from_meta(d: &proto::MetaDuration) -> Option<Duration> {
    (d.duration >= 0).then(|| Duration::from_nanos(d.duration as u64))
}

fn to_google(d: Duration) -> prost_types::Duration {
    prost_types::Duration {
        seconds: d.as_secs().min(i64::MAX as u64) as i64,
        nanos: d.subsec_nanos() as i32,
    }
}

fn to_meta(d: Duration) -> proto::MetaDuration {
    proto::MetaDuration {
        duration: d.as_nanos().min(i64::MAX as u128) as i64,
    }
}

pub fn from_proto(p: &proto::NodeGroupAutoscalingOptions) -> AutoscalingOptions {
    let pick = |g: &Option<prost_types::Duration>, m: &Option<proto::MetaDuration>| {
        g.as_ref()
            .and_then(from_google)
            .or_else(|| m.as_ref().and_then(from_meta))
    };
    AutoscalingOptions {
        scale_down_utilization_threshold: p.scale_down_utilization_threshold,
        scale_down_gpu_utilization_threshold: p.scale_down_gpu_utilization_threshold,
        scale_down_unneeded_time: pick(
            &p.scale_down_unneeded_duration,
            &p.scale_down_unneeded_time,
        ),
        scale_down_unready_time: pick(&p.scale_down_unready_duration, &p.scale_down_unready_time),
        max_node_provision_time: pick(&p.max_node_provision_duration, &p.max_node_provision_time),
        zero_or_max_node_scaling: p.zero_or_max_node_scaling,
        ignore_daemonsets_utilization: p.ignore_daemon_sets_utilization,
    }
}

pub fn to_proto(o: &AutoscalingOptions) -> proto::NodeGroupAutoscalingOptions {
    proto::NodeGroupAutoscalingOptions {
        scale_down_utilization_threshold: o.scale_down_utilization_threshold,
        scale_down_gpu_utilization_threshold: o.scale_down_gpu_utilization_threshold,
        scale_down_unneeded_time: o.scale_down_unneeded_time.map(to_meta),
        scale_down_unready_time: o.scale_down_unready_time.map(to_meta),
        max_node_provision_time: o.max_node_provision_time.map(to_meta),
        zero_or_max_node_scaling: o.zero_or_max_node_scaling,
        ignore_daemon_sets_utilization: o.ignore_daemonsets_utilization,
        scale_down_unneeded_duration: o.scale_down_unneeded_time.map(to_google),
        scale_down_unready_duration: o.scale_down_unready_time.map(to_google),
        max_node_provision_duration: o.max_node_provision_time.map(to_google),
    }
}

/// Whether the defaults CA sent come from a CA without MaxNodeStartupTime on the
/// wire (>= 1.35): it fills the google Durations (8-10) and no longer the meta ones
/// (3-5); CA 1.34 fills both, 1.31-1.33 only 3-5.
pub fn lacks_startup_time(p: &proto::NodeGroupAutoscalingOptions) -> bool {
    let new = p.scale_down_unneeded_duration.is_some()
        || p.scale_down_unready_duration.is_some()
        || p.max_node_provision_duration.is_some();
    let old = p.scale_down_unneeded_time.is_some()
        || p.scale_down_unready_time.is_some()
        || p.max_node_provision_time.is_some();
    new && !old
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ten_minutes_in_both_sets() {
        let o = AutoscalingOptions {
            scale_down_unneeded_time: Some(Duration::from_secs(600)),
            ..Default::default()
        };
        let p = to_proto(&o);
        assert_eq!(
            p.scale_down_unneeded_time.unwrap().duration,
            600_000_000_000
        );
        assert_eq!(p.scale_down_unneeded_duration.unwrap().seconds, 600);
        assert_eq!(p.scale_down_unneeded_duration.unwrap().nanos, 0);
        assert_eq!(
            from_proto(&p).scale_down_unneeded_time,
            Some(Duration::from_secs(600))
        );
    }

    #[test]
    fn reads_whichever_set_is_present() {
        let old = proto::NodeGroupAutoscalingOptions {
            scale_down_unready_time: Some(proto::MetaDuration {
                duration: 1_200_000_000_000,
            }),
            ..Default::default()
        };
        assert_eq!(
            from_proto(&old).scale_down_unready_time,
            Some(Duration::from_secs(1200))
        );
        let new = proto::NodeGroupAutoscalingOptions {
            max_node_provision_duration: Some(prost_types::Duration {
                seconds: 900,
                nanos: 500,
            }),
            ..Default::default()
        };
        let o = from_proto(&new);
        assert_eq!(o.max_node_provision_time, Some(Duration::new(900, 500)));
        assert_eq!(o.scale_down_unneeded_time, None);
    }

    #[test]
    fn negative_durations_are_ignored() {
        let p = proto::NodeGroupAutoscalingOptions {
            scale_down_unneeded_time: Some(proto::MetaDuration { duration: -5 }),
            scale_down_unneeded_duration: Some(prost_types::Duration {
                seconds: -1,
                nanos: 0,
            }),
            ..Default::default()
        };
        assert_eq!(from_proto(&p).scale_down_unneeded_time, None);
    }
}

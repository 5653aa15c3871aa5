//! The DaemonSet pods leave last, once every workload pod is gone: the log shippers
//! flush what the workloads wrote; the node-critical ones (kube-proxy, the CNI, CSI
//! node plugins) after the volumes. Each phase has its own deadline and policy.

use crate::clock::Instant;

use crate::scalein::decide::plan;
use crate::scalein::kube::events::Reason;
use crate::scalein::kube::wait::NodePods;

use crate::scalein::stages::port::{NodeDrain, Stop};
use crate::scalein::stages::workloads::{deadline, phase};

pub(crate) async fn daemonset_phase(
    d: &NodeDrain<'_>,
    pods: &mut NodePods,
    which: plan::Phase,
) -> Result<(), Stop> {
    let s = &d.r.stage.settings;
    let (what, done) = match which {
        plan::Phase::CriticalDaemonSets => (
            "node-critical DaemonSet pods",
            "every node-critical DaemonSet pod has exited",
        ),
        _ => ("DaemonSet pods", "every DaemonSet pod has exited"),
    };
    let mut ds_deadline = Instant::now() + s.daemonset_deadline;
    if let Some((ends_at, _)) = d.budget {
        ds_deadline = ds_deadline.min(ends_at.max(Instant::now()));
    }
    match phase(d, pods, which, ds_deadline).await {
        Ok(()) => {
            d.r.stage
                .events
                .node(d.node, Reason::DaemonSetsGone, done.into())
                .await;
            Ok(())
        }
        Err(left) => {
            deadline(
                d.r,
                d.node,
                what,
                s.daemonset_deadline,
                d.policy(s.daemonset_deadline_policy),
                left,
                true,
            )
            .await
        }
    }
}

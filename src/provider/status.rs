//! What the operations port reports about the provider: ready once node groups were
//! loaded from AWS and at least one was found, and the per-group gauges (bounds, instances, target) refreshed at
//! each scrape, with the series of a group that is no longer managed removed.

use std::collections::BTreeSet;

use parking_lot::Mutex;

use super::Provider;
use crate::telemetry::http::Status;
use crate::telemetry::metrics::{metrics, GroupLabels};

/// What a selector looks for, in words: `tagged k8s.io/cluster-autoscaler/enabled and
/// k8s.io/cluster-autoscaler/prod`, `named web or batch`, or both joined by `or`. Pure.
pub fn looked_for(selector: &crate::cloud::GroupSelector) -> String {
    let mut parts = Vec::new();
    if !selector.names.is_empty() {
        parts.push(format!("named {}", selector.names.join(" or ")));
    }
    for set in &selector.tag_sets {
        let terms: Vec<String> = set.iter().map(|t| t.to_string()).collect();
        parts.push(format!("tagged {}", terms.join(" and ")));
    }
    if parts.is_empty() {
        "selected (no nodeGroups, no autoDiscovery)".into()
    } else {
        parts.join(", or ")
    }
}

/// The groups the last scrape exported series for (the registry is process-wide too).
static SHOWN_GROUPS: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());

impl Status for Provider {
    fn readiness(&self) -> Result<(), String> {
        if self.is_loaded() {
            if self.registry().groups.is_empty() {
                // A typo'd cluster name or the wrong region finds nothing, and CA
                // would then have nothing to scale: not a healthy install.
                return Err(format!(
                    "no node group found: no Auto Scaling Group is {}; read again every {} (ca-asg-provider check-config names the region and account it looks in)",
                    looked_for(&self.settings().selector),
                    crate::duration::format_duration(self.settings().refresh_interval)
                ));
            }
            return Ok(());
        }
        let why = self
            .last_refresh_error()
            .unwrap_or_else(|| "no refresh yet".into());
        Err(format!("node groups not loaded: {why}"))
    }

    fn before_scrape(&self) {
        let m = metrics();
        let reg = self.registry();
        m.node_groups.set(reg.groups.len() as i64);
        // A group that is no longer managed loses its series instead of keeping its
        // last values forever.
        let now: BTreeSet<String> = reg.groups.iter().map(|g| g.asg.name.clone()).collect();
        {
            let mut shown = SHOWN_GROUPS.lock();
            for gone in shown.difference(&now) {
                let l = GroupLabels {
                    node_group: gone.clone(),
                };
                m.group_min.remove(&l);
                m.group_max.remove(&l);
                m.group_instances.remove(&l);
                m.group_target.remove(&l);
                m.group_failed_below_min.remove(&l);
                m.group_option_tags_unusable.remove(&l);
            }
            *shown = now;
        }
        for g in &reg.groups {
            let l = GroupLabels {
                node_group: g.asg.name.clone(),
            };
            m.group_min.get_or_create(&l).set(i64::from(g.min));
            m.group_max.get_or_create(&l).set(i64::from(g.max));
            m.group_instances
                .get_or_create(&l)
                .set(g.asg.instances.len() as i64);
            if let Ok(t) = self.target_size(&g.asg.name) {
                m.group_target.get_or_create(&l).set(i64::from(t));
            }
            let unusable = super::options::unusable_tags(&g.asg.tags).len();
            m.group_option_tags_unusable
                .get_or_create(&l)
                .set(unusable as i64);
            if let Ok(n) = self.failed_below_min(&g.asg.name) {
                m.group_failed_below_min.get_or_create(&l).set(i64::from(n));
            }
        }
    }
}

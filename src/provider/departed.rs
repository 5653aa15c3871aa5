//! Instances that left their group's snapshot (ended, or detached), remembered by group
//! for a while. Pure: the caller passes the time.
//!
//! Cluster-autoscaler keeps each group's instance list in a cache it refreshes every
//! 2 minutes (`clusterstate/utils/node_instances_cache.go`, 1.31 to 1.36). An instance
//! that ended without a decrement (EC2 reclaimed it, a health check replaced it) stays in
//! that list after its Node is gone, so CA builds a fake unregistered node for it and
//! asks NodeGroupForNode. Answered "no group", CA leaves it out of the group's readiness
//! ("Nodegroup is nil for ..."): the group then looks one node short with nothing
//! unregistered, and after MaxNodeProvisionTime fixNodeGroupSize asks DecreaseTargetSize
//! for the missing node, below MinSize when the group sits at its minimum, which is
//! refused, and that error ends CA's whole loop, every loop (seen with CA 1.31.5 and
//! 1.36.1). Answered with its former group, the instance counts as unregistered, then as
//! long unregistered, which is what it is.
//!
//! Only an instance that ended is answered so. One that left for its group's warm pool
//! (ReuseOnScaleIn: it rests there, stopped, with its NotReady Node) or was detached
//! (it runs on, outside any group) belongs to no group, as CA's own AWS provider
//! answers; mapped to its former group, its Node would count among the group's
//! unready nodes, or be picked for a scale-in that ends nothing. Leaving the group's
//! list tells none of that: an instance last seen ending (Terminating*, Terminated)
//! ended; any other is asked of AWS before it is answered
//! ([`Departed::to_confirm`], [`Departed::confirm`], done by the refresh).

use std::collections::BTreeMap;
use std::time::Duration;

use crate::clock::Instant;

use super::Registry;

/// How long a departed instance is remembered: longer than CA's cache of instance
/// lists is refreshed (2 minutes) and trusted (5 minutes).
pub const KEEP: Duration = Duration::from_secs(10 * 60);

/// At most this many are remembered (the oldest go first): a scale-in of thousands of
/// nodes at once stays bounded.
pub const MAX: usize = 50_000;

#[derive(Debug)]
struct Left {
    /// The group it left.
    group: String,
    /// When it was first missed.
    at: Instant,
    /// Known to have ended: last seen ending, or confirmed with AWS.
    ended: bool,
}

#[derive(Debug, Default)]
pub struct Departed {
    by_id: BTreeMap<String, Left>,
}

impl Departed {
    /// Notes every instance of `old` that `new` no longer holds in any group (ended
    /// when it was last seen ending, else to confirm), forgets those `new` holds again
    /// and those older than [`KEEP`].
    pub fn note(&mut self, old: &Registry, new: &Registry, now: Instant) {
        for g in &old.groups {
            for i in &g.asg.instances {
                if new.group_of_instance(&i.id).is_none() {
                    self.by_id.entry(i.id.clone()).or_insert_with(|| Left {
                        group: g.asg.name.clone(),
                        at: now,
                        ended: i.state.is_terminating(),
                    });
                }
            }
        }
        self.by_id.retain(|id, left| {
            new.group_of_instance(id).is_none() && now.saturating_duration_since(left.at) < KEEP
        });
        if self.by_id.len() > MAX {
            let mut ages: Vec<(Instant, String)> = self
                .by_id
                .iter()
                .map(|(id, left)| (left.at, id.clone()))
                .collect();
            ages.sort();
            let extra = self.by_id.len() - MAX;
            for (_, id) in ages.into_iter().take(extra) {
                self.by_id.remove(&id);
            }
        }
    }

    /// The instances that left their group without being seen ending: to ask AWS
    /// whether they ended, rest in a warm pool or run detached.
    pub fn to_confirm(&self) -> Vec<String> {
        self.by_id
            .iter()
            .filter(|(_, left)| !left.ended)
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// What AWS said of instances [`Self::to_confirm`] named: `ended` ended, `not_ended`
    /// did not (in a warm pool, in another group, detached and running) and are
    /// forgotten. Those in neither stay to confirm.
    pub fn confirm(&mut self, ended: &[String], not_ended: &[String]) {
        for id in ended {
            if let Some(left) = self.by_id.get_mut(id) {
                left.ended = true;
            }
        }
        for id in not_ended {
            self.by_id.remove(id);
        }
    }

    /// The group the instance left, if it ended within [`KEEP`].
    pub fn group_of(&self, instance_id: &str) -> Option<&str> {
        self.by_id
            .get(instance_id)
            .filter(|left| left.ended)
            .map(|left| left.group.as_str())
    }

    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cloud::{AsgInstance, AsgSnapshot, LifecycleState};
    use crate::provider::Group;

    fn registry(groups: &[(&str, &[&str])]) -> Registry {
        registry_in(LifecycleState::InService, groups)
    }

    fn registry_in(state: LifecycleState, groups: &[(&str, &[&str])]) -> Registry {
        Registry::new(
            groups
                .iter()
                .map(|(name, ids)| Group {
                    asg: AsgSnapshot {
                        name: name.to_string(),
                        instances: ids
                            .iter()
                            .map(|id| AsgInstance {
                                id: id.to_string(),
                                zone: "us-east-1a".into(),
                                state: state.clone(),
                                instance_type: None,
                            })
                            .collect(),
                        min_size: 0,
                        max_size: 10,
                        desired_capacity: ids.len() as i32,
                        availability_zones: Vec::new(),
                        tags: Default::default(),
                        launch: Default::default(),
                        terminating_hooks: Vec::new(),
                        warm_pool: None,
                    },
                    min: 0,
                    max: 10,
                    failures: Vec::new(),
                    last_launch_unix: None,
                    hooks: Vec::new(),
                    warnings: Vec::new(),
                })
                .collect(),
        )
    }

    #[test]
    fn an_instance_that_left_is_known_by_its_group_until_keep_passes() {
        let t0 = Instant::now();
        let mut d = Departed::default();
        let before = registry_in(
            LifecycleState::Terminating,
            &[("web", &["i-1", "i-2"]), ("batch", &["i-3"])],
        );
        let after = registry(&[("web", &["i-2"]), ("batch", &["i-3"])]);
        d.note(&before, &after, t0);
        assert_eq!(d.group_of("i-1"), Some("web"), "last seen ending");
        assert!(d.to_confirm().is_empty());
        assert_eq!(d.group_of("i-2"), None, "still in its group");
        assert_eq!(d.group_of("i-9"), None, "never seen");
        // Later snapshots without it keep its first time.
        d.note(&after, &after, t0 + KEEP - Duration::from_secs(1));
        assert_eq!(d.group_of("i-1"), Some("web"));
        d.note(&after, &after, t0 + KEEP);
        assert_eq!(d.group_of("i-1"), None, "forgotten after KEEP");
    }

    #[test]
    fn an_instance_back_in_a_group_is_forgotten() {
        let t0 = Instant::now();
        let mut d = Departed::default();
        let before = registry(&[("web", &["i-1"]), ("batch", &[])]);
        let gone = registry(&[("web", &[]), ("batch", &[])]);
        let attached = registry(&[("web", &[]), ("batch", &["i-1"])]);
        d.note(&before, &gone, t0);
        d.confirm(&["i-1".into()], &[]);
        assert_eq!(d.group_of("i-1"), Some("web"));
        d.note(&gone, &attached, t0);
        assert_eq!(d.group_of("i-1"), None);
    }

    #[test]
    fn the_memory_is_bounded_oldest_first() {
        let t0 = Instant::now();
        let mut d = Departed::default();
        let ids: Vec<String> = (0..MAX + 3).map(|n| format!("i-{n}")).collect();
        let empty = registry(&[("web", &[])]);
        for (n, chunk) in ids.chunks(1000).enumerate() {
            let refs: Vec<&str> = chunk.iter().map(String::as_str).collect();
            let before = registry_in(LifecycleState::Terminated, &[("web", &refs)]);
            d.note(&before, &empty, t0 + Duration::from_millis(n as u64));
        }
        assert_eq!(d.len(), MAX);
        assert_eq!(d.group_of("i-0"), None, "the oldest went first");
        assert_eq!(d.group_of(&format!("i-{}", MAX + 2)), Some("web"));
    }

    /// An instance that left its group without being seen ending maps to no group
    /// until AWS says it ended: one that went to the warm pool, or was detached,
    /// never does (issue 59: a pool instance's NotReady Node counted in its group).
    #[test]
    fn an_instance_that_left_without_being_seen_ending_waits_for_aws() {
        let t0 = Instant::now();
        let mut d = Departed::default();
        let before = registry(&[("web", &["i-pool", "i-gone", "i-detached", "i-ask"])]);
        let after = registry(&[("web", &[])]);
        d.note(&before, &after, t0);
        for id in ["i-pool", "i-gone", "i-detached", "i-ask"] {
            assert_eq!(d.group_of(id), None, "{id}: not confirmed yet");
        }
        assert_eq!(d.to_confirm().len(), 4);
        d.confirm(&["i-gone".into()], &["i-pool".into(), "i-detached".into()]);
        assert_eq!(d.group_of("i-gone"), Some("web"), "AWS says it ended");
        assert_eq!(d.group_of("i-pool"), None);
        assert_eq!(d.group_of("i-detached"), None);
        assert_eq!(
            d.to_confirm(),
            vec!["i-ask".to_string()],
            "left to ask again"
        );
        // A later snapshot does not bring back what AWS said did not end.
        d.note(&after, &after, t0 + Duration::from_secs(1));
        assert_eq!(d.group_of("i-pool"), None);
        assert_eq!(d.len(), 2);
    }
}

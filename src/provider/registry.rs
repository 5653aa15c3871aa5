//! The node-group registry: an immutable snapshot of every managed ASG, indexed by
//! name and by instance id, swapped whole on each refresh. Pure.

use std::collections::{BTreeMap, HashMap};

use crate::cloud::{AsgSnapshot, LaunchFailure, LifecycleHook};

/// Operator bounds for a static group (`--nodes=min:max:name`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    pub min: Option<i32>,
    pub max: Option<i32>,
}

/// One managed group as the core sees it.
#[derive(Debug, Clone)]
pub struct Group {
    pub asg: AsgSnapshot,
    /// Effective bounds: the operator's, inside the ASG's own.
    pub min: i32,
    pub max: i32,
    /// Recent failed launches, newest first.
    pub failures: Vec<LaunchFailure>,
    /// Start of the newest launch activity (any status) in the group's scaling
    /// activities, when they were read: the last increase as AWS saw it.
    pub last_launch_unix: Option<i64>,
    /// EC2_INSTANCE_TERMINATING hooks (lifecycle-mode scale-in when non-empty).
    pub hooks: Vec<LifecycleHook>,
    /// Problems found while building this group (bounds clamped, ...).
    pub warnings: Vec<String>,
}

impl Group {
    /// Instances that fill a slot of the desired capacity: not on their way out, not
    /// in Standby.
    pub fn live_instances(&self) -> i32 {
        self.asg.instances_filling_slots()
    }

    /// A zone for placeholders: the first of the ASG's zones.
    pub fn placeholder_zone(&self) -> &str {
        self.asg
            .availability_zones
            .first()
            .map(String::as_str)
            .unwrap_or("unknown")
    }

    pub fn debug(&self) -> String {
        format!(
            "ASG {} (min {} max {} desired {} instances {})",
            self.asg.name,
            self.min,
            self.max,
            self.asg.desired_capacity,
            self.asg.instances.len()
        )
    }
}

/// Effective bounds: operator values clamped into the ASG's own range. Returns a
/// warning naming the group and the numbers when clamping happened.
pub fn effective_bounds(asg: &AsgSnapshot, bounds: Option<Bounds>) -> (i32, i32, Vec<String>) {
    let mut warnings = Vec::new();
    let Some(b) = bounds else {
        return (asg.min_size, asg.max_size, warnings);
    };
    let mut min = b.min.unwrap_or(asg.min_size);
    let mut max = b.max.unwrap_or(asg.max_size);
    if min < asg.min_size {
        warnings.push(format!(
            "group {}: configured minSize {min} is below the ASG's MinSize {}; using {}",
            asg.name, asg.min_size, asg.min_size
        ));
        min = asg.min_size;
    }
    if max > asg.max_size {
        warnings.push(format!(
            "group {}: configured maxSize {max} is above the ASG's MaxSize {}; using {}",
            asg.name, asg.max_size, asg.max_size
        ));
        max = asg.max_size;
    }
    if min > max {
        warnings.push(format!(
            "group {}: minSize {min} > maxSize {max} after clamping to the ASG's bounds; using minSize {max}",
            asg.name
        ));
        min = max;
    }
    (min, max, warnings)
}

/// Every group, by name and by instance id.
#[derive(Debug, Default)]
pub struct Registry {
    pub groups: Vec<Group>,
    by_name: HashMap<String, usize>,
    by_instance: HashMap<String, usize>,
}

impl Registry {
    pub fn new(mut groups: Vec<Group>) -> Self {
        groups.sort_by(|a, b| a.asg.name.cmp(&b.asg.name));
        let mut by_name = HashMap::with_capacity(groups.len());
        let mut by_instance = HashMap::new();
        for (i, g) in groups.iter().enumerate() {
            by_name.insert(g.asg.name.clone(), i);
            for inst in &g.asg.instances {
                by_instance.insert(inst.id.clone(), i);
            }
        }
        Self {
            groups,
            by_name,
            by_instance,
        }
    }

    pub fn group(&self, name: &str) -> Option<&Group> {
        self.by_name.get(name).map(|&i| &self.groups[i])
    }

    pub fn group_of_instance(&self, instance_id: &str) -> Option<&Group> {
        self.by_instance.get(instance_id).map(|&i| &self.groups[i])
    }

    pub fn instance_count(&self) -> usize {
        self.by_instance.len()
    }

    /// Group name -> ASG desired capacity, to notice changes between snapshots.
    pub fn desired(&self) -> BTreeMap<&str, i32> {
        self.groups
            .iter()
            .map(|g| (g.asg.name.as_str(), g.asg.desired_capacity))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cloud::{AsgInstance, LaunchSpec, LifecycleState};

    fn asg(name: &str, min: i32, max: i32, ids: &[&str]) -> AsgSnapshot {
        AsgSnapshot {
            name: name.into(),
            min_size: min,
            max_size: max,
            desired_capacity: ids.len() as i32,
            availability_zones: vec!["us-east-1a".into()],
            tags: Default::default(),
            launch: LaunchSpec::Unknown,
            instances: ids
                .iter()
                .map(|id| AsgInstance {
                    id: id.to_string(),
                    zone: "us-east-1a".into(),
                    state: LifecycleState::InService,
                    instance_type: None,
                })
                .collect(),
            terminating_hooks: vec![],
            warm_pool: None,
        }
    }

    fn group(a: AsgSnapshot) -> Group {
        Group {
            min: a.min_size,
            max: a.max_size,
            asg: a,
            failures: vec![],
            last_launch_unix: None,
            hooks: vec![],
            warnings: vec![],
        }
    }

    #[test]
    fn indexes_by_name_and_instance() {
        let r = Registry::new(vec![
            group(asg("b", 0, 3, &["i-2", "i-3"])),
            group(asg("a", 0, 3, &["i-1"])),
        ]);
        assert_eq!(r.groups[0].asg.name, "a");
        assert_eq!(r.group("b").unwrap().asg.name, "b");
        assert_eq!(r.group_of_instance("i-3").unwrap().asg.name, "b");
        assert_eq!(r.group_of_instance("i-1").unwrap().asg.name, "a");
        assert!(r.group_of_instance("i-9").is_none());
        assert!(r.group("c").is_none());
        assert_eq!(r.instance_count(), 3);
    }

    #[test]
    fn bounds_default_to_the_asg() {
        let a = asg("a", 1, 10, &[]);
        assert_eq!(effective_bounds(&a, None), (1, 10, vec![]));
        assert_eq!(
            effective_bounds(
                &a,
                Some(Bounds {
                    min: Some(2),
                    max: Some(5)
                })
            )
            .0,
            2
        );
    }

    #[test]
    fn bounds_outside_the_asg_are_clamped_with_a_warning() {
        let a = asg("a", 1, 10, &[]);
        let (min, max, w) = effective_bounds(
            &a,
            Some(Bounds {
                min: Some(0),
                max: Some(20),
            }),
        );
        assert_eq!((min, max), (1, 10));
        assert_eq!(w.len(), 2);
        assert!(
            w[0].contains("minSize 0") && w[0].contains("MinSize 1"),
            "{w:?}"
        );
        assert!(
            w[1].contains("maxSize 20") && w[1].contains("MaxSize 10"),
            "{w:?}"
        );
        let (min, max, w) = effective_bounds(
            &a,
            Some(Bounds {
                min: Some(8),
                max: Some(4),
            }),
        );
        assert_eq!((min, max), (4, 4));
        assert_eq!(w.len(), 1);
    }
}

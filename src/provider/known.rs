//! What the provider knows of each instance that its group's snapshot does not say,
//! in one record per instance ([`Known`]): that this service ends it, that a direct-mode
//! drain will end it (so CA's target leaves it out already), which group a background
//! lookup found it in, and which group it left. Pure: the caller passes the time and
//! what AWS said. Each fact ends by its own rule; an instance with no fact left is
//! forgotten, so the record holds only instances something is still known of.
//!
//! ## Instances that left their group's snapshot
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
//! ([`Known::to_confirm`], [`Known::confirm_departures`], done by the refresh).

use std::collections::BTreeMap;
use std::time::Duration;

use crate::clock::Instant;

use super::Registry;

/// How long a departed instance is remembered: longer than CA's cache of instance
/// lists is refreshed (2 minutes) and trusted (5 minutes).
pub const KEEP: Duration = Duration::from_secs(10 * 60);

/// At most this many departed instances are remembered (the oldest go first): a
/// scale-in of thousands of nodes at once stays bounded.
pub const MAX: usize = 50_000;

/// How long a direct-mode drain registered here may wait to be seen as a Node mark.
pub const UNCONFIRMED_TTL: Duration = Duration::from_secs(120);

/// One pending direct-mode drain: the instance still counts in AWS's desired
/// capacity, not in CA's target.
#[derive(Debug, Clone)]
pub struct Deferred {
    pub group: String,
    /// Seen as a mark on its Node. An unconfirmed entry (registered by DeleteNodes,
    /// mark not read back yet) is kept until confirmed or [`UNCONFIRMED_TTL`] passes.
    pub confirmed: bool,
    pub since: Instant,
}

#[derive(Debug)]
struct Left {
    /// The group it left.
    group: String,
    /// When it was first missed.
    at: Instant,
    /// Known to have ended: last seen ending, or confirmed with AWS.
    ended: bool,
}

/// Everything known of one instance beyond the snapshot.
#[derive(Debug, Default)]
struct Record {
    /// This service ended it (or is ending it), until AWS shows it terminating.
    ending: bool,
    /// A direct-mode drain that has not terminated it yet.
    deferred: Option<Deferred>,
    /// The group a background lookup found it in, and when, until a snapshot shows it.
    located: Option<(String, Instant)>,
    /// The group whose snapshot it left.
    left: Option<Left>,
}

impl Record {
    fn is_empty(&self) -> bool {
        !self.ending && self.deferred.is_none() && self.located.is_none() && self.left.is_none()
    }
}

/// One record per instance ([`Record`]), each fact with its own end.
#[derive(Debug, Default)]
pub struct Known {
    by_id: BTreeMap<String, Record>,
    /// How many records hold a pending drain, by group: CA's target of every group is
    /// read each CA loop, without a walk over every record.
    deferred_by_group: BTreeMap<String, usize>,
}

impl Known {
    fn record(&mut self, id: &str) -> &mut Record {
        self.by_id.entry(id.to_string()).or_default()
    }

    /// Keeps only the records `keep` says yes to for one fact (`clear` takes the fact
    /// away), forgetting records left with nothing.
    fn retain_fact(
        &mut self,
        mut has: impl FnMut(&Record) -> bool,
        mut keep: impl FnMut(&str, &Record) -> bool,
        mut clear: impl FnMut(&mut Record),
    ) {
        self.by_id.retain(|id, r| {
            if has(r) && !keep(id, r) {
                clear(r);
            }
            !r.is_empty()
        });
    }

    fn tidy(&mut self, id: &str) {
        if self.by_id.get(id).is_some_and(Record::is_empty) {
            self.by_id.remove(id);
        }
    }

    /// Records held, for the bound tests.
    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    // --- Ending: instances this service ended ---

    /// This service ended the instance (or is ending it).
    pub fn note_ending(&mut self, id: &str) {
        self.record(id).ending = true;
    }

    /// Keeps the ending note of the instances `still` says AWS does not show ending yet.
    pub fn keep_ending(&mut self, mut still: impl FnMut(&str) -> bool) {
        self.retain_fact(|r| r.ending, |id, _| still(id), |r| r.ending = false);
    }

    /// Ended by this service, or to be ended by a direct-mode drain.
    pub fn is_deleting(&self, id: &str) -> bool {
        self.by_id
            .get(id)
            .is_some_and(|r| r.ending || r.deferred.is_some())
    }

    /// Ended by this service, until AWS shows it.
    pub fn is_ending(&self, id: &str) -> bool {
        self.by_id.get(id).is_some_and(|r| r.ending)
    }

    // --- Deferred: direct-mode drains not terminated yet ---

    pub fn deferred(&self, id: &str) -> Option<&Deferred> {
        self.by_id.get(id).and_then(|r| r.deferred.as_ref())
    }

    /// The instance's pending drain, made by `make` when there is none.
    pub fn defer(&mut self, id: &str, make: impl FnOnce() -> Deferred) -> &mut Deferred {
        let r = self.by_id.entry(id.to_string()).or_default();
        if r.deferred.is_none() {
            let d = make();
            *self.deferred_by_group.entry(d.group.clone()).or_default() += 1;
            r.deferred = Some(d);
        }
        r.deferred.as_mut().expect("set above")
    }

    fn count_out(&mut self, d: &Deferred) {
        if let Some(n) = self.deferred_by_group.get_mut(&d.group) {
            *n -= 1;
            if *n == 0 {
                self.deferred_by_group.remove(&d.group);
            }
        }
    }

    /// Takes the pending drain away (terminated, abandoned, ended elsewhere).
    pub fn take_deferred(&mut self, id: &str) -> Option<Deferred> {
        let d = self.by_id.get_mut(id).and_then(|r| r.deferred.take());
        self.tidy(id);
        if let Some(d) = &d {
            self.count_out(d);
        }
        d
    }

    /// Keeps the pending drains `keep` says yes to.
    pub fn keep_deferred(&mut self, mut keep: impl FnMut(&str, &Deferred) -> bool) {
        self.retain_fact(
            |r| r.deferred.is_some(),
            |id, r| r.deferred.as_ref().is_some_and(|d| keep(id, d)),
            |r| r.deferred = None,
        );
        self.deferred_by_group.clear();
        for d in self.by_id.values().filter_map(|r| r.deferred.as_ref()) {
            *self.deferred_by_group.entry(d.group.clone()).or_default() += 1;
        }
    }

    /// The pending drains of `group`.
    pub fn deferred_in(&self, group: &str) -> usize {
        self.deferred_by_group.get(group).copied().unwrap_or(0)
    }

    // --- Located: found by a background lookup ---

    pub fn locate(&mut self, id: &str, group: String, now: Instant) {
        self.record(id).located = Some((group, now));
    }

    /// The group a lookup found the instance in.
    pub fn located(&self, id: &str) -> Option<&str> {
        self.by_id
            .get(id)
            .and_then(|r| r.located.as_ref())
            .map(|(g, _)| g.as_str())
    }

    /// Keeps the lookups `keep` says yes to (given when each was made).
    pub fn keep_located(&mut self, mut keep: impl FnMut(&str, Instant) -> bool) {
        self.retain_fact(
            |r| r.located.is_some(),
            |id, r| r.located.as_ref().is_some_and(|(_, at)| keep(id, *at)),
            |r| r.located = None,
        );
    }

    // --- Departed: instances that left their group's snapshot ---

    /// Notes every instance of `old` that `new` no longer holds in any group (ended
    /// when it was last seen ending, else to confirm), forgets those `new` holds again
    /// and those older than [`KEEP`].
    pub fn note_departures(&mut self, old: &Registry, new: &Registry, now: Instant) {
        for g in &old.groups {
            for i in &g.asg.instances {
                if new.group_of_instance(&i.id).is_none() {
                    let r = self.by_id.entry(i.id.clone()).or_default();
                    if r.left.is_none() {
                        r.left = Some(Left {
                            group: g.asg.name.clone(),
                            at: now,
                            ended: i.state.is_terminating(),
                        });
                    }
                }
            }
        }
        self.retain_fact(
            |r| r.left.is_some(),
            |id, r| {
                new.group_of_instance(id).is_none()
                    && r.left
                        .as_ref()
                        .is_some_and(|l| now.saturating_duration_since(l.at) < KEEP)
            },
            |r| r.left = None,
        );
        let departed = self.departed();
        if departed > MAX {
            let mut ages: Vec<(Instant, String)> = self
                .by_id
                .iter()
                .filter_map(|(id, r)| r.left.as_ref().map(|l| (l.at, id.clone())))
                .collect();
            ages.sort();
            let extra = departed - MAX;
            let oldest: std::collections::BTreeSet<String> =
                ages.into_iter().take(extra).map(|(_, id)| id).collect();
            self.retain_fact(
                |r| r.left.is_some(),
                |id, _| !oldest.contains(id),
                |r| r.left = None,
            );
        }
    }

    /// The instances that left their group without being seen ending: to ask AWS
    /// whether they ended, rest in a warm pool or run detached.
    pub fn to_confirm(&self) -> Vec<String> {
        self.by_id
            .iter()
            .filter(|(_, r)| r.left.as_ref().is_some_and(|l| !l.ended))
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// What AWS said of instances [`Self::to_confirm`] named: `ended` ended, `not_ended`
    /// did not (in a warm pool, in another group, detached and running) and are
    /// forgotten. Those in neither stay to confirm.
    pub fn confirm_departures(&mut self, ended: &[String], not_ended: &[String]) {
        for id in ended {
            if let Some(l) = self.by_id.get_mut(id).and_then(|r| r.left.as_mut()) {
                l.ended = true;
            }
        }
        for id in not_ended {
            if let Some(r) = self.by_id.get_mut(id) {
                r.left = None;
            }
            self.tidy(id);
        }
    }

    /// The group the instance left, if it ended within [`KEEP`].
    pub fn group_left(&self, id: &str) -> Option<&str> {
        self.by_id
            .get(id)
            .and_then(|r| r.left.as_ref())
            .filter(|l| l.ended)
            .map(|l| l.group.as_str())
    }

    /// How many departures are remembered.
    pub fn departed(&self) -> usize {
        self.by_id.values().filter(|r| r.left.is_some()).count()
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
        let mut d = Known::default();
        let before = registry_in(
            LifecycleState::Terminating,
            &[("web", &["i-1", "i-2"]), ("batch", &["i-3"])],
        );
        let after = registry(&[("web", &["i-2"]), ("batch", &["i-3"])]);
        d.note_departures(&before, &after, t0);
        assert_eq!(d.group_left("i-1"), Some("web"), "last seen ending");
        assert!(d.to_confirm().is_empty());
        assert_eq!(d.group_left("i-2"), None, "still in its group");
        assert_eq!(d.group_left("i-9"), None, "never seen");
        // Later snapshots without it keep its first time.
        d.note_departures(&after, &after, t0 + KEEP - Duration::from_secs(1));
        assert_eq!(d.group_left("i-1"), Some("web"));
        d.note_departures(&after, &after, t0 + KEEP);
        assert_eq!(d.group_left("i-1"), None, "forgotten after KEEP");
    }

    #[test]
    fn an_instance_back_in_a_group_is_forgotten() {
        let t0 = Instant::now();
        let mut d = Known::default();
        let before = registry(&[("web", &["i-1"]), ("batch", &[])]);
        let gone = registry(&[("web", &[]), ("batch", &[])]);
        let attached = registry(&[("web", &[]), ("batch", &["i-1"])]);
        d.note_departures(&before, &gone, t0);
        d.confirm_departures(&["i-1".into()], &[]);
        assert_eq!(d.group_left("i-1"), Some("web"));
        d.note_departures(&gone, &attached, t0);
        assert_eq!(d.group_left("i-1"), None);
    }

    #[test]
    fn the_memory_is_bounded_oldest_first() {
        let t0 = Instant::now();
        let mut d = Known::default();
        let ids: Vec<String> = (0..MAX + 3).map(|n| format!("i-{n}")).collect();
        let empty = registry(&[("web", &[])]);
        for (n, chunk) in ids.chunks(1000).enumerate() {
            let refs: Vec<&str> = chunk.iter().map(String::as_str).collect();
            let before = registry_in(LifecycleState::Terminated, &[("web", &refs)]);
            d.note_departures(&before, &empty, t0 + Duration::from_millis(n as u64));
        }
        assert_eq!(d.departed(), MAX);
        assert_eq!(d.group_left("i-0"), None, "the oldest went first");
        assert_eq!(d.group_left(&format!("i-{}", MAX + 2)), Some("web"));
    }

    /// An instance that left its group without being seen ending maps to no group
    /// until AWS says it ended: one that went to the warm pool, or was detached,
    /// never does (issue 59: a pool instance's NotReady Node counted in its group).
    #[test]
    fn an_instance_that_left_without_being_seen_ending_waits_for_aws() {
        let t0 = Instant::now();
        let mut d = Known::default();
        let before = registry(&[("web", &["i-pool", "i-gone", "i-detached", "i-ask"])]);
        let after = registry(&[("web", &[])]);
        d.note_departures(&before, &after, t0);
        for id in ["i-pool", "i-gone", "i-detached", "i-ask"] {
            assert_eq!(d.group_left(id), None, "{id}: not confirmed yet");
        }
        assert_eq!(d.to_confirm().len(), 4);
        d.confirm_departures(&["i-gone".into()], &["i-pool".into(), "i-detached".into()]);
        assert_eq!(d.group_left("i-gone"), Some("web"), "AWS says it ended");
        assert_eq!(d.group_left("i-pool"), None);
        assert_eq!(d.group_left("i-detached"), None);
        assert_eq!(
            d.to_confirm(),
            vec!["i-ask".to_string()],
            "left to ask again"
        );
        // A later snapshot does not bring back what AWS said did not end.
        d.note_departures(&after, &after, t0 + Duration::from_secs(1));
        assert_eq!(d.group_left("i-pool"), None);
        assert_eq!(d.departed(), 2);
    }

    /// The one record against the four memories it replaced (a set of instances we
    /// ended, a map of pending drains, a map of lookups, the departures), each kept
    /// by its own old rule: after every step of any order of every event, both answer
    /// every question alike, and the record keeps no instance nothing is known of.
    mod model {
        use super::*;
        use std::collections::{BTreeMap, BTreeSet};

        const IDS: [&str; 4] = ["i-0", "i-1", "i-2", "i-3"];
        const GROUPS: [&str; 2] = ["web", "batch"];

        #[derive(Debug, Clone)]
        enum Step {
            NoteEnding(usize),
            KeepEnding(u8),
            Defer(usize, usize, bool),
            TakeDeferred(usize),
            KeepDeferred(u8),
            Locate(usize, usize),
            KeepLocated(u8),
            /// Per instance: in which group before (with its state ending or not), in
            /// which group after; then the clock moves on by so many minutes.
            Snapshot([Option<(usize, bool)>; 4], [Option<usize>; 4], u8),
            Confirm(u8, u8),
        }

        #[derive(Default)]
        struct Old {
            deleting: BTreeSet<String>,
            deferred: BTreeMap<String, String>,
            located: BTreeMap<String, String>,
            departed: BTreeMap<String, (String, Instant, bool)>,
        }

        fn step() -> impl proptest::strategy::Strategy<Value = Step> {
            use proptest::prelude::*;
            let i = 0..IDS.len();
            let g = 0..GROUPS.len();
            let before = proptest::option::of((0..GROUPS.len(), any::<bool>()));
            let after = proptest::option::of(0..GROUPS.len());
            prop_oneof![
                i.clone().prop_map(Step::NoteEnding),
                any::<u8>().prop_map(Step::KeepEnding),
                (i.clone(), g.clone(), any::<bool>()).prop_map(|(i, g, c)| Step::Defer(i, g, c)),
                i.clone().prop_map(Step::TakeDeferred),
                any::<u8>().prop_map(Step::KeepDeferred),
                (i.clone(), g).prop_map(|(i, g)| Step::Locate(i, g)),
                any::<u8>().prop_map(Step::KeepLocated),
                (
                    [before.clone(), before.clone(), before.clone(), before],
                    [after.clone(), after.clone(), after.clone(), after],
                    0u8..12
                )
                    .prop_map(|(b, a, m)| Step::Snapshot(b, a, m)),
                (any::<u8>(), any::<u8>()).prop_map(|(e, n)| Step::Confirm(e, n)),
            ]
        }

        fn picked(mask: u8) -> impl Fn(&str) -> bool {
            move |id: &str| {
                let n = IDS.iter().position(|i| *i == id).unwrap_or(0);
                mask & (1 << n) != 0
            }
        }

        fn registry_of(members: &[(usize, usize, bool)]) -> Registry {
            let mut r = registry(&[("web", &[]), ("batch", &[])]);
            for (i, g, ending) in members {
                let group = r
                    .groups
                    .iter_mut()
                    .find(|x| x.asg.name == GROUPS[*g])
                    .unwrap();
                group.asg.instances.push(AsgInstance {
                    id: IDS[*i].to_string(),
                    zone: "us-east-1a".into(),
                    state: if *ending {
                        LifecycleState::Terminating
                    } else {
                        LifecycleState::InService
                    },
                    instance_type: None,
                });
            }
            Registry::new(r.groups)
        }

        proptest::proptest! {
            #![proptest_config(proptest::prelude::ProptestConfig {
                cases: 1000,
                failure_persistence: None,
                ..Default::default()
            })]

            #[test]
            fn the_one_record_answers_as_the_four_memories_did(
                steps in proptest::collection::vec(step(), 1..60)
            ) {
                let mut known = Known::default();
                let mut old = Old::default();
                let mut now = Instant::now();
                for st in &steps {
                    match st {
                        Step::NoteEnding(i) => {
                            known.note_ending(IDS[*i]);
                            old.deleting.insert(IDS[*i].into());
                        }
                        Step::KeepEnding(m) => {
                            known.keep_ending(picked(*m));
                            old.deleting.retain(|id| picked(*m)(id));
                        }
                        Step::Defer(i, g, confirmed) => {
                            let d = known.defer(IDS[*i], || Deferred {
                                group: GROUPS[*g].into(),
                                confirmed: false,
                                since: now,
                            });
                            d.confirmed |= *confirmed;
                            old.deferred.entry(IDS[*i].into()).or_insert_with(|| GROUPS[*g].into());
                        }
                        Step::TakeDeferred(i) => {
                            let got = known.take_deferred(IDS[*i]).map(|d| d.group);
                            proptest::prop_assert_eq!(got, old.deferred.remove(IDS[*i]));
                        }
                        Step::KeepDeferred(m) => {
                            known.keep_deferred(|id, _| picked(*m)(id));
                            old.deferred.retain(|id, _| picked(*m)(id));
                        }
                        Step::Locate(i, g) => {
                            known.locate(IDS[*i], GROUPS[*g].into(), now);
                            old.located.insert(IDS[*i].into(), GROUPS[*g].into());
                        }
                        Step::KeepLocated(m) => {
                            known.keep_located(|id, _| picked(*m)(id));
                            old.located.retain(|id, _| picked(*m)(id));
                        }
                        Step::Snapshot(before, after, minutes) => {
                            let b: Vec<_> = before.iter().enumerate()
                                .filter_map(|(i, x)| x.map(|(g, e)| (i, g, e))).collect();
                            let a: Vec<_> = after.iter().enumerate()
                                .filter_map(|(i, x)| x.map(|g| (i, g, false))).collect();
                            let (rb, ra) = (registry_of(&b), registry_of(&a));
                            known.note_departures(&rb, &ra, now);
                            for (i, g, ending) in &b {
                                if ra.group_of_instance(IDS[*i]).is_none() {
                                    old.departed.entry(IDS[*i].into())
                                        .or_insert((GROUPS[*g].into(), now, *ending));
                                }
                            }
                            old.departed.retain(|id, (_, at, _)| {
                                ra.group_of_instance(id).is_none()
                                    && now.saturating_duration_since(*at) < KEEP
                            });
                            now += Duration::from_secs(60 * u64::from(*minutes));
                        }
                        Step::Confirm(e, n) => {
                            let ended: Vec<String> = IDS.iter().filter(|i| picked(*e)(i)).map(|i| i.to_string()).collect();
                            let not_ended: Vec<String> = IDS.iter().filter(|i| picked(*n)(i)).map(|i| i.to_string()).collect();
                            known.confirm_departures(&ended, &not_ended);
                            for id in &ended {
                                if let Some(d) = old.departed.get_mut(id) {
                                    d.2 = true;
                                }
                            }
                            for id in &not_ended {
                                old.departed.remove(id);
                            }
                        }
                    }
                    for id in IDS {
                        proptest::prop_assert_eq!(known.is_ending(id), old.deleting.contains(id), "{} ending after {:?}", id, st);
                        proptest::prop_assert_eq!(
                            known.is_deleting(id),
                            old.deleting.contains(id) || old.deferred.contains_key(id)
                        );
                        proptest::prop_assert_eq!(known.deferred(id).map(|d| d.group.as_str()), old.deferred.get(id).map(String::as_str));
                        proptest::prop_assert_eq!(known.located(id), old.located.get(id).map(String::as_str));
                        proptest::prop_assert_eq!(
                            known.group_left(id),
                            old.departed.get(id).filter(|d| d.2).map(|d| d.0.as_str()),
                            "{} left after {:?}", id, st
                        );
                    }
                    for g in GROUPS {
                        proptest::prop_assert_eq!(known.deferred_in(g), old.deferred.values().filter(|x| *x == g).count());
                    }
                    let to_confirm: Vec<String> = old.departed.iter().filter(|(_, d)| !d.2).map(|(id, _)| id.clone()).collect();
                    proptest::prop_assert_eq!(known.to_confirm(), to_confirm);
                    proptest::prop_assert_eq!(known.departed(), old.departed.len());
                    let anything: BTreeSet<&String> = old.deleting.iter()
                        .chain(old.deferred.keys()).chain(old.located.keys()).chain(old.departed.keys()).collect();
                    proptest::prop_assert_eq!(known.len(), anything.len(), "a record of nothing is kept");
                }
            }
        }
    }
}

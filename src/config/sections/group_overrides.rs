//! `scaleIn.groupOverrides:`: settings a group takes instead of the cluster's, each
//! read whole or refused whole (half an override would give a group settings nobody
//! wrote). Every problem names the override's place in the list
//! (`scaleIn.groupOverrides[1].workloadDeadline`) and the value.
//!
//! An override selects groups as a budget does (names or tags, never both) and must
//! select some: one for every group is the cluster's own setting. The first
//! override that selects a group gives its settings; a field it leaves out is the
//! cluster's.

use std::time::Duration;

use super::{bounded_duration, budgets, Problems};
use crate::config::GroupOverrideFile;
use crate::scalein::decide::budget::Groups;
use crate::scalein::decide::record::LIFECYCLE_ACTION_LIMIT;
use crate::scalein::settings::GroupOverride;

/// At most this many overrides (each drain start reads them in order).
pub const MAX_OVERRIDES: usize = 100;

/// `wait_on`: the cluster's `scaleIn.loadBalancers.waitForDeregistration` (a group's
/// `loadBalancers.deregister` needs it).
pub fn resolve(
    list: Option<&[GroupOverrideFile]>,
    wait_on: bool,
    problems: &mut Problems,
) -> Vec<GroupOverride> {
    let list = list.unwrap_or_default();
    if list.len() > MAX_OVERRIDES {
        problems.bad(
            "scaleIn.groupOverrides",
            format!("{} overrides (at most {MAX_OVERRIDES})", list.len()),
        );
        return Vec::new();
    }
    let mut out = Vec::new();
    for (i, file) in list.iter().enumerate() {
        let before = problems.count();
        let o = one(
            &format!("scaleIn.groupOverrides[{i}]"),
            file,
            wait_on,
            problems,
        );
        if problems.count() == before {
            out.push(o);
        }
    }
    out
}

fn one(key: &str, f: &GroupOverrideFile, wait_on: bool, problems: &mut Problems) -> GroupOverride {
    let groups = budgets::groups(key, f.groups.as_ref(), f.group_tags.as_ref(), problems);
    if groups == Groups::All && f.groups.is_none() && f.group_tags.is_none() {
        problems.bad(
            &format!("{key}.groups"),
            "missing: name the groups (groups) or their tags (groupTags); for every group set the scaleIn setting itself".into(),
        );
    }
    let workload_deadline = f.workload_deadline.as_ref().map(|given| {
        bounded_duration(
            problems,
            &format!("{key}.workloadDeadline"),
            Some(given),
            Duration::ZERO,
            Duration::from_secs(1),
            Some(LIFECYCLE_ACTION_LIMIT),
        )
    });
    let deregister = f.load_balancers.as_ref().and_then(|lb| lb.deregister);
    if f.workload_deadline.is_none()
        && f.workload_deadline_policy.is_none()
        && f.wait_for_replacement.is_none()
        && deregister.is_none()
    {
        problems.bad(
            key,
            "overrides nothing: give workloadDeadline, workloadDeadlinePolicy, waitForReplacement or loadBalancers.deregister".into(),
        );
    }
    if deregister == Some(true) && !wait_on {
        problems.bad(
            &format!("{key}.loadBalancers.deregister"),
            "is true while scaleIn.loadBalancers.waitForDeregistration is false: the instance would end while its targets drain".into(),
        );
    }
    GroupOverride {
        groups,
        workload_deadline,
        workload_deadline_policy: f.workload_deadline_policy,
        wait_for_replacement: f.wait_for_replacement,
        deregister,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::time::Duration;

    use super::super::budgets::tests::problems;
    use crate::config::{resolve, FileConfig, Overrides};
    use crate::scalein::decide::budget::Groups;
    use crate::scalein::DeadlinePolicy;

    fn tags(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// Read in order; the first override that selects a group gives its settings, a
    /// field left out is the cluster's, and a group no override selects has the
    /// cluster's.
    #[test]
    fn the_first_override_that_selects_a_group_gives_its_deadline() {
        let file = FileConfig::parse(
            r#"
aws: {region: eu-west-1}
scaleIn:
  workloadDeadline: 10m
  workloadDeadlinePolicy: proceed
  groupOverrides:
    - groups: [batch]
      workloadDeadline: 1h
      workloadDeadlinePolicy: abandon
    - groupTags: {team: web, tier: ""}
      workloadDeadline: 90s
    - groupTags: {team: web}
      workloadDeadlinePolicy: abandon
      waitForReplacement: true
"#,
            "t.yaml",
        )
        .unwrap();
        let c = resolve(file, &Overrides::default(), "t.yaml").unwrap();
        let s = &c.scale_in;
        assert_eq!(s.group_overrides.len(), 3);
        assert!(matches!(&s.group_overrides[0].groups, Groups::Named(n) if n.contains("batch")));
        let none = BTreeMap::new();
        let batch = s.limits_for("batch", &none, None);
        assert_eq!(batch.workload_deadline, Duration::from_secs(3600));
        assert_eq!(batch.workload_policy, DeadlinePolicy::Abandon);
        assert_eq!(batch.hook_room, None);
        // Tagged team=web with any tier: the second, whose policy is the cluster's.
        let web = s.limits_for("web-a", &tags(&[("team", "web"), ("tier", "front")]), None);
        assert_eq!(web.workload_deadline, Duration::from_secs(90));
        assert_eq!(web.workload_policy, DeadlinePolicy::Proceed);
        // team=web without a tier: the third.
        let web = s.limits_for("web-b", &tags(&[("team", "web")]), None);
        assert_eq!(web.workload_deadline, Duration::from_secs(600));
        assert_eq!(web.workload_policy, DeadlinePolicy::Abandon);
        // Nobody's: the cluster's.
        assert_eq!(s.limits_for("other", &none, None), s.limits());
        assert!(s.waits_for_replacement("web-b", &tags(&[("team", "web")])));
        assert!(!s.waits_for_replacement("batch", &none));
        assert!(!s.waits_for_replacement("other", &none));
        // A hold of our hook carries the room its global timeout leaves.
        let held = s.limits_for("batch", &none, Some(Duration::from_secs(30)));
        assert_eq!(held.hook_room, Some(s.hook_room(Duration::from_secs(30))));
        assert!(held.hook_room.unwrap() < held.workload_deadline);
    }

    #[test]
    fn a_wrong_override_is_refused_naming_its_place_field_and_value() {
        let got = problems(
            r#"
aws: {region: eu-west-1}
scaleIn:
  groupOverrides:
    - {workloadDeadline: 5m}
    - {groups: [a], groupTags: {t: x}, workloadDeadline: 5m}
    - {groups: [a]}
    - {groups: [a], workloadDeadline: 0s}
    - {groups: [a], workloadDeadline: 49h}
    - {groups: [], workloadDeadline: 5m}
    - {groups: [a], workloadDeadline: soon}
"#,
        );
        let want = [
            "scaleIn.groupOverrides[0].groups: missing",
            "scaleIn.groupOverrides[1].groupTags: given with groups",
            "scaleIn.groupOverrides[2]: overrides nothing",
            "scaleIn.groupOverrides[3].workloadDeadline: \"0s\"",
            "scaleIn.groupOverrides[4].workloadDeadline: \"49h\"",
            "scaleIn.groupOverrides[5].groups: an empty list",
            "scaleIn.groupOverrides[6].workloadDeadline: \"soon\"",
        ];
        for w in want {
            assert!(
                got.iter().any(|p| p.starts_with(w)),
                "{w}\nnot in\n{got:#?}"
            );
        }
        assert_eq!(got.len(), want.len(), "{got:#?}");
    }

    #[test]
    fn an_unknown_field_of_an_override_is_refused_by_name() {
        let err = FileConfig::parse(
            "scaleIn: {groupOverrides: [{groups: [a], workloadDeadlne: 5m}]}\n",
            "t.yaml",
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("workloadDeadlne"), "{err}");
    }

    /// `loadBalancers.deregister` per group: the first override that selects a group
    /// decides, the cluster's setting otherwise; an override of that alone is one;
    /// refused by place while the cluster's wait is off; an unknown field refused.
    #[test]
    fn a_group_override_sets_deregister_for_its_groups() {
        let file = FileConfig::parse(
            r#"
aws: {region: eu-west-1}
scaleIn:
  loadBalancers: {deregister: false}
  groupOverrides:
    - groups: [web]
      loadBalancers: {deregister: true}
    - groupTags: {tier: stateless}
      loadBalancers: {deregister: false}
    - groupTags: {tier: stateless}
      workloadDeadline: 2m
      loadBalancers: {deregister: true}
"#,
            "t.yaml",
        )
        .expect("parses");
        let c = resolve(file, &Overrides::default(), "t.yaml").expect("valid");
        let s = &c.scale_in;
        let none = BTreeMap::new();
        let stateless = tags(&[("tier", "stateless")]);
        assert!(s.deregisters("web", &none));
        assert!(s.deregisters("web", &stateless), "the first match wins");
        assert!(!s.deregisters("api", &stateless), "the first match wins");
        assert!(!s.deregisters("api", &none), "the cluster's");
        let mut off = s.clone();
        off.load_balancers.enabled = false;
        assert!(!off.deregisters("web", &none), "never without the wait");

        assert_eq!(
            problems(
                "aws: {region: eu-west-1}\nscaleIn:\n  loadBalancers: {waitForDeregistration: false}\n  groupOverrides:\n    - {groups: [web], loadBalancers: {deregister: true}}\n"
            ),
            vec!["scaleIn.groupOverrides[0].loadBalancers.deregister: is true while scaleIn.loadBalancers.waitForDeregistration is false: the instance would end while its targets drain".to_string()]
        );
        assert!(FileConfig::parse(
            "scaleIn: {groupOverrides: [{groups: [web], loadBalancers: {margin: 5s}}]}",
            "t.yaml"
        )
        .is_err());
    }
}

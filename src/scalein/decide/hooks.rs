//! Whose an EC2_INSTANCE_TERMINATING hook on a group is. EKS puts its own
//! `Terminate-LC-Hook` (and `Launch-LC-Hook`, on launch) on every managed node group's
//! ASG, which carries the tags `eks:nodegroup-name` and `eks:cluster-name`. That hook is
//! no second drainer to warn about: an instance waits for every hook on it, EKS's drain
//! evicts through the Eviction API (PodDisruptionBudgets hold) and leaves DaemonSet pods
//! alone, so with this service's hook on the same group the drain's promises hold on
//! top of EKS's. Any other hook (NTH's, another tool's, or an EKS-named one on a group
//! without EKS's tags) is a second drainer. And which of the service's own hooks it may
//! remove at uninstall: only one it recorded creating ([`which_to_remove`]). Pure.

use std::collections::BTreeMap;

use crate::cloud::LifecycleHook;

/// EKS's hook on `autoscaling:EC2_INSTANCE_TERMINATING` of a managed node group.
pub const EKS_TERMINATE_HOOK: &str = "Terminate-LC-Hook";
/// EKS's hook on `autoscaling:EC2_INSTANCE_LAUNCHING` (never among the terminating
/// hooks this service reads; a terminating hook of this name is not EKS's).
pub const EKS_LAUNCH_HOOK: &str = "Launch-LC-Hook";
/// The tags EKS puts on a managed node group's ASG.
pub const EKS_NODEGROUP_TAG: &str = "eks:nodegroup-name";
pub const EKS_CLUSTER_TAG: &str = "eks:cluster-name";

/// Whose a terminating hook is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HookOwner {
    /// This service's (`scaleIn.hookName`).
    Ours,
    /// EKS's own, on a managed node group.
    Eks,
    /// NTH's, another tool's, or one named like EKS's on a group without EKS's tags:
    /// a second drainer.
    Other,
}

/// Whether the group's tags say it is an EKS managed node group (both tags, non-empty).
pub fn is_eks_managed(tags: &BTreeMap<String, String>) -> bool {
    [EKS_NODEGROUP_TAG, EKS_CLUSTER_TAG]
        .iter()
        .all(|k| tags.get(*k).is_some_and(|v| !v.trim().is_empty()))
}

/// Whose the terminating hook `hook` on a group with `tags` is, when this service's
/// hook is named `ours`.
pub fn owner(hook: &str, ours: &str, tags: &BTreeMap<String, String>) -> HookOwner {
    if hook == ours {
        HookOwner::Ours
    } else if hook == EKS_TERMINATE_HOOK && is_eks_managed(tags) {
        HookOwner::Eks
    } else {
        HookOwner::Other
    }
}

/// `managed node group NAME of cluster NAME`, from the tags.
pub fn managed_node_group(tags: &BTreeMap<String, String>) -> String {
    let t = |k| tags.get(k).map(String::as_str).unwrap_or("?");
    format!(
        "managed node group {} of cluster {}",
        t(EKS_NODEGROUP_TAG),
        t(EKS_CLUSTER_TAG)
    )
}

/// What happens with EKS's hook beside this service's (`with_ours`) or without it
/// (direct mode), in one sentence for `check-config` and `serve`.
pub fn eks_hook_explained(
    group: &str,
    tags: &BTreeMap<String, String>,
    ours: &str,
    with_ours: bool,
) -> String {
    let head = format!(
        "group {group}: {EKS_TERMINATE_HOOK:?} is EKS's own hook ({}), not a second drainer",
        managed_node_group(tags)
    );
    if with_ours {
        format!(
            "{head}: an instance waits for every hook on it, so it stays until this service completes {ours:?}; EKS's drain and this one both evict through the Eviction API, so PodDisruptionBudgets hold; EKS does not evict DaemonSet pods, so they still leave last, after the workloads, while {ours:?} holds the instance"
        )
    } else {
        format!(
            "{head}: nodes CA removes are drained by this service (DaemonSet pods last) before it ends the instance, and EKS then finds only DaemonSet pods, which it does not evict; instances ended by anything else (instance refresh, AZ rebalancing, a person) are drained by EKS alone, through the Eviction API (PodDisruptionBudgets hold) but with no DaemonSet-last phase: add this service's hook {ours:?} (scaleIn.createLifecycleHook) to drain those too"
        )
    }
}

/// What `serve` says of a hook on a group without this service's hook (direct mode):
/// `(is_warning, message)`, or None for our own hook.
pub fn direct_mode_note(
    group: &str,
    hook: &str,
    ours: &str,
    tags: &BTreeMap<String, String>,
) -> Option<(bool, String)> {
    match owner(hook, ours, tags) {
        HookOwner::Ours => None,
        HookOwner::Eks => Some((false, eks_hook_explained(group, tags, ours, false))),
        HookOwner::Other => Some((
            true,
            format!(
                "group {group}: another EC2_INSTANCE_TERMINATING hook {hook:?}{}; this service completes only its own ({ours:?}), and another drainer may end instances this one is draining",
                named_like_eks(hook, tags)
            ),
        )),
    }
}

/// Why a hook named like EKS's is not taken for EKS's, or "".
pub fn named_like_eks(hook: &str, tags: &BTreeMap<String, String>) -> &'static str {
    if hook == EKS_TERMINATE_HOOK && !is_eks_managed(tags) {
        " (named like EKS's own, but the group lacks the tags eks:nodegroup-name and eks:cluster-name of a managed node group)"
    } else if hook == EKS_LAUNCH_HOOK {
        " (named like EKS's launch hook, but on the terminating transition)"
    } else {
        ""
    }
}

/// The group tag that records which lifecycle hook this service created on the group:
/// its value is the hook's name. The record is a tag, not the hook's
/// NotificationMetadata, because moto (the AWS the tests run against) drops
/// NotificationMetadata; the tag is read with the group, at no extra call.
pub const HOOK_RECORD_TAG: &str = "ca-asg-provider.io/lifecycle-hook";

/// Whether the group's record says this service created the hook named `hook`: the
/// record's value is exactly that name. Anything else (no record, another name, a
/// value AWS would not hold) is not a record: such a hook is not known to be ours.
pub fn hook_recorded(tags: &BTreeMap<String, String>, hook: &str) -> bool {
    !hook.is_empty() && hook.len() <= 255 && tags.get(HOOK_RECORD_TAG).is_some_and(|v| v == hook)
}

/// What to do with one group's hooks: the pure decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Removal {
    /// No hook with our name. `stale_record`: the group still carries our record,
    /// which is removed (a later hook of that name made by hand is not ours).
    Nothing { stale_record: bool },
    /// Our hook is deleted (and its record). `marked`: the record says we created
    /// it; otherwise `--include-unmarked` asked for it.
    Remove { marked: bool },
    /// A hook with our name but no record: kept, and said how to remove it.
    KeepUnmarked,
}

/// Which of the group's hooks go: only the one named `name`, and only when the group's
/// record says this service created it, or `include_unmarked` asks for one without a
/// record. Hooks of other names are never in the answer.
pub fn which_to_remove(
    hooks: &[LifecycleHook],
    tags: &BTreeMap<String, String>,
    name: &str,
    include_unmarked: bool,
) -> Removal {
    let marked = hook_recorded(tags, name);
    if !hooks.iter().any(|h| h.name == name) {
        return Removal::Nothing {
            stale_record: marked,
        };
    }
    if marked || include_unmarked {
        Removal::Remove { marked }
    } else {
        Removal::KeepUnmarked
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tags(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// Every combination of hook name (ours, EKS's two, NTH's, unknown), each EKS tag
    /// present, absent or empty, and our hook named like EKS's or not.
    #[test]
    fn owner_is_eks_only_for_eks_terminate_hook_on_a_group_with_both_eks_tags() {
        let tag_values = [None, Some(""), Some("x")];
        for ours in ["ca-asg-provider", EKS_TERMINATE_HOOK] {
            for hook in [
                ours,
                EKS_TERMINATE_HOOK,
                EKS_LAUNCH_HOOK,
                "nth-hook",
                "something-else",
            ] {
                for ng in tag_values {
                    for cluster in tag_values {
                        let mut t = tags(&[("k8s.io/cluster-autoscaler/enabled", "true")]);
                        if let Some(v) = ng {
                            t.insert(EKS_NODEGROUP_TAG.into(), v.into());
                        }
                        if let Some(v) = cluster {
                            t.insert(EKS_CLUSTER_TAG.into(), v.into());
                        }
                        let managed = ng == Some("x") && cluster == Some("x");
                        assert_eq!(is_eks_managed(&t), managed, "{t:?}");
                        let want = if hook == ours {
                            HookOwner::Ours
                        } else if hook == EKS_TERMINATE_HOOK && managed {
                            HookOwner::Eks
                        } else {
                            HookOwner::Other
                        };
                        assert_eq!(owner(hook, ours, &t), want, "{hook} ours={ours} {t:?}");
                        let note = direct_mode_note("g", hook, ours, &t);
                        match want {
                            HookOwner::Ours => assert!(note.is_none()),
                            HookOwner::Eks => {
                                let (warn, text) = note.unwrap();
                                assert!(!warn && text.contains("EKS's own hook"), "{text}");
                            }
                            HookOwner::Other => {
                                let (warn, text) = note.unwrap();
                                assert!(warn && text.contains("another drainer"), "{text}");
                                if hook == EKS_TERMINATE_HOOK {
                                    assert!(text.contains("lacks the tags"), "{text}");
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn the_explanation_says_what_holds_with_and_without_our_hook() {
        let t = tags(&[(EKS_NODEGROUP_TAG, "ng-1"), (EKS_CLUSTER_TAG, "prod")]);
        let with = eks_hook_explained("g", &t, "ours", true);
        for s in [
            "managed node group ng-1 of cluster prod",
            "waits for every hook",
            "Eviction API",
            "PodDisruptionBudgets hold",
            "does not evict DaemonSet pods",
            "leave last",
        ] {
            assert!(with.contains(s), "{s:?} not in {with}");
        }
        let without = eks_hook_explained("g", &t, "ours", false);
        assert!(
            without.contains("no DaemonSet-last phase") && without.contains("createLifecycleHook")
        );
    }

    fn removal_hook(name: &str) -> LifecycleHook {
        LifecycleHook {
            name: name.into(),
            heartbeat_timeout_secs: 600,
            default_result: "CONTINUE".into(),
        }
    }

    /// Every combination of: our hook there or not, another hook there or not, the
    /// record (ours, naming another hook, empty, absent), include_unmarked. Only a hook
    /// of our name is ever removed, and only with our record or when asked.
    #[test]
    fn only_our_named_hook_goes_and_only_with_the_record_or_when_asked() {
        const NAME: &str = "ca-asg-provider-drain";
        let records: [Option<&str>; 4] = [Some(NAME), Some("other-hook"), Some(""), None];
        for ours_there in [false, true] {
            for other_there in [false, true] {
                for record in records {
                    for include in [false, true] {
                        let mut hooks = Vec::new();
                        if other_there {
                            hooks.push(removal_hook("Terminate-LC-Hook"));
                        }
                        if ours_there {
                            hooks.push(removal_hook(NAME));
                        }
                        let tags: BTreeMap<String, String> = record
                            .map(|v| (HOOK_RECORD_TAG.to_string(), v.to_string()))
                            .into_iter()
                            .collect();
                        let marked = record == Some(NAME);
                        let got = which_to_remove(&hooks, &tags, NAME, include);
                        let want = match (ours_there, marked, include) {
                            (false, _, _) => Removal::Nothing {
                                stale_record: marked,
                            },
                            (true, true, _) => Removal::Remove { marked: true },
                            (true, false, true) => Removal::Remove { marked: false },
                            (true, false, false) => Removal::KeepUnmarked,
                        };
                        assert_eq!(
                            got, want,
                            "ours {ours_there}, other {other_there}, record {record:?}, include {include}"
                        );
                    }
                }
            }
        }
    }

    /// A hook of another name is never removed, whatever the record says (even a
    /// record naming it) and whatever is asked.
    #[test]
    fn a_foreign_hook_is_never_removed() {
        let hooks = [removal_hook("Terminate-LC-Hook")];
        for record in ["Terminate-LC-Hook", "ca-asg-provider-drain"] {
            let tags = BTreeMap::from([(HOOK_RECORD_TAG.to_string(), record.to_string())]);
            for include in [false, true] {
                assert!(matches!(
                    which_to_remove(&hooks, &tags, "ca-asg-provider-drain", include),
                    Removal::Nothing { .. }
                ));
            }
        }
    }

    /// The record is bounded: an empty name or one longer than AWS's hook names is
    /// never recorded, so never taken as ours.
    #[test]
    fn the_record_fails_closed() {
        let long = "x".repeat(300);
        let tags = BTreeMap::from([(HOOK_RECORD_TAG.to_string(), long.clone())]);
        assert!(!hook_recorded(&tags, &long));
        let empty = BTreeMap::from([(HOOK_RECORD_TAG.to_string(), String::new())]);
        assert!(!hook_recorded(&empty, ""));
        let case = BTreeMap::from([(HOOK_RECORD_TAG.to_string(), "Drain".to_string())]);
        assert!(!hook_recorded(&case, "drain"));
    }
}

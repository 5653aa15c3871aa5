//! Uninstall: remove the EC2_INSTANCE_TERMINATING hooks this service created, so that
//! nothing holds an instance once the service is gone (issue 62). A hook is ours when
//! it has the configured name AND the group's record says this service created it
//! ([`HOOK_RECORD_TAG`]); one with our name but no record (an earlier version's, or
//! made by hand) is kept unless asked for; any other hook is never touched (the
//! decision: [`which_to_remove`]).
//! AWS completes the outstanding actions of a deleted terminating hook with CONTINUE:
//! instances it held go on terminating.

use std::collections::BTreeMap;

use crate::cloud::{Cloud, CloudError, GroupSelector};
use crate::scalein::decide::hooks::{which_to_remove, Removal, HOOK_RECORD_TAG};

/// How `remove-hooks` runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoveOptions {
    /// The hook's name (`scaleIn.hookName`).
    pub name: String,
    pub include_unmarked: bool,
    /// Say what would be removed, remove nothing.
    pub dry_run: bool,
    /// For the `aws` command line printed for a kept hook.
    pub region: String,
}

/// What happened on one group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Removed {
        marked: bool,
        /// The record could not be removed (the hook is gone all the same).
        record_left: Option<String>,
    },
    WouldRemove {
        marked: bool,
    },
    NothingToRemove,
    KeptUnmarked,
    /// A plain sentence: what failed and what to check.
    Failed(String),
}

/// One group's line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupReport {
    pub group: String,
    pub outcome: Outcome,
    /// Terminating hooks of other names on the group, left alone.
    pub others: Vec<String>,
}

impl GroupReport {
    pub fn failed(&self) -> bool {
        matches!(self.outcome, Outcome::Failed(_))
    }

    /// The line printed for the group.
    pub fn line(&self, opts: &RemoveOptions) -> String {
        let name = &opts.name;
        let g = &self.group;
        let mut line = match &self.outcome {
            Outcome::Removed {
                marked,
                record_left,
            } => {
                let mut s = format!(
                    "{g}: removed hook {name} ({}); instances it held go on terminating (AWS continues them)",
                    if *marked {
                        "created by this service"
                    } else {
                        "no record of its creator, removed as --include-unmarked asked"
                    }
                );
                if let Some(why) = record_left {
                    s += &format!("; the group's tag {HOOK_RECORD_TAG} was left: {why}");
                }
                s
            }
            Outcome::WouldRemove { marked } => format!(
                "{g}: would remove hook {name} ({}; dry run: nothing changed)",
                if *marked {
                    "created by this service"
                } else {
                    "no record of its creator, --include-unmarked"
                }
            ),
            Outcome::NothingToRemove => format!("{g}: nothing to remove (no hook named {name})"),
            Outcome::KeptUnmarked => format!(
                "{g}: kept hook {name}: it has this service's name but the group has no record that this service created it (an earlier version, or made by hand). \
                 To remove it: aws autoscaling delete-lifecycle-hook --region {} --auto-scaling-group-name {g} --lifecycle-hook-name {name} (or run again with --include-unmarked)",
                opts.region
            ),
            Outcome::Failed(why) => format!("{g}: FAILED: {why}"),
        };
        if !self.others.is_empty() {
            line += &format!(" [other hooks left alone: {}]", self.others.join(", "));
        }
        line
    }
}

/// An AWS failure as one plain sentence with what to check (never the SDK's
/// Debug text).
pub fn plain(e: &CloudError, doing: &str) -> String {
    match e {
        CloudError::Rejected {
            operation,
            code,
            message,
        } if code.contains("AccessDenied") || code.contains("Unauthorized") => format!(
            "AWS refused {operation} while {doing} ({code}): the IAM role lacks the permission; check that the role has deploy/iam-policy.json attached (autoscaling:DeleteLifecycleHook, CreateOrUpdateTags, DeleteTags on groups tagged k8s.io/cluster-autoscaler/enabled and your cluster's tag). AWS said: {message}"
        ),
        CloudError::Rejected {
            operation,
            code,
            message,
        } => format!("AWS refused {operation} while {doing} ({code}): {message}"),
        CloudError::Throttled { operation, .. } => format!(
            "AWS throttled {operation} while {doing}: run the command again in a minute"
        ),
        CloudError::Transient { operation, .. } => format!(
            "AWS did not answer {operation} while {doing}: check the region, the endpoint and the network from this pod, then run the command again"
        ),
        CloudError::Credentials { operation, hint, .. } => format!(
            "no AWS credentials for {operation} while {doing}: {hint}"
        ),
        CloudError::NotFound { .. } => format!(
            "the group is gone while {doing} (deleted meanwhile): nothing holds its instances"
        ),
    }
}

/// Finds the configured groups and removes our hook from each, calling `each` with
/// every group's report as it is done. `Err`: the groups could not be listed (a plain
/// sentence).
pub async fn remove_hooks(
    cloud: &dyn Cloud,
    selector: &GroupSelector,
    opts: &RemoveOptions,
    mut each: impl FnMut(&GroupReport),
) -> Result<Vec<GroupReport>, String> {
    let groups = cloud
        .describe_groups(selector)
        .await
        .map_err(|e| plain(&e, "listing the configured Auto Scaling Groups"))?;
    let mut reports = Vec::new();
    for g in groups {
        let report = one_group(cloud, &g.name, &g.tags, opts).await;
        each(&report);
        reports.push(report);
    }
    Ok(reports)
}

async fn one_group(
    cloud: &dyn Cloud,
    group: &str,
    tags: &BTreeMap<String, String>,
    opts: &RemoveOptions,
) -> GroupReport {
    let report = |outcome, others| GroupReport {
        group: group.to_string(),
        outcome,
        others,
    };
    let hooks = match cloud.terminating_hooks(group).await {
        Ok(h) => h,
        Err(e) => {
            return report(
                Outcome::Failed(plain(&e, "reading the group's lifecycle hooks")),
                Vec::new(),
            )
        }
    };
    let others: Vec<String> = hooks
        .iter()
        .filter(|h| h.name != opts.name)
        .map(|h| h.name.clone())
        .collect();
    let outcome = match which_to_remove(&hooks, tags, &opts.name, opts.include_unmarked) {
        Removal::KeepUnmarked => Outcome::KeptUnmarked,
        Removal::Nothing { stale_record } => {
            if stale_record && !opts.dry_run {
                // Best effort: a record left behind is harmless until a hook of the
                // same name is made by hand; the next run tries again.
                if let Err(e) = cloud.untag_group(group, HOOK_RECORD_TAG).await {
                    tracing::warn!(group, error = %plain(&e, "removing the record tag"), "record tag left");
                }
            }
            Outcome::NothingToRemove
        }
        Removal::Remove { marked } if opts.dry_run => Outcome::WouldRemove { marked },
        Removal::Remove { marked } => {
            match cloud.delete_terminating_hook(group, &opts.name).await {
                Err(e) => Outcome::Failed(plain(
                    &e,
                    &format!("deleting the lifecycle hook {}", opts.name),
                )),
                Ok(()) => {
                    let record_left = if tags.contains_key(HOOK_RECORD_TAG) {
                        cloud
                            .untag_group(group, HOOK_RECORD_TAG)
                            .await
                            .err()
                            .map(|e| plain(&e, "removing the record tag"))
                    } else {
                        None
                    };
                    Outcome::Removed {
                        marked,
                        record_left,
                    }
                }
            }
        }
    };
    report(outcome, others)
}

//! The last mile's one write (issue 73, item 3; `scaleIn.loadBalancers.deregister`,
//! off by default, or a group's `scaleIn.groupOverrides[i].loadBalancers.deregister`,
//! the first override that selects it): right before the wait of
//! [`super::last_mile::wait_out`] ([`super::terminate`]'s `finish` calls both), the
//! instance is deregistered from the ELBv2 target groups attached to its own Auto
//! Scaling group. The ASG does this itself only when the instance terminates, after
//! our hook's action is completed: too late, the instance ends while its targets are
//! still `healthy`. Deregistered here, they drain for the group's delay while the wait
//! reads them, and the instance ends once they are `unused`.
//!
//! What is deregistered ([`last_mile::to_deregister`], pure): in each group
//! DescribeLoadBalancerTargetGroups lists for the instance's own group, the targets
//! DescribeTargetHealth shows with the instance's id (each port), unless already
//! leaving or out. Never a target group the group does not have, never another
//! instance's target. Called only on the way to the end call ([`super::terminate`]'s
//! `finish`, after the drain; not for `drain NODE`, a dry run, a drain given back or
//! abandoned), so a target is never taken out of a node that stays.
//!
//! Idempotent: a restart or a new leader reads the targets again and finds them
//! `draining` or `unused`, so it writes nothing; a DeregisterTargets that runs twice
//! anyway changes nothing at AWS (the target keeps draining from the first).
//!
//! Never blocks the end: each call is made once (the SDK's own retries aside); a
//! refusal or throttling is said once per group by name with the permission it needs
//! (`LoadBalancerNotDeregistered`), and the wait then goes on as without this, bounded.
//!
//! Calls per drain, with `a` target groups attached to the group: one
//! DescribeLoadBalancerTargetGroups, `a` DescribeTargetHealth, and one DeregisterTargets
//! per group that still has the instance.

use crate::cloud::{Cloud, CloudError};
use crate::scalein::decide::last_mile::{self, Unread};
use crate::scalein::kube::events::Reason;

use crate::scalein::Mode;

use super::last_mile::{refusal, waits, LastMile, WaitPort};

/// At most this many attached target groups are looked at (an ASG may have 50 by
/// default; the quota can be raised).
const MAX_ATTACHED: usize = 500;

/// Deregisters the instance's own targets from the target groups attached to `group`,
/// when `deregister` is on for the group ([`WaitPort::deregisters`]). Never fails:
/// what could not be done is said and left to the wait.
pub async fn deregister_own(
    cloud: &dyn Cloud,
    lm: &LastMile,
    port: &dyn WaitPort,
    mode: &Mode,
    group: &str,
    instance_id: &str,
    node: Option<&str>,
) {
    // Only where the wait follows and the instance ends.
    if !waits(lm, mode) || !port.deregisters(group) {
        return;
    }
    let say = Say {
        port,
        instance_id,
        node,
    };
    let arns = match cloud.group_target_groups(group).await {
        Ok(a) => a,
        Err(e) => {
            let why = refusal("autoscaling:DescribeLoadBalancerTargetGroups".into(), &e);
            say.not_done(&format!("attached to group {group}"), &why)
                .await;
            return;
        }
    };
    let mut done = Vec::new();
    for arn in arns.iter().take(MAX_ATTACHED) {
        let name = last_mile::group_name(arn);
        let targets = match cloud.target_health(arn).await {
            Ok(t) => t,
            // Deleted meanwhile: nothing to take the instance out of.
            Err(CloudError::NotFound { .. }) => continue,
            Err(e) => {
                let why = refusal("elasticloadbalancing:DescribeTargetHealth".into(), &e);
                say.not_done(name, &why).await;
                continue;
            }
        };
        let own = last_mile::to_deregister(&targets, instance_id);
        if own.is_empty() {
            continue;
        }
        match cloud.deregister_targets(arn, &own).await {
            Ok(()) => {
                // The wait's next read must ask AWS, not what was read before.
                lm.sightings.forget(arn);
                done.push(name);
            }
            Err(e) => {
                let why = refusal("elasticloadbalancing:DeregisterTargets".into(), &e);
                say.not_done(name, &why).await;
            }
        }
    }
    if !done.is_empty() {
        let text = format!(
            "deregistered the instance from {} target group(s) attached to group {group} ({}); it ends once they let it go",
            done.len(),
            done.join(", ")
        );
        tracing::info!(instance = instance_id, "{text}");
        say.event(Reason::DeregisteredFromLoadBalancers, text).await;
    }
}

/// The Node's Events of this step.
struct Say<'a> {
    port: &'a dyn WaitPort,
    instance_id: &'a str,
    node: Option<&'a str>,
}

impl Say<'_> {
    /// One Event for a target group (or the group's list) the instance could not be
    /// taken out of, naming it and the missing permission or the failure.
    async fn not_done(&self, target_group: &str, why: &Unread) {
        let text = match why {
            Unread::Forbidden { permission, code } => format!(
                "could not deregister the instance from target group {target_group}: {code}, the service's role lacks {permission}; the wait goes on without it, bounded"
            ),
            Unread::Failed { why } => format!(
                "could not deregister the instance from target group {target_group} now ({why}); the wait goes on without it, bounded"
            ),
        };
        tracing::warn!(instance = self.instance_id, "{text}");
        self.event(Reason::LoadBalancerNotDeregistered, text).await;
    }

    async fn event(&self, reason: Reason, text: String) {
        if let Some(n) = self.node {
            self.port.say(n, reason, text).await;
        }
    }
}

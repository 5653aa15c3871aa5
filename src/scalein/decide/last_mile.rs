//! The last mile (issue 73): whether an instance about to end is out of every ELBv2
//! target group that sends it traffic, or the wait for it is over. Pure: what AWS
//! answered comes in already read, `now` comes in as an argument.
//!
//! A target of the instance is one of its own (an `instance` target by its id) or one
//! at one of its addresses (an `ip` target at the node's address, or at a pod's address
//! the VPC CNI took from the instance's network interfaces or delegated prefixes).
//! `unused` (deregistered, or the load balancer gone) is out; every other state carries
//! traffic or may again (`healthy`, `initial`, `unhealthy`, `draining`, `unavailable`, a
//! state this code does not know), so it waits. A load balancer never keeps a node for
//! ever: each group is waited on for at most its own deregistration delay plus a
//! margin, and never past the time our hook's action may still be completed.

use std::net::IpAddr;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::clock::Instant;

/// AWS's default `deregistration_delay.timeout_seconds`: the bound of a group whose
/// attributes could not be read.
pub const DEFAULT_DELAY: Duration = Duration::from_secs(300);

/// The largest deregistration delay AWS accepts (3600 s).
pub const MAX_DELAY: Duration = Duration::from_secs(3600);

/// At most this many addresses and prefixes of one instance are looked for (a
/// `c7i.48xlarge` has 15 interfaces of 50 addresses: 750).
pub const MAX_ADDRESSES: usize = 4096;

/// The target group's `deregistration_delay.timeout_seconds` as AWS spells it, read
/// once: whole seconds from 0 to 3600. Anything else is refused naming the field and
/// the value (the caller then waits the default, [`DEFAULT_DELAY`]).
pub fn parse_delay(value: &str) -> Result<Duration, String> {
    let v = value.trim();
    match v.parse::<u64>() {
        Ok(s) if Duration::from_secs(s) <= MAX_DELAY => Ok(Duration::from_secs(s)),
        _ => Err(format!(
            "deregistration_delay.timeout_seconds is {value:?}, not whole seconds from 0 to 3600"
        )),
    }
}

/// Whether a target in this state is out of the group's traffic for good.
pub fn is_out(state: &str) -> bool {
    state == "unused"
}

/// The instance's addresses, parsed once: single addresses and delegated prefixes.
/// What does not parse is left out (it can match no target) and counted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Addresses {
    ips: Vec<IpAddr>,
    prefixes: Vec<(IpAddr, u8)>,
    /// Addresses or prefixes EC2 gave that did not parse (or past [`MAX_ADDRESSES`]).
    pub refused: Vec<String>,
}

impl Addresses {
    pub fn parse(addresses: &[String], prefixes: &[String]) -> Self {
        let mut out = Self::default();
        for a in addresses {
            match a.trim().parse::<IpAddr>() {
                Ok(ip) if out.len() < MAX_ADDRESSES => out.ips.push(ip),
                _ => out.refused.push(a.clone()),
            }
        }
        for p in prefixes {
            match parse_prefix(p) {
                Some(pre) if out.len() < MAX_ADDRESSES => out.prefixes.push(pre),
                _ => out.refused.push(p.clone()),
            }
        }
        out
    }

    fn len(&self) -> usize {
        self.ips.len() + self.prefixes.len()
    }

    /// Whether `address` (an `ip` target's id) is the instance's.
    pub fn covers(&self, address: &str) -> bool {
        let Ok(ip) = address.trim().parse::<IpAddr>() else {
            return false;
        };
        self.ips.contains(&ip)
            || self
                .prefixes
                .iter()
                .any(|(net, len)| within(ip, *net, *len))
    }
}

/// `a.b.c.d/n` or an IPv6 prefix, with the length inside the family's bits.
fn parse_prefix(p: &str) -> Option<(IpAddr, u8)> {
    let (addr, len) = p.trim().split_once('/')?;
    let addr: IpAddr = addr.parse().ok()?;
    let len: u8 = len.parse().ok()?;
    let bits = if addr.is_ipv4() { 32 } else { 128 };
    (len <= bits).then_some((addr, len))
}

fn within(ip: IpAddr, net: IpAddr, len: u8) -> bool {
    let (a, b, bits) = match (ip, net) {
        (IpAddr::V4(a), IpAddr::V4(b)) => (u32::from(a) as u128, u32::from(b) as u128, 32u32),
        (IpAddr::V6(a), IpAddr::V6(b)) => (u128::from(a), u128::from(b), 128u32),
        _ => return false,
    };
    let shift = bits - u32::from(len);
    if shift >= 128 {
        return true;
    }
    (a >> shift) == (b >> shift)
}

/// The states of the instance's targets among a group's targets (DescribeTargetHealth):
/// by instance id in an `instance` group, by address in an `ip` group. Lambda and ALB
/// targets are never an instance's.
pub fn states_of(
    target_type: &str,
    targets: &[crate::cloud::TargetHealth],
    instance_id: &str,
    addresses: &Addresses,
) -> Vec<String> {
    targets
        .iter()
        .filter(|t| match target_type {
            "instance" => t.id == instance_id,
            "ip" => addresses.covers(&t.id),
            _ => false,
        })
        .map(|t| t.state.clone())
        .collect()
}

/// The targets the service deregisters itself from a target group attached to the
/// instance's own Auto Scaling group (`scaleIn.loadBalancers.deregister`, issue 73
/// item 3): the instance's own targets by its id, each port it is registered on, that
/// still carry traffic or may again. Never a target of another id (an `ip` target's id
/// is an address, never an instance id, so such a group yields none), and not one
/// already leaving (`draining`, `unhealthy.draining`) or out (`unused`): deregistering
/// those again would change nothing, and a restart that finds them so writes nothing.
pub fn to_deregister(
    targets: &[crate::cloud::TargetHealth],
    instance_id: &str,
) -> Vec<crate::cloud::TargetHealth> {
    targets
        .iter()
        .filter(|t| t.id == instance_id && !is_out(&t.state) && !is_leaving(&t.state))
        .cloned()
        .collect()
}

/// Whether a target in this state is being taken out already.
pub fn is_leaving(state: &str) -> bool {
    matches!(state, "draining" | "unhealthy.draining")
}

/// A target group's name as its ARN spells it
/// (`arn:aws:elasticloadbalancing:REGION:ACCOUNT:targetgroup/NAME/ID`); the ARN
/// itself when it does not read so.
pub fn group_name(arn: &str) -> &str {
    arn.split_once(":targetgroup/")
        .and_then(|(_, rest)| rest.split('/').next())
        .filter(|n| !n.is_empty())
        .unwrap_or(arn)
}

/// Why a target group could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unread {
    /// AWS refused (AccessDenied, UnauthorizedOperation): the permission is missing.
    Forbidden { permission: String, code: String },
    /// AWS throttled the read, or it failed in passing (5xx, timeout).
    Failed { why: String },
}

/// What the last read of one target group said of the instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seen {
    /// Read: the states of the instance's targets in it (none: it is not, or no
    /// longer, a target).
    Read(Vec<String>),
    /// Not read.
    Unread(Unread),
}

/// One target group the instance is waited out of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Watched {
    /// The group's name as AWS lists it (or what could not be listed).
    pub name: String,
    /// Its deregistration delay; `None`: not read, [`DEFAULT_DELAY`] counts.
    pub delay: Option<Duration>,
    /// When the wait on it began.
    pub since: Instant,
    pub seen: Seen,
}

impl Watched {
    /// Whether the group may still send the instance traffic (or cannot be told).
    pub fn still_in(&self) -> bool {
        match &self.seen {
            Seen::Read(states) => states.iter().any(|s| !is_out(s)),
            Seen::Unread(_) => true,
        }
    }

    /// Whether someone is taking the instance out of this group: a target of it
    /// `draining`, or the group unread (it cannot be told: waited as if).
    pub fn deregistering(&self) -> bool {
        match &self.seen {
            Seen::Read(states) => states.iter().any(|s| s.ends_with("draining")),
            Seen::Unread(_) => true,
        }
    }

    /// When the wait on this group is over whatever it shows: its deregistration delay
    /// plus the margin while the instance is being taken out (or the group cannot be
    /// read); the margin alone while every target of the instance still serves and
    /// nobody has begun to take it out (a group attached to the ASG, which the ASG
    /// leaves only when it ends the instance; no controller watching the
    /// exclude-from-external-load-balancers label), so such a group costs the margin,
    /// not the whole delay, on every scale-in.
    pub fn bound(&self, margin: Duration) -> Instant {
        if !self.deregistering() {
            return self.since + margin;
        }
        self.since + self.delay.unwrap_or(DEFAULT_DELAY).min(MAX_DELAY) + margin
    }
}

/// When our hook's hold on the instance began, as the wait's bound counts it: the
/// earlier of `seen` (this process's first heartbeat of it) and the lifecycle
/// reason's arrival as the Node's drain record keeps it, `recorded_ago` before `now`
/// (the record outlives a restart or a new leader, whose own heartbeats began later:
/// counted from them alone, the wait could run past the moment AWS ends the action).
/// A record from the future counts as now; one older than any action lasts
/// ([`crate::scalein::decide::record::LIFECYCLE_ACTION_LIMIT`]) is another action's and
/// does not count.
pub fn hold_began(seen: Instant, recorded_ago: Option<Duration>, now: Instant) -> Instant {
    let recorded = recorded_ago
        .filter(|ago| *ago < crate::scalein::decide::record::LIFECYCLE_ACTION_LIMIT)
        .and_then(|ago| now.checked_sub(ago));
    match recorded {
        Some(r) if r < seen => r,
        _ => seen,
    }
}

/// How long the wait may last.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// Added to each group's deregistration delay (`scaleIn.loadBalancers.margin`).
    pub margin: Duration,
    /// The latest our hook's action may still be completed, when our hook holds the
    /// instance (its global limit, less a heartbeat timeout).
    pub latest: Option<Instant>,
}

/// Why the wait ended with the instance still in a group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GiveUp {
    /// The group still shows the instance at its bound (`states`, the last read).
    Bound { group: String, states: Vec<String> },
    /// The group could not be read up to its bound.
    Unreadable { group: String, why: Unread },
    /// Our hook's action would run out first.
    Hook { groups: Vec<String> },
}

impl GiveUp {
    /// For people: which group and why.
    pub fn said(&self) -> String {
        match self {
            Self::Bound { group, states } if !states.iter().any(|s| s.ends_with("draining")) => format!(
                "target group {group} still shows the instance ({}) and nothing began to take it out within the margin (no controller acts on the node's exclude-from-external-load-balancers label for it; a group attached to the ASG is left by the ASG when it ends the instance)",
                states.join(", ")
            ),
            Self::Bound { group, states } => format!(
                "target group {group} still shows the instance ({}) at the end of its deregistration delay and margin",
                states.join(", ")
            ),
            Self::Unreadable {
                group,
                why: Unread::Forbidden { permission, code },
            } => format!("target group {group} could not be read ({code}: {permission} is not allowed)"),
            Self::Unreadable {
                group,
                why: Unread::Failed { why },
            } => format!("target group {group} could not be read ({why})"),
            Self::Hook { groups } => format!(
                "our lifecycle hook's action would run out before {} let the instance go",
                groups.join(", ")
            ),
        }
    }
}

/// Where the wait stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Out of every group: end the instance.
    Done,
    /// Still in `groups` groups; `waited` since the first began, `at_most` the whole
    /// wait's bound from then.
    Wait {
        groups: usize,
        waited: Duration,
        at_most: Duration,
    },
    /// End the instance anyway: every group it is still in has reached its bound (or
    /// our hook would run out), each with why.
    GiveUp(Vec<GiveUp>),
}

/// The wait's verdict:
///
/// | what the groups show                                             | verdict        |
/// |------------------------------------------------------------------|----------------|
/// | no group, or every group read with no target of the instance    | `Done`         |
/// |   but `unused`                                                   |                |
/// | our hook's latest time reached, a group still in or unread       | `GiveUp(Hook)` |
/// | a group still in (read, a target not `unused`) or unread, before | `Wait`         |
/// |   its bound (delay, or 300 s unread, plus margin; the margin     |                |
/// |   alone while nothing is `draining` in a read group)             |                |
/// | every group still in or unread is at or past its bound           | `GiveUp`, one  |
/// |                                                                  |   per group    |
pub fn verdict(groups: &[Watched], bounds: Bounds, now: Instant) -> Verdict {
    let still: Vec<&Watched> = groups.iter().filter(|g| g.still_in()).collect();
    if still.is_empty() {
        return Verdict::Done;
    }
    if bounds.latest.is_some_and(|l| now >= l) {
        return Verdict::GiveUp(vec![GiveUp::Hook {
            groups: still.iter().map(|g| g.name.clone()).collect(),
        }]);
    }
    let waiting = still
        .iter()
        .filter(|g| now < g.bound(bounds.margin))
        .count();
    if waiting > 0 {
        let first = still.iter().map(|g| g.since).min().unwrap_or(now);
        let mut end = still
            .iter()
            .map(|g| g.bound(bounds.margin))
            .max()
            .unwrap_or(now);
        if let Some(l) = bounds.latest {
            end = end.min(l);
        }
        return Verdict::Wait {
            groups: waiting,
            waited: now.saturating_duration_since(first),
            at_most: end.saturating_duration_since(first),
        };
    }
    Verdict::GiveUp(
        still
            .iter()
            .map(|g| match &g.seen {
                Seen::Read(states) => GiveUp::Bound {
                    group: g.name.clone(),
                    states: states.iter().filter(|s| !is_out(s)).cloned().collect(),
                },
                Seen::Unread(why) => GiveUp::Unreadable {
                    group: g.name.clone(),
                    why: why.clone(),
                },
            })
            .collect(),
    )
}

/// The progress line of a wait: "waiting for 2 target groups to deregister, 45 s of
/// at most 330 s".
pub fn said(groups: usize, waited: Duration, at_most: Duration) -> String {
    format!(
        "waiting for {groups} target group{} to deregister, {} s of at most {} s",
        if groups == 1 { "" } else { "s" },
        waited.as_secs(),
        at_most.as_secs()
    )
}

/// The Node annotation that says the drain waits for the load balancers (`status`
/// reads it): a [`Waiting`] as JSON, written when the wait begins, removed when it ends.
pub const ANNOTATION: &str = "ca-asg-provider.io/load-balancers";

/// What the Node says of a wait for the load balancers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Waiting {
    /// Target groups still waited for when it began.
    pub groups: usize,
    pub since: DateTime<Utc>,
    /// The whole wait's bound from `since`.
    pub at_most_seconds: u64,
}

impl Waiting {
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// The annotation as written, or `None` (anyone who may patch Nodes may write it:
    /// bounded, read whole or not at all).
    pub fn read(s: &str) -> Option<Self> {
        if s.len() > 512 {
            return None;
        }
        let w: Self = serde_json::from_str(s).ok()?;
        (w.groups <= 100_000 && w.at_most_seconds <= 48 * 3600).then_some(w)
    }

    /// The progress line at `now`.
    pub fn line(&self, now: DateTime<Utc>) -> String {
        said(
            self.groups,
            (now - self.since).to_std().unwrap_or_default(),
            Duration::from_secs(self.at_most_seconds),
        )
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn target(id: &str, port: i32, state: &str) -> crate::cloud::TargetHealth {
        crate::cloud::TargetHealth {
            id: id.into(),
            port: Some(port),
            state: state.into(),
        }
    }

    /// Only the instance's own targets (every port) that still carry traffic or may:
    /// another instance's, an address, one already leaving or out are never chosen.
    #[test]
    fn to_deregister_takes_only_the_instances_own_live_targets() {
        let me = "i-0aaa";
        let states = [
            "initial",
            "healthy",
            "unhealthy",
            "unavailable",
            "a-state-not-known",
            "draining",
            "unhealthy.draining",
            "unused",
        ];
        for state in states {
            let targets = vec![
                target(me, 80, state),
                target(me, 8080, "healthy"),
                target("i-0bbb", 80, state),
                target("10.0.0.1", 80, state),
                target("i-0aaa0", 80, state),
            ];
            let chosen = to_deregister(&targets, me);
            assert!(chosen.iter().all(|t| t.id == me), "{state}: {chosen:?}");
            let live = !matches!(state, "draining" | "unhealthy.draining" | "unused");
            let ports: Vec<Option<i32>> = chosen.iter().map(|t| t.port).collect();
            let want = if live {
                vec![Some(80), Some(8080)]
            } else {
                vec![Some(8080)]
            };
            assert_eq!(ports, want, "{state}");
        }
        assert!(to_deregister(&[], me).is_empty());
    }

    #[test]
    fn group_name_reads_the_arn_or_keeps_it() {
        assert_eq!(
            group_name("arn:aws:elasticloadbalancing:eu-west-1:123456789012:targetgroup/web-alb/73e2d6bc24d8a067"),
            "web-alb"
        );
        for odd in [
            "",
            "web",
            "arn:aws:elasticloadbalancing:x:1:targetgroup/",
            "arn:aws:elasticloadbalancing:x:1:loadbalancer/app/a/b",
        ] {
            assert_eq!(group_name(odd), odd);
        }
    }
    use crate::cloud::TargetHealth;

    fn s(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    fn group(name: &str, delay: Option<u64>, since: Instant, seen: Seen) -> Watched {
        Watched {
            name: name.into(),
            delay: delay.map(s),
            since,
            seen,
        }
    }

    fn read(states: &[&str]) -> Seen {
        Seen::Read(states.iter().map(|x| x.to_string()).collect())
    }

    fn forbidden() -> Seen {
        Seen::Unread(Unread::Forbidden {
            permission: "elasticloadbalancing:DescribeTargetHealth".into(),
            code: "AccessDenied".into(),
        })
    }

    fn throttled() -> Seen {
        Seen::Unread(Unread::Failed {
            why: "Rate exceeded".into(),
        })
    }

    const MARGIN: Duration = Duration::from_secs(30);

    fn bounds(latest: Option<Instant>) -> Bounds {
        Bounds {
            margin: MARGIN,
            latest,
        }
    }

    /// Every state AWS names, and one it may name tomorrow: only `unused` is out.
    #[test]
    fn only_unused_is_out() {
        for st in [
            "initial",
            "healthy",
            "unhealthy",
            "unhealthy.draining",
            "draining",
            "unavailable",
            "something-new",
            "",
        ] {
            assert!(!is_out(st), "{st}");
        }
        assert!(is_out("unused"));
    }

    /// Each state of one group, before its bound, at it and past it: a group being
    /// taken out (`draining`) or unread is waited on for its delay plus the margin
    /// (330 s); one still serving that nobody takes out, for the margin alone (30 s).
    #[test]
    fn one_group_each_state_before_at_and_past_its_bound() {
        let t0 = Instant::now();
        for (seen, in_, bound) in [
            (read(&[]), false, 330),
            (read(&["unused"]), false, 330),
            (read(&["unused", "unused"]), false, 330),
            (read(&["healthy"]), true, 30),
            (read(&["initial"]), true, 30),
            (read(&["draining"]), true, 330),
            (read(&["unused", "draining"]), true, 330),
            (read(&["healthy", "draining"]), true, 330),
            (read(&["unhealthy.draining"]), true, 330),
            (read(&["unavailable"]), true, 30),
            (forbidden(), true, 330),
            (throttled(), true, 330),
        ] {
            let g = [group("web", Some(300), t0, seen.clone())];
            for (at, past) in [
                (0, false),
                (bound / 2, false),
                (bound - 1, false),
                (bound, true),
                (4000, true),
            ] {
                let v = verdict(&g, bounds(None), t0 + s(at));
                match (in_, past, &v) {
                    (false, _, Verdict::Done) => {}
                    (
                        true,
                        false,
                        Verdict::Wait {
                            groups,
                            waited,
                            at_most,
                        },
                    ) => {
                        assert_eq!((*groups, *waited, *at_most), (1, s(at), s(bound)));
                    }
                    (true, true, Verdict::GiveUp(why)) => {
                        assert_eq!(why.len(), 1);
                        match (&seen, &why[0]) {
                            (Seen::Read(_), GiveUp::Bound { group, .. }) => {
                                assert_eq!(group, "web")
                            }
                            (Seen::Unread(u), GiveUp::Unreadable { group, why }) => {
                                assert_eq!((group.as_str(), why), ("web", u));
                            }
                            other => panic!("{other:?}"),
                        }
                    }
                    other => panic!("{seen:?} at {at}: {other:?}"),
                }
            }
        }
    }

    /// A group whose delay was not read is waited on for AWS's default; a delay is
    /// never taken past AWS's largest.
    #[test]
    fn an_unread_delay_counts_as_the_default_and_none_past_the_largest() {
        let t0 = Instant::now();
        let g = [group("web", None, t0, read(&["draining"]))];
        assert!(
            matches!(verdict(&g, bounds(None), t0 + s(329)), Verdict::Wait { at_most, .. } if at_most == s(330))
        );
        assert!(matches!(
            verdict(&g, bounds(None), t0 + s(330)),
            Verdict::GiveUp(_)
        ));
        let g = [group("web", Some(100_000), t0, read(&["draining"]))];
        assert!(matches!(
            verdict(&g, bounds(None), t0 + s(3630)),
            Verdict::GiveUp(_)
        ));
    }

    /// Several groups: the wait lasts while any still-in group is within its bound;
    /// groups already out do not count; at the end each still-in group says why.
    #[test]
    fn several_groups_wait_for_the_longest_bound_of_those_still_in() {
        let t0 = Instant::now();
        let gs = [
            group("alb", Some(300), t0, read(&["draining"])),
            group("nlb", Some(10), t0, forbidden()),
            group("old", Some(3000), t0, read(&["unused"])),
        ];
        match verdict(&gs, bounds(None), t0 + s(30)) {
            Verdict::Wait {
                groups,
                waited,
                at_most,
            } => {
                assert_eq!((groups, waited, at_most), (2, s(30), s(330)))
            }
            v => panic!("{v:?}"),
        }
        // nlb is past its bound (40 s), alb is not: only alb is still waited on.
        match verdict(&gs, bounds(None), t0 + s(100)) {
            Verdict::Wait { groups, .. } => assert_eq!(groups, 1),
            v => panic!("{v:?}"),
        }
        match verdict(&gs, bounds(None), t0 + s(330)) {
            Verdict::GiveUp(why) => {
                assert_eq!(why.len(), 2);
                assert!(why[0].said().contains("alb") && why[0].said().contains("draining"));
                assert!(
                    why[1].said().contains("nlb") && why[1].said().contains("DescribeTargetHealth")
                );
            }
            v => panic!("{v:?}"),
        }
    }

    /// Our hook's latest time cuts every bound, and past it the wait is over.
    #[test]
    fn the_hold_counts_from_the_record_when_it_began_earlier() {
        let now = Instant::now() + s(3 * 24 * 3600);
        let seen = now - s(60);
        // Nothing recorded: this process's own start.
        assert_eq!(hold_began(seen, None, now), seen);
        // Recorded before this process held it (a restart, a new leader): the record.
        assert_eq!(hold_began(seen, Some(s(600)), now), now - s(600));
        // Recorded after (the reason written once the hold ran): the heartbeats' start.
        assert_eq!(hold_began(seen, Some(s(30)), now), seen);
        // A record from the future reads as now, later than the heartbeats' start.
        assert_eq!(hold_began(seen, Some(Duration::ZERO), now), seen);
        // Older than any action lasts: another action's, not counted.
        let limit = crate::scalein::decide::record::LIFECYCLE_ACTION_LIMIT;
        assert_eq!(hold_began(seen, Some(limit), now), seen);
        assert_eq!(
            hold_began(seen, Some(limit - s(1)), now),
            now - (limit - s(1))
        );
    }

    #[test]
    fn the_hook_cuts_the_wait() {
        let t0 = Instant::now();
        let gs = [group("alb", Some(300), t0, read(&["draining"]))];
        let latest = Some(t0 + s(60));
        assert!(
            matches!(verdict(&gs, bounds(latest), t0 + s(59)), Verdict::Wait { at_most, .. } if at_most == s(60))
        );
        match verdict(&gs, bounds(latest), t0 + s(60)) {
            Verdict::GiveUp(why) => assert_eq!(
                why,
                vec![GiveUp::Hook {
                    groups: vec!["alb".into()]
                }]
            ),
            v => panic!("{v:?}"),
        }
        // Out of every group, the hook does not matter.
        let out = [group("alb", Some(300), t0, read(&["unused"]))];
        assert_eq!(verdict(&out, bounds(latest), t0 + s(600)), Verdict::Done);
        assert_eq!(verdict(&[], bounds(latest), t0 + s(600)), Verdict::Done);
    }

    /// Groups found at different times: each is bounded from its own start, the wait
    /// counts from the first.
    #[test]
    fn each_group_counts_from_its_own_start() {
        let t0 = Instant::now();
        let gs = [
            group("a", Some(60), t0, read(&["draining"])),
            group("b", Some(60), t0 + s(50), read(&["unhealthy.draining"])),
        ];
        match verdict(&gs, bounds(None), t0 + s(95)) {
            Verdict::Wait {
                groups,
                waited,
                at_most,
            } => assert_eq!((groups, waited, at_most), (1, s(95), s(140))),
            v => panic!("{v:?}"),
        }
        assert!(
            matches!(verdict(&gs, bounds(None), t0 + s(140)), Verdict::GiveUp(g) if g.len() == 2)
        );
    }

    #[test]
    fn delays_are_read_once_and_refused_by_name() {
        assert_eq!(parse_delay("300"), Ok(s(300)));
        assert_eq!(parse_delay("0"), Ok(s(0)));
        assert_eq!(parse_delay(" 3600 "), Ok(s(3600)));
        for bad in ["3601", "-1", "", "30s", "1e3", "99999999999999999999999"] {
            let e = parse_delay(bad).unwrap_err();
            assert!(
                e.contains("deregistration_delay.timeout_seconds")
                    && e.contains(&format!("{bad:?}")),
                "{e}"
            );
        }
    }

    /// Instance targets by id, IP targets by the node's address or one in a delegated
    /// prefix; other target types and other addresses are not the instance's.
    #[test]
    fn targets_of_the_instance_by_id_address_and_prefix() {
        let a = Addresses::parse(
            &[
                "10.0.1.5".into(),
                "10.0.1.77".into(),
                "2600:1f18::5".into(),
                "junk".into(),
            ],
            &[
                "10.0.9.16/28".into(),
                "2600:1f18:1::/80".into(),
                "10.0.0.0/33".into(),
            ],
        );
        assert_eq!(
            a.refused,
            vec!["junk".to_string(), "10.0.0.0/33".to_string()]
        );
        for (ip, yes) in [
            ("10.0.1.5", true),
            ("10.0.1.77", true),
            ("10.0.1.6", false),
            ("10.0.9.16", true),
            ("10.0.9.31", true),
            ("10.0.9.32", false),
            ("2600:1f18::5", true),
            ("2600:1f18:1::abcd", true),
            ("2600:1f18:2::1", false),
            ("not an ip", false),
        ] {
            assert_eq!(a.covers(ip), yes, "{ip}");
        }
        let t = |id: &str, state: &str| TargetHealth {
            id: id.into(),
            port: Some(80),
            state: state.into(),
        };
        let targets = [
            t("i-1", "draining"),
            t("i-2", "healthy"),
            t("10.0.1.5", "healthy"),
            t("10.0.9.20", "initial"),
        ];
        assert_eq!(states_of("instance", &targets, "i-1", &a), vec!["draining"]);
        assert_eq!(
            states_of("ip", &targets, "i-1", &a),
            vec!["healthy", "initial"]
        );
        assert!(states_of("lambda", &targets, "i-1", &a).is_empty());
        assert!(states_of("alb", &targets, "i-1", &a).is_empty());
        // A /0 prefix covers its whole family and no other.
        let all = Addresses::parse(&[], &["0.0.0.0/0".into()]);
        assert!(all.covers("192.168.1.1") && !all.covers("::1"));
    }

    #[test]
    fn the_progress_line_names_the_phase() {
        assert_eq!(
            said(2, s(45), s(330)),
            "waiting for 2 target groups to deregister, 45 s of at most 330 s"
        );
        assert_eq!(
            said(1, s(0), s(40)),
            "waiting for 1 target group to deregister, 0 s of at most 40 s"
        );
    }

    /// The Node's note of a wait reads back whole, and nothing else does.
    #[test]
    fn the_nodes_note_of_a_wait_reads_back_and_says_the_phase() {
        let since = chrono::DateTime::parse_from_rfc3339("2026-01-01T10:00:00Z")
            .unwrap()
            .with_timezone(&chrono::Utc);
        let w = Waiting {
            groups: 2,
            since,
            at_most_seconds: 330,
        };
        assert_eq!(Waiting::read(&w.to_json()), Some(w.clone()));
        assert_eq!(
            w.line(since + chrono::Duration::seconds(45)),
            "waiting for 2 target groups to deregister, 45 s of at most 330 s"
        );
        for bad in [
            "",
            "{}",
            "[]",
            r#"{"groups":2,"since":"2026-01-01T10:00:00Z","atMostSeconds":999999}"#,
            r#"{"groups":2,"since":"yesterday","atMostSeconds":330}"#,
            r#"{"groups":2,"since":"2026-01-01T10:00:00Z","atMostSeconds":330,"x":1}"#,
        ] {
            assert_eq!(Waiting::read(bad), None, "{bad}");
        }
        assert_eq!(Waiting::read(&"x".repeat(10_000)), None);
    }
}

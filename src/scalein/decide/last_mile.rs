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

    /// When the wait on this group is over whatever it shows.
    pub fn bound(&self, margin: Duration) -> Instant {
        self.since + self.delay.unwrap_or(DEFAULT_DELAY).min(MAX_DELAY) + margin
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
/// |   its bound (delay, or 300 s unread, plus margin)                |                |
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
mod tests;

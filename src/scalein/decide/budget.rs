//! Disruption budgets: how many drains at once, how fast and when, for every way a
//! node ends. The rule, decided here for every source alike:
//!
//! 1. A drain whose instance ends anyway (a spot interruption, a scheduled event
//!    with a deadline, an instance that stopped) is never held: it is *exempt*.
//!    It still counts as draining for the budgets that cover its node.
//! 2. A budget is *in force* when it has no `schedule`, or when its schedule fired
//!    less than `duration` ago (UTC). A budget not in force holds nothing.
//! 3. A budget *governs* a drain when it covers the drain's node (its group by name
//!    or tags, its zone) and lists one of the drain's causes (no list: every cause).
//! 4. A governed drain may start when, for every budget in force that governs it,
//!    the drains on nodes the budget covers (whatever their cause, exempt ones
//!    included, as Karpenter counts a NodePool's disrupting nodes) are fewer than
//!    the budget's `nodes`, and the drains it governed that started within the
//!    last `rate.per` are fewer than `rate.starts`. The most restrictive wins: one
//!    budget that says wait is enough.
//! 5. `nodes` as a percent is of the nodes the budget covers, rounded up (10% of 5
//!    nodes is 1; 0% is 0), as Karpenter rounds.
//! 6. What holds a drain is said with when it may start: a slot frees, the window
//!    closes, a start leaves the rate's period.
//!
//! A drain our lifecycle hook holds is the one exception to waiting, and it is not
//! decided here but by [`force_at`]: it starts when waiting longer would leave its
//! drain no time inside the hook's global timeout, whatever a budget says.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use chrono::{DateTime, Duration as Span, Utc};

pub mod asg_cause;
pub mod carried;
pub mod cron;

#[cfg(test)]
pub(crate) mod tests;

/// Why a node is disrupted, as a budget names it: who started it and, for the
/// Auto Scaling group's own, why AWS says it did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Cause {
    /// CA's scale-in of a node with no workload pod left (DaemonSet pods aside).
    CaEmpty,
    /// CA's scale-in of a node that still runs workload pods.
    CaOccupied,
    /// The group's desired capacity lowered (a scaling policy, a schedule, a person).
    AsgScaling,
    AsgInstanceRefresh,
    AsgAzRebalance,
    AsgMaxLifetime,
    /// TerminateInstanceInAutoScalingGroup by a person or a tool.
    AsgPerson,
    /// The group ended it and its scaling activity gives no cause named above (a
    /// health check, a phrase AWS added later).
    AsgOther,
    /// An instance going back to the group's warm pool.
    WarmPool,
    /// `drain NODE` from the command line.
    DrainCommand,
    /// An EC2 rebalance recommendation with `rebalance: drain`.
    Rebalance,
}

/// Each cause's name in the configuration, and the group names that stand for
/// several: the one place each is spelled.
const SPELLED: &[(&str, &[Cause])] = &[
    ("ca-empty", &[Cause::CaEmpty]),
    ("ca-occupied", &[Cause::CaOccupied]),
    ("ca", &[Cause::CaEmpty, Cause::CaOccupied]),
    ("asg-scaling", &[Cause::AsgScaling]),
    ("asg-instance-refresh", &[Cause::AsgInstanceRefresh]),
    ("asg-az-rebalance", &[Cause::AsgAzRebalance]),
    ("asg-max-lifetime", &[Cause::AsgMaxLifetime]),
    ("asg-person", &[Cause::AsgPerson]),
    ("asg-other", &[Cause::AsgOther]),
    ("asg", &asg_cause::ASG_CAUSES),
    ("warm-pool", &[Cause::WarmPool]),
    ("drain-command", &[Cause::DrainCommand]),
    ("rebalance-recommendation", &[Cause::Rebalance]),
];

/// Names an operator may try that are never budgeted, and why.
const EXEMPT: &[&str] = &[
    "spot-interruption",
    "scheduled-event",
    "instance-state-change",
];

impl Cause {
    /// The causes a configured name stands for; a clear error otherwise.
    pub fn parse(name: &str) -> Result<&'static [Cause], String> {
        if let Some((_, causes)) = SPELLED.iter().find(|(n, _)| *n == name) {
            return Ok(causes);
        }
        let shown: String = name.chars().take(64).collect();
        if EXEMPT.contains(&name) {
            return Err(format!(
                "{shown:?} is never budgeted: the instance ends at AWS's time whatever a budget says, so its drain always starts at once"
            ));
        }
        let known: Vec<&str> = SPELLED.iter().map(|(n, _)| *n).collect();
        Err(format!(
            "{shown:?} is not a cause; one of {}",
            known.join(", ")
        ))
    }

    pub fn as_str(&self) -> &'static str {
        SPELLED
            .iter()
            .find(|(_, c)| c.len() == 1 && c[0] == *self)
            .map(|(n, _)| *n)
            .unwrap_or("unknown")
    }
}

/// A budget's `nodes`: a count, or a percent of the nodes it covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Nodes {
    Count(u32),
    Percent(u8),
}

impl Nodes {
    /// `"3"` or `"20%"` (0 to 100).
    pub fn parse(text: &str) -> Result<Nodes, String> {
        let t = text.trim();
        let shown: String = t.chars().take(32).collect();
        if let Some(p) = t.strip_suffix('%') {
            return p
                .trim()
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= 100)
                .map(Nodes::Percent)
                .ok_or_else(|| format!("{shown:?} is not a percent from 0% to 100%"));
        }
        t.parse::<u32>()
            .ok()
            .filter(|n| *n <= 100_000)
            .map(Nodes::Count)
            .ok_or_else(|| format!("{shown:?} is not a count (0 to 100000) or a percent (\"20%\")"))
    }

    /// How many of `covered` nodes may drain at once (a percent rounded up).
    pub fn allowed(&self, covered: usize) -> usize {
        match *self {
            Nodes::Count(n) => n as usize,
            Nodes::Percent(p) => (covered * p as usize).div_ceil(100),
        }
    }
}

/// Which groups a budget covers.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Groups {
    #[default]
    All,
    Named(BTreeSet<String>),
    /// Every tag given must be on the group; a tag without a value matches any value.
    Tagged(BTreeMap<String, Option<String>>),
}

impl Groups {
    /// Whether the group named `group`, with its `tags`, is one of these. The one
    /// selector of budgets and of `scaleIn.groupOverrides`.
    pub fn selects(&self, group: &str, tags: &BTreeMap<String, String>) -> bool {
        match self {
            Groups::All => true,
            Groups::Named(names) => names.contains(group),
            Groups::Tagged(want) => want.iter().all(|(k, v)| {
                tags.get(k)
                    .is_some_and(|have| v.as_ref().is_none_or(|want| want == have))
            }),
        }
    }

    /// In words: `every group`, `groups a, b`, `groups tagged k=v,k2=*`.
    pub fn said(&self) -> String {
        match self {
            Groups::All => "every group".to_string(),
            Groups::Named(n) => format!(
                "groups {}",
                n.iter().cloned().collect::<Vec<_>>().join(", ")
            ),
            Groups::Tagged(t) => format!(
                "groups tagged {}",
                t.iter()
                    .map(|(k, v)| format!("{k}={}", v.as_deref().unwrap_or("*")))
                    .collect::<Vec<_>>()
                    .join(",")
            ),
        }
    }
}

/// When a budget is in force: from each time `schedule` fires, for `duration`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Window {
    pub schedule: cron::Cron,
    pub duration: Duration,
}

/// At most `starts` drain starts per `per`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    pub starts: u32,
    pub per: Duration,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Budget {
    /// How Events, metrics and `status` name it (`budget-N` when not given).
    pub name: String,
    pub nodes: Nodes,
    pub groups: Groups,
    /// Empty: every zone.
    pub zones: BTreeSet<String>,
    /// `None`: every cause.
    pub causes: Option<BTreeSet<Cause>>,
    pub window: Option<Window>,
    pub rate: Option<Rate>,
}

/// Where a node is: its group (with the group's tags) and zone.
#[derive(Debug, Clone, Copy)]
pub struct Place<'a> {
    pub group: &'a str,
    pub zone: &'a str,
    pub tags: &'a BTreeMap<String, String>,
}

/// A drain as budgets see it.
#[derive(Debug, Clone)]
pub struct Drain<'a> {
    pub place: Place<'a>,
    pub causes: &'a [Cause],
    /// The instance ends anyway (rule 1).
    pub exempt: bool,
}

/// A drain's facts as budgets see them, owned: what the engine keeps with the
/// drain's slot.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Placed {
    pub group: String,
    pub zone: String,
    pub tags: std::sync::Arc<BTreeMap<String, String>>,
    pub causes: Vec<Cause>,
    pub exempt: bool,
    /// Started past the budgets because our hook holds it ([`force_at`]).
    pub forced: bool,
}

impl Placed {
    pub fn drain(&self) -> Drain<'_> {
        Drain {
            place: Place {
                group: &self.group,
                zone: &self.zone,
                tags: &self.tags,
            },
            causes: &self.causes,
            exempt: self.exempt,
        }
    }
}

/// What is known of a drain besides its record, for its causes.
#[derive(Debug, Clone, Copy, Default)]
pub struct Asked {
    /// CA's DeleteNodes asked for it in this process (a lifecycle-mode scale-in
    /// reads as our hook's hold on the record, which says so itself once the drain
    /// has written it: `Why::Lifecycle::by_ca`).
    pub by_ca: bool,
    /// The node runs no workload pod; `None`: not read (or could not be), which
    /// counts as both empty and occupied, so either budget governs it.
    pub empty: Option<bool>,
    /// The group returns scaled-in instances to its warm pool.
    pub to_warm_pool: bool,
    /// The group's own cause of a scale-in our hook holds, as its scaling activity
    /// states it ([`asg_cause::classify`]); `None`: not read (no budget tells the
    /// ASG's causes apart) or could not be, which counts as every `asg-*` cause, so
    /// whichever budget lists one governs it.
    pub asg: Option<Cause>,
}

/// The causes of a drain from the reasons that drive it, and whether it is exempt
/// (rule 1: an interruption notice other than a rebalance recommendation).
pub fn causes_of(record: &super::record::DrainRecord, asked: Asked) -> (Vec<Cause>, bool) {
    use super::record::Why;
    let ca = match asked.empty {
        Some(true) => vec![Cause::CaEmpty],
        Some(false) => vec![Cause::CaOccupied],
        None => vec![Cause::CaEmpty, Cause::CaOccupied],
    };
    let mut causes = BTreeSet::new();
    let mut exempt = false;
    for r in record.reasons.iter().filter(|r| !r.done && r.why.drains()) {
        match &r.why {
            Why::Notice { notice, .. } if notice == super::notice::REBALANCE_KIND => {
                causes.insert(Cause::Rebalance);
            }
            Why::Notice { .. } => exempt = true,
            Why::DrainCommand => {
                causes.insert(Cause::DrainCommand);
            }
            Why::ScaleIn => causes.extend(ca.iter().copied()),
            Why::Lifecycle { by_ca: true, .. } => causes.extend(ca.iter().copied()),
            Why::Lifecycle { .. } if asked.by_ca => causes.extend(ca.iter().copied()),
            Why::Lifecycle { .. } if asked.to_warm_pool => {
                causes.insert(Cause::WarmPool);
            }
            Why::Lifecycle { .. } => match asked.asg {
                Some(c) => {
                    causes.insert(c);
                }
                None => causes.extend(asg_cause::ASG_CAUSES),
            },
            Why::Rebalance => {}
        }
    }
    (causes.into_iter().collect(), exempt)
}

/// What the decision reads: every node the budgets may cover, the drains that
/// hold a slot now, and the governed drains' recent starts.
pub struct World<'a> {
    pub now: DateTime<Utc>,
    pub nodes: &'a [Place<'a>],
    pub draining: &'a [Drain<'a>],
    pub starts: &'a [(DateTime<Utc>, Drain<'a>)],
    /// Starts a previous leader counted, per rate budget by name (read back from
    /// the Lease at the takeover, [`carried`]): counted by that budget's rate too.
    pub inherited: &'a carried::Carried,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Go,
    Wait(Hold),
}

/// The budget that holds a drain, and until when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hold {
    pub budget: String,
    pub until: Until,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Until {
    /// `draining` of `allowed` drain now on the nodes it covers.
    SlotFrees { allowed: usize, draining: usize },
    /// `nodes: 0` in force until its window closes.
    WindowCloses(DateTime<Utc>),
    /// The rate's period: the oldest counted start leaves it then.
    Token(DateTime<Utc>),
}

impl Until {
    /// In words, for Events and `status`.
    pub fn said(&self) -> String {
        match self {
            Until::SlotFrees { allowed: 0, .. } => "it allows no drain".to_string(),
            Until::SlotFrees { allowed, draining } => {
                format!("{draining} of {allowed} allowed drain now; starts when one ends")
            }
            Until::WindowCloses(at) => {
                format!("no drain allowed until {}", at.format("%Y-%m-%d %H:%M UTC"))
            }
            Until::Token(at) => format!(
                "its rate is used up; the next start at {}",
                at.format("%H:%M:%S UTC")
            ),
        }
    }
}

impl Budget {
    /// A budget `name` of `nodes` over every group, zone and cause, always in force,
    /// with no rate: the plainest one (the benchmark's, the tests'); a field set
    /// beside it narrows it (`Budget { groups, ..Budget::always(name, nodes) }`).
    pub fn always(name: &str, nodes: Nodes) -> Budget {
        Budget {
            name: name.to_string(),
            nodes,
            groups: Groups::All,
            zones: BTreeSet::new(),
            causes: None,
            window: None,
            rate: None,
        }
    }

    /// The budget in one line (check-config): its name, nodes, what it covers and
    /// governs, when and how fast.
    pub fn said(&self) -> String {
        let nodes = match self.nodes {
            Nodes::Count(n) => format!("{n} node(s) at once"),
            Nodes::Percent(p) => format!("{p}% of the nodes it covers at once (rounded up)"),
        };
        let groups = self.groups.said();
        let zones = if self.zones.is_empty() {
            String::new()
        } else {
            format!(
                " in {}",
                self.zones.iter().cloned().collect::<Vec<_>>().join(", ")
            )
        };
        let causes = self.causes.as_ref().map_or("every cause".to_string(), |c| {
            c.iter().map(Cause::as_str).collect::<Vec<_>>().join(", ")
        });
        let window = self.window.as_ref().map_or(String::new(), |w| {
            format!(
                ", in force for {}s from each firing of its schedule (UTC)",
                w.duration.as_secs()
            )
        });
        let rate = self.rate.map_or(String::new(), |r| {
            format!(", at most {} start(s) per {}s", r.starts, r.per.as_secs())
        });
        format!(
            "{}: {nodes}, {groups}{zones}, for {causes}{window}{rate}",
            self.name
        )
    }

    /// Rule 2: `Some(end)` while in force (`end`: when its window closes, `None`
    /// for a budget without a schedule).
    pub fn in_force(&self, now: DateTime<Utc>) -> Option<Option<DateTime<Utc>>> {
        let Some(w) = &self.window else {
            return Some(None);
        };
        let span = Span::from_std(w.duration).ok()?;
        w.schedule
            .fired_within(now, span)
            .map(|fired| Some(fired + span))
    }

    /// Whether the budget covers a node at `place`.
    pub fn covers(&self, place: &Place<'_>) -> bool {
        self.groups.selects(place.group, place.tags)
            && (self.zones.is_empty() || self.zones.contains(place.zone))
    }

    /// Rule 3.
    pub fn governs(&self, drain: &Drain<'_>) -> bool {
        !drain.exempt
            && self.covers(&drain.place)
            && self
                .causes
                .as_ref()
                .is_none_or(|listed| drain.causes.iter().any(|c| listed.contains(c)))
    }

    /// How many drains the budget allows now, and how many it counts (rule 4, 5).
    pub fn room(&self, world: &World<'_>) -> (usize, usize) {
        let covered = world.nodes.iter().filter(|p| self.covers(p)).count();
        let draining = world
            .draining
            .iter()
            .filter(|d| self.covers(&d.place))
            .count();
        (self.nodes.allowed(covered), draining)
    }

    /// What this budget says of `drain` (which it governs, in force).
    fn holds(&self, world: &World<'_>, end: Option<DateTime<Utc>>) -> Option<Until> {
        let (allowed, draining) = self.room(world);
        if allowed == 0 {
            if let Some(end) = end {
                return Some(Until::WindowCloses(end));
            }
        }
        if draining >= allowed {
            return Some(Until::SlotFrees { allowed, draining });
        }
        let rate = self.rate?;
        let per = Span::from_std(rate.per).unwrap_or(Span::MAX);
        let counted = self.counted_starts(world);
        if counted.len() < rate.starts as usize {
            return None;
        }
        // The start whose leaving brings the count below the rate.
        let leaving = counted[counted.len() - rate.starts as usize];
        Some(Until::Token(leaving + per))
    }
}

impl Budget {
    /// The starts this budget's rate counts now, oldest first: those it governed
    /// within `rate.per` and those a previous leader counted for it, once each (a
    /// start this replica made and also inherited back, to the millisecond). None
    /// without a rate.
    pub fn counted_starts(&self, world: &World<'_>) -> Vec<DateTime<Utc>> {
        let Some(rate) = self.rate else {
            return Vec::new();
        };
        let per = Span::from_std(rate.per).unwrap_or(Span::MAX);
        let within = |at: &DateTime<Utc>| *at > world.now - per && *at <= world.now;
        // Per millisecond: how many starts this replica saw, how many it inherited;
        // the same start seen both ways counts once, two starts in one millisecond
        // twice.
        let mut at_ms: BTreeMap<i64, (DateTime<Utc>, usize, usize)> = BTreeMap::new();
        for (at, d) in world.starts {
            if within(at) && self.governs(d) {
                at_ms.entry(at.timestamp_millis()).or_insert((*at, 0, 0)).1 += 1;
            }
        }
        for (at, _) in world.inherited.get(&self.name).into_iter().flatten() {
            let at = (*at).min(world.now);
            if within(&at) {
                at_ms.entry(at.timestamp_millis()).or_insert((at, 0, 0)).2 += 1;
            }
        }
        at_ms
            .into_values()
            .flat_map(|(at, own, inherited)| std::iter::repeat_n(at, own.max(inherited)))
            .collect()
    }
}

/// Rules 1 to 4: whether `drain` may start now, else the first budget (in the
/// order written) that holds it.
pub fn verdict(budgets: &[Budget], drain: &Drain<'_>, world: &World<'_>) -> Verdict {
    if drain.exempt {
        return Verdict::Go;
    }
    for b in budgets {
        let Some(end) = b.in_force(world.now) else {
            continue;
        };
        if !b.governs(drain) {
            continue;
        }
        if let Some(until) = b.holds(world, end) {
            return Verdict::Wait(Hold {
                budget: b.name.clone(),
                until,
            });
        }
    }
    Verdict::Go
}

/// The latest a drain our hook holds may start, whatever the budgets say: the
/// hook's global timeout (100 heartbeat timeouts, at most 48 hours, from when the
/// hold began) less what its drain may take (`drain_takes`) and a `margin`
/// (when the hold began is known to within the lifecycle poll).
pub fn force_at(
    hold_began: DateTime<Utc>,
    heartbeat_timeout: Duration,
    drain_takes: Duration,
    margin: Duration,
) -> DateTime<Utc> {
    let room = hook_global(heartbeat_timeout)
        .saturating_sub(drain_takes)
        .saturating_sub(margin);
    hold_began + Span::from_std(room).unwrap_or(Span::zero())
}

/// `waitForReplacement`: a drain of a group that asks for it starts only once the
/// group has its desired capacity InService again (as AWS says it, read fresh), so
/// that the pods it evicts have the replacement to go to (an instance refresh, an AZ
/// rebalance, a person's terminate without decrement). An exempt drain (spot, a
/// scheduled event, a stopped instance) never waits: the instance ends anyway. A
/// scale-in that lowered the desired capacity, or a drain of an instance still
/// InService (CA's direct scale-in, `drain NODE`), finds the count met at once.
pub fn awaits_replacement(exempt: bool, in_service: usize, desired: usize) -> bool {
    !exempt && in_service < desired
}

/// How long AWS keeps a lifecycle action whose heartbeats go on: 100 heartbeat
/// timeouts, at most 48 hours.
pub fn hook_global(heartbeat_timeout: Duration) -> Duration {
    heartbeat_timeout
        .saturating_mul(100)
        .min(Duration::from_secs(48 * 3600))
}

/// For a drain our hook holds: from the hold's start, the longest its workloads
/// may take so that what follows them (`after_workloads`: the DaemonSet and volume
/// phases) and a `margin` still end inside the hook's global timeout.
pub fn hook_room(
    heartbeat_timeout: Duration,
    after_workloads: Duration,
    margin: Duration,
) -> Duration {
    hook_global(heartbeat_timeout)
        .saturating_sub(after_workloads)
        .saturating_sub(margin)
}

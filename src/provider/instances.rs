//! What NodeGroupNodes reports: ASG lifecycle states mapped to CA's three states, and
//! placeholder instances for capacity that has no instance (yet, or ever). Pure.

use crate::cloud::{AsgInstance, LaunchFailure, LifecycleState};

use super::provider_id;

/// CA's instance states.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InstanceState {
    Running,
    Creating,
    Deleting,
}

/// CA's InstanceErrorInfo classes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    OutOfResources = 1,
    Other = 99,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceError {
    pub code: String,
    pub message: String,
    pub class: ErrorClass,
}

/// One entry of NodeGroupNodes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceView {
    /// Equal to the Node's providerID, as CA matches them by string.
    pub id: String,
    pub state: InstanceState,
    pub error: Option<InstanceError>,
}

pub use super::provider_id::PLACEHOLDER_PREFIX;

pub fn is_placeholder(instance_id: &str) -> bool {
    instance_id.starts_with(PLACEHOLDER_PREFIX)
}

/// The id of placeholder `n` of `group`: `i-placeholder-<encoded group>-<n>`.
///
/// ASG names may hold any character (spaces, `/`, `:`, Unicode) and run to 255
/// characters, but an instance id inside `aws:///<zone>/<id>` may hold only
/// `[A-Za-z0-9-]` here (a `/` would end it early, and CA uses it as a node name). So
/// ASCII letters, digits and `-` stay as they are and every other byte of the name's
/// UTF-8 is written `_xx` (two lowercase hex digits): reversible for every name, and
/// unchanged for the usual `[A-Za-z0-9-]` names.
pub fn placeholder_id(group: &str, n: usize) -> String {
    let mut out = String::with_capacity(PLACEHOLDER_PREFIX.len() + group.len() * 3 + 8);
    out.push_str(PLACEHOLDER_PREFIX);
    for b in group.bytes() {
        if b.is_ascii_alphanumeric() || b == b'-' {
            out.push(b as char);
        } else {
            out.push_str(&format!("_{b:02x}"));
        }
    }
    out.push('-');
    out.push_str(&n.to_string());
    out
}

pub use super::provider_id::PLACEHOLDER_ID_MAX;

/// The group a placeholder id names (see [`placeholder_id`]); the last
/// dash-separated part is the index. `None` when the id is not a placeholder or
/// does not decode.
pub fn placeholder_group(instance_id: &str) -> Option<String> {
    let rest = instance_id.strip_prefix(PLACEHOLDER_PREFIX)?;
    let (group, n) = rest.rsplit_once('-')?;
    if group.is_empty() || n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let bytes = group.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'_' => {
                let hex = group.get(i + 1..i + 3)?;
                if !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                    return None;
                }
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b if b.is_ascii_alphanumeric() || b == b'-' => {
                out.push(b);
                i += 1;
            }
            _ => return None,
        }
    }
    String::from_utf8(out).ok()
}

/// The slot a placeholder id names (see [`placeholder_id`]): `n` of the group's
/// `target - live` unfulfilled slots when it was listed. `None` when not a placeholder.
pub fn placeholder_index(instance_id: &str) -> Option<usize> {
    placeholder_group(instance_id)?;
    let (_, n) = instance_id.rsplit_once('-')?;
    n.parse().ok()
}

/// ASG lifecycle state -> CA state. Standby and detaching instances are not serving
/// but still exist, so CA sees them as running (it must not count them as launching).
pub fn map_state(state: &LifecycleState) -> InstanceState {
    match state {
        s if s.is_pending() => InstanceState::Creating,
        s if s.is_leaving() => InstanceState::Deleting,
        _ => InstanceState::Running,
    }
}

/// Capacity failures CA should treat as "this group is out of resources" and back off.
fn error_class(code: &str) -> ErrorClass {
    match code {
        "InsufficientInstanceCapacity"
        | "VcpuLimitExceeded"
        | "InstanceLimitExceeded"
        | "MaxSpotInstanceCountExceeded"
        | "SpotMaxPriceTooLow"
        | "InsufficientFreeAddressesInSubnet"
        | "InsufficientCapacity"
        | "Unsupported" => ErrorClass::OutOfResources,
        _ => ErrorClass::Other,
    }
}

/// Builds the full instance list of a group.
///
/// - `deleting` says which instances this service has asked to end and AWS may not
///   yet show as terminating.
/// - Placeholders fill `target - live` (live = instances that fill a slot: not
///   terminating, not in Standby, which AWS keeps outside the desired capacity); when a
///   launch failed recently (`failure`), each placeholder above `floor` carries it,
///   so CA stops waiting for the capacity, backs off and tries another group.
/// - Placeholders below `floor` (max of the ASG's MinSize and the MinSize CA is
///   told) never carry it. With error info CA does not count an instance as
///   unregistered (clusterstate.go getNotRegisteredNodes, 1.31.5 to 1.35.2), so the
///   group's size looks incorrect and, after MaxNodeProvisionTime, fixNodeGroupSize
///   asks DecreaseTargetSize to go below the minimum, which must be refused, and that
///   error ends CA's whole RunOnce (static_autoscaler.go). Without it the slot is an
///   unregistered node: CA counts it as upcoming for MaxNodeProvisionTime, then
///   removeOldUnregisteredNodes skips the group with the warning "min size reached".
///   The failure is reported by [`failed_below_floor`] instead.
pub fn list(
    group: &str,
    zone_for_placeholders: &str,
    instances: &[AsgInstance],
    target: i32,
    floor: i32,
    deleting: &dyn Fn(&str) -> bool,
    failure: Option<&LaunchFailure>,
) -> Vec<InstanceView> {
    let mut out = Vec::with_capacity(instances.len().max(target.max(0) as usize));
    let mut live = 0i32;
    for i in instances {
        let mut state = map_state(&i.state);
        if deleting(&i.id) {
            state = InstanceState::Deleting;
        }
        // A Standby instance is listed (its Node still runs) but fills no slot.
        if state != InstanceState::Deleting && !i.state.is_standby() {
            live += 1;
        }
        out.push(InstanceView {
            id: i.provider_id(),
            state,
            error: None,
        });
    }
    let error = failure.map(|f| InstanceError {
        code: f.code.clone(),
        message: format!("ASG {group} failed to launch capacity: {}", f.message),
        class: error_class(&f.code),
    });
    for n in 0..(target - live).max(0) {
        let below_floor = live.saturating_add(n) < floor;
        out.push(InstanceView {
            id: provider_id::for_instance(
                zone_for_placeholders,
                &placeholder_id(group, n as usize),
            ),
            state: InstanceState::Creating,
            error: if below_floor { None } else { error.clone() },
        });
    }
    out
}

/// How many unfulfilled slots below `floor` a recent launch failure leaves: the
/// placeholders [`list`] reports without error info (0 without a failure).
pub fn failed_below_floor(live: i32, target: i32, floor: i32, failure: bool) -> i32 {
    if !failure {
        return 0;
    }
    (floor.min(target) - live).max(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_placeholder_names_its_slot() {
        assert_eq!(placeholder_index(&placeholder_id("web", 0)), Some(0));
        assert_eq!(placeholder_index(&placeholder_id("a-b c/d", 17)), Some(17));
        assert_eq!(placeholder_index("i-0123456789abcdef0"), None);
        assert_eq!(placeholder_index("i-placeholder-web-"), None);
        assert_eq!(
            placeholder_index("i-placeholder-web-99999999999999999999999"),
            None,
            "too large for a slot"
        );
    }

    #[test]
    fn placeholder_ids_name_their_group() {
        assert_eq!(
            placeholder_group("i-placeholder-web-0").as_deref(),
            Some("web")
        );
        assert_eq!(
            placeholder_group("i-placeholder-eks-ng-a1-b2-12").as_deref(),
            Some("eks-ng-a1-b2")
        );
        assert_eq!(placeholder_group("i-placeholder-web-"), None);
        assert_eq!(placeholder_group("i-placeholder-web-x"), None);
        assert_eq!(placeholder_group("i-placeholder--3"), None);
        assert_eq!(placeholder_group("i-0abc"), None);
        // Not what placeholder_id writes: refused, not guessed.
        assert_eq!(placeholder_group("i-placeholder-a_zz-0"), None);
        assert_eq!(placeholder_group("i-placeholder-a_4-0"), None);
        assert_eq!(placeholder_group("i-placeholder-a.b-0"), None);
        assert_eq!(placeholder_group("i-placeholder-_ff-0"), None, "not UTF-8");
    }

    #[test]
    fn every_legal_asg_name_round_trips_through_its_placeholder_ids() {
        let long = "x".repeat(255);
        let long_wide = "\u{10348}".repeat(255);
        let names = [
            "web",
            "my group",
            "team/a:prod",
            "eks_ng.1",
            "a-_2f-b",
            "_",
            "-",
            "0",
            "名前 / ノード",
            long.as_str(),
            long_wide.as_str(),
        ];
        for name in names {
            for n in [0usize, 7, 1234] {
                let id = placeholder_id(name, n);
                assert!(id.len() <= PLACEHOLDER_ID_MAX, "{} bytes", id.len());
                assert_eq!(placeholder_group(&id).as_deref(), Some(name), "{id}");
                let pid = provider_id::for_instance("us-east-1a", &id);
                assert_eq!(provider_id::instance_id(&pid), Some(id.as_str()), "{pid}");
                assert!(is_placeholder(&id));
            }
        }
        // Plain names keep their readable ids.
        assert_eq!(placeholder_id("web-1", 2), "i-placeholder-web-1-2");
        // Different names never share an id.
        assert_ne!(placeholder_id("a b", 0), placeholder_id("a_20b", 0));
    }

    fn inst(id: &str, state: &str) -> AsgInstance {
        AsgInstance {
            id: id.into(),
            zone: "us-east-1a".into(),
            state: LifecycleState::parse(state),
            instance_type: Some("m5.large".into()),
        }
    }

    #[test]
    fn maps_every_lifecycle_state() {
        let cases = [
            ("Pending", InstanceState::Creating),
            ("Pending:Wait", InstanceState::Creating),
            ("Pending:Proceed", InstanceState::Creating),
            ("InService", InstanceState::Running),
            ("Terminating", InstanceState::Deleting),
            ("Terminating:Wait", InstanceState::Deleting),
            ("Terminating:Proceed", InstanceState::Deleting),
            ("Terminated", InstanceState::Deleting),
            ("Detaching", InstanceState::Deleting),
            ("Detached", InstanceState::Deleting),
            ("Standby", InstanceState::Running),
            ("EnteringStandby", InstanceState::Running),
            ("Warmed:Running", InstanceState::Running),
        ];
        for (s, want) in cases {
            assert_eq!(map_state(&LifecycleState::parse(s)), want, "{s}");
        }
    }

    #[test]
    fn ids_are_provider_ids() {
        let v = list(
            "g",
            "us-east-1a",
            &[inst("i-1", "InService")],
            1,
            0,
            &|_| false,
            None,
        );
        assert_eq!(v.len(), 1);
        assert_eq!(v[0].id, "aws:///us-east-1a/i-1");
        assert_eq!(v[0].state, InstanceState::Running);
    }

    #[test]
    fn placeholders_fill_unfulfilled_capacity_without_error_when_nothing_failed() {
        let v = list(
            "g",
            "us-east-1b",
            &[inst("i-1", "InService"), inst("i-2", "Terminating")],
            3,
            0,
            &|_| false,
            None,
        );
        assert_eq!(v.len(), 4);
        let ph: Vec<_> = v
            .iter()
            .filter(|i| i.id.contains(PLACEHOLDER_PREFIX))
            .collect();
        assert_eq!(ph.len(), 2);
        assert!(ph
            .iter()
            .all(|p| p.state == InstanceState::Creating && p.error.is_none()));
        assert_eq!(ph[0].id, "aws:///us-east-1b/i-placeholder-g-0");
    }

    #[test]
    fn placeholders_carry_a_recent_launch_failure() {
        let f = LaunchFailure {
            group: "g".into(),
            code: "InsufficientInstanceCapacity".into(),
            message: "no capacity".into(),
            started_at_unix: 0,
        };
        let v = list("g", "z", &[], 2, 0, &|_| false, Some(&f));
        assert_eq!(v.len(), 2);
        for p in &v {
            let e = p.error.as_ref().unwrap();
            assert_eq!(e.class, ErrorClass::OutOfResources);
            assert_eq!(e.code, "InsufficientInstanceCapacity");
        }
        let other = LaunchFailure {
            code: "AccessDenied".into(),
            ..f
        };
        let v = list("g", "z", &[], 1, 0, &|_| false, Some(&other));
        assert_eq!(v[0].error.as_ref().unwrap().class, ErrorClass::Other);
    }

    #[test]
    fn placeholders_below_the_minimum_carry_no_error_and_are_counted() {
        let f = LaunchFailure {
            group: "g".into(),
            code: "InsufficientInstanceCapacity".into(),
            message: "no capacity".into(),
            started_at_unix: 0,
        };
        let live = [inst("i-1", "InService")];
        for target in 0..6 {
            for floor in 0..5 {
                let v = list("g", "z", &live, target, floor, &|_| false, Some(&f));
                let ph: Vec<_> = v
                    .iter()
                    .filter(|i| i.id.contains(PLACEHOLDER_PREFIX))
                    .collect();
                assert_eq!(ph.len() as i32, (target - 1).max(0));
                let quiet = ph.iter().filter(|p| p.error.is_none()).count() as i32;
                // Exactly the slots that keep the group at its minimum are quiet.
                assert_eq!(
                    quiet,
                    failed_below_floor(1, target, floor, true),
                    "{target} {floor}"
                );
                assert_eq!(quiet, (floor.min(target) - 1).max(0), "{target} {floor}");
                // The quiet ones come first: ids stay stable while CA asks for more.
                assert!(ph.iter().skip(quiet as usize).all(|p| p.error.is_some()));
            }
        }
        assert_eq!(failed_below_floor(0, 3, 2, false), 0);
    }

    #[test]
    fn locally_deleting_instances_are_deleting_and_not_live() {
        let v = list(
            "g",
            "z",
            &[inst("i-1", "InService"), inst("i-2", "InService")],
            1,
            0,
            &|id| id == "i-2",
            None,
        );
        assert_eq!(v.len(), 2, "no placeholder: one live instance for target 1");
        assert_eq!(v[1].state, InstanceState::Deleting);
    }

    #[test]
    fn negative_or_zero_target_adds_nothing() {
        assert!(list("g", "z", &[], 0, 0, &|_| false, None).is_empty());
        assert!(list("g", "z", &[], -3, 2, &|_| false, None).is_empty());
    }
}

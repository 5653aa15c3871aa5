//! Pure rules for changing a group's size, with messages that carry the numbers.

use super::ProviderError;

/// IncreaseSize: `delta > 0` and `target + delta <= max`. Returns the new target.
pub fn check_increase(
    group: &str,
    target: i32,
    max: i32,
    delta: i32,
) -> Result<i32, ProviderError> {
    if delta <= 0 {
        return Err(ProviderError::InvalidArgument(format!(
            "node group {group}: size increase must be positive, got delta={delta}"
        )));
    }
    let new = target.checked_add(delta).ok_or_else(|| {
        ProviderError::InvalidArgument(format!("node group {group}: delta={delta} overflows"))
    })?;
    if new > max {
        return Err(ProviderError::InvalidArgument(format!(
            "node group {group}: size increase too large: target {target} + delta {delta} = {new} > maxSize {max}"
        )));
    }
    Ok(new)
}

/// What a DecreaseTargetSize does: the new target, and how much of the asked
/// decrease it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decrease {
    pub new: i32,
    /// `target - new`, at most `-delta`.
    pub removed: i32,
    pub asked: i32,
}

impl Decrease {
    pub fn partial(&self) -> bool {
        self.removed < self.asked
    }
}

/// DecreaseTargetSize: `delta < 0`, and only capacity that has no instance may go:
/// the new target never falls below the live (registered or launching) instances,
/// nor below the ASG's MinSize (AWS would refuse it once the running drains have
/// ended, leaving an instance CA wants gone).
///
/// CA asks for more than that only from its clean-up paths, when its view of the
/// group lags: fixNodeGroupSize (whose error aborts CA's whole loop, every loop,
/// in 1.31 to 1.36) and, from 1.36, the revert of a timed-out scale-up. So the
/// unfulfilled part is removed and the call succeeds; instances that exist are
/// left to DeleteNodes, which drains them. Only when nothing at all can be removed
/// is the call refused, naming the numbers.
pub fn check_decrease(
    group: &str,
    target: i32,
    live_instances: i32,
    asg_min: i32,
    delta: i32,
) -> Result<Decrease, ProviderError> {
    if delta >= 0 {
        return Err(ProviderError::InvalidArgument(format!(
            "node group {group}: size decrease must be negative, got delta={delta}"
        )));
    }
    let asked_new = target.checked_add(delta).ok_or_else(|| {
        ProviderError::InvalidArgument(format!("node group {group}: delta={delta} overflows"))
    })?;
    let floor = live_instances.max(asg_min);
    let new = asked_new.max(floor).min(target);
    if new == target {
        let why = if live_instances >= asg_min {
            format!(
                "attempt to delete existing nodes: target {target} + delta {delta} = {asked_new} < {live_instances} existing instances, and no capacity is unfulfilled; existing instances go only through DeleteNodes"
            )
        } else {
            format!("target {target} + delta {delta} = {asked_new} is below the ASG's MinSize {asg_min}")
        };
        return Err(ProviderError::FailedPrecondition(format!(
            "node group {group}: {why}"
        )));
    }
    Ok(Decrease {
        new,
        removed: target - new,
        asked: (-(delta as i64)).min(i32::MAX as i64) as i32,
    })
}

/// DeleteNodes: removing `count` instances must keep the target at or above min.
pub fn check_delete(group: &str, target: i32, min: i32, count: i32) -> Result<(), ProviderError> {
    if count == 0 {
        return Ok(());
    }
    if target - count < min {
        return Err(ProviderError::FailedPrecondition(format!(
            "node group {group}: deleting {count} node(s) would take the target size from {target} to {} below minSize {min}",
            target - count
        )));
    }
    Ok(())
}

/// The desired capacity to write to AWS for CA's new `target`: the target plus the
/// direct-mode drains still running (AWS counts their instances until each ends
/// with a decrement). Writing less would let the ASG end instances of its own
/// choosing, undrained; when the ASG's own maximum has no room for both, the
/// change is refused until the drains end.
pub fn desired_for(
    group: &str,
    target: i32,
    draining: i32,
    asg_max: i32,
) -> Result<i32, ProviderError> {
    let desired = target.checked_add(draining).ok_or_else(|| {
        ProviderError::InvalidArgument(format!("node group {group}: target {target} overflows"))
    })?;
    if desired > asg_max {
        return Err(ProviderError::FailedPrecondition(format!(
            "node group {group}: target {target} plus {draining} node(s) still draining needs desired capacity {desired} > the ASG's MaxSize {asg_max}; retry when the drains end"
        )));
    }
    Ok(desired)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_delete_below_min_is_refused_naming_the_target_it_would_reach() {
        assert!(check_delete("g", 3, 1, 0).is_ok());
        assert!(check_delete("g", 3, 1, 2).is_ok());
        let e = check_delete("g", 3, 1, 3).unwrap_err().to_string();
        assert!(
            e.contains("from 3 to 0 below minSize 1") && e.contains("deleting 3"),
            "{e}"
        );
    }

    #[test]
    fn increase_accepts_up_to_max() {
        assert_eq!(check_increase("g", 3, 10, 7).unwrap(), 10);
        assert_eq!(check_increase("g", 0, 1, 1).unwrap(), 1);
    }

    #[test]
    fn increase_rejects_zero_negative_and_past_max_with_numbers() {
        let e = check_increase("g", 3, 10, 0).unwrap_err();
        assert!(
            matches!(e, ProviderError::InvalidArgument(ref m) if m.contains("delta=0")),
            "{e}"
        );
        let e = check_increase("g", 3, 10, -1).unwrap_err();
        assert!(matches!(e, ProviderError::InvalidArgument(_)));
        let e = check_increase("g", 3, 10, 8).unwrap_err();
        let m = e.to_string();
        assert!(
            m.contains("3") && m.contains("8") && m.contains("11") && m.contains("maxSize 10"),
            "{m}"
        );
        assert!(check_increase("g", i32::MAX, i32::MAX, 1).is_err());
    }

    #[test]
    fn decrease_only_removes_unfulfilled_capacity() {
        let d = check_decrease("g", 5, 3, 0, -2).unwrap();
        assert_eq!((d.new, d.removed, d.partial()), (3, 2, false));
        // Asked for more than is unfulfilled: the unfulfilled part goes, no instance.
        let d = check_decrease("g", 5, 3, 0, -3).unwrap();
        assert_eq!((d.new, d.removed, d.asked, d.partial()), (3, 2, 3, true));
        // Nothing unfulfilled: refused, with the numbers.
        let e = check_decrease("g", 3, 3, 0, -1).unwrap_err();
        assert!(
            matches!(e, ProviderError::FailedPrecondition(ref m) if m.contains("2 < 3 existing instances")),
            "{e}"
        );
        assert!(matches!(
            check_decrease("g", 5, 3, 0, 0),
            Err(ProviderError::InvalidArgument(_))
        ));
        assert!(matches!(
            check_decrease("g", 5, 3, 0, 1),
            Err(ProviderError::InvalidArgument(_))
        ));
        let d = check_decrease("g", 5, 0, 0, i32::MIN).unwrap();
        assert_eq!((d.new, d.removed, d.asked), (0, 5, i32::MAX));
    }

    #[test]
    fn decrease_never_goes_below_live_or_min_for_any_input() {
        for target in 0..8 {
            for live in 0..8 {
                for min in 0..4 {
                    for delta in -10..0 {
                        match check_decrease("g", target, live, min, delta) {
                            Ok(d) => {
                                assert!(d.new >= live && d.new >= min && d.new < target);
                                assert!(d.removed >= 1 && d.removed <= -delta);
                                assert_eq!(d.new, (target + delta).max(live).max(min));
                            }
                            Err(_) => assert!(target <= live.max(min)),
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn echoed_values_are_escaped_and_capped() {
        use crate::provider::{echo, ECHO_MAX};
        assert_eq!(echo("web"), "\"web\"");
        assert_eq!(echo("a\nb\u{1b}"), "\"a\\nb\\u{1b}\"");
        let huge = "x".repeat(4 << 20);
        let e = echo(&huge);
        assert!(e.len() < ECHO_MAX + 40, "{} bytes", e.len());
        assert!(e.ends_with("... (4194304 bytes)"), "{e}");
        let m = ProviderError::UnknownGroup(huge).to_string();
        assert!(m.len() < 256, "{} bytes", m.len());
    }

    #[test]
    fn desired_counts_the_drains_and_stays_within_the_asg() {
        assert_eq!(desired_for("g", 3, 0, 10).unwrap(), 3);
        assert_eq!(desired_for("g", 3, 2, 10).unwrap(), 5);
        assert_eq!(desired_for("g", 8, 2, 10).unwrap(), 10);
        let e = desired_for("g", 9, 2, 10).unwrap_err();
        assert!(
            matches!(e, ProviderError::FailedPrecondition(ref m) if m.contains("2 node(s) still draining") && m.contains("11 > the ASG's MaxSize 10")),
            "{e}"
        );
        assert!(desired_for("g", i32::MAX, 1, i32::MAX).is_err());
    }

    #[test]
    fn decrease_keeps_the_asg_min_even_with_nothing_live() {
        assert_eq!(check_decrease("g", 4, 0, 1, -3).unwrap().new, 1);
        assert_eq!(check_decrease("g", 4, 0, 1, -4).unwrap().new, 1);
        let e = check_decrease("g", 1, 0, 1, -1).unwrap_err();
        assert!(
            matches!(e, ProviderError::FailedPrecondition(ref m) if m.contains("0 is below the ASG's MinSize 1")),
            "{e}"
        );
    }

    #[test]
    fn delete_keeps_min() {
        assert!(check_delete("g", 3, 1, 2).is_ok());
        assert!(check_delete("g", 3, 1, 0).is_ok());
        let e = check_delete("g", 3, 2, 2).unwrap_err();
        assert!(e.to_string().contains("from 3 to 1 below minSize 2"), "{e}");
    }
}

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

/// DecreaseTargetSize: `delta < 0`, and only capacity that has no instance yet may go:
/// the new target may not fall below the number of live (registered or launching)
/// instances, nor below the ASG's MinSize (AWS would refuse it once the running
/// drains have ended, leaving an instance CA wants gone). Returns the new target.
pub fn check_decrease(
    group: &str,
    target: i32,
    live_instances: i32,
    asg_min: i32,
    delta: i32,
) -> Result<i32, ProviderError> {
    if delta >= 0 {
        return Err(ProviderError::InvalidArgument(format!(
            "node group {group}: size decrease must be negative, got delta={delta}"
        )));
    }
    let new = target.checked_add(delta).ok_or_else(|| {
        ProviderError::InvalidArgument(format!("node group {group}: delta={delta} overflows"))
    })?;
    if new < live_instances {
        return Err(ProviderError::FailedPrecondition(format!(
            "node group {group}: attempt to delete existing nodes: target {target} + delta {delta} = {new} < {live_instances} existing instances; only unfulfilled capacity ({}) can be removed this way",
            (target - live_instances).max(0)
        )));
    }
    if new < asg_min {
        return Err(ProviderError::FailedPrecondition(format!(
            "node group {group}: target {target} + delta {delta} = {new} is below the ASG's MinSize {asg_min}"
        )));
    }
    Ok(new)
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
        assert_eq!(check_decrease("g", 5, 3, 0, -2).unwrap(), 3);
        let e = check_decrease("g", 5, 3, 0, -3).unwrap_err();
        assert!(
            matches!(e, ProviderError::FailedPrecondition(ref m) if m.contains("2 < 3 existing")),
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
        assert_eq!(check_decrease("g", 4, 0, 1, -3).unwrap(), 1);
        let e = check_decrease("g", 4, 0, 1, -4).unwrap_err();
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

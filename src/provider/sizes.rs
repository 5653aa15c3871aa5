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
/// instances. Returns the new target.
pub fn check_decrease(
    group: &str,
    target: i32,
    live_instances: i32,
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
        assert_eq!(check_decrease("g", 5, 3, -2).unwrap(), 3);
        let e = check_decrease("g", 5, 3, -3).unwrap_err();
        assert!(
            matches!(e, ProviderError::FailedPrecondition(ref m) if m.contains("2 < 3 existing")),
            "{e}"
        );
        assert!(matches!(
            check_decrease("g", 5, 3, 0),
            Err(ProviderError::InvalidArgument(_))
        ));
        assert!(matches!(
            check_decrease("g", 5, 3, 1),
            Err(ProviderError::InvalidArgument(_))
        ));
    }

    #[test]
    fn delete_keeps_min() {
        assert!(check_delete("g", 3, 1, 2).is_ok());
        assert!(check_delete("g", 3, 1, 0).is_ok());
        let e = check_delete("g", 3, 2, 2).unwrap_err();
        assert!(e.to_string().contains("from 3 to 1 below minSize 2"), "{e}");
    }
}

//! Go-style durations (`90s`, `1m30s`, `500ms`, `1h`), as CA and Kubernetes users write
//! them. Pure.

use std::time::Duration;

/// Parses a Go duration. A bare `0` is zero; negative values are refused.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    if s.is_empty() {
        return Err("empty duration".into());
    }
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    if s.starts_with('-') {
        return Err(format!("{s:?} is negative"));
    }
    let mut total = 0f64;
    let mut rest = s.strip_prefix('+').unwrap_or(s);
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(|| format!("{s:?} is missing a unit (ns, us, ms, s, m, h)"))?;
        if num_len == 0 {
            return Err(format!("{s:?} is not a duration like 90s, 1m30s or 500ms"));
        }
        let value: f64 = rest[..num_len]
            .parse()
            .map_err(|_| format!("{s:?}: {:?} is not a number", &rest[..num_len]))?;
        rest = &rest[num_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let secs = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            u => {
                return Err(format!(
                    "{s:?}: unknown unit {u:?} (use ns, us, ms, s, m, h)"
                ))
            }
        };
        total += value * secs;
        rest = &rest[unit_len..];
    }
    if !total.is_finite() || total > 10.0 * 365.0 * 86400.0 {
        return Err(format!("{s:?} is too long"));
    }
    Ok(Duration::from_secs_f64(total))
}

/// Formats a duration the way Go prints it (`1h30m0s`, `90s` -> `1m30s`, `500ms`).
pub fn format_duration(d: Duration) -> String {
    let total_ms = d.as_millis();
    if total_ms < 1000 && !d.is_zero() {
        return format!("{total_ms}ms");
    }
    let secs = d.as_secs();
    let (h, m, s) = (secs / 3600, (secs % 3600) / 60, secs % 60);
    match (h, m) {
        (0, 0) => format!("{s}s"),
        (0, _) => format!("{m}m{s}s"),
        _ => format!("{h}h{m}m{s}s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_go_forms() {
        assert_eq!(parse_duration("90s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("1m30s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("1h").unwrap(), Duration::from_secs(3600));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("1.5h").unwrap(), Duration::from_secs(5400));
        assert_eq!(parse_duration("0").unwrap(), Duration::ZERO);
        assert_eq!(parse_duration(" 10m ").unwrap(), Duration::from_secs(600));
    }

    #[test]
    fn refuses_bad_forms_with_the_value() {
        for bad in [
            "",
            "10",
            "-5s",
            "5x",
            "s",
            "1..5s",
            "5 parsecs",
            "99999999999h",
        ] {
            let e = parse_duration(bad).unwrap_err();
            assert!(bad.is_empty() || e.contains(bad.trim()), "{bad}: {e}");
        }
    }

    #[test]
    fn formats_like_go() {
        assert_eq!(format_duration(Duration::from_secs(90)), "1m30s");
        assert_eq!(format_duration(Duration::from_secs(5400)), "1h30m0s");
        assert_eq!(format_duration(Duration::from_millis(250)), "250ms");
        assert_eq!(format_duration(Duration::ZERO), "0s");
    }
}

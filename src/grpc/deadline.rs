//! The deadline cluster-autoscaler sends with each call (gRPC's `grpc-timeout`
//! header; CA's cloud-config `grpc_timeout`, 5 s by default), and how much of it a
//! call may spend before it must answer. Pure.

use std::time::Duration;

/// The header's name.
pub const HEADER: &str = "grpc-timeout";

/// Reads a `grpc-timeout` value: one to eight ASCII digits and a unit (`H`, `M`,
/// `S`, `m`, `u`, `n`), as the gRPC HTTP/2 protocol defines it. Anything else is
/// `None` (the caller keeps its own bound).
pub fn parse(value: &str) -> Option<Duration> {
    let unit = value.chars().last()?;
    let digits = &value[..value.len() - unit.len_utf8()];
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        'H' => Duration::from_secs(n * 3600),
        'M' => Duration::from_secs(n * 60),
        'S' => Duration::from_secs(n),
        'm' => Duration::from_millis(n),
        'u' => Duration::from_micros(n),
        'n' => Duration::from_nanos(n),
        _ => return None,
    })
}

/// How long a call may work before it answers, given the deadline the client sent:
/// four fifths of it (4 s of CA's default 5 s), so that the answer is back before CA
/// gives up; without a deadline, `default`.
pub fn answer_within(sent: Option<Duration>, default: Duration) -> Duration {
    sent.map_or(default, share)
}

/// Four fifths of a deadline `sent`: how long a call may work before it answers.
pub fn share(sent: Duration) -> Duration {
    sent.saturating_sub(sent / 5)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_every_unit_and_refuses_the_rest() {
        assert_eq!(parse("5S"), Some(Duration::from_secs(5)));
        assert_eq!(parse("4999m"), Some(Duration::from_millis(4999)));
        assert_eq!(parse("2M"), Some(Duration::from_secs(120)));
        assert_eq!(parse("1H"), Some(Duration::from_secs(3600)));
        assert_eq!(parse("700u"), Some(Duration::from_micros(700)));
        assert_eq!(parse("99999999n"), Some(Duration::from_nanos(99_999_999)));
        for bad in [
            "",
            "S",
            "5",
            "5s",
            "123456789S",
            "-5S",
            "5 S",
            "5.0S",
            "五S",
            "5SS",
        ] {
            assert_eq!(parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn answers_before_the_client_gives_up() {
        let default = Duration::from_secs(4);
        assert_eq!(answer_within(None, default), default);
        assert_eq!(
            answer_within(Some(Duration::from_secs(5)), default),
            Duration::from_secs(4)
        );
        assert_eq!(
            answer_within(Some(Duration::from_secs(30)), default),
            Duration::from_secs(24)
        );
        assert_eq!(answer_within(Some(Duration::ZERO), default), Duration::ZERO);
        for ms in [1u64, 10, 999, 5000, 86_400_000] {
            let t = Duration::from_millis(ms);
            assert!(answer_within(Some(t), default) < t, "{t:?}");
        }
    }
}

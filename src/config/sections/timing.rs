//! `refreshInterval`, `refreshWait`, `caCallTimeout` and `launchFailureWindow`: the
//! provider's clocks, and CA's patience they must fit in.

use std::time::Duration;

use super::{bounded_duration, Problems};
use crate::config::{FileConfig, Overrides};

/// The resolved top-level durations.
pub struct Timing {
    pub refresh_interval: Duration,
    pub refresh_wait: Duration,
    pub ca_call_timeout: Duration,
    pub launch_failure_window: Duration,
}

/// Each duration from the flag or the file, the default when unset, never below its
/// minimum.
pub fn resolve(file: &FileConfig, flags: &Overrides, problems: &mut Problems) -> Timing {
    let mut duration = |key: &str, value: Option<&String>, default: Duration, min: Duration| {
        bounded_duration(problems, key, value, default, min, None)
    };
    Timing {
        refresh_interval: duration(
            "refreshInterval",
            flags
                .refresh_interval
                .as_ref()
                .or(file.refresh_interval.as_ref()),
            Duration::from_secs(60),
            Duration::from_secs(1),
        ),
        refresh_wait: duration(
            "refreshWait",
            file.refresh_wait.as_ref(),
            Duration::from_secs(4),
            Duration::from_millis(100),
        ),
        ca_call_timeout: duration(
            "caCallTimeout",
            file.ca_call_timeout.as_ref(),
            Duration::from_secs(5),
            Duration::from_millis(500),
        ),
        launch_failure_window: duration(
            "launchFailureWindow",
            file.launch_failure_window.as_ref(),
            Duration::from_secs(15 * 60),
            Duration::from_secs(10),
        ),
    }
}

/// Refresh must answer before CA gives up on the call.
pub fn check_refresh_wait_fits_ca_call(t: &Timing, problems: &mut Problems) {
    let (refresh_wait, ca_call_timeout) = (t.refresh_wait, t.ca_call_timeout);
    if refresh_wait >= ca_call_timeout {
        problems.bad(
            "refreshWait",
            format!(
                "{refresh_wait:?} must be shorter than caCallTimeout {ca_call_timeout:?} (CA's grpc_timeout): CA would give up on Refresh and fail its loop"
            ),
        );
    }
}

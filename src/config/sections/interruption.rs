//! `interruption:`: queue mode, EC2 interruption notices and lifecycle actions from SQS.

use std::time::Duration;

use super::{bounded_duration, Problems};
use crate::config::InterruptionFile;
use crate::scalein::settings::InterruptionSettings;
use crate::scalein::ScaleInSettings;

/// `interruption:` validated; each problem names its key.
pub fn resolve(f: &InterruptionFile, problems: &mut Problems) -> InterruptionSettings {
    let d = InterruptionSettings::default();
    let mut duration =
        |key: &str, v: Option<&String>, default: Duration, min: Duration, max: Duration| {
            bounded_duration(problems, key, v, default, min, Some(max))
        };
    let wait = duration(
        "interruption.waitTime",
        f.wait_time.as_ref(),
        d.wait,
        Duration::ZERO,
        Duration::from_secs(20),
    );
    let daemonset_share = duration(
        "interruption.daemonSetShare",
        f.daemon_set_share.as_ref(),
        d.daemonset_share,
        Duration::ZERO,
        crate::scalein::decide::record::MAX_DAEMONSET_SHARE,
    );
    let safety_net_poll = duration(
        "interruption.safetyNetPollInterval",
        f.safety_net_poll_interval.as_ref(),
        d.safety_net_poll,
        Duration::from_secs(15),
        Duration::from_secs(3600),
    );
    if let Some(u) = &f.queue_url {
        if !(u.starts_with("https://") || u.starts_with("http://")) {
            problems.bad(
                "interruption.queueUrl",
                format!("{u:?} is not an SQS queue URL (https://sqs.<region>.amazonaws.com/<account>/<name>)"),
            );
        }
    }
    let batch = f.batch_size.unwrap_or(d.batch);
    if !(1..=10).contains(&batch) {
        problems.bad(
            "interruption.batchSize",
            format!("{batch} must be between 1 and 10 (SQS's limit)"),
        );
    }
    let concurrency = f.concurrency.unwrap_or(d.concurrency);
    if !(1..=100).contains(&concurrency) {
        problems.bad(
            "interruption.concurrency",
            format!("{concurrency} must be between 1 and 100"),
        );
    }
    let max_receives = f.max_receives.unwrap_or(d.max_receives);
    if max_receives == 0 {
        problems.bad("interruption.maxReceives", "0 must be at least 1".into());
    }
    InterruptionSettings {
        queue_url: f.queue_url.clone(),
        rebalance: f.rebalance.unwrap_or(d.rebalance),
        unmanaged: f.unmanaged_instances.unwrap_or(d.unmanaged),
        batch: batch.clamp(1, 10),
        concurrency: concurrency.clamp(1, 100),
        wait,
        daemonset_share,
        max_receives: max_receives.max(1),
        safety_net_poll,
    }
}

/// Queue mode over the drain: the queue delivers lifecycle actions, so the poll only
/// catches what it missed (slowed to the safety net's pace); and the queue drains
/// nodes, so it needs the drain on (`scaleIn.enabled` not `false`).
pub fn fit_scale_in(
    interruption: &InterruptionSettings,
    drain_enabled: Option<bool>,
    scale_in: &mut ScaleInSettings,
    problems: &mut Problems,
) {
    if interruption.queue_url.is_some() {
        scale_in.lifecycle_poll_interval = scale_in
            .lifecycle_poll_interval
            .max(interruption.safety_net_poll);
    }
    if interruption.queue_url.is_some() && drain_enabled == Some(false) {
        problems.bad(
            "interruption.queueUrl",
            "queue mode drains nodes; it needs scaleIn.enabled: true".into(),
        );
    }
}

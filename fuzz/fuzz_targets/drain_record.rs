//! The drain record read back from a Node's annotations (anyone with patch on Nodes can
//! write them): whatever the three annotations hold, reading never panics, every reason
//! is dated no later than now, and the drain's start is no later than now.
#![no_main]

use std::collections::BTreeMap;

use ca_asg_provider::scalein::decide::record::{
    DrainRecord, ANNOTATION, MODE_ANNOTATION, STARTED_ANNOTATION,
};
use chrono::{TimeZone, Utc};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    // Three fields: the record's JSON, the start time, the mode (absent when missing).
    let mut parts = text.splitn(3, '\u{1f}');
    let mut annotations = BTreeMap::new();
    for key in [ANNOTATION, STARTED_ANNOTATION, MODE_ANNOTATION] {
        if let Some(v) = parts.next() {
            annotations.insert(key.to_string(), v.to_string());
        }
    }
    let now = Utc.with_ymd_and_hms(2026, 11, 24, 12, 0, 0).unwrap();
    if let Some(r) = DrainRecord::read(&annotations, now) {
        assert!(r.reasons.iter().all(|x| x.at <= now), "a reason dated after now");
        if let Some(began) = r.drain_began() {
            assert!(began <= now, "a drain that began after now");
        }
    }
});

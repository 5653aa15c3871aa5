#![allow(dead_code)]
pub mod acting;
pub mod budget_floor;
pub mod eks;
pub mod grpcio;
pub mod invariants;
pub mod model;
pub mod moto;
pub mod notices;
pub mod pods;
pub mod process;
pub mod queue;
pub mod rbac;
pub mod templates;
pub mod world;

use std::time::Duration;

use ca_asg_provider::clock::Instant;

/// Waits until `f` holds, polling every 20 ms; fails the test after `secs`.
pub async fn eventually<F: FnMut() -> bool>(what: &str, secs: u64, mut f: F) {
    let end = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < end {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("timed out waiting for {what}");
}

/// Asserts that `text` (what a command said) holds each of `wants`, naming the one
/// it lacks.
pub fn assert_says(text: &str, wants: &[&str]) {
    for want in wants {
        assert!(text.contains(want), "{want:?} not in:\n{text}");
    }
}

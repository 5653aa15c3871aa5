//! The demo runs its full cycle (scale-up, pods, drain scale-in) by itself, as
//! `cargo run -- demo` runs it, and reads as a story (issue 62): no Rust Debug text,
//! each state once, how the drain ended in words, and where to go next.

use std::process::Command;

#[test]
fn the_demo_runs_a_full_cycle_and_reads_as_a_story() {
    let out = Command::new(env!("CARGO_BIN_EXE_ca-asg-provider"))
        .args(["demo", "--launch-seconds", "0.2"])
        .output()
        .expect("the demo starts");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the demo finishes without an error: {}\n{text}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    // Rust's Debug text of an Option, a Duration or a string is not for an operator.
    for leak in ["Some(", "None", "(meta ns)", "-> \""] {
        assert!(!text.contains(leak), "the demo prints `{leak}`:\n{text}");
    }
    // A state of a group is said once, as it changes, not once per poll.
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    for pair in lines.windows(2) {
        assert_ne!(pair[0], pair[1], "a line printed twice in a row:\n{text}");
    }
    assert!(
        text.contains("the drain ended: every pod left, then the instance was terminated"),
        "the drain's end in words:\n{text}"
    );
    assert!(
        text.contains("unneeded time 30m"),
        "the group's option tag as a duration:\n{text}"
    );
    assert!(
        text.trim_end().ends_with("(docs/configuration.md)."),
        "the demo ends pointing at the next step:\n{text}"
    );
    assert!(text.contains("docs/quickstart-eks.md"), "{text}");
}

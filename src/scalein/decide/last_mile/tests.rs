use std::time::Duration;

use super::*;
use crate::cloud::TargetHealth;

fn s(n: u64) -> Duration {
    Duration::from_secs(n)
}

fn group(name: &str, delay: Option<u64>, since: Instant, seen: Seen) -> Watched {
    Watched {
        name: name.into(),
        delay: delay.map(s),
        since,
        seen,
    }
}

fn read(states: &[&str]) -> Seen {
    Seen::Read(states.iter().map(|x| x.to_string()).collect())
}

fn forbidden() -> Seen {
    Seen::Unread(Unread::Forbidden {
        permission: "elasticloadbalancing:DescribeTargetHealth".into(),
        code: "AccessDenied".into(),
    })
}

fn throttled() -> Seen {
    Seen::Unread(Unread::Failed {
        why: "Rate exceeded".into(),
    })
}

const MARGIN: Duration = Duration::from_secs(30);

fn bounds(latest: Option<Instant>) -> Bounds {
    Bounds {
        margin: MARGIN,
        latest,
    }
}

/// Every state AWS names, and one it may name tomorrow: only `unused` is out.
#[test]
fn only_unused_is_out() {
    for st in [
        "initial",
        "healthy",
        "unhealthy",
        "unhealthy.draining",
        "draining",
        "unavailable",
        "something-new",
        "",
    ] {
        assert!(!is_out(st), "{st}");
    }
    assert!(is_out("unused"));
}

/// Each state of one group, before its bound, at it and past it.
#[test]
fn one_group_each_state_before_at_and_past_its_bound() {
    let t0 = Instant::now();
    for (seen, in_) in [
        (read(&[]), false),
        (read(&["unused"]), false),
        (read(&["unused", "unused"]), false),
        (read(&["healthy"]), true),
        (read(&["initial"]), true),
        (read(&["draining"]), true),
        (read(&["unused", "draining"]), true),
        (read(&["unhealthy.draining"]), true),
        (read(&["unavailable"]), true),
        (forbidden(), true),
        (throttled(), true),
    ] {
        let g = [group("web", Some(300), t0, seen.clone())];
        for (at, past) in [
            (0, false),
            (45, false),
            (329, false),
            (330, true),
            (4000, true),
        ] {
            let v = verdict(&g, bounds(None), t0 + s(at));
            match (in_, past, &v) {
                (false, _, Verdict::Done) => {}
                (
                    true,
                    false,
                    Verdict::Wait {
                        groups,
                        waited,
                        at_most,
                    },
                ) => {
                    assert_eq!((*groups, *waited, *at_most), (1, s(at), s(330)));
                }
                (true, true, Verdict::GiveUp(why)) => {
                    assert_eq!(why.len(), 1);
                    match (&seen, &why[0]) {
                        (Seen::Read(_), GiveUp::Bound { group, .. }) => assert_eq!(group, "web"),
                        (Seen::Unread(u), GiveUp::Unreadable { group, why }) => {
                            assert_eq!((group.as_str(), why), ("web", u));
                        }
                        other => panic!("{other:?}"),
                    }
                }
                other => panic!("{seen:?} at {at}: {other:?}"),
            }
        }
    }
}

/// A group whose delay was not read is waited on for AWS's default; a delay is
/// never taken past AWS's largest.
#[test]
fn an_unread_delay_counts_as_the_default_and_none_past_the_largest() {
    let t0 = Instant::now();
    let g = [group("web", None, t0, read(&["draining"]))];
    assert!(
        matches!(verdict(&g, bounds(None), t0 + s(329)), Verdict::Wait { at_most, .. } if at_most == s(330))
    );
    assert!(matches!(
        verdict(&g, bounds(None), t0 + s(330)),
        Verdict::GiveUp(_)
    ));
    let g = [group("web", Some(100_000), t0, read(&["draining"]))];
    assert!(matches!(
        verdict(&g, bounds(None), t0 + s(3630)),
        Verdict::GiveUp(_)
    ));
}

/// Several groups: the wait lasts while any still-in group is within its bound;
/// groups already out do not count; at the end each still-in group says why.
#[test]
fn several_groups_wait_for_the_longest_bound_of_those_still_in() {
    let t0 = Instant::now();
    let gs = [
        group("alb", Some(300), t0, read(&["draining"])),
        group("nlb", Some(10), t0, forbidden()),
        group("old", Some(3000), t0, read(&["unused"])),
    ];
    match verdict(&gs, bounds(None), t0 + s(30)) {
        Verdict::Wait {
            groups,
            waited,
            at_most,
        } => {
            assert_eq!((groups, waited, at_most), (2, s(30), s(330)))
        }
        v => panic!("{v:?}"),
    }
    // nlb is past its bound (40 s), alb is not: only alb is still waited on.
    match verdict(&gs, bounds(None), t0 + s(100)) {
        Verdict::Wait { groups, .. } => assert_eq!(groups, 1),
        v => panic!("{v:?}"),
    }
    match verdict(&gs, bounds(None), t0 + s(330)) {
        Verdict::GiveUp(why) => {
            assert_eq!(why.len(), 2);
            assert!(why[0].said().contains("alb") && why[0].said().contains("draining"));
            assert!(
                why[1].said().contains("nlb") && why[1].said().contains("DescribeTargetHealth")
            );
        }
        v => panic!("{v:?}"),
    }
}

/// Our hook's latest time cuts every bound, and past it the wait is over.
#[test]
fn the_hook_cuts_the_wait() {
    let t0 = Instant::now();
    let gs = [group("alb", Some(300), t0, read(&["draining"]))];
    let latest = Some(t0 + s(60));
    assert!(
        matches!(verdict(&gs, bounds(latest), t0 + s(59)), Verdict::Wait { at_most, .. } if at_most == s(60))
    );
    match verdict(&gs, bounds(latest), t0 + s(60)) {
        Verdict::GiveUp(why) => assert_eq!(
            why,
            vec![GiveUp::Hook {
                groups: vec!["alb".into()]
            }]
        ),
        v => panic!("{v:?}"),
    }
    // Out of every group, the hook does not matter.
    let out = [group("alb", Some(300), t0, read(&["unused"]))];
    assert_eq!(verdict(&out, bounds(latest), t0 + s(600)), Verdict::Done);
    assert_eq!(verdict(&[], bounds(latest), t0 + s(600)), Verdict::Done);
}

/// Groups found at different times: each is bounded from its own start, the wait
/// counts from the first.
#[test]
fn each_group_counts_from_its_own_start() {
    let t0 = Instant::now();
    let gs = [
        group("a", Some(60), t0, read(&["draining"])),
        group("b", Some(60), t0 + s(50), read(&["healthy"])),
    ];
    match verdict(&gs, bounds(None), t0 + s(95)) {
        Verdict::Wait {
            groups,
            waited,
            at_most,
        } => assert_eq!((groups, waited, at_most), (1, s(95), s(140))),
        v => panic!("{v:?}"),
    }
    assert!(matches!(verdict(&gs, bounds(None), t0 + s(140)), Verdict::GiveUp(g) if g.len() == 2));
}

#[test]
fn delays_are_read_once_and_refused_by_name() {
    assert_eq!(parse_delay("300"), Ok(s(300)));
    assert_eq!(parse_delay("0"), Ok(s(0)));
    assert_eq!(parse_delay(" 3600 "), Ok(s(3600)));
    for bad in ["3601", "-1", "", "30s", "1e3", "99999999999999999999999"] {
        let e = parse_delay(bad).unwrap_err();
        assert!(
            e.contains("deregistration_delay.timeout_seconds") && e.contains(&format!("{bad:?}")),
            "{e}"
        );
    }
}

/// Instance targets by id, IP targets by the node's address or one in a delegated
/// prefix; other target types and other addresses are not the instance's.
#[test]
fn targets_of_the_instance_by_id_address_and_prefix() {
    let a = Addresses::parse(
        &[
            "10.0.1.5".into(),
            "10.0.1.77".into(),
            "2600:1f18::5".into(),
            "junk".into(),
        ],
        &[
            "10.0.9.16/28".into(),
            "2600:1f18:1::/80".into(),
            "10.0.0.0/33".into(),
        ],
    );
    assert_eq!(
        a.refused,
        vec!["junk".to_string(), "10.0.0.0/33".to_string()]
    );
    for (ip, yes) in [
        ("10.0.1.5", true),
        ("10.0.1.77", true),
        ("10.0.1.6", false),
        ("10.0.9.16", true),
        ("10.0.9.31", true),
        ("10.0.9.32", false),
        ("2600:1f18::5", true),
        ("2600:1f18:1::abcd", true),
        ("2600:1f18:2::1", false),
        ("not an ip", false),
    ] {
        assert_eq!(a.covers(ip), yes, "{ip}");
    }
    let t = |id: &str, state: &str| TargetHealth {
        id: id.into(),
        port: Some(80),
        state: state.into(),
    };
    let targets = [
        t("i-1", "draining"),
        t("i-2", "healthy"),
        t("10.0.1.5", "healthy"),
        t("10.0.9.20", "initial"),
    ];
    assert_eq!(states_of("instance", &targets, "i-1", &a), vec!["draining"]);
    assert_eq!(
        states_of("ip", &targets, "i-1", &a),
        vec!["healthy", "initial"]
    );
    assert!(states_of("lambda", &targets, "i-1", &a).is_empty());
    assert!(states_of("alb", &targets, "i-1", &a).is_empty());
    // A /0 prefix covers its whole family and no other.
    let all = Addresses::parse(&[], &["0.0.0.0/0".into()]);
    assert!(all.covers("192.168.1.1") && !all.covers("::1"));
}

#[test]
fn the_progress_line_names_the_phase() {
    assert_eq!(
        said(2, s(45), s(330)),
        "waiting for 2 target groups to deregister, 45 s of at most 330 s"
    );
    assert_eq!(
        said(1, s(0), s(40)),
        "waiting for 1 target group to deregister, 0 s of at most 40 s"
    );
}

/// The Node's note of a wait reads back whole, and nothing else does.
#[test]
fn the_nodes_note_of_a_wait_reads_back_and_says_the_phase() {
    let since = chrono::DateTime::parse_from_rfc3339("2026-01-01T10:00:00Z")
        .unwrap()
        .with_timezone(&chrono::Utc);
    let w = Waiting {
        groups: 2,
        since,
        at_most_seconds: 330,
    };
    assert_eq!(Waiting::read(&w.to_json()), Some(w.clone()));
    assert_eq!(
        w.line(since + chrono::Duration::seconds(45)),
        "waiting for 2 target groups to deregister, 45 s of at most 330 s"
    );
    for bad in [
        "",
        "{}",
        "[]",
        r#"{"groups":2,"since":"2026-01-01T10:00:00Z","atMostSeconds":999999}"#,
        r#"{"groups":2,"since":"yesterday","atMostSeconds":330}"#,
        r#"{"groups":2,"since":"2026-01-01T10:00:00Z","atMostSeconds":330,"x":1}"#,
    ] {
        assert_eq!(Waiting::read(bad), None, "{bad}");
    }
    assert_eq!(Waiting::read(&"x".repeat(10_000)), None);
}

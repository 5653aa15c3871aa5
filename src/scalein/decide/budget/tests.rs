use super::cron::Cron;
use super::*;
use chrono::TimeZone;
use proptest::prelude::*;

fn at(y: i32, mo: u32, d: u32, h: u32, mi: u32) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(y, mo, d, h, mi, 0).unwrap()
}

#[test]
fn a_percent_rounds_up_as_karpenter_rounds_and_a_count_is_itself() {
    for covered in 0..=200usize {
        for p in 0..=100u8 {
            let want = (covered * p as usize).div_ceil(100);
            assert_eq!(
                Nodes::Percent(p).allowed(covered),
                want,
                "{p}% of {covered}"
            );
            if p > 0 && covered > 0 {
                assert!(Nodes::Percent(p).allowed(covered) >= 1);
            }
        }
    }
    assert_eq!(Nodes::Percent(10).allowed(5), 1);
    assert_eq!(Nodes::Percent(0).allowed(500), 0);
    assert_eq!(Nodes::Count(3).allowed(0), 3);
}

#[test]
fn nodes_are_read_as_a_count_or_a_percent_and_anything_else_is_named() {
    assert_eq!(Nodes::parse("3"), Ok(Nodes::Count(3)));
    assert_eq!(Nodes::parse(" 20% "), Ok(Nodes::Percent(20)));
    assert_eq!(Nodes::parse("0"), Ok(Nodes::Count(0)));
    for bad in ["", "-1", "101%", "2.5", "ten", "%", "100001"] {
        let e = Nodes::parse(bad).unwrap_err();
        assert!(e.contains(&format!("{bad:?}")), "{e}");
    }
}

#[test]
fn every_cause_has_one_name_and_the_exempt_ones_say_why_they_are_refused() {
    let all = [
        Cause::CaEmpty,
        Cause::CaOccupied,
        Cause::AsgScaling,
        Cause::AsgInstanceRefresh,
        Cause::AsgAzRebalance,
        Cause::AsgMaxLifetime,
        Cause::AsgPerson,
        Cause::AsgOther,
        Cause::WarmPool,
        Cause::DrainCommand,
        Cause::Rebalance,
    ];
    for c in all {
        assert_eq!(Cause::parse(c.as_str()), Ok(&[c][..]), "{c:?}");
    }
    assert_eq!(Cause::parse("ca").unwrap().len(), 2);
    assert_eq!(Cause::parse("asg").unwrap().len(), 6);
    let e = Cause::parse("spot-interruption").unwrap_err();
    assert!(e.contains("never budgeted"), "{e}");
    let e = Cause::parse("consolidation").unwrap_err();
    assert!(
        e.contains("\"consolidation\"") && e.contains("ca-empty"),
        "{e}"
    );
}

#[test]
fn a_schedule_is_read_as_cron_reads_it() {
    let weekdays = Cron::parse("0 9 * * mon-fri").unwrap();
    assert!(weekdays.fires_at(at(2026, 11, 27, 9, 0))); // a Friday
    assert!(!weekdays.fires_at(at(2026, 11, 28, 9, 0))); // a Saturday
    assert!(!weekdays.fires_at(at(2026, 11, 27, 9, 1)));
    // Both day fields restricted: either matches.
    let either = Cron::parse("0 0 1 * sun").unwrap();
    assert!(either.fires_at(at(2026, 12, 1, 0, 0))); // a Tuesday, the 1st
    assert!(either.fires_at(at(2026, 11, 29, 0, 0))); // a Sunday
    assert!(!either.fires_at(at(2026, 11, 30, 0, 0)));
    // 7 is Sunday too; steps and lists.
    assert_eq!(Cron::parse("0 0 * * 7"), Cron::parse("0 0 * * 0"));
    let steps = Cron::parse("*/15 1,13 * * *").unwrap();
    assert!(steps.fires_at(at(2026, 1, 1, 13, 45)));
    assert!(!steps.fires_at(at(2026, 1, 1, 14, 45)));
    assert_eq!(Cron::parse("@daily"), Cron::parse("0 0 * * *"));
    for (bad, names) in [
        ("0 9 * *", "five"),
        ("60 * * * *", "minute"),
        ("* 24 * * *", "hour"),
        ("* * 0 * *", "day of month"),
        ("* * * 13 *", "month"),
        ("* * * * 8", "day of week"),
        ("* * * * mon-sun", "backwards"),
        ("*/0 * * * *", "step"),
        ("@fortnightly", "macro"),
    ] {
        let e = Cron::parse(bad).unwrap_err();
        assert!(e.contains(names), "{bad}: {e}");
    }
    assert!(Cron::parse(&"* ".repeat(500)).is_err());
}

fn field(max: u32) -> impl Strategy<Value = String> {
    prop_oneof![
        Just("*".to_string()),
        (0..=max).prop_map(|v| v.to_string()),
        (0..=max, 0..=max).prop_map(|(a, b)| format!("{}-{}", a.min(b), a.max(b))),
        (1..=max.max(1)).prop_map(|s| format!("*/{s}")),
        (0..=max, 0..=max).prop_map(|(a, b)| format!("{a},{b}")),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    /// The window's search (days and hours skipped whole) finds what a minute by
    /// minute scan finds.
    #[test]
    fn the_last_firing_is_the_one_a_minute_by_minute_scan_finds(
        m in field(59), h in field(23), d in field(31).prop_filter("day 0", |d| !d.starts_with('0') && !d.contains(",0") && !d.contains("-0")),
        wd in field(6),
        start in 0i64..(366 * 24 * 60), within in 1i64..(3 * 24 * 60), secs in 0u32..60,
    ) {
        let text = format!("{m} {h} {d} * {wd}");
        let Ok(c) = Cron::parse(&text) else { return Ok(()) };
        let now = at(2026, 1, 1, 0, 0) + Span::minutes(start) + Span::seconds(secs as i64);
        let span = Span::minutes(within);
        let mut want = None;
        let mut t = now - Span::seconds(secs as i64);
        while t > now - span {
            if c.fires_at(t) { want = Some(t); break; }
            t -= Span::minutes(1);
        }
        prop_assert_eq!(c.fired_within(now, span), want, "{}", text);
    }
}

fn place<'a>(group: &'a str, zone: &'a str, tags: &'a BTreeMap<String, String>) -> Place<'a> {
    Place { group, zone, tags }
}

/// A budget named `b` of `nodes` over every group, zone and cause, always in force.
pub(crate) fn budget(nodes: Nodes) -> Budget {
    Budget::always("b", nodes)
}

#[test]
fn the_most_restrictive_budget_in_force_holds_and_says_until_when() {
    let none = BTreeMap::new();
    let nodes: Vec<Place> = (0..10).map(|_| place("a", "z1", &none)).collect();
    let drains: Vec<Drain> = (0..2)
        .map(|_| Drain {
            place: place("a", "z1", &none),
            causes: &[Cause::AsgInstanceRefresh],
            exempt: false,
        })
        .collect();
    let now = at(2026, 11, 27, 10, 0);
    let world = World {
        now,
        nodes: &nodes,
        draining: &drains,
        starts: &[],
        inherited: &Default::default(),
    };
    let next = Drain {
        place: place("a", "z1", &none),
        causes: &[Cause::AsgInstanceRefresh],
        exempt: false,
    };
    let loose = budget(Nodes::Percent(50));
    let tight = Budget {
        name: "two".into(),
        ..budget(Nodes::Count(2))
    };
    assert_eq!(
        verdict(std::slice::from_ref(&loose), &next, &world),
        Verdict::Go
    );
    assert_eq!(
        verdict(&[loose.clone(), tight.clone()], &next, &world),
        Verdict::Wait(Hold {
            budget: "two".into(),
            until: Until::SlotFrees {
                allowed: 2,
                draining: 2
            }
        })
    );
    // A closed business-hours window: nodes 0 until it ends.
    let business = Budget {
        name: "office".into(),
        window: Some(Window {
            schedule: Cron::parse("0 9 * * mon-fri").unwrap(),
            duration: Duration::from_secs(8 * 3600),
        }),
        ..budget(Nodes::Count(0))
    };
    assert_eq!(
        verdict(std::slice::from_ref(&business), &next, &world),
        Verdict::Wait(Hold {
            budget: "office".into(),
            until: Until::WindowCloses(at(2026, 11, 27, 17, 0))
        })
    );
    // Out of the window it holds nothing.
    let evening = World {
        now: at(2026, 11, 27, 18, 0),
        ..world
    };
    assert_eq!(verdict(&[business], &next, &evening), Verdict::Go);
    // Exempt: never held, and counted for the others.
    let spot = Drain {
        exempt: true,
        ..next.clone()
    };
    assert_eq!(verdict(&[tight], &spot, &world), Verdict::Go);
}

#[test]
fn a_budget_covers_by_group_name_tags_and_zone_and_governs_the_causes_it_lists() {
    let tagged: BTreeMap<String, String> = [("team".to_string(), "web".to_string())].into();
    let none = BTreeMap::new();
    let b = Budget {
        groups: Groups::Tagged([("team".to_string(), Some("web".to_string()))].into()),
        zones: ["z1".to_string()].into(),
        causes: Some([Cause::AsgInstanceRefresh].into()),
        ..budget(Nodes::Count(0))
    };
    assert!(b.covers(&place("g", "z1", &tagged)));
    assert!(!b.covers(&place("g", "z2", &tagged)));
    assert!(!b.covers(&place("g", "z1", &none)));
    let any_value = Budget {
        groups: Groups::Tagged([("team".to_string(), None)].into()),
        ..b.clone()
    };
    assert!(any_value.covers(&place("g", "z1", &tagged)));
    let named = Budget {
        groups: Groups::Named(["g".to_string()].into()),
        zones: BTreeSet::new(),
        ..b.clone()
    };
    assert!(named.covers(&place("g", "z9", &none)) && !named.covers(&place("h", "z9", &none)));
    let refresh = Drain {
        place: place("g", "z1", &tagged),
        causes: &[Cause::AsgInstanceRefresh],
        exempt: false,
    };
    let ca = Drain {
        causes: &[Cause::CaEmpty],
        ..refresh.clone()
    };
    assert!(b.governs(&refresh) && !b.governs(&ca));
}

#[test]
fn a_rate_lets_k_starts_per_period_and_names_when_the_next_may_start() {
    let none = BTreeMap::new();
    let nodes: Vec<Place> = (0..100).map(|_| place("a", "z1", &none)).collect();
    let d = Drain {
        place: place("a", "z1", &none),
        causes: &[Cause::AsgScaling],
        exempt: false,
    };
    let now = at(2026, 11, 27, 10, 0);
    let starts = vec![
        (now - Span::minutes(9), d.clone()),
        (now - Span::minutes(5), d.clone()),
        (now - Span::minutes(11), d.clone()),
    ];
    let world = World {
        now,
        nodes: &nodes,
        draining: &[],
        starts: &starts,
        inherited: &Default::default(),
    };
    let b = Budget {
        rate: Some(Rate {
            starts: 2,
            per: Duration::from_secs(600),
        }),
        ..budget(Nodes::Percent(100))
    };
    assert_eq!(
        verdict(std::slice::from_ref(&b), &d, &world),
        Verdict::Wait(Hold {
            budget: "b".into(),
            until: Until::Token(now + Span::minutes(1))
        })
    );
    let three = Budget {
        rate: Some(Rate {
            starts: 3,
            per: Duration::from_secs(600),
        }),
        ..b
    };
    assert_eq!(verdict(&[three], &d, &world), Verdict::Go);
}

/// Small worlds, every budget shape: a drain may start exactly when no budget in
/// force that governs it is full (the oracle counts anew, without `room`).
#[test]
fn go_means_every_governing_budget_in_force_has_room() {
    let none = BTreeMap::new();
    let groups = ["a", "b"];
    let zones = ["z1", "z2"];
    let mut nodes = Vec::new();
    for g in groups {
        for z in zones {
            nodes.push(place(g, z, &none));
            nodes.push(place(g, z, &none));
        }
    }
    let causes = [Cause::CaEmpty, Cause::AsgInstanceRefresh];
    let mut checked = 0;
    for n in [
        Nodes::Count(0),
        Nodes::Count(1),
        Nodes::Count(2),
        Nodes::Percent(25),
        Nodes::Percent(50),
    ] {
        for gsel in [Groups::All, Groups::Named(["a".to_string()].into())] {
            for zsel in [BTreeSet::new(), ["z2".to_string()].into()] {
                for csel in [None, Some([Cause::CaEmpty].into())] {
                    let b = Budget {
                        groups: gsel.clone(),
                        zones: zsel.clone(),
                        causes: csel.clone(),
                        ..budget(n)
                    };
                    for mask in 0u32..(1 << 4) {
                        let draining: Vec<Drain> = (0..4)
                            .filter(|i| mask & (1 << i) != 0)
                            .map(|i| Drain {
                                place: place(groups[i / 2], zones[i % 2], &none),
                                causes: &causes[i % 2..i % 2 + 1],
                                exempt: i == 3,
                            })
                            .collect();
                        let world = World {
                            now: at(2026, 1, 1, 0, 0),
                            nodes: &nodes,
                            draining: &draining,
                            starts: &[],
                            inherited: &Default::default(),
                        };
                        for (gi, g) in groups.iter().enumerate() {
                            for z in zones {
                                for c in &causes {
                                    let cand = Drain {
                                        place: place(g, z, &none),
                                        causes: std::slice::from_ref(c),
                                        exempt: false,
                                    };
                                    let governs = (gi == 0 || gsel == Groups::All)
                                        && (zsel.is_empty() || zsel.contains(z))
                                        && csel
                                            .as_ref()
                                            .is_none_or(|s: &BTreeSet<Cause>| s.contains(c));
                                    let covered = nodes.iter().filter(|p| b.covers(p)).count();
                                    let count =
                                        draining.iter().filter(|d| b.covers(&d.place)).count();
                                    let full = count >= n.allowed(covered);
                                    let go = verdict(std::slice::from_ref(&b), &cand, &world)
                                        == Verdict::Go;
                                    assert_eq!(go, !(governs && full), "{b:?} {cand:?} {count}");
                                    checked += 1;
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    assert_eq!(checked, 5 * 2 * 2 * 2 * 16 * 8);
}

#[test]
fn a_held_drain_starts_in_time_to_finish_inside_the_hooks_global_timeout() {
    let began = at(2026, 11, 27, 10, 0);
    // 100 x 5 min = 500 min, less a 10 min drain and a 1 min margin.
    assert_eq!(
        force_at(
            began,
            Duration::from_secs(300),
            Duration::from_secs(600),
            Duration::from_secs(60)
        ),
        began + Span::minutes(489)
    );
    // The 48-hour cap.
    assert_eq!(
        force_at(
            began,
            Duration::from_secs(7200),
            Duration::ZERO,
            Duration::ZERO
        ),
        began + Span::hours(48)
    );
    // A drain longer than the timeout: at once.
    assert_eq!(
        force_at(
            began,
            Duration::from_secs(1),
            Duration::from_secs(600),
            Duration::ZERO
        ),
        began
    );
}

#[test]
fn a_budget_says_itself_in_one_line() {
    let b = Budget {
        name: "office".into(),
        groups: Groups::Named(["web".to_string()].into()),
        causes: Some([Cause::CaOccupied].into()),
        window: Some(Window {
            schedule: Cron::parse("0 9 * * mon-fri").unwrap(),
            duration: Duration::from_secs(3600),
        }),
        rate: Some(Rate {
            starts: 3,
            per: Duration::from_secs(600),
        }),
        ..budget(Nodes::Percent(25))
    };
    assert_eq!(
        b.said(),
        "office: 25% of the nodes it covers at once (rounded up), groups web, for ca-occupied, in force for 3600s from each firing of its schedule (UTC), at most 3 start(s) per 600s"
    );
}

/// Whose a hold of our hook is (rule 3's causes), every way it can be asked: CA's
/// when CA asked for it, in this process or as the record says (it outlives the
/// process that answered CA); else the warm pool's; else the group's own, as its
/// scaling activity says, or every `asg-*` cause when that is unread.
#[test]
fn a_hold_of_our_hook_is_cas_when_ca_asked_whoever_runs_it() {
    use super::super::record::{DrainReason, DrainRecord, Why};
    let t = at(2026, 11, 27, 10, 0);
    for by_ca in [false, true] {
        for asked_by_ca in [false, true] {
            for to_warm_pool in [false, true] {
                for asg in [None, Some(Cause::AsgScaling)] {
                    for empty in [None, Some(true), Some(false)] {
                        let reason = DrainReason::new(
                            Why::Lifecycle {
                                hook: "ours".into(),
                                by_ca,
                            },
                            t,
                        );
                        let record = DrainRecord {
                            reasons: vec![reason],
                            ..DrainRecord::default()
                        };
                        let asked = Asked {
                            by_ca: asked_by_ca,
                            empty,
                            to_warm_pool,
                            asg,
                        };
                        let (causes, exempt) = causes_of(&record, asked);
                        let ca: Vec<Cause> = match empty {
                            Some(true) => vec![Cause::CaEmpty],
                            Some(false) => vec![Cause::CaOccupied],
                            None => vec![Cause::CaEmpty, Cause::CaOccupied],
                        };
                        let want: Vec<Cause> = if by_ca || asked_by_ca {
                            ca
                        } else if to_warm_pool {
                            vec![Cause::WarmPool]
                        } else if let Some(c) = asg {
                            vec![c]
                        } else {
                            let mut all = asg_cause::ASG_CAUSES.to_vec();
                            all.sort();
                            all
                        };
                        let mut want = want;
                        want.sort();
                        assert_eq!(causes, want, "by_ca {by_ca}, asked {asked:?}");
                        assert!(!exempt);
                    }
                }
            }
        }
    }
}

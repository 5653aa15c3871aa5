//! The last mile (issue 73): an instance ends only once it is out of every load
//! balancer's target group that has it, each waited at most its deregistration delay
//! plus a margin. The scale-in end to end on the memory cloud (which plays ELBv2's
//! `draining` for a group's delay, then `unused`), and the AWS backend against moto's
//! ELBv2.

mod support;

use std::time::Duration;

use aws_sdk_ec2 as ec2;
use aws_sdk_elasticloadbalancingv2 as elb;
use ca_asg_provider::clock::Instant;
use ca_asg_provider::cloud::aws::AwsCloud;
use ca_asg_provider::cloud::memory::{LbEvent, MemoryCloud};
use ca_asg_provider::cloud::Cloud;
use ca_asg_provider::scalein::decide::budget::Groups;
use ca_asg_provider::scalein::decide::last_mile::{self, Addresses};
use ca_asg_provider::scalein::kube::events::Reason;
use ca_asg_provider::scalein::settings::GroupOverride;
use ca_asg_provider::scalein::stages::deregister::deregister_own;
use ca_asg_provider::scalein::stages::last_mile::{wait_out, LastMile, WaitPort};
use ca_asg_provider::scalein::{LoadBalancerWait, Mode, Outcome, ScaleInSettings};
use k8s_openapi::api::core::v1::Node;
use serde_json::Value;

use support::moto::MotoServer;
use support::world::*;

fn settings(margin: Duration) -> ScaleInSettings {
    ScaleInSettings {
        load_balancers: LoadBalancerWait {
            enabled: true,
            margin,
            poll: Duration::from_millis(100),
            deregister: false,
        },
        ..fast_settings()
    }
}

/// The service's Events on the node: (reason, note).
fn said(w: &World, node: &str) -> Vec<(String, String)> {
    w.sim
        .list::<k8s_openapi::api::events::v1::Event>()
        .into_iter()
        .filter(|e| e["regarding"]["kind"] == "Node" && e["regarding"]["name"] == node)
        .map(|e| {
            (
                e["reason"].as_str().unwrap_or_default().to_string(),
                e["note"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

/// Where in the cloud's log the instance's end was asked: our hook's action completed
/// (`completed`), or its termination (in lifecycle mode that hands it to the hook,
/// before the drain).
fn end_call(log: &[LbEvent], iid: &str, completed: bool) -> Option<usize> {
    log.iter().position(|e| {
        matches!(e, LbEvent::EndCall { instance, completed: c } if instance == iid && *c == completed)
    })
}

/// Where in the cloud's log a read first showed the target in `state`.
fn answered(log: &[LbEvent], arn: &str, id: &str, want: &str) -> Option<usize> {
    log.iter().position(|e| {
        matches!(e, LbEvent::Answered { target_group, target, state }
            if target_group == arn && target == id && state == want)
    })
}

/// Where in the cloud's log the target was deregistered (by anyone).
fn deregistered(log: &[LbEvent], arn: &str, id: &str) -> Option<usize> {
    log.iter().position(|e| {
        matches!(e, LbEvent::Deregistered { target_group, target, .. }
            if target_group == arn && target == id)
    })
}

fn cordoned(w: &World, node: &str) -> bool {
    w.sim
        .get::<Node>("", node)
        .is_some_and(|n: Value| n["spec"]["unschedulable"] == true)
}

/// Lifecycle mode: the instance is a target of an ALB's instance group and an NLB's IP
/// group (its node's address). The load balancer controller deregisters it when the
/// drain begins; each group drains for its delay. Our hook's action is completed only
/// after both show the instance `unused`, and heartbeats kept the hook (1 s timeout)
/// alive through the wait.
#[tokio::test]
async fn the_instance_ends_only_after_its_targets_left_every_group() {
    let mut w = World::builder()
        .web_hooked(3, 2, 1)
        .settings(settings(Duration::from_secs(5)))
        .build()
        .await;
    let (node, iid) = nodes_of(&w, "web")[0].clone();
    // A pod whose preStop takes 0.3 s: the drain outlasts the controller's 20 ms look
    // at the cordon, so the wait's first read finds both targets already draining
    // (a group nobody has begun to take the instance out of is waited on for the
    // margin alone, and the note would say so).
    w.put(&ca_asg_provider::sim::fixtures::pod(
        "shop", "app", &node, "app", 0.3,
    ));
    pod_ready(&w, "app").await;
    let address = MemoryCloud::address_of(&iid).unwrap();
    let alb = w.cloud.add_target_group("web-alb", "instance", "2");
    let nlb = w.cloud.add_target_group("web-nlb", "ip", "1");
    let other = w.cloud.add_target_group("lambda", "lambda", "300");
    w.cloud.register_target(&alb, &iid);
    w.cloud.register_target(&nlb, &address);
    w.cloud.register_target(&other, "arn:aws:lambda:fn");
    // The load balancer controller: the drain's cordon excludes the node, the
    // controller deregisters its targets.
    let controller = {
        let (sim, cloud) = (w.sim.clone(), w.cloud.clone());
        let (node, iid, alb, nlb, address) = (
            node.clone(),
            iid.clone(),
            alb.clone(),
            nlb.clone(),
            address.clone(),
        );
        tokio::spawn(async move {
            loop {
                if sim
                    .get::<Node>("", &node)
                    .is_some_and(|n: Value| n["spec"]["unschedulable"] == true)
                {
                    cloud.deregister_target(&alb, &iid);
                    cloud.deregister_target(&nlb, &address);
                    return;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    // `status` reads the wait from the Node while it lasts.
    let noted = {
        let (sim, node) = (w.sim.clone(), node.clone());
        tokio::spawn(async move {
            for _ in 0..500 {
                let note = sim.get::<Node>("", &node).and_then(|n: Value| {
                    n["metadata"]["annotations"][last_mile::ANNOTATION]
                        .as_str()
                        .and_then(last_mile::Waiting::read)
                });
                if let Some(n) = note {
                    return Some(n);
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            None
        })
    };
    delete_nodes(&mut w, "web", &[(node.clone(), iid.clone())]).await;
    assert_eq!(w.engine.wait_for(&iid).await, Some(Outcome::Ended));
    controller.await.unwrap();
    let note = noted
        .await
        .unwrap()
        .expect("the Node said the drain waits for the load balancers");
    assert_eq!((note.groups, note.at_most_seconds), (2, 7), "{note:?}");
    // In the cloud's own order: each target deregistered, then read `unused`, and
    // only then our hook's action completed.
    let log = w.cloud.lb_log();
    let completed = end_call(&log, &iid, true).expect("our hook's action was completed");
    for (arn, target) in [(&alb, &iid), (&nlb, &address)] {
        let out = answered(&log, arn, target, "unused")
            .unwrap_or_else(|| panic!("{target} never read unused: {log:?}"));
        let off = deregistered(&log, arn, target).expect("the controller deregistered it");
        assert!(off < out && out < completed, "{log:?}");
    }
    assert!(w
        .cloud
        .target_states(&alb)
        .iter()
        .all(|(_, s)| s == "unused"));
    assert!(w
        .cloud
        .target_states(&nlb)
        .iter()
        .all(|(_, s)| s == "unused"));
    // The hook never timed out: the heartbeats went on while the wait lasted.
    assert!(
        w.cloud.hook_timeouts().is_empty(),
        "{:?}",
        w.cloud.hook_timeouts()
    );
    assert!(
        w.cloud
            .heartbeats()
            .iter()
            .filter(|a| a.instance_id == iid)
            .count()
            >= 2
    );
    let events = said(&w, &node);
    let waiting = events
        .iter()
        .find(|(r, _)| r == "WaitingForLoadBalancers")
        .unwrap_or_else(|| panic!("{events:?}"));
    assert!(
        waiting.1.contains("web-alb") && waiting.1.contains("web-nlb"),
        "{waiting:?}"
    );
    assert!(
        waiting
            .1
            .contains("waiting for 2 target groups to deregister"),
        "{waiting:?}"
    );
    assert!(
        !events.iter().any(|(r, _)| r == "LoadBalancerWaitOver"),
        "{events:?}"
    );
    assert!(
        !events.iter().any(|(r, _)| r == "LoadBalancerUnreadable"),
        "{events:?}"
    );
    let calls = w.cloud.lb_calls();
    // One list (shared), the instance's addresses once, each delay once.
    assert_eq!(calls.get("target_groups"), Some(&1), "{calls:?}");
    assert_eq!(calls.get("instance_addresses"), Some(&1), "{calls:?}");
    assert_eq!(calls.get("deregistration_delay"), Some(&2), "{calls:?}");
}

/// A target group the service may not read (its role lacks DescribeTargetHealth) is
/// waited on up to its bound (delay 1 s + margin 1 s), said once by name with the
/// missing permission, and then the instance ends as it would without the wait.
#[tokio::test]
async fn a_forbidden_target_group_is_waited_on_up_to_its_bound_then_the_instance_ends() {
    let mut w = World::builder()
        .web(3, 1)
        .settings(settings(Duration::from_secs(1)))
        .build()
        .await;
    let (node, iid) = nodes_of(&w, "web")[0].clone();
    let locked = w.cloud.add_target_group("locked", "instance", "1");
    w.cloud.register_target(&locked, &iid);
    w.cloud.refuse("target_health", "AccessDenied", 1_000);
    delete_nodes(&mut w, "web", &[(node.clone(), iid.clone())]).await;
    assert_eq!(w.engine.wait_for(&iid).await, Some(Outcome::Ended));
    // The refusal did not end the wait: the group was asked again poll after poll
    // before the end call came (in the cloud's own order).
    let log = w.cloud.lb_log();
    let ended = end_call(&log, &iid, false).expect("the instance was terminated");
    let refused_before = log[..ended]
        .iter()
        .filter(|e| matches!(e, LbEvent::Refused { operation } if operation == "target_health"))
        .count();
    assert!(refused_before >= 2, "{log:?}");
    let events = said(&w, &node);
    let unreadable: Vec<&(String, String)> = events
        .iter()
        .filter(|(r, _)| r == "LoadBalancerUnreadable")
        .collect();
    assert_eq!(unreadable.len(), 1, "said once: {events:?}");
    assert!(
        unreadable[0].1.contains("locked")
            && unreadable[0]
                .1
                .contains("elasticloadbalancing:DescribeTargetHealth")
            && unreadable[0].1.contains("AccessDenied"),
        "{unreadable:?}"
    );
    let over = events
        .iter()
        .find(|(r, _)| r == "LoadBalancerWaitOver")
        .unwrap_or_else(|| panic!("{events:?}"));
    assert!(over.1.contains("locked"), "{over:?}");
    assert!(
        events.iter().any(|(r, _)| r == "InstanceTerminated"),
        "{events:?}"
    );
    // The target still shows healthy: the wait was bounded, not satisfied.
    assert_eq!(
        w.cloud.target_states(&locked),
        vec![(iid.clone(), "healthy".to_string())]
    );
}

/// Throttled reads wait, then read: a group AWS throttles twice is read on the third
/// poll and the instance ends once its target is `unused`, without a give-up.
#[tokio::test]
async fn throttled_reads_are_waited_through_and_the_wait_off_waits_for_nothing() {
    let mut w = World::builder()
        .web(3, 2)
        .settings(settings(Duration::from_secs(5)))
        .build()
        .await;
    let nodes = nodes_of(&w, "web");
    let (node, iid) = nodes[0].clone();
    let tg = w.cloud.add_target_group("web", "instance", "1");
    w.cloud.register_target(&tg, &iid);
    w.cloud.deregister_target(&tg, &iid);
    w.cloud.throttle("target_health", 2);
    delete_nodes(&mut w, "web", &[(node.clone(), iid.clone())]).await;
    assert_eq!(w.engine.wait_for(&iid).await, Some(Outcome::Ended));
    let events = said(&w, &node);
    assert!(
        !events.iter().any(|(r, _)| r == "LoadBalancerWaitOver"),
        "{events:?}"
    );
    assert!(
        events
            .iter()
            .any(|(r, n)| r == "LoadBalancerUnreadable" && n.contains("web")),
        "{events:?}"
    );
    assert_eq!(
        w.cloud.target_states(&tg),
        vec![(iid.clone(), "unused".to_string())]
    );

    // Off: a healthy target does not hold the instance.
    let mut off = World::builder()
        .web(3, 1)
        .settings(ScaleInSettings {
            load_balancers: LoadBalancerWait {
                enabled: false,
                ..LoadBalancerWait::default()
            },
            ..fast_settings()
        })
        .build()
        .await;
    let (node, iid) = nodes_of(&off, "web")[0].clone();
    let tg = off.cloud.add_target_group("web", "instance", "3600");
    off.cloud.register_target(&tg, &iid);
    delete_nodes(&mut off, "web", &[(node.clone(), iid.clone())]).await;
    assert_eq!(off.engine.wait_for(&iid).await, Some(Outcome::Ended));
    assert!(off.cloud.lb_calls().is_empty());
    assert!(cordoned(&off, &node) || off.sim.get::<Node>("", &node).is_none());
}

/// Without the instance's addresses no `ip` target can be told to be its own: a
/// throttled DescribeInstances holds the wait (said once, naming what could not be
/// read) and is asked again next poll, and the instance ends only after its IP target
/// left the NLB's group. (Before, the wait went on without them and ended the
/// instance while its IP target was still `draining`.)
#[test]
fn unread_addresses_hold_the_wait_until_they_are_read() {
    support::model::on_paused_clock(async {
        let mut w = World::builder()
            .web(3, 1)
            .settings(settings(Duration::from_secs(1)))
            .build()
            .await;
        let (node, iid) = nodes_of(&w, "web")[0].clone();
        let ip = MemoryCloud::address_of(&iid).expect("the memory cloud's address");
        let tg = w.cloud.add_target_group("nlb-ip", "ip", "2");
        w.cloud.register_target(&tg, &ip);
        w.cloud.deregister_target(&tg, &ip);
        w.cloud.throttle("instance_addresses", 3);
        delete_nodes(&mut w, "web", &[(node.clone(), iid.clone())]).await;
        assert_eq!(w.engine.wait_for(&iid).await, Some(Outcome::Ended));
        let log = w.cloud.lb_log();
        let ended = end_call(&log, &iid, false).expect("the instance was terminated");
        let out = answered(&log, &tg, &ip, "unused").unwrap_or_else(|| panic!("{log:?}"));
        assert!(out < ended, "ended before its IP target was out: {log:?}");
        assert!(
            w.cloud.lb_calls()["instance_addresses"] >= 4,
            "{:?}",
            w.cloud.lb_calls()
        );
        let events = said(&w, &node);
        let unreadable: Vec<_> = events
            .iter()
            .filter(|(r, _)| r == "LoadBalancerUnreadable")
            .collect();
        assert_eq!(unreadable.len(), 1, "said once: {events:?}");
        assert!(
            unreadable[0]
                .1
                .starts_with("cannot read the instance's addresses now"),
            "{unreadable:?}"
        );
        assert!(
            !events.iter().any(|(r, _)| r == "LoadBalancerWaitOver"),
            "{events:?}"
        );
    });
}

/// A deregistration delay AWS throttled is read again next poll: a group whose
/// targets cannot be read is waited on for its own delay (1 s) plus the margin, not
/// AWS's default 300 s for the rest of the wait. On the paused clock: the instance
/// ends a few simulated seconds after the drain began.
#[test]
fn a_throttled_delay_is_read_again_and_bounds_the_wait() {
    support::model::on_paused_clock(async {
        let mut w = World::builder()
            .web(3, 1)
            .settings(settings(Duration::from_secs(1)))
            .build()
            .await;
        let (node, iid) = nodes_of(&w, "web")[0].clone();
        let tg = w.cloud.add_target_group("alb", "instance", "1");
        w.cloud.register_target(&tg, &iid);
        w.cloud.deregister_target(&tg, &iid);
        w.cloud.refuse("target_health", "AccessDenied", 1_000);
        w.cloud.throttle("deregistration_delay", 1);
        let start = Instant::now();
        delete_nodes(&mut w, "web", &[(node.clone(), iid.clone())]).await;
        assert_eq!(w.engine.wait_for(&iid).await, Some(Outcome::Ended));
        let took = start.elapsed();
        assert!(
            w.cloud.lb_calls()["deregistration_delay"] >= 2,
            "{:?}",
            w.cloud.lb_calls()
        );
        assert!(
            took < Duration::from_secs(60),
            "the wait kept AWS's default 300 s bound: {took:?} (simulated)"
        );
        let events = said(&w, &node);
        assert!(
            events
                .iter()
                .any(|(r, n)| r == "LoadBalancerWaitOver" && n.contains("alb")),
            "{events:?}"
        );
    });
}

/// Our hook's global limit is counted from when the hold began, as the Node's drain
/// record keeps it, across a restart: a heartbeat timeout of 1 s gives the action
/// 100 s in all, the wait ends at 99 s (a timeout before it) with the instance still
/// `draining` in a group whose delay is an hour, and the process that took over at
/// 50 s does not count its 99 s from its own start (which would end the wait at
/// about 149 s, after AWS had ended the action). On the paused clock.
#[test]
fn after_a_restart_the_hooks_limit_counts_from_the_holds_start() {
    support::model::on_paused_clock(async {
        let mut w = World::builder()
            .web_hooked(3, 1, 1)
            .settings(settings(Duration::from_secs(1)))
            .build()
            .await;
        let (node, iid) = nodes_of(&w, "web")[0].clone();
        let tg = w.cloud.add_target_group("slow", "instance", "3600");
        w.cloud.register_target(&tg, &iid);
        w.cloud.deregister_target(&tg, &iid);
        let start = Instant::now();
        delete_nodes(&mut w, "web", &[(node.clone(), iid.clone())]).await;
        tokio::time::sleep(Duration::from_secs(50)).await;
        assert!(
            w.cloud.completed_actions().is_empty(),
            "the wait is still on at 50 s"
        );
        // The process dies mid-wait; a new one takes the hold over.
        w.engine.abort_all();
        w.engine.shutdown();
        let (provider, engine, ca) = service(
            &w.sim,
            &w.cloud,
            &w.groups,
            settings(Duration::from_secs(1)),
        )
        .await;
        (w.provider, w.engine, w.ca) = (provider, engine, ca);
        assert_eq!(
            ca_asg_provider::scalein::sources::hook_scan::scan(&w.engine, &w.provider).await,
            1,
            "the new process takes the hold over"
        );
        assert_eq!(w.engine.wait_for(&iid).await, Some(Outcome::Ended));
        let completed = w
            .cloud
            .completed_at()
            .into_iter()
            .find(|(i, _)| *i == iid)
            .map(|(_, at)| at)
            .expect("completed");
        let took = completed.saturating_duration_since(start);
        assert!(
            took <= Duration::from_secs(100),
            "completed {took:?} after the hold began, past its 100 s limit (simulated)"
        );
        let events = said(&w, &node);
        let over = events
            .iter()
            .find(|(r, _)| r == "LoadBalancerWaitOver")
            .unwrap_or_else(|| panic!("{events:?}"));
        assert!(over.1.contains("lifecycle hook"), "{over:?}");
        assert_eq!(
            w.cloud.target_states(&tg),
            vec![(iid.clone(), "draining".to_string())]
        );
    });
}

fn deregistering(margin: Duration) -> ScaleInSettings {
    let mut s = settings(margin);
    s.load_balancers.deregister = true;
    s
}

/// `deregister: true` for the group (issue 73, item 3; its `groupOverrides` entry,
/// the cluster's setting off), lifecycle mode: the instance's own target
/// in the target group attached to its group is deregistered by the service, read
/// `draining`, then `unused`, and only then is our hook's action completed (the
/// cloud's own order). The other instance's target in the same group stays
/// registered, and a group the ASG does not have is never written to, though it has
/// the instance (the wait gives it the margin, then the instance ends).
#[tokio::test]
async fn deregister_on_takes_the_instance_out_of_its_own_groups_target_groups_only() {
    // Per group: the cluster leaves deregister off, web's override turns it on.
    let mut w = World::builder()
        .web_hooked(3, 2, 1)
        .settings(ScaleInSettings {
            group_overrides: vec![
                GroupOverride {
                    groups: Groups::Named(["batch".to_string()].into()),
                    workload_deadline: None,
                    workload_deadline_policy: None,
                    wait_for_replacement: None,
                    deregister: Some(false),
                },
                GroupOverride {
                    groups: Groups::Named(["web".to_string()].into()),
                    workload_deadline: None,
                    workload_deadline_policy: None,
                    wait_for_replacement: None,
                    deregister: Some(true),
                },
            ],
            ..settings(Duration::from_secs(3))
        })
        .build()
        .await;
    let nodes = nodes_of(&w, "web");
    let (node, iid) = nodes[0].clone();
    let (_, other) = nodes[1].clone();
    let asg = w.cloud.add_target_group("web-asg", "instance", "2");
    w.cloud.register_target(&asg, &iid);
    w.cloud.register_target(&asg, &other);
    w.cloud.attach_target_group("web", &asg);
    let elsewhere = w.cloud.add_target_group("elsewhere", "instance", "1");
    w.cloud.register_target(&elsewhere, &iid);

    delete_nodes(&mut w, "web", &[(node.clone(), iid.clone())]).await;
    assert_eq!(w.engine.wait_for(&iid).await, Some(Outcome::Ended));

    let log = w.cloud.lb_log();
    let off = log
        .iter()
        .position(|e| {
            *e == LbEvent::Deregistered {
                target_group: asg.clone(),
                target: iid.clone(),
                by_service: true,
            }
        })
        .unwrap_or_else(|| panic!("the service did not deregister it: {log:?}"));
    let draining = answered(&log, &asg, &iid, "draining").expect("read draining");
    let unused = answered(&log, &asg, &iid, "unused").expect("read unused");
    let completed = end_call(&log, &iid, true).expect("our hook's action was completed");
    assert!(
        off < draining && draining < unused && unused < completed,
        "{log:?}"
    );
    // One write, for the instance's own target only.
    let writes: Vec<&LbEvent> = log
        .iter()
        .filter(|e| matches!(e, LbEvent::Deregistered { .. }))
        .collect();
    assert_eq!(writes.len(), 1, "{log:?}");
    assert_eq!(w.cloud.lb_calls().get("deregister_targets"), Some(&1));
    assert_eq!(
        w.cloud.target_states(&asg),
        vec![
            (iid.clone(), "unused".to_string()),
            (other.clone(), "healthy".to_string())
        ]
    );
    assert_eq!(
        w.cloud.target_states(&elsewhere),
        vec![(iid.clone(), "healthy".to_string())]
    );
    let events = said(&w, &node);
    let done = events
        .iter()
        .find(|(r, _)| r == "DeregisteredFromLoadBalancers")
        .unwrap_or_else(|| panic!("{events:?}"));
    assert!(
        done.1.contains("web-asg") && !done.1.contains("elsewhere") && done.1.contains("web"),
        "{done:?}"
    );
    assert!(
        !events
            .iter()
            .any(|(r, _)| r == "LoadBalancerNotDeregistered"),
        "{events:?}"
    );
    let over = events
        .iter()
        .find(|(r, _)| r == "LoadBalancerWaitOver")
        .unwrap_or_else(|| panic!("{events:?}"));
    assert!(
        over.1.contains("elsewhere") && !over.1.contains("web-asg"),
        "{over:?}"
    );
    assert!(
        w.cloud.hook_timeouts().is_empty(),
        "{:?}",
        w.cloud.hook_timeouts()
    );
}

/// A refused DeregisterTargets is said once, naming the target group and the missing
/// permission, and the wait goes on as without it (the target still `healthy`, the
/// margin, then the end); a throttled DescribeLoadBalancerTargetGroups likewise.
#[tokio::test]
async fn a_refused_or_throttled_deregister_is_said_once_and_the_wait_goes_on_bounded() {
    for (op, fault) in [
        ("deregister_targets", "AccessDenied"),
        ("group_target_groups", "throttled"),
    ] {
        let mut w = World::builder()
            .web(3, 1)
            .settings(deregistering(Duration::from_secs(1)))
            .build()
            .await;
        let (node, iid) = nodes_of(&w, "web")[0].clone();
        let asg = w.cloud.add_target_group("web-asg", "instance", "1");
        w.cloud.register_target(&asg, &iid);
        w.cloud.attach_target_group("web", &asg);
        if fault == "throttled" {
            w.cloud.throttle(op, 1_000);
        } else {
            w.cloud.refuse(op, fault, 1_000);
        }
        delete_nodes(&mut w, "web", &[(node.clone(), iid.clone())]).await;
        assert_eq!(w.engine.wait_for(&iid).await, Some(Outcome::Ended), "{op}");
        let events = said(&w, &node);
        let not: Vec<&(String, String)> = events
            .iter()
            .filter(|(r, _)| r == "LoadBalancerNotDeregistered")
            .collect();
        assert_eq!(not.len(), 1, "{op}: said once: {events:?}");
        let want: &[&str] = if fault == "throttled" {
            &["attached to group web", "Rate exceeded"]
        } else {
            &[
                "web-asg",
                "elasticloadbalancing:DeregisterTargets",
                "AccessDenied",
            ]
        };
        assert!(want.iter().all(|w| not[0].1.contains(w)), "{op}: {not:?}");
        assert_eq!(
            w.cloud.target_states(&asg),
            vec![(iid.clone(), "healthy".to_string())],
            "{op}"
        );
        let log = w.cloud.lb_log();
        let ended = end_call(&log, &iid, false).expect("terminated");
        let over = events.iter().position(|(r, _)| r == "LoadBalancerWaitOver");
        assert!(
            over.is_some(),
            "{op}: the wait went on to its bound: {events:?}"
        );
        assert!(
            log[..ended]
                .iter()
                .filter(|e| matches!(e, LbEvent::Answered { .. }))
                .count()
                >= 1,
            "{op}: {log:?}"
        );
    }
}

/// The Events a direct call of the stage says, for the tests that call it alone.
/// `deregisters`: the one group whose instances it deregisters (`None`: none).
#[derive(Default)]
struct Heard(
    parking_lot::Mutex<Vec<(String, String)>>,
    Option<&'static str>,
);

impl Heard {
    fn deregistering(group: &'static str) -> Self {
        Self(Default::default(), Some(group))
    }
}

#[async_trait::async_trait]
impl WaitPort for Heard {
    async fn say(&self, _node: &str, reason: Reason, text: String) {
        self.0.lock().push((reason.as_str().to_string(), text));
    }
    fn held_since(&self, _instance_id: &str, _node: Option<&str>) -> Option<(Instant, Duration)> {
        None
    }
    fn deregisters(&self, group: &str) -> bool {
        self.1 == Some(group)
    }
    async fn note_wait(&self, _node: &str, _waiting: Option<&last_mile::Waiting>) {}
}

/// Idempotent across restarts and leader changes: a second pass (a new leader
/// resuming the drain) reads the target `draining` and writes nothing. And never for
/// a drain that keeps the node: `drain NODE` (drain only), a dry run, the wait turned
/// off and a group the setting does not select deregister nothing.
#[tokio::test]
async fn deregistering_twice_writes_once_and_a_drain_that_keeps_the_node_writes_nothing() {
    let w = World::builder().web(3, 1).build().await;
    let (node, iid) = nodes_of(&w, "web")[0].clone();
    let asg = w.cloud.add_target_group("web-asg", "instance", "300");
    w.cloud.register_target(&asg, &iid);
    w.cloud.attach_target_group("web", &asg);
    let lm = |dry_run: bool, enabled: bool| LastMile {
        settings: LoadBalancerWait {
            enabled,
            deregister: true,
            margin: Duration::ZERO,
            poll: Duration::from_millis(10),
        },
        dry_run,
        sightings: Default::default(),
    };
    let heard = Heard::deregistering("web");
    for (m, mode, port) in [
        (lm(false, true), Mode::DrainOnly, &heard),
        (lm(true, true), Mode::Direct, &heard),
        (lm(false, false), Mode::Direct, &heard),
        (
            lm(false, true),
            Mode::Direct,
            &Heard::deregistering("batch"),
        ),
    ] {
        deregister_own(&w.cloud, &m, port, &mode, "web", &iid, Some(&node)).await;
        wait_out(&w.cloud, &m, port, &mode, &iid, Some(&node)).await;
    }
    assert_eq!(w.cloud.lb_calls().get("deregister_targets"), None);
    assert_eq!(w.cloud.lb_calls().get("group_target_groups"), None);
    assert_eq!(
        w.cloud.target_states(&asg),
        vec![(iid.clone(), "healthy".to_string())]
    );

    let on = lm(false, true);
    for _ in 0..2 {
        deregister_own(
            &w.cloud,
            &on,
            &heard,
            &Mode::Direct,
            "web",
            &iid,
            Some(&node),
        )
        .await;
    }
    assert_eq!(w.cloud.lb_calls().get("group_target_groups"), Some(&2));
    assert_eq!(w.cloud.lb_calls().get("deregister_targets"), Some(&1));
    assert_eq!(
        w.cloud.target_states(&asg),
        vec![(iid.clone(), "draining".to_string())]
    );
    let heard = heard.0.lock().clone();
    assert_eq!(
        heard
            .iter()
            .filter(|(r, _)| r == "DeregisteredFromLoadBalancers")
            .count(),
        1,
        "{heard:?}"
    );
}

/// Registers target `id` on `port` in a target group of moto's ELBv2.
async fn register(elbc: &elb::Client, arn: &str, id: &str, port: i32) {
    elbc.register_targets()
        .target_group_arn(arn)
        .targets(
            elb::types::TargetDescription::builder()
                .id(id)
                .port(port)
                .build(),
        )
        .send()
        .await
        .unwrap();
}

/// The AWS backend against moto's ELBv2: target groups listed with their types, an instance's addresses, its targets by id and by address, the
/// deregistration delay as set, and a deregistered target gone from the group.
#[tokio::test]
async fn the_aws_backend_reads_target_groups_health_and_delays_from_moto() {
    let moto = MotoServer::start();
    let cfg = moto.sdk_config().await;
    let ec2c = ec2::Client::new(&cfg);
    let elbc = elb::Client::new(&cfg);
    let cloud = AwsCloud::from_sdk_config(&cfg);
    assert!(cloud.target_groups().await.unwrap().is_empty());

    let vpc = ec2c
        .create_vpc()
        .cidr_block("10.0.0.0/16")
        .send()
        .await
        .unwrap();
    let vpc_id = vpc.vpc().unwrap().vpc_id().unwrap().to_string();
    let subnet = ec2c
        .create_subnet()
        .vpc_id(&vpc_id)
        .cidr_block("10.0.1.0/24")
        .availability_zone("us-east-1a")
        .send()
        .await
        .unwrap();
    let subnet_id = subnet.subnet().unwrap().subnet_id().unwrap().to_string();
    let run = ec2c
        .run_instances()
        .image_id("ami-12c6146b")
        .min_count(1)
        .max_count(1)
        .subnet_id(&subnet_id)
        .send()
        .await
        .unwrap();
    let inst = &run.instances()[0];
    let iid = inst.instance_id().unwrap().to_string();
    let ip = inst.private_ip_address().unwrap().to_string();

    let group = |name: &str, kind: elb::types::TargetTypeEnum| {
        elbc.create_target_group()
            .name(name)
            .protocol(elb::types::ProtocolEnum::Http)
            .port(80)
            .vpc_id(&vpc_id)
            .target_type(kind)
            .send()
    };
    let web = group("web", elb::types::TargetTypeEnum::Instance)
        .await
        .unwrap();
    let web = web.target_groups()[0]
        .target_group_arn()
        .unwrap()
        .to_string();
    let pods = group("pods", elb::types::TargetTypeEnum::Ip).await.unwrap();
    let pods = pods.target_groups()[0]
        .target_group_arn()
        .unwrap()
        .to_string();
    register(&elbc, &web, &iid, 80).await;
    register(&elbc, &pods, &ip, 8080).await;
    elbc.modify_target_group_attributes()
        .target_group_arn(&web)
        .attributes(
            elb::types::TargetGroupAttribute::builder()
                .key("deregistration_delay.timeout_seconds")
                .value("45")
                .build(),
        )
        .send()
        .await
        .unwrap();
    // Groups without the instance besides. (moto answers DescribeTargetGroups in one
    // page whatever PageSize asks; the paging loop is the same as DescribeWarmPool's.)
    for n in 0..10 {
        group(&format!("extra-{n}"), elb::types::TargetTypeEnum::Instance)
            .await
            .unwrap();
    }

    let groups = cloud.target_groups().await.unwrap();
    assert_eq!(groups.len(), 12);
    let kind = |arn: &str| {
        groups
            .iter()
            .find(|g| g.arn == arn)
            .map(|g| (g.name.clone(), g.target_type.clone()))
    };
    assert_eq!(kind(&web), Some(("web".into(), "instance".into())));
    assert_eq!(kind(&pods), Some(("pods".into(), "ip".into())));
    assert_eq!(cloud.calls().count("DescribeTargetGroups"), 2);

    let a = cloud.instance_addresses(&iid).await.unwrap();
    assert!(a.addresses.contains(&ip), "{a:?}");
    let addresses = Addresses::parse(&a.addresses, &a.prefixes);
    let in_web = last_mile::states_of(
        "instance",
        &cloud.target_health(&web).await.unwrap(),
        &iid,
        &addresses,
    );
    let in_pods = last_mile::states_of(
        "ip",
        &cloud.target_health(&pods).await.unwrap(),
        &iid,
        &addresses,
    );
    assert_eq!(in_web.len(), 1, "{in_web:?}");
    assert_eq!(in_pods.len(), 1, "{in_pods:?}");
    assert!(in_web.iter().chain(&in_pods).all(|s| !last_mile::is_out(s)));
    let delay = cloud.deregistration_delay(&web).await.unwrap();
    assert_eq!(
        delay.as_deref().map(last_mile::parse_delay),
        Some(Ok(Duration::from_secs(45)))
    );
    let default = cloud.deregistration_delay(&pods).await.unwrap();
    assert_eq!(
        default.as_deref().map(last_mile::parse_delay),
        Some(Ok(Duration::from_secs(300)))
    );

    elbc.deregister_targets()
        .target_group_arn(&web)
        .targets(
            elb::types::TargetDescription::builder()
                .id(&iid)
                .port(80)
                .build(),
        )
        .send()
        .await
        .unwrap();
    let after = last_mile::states_of(
        "instance",
        &cloud.target_health(&web).await.unwrap(),
        &iid,
        &addresses,
    );
    assert!(after.iter().all(|s| last_mile::is_out(s)), "{after:?}");
    // A group gone is NotFound, which the wait counts as out.
    elbc.delete_target_group()
        .target_group_arn(&pods)
        .send()
        .await
        .unwrap();
    assert!(matches!(
        cloud.target_health(&pods).await,
        Err(ca_asg_provider::cloud::CloudError::NotFound { .. })
    ));
    // A backend built from clients without ELBv2 sees no load balancers.
    let bare = AwsCloud::from_clients(
        aws_sdk_autoscaling::Client::new(&cfg),
        ec2c.clone(),
        aws_sdk_eks::Client::new(&cfg),
    );
    assert!(bare.target_groups().await.unwrap().is_empty());
}

/// The AWS backend against moto (which implements AttachLoadBalancerTargetGroups,
/// DescribeLoadBalancerTargetGroups and DeregisterTargets; not DescribeTrafficSources):
/// the stage run on a group of two instances whose target group moto registered
/// both in takes out the one instance only, and leaves a target group the group does
/// not have alone though it has the instance.
#[tokio::test]
async fn the_aws_backend_deregisters_only_the_instances_own_target_on_moto() {
    let moto = MotoServer::start();
    let cfg = moto.sdk_config().await;
    let asgc = aws_sdk_autoscaling::Client::new(&cfg);
    let ec2c = ec2::Client::new(&cfg);
    let elbc = elb::Client::new(&cfg);
    let cloud = AwsCloud::from_sdk_config(&cfg);
    support::moto::launch_template(&cfg, "lt-web").await;
    support::moto::group_on(&asgc, "web", "lt-web", "$Default")
        .desired_capacity(2)
        .send()
        .await
        .unwrap();
    support::moto::group_on(&asgc, "bare", "lt-web", "$Default")
        .send()
        .await
        .unwrap();
    let vpcs = ec2c.describe_vpcs().send().await.unwrap();
    let vpc_id = vpcs
        .vpcs()
        .iter()
        .find(|v| v.is_default() == Some(true))
        .and_then(|v| v.vpc_id())
        .expect("moto's default VPC")
        .to_string();
    let group = |name: &str| {
        elbc.create_target_group()
            .name(name)
            .protocol(elb::types::ProtocolEnum::Http)
            .port(80)
            .vpc_id(&vpc_id)
            .target_type(elb::types::TargetTypeEnum::Instance)
            .send()
    };
    let arn_of = |o: elb::operation::create_target_group::CreateTargetGroupOutput| {
        o.target_groups()[0].target_group_arn().unwrap().to_string()
    };
    let asg_tg = arn_of(group("web-asg").await.unwrap());
    let elsewhere = arn_of(group("elsewhere").await.unwrap());
    asgc.attach_load_balancer_target_groups()
        .auto_scaling_group_name("web")
        .target_group_arns(&asg_tg)
        .send()
        .await
        .unwrap();
    let described = asgc
        .describe_auto_scaling_groups()
        .auto_scaling_group_names("web")
        .send()
        .await
        .unwrap();
    let ids: Vec<String> = described.auto_scaling_groups()[0]
        .instances()
        .iter()
        .filter_map(|i| i.instance_id().map(str::to_string))
        .collect();
    assert_eq!(ids.len(), 2, "{ids:?}");
    let (iid, other) = (ids[0].clone(), ids[1].clone());
    register(&elbc, &elsewhere, &iid, 80).await;
    let ids_in = |targets: Vec<ca_asg_provider::cloud::TargetHealth>| {
        let mut v: Vec<String> = targets
            .into_iter()
            .filter(|t| !last_mile::is_out(&t.state))
            .map(|t| t.id)
            .collect();
        v.sort();
        v
    };
    let mut both = vec![iid.clone(), other.clone()];
    both.sort();
    assert_eq!(ids_in(cloud.target_health(&asg_tg).await.unwrap()), both);
    assert_eq!(
        cloud.group_target_groups("web").await.unwrap(),
        vec![asg_tg.clone()]
    );
    assert!(cloud.group_target_groups("bare").await.unwrap().is_empty());

    let lm = LastMile {
        settings: LoadBalancerWait {
            deregister: true,
            ..LoadBalancerWait::default()
        },
        dry_run: false,
        sightings: Default::default(),
    };
    let heard = Heard::deregistering("web");
    deregister_own(
        &cloud,
        &lm,
        &heard,
        &Mode::Direct,
        "web",
        &iid,
        Some("node"),
    )
    .await;
    assert_eq!(
        ids_in(cloud.target_health(&asg_tg).await.unwrap()),
        vec![other.clone()]
    );
    assert_eq!(
        ids_in(cloud.target_health(&elsewhere).await.unwrap()),
        vec![iid.clone()]
    );
    assert_eq!(cloud.calls().count("DeregisterTargets"), 1);
    let heard = heard.0.lock().clone();
    assert_eq!(heard.len(), 1, "{heard:?}");
    assert_eq!(heard[0].0, "DeregisteredFromLoadBalancers");
    assert!(heard[0].1.contains("web-asg"), "{heard:?}");
    // Again (a new leader): the instance is no target any more, nothing is written.
    deregister_own(
        &cloud,
        &lm,
        &Heard::deregistering("web"),
        &Mode::Direct,
        "web",
        &iid,
        Some("node"),
    )
    .await;
    assert_eq!(cloud.calls().count("DeregisterTargets"), 1);
}

/// What moto does not model, through the SDK's mock layer: DescribeTargetGroups in
/// pages of 400 followed by their marker, a target without a state read as one that
/// may carry traffic, and AWS's refusals classified as the wait counts them (throttled:
/// passing; AccessDenied: a missing permission, by its code; a group gone: NotFound).
#[tokio::test]
async fn target_groups_are_paged_and_refusals_classified_through_the_sdks_mock_layer() {
    use aws_sdk_elasticloadbalancingv2::operation::describe_target_groups::DescribeTargetGroupsOutput;
    use aws_sdk_elasticloadbalancingv2::operation::describe_target_health::{
        DescribeTargetHealthError, DescribeTargetHealthOutput,
    };
    use aws_smithy_mocks::{mock, mock_client, RuleMode};
    use aws_smithy_types::error::ErrorMetadata;
    use ca_asg_provider::cloud::CloudError;

    let tg = |n: usize| {
        elb::types::TargetGroup::builder()
            .target_group_arn(format!("arn:tg/{n}"))
            .target_group_name(format!("tg-{n}"))
            .target_type(elb::types::TargetTypeEnum::Ip)
            .build()
    };
    let first = mock!(elb::Client::describe_target_groups)
        .match_requests(|r| r.marker().is_none() && r.page_size() == Some(400))
        .then_output(move || {
            DescribeTargetGroupsOutput::builder()
                .set_target_groups(Some((0..400).map(tg).collect()))
                .next_marker("page-2")
                .build()
        });
    let second = mock!(elb::Client::describe_target_groups)
        .match_requests(|r| r.marker() == Some("page-2"))
        .then_output(move || {
            DescribeTargetGroupsOutput::builder()
                .set_target_groups(Some((400..402).map(tg).collect()))
                .build()
        });
    let stateless = mock!(elb::Client::describe_target_health)
        .match_requests(|r| r.target_group_arn() == Some("arn:tg/1"))
        .then_output(|| {
            DescribeTargetHealthOutput::builder()
                .target_health_descriptions(
                    elb::types::TargetHealthDescription::builder()
                        .target(
                            elb::types::TargetDescription::builder()
                                .id("10.0.1.5")
                                .build(),
                        )
                        .build(),
                )
                .build()
        });
    let error = |code: &'static str| {
        move || {
            DescribeTargetHealthError::generic(
                ErrorMetadata::builder().code(code).message(code).build(),
            )
        }
    };
    let throttled = mock!(elb::Client::describe_target_health)
        .match_requests(|r| r.target_group_arn() == Some("arn:tg/2"))
        .then_error(error("Throttling"));
    let denied = mock!(elb::Client::describe_target_health)
        .match_requests(|r| r.target_group_arn() == Some("arn:tg/3"))
        .then_error(error("AccessDenied"));
    let gone = mock!(elb::Client::describe_target_health)
        .match_requests(|r| r.target_group_arn() == Some("arn:tg/4"))
        .then_error(error("TargetGroupNotFound"));
    let client: elb::Client = mock_client!(
        aws_sdk_elasticloadbalancingv2,
        RuleMode::MatchAny,
        &[&first, &second, &stateless, &throttled, &denied, &gone]
    );
    let cloud = AwsCloud::from_clients(
        aws_sdk_autoscaling::Client::from_conf(
            aws_sdk_autoscaling::Config::builder()
                .behavior_version_latest()
                .region(aws_sdk_autoscaling::config::Region::new("us-east-1"))
                .build(),
        ),
        aws_sdk_ec2::Client::from_conf(
            aws_sdk_ec2::Config::builder()
                .behavior_version_latest()
                .region(aws_sdk_ec2::config::Region::new("us-east-1"))
                .build(),
        ),
        aws_sdk_eks::Client::from_conf(
            aws_sdk_eks::Config::builder()
                .behavior_version_latest()
                .region(aws_sdk_eks::config::Region::new("us-east-1"))
                .build(),
        ),
    )
    .with_elb(client);

    let groups = cloud.target_groups().await.unwrap();
    assert_eq!(groups.len(), 402);
    assert_eq!((first.num_calls(), second.num_calls()), (1, 1));
    assert_eq!(groups[401].name, "tg-401");
    assert_eq!(groups[0].target_type, "ip");

    let h = cloud.target_health("arn:tg/1").await.unwrap();
    assert_eq!(h.len(), 1);
    assert!(!last_mile::is_out(&h[0].state), "{h:?}");
    let e = cloud.target_health("arn:tg/2").await.unwrap_err();
    assert!(matches!(e, CloudError::Throttled { .. }), "{e:?}");
    let e = cloud.target_health("arn:tg/3").await.unwrap_err();
    assert!(
        matches!(&e, CloudError::Rejected { code, .. } if code == "AccessDenied"),
        "{e:?}"
    );
    let e = cloud.target_health("arn:tg/4").await.unwrap_err();
    assert!(matches!(e, CloudError::NotFound { .. }), "{e:?}");
}

//! Queue mode end to end on the in-memory API server and the memory cloud: messages
//! in the shapes AWS sends, through the consumer, to the drain. (tests/aws_moto.rs
//! runs the same consumer on SQS, with the events put through EventBridge.)

use std::sync::Arc;
use std::time::Duration;

use ca_asg_provider::cloud::memory::MemoryGroup;
use ca_asg_provider::cloud::queue::{MemoryQueue, Queue};
use ca_asg_provider::scalein::sources::queue::Handled;
use ca_asg_provider::scalein::{self, Outcome, ScaleInSettings};
use ca_asg_provider::scalein::{decide::notice::RebalanceAction, settings::InterruptionSettings};
use ca_asg_provider::sim::fixtures;
use k8s_openapi::api::core::v1::Node;

mod support;
use support::eventually;
use support::notices::{eventbridge, lifecycle_at, spot, spot_at};
use support::queue::{consumer, handle_next, queue_and_consumer, running};
use support::world::*;

#[tokio::test]
async fn a_spot_warning_drains_workloads_first_and_daemonsets_last_within_two_minutes() {
    let w = World::builder().web(3, 1).build().await;
    let (node, iid) = node_with_fluentd_and_app(&w, 2.0).await;
    let (q, c) = queue_and_consumer(&w, RebalanceAction::Cordon);
    q.send(&spot(&iid));
    assert_eq!(handle_next(&c, &q).await, Handled::Done(vec!["drain"]));
    assert_eq!(q.pending(), 0, "deleted once handled");
    assert_eq!(w.engine.wait_for(&iid).await, Some(Outcome::Drained));

    let a = w.sim.audit();
    let app_start = audit_index(&a, "deletion-started", "Pod", "app").expect("app evicted");
    let app_gone = audit_index(&a, "removed", "Pod", "app").expect("app removed");
    let ds_start = audit_index(&a, "deletion-started", "Pod", "fluentd").expect("fluentd evicted");
    assert!(
        app_start < app_gone && app_gone < ds_start,
        "{app_start} {app_gone} {ds_start}"
    );
    assert!(
        a[app_gone].at.duration_since(a[app_start].at) >= Duration::from_millis(1900),
        "the app's preStop ran its 2 s"
    );
    // AWS ends a spot instance itself: nothing is terminated or decremented here.
    assert_eq!(w.cloud.calls().get("terminate_instance"), None);
    assert_eq!(w.cloud.desired("web"), Some(1));
    let ev = events(&w.sim);
    assert!(
        ev.iter()
            .any(|(r, n)| r == "InterruptionDrained" && n.contains("before AWS ends the instance")),
        "{ev:?}"
    );
    assert!(ev
        .iter()
        .any(|(r, n)| r == "DrainStarted" && n.contains(&iid)));
    // Notice to drain started, and notice to drained, are measured.
    let text = ca_asg_provider::telemetry::metrics::metrics().encode();
    for series in [
        "ca_asg_provider_notice_to_drain_seconds_count{kind=\"spot_interruption\"}",
        "ca_asg_provider_notice_to_drained_seconds_count{kind=\"spot_interruption\"}",
    ] {
        let n: u64 = text
            .lines()
            .find_map(|l| l.strip_prefix(series))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        assert!(n >= 1, "{series} not observed");
    }
    let n = w.sim.get::<Node>("", &node).unwrap();
    assert_eq!(n["spec"]["unschedulable"], true);
    assert_eq!(
        n["metadata"]["annotations"]["ca-asg-provider.io/drain-mode"],
        "interruption"
    );
}

/// A replica that does not lead writes nothing for a message it holds (it lost the
/// lease after its batch came): not even the Node's record; the message stays for the
/// leader, which then drains as usual (the soak found a follower's consumer cordoning
/// a spot-warned node while the other replica led).
#[tokio::test]
async fn a_replica_that_does_not_lead_writes_nothing_for_a_message() {
    let w = World::builder().web(3, 1).build().await;
    let (node, iid) = node_with_fluentd_and_app(&w, 0.1).await;
    let (leads, follows) = tokio::sync::watch::channel(false);
    w.engine.leadership.follow(follows);
    let (q, c) = queue_and_consumer(&w, RebalanceAction::Cordon);
    q.send(&spot(&iid));
    assert!(matches!(handle_next(&c, &q).await, Handled::Retry(_)));
    let n = w.sim.get::<Node>("", &node).unwrap();
    assert_ne!(
        n["spec"]["unschedulable"], true,
        "a follower cordoned {node}"
    );
    assert!(
        n["metadata"]["annotations"]["ca-asg-provider.io/drain-mode"].is_null(),
        "a follower recorded a drain on {node}"
    );
    assert!(!w.engine.is_draining(&iid));
    assert_eq!(q.pending(), 1, "the message stays for the leader");

    leads.send_replace(true);
    q.redeliver();
    assert!(matches!(handle_next(&c, &q).await, Handled::Done(_)));
    let n = w.sim.get::<Node>("", &node).unwrap();
    assert_eq!(n["spec"]["unschedulable"], true);
}

#[tokio::test]
async fn a_rebalance_recommendation_cordons_only() {
    let w = World::builder().web(3, 1).build().await;
    let (node, iid) = node_with_fluentd_and_app(&w, 0.1).await;
    let (q, c) = queue_and_consumer(&w, RebalanceAction::Cordon);
    q.send(&eventbridge(
        "EC2 Instance Rebalance Recommendation",
        "aws.ec2",
        serde_json::json!({"instance-id": iid}),
    ));
    assert_eq!(handle_next(&c, &q).await, Handled::Done(vec!["cordon"]));
    let n = w.sim.get::<Node>("", &node).unwrap();
    assert_eq!(n["spec"]["unschedulable"], true);
    assert!(!w.engine.is_draining(&iid));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        running(&w, "app") && running(&w, "fluentd"),
        "nothing evicted"
    );
    assert!(events(&w.sim).iter().any(|(r, _)| r == "RebalanceCordoned"));

    // CA then removes the node: its mode outranks the rebalance mark, so the drain is
    // recorded as CA's (resumable, counted) and ends the instance.
    let mut w = w;
    delete_nodes(&mut w, "web", &[(node.clone(), iid.clone())]).await;
    let n = w.sim.get::<Node>("", &node).unwrap();
    assert_eq!(
        n["metadata"]["annotations"]["ca-asg-provider.io/drain-mode"],
        "direct"
    );
    assert_eq!(w.engine.wait_for(&iid).await, Some(Outcome::Ended));
}

#[tokio::test]
async fn a_duplicate_and_a_restart_mid_drain_make_one_drain() {
    let mut w = World::builder().web(3, 1).build().await;
    let (node, iid) = node_with_fluentd_and_app(&w, 3.0).await;
    let q = Arc::new(MemoryQueue::default());
    let loop_task = consumer(&w, &q, RebalanceAction::Cordon).spawn();
    q.send(&spot(&iid));
    q.send(&spot(&iid));
    eventually("both deliveries handled and deleted", 10, || {
        q.deleted().len() == 2
    })
    .await;
    eventually("the app is being evicted", 10, || !running(&w, "app")).await;

    // The process dies mid-drain; SQS would deliver the message again.
    loop_task.abort();
    w.engine.abort_all();
    w.engine.shutdown();
    let (provider, engine, ca) = service(&w.sim, &w.cloud, &w.groups, fast_settings()).await;
    w.provider = provider;
    w.engine = engine;
    w.ca = ca;
    let q2 = Arc::new(MemoryQueue::default());
    let c2 = consumer(&w, &q2, RebalanceAction::Cordon);
    // The new leader finds the drain recorded on the Node and goes on with it; the
    // redelivered message then starts nothing.
    let resumed = scalein::sources::hook_scan::spawn_loop(w.engine.clone(), w.provider.clone());
    eventually("the drain is resumed from the Node's mark", 10, || {
        w.engine.is_draining(&iid)
    })
    .await;
    q2.send(&spot(&iid));
    assert_eq!(
        handle_next(&c2, &q2).await,
        Handled::Done(vec!["duplicate"])
    );
    eventually("fluentd leaves last", 20, || !running(&w, "fluentd")).await;
    resumed.abort();

    let a = w.sim.audit();
    let evictions = |name: &str| {
        a.iter()
            .filter(|e| e.verb == "deletion-started" && e.kind == "Pod" && e.name.starts_with(name))
            .count()
    };
    assert_eq!(evictions("app"), 1, "the app was evicted once");
    assert_eq!(evictions("fluentd"), 1);
    let app_gone = audit_index(&a, "removed", "Pod", "app").expect("app removed");
    let ds_start = audit_index(&a, "deletion-started", "Pod", "fluentd").unwrap();
    assert!(app_gone < ds_start, "DaemonSet-last across the restart");
    assert_eq!(w.cloud.calls().get("terminate_instance"), None);
    assert!(
        w.sim.get::<Node>("", &node).is_some(),
        "the instance is AWS's to end"
    );
}

#[tokio::test]
async fn poison_and_test_messages_are_deleted_and_counted_never_retried() {
    let w = World::builder().web(3, 1).build().await;
    let (q, c) = queue_and_consumer(&w, RebalanceAction::Cordon);
    let dropped_before = dropped_count("malformed");
    q.send("{\"detail-type\": \"EC2 Spot Instance Interruption Warning\", \"detail\": {}}");
    assert_eq!(handle_next(&c, &q).await, Handled::Dropped("malformed"));
    assert_eq!(dropped_count("malformed"), dropped_before + 1);
    q.send(r#"{"AccountId":"123456789012","RequestId":"r","AutoScalingGroupName":"web","Service":"AWS Auto Scaling","Event":"autoscaling:TEST_NOTIFICATION","Time":"2026-11-23T10:00:00Z"}"#);
    assert_eq!(handle_next(&c, &q).await, Handled::Done(vec!["ignored"]));
    // An instance of no managed group: ignored unless configured otherwise.
    q.send(&spot("i-0123456789abcdef0"));
    assert_eq!(handle_next(&c, &q).await, Handled::Done(vec!["unmanaged"]));
    assert_eq!(q.pending(), 0);
    assert_eq!(w.engine.drains_at_once(), 0);

    // A message that keeps failing is dropped after maxReceives, not retried forever.
    let iid = nodes_of(&w, "web")[0].1.clone();
    let gave_up = dropped_count("gave_up");
    q.send(&spot(&iid));
    for _ in 0..5 {
        let m = q.receive(1, Duration::from_millis(10)).await.unwrap();
        assert_eq!(m.len(), 1);
        q.redeliver();
    }
    assert_eq!(handle_next(&c, &q).await, Handled::Dropped("gave_up"));
    assert_eq!(dropped_count("gave_up"), gave_up + 1);
    assert_eq!(q.pending(), 0);
}

fn dropped_count(reason: &str) -> u64 {
    let text = ca_asg_provider::telemetry::metrics::metrics().encode();
    let key = format!("ca_asg_provider_queue_messages_dropped_total{{reason=\"{reason}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&key))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// The ASG's notification drains the instance and completes the action, by instance
/// id: the message's token is not AWS's word (a wrong one is refused by AWS, see
/// reasons::a_lifecycle_message_with_a_wrong_token_does_not_cost_the_hook).
#[tokio::test]
async fn the_asgs_lifecycle_notification_drains_and_completes_by_instance_id() {
    let w = World::builder().web_hooked(3, 2, 300).build().await;
    let (q, c) = queue_and_consumer(&w, RebalanceAction::Cordon);
    let iid = w.cloud.external_scale_in("web", 1).unwrap().remove(0);
    let at = chrono::DateTime::parse_from_rfc3339("2026-11-23T10:00:05.123Z").unwrap();
    let note = |hook: &str| lifecycle_at("web", &iid, hook, Some("tok-1234"), at.into());
    // Another tool's hook: its action is not ours to complete.
    q.send(&note("nth-hook"));
    assert_eq!(handle_next(&c, &q).await, Handled::Done(vec!["ignored"]));
    q.send(&note("ca-asg-provider-drain"));
    assert_eq!(
        handle_next(&c, &q).await,
        Handled::Done(vec!["lifecycle_drain"])
    );
    assert_eq!(w.engine.wait_for(&iid).await, Some(Outcome::Ended));
    let done = w.cloud.completed_actions();
    assert_eq!(done.len(), 1, "{done:?}");
    assert_eq!(done[0].0.token, None, "not the message's token");
    assert_eq!(done[0].0.instance_id, iid);
    assert_eq!(done[0].0.hook, "ca-asg-provider-drain");
}

#[tokio::test]
async fn an_instance_that_stopped_stops_its_drain() {
    let w = World::builder().web(3, 1).build().await;
    let (node, iid) = nodes_of(&w, "web").remove(0);
    // A PDB that allows nothing: the drain waits on it.
    w.put(&fixtures::pdb("shop", "app", 0));
    w.put(&fixtures::pod("shop", "app", &node, "app", 0.1));
    pods_ready(&w, 1).await;
    let (q, c) = queue_and_consumer(&w, RebalanceAction::Cordon);
    q.send(&spot(&iid));
    assert_eq!(handle_next(&c, &q).await, Handled::Done(vec!["drain"]));
    eventually("the eviction is refused by the PDB", 10, || {
        events(&w.sim).iter().any(|(r, _)| r == "EvictionBlocked")
    })
    .await;
    assert!(w.engine.is_draining(&iid));
    q.send(&eventbridge(
        "EC2 Instance State-change Notification",
        "aws.ec2",
        serde_json::json!({"instance-id": iid, "state": "shutting-down"}),
    ));
    assert_eq!(handle_next(&c, &q).await, Handled::Done(vec!["stopped"]));
    assert!(!w.engine.is_draining(&iid));
    // The PDB was never broken: the app still runs.
    assert!(running(&w, "app"));
}

/// The AWS cost of finding held instances at 200 hooked groups: one lifecycle scan
/// is one read of every hooked group, which the AWS backend sends in batches of 100
/// names (2 DescribeAutoScalingGroups requests). The
/// poll runs every 5 s without the queue (24 calls a minute) and every 5 min as the
/// queue's safety net (0.4 a minute); the queue itself costs 3 long-poll receives a
/// minute when idle. docs/queue-mode.md quotes these numbers.
#[tokio::test]
async fn one_lifecycle_scan_of_200_hooked_groups_is_one_batched_read() {
    let groups: Vec<MemoryGroup> = (0..200)
        .map(|i| {
            MemoryGroup::new(&format!("ng-{i:03}"), 0, 4, 1, "m5.large")
                .terminating_hook("ca-asg-provider-drain", 300)
        })
        .collect();
    let w = World::builder().groups(groups).build().await;
    let before = w.cloud.calls();
    scalein::sources::hook_scan::scan(&w.engine, &w.provider).await;
    let after = w.cloud.calls();
    let delta =
        |op: &str| after.get(op).copied().unwrap_or(0) - before.get(op).copied().unwrap_or(0);
    assert_eq!(delta("describe_groups"), 1, "{before:?} -> {after:?}");
    let total: u64 = after.values().sum::<u64>() - before.values().sum::<u64>();
    assert_eq!(total, 1, "nothing else is called when nothing is held");
    let interruption = InterruptionSettings::default();
    let per_minute = |poll: Duration| 2.0 * 60.0 / poll.as_secs_f64();
    eprintln!(
        "200 hooked groups: {:.1} DescribeAutoScalingGroups/min polling every {:?}, {:.1}/min as the queue's safety net every {:?}, plus {:.0} ReceiveMessage/min idle",
        per_minute(ScaleInSettings::default().lifecycle_poll_interval),
        ScaleInSettings::default().lifecycle_poll_interval,
        per_minute(interruption.safety_net_poll),
        interruption.safety_net_poll,
        60.0 / interruption.wait.as_secs_f64()
    );
}

#[tokio::test]
async fn a_scheduled_retirement_drains_before_its_start_time() {
    let w = World::builder().web(3, 1).build().await;
    let (_node, iid) = node_with_fluentd_and_app(&w, 0.5).await;
    let (q, c) = queue_and_consumer(&w, RebalanceAction::Cordon);
    let start = (chrono::Utc::now() + chrono::Duration::minutes(10)).to_rfc2822();
    q.send(&eventbridge(
        "AWS Health Event",
        "aws.health",
        serde_json::json!({
            "eventArn": "arn:aws:health:us-east-1::event/EC2/AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED/x",
            "service": "EC2",
            "eventTypeCode": "AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED",
            "eventTypeCategory": "scheduledChange",
            "startTime": start,
            "affectedEntities": [{"entityValue": iid}],
        }),
    ));
    assert_eq!(handle_next(&c, &q).await, Handled::Done(vec!["drain"]));
    assert_eq!(w.engine.wait_for(&iid).await, Some(Outcome::Drained));
    let ev = events(&w.sim);
    assert!(
        ev.iter().any(|(r, _)| r == "InterruptionDrained"),
        "the drain is measured against the start time: {ev:?}"
    );
    assert_eq!(w.cloud.calls().get("terminate_instance"), None);
}

/// A spot warning that arrives late (15 s of its 2 minutes left) meets a pod whose
/// PDB allows nothing: the budget is spent, so the drain goes on (the pod gets its
/// graceful stop instead of EC2's hard one) and the DaemonSet pods still go last.
/// A retirement days away with the same pod keeps the configured `abandon`: no PDB is
/// broken when there is time.
#[tokio::test]
async fn only_a_spent_budget_overrides_a_pdb() {
    let settings = ca_asg_provider::scalein::ScaleInSettings {
        workload_deadline: Duration::from_secs(2),
        ..fast_settings()
    };
    let w = World::builder().web(3, 2).settings(settings).build().await;
    let web = nodes_of(&w, "web");
    let ((spot_node, spot_iid), (far_node, far_iid)) = (web[0].clone(), web[1].clone());
    w.put(&fixtures::pdb("shop", "app", 0));
    w.put(&fixtures::pod("shop", "app-spot", &spot_node, "app", 0.1));
    w.put(&fixtures::pod("shop", "app-far", &far_node, "app", 0.1));
    pods_ready(&w, 2).await;
    let (q, c) = queue_and_consumer(&w, RebalanceAction::Cordon);

    q.send(&spot_at(
        &spot_iid,
        chrono::Utc::now() - chrono::Duration::seconds(105),
    ));
    assert_eq!(handle_next(&c, &q).await, Handled::Done(vec!["drain"]));
    assert_eq!(w.engine.wait_for(&spot_iid).await, Some(Outcome::Drained));
    assert!(!running(&w, "app-spot"), "the spent budget went on");

    let start = chrono::Utc::now() + chrono::Duration::days(3);
    q.send(&support::notices::retirement_at(&far_iid, start));
    assert_eq!(handle_next(&c, &q).await, Handled::Done(vec!["drain"]));
    let out = w.engine.wait_for(&far_iid).await;
    assert!(matches!(out, Some(Outcome::Abandoned(_))), "{out:?}");
    assert!(running(&w, "app-far"), "the PDB held");
}

/// docs/operations.md, "When a call is refused": SQS refuses the consumer's receives
/// (throttled). The loop backs off and receives again; nothing is lost: the spot
/// warning sent meanwhile is handled once SQS answers, and its drain runs as usual.
#[tokio::test]
async fn a_refused_receive_backs_off_and_the_notice_is_still_handled() {
    let w = World::builder().web(3, 1).build().await;
    let (_node, iid) = node_with_fluentd_and_app(&w, 0.1).await;
    let q = Arc::new(MemoryQueue::default());
    q.refuse_receives(2);
    let loop_task = consumer(&w, &q, RebalanceAction::Cordon).spawn();
    q.send(&spot(&iid));
    eventually("the notice handled and deleted", 30, || {
        q.deleted().len() == 1
    })
    .await;
    assert_eq!(q.receives_refused_left(), 0, "both refusals were met");
    assert_eq!(w.engine.wait_for(&iid).await, Some(Outcome::Drained));
    loop_task.abort();
    assert!(!running(&w, "app"));
    assert!(!running(&w, "fluentd"));
}

/// The spot warning's drain finished; the log shipper, which tolerates the drain
/// taint, came back to ship the node's last logs. Then SQS delivers the warning
/// again to a process that never saw it (its delete was lost to a restart or a new
/// leader): the Node's record says that notice is done, so it is a duplicate, and
/// the log shipper is not asked to leave a second time.
#[tokio::test]
async fn the_same_notice_after_its_drain_finished_does_not_drain_again() {
    let w = World::builder().web(3, 1).build().await;
    let (node, iid) = nodes_of(&w, "web").remove(0);
    w.put(&fixtures::log_shipper_tolerating_drain(0.0));
    w.put(&fixtures::pod("shop", "app", &node, "app", 0.1));
    pods_ready(&w, 2).await;
    let q = Arc::new(MemoryQueue::default());
    let warning = spot(&iid);
    q.send(&warning);
    let first = consumer(&w, &q, RebalanceAction::Cordon);
    assert_eq!(handle_next(&first, &q).await, Handled::Done(vec!["drain"]));
    assert_eq!(w.engine.wait_for(&iid).await, Some(Outcome::Drained));
    eventually("the log shipper came back to the drained node", 10, || {
        running(&w, "log-shipper")
    })
    .await;
    let asked = || {
        w.sim
            .audit()
            .iter()
            .filter(|e| e.verb == "eviction-requested" && e.name.starts_with("log-shipper"))
            .count()
    };
    assert_eq!(asked(), 1);

    // A process that never saw the warning (its memory of recent notices empty).
    let restarted = consumer(&w, &q, RebalanceAction::Cordon);
    q.send(&warning);
    assert_eq!(
        handle_next(&restarted, &q).await,
        Handled::Done(vec!["duplicate"])
    );
    assert_eq!(q.pending(), 0, "deleted: nothing left to do");
    assert!(!w.engine.is_draining(&iid));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(asked(), 1, "the log shipper was asked to leave once");
    assert!(running(&w, "log-shipper"));
    let n = w.sim.get::<Node>("", &node).unwrap();
    assert_eq!(
        n["spec"]["unschedulable"], true,
        "still cordoned for AWS's end"
    );
}

//! Disruption budgets on the real engine (memory cloud, in-memory API server): CA's
//! scale-in of three occupied nodes under a budget of one drains one at a time, every
//! node cordoned first and each waiting one told why; a window with `nodes: 0` holds a
//! scale-in's drain until it closes and never a spot warning's.

use std::time::Duration;

use ca_asg_provider::scalein::decide::budget::{cron::Cron, Budget, Cause, Groups, Nodes, Window};
use ca_asg_provider::scalein::decide::notice::RebalanceAction;
use ca_asg_provider::scalein::sources::queue::Handled;
use ca_asg_provider::scalein::{Outcome, ScaleInSettings};
use ca_asg_provider::sim::fixtures;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;

mod support;
use support::eventually;
use support::notices::spot;
use support::queue::{handle_next, queue_and_consumer};
use support::world::*;

/// The service's Lease as replica `who` runs for it (1 s: a dead leader's expires fast).
fn lease(who: &str) -> ca_asg_provider::scalein::engine::leader::LeaseSettings {
    ca_asg_provider::scalein::engine::leader::LeaseSettings {
        name: "ca-asg-provider".into(),
        namespace: "kube-system".into(),
        identity: who.into(),
        duration: Duration::from_secs(1),
    }
}

/// Replica A (its Lease task `a`) dies without releasing the Lease; B, a new process
/// with `settings`, takes it over once it expires and leads. B's Lease task.
async fn b_takes_over(
    a: tokio::task::JoinHandle<()>,
    w: &mut World,
    settings: ScaleInSettings,
) -> tokio::task::JoinHandle<()> {
    a.abort();
    w.engine.abort_all();
    w.engine.shutdown();
    let (provider, engine, ca) = service(&w.sim, &w.cloud, &w.groups, settings).await;
    (w.provider, w.engine, w.ca) = (provider, engine, ca);
    let b = w.engine.lead_as(lease("replica-b"));
    eventually("replica B leads", 10, || w.engine.leadership.leads()).await;
    b
}

fn cordoned(w: &World, node: &str) -> bool {
    w.sim
        .get::<Node>("", node)
        .is_some_and(|n| n["spec"]["unschedulable"] == true)
}

fn in_slots(w: &World) -> usize {
    w.engine
        .book
        .stories()
        .values()
        .filter(|s| s.slot_run.is_some() && !s.slot_past_budgets)
        .count()
}

fn waiting_events(w: &World) -> Vec<String> {
    events(&w.sim)
        .into_iter()
        .filter(|(r, _)| r == "DrainWaitingForBudget")
        .map(|(_, n)| n)
        .collect()
}

#[tokio::test]
async fn three_occupied_nodes_under_a_budget_of_one_drain_one_at_a_time() {
    let settings = ScaleInSettings {
        budgets: vec![Budget {
            causes: Some([Cause::CaOccupied].into()),
            ..Budget::always("one-at-a-time", Nodes::Count(1))
        }],
        ..fast_settings()
    };
    let mut w = World::builder().web(4, 4).settings(settings).build().await;
    let victims: Vec<(String, String)> = nodes_of(&w, "web").into_iter().take(3).collect();
    for (i, (node, _)) in victims.iter().enumerate() {
        guarded_app(&w, node, &format!("app{i}")).await;
    }
    delete_nodes(&mut w, "web", &victims).await;

    eventually("every node is cordoned before any waits", 10, || {
        victims.iter().all(|(n, _)| cordoned(&w, n))
    })
    .await;
    eventually("the two others wait, told why", 10, || {
        waiting_events(&w).len() == 2
    })
    .await;
    for note in waiting_events(&w) {
        assert!(
            note.contains("\"one-at-a-time\"") && note.contains("1 of 1 allowed drain now"),
            "{note}"
        );
    }
    assert_eq!(in_slots(&w), 1);
    // The two waiting say so on their Node too (`status` shows it), the running one
    // where it is.
    let says = |node: &str| {
        w.sim.get::<Node>("", node).and_then(|n| {
            n["status"]["conditions"]
                .as_array()?
                .iter()
                .find(|c| c["type"] == "DrainInProgress" && c["status"] == "True")
                .and_then(|c| c["message"].as_str().map(str::to_string))
        })
    };
    eventually("the waiting drains' conditions name the budget", 10, || {
        victims
            .iter()
            .filter(|(n, _)| {
                says(n).is_some_and(|m| {
                    m.starts_with("waiting for disruption budget \"one-at-a-time\"")
                })
            })
            .count()
            == 2
    })
    .await;

    // Each lifted budget lets one drain end and the next start; never two at once.
    for i in 0..3 {
        assert!(in_slots(&w) <= 1);
        let holder = w
            .engine
            .book
            .stories()
            .into_iter()
            .find(|(_, s)| s.slot_run.is_some())
            .map(|(id, _)| id);
        let Some(holder) = holder else {
            panic!("round {i}: no drain holds the slot");
        };
        let app = victims
            .iter()
            .position(|(_, iid)| *iid == holder)
            .expect("a victim holds it");
        assert!(w
            .sim
            .remove::<PodDisruptionBudget>("shop", &format!("app{app}-pdb")));
        assert_eq!(w.engine.wait_for(&holder).await, Some(Outcome::Ended));
        assert!(in_slots(&w) <= 1);
        if i < 2 {
            eventually("the next drain takes the slot", 10, || in_slots(&w) == 1).await;
        }
    }
    assert_eq!(w.cloud.calls()["terminate_instance"], 3);
}

#[tokio::test]
async fn a_closed_window_holds_a_scale_in_but_never_a_spot_warning() {
    let always = Window {
        schedule: Cron::parse("* * * * *").unwrap(),
        duration: Duration::from_secs(3600),
    };
    let settings = ScaleInSettings {
        budgets: vec![Budget {
            window: Some(always),
            ..Budget::always("frozen", Nodes::Count(0))
        }],
        ..fast_settings()
    };
    let mut w = World::builder().web(4, 2).settings(settings).build().await;
    let web = nodes_of(&w, "web");
    let (node, iid) = web[0].clone();
    w.put(&fixtures::pod("shop", "app", &node, "app", 0.1));
    delete_nodes(&mut w, "web", &[(node.clone(), iid.clone())]).await;
    eventually("the drain waits for the window to close", 10, || {
        waiting_events(&w)
            .iter()
            .any(|n| n.contains("\"frozen\"") && n.contains("no drain allowed until"))
    })
    .await;
    assert!(cordoned(&w, &node));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        support::queue::running(&w, "app"),
        "nothing is evicted while the window is closed"
    );
    assert!(
        w.engine.is_draining(&iid),
        "the drain waits, it does not fail"
    );
    assert_eq!(w.cloud.calls().get("terminate_instance"), None);

    // A spot warning for the other node: the instance ends anyway, so its drain
    // starts at once, window or not, and is counted.
    let (spot_node, spot_iid) = web[1].clone();
    w.put(&fixtures::pod(
        "shop", "spotted", &spot_node, "spotted", 0.1,
    ));
    let (q, c) = queue_and_consumer(&w, RebalanceAction::Drain);
    q.send(&spot(&spot_iid));
    assert_eq!(handle_next(&c, &q).await, Handled::Done(vec!["drain"]));
    let drained = tokio::time::timeout(Duration::from_secs(20), w.engine.wait_for(&spot_iid)).await;
    assert_eq!(
        drained.ok().flatten(),
        Some(Outcome::Drained),
        "the spot drain is not held by the window"
    );
    assert!(!support::queue::running(&w, "spotted"));
    assert!(
        support::queue::running(&w, "app"),
        "the CA drain still waits for the window"
    );
    assert!(waiting_events(&w).iter().all(|n| !n.contains(&spot_iid)));
}

/// The group ends an instance through our hook while a window allows no drain. The
/// hook's global timeout (100 heartbeat timeouts of 2 s) leaves less than the drain's
/// deadlines: waiting would let AWS end the instance undrained, so the drain starts
/// past the budget at once, says so, and the action is completed after the drain.
#[tokio::test]
async fn a_drain_our_hook_holds_starts_past_a_budget_in_time_for_the_hook() {
    let always = Window {
        schedule: Cron::parse("* * * * *").unwrap(),
        duration: Duration::from_secs(3600),
    };
    let settings = ScaleInSettings {
        budgets: vec![Budget {
            window: Some(always),
            ..Budget::always("frozen", Nodes::Count(0))
        }],
        ..fast_settings()
    };
    let w = World::builder()
        .web_hooked(3, 2, 2)
        .settings(settings)
        .build()
        .await;
    let lifecycle = ca_asg_provider::scalein::sources::hook_scan::spawn_loop(
        w.engine.clone(),
        w.provider.clone(),
    );
    let ended = w.cloud.external_scale_in("web", 1).unwrap();
    let iid = ended[0].clone();
    action_completed(&w, &iid, 20).await;
    lifecycle.abort();
    assert!(
        events(&w.sim)
            .iter()
            .any(|(r, n)| r == "DrainForcedPastBudget" && n.contains("\"frozen\"")),
        "{:?}",
        events(&w.sim)
    );
    assert!(w.cloud.hook_timeouts().is_empty(), "no hold timed out");
}

/// Issue 71, `waitForReplacement` (a group override here): an instance of `web`
/// ended without a decrement (a person, an instance refresh) is held by our hook,
/// its node cordoned, and nothing is evicted while the group's replacement cannot
/// launch; once the replacement is InService the drain runs and the action is
/// completed.
#[tokio::test]
async fn a_drain_waits_for_its_groups_replacement_before_it_evicts() {
    use ca_asg_provider::cloud::Cloud;
    use ca_asg_provider::scalein::settings::GroupOverride;
    let settings = ScaleInSettings {
        group_overrides: vec![GroupOverride {
            groups: Groups::Named(["web".to_string()].into()),
            workload_deadline: None,
            workload_deadline_policy: None,
            wait_for_replacement: Some(true),
            deregister: None,
        }],
        ..fast_settings()
    };
    let w = World::builder()
        .web_hooked(3, 2, 30)
        .settings(settings)
        .build()
        .await;
    let (node, iid) = nodes_of(&w, "web").remove(0);
    w.put(&fixtures::pod("shop", "app", &node, "app", 0.1));
    pod_ready(&w, "app").await;
    let lifecycle = ca_asg_provider::scalein::sources::hook_scan::spawn_loop(
        w.engine.clone(),
        w.provider.clone(),
    );
    w.cloud
        .fail_launches("web", Some("InsufficientInstanceCapacity"));
    w.cloud.terminate_instance(&iid, false).await.unwrap();

    eventually("the drain says it waits for the replacement", 20, || {
        waiting_events(&w)
            .iter()
            .any(|n| n.contains("\"waitForReplacement\"") && n.contains("1 of its desired 2"))
    })
    .await;
    assert!(cordoned(&w, &node), "cordoned while it waits");
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert_eq!(
        evictions_of(&w, "app"),
        0,
        "nothing evicted before the replacement"
    );
    assert!(w.cloud.completed_actions().is_empty());

    w.cloud.fail_launches("web", None);
    action_completed(&w, &iid, 30).await;
    lifecycle.abort();
    assert_eq!(
        evictions_of(&w, "app"),
        1,
        "drained once the replacement was up"
    );
    let in_service = w
        .cloud
        .instances()
        .into_iter()
        .filter(|(g, i)| {
            g == "web"
                && i.id != iid
                && i.state == ca_asg_provider::cloud::LifecycleState::InService
        })
        .count();
    assert_eq!(in_service, 2, "the replacement is up");
    assert_eq!(
        waiting_events(&w)
            .iter()
            .filter(|n| n.contains("waitForReplacement"))
            .count(),
        1,
        "said once"
    );
}

/// Cordons first: an instance refresh ends three instances at once and the scan
/// finds their holds together; the budget lets one drain at a time. One Node's
/// cordon is slow (its patch waits 2 s, a webhook slow for that Node): the drain
/// given the slot evicts nothing until that node is cordoned too, so nothing it
/// evicts can be placed on a node about to drain. (On the real control plane a
/// replacement landed on a node whose cordon came a moment after the first
/// eviction.)
#[tokio::test]
async fn drains_asked_together_cordon_every_node_before_the_first_eviction() {
    use ca_asg_provider::cloud::Cloud;
    let settings = ScaleInSettings {
        budgets: vec![Budget::always("one-at-a-time", Nodes::Count(1))],
        ..fast_settings()
    };
    let w = World::builder()
        .web_hooked(4, 3, 300)
        .settings(settings)
        .build()
        .await;
    let refreshed = nodes_of(&w, "web");
    assert_eq!(refreshed.len(), 3);
    for (i, (node, _)) in refreshed.iter().enumerate() {
        w.put(&fixtures::pod("shop", &format!("app{i}"), node, "app", 0.1));
        pod_ready(&w, &format!("app{i}")).await;
    }
    let slow = refreshed[2].0.clone();
    w.sim
        .slow_requests_to("patch", "nodes", &slow, Duration::from_secs(2));
    for (_, iid) in &refreshed {
        w.cloud.terminate_instance(iid, false).await.unwrap();
    }
    let lifecycle = ca_asg_provider::scalein::sources::hook_scan::spawn_loop(
        w.engine.clone(),
        w.provider.clone(),
    );
    for (_, iid) in &refreshed {
        action_completed(&w, iid, 30).await;
    }
    lifecycle.abort();

    let audit = w.sim.audit();
    let first_eviction = audit
        .iter()
        .find(|a| a.verb == "evicted")
        .map(|a| a.seq)
        .expect("the drains evicted the app pods");
    for (node, _) in &refreshed {
        let cordon = audit
            .iter()
            .find(|a| a.verb == "patch" && a.kind == "Node" && a.name == *node)
            .map(|a| a.seq)
            .unwrap_or_else(|| panic!("node {node} was never marked"));
        assert!(
            cordon < first_eviction,
            "node {node} was cordoned (audit {cordon}) after the first eviction (audit {first_eviction}); the slow one is {slow}"
        );
    }
    assert_eq!(evictions_of(&w, "app"), 3, "each app pod evicted once");
}

/// Issue 71: the group's own cause, from its scaling activity. A budget that allows
/// no instance refresh (`reasons: [asg-instance-refresh]`, `nodes: 0`) holds the
/// refresh's drain (its activity: "... in response to an instance refresh"), while
/// the group's scaling-policy scale-in ("... a difference between desired and actual
/// capacity") and a person's TerminateInstanceInAutoScalingGroup ("... a user
/// request") drain at once. When the activities cannot be read, a scale-in counts
/// under every `asg-*` cause, so the refresh budget holds it too (fail closed).
#[tokio::test]
async fn a_budget_for_instance_refreshes_holds_only_the_refresh() {
    use ca_asg_provider::cloud::Cloud;
    let settings = ScaleInSettings {
        budgets: vec![Budget {
            causes: Some([Cause::AsgInstanceRefresh].into()),
            ..Budget::always("no-refresh", Nodes::Count(0))
        }],
        ..fast_settings()
    };
    let w = World::builder()
        .web_hooked(6, 3, 300)
        .settings(settings.clone())
        .build()
        .await;
    let nodes = nodes_of(&w, "web");
    // First, while every instance has a Node (replacements launched later have none).
    let scaled = w.cloud.external_scale_in("web", 1).unwrap()[0].clone();
    let mut others = nodes.iter().filter(|(_, i)| *i != scaled).cloned();
    let (refreshed_node, refreshed) = others.next().expect("a second node");
    let (_, person) = others.next().expect("a third node");
    w.cloud.terminate_instance(&refreshed, false).await.unwrap();
    w.cloud.set_termination_cause(
        &refreshed,
        "At 2026-11-28T10:00:00Z an instance was taken out of service in response to an instance refresh.",
    );
    w.cloud.terminate_instance(&person, false).await.unwrap();
    let lifecycle = ca_asg_provider::scalein::sources::hook_scan::spawn_loop(
        w.engine.clone(),
        w.provider.clone(),
    );
    action_completed(&w, &person, 20).await;
    action_completed(&w, &scaled, 20).await;
    eventually("the refresh's drain waits, told why", 10, || {
        waiting_events(&w)
            .iter()
            .any(|n| n.contains("\"no-refresh\""))
    })
    .await;
    assert!(cordoned(&w, &refreshed_node));
    assert!(
        !w.cloud
            .completed_actions()
            .iter()
            .any(|(a, _)| a.instance_id == refreshed),
        "the refresh's action was completed past its budget"
    );
    assert!(
        w.cloud.calls()["termination_cause"] >= 3,
        "{:?}",
        w.cloud.calls()
    );
    lifecycle.abort();

    // The activities cannot be read: a person's terminate waits under the refresh
    // budget too.
    let w = World::builder()
        .web_hooked(6, 3, 300)
        .settings(settings)
        .build()
        .await;
    let (node, iid) = nodes_of(&w, "web")[0].clone();
    w.cloud.throttle("termination_cause", 1_000);
    w.cloud.terminate_instance(&iid, false).await.unwrap();
    let lifecycle = ca_asg_provider::scalein::sources::hook_scan::spawn_loop(
        w.engine.clone(),
        w.provider.clone(),
    );
    eventually(
        "the unread scale-in waits under every asg cause",
        10,
        || {
            waiting_events(&w)
                .iter()
                .any(|n| n.contains("\"no-refresh\""))
        },
    )
    .await;
    assert!(cordoned(&w, &node));
    assert!(w.cloud.completed_actions().is_empty());
    lifecycle.abort();
}

/// Issue 71: a rate goes on counting across a leader change. Replica A leads
/// through the Lease and starts one drain under a rate of one start an hour; its
/// renewals carry that start on the Lease. A dies (no release); B, a new process,
/// takes the Lease over, reads the start back, and holds the next drain for the
/// rate instead of counting afresh.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_goes_on_counting_across_a_leader_change() {
    use ca_asg_provider::scalein::decide::budget::{carried, Rate};
    use k8s_openapi::api::coordination::v1::Lease;
    let settings = ScaleInSettings {
        budgets: vec![Budget {
            rate: Some(Rate {
                starts: 1,
                per: Duration::from_secs(3600),
            }),
            ..Budget::always("one-an-hour", Nodes::Count(100))
        }],
        ..fast_settings()
    };
    let mut w = World::builder()
        .web(4, 3)
        .settings(settings.clone())
        .build()
        .await;
    let a = w.engine.lead_as(lease("replica-a"));
    eventually("replica A leads", 10, || w.engine.leadership.leads()).await;
    let nodes = nodes_of(&w, "web");
    delete_nodes(&mut w, "web", &[nodes[0].clone()]).await;
    assert_eq!(w.engine.wait_for(&nodes[0].1).await, Some(Outcome::Ended));
    let carried_on_lease = |w: &World| {
        w.sim
            .get::<Lease>("kube-system", "ca-asg-provider")
            .and_then(|l| {
                l["metadata"]["annotations"][carried::ANNOTATION]
                    .as_str()
                    .map(str::to_string)
            })
    };
    eventually("the Lease carries the start", 10, || {
        carried_on_lease(&w).is_some_and(|t| t.starts_with("{\"one-an-hour\":[") && t.len() > 20)
    })
    .await;

    let _b = b_takes_over(a, &mut w, settings).await;
    delete_nodes(&mut w, "web", &[nodes[1].clone()]).await;
    eventually("the next drain waits for the rate", 10, || {
        waiting_events(&w)
            .iter()
            .any(|n| n.contains("\"one-an-hour\"") && n.contains("its rate is used up"))
    })
    .await;
    assert!(
        in_service(&w.cloud, &nodes[1].1),
        "B started a second drain within the hour"
    );
    w.engine.shutdown();
}

/// Issue 71: CA's scale-in through our hook (lifecycle mode) stays CA's after a leader
/// change. Replica A answers CA's DeleteNodes (TerminateInstanceInAutoScalingGroup, our
/// hook holds the instance) and starts the drain, whose record on the Node says CA
/// asked; A dies mid-drain. B finds the hold by its lifecycle scan (as the group's own,
/// "a user request" to AWS) and resumes the drain: a budget that freezes a person's
/// terminates (`asg-person`, `nodes: 0`) does not hold it, as it never held it in A.
/// Before, B read it as the group's own and held it until the hook forced it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ca_scale_in_through_the_hook_stays_cas_after_a_leader_change() {
    use ca_asg_provider::scalein::decide::record::ANNOTATION;
    let settings = ScaleInSettings {
        budgets: vec![Budget {
            causes: Some([Cause::AsgPerson].into()),
            ..Budget::always("no-person", Nodes::Count(0))
        }],
        ..fast_settings()
    };
    let mut w = World::builder()
        .web_hooked(4, 3, 300)
        .settings(settings.clone())
        .build()
        .await;
    let a = w.engine.lead_as(lease("replica-a"));
    eventually("replica A leads", 10, || w.engine.leadership.leads()).await;
    let (node, iid) = nodes_of(&w, "web")[0].clone();
    // The app's preStop (3 s) keeps the drain running when A dies.
    fluentd_and_an_app_on_each(&w, &[(node.clone(), iid.clone())], 0.1, 3.0);
    w.cloud.set_termination_cause(
        &iid,
        "At 2026-11-28T10:00:00Z an instance was taken out of service in response to a user request, shrinking the capacity from 3 to 2.",
    );
    delete_nodes(&mut w, "web", &[(node.clone(), iid.clone())]).await;
    let says_ca = |w: &World| {
        w.sim.get::<Node>("", &node).is_some_and(|n| {
            n["metadata"]["annotations"][ANNOTATION]
                .as_str()
                .is_some_and(|r| r.contains("\"by_ca\":true"))
        })
    };
    eventually("A's drain records that CA asked", 10, || says_ca(&w)).await;
    assert!(
        !w.cloud
            .completed_actions()
            .iter()
            .any(|(a, _)| a.instance_id == iid),
        "A's drain ended before A died: nothing is left to resume"
    );

    let _b = b_takes_over(a, &mut w, settings).await;
    let lifecycle = ca_asg_provider::scalein::sources::hook_scan::spawn_loop(
        w.engine.clone(),
        w.provider.clone(),
    );
    action_completed(&w, &iid, 30).await;
    assert!(
        !waiting_events(&w)
            .iter()
            .any(|n| n.contains("\"no-person\"")),
        "B held CA's scale-in under the budget for a person's terminates: {:?}",
        waiting_events(&w)
    );
    assert!(says_ca(&w) || w.sim.get::<Node>("", &node).is_none());
    lifecycle.abort();
    w.engine.shutdown();
}

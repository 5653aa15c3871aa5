//! The memory cloud's fault knobs: stale reads, slow answers, action tokens, hook
//! timeout changes, and the desired-capacity log.

use std::time::Duration;

use super::*;

fn cloud() -> MemoryCloud {
    MemoryCloud::new(
        vec![MemoryGroup::new("web", 0, 4, 2, "m5.large").terminating_hook("h", 60)],
        MemoryTiming {
            launch_delay: Duration::ZERO,
            terminate_delay: Duration::from_millis(10),
            hook_delay: Duration::ZERO,
        },
    )
}

fn action(id: &str, token: Option<String>) -> LifecycleAction {
    LifecycleAction {
        group: "web".into(),
        hook: "h".into(),
        instance_id: id.into(),
        token,
    }
}

fn web(c: &MemoryCloud) -> Vec<String> {
    c.instances().into_iter().map(|(_, i)| i.id).collect()
}

#[tokio::test]
async fn stale_reads_answer_the_state_of_when_they_were_asked_for() {
    let c = cloud();
    let ids = web(&c);
    c.stale_reads(2);
    c.terminate_instance(&ids[0], true).await.unwrap();
    let sel = GroupSelector {
        names: vec!["web".into()],
        tag_sets: vec![],
    };
    let old = c.describe_groups(&sel).await.unwrap();
    assert_eq!(old[0].desired_capacity, 2, "the state before the terminate");
    let loc = c.locate_instances(&ids[..1]).await.unwrap();
    assert_eq!(loc[0].state, LifecycleState::InService);
    let now = c.locate_instances(&ids[..1]).await.unwrap();
    assert_eq!(now[0].state, LifecycleState::TerminatingWait, "fresh again");
    assert_eq!(
        c.describe_groups(&sel).await.unwrap()[0].desired_capacity,
        1
    );
}

#[tokio::test]
async fn a_wrong_token_is_refused_and_the_instance_id_alone_is_taken() {
    let c = cloud();
    c.check_tokens(true);
    let ids = web(&c);
    c.terminate_instance(&ids[0], true).await.unwrap();
    let token = c
        .action_token(&ids[0], "h")
        .expect("a waiting action has a token");
    let forged = action(&ids[0], Some("87654321-4321-4321-4321-210987654321".into()));
    let e = c.lifecycle_heartbeat(&forged).await.unwrap_err();
    assert!(
        e.to_string()
            .contains("No active Lifecycle Action found with token"),
        "{e}"
    );
    let e = c
        .complete_lifecycle_action(&forged, LifecycleResult::Continue)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("with token"), "{e}");
    c.lifecycle_heartbeat(&action(&ids[0], None)).await.unwrap();
    c.lifecycle_heartbeat(&action(&ids[0], Some(token.clone())))
        .await
        .unwrap();
    c.complete_lifecycle_action(&action(&ids[0], Some(token)), LifecycleResult::Continue)
        .await
        .unwrap();
    // Without the check (the default) any token is taken, as before.
    let c = cloud();
    let ids = web(&c);
    c.terminate_instance(&ids[1], true).await.unwrap();
    c.lifecycle_heartbeat(&action(&ids[1], Some("x".into())))
        .await
        .unwrap();
}

#[tokio::test]
async fn a_changed_heartbeat_timeout_counts_from_the_next_heartbeat() {
    let c = cloud();
    let ids = web(&c);
    c.terminate_instance(&ids[0], true).await.unwrap();
    c.set_heartbeat_timeout("web", "h", 1);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert!(c.hook_timeouts().is_empty(), "the running deadline is kept");
    c.lifecycle_heartbeat(&action(&ids[0], None)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(c.hook_timeouts(), vec![ids[0].clone()]);
}

#[tokio::test]
async fn a_slow_answer_comes_after_the_call_took_effect() {
    let c = cloud();
    let ids = web(&c);
    c.slow_answers(Duration::from_secs(60));
    let call = {
        let c = c.clone();
        let id = ids[0].clone();
        tokio::spawn(async move { c.terminate_instance(&id, true).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    call.abort();
    assert_eq!(
        c.desired("web"),
        Some(1),
        "done, though the caller never heard"
    );
    c.heal();
    c.terminate_instance(&ids[1], true).await.unwrap();
}

#[tokio::test]
async fn every_desired_capacity_change_is_logged_with_its_cause() {
    let c = cloud();
    let ids = web(&c);
    c.terminate_instance(&ids[0], true).await.unwrap();
    c.terminate_instance(&ids[0], true).await.unwrap();
    c.set_desired_capacity("web", 3).await.unwrap();
    c.external_scale_in("web", 1).unwrap();
    c.terminate_instance(&ids[1], false).await.unwrap();
    let log: Vec<(i32, i32, DesiredBy)> = c
        .desired_log()
        .into_iter()
        .map(|d| (d.from, d.to, d.by))
        .collect();
    assert_eq!(
        log,
        vec![
            (
                2,
                1,
                DesiredBy::Terminate {
                    instance: ids[0].clone()
                }
            ),
            (1, 3, DesiredBy::SetDesired),
            (3, 2, DesiredBy::External),
        ],
        "a second terminate of a terminating instance lowers nothing"
    );
}

#[tokio::test]
async fn a_replaced_instance_waits_for_the_hook_with_its_cause_and_no_decrement() {
    let c = cloud();
    let ids = web(&c);
    let cause = "At 2026-11-29T04:00:00Z an instance was taken out of service in response to an instance refresh.";
    c.throttle("terminate_instance", 1);
    assert!(c.replace_instance(&ids[0], cause), "no API fault applies");
    assert!(!c.replace_instance("i-nope", cause));
    let loc = c.locate_instances(&ids[..1]).await.unwrap();
    assert_eq!(loc[0].state, LifecycleState::TerminatingWait);
    assert_eq!(c.pending_hooks(&ids[0]), vec!["h".to_string()]);
    assert_eq!(
        c.termination_cause("web", &ids[0])
            .await
            .unwrap()
            .as_deref(),
        Some(cause)
    );
    assert!(
        !c.replace_instance(&ids[0], "again"),
        "only an instance in service"
    );
    assert_eq!(c.desired("web"), Some(2), "no decrement");
    assert!(c.desired_log().is_empty());
    c.complete_lifecycle_action(&action(&ids[0], None), LifecycleResult::Continue)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let serving: Vec<String> = c
        .instances()
        .into_iter()
        .filter(|(_, i)| !i.state.is_terminating())
        .map(|(_, i)| i.id)
        .collect();
    assert!(!serving.contains(&ids[0]), "ended: {:?}", c.instances());
    assert_eq!(serving.len(), 2, "a replacement launched: {serving:?}");
}

#[tokio::test]
async fn an_instance_going_back_into_the_warm_pool_is_held_with_a_token() {
    let c = MemoryCloud::new(
        vec![MemoryGroup::new("web", 0, 4, 2, "m5.large")
            .terminating_hook("h", 60)
            .warm_pool(WarmPool {
                min_size: 0,
                max_prepared: None,
                pool_state: "Stopped".into(),
                reuse_on_scale_in: true,
            })],
        MemoryTiming {
            launch_delay: Duration::ZERO,
            terminate_delay: Duration::from_millis(10),
            hook_delay: Duration::ZERO,
        },
    );
    c.check_tokens(true);
    let ended = c.external_scale_in("web", 1).unwrap();
    let iid = &ended[0];
    assert_eq!(
        c.pooled()
            .iter()
            .map(|(_, i)| (i.id.as_str(), i.state.as_str()))
            .collect::<Vec<_>>(),
        vec![(iid.as_str(), "Warmed:Pending:Wait")]
    );
    assert_eq!(c.pending_hooks(iid), vec!["h".to_string()]);
    let token = c
        .action_token(iid, "h")
        .expect("the pool-bound wait has its token, as the hook's notification carries it");
    c.complete_lifecycle_action(&action(iid, Some(token)), LifecycleResult::Continue)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(c.pending_hooks(iid).is_empty());
    assert!(
        c.pooled()
            .iter()
            .any(|(_, i)| i.id == *iid && i.state.as_str() == "Warmed:Stopped"),
        "at rest in the pool: {:?}",
        c.pooled()
    );
}

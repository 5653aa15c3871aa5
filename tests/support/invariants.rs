//! The drain models' shared world of pods and the promises checked on it after every
//! step, each failure naming what each process did to the pod it is about
//! ([`super::acting::Processes::who_touched`]).

use std::collections::BTreeSet;

use ca_asg_provider::sim::{fixtures, AuditEntry};
use k8s_openapi::api::core::v1::Pod;

use super::world::{pods_ready, World};

/// On node `i` of `nodes`: the workload pod `app-{i}` (preStop 0.2 s; app `guarded`
/// on node `guarded`, whose budget allows nothing, app `app` elsewhere) beside a pod
/// of the fluentd-like DaemonSet (preStop 0.1 s). Waits until every pod is Ready and
/// returns, per node, its workload pod and its DaemonSet pod.
pub async fn apps_under_fluentd(
    w: &World,
    nodes: &[&str],
    guarded: usize,
) -> Vec<(String, String)> {
    w.sim
        .create(&fixtures::daemonset("logging", "fluentd", 0.1, false))
        .unwrap();
    for (i, node) in nodes.iter().enumerate() {
        let app = if i == guarded { "guarded" } else { "app" };
        w.sim
            .create(&fixtures::pod("shop", &format!("app-{i}"), node, app, 0.2))
            .unwrap();
    }
    w.sim.create(&fixtures::pdb("shop", "guarded", 0)).unwrap();
    pods_ready(w, 2 * nodes.len()).await;
    app_and_fluentd_on_each(w, nodes)
}

/// For each of `nodes`, its app pod `app-{i}` and the fluentd pod on it.
pub fn app_and_fluentd_on_each(w: &World, nodes: &[&str]) -> Vec<(String, String)> {
    let listed = w.sim.list::<Pod>();
    nodes
        .iter()
        .enumerate()
        .map(|(i, node)| {
            let ds = listed
                .iter()
                .find(|p| {
                    p["spec"]["nodeName"] == *node
                        && p["metadata"]["name"]
                            .as_str()
                            .is_some_and(|n| n.starts_with("fluentd"))
                })
                .and_then(|p| p["metadata"]["name"].as_str())
                .expect("fluentd on every node")
                .to_string();
            (format!("app-{i}"), ds)
        })
        .collect()
}

/// No pod evicted twice, none deleted twice, and every workload pod (`app-*`) that
/// started leaving was evicted: none was deleted around its PodDisruptionBudget.
/// Returns the pods that started leaving.
pub fn assert_workloads_evicted_once(
    audit: &[AuditEntry],
    who: impl Fn(&str) -> Vec<String>,
) -> BTreeSet<String> {
    super::world::assert_no_pod_evicted_twice_naming(audit, &who);
    let evicted: BTreeSet<&str> = audit
        .iter()
        .filter(|e| e.kind == "Pod" && e.verb == "evicted")
        .map(|e| e.name.as_str())
        .collect();
    let mut started = BTreeSet::new();
    for e in audit
        .iter()
        .filter(|e| e.kind == "Pod" && e.verb == "deletion-started")
    {
        assert!(
            started.insert(e.name.clone()),
            "{} was deleted twice: {:#?}",
            e.name,
            who(&e.name)
        );
        if e.name.starts_with("app-") {
            assert!(
                evicted.contains(e.name.as_str()),
                "{} was deleted, not evicted: around its PodDisruptionBudget: {:#?}",
                e.name,
                who(&e.name)
            );
        }
    }
    started
}

/// DaemonSet pods last: on every node of `pods` (its workload pod, its DaemonSet
/// pod), the DaemonSet pod starts leaving only once the workload pod is gone.
pub fn assert_daemonsets_last(
    audit: &[AuditEntry],
    pods: &[(String, String)],
    who: impl Fn(&str) -> Vec<String>,
) {
    let at = |verb: &str, name: &str| {
        audit
            .iter()
            .position(|e| e.kind == "Pod" && e.verb == verb && e.name == name)
    };
    for (app, ds) in pods {
        if let Some(ds_leaves) = at("deletion-started", ds) {
            let app_gone = at("removed", app);
            assert!(
                app_gone.is_some_and(|g| g < ds_leaves),
                "{ds} started leaving (audit {ds_leaves}) while {app} was there ({app_gone:?}): {:#?}",
                who(ds)
            );
        }
    }
}

/// The engine's one record of each instance holds together after every step: no
/// story with a fault ([`InstanceStory::faults`]: a slot held by no running drain, or
/// by a replaced run; reasons kept for no drain), and no budget of a count in force
/// (`maxConcurrentDrains` among them) with more of the drains it governs in a slot
/// than its nodes, those started past it aside (one our hook holds, started to finish
/// inside the hook's global timeout; exempt drains it never governs). Fails naming
/// the budget or the instance and its story.
///
/// [`InstanceStory::faults`]: ca_asg_provider::scalein::decide::story::InstanceStory::faults
pub fn assert_stories_hold(engine: &ca_asg_provider::scalein::Engine) {
    let stories = engine.book.stories();
    for (id, story) in &stories {
        let faults = story.faults();
        assert!(
            faults.is_empty(),
            "the engine's record of {id} does not hold together: {faults:?}; {story:#?}"
        );
    }
    // Every budget of a count in force (maxConcurrentDrains among them): the drains
    // it governs that hold a slot, those started past it aside, are never more than
    // its nodes: each started while the drains it counts were fewer.
    let holders = engine.book.slot_holders();
    let now = ca_asg_provider::clock::utc_now();
    for b in engine.settings().budgets_in_order() {
        let ca_asg_provider::scalein::decide::budget::Nodes::Count(allowed) = b.nodes else {
            continue;
        };
        if b.in_force(now).is_none() {
            continue;
        }
        let governed: Vec<&str> = holders
            .iter()
            .filter(|p| !p.forced && b.governs(&p.drain()))
            .map(|p| p.group.as_str())
            .collect();
        assert!(
            governed.len() <= allowed as usize,
            "{} drains budget {:?} governs hold a slot, it allows {allowed}: {governed:?}; {stories:#?}",
            governed.len(),
            b.name
        );
    }
}

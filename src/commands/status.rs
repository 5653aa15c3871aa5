//! `ca-asg-provider status [-o table|json] [--watch [--interval 2s]]`: the drains in
//! progress (with `--watch`, again every interval until Ctrl-C), read from the
//! Nodes' drain records and the cluster. Read-only: it lists Nodes, the Pods on each
//! draining Node and the PodDisruptionBudgets, and writes nothing (get/list only,
//! which the service's own ClusterRole grants).
//!
//! Each Node's record is read with the drain's own reader
//! ([`DrainRecord::read`]); a Node without one is not listed, and a record that does
//! not read is listed as unreadable, naming its annotation. The deadline is the one
//! the drain computes from the record and the scale-in settings of the configuration
//! given (`--config`, as `serve` takes it; the defaults without one).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use chrono::{DateTime, Utc};
use clap::Args;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, ListParams};

use crate::config::ConfigArgs;
use crate::scalein::decide::record::{DrainRecord, Limits};
use crate::scalein::kube::user_agent;
pub use crate::scalein::progress::{rows, Blocker, Phase, Row};

/// What `status` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    /// A table with a header, one drain a line.
    Table,
    /// A JSON array of objects, one per drain (fields in docs/operations.md).
    Json,
}

#[derive(Debug, Args, Clone)]
pub struct StatusArgs {
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value = "table")]
    pub output: Output,
    /// The service's configuration file, for the workload deadline and its policy
    /// (the defaults without one).
    #[arg(long, short = 'c', env = "CA_ASG_PROVIDER_CONFIG")]
    pub config: Option<PathBuf>,
    /// Print the drains again every `--interval`, until Ctrl-C.
    #[arg(long, short = 'w')]
    pub watch: bool,
    /// How often `--watch` prints (`2s`, `1m`).
    #[arg(long, default_value = "2s", value_parser = crate::duration::parse_duration, requires = "watch")]
    pub interval: Duration,
}

/// Shortest `--interval`: the API server is listed once per round.
pub const MIN_INTERVAL: Duration = Duration::from_secs(1);

/// The rows as a table with a header, or the sentence that says there is no drain.
pub fn table(rows: &[Row]) -> String {
    if rows.is_empty() {
        return "no drains in progress\n".to_string();
    }
    let header = [
        "NODE",
        "GROUP",
        "REASONS",
        "PHASE",
        "ELAPSED",
        "BLOCKED BY",
        "DEADLINE",
        "POLICY",
    ];
    let lines: Vec<[String; 8]> = rows
        .iter()
        .map(|r| {
            let phase = match (r.unreadable, &r.ended) {
                (Some(a), _) => format!("{} ({a})", r.phase.as_str()),
                (None, Some(how)) => format!("{} ({how})", r.phase.as_str()),
                (None, None) => r.phase.as_str().to_string(),
            };
            [
                r.node.clone(),
                dash(r.group.clone()),
                dash((!r.reasons.is_empty()).then(|| r.reasons.join(", "))),
                phase,
                dash(
                    r.elapsed_seconds
                        .map(|s| crate::duration::format_duration(Duration::from_secs(s))),
                ),
                dash(
                    // Waiting for a disruption budget, nothing is evicted yet: the
                    // budget holds it, not its pods.
                    r.waiting_for_budget()
                        .map(str::to_string)
                        .or_else(|| (!r.blocked_by.is_empty()).then(|| blockers(&r.blocked_by)))
                        .or_else(|| r.load_balancers.clone()),
                ),
                dash(
                    r.deadline
                        .map(|d| d.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)),
                ),
                dash(r.deadline_policy.map(str::to_string)),
            ]
        })
        .collect();
    let mut widths = header.map(str::len);
    for l in &lines {
        for (w, c) in widths.iter_mut().zip(l) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    let mut push = |cells: &[String]| {
        let last = cells.len() - 1;
        for (i, c) in cells.iter().enumerate() {
            if i == last {
                out.push_str(c);
            } else {
                out.push_str(&format!("{c:<w$}  ", w = widths[i]));
            }
        }
        out.push('\n');
    };
    push(&header.map(str::to_string));
    for l in &lines {
        push(l);
    }
    out
}

fn dash(v: Option<String>) -> String {
    v.unwrap_or_else(|| "-".to_string())
}

/// `ns/pod (budget, budget); ns/pod`, a budget that can never allow the eviction
/// marked `never allows` (the JSON says why), a pod already deleted as
/// `ns/pod (terminating, 12s of its 30s grace left)`.
fn blockers(b: &[Blocker]) -> String {
    b.iter()
        .map(|b| {
            let never = if b.never.is_some() {
                ", never allows"
            } else {
                ""
            };
            if let Some(t) = &b.terminating {
                format!("{} ({})", b.pod, t.said())
            } else if b.budgets.is_empty() {
                b.pod.clone()
            } else {
                format!("{} ({}{never})", b.pod, b.budgets.join(", "))
            }
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// The rows as a JSON array (an empty array when there is no drain).
pub fn json(rows: &[Row]) -> String {
    let mut s = serde_json::to_string_pretty(rows).expect("status rows serialize");
    s.push('\n');
    s
}

/// Reads the cluster through `client` and renders the drains at `now`. Lists only:
/// the Nodes, the Pods on each draining Node, and the budgets when a pod is left.
pub async fn report(
    client: kube::Client,
    limits: Limits,
    output: Output,
    now: DateTime<Utc>,
) -> anyhow::Result<String> {
    let reach = |e: kube::Error| {
        anyhow::anyhow!("cannot read the cluster from the Kubernetes API server: {e}")
    };
    let nodes = Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(reach)?
        .items;
    let mut pods = Vec::new();
    for n in nodes.iter().filter(|n| {
        n.metadata
            .annotations
            .as_ref()
            .and_then(|a| DrainRecord::read(a, now))
            .is_some_and(|r| r.drain_began().is_some())
    }) {
        let name = n.metadata.name.as_deref().unwrap_or_default();
        pods.extend(
            crate::scalein::kube::nodes::pods_on(&client, name)
                .await
                .map_err(reach)?,
        );
    }
    let pdbs = if pods.is_empty() {
        Vec::new()
    } else {
        Api::<PodDisruptionBudget>::all(client)
            .list(&ListParams::default())
            .await
            .map_err(reach)?
            .items
    };
    let rows = rows(&nodes, &pods, &pdbs, limits, now);
    Ok(match output {
        Output::Table => table(&rows),
        Output::Json => json(&rows),
    })
}

/// `status --watch`: every `every`, the drains at `now()` as [`report`] renders them,
/// each round given to `out` (a table under an `every 2s, at ...` line; a JSON array
/// each round, a stream `jq` reads). A round whose read fails says so and the next
/// one reads again. Ends after `rounds` rounds when given (tests), else never: the
/// caller stops it (Ctrl-C).
pub async fn watch(
    client: kube::Client,
    limits: Limits,
    output: Output,
    every: Duration,
    rounds: Option<u64>,
    now: impl Fn() -> DateTime<Utc>,
    mut out: impl FnMut(&str),
) {
    let mut tick = tokio::time::interval(every.max(MIN_INTERVAL));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut done = 0;
    while rounds.is_none_or(|r| done < r) {
        tick.tick().await;
        let at = now();
        let stamp = at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
        let every = crate::duration::format_duration(every.max(MIN_INTERVAL));
        match (report(client.clone(), limits, output, at).await, output) {
            (Ok(text), Output::Table) => out(&format!("every {every}, at {stamp}:\n{text}\n")),
            (Ok(text), Output::Json) => out(&text),
            (Err(e), _) => out(&format!("every {every}, at {stamp}: error: {e:#}\n\n")),
        }
        done += 1;
    }
}

/// Exit 0 with the drains listed (also when there are none; with `--watch`, when
/// stopped by Ctrl-C or SIGTERM), 1 when the cluster cannot be read, 2 when the
/// configuration is invalid.
pub async fn run(args: StatusArgs) -> ExitCode {
    let cfg = match ConfigArgs::load_file(args.config.as_ref()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let limits = cfg.scale_in.limits();
    if args.watch && args.interval < MIN_INTERVAL {
        eprintln!(
            "error: --interval {}: at least {} (each round lists the cluster's Nodes)",
            crate::duration::format_duration(args.interval),
            crate::duration::format_duration(MIN_INTERVAL)
        );
        return ExitCode::from(2);
    }
    let client = match user_agent::client_for(user_agent::STATUS).await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    if args.watch {
        let print = |text: &str| {
            use std::io::Write;
            let mut o = std::io::stdout().lock();
            let _ = o.write_all(text.as_bytes()).and_then(|()| o.flush());
        };
        let rounds = watch(
            client,
            limits,
            args.output,
            args.interval,
            None,
            crate::clock::utc_now,
            print,
        );
        tokio::select! {
            () = rounds => {}
            () = super::shutdown_signal() => {}
        }
        return ExitCode::SUCCESS;
    }
    match report(client, limits, args.output, crate::clock::utc_now()).await {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scalein::decide::record;
    use crate::scalein::decide::record::{DrainReason, Why};
    use crate::scalein::DeadlinePolicy;
    use k8s_openapi::api::core::v1::Pod;
    use k8s_openapi::api::policy::v1::{PodDisruptionBudgetSpec, PodDisruptionBudgetStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, OwnerReference};
    use kube::api::ObjectMeta;
    use std::collections::BTreeMap;

    fn at(s: &str) -> DateTime<Utc> {
        s.parse().unwrap()
    }

    const NOW: &str = "2026-11-27T07:10:00Z";

    fn limits() -> Limits {
        Limits {
            workload_deadline: Duration::from_secs(600),
            workload_policy: DeadlinePolicy::Abandon,
            hook_room: None,
        }
    }

    fn map(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn node(name: &str, annotations: &[(&str, &str)]) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                annotations: Some(map(annotations)),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn recorded(name: &str, group: &str, rec: &DrainRecord) -> Node {
        node(
            name,
            &[
                (record::ANNOTATION, &rec.to_json()),
                (record::GROUP_ANNOTATION, group),
            ],
        )
    }

    fn pod(ns: &str, name: &str, node: &str, app: &str, daemonset: bool) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some(ns.into()),
                labels: Some(map(&[("app", app)])),
                owner_references: daemonset.then(|| {
                    vec![OwnerReference {
                        kind: "DaemonSet".into(),
                        name: app.into(),
                        controller: Some(true),
                        ..Default::default()
                    }]
                }),
                ..Default::default()
            },
            spec: Some(k8s_openapi::api::core::v1::PodSpec {
                node_name: Some(node.into()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn pdb(ns: &str, name: &str, app: &str, allowed: i32) -> PodDisruptionBudget {
        PodDisruptionBudget {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some(ns.into()),
                generation: Some(1),
                ..Default::default()
            },
            spec: Some(PodDisruptionBudgetSpec {
                selector: Some(LabelSelector {
                    match_labels: Some(map(&[("app", app)])),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            status: Some(PodDisruptionBudgetStatus {
                disruptions_allowed: allowed,
                observed_generation: Some(1),
                ..Default::default()
            }),
        }
    }

    /// Issue 72: a budget that can never allow the pod's eviction is said as such,
    /// and the Node's drain condition is read where it is present.
    #[test]
    fn a_budget_that_never_allows_and_the_nodes_condition_are_shown() {
        let rec = DrainRecord {
            reasons: vec![DrainReason::new(Why::ScaleIn, at("2026-11-27T07:05:30Z"))],
            ..DrainRecord::default()
        };
        let mut n1 = recorded("n1", "web", &rec);
        n1.status.get_or_insert_with(Default::default).conditions =
            Some(vec![k8s_openapi::api::core::v1::NodeCondition {
                type_: "DrainInProgress".into(),
                status: "True".into(),
                message: Some("evicting workload pods; held: ...".into()),
                ..Default::default()
            }]);
        let mut strict = pdb("shop", "app-pdb", "app", 0);
        strict.spec.as_mut().unwrap().max_unavailable =
            Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(0));
        let rows = rows(
            &[n1],
            &[pod("shop", "app-1", "n1", "app", false)],
            &[strict],
            limits(),
            at(NOW),
        );
        let never = rows[0].blocked_by[0].never.as_deref().unwrap_or("");
        assert!(never.contains("maxUnavailable: 0"), "{never}");
        assert_eq!(
            rows[0].condition.as_deref(),
            Some("DrainInProgress: evicting workload pods; held: ...")
        );
        let v: serde_json::Value = serde_json::from_str(&json(&rows)).unwrap();
        assert!(v[0]["blocked_by"][0]["never"].as_str().is_some());
        assert!(table(&rows).contains("never allows"), "{}", table(&rows));
    }

    /// Issue 71: a drain waiting for a disruption budget names the budget and until
    /// when in BLOCKED BY (from its `DrainInProgress` condition), not its pods, which
    /// nothing evicts yet; once its first phase runs, the pods again.
    #[test]
    fn a_drain_waiting_for_a_disruption_budget_names_the_budget() {
        let rec = DrainRecord {
            reasons: vec![DrainReason::new(Why::ScaleIn, at("2026-11-27T07:05:30Z"))],
            ..DrainRecord::default()
        };
        let with = |message: &str| {
            let mut n1 = recorded("n1", "web", &rec);
            n1.status.get_or_insert_with(Default::default).conditions =
                Some(vec![k8s_openapi::api::core::v1::NodeCondition {
                    type_: "DrainInProgress".into(),
                    status: "True".into(),
                    message: Some(message.into()),
                    ..Default::default()
                }]);
            let rows = rows(
                &[n1],
                &[pod("shop", "app-1", "n1", "app", false)],
                &[],
                limits(),
                at(NOW),
            );
            table(&rows)
        };
        let waiting = with(
            "waiting for disruption budget \"batch-one\": 1 of 1 allowed drain now; starts when one ends",
        );
        assert!(
            waiting.contains("waiting for disruption budget \"batch-one\": 1 of 1 allowed"),
            "{waiting}"
        );
        assert!(!waiting.contains("shop/app-1"), "{waiting}");
        let running = with("evicting workload pods; workload deadline ...");
        assert!(running.contains("shop/app-1"), "{running}");
        assert!(!running.contains("disruption budget"), "{running}");
    }

    /// A drain of CA's scale-in mid-workloads: the workload pod still there and the
    /// budget that allows it no disruption are named (not the budget that allows one,
    /// not one of another namespace, not the DaemonSet pod); elapsed counts from the
    /// record's start to the `now` given; the deadline is the plan's.
    #[test]
    fn a_drain_mid_workloads_names_the_pods_and_the_budgets_that_block_it() {
        let rec = DrainRecord {
            reasons: vec![DrainReason::new(Why::ScaleIn, at("2026-11-27T07:05:30Z"))],
            ..DrainRecord::default()
        };
        let nodes = [recorded("n1", "web", &rec), node("n2", &[])];
        let pods = [
            pod("shop", "app-1", "n1", "app", false),
            pod("shop", "cart-1", "n1", "cart", false),
            pod("logging", "fluentd-x", "n1", "fluentd", true),
            pod("shop", "app-2", "n2", "app", false),
        ];
        let pdbs = [
            pdb("shop", "app-pdb", "app", 0),
            pdb("shop", "cart-pdb", "cart", 1),
            pdb("other", "app-pdb", "app", 0),
        ];
        let rows = rows(&nodes, &pods, &pdbs, limits(), at(NOW));
        assert_eq!(rows.len(), 1, "a Node without a record is not listed");
        let r = &rows[0];
        assert_eq!(r.node, "n1");
        assert_eq!(r.group.as_deref(), Some("web"));
        assert_eq!(r.reasons, ["CA scale-in"]);
        assert_eq!(r.phase, Phase::Workloads);
        assert_eq!(r.elapsed_seconds, Some(270));
        assert_eq!(
            r.blocked_by,
            [
                Blocker {
                    pod: "shop/app-1".into(),
                    budgets: vec!["shop/app-pdb".into()],
                    never: None,
                    terminating: None,
                },
                Blocker {
                    pod: "shop/cart-1".into(),
                    budgets: vec![],
                    never: None,
                    terminating: None,
                },
            ]
        );
        assert_eq!(r.deadline, Some(at("2026-11-27T07:15:30Z")));
        assert_eq!(r.deadline_policy, Some("abandon"));
        assert_eq!(r.unreadable, None);
        let t = table(&rows);
        let lines: Vec<&str> = t.lines().collect();
        assert!(
            lines[0].starts_with("NODE") && lines[0].contains("BLOCKED BY"),
            "{t}"
        );
        assert!(
            lines[1].contains("n1")
                && lines[1].contains("web")
                && lines[1].contains("workloads")
                && lines[1].contains("4m30s")
                && lines[1].contains("shop/app-1 (shop/app-pdb); shop/cart-1")
                && lines[1].contains("2026-11-27T07:15:30Z")
                && lines[1].ends_with("abandon"),
            "{t}"
        );
        // Only the workloads gone: the DaemonSet phase waits for the DaemonSet pod
        // and names it, never a workload pod that has gone (issue 74).
        let rows2 = super::rows(&nodes, &pods[2..3], &pdbs, limits(), at(NOW));
        assert_eq!(rows2[0].phase, Phase::Daemonsets);
        let waited: Vec<&str> = rows2[0].blocked_by.iter().map(|b| b.pod.as_str()).collect();
        assert_eq!(waited, ["logging/fluentd-x"]);
        let t2 = table(&rows2);
        assert!(
            t2.lines().nth(1).unwrap().contains("daemonsets") && t2.contains("logging/fluentd-x"),
            "{t2}"
        );
        assert!(!t2.contains("shop/"), "{t2}");
        let rows3 = super::rows(&nodes, &[], &pdbs, limits(), at(NOW));
        assert_eq!(rows3[0].phase, Phase::Drained);
    }

    /// Issue 74: a pod already evicted (deletionTimestamp set) is terminating, with
    /// the grace it has left, never blocked by the budget that selects it; once its
    /// grace is over it says so.
    #[test]
    fn a_terminating_pod_is_shown_terminating_with_its_grace_left() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
        let rec = DrainRecord {
            reasons: vec![DrainReason::new(Why::ScaleIn, at("2026-11-27T07:05:30Z"))],
            ..DrainRecord::default()
        };
        let nodes = [recorded("n1", "web", &rec)];
        let mut going = pod("shop", "app-1", "n1", "app", false);
        going.metadata.deletion_timestamp = Some(Time(
            k8s_openapi::jiff::Timestamp::from_second(at(NOW).timestamp() + 12).unwrap(),
        ));
        going.metadata.deletion_grace_period_seconds = Some(30);
        let pods = [going.clone(), pod("shop", "app-2", "n1", "app", false)];
        let pdbs = [pdb("shop", "app-pdb", "app", 0)];
        let rows = rows(&nodes, &pods, &pdbs, limits(), at(NOW));
        let b = &rows[0].blocked_by;
        assert_eq!(b[0].pod, "shop/app-1");
        assert!(b[0].budgets.is_empty() && b[0].never.is_none(), "{b:?}");
        assert_eq!(
            b[0].terminating,
            Some(crate::scalein::progress::Terminating {
                grace_left_seconds: 12,
                grace_seconds: Some(30),
            })
        );
        assert_eq!(
            b[1].budgets,
            ["shop/app-pdb"],
            "the running pod is still kept"
        );
        let t = table(&rows);
        assert!(
            t.contains(
                "shop/app-1 (terminating, 12s of its 30s grace left); shop/app-2 (shop/app-pdb)"
            ),
            "{t}"
        );
        let line = crate::scalein::progress::blocked_line(Phase::Workloads, b);
        assert!(
            line.starts_with("waiting for 2 pods: shop/app-1 (terminating, 12s of its 30s grace left); shop/app-2 (PodDisruptionBudget shop/app-pdb"),
            "{line}"
        );
        let v: serde_json::Value = serde_json::from_str(&json(&rows)).unwrap();
        assert_eq!(
            v[0]["blocked_by"][0]["terminating"]["grace_left_seconds"],
            12
        );
        assert!(v[0]["blocked_by"][1].get("terminating").is_none());
        // Past its deletion time, its grace is over: still not the budget's.
        let later = super::rows(
            &nodes,
            &pods[..1],
            &pdbs,
            limits(),
            at("2026-11-27T07:11:00Z"),
        );
        let b = &later[0].blocked_by[0];
        assert!(b.budgets.is_empty());
        assert_eq!(
            crate::scalein::progress::blocked_line(Phase::Workloads, std::slice::from_ref(b)),
            "waiting for 1 pod: shop/app-1 (terminating, its grace period over and its end not confirmed yet)"
        );
    }

    /// Issue 73: a drained node whose instance waits to be out of the load balancers
    /// says so where the blockers go, with the time waited and the bound; once the
    /// drain is finished, or with an annotation that does not read, it says nothing.
    #[test]
    fn a_drained_node_waiting_for_the_load_balancers_says_so() {
        use crate::scalein::decide::last_mile::{Waiting, ANNOTATION};
        let rec = DrainRecord {
            reasons: vec![DrainReason::new(Why::ScaleIn, at("2026-11-27T07:05:30Z"))],
            ..DrainRecord::default()
        };
        let waiting = Waiting {
            groups: 2,
            since: at("2026-11-27T07:09:15Z"),
            at_most_seconds: 330,
        };
        let mut n = recorded("n1", "web", &rec);
        n.metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(ANNOTATION.into(), waiting.to_json());
        let rows = rows(std::slice::from_ref(&n), &[], &[], limits(), at(NOW));
        assert_eq!(rows[0].phase, Phase::Drained);
        let line = "waiting for 2 target groups to deregister, 45 s of at most 330 s";
        assert_eq!(rows[0].load_balancers.as_deref(), Some(line));
        assert!(
            table(&rows).lines().nth(1).unwrap().contains(line),
            "{}",
            table(&rows)
        );
        n.metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(ANNOTATION.into(), "not json".into());
        let unread = super::rows(std::slice::from_ref(&n), &[], &[], limits(), at(NOW));
        assert_eq!(unread[0].load_balancers, None);
    }

    #[test]
    fn no_drains_says_so_and_json_is_an_empty_array() {
        let nodes = [node("n1", &[]), node("n2", &[("other", "x")])];
        let rows = rows(&nodes, &[], &[], limits(), at(NOW));
        assert!(rows.is_empty());
        assert_eq!(table(&rows), "no drains in progress\n");
        assert_eq!(json(&rows).trim(), "[]");
    }

    /// Fail closed: a record that does not read is listed, naming the annotation,
    /// and is never taken for the older annotations' drain or left out.
    #[test]
    fn an_unreadable_record_is_listed_naming_the_annotation() {
        let nodes = [node(
            "n1",
            &[
                (record::ANNOTATION, "{not json"),
                (record::STARTED_ANNOTATION, "2026-11-27T07:00:00Z"),
                (record::GROUP_ANNOTATION, "web"),
            ],
        )];
        let rows = rows(&nodes, &[], &[], limits(), at(NOW));
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].phase, Phase::Unreadable);
        assert_eq!(rows[0].unreadable, Some(record::ANNOTATION));
        assert_eq!(rows[0].group.as_deref(), Some("web"));
        let t = table(&rows);
        assert!(
            t.contains("unreadable record (ca-asg-provider.io/drain-reasons)"),
            "{t}"
        );
        let v: serde_json::Value = serde_json::from_str(&json(&rows)).unwrap();
        assert_eq!(v[0]["phase"], "unreadable");
        assert_eq!(v[0]["unreadable"], record::ANNOTATION);
    }

    /// A finished record (every reason done) is listed as finished, with its reasons,
    /// no deadline and nothing blocking, whatever pods came back to the node.
    #[test]
    fn a_finished_record_has_no_deadline_and_nothing_blocks_it() {
        let mut rec = DrainRecord {
            reasons: vec![DrainReason::new(
                Why::Lifecycle {
                    hook: "h".into(),
                    by_ca: false,
                },
                at("2026-11-27T06:00:00Z"),
            )],
            ..DrainRecord::default()
        };
        rec.mark_done();
        let nodes = [recorded("n1", "web", &rec)];
        let pods = [pod("shop", "app-1", "n1", "app", false)];
        let pdbs = [pdb("shop", "app-pdb", "app", 0)];
        let rows = rows(&nodes, &pods, &pdbs, limits(), at(NOW));
        let r = &rows[0];
        assert_eq!(r.phase, Phase::Finished);
        assert_eq!(r.reasons, ["lifecycle hook"]);
        assert_eq!(r.elapsed_seconds, Some(70 * 60));
        assert!(r.blocked_by.is_empty());
        assert_eq!((r.deadline, r.deadline_policy), (None, None));
        let v: serde_json::Value = serde_json::from_str(&json(&rows)).unwrap();
        assert_eq!(v[0]["phase"], "finished");
        assert_eq!(v[0]["deadline"], serde_json::Value::Null);
        // A rebalance cordon alone drains nothing.
        let cordon = DrainRecord {
            reasons: vec![DrainReason::new(Why::Rebalance, at("2026-11-27T07:00:00Z"))],
            ..DrainRecord::default()
        };
        let rows = super::rows(
            &[recorded("n2", "web", &cordon)],
            &pods,
            &pdbs,
            limits(),
            at(NOW),
        );
        assert_eq!(rows[0].phase, Phase::Cordoned);
        assert!(rows[0].blocked_by.is_empty());
    }
}

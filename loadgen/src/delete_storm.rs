//! A DeleteNodes storm as cluster-autoscaler sends it (issue 46, 1): one
//! NodeGroupDeleteNodes per node, `--max-scale-down-parallelism` (10, or 50) at once,
//! each under CA's 5 s gRPC deadline (`core/scaledown/actuation/actuator.go`
//! deleteNodesAsync, `delete_in_batch.go` with the default
//! `--node-deletion-batcher-interval=0`), against the real gRPC server on the memory
//! cloud with every AWS request taking `--aws-latency-ms`. Run twice: on a group with
//! our lifecycle hook (the instance is terminated into Terminating:Wait) and on one
//! without (direct mode: the drain is marked on the Node of the in-memory API server).
//!
//! Reports per mode the calls and failures, the time from the first call to the last
//! answer, each call's latency, the AWS requests per node (the memory cloud's call
//! counter), the batches the calls were recorded in (one DescribeAutoScalingGroups per
//! batch: nothing else reads the group while the calls run), and whether CA's target
//! and the ASG's desired capacity end exact and every instance CA did not name stays.
//!
//! With `--delete-placeholders N` the group also has N slots whose launches failed
//! (placeholders, as CA lists them), and one call per placeholder goes out among the
//! nodes' calls, as CA gives up capacity that never came (`deleteCreatedNodesWithErrors`,
//! `removeOldUnregisteredNodes`). AWS may then be slower than the deadline on purpose
//! (issue 59, 1): every call's answer is recorded with the desired capacity when it
//! came, and the run counts the size changes that landed although their call said
//! nothing was changed (the goal is none). A call that failed is then not a failure by
//! itself: CA retries it; one whose answer was untrue is.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use ca_asg_provider::clock::Instant;

use serde::Serialize;

use super::stats::MethodSummary;
use ca_asg_provider::cloud::memory::MemoryGroup;
use ca_asg_provider::cloud::Cloud;
use ca_asg_provider::proto::{self, cloud_provider_client::CloudProviderClient};
use ca_asg_provider::provider::instances;
use ca_asg_provider::scalein::{Outcome, ScaleInSettings};
use ca_asg_provider::sim::world::Ground;
use ca_asg_provider::world::{Service, ServiceBuilder};

const GROUP: &str = "storm";
/// Instances CA does not name: they must all stay.
const KEPT: usize = 10;
/// How many failure messages the report quotes.
const QUOTED: usize = 5;

/// The storm's shape.
#[derive(Debug, Clone)]
pub struct DeleteStormOptions {
    /// Nodes deleted, one call each.
    pub nodes: usize,
    /// How long every AWS request takes.
    pub aws_latency: Duration,
    /// Calls in flight at once (CA's `--max-scale-down-parallelism`).
    pub parallelism: usize,
    /// The deadline each call carries (CA's `grpc_timeout`, 5 s by default).
    pub deadline: Duration,
    /// How long the drains behind the answers may take to end every instance.
    pub settle_limit: Duration,
    /// The drain engine's Kubernetes API rate limit (scaleIn.apiQps and apiBurst;
    /// the shipped 50 and 100 by default).
    pub api_qps: f64,
    pub api_burst: u32,
    /// Slots of the group whose launches failed (placeholders), one call each.
    pub placeholders: usize,
}

impl DeleteStormOptions {
    pub fn new(nodes: usize) -> Self {
        Self {
            nodes,
            aws_latency: Duration::from_millis(100),
            parallelism: 10,
            deadline: Duration::from_secs(5),
            settle_limit: Duration::from_secs(600),
            api_qps: ScaleInSettings::default().api_qps,
            api_burst: ScaleInSettings::default().api_burst,
            placeholders: 0,
        }
    }
}

#[derive(Debug, Serialize, Clone)]
pub struct DeleteStormReport {
    pub nodes: usize,
    pub aws_latency_ms: u64,
    pub parallelism: usize,
    pub deadline_ms: u64,
    pub api_qps: f64,
    pub api_burst: u32,
    pub placeholders: usize,
    pub modes: Vec<ModeReport>,
}

impl DeleteStormReport {
    /// Failures over both modes (calls and broken invariants).
    pub fn failures(&self) -> usize {
        self.modes.iter().map(|m| m.failures).sum()
    }
}

#[derive(Debug, Serialize, Clone)]
pub struct ModeReport {
    /// "hooked" (our lifecycle hook on the group) or "direct".
    pub mode: String,
    pub calls: usize,
    /// Calls answered with an error.
    pub failed_calls: usize,
    /// Failed calls plus broken invariants: CA's target or the desired capacity not
    /// exact, a drain that did not end its instance, an instance CA did not name
    /// ended. The goal is none.
    pub failures: usize,
    /// The first few messages.
    pub first_failures: Vec<String>,
    /// From the first call sent to the last answer.
    pub last_answer_s: f64,
    /// Each call, sent to answered.
    pub call_latency: MethodSummary,
    /// DescribeAutoScalingGroups reads while the calls ran: one per batch of calls
    /// recorded together.
    pub batches: u64,
    pub calls_per_batch: f64,
    /// AWS requests from the first call to the last answer, by operation.
    pub aws_requests_in_calls: BTreeMap<String, u64>,
    pub aws_requests_per_node_in_calls: f64,
    /// Kubernetes API requests from the first call to the last answer (direct mode
    /// marks each drain on its Node before answering; the drains behind the answers
    /// share the same `apiQps`), and their rate.
    pub api_requests_in_calls: u64,
    pub api_qps_in_calls: f64,
    /// AWS requests from the first call until every drain behind the answers ended
    /// its instance (the drain's own requests included), by operation.
    pub aws_requests: BTreeMap<String, u64>,
    pub aws_requests_per_node: f64,
    /// NodeGroupTargetSize in CA's next loop (Refresh first, as CA does) right
    /// after the last answer: 10 when every call succeeded.
    pub target_size: i32,
    /// NodeGroupTargetSize right after the last answer without a Refresh before it
    /// (CA never reads it so; shown, not checked).
    pub target_size_without_refresh: i32,
    /// The desired capacity the ASG must end with: the 10 instances CA did not name,
    /// and the nodes of failed calls that stayed (and, with placeholders, the slots
    /// whose call was not answered OK: then the least it may end with, less the calls
    /// answered "may land").
    pub expected: i32,
    /// The ASG's desired capacity once every drain ended its instance.
    pub desired_capacity: Option<i32>,
    /// From the first call until every drain ended its instance.
    pub all_ended_s: f64,
    /// Instances CA did not name that are no longer in service.
    pub kept_instances_ended: usize,
    /// Nodes whose call failed and whose instance stayed (counted in `expected`);
    /// the other failed calls' removals went on and ended their instance.
    pub failed_nodes_that_stayed: usize,
    /// Calls that gave up a placeholder, and how many of them were answered OK.
    pub placeholder_calls: usize,
    pub placeholder_calls_ok: usize,
    /// Calls answered that nothing was changed (every error but the two below), and
    /// calls answered that their change was sent and may land, or goes on.
    pub calls_said_nothing_changed: usize,
    pub calls_said_may_land: usize,
    /// Size changes that landed although their call was answered that nothing was
    /// changed: a named instance that ended, and placeholders given up beyond the
    /// calls answered OK or "may land". The goal is none.
    pub size_changes_after_nothing_changed: usize,
    /// Placeholder calls answered OK beyond the slots given up: the slot each named was
    /// gone by the time it was recorded (not a failure; see `expected`).
    pub placeholder_slots_already_gone: usize,
    /// Every call: what it named, its answer, and the desired capacity then and after.
    pub call_records: Vec<CallRecord>,
}

/// One call of the storm as CA saw it.
#[derive(Debug, Serialize, Clone)]
pub struct CallRecord {
    /// The instance, or the placeholder, the call named.
    pub node: String,
    pub placeholder: bool,
    /// From the first call sent to this answer.
    pub answered_s: f64,
    /// "OK", or the error's code and message.
    pub answer: String,
    /// What the answer told CA: "changed", "may land" or "nothing changed".
    pub said: &'static str,
    /// The ASG's desired capacity when the answer came.
    pub desired_at_answer: Option<i32>,
    /// Whether the desired capacity changed after the answer (by this call's change
    /// or another's, the drains' included).
    pub desired_changed_after: bool,
}

/// What an answer tells CA about its change.
fn said(error: Option<&str>) -> &'static str {
    match error {
        None => "changed",
        Some(e) if e.contains("may still land") || e.contains("it goes on") => "may land",
        Some(_) => "nothing changed",
    }
}

/// Both modes, one after the other, each on a fresh cloud and API server.
pub async fn run(o: &DeleteStormOptions) -> anyhow::Result<DeleteStormReport> {
    anyhow::ensure!(o.nodes >= 1, "--delete-storm must be at least 1");
    anyhow::ensure!(
        o.parallelism >= 1,
        "--delete-parallelism must be at least 1"
    );
    let mut modes = Vec::new();
    for hooked in [true, false] {
        modes.push(run_mode(o, hooked).await?);
    }
    Ok(DeleteStormReport {
        nodes: o.nodes,
        aws_latency_ms: o.aws_latency.as_millis() as u64,
        parallelism: o.parallelism,
        deadline_ms: o.deadline.as_millis() as u64,
        api_qps: o.api_qps,
        api_burst: o.api_burst,
        placeholders: o.placeholders,
        modes,
    })
}

/// One call's answer: when it came, how long it took, the error if any, and the
/// desired capacity then.
struct Answer {
    at: Instant,
    took: Duration,
    error: Option<String>,
    desired: Option<i32>,
}

/// One call of the storm: the instance (or placeholder) and its providerID.
struct Victim {
    id: String,
    provider_id: String,
    placeholder: bool,
}

impl Victim {
    fn placeholder(id: String) -> Self {
        Self {
            provider_id: id.clone(),
            id,
            placeholder: true,
        }
    }
}

fn delta(after: &BTreeMap<String, u64>, before: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    after
        .iter()
        .map(|(op, n)| (op.clone(), n - before.get(op).copied().unwrap_or(0)))
        .filter(|(_, n)| *n > 0)
        .collect()
}

fn per_node(requests: &BTreeMap<String, u64>, nodes: usize) -> f64 {
    let total: u64 = requests.values().sum();
    (total as f64 / nodes as f64 * 100.0).round() / 100.0
}

async fn run_mode(o: &DeleteStormOptions, hooked: bool) -> anyhow::Result<ModeReport> {
    let mode = if hooked { "hooked" } else { "direct" };
    eprintln!(
        "loadgen: delete storm, {mode}: {} one-node DeleteNodes and {} of a placeholder, {} at once, AWS at {} ms",
        o.nodes,
        o.placeholders,
        o.parallelism,
        o.aws_latency.as_millis()
    );
    let setup_limit = Duration::from_secs(120);
    let size = (o.nodes + KEPT) as i32;
    let failed_slots = o.placeholders as i32;
    let mut group = MemoryGroup::new(GROUP, 0, size + failed_slots, size, "m5.large");
    if hooked {
        group = group.terminating_hook(&ScaleInSettings::default().hook_name, 300);
    }
    let Ground { sim, cloud, .. } = Ground::builder()
        .group(group)
        .ready_delay(Duration::from_millis(100))
        .nodes_within(Some(setup_limit))
        .build()
        .await?;
    if failed_slots > 0 {
        // Capacity asked for that never came: CA lists each slot as a placeholder.
        cloud.fail_launches(GROUP, Some("InsufficientInstanceCapacity"));
        Cloud::set_desired_capacity(&cloud, GROUP, size + failed_slots).await?;
    }

    // The service as `serve` builds it: the provider with the drain behind DeleteNodes
    // (the shipped scale-in settings, apiQps as given), and the gRPC server on a free port.
    let service = ServiceBuilder::over(sim.client(), Arc::new(cloud.clone()))
        .groups(&[GROUP])
        .scale_in(ScaleInSettings {
            api_qps: o.api_qps,
            api_burst: o.api_burst,
            ..ScaleInSettings::default()
        })
        .build()
        .await?;
    let door = service.ca_over_tcp().await?;
    let ca = door.ca.clone();
    service.drain_marks_read(setup_limit).await?;
    let Service { provider, engine } = service;

    let mut instances: Vec<(String, String)> = cloud
        .instances()
        .into_iter()
        .filter(|(g, i)| g == GROUP && !i.state.is_terminating())
        .map(|(_, i)| (i.id.clone(), i.provider_id()))
        .collect();
    instances.sort();
    anyhow::ensure!(
        instances.len() == o.nodes + KEPT,
        "{} instances in service, not {}",
        instances.len(),
        o.nodes + KEPT
    );
    let kept: BTreeSet<String> = instances[o.nodes..]
        .iter()
        .map(|(id, _)| id.clone())
        .collect();
    // The placeholders, the highest slot first (a slot past the unfulfilled capacity
    // is gone), spread among the nodes' calls, the first call a placeholder's.
    let slot = |provider_id: &str| {
        instances::placeholder_index(provider_id.rsplit('/').next().unwrap_or_default())
    };
    let mut placeholders: Vec<String> = provider
        .nodes(GROUP)?
        .into_iter()
        .map(|v| v.id)
        .filter(|id| slot(id).is_some())
        .collect();
    placeholders.sort_by_key(|id| std::cmp::Reverse(slot(id)));
    anyhow::ensure!(
        placeholders.len() == o.placeholders,
        "{} placeholders listed, not {}",
        placeholders.len(),
        o.placeholders
    );
    let every = (o.nodes / o.placeholders.max(1)).max(1);
    let mut victims: Vec<Victim> = Vec::with_capacity(o.nodes + o.placeholders);
    let mut placeholders = placeholders.into_iter();
    for (i, (id, provider_id)) in instances[..o.nodes].iter().enumerate() {
        if i % every == 0 {
            victims.extend(placeholders.next().map(Victim::placeholder));
        }
        victims.push(Victim {
            id: id.clone(),
            provider_id: provider_id.clone(),
            placeholder: false,
        });
    }
    victims.extend(placeholders.map(Victim::placeholder));

    cloud.slow(o.aws_latency);
    let before = cloud.calls();
    let api_before = sim.requests().total();
    let started = Instant::now();
    let slots = Arc::new(tokio::sync::Semaphore::new(o.parallelism));
    let mut calls = Vec::with_capacity(victims.len());
    for v in &victims {
        // CA names a placeholder by its id, as both name and providerID.
        let name = if v.placeholder {
            v.id.clone()
        } else {
            ca_asg_provider::sim::node_name(&v.id)
        };
        let mut req = tonic::Request::new(proto::NodeGroupDeleteNodesRequest {
            id: GROUP.to_string(),
            nodes: vec![proto::ExternalGrpcNode {
                provider_id: v.provider_id.clone(),
                name,
                ..Default::default()
            }],
        });
        req.set_timeout(o.deadline);
        let (mut ca, slots, cloud) = (ca.clone(), slots.clone(), cloud.clone());
        calls.push(tokio::spawn(async move {
            let _slot = slots.acquire_owned().await.expect("never closed");
            let sent = Instant::now();
            let error = ca
                .node_group_delete_nodes(req)
                .await
                .err()
                .map(|e| format!("{:?}: {}", e.code(), e.message()));
            Answer {
                at: Instant::now(),
                took: sent.elapsed(),
                error,
                desired: cloud.desired(GROUP),
            }
        }));
    }
    let mut answers = Vec::with_capacity(calls.len());
    for c in calls {
        answers.push(c.await?);
    }
    let last = answers.iter().map(|a| a.at).max().unwrap_or(started);
    let in_calls = delta(&cloud.calls(), &before);
    let api_requests_in_calls = sim.requests().total() - api_before;
    let failed_calls = answers.iter().filter(|a| a.error.is_some()).count();
    // With placeholders AWS may be slower than the deadline on purpose: a failed call
    // is then a failure only if its answer was untrue (counted below).
    let mut failures: Vec<String> = if o.placeholders == 0 {
        answers.iter().filter_map(|a| a.error.clone()).collect()
    } else {
        Vec::new()
    };
    let latencies: Vec<u32> = answers
        .iter()
        .map(|a| a.took.as_micros().min(u32::MAX as u128) as u32)
        .collect();

    let target = |mut ca: CloudProviderClient<tonic::transport::Channel>| async move {
        anyhow::Ok(
            ca.node_group_target_size(proto::NodeGroupTargetSizeRequest { id: GROUP.into() })
                .await?
                .into_inner()
                .target_size,
        )
    };
    let target_size_without_refresh = target(ca.clone()).await?;
    // CA's next loop: Refresh, then the group's target.
    ca.clone().refresh(proto::RefreshRequest {}).await?;
    let target_size = target(ca.clone()).await?;
    // With every call answered OK, CA's target is exact at once. (A call that failed
    // late may still be recording its removal, which then goes on: only the desired
    // capacity, once everything settled, is checked against it. For placeholders, see
    // below.)
    if o.placeholders == 0 && failed_calls == 0 && target_size != KEPT as i32 {
        failures.push(format!(
            "CA's target is {target_size} after the calls, not {KEPT}"
        ));
    }

    // The drains behind the answers end every instance CA named, and those whose
    // call failed late once recorded.
    let settle_until = started + o.settle_limit;
    let mut settled = true;
    for (v, answer) in victims.iter().zip(&answers) {
        if v.placeholder {
            continue;
        }
        let id = &v.id;
        let left = settle_until.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, engine.wait_for(id)).await {
            Ok(Some(Outcome::Ended)) => {}
            // No drain: its call failed before anything started.
            Ok(None) if answer.error.is_some() => {}
            Ok(None) => failures.push(format!("no drain was started for {id}")),
            Ok(Some(other)) => failures.push(format!("the drain of {id} ended {other:?}")),
            Err(_) => {
                settled = false;
                break;
            }
        }
    }
    // A removal recorded after its call gave up starts its drain late: wait until no
    // drain runs, twice a second apart.
    let mut idle = 0;
    while settled && idle < 2 {
        if Instant::now() >= settle_until {
            settled = false;
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        idle = if engine.drains_at_once() == 0 {
            idle + 1
        } else {
            0
        };
    }
    if !settled {
        failures.push(format!(
            "the drains had not ended every instance after {:?}",
            o.settle_limit
        ));
    }
    let all_ended = started.elapsed();
    let aws_requests = delta(&cloud.calls(), &before);
    let in_service: BTreeSet<String> = cloud
        .instances()
        .into_iter()
        .filter(|(g, i)| g == GROUP && !i.state.is_terminating())
        .map(|(_, i)| i.id)
        .collect();
    let kept_instances_ended = kept.difference(&in_service).count();
    if kept_instances_ended > 0 {
        failures.push(format!(
            "{kept_instances_ended} instance(s) CA did not name ended"
        ));
    }
    // Every node whose call succeeded is gone; a node whose call failed may stay
    // (CA takes its taint off and counts it again), and then the ASG keeps it. One
    // whose call said nothing was removed must stay.
    let mut stayed = 0;
    let mut untrue = 0;
    for (v, answer) in victims.iter().zip(&answers) {
        if v.placeholder {
            continue;
        }
        let id = &v.id;
        let told = said(answer.error.as_deref());
        match (answer.error.is_some(), in_service.contains(id)) {
            (false, true) => failures.push(format!(
                "{id} is still in service although its DeleteNodes succeeded"
            )),
            (true, true) => stayed += 1,
            (true, false) if told == "nothing changed" => {
                untrue += 1;
                failures.push(format!(
                    "{id} ended although its DeleteNodes was answered {:?}",
                    answer.error.as_deref().unwrap_or_default()
                ));
            }
            _ => {}
        }
    }
    // Placeholders: every ended node took one off the desired capacity; what else
    // came off was given up, and may be only as much as the calls answered OK or
    // "may land".
    let (mut ph_calls, mut ph_ok, mut ph_may) = (0, 0, 0);
    for (v, answer) in victims.iter().zip(&answers) {
        if v.placeholder {
            ph_calls += 1;
            match said(answer.error.as_deref()) {
                "changed" => ph_ok += 1,
                "may land" => ph_may += 1,
                _ => {}
            }
        }
    }
    let desired_capacity = cloud.desired(GROUP);
    let ended = (o.nodes - stayed) as i32;
    let given_up =
        (size + failed_slots - ended - desired_capacity.unwrap_or(size + failed_slots)).max(0);
    let unannounced = (given_up - ph_ok - ph_may).max(0) as usize;
    if unannounced > 0 {
        failures.push(format!(
            "{given_up} placeholder(s) given up, and only {ph_ok} call(s) answered OK and {ph_may} \"may land\": {unannounced} size change(s) landed after an answer that said nothing was changed"
        ));
    }
    untrue += unannounced;
    // Without placeholders the desired capacity is exact. With them, a call may find
    // the slot it names gone already (each call names one slot of the list taken
    // before the storm, and a call for a lower slot that overtook it gave one up
    // first): the provider answers OK with nothing left to give up. So the desired
    // capacity may end above what the answers say, never below it (counted above)
    // and never above where it started.
    let expected = (KEPT + stayed) as i32 + failed_slots - ph_ok;
    let highest = (KEPT + stayed) as i32 + failed_slots;
    let within = match desired_capacity {
        Some(d) if failed_slots == 0 => d == expected,
        Some(d) => d <= highest,
        None => false,
    };
    if !within {
        failures.push(format!(
            "the ASG's desired capacity is {desired_capacity:?} once every drain ended, not {}",
            if failed_slots == 0 {
                expected.to_string()
            } else {
                format!("at most {highest}")
            }
        ));
    }
    let slots_already_gone = (ph_ok - given_up).max(0) as usize;
    let call_records: Vec<CallRecord> = victims
        .iter()
        .zip(&answers)
        .map(|(v, a)| CallRecord {
            node: v.id.clone(),
            placeholder: v.placeholder,
            answered_s: round2(a.at.duration_since(started).as_secs_f64()),
            answer: a.error.clone().unwrap_or_else(|| "OK".into()),
            said: said(a.error.as_deref()),
            desired_at_answer: a.desired,
            desired_changed_after: a.desired != desired_capacity,
        })
        .collect();
    let said_count = |what: &str| call_records.iter().filter(|c| c.said == what).count();

    door.close().await;
    engine.shutdown();
    // The Events queued behind the drains (published with spare API tokens) keep
    // going to the API server after this: it stays up until the process ends.
    std::mem::forget(sim);

    let batches = in_calls.get("describe_groups").copied().unwrap_or(0);
    Ok(ModeReport {
        mode: mode.to_string(),
        calls: answers.len(),
        failed_calls,
        failures: failures.len(),
        first_failures: failures.into_iter().take(QUOTED).collect(),
        last_answer_s: round2(last.duration_since(started).as_secs_f64()),
        call_latency: MethodSummary::of("NodeGroupDeleteNodes", &latencies),
        batches,
        calls_per_batch: if batches > 0 {
            round2(answers.len() as f64 / batches as f64)
        } else {
            0.0
        },
        aws_requests_per_node_in_calls: per_node(&in_calls, o.nodes),
        aws_requests_in_calls: in_calls,
        api_requests_in_calls,
        api_qps_in_calls: round2(
            api_requests_in_calls as f64 / last.duration_since(started).as_secs_f64().max(1e-3),
        ),
        aws_requests_per_node: per_node(&aws_requests, o.nodes),
        aws_requests,
        target_size,
        target_size_without_refresh,
        expected,
        desired_capacity,
        all_ended_s: round2(all_ended.as_secs_f64()),
        kept_instances_ended,
        failed_nodes_that_stayed: stayed,
        placeholder_calls: ph_calls,
        placeholder_calls_ok: ph_ok as usize,
        calls_said_nothing_changed: said_count("nothing changed"),
        calls_said_may_land: said_count("may land"),
        size_changes_after_nothing_changed: untrue,
        placeholder_slots_already_gone: slots_already_gone,
        call_records,
    })
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// The report as text.
pub fn print(r: &DeleteStormReport) {
    println!(
        "\nDeleteNodes storm: {} nodes and {} placeholders, one call each, {} at once, {} ms deadline, AWS at {} ms per request, apiQps {} (burst {})\n",
        r.nodes, r.placeholders, r.parallelism, r.deadline_ms, r.aws_latency_ms, r.api_qps, r.api_burst
    );
    println!(
        "{:<7} {:>6} {:>8} {:>9} {:>8} {:>8} {:>8} {:>8} {:>9} {:>10} {:>8} {:>8}",
        "mode",
        "calls",
        "failures",
        "last (s)",
        "p50 ms",
        "p99 ms",
        "max ms",
        "batches",
        "AWS/node",
        "AWS/node*",
        "target",
        "desired"
    );
    let ms = |us: u32| f64::from(us) / 1000.0;
    for m in &r.modes {
        println!(
            "{:<7} {:>6} {:>8} {:>9.2} {:>8.0} {:>8.0} {:>8.0} {:>8} {:>9.2} {:>10.2} {:>8} {:>8}",
            m.mode,
            m.calls,
            m.failures,
            m.last_answer_s,
            ms(m.call_latency.p50_us),
            ms(m.call_latency.p99_us),
            ms(m.call_latency.max_us),
            m.batches,
            m.aws_requests_per_node_in_calls,
            m.aws_requests_per_node,
            format!("{}/{KEPT}", m.target_size),
            m.desired_capacity
                .map(|d| format!("{d}/{}", m.expected))
                .unwrap_or_else(|| "-".into()),
        );
    }
    println!(
        "\nAWS/node: requests from the first call to the last answer; AWS/node*: until every drain ended its instance"
    );
    for m in &r.modes {
        let ops = |reqs: &BTreeMap<String, u64>| {
            reqs.iter()
                .map(|(op, n)| format!("{op} {n}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        println!(
            "{}: in the calls {} (and {} Kubernetes API requests, {:.0}/s); in all (every instance ended after {:.1} s) {}",
            m.mode,
            ops(&m.aws_requests_in_calls),
            m.api_requests_in_calls,
            m.api_qps_in_calls,
            m.all_ended_s,
            ops(&m.aws_requests)
        );
        if r.placeholders > 0 {
            println!(
                "{}: {} placeholder call(s), {} OK ({} of whose slots were gone already); of all calls {} answered that nothing was changed, {} that it may land; size changes after an answer that said nothing was changed: {}",
                m.mode,
                m.placeholder_calls,
                m.placeholder_calls_ok,
                m.placeholder_slots_already_gone,
                m.calls_said_nothing_changed,
                m.calls_said_may_land,
                m.size_changes_after_nothing_changed
            );
        }
        for f in &m.first_failures {
            println!("  {} failure: {f}", m.mode);
        }
    }
    if r.failures() == 0 && r.placeholders > 0 {
        println!("\nno failure: every answer true (no size change after an answer that said nothing was changed), desired capacity within what the answers allow, no other instance ended");
    } else if r.failures() == 0 {
        println!("\nno failure: every call answered OK, target and desired capacity exact, no other instance ended");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_only_what_changed() {
        let before = BTreeMap::from([("a".to_string(), 2), ("b".to_string(), 5)]);
        let after = BTreeMap::from([
            ("a".to_string(), 2),
            ("b".to_string(), 9),
            ("c".to_string(), 1),
        ]);
        let d = delta(&after, &before);
        assert_eq!(
            d,
            BTreeMap::from([("b".to_string(), 4), ("c".to_string(), 1)])
        );
        assert_eq!(per_node(&d, 2), 2.5);
    }
}

//! Runs a model test's cases many at a time. A case of the drain's models spends
//! most of its time waiting (for preStop hooks, heartbeats, polls), so cases run side
//! by side, each on its own threads and its own tokio runtime (dropped with every task
//! it spawned when the case ends, as a case's runtime always was), from op sequences a
//! seeded proptest strategy generates.
//!
//! - `MODEL_CASES=N`: how many cases (each test has its own default).
//! - `MODEL_SEED=S`: the seed of the sequences (a fresh one otherwise, always printed).
//! - `MODEL_CASE=I`: only case I of that seed (replays one failure).
//! - `MODEL_AT_ONCE=K`: cases side by side (default 16; a case mostly waits).
//! - `MODEL_REPLAY_CHECK=1`: run every case twice and fail where what it did (its
//!   transcript) differs: proof that a case depends on its seed alone.
//! - `MODEL_TRANSCRIPT=1`: [`assert_replays_exactly`] prints both transcripts whole
//!   when two runs differ.
//! - `MODEL_TRANSCRIPT_DIR=D`: write every case's transcript to `D/<model>-<seed>-<case>.txt`,
//!   so the transcripts of one seed before and after a change can be compared
//!   (`diff -r`): a move that keeps behaviour keeps them byte for byte.
//! - `MODEL_SHRINK=R`: at most R runs spent shrinking a failure (default 40; 0: none),
//!   and at most `MODEL_SHRINK_SECS` seconds (default 180).
//!
//! A failure names its seed and case and prints the replay line, then shrinks the
//! sequence as proptest does (drop and simplify ops while it still fails) and prints
//! the smallest failing sequence found.
//!
//! Every model replays exactly (issue 39): a seed and a case give the same steps at
//! the same instants on any machine, under any load (docs/models.md says how).
//! `accounting_model` and `ca_loop_model` drive the provider over the memory cloud on
//! tokio's paused clock; the drain models (`interruption_model`, `all_sources_model`,
//! `unkind_model`, `warm_pool_model`) run each case with [`on_paused_clock`] in a
//! [`super::world::WorldBuilder::in_process`]: the in-memory API server and the gRPC server
//! reached without a socket, wall time simulated from the paused clock, the service's
//! jitter drawn per pod or instance from a fixed sequence, and tokio's own RNG seeded.
//! Each returns its [`transcript`], and `MODEL_REPLAY_CHECK=1` runs every case twice
//! and fails where the two differ. Every sequence that failed once is still kept as a
//! fixed test (`interruption_model::a_stopping_notice_an_asg_end_and_a_spot_warning_twice_evict_once`).

use std::fmt::Debug;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use ca_asg_provider::clock::Instant;
use ca_asg_provider::cloud::memory::MemoryGroup;
use ca_asg_provider::scalein::{self, Engine, ScaleInSettings};
use std::sync::Arc;

use super::world::{World, WorldBuilder};

use parking_lot::Mutex;
use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

fn env<T: std::str::FromStr>(key: &str) -> Option<T> {
    std::env::var(key).ok().and_then(|v| v.trim().parse().ok())
}

fn message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "a panic without a message".into())
}

/// Runs `case` over `default_cases` (or `MODEL_CASES`) op sequences from `ops`,
/// `MODEL_AT_ONCE` side by side; panics with the seed, the case, its sequence, the
/// smallest failing sequence found and the replay line when one fails.
pub fn run<S, F, T>(name: &str, default_cases: u32, ops: S, case: F)
where
    S: Strategy,
    S::Value: Debug + Clone + Send + Sync,
    F: Fn(S::Value) -> T + Sync,
    T: PartialEq + Debug,
{
    let twice: bool = env::<u8>("MODEL_REPLAY_CHECK").is_some_and(|v| v > 0);
    let keep: Option<std::path::PathBuf> =
        std::env::var_os("MODEL_TRANSCRIPT_DIR").map(std::path::PathBuf::from);
    let cases: usize = env("MODEL_CASES").unwrap_or(default_cases) as usize;
    let seed: u64 = env("MODEL_SEED").unwrap_or_else(|| {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        t ^ (u64::from(std::process::id()) << 32)
    });
    // With MODEL_REPLAY_CHECK=1 every case runs twice and what it returns (a
    // transcript) must be the same: a check that the seed is all a case depends on.
    // With MODEL_TRANSCRIPT_DIR each case's transcript is kept for a later compare.
    let case = |(i, v): (usize, S::Value)| {
        let out = case(v.clone());
        if let Some(dir) = &keep {
            let file = dir.join(format!("{name}-{seed}-{i}.txt"));
            std::fs::create_dir_all(dir)
                .and_then(|()| std::fs::write(&file, format!("{out:#?}\n")))
                .unwrap_or_else(|e| {
                    panic!("MODEL_TRANSCRIPT_DIR: writing {}: {e}", file.display())
                });
        }
        if twice {
            let again = case(v);
            if again != out {
                let (a, b) = (format!("{out:#?}"), format!("{again:#?}"));
                let line = a
                    .lines()
                    .zip(b.lines())
                    .position(|(x, y)| x != y)
                    .unwrap_or(0);
                panic!(
                    "the case did not replay exactly: first difference at line {line}:\n  {:?}\n  {:?}",
                    a.lines().nth(line),
                    b.lines().nth(line)
                );
            }
        }
    };
    let only: Option<usize> = env("MODEL_CASE");
    let at_once: usize = env("MODEL_AT_ONCE").unwrap_or(16).max(1);
    let shrink_runs: u32 = env("MODEL_SHRINK").unwrap_or(40);
    let shrink_for = Duration::from_secs(env("MODEL_SHRINK_SECS").unwrap_or(180));

    let mut bytes = [0u8; 32];
    for chunk in bytes.chunks_mut(8) {
        chunk.copy_from_slice(&seed.to_le_bytes());
    }
    let mut runner = TestRunner::new_with_rng(
        Config::default(),
        TestRng::from_seed(RngAlgorithm::ChaCha, &bytes),
    );
    let count = only.map_or(cases, |i| i + 1);
    let mut trees: Vec<S::Tree> = (0..count)
        .map(|_| {
            ops.new_tree(&mut runner)
                .expect("the strategy makes a case")
        })
        .collect();
    let values: Vec<S::Value> = trees.iter().map(|t| t.current()).collect();
    let todo: Vec<usize> = match only {
        Some(i) => {
            eprintln!("model {name}: case {i} of seed {seed}: {:?}", values[i]);
            vec![i]
        }
        None => (0..count).collect(),
    };

    let started = Instant::now();
    let next = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let failed: Mutex<Option<(usize, String)>> = Mutex::new(None);
    let slowest: Mutex<(Duration, usize)> = Mutex::new((Duration::ZERO, 0));
    std::thread::scope(|s| {
        for _ in 0..at_once.min(todo.len()) {
            s.spawn(|| loop {
                if stop.load(Ordering::Relaxed) {
                    return;
                }
                let k = next.fetch_add(1, Ordering::Relaxed);
                let Some(&i) = todo.get(k) else { return };
                let t = Instant::now();
                let out = catch_unwind(AssertUnwindSafe(|| case((i, values[i].clone()))));
                let took = t.elapsed();
                {
                    let mut sl = slowest.lock();
                    if took > sl.0 {
                        *sl = (took, i);
                    }
                }
                if let Err(p) = out {
                    stop.store(true, Ordering::Relaxed);
                    let mut f = failed.lock();
                    if f.as_ref().is_none_or(|(j, _)| i < *j) {
                        *f = Some((i, message(&*p)));
                    }
                }
            });
        }
    });
    let (slow, slow_case) = *slowest.lock();
    let done = next.load(Ordering::Relaxed).min(todo.len());
    eprintln!(
        "model {name}: {done} of {} case(s) in {:.1} s, {at_once} at once (slowest: case {slow_case}, {:.1} s), MODEL_SEED={seed}",
        todo.len(),
        started.elapsed().as_secs_f64(),
        slow.as_secs_f64()
    );
    let Some((i, why)) = failed.into_inner() else {
        return;
    };
    let first = values[i].clone();
    eprintln!(
        "model {name}: case {i} failed: {why}\n  ops: {first:?}\n  replay: MODEL_SEED={seed} MODEL_CASE={i} cargo test --test {name}"
    );
    // Run once more, alone: on the paused clock a failure must fail the same way.
    let again = catch_unwind(AssertUnwindSafe(|| case((i, first.clone()))))
        .err()
        .map(|p| message(&*p));
    let replayed = match &again {
        Some(w) if *w == why => "fails the same way when run again".to_string(),
        Some(w) => format!("fails differently when run again: {w}"),
        None => "PASSED when run again: the case depends on more than its seed".to_string(),
    };
    eprintln!("model {name}: case {i} {replayed}\n  shrinking ({shrink_runs} runs at most)...");
    // Shrinking as proptest does: simplify while it fails, step back when it passes.
    let mut tree = trees.swap_remove(i);
    let mut smallest = first.clone();
    let mut smallest_why = why.clone();
    let mut runs = 0;
    let shrinking = Instant::now();
    if shrink_runs > 0 && tree.simplify() {
        loop {
            runs += 1;
            let v = tree.current();
            let fails = catch_unwind(AssertUnwindSafe(|| case((i, v.clone())))).err();
            let more = match fails {
                Some(p) => {
                    smallest = v;
                    smallest_why = message(&*p);
                    tree.simplify()
                }
                None => tree.complicate(),
            };
            if !more || runs >= shrink_runs || shrinking.elapsed() >= shrink_for {
                break;
            }
        }
    }
    panic!(
        "model {name}: case {i} of seed {seed} failed: {why}\n  ops: {first:?}\n  {replayed}\n  smallest failing ops after {runs} shrink run(s): {smallest:?}\n    failing with: {smallest_why}\n  replay: MODEL_SEED={seed} MODEL_CASE={i} cargo test --test {name}"
    );
}

/// How long a case's drains may take to finish after its last step before the
/// case fails naming what did not: generous, since a drain that can finish does so
/// in about a second here.
pub const SETTLE_BOUND: Duration = Duration::from_secs(20);

/// Progress: polls `unfinished` (what has not finished that can, named) until it is
/// empty, checking the invariants (`check`) on the way; fails naming what was left
/// after [`SETTLE_BOUND`].
pub async fn settle(check: impl FnMut(), unfinished: impl FnMut() -> Vec<String>) {
    settle_within(SETTLE_BOUND, check, unfinished).await
}

/// [`settle`] within `bound` (a model whose faults leave requests unanswered until
/// the service's own bound on an answer, `scalein::kube::intercept::ANSWER_WITHIN`).
pub async fn settle_within(
    bound: Duration,
    mut check: impl FnMut(),
    mut unfinished: impl FnMut() -> Vec<String>,
) {
    settle_polling(bound, Duration::from_millis(50), async || {
        check();
        unfinished()
    })
    .await
}

/// The settle loop itself: every `poll`, `round` (the invariants checked, whatever
/// the model does between polls) names what has not finished that can, until nothing
/// is left; fails naming what was left after `within`.
pub async fn settle_polling(
    within: Duration,
    poll: Duration,
    mut round: impl AsyncFnMut() -> Vec<String>,
) {
    let bound = ca_asg_provider::clock::now() + within;
    loop {
        let left = round().await;
        if left.is_empty() {
            return;
        }
        assert!(
            ca_asg_provider::clock::now() < bound,
            "not finished {within:?} after the last step: {left:?}"
        );
        tokio::time::sleep(poll).await;
    }
}

/// The guarded instance's drain waits on a budget that allows nothing: if our `hook`
/// holds `instance` once the case settled, waits `past` (more than one hook timeout),
/// checks the invariants and fails unless the hook still holds it, heartbeated.
pub async fn still_held_past_timeout(
    w: &World,
    instance: &str,
    hook: &str,
    past: Duration,
    check: impl FnOnce(),
) {
    let held = || w.cloud.pending_hooks(instance).iter().any(|h| h == hook);
    if held() {
        tokio::time::sleep(past).await;
        check();
        assert!(
            held(),
            "the guarded instance, held while its budget allows nothing, was let go"
        );
    }
}

/// The wall time every case on the paused clock starts at: a fixed instant, so the
/// whole seconds a deadline or a `deletionTimestamp` is cut to fall alike on every
/// replay.
pub const WALL_START: &str = "2026-01-05T08:00:00Z";

/// Runs `case` on its own current-thread runtime with tokio's clock paused and the
/// service's wall clock simulated from [`WALL_START`] (ca_asg_provider::clock): time
/// moves only when every task of the case waits, by exactly what the next timer
/// needs, so a case takes the same steps at the same times on any machine, under any
/// load. Whatever the case reaches must be in process (`WorldBuilder::in_process`): a socket
/// or a thread the runtime does not drive would let the clock jump while it works.
pub fn on_paused_clock<F: std::future::Future>(case: F) -> F::Output {
    let mut builder = tokio::runtime::Builder::new_current_thread();
    builder.enable_all().start_paused(true);
    // tokio's own chance (which receiver of a watch channel wakes first, which ready
    // branch of a select! goes) from a fixed seed (.cargo/config.toml).
    #[cfg(tokio_unstable)]
    builder.rng_seed(tokio::runtime::RngSeed::from_bytes(
        b"ca-asg-provider model case",
    ));
    let rt = builder.build().unwrap();
    rt.block_on(async {
        let start = chrono::DateTime::parse_from_rfc3339(WALL_START)
            .expect("WALL_START is RFC 3339")
            .with_timezone(&chrono::Utc);
        let _wall = ca_asg_provider::clock::simulate_wall_clock(start);
        case.await
    })
}

/// Steps a drain model through `ops`: its invariants (`check`) before the first step
/// and after each one.
pub async fn play<M, O>(m: &mut M, ops: &[O], step: impl AsyncFn(&mut M, &O), check: impl Fn(&M)) {
    play_judged_by_history(m, ops, step, |m, _| check(m)).await
}

/// [`play`] for a model whose invariants are judged against the ops so far (the
/// provider's models: CA's target follows from what it asked): `check` is given
/// none before the first step, then every op up to the one just taken.
pub async fn play_judged_by_history<M, O>(
    m: &mut M,
    ops: &[O],
    step: impl AsyncFn(&mut M, &O),
    check: impl Fn(&M, &[O]),
) {
    check(m, &[]);
    for (i, op) in ops.iter().enumerate() {
        step(m, op).await;
        check(m, &ops[..=i]);
    }
}

/// The provider's settings in the provider's models (`accounting_model`,
/// `ca_loop_model`): the named `groups`, refreshed only when the model asks.
pub fn provider_settings(groups: &[&str]) -> ca_asg_provider::provider::ProviderSettings {
    ca_asg_provider::provider::ProviderSettings {
        selector: ca_asg_provider::cloud::GroupSelector {
            names: groups.iter().map(|g| g.to_string()).collect(),
            tag_sets: vec![],
        },
        refresh_interval: Duration::ZERO,
        // Reads that predate a replica's own write are read again at once: the
        // model's stale reads are counted, not timed.
        stale_reread_wait: Duration::from_millis(1),
        ..Default::default()
    }
}

/// The proptest config of the models proptest runs itself (`accounting_model`,
/// `ca_loop_model`): `cases` cases, no failure file written into the tree.
pub fn proptest_cases(cases: u32) -> proptest::test_runner::Config {
    Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    }
}

/// One replica of the service in a drain model whose leadership is a watch the model
/// holds (not the Lease): its drain loop and its lease.
pub struct Replica {
    pub loop_task: tokio::task::JoinHandle<()>,
    pub lease: tokio::sync::watch::Sender<bool>,
}

/// The world's engine leads (by a watch set before its loop starts) and its loop runs.
pub fn lead(w: &World) -> Replica {
    let (lease, rx) = tokio::sync::watch::channel(true);
    w.engine.leadership.follow(rx);
    let loop_task = scalein::sources::hook_scan::spawn_loop(w.engine.clone(), w.provider.clone());
    Replica { loop_task, lease }
}

/// The leader `replica`, its lease already gone, joins `fenced` (alive, stopped where
/// it was) with its `engine`; `replica` holds nothing until a new one leads.
pub fn fence(replica: &mut Replica, fenced: &mut Vec<(Replica, Arc<Engine>)>, engine: Arc<Engine>) {
    let old = std::mem::replace(
        replica,
        Replica {
            loop_task: tokio::spawn(async {}),
            lease: tokio::sync::watch::channel(false).0,
        },
    );
    fenced.push((old, engine));
}

/// What the fenced replicas still run: each one's drains, named (none may).
pub fn fenced_running(fenced: &[(Replica, Arc<Engine>)]) -> Vec<String> {
    fenced
        .iter()
        .filter(|(_, e)| e.drains_at_once() > 0)
        .map(|(_, e)| {
            format!(
                "a fenced replica still runs {} drain(s)",
                e.drains_at_once()
            )
        })
        .collect()
}

/// Ends a case's replicas: the leader's loop, each fenced one's loop and engine, then
/// the world's engine.
pub fn stop(w: &World, leader: &Replica, fenced: &[(Replica, Arc<Engine>)]) {
    leader.loop_task.abort();
    for (r, e) in fenced {
        r.loop_task.abort();
        e.shutdown();
    }
    w.engine.shutdown();
}

/// How many of a model's `nodes` (node, instance, group) of `group` are in service.
pub fn live_in(w: &World, nodes: &[(String, String, &'static str)], group: &str) -> usize {
    nodes
        .iter()
        .filter(|(_, i, g)| *g == group && super::world::in_service(&w.cloud, i))
        .count()
}

/// The drain models' world: `web` (our hook on it), batch (two instances, no hook),
/// `settings`, pods Ready 20 ms after binding, everything in process.
pub fn web_and_batch(web: MemoryGroup, settings: ScaleInSettings) -> WorldBuilder {
    World::builder()
        .group(web)
        .group(MemoryGroup::new("batch", 0, 6, 2, "m5.large"))
        .settings(settings)
        .ready_delay(Duration::from_millis(20))
        .in_process()
}

/// What a case did, to compare two runs of it: every line of the API server's audit
/// and every write that reached it (who sent it), each with its time since `start`
/// on the case's clock, and the count of each AWS call. Two runs of one sequence on
/// the paused clock give the same transcript, line for line (issue 39).
pub fn transcript(
    sim: &ca_asg_provider::sim::SimCluster,
    cloud: &ca_asg_provider::cloud::memory::MemoryCloud,
    start: ca_asg_provider::clock::Instant,
) -> Vec<String> {
    let ms = |at: ca_asg_provider::clock::Instant| at.saturating_duration_since(start).as_millis();
    // An Event's name ends in kube-runtime's stamp of the system clock: its object's
    // name is what the Event is of.
    let named = |kind: &str, name: String| match (kind, name.rsplit_once('.')) {
        ("Event", Some((of, _stamp))) => format!("{of}.*"),
        _ => name,
    };
    let audit = sim.audit().into_iter().map(|e| {
        let name = named(e.kind, e.name);
        format!(
            "{:>7} ms audit {} {} {}/{}",
            ms(e.at),
            e.verb,
            e.kind,
            e.namespace,
            name
        )
    });
    let writes = sim.requests().writes().into_iter().map(|w| {
        format!(
            "{:>7} ms write {} {} by {:?}",
            ms(w.at),
            w.verb,
            w.resource,
            w.user
        )
    });
    let calls = cloud
        .calls()
        .into_iter()
        .map(|(call, n)| format!("aws {call} x{n}"));
    audit.chain(writes).chain(calls).collect()
}

/// Runs `case` (returning its [`transcript`]) `times` times and fails naming the
/// first line where two runs differ.
pub fn assert_replays_exactly(times: usize, case: impl Fn() -> Vec<String>) {
    #[cfg(not(tokio_unstable))]
    panic!("built without --cfg tokio_unstable (.cargo/config.toml; a RUSTFLAGS of your own replaces it): tokio's RNG is not seeded and a case cannot replay exactly");
    let first = case();
    assert!(!first.is_empty(), "a case that did nothing proves nothing");
    for run in 2..=times {
        if std::env::var_os("MODEL_TRANSCRIPT").is_some() {
            eprintln!("=== run {run}");
        }
        let again = case();
        if let Some(i) = (0..first.len().max(again.len())).find(|&i| first.get(i) != again.get(i)) {
            if std::env::var_os("MODEL_TRANSCRIPT").is_some() {
                eprintln!(
                    "run 1:\n{}\nrun {run}:\n{}",
                    first.join("\n"),
                    again.join("\n")
                );
            }
            panic!(
                "run {run} differs from run 1 at line {i} of {}:\n  run 1:   {:?}\n  run {run}: {:?}",
                first.len(),
                first.get(i),
                again.get(i)
            );
        }
    }
}

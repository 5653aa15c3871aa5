//! The lifecycle scan: find instances held in `Terminating:Wait` (whoever started the
//! termination) and start their drains, and resume drains after a restart from what AWS and
//! the Nodes say.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use crate::clock::Instant;
use crate::cloud::{AsgInstance, AsgSnapshot, GroupSelector, LifecycleHook, LifecycleState};
use crate::provider::{Group, Provider};
use crate::scalein::decide::hooks::HOOK_RECORD_TAG;
use crate::scalein::decide::record::End;
use crate::scalein::decide::story::Verdict;
use crate::scalein::engine::keeper::{judge_hold, FoundBy};
use crate::scalein::holds::{AWS_MAX_HEARTBEAT_TIMEOUT, AWS_MIN_HEARTBEAT_TIMEOUT};
use crate::scalein::{DrainRequest, Engine, Mode, ModeChoice, Source};
use crate::telemetry::metrics::metrics;

/// One pass: create missing hooks (when configured), read the lifecycle state of
/// the groups that carry our hook now (not the provider's snapshot, which may be a
/// refresh interval old), and start a drain (and with it the heartbeats) for every
/// instance in Terminating:Wait that is not draining yet; the heartbeats of those
/// held already follow the hook's current timeout. Returns how many started.
pub async fn scan(engine: &Arc<Engine>, provider: &Arc<Provider>) -> usize {
    let reg = provider.registry();
    let hooked = hook_every_group(engine, provider, &reg.groups).await;
    if hooked.is_empty() {
        return 0;
    }
    let Some((fresh, pools)) = read_hooked_groups(engine, hooked).await else {
        return 0;
    };
    let mut found = Vec::new();
    for snap in &fresh {
        let Some(g) = reg.group(&snap.name) else {
            continue;
        };
        let pool = pools.get(&snap.name).map(Vec::as_slice).unwrap_or_default();
        found.extend(scan_group(engine, g, snap, pool).await);
    }
    // Every group judged before any drain starts: the drains found together are
    // started together, so each cordons its node before the first of them evicts
    // (an instance refresh over several groups; `Book::cordons_first`).
    found
        .into_iter()
        .map(|(g, held)| start_drains(engine, &g, held))
        .sum()
}

/// The names of the groups our hook is on, after creating it where it is missing
/// (when configured; a dry run says what it would create).
async fn hook_every_group(engine: &Engine, provider: &Provider, groups: &[Group]) -> Vec<String> {
    let mut hooked = Vec::new();
    for g in groups {
        warn_warm_pool_reuse(engine, g);
        if engine.our_hook(g).is_some() {
            hooked.push(g.asg.name.clone());
            continue;
        }
        warn_foreign_hooks(engine, g);
        if engine.settings.create_hook && engine.settings.mode == ModeChoice::Auto {
            create_hook(engine, provider, g).await;
        }
    }
    hooked
}

/// Puts our EC2_INSTANCE_TERMINATING hook on `g` (its timeout within AWS's bounds),
/// and tells the provider at once, so the next poll does not put it again.
async fn create_hook(engine: &Engine, provider: &Provider, g: &Group) {
    if engine.settings.dry_run {
        if engine.book.note_once("dry-run hook", g.asg.name.clone()) {
            crate::telemetry::metrics::metrics().dry_run("CreateLifecycleHook");
            tracing::info!(group = %g.asg.name, hook = %engine.settings.hook_name, "dry run: would create the EC2_INSTANCE_TERMINATING lifecycle hook");
        }
        return;
    }
    let hook = LifecycleHook {
        name: engine.settings.hook_name.clone(),
        heartbeat_timeout_secs: engine
            .settings
            .hook_heartbeat_timeout
            .clamp(AWS_MIN_HEARTBEAT_TIMEOUT, AWS_MAX_HEARTBEAT_TIMEOUT)
            .as_secs() as i32,
        default_result: "CONTINUE".into(),
    };
    // The record first: a hook this service puts always carries it, so the
    // `remove-hooks` command at uninstall can tell it from one it did not create.
    // Without it (an IAM policy that predates the record), the hook is still put: the
    // drains it protects matter more, and `remove-hooks` then lists it as unmarked.
    let recorded = match engine
        .cloud
        .tag_group(&g.asg.name, HOOK_RECORD_TAG, &hook.name)
        .await
    {
        Ok(()) => true,
        Err(e) => {
            tracing::warn!(group = %g.asg.name, hook = %hook.name, tag = HOOK_RECORD_TAG, error = %e, "could not record on the group that this service created its lifecycle hook; `ca-asg-provider remove-hooks` will not remove it without --include-unmarked (check that the IAM policy allows autoscaling:CreateOrUpdateTags)");
            false
        }
    };
    match engine.cloud.put_terminating_hook(&g.asg.name, &hook).await {
        Ok(()) => {
            tracing::info!(group = %g.asg.name, hook = %hook.name, "created EC2_INSTANCE_TERMINATING lifecycle hook");
            let mut hooks = g.hooks.clone();
            hooks.push(hook);
            provider.note_hooks(&g.asg.name, hooks);
        }
        Err(e) => {
            tracing::warn!(group = %g.asg.name, error = %e, "could not create the lifecycle hook");
            // No hook of ours: no record of one either, or a hook of the same name put
            // later by someone else would be taken for ours and removed at uninstall.
            // (The next poll records and puts again.)
            if recorded {
                if let Err(e) = engine.cloud.untag_group(&g.asg.name, HOOK_RECORD_TAG).await {
                    tracing::warn!(group = %g.asg.name, tag = HOOK_RECORD_TAG, error = %e, "could not remove the record of a lifecycle hook that was not created; the next poll tries again");
                }
            }
        }
    }
}

/// The hooked groups as AWS shows them now, and their warm pools; the finished
/// actions of instances no longer on their way out forgotten. `None`: the groups
/// cannot be read (the next poll retries).
async fn read_hooked_groups(
    engine: &Engine,
    hooked: Vec<String>,
) -> Option<(Vec<AsgSnapshot>, BTreeMap<String, Vec<AsgInstance>>)> {
    let selector = GroupSelector {
        names: hooked,
        tag_sets: Vec::new(),
    };
    // What the Nodes say decides which holds are new: our action completed by an
    // earlier process (the record), a Node for a pool-bound wait. A fresh process
    // reads them first, or it would take a finished action for a new one and drain
    // the node again (bounded: a Node list that never comes leaves the scan to AWS's
    // word, as before).
    engine.tools.nodes.ready(Duration::from_secs(30)).await;
    let fresh = match engine.cloud.describe_groups(&selector).await {
        Ok(f) => f,
        Err(e) => {
            tracing::warn!(error = %e, "lifecycle scan: cannot read the hooked groups; next poll retries");
            return None;
        }
    };
    let pools = warm_pools(engine, &fresh).await;
    // Ended actions are remembered only while AWS still shows their instance on
    // its way out (in the group, or in its warm pool): one back in service (reused
    // from the pool) has no finished action of ours any more, and its next hold is
    // a new one.
    engine.book.forget_actions_done(|id| {
        fresh
            .iter()
            .flat_map(|s| s.instances.iter())
            .chain(pools.values().flatten())
            .any(|i| i.id == id && i.state != LifecycleState::InService && !i.state.is_pending())
    });
    Some((fresh, pools))
}

/// One hooked group: the Nodes that came back from its warm pool while warming are
/// handed back; of the instances our hook holds, those held already follow the
/// hook's current timeout. The others, whose drains are to start, with the group as
/// AWS has it now.
async fn scan_group<'a>(
    engine: &Arc<Engine>,
    g: &Group,
    snap: &'a AsgSnapshot,
    pool: &'a [AsgInstance],
) -> Option<(Group, Vec<&'a AsgInstance>)> {
    crate::scalein::sources::warm_pool::registered_while_warming(engine, &snap.name, pool).await;
    let waiting = held_by_our_hook(engine, g, snap, pool).await;
    let (held, found): (Vec<&AsgInstance>, Vec<_>) = waiting
        .into_iter()
        .partition(|i| engine.holds_hook(&i.id) && engine.is_draining(&i.id));
    if found.is_empty() && held.is_empty() {
        return None;
    }
    // The hook as AWS has it now (a changed heartbeat timeout counts at once):
    // one read per group with something held.
    let (g, fresh) = match engine.with_current_hooks(g).await {
        Ok(fresh) => (fresh, true),
        Err(e) => {
            tracing::warn!(group = %g.asg.name, error = %e, "lifecycle scan: using the known hook list");
            (g.clone(), false)
        }
    };
    // Held already: only the heartbeat timeout is corrected, should the hook's
    // have changed since the hold started (never from the known list).
    for inst in held.into_iter().filter(|_| fresh) {
        if let Mode::Lifecycle {
            action,
            heartbeat_timeout,
        } = engine.mode_for(&g, &inst.id)
        {
            engine.hold(&action, heartbeat_timeout);
        }
    }
    Some((g, found))
}

/// The instances of the group and its pool that our hook holds.
///
/// An instance our hook holds is heartbeated and drained whatever else drains it
/// already (a rebalance or retirement drain, the drain command): the lifecycle reason
/// joins that drain. An instance whose action of our hook is over may wait on another
/// hook (EKS's on a managed node group): it is not held by ours, nor a new one.
/// Whose each hold is, [`judge_hold`] says, as for the queue; a wait on the way into
/// the warm pool is asked about only where our hook is on the group (launch hooks
/// alone hold a new instance warming up there).
async fn held_by_our_hook<'a>(
    engine: &Engine,
    g: &Group,
    snap: &'a AsgSnapshot,
    pool: &'a [AsgInstance],
) -> Vec<&'a AsgInstance> {
    let hooked = engine.our_hook(g).is_some();
    let mut waiting = Vec::new();
    for i in snap.instances.iter().chain(pool) {
        let held = LifecycleState::OUR_HOLD.contains(&i.state)
            && (hooked || !i.state.is_pool_bound_wait() || engine.is_draining(&i.id));
        // Cannot tell (AWS unanswered, a completion remembered): the hold goes by
        // until AWS answers, at the next poll.
        if held
            && judge_hold(engine, &snap.name, &i.id, &i.state, FoundBy::Lists).await
                == Verdict::Ours
        {
            waiting.push(i);
        }
    }
    waiting
}

/// Starts the drain of each newly found hold (in lifecycle mode). Returns how many
/// started.
fn start_drains(engine: &Arc<Engine>, g: &Group, found: Vec<&AsgInstance>) -> usize {
    let mut started = 0;
    for inst in found {
        let mode = engine.mode_for(g, &inst.id);
        if !matches!(mode, Mode::Lifecycle { .. }) {
            continue;
        }
        if engine
            .start(DrainRequest::lifecycle(&inst.id, &g.asg.name, mode, None))
            .acted()
        {
            started += 1;
        }
    }
    started
}

/// The instances of each hooked group's warm pool (DescribeWarmPool), for the
/// groups that have one: our EC2_INSTANCE_TERMINATING hook holds an instance the
/// ASG sends back to the pool (`Warmed:Pending:Wait`) and one the pool ends
/// (`Warmed:Terminating:Wait`), and neither is in the group's own list. A group
/// whose pool cannot be read now is left to the next poll.
async fn warm_pools(
    engine: &Engine,
    fresh: &[crate::cloud::AsgSnapshot],
) -> BTreeMap<String, Vec<AsgInstance>> {
    let mut pools = BTreeMap::new();
    for snap in fresh.iter().filter(|s| s.warm_pool.is_some()) {
        match engine.cloud.warm_pool_instances(&snap.name).await {
            Ok(instances) => {
                crate::scalein::sources::warm_pool::count_states(&snap.name, &instances);
                pools.insert(snap.name.clone(), instances);
            }
            Err(e) => {
                tracing::warn!(group = %snap.name, error = %e, "lifecycle scan: cannot read the group's warm pool; next poll retries");
            }
        }
    }
    pools
}

/// A warm pool that reuses instances on scale-in: said once per group, with what
/// this service does about it.
fn warn_warm_pool_reuse(engine: &Engine, g: &Group) {
    if g.asg
        .warm_pool
        .as_ref()
        .is_some_and(|p| p.reuse_on_scale_in)
        && engine.book.note_once("warm pool reuse", g.asg.name.clone())
    {
        let note = if engine.our_hook(g).is_some() {
            "the group's warm pool reuses instances on scale-in: an instance going back to the pool is drained through our hook in Warmed:Pending:Wait, and its Node is handed back when it leaves the pool (docs/node-groups.md)"
        } else {
            "the group's warm pool reuses instances on scale-in, and the group has no EC2_INSTANCE_TERMINATING hook of ours: an instance the ASG sends back to the pool is not drained and stops with its pods; add the hook (docs/node-groups.md)"
        };
        tracing::warn!(group = %g.asg.name, "{note}");
    }
}

/// Another EC2_INSTANCE_TERMINATING hook on a group (NTH's, another tool's) means
/// two drainers completing each other's actions: say so once per group and hook.
/// EKS's own hook on a managed node group is no such drainer: say what it does, once.
fn warn_foreign_hooks(engine: &Engine, g: &Group) {
    for h in &g.hooks {
        let Some((warning, note)) = crate::scalein::decide::hooks::direct_mode_note(
            &g.asg.name,
            &h.name,
            &engine.settings.hook_name,
            &g.asg.tags,
        ) else {
            continue;
        };
        if !engine
            .book
            .note_once("foreign hook", format!("{}/{}", &g.asg.name, &h.name))
        {
            continue;
        }
        if warning {
            tracing::warn!(group = %g.asg.name, hook = %h.name, ours = %engine.settings.hook_name, "{note}");
        } else {
            tracing::info!(group = %g.asg.name, hook = %h.name, ours = %engine.settings.hook_name, "{note}");
        }
    }
}

/// Resumes the drains recorded on Nodes (after a restart, or started by another
/// replica) with every reason, time and budget they carry. Those our hook holds are
/// found by [`scan`] from AWS; finished and cordon-only records drain nothing.
/// Returns how many resumed.
pub async fn resume(engine: &Arc<Engine>, provider: &Arc<Provider>) -> usize {
    engine.tools.nodes.ready(Duration::from_secs(30)).await;
    let limits = engine.limits();
    let mut n = 0;
    let mut direct: Vec<(
        String,
        String,
        Vec<crate::scalein::decide::record::DrainReason>,
    )> = Vec::new();
    for mark in engine.tools.nodes.marked_for_drain() {
        let Some(iid) = mark.instance else { continue };
        if engine.is_draining(&iid) {
            continue;
        }
        let plan = mark.record.plan(limits);
        if !plan.drains {
            continue;
        }
        match plan.ends {
            // The scan finds it held in Terminating:Wait and joins every reason.
            End::Lifecycle { .. } => {}
            End::Terminate => direct.push((mark.node, iid, mark.record.reasons)),
            // An interruption or the drain command: AWS ends the instance, or
            // nobody does; the record's budget goes on.
            End::Leave => {
                let node = mark.node;
                if engine
                    .start(DrainRequest {
                        instance_id: iid.clone(),
                        group: mark.group,
                        node_name: Some(node.clone()),
                        mode: Mode::DrainOnly,
                        source: Source::Resume,
                        reasons: mark.record.reasons,
                        noticed: None,
                    })
                    .acted()
                {
                    tracing::info!(node = %node, instance = %iid, "resuming a drain recorded on the Node");
                    n += 1;
                }
            }
        }
    }
    if direct.is_empty() {
        return n;
    }
    let reg = provider.registry();
    // AWS, not the snapshot, says whether the instance is still there to end.
    let ids: Vec<String> = direct.iter().map(|(_, i, _)| i.clone()).collect();
    let live = match engine.cloud.locate_instances(&ids).await {
        Ok(found) => found,
        Err(e) => {
            tracing::warn!(error = %e, "cannot check marked instances; resume later");
            return n;
        }
    };
    for (node, iid, reasons) in direct {
        let Some(loc) = live.iter().find(|l| l.instance_id == iid) else {
            continue;
        };
        if loc.state.is_terminating() {
            continue;
        }
        let Some(g) = reg.group(&loc.group) else {
            tracing::warn!(node = %node, instance = %iid, "node marked for drain but its instance is in no managed group");
            continue;
        };
        if !engine.settings.dry_run {
            provider.register_deferred(&iid, &g.asg.name);
        }
        if engine
            .start(DrainRequest {
                instance_id: iid.clone(),
                group: g.asg.name.clone(),
                node_name: Some(node.clone()),
                mode: Mode::Direct,
                source: Source::Resume,
                reasons,
                noticed: None,
            })
            .acted()
        {
            tracing::info!(node = %node, instance = %iid, "resuming drain after restart");
            n += 1;
        }
    }
    n
}

/// The background loop. While this replica leads (always, without leader election):
/// resume drains recorded on Nodes (after a restart, or marked by another replica) and
/// scan AWS for instances in Terminating:Wait, every poll interval. A replica that
/// stops leading stops its drains where they are; the new leader resumes them.
pub fn spawn_loop(engine: Arc<Engine>, provider: Arc<Provider>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        while !provider.is_loaded() {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let mut leadership = engine.leadership.receiver();
        let mut was_leader = false;
        // A turn scans the hooked groups and starts drains (they run in their own
        // tasks): minutes without one means a call that never returns.
        let quiet = (engine.settings.lifecycle_poll_interval * 4).max(Duration::from_secs(120));
        // When the last scan ran: a turn sooner than the poll interval, only to follow
        // Nodes resting in a warm pool (ScanSchedule::follow_soon), does not scan.
        let mut scanned: Option<Instant> = None;
        loop {
            engine.tools.liveness.beat("drain loop", quiet);
            let leader = engine.is_leader();
            metrics().leader.set(i64::from(leader));
            if leader {
                let due = scanned
                    .is_none_or(|at| at.elapsed() >= engine.settings.lifecycle_poll_interval)
                    || engine.schedule.scanning_soon();
                if due {
                    scanned = Some(Instant::now());
                    // Lifecycle actions first: they expire; marked direct drains wait.
                    scan(&engine, &provider).await;
                    resume(&engine, &provider).await;
                }
                crate::scalein::sources::warm_pool::follow(&engine, &provider).await;
            } else if was_leader {
                scanned = None;
                tracing::warn!(
                    drains = engine.drains_at_once(),
                    "lost leadership: stopping drains where they are for the new leader"
                );
                engine.abort_all();
            }
            was_leader = leader;
            let poll = tokio::time::sleep(
                engine
                    .schedule
                    .next_turn_in(engine.settings.lifecycle_poll_interval),
            );
            match leadership.as_mut() {
                Some(rx) => {
                    tokio::select! {
                        biased;
                        _ = poll => {}
                        _ = engine.schedule.asked() => {}
                        changed = rx.changed() => if changed.is_err() { leadership = None },
                    }
                }
                None => tokio::select! {
                    biased;
                    _ = poll => {}
                    _ = engine.schedule.asked() => {}
                },
            }
        }
    })
}

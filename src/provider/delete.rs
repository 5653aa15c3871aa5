//! DeleteNodes as cluster-autoscaler sends it: one call per node, ten (or fifty) at
//! once, each under CA's call deadline (`core/scaledown/actuation/actuator.go`,
//! `delete_in_batch.go` with the default `--node-deletion-batcher-interval=0`).
//!
//! Size changes are serialized (the provider's size lock), so that the target CA
//! reads, the desired capacity written to AWS and the instances being removed always
//! agree. A call that waited for that lock behind the others, one after another,
//! would spend its whole deadline queueing. Instead, calls for a group that arrive
//! while the lock is held join one batch: when the lock comes free, the batch reads
//! the group once, checks each call on its own (a bad node fails its call only; the
//! minimum size counts every call before it), and records every removal side by
//! side. Each call still gets its own answer, within its own deadline.
//!
//! What a call may be told keeps true, however late AWS answers:
//! - a call learns what was started for it (its share) before any of it starts: the
//!   share is handed over through the call's channel first and started only if the
//!   hand-over went through, so a caller that gave up before has nothing started, and
//!   one that gives up after finds its share as it leaves ([`receive`]);
//! - placeholders are given up by one SetDesiredCapacity for the batch, under the rule
//!   of the size changes ([`super::bound`]): each call carries its bound, the batch's
//!   read of the group counts as the call's read, and a call without the write's
//!   reserve left is answered that nothing was changed. A write AWS answers past a
//!   call's bound is told as sent (it may land), never as "nothing removed";
//! - the batch's real removals start only after that write has answered: it is an
//!   absolute value computed from the target before them, and a termination with
//!   decrement landing before it would be undone by it.

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::FutureExt;
use tokio::sync::{oneshot, OwnedMutexGuard};

use super::bound::Bound;
use super::registry::Registry;
use super::{
    echo, instances, provider_id, sizes, Group, NodeRef, Provider, ProviderError, Removal, ScaleIn,
};
use crate::clock::Instant;
use crate::cloud::AsgInstance;

/// The removals handed to a call: per instance, the answer of its removal's task.
type Removals = Vec<(String, oneshot::Receiver<Result<(), ProviderError>>)>;

/// What a call is handed, through its channel, before any of it starts.
pub(super) enum Share {
    /// Its removals (none: nothing of it was left to do), started once handed over.
    Removals(Removals),
    /// Its placeholders are in the batch's SetDesiredCapacity `desired`, sent once
    /// every call of the write has its share; its removals follow on `then` once AWS
    /// has answered the write (or the write's error does).
    Write {
        desired: i32,
        then: oneshot::Receiver<Result<Share, ProviderError>>,
    },
}

/// The channel a call's share is handed over through.
type Hand = oneshot::Sender<Result<Share, ProviderError>>;

/// One DeleteNodes call waiting in its group's batch.
pub(super) struct DeleteCall {
    nodes: Vec<NodeRef>,
    /// When it must answer, and how much of that a write must find left.
    bound: Arc<Bound>,
    started: Hand,
}

/// Instances of the group to remove, each with the node name CA gave.
type ToRemove<'g> = Vec<(&'g AsgInstance, String)>;

/// What one call of a batch asks for, once checked against the group.
struct Planned<'g> {
    call: DeleteCall,
    real: ToRemove<'g>,
    placeholders: i32,
}

impl Provider {
    /// Removes nodes from a group, bounded by
    /// [`super::ProviderSettings::delete_nodes_bound`] (see [`Self::delete_nodes_within`]).
    pub async fn delete_nodes(
        self: &Arc<Self>,
        id: &str,
        nodes: &[NodeRef],
    ) -> Result<(), ProviderError> {
        self.delete_nodes_within(id, nodes, self.settings.delete_nodes_bound)
            .await
    }

    /// How long DeleteNodes works when the caller sent no deadline.
    pub fn delete_nodes_bound(&self) -> Duration {
        self.settings.delete_nodes_bound
    }

    /// Removes nodes from a group. Checks everything before touching anything: every
    /// node must belong to the group, and the group must stay at or above its
    /// minimum, counting the calls recorded with it. Instances already on their way
    /// out are skipped (CA re-sends).
    ///
    /// Answers within `bound` (the gRPC layer passes what is left of CA's deadline):
    /// the removals are recorded (the instance terminated into its hook, or the drain
    /// marked on its Node) side by side, each as a task of its own, and the drains
    /// run behind them. When the bound passes before the call's removals start, none
    /// is started; when it passes while they are being recorded, the call fails and
    /// the recording finishes behind the answer, honoured like any other. Placeholders
    /// are given up as a size change is made ([`super::bound`]): with too little of
    /// the bound left for AWS to answer the write, nothing is changed; a write AWS
    /// answers past the bound is told as sent, and it may land.
    pub async fn delete_nodes_within(
        self: &Arc<Self>,
        id: &str,
        nodes: &[NodeRef],
        bound: Duration,
    ) -> Result<(), ProviderError> {
        let call = Arc::new(Bound::new("DeleteNodes", id, Some(bound)));
        let deadline = call.deadline().unwrap_or_else(|| Instant::now() + bound);
        let mut started = self.join_delete_batch(id, nodes.to_vec(), call.clone());
        let share = receive(&mut started, deadline, || {
            ProviderError::Unavailable(format!(
                "DeleteNodes for node group {}: no answer from AWS or the Kubernetes API within {bound:?}; no instance was removed; retry",
                echo(id)
            ))
        })
        .await
        .unwrap_or_else(|| {
            Err(ProviderError::Unavailable(format!(
                "DeleteNodes for node group {}: the service stopped before recording it; no instance was removed; retry",
                echo(id)
            )))
        })?;
        let tasks = match share {
            Share::Removals(tasks) => tasks,
            Share::Write { desired, mut then } => {
                // Sent to AWS (or about to be): past the bound, or if the batch stopped,
                // it may have landed.
                match receive(&mut then, deadline, || call.sent(desired)).await {
                    Some(Ok(Share::Removals(tasks))) => tasks,
                    Some(Ok(Share::Write { .. })) | None => return Err(call.sent(desired)),
                    Some(Err(e)) => return Err(e),
                }
            }
        };
        let mut failed = None;
        let mut late = Vec::new();
        for (instance, mut task) in tasks {
            match tokio::time::timeout_at(deadline, &mut task).await {
                Ok(Ok(Ok(()))) => {}
                Ok(Ok(Err(e))) => {
                    failed.get_or_insert(e);
                }
                Ok(Err(_)) => {
                    failed.get_or_insert(ProviderError::Unavailable(format!(
                        "removing instance {instance}: the removal stopped before it was recorded"
                    )));
                }
                Err(_) => late.push(instance),
            }
        }
        self.invalidate();
        if let Some(e) = failed {
            return Err(e);
        }
        if !late.is_empty() {
            return Err(ProviderError::Unavailable(format!(
                "DeleteNodes for node group {}: the removal of {} was not recorded within {bound:?} (AWS or the Kubernetes API is slow); it goes on and shows as deleting once recorded",
                echo(id),
                late.join(", ")
            )));
        }
        Ok(())
    }

    /// Adds a call to its group's open batch, or opens one (and the task that runs
    /// it once the size lock is free). The answer says what the call started.
    fn join_delete_batch(
        self: &Arc<Self>,
        id: &str,
        nodes: Vec<NodeRef>,
        bound: Arc<Bound>,
    ) -> oneshot::Receiver<Result<Share, ProviderError>> {
        let (started, answer) = oneshot::channel();
        let first = {
            let mut batches = self.delete_batches.lock();
            let calls = batches.entry(id.to_string()).or_default();
            calls.push(DeleteCall {
                nodes,
                bound,
                started,
            });
            calls.len() == 1
        };
        if first {
            let (me, id) = (self.clone(), id.to_string());
            tokio::spawn(async move { me.run_delete_batch(&id).await });
        }
        answer
    }

    /// Waits for the size lock, closes the group's batch and records it. Calls whose
    /// caller gave up meanwhile are dropped before anything is touched.
    async fn run_delete_batch(self: Arc<Self>, id: &str) {
        let ops = Arc::new(self.ops.clone().lock_owned().await);
        let calls: Vec<DeleteCall> = self
            .delete_batches
            .lock()
            .remove(id)
            .unwrap_or_default()
            .into_iter()
            .filter(|c| !c.started.is_closed())
            .collect();
        if calls.is_empty() {
            return;
        }
        if calls.len() > 1 {
            tracing::debug!(
                group = id,
                calls = calls.len(),
                "DeleteNodes calls recorded together"
            );
        }
        self.start_removals(id, calls, ops).await;
    }

    /// A batch of DeleteNodes up to its removals: one read of the group, each call
    /// checked in arrival order, placeholders given up in one write, and one task per
    /// instance to remove (holding the size lock until the last one is done). Every
    /// call is answered through its own channel, and handed its share before any of
    /// it starts.
    async fn start_removals(
        self: &Arc<Self>,
        id: &str,
        calls: Vec<DeleteCall>,
        ops: Arc<OwnedMutexGuard<()>>,
    ) {
        let scale_in = self.scale_in.read().clone();
        let (reg, shared) = match self.read_batch(id, &calls, scale_in.as_ref()).await {
            Ok(x) => x,
            Err(e) => {
                for c in calls {
                    let _ = c.started.send(Err(e.clone()));
                }
                return;
            }
        };
        let g = &*shared;
        let (target, live, deferred) = {
            let ov = self.overlay.lock();
            (
                Self::target_of(&ov, g),
                Self::live_count(&ov, g),
                Self::deferred_in(&ov, g),
            )
        };
        let planned = self.plan_batch(&reg, g, calls, target, live);
        if self.settings.dry_run {
            self.refuse_in_dry_run(g, target, planned).await;
            return;
        }
        let (writing, rest): (Vec<_>, Vec<_>) =
            planned.into_iter().partition(|p| p.placeholders > 0);
        let written = self.write_placeholders(g, target, deferred, writing).await;
        // Every real removal starts only now, the placeholders' write answered: that
        // absolute value, computed from the target before the removals, would undo a
        // decrement landed before it. A caller that left meanwhile has none started.
        let rest = rest.into_iter().map(|p| (p.real, p.call.started));
        for (real, hand) in written.into_iter().chain(rest) {
            let (tasks, work) = self.prepare_removals(real, &shared, &scale_in, id, &ops);
            hand_over(hand, Share::Removals(tasks), work);
        }
    }

    /// The batch's one read of the group with its hooks confirmed beside it, counted
    /// in each call's bound.
    async fn read_batch(
        &self,
        id: &str,
        calls: &[DeleteCall],
        scale_in: &dyn ScaleIn,
    ) -> Result<(Arc<Registry>, Arc<Group>), ProviderError> {
        let t0 = Instant::now();
        let read = match self.require_drain_state() {
            Ok(()) => self.read_group_and_hooks(id, scale_in).await,
            Err(e) => Err(e),
        };
        // Each call's read, as a size change's own read counts for its write's reserve.
        let took = t0.elapsed();
        for c in calls {
            c.bound.note_read(took);
        }
        read
    }

    /// Each call checked in arrival order against the group and what the calls
    /// before it took: its nodes in the group, the group kept at its minimum, its
    /// placeholders within the unfulfilled capacity, a size change only with enough of
    /// its bound left. A call refused is told; a caller that gave up is left out.
    fn plan_batch<'g>(
        &self,
        reg: &Registry,
        g: &'g Group,
        calls: Vec<DeleteCall>,
        target: i32,
        live: i32,
    ) -> Vec<Planned<'g>> {
        let id = g.asg.name.as_str();
        // Placeholders beyond the unfulfilled capacity are already gone: a slot whose
        // number is past it now (filled by a launch, or given up by an earlier call),
        // and any past the count this batch gives up.
        let slots = (target - live).max(0);
        let mut unfulfilled = slots;
        let mut taken: BTreeSet<String> = BTreeSet::new();
        let mut removed = 0i32;
        let mut planned: Vec<Planned<'g>> = Vec::new();
        // A caller that gave up while the group was read was told nothing started.
        for call in calls.into_iter().filter(|c| !c.started.is_closed()) {
            let (real, placeholders) = match self.plan_call(reg, g, &call.nodes, &taken, slots) {
                Ok(p) => p,
                Err(e) => {
                    let _ = call.started.send(Err(e));
                    continue;
                }
            };
            let named = placeholders;
            let placeholders = (named.len() as i32).min(unfulfilled);
            let count = placeholders + real.len() as i32;
            if let Err(e) = sizes::check_delete(id, target - removed, g.min, count) {
                let _ = call.started.send(Err(e));
                continue;
            }
            // Giving up placeholders is a size change: its write starts only with
            // enough of the call's bound left for AWS to answer it (a dry run writes
            // nothing).
            if placeholders > 0 && !self.settings.dry_run {
                if let Err(e) = call.bound.may_write() {
                    let _ = call.started.send(Err(e));
                    continue;
                }
            }
            unfulfilled -= placeholders;
            removed += count;
            taken.extend(real.iter().map(|(i, _)| i.id.clone()));
            taken.extend(named);
            planned.push(Planned {
                call,
                real,
                placeholders,
            });
        }
        // Nothing is started for a caller that gave up meanwhile (see below).
        planned.retain(|p| !p.call.started.is_closed());
        planned
    }

    /// The placeholders the calls give up, in one SetDesiredCapacity. Returns the calls
    /// whose write AWS took, each with its real removals and the channel they go
    /// through; the others are told why and start nothing.
    async fn write_placeholders<'g>(
        &self,
        g: &Group,
        target: i32,
        deferred: i32,
        writing: Vec<Planned<'g>>,
    ) -> Vec<(ToRemove<'g>, Hand)> {
        let id = g.asg.name.as_str();
        if writing.is_empty() {
            return Vec::new();
        }
        let placeholders: i32 = writing.iter().map(|p| p.placeholders).sum();
        let new = target - placeholders;
        let desired = match sizes::desired_for(id, new, deferred, g.asg.max_size) {
            Ok(desired) => desired,
            Err(e) => {
                for p in writing {
                    let _ = p.call.started.send(Err(e.clone()));
                }
                return Vec::new();
            }
        };
        // Each call of the write is handed its share before the write is sent: from
        // then on its caller, whenever it leaves, tells it as sent.
        let mut handed = Vec::with_capacity(writing.len());
        let mut left = false;
        for p in writing {
            let (then, share) = oneshot::channel();
            let share = Share::Write {
                desired,
                then: share,
            };
            if p.call.started.send(Ok(share)).is_ok() {
                handed.push((p.real, then));
            } else {
                left = true;
            }
        }
        let answer = if left {
            // A caller left between the check above and its hand-over: it said nothing
            // was removed, and the write counts its placeholders. The write is not sent.
            Err(ProviderError::Unavailable(format!(
                "DeleteNodes for node group {}: a call recorded with this one gave up before the placeholders were written; nothing was changed; retry",
                echo(id)
            )))
        } else {
            tracing::info!(
                group = id,
                from = target,
                to = new,
                desired,
                "removing {placeholders} placeholder(s)"
            );
            self.write_desired(id, desired).await
        };
        match answer {
            Ok(()) => handed,
            // The calls that gave up placeholders fail whole, nothing of theirs
            // started; the others go on.
            Err(e) => {
                for (_, then) in handed {
                    let _ = then.send(Err(e.clone()));
                }
                Vec::new()
            }
        }
    }

    /// One call's removals, built but not started: the receivers its caller waits on,
    /// and the work that answers each (started by [`hand_over`]).
    fn prepare_removals(
        self: &Arc<Self>,
        real: ToRemove<'_>,
        group: &Arc<Group>,
        scale_in: &Arc<dyn ScaleIn>,
        id: &str,
        ops: &Arc<OwnedMutexGuard<()>>,
    ) -> (Removals, Vec<BoxFuture<'static, ()>>) {
        let mut tasks: Removals = Vec::with_capacity(real.len());
        let mut work = Vec::with_capacity(real.len());
        for (inst, node_name) in real {
            let name = (!node_name.is_empty() && node_name != inst.id).then_some(node_name);
            let (me, group, scale_in, inst, id, ops) = (
                self.clone(),
                group.clone(),
                scale_in.clone(),
                inst.clone(),
                id.to_string(),
                ops.clone(),
            );
            let (answer, answered) = oneshot::channel();
            tasks.push((inst.id.clone(), answered));
            work.push(
                async move {
                    let _ops = ops;
                    me.writes.fetch_add(1, Ordering::AcqRel);
                    let g = &*group;
                    let done = match scale_in.remove(g, &inst, name.as_deref()).await {
                        Ok(Removal::Decremented) => {
                            Self::note_decrement(&mut me.overlay.lock(), &id, Some(g), &inst.id);
                            Ok(())
                        }
                        Ok(Removal::Deferred) => {
                            me.register_deferred(&inst.id, &id);
                            Ok(())
                        }
                        Err(e) => Err(e),
                    };
                    let _ = answer.send(done);
                }
                .boxed(),
            );
        }
        (tasks, work)
    }

    /// The group read from AWS now, with the hooks the removals must use confirmed
    /// beside that read ([`super::ScaleIn::confirm_hooks`]): a hooked batch takes two
    /// AWS round trips before its answers (the read, then the terminations), not three.
    async fn read_group_and_hooks(
        &self,
        id: &str,
        scale_in: &dyn ScaleIn,
    ) -> Result<(Arc<Registry>, Arc<Group>), ProviderError> {
        let known = self.registry().group(id).cloned();
        let confirm = async {
            match &known {
                Some(g) => scale_in.confirm_hooks(g).await,
                None => Ok(None),
            }
        };
        let (read, hooks) = tokio::join!(self.fresh_group(id), confirm);
        let (reg, idx) = read?;
        let mut group = reg.groups[idx].clone();
        if let Some(hooks) = hooks? {
            group.hooks = hooks;
        }
        Ok((reg, Arc::new(group)))
    }

    /// One call's nodes checked against the group: the instances to remove (with
    /// their node names) and the placeholders it names. Instances already on
    /// their way out, or taken by an earlier call of the batch, are skipped.
    fn plan_call<'g>(
        &self,
        reg: &Registry,
        g: &'g Group,
        nodes: &[NodeRef],
        taken: &BTreeSet<String>,
        slots: i32,
    ) -> Result<(ToRemove<'g>, Vec<String>), ProviderError> {
        let id = g.asg.name.as_str();
        let mut real = Vec::new();
        let mut placeholders = Vec::new();
        let mut seen = BTreeSet::new();
        let ov = self.overlay.lock();
        for n in nodes {
            let pid = if n.provider_id.is_empty() {
                &n.name
            } else {
                &n.provider_id
            };
            let iid = provider_id::instance_id(pid).ok_or_else(|| {
                ProviderError::InvalidArgument(format!(
                    "node {}: providerID {} is not an AWS instance",
                    echo(&n.name),
                    echo(&n.provider_id)
                ))
            })?;
            if !seen.insert(iid.to_string()) {
                continue;
            }
            if instances::placeholder_group(iid).as_deref() == Some(id) {
                match instances::placeholder_index(iid) {
                    // A placeholder an earlier call of the batch named is given up
                    // once: its slot is that call's.
                    Some(n) if n < slots as usize && !taken.contains(iid) => {
                        placeholders.push(iid.to_string())
                    }
                    // CA asks for a slot it saw in an older list (it gave up another
                    // placeholder meanwhile, as a long-unregistered node): the slot is
                    // gone, there is nothing to give up.
                    _ => tracing::debug!(
                        group = id,
                        placeholder = iid,
                        slots,
                        "placeholder already gone; skipped"
                    ),
                }
                continue;
            }
            match g.asg.instances.iter().find(|i| i.id == iid) {
                Some(inst)
                    if inst.state.is_terminating()
                        || Self::is_deleting(&ov, iid)
                        || taken.contains(iid) =>
                {
                    tracing::debug!(group = id, instance = iid, "already terminating; skipped");
                }
                // Outside the desired capacity: ended with a decrement, the ASG would
                // have one slot less than the instances that fill them and end one of
                // its own choosing. Left to the operator who put it there.
                Some(inst) if inst.state.is_standby() => {
                    return Err(ProviderError::FailedPrecondition(format!(
                        "node {}: instance {} of node group {id} is in {}, outside the group's desired capacity: ending it with a decrement would make the ASG end another instance; take it out of Standby (exit-standby) or end it without a decrement",
                        echo(&n.name),
                        inst.id,
                        inst.state.as_str()
                    )));
                }
                Some(inst) => real.push((inst, n.name.clone())),
                // Gone from the group already (CA's cached list still names it, as an
                // unregistered node): nothing to end, and no slot to give up (the ASG
                // relaunches it, or its placeholder goes through this call later).
                None if ov.known.group_left(iid) == Some(id) => {
                    tracing::debug!(
                        group = id,
                        instance = iid,
                        "already gone from the group; skipped"
                    );
                }
                None => {
                    let owner = reg
                        .group_of_instance(iid)
                        .map(|o| o.asg.name.clone())
                        .or_else(|| ov.known.located(iid).map(str::to_string));
                    return Err(ProviderError::InvalidArgument(match owner {
                        Some(o) => format!(
                            "node {} (instance {iid}) belongs to node group {o}, not {id}",
                            echo(&n.name)
                        ),
                        None => format!(
                            "node {} (instance {iid}) is not in node group {id}",
                            echo(&n.name)
                        ),
                    }));
                }
            }
        }
        Ok((real, placeholders))
    }

    /// `serve --dry-run`: each call is answered with what it would have done.
    async fn refuse_in_dry_run(&self, g: &Group, target: i32, planned: Vec<Planned<'_>>) {
        let scale_in = self.scale_in.read().clone();
        let mut from = target;
        for p in planned {
            let mut would = Vec::new();
            if p.placeholders > 0 {
                would.push(format!(
                    "would remove {} placeholder(s) (target {from} -> {})",
                    p.placeholders,
                    from - p.placeholders
                ));
                from -= p.placeholders;
            }
            for (inst, node_name) in &p.real {
                let name =
                    (!node_name.is_empty() && *node_name != inst.id).then_some(node_name.as_str());
                would.push(scale_in.preview(g, inst, name).await);
            }
            let _ = p
                .call
                .started
                .send(Err(self.dry_run_refusal("DeleteNodes", would.join("; "))));
        }
    }
}

/// Hands `share` to its caller through `hand`, and only then starts `work`: a caller
/// that gave up before has nothing started, one that gives up after finds its share
/// as it leaves ([`receive`]).
fn hand_over(hand: Hand, share: Share, work: Vec<BoxFuture<'static, ()>>) {
    if hand.send(Ok(share)).is_err() {
        tracing::debug!(
            "DeleteNodes caller gave up before its removals were handed over; none started"
        );
        return;
    }
    for w in work {
        tokio::spawn(w);
    }
}

/// Waits until `deadline` for what the batch hands over through `rx`. Past it, leaves
/// the channel and takes what was handed over before it left, or answers `late()`: a
/// hand-over and a leave never cross ([`hand_over`]), so what the answer says was
/// started is what was. `None`: the batch stopped without handing anything over.
async fn receive<T>(
    rx: &mut oneshot::Receiver<Result<T, ProviderError>>,
    deadline: Instant,
    late: impl FnOnce() -> ProviderError,
) -> Option<Result<T, ProviderError>> {
    match tokio::time::timeout_at(deadline, &mut *rx).await {
        Ok(Ok(r)) => Some(r),
        Ok(Err(_)) => None,
        Err(_) => {
            rx.close();
            Some(rx.try_recv().unwrap_or_else(|_| Err(late())))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    fn work(ran: &Arc<AtomicBool>) -> Vec<BoxFuture<'static, ()>> {
        let ran = ran.clone();
        vec![async move { ran.store(true, Ordering::SeqCst) }.boxed()]
    }

    fn late() -> ProviderError {
        ProviderError::Unavailable("late; no instance was removed".into())
    }

    /// The race of issue 59, 1: the caller's deadline fires between the batch's check
    /// and the hand-over. The caller has left: nothing of its share starts.
    #[tokio::test(start_paused = true)]
    async fn a_caller_that_left_before_the_hand_over_has_nothing_started() {
        let ran = Arc::new(AtomicBool::new(false));
        let (hand, mut rx) = oneshot::channel();
        rx.close();
        hand_over(hand, Share::Removals(Vec::new()), work(&ran));
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(
            !ran.load(Ordering::SeqCst),
            "work started for a caller gone"
        );
        assert!(rx.try_recv().is_err());
    }

    /// Handed over first, started after: a caller whose deadline has passed finds what
    /// was started for it, and one that found nothing by its deadline had nothing
    /// handed over (so nothing started).
    #[tokio::test(start_paused = true)]
    async fn a_caller_past_its_deadline_finds_what_was_handed_over() {
        let ran = Arc::new(AtomicBool::new(false));
        let (hand, mut rx) = oneshot::channel();
        let deadline = Instant::now() + Duration::from_secs(4);
        hand_over(hand, Share::Removals(Vec::new()), work(&ran));
        tokio::time::sleep(Duration::from_secs(5)).await;
        let got = receive(&mut rx, deadline, late).await;
        assert!(matches!(got, Some(Ok(Share::Removals(_)))));
        assert!(ran.load(Ordering::SeqCst));

        let (hand, mut rx) = oneshot::channel::<Result<Share, ProviderError>>();
        let deadline = Instant::now() + Duration::from_secs(4);
        let got = receive(&mut rx, deadline, late).await;
        assert!(
            matches!(&got, Some(Err(e)) if e.to_string().contains("no instance was removed")),
            "{:?}",
            got.map(|r| r.err())
        );
        assert!(hand.is_closed(), "the batch sees the caller gone");
        let ran = Arc::new(AtomicBool::new(false));
        hand_over(hand, Share::Removals(Vec::new()), work(&ran));
        tokio::task::yield_now().await;
        assert!(!ran.load(Ordering::SeqCst));
    }
}

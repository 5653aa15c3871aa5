#!/usr/bin/env python3
"""The soak's judge (issue 75): reads what Kubernetes and AWS recorded of a run and fails it
on a broken promise. It shares no code with the service: it knows only the service's
user name, its taint and annotation prefix, and the Lease's name, as the docs name them.

Usage: soak_check.py RUN_DIR   (exit 0: every rule held; 1: the broken rules, each with
the node / instance / pod and the evidence lines; 2: the input could not be read).

The input contract (RUN_DIR, written by tests/e2e_soak.rs; docs/e2e.md#the-soak):

- audit.log: kube-apiserver's audit log, JSON lines, as the suite's policy writes it
  (tests/e2e/control_plane.rs): every request of the service at Metadata (its Node
  writes and Events with their request body, which no rule reads); Lease writes
  with their request body; pod creates with their response (name, owner, node); bindings;
  budget status writes with their body; writes of pods, evictions and Nodes (Node creates
  with their body, for the providerID).
  The service's replicas share one user name and differ by `user.uid`, which is the
  replica's identity in the Lease (`holderIdentity`).
- cloud.jsonl: one JSON object per line, in the order recorded, each with `who` and `op`:
  - who = a replica's identity: an AWS call it sent (`op` is the AWS API name, `instance`,
    `group`, `at` when it was sent, RFC 3339 UTC);
  - who = "ca": what cluster-autoscaler asked (`IncreaseSize` group delta, `DeleteNodes`
    group instance node, `TargetSize` group size, read once the run settled);
  - who = "asg" / "ec2" / "person": an instance that side chose to end (`ScaleIn` /
    `Reclaim` / `Terminate`, group instance; a `Reclaim` also names the node and EC2's
    `deadline`; the ASG's `Refresh`: an instance refresh replacing it, no decrement);
    who = "ec2", op = `Rebalance`, node, rebalanced (an instance id): a rebalance
    recommendation alone, which chooses nothing to end (no `instance` key); who = "person", op = `Drain`, node: a person's `drain NODE` (drain
    only: no instance is chosen to end);
    A choice may carry `at` (when it was made, RFC 3339 UTC): a node back from a warm
    pool is judged by the choices made after it came back.
  - who = "aws": what AWS did (`Group` group desired, at the start; `Terminated` instance,
    `TimedOut` instance hook, `Completed` instance hook result; `Desired` group desired,
    at the end). These lines carry no time: order only. But the warm-pool moves, as the
    driver saw them, each with `at`: `Pooled` group instance (it came to rest in the
    group's warm pool), `Reused` group instance (back in the group, under the same Node
    name); and `InPool` group instance state, once per instance in a pool at the end.
  - who = "net", op = `Pause`: a pause of a replica's link to the API server (`replica`,
    `from` and `to` RFC 3339 UTC, `held`: how many connections held bytes the replica
    sent, delivered when it healed; `sent`: when each of them got the first of those
    bytes, RFC 3339 UTC).
- end.json: the Kubernetes objects once the run settled: {"nodes": [...], "pods": [...]}.

Every rule is a function taking the parsed run and returning a list of failures.
"""

import json
import pathlib
import sys
from collections import defaultdict

SERVICE_USER = "system:serviceaccount:kube-system:cluster-autoscaler"
KUBELET_USER = "e2e:fake-kubelet"
LEASE = ("kube-system", "ca-asg-provider")
SERVICE_TAINTS = ("ca-asg-provider.io/draining", "ToBeDeletedByClusterAutoscaler")
SERVICE_ANNOTATION = "ca-asg-provider.io/"
# Who chooses that an instance ends (or, a person, that a node drains).
CHOOSERS = ("ca", "asg", "ec2", "person")
# The states an instance rests in inside a warm pool (its drain over).
RESTING = ("Warmed:Stopped", "Warmed:Running", "Warmed:Hibernated")
# Bounds: a run's input is read once, bounded, and refused whole when it is not what
# the contract says.
MAX_BYTES = 512 * 1024 * 1024
MAX_LINE = 4 * 1024 * 1024


class Bad(Exception):
    """The input does not follow the contract."""


def _lines(path):
    if not path.exists():
        raise Bad(f"{path}: missing")
    if path.stat().st_size > MAX_BYTES:
        raise Bad(f"{path}: larger than {MAX_BYTES} bytes")
    out = []
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if len(line) > MAX_LINE:
                raise Bad(f"{path}:{n}: a line longer than {MAX_LINE} bytes")
            line = line.strip()
            if not line:
                continue
            try:
                v = json.loads(line)
            except ValueError as e:
                raise Bad(f"{path}:{n}: not JSON: {e}") from None
            if not isinstance(v, dict):
                raise Bad(f"{path}:{n}: not a JSON object")
            v["_line"] = f"{path.name}:{n}"
            out.append(v)
    return out


def _d(v, *keys):
    """v[k1][k2]..., or None where a level is missing or not an object."""
    for k in keys:
        if not isinstance(v, dict):
            return None
        v = v.get(k)
    return v


class Run:
    """One run, parsed once: the audit events (ResponseComplete only), the cloud's
    record, the objects at the end, and what the rules share."""

    def __init__(self, audit, cloud, end):
        self.audit = [e for e in audit if e.get("stage") == "ResponseComplete"]
        self.audit.sort(key=lambda e: str(e.get("stageTimestamp", "")))
        self.cloud = cloud
        if not isinstance(end, dict):
            raise Bad("end.json: not an object")
        self.end_nodes = [n for n in end.get("nodes", []) if isinstance(n, dict)]
        self.end_pods = [p for p in end.get("pods", []) if isinstance(p, dict)]
        self.pods = {}  # (ns, name) -> {"owner", "node", "created", "gone", "line"}
        # A late write no connection sent early enough can carry -> why (_late_writes).
        self.sent_too_late = {}
        self.node_of_instance = {}
        for e in self.audit:
            ref = e.get("objectRef") or {}
            res, sub = ref.get("resource"), ref.get("subresource", "")
            if not ok(e):
                continue
            if res == "pods" and e.get("verb") == "create" and not sub:
                obj = e.get("responseObject") or {}
                key = (_d(obj, "metadata", "namespace"), _d(obj, "metadata", "name"))
                owners = _d(obj, "metadata", "ownerReferences") or [{}]
                p = self.pods.setdefault(key, {})
                p["owner"] = (owners[0] or {}).get("kind", "")
                p["created"] = e["stageTimestamp"]
                p["line"] = e["_line"]
                if _d(obj, "spec", "nodeName"):
                    p["node"] = _d(obj, "spec", "nodeName")
                    p["bound"] = e["stageTimestamp"]
            elif res == "pods" and sub == "binding":
                key = (ref.get("namespace"), ref.get("name"))
                node = _d(e, "requestObject", "target", "name")
                self.pods.setdefault(key, {}).update(node=node, bound=e["stageTimestamp"])
            elif res == "pods" and e.get("verb") == "delete" and not sub:
                key = (ref.get("namespace"), ref.get("name"))
                self.pods.setdefault(key, {})["gone"] = e["stageTimestamp"]
            elif res == "nodes" and e.get("verb") == "create" and not sub:
                pid = _d(e, "requestObject", "spec", "providerID") or ""
                name = _d(e, "requestObject", "metadata", "name")
                if pid and name:
                    self.node_of_instance[pid.rsplit("/", 1)[-1]] = name
        # A pod still there at the end is not gone, whatever its deletes said.
        for p in self.end_pods:
            key = (_d(p, "metadata", "namespace"), _d(p, "metadata", "name"))
            if key in self.pods:
                self.pods[key].pop("gone", None)
        # A node's drain begins at a write of the service to it (its cordon, its taint):
        # every such write, in time order.
        self.node_writes = defaultdict(list)
        for e in self.audit:
            ref = e.get("objectRef") or {}
            if (
                self.by_service(e)
                and ref.get("resource") == "nodes"
                and e.get("verb") in ("patch", "update")
                and ok(e)
            ):
                self.node_writes[ref.get("name")].append(e["stageTimestamp"])
        # Warm-pool moves, as the driver saw them: instance -> [(when, "Pooled" or
        # "Reused")], in time order; and what rests in a pool at the end.
        self.moves = defaultdict(list)
        for c in self.cloud:
            if c.get("who") == "aws" and c.get("op") in ("Pooled", "Reused"):
                self.moves[c.get("instance")].append((_when(c.get("at")), c["op"]))
        for m in self.moves.values():
            m.sort(key=lambda x: x[0] or 0)
        self.resting = {
            c.get("instance")
            for c in self.cloud
            if c.get("who") == "aws" and c.get("op") == "InPool" and c.get("state") in RESTING
        }
        self.replicas = {
            _d(e, "user", "uid") for e in self.audit if self.by_service(e)
        }

    @staticmethod
    def by_service(e):
        return _d(e, "user", "username") == SERVICE_USER

    def service_writes(self, resource, subresource=""):
        for e in self.audit:
            ref = e.get("objectRef") or {}
            if (
                self.by_service(e)
                and ref.get("resource") == resource
                and ref.get("subresource", "") == subresource
                and e.get("verb") in ("create", "update", "patch", "delete")
            ):
                yield e

    def drain_began_before(self, node, instance, at):
        """When the drain that a completion at `at` ends began: the service's first write to
        the node at or after the last choice of its instance (or of the node: a person's
        drain) made before `at`. A node back from a warm pool keeps its name and is drained
        again: each stay in service is judged on its own. Choices with no time (an older
        history): the first write."""
        writes = self.node_writes.get(node, [])
        at_s = _when(at)
        chose = [
            _when(c.get("at"))
            for c in self.cloud
            if c.get("who") in CHOOSERS
            and (c.get("instance") == instance or (node and c.get("node") == node))
            and c.get("at")
        ]
        chose = [t for t in chose if t is not None and (at_s is None or t <= at_s)]
        if not chose:
            return writes[0] if writes else None
        last = max(chose)
        return next((w for w in writes if (_when(w) or 0) >= last), None)

    def pods_on(self, node):
        return [(k, p) for k, p in self.pods.items() if p.get("node") == node]

    def cloud_ops(self, who=None, op=None):
        return [
            c
            for c in self.cloud
            if (who is None or c.get("who") == who) and (op is None or c.get("op") == op)
        ]


def line(e):
    """An audit event as evidence: where it is and what it says."""
    ref = e.get("objectRef") or {}
    what = "/".join(x for x in (ref.get("resource"), ref.get("subresource")) if x)
    return (
        f"{e.get('_line')}: {e.get('stageTimestamp')} {_d(e, 'user', 'username')}"
        f"({_d(e, 'user', 'uid')}) {e.get('verb')} {what} "
        f"{ref.get('namespace') or ''}/{ref.get('name') or ''} -> {_d(e, 'responseStatus', 'code')}"
    )


def cline(c):
    return f"{c.get('_line')}: " + json.dumps({k: v for k, v in c.items() if k != "_line"})


def ok(e):
    return 200 <= int(_d(e, "responseStatus", "code") or 0) < 300


# ---- the rules ------------------------------------------------------------------------


def ended_unchosen(run):
    """An instance ended that neither CA, the ASG, EC2 nor a person chose. A choice made
    before the instance came back from a warm pool (`Reused`) was spent on that stay:
    an instance that ends after it needs a choice of its own."""
    chosen = {}
    for c in run.cloud:
        if c.get("who") not in CHOOSERS or not c.get("instance"):
            continue
        back = [t for t, op in run.moves.get(c["instance"], []) if op == "Reused" and t is not None]
        at = _when(c.get("at")) if c.get("at") else None
        if back and at is not None and at < max(back):
            continue
        chosen.setdefault(c["instance"], c)
    fails = []
    for c in run.cloud_ops(who="aws", op="Terminated"):
        if c.get("instance") not in chosen:
            fails.append(f"instance {c.get('instance')} ended, chosen by nobody\n  {cline(c)}")
    for c in run.cloud:
        if c.get("who") in run.replicas and c.get("op") == "TerminateInstanceInAutoScalingGroup":
            if c.get("instance") not in chosen:
                fails.append(
                    f"replica {c['who']} asked AWS to end instance {c.get('instance')}, chosen by nobody\n  {cline(c)}"
                )
    return fails


# docs/queue-mode.md: a spot warning's drain gives workloads until `daemonSetShare` (20 s
# by default) before EC2's two minutes; past that the service stops a pod its budget still
# blocks (a graceful delete), since EC2 ends the instance anyway.
SPOT_DAEMONSET_SHARE_SECS = 20


def _when(text):
    """An RFC 3339 UTC time as seconds since the epoch, or None."""
    from datetime import datetime

    try:
        return datetime.fromisoformat(str(text).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def spot_stops_from(run):
    """Node -> when the service may stop its workload pods: EC2's spot deadline less the
    DaemonSet share, for every instance EC2 warned it would reclaim."""
    out = {}
    for c in run.cloud_ops(who="ec2", op="Reclaim"):
        node = c.get("node") or run.node_of_instance.get(c.get("instance"))
        deadline = _when(c.get("deadline"))
        if node and deadline is not None:
            out[node] = deadline - SPOT_DAEMONSET_SHARE_SECS
    return out


def _on_node_by(q, at):
    """Whether pod `q` was on its node by `at`: from its binding (or its create, for a
    pod created bound), not from its create. A pod created before a drain can be bound
    to the node after it: the scheduler places it on a cordoned node when its view of
    the Node is older than the cordon (its watch broken by an API server or etcd
    restart), as it would on any cluster; that pod is not the drain's to have waited
    for."""
    return q.get("bound", q.get("created", "")) <= at


def workload_deleted_not_evicted(run):
    """A workload pod the service deleted other than through the Eviction API. The
    soak's hooks outlast the soak, so no proceed deadline of a hook can have passed: any
    such delete breaks the promise, but on a node EC2 warned it would reclaim, from the
    warning's deadline less the DaemonSet share on."""
    fails = []
    spot = spot_stops_from(run)
    for e in run.service_writes("pods"):
        if e.get("verb") != "delete":
            continue
        ref = e["objectRef"]
        p = run.pods.get((ref.get("namespace"), ref.get("name")), {})
        at = _when(e.get("stageTimestamp"))
        if p.get("node") in spot and at is not None and at >= spot[p["node"]]:
            continue
        if p.get("owner") != "DaemonSet":
            fails.append(
                f"pod {ref.get('namespace')}/{ref.get('name')} (owner {p.get('owner') or '?'}, node {p.get('node')}) "
                f"deleted by the service, not evicted\n  {line(e)}"
            )
    return fails


def daemonset_before_workloads(run):
    """A DaemonSet pod evicted or deleted by the service while a workload pod of its
    node was still there."""
    fails = []
    for e in [*run.service_writes("pods", "eviction"), *run.service_writes("pods")]:
        if e.get("verb") not in ("create", "delete") or not ok(e):
            continue
        ref = e["objectRef"]
        key = (ref.get("namespace"), ref.get("name"))
        p = run.pods.get(key, {})
        if p.get("owner") != "DaemonSet" or not p.get("node"):
            continue
        at = e["stageTimestamp"]
        left = [
            (k, q)
            for k, q in run.pods_on(p["node"])
            if q.get("owner") != "DaemonSet"
            and _on_node_by(q, at)
            and (q.get("gone") is None or q["gone"] > at)
        ]
        if left:
            names = ", ".join(f"{k[0]}/{k[1]} (gone {q.get('gone') or 'never'})" for k, q in left)
            fails.append(
                f"DaemonSet pod {key[0]}/{key[1]} on node {p['node']} went while workload pods were there: {names}\n  {line(e)}"
            )
    return fails


def budget_broken(run):
    """A PodDisruptionBudget whose status said fewer healthy pods than it desired, after
    it had first held with pods to count (a rollout starts from 0 of 0, then 0 of N)."""
    fails = []
    held = set()
    for e in run.audit:
        ref = e.get("objectRef") or {}
        if ref.get("resource") != "poddisruptionbudgets" or ref.get("subresource") != "status":
            continue
        st = _d(e, "requestObject", "status") or {}
        cur, want = st.get("currentHealthy"), st.get("desiredHealthy")
        if not isinstance(cur, int) or not isinstance(want, int):
            continue
        key = (ref.get("namespace"), ref.get("name"))
        if cur >= want and want > 0:
            held.add(key)
        elif key in held:
            fails.append(
                f"budget {key[0]}/{key[1]}: {cur} healthy, {want} desired\n  {line(e)}"
            )
    return fails


def hook_held_badly(run):
    """A lifecycle action our hook held that timed out, or that the service completed
    while a pod of its node was still there. A DaemonSet pod bound to the node after its
    drain began is not the drain's: its controller puts one back on a node it tolerates as
    soon as the last one goes, and it goes with the instance (or rests with it in a warm
    pool). A node back from a pool is drained anew: its drain began after the last
    choice before the completion (`drain_began_before`)."""
    fails = []
    for c in run.cloud_ops(who="aws", op="TimedOut"):
        fails.append(f"instance {c.get('instance')}: hook {c.get('hook')} timed out\n  {cline(c)}")
    for c in run.cloud:
        if c.get("who") not in run.replicas or c.get("op") != "CompleteLifecycleAction":
            continue
        node = run.node_of_instance.get(c.get("instance"))
        at = c.get("at", "")
        began = run.drain_began_before(node, c.get("instance"), at)
        left = [
            k
            for k, q in run.pods_on(node)
            if _on_node_by(q, at)
            and (q.get("gone") is None or q["gone"] > at)
            and not (q.get("owner") == "DaemonSet" and began and q.get("bound", "") > began)
        ]
        if node and left:
            fails.append(
                f"instance {c.get('instance')} (node {node}): action completed while its drain went on: "
                f"{', '.join(f'{k[0]}/{k[1]}' for k in left)} still there\n  {cline(c)}"
            )
    return fails


def target_differs(run):
    """CA's target size, once the run settled, differs from what CA asked: the start,
    plus its increases, less the instances it and the ASG ended with a decrement."""
    want = {}
    for c in run.cloud_ops(who="aws", op="Group"):
        want[c["group"]] = c["desired"]
    for c in run.cloud_ops(who="ca", op="IncreaseSize"):
        want[c["group"]] = want.get(c["group"], 0) + c["delta"]
    for who, op in (("ca", "DeleteNodes"), ("asg", "ScaleIn")):
        for c in run.cloud_ops(who=who, op=op):
            want[c["group"]] = want.get(c["group"], 0) - 1
    fails = []
    seen = {c["group"]: c for c in run.cloud_ops(who="ca", op="TargetSize")}
    desired = {c["group"]: c for c in run.cloud_ops(who="aws", op="Desired")}
    for g, n in sorted(want.items()):
        for what, got in (("CA's TargetSize", seen.get(g)), ("the ASG's desired", desired.get(g))):
            if got is None:
                fails.append(f"group {g}: {what} not recorded at the end")
                continue
            size = got.get("size", got.get("desired"))
            if size != n:
                fails.append(f"group {g}: {what} is {size}, CA asked for {n}\n  {cline(got)}")
    return fails


def _received(e):
    """When the API server received the request (its audit event says so at every stage;
    a history without it: when it completed)."""
    return str(e.get("requestReceivedTimestamp") or e.get("stageTimestamp") or "")


# A pause of a replica's link delivers what it held when it heals: the API server
# receives those requests within this long of the heal.
LATE_SECS = 1.0


def _is_lease(e):
    ref = e.get("objectRef") or {}
    return (ref.get("namespace"), ref.get("name")) == LEASE and ref.get("resource") == "leases"


def _lease_write(e):
    """Whether `e` is a successful write of the Lease (which names its holder)."""
    return _is_lease(e) and ok(e) and e.get("verb") in ("create", "update", "patch")


def _holder(e):
    return _d(e, "requestObject", "spec", "holderIdentity") or None


def _replica_writes(run):
    """(write, the Lease's holder when the API server received it), in receive order:
    every write of a replica but to the Lease and Events."""
    holder = None
    for e in sorted(run.audit, key=_received):
        ref = e.get("objectRef") or {}
        if _is_lease(e):
            if _lease_write(e):
                holder = _holder(e)
            continue
        if not run.by_service(e):
            continue
        if e.get("verb") not in ("create", "update", "patch", "delete"):
            continue
        if ref.get("resource") in ("events", "leases"):
            continue
        yield e, holder


def late_writes(run):
    """`_late_writes`, worked out once per run (two_leaders and the counts use it)."""
    if not hasattr(run, "_late"):
        run._late = _late_writes(run)
    return run._late


def _late_writes(run):
    """The writes a pause of their replica's link held and delivered late: received
    within LATE_SECS of the pause's heal, from a replica that held the Lease when the
    pause began, each carried by a connection of its own whose held bytes came before
    the Lease's holder at its receipt took the Lease. The link records when each held
    connection got its first bytes (`sent`); over HTTP/1.1 a connection carries one
    request at a time, and one sent into a pause waits there, so that is when the
    request was sent. Which connection carried which write the audit log cannot tell:
    the writes are matched to connections sent early enough, the earliest takeover
    first; a write left without one was sent after its replica's term ended, and is
    not excused."""
    pauses = defaultdict(list)
    for c in run.cloud_ops(who="net", op="Pause"):
        a, b = _when(c.get("from")), _when(c.get("to"))
        sent = sorted(t for t in (_when(x) for x in c.get("sent") or []) if t is not None)
        if sent and a is not None and b is not None:
            pauses[c.get("replica")].append((a, b, sent))
    terms = _terms(run)
    led = {(r, a): _term_at(terms, a)[1] == r for r, ps in pauses.items() for a, _, _ in ps}
    # Per pause, its late writes with when their receipt's holder took the Lease.
    candidates = defaultdict(list)
    for e, holder in _replica_writes(run):
        uid = _d(e, "user", "uid")
        t = _when(_received(e))
        if holder == uid or t is None:
            continue
        for a, b, sent in pauses.get(uid, []):
            if led[(uid, a)] and b <= t <= b + LATE_SECS:
                candidates[(uid, a)].append((_term_at(terms, t)[0], e, sent))
                break
    out = []
    for writes in candidates.values():
        used = 0
        for took, e, sent in sorted(writes, key=lambda w: w[0]):
            early = sum(1 for x in sent if x < took)
            if used < early:
                used += 1
                out.append(e)
            else:
                run.sent_too_late[id(e)] = (
                    f"(its link held {early} connection(s) sent before the Lease changed hands"
                    f" at {_iso(took)}, fewer than the writes it delivered late)")
    return out


def _terms(run):
    """When each holder of the Lease took it, by its writes in the order the API server
    received them: (time, holder) at each change."""
    out, holder = [], None
    for e in sorted((e for e in run.audit if _lease_write(e)), key=_received):
        h = _holder(e)
        if h != holder:
            out.append((_when(_received(e)) or 0, h))
            holder = h
    return out


def _term_at(terms, t):
    """(when it began, its holder) for the term in effect at `t`: (0, None) before any
    Lease write."""
    began, holder = 0.0, None
    for at, h in terms:
        if at > t:
            break
        began, holder = at, h
    return began, holder


def _iso(t):
    from datetime import datetime, timezone

    return datetime.fromtimestamp(t, tz=timezone.utc).isoformat()


def two_leaders(run):
    """A replica writing (but the Lease and Events) while the last Lease write before it
    named another holder, or none. Lease writes count whoever sends them: a person's
    `drain` command that takes the Lease (no replica renewing it) holds it as much.
    Each write is placed where the API server received it, not where it completed: a
    write the leader sent that waited out an etcd restart in the API server, completing
    after another replica took the Lease, was written as leader (and two successful
    compare-and-swap Lease writes complete in the order they were received). So was a
    write its link held through a pause and delivered late (`late_writes`): the other
    rules judge what it did."""
    late = {id(e) for e in late_writes(run)}
    fails = []
    for e, holder in _replica_writes(run):
        uid = _d(e, "user", "uid")
        if holder != uid and id(e) not in late:
            why = run.sent_too_late.get(id(e))
            why = f" {why}" if why else ""
            fails.append(f"replica {uid} wrote while {holder or 'nobody'} held the Lease{why}\n  {line(e)}")
    return fails


def left_marked(run):
    """A node left cordoned, tainted or annotated by the service once the run settled;
    but a node EC2 recommended rebalancing (who = "ec2", op = `Rebalance`), which the
    service cordons and taints for good by design (`rebalance: cordon`,
    docs/queue-mode.md) until something ends it; and a node whose instance rests in a
    warm pool at the end (`InPool`), which stays cordoned until it leaves the pool
    (docs/node-groups.md). A node back from the pool is judged as any other."""
    rebalanced = {c.get("node") for c in run.cloud_ops(who="ec2", op="Rebalance")}
    pooled = {run.node_of_instance.get(i) for i in run.resting} - {None}
    fails = []
    for n in run.end_nodes:
        name = _d(n, "metadata", "name")
        if name in rebalanced or name in pooled:
            continue
        spec = n.get("spec") or {}
        if spec.get("unschedulable"):
            fails.append(f"node {name} left cordoned")
        for t in spec.get("taints") or []:
            if t.get("key") in SERVICE_TAINTS:
                fails.append(f"node {name} left tainted {t.get('key')}")
        for k in _d(n, "metadata", "annotations") or {}:
            if k.startswith(SERVICE_ANNOTATION):
                fails.append(f"node {name} left annotated {k}")
    return fails


def drain_never_ended(run):
    """A node the service began to drain (an eviction asked) that is still there at the
    end, or whose instance never ended; but a node a person drained from the command line
    (`drain NODE` drains only: the instance stays, and `left_marked` judges that it was
    given back), and a node whose instance went into a warm pool after its last eviction
    (the drain ended there: the instance and its Node stay for the next scale-up; an
    eviction after it belongs to a later stay in service, and needs an end of its own)."""
    by_person = {c.get("node") for c in run.cloud_ops(who="person", op="Drain")}
    begun = {}
    for e in run.service_writes("pods", "eviction"):
        ref = e["objectRef"]
        node = run.pods.get((ref.get("namespace"), ref.get("name")), {}).get("node")
        if node:
            begun[node] = e  # the last one
    ended = {run.node_of_instance.get(c.get("instance")) for c in run.cloud_ops(who="aws", op="Terminated")}
    pooled_at = defaultdict(list)
    for i, moves in run.moves.items():
        pooled_at[run.node_of_instance.get(i)].extend(t for t, op in moves if op == "Pooled" and t is not None)
    there = {_d(n, "metadata", "name") for n in run.end_nodes}
    fails = []
    for node, e in sorted(begun.items()):
        if node in by_person and node not in ended:
            continue
        last = _when(e.get("stageTimestamp")) or 0
        if any(t >= last for t in pooled_at.get(node, [])):
            continue
        if node in there or node not in ended:
            fails.append(
                f"node {node}: drain begun, never ended (node {'still there' if node in there else 'gone'}, "
                f"instance {'ended' if node in ended else 'not ended'})\n  {line(e)}"
            )
    return fails


RULES = [
    ended_unchosen,
    workload_deleted_not_evicted,
    daemonset_before_workloads,
    budget_broken,
    hook_held_badly,
    target_differs,
    two_leaders,
    left_marked,
    drain_never_ended,
]


def load(run_dir):
    d = pathlib.Path(run_dir)
    end_path = d / "end.json"
    if not end_path.exists():
        raise Bad(f"{end_path}: missing")
    try:
        end = json.loads(end_path.read_text(encoding="utf-8"))
    except ValueError as e:
        raise Bad(f"{end_path}: not JSON: {e}") from None
    try:
        return Run(_lines(d / "audit.log"), _lines(d / "cloud.jsonl"), end)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise Bad(f"{d}: not as the contract says: {e!r}") from None


def judge(run):
    """(rule name, failures) of every rule, and a count of what each looked at."""
    return [(r.__name__, r(run)) for r in RULES]


def exercised(run):
    """How many times each rule had something to judge in this run."""
    evictions = list(run.service_writes("pods", "eviction"))
    return {
        "ended_unchosen": len(run.cloud_ops(who="aws", op="Terminated")),
        "workload_deleted_not_evicted": len(evictions),
        "daemonset_before_workloads": sum(
            1 for e in evictions if run.pods.get((e["objectRef"].get("namespace"), e["objectRef"].get("name")), {}).get("owner") == "DaemonSet"
        ),
        "budget_broken": sum(1 for e in run.audit if (e.get("objectRef") or {}).get("subresource") == "status"
                             and (e.get("objectRef") or {}).get("resource") == "poddisruptionbudgets"),
        "hook_held_badly": len([c for c in run.cloud if c.get("op") == "CompleteLifecycleAction" and c.get("who") in run.replicas]),
        "target_differs": len(run.cloud_ops(who="ca", op="IncreaseSize")) + len(run.cloud_ops(who="ca", op="DeleteNodes")) + len(run.cloud_ops(who="asg", op="ScaleIn")),
        "two_leaders": sum(1 for e in run.audit if run.by_service(e) and e.get("verb") in ("create", "update", "patch", "delete")
                           and (e.get("objectRef") or {}).get("resource") not in ("events", "leases")),
        "left_marked": len(run.end_nodes),
        "warm_pool_moves": sum(len(m) for m in run.moves.values()),
        "late_writes_landed": sum(1 for e in late_writes(run) if ok(e)),
        "late_writes_refused": sum(1 for e in late_writes(run) if not ok(e)),
        "drain_never_ended": len({run.pods.get((e["objectRef"].get("namespace"), e["objectRef"].get("name")), {}).get("node") for e in evictions} - {None}),
    }


def main(argv):
    if len(argv) != 2:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    try:
        run = load(argv[1])
    except Bad as e:
        print(f"soak check: cannot read the run: {e}", file=sys.stderr)
        return 2
    results = judge(run)
    print("soak check: " + json.dumps({"exercised": exercised(run)}, sort_keys=True))
    broken = [(name, f) for name, f in results if f]
    for name, fails in broken:
        for f in fails:
            print(f"BROKEN {name}: {f}")
    if broken:
        return 1
    print(f"soak check: all {len(results)} rules held")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

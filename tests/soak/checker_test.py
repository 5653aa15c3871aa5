#!/usr/bin/env python3
"""scripts/soak_check.py on small histories: a clean one passes, and each history made to
break one rule fails that rule (and is named by it). Run by scripts/test.sh."""

import copy
import json
import pathlib
import subprocess
import sys
import tempfile
import unittest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import soak_check as sc  # noqa: E402

SVC = sc.SERVICE_USER
NODE, IID = "ip-10-0-0-1", "i-0000000000000001"


def ev(t, user, uid, verb, res, name, ns="shop", sub="", code=200, req=None, resp=None):
    e = {
        "stage": "ResponseComplete",
        "stageTimestamp": f"2026-11-28T16:00:{t:02d}.000000Z",
        "verb": verb,
        "user": {"username": user, "uid": uid},
        "objectRef": {"resource": res, "namespace": ns, "name": name, "subresource": sub},
        "responseStatus": {"code": code},
    }
    if req is not None:
        e["requestObject"] = req
    if resp is not None:
        e["responseObject"] = resp
    return e


def pod_create(t, name, owner, ns="shop"):
    return ev(t, "system:kube-controller-manager", "kcm", "create", "pods", "", ns=ns,
              resp={"metadata": {"name": name, "namespace": ns, "ownerReferences": [{"kind": owner}]}})


def lease(t, who, holder):
    return ev(t, SVC, who, "update", "leases", "ca-asg-provider", ns="kube-system",
              req={"spec": {"holderIdentity": holder}})


def clean():
    """A node whose instance the ASG chose: the hook holds it, replica-a (leading) evicts
    the app pod, then the DaemonSet pod, each gone before the next step; the action is
    completed; the node goes. CA asked nothing; the group went from 2 to 1."""
    audit = [
        ev(1, "e2e:fake-kubelet", "k", "create", "nodes", NODE, ns="",
           req={"metadata": {"name": NODE}, "spec": {"providerID": f"aws:///us-east-1a/{IID}"}}),
        pod_create(2, "app-1", "ReplicaSet"),
        ev(3, "system:kube-scheduler", "s", "create", "pods", "app-1", sub="binding", req={"target": {"name": NODE}}),
        pod_create(2, "fluent-bit-1", "DaemonSet", ns="logging"),
        ev(3, "system:kube-scheduler", "s", "create", "pods", "fluent-bit-1", ns="logging", sub="binding",
           req={"target": {"name": NODE}}),
        ev(4, "system:kube-controller-manager", "kcm", "update", "poddisruptionbudgets", "app", sub="status",
           req={"status": {"currentHealthy": 3, "desiredHealthy": 2}}),
        lease(5, "replica-a", "replica-a"),
        ev(6, SVC, "replica-a", "patch", "nodes", NODE, ns=""),
        ev(7, SVC, "replica-a", "create", "pods", "app-1", sub="eviction", code=201),
        ev(8, "system:kube-controller-manager", "kcm", "update", "poddisruptionbudgets", "app", sub="status",
           req={"status": {"currentHealthy": 2, "desiredHealthy": 2}}),
        ev(9, "e2e:fake-kubelet", "k", "delete", "pods", "app-1"),
        ev(10, SVC, "replica-a", "create", "pods", "fluent-bit-1", ns="logging", sub="eviction", code=201),
        ev(11, "e2e:fake-kubelet", "k", "delete", "pods", "fluent-bit-1", ns="logging"),
    ]
    cloud = [
        {"who": "aws", "op": "Group", "group": "web", "desired": 2},
        {"who": "asg", "op": "ScaleIn", "group": "web", "instance": IID},
        {"who": "replica-a", "op": "CompleteLifecycleAction", "group": "web", "instance": IID,
         "at": "2026-11-28T16:00:12.000000Z"},
        {"who": "aws", "op": "Completed", "instance": IID, "hook": "h", "result": "CONTINUE"},
        {"who": "aws", "op": "Terminated", "instance": IID},
        {"who": "ca", "op": "TargetSize", "group": "web", "size": 1},
        {"who": "aws", "op": "Desired", "group": "web", "desired": 1},
    ]
    end = {"nodes": [{"metadata": {"name": "ip-10-0-0-2"}, "spec": {}}], "pods": []}
    return audit, cloud, end


def at(t):
    return f"2026-11-28T16:00:{t:02d}.000000Z"


def pooled_then_back():
    """The clean history, but the ASG's scale-in sends the instance into its warm pool
    (ReuseOnScaleIn): it rests there (:13) with its Node, where the DaemonSet controller
    puts a new log shipper (:14). CA scales up and the ASG takes the same instance back
    (:20); the ASG scales in again (:22) and the service drains the Node anew: the new
    app pod, then the log shipper, the action completed (:28), the instance back in the
    pool (:30), its Node cordoned there at the end."""
    audit, cloud, end = clean()
    audit += [
        pod_create(14, "fluent-bit-2", "DaemonSet", ns="logging"),
        ev(14, "system:kube-scheduler", "s", "create", "pods", "fluent-bit-2", ns="logging", sub="binding",
           req={"target": {"name": NODE}}),
        ev(21, SVC, "replica-a", "patch", "nodes", NODE, ns=""),  # the hand-back
        pod_create(21, "app-2", "ReplicaSet"),
        ev(21, "system:kube-scheduler", "s", "create", "pods", "app-2", sub="binding", req={"target": {"name": NODE}}),
        ev(23, SVC, "replica-a", "patch", "nodes", NODE, ns=""),
        ev(24, SVC, "replica-a", "create", "pods", "app-2", sub="eviction", code=201),
        ev(25, "e2e:fake-kubelet", "k", "delete", "pods", "app-2"),
        ev(26, SVC, "replica-a", "create", "pods", "fluent-bit-2", ns="logging", sub="eviction", code=201),
        ev(27, "e2e:fake-kubelet", "k", "delete", "pods", "fluent-bit-2", ns="logging"),
    ]
    cloud = [x for x in cloud if x.get("op") not in ("Terminated", "TargetSize", "Desired")]
    cloud[1]["at"] = at(5)
    cloud += [
        {"who": "aws", "op": "Pooled", "group": "web", "instance": IID, "at": at(13)},
        {"who": "ca", "op": "IncreaseSize", "group": "web", "delta": 1, "at": at(19)},
        {"who": "aws", "op": "Reused", "group": "web", "instance": IID, "at": at(20)},
        {"who": "asg", "op": "ScaleIn", "group": "web", "instance": IID, "at": at(22)},
        {"who": "replica-a", "op": "CompleteLifecycleAction", "group": "web", "instance": IID, "at": at(28)},
        {"who": "aws", "op": "Completed", "instance": IID, "hook": "h", "result": "CONTINUE"},
        {"who": "aws", "op": "Pooled", "group": "web", "instance": IID, "at": at(30)},
        {"who": "ca", "op": "TargetSize", "group": "web", "size": 1},
        {"who": "aws", "op": "Desired", "group": "web", "desired": 1},
        {"who": "aws", "op": "InPool", "group": "web", "instance": IID, "state": "Warmed:Stopped"},
    ]
    end["nodes"].append({"metadata": {"name": NODE, "annotations": {"ca-asg-provider.io/drain": "{}"}},
                         "spec": {"unschedulable": True}})
    return audit, cloud, end


def write(tmp, audit, cloud, end):
    d = pathlib.Path(tmp)
    (d / "audit.log").write_text("".join(json.dumps(e) + "\n" for e in audit))
    (d / "cloud.jsonl").write_text("".join(json.dumps(c) + "\n" for c in cloud))
    (d / "end.json").write_text(json.dumps(end))
    return d


def broken(audit, cloud, end):
    with tempfile.TemporaryDirectory() as tmp:
        run = sc.load(write(tmp, audit, cloud, end))
    return {name: fails for name, fails in sc.judge(run) if fails}


class Checker(unittest.TestCase):
    def assertBreaks(self, rule, history, says):
        got = broken(*history)
        self.assertEqual(list(got), [rule], f"only {rule} breaks: {got}")
        self.assertIn(says, "\n".join(got[rule]))

    def test_a_clean_history_passes(self):
        self.assertEqual(broken(*clean()), {})

    def test_the_script_exits_0_then_1(self):
        with tempfile.TemporaryDirectory() as tmp:
            d = write(tmp, *clean())
            p = subprocess.run([sys.executable, str(ROOT / "scripts/soak_check.py"), str(d)], capture_output=True, text=True)
            self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
            a, c, e = clean()
            e["nodes"][0]["spec"]["unschedulable"] = True
            d = write(tmp, a, c, e)
            p = subprocess.run([sys.executable, str(ROOT / "scripts/soak_check.py"), str(d)], capture_output=True, text=True)
            self.assertEqual(p.returncode, 1)
            self.assertIn("BROKEN left_marked: node ip-10-0-0-2 left cordoned", p.stdout)

    def test_input_not_as_the_contract_says_is_refused(self):
        with tempfile.TemporaryDirectory() as tmp:
            d = write(tmp, *clean())
            (d / "cloud.jsonl").write_text("[1]\n")
            with self.assertRaises(sc.Bad):
                sc.load(d)
            (d / "cloud.jsonl").write_text("{not json\n")
            with self.assertRaises(sc.Bad):
                sc.load(d)

    def test_an_instance_nobody_chose(self):
        a, c, e = clean()
        c = [x for x in c if x["who"] != "asg"]
        # The group's arithmetic still holds: the ASG lowered desired by itself.
        c[0]["desired"] = 1
        self.assertBreaks("ended_unchosen", (a, c, e), f"instance {IID} ended, chosen by nobody")

    def test_a_workload_pod_deleted_not_evicted(self):
        a, c, e = clean()
        a[8] = ev(7, SVC, "replica-a", "delete", "pods", "app-1")
        self.assertBreaks("workload_deleted_not_evicted", (a, c, e), "pod shop/app-1 (owner ReplicaSet")

    def test_a_spot_drain_stops_a_pod_only_past_its_deadline_less_the_daemonset_share(self):
        a, c, e = clean()
        a[8] = ev(7, SVC, "replica-a", "delete", "pods", "app-1")
        # EC2 warned it would reclaim the instance at 16:00:25: stops are allowed from
        # :05 (25 less the 20 s share), so the delete at :07 is allowed.
        warned = {"who": "ec2", "op": "Reclaim", "group": "web", "instance": IID, "node": NODE,
                  "deadline": "2026-11-28T16:00:25.000000Z"}
        c2 = c + [warned]
        self.assertEqual(broken(a, c2, e), {})
        # A deadline further off (16:00:40, so stops from :20): the same delete breaks.
        later = dict(warned, deadline="2026-11-28T16:00:40.000000Z")
        c3 = c + [later]
        self.assertBreaks("workload_deleted_not_evicted", (a, c3, e), "pod shop/app-1 (owner ReplicaSet")

    def test_a_node_a_person_drained_may_stay_but_not_another(self):
        a, c, e = clean()
        # The instance never ends and its node stays: a drain that never ended...
        c = [x for x in c if x.get("op") not in ("Terminated", "Completed", "CompleteLifecycleAction")]
        e["nodes"].append({"metadata": {"name": NODE}, "spec": {}})
        self.assertBreaks("drain_never_ended", (a, c, e), f"node {NODE}: drain begun, never ended")
        # ... unless a person drained it from the command line (drain only).
        c2 = c + [{"who": "person", "op": "Drain", "node": NODE}]
        self.assertEqual(broken(a, c2, e), {})

    def test_a_replica_writing_while_a_drain_command_holds_the_lease(self):
        a, c, e = clean()
        # The command takes the Lease (no replica renewed it) before replica-a's cordon.
        a.insert(7, ev(5, "kubernetes-admin", "admin", "update", "leases", "ca-asg-provider", ns="kube-system",
                       req={"spec": {"holderIdentity": "drain-command-local-1-0"}}))
        a[7]["stageTimestamp"] = "2026-11-28T16:00:05.500000Z"
        self.assertBreaks("two_leaders", (a, c, e), "replica replica-a wrote while drain-command-local-1-0 held the Lease")

    def test_a_daemonset_pod_evicted_first(self):
        a, c, e = clean()
        # The DaemonSet pod's eviction (index 11) before the app pod is gone (index 10).
        a[10], a[11] = a[11], a[10]
        a[10]["stageTimestamp"], a[11]["stageTimestamp"] = a[11]["stageTimestamp"], a[10]["stageTimestamp"]
        self.assertBreaks("daemonset_before_workloads", (a, c, e), "DaemonSet pod logging/fluent-bit-1 on node ip-10-0-0-1")

    def test_a_rollout_from_none_healthy_is_not_a_broken_budget(self):
        a, c, e = clean()
        statuses = [(0, 0), (0, 2), (1, 2)]
        for i, (cur, want) in enumerate(statuses):
            a.insert(5, ev(4, "system:kube-controller-manager", "kcm", "update", "poddisruptionbudgets", "app",
                           sub="status", req={"status": {"currentHealthy": cur, "desiredHealthy": want}}))
        a.sort(key=lambda x: x["stageTimestamp"])
        self.assertEqual(broken(a, c, e), {})

    def test_a_daemonset_pod_put_back_mid_drain_is_not_the_drains(self):
        a, c, e = clean()
        # The DaemonSet controller puts a new log shipper on the node after the eviction;
        # the action is completed while it runs, and it goes with the instance.
        a.append(pod_create(11, "fluent-bit-2", "DaemonSet", ns="logging"))
        a.append(ev(11, "system:kube-scheduler", "s", "create", "pods", "fluent-bit-2", ns="logging",
                    sub="binding", req={"target": {"name": NODE}}))
        a.append(ev(13, "e2e:fake-kubelet", "k", "delete", "pods", "fluent-bit-2", ns="logging"))
        self.assertEqual(broken(a, c, e), {})
        # One that was there when the drain began is the drain's.
        for x in a[-3:]:
            x["stageTimestamp"] = x["stageTimestamp"].replace(":11.", ":05.").replace(":13.", ":13.")
        a.sort(key=lambda x: x["stageTimestamp"])
        self.assertBreaks("hook_held_badly", (a, c, e), "logging/fluent-bit-2 still there")

    def test_a_pod_bound_to_the_node_after_its_drain_is_not_the_drains(self):
        a, c, e = clean()
        # The ReplicaSet's replacement (created at :07, when app-1 was evicted) is bound
        # to the drained node at :13, after the action was completed (:12): the
        # scheduler's view of the Node was older than its cordon. It was not there when
        # the log shipper went (:10) nor at the completion.
        a.append(pod_create(7, "app-2", "ReplicaSet"))
        bind = ev(13, "system:kube-scheduler", "s", "create", "pods", "app-2", sub="binding",
                  req={"target": {"name": NODE}})
        a.append(bind)
        a.sort(key=lambda x: x["stageTimestamp"])
        self.assertEqual(broken(a, c, e), {})
        # Bound at :09, before the log shipper's eviction: both rules see it.
        bind["stageTimestamp"] = at(9)
        a.sort(key=lambda x: x["stageTimestamp"])
        got = broken(a, c, e)
        self.assertEqual(sorted(got), ["daemonset_before_workloads", "hook_held_badly"])
        self.assertIn("shop/app-2 (gone never)", got["daemonset_before_workloads"][0])

    def test_a_budget_broken(self):
        a, c, e = clean()
        a[9]["requestObject"]["status"]["currentHealthy"] = 1  # the status after the eviction
        self.assertBreaks("budget_broken", (a, c, e), "budget shop/app: 1 healthy, 2 desired")

    def test_a_hook_that_timed_out(self):
        a, c, e = clean()
        c.insert(3, {"who": "aws", "op": "TimedOut", "instance": IID, "hook": "h"})
        self.assertBreaks("hook_held_badly", (a, c, e), f"instance {IID}: hook h timed out")

    def test_an_action_completed_mid_drain(self):
        a, c, e = clean()
        c[2]["at"] = "2026-11-28T16:00:08.500000Z"
        self.assertBreaks("hook_held_badly", (a, c, e), "shop/app-1, logging/fluent-bit-1 still there")

    def test_a_target_size_not_what_ca_asked(self):
        a, c, e = clean()
        c.insert(1, {"who": "ca", "op": "IncreaseSize", "group": "web", "delta": 2})
        self.assertBreaks("target_differs", (a, c, e), "group web: CA's TargetSize is 1, CA asked for 3")

    def test_two_leaders_in_one_term(self):
        a, c, e = clean()
        a.insert(8, ev(7, SVC, "replica-b", "patch", "nodes", NODE, ns=""))
        self.assertBreaks("two_leaders", (a, c, e), "replica replica-b wrote while replica-a held the Lease")

    def test_a_write_the_leader_sent_that_completed_after_a_takeover(self):
        a, c, e = clean()
        # replica-a's last write (received at :11.5) waits out an etcd restart in the
        # API server and completes at :13, after replica-b took the Lease (received and
        # completed at :12): written as leader.
        a.append(lease(12, "replica-b", "replica-b"))
        late = ev(13, SVC, "replica-a", "patch", "nodes", NODE, ns="")
        late["requestReceivedTimestamp"] = "2026-11-28T16:00:11.500000Z"
        self.assertEqual(broken(a + [late], c, e), {})
        # Received after the takeover, it is two leaders whenever it completed.
        late["requestReceivedTimestamp"] = "2026-11-28T16:00:12.500000Z"
        self.assertBreaks("two_leaders", (a + [late], c, e), "replica replica-a wrote while replica-b held the Lease")

    def test_a_write_a_pause_held_and_delivered_late(self):
        a, c, e = clean()
        # replica-a leads; its link pauses at :09 (holding what it sent) and heals at
        # :12; replica-b takes the Lease at :11; replica-a's write, sent into the pause,
        # reaches the API server 0.3 s after the heal: written as leader, late.
        a.append(lease(11, "replica-b", "replica-b"))
        late = ev(12, SVC, "replica-a", "patch", "nodes", NODE, ns="")
        late["requestReceivedTimestamp"] = "2026-11-28T16:00:12.300000Z"
        pause = {"who": "net", "op": "Pause", "replica": "replica-a", "from": at(9), "to": at(12), "held": 1,
                 "sent": ["2026-11-28T16:00:10.500000Z"]}
        self.assertEqual(broken(a + [late], c + [pause], e), {})
        with tempfile.TemporaryDirectory() as tmp:
            run = sc.load(write(tmp, a + [late], c + [pause], e))
        self.assertEqual(sc.exercised(run)["late_writes_landed"], 1)
        # Received 2 s after the heal: not what the pause held.
        later = dict(late, requestReceivedTimestamp="2026-11-28T16:00:14.000000Z", stageTimestamp=at(14))
        self.assertBreaks("two_leaders", (a + [later], c + [pause], e), "replica replica-a wrote while replica-b held the Lease")
        # The link held nothing the replica sent.
        self.assertBreaks("two_leaders", (a + [late], c + [dict(pause, held=0, sent=[])], e), "replica replica-a wrote")
        # What it held was sent after replica-b took the Lease (:11): sent out of term.
        after = dict(pause, sent=["2026-11-28T16:00:11.200000Z"])
        self.assertBreaks("two_leaders", (a + [late], c + [after], e),
                          "replica replica-a wrote while replica-b held the Lease (its link held 0 connection(s) sent before")
        # Two late writes, one connection sent in term (the other after): one write is
        # not excused, whichever it was.
        late2 = ev(12, SVC, "replica-a", "patch", "nodes", NODE, ns="")
        late2["requestReceivedTimestamp"] = "2026-11-28T16:00:12.400000Z"
        one_early = dict(pause, held=2, sent=["2026-11-28T16:00:10.500000Z", "2026-11-28T16:00:11.200000Z"])
        got = broken(a + [late, late2], c + [one_early], e)
        self.assertEqual(list(got), ["two_leaders"], got)
        self.assertEqual(len(got["two_leaders"]), 1, got)
        both_early = dict(one_early, sent=["2026-11-28T16:00:09.500000Z", "2026-11-28T16:00:10.500000Z"])
        self.assertNotIn("two_leaders", broken(a + [late, late2], c + [both_early], e))
        # The replica did not lead when the pause began (:04, before it took the Lease).
        self.assertBreaks("two_leaders", (a + [late], c + [dict(pause, **{"from": at(4)})], e), "replica replica-a wrote")
        # Another replica's pause excuses nothing of replica-a's.
        self.assertBreaks("two_leaders", (a + [late], c + [dict(pause, replica="replica-b")], e), "replica replica-a wrote")

    def test_a_node_left_tainted_or_annotated(self):
        a, c, e = clean()
        e["nodes"][0]["spec"]["taints"] = [{"key": "ca-asg-provider.io/draining", "effect": "NoSchedule"}]
        e["nodes"][0]["metadata"]["annotations"] = {"ca-asg-provider.io/drain": "{}"}
        got = broken(a, c, e)
        self.assertEqual(list(got), ["left_marked"])
        self.assertEqual(len(got["left_marked"]), 2)

    def test_a_node_ec2_recommended_rebalancing_stays_cordoned_by_design(self):
        a, c, e = clean()
        e["nodes"][0]["spec"] = {"unschedulable": True,
                                 "taints": [{"key": "ca-asg-provider.io/draining", "effect": "NoSchedule"}]}
        e["nodes"][0]["metadata"]["annotations"] = {"ca-asg-provider.io/drain": "{}"}
        self.assertEqual(len(broken(a, c, e)["left_marked"]), 3)
        c.append({"who": "ec2", "op": "Rebalance", "group": "web", "node": "ip-10-0-0-2",
                  "rebalanced": "i-0000000000000002"})
        self.assertEqual(broken(a, c, e), {})
        # Another node left cordoned still breaks the rule.
        e["nodes"].append({"metadata": {"name": "ip-10-0-0-3"}, "spec": {"unschedulable": True}})
        self.assertBreaks("left_marked", (a, c, e), "node ip-10-0-0-3 left cordoned")

    def test_a_drain_that_never_ended(self):
        a, c, e = clean()
        e["nodes"].append({"metadata": {"name": NODE}, "spec": {}})
        self.assertBreaks("drain_never_ended", (a, c, e), f"node {NODE}: drain begun, never ended (node still there")

    def test_a_node_back_from_a_warm_pool_is_drained_and_judged_anew(self):
        a, c, e = pooled_then_back()
        self.assertEqual(broken(a, c, e), {})
        # The second action completed while the log shipper put there in the pool (:14)
        # still ran: it was there when the second drain began (:23), so it is that
        # drain's (judged by the first drain's start, :06, it would pass).
        c2 = copy.deepcopy(c)
        next(x for x in c2 if x.get("op") == "CompleteLifecycleAction" and x["at"] == at(28))["at"] = "2026-11-28T16:00:26.500000Z"
        self.assertBreaks("hook_held_badly", (a, c2, e), "logging/fluent-bit-2 still there")

    def test_a_node_resting_in_a_warm_pool_stays_cordoned_but_not_once_back(self):
        a, c, e = pooled_then_back()
        # Back in service (a scale-up took it) and not drained again: its Node must be
        # handed back.
        c = [x for x in c if x.get("op") != "InPool"]
        c = [x for x in c if not (x.get("op") == "Pooled" and x["at"] == at(30))]
        c.append({"who": "aws", "op": "Reused", "group": "web", "instance": IID, "at": at(31)})
        got = broken(a, c, e)
        self.assertIn("left_marked", got)
        self.assertIn(f"node {NODE} left cordoned", "\n".join(got["left_marked"]))

    def test_a_second_drain_that_never_reached_the_pool(self):
        a, c, e = pooled_then_back()
        # The drain after the instance came back ends nowhere: no second rest in the pool.
        c = [x for x in c if x.get("op") not in ("InPool", "CompleteLifecycleAction", "Completed")
             and not (x.get("op") == "Pooled" and x["at"] == at(30))]
        c.insert(3, {"who": "replica-a", "op": "CompleteLifecycleAction", "group": "web", "instance": IID,
                     "at": at(12)})
        e["nodes"][-1] = {"metadata": {"name": NODE}, "spec": {}}
        self.assertBreaks("drain_never_ended", (a, c, e), f"node {NODE}: drain begun, never ended (node still there")

    def test_a_choice_before_the_pool_does_not_cover_an_end_after_it(self):
        a, c, e = pooled_then_back()
        # The instance ends after it came back (:20) and nobody chose it again: the
        # ASG's choice at :05 was spent on its first stay.
        c = [x for x in c if not (x.get("op") == "ScaleIn" and x["at"] == at(22))]
        c = [x for x in c if x.get("op") not in ("InPool",)]
        c.append({"who": "aws", "op": "Terminated", "instance": IID})
        e["nodes"].pop()
        for x in c:
            if x.get("op") in ("TargetSize", "Desired"):
                x["size" if "size" in x else "desired"] = 2
        self.assertBreaks("ended_unchosen", (a, c, e), f"instance {IID} ended, chosen by nobody")
        # Chosen again after it came back: the end is chosen.
        c.append({"who": "ec2", "op": "Reclaim", "group": "web", "instance": IID, "node": NODE,
                  "deadline": at(59), "at": at(22)})
        self.assertEqual(broken(a, c, e), {})

    def test_every_rule_is_tested_here(self):
        names = {m[len("test_"):] for m in dir(self) if m.startswith("test_")}
        self.assertEqual(len(sc.RULES), 9)
        self.assertGreaterEqual(len(names), len(sc.RULES) + 3)


if __name__ == "__main__":
    unittest.main(verbosity=1)

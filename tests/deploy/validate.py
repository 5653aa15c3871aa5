#!/usr/bin/env python3
"""Renders every kustomize overlay under deploy/ and the Helm chart in deploy/chart (for
each values file in deploy/chart/ci), and validates each object against the Kubernetes
OpenAPI schemas in strict mode (unknown fields are errors).

cert-manager and Prometheus Operator objects are not in the Kubernetes schemas; they are
checked against the fields of cert-manager.io/v1 and monitoring.coreos.com/v1 that the
manifests use. On top of that, one source of truth: the chart's RBAC rules and default
provider config must equal deploy/base's (and the standalone overlay's), the config
keys and the values schema must match the Rust config structs (src/config, deny_unknown_fields),
and every metric the alert rules and the Grafana dashboard query must be one that
src/telemetry/metrics.rs registers. The --balancing-ignore-label labels of both overlays,
both example values files for CA's chart and the chart's bundled-mode flags must be
exactly the labels of docs/configuration.md's table. Values with an unknown key or a wrong type must be
refused by values.schema.json. Exit 1 when anything fails."""

import copy
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

import kubernetes_validate
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
K8S_VERSION = "1.32.0"
CHART = ROOT / "deploy/chart"
DASHBOARD = ROOT / "deploy/dashboards/ca-asg-provider.json"
# Metrics without a dashboard panel, each with the reason.
NOT_ON_DASHBOARD = {
    # Every metric has a panel today; a new one without belongs here with its reason.
}
RELEASE, NAMESPACE = "ca-asg-provider", "kube-system"

CERT_MANAGER = {
    "Issuer": {"selfSigned", "ca"},
    "Certificate": {
        "isCA", "commonName", "secretName", "duration", "renewBefore", "dnsNames",
        "usages", "privateKey", "issuerRef",
    },
}
PRIVATE_KEY = {"algorithm", "size", "rotationPolicy", "encoding"}
USAGES = {"server auth", "client auth", "digital signature", "key encipherment"}


def check_cert_manager(doc):
    kind = doc.get("kind")
    if kind not in CERT_MANAGER:
        return [f"unknown cert-manager kind {kind!r}"]
    spec = doc.get("spec") or {}
    errs = [f"spec.{k}: unknown field" for k in spec if k not in CERT_MANAGER[kind]]
    if kind == "Certificate":
        if "secretName" not in spec or "issuerRef" not in spec:
            errs.append("spec.secretName and spec.issuerRef are required")
        errs += [f"spec.privateKey.{k}: unknown field" for k in spec.get("privateKey", {}) if k not in PRIVATE_KEY]
        errs += [f"spec.usages: unknown usage {u!r}" for u in spec.get("usages", []) if u not in USAGES]
        ref = spec.get("issuerRef") or {}
        errs += [f"spec.issuerRef.{k}: unknown field" for k in ref if k not in {"name", "kind", "group"}]
        if not ref.get("name"):
            errs.append("spec.issuerRef.name is required")
    return errs


# monitoring.coreos.com/v1, the fields the chart uses (no schema for it offline).
SERVICE_MONITOR = {"selector", "namespaceSelector", "endpoints", "jobLabel"}
POD_MONITOR = {"selector", "namespaceSelector", "podMetricsEndpoints", "jobLabel"}
SM_ENDPOINT = {"port", "path", "interval", "scrapeTimeout", "scheme", "relabelings", "metricRelabelings"}
RULE_GROUP = {"name", "interval", "rules"}
RULE = {"alert", "record", "expr", "for", "labels", "annotations"}
DURATION = re.compile(r"^(0|(([0-9]+)(ms|s|m|h|d|w|y))+)$")


def check_monitoring(doc):
    kind, spec = doc.get("kind"), doc.get("spec") or {}
    errs = []
    if kind == "ServiceMonitor":
        errs += [f"spec.{k}: unknown field" for k in spec if k not in SERVICE_MONITOR]
        if not (spec.get("selector") or {}).get("matchLabels"):
            errs.append("spec.selector.matchLabels is required")
        if not spec.get("endpoints"):
            errs.append("spec.endpoints must not be empty")
        for i, ep in enumerate(spec.get("endpoints") or []):
            errs += [f"spec.endpoints[{i}].{k}: unknown field" for k in ep if k not in SM_ENDPOINT]
            errs += [f"spec.endpoints[{i}].{k}: {ep[k]!r} is not a duration"
                     for k in ("interval", "scrapeTimeout") if k in ep and not DURATION.match(str(ep[k]))]
    elif kind == "PodMonitor":
        errs += [f"spec.{k}: unknown field" for k in spec if k not in POD_MONITOR]
        if not (spec.get("selector") or {}).get("matchLabels"):
            errs.append("spec.selector.matchLabels is required")
        if not spec.get("podMetricsEndpoints"):
            errs.append("spec.podMetricsEndpoints must not be empty")
        for i, ep in enumerate(spec.get("podMetricsEndpoints") or []):
            errs += [f"spec.podMetricsEndpoints[{i}].{k}: unknown field" for k in ep if k not in SM_ENDPOINT]
            errs += [f"spec.podMetricsEndpoints[{i}].{k}: {ep[k]!r} is not a duration"
                     for k in ("interval", "scrapeTimeout") if k in ep and not DURATION.match(str(ep[k]))]
    elif kind == "PrometheusRule":
        errs += [f"spec.{k}: unknown field" for k in spec if k != "groups"]
        for g in spec.get("groups") or []:
            errs += [f"group {g.get('name')!r}.{k}: unknown field" for k in g if k not in RULE_GROUP]
            for r in g.get("rules") or []:
                who = r.get("alert") or r.get("record")
                errs += [f"rule {who!r}.{k}: unknown field" for k in r if k not in RULE]
                if not who or not isinstance(r.get("expr"), str) or not r["expr"].strip():
                    errs.append(f"rule {who!r}: alert (or record) and expr are required")
                if "for" in r and not DURATION.match(str(r["for"])):
                    errs.append(f"rule {who!r}: for {r['for']!r} is not a duration")
                for k in ("labels", "annotations"):
                    bad = [n for n, v in (r.get(k) or {}).items() if not isinstance(v, str)]
                    errs += [f"rule {who!r}.{k}.{n}: must be a string" for n in bad]
    else:
        errs.append(f"unknown monitoring.coreos.com kind {kind!r}")
    return errs


def check_object(doc):
    """The strict schema check for one rendered object, whatever produced it."""
    api = str(doc.get("apiVersion", ""))
    if api.startswith("cert-manager.io/"):
        return check_cert_manager(doc)
    if api.startswith("monitoring.coreos.com/"):
        return check_monitoring(doc)
    try:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        return []
    except kubernetes_validate.ValidationError as e:
        return [f"{'.'.join(str(p) for p in e.path)}: {e.message}"]
    except kubernetes_validate.SchemaNotFoundError as e:
        return [f"no schema: {e}"]


def check_binding(target, doc):
    """The bindings of ca-asg-provider's roles name the ServiceAccount the provider runs
    under in that overlay: cluster-autoscaler's (sidecar) or its own (standalone)."""
    if doc.get("kind") not in ("ClusterRoleBinding", "RoleBinding"):
        return []
    if doc.get("roleRef", {}).get("name") != "ca-asg-provider":
        return []
    want = "ca-asg-provider" if target.name == "standalone" else "cluster-autoscaler"
    got = [s.get("name") for s in doc.get("subjects", [])]
    return [] if got == [want] else [f"subjects {got}: expected [{want!r}]"]


def render(target):
    out = subprocess.run(["kubectl", "kustomize", str(target)], check=True, capture_output=True, text=True)
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def is_hook(doc):
    return "helm.sh/hook" in ((doc.get("metadata") or {}).get("annotations") or {})


def find(docs, kind, name=None):
    """The one release object (not a Helm hook's) of this kind and name."""
    found = [d for d in docs if d.get("kind") == kind and (name is None or d["metadata"]["name"] == name)
             and not is_hook(d)]
    return found[0] if len(found) == 1 else None


PROVIDER_CONFIG = "ca-asg-provider-config"
HASHED = re.compile(r"^" + re.escape(PROVIDER_CONFIG) + r"-[a-z0-9]{10}$")


def find_provider_config(docs):
    """The provider's ConfigMap of an overlay: deploy/base's configMapGenerator (hashed name)."""
    found = [d for d in docs if d.get("kind") == "ConfigMap" and HASHED.match(d["metadata"]["name"])]
    return found[0] if len(found) == 1 else None


def config_refs(docs):
    """The names of every ConfigMap the overlay's workloads mount as the provider's config."""
    refs = []
    for d in docs:
        spec = ((d.get("spec") or {}).get("template") or {}).get("spec") or {}
        for v in spec.get("volumes") or []:
            name = (v.get("configMap") or {}).get("name", "")
            if name.startswith(PROVIDER_CONFIG):
                refs.append(name)
    return refs


def config_rollout_errors(overlay, tree=None, edit=True):
    """Promise: a config change through an overlay is applied. The provider reads its file
    once, so the ConfigMap must be renamed by every edit (kustomize's hash suffix) and the
    pod template must name exactly that ConfigMap: `kubectl apply -k` then rolls the pods.
    Renders `overlay` from a copy of deploy/ (`tree`, or ROOT/deploy), edits the config
    file its ConfigMap is generated from and renders again."""
    errs = []
    with tempfile.TemporaryDirectory() as tmp:
        deploy = pathlib.Path(tmp) / "deploy"
        shutil.copytree(tree or ROOT / "deploy", deploy, ignore=shutil.ignore_patterns("chart", "dashboards"))
        target = deploy / "overlays" / overlay

        def one(docs, when):
            cm = find_provider_config(docs)
            if cm is None:
                names = [d["metadata"]["name"] for d in docs if d.get("kind") == "ConfigMap"]
                return None, [f"{when}: no one ConfigMap {PROVIDER_CONFIG}-<hash> (ConfigMaps: {names}); "
                              f"an edit of the config would not roll the pods"]
            name, refs = cm["metadata"]["name"], config_refs(docs)
            if not refs or set(refs) != {name}:
                return cm, [f"{when}: the pods mount {refs}, not the generated ConfigMap {name}"]
            return cm, []

        before, e = one(render(target), "as shipped")
        errs += e
        if before is None or not edit:
            return errs
        src = target / "config.yaml"
        if not src.exists():
            src = deploy / "base" / "config.yaml"
        text = src.read_text()
        if "refreshInterval: 60s" not in text:
            return errs + [f"{src.relative_to(tmp)}: no `refreshInterval: 60s` to edit"]
        src.write_text(text.replace("refreshInterval: 60s", "refreshInterval: 45s"))
        after, e = one(render(target), "after an edit of the config")
        errs += e
        if after is not None:
            if after["metadata"]["name"] == before["metadata"]["name"]:
                errs.append(f"an edit of {src.relative_to(tmp)} left the ConfigMap's name "
                            f"{before['metadata']['name']}: the pods would keep the old config")
            if "refreshInterval: 45s" not in after["data"].get("config.yaml", ""):
                errs.append(f"the ConfigMap is not generated from {src.relative_to(tmp)}")
    return errs


def config_rollout_selftest():
    """The check must fail on an overlay whose ConfigMap keeps a fixed name."""
    with tempfile.TemporaryDirectory() as tmp:
        tree = pathlib.Path(tmp) / "deploy"
        shutil.copytree(ROOT / "deploy", tree, ignore=shutil.ignore_patterns("chart", "dashboards"))
        k = tree / "base" / "kustomization.yaml"
        k.write_text(k.read_text() + "generatorOptions: {disableNameSuffixHash: true}\n")
        if not config_rollout_errors("sidecar", tree):
            return ["config_rollout_errors passed an overlay whose ConfigMap has no hash suffix"]
    return []


# ---------------------------------------------------------------- RBAC audit

WRITE_VERBS = {"create", "update", "patch", "delete", "deletecollection"}
# Verbs that grant more than a write of one object; nothing here needs them.
NEVER_VERBS = {"escalate", "bind", "impersonate", "approve", "sign"}
# Cluster-wide writes to these hand over the cluster (kube-system/aws-auth maps IAM
# roles to groups such as system:masters; Secrets hold tokens).
NO_CLUSTER_WRITE = {"configmaps", "secrets"}
CA_LEASE, CA_STATUS = "cluster-autoscaler", "cluster-autoscaler-status"

# cluster-autoscaler's writes under --cloud-provider=externalgrpc, each with its reason:
# (verb, apiGroup, resource) -> (scope, names key or None). A names key means the rule
# must carry resourceNames, all of them among those names (create cannot be limited by
# name: RBAC does not know the name before the object exists). Each is in
# tests/e2e/ca_permissions.rs with the CA file and function it comes from, per version;
# no CA from 1.31 on writes pod status or anything in resource.k8s.io.
CA_WRITES = {
    ("create", "", "events"): ("cluster", None),        # Events on pods and nodes, in their namespaces
    ("patch", "", "events"): ("cluster", None),         # the same Event again (count)
    ("create", "", "pods/eviction"): ("cluster", None),  # CA's own scale-down eviction of workloads
    ("update", "", "nodes"): ("cluster", None),         # ToBeDeletedByClusterAutoscaler / DeletionCandidate taints, the cordon (>= 1.34)
    ("create", "coordination.k8s.io", "leases"): ("namespace", None),  # leader election
    ("update", "coordination.k8s.io", "leases"): ("namespace", "ca-lease"),
    ("create", "", "configmaps"): ("namespace", None),  # the status ConfigMap, first write
    ("update", "", "configmaps"): ("namespace", "ca-status"),
    ("delete", "", "configmaps"): ("namespace", "ca-status"),  # CA removes it on exit
}


def provider_writes():
    """ca-asg-provider's writes: those of scalein::permissions::REQUIRED (which the sim's
    RbacUse records tie to the requests the code makes), leases namespaced and the update
    limited to the provider's Lease."""
    src = (ROOT / "src/scalein/kube/permissions.rs").read_text()
    m = re.search(r"pub const REQUIRED: &\[Permission\] = &\[(.*?)\n\];", src, re.S)
    if not m:
        raise SystemExit("validate.py: REQUIRED not found in src/scalein/kube/permissions.rs")
    perms = re.findall(r'p\(\s*"(\w+)",\s*"([\w.]*)",\s*"([\w/]+)"', m.group(1))
    if len(perms) != m.group(1).count("p("):
        raise SystemExit(f"validate.py: parsed {len(perms)} of {m.group(1).count('p(')} permissions in REQUIRED")
    out = {}
    for verb, group, resource in perms:
        if verb in WRITE_VERBS:
            lease = resource == "leases"
            out[(verb, group, resource)] = ("namespace" if lease else "cluster",
                                            "provider-lease" if lease and verb != "create" else None)
    if ("create", "", "pods/eviction") not in out:
        raise SystemExit(f"validate.py: REQUIRED parsed as {perms}: no eviction, revisit the parse")
    return out


def role_owner(name, provider):
    """Whose role: the provider's (deploy/base's ca-asg-provider, the chart's <fullname>,
    and <fullname>-remove-hooks, the uninstall Job's: `undrain --all`, a subset of the
    provider's) or cluster-autoscaler's (deploy/cluster-autoscaler's, the chart's
    <fullname>-cluster-autoscaler)."""
    return {provider: "ca-asg-provider", f"{provider}-remove-hooks": "ca-asg-provider",
            "cluster-autoscaler": "cluster-autoscaler",
            f"{provider}-cluster-autoscaler": "cluster-autoscaler"}.get(name)


def rbac_audit(docs, names, provider="ca-asg-provider"):
    """Least privilege, for every Role and ClusterRole in one render: no `*`, no
    escalate/bind/impersonate, no Secrets at all, no cluster-wide ConfigMap or Secret
    write, and every write one its owner needs (CA_WRITES, or the provider's REQUIRED),
    in the scope it needs, limited to the names it needs. `names` maps a names key of
    CA_WRITES / provider_writes() to the allowed resourceNames. Bindings must point at
    an audited role. `provider` is the name of the provider's roles."""
    errs = []
    needs = {"cluster-autoscaler": CA_WRITES, "ca-asg-provider": PROVIDER_WRITES}
    roles = {(d["kind"], d["metadata"]["name"]) for d in docs if d.get("kind") in ("Role", "ClusterRole")}
    for d in docs:
        kind = d.get("kind")
        if kind in ("RoleBinding", "ClusterRoleBinding"):
            ref = d.get("roleRef") or {}
            if (ref.get("kind"), ref.get("name")) not in roles:
                errs.append(f"{kind}/{d['metadata']['name']}: binds {ref.get('kind')}/{ref.get('name')}, "
                            f"which is not rendered here (its rules escape this audit)")
        if kind not in ("Role", "ClusterRole"):
            continue
        name = d["metadata"]["name"]
        who = role_owner(name, provider)
        if who is None:
            errs.append(f"{kind}/{name}: neither cluster-autoscaler's nor ca-asg-provider's; add it to the audit")
            continue
        scope = "cluster" if kind == "ClusterRole" else "namespace"
        for i, r in enumerate(d.get("rules") or []):
            at = f"{kind}/{name} rule {i}"
            verbs, groups = r.get("verbs") or [], r.get("apiGroups") or []
            resources, rnames = r.get("resources") or [], r.get("resourceNames") or []
            for field, vals in (("verbs", verbs), ("apiGroups", groups), ("resources", resources),
                                ("resourceNames", rnames)):
                if any("*" in v for v in vals):
                    errs.append(f"{at}: {field} {vals} has a wildcard")
            if r.get("nonResourceURLs"):
                errs.append(f"{at}: nonResourceURLs {r['nonResourceURLs']}: not needed")
            for v in sorted(set(verbs) & NEVER_VERBS):
                errs.append(f"{at}: verb {v!r} grants more than any write here needs")
            for res in resources:
                if res.split("/")[0] == "secrets":
                    errs.append(f"{at}: {verbs} on {res}: neither CA nor the provider reads or writes Secrets")
            for verb in verbs:
                if verb not in WRITE_VERBS:
                    continue
                for group in groups:
                    for res in resources:
                        w = f"{at}: {verb} {group or 'core'}/{res}"
                        if scope == "cluster" and res.split("/")[0] in NO_CLUSTER_WRITE:
                            errs.append(f"{w}: cluster-wide write to {res.split('/')[0]} "
                                        f"(enough to rewrite kube-system/aws-auth); use a Role, by name")
                            continue
                        need = needs[who].get((verb, group, res))
                        if need is None:
                            errs.append(f"{w}: {who} does not need this write")
                            continue
                        need_scope, key = need
                        if need_scope == "namespace" and scope == "cluster":
                            errs.append(f"{w}: {who} needs it in its own namespace only (a Role)")
                        if verb == "create" and rnames:
                            errs.append(f"{w}: resourceNames {rnames} never match a create (the rule is dead)")
                        if key and verb != "create":
                            allowed = names[key]
                            if not rnames or not set(rnames) <= allowed:
                                errs.append(f"{w}: resourceNames {rnames or '(none: every object)'} must be "
                                            f"among {sorted(allowed)}")
    return errs


def rbac_names(docs, provider_lease="ca-asg-provider"):
    """The names the roles may write, as this render configures them: CA's Lease and
    status ConfigMap (its --leader-elect-resource-name / --status-config-map-name, or the
    defaults) and the provider's Lease."""
    flags = {}
    for d in docs:
        for c in pod_containers(d):
            if c.get("name") == "cluster-autoscaler":
                for a in (c.get("command") or []) + (c.get("args") or []):
                    k, _, v = a.lstrip("-").partition("=")
                    flags[k] = v
    return {"ca-lease": {flags.get("leader-elect-resource-name", CA_LEASE)},
            "ca-status": {flags.get("status-config-map-name", CA_STATUS)},
            "provider-lease": {provider_lease}}


def rbac_audit_selftest():
    """The audit catches what it is for (else it could pass by matching nothing)."""
    role = lambda kind, name, *rules: {"kind": kind, "metadata": {"name": name}, "rules": list(rules)}
    rule = lambda verbs, res, group="", names=None: dict(apiGroups=[group], resources=res, verbs=verbs,
                                                         **({"resourceNames": names} if names else {}))
    bad = {
        "cluster-wide ConfigMap write (the old CA ClusterRole)":
            role("ClusterRole", "cluster-autoscaler", rule(["create", "list", "watch", "get", "update", "delete"], ["configmaps"])),
        "cluster-wide Secret write": role("ClusterRole", "ca-asg-provider", rule(["patch"], ["secrets"])),
        "Secret read": role("Role", "cluster-autoscaler", rule(["get"], ["secrets"])),
        "`*` verb": role("ClusterRole", "ca-asg-provider", rule(["*"], ["nodes"])),
        "`*` resource": role("ClusterRole", "ca-asg-provider", rule(["get"], ["*"])),
        "`*` apiGroup": role("ClusterRole", "ca-asg-provider", rule(["get"], ["nodes"], "*")),
        "a write the provider does not need": role("ClusterRole", "ca-asg-provider", rule(["delete"], ["nodes"])),
        "a write CA does not need (endpoints)": role("ClusterRole", "cluster-autoscaler", rule(["create"], ["endpoints"])),
        "a pod status write (CA sets none)": role("ClusterRole", "cluster-autoscaler", rule(["update"], ["pods/status"])),
        "ConfigMap update in CA's namespace, any name":
            role("Role", "cluster-autoscaler", rule(["update"], ["configmaps"])),
        "ConfigMap update by another name":
            role("Role", "cluster-autoscaler", rule(["update"], ["configmaps"], names=["aws-auth"])),
        "the provider's Lease update cluster-wide":
            role("ClusterRole", "ca-asg-provider", rule(["update"], ["leases"], "coordination.k8s.io", ["ca-asg-provider"])),
        "escalate": role("ClusterRole", "ca-asg-provider", rule(["escalate"], ["clusterroles"], "rbac.authorization.k8s.io")),
        "a binding to an unaudited role": {"kind": "ClusterRoleBinding", "metadata": {"name": "x"},
                                           "roleRef": {"kind": "ClusterRole", "name": "cluster-admin"}},
    }
    names = rbac_names([])
    errs = [f"rbac_audit misses {what}" for what, doc in bad.items() if not rbac_audit([doc], names)]
    good = [role("Role", "cluster-autoscaler", rule(["create"], ["configmaps"]),
                 rule(["get", "update", "delete"], ["configmaps"], names=[CA_STATUS]))]
    errs += [f"rbac_audit refuses a good role: {e}" for e in rbac_audit(good, names)]
    return errs


PROVIDER_WRITES = provider_writes()


# ---------------------------------------------------------------- the Rust side

def rust_struct_fields(src, struct):
    """Field names of `pub struct NAME { ... }` as serde spells them (rename_all =
    camelCase, or an explicit #[serde(rename = "...")])."""
    m = re.search(r"pub struct " + struct + r"\s*\{(.*?)\n\}", src, re.S)
    if not m:
        raise SystemExit(f"validate.py: struct {struct} not found in the Rust source")
    names, rename = [], None
    for line in m.group(1).splitlines():
        r = re.search(r'#\[serde\(.*rename\s*=\s*"([^"]+)"', line)
        if r:
            rename = r.group(1)
        f = re.match(r"\s*pub (\w+):", line)
        if f:
            head, *rest = f.group(1).split("_")
            names.append(rename or head + "".join(w.capitalize() for w in rest))
            rename = None
    return names


def rust_config_shape():
    """Key tree of the provider's config file: {key: subtree or None}."""
    cfg = (ROOT / "src/config/mod.rs").read_text()
    tmpl = (ROOT / "src/provider/template/mod.rs").read_text()
    for src, struct in ((cfg, "FileConfig"), (cfg, "ScaleInFile"), (cfg, "TlsFile"), (cfg, "AwsConfig"),
                        (cfg, "StaticGroup"), (cfg, "Discovery"), (tmpl, "TemplateOverrides")):
        if not re.search(r"deny_unknown_fields[^\]]*\]\s*pub struct " + struct + r"\b", src):
            raise SystemExit(f"validate.py: {struct} no longer denies unknown fields; revisit this check")
    leaf = lambda src, s: {k: None for k in rust_struct_fields(src, s)}
    shape = leaf(cfg, "FileConfig")
    shape.update(scaleIn=leaf(cfg, "ScaleInFile"), tls=leaf(cfg, "TlsFile"), aws=leaf(cfg, "AwsConfig"),
                 nodeGroups=[leaf(cfg, "StaticGroup")], autoDiscovery=[leaf(cfg, "Discovery")],
                 templates={"*": leaf(tmpl, "TemplateOverrides")})
    return shape


def config_key_errors(value, shape, path="config"):
    """Keys in a provider config (or the config part of values) that the Rust structs
    would refuse (deny_unknown_fields)."""
    errs = []
    if isinstance(shape, list):
        for i, item in enumerate(value or []):
            errs += config_key_errors(item, shape[0], f"{path}[{i}]")
    elif isinstance(shape, dict) and list(shape) == ["*"]:
        for k, v in (value or {}).items():
            errs += config_key_errors(v, shape["*"], f"{path}.{k}")
    elif isinstance(shape, dict):
        if not isinstance(value, dict):
            return [f"{path}: expected a map"]
        for k, v in value.items():
            if k not in shape:
                errs.append(f"{path}.{k}: not a key of the provider's config (src/config/mod.rs)")
            elif shape[k] is not None:
                errs += config_key_errors(v, shape[k], f"{path}.{k}")
    return errs


def schema_config_errors(schema, shape, path="config"):
    """values.schema.json's `config` must describe exactly the Rust config keys, and deny
    any other (additionalProperties: false), as the program does."""
    errs = []
    if isinstance(shape, list):
        return schema_config_errors(schema.get("items", {}), shape[0], path + "[]")
    if list(shape) == ["*"]:
        return schema_config_errors(schema.get("additionalProperties", {}), shape["*"], path + ".*")
    props = schema.get("properties", {})
    if schema.get("additionalProperties") is not False:
        errs.append(f"schema {path}: additionalProperties must be false")
    if set(props) != set(shape):
        errs.append(f"schema {path}: keys differ from the Rust struct: only in schema {sorted(set(props) - set(shape))}, "
                    f"only in Rust {sorted(set(shape) - set(props))}")
    for k, sub in shape.items():
        if sub is not None and k in props:
            errs += schema_config_errors(props[k], sub, f"{path}.{k}")
    return errs


TARGET_LABELS = {"namespace", "pod", "job", "instance", "service", "container", "endpoint"}


def rust_metrics():
    """{exposed series name: label names} for every metric src/telemetry/metrics.rs
    registers, as prometheus_client exposes them (prefix, _total for counters,
    _bucket/_sum/_count for histograms)."""
    src = (ROOT / "src/telemetry/metrics.rs").read_text()
    # The registries: the root (no prefix: the standard process_* names) and its
    # sub-registry with the service's prefix.
    prefixes = {m.group(1): "" for m in re.finditer(r"let (?:mut )?(\w+) = Registry::default\(\);", src)}
    for m in re.finditer(r'let (\w+) = (\w+)\.sub_registry_with_prefix\(\s*"(\w+)"\s*\)', src):
        prefixes[m.group(1)] = m.group(3)
    named = [p for p in prefixes.values() if p]
    if len(named) != 1:
        raise SystemExit(f"validate.py: expected one prefixed registry in metrics.rs, found {prefixes}")
    prefix = named[0]
    labels = {m.group(1): re.findall(r"pub (\w+):", m.group(2))
              for m in re.finditer(r"pub struct (\w+)\s*\{([^}]*)\}", src)}
    struct = re.search(r"pub struct Metrics\s*\{(.*?)\n\}", src, re.S).group(1)
    fields = {}
    for name, family, kind in re.findall(r"pub (\w+):\s*(?:Family<\s*(\w+)\s*,\s*)?(Counter|Gauge|Histogram)\b", struct):
        fields[name] = (kind, labels.get(family, []) if family else [])
    series = {}
    regs = re.findall(r'(\w+)\.register\(\s*"(\w+)"\s*,\s*"(?:[^"\\]|\\.)*"\s*,\s*m\.(\w+)\.clone\(\)', src)
    for reg, name, field in regs:
        if field not in fields:
            raise SystemExit(f"validate.py: metric {name} registers m.{field}, whose type was not understood")
        if reg not in prefixes:
            raise SystemExit(f"validate.py: metric {name} is registered in {reg}, a registry not understood")
        kind, lbl = fields[field]
        base = f"{prefixes[reg]}_{name}" if prefixes[reg] else name
        if not prefixes[reg] and not name.startswith("process_"):
            raise SystemExit(f"validate.py: metric {name} has no prefix; only the standard process_* names may")
        if kind == "Counter":
            series[base + "_total"] = set(lbl)
        elif kind == "Gauge":
            series[base] = set(lbl)
        else:
            series[base + "_bucket"] = set(lbl) | {"le"}
            series[base + "_sum"] = set(lbl)
            series[base + "_count"] = set(lbl)
    if len(regs) < 15 or len(regs) != src.count(".register("):
        raise SystemExit(f"validate.py: parsed {len(regs)} of {src.count('.register(')} metric registrations in metrics.rs")
    return prefix, series


def own_names(expr, prefix):
    """The service's metric names in a PromQL expression: its prefix, and the standard
    unprefixed process_* it exports."""
    return re.findall(r"\b((?:" + prefix + r"|process)_\w+)", expr)


def promql_errors(expr, prefix, series):
    """Metric names and label matchers in one PromQL expression that the code does not have."""
    errs = []
    names = own_names(expr, prefix)
    if not re.search(r"\b" + prefix + r"_\w+", expr):
        errs.append(f"{expr!r}: queries no {prefix}_ metric (process_* alone would match every process)")
    for n in names:
        if n not in series:
            errs.append(f"{n}: no such metric in src/telemetry/metrics.rs")
    for n, matchers in re.findall(r"\b((?:" + prefix + r"|process)_\w+)\{([^}]*)\}", expr):
        for label in re.findall(r"(\w+)\s*(?:=~|!~|!=|=)", matchers):
            if n in series and label not in series[n] | TARGET_LABELS:
                errs.append(f"{n}{{{label}=...}}: the metric has no label {label!r}")
    return errs


def runbook_anchors():
    """GitHub's anchors for the headings of docs/operations.md, where the runbooks are."""
    out = set()
    for line in (ROOT / "docs/operations.md").read_text().splitlines():
        m = re.match(r"#{1,6}\s+(.*)", line)
        if m:
            slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            out.add(slug)
    return out


# ---------------------------------------------------------------- Helm

def helm_binary():
    local = ROOT / ".venv/bin/helm"
    found = str(local) if local.exists() else shutil.which("helm")
    if not found:
        raise SystemExit("validate.py: helm not found (scripts/test.sh installs it into .venv/bin)")
    return found


def helm(*args, env):
    return subprocess.run([HELM, *args], capture_output=True, text=True, env=env)


def merged(base, over):
    """Helm's values merge: maps merge key by key, everything else is replaced."""
    out = copy.deepcopy(base)
    for k, v in (over or {}).items():
        out[k] = merged(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else copy.deepcopy(v)
    return out


def chart_binding_errors(values, docs, doc):
    """The bindings of the chart's roles name the ServiceAccount of the mode: CA's
    (sidecar, clusterAutoscaler.serviceAccountName) or the provider Deployment's own."""
    if doc.get("kind") not in ("ClusterRoleBinding", "RoleBinding"):
        return []
    if values["mode"] == "sidecar":
        want = values["clusterAutoscaler"]["serviceAccountName"]
    else:
        dep = find(docs, "Deployment")
        want = dep["spec"]["template"]["spec"]["serviceAccountName"] if dep else None
        if values["serviceAccount"]["create"] and not find(docs, "ServiceAccount", want):
            return [f"the Deployment's ServiceAccount {want!r} is not rendered"]
    got = [(s.get("kind"), s.get("name"), s.get("namespace")) for s in doc.get("subjects", [])]
    return [] if got == [("ServiceAccount", want, NAMESPACE)] else [f"subjects {got}: expected [{want!r}] in {NAMESPACE}"]


def provider_config(docs, values):
    cms = [d for d in docs if d.get("kind") == "ConfigMap" and "config.yaml" in (d.get("data") or {})]
    if len(cms) != 1:
        return None
    return yaml.safe_load(cms[0]["data"]["config.yaml"])


def standalone_wiring_errors(docs, values, cfg):
    """The Deployment, Service, config and certificates of standalone mode agree."""
    errs = []
    dep, svc = find(docs, "Deployment"), find(docs, "Service")
    if not dep or not svc:
        return ["standalone mode must render one Deployment and one Service"]
    pod = dep["spec"]["template"]["spec"]
    c = pod["containers"][0]
    mounts = {m["name"]: m["mountPath"] for m in c.get("volumeMounts", [])}
    vols = {v["name"]: v for v in pod.get("volumes", [])}
    ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
    cfg_path = c["args"][c["args"].index("--config") + 1]
    if cfg_path != f"{mounts.get('config')}/config.yaml":
        errs.append(f"--config {cfg_path} is not config.yaml in the config volume ({mounts.get('config')})")
    for k in ("cert", "key", "clientCA"):
        if not str(cfg["tls"][k]).startswith(mounts.get("tls", "?") + "/"):
            errs.append(f"config tls.{k} {cfg['tls'][k]} is outside the tls volume ({mounts.get('tls')})")
    if cfg["listen"] != f"0.0.0.0:{ports.get('grpc')}" or not str(cfg["metricsListen"]).endswith(f":{ports.get('metrics')}"):
        errs.append(f"listen {cfg['listen']} / metricsListen {cfg['metricsListen']} do not match the container ports {ports}")
    for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        get = c.get(probe, {}).get("httpGet", {})
        if get.get("path") != path or get.get("port") != "metrics":
            errs.append(f"{probe} must GET {path} on the metrics port")
    secret = vols.get("tls", {}).get("secret", {}).get("secretName")
    certs = {d["spec"]["secretName"]: d for d in docs if d.get("kind") == "Certificate"}
    if values["tls"]["certManager"]["enabled"]:
        server = certs.get(secret)
        host = f"{svc['metadata']['name']}.{NAMESPACE}.svc"
        if not server or host not in server["spec"].get("dnsNames", []):
            errs.append(f"no Certificate writes the server Secret {secret!r} for {host}")
        if values["tls"]["clientSecretName"] not in certs:
            errs.append(f"no Certificate writes CA's client Secret {values['tls']['clientSecretName']!r}")
    cloud = find(docs, "ConfigMap", values["clusterAutoscaler"]["cloudConfig"]["name"])
    if values["clusterAutoscaler"]["cloudConfig"]["create"]:
        cc = yaml.safe_load(cloud["data"]["cloud-config.yaml"]) if cloud else {}
        want = f"{svc['metadata']['name']}.{NAMESPACE}.svc:{values['ports']['grpc']}"
        if cc.get("address") != want or not all(cc.get(k) for k in ("cert", "key", "cacert")):
            errs.append(f"CA's cloud-config {cc} must name {want} and the client certificate files")
    sel = dep["spec"]["selector"]["matchLabels"]
    if svc["spec"]["selector"] != sel or not all(dep["spec"]["template"]["metadata"]["labels"].get(k) == v for k, v in sel.items()):
        errs.append("the Service selector, Deployment selector and pod labels disagree")
    return errs


def ca_flags_section():
    text = (ROOT / "docs/configuration.md").read_text()
    if "\n## CA flags to set\n" not in text:
        raise SystemExit("validate.py: docs/configuration.md has no '## CA flags to set' section")
    return text.split("\n## CA flags to set\n", 1)[1].split("\n#", 1)[0]


def balancing_table_labels():
    """The labels of docs/configuration.md's balancing table (in "CA flags to set": the table whose
    first header cell is `label`), one `--balancing-ignore-label` each, in order."""
    labels, in_table = [], False
    for line in ca_flags_section().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("|"):
            in_table = False
        elif cells[0] == "label":
            in_table = True
        elif in_table and not set(cells[0]) <= set("-: "):
            m = re.fullmatch(r"`([^`\s]+)`", cells[0])
            if not m:
                raise SystemExit(f"validate.py: docs/configuration.md balancing table row {line!r}: first cell must be one `label`")
            labels.append(m.group(1))
    if len(labels) < 5:
        raise SystemExit(f"validate.py: parsed only {labels} from docs/configuration.md's balancing label table")
    return labels


def ca_flags_table():
    """Every flag of docs/configuration.md's "CA flags to set" table, as --NAME=VALUE: the backticked
    flags of each row's first cell, and the bare words after a flag (further values of that
    flag); then one --balancing-ignore-label=LABEL per row of the balancing label table."""
    flags = []
    for line in ca_flags_section().splitlines():
        if not line.startswith("| `"):
            continue
        last = None
        for tok in re.findall(r"`([^`]+)`", line.split("|")[1]):
            for part in tok.split():
                m = re.match(r"--([\w-]+)=(\S+)$", part)
                if m:
                    last = m.group(1)
                    flags.append(part)
                elif last:
                    flags.append(f"--{last}={part}")
    flags += [f"--balancing-ignore-label={l}" for l in balancing_table_labels()]
    if len(flags) < 5:
        raise SystemExit(f"validate.py: parsed only {flags} from docs/configuration.md's CA flags table")
    return flags


BALANCING = "balancing-ignore-label"


def balancing_label_lists(overlays):
    """{where: [label, ...]} for every place that passes CA its --balancing-ignore-label
    flags: each overlay's cluster-autoscaler container, each example values file for CA's
    chart (extraArgs balancing-ignore-label_N) and the chart's bundled-mode defaults."""
    lists = {}
    for name, docs in sorted(overlays.items()):
        for dep in (d for d in docs if d.get("kind") == "Deployment"):
            for c in pod_containers(dep):
                if c["name"] == "cluster-autoscaler":
                    args = (c.get("command") or []) + (c.get("args") or [])
                    lists[f"deploy/overlays/{name}"] = [a.split("=", 1)[1] for a in args
                                                        if a.startswith(f"--{BALANCING}=")]
    for path in sorted((CHART / "examples").glob("cluster-autoscaler*-values.yaml")):
        args = yaml.safe_load(path.read_text()).get("extraArgs") or {}
        # CA's chart drops what follows a `_` in an extraArgs name (balancing-ignore-label_1).
        lists[f"deploy/chart/examples/{path.name}"] = [str(v) for k, v in args.items()
                                                      if k.split("_")[0] == BALANCING]
    flags = yaml.safe_load((CHART / "values.yaml").read_text())["clusterAutoscaler"]["flags"]
    lists["deploy/chart/values.yaml clusterAutoscaler.flags"] = list(flags.get(BALANCING) or [])
    return lists


def balancing_label_errors(overlays):
    """Every list of --balancing-ignore-label values is exactly docs/configuration.md's table: the
    same labels, each once."""
    want = balancing_table_labels()
    errs = [f"docs/configuration.md balancing table: {l} is listed twice" for l in sorted({l for l in want if want.count(l) > 1})]
    lists = balancing_label_lists(overlays)
    if len(lists) < 5:
        errs.append(f"found only {sorted(lists)} passing --{BALANCING} (expected 2 overlays, 2 examples, values.yaml)")
    for where, got in lists.items():
        missing = [l for l in want if l not in got]
        extra = [l for l in got if l not in want]
        twice = sorted({l for l in got if got.count(l) > 1})
        for what, ls in (("lacks", missing), ("has, not in the docs/configuration.md table,", extra), ("repeats", twice)):
            if ls:
                errs.append(f"{where}: --{BALANCING} {what} {ls}")
    return errs, len(want), sorted(lists)


def bundled_wiring_errors(docs, values, cfg, ca_rules):
    """Bundled mode: CA and the provider in one pod, wired through the cloud-config on
    127.0.0.1, CA's flags docs/configuration.md's, CA's RBAC deploy/cluster-autoscaler's."""
    errs = []
    dep = find(docs, "Deployment")
    if not dep:
        return ["bundled mode must render one Deployment"]
    for kind in ("Certificate", "Issuer"):
        if find(docs, kind):
            errs.append(f"bundled mode must not render a {kind}")
    pod = dep["spec"]["template"]["spec"]
    cs = {c["name"]: c for c in pod["containers"]}
    ca, prov = cs.get("cluster-autoscaler"), cs.get("ca-asg-provider")
    if not ca or not prov:
        return [f"the pod needs containers cluster-autoscaler and ca-asg-provider, has {sorted(cs)}"]
    cmd = ca.get("command") or []
    missing = [f for f in ca_flags_table() if f not in cmd]
    if missing:
        errs.append(f"CA's flags lack {missing} (docs/configuration.md 'CA flags to set')")
    for want in ("--cloud-provider=externalgrpc", f"--namespace={NAMESPACE}"):
        if want not in cmd:
            errs.append(f"CA's flags lack {want}")
    vols = {v["name"]: v for v in pod.get("volumes", [])}
    cloud_arg = next((a for a in cmd if a.startswith("--cloud-config=")), "--cloud-config=?")
    cloud = pathlib.PurePosixPath(cloud_arg.split("=", 1)[1])
    mount = next((m for m in ca.get("volumeMounts", []) if m["mountPath"] == str(cloud.parent)), {})
    cc_name = values["clusterAutoscaler"]["cloudConfig"]["name"]
    if vols.get(mount.get("name"), {}).get("configMap", {}).get("name") != cc_name or cloud.name != "cloud-config.yaml":
        errs.append(f"{cloud_arg} is not cloud-config.yaml of the mounted ConfigMap {cc_name!r}")
    cloud_cm = find(docs, "ConfigMap", cc_name)
    if values["clusterAutoscaler"]["cloudConfig"]["create"]:
        cc = yaml.safe_load(cloud_cm["data"]["cloud-config.yaml"]) if cloud_cm else {}
        listen = str(cfg.get("listen"))
        if values["transport"] == "unix":
            sock_dir = values["socketDir"].rstrip("/")
            want = f"unix://{sock_dir}/grpc.sock"
            if cc.get("address") != listen or listen != want:
                errs.append(f"CA's cloud-config address {cc.get('address')} is not the provider's listen {listen} on {want}")
            # One emptyDir, mounted at socketDir in both containers, and no gRPC port.
            for c in (ca, prov):
                m = next((m for m in c.get("volumeMounts", []) if m["mountPath"] == sock_dir), None)
                if not m or "emptyDir" not in vols.get(m["name"], {}):
                    errs.append(f"container {c['name']} does not mount an emptyDir at {sock_dir}")
                if any(p.get("containerPort") == values["ports"]["grpc"] for p in c.get("ports", [])):
                    errs.append(f"container {c['name']} exposes the gRPC port with transport unix")
            sec = pod.get("securityContext") or {}
            if not (sec.get("runAsUser") and sec.get("runAsGroup")):
                errs.append("the pod must set runAsUser and runAsGroup: the socket (0660) is the pod's user and group only")
        elif cc.get("address") != listen or not listen.startswith("127.0.0.1:"):
            errs.append(f"CA's cloud-config address {cc.get('address')} is not the provider's listen {listen} on 127.0.0.1")
    mounts = {m["name"]: m["mountPath"] for m in prov.get("volumeMounts", [])}
    cfg_path = prov["args"][prov["args"].index("--config") + 1]
    if cfg_path != f"{mounts.get('config')}/config.yaml" \
            or vols.get("config", {}).get("configMap", {}).get("name") != provider_config_name(docs):
        errs.append(f"the provider's --config {cfg_path} is not config.yaml of its ConfigMap")
    if values["rbac"]["create"]:
        # The Role's names as CA's flags set them (rbac_names), the rest as deploy/'s.
        names = rbac_names(docs)
        default = {CA_LEASE: next(iter(names["ca-lease"])), CA_STATUS: next(iter(names["ca-status"]))}
        for kind, want in ca_rules.items():
            want = [dict(r, resourceNames=[default.get(n, n) for n in r["resourceNames"]]) if "resourceNames" in r else r
                    for r in want]
            roles = [d for d in docs if d["kind"] == kind and d["metadata"]["name"].endswith("-cluster-autoscaler")]
            if len(roles) != 1 or roles[0]["rules"] != want:
                errs.append(f"CA's {kind} rules differ from deploy/cluster-autoscaler/rbac.yaml's:\n"
                            f"  chart: {roles and roles[0]['rules']}\n  deploy: {want}")
    return errs


QUICKSTART = CHART / "examples/quickstart-values.yaml"

# What the chart requires on top of values.yaml, per mode: the cluster's name (the
# discovery tags are derived from it), and where the chart runs the provider's container,
# an image repository (values.yaml's is a placeholder, refused).
CI_CLUSTER = {"clusterName": "ci-cluster"}
RUNBOOKS = "https://gitlab.platform.internal/platform/ca-asg-provider/-/blob/v0.1.0/docs/operations.md"
CI_IMAGE = {"image": {"repository": "123456789012.dkr.ecr.us-east-1.amazonaws.com/ca-asg-provider"}}
REQUIRED = {"sidecar": CI_CLUSTER, "standalone": merged(CI_CLUSTER, CI_IMAGE), "bundled": merged(CI_CLUSTER, CI_IMAGE)}


def cluster_neutral(cfg):
    """A provider config with the cluster name of its discovery tags left out: the
    chart's renders name a cluster, deploy/'s plain manifests the placeholder."""
    out = copy.deepcopy(cfg)
    for d in out.get("autoDiscovery") or []:
        d["tags"] = [re.sub(r"^k8s\.io/cluster-autoscaler/(?!enabled\b)[^=]+", "k8s.io/cluster-autoscaler/<cluster>", t)
                     for t in d.get("tags") or []]
    return out


def quickstart_errors(docs, values, cfg):
    """The quickstart's values: the chart's recommended one-install mode, the region set
    (never guessed), the cluster named in the discovery tags, and the ServiceAccount the
    quickstart's IAM trust policies (docs/quickstart-eks.md) name."""
    errs = []
    if values["mode"] != "bundled":
        errs.append(f"mode {values['mode']!r}: the quickstart installs bundled mode (CA and the provider in one release)")
    if not (cfg.get("aws") or {}).get("region"):
        errs.append("config.aws.region must be set: the quickstart never relies on a guessed region")
    tags = [t for d in cfg.get("autoDiscovery") or [] for t in d.get("tags") or []]
    if "k8s.io/cluster-autoscaler/enabled" not in tags or not any(
            t.startswith("k8s.io/cluster-autoscaler/") and t != "k8s.io/cluster-autoscaler/enabled" for t in tags):
        errs.append(f"autoDiscovery tags {tags} must be k8s.io/cluster-autoscaler/enabled and k8s.io/cluster-autoscaler/<cluster>")
    dep = find(docs, "Deployment")
    sa = dep and dep["spec"]["template"]["spec"].get("serviceAccountName")
    readme = (ROOT / "docs/quickstart-eks.md").read_text()
    if f"system:serviceaccount:{NAMESPACE}:{sa}" not in readme or f"--service-account {sa}" not in readme:
        errs.append(f"the quickstart's (docs/quickstart-eks.md) IRSA trust policy and Pod Identity association must name "
                    f"{NAMESPACE}/{sa}, the ServiceAccount this file renders")
    if "VALUES=my-values.yaml" not in readme or "deploy/quickstart/install.sh" not in readme:
        errs.append("the quickstart (docs/quickstart-eks.md) does not install with deploy/quickstart/install.sh and VALUES=my-values.yaml")
    # Issue 74, 6: the pods stay off the nodes the service drains (a node group it does not manage).
    if set((values.get("nodeSelector") or {})) <= {"kubernetes.io/os"}:
        errs.append(f"nodeSelector {values.get('nodeSelector')}: the quickstart must keep the pods on a node group the service does not scale in")
    return errs


QUICKSTART_VARS = {"ACCOUNT_ID": "210987654321", "AWS_REGION": "ap-southeast-2", "CLUSTER": "prod-blue",
                   "SYSTEM_NODEGROUP": "system-a"}


def quickstart_sed_values():
    """my-values.yaml as the quickstart's (docs/quickstart-eks.md) `sed ... quickstart-values.yaml > my-values.yaml`
    writes it for QUICKSTART_VARS (each -e "s/PATTERN/REPLACEMENT/[g]" applied per line, as sed does)."""
    readme = (ROOT / "docs/quickstart-eks.md").read_text()
    m = re.search(r"^sed ((?:.*\\\n)*.*) deploy/chart/examples/quickstart-values.yaml > my-values.yaml$", readme, re.M)
    if not m:
        raise SystemExit("validate.py: docs/quickstart-eks.md has no `sed ... quickstart-values.yaml > my-values.yaml`")
    exprs = re.findall(r'-e "s/((?:[^/"\\]|\\.)*)/((?:[^/"\\]|\\.)*)/(g?)"', m.group(1))
    if len(exprs) != m.group(1).count("-e "):
        raise SystemExit(f"validate.py: could not read the quickstart's sed expressions {m.group(1)!r}")
    unq = lambda t: t.replace('\\"', '"')
    lines = []
    for line in QUICKSTART.read_text().splitlines():
        for pat, rep, g in exprs:
            rep = re.sub(r"\$(\w+)", lambda v: QUICKSTART_VARS[v.group(1)], unq(rep))
            line = re.sub(unq(pat), lambda _: rep, line, count=0 if g else 1)
        lines.append(line)
    return "\n".join(lines) + "\n"


def quickstart_sed_errors(env):
    """The values the quickstart's sed writes render, and carry the user's account, region,
    cluster, CA version and tag, with nothing of the example's left."""
    text = quickstart_sed_values()
    with tempfile.TemporaryDirectory() as tmp:
        f = pathlib.Path(tmp) / "my-values.yaml"
        f.write_text(text)
        out = helm("template", RELEASE, str(CHART), "-n", NAMESPACE, "-f", str(f), env=env)
    if out.returncode != 0:
        return [f"my-values.yaml from the quickstart's sed does not render: {out.stderr.strip()[-300:]}"]
    v = QUICKSTART_VARS
    want = [f"image: {v['ACCOUNT_ID']}.dkr.ecr.{v['AWS_REGION']}.amazonaws.com/ca-asg-provider:",
            f"region: {v['AWS_REGION']}", f"k8s.io/cluster-autoscaler/{v['CLUSTER']}",
            f"eks.amazonaws.com/nodegroup: {v['SYSTEM_NODEGROUP']}",
            "cluster-autoscaler:v1."]
    errs = [f"my-values.yaml from the quickstart's sed renders without {w!r}" for w in want if w not in out.stdout]
    errs += [f"my-values.yaml from the quickstart's sed still holds the example's {x!r}"
             for x in ("111122223333", "eu-west-1", "my-cluster", "my-system-nodegroup") if x in text]
    return errs


def scrape_errors(docs, values):
    """Each ServiceMonitor endpoint names a port of a Service it selects, and (where this
    chart renders the pods) that port reaches a container port; in bundled mode CA's own
    metrics (its container's 8085) are scraped beside the provider's."""
    errs = []
    sm = find(docs, "ServiceMonitor")
    if not sm:
        return errs
    sel = sm["spec"]["selector"]["matchLabels"]
    services = [d for d in docs if d["kind"] == "Service" and sel.items() <= (d["metadata"].get("labels") or {}).items()]
    dep = find(docs, "Deployment")
    pod = dep["spec"]["template"] if dep else None
    reached = set()
    for ep in sm["spec"]["endpoints"]:
        ports = [(svc, pt) for svc in services for pt in svc["spec"]["ports"] if pt.get("name") == ep["port"]]
        if not ports:
            errs.append(f"ServiceMonitor endpoint port {ep['port']!r}: no selected Service has a port of that name")
            continue
        for svc, pt in ports:
            if not pod or not svc["spec"].get("selector"):
                continue
            if not svc["spec"]["selector"].items() <= (pod["metadata"].get("labels") or {}).items():
                continue
            target = pt.get("targetPort", pt["port"])
            hits = [(c["name"], cp["containerPort"]) for c in pod["spec"]["containers"] for cp in c.get("ports") or []
                    if target in (cp.get("name"), cp["containerPort"])]
            if not hits:
                errs.append(f"Service {svc['metadata']['name']} port {pt['name']}: targetPort {target!r} is no container port")
            reached.update(hits)
    if values["mode"] == "bundled" and ("cluster-autoscaler", 8085) not in reached:
        errs.append(f"bundled mode: the ServiceMonitor does not scrape cluster-autoscaler's metrics (container port 8085); "
                    f"it reaches {sorted(reached)}")
    if values["mode"] != "sidecar" and not any(c == "ca-asg-provider" for c, _ in reached):
        errs.append(f"the ServiceMonitor does not scrape the provider's metrics port; it reaches {sorted(reached)}")
    return errs


def release_errors():
    """CHANGELOG.md has a section for Chart.yaml's version (or Unreleased changes on top of
    it), every section after the first release has upgrade notes, and docs/helm.md's
    version table has a row for the chart version naming its appVersion and values.yaml's
    CA image."""
    errs = []
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    ca_tags = yaml.safe_load((CHART / "values.yaml").read_text())["clusterAutoscaler"]["image"]["tagsByKubernetesMinor"]
    log = (ROOT / "CHANGELOG.md").read_text()
    sections = re.findall(r"^## \[([^\]]+)\]", log, re.M)
    if chart["version"] not in sections:
        errs.append(f"CHANGELOG.md has no section ## [{chart['version']}] (Chart.yaml's version); it has {sections}")
    parts = re.split(r"^## ", log, flags=re.M)[1:]
    for part in parts[:-1]:
        if "### Upgrade notes" not in part:
            errs.append(f"CHANGELOG.md: ## {part.splitlines()[0]} has no '### Upgrade notes'")
    helm_md = (ROOT / "docs/helm.md").read_text()
    table = helm_md.split("## Versions and upgrades", 1)[-1]
    row = next((l for l in table.splitlines() if l.startswith(f"| {chart['version']} ")), None)
    if not row:
        errs.append(f"docs/helm.md 'Versions and upgrades' has no row for chart {chart['version']}")
    else:
        cells = [c.strip() for c in row.strip("|").split("|")]
        named = sorted(re.findall(r"v1\.\d+\.\d+", cells[2]))
        if cells[1] != str(chart["appVersion"]) or named != sorted(ca_tags.values()):
            errs.append(f"docs/helm.md 'Versions and upgrades': chart {chart['version']} row says image {cells[1]}, CA {cells[2]}; "
                        f"Chart.yaml's appVersion is {chart['appVersion']}, values.yaml's CA images by minor {ca_tags}")
    # Artifact Hub's list of the chart's images names every CA image the chart may run
    # (one per Kubernetes minor of tagsByKubernetesMinor), and no other.
    listed = yaml.safe_load(chart.get("annotations", {}).get("artifacthub.io/images", "[]")) or []
    ca_listed = {i["name"]: i["image"] for i in listed if str(i.get("name", "")).startswith("cluster-autoscaler")}
    ca_table = {f"cluster-autoscaler-kubernetes-1.{k}": f"registry.k8s.io/autoscaling/cluster-autoscaler:{v}"
                for k, v in ca_tags.items()}
    if ca_listed != ca_table:
        errs.append(f"Chart.yaml's artifacthub.io/images lists the cluster-autoscaler images {ca_listed}; "
                    f"values.yaml's clusterAutoscaler.image.tagsByKubernetesMinor makes them {ca_table}")
    # The table at the top of docs/helm.md: a row per Kubernetes minor, the CA tag the
    # chart picks for it.
    top = dict(re.findall(r"^\| 1\.(\d+) \| (v1\.\d+\.\d+)", helm_md.split("## Versions and upgrades", 1)[0], re.M))
    if top != {str(k): v for k, v in ca_tags.items()}:
        errs.append(f"docs/helm.md's table of CA versions by Kubernetes minor {top} is not values.yaml's "
                    f"clusterAutoscaler.image.tagsByKubernetesMinor {ca_tags}")
    return errs


def ca_tag_errors(env):
    """Bundled mode runs the cluster-autoscaler of the cluster's Kubernetes minor (issue
    74, 8): the table's row for --kube-version's minor, a pinned tag over it, and a minor
    without a row refused, naming it and the value to set."""
    errs = []
    table = yaml.safe_load((CHART / "values.yaml").read_text())["clusterAutoscaler"]["image"]["tagsByKubernetesMinor"]
    with tempfile.TemporaryDirectory() as tmp:
        vf = pathlib.Path(tmp) / "v.yaml"
        vf.write_text(yaml.safe_dump(merged(REQUIRED["bundled"], {"mode": "bundled"})))
        def ca_image(*extra):
            out = helm("template", RELEASE, str(CHART), "-n", NAMESPACE, "-f", str(vf), *extra, env=env)
            m = re.search(r"image: registry\.k8s\.io/autoscaling/cluster-autoscaler:(\S+)", out.stdout)
            return (m.group(1) if m else None), out.stderr
        for minor, tag in table.items():
            got, err = ca_image("--kube-version", f"1.{minor}.3")
            if got != tag:
                errs.append(f"Kubernetes 1.{minor}.3 renders CA {got}, want the table's {tag}: {err.strip()[:200]}")
        got, _ = ca_image("--kube-version", "1.33.1", "--set", "clusterAutoscaler.image.tag=v1.33.0")
        if got != "v1.33.0":
            errs.append(f"a pinned clusterAutoscaler.image.tag v1.33.0 renders CA {got}")
        newest = max(int(m) for m in table)
        got, err = ca_image("--kube-version", f"1.{newest + 1}.0")
        if got is not None or f"knows no cluster-autoscaler for Kubernetes v1.{newest + 1}.0" not in err \
                or "set clusterAutoscaler.image.tag" not in err:
            errs.append(f"Kubernetes 1.{newest + 1} (no row) renders CA {got} or fails without naming it: {err.strip()[:300]}")
    return errs


def notes_errors(env):
    """NOTES.txt, as `helm install` prints it in each mode, gives the three checks that say
    the install works: pods Ready and the Lease, check-config (`helm test` where the chart
    has its Pod), and the metrics."""
    errs = []
    with tempfile.TemporaryDirectory() as tmp:
        vf = pathlib.Path(tmp) / "v.yaml"
        for mode in MODES:
            vf.write_text(yaml.safe_dump(merged(REQUIRED[mode], {"mode": mode})))
            out = helm("install", "--dry-run=client", RELEASE, str(CHART), "-n", NAMESPACE, "-f", str(vf), env=env)
            notes = out.stdout.split("NOTES:", 1)[-1] if "NOTES:" in out.stdout else ""
            if out.returncode != 0 or not notes:
                errs.append(f"{mode}: helm install --dry-run=client printed no NOTES: {out.stderr.strip()[:300]}")
                continue
            want = ["get pods -l", "get lease ca-asg-provider", "check-config", "/metrics", "ca_asg_provider_node_groups",
                    "-- ca-asg-provider status", "-- ca-asg-provider undrain NODE"]
            if mode != "sidecar":
                want.append(f"helm test {RELEASE} -n {NAMESPACE}")
            errs += [f"{mode}: NOTES.txt lacks {w!r}" for w in want if w not in notes]
    return errs


def test_hook_errors(docs):
    """The `helm test` Pod runs check-config on the config the provider serves with, under
    the same ServiceAccount."""
    tests = [d for d in docs if d["kind"] == "Pod" and (d["metadata"].get("annotations") or {}).get("helm.sh/hook") == "test"]
    dep = find(docs, "Deployment")
    if len(tests) != 1 or not dep:
        return [f"expected one Pod with helm.sh/hook: test beside the Deployment, found {len(tests)}"]
    pod, dpod = tests[0]["spec"], dep["spec"]["template"]["spec"]
    c = pod["containers"][0]
    serve = next(x for x in dpod["containers"] if x["name"] == "ca-asg-provider")
    args, errs = c.get("args") or [], []
    arg = lambda a: a[a.index("--config") + 1] if "--config" in a else None
    if args[:1] != ["check-config"] or arg(args) != arg(serve["args"]) or c["image"] != serve["image"]:
        errs.append(f"args {args} / image {c['image']}: must run check-config --config {arg(serve['args'])} in {serve['image']}")
    vol = lambda p, n: next((v.get("configMap", {}).get("name") for v in p.get("volumes", []) if v["name"] == n), None)
    if vol(pod, "config") != vol(dpod, "config"):
        errs.append("does not mount the provider's ConfigMap")
    if pod.get("serviceAccountName") != dpod.get("serviceAccountName"):
        errs.append(f"ServiceAccount {pod.get('serviceAccountName')} is not the provider's {dpod.get('serviceAccountName')}")
    if tests[0]["metadata"]["labels"].items() >= dep["spec"]["selector"]["matchLabels"].items():
        errs.append("carries the Deployment's selector labels (the Service and PDB would select it)")
    return errs


def uninstall_hook_errors(docs, values):
    """`helm uninstall` runs `remove-hooks` (issue 62) after the release's objects are gone,
    in the provider's image, under the provider's ServiceAccount name with its annotations
    (the same IAM role), on the provider's config without what only serving needs, bounded
    in time, and leaves nothing behind when it succeeds; uninstall.removeHooks: false, or
    sidecar mode (no image here), renders none."""
    hooks = [d for d in docs if ((d["metadata"].get("annotations") or {}).get("helm.sh/hook")) == "post-delete"]
    want = values["mode"] != "sidecar" and values["uninstall"]["removeHooks"]
    if not want:
        return [f"renders post-delete hooks {[d['kind'] for d in hooks]} with removeHooks off or in sidecar mode"] if hooks else []
    errs = []
    for d in hooks:
        policy = d["metadata"]["annotations"].get("helm.sh/hook-delete-policy", "")
        if "hook-succeeded" not in policy:
            errs.append(f"{d['kind']}/{d['metadata']['name']}: hook-delete-policy {policy!r} keeps it after success")
    jobs = [d for d in hooks if d["kind"] == "Job"]
    dep = find(docs, "Deployment")
    if len(jobs) != 1 or not dep:
        return errs + [f"expected one post-delete Job beside the Deployment, found {len(jobs)}"]
    job, dpod = jobs[0], dep["spec"]["template"]["spec"]
    pod, serve = job["spec"]["template"]["spec"], next(c for c in dpod["containers"] if "serve" in (c.get("args") or []))
    c = pod["containers"][0]
    args = c.get("args") or []
    if args[:1] != ["remove-hooks"] or c["image"] != serve["image"] or "--timeout" not in args:
        errs.append(f"runs {args} in {c['image']}: want remove-hooks --timeout ... in {serve['image']}")
    # Issue 74: before the hooks go, every node still marked is given back, under a
    # hook ClusterRole (the release's is gone) that may list, get and patch Nodes.
    inits = pod.get("initContainers") or []
    give = inits[0] if len(inits) == 1 else {}
    gargs = give.get("args") or []
    if gargs[:3] != ["undrain", "--all", "--force"] or give.get("image") != serve["image"] \
            or config_arg(gargs) != config_arg(args):
        errs.append(f"init containers {[i.get('args') for i in inits]}: want one undrain --all --force on the Job's "
                    f"config {config_arg(args)} in {serve['image']}, before remove-hooks")
    roles = [d for d in hooks if d["kind"] == "ClusterRole"]
    bound = [d for d in hooks if d["kind"] == "ClusterRoleBinding"
             and any(s.get("name") == pod.get("serviceAccountName") for s in d.get("subjects") or [])]
    rules = [(tuple(r.get("resources") or []), tuple(sorted(r.get("verbs") or []))) for d in roles for r in d.get("rules") or []]
    # Issue 72: undrain also sets the nodes' drain conditions False (nodes/status).
    if rules != [(("nodes",), ("get", "list", "patch")), (("nodes/status",), ("patch",))] or len(bound) != 1 \
            or bound[0]["roleRef"]["name"] != roles[0]["metadata"]["name"]:
        errs.append(f"hook ClusterRole rules {rules}, bindings to the Job's ServiceAccount {len(bound)}: "
                    f"want get, list and patch of nodes and patch of nodes/status only, bound once")
    if not job["spec"].get("activeDeadlineSeconds") or job["spec"].get("backoffLimit", 6) > 2:
        errs.append(f"activeDeadlineSeconds {job['spec'].get('activeDeadlineSeconds')}, backoffLimit "
                    f"{job['spec'].get('backoffLimit')}: want a deadline and at most 2 retries")
    if pod.get("serviceAccountName") != dpod.get("serviceAccountName"):
        errs.append(f"ServiceAccount {pod.get('serviceAccountName')} is not the provider's {dpod.get('serviceAccountName')}")
    if values["serviceAccount"]["create"]:
        sa = [d for d in hooks if d["kind"] == "ServiceAccount" and d["metadata"]["name"] == dpod.get("serviceAccountName")]
        released = find(docs, "ServiceAccount", dpod.get("serviceAccountName"))
        ann = lambda d: {k: v for k, v in ((d or {}).get("metadata", {}).get("annotations") or {}).items()
                         if not k.startswith("helm.sh/")}
        if len(sa) != 1 or ann(sa[0]) != ann(released):
            errs.append(f"no hook ServiceAccount named as the provider's with its annotations {ann(released)}: "
                        f"the release's is gone at post-delete")
    cm_name = next((v["configMap"]["name"] for v in pod.get("volumes") or [] if "configMap" in v), None)
    cm = next((d for d in hooks if d["kind"] == "ConfigMap" and d["metadata"]["name"] == cm_name), None)
    path = args[args.index("--config") + 1] if "--config" in args else ""
    key = path.rsplit("/", 1)[-1]
    if not cm or key not in (cm.get("data") or {}):
        errs.append(f"--config {path} is not in a post-delete ConfigMap ({cm_name})")
    else:
        cfg = provider_config(docs, values) or {}
        want_cfg = {k: v for k, v in cfg.items() if k not in ("listen", "metricsListen", "tls")}
        if yaml.safe_load(cm["data"][key]) != want_cfg:
            errs.append(f"config {yaml.safe_load(cm['data'][key])} is not the provider's without listen and tls {want_cfg}")
    if job["metadata"]["labels"].items() >= dep["spec"]["selector"]["matchLabels"].items():
        errs.append("carries the Deployment's selector labels")
    return errs


REMOVE_HOOKS_JQ = ROOT / "deploy/remove-hooks-job.jq"
PROVIDER = "ca-asg-provider"


def remove_hooks_jq(doc):
    """deploy/remove-hooks-job.jq run on one object, as docs/helm.md pipes it."""
    return subprocess.run(["jq", "-f", str(REMOVE_HOOKS_JQ)], input=json.dumps(doc), capture_output=True, text=True)


def config_arg(args):
    """The value of --config in a command line, `--config PATH` or `--config=PATH` (the last given)."""
    found = [args[i + 1] if a == "--config" else a[len("--config="):] for i, a in enumerate(args)
             if (a == "--config" and i + 1 < len(args)) or a.startswith("--config=")]
    return found[-1] if found else None


def remove_hooks_job_errors(dep):
    """deploy/remove-hooks-job.jq (docs/helm.md, Uninstall) turns a Deployment the provider
    runs in (in `containers`, or in `initContainers` as a native sidecar) into a valid Job
    that runs remove-hooks and nothing else, with the provider's image, --config, env,
    securityContext and mounts, under the same ServiceAccount and volumes, with a deadline."""
    serve = next((c for c in pod_containers(dep) if c["name"] == PROVIDER), None)
    if serve is None:
        return [f"the Deployment has no {PROVIDER} container"]
    out = remove_hooks_jq(dep)
    if out.returncode != 0:
        return [f"jq -f deploy/remove-hooks-job.jq fails: {out.stderr.strip()[:300]}"]
    if not out.stdout.strip():
        return ["jq -f deploy/remove-hooks-job.jq printed nothing and exited 0: no Job, no hook removed"]
    job = json.loads(out.stdout)
    job["metadata"]["namespace"] = NAMESPACE
    errs = check_object(job)
    pod, dpod = job["spec"]["template"]["spec"], dep["spec"]["template"]["spec"]
    if [c.get("name") for c in pod.get("containers", [])] != ["remove-hooks"] or pod.get("initContainers"):
        return errs + [f"the Job's pod runs {[c.get('name') for c in pod_containers(job)]}, want only remove-hooks "
                       f"(not CA's container, no init containers)"]
    c = pod["containers"][0]
    args, want = c.get("args") or [], config_arg(serve.get("args") or [])
    if args[:1] != ["remove-hooks"] or config_arg(args) != want or c.get("image") != serve.get("image"):
        errs.append(f"runs {args} in {c.get('image')}: want remove-hooks --config {want} in {serve.get('image')}")
    if pod.get("serviceAccountName") != dpod.get("serviceAccountName") or pod.get("volumes") != dpod.get("volumes") \
            or c.get("volumeMounts") != serve.get("volumeMounts"):
        errs.append("not the Deployment's ServiceAccount, volumes and mounts")
    for key in ("env", "envFrom", "securityContext"):
        if c.get(key) != serve.get(key):
            errs.append(f"{key} is not the provider's: {c.get(key)} != {serve.get(key)}")
    if not job["spec"].get("activeDeadlineSeconds") or pod.get("restartPolicy") != "Never":
        errs.append("no deadline, or restarts")
    return errs


def overlay_remove_hooks_errors(docs):
    """remove_hooks_job_errors on the overlay's Deployment (the provider in `containers`)."""
    deps = [d for d in docs if d["kind"] == "Deployment"
            and any(c["name"] == PROVIDER for c in pod_containers(d))]
    if len(deps) != 1:
        return [f"expected one Deployment with a {PROVIDER} container, found {len(deps)}"]
    return remove_hooks_job_errors(deps[0])


SIDECAR_EXAMPLE = CHART / "examples/cluster-autoscaler-values.yaml"


def ca_chart_sidecar_deployment(ex):
    """The Deployment CA's chart (9.59.0) renders from the example values for sidecar mode,
    the parts the uninstall reads: CA's container in `containers` (extraVolumeMounts, the
    values' containerSecurityContext), the values' initContainers (the provider, a native
    sidecar) as they are, the pod's securityContext, extraVolumes as the pod's volumes, and
    rbac.serviceAccount.name as its ServiceAccount."""
    name = ex.get("fullnameOverride") or "cluster-autoscaler"
    labels = {"app.kubernetes.io/name": ex.get("nameOverride") or "cluster-autoscaler",
              "app.kubernetes.io/instance": "cluster-autoscaler"}
    flags = [f"--{k.split('_')[0]}={str(v).lower() if isinstance(v, bool) else v}"
             for k, v in (ex.get("extraArgs") or {}).items()]
    ca = {"name": ex.get("nameOverride") or "cluster-autoscaler",
          "image": "registry.k8s.io/autoscaling/cluster-autoscaler:v1.34.5",
          "command": ["./cluster-autoscaler", f"--cloud-provider={ex['cloudProvider']}", "--namespace=kube-system",
                      *flags, "--logtostderr=true", "--stderrthreshold=info", "--v=4"],
          "ports": [{"containerPort": 8085}],
          "livenessProbe": {"httpGet": {"path": "/health-check", "port": 8085}},
          "resources": ex.get("resources") or {},
          "securityContext": ex.get("containerSecurityContext") or {},
          "volumeMounts": ex.get("extraVolumeMounts") or []}
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": NAMESPACE, "labels": labels},
            "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels},
                                  "spec": {"priorityClassName": "system-cluster-critical", "dnsPolicy": "ClusterFirst",
                                           "initContainers": copy.deepcopy(ex.get("initContainers") or []),
                                           "containers": [ca],
                                           "serviceAccountName": ex["rbac"]["serviceAccount"]["name"],
                                           "securityContext": ex.get("securityContext") or {},
                                           "volumes": ex.get("extraVolumes") or []}}}}


def sidecar_remove_hooks_errors():
    """The chart's sidecar mode (issue 69, 5): on CA's Deployment as CA's chart renders it
    from the example values, the jq program makes the Job from the provider in
    initContainers: remove-hooks with its image, --config (also as --config=PATH) and
    mounts, under CA's ServiceAccount, with the values' volumes."""
    ex = yaml.safe_load(SIDECAR_EXAMPLE.read_text())
    side = next((c for c in ex.get("initContainers") or [] if c.get("name") == PROVIDER), None)
    if side is None:
        return [f"no {PROVIDER} in initContainers"]
    dep = ca_chart_sidecar_deployment(ex)
    errs = [f"the Deployment built from the values: {e}" for e in check_object(dep)]
    errs += remove_hooks_job_errors(dep)
    if errs:
        return errs
    # Against the values themselves, not only the Deployment built from them.
    job = json.loads(remove_hooks_jq(dep).stdout)
    pod = job["spec"]["template"]["spec"]
    c = pod["containers"][0]
    want = ["remove-hooks", "--config", config_arg(side["args"]), "--timeout", "2m"]
    if c["image"] != side["image"] or c["args"] != want:
        errs.append(f"runs {c['args']} in {c['image']}: want {want} in {side['image']} (the values' initContainers)")
    if c.get("volumeMounts") != side["volumeMounts"] or pod.get("volumes") != ex["extraVolumes"]:
        errs.append("not the sidecar's volumeMounts and the values' extraVolumes")
    if pod.get("serviceAccountName") != ex["rbac"]["serviceAccount"]["name"]:
        errs.append(f"ServiceAccount {pod.get('serviceAccountName')}: want rbac.serviceAccount.name "
                    f"{ex['rbac']['serviceAccount']['name']} (the provider's IAM role)")
    # The --config=PATH form is read as --config PATH.
    eq = copy.deepcopy(dep)
    p = next(c for c in eq["spec"]["template"]["spec"]["initContainers"] if c["name"] == PROVIDER)
    p["args"] = ["serve", f"--config={config_arg(side['args'])}"]
    errs += [f"with --config=PATH: {e}" for e in remove_hooks_job_errors(eq)]
    return errs


def remove_hooks_refusal_errors():
    """No provider in either list, or a provider without --config: jq exits non-zero with a
    message naming what it looked for and where, and prints no Job."""
    ex = yaml.safe_load(SIDECAR_EXAMPLE.read_text())
    errs = []
    no_provider = ca_chart_sidecar_deployment(ex)
    no_provider["spec"]["template"]["spec"]["initContainers"] = [
        c for c in no_provider["spec"]["template"]["spec"]["initContainers"] if c["name"] != PROVIDER]
    no_config = ca_chart_sidecar_deployment(ex)
    for c in no_config["spec"]["template"]["spec"]["initContainers"]:
        if c["name"] == PROVIDER:
            c["args"] = ["serve", "--log-format", "json"]
    for what, dep, words in (
            ("CA's Deployment without the provider", no_provider, [PROVIDER, "containers", "initContainers"]),
            ("the provider without --config", no_config, [PROVIDER, "--config"])):
        out = remove_hooks_jq(dep)
        if out.returncode == 0 or out.stdout.strip():
            errs.append(f"{what}: jq exited {out.returncode} and printed {out.stdout.strip()[:100]!r}: "
                        f"want non-zero, no Job, and a message")
        elif not all(w in out.stderr for w in words):
            errs.append(f"{what}: jq's message {out.stderr.strip()[:300]!r} does not name {words}")
    return errs


def provider_config_name(docs):
    cms = [d for d in docs if d.get("kind") == "ConfigMap" and "config.yaml" in (d.get("data") or {})]
    return cms[0]["metadata"]["name"] if len(cms) == 1 else None


def example_errors(values):
    """The example values for CA's own chart agree with what this chart renders by default."""
    errs = []
    fullname = RELEASE
    for name, sidecar in (("cluster-autoscaler-values.yaml", True), ("cluster-autoscaler-standalone-values.yaml", False)):
        path = CHART / "examples" / name
        ex = yaml.safe_load(path.read_text())
        where = f"examples/{name}"
        if ex.get("cloudProvider") != "externalgrpc":
            errs.append(f"{where}: cloudProvider must be externalgrpc")
        if ex.get("rbac", {}).get("serviceAccount", {}).get("name") != values["clusterAutoscaler"]["serviceAccountName"]:
            errs.append(f"{where}: rbac.serviceAccount.name must be the chart's clusterAutoscaler.serviceAccountName")
        args = ex.get("extraArgs") or {}
        if args.get("daemonset-eviction-for-occupied-nodes") is not False:
            errs.append(f"{where}: extraArgs must set daemonset-eviction-for-occupied-nodes: false")
        # CA's chart drops what follows a `_` in an extraArgs name (balancing-ignore-label_1).
        given = {f"--{k.split('_')[0]}={str(v).lower() if isinstance(v, bool) else v}" for k, v in args.items()}
        missing = [f for f in ca_flags_table() if f not in given and not f.startswith(("--cloud-", "--daemonset-"))]
        if missing:
            errs.append(f"{where}: extraArgs lack {missing} (docs/configuration.md 'CA flags to set')")
        vols = {v["name"]: v for v in ex.get("extraVolumes") or []}
        mounts = {m["mountPath"]: m["name"] for m in ex.get("extraVolumeMounts") or []}
        cloud = pathlib.PurePosixPath(str(args.get("cloud-config")))
        vol = vols.get(mounts.get(str(cloud.parent)), {})
        if vol.get("configMap", {}).get("name") != values["clusterAutoscaler"]["cloudConfig"]["name"] or cloud.name != "cloud-config.yaml":
            errs.append(f"{where}: extraArgs.cloud-config {cloud} is not cloud-config.yaml of the mounted ConfigMap "
                        f"{values['clusterAutoscaler']['cloudConfig']['name']!r}")
        if sidecar:
            inits = ex.get("initContainers") or []
            side = next((c for c in inits if c.get("name") == "ca-asg-provider"), None)
            if not side or side.get("restartPolicy") != "Always":
                errs.append(f"{where}: initContainers needs ca-asg-provider with restartPolicy: Always (a native sidecar)")
                continue
            smounts = {m["name"]: m["mountPath"] for m in side.get("volumeMounts", [])}
            cfg_vol = next((n for n, v in vols.items() if v.get("configMap", {}).get("name") == fullname), None)
            cfg_path = side["args"][side["args"].index("--config") + 1]
            if not cfg_vol or cfg_path != f"{smounts.get(cfg_vol)}/config.yaml":
                errs.append(f"{where}: the sidecar's --config {cfg_path} is not config.yaml of ConfigMap {fullname!r}")
            if values["transport"] == "unix":
                # The chart's cloud-config and the provider's listen name the socket in
                # socketDir: CA and the sidecar mount one emptyDir there.
                sock_dir = values["socketDir"].rstrip("/")
                ca_vol = mounts.get(sock_dir)
                side_vol = next((n for n, p in smounts.items() if p == sock_dir), None)
                if not ca_vol or ca_vol != side_vol or "emptyDir" not in vols.get(ca_vol, {}):
                    errs.append(f"{where}: CA (extraVolumeMounts) and the sidecar must mount one emptyDir at {sock_dir}, "
                                f"where the provider's socket is (the chart's transport: unix)")
                sec = ex.get("securityContext") or {}
                if not (sec.get("runAsUser") and sec.get("runAsGroup")):
                    errs.append(f"{where}: securityContext must set runAsUser and runAsGroup (the socket is 0660)")
            # The sidecar, in a pod as CA's chart renders it, passes the strict schema.
            pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "cluster-autoscaler"},
                   "spec": {"containers": [{"name": "cluster-autoscaler", "image": "cluster-autoscaler",
                                            "volumeMounts": ex.get("extraVolumeMounts") or []}],
                            "initContainers": inits, "volumes": ex.get("extraVolumes") or [],
                            "securityContext": ex.get("securityContext") or {}}}
            errs += [f"{where}: pod with the sidecar: {e}" for e in check_object(pod)]
        else:
            tls_dir = values["clusterAutoscaler"]["cloudConfig"]["tlsMountPath"]
            vol = vols.get(mounts.get(tls_dir), {})
            if vol.get("secret", {}).get("secretName") != values["tls"]["clientSecretName"]:
                errs.append(f"{where}: Secret {values['tls']['clientSecretName']!r} must be mounted at {tls_dir}")
    return errs


# Values the schema must refuse (helm template has to fail with a schema error), and
# combinations the templates refuse.
NEGATIVE = {
    "a cluster-autoscaler tag of another form": ("mode: bundled\nclusterName: c\nimage: {repository: r.example/x}\nconfig: {aws: {region: eu-west-1}}\n"
                                                 "clusterAutoscaler:\n  image: {tag: '1.34'}\n",
                                                 'clusterAutoscaler.image.tag "1.34" is not a cluster-autoscaler release tag'),
    "a CA table row of another minor": ("mode: bundled\nclusterName: c\nimage: {repository: r.example/x}\nconfig: {aws: {region: eu-west-1}}\n"
                                        "clusterAutoscaler:\n  image: {tagsByKubernetesMinor: {'33': v1.34.9}}\n",
                                        'clusterAutoscaler.image.tagsByKubernetesMinor.33 "v1.34.9" is not a cluster-autoscaler release tag of that minor'),
    "the quickstart's node group placeholder": ("mode: bundled\nclusterName: c\nimage: {repository: r.example/x}\n"
                                                "nodeSelector: {eks.amazonaws.com/nodegroup: my-system-nodegroup}\n",
                                                "nodeSelector.eks.amazonaws.com/nodegroup is the placeholder my-system-nodegroup"),
    "unknown top-level key (typo)": ("replicaCont: 3\n", "values don't meet the specifications of the schema"),
    "unknown provider config key": ("config:\n  scaleIn:\n    workloadDeadlne: 5m\n", "values don't meet the specifications of the schema"),
    "wrong type": ('replicas: "two"\n', "values don't meet the specifications of the schema"),
    "unknown mode": ("mode: daemonset\n", "values don't meet the specifications of the schema"),
    "duration that is not one": ("config:\n  refreshInterval: 60\n", "values don't meet the specifications of the schema"),
    "label value that is not a string": ("config:\n  templates:\n    '*': {labels: {spot: true}}\n", "values don't meet the specifications of the schema"),
    "IRSA annotation in sidecar mode": ("mode: sidecar\nserviceAccount:\n  annotations: {eks.amazonaws.com/role-arn: x}\n", "serviceAccount.annotations has no effect in sidecar mode"),
    "dryRun in sidecar mode (would really drain)": ("mode: sidecar\ndryRun: true\n", "dryRun has no effect in sidecar mode"),
    "image in sidecar mode": ("image: {tag: '1.0'}\n", "image has no effect in sidecar mode"),
    "CA's image in sidecar mode": ("clusterAutoscaler:\n  image: {tag: v1.30.0}\n", "clusterAutoscaler.image has no effect in sidecar mode"),
    "a CA flag the chart sets itself": ("mode: bundled\nclusterAutoscaler:\n  flags: {cloud-provider: aws}\n", "values don't meet the specifications of the schema"),
    "TLS settings in bundled mode": ("mode: bundled\ntls: {clientCommonName: x}\n", "tls has no effect in bundled mode"),
    "CA's pod labels in standalone mode": ("mode: standalone\nclusterAutoscaler:\n  podLabels: {app: ca}\n", "clusterAutoscaler.podLabels has no effect in standalone mode"),
    "replicas > 1 without leader election (standalone)": ("mode: standalone\nconfig:\n  scaleIn: {leaderElection: false}\n", "with config.scaleIn.leaderElection false"),
    "replicas > 1 without leader election (bundled)": ("mode: bundled\nreplicas: 3\nconfig:\n  scaleIn: {leaderElection: false}\n", "replicas 3 with config.scaleIn.leaderElection false"),
    "standalone without cert-manager or a Secret": ("mode: standalone\ntls:\n  certManager: {enabled: false}\n", "tls.serverSecretName is required"),
    # Rollouts and drains that could never move (issue 61, 4).
    "a rollout strategy with maxUnavailable and maxSurge both 0": (
        "strategy:\n  rollingUpdate: {maxUnavailable: 0, maxSurge: 0}\n", "values don't meet the specifications of the schema"),
    "maxSurge 0 over the default maxUnavailable 0": (
        "strategy:\n  rollingUpdate: {maxSurge: '0%'}\n", "values don't meet the specifications of the schema"),
    "a budget that allows no eviction (minAvailable = replicas)": (
        "mode: standalone\npodDisruptionBudget: {minAvailable: 2}\n", "podDisruptionBudget.minAvailable 2 with replicas 2 allows no eviction"),
    "a budget that allows no eviction (maxUnavailable 0)": (
        "mode: bundled\npodDisruptionBudget: {maxUnavailable: 0}\n", "podDisruptionBudget.maxUnavailable 0 allows no eviction"),
    # No install that can only fail later: values.yaml's placeholders are refused,
    # naming the value to set.
    "no cluster name (the bare defaults)": ("{}\n", "clusterName is required"),
    "the examples' placeholder cluster name": ("clusterName: my-cluster\n", "clusterName is the placeholder my-cluster"),
    "a cluster name EKS would refuse": ("clusterName: 'prod cluster'\n", "values don't meet the specifications of the schema"),
    "the cluster name given twice": (
        "clusterName: prod\nconfig:\n  autoDiscovery:\n    - tags: [k8s.io/cluster-autoscaler/enabled, k8s.io/cluster-autoscaler/prod]\n",
        "clusterName \"prod\" and config.autoDiscovery are both set"),
    "alerts without a runbook URL": ("clusterName: prod\nprometheusRule: {enabled: true}\n",
                                     "prometheusRule.runbookBaseUrl is required with prometheusRule.enabled"),
    "alerts linking the former example runbook URL": (
        "clusterName: prod\nprometheusRule:\n  enabled: true\n  runbookBaseUrl: https://github.com/example/ca-asg-provider/blob/main/docs/operations.md\n",
        "prometheusRule.runbookBaseUrl is an example URL"),
    "alerts linking an example.com runbook URL": (
        "clusterName: prod\nprometheusRule:\n  enabled: true\n  runbookBaseUrl: https://docs.example.com/runbooks\n",
        "prometheusRule.runbookBaseUrl is an example URL"),
    "a runbook URL with a fragment": (
        "clusterName: prod\nprometheusRule:\n  enabled: true\n  runbookBaseUrl: https://wiki.corp/ops#alerts\n",
        "values don't meet the specifications of the schema"),
    "the placeholder cluster name with a key=value tag": (
        "config:\n  autoDiscovery:\n    - tags: [k8s.io/cluster-autoscaler/enabled, k8s.io/cluster-autoscaler/my-cluster=owned]\n",
        "config.autoDiscovery[0].tags names the placeholder cluster my-cluster"),
    "values.yaml's placeholder image (standalone)": ("mode: standalone\nclusterName: prod\n", "image.repository is the placeholder"),
    "values.yaml's placeholder image (bundled)": ("mode: bundled\nclusterName: prod\n", "image.repository is the placeholder"),
    "the quickstart's values file before its sed (placeholder cluster)": (
        QUICKSTART.read_text(), "clusterName is the placeholder my-cluster"),
}


MODES = ("sidecar", "standalone", "bundled")
# Values set on top of each mode's defaults before the effect check, so that the values
# of optional objects (ServiceMonitor, PrometheusRule) have something to change.
EFFECT_BASE = {"serviceMonitor": {"enabled": True}, "podMonitor": {"enabled": True}, "prometheusRule": {"enabled": True, "runbookBaseUrl": RUNBOOKS},
               "grafanaDashboard": {"enabled": True}}
# Files the chart carries as copies (Helm hides values.yaml from templates and reads no
# file outside the chart; a symbolic link makes every helm command print a warning):
# each must stay byte for byte its source.
CHART_COPIES = {CHART / "files/defaults.yaml": CHART / "values.yaml",
                CHART / "files/dashboards/ca-asg-provider.json": DASHBOARD}


def copy_errors():
    errs = []
    for copy, source in CHART_COPIES.items():
        if copy.is_symlink():
            errs.append(f"{copy.relative_to(ROOT)} is a symbolic link: make it a copy of {source.relative_to(ROOT)} "
                        f"(cp {source.relative_to(ROOT)} {copy.relative_to(ROOT)})")
        elif not copy.exists() or copy.read_bytes() != source.read_bytes():
            errs.append(f"{copy.relative_to(ROOT)} differs from {source.relative_to(ROOT)}: "
                        f"cp {source.relative_to(ROOT)} {copy.relative_to(ROOT)}")
    links = [p.relative_to(ROOT) for p in CHART.rglob("*") if p.is_symlink()]
    if links:
        errs.append(f"symbolic links in the chart (every helm command warns of them): {links}")
    return errs


def dashboard_configmap_errors(docs, values):
    """With grafanaDashboard.enabled, one ConfigMap carries the dashboard JSON as it is in
    deploy/dashboards, with the sidecar's label; without, none."""
    cms = [d for d in docs if d["kind"] == "ConfigMap" and any(k.endswith(".json") for k in (d.get("data") or {}))]
    on = values["grafanaDashboard"]["enabled"]
    if not on:
        return [f"grafanaDashboard.enabled is false but ConfigMap {c['metadata']['name']} holds a dashboard" for c in cms]
    if len(cms) != 1:
        return [f"grafanaDashboard.enabled: expected one dashboard ConfigMap, found {len(cms)}"]
    cm, errs = cms[0], []
    if json.loads(cm["data"].get("ca-asg-provider.json", "null")) != json.loads(DASHBOARD.read_text()):
        errs.append(f"ConfigMap {cm['metadata']['name']}: ca-asg-provider.json is not {DASHBOARD.relative_to(ROOT)}")
    want = values["grafanaDashboard"]["labels"]
    if not want.items() <= (cm["metadata"].get("labels") or {}).items():
        errs.append(f"ConfigMap {cm['metadata']['name']}: labels lack {want} (Grafana's sidecar finds it by them)")
    return errs


def value_paths(node, path=()):
    """(path, value) of every leaf of values.yaml (an empty map or list is a leaf),
    `config` excepted (the provider's own file: validated against the Rust structs)."""
    if isinstance(node, dict) and node:
        for k, v in node.items():
            if path or k not in ("config", "mode"):
                yield from value_paths(v, path + (k,))
    else:
        yield path, node


def changed_candidates(v):
    """Values other than v, most likely first to pass the schema."""
    if isinstance(v, bool):
        return [not v]
    if isinstance(v, (int, float)):
        return [v + 1]
    if isinstance(v, str):
        return ["human", "Always", "NodePort", "7m", "example.com/other", v + "-changed", "changed"]
    if isinstance(v, list):
        return [[{"name": "changed", "value": "x"}], [{"name": "changed"}], ["changed"]]
    return [{"example.com/changed": "x"}, {"changed": {}}]


def nest(path, value):
    out = value
    for k in reversed(path):
        out = {k: out}
    return out


def strip_version(text):
    """A render without the app.kubernetes.io/version label (image.tag feeds it in every
    mode, even where the image itself is not used)."""
    return "\n".join(l for l in text.splitlines() if "app.kubernetes.io/version:" not in l)


def mode_effect_errors(env, defaults, tmp):
    """Every value, changed from its default, either changes what a mode renders or
    fails the render naming the value and the mode: none is silently ignored. And
    dryRun: true puts --dry-run on every container that runs `serve`, or fails."""
    errs, counted = [], {}
    vf = pathlib.Path(tmp) / "effect-values.yaml"

    def render(values):
        vf.write_text(yaml.safe_dump(values))
        return helm("template", RELEASE, str(CHART), "-n", NAMESPACE, "-f", str(vf), env=env)

    for mode in MODES:
        base = merged(merged(EFFECT_BASE, REQUIRED[mode]), {"mode": mode})
        ref = render(base)
        if ref.returncode != 0:
            errs.append(f"{mode}: the reference render fails: {ref.stderr.strip()[:300]}")
            continue
        tested = skipped = refused = 0
        for path, v in value_paths(merged(defaults, base)):
            name = ".".join(path)
            for cand in changed_candidates(v):
                out = render(merged(base, nest(path, cand)))
                if out.returncode != 0 and "values don't meet the specifications of the schema" in out.stderr:
                    continue
                tested += 1
                if out.returncode != 0:
                    # Refused as having no effect (naming the value or the map holding it,
                    # and the mode), or by another check (e.g. a value it then requires).
                    named = any(f"{'.'.join(path[:i])} has no effect in {mode} mode" in out.stderr
                                for i in range(1, len(path) + 1))
                    if "has no effect" in out.stderr and not named:
                        errs.append(f"{mode}: {name}={cand!r} is refused without naming the value and "
                                    f"the mode: {out.stderr.strip()[-300:]}")
                    refused += 1
                elif strip_version(out.stdout) == strip_version(ref.stdout):
                    errs.append(f"{mode}: {name}={cand!r} renders exactly as the default: silently ignored")
                break
            else:
                skipped += 1
        counted[mode] = (tested, refused, skipped)
        # dryRun reaches every container that drains, or the render fails.
        out = render(merged(base, {"dryRun": True}))
        if out.returncode == 0:
            docs = [d for d in yaml.safe_load_all(out.stdout) if d]
            serving = [c for d in docs for c in pod_containers(d) if "serve" in (c.get("args") or [])]
            if not serving and mode != "sidecar":
                errs.append(f"{mode}: dryRun: true renders no container that runs serve")
            for c in serving:
                if "--dry-run" not in c["args"]:
                    errs.append(f"{mode}: dryRun: true, but container {c['name']} runs serve without --dry-run")
            if mode == "sidecar":
                errs.append("sidecar: dryRun: true renders, but the chart has no provider container in this mode")
        elif "dryRun has no effect" not in out.stderr:
            errs.append(f"{mode}: dryRun: true fails without naming dryRun: {out.stderr.strip()[:300]}")
    return errs, counted


DRAINING_TAINT = re.search(r'TAINT_KEY: &str = "([^"]+)"', (ROOT / "src/scalein/decide/record.rs").read_text()).group(1)


def chart_config_rollout_errors(env, chart=CHART):
    """Promise: a config change through the chart is applied. The provider reads its file
    once, at start, so where the chart owns the pod (standalone, bundled) an upgrade that
    changes `config` must change the pod template (its checksum/config annotation), and
    `helm upgrade` then rolls the pods; in sidecar mode the pod is CA's chart's, so the
    NOTES `helm upgrade` prints say to restart CA's pods."""
    errs = []
    with tempfile.TemporaryDirectory() as tmp:
        vf = pathlib.Path(tmp) / "v.yaml"

        def render(values, *cmd):
            vf.write_text(yaml.safe_dump(values))
            out = helm(*(cmd or ("template",)), RELEASE, str(chart), "-n", NAMESPACE, "-f", str(vf), env=env)
            if out.returncode != 0:
                errs.append(f"render of {values} fails: {out.stderr.strip()[:300]}")
            return out.stdout

        for mode in ("standalone", "bundled"):
            base = merged(REQUIRED[mode], {"mode": mode})
            templates = []
            for values in (base, merged(base, {"config": {"refreshInterval": "45s"}})):
                docs = [d for d in yaml.safe_load_all(render(values)) if d]
                dep = find(docs, "Deployment")
                templates.append((dep or {}).get("spec", {}).get("template"))
            if None in templates:
                errs.append(f"{mode}: no Deployment rendered")
            elif templates[0] == templates[1]:
                errs.append(f"{mode}: a change of config.refreshInterval leaves the pod template as it was: "
                            f"helm upgrade would keep the pods on the old config")
        notes = render(merged(REQUIRED["sidecar"], {"mode": "sidecar"}), "install", "--dry-run=client")
        notes = notes.split("NOTES:", 1)[-1] if "NOTES:" in notes else ""
        if "rollout restart" not in notes:
            errs.append("sidecar: NOTES.txt does not say to restart CA's pods after a change of config")
    return errs


def chart_config_rollout_selftest(env):
    """The check must fail on a chart whose pods carry no checksum of the config."""
    with tempfile.TemporaryDirectory() as tmp:
        chart = pathlib.Path(tmp) / "chart"
        shutil.copytree(CHART, chart)
        dep = chart / "templates/deployment.yaml"
        text = dep.read_text()
        line = next((l for l in text.splitlines(keepends=True) if "checksum/config:" in l), None)
        if line is None:
            return ["chart_config_rollout_selftest: templates/deployment.yaml has no checksum/config line to remove"]
        dep.write_text(text.replace(line, ""))
        errs = chart_config_rollout_errors(env, chart)
        if not any("leaves the pod template as it was" in e for e in errs):
            return [f"chart_config_rollout_errors passed a chart without checksum/config ({errs})"]
    return []


def pod_scheduling_errors(env, tmp):
    """The pod defaults docs/helm.md promises, rendered, and each value toggling what it
    says: rollout strategy (never zero ready replicas), Linux nodeSelector, spread by node
    and by zone, no toleration of the draining taint, avoidNodesLabelled's preferred
    nodeAffinity (merged with affinity's), and the PodMonitor."""
    errs = []
    vf = pathlib.Path(tmp) / "scheduling-values.yaml"

    def render(values):
        vf.write_text(yaml.safe_dump(values))
        out = helm("template", RELEASE, str(CHART), "-n", NAMESPACE, "-f", str(vf), env=env)
        if out.returncode != 0:
            errs.append(f"render of {values} fails: {out.stderr.strip()[:300]}")
            return []
        return [d for d in yaml.safe_load_all(out.stdout) if d]

    def pod(docs):
        dep = find(docs, "Deployment")
        return dep, (dep or {}).get("spec", {}).get("template", {}).get("spec", {})

    for mode in ("standalone", "bundled"):
        base = merged(REQUIRED[mode], {"mode": mode})
        docs = render(base)
        dep, spec = pod(docs)
        if not dep:
            errs.append(f"{mode}: no Deployment")
            continue
        strategy = dep["spec"].get("strategy")
        if strategy != {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}:
            errs.append(f"{mode}: default strategy {strategy}, want RollingUpdate maxUnavailable 0 maxSurge 1")
        pdb = find(docs, "PodDisruptionBudget")
        if dep["spec"]["replicas"] < 2 or not pdb or pdb["spec"].get("maxUnavailable") != 1:
            errs.append(f"{mode}: default replicas {dep['spec']['replicas']} with PDB {pdb and pdb['spec']}: "
                        f"a drain or an upgrade could leave no ready replica")
        if spec.get("nodeSelector") != {"kubernetes.io/os": "linux"}:
            errs.append(f"{mode}: default nodeSelector {spec.get('nodeSelector')}, want kubernetes.io/os: linux")
        spread = {(c["topologyKey"], c["whenUnsatisfiable"], c["maxSkew"])
                  for c in spec.get("topologySpreadConstraints") or [] if c.get("labelSelector")}
        if spread != {("kubernetes.io/hostname", "ScheduleAnyway", 1), ("topology.kubernetes.io/zone", "ScheduleAnyway", 1)}:
            errs.append(f"{mode}: default spread {spread}, want hostname and zone, ScheduleAnyway, maxSkew 1")
        if any(t.get("key") in (DRAINING_TAINT, None) for t in spec.get("tolerations") or []):
            errs.append(f"{mode}: the pod tolerates {DRAINING_TAINT} by default: it could land on a node being drained")
        if spec.get("affinity") or find(docs, "PodMonitor"):
            errs.append(f"{mode}: default renders an affinity or a PodMonitor: {spec.get('affinity')}")

        # Each value does what it says.
        _, spec = pod(render(merged(base, {"nodeSelector": None})))
        if "nodeSelector" in spec:
            errs.append(f"{mode}: nodeSelector: null still renders {spec['nodeSelector']}")
        _, spec = pod(render(merged(base, {"nodeSelector": {"eks.amazonaws.com/nodegroup": "system"}})))
        if spec.get("nodeSelector") != {"kubernetes.io/os": "linux", "eks.amazonaws.com/nodegroup": "system"}:
            errs.append(f"{mode}: a system node group label is not added to the nodeSelector: {spec.get('nodeSelector')}")
        own = {"maxSkew": 2, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "DoNotSchedule"}
        _, spec = pod(render(merged(base, {"topologySpreadConstraints": [own]})))
        if [{k: c[k] for k in own} for c in spec.get("topologySpreadConstraints") or []] != [own]:
            errs.append(f"{mode}: topologySpreadConstraints set does not replace the defaults: {spec.get('topologySpreadConstraints')}")
        dep, _ = pod(render(merged(base, {"strategy": {"type": "Recreate", "rollingUpdate": None}})))
        if (dep or {}).get("spec", {}).get("strategy") != {"type": "Recreate"}:
            errs.append(f"{mode}: strategy Recreate renders {(dep or {}).get('spec', {}).get('strategy')}")
        user_term = {"weight": 5, "preference": {"matchExpressions": [{"key": "disk", "operator": "In", "values": ["ssd"]}]}}
        _, spec = pod(render(merged(base, {
            "avoidNodesLabelled": {"eks.amazonaws.com/nodegroup": ["workers-a", "workers-b"], "spot": []},
            "affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [user_term]}}})))
        got = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get("preferredDuringSchedulingIgnoredDuringExecution")
        want = [user_term, {"weight": 100, "preference": {"matchExpressions": [
            {"key": "eks.amazonaws.com/nodegroup", "operator": "NotIn", "values": ["workers-a", "workers-b"]},
            {"key": "spot", "operator": "DoesNotExist"}]}}]
        if got != want:
            errs.append(f"{mode}: avoidNodesLabelled renders {got}, want {want}")
        docs = render(merged(base, {"podMonitor": {"enabled": True}}))
        pm = find(docs, "PodMonitor")
        dep, _ = pod(docs)
        ports = ["metrics"] + (["ca-metrics"] if mode == "bundled" else [])
        pod_labels = ((dep or {}).get("spec", {}).get("template", {}).get("metadata", {}).get("labels") or {})
        if not pm or [e["port"] for e in pm["spec"]["podMetricsEndpoints"]] != ports \
                or not pm["spec"]["selector"]["matchLabels"].items() <= pod_labels.items():
            errs.append(f"{mode}: podMonitor.enabled renders {pm and pm['spec']}, want ports {ports} selecting the pods {pod_labels}")
        named = {p["name"] for c in pod_containers(dep or {}) for p in c.get("ports") or []}
        if not set(ports) <= named:
            errs.append(f"{mode}: PodMonitor ports {ports} are not all named container ports ({named})")
    # Sidecar: the PodMonitor selects CA's pods by clusterAutoscaler.podLabels, on the port
    # the example CA values name "metrics"; the pod values are CA's chart's (refused here).
    pm = find(render(merged(REQUIRED["sidecar"], {"podMonitor": {"enabled": True}})), "PodMonitor")
    example = yaml.safe_load((CHART / "examples/cluster-autoscaler-values.yaml").read_text())
    example_ports = {p["name"] for c in example.get("initContainers") or [] for p in c.get("ports") or []}
    if not pm or pm["spec"]["selector"]["matchLabels"] != yaml.safe_load((CHART / "values.yaml").read_text())[
            "clusterAutoscaler"]["podLabels"] or "metrics" not in example_ports:
        errs.append(f"sidecar: PodMonitor {pm and pm['spec']} does not select CA's pods on the example's metrics port ({example_ports})")
    return errs


def home_url_errors():
    """The project's address is written once, as Chart.yaml's home: any other mention of the
    same repository, or of another `example` project URL, in deploy/, docs/, README.md or
    CHANGELOG.md is an error."""
    home = yaml.safe_load((CHART / "Chart.yaml").read_text())["home"].rstrip("/")
    repo = re.sub(r"^https?://", "", home)
    project = re.compile(rf"{re.escape(repo)}|(?:github|gitlab)\.com/example\b", re.I)
    errs = []
    for path in sorted(p for d in ("deploy", "docs") for p in (ROOT / d).rglob("*") if p.is_file()) + [
            ROOT / "README.md", ROOT / "CHANGELOG.md"]:
        try:
            lines = path.read_text().splitlines()
        except UnicodeDecodeError:
            continue
        for n, line in enumerate(lines, 1):
            if project.search(line) and not (path == CHART / "Chart.yaml" and line.startswith("home:")):
                errs.append(f"{path.relative_to(ROOT)}:{n}: the project's address outside Chart.yaml's home: {line.strip()[:120]}")
    return errs


def pod_containers(doc):
    """The containers (init containers included) of a Pod or of a workload's pod template."""
    spec = doc.get("spec") or {}
    pod = spec if doc.get("kind") == "Pod" else ((spec.get("template") or {}).get("spec") or {})
    return (pod.get("initContainers") or []) + (pod.get("containers") or [])


def check_chart(base_docs, overlay_docs):
    """Returns the number of failures."""
    failed = 0

    def fail(msg):
        nonlocal failed
        print(f"FAIL {msg}")
        failed += 1

    home = tempfile.mkdtemp(prefix="helm-home-")
    env = dict(os.environ, HELM_CACHE_HOME=f"{home}/cache", HELM_CONFIG_HOME=f"{home}/config",
               HELM_DATA_HOME=f"{home}/data")
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    errs = copy_errors()
    for e in errs:
        fail(f"deploy/chart: {e}")
    if not errs:
        print(f"ok   deploy/chart: {', '.join(str(c.relative_to(CHART)) for c in CHART_COPIES)} are copies of their sources, "
              f"and the chart holds no symbolic link")
    schema = json.loads((CHART / "values.schema.json").read_text())
    shape = rust_config_shape()
    prefix, series = rust_metrics()
    anchors = runbook_anchors()
    base_rules = {d["kind"]: d["rules"] for d in base_docs if d["kind"] in ("ClusterRole", "Role")}
    base_config = yaml.safe_load(find_provider_config(base_docs)["data"]["config.yaml"])
    overlay_config = yaml.safe_load(find_provider_config(overlay_docs)["data"]["config.yaml"])
    ca_docs = render(ROOT / "deploy/cluster-autoscaler")
    ca_rules = {k: (find(ca_docs, k, "cluster-autoscaler") or {}).get("rules", []) for k in ("ClusterRole", "Role")}

    rel = lambda p: p.relative_to(ROOT)
    try:
        errs = schema_config_errors(schema["properties"]["config"], shape)
        if schema.get("additionalProperties") is not False or set(schema["properties"]) - {"global"} != set(defaults):
            errs.append("values.schema.json must list exactly the keys of values.yaml and refuse others")
        for e in errs:
            fail(f"{rel(CHART)}/values.schema.json: {e}")
        if not errs:
            print(f"ok   {rel(CHART)}/values.schema.json: top-level keys = values.yaml's, config = src/config structs")

        # The defaults (with what the chart requires: a cluster name), the ci files, and
        # the quickstart's values file (docs/quickstart-eks.md) as its sed writes it, rendered the same way.
        required = pathlib.Path(home) / "required-values.yaml"
        required.write_text(yaml.safe_dump(REQUIRED["sidecar"]))
        sed_values = pathlib.Path(home) / "my-values.yaml"
        sed_values.write_text(quickstart_sed_values())
        values_files = [None] + sorted((CHART / "ci").glob("*-values.yaml")) + [QUICKSTART]
        rendered_alerts, audited_modes = [], set()
        for vf in values_files:
            label = (f"{vf.relative_to(CHART)} after the quickstart's sed" if vf == QUICKSTART
                     else str(vf.relative_to(CHART)) if vf else "defaults + a cluster name")
            source = sed_values if vf == QUICKSTART else vf or required
            extra = ["-f", str(source)]
            values = merged(defaults, yaml.safe_load(source.read_text()))
            lint = helm("lint", "--strict", str(CHART), "-n", NAMESPACE, *extra, env=env)
            if lint.returncode != 0:
                fail(f"helm lint --strict deploy/chart ({label}):\n{lint.stdout}{lint.stderr}")
                continue
            out = helm("template", RELEASE, str(CHART), "-n", NAMESPACE, *extra, env=env)
            if out.returncode != 0:
                fail(f"helm template deploy/chart ({label}): {out.stderr.strip()}")
                continue
            docs = [d for d in yaml.safe_load_all(out.stdout) if d]
            kinds, n_failed = [], failed
            for doc in docs:
                name = f"deploy/chart ({label}): {doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
                kinds.append(doc.get("kind"))
                for e in check_object(doc) + chart_binding_errors(values, docs, doc):
                    fail(f"{name}: {e}")
                if doc.get("kind") != "ClusterRole" and doc.get("kind") != "ClusterRoleBinding" \
                        and doc["metadata"].get("namespace") not in (NAMESPACE, values["serviceMonitor"]["namespace"],
                                                                    values["podMonitor"]["namespace"],
                                                                    values["prometheusRule"]["namespace"],
                                                                    values["grafanaDashboard"]["namespace"]):
                    fail(f"{name}: metadata.namespace must be set (release namespace {NAMESPACE})")
            # One source of truth: RBAC rules as deploy/base/rbac.yaml (the Lease named as configured).
            lease = (values["config"].get("scaleIn") or {}).get("leaseName", "ca-asg-provider")
            # Least privilege, in every mode.
            for e in rbac_audit(docs, rbac_names(docs, lease), provider_config_name(docs)):
                fail(f"deploy/chart ({label}): RBAC: {e}")
            if any(d["kind"] in ("Role", "ClusterRole") for d in docs):
                audited_modes.add(values["mode"])
            want_rules = {"ClusterRole": base_rules["ClusterRole"],
                          "Role": [dict(r, resourceNames=[lease]) if "resourceNames" in r else r for r in base_rules["Role"]]}
            for kind, want in want_rules.items():
                got = find(docs, kind, provider_config_name(docs))  # the provider's: named as its ConfigMap
                if values["rbac"]["create"] and (not got or got["rules"] != want):
                    fail(f"deploy/chart ({label}): {kind} rules differ from deploy/base/rbac.yaml's:\n"
                         f"  chart: {got and got['rules']}\n  base:  {want}")
            cfg = provider_config(docs, values)
            if cfg is None:
                fail(f"deploy/chart ({label}): expected exactly one ConfigMap with config.yaml")
                continue
            for e in config_key_errors(cfg, shape, "config.yaml"):
                fail(f"deploy/chart ({label}): {e}")
            # One source of truth: the default config is deploy/base's (sidecar) or the
            # standalone overlay's (standalone).
            if vf and vf.name in ("sidecar-values.yaml", "standalone-values.yaml", "bundled-values.yaml"):
                want, src = ((base_config, "deploy/base/config.yaml") if values["mode"] != "standalone"
                             else (overlay_config, "deploy/overlays/standalone"))
                if cluster_neutral(cfg) != cluster_neutral(want):
                    fail(f"deploy/chart ({label}): provider config differs from {src}'s (the cluster name aside):\n"
                         f"  chart: {cfg}\n  {src}: {want}")
            if vf == QUICKSTART:
                for e in quickstart_errors(docs, values, cfg) + quickstart_sed_errors(env):
                    fail(f"deploy/chart ({label}): {e}")
            if values["mode"] == "standalone":
                for e in standalone_wiring_errors(docs, values, cfg):
                    fail(f"deploy/chart ({label}): {e}")
            elif values["mode"] == "bundled":
                for e in bundled_wiring_errors(docs, values, cfg, ca_rules):
                    fail(f"deploy/chart ({label}): {e}")
            for e in scrape_errors(docs, values):
                fail(f"deploy/chart ({label}): scrape: {e}")
            for e in dashboard_configmap_errors(docs, values):
                fail(f"deploy/chart ({label}): dashboard: {e}")
            if "symbolic link" in lint.stderr + out.stderr:
                fail(f"deploy/chart ({label}): helm warns of a symbolic link: {(lint.stderr + out.stderr).strip()[:300]}")
            for e in uninstall_hook_errors(docs, values):
                fail(f"deploy/chart ({label}): uninstall: {e}")
            if values["mode"] != "sidecar":
                for e in test_hook_errors(docs):
                    fail(f"deploy/chart ({label}): helm test: {e}")
            else:
                for kind in ("Deployment", "ServiceAccount", "PodDisruptionBudget", "Certificate", "Issuer"):
                    if kind in kinds:
                        fail(f"deploy/chart ({label}): sidecar mode must not render a {kind} (CA's chart owns the pod)")
            for want_kind, on in (("ServiceMonitor", values["serviceMonitor"]["enabled"]),
                                  ("PodMonitor", values["podMonitor"]["enabled"]),
                                  ("PrometheusRule", values["prometheusRule"]["enabled"])):
                if (want_kind in kinds) != bool(on):
                    fail(f"deploy/chart ({label}): {want_kind} rendered={want_kind in kinds}, enabled={on}")
            # chart-testing installs into a random namespace: so must every ci file.
            if vf:
                ns = "ct-random-8k2x"
                out = helm("template", RELEASE, str(CHART), "-n", ns, *extra, env=env)
                if out.returncode != 0:
                    fail(f"deploy/chart ({label}) in namespace {ns}: {out.stderr.strip()[-300:]}")
                else:
                    for d in yaml.safe_load_all(out.stdout):
                        if not d:
                            continue
                        where = [d["metadata"].get("namespace")] + [x.get("namespace") for x in d.get("subjects") or []]
                        if d and any(w not in (None, ns) for w in where):
                            fail(f"deploy/chart ({label}) in namespace {ns}: {d['kind']}/{d['metadata']['name']} "
                                 f"names namespace {[w for w in where if w not in (None, ns)]}")
            rule = find(docs, "PrometheusRule")
            if rule:
                rendered_alerts.append((label, rule, values))
            if failed == n_failed:
                print(f"ok   helm lint --strict + template deploy/chart ({label}): {len(docs)} objects "
                      f"({', '.join(sorted(set(kinds)))})")

        if audited_modes != set(MODES):
            fail(f"deploy/chart: RBAC audited in modes {sorted(audited_modes)}, not every mode {list(MODES)}")

        # Alert rules: real metrics, runbooks that exist in docs/operations.md.
        n_failed = failed
        for label, rule, values in rendered_alerts:
            for g in rule["spec"]["groups"]:
                for r in g["rules"]:
                    for e in promql_errors(r["expr"], prefix, series):
                        fail(f"deploy/chart ({label}): alert {r['alert']}: {e}")
                    ann = r.get("annotations") or {}
                    if not (ann.get("summary") and ann.get("description") and ann.get("runbook_url")):
                        fail(f"deploy/chart ({label}): alert {r['alert']}: summary, description and runbook_url are required")
                    url = ann.get("runbook_url", "")
                    if not url.startswith(values["prometheusRule"]["runbookBaseUrl"] + "#") \
                            or url.split("#", 1)[1] != r["alert"].lower() or r["alert"].lower() not in anchors:
                        fail(f"deploy/chart ({label}): alert {r['alert']}: runbook_url {url} must point at the "
                             f"docs/operations.md heading '{r['alert']}'")
        if not rendered_alerts:
            fail("no values file in deploy/chart/ci enables prometheusRule")
        elif failed == n_failed:
            alerts = {r["alert"] for _, rule, _ in rendered_alerts for g in rule["spec"]["groups"] for r in g["rules"]}
            print(f"ok   PrometheusRule: {len(alerts)} alerts (checked in {len(rendered_alerts)} renders) query only metrics "
                  f"of src/telemetry/metrics.rs ({len(series)} series) and link docs/operations.md runbooks")

        n_failed = failed
        for e in release_errors():
            fail(f"release notes: {e}")
        if failed == n_failed:
            print("ok   CHANGELOG.md and docs/helm.md's version table cover Chart.yaml's version, its appVersion and CA image; Chart.yaml's artifacthub.io/images lists each CA image of tagsByKubernetesMinor")
        n_failed = failed
        for e in ca_tag_errors(env):
            fail(f"deploy/chart cluster-autoscaler's tag: {e}")
        if failed == n_failed:
            print("ok   deploy/chart bundled mode: CA's tag from the cluster's Kubernetes minor (every row), a pinned one kept, a minor without a row refused")
        n_failed = failed
        for e in notes_errors(env):
            fail(f"deploy/chart NOTES.txt: {e}")
        if failed == n_failed:
            print("ok   deploy/chart NOTES.txt: in every mode, the three checks (pods Ready and the Lease, check-config or helm test, the metrics)")

        # Values the schema (or a template check) must refuse.
        n_failed = failed
        with tempfile.TemporaryDirectory() as tmp:
            for what, (text, expect) in NEGATIVE.items():
                bad = pathlib.Path(tmp) / "bad-values.yaml"
                bad.write_text(text)
                out = helm("template", RELEASE, str(CHART), "-n", NAMESPACE, "-f", str(bad), env=env)
                if out.returncode == 0 or expect not in out.stderr:
                    fail(f"helm template deploy/chart with {what} ({text.strip()!r}) must fail with {expect!r}; "
                         f"exit {out.returncode}: {out.stderr.strip()[:300]}")
        if failed == n_failed:
            print(f"ok   deploy/chart refuses {len(NEGATIVE)} bad values files "
                  f"({sum(1 for _, e in NEGATIVE.values() if 'schema' in e)} by values.schema.json)")

        # No value is silently ignored in any mode; dryRun reaches every serving container.
        n_failed = failed
        with tempfile.TemporaryDirectory() as tmp:
            errs, counted = mode_effect_errors(env, defaults, tmp)
        for e in errs:
            fail(f"deploy/chart values: {e}")
        if failed == n_failed:
            print("ok   deploy/chart: every value changes the render or is refused naming value and mode ("
                  + "; ".join(f"{m}: {t} tried, {t - r} change the render, {r} refused, {k} not changeable within the schema"
                              for m, (t, r, k) in counted.items())
                  + "); dryRun: true reaches every serve container or is refused")

        errs = home_url_errors()
        for e in errs:
            fail(f"project home: {e}")
        if not errs:
            print("ok   the project's address is written once, in deploy/chart/Chart.yaml's home (none in deploy/, docs/, README.md or CHANGELOG.md besides)")

        errs = chart_config_rollout_selftest(env) + chart_config_rollout_errors(env)
        for e in errs:
            fail(f"deploy/chart config rollout: {e}")
        if not errs:
            print("ok   deploy/chart: a change of config changes the pod template (standalone, bundled: helm upgrade "
                  "rolls the pods); sidecar mode's NOTES say to restart CA's pods; a chart without the checksum fails")

        # The pod's scheduling and rollout defaults, and the values that change them.
        with tempfile.TemporaryDirectory() as tmp:
            errs = pod_scheduling_errors(env, tmp)
        for e in errs:
            fail(f"deploy/chart scheduling: {e}")
        if not errs:
            print("ok   deploy/chart: RollingUpdate maxUnavailable 0/maxSurge 1 with 2 replicas and the PDB, nodeSelector "
                  "kubernetes.io/os: linux, spread by hostname and zone, no toleration of "
                  f"{DRAINING_TAINT}; nodeSelector, topologySpreadConstraints, strategy, avoidNodesLabelled "
                  "(merged with affinity) and podMonitor each render as documented (standalone, bundled, sidecar)")

        # The chart README is generated from values.yaml's comments and must be current.
        out = subprocess.run([sys.executable, str(ROOT / "scripts/chart_readme.py"), "--check"],
                             capture_output=True, text=True)
        if out.returncode != 0:
            fail(f"deploy/chart/README.md: {out.stderr.strip()}")
        else:
            print("ok   deploy/chart/README.md is current (scripts/chart_readme.py from values.yaml's comments)")
        out = subprocess.run([sys.executable, str(ROOT / "tests/deploy/chart_readme_test.py")],
                             capture_output=True, text=True)
        print(out.stdout, end="")
        if out.returncode != 0:
            fail(f"tests/deploy/chart_readme_test.py: {out.stderr.strip()}")

        # Example values for CA's own chart.
        n_failed = failed
        for e in example_errors(defaults):
            fail(f"deploy/chart/{e}")
        if failed == n_failed:
            print("ok   deploy/chart/examples: CA chart values mount this chart's ConfigMaps and Secret, sidecar pod valid")
    finally:
        shutil.rmtree(home, ignore_errors=True)

    # The Grafana dashboard.
    n_failed = failed
    try:
        dash = json.loads(DASHBOARD.read_text())
    except (OSError, ValueError) as e:
        fail(f"{rel(DASHBOARD)}: not valid JSON: {e}")
        return failed
    exprs, ids, stack = [], [], [dash]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if "gridPos" in node and "id" in node:
                ids.append(node["id"])
            if isinstance(node.get("expr"), str):
                exprs.append(node["expr"])
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    if len(ids) != len(set(ids)):
        fail(f"{rel(DASHBOARD)}: panel ids are not unique")
    if not exprs:
        fail(f"{rel(DASHBOARD)}: no queries")
    for expr in exprs:
        for e in promql_errors(expr, prefix, series):
            fail(f"{rel(DASHBOARD)}: {e}")
    # Every metric has a panel, or a reason here not to.
    used = {n for x in exprs for n in own_names(x, prefix)}
    bases = {re.sub(r"_(total|bucket|sum|count)$", "", s) for s in series}
    shown = {re.sub(r"_(total|bucket|sum|count)$", "", n) for n in used}
    for b in sorted(bases - shown - set(NOT_ON_DASHBOARD)):
        fail(f"{rel(DASHBOARD)}: {b} has no panel (add one, or a reason in NOT_ON_DASHBOARD)")
    for b in sorted(set(NOT_ON_DASHBOARD) - bases):
        fail(f"validate.py: NOT_ON_DASHBOARD names {b}, which src/telemetry/metrics.rs does not register")
    if failed == n_failed:
        print(f"ok   {rel(DASHBOARD)}: {len(ids)} panels, {len(exprs)} queries over {len(used)} metrics, all in src/telemetry/metrics.rs; every metric has a panel or a reason not to ({len(NOT_ON_DASHBOARD)})")
    return failed


def main():
    targets = [ROOT / "deploy/base"] + sorted(p for p in (ROOT / "deploy/overlays").iterdir() if p.is_dir())
    failed = 0
    rendered = {}
    errs = rbac_audit_selftest()
    for e in errs:
        print(f"FAIL validate.py: {e}")
    failed += len(errs)
    # Least privilege in the plain manifests and both overlays (the chart: check_chart).
    for target in [ROOT / "deploy/base", ROOT / "deploy/cluster-autoscaler"] + targets[1:]:
        docs = render(target)
        errs = rbac_audit(docs, rbac_names(docs))
        for e in errs:
            print(f"FAIL {target.relative_to(ROOT)}: RBAC: {e}")
        failed += len(errs)
        if not errs:
            roles = [d for d in docs if d["kind"] in ("Role", "ClusterRole")]
            print(f"ok   {target.relative_to(ROOT)}: RBAC least privilege ({len(roles)} roles, "
                  f"{sum(len(r['rules']) for r in roles)} rules: no `*`, no Secrets, no cluster-wide ConfigMap write, "
                  f"every write needed, named where it can be)")
    for target in targets:
        docs = render(target)
        rendered[target.name] = docs
        kinds = []
        for doc in docs:
            name = f"{target.relative_to(ROOT)}: {doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
            kinds.append(doc.get("kind"))
            errs = check_object(doc) + check_binding(target, doc)
            for e in errs:
                print(f"FAIL {name}: {e}")
                failed += 1
        print(f"ok   {target.relative_to(ROOT)}: {len(docs)} objects ({', '.join(sorted(set(kinds)))})")
    # One set of --balancing-ignore-label labels everywhere CA gets its flags.
    errs, n, where = balancing_label_errors({k: v for k, v in rendered.items() if k != "base"})
    for e in errs:
        print(f"FAIL {e}")
    failed += len(errs)
    if not errs:
        print(f"ok   --{BALANCING}: docs/configuration.md table's {n} labels, each once, in {len(where)} places ({', '.join(where)})")
    errs = config_rollout_selftest()
    for e in errs:
        print(f"FAIL validate.py: {e}")
    failed += len(errs)
    for overlay in sorted(k for k in rendered if k != "base"):
        errs = config_rollout_errors(overlay)
        for e in errs:
            print(f"FAIL deploy/overlays/{overlay}: {e}")
        failed += len(errs)
        if not errs:
            print(f"ok   deploy/overlays/{overlay}: the provider's ConfigMap carries a hash suffix, the pods mount exactly it, "
                  f"and an edit of its config renames it (kubectl apply -k rolls the pods)")
    for overlay in sorted(k for k in rendered if k != "base"):
        errs = overlay_remove_hooks_errors(rendered[overlay])
        for e in errs:
            print(f"FAIL deploy/overlays/{overlay}: deploy/remove-hooks-job.jq: {e}")
        failed += len(errs)
        if not errs:
            print(f"ok   deploy/overlays/{overlay}: deploy/remove-hooks-job.jq makes a valid Job running remove-hooks "
                  f"as the provider runs (image, config, ServiceAccount, mounts)")
    errs = sidecar_remove_hooks_errors()
    for e in errs:
        print(f"FAIL {SIDECAR_EXAMPLE.relative_to(ROOT)}: deploy/remove-hooks-job.jq: {e}")
    failed += len(errs)
    if not errs:
        print(f"ok   {SIDECAR_EXAMPLE.relative_to(ROOT)}: deploy/remove-hooks-job.jq on CA's Deployment (the provider a native "
              f"sidecar in initContainers) makes a valid Job running only remove-hooks as the provider runs (image, "
              f"config, also --config=PATH, ServiceAccount, volumes, mounts)")
    errs = remove_hooks_refusal_errors()
    for e in errs:
        print(f"FAIL deploy/remove-hooks-job.jq: {e}")
    failed += len(errs)
    if not errs:
        print("ok   deploy/remove-hooks-job.jq: no ca-asg-provider in containers or initContainers, or one without "
              "--config: exits non-zero, prints no Job, and says what it looked for")
    failed += check_chart(rendered["base"], rendered["standalone"])
    if failed:
        print(f"{failed} failure(s)")
        return 1
    print("all deploy/ checks passed")
    return 0


HELM = helm_binary()

if __name__ == "__main__":
    sys.exit(main())

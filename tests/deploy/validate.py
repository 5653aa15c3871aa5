#!/usr/bin/env python3
"""Renders every kustomize overlay under deploy/ and validates each object against the
Kubernetes OpenAPI schemas in strict mode (unknown fields are errors).

cert-manager objects are not in the Kubernetes schemas; they are checked against the
fields of cert-manager.io/v1 that the overlays use. Exit 1 on the first bad object."""

import pathlib
import subprocess
import sys

import kubernetes_validate
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
K8S_VERSION = "1.32.0"

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
    return errs


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


def main():
    targets = [ROOT / "deploy/base"] + sorted(p for p in (ROOT / "deploy/overlays").iterdir() if p.is_dir())
    failed = 0
    for target in targets:
        docs = render(target)
        kinds = []
        for doc in docs:
            name = f"{target.relative_to(ROOT)}: {doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
            kinds.append(doc.get("kind"))
            if str(doc.get("apiVersion", "")).startswith("cert-manager.io/"):
                errs = check_cert_manager(doc)
            else:
                try:
                    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
                    errs = []
                except kubernetes_validate.ValidationError as e:
                    errs = [f"{'.'.join(str(p) for p in e.path)}: {e.message}"]
                except kubernetes_validate.SchemaNotFoundError as e:
                    errs = [f"no schema: {e}"]
            errs += check_binding(target, doc)
            for e in errs:
                print(f"FAIL {name}: {e}")
                failed += 1
        print(f"ok   {target.relative_to(ROOT)}: {len(docs)} objects ({', '.join(sorted(set(kinds)))})")
    if failed:
        print(f"{failed} invalid object(s)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""scripts/sbom.py against Cargo.lock: the crate SBOM names every crate the binary is built
from with Cargo.lock's version and SHA-256, nothing only tests use, and refuses a lock
without a checksum. Run by scripts/test.sh (needs cargo, for `cargo metadata`)."""
import importlib.util
import json
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
spec = importlib.util.spec_from_file_location("sbom", ROOT / "scripts/sbom.py")
sbom = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sbom)

failures = []


def check(ok, what):
    if not ok:
        failures.append(what)


lock = tomllib.loads((ROOT / "Cargo.lock").read_text())
locked = {(p["name"], p["version"]): p for p in lock["package"]}

with tempfile.TemporaryDirectory() as tmp:
    out = Path(tmp) / "crate.json"
    subprocess.run([sys.executable, str(ROOT / "scripts/sbom.py"), "crate",
                    "--target", "x86_64-unknown-linux-gnu", "--out", str(out)], check=True)
    doc = json.loads(out.read_text())
    again = Path(tmp) / "again.json"
    subprocess.run([sys.executable, str(ROOT / "scripts/sbom.py"), "crate",
                    "--target", "x86_64-unknown-linux-gnu", "--out", str(again)], check=True)
    check(out.read_bytes() == again.read_bytes(), "two runs give different bytes")

check(doc["spdxVersion"] == "SPDX-2.3", "not SPDX-2.3")
pkgs = {(p["name"], p["versionInfo"]): p for p in doc["packages"]}
check(len(pkgs) == len(doc["packages"]), "a crate listed twice")
for (name, version), p in pkgs.items():
    entry = locked.get((name, version))
    if entry is None:
        failures.append(f"{name} {version} is not in Cargo.lock")
        continue
    if "checksum" in entry:
        got = [c["checksumValue"] for c in p.get("checksums", []) if c["algorithm"] == "SHA256"]
        check(got == [entry["checksum"]], f"{name} {version}: checksum {got} is not Cargo.lock's")
    else:
        check(entry.get("source") is None, f"{name} {version}: a registry crate without checksum")
    check(p["licenseDeclared"] and "/" not in p["licenseDeclared"],
          f"{name}: licence {p['licenseDeclared']!r} is not an SPDX expression")
# Cargo.lock's graph (every platform, every kind) from the crate is a superset; the
# crates the service needs at run time and at build time are in; test-only ones are not.
for must in ["ca-asg-provider", "tokio", "tonic", "kube", "aws-sdk-autoscaling", "aws-lc-sys",
             "protox", "tonic-prost-build"]:
    check(any(n == must for n, _ in pkgs), f"{must} is missing")
for never in ["proptest", "criterion", "aws-smithy-mocks", "loadgen"]:
    check(not any(n == never for n, _ in pkgs), f"{never} (tests or loadgen only) is listed")
by_id = {p["SPDXID"]: p for p in doc["packages"]}
root = [r["relatedSpdxElement"] for r in doc["relationships"] if r["relationshipType"] == "DESCRIBES"]
check(len(root) == 1 and by_id[root[0]]["name"] == "ca-asg-provider", "DESCRIBES is not the crate")
check(all(r["spdxElementId"] in by_id or r["spdxElementId"] == "SPDXRef-DOCUMENT" for r in doc["relationships"])
      and all(r["relatedSpdxElement"] in by_id for r in doc["relationships"]),
      "a relationship names a package the document does not have")
tokio = [p for (n, _), p in pkgs.items() if n == "tokio"][0]
check(tokio["licenseDeclared"] == "MIT", f"tokio's licence is {tokio['licenseDeclared']}")
check(sbom.licence("MIT/Apache-2.0") == "MIT OR Apache-2.0", "Cargo's old '/' is not OR")

# Fails closed: a registry crate whose Cargo.lock entry has no checksum is refused.
meta = {"packages": [
    {"id": "root", "name": "ca-asg-provider", "version": "0.1.0", "source": None, "license": "Apache-2.0"},
    {"id": "dep", "name": "dep", "version": "1.0.0", "source": sbom.CRATES_IO, "license": "MIT"}],
    "workspace_members": ["root"],
    "resolve": {"nodes": [{"id": "root", "deps": [{"pkg": "dep", "dep_kinds": [{"kind": None}]}]},
                          {"id": "dep", "deps": []}]}}
try:
    sbom.crate_packages(meta, {("dep", "1.0.0", sbom.CRATES_IO): None})
    failures.append("a crate without a checksum was accepted")
except SystemExit as e:
    check("no checksum" in str(e), f"wrong refusal: {e}")
try:
    sbom.crate_packages(meta, {})
    failures.append("a crate missing from Cargo.lock was accepted")
except SystemExit as e:
    check("not in Cargo.lock" in str(e), f"wrong refusal: {e}")

if failures:
    sys.exit("tests/release/sbom_test.py:\n  " + "\n  ".join(failures))
print(f"sbom: {len(pkgs)} crates, each with Cargo.lock's version and checksum")

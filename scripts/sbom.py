#!/usr/bin/env python3
"""SPDX 2.3 JSON software bills of materials for a release (scripts/release.sh).

  scripts/sbom.py crate --target TRIPLE --out FILE
      The crate's: every crate the ca-asg-provider binary is built from for TRIPLE
      (normal and build dependencies, from `cargo metadata --locked --filter-platform`),
      each with its version, its licence as Cargo.toml declares it, and its SHA-256 from
      Cargo.lock (a registry crate without one is refused).
  scripts/sbom.py image --arch ARCH --binary PATH --crate-sbom FILE --packages FILE
                        --name REPO:TAG --out FILE
      The image's: the pinned Debian packages (`scripts/image.sh --packages ARCH` lists
      them: name, version, architecture, SHA-256 of the .deb, its URL), the binary (its
      SHA-256) and, from the crate SBOM, what the binary is built from.

The same inputs give the same bytes: times are SOURCE_DATE_EPOCH's (the commit's), the
document namespace is derived from the content, lists are sorted. Standard library only.
"""
import argparse
import datetime
import hashlib
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CRATE = "ca-asg-provider"
CRATES_IO = "registry+https://github.com/rust-lang/crates.io-index"
NAMESPACE_BASE = "https://spdx.org/spdxdocs/ca-asg-provider"


def die(msg):
    sys.exit(f"error: sbom: {msg}")


def spdx_id(prefix, *parts):
    return "SPDXRef-" + re.sub(r"[^A-Za-z0-9.-]", "-", "-".join((prefix,) + parts))


def created():
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    if epoch is None:
        try:
            epoch = subprocess.run(["git", "-C", str(ROOT), "log", "-1", "--format=%ct"],
                                   check=True, capture_output=True, text=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            epoch = "0"
    return datetime.datetime.fromtimestamp(int(epoch), datetime.timezone.utc).strftime(
        "%Y-%m-%dT%H:%M:%SZ")


def licence(expr):
    """Cargo's licence field as an SPDX expression ("MIT/Apache-2.0" is Cargo's old OR)."""
    if not expr:
        return "NOASSERTION"
    return " OR ".join(p.strip() for p in expr.split("/")) if "/" in expr else expr.strip()


def lock_checksums(lock_path):
    """(name, version, source) -> checksum, for every package of Cargo.lock."""
    lock = tomllib.loads(Path(lock_path).read_text())
    return {(p["name"], p["version"], p.get("source")): p.get("checksum")
            for p in lock.get("package", [])}


def crate_packages(metadata, lock):
    """The crates CRATE's binary is built from: (packages, relationships), sorted."""
    by_id = {p["id"]: p for p in metadata["packages"]}
    nodes = {n["id"]: n for n in metadata["resolve"]["nodes"]}
    roots = [p["id"] for p in metadata["packages"]
             if p["name"] == CRATE and p["id"] in metadata["workspace_members"]]
    if len(roots) != 1:
        die(f"expected one workspace package {CRATE}, found {len(roots)}")
    seen, todo, edges = set(), [roots[0]], set()
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        for d in nodes[pid]["deps"]:
            kinds = {k["kind"] for k in d["dep_kinds"]}
            if kinds <= {"dev"}:
                continue  # tests and benches only: not in the binary
            rel = "DEPENDS_ON" if None in kinds else "BUILD_DEPENDENCY_OF"
            edges.add((pid, rel, d["pkg"]))
            todo.append(d["pkg"])
    ids = {pid: spdx_id("crate", by_id[pid]["name"], by_id[pid]["version"]) for pid in seen}
    if len(set(ids.values())) != len(ids):
        die("two crates map to one SPDX id")
    packages = []
    for pid in sorted(seen, key=lambda i: ids[i]):
        p = by_id[pid]
        src = p.get("source")
        key = (p["name"], p["version"], src)
        if src is not None and key not in lock:
            die(f"{p['name']} {p['version']} ({src}) is not in Cargo.lock")
        checksum = lock.get(key)
        pkg = {
            "name": p["name"],
            "SPDXID": ids[pid],
            "versionInfo": p["version"],
            "filesAnalyzed": False,
            "licenseConcluded": "NOASSERTION",
            "licenseDeclared": licence(p.get("license")),
            "copyrightText": "NOASSERTION",
        }
        if src == CRATES_IO:
            if not checksum:
                die(f"{p['name']} {p['version']} has no checksum in Cargo.lock")
            pkg["downloadLocation"] = (
                f"https://crates.io/api/v1/crates/{p['name']}/{p['version']}/download")
            pkg["checksums"] = [{"algorithm": "SHA256", "checksumValue": checksum}]
        elif src is None:
            pkg["downloadLocation"] = "NOASSERTION"  # the checkout itself
        else:
            if checksum:
                pkg["checksums"] = [{"algorithm": "SHA256", "checksumValue": checksum}]
            pkg["downloadLocation"] = src.split("+", 1)[-1]
        pkg["externalRefs"] = [{"referenceCategory": "PACKAGE-MANAGER",
                                "referenceType": "purl",
                                "referenceLocator": f"pkg:cargo/{p['name']}@{p['version']}"}]
        packages.append(pkg)
    rels = []
    for a, rel, b in edges:
        if rel == "DEPENDS_ON":
            rels.append({"spdxElementId": ids[a], "relationshipType": rel,
                         "relatedSpdxElement": ids[b]})
        else:  # b is a build dependency of a
            rels.append({"spdxElementId": ids[b], "relationshipType": rel,
                         "relatedSpdxElement": ids[a]})
    rels.sort(key=lambda r: (r["spdxElementId"], r["relationshipType"], r["relatedSpdxElement"]))
    return ids[roots[0]], packages, rels


def document(name, describes, packages, relationships):
    doc = {
        "spdxVersion": "SPDX-2.3",
        "dataLicense": "CC0-1.0",
        "SPDXID": "SPDXRef-DOCUMENT",
        "name": name,
        "documentNamespace": "",
        "creationInfo": {"created": created(), "creators": ["Tool: ca-asg-provider scripts/sbom.py"]},
        "packages": packages,
        "relationships": [{"spdxElementId": "SPDXRef-DOCUMENT", "relationshipType": "DESCRIBES",
                           "relatedSpdxElement": describes}] + relationships,
    }
    digest = hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()
    doc["documentNamespace"] = f"{NAMESPACE_BASE}/{name}-{digest[:16]}"
    return doc


def write(doc, out):
    Path(out).write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")


def cmd_crate(args):
    try:
        meta = subprocess.run(
            ["cargo", "metadata", "--format-version", "1", "--locked",
             "--filter-platform", args.target, "--manifest-path", str(ROOT / "Cargo.toml")],
            check=True, capture_output=True, text=True).stdout
    except subprocess.CalledProcessError as e:
        die(f"cargo metadata failed: {e.stderr.strip()}")
    root, packages, rels = crate_packages(json.loads(meta), lock_checksums(ROOT / "Cargo.lock"))
    version = next(p["versionInfo"] for p in packages if p["SPDXID"] == root)
    write(document(f"{CRATE}-{version}-crate-{args.target}", root, packages, rels), args.out)


def cmd_image(args):
    crate = json.loads(Path(args.crate_sbom).read_text())
    crate_root = next(r["relatedSpdxElement"] for r in crate["relationships"]
                      if r["spdxElementId"] == "SPDXRef-DOCUMENT" and r["relationshipType"] == "DESCRIBES")
    binary = Path(args.binary).read_bytes()
    image_id = spdx_id("image", args.arch)
    repo, _, tag = args.name.rpartition(":")
    if not repo:
        die(f"--name must be REPO:TAG, not {args.name}")
    packages = [{
        "name": repo.rsplit("/", 1)[-1], "SPDXID": image_id, "versionInfo": tag,
        "primaryPackagePurpose": "CONTAINER", "downloadLocation": "NOASSERTION",
        "filesAnalyzed": False, "licenseConcluded": "NOASSERTION",
        "licenseDeclared": "NOASSERTION", "copyrightText": "NOASSERTION",
        "comment": f"the {args.arch} image scripts/image.sh builds; its files' licences are "
                   "under /usr/share/doc/*/copyright in the image",
    }, {
        "name": "/usr/local/bin/ca-asg-provider", "SPDXID": spdx_id("binary", args.arch),
        "versionInfo": next(p["versionInfo"] for p in crate["packages"] if p["SPDXID"] == crate_root),
        "primaryPackagePurpose": "APPLICATION", "downloadLocation": "NOASSERTION",
        "filesAnalyzed": False, "licenseConcluded": "NOASSERTION",
        "licenseDeclared": "Apache-2.0", "copyrightText": "NOASSERTION",
        "checksums": [{"algorithm": "SHA256", "checksumValue": hashlib.sha256(binary).hexdigest()}],
    }]
    rels = [{"spdxElementId": image_id, "relationshipType": "CONTAINS",
             "relatedSpdxElement": spdx_id("binary", args.arch)},
            {"spdxElementId": spdx_id("binary", args.arch), "relationshipType": "GENERATED_FROM",
             "relatedSpdxElement": crate_root}]
    debs = 0
    for line in Path(args.packages).read_text().splitlines():
        if not line.strip():
            continue
        fields = line.split()
        if len(fields) != 5 or not re.fullmatch(r"[0-9a-f]{64}", fields[3]):
            die(f"{args.packages}: expected 'name version arch sha256 url', got {line!r}")
        name, version, arch, sha, url = fields
        pid = spdx_id("deb", name, arch)
        packages.append({
            "name": name, "SPDXID": pid, "versionInfo": version, "downloadLocation": url,
            "filesAnalyzed": False, "licenseConcluded": "NOASSERTION",
            "licenseDeclared": "NOASSERTION", "copyrightText": "NOASSERTION",
            "comment": "Debian's copyright file in the image: /usr/share/doc/"
                       f"{'libgcc-s1' if name == 'gcc-12-base' else name}/copyright",
            "checksums": [{"algorithm": "SHA256", "checksumValue": sha}],
            "externalRefs": [{"referenceCategory": "PACKAGE-MANAGER", "referenceType": "purl",
                              "referenceLocator": f"pkg:deb/debian/{name}@{version}?arch={arch}&distro=debian-12"}],
        })
        rels.append({"spdxElementId": image_id, "relationshipType": "CONTAINS", "relatedSpdxElement": pid})
        debs += 1
    if debs == 0:
        die(f"{args.packages} lists no Debian package")
    packages += crate["packages"]
    rels += [r for r in crate["relationships"] if r["spdxElementId"] != "SPDXRef-DOCUMENT"]
    write(document(f"{repo.rsplit('/', 1)[-1]}-{tag}-image-{args.arch}", image_id, packages, rels),
          args.out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("crate")
    c.add_argument("--target", required=True)
    c.add_argument("--out", required=True)
    i = sub.add_parser("image")
    for a in ("--arch", "--binary", "--crate-sbom", "--packages", "--name", "--out"):
        i.add_argument(a, required=True)
    args = ap.parse_args()
    {"crate": cmd_crate, "image": cmd_image}[args.cmd](args)


if __name__ == "__main__":
    main()

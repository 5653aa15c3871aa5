#!/usr/bin/env python3
"""deploy/chart/README.md's values table against values.yaml, parsed here independently of
scripts/chart_readme.py: every key path of the parsed values (recursively, maps, lists,
empty maps and nulls alike) has exactly one row, no row names a key values.yaml neither sets
nor leaves commented out, and pinned rows carry the comment written directly above their
key (the ones the generator once got wrong: config.scaleIn, envFrom, image).
Run by tests/deploy/validate.py; exits 1 on a failure."""

import pathlib
import re
import sys

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy/chart"
ROW = re.compile(r"^\| `([^`]+)` \| (.*?) \| (.*) \|$")


def key_paths(node, path=()):
    for k, v in node.items():
        yield path + (str(k),)
        if isinstance(v, dict):
            yield from key_paths(v, path + (str(k),))


def comment_above(lines, path):
    """The comment lines directly above the block key `path` (same indentation), joined."""
    depth, want, indent = 0, path, 0
    for n, line in enumerate(lines):
        if line.strip().startswith("#") or not line.strip():
            continue
        ind = len(line) - len(line.lstrip())
        if ind == indent and line.strip().startswith(f"{want[depth]}:"):
            if depth == len(want) - 1:
                out, i = [], n - 1
                while i >= 0 and lines[i].strip().startswith("#") and \
                        len(lines[i]) - len(lines[i].lstrip()) == ind:
                    out.insert(0, lines[i].strip()[1:].strip())
                    i -= 1
                return " ".join(out)
            depth += 1
            indent = len(lines[n + 1]) - len(lines[n + 1].lstrip())
    raise KeyError(path)


def main():
    text = (CHART / "values.yaml").read_text()
    values = yaml.safe_load(text)
    readme = (CHART / "README.md").read_text()
    rows = {}
    errors = []
    for line in readme.splitlines():
        m = ROW.match(line)
        if m and m.group(1) != "Key":
            rows.setdefault(m.group(1), []).append((m.group(2), m.group(3).replace("\\|", "|")))
    paths = [".".join(p) for p in key_paths(values)]
    for p in paths:
        n = len(rows.get(p, []))
        if n != 1:
            errors.append(f"{p}: {n} rows in README.md, want 1")
    commented = {k for k, r in rows.items() if k not in paths}
    for k in commented:
        parent, _, leaf = k.rpartition(".")
        if not all(d.startswith("unset (") for d, _ in rows[k]) or \
                not re.search(rf"^\s*#\s*{re.escape(leaf)}:", text, re.M):
            errors.append(f"{k}: a row for a key values.yaml neither sets nor leaves commented out")
    lines = text.splitlines()
    pinned = {
        ("config", "scaleIn"): "The drain behind CA's DeleteNodes (docs/configuration.md, scaleIn).",
        ("envFrom",): "The provider container's envFrom, e.g. [{configMapRef: {name: proxy-settings}}].",
        ("image",): "The provider's image (standalone and bundled mode).",
    }
    for path, want in pinned.items():
        got = comment_above(lines, path)
        if got != want:
            errors.append(f"{'.'.join(path)}: values.yaml's comment above it is {got!r}, pinned {want!r}")
    for path in [p for p in key_paths(values)]:
        try:
            above = comment_above(lines, path)
        except (KeyError, IndexError):
            continue  # a key inside a flow map: no comment line of its own
        key = ".".join(path)
        if len(rows.get(key, [])) == 1 and not rows[key][0][1].startswith(above):
            errors.append(f"{key}: row says {rows[key][0][1]!r}, the comment above the key is {above!r}")
    for sub in ("scaleIn", "aws", "nodeGroups", "autoDiscovery"):
        if f"config.{sub}" not in rows:
            errors.append(f"config.{sub}: no row")
    for e in errors:
        print(f"FAIL deploy/chart/README.md: {e}")
    if not errors:
        print(f"ok   deploy/chart/README.md: each of values.yaml's {len(paths)} keys has one row, "
              f"{len(commented)} commented-out keys too, each row's description is the comment above its key")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""deploy/chart/README.md's values table against values.yaml, parsed here independently of
scripts/chart_readme.py. Promise: every key of values.yaml is in the README, once, with its
own default and its own comment, and nothing else is:

- every key path of the parsed values (recursively: maps, lists, empty maps and nulls alike)
  has exactly one row; its Default cell is that value (blank for a map with keys of its
  own); its Description is exactly the comment written directly above the key (same
  indentation, no blank line between) and its inline comment, and empty when it has
  neither (a key inside a flow map has no line of its own);
- every key values.yaml leaves commented out (`# key: value` inside a map, `key` a property
  values.schema.json allows there and the map does not set) has exactly one row, Default
  `unset (value)` and its inline comment as Description; no other row exists;
- the commented-out `config.scaleIn` values, which values.yaml calls the program's
  defaults, are docs/configuration.md's;
- the intro names exactly the keys examples/quickstart-values.yaml sets.

The checks are self-tested: the generator's old mistakes (config.scaleIn with the
autoDiscovery example, a neighbour's comment on a key without one, a scaleIn default
missing, a wrong default, a key the example file does not set) must each fail.
Run by tests/deploy/validate.py (scripts/test.sh); exits 1 on a failure."""

import json
import pathlib
import re
import sys

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy/chart"
ROW = re.compile(r"^\| `([^`]+)` \| (.*?) \| (.*?) ?\|$")
BLOCK_KEY = re.compile(r"^( *)([A-Za-z0-9_.\-/*]+|\"[^\"]*\"|'[^']*'):(?:\s|$)")
COMMENTED_KEY = re.compile(r"^( *)# ([A-Za-z0-9_]+):\s+(.*)$")
INLINE = re.compile(r"\s#\s?(.*)$")
# docs/configuration.md shows an example where the program's default is "none".
DOCS_EXAMPLE_NOT_DEFAULT = {"nodeCriticalDaemonSets": []}


def key_paths(node, path=()):
    for k, v in node.items():
        yield path + (str(k),)
        if isinstance(v, dict):
            yield from key_paths(v, path + (str(k),))


def get(values, path):
    node = values
    for k in path:
        if not isinstance(node, dict) or k not in node:
            return None
        node = node[k]
    return node


def schema_allows(schema, parent, key):
    node = schema
    for k in parent:
        node = (node.get("properties") or {}).get(k)
        if not isinstance(node, dict):
            return False
    return key in (node.get("properties") or {})


def inline_comment(rest):
    m = INLINE.search(rest)
    return m.group(1).strip() if m else ""


def expected(values_text, values, schema):
    """What the README must say: {path: (kind, value, description)}, kind "set" (value: the
    parsed value) or "unset" (value: the commented-out value text)."""
    lines = values_text.splitlines()
    want, stack = {}, []  # stack: [(indent, key)] of the block keys enclosing a line
    commented_at = set()
    for n, line in enumerate(lines):
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        c = COMMENTED_KEY.match(line)
        if c:
            parent = tuple(k for i, k in stack if i < indent)
            node = get(values, parent) if parent else values
            if isinstance(node, dict) and c.group(2) not in node and \
                    (not parent or indent > [i for i, _ in stack if i < indent][-1]) and \
                    schema_allows(schema, parent, c.group(2)):
                value = INLINE.split(c.group(3))[0].strip() if INLINE.search(c.group(3)) else c.group(3).strip()
                want[parent + (c.group(2),)] = ("unset", value, inline_comment(c.group(3)))
                commented_at.add(n)
            continue
        m = BLOCK_KEY.match(line)
        if not m or line.lstrip().startswith("#"):
            continue
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, m.group(2).strip("\"'")))
        path = tuple(k for _, k in stack)
        above, i = [], n - 1
        # Comment lines directly above; a commented-out key or list item (`# - ...`, an
        # example of the key above) ends them.
        while i >= 0 and lines[i].strip().startswith("#") and i not in commented_at \
                and not lines[i].strip()[1:].strip().startswith("- ") \
                and len(lines[i]) - len(lines[i].lstrip()) == indent:
            above.insert(0, lines[i].strip()[1:].strip())
            i -= 1
        doc = " ".join(above + [inline_comment(line[m.end() - 1:])]).strip()
        want[path] = ("set", get(values, path), doc)
    for path in key_paths(values):
        if path not in want:  # inside a flow map: no line, no comment of its own
            want[path] = ("set", get(values, path), "")
    return want


def table(readme):
    rows = {}
    for line in readme.splitlines():
        m = ROW.match(line)
        if m and m.group(1) != "Key":
            rows.setdefault(m.group(1), []).append((m.group(2), m.group(3).replace("\\|", "|")))
    return rows


def default_errors(key, kind, value, cell):
    if kind == "unset":
        m = re.fullmatch(r"unset \(`(.*)`\)", cell)
        if not m or yaml.safe_load(m.group(1)) != yaml.safe_load(value):
            return [f"{key}: Default {cell!r}, values.yaml leaves `{value}` commented out"]
        return []
    if isinstance(value, dict) and value:
        return [] if cell == "" else [f"{key}: Default {cell!r} for a map of keys (blank expected)"]
    m = re.fullmatch(r"`(.*)`", cell)
    try:
        ok = m is not None and json.loads(m.group(1)) == value
    except ValueError:
        ok = False
    return [] if ok else [f"{key}: Default {cell!r}, values.yaml's is {json.dumps(value)}"]


def readme_errors(values_text, readme, schema):
    values = yaml.safe_load(values_text)
    want = expected(values_text, values, schema)
    rows = table(readme)
    errors = []
    for path, (kind, value, doc) in want.items():
        key = ".".join(path)
        got = rows.get(key, [])
        if len(got) != 1:
            errors.append(f"{key}: {len(got)} rows in README.md, want 1")
            continue
        cell, desc = got[0]
        errors += default_errors(key, kind, value, cell)
        if desc != doc:
            errors.append(f"{key}: Description {desc!r}, values.yaml's comment for it is {doc!r}")
    keys = {".".join(p) for p in want}
    errors += [f"{k}: a row for a key values.yaml neither sets nor leaves commented out"
               for k in rows if k not in keys]
    return errors, want


def intro_errors(readme, example):
    """The intro's "it sets ..." names exactly the keys of examples/quickstart-values.yaml."""
    m = re.search(r"`examples/quickstart-values\.yaml`.*?it sets(.*?)\n\n", readme, re.S)
    if not m:
        return ["the intro does not say which keys examples/quickstart-values.yaml sets"]
    named = {}
    for tok in re.findall(r"`([^`]+)`", m.group(1)):
        key, _, value = tok.partition(": ")
        named[key] = value
    leaves = {}

    def walk(node, path):
        for k, v in node.items():
            if isinstance(v, dict) and v:
                walk(v, path + (k,))
            else:
                leaves[".".join(path + (k,))] = v

    walk(example, ())
    errs = [f"the intro names `{k}`, which examples/quickstart-values.yaml does not set"
            for k in named if k not in leaves]
    errs += [f"the intro does not name `{k}`, which examples/quickstart-values.yaml sets"
             for k in leaves if k not in named]
    errs += [f"the intro says `{k}: {v}`, examples/quickstart-values.yaml sets {leaves[k]!r}"
             for k, v in named.items() if v and k in leaves and yaml.safe_load(v) != leaves[k]]
    return errs


def program_default_errors(want):
    """values.yaml's commented-out config.scaleIn values are "the program's default": the
    same as docs/configuration.md's reference."""
    text = (ROOT / "docs/configuration.md").read_text()
    ref = yaml.safe_load(re.search(r"```yaml\n(.*?)```", text, re.S).group(1))["scaleIn"]
    errs = []
    for path, (kind, value, _) in want.items():
        if kind == "unset" and path[:2] == ("config", "scaleIn") and len(path) == 3:
            doc = DOCS_EXAMPLE_NOT_DEFAULT.get(path[2], ref.get(path[2], "<absent>"))
            if yaml.safe_load(value) != doc:
                errs.append(f"{'.'.join(path)}: values.yaml says the program's default is {value}, "
                            f"docs/configuration.md says {doc!r}")
    return errs


def swap_cell(readme, key, col, new):
    """README text with `key`'s column `col` (1 Default, 2 Description) replaced."""
    out = []
    for line in readme.splitlines():
        m = ROW.match(line)
        if m and m.group(1) == key:
            cells = [m.group(1), m.group(2), m.group(3)]
            cells[col] = new
            line = f"| `{cells[0]}` | {cells[1]} | {cells[2]} |"
        out.append(line)
    return "\n".join(out) + "\n"


def selftest(values_text, readme, schema, example):
    """Each of the mistakes this test is for must fail it, naming the key."""
    rows = table(readme)
    desc = lambda k: rows[k][0][1]
    mutants = {
        "config.scaleIn": swap_cell(readme, "config.scaleIn", 2, desc("config.autoDiscovery")),
        "image.pullPolicy": swap_cell(readme, "image.pullPolicy", 2, desc("image")),
        "config.scaleIn.apiQps": "".join(l + "\n" for l in readme.splitlines()
                                         if not l.startswith("| `config.scaleIn.apiQps`")),
        "replicas": swap_cell(readme, "replicas", 1, "`1`"),
        "config.scaleIn.mode": swap_cell(readme, "config.scaleIn.mode", 2, ""),
    }
    errs = []
    for key, text in mutants.items():
        if text == readme:
            errs.append(f"self-test: the mutation of {key} changed nothing")
            continue
        found, _ = readme_errors(values_text, text, schema)
        if not any(e.startswith(f"{key}:") for e in found):
            errs.append(f"self-test: a README with {key} wrong passed ({found[:2]})")
    if not intro_errors(readme, {**example, "dryRun": True}):
        errs.append("self-test: an example file that sets dryRun passed the intro check")
    return errs


def main():
    values_text = (CHART / "values.yaml").read_text()
    readme = (CHART / "README.md").read_text()
    schema = json.loads((CHART / "values.schema.json").read_text())
    example = yaml.safe_load((CHART / "examples/quickstart-values.yaml").read_text())
    errors, want = readme_errors(values_text, readme, schema)
    errors += intro_errors(readme, example)
    errors += program_default_errors(want)
    if not errors:  # the mutations start from a README that passes
        errors += selftest(values_text, readme, schema, example)
    for e in errors:
        print(f"FAIL deploy/chart/README.md: {e}")
    if errors:
        return 1
    unset = sum(1 for k, _, _ in want.values() if k == "unset")
    documented = sum(1 for _, _, d in want.values() if d)
    print(f"ok   deploy/chart/README.md: each of values.yaml's {len(want) - unset} keys and {unset} commented-out "
          f"keys has one row with its default and its own comment ({documented} with a comment, the rest "
          f"blank); the intro names the quickstart file's keys; 5 planted README mistakes and an example key it does not name each fail the check")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""docs/architecture.md stays true to the tree.

- Every `src/...` path the page names exists (a file, or a folder when it ends in /).
- Every step of a walk (a numbered item under a `## Walk` heading) names exactly one
  `src/....rs` file, and each function it names as `name()` or `Type::name()` is
  defined in that file (`fn name`).
- Every module of tests/layers.rs's LAYERS has a row in the page's layer table
  (`| rank | `src/module/` | rule |`) with the rank LAYERS gives it.
- Every sub-folder of src/scalein is named as `src/scalein/<folder>/`, and every room
  of tests/layers.rs's SCALEIN_ROOMS (when it has one) as `src/scalein/<room>/` or
  `src/scalein/<room>.rs`.

Self-tested: each check must fail on the page with one fact made wrong (a path, a
function, a rank, a row, a room). Usage: architecture.py [PAGE] (default
docs/architecture.md; paths are read from the repository root whatever the page). Exit 1
listing every problem, 0 when all hold.
"""

import re
import sys
import tempfile
from pathlib import Path

from links import lines_outside_code as page_lines  # one reader of a page outside its code blocks

ROOT = Path(__file__).resolve().parents[2]

PATH = re.compile(r"(?<![\w/.])src/[A-Za-z0-9_./-]*[A-Za-z0-9_/]")
FUNCTION = re.compile(r"`(?:[A-Za-z_]\w*::)*([A-Za-z_]\w*)\(\)`")
STEP = re.compile(r"^(\d+)\.\s+(.*)$")
LAYER = re.compile(r'\(\s*"(\w+)"\s*,\s*(\d+)\s*\)')
ROW = re.compile(r"^\|\s*(\d+)\s*\|([^|]*)\|")


def walk_steps(lines):
    """(line number, text) of each numbered step under a `## Walk` heading; an item's
    indented continuation lines are part of its text."""
    steps, in_walk = [], False
    for n, line in lines:
        if line.startswith("#"):
            in_walk = re.match(r"^##\s+Walk\b", line) is not None
            continue
        if not in_walk:
            continue
        m = STEP.match(line)
        if m:
            steps.append([n, m.group(2)])
        elif steps and line.startswith((" ", "\t")) and line.strip():
            steps[-1][1] += " " + line.strip()
    return steps


def layers():
    """LAYERS of tests/layers.rs: module -> rank."""
    text = (ROOT / "tests" / "layers.rs").read_text()
    block = re.search(r"const LAYERS[^=]*=\s*&\[(.*?)\];", text, re.S)
    if not block:
        raise SystemExit("tests/layers.rs: no LAYERS table found")
    return {m: int(r) for m, r in LAYER.findall(block.group(1))}


def scalein_rooms():
    """The rooms of SCALEIN_ROOMS in tests/layers.rs (none when it has no such table)."""
    text = (ROOT / "tests" / "layers.rs").read_text()
    block = re.search(r"const SCALEIN_ROOMS[^=]*=\s*&\[(.*?)\n\];", text, re.S)
    return re.findall(r'^\s*\(\s*"(\w+)"', block.group(1), re.M) if block else []


def check(page):
    lines = list(page_lines(page))
    wrong = []
    named = set()
    for n, line in lines:
        for p in PATH.findall(line):
            p = p.rstrip(".")
            named.add(p)
            target = ROOT / p
            if p.endswith("/") and not target.is_dir():
                wrong.append(f"{page.name}:{n}: {p} is not a folder")
            elif not target.exists():
                wrong.append(f"{page.name}:{n}: {p} does not exist")

    steps = walk_steps(lines)
    if not steps:
        wrong.append(f"{page.name}: no walk steps found (numbered items under '## Walk ...')")
    functions = 0
    for n, text in steps:
        files = sorted({p.rstrip(".") for p in PATH.findall(text) if p.rstrip(".").endswith(".rs")})
        names = FUNCTION.findall(text)
        if len(files) != 1:
            wrong.append(f"{page.name}:{n}: a step names one src/*.rs file, this one {len(files)}: {files}")
            continue
        if not names:
            wrong.append(f"{page.name}:{n}: the step names no function as `name()`")
            continue
        source = ROOT / files[0]
        if not source.is_file():
            continue  # reported above
        code = source.read_text(encoding="utf-8")
        for name in names:
            functions += 1
            if not re.search(rf"\bfn\s+{re.escape(name)}\b", code):
                wrong.append(f"{page.name}:{n}: no `fn {name}` in {files[0]}")

    ranks = {}
    for n, line in lines:
        m = ROW.match(line)
        if not m:
            continue
        for p in PATH.findall(m.group(2)):
            module = re.match(r"src/(\w+)", p).group(1)
            ranks[module] = (int(m.group(1)), n)
    for module, rank in layers().items():
        if module not in ranks:
            wrong.append(f"{page.name}: layer `{module}` (rank {rank} in tests/layers.rs) has no row in the layer table")
        elif ranks[module][0] != rank:
            wrong.append(
                f"{page.name}:{ranks[module][1]}: `{module}` is rank {ranks[module][0]} here, {rank} in tests/layers.rs"
            )

    rooms = sorted(d.name for d in (ROOT / "src" / "scalein").iterdir() if d.is_dir())
    for room in rooms:
        if f"src/scalein/{room}/" not in named:
            wrong.append(f"{page.name}: src/scalein/{room}/ is not described")
    for room in scalein_rooms():
        if not {f"src/scalein/{room}/", f"src/scalein/{room}.rs"} & named:
            wrong.append(f"{page.name}: room `{room}` of SCALEIN_ROOMS in tests/layers.rs is not described")
    return wrong, len(named), len(steps), functions, len(rooms)


# (what is made wrong, the text, its wrong version, what the check must then say)
SEEDED = [
    ("path", "`src/grpc/service.rs`", "`src/grpc/servce.rs`", "src/grpc/servce.rs does not exist"),
    ("folder", "`src/cloud/`", "`src/cloud.rs/`", "src/cloud.rs/ is not a folder"),
    ("function", "`node_group_delete_nodes()`", "`node_group_delete_node()`", "no `fn node_group_delete_node` in"),
    ("step file", "in `src/provider/delete.rs` joins", "joins", "a step names one src/*.rs file"),
    ("rank", "| 8 | `src/commands/`", "| 6 | `src/commands/`", "`commands` is rank 6 here, 8 in tests/layers.rs"),
    ("row", "| 3 | `src/sim/`", "| 3 | the simulator", "layer `sim` (rank 3 in tests/layers.rs) has no row"),
    ("room", "`src/scalein/kube/`", "`src/scalein/kube`", "src/scalein/kube/ is not described"),
]


def selftest(page):
    """Each check fails on the page with one fact made wrong."""
    text = page.read_text(encoding="utf-8")
    errs = []
    for what, right, wrong, said in SEEDED:
        if right not in text:
            errs.append(f"self-test: the {what} case looks for {right!r}, no longer on the page: update SEEDED")
            continue
        with tempfile.TemporaryDirectory() as d:
            bad = Path(d) / page.name
            bad.write_text(text.replace(right, wrong, 1), encoding="utf-8")
            found = check(bad)[0]
        if not any(said in e for e in found):
            errs.append(f"self-test: the {what} check passed a page with {wrong!r} ({found})")
    return errs


def main():
    page = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "architecture.md"
    wrong, paths, steps, functions, rooms = check(page)
    if len(sys.argv) == 1 and not wrong:
        wrong = selftest(page)
    if wrong:
        print("\n".join(wrong))
        return 1
    print(
        f"{page.name}: {paths} paths exist, {functions} functions of {steps} walk steps found, "
        f"every layer and {rooms} scalein rooms described"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

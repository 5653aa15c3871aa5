#!/usr/bin/env python3
"""Every file a document includes is shown there exactly as it is in the repository.

In README.md and docs/**/*.md, a line `<!-- include: PATH -->` (PATH relative to the
repository's top) must be followed (blank lines allowed between) by a fenced code block
whose text is the file's text, byte for byte (its last newline aside). So the page cannot
drift from the scripts the tests run (deploy/quickstart/*.sh, run by
tests/e2e_install.rs): an edit of either without the other fails here.

`--fix` rewrites each such block from its file instead (what to run after editing a
script). A self-test first checks that a drifted block, a missing file and a marker
without a block fail.

Exit 1 listing every mismatch (file:line: PATH: why, with the first differing line), 0
when every included block matches.
"""

import difflib
import pathlib
import re
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[2]
MARKER = re.compile(r"^<!--\s*include:\s*(\S+)\s*-->\s*$")
FENCE = re.compile(r"^(```+|~~~+)(\w*)\s*$")


def includes(lines):
    """(marker line index, path, fence open index, fence close index or None) of every
    include marker of a document's lines."""
    out = []
    for i, line in enumerate(lines):
        m = MARKER.match(line)
        if not m:
            continue
        j = i + 1
        while j < len(lines) and not lines[j].strip():
            j += 1
        f = FENCE.match(lines[j]) if j < len(lines) else None
        if not f:
            out.append((i, m.group(1), None, None))
            continue
        close = next((k for k in range(j + 1, len(lines)) if lines[k].strip() == f.group(1)), None)
        out.append((i, m.group(1), j, close))
    return out


def check(md, root, fix=False):
    """What is wrong with one document's included blocks; with fix, rewrites them."""
    rel = md.relative_to(root).as_posix()
    lines = md.read_text(encoding="utf-8").split("\n")
    errs = []
    for i, path, open_, close in reversed(includes(lines)):
        where = f"{rel}:{i + 1}: {path}"
        src = root / path
        if not src.is_file():
            errs.append(f"{where}: no such file")
            continue
        want = src.read_text(encoding="utf-8").rstrip("\n").split("\n")
        if open_ is None or close is None:
            errs.append(f"{where}: the marker is not followed by a fenced code block")
            continue
        have = lines[open_ + 1:close]
        if have == want:
            continue
        if fix:
            lines[open_ + 1:close] = want
            continue
        diff = [d for d in difflib.unified_diff(want, have, "the file", "the page", n=0, lineterm="")
                if not d.startswith(("---", "+++"))]
        errs.append(f"{where}: the block differs from the file ({len(have)} lines, the file {len(want)}): "
                    + " | ".join(diff[:4]))
    if fix:
        md.write_text("\n".join(lines), encoding="utf-8")
    return errs


def self_test():
    with tempfile.TemporaryDirectory() as tmp:
        root = pathlib.Path(tmp)
        (root / "s.sh").write_text("#!/bin/sh\necho one\n")
        md = root / "p.md"
        cases = {
            "matches": ("<!-- include: s.sh -->\n```sh\n#!/bin/sh\necho one\n```\n", None),
            "drifted": ("<!-- include: s.sh -->\n\n```sh\n#!/bin/sh\necho two\n```\n", "differs"),
            "missing": ("<!-- include: t.sh -->\n```sh\n```\n", "no such file"),
            "no block": ("<!-- include: s.sh -->\ntext\n", "not followed"),
        }
        for name, (text, want) in cases.items():
            md.write_text(text)
            errs = check(md, root)
            if want is None:
                assert not errs, f"self-test {name!r}: {errs}"
            else:
                assert any(want in e for e in errs), f"self-test {name!r}: expected {want!r}, got {errs}"
        md.write_text(cases["drifted"][0])
        check(md, root, fix=True)
        assert not check(md, root), "self-test: --fix did not make the block the file's"


def main():
    self_test()
    fix = "--fix" in sys.argv[1:]
    files = [ROOT / "README.md"] + sorted((ROOT / "docs").rglob("*.md"))
    errs, n = [], 0
    for md in files:
        n += len(includes(md.read_text(encoding="utf-8").split("\n")))
        errs += check(md, ROOT, fix)
    if errs:
        print(f"includes.py: {len(errs)} failure(s) (tests/docs/includes.py --fix rewrites the blocks):")
        for e in errs:
            print(f"  {e}")
        return 1
    print(f"ok   {n} included file(s) in README.md and docs/ shown as they are{' (rewritten)' if fix else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

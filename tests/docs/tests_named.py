#!/usr/bin/env python3
"""Every test README.md and docs/ name as proof is a test that exists.

A `file::function` in backticks whose `file` is an integration test (tests/file.rs,
or the load generator's loadgen/tests/file.rs) must name a function defined in that file, so a renamed or moved test cannot stay
cited as the proof of a behaviour. Exit 1 listing every stale name (where it is cited),
0 when all are found.
"""

import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def cited(text):
    """(file, function) of every `file::function` a text names."""
    return re.findall(r"`([a-z0-9_]+)::([a-z0-9_]+)`", text)


def main():
    tests = [*(ROOT / "tests").glob("*.rs"), *(ROOT / "loadgen" / "tests").glob("*.rs")]
    files = {p.stem: p for p in tests}
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    stale, checked = [], 0
    for page in pages:
        for stem, function in cited(page.read_text()):
            if stem not in files:
                continue
            checked += 1
            if not re.search(rf"\bfn {function}\b", files[stem].read_text()):
                stale.append(f"{page.relative_to(ROOT)}: {stem}::{function} is not a test in {files[stem].relative_to(ROOT)}")
    if stale:
        print("\n".join(stale))
        return 1
    print(f"{checked} tests named in the docs, all found")
    return 0


if __name__ == "__main__":
    sys.exit(main())

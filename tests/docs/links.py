#!/usr/bin/env python3
"""Every relative link and anchor in README.md and docs/ resolves.

For each Markdown file (README.md, docs/**/*.md) every inline link `[text](target)` and
image `![alt](target)` outside fenced code blocks and code spans is checked, unless its
target is absolute (a scheme such as https: or mailto:):
  - `#anchor` must be a heading anchor of the same file;
  - `path` must exist, relative to the file (a directory is fine);
  - `path#anchor` into a Markdown file must be one of that file's heading anchors.
Anchors are GitHub's: the heading's text (links reduced to their text) in lower case,
every character that is not a letter, digit, underscore, hyphen or space removed,
each space turned into a hyphen; a repeated anchor gets -1, -2, ... in order. Explicit
`<a name="...">` / `id="..."` anchors count too.

Exits 1 listing every broken link (file:line: target: why), 0 when all resolve.
"""

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

FENCE = re.compile(r"^\s{0,3}(```|~~~)")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")
# [text](target) or ![alt](target); text may hold one level of brackets; target up to
# the first space (an optional "title" follows) or the closing parenthesis.
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
HTML_ANCHOR = re.compile(r"<a\s+[^>]*(?:name|id)=\"([^\"]+)\"", re.I)
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def slug(text):
    """GitHub's anchor for a heading's text."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # links -> their text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML tags
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def lines_outside_code(path):
    """(line number, line) of every line outside fenced code blocks."""
    fence = None
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        m = FENCE.match(line)
        if m:
            if fence is None:
                fence = m.group(1)
            elif line.strip().startswith(fence):
                fence = None
            continue
        if fence is None:
            yield n, line


_anchors = {}


def anchors(path):
    """The anchors a Markdown file defines."""
    path = path.resolve()
    if path not in _anchors:
        seen, out = {}, set()
        for _, line in lines_outside_code(path):
            m = HEADING.match(line)
            if m:
                base = slug(m.group(2))
                k = seen.get(base, 0)
                seen[base] = k + 1
                out.add(base if k == 0 else f"{base}-{k}")
            out.update(HTML_ANCHOR.findall(line))
        _anchors[path] = out
    return _anchors[path]


def check(path):
    errs = []
    rel = path.relative_to(ROOT)
    for n, line in lines_outside_code(path):
        for target in LINK.findall(CODE_SPAN.sub("", line)):
            if not target or SCHEME.match(target) or target.startswith("//"):
                continue
            file_part, _, anchor = target.partition("#")
            dest = (path.parent / file_part).resolve() if file_part else path.resolve()
            where = f"{rel}:{n}: {target}"
            if file_part and not dest.exists():
                errs.append(f"{where}: no such file {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest}")
                continue
            if anchor:
                if dest.is_dir() or dest.suffix.lower() != ".md":
                    errs.append(f"{where}: an anchor into a file that is not Markdown")
                elif anchor not in anchors(dest):
                    errs.append(f"{where}: no heading with anchor #{anchor} in {dest.relative_to(ROOT)}")
    return errs


def self_test():
    """The anchor rules on known headings, so a change to slug() cannot pass silently."""
    cases = {
        "A staged rollout: `serve --dry-run`": "a-staged-rollout-serve---dry-run",
        "Queue mode: spot interruptions, rebalance recommendations, scheduled changes":
            "queue-mode-spot-interruptions-rebalance-recommendations-scheduled-changes",
        "One node's drain against its floor (`loadgen --drain-floor RUNS`)":
            "one-nodes-drain-against-its-floor-loadgen---drain-floor-runs",
        "CaAsgProviderDown": "caasgproviderdown",
        "See [the chart](deploy/chart/README.md) now": "see-the-chart-now",
        "snake_case and 1.2": "snake_case-and-12",
    }
    for text, want in cases.items():
        assert slug(text) == want, (text, slug(text), want)


def main():
    files = [ROOT / "README.md"] + sorted((ROOT / "docs").rglob("*.md"))
    self_test()
    errs = []
    for f in files:
        errs += check(f)
    if errs:
        print(f"links.py: {len(errs)} broken relative link(s) or anchor(s):")
        for e in errs:
            print(f"  {e}")
        return 1
    print(f"ok   every relative link and anchor in README.md and docs/ resolves ({len(files)} files)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

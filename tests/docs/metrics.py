#!/usr/bin/env python3
"""Every metric README.md and docs/ name is one the code registers.

Each `ca_asg_provider_...` name in the Markdown (prose, tables and command blocks alike)
must be a series src/telemetry/metrics.rs exposes (as tests/deploy/validate.py reads it:
`_total` for counters, `_bucket`/`_sum`/`_count` for histograms, whose base name counts
too), and each label it is shown with (`{outcome="failed"}`, `{node_group}`) one of that
metric's labels. Brace lists expand (`..._node_group_{min,max,target}_size`), and so does
a grep alternation (`ca_asg_provider_(node_groups|leader)`), so a renamed metric cannot
stay in the docs. Exit 1 listing every unknown name or label, 0 when all are known.
"""

import importlib.util
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def load_validate():
    spec = importlib.util.spec_from_file_location("validate", ROOT / "tests/deploy/validate.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def mentions(text, prefix):
    """(name, label names) of every metric a text names."""
    out = []
    # grep -E alternations: prefix_(a|b\{x="y"|c)
    # A prefix inside another identifier (`the_process_that_...`) names no metric.
    for group in re.findall(r"(?<![\w])" + prefix + r"_\(([^)]*)\)", text):
        for alt in group.split("|"):
            alt = alt.replace("\\", "")
            m = re.match(r"(\w+)(\{[^}]*)?", alt)
            if m:
                out.append((f"{prefix}_{m.group(1)}", re.findall(r"(\w+)\s*(?:=~|!~|!=|=|,|$)", (m.group(2) or "{")[1:])))
    for name, labels in re.findall(r"(?<![\w])" + prefix + r"_((?:\w|\{[\w,]+\}(?=\w))+)(\{[^}`]*\}?)?", text):
        names = [name]
        while any("{" in n for n in names):  # brace lists: a_{b,c}_d -> a_b_d, a_c_d
            n = next(n for n in names if "{" in n)
            head, alts, tail = re.match(r"(.*?)\{([\w,]+)\}(.*)", n).groups()
            names.remove(n)
            names += [head + a + tail for a in alts.split(",")]
        lbl = re.findall(r"(\w+)\s*(?:=~|!~|!=|=|,|\}|$)", labels[1:]) if labels else []
        out += [(f"{prefix}_{n}", lbl) for n in names]
    return out


def errors(files, prefix, series):
    bases = set(series) | {s[: -len("_bucket")] for s in series if s.endswith("_bucket")}
    errs, seen = [], 0
    for f in files:
        rel = f.relative_to(ROOT)
        for n, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1):
            for name, labels in mentions(line, prefix):
                seen += 1
                if name not in bases:
                    errs.append(f"{rel}:{n}: {name}: src/telemetry/metrics.rs registers no such metric")
                    continue
                known = series.get(name) or series.get(name + "_bucket", set()) - {"le"}
                for label in labels:
                    if label not in known:
                        errs.append(f"{rel}:{n}: {name}{{{label}}}: the metric has no label {label!r} "
                                    f"(it has {sorted(known) or 'none'})")
    return errs, seen


def self_test(prefix):
    got = mentions('x `ca_asg_provider_node_group_{min,max,target}_size` y', prefix)
    assert [n for n, _ in got] == [f"{prefix}_node_group_min_size", f"{prefix}_node_group_max_size",
                                   f"{prefix}_node_group_target_size"], got
    got = mentions("grep -E '^ca_asg_provider_(node_groups|grpc_requests_total\\{method=\"Refresh\"|leader)'", prefix)
    assert (f"{prefix}_grpc_requests_total", ["method"]) in got and (f"{prefix}_leader", []) in got, got
    assert mentions("`all_sources_model::the_process_that_acted_is_named`", "process") == [], "inside a word"
    got = mentions('`ca_asg_provider_drains_finished_total{outcome="failed"}` and `ca_asg_provider_x{stage}`', prefix)
    assert got == [(f"{prefix}_drains_finished_total", ["outcome"]), (f"{prefix}_x", ["stage"])], got


def main():
    validate = load_validate()
    prefix, series = validate.rust_metrics()
    self_test(prefix)
    files = [ROOT / "README.md"] + sorted((ROOT / "docs").rglob("*.md"))
    errs, seen = errors(files, prefix, series)
    # The standard process_* names the service exports unprefixed.
    more_errs, more = errors(files, "process", {k: v for k, v in series.items() if k.startswith("process_")})
    errs, seen = errs + more_errs, seen + more
    if errs:
        print(f"metrics.py: {len(errs)} metric name(s) or label(s) in the docs that the code does not have:")
        for e in errs:
            print(f"  {e}")
        return 1
    print(f"ok   every metric README.md and docs/ name ({seen} mentions) is registered, with its labels")
    return 0


if __name__ == "__main__":
    sys.exit(main())

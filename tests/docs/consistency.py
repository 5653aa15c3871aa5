#!/usr/bin/env python3
"""No two documents contradict each other, or the code, on three facts:

1. The default transport of each install mode: the provider's `listen` that the chart
   renders for each mode with its defaults (helm template, deploy/chart/values.yaml and
   templates). A sentence of README.md, docs/helm.md, docs/configuration.md,
   deploy/chart/README.md or NOTES.txt (as `helm install` prints it for the mode) that
   puts sidecar or bundled mode on 127.0.0.1 must say `tcp` when the default is the
   socket, and "`transport: X`, the default" must name the default.
2. Which modes the tests install: the tests of tests/e2e_install.rs, each with the
   `"mode"` it installs (in its body or the helper it calls) and whether it needs
   cluster-autoscaler's binaries (`real_cas`, E2E_CA_BINS, which scripts/test.sh does
   not set, so CI skips it). A sentence of docs/limits.md, docs/helm.md or docs/e2e.md
   that says a mode is not installed by any test must name only modes no test installs.
3. Tool versions: the helm major version scripts/test.sh installs (and .venv/bin/helm
   runs, when present). Every "Helm N" in README.md and docs/ of another major must say
   in its sentence that it is untested.
4. Whether the project has a home: deploy/chart/Chart.yaml's `home` is the one place its
   address is written (tests/deploy/validate.py fails on the address anywhere else). While
   it is a placeholder (an `example` address, which Chart.yaml's comment says), the
   quickstart (docs/quickstart-eks.md) must say plainly that the project has no public
   home yet; once it is a real address, no document may say so.

Self-tested: each check must fail on a known-bad text. Exit 1 listing every
contradiction, 0 when none."""

import pathlib
import re
import subprocess
import sys
import tempfile

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy/chart"
MODES = ("sidecar", "standalone", "bundled")
# What each mode needs to render with its defaults otherwise (the chart refuses placeholders).
REQUIRED = {"clusterName": "consistency", "image": {"repository": "registry.invalid/ca-asg-provider", "tag": "0"}}
TRANSPORT_DOCS = ["README.md", "docs/helm.md", "docs/configuration.md", "deploy/chart/README.md"]
INSTALL_DOCS = ["docs/limits.md", "docs/helm.md", "docs/e2e.md"]


def helm_binary():
    for c in (ROOT / ".venv/bin/helm",):
        if c.exists():
            return str(c)
    return "helm"


def sentences(text):
    """Sentences of a markdown text: paragraphs (and table rows) split after . ; or :"""
    out = []
    for para in re.split(r"\n\s*\n|\n(?=\|)|\n(?=- )|\n(?=\d+\. )", text):
        flat = " ".join(para.split())
        out += [s for s in re.split(r"(?<=[.;])\s+(?=[A-Z`(\[])", flat) if s]
    return out


NO_HOME = re.compile(r"project has no public home yet", re.I)
HOME_DOCS = ["README.md", "docs/quickstart-eks.md", "deploy/chart/README.md"]


# ------------------------------------------------------------ 4. the project's home

def home_is_placeholder(chart_yaml):
    """Whether Chart.yaml's home is a placeholder address (an `example` host or owner)."""
    home = yaml.safe_load(chart_yaml).get("home") or ""
    return bool(re.search(r"(^|[/.])example([/.]|$)", re.sub(r"^https?://", "", home))) or not home


def home_errors(placeholder, docs):
    """docs: {name: text}. The quickstart says there is no home exactly while there is none."""
    errs = []
    says = {name for name, text in docs.items() if NO_HOME.search(" ".join(text.split()))}
    if placeholder and "docs/quickstart-eks.md" not in says:
        errs.append("deploy/chart/Chart.yaml's home is a placeholder, and docs/quickstart-eks.md does not say "
                    "plainly that the project has no public home yet")
    if not placeholder:
        errs += [f"{name} says the project has no public home, but deploy/chart/Chart.yaml's home is a real "
                 "address" for name in sorted(says)]
    return errs


# ------------------------------------------------------------ 1. default transport

def chart_facts():
    """{mode: (provider listen, NOTES text)} from the chart with its defaults."""
    facts, errs = {}, []
    helm = helm_binary()
    with tempfile.TemporaryDirectory() as tmp:
        vf = pathlib.Path(tmp) / "v.yaml"
        for mode in MODES:
            values = dict(REQUIRED, mode=mode)
            if mode == "sidecar":  # the image is CA's chart's there; the chart refuses it
                del values["image"]
            vf.write_text(yaml.safe_dump(values))
            out = subprocess.run([helm, "install", "--dry-run=client", "ca-asg-provider", str(CHART),
                                  "-n", "kube-system", "-f", str(vf)], capture_output=True, text=True)
            if out.returncode != 0:
                errs.append(f"deploy/chart ({mode}): does not render: {out.stderr.strip()[-300:]}")
                continue
            manifest, _, notes = out.stdout.partition("NOTES:")
            listen = None
            for doc in yaml.safe_load_all(manifest.split("MANIFEST:", 1)[-1]):
                if doc and doc.get("kind") == "ConfigMap" and "config.yaml" in (doc.get("data") or {}):
                    listen = (yaml.safe_load(doc["data"]["config.yaml"]) or {}).get("listen")
            if listen is None:
                errs.append(f"deploy/chart ({mode}): no provider config with `listen` in the render")
                continue
            facts[mode] = (listen, notes)
    return facts, errs


def transport_errors(where, text, facts):
    """Sentences of `text` that contradict the modes' default transports."""
    errs = []
    socket_default = [m for m in ("sidecar", "bundled") if m in facts and facts[m][0].startswith("unix://")]
    default = "unix" if socket_default else "tcp"
    for s in sentences(text):
        low = s.lower()
        named = [m for m in socket_default if m in low]
        if named and re.search(r"(?<!//)127\.0\.0\.1", s) and "tcp" not in low:
            errs.append(f"{where}: puts {' and '.join(named)} mode on 127.0.0.1 without `transport: tcp`, "
                        f"but its default is the socket ({facts[named[0]][0]}): {s[:160]!r}")
        for t in re.findall(r"transport: (\w+)`?,? (?:\(?the )?default", s):
            if t != default:
                errs.append(f"{where}: says `transport: {t}` is the default; values.yaml's is {default}: {s[:160]!r}")
    return errs


def notes_errors(facts):
    """NOTES.txt contradicts no mode's default transport, and in bundled mode (where the
    chart runs both containers) names the address its default renders."""
    errs = []
    for mode, (listen, notes) in facts.items():
        if mode == "standalone":
            continue
        if mode == "bundled" and listen not in " ".join(notes.split()):
            errs.append(f"NOTES.txt ({mode}): does not name the provider's address {listen}")
        errs += transport_errors(f"NOTES.txt ({mode})", notes.replace("with ca-asg-provider", f"{mode}: ca-asg-provider"), facts)
    return errs


# ------------------------------------------------------------ 2. modes the tests install

def installed_modes(source, ci_sets_ca_bins):
    """{mode: [(test, in CI)]} from tests/e2e_install.rs: each #[tokio::test] fn, the
    `"mode": "X"` in its body or a helper it calls, and whether it needs CA's binaries."""
    fns = {}
    for m in re.finditer(r"^(?:async )?fn (\w+)\b.*?^\}", source, re.S | re.M):
        fns[m.group(1)] = m.group(0)
    tests = re.findall(r"#\[tokio::test[^\]]*\]\s*(?:async )?fn (\w+)", source)
    out = {}
    for t in tests:
        body = fns.get(t, "")
        called = [fns[c] for c in re.findall(r"\b(\w+)\(", body) if c in fns and c != t]
        modes = set(re.findall(r'"mode":\s*"(\w+)"', body + "".join(called)))
        in_ci = "real_cas(" not in body or ci_sets_ca_bins
        for mode in modes:
            out.setdefault(mode, []).append((t, in_ci))
    return out


def overlays_installed():
    """Whether any Rust test applies the Kustomize overlays (`apply -k`/`kustomize` + overlays/)."""
    for p in (ROOT / "tests").rglob("*.rs"):
        text = p.read_text()
        if "overlays/" in text and re.search(r"\"apply\".*\"-k\"|apply -k", text):
            return True
    return False


NOT_INSTALLED = re.compile(r"not installed by any test|nothing is installed|never installed|no test installs", re.I)


def install_errors(where, text, installed, overlays):
    errs = []
    for s in sentences(text):
        if not NOT_INSTALLED.search(s):
            continue
        low = s.lower()
        # The clause that says "not installed": what it names before that phrase.
        clause = low[:NOT_INSTALLED.search(s).start()]
        clause = re.split(r"(?<=[.;])\s", clause)[-1]
        for mode in MODES:
            if re.search(rf"\b{mode}\b", clause) and mode in installed:
                tests = ", ".join(t for t, _ in installed[mode])
                errs.append(f"{where}: says {mode} mode is not installed by any test; tests/e2e_install.rs "
                            f"installs it ({tests}): {s[:160]!r}")
        if "overlay" in clause and overlays:
            errs.append(f"{where}: says the overlays are not installed by any test, but a test applies them: {s[:160]!r}")
        if re.search(r"nothing is installed", low) and installed:
            errs.append(f"{where}: says nothing is installed by the tests; tests/e2e_install.rs installs "
                        f"{', '.join(sorted(installed))}: {s[:160]!r}")
    return errs


# ------------------------------------------------------------ 3. tool versions

def helm_major():
    """The Helm majors the suite runs: each `helm vN` scripts/test.sh names for a helm it
    installs (.venv/bin/helm's, for every chart test; Helm 3 for the quickstart scripts'
    end-to-end run when it installs one, E2E_HELM3), .venv/bin/helm's among them."""
    text = (ROOT / "scripts/test.sh").read_text()
    found = {int(n) for n in re.findall(r"\bhelm v(\d+)\b", text)}
    errs = []
    if not found or (len(found) > 1 and "E2E_HELM3" not in text):
        return None, [f"scripts/test.sh: expected one `helm vN` naming the helm it installs (two with E2E_HELM3), found {sorted(found)}"]
    helm = ROOT / ".venv/bin/helm"
    if helm.exists():
        out = subprocess.run([str(helm), "version", "--short"], capture_output=True, text=True)
        m = re.match(r"v(\d+)\.", out.stdout.strip())
        if not m or int(m.group(1)) not in found:
            errs.append(f"scripts/test.sh says helm {sorted(found)}, .venv/bin/helm is {out.stdout.strip() or out.stderr.strip()}")
    return found, errs


def helm_version_errors(where, text, majors):
    majors = {majors} if isinstance(majors, int) else set(majors)
    errs = []
    for s in sentences(text):
        for n in re.findall(r"\bHelm v?(\d+)\b", s, re.I):
            if int(n) not in majors and "untested" not in s.lower():
                errs.append(f"{where}: names Helm {n}, but the tests run helm {sorted(majors)} only "
                            f"(say it is untested, or name one of those): {s[:160]!r}")
    return errs


# ------------------------------------------------------------ self-test and main

def selftest():
    facts = {"sidecar": ("unix:///s/grpc.sock", ""), "bundled": ("unix:///s/grpc.sock", ""),
             "standalone": ("0.0.0.0:8086", "")}
    installed = {"standalone": [("a", True)], "sidecar": [("b", False)], "bundled": [("c", False)]}
    bad = [
        ("transport", transport_errors("t", "Bundled mode runs the provider on 127.0.0.1:8086.", facts)),
        ("transport default", transport_errors("t", "The socket (`transport: tcp`, the default).", facts)),
        ("NOTES", notes_errors({"bundled": ("unix:///s/grpc.sock", "beside it on 127.0.0.1:8086")})),
        ("installs", install_errors("t", "Its sidecar and bundled modes and the\noverlays are not installed by any test.",
                                    installed, False)),
        ("nothing installed", install_errors("t", "Nothing is installed on a cluster by the tests.", installed, False)),
        ("helm", helm_version_errors("t", "You need kubectl, Helm 3, and jq.", 4)),
        ("home unsaid", home_errors(home_is_placeholder("home: https://github.com/example/x\n"),
                                    {"docs/quickstart-eks.md": "Clone the repository `home` names."})),
        ("home said wrongly", home_errors(home_is_placeholder("home: https://github.com/acme/x\n"),
                                          {"docs/quickstart-eks.md": "The project has no public\nhome yet."})),
    ]
    good = [
        transport_errors("t", "`127.0.0.1:8086` with the chart's `transport: tcp` in sidecar mode.", facts),
        transport_errors("t", "The socket (sidecar and bundled modes, `transport: unix`, the default).", facts),
        install_errors("t", "The Kustomize overlays are not installed by any test.", installed, False),
        helm_version_errors("t", "Helm 4 (Helm 3 also reads it, untested).", 4),
        home_errors(home_is_placeholder("home: https://example.com/x\n"),
                    {"docs/quickstart-eks.md": "**The project has no public\nhome yet**: ..."}),
        home_errors(home_is_placeholder("home: https://github.com/acme/x\n"), {"docs/quickstart-eks.md": "Clone it."}),
    ]
    errs = [f"self-test: the {what} check passed a known-bad text" for what, e in bad if not e]
    errs += [f"self-test: a good text failed: {e}" for e in good if e]
    errs += [f"self-test: install parsing: {got}" for got in [installed_modes(
        'fn helper() {\n    json!({"mode": "bundled"});\n}\n#[tokio::test]\nasync fn t() {\n    real_cas(s);\n    helper();\n}\n',
        False)] if got != {"bundled": [("t", False)]}]
    return errs


def main():
    errs = selftest()
    facts, e = chart_facts()
    errs += e
    for doc in TRANSPORT_DOCS:
        errs += transport_errors(doc, (ROOT / doc).read_text(), facts)
    errs += notes_errors(facts)
    test_sh = (ROOT / "scripts/test.sh").read_text()
    installed = installed_modes((ROOT / "tests/e2e_install.rs").read_text(), "E2E_CA_BINS" in test_sh)
    overlays = overlays_installed()
    for doc in INSTALL_DOCS:
        errs += install_errors(doc, (ROOT / doc).read_text(), installed, overlays)
    major, e = helm_major()
    errs += e
    if major is not None:
        for p in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), CHART / "README.md"]:
            errs += helm_version_errors(str(p.relative_to(ROOT)), p.read_text(), major)
    placeholder = home_is_placeholder((CHART / "Chart.yaml").read_text())
    errs += home_errors(placeholder, {d: (ROOT / d).read_text() for d in HOME_DOCS})
    if errs:
        print("\n".join(f"FAIL {e}" for e in errs))
        return 1
    defaults = ", ".join(f"{m}: {facts[m][0]}" for m in MODES if m in facts)
    ci = ", ".join(f"{m} ({'every run' if any(c for _, c in v) else 'only with E2E_CA_BINS'})"
                   for m, v in sorted(installed.items()))
    print(f"ok   the docs agree on the modes' default transport ({defaults}), on what the tests install "
          f"({ci}; overlays: {'installed' if overlays else 'rendered only'}), on helm {major} and on the project's "
          f"home ({'a placeholder, which the quickstart says' if placeholder else 'set'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Every command block of README.md and docs/ that can run offline runs as written.

The fenced `sh`/`bash` blocks of each Markdown file are run in order, in one bash
session per file (as a reader runs them in one terminal), from a scratch copy of the
repository's deploy/ (so files the commands write stay out of the tree), with
`set -euo pipefail`:

  - variable assignments (`export A=x B=y`, `A=x`) run, unless a command substitution
    in them needs AWS or a cluster (`$(aws ...)`, `$(kubectl version ...)`): then the
    variable gets its value from LIVE below, a stand-in for what that command prints;
  - `helm template`, `helm lint`, `kubectl kustomize` run, and so do `helm install` and
    `helm upgrade [--install]`, as `helm template` with the same arguments: that is
    what "renders as written" means here; `sed`, `mkdir`, `cp` and `cat > FILE <<EOF`
    run too, since they write what the renders read;
  - everything else needs AWS, a registry or a cluster (`aws`, `eksctl`, `docker`,
    `kubectl apply`, `helm repo add`, `helm test`, ...) and is skipped; a skipped
    command that writes a file (`> FILE`) leaves an empty FILE behind, as a stand-in;
  - a chart from a Helm repository (`autoscaler/cluster-autoscaler`) is not here
    offline: those commands are skipped, unless CA_CHART names a local copy of CA's
    chart (e.g. CA_CHART=/tmp/cluster-autoscaler), which then stands in for it.

A command that fails fails the test, with the file and line of its block. So does a
rendered output that still holds an example placeholder (account 111122223333, image
ghcr.io/example/..., cluster my-cluster), an empty IRSA annotation, or a
cluster-autoscaler image whose minor is not the cluster's (LIVE's K8S_MINOR), and
every rendered object must pass the Kubernetes schemas in strict mode (as
tests/deploy/validate.py checks deploy/). Each file in MIN_RENDERS must render at least
that often, so a block that stops being recognised cannot pass unnoticed.

Exit 1 listing every failure, 0 when all ran.
"""

import importlib.util
import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]

# Stand-ins for what the skipped commands print, with values unlike the examples' own,
# so that an example value left in a render is found. A variable a runnable command
# uses that is neither set by the text nor here fails the test (set -u).
LIVE = {
    "ACCOUNT_ID": "210987654321",  # aws sts get-caller-identity
    "K8S_MINOR": "31",  # kubectl version: the cluster's Kubernetes minor
    "POLICY_ARN": "arn:aws:iam::210987654321:policy/ca-asg-provider-live",
    "OIDC": "oidc.eks.eu-west-1.amazonaws.com/id/LIVE",
    # Names an existing cluster-autoscaler release uses (docs/quickstart-eks.md).
    "DEPLOY": "cluster-autoscaler-aws-cluster-autoscaler",
    "NAME": "aws-cluster-autoscaler",
    "SA": "cluster-autoscaler-aws-cluster-autoscaler",
}

# Renders each file must run (helm template/lint, kubectl kustomize).
MIN_RENDERS = {"docs/helm.md": 5, "docs/quickstart-eks.md": 5}

PLACEHOLDERS = ("111122223333", "ghcr.io/example/", "cluster-autoscaler/my-cluster")
REMOTE_CHARTS = ("autoscaler/cluster-autoscaler",)

FENCE = re.compile(r"^\s{0,3}(```|~~~)\s*(\w*)")
ASSIGN = re.compile(r"^(?:export\s+)?[A-Za-z_][A-Za-z0-9_]*=")
HEREDOC = re.compile(r"<<-?\s*(['\"]?)(\w+)\1")
LIVE_WORDS = ("aws", "eksctl", "docker", "kubectl", "helm", "curl", "git")


def blocks(path):
    """(line of the opening fence, lines) of every sh/bash block of a Markdown file, the
    lines of a block in a list item unindented by its fence's indentation, as Markdown
    reads them (a here-document's end must start its line)."""
    out, cur, start, fence, indent = [], None, 0, None, 0
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        m = FENCE.match(line) or (fence and re.match(r"^\s*(```|~~~)\s*(\w*)", line))
        if m and fence is None:
            fence, indent = m.group(1), len(line) - len(line.lstrip())
            if m.group(2) in ("sh", "bash", "shell"):
                cur, start = [], n
            continue
        if m and fence and line.strip().startswith(fence):
            if cur is not None:
                out.append((start, cur))
            cur, fence = None, None
            continue
        if cur is not None:
            strip = min(indent, len(line) - len(line.lstrip(" ")))
            cur.append((n, line[strip:]))
    return out


def commands(lines):
    """(line, text) of each logical command of a block: `\\` continuations joined
    (keeping the newlines), a here-document kept with its command, comments dropped."""
    out, i = [], 0
    while i < len(lines):
        n, line = lines[i]
        i += 1
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        text = line
        while text.rstrip().endswith("\\") and i < len(lines):
            text += "\n" + lines[i][1]
            i += 1
        # A compound command (a loop, an `if`) is one command, to its `done`/`fi`.
        depth = compound_depth(text)
        while depth > 0 and i < len(lines):
            text += "\n" + lines[i][1]
            depth += compound_depth(lines[i][1])
            i += 1
        m = HEREDOC.search(text)
        if m:
            while i < len(lines):
                text += "\n" + lines[i][1]
                i += 1
                if lines[i - 1][1].strip() == m.group(2):
                    break
        out.append((n, text))
    return out


def compound_depth(text):
    """How many compound commands the lines of `text` open, less those they close."""
    opens = len(re.findall(r"(?:^|[;&|]\s*)\s*(for|while|until|if|case)\b", text, re.M))
    closes = len(re.findall(r"(?:^|;)\s*(done|fi|esac)\b", text, re.M))
    return opens - closes


def substitutions(text):
    """The first word of every `$( ... )` in a command."""
    return [s.split()[0] if s.split() else "" for s in re.findall(r"\$\(\s*([^)]*)", text)]


def is_assignment(text):
    """Only variable assignments (`export A=x B=$(...)`), not `A=x command`."""
    line = text.split("\n")[0]
    while re.search(r"\$\([^()]*\)", line):  # a substitution is one word of its assignment
        line = re.sub(r"\$\([^()]*\)", "S", line)
    try:
        lexer = shlex.shlex(line, posix=True)
        lexer.whitespace_split = True
        lexer.commenters = "#"
        ws = list(lexer)
    except ValueError:
        return False
    ws = ws[1:] if ws[:1] == ["export"] else ws
    return bool(ws) and all(ASSIGN.match(w) for w in ws)


def classify(text):
    """('run' | 'render' | 'skip', why, text to run)."""
    first = text.lstrip()
    if is_assignment(first):
        live = [w for w in substitutions(first) if w in LIVE_WORDS
                and not first.startswith("kubectl kustomize")]
        if live:
            return "skip", f"needs {live[0]}", None
        return "run", "assignment", text
    head = first.split()[:2]
    writes_here = re.match(r"cat\s+>\s*([^\s/<][^\s<]*)\s*<<", first)
    if head[:1] in (["sed"], ["mkdir"], ["cp"]) or (writes_here and HEREDOC.search(first)):
        if any(s in LIVE_WORDS for s in substitutions(first)):
            return "skip", "needs AWS or a cluster", None
        return "run", head[0], text
    if head == ["kubectl", "kustomize"] or head in (["helm", "template"], ["helm", "lint"]):
        return "render", " ".join(head), text
    if head in (["helm", "install"], ["helm", "upgrade"]):
        rest = first.split(None, 2)[2] if len(first.split(None, 2)) > 2 else ""
        rest = re.sub(r"^--install\s+", "", rest)
        return "render", f"{' '.join(head)} as helm template", "helm template " + rest
    return "skip", " ".join(head) or "?", None


def redirect_target(text):
    """The file a skipped command writes with `> FILE`, when it is a relative path."""
    m = re.search(r"(?<![<2&])>\s*([\w./$-]+)\s*$", text.split("\n")[0])
    if m and not m.group(1).startswith("/"):
        return m.group(1)
    return None


def load_validate():
    spec = importlib.util.spec_from_file_location("validate", ROOT / "tests/deploy/validate.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def output_errors(text, check_object):
    """What is wrong with one rendered output."""
    errs = [f"renders the example placeholder {p!r}" for p in PLACEHOLDERS if p in text]
    if re.search(r"eks\.amazonaws\.com/role-arn:\s*(?:\"\"|''|null)?\s*$", text, re.M):
        errs.append("renders an empty eks.amazonaws.com/role-arn annotation")
    for tag in re.findall(r"registry\.k8s\.io/autoscaling/cluster-autoscaler:(v[\w.-]+)", text):
        if not tag.startswith(f"v1.{LIVE['K8S_MINOR']}."):
            errs.append(f"renders cluster-autoscaler {tag} on a Kubernetes 1.{LIVE['K8S_MINOR']} cluster "
                        f"(CA 1.N.x for Kubernetes 1.N)")
    try:
        docs = [d for d in yaml.safe_load_all(text) if isinstance(d, dict) and "kind" in d]
    except yaml.YAMLError:
        docs = []  # helm lint's report, grep's lines: not manifests
    for d in docs:
        where = f"{d['kind']}/{(d.get('metadata') or {}).get('name')}"
        errs += [f"{where}: {e}" for e in check_object(d)]
    return errs


def run_file(md, scratch, check_object, ca_chart):
    """Runs one Markdown file's blocks. Returns (errors, renders run, lines skipped)."""
    rel = md.relative_to(ROOT).as_posix()
    outdir = scratch / ".out"
    outdir.mkdir(exist_ok=True)
    script = ["set -euo pipefail"]
    script += [f"export {k}={shlex.quote(v)}" for k, v in LIVE.items()]
    plan, skipped = [], []
    for start, lines in blocks(md):
        for n, text in commands(lines):
            kind, why, run = classify(text)
            if kind == "render" and any(c in run for c in REMOTE_CHARTS):
                if not ca_chart:
                    skipped.append(f"{rel}:{n}: {why} (a chart from a Helm repository; CA_CHART=path renders it)")
                    continue
                for c in REMOTE_CHARTS:
                    run = run.replace(c, shlex.quote(ca_chart))
            if kind == "skip":
                skipped.append(f"{rel}:{n}: {why}")
                target = redirect_target(text)
                if target:
                    script.append(f': > {target}')
                continue
            i = len(plan)
            plan.append((n, kind, why, run))
            script.append(f"echo '>>> {i}' >&2")
            body = f"{run}\n" if kind == "run" else f"{{\n{run}\n}} > .out/{i}.txt\n"
            script.append(body)
    script.append("echo '>>> done' >&2")
    env = dict(os.environ, PATH=f"{ROOT / '.venv/bin'}:{os.environ['PATH']}", HOME=str(scratch))
    p = subprocess.run(["bash", "-c", "\n".join(script)], cwd=scratch, env=env,
                       capture_output=True, text=True)
    errs = []
    reached = [int(x) for x in re.findall(r"^>>> (\d+)$", p.stderr, re.M)]
    if p.returncode != 0:
        last = reached[-1] if reached else None
        where = f"{rel}:{plan[last][0]}" if last is not None else rel
        tail = p.stderr.strip().splitlines()[-8:]
        errs.append(f"{where}: exit {p.returncode}: {plan[last][3].splitlines()[0] if last is not None else ''}\n      "
                    + "\n      ".join(tail))
    renders = 0
    for i, (n, kind, why, run) in enumerate(plan):
        if kind != "render" or i not in reached or (p.returncode != 0 and i == reached[-1]):
            continue
        renders += 1
        out = (outdir / f"{i}.txt").read_text()
        errs += [f"{rel}:{n}: {why}: {e}" for e in output_errors(out, check_object)]
        print(f"ok   {rel}:{n}: {why} ({len(out.splitlines())} lines)")
    if renders < MIN_RENDERS.get(rel, 0):
        errs.append(f"{rel}: {renders} render(s) ran, expected at least {MIN_RENDERS[rel]}: "
                    "a block's command is no longer recognised")
    return errs, renders, skipped


def self_test():
    """The parsing rules on known text, so that a change to them cannot pass silently."""
    assert classify('export CLUSTER=demo AWS_REGION=eu-west-1')[0] == "run"
    assert classify('export ACCOUNT_ID=$(aws sts get-caller-identity --query Account)') == ("skip", "needs aws", None)
    assert classify('X=$(echo "a b")')[0] == "run"
    assert classify('MINOR=$(kubectl version -o json | jq -r .serverVersion.minor)')[0] == "skip"
    k, _, run = classify('helm install ca-asg-provider deploy/chart -n kube-system \\\n  --set mode=bundled')
    assert k == "render" and run.startswith("helm template ca-asg-provider deploy/chart"), run
    k, _, run = classify('helm upgrade --install x deploy/chart -f v.yaml')
    assert k == "render" and run == "helm template x deploy/chart -f v.yaml", run
    assert classify('kubectl apply -k deploy/overlays/sidecar')[0] == "skip"
    assert classify('kubectl kustomize deploy/local/$CLUSTER')[0] == "render"
    assert classify('helm repo add autoscaler https://kubernetes.github.io/autoscaler')[0] == "skip"
    assert classify('cat > x.yaml <<EOF\na: $B\nEOF')[0] == "run"
    assert classify('cat /etc/passwd')[0] == "skip"
    assert classify('cat > /tmp/trust.json <<EOF\n{}\nEOF')[0] == "skip"
    assert classify('E2E=0 scripts/test.sh')[0] == "skip"
    assert classify('export CA_VERSION=v1.$K8S_MINOR.0   # CA 1.N.x')[0] == "run"
    assert redirect_target('helm get values "$REL" -n kube-system -o yaml > ca-current-values.yaml') == "ca-current-values.yaml"
    assert redirect_target('cat > /tmp/irsa-trust.json <<EOF') is None
    cmds = commands([(1, "# c"), (2, "a \\"), (3, "  b"), (4, "cat > f <<'EOF'"), (5, "x"), (6, "EOF"), (7, "c")])
    assert [n for n, _ in cmds] == [2, 4, 7] and cmds[1][1].endswith("EOF"), cmds
    cmds = commands([(1, "for x in \\"), (2, "  a b; do"), (3, '  n="$x"'), (4, "done"), (5, "y=1")])
    assert [n for n, _ in cmds] == [1, 5] and classify(cmds[0][1])[0] == "skip", cmds
    assert output_errors("x: 111122223333\n", lambda d: []) != []
    assert output_errors("  eks.amazonaws.com/role-arn: \n", lambda d: []) != []
    assert output_errors("image: registry.k8s.io/autoscaling/cluster-autoscaler:v1.35.0\n", lambda d: []) != []
    assert output_errors(f"image: registry.k8s.io/autoscaling/cluster-autoscaler:v1.{LIVE['K8S_MINOR']}.0\n", lambda d: []) == []


def main():
    self_test()
    ca_chart = os.environ.get("CA_CHART")
    validate = load_validate()
    files = [ROOT / "README.md"] + sorted((ROOT / "docs").rglob("*.md"))
    errs, total, skipped = [], 0, []
    for md in files:
        with tempfile.TemporaryDirectory() as tmp:
            scratch = pathlib.Path(tmp)
            shutil.copytree(ROOT / "deploy", scratch / "deploy", symlinks=True)
            e, n, s = run_file(md, scratch, validate.check_object, ca_chart)
            errs += e
            total += n
            skipped += s
    if os.environ.get("VERBOSE"):
        for s in skipped:
            print(f"skip {s}")
    if errs:
        print(f"commands.py: {len(errs)} failure(s):")
        for e in errs:
            print(f"  {e}")
        return 1
    print(f"ok   {total} offline command(s) in README.md and docs/ ran as written "
          f"({len(skipped)} needing AWS, a registry or a cluster skipped; VERBOSE=1 lists them)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

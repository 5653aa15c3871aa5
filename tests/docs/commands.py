#!/usr/bin/env python3
"""Every command block of README.md and docs/ that can run offline runs as written.

The fenced `sh`/`bash` blocks of each Markdown file are run in order, in one bash
session per file (as a reader runs them in one terminal), from a scratch copy of the
repository's deploy/ (so files the commands write stay out of the tree), with
`set -euo pipefail`:

  - variable assignments (`export A=x B=y`, `A=x`) run, unless a command substitution
    in them needs a cluster (`$(kubectl version ...)`) or AWS beyond the stand-in below:
    then the variable gets its value from LIVE below, where the page assigns it, a
    stand-in for what that command prints;
  - the account steps run against a stand-in for AWS (tests/docs/aws_standin.py, put on
    PATH as `aws` and `eksctl`): a command (or assignment, `if`, `for`, `a || b`) whose
    only AWS/cluster words are `aws` and `eksctl` calls the stand-in implements (IAM,
    STS, EKS add-ons and Pod Identity, ECR repositories; aws_standin.OPERATIONS) runs,
    and so does `jq` (it writes the IAM policy). A page with such steps runs TWICE, in
    two fresh shells against the same stand-in state, as a reader runs it again: the
    second time every create meets what the first made and the stand-in answers as AWS
    does (EntityAlreadyExists, ResourceInUseException, ...), so a step that is not safe
    to run twice fails. Before every command that uses `$POLICY_ARN` or `$ROLE_ARN`,
    in both runs, the variable must hold an IAM ARN of the stand-in's account (not
    empty, not unset), and the second run must leave as many policies, roles, add-ons,
    associations and repositories as the first. Between the runs deploy/iam-policy.json
    gains a statement and each policy the page made reaches the five versions IAM keeps
    at most: after the second run each policy's default version must be the changed
    document (a second run applies a changed policy, deleting old versions to do so);
  - `helm template`, `helm lint`, `kubectl kustomize` run, and so do `helm install` and
    `helm upgrade [--install]`, as `helm template` with the same arguments and
    `--kube-version` LIVE's cluster (helm install reads the cluster's version): that is
    what "renders as written" means here; `sed`, `mkdir`, `cp` and `cat > FILE <<EOF`
    run too, since they write what the renders read;
  - everything else needs AWS, a registry or a cluster (`aws`, `eksctl`, `docker`,
    `kubectl apply`, `helm repo add`, `helm test`, ...) and is skipped; a skipped
    command that writes a file (`> FILE`) leaves an empty FILE behind, as a stand-in;
  - a block that shows a file of the repository (after `<!-- include: PATH -->`, checked
    by tests/docs/includes.py: the quickstart's scripts, which need a cluster and which
    tests/e2e_install.rs runs) is not run;
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
import json
import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

import yaml

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import aws_cli_models  # noqa: E402
import aws_standin  # noqa: E402
import includes  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]

# Stand-ins for what the skipped commands print, with values unlike the examples' own,
# so that an example value left in a render is found; each is assigned where the page
# assigns the variable with a skipped command. A variable a runnable command uses that
# is neither set by the text nor here fails the test (set -u). What `aws` prints for the
# account steps comes from the stand-in (aws_standin.py; its account is 210987654321).
LIVE = {
    "K8S_MINOR": "31",  # kubectl version: the cluster's Kubernetes minor
    # Names an existing cluster-autoscaler release uses (docs/quickstart-eks.md), and the
    # role on its ServiceAccount (the stand-in holds that role and its association).
    "DEPLOY": "cluster-autoscaler-aws-cluster-autoscaler",
    "NAME": "aws-cluster-autoscaler",
    "SA": aws_standin.SEED_SERVICE_ACCOUNT,
    "ROLE_ARN": f"arn:aws:iam::{aws_standin.ACCOUNT}:role/{aws_standin.SEED_ROLE}",
    # The quickstart's chart by the digest scripts/release.sh wrote to release.json.
    "CHART": f"oci://{aws_standin.ACCOUNT}.dkr.ecr.ap-southeast-2.amazonaws.com/charts/ca-asg-provider@sha256:{'0' * 64}",
    "VALUES": "my-values.yaml",
}
# Files only a skipped command writes (scripts/release.sh's result): an assignment that
# reads one needs what that command needed.
SKIPPED_OUTPUTS = ("release.json",)
# Account steps (commands run against the stand-in) each file must run, per run.
MIN_ACCOUNT_STEPS = {"docs/quickstart-eks.md": 8, "docs/helm.md": 4}
ARN_VARS = ("POLICY_ARN", "ROLE_ARN")
STANDIN_MODELS = None  # aws_standin.model_cache(), as JSON
ARN = re.compile(rf"^arn:aws:iam::{aws_standin.ACCOUNT}:(policy|role)/[\w+=,.@-]+$")

# Renders each file must run (helm template/lint, kubectl kustomize).
# The quickstart installs with deploy/quickstart/install.sh (tests/e2e_install.rs runs
# it); its values file's render is tests/deploy/validate.py's (the quickstart's sed).
MIN_RENDERS = {"docs/helm.md": 5}

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
        while re.search(r"(\\|\|\||&&|\|)$", text.rstrip()) and i < len(lines):
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


def live_words(text):
    """The AWS/cluster commands a command calls (at a command word, in `$( )` too)."""
    return set(re.findall(r"(?:^|[|;&(!{]|\$\(|\b(?:if|then|else|elif|do|while|until)\s)\s*("
                          + "|".join(LIVE_WORDS) + r")\b", text, re.M))


def account_step(text):
    """Whether a command is an account step the stand-in answers: it calls `aws` or
    `eksctl`, every such call is one the stand-in implements, and it calls nothing else
    that needs AWS or a cluster."""
    words = live_words(text)
    if not words or not words <= {"aws", "eksctl"}:
        return False
    flat = re.sub(r"\\\n", " ", text)
    for args in (a for line in flat.splitlines() for a in aws_cli_models.invocations(line)):
        i = 0
        while i < len(args) and args[i].startswith("--"):
            i += 2 if aws_cli_models.GLOBAL_OPTIONS.get(args[i]) else 1
        ws, _ = aws_cli_models.split_options(args[i:])
        if tuple(ws[:2]) not in aws_standin.OPERATIONS:
            return False
    for m in re.finditer(r"(?:^|[|;&(]|\$\()\s*eksctl\s+(\S+)\s+(\S+)", flat, re.M):
        if m.groups() not in aws_standin.EKSCTL:
            return False
    return True


def assigned(text):
    """The variables an assignment sets."""
    return re.findall(r"(?:^|\s)([A-Za-z_][A-Za-z0-9_]*)=", re.sub(r"\$\([^()]*\)", "S", text.split("\n")[0]))


def classify(text):
    """('run' | 'account' | 'render' | 'skip', why, text to run)."""
    first = text.lstrip()
    if account_step(first):
        return "account", "account step (stand-in)", text
    if is_assignment(first):
        live = [w for w in substitutions(first) if w in LIVE_WORDS
                and not first.startswith("kubectl kustomize")]
        if live:
            return "skip", f"needs {live[0]}", None
        reads = [f for f in SKIPPED_OUTPUTS if re.search(rf"\$\([^)]*\b{re.escape(f)}\b", first)]
        if reads:
            return "skip", f"reads {reads[0]}, which a skipped command writes", None
        return "run", "assignment", text
    head = first.split()[:2]
    writes_here = re.match(r"cat\s+>\s*([^\s/<][^\s<]*)\s*<<", first)
    if head[:1] in (["sed"], ["mkdir"], ["cp"], ["jq"]) or (writes_here and HEREDOC.search(first)):
        if any(s in LIVE_WORDS for s in substitutions(first)):
            return "skip", "needs AWS or a cluster", None
        return "run", head[0], text
    if head == ["kubectl", "kustomize"] or head in (["helm", "template"], ["helm", "lint"]):
        return "render", " ".join(head), text
    if head in (["helm", "install"], ["helm", "upgrade"]):
        rest = first.split(None, 2)[2] if len(first.split(None, 2)) > 2 else ""
        rest = re.sub(r"^--install\s+", "", rest)
        # helm install reads the cluster's version (the chart picks CA's tag by it);
        # helm template is told it: LIVE's cluster.
        kube = f"--kube-version 1.{LIVE['K8S_MINOR']}.0"
        return "render", f"{' '.join(head)} as helm template", f"helm template {kube} " + rest
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


def run_file(md, scratch, check_object, ca_chart, quiet=False):
    """Runs one Markdown file's blocks (twice when it has account steps). Returns (errors,
    renders run, lines skipped)."""
    rel = md.relative_to(ROOT).as_posix() if md.is_relative_to(ROOT) else md.name
    outdir = scratch / ".out"
    outdir.mkdir(exist_ok=True)
    script = ["set -euo pipefail"]
    plan, skipped = [], []
    # The blocks that show a file of the repository (tests/docs/includes.py checks them):
    # the quickstart's scripts need a cluster and are run by tests/e2e_install.rs instead.
    shown = {open_ + 1: path for _, path, open_, _ in includes.includes(md.read_text(encoding="utf-8").split("\n"))
             if open_ is not None}
    for start, lines in blocks(md):
        if start in shown:
            skipped.append(f"{rel}:{start}: {shown[start]}, shown as it is (tests/e2e_install.rs runs it)")
            continue
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
                if is_assignment(text.lstrip()):
                    script += [f"export {v}={shlex.quote(LIVE[v])}" for v in assigned(text.lstrip()) if v in LIVE]
                continue
            i = len(plan)
            plan.append((n, kind, why, run))
            script.append(f"echo '>>> {i}' >&2")
            for v in ARN_VARS:  # what an ARN variable holds where a command uses it (and does not set it)
                if re.search(rf"\$\{{?{v}\b", run) and not re.search(rf"\b{v}=", run):
                    script.append(f'printf "%s %s %s\\n" {i} {v} "${{{v}-<unset>}}" >> .out/arns')
            body = f"{run}\n" if kind in ("run", "account") else f"{{\n{run}\n}} > .out/{i}.txt\n"
            script.append(body)
    script.append("echo '>>> done' >&2")
    bindir = scratch / ".bin"
    bindir.mkdir(exist_ok=True)
    for tool in ("aws", "eksctl"):
        (bindir / tool).write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} '
                                   f'{shlex.quote(str(pathlib.Path(aws_standin.__file__).resolve()))} {tool} "$@"\n')
        (bindir / tool).chmod(0o755)
    global STANDIN_MODELS
    if STANDIN_MODELS is None:  # botocore's models, read once
        STANDIN_MODELS = json.dumps(aws_standin.model_cache())
    (scratch / ".standin-models.json").write_text(STANDIN_MODELS)
    env = dict(os.environ, PATH=f"{bindir}:{ROOT / '.venv/bin'}:{os.environ['PATH']}", HOME=str(scratch),
               AWS_STANDIN_STATE=str(scratch / ".standin.json"),
               AWS_STANDIN_MODELS=str(scratch / ".standin-models.json"))
    for k in [k for k in env if k.startswith("AWS_") and not k.startswith("AWS_STANDIN_")]:
        del env[k]  # the reader's own AWS settings are not the page's
    accounts = sum(1 for _, kind, _, _ in plan if kind == "account")
    errs, renders, counts = [], 0, []
    for attempt in ((1, 2) if accounts else (1,)):
        label = f" (run {attempt} of 2)" if accounts else ""
        (outdir / "arns").unlink(missing_ok=True)
        if attempt == 2:
            between_runs(scratch)
        p = subprocess.run(["bash", "-c", "\n".join(script)], cwd=scratch, env=env,
                           capture_output=True, text=True)
        reached = [int(x) for x in re.findall(r"^>>> (\d+)$", p.stderr, re.M)]
        if p.returncode != 0:
            last = reached[-1] if reached else None
            where = f"{rel}:{plan[last][0]}" if last is not None else rel
            tail = p.stderr.strip().splitlines()[-8:]
            errs.append(f"{where}{label}: exit {p.returncode}: "
                        f"{plan[last][3].splitlines()[0] if last is not None else ''}\n      "
                        + "\n      ".join(tail))
        arns = (outdir / "arns").read_text().splitlines() if (outdir / "arns").exists() else []
        for line in arns:
            i, var, value = line.split(" ", 2)
            if not ARN.match(value):
                errs.append(f"{rel}:{plan[int(i)][0]}{label}: ${var} is {value!r} where the command uses it, "
                            f"not an IAM ARN of the account")
        for i, (n, kind, why, run) in enumerate(plan):
            if kind != "render" or i not in reached or (p.returncode != 0 and i == reached[-1]):
                continue
            out = (outdir / f"{i}.txt").read_text()
            errs += [f"{rel}:{n}{label}: {why}: {e}" for e in output_errors(out, check_object)]
            if attempt == 1:
                renders += 1
                if not quiet:
                    print(f"ok   {rel}:{n}: {why} ({len(out.splitlines())} lines)")
        if accounts and p.returncode == 0:
            state = json.loads((scratch / ".standin.json").read_text())
            counts.append({k: len(state[k]) for k in ("policies", "roles", "addons", "associations", "repositories")})
            ran = sum(1 for i, (_, kind, _, _) in enumerate(plan) if kind == "account" and i in reached)
            if not quiet:
                print(f"ok   {rel}{label}: {ran} account step(s) against the stand-in, "
                      f"{len(state['calls'])} aws/eksctl call(s) so far, ARN variables checked {len(arns)} time(s)")
    if len(counts) == 2:
        errs += [f"{rel} (run 2 of 2): {e}" for e in policy_update_errors(scratch)]
    if len(counts) == 2 and counts[0] != counts[1]:
        errs.append(f"{rel}: a second run changed what the account holds: {counts[0]} after the first, "
                    f"{counts[1]} after the second")
    if renders < MIN_RENDERS.get(rel, 0):
        errs.append(f"{rel}: {renders} render(s) ran, expected at least {MIN_RENDERS[rel]}: "
                    "a block's command is no longer recognised")
    if accounts < MIN_ACCOUNT_STEPS.get(rel, 0):
        errs.append(f"{rel}: {accounts} account step(s), expected at least {MIN_ACCOUNT_STEPS[rel]}: "
                    "a block's command is no longer run against the stand-in")
    return errs, renders, skipped


def self_test():
    """The parsing rules on known text, so that a change to them cannot pass silently."""
    assert classify('export CLUSTER=demo AWS_REGION=eu-west-1')[0] == "run"
    assert classify('export ACCOUNT_ID=$(aws sts get-caller-identity --query Account)')[0] == "account"
    assert classify('ASG=$(aws autoscaling describe-tags --filters x)') == ("skip", "needs aws", None)
    assert classify('aws iam get-role --role-name r >/dev/null 2>&1 ||\n  aws iam create-role --role-name r')[0] == "account"
    assert classify('aws ecr get-login-password | docker login --password-stdin x')[0] == "skip"
    assert classify('eksctl utils associate-iam-oidc-provider --cluster c --approve')[0] == "account"
    assert classify('eksctl create cluster -f c.yaml')[0] == "skip"
    assert assigned('export A=$(aws x y) B=1') == ["A", "B"]
    assert classify('X=$(echo "a b")')[0] == "run"
    assert classify('MINOR=$(kubectl version -o json | jq -r .serverVersion.minor)')[0] == "skip"
    k, _, run = classify('helm install ca-asg-provider deploy/chart -n kube-system \\\n  --set mode=bundled')
    assert k == "render" and run.startswith(f"helm template --kube-version 1.{LIVE['K8S_MINOR']}.0 ca-asg-provider deploy/chart"), run
    k, _, run = classify('helm upgrade --install x deploy/chart -f v.yaml')
    assert k == "render" and run == f"helm template --kube-version 1.{LIVE['K8S_MINOR']}.0 x deploy/chart -f v.yaml", run
    assert classify('kubectl apply -k deploy/overlays/sidecar')[0] == "skip"
    assert classify('kubectl kustomize deploy/local/$CLUSTER')[0] == "render"
    assert classify('helm repo add autoscaler https://kubernetes.github.io/autoscaler')[0] == "skip"
    assert classify('cat > x.yaml <<EOF\na: $B\nEOF')[0] == "run"
    assert classify('cat /etc/passwd')[0] == "skip"
    assert classify('cat > /tmp/trust.json <<EOF\n{}\nEOF')[0] == "skip"
    assert classify('E2E=0 scripts/test.sh')[0] == "skip"
    assert classify('export CA_VERSION=v1.$K8S_MINOR.0   # CA 1.N.x')[0] == "run"
    assert classify('export CHART=oci://r/c@$(jq -r .chart.digest release.json) VALUES=v.yaml')[0] == "skip"
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


SECOND_RUN_SID = "StandinSecondRun"


def between_runs(scratch):
    """What changed before the page is run again: deploy/iam-policy.json gained a
    statement (the second run must apply it), and every policy the first run made has
    the five versions IAM keeps at most (as after four earlier updates), so a second run
    that adds a version without deleting an old one meets LimitExceeded."""
    policy = scratch / "deploy/iam-policy.json"
    if policy.exists():
        doc = json.loads(policy.read_text())
        doc["Statement"].append({"Sid": SECOND_RUN_SID, "Effect": "Allow", "Action": "sts:GetCallerIdentity",
                                 "Resource": "*"})
        policy.write_text(json.dumps(doc, indent=2))
    path = scratch / ".standin.json"
    state = json.loads(path.read_text())
    for pol in state["policies"].values():
        while len(pol["versions"]) < 5:
            pol["versions"].insert(0, {"id": f"v{pol['next']}", "default": False, "doc": "{}"})
            pol["next"] += 1
    path.write_text(json.dumps(state))


def policy_update_errors(scratch):
    """Every policy the page made holds, as its default version, the document of the
    second run (with the statement between_runs added)."""
    state = json.loads((scratch / ".standin.json").read_text())
    errs = []
    for arn, pol in state["policies"].items():
        default = next(v for v in pol["versions"] if v["default"])
        sids = [st.get("Sid") for st in json.loads(default["doc"]).get("Statement", [])]
        if SECOND_RUN_SID not in sids:
            errs.append(f"the policy {arn}'s default version {default['id']} is not the changed "
                        f"deploy/iam-policy.json: a second run does not apply a changed policy")
    return errs


def standin_self_test(check_object):
    """The account steps run twice: a create that is not get-or-create fails the second
    run, an empty POLICY_ARN where a command uses it fails, the get-or-create passes."""
    head = "```sh\nexport CLUSTER=demo\ncp deploy/iam-policy.json p.json\n"
    role = ('aws iam get-role --role-name "r-$CLUSTER" >/dev/null 2>&1 ||\n'
            '  aws iam create-role --role-name "r-$CLUSTER" --assume-role-policy-document file://p.json\n'
            'aws iam attach-role-policy --role-name "r-$CLUSTER" --policy-arn "$POLICY_ARN"\n```\n')
    cases = {
        # docs/quickstart-eks.md's step 3 before issue 61: create-policy alone.
        "create only": ('POLICY_ARN=$(aws iam create-policy --policy-name "p-$CLUSTER" --policy-document file://p.json \\\n'
                        '  --query Policy.Arn --output text)\n', "(run 2 of 2): exit 254", "EntityAlreadyExists"),
        "looked up, never created": ('POLICY_ARN=$(aws iam list-policies --scope Local \\\n'
                                     '  --query "Policies[?PolicyName==\'p-$CLUSTER\'].Arn" --output text)\n',
                                     "(run 1 of 2): $POLICY_ARN is ''", ""),
        "created, never updated": ('POLICY_ARN=$(aws iam list-policies --scope Local \\\n'
                                   '  --query "Policies[?PolicyName==\'p-$CLUSTER\'].Arn" --output text)\n'
                                   'if [ -z "$POLICY_ARN" ]; then\n'
                                   '  POLICY_ARN=$(aws iam create-policy --policy-name "p-$CLUSTER" --policy-document file://p.json \\\n'
                                   '    --query Policy.Arn --output text)\nfi\n',
                                   "(run 2 of 2): the policy", "does not apply a changed policy"),
        "updated, never pruned": ('POLICY_ARN=$(aws iam list-policies --scope Local \\\n'
                                  '  --query "Policies[?PolicyName==\'p-$CLUSTER\'].Arn" --output text)\n'
                                  'if [ -z "$POLICY_ARN" ]; then\n'
                                  '  POLICY_ARN=$(aws iam create-policy --policy-name "p-$CLUSTER" --policy-document file://p.json \\\n'
                                  '    --query Policy.Arn --output text)\nelse\n'
                                  '  aws iam create-policy-version --policy-arn "$POLICY_ARN" --policy-document file://p.json --set-as-default\n'
                                  'fi\n', "(run 2 of 2): exit 254", "LimitExceeded"),
        "get or create": ('POLICY_ARN=$(aws iam list-policies --scope Local \\\n'
                          '  --query "Policies[?PolicyName==\'p-$CLUSTER\'].Arn" --output text)\n'
                          'if [ -z "$POLICY_ARN" ]; then\n'
                          '  POLICY_ARN=$(aws iam create-policy --policy-name "p-$CLUSTER" --policy-document file://p.json \\\n'
                          '    --query Policy.Arn --output text)\nelse\n'
                          '  for v in $(aws iam list-policy-versions --policy-arn "$POLICY_ARN" \\\n'
                          '      --query \'Versions[?!IsDefaultVersion].VersionId\' --output text); do\n'
                          '    aws iam delete-policy-version --policy-arn "$POLICY_ARN" --version-id "$v"\n'
                          '  done\n'
                          '  aws iam create-policy-version --policy-arn "$POLICY_ARN" --policy-document file://p.json --set-as-default\n'
                          'fi\n', None, None),
    }
    for name, (steps, want, why) in cases.items():
        with tempfile.TemporaryDirectory() as tmp:
            scratch = pathlib.Path(tmp)
            (scratch / "deploy").mkdir()
            (scratch / "deploy/iam-policy.json").write_text('{"Version": "2012-10-17", "Statement": []}')
            md = scratch / "selftest.md"
            md.write_text(head + steps + role)
            errs, _, _ = run_file(md, scratch, check_object, None, quiet=True)
        if want is None:
            assert not errs, f"self-test {name!r}: expected no failure, got {errs}"
        else:
            assert any(want in e and why in e for e in errs), f"self-test {name!r}: expected {want!r}, got {errs}"


def main():
    self_test()
    ca_chart = os.environ.get("CA_CHART")
    validate = load_validate()
    standin_self_test(validate.check_object)
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
    print(f"ok   {total} render(s) in README.md and docs/ ran as written, and the account steps twice "
          f"({len(skipped)} needing AWS, a registry or a cluster skipped; VERBOSE=1 lists them)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

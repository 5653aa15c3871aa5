#!/usr/bin/env python3
"""Every `aws` command the docs give exists in the AWS CLI's own service models.

The AWS CLI v2 builds its commands from botocore's service models: a service's operation
`CreatePolicyVersion` is the command `create-policy-version`, a member `SetAsDefault` of
its input shape the option `--set-as-default` (botocore's `xform_name(name, "-")`, the
CLI's own rule), and a boolean member also takes `--no-<member>`. This test reads every
`aws <service> <operation> --option ...` of the fenced shell blocks of README.md,
docs/**/*.md and deploy/**/*.md (line continuations joined, here-document bodies and
comments left out; also in `$( ... )`, after `|`, `||`, `&&`, `;`, `if`/`then`/`do`),
and of the inline code spans that start with `aws ` (a command quoted in a sentence),
and looks each up in botocore's models (botocore pinned in scripts/test.sh):

  - the service must be one of the models' (through CLI_SERVICE_NAMES for the few whose
    CLI name differs), the operation one of its operations, every `--option` a member of
    the operation's input shape, one of the CLI's global or pagination options
    (GLOBAL_OPTIONS) or a CLI customisation's (CUSTOM_OPTIONS);
  - `aws <service> wait <waiter>` must name one of the service's waiters, its options
    those of the waiter's operation;
  - commands the CLI adds on top of the models (`aws eks update-kubeconfig`, `aws ecr
    get-login-password`, `aws s3 cp`, ...) are in NON_MODEL, each with what it is; any
    other command outside the models fails.

A command that does not exist fails with the file, line, command and option. A
self-test plants a wrong operation, a wrong option and a wrong waiter and expects each
to fail. Exit 1 listing every failure, 0 when all exist."""

import pathlib
import re
import shlex
import sys

# botocore is imported where it is used: tests/docs/aws_standin.py, run once per `aws`
# call, imports this module for its option parsing only.

ROOT = pathlib.Path(__file__).resolve().parents[2]

# The CLI's global options (`aws help`), with whether each takes a value. They may come
# before the service or after the operation.
GLOBAL_OPTIONS = {
    "--region": True, "--output": True, "--query": True, "--profile": True,
    "--endpoint-url": True, "--color": True, "--ca-bundle": True,
    "--cli-read-timeout": True, "--cli-connect-timeout": True, "--cli-binary-format": True,
    "--no-cli-pager": False, "--debug": False, "--no-verify-ssl": False,
    "--no-paginate": False, "--no-sign-request": False, "--cli-auto-prompt": False,
    "--no-cli-auto-prompt": False,
    # Added by the CLI to every operation (input from / skeleton of a JSON or YAML file).
    "--cli-input-json": True, "--cli-input-yaml": True, "--generate-cli-skeleton": False,
    # Added by the CLI to the operations botocore can paginate.
    "--max-items": True, "--starting-token": True, "--page-size": True,
}

# CLI service names that differ from botocore's.
CLI_SERVICE_NAMES = {
    "s3api": "s3",  # the model's S3 API; `aws s3` is the CLI's own high-level commands
    "configservice": "config",  # renamed by the CLI: `config` is `aws configure`'s
}

# Commands the CLI adds on top of the models: not checked against them.
NON_MODEL = {
    ("eks", "update-kubeconfig"): "writes a kubeconfig entry (awscli customisation)",
    ("eks", "get-token"): "prints a token for kubectl's exec plugin (awscli customisation)",
    ("ecr", "get-login-password"): "prints a registry password from GetAuthorizationToken (awscli customisation)",
    ("s3", "*"): "the high-level S3 commands (cp, ls, sync, ...), not the model's (that is s3api)",
    ("configure", "*"): "the CLI's own settings (`aws configure`)",
    ("cloudformation", "deploy"): "creates or updates a stack through a change set (awscli customisation)",
    ("cloudformation", "package"): "uploads a template's local artifacts (awscli customisation)",
}

# Options a CLI customisation adds to a model operation: (service, operation): options.
CUSTOM_OPTIONS = {
    # `aws cloudformation deploy`'s are not checked (NON_MODEL); none are needed yet.
}

FENCE = re.compile(r"^\s{0,3}(```|~~~)\s*(\w*)")
HEREDOC = re.compile(r"<<-?\s*(['\"]?)(\w+)\1")
# A command word: at the start, after an operator or `$(`, or after a keyword.
COMMAND_START = re.compile(r"(?:^|[|;&(!{]|\$\(|\b(?:if|then|else|elif|do|while|until)\s)\s*aws\s", re.M)


def fenced_commands(path):
    """(line, command text) of every command of the fenced sh/bash blocks of a Markdown
    file: continuations joined (a line ending in `\\`, `|`, `||` or `&&`), comments and
    here-document bodies left out."""
    out, fence, shell, pending, start, heredoc = [], None, False, "", 0, None
    for n, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        m = FENCE.match(raw) or (fence and re.match(r"^\s*(```|~~~)\s*(\w*)", raw))
        if m and fence is None:
            fence, shell = m.group(1), m.group(2) in ("sh", "bash", "shell", "console")
            continue
        if m and raw.strip().startswith(fence):
            if pending:
                out.append((start, pending))
            fence, shell, pending, heredoc = None, False, "", None
            continue
        if not shell:
            continue
        line = raw.strip()
        if heredoc:
            if line == heredoc:
                heredoc = None
            continue
        line = strip_comment(line)
        if not line and not pending:
            continue
        if not pending:
            start = n
        pending = f"{pending} {line}" if pending else line
        h = HEREDOC.search(line)
        if h:
            heredoc = h.group(2)
        if pending.endswith("\\"):
            pending = pending[:-1].rstrip()
        elif not re.search(r"(\|\||&&|\|)$", pending):
            out.append((start, pending))
            pending = ""
    return out


def inline_commands(path):
    """(line, text) of the inline code spans that start with `aws ` (outside fences),
    a span broken over lines of its paragraph joined."""
    text = path.read_text(encoding="utf-8")
    lines, out, in_fence = text.splitlines(), [], False
    masked = []
    for line in lines:  # blank the fenced blocks, keeping the line numbers
        if FENCE.match(line):
            in_fence = not in_fence
            masked.append("")
            continue
        masked.append("" if in_fence else line)
    joined = "\n".join(masked)
    for m in re.finditer(r"(?<!`)`(aws [^`]+)`(?!`)", joined):
        out.append((joined.count("\n", 0, m.start()) + 1, " ".join(m.group(1).split())))
    return out


def strip_comment(line):
    """The line without a `#` comment (one at the start or after whitespace, not quoted)."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = None
            elif ch == "\\" and quote == '"':
                continue
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line


def invocations(command):
    """The argument lists (after `aws`) of every `aws` call in one command."""
    out = []
    for m in COMMAND_START.finditer(command):
        rest = command[m.end():]
        lexer = shlex.shlex(rest, posix=True, punctuation_chars=";&|()<>")
        lexer.whitespace_split = True
        lexer.commenters = ""
        args = []
        try:
            for tok in lexer:
                if tok and all(c in ";&|()<>" for c in tok):
                    break
                args.append(tok)
        except ValueError:  # an unclosed quote: the command runs on past the text
            pass
        out.append(args)
    return out


def split_options(args):
    """(positional words, [(option, value or None)]) of an argument list."""
    words, opts, i = [], [], 0
    while i < len(args):
        a = args[i]
        if a.startswith("--"):
            name, eq, val = a.partition("=")
            if eq:
                opts.append((name, val))
            elif i + 1 < len(args) and not args[i + 1].startswith("--"):
                opts.append((name, args[i + 1]))
                i += 1
            else:
                opts.append((name, None))
        else:
            words.append(a)
        i += 1
    return words, opts


class Models:
    def __init__(self):
        import botocore.session
        self.version = botocore.__version__
        self.session = botocore.session.get_session()
        self.services = set(self.session.get_available_services())
        self._ops = {}

    def operations(self, service):
        """{cli operation name: botocore OperationModel} of a service."""
        from botocore import xform_name
        if service not in self._ops:
            model = self.session.get_service_model(service)
            self._ops[service] = {xform_name(op, "-"): model.operation_model(op) for op in model.operation_names}
        return self._ops[service]

    def waiters(self, service):
        """{cli waiter name: waiter's operation name}."""
        from botocore import xform_name
        try:
            wm = self.session.get_waiter_model(service)
        except Exception:  # a service without waiters
            return {}
        return {xform_name(w, "-"): wm.get_waiter(w).operation for w in wm.waiter_names}


def option_names(op):
    """The options a model operation takes: each input member, and `--no-X` for booleans."""
    from botocore import xform_name
    names = set()
    shape = op.input_shape
    for member, mshape in (shape.members.items() if shape else []):
        names.add("--" + xform_name(member, "-"))
        if mshape.type_name == "boolean":
            names.add("--no-" + xform_name(member, "-"))
    return names


def check(args, models):
    """What is wrong with one `aws` argument list: [] when the command exists."""
    # Global options may come before the service.
    i = 0
    while i < len(args) and args[i].startswith("--"):
        takes = GLOBAL_OPTIONS.get(args[i].partition("=")[0])
        if takes is None:
            return [f"`{args[i]}` is not a global option of the AWS CLI"]
        i += 2 if takes and "=" not in args[i] else 1
    words, opts = split_options(args[i:])
    if len(words) < 2:
        return [f"`aws {' '.join(args)}`: no service and operation"]
    cli_service, operation = words[0], words[1]
    if (cli_service, "*") in NON_MODEL or (cli_service, operation) in NON_MODEL:
        return []
    service = CLI_SERVICE_NAMES.get(cli_service, cli_service)
    if service not in models.services:
        return [f"`aws {cli_service}`: no such service in botocore {models.version}'s models"]
    if operation == "wait":
        waiters = models.waiters(service)
        if len(words) < 3 or words[2] not in waiters:
            return [f"`aws {cli_service} wait {words[2] if len(words) > 2 else ''}`: no such waiter "
                    f"(the service's: {', '.join(sorted(waiters)) or 'none'})"]
        op = models.session.get_service_model(service).operation_model(waiters[words[2]])
        shown = f"aws {cli_service} wait {words[2]}"
    else:
        ops = models.operations(service)
        if operation not in ops:
            return [f"`aws {cli_service} {operation}`: no such operation in botocore {models.version}'s "
                    f"{service} model"]
        op = ops[operation]
        shown = f"aws {cli_service} {operation}"
    allowed = option_names(op) | set(CUSTOM_OPTIONS.get((cli_service, operation), ()))
    errs = []
    for name, _ in opts:
        if name not in allowed and name not in GLOBAL_OPTIONS:
            errs.append(f"`{shown}`: no option `{name}` (the operation {op.name} takes: "
                        f"{', '.join(sorted(allowed)) or 'none'})")
    return errs


def files():
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "deploy").rglob("*.md"))]


def check_text(rel, path_or_text, models):
    """(errors, commands checked) of one Markdown file."""
    path = path_or_text
    errs, count = [], 0
    for n, command in fenced_commands(path) + inline_commands(path):
        for args in invocations(command):
            count += 1
            errs += [f"{rel}:{n}: {e}" for e in check(args, models)]
    return errs, count


def selftest(models, tmp):
    """Planted mistakes must fail; right commands must pass."""
    text = (
        "```sh\n"
        "aws iam create-policy-version --policy-arn \"$P\" \\\n"
        "  --policy-document file://p.json --set-as-default   # ok\n"
        "X=$(aws iam get-role --role-name r --query Role.Arn --output text) ||\n"
        "  aws iam create-role --role-name r --assume-role-policy-document file://t.json\n"
        "aws iam create-polcy --policy-name x\n"
        "aws eks create-addon --cluster-name c --addon-name a --addon-verison v1\n"
        "aws iam wait role-exist --role-name r\n"
        "cat > t.json <<EOF\n"
        "aws iam not-a-command-but-a-heredoc-line\n"
        "EOF\n"
        "aws --region eu-west-1 eks update-kubeconfig --name c\n"
        "```\n"
        "Prose with `aws sqs get-queue-attributes --queue-url Q\n--attribute-names All` inline.\n"
        "And `aws autoscaling describe-tags --filterz x`.\n"
    )
    p = tmp / "selftest.md"
    p.write_text(text)
    errs, count = check_text("selftest.md", p, models)
    expect = [
        ("selftest.md:6:", "create-polcy"),
        ("selftest.md:7:", "--addon-verison"),
        ("selftest.md:8:", "role-exist"),
        ("selftest.md:16:", "--filterz"),
    ]
    problems = []
    for where, what in expect:
        if not any(e.startswith(where) and what in e for e in errs):
            problems.append(f"self-test: the planted {what!r} at {where} did not fail (errors: {errs})")
    if len(errs) != len(expect):
        problems.append(f"self-test: expected {len(expect)} failures, got {len(errs)}: {errs}")
    if count != 9:
        problems.append(f"self-test: expected 9 aws commands found, got {count}")
    return problems


def main():
    import tempfile
    models = Models()
    with tempfile.TemporaryDirectory() as tmp:
        errs = selftest(models, pathlib.Path(tmp))
    total, per_file = 0, []
    for p in files():
        rel = p.relative_to(ROOT).as_posix()
        e, n = check_text(rel, p, models)
        errs += e
        total += n
        if n:
            per_file.append(f"{rel} {n}")
    if errs:
        print(f"aws_cli_models.py: {len(errs)} failure(s):")
        for e in errs:
            print(f"  {e}")
        return 1
    print(f"ok   {total} aws command(s) in the docs exist in botocore {models.version}'s models "
          f"({', '.join(per_file)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

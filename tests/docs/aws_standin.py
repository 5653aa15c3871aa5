#!/usr/bin/env python3
"""A stand-in for the `aws` and `eksctl` commands of the docs' account steps (IAM, STS,
EKS add-ons and Pod Identity, ECR repositories), for tests/docs/commands.py.

It answers as the AWS CLI v2 does, from a state kept in a JSON file ($AWS_STANDIN_STATE)
so that a second run of the same page meets what the first one made: a create of
something that exists fails with AWS's error (`EntityAlreadyExists`, `ResourceInUse...`,
`RepositoryAlreadyExistsException`, exit 254, the CLI's message on stderr), a get of
something missing with `NoSuchEntity` / `ResourceNotFoundException`. Its arguments are
checked against botocore's model of the operation as the CLI does before it calls AWS
(an unknown option, a required one missing, an empty string where the model wants at
least one character, an unreadable `file://`: exit 252), and a policy document must be
JSON. `--query` is applied with JMESPath (botocore's) and `--output text` printed as the
CLI prints it. Operations it does not know fail (exit 2): commands.py runs only the
commands whose operations are in OPERATIONS. The models' part it needs is read once, by
commands.py (model_cache), into the file $AWS_STANDIN_MODELS: botocore is not loaded per call.

Usage: aws_standin.py aws ARGS... | aws_standin.py eksctl ARGS..."""

import datetime
import json
import os
import pathlib
import sys

import jmespath

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from aws_cli_models import GLOBAL_OPTIONS, split_options  # noqa: E402

ACCOUNT = "210987654321"
# What the stand-in holds before the page runs: an existing cluster-autoscaler release's
# role and its Pod Identity association (docs/quickstart-eks.md, "Moving an existing
# cluster-autoscaler Helm release"; commands.py's LIVE names the same).
SEED_ROLE = "cluster-autoscaler-live"
SEED_SERVICE_ACCOUNT = "cluster-autoscaler-aws-cluster-autoscaler"

OPERATIONS = {
    ("sts", "get-caller-identity"),
    ("iam", "create-policy"), ("iam", "get-policy"), ("iam", "list-policies"),
    ("iam", "list-policy-versions"), ("iam", "create-policy-version"), ("iam", "delete-policy-version"),
    ("iam", "get-role"), ("iam", "create-role"), ("iam", "update-assume-role-policy"),
    ("iam", "attach-role-policy"),
    ("eks", "describe-cluster"), ("eks", "describe-addon"), ("eks", "create-addon"),
    ("eks", "list-pod-identity-associations"), ("eks", "create-pod-identity-association"),
    ("eks", "update-pod-identity-association"), ("eks", "describe-pod-identity-association"),
    ("ecr", "describe-repositories"), ("ecr", "create-repository"),
}
EKSCTL = {("utils", "associate-iam-oidc-provider")}


class AwsError(Exception):
    def __init__(self, code, message):
        super().__init__(message)
        self.code = code


def seed():
    role_arn = f"arn:aws:iam::{ACCOUNT}:role/{SEED_ROLE}"
    return {
        "policies": {}, "roles": {SEED_ROLE: {"arn": role_arn, "trust": {}, "attached": []}},
        "addons": [], "repositories": [],
        # cluster None: the association is there on whatever cluster the page names.
        "associations": [{"id": "a-live0000000000000", "cluster": None, "namespace": "kube-system",
                          "serviceAccount": SEED_SERVICE_ACCOUNT, "roleArn": role_arn}],
        "calls": [],
    }


def load(path):
    return json.loads(path.read_text()) if path.exists() else seed()


def now():
    return datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc).isoformat()


def document(p, key):
    try:
        return json.loads(p[key])
    except (KeyError, ValueError) as e:
        raise AwsError("MalformedPolicyDocument", f"Syntax errors in policy: {e}")


def policy_by_arn(state, arn):
    pol = state["policies"].get(arn)
    if pol is None:
        raise AwsError("NoSuchEntity", f"Policy {arn} does not exist or is not attachable.")
    return pol


def policy_view(arn, pol):
    default = next(v["id"] for v in pol["versions"] if v["default"])
    return {"PolicyName": pol["name"], "PolicyId": "ANPASTANDIN", "Arn": arn, "Path": "/",
            "DefaultVersionId": default, "AttachmentCount": pol["attachments"], "IsAttachable": True,
            "CreateDate": now(), "UpdateDate": now()}


def role_by_name(state, name):
    role = state["roles"].get(name)
    if role is None:
        raise AwsError("NoSuchEntity", f"The role with name {name} cannot be found.")
    return role


def cluster_matches(assoc, cluster):
    return assoc["cluster"] in (None, cluster)


def association_view(a, cluster):
    return {"clusterName": cluster, "namespace": a["namespace"], "serviceAccount": a["serviceAccount"],
            "roleArn": a["roleArn"], "associationId": a["id"],
            "associationArn": f"arn:aws:eks:eu-west-1:{ACCOUNT}:podidentityassociation/{cluster}/{a['id']}"}


def call(state, service, op, p, region):
    if (service, op) == ("sts", "get-caller-identity"):
        return {"UserId": "AIDASTANDIN", "Account": ACCOUNT, "Arn": f"arn:aws:iam::{ACCOUNT}:user/standin"}
    if service == "iam":
        if op == "create-policy":
            arn = f"arn:aws:iam::{ACCOUNT}:policy/{p['PolicyName']}"
            if arn in state["policies"]:
                raise AwsError("EntityAlreadyExists",
                               f"A policy called {p['PolicyName']} already exists. Duplicate names are not allowed.")
            document(p, "PolicyDocument")
            state["policies"][arn] = {"name": p["PolicyName"], "attachments": 0, "next": 2,
                                      "versions": [{"id": "v1", "default": True, "doc": p["PolicyDocument"]}]}
            return {"Policy": policy_view(arn, state["policies"][arn])}
        if op == "get-policy":
            return {"Policy": policy_view(p["PolicyArn"], policy_by_arn(state, p["PolicyArn"]))}
        if op == "list-policies":
            return {"Policies": [policy_view(a, pol) for a, pol in state["policies"].items()], "IsTruncated": False}
        if op == "list-policy-versions":
            pol = policy_by_arn(state, p["PolicyArn"])
            return {"Versions": [{"VersionId": v["id"], "IsDefaultVersion": v["default"], "CreateDate": now()}
                                 for v in pol["versions"]], "IsTruncated": False}
        if op == "create-policy-version":
            pol = policy_by_arn(state, p["PolicyArn"])
            document(p, "PolicyDocument")
            if len(pol["versions"]) >= 5:
                raise AwsError("LimitExceeded", "A managed policy can have up to 5 versions. Before you create a "
                               "new version, you must delete an existing version.")
            v = {"id": f"v{pol['next']}", "default": False, "doc": p["PolicyDocument"]}
            pol["next"] += 1
            if p.get("SetAsDefault"):
                for old in pol["versions"]:
                    old["default"] = False
                v["default"] = True
            pol["versions"].append(v)
            return {"PolicyVersion": {"VersionId": v["id"], "IsDefaultVersion": v["default"], "CreateDate": now()}}
        if op == "delete-policy-version":
            pol = policy_by_arn(state, p["PolicyArn"])
            v = next((v for v in pol["versions"] if v["id"] == p["VersionId"]), None)
            if v is None:
                raise AwsError("NoSuchEntity", f"Policy {p['PolicyArn']} version {p['VersionId']} does not exist.")
            if v["default"]:
                raise AwsError("DeleteConflict", "Cannot delete the default version of a policy.")
            pol["versions"].remove(v)
            return None
        if op == "get-role":
            role = role_by_name(state, p["RoleName"])
            return {"Role": {"RoleName": p["RoleName"], "RoleId": "AROASTANDIN", "Arn": role["arn"], "Path": "/",
                             "CreateDate": now(), "AssumeRolePolicyDocument": role["trust"]}}
        if op == "create-role":
            if p["RoleName"] in state["roles"]:
                raise AwsError("EntityAlreadyExists", f"Role with name {p['RoleName']} already exists.")
            arn = f"arn:aws:iam::{ACCOUNT}:role/{p['RoleName']}"
            state["roles"][p["RoleName"]] = {"arn": arn, "trust": document(p, "AssumeRolePolicyDocument"),
                                             "attached": []}
            return {"Role": {"RoleName": p["RoleName"], "Arn": arn, "Path": "/", "CreateDate": now()}}
        if op == "update-assume-role-policy":
            role_by_name(state, p["RoleName"])["trust"] = document(p, "PolicyDocument")
            return None
        if op == "attach-role-policy":
            role = role_by_name(state, p["RoleName"])
            pol = policy_by_arn(state, p["PolicyArn"])
            if p["PolicyArn"] not in role["attached"]:  # attaching twice changes nothing, as in AWS
                role["attached"].append(p["PolicyArn"])
                pol["attachments"] += 1
            return None
    if service == "eks":
        cluster = p.get("ClusterName") or p.get("Name")
        if op == "describe-cluster":
            return {"cluster": {"name": cluster, "status": "ACTIVE", "identity": {
                "oidc": {"issuer": f"https://oidc.eks.{region}.amazonaws.com/id/STANDIN0123456789"}}}}
        if op in ("describe-addon", "create-addon"):
            exists = [cluster, p["AddonName"]] in state["addons"]
            if op == "describe-addon":
                if not exists:
                    raise AwsError("ResourceNotFoundException", f"No addon: {p['AddonName']} found in cluster: {cluster}")
                return {"addon": {"addonName": p["AddonName"], "clusterName": cluster, "status": "ACTIVE"}}
            if exists:
                raise AwsError("ResourceInUseException", "Addon already exists.")
            state["addons"].append([cluster, p["AddonName"]])
            return {"addon": {"addonName": p["AddonName"], "clusterName": cluster, "status": "CREATING"}}
        assocs = [a for a in state["associations"] if cluster_matches(a, cluster)]
        if op == "list-pod-identity-associations":
            found = [a for a in assocs if p.get("Namespace") in (None, a["namespace"])
                     and p.get("ServiceAccount") in (None, a["serviceAccount"])]
            return {"associations": [{k: v for k, v in association_view(a, cluster).items() if k != "roleArn"}
                                     for a in found]}
        if op == "create-pod-identity-association":
            same = [a for a in assocs if (a["namespace"], a["serviceAccount"]) == (p["Namespace"], p["ServiceAccount"])]
            if same:
                raise AwsError("ResourceInUseException", f"Association already exists: {same[0]['id']}")
            a = {"id": f"a-standin{len(state['associations']):011d}", "cluster": cluster,
                 "namespace": p["Namespace"], "serviceAccount": p["ServiceAccount"], "roleArn": p["RoleArn"]}
            state["associations"].append(a)
            return {"association": association_view(a, cluster)}
        if op in ("update-pod-identity-association", "describe-pod-identity-association"):
            a = next((a for a in assocs if a["id"] == p["AssociationId"]), None)
            if a is None:
                raise AwsError("ResourceNotFoundException", f"Association {p['AssociationId']} not found.")
            if op == "update-pod-identity-association" and "RoleArn" in p:
                a["roleArn"] = p["RoleArn"]
            return {"association": association_view(a, cluster)}
    if service == "ecr":
        names = p.get("RepositoryNames") or [p.get("RepositoryName")]
        if op == "describe-repositories":
            missing = [n for n in names if n not in state["repositories"]]
            if missing:
                raise AwsError("RepositoryNotFoundException", f"The repository with name '{missing[0]}' does not "
                               f"exist in the registry with id '{ACCOUNT}'")
            return {"repositories": [{"repositoryName": n, "registryId": ACCOUNT} for n in names]}
        if op == "create-repository":
            if names[0] in state["repositories"]:
                raise AwsError("RepositoryAlreadyExistsException", f"The repository with name '{names[0]}' already "
                               f"exists in the registry with id '{ACCOUNT}'")
            state["repositories"].append(names[0])
            return {"repository": {"repositoryName": names[0], "registryId": ACCOUNT}}
    raise NotImplementedError(f"{service} {op}")


def text(value):
    """The AWS CLI's `--output text` of a --query result (scalars, lists of them, rows)."""
    if value is None:
        return "None"
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, (str, int, float)):
        return str(value)
    if isinstance(value, list):
        if all(not isinstance(v, (list, dict)) for v in value):
            return "\t".join(text(v) for v in value)
        return "\n".join(text(v) for v in value)
    if isinstance(value, dict) and all(not isinstance(v, (list, dict)) for v in value.values()):
        return "\t".join(text(v) for v in value.values())
    raise SystemExit(f"aws stand-in: --output text of {value!r} is not implemented")


def model_cache():
    """For each operation of OPERATIONS, from botocore's models: its name, and for each
    option the input member (its name with a capital: IAM's `RoleName`, EKS's
    `clusterName`), the member's type and least length, and the required members."""
    from aws_cli_models import Models
    from botocore import xform_name
    models, out = Models(), {}
    for service, op in sorted(OPERATIONS):
        model = models.operations(service)[op]
        out[f"{service} {op}"] = {
            "name": model.name,
            "options": {"--" + xform_name(m, "-"): [m[:1].upper() + m[1:], sh.type_name, sh.metadata.get("min", 0)]
                        for m, sh in model.input_shape.members.items()},
            "required": [m[:1].upper() + m[1:] for m in model.input_shape.required_members],
        }
    return out


def params(models, service, op_name, opts):
    """The operation's input from the options, checked as the CLI checks it (exit 252)."""
    op = models[f"{service} {op_name}"]
    members = op["options"]
    out, unknown = {}, []
    for name, value in opts:
        if name in GLOBAL_OPTIONS:
            continue
        neg = name.startswith("--no-") and "--" + name[5:] in members
        if name not in members and not neg:
            unknown.append(name)
            continue
        member, type_name, least = members["--" + name[5:]] if neg else members[name]
        if type_name == "boolean":
            out[member] = not neg
            continue
        if value is None:
            fail(252, f"\naws: error: argument {name}: expected one argument\n")
        if value.startswith("file://"):
            try:
                value = pathlib.Path(value[len("file://"):]).read_text()
            except OSError as e:
                fail(252, f"\nError parsing parameter '{name}': Unable to load paramfile {value}: {e}\n")
        if type_name == "string" and len(value) < least:
            fail(252, f"\nParameter validation failed:\nInvalid length for parameter {member}, value: {len(value)}, "
                      f"valid min length: {least}\n")
        out[member] = [value] if type_name == "list" else value
    if unknown:
        fail(252, f"\naws: error: Unknown options: {', '.join(unknown)}\n")
    missing = [m for m in op["required"] if m not in out]
    if missing:
        fail(252, "\naws: error: the following arguments are required: "
                  + ", ".join(o for o, (m, _, _) in members.items() if m in missing) + "\n")
    return op["name"], out


def fail(code, message):
    sys.stderr.write(message)
    sys.exit(code)


def main(argv):
    state_path = pathlib.Path(os.environ["AWS_STANDIN_STATE"])
    state = load(state_path)
    tool, args = argv[0], argv[1:]
    state["calls"].append([tool, *args])
    try:
        if tool == "eksctl":
            if tuple(args[:2]) not in EKSCTL:
                fail(2, f"eksctl stand-in: `eksctl {' '.join(args[:2])}` is not implemented\n")
            # eksctl adds the provider once and says so when it is already there.
            print("[i]  IAM Open ID Connect provider is associated with the cluster")
            return 0
        i = 0
        while i < len(args) and args[i].startswith("--"):
            i += 2 if GLOBAL_OPTIONS.get(args[i]) else 1
        words, opts = split_options(args[i:])
        service, op = words[0], words[1]
        if (service, op) not in OPERATIONS:
            fail(2, f"aws stand-in: `aws {service} {op}` is not implemented\n")
        o = dict(opts)
        region = o.get("--region") or os.environ.get("AWS_REGION") or "us-east-1"
        models = json.loads(pathlib.Path(os.environ["AWS_STANDIN_MODELS"]).read_text())
        op_name, p = params(models, service, op, opts)
        try:
            result = call(state, service, op, p, region)
        except AwsError as e:
            fail(254, f"\nAn error occurred ({e.code}) when calling the {op_name} operation: {e}\n")
        if result is None:
            return 0
        if "--query" in o:
            result = jmespath.search(o["--query"], result)
        if o.get("--output") == "text":
            out = text(result)
            if out:
                print(out)
        else:
            print(json.dumps(result, indent=4))
        return 0
    finally:
        state_path.write_text(json.dumps(state, indent=1))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

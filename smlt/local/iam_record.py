"""Every AWS call the local handlers make, checked against their role's policies in the
synthesized template: moto enforces no IAM, so without this a call a role may not make passes
every local test and fails on AWS.

Recording: a botocore client plugin (``BOTOCORE_EXPERIMENTAL__PLUGINS``, read when a client is
made) registers ``before-parameter-build`` on each client of a handler process; when
``SMLT_IAM_RECORD`` names a file and the process runs a function (``AWS_LAMBDA_FUNCTION_NAME``),
each call is appended to that file as one JSON line: the function, the operation, and the IAM
requests it makes (action, resource ARN, condition keys: ``requests``). The engine passes both
variables on to its handler processes when they are set at its start (``enable``).

Enforcing: with ``SMLT_IAM_ENFORCE`` naming a file that :meth:`RolePolicies.write` wrote (set the
variable before the engine starts, write the file after: a test turns enforcement on and off by
writing and removing it), a handler's call its role may not make is refused in the handler as
AWS refuses it: a ``ClientError`` with S3's ``AccessDenied`` (``403`` for a HEAD, which has no
body) or the other services' ``AccessDeniedException``, and AWS's message ``User: <role session>
is not authorized to perform: <action> on resource: <arn> because no identity-based policy
allows the <action> action``. A GetObject of an object stored with SSE-KMS also needs
``kms:Decrypt`` on its key (through S3: ``kms:ViaService``), as on AWS.

Checking: :class:`RolePolicies` reads the template's ``AWS::IAM::Policy`` statements of each
function's role, resolves their intrinsics with the engine's own :class:`~smlt.local.resolve.Resolver`
(the local names and ARNs the calls use) and evaluates each request as IAM does for one
identity policy: an explicit Deny wins, else some Allow must match action, resource and
conditions. Resource policies (bucket policies) and permission boundaries are not evaluated.
An operation this module cannot map to IAM actions is denied (``unmapped``), so a new kind of
call is looked at rather than passed.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .resolve import ACCOUNT, FUNCTION, Resolver

ENV_FILE = "SMLT_IAM_RECORD"
ENFORCE_ENV = "SMLT_IAM_ENFORCE"
PLUGINS_ENV = "BOTOCORE_EXPERIMENTAL__PLUGINS"
PLUGIN = "smlt_iam=smlt.local.iam_record"


def enable(path: str | os.PathLike[str], enforce: str | os.PathLike[str] | None = None) -> dict[str, str]:
    """The environment that makes handler processes record their calls into ``path`` (set it in
    ``os.environ`` before the engine starts: the engine passes it on to its handlers) and, with
    ``enforce``, refuse the calls the policies :meth:`RolePolicies.write` writes there deny."""
    return {ENV_FILE: str(path), PLUGINS_ENV: PLUGIN, **({ENFORCE_ENV: str(enforce)} if enforce else {})}


# --------------------------------------------------------------------------------------------
# recording (runs in the handler processes)


def initialize_client_plugin(client: Any) -> None:
    """botocore's plugin entry point: called for every client made while the plugin is named."""
    client.meta.events.register("before-parameter-build", _record)


def _record(params: dict[str, Any], model: Any, **_: Any) -> None:
    path = os.environ.get(ENV_FILE)
    function = os.environ.get("AWS_LAMBDA_FUNCTION_NAME")
    if not path or not function:  # the engine's own calls, a client process: not a handler
        return
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
    service = model.service_model.signing_name
    reqs = requests(service, model.name, params, region)
    policies = _enforced()
    if policies is not None and service == "s3" and model.name == "GetObject":
        reqs += _kms_requests(params, region)
    line = {"function": function, "operation": f"{service}:{model.name}", "requests": [r.__dict__ for r in reqs]}
    with open(path, "a", encoding="utf-8") as f:  # one short append per call: atomic on POSIX
        f.write(json.dumps(line) + "\n")
    if policies is not None and function in policies.statements:  # another stack's function: not ours
        for r in reqs:
            if not policies.allowed(function, r):
                raise access_denied(service, model.name, r, policies.roles.get(function, ""), function)


# --------------------------------------------------------------------------------------------
# enforcing (runs in the handler processes)

_ENFORCED: tuple[str, float, RolePolicies] | None = None


def _enforced() -> RolePolicies | None:
    """The policies of ``SMLT_IAM_ENFORCE`` when that file exists (read again when it changes)."""
    global _ENFORCED
    path = os.environ.get(ENFORCE_ENV)
    if not path:
        return None
    try:
        mtime = os.stat(path).st_mtime
    except FileNotFoundError:
        return None
    if _ENFORCED is None or _ENFORCED[:2] != (path, mtime):
        _ENFORCED = (path, mtime, RolePolicies.read(path))
    return _ENFORCED[2]


def _kms_requests(params: dict[str, Any], region: str) -> list[Request]:
    """kms:Decrypt on the key of an SSE-KMS object (S3 decrypts its data key with the caller's
    rights, through S3: kms:ViaService), looked up with a client that records nothing."""
    import boto3
    from botocore.exceptions import ClientError as _ClientError

    global _HEAD_CLIENT
    if _HEAD_CLIENT is None:
        _HEAD_CLIENT = boto3.session.Session().client("s3", region_name=region)
        _HEAD_CLIENT.meta.events.unregister("before-parameter-build", _record)  # its HEADs are not the handler's
    try:
        head = _HEAD_CLIENT.head_object(Bucket=params.get("Bucket", ""), Key=params.get("Key", ""))
    except _ClientError:
        return []  # no such object: S3 answers that, not KMS
    key = head.get("SSEKMSKeyId")
    if head.get("ServerSideEncryption") != "aws:kms" or not key:
        return []
    arn = key if key.startswith("arn:") else f"arn:aws:kms:{region}:{ACCOUNT}:key/{key}"
    key_region = arn.split(":")[3]
    return [Request("kms:Decrypt", arn, {"kms:ViaService": f"s3.{key_region}.amazonaws.com"})]


_HEAD_CLIENT: Any = None
# Operations without a response body: AWS's 403 to them carries a bare status code.
_NO_BODY = {"HeadObject", "HeadBucket"}


def access_denied(service: str, operation: str, req: Request, role_arn: str, function: str) -> Exception:
    """The ``ClientError`` AWS answers a call with that the caller's identity policy does not allow."""
    from botocore.exceptions import ClientError

    role = role_arn.rsplit("/", 1)[-1] or function
    principal = f"arn:aws:sts::{ACCOUNT}:assumed-role/{role}/{function}"
    resource = f'"{req.resource}"' if service == "s3" else req.resource
    message = (
        f"User: {principal} is not authorized to perform: {req.action} on resource: {resource} "
        f"because no identity-based policy allows the {req.action} action"
    )
    if service == "s3" and operation in _NO_BODY:
        error = {"Code": "403", "Message": "Forbidden"}
    elif service == "s3":
        error = {"Code": "AccessDenied", "Message": message}
    else:
        error = {"Code": "AccessDeniedException", "Message": message}
    status = {"HTTPStatusCode": 403 if service in ("s3", "lambda", "kms") else 400}
    return ClientError({"Error": error, "ResponseMetadata": status}, operation)


@dataclass(frozen=True)
class Request:
    """One authorization IAM makes for a call: action, resource ARN, condition keys."""

    action: str
    resource: str
    context: dict[str, str] = field(default_factory=dict)


def _s3_object(bucket: str, key: str) -> str:
    return f"arn:aws:s3:::{bucket}/{key}"


def _copy_source(src: Any) -> tuple[str, str]:
    if isinstance(src, dict):
        return src["Bucket"], src["Key"]
    bucket, _, key = str(src).lstrip("/").partition("/")
    return bucket, key.split("?versionId=")[0]


_S3_OBJECT_ACTIONS = {
    "GetObject": "s3:GetObject",
    "HeadObject": "s3:GetObject",
    "PutObject": "s3:PutObject",
    "CreateMultipartUpload": "s3:PutObject",
    "UploadPart": "s3:PutObject",
    "CompleteMultipartUpload": "s3:PutObject",
    "AbortMultipartUpload": "s3:AbortMultipartUpload",
    "DeleteObject": "s3:DeleteObject",
    "GetObjectTagging": "s3:GetObjectTagging",
    "PutObjectTagging": "s3:PutObjectTagging",
}
_DDB_TRANSACT = {
    "Put": "PutItem",
    "Update": "UpdateItem",
    "Delete": "DeleteItem",
    "ConditionCheck": "ConditionCheckItem",
}
_SFN_RESOURCE = {"stateMachineArn", "executionArn"}


def _s3(op: str, p: dict[str, Any]) -> list[Request]:
    bucket = p.get("Bucket", "")
    if op in _S3_OBJECT_ACTIONS:
        out = [Request(_S3_OBJECT_ACTIONS[op], _s3_object(bucket, p.get("Key", "")))]
        if op in ("PutObject", "CreateMultipartUpload") and p.get("Tagging"):
            out.append(Request("s3:PutObjectTagging", _s3_object(bucket, p["Key"])))
        return out
    if op == "CopyObject":
        sb, sk = _copy_source(p.get("CopySource"))
        out = [Request("s3:PutObject", _s3_object(bucket, p["Key"])), Request("s3:GetObject", _s3_object(sb, sk))]
        if p.get("Tagging"):
            out.append(Request("s3:PutObjectTagging", _s3_object(bucket, p["Key"])))
        return out
    if op == "DeleteObjects":
        return [Request("s3:DeleteObject", _s3_object(bucket, o["Key"])) for o in p["Delete"]["Objects"]]
    if op in ("ListObjectsV2", "ListObjects"):
        ctx = {"s3:prefix": p["Prefix"]} if "Prefix" in p else {}
        return [Request("s3:ListBucket", f"arn:aws:s3:::{bucket}", ctx)]
    if op == "HeadBucket":
        return [Request("s3:ListBucket", f"arn:aws:s3:::{bucket}")]
    if op == "ListMultipartUploads":
        return [Request("s3:ListBucketMultipartUploads", f"arn:aws:s3:::{bucket}")]
    return [Request(f"unmapped:s3:{op}", f"arn:aws:s3:::{bucket}")]


def _dynamodb(op: str, p: dict[str, Any], region: str) -> list[Request]:
    def table(name: str, index: str | None = None) -> str:
        arn = f"arn:aws:dynamodb:{region}:{ACCOUNT}:table/{name}"
        return f"{arn}/index/{index}" if index else arn

    if op in ("BatchGetItem", "BatchWriteItem"):
        return [Request(f"dynamodb:{op}", table(t)) for t in p.get("RequestItems", {})]
    if op == "TransactWriteItems":
        return [
            Request(f"dynamodb:{_DDB_TRANSACT[kind]}", table(body["TableName"]))
            for item in p.get("TransactItems", [])
            for kind, body in item.items()
        ]
    if op == "TransactGetItems":
        return [Request("dynamodb:GetItem", table(i["Get"]["TableName"])) for i in p.get("TransactItems", [])]
    if "TableName" in p:
        return [Request(f"dynamodb:{op}", table(p["TableName"], p.get("IndexName")))]
    return [Request(f"unmapped:dynamodb:{op}", "*")]


def requests(service: str, op: str, p: dict[str, Any], region: str) -> list[Request]:
    """The IAM authorizations of one call (empty: the call needs none, as sts:GetCallerIdentity)."""
    if service == "s3":
        return _s3(op, p)
    if service == "dynamodb":
        return _dynamodb(op, p, region)
    if service == "states":
        arns = [p[k] for k in _SFN_RESOURCE if k in p]
        return [Request(f"states:{op}", a) for a in arns] or [Request(f"states:{op}", "*")]
    if service == "lambda":
        if op == "GetAccountSettings":
            return [Request("lambda:GetAccountSettings", "*")]
        fn = p.get("FunctionName", "")
        arn = fn if fn.startswith("arn:") else f"arn:aws:lambda:{region}:{ACCOUNT}:function:{fn}"
        return [Request(f"lambda:{op}", arn)]
    if service == "sns" and op == "Publish":
        return [Request("sns:Publish", p.get("TopicArn") or p.get("TargetArn", ""))]
    if service == "sts" and op == "GetCallerIdentity":
        return []
    return [Request(f"unmapped:{service}:{op}", "*")]


# --------------------------------------------------------------------------------------------
# checking (the test process)


def _as_list(x: Any) -> list[Any]:
    return x if isinstance(x, list) else [x]


def _glob(pattern: str, value: str, *, case: bool = True) -> bool:
    """IAM's wildcards: `*` any run of characters (a "/" too), `?` one character."""
    rx = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.fullmatch(rx, value, 0 if case else re.IGNORECASE) is not None


_OPERATORS = {
    "StringLike": lambda pats, v: any(_glob(p, v) for p in pats),
    "StringEquals": lambda pats, v: v in pats,
    "StringNotLike": lambda pats, v: not any(_glob(p, v) for p in pats),
    "StringNotEquals": lambda pats, v: v not in pats,
}


class UnsupportedCondition(ValueError):
    """A policy condition this checker does not evaluate (it refuses rather than guesses)."""


def _conditions_hold(conditions: dict[str, Any], context: dict[str, str]) -> bool:
    for operator, tests in conditions.items():
        if operator not in _OPERATORS:
            raise UnsupportedCondition(f"condition operator {operator} (supported: {sorted(_OPERATORS)})")
        for key, values in tests.items():
            if key not in context:  # IAM: a missing key does not match a String operator
                return False
            if not _OPERATORS[operator]([str(v) for v in _as_list(values)], context[key]):
                return False
    return True


def _matches(statement: dict[str, Any], req: Request) -> bool:
    actions = _as_list(statement.get("Action", []))
    if not any(_glob(a, req.action, case=False) for a in actions):
        return False
    if not any(_glob(str(r), req.resource) for r in _as_list(statement.get("Resource", []))):
        return False
    return _conditions_hold(statement.get("Condition") or {}, req.context)


@dataclass(frozen=True)
class Denial:
    function: str
    operation: str
    request: Request

    def __str__(self) -> str:
        ctx = f" {self.request.context}" if self.request.context else ""
        return f"{self.function}: {self.operation} needs {self.request.action} on {self.request.resource}{ctx}"


def role_statements(template: dict[str, Any], resolver: Resolver) -> dict[str, list[dict[str, Any]]]:
    """The ``AWS::IAM::Policy`` statements of each role (its logical id), resolved to local ARNs."""
    by_role: dict[str, list[dict[str, Any]]] = {}
    for lid, res in template["Resources"].items():
        if res["Type"] != "AWS::IAM::Policy":
            continue
        statements = resolver.resolve(res["Properties"]["PolicyDocument"]["Statement"], f"{lid}.PolicyDocument")
        for role in res["Properties"].get("Roles", []):
            by_role.setdefault(role["Ref"], []).extend(statements)
    return by_role


def allows(statements: list[dict[str, Any]], req: Request) -> bool:
    """One identity policy's answer, as IAM evaluates it: an explicit Deny wins, else an Allow must match."""
    if req.action.startswith("unmapped:"):
        return False
    if any(s["Effect"] == "Deny" and _matches(s, req) for s in statements):
        return False
    return any(s["Effect"] == "Allow" and _matches(s, req) for s in statements)


class RolePolicies:
    """The identity-policy statements of each function's role, resolved to local ARNs."""

    def __init__(self, template: dict[str, Any], resolver: Resolver) -> None:
        resources = template["Resources"]
        by_role = role_statements(template, resolver)
        self.statements: dict[str, list[dict[str, Any]]] = {}  # function name -> its role's statements
        self.roles: dict[str, str] = {}  # function name -> its role's (local) ARN
        for lid in resolver.of_type(FUNCTION):
            role = resources[lid]["Properties"]["Role"]["Fn::GetAtt"][0]
            self.statements[resolver.local(lid).name] = by_role.get(role, [])
            self.roles[resolver.local(lid).name] = resolver.local(role).arn or ""

    def write(self, path: str | os.PathLike[str]) -> None:
        """The policies as the file ``SMLT_IAM_ENFORCE`` names (written whole, then renamed in)."""
        tmp = Path(f"{path}.tmp")
        tmp.write_text(json.dumps({"statements": self.statements, "roles": self.roles}), encoding="utf-8")
        tmp.replace(path)

    @staticmethod
    def read(path: str | os.PathLike[str]) -> RolePolicies:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        policies = object.__new__(RolePolicies)
        policies.statements, policies.roles = data["statements"], data["roles"]
        return policies

    def allowed(self, function: str, req: Request) -> bool:
        statements = self.statements.get(function)
        return statements is not None and allows(statements, req)

    def without(self, function_prefix: str, action: str, resource_part: str) -> RolePolicies:
        """A copy with `action` removed from the statements of the functions named `function_prefix...`
        whose resources contain `resource_part` (the test that the check fails on a removed grant)."""
        other = object.__new__(RolePolicies)
        other.statements, other.roles = {}, dict(self.roles)
        for fn, sts in self.statements.items():
            kept = []
            for s in sts:
                hit = fn.startswith(function_prefix) and any(resource_part in str(r) for r in _as_list(s["Resource"]))
                actions = [a for a in _as_list(s["Action"]) if not (hit and a == action)]
                if actions:
                    kept.append({**s, "Action": actions})
            other.statements[fn] = kept
        return other


@dataclass
class Report:
    calls: int = 0
    requests: int = 0
    denied: list[Denial] = field(default_factory=list)
    by_function: dict[str, int] = field(default_factory=dict)

    def summary(self, limit: int = 20) -> str:
        head = f"{self.calls} calls ({self.requests} authorizations), {len(self.denied)} denied"
        unique = sorted({str(d) for d in self.denied})
        return "\n".join([head, *unique[:limit]])


def read(path: str | os.PathLike[str], start: int = 0) -> tuple[list[dict[str, Any]], int]:
    """The recorded calls from byte offset `start` on, and the offset after them."""
    p = Path(path)
    if not p.exists():
        return [], start
    with p.open("rb") as f:
        f.seek(start)
        data = f.read()
    end = start + data.rfind(b"\n") + 1 if data else start
    lines = data[: end - start].decode().splitlines()
    return [json.loads(line) for line in lines if line], end


def check(calls: Iterable[dict[str, Any]], policies: RolePolicies) -> Report:
    report = Report()
    for call in calls:
        report.calls += 1
        fn = call["function"]
        report.by_function[fn] = report.by_function.get(fn, 0) + 1
        for r in call["requests"]:
            req = Request(r["action"], r["resource"], r.get("context") or {})
            report.requests += 1
            if not policies.allowed(fn, req):
                report.denied.append(Denial(fn, call["operation"], req))
    return report

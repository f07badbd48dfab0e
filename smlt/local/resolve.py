"""Local physical names for the stack's resources, and the CloudFormation intrinsics the engine
needs resolved: in the state machine definition and in the Lambda functions' environment.

Names are deterministic (``<stack>-<LogicalId>``, shortened with a hash when a service limit
requires it), so two runs of the same app give the same names. ARNs use account
``123456789012``, region ``us-east-1`` and partition ``aws``.

Supported intrinsics: ``Ref`` (resources, parameters with a Default, pseudo parameters),
``Fn::GetAtt`` (the attributes in :data:`_ATTRS`), ``Fn::Join``, ``Fn::Sub``, ``Fn::Select``,
``Fn::Split``. Anything else raises
:class:`UnresolvableError` naming where it was found: the local engine would rather refuse than
guess. Resources the engine has no stand-in for (:data:`LOCAL_UNSUPPORTED`: the ElastiCache
exchange of CDK context ``redis_reducer: true``) are refused with what to do instead.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from smlt.stack_outputs import STATE_MACHINE as STATE_MACHINE_OUTPUT

ACCOUNT = "123456789012"
REGION = "us-east-1"
PARTITION = "aws"
URL_SUFFIX = "amazonaws.com"

STATE_MACHINE = "AWS::StepFunctions::StateMachine"
FUNCTION = "AWS::Lambda::Function"
BUCKET = "AWS::S3::Bucket"
TABLE = "AWS::DynamoDB::Table"
GLOBAL_TABLE = "AWS::DynamoDB::GlobalTable"
ROLE = "AWS::IAM::Role"


class UnresolvableError(ValueError):
    """An intrinsic or reference the local engine does not resolve."""


REDIS_REDUCER_HINT = (
    "the ElastiCache exchange of CDK context redis_reducer=true does not run on the local engine; "
    "synthesize with redis_reducer=false (cdk.json, or the engine's synth_context={'redis_reducer': False}) "
    "and, for a Redis exchange locally, set SMLT_EXCHANGE_URL=redis://127.0.0.1:PORT/0 to a local "
    "redis-server (smlt.local.redis_server.LocalRedisServer, scripts/redis.sh)"
)

# Resource types the local engine has no stand-in for: type -> what to do instead.
LOCAL_UNSUPPORTED: dict[str, str] = {
    "AWS::ElastiCache::ReplicationGroup": REDIS_REDUCER_HINT,
    "AWS::ElastiCache::ServerlessCache": REDIS_REDUCER_HINT,
    "AWS::ElastiCache::CacheCluster": REDIS_REDUCER_HINT,
}


def unsupported_resources(template: dict[str, Any]) -> list[str]:
    """One message per resource of ``template`` the local engine cannot run (empty: none)."""
    return [
        f"{lid} ({res.get('Type')}): {LOCAL_UNSUPPORTED[res.get('Type')]}"
        for lid, res in (template.get("Resources") or {}).items()
        if res.get("Type") in LOCAL_UNSUPPORTED
    ]


def _short_hash(text: str, n: int = 8) -> str:
    return hashlib.sha1(text.encode()).hexdigest()[:n]


def _fit(name: str, limit: int, key: str) -> str:
    """``name`` if it fits in ``limit`` characters, else a prefix plus a hash of ``key``."""
    if len(name) <= limit:
        return name
    h = _short_hash(key)
    return name[: limit - len(h) - 1].rstrip("-._") + "-" + h


def bucket_name(stack: str, logical_id: str) -> str:
    """S3 rules: 3-63 chars, lowercase letters, digits, '-' and '.', alphanumeric at both ends."""
    raw = re.sub(r"[^a-z0-9-]+", "-", f"{stack}-{logical_id}".lower()).strip("-")
    raw = re.sub(r"-{2,}", "-", raw) or "bucket"
    name = _fit(raw, 63, f"{stack}/{logical_id}")
    if len(name) < 3:
        name = (name + "-" + _short_hash(f"{stack}/{logical_id}"))[:63]
    return name


def _generic_name(stack: str, logical_id: str, limit: int, allowed: str = r"A-Za-z0-9_-") -> str:
    raw = re.sub(rf"[^{allowed}]+", "-", f"{stack}-{logical_id}").strip("-")
    return _fit(raw, limit, f"{stack}/{logical_id}")


# type -> (name limit, allowed chars regex class)
_NAME_RULES: dict[str, tuple[int, str]] = {
    FUNCTION: (64, r"A-Za-z0-9_-"),
    TABLE: (255, r"A-Za-z0-9_.-"),
    GLOBAL_TABLE: (255, r"A-Za-z0-9_.-"),
    ROLE: (64, r"A-Za-z0-9_+=,.@-"),
    STATE_MACHINE: (80, r"A-Za-z0-9_-"),
    "AWS::IAM::Policy": (128, r"A-Za-z0-9_+=,.@-"),
    "AWS::IAM::ManagedPolicy": (128, r"A-Za-z0-9_+=,.@-"),
    "AWS::Lambda::LayerVersion": (64, r"A-Za-z0-9_-"),
    "AWS::SNS::Topic": (256, r"A-Za-z0-9_-"),
    "AWS::SQS::Queue": (80, r"A-Za-z0-9_-"),
    "AWS::Events::Rule": (64, r"A-Za-z0-9_.-"),
    "AWS::Logs::LogGroup": (512, r"A-Za-z0-9_./#-"),
    "AWS::SSM::Parameter": (1011, r"A-Za-z0-9_./-"),
}

# explicit name property per type
_NAME_PROPERTY: dict[str, str] = {
    BUCKET: "BucketName",
    FUNCTION: "FunctionName",
    TABLE: "TableName",
    GLOBAL_TABLE: "TableName",
    ROLE: "RoleName",
    STATE_MACHINE: "StateMachineName",
    "AWS::SNS::Topic": "TopicName",
    "AWS::SQS::Queue": "QueueName",
    "AWS::Events::Rule": "Name",
    "AWS::Logs::LogGroup": "LogGroupName",
    "AWS::SSM::Parameter": "Name",
    "AWS::Lambda::LayerVersion": "LayerName",
    "AWS::IAM::ManagedPolicy": "ManagedPolicyName",
    "AWS::IAM::Policy": "PolicyName",
}


@dataclass(frozen=True)
class LocalResource:
    logical_id: str
    type: str
    name: str
    arn: str | None


def _arn(rtype: str, name: str, account: str, region: str) -> str | None:
    p = PARTITION
    return {
        BUCKET: f"arn:{p}:s3:::{name}",
        FUNCTION: f"arn:{p}:lambda:{region}:{account}:function:{name}",
        TABLE: f"arn:{p}:dynamodb:{region}:{account}:table/{name}",
        GLOBAL_TABLE: f"arn:{p}:dynamodb:{region}:{account}:table/{name}",
        ROLE: f"arn:{p}:iam::{account}:role/{name}",
        STATE_MACHINE: f"arn:{p}:states:{region}:{account}:stateMachine:{name}",
        "AWS::SNS::Topic": f"arn:{p}:sns:{region}:{account}:{name}",
        "AWS::SQS::Queue": f"arn:{p}:sqs:{region}:{account}:{name}",
        "AWS::Events::Rule": f"arn:{p}:events:{region}:{account}:rule/{name}",
        "AWS::Logs::LogGroup": f"arn:{p}:logs:{region}:{account}:log-group:{name}:*",
        "AWS::IAM::ManagedPolicy": f"arn:{p}:iam::{account}:policy/{name}",
        "AWS::Lambda::LayerVersion": f"arn:{p}:lambda:{region}:{account}:layer:{name}:1",
    }.get(rtype)


def _ref_value(r: LocalResource, account: str, region: str) -> str:
    """What ``Ref`` returns for this resource type (CloudFormation semantics)."""
    if r.type in (STATE_MACHINE, "AWS::SNS::Topic", "AWS::IAM::ManagedPolicy", "AWS::Lambda::LayerVersion"):
        return r.arn or r.name
    if r.type == "AWS::SQS::Queue":
        return f"https://sqs.{region}.{URL_SUFFIX}/{account}/{r.name}"
    return r.name


# (type, attribute) -> function(resource, account, region) -> value
_ATTRS: dict[tuple[str, str], Callable[[LocalResource, str, str], str | None]] = {
    (BUCKET, "Arn"): lambda r, a, g: r.arn,
    (BUCKET, "DomainName"): lambda r, a, g: f"{r.name}.s3.{URL_SUFFIX}",
    (BUCKET, "RegionalDomainName"): lambda r, a, g: f"{r.name}.s3.{g}.{URL_SUFFIX}",
    (BUCKET, "WebsiteURL"): lambda r, a, g: f"http://{r.name}.s3-website-{g}.{URL_SUFFIX}",
    (FUNCTION, "Arn"): lambda r, a, g: r.arn,
    (TABLE, "Arn"): lambda r, a, g: r.arn,
    (TABLE, "StreamArn"): lambda r, a, g: f"{r.arn}/stream/1970-01-01T00:00:00.000",
    (GLOBAL_TABLE, "Arn"): lambda r, a, g: r.arn,
    (GLOBAL_TABLE, "StreamArn"): lambda r, a, g: f"{r.arn}/stream/1970-01-01T00:00:00.000",
    (ROLE, "Arn"): lambda r, a, g: r.arn,
    (ROLE, "RoleId"): lambda r, a, g: "AROA" + _short_hash(r.name, 17).upper(),
    (STATE_MACHINE, "Arn"): lambda r, a, g: r.arn,
    (STATE_MACHINE, "Name"): lambda r, a, g: r.name,
    ("AWS::SNS::Topic", "TopicArn"): lambda r, a, g: r.arn,
    ("AWS::SNS::Topic", "TopicName"): lambda r, a, g: r.name,
    ("AWS::SQS::Queue", "Arn"): lambda r, a, g: r.arn,
    ("AWS::SQS::Queue", "QueueName"): lambda r, a, g: r.name,
    ("AWS::SQS::Queue", "QueueUrl"): lambda r, a, g: f"https://sqs.{g}.{URL_SUFFIX}/{a}/{r.name}",
    ("AWS::Events::Rule", "Arn"): lambda r, a, g: r.arn,
    ("AWS::Logs::LogGroup", "Arn"): lambda r, a, g: r.arn,
}


def _uses_jsonata(obj: Any) -> bool:
    if isinstance(obj, dict):
        if obj.get("QueryLanguage") == "JSONata":
            return True
        return any(_uses_jsonata(v) for v in obj.values())
    if isinstance(obj, list):
        return any(_uses_jsonata(v) for v in obj)
    return False


class Resolver:
    """Assigns local names to a template's resources and resolves intrinsics to them."""

    def __init__(
        self, template: dict[str, Any], stack_name: str, *, account: str = ACCOUNT, region: str = REGION
    ) -> None:
        self.template = template
        self.stack_name = stack_name
        self.account = account
        self.region = region
        self.resources: dict[str, dict[str, Any]] = template.get("Resources", {})
        self.parameters: dict[str, dict[str, Any]] = template.get("Parameters", {})
        self._local: dict[str, LocalResource] = {}
        self._naming: set[str] = set()

    # -- names -----------------------------------------------------------------------------

    @property
    def pseudo(self) -> dict[str, str]:
        return {
            "AWS::Region": self.region,
            "AWS::AccountId": self.account,
            "AWS::Partition": PARTITION,
            "AWS::URLSuffix": URL_SUFFIX,
            "AWS::StackName": self.stack_name,
            "AWS::StackId": (
                f"arn:{PARTITION}:cloudformation:{self.region}:{self.account}:"
                f"stack/{self.stack_name}/00000000-0000-0000-0000-000000000000"
            ),
        }

    def local(self, logical_id: str) -> LocalResource:
        """The local name and ARN of a resource (assigned on first use)."""
        if logical_id in self._local:
            return self._local[logical_id]
        res = self.resources.get(logical_id)
        if res is None:
            raise UnresolvableError(f"no resource {logical_id!r} in the template")
        if logical_id in self._naming:
            raise UnresolvableError(f"the name of {logical_id!r} depends on itself")
        self._naming.add(logical_id)
        try:
            rtype = res["Type"]
            prop = _NAME_PROPERTY.get(rtype)
            explicit = (res.get("Properties") or {}).get(prop) if prop else None
            if explicit is not None:
                name = self.resolve(explicit, where=f"{logical_id}.Properties.{prop}")
                if not isinstance(name, str):
                    raise UnresolvableError(f"{logical_id}.{prop} is not a string: {name!r}")
            elif rtype == BUCKET:
                name = bucket_name(self.stack_name, logical_id)
            else:
                limit, allowed = _NAME_RULES.get(rtype, (64, r"A-Za-z0-9_-"))
                name = _generic_name(self.stack_name, logical_id, limit, allowed)
            lr = LocalResource(logical_id, rtype, name, _arn(rtype, name, self.account, self.region))
        finally:
            self._naming.discard(logical_id)
        self._local[logical_id] = lr
        return lr

    def names(self) -> dict[str, str]:
        """logical id -> local physical name, for every resource in the template."""
        return {lid: self.local(lid).name for lid in self.resources}

    def arns(self) -> dict[str, str]:
        return {lid: lr.arn for lid in self.resources if (lr := self.local(lid)).arn}

    def of_type(self, *types: str) -> list[str]:
        return [lid for lid, r in self.resources.items() if r.get("Type") in types]

    # -- intrinsics ------------------------------------------------------------------------

    def ref(self, name: str, where: str = "") -> Any:
        if name in self.pseudo:
            return self.pseudo[name]
        if name == "AWS::NoValue":
            raise UnresolvableError(f"{where}: Ref AWS::NoValue (only meaningful inside Fn::If)")
        if name.startswith("AWS::"):
            raise UnresolvableError(f"{where}: unsupported pseudo parameter {name!r}")
        if name in self.parameters:
            p = self.parameters[name]
            if "Default" in p and not p.get("Type", "").startswith("AWS::SSM::"):
                return p["Default"]
            raise UnresolvableError(
                f"{where}: Ref to parameter {name!r} which has no local value "
                "(give it a Default or pass the value as CDK context)"
            )
        lr = self.local(name)
        self._refuse_unsupported(lr, f"Ref {name}", where)
        return _ref_value(lr, self.account, self.region)

    @staticmethod
    def _refuse_unsupported(lr: LocalResource, what: str, where: str) -> None:
        if lr.type in LOCAL_UNSUPPORTED:
            raise UnresolvableError(f"{where}: {what} ({lr.type}): {LOCAL_UNSUPPORTED[lr.type]}")

    def get_att(self, logical_id: str, attr: str, where: str = "") -> Any:
        lr = self.local(logical_id)
        self._refuse_unsupported(lr, f"Fn::GetAtt {logical_id}.{attr}", where)
        fn = _ATTRS.get((lr.type, attr))
        if fn is None:
            raise UnresolvableError(f"{where}: Fn::GetAtt {logical_id}.{attr} ({lr.type}) is not supported locally")
        value = fn(lr, self.account, self.region)
        if value is None:  # a resource the resolver gave no ARN
            raise UnresolvableError(f"{where}: Fn::GetAtt {logical_id}.{attr}: {lr.type} has no local ARN")
        return value

    def _sub(self, template: str, variables: dict[str, Any], where: str) -> str:
        def repl(m: re.Match[str]) -> str:
            expr = m.group(1)
            if expr.startswith("!"):
                return "${" + expr[1:] + "}"
            if expr in variables:
                return str(self.resolve(variables[expr], where=where))
            if "." in expr and not expr.startswith("AWS::"):
                lid, attr = expr.split(".", 1)
                return str(self.get_att(lid, attr, where=where))
            return str(self.ref(expr, where=where))

        return re.sub(r"\$\{([^}]*)\}", repl, template)

    def _split_select(self, key: str, arg: list[Any], where: str) -> Any:
        if key == "Fn::Split":
            delim, text = arg
            text = self.resolve(text, where)
            if not isinstance(text, str):
                raise UnresolvableError(f"{where}: Fn::Split needs a string, got {text!r}")
            return text.split(str(delim))
        index, items = arg
        items = self.resolve(items, where)
        if not isinstance(items, list) or not 0 <= int(index) < len(items):
            raise UnresolvableError(f"{where}: Fn::Select {index} of {items!r}")
        return items[int(index)]

    def resolve(self, value: Any, where: str = "$") -> Any:
        """Resolve every intrinsic in ``value`` (recursively). Raises on unsupported ones."""
        if isinstance(value, list):
            return [self.resolve(v, f"{where}[{i}]") for i, v in enumerate(value)]
        if not isinstance(value, dict):
            return value
        if len(value) == 1:
            ((key, arg),) = value.items()
            if key == "Ref":
                return self.ref(arg, where)
            if key == "Fn::GetAtt":
                if isinstance(arg, str):
                    arg = arg.split(".", 1)
                lid, attr = arg
                return self.get_att(lid, self.resolve(attr, where), where)
            if key == "Fn::Join":
                delim, parts = arg
                parts = self.resolve(parts, where)
                if not isinstance(parts, list):
                    raise UnresolvableError(f"{where}: Fn::Join needs a list, got {parts!r}")
                return str(delim).join(str(p) for p in parts)
            if key == "Fn::Sub":
                if isinstance(arg, str):
                    return self._sub(arg, {}, where)
                tmpl, variables = arg
                return self._sub(tmpl, variables or {}, where)
            if key in ("Fn::Split", "Fn::Select"):
                return self._split_select(key, arg, where)
            if key.startswith("Fn::") or key == "Condition":
                raise UnresolvableError(
                    f"{where}: intrinsic {key} is not supported by the local engine "
                    "(supported: Ref, Fn::GetAtt, Fn::Join, Fn::Sub, Fn::Select, Fn::Split)"
                )
        return {k: self.resolve(v, f"{where}.{k}") for k, v in value.items()}

    # -- the state machine -----------------------------------------------------------------

    def state_machine_id(self, logical_id: str | None = None) -> str:
        sms = self.of_type(STATE_MACHINE)
        if logical_id is not None:
            if logical_id not in sms:
                raise UnresolvableError(f"no state machine {logical_id!r}; the stack has {sms}")
            return logical_id
        if len(sms) == 1:
            return sms[0]
        # Several (the training and the study machine): the one the stack's StateMachineArn output names.
        ref = ((self.template.get("Outputs") or {}).get(STATE_MACHINE_OUTPUT, {}).get("Value") or {}).get("Ref")
        if ref in sms:
            return ref
        raise UnresolvableError(f"the stack has {len(sms)} state machines ({sms}); name the one to run")

    def definition(self, logical_id: str | None = None) -> dict[str, Any]:
        """The state machine definition with local names and ARNs, as a dict."""
        lid = self.state_machine_id(logical_id)
        props = self.resources[lid].get("Properties", {})
        where = f"{lid}.Properties"
        if "DefinitionString" in props:
            text = self.resolve(props["DefinitionString"], f"{where}.DefinitionString")
        elif "Definition" in props:
            text = json.dumps(self.resolve(props["Definition"], f"{where}.Definition"))
        else:
            raise UnresolvableError(
                f"{lid} has neither DefinitionString nor Definition (DefinitionS3Location is not supported locally)"
            )
        subs = props.get("DefinitionSubstitutions") or {}
        for key, val in subs.items():
            v = self.resolve(val, f"{where}.DefinitionSubstitutions.{key}")
            text = text.replace("${" + key + "}", str(v))
        try:
            definition = json.loads(text)
        except json.JSONDecodeError as e:
            raise UnresolvableError(f"{lid}: the resolved definition is not JSON: {e}") from e
        if _uses_jsonata(definition):
            raise UnresolvableError(
                f"{lid}: JSONata is not supported by the local engine (moto's interpreter); "
                "write the definition in JSONPath"
            )
        return definition

    def role_arn(self, logical_id: str | None = None) -> str:
        lid = self.state_machine_id(logical_id)
        role = self.resources[lid].get("Properties", {}).get("RoleArn")
        if role is None:
            return f"arn:{PARTITION}:iam::{self.account}:role/{self.stack_name}-local-sfn"
        return self.resolve(role, f"{lid}.Properties.RoleArn")


def resolve_definition(template: dict[str, Any], stack_name: str, logical_id: str | None = None) -> dict[str, Any]:
    """Shortcut: the resolved definition of the stack's (only) state machine."""
    return Resolver(template, stack_name).definition(logical_id)

"""The Redis reducer (context `redis_reducer: true`): ElastiCache exchange in a VPC of its own.

Checks the template synthesized with the option on (session fixture `redis_synth`), that the
default template has none of it, and what the local engine does with each.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest
from cdk_nag import AwsSolutionsChecks

from infra.stacks.exchange import ENGINE, REDIS_PORT
from infra.stacks.nag import REASONS
from tests.infra.conftest import DEFAULT_TIERS
from tests.infra.test_cfn_lint import ALLOWED_WARNINGS, _describe, _lint
from tests.infra.test_iam import STAR_RESOURCE_ACTIONS, _as_list, _grants, _statements
from tests.infra.test_nag import _acknowledgments, expected_wildcard

REPO = Path(__file__).resolve().parents[2]
TIERS = DEFAULT_TIERS
# The functions that open the exchange (Settings.exchange_store()): every train_step tier, aggregate.
IN_VPC = tuple(f"FunctionsTrainStep{mb}" for mb in TIERS) + ("FunctionsAggregate",)
ENI_DESCRIBE = {"ec2:DescribeNetworkInterfaces", "ec2:DescribeSubnets"}
ENI_ACTIONS = ENI_DESCRIBE | {
    "ec2:CreateNetworkInterface",
    "ec2:DeleteNetworkInterface",
    "ec2:AssignPrivateIpAddresses",
    "ec2:UnassignPrivateIpAddresses",
}


def _one(resources: dict, prefix: str = "") -> tuple[str, dict]:
    hits = [(k, v) for k, v in resources.items() if k.startswith(prefix)]
    assert len(hits) == 1, (prefix, list(resources))
    return hits[0]


def _functions(synth) -> dict[str, dict]:
    return synth.resources("AWS::Lambda::Function")


def _security_groups(synth) -> tuple[str, str]:
    """(functions' group, cache's group) logical ids."""
    sgs = synth.resources("AWS::EC2::SecurityGroup")
    fn_sg, _ = _one(sgs, "ExchangeFunctionsSecurityGroup")
    cache_sg, _ = _one(sgs, "ExchangeCacheSecurityGroup")
    assert len(sgs) == 2
    return fn_sg, cache_sg


def _group_id(lid: str) -> dict:
    return {"Fn::GetAtt": [lid, "GroupId"]}


# ------------------------------------------------------------------ the cache
def test_cache_encrypted_in_transit_and_at_rest(redis_synth):
    ((rg_id, rg),) = redis_synth.resources("AWS::ElastiCache::ReplicationGroup").items()
    props = rg["Properties"]
    assert props["TransitEncryptionEnabled"] is True
    assert props["TransitEncryptionMode"] == "required"
    assert props["AtRestEncryptionEnabled"] is True
    assert props["Engine"] == ENGINE == "valkey"
    assert props["Port"] == REDIS_PORT != 6379
    assert props["NumCacheClusters"] == 1
    assert "ClusterMode" not in props and "NumNodeGroups" not in props  # cluster mode disabled
    assert rg["DeletionPolicy"] == "Delete"  # transient data only
    assert not redis_synth.resources("AWS::ElastiCache::ServerlessCache")
    assert not redis_synth.resources("AWS::ElastiCache::CacheCluster")


def test_cache_in_the_isolated_subnets_behind_its_security_group(redis_synth):
    ((_, rg),) = redis_synth.resources("AWS::ElastiCache::ReplicationGroup").items()
    ((sng_id, sng),) = redis_synth.resources("AWS::ElastiCache::SubnetGroup").items()
    assert rg["Properties"]["CacheSubnetGroupName"] == {"Ref": sng_id}
    subnets = set(redis_synth.resources("AWS::EC2::Subnet"))
    assert {s["Ref"] for s in sng["Properties"]["SubnetIds"]} == subnets
    _, cache_sg = _security_groups(redis_synth)
    assert rg["Properties"]["SecurityGroupIds"] == [_group_id(cache_sg)]


def test_cache_admits_only_the_functions_group_on_its_port(redis_synth):
    fn_sg, cache_sg = _security_groups(redis_synth)
    sgs = redis_synth.resources("AWS::EC2::SecurityGroup")
    # No inline ingress anywhere; the one standalone ingress rule is functions -> cache.
    for lid, sg in sgs.items():
        assert "SecurityGroupIngress" not in sg["Properties"], lid
    ((_, rule),) = redis_synth.resources("AWS::EC2::SecurityGroupIngress").items()
    p = rule["Properties"]
    assert p["GroupId"] == _group_id(cache_sg)
    assert p["SourceSecurityGroupId"] == _group_id(fn_sg)
    assert (p["IpProtocol"], p["FromPort"], p["ToPort"]) == ("tcp", REDIS_PORT, REDIS_PORT)
    assert not {"CidrIp", "CidrIpv6", "SourcePrefixListId"} & set(p)
    # The cache itself opens no connection: CDK's "disallow all" placeholder is its only egress.
    (egress,) = sgs[cache_sg]["Properties"]["SecurityGroupEgress"]
    assert egress["CidrIp"] == "255.255.255.255/32"


def test_functions_group_reaches_only_the_cache_and_https(redis_synth):
    fn_sg, cache_sg = _security_groups(redis_synth)
    sgs = redis_synth.resources("AWS::EC2::SecurityGroup")
    (https,) = sgs[fn_sg]["Properties"]["SecurityGroupEgress"]
    assert (https["IpProtocol"], https["FromPort"], https["ToPort"]) == ("tcp", 443, 443)
    ((_, rule),) = redis_synth.resources("AWS::EC2::SecurityGroupEgress").items()
    p = rule["Properties"]
    assert p["GroupId"] == _group_id(fn_sg)
    assert p["DestinationSecurityGroupId"] == _group_id(cache_sg)
    assert (p["IpProtocol"], p["FromPort"], p["ToPort"]) == ("tcp", REDIS_PORT, REDIS_PORT)


# ------------------------------------------------------------------ the VPC
def test_vpc_isolated_in_two_azs_without_nat_or_internet_gateway(redis_synth):
    ((vpc_id, _),) = redis_synth.resources("AWS::EC2::VPC").items()
    for gone in (
        "AWS::EC2::NatGateway",
        "AWS::EC2::InternetGateway",
        "AWS::EC2::VPCGatewayAttachment",
        "AWS::EC2::EIP",
        "AWS::EC2::Route",  # isolated: the local route and the gateway endpoints' prefix lists only
        "AWS::EC2::TransitGatewayAttachment",
    ):
        assert not redis_synth.resources(gone), gone
    subnets = redis_synth.resources("AWS::EC2::Subnet")
    assert len(subnets) == 2
    azs = set()
    for lid, sn in subnets.items():
        p = sn["Properties"]
        assert p["VpcId"] == {"Ref": vpc_id}
        assert p["MapPublicIpOnLaunch"] is False, lid
        index, all_azs = p["AvailabilityZone"]["Fn::Select"]
        assert all_azs == {"Fn::GetAZs": ""}, lid
        azs.add(index)
    assert azs == {0, 1}


def test_gateway_endpoints_for_s3_and_dynamodb_on_every_subnet(redis_synth):
    endpoints = redis_synth.resources("AWS::EC2::VPCEndpoint")
    route_tables = set(redis_synth.resources("AWS::EC2::RouteTable"))
    assert len(route_tables) == 2
    services = set()
    for lid, ep in endpoints.items():
        p = ep["Properties"]
        assert p["VpcEndpointType"] == "Gateway", lid  # no interface endpoints (see exchange.py)
        assert {r["Ref"] for r in p["RouteTableIds"]} == route_tables, lid
        services.add(p["ServiceName"]["Fn::Join"][1][-1])
    assert services == {".s3", ".dynamodb"}


def test_vpc_flow_log_to_cloudwatch_with_retention(redis_synth):
    ((vpc_id, _),) = redis_synth.resources("AWS::EC2::VPC").items()
    ((_, fl),) = redis_synth.resources("AWS::EC2::FlowLog").items()
    p = fl["Properties"]
    assert (p["ResourceType"], p["ResourceId"], p["TrafficType"]) == ("VPC", {"Ref": vpc_id}, "ALL")
    group = redis_synth.template["Resources"][p["LogGroupName"]["Ref"]]
    assert group["Properties"]["RetentionInDays"] == 30


# ------------------------------------------------------------------ the functions
def test_exchange_users_run_in_the_vpc_with_the_exchange_url(redis_synth):
    fns = _functions(redis_synth)
    ((rg_id, _),) = redis_synth.resources("AWS::ElastiCache::ReplicationGroup").items()
    fn_sg, _ = _security_groups(redis_synth)
    subnets = set(redis_synth.resources("AWS::EC2::Subnet"))
    url = {
        "Fn::Join": [
            "",
            [
                "rediss://",
                {"Fn::GetAtt": [rg_id, "PrimaryEndPoint.Address"]},
                ":",
                {"Fn::GetAtt": [rg_id, "PrimaryEndPoint.Port"]},
                "/0",
            ],
        ]
    }
    for prefix in IN_VPC:
        lid, fn = _one(fns, prefix)
        props = fn["Properties"]
        assert props["VpcConfig"]["SecurityGroupIds"] == [_group_id(fn_sg)], lid
        assert {s["Ref"] for s in props["VpcConfig"]["SubnetIds"]} == subnets, lid
        assert props["Environment"]["Variables"]["SMLT_EXCHANGE_URL"] == url, lid
        assert props["TracingConfig"] == {"Mode": "Active"}, lid


def test_planner_stays_outside_the_vpc(redis_synth):
    """The planner never opens the exchange and calls Step Functions (Chain): no VPC, no URL."""
    _, planner = _one(_functions(redis_synth), "FunctionsPlanner")
    assert "VpcConfig" not in planner["Properties"]
    assert "SMLT_EXCHANGE_URL" not in planner["Properties"]["Environment"]["Variables"]
    assert not any(a.startswith("ec2:") for a in _grants(redis_synth, "FunctionsPlannerRole"))


def test_redis_endpoint_output(redis_synth):
    ((rg_id, _),) = redis_synth.resources("AWS::ElastiCache::ReplicationGroup").items()
    out = redis_synth.template["Outputs"]["RedisEndpoint"]
    assert out["Value"] == {
        "Fn::Join": [
            ":",
            [{"Fn::GetAtt": [rg_id, "PrimaryEndPoint.Address"]}, {"Fn::GetAtt": [rg_id, "PrimaryEndPoint.Port"]}],
        ]
    }


# ------------------------------------------------------------------ IAM
def test_vpc_functions_get_scoped_eni_permissions(redis_synth):
    fn_sg, _ = _security_groups(redis_synth)
    subnets = set(redis_synth.resources("AWS::EC2::Subnet"))
    enis = "arn:<AWS::Partition>:ec2:<AWS::Region>:<AWS::AccountId>:network-interface/*"
    for prefix in IN_VPC:
        g = _grants(redis_synth, f"{prefix}Role")
        assert ENI_ACTIONS <= set(g), prefix
        for a in ENI_DESCRIBE:
            assert g[a] == {"*"}, (prefix, a)  # Describe* take no resource
        assert g["ec2:CreateNetworkInterface"] == (
            {enis, f"arn:<AWS::Partition>:ec2:<AWS::Region>:<AWS::AccountId>:security-group/<{fn_sg}.GroupId>"}
            | {f"arn:<AWS::Partition>:ec2:<AWS::Region>:<AWS::AccountId>:subnet/<{s}>" for s in subnets}
        ), prefix
        for a in ENI_ACTIONS - ENI_DESCRIBE - {"ec2:CreateNetworkInterface"}:
            assert g[a] == {enis}, (prefix, a)
        # Still only its own log group, no logs:* on "*" as AWSLambdaVPCAccessExecutionRole has.
        assert not any(a.startswith("logs:") and "*" in r for a, rs in g.items() for r in rs), prefix


def test_iam_stays_least_privilege(redis_synth):
    for lid, role in redis_synth.resources("AWS::IAM::Role").items():
        assert "ManagedPolicyArns" not in role["Properties"], lid  # no AWSLambdaVPCAccessExecutionRole
        assert "Policies" not in role["Properties"], lid
    allowed_star = STAR_RESOURCE_ACTIONS | ENI_DESCRIBE
    for lid, _, st in _statements(redis_synth):
        for action in _as_list(st["Action"]):
            assert "*" not in action, (lid, action)
        if "*" in _as_list(st["Resource"]):
            assert not set(_as_list(st["Action"])) - allowed_star, lid
    fn_roles = [fn["Properties"]["Role"]["Fn::GetAtt"][0] for fn in _functions(redis_synth).values()]
    assert len(set(fn_roles)) == len(fn_roles) == 4 + len(TIERS)  # planner, aggregate, prepare, study controller


def test_flow_log_role_writes_only_its_log_group(redis_synth):
    g = _grants(redis_synth, "ExchangeVpcFlowLogIAMRole")
    group, _ = _one(redis_synth.resources("AWS::Logs::LogGroup"), "ExchangeFlowLogs")
    assert set(g) == {"logs:CreateLogStream", "logs:PutLogEvents", "logs:DescribeLogStreams"}
    assert all(r == {f"<{group}.Arn>"} for r in g.values())


# ------------------------------------------------------------------ cdk-nag and cfn-lint
def test_nag_has_no_unacknowledged_findings(redis_synth):
    report = AwsSolutionsChecks().validate_scope(redis_synth.app)
    findings = [(v.rule_name, [r.construct_path for r in v.violating_resources]) for v in report.violations]
    assert findings == []
    assert report.success


def test_nag_acknowledgments_are_reasoned_and_narrow(redis_synth):
    acks = _acknowledgments(redis_synth.app)
    # aws-cdk-lib acknowledges a few findings of its built-in CloudFormation validation itself
    # (the Vpc's AZs: W3010 on the stack; the FlowLog: F3002/F3003): not cdk-nag, not ours.
    assert all(r.startswith(("AwsSolutions-", "CloudFormation-Validate::")) for _, r, _ in acks)
    acks = [a for a in acks if a[1].startswith("AwsSolutions-")]
    for path, rule, reason in acks:
        assert isinstance(reason, str) and len(reason.strip()) >= 20, (path, rule)
        if rule.startswith("AwsSolutions-IAM5["):
            finding = rule[len("AwsSolutions-IAM5[") : -1]
            assert finding.startswith("Resource::"), (path, rule)
            assert expected_wildcard(redis_synth.app, path, finding, reason), (path, rule, reason)
        else:
            assert rule in REASONS, (path, rule)
    cache_rules = {r for p, r, _ in acks if r.startswith("AwsSolutions-AEC")}
    assert cache_rules == {"AwsSolutions-AEC4", "AwsSolutions-AEC6"}  # not AEC1/3/5: those pass
    assert {p for p, r, _ in acks if r in cache_rules} == {"Smlt/Exchange/Cache"}
    enis = {r for _, r, _ in acks if "network-interface" in r}
    assert enis == {
        "AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:ec2:<AWS::Region>:<AWS::AccountId>:network-interface/*]"
    }
    assert {p for p, r, _ in acks if r in enis} == {
        f"Smlt/Functions/{f[len('Functions') :]}Role/DefaultPolicy/Resource" for f in IN_VPC
    }


@pytest.fixture(scope="module")
def redis_lint(redis_synth):
    return _lint(redis_synth.template)


def test_redis_template_has_no_cfn_lint_errors(redis_lint):
    assert _describe([m for m in redis_lint if m.rule.id.startswith("E")]) == []


def test_redis_template_has_only_expected_warnings(redis_lint):
    unexpected = [m for m in redis_lint if m.rule.id.startswith("W") and m.rule.id not in ALLOWED_WARNINGS]
    assert _describe(unexpected) == []


# ------------------------------------------------------------------ the default stays as it was
def test_default_template_has_no_vpc_and_no_exchange(synth):
    assert synth.stack.settings.redis_reducer is False
    types = {r["Type"] for r in synth.template["Resources"].values()}
    assert not {t for t in types if t.startswith(("AWS::EC2::", "AWS::ElastiCache::"))}
    for lid, fn in _functions(synth).items():
        assert "VpcConfig" not in fn["Properties"], lid
        assert "SMLT_EXCHANGE_URL" not in fn["Properties"]["Environment"]["Variables"], lid
        assert not any(a.startswith("ec2:") for a in _grants(synth, fn["Properties"]["Role"]["Fn::GetAtt"][0]))
    assert "RedisEndpoint" not in synth.template["Outputs"]
    assert synth.stack.exchange is None


def _without_asset_hashes(resources: dict) -> dict:
    """Asset hashes cover the smlt sources (layer) and the image context: the two synths of a
    session may see different sources while files are being edited, so compare without them."""
    return json.loads(re.sub(r"[0-9a-f]{64}", "<hash>", json.dumps(resources)))


def test_the_same_stack_apart_from_the_exchange(synth, redis_synth):
    """Turning the option on adds the exchange and changes only the functions that use it (and
    the planner's SMLT_WORKERS_IN_VPC, its check of a dataset bucket's region)."""
    default = _without_asset_hashes(synth.template["Resources"])
    redis = _without_asset_hashes(redis_synth.template["Resources"])
    added = set(redis) - set(default)
    assert not set(default) - set(redis)
    assert all(k.startswith("Exchange") for k in added), sorted(k for k in added if not k.startswith("Exchange"))
    changed = {k for k in default if default[k] != redis[k]}
    in_vpc = {k for k in default if k.startswith(IN_VPC)}
    expected = {k for k in in_vpc if default[k]["Type"] in ("AWS::Lambda::Function", "AWS::IAM::Policy")}
    assert len(expected) == 2 * len(IN_VPC)
    (planner,) = [
        k for k in default if k.startswith("FunctionsPlanner") and default[k]["Type"] == "AWS::Lambda::Function"
    ]
    told = redis[planner]["Properties"]["Environment"]["Variables"].pop("SMLT_WORKERS_IN_VPC")
    assert told == "true" and redis[planner] == default[planner]
    assert changed == expected | {planner}


# ------------------------------------------------------------------ what the VPC functions call
def _module_file(name: str) -> Path | None:
    base = REPO / Path(*name.split("."))
    for cand in (base.with_suffix(".py"), base / "__init__.py"):
        if cand.is_file():
            return cand
    return None


def _reachable(entry: Path) -> dict[str, ast.Module]:
    """The smlt modules a handler file imports, transitively (function-level imports included)."""
    seen: dict[str, ast.Module] = {}
    todo = [("<handler>", entry)]
    while todo:
        name, path = todo.pop()
        if name in seen:
            continue
        tree = ast.parse(path.read_text())
        seen[name] = tree
        if name == "smlt":  # its imports are the client API's, lazily, on attribute access (never in a handler)
            continue
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                module = node.module or ""
                if node.level:  # relative: from the importing module's package
                    base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    module = ".".join(base + ([module] if module else []))
                names = [module] + [f"{module}.{a.name}" for a in node.names]
            for n in names:
                if not n.startswith("smlt"):
                    continue
                parts = n.split(".")
                for i in range(1, len(parts) + 1):  # packages' __init__ run too
                    mod = ".".join(parts[:i])
                    f = _module_file(mod)
                    if f is not None and mod not in seen:
                        todo.append((mod, f))
    return seen


def _aws_services(modules: dict[str, ast.Module]) -> set[str]:
    out = set()
    for tree in modules.values():
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("client", "resource")
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
            ):
                out.add(node.args[0].value)
    return out


def _tracing_imports(modules: dict[str, ast.Module]) -> set[str]:
    """Imports of code that sends traces itself (X-Ray SDK, OpenTelemetry, Powertools Tracer)."""
    prefixes = ("aws_xray_sdk", "opentelemetry", "aws_lambda_powertools.tracing")
    found = set()
    for tree in modules.values():
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names if a.name.startswith(prefixes)}
            elif isinstance(node, ast.ImportFrom) and node.module:
                if node.module.startswith(prefixes):
                    found.add(node.module)
                found |= {f"{node.module}.Tracer" for a in node.names if a.name == "Tracer"}
    return found


@pytest.mark.parametrize("handler", ["train_step", "aggregate"])
def test_vpc_functions_call_only_services_with_gateway_endpoints(handler):
    """The VPC has gateway endpoints for S3 and DynamoDB and no interface endpoint: a VPC function
    calling anything else (Step Functions, Lambda, X-Ray SDK...) would hang without a route."""
    modules = _reachable(REPO / "lambdas" / handler / "handler.py")
    assert "smlt.runtime.config" in modules
    assert _aws_services(modules) <= {"s3", "dynamodb"}, handler
    assert not _tracing_imports(modules), handler  # else: an X-Ray interface endpoint in exchange.py


def test_the_planner_needs_step_functions():
    """Guard for the test above (it sees boto3 clients), and why the planner is not in the VPC."""
    modules = _reachable(REPO / "lambdas" / "planner" / "handler.py")
    assert "stepfunctions" in _aws_services(modules)


# ------------------------------------------------------------------ the local engine
def test_local_engine_refuses_the_exchange_with_the_option_named(redis_synth):
    from smlt.local.functions import function_specs
    from smlt.local.resolve import Resolver, UnresolvableError, unsupported_resources

    (problem,) = unsupported_resources(redis_synth.template)
    assert "redis_reducer" in problem and "SMLT_EXCHANGE_URL" in problem
    resolver = Resolver(redis_synth.template, "Smlt")
    with pytest.raises(UnresolvableError, match=r"PrimaryEndPoint.*redis_reducer=false.*SMLT_EXCHANGE_URL"):
        function_specs(resolver, {}, REPO)


def test_local_synth_refuses_redis_reducer_early(tmp_path):
    from infra.app import build_app
    from smlt.local.synth import SynthError, synthesize

    with pytest.raises(SynthError, match="redis_reducer"):
        synthesize(build_app, tmp_path, context={"redis_reducer": True})


def test_local_engine_resolves_the_default_template(synth):
    """redis_reducer false (the default): every function's environment resolves, without an
    exchange URL (a local run's own SMLT_EXCHANGE_URL passes through)."""
    from smlt.local.functions import function_specs
    from smlt.local.resolve import Resolver, unsupported_resources

    assert unsupported_resources(synth.template) == []
    specs = function_specs(Resolver(synth.template, "Smlt"), {}, REPO)
    assert len(specs) == 4 + len(TIERS)  # planner, aggregate, prepare, study controller
    for spec in specs.values():
        assert "SMLT_EXCHANGE_URL" not in spec.env
        assert spec.env["SMLT_TABLE"].startswith("Smlt-")

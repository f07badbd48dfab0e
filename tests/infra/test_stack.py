"""Security and contract properties of each construct of SmltStack (Template assertions)."""

from __future__ import annotations

import json

from aws_cdk.assertions import Match

from tests.infra.conftest import DEFAULT_TIERS

SSE_S3 = {"ServerSideEncryptionConfiguration": [{"ServerSideEncryptionByDefault": {"SSEAlgorithm": "AES256"}}]}
ALL_BLOCKED = {
    "BlockPublicAcls": True,
    "BlockPublicPolicy": True,
    "IgnorePublicAcls": True,
    "RestrictPublicBuckets": True,
}


# CloudFormation's form of RemovalPolicy.RETAIN_ON_UPDATE_OR_DELETE.
RETAINED_EXCEPT_ON_CREATE = ("RetainExceptOnCreate", "Retain")


def _by_prefix(resources, prefix):
    (hit,) = [v for k, v in resources.items() if k.startswith(prefix)]
    return hit


# ------------------------------------------------------------------ storage
def test_buckets_encrypted_private_and_retained(synth):
    buckets = synth.resources("AWS::S3::Bucket")
    assert len(buckets) == 3  # access logs, data, artifacts
    for lid, b in buckets.items():
        assert b["Properties"]["BucketEncryption"] == SSE_S3, lid
        assert b["Properties"]["PublicAccessBlockConfiguration"] == ALL_BLOCKED, lid
        assert (b["DeletionPolicy"], b["UpdateReplacePolicy"]) == RETAINED_EXCEPT_ON_CREATE, lid


def test_stateful_resources_retained_except_a_failed_create(synth):
    """Buckets, table and log groups survive destroy and replacement, but a rolled-back first
    create removes them (RETAIN_ON_UPDATE_OR_DELETE): a failed first deploy leaves nothing."""
    stateful = {
        **synth.resources("AWS::S3::Bucket"),
        **synth.resources("AWS::DynamoDB::Table"),
        **synth.resources("AWS::Logs::LogGroup"),
    }
    # functions (the study controller and prepare too) + the training and study state machines
    assert len(synth.resources("AWS::Logs::LogGroup")) == 6 + len(DEFAULT_TIERS)
    for lid, r in stateful.items():
        assert (r.get("DeletionPolicy"), r.get("UpdateReplacePolicy")) == RETAINED_EXCEPT_ON_CREATE, lid


def test_every_bucket_denies_insecure_transport(synth):
    policies = synth.resources("AWS::S3::BucketPolicy")
    secured = set()
    for p in policies.values():
        for st in p["Properties"]["PolicyDocument"]["Statement"]:
            if st["Effect"] == "Deny" and st.get("Condition") == {"Bool": {"aws:SecureTransport": "false"}}:
                secured.add(p["Properties"]["Bucket"]["Ref"])
    assert secured == set(synth.resources("AWS::S3::Bucket"))


def test_data_and_artifacts_log_to_access_log_bucket(synth):
    buckets = synth.resources("AWS::S3::Bucket")
    logs_id = next(k for k in buckets if k.startswith("StorageAccessLogs"))
    for prefix in ("StorageData", "StorageArtifacts"):
        cfg = _by_prefix(buckets, prefix)["Properties"]["LoggingConfiguration"]
        assert cfg["DestinationBucketName"] == {"Ref": logs_id}


def test_data_bucket_sends_events_to_eventbridge_natively(synth):
    data = _by_prefix(synth.resources("AWS::S3::Bucket"), "StorageData")
    assert data["Properties"]["NotificationConfiguration"] == {"EventBridgeConfiguration": {"EventBridgeEnabled": True}}
    # no custom-resource Lambda just to switch notifications on
    assert not synth.resources("Custom::S3BucketNotifications")


def test_worker_updates_expire_by_prefix_and_tag(synth):
    """S3 lifecycle filters take a literal prefix, so runs/*/rounds/*/updates/ is selected by
    prefix runs/ AND the tag the workers put on updates."""
    from infra.stacks.storage import UPDATE_TAG_KEY, UPDATE_TAG_VALUE

    artifacts = _by_prefix(synth.resources("AWS::S3::Bucket"), "StorageArtifacts")
    rules = {r["Id"]: r for r in artifacts["Properties"]["LifecycleConfiguration"]["Rules"]}
    rule = rules["expire-worker-updates"]
    assert rule["Status"] == "Enabled"
    assert rule["Prefix"] == "runs/"
    assert rule["TagFilters"] == [{"Key": UPDATE_TAG_KEY, "Value": UPDATE_TAG_VALUE}]
    assert rule["ExpirationInDays"] >= 1
    assert "*" not in rule["Prefix"]


# ------------------------------------------------------------------ table
def test_table_keys_billing_pitr_encryption(synth):
    synth.assertions.has_resource_properties(
        "AWS::DynamoDB::Table",
        {
            "KeySchema": [{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
            "AttributeDefinitions": Match.array_with(
                [{"AttributeName": "pk", "AttributeType": "S"}, {"AttributeName": "sk", "AttributeType": "S"}]
            ),
            "BillingMode": "PAY_PER_REQUEST",
            "PointInTimeRecoverySpecification": {"PointInTimeRecoveryEnabled": True},
            "SSESpecification": {"SSEEnabled": True},
        },
    )
    synth.assertions.resource_count_is("AWS::DynamoDB::Table", 1)


# ------------------------------------------------------------------ functions
def _functions(synth):
    return synth.resources("AWS::Lambda::Function")


def test_function_set_and_construct_ids(synth):
    ids = sorted(k[:-8] for k in _functions(synth))  # logical id = path + 8-char hash
    assert ids == sorted(
        ["FunctionsPlanner", "FunctionsAggregate", "FunctionsPrepare", "StudyController"]
        + [f"FunctionsTrainStep{m}" for m in DEFAULT_TIERS]
    )


def test_zip_functions_plain_handler_layer_and_asset_metadata(synth):
    layers = synth.resources("AWS::Lambda::LayerVersion")
    (layer_id,) = layers
    assert layers[layer_id]["Metadata"]["aws:asset:property"] == "Content"
    for prefix, memory in (("FunctionsPlanner", 1024), ("FunctionsAggregate", 3008)):
        fn = _by_prefix(_functions(synth), prefix)
        props = fn["Properties"]
        assert props["Handler"] == "handler.handler"
        assert props["Runtime"].startswith("python3.")
        assert props["MemorySize"] == memory
        assert props["Layers"] == [{"Ref": layer_id}]
        meta = fn["Metadata"]
        assert meta["aws:asset:property"] == "Code"
        staged = synth.outdir / meta["aws:asset:path"]
        assert (staged / "__init__.py").exists() or (staged / "handler.py").exists()


def test_train_step_image_per_tier(synth):
    fns = {k: v for k, v in _functions(synth).items() if k.startswith("FunctionsTrainStep")}
    assert len(fns) == len(DEFAULT_TIERS)
    asset_paths = set()
    for lid, fn in fns.items():
        props = fn["Properties"]
        mb = int(lid[len("FunctionsTrainStep") : -8])
        assert props["PackageType"] == "Image"
        assert props["ImageConfig"] == {"Command": ["lambdas.train_step.handler.handler"]}
        assert props["MemorySize"] == mb
        assert props["Environment"]["Variables"]["SMLT_MEMORY_MB"] == str(mb)
        assert props["Timeout"] == 900
        assert "Handler" not in props and "Runtime" not in props
        assert fn["Metadata"]["aws:asset:dockerfile-path"] == "lambdas/train_step/Dockerfile"
        asset_paths.add(fn["Metadata"]["aws:asset:path"])
    assert len(asset_paths) == 1, "all tiers share one image"
    # Prepare: the same image, its own command, Lambda's longest timeout and its largest /tmp
    prepare = _by_prefix(_functions(synth), "FunctionsPrepare")
    props = prepare["Properties"]
    assert props["PackageType"] == "Image" and prepare["Metadata"]["aws:asset:path"] in asset_paths
    assert props["ImageConfig"] == {"Command": ["lambdas.prepare.handler.handler"]}
    assert props["Timeout"] == 900 and props["EphemeralStorage"] == {"Size": 10240}
    assert props["MemorySize"] <= 3008  # what a new account may deploy


def test_image_build_context_is_the_allowlist_only(synth):
    """The staged build context (repo root filtered by .dockerignore) holds only what the image needs."""
    fn = next(v for k, v in _functions(synth).items() if k.startswith("FunctionsTrainStep"))
    staged = synth.outdir / fn["Metadata"]["aws:asset:path"]
    top = {p.name for p in staged.iterdir()}
    assert {"smlt", "lambdas"} <= top
    assert not top & {".venv", "cdk.out", "node_modules", ".git", "tests", "infra", "bench", "out"}
    # the image ships the runtime package only, like the layer (tests/infra/test_bundling.py)
    assert {p.name for p in (staged / "smlt").iterdir()} == {"__init__.py", "runtime"}
    assert not list(staged.rglob("__pycache__"))
    assert (staged / "lambdas/train_step/Dockerfile").exists()
    assert (staged / "layers/requirements.txt").exists()


def test_image_platform_follows_architecture(synth):
    manifest = json.loads((synth.outdir / "Smlt.assets.json").read_text())
    (image,) = manifest["dockerImages"].values()
    assert image["source"]["platform"] == "linux/amd64"
    assert image["source"]["dockerFile"] == "lambdas/train_step/Dockerfile"


def test_environment_matches_contract(synth):
    common = {
        "SMLT_ARTIFACTS_BUCKET",
        "SMLT_DATA_BUCKET",
        "SMLT_TABLE",
        "SMLT_PRICES",
        "SMLT_ARCHITECTURE",
        "POWERTOOLS_SERVICE_NAME",
        # deployment settings whose default is cdk.json's (absent in a function)
        "SMLT_PLANNER_MEMORY_MB",
        "SMLT_AGGREGATE_MEMORY_MB",
        "SMLT_WORKER_TIMEOUT_S",
        "SMLT_MAX_CONCURRENCY",
        "SMLT_FANOUT",
    }
    fns = _functions(synth)
    for lid, fn in fns.items():
        env = fn["Properties"]["Environment"]["Variables"]
        if lid.startswith("StudyController"):  # the table and the artifacts bucket only
            assert set(env) == {"SMLT_ARTIFACTS_BUCKET", "SMLT_TABLE", "POWERTOOLS_SERVICE_NAME"}, lid
            continue
        if lid.startswith("FunctionsPrepare"):  # the table and the data bucket only
            assert set(env) == {"SMLT_DATA_BUCKET", "SMLT_TABLE", "POWERTOOLS_SERVICE_NAME"}, lid
            continue
        extra = set(env) - common
        if lid.startswith("FunctionsPlanner"):
            assert extra == {"SMLT_TRAIN_FUNCTIONS"}, lid
        elif lid.startswith("FunctionsTrainStep"):
            assert extra == {"SMLT_MEMORY_MB", "SMLT_SHARD_CACHE_MB"}, lid
            assert env["SMLT_SHARD_CACHE_MB"] == "3072"  # 3/4 of the 4,096 MB of /tmp
        else:
            assert extra == set(), lid
        assert env["POWERTOOLS_SERVICE_NAME"] == "smlt"
        assert env["SMLT_ARCHITECTURE"] == "x86_64"
        prices = json.loads(env["SMLT_PRICES"])
        assert prices["lambda_gb_second"]["x86_64"] == 0.0000166667
        assert prices["sfn_transition"] == 0.000025


def test_planner_train_functions_map_refs_every_tier(synth):
    fns = _functions(synth)
    planner = _by_prefix(fns, "FunctionsPlanner")["Properties"]["Environment"]["Variables"]
    assert planner["SMLT_MAX_CONCURRENCY"] == "64"
    join = planner["SMLT_TRAIN_FUNCTIONS"]["Fn::Join"]
    text = "".join(p if isinstance(p, str) else "@" + p["Ref"] for p in join[1])
    mapping = json.loads(text)
    assert sorted(mapping, key=int) == [str(mb) for mb in DEFAULT_TIERS]
    for mb, ref in mapping.items():
        assert ref.startswith("@FunctionsTrainStep" + mb), (mb, ref)


def test_functions_traced_with_own_role_and_log_group(synth):
    fns = _functions(synth)
    roles = {fn["Properties"]["Role"]["Fn::GetAtt"][0] for fn in fns.values()}
    assert len(roles) == len(fns), "one role per function"
    for lid, fn in fns.items():
        props = fn["Properties"]
        assert props["TracingConfig"] == {"Mode": "Active"}, lid
        assert "LogGroup" in props["LoggingConfig"], lid
        assert props["Architectures"] == ["x86_64"]
    for lg in synth.resources("AWS::Logs::LogGroup").values():
        assert lg["Properties"]["RetentionInDays"] == 30


# ------------------------------------------------------------------ workflow
def test_state_machine_standard_logged_traced(synth):
    (sm,) = [v for k, v in synth.resources("AWS::StepFunctions::StateMachine").items() if k.startswith("Workflow")]
    props = sm["Properties"]
    assert props["StateMachineType"] == "STANDARD"
    assert props["TracingConfiguration"] == {"Enabled": True}
    assert props["LoggingConfiguration"]["Level"] == "ALL"
    assert props["LoggingConfiguration"]["IncludeExecutionData"] is True
    (dest,) = props["LoggingConfiguration"]["Destinations"]
    lg_id = dest["CloudWatchLogsLogGroup"]["LogGroupArn"]["Fn::GetAtt"][0]
    assert synth.template["Resources"][lg_id]["Type"] == "AWS::Logs::LogGroup"


# ------------------------------------------------------------------ trigger
def test_trigger_rule_pattern_and_input(synth):
    (rule,) = synth.resources("AWS::Events::Rule").values()
    props = rule["Properties"]
    pattern = props["EventPattern"]
    assert pattern["source"] == ["aws.s3"]
    assert pattern["detail-type"] == ["Object Created"]
    assert pattern["detail"]["object"]["key"] == [
        {"wildcard": "incoming/*/*/manifest.json"},
        {"wildcard": "incoming/*/*/_SUCCESS"},
    ]
    data_id = next(k for k in synth.resources("AWS::S3::Bucket") if k.startswith("StorageData"))
    assert pattern["detail"]["bucket"]["name"] == [{"Ref": data_id}]
    (target,) = props["Targets"]
    sm_id = next(k for k in synth.resources("AWS::StepFunctions::StateMachine") if k.startswith("Workflow"))
    assert target["Arn"] == {"Ref": sm_id}
    tr = target["InputTransformer"]
    assert tr["InputPathsMap"] == {
        "detail-bucket-name": "$.detail.bucket.name",
        "detail-object-key": "$.detail.object.key",
        "detail-object-etag": "$.detail.object.etag",
        "detail-object-sequencer": "$.detail.object.sequencer",
    }
    # A bare <placeholder> is replaced by the JSON value (a quoted string), as EventBridge does.
    rendered = (
        tr["InputTemplate"]
        .replace("<detail-bucket-name>", json.dumps("b"))
        .replace("<detail-object-key>", json.dumps("incoming/p/v1/manifest.json"))
        .replace("<detail-object-etag>", json.dumps("e"))
        .replace("<detail-object-sequencer>", json.dumps("s"))
    )
    expected = {"bucket": "b", "key": "incoming/p/v1/manifest.json", "etag": "e", "sequencer": "s"}
    assert json.loads(rendered) == {"trigger": expected}
    assert "DeadLetterConfig" in target and target["RetryPolicy"]["MaximumRetryAttempts"] == 8


def test_trigger_rule_matches_like_the_local_engine():
    """The local engine (smlt.local.eventbridge) evaluates the same pattern: manifests and completion
    markers of a pipeline version match; the pipeline's job.json, its raw data and stray manifests,
    and what the Prepare step writes (prepared/), do not."""
    from infra.stacks.trigger import KEY_WILDCARDS
    from smlt.local.eventbridge import matches

    pattern = {"detail": {"object": {"key": [{"wildcard": w} for w in KEY_WILDCARDS]}}}

    def ev(key):
        return {"detail": {"object": {"key": key}}}

    assert matches(pattern, ev("incoming/digits/v2/manifest.json"))
    assert matches(pattern, ev("incoming/digits/2026/11/manifest.json"))
    assert not matches(pattern, ev("incoming/digits/job.json"))
    assert not matches(pattern, ev("incoming/manifest.json"))
    assert not matches(pattern, ev("datasets/digits/manifest.json"))
    assert matches(pattern, ev("incoming/houses/v1/_SUCCESS"))
    assert matches(pattern, ev("incoming/houses/2026/11/_SUCCESS"))
    assert not matches(pattern, ev("incoming/houses/v1/houses.csv"))
    assert not matches(pattern, ev("incoming/houses/_SUCCESS"))
    assert not matches(pattern, ev("incoming/houses/features.json"))
    assert not matches(pattern, ev("prepared/houses/v1/3f2a9c1e/manifest.json"))
    assert not matches(pattern, ev("incoming/houses/v1/_SUCCESS.tmp"))


def test_trigger_dead_letter_queue_encrypted_and_tls_only(synth):
    (q,) = synth.resources("AWS::SQS::Queue").values()
    assert q["Properties"]["SqsManagedSseEnabled"] is True
    (qp,) = synth.resources("AWS::SQS::QueuePolicy").values()
    statements = qp["Properties"]["PolicyDocument"]["Statement"]
    assert any(
        s["Effect"] == "Deny" and s.get("Condition") == {"Bool": {"aws:SecureTransport": "false"}} for s in statements
    )


# ------------------------------------------------------------------ monitoring
def test_alarms_on_failed_executions_and_throttles(synth):
    alarms = synth.resources("AWS::CloudWatch::Alarm").values()
    by_metric = {}
    for a in alarms:
        by_metric.setdefault(a["Properties"]["MetricName"], []).append(a["Properties"])
    assert len(by_metric["ExecutionsFailed"]) == 1
    assert by_metric["ExecutionsFailed"][0]["Namespace"] == "AWS/States"
    throttled = {d["Value"]["Ref"] for p in by_metric["Throttles"] for d in p["Dimensions"]}
    assert throttled == set(_functions(synth))


def test_dashboard_shows_training_metrics(synth):
    (dash,) = synth.resources("AWS::CloudWatch::Dashboard").values()
    body = dash["Properties"]["DashboardBody"]
    text = body if isinstance(body, str) else json.dumps(body)
    for metric in ("Loss", "ValAccuracy", "Workers", "MemoryMB", "SpendUSD", "BudgetUSD", "RoundSeconds"):
        assert f'MetricName=\\\\\\"{metric}\\\\\\"' in text or f'MetricName=\\"{metric}\\"' in text, metric
    # namespace smlt, exactly the handlers' dimensions (run_id, service): one line per run
    assert text.count("SEARCH('{smlt,run_id,service} MetricName=") == 7


# ------------------------------------------------------------------ outputs
def test_outputs_the_cli_looks_up(synth):
    """`smlt start/status/fetch/resume` find the stack's resources through these outputs."""
    from smlt.cloud import OUTPUTS

    outputs = synth.template["Outputs"]
    assert set(OUTPUTS) <= set(outputs)
    sm_id = next(k for k in synth.resources("AWS::StepFunctions::StateMachine") if k.startswith("Workflow"))
    assert outputs["StateMachineArn"]["Value"] == {"Ref": sm_id}
    assert "DashboardUrl" in outputs

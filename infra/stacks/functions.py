"""Lambda functions: planner and aggregate (zip + shared layer), train_step (image, one per tier),
prepare (the same image, its own command: a raw upload prepared in the cloud).

Each function has its own role with resource-scoped statements (no managed policies, no `*`
actions) and its own log group. Its environment is written from the runtime's settings model
(`smlt.runtime.config.Settings.environment`): exactly the variables that function reads, no others.
Memory sizes and timeouts are set once here; the ones the runtime prices or plans with
(cdk.json `planner_memory_mb`, `aggregate_memory_mb`, `worker_timeout_s`) reach it that way.

With the Redis reducer (`exchange` given, context `redis_reducer: true`) the functions that open the
exchange (`Settings.exchange_store()`: train_step at every tier, aggregate) run in the exchange's
VPC and get `SMLT_EXCHANGE_URL=rediss://<endpoint>:<port>/0`; the planner never opens it and stays
outside the VPC (it calls Step Functions, which would need an interface endpoint there).
"""

from __future__ import annotations

from typing import Any

from aws_cdk import AssetHashType, Aws, BundlingOptions, DockerImage, Duration, IgnoreMode, Size, Stack
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_ecr_assets as ecr_assets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3 as s3
from constructs import Construct

from infra.stacks.bundling import LocalLayerBundling, layer_fingerprint
from infra.stacks.exchange import RedisExchange
from infra.stacks.nag import acknowledge
from infra.stacks.settings import Settings
from infra.stacks.storage import STATEFUL
from smlt import project
from smlt.runtime import keys, metrics
from smlt.runtime.config import AGGREGATE, PLANNER, PREPARE, TRAIN
from smlt.runtime.config import Settings as RuntimeSettings
from smlt.runtime.steps.prepare_limits import PREPARE_EPHEMERAL_MB, PREPARE_MEMORY_MB, PREPARE_TIMEOUT_S

# The repository, or the copy of its files smlt makes when installed from a wheel (smlt.project).
REPO_ROOT = project.root()
ZIP_HANDLER = "handler.handler"
IMAGE_CMD = ["lambdas.train_step.handler.handler"]
PREPARE_CMD = ["lambdas.prepare.handler.handler"]
TRAIN_DOCKERFILE = "lambdas/train_step/Dockerfile"

# The artifacts bucket's object patterns, from the key functions the handlers write with.
RUN_OBJECTS = keys.object_pattern(keys.run_prefix(keys.ANY))  # runs/*/*
ROUND_OBJECTS = keys.object_pattern(keys.rounds_prefix(keys.ANY))  # runs/*/rounds/*: a worker's objects
PIPELINE_LATEST = keys.object_pattern(keys.pipeline_latest_key(keys.ANY))  # pipelines/*/latest.json
# pipelines/*/versions/* and pipelines/*/promotions/*: the gate's records (Finalize writes them);
# pipelines/*/replaced/*: a version's record before it was uploaded again (the run's first Plan)
PIPELINE_RECORDS = (
    keys.object_pattern(keys.pipeline_versions_prefix(keys.ANY)),
    keys.object_pattern(keys.pipeline_promotions_prefix(keys.ANY)),
    keys.object_pattern(keys.pipeline_replaced_prefix(keys.ANY)),
)
STUDY_BEST = keys.object_pattern(keys.study_best_prefix(keys.ANY))  # studies/*/best/*
CODE_OBJECTS = keys.object_pattern(keys.code_key(keys.ANY))  # code/*.zip
# The data bucket's object patterns the Prepare function reads and writes.
INCOMING_OBJECTS = keys.object_pattern(keys.INCOMING)  # incoming/*: raw uploads, pipelines' jobs and features
PREPARED_OBJECTS = keys.object_pattern(keys.PREPARED)  # prepared/*: what it prepares them into
PIPELINE_FEATURES = keys.object_pattern(keys.pipeline_features_key(keys.ANY))  # incoming/*/features.json
PREPARE_TIMEOUT = Duration.seconds(PREPARE_TIMEOUT_S)

PLANNER_TIMEOUT = Duration.minutes(5)
AGGREGATE_TIMEOUT = Duration.minutes(15)

# Item-level DynamoDB actions: the handlers read/write items of this one table, nothing else.
TABLE_ITEM_ACTIONS = [
    "dynamodb:GetItem",
    "dynamodb:BatchGetItem",
    "dynamodb:Query",
    "dynamodb:PutItem",
    "dynamodb:UpdateItem",
    "dynamodb:DeleteItem",
    "dynamodb:BatchWriteItem",
    "dynamodb:ConditionCheckItem",
]

_RETENTION = {
    1: logs.RetentionDays.ONE_DAY,
    3: logs.RetentionDays.THREE_DAYS,
    5: logs.RetentionDays.FIVE_DAYS,
    7: logs.RetentionDays.ONE_WEEK,
    14: logs.RetentionDays.TWO_WEEKS,
    30: logs.RetentionDays.ONE_MONTH,
    60: logs.RetentionDays.TWO_MONTHS,
    90: logs.RetentionDays.THREE_MONTHS,
    180: logs.RetentionDays.SIX_MONTHS,
    365: logs.RetentionDays.ONE_YEAR,
}


def retention(days: int) -> logs.RetentionDays:
    if days not in _RETENTION:
        raise ValueError(f"context 'log_retention_days': one of {sorted(_RETENTION)}, got {days}")
    return _RETENTION[days]


def train_image_options(settings: Settings) -> dict[str, Any]:
    """The train_step image asset's options. Its build context is the repo root filtered by
    .dockerignore (IgnoreMode.DOCKER), which CDK applies to staging and to the asset hash alike."""
    arm = settings.architecture == "arm64"
    return dict(
        file=TRAIN_DOCKERFILE,
        platform=ecr_assets.Platform.LINUX_ARM64 if arm else ecr_assets.Platform.LINUX_AMD64,
        ignore_mode=IgnoreMode.DOCKER,
        build_args={"PYTHON_VERSION": settings.lambda_python},
    )


class Functions(Construct):
    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        settings: Settings,
        data_bucket: s3.IBucket,
        artifacts_bucket: s3.IBucket,
        table: dynamodb.ITable,
        exchange: RedisExchange | None = None,
    ) -> None:
        super().__init__(scope, id)
        self._settings = settings
        self._exchange = exchange
        self._data = data_bucket
        self._artifacts = artifacts_bucket
        self._table = table
        arm = settings.architecture == "arm64"
        self.architecture = lambda_.Architecture.ARM_64 if arm else lambda_.Architecture.X86_64
        runtime = {"3.12": lambda_.Runtime.PYTHON_3_12, "3.13": lambda_.Runtime.PYTHON_3_13}[settings.lambda_python]
        log_retention = retention(settings.log_retention_days)

        base_env: dict[str, Any] = dict(
            artifacts_bucket=artifacts_bucket.bucket_name,
            data_bucket=data_bucket.bucket_name,
            table=table.table_name,
            prices=settings.prices,
            architecture=settings.architecture,
            service_name=metrics.SERVICE,  # Powertools' service: the metrics' dimension
            # what the ledger and the planner price and plan with (and every function parses)
            planner_memory_mb=settings.planner_memory_mb,
            aggregate_memory_mb=settings.aggregate_memory_mb,
            worker_timeout_s=settings.worker_timeout_s,
            max_concurrency=settings.max_concurrency,
            fanout=settings.fanout,
        )
        # Per-step sync mode's gradient exchange: a redis:// URL (ElastiCache, cdk.json context
        # `exchange_url`); unset = the artifacts bucket. Not set at all by default, so a local
        # run's process environment can still choose one.
        exchange_url = self.node.try_get_context("exchange_url")
        if exchange_url and exchange is not None:
            raise ValueError(
                "context 'exchange_url' and 'redis_reducer': give one (redis_reducer=true sets "
                "SMLT_EXCHANGE_URL to the stack's own ElastiCache exchange)"
            )
        # The functions that open the exchange: in its VPC, with its URL (none without one).
        exchange_env = {"exchange_url": exchange.url if exchange is not None else exchange_url or None}

        # --- shared layer (numpy, safetensors, pydantic, powertools, smlt), bundled locally ---
        self.layer = lambda_.LayerVersion(
            self,
            "CoreLayer",
            description="smlt core + numpy/safetensors/pydantic/powertools (no torch)",
            compatible_runtimes=[runtime],
            compatible_architectures=[self.architecture],
            code=lambda_.Code.from_asset(
                str(REPO_ROOT / "layers"),
                asset_hash_type=AssetHashType.CUSTOM,
                asset_hash=layer_fingerprint(REPO_ROOT, settings.architecture, settings.lambda_python),
                bundling=BundlingOptions(
                    # Never pulled or run: the local bundler always succeeds or raises.
                    image=DockerImage.from_registry(f"public.ecr.aws/sam/build-python{settings.lambda_python}"),
                    local=LocalLayerBundling(REPO_ROOT, settings.architecture, settings.lambda_python),
                ),
            ),
        )

        # --- train_step: one container image, one function per memory tier ---
        self.train_functions: dict[int, lambda_.Function] = {}
        for mb in settings.memory_tiers:
            fid = f"TrainStep{mb}"
            role = self._role(fid)
            self._read_data(role)
            # Workers read and write round objects only (never job.json or final/: docs/deploy.md, "Trust")
            self._write_artifacts(role, tag_updates=True, objects=(ROUND_OBJECTS,))
            self._read_code(role)
            self._use_table(role)
            self._join_vpc(role)
            fn = lambda_.DockerImageFunction(
                self,
                fid,
                description=f"smlt train_step worker at {mb} MB",
                code=lambda_.DockerImageCode.from_image_asset(
                    str(REPO_ROOT), cmd=IMAGE_CMD, **train_image_options(settings)
                ),
                architecture=self.architecture,
                memory_size=mb,
                ephemeral_storage_size=Size.mebibytes(settings.train_ephemeral_mb),
                timeout=Duration.seconds(settings.worker_timeout_s),
                role=role,
                tracing=lambda_.Tracing.ACTIVE,
                log_group=self._log_group(fid, role, log_retention),
                # The shard cache may fill 3/4 of the function's /tmp (the rest: code, temp files).
                environment=RuntimeSettings.environment(
                    TRAIN, **base_env, **exchange_env, memory_mb=mb, shard_cache_mb=settings.train_ephemeral_mb * 3 // 4
                ),
                **self._vpc_props(),
            )
            self.train_functions[mb] = fn

        # --- aggregate ---
        role = self._role("Aggregate")
        self._write_artifacts(role, tag_updates=False)
        self._use_table(role)
        self._join_vpc(role)
        self.aggregate = lambda_.Function(
            self,
            "Aggregate",
            description="smlt aggregate: weighted average of worker updates, metrics, cost ledger",
            runtime=runtime,
            architecture=self.architecture,
            handler=ZIP_HANDLER,
            code=self._zip_code("aggregate"),
            layers=[self.layer],
            memory_size=settings.aggregate_memory_mb,
            ephemeral_storage_size=Size.mebibytes(2048),
            timeout=AGGREGATE_TIMEOUT,
            role=role,
            tracing=lambda_.Tracing.ACTIVE,
            log_group=self._log_group("Aggregate", role, log_retention),
            environment=RuntimeSettings.environment(AGGREGATE, **base_env, **exchange_env),
            **self._vpc_props(),
        )

        # --- planner ---
        role = self._role("Planner")
        self._read_data(role)
        # runs/ + pipelines/<pipeline>/latest.json (retraining warm start) and the gate's version
        # and promotion records (written by finalize)
        self._write_artifacts(role, tag_updates=False, objects=(RUN_OBJECTS, PIPELINE_LATEST, *PIPELINE_RECORDS))
        # A study's trials warm-start from another study's best model (read only).
        role.add_to_principal_policy(
            iam.PolicyStatement(actions=["s3:GetObject"], resources=[self._artifacts.arn_for_objects(STUDY_BEST)])
        )
        # Finalize publishes the gate's decisions to the team's topic (cdk.json notify_topic_arn).
        self._publish_notices(role, settings)
        # The account's Lambda concurrency limit is an input of every run's first plan (AWS
        # accepts only "*" for GetAccountSettings).
        role.add_to_principal_policy(iam.PolicyStatement(actions=["lambda:GetAccountSettings"], resources=["*"]))
        self._use_table(role)
        stack = Stack.of(self)
        self.planner = lambda_.Function(
            self,
            "Planner",
            description="smlt planner: validate the job, plan each round, finalize",
            runtime=runtime,
            architecture=self.architecture,
            handler=ZIP_HANDLER,
            code=self._zip_code("planner"),
            layers=[self.layer],
            memory_size=settings.planner_memory_mb,
            timeout=PLANNER_TIMEOUT,
            role=role,
            tracing=lambda_.Tracing.ACTIVE,
            log_group=self._log_group("Planner", role, log_retention),
            environment=RuntimeSettings.environment(
                PLANNER,
                **base_env,
                train_functions=stack.to_json_string(
                    {str(mb): fn.function_name for mb, fn in self.train_functions.items()}
                ),
                notify_topic_arn=settings.notify_topic_arn,
                # the user's own dataset buckets its roles may read (the planner's job check)
                data_buckets=list(settings.data_buckets) or None,
                # its workers reach S3 only through the VPC's gateway endpoint (the dataset's region check)
                workers_in_vpc=True if exchange is not None else None,
            ),
        )

        # --- prepare: a raw upload (incoming/<p>/<v>/ + _SUCCESS) prepared in the cloud ---
        # The train image, its own command: it has every library `smlt data prepare` reads formats
        # with (pyarrow, Pillow), which the zip functions' layer has not. Limits:
        # smlt/runtime/steps/prepare.py (each kind of input's limit and how it follows from them).
        role = self._role("Prepare")
        self._prepare_data(role)
        self._decrypt_data(role)  # a raw upload encrypted with one of the user's KMS keys
        self._use_table(role)  # the run's PREPARE claim and the ledger's ATTEMPT item
        self._publish_notices(role, settings)  # a refused upload, told to the team's topic
        self.prepare = lambda_.DockerImageFunction(
            self,
            "Prepare",
            description="smlt prepare: a raw upload's data prepared into its run's dataset",
            code=lambda_.DockerImageCode.from_image_asset(
                str(REPO_ROOT), cmd=PREPARE_CMD, **train_image_options(settings)
            ),
            architecture=self.architecture,
            memory_size=PREPARE_MEMORY_MB,
            ephemeral_storage_size=Size.mebibytes(PREPARE_EPHEMERAL_MB),
            timeout=PREPARE_TIMEOUT,
            role=role,
            tracing=lambda_.Tracing.ACTIVE,
            log_group=self._log_group("Prepare", role, log_retention),
            environment=RuntimeSettings.environment(
                PREPARE,
                data_bucket=data_bucket.bucket_name,
                table=table.table_name,
                service_name=metrics.SERVICE,
                notify_topic_arn=settings.notify_topic_arn,
            ),
        )

        self.all_functions: list[lambda_.Function] = [
            self.planner,
            self.aggregate,
            self.prepare,
            *self.train_functions.values(),
        ]
        self._suppress()

    # ------------------------------------------------------------------ helpers
    @staticmethod
    def _zip_code(name: str) -> lambda_.Code:
        return lambda_.Code.from_asset(
            str(REPO_ROOT / "lambdas" / name),
            exclude=["__pycache__", "*.pyc", "Dockerfile", "tests"],
        )

    def _role(self, fid: str) -> iam.Role:
        return iam.Role(
            self,
            f"{fid}Role",
            assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
            description=f"smlt {fid} execution role",
        )

    def _log_group(self, fid: str, role: iam.Role, days: logs.RetentionDays) -> logs.LogGroup:
        group = logs.LogGroup(self, f"{fid}Logs", retention=days, removal_policy=STATEFUL)
        role.add_to_principal_policy(
            iam.PolicyStatement(
                actions=["logs:CreateLogStream", "logs:PutLogEvents"],
                resources=[group.log_group_arn],
            )
        )
        return group

    def _join_vpc(self, role: iam.Role) -> None:
        if self._exchange is not None:
            self._exchange.grant_vpc_access(role)

    def _vpc_props(self) -> dict:
        """Function props that put a function in the exchange's VPC ({} without the exchange)."""
        if self._exchange is None:
            return {}
        return dict(
            vpc=self._exchange.vpc,
            vpc_subnets=self._exchange.subnets,
            security_groups=[self._exchange.function_sg],
        )

    @staticmethod
    def _publish_notices(role: iam.Role, settings: Settings) -> None:
        """sns:Publish on the team's topic (cdk.json notify_topic_arn), when it has one, nowhere else."""
        if settings.notify_topic_arn:
            role.add_to_principal_policy(
                iam.PolicyStatement(actions=["sns:Publish"], resources=[settings.notify_topic_arn])
            )

    def _read_data(self, role: iam.Role) -> None:
        """Datasets: every object of the stack's data bucket, of the user's own buckets (or folders)
        in cdk context `data_buckets`, decrypted with the keys in `data_kms_keys`."""
        role.add_to_principal_policy(
            iam.PolicyStatement(actions=["s3:GetObject"], resources=[self._data.arn_for_objects("*")])
        )
        role.add_to_principal_policy(iam.PolicyStatement(actions=["s3:ListBucket"], resources=[self._data.bucket_arn]))
        for entry in self._settings.data_buckets:
            bucket, _, prefix = entry.partition("/")
            arn = f"arn:{Aws.PARTITION}:s3:::{bucket}"
            role.add_to_principal_policy(iam.PolicyStatement(actions=["s3:GetObject"], resources=[f"{arn}/{prefix}*"]))
            role.add_to_principal_policy(
                iam.PolicyStatement(
                    actions=["s3:ListBucket"],
                    resources=[arn],
                    conditions={"StringLike": {"s3:prefix": [f"{prefix}*"]}} if prefix else None,
                )
            )
        self._decrypt_data(role)

    def _decrypt_data(self, role: iam.Role) -> None:
        """kms:Decrypt on the user's keys (`data_kms_keys`), only through S3 in the key's region:
        a GetObject of an SSE-KMS object has S3 decrypt its data key with the caller's rights."""
        for key_arn in self._settings.data_kms_keys:
            region = key_arn.split(":")[3]
            role.add_to_principal_policy(
                iam.PolicyStatement(
                    actions=["kms:Decrypt"],
                    resources=[key_arn],
                    conditions={"StringEquals": {"kms:ViaService": f"s3.{region}.{Aws.URL_SUFFIX}"}},
                )
            )

    def _prepare_data(self, role: iam.Role) -> None:
        """Read raw uploads (and the pipelines' jobs) under incoming/; write only what it prepares,
        under prepared/ (DeleteObject: the shards an attempt that died left there), and the
        pipeline's feature spec, which a pipeline's first version fixes."""
        data = self._data
        role.add_to_principal_policy(
            iam.PolicyStatement(
                actions=["s3:GetObject"],
                resources=[data.arn_for_objects(INCOMING_OBJECTS), data.arn_for_objects(PREPARED_OBJECTS)],
            )
        )
        role.add_to_principal_policy(
            iam.PolicyStatement(
                actions=["s3:PutObject", "s3:DeleteObject"], resources=[data.arn_for_objects(PREPARED_OBJECTS)]
            )
        )
        role.add_to_principal_policy(
            iam.PolicyStatement(actions=["s3:PutObject"], resources=[data.arn_for_objects(PIPELINE_FEATURES)])
        )
        role.add_to_principal_policy(
            iam.PolicyStatement(
                actions=["s3:ListBucket"],
                resources=[data.bucket_arn],
                conditions={"StringLike": {"s3:prefix": [INCOMING_OBJECTS, PREPARED_OBJECTS]}},
            )
        )
        # The uploads into a version's folder still in progress when its marker lands: waited for
        # (smlt.runtime.steps.prepare._await_data). The action takes no prefix condition.
        role.add_to_principal_policy(
            iam.PolicyStatement(actions=["s3:ListBucketMultipartUploads"], resources=[data.bucket_arn])
        )

    def _read_code(self, role: iam.Role) -> None:
        # The users' code the CLI stores for `--code` (smlt/runtime/usercode.py): read only.
        role.add_to_principal_policy(
            iam.PolicyStatement(actions=["s3:GetObject"], resources=[self._artifacts.arn_for_objects(CODE_OBJECTS)])
        )

    def _write_artifacts(self, role: iam.Role, *, tag_updates: bool, objects: tuple[str, ...] = (RUN_OBJECTS,)) -> None:
        actions = ["s3:GetObject", "s3:PutObject", "s3:DeleteObject"]
        if tag_updates:
            # Workers write updates with the `smlt-kind=update` tag (lifecycle expiry).
            actions.append("s3:PutObjectTagging")
        role.add_to_principal_policy(
            iam.PolicyStatement(actions=actions, resources=[self._artifacts.arn_for_objects(o) for o in objects])
        )
        role.add_to_principal_policy(
            iam.PolicyStatement(
                actions=["s3:ListBucket"],
                resources=[self._artifacts.bucket_arn],
                conditions={"StringLike": {"s3:prefix": list(objects)}},
            )
        )

    def _use_table(self, role: iam.Role) -> None:
        role.add_to_principal_policy(iam.PolicyStatement(actions=TABLE_ITEM_ACTIONS, resources=[self._table.table_arn]))

    def _suppress(self) -> None:
        for fn in (self.planner, self.aggregate):
            acknowledge(fn, "AwsSolutions-L1")

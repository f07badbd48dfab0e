"""Every S3 key and DynamoDB key smlt writes, in one place.

Keys are derived from (run, round, worker) only, so a retried or duplicated step writes the
same key again instead of a new one.
"""

from __future__ import annotations

# The artifacts bucket's top-level prefixes. The stack's IAM grants are built from the key
# functions below (`object_pattern`), so a key written in a new place is denied by the tests'
# IAM check (tests/infra/test_iam_calls.py) until a grant says who may write it.
RUNS = "runs/"
PIPELINES = "pipelines/"
STUDIES = "studies/"
CODE = "code/"
# The data bucket: where an upload starts a retraining run (infra/stacks/trigger.py): a prepared
# version's manifest, or the completion marker of a raw one.
INCOMING = "incoming/"
MANIFEST = "manifest.json"
SUCCESS_MARKER = "_SUCCESS"
# The data bucket: raw versions prepared in the cloud (smlt.runtime.steps.prepare). A prefix of
# its own: the trigger rule never matches it, a raw upload is never overwritten, and a user's
# own folders (datasets/ in the examples) are never written.
PREPARED = "prepared/"

# What a key function is given to make an IAM pattern instead of a key.
ANY = "*"


def object_pattern(key_or_prefix: str) -> str:
    """An IAM object pattern from a key function called with `ANY`: a prefix (ends in "/")
    matches everything under it, a key matches itself ("runs/*/" -> "runs/*/*")."""
    return key_or_prefix + ANY if key_or_prefix.endswith("/") else key_or_prefix


def run_prefix(run_id: str) -> str:
    return f"{RUNS}{run_id}/"


def job_key(run_id: str) -> str:
    return run_prefix(run_id) + "job.json"


def rounds_prefix(run_id: str) -> str:
    """Every round's objects (models, updates, checks, sync exchange): all a worker writes."""
    return run_prefix(run_id) + "rounds/"


def round_prefix(run_id: str, rnd: int) -> str:
    return rounds_prefix(run_id) + f"{rnd:06d}/"


def model_key(run_id: str, rnd: int) -> str:
    """The global model that round `rnd` starts from."""
    return round_prefix(run_id, rnd) + "model.safetensors"


def update_key(run_id: str, rnd: int, worker: int) -> str:
    return round_prefix(run_id, rnd) + f"updates/{worker:05d}.safetensors"


def accepted_key(run_id: str, rnd: int) -> str:
    """Sharded aggregation: the accepted (worker, samples) of a round, first writer wins."""
    return round_prefix(run_id, rnd) + "accepted.json"


def slices_manifest_key(run_id: str, rnd: int) -> str:
    """A model stored as slices of its flat vector (sharded aggregation): the manifest."""
    return round_prefix(run_id, rnd) + "model.slices.json"


def slice_key(run_id: str, rnd: int, j: int, k: int) -> str:
    return round_prefix(run_id, rnd) + f"model.slices/{j:05d}-of-{k:05d}.safetensors"


def rest_key(run_id: str, rnd: int) -> str:
    """Non-floating tensors of a sliced model, if it has any."""
    return round_prefix(run_id, rnd) + "model.slices/rest.safetensors"


def check_key(run_id: str, rnd: int, j: int) -> str:
    """Sharded: slice aggregator j's check of its share of the accepted updates (digest, norm)."""
    return round_prefix(run_id, rnd) + f"checks/{j:05d}.json"


def sync_prefix(run_id: str, rnd: int) -> str:
    """Per-step synchronous mode: the gradient exchange objects of a round (deleted after it)."""
    return round_prefix(run_id, rnd) + "sync/"


# S3 lifecycle filters cannot match runs/*/rounds/*/updates/, so updates carry this tag.
UPDATE_TAG = "smlt-kind=update"


def final_prefix(run_id: str) -> str:
    return run_prefix(run_id) + "final/"


def final_model_key(run_id: str) -> str:
    return final_prefix(run_id) + "model.safetensors"


def final_metrics_key(run_id: str) -> str:
    return final_prefix(run_id) + "metrics.json"


def study_prefix(study_id: str) -> str:
    return f"{STUDIES}{study_id}/"


def study_key(study_id: str) -> str:
    """The validated study file (the controller's every step reads it)."""
    return study_prefix(study_id) + "study.json"


def study_best_prefix(study_id: str) -> str:
    """A study's result: the best trial's final model and metrics, copied here (another study's
    trials warm-start from it)."""
    return study_prefix(study_id) + "best/"


def code_key(sha256: str) -> str:
    """Users' code (`--code`), content-addressed: the same code is stored once, whichever run sends it."""
    return f"{CODE}{sha256}.zip"


def pipeline_job_key(pipeline: str) -> str:
    """The data bucket: a retraining pipeline's job."""
    return f"{INCOMING}{pipeline}/job.json"


def upload_key_pattern(name: str) -> str:
    """The trigger rule's key pattern (EventBridge wildcard, `*` matches `/` too) of a version's
    object `name`: incoming/<pipeline>/<version...>/<name>."""
    return f"{INCOMING}{ANY}/{ANY}/{name}"


def prepared_prefix(pipeline: str, version: str, tag: str) -> str:
    """Where a raw version is prepared: one folder per upload of its marker (`tag`, from the
    upload's key, ETag and sequencer), so a new upload never overwrites an earlier one's data."""
    return f"{PREPARED}{pipeline}/{version}/{tag}/"


# DynamoDB: one partition per run.
def pk(run_id: str) -> str:
    return f"RUN#{run_id}"


def study_pk(study_id: str) -> str:
    """DynamoDB: one partition per study."""
    return f"STUDY#{study_id}"


# One ledger item per invocation attempt (smlt.runtime.ledger).
ATTEMPT = "ATTEMPT#"


META = "META"

# The execution preparing a raw upload's run (smlt.runtime.steps.prepare): first writer wins, so a
# duplicated event never prepares or trains twice.
PREPARE = "PREPARE"


def plan_sk(rnd: int) -> str:
    return f"PLAN#{rnd:06d}"


def worker_sk(rnd: int, worker: int) -> str:
    return f"WORKER#{rnd:06d}#{worker:05d}"


def worker_prefix(rnd: int) -> str:
    return f"WORKER#{rnd:06d}#"


def seal_sk(rnd: int) -> str:
    """Written when the aggregator closes a round: no worker record may land after it."""
    return f"SEAL#{rnd:06d}"


# A request to stop the run (the dashboard's stop button, a study's early stop): the next Plan
# stops it, evaluates the newest model and finalizes it.
STOP = "STOP"


# The run's marker that a worker hit a UserCodeError (its ErrorItem): the round's other workers
# stop before doing any work, and the dashboard shows the run as failed with the user's error.
FATAL = "FATAL"


def error_sk(rnd: int, worker: int) -> str:
    """A worker's non-transient error (bad data, model too large), for the aggregator to report."""
    return f"ERROR#{rnd:06d}#{worker:05d}"


def round_sk(rnd: int) -> str:
    return f"ROUND#{rnd:06d}"


def parse_s3_uri(uri: str) -> tuple[str, str]:
    """'s3://bucket/some/prefix' -> ('bucket', 'some/prefix')."""
    if not uri.startswith("s3://"):
        raise ValueError(f"not an s3:// URI: {uri!r}")
    bucket, _, key = uri[5:].partition("/")
    if not bucket:
        raise ValueError(f"no bucket in {uri!r}")
    return bucket, key


# Retraining pipelines (smlt.runtime.pipeline). In the data bucket, next to the pipeline's job:
def pipeline_features_key(pipeline: str) -> str:
    """The pipeline's feature spec (its current generation), written when its first version is prepared."""
    return f"{INCOMING}{pipeline}/features.json"


# In the artifacts bucket:
def pipeline_latest_key(pipeline: str) -> str:
    """The champion: the model the pipeline serves and the next upload warm-starts from."""
    return f"{PIPELINES}{pipeline}/latest.json"


def pipeline_version_key(pipeline: str, version: str) -> str:
    """One data version's record: its run, metrics, cost, model, and whether the gate promoted it."""
    return f"{pipeline_versions_prefix(pipeline)}{version}.json"


def pipeline_versions_prefix(pipeline: str) -> str:
    return f"{PIPELINES}{pipeline}/versions/"


def pipeline_replaced_key(pipeline: str, version: str, run_id: str) -> str:
    """A version's record as it was before the version was uploaded again (its run `run_id`): kept
    for `rollback` to that run and for `smlt models list`."""
    return f"{pipeline_replaced_prefix(pipeline)}{version}/{run_id}.json"


def pipeline_replaced_prefix(pipeline: str) -> str:
    return f"{PIPELINES}{pipeline}/replaced/"


def pipeline_promotion_key(pipeline: str, at_ns: int) -> str:
    """One change of champion (promotion or rollback), append-only, in time order."""
    return f"{pipeline_promotions_prefix(pipeline)}{at_ns:020d}.json"


def pipeline_promotions_prefix(pipeline: str) -> str:
    return f"{PIPELINES}{pipeline}/promotions/"

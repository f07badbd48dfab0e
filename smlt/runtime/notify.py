"""The team's SNS topic (cdk.json `notify_topic_arn`, the functions' `notify_topic_arn` setting):
each pipeline version's outcome.

- Finalize publishes the gate's decision when it promotes a retrained model or keeps it rejected
  (smlt.runtime.pipeline.conclude): `decision_message`, `publish_decision`.
- PrepareData publishes a raw upload's refusal when a named data error (`InvalidDataset` and its
  kinds: `NoDataFile`, `UnsupportedFormat`, a column and line named, ...) ends its execution
  before training (smlt.runtime.steps.prepare, and for a table in parts the step after a Map that
  raises a part's error, smlt.runtime.steps.prepare_parts): `refusal_message`, `publish_refusal`,
  called by `refusal_told` around the step's core, which raises the same error again.
- The run's first Plan publishes a version's refusal raised after PrepareData, or for a prepared
  upload (`manifest.json`) in its place (smlt.runtime.trigger.job_from_trigger): the same rows as
  an earlier version, features other than the pipeline's, shards not uploaded, a job that cannot
  run on the version (its label, task, batch or model); once per run (`publish_refusal_once`:
  `runs/<run_id>/refused.json` in the artifacts bucket, written if absent, first), so a duplicated
  event's execution or a retried Plan does not tell it again. A bad or missing job.json is not a
  version's refusal and is not told (as at PrepareData).

One message per outcome: the subject `smlt: <pipeline> <version> promoted|rejected|refused`, the
body a JSON object, and the message attributes `pipeline` and `decision`, so a subscription's
filter policy can take the rejections or the refusals alone. A failed publish never fails the run,
changes the decision, or hides the refusal's error: it is logged (and a decision's kept on the
version's record, `notify_error`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

from smlt.runtime import clients, keys
from smlt.runtime.errors import InvalidDataset
from smlt.runtime.pipeline import VersionRecord
from smlt.runtime.store import S3Store

log = logging.getLogger(__name__)

E = TypeVar("E", bound=Exception)

SUBJECT_MAX = 100  # SNS's limit on a subject's characters


def decision_message(record: VersionRecord) -> tuple[str, dict[str, Any]]:
    """(the subject, the body) of a decided version's message."""
    decision = "promoted" if record.promoted else "rejected"
    body = {
        "pipeline": record.pipeline,
        "version": record.version,
        "decision": decision,
        "run_id": record.run_id,
        "metric": record.metric,
        "challenger": record.challenger_value,
        "champion": record.champion_value,
        "champion_version": record.champion_version,
        "margin": record.margin,
        "reason": record.reason,
        "cost_usd": record.cost_usd,
        "model": record.model,
        "model_sha256": record.model_sha256,
        "data": record.data,
    }
    return _subject(body), body


def publish_decision(topic_arn: str, record: VersionRecord) -> str | None:
    """Publish the decision on `record`; None when sent, else why not (logged, never raised)."""
    subject, body = decision_message(record)
    return _publish(topic_arn, subject, body)


@dataclass(frozen=True)
class Refusal:
    """A raw upload of a pipeline version refused before training: the named error that ends its
    execution (`error`, `message`), the upload's marker (`upload`, s3://DATA/incoming/<p>/<v>/_SUCCESS),
    its run id and the execution (its name)."""

    pipeline: str
    version: str
    error: str
    message: str
    upload: str
    run_id: str
    execution: str


def refusal_message(refusal: Refusal) -> tuple[str, dict[str, Any]]:
    """(the subject, the body) of a refused upload's message."""
    body = {"pipeline": refusal.pipeline, "version": refusal.version, "decision": "refused", **asdict(refusal)}
    return _subject(body), body


def publish_refusal(topic_arn: str, refusal: Refusal) -> str | None:
    """Publish the refusal; None when sent, else why not (logged, never raised)."""
    subject, body = refusal_message(refusal)
    return _publish(topic_arn, subject, body)


def refusal_key(run_id: str) -> str:
    """The artifacts bucket: the refusal of the run `run_id` before it started (its first Plan's),
    written once by the first teller, so a duplicated event or a retried Plan tells it once."""
    return f"{keys.run_prefix(run_id)}refused.json"


def publish_refusal_once(topic_arn: str, refusal: Refusal, artifacts: S3Store) -> str | None:
    """Publish the refusal unless its run's refusal was told already (`refusal_key`, written if
    absent first); None when sent or told before, else why not (logged, never raised)."""
    subject, body = refusal_message(refusal)
    try:
        first = artifacts.put(refusal_key(refusal.run_id), json.dumps(body, indent=1).encode(), if_absent=True)
    except Exception as e:  # noqa: BLE001 - told all the same: twice is better than never
        log.warning("the refusal of %s %s was not recorded: %s", refusal.pipeline, refusal.version, e)
        first = True
    return _publish(topic_arn, subject, body) if first else None


@contextmanager
def refusal_told(topic_arn: str, refusal_of: Callable[[InvalidDataset], Refusal | None]) -> Iterator[None]:
    """A named data error raised inside published as the version's refusal (`refusal_of` says
    which version, upload and execution; None: told already) when `topic_arn` is set, then raised
    again unchanged: the execution fails with the same error. A refusal that cannot be described
    or published is logged, never raised in the error's place."""
    try:
        yield
    except InvalidDataset as e:
        _tell(topic_arn, e, refusal_of, None)
        raise


@contextmanager
def refusal_told_once(
    topic_arn: str, refusal_of: Callable[[Exception], Refusal], errors: tuple[type[Exception], ...], artifacts: S3Store
) -> Iterator[None]:
    """`refusal_told` for the errors `errors` (at the run's first Plan: a data error, or a job
    that cannot run on the version), published by the run's first teller only
    (`publish_refusal_once` in `artifacts`), then raised again unchanged."""
    try:
        yield
    except errors as e:
        _tell(topic_arn, e, refusal_of, artifacts)
        raise


def _tell(topic_arn: str, error: E, refusal_of: Callable[[E], Refusal | None], once: S3Store | None) -> None:
    if not topic_arn:
        return
    try:
        refusal = refusal_of(error)
    except Exception as failed:  # noqa: BLE001 - the data error is what the execution says
        log.warning("the refusal (%s) was not published: %s: %s", type(error).__name__, type(failed).__name__, failed)
        return
    if refusal is None:
        return
    if once is not None:
        publish_refusal_once(topic_arn, refusal, once)
    else:
        publish_refusal(topic_arn, refusal)


def _subject(body: dict[str, Any]) -> str:
    return f"smlt: {body['pipeline']} {body['version']} {body['decision']}"[:SUBJECT_MAX]


def _publish(topic_arn: str, subject: str, body: dict[str, Any]) -> str | None:
    """Publish one outcome's message; None when sent, else why not (logged, never raised)."""
    try:
        clients.client("sns").publish(
            TopicArn=topic_arn,
            Subject=subject,
            Message=json.dumps(body, indent=1),
            MessageAttributes={
                "pipeline": {"DataType": "String", "StringValue": body["pipeline"]},
                "decision": {"DataType": "String", "StringValue": body["decision"]},
            },
        )
    except Exception as e:  # noqa: BLE001 - a notification never fails the run
        error = f"{topic_arn}: {type(e).__name__}: {e}"
        what = "refusal of" if body["decision"] == "refused" else "decision on"
        log.warning("the %s %s %s was not published: %s", what, body["pipeline"], body["version"], error)
        return error
    return None

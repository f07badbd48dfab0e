"""The team's SNS topic (cdk.json `notify_topic_arn`, the functions' `notify_topic_arn` setting):
each pipeline version's outcome.

- Finalize publishes the gate's decision when it promotes a retrained model or keeps it rejected
  (smlt.runtime.pipeline.conclude): `decision_message`, `publish_decision`.
- PrepareData publishes a raw upload's refusal when a named data error (`InvalidDataset` and its
  kinds: `NoDataFile`, `UnsupportedFormat`, a column and line named, ...) ends its execution
  before training (smlt.runtime.steps.prepare, and for a table in parts the step after a Map that
  raises a part's error, smlt.runtime.steps.prepare_parts): `refusal_message`, `publish_refusal`,
  called by `refusal_told` around the step's core, which raises the same error again.

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
from typing import Any

from smlt.runtime import clients
from smlt.runtime.errors import InvalidDataset
from smlt.runtime.pipeline import VersionRecord

log = logging.getLogger(__name__)

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


@contextmanager
def refusal_told(topic_arn: str, refusal_of: Callable[[InvalidDataset], Refusal | None]) -> Iterator[None]:
    """A named data error raised inside published as the version's refusal (`refusal_of` says
    which version, upload and execution; None: told already) when `topic_arn` is set, then raised
    again unchanged: the execution fails with the same error. A refusal that cannot be described
    or published is logged, never raised in the error's place."""
    try:
        yield
    except InvalidDataset as e:
        if topic_arn:
            try:
                refusal = refusal_of(e)
            except Exception as failed:  # noqa: BLE001 - the data error is what the execution says
                log.warning(
                    "the refusal (%s) was not published: %s: %s", type(e).__name__, type(failed).__name__, failed
                )
            else:
                if refusal is not None:
                    publish_refusal(topic_arn, refusal)
        raise


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

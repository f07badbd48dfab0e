"""The gate's decision on a pipeline version, published to the team's SNS topic (cdk.json
`notify_topic_arn`, the planner's `Settings.notify_topic_arn`) when Finalize promotes a retrained
model or keeps it rejected (smlt.runtime.pipeline.conclude).

One message per decision: the subject `smlt: <pipeline> <version> promoted|rejected`, the body a
JSON object (`decision_message`), and the message attributes `pipeline` and `decision`, so a
subscription's filter policy can take the rejections alone. A failed publish never fails the run
nor changes the decision: it is logged and kept on the version's record (`notify_error`).
"""

from __future__ import annotations

import json
import logging
from typing import Any

from smlt.runtime import clients
from smlt.runtime.pipeline import VersionRecord

log = logging.getLogger(__name__)

SUBJECT_MAX = 100  # SNS's limit on a subject's characters


def decision_message(record: VersionRecord) -> tuple[str, dict[str, Any]]:
    """(the subject, the body) of a decided version's message."""
    decision = "promoted" if record.promoted else "rejected"
    subject = f"smlt: {record.pipeline} {record.version} {decision}"[:SUBJECT_MAX]
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
    return subject, body


def publish_decision(topic_arn: str, record: VersionRecord) -> str | None:
    """Publish the decision on `record`; None when sent, else why not (logged, never raised)."""
    subject, body = decision_message(record)
    try:
        clients.client("sns").publish(
            TopicArn=topic_arn,
            Subject=subject,
            Message=json.dumps(body, indent=1),
            MessageAttributes={
                "pipeline": {"DataType": "String", "StringValue": record.pipeline},
                "decision": {"DataType": "String", "StringValue": body["decision"]},
            },
        )
    except Exception as e:  # noqa: BLE001 - a notification never fails the run
        error = f"{topic_arn}: {type(e).__name__}: {e}"
        log.warning("the decision on %s %s was not published: %s", record.pipeline, record.version, error)
        return error
    return None

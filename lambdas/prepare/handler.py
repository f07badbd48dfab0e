"""Prepare Lambda (the train_step image, its own command): a raw upload prepared into its run's
dataset before the run's first Plan (smlt.runtime.steps.prepare)."""

import time

# ruff: noqa: E402 - the timestamp comes before the imports, which are most of the init
LOADED_AT = time.time()  # the init the ledger bills starts here (smlt.runtime.ledger)

from aws_lambda_powertools import Logger

from smlt.runtime import metrics
from smlt.runtime.ledger import Meter
from smlt.runtime.retry import named_throttles
from smlt.runtime.steps import prepare_parts
from smlt.runtime.steps.events import PREPARE_EVENTS, PrepareDataEvent, PrepareFailedEvent, parse_event
from smlt.runtime.steps.prepare import PrepareSettings, prepare_failed, prepare_upload

logger = Logger(service=metrics.SERVICE)
meter = Meter(LOADED_AT, lambda: PrepareSettings().table)


@meter
@named_throttles  # a request throttled through botocore's attempts: Throttled, retried by the state machine
def handler(event, context):
    parsed = parse_event(PREPARE_EVENTS, event)
    settings = PrepareSettings()
    if isinstance(parsed, PrepareDataEvent):
        result = prepare_upload(settings, parsed).model_dump(mode="json")
    elif isinstance(parsed, PrepareFailedEvent):  # PrepareData failed for good: the refusal told
        result = prepare_failed(settings, parsed)
    else:  # a step of a table in parts (a Map's child, or the step after a Map)
        result = prepare_parts.handle(parsed, settings.notify_topic_arn)
    logger.info("prepare", extra=result)
    return result

"""Aggregate Lambda: average a round's updates into the next global model and record metrics.

`op` (default "aggregate"): "aggregate" = the single aggregator; sharded aggregation runs
"prepare", then "slice" (one per aggregator, with "slice" j and "of" k), then "finish".
The round's dashboard metrics (smlt.runtime.metrics), buffered when the ROUND item is written, are
published as one EMF log line.
"""

import time

# ruff: noqa: E402 - the timestamp comes before the imports, which are most of the init
LOADED_AT = time.time()  # the init the ledger bills starts here (smlt.runtime.ledger)

from aws_lambda_powertools import Logger
from pydantic import BaseModel

from smlt.runtime import metrics
from smlt.runtime.config import Settings
from smlt.runtime.ledger import Meter
from smlt.runtime.retry import named_throttles
from smlt.runtime.steps.aggregate import aggregate_round, finish_round, prepare_round, slice_round
from smlt.runtime.steps.events import (
    AGGREGATE_EVENTS,
    AggregateEvent,
    FinishEvent,
    PrepareEvent,
    SliceEvent,
    parse_event,
)

logger = Logger(service=metrics.SERVICE)

meter = Meter(LOADED_AT, lambda: Settings.from_env().table)


@meter
@named_throttles  # a request throttled through botocore's attempts: Throttled, retried by the state machine
def handler(event, context):
    settings = Settings.from_env()
    answer: BaseModel
    ev = parse_event(AGGREGATE_EVENTS, event)
    try:
        match ev:
            case AggregateEvent():
                answer = aggregate_round(settings, ev)
            case PrepareEvent():
                answer = prepare_round(settings, ev)
            case SliceEvent():
                answer = slice_round(settings, ev)
            case FinishEvent():
                answer = finish_round(settings, ev)
    finally:
        metrics.publish()
    result = answer.model_dump(mode="json")
    logger.info("aggregated", extra={"op": ev.op, **result})
    return result

"""Planner Lambda: validate the job, plan the next round (or stop), chain, finalize the run.
A round it plans to train has its shape on the dashboard (smlt.runtime.metrics, one EMF log line)."""

import time

# ruff: noqa: E402 - the timestamp comes before the imports, which are most of the init
LOADED_AT = time.time()  # the init the ledger bills starts here (smlt.runtime.ledger)

from aws_lambda_powertools import Logger
from pydantic import BaseModel

from smlt.runtime import metrics
from smlt.runtime.config import Settings
from smlt.runtime.ledger import Meter
from smlt.runtime.retry import named_throttles
from smlt.runtime.steps.events import PLANNER_EVENTS, ChainEvent, FinalizeEvent, PlanEvent, PlanTrain, parse_event
from smlt.runtime.steps.finalize import finalize
from smlt.runtime.steps.plan import chain, plan_next

logger = Logger(service=metrics.SERVICE)

meter = Meter(LOADED_AT, lambda: Settings.from_env().table)


@meter
@named_throttles  # a request throttled through botocore's attempts: Throttled, retried by the state machine
def handler(event, context):
    settings = Settings.from_env()
    answer: BaseModel
    ev = parse_event(PLANNER_EVENTS, event)
    match ev:
        case PlanEvent():
            answer = plan_next(settings, ev)
            if isinstance(answer, PlanTrain):
                metrics.add_plan(answer)
                metrics.publish()
        case ChainEvent():
            answer = chain(settings, ev)
        case FinalizeEvent():
            answer = finalize(settings, ev)
    result = answer.model_dump(mode="json")
    logger.info("planner", extra={"op": ev.op, "result": result})
    return result

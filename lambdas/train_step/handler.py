"""train_step Lambda (container image with PyTorch): one worker's round of local SGD."""

import time

# ruff: noqa: E402 - the timestamp comes before the imports, which are most of the init
LOADED_AT = time.time()  # the init the ledger bills starts here (smlt.runtime.ledger)

from aws_lambda_powertools import Logger

from smlt.runtime.config import Settings
from smlt.runtime.ledger import Meter
from smlt.runtime.steps.events import TRAIN_EVENTS, parse_event
from smlt.runtime.steps.train import run_worker

logger = Logger(service="smlt")
meter = Meter(LOADED_AT, lambda: Settings.from_env().table)


def _deadline(context) -> float | None:
    """When this invocation ends (time.monotonic()), from Lambda's context; None without one."""
    remaining = getattr(context, "get_remaining_time_in_millis", None)
    return time.monotonic() + remaining() / 1000 if remaining is not None else None


@meter
def handler(event, context):
    deadline = _deadline(context)  # the watchdog on the user's code stops it before this
    answer = run_worker(Settings.from_env(), parse_event(TRAIN_EVENTS, event), deadline=deadline)
    result = answer.model_dump(mode="json")
    logger.debug("worker done", extra=result)
    return result

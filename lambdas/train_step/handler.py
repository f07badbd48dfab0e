"""train_step Lambda (container image with PyTorch): one worker's round of local SGD."""

from aws_lambda_powertools import Logger

from smlt.config import Settings
from smlt.steps.events import TRAIN_EVENTS, parse_event
from smlt.steps.train import run_worker

logger = Logger(service="smlt")


def handler(event, context):
    result = run_worker(Settings.from_env(), parse_event(TRAIN_EVENTS, event)).model_dump(mode="json")
    logger.debug("worker done", extra=result)
    return result

"""Aggregate Lambda: average a round's updates into the next global model and record metrics."""

from aws_lambda_powertools import Logger

from smlt.aggregate.round import aggregate_round
from smlt.config import Settings

logger = Logger(service="smlt")


def handler(event, context):
    result = aggregate_round(Settings.from_env(), event["run_id"], int(event["round"]), event.get("outcomes"))
    logger.info("aggregated", extra=result)
    return result

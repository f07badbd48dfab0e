"""Aggregate Lambda: average a round's updates into the next global model and record metrics.

`op` (default "aggregate"): "aggregate" = the single aggregator; sharded aggregation runs
"prepare", then "slice" (one per aggregator, with "slice" j and "of" k), then "finish".
"""

from aws_lambda_powertools import Logger

from smlt.config import Settings
from smlt.steps.aggregate import aggregate_round, finish_round, prepare_round, slice_round

logger = Logger(service="smlt")


def handler(event, context):
    settings = Settings.from_env()
    op = event.get("op", "aggregate")
    run_id, rnd = event["run_id"], int(event["round"])
    if op == "aggregate":
        # The Map's outcomes travel in the event for the execution history; what counts is DynamoDB.
        result = aggregate_round(settings, run_id, rnd)
    elif op == "prepare":
        result = prepare_round(settings, run_id, rnd)
    elif op == "slice":
        result = slice_round(settings, run_id, rnd, int(event["slice"]), int(event["of"]))
    elif op == "finish":
        result = finish_round(settings, run_id, rnd)
    else:
        raise ValueError(f"unknown op {op!r}")
    logger.info("aggregated", extra={"op": op, **result})
    return result

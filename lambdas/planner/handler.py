"""Planner Lambda: validate the job, plan the next round (or stop), finalize the run."""

from aws_lambda_powertools import Logger

from smlt.config import Settings
from smlt.steps.finalize import finalize
from smlt.steps.plan import chain, plan_next

logger = Logger(service="smlt")


def handler(event, context):
    settings = Settings.from_env()
    op = event.get("op", "plan")
    if op == "plan":
        result = plan_next(settings, event.get("job"), event.get("execution") or "run")
    elif op == "chain":
        result = chain(settings, event["job"], event["run_id"], int(event["round"]), event["state_machine"])
    elif op == "finalize":
        result = finalize(settings, event["run_id"])
    else:
        raise ValueError(f"unknown op {op!r}")
    logger.info("planner", extra={"op": op, "result": result})
    return result

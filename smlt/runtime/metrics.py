"""The CloudWatch custom metrics of a run: one source for their names, namespace and dimensions.

The dashboard (infra/stacks/monitoring.py) graphs them and the handlers emit them with Powertools
as EMF log lines (CloudWatch Logs turns those into metrics: no PutMetricData call, no permission,
no request to bill). The aggregator emits a round's results when it writes the ROUND item, the
planner the shape of each round it plans; every datapoint has the dimensions (run_id, service),
one line per run on the dashboard.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING

from aws_lambda_powertools import Metrics
from aws_lambda_powertools.metrics import MetricUnit

if TYPE_CHECKING:  # the stack imports the names only
    from smlt.runtime.items import RoundItem
    from smlt.runtime.steps.events import PlanTrain

NAMESPACE = "smlt"
SERVICE = "smlt"  # Powertools' `service` dimension; also the functions' POWERTOOLS_SERVICE_NAME
RUN_ID = "run_id"
DIMENSIONS = (RUN_ID, "service")

LOSS = "Loss"  # validation loss of the model the round started from
VAL_ACCURACY = "ValAccuracy"
ROUND_SECONDS = "RoundSeconds"  # from plan to aggregated
SPEND_USD = "SpendUSD"  # the run's ledger so far
BUDGET_USD = "BudgetUSD"  # the job's budget (none: not emitted)
WORKERS = "Workers"
MEMORY_MB = "MemoryMB"

UNITS: dict[str, MetricUnit] = {
    LOSS: MetricUnit.NoUnit,
    VAL_ACCURACY: MetricUnit.NoUnit,
    ROUND_SECONDS: MetricUnit.Seconds,
    SPEND_USD: MetricUnit.NoUnit,
    BUDGET_USD: MetricUnit.NoUnit,
    WORKERS: MetricUnit.Count,
    MEMORY_MB: MetricUnit.Megabytes,
}
ROUND_METRICS = (LOSS, VAL_ACCURACY, ROUND_SECONDS, SPEND_USD, BUDGET_USD)  # the aggregator's
PLAN_METRICS = (WORKERS, MEMORY_MB)  # the planner's

# Powertools keeps the buffered metrics at class level: every instance shares them.
METRICS = Metrics(namespace=NAMESPACE, service=SERVICE)


def search(metric: str, stat: str, period_s: int) -> str:
    """The dashboard's expression for a metric: every run's series, by exactly these dimensions."""
    return f"SEARCH('{{{NAMESPACE},{','.join(DIMENSIONS)}}} MetricName=\"{metric}\"', '{stat}', {period_s})"


def add(run_id: str, values: Mapping[str, float | None]) -> None:
    """Buffer one datapoint of each metric that has a value (None or NaN: not measured, not sent)."""
    METRICS.add_dimension(RUN_ID, run_id)
    for name, value in values.items():
        if value is not None and math.isfinite(value):
            METRICS.add_metric(name=name, unit=UNITS[name], value=float(value))


def add_round(run_id: str, item: RoundItem, budget_usd: float | None) -> None:
    add(
        run_id,
        {
            LOSS: item.val_loss,
            VAL_ACCURACY: item.val_accuracy,
            ROUND_SECONDS: item.round_s,
            SPEND_USD: item.cost_total_usd,
            BUDGET_USD: budget_usd,
        },
    )


def add_plan(plan: PlanTrain) -> None:
    add(plan.run_id, {WORKERS: len(plan.workers), MEMORY_MB: plan.memory_mb})


def publish() -> None:
    """Print the buffered metrics as one EMF line on stdout (none buffered: no line), then clear
    them, also when POWERTOOLS_METRICS_DISABLED kept them from printing."""
    if METRICS.metric_set:
        METRICS.flush_metrics()
    METRICS.clear_metrics()

"""Every metric the CloudWatch dashboard graphs has data: the handlers' log output (EMF JSON on
stdout, as CloudWatch Logs reads it) holds each one, in the namespace and with the dimensions
the dashboard's SEARCH expressions ask for."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from lambdas.aggregate.handler import handler as aggregate
from lambdas.planner.handler import handler as planner
from lambdas.train_step.handler import handler as train_step
from tests.functional.handlers.conftest import job

# SEARCH('{namespace,dimension,...} MetricName="Name"', 'Stat', period)
SEARCH = re.compile(r"SEARCH\('\{(?P<schema>[^}]*)\} MetricName=\"(?P<name>\w+)\"', '\w+', \d+\)")


@pytest.fixture(scope="module")
def graphed(tmp_path_factory) -> set[tuple[str, frozenset[str], str]]:
    """(namespace, dimensions, metric) of every SEARCH on the synthesized stack's dashboard."""
    from tests.infra.conftest import synthesize

    synth = synthesize(tmp_path_factory.mktemp("cdk-out-dashboard"))
    (dashboard,) = synth.resources("AWS::CloudWatch::Dashboard").values()
    _, parts = dashboard["Properties"]["DashboardBody"]["Fn::Join"]
    body = json.loads("".join(p if isinstance(p, str) else "TOKEN" for p in parts))
    found = set()
    for widget in body["widgets"]:
        for line in widget.get("properties", {}).get("metrics", []):
            for m in line:
                hit = isinstance(m, dict) and SEARCH.fullmatch(m.get("expression", ""))
                if hit:
                    namespace, *dimensions = hit["schema"].split(",")
                    found.add((namespace, frozenset(dimensions), hit["name"]))
    return found


def _emf(text: str) -> list[dict[str, Any]]:
    """The EMF documents among the printed lines (the other lines are the handlers' JSON logs)."""
    docs = []
    for line in text.splitlines():
        try:
            doc = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(doc, dict) and "_aws" in doc:
            docs.append(doc)
    return docs


def _emitted(docs: list[dict[str, Any]]) -> dict[tuple[str, frozenset[str], str], list[Any]]:
    """{(namespace, dimensions, metric): [(value, {dimension: value}), ...]} (a document holds a
    list of values, or one)."""
    out: dict[tuple[str, frozenset[str], str], list[Any]] = {}
    for doc in docs:
        for directive in doc["_aws"]["CloudWatchMetrics"]:
            for dims in directive["Dimensions"]:
                for metric in directive["Metrics"]:
                    key = (directive["Namespace"], frozenset(dims), metric["Name"])
                    values = doc[metric["Name"]]
                    for v in values if isinstance(values, list) else [values]:
                        out.setdefault(key, []).append((v, {d: doc[d] for d in dims}))
    return out


@pytest.fixture(autouse=True)
def metrics_on(monkeypatch):
    # A local run in the same session (the e2e engine) turns the EMF output off for its process.
    monkeypatch.delenv("POWERTOOLS_METRICS_DISABLED", raising=False)


def test_every_dashboard_metric_is_in_the_handlers_output(digits, graphed, capsys):
    assert len(graphed) == 7, graphed  # loss, accuracy, round time, spend, budget, workers, memory
    j = {**job(digits, max_rounds=2, target_value=None, local_steps=2), "constraints": {"budget_usd": 0.5}}
    run = "metrics-run"
    capsys.readouterr()
    p = planner({"op": "plan", "job": j, "execution": run}, None)
    assert p["action"] == "train"
    for w in p["workers"]:
        train_step({"run_id": run, "round": 0, "worker": w}, None)
    agg = aggregate({"run_id": run, "round": 0}, None)
    emitted = _emitted(_emf(capsys.readouterr().out))

    missing = graphed - set(emitted)
    assert not missing, f"graphed but not emitted: {sorted(m for _, _, m in missing)}; emitted {sorted(emitted)}"
    for key in graphed:
        for _, dims in emitted[key]:
            assert dims == {"run_id": run, "service": "smlt"}, (key, dims)
    by_name = {name: [v for v, _ in values] for (_, _, name), values in emitted.items()}
    assert by_name["Workers"] == [len(p["workers"])] and by_name["MemoryMB"] == [p["memory_mb"]]
    assert by_name["BudgetUSD"] == [0.5]
    assert by_name["ValAccuracy"] == [pytest.approx(agg["val_accuracy"], abs=1e-6)]
    # round 0: the ledger so far is this round's cost
    assert by_name["SpendUSD"] == [pytest.approx(agg["cost_usd"], abs=1e-6)] and agg["cost_usd"] > 0


def test_a_replayed_aggregate_emits_nothing_again(digits, capsys):
    """A duplicate invocation of an aggregated round answers from the ROUND item, without metrics."""
    j = job(digits, max_rounds=2, target_value=None, local_steps=2)
    p = planner({"op": "plan", "job": j, "execution": "replay"}, None)
    for w in p["workers"]:
        train_step({"run_id": "replay", "round": 0, "worker": w}, None)
    first = aggregate({"run_id": "replay", "round": 0}, None)
    capsys.readouterr()
    assert aggregate({"run_id": "replay", "round": 0}, None) == first
    assert _emf(capsys.readouterr().out) == []

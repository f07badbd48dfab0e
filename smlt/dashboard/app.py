"""`smlt dashboard`: the web page, a Plotly Dash app over :mod:`smlt.dashboard.data`.

Dash ships its JavaScript (React, plotly.js) in the wheel and serves it itself, so the page
needs no network and no build step; the charts are Plotly figures. Three views, by URL:
`/` (runs and studies), `/run/<id>` (curves against time and cost, the ledger against the
budget, the plans and their reasons, the current round's workers, the stop button, and the
user's error that failed the run: its type, message and frames in the user's files) and
`/study/<id>` (its trials, the stopped ones marked). Every view polls (`dcc.Interval`), so a
running run's curves grow while it trains.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar, cast

import dash
import plotly.graph_objects as go
from botocore.exceptions import BotoCoreError, ClientError
from dash import Input, Output, State, dcc, html
from dash.exceptions import PreventUpdate
from werkzeug.serving import BaseWSGIServer, make_server

from smlt.dashboard import data
from smlt.dashboard.data import Source
from smlt.outputs import forecast_text
from smlt.runtime.errors import InvalidJob, RunNotFound
from smlt.runtime.evaluation import class_warning


def _money(v: float | None) -> str:
    return "-" if v is None else f"${v:.5f}"


def _num(v: float | None, fmt: str = ".4f") -> str:
    return "-" if v is None else format(v, fmt)


def _data(name: str, value: str) -> dict[str, Any]:
    """A data-* attribute (Dash's html components take them as wildcard keywords): the tests'
    handle on a row."""
    return {name: value}


def _table(table_id: str, header: list[str]) -> html.Table:
    return html.Table(id=table_id, className="grid", children=[html.Thead(html.Tr([html.Th(h) for h in header]))])


def _rows(header: list[str], rows: list[html.Tr]) -> list[Any]:
    return [html.Thead(html.Tr([html.Th(h) for h in header])), html.Tbody(rows)]


RUNS_HEADER = ["run", "job", "status", "rounds", "metric", "cost", "budget", "started"]
STUDIES_HEADER = ["study", "search", "status", "trials", "best", "spent", "budget"]
PLANS_HEADER = [
    "round",
    "action",
    "workers",
    "memory MB",
    "k",
    "predicted s",
    "predicted cost",
    "left to the end (rounds, s, $; p70)",
    "reason",
]
WORKERS_HEADER = ["worker", "samples", "steps", "cut", "train loss", "load s", "compute s", "upload s", "cold"]
TRIALS_HEADER = ["trial", "run", "status", "rung", "rounds", "metric", "cost", "params", "why it ended"]


def runs_rows(source: Source) -> list[Any]:
    rows = [
        html.Tr(
            [
                html.Td(dcc.Link(r.run_id, href=f"/run/{r.run_id}")),
                html.Td(r.name),
                html.Td(r.status, className=f"status status-{r.status.lower()}"),
                html.Td(str(r.rounds)),
                html.Td(f"{r.metric} {_num(r.value)}"),
                html.Td(_money(r.cost_usd)),
                html.Td(_money(r.budget_usd)),
                html.Td(time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r.created_at))),
            ],
            **_data("data-run", r.run_id),
        )
        for r in data.list_runs(source)
    ]
    return _rows(RUNS_HEADER, rows)


def studies_rows(source: Source) -> list[Any]:
    rows = [
        html.Tr(
            [
                html.Td(dcc.Link(s.study_id, href=f"/study/{s.study_id}")),
                html.Td(s.search),
                html.Td(s.status, className=f"status status-{s.status.lower()}"),
                html.Td(str(s.trials)),
                html.Td(
                    f"{s.metric} {_num(s.best_metric)}"
                    + (f" (trial {s.best_trial})" if s.best_trial is not None else "")
                ),
                html.Td(_money(s.spent_usd)),
                html.Td(_money(s.budget_usd)),
            ],
            **_data("data-study", s.study_id),
        )
        for s in data.studies(source)
    ]
    return _rows(STUDIES_HEADER, rows)


def curve_figures(view: data.RunView) -> tuple[go.Figure, go.Figure]:
    """Loss and the task's metric against time (s since the run started) and against cost."""
    points = view.curve()
    figures = []
    for x_name, title in (("elapsed_s", "seconds since the run started"), ("cost_usd", "cost so far (USD)")):
        x = [getattr(p, x_name) for p in points]
        fig = go.Figure()
        fig.add_scatter(x=x, y=[p.val_loss for p in points], name="val loss", mode="lines+markers")
        fig.add_scatter(x=x, y=[p.train_loss for p in points], name="train loss", mode="lines+markers")
        fig.add_scatter(x=x, y=[p.metric for p in points], name=view.metric, mode="lines+markers", yaxis="y2")
        fig.update_layout(
            xaxis_title=title,
            yaxis=dict(title="loss"),
            yaxis2=dict(title=view.metric, overlaying="y", side="right"),
            margin=dict(l=50, r=50, t=30, b=40),
            height=320,
            legend=dict(orientation="h", y=1.12),
            uirevision=view.meta.run_id,  # keep the user's zoom across polls
        )
        figures.append(fig)
    return figures[0], figures[1]


def budget_figure(view: data.RunView) -> go.Figure:
    budget = view.budget_usd
    fig = go.Figure(
        go.Indicator(
            mode="number+gauge",
            value=view.spent_usd,
            number=dict(prefix="$", valueformat=".5f"),
            gauge=dict(shape="bullet", axis=dict(range=[0, budget or max(view.spent_usd, 1e-9)])),
            title=dict(text="spent" + (f" of ${budget:.4f}" if budget else " (no budget)")),
        )
    )
    fig.update_layout(height=110, margin=dict(l=230, r=40, t=20, b=20))
    return fig


def plans_rows(view: data.RunView) -> list[Any]:
    rows = [
        html.Tr(
            [
                html.Td(str(p.round)),
                html.Td(p.action + (f" ({p.bound})" if p.bound not in ("none", "") else "")),
                html.Td(_num(p.workers, "d")),
                html.Td(_num(p.memory_mb, "d")),
                html.Td(_num(p.local_steps, "d")),
                html.Td(_num(p.predicted_round_s, ".1f")),
                html.Td(_money(p.predicted_round_cost_usd)),
                html.Td(forecast_text(p)),  # the planner's forecast at this plan (the ETA)
                html.Td(p.reason, className="reason"),
            ]
        )
        for p in reversed(view.plans)  # newest first
    ]
    return _rows(PLANS_HEADER, rows)


def workers_rows(view: data.RunView) -> list[Any]:
    rows = [
        html.Tr(
            [
                html.Td(str(w.worker)),
                html.Td(str(w.samples)),
                html.Td(str(w.steps)),
                html.Td("cut" if w.cut else ""),
                html.Td(_num(w.train_loss)),
                html.Td(_num(w.load_s, ".2f")),
                html.Td(_num(w.compute_s, ".2f")),
                html.Td(_num(w.upload_s, ".2f")),
                html.Td("cold" if w.cold else ""),
            ]
        )
        for w in view.workers
    ]
    return _rows(WORKERS_HEADER, rows)


def trials_rows(trials: list[Any]) -> list[Any]:
    rows = [
        html.Tr(
            [
                html.Td(str(t.trial)),
                html.Td(dcc.Link(t.run_id, href=f"/run/{t.run_id}")),
                html.Td(
                    t.status + (" ✕" if t.status == "STOPPED" else ""), className=f"status status-{t.status.lower()}"
                ),
                html.Td(str(t.rung)),
                html.Td(str(t.rounds)),
                html.Td(_num(t.metric)),
                html.Td(_money(t.cost_usd)),
                html.Td(", ".join(f"{k}={v}" for k, v in sorted(t.params.items()))),
                html.Td(t.stop_reason or "", className="reason"),
            ],
            className=f"trial trial-{t.status.lower()}",
            **_data("data-trial", str(t.trial)),
        )
        for t in trials
    ]
    return _rows(TRIALS_HEADER, rows)


def failure_panel(failure: data.RunFailure | None) -> list[Any]:
    """The user's error that failed the run, as the CLI prints it: the exception's type, its
    message and the frames in the user's files (innermost last)."""
    if failure is None:
        return []
    where = ", ".join(
        part
        for part in (
            f"round {failure.round}" if failure.round is not None else "",
            f"worker {failure.worker}" if failure.worker is not None else "",
        )
        if part
    )
    return [
        html.H3(
            f"Failed: {failure.error}"
            + (f" ({failure.exception})" if failure.exception else "")
            + (f" in {where}" if where else ""),
            className="status-failed",
        ),
        html.Pre(failure.message, id="failure-message", className="failure"),
        html.Ol([html.Li(html.Code(f)) for f in failure.frames], id="failure-frames", className="frames"),
        html.P("Fix your code and start the run again: a resume would run the same code.", className="reason"),
    ]


def home_page() -> list[Any]:
    return [
        html.H2("Runs"),
        _table("runs-table", RUNS_HEADER),
        html.H2("Studies"),
        _table("studies-table", STUDIES_HEADER),
    ]


def run_page(run_id: str) -> list[Any]:
    return [
        dcc.Store(id="run-id", data=run_id),
        dcc.Link("← all runs", href="/"),
        html.H2(f"Run {run_id}"),
        html.Div(id="run-status", className="run-status"),
        html.Div(id="run-failure"),
        html.Div(
            className="stop",
            children=[
                dcc.Input(id="stop-reason", placeholder="why stop (optional)", debounce=False, style={"width": "24em"}),
                html.Button("Stop run (finalize the best model so far)", id="stop-button", n_clicks=0),
                html.Span(id="stop-result"),
            ],
        ),
        dcc.Graph(id="budget-graph", config={"displayModeBar": False}),
        html.Div(className="curves", children=[dcc.Graph(id="curve-time"), dcc.Graph(id="curve-cost")]),
        html.H3(id="workers-title", children="Workers"),
        _table("workers-table", WORKERS_HEADER),
        html.H3("Plans (newest first)"),
        _table("plans-table", PLANS_HEADER),
    ]


def study_page(study_id: str) -> list[Any]:
    return [
        dcc.Store(id="study-id", data=study_id),
        dcc.Link("← all runs and studies", href="/"),
        html.H2(f"Study {study_id}"),
        html.Div(id="study-summary"),
        _table("trials-table", TRIALS_HEADER),
    ]


CSS = """
body { font-family: sans-serif; margin: 1.5em; color: #222; }
table.grid { border-collapse: collapse; font-size: 0.9em; }
table.grid th, table.grid td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: left; }
.status-running { color: #0a5; } .status-stopping { color: #c70; } .status-succeeded { color: #236; }
.status-stopped, .trial-stopped td { color: #a33; } .status-failed { color: #c00; font-weight: bold; }
.curves { display: flex; flex-wrap: wrap; } .curves > div { flex: 1 1 480px; }
pre.failure { background: #fee; padding: 0.6em; white-space: pre-wrap; max-width: 70em; }
.stop { margin: 0.8em 0; } .stop button { margin: 0 0.6em; } .reason { max-width: 50em; }
"""


def make_app(source: Source, interval_s: float = 2.0) -> dash.Dash:
    app = dash.Dash(__name__, title="smlt", suppress_callback_exceptions=True, update_title="")
    app.index_string = app.index_string.replace("{%css%}", "{%css%}<style>" + CSS + "</style>")
    app.layout = html.Div(
        [
            dcc.Location(id="url"),
            html.H1("smlt"),
            html.Div(source.label, id="source"),
            dcc.Interval(id="tick", interval=int(interval_s * 1000)),
            html.Div(id="error", className="status-failed"),
            html.Div(id="page"),
        ]
    )
    _callbacks(app, source)
    return app


F = TypeVar("F", bound=Callable[..., Any])


def _keep_on_aws_error(fn: F) -> F:
    """A poll that cannot read the stack leaves the view as it was (the `health` callback says why)."""

    @functools.wraps(fn)
    def wrapper(*args: Any) -> Any:
        try:
            return fn(*args)
        except (BotoCoreError, ClientError):
            raise PreventUpdate from None

    return cast(F, wrapper)


def _callbacks(app: dash.Dash, source: Source) -> None:
    @app.callback(Output("page", "children"), Input("url", "pathname"))
    def route(path: str | None) -> list[Any]:
        parts = (path or "/").strip("/").split("/", 1)
        if len(parts) == 2 and parts[0] == "run":
            return run_page(parts[1])
        if len(parts) == 2 and parts[0] == "study":
            return study_page(parts[1])
        return home_page()

    @app.callback(Output("error", "children"), Input("tick", "n_intervals"))
    def health(_: int | None) -> str:
        """The one place a read error shows; the views keep their last data meanwhile."""
        try:
            source.ddb.describe_table(TableName=source.stack.table)
        except (BotoCoreError, ClientError) as e:
            return f"cannot read {source.label}: {e} (showing the last data read)"
        return ""

    @app.callback(Output("runs-table", "children"), Output("studies-table", "children"), Input("tick", "n_intervals"))
    @_keep_on_aws_error
    def lists(_: int | None) -> tuple[list[Any], list[Any]]:
        return runs_rows(source), studies_rows(source)

    @app.callback(
        Output("run-status", "children"),
        Output("run-failure", "children"),
        Output("curve-time", "figure"),
        Output("curve-cost", "figure"),
        Output("budget-graph", "figure"),
        Output("workers-title", "children"),
        Output("workers-table", "children"),
        Output("plans-table", "children"),
        Output("stop-button", "disabled"),
        Input("tick", "n_intervals"),
        Input("run-id", "data"),
    )
    @_keep_on_aws_error
    def run_panels(_: int | None, run_id: str) -> tuple[Any, ...]:
        view = data.run_view(source, run_id)
        if view is None:
            return (
                f"no run {run_id!r} in {source.stack.table}",
                [],
                go.Figure(),
                go.Figure(),
                go.Figure(),
                "",
                [],
                [],
                True,
            )
        return (
            _status_line(view),
            failure_panel(view.failure),
            *curve_figures(view),
            budget_figure(view),
            _workers_title(view),
            workers_rows(view),
            plans_rows(view),
            view.status in ("SUCCEEDED", "FAILED"),  # a finished run has nothing to stop
        )

    @app.callback(
        Output("stop-result", "children"),
        Input("stop-button", "n_clicks"),
        State("run-id", "data"),
        State("stop-reason", "value"),
        prevent_initial_call=True,
    )
    def stop(clicks: int, run_id: str, reason: str | None) -> str:
        try:
            item = data.request_stop(source.run(run_id), reason or "from the dashboard")
        except (RunNotFound, InvalidJob, BotoCoreError, ClientError) as e:
            return f"not stopped: {e}"
        return f"stop requested by {item.by}: {item.reason} (the next plan stops the run and finalizes its best model)"

    @app.callback(
        Output("study-summary", "children"),
        Output("trials-table", "children"),
        Input("tick", "n_intervals"),
        Input("study-id", "data"),
    )
    @_keep_on_aws_error
    def study_panels(_: int | None, study_id: str) -> tuple[Any, list[Any]]:
        found = data.study_view(source, study_id)
        if found is None:
            return f"no study {study_id!r}", []
        s, trials = found
        stopped = sum(t.status == "STOPPED" for t in trials)
        summary = (
            f"{s.status}: {s.search} search, {len(trials)} of {s.trials} trials, {stopped} stopped early; "
            f"best {s.metric} {_num(s.best_metric)}"
            + (f" (trial {s.best_trial}, run {s.best_run_id})" if s.best_trial is not None else "")
            + f"; spent {_money(s.spent_usd)} of {_money(s.budget_usd)}"
        )
        return summary, trials_rows(trials)


def _workers_title(view: data.RunView) -> str:
    if view.workers_round is None:
        return "Workers (none has reported yet)"
    plan = next((p for p in view.plans if p.round == view.workers_round), None)
    planned = f" of {plan.workers}" if plan is not None and plan.workers else ""
    return f"Workers of round {view.workers_round} ({len(view.workers)}{planned} reported)"


def _status_line(view: data.RunView) -> str:
    m = view.meta
    line = f"{view.status} | job {m.job.name} | {len(view.rounds)} rounds aggregated"
    if view.stop is not None:
        line += f" | stop requested by {view.stop.by}: {view.stop.reason}"
    if m.final is not None:
        line += f" | stop reason: {m.final.stop_reason}"
        warning = class_warning(m.final.model_dump())
        if warning:
            line += f" | warning: {warning}"
    return line


def serve(app: dash.Dash, host: str = "127.0.0.1", port: int = 8050) -> BaseWSGIServer:
    """The app on a threaded WSGI server (port 0: any free one); call ``serve_forever()``."""
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # not a line per poll
    return make_server(host, port, app.server, threaded=True)

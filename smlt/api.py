"""smlt's Python API, for notebooks and scripts: `smlt.train`, `smlt.tune`, `smlt.load_model`,
`smlt.predict`, `smlt.export`. `import smlt` imports none of this until a name is used
(smlt/__init__.py), so the Lambda layer, which ships only smlt/__init__.py and smlt/runtime/, needs
nothing else.

Each function does what the command of the same name does (the CLI and the API call the same
functions: smlt.runner, smlt.studies, smlt.inference, smlt.exporter) and returns a typed result instead
of printing; pass `verbose=True` to see the CLI's progress lines as well.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from smlt.exporter import Exported, Format, export_model
from smlt.inference import LoadedModel, Predictions, load_model
from smlt.runtime.errors import InvalidJob
from smlt.runtime.items import FinalMetrics

__all__ = [
    "Exported",
    "LoadedModel",
    "Predictions",
    "StudyResult",
    "TrainResult",
    "export",
    "load_model",
    "predict",
    "train",
    "tune",
]


@contextlib.contextmanager
def _lines(verbose: bool) -> Iterator[None]:
    if not verbose:
        yield
        return
    from smlt.cli.console import console

    with console():
        yield


@dataclass(frozen=True)
class TrainResult:
    """A finished run: its id, final metrics and where its outputs are."""

    run_id: str
    metrics: FinalMetrics
    out: Path
    files: dict[str, Path] = field(default_factory=dict)  # model.safetensors, model.json, metrics.json, ...

    @property
    def model_path(self) -> Path | None:
        return self.files.get("model.safetensors")

    def load_model(self) -> LoadedModel:
        return load_model(self.out)


def _outputs(out: Path) -> dict[str, Path]:
    names = ("model.safetensors", "model.json", "code.zip", "metrics.json", "report.png", "history.json")
    return {n: out / n for n in names if (out / n).exists()}


def _job_file(job: Any, folder: Path) -> Path:
    """A job given as a path, a dict or a Job, as a job file (a local dataset path made absolute,
    so it still means what it meant from the caller's folder)."""
    if isinstance(job, (str, Path)):
        return Path(job)
    raw = job.model_dump(mode="json", exclude_none=True) if hasattr(job, "model_dump") else dict(job)
    if not isinstance(raw, dict):
        raise InvalidJob(f"job: a path, a dict or a smlt Job, got {type(job).__name__}")
    uri = (raw.get("dataset") or {}).get("uri")
    if isinstance(uri, str) and ":" not in uri and Path(uri).exists():
        raw = {**raw, "dataset": {**raw["dataset"], "uri": str(Path(uri).resolve())}}
    path = folder / "job.json"
    path.write_text(json.dumps(raw, indent=1))
    return path


def train(
    job: str | Path | dict[str, Any] | Any,
    *,
    local: bool = True,
    out: str | Path | None = "out",
    code: str | Path | None = None,
    faults: str | None = None,
    replace: bool = False,
    stack: str = "Smlt",
    verbose: bool = False,
) -> TrainResult:
    """Run a training job to its end and fetch its outputs into `out`: `smlt run --local JOB`
    (local=True), or `smlt start` + `smlt fetch` on the deployed `stack` (local=False). `job` is a
    job file, a dict or a `smlt.runtime.job.Job`; `code` the folder of your model's code. `out`
    None: out/, or out/RUN/ when out/ holds another run's outputs (the CLI's default); `replace`
    discards a saved state of the same run id in `out` (else such a run is refused)."""
    from smlt.extras import require
    from smlt.paths import out_folder
    from smlt.precheck import check_job_file

    folder = out_folder(Path(out)) if out is not None else None
    code_dir = Path(code) if code is not None else None
    if faults and not local:
        raise InvalidJob("faults: only on the local engine (local=True, --local)")
    if local:
        require("local", "the local engine")  # before the model is checked
    with tempfile.TemporaryDirectory(prefix="smlt-job-") as tmp, _lines(verbose):
        path = _job_file(job, Path(tmp))
        # the model built here once before any engine, stack or upload (as smlt start checks it, for AWS)
        check_job_file(path, code=code_dir, s3=not local)
        if local:
            from smlt.runner import run_local

            metrics = run_local(path, folder, faults=faults, code=code_dir, replace=replace)
        else:
            metrics = _train_deployed(path, stack, folder or Path("out"), code_dir)
    final = FinalMetrics.model_validate(metrics["final"])
    if folder is None:
        from smlt.runner import default_out

        folder = default_out(final.run_id)  # where run_local wrote, by the same rule, now its outputs are there
    return TrainResult(final.run_id, final, folder, _outputs(folder))


def _train_deployed(path: Path, stack_name: str, out: Path, code: Path | None, poll_s: float = 5.0) -> dict:
    import time

    from smlt import cloud
    from smlt.runtime import clients
    from smlt.runtime.errors import RunFailed

    stack = cloud.Stack.lookup(stack_name)
    run_id = cloud.start(path, stack, code=code)
    sfn = clients.make("stepfunctions")
    while True:
        time.sleep(poll_s)
        runs = [
            e
            for page in sfn.get_paginator("list_executions").paginate(stateMachineArn=stack.state_machine_arn)
            for e in page["executions"]
            if e["name"] == run_id or e["name"].startswith(run_id[:66] + "-")
        ]
        newest = max(runs, key=lambda e: e["startDate"]) if runs else None
        if newest is None or newest["status"] == "RUNNING":
            continue
        desc = sfn.describe_execution(executionArn=newest["executionArn"])
        if desc["status"] != "SUCCEEDED":
            raise RunFailed(run_id, desc["status"], desc.get("error", ""), desc.get("cause", ""))
        if json.loads(desc.get("output") or "{}").get("chain"):
            continue  # chained into a fresh execution: follow it
        return cloud.fetch(run_id, stack, out, sfn=sfn)


@dataclass(frozen=True)
class StudyResult:
    """A finished study: its best trial's run and metric, and every trial."""

    study_id: str
    best_run_id: str | None
    best_value: float | None
    metric: str
    trials: list[dict[str, Any]]
    out: Path
    spent_usd: float

    def load_model(self) -> LoadedModel:
        return load_model(self.out)


def tune(
    study: str | Path | dict[str, Any],
    *,
    local: bool = True,
    out: str | Path = "out",
    stack: str = "Smlt",
    verbose: bool = False,
    faults: str | None = None,
) -> StudyResult:
    """Run a hyper-parameter study (docs/studies.md) to its end: `smlt tune STUDY [--local]`."""
    from smlt import studies
    from smlt.extras import require
    from smlt.paths import out_folder

    if faults and not local:
        raise InvalidJob("faults: only on the local engine (local=True, --local)")
    out = out_folder(Path(out))
    if local:
        require("local", "the local engine")  # before the study is checked
    with tempfile.TemporaryDirectory(prefix="smlt-study-") as tmp, _lines(verbose):
        path = _job_file(study, Path(tmp)) if not isinstance(study, (str, Path)) else Path(study)
        if local:
            meta, trials = studies.tune_local(path, out, faults=faults)
        else:
            studies.check_study_file(path)  # a bad file needs no AWS access
            meta, trials = studies.run(studies.deployed_target(stack), path, out)
    return StudyResult(
        meta.study_id,
        meta.best_run_id,
        meta.best_metric,
        meta.metric,
        [t.model_dump(mode="json") for t in trials],
        out,
        meta.spent_usd,
    )


def predict(
    model: LoadedModel | str | Path,
    data: Any,
    *,
    out: str | Path | None = None,
    split: str = "validation",
    runs: str | Path = "out",
    stack: str | None = None,
    id_column: str | None = None,
    encoding: str | None = None,
) -> Predictions:
    """Predict with a run's model (a LoadedModel, or what `load_model` takes) on `data`: a .csv /
    .parquet / .xlsx / .npz file, an image or image folder, a folder of a table's parts (`part-00000.csv`,
    ...: its rows in the parts' order), a prepared dataset (its `split`), a DataFrame or an array. With
    `out` (.csv, .parquet or .xlsx) the predictions are also written there. `id_column`: a table's column
    that names each prediction (`PassengerId`), instead of its line or row number. `encoding`: a CSV's
    (.tsv, .txt) when it is not UTF-8 and has no byte-order mark (`cp1252`: Excel's "CSV (Comma
    delimited)" on Windows); without it such a file is refused."""
    loaded = model if isinstance(model, LoadedModel) else load_model(model, out=runs, stack=stack)
    result = loaded.predict(data, split=split, id_column=id_column, encoding=encoding)
    if out is not None:
        result.write(out)
    return result


def export(
    model: LoadedModel | str | Path,
    format: Format = "onnx",
    *,
    out: str | Path | None = None,
    data: Any = None,
    raw: bool = False,
    runs: str | Path = "out",
    stack: str | None = None,
) -> Exported:
    """Export a run's model for serving (`smlt export`): `format` "onnx" or "torch-export", to `out`
    (default: model.onnx / model.pt2 beside the model when it is a folder, else in the current
    folder). The file takes what the data holds (the card's preprocessing inside) and gives
    probabilities or values in the label's units, checked against `smlt.predict` on `data`'s rows
    (default: a seeded batch); `raw=True` exports the bare network (smlt.serving)."""
    from smlt.exporter import SUFFIX

    loaded = model if isinstance(model, LoadedModel) else load_model(model, out=runs, stack=stack)
    if out is None:
        folder = Path(model) if isinstance(model, (str, Path)) and Path(model).is_dir() else Path(".")
        out = folder / f"model{SUFFIX.get(format, '')}"
    return export_model(loaded, format, Path(out), data=data, raw=raw)

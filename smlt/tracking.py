"""A run's curves for a team's own tracking: TensorBoard event files and an MLflow run (the
`tracking` extra: tensorboard, mlflow-skinny). Client-side only: the runtime never imports it.

TensorBoard (`tensorboard --logdir OUT/tensorboard`): per round the losses and metrics, workers,
memory, local steps, round seconds and the spend against the budget (`round_scalars`). A local
run writes each round as it is reported (`LiveTracking`, flushed per round: a run in progress or
an interrupted one shows its curves); every fetch of a finished run (`smlt run`, `smlt fetch`,
the watcher) rewrites the folder from metrics.json with the job's hyper-parameters and the final
metrics, so fetching twice leaves one set of curves. The fetched files are also stored under the
run's prefix (`runs/<run id>/tensorboard/`).

MLflow, with `tracking.mlflow_uri` in the job or the MLFLOW_TRACKING_URI environment variable:
the job's settings as params, the same per-round scalars as metrics (step = round; live on a
local run, and at the end), and at the end the final metrics, model.safetensors, model.json
(and code.zip) and metrics.json as artifacts, the MLflow run then FINISHED. Exactly once per run:
the MLflow run carries the smlt run id as its tag `smlt.run_id` and is found by it before one is
created, so a resume, a repeated fetch or a retried Finalize continue the same MLflow run; a
metric's step already in its history, a param or a final metric already logged, is not logged
again. A tracking server that fails is a warning naming its URI, never a failed run (the model
is stored already); `smlt track OUT` logs the fetched run again (`log_mlflow`).
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from smlt.runtime.errors import SmltError
from smlt.runtime.progress import notice

# Per-round scalars: a round's field (metrics.json's rounds, RoundItem) -> the tag both tools show.
ROUND_SCALARS = {
    "train_loss": "loss/train",
    "val_loss": "loss/validation",
    "val_accuracy": "metrics/val_accuracy",
    "val_balanced_accuracy": "metrics/val_balanced_accuracy",  # classification, up to 1,000 classes
    "val_rmse": "metrics/val_rmse",
    "val_r2": "metrics/val_r2",
    "workers": "plan/workers",
    "memory_mb": "plan/memory_mb",
    "local_steps": "plan/local_steps",
    "round_s": "time/round_s",
    "cost_total_usd": "cost/spent_usd",
}
_TRAIN_ONLY = {"local_steps"}
_FINAL = (
    "val_accuracy",
    "val_balanced_accuracy",
    "val_loss",
    "val_rmse",
    "val_r2",
    "rounds",
    "estimated_cost_usd",
    "wall_seconds",
)

TAG = "smlt.run_id"  # the MLflow run's tag that names its smlt run: how a resume finds it
ENV_URI = "MLFLOW_TRACKING_URI"
ENV_EXPERIMENT = "MLFLOW_EXPERIMENT_NAME"
# MLflow's HTTP client retries 7 times over minutes by default: a run's end waits for a few
# seconds at most (the user's own settings of these win).
_HTTP_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_TIMEOUT": "20"}


class TrackingFailed(SmltError):
    """The MLflow tracking server (or store) could not log the run; the message names its URI."""


def available() -> bool:
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        return False
    return True


def budget_of(job: dict[str, Any] | None) -> float | None:
    return ((job or {}).get("constraints") or {}).get("budget_usd")


def round_scalars(r: dict[str, Any], budget: float | None) -> dict[str, float]:
    """One round's scalars by tag: the one rule of what TensorBoard and MLflow show per round."""
    out = {
        tag: float(r[field])
        for field, tag in ROUND_SCALARS.items()
        if r.get(field) is not None and not (r.get("eval_only") and field in _TRAIN_ONLY)
    }
    if budget:
        out["cost/spent_of_budget"] = float(r.get("cost_total_usd") or 0.0) / budget
    return out


def job_params(job: dict[str, Any] | None) -> dict[str, Any]:
    """The job's settings (model, training, workers, constraints, seed) as flat numbers, text and
    booleans: TensorBoard's hparams and MLflow's params."""
    job = job or {}
    model = job.get("model") or {}
    out: dict[str, Any] = {"model": model.get("name", "")}
    for k, v in (model.get("params") or {}).items():
        out[f"model.{k}"] = v if isinstance(v, (int, float, str, bool)) else str(v)
    for section in ("training", "workers", "constraints"):
        for k, v in (job.get(section) or {}).items():
            if v is not None:
                out[f"{section}.{k}"] = v if isinstance(v, (int, float, str, bool)) else str(v)
    if "seed" in job:
        out["seed"] = job["seed"]
    return out


# --- TensorBoard ---------------------------------------------------------------------------------


def write_tensorboard(metrics: dict[str, Any], folder: Path) -> list[Path]:
    """The run's event files in `folder` (replaced); returns them, or [] without tensorboard."""
    if not available():
        return []
    from torch.utils.tensorboard import SummaryWriter

    shutil.rmtree(folder, ignore_errors=True)
    budget = budget_of(metrics.get("job"))
    with SummaryWriter(log_dir=str(folder)) as w:
        for r in metrics.get("rounds", []):
            for tag, value in round_scalars(r, budget).items():
                w.add_scalar(tag, value, int(r["round"]))
        final = metrics.get("final") or {}
        w.add_hparams(
            job_params(metrics.get("job")),
            {f"final/{k}": float(v) for k, v in final.items() if k in _FINAL and v is not None},
            run_name=".",
        )
    return sorted(p for p in folder.rglob("*") if p.is_file())


class LiveBoard:
    """Each reported round's scalars into `folder` as it is reported, flushed at once (one small
    append per round). The folder is replaced at the first round: a resume reports its restored
    rounds again, so the folder holds each round once."""

    def __init__(self, folder: Path, budget: float | None) -> None:
        self.folder, self.budget = folder, budget
        self.writer: Any = None
        self.off = not available()

    def round(self, r: dict[str, Any]) -> None:
        if self.off:
            return
        try:
            if self.writer is None:
                from torch.utils.tensorboard import SummaryWriter

                shutil.rmtree(self.folder, ignore_errors=True)
                self.writer = SummaryWriter(log_dir=str(self.folder))
            for tag, value in round_scalars(r, self.budget).items():
                self.writer.add_scalar(tag, value, int(r["round"]))
            self.writer.flush()
        except OSError as e:  # a full or read-only disk: the run goes on, its end writes them again
            notice.warning(f"tensorboard: cannot write {self.folder} ({e}); the run goes on without live curves")
            self.off = True

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


# --- MLflow --------------------------------------------------------------------------------------


def mlflow_target(
    job: dict[str, Any] | None, uri: str | None = None, experiment: str | None = None
) -> tuple[str, str] | None:
    """(tracking URI, experiment) of a run: the arguments, else the job's `tracking`, else the
    MLFLOW_* environment variables (experiment: else the job's name); None without a URI."""
    job = job or {}
    spec = job.get("tracking") or {}
    uri = uri or spec.get("mlflow_uri") or os.environ.get(ENV_URI)
    if not uri:
        return None
    experiment = experiment or spec.get("mlflow_experiment") or os.environ.get(ENV_EXPERIMENT) or job.get("name")
    return uri, experiment or "smlt"


@contextmanager
def _bounded_http() -> Iterator[None]:
    added = {k: v for k, v in _HTTP_DEFAULTS.items() if k not in os.environ}
    os.environ.update(added)
    try:
        yield
    finally:
        for k in added:
            os.environ.pop(k, None)


class MlflowRun:
    """The MLflow run of one smlt run: found by its tag, else created; what it holds already is
    read once (params, the metrics' steps) so nothing is logged twice."""

    def __init__(self, uri: str, experiment: str, run_id: str) -> None:
        from mlflow import MlflowClient

        self.uri, self.run_id = uri, run_id
        self.client = MlflowClient(tracking_uri=uri)
        with _bounded_http():
            exp = self.client.get_experiment_by_name(experiment)
            exp_id = exp.experiment_id if exp is not None else self.client.create_experiment(experiment)
            # run ids are letters, digits, '-' and '_' (smlt.runtime.job): safe inside the quotes
            found = self.client.search_runs(
                [exp_id], filter_string=f"tags.`{TAG}` = '{run_id}'", order_by=["attributes.start_time ASC"]
            )
            run = found[0] if found else self.client.create_run(exp_id, run_name=run_id, tags={TAG: run_id})
        self.id = run.info.run_id
        self.status = run.info.status
        self.params = dict(run.data.params)
        self.metric_keys = set(run.data.metrics)
        self._steps: dict[str, set[int]] = {}

    def steps(self, key: str) -> set[int]:
        """The steps `key` holds in the run (its history, read once)."""
        if key not in self._steps:
            held = self.client.get_metric_history(self.id, key) if key in self.metric_keys else []
            self._steps[key] = {m.step for m in held}
        return self._steps[key]

    def log(self, rounds: list[dict[str, Any]], job: dict[str, Any] | None, final: dict[str, Any] | None = None) -> int:
        """The params, the rounds' scalars and the final metrics the run does not hold yet; returns
        how many metric values were logged."""
        from mlflow.entities import Metric, Param

        now = int(time.time() * 1000)
        params = [Param(k, str(v)[:6000]) for k, v in job_params(job).items() if k not in self.params]
        metrics = []
        budget = budget_of(job)
        for r in rounds:
            step = int(r["round"])
            for tag, value in round_scalars(r, budget).items():
                if step not in self.steps(tag):
                    metrics.append(Metric(tag, value, now, step))
        for k in _FINAL:
            v = (final or {}).get(k)
            if v is not None and f"final/{k}" not in self.metric_keys:
                metrics.append(Metric(f"final/{k}", float(v), now, 0))
        with _bounded_http():  # log_batch takes at most 1000 metrics and 100 params a call
            for i in range(0, len(params), 100):
                self.client.log_batch(self.id, params=params[i : i + 100])
            for i in range(0, len(metrics), 1000):
                self.client.log_batch(self.id, metrics=metrics[i : i + 1000])
        self.params.update({p.key: p.value for p in params})
        for m in metrics:
            self.metric_keys.add(m.key)
            self.steps(m.key).add(m.step)
        return len(metrics)

    def running(self) -> None:
        """A resumed run that MLflow shows ended (a Ctrl-C, or finished) runs again."""
        if self.status != "RUNNING":
            with _bounded_http():
                self.client.update_run(self.id, status="RUNNING")
            self.status = "RUNNING"

    def finish(self, out: Path) -> None:
        """The run's files as artifacts (rewritten by a second fetch: the same names), then FINISHED."""
        with _bounded_http():
            for name in ("model.safetensors", "model.json", "code.zip"):
                if (out / name).is_file():
                    self.client.log_artifact(self.id, str(out / name), artifact_path="model")
            if (out / "metrics.json").is_file():
                self.client.log_artifact(self.id, str(out / "metrics.json"))
            self.client.set_terminated(self.id, status="FINISHED")
        self.status = "FINISHED"


def log_mlflow(
    metrics: dict[str, Any], out: Path, uri: str | None = None, experiment: str | None = None
) -> MlflowRun | None:
    """Log a finished run (its metrics.json and the files in `out`) to MLflow, exactly once; None
    when it names no tracking URI. TrackingFailed naming the URI when MLflow cannot log it."""
    target = mlflow_target(metrics.get("job"), uri, experiment)
    if target is None:
        return None
    try:
        run = MlflowRun(*target, metrics["run_id"])
        run.log(metrics.get("rounds") or [], metrics.get("job"), metrics.get("final"))
        run.finish(out)
    except ImportError:
        raise TrackingFailed(f"MLflow tracking at {target[0]} needs mlflow: pip install 'smlt[tracking]'") from None
    except Exception as e:  # noqa: BLE001 - MLflow's, requests', the store's: all mean "not logged"
        raise TrackingFailed(f"MLflow at {target[0]}: {type(e).__name__}: {_first_line(e)}") from None
    return run


def log_fetched(metrics: dict[str, Any], out: Path) -> None:
    """At a fetch: log to MLflow when the run names a URI; a failure is a warning (the model is
    stored already) that says how to log the run again."""
    try:
        run = log_mlflow(metrics, out)
    except TrackingFailed as e:
        notice.warning(
            f"mlflow: run {metrics.get('run_id')} was not logged: {e}\n"
            f"  the run and its model are stored; log it again with: smlt track {out} [--mlflow-uri URI]"
        )
        return
    if run is not None:
        notice.info(f"mlflow: run {run.run_id} logged to {run.uri} (MLflow run {run.id})")


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    line = text[0][:300] if text else ""
    if "MLFLOW_ALLOW_FILE_STORE" in str(e):  # MLflow's opt-in to its file store, past the cut
        line += " ... set MLFLOW_ALLOW_FILE_STORE=true to log to a file store"
    return line


class LiveTracking:
    """What a local run's follower does with each reported round: its TensorBoard scalars, and
    its MLflow metrics when the job names a tracking URI. An MLflow error turns MLflow off for
    the rest of the run with one warning (the run's end tries again)."""

    def __init__(self, run_id: str, job: dict[str, Any], out: Path) -> None:
        self.run_id, self.job = run_id, job
        self.board = LiveBoard(out / "tensorboard" / run_id, budget_of(job))
        self.target = mlflow_target(job)
        self.mlflow: MlflowRun | None = None

    def round(self, r: dict[str, Any]) -> None:
        self.board.round(r)
        if self.target is None:
            return
        try:
            if self.mlflow is None:
                self.mlflow = MlflowRun(*self.target, self.run_id)
                self.mlflow.running()
            self.mlflow.log([r], self.job)
        except Exception as e:  # noqa: BLE001 - never fails the run: the end logs what is missing
            what = "needs mlflow: pip install 'smlt[tracking]'" if isinstance(e, ImportError) else _first_line(e)
            notice.warning(
                f"mlflow: {self.target[0]}: {type(e).__name__}: {what}; "
                "the run goes on, and its end logs it to MLflow again"
            )
            self.target = None

    def close(self) -> None:
        self.board.close()

"""Fetch a run's results into a folder: model.safetensors, model.json (its model card), metrics.json,
report.png, history.json, and tensorboard/<run id>/; with the tracking extra (smlt.tracking) the
run is also logged to MLflow when its job (or MLFLOW_TRACKING_URI) names a tracking URI.

The folder's top level is one run's: a run written into a folder that holds another run's outputs
moves those (its model, card, code, metrics, report, history and the files `smlt export` wrote
beside them) into FOLDER/<that run id>/ first, a folder `smlt predict` / `smlt export` take as
they take any run's, so no file of the earlier run is lost or left beside a model it was not made
from (`retire_previous`). The same run written again (`smlt fetch` twice, `smlt run --replace`)
removes only the exports made from a model it no longer holds. An exported file records the
sha256 of the model.safetensors it was made from (`exported_from`)."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from botocore.exceptions import ClientError

from smlt.folderlock import write_atomic
from smlt.report import write_report
from smlt.runtime import keys
from smlt.runtime.errors import InvalidJob, RunNotFinished, SmltError
from smlt.runtime.evaluation import ValMetrics, metrics_text
from smlt.runtime.items import PlanItem, RoundItem
from smlt.runtime.modelcard import card_key, parse_card, read_card
from smlt.runtime.progress import notice
from smlt.runtime.store import NotFound, S3Store
from smlt.runtime.usercode import code_key
from smlt.tracking import log_fetched, write_tensorboard

MODEL_KEY = "smlt.model_sha256"  # an exported file's ONNX metadata_props key / .pt2 extra file: its model's sha256
EXPORT_SUFFIX = {"onnx": ".onnx", "torch-export": ".pt2"}  # an `smlt export` file's suffix, by its format
EXPORTS = tuple(f"model{s}" for s in EXPORT_SUFFIX.values())  # what `smlt export FOLDER` writes beside the model
# a run's files at the folder's top level (tensorboard/<run id>/, logs/<run id>.log and
# .state/runs/<run id>/ are each run's own already)
# and a study's (`smlt tune --out`: its best trial's model and card, best.json, study.json)
RUN_FILES = (
    "model.safetensors",
    "model.json",
    "code.zip",
    "metrics.json",
    "report.png",
    "history.json",
    *EXPORTS,
    "best.json",
    "study.json",
)


def writable_folder(out: Path, flag: str = "--out") -> Path:
    """`out` made (with the folders above it) and written to once (a probe file, removed), before
    anything starts: InvalidJob naming the folder and the system's reason when it cannot be (a
    read-only disk, a folder of another user's, /proc)."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".smlt-probe-", dir=out)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise InvalidJob(
            f"{flag} {out} cannot be written ({e.strerror or e}): name a folder you can write to"
        ) from None
    return out


@contextlib.contextmanager
def writing(out: Path) -> Iterator[None]:
    """Hold OUT/.state/outputs.lock (an exclusive `flock`, waited for) while a run's or study's
    outputs are written into OUT: two runs that end at once into one --out write one after the
    other (the second moves the first's aside whole), never file by file in turn. The lock dies
    with its process."""
    folder = out / ".state"
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / "outputs.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def fetch_outputs(artifacts: S3Store, run_id: str, out: Path, history: list[dict] | None = None) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    try:
        metrics = json.loads(artifacts.get(keys.final_metrics_key(run_id)))
    except NotFound:
        raise RunNotFinished(f"run {run_id} has no final metrics yet (is it finished?)") from None
    blob = artifacts.get(keys.final_model_key(run_id)) if metrics["final"].get("model_key") else None
    with writing(out):
        retire_previous(out, run_id, hashlib.sha256(blob).hexdigest() if blob is not None else None)
        if blob is not None:
            write_atomic(out / "model.safetensors", blob)
            fetch_card(artifacts, run_id, out)
        write_atomic(out / "metrics.json", json.dumps(metrics, indent=1))
        if history is not None:
            write_atomic(out / "history.json", json.dumps(history, indent=1, default=str))
        write_report(metrics, out / "report.png")
    _tensorboard(artifacts, run_id, metrics, out / "tensorboard" / run_id)
    log_fetched(metrics, out)  # a warning, never an error: the run and its model are stored
    return metrics


def _tensorboard(artifacts: S3Store, run_id: str, metrics: dict[str, Any], folder: Path) -> None:
    """The run's event files (the tracking extra), also under its prefix when this user may write there."""
    for f in write_tensorboard(metrics, folder):
        try:
            artifacts.put(f"runs/{run_id}/tensorboard/{f.relative_to(folder).as_posix()}", f.read_bytes())
        except ClientError as e:  # a read-only user still gets the local curves
            notice.info(f"tensorboard: kept in {folder} only ({e.response.get('Error', {}).get('Code', e)})")
            return


def fetch_card(artifacts: S3Store, run_id: str, out: Path) -> None:
    """model.json and, for a model built by the user's code, that code as code.zip (what
    `smlt.load_model` imports it from, checked against the card's sha256)."""
    try:
        raw = artifacts.get(card_key(run_id))
    except NotFound:  # published before smlt wrote model cards
        return
    write_atomic(out / "model.json", raw)
    code = parse_card(raw, str(out / "model.json")).code
    if code is not None and code.sha256 is not None:
        try:
            write_atomic(out / "code.zip", artifacts.get(code_key(code.sha256)))
        except NotFound:
            pass


def file_sha256(path: Path) -> str | None:
    """A file's sha256, read 1 MiB at a time; None when it cannot be read."""
    digest = hashlib.sha256()
    try:
        with path.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
    except OSError:
        return None
    return digest.hexdigest()


def exported_from(path: Path) -> str | None:
    """The sha256 of the model.safetensors an `smlt export` file (.onnx, .pt2) was made from, as
    the file records it (MODEL_KEY); None when it records none (exported by an older smlt, or not
    smlt's) or cannot be read."""
    if path.suffix == EXPORT_SUFFIX["torch-export"]:
        import zipfile

        try:
            with zipfile.ZipFile(path) as z:
                name = next((n for n in z.namelist() if n.endswith(f"/extra/{MODEL_KEY}")), None)
                return z.read(name).decode() if name is not None else None
        except (OSError, zipfile.BadZipFile, UnicodeDecodeError, KeyError):
            return None
    try:
        import onnx
    except ImportError:
        return None
    try:
        graph = onnx.load(str(path), load_external_data=False)
    except Exception:  # noqa: BLE001 - a damaged or foreign file: it records nothing readable
        return None
    return next((p.value for p in graph.metadata_props if p.key == MODEL_KEY), None)


def folder_run(out: Path) -> str | None:
    """The run whose outputs the folder's top level holds: its metrics.json's run id, else its
    model.json's, else the one in its model's card; a study's folder without a model, its study
    id (study.json); None when none says."""
    for name, field in (("metrics.json", "run_id"), ("model.json", "run_id"), ("best.json", "best_run_id")):
        try:
            held = json.loads((out / name).read_text()).get(field)
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(held, str) and held:
            return held
    if not (out / "model.safetensors").is_file():
        try:
            study = json.loads((out / "study.json").read_text())["study"]
            return str(study.get("best_run_id") or study["study_id"])
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None
    try:
        card = read_card((out / "model.safetensors").read_bytes(), str(out / "model.safetensors"))
    except (OSError, SmltError):
        return None
    return card.run_id if card is not None else None


def retire_previous(out: Path, run_id: str, model_sha256: str | None, label: str | None = None) -> list[str]:
    """Before run `run_id`'s outputs (its model's sha256, None when it has none) are written into
    `out`: another run's outputs there are moved into OUT/<that run id>/ (OUT/<run id>-2/ ... when
    that is taken); the same run's exports of a model it no longer holds, and its model files when
    it now has none, are removed. Says what it did (a notice; `label`: what is written, default
    "run RUN_ID") and returns the names it moved or removed."""
    present = [n for n in RUN_FILES if (out / n).is_file()]
    if not present:
        return []
    held = folder_run(out)
    if held is not None and held != run_id:
        into = _free(out, held)
        into.mkdir(parents=True)
        for name in present:
            (out / name).replace(into / name)
        notice.info(
            f"{out} held run {held}'s outputs ({', '.join(present)}): moved into {into}/ (`smlt predict {into} ...` "
            f"uses its model), so {out}/ holds {label or f'run {run_id}'}'s alone"
        )
        return present
    previous = file_sha256(out / "model.safetensors") if (out / "model.safetensors").is_file() else None
    stale = [n for n in EXPORTS if n in present and (model_sha256 is None or exported_from(out / n) != model_sha256)]
    if model_sha256 is None:  # this run published no model: an earlier one's files would pass for its
        stale += [n for n in ("model.safetensors", "model.json", "code.zip") if n in present]
    elif previous != model_sha256:
        stale += [n for n in ("code.zip",) if n in present]  # written again when the new card names code
    for name in stale:
        (out / name).unlink(missing_ok=True)
    if stale:
        what = "no model" if model_sha256 is None else f"model {model_sha256[:12]}"
        notice.info(
            f"{out}: removed {', '.join(stale)}, made from a model run {run_id} no longer holds (it now has {what})"
            + (
                f": `smlt export {out}` makes them again"
                if model_sha256 is not None and set(stale) & set(EXPORTS)
                else ""
            )
        )
    return stale


def _free(out: Path, run_id: str) -> Path:
    """OUT/<run id>/, or OUT/<run id>-2/, -3/ ... when that is taken (never written into)."""
    into, n = out / run_id, 1
    while into.exists():
        n += 1
        into = out / f"{run_id}-{n}"
    return into


def _band(p50: float, p70: float | None, fmt: str) -> str:
    """A median with its p70, when the band is wider than the rounding."""
    return fmt.format(p50) + (f" (p70 {fmt.format(p70)})" if p70 is not None and p70 > p50 * 1.005 else "")


def forecast_text(plan: PlanItem, took_s: float = 0.0, took_usd: float = 0.0, rounds_done: int = 0) -> str:
    """The plan's forecast of the rest of the run (the dashboard's plans table), less `rounds_done`
    rounds that took `took_s` and `took_usd` since it was made; empty when it has none."""
    if plan.eta_rounds is None or plan.eta_s is None or plan.eta_cost_usd is None:
        return ""

    def left(v: float | None, took: float) -> float | None:
        return None if v is None else max(v - took, 0.0)

    rounds = _band(max(plan.eta_rounds - rounds_done, 0.0), left(plan.eta_rounds_p70, rounds_done), "{:.0f}")
    secs = _band(max(plan.eta_s - took_s, 0.0), left(plan.eta_s_p70, took_s), "{:.0f} s")
    usd = _band(max(plan.eta_cost_usd - took_usd, 0.0), left(plan.eta_cost_usd_p70, took_usd), "${:.4f}")
    return f"{rounds} rounds, {secs}, {usd}"


def eta_text(r: RoundItem, plan: PlanItem | None) -> str:
    """The planner's forecast of the rest of the run after round r, against the deadline and the
    budget left: the forecast of round r's plan (which counted round r) less what round r took.
    Empty when the plan has none (the fixed planner, a stop)."""
    if plan is None:
        return ""
    text = forecast_text(plan, r.round_s, r.cost_usd, 1)
    if not text:
        return ""
    rounds, secs, usd = text.split(", ")
    c = plan.spec.job.constraints if plan.spec is not None else None
    if c is not None and c.deadline_seconds is not None and plan.elapsed_s is not None:
        secs += f" of {max(c.deadline_seconds - plan.elapsed_s - r.round_s, 0.0):.0f} s left"
    if c is not None and c.budget_usd is not None:
        usd += f" of ${max(c.budget_usd - r.cost_total_usd, 0.0):.4f} left"
    return f"ETA {rounds}, {secs}, {usd}"


def _steps_text(r: RoundItem) -> str:
    """The round's local steps, and how many workers the compute limit cut short (a step slower
    than the plan expected: the planner sees FLOPs, not a sleep or a Python loop in a model)."""
    if r.eval_only:
        return "eval only"
    cut = sorted(t.steps for t in r.timings if t.cut and t.error is None)
    if not cut:
        return f"k {r.local_steps}"
    took = f"{cut[0]}" if cut[0] == cut[-1] else f"{cut[0]}-{cut[-1]}"
    return f"k {r.local_steps} ({len(cut)} cut to {took} at the time limit)"


def progress_line(r: RoundItem, plan: PlanItem | None = None, target: str | None = None) -> str:
    """A round's line; `target`: the run's target metric (its balanced accuracy is shown when it
    is the target)."""
    balanced = target == "val_balanced_accuracy"
    whole = ValMetrics.model_validate(r.model_dump(include=set(ValMetrics.model_fields)))
    partial = ValMetrics.model_validate({k: getattr(r, f"{k}_partial") for k in ValMetrics.model_fields})
    measured = whole.val_loss is not None or partial.val_loss is None
    loss = r.train_loss
    parts = [
        f"round {r.round:3d}",
        f"workers {r.workers_ok}/{r.workers}",
        f"{r.memory_mb} MB",
        _steps_text(r),
        f"train loss {loss:.4f}" if loss is not None else "train loss   -   ",
        metrics_text(whole, balanced=balanced)
        if measured
        else f"{metrics_text(partial, 'val partial', balanced)} ({r.val_rows}/{r.val_rows_total} rows)",
        f"{r.round_s:5.2f} s",
        f"cost ${r.cost_total_usd:.5f}",
    ]
    eta = eta_text(r, plan) if not r.stop else ""
    return " | ".join(parts + ([eta] if eta else []))

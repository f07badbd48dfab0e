"""`smlt predict`, `smlt export`, `smlt model`: using a finished run's model (smlt.api); `smlt track`:
a fetched run logged to MLflow (smlt.tracking)."""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path
from typing import Any

from smlt.cli.data import encoding


def _model_args(c: Any) -> None:
    c.add_argument(
        "model",
        help="a run id, PIPELINE@latest or PIPELINE@VERSION (a retraining pipeline's champion or version), "
        "a run's or study's output folder, a model.safetensors file (or an .onnx/.pt2 export beside the model it "
        "was made from) or an s3:// URI",
    )
    c.add_argument(
        "--runs",
        default="out",
        help="with a run id: the local run's --out folder (default: out); with PIPELINE@...: the local "
        "console's --state folder (default: its own)",
    )
    c.add_argument("--stack", help="with a run id or PIPELINE@...: look it up in this deployed stack (e.g. Smlt)")
    c.add_argument("--code", type=Path, help="the folder of your model's code (default: the code stored with the run)")


def add_commands(sub: Any) -> None:
    p = sub.add_parser("predict", help="predict with a run's model on new data (its training transforms applied)")
    _model_args(p)
    p.add_argument(
        "data",
        help="a .csv, .tsv, .txt, .parquet, .jsonl (a .csv, .tsv, .txt or .jsonl also .gz, .bz2, .xz), .xlsx or .npz "
        "file, an image or image folder, a folder of a table's parts (part-00000.csv, part-00001.csv, ...: every "
        "part's rows in the parts' order, each named by its part and line, part-00001.csv line 2), or a prepared "
        "dataset folder",
    )
    p.add_argument(
        "--out",
        required=True,
        help="predictions file: .csv, .parquet or .xlsx (an Excel workbook, its one sheet `predictions`; "
        "at most 1,048,575 predictions), or - for CSV on stdout (the other lines go to stderr)",
    )
    p.add_argument("--split", default="validation", help="a prepared dataset's split (default: validation)")
    p.add_argument(
        "--id", dest="id_column", metavar="COLUMN", help="a table's column naming each row (default: its line or row)"
    )
    p.add_argument(
        "--encoding",
        type=encoding,
        metavar="NAME",
        help="a CSV/TSV/TXT/JSONL not UTF-8 and without a byte-order mark: its encoding, e.g. cp1252 (Excel's \"CSV "
        '(Comma delimited)" on Windows); without it such a file is refused',
    )
    p.set_defaults(fn=predict)

    e = sub.add_parser("export", help="export a run's model for serving (ONNX or a torch.export program)")
    _model_args(e)
    e.add_argument("--format", choices=("onnx", "torch-export"), default="onnx")
    e.add_argument(
        "--out",
        help="the file to write (default: model.onnx / model.pt2 beside a model given as a folder or file; "
        "RUN_ID.onnx / RUN_ID.pt2 in the current folder for a run id, PIPELINE@... or an s3:// URI)",
    )
    e.add_argument(
        "--data", help="check the export against `smlt predict` on these rows (as `smlt predict` takes them)"
    )
    e.add_argument(
        "--raw",
        action="store_true",
        help="export the bare network: its input after the card's normalisation, logits or standardised values "
        "(default: the card's preprocessing inside, probabilities or values in the label's units)",
    )
    e.set_defaults(fn=export)

    m = sub.add_parser("model", help="show a run's model card: what the model is and how it takes its input")
    _model_args(m)
    m.set_defaults(fn=show)

    t = sub.add_parser("track", help="log a fetched run to MLflow (once: again continues the same MLflow run)")
    t.add_argument("out", type=Path, help="the run's output folder (its metrics.json, model.safetensors, model.json)")
    t.add_argument(
        "--mlflow-uri", help="the tracking URI (default: the job's tracking.mlflow_uri, MLFLOW_TRACKING_URI)"
    )
    t.add_argument(
        "--experiment", help="the MLflow experiment (default: the job's, MLFLOW_EXPERIMENT_NAME, the job's name)"
    )
    t.set_defaults(fn=track)


def _load(args: argparse.Namespace) -> Any:
    from smlt.inference import load_model

    return load_model(args.model, out=args.runs, stack=args.stack, code=args.code)


def predict(args: argparse.Namespace) -> int:
    from smlt.api import predict as run
    from smlt.inference import card_summary
    from smlt.runtime.progress import notice

    to_stdout = args.out == "-"
    if not to_stdout:
        from smlt.inference import predictions_target

        predictions_target(args.out)  # before the model and the rows are read
    # with --out -, stdout holds the CSV alone: the lines the CLI prints go to stderr meanwhile
    with contextlib.redirect_stdout(sys.stderr) if to_stdout else contextlib.nullcontext():
        model = _load(args)
        notice.info(f"model {model.source}: {card_summary(model.card)}")
        out = None if to_stdout else args.out
        result = run(model, args.data, out=out, split=args.split, id_column=args.id_column, encoding=args.encoding)
    if to_stdout:
        try:
            result.write_csv(sys.stdout)
            sys.stdout.flush()
        except BrokenPipeError:  # the reader stopped early (`| head`): what it read is what it wanted
            from smlt.cli.console import reader_gone

            reader_gone(sys.stdout)  # Python's exit flush: no second error
            return 0
    score = ""
    if result.accuracy is not None:
        score = f", accuracy {result.accuracy:.4f} on the data's own labels"
    elif result.rmse is not None:
        score = f", rmse {result.rmse:.4g} on the data's own targets"
    n = len(result)
    with contextlib.redirect_stdout(sys.stderr) if to_stdout else contextlib.nullcontext():
        where = "stdout" if to_stdout else args.out
        notice.info(f"wrote {n:,} prediction{'' if n == 1 else 's'} to {where}{score}")
    return 0


def export(args: argparse.Namespace) -> int:
    from smlt.api import export as run
    from smlt.runtime.progress import notice

    model = _load(args)
    out = args.out
    if out is None:
        from smlt.exporter import SUFFIX

        if Path(args.model).exists():  # a run's output folder or its model file: beside the model
            out = Path(model.source).parent / f"model{SUFFIX[args.format]}"
        else:  # a run id, PIPELINE@..., s3://: here, named by the run (never inside a saved state)
            out = Path(f"{model.card.run_id}{SUFFIX[args.format]}")
    done = run(model, args.format, out=out, data=args.data, raw=args.raw)
    notice.info(
        f"exported {model.card.model.name} as {done.format} to {done.path}: outputs within {done.max_abs_diff:.2e} "
        f"of {done.against}'s on {done.rows} rows (tolerance {done.tolerance})"
    )
    if done.unseen is not None:
        notice.info(
            f"its 'unseen' output flags the {done.unseen} text cell{'' if done.unseen == 1 else 's'} of those rows the "
            "model never saw, as smlt predict counts them"
        )
    if done.spec is not None:
        for line in spec_lines(done.spec):
            notice.info(line)
    return 0


def _tensor(t: Any) -> str:
    return f"{t.name!r} {t.dtype} [{', '.join(map(str, t.shape))}]"


def spec_lines(spec: Any) -> list[str]:
    """What a server feeds the exported model and reads back (a ServingSpec), in a few lines."""
    lines = []
    for t in spec.inputs or [spec.input]:
        lines.append(f"  input  {_tensor(t)}: {t.means}")
        columns = spec.text_columns if t.dtype == "string" else spec.columns
        if columns:
            lines.append(f"         columns: {', '.join(columns)}")
    for t in spec.outputs or [spec.output]:
        lines.append(f"  output {_tensor(t)}: {t.means}")
        names = (spec.classes or spec.targets) if t.name == spec.output.name else spec.text_columns
        if names:
            shown = ", ".join(names[:10]) + (f" ... ({len(names)})" if len(names) > 10 else "")
            said = "columns" if t.name != spec.output.name else "classes" if spec.classes else "targets"
            lines.append(f"         {said}: {shown}")
    return lines


def column_lines(columns: Any) -> list[str]:
    """The table columns a model reads, in order, each with what prepare made of it."""

    def what(t: Any) -> str:
        if t.kind == "numeric":
            said = "number"
        elif t.kind == "onehot":
            shown = ", ".join(t.levels[:8]) + (f" ... ({len(t.levels)})" if len(t.levels) > 8 else "")
            said = f"text, one of {shown}"
        elif t.kind == "hash":
            said = f"text, hashed into {t.buckets} features"
        elif t.kind == "text":
            said = f"free text, its words hashed into {t.buckets} features"
        else:
            said = f"date{f' written {t.date_format}' if t.date_format else ''}: {', '.join(t.levels)}"
        if t.fill is None:
            return said + "; a missing cell refused"
        if t.kind == "text":
            fill = "has no words"
        elif t.kind == "date":
            import datetime

            fill = f"is {datetime.date(1970, 1, 1) + datetime.timedelta(days=int(float(t.fill)))}"
        else:
            fill = f"is {t.fill:.6g}" if isinstance(t.fill, float) else f"is {t.fill!r}"
        return f"{said}; a missing cell {fill}" + (" (and an indicator)" if t.indicator else "")

    return [f"  {t.name!r}: {what(t)}" for t in columns]


def export_lines(folder: Path, sha256: str) -> list[str]:
    """The files `smlt export` wrote beside a model, each said to be made from it or stale."""
    from smlt.outputs import EXPORTS, exported_from

    lines = []
    for name in EXPORTS:
        if not (folder / name).is_file():
            continue
        made = exported_from(folder / name)
        again = f"export again with `smlt export {folder}`"
        if made == sha256:
            lines.append(f"{folder / name}: exported from this model")
        elif made is None:
            lines.append(f"{folder / name}: records no model it was made from (an older smlt's export): {again}")
        else:
            lines.append(
                f"{folder / name}: stale, exported from model {made[:12]}, not this one ({sha256[:12]}): {again}"
            )
    return lines


def show(args: argparse.Namespace) -> int:
    from smlt.runtime.progress import notice

    model = _load(args)
    notice.info(model.card.model_dump_json(indent=1, exclude={"features"}))
    if Path(args.model).exists():  # a folder or a file: the exports beside the model, and whether they are its
        for line in export_lines(Path(model.source).parent, model.sha256):
            notice.info(line)
    if model.card.features is not None and model.card.features.columns:
        notice.info(f"it reads these columns of a table (the label {model.card.features.label!r} aside), in order:")
        for line in column_lines(model.card.features.columns):
            notice.info(line)
    if model.card.features is not None:
        from smlt.serving import serving_spec

        spec = serving_spec(model)
        notice.info("smlt export writes a model that takes and gives:")
        for line in spec_lines(spec):
            notice.info(line)
        pt2 = serving_spec(model, fmt="torch-export")
        if pt2.kind != spec.kind:
            notice.info(
                f"  (--format torch-export, without string tensors: input {_tensor(pt2.input)}: {pt2.input.means})"
            )
    return 0


def track(args: argparse.Namespace) -> int:
    import json

    from smlt.runtime.errors import RunNotFinished
    from smlt.runtime.progress import notice
    from smlt.tracking import TrackingFailed, log_mlflow

    try:
        metrics = json.loads((args.out / "metrics.json").read_text())
    except (OSError, ValueError) as e:
        raise RunNotFinished(
            f"{args.out / 'metrics.json'}: no fetched run there ({type(e).__name__}): "
            "give the --out folder of `smlt run`, `smlt fetch` or `smlt resume`"
        ) from None
    run = log_mlflow(metrics, args.out, uri=args.mlflow_uri, experiment=args.experiment)
    if run is None:
        raise TrackingFailed(
            "no MLflow tracking URI: pass --mlflow-uri URI, set MLFLOW_TRACKING_URI or the job's tracking.mlflow_uri"
        )
    notice.info(f"mlflow: run {run.run_id} logged to {run.uri} (MLflow run {run.id})")
    return 0

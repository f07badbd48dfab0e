"""A CSV as users have them: text columns, empty cells and the label in the middle, named in the
job. It prepares and trains through `smlt run --local`; with imputation refused the error names
the column and the line, and nothing runs."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
from sklearn.datasets import load_breast_cancer

import smlt.runner
from smlt.cli import main


def messy_csv(path: Path) -> Path:
    """breast_cancer with a 3-level text column, a 50-level one, ~5 % empty cells and the label
    'diagnosis' in the middle of the columns."""
    data = load_breast_cancer()
    rng = np.random.default_rng(0)
    header = [f"f{i}" for i in range(5)] + ["diagnosis", "size", "site"] + [f"f{i}" for i in range(5, 10)]
    rows = []
    for x, y in zip(data.data[:, :10], data.target):
        size = ["small", "medium", "large"][int(x[3] > 500) + int(x[3] > 1000)]
        cells = [f"{v:.5g}" for v in x]
        row = cells[:5] + ["malignant" if y == 0 else "benign", size, f"site-{rng.integers(50)}"] + cells[5:]
        for j in rng.choice(len(row), size=int(rng.random() < 0.6)):
            if header[j] != "diagnosis":
                row[j] = ""  # an empty cell
        rows.append(row)
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)
    return path


def _job(tmp_path: Path, **dataset) -> Path:
    job = {
        "name": "messy",
        "dataset": {"uri": str(messy_csv(tmp_path / "cancer.csv")), "label": "diagnosis", **dataset},
        "training": {"max_rounds": 4, "local_steps": 20},
        "workers": {"initial": 2, "memory_mb": 1769},
    }
    path = tmp_path / "job.json"
    path.write_text(json.dumps(job))
    return path


def test_a_messy_csv_trains_with_its_label_named(local, tmp_path, monkeypatch, capsys):
    engine, names = local
    monkeypatch.setattr(smlt.runner, "start_engine", lambda faults: (engine, names, None))
    monkeypatch.setattr(engine, "stop", lambda: None)
    monkeypatch.setenv("SMLT_HOME", str(tmp_path / "home"))
    out = tmp_path / "out"
    assert main(["run", "--local", str(_job(tmp_path)), "--out", str(out)]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["final"]["rounds"] == 4 and metrics["final"]["val_accuracy"] > 0.85, metrics["final"]


def test_refused_missing_values_name_the_column_and_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("SMLT_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(smlt.runner, "start_engine", lambda faults: (_ for _ in ()).throw(AssertionError("ran")))
    assert main(["run", "--local", str(_job(tmp_path, missing="refuse")), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "cancer.csv: column '" in err and "', line " in err and "is empty" in err, err

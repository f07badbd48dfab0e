"""`smlt predict` at the command line's edges: `--out -` writes the CSV alone on stdout (the other
lines on stderr) for a pipe; a header retyped in another letter case or with spaces is refused
with the columns to rename; an unused id-like column is offered as `--id`."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import numpy as np
import pytest

from smlt.cli import main
from smlt.runtime.data.prepare import prepare_dataset
from tests.unit.untrained import run_folder, untrained


def _write(path: Path, header: str, rows: list[str]) -> Path:
    path.write_text("\n".join([header, *rows]) + "\n")
    return path


@pytest.fixture
def model(tmp_path: Path) -> Path:
    """A classifier of (x1, city; label yes/no) in a run's output folder."""
    rng = np.random.default_rng(0)
    rows = [f"{rng.normal():.3f},{'ab'[i % 2]},{'no yes'.split()[i % 2]}" for i in range(60)]
    src = _write(tmp_path / "train.csv", "x1,city,label", rows)
    m = prepare_dataset(str(src), str(tmp_path / "prepared"), shards=2)
    card, blob = untrained(m, "logreg", tmp_path / "prepared")
    return run_folder(tmp_path / "out", card, blob, with_json=False)


def test_out_dash_writes_the_csv_alone_on_stdout_as_the_file_holds_it(model: Path, tmp_path: Path, capsys) -> None:
    new = _write(tmp_path / "new.csv", "city,x1,customer_id", ["a,0.5,c7", "b,-1.0,c8", "a,2.0,c9"])
    assert main(["predict", str(model), str(new), "--out", str(tmp_path / "p.csv")]) == 0
    to_file = capsys.readouterr()
    assert "wrote 3 predictions to" in to_file.out
    assert main(["predict", str(model), str(new), "--out", "-"]) == 0
    piped = capsys.readouterr()
    assert piped.out == (tmp_path / "p.csv").read_bytes().decode()  # nothing but the CSV on stdout
    assert list(csv.reader(io.StringIO(piped.out)))[0] == ["id", "prediction", "probability", "unseen"]
    assert "wrote 3 predictions to stdout" in piped.err and "model " in piped.err
    # the id-like column the model does not use is offered as --id
    assert "--id customer_id names each prediction by its 'customer_id'" in piped.err
    assert main(["predict", str(model), str(new), "--out", "-", "--id", "customer_id"]) == 0
    named = capsys.readouterr()
    assert [r[0] for r in csv.reader(io.StringIO(named.out))] == ["customer_id", "c7", "c8", "c9"]
    assert "--id" not in named.err


def test_one_prediction_is_said_in_the_singular(model: Path, tmp_path: Path, capsys) -> None:
    new = _write(tmp_path / "one.csv", "x1,city", ["0.5,a"])
    assert main(["predict", str(model), str(new), "--out", str(tmp_path / "p.csv")]) == 0
    assert "wrote 1 prediction to" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("header", "said"),
    [
        ("X1,City", "the columns are X1, City (the file has 'X1' for 'x1', 'City' for 'city': column names must"),
        (" x1 , city ", "the columns are ' x1 ', ' city ' (the file has ' x1 ' for 'x1', ' city ' for 'city'"),
    ],
)
def test_a_header_in_another_case_or_with_spaces_names_the_columns_to_rename(
    model: Path, tmp_path: Path, capsys, header: str, said: str
) -> None:
    new = _write(tmp_path / "new.csv", header, ["0.5,a"])
    assert main(["predict", str(model), str(new), "--out", str(tmp_path / "p.csv")]) == 2  # a data error
    err = capsys.readouterr().err
    assert "no column 'x1', 'city'" in err and said in err and "Traceback" not in err
    assert not (tmp_path / "p.csv").exists()


def test_out_dash_into_a_reader_that_stops_early_ends_quietly(model: Path, tmp_path: Path) -> None:
    """`smlt predict ... --out - | head -1`: the reader closes the pipe; no BrokenPipeError traceback."""
    import os
    import subprocess
    import sys

    new = _write(tmp_path / "new.csv", "x1,city", [f"{i / 7:.3f},{'ab'[i % 2]}" for i in range(50_000)])
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    cli = [sys.executable, "-m", "smlt.cli", "predict", str(model), str(new), "--out", "-"]
    smlt = subprocess.Popen(cli, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    assert smlt.stdout is not None and smlt.stderr is not None
    assert smlt.stdout.readline().decode().startswith("id,prediction")
    smlt.stdout.close()  # as `head -1` does
    err = smlt.stderr.read().decode()
    assert smlt.wait(timeout=120) == 0, err
    assert "Traceback" not in err and "BrokenPipeError" not in err


def _closed_pipe() -> int:
    """A pipe's write end whose reader has gone: every write is EPIPE, as after `head` has exited."""
    import os

    read, write = os.pipe()
    os.close(read)
    return write


def test_any_command_into_a_closed_pipe_ends_quietly(model: Path, tmp_path: Path, monkeypatch) -> None:
    """`smlt export ... | head`: the CLI's lines (smlt.cli.console's handler) and a command's own
    print (`smlt data prepare`'s summary, caught at the CLI's top) into a pipe whose reader has
    gone: no BrokenPipeError traceback, exit 0, the command's work done. `smlt export` as a process
    (Python's own flush at exit too), the others in this one, each into its own closed pipe."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    export = ["export", str(model), "--format", "onnx", "--out", str(tmp_path / "m.onnx")]
    write = _closed_pipe()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "smlt.cli", *export], stdout=write, stderr=subprocess.PIPE, env=env, timeout=120
        )
    finally:
        os.close(write)
    assert done.returncode == 0 and b"Traceback" not in done.stderr and b"BrokenPipe" not in done.stderr
    assert (tmp_path / "m.onnx").is_file()  # the export itself is whole
    src = _write(tmp_path / "t.csv", "x1,label", [f"{i},{'ab'[i % 2]}" for i in range(40)])
    commands = [["model", str(model)], ["data", "prepare", str(src), "--out", str(tmp_path / "prep")]]
    for command in commands:
        for buffering in (1, -1):  # a line's print raises at once; a block's at the CLI's flush
            with os.fdopen(_closed_pipe(), "w", buffering=buffering) as closed:
                monkeypatch.setattr(sys, "stdout", closed)
                assert main([*command, "--replace"] if command[0] == "data" else command) == 0
    assert (tmp_path / "prep" / "manifest.json").is_file()

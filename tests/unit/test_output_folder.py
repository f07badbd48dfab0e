"""What a reused output folder holds (smlt.outputs): a run written into a folder that holds another
run's outputs moves them into FOLDER/<that run id>/ (its exports with them), a run written again
with another model (`--replace`) drops the exports of the model it no longer holds, and an export
left beside a model it was not made from is refused by `smlt predict`/`export`/`model` (each export
records its model's sha256)."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch

from smlt.cli import main
from smlt.inference import load_model
from smlt.outputs import exported_from, fetch_outputs
from smlt.runtime import keys
from smlt.runtime.data.prepare import prepare_dataset
from smlt.runtime.modelcard import InvalidModel, card_json, card_key, read_card
from smlt.runtime.store import NotFound
from tests.unit.untrained import untrained


class _Store:
    """A bucket as fetch_outputs reads it (get, put)."""

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}

    def get(self, key: str) -> bytes:
        if key not in self.objects:
            raise NotFound(key)
        return self.objects[key]

    def put(self, key: str, body: bytes) -> None:
        self.objects[key] = body


@pytest.fixture
def prepared(tmp_path: Path) -> Path:
    rng = np.random.default_rng(0)
    rows = [f"{a:.3f},{b:.3f},{int(a + b > 0)}" for a, b in rng.normal(size=(200, 2))]
    (tmp_path / "t.csv").write_text("a,b,label\n" + "\n".join(rows) + "\n")
    prepare_dataset(str(tmp_path / "t.csv"), str(tmp_path / "prepared"), shards=2)
    return tmp_path / "prepared"


def _publish(store: _Store, prepared: Path, run_id: str, scale: float | None) -> str | None:
    """Run `run_id`'s final objects as Finalize stores them (a model whose weights are seed 0's
    times `scale`; None: a run stopped before its first round, no model); its model's sha256."""
    from smlt.runtime.data.manifest import parse_manifest

    manifest = parse_manifest((prepared / "manifest.json").read_bytes(), "m")
    final: dict = {"run_id": run_id, "model_key": None}
    sha = None
    if scale is not None:

        def edit(net: torch.nn.Module) -> None:
            for p in net.parameters():
                p.mul_(scale)

        card, blob = untrained(manifest, prepared=prepared, run_id=run_id, edit=edit)
        sha = hashlib.sha256(blob).hexdigest()
        store.put(keys.final_model_key(run_id), blob)
        store.put(card_key(run_id), card_json(card.model_copy(update={"model_sha256": sha})))
        final["model_key"] = keys.final_model_key(run_id)
    store.put(keys.final_metrics_key(run_id), json.dumps({"run_id": run_id, "rounds": [], "final": final}).encode())
    return sha


@pytest.fixture(autouse=True)
def notices(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.INFO, logger="smlt.notice")
    return caplog


def _export(folder: Path, fmt: str = "torch-export") -> None:
    assert main(["export", str(folder), "--format", fmt]) == 0


def test_another_runs_outputs_move_into_their_own_folder_with_their_exports(prepared, tmp_path, capsys, notices):
    store, out = _Store(), tmp_path / "out"
    first = _publish(store, prepared, "run-a", 1.0)
    fetch_outputs(store, "run-a", out)  # type: ignore[arg-type]
    _export(out)
    assert exported_from(out / "model.pt2") == first
    capsys.readouterr()

    second = _publish(store, prepared, "run-b", 0.5)
    notices.clear()
    fetch_outputs(store, "run-b", out)  # type: ignore[arg-type]
    said = notices.text
    assert (
        f"{out} held run run-a's outputs (model.safetensors, model.json, metrics.json, model.pt2): moved into " in said
    )
    # the top level is run-b's alone: no export of run-a's model beside run-b's
    assert not (out / "model.pt2").exists()
    assert load_model(out).sha256 == second and json.loads((out / "metrics.json").read_text())["run_id"] == "run-b"
    # run-a's folder is a run folder: its export is its model's, and says so
    kept = out / "run-a"
    assert load_model(kept).sha256 == first and exported_from(kept / "model.pt2") == first
    assert main(["model", str(kept / "model.pt2")]) == 0
    assert (
        f"{kept / 'model.pt2'}: an export of {kept / 'model.safetensors'}: using that model" in capsys.readouterr().out
    )

    # a third run moves run-b's; a run-a again finds its folder taken: run-a-2
    _publish(store, prepared, "run-c", 2.0)
    fetch_outputs(store, "run-c", out)  # type: ignore[arg-type]
    fetch_outputs(store, "run-a", out)  # type: ignore[arg-type]
    assert load_model(out / "run-b").sha256 == second and load_model(out / "run-a").sha256 == first
    assert json.loads((out / "run-c" / "metrics.json").read_text())["run_id"] == "run-c"
    assert load_model(out).sha256 == first and not (out / "run-a-2").exists()  # run-c's were moved, not run-a's


def test_a_stale_export_is_refused_naming_both_models(prepared, tmp_path, capsys, notices):
    store, out = _Store(), tmp_path / "out"
    first = _publish(store, prepared, "run-a", 1.0)
    fetch_outputs(store, "run-a", out)  # type: ignore[arg-type]
    _export(out)
    stale = (out / "model.pt2").read_bytes()
    # the same run written again with another model (`smlt run --replace`): its old export goes
    second = _publish(store, prepared, "run-a", 0.5)
    notices.clear()
    fetch_outputs(store, "run-a", out)  # type: ignore[arg-type]
    assert not (out / "model.pt2").exists()
    assert f"{out}: removed model.pt2, made from a model run run-a no longer holds" in notices.text
    # an export put back by hand beside the new model: refused, not served
    (out / "model.pt2").write_bytes(stale)
    for argv in (["model"], ["export", "--format", "torch-export", "--out", str(tmp_path / "x.pt2")]):
        capsys.readouterr()
        assert main([*argv[:1], str(out / "model.pt2"), *argv[1:]]) != 0
        err = capsys.readouterr().err
        assert f"{out / 'model.pt2'} was exported from model {first[:12]}, but {out / 'model.safetensors'} is " in err
        assert f"{second[:12]} (run run-a): the export is stale" in err and "Traceback" not in err
    assert not (tmp_path / "x.pt2").exists()
    with pytest.raises(InvalidModel, match="the export is stale"):
        load_model(out / "model.pt2")
    # `smlt model FOLDER` says which exports beside the model are its own
    assert main(["model", str(out)]) == 0
    said = capsys.readouterr().out
    assert f"{out / 'model.pt2'}: stale, exported from model {first[:12]}, not this one ({second[:12]})" in said
    _export(out)
    assert main(["model", str(out)]) == 0
    assert f"{out / 'model.pt2'}: exported from this model" in capsys.readouterr().out


def test_a_run_without_a_model_leaves_no_earlier_model_beside_its_metrics(prepared, tmp_path, notices):
    store, out = _Store(), tmp_path / "out"
    _publish(store, prepared, "run-a", 1.0)
    fetch_outputs(store, "run-a", out)  # type: ignore[arg-type]
    _publish(store, prepared, "run-a", None)  # --replace, and the planner stopped it before its first round
    notices.clear()
    fetch_outputs(store, "run-a", out)  # type: ignore[arg-type]
    assert not (out / "model.safetensors").exists() and not (out / "model.json").exists()
    assert "removed model.safetensors, model.json" in notices.text
    with pytest.raises(InvalidModel, match="no model.safetensors here"):
        load_model(out)


def test_an_export_beside_no_model_or_recording_none_is_refused(prepared, tmp_path):
    store, out = _Store(), tmp_path / "out"
    _publish(store, prepared, "run-a", 1.0)
    fetch_outputs(store, "run-a", out)  # type: ignore[arg-type]
    _export(out)
    alone = tmp_path / "alone"
    alone.mkdir()
    (out / "model.pt2").replace(alone / "model.pt2")
    with pytest.raises(InvalidModel, match="with no model.safetensors beside it: give the run's output folder"):
        load_model(alone / "model.pt2")
    (alone / "model.pt2").write_bytes(b"not smlt's")
    with pytest.raises(InvalidModel, match="records no model it was made from"):
        load_model(alone / "model.pt2")
    assert read_card((out / "model.safetensors").read_bytes(), "m") is not None


def test_an_export_never_writes_over_the_model_or_under_a_file(prepared, tmp_path, capsys):
    store, out = _Store(), tmp_path / "out"
    _publish(store, prepared, "run-a", 1.0)
    fetch_outputs(store, "run-a", out)  # type: ignore[arg-type]
    model = (out / "model.safetensors").read_bytes()
    cases = {
        str(out / "model.safetensors"): "exists and is not an export (.onnx, .pt2): an export never writes over",
        str(out / "model.json"): "exists and is not an export",
        str(out): "is a folder: name the file, e.g. --out",
        str(out / "model.json" / "m.pt2"): f"{out / 'model.json'} is a file, not a folder",
    }
    for target, said in cases.items():
        capsys.readouterr()
        assert main(["export", str(out), "--format", "torch-export", "--out", target]) == 2
        err = capsys.readouterr().err
        assert said in err and "Traceback" not in err, err
    assert (out / "model.safetensors").read_bytes() == model and load_model(out).card.run_id == "run-a"
    _export(out)  # an earlier export is replaced, as before
    _export(out)


def test_predictions_go_into_a_checked_file_whole_or_not_at_all(prepared, tmp_path, capsys, monkeypatch):
    from smlt.inference import Predictions

    store, out = _Store(), tmp_path / "out"
    _publish(store, prepared, "run-a", 1.0)
    fetch_outputs(store, "run-a", out)  # type: ignore[arg-type]
    data = str(prepared)
    refused = {
        str(out / "model.json" / "p.csv"): f"{out / 'model.json'} is a file, not a folder",
        str(out): "is a folder: name the predictions file",
        str(out / "p.txt"): "write predictions to a .csv, .parquet or .xlsx file",
    }
    for target, said in refused.items():
        capsys.readouterr()
        assert main(["predict", "no-such-model", data, "--out", target]) == 2  # told before the model is looked for
        err = capsys.readouterr().err
        assert said in err and "Traceback" not in err, err
    for name in ("new/dir/p.csv", "new/dir/p.parquet"):  # missing folders are made
        assert main(["predict", str(out), data, "--out", str(tmp_path / name)]) == 0
    kept = (tmp_path / "new/dir/p.csv").read_bytes()

    def cut(self, stream):  # a predict stopped while its file is written (Ctrl-C, a full disk)
        stream.write("id,prediction\n0,1\n")
        raise KeyboardInterrupt

    monkeypatch.setattr(Predictions, "write_csv", cut)
    assert main(["predict", str(out), data, "--out", str(tmp_path / "new/dir/p.csv")]) == 130  # interrupted
    assert (tmp_path / "new/dir/p.csv").read_bytes() == kept
    assert [p.name for p in (tmp_path / "new/dir").iterdir() if p.name.endswith(".tmp")] == []


def test_two_runs_ending_at_once_into_one_folder_write_one_after_the_other(prepared, tmp_path):
    import threading

    from smlt.outputs import writing

    store, out = _Store(), tmp_path / "out"
    first = _publish(store, prepared, "run-a", 1.0)
    second = _publish(store, prepared, "run-b", 0.5)
    with writing(out):  # run-a's outputs being written (by another process, as far as the lock knows)
        ending = threading.Thread(target=fetch_outputs, args=(store, "run-b", out))
        ending.start()
        ending.join(0.5)
        assert ending.is_alive() and not (out / "metrics.json").exists()  # run-b waits its turn
        (out / "model.safetensors").write_bytes(store.get(keys.final_model_key("run-a")))
        (out / "model.json").write_bytes(store.get(card_key("run-a")))
        (out / "metrics.json").write_bytes(store.get(keys.final_metrics_key("run-a")))
    ending.join(30)
    assert not ending.is_alive()
    assert load_model(out).sha256 == second and load_model(out / "run-a").sha256 == first


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc, a folder no one can write files into")
def test_a_folder_that_cannot_be_written_is_named_not_a_traceback(prepared, tmp_path, capsys):
    from smlt.outputs import writable_folder
    from smlt.runtime.errors import InvalidJob

    with pytest.raises(InvalidJob, match=r"--out /proc/smlt-out cannot be written \(No such file or directory\)"):
        writable_folder(Path("/proc/smlt-out"))
    assert writable_folder(tmp_path / "a" / "b").is_dir() and not list((tmp_path / "a" / "b").iterdir())
    store, out = _Store(), tmp_path / "out"
    _publish(store, prepared, "run-a", 1.0)
    fetch_outputs(store, "run-a", out)  # type: ignore[arg-type]
    capsys.readouterr()
    assert main(["predict", str(out), str(prepared), "--out", "/proc/smlt-p.csv"]) == 2
    assert main(["export", str(out), "--format", "torch-export", "--out", "/proc/smlt-m.pt2"]) == 2
    err = capsys.readouterr().err
    assert "--out /proc/smlt-p.csv cannot be written (No such file or directory)" in err
    assert "--out /proc/smlt-m.pt2 cannot be written (No such file or directory)" in err and "Traceback" not in err


def test_a_ctrl_c_while_a_run_writes_its_outputs_waits_for_them(prepared, tmp_path):
    """`runner._execute` writes the outputs and the final saved state under `_ctrl_c_after`: a
    Ctrl-C then lands after the folder is whole (here: after fetch_outputs wrote every file)."""
    import os
    import signal

    from smlt.runner import _ctrl_c_after

    store, out = _Store(), tmp_path / "out"
    sha = _publish(store, prepared, "run-a", 1.0)
    with pytest.raises(KeyboardInterrupt):
        with _ctrl_c_after():
            os.kill(os.getpid(), signal.SIGINT)  # the user's Ctrl-C, as the fetch starts
            fetch_outputs(store, "run-a", out)  # type: ignore[arg-type]
    assert load_model(out).sha256 == sha and (out / "metrics.json").is_file()

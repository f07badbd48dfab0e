"""What `smlt.load_model` (so `smlt predict`, `smlt export`, `smlt model`) refuses before it uses a
model: a model file that is not the one its model.json (or a local run's saved META) records, and
a local run that is saved but has not finished. Each refusal names the file or run and what to do;
the CLI prints it without a traceback."""

import hashlib
import json

import pytest

from smlt.cli import main
from smlt.inference import load_model
from smlt.runtime.data.prepare import prepare_dataset
from smlt.runtime.errors import RunNotFinished
from smlt.runtime.keys import final_model_key
from smlt.runtime.modelcard import InvalidModel, card_json, card_key
from tests.unit.untrained import run_folder, untrained

RUN = "iris-1"


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("iris")
    manifest = prepare_dataset("sklearn:iris", str(tmp / "prepared"), shards=2)
    card, blob = untrained(manifest, run_id=RUN)
    return card.model_copy(update={"model_sha256": hashlib.sha256(blob).hexdigest()}), blob


def _flipped(blob: bytes) -> bytes:
    """The same file with one weight's byte changed (the header, so the card, intact)."""
    edited = bytearray(blob)
    edited[-5] ^= 0x40
    return bytes(edited)


def _saved_run(out, card, blob, status="SUCCEEDED", final_sha=None):
    """A local run's saved state as `smlt run --local --out OUT` leaves it."""
    state = out / ".state" / "runs" / RUN
    bucket = state / "s3" / "artifacts"
    (bucket / final_model_key(RUN)).parent.mkdir(parents=True)
    (bucket / final_model_key(RUN)).write_bytes(blob)
    (bucket / card_key(RUN)).write_bytes(card_json(card))
    final = {"model_sha256": final_sha or card.model_sha256} if status == "SUCCEEDED" else None
    meta = {"pk": f"RUN#{RUN}", "sk": "META", "run_id": RUN, "status": status, "final": final}
    (state / "items.json").write_text(json.dumps([meta]))
    return out


def test_a_model_file_that_is_not_the_one_its_card_records_is_refused_by_both_digests(model, tmp_path, capsys):
    card, blob = model
    good = run_folder(tmp_path / "good", card, blob)
    assert load_model(good).card.run_id == RUN  # the published file loads
    bad = run_folder(tmp_path / "bad", card, _flipped(blob))
    want = f"bad/model.safetensors: its sha256 is {hashlib.sha256(_flipped(blob)).hexdigest()[:12]}, but .*model.json"
    with pytest.raises(InvalidModel, match=want + f" records the run's model as {card.model_sha256[:12]}"):
        load_model(bad)
    for command in (["export", str(bad), "--format", "torch-export"], ["model", str(bad)]):
        assert main(command) == 2
        err = capsys.readouterr().err
        assert "not the model the run published" in err and "smlt fetch RUN" in err and "Traceback" not in err
    assert not (bad / "model.pt2").exists()


def test_a_local_run_not_finished_is_refused_as_not_finished_not_as_unknown(model, tmp_path, capsys):
    card, blob = model
    running = _saved_run(tmp_path / "running", card, blob, status="RUNNING")
    with pytest.raises(
        RunNotFinished, match=rf"run '{RUN}' in .*running has not finished .*RUNNING.*smlt resume {RUN}"
    ):
        load_model(RUN, out=running)
    starting = tmp_path / "starting"
    (starting / ".state" / "runs" / RUN).mkdir(parents=True)  # its folder and lock, no round saved
    with pytest.raises(RunNotFinished, match="has no round saved yet"):
        load_model(RUN, out=starting)
    assert main(["export", RUN, "--runs", str(running)]) == 1
    err = capsys.readouterr().err
    assert "has not finished" in err and "Traceback" not in err


def test_a_finished_local_runs_model_is_checked_against_its_saved_meta(model, tmp_path, monkeypatch):
    card, blob = model
    done = _saved_run(tmp_path / "done", card, blob)
    assert load_model(RUN, out=done).card.run_id == RUN
    other = _saved_run(tmp_path / "other", card, blob, final_sha="0" * 64)
    with pytest.raises(InvalidModel, match=r"records the run's model as 000000000000"):
        load_model(RUN, out=other)
    # a run id's export lands in the current folder, named by the run, never inside the saved state
    monkeypatch.chdir(tmp_path)
    assert main(["export", RUN, "--runs", str(done), "--format", "torch-export"]) == 0
    assert (tmp_path / f"{RUN}.pt2").is_file()
    assert not list((done / ".state").rglob("*.pt2"))


def test_a_local_run_another_process_runs_is_told_to_wait_not_to_resume(model, tmp_path, capsys):
    """A live `smlt run --local` holds its state folder's lock (snapshot.run_lock): `smlt export` /
    `smlt predict` on it say it is still running, with the pid, and to wait; once the lock is let
    go (the run crashed, the same saved state), `smlt resume`."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    card, blob = model
    out = _saved_run(tmp_path / "live", card, blob, status="RUNNING")
    starting = tmp_path / "starting"
    (starting / ".state" / "runs" / RUN).mkdir(parents=True)  # no round saved yet
    hold = (
        "import sys; from pathlib import Path; from smlt.snapshot import run_lock\n"
        "with run_lock(Path(sys.argv[1]), sys.argv[2]), run_lock(Path(sys.argv[3]), sys.argv[2]):\n"
        "    print('held', flush=True); sys.stdin.read()\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    run = subprocess.Popen(
        [sys.executable, "-c", hold, str(out), RUN, str(starting)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
    )
    assert run.stdin is not None and run.stdout is not None
    try:
        assert run.stdout.readline() == b"held\n"
        with pytest.raises(RunNotFinished, match=rf"is still running \(pid {run.pid} holds its lock\): wait for it"):
            load_model(RUN, out=out)
        with pytest.raises(RunNotFinished, match=rf"still running \(pid {run.pid} .* no round saved yet: wait"):
            load_model(RUN, out=starting)
        assert main(["export", RUN, "--runs", str(out)]) == 1
        err = capsys.readouterr().err
        assert f"still running (pid {run.pid} holds its lock)" in err and "smlt resume" not in err
    finally:
        run.stdin.close()
        run.wait(timeout=60)
    with pytest.raises(RunNotFinished, match=rf"no process runs it .*RUNNING.*smlt resume {RUN}"):
        load_model(RUN, out=out)
    with pytest.raises(RunNotFinished, match="no round saved yet and no process runs it.*start it again"):
        load_model(RUN, out=starting)

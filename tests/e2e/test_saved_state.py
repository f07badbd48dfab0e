"""Nothing saved is deleted or rewritten by a later command, and what is read back is checked
(issues #34 and #38): a finished run's saved state and outputs survive `smlt resume`, a run with
the same run id, a failing run with another one; an edited item is refused by name; a local run
is reconciled from its saved state (`smlt verify --local`); Ctrl-C stops after the round in flight
and prints the resume command, with no traceback and no process left.

The finished run is made with smlt.runner.execute on the session's engine (what `smlt run --local`
runs after starting its engine); the commands after it are the CLI's own, each in its process
(none of them starts an engine: they are refused, or read the saved state only)."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from smlt.runner import execute
from smlt.runtime.errors import RunFailed
from tests.e2e.test_local_run import digits_job, run

ROOT = Path(__file__).resolve().parents[2]
CMD = [sys.executable, "-m", "smlt.cli"]
RUN = "kept"


def _files(folder: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in folder.rglob("*") if p.is_file() and p.name != "lock"}


def _cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([*CMD, *args], cwd=cwd, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def finished(local, tmp_path_factory) -> Path:
    """--out of a finished 3-round digits run, RUN: once per module (one driver per run id, so the
    session's engine runs RUN once); tests copy it before they change anything."""
    job = digits_job(max_rounds=3, target_value=None, local_steps=5)
    job["run_id"] = RUN
    out = tmp_path_factory.mktemp("finished") / "out"
    assert run(local, job, out, RUN) == 0
    return out


def test_a_finished_run_is_kept_by_later_commands(local, finished, tmp_path):
    engine, names = local
    out = finished
    before = _files(out)
    metrics = json.loads((out / "metrics.json").read_text())
    cost = metrics["final"]["estimated_cost_usd"]
    assert cost >= max(r["cost_total_usd"] for r in metrics["rounds"])

    # `smlt resume` of the finished run: says so, changes nothing (it re-ran Finalize before:
    # every output rewritten, the cost 0.01206 -> 0.00972).
    res = _cli("resume", RUN, "--local", "--out", str(out))
    assert res.returncode == 0, res.stderr
    said = res.stdout + res.stderr
    assert f"run {RUN} finished already (3 rounds, estimated AWS cost ${cost:.5f}): nothing to resume" in said
    assert "nothing changed" in said and "Traceback" not in said
    assert _files(out) == before

    # A new run with the same run id into the same --out: refused before anything starts (its
    # state was deleted before: 38 files down to `lock`).
    job = digits_job(max_rounds=2)
    job.update(run_id=RUN, dataset={"uri": "sklearn:digits"})
    job["training"]["learning_rate"] = 1e9  # would fail, had it run
    path = tmp_path / "job.json"
    path.write_text(json.dumps(job))
    res = _cli("run", "--local", str(path), "--out", str(out))
    assert res.returncode == 2, res.stdout + res.stderr
    assert f"error: SavedRunExists: run {RUN!r} finished already in {out} (4 rounds saved" in res.stderr
    assert "give this run another run_id or --out, or pass --replace" in res.stderr
    assert "Traceback" not in res.stderr and _files(out) == before

    # A failing run with another run id into the same --out keeps the first run's state and outputs.
    bad = digits_job()
    bad["constraints"]["budget_usd"] = 1e-6  # refused at its first plan
    with pytest.raises(RunFailed):
        execute(
            engine,
            names,
            "other",
            {**bad, "dataset": json.loads((out / "metrics.json").read_text())["job"]["dataset"]},
            out,
        )
    assert {p: b for p, b in _files(out).items() if "runs/other" not in str(p)} == before

    # The run reconciles from its saved state: every round's updates, records, ledger and models.
    res = _cli("verify", RUN, "--local", "--out", str(out))
    assert res.returncode == 0, res.stdout + res.stderr
    said = res.stdout + res.stderr
    assert f"run {RUN}: 4 rounds" in said and "reconciled, nothing lost or counted twice" in said


def test_an_edited_saved_state_is_refused_naming_the_item_and_field(finished, tmp_path):
    edited = tmp_path / "edited"
    shutil.copytree(finished, edited)
    items_file = edited / ".state/runs" / RUN / "items.json"
    text = items_file.read_text()
    rate = json.loads((finished / "metrics.json").read_text())["job"]["training"]["learning_rate"]
    # The job's learning rate in META only (issue #38's one-character edit: 0.05 -> 0.95).
    head, sep, rest = text.partition(f'"learning_rate": {rate}')
    assert sep and head.startswith('[{"pk": "RUN#kept", "sk": "META"') and text.index(sep) < text.index("}}, {")
    items_file.write_text(head + f'"learning_rate": {rate + 0.9}' + rest)
    before = _files(edited)
    res = _cli("resume", RUN, "--local", "--out", str(edited))
    assert res.returncode == 2, res.stdout + res.stderr
    assert f"error: DamagedState: the saved state {items_file} is damaged: item 'META' of 'RUN#kept'" in res.stderr
    assert "field job.training.learning_rate no longer matches its digest" in res.stderr
    assert "Traceback" not in res.stderr and _files(edited) == before

    # An update flipped in the saved state: the reconciliation names it (the resume needs no update).
    flipped = tmp_path / "flipped"
    shutil.copytree(finished, flipped)
    (update, *_) = sorted((flipped / ".state/runs" / RUN / "s3").glob(f"*/runs/{RUN}/rounds/000001/updates/*"))
    blob = bytearray(update.read_bytes())
    blob[-2] ^= 1
    update.write_bytes(bytes(blob))
    res = _cli("verify", RUN, "--local", "--out", str(flipped))
    assert res.returncode == 1, res.stdout + res.stderr
    assert f"round 1: digest (worker {int(update.stem)}): runs/{RUN}/rounds/000001/updates/{update.name} (applied)" in (
        res.stdout + res.stderr
    )


def test_resume_after_a_crash_before_round_0_names_the_cause(tmp_path):
    """The run's folder exists (its lock) but no round was saved: not 'pass the right --out'."""
    out = tmp_path / "out"
    (out / ".state/runs/early").mkdir(parents=True)
    (out / ".state/runs/early/lock").touch()
    res = _cli("resume", "early", "--local", "--out", str(out))
    assert res.returncode == 1, res.stdout + res.stderr
    assert "error: run 'early' stopped before its first round was aggregated" in res.stderr
    assert f"start it again (`smlt run --local JOB --out {out}`)" in res.stderr


def _start(args: list[str], env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(
        [*CMD, *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # a process group, as a terminal's: Ctrl-C reaches all of it
    )


def _group_gone(pgid: int) -> bool:
    for _ in range(50):
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


def _run_past_round_1(tmp_path, run_id):
    """`smlt run --local` of an 8-round digits job, read until its round 1's line: the process, the
    lines read, the --out folder."""
    job = digits_job(max_rounds=8, target_value=None, local_steps=5)
    job.update(run_id=run_id)
    path = tmp_path / "job.json"
    path.write_text(json.dumps(job))
    out = tmp_path / "out"
    proc = _start(["run", "--local", str(path), "--out", str(out)], {})
    lines = []
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("round   1"):
            break
    return proc, lines, out


def test_ctrl_c_stops_after_the_round_in_flight_and_prints_the_resume_command(tmp_path):
    proc, lines, out = _run_past_round_1(tmp_path, "ctrlc")
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C sends
    rest, _ = proc.communicate(timeout=120)
    said = "".join(lines) + rest
    assert proc.returncode == 130, said
    assert "Traceback" not in said
    # the lines reach the terminal in bursts: the round in flight is whichever the engine was at
    flight = re.search(r"interrupted: finishing round (\d+) \(in flight\)", said)
    assert flight, said
    saved = json.loads((out / ".state/runs/ctrlc/items.json").read_text())
    rounds = sorted(int(i["sk"][6:]) for i in saved if i["sk"].startswith("ROUND#"))
    assert rounds[-1] >= int(flight.group(1)) >= 2, said  # the round in flight was finished and saved
    assert f"stopped run ctrlc after round {rounds[-1]}" in said
    assert f"round {rounds[-1]:3d} | workers" in said  # the round in flight is reported as it is saved
    # Its curves were written round by round: tensorboard's own reader finds every saved round once.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(out / "tensorboard" / "ctrlc"))
    events.Reload()
    # a round whose validation came back partial (a worker late on a loaded machine) has no loss
    measured = sorted(int(i["sk"][6:]) for i in saved if i["sk"].startswith("ROUND#") and i.get("val_loss") is not None)
    assert measured, said
    assert [e.step for e in events.Scalars("loss/validation")] == measured, said
    assert f"continue it with: smlt resume ctrlc --local --out {out}" in said
    assert _group_gone(proc.pid), "a process of the run outlived it"


def test_sigterm_stops_as_ctrl_c_does(tmp_path):
    """`kill PID` (a process manager's stop) on the engine's process alone: the round in flight is
    finished and saved, the resume command said, no handler process's BrokenPipeError traceback
    (SIGTERM's default ends the process at once, its handler processes then writing to a closed
    pipe), and no process of the run left."""
    proc, lines, out = _run_past_round_1(tmp_path, "term")
    proc.send_signal(signal.SIGTERM)  # the engine's process only, as `kill PID` sends it
    rest, _ = proc.communicate(timeout=120)
    said = "".join(lines) + rest
    assert proc.returncode == 130, said
    assert "Traceback" not in said and "BrokenPipeError" not in said, said
    flight = re.search(r"interrupted: finishing round (\d+) \(in flight\)", said)
    assert flight, said
    saved = json.loads((out / ".state/runs/term/items.json").read_text())
    rounds = sorted(int(i["sk"][6:]) for i in saved if i["sk"].startswith("ROUND#"))
    assert rounds[-1] >= int(flight.group(1)), said  # the round in flight was finished and saved
    assert f"stopped run term after round {rounds[-1]}" in said
    assert f"continue it with: smlt resume term --local --out {out}" in said
    assert _group_gone(proc.pid), "a process of the run outlived it"


def test_ctrl_c_during_a_cold_synth_prints_no_traceback(tmp_path):
    job = digits_job(max_rounds=2)
    path = tmp_path / "job.json"
    path.write_text(json.dumps(job))
    proc = _start(["run", "--local", str(path), "--out", str(tmp_path / "out")], {"SMLT_SYNTH_CACHE": "off"})
    assert proc.stdout is not None
    first = proc.stdout.readline()
    assert first.startswith("starting the local engine"), first
    time.sleep(3)  # inside the synth (~10 s cold): the CDK imported, jsii's node process running
    os.killpg(proc.pid, signal.SIGINT)
    rest, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, first + rest
    assert "Traceback" not in rest and "BrokenPipeError" not in rest, rest
    assert _group_gone(proc.pid)

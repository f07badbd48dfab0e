"""Crash anywhere, identical resume: a local run killed (SIGKILL, the whole process group) at
each point of a round, then resumed, ends with the uncrashed run's model bit for bit.

One run is crashed and resumed again and again, each resume killed at a later point: during a
round's training (a worker's update and record stored, the round open), right after an
aggregation (ROUND item written, the local state not yet saved), after a plan (PLAN item of a
round in progress written) and after Finalize (final model and metrics written, META
SUCCEEDED, the outputs not yet fetched); the last resume runs to the end. The job sets no
deadline, so no worker is cut short and every round's training depends on the job seed only.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

from smlt.reconcile import reconcile_saved
from tests.e2e.test_local_run import run

ROOT = Path(__file__).resolve().parents[2]
RUN = "crash-anywhere"

# The run (or resume) in a process of its own that kills its process group at the crash point:
# in the engine's after_invoke hook, when the chosen invocation returns, before the runner
# saves the local state and before the state machine goes on. Its engine reads the app's synth
# from the synth cache the session's engine filled (SMLT_SYNTH_CACHE, pinned in tests/conftest.py):
# no process imports the CDK or synthesizes (~10 s of a ~27 s stage when each did).
DRIVER = r"""
import json, os, signal, sys
from pathlib import Path
from smlt import runner

mode, crash, target, out = sys.argv[1:5]
kind, _, at = crash.partition(":")
seen = {"aggregated": -1}

def kind_of(event):
    if "worker" in event:
        return "train"
    if event.get("op") in ("finalize", "chain"):
        return event["op"]
    if "job" in event:
        return "plan"
    return "aggregated" if event.get("op", "aggregate") in ("aggregate", "finish") else event.get("op")

def crashes(event):
    what = kind_of(event)
    if what == "aggregated":
        seen["aggregated"] = event["round"]
    if what != kind:
        return False
    if kind == "train":
        return event["round"] == int(at) and event["worker"] == 0
    if kind == "aggregated":
        return event["round"] == int(at)
    if kind == "plan":  # the plan of round `at`: the first after round at-1 was aggregated here
        return seen["aggregated"] == int(at) - 1
    return True

hook = runner.Follower.after_invoke

def after_invoke(self, function, payload, ok):
    if crash != "none" and ok and crashes(json.loads(payload)):
        os.killpg(os.getpgrp(), signal.SIGKILL)
    hook(self, function, payload, ok)

runner.Follower.after_invoke = after_invoke
if mode == "run":
    runner.run_local(Path(target), Path(out))
else:
    runner.resume_local(target, Path(out))
"""


def job_file(tmp_path: Path) -> Path:
    job = {
        "name": "crash",
        "run_id": RUN,
        "dataset": {"uri": "sklearn:digits"},
        "model": {"name": "mlp", "params": {"hidden": [32]}},
        "training": {"max_rounds": 4, "local_steps": 5, "batch_size": 32, "learning_rate": 0.05, "momentum": 0.9},
        "workers": {"initial": 2, "memory_mb": 1769, "planner": "fixed"},
        "seed": 7,
    }
    path = tmp_path / "job.json"
    path.write_text(json.dumps(job))
    return path


def start(mode: str, crash: str, target: str, out: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", DRIVER, mode, crash, target, str(out)],
        cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: the crash kills it and its handler processes
    )


def finish(proc: subprocess.Popen) -> tuple[int, str]:
    """The driver's return code and the tail of its stderr."""
    try:
        _, err = proc.communicate(timeout=400)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        raise
    return proc.returncode, err[-3000:]


def drive(mode: str, crash: str, target: str, out: Path) -> tuple[int, str]:
    return finish(start(mode, crash, target, out))


def round_items(out: Path) -> list[dict]:
    items = json.loads((out / ".state/runs" / RUN / "items.json").read_text())
    return [i for i in items if i["sk"].startswith("ROUND#")]


def saved_rounds(out: Path) -> list[int]:
    return sorted(int(i["sk"].split("#")[1]) for i in round_items(out))


def failed_workers(out: Path) -> list[int]:
    return [i["round"] for i in round_items(out) if i.get("workers_failed")]


def test_crash_anywhere_then_resume_gives_the_uncrashed_model_bit_for_bit(local, tmp_path):
    job = job_file(tmp_path)
    ref, out = tmp_path / "ref", tmp_path / "out"
    # The uncrashed reference: the same job through smlt.runner.execute (what `smlt run --local`
    # runs after starting its engine) on the session's engine, first and alone. Its handler
    # processes are warm, which changes no number: the job sets no deadline, so no worker is cut
    # short (on a loaded 2-core CI machine a reference in a process of its own, beside the
    # crashed run, had round 0's cold workers take 10 s, near their 13.5 s task timeout; and a
    # process of its own paid the interpreter, the synth and a cold round: ~25 s where this
    # takes 3 s, measured on a loaded machine).
    assert run(local, json.loads(job.read_text()), ref, RUN) == 0

    # (mode, crash point, the rounds the saved state holds after the crash)
    stages = [
        ("run", "train:1", [0]),  # round 1 in progress: worker 0's update and record stored
        ("resume", "aggregated:2", [0, 1]),  # round 2's ROUND item written, not yet saved
        ("resume", "plan:3", [0, 1, 2]),  # saved before round 3 was planned
        ("resume", "finalize", [0, 1, 2, 3, 4]),  # 4 trained rounds + the final evaluation
    ]
    for mode, crash, kept in stages:
        rc, err = drive(mode, crash, str(job) if mode == "run" else RUN, out)
        assert rc == -9, f"{crash}: the crash point was not reached\n{err}"
        assert saved_rounds(out) == kept, crash
    rc, err = drive("resume", "none", RUN, out)
    assert rc == 0, err
    failed = {d.name: failed_workers(d) for d in (ref, out)}
    assert not any(failed.values()), f"workers failed (rounds): {failed}; the runs cannot be compared"

    assert (out / "model.safetensors").read_bytes() == (ref / "model.safetensors").read_bytes()
    mine, theirs = (json.loads((d / "metrics.json").read_text()) for d in (out, ref))

    def trajectory(m: dict) -> list[tuple]:
        return [(r["round"], r["samples"], r["train_loss"], r["val_loss"]) for r in m["rounds"]]

    assert trajectory(mine) == trajectory(theirs)  # every round the same, to the last bit
    assert [r["round"] for r in mine["rounds"]] == list(range(5))
    assert mine["final"]["rounds"] == 4 and mine["final"]["val_loss"] == theirs["final"]["val_loss"]

    # The bill survives the resumes: every aggregated round's attempts are in the saved state,
    # so the run costs at least every round's running total and bills at least the uncrashed
    # run's invocations (each resume re-ran the round in progress; before, the final cost
    # counted only the last resume's work, below the last round's own total).
    final, ref_final = mine["final"], theirs["final"]
    assert final["estimated_cost_usd"] >= max(r["cost_total_usd"] for r in mine["rounds"])
    assert final["billed_invocations"] >= ref_final["billed_invocations"]
    assert final["estimated_cost_usd"] >= ref_final["estimated_cost_usd"] * 0.9  # timings vary, the work does not
    # ... and the reconciliation of the saved state is clean (every pre-crash update was a finding).
    result = reconcile_saved(out, RUN)
    assert result.ok, [f.model_dump() for f in result.findings]
    assert len(result.rounds) == 5 and all(r.applied for r in result.rounds[:4])


def _attempts(out: Path) -> list[str]:
    items = json.loads((out / ".state/runs" / RUN / "items.json").read_text())
    return [i["sk"] for i in items if i["sk"].startswith("ATTEMPT#")]


def test_the_attempts_of_the_round_in_flight_at_a_crash_are_billed(local, tmp_path):
    """Killed while round 1 trains: the invocations of round 1 that had ended (its plan, a worker)
    are in the saved state, and the resumed run's bill has them beside the round run again."""
    job = job_file(tmp_path)
    raw = json.loads(job.read_text())
    raw["training"]["max_rounds"] = 2
    job.write_text(json.dumps(raw))
    out = tmp_path / "out"
    rc, err = drive("run", "train:1", str(job), out)
    assert rc == -9, f"the crash point was not reached\n{err}"
    assert saved_rounds(out) == [0]
    in_flight = [sk for sk in _attempts(out) if sk.startswith("ATTEMPT#000001#")]
    assert in_flight, "no attempt of round 1 saved before the crash"  # at least round 1's plan

    rc, err = drive("resume", "none", RUN, out)
    assert rc == 0, err
    final = json.loads((out / "metrics.json").read_text())["final"]
    saved = _attempts(out)
    assert set(in_flight) <= set(saved)  # restored, kept through the resume's saves
    # The bill is every saved attempt: those of the crashed round 1 and of its second run alike.
    assert final["billed_invocations"] == len(saved)
    ran_twice = [sk for sk in saved if sk.startswith("ATTEMPT#000001#")]
    assert len(ran_twice) > len(in_flight)
    rounds = json.loads((out / "metrics.json").read_text())["rounds"]
    assert final["estimated_cost_usd"] >= max(r["cost_total_usd"] for r in rounds)
    result = reconcile_saved(out, RUN)
    assert result.ok, [f.model_dump() for f in result.findings]


def test_a_crash_before_round_0_is_aggregated_then_resume_says_to_start_again(local, tmp_path):
    """Killed while round 0 trains: no round saved, so `smlt resume` says the run stopped before
    its first round and how to start it again, not that the wrong --out was passed."""
    job, out = job_file(tmp_path), tmp_path / "out"
    rc, err = drive("run", "train:0", str(job), out)
    assert rc == -9, f"the crash point was not reached\n{err}"
    assert not (out / ".state/runs" / RUN / "items.json").exists()  # a refused or early run leaves no items
    res = subprocess.run(
        [sys.executable, "-m", "smlt.cli", "resume", RUN, "--local", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 1, res.stdout + res.stderr
    assert f"error: run '{RUN}' stopped before its first round was aggregated" in res.stderr, res.stderr
    assert f"start it again (`smlt run --local JOB --out {out}`)" in res.stderr and "--out" in res.stderr
    assert "pass that run's --out" not in res.stderr and "Traceback" not in res.stderr

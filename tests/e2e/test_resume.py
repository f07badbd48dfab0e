"""A local run killed in the middle of a round resumes from its last complete round."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from smlt.reconcile import reconcile_saved
from smlt.runtime.items import RoundItem

ROOT = Path(__file__).resolve().parents[2]


def test_killed_run_resumes_losing_at_most_one_round(tmp_path):
    job = json.loads((ROOT / "examples/digits.json").read_text())
    job.update(run_id="crash-test")
    job["training"].update(max_rounds=6, target_value=None)
    path = tmp_path / "job.json"
    path.write_text(json.dumps(job))
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "smlt.cli"]
    proc = subprocess.Popen(
        [*cmd, "run", "--local", str(path), "--out", str(out)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    seen = []
    deadline = time.time() + 240
    for line in proc.stdout:
        if line.startswith("round"):
            seen.append(int(line.split()[1]))
        if len(seen) == 2 or time.time() > deadline:
            break
    time.sleep(0.3)  # now inside round 2
    os.killpg(proc.pid, signal.SIGSTOP)  # frozen there (holding its lock) while the twin tries
    # A second run with the same run id into the same --out, while the first is live: refused
    # before it starts an engine or touches the first run's state.
    twin = subprocess.run(
        [*cmd, "run", "--local", str(path), "--out", str(out)], cwd=ROOT, env=env, capture_output=True, text=True
    )
    os.killpg(proc.pid, signal.SIGKILL)  # the engine, the handler processes, everything
    proc.wait()
    assert seen == [0, 1]
    assert twin.returncode == 2 and "error: RunInProgress: run 'crash-test' is live in" in twin.stderr, twin.stderr
    saved = json.loads((out / ".state/runs/crash-test/items.json").read_text())
    kept = {i["sk"] for i in saved if i["sk"].startswith("ROUND#")}
    assert kept >= {"ROUND#000000", "ROUND#000001"}
    first = len(kept)  # the first round the resume runs

    res = subprocess.run(
        [*cmd, "resume", "crash-test", "--local", "--out", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert "resuming run crash-test after" in res.stdout
    assert f"round {first:3d} | workers 4/4 |" in res.stdout, res.stdout
    # The first resumed round starts on cold handler processes: no worker is cut short by the
    # compute limit (20 of 20 steps) or dropped by the straggler limit while it sets up.
    saved = {i["sk"]: i for i in json.loads((out / ".state/runs/crash-test/items.json").read_text())}
    resumed = RoundItem.model_validate(saved[f"ROUND#{first:06d}"]).timings  # stored without defaults
    assert any(t.cold for t in resumed), resumed
    assert [(t.steps, t.cut) for t in resumed] == [(20, False)] * 4, resumed
    metrics = json.loads((out / "metrics.json").read_text())
    rounds = [r["round"] for r in metrics["rounds"]]
    assert rounds == list(range(7))  # 6 training rounds + the final evaluation, each exactly once
    assert metrics["final"]["rounds"] == 6
    assert reconcile_saved(out, "crash-test").findings == []

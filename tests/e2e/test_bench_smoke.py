"""Every benchmark in bench/ runs in its smoke mode (`--smoke`, bench/smoke.py): its measuring code
end to end on tiny inputs, each script in a process of its own as a user runs it. A change that
breaks a benchmark fails here, not later in `make bench`.

A smoke run must exit 0, print its results (bench/smoke.py's last line) with no part skipped (but
a part OPTIONAL names: one that needs what the project does not install), and leave every
recorded result as it was (bench/results, bench/README.md, the planner simulator's
calibration and curves). A new script in bench/ must join SMOKE (or, if other scripts run it,
HELPERS) or the first test fails.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench import smoke

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"

# script: what its smoke run covers (seconds on 2 idle cores).
SMOKE = {
    "alt_servers.py": "every check and call once: moto stock and patched, dynalite + s3rver if installed (40 s)",
    "aggregation_bench.py": "in-process reduce, sharded vs single on Redis and S3, sync, compression (8 s)",
    "loader_memory.py": "the streaming worker in a child process against moto, 2 x 1 MB (9 s)",
    "local_bench.py": "time to accuracy on digits (plain, DDP, smlt run --local), an 8-round overhead run (31 s)",
    "long_run.py": "6 rounds over chained executions, windows of 2, the sampler and probe (8 s)",
    "map_choice.py": "the Map table (under 1 s)",
    "model_zoo.py": "digits MLP time to accuracy, throughput, a sharded round (33 s)",
    "moto_calls.py": "every call once, patched and unpatched servers, 8 x 1M aggregation (11 s)",
    "network_binds.py": "the network-bound table on a coarse grid, two step counts (under 1 s)",
    "planner_bench.py": "the first scenario of each kind, one seed, both worlds, on the tuning and the held-out curves (8 s)",
    "planner_calibrate.py": "a 2 x 2 grid on digits, one seed, the fit and step times (6 s)",
    "planner_replay.py": "scenario 0 replayed against the recorded result, one run traced (1 s)",
    "prepare_memory.py": "a 2 MB CSV, NPZ and image folder each written and prepared by `smlt data prepare` in its own process (6 s)",
    "progress_calibration.py": "one workload, one seed (under 1 s)",
    "record_curves.py": "digits MLP curves on a tiny sample budget, step time (4 s)",
    "redis_tls.py": "1 MB over rediss:// and redis:// (1 s)",
    "study_bench.py": "one seed: full and ASHA studies of 4 trials x 4 rounds on the local engine (14 s)",
    "update_norms.py": "the three handlers on moto, MLP x 2 workers, 2 rounds (5 s)",
}
# Parts a smoke run may skip, by script and results path: they need what the project does not install.
OPTIONAL = {
    "alt_servers.py": {
        ".alternative": "dynalite and s3rver from npm, outside the project (`bench/alt_servers.py --install`)"
    },
}
# Modules the scripts above import or start; their smoke runs run these too.
HELPERS = {
    "baselines.py": "local_bench.py starts it (plain PyTorch and DDP processes)",
    "jobs.py": "local_bench.py, model_zoo.py, record_curves.py",
    "local_report.py": "renders local_bench.py's results (tests/unit/test_bench_report.py)",
    "moto_server.py": "loader_memory.py, moto_calls.py, alt_servers.py",
    "overhead.py": "local_bench.py",
    "quote_calibration.py": "planner_bench.py (each run's quote and its coverage); its CLI re-quotes a results file",
    "smoke.py": "every script's --smoke",
    "time_to_accuracy.py": "local_bench.py",
}
# What a smoke run must not touch: the recorded results.
RECORDED = (
    "bench/results/*",
    "bench/README.md",
    "smlt/sim/calibration.json",
    "smlt/sim/curves/*",
    "bench/curves/held-out/*",
    "bench/curves/held-out-2/*",
)
TIMEOUT_S = 540  # under pytest-timeout's 600 s (pyproject.toml): the overrun is ours to report


def _recorded() -> dict[str, str]:
    return {
        str(p.relative_to(ROOT)): hashlib.sha256(p.read_bytes()).hexdigest()
        for pattern in RECORDED
        for p in sorted(ROOT.glob(pattern))
        if p.is_file()
    }


def test_every_bench_script_has_a_smoke_run():
    scripts = {p.name for p in BENCH.glob("*.py")}
    assert scripts == set(SMOKE) | set(HELPERS), "add the new script to SMOKE (with a --smoke) or HELPERS"
    for name in SMOKE:
        text = (BENCH / name).read_text()
        assert ".add_flag(ap)" in text and ".report(" in text, name


@pytest.mark.parametrize("script", sorted(SMOKE))
def test_smoke(script, tmp_path):
    before = _recorded()
    # PYTHONFAULTHANDLER: a run that overruns is sent SIGABRT and prints every thread's stack,
    # so the failure says where it waited (before pytest's own timeout ends the test blind).
    env = {**os.environ, "SMLT_HOME": str(tmp_path / "home"), "PYTHONFAULTHANDLER": "1"}
    t0 = time.time()
    with subprocess.Popen(
        [sys.executable, str(BENCH / script), smoke.FLAG],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    ) as child:
        try:
            out, err = child.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            child.send_signal(signal.SIGABRT)
            try:
                out, err = child.communicate(timeout=20)
            except subprocess.TimeoutExpired:  # its own children hold the pipes open
                os.killpg(child.pid, signal.SIGKILL)
                out, err = child.communicate()
    proc = subprocess.CompletedProcess(child.args, child.returncode, out, err)
    took = time.time() - t0
    tail = (proc.stdout[-2000:] + "\n--- stderr ---\n" + proc.stderr[-4000:]).strip()
    assert proc.returncode == 0, f"{script} --smoke failed ({proc.returncode}) in {took:.0f} s:\n{tail}"
    lines = [line for line in proc.stdout.splitlines() if line.startswith(smoke.MARK)]
    assert lines, f"{script} --smoke printed no results:\n{tail}"
    results = json.loads(lines[-1][len(smoke.MARK) :])
    assert results, f"{script} --smoke printed empty results"
    skipped = [p for p in smoke.skipped(results) if p.split(":")[0] not in OPTIONAL.get(script, {})]
    assert not skipped, f"{script} --smoke skipped parts: {skipped}"
    assert _recorded() == before, f"{script} --smoke changed recorded results"

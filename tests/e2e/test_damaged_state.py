"""`smlt resume` of a damaged saved state (a ROUND item removed, a model byte flipped) is refused
with DamagedState and exit 2, naming the file and what is wrong, and changes nothing."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

from tests.e2e.test_local_run import run

ROOT = Path(__file__).resolve().parents[2]
CMD = [sys.executable, "-m", "smlt.cli"]


def _files(folder: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in folder.rglob("*") if p.is_file() and p.name != "lock"}


def _resume(out: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*CMD, "resume", "dmg", "--local", "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300
    )


def test_a_damaged_saved_state_is_refused_on_resume(local, tmp_path):
    job = json.loads((ROOT / "examples/digits.json").read_text())
    job.update(run_id="dmg")
    job["training"].update(max_rounds=3, target_value=None, local_steps=5)
    good = tmp_path / "good"
    # The saved state as `smlt run --local` leaves it (smlt.runner.execute, on the session's
    # engine: a process of its own would only pay the interpreter, the synth and a cold round);
    # the resumes below are the CLI's own, each in its process.
    assert run(local, job, good, "dmg") == 0

    gap = tmp_path / "gap"  # ROUND#000001 removed from the saved items
    shutil.copytree(good, gap)
    items_file = gap / ".state/runs/dmg/items.json"
    items = json.loads(items_file.read_text())
    items_file.write_text(json.dumps([i for i in items if i["sk"] != "ROUND#000001"]))
    before = _files(gap)
    res = _resume(gap)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "error: DamagedState: the saved state" in res.stderr and str(items_file) in res.stderr
    assert "ROUND item ROUND#000001 is missing" in res.stderr and "Traceback" not in res.stderr
    assert _files(gap) == before

    flipped = tmp_path / "flipped"  # one byte of model 2 flipped in the saved objects
    shutil.copytree(good, flipped)
    (model,) = (flipped / ".state/runs/dmg/s3").glob("*/runs/dmg/rounds/000002/model.safetensors")
    blob = bytearray(model.read_bytes())
    blob[-3] ^= 1
    model.write_bytes(bytes(blob))
    before = _files(flipped)
    res = _resume(flipped)
    assert res.returncode == 2, res.stdout + res.stderr
    assert f"{model} is damaged: model 2 has sha256" in res.stderr and "Traceback" not in res.stderr
    assert _files(flipped) == before

    shard_flipped = tmp_path / "shard"  # one byte of a dataset shard flipped in the saved state
    shutil.copytree(good, shard_flipped)
    (shard, *_) = sorted((shard_flipped / ".state/runs/dmg/s3").glob("*/**/train-*.safetensors"))
    blob = bytearray(shard.read_bytes())
    blob[-1] ^= 1
    shard.write_bytes(bytes(blob))
    before = _files(shard_flipped)
    res = _resume(shard_flipped)
    # Found at the resume's start (before any engine or round), named by its file under OUT/.state.
    assert res.returncode == 2, res.stdout + res.stderr
    assert f"the saved state {shard} is damaged: dataset shard {shard.name} does not match the sha256" in res.stderr
    assert "s3://" not in res.stderr and "resuming run" not in res.stdout + res.stderr and "Traceback" not in res.stderr
    assert _files(shard_flipped) == before

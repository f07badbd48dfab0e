"""A retraining run that fails, as the watch reports it (issue #38): the run's named error and its
whole message, from a data version whose shard holds NaN inputs (prepared elsewhere: `smlt data
prepare` refuses them), not Diverged and not Lambda's error JSON cut at 300 characters."""

import hashlib
import json

import numpy as np
from safetensors.numpy import load_file, save_file

from smlt.runtime.data.prepare import prepare_dataset


def test_the_watch_names_a_failed_runs_error_and_prints_its_whole_message(local, tmp_path, caplog):
    from smlt.watch import watch_folder

    engine, names = local
    root, out = tmp_path / "watched", tmp_path / "out"
    job = {"name": "watched", "dataset": {"uri": "replaced"}, "training": {"max_rounds": 2, "local_steps": 2}}
    (root / "incoming/nanp").mkdir(parents=True)
    (root / "incoming/nanp/job.json").write_text(json.dumps(job))
    version = root / "incoming/nanp/v1"
    prepare_dataset("sklearn:digits", str(version), shards=2)
    manifest = json.loads((version / "manifest.json").read_text())
    info = manifest["train"]["shards"][1]
    arrays = load_file(str(version / info["key"]))
    arrays["x"][:5, 9] = np.nan
    save_file(arrays, str(version / info["key"]))
    blob = (version / info["key"]).read_bytes()
    info.update(sha256=hashlib.sha256(blob).hexdigest(), bytes=len(blob))
    (version / "manifest.json").write_text(json.dumps(manifest))

    caplog.set_level("INFO", logger="smlt.notice")
    watch_folder(engine, names, root, out, once=True, interval=0.1)
    lines = [r.getMessage() for r in caplog.records if r.name == "smlt.notice"]
    (failed,) = [line for line in lines if line.startswith("  FAILED: ")]
    assert failed.startswith(
        f"  FAILED: DataError: train shard {info['key']} holds inputs that are not finite numbers: 5 rows of "
    ), failed
    assert "feature 9 (5 rows)" in failed and "Diverged" not in failed and "errorType" not in failed, failed
    assert failed.endswith("then start the run again"), failed  # the whole message, to its advice

"""`--code` on the worker side, on moto: the worker fetches the job's code, verifies its sha256,
unpacks it once and imports the model builder from it; a wrong digest or a missing object is a
named error recorded for the aggregator, not a retry."""

from __future__ import annotations

import hashlib
import importlib
import sys
from pathlib import Path

import numpy as np
import pytest

from lambdas.aggregate.handler import handler as aggregate
from lambdas.train_step.handler import handler as train_step
from smlt.runtime import usercode
from smlt.runtime.errors import InvalidCode
from smlt.runtime.job import parse_job
from smlt.runtime.records import RunTable
from smlt.runtime.usercode import activate_code, load_transform, package_code, stage_code, with_code
from tests.functional.handlers import conftest as handlers
from tests.functional.handlers.conftest import job
from tests.functional.handlers.test_failures import plan

aws, digits = handlers.aws, handlers.digits  # the handlers' moto fixtures

PKG = "smlt_test_usermodels"  # on no path but the code's
NET = """import torch

VERSION = {version}

def build(input_shape, output_dim, width=16):
    # flatten-agnostic: (N, 64) today, (N, 1, 8, 8) once datasets keep their shape
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, width), torch.nn.ReLU(),
                               torch.nn.Linear(width, output_dim))
"""
AUG = "SIZE = 3\n\n\ndef transform(x):\n    return x[..., ::-1]\n"


def _code(root: Path, version: int = 1) -> Path:
    pkg = root / PKG
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "net.py").write_text(NET.format(version=version))
    (pkg / "aug.py").write_text(AUG)
    return pkg


@pytest.fixture(autouse=True)
def fresh_process(tmp_path, monkeypatch):
    """Each test as a fresh worker process: its own unpack folder, no code active."""
    monkeypatch.setenv("SMLT_CODE_DIR", str(tmp_path / "code-cache"))
    monkeypatch.setattr(usercode, "_active", None)
    saved = list(sys.path)
    yield
    sys.path[:] = saved
    for m in [m for m in sys.modules if m.split(".")[0] == PKG]:
        del sys.modules[m]


def _staged_job(uri: str, folder: Path, **extra) -> dict:
    staged = stage_code(package_code(folder), "smlt-artifacts")
    return with_code({**job(uri), "model": {"name": f"{PKG}.net:build"}, **extra}, staged)


def test_a_worker_trains_the_jobs_own_model(digits, aws, tmp_path):
    assert importlib.util.find_spec(PKG) is None
    j = _staged_job(digits, _code(tmp_path / "src"))
    sha = j["code"]["sha256"]
    assert j["code"]["uri"] == f"s3://smlt-artifacts/code/{sha}.zip"
    p = plan(j, "own")
    train_step({"run_id": "own", "round": 0, "worker": p["workers"][0]}, None)
    net = sys.modules[f"{PKG}.net"]
    assert Path(net.__file__).is_relative_to(tmp_path / "code-cache" / sha)
    assert str(tmp_path / "code-cache" / sha) == sys.path[0]
    # The global model is the user's: its layer names, its width.
    keys = aws.get_object(Bucket="smlt-artifacts", Key="runs/own/rounds/000000/model.safetensors")["Body"].read()
    assert b'"1.weight"' in keys and b'"3.weight"' in keys


def test_a_wrong_digest_is_named_recorded_and_fails_the_round(digits, aws, tmp_path):
    j = _staged_job(digits, _code(tmp_path / "src"))
    j["code"]["sha256"] = hashlib.sha256(b"other code").hexdigest()
    p = plan(j, "tampered")
    with pytest.raises(InvalidCode, match=r"code.sha256: s3://smlt-artifacts/code/\w+\.zip has sha256 \w+, the job"):
        train_step({"run_id": "tampered", "round": 0, "worker": p["workers"][0]}, None)
    assert not (tmp_path / "code-cache" / j["code"]["sha256"]).exists()  # nothing unverified is kept
    (err,) = RunTable("smlt-runs", "tampered").errors(0).values()
    assert err.error == "InvalidCode"
    # The aggregator fails the run under the same name (Step Functions retries only service errors).
    with pytest.raises(InvalidCode, match="code.sha256"):
        aggregate({"run_id": "tampered", "round": 0}, None)


def test_a_missing_code_object_is_named(aws, tmp_path):
    j = parse_job(_staged_job("s3://smlt-data/d/", _code(tmp_path / "src")))
    aws.delete_object(Bucket="smlt-artifacts", Key=f"code/{j.code.sha256}.zip")
    with pytest.raises(InvalidCode, match="code.uri: no object at s3://smlt-artifacts/code/"):
        activate_code(j)


def test_without_code_a_missing_module_says_to_pass_it(aws):
    j = parse_job({**job("s3://smlt-data/d/"), "model": {"name": f"{PKG}.net:build"}})
    with pytest.raises(InvalidCode, match=rf"model.name: no module '{PKG}.net' here: pass your package with `--code"):
        activate_code(j)


def test_a_model_missing_from_the_code_says_what_the_code_holds(aws, tmp_path):
    j = parse_job(_staged_job("s3://smlt-data/d/", _code(tmp_path / "src"), model={"name": "other.net:build"}))
    with pytest.raises(InvalidCode, match=rf"model.name: no module 'other.net' in the job's code \(it holds {PKG}\)"):
        activate_code(j)


def test_code_is_unpacked_once_and_a_new_version_replaces_the_old(aws, tmp_path, monkeypatch):
    v1 = parse_job(_staged_job("s3://smlt-data/d/", _code(tmp_path / "v1", version=1)))
    v2 = parse_job(_staged_job("s3://smlt-data/d/", _code(tmp_path / "v2", version=2)))
    assert v1.code.sha256 != v2.code.sha256
    activate_code(v1)
    assert importlib.import_module(f"{PKG}.net").VERSION == 1
    activate_code(v2)
    assert importlib.import_module(f"{PKG}.net").VERSION == 2
    assert sum(p.startswith(str(tmp_path / "code-cache")) for p in sys.path) == 1
    # Another process (or the next warm invocation) finds v1 unpacked: no fetch.
    aws.delete_object(Bucket="smlt-artifacts", Key=f"code/{v1.code.sha256}.zip")
    monkeypatch.setattr(usercode, "_fetch", lambda *a: pytest.fail("fetched again"))
    activate_code(v1)
    assert importlib.import_module(f"{PKG}.net").VERSION == 1


def test_load_transform_returns_the_jobs_transform(aws, tmp_path):
    code = _code(tmp_path / "src")
    assert load_transform(parse_job(_staged_job("s3://smlt-data/d/", code))) is None
    fn = load_transform(parse_job(_staged_job("s3://smlt-data/d/", code, code={"transform": f"{PKG}.aug:transform"})))
    assert fn is not None and fn(np.arange(3)).tolist() == [2, 1, 0]
    with pytest.raises(InvalidCode, match=r"code.transform: '\w+.aug:SIZE' is a int, not a function"):
        load_transform(parse_job(_staged_job("s3://smlt-data/d/", code, code={"transform": f"{PKG}.aug:SIZE"})))
    with pytest.raises(InvalidCode, match=r"code.transform: cannot import .*aug:nothing"):
        load_transform(parse_job(_staged_job("s3://smlt-data/d/", code, code={"transform": f"{PKG}.aug:nothing"})))


def test_a_zip_that_escapes_its_folder_is_refused(aws, tmp_path):
    import io
    import zipfile

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr(f"{PKG}/__init__.py", "")
        zf.writestr("../evil.py", "")
    data = buf.getvalue()
    sha = hashlib.sha256(data).hexdigest()
    aws.put_object(Bucket="smlt-artifacts", Key=f"code/{sha}.zip", Body=data)
    j = parse_job({**job("s3://smlt-data/d/"), "code": {"uri": f"s3://smlt-artifacts/code/{sha}.zip", "sha256": sha}})
    with pytest.raises(InvalidCode, match="'../evil.py' points outside the package"):
        activate_code(j)
    assert not (tmp_path / "code-cache" / sha).exists() and not (tmp_path / "evil.py").exists()

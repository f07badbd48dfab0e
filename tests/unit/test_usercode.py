"""`--code DIR` on the CLI side: the package is deterministic, and what the image cannot run is
refused with a named error before anything starts."""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import sys
import zipfile
from pathlib import Path

import pytest

from smlt.runtime import usercode
from smlt.runtime.errors import InvalidCode, InvalidJob
from smlt.runtime.job import parse_job
from smlt.runtime.usercode import check_shipped, package_code, with_code

NET = "import torch\n\ndef build(input_shape, output_dim):\n    return torch.nn.Linear(64, output_dim)\n"


def _package(root: Path, name: str = "mymodels") -> Path:
    pkg = root / name
    (pkg / "layers").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "net.py").write_text(NET)
    (pkg / "layers" / "__init__.py").write_text("")
    (pkg / "layers" / "conv.py").write_text("SIZE = 3\n")
    (pkg / "classes.txt").write_text("0\n1\n")
    return pkg


def _names(data: bytes) -> list[str]:
    return zipfile.ZipFile(io.BytesIO(data)).namelist()


def test_the_same_code_gives_the_same_bytes_wherever_and_whenever_it_lies(tmp_path):
    a = package_code(_package(tmp_path / "a"))
    b_dir = _package(tmp_path / "b")
    for i, f in enumerate(sorted(b_dir.rglob("*"))):  # other times, another creation order's mtimes
        os.utime(f, (1_000_000 + i, 2_000_000_000 - i))
    (b_dir / "__pycache__").mkdir()
    (b_dir / "__pycache__" / "net.cpython-312.pyc").write_bytes(b"\x00compiled")
    (b_dir / "layers" / "conv.pyc").write_bytes(b"\x00")
    (b_dir / ".git").mkdir()
    (b_dir / ".git" / "HEAD").write_text("ref\n")
    (b_dir / ".DS_Store").write_bytes(b"junk")
    b = package_code(b_dir)
    assert a.data == b.data and a.sha256 == b.sha256 == hashlib.sha256(a.data).hexdigest()
    assert a.files == 5
    # A package keeps its name; entries are sorted, stamped 1980, mode 644.
    assert (
        _names(a.data)
        == sorted(_names(a.data))
        == [
            "mymodels/__init__.py",
            "mymodels/classes.txt",
            "mymodels/layers/__init__.py",
            "mymodels/layers/conv.py",
            "mymodels/net.py",
        ]
    )
    for info in zipfile.ZipFile(io.BytesIO(a.data)).infolist():
        assert info.date_time == (1980, 1, 1, 0, 0, 0) and info.external_attr >> 16 == 0o644


def test_a_change_in_the_code_changes_the_digest(tmp_path):
    pkg = _package(tmp_path)
    before = package_code(pkg).sha256
    (pkg / "net.py").write_text(NET + "# tuned\n")
    assert package_code(pkg).sha256 != before


def test_a_folder_of_packages_is_stored_as_it_is(tmp_path):
    root = tmp_path / "src"
    _package(root, "mymodels")
    _package(root, "myaug")
    (root / "helpers.py").write_text("X = 1\n")
    names = _names(package_code(root).data)
    assert "helpers.py" in names and "myaug/net.py" in names and "mymodels/net.py" in names
    assert not any(n.startswith("src/") for n in names)


@pytest.mark.parametrize("name", ["fast.cpython-312-x86_64-linux-gnu.so", "fast.pyd", "libx.so.1", "x.dylib"])
def test_compiled_extensions_are_refused(tmp_path, name):
    pkg = _package(tmp_path)
    (pkg / "layers" / name).write_bytes(b"\x7fELF")
    with pytest.raises(InvalidCode, match=rf"mymodels/layers/{name}' is a compiled extension"):
        package_code(pkg)


def test_a_folder_without_python_is_refused(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "notes.txt").write_text("no code here\n")
    with pytest.raises(InvalidCode, match=r"holds no Python \(\.py\) files"):
        package_code(tmp_path / "data")
    with pytest.raises(InvalidCode, match="is not a folder"):
        package_code(tmp_path / "missing")
    (tmp_path / "my-models").mkdir()
    (tmp_path / "my-models" / "__init__.py").write_text("")
    with pytest.raises(InvalidCode, match="is a package whose name 'my-models' Python cannot import"):
        package_code(tmp_path / "my-models")


def test_code_over_the_cap_is_refused(tmp_path, monkeypatch):
    pkg = _package(tmp_path)
    monkeypatch.setattr(usercode, "MAX_CODE_BYTES", 2**20)
    (pkg / "weights.bin").write_bytes(b"\x00" * (2**20 - 200))
    package_code(pkg)  # under the cap
    (pkg / "more.bin").write_bytes(b"\x00" * 400)
    with pytest.raises(InvalidCode, match="holds more than 1 MB"):
        package_code(pkg)


def test_a_package_the_image_provides_is_refused(tmp_path):
    root = tmp_path / "src"
    _package(root)
    shutil.copytree(root / "mymodels", root / "torch")
    with pytest.raises(InvalidCode, match="would replace the image's own 'torch'"):
        package_code(root)
    (root / "numpy.py").write_text("")
    shutil.rmtree(root / "torch")
    with pytest.raises(InvalidCode, match="would replace the image's own 'numpy'"):
        package_code(root)


def test_a_linked_folder_is_refused(tmp_path):
    pkg = _package(tmp_path / "a")
    (pkg / "shared").symlink_to(tmp_path / "a", target_is_directory=True)
    with pytest.raises(InvalidCode, match="is a link to a folder"):
        package_code(pkg)


def _job(**extra):
    return {"dataset": {"uri": "s3://b/d/"}, "model": {"name": "mymodels.net:build"}, **extra}


def test_the_job_records_uri_and_sha256_together():
    sha = "ab" * 32
    job = parse_job(
        with_code(_job(code={"transform": "mymodels.aug:flip"}), {"uri": "s3://a/code/x.zip", "sha256": sha})
    )
    assert job.code is not None and (job.code.uri, job.code.sha256, job.code.transform) == (
        "s3://a/code/x.zip",
        sha,
        "mymodels.aug:flip",
    )
    with pytest.raises(InvalidJob, match="code: give both uri and sha256"):
        parse_job(_job(code={"uri": "s3://a/code/x.zip"}))
    with pytest.raises(InvalidJob, match="code.sha256"):
        parse_job(_job(code={"uri": "s3://a/code/x.zip", "sha256": "nothex"}))
    with pytest.raises(
        InvalidJob, match="code.transform: 'not an entry point' is not an entry point 'package.module:function'"
    ):
        parse_job(_job(code={"transform": "not an entry point"}))


def test_a_deployed_stack_needs_the_code_of_an_entry_point():
    with pytest.raises(InvalidCode, match=r"model.name: 'mymodels.net:build' is not in the train_step image.*--code"):
        check_shipped(parse_job(_job()))
    with pytest.raises(InvalidCode, match="code.transform: 'aug.t:flip' is not in the train_step image"):
        check_shipped(parse_job({"dataset": {"uri": "s3://b/d/"}, "code": {"transform": "aug.t:flip"}}))
    check_shipped(parse_job({"dataset": {"uri": "s3://b/d/"}}))  # built-ins need nothing
    check_shipped(parse_job(_job(model={"name": "smlt.runtime.train.models:mlp"})))  # in the image
    check_shipped(parse_job(_job(code={"uri": "s3://a/code/x.zip", "sha256": "ab" * 32})))


@pytest.mark.parametrize("cmd", [["run", "--local"], ["start"]])
def test_the_cli_refuses_bad_code_before_any_engine_or_stack(tmp_path, capsys, cmd):
    from smlt.cli import main

    job = tmp_path / "job.json"
    job.write_text('{"dataset": {"uri": "s3://b/d/"}, "model": {"name": "mymodels.net:build"}}')
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "fast.so").write_bytes(b"\x7fELF")
    assert main([*cmd, str(job), "--code", str(tmp_path / "lib")]) == 2
    assert "InvalidCode: code: " in capsys.readouterr().err


def test_smlt_start_without_code_names_the_flag(tmp_path, capsys):
    from smlt.cli import main

    job = tmp_path / "job.json"
    job.write_text('{"dataset": {"uri": "s3://b/d/"}, "model": {"name": "mymodels.net:build"}}')
    assert main(["start", str(job)]) == 2  # before any stack lookup: no AWS needed
    assert "pass your package with `smlt start JOB --code DIR`" in capsys.readouterr().err


def test_smlt_run_local_without_code_needs_the_module_on_its_path(tmp_path, capsys, monkeypatch):
    from smlt.cli import main

    job = tmp_path / "job.json"
    job.write_text('{"dataset": {"uri": "s3://b/d/"}, "model": {"name": "mymodels.net:build"}}')
    assert main(["run", "--local", str(job)]) == 2  # before the engine starts
    assert "model.name: no module 'mymodels.net' here: pass your package with `--code DIR`" in capsys.readouterr().err
    _package(tmp_path / "src")
    monkeypatch.syspath_prepend(str(tmp_path / "src"))  # as PYTHONPATH would
    monkeypatch.setattr("smlt.runner.start_engine", lambda faults: pytest.fail("engine started"))
    with pytest.raises(pytest.fail.Exception, match="engine started"):
        main(["run", "--local", str(job), "--out", str(tmp_path / "out")])
    for m in [m for m in sys.modules if m.split(".")[0] == "mymodels"]:  # found (imported) from tmp_path
        del sys.modules[m]


def test_the_workers_user_error_text_reads_back_as_message_and_frames():
    from smlt.runtime.usercode import _user_message, read_user_message

    trace = '  ... 3 earlier frames in your code\n  File "pk/net.py", line 7, in forward\n    return self.l(x)\n  File "pk/net.py", line 2'
    text = _user_message(ValueError("two\nlines"), trace)
    message, frames = read_user_message(text)
    assert message == "your code raised ValueError: two\nlines"
    assert frames == ["... 3 earlier frames in your code", "pk/net.py:7 in forward: return self.l(x)", "pk/net.py:2"]


def test_a_gpu_asked_for_on_a_worker_is_told_it_has_none():
    from smlt.runtime.usercode import hint

    assert hint("Torch not compiled with CUDA enabled") == (
        "Torch not compiled with CUDA enabled (the workers run on CPU: Lambda has no GPU; leave out .cuda() and "
        "device='cuda')"
    )
    assert hint("mat1 and mat2 shapes cannot be multiplied") == "mat1 and mat2 shapes cannot be multiplied"

"""What a Lambda worker lacks, met in the client's check (smlt.precheck with
smlt.runtime.worker_limits.lambda_limits): a file written outside /tmp (the current folder, $HOME's
download caches) and multiprocessing's semaphores (no /dev/shm) fail there as on a worker, with
the same OSError, named as the user's code with the line and what to do."""

import textwrap
from pathlib import Path

import pytest

from smlt.precheck import check_model
from smlt.runtime import usercode, worker_limits
from smlt.runtime.errors import UserCodeError
from smlt.runtime.job import parse_job

LIMITS = """
import multiprocessing as mp
import tempfile
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def writes_here(input_shape, output_dim):
    with open("build_log.txt", "w") as f:
        f.write("built")
    return nn.Linear(64, output_dim)


def writes_tmp(input_shape, output_dim):
    (Path(__file__).parent / "cache.txt").write_text("x")  # a worker unpacks the code under /tmp
    Path(tempfile.mkdtemp(), "log.txt").write_text("x")
    return nn.Linear(64, output_dim)


def square(x):
    return x * x


def pool(input_shape, output_dim):
    with mp.Pool(2) as p:
        p.map(square, range(4))
    return nn.Linear(64, output_dim)


def loader(input_shape, output_dim):
    for _ in DataLoader(TensorDataset(torch.zeros(8, 64)), batch_size=4, num_workers=2):
        pass
    return nn.Linear(64, output_dim)


class Queued(nn.Module):
    def __init__(self, output_dim):
        super().__init__()
        self.l = nn.Linear(64, output_dim)

    def forward(self, x):
        q = mp.Queue()
        return self.l(x)


def queued(input_shape, output_dim):
    return Queued(output_dim)


def reads_here(input_shape, output_dim):
    words = open("limitnets/vocab.txt").read().split()
    return nn.Linear(64, output_dim + 0 * len(words))


def hub(input_shape, output_dim):
    return torch.hub.load("pytorch/vision", "resnet18", weights="IMAGENET1K_V1")
"""


@pytest.fixture
def code(user_package):
    return user_package("limitnets", nets=textwrap.dedent(LIMITS))


def job(name):
    return parse_job({"dataset": {"uri": "unused"}, "model": {"name": f"limitnets.nets:{name}"}})


def test_a_file_written_to_the_current_folder_fails_as_on_a_worker_and_is_not_written(
    digits, code, tmp_path, monkeypatch
):
    here = tmp_path / "project"
    here.mkdir()
    monkeypatch.chdir(here)  # relative to the current folder: a worker's is its read-only code folder
    with pytest.raises(UserCodeError) as e:
        check_model(job("writes_here"), digits, code)
    text = str(e.value)
    assert text.startswith(
        "building model.name 'limitnets.nets:writes_here': your code raised OSError: [Errno 30] Read-only file "
        "system: 'build_log.txt' (a worker's file system is read-only but for /tmp, and its current folder is the "
        "image's code folder: write under tempfile.gettempdir()"
    ), text
    assert 'limitnets/nets.py:12 in writes_here: with open("build_log.txt", "w") as f:' in text
    assert not (here / "build_log.txt").exists()


def test_files_written_beside_the_module_or_in_the_temp_folder_are_fine(digits, code):
    check_model(job("writes_tmp"), digits, code)
    assert (code / "cache.txt").read_text() == "x"


@pytest.mark.parametrize(
    "name, where, line",
    [
        ("pool", "building model.name", "limitnets/nets.py:28 in pool: with mp.Pool(2) as p:"),
        ("loader", "building model.name", "in loader: for _ in DataLoader("),
        ("queued", "the forward pass of model.name", "limitnets/nets.py:45 in forward: q = mp.Queue()"),
    ],
)
def test_multiprocessing_fails_as_on_a_worker_without_dev_shm(digits, code, name, where, line, monkeypatch):
    import gc
    import sys

    late = []  # torch's cleanup of a DataLoader iterator refused its queue printed a traceback at exit
    monkeypatch.setattr(sys, "unraisablehook", late.append)
    with pytest.raises(UserCodeError) as e:
        check_model(job(name), digits, code)
    gc.collect()
    assert late == []
    text = str(e.value)
    assert text.startswith(f"{where} 'limitnets.nets:{name}'"), text
    assert (
        "your code raised OSError: [Errno 38] Function not implemented (Lambda has no /dev/shm, so multiprocessing's "
        "Pool, Queue and Lock, torch.multiprocessing and DataLoader(num_workers>0) cannot run on a worker: leave "
        "them out (num_workers=0), or use threads (concurrent.futures.ThreadPoolExecutor))"
    ) in text
    assert line in text


def test_pretrained_weights_downloaded_into_a_cache_fail_as_on_a_worker(digits, code, tmp_path, monkeypatch):
    """torch.hub (torchvision's weights= likewise) makes its cache folder in $HOME or TORCH_HOME first: read-only
    on a worker (here the temp folder holds the cache, so it is made read-only for the check)."""
    cache = tmp_path / "home" / "torch"
    monkeypatch.setenv("TORCH_HOME", str(cache))
    monkeypatch.setattr(worker_limits, "_writable", lambda: ("/dev",))
    with pytest.raises(UserCodeError) as e:
        check_model(job("hub"), digits, code)
    text = str(e.value)
    # makedirs stops at the first folder it cannot make: home/, or home/torch/ when home/ is there
    assert f"your code raised OSError: [Errno 30] Read-only file system: '{cache.parent}" in text
    assert (
        "$HOME too, where torch.hub, torchvision's weights= and Hugging Face keep their downloads: pretrained "
        "weights: put the weights file in the code folder (--code DIR ships up to 50 MB)"
    ) in text
    assert 'torch.hub.load("pytorch/vision", "resnet18", weights="IMAGENET1K_V1")' in text
    assert not cache.exists()


@pytest.mark.parametrize(
    "message",
    [
        "It looks like there is no internet connection and the repo could not be found in the cache (/root/.cache)",
        "<urlopen error [Errno -3] Temporary failure in name resolution>",
        "We couldn't connect to 'https://huggingface.co' to load this file",
    ],
)
def test_a_download_that_finds_no_network_says_a_worker_may_have_none(message):
    said = usercode.hint(message)
    assert said.startswith(f"{message} (a worker may not reach the internet (a stack with the exchange runs its ")
    assert said.endswith("or build without them (weights=None) and start from a stored model with warm_start)")


def test_the_limits_end_with_the_check_and_leave_smlts_own_writes_alone(digits, code, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserCodeError):
        check_model(job("writes_here"), digits, code)
    Path("after.txt").write_text("x")  # the caller's own code, after the check
    assert worker_limits._limits is None
    with worker_limits.lambda_limits([code]):
        Path("smlt.txt").write_text("x")  # no frame of the user's files on the stack
    assert Path("smlt.txt").exists()


COMPILED = """
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self, output_dim):
        super().__init__()
        self.body = torch.compile(nn.Linear(64, 16))
        self.head = nn.Linear(16, output_dim)

    def forward(self, x):
        return self.head(torch.relu(self.body(x)))


def wrapped(input_shape, output_dim):
    return torch.compile(nn.Sequential(nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, output_dim)))


def inside(input_shape, output_dim):
    net = Net(output_dim)
    net.compile()
    return net
"""


@pytest.mark.parametrize(
    "name, keys",
    [
        ("wrapped", ["_orig_mod.0.weight", "_orig_mod.0.bias"]),
        ("inside", ["body._orig_mod.weight", "body._orig_mod.bias"]),
    ],
)
def test_a_compiled_model_trains_uncompiled_with_its_state_named_as_built(digits, code, caplog, name, keys):
    """A worker cannot compile it (no C++ compiler in Lambda's image); the same model runs eagerly."""
    import torch
    from torch._dynamo.utils import counters

    from smlt.runtime.train.models import _TOLD_EAGER, build_model

    (code / "compiled.py").write_text(textwrap.dedent(COMPILED))
    spec = parse_job({"dataset": {"uri": "unused"}, "model": {"name": f"limitnets.compiled:{name}"}})
    _TOLD_EAGER.discard(spec.model.name)
    counters.clear()
    with caplog.at_level("WARNING", logger="smlt.notice"):
        check_model(spec, digits, code)
    said = [r.getMessage() for r in caplog.records if "torch.compile" in r.getMessage()]
    assert said == [
        f"model.name: 'limitnets.compiled:{name}' returns a model compiled with torch.compile (or module.compile()): "
        "it trains uncompiled, the same model (its state keeps its names), as a worker cannot compile it (Lambda's "
        "image has no C++ compiler for torch's inductor, and each worker would compile it again at every cold "
        "start); leave torch.compile out of the builder"
    ]
    assert not counters["frames"]  # dynamo traced nothing: nothing was compiled
    import sys

    sys.path.insert(0, str(code.parent))
    try:
        model = build_model(spec.model, (64,), 10, 0)
    finally:
        sys.path.remove(str(code.parent))
    assert list(model.state_dict())[:2] == keys
    x = torch.randn(3, 64)
    inner = model._orig_mod if name == "wrapped" else None
    if inner is not None:
        assert torch.equal(model(x), inner(x))
    assert not counters["frames"]


VALUES = """
import numpy as np
import torch
from torch import nn


class Scaled(nn.Module):
    def __init__(self, output_dim, how):
        super().__init__()
        self.l, self.how = nn.Linear(64, output_dim), how

    def forward(self, x):
        if self.how == "item":
            x = x / (float(x.abs().max().item()) or 1.0)
        elif self.how == "numpy":
            x = x - torch.from_numpy(np.asarray(x.detach().mean(0)))
        else:
            x = x / x.abs().amax().clamp_min(1.0)
        return self.l(x)


def scaled(input_shape, output_dim, how):
    return Scaled(output_dim, how)
"""


@pytest.mark.parametrize(
    "how, line",
    [
        ("item", "limitnets/values.py:14 in forward: x = x / (float(x.abs().max().item()) or 1.0)"),
        ("numpy", "limitnets/values.py:16 in forward: x = x - torch.from_numpy(np.asarray(x.detach().mean(0)))"),
        ("tensor", None),
    ],
)
def test_a_forward_reading_a_tensors_value_into_python_is_told_it_will_not_export(digits, code, caplog, how, line):
    (code / "values.py").write_text(textwrap.dedent(VALUES))
    spec = parse_job(
        {"dataset": {"uri": "unused"}, "model": {"name": "limitnets.values:scaled", "params": {"how": how}}}
    )
    with caplog.at_level("WARNING", logger="smlt.notice"):
        check_model(spec, digits, code)
    said = [r.getMessage() for r in caplog.records if "into Python" in r.getMessage()]
    if line is None:
        assert said == []
        return
    assert said == [
        f"model.name: 'limitnets.values:scaled' reads a tensor's value into Python in its forward pass ({line}; "
        ".item(), float(), int(), .numpy() or a branch on a tensor): it trains (the value is a constant to the "
        "gradient), but `smlt export` cannot trace it: keep it a tensor (torch.where, torch.clamp, x.amax()) if "
        "the model is to be exported"
    ]
    import torch

    assert "item" not in vars(torch.Tensor) and torch.Tensor.item.__qualname__ == "TensorBase.item"  # torch's own again


def test_a_file_of_the_code_opened_relative_to_the_current_folder_says_to_open_it_beside_the_module(
    digits, code, tmp_path, monkeypatch
):
    (code / "vocab.txt").write_text("a b c")  # shipped with the code; the current folder does not hold it
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserCodeError) as e:
        check_model(job("reads_here"), digits, code)
    assert str(e.value) == (
        "building model.name 'limitnets.nets:reads_here': your code raised FileNotFoundError: [Errno 2] No such file "
        "or directory: 'limitnets/vocab.txt' (a path relative to the current folder, which on a worker is the image's "
        "code folder, not yours: open a file shipped with your code beside the module (Path(__file__).parent / NAME), "
        "data through the dataset)\n"
        '  limitnets/nets.py:54 in reads_here: words = open("limitnets/vocab.txt").read().split()'
    )
    assert usercode.hint("[Errno 2] No such file or directory: '/data/x.csv'") == (
        "[Errno 2] No such file or directory: '/data/x.csv'"
    )  # an absolute path: its own words say it

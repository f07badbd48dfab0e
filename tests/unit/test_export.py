"""`smlt export`: every built-in model and a user's CNN exported to ONNX and to a torch.export
program, each loaded back and compared with PyTorch's outputs on the same rows (the largest
absolute difference is recorded in MEASURED); a model that cannot be exported is a named error.

Measured here (torch 2.13, onnxruntime 1.31, CPU), max abs diff vs PyTorch on 8 rows:
mlp 0 / 4.5e-08, logreg 0 / 1.2e-07, lenet 0 / 3.7e-08, resnet18 0 / 6.6e-07,
transformer 1.2e-07 / 1.2e-07, user CNN 0 / 6.0e-07 (torch-export / onnx). Run with -s to see them.
"""

import importlib.util
import os

import numpy as np
import pytest
import torch
from torch import nn

from smlt.exporter import TOLERANCE, ExportFailed, example_input, export_module
from smlt.runtime.job import ModelSpec
from smlt.runtime.train.models import build_model

# (model, input shape, outputs, vocab size)
BUILTINS = [
    ("mlp", [64], 10, None),
    ("logreg", [13], 3, None),
    ("lenet", [1, 28, 28], 10, None),
    ("resnet18", [3, 32, 32], 10, None),
    ("transformer", [16], 4, 50),
]


def user_cnn(input_shape, output_dim, width=8):
    """What a user's `mymodels.cnn:build` looks like (see tests/e2e/test_usercode.py)."""
    c, h, w = input_shape
    return nn.Sequential(
        nn.Conv2d(c, width, 3, padding=1),
        nn.BatchNorm2d(width),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(width * (h // 2) * (w // 2), output_dim),
    )


def _models():
    for name, shape, _out, vocab in BUILTINS:
        yield pytest.param(name, shape, vocab, id=name)
    yield pytest.param("user_cnn", [1, 8, 8], None, id="user_cnn")


def _build(name, shape, vocab):
    if name == "user_cnn":
        torch.manual_seed(0)
        model = user_cnn(shape, 10)
        model[1].running_mean.uniform_(-1, 1)  # evaluated with trained-looking statistics
        return model.eval()
    out = next(o for n, _, o, _ in BUILTINS if n == name)
    return build_model(ModelSpec(name=name), shape, out, 0, vocab_size=vocab).eval()


MEASURED: dict[tuple[str, str], float] = {}
ONNX = all(importlib.util.find_spec(m) for m in ("onnx", "onnxruntime", "onnxscript"))
needs_onnx = pytest.mark.skipif(not ONNX, reason="the onnx extra (onnx, onnxscript, onnxruntime) is not installed")


@pytest.mark.parametrize("fmt", ["torch-export", pytest.param("onnx", marks=needs_onnx)])
@pytest.mark.parametrize(("name", "shape", "vocab"), list(_models()))
def test_the_export_gives_pytorchs_outputs(name, shape, vocab, fmt, tmp_path):
    model = _build(name, shape, vocab)
    x = example_input(shape, "int64" if vocab else "float32", vocab)
    done = export_module(model, x, fmt, tmp_path / f"{name}.{fmt}")
    MEASURED[(name, fmt)] = done.max_abs_diff
    assert done.rows == 8 and done.max_abs_diff <= TOLERANCE
    print(f"{name} {fmt}: max abs diff {done.max_abs_diff:.2e}")
    if fmt == "onnx":
        import onnx

        onnx.checker.check_model(str(done.path))
        graph = onnx.load(str(done.path)).graph
        assert graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"  # the batch axis is dynamic
    else:
        program = torch.export.load(str(done.path)).module()
        with torch.no_grad():  # another batch size than the traced one
            assert program(x[:3]).shape == model(x[:3]).shape


class Branchy(nn.Module):
    def forward(self, x):
        if x.sum() > 0:  # a data-dependent branch: no static graph holds it
            return x * 2
        return x


class Svd(nn.Module):
    def forward(self, x):
        return torch.linalg.svdvals(x.reshape(x.shape[0], 2, 2))


@needs_onnx
def test_a_model_that_cannot_be_exported_names_the_operator_or_the_line(tmp_path):
    with pytest.raises(ExportFailed, match=r"operator aten\._linalg_svd.*No ONNX function"):
        export_module(Svd(), torch.randn(4, 4), "onnx", tmp_path / "svd.onnx")
    with pytest.raises(ExportFailed, match=r"test_export\.py:\d+ `if x\.sum\(\) > 0:.*branches on a tensor's value"):
        export_module(Branchy(), torch.randn(4, 3), "torch-export", tmp_path / "b.pt2")
    with pytest.raises(ExportFailed, match="--format"):
        export_module(Svd(), torch.randn(4, 4), "torchscript", tmp_path / "x")  # type: ignore[arg-type]


class RowLoop(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 2)

    def forward(self, x):
        return torch.stack([self.fc(x[i]) for i in range(x.shape[0])])


class ReadsAValue(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 2)

    def forward(self, x):
        return self.fc(x) * float(x.max().item())


@pytest.mark.parametrize("fmt", ["torch-export", pytest.param("onnx", marks=needs_onnx)])
def test_a_model_that_fixes_the_batch_or_reads_a_value_is_told_what_to_change(fmt, tmp_path):
    """A Python loop over the rows (torch: 'Constraints violated (batch)!') and a tensor's value read
    into Python (.item()): each named with what to write instead, and the line for the value."""
    with pytest.raises(ExportFailed, match=r"makes the batch size a constant \(4 rows: a Python loop over the rows"):
        export_module(RowLoop(), torch.randn(4, 3), fmt, tmp_path / "loop")
    with pytest.raises(
        ExportFailed, match=r"at test_export\.py:\d+: .*reads a tensor's value into Python \(\.item\(\)"
    ):
        export_module(ReadsAValue(), torch.randn(4, 3), fmt, tmp_path / "item")


class OneRowOtherwise(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 2)

    def forward(self, x):
        if x.shape[0] == 1:  # traced on more rows, the file would hold the other branch only
            return self.fc(x) * 2
        return self.fc(x)


@pytest.mark.parametrize("fmt", ["torch-export", pytest.param("onnx", marks=needs_onnx)])
def test_a_model_that_treats_one_row_otherwise_is_refused_and_leaves_no_file(fmt, tmp_path):
    """The file is checked on a batch of one row too: a branch on the batch size would otherwise give
    a server's single request another answer than the model's, silently. A refused export leaves
    no file behind (nor an earlier one replaced)."""
    path = tmp_path / ("m.onnx" if fmt == "onnx" else "m.pt2")
    path.write_bytes(b"an earlier export")
    with pytest.raises(
        ExportFailed, match=r"on a batch of 1 row .* differ from the model's own .*on 4 rows they agree"
    ):
        export_module(OneRowOtherwise(), torch.randn(4, 3), fmt, path)
    assert path.read_bytes() == b"an earlier export"
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]
    done = export_module(nn.Linear(3, 2), torch.randn(4, 3), fmt, path)  # a model the same for any batch size
    assert done.path == path and path.stat().st_size > 100
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]


@pytest.mark.parametrize("fmt", ["torch-export", pytest.param("onnx", marks=needs_onnx)])
def test_two_exports_to_one_out_at_once_keep_to_their_own_files(fmt, tmp_path, monkeypatch):
    """A second export to the same --out runs whole while the first's file is written but not yet
    checked (one refused, one that succeeds): each writes, checks and deletes only its own partial
    file, so the first still checks and renames the file it wrote, and nothing partial is left.
    (With one `NAME.partial.onnx` for both, the second's start deleted the first's file.)"""
    import smlt.exporter as exporter

    path = tmp_path / ("m.onnx" if fmt == "onnx" else "m.pt2")
    inner = "_label" if fmt == "onnx" else "_program"
    real = getattr(exporter, inner)
    seen: list[list[str]] = []

    def meanwhile(*args, **kwargs):
        out = real(*args, **kwargs)
        if not seen:  # the first export's own file exists now (ONNX: saved; torch-export: made)
            seen.append(sorted(p.name for p in tmp_path.iterdir()))
            with pytest.raises(ExportFailed, match="on a batch of 1 row"):
                export_module(OneRowOtherwise(), torch.randn(4, 3), fmt, path)
            second = export_module(nn.Linear(3, 2), torch.randn(4, 3), fmt, path)
            seen.append(sorted(p.name for p in tmp_path.iterdir()))
            assert second.path == path
        return out

    monkeypatch.setattr(exporter, inner, meanwhile)
    torch.manual_seed(0)
    first = nn.Sequential(nn.Linear(3, 5), nn.ReLU(), nn.Linear(5, 2))
    done = export_module(first, torch.randn(4, 3), fmt, path)
    (partial,) = seen[0]  # the first export's file, named for its process and itself
    assert partial.startswith(f"m.partial-{os.getpid()}-") and partial.endswith(path.suffix)
    assert len(seen[1]) == 2 and partial in seen[1] and path.name in seen[1]  # the second's renamed, the first's kept
    assert done.max_abs_diff <= TOLERANCE
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]  # the first's, renamed last
    assert path.stat().st_mode & 0o777 == 0o666 & ~_umask()  # as any file the user writes


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@pytest.mark.parametrize("fmt", ["torch-export", pytest.param("onnx", marks=needs_onnx)])
def test_a_ctrl_c_during_an_export_leaves_no_partial_file(fmt, tmp_path, monkeypatch):
    import smlt.exporter as exporter

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(exporter, "_label" if fmt == "onnx" else "_program", interrupted)
    path = tmp_path / ("m.onnx" if fmt == "onnx" else "m.pt2")
    with pytest.raises(KeyboardInterrupt):
        export_module(nn.Linear(3, 2), torch.randn(4, 3), fmt, path)
    assert list(tmp_path.iterdir()) == []


class ThroughNumPy(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 2)

    def forward(self, x):
        # eager PyTorch runs it (and trains the layers after it)
        a = np.clip(x.detach().numpy(), -1, 1)
        return self.fc(torch.from_numpy(a))


class NumPyOnATensor(nn.Module):
    def forward(self, x):
        # NumPy's own Python (np.clip) calls x.__array__
        return torch.as_tensor(np.clip(x, -1, 1))


@pytest.mark.parametrize("fmt", ["torch-export", pytest.param("onnx", marks=needs_onnx)])
def test_a_forward_through_numpy_names_the_users_line_and_says_to_keep_torch_ops(fmt, tmp_path):
    """A NumPy round trip in forward: the user's line (not torch's nor NumPy's) and what to write
    instead, as for .item(); it was only `RuntimeError: .numpy() is not supported for tensor subclasses`."""
    path = tmp_path / ("m.onnx" if fmt == "onnx" else "m.pt2")
    told = r"NumPy array in its forward .*keep forward in torch ops \(torch\.clamp for np\.clip"
    with pytest.raises(
        ExportFailed, match=r"at test_export\.py:\d+ `a = np\.clip\(x\.detach\(\)\.numpy\(\), -1, 1\)`.*" + told
    ):
        export_module(ThroughNumPy(), torch.randn(4, 3), fmt, path)
    with pytest.raises(
        ExportFailed, match=r"at test_export\.py:\d+ `return torch\.as_tensor\(np\.clip\(x, -1, 1\)\)`.*" + told
    ):
        export_module(NumPyOnATensor(), torch.randn(4, 3), fmt, path)
    assert list(tmp_path.iterdir()) == []

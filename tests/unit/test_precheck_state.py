"""The client's pre-check (smlt.precheck) on models whose state the workers could not store,
average or load as built: lazy layers, a parameter created in forward, an architecture that
differs from one build to the next. Refused before anything starts, naming the parameter."""

import pytest

from smlt.precheck import check_model
from smlt.runtime.errors import InvalidJob
from smlt.runtime.job import parse_job

STATE = """
import torch
from torch import nn

def lazy(input_shape, output_dim):
    return nn.Sequential(nn.Flatten(), nn.LazyLinear(16), nn.ReLU(), nn.Linear(16, output_dim))

def lazy_run_once(input_shape, output_dim):
    net = lazy(input_shape, output_dim)
    net(torch.zeros(1, *input_shape))  # what the message says to do
    return net

class OnFirstCall(nn.Module):
    def __init__(self, output_dim):
        super().__init__()
        self.o, self.w, self.b = output_dim, None, nn.Parameter(torch.zeros(output_dim))

    def forward(self, x):
        if self.w is None:
            self.w = nn.Parameter(torch.zeros(x.shape[1], self.o))
        return x @ self.w + self.b

def on_first_call(input_shape, output_dim):
    return OnFirstCall(output_dim)

BUILDS = [0]

def each_build_wider(input_shape, output_dim):
    BUILDS[0] += 1
    h = 16 * BUILDS[0]
    return nn.Sequential(nn.Linear(64, h), nn.ReLU(), nn.Linear(h, output_dim))
"""


@pytest.fixture
def code(user_package):
    return user_package("statenets", nets=STATE)


def job(name):
    return parse_job({"dataset": {"uri": "unused"}, "model": {"name": f"statenets.nets:{name}"}})


def test_lazy_layers_are_refused_naming_them(digits, code):
    """It ended in a traceback of the check itself (torch.equal on an UninitializedParameter)."""
    with pytest.raises(InvalidJob) as e:
        check_model(job("lazy"), digits, code)
    assert str(e.value).startswith(
        "model.name: 'statenets.nets:lazy' holds lazy layers whose weights have no shape until a first forward pass "
        "(1.weight, 1.bias): smlt stores and averages the model as the builder returns it"
    )
    check_model(job("lazy_run_once"), digits, code)  # the way out it names works


def test_a_parameter_created_in_forward_is_refused_naming_it(digits, code):
    """It passed (the check's training step saw the parameter), and every worker then failed with
    "has no parameters" or, beside another parameter, on a missing key when sending its update."""
    with pytest.raises(InvalidJob) as e:
        check_model(job("on_first_call"), digits, code)
    assert str(e.value).startswith(
        "model.name: 'statenets.nets:on_first_call' changes its state in its forward pass "
        "(an extra 'w' of shape (64, 10) after a first call)"
    )


def test_an_architecture_that_differs_between_builds_is_refused(digits, code):
    """A warning about weights, then each worker's model 0 failed to load as InvalidDataset "the
    model does not match the dataset"."""
    with pytest.raises(InvalidJob) as e:
        check_model(job("each_build_wider"), digits, code)
    assert str(e.value).startswith(
        "model.name: 'statenets.nets:each_build_wider' builds another architecture each time with the same params "
        "('0.weight' of shape (32, 64), not (16, 64) on a second build)"
    )


GLOBAL = """
import torch
from torch import nn

class SetsDefaults(nn.Module):
    def __init__(self, output_dim):
        super().__init__()
        self.l = nn.Linear(64, output_dim)

    def forward(self, x):
        torch.set_default_dtype(torch.float64)
        return self.l(x)

def sets_defaults(input_shape, output_dim):
    return SetsDefaults(output_dim)
"""


def test_torch_settings_changed_by_the_model_are_set_back_and_told(digits, code, caplog):
    """The caller's process kept float64 as torch's default dtype after the check, and the second
    build's float64 weights were told as "builds different weights each time with the same seed"."""
    import torch

    (code / "glob.py").write_text(GLOBAL)
    raw = {"dataset": {"uri": "unused"}, "model": {"name": "statenets.glob:sets_defaults"}}
    with caplog.at_level("WARNING", logger="smlt.notice"):
        check_model(parse_job(raw), digits, code)
    assert torch.get_default_dtype() == torch.float32
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1, said
    assert said[0].startswith(
        "model.name: 'statenets.glob:sets_defaults' changes torch's settings for the whole process "
        "(torch.set_default_dtype(torch.float64), in its builder, forward or transform): the workers set them back"
    )


IN_PLACE = """
from pathlib import Path

def doubles_in_place(x):
    with open(Path(__file__).parent / "seen.txt", "a") as f:
        f.write(repr(float(x.abs().sum())) + "\\n")
    x.mul_(2)
    return x
"""


def test_a_transform_that_changes_its_sample_in_place_leaves_the_checks_samples(digits, code):
    """The check's stored rows were changed by it: its next calls (the training step) saw the
    first samples doubled. A worker's batches are copies of the stored rows (the loader's)."""
    (code / "inplace.py").write_text(IN_PLACE)
    raw = {
        "dataset": {"uri": "unused"},
        "model": {"name": "statenets.nets:lazy_run_once"},
        "code": {"transform": "statenets.inplace:doubles_in_place"},
    }
    check_model(parse_job(raw), digits, code)
    seen = [float(v) for v in (code / "seen.txt").read_text().split()]
    assert len(seen) >= 3 and seen[2] == seen[0], seen  # the first sample again, as stored


COUNTS = """
import torch
from torch import nn

class Counts(nn.Module):
    def __init__(self, output_dim, persistent):
        super().__init__()
        self.l = nn.Linear(64, output_dim)
        self.register_buffer("seen", torch.zeros(()), persistent=persistent)
        self.register_buffer("scale", torch.ones(64), persistent=False)  # never changed: fine

    def forward(self, x):
        if self.training:
            self.seen += len(x)
        return self.l(x * self.scale)

def counts(input_shape, output_dim, persistent=False):
    return Counts(output_dim, persistent)
"""


def test_a_non_persistent_buffer_that_training_changes_is_told(digits, code, caplog):
    """It trained silently: the workers neither average nor store it, so the published model kept
    the builder's value."""
    (code / "counts.py").write_text(COUNTS)

    def said(persistent):
        caplog.clear()
        raw = {
            "dataset": {"uri": "unused"},
            "model": {"name": "statenets.counts:counts", "params": {"persistent": persistent}},
        }
        with caplog.at_level("WARNING", logger="smlt.notice"):
            check_model(parse_job(raw), digits, code)
        return [r.getMessage() for r in caplog.records]

    (warning,) = said(False)
    assert warning.startswith(
        "model.name: 'statenets.counts:counts' changes its non-persistent buffer 'seen' while it trains"
    )
    assert said(True) == []

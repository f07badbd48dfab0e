"""A user's model whose state is unusual: tied weights (one parameter under two names), an
architecture that differs between builds, lazily shaped layers, global torch settings changed in
forward. Each reaches a worker without the client's check (`aws stepfunctions start-execution`):
it trains, or it fails naming the user's code, never the dataset's shards. On moto."""

import pytest
import torch
from torch import nn

from lambdas.aggregate.handler import handler as aggregate
from lambdas.planner.handler import handler as planner
from lambdas.train_step.handler import handler as train_step
from smlt.runtime import keys
from smlt.runtime.errors import UserCodeError
from smlt.runtime.items import ErrorItem
from smlt.runtime.records import RunTable
from smlt.runtime.tensors.torch_state import bytes_to_state
from tests.functional.handlers.conftest import job

HERE = "tests.functional.handlers.test_user_model_state"


class Tied(nn.Module):
    """Two heads sharing one weight: its state_dict holds that tensor under two names."""

    def __init__(self, output_dim):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(64, 16), nn.Linear(16, output_dim), nn.Linear(16, output_dim)
        self.c.weight = self.b.weight

    def forward(self, x):
        h = torch.relu(self.a(x))
        return self.b(h) + self.c(h)


def tied(input_shape, output_dim):
    return Tied(output_dim)


_BUILDS = [0]


def each_build_wider(input_shape, output_dim):
    _BUILDS[0] += 1
    h = 16 * _BUILDS[0]
    return nn.Sequential(nn.Linear(64, h), nn.ReLU(), nn.Linear(h, output_dim))


class OnFirstCall(nn.Module):
    """A parameter created on the first forward call, beside one made in __init__."""

    def __init__(self, output_dim):
        super().__init__()
        self.o, self.w, self.b = output_dim, None, nn.Parameter(torch.zeros(output_dim))

    def forward(self, x):
        if self.w is None:
            self.w = nn.Parameter(torch.zeros(x.shape[1], self.o))
        return x @ self.w + self.b


def on_first_call(input_shape, output_dim):
    return OnFirstCall(output_dim)


def _plan(digits, run, model, **training):
    j = {
        **job(digits, max_rounds=2, target_value=None, local_steps=2, **training),
        "model": {"name": f"{HERE}:{model}"},
    }
    planner({"op": "plan", "job": j, "execution": run}, None)


def _model(aws, run, rnd):
    blob = aws.get_object(Bucket="smlt-artifacts", Key=f"runs/{run}/rounds/{rnd:06d}/model.safetensors")["Body"]
    return bytes_to_state(blob.read())


def test_tied_weights_are_stored_under_each_name_and_stay_tied(digits, aws):
    """safetensors refused the shared tensor ("Some tensors share memory"), and the worker's error,
    its first line empty, was recorded against the train shard: a DataError blaming the data."""
    _plan(digits, "tied", "tied")
    for w in range(4):
        train_step({"run_id": "tied", "round": 0, "worker": w}, None)
    assert "reason" in aggregate({"run_id": "tied", "round": 0}, None)
    m0, m1 = _model(aws, "tied", 0), _model(aws, "tied", 1)
    assert torch.equal(m0["b.weight"], m0["c.weight"])
    assert not torch.equal(m0["b.weight"], m1["b.weight"])  # trained
    assert torch.equal(m1["b.weight"], m1["c.weight"])  # averaged alike: still one weight
    net = tied((64,), 10)
    net.load_state_dict(m1)
    assert net.b.weight is net.c.weight and torch.equal(net.b.weight, m1["b.weight"])


def _fatal(run):
    return RunTable("smlt-runs", run).get_many(keys.FATAL).item(keys.FATAL, ErrorItem)


def test_a_builder_that_builds_another_architecture_is_the_users_code(digits, aws):
    """Model 0 failed to load as InvalidDataset "the model does not match the dataset (samples of
    shape [64], 10 outputs): Error(s) in loading state_dict for Sequential:"."""
    _plan(digits, "wider", "each_build_wider")
    train_step({"run_id": "wider", "round": 0, "worker": 0}, None)  # builds 16 wide and stores model 0
    with pytest.raises(UserCodeError) as e:
        train_step({"run_id": "wider", "round": 0, "worker": 1}, None)  # builds 32 wide
    assert str(e.value).startswith(
        f"model.name '{HERE}:each_build_wider' built '0.weight' of shape (32, 64), not (16, 64), unlike the run's "
        "stored model 0, so this worker's model cannot take the run's weights: its builder builds another "
        "architecture from one call to the next"
    )
    assert _fatal("wider") is not None


def test_a_parameter_created_in_forward_is_the_users_code(digits, aws):
    """The first worker of a process creates it measuring its step, before model 0 is stored; a
    warm worker (its step measured already) built the model without it and failed to load model 0
    as InvalidDataset "the model does not match the dataset"."""
    _plan(digits, "lazyw", "on_first_call")
    train_step({"run_id": "lazyw", "round": 0, "worker": 0}, None)
    with pytest.raises(UserCodeError) as e:
        train_step({"run_id": "lazyw", "round": 0, "worker": 1}, None)
    assert str(e.value).startswith(
        f"model.name '{HERE}:on_first_call' built no 'w' (of shape (64, 10)), unlike the run's stored model 0"
    )
    assert "or its forward pass adds parameters on a first call" in str(e.value)
    assert _fatal("lazyw") is not None


class SetsDefaults(nn.Module):
    """Changes torch's default dtype for the whole process in its forward pass."""

    def __init__(self, output_dim):
        super().__init__()
        self.l = nn.Linear(64, output_dim)

    def forward(self, x):
        torch.set_default_dtype(torch.float64)
        return self.l(x)


def sets_defaults(input_shape, output_dim):
    return SetsDefaults(output_dim)


def test_a_forward_that_sets_torchs_default_dtype_does_not_reach_the_next_call(digits, aws):
    """Round 1 in the same process (a warm container) built float64 weights and failed: "your code
    raised RuntimeError: mat1 and mat2 must have the same dtype, but got Float and Double"; so would
    a later run's built-in model."""
    try:
        for rnd in (0, 1):
            _plan(digits, "f64", "sets_defaults")
            for w in range(4):
                train_step({"run_id": "f64", "round": rnd, "worker": w}, None)
            assert "reason" in aggregate({"run_id": "f64", "round": rnd}, None)
        assert _model(aws, "f64", 2)["l.weight"].dtype == torch.float32
    finally:
        torch.set_default_dtype(torch.float32)


_SEEN: list[float] = []


def doubles_in_place(x):
    _SEEN.append(float(x.abs().max()))
    x.mul_(2)
    return x


def linear(input_shape, output_dim):
    return nn.Linear(64, output_dim)


def test_a_transform_that_changes_its_sample_in_place_does_not_compound(digits, aws):
    """Measured: a worker's training batches are copies of the stored rows, so a sample seen again
    (here each is, within the round) is seen as stored, not doubled again."""
    _SEEN.clear()  # this test's calls only (a rerun in the same process)
    j = {**job(digits, max_rounds=2, target_value=None, local_steps=40), "model": {"name": f"{HERE}:linear"}}
    j["code"] = {"transform": f"{HERE}:doubles_in_place"}
    planner({"op": "plan", "job": j, "execution": "inplace"}, None)
    train_step({"run_id": "inplace", "round": 0, "worker": 0}, None)
    stored = max(float(abs(x).max()) for x in _stored_rows(aws, digits))
    assert len(_SEEN) == 40 * 32 and max(_SEEN) <= stored + 1e-4


def _stored_rows(aws, uri):
    import json

    from safetensors.numpy import load

    bucket, _, prefix = uri.removeprefix("s3://").partition("/")
    manifest = json.loads(aws.get_object(Bucket=bucket, Key=f"{prefix.rstrip('/')}/manifest.json")["Body"].read())
    for shard in manifest["train"]["shards"]:
        key = f"{prefix.rstrip('/')}/{shard['key'] if 'key' in shard else shard['path']}"
        yield load(aws.get_object(Bucket=bucket, Key=key)["Body"].read())["x"]


_KEPT: list[torch.Tensor] = []


class Keeps(nn.Module):
    """Appends 4 MB to a module-level list on each forward call, as a leak does."""

    def __init__(self, output_dim, leak):
        super().__init__()
        self.l, self.leak = nn.Linear(64, output_dim), leak

    def forward(self, x):
        if self.leak:
            _KEPT.append(torch.ones(1 << 20))
        return self.l(x)


def keeps(input_shape, output_dim, leak=True):
    return Keeps(output_dim, leak)


@pytest.fixture
def small_leak_share(monkeypatch):
    from smlt.runtime.train import leak

    monkeypatch.setattr(leak, "LEAK_SHARE", 0.1)  # 177 MB of the 1769 MB tier: a small test
    monkeypatch.setattr(leak, "_history", [])
    yield
    _KEPT.clear()


def test_memory_kept_between_calls_is_named_before_the_worker_runs_out(digits, aws, small_leak_share):
    """A warm container ran out of memory at some round N, and the planner, told "OutOfMemory",
    moved the run to a larger tier (more spend), never naming the user's leak. Each worker
    invocation here grows the process by ~84 MB (21 forward calls)."""
    j = {**job(digits, max_rounds=2, target_value=None), "model": {"name": f"{HERE}:keeps"}}
    planner({"op": "plan", "job": j, "execution": "leak"}, None)
    for w in range(3):
        train_step({"run_id": "leak", "round": 0, "worker": w}, None)
    with pytest.raises(UserCodeError) as e:
        train_step({"run_id": "leak", "round": 0, "worker": 3}, None)
    assert str(e.value).startswith(f"model.name '{HERE}:keeps': this worker's process grew by ")
    assert "a module-level list or dict that tensors are appended to" in str(e.value)
    assert _fatal("leak") is not None


def test_a_model_that_keeps_nothing_is_not_told(digits, aws, small_leak_share):
    j = {**job(digits, max_rounds=3, target_value=None), "model": {"name": f"{HERE}:keeps", "params": {"leak": False}}}
    for rnd in (0, 1):
        planner({"op": "plan", "job": j, "execution": "noleak"}, None)
        for w in range(4):
            train_step({"run_id": "noleak", "round": rnd, "worker": w}, None)
        assert "reason" in aggregate({"run_id": "noleak", "round": rnd}, None)

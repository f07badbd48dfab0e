"""A user's model whose state is unusual: tied weights (one parameter under two names), an
architecture that differs between builds, lazily shaped layers, global torch settings changed in
forward. Each reaches a worker without the client's check (`aws stepfunctions start-execution`):
it trains, or it fails naming the user's code, never the dataset's shards. On moto."""

import torch
from torch import nn

from lambdas.aggregate.handler import handler as aggregate
from lambdas.planner.handler import handler as planner
from lambdas.train_step.handler import handler as train_step
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

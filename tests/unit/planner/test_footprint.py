"""The first plan's footprint of a built-in model (smlt.runtime.planner.footprint) is what round 0's
workers would measure: the parameters of the built model and PyTorch's FLOP counter."""

from __future__ import annotations

import pytest
import torch

from smlt.runtime.job import ModelSpec
from smlt.runtime.planner.footprint import model_cost
from smlt.runtime.train.measure import measure
from smlt.runtime.train.models import build_model
from smlt.sim.run import history_of
from smlt.sim.workloads import WORKLOADS

CASES = [
    ("mlp", {}, (64,), 10, None),
    ("mlp", {"hidden": 32}, (3, 4, 4), 2, None),
    ("logreg", {}, (20,), 3, None),
    ("lenet", {}, (1, 8, 8), 10, None),
    ("lenet", {"channels": [4, 8], "hidden": [32]}, (1, 28, 28), 10, None),
    ("lenet", {}, (3, 32, 32), 10, None),
    ("resnet18", {}, (3, 8, 8), 10, None),
    ("resnet18", {}, (1, 66, 70), 5, None),  # the ImageNet stem: 7x7 stride 2 and a max-pool
    ("resnet34", {"small_input": True}, (3, 12, 12), 10, None),
    ("resnet50", {}, (3, 8, 8), 100, None),
    ("transformer", {}, (32,), 4, 1000),
    ("transformer", {"d_model": 32, "heads": 2, "layers": 1, "ff": 64}, (16,), 3, 50),
]


def _measured(name, params, shape, outputs, vocab):
    model = build_model(ModelSpec(name=name, params=params), shape, outputs, seed=0, vocab_size=vocab)
    x = torch.randint(0, vocab, (2, *shape)) if vocab else torch.zeros((2, *shape))
    fp = measure(model, x, torch.zeros(2, dtype=torch.long), torch.nn.functional.cross_entropy)
    return sum(p.numel() for p in model.parameters()), fp.flops_per_sample


@pytest.mark.parametrize("name, params, shape, outputs, vocab", CASES)
def test_every_builtin_matches_what_the_workers_measure(name, params, shape, outputs, vocab):
    n_params, flops = _measured(name, params, shape, outputs, vocab)
    cost = model_cost(ModelSpec(name=name, params=params), shape, outputs, vocab)
    assert cost is not None
    assert (cost.params, cost.flops_per_sample) == (n_params, flops)


def test_what_it_cannot_know_is_none():
    assert model_cost(ModelSpec(name="mypkg.models:build"), (64,), 10) is None  # a user's model
    assert model_cost(ModelSpec(name="resnet18"), (64,), 10) is None  # not an image
    assert model_cost(ModelSpec(name="transformer"), (32,), 4) is None  # no vocabulary
    assert model_cost(ModelSpec(name="mlp", params={"width": 3}), (64,), 10) is None  # the builder refuses it


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_the_simulated_first_plan_reads_the_recorded_models_footprint(name):
    """The simulator's first plan reads what the Plan step computes for the job's model: for the
    recorded workloads, exactly what their recordings measured; a job naming another model, none."""
    w = WORKLOADS[name]
    h = history_of(w, give_flops=False, model=w.model)
    assert (h.param_count, h.flops_per_sample) == (w.params, w.flops_per_sample)
    other = history_of(w, give_flops=False, model=ModelSpec(name="logreg"))
    assert (other.param_count, other.flops_per_sample) == (0, None)

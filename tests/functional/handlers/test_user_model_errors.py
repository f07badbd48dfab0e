"""A user's model that fails inside torch, with no frame in the user's files (a `nn.Sequential` of
torch's layers), reaching a worker without the client's check (`aws stepfunctions
start-execution`, the console): the worker names it as the user's code, once, not as a shard's
data after a retry. On moto."""

import pytest
import torch
from torch import nn

from lambdas.aggregate.handler import handler as aggregate
from lambdas.planner.handler import handler as planner
from lambdas.train_step.handler import handler as train_step
from smlt.runtime import keys
from smlt.runtime.errors import Diverged, InvalidJob, UserCodeError
from smlt.runtime.items import ErrorItem
from smlt.runtime.records import RunTable
from tests.functional.handlers.conftest import job

HERE = "tests.functional.handlers.test_user_model_errors"


def bn(input_shape, output_dim):
    return nn.Sequential(nn.Linear(64, 16), nn.BatchNorm1d(16), nn.Linear(16, output_dim))


def frozen(input_shape, output_dim):
    return nn.Linear(64, output_dim).requires_grad_(False)


class LogScale(nn.Module):
    """NaN once training drives its scale negative: a log of a parameter, whatever the learning rate."""

    def __init__(self, output_dim):
        super().__init__()
        self.l, self.s = nn.Linear(64, output_dim), nn.Parameter(torch.tensor(-1.0))

    def forward(self, x):
        return self.l(x) + torch.log(self.s)


def log_scale(input_shape, output_dim):
    return LogScale(output_dim)


class Column(nn.Module):
    """One column of its logits for a batch of 32 rows (the client's check saw (rows, 10) on 2 and 1)."""

    def __init__(self, output_dim):
        super().__init__()
        self.l = nn.Linear(64, output_dim)

    def forward(self, x):
        out = self.l(x)
        return out[:, 0] if len(x) == 32 else out


def column(input_shape, output_dim):
    return Column(output_dim)


_SEEN = [0]


def crop_some(x):
    """Drops a sample's last feature from its 6th call on (the client's check sees the first few)."""
    _SEEN[0] += 1
    return x[:-1] if _SEEN[0] > 5 else x


def _plan(digits, run, model, transform=None, **training):
    j = {**job(digits, max_rounds=2, target_value=None, **training), "model": {"name": f"{HERE}:{model}"}}
    if transform:
        j["code"] = {"transform": f"{HERE}:{transform}"}
    planner({"op": "plan", "job": j, "execution": run}, None)


def test_batch_norm_on_a_batch_of_one_fails_as_the_users_code_not_the_data(digits, aws):
    _plan(digits, "bn1", "bn", batch_size=1)
    with pytest.raises(UserCodeError) as e:
        train_step({"run_id": "bn1", "round": 0, "worker": 0}, None)
    text = str(e.value)
    assert text.startswith("your code raised ValueError: Expected more than 1 value per channel when training")
    assert f"raised inside torch by model.name '{HERE}:bn': no frame of it is in your files" in text
    assert "(batch norm needs 2 or more rows per training batch: set training.batch_size to at least 2)" in text
    table = RunTable("smlt-runs", "bn1")
    assert table.errors(0)[0].error == "UserCodeError"
    fatal = table.get_many(keys.FATAL).item(keys.FATAL, ErrorItem)
    assert fatal is not None and fatal.exception == "ValueError"


def test_a_model_with_every_parameter_frozen_is_named(digits, aws):
    _plan(digits, "frozen", "frozen")
    with pytest.raises(InvalidJob, match=r"has 650 parameters and every one is frozen \(requires_grad=False\)"):
        train_step({"run_id": "frozen", "round": 0, "worker": 0}, None)
    assert RunTable("smlt-runs", "frozen").errors(0)[0].error == "InvalidJob"


def test_a_users_model_that_diverges_twice_is_named_beside_the_learning_rate(digits, aws):
    """It said only "lower training.learning_rate" (and the CLI offered a resume, which diverges again)."""
    for rnd in (0, 1):
        _plan(digits, "nan", "log_scale", local_steps=2)
        for w in range(4):
            train_step({"run_id": "nan", "round": rnd, "worker": w}, None)
        if rnd == 0:
            assert "diverged" in aggregate({"run_id": "nan", "round": 0}, None)["reason"]
    with pytest.raises(Diverged) as e:
        aggregate({"run_id": "nan", "round": 1}, None)
    assert str(e.value).endswith(
        f"again after halving the learning rate to 0.025; lower training.learning_rate, or make model.name "
        f"'{HERE}:log_scale' finite for any weights training gives it (a log or sqrt of a parameter gone negative, "
        "a division by one gone to zero gives NaN whatever the learning rate)"
    ), str(e.value)


def test_outputs_of_another_shape_mid_run_are_the_users_code_not_the_shards(digits, aws):
    """The loss failed on them as a WorkerError against the train shard, retried 3 times, and the run
    ended in QuorumNotReached with torch's "Expected floating point type for target with class
    probabilities, got Long", offering a resume."""
    _plan(digits, "col", "column")
    with pytest.raises(UserCodeError) as e:
        train_step({"run_id": "col", "round": 0, "worker": 0}, None)
    assert str(e.value).startswith(
        f"model.name '{HERE}:column' gave outputs of shape (32,) for a training batch of 32 rows; smlt needs "
        "(32, 10): one output per class and sample (the client's check got (rows, 10) from it"
    )
    table = RunTable("smlt-runs", "col")
    assert table.errors(0)[0].error == "UserCodeError"
    assert table.get_many(keys.FATAL).item(keys.FATAL, ErrorItem) is not None
    with pytest.raises(UserCodeError, match=r"^worker 0, round 0: model.name .* gave outputs of shape \(32,\)"):
        aggregate({"run_id": "col", "round": 0}, None)


def test_a_transform_that_changes_some_samples_only_is_the_users_code(digits, aws):
    """torch.stack's error was a WorkerError against the train shard, retried, then a DataError
    blaming the shard's data."""
    _plan(digits, "crop", "bn", transform="crop_some")
    with pytest.raises(UserCodeError) as e:
        train_step({"run_id": "crop", "round": 0, "worker": 0}, None)
    assert str(e.value).startswith(
        f"code.transform '{HERE}:crop_some' turned a training sample of shape (64,) (float32) into (63,) (float32); "
        "it must keep each sample's shape and dtype"
    )
    assert RunTable("smlt-runs", "crop").get_many(keys.FATAL).item(keys.FATAL, ErrorItem) is not None


def test_a_users_error_recorded_after_its_round_closed_ends_the_run_at_the_next_round(digits, aws):
    """A hung worker that the Map stopped waiting for records its UserCodeError late (its watchdog
    stopped the step after the round was aggregated without it): the next round's workers read
    FATAL and stop, and that round's aggregation fails the run with the error. It found no error
    of its own round and answered a quorum retry, until QuorumNotReached."""
    from smlt.runtime.errors import StaleInvocation
    from smlt.runtime.steps.events import TrainEvent
    from smlt.runtime.steps.train import _record_user_error

    j = {**job(digits, max_rounds=4, target_value=None, local_steps=2), "model": {"name": "mlp"}}
    for rnd in (0, 1):
        planner({"op": "plan", "job": j, "execution": "late"}, None)
        for w in range(4) if rnd == 0 else (1, 2, 3):  # round 1's worker 0 hangs
            train_step({"run_id": "late", "round": rnd, "worker": w}, None)
        assert "reason" in aggregate({"run_id": "late", "round": rnd}, None)  # 3 of 4: the round goes on
    hung = UserCodeError("your code hung: a training step's transform, forward and backward of model.name ...")
    _record_user_error(RunTable("smlt-runs", "late"), TrainEvent(run_id="late", round=1, worker=0), hung)
    planner({"op": "plan", "job": j, "execution": "late"}, None)
    for w in range(4):
        with pytest.raises(StaleInvocation, match="worker 0 of round 1 hit a UserCodeError"):
            train_step({"run_id": "late", "round": 2, "worker": w}, None)
    with pytest.raises(UserCodeError, match=r"^worker 0, round 1: your code hung"):
        aggregate({"run_id": "late", "round": 2}, None)


def test_a_users_error_recorded_in_the_last_round_fails_finalize(digits, aws):
    """A hung worker's UserCodeError recorded after the last round's workers started (they read no
    FATAL) and its aggregation (every worker of that round reported: no FATAL read): Finalize reads
    it and the run fails with it, META not SUCCEEDED. It used to succeed, exit 0."""
    from smlt.runtime.steps.events import TrainEvent
    from smlt.runtime.steps.train import _record_user_error

    j = {**job(digits, max_rounds=2, target_value=None, local_steps=2), "model": {"name": "mlp"}}
    for rnd in (0, 1, 2):  # two training rounds, then the evaluation round
        p = planner({"op": "plan", "job": j, "execution": "last"}, None)
        for w in range(1, 4) if rnd == 0 else range(4):  # round 0's worker 0 hangs
            train_step({"run_id": "last", "round": rnd, "worker": w}, None)
        if rnd == 2:  # its watchdog stops it now
            hung = UserCodeError("your code hung: a training step's transform, forward and backward of model.name ...")
            _record_user_error(RunTable("smlt-runs", "last"), TrainEvent(run_id="last", round=0, worker=0), hung)
        aggregate({"run_id": "last", "round": rnd}, None)
    assert planner({"op": "plan", "job": j, "execution": "last"}, None)["action"] == "stop", p
    with pytest.raises(UserCodeError, match=r"^worker 0, round 0: your code hung"):
        planner({"op": "finalize", "run_id": "last"}, None)
    assert RunTable("smlt-runs", "last").meta().status != "SUCCEEDED"  # type: ignore[union-attr]

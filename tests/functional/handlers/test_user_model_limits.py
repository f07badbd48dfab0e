"""A worker of the local engine (SMLT_LAMBDA_LIMITS, set for its handler processes) gives the
user's code what a Lambda gives it: a file written outside /tmp fails with EROFS, a
multiprocessing semaphore with ENOSYS (no /dev/shm). Reaching a worker without the client's
check (a builder that writes only there), the run fails once as the user's code, with the line
and what to do, not as a retried worker. On moto."""

import multiprocessing as mp
import os

import pytest
from torch import nn

from lambdas.planner.handler import handler as planner
from lambdas.train_step.handler import handler as train_step
from smlt.runtime import keys, worker_limits
from smlt.runtime.errors import UserCodeError
from smlt.runtime.items import ErrorItem
from smlt.runtime.records import RunTable
from tests.functional.handlers.conftest import job

HERE = "tests.functional.handlers.test_user_model_limits"


def writes_here(input_shape, output_dim):
    with open("worker_log.txt", "w") as f:  # the current folder: /var/task on a worker
        f.write("built")
    return nn.Linear(64, output_dim)


class Queued(nn.Module):
    def __init__(self, output_dim):
        super().__init__()
        self.l = nn.Linear(64, output_dim)

    def forward(self, x):
        mp.Queue()
        return self.l(x)


def queued(input_shape, output_dim):
    return Queued(output_dim)


@pytest.fixture
def limits(monkeypatch, tmp_path):
    monkeypatch.setenv(worker_limits.LIMITS_ENV, "1")
    monkeypatch.setattr(worker_limits, "_limits", None)  # this process's limits end with the test
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize(
    "model, said, line",
    [
        (
            "writes_here",
            "your code raised OSError: [Errno 30] Read-only file system: 'worker_log.txt' (a worker's file system is "
            "read-only but for /tmp, and its current folder is the image's code folder",
            'with open("worker_log.txt", "w") as f:',
        ),
        (
            "queued",
            "your code raised OSError: [Errno 38] Function not implemented (Lambda has no /dev/shm, so "
            "multiprocessing's Pool, Queue and Lock",
            "mp.Queue()",
        ),
    ],
)
def test_a_lambdas_limits_fail_the_users_code_on_a_local_worker_once(digits, aws, limits, model, said, line):
    run = f"lim-{model.replace('_', '-')}"
    j = {**job(digits, max_rounds=2, target_value=None), "model": {"name": f"{HERE}:{model}"}}
    planner({"op": "plan", "job": j, "execution": run}, None)
    with pytest.raises(UserCodeError) as e:
        train_step({"run_id": run, "round": 0, "worker": 0}, None)
    assert str(e.value).startswith(said), str(e.value)
    assert line in str(e.value)
    assert not os.path.exists(limits / "worker_log.txt")
    fatal = RunTable("smlt-runs", run).get_many(keys.FATAL).item(keys.FATAL, ErrorItem)
    assert fatal is not None and fatal.error == "UserCodeError" and fatal.exception == "OSError"


def test_without_the_limits_a_worker_writes_where_it_runs(digits, aws, monkeypatch, tmp_path):
    """What the local engine did before (its handlers ran in the repository's folder), and a unit test still does."""
    monkeypatch.delenv(worker_limits.LIMITS_ENV, raising=False)
    monkeypatch.setattr(worker_limits, "_limits", None)
    monkeypatch.chdir(tmp_path)
    j = {**job(digits, max_rounds=1, target_value=None), "model": {"name": f"{HERE}:writes_here"}}
    planner({"op": "plan", "job": j, "execution": "nolim"}, None)
    train_step({"run_id": "nolim", "round": 0, "worker": 0}, None)
    assert (tmp_path / "worker_log.txt").read_text() == "built"

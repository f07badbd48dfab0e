"""Every test is marked with its kind, from the folder it lives in (see pyproject's markers):

tests/unit/        pure logic: no emulated AWS, no servers, no synth (`make test-fast`)
tests/functional/  handlers and stores on moto's emulation and a real redis-server
tests/engine/      the local engine: moto's ASL interpreter, the Invoke seam, its patches
tests/e2e/         the synthesized state machine trains real data on the local engine
tests/infra/       the CDK stack: template assertions, cfn-lint, cdk-nag, the CDK CLI
tests/browser/     the dashboard in headless Chromium (Playwright) against the local console
"""

from __future__ import annotations

import os

# One torch (OpenMP) thread per process unless a test or the code sets more (the worker sets its
# tier's, smlt.runtime.capacity.torch_threads): `make test` runs a worker per core, and a second
# thread per worker only spins against the other worker. Set before anything imports torch; the
# processes the tests start inherit it. tests/unit on 2 workers: 201 -> 91 CPU s (the synthetic
# images fit 5.7 -> 1.6 CPU s, the same 0.670 accuracy).
os.environ.setdefault("OMP_NUM_THREADS", "1")

import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from smlt.local import synth_cache
from tests import shared_loader

# One botocore data loader for the test process (tests/shared_loader.py): moto's mock_aws gives
# each test a new boto3 session, which would parse every client's service model again.
# The inproc_moto half of `make test` (-n 2): 261 -> 195 CPU s (bench/experiments/2026-12-07-suite-trim.md).
shared_loader.install()

KINDS = ("unit", "functional", "engine", "e2e", "infra", "browser")
_ROOT = Path(__file__).parent

# Every local engine of the session, and of the processes it starts, reads the app's synth from
# the same cache, the user's (or $SMLT_SYNTH_CACHE's), whatever SMLT_HOME a test sets: unchanged
# code is synthesized once, not once per session or per test's home.
_cache = synth_cache.cache_folder()
if _cache is not None:
    os.environ["SMLT_SYNTH_CACHE"] = str(_cache)


def _mocks_aws_in_process(path: Path, kind: str) -> bool:
    """moto's in-process mock (`mock_aws`) resets the backends that a local engine's server in
    the same process serves: such tests run in a pytest session of their own (`make test`)."""
    return kind == "functional" or "mock_aws" in path.read_text()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    in_process: dict[Path, bool] = {}
    for item in items:
        path = Path(item.fspath).resolve()
        kind = path.relative_to(_ROOT).parts[0]
        if kind not in KINDS:
            raise pytest.UsageError(f"{item.nodeid}: tests live under tests/<kind>/, kind one of {', '.join(KINDS)}")
        item.add_marker(getattr(pytest.mark, kind))
        if in_process.setdefault(path, _mocks_aws_in_process(path, kind)):
            item.add_marker(pytest.mark.inproc_moto)


# moto's patches (smlt.local.patches) are installed by the session fixture `moto_patches` of the
# kinds that use moto in-process (tests/functional, tests/engine); the engine installs them itself.
# Unit tests import no moto (tests/unit/test_no_moto.py).


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):  # type: ignore[no-untyped-def]
    """A unit test that loads moto fails (when it was not loaded before: run alone, -m unit)."""
    before = "moto" in sys.modules
    result = yield
    if item.get_closest_marker("unit") and not before and "moto" in sys.modules:
        raise AssertionError(f"{item.nodeid} imported moto: unit tests import no moto (move it to tests/functional)")
    return result

import os

import pytest

os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")


def job(**kw):
    """An execution input for the fixture state machine (docs in fixture_app.py)."""
    j = {
        "mode": "train",
        "workers": ["ok"],
        "rounds": 1,
        "max_concurrency": 2,
        "tier": "small",
        "spins": 0,
        "defaults": {"a": 1, "b": 1},
        "overrides": {"b": 2},
    }
    j.update(kw)
    return j


@pytest.fixture(scope="session", autouse=True)
def moto_patches() -> list[str]:
    """moto patched as the local engine patches it: the tests that use moto in-process see the
    same moto as the engine's server."""
    from smlt.local import patches

    return patches.install()


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    from smlt.local.engine import LocalEngine

    from .fixture_app import build_app

    with LocalEngine(build_app, outdir=tmp_path_factory.mktemp("cdk") / "cdk.out") as eng:
        yield eng


@pytest.fixture
def faults(engine):
    """Set engine.invoke_filter for one test; always cleared afterwards."""
    yield engine
    engine.invoke_filter = None

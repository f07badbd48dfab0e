"""End-to-end: the synthesized state machine on the local engine, one engine per session."""

import os

import pytest


@pytest.fixture(scope="session")
def local(tmp_path_factory):
    os.environ.setdefault("SMLT_HOME", str(tmp_path_factory.mktemp("smlt-home")))
    from smlt.runner import start_engine

    engine, names, injector = start_engine(None)
    yield engine, names
    engine.stop()

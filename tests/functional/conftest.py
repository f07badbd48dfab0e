"""Functional tests use moto in-process: patched as the local engine's server is."""

import pytest


@pytest.fixture(scope="session", autouse=True)
def moto_patches() -> list[str]:
    from smlt.local import patches

    return patches.install()

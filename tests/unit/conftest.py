"""Fixtures the unit tests of the pre-check share: the digits dataset prepared on disk, and a user's
code package written from its files' text."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from smlt.runtime.data.prepare import prepare_dataset


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    folder = tmp_path_factory.mktemp("digits")
    prepare_dataset("sklearn:digits", str(folder), shards=2)
    return folder


@pytest.fixture
def user_package(tmp_path) -> Callable[..., Path]:
    """`user_package(name, nets=TEXT, ...)`: the package `name` under tmp_path/code, one module per file."""

    def write(name: str, **modules: str) -> Path:
        pkg = tmp_path / "code" / name
        pkg.mkdir(parents=True)
        (pkg / "__init__.py").write_text("")
        for module, text in modules.items():
            (pkg / f"{module}.py").write_text(text)
        return pkg

    return write

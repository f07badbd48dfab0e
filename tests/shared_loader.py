"""One botocore data loader for every botocore session of a test process.

moto's `mock_aws` starts each test with a new boto3 default session (it patches
`boto3.DEFAULT_SESSION` to None), and each new session makes its own loader: every client made
after it parses its service's JSON model and endpoint rules again (~0.04 CPU s a client, a few
clients a test). A Lambda handler's process makes its clients from one session, whose loader
parses each model once; with the loader shared, a test process does the same. The loader only
reads botocore's data files: what a client is made of, and what it sends, are unchanged."""

from __future__ import annotations

import functools
from typing import Any


class _Paths(list[Any]):
    """A loader's search paths: each boto3 session appends boto3's data folder to its loader's;
    on a shared loader that folder is kept once."""

    def append(self, path: Any) -> None:
        if path not in self:
            super().append(path)


def _create_loader(search_path_string: str | None = None) -> Any:
    import botocore.loaders

    loader = botocore.loaders.create_loader(search_path_string)
    loader._search_paths = _Paths(loader.search_paths)  # botocore keeps them there (search_paths is its getter)
    return loader


def install() -> None:
    import botocore.session

    if getattr(botocore.session.create_loader, "shared", False):
        return
    shared = functools.lru_cache(maxsize=None)(_create_loader)
    shared.shared = True  # type: ignore[attr-defined]
    botocore.session.create_loader = shared

"""One botocore data loader for every botocore session of a test process.

moto's `mock_aws` starts each test with a new boto3 default session (it patches
`boto3.DEFAULT_SESSION` to None), and each new session makes its own loader: every client made
after it parses its service's JSON model and endpoint rules again (~0.04 CPU s a client, a few
clients a test). A Lambda handler's process makes its clients from one session, whose loader
parses each model once; with the loader shared, a test process does the same. The loader only
reads botocore's data files: what a client is made of, and what it sends, are unchanged."""

from __future__ import annotations

import functools


def install() -> None:
    import botocore.loaders
    import botocore.session

    if getattr(botocore.session.create_loader, "shared", False):
        return
    shared = functools.lru_cache(maxsize=None)(botocore.loaders.create_loader)
    shared.shared = True  # type: ignore[attr-defined]
    botocore.session.create_loader = shared

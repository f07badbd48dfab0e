"""What the stack deploys, from its one source: cdk.json's context.

The stack reads it (infra/stacks/settings.py) and writes what the functions need into their
environment (smlt.runtime.config); a caller without that environment (tests, the simulators, the
benchmarks) reads the same file here. In a deployed function the file is absent and unused.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

_TOP = Path(__file__).resolve().parents[2]
# The repository's cdk.json, or, installed from a wheel, its copy in infra/project/ (setup.py).
CDK_JSON = next(
    (p for p in (_TOP / "cdk.json", _TOP / "infra" / "project" / "cdk.json") if p.exists()), _TOP / "cdk.json"
)


@cache
def _context_text() -> str:
    if not CDK_JSON.exists():
        raise RuntimeError(
            f"{CDK_JSON} not found: outside the repository the deployment settings come from the "
            "environment the stack writes (SMLT_PRICES, SMLT_PLANNER_MEMORY_MB, ...)"
        )
    return json.dumps(json.loads(CDK_JSON.read_text()).get("context", {}))


def context() -> dict[str, Any]:
    """cdk.json's context, a fresh copy."""
    return dict(json.loads(_context_text()))


def value(key: str) -> Any:
    return context()[key]

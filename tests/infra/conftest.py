"""One synthesized SmltStack per test session (bundling off, as the local engine does)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")

# cdk.json's default tiers: what an account at the default 3,008 MB Lambda memory quota accepts.
DEFAULT_TIERS = (1769, 3008)
NEW_ACCOUNT_MAX_MB = 3008
# The larger tiers docs/deploy.md documents as an option (`-c memory_tiers=[...]`, after a quota raise).
LARGE_TIERS = (1769, 3008, 5120, 10240)

SYNTH_CONTEXT = {"aws:cdk:bundling-stacks": [], "aws:cdk:enable-asset-metadata": True}


@dataclass
class Synth:
    app: Any
    stack: Any
    assembly: Any
    template: dict[str, Any]
    assertions: Any  # aws_cdk.assertions.Template
    outdir: Path
    seconds: float

    def resources(self, type_: str) -> dict[str, dict[str, Any]]:
        return {k: v for k, v in self.template["Resources"].items() if v["Type"] == type_}


def synthesize(outdir: Path, context: dict[str, Any] | None = None) -> Synth:
    from aws_cdk.assertions import Template

    from infra.app import STACK_ID, build_app

    t0 = time.perf_counter()
    app = build_app(outdir=str(outdir), context={**SYNTH_CONTEXT, **(context or {})})
    assembly = app.synth()
    seconds = time.perf_counter() - t0
    stack = app.node.find_child(STACK_ID)
    template = assembly.get_stack_by_name(stack.stack_name).template
    return Synth(app, stack, assembly, template, Template.from_stack(stack), outdir, seconds)


@pytest.fixture(scope="session")
def synth(tmp_path_factory) -> Synth:
    return synthesize(tmp_path_factory.mktemp("cdk-out"))


REDIS_CONTEXT = {"redis_reducer": True}


@pytest.fixture(scope="session")
def redis_synth(tmp_path_factory) -> Synth:
    """The stack with the Redis reducer (ElastiCache exchange in a VPC), synthesized once."""
    return synthesize(tmp_path_factory.mktemp("cdk-out-redis"), REDIS_CONTEXT)

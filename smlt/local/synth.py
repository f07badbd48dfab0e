"""In-process ``cdk synth``: build the CDK app, synthesize it to a cloud assembly, read the one
stack's template and the asset directories CDK staged for its Lambda functions.

No Docker runs: ``aws:cdk:bundling-stacks = []`` turns bundling off and container-image assets are
only *staged* (their directory is copied into the assembly). ``aws:cdk:enable-asset-metadata``
makes CDK write ``aws:asset:path`` on every resource that has an asset, which is how the engine
finds a zip function's code.

A template with resources the engine cannot stand in for (``resolve.LOCAL_UNSUPPORTED``: the
ElastiCache exchange of CDK context ``redis_reducer: true``) is refused right after the synth with
a :class:`SynthError` saying what to do instead, before anything else starts.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .resolve import unsupported_resources

# jsii prints a multi-line end-of-life banner for Node 20 when its kernel starts; silence it
# unless the user chose otherwise. Harmless when aws_cdk was imported earlier.
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")

SYNTH_CONTEXT: dict[str, Any] = {
    "aws:cdk:bundling-stacks": [],
    "aws:cdk:enable-asset-metadata": True,
}


class SynthError(RuntimeError):
    """The CDK app did not synthesize to exactly what the local engine can run."""


@dataclass(frozen=True)
class Synthesized:
    """The result of :func:`synthesize`."""

    stack_name: str
    template: dict[str, Any]
    assembly_dir: Path
    template_path: Path
    # logical id of a resource with an asset -> absolute path of its staged asset directory
    asset_paths: dict[str, Path] = field(default_factory=dict)
    seconds: float = 0.0
    cached: bool = False  # read from the synth cache (smlt/local/synth_cache.py), not synthesized now


def asset_paths(template: dict[str, Any], assembly_dir: Path) -> dict[str, Path]:
    """logical id -> asset directory of every resource with ``aws:asset:path`` metadata (a
    relative path is the assembly's staged copy)."""
    assets: dict[str, Path] = {}
    for lid, res in template.get("Resources", {}).items():
        p = (res.get("Metadata") or {}).get("aws:asset:path")
        if p:
            path = Path(p)
            assets[lid] = path if path.is_absolute() else (assembly_dir / path)
    return assets


def synthesize(
    build_app: Callable[..., Any],
    outdir: str | os.PathLike[str],
    *,
    context: dict[str, Any] | None = None,
    stack: str | None = None,
) -> Synthesized:
    """Build the app with ``build_app(outdir=..., context=...)``, synthesize it into ``outdir``
    and return the stack's template, the assembly directory and the staged asset paths.

    ``context`` is merged over :data:`SYNTH_CONTEXT`. The app must contain exactly one stack
    unless ``stack`` names the one to use.
    """
    t0 = time.perf_counter()
    outdir = Path(outdir).resolve()
    outdir.mkdir(parents=True, exist_ok=True)
    ctx = {**SYNTH_CONTEXT, **(context or {})}
    app = build_app(outdir=str(outdir), context=ctx)
    assembly = app.synth()
    stacks = list(assembly.stacks)
    if stack is not None:
        stacks = [s for s in stacks if stack in (s.stack_name, s.id)]
    if len(stacks) != 1:
        names = [s.stack_name for s in assembly.stacks]
        raise SynthError(
            f"the local engine runs exactly one stack; the app has {names}"
            + (f" (asked for {stack!r})" if stack else "")
        )
    st = stacks[0]
    problems = unsupported_resources(st.template)
    if problems:
        raise SynthError(f"stack {st.stack_name} cannot run on the local engine: " + "; ".join(problems))
    assembly_dir = Path(assembly.directory).resolve()
    return Synthesized(
        stack_name=st.stack_name,
        template=st.template,
        assembly_dir=assembly_dir,
        template_path=Path(st.template_full_path).resolve(),
        asset_paths=asset_paths(st.template, assembly_dir),
        seconds=time.perf_counter() - t0,
    )

"""How to run each Lambda function of the stack locally.

- zip function (``Handler`` "module.function"): the module file is looked up in the staged asset
  directory (``aws:asset:path``); the directory goes on ``sys.path`` like ``/var/task`` does.
- image function: ``ImageConfig.Command[0]`` (or the Dockerfile's ``CMD``) is a dotted
  "package.module.function" path, looked up under the project root (the image's build context
  is the repository, so the same path resolves there).

Handler modules are always loaded from their file under a unique module name per function, so two
functions whose code is the same file get separate module instances (like separate containers),
and a top-level package that shadows the path (site-packages ships a ``tests`` package, for one)
cannot hide a handler.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .resolve import FUNCTION, Resolver

DEFAULT_TIMEOUT = 3  # seconds, Lambda's default
DEFAULT_MEMORY = 128  # MB


@dataclass(frozen=True)
class FunctionSpec:
    logical_id: str
    name: str
    arn: str
    kind: str  # "zip" | "image" | "unsupported"
    handler: str  # the handler string as written in the template
    module_file: str | None = None  # absolute path of the handler's module file
    attr: str | None = None  # function name inside the module
    package: str | None = None  # dotted parent package (relative imports), image functions
    code_dir: str | None = None  # put on sys.path of the worker (zip: the asset dir)
    env: dict[str, str] = field(default_factory=dict)  # resolved Environment.Variables
    timeout: int = DEFAULT_TIMEOUT
    memory: int = DEFAULT_MEMORY
    runtime: str | None = None  # zip: the template's Runtime; image: None (the image decides)
    problem: str | None = None  # why it cannot run locally (kind == "unsupported")


def _find_module(base: Path, dotted: str) -> Path | None:
    rel = Path(*dotted.split("."))
    for cand in (base / rel.with_suffix(".py"), base / rel / "__init__.py"):
        if cand.is_file():
            return cand.resolve()
    return None


def _split_handler(handler: str) -> tuple[str, str]:
    handler = handler.strip()
    if "." not in handler:
        raise ValueError(f"bad handler {handler!r}: expected 'module.function'")
    mod, attr = handler.rsplit(".", 1)
    return mod.replace("/", "."), attr


def _dockerfile_cmd(asset_dir: Path, dockerfile: str | None) -> str | None:
    path = asset_dir / (dockerfile or "Dockerfile")
    if not path.is_file():
        return None
    cmd = None
    for line in path.read_text().splitlines():
        m = re.match(r"\s*CMD\s+(.*)$", line, re.IGNORECASE)
        if m:
            arg = m.group(1).strip()
            try:
                parsed = json.loads(arg)
                cmd = parsed[0] if isinstance(parsed, list) and parsed else None
            except json.JSONDecodeError:
                cmd = arg.split()[0] if arg else None
    return cmd


def function_specs(resolver: Resolver, asset_paths: dict[str, Path], code_root: Path) -> dict[str, FunctionSpec]:
    """logical id -> FunctionSpec for every ``AWS::Lambda::Function`` in the template."""
    specs: dict[str, FunctionSpec] = {}
    for lid in resolver.of_type(FUNCTION):
        res = resolver.resources[lid]
        props: dict[str, Any] = res.get("Properties", {})
        meta = res.get("Metadata") or {}
        lr = resolver.local(lid)
        env = (props.get("Environment") or {}).get("Variables") or {}
        env = {
            k: str(v) if not isinstance(v, str) else v
            for k, v in resolver.resolve(env, f"{lid}.Environment.Variables").items()
        }
        timeout = int(props.get("Timeout", DEFAULT_TIMEOUT))
        memory = int(props.get("MemorySize", DEFAULT_MEMORY))
        common: dict[str, Any] = dict(logical_id=lid, name=lr.name, arn=lr.arn, env=env, timeout=timeout, memory=memory)

        def unsupported(handler: str, why: str) -> FunctionSpec:
            return FunctionSpec(kind="unsupported", handler=handler, problem=why, **common)

        if props.get("PackageType") == "Image":
            cmd = ((props.get("ImageConfig") or {}).get("Command") or [None])[0]
            if cmd is None and lid in asset_paths:
                cmd = _dockerfile_cmd(asset_paths[lid], meta.get("aws:asset:dockerfile-path"))
            if not cmd:
                specs[lid] = unsupported("", "image function without ImageConfig.Command or CMD")
                continue
            try:
                mod, attr = _split_handler(cmd)
            except ValueError as e:
                specs[lid] = unsupported(cmd, str(e))
                continue
            path = _find_module(code_root, mod)
            if path is None:
                specs[lid] = unsupported(cmd, f"module {mod!r} of the image command not found under {code_root}")
                continue
            specs[lid] = FunctionSpec(
                kind="image",
                handler=cmd,
                module_file=str(path),
                attr=attr,
                package=mod.rpartition(".")[0] or None,
                code_dir=str(code_root),
                **common,
            )
            continue

        handler = props.get("Handler", "")
        runtime = str(props.get("Runtime", ""))
        if not runtime.startswith("python"):
            specs[lid] = unsupported(handler, f"runtime {runtime!r} is not run locally")
            continue
        if lid not in asset_paths:
            specs[lid] = unsupported(
                handler, "zip function without a local asset (inline or S3 code is not run locally)"
            )
            continue
        try:
            mod, attr = _split_handler(handler)
        except ValueError as e:
            specs[lid] = unsupported(handler, str(e))
            continue
        asset = asset_paths[lid]
        path = _find_module(asset, mod)
        if path is None:
            specs[lid] = unsupported(handler, f"module {mod!r} not found in asset {asset}")
            continue
        specs[lid] = FunctionSpec(
            kind="zip",
            handler=handler,
            module_file=str(path),
            attr=attr,
            package=mod.rpartition(".")[0] or None,
            code_dir=str(asset),
            runtime=runtime,
            **common,
        )
    return specs

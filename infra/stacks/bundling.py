"""Local (never Docker) bundling of the planner/aggregate layer.

The layer is `python/` with the pinned wheels of `layers/requirements.txt` for the Lambda
platform (pip `--platform ... --only-binary=:all:`, so nothing compiles and the host OS does not
matter) plus `smlt/runtime/` as it is (with `smlt/__init__.py`): the package of what the functions run,
which imports nothing else of `smlt` (tests/unit/test_border.py); tests/infra/test_bundling.py
imports the handlers from the built layer to check it). CDK calls `try_bundle` only when the stack is bundled (`cdk synth`,
`cdk deploy`); with `aws:cdk:bundling-stacks=[]` (CLI: `-c smlt:bundle=false`) it is skipped. The bundler never returns False:
returning False would make CDK fall back to `docker run`, which this project never does. On
failure it raises with pip's output and the way to synth without bundling.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

import jsii
from aws_cdk import ILocalBundling

# Bump when the bundling recipe changes so the asset hash (and the deployed layer) changes.
RECIPE_VERSION = "2"

PLATFORMS = {
    # manylinux2014 covers wheels like safetensors/pydantic-core; numpy 2.4 ships manylinux_2_27/2_28
    # only. Lambda's AL2023 runtimes (python3.12+) have glibc 2.34, so all of these load.
    "x86_64": ["manylinux2014_x86_64", "manylinux_2_28_x86_64"],
    "arm64": ["manylinux2014_aarch64", "manylinux_2_28_aarch64"],
}

_SKIP_DIRS = {"__pycache__", ".pytest_cache", ".mypy_cache"}
# What the layer ships of the repo: the runtime package and the top package's empty __init__.py.
SHIPPED = ("smlt/__init__.py", "smlt/runtime")


def shipped_files(repo_root: Path) -> list[Path]:
    """Every file of the runtime the layer (and the train image) ship, relative to the repo root."""
    out: list[Path] = []
    for name in SHIPPED:
        top = repo_root / name
        paths = [top] if top.is_file() else sorted(top.rglob("*"))
        for path in paths:
            rel = path.relative_to(repo_root)
            if path.is_file() and not _SKIP_DIRS.intersection(rel.parts) and rel.suffix != ".pyc":
                out.append(rel)
    return out


def layer_fingerprint(repo_root: Path, architecture: str, python_version: str) -> str:
    """Hash of everything that goes into the layer: requirements, the smlt sources, the recipe."""
    h = hashlib.sha256()
    h.update(f"recipe={RECIPE_VERSION};arch={architecture};py={python_version}\n".encode())
    req = repo_root / "layers" / "requirements.txt"
    h.update(b"requirements.txt\0" + req.read_bytes() + b"\0")
    for rel in shipped_files(repo_root):
        h.update(str(rel).encode() + b"\0" + (repo_root / rel).read_bytes() + b"\0")
    return h.hexdigest()


def build_layer(output_dir: Path, repo_root: Path, architecture: str, python_version: str) -> None:
    """Fill `output_dir/python` with the layer's site-packages. Raises RuntimeError on failure."""
    site = output_dir / "python"
    site.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable, "-m", "pip", "install",
        "--quiet", "--disable-pip-version-check", "--no-compile",
        "--requirement", str(repo_root / "layers" / "requirements.txt"),
        "--target", str(site),
        "--implementation", "cp",
        "--python-version", python_version,
        "--only-binary=:all:",
    ]  # fmt: skip
    for platform in PLATFORMS[architecture]:
        cmd += ["--platform", platform]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(
            "building the smlt layer failed (pip needs a package index; Docker is never used).\n"
            f"command: {' '.join(cmd)}\n{proc.stdout}{proc.stderr}\n"
            "To synthesize without building the layer (tests, offline): "
            'npx cdk synth -c smlt:bundle=false (or build_app(context={"aws:cdk:bundling-stacks": []}))'
        )
    for rel in shipped_files(repo_root):
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(repo_root / rel, site / rel)
    # Not importable code: console scripts, and a top-level `tests` package some sdists ship.
    for extra in ("bin", "tests"):
        shutil.rmtree(site / extra, ignore_errors=True)
    for cache in list(site.rglob("__pycache__")):
        shutil.rmtree(cache, ignore_errors=True)


@jsii.implements(ILocalBundling)
class LocalLayerBundling:
    def __init__(self, repo_root: Path, architecture: str, python_version: str) -> None:
        self.repo_root = repo_root
        self.architecture = architecture
        self.python_version = python_version

    def try_bundle(self, output_dir: str, *args, **kwargs) -> bool:  # noqa: ARG002 - jsii passes options
        build_layer(Path(output_dir), self.repo_root, self.architecture, self.python_version)
        return True

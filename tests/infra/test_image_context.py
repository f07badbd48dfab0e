"""The train_step image's build context holds only what the image needs: a change anywhere else
(README, docs, tests, bench, pyproject, the zip functions' handlers) keeps the image asset's hash,
so a deploy neither rebuilds the image nor replaces (and cold-starts) every tier."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import aws_cdk as cdk
from aws_cdk import aws_ecr_assets as ecr_assets

from infra.stacks.functions import REPO_ROOT, TRAIN_DOCKERFILE, train_image_options
from infra.stacks.settings import Settings

# What lambdas/train_step/Dockerfile copies (and CDK's own .dockerignore).
NEEDED = {
    ".dockerignore",
    "layers/requirements.txt",
    "lambdas/__init__.py",
    "lambdas/train_step/handler.py",
    "lambdas/prepare/handler.py",  # the Prepare function: the same image, its own command
}


def _staged_context(synth) -> Path:
    (image,) = json.loads((synth.outdir / "Smlt.assets.json").read_text())["dockerImages"].values()
    return synth.outdir / image["source"]["directory"]


def _files(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}


def test_staged_context_is_only_what_the_image_copies(synth):
    files = _files(_staged_context(synth))
    assert NEEDED <= files
    assert any(f.startswith("smlt/") for f in files)
    outside = {f for f in files if not f.startswith(("smlt/", "lambdas/train_step/", "lambdas/prepare/"))} - NEEDED
    assert outside == set(), outside
    assert not any("/tests/" in f or f.endswith(".pyc") for f in files)


def _image_hash(root: Path) -> str:
    """The asset hash CDK gives the train_step image built from `root` (options as the stack's)."""
    app = cdk.App()
    stack = cdk.Stack(app, "Hash")
    settings = Settings.from_context(stack)
    return ecr_assets.DockerImageAsset(stack, "Image", directory=str(root), **train_image_options(settings)).asset_hash


def _copy_repo_part(dst: Path) -> Path:
    """A repository of its own: the image's sources, its Dockerfile and .dockerignore, and the
    files the image does not need."""
    for rel in ("smlt", "lambdas", "layers"):
        shutil.copytree(REPO_ROOT / rel, dst / rel, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for rel in (".dockerignore", "README.md", "pyproject.toml"):
        shutil.copy2(REPO_ROOT / rel, dst / rel)
    assert (dst / TRAIN_DOCKERFILE).exists()
    return dst


def test_an_edit_outside_the_image_keeps_its_hash(tmp_path):
    repo = _copy_repo_part(tmp_path / "repo")
    before = _image_hash(repo)
    (repo / "README.md").write_text((repo / "README.md").read_text() + "\nAn edit.\n")
    (repo / "pyproject.toml").write_text((repo / "pyproject.toml").read_text() + "\n# an edit\n")
    for rel in ("docs/new.md", "tests/test_new.py", "bench/new.py", "lambdas/planner/new.py", "smlt/cli/new.py"):
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text("# new\n")
    assert _image_hash(repo) == before
    # ...while an edit to what the image runs changes it (the hash does see the context).
    (repo / "lambdas/train_step/handler.py").write_text((repo / "lambdas/train_step/handler.py").read_text() + "\n")
    assert _image_hash(repo) != before

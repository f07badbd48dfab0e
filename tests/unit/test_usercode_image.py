"""What a user's code runs on: the train_step image installs torch, torchvision, Pillow and pyarrow pinned
exactly as constraints.txt pins them, docs/deploy.md names those versions, and packaging refuses a
user's copy of any package the image provides."""

from __future__ import annotations

import re
from pathlib import Path

from smlt.runtime.usercode import IMAGE_PACKAGES

ROOT = Path(__file__).resolve().parents[2]
PINNED = ("torch", "torchvision", "pillow", "numpy", "safetensors", "pyarrow")
IMPORT_NAMES = {"pillow": "PIL"}


def _pins(text: str) -> dict[str, str]:
    return {m[1].lower(): m[2] for m in re.finditer(r"(?<![\w.-])([A-Za-z][\w.-]*)==([\w.+]+)", text)}


def _constraints() -> dict[str, str]:
    """The versions smlt is installed with (pyproject.toml holds their ranges)."""
    return _pins((ROOT / "constraints.txt").read_text())


def test_the_image_pins_what_the_constraints_pin():
    image = _pins((ROOT / "lambdas/train_step/Dockerfile").read_text())
    image |= _pins((ROOT / "layers/requirements.txt").read_text())  # installed by the Dockerfile
    want = _constraints()
    assert {p: image.get(p) for p in PINNED} == {p: want[p] for p in PINNED}


def test_the_deploy_guide_names_the_images_versions():
    guide = _pins((ROOT / "docs/deploy.md").read_text())
    want = _constraints()
    assert {p: guide.get(p) for p in PINNED} == {p: want[p] for p in PINNED}


def test_a_users_copy_of_an_image_package_is_refused():
    assert {IMPORT_NAMES.get(p, p) for p in PINNED} <= IMAGE_PACKAGES


def test_the_modules_the_image_provides_are_its_pinned_distributions_and_their_dependencies():
    """smlt.code_imports.IMAGE_MODULES, recomputed from this environment's metadata (installed with
    the same pins) for the image's distributions and what they require on Linux."""
    import importlib.metadata as md

    from packaging.markers import default_environment
    from packaging.requirements import Requirement

    from smlt.code_imports import IMAGE_MODULES

    def key(name: str) -> str:
        return re.sub(r"[-_.]+", "-", name).lower()

    image = _pins((ROOT / "lambdas/train_step/Dockerfile").read_text()) | _pins(
        (ROOT / "layers/requirements.txt").read_text()
    )
    env = {**default_environment(), "sys_platform": "linux", "platform_system": "Linux", "extra": ""}
    seen: set[str] = set()
    todo = list(image)
    while todo:
        name = todo.pop()
        if key(name) in seen:
            continue
        seen.add(key(name))
        for r in md.distribution(name).requires or []:
            req = Requirement(r)
            if req.marker is None or req.marker.evaluate(env):
                todo.append(req.name)
    tops = {
        top
        for top, dists in md.packages_distributions().items()
        if any(key(d) in seen for d in dists) and not top.startswith("_") and top != "tests"
    }
    assert tops == IMAGE_MODULES

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

"""torchvision, imported once for the whole of smlt: `from smlt.runtime.train.vision import models, transforms_v2`.

PyPI's torchvision wheel is built against the CUDA torch; beside the CPU torch its compiled ops
do not load, and `torchvision/_meta_registrations.py` then fails at import with "operator
torchvision::nms does not exist" (its `register_fake` of nms/qnms is not guarded by `_has_ops()`).
The models and transforms smlt uses are pure Python, so in exactly that case the two operator
schemas are defined here and the import is retried. The Lambda image installs the CPU build from
PyTorch's own index, where the first import simply works. A user's module that imports torchvision
itself is imported again after this one (`smlt.runtime.train.models.import_entry_module`).
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType

import torch

_MISSING_OP = "operator torchvision::nms does not exist"
# Kept for the life of the process: the schemas vanish when their Library is garbage collected.
_schemas: torch.library.Library | None = None


def _define_missing_schemas() -> None:
    global _schemas
    _schemas = torch.library.Library("torchvision", "DEF")
    for op in ("nms", "qnms"):
        _schemas.define(f"{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")


def _import() -> ModuleType:
    try:
        return importlib.import_module("torchvision")
    except RuntimeError as e:
        if _MISSING_OP not in str(e):
            raise
    _define_missing_schemas()
    for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
        del sys.modules[name]  # half-imported: the retry must run every module again
    return importlib.import_module("torchvision")


torchvision = _import()
models = importlib.import_module("torchvision.models")
transforms_v2 = importlib.import_module("torchvision.transforms.v2")

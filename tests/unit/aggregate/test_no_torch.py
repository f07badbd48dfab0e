"""The Aggregate and Planner Lambdas run on a layer without torch: nothing on their import path
may import it (the worker's torch code lives in smlt.runtime.tensors.torch_state alone)."""

import os
import subprocess
import sys
from pathlib import Path

LAYER_MODULES = (
    "lambdas.aggregate.handler",
    "lambdas.planner.handler",
    "smlt.runtime.model_store",
    "smlt.runtime.aggregate.reduce",
    "smlt.runtime.exchange",
    "smlt.runtime.tensors.codec",
    "smlt.runtime.tensors.dtypes",
    "smlt.runtime.tensors.format",
    "smlt.runtime.tensors.layout",
)


def test_the_layer_functions_import_no_torch():
    code = (
        f"import importlib, sys; [importlib.import_module(m) for m in {LAYER_MODULES!r}]; "
        "bad = [m for m in ('torch', 'safetensors.torch') if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)"
    )
    root = str(Path(__file__).resolve().parents[3])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root, env=env)
    assert r.returncode == 0, r.stdout + r.stderr

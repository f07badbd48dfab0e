"""A user's model or transform that imports torchvision builds in a fresh process as it does on a
worker: beside the CPU torch, PyPI's torchvision fails at import ("operator torchvision::nms does
not exist", smlt.runtime.train.vision), and smlt imports the user's module again after its own
torchvision import."""

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

USER_MODEL = textwrap.dedent(
    """
    import torchvision


    def build(input_shape, output_dim):
        return torchvision.ops.MLP(input_shape[0], [16, output_dim])
    """
)


def test_a_builder_that_imports_torchvision_builds_in_a_fresh_process(tmp_path):
    pkg = tmp_path / "tvnet"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "net.py").write_text(USER_MODEL)
    script = (
        "import torch; from smlt.runtime.train.models import builder; "
        "m = builder('tvnet.net:build')((64,), 10); print(m(torch.zeros(2, 64)).shape[-1])"
    )
    env_path = f"{tmp_path}:{ROOT}"
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env={"PYTHONPATH": env_path}, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "10"

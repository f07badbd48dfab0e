import subprocess
import sys


def test_planner_imports_neither_torch_nor_scipy():
    code = (
        "import sys, importlib, pkgutil, smlt.runtime.planner as p; "
        "[importlib.import_module(m.name) for m in pkgutil.iter_modules(p.__path__, p.__name__ + '.')]; "
        "bad = [m for m in ('torch', 'scipy', 'sklearn') if m in sys.modules]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr

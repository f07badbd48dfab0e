import subprocess
import sys


def test_planner_imports_neither_torch_nor_scipy():
    code = (
        "import sys, smlt.runtime.planner, smlt.runtime.planner.core, smlt.runtime.planner.timing, smlt.runtime.planner.progress; "
        "bad = [m for m in ('torch', 'scipy', 'sklearn') if m in sys.modules]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr

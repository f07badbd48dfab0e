"""The synth cache with the real app: what `smlt run --local` reads from it is what a fresh synth
writes, and reading it imports no CDK. (The cache's key, damaged entries, concurrent writers:
tests/unit/test_synth_cache.py.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

HIT = r"""
import json, sys
from pathlib import Path
from smlt.local.engine import project_root
from smlt.local.synth_cache import synthesize_cached
from smlt.runner import build_app

syn = synthesize_cached(build_app, Path(sys.argv[1]), root=project_root())
cdk = sorted(m for m in sys.modules if m.split(".")[0] in ("aws_cdk", "jsii", "infra"))
print(json.dumps({"cached": syn.cached, "template": syn.template, "assets": {k: str(v) for k, v in syn.asset_paths.items()}, "imported": cdk}))
"""


def files(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


def test_the_cached_synth_is_a_fresh_synth_and_a_hit_imports_no_cdk(synth, tmp_path):
    from smlt.local.engine import project_root
    from smlt.local.synth import asset_paths
    from smlt.local.synth_cache import synthesize_cached
    from smlt.runner import build_app

    folder = tmp_path / "cache"
    made = synthesize_cached(build_app, folder, root=project_root())
    assert not made.cached
    assert made.template == synth.template  # the session's fresh synth (tests/infra/conftest.py)
    fresh = asset_paths(synth.template, synth.outdir.resolve())
    assert made.asset_paths.keys() == fresh.keys()
    for lid, path in made.asset_paths.items():
        assert files(path) == files(fresh[lid]), lid  # the staged assets, file by file

    out = subprocess.run(
        [sys.executable, "-c", HIT, str(folder)], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    hit = json.loads(out.stdout)
    assert hit["cached"] and hit["imported"] == []
    assert hit["template"] == made.template
    assert hit["assets"] == {k: str(v) for k, v in made.asset_paths.items()}

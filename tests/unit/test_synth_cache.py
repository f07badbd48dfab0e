"""The synth cache (smlt/local/synth_cache.py) with a stand-in app (tests/unit/synth_fake_app.py):
its key, hits and misses, damaged entries, concurrent writers, pruning. The real app's cached
synth against a fresh one: tests/infra/test_synth_cache.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from smlt.local import synth_cache
from smlt.local.synth_cache import ENTRY, cache_key, read_entry, synthesize_cached
from tests.unit.synth_fake_app import build_app

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A project with a file of each kind the key hashes."""
    root = tmp_path / "project"
    for rel, text in {
        "infra/app.py": "def build_app(): ...\n",
        "infra/stacks/storage.py": "BUCKETS = 2\n",
        "cdk.json": '{"context": {"memory_tiers": [1769]}}\n',
        "smlt/runtime/config.py": "TIMEOUT = 900\n",
        "lambdas/planner/handler.py": "def handler(e, c): ...\n",
        "layers/requirements.txt": "numpy==2.4.0\n",
        ".dockerignore": "*\n!smlt/\n",
        "pyproject.toml": "[project]\nname = 'x'\n",
        "constraints.txt": "numpy==2.4.0\n",
    }.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


@pytest.fixture
def synths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The stand-in app logs each synth it runs here (one line each)."""
    log = tmp_path / "synths.log"
    monkeypatch.setenv("FAKE_SYNTH_LOG", str(log))
    return log


def count(log: Path) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


def entries(folder: Path) -> list[str]:
    """Every name in the cache folder (entries, and temporary or set-aside folders: dot names)."""
    return sorted(p.name for p in folder.iterdir())


def test_folder_from_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("SMLT_SYNTH_CACHE", raising=False)
    monkeypatch.setenv("SMLT_HOME", str(tmp_path / "home"))
    assert synth_cache.cache_folder() == tmp_path / "home" / "synth"
    monkeypatch.setenv("SMLT_SYNTH_CACHE", str(tmp_path / "mine"))
    assert synth_cache.cache_folder() == tmp_path / "mine"
    monkeypatch.setenv("SMLT_SYNTH_CACHE", "off")
    assert synth_cache.cache_folder() is None


def test_a_hit_reads_back_what_the_miss_synthesized(project, tmp_path, synths):
    folder = tmp_path / "cache"
    made = synthesize_cached(build_app, folder, root=project, context={"label": "a"})
    hit = synthesize_cached(build_app, folder, root=project, context={"label": "a"})
    assert count(synths) == 1
    assert (made.cached, hit.cached) == (False, True)
    assert hit.template == made.template and hit.template["Resources"]["Fn"]["Properties"]["Description"] == "a"
    assert (hit.stack_name, hit.template_path, hit.assembly_dir) == (
        made.stack_name,
        made.template_path,
        made.assembly_dir,
    )
    assert hit.asset_paths == made.asset_paths == {"Fn": hit.assembly_dir / "asset.abc"}
    assert (hit.asset_paths["Fn"] / "index.py").is_file()
    assert json.loads(hit.template_path.read_text()) == hit.template
    assert entries(folder) == [hit.assembly_dir.name]  # one entry, no temporary folder left


def test_the_key_hashes_every_input_by_content(project, monkeypatch):
    monkeypatch.delenv("CDK_CONTEXT_JSON", raising=False)

    def key(**kw) -> str:
        return cache_key(build_app, project, **kw)

    base = key()
    assert key() == base
    # not an input: modification times, bytecode, files outside SOURCES
    os.utime(project / "infra/app.py", (1, 1))
    (project / "smlt/__pycache__").mkdir()
    (project / "smlt/__pycache__/config.cpython-311.pyc").write_bytes(b"\0")
    (project / "README.md").write_text("# x\n")
    assert key() == base

    seen = {base}

    def changes(what: str, new: str) -> None:
        assert new not in seen, f"{what} did not change the key"
        seen.add(new)

    for rel in SOURCES_FILES:
        path = project / rel
        old = path.read_text()
        path.write_text(old + "# edited\n")
        changes(rel, key())
        path.write_text(old)
        assert key() == base, rel
    (project / "infra/stacks/new.py").write_text("X = 1\n")  # a new file
    changes("a new file", key())
    (project / "infra/stacks/new.py").unlink()
    changes("context", key(context={"memory_tiers": [3008]}))
    changes("stack", key(stack="Other"))
    monkeypatch.setenv("CDK_CONTEXT_JSON", '{"memory_tiers": [3008]}')
    changes("CDK_CONTEXT_JSON", key())
    monkeypatch.delenv("CDK_CONTEXT_JSON")
    monkeypatch.setattr(synth_cache.metadata, "version", lambda name: "0.0.1")
    changes("package versions", key())
    monkeypatch.undo()
    monkeypatch.setattr(synth_cache.sys, "version", "3.99.0")
    changes("the Python version", key())


SOURCES_FILES = (
    "infra/app.py",
    "infra/stacks/storage.py",
    "cdk.json",
    "smlt/runtime/config.py",
    "lambdas/planner/handler.py",
    "layers/requirements.txt",
    ".dockerignore",
    "pyproject.toml",
    "constraints.txt",
)


def test_sources_cover_the_image_build_context():
    """Every path the train_step image's .dockerignore lets into its build context (and its asset
    hash) is under a path the key hashes."""
    allowed = [
        line[1:].strip().rstrip("/")
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.startswith("!")
    ]
    assert allowed
    for path in allowed:
        assert any(path == s or path.startswith(s + "/") for s in synth_cache.SOURCES), path


def test_an_edited_infra_file_or_another_context_misses(project, tmp_path, synths):
    folder = tmp_path / "cache"
    first = synthesize_cached(build_app, folder, root=project, context={"label": "a"})
    (project / "infra/stacks/storage.py").write_text("BUCKETS = 3\n")
    edited = synthesize_cached(build_app, folder, root=project, context={"label": "a"})
    other = synthesize_cached(build_app, folder, root=project, context={"label": "b"})
    assert count(synths) == 3 and not edited.cached and not other.cached
    assert other.template["Resources"]["Fn"]["Properties"]["Description"] == "b"
    assert len({first.assembly_dir, edited.assembly_dir, other.assembly_dir}) == 3
    (project / "infra/stacks/storage.py").write_text("BUCKETS = 2\n")  # back: the first entry again
    again = synthesize_cached(build_app, folder, root=project, context={"label": "a"})
    assert again.cached and again.assembly_dir == first.assembly_dir and count(synths) == 3


@pytest.mark.parametrize(
    "damage",
    [
        "template removed",
        "asset file changed",
        "asset folder removed",
        "entry.json removed",
        "entry.json garbage",
        "another format",
    ],
)
def test_a_damaged_entry_is_rebuilt(project, tmp_path, synths, damage):
    folder = tmp_path / "cache"
    made = synthesize_cached(build_app, folder, root=project)
    entry = made.assembly_dir
    if damage == "template removed":
        made.template_path.unlink()
    elif damage == "asset file changed":
        (made.asset_paths["Fn"] / "index.py").write_text("raise SystemExit\n")
    elif damage == "asset folder removed":
        for p in made.asset_paths["Fn"].iterdir():
            p.unlink()
        made.asset_paths["Fn"].rmdir()
    elif damage == "entry.json removed":
        (entry / ENTRY).unlink()
    elif damage == "entry.json garbage":
        (entry / ENTRY).write_text("{not json")
    else:
        meta = json.loads((entry / ENTRY).read_text())
        (entry / ENTRY).write_text(json.dumps({**meta, "format": 0}))
    assert read_entry(entry) is None

    again = synthesize_cached(build_app, folder, root=project)
    assert not again.cached and count(synths) == 2
    assert again.assembly_dir == entry and again.template == made.template
    assert read_entry(entry) is not None
    assert (again.asset_paths["Fn"] / "index.py").read_text().startswith("def handler")
    assert entries(folder) == [entry.name]


def test_bytecode_written_into_an_entry_does_not_damage_it(project, tmp_path):
    """Handler processes import zip functions from the entry's asset folders."""
    made = synthesize_cached(build_app, tmp_path / "cache", root=project)
    (made.asset_paths["Fn"] / "__pycache__").mkdir()
    (made.asset_paths["Fn"] / "__pycache__" / "index.cpython-311.pyc").write_bytes(b"\0")
    assert read_entry(made.assembly_dir) is not None


WRITER = r"""
import json, sys
from pathlib import Path
sys.path.insert(0, sys.argv[3])
from smlt.local.synth_cache import synthesize_cached
from tests.unit.synth_fake_app import build_app

syn = synthesize_cached(build_app, Path(sys.argv[1]), root=Path(sys.argv[2]))
print(json.dumps({"dir": str(syn.assembly_dir), "template": syn.template, "cached": syn.cached}))
"""


def test_concurrent_writers_end_with_one_whole_entry(project, tmp_path, synths):
    folder = tmp_path / "cache"
    env = {**os.environ, "FAKE_SYNTH_SLOW_S": "1.0"}  # the synths overlap
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, str(folder), str(project), str(ROOT)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        results.append(json.loads(out))
    assert count(synths) >= 2, "the writers did not overlap"
    (entry,) = {r["dir"] for r in results}
    assert all(r["template"] == results[0]["template"] for r in results)
    assert entries(folder) == [Path(entry).name]  # the losers' temporary folders are gone
    assert read_entry(Path(entry)) is not None


def test_a_new_entry_removes_old_unused_ones(project, tmp_path, synths):
    folder = tmp_path / "cache"
    old = time.time() - 2 * synth_cache.UNUSED_S
    for i in range(synth_cache.KEEP + 2):  # entries of other versions, unused for two days
        made = synthesize_cached(build_app, folder, root=project, context={"label": i})
        os.utime(made.assembly_dir / ENTRY, (old + i, old + i))
    dead = folder / ".0123456789abcdef-dead"  # a synth killed half-way, long ago
    dead.mkdir()
    os.utime(dead, (old, old))
    synthesize_cached(build_app, folder, root=project, context={"label": "new"})
    kept = [json.loads((folder / n / "Fake.template.json").read_text()) for n in entries(folder)]
    labels = sorted(t["Resources"]["Fn"]["Properties"]["Description"] for t in kept)
    # the new entry and the KEEP - 1 used last; the dead synth's folder is gone
    assert labels == sorted(["new", *(str(i) for i in range(3, synth_cache.KEEP + 2))])


def test_a_cache_it_cannot_write_is_named(project, tmp_path):
    from smlt.local.synth import SynthError

    (tmp_path / "file").write_text("")
    with pytest.raises(SynthError, match="SMLT_SYNTH_CACHE to another folder, or to off"):
        synthesize_cached(build_app, tmp_path / "file" / "cache", root=project)

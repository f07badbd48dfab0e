"""What a local run's snapshot keeps: the run up to its newest aggregated round (updates too) and
the next round's model, never half a round; where it keeps it (a folder per run) and the live run's lock."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from smlt.runtime import keys
from smlt.runtime.errors import RunInProgress, RunNotFound
from smlt.snapshot import DIGEST, _encode, _ItemsFile, _kept, clear_state, find_state, run_lock, saved_items, state_dir


def test_objects_kept_up_to_the_newest_round_and_the_next_model():
    run, newest = "r", 3
    assert _kept(keys.job_key(run), newest)
    assert _kept(keys.model_key(run, 3), newest)
    assert _kept(keys.update_key(run, 3, 0), newest)  # aggregated: what `smlt verify --local` reconciles
    assert _kept(keys.model_key(run, 4), newest)  # what round 4 starts from
    assert _kept(keys.slice_key(run, 4, 0, 2), newest) and _kept(keys.slices_manifest_key(run, 4), newest)
    assert not _kept(keys.update_key(run, 4, 1), newest)  # round 4 is in progress
    assert not _kept(keys.accepted_key(run, 4), newest)
    assert not _kept(keys.sync_prefix(run, 4) + "000001/grad/00000.safetensors", newest)
    assert not _kept(keys.sync_prefix(run, 3) + "000001/grad/00000.safetensors", newest)  # never read again
    assert not _kept(keys.model_key(run, 5), newest)
    assert _kept(keys.final_model_key(run), newest)


def _save(folder, run_id):
    """A saved state as Snapshot.save leaves it: items.json with the run's META, and its objects."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "items.json").write_text(json.dumps([{"pk": keys.pk(run_id), "sk": keys.META, "run_id": run_id}]))
    (folder / "s3" / "bucket").mkdir(parents=True, exist_ok=True)
    (folder / "s3" / "bucket" / "obj").write_bytes(run_id.encode())


def test_several_runs_keep_their_state_apart_in_one_out(tmp_path):
    _save(state_dir(tmp_path, "a"), "a")
    _save(state_dir(tmp_path, "b"), "b")  # a second run into the same --out
    for run in ("a", "b"):
        assert find_state(tmp_path, run) == tmp_path / ".state" / "runs" / run
        assert saved_items(run, tmp_path)[0]["run_id"] == run
    with pytest.raises(RunNotFound, match=r"no saved state in .*runs/c.* \(this one holds the runs 'a', 'b'\)"):
        saved_items("c", tmp_path)
    clear_state(state_dir(tmp_path, "a"))  # a fresh run under id a replaces its state only
    assert not (state_dir(tmp_path, "a") / "s3").exists() and saved_items("b", tmp_path)


def test_a_state_saved_before_runs_had_their_own_folder_is_still_found(tmp_path):
    _save(tmp_path / ".state", "old")
    assert find_state(tmp_path, "old") == tmp_path / ".state"
    assert saved_items("old", tmp_path)[0]["run_id"] == "old"
    _save(state_dir(tmp_path, "old"), "old")  # once resumed, it saves into its own folder
    assert find_state(tmp_path, "old") == state_dir(tmp_path, "old")


HOLD = "import sys, time; from pathlib import Path; from smlt.snapshot import run_lock\n" + (
    "with run_lock(Path(sys.argv[1]), 'r'):\n    print('held', flush=True); time.sleep(60)\n"
)


def test_a_live_run_holds_its_lock_and_a_crash_frees_it(tmp_path):
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    live = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert live.stdout.readline().strip() == "held"
        with pytest.raises(RunInProgress, match="run 'r' is live in .* already"):
            with run_lock(tmp_path, "r"):
                pass
        with run_lock(tmp_path, "other"):  # another run id in the same --out is fine
            pass
    finally:
        live.kill()  # a crash: no clean-up runs
        live.wait()
    with run_lock(tmp_path, "r") as folder:  # the lock died with its process
        assert folder == state_dir(tmp_path, "r")


@pytest.mark.parametrize("in_kernel", [True, False])
def test_items_file_is_the_json_list_of_meta_and_every_item_saved_in_order(tmp_path, monkeypatch, in_kernel):
    """Each save rewrites items.json with META's newest value first and the items saved before
    copied from the previous file (not kept in memory): the JSON list of the items, each with its
    digest,
    whether the kernel copies them (copy_file_range) or, where it cannot, Python does."""
    if not in_kernel:

        def cannot(*_):
            raise OSError(18, "Invalid cross-device link")

        monkeypatch.setattr(os, "copy_file_range", cannot)
    path = tmp_path / "items.json"
    items_file = _ItemsFile(path)
    saved: list[dict] = []
    for rnd in range(4):
        meta = {"pk": "RUN#r", "sk": keys.META, "state": f"round {rnd}", "note": "é" * rnd}  # META changes size
        added = [{"pk": "RUN#r", "sk": keys.round_sk(rnd), "n": rnd}, {"pk": "RUN#r", "sk": keys.plan_sk(rnd)}]
        items_file.write(meta, added if rnd != 2 else [])  # a save with no new round rewrites META only
        saved += added if rnd != 2 else []
        assert path.read_text() == "[" + ", ".join(_encode(i) for i in [meta, *saved]) + "]"
        read = json.loads(path.read_text())
        assert [{k: v for k, v in i.items() if k != DIGEST} for i in read] == [meta, *saved]
    assert not (tmp_path / "items.json.tmp").exists()


def test_a_new_run_keeps_an_earlier_runs_state_of_the_same_id(tmp_path):
    """`smlt run` with the run id of a saved run is refused, naming what to do; unfinished, it
    says how to resume it; finished, that it finished. Nothing is changed either way."""
    from smlt.snapshot import SavedRunExists, refuse_to_replace

    folder = state_dir(tmp_path, "r")
    refuse_to_replace(tmp_path, "r", folder)  # nothing saved: a fresh run goes ahead
    _save(folder, "r")
    items = json.loads((folder / "items.json").read_text())
    (folder / "items.json").write_text(json.dumps([*items, {"pk": keys.pk("r"), "sk": keys.round_sk(0)}]))
    before = {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    with pytest.raises(SavedRunExists, match=r"run 'r' has a saved state in .* \(1 rounds, in .*runs/r\)") as e:
        refuse_to_replace(tmp_path, "r", folder)
    assert f"`smlt resume r --local --out {tmp_path}`" in str(e.value) and "--replace" in str(e.value)
    items[0]["status"] = "SUCCEEDED"
    (folder / "items.json").write_text(json.dumps(items))
    with pytest.raises(SavedRunExists, match=r"run 'r' finished already in .*: give this run another run_id or --out"):
        refuse_to_replace(tmp_path, "r", folder)
    assert {p: p.read_bytes() for p in folder.rglob("*") if p.is_file() and p.name != "items.json"} == {
        p: b for p, b in before.items() if p.name != "items.json"
    }


def test_a_run_without_out_gets_its_own_folder_when_out_holds_another_runs_outputs(tmp_path, monkeypatch):
    from smlt.runner import default_out

    monkeypatch.chdir(tmp_path)
    assert default_out("b") == Path("out")  # nothing there yet
    Path("out").mkdir()
    Path("out/metrics.json").write_text(json.dumps({"run_id": "a"}))
    assert default_out("a") == Path("out")  # its own outputs (a run id given twice is refused elsewhere)
    assert default_out("b") == Path("out/b")

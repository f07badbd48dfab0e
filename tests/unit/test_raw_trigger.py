"""An upload trigger's key to its run: a prepared version's manifest or a raw version's _SUCCESS
marker, the run id and the prepared prefix each upload gets, and the keys outside the layout."""

from __future__ import annotations

import re

import pytest

from smlt.runtime import keys
from smlt.runtime.errors import InvalidJob
from smlt.runtime.pipeline import version_name, version_of
from smlt.runtime.trigger import run_job, upload_of


def trigger(key: str, etag: str = "e1", sequencer: str = "0A1") -> dict:
    return {"bucket": "data", "key": key, "etag": etag, "sequencer": sequencer}


def test_a_manifest_trains_on_its_own_folder():
    up = upload_of(trigger("incoming/houses/v1/manifest.json"))
    assert (up.pipeline, up.version, up.folder, up.raw) == ("houses", "v1", "incoming/houses/v1", False)
    assert up.dataset_uri == "s3://data/incoming/houses/v1/"
    assert up.run_id == f"houses-v1-{up.tag}" and len(up.tag) == 8


def test_a_marker_trains_on_its_own_prepared_prefix():
    up = upload_of(trigger("incoming/houses/2026/11/_SUCCESS"))
    assert (up.pipeline, up.version, up.folder, up.raw) == ("houses", "2026-11", "incoming/houses/2026/11", True)
    assert up.dataset_folder == f"prepared/houses/2026-11/{up.tag}"
    assert up.dataset_uri == f"s3://data/{keys.prepared_prefix('houses', '2026-11', up.tag)}"
    # the gate finds the version from the prepared dataset's URI, as from a manifest's folder
    assert version_of(up.dataset_uri) == ("houses", "2026-11")
    assert version_of("s3://data/incoming/houses/2026/11/") == ("houses", "2026-11")
    assert version_of("s3://data/datasets/houses/") is None


def test_version_folders_that_are_not_names_get_names_of_their_own():
    # a folder of letters, digits, - and _ is its name; any other is told apart by a digest of it,
    # so `v 2` and `v-2` (or `été` and `ete`, or two long names) never share a version's record
    assert version_name(["v2"]) == "v2" and version_name(["2026", "11"]) == "2026-11"
    spaced, dashed = (
        upload_of(trigger("incoming/houses/v 2/_SUCCESS")),
        upload_of(trigger("incoming/houses/v-2/_SUCCESS")),
    )
    assert dashed.version == "v-2" and spaced.version.startswith("v-2-") and len(spaced.version) == 12
    assert spaced.run_id.startswith(f"houses-{spaced.version}-") and version_of(spaced.dataset_uri)[1] == spaced.version
    names = {version_name([f]) for f in ("été", "ete", "ètè", "v1.2", "v1-2", "a" * 40, "a" * 41, "a" * 42)}
    assert len(names) == 8 and all(re.fullmatch(r"[A-Za-z0-9_-]{1,40}", n) for n in names), names
    assert version_name(["été"]) == version_name(["été"])  # the same folder, the same version


def test_the_same_event_is_the_same_run_and_a_new_upload_a_new_one():
    first = upload_of(trigger("incoming/p/v1/_SUCCESS"))
    assert upload_of(trigger("incoming/p/v1/_SUCCESS")) == first  # a duplicated delivery
    again = upload_of(trigger("incoming/p/v1/_SUCCESS", sequencer="0A2"))  # the marker uploaded again
    assert again.run_id != first.run_id and again.dataset_folder != first.dataset_folder
    # a manifest and a marker of one version are different uploads
    assert upload_of(trigger("incoming/p/v1/manifest.json")).run_id != first.run_id


@pytest.mark.parametrize(
    "key",
    [
        "incoming/p/_SUCCESS",  # no version folder
        "incoming/p/v1/data.csv",  # the data, not its marker
        "elsewhere/p/v1/_SUCCESS",
        "prepared/p/v1/abcd1234/manifest.json",  # what Prepare writes never starts a run
        "incoming//v1/_SUCCESS",
        "incoming/p/v1/_SUCCESS.tmp",
    ],
)
def test_keys_outside_the_layout_are_named(key):
    expected = "expected s3://DATA/incoming/<pipeline>/<version>/manifest.json or _SUCCESS"
    with pytest.raises(InvalidJob, match=f"{expected}, got s3://data/{key}"):
        upload_of(trigger(key))


def test_no_bucket_is_named():
    with pytest.raises(InvalidJob, match="got s3://None/incoming/p/v1/_SUCCESS"):
        upload_of({"key": "incoming/p/v1/_SUCCESS"})


def test_the_run_job_keeps_the_source_options_and_names_the_prepared_data():
    up = upload_of(trigger("incoming/houses/v1/_SUCCESS"))
    job = {
        "name": "h",
        "dataset": {"uri": "replaced", "label": "price", "task": "regression"},
        "model": {"name": "mlp"},
    }
    out = run_job(up, job)
    assert out["dataset"] == {"label": "price", "task": "regression", "uri": up.dataset_uri}
    assert out["pipeline"] == "houses" and out["run_id"] == up.run_id and out["model"] == {"name": "mlp"}
    assert job["dataset"]["uri"] == "replaced"  # the pipeline's job itself is not changed
    assert run_job(up, {"name": "h"})["dataset"] == {"uri": up.dataset_uri}

"""A pipeline version's records on moto: a version uploaded again while its first run trains (the
first run's record kept under replaced/ ends as `replaced`), and a Finalize retried after a human
decision (it never undoes it)."""

from __future__ import annotations

import pytest

from smlt.cli.models import _print_versions
from smlt.runtime import keys
from smlt.runtime import pipeline as pl
from smlt.runtime.steps import prepare as p
from smlt.runtime.store import S3Store
from smlt.runtime.trigger import upload_of
from tests.functional.handlers.test_prepare_data import _event, houses  # noqa: F401 - the fixture


def _started(sequencer: str) -> tuple[str, pl.VersionRecord]:
    """v1's marker uploaded (a new sequencer: a new run): prepared, and its version recorded as its first Plan does."""
    event = _event("incoming/h/v1/_SUCCESS", execution=f"exec-{sequencer}", sequencer=sequencer)
    assert p.prepare_upload(p.PrepareSettings(), event).action == "plan"
    up = upload_of(event.trigger)
    _, record = pl.start_version(
        S3Store("smlt-data"), S3Store("smlt-artifacts"), "h", "v1", up.dataset_folder, up.run_id
    )
    return up.run_id, record


def _finalize(run_id: str, value: float) -> pl.VersionRecord | None:
    """Finalize's call of the gate for v1's run `run_id` (its prepared folder's tag ends the run id)."""
    uri = f"s3://smlt-data/{keys.prepared_prefix('h', 'v1', run_id.rsplit('-', 1)[1])}"
    model = f"s3://smlt-artifacts/{keys.final_model_key(run_id)}"
    return pl.conclude(S3Store("smlt-artifacts"), uri, run_id, model, "val_r2", 0.0, value, None, 0.02, "ab")


@pytest.mark.usefixtures("houses")
def test_a_version_uploaded_again_while_its_first_run_trains_ends_that_runs_record_as_replaced(capsys):
    artifacts = S3Store("smlt-artifacts")
    first, _ = _started("01")
    second, _ = _started("02")  # v1 again while the first run trains
    (kept,) = pl.replaced(artifacts, "h")["v1"]
    assert kept.run_id == first and kept.status == "replaced", kept  # before: "training", forever
    assert kept.reason == f"the version was uploaded again (run {second}) before this run ended: not gated"
    # the first run ends: not gated (the version's newer run decides), its results kept on its record
    assert _finalize(first, 0.5) is None
    (kept,) = pl.replaced(artifacts, "h")["v1"]
    assert kept.status == "replaced" and kept.challenger_value == 0.5 and kept.decided_at is not None, kept
    assert kept.model == f"s3://smlt-artifacts/{keys.final_model_key(first)}" and not kept.promoted
    assert pl.champion(artifacts, "h") is None
    # the second run is gated as the version's
    decided = _finalize(second, 0.7)
    assert decided is not None and decided.status == "promoted" and decided.run_id == second
    found = pl.versions(artifacts, "h")
    _print_versions(None, found, pl.champion(artifacts, "h"), {}, pl.replaced(artifacts, "h"))
    out = capsys.readouterr().out
    assert f"uploaded again since: the earlier upload's run {first} (replaced, val_r2 0.5)" in out, out


def test_a_finalize_retried_after_a_rollback_to_the_compared_champion_keeps_the_rollback(aws):
    artifacts = S3Store("smlt-artifacts")
    model = "s3://smlt-artifacts/runs/{}/final/model.safetensors"
    v1 = pl.VersionRecord(
        pipeline="fraud", version="v1", data="s3://smlt-data/incoming/fraud/v1/", run_id="fraud-v1-r",
        status="rejected", features="f", generation=1, model=model.format("fraud-v1-r"), decided_at=1.0,
    )  # fmt: skip
    artifacts.put(keys.pipeline_version_key("fraud", "v1"), v1.model_dump_json().encode())
    pl.promote(artifacts, "fraud", "v1", "alice")
    v2 = pl.VersionRecord(
        pipeline="fraud", version="v2", data="s3://smlt-data/incoming/fraud/v2/", run_id="fraud-v2-r",
        features="f", generation=1, champion_run="fraud-v1-r", champion_version="v1",
    )  # fmt: skip
    artifacts.put(keys.pipeline_version_key("fraud", "v2"), v2.model_dump_json().encode())

    def gate() -> pl.VersionRecord | None:  # Finalize's call: the challenger 0.96 against the champion's 0.9
        uri, run = "s3://smlt-data/incoming/fraud/v2/", "fraud-v2-r"
        return pl.conclude(artifacts, uri, run, model.format(run), "val_accuracy", 0.0, 0.96, 0.9, 0.01, "ab")

    assert gate().status == "promoted" and pl.champion(artifacts, "fraud").run_id == "fraud-v2-r"
    # the team rolls back to v1, exactly the champion the gate compared v2 with
    assert pl.rollback(artifacts, "fraud", "bob").run_id == "fraud-v1-r"
    # Finalize's retry lands now (its first attempt's answer was lost): the rollback stands
    again = gate()
    assert again is not None and again.status == "promoted" and again.run_id == "fraud-v2-r"
    champ = pl.champion(artifacts, "fraud")
    assert champ is not None and champ.run_id == "fraud-v1-r" and champ.by == "bob", champ  # before: v2 again
    assert [v for v, _ in pl.champions_stack(artifacts, "fraud")] == ["v1"]

"""A raw version uploaded as many parts of one table (`part-00000.csv` ... + `_SUCCESS`) prepared
by the parts' Distributed Maps (smlt.runtime.steps.prepare_parts) on the session's engine, then
trained and promoted as any raw upload; a bad cell in one part ends the execution with the named
error naming that part's object and line, told to the team's topic once. A pipeline's versions as
compressed tables, alone and in parts, with a date column, `NA` cells and a column its job drops."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path

import numpy as np

from smlt.local import iam_record
from smlt.runtime import keys, ledger
from smlt.runtime import pipeline as pl
from smlt.runtime.records import RunTable
from smlt.runtime.store import S3Store
from tests.e2e.test_pipeline import ROWS, _houses
from tests.e2e.test_raw_upload import SHORT, _wait, pipeline, refusals  # noqa: F401 - the fixtures

PARTS = 60


def _split(csv: str, parts: int) -> list[bytes]:
    """The CSV's rows in `parts` files, each with the header."""
    header, *rows = Path(csv).read_text().splitlines()
    size = -(-len(rows) // parts)
    return [("\n".join([header, *rows[i : i + size]]) + "\n").encode() for i in range(0, len(rows), size)]


def _entered(engine, arn: str) -> list[str]:
    events = engine.client("stepfunctions").get_execution_history(executionArn=arn, maxResults=1000)["events"]
    return [e["stateEnteredEventDetails"]["name"] for e in events if "stateEnteredEventDetails" in e]


def test_a_table_in_many_parts_prepares_through_the_maps_trains_and_is_promoted(
    pipeline,  # noqa: F811
    tmp_path,
    iam_log,
    role_policies,
):
    engine, names, _, setup, upload = pipeline
    _, start = iam_record.read(iam_log, iam_log.stat().st_size if iam_log.exists() else 0)
    setup("parts", SHORT)
    bodies = _split(_houses(tmp_path / "h.csv", 3), PARTS)
    assert len(bodies) == PARTS
    for i, body in enumerate(bodies):
        upload(f"incoming/parts/v1/part-{i:05d}.csv", body)
    (arn,) = upload("incoming/parts/v1/_SUCCESS", b"")
    desc = _wait(engine, [arn])
    assert desc["status"] == "SUCCEEDED", desc
    out = json.loads(desc["output"])
    rows = sum(body.count(b"\n") - 1 for body in bodies)
    assert out["prepared"]["action"] == "plan" and out["prepared"]["rows"] == rows

    entered = _entered(engine, arn)
    for state in ("PrepareData", "PartStats", "MergeStats", "PartMoments", "MergeMoments", "PartShards", "FinishParts"):
        assert entered.count(state) == 1, (state, entered)
    assert entered.index("FinishParts") < entered.index("Plan")

    data = S3Store(names.data_bucket)
    folder = out["prepared"]["dataset"].split("/", 3)[3]
    manifest = json.loads(data.get(folder + keys.MANIFEST))
    assert manifest["train"]["rows"] + manifest["validation"]["rows"] == rows
    parts_of_shards = {s["key"].split("-")[1] for s in manifest["train"]["shards"]}
    assert parts_of_shards == {f"{i:05d}" for i in range(PARTS)}  # each part its own shards
    assert not data.list(folder + "_parts/")  # the scratch is gone
    assert data.exists(keys.pipeline_features_key("parts"))  # the first version fixed the features

    # one child per part in each Map, billed to the run like PrepareData
    run_id = out["plan"]["run_id"]
    attempts = ledger.from_items(RunTable(names.table, run_id, client=engine.client("dynamodb")).query(ledger.PREFIX))
    ops = Counter(a.op for a in attempts)
    assert ops["part_stats"] == ops["part_moments"] == ops["part_shards"] == PARTS, ops
    assert ops["prepare_data"] == ops["merge_stats"] == ops["merge_moments"] == ops["finish_parts"] == 1, ops

    assert pl.champion(S3Store(names.artifacts_bucket), "parts").version == "v1"

    # the children run as the Prepare function, with its role: without DeleteObject on prepared/,
    # FinishParts' removal of the scratch (and nothing else of the run) is denied
    calls, _ = iam_record.read(iam_log, start)
    assert iam_record.check(calls, role_policies).denied == []
    (prepare,) = [fn for fn in role_policies.statements if "Prepare" in fn]
    denied = iam_record.check(calls, role_policies.without(prepare, "s3:DeleteObject", "/prepared/")).denied
    assert denied and {d.function for d in denied} == {prepare}
    assert all(f"/{folder}_parts/" in d.request.resource for d in denied)


def test_a_bad_cell_in_one_part_names_its_object_and_line(pipeline, refusals, tmp_path):  # noqa: F811
    engine, names, _, setup, upload = pipeline
    setup("badpart", SHORT)
    bodies = _split(_houses(tmp_path / "h.csv", 5), 12)
    for part in (9, 7):  # line 5 of parts 7 and 9 has a value too few (a row without a label is left out)
        lines = bodies[part].decode().splitlines()
        cells = lines[4].split(",")
        lines[4] = ",".join(cells[:-1])
        bodies[part] = ("\n".join(lines) + "\n").encode()
    for i, body in enumerate(bodies):
        upload(f"incoming/badpart/v1/part-{i:05d}.csv", body)
    desc = _wait(engine, upload("incoming/badpart/v1/_SUCCESS", b""))
    assert desc["status"] == "FAILED" and desc["error"] == "InvalidDataset", desc
    where = f"s3://{names.data_bucket}/incoming/badpart/v1/part-00007.csv: line 5 has 3 values, the header 4"
    message = json.loads(desc["cause"])["errorMessage"]
    assert message.startswith(where) and message.endswith("(1 more part failed too)"), message
    assert pl.champion(S3Store(names.artifacts_bucket), "badpart") is None
    # told to the team once, by MergeStats (which raised it), not by the failed children
    envelopes = refusals(1)
    envelopes += refusals(0)
    assert [e["Subject"] for e in envelopes] == ["smlt: badpart v1 refused"], envelopes
    body = json.loads(envelopes[0]["Message"])
    assert body["error"] == "InvalidDataset" and body["message"] == message and body["execution"] == desc["name"]
    assert body["upload"] == f"s3://{names.data_bucket}/incoming/badpart/v1/_SUCCESS", body


def test_a_column_with_text_in_one_part_is_read_as_text_in_every_part(pipeline, tmp_path):  # noqa: F811
    engine, names, _, setup, upload = pipeline
    setup("textpart", SHORT)
    bodies = _split(_houses(tmp_path / "h.csv", 6), 8)
    bodies[5] = bodies[5].replace(b"\n", b"\nlarge,0.5,red,1\n", 1)  # 'size' holds text in part 5 only
    for i, body in enumerate(bodies):
        upload(f"incoming/textpart/v1/part-{i:05d}.csv", body)
    (arn,) = upload("incoming/textpart/v1/_SUCCESS", b"")
    desc = _wait(engine, [arn])
    assert desc["status"] == "SUCCEEDED", desc
    entered = _entered(engine, arn)
    assert entered.count("PartStats") == 2 and entered.count("ReadAsText") == 1, entered
    folder = json.loads(desc["output"])["prepared"]["dataset"].split("/", 3)[3]
    manifest = json.loads(S3Store(names.data_bucket).get(folder + keys.MANIFEST))
    size = next(c for c in manifest["columns"] if c["name"] == "size")
    assert size["kind"] in ("onehot", "hash")  # text in every part, as one file's pass 1 would read it


def test_a_part_with_another_header_is_a_mixed_upload_naming_it(pipeline, tmp_path):  # noqa: F811
    engine, names, _, setup, upload = pipeline
    setup("headers", SHORT)
    bodies = _split(_houses(tmp_path / "h.csv", 7), 4)
    lines = [",".join(c for j, c in enumerate(line.split(",")) if j != 1) for line in bodies[2].decode().splitlines()]
    bodies[2] = ("\n".join(lines) + "\n").encode()  # part 2 without 'rooms'
    for i, body in enumerate(bodies):
        upload(f"incoming/headers/v1/part-{i:05d}.csv", body)
    desc = _wait(engine, upload("incoming/headers/v1/_SUCCESS", b""))
    assert desc["status"] == "FAILED" and desc["error"] == "MixedUpload", desc
    assert f"s3://{names.data_bucket}/incoming/headers/v1/part-00002.csv has no column 'rooms'" in desc["cause"]


def _sales(seed: int, bad_date: int | None = None) -> list[str]:
    """A CSV's lines: an `id` (a row number), two numbers with cells written `NA` and `#N/A`, an
    ISO date, and a label that is 1 in about a fifth of the rows; line `bad_date` holds no date."""
    rng = np.random.default_rng(seed)
    size, rooms, days = rng.normal(size=ROWS), rng.normal(size=ROWS), rng.integers(0, 900, size=ROWS)
    label = (size + 0.5 * rooms > 0.9).astype(int)
    lines = ["id,size,rooms,sold,label"]
    for i in range(ROWS):
        sold = "soon" if i + 2 == bad_date else str(np.datetime64("2023-01-01") + int(days[i]))
        s, r = "NA" if i % 17 == 3 else f"{size[i]:.4f}", "#N/A" if i % 23 == 5 else f"{rooms[i]:.4f}"
        lines.append(f"{i + 1},{s},{r},{sold},{label[i]}")
    return lines


def _gz(lines: list[str]) -> bytes:
    return gzip.compress(("\n".join(lines) + "\n").encode())


def test_compressed_versions_with_dates_and_na_cells_train_balanced_and_predict(
    pipeline,  # noqa: F811
    refusals,  # noqa: F811
    tmp_path,
    capsys,
):
    """v1 one .csv.gz, v2 Spark-style gzipped parts: the job's `drop` leaves the id out, the NA
    markers and the date column are told in `prepared.notes` (the parts' too), the classes weigh
    alike in training and the metrics carry each class's recall; v3 with a cell that is not a
    date is refused by name and told to the team; the champion predicts a .csv.gz."""
    from smlt.cli import main
    from smlt.console import publish_outputs

    engine, names, _, setup, upload = pipeline
    job = {**SHORT, "name": "sales", "dataset": {"uri": "x", "drop": ["id"]}}
    setup(
        "sales",
        {**job, "training": {"max_rounds": 1, "local_steps": 5, "learning_rate": 0.3, "class_weights": "balanced"}},
    )
    data, artifacts = S3Store(names.data_bucket), S3Store(names.artifacts_bucket)

    upload("incoming/sales/v1/sales.csv.gz", _gz(_sales(1)))
    desc = _wait(engine, upload("incoming/sales/v1/_SUCCESS", b""))
    assert desc["status"] == "SUCCEEDED", desc
    out = json.loads(desc["output"])
    where = f"s3://{names.data_bucket}/incoming/sales/v1/sales.csv.gz"
    notes = out["prepared"]["notes"]
    assert f"{where}: column 'size': 36 cells written 'NA' are read as empty" in notes[0], notes
    assert "column 'rooms': 26 cells written '#N/A'" in notes[1] and "date column read as features ('sold'" in notes[2]
    assert not any("'id'" in n for n in notes), notes  # dropped: no row-number notice
    manifest = json.loads(data.get(out["prepared"]["dataset"].split("/", 3)[3] + keys.MANIFEST))
    assert [(c["name"], c["kind"]) for c in manifest["columns"]] == [
        ("size", "numeric"),
        ("rooms", "numeric"),
        ("sold", "date"),
    ]
    counts = manifest["train"]["class_counts"]
    assert counts[0] > 3 * counts[1] > 0, counts  # imbalanced, counted for the balanced weights
    final = json.loads(artifacts.get(keys.final_metrics_key(out["plan"]["run_id"])))["final"]
    assert len(final["val_class_recall"]) == 2 and final["val_balanced_accuracy"] is not None, final
    assert json.loads(artifacts.get(keys.job_key(out["plan"]["run_id"])))["training"]["class_weights"] == "balanced"

    header, *rows = _sales(2)
    for i, chunk in enumerate((rows[: ROWS // 2], rows[ROWS // 2 :])):
        upload(f"incoming/sales/v2/part-{i:05d}.csv.gz", _gz([header, *chunk]))
    desc = _wait(engine, upload("incoming/sales/v2/_SUCCESS", b""))
    assert desc["status"] == "SUCCEEDED", desc
    prepared = json.loads(desc["output"])["prepared"]
    assert prepared["rows"] == ROWS and "(2 parts) with the pipeline's features" in prepared["reason"], prepared
    parts = f"s3://{names.data_bucket}/incoming/sales/v2/"  # the upload, not its first part
    assert prepared["notes"][0].startswith(f"{parts}: column 'size': ") and "recorded median" in prepared["notes"][0]
    assert pl.versions(artifacts, "sales")[-1].start.startswith("warm: from the champion v1")

    upload("incoming/sales/v3/sales.csv.gz", _gz(_sales(3, bad_date=42)))
    desc = _wait(engine, upload("incoming/sales/v3/_SUCCESS", b""))
    said = f"s3://{names.data_bucket}/incoming/sales/v3/sales.csv.gz: column 'sold', line 42: 'soon' is not a date"
    assert desc["status"] == "FAILED" and desc["error"] == "InvalidDataset" and said in desc["cause"], desc
    (envelope,) = refusals(1)
    assert envelope["Subject"] == "smlt: sales v3 refused" and json.loads(envelope["Message"])["message"].startswith(
        said
    )

    publish_outputs(engine, "SmltSales")
    capsys.readouterr()
    assert main(["models", "list", "sales", "--stack", "SmltSales"]) == 0
    listing = capsys.readouterr().out
    assert "v1" in listing and "v2" in listing and "InvalidDataset: " in listing and "'soon'" in listing, listing
    (tmp_path / "new.csv.gz").write_bytes(_gz(_sales(4)))
    args = ["predict", "sales@latest", str(tmp_path / "new.csv.gz"), "--out", str(tmp_path / "p.csv")]
    assert main([*args, "--stack", "SmltSales"]) == 0
    lines = (tmp_path / "p.csv").read_text().splitlines()
    assert lines[0] == "id,prediction,probability,label" and len(lines) == ROWS + 1


def test_a_step_after_a_map_dying_on_every_retry_fails_told_once(pipeline, refusals, tmp_path):  # noqa: F811
    """MergeStats' process dies on every attempt (its 3 retries too): caught as PrepareData is,
    PrepareFailed tells the team's topic once and the execution fails with Runtime.ExitError.
    Before, the execution failed with nothing told."""
    engine, names, _, setup, upload = pipeline
    setup("mergedies", SHORT)
    for i, body in enumerate(_split(_houses(tmp_path / "h.csv", 6), 4)):
        upload(f"incoming/mergedies/v1/part-{i:05d}.csv", body)
    seen: list[str] = []

    def fate(function: str, payload: object) -> str:
        op = payload.get("op") if isinstance(payload, dict) else None
        if op in ("merge_stats", "prepare_failed"):
            seen.append(op)
        return "kill" if op == "merge_stats" else "ok"

    engine.invoke_filter = fate
    try:
        desc = _wait(engine, upload("incoming/mergedies/v1/_SUCCESS", b""))
    finally:
        engine.invoke_filter = None
    assert desc["status"] == "FAILED" and desc["error"] == "Runtime.ExitError", desc
    assert seen == ["merge_stats"] * 4 + ["prepare_failed"], seen
    where = f"s3://{names.data_bucket}/incoming/mergedies/v1/"
    message = json.loads(desc["cause"])["errorMessage"]
    assert message.startswith(f"the Prepare function preparing {where} died"), message
    (envelope,) = refusals(1) + refusals(0)  # told once
    body = json.loads(envelope["Message"])
    assert envelope["Subject"] == "smlt: mergedies v1 refused" and body["error"] == "Runtime.ExitError", body
    assert body["message"] == message and body["execution"] == desc["name"], body
    assert pl.champion(S3Store(names.artifacts_bucket), "mergedies") is None


def test_a_part_dying_is_told_once_by_the_step_after_its_map(pipeline, refusals, tmp_path):  # noqa: F811
    """A part's child dies (not retried: as PrepareData's input, it would die again): MergeStats
    raises it again once, as PartFailed naming the part's object and its error, and tells the
    topic; caught, PrepareFailed does not tell it again."""
    engine, names, _, setup, upload = pipeline
    setup("partdies", SHORT)
    for i, body in enumerate(_split(_houses(tmp_path / "h.csv", 7), 4)):
        upload(f"incoming/partdies/v1/part-{i:05d}.csv", body)
    seen: list[str] = []

    def fate(function: str, payload: object) -> str:
        event = payload if isinstance(payload, dict) else {}
        op = event.get("op")
        if op in ("part_stats", "merge_stats", "prepare_failed"):
            seen.append(op)
        return "kill" if op == "part_stats" and event.get("part") == 2 else "ok"

    engine.invoke_filter = fate
    try:
        desc = _wait(engine, upload("incoming/partdies/v1/_SUCCESS", b""))
    finally:
        engine.invoke_filter = None
    # a part's death is final: MergeStats raises it as PartFailed, which it is not retried for (it
    # was raised as Runtime.ExitError, and MergeStats ran 4 times reading the same failure)
    assert seen.count("merge_stats") == 1, seen
    assert desc["status"] == "FAILED" and desc["error"] == "PartFailed", desc
    message = json.loads(desc["cause"])["errorMessage"]
    part = f"s3://{names.data_bucket}/incoming/partdies/v1/part-00002.csv"
    assert message.startswith(f"{part}: its preparation failed with Runtime.ExitError (after the part's own"), message
    envelopes = refusals(1) + refusals(0)
    assert [e["Subject"] for e in envelopes] == ["smlt: partdies v1 refused"], (seen, envelopes)
    assert json.loads(envelopes[0]["Message"])["message"] == message

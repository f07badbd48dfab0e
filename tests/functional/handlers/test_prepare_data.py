"""The Prepare step on moto (real S3 and DynamoDB emulation): a raw upload prepared with the
pipeline's features into its own prefix, the run claimed once, and the checks that fail before
any data is read."""

from __future__ import annotations

import io
import json
import zipfile
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from smlt.runtime import keys
from smlt.runtime.errors import InvalidDataset, InvalidJob
from smlt.runtime.keys import parse_s3_uri
from smlt.runtime.records import RunTable
from smlt.runtime.steps import prepare as p
from smlt.runtime.steps.events import PrepareDataEvent
from smlt.runtime.trigger import upload_of

JOB = {"name": "h", "dataset": {"uri": "x", "label": "price", "task": "regression"}, "model": {"name": "mlp"}}


def _csv(seed: int, rows: int = 200, extra: bool = False) -> bytes:
    rng = np.random.default_rng(seed)
    head = "size,city" + (",garden" if extra else "") + ",price\n"
    lines = [
        f"{rng.normal():.3f},{rng.choice(['a', 'b'])}"
        + (f",{rng.normal():.2f}" if extra else "")
        + f",{rng.normal():.3f}"
        for _ in range(rows)
    ]
    return (head + "\n".join(lines) + "\n").encode()


def _event(key: str, execution: str = "exec-1", sequencer: str = "0A1") -> PrepareDataEvent:
    return PrepareDataEvent(
        trigger={"bucket": "smlt-data", "key": key, "etag": "e", "sequencer": sequencer}, execution=execution
    )


@pytest.fixture
def houses(aws):
    aws.put_object(Bucket="smlt-data", Key="incoming/h/job.json", Body=json.dumps(JOB).encode())
    aws.put_object(Bucket="smlt-data", Key="incoming/h/v1/houses.csv", Body=_csv(1))
    aws.put_object(Bucket="smlt-data", Key="incoming/h/v1/_SUCCESS", Body=b"")
    return aws


def test_a_raw_csv_is_prepared_into_its_own_prefix_with_the_pipelines_features(houses):
    s3 = houses
    answer = p.prepare_upload(p.PrepareSettings(), _event("incoming/h/v1/_SUCCESS"))
    up = upload_of(_event("incoming/h/v1/_SUCCESS").trigger)
    assert answer.action == "plan" and answer.run_id == up.run_id and answer.dataset == up.dataset_uri
    assert answer.rows == 200 and "fixed pipeline h's features, generation 1" in answer.reason
    manifest = json.loads(s3.get_object(Bucket="smlt-data", Key=f"{up.dataset_folder}/manifest.json")["Body"].read())
    assert manifest["task"] == "regression" and manifest["label"] == "price"  # the job's source options
    spec = json.loads(s3.get_object(Bucket="smlt-data", Key=keys.pipeline_features_key("h"))["Body"].read())
    assert spec["generation"] == 1
    claim = RunTable("smlt-runs", up.run_id).get(keys.PREPARE, p.PrepareItem)
    assert claim is not None and claim.execution == "exec-1"

    # v2 with a new column: prepared with v1's features, the column ignored and said
    s3.put_object(Bucket="smlt-data", Key="incoming/h/v2/houses.csv", Body=_csv(2, extra=True))
    v2 = p.prepare_upload(p.PrepareSettings(), _event("incoming/h/v2/_SUCCESS"))
    assert "with pipeline h's features (generation 1" in v2.reason
    assert any("'garden'" in n and "ignored" in n and "s3://smlt-data/incoming/h/v2/houses.csv" in n for n in v2.notes)
    assert not any("/tmp" in n for n in v2.notes)


def test_the_run_is_prepared_by_one_execution(houses):
    first = p.prepare_upload(p.PrepareSettings(), _event("incoming/h/v1/_SUCCESS"))
    other = p.prepare_upload(p.PrepareSettings(), _event("incoming/h/v1/_SUCCESS", execution="exec-2"))
    assert other.action == "duplicate" and other.run_id == first.run_id
    assert other.reason == f"duplicate event: run {first.run_id} belongs to execution exec-1"
    # the same execution again (a retried task): its dataset is there, nothing is prepared twice
    again = p.prepare_upload(p.PrepareSettings(), _event("incoming/h/v1/_SUCCESS"))
    assert again.action == "plan" and again.reason == "prepared by an earlier attempt"


def test_a_bad_job_fails_before_the_data_is_read(houses):
    houses.put_object(
        Bucket="smlt-data", Key="incoming/h/job.json", Body=json.dumps({**JOB, "model": {"name": "nope"}})
    )
    with pytest.raises(InvalidJob, match="model.name"):
        p.prepare_upload(p.PrepareSettings(), _event("incoming/h/v1/_SUCCESS"))
    houses.delete_object(Bucket="smlt-data", Key="incoming/h/job.json")
    with pytest.raises(InvalidJob, match=r"pipeline 'h' has no job: upload s3://smlt-data/incoming/h/job.json"):
        p.prepare_upload(p.PrepareSettings(), _event("incoming/h/v1/_SUCCESS", sequencer="0A2"))


def test_only_the_stacks_data_bucket_and_markers_are_prepared(houses):
    wrong = PrepareDataEvent(
        trigger={"bucket": "other", "key": "incoming/h/v1/_SUCCESS", "etag": "e", "sequencer": "1"}, execution="x"
    )
    with pytest.raises(InvalidJob, match=r"s3://other/ is not the stack's data bucket \(smlt-data\)"):
        p.prepare_upload(p.PrepareSettings(), wrong)
    with pytest.raises(InvalidJob, match="is not a _SUCCESS marker"):
        p.prepare_upload(p.PrepareSettings(), _event("incoming/h/v1/manifest.json"))


def _npz(rows: int) -> bytes:
    buf = io.BytesIO()
    np.savez_compressed(buf, x=np.zeros((rows, 4), np.float32), y=np.zeros(rows))
    return buf.getvalue()


def _zip(name: str, body: bytes) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr(name, body)
    return buf.getvalue()


@pytest.mark.parametrize(
    "objects, limit, named, size",
    [
        ({"houses.csv": _csv(1)}, "TABLE_LIMIT", "houses.csv", "of a CSV or Parquet file"),
        ({"x.npz": _npz(100)}, "ARRAYS_LIMIT", "x.npz", "of an NPZ file"),
        ({"data.zip": _zip("houses.csv", _csv(1))}, "ARCHIVE_LIMIT", "data.zip", "of an archive"),
        # resized to the job's image_size: 3 x 8 x 8 bytes of pixels per image, known from the listing
        (
            {f"photos/{c}/{i}.png": b"not read" for c in "ab" for i in range(5)},
            "IMAGES_LIMIT",
            "photos/",
            "1,920 bytes of decoded pixels (10 images of 3x8x8)",
        ),
    ],
)
def test_an_input_over_its_kinds_limit_is_refused_by_its_listed_size_before_it_is_downloaded(
    houses, monkeypatch, objects, limit, named, size
):
    job = {**JOB, "dataset": {**JOB["dataset"], "image_size": 8}}
    houses.put_object(Bucket="smlt-data", Key="incoming/h/job.json", Body=json.dumps(job).encode())
    houses.delete_object(Bucket="smlt-data", Key="incoming/h/v1/houses.csv")
    for name, body in objects.items():
        houses.put_object(Bucket="smlt-data", Key=f"incoming/h/v1/{name}", Body=body)
    listed = sum(map(len, objects.values())) if limit != "IMAGES_LIMIT" else 10 * 3 * 8 * 8
    monkeypatch.setattr(p, limit, replace(getattr(p, limit), bytes=listed - 1))

    def downloaded(*args):
        raise AssertionError("downloaded an input the listing shows is too large")

    monkeypatch.setattr(p, "_fetch", downloaded)
    with pytest.raises(p.TooLargeForLambda) as e:
        p.prepare_upload(p.PrepareSettings(), _event("incoming/h/v1/_SUCCESS"))
    message = str(e.value)
    assert message.startswith(
        f"s3://smlt-data/incoming/h/v1/{named} is {listed:,} bytes"
        if limit != "IMAGES_LIMIT"
        else f"s3://smlt-data/incoming/h/v1/{named} is {size}"
    )
    assert size in message and f"{listed - 1:,} bytes" in message
    assert "smlt data prepare SOURCE --out s3://smlt-data/incoming/h/v1/" in message
    assert "delete s3://smlt-data/incoming/h/v1/_SUCCESS" in message
    assert not houses.list_objects_v2(Bucket="smlt-data", Prefix=keys.PREPARED).get("Contents")


def test_a_compressed_npz_is_refused_by_its_arrays_once_downloaded(houses, monkeypatch):
    houses.delete_object(Bucket="smlt-data", Key="incoming/h/v1/houses.csv")
    body = _npz(10_000)  # 160,000 bytes of x and 80,000 of y, compressed to a few hundred
    houses.put_object(Bucket="smlt-data", Key="incoming/h/v1/x.npz", Body=body)
    monkeypatch.setattr(p, "ARRAYS_LIMIT", replace(p.ARRAYS_LIMIT, bytes=100_000))
    with pytest.raises(p.TooLargeForLambda, match=r"^s3://smlt-data/incoming/h/v1/x\.npz is 0\.2 MB of arrays, more"):
        p.prepare_upload(p.PrepareSettings(), _event("incoming/h/v1/_SUCCESS"))
    assert len(body) < 100_000
    assert not houses.list_objects_v2(Bucket="smlt-data", Prefix=keys.PREPARED).get("Contents")


def test_a_data_error_names_the_uploaded_object(houses):
    houses.put_object(Bucket="smlt-data", Key="incoming/h/v1/houses.csv", Body=b"size,city,price\n1.0,a,\n2.0,b,x\n")
    with pytest.raises(InvalidDataset) as e:
        p.prepare_upload(p.PrepareSettings(), _event("incoming/h/v1/_SUCCESS"))
    # (line 2, without a price, is left out)
    assert str(e.value).startswith(
        "s3://smlt-data/incoming/h/v1/houses.csv: column 'price', line 3: 'x' is not a number"
    )


def _jsonl(csv_body: bytes) -> bytes:
    """The CSV's rows as JSON Lines: numbers as JSON numbers, text as strings."""
    head, *rows = csv_body.decode().splitlines()
    names = head.split(",")
    records = [{n: (v if n == "city" else float(v)) for n, v in zip(names, r.split(","))} for r in rows]
    return "".join(json.dumps(r) + "\n" for r in records).encode()


def _stored(s3, uri: str) -> dict:
    """The manifest a prepared dataset's uri holds, as JSON."""
    bucket, prefix = parse_s3_uri(uri)
    return json.loads(s3.get_object(Bucket=bucket, Key=f"{prefix.rstrip('/')}/manifest.json")["Body"].read())


def test_a_jsonl_upload_is_prepared_as_the_same_rows_as_a_csv_are(houses):
    s3 = houses
    v1 = p.prepare_upload(p.PrepareSettings(), _event("incoming/h/v1/_SUCCESS"))
    s3.put_object(Bucket="smlt-data", Key="incoming/h/v2/houses.jsonl", Body=_jsonl(_csv(1)))
    v2 = p.prepare_upload(p.PrepareSettings(), _event("incoming/h/v2/_SUCCESS"))
    assert v2.action == "plan" and v2.rows == v1.rows == 200

    a, b = _stored(s3, v1.dataset), _stored(s3, v2.dataset)
    assert a["columns"] == b["columns"] and a["normalization"] == b["normalization"] and a["train"] == b["train"]

    s3.put_object(
        Bucket="smlt-data",
        Key="incoming/h/v3/houses.jsonl",
        Body=b'{"size": 1, "city": "a", "price": 2}\n{"size": [1]}\n',
    )
    with pytest.raises(InvalidDataset) as e:
        p.prepare_upload(p.PrepareSettings(), _event("incoming/h/v3/_SUCCESS"))
    assert str(e.value).startswith(
        "s3://smlt-data/incoming/h/v3/houses.jsonl: column 'size', line 2 holds a JSON array"
    )


def _xlsx(csv_body: bytes, bad_row: int | None = None) -> bytes:
    """The CSV's rows as an Excel workbook (numbers as numbers, text as text), its first sheet;
    `bad_row` (a sheet row) holds text in the number column 'size'."""
    openpyxl = pytest.importorskip("openpyxl")
    book = openpyxl.Workbook()
    head, *rows = csv_body.decode().splitlines()
    book.active.append(head.split(","))
    for i, r in enumerate(rows):
        cells = [v if n == "city" else float(v) for n, v in zip(head.split(","), r.split(","))]
        book.active.append(["ten", *cells[1:]] if i + 2 == bad_row else cells)
    book.create_sheet("Notes").append(["prices in EUR"])
    out = io.BytesIO()
    book.save(out)
    return out.getvalue()


def test_an_xlsx_upload_is_prepared_as_the_same_rows_as_a_csv_are(houses):
    s3 = houses
    v1 = p.prepare_upload(p.PrepareSettings(), _event("incoming/h/v1/_SUCCESS"))
    s3.put_object(Bucket="smlt-data", Key="incoming/h/v2/houses.xlsx", Body=_xlsx(_csv(1)))
    v2 = p.prepare_upload(p.PrepareSettings(), _event("incoming/h/v2/_SUCCESS"))
    assert v2.action == "plan" and v2.rows == v1.rows == 200
    assert v2.notes[0].startswith("s3://smlt-data/incoming/h/v2/houses.xlsx: 2 sheets; read the first, 'Sheet'")

    a, b = _stored(s3, v1.dataset), _stored(s3, v2.dataset)
    assert a["columns"] == b["columns"] and a["normalization"] == b["normalization"] and a["train"] == b["train"]

    s3.put_object(Bucket="smlt-data", Key="incoming/h/v3/houses.xlsx", Body=_xlsx(_csv(1), bad_row=9))
    with pytest.raises(InvalidDataset) as e:
        p.prepare_upload(p.PrepareSettings(), _event("incoming/h/v3/_SUCCESS"))
    assert "s3://smlt-data/incoming/h/v3/houses.xlsx: column 'size', row 9" in str(e.value), e.value
    assert "smlt-workbook" not in str(e.value) and "/tmp" not in str(e.value)


def _parts_prepared(s3, version: str, bodies: list[bytes], suffix: str = ".csv") -> dict:
    """A version uploaded in parts, prepared by the parts' steps run in turn as the Maps run them:
    FinishParts' answer."""
    from smlt.runtime.steps import prepare_parts
    from smlt.runtime.steps.events import MergeEvent, PartMomentsEvent, PartShardsEvent, PartStatsEvent

    for part, body in enumerate(bodies):
        s3.put_object(Bucket="smlt-data", Key=f"incoming/h/{version}/part-{part:05d}{suffix}", Body=body)
    s3.put_object(Bucket="smlt-data", Key=f"incoming/h/{version}/_SUCCESS", Body=b"")
    started = p.prepare_upload(p.PrepareSettings(), _event(f"incoming/h/{version}/_SUCCESS"))
    steps = {"run_id": started.run_id, "bucket": started.bucket, "folder": started.folder, "execution": "exec-1"}
    items = [item.model_dump() for item in started.parts]

    def mapped(op: str, event: Any) -> list[dict]:
        return [prepare_parts.handle(event.model_validate({"op": op, **item, **steps})) for item in items]

    for op, event, merge in (
        ("part_stats", PartStatsEvent, "merge_stats"),
        ("part_moments", PartMomentsEvent, "merge_moments"),
        ("part_shards", PartShardsEvent, "finish_parts"),
    ):
        answer = prepare_parts.handle(MergeEvent.model_validate({"op": merge, "results": mapped(op, event), **steps}))
    return answer


def test_a_table_in_parts_answers_the_notes_a_single_file_does(aws):
    """FinishParts answers what preparing the whole table told (NA markers, a row-number column;
    a later version's new column ignored), named by its parts, as PrepareData does for one file."""
    aws.put_object(Bucket="smlt-data", Key="incoming/h/job.json", Body=json.dumps(JOB).encode())
    head, *rows = _csv(3, rows=240).decode().splitlines()
    rows = [f"{i + 1},{r}" if i % 9 else f"{i + 1},NA,{r.split(',', 1)[1]}" for i, r in enumerate(rows)]
    halves = [("\n".join([f"id,{head}", *chunk]) + "\n").encode() for chunk in (rows[:120], rows[120:])]
    answer = _parts_prepared(aws, "v1", halves)
    parts = "s3://smlt-data/incoming/h/v1/"  # the upload the user made, not its first part
    assert answer["rows"] == 240 and len(answer["notes"]) == 2, answer
    assert answer["notes"][0].startswith(f"{parts}: column 'id' rises with every row (1 to 240)")
    assert answer["notes"][1] == f"{parts}: column 'size': 27 cells written 'NA' are read as empty " + (
        "(imputed with the train split's median, see --missing)"
    )

    head, *rows = _csv(4, rows=120, extra=True).decode().splitlines()
    rows = [f"{i + 1},{r}" for i, r in enumerate(rows)]
    halves = [("\n".join([f"id,{head}", *chunk]) + "\n").encode() for chunk in (rows[:60], rows[60:])]
    answer = _parts_prepared(aws, "v2", halves)
    assert answer["notes"] == [
        "s3://smlt-data/incoming/h/v2/: column 'garden' is not among the "
        "pipeline's features (generation 1): ignored (prepare with --new-features to start a generation that uses it)"
    ], answer


def test_a_table_in_parts_gets_the_shards_its_one_file_gets(aws, tmp_path):
    """The parts' Maps share out the train shards a single file's upload gets (16, `spool.SHARDS`;
    half as many for validation) among the parts by their rows, as `smlt data prepare` of a
    folder of the same parts does: the same shards, byte for byte."""
    from smlt.runtime.data.options import SourceOptions
    from smlt.runtime.data.prepare import prepare_parts
    from smlt.runtime.data.spool import SHARDS
    from smlt.runtime.pipeline import read_features

    aws.put_object(Bucket="smlt-data", Key="incoming/h/job.json", Body=json.dumps(JOB).encode())
    head, *rows = _csv(8, rows=300).decode().splitlines()
    aws.put_object(Bucket="smlt-data", Key="incoming/h/v1/houses.csv", Body=("\n".join([head, *rows]) + "\n").encode())
    one = p.prepare_upload(p.PrepareSettings(), _event("incoming/h/v1/_SUCCESS"))
    bodies = [("\n".join([head, *chunk]) + "\n").encode() for chunk in (rows[:210], rows[210:])]
    answer = _parts_prepared(aws, "v2", bodies)

    whole, parts = _stored(aws, one.dataset), _stored(aws, answer["dataset"])
    assert len(whole["train"]["shards"]) == SHARDS and len(whole["validation"]["shards"]) == SHARDS // 2
    assert SHARDS <= len(parts["train"]["shards"]) <= SHARDS + 1  # each part's share rounded up
    assert SHARDS // 2 <= len(parts["validation"]["shards"]) <= SHARDS // 2 + 1
    assert sum(s["rows"] for s in parts["train"]["shards"]) == parts["train"]["rows"]
    paths = []
    for i, body in enumerate(bodies):
        (path := tmp_path / f"part-{i:05d}.csv").write_bytes(body)
        paths.append(str(path))
    features = read_features(f"s3://smlt-data/{keys.pipeline_features_key('h')}")  # v1's, which v2 is prepared with
    local = prepare_parts(
        paths, str(tmp_path / "out"), options=SourceOptions(label="price", task="regression"), features=features
    )
    assert [(s.key, s.sha256) for s in local.train.shards + local.validation.shards] == [
        (s["key"], s["sha256"]) for s in parts["train"]["shards"] + parts["validation"]["shards"]
    ]


def test_workbooks_in_parts_are_prepared_as_their_csvs(aws):
    """Monthly workbooks uploaded together are the parts of one table, each read as its CSV."""
    aws.put_object(Bucket="smlt-data", Key="incoming/h/job.json", Body=json.dumps(JOB).encode())
    csvs = [_csv(5, rows=80), _csv(6, rows=70)]
    a = _parts_prepared(aws, "v1", csvs)
    b = _parts_prepared(aws, "v2", [_xlsx(c) for c in csvs], suffix=".xlsx")
    assert a["rows"] == b["rows"] == 150

    x, y = _stored(aws, a["dataset"]), _stored(aws, b["dataset"])
    assert x["columns"] == y["columns"] and x["normalization"] == y["normalization"]
    assert [s["sha256"] for s in x["train"]["shards"]] == [s["sha256"] for s in y["train"]["shards"]]


def test_a_job_with_dataset_encoding_reads_its_uploads_whole_and_in_parts_in_it(aws):
    """Excel's "CSV (Comma delimited)" (Windows-1252) uploads, read by the pipeline job's
    `"dataset": {"encoding": "cp1252"}`: the rows of their UTF-8 twin (a BOM says UTF-8 whatever
    the job names); without it, refused by the uploaded object's line and cell."""
    job = {**JOB, "dataset": {"uri": "x", "label": "price", "task": "regression", "encoding": "cp1252"}}
    aws.put_object(Bucket="smlt-data", Key="incoming/h/job.json", Body=json.dumps(job).encode())
    text = _csv(7).decode().replace(",a,", ",Zürich,")
    aws.put_object(Bucket="smlt-data", Key="incoming/h/v1/houses.csv", Body=b"\xef\xbb\xbf" + text.encode())
    aws.put_object(Bucket="smlt-data", Key="incoming/h/v2/houses.csv", Body=text.encode("cp1252"))
    v1 = p.prepare_upload(p.PrepareSettings(), _event("incoming/h/v1/_SUCCESS"))
    v2 = p.prepare_upload(p.PrepareSettings(), _event("incoming/h/v2/_SUCCESS"))

    a, b = _stored(aws, v1.dataset), _stored(aws, v2.dataset)
    assert a["columns"][1]["levels"] == ["Zürich", "b"] and a["columns"] == b["columns"] and a["train"] == b["train"]
    head, *rows = text.splitlines()
    halves = [("\n".join([head, *chunk]) + "\n").encode("cp1252") for chunk in (rows[:90], rows[90:])]
    parts = _parts_prepared(aws, "v3", halves)
    assert parts["rows"] == 200 and _stored(aws, parts["dataset"])["columns"] == a["columns"]

    aws.put_object(Bucket="smlt-data", Key="incoming/h/job.json", Body=json.dumps(JOB).encode())
    aws.put_object(Bucket="smlt-data", Key="incoming/h/v4/houses.csv", Body=text.encode("cp1252"))
    with pytest.raises(InvalidDataset) as e:
        p.prepare_upload(p.PrepareSettings(), _event("incoming/h/v4/_SUCCESS"))
    line = next(i for i, r in enumerate(rows) if "Zürich" in r) + 2
    where = f"s3://smlt-data/incoming/h/v4/houses.csv: line {line}, character "
    assert str(e.value).startswith(where) and "(column 'city'): byte 0xFC is not UTF-8 text" in str(e.value)
    assert "the cell is 'Zürich'" in str(e.value) and '"dataset": {"encoding": "cp1252"}' in str(e.value)


def test_a_failed_preparation_deletes_only_its_own_partial_folder(houses):
    """PrepareFailed deletes what the failed execution wrote into its own prepared folder; never a
    folder holding a manifest (a whole dataset), nor one another execution claimed."""
    from smlt.runtime.steps.events import PrepareFailedEvent
    from smlt.runtime.store import S3Store

    data = S3Store("smlt-data")
    p.prepare_upload(p.PrepareSettings(), _event("incoming/h/v1/_SUCCESS"))  # a whole dataset, exec-1's
    whole = upload_of(_event("incoming/h/v1/_SUCCESS").trigger).dataset_folder
    kept = sorted(data.list(whole + "/"))
    died = {"Error": "Runtime.ExitError", "Cause": "{}"}

    def failed(event: PrepareDataEvent, execution: str) -> dict[str, Any]:
        ev = PrepareFailedEvent(trigger=event.trigger, execution=execution, error=died)
        return p.prepare_failed(p.PrepareSettings(), ev)

    failed(_event("incoming/h/v1/_SUCCESS"), "exec-1")  # its folder has a manifest: kept
    assert sorted(data.list(whole + "/")) == kept and len(kept) > 2
    # a second upload of the marker (its own folder) that died after two shards
    again = _event("incoming/h/v1/_SUCCESS", execution="exec-2", sequencer="0B2")
    up = upload_of(again.trigger)
    RunTable("smlt-runs", up.run_id).put_once(keys.PREPARE, p.PrepareItem(execution="exec-2", key=up.key, claimed_at=1))
    for name in ("train-00000.safetensors", "train-00001.safetensors"):
        data.put(f"{up.dataset_folder}/{name}", b"half")
    failed(again, "exec-9")  # not the execution that claimed it: nothing deleted
    assert len(data.list(up.dataset_folder + "/")) == 2
    answer = failed(again, "exec-2")
    assert data.list(up.dataset_folder + "/") == [] and sorted(data.list(whole + "/")) == kept
    assert "died (out of memory, or killed)" in json.loads(answer["cause"])["errorMessage"]


def _start_multipart(s3, key: str, body: bytes) -> Any:
    """A multipart upload of `key` started, its one part sent, not completed: the object does not exist yet."""
    started = s3.create_multipart_upload(Bucket="smlt-data", Key=key)
    part = s3.upload_part(Bucket="smlt-data", Key=key, UploadId=started["UploadId"], PartNumber=1, Body=body)

    def complete() -> None:
        s3.complete_multipart_upload(
            Bucket="smlt-data",
            Key=key,
            UploadId=started["UploadId"],
            MultipartUpload={"Parts": [{"ETag": part["ETag"], "PartNumber": 1}]},
        )

    return complete


def test_a_marker_landing_before_its_datas_multipart_upload_completes_waits_for_it(aws):
    import threading
    import time

    aws.put_object(Bucket="smlt-data", Key="incoming/h/job.json", Body=json.dumps(JOB).encode())
    complete = _start_multipart(aws, "incoming/h/v1/houses.csv", _csv(1))
    aws.put_object(Bucket="smlt-data", Key="incoming/h/v1/_SUCCESS", Body=b"")
    finisher = threading.Timer(1.5, complete)
    finisher.start()
    began = time.monotonic()
    answer = p.prepare_upload(p.PrepareSettings(), _event("incoming/h/v1/_SUCCESS"))
    finisher.join()
    assert answer.action == "plan" and answer.rows == 200, answer
    assert time.monotonic() - began >= 1.5  # it waited for the upload, then prepared it


def test_a_data_upload_that_never_completes_fails_by_name_after_the_bounded_wait(aws, monkeypatch):
    monkeypatch.setattr(p, "DATA_WAIT_S", 1.0)
    monkeypatch.setattr(p, "DATA_POLL_S", 0.2)
    aws.put_object(Bucket="smlt-data", Key="incoming/h/job.json", Body=json.dumps(JOB).encode())
    _start_multipart(aws, "incoming/h/v1/houses.csv", _csv(1))
    aws.put_object(Bucket="smlt-data", Key="incoming/h/v1/_SUCCESS", Body=b"")
    with pytest.raises(p.NoDataFile) as e:
        p.prepare_upload(p.PrepareSettings(), _event("incoming/h/v1/_SUCCESS"))
    assert str(e.value) == (
        "s3://smlt-data/incoming/h/v1/ has a _SUCCESS marker but its data is still being uploaded (houses.csv: a "
        "multipart upload started, not completed) after PrepareData waited 1 s for it: upload "
        "s3://smlt-data/incoming/h/v1/_SUCCESS again once the upload has finished (the marker is written last: it "
        "starts the run); an upload abandoned is aborted with `aws s3api abort-multipart-upload`"
    )
    # nothing in progress and no data: refused at once, as before
    monkeypatch.setattr(p, "DATA_WAIT_S", 600.0)
    with pytest.raises(p.NoDataFile, match="has a _SUCCESS marker but no data beside it: upload"):
        p.prepare_upload(p.PrepareSettings(), _event("incoming/h/v2/_SUCCESS"))

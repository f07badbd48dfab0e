"""S3 and DynamoDB from purpose-built local servers instead of moto (issue #30, item 2): what each
lacks of what smlt calls, and what the hot calls cost, against moto as the local engine runs it.

Four servers run side by side on loopback: moto's own server with no smlt patch ("moto stock"),
the local engine's moto without the speed patches (``SMLT_LOCAL_SPEEDUPS=0``, "moto no speed":
bench/moto_calls.py's "unpatched", which keeps the memory and correctness patches), the local
engine's moto with all of them ("moto patched"), each serving S3 and DynamoDB, and the
alternative: s3rver (S3, Node) and dynalite (DynamoDB on an in-memory LevelDB, Node), which the
engine would reach through ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL_DYNAMODB``
with moto kept for Step Functions. This process is the client; it first tries every operation and
condition smlt's runtime and local engine use on each (FEATURES: a check passes only when the
server answers as AWS does), then times bench/moto_calls.py's calls plus ListObjectsV2 after the
newest key at 300 and 3,000 keys, alternating every call across the servers so machine noise hits
all alike. Prints medians (ms per call), the ratios to patched moto, and each server's RSS.

dynalite and s3rver are not smlt's dependencies: they are found under ``--node-dir`` (default
``$SMLT_ALT_SERVERS``, else /tmp/altserver), where ``--install`` puts them (npm, the versions of
NODE_PACKAGES). Without them a run measures moto alone and says what is missing; a smoke run
marks the alternative skipped with the command that installs it.

    nice -n 10 .venv/bin/python bench/alt_servers.py --install    # once: npm i into --node-dir
    nice -n 10 .venv/bin/python bench/alt_servers.py [--reps N] [--json PATH]
    .venv/bin/python bench/alt_servers.py --smoke    # every check and call once on small data, on the engine's server (+ the alternative)

The result: bench/experiments/2026-12-06-alternative-local-servers.md.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import moto_calls, smoke  # noqa: E402 - needs ROOT on the path
from bench.moto_server import start_server, stop_server  # noqa: E402
from smlt.runtime.records import create_run_table  # noqa: E402

NODE_PACKAGES = ("dynalite@4.0.0", "s3rver@3.7.1")
# moto's own server, no smlt patch at all (what would answer S3 and DynamoDB without the patches)
STOCK_SERVER = """
import sys
from moto.server import ThreadedMotoServer
server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
server.start()
print(server.get_host_and_port()[1], flush=True)
sys.stdin.read()
server.stop()
"""
# s3rver knows one access key (its own); with any other it answers InvalidAccessKeyId.
S3RVER_KEY = "S3RVER"


def node_dir(arg: str | None) -> Path:
    return Path(arg or os.environ.get("SMLT_ALT_SERVERS") or "/tmp/altserver")


def install(where: Path) -> None:
    where.mkdir(parents=True, exist_ok=True)
    subprocess.run(["npm", "i", "--no-audit", "--no-fund", "--prefix", str(where), *NODE_PACKAGES], check=True)


def missing(where: Path) -> str | None:
    """Why the alternative cannot run from `where`, or None."""
    import shutil

    if not shutil.which("node"):
        return "node is not on PATH"
    for pkg in NODE_PACKAGES:
        name = pkg.split("@")[0]
        if not (where / "node_modules" / name / "package.json").is_file():
            return (
                f"{name} is not installed under {where}: run `python bench/alt_servers.py --install "
                f"--node-dir {where}` (npm i {' '.join(NODE_PACKAGES)})"
            )
    return None


def start_stock_moto() -> tuple[subprocess.Popen, str]:
    """moto's ThreadedMotoServer in a child with no smlt patch; stops as moto_server's do."""
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
    p = subprocess.Popen(
        [sys.executable, "-c", STOCK_SERVER],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,  # werkzeug's line per request
        text=True,
    )
    return p, f"http://127.0.0.1:{int(p.stdout.readline())}"  # type: ignore[union-attr]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_listening(p: subprocess.Popen, port: int, what: str) -> None:
    deadline = time.time() + 30
    while time.time() < deadline:
        if p.poll() is not None:
            raise RuntimeError(f"{what} exited ({p.returncode}): {p.stderr.read() if p.stderr else ''}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{what} did not listen on {port} in 30 s")


def start_node_servers(where: Path, data: Path) -> tuple[list[subprocess.Popen], str, str]:
    """dynalite (in memory, tables ACTIVE at once) and s3rver (objects under `data`) on loopback."""
    mods = where / "node_modules"
    dport, sport = _free_port(), _free_port()
    dyn = subprocess.Popen(
        ["node", str(mods / "dynalite/cli.js"), "--host", "127.0.0.1", "--port", str(dport)]
        + ["--createTableMs", "0", "--deleteTableMs", "0", "--updateTableMs", "0"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    s3r = subprocess.Popen(
        # s3rver's continuation tokens are DES-encrypted, which Node 17+'s OpenSSL 3 refuses
        # without the legacy provider (every paginated listing answers 500 InternalError).
        [
            "node",
            "--openssl-legacy-provider",
            str(mods / "s3rver/bin/s3rver.js"),
            "-d",
            str(data),
            "-a",
            "127.0.0.1",
            "-p",
            str(sport),
            "-s",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    _wait_listening(dyn, dport, "dynalite")
    _wait_listening(s3r, sport, "s3rver")
    return [dyn, s3r], f"http://127.0.0.1:{sport}", f"http://127.0.0.1:{dport}"


def make_clients(s3_url: str, ddb_url: str, s3_key: str = "testing") -> tuple[Any, Any]:
    import boto3
    from botocore.config import Config

    def kw(key: str) -> dict[str, Any]:
        return dict(
            region_name="us-east-1",
            aws_access_key_id=key,
            aws_secret_access_key=key,
            config=Config(retries={"max_attempts": 1}),
        )

    return boto3.client("s3", endpoint_url=s3_url, **kw(s3_key)), boto3.client(
        "dynamodb", endpoint_url=ddb_url, **kw("testing")
    )


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


# -- what smlt calls ---------------------------------------------------------------------------


def _code(e: Exception) -> str:
    return getattr(e, "response", {}).get("Error", {}).get("Code", type(e).__name__)


def _raises(code: str | tuple[str, ...], fn: Callable[[], Any]) -> Any:
    """The ClientError `fn` raises, which must carry `code`."""
    from botocore.exceptions import ClientError

    codes = (code,) if isinstance(code, str) else code
    try:
        fn()
    except ClientError as e:
        assert _code(e) in codes, f"answered {_code(e)}, AWS answers {codes[0]}"
        return e
    raise AssertionError(f"succeeded, AWS answers {codes[0]}")


def s3_checks(s3: Any) -> dict[str, tuple[str, Callable[[], Any]]]:
    """name -> (who uses it, check). Each raises (AssertionError or ClientError) unless the server
    answers as S3 does. They run in order on a fresh bucket."""
    b = "feat"
    big = os.urandom(9 * 1024 * 1024)  # over boto3's 8 MB multipart threshold

    def body(key: str) -> bytes:
        return s3.get_object(Bucket=b, Key=key)["Body"].read()

    def basics() -> None:
        s3.create_bucket(Bucket=b)
        s3.put_object(Bucket=b, Key="a/1", Body=b"one")
        assert body("a/1") == b"one"
        assert s3.head_object(Bucket=b, Key="a/1")["ContentLength"] == 3
        s3.delete_object(Bucket=b, Key="a/1")
        _raises("NoSuchKey", lambda: s3.get_object(Bucket=b, Key="a/1"))
        _raises("404", lambda: s3.head_object(Bucket=b, Key="a/1"))

    def if_none_match() -> None:
        s3.put_object(Bucket=b, Key="once", Body=b"first", IfNoneMatch="*")
        _raises("PreconditionFailed", lambda: s3.put_object(Bucket=b, Key="once", Body=b"second", IfNoneMatch="*"))
        assert body("once") == b"first", "the second conditional write replaced the first"

    def if_match() -> None:
        etag = s3.put_object(Bucket=b, Key="m", Body=b"v1")["ETag"]
        s3.put_object(Bucket=b, Key="m", Body=b"v2", IfMatch=etag)
        _raises("PreconditionFailed", lambda: s3.put_object(Bucket=b, Key="m", Body=b"v3", IfMatch=etag))
        assert body("m") == b"v2"

    def tagging() -> None:
        s3.put_object(Bucket=b, Key="t", Body=b"x", Tagging="smlt-kind=update")
        tags = s3.get_object_tagging(Bucket=b, Key="t")["TagSet"]
        assert tags == [{"Key": "smlt-kind", "Value": "update"}], f"tags {tags}"

    def ranged() -> None:
        s3.put_object(Bucket=b, Key="big", Body=big)
        r = s3.get_object(Bucket=b, Key="big", Range="bytes=1000000-1065535")
        assert r["ResponseMetadata"]["HTTPStatusCode"] == 206, r["ResponseMetadata"]["HTTPStatusCode"]
        assert r["Body"].read() == big[1000000:1065536], "wrong bytes"
        assert r["ContentRange"] == f"bytes 1000000-1065535/{len(big)}", r.get("ContentRange")

    def listing() -> None:
        for i in range(7):
            s3.put_object(Bucket=b, Key=f"runs/r/round-{i:04d}", Body=b"k")
        s3.put_object(Bucket=b, Key="runs/rx", Body=b"k")
        pages = s3.get_paginator("list_objects_v2").paginate(
            Bucket=b, Prefix="runs/r/", StartAfter="runs/r/round-0002", PaginationConfig={"PageSize": 2}
        )
        got = [o["Key"] for p in pages for o in p.get("Contents", [])]
        assert got == [f"runs/r/round-{i:04d}" for i in range(3, 7)], f"listed {got}"

    def copy() -> None:
        s3.put_object(Bucket=b, Key="original", Body=b"original")
        s3.copy_object(Bucket=b, Key="copied", CopySource={"Bucket": b, "Key": "original"})
        assert body("copied") == b"original"

    def download_file() -> None:
        with tempfile.TemporaryDirectory() as d:
            s3.download_file(b, "big", f"{d}/big")  # HeadObject, then ranged GETs in parallel
            assert Path(f"{d}/big").read_bytes() == big

    def multipart() -> None:
        s3.upload_fileobj(io.BytesIO(big), b, "mp")  # create, upload parts, complete
        assert body("mp") == big

    def versioning() -> None:
        v = "feat-versioned"
        s3.create_bucket(Bucket=v)
        s3.put_bucket_versioning(Bucket=v, VersioningConfiguration={"Status": "Enabled"})
        s3.put_object(Bucket=v, Key="k", Body=b"1")
        s3.put_object(Bucket=v, Key="k", Body=b"2")
        vs = [
            {"Key": o["Key"], "VersionId": o["VersionId"]}
            for p in s3.get_paginator("list_object_versions").paginate(Bucket=v)
            for o in p.get("Versions", []) + p.get("DeleteMarkers", [])
        ]
        assert len(vs) == 2, f"{len(vs)} versions of 2 puts"
        s3.delete_objects(Bucket=v, Delete={"Objects": vs})
        s3.delete_bucket(Bucket=v)

    return {
        "Put/Get/Head/DeleteObject, NoSuchKey, 404": ("runtime store", basics),
        "PutObject If-None-Match: * (412 on the second)": ("runtime store put(if_absent)", if_none_match),
        "PutObject with Tagging, GetObjectTagging": ("worker updates (lifecycle tag)", tagging),
        "GetObject Range (206, bytes, Content-Range)": ("runtime store get_range", ranged),
        "ListObjectsV2 Prefix + StartAfter, paginated": ("runtime store list", listing),
        "CopyObject": ("runtime store copy", copy),
        "download_file of 9 MB (ranged GETs)": ("PrepareData", download_file),
        "CreateBucket, versioning, ListObjectVersions, DeleteObjects": ("local engine", versioning),
        "PutObject If-Match (not used by smlt)": ("-", if_match),
        "multipart upload of 9 MB (not used by smlt)": ("-", multipart),
    }


T, PK = "feat", {"S": "RUN#f"}


def key(sk: str) -> dict:
    return {"pk": PK, "sk": {"S": sk}}


def ddb_write_checks(ddb: Any) -> dict[str, tuple[str, Callable[[], Any]]]:
    """As s3_checks, for DynamoDB's writes, on a fresh run table (ddb_read_checks follow)."""
    from smlt.runtime.records import from_item, to_item

    t = T

    def create() -> None:
        create_run_table(ddb, t)
        for _ in range(50):
            if ddb.describe_table(TableName=t)["Table"]["TableStatus"] == "ACTIVE":
                break
            time.sleep(0.1)
        assert ddb.describe_table(TableName=t)["Table"]["TableStatus"] == "ACTIVE"

    def ttl() -> None:
        ddb.update_time_to_live(TableName=t, TimeToLiveSpecification={"Enabled": True, "AttributeName": "expires"})

    def put_once() -> None:
        item = {**key("META"), "execution": {"S": "e1"}}
        ddb.put_item(TableName=t, Item=item, ConditionExpression="attribute_not_exists(pk)")
        _raises(
            "ConditionalCheckFailedException",
            lambda: ddb.put_item(
                TableName=t, Item={**item, "execution": {"S": "e2"}}, ConditionExpression="attribute_not_exists(pk)"
            ),
        )
        got = ddb.get_item(TableName=t, Key=key("META"), ConsistentRead=True)["Item"]
        assert got["execution"] == {"S": "e1"}

    def values() -> None:
        raw = {"pk": "RUN#f", "sk": "VALUES", "tiny": 7.3e-7, "big": 12345678901234, "f": 0.5, "b": True}
        raw |= {"none": None, "l": [{"t": 1.25, "cold": False}], "m": {"s": "x", "n": [1, 2]}}
        ddb.put_item(TableName=t, Item=to_item(raw))
        back = from_item(ddb.get_item(TableName=t, Key=key("VALUES"), ConsistentRead=True)["Item"])
        assert back == raw, f"stored {raw}, read {back}"

    def batch_get() -> None:
        ddb.put_item(TableName=t, Item=key("PLAN#000001"))
        resp = ddb.batch_get_item(
            RequestItems={t: {"ConsistentRead": True, "Keys": [key("META"), key("PLAN#000001"), key("NONE")]}}
        )
        got = sorted(i["sk"]["S"] for i in resp["Responses"][t])
        assert got == ["META", "PLAN#000001"] and not resp.get("UnprocessedKeys"), f"{got}"

    def transact(sk: str) -> Any:
        return ddb.transact_write_items(
            TransactItems=[
                {
                    "ConditionCheck": {
                        "TableName": t,
                        "Key": key("SEAL#1"),
                        "ConditionExpression": "attribute_not_exists(pk)",
                    }
                },
                {"Put": {"TableName": t, "Item": key(sk), "ConditionExpression": "attribute_not_exists(pk)"}},
            ]
        )

    def transact_ok() -> None:
        transact("WORKER#1#0")
        assert "Item" in ddb.get_item(TableName=t, Key=key("WORKER#1#0"), ConsistentRead=True)

    def transact_refused() -> None:
        ddb.put_item(TableName=t, Item=key("SEAL#1"))
        e = _raises("TransactionCanceledException", lambda: transact("WORKER#1#1"))
        reasons = [r.get("Code") for r in e.response.get("CancellationReasons", [])]
        assert reasons == ["ConditionalCheckFailed", "None"], f"CancellationReasons {reasons}"
        assert "Item" not in ddb.get_item(TableName=t, Key=key("WORKER#1#1"), ConsistentRead=True)

    def update_cond() -> None:
        def upd(cond: str, vals: dict) -> Any:
            return ddb.update_item(
                TableName=t,
                Key=key("META"),
                UpdateExpression="SET #a0 = :v0",
                ConditionExpression=f"attribute_exists(pk) AND ({cond})",
                ExpressionAttributeNames={"#a0": "execution", "#execution": "execution"},
                ExpressionAttributeValues={":v0": {"S": "e3"}, **vals},
            )

        upd("#execution = :driver", {":driver": {"S": "e1"}})
        _raises("ConditionalCheckFailedException", lambda: upd("#execution = :driver", {":driver": {"S": "e1"}}))
        ddb.update_item(
            TableName=t,
            Key=key("PLAN#000001"),
            UpdateExpression="SET #a0 = :v0",
            ConditionExpression="attribute_exists(pk) AND (attribute_not_exists(#attempts) OR #attempts = :n)",
            ExpressionAttributeNames={"#a0": "attempts", "#attempts": "attempts"},
            ExpressionAttributeValues={":v0": {"N": "1"}, ":n": {"N": "0"}},
        )
        _raises(
            "ConditionalCheckFailedException",
            lambda: ddb.update_item(
                TableName=t,
                Key=key("NOPE"),
                UpdateExpression="SET #a0 = :v0",
                ConditionExpression="attribute_exists(pk)",
                ExpressionAttributeNames={"#a0": "x"},
                ExpressionAttributeValues={":v0": {"N": "1"}},
            ),
        )

    return {
        "CreateTable (on demand), DescribeTable": ("local engine", create),
        "UpdateTimeToLive": ("local engine (the stack's TTL)", ttl),
        "PutItem attribute_not_exists(pk) (ConditionalCheckFailed)": ("records put_once", put_once),
        "item values round trip (7.3E-7, NULL, L, M, BOOL)": ("records", values),
        "BatchGetItem ConsistentRead, a missing key": ("records get_many", batch_get),
        "TransactWriteItems ConditionCheck + conditional Put": ("records put_unless_sealed", transact_ok),
        "TransactWriteItems refused: CancellationReasons": ("records put_unless_sealed", transact_refused),
        "UpdateItem SET, attribute_exists AND (#a = :v / attribute_not_exists OR)": ("records update", update_cond),
    }


def ddb_read_checks(ddb: Any) -> dict[str, tuple[str, Callable[[], Any]]]:
    """DynamoDB's reads (and BatchWriteItem), after ddb_write_checks, on the same table."""
    t, pk = T, PK

    def query_pages() -> None:
        # 150 items of ~8 KB: 1.2 MB, over a Query page's 1 MB; key order across the pages
        pad = "x" * 8000
        for j in range(0, 150, 25):
            resp = ddb.batch_write_item(
                RequestItems={
                    t: [
                        {"PutRequest": {"Item": {**key(f"ROUND#{i:06d}"), "pad": {"S": pad}}}} for i in range(j, j + 25)
                    ]
                }
            )
            assert not resp.get("UnprocessedItems"), "BatchWriteItem left items unprocessed"
        kw: dict[str, Any] = dict(
            TableName=t,
            ConsistentRead=True,
            KeyConditionExpression="pk = :pk AND begins_with(sk, :p)",
            ExpressionAttributeValues={":pk": pk, ":p": {"S": "ROUND#"}},
        )
        got, pages = [], 0
        while True:
            resp = ddb.query(**kw)
            pages += 1
            got += [i["sk"]["S"] for i in resp["Items"]]
            if "LastEvaluatedKey" not in resp:
                break
            kw["ExclusiveStartKey"] = resp["LastEvaluatedKey"]
        assert got == [f"ROUND#{i:06d}" for i in range(150)], f"{len(got)} items, out of order or missing"
        assert pages == 2, f"{pages} pages of 1.2 MB (AWS: 2, 1 MB a page)"

    def query_between() -> None:
        resp = ddb.query(
            TableName=t,
            ConsistentRead=True,
            KeyConditionExpression="pk = :pk AND sk BETWEEN :a AND :b",
            ExpressionAttributeValues={":pk": pk, ":a": {"S": "ROUND#000140"}, ":b": {"S": "ROUND#~"}},
        )
        assert [i["sk"]["S"] for i in resp["Items"]] == [f"ROUND#{i:06d}" for i in range(140, 150)]

    def query_newest() -> None:
        resp = ddb.query(
            TableName=t,
            KeyConditionExpression="pk = :pk AND begins_with(sk, :p)",
            ExpressionAttributeValues={":pk": pk, ":p": {"S": "ROUND#"}},
            ScanIndexForward=False,
            Limit=1,
        )
        assert [i["sk"]["S"] for i in resp["Items"]] == ["ROUND#000149"] and "LastEvaluatedKey" in resp

    def scan_filter() -> None:
        ddb.put_item(TableName=t, Item={"pk": {"S": "STUDY#s1"}, "sk": {"S": "META"}})
        kw: dict[str, Any] = dict(
            TableName=t,
            FilterExpression="begins_with(pk, :p) AND sk = :m",
            ExpressionAttributeValues={":p": {"S": "STUDY#"}, ":m": {"S": "META"}},
        )
        got = []
        while True:
            resp = ddb.scan(**kw)
            got += [i["pk"]["S"] for i in resp["Items"]]
            if "LastEvaluatedKey" not in resp:
                break
            kw["ExclusiveStartKey"] = resp["LastEvaluatedKey"]
        assert got == ["STUDY#s1"], f"{got}"

    def delete_table() -> None:
        ddb.delete_table(TableName=t)

    return {
        "BatchWriteItem; Query begins_with over 1.2 MB: 1 MB pages": ("records query; snapshot", query_pages),
        "Query sk BETWEEN": ("records rounds(after)", query_between),
        "Query ScanIndexForward=False, Limit=1": ("dashboard", query_newest),
        "Scan FilterExpression begins_with AND =, paginated": ("list_studies", scan_filter),
        "DeleteTable": ("local engine", delete_table),
    }


def run_checks(checks: dict[str, tuple[str, Callable[[], Any]]]) -> dict[str, str]:
    out = {}
    for name, (_who, fn) in checks.items():
        try:
            fn()
            out[name] = "ok"
        except Exception as e:  # noqa: BLE001 - every failure is the finding
            out[name] = f"{_code(e)}: {str(e)[:160]}" if not isinstance(e, AssertionError) else f"wrong: {e}"
    return out


# -- speed -------------------------------------------------------------------------------------

LIST_SIZES = (300, 3000)


def setup_lists(s3: Any, sizes: tuple[int, ...]) -> None:
    """A bucket per size with the run prefix's keys; the local state's save lists after the newest."""
    for n in sizes:
        s3.create_bucket(Bucket=f"list{n}")
        for i in range(n):
            s3.put_object(Bucket=f"list{n}", Key=f"runs/r/{i:06d}", Body=b"k")


def list_calls(s3: Any, sizes: tuple[int, ...]) -> dict[str, Callable[[], Any]]:
    def after_newest(n: int) -> Callable[[], Any]:
        def call() -> int:
            resp = s3.list_objects_v2(Bucket=f"list{n}", Prefix="runs/r/", StartAfter=f"runs/r/{n - 3:06d}")
            assert len(resp["Contents"]) == 2
            return 2

        return call

    return {f"s3 ListObjectsV2 after the newest, {n} keys": after_newest(n) for n in sizes}


def put_call(s3: Any, size: int) -> Callable[[], Any]:
    body = os.urandom(size)
    return lambda: s3.put_object(Bucket=moto_calls.BUCKET, Key="put-mb", Body=body)


def time_calls(all_fns: dict[str, dict[str, Callable[[], Any]]], reps: int, budget: float, once: bool) -> dict:
    """Median ms per call on each server, alternating servers every call. A server that refuses
    a call (an operation it does not have) is left out of that call's row."""
    from botocore.exceptions import ClientError

    names = list(next(iter(all_fns.values())))
    out: dict[str, Any] = {}
    head = "".join(f"{s:>14s}" for s in all_fns)
    print(f"{'call':44s}{head}   ratios to moto patched")
    for name in names:
        fns, refused = dict(all_fns), {}
        for s in all_fns:  # warm up
            try:
                all_fns[s][name]()
            except ClientError as e:
                refused[s] = _code(e)
                del fns[s]
        t = time.perf_counter()
        for s in fns:
            fns[s][name]()
        n = 1 if once else max(5, min(reps, int(budget / (time.perf_counter() - t))))
        times: dict[str, list[float]] = {s: [] for s in fns}
        for _ in range(n):
            for s in fns:
                t = time.perf_counter()
                fns[s][name]()
                times[s].append(time.perf_counter() - t)
        med = {s: statistics.median(v) * 1e3 for s, v in times.items()}
        row: dict[str, Any] = {f"{s}_ms": round(m, 2) for s, m in med.items()}
        row["reps"] = n
        row.update({f"{s}_refused": code for s, code in refused.items()})
        if "moto patched" in med:
            for s in med:
                if s != "moto patched":
                    row[f"{s} / patched"] = round(med[s] / med["moto patched"], 2)
        out[name] = row
        cells = "".join(f"{med[s]:11.2f} ms" if s in med else f"{refused[s][:14]:>14s}" for s in all_fns)
        ratios = "  ".join(f"x{row[f'{s} / patched']:6.2f}" for s in all_fns if f"{s} / patched" in row)
        print(f"{name:44s}{cells}   {ratios}   ({n} reps)", flush=True)
    return out


def check_features(clients: dict[str, tuple[Any, Any]]) -> dict[str, dict[str, str]]:
    """{check: {server: "ok" or what went wrong}}, printed."""
    features: dict[str, dict[str, str]] = {}
    for server, (s3, ddb) in clients.items():
        for svc, checks in (("s3", s3_checks(s3)), ("dynamodb", ddb_write_checks(ddb) | ddb_read_checks(ddb))):
            for name, res in run_checks(checks).items():
                features.setdefault(f"{svc}: {name}", {})[server] = res
    print("\nfeature checks (ok = answered as AWS does)")
    for name, row in features.items():
        print(f"  {name}")
        for server, res in row.items():
            print(f"      {server:13s} {res}")
    return features


def measure(clients: dict[str, tuple[Any, Any]], small: bool, reps: int, budget: float) -> dict[str, Any]:
    """moto_calls' calls (without its 44 MB put and 1/8 range), a PutObject of a few MB and the
    listing after the newest key, on the same data on every server."""
    big, part_items = (2 * 1024 * 1024, 40) if small else (moto_calls.BIG, moto_calls.PART_ITEMS)
    sizes = (30, 300) if small else LIST_SIZES
    put_mb = 1 if small else 4
    t0 = time.perf_counter()
    for s3, ddb in clients.values():
        moto_calls.setup(s3, ddb, big, part_items)
        setup_lists(s3, sizes)
    print(f"\nsetup of {len(clients)} servers: {time.perf_counter() - t0:.0f} s")
    fns = {}
    for server, (s3, ddb) in clients.items():
        some = {k: v for k, v in moto_calls.calls(s3, ddb, big).items() if "44 MB" not in k or "GetObject" in k}
        some = {k: v for k, v in some.items() if "Range 1/8" not in k}
        fns[server] = {**some, f"s3 PutObject {put_mb} MB": put_call(s3, put_mb << 20), **list_calls(s3, sizes)}
    t0 = time.perf_counter()
    out = time_calls(fns, reps, budget, small)
    print(f"(medians of alternating calls; {time.perf_counter() - t0:.0f} s)")
    return out


def rss(procs: dict[str, list[subprocess.Popen]]) -> dict[str, float]:
    return {s: round(sum(rss_mb(p.pid) for p in ps), 1) for s, ps in procs.items()}


def stop(procs: dict[str, list[subprocess.Popen]]) -> None:
    for server, ps in procs.items():
        for p in ps:
            if server.startswith("moto"):
                stop_server(p)
            else:
                p.terminate()
                p.wait(30)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=15, help="repetitions per call and server (at most)")
    ap.add_argument("--budget", type=float, default=4.0, help="seconds per call of all servers, fewer reps if slower")
    ap.add_argument("--node-dir", help="where dynalite and s3rver are installed ($SMLT_ALT_SERVERS, /tmp/altserver)")
    ap.add_argument(
        "--install", action="store_true", help=f"npm i {' '.join(NODE_PACKAGES)} into --node-dir, then exit"
    )
    ap.add_argument("--json", type=Path, help="also write the results here")
    smoke.add_flag(ap)
    args = ap.parse_args()
    where = node_dir(args.node_dir)
    if args.install:
        install(where)
        return
    why = missing(where)
    if why:
        print(f"the alternative is not measured: {why}", flush=True)
    procs: dict[str, list[subprocess.Popen]] = {}
    clients: dict[str, tuple[Any, Any]] = {}
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="s3rver-") as data:
        try:
            servers = [
                ("moto stock", start_stock_moto),
                ("moto no speed", lambda: start_server("0")),  # moto_calls' "unpatched"
                ("moto patched", lambda: start_server("1")),
            ]
            for name, start in servers[-1:] if args.smoke else servers:  # a smoke: the engine's server only
                p, url = start()
                procs[name] = [p]
                clients[name] = make_clients(url, url)
            if not why:
                procs["alternative"], s3_url, ddb_url = start_node_servers(where, Path(data))
                clients["alternative"] = make_clients(s3_url, ddb_url, S3RVER_KEY)
            results["rss_mb_empty"] = rss(procs)
            results["features"] = check_features(clients)
            results["calls"] = measure(clients, args.smoke, args.reps, args.budget)
            results["rss_mb_after"] = rss(procs)
            for what in ("empty", "after"):
                print(f"RSS {what} (MB):", ", ".join(f"{s} {m:.0f}" for s, m in results[f"rss_mb_{what}"].items()))
        finally:
            stop(procs)
    if why:
        results["alternative"] = {"skipped": True, "note": why}
    if args.smoke:
        smoke.report(results)
    elif args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
